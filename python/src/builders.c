/* The Graph's builders (core.h): one method per builder of spmd.h, named
 * without the spmd_ prefix; those taking tensors only generated from the
 * rows of UNARY_BUILDERS, BINARY_BUILDERS and TERNARY_BUILDERS. */
#include "core.h"

#include <string.h>

static PyObject *graph_input(GraphObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"name", "shape", "dtype", NULL};
    const char *name;
    PyObject *shape, *dtype_o = NULL;
    int rank;
    int64_t dims[SPMD_MAX_RANK];
    spmd_dtype dtype = SPMD_F32;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sO|O:input", kwlist, &name, &shape, &dtype_o) ||
        graph_open(self) < 0 || shape_arg(shape, &rank, dims) < 0 ||
        (dtype_o && dtype_arg(dtype_o, &dtype) < 0))
        return NULL;
    return wrap_tensor(self, spmd_input(self->g, name, dtype, rank, dims));
}

static int init_arg(PyObject *o, float scale, spmd_init *init)
{
    static const struct { const char *name; spmd_init_kind kind; } kinds[] = {
        {"zeros", SPMD_INIT_ZEROS}, {"ones", SPMD_INIT_ONES},
        {"normal", SPMD_INIT_NORMAL}, {"uniform", SPMD_INIT_UNIFORM}};
    const char *s = PyUnicode_Check(o) ? PyUnicode_AsUTF8(o) : NULL;
    for (size_t i = 0; s && i < sizeof kinds / sizeof kinds[0]; i++)
        if (!strcmp(s, kinds[i].name)) {
            *init = (spmd_init){.kind = kinds[i].kind, .scale = scale};
            return 0;
        }
    if (!PyErr_Occurred())
        PyErr_Format(error_type(SPMD_ERR_INVALID), "init %R: one of 'zeros', 'ones', 'normal', 'uniform'", o);
    return -1;
}

typedef spmd_tensor *(*leaf_fn)(spmd_graph *, const char *, int, const int64_t *, spmd_init);

static PyObject *graph_leaf(GraphObject *self, PyObject *args, PyObject *kw, const char *fmt, leaf_fn f)
{
    static char *kwlist[] = {"name", "shape", "init", "scale", NULL};
    const char *name;
    PyObject *shape, *init_o = NULL;
    float scale = 0;
    int rank;
    int64_t dims[SPMD_MAX_RANK];
    spmd_init init = {SPMD_INIT_ZEROS, 0};
    if (!PyArg_ParseTupleAndKeywords(args, kw, fmt, kwlist, &name, &shape, &init_o, &scale) ||
        graph_open(self) < 0 || shape_arg(shape, &rank, dims) < 0 ||
        (init_o && init_arg(init_o, scale, &init) < 0))
        return NULL;
    return wrap_tensor(self, f(self->g, name, rank, dims, init));
}

static PyObject *graph_param(GraphObject *self, PyObject *args, PyObject *kw)
{
    return graph_leaf(self, args, kw, "sO|Of:param", spmd_param);
}

static PyObject *graph_state(GraphObject *self, PyObject *args, PyObject *kw)
{
    return graph_leaf(self, args, kw, "sO|Of:state", spmd_state);
}

static PyObject *graph_fill(GraphObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"shape", "value", NULL};
    PyObject *shape;
    float value;
    int rank;
    int64_t dims[SPMD_MAX_RANK];
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Of:fill", kwlist, &shape, &value) ||
        graph_open(self) < 0 || shape_arg(shape, &rank, dims) < 0)
        return NULL;
    return wrap_tensor(self, spmd_fill(self->g, rank, dims, value));
}

/* The builders whose arguments are tensors only, one row each: the
 * binding of each is generated from its row (UNARY: x; BINARY: a, b;
 * TERNARY: a, b, c), so adding a builder of spmd.h of such a signature is
 * one line here. */
