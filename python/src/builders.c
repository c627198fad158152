/* The Graph's builders (core.h): one method per builder of spmd.h, named
 * without the spmd_ prefix; those taking tensors only generated from the
 * rows of UNARY_BUILDERS, BINARY_BUILDERS and TERNARY_BUILDERS. */
#include "core.h"

#include <limits.h>
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
        {"normal", SPMD_INIT_NORMAL}, {"uniform", SPMD_INIT_UNIFORM}, {"constant", SPMD_INIT_CONSTANT}};
    const char *s = PyUnicode_Check(o) ? PyUnicode_AsUTF8(o) : NULL;
    for (size_t i = 0; s && i < sizeof kinds / sizeof kinds[0]; i++)
        if (!strcmp(s, kinds[i].name)) {
            *init = (spmd_init){.kind = kinds[i].kind, .scale = scale};
            return 0;
        }
    if (!PyErr_Occurred())
        PyErr_Format(error_type(SPMD_ERR_INVALID), "init %R: one of 'zeros', 'ones', 'normal', 'uniform', 'constant'", o);
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

/* The other builders whose arguments are tensors only, one row each: the
 * binding of each is generated from its row (UNARY: x; BINARY: a, b;
 * TERNARY: a, b, c), so adding a builder of spmd.h of such a signature is
 * one line here.  The plain elementwise ops come from the op table
 * (graph_add_table_builders, below). */
#define UNARY_BUILDERS(X)                                              \
    X(softmax, "softmax(x): over the last dim")                        \
    X(log_softmax, "log_softmax(x): over the last dim")
#define BINARY_BUILDERS(X)                                                             \
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

static PyObject *graph_dropout(GraphObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"x", "p", NULL};
    PyObject *x;
    float p;
    spmd_tensor *t;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Of:dropout", kwlist, &x, &p) || tensor_arg(self, x, &t, true) < 0)
        return NULL;
    return wrap_tensor(self, spmd_dropout(self->g, t, p));
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

static PyObject *graph_cumsum(GraphObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"x", "axis", "reverse", NULL};
    PyObject *x;
    int axis, reverse = 0;
    spmd_tensor *t;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Oi|p:cumsum", kwlist, &x, &axis, &reverse) ||
        tensor_arg(self, x, &t, true) < 0)
        return NULL;
    return wrap_tensor(self, spmd_cumsum(self->g, t, axis, reverse));
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

/* An int or a pair of ints (rows, columns), as torch's pooling takes
 * them; None (where allowed) leaves *out as it is. */
static int pair_arg(PyObject *o, const char *what, int64_t out[2])
{
    if (!o || o == Py_None) return 0;
    int rank;
    int64_t dims[SPMD_MAX_RANK];
    if (shape_arg(o, &rank, dims) < 0) return -1;
    if (rank != 1 && rank != 2) {
        PyErr_Format(error_type(SPMD_ERR_INVALID), "%s %R: an int or a pair of ints", what, o);
        return -1;
    }
    out[0] = dims[0];
    out[1] = dims[rank - 1];
    return 0;
}

/* torch.nn.functional's pooling arguments (stride None: the kernel). */
static int pool_args(spmd_pool2d *p, PyObject *kernel, PyObject *stride, PyObject *padding,
                     PyObject *dilation)
{
    if (pair_arg(kernel, "kernel_size", p->kernel) < 0 || pair_arg(stride, "stride", p->stride) < 0 ||
        pair_arg(padding, "padding", p->padding) < 0 || pair_arg(dilation, "dilation", p->dilation) < 0)
        return -1;
    return 0;
}

static PyObject *graph_max_pool2d(GraphObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"x", "kernel_size", "stride", "padding", "dilation", "ceil_mode", NULL};
    PyObject *x, *kernel, *stride = NULL, *padding = NULL, *dilation = NULL;
    int ceil_mode = 0;
    spmd_tensor *t;
    spmd_pool2d p = {.ceil_mode = false};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|OOOp:max_pool2d", kwlist, &x, &kernel, &stride,
                                     &padding, &dilation, &ceil_mode) ||
        tensor_arg(self, x, &t, true) < 0 || pool_args(&p, kernel, stride, padding, dilation) < 0)
        return NULL;
    p.ceil_mode = ceil_mode;
    return wrap_tensor(self, spmd_max_pool2d(self->g, t, &p));
}

