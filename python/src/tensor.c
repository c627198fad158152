/* libspmd._core.Tensor: a node of a Graph (core.h). */
#include "core.h"

#include <string.h>

PyTypeObject *TensorType;

PyObject *wrap_tensor(GraphObject *g, spmd_tensor *t)
{
    if (!t) return raise_last();
    TensorObject *self = PyObject_GC_New(TensorObject, TensorType);
    if (!self) return NULL;
    Py_INCREF(g);
    self->graph = g;
    self->t = t;
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

/* A tensor usable now: its graph is open. */
static int tensor_live(TensorObject *self)
{
    if (self->graph && self->graph->g && self->t) return 0;
    PyErr_SetString(error_type(SPMD_ERR_INVALID), "the tensor's graph is closed");
    return -1;
}

static int tensor_traverse(TensorObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->graph);
    Py_VISIT(Py_TYPE(self));
    return 0;
}

static int tensor_clear(TensorObject *self)
{
    self->t = NULL;
    Py_CLEAR(self->graph);
    return 0;
}

static void tensor_dealloc(TensorObject *self)
{
    PyObject_GC_UnTrack(self);
    tensor_clear(self);
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_Del(self);
    Py_DECREF(type);
}

static PyObject *tensor_get_name(TensorObject *self, void *unused)
{
    (void)unused;
    if (tensor_live(self) < 0) return NULL;
    const char *name = spmd_tensor_name(self->t);
    if (!name) Py_RETURN_NONE;
    return PyUnicode_FromString(name);
}

static int tensor_set_name(TensorObject *self, PyObject *value, void *unused)
{
    (void)unused;
    if (tensor_live(self) < 0) return -1;
    if (!value || !PyUnicode_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "a tensor's name is a str");
        return -1;
    }
    const char *name = PyUnicode_AsUTF8(value);
    return name ? check(spmd_tensor_set_name(self->t, name)) : -1;
}

static PyObject *tensor_get_shape(TensorObject *self, void *unused)
{
    (void)unused;
    return tensor_live(self) < 0 ? NULL : tensor_shape_tuple(self->t);
}

static PyObject *tensor_get_dtype(TensorObject *self, void *unused)
{
    (void)unused;
    if (tensor_live(self) < 0) return NULL;
    int num = numpy_type(spmd_tensor_dtype(self->t));
    if (num < 0) return PyUnicode_FromString(spmd_dtype_name(spmd_tensor_dtype(self->t)));
    return (PyObject *)PyArray_DescrFromType(num);
}

static PyObject *tensor_get_rank(TensorObject *self, void *unused)
{
    (void)unused;
    return tensor_live(self) < 0 ? NULL : PyLong_FromLong(spmd_tensor_rank(self->t));
}

static PyObject *tensor_get_size(TensorObject *self, void *unused)
{
    (void)unused;
    return tensor_live(self) < 0 ? NULL : PyLong_FromLongLong((long long)spmd_tensor_numel(self->t));
}

static PyObject *tensor_get_op(TensorObject *self, void *unused)
{
    (void)unused;
    return tensor_live(self) < 0 ? NULL : PyUnicode_FromString(spmd_tensor_op_name(self->t));
}

static PyObject *tensor_get_is_param(TensorObject *self, void *unused)
{
    (void)unused;
    return tensor_live(self) < 0 ? NULL : PyBool_FromLong(spmd_tensor_is_param(self->t));
}

static PyObject *tensor_get_stage(TensorObject *self, void *unused)
{
    (void)unused;
    return tensor_live(self) < 0 ? NULL : PyLong_FromLong(spmd_tensor_stage(self->t));
}

static PyObject *tensor_get_is_frozen(TensorObject *self, void *unused)
{
    (void)unused;
    return tensor_live(self) < 0 ? NULL : PyBool_FromLong(spmd_tensor_is_frozen(self->t));
}

static PyObject *tensor_get_grad(TensorObject *self, void *unused)
{
    (void)unused;
    if (tensor_live(self) < 0) return NULL;
    spmd_tensor *g = spmd_tensor_grad(self->t);
    if (!g) Py_RETURN_NONE;
    return wrap_tensor(self->graph, g);
}

static PyObject *tensor_get_graph(TensorObject *self, void *unused)
{
    (void)unused;
    if (!self->graph) Py_RETURN_NONE;
    return Py_NewRef(self->graph);
}

/* Text the C API writes into a caller's buffer: grown until it fits. */
typedef const char *(*text_fn)(const spmd_tensor *, char *, size_t);

static PyObject *tensor_text(TensorObject *self, text_fn f)
{
    if (tensor_live(self) < 0) return NULL;
    for (size_t size = 256; size <= (1u << 20); size *= 4) {
        char *buf = PyMem_Malloc(size);
        if (!buf) return PyErr_NoMemory();
        const char *s = f(self->t, buf, size);
        size_t n = s ? strlen(s) : 0;
        if (n + 1 < size) {
            PyObject *r = PyUnicode_FromString(s ? s : "");
            PyMem_Free(buf);
            return r;
        }
        PyMem_Free(buf);
    }
    PyErr_SetString(error_type(SPMD_ERR_INTERNAL), "text longer than 1 MiB");
    return NULL;
}