#define UNARY_BUILDERS(X)                                              \
    X(neg, "neg(x): -x")                                               \
    X(exp, "exp(x)")                                                   \
    X(log, "log(x)")                                                   \
    X(tanh, "tanh(x)")                                                 \
    X(gelu, "gelu(x): GELU, tanh form")                                \
    X(relu, "relu(x)")                                                 \
    X(sqrt, "sqrt(x)")                                                 \
    X(rsqrt, "rsqrt(x): 1 / sqrt(x)")                                  \
    X(gelu_erf, "gelu_erf(x): GELU, erf form (torch's nn.GELU())")      \
    X(silu, "silu(x): x * sigmoid(x)")                                 \
    X(sigmoid, "sigmoid(x): 1 / (1 + exp(-x))")                        \
    X(softmax, "softmax(x): over the last dim")                        \
    X(log_softmax, "log_softmax(x): over the last dim")
#define BINARY_BUILDERS(X)                                                             \
    X(add, "add(a, b): a + b, NumPy broadcasting")                                     \
    X(sub, "sub(a, b): a - b, NumPy broadcasting")                                     \
    X(mul, "mul(a, b): a * b, NumPy broadcasting")                                     \
    X(div, "div(a, b): a / b, NumPy broadcasting")                                     \
    X(embedding, "embedding(table, ids): rows of table [V, D] at int32 ids -> [..., D]") \
    X(cross_entropy, "cross_entropy(logits, targets): mean over int32 targets [...]")  \
    X(mse, "mse(a, b): mean squared error, a scalar")
#define TERNARY_BUILDERS(X)                                                                          \
    X(cache_write, "cache_write(cache, rows, pos): cache [B, S, C] with rows [B, T, C] at int32 pos [1]") \
    X(where, "where(cond, a, b): cond != 0 ? a : b, NumPy broadcasting; cond f32 or int32")

static PyObject *build_unary(PyObject *self, PyObject *x, spmd_tensor *(*f)(spmd_graph *, spmd_tensor *))
{
    GraphObject *g = (GraphObject *)self;
    spmd_tensor *a;
    if (tensor_arg(g, x, &a, true) < 0) return NULL;
    return wrap_tensor(g, f(g->g, a));
}

static PyObject *build_nary(PyObject *self, PyObject *const *args, Py_ssize_t nargs, const char *name,
                            int arity, spmd_tensor *(*f2)(spmd_graph *, spmd_tensor *, spmd_tensor *),
                            spmd_tensor *(*f3)(spmd_graph *, spmd_tensor *, spmd_tensor *, spmd_tensor *))
{
    GraphObject *g = (GraphObject *)self;
    spmd_tensor *t[3];
    if (nargs != arity) {
        PyErr_Format(PyExc_TypeError, "%s() takes %d tensors (%zd given)", name, arity, nargs);
        return NULL;
    }
    for (int i = 0; i < arity; i++)
        if (tensor_arg(g, args[i], &t[i], true) < 0) return NULL;
    return wrap_tensor(g, arity == 2 ? f2(g->g, t[0], t[1]) : f3(g->g, t[0], t[1], t[2]));
}

#define DEFINE_UNARY(name, doc)                                                      \
    static PyObject *g_##name(PyObject *self, PyObject *x) { return build_unary(self, x, spmd_##name); }
#define DEFINE_BINARY(name, doc)                                                     \
    static PyObject *g_##name(PyObject *self, PyObject *const *args, Py_ssize_t n)   \
    {                                                                                \
        return build_nary(self, args, n, #name, 2, spmd_##name, NULL);               \
    }
#define DEFINE_TERNARY(name, doc)                                                    \
    static PyObject *g_##name(PyObject *self, PyObject *const *args, Py_ssize_t n)   \
    {                                                                                \
        return build_nary(self, args, n, #name, 3, NULL, spmd_##name);               \
    }
UNARY_BUILDERS(DEFINE_UNARY)
BINARY_BUILDERS(DEFINE_BINARY)
TERNARY_BUILDERS(DEFINE_TERNARY)

/* ---- Builders with other arguments ---------------------------------------- */

static PyObject *graph_scale(GraphObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"x", "c", NULL};
    PyObject *x;
    float c;
    spmd_tensor *t;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Of:scale", kwlist, &x, &c) || tensor_arg(self, x, &t, true) < 0)
        return NULL;
    return wrap_tensor(self, spmd_scale(self->g, t, c));
}

static PyObject *graph_pow_scalar(GraphObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"x", "p", NULL};
    PyObject *x;
    float e;
    spmd_tensor *t;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Of:pow_scalar", kwlist, &x, &e) || tensor_arg(self, x, &t, true) < 0)
        return NULL;
    return wrap_tensor(self, spmd_pow_scalar(self->g, t, e));
}