static PyObject *graph_avg_pool2d(GraphObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"x", "kernel_size", "stride", "padding", "ceil_mode",
                             "count_include_pad", "divisor_override", NULL};
    PyObject *x, *kernel, *stride = NULL, *padding = NULL, *divisor = Py_None;
    int ceil_mode = 0, include_pad = 1;
    spmd_tensor *t;
    spmd_pool2d p = {.ceil_mode = false};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|OOppO:avg_pool2d", kwlist, &x, &kernel, &stride,
                                     &padding, &ceil_mode, &include_pad, &divisor) ||
        tensor_arg(self, x, &t, true) < 0 || pool_args(&p, kernel, stride, padding, NULL) < 0)
        return NULL;
    if (divisor != Py_None) {
        long long d = PyLong_AsLongLong(divisor);
        if (d == -1 && PyErr_Occurred()) return NULL;
        if (d == 0) { /* 0 means none to the C builder */
            PyErr_SetString(error_type(SPMD_ERR_INVALID),
                            "avg_pool2d: divisor_override 0; it must be positive (None: none)");
            return NULL;
        }
        p.divisor_override = d;
    }
    p.ceil_mode = ceil_mode;
    p.count_include_pad = include_pad;
    return wrap_tensor(self, spmd_avg_pool2d(self->g, t, &p));
}

static PyObject *graph_adaptive_avg_pool2d(GraphObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"x", "output_size", NULL};
    PyObject *x, *size;
    spmd_tensor *t;
    int64_t out[2] = {0, 0};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO:adaptive_avg_pool2d", kwlist, &x, &size) ||
        tensor_arg(self, x, &t, true) < 0 || pair_arg(size, "output_size", out) < 0)
        return NULL;
    return wrap_tensor(self, spmd_adaptive_avg_pool2d(self->g, t, out[0], out[1]));
}

static PyObject *graph_batch_norm_var(GraphObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"x", "mean", NULL};
    PyObject *x, *mean;
    spmd_tensor *t[2];
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO:batch_norm_var", kwlist, &x, &mean) ||
        tensor_arg(self, x, &t[0], true) < 0 || tensor_arg(self, mean, &t[1], true) < 0)
        return NULL;
    return wrap_tensor(self, spmd_batch_norm_var(self->g, t[0], t[1]));
}

static PyObject *graph_batch_norm_stats(GraphObject *self, PyObject *x)
{
    spmd_tensor *t, *mean, *var;
    if (tensor_arg(self, x, &t, true) < 0 || check(spmd_batch_norm_stats(self->g, t, &mean, &var)) < 0)
        return NULL;
    PyObject *m = wrap_tensor(self, mean), *v = m ? wrap_tensor(self, var) : NULL;
    PyObject *pair = v ? PyTuple_Pack(2, m, v) : NULL;
    Py_XDECREF(m);
    Py_XDECREF(v);
    return pair;
}

static PyObject *graph_batch_norm(GraphObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"x", "mean", "var", "weight", "bias", "eps", NULL};
    PyObject *o[5] = {NULL, NULL, NULL, Py_None, Py_None};
    float eps = 1e-5f;
    spmd_tensor *t[5];
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|OOf:batch_norm", kwlist, &o[0], &o[1], &o[2],
                                     &o[3], &o[4], &eps))
        return NULL;
    for (int i = 0; i < 5; i++)
        if (tensor_arg(self, o[i], &t[i], true) < 0) return NULL;
    return wrap_tensor(self, spmd_batch_norm(self->g, t[0], t[1], t[2], t[3], t[4], eps));
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

/* pair_arg for conv2d's int attributes: None gives `fallback` for both. */
static int int_pair_arg(const char *what, PyObject *o, int fallback, int out[2])
{
    int64_t v[2] = {fallback, fallback};
    if (pair_arg(o, what, v) < 0) return -1;
    for (int d = 0; d < 2; d++) {
        if (v[d] < 0 || v[d] > INT_MAX) {
            PyErr_Format(PyExc_ValueError, "conv2d: %s %lld is out of range", what, (long long)v[d]);
            return -1;
        }
        out[d] = (int)v[d];
    }
    return 0;
}