static PyObject *tensor_get_sharding(TensorObject *self, void *unused)
{
    (void)unused;
    return tensor_text(self, spmd_get_sharding);
}

static PyObject *tensor_get_hlo_sharding(TensorObject *self, void *unused)
{
    (void)unused;
    return tensor_text(self, spmd_get_hlo_sharding);
}

static PyObject *tensor_get_signature(TensorObject *self, void *unused)
{
    (void)unused;
    return tensor_text(self, spmd_tensor_signature);
}

static PyObject *tensor_repr(TensorObject *self)
{
    if (!self->graph || !self->graph->g) return PyUnicode_FromString("<Tensor of a closed graph>");
    PyObject *shape = tensor_shape_tuple(self->t);
    const char *name = spmd_tensor_name(self->t);
    const char *op = spmd_tensor_op_name(self->t), *dtype = spmd_dtype_name(spmd_tensor_dtype(self->t));
    PyObject *r = !shape ? NULL
                  : name ? PyUnicode_FromFormat("<Tensor '%s' %s %R %s>", name, op, shape, dtype)
                         : PyUnicode_FromFormat("<Tensor %s %R %s>", op, shape, dtype);
    Py_XDECREF(shape);
    return r;
}

/* Two Tensor objects are equal when they wrap the same node. */
static PyObject *tensor_richcompare(PyObject *a, PyObject *b, int op)
{
    if ((op != Py_EQ && op != Py_NE) || !PyObject_TypeCheck(b, TensorType)) Py_RETURN_NOTIMPLEMENTED;
    bool same = ((TensorObject *)a)->t == ((TensorObject *)b)->t;
    return PyBool_FromLong(op == Py_EQ ? same : !same);
}

static Py_hash_t tensor_hash(TensorObject *self)
{
    Py_hash_t h = (Py_hash_t)((uintptr_t)self->t >> 4);
    return h == -1 ? -2 : h;
}

static PyGetSetDef tensor_getset[] = {
    {"name", GET(tensor_get_name), SET(tensor_set_name), "the unique name, or None", NULL},
    {"shape", GET(tensor_get_shape), NULL, "the global shape", NULL},
    {"dtype", GET(tensor_get_dtype), NULL, "numpy.float32 or numpy.int32", NULL},
    {"rank", GET(tensor_get_rank), NULL, "the number of dimensions", NULL},
    {"ndim", GET(tensor_get_rank), NULL, "the number of dimensions", NULL},
    {"size", GET(tensor_get_size), NULL, "the number of elements", NULL},
    {"op", GET(tensor_get_op), NULL, "the op's name (\"matmul\", \"param\", ...)", NULL},
    {"is_param", GET(tensor_get_is_param), NULL, "whether it is a parameter (frozen or trained)", NULL},
    {"stage", GET(tensor_get_stage), NULL, "the pipeline stage it is placed on, -1 for none", NULL},
    {"is_frozen", GET(tensor_get_is_frozen), NULL, "whether it is a frozen parameter (Graph.param_freeze)",
     NULL},
    {"grad", GET(tensor_get_grad), NULL, "a parameter's gradient after Graph.grad, else None", NULL},
    {"graph", GET(tensor_get_graph), NULL, "the Graph it belongs to", NULL},
    {"sharding", GET(tensor_get_sharding), NULL,
     "the propagated sharding once compiled, else the mark; \"\" with neither", NULL},
    {"hlo_sharding", GET(tensor_get_hlo_sharding), NULL, "the sharding as GSPMD HloSharding text",
     NULL},
    {"signature", GET(tensor_get_signature), NULL, "the op's iteration space, einsum style", NULL},
    {NULL}};

static PyType_Slot tensor_slots[] = {
    {Py_tp_doc, "A node of a Graph (made by its builders; keeps the Graph alive)."},
    {Py_tp_dealloc, tensor_dealloc},
    {Py_tp_traverse, tensor_traverse},
    {Py_tp_clear, tensor_clear},
    {Py_tp_repr, tensor_repr},
    {Py_tp_richcompare, tensor_richcompare},
    {Py_tp_hash, tensor_hash},
    {Py_tp_getset, tensor_getset},
    {0, NULL}};

int tensor_register(PyObject *mod)
{
    /* Tensors are made by the builders only (no tp_new), and not
     * subclassed: each wraps one node. */
    TensorType = add_type(mod, "libspmd._core.Tensor", sizeof(TensorObject),
                          Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_DISALLOW_INSTANTIATION,
                          tensor_slots);
    return TensorType ? 0 : -1;
}