static PyObject *graph_convert(GraphObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"x", "dtype", NULL};
    PyObject *x, *d;
    spmd_tensor *t;
    spmd_dtype dtype;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO:convert", kwlist, &x, &d) || tensor_arg(self, x, &t, true) < 0 ||
        dtype_arg(d, &dtype) < 0)
        return NULL;
    return wrap_tensor(self, spmd_convert(self->g, t, dtype));
}

static PyObject *graph_set_matmul_precision(GraphObject *self, PyObject *d)
{
    spmd_dtype dtype;
    if (graph_open(self) < 0 || dtype_arg(d, &dtype) < 0) return NULL;
    RETURN_STATUS(spmd_graph_set_matmul_precision(self->g, dtype));
}

static PyObject *graph_set_reduce_precision(GraphObject *self, PyObject *d)
{
    spmd_dtype dtype;
    if (graph_open(self) < 0 || dtype_arg(d, &dtype) < 0) return NULL;
    RETURN_STATUS(spmd_graph_set_reduce_precision(self->g, dtype));
}

typedef spmd_tensor *(*shape_op_fn)(spmd_graph *, spmd_tensor *, int, const int64_t *);

static PyObject *graph_shape_op(GraphObject *self, PyObject *args, PyObject *kw, const char *fmt,
                                shape_op_fn f)
{
    static char *kwlist[] = {"x", "shape", NULL};
    PyObject *x, *shape;
    spmd_tensor *t;
    int rank;
    int64_t dims[SPMD_MAX_RANK];
    if (!PyArg_ParseTupleAndKeywords(args, kw, fmt, kwlist, &x, &shape) || tensor_arg(self, x, &t, true) < 0 ||
        shape_arg(shape, &rank, dims) < 0)
        return NULL;
    return wrap_tensor(self, f(self->g, t, rank, dims));
}

static PyObject *graph_expand(GraphObject *self, PyObject *args, PyObject *kw)
{
    return graph_shape_op(self, args, kw, "OO:expand", spmd_expand);
}

static PyObject *graph_reshape(GraphObject *self, PyObject *args, PyObject *kw)
{
    return graph_shape_op(self, args, kw, "OO:reshape", spmd_reshape);
}

typedef spmd_tensor *(*reduce_fn)(spmd_graph *, spmd_tensor *, uint32_t, bool);

static PyObject *graph_reduce(GraphObject *self, PyObject *args, PyObject *kw, const char *fmt, reduce_fn f)
{
    static char *kwlist[] = {"x", "axes", "keepdim", NULL};
    PyObject *x, *axes = Py_None;
    int keepdim = 0;
    spmd_tensor *t;
    uint32_t mask = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, fmt, kwlist, &x, &axes, &keepdim) ||
        tensor_arg(self, x, &t, true) < 0 || (t && axes_mask(axes, spmd_tensor_rank(t), &mask) < 0))
        return NULL;
    return wrap_tensor(self, f(self->g, t, mask, keepdim));
}

static PyObject *graph_sum(GraphObject *self, PyObject *args, PyObject *kw)
{
    return graph_reduce(self, args, kw, "O|Op:sum", spmd_sum);
}

static PyObject *graph_mean(GraphObject *self, PyObject *args, PyObject *kw)
{
    return graph_reduce(self, args, kw, "O|Op:mean", spmd_mean);
}

static PyObject *graph_max(GraphObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"x", "axis", "keepdim", NULL};
    PyObject *x;
    int axis, keepdim = 0;
    spmd_tensor *t;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Oi|p:max", kwlist, &x, &axis, &keepdim) ||
        tensor_arg(self, x, &t, true) < 0)
        return NULL;
    if (t && axis < 0) axis += spmd_tensor_rank(t);
    return wrap_tensor(self, spmd_max(self->g, t, axis, keepdim));
}