static PyObject *graph_conv2d(GraphObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"x", "w", "stride", "padding", "dilation", "groups", NULL};
    PyObject *x, *w, *stride = NULL, *padding = NULL, *dilation = NULL;
    int groups = 1;
    spmd_tensor *t[2];
    spmd_conv2d_options o;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|$OOOi:conv2d", kwlist, &x, &w, &stride, &padding,
                                     &dilation, &groups) ||
        tensor_arg(self, x, &t[0], true) < 0 || tensor_arg(self, w, &t[1], true) < 0 ||
        int_pair_arg("stride", stride, 1, o.stride) < 0 || int_pair_arg("padding", padding, 0, o.padding) < 0 ||
        int_pair_arg("dilation", dilation, 1, o.dilation) < 0)
        return NULL;
    if (groups < 1) {
        PyErr_Format(PyExc_ValueError, "conv2d: %d groups; groups are at least 1", groups);
        return NULL;
    }
    o.groups = groups;
    return wrap_tensor(self, spmd_conv2d(self->g, t[0], t[1], &o));
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

static PyObject *graph_stage_transfer(GraphObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"x", "source", "target", NULL};
    PyObject *x;
    int from, to;
    spmd_tensor *t;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Oii:stage_transfer", kwlist, &x, &from, &to) ||
        tensor_arg(self, x, &t, true) < 0)
        return NULL;
    return wrap_tensor(self, spmd_stage_transfer(self->g, t, from, to));
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
    {"convert", KW(graph_convert), "convert(x, dtype): x as 'f32' or 'bf16' (rounded to nearest even)"},
    {"dropout", KW(graph_dropout),
     "dropout(x, p): in training, each element kept with probability 1 - p and scaled by 1 / (1 - p),\n"
     "else 0; libspmd's own draws (seed, step, site, global index), the same on any mesh; every run\n"
     "draws anew (the state 'rng.step' counts them); p = 0 is x itself"},
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
    {"cumsum", KW(graph_cumsum),
     "cumsum(x, axis, reverse=False): running sums along axis (from the end with reverse)"},
    {"layernorm", KW(graph_layernorm), "layernorm(x, gamma, beta, eps=1e-5): over the last dim"},
    {"max_pool2d", KW(graph_max_pool2d),
     "max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False): over the\n"
     "last two dims of [N, C, H, W] or [C, H, W], as torch.nn.functional.max_pool2d"},
    {"avg_pool2d", KW(graph_avg_pool2d),
     "avg_pool2d(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,\n"
     "divisor_override=None): as torch.nn.functional.avg_pool2d"},
    {"adaptive_avg_pool2d", KW(graph_adaptive_avg_pool2d),
     "adaptive_avg_pool2d(x, output_size): as torch.nn.functional.adaptive_avg_pool2d"},
    {"batch_norm_var", KW(graph_batch_norm_var),
     "batch_norm_var(x, mean): the biased variance [C] of x [N, C, ...] around mean [C] over every "
     "dim but 1"},
    {"batch_norm_stats", FN(graph_batch_norm_stats), METH_O,
     "batch_norm_stats(x) -> (mean, var): x's batch statistics [C], x [N, C, ...]"},
    {"batch_norm", KW(graph_batch_norm),
     "batch_norm(x, mean, var, weight=None, bias=None, eps=1e-5): per channel (dim 1); training "
     "mode when mean and var are batch_norm_stats(x)"},
    {"matmul", KW(graph_matmul),
     "matmul(a, b, *, trans_a=False, trans_b=False): a [..., M, K] times b [K, N] (b [N, K] with trans_b)"},
    {"bmm", KW(graph_bmm), "bmm(a, b, *, trans_a=False, trans_b=False): batched over leading dims"},
    {"attention", KW(graph_attention), "attention(q, k, v, heads): causal self-attention on [B, T, C]"},
    {"cached_attention", KW(graph_cached_attention),
     "cached_attention(q, k_cache, v_cache, pos, heads): causal attention over a KV cache"},
    {"conv2d", KW(graph_conv2d),
     "conv2d(x, w, *, stride=1, padding=0, dilation=1, groups=1): torch's conv2d without bias,\n"
     "x [N, Cin, H, W], w [Cout, Cin / groups, KH, KW]; stride, padding and dilation an int or\n"
     "(rows, columns)"},
    {"permute", KW(graph_permute), "permute(x, perm)"},
    {"transpose", KW(graph_transpose), "transpose(x, dim0, dim1)"},
    {"slice", KW(graph_slice), "slice(x, axis, start, length): x[..., start:start+length, ...]"},
    {"concat", KW(graph_concat), "concat(xs, axis)"},
    {"stage_transfer", KW(graph_stage_transfer),
     "stage_transfer(x, source, target): x of pipeline stage source on stage target"},
    {NULL}};