static PyObject *graph_layernorm(GraphObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"x", "gamma", "beta", "eps", NULL};
    PyObject *x, *gamma, *beta;
    float eps = 1e-5f;
    spmd_tensor *t[3];
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|f:layernorm", kwlist, &x, &gamma, &beta, &eps) ||
        tensor_arg(self, x, &t[0], true) < 0 || tensor_arg(self, gamma, &t[1], true) < 0 ||
        tensor_arg(self, beta, &t[2], true) < 0)
        return NULL;
    return wrap_tensor(self, spmd_layernorm(self->g, t[0], t[1], t[2], eps));
}

typedef spmd_tensor *(*product_fn)(spmd_graph *, spmd_tensor *, spmd_tensor *, bool, bool);

static PyObject *graph_product(GraphObject *self, PyObject *args, PyObject *kw, const char *fmt, product_fn f)
{
    static char *kwlist[] = {"a", "b", "trans_a", "trans_b", NULL};
    PyObject *a, *b;
    int ta = 0, tb = 0;
    spmd_tensor *t[2];
    if (!PyArg_ParseTupleAndKeywords(args, kw, fmt, kwlist, &a, &b, &ta, &tb) ||
        tensor_arg(self, a, &t[0], true) < 0 || tensor_arg(self, b, &t[1], true) < 0)
        return NULL;
    return wrap_tensor(self, f(self->g, t[0], t[1], ta, tb));
}

static PyObject *graph_matmul(GraphObject *self, PyObject *args, PyObject *kw)
{
    return graph_product(self, args, kw, "OO|$pp:matmul", spmd_matmul);
}

static PyObject *graph_bmm(GraphObject *self, PyObject *args, PyObject *kw)
{
    return graph_product(self, args, kw, "OO|$pp:bmm", spmd_bmm);
}

static PyObject *graph_attention(GraphObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"q", "k", "v", "heads", NULL};
    PyObject *q, *k, *v;
    int heads;
    spmd_tensor *t[3];
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOi:attention", kwlist, &q, &k, &v, &heads) ||
        tensor_arg(self, q, &t[0], true) < 0 || tensor_arg(self, k, &t[1], true) < 0 ||
        tensor_arg(self, v, &t[2], true) < 0)
        return NULL;
    return wrap_tensor(self, spmd_attention(self->g, t[0], t[1], t[2], heads));
}

static PyObject *graph_cached_attention(GraphObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"q", "k_cache", "v_cache", "pos", "heads", NULL};
    PyObject *o[4];
    int heads;
    spmd_tensor *t[4];
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOi:cached_attention", kwlist, &o[0], &o[1], &o[2], &o[3],
                                     &heads))
        return NULL;
    for (int i = 0; i < 4; i++)
        if (tensor_arg(self, o[i], &t[i], true) < 0) return NULL;
    return wrap_tensor(self, spmd_cached_attention(self->g, t[0], t[1], t[2], t[3], heads));
}

static PyObject *graph_permute(GraphObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"x", "perm", NULL};
    PyObject *x, *perm_o;
    spmd_tensor *t;
    int rank, perm[SPMD_MAX_RANK];
    int64_t p64[SPMD_MAX_RANK];
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO:permute", kwlist, &x, &perm_o) ||
        tensor_arg(self, x, &t, true) < 0 || shape_arg(perm_o, &rank, p64) < 0)
        return NULL;
    /* The C side reads one entry per dimension of x: the length is ours
     * to check. */
    if (t && rank != spmd_tensor_rank(t)) {
        PyErr_Format(error_type(SPMD_ERR_SHAPE), "permute: %d entries for a tensor of rank %d", rank,
                     spmd_tensor_rank(t));
        return NULL;
    }
    for (int i = 0; i < rank; i++) perm[i] = p64[i] < INT_MIN || p64[i] > INT_MAX ? -1 : (int)p64[i];
    return wrap_tensor(self, spmd_permute(self->g, t, perm));
}

static PyObject *graph_transpose(GraphObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"x", "dim0", "dim1", NULL};
    PyObject *x;
    int d0, d1;
    spmd_tensor *t;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Oii:transpose", kwlist, &x, &d0, &d1) ||
        tensor_arg(self, x, &t, true) < 0)
        return NULL;
    return wrap_tensor(self, spmd_transpose(self->g, t, d0, d1));
}

static PyObject *graph_slice(GraphObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"x", "axis", "start", "length", NULL};
    PyObject *x;
    int axis;
    long long start, len;
    spmd_tensor *t;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OiLL:slice", kwlist, &x, &axis, &start, &len) ||
        tensor_arg(self, x, &t, true) < 0)
        return NULL;
    return wrap_tensor(self, spmd_slice(self->g, t, axis, start, len));
}

static PyObject *graph_concat(GraphObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"xs", "axis", NULL};
    PyObject *xs;
    int axis, n;
    spmd_tensor **ts;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Oi:concat", kwlist, &xs, &axis) ||
        tensor_list(self, xs, &ts, &n) < 0)
        return NULL;
    PyObject *r = wrap_tensor(self, spmd_concat(self->g, ts, n, axis));
    PyMem_Free(ts);
    return r;
}

#define UNARY_METHOD(name, doc) {#name, FN(g_##name), METH_O, doc},
#define NARY_METHOD(name, doc) {#name, (PyCFunction)(void (*)(void))g_##name, METH_FASTCALL, doc},

PyMethodDef graph_builder_methods[] = {
    UNARY_BUILDERS(UNARY_METHOD) BINARY_BUILDERS(NARY_METHOD) TERNARY_BUILDERS(NARY_METHOD)
    {"input", KW(graph_input), "input(name, shape, dtype='float32'): an input fed each run"},
    {"param", KW(graph_param),
     "param(name, shape, init='zeros', scale=0): a trained parameter; init 'zeros', 'ones',\n"
     "'normal' (standard deviation scale) or 'uniform' (in [-scale, scale))"},
    {"state", KW(graph_state), "state(name, shape, init='zeros', scale=0): persistent, not trained"},
    {"fill", KW(graph_fill), "fill(shape, value): a constant"},
    {"scale", KW(graph_scale), "scale(x, c): c * x"},
    {"pow_scalar", KW(graph_pow_scalar), "pow_scalar(x, p): x ** p for a constant p"},
    {"convert", KW(graph_convert), "convert(x, dtype): x as 'f32' or 'bf16' (rounded to nearest even)"},
    {"set_matmul_precision", FN(graph_set_matmul_precision), METH_O,
     "set_matmul_precision(dtype): 'bf16': the matmuls built from now on read bf16 copies of their\n"
     "f32 operands and sum in f32 (mixed precision); 'f32' (the default): f32 matmuls"},
    {"set_reduce_precision", FN(graph_set_reduce_precision), METH_O,
     "set_reduce_precision(dtype): 'bf16': the gradients' reductions (FSDP's reduce-scatters, the\n"
     "data axes' all-reduces) move bf16, summed in f32 and rounded once; 'f32' (the default)"},
    {"expand", KW(graph_expand), "expand(x, shape): broadcast x to shape"},
    {"reshape", KW(graph_reshape), "reshape(x, shape)"},
    {"sum", KW(graph_sum), "sum(x, axes=None, keepdim=False): axes an int or a tuple; None is all"},
    {"mean", KW(graph_mean), "mean(x, axes=None, keepdim=False)"},
    {"max", KW(graph_max), "max(x, axis, keepdim=False)"},
    {"layernorm", KW(graph_layernorm), "layernorm(x, gamma, beta, eps=1e-5): over the last dim"},
    {"matmul", KW(graph_matmul),
     "matmul(a, b, *, trans_a=False, trans_b=False): a [..., M, K] times b [K, N] (b [N, K] with trans_b)"},
    {"bmm", KW(graph_bmm), "bmm(a, b, *, trans_a=False, trans_b=False): batched over leading dims"},
    {"attention", KW(graph_attention), "attention(q, k, v, heads): causal self-attention on [B, T, C]"},
    {"cached_attention", KW(graph_cached_attention),
     "cached_attention(q, k_cache, v_cache, pos, heads): causal attention over a KV cache"},
    {"permute", KW(graph_permute), "permute(x, perm)"},
    {"transpose", KW(graph_transpose), "transpose(x, dim0, dim1)"},
    {"slice", KW(graph_slice), "slice(x, axis, start, length): x[..., start:start+length, ...]"},
    {"concat", KW(graph_concat), "concat(xs, axis)"},
    {NULL}};