/* ---- The plain elementwise ops, from the op table ------------------------- */

/* One method of Graph per plain elementwise op of the op table
 * (spmd_op_describe), named as the op: NAME(x) or NAME(a, b), and a
 * constant c after the tensors (positional, or c=) for an op whose formula
 * reads one (scale, pow_scalar).  The table, not a list here, says which
 * ops there are: a row added to ops.def is a method.  The function's
 * `self` is the op's name; PyInstanceMethod binds the graph before the
 * tensors. */
static PyObject *build_by_name(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    const char *name = PyUnicode_AsUTF8(op);
    if (!name) return NULL;
    if (nargs < 1 || !PyObject_TypeCheck(args[0], GraphType)) {
        PyErr_Format(PyExc_TypeError, "%s() is a method of libspmd.Graph", name);
        return NULL;
    }
    GraphObject *g = (GraphObject *)args[0];
    double c = 0.0;
    Py_ssize_t n = nargs - 1, nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nkw; k++) {
        if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, k), "c") != 0) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument %R", name,
                         PyTuple_GET_ITEM(kwnames, k));
            return NULL;
        }
        if ((c = PyFloat_AsDouble(args[nargs + k])) == -1.0 && PyErr_Occurred()) return NULL;
    }
    /* A trailing number is the constant. */
    if (!nkw && n > 0 && (PyFloat_Check(args[nargs - 1]) || PyLong_Check(args[nargs - 1]))) {
        if ((c = PyFloat_AsDouble(args[nargs - 1])) == -1.0 && PyErr_Occurred()) return NULL;
        n--;
    }
    spmd_tensor *t[2];
    if (n < 1 || n > 2) {
        PyErr_Format(PyExc_TypeError, "%s() takes 1 or 2 tensors (%zd given)", name, n);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (tensor_arg(g, args[1 + i], &t[i], true) < 0) return NULL;
    if (graph_open(g) < 0) return NULL;
    return wrap_tensor(g, spmd_elementwise(g->g, name, t, (int)n, (float)c));
}

static PyMethodDef by_name_def = {
    "elementwise", (PyCFunction)(void (*)(void))build_by_name, METH_FASTCALL | METH_KEYWORDS,
    "A plain elementwise op of libspmd's op table: op(x) or op(a, b) (NumPy broadcasting), and the\n"
    "constant c after the tensors for an op that reads one (scale: c * x; pow_scalar: x ** c)"};

int graph_add_table_builders(PyTypeObject *type)
{
    for (int i = 0; i < spmd_op_count(); i++) {
        spmd_op_info op;
        if (spmd_op_describe(i, &op) != SPMD_OK) {
            raise_last();
            return -1;
        }
        if (!op.elementwise) continue;
        PyObject *name = PyUnicode_FromString(op.name);
        PyObject *fn = name ? PyCFunction_NewEx(&by_name_def, name, NULL) : NULL;
        PyObject *method = fn ? PyInstanceMethod_New(fn) : NULL;
        int st = method ? PyObject_SetAttr((PyObject *)type, name, method) : -1;
        Py_XDECREF(method);
        Py_XDECREF(fn);
        Py_XDECREF(name);
        if (st < 0) return -1;
    }
    return 0;
}

PyObject *op_table(PyObject *mod, PyObject *unused)
{
    (void)mod, (void)unused;
    PyObject *list = PyList_New(0);
    for (int i = 0; list && i < spmd_op_count(); i++) {
        spmd_op_info op;
        if (spmd_op_describe(i, &op) != SPMD_OK) {
            Py_DECREF(list);
            return raise_last();
        }
        PyObject *row = Py_BuildValue("{s:s,s:i,s:O,s:O,s:O}", "name", op.name, "arity", op.arity,
                                      "elementwise", op.elementwise ? Py_True : Py_False,
                                      "constant", op.constant ? Py_True : Py_False,
                                      "differentiable", op.differentiable ? Py_True : Py_False);
        if (!row || PyList_Append(list, row) < 0) Py_CLEAR(list);
        Py_XDECREF(row);
    }
    return list;
}
