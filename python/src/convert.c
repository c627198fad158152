/* Python arguments as the C API's (core.h): tensors of a graph, shapes,
 * axes, dtypes, partition specs, meshes. */
#include "core.h"

#include <string.h>

int graph_open(GraphObject *g)
{
    if (g && g->g) return 0;
    PyErr_SetString(error_type(SPMD_ERR_INVALID), "the graph is closed");
    return -1;
}

int program_open(ProgramObject *p)
{
    if (p->p) return 0;
    PyErr_SetString(error_type(SPMD_ERR_INVALID), "the program is closed");
    return -1;
}

const char *tensor_label(const spmd_tensor *t)
{
    const char *name = spmd_tensor_name(t);
    return name ? name : spmd_tensor_op_name(t);
}

int tensor_arg(GraphObject *g, PyObject *o, spmd_tensor **out, bool allow_none)
{
    *out = NULL;
    if (graph_open(g) < 0) return -1;
    if (o == Py_None && allow_none) return 0;
    if (!PyObject_TypeCheck(o, TensorType)) {
        PyErr_Format(PyExc_TypeError, "expected a libspmd Tensor, got %s", Py_TYPE(o)->tp_name);
        return -1;
    }
    TensorObject *t = (TensorObject *)o;
    if (t->graph != g) {
        PyErr_Format(error_type(SPMD_ERR_INVALID), "tensor '%s' belongs to another graph",
                     t->graph && t->graph->g ? tensor_label(t->t) : "?");
        return -1;
    }
    *out = t->t;
    return 0;
}

int tensor_list(GraphObject *g, PyObject *seq, spmd_tensor ***out, int *n)
{
    *out = NULL;
    *n = 0;
    PyObject *fast = PySequence_Fast(seq, "expected a sequence of Tensors");
    if (!fast) return -1;
    Py_ssize_t len = PySequence_Fast_GET_SIZE(fast);
    if (len > INT_MAX) {
        Py_DECREF(fast);
        PyErr_SetString(error_type(SPMD_ERR_INVALID), "too many tensors");
        return -1;
    }
    spmd_tensor **ts = PyMem_Calloc((size_t)(len ? len : 1), sizeof *ts);
    if (!ts) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        if (tensor_arg(g, PySequence_Fast_GET_ITEM(fast, i), &ts[i], true) < 0) {
            PyMem_Free(ts);
            Py_DECREF(fast);
            return -1;
        }
    }
    Py_DECREF(fast);
    *out = ts;
    *n = (int)len;
    return 0;
}

int shape_arg(PyObject *o, int *rank, int64_t dims[SPMD_MAX_RANK])
{
    if (PyLong_Check(o) || PyIndex_Check(o)) {
        PyObject *one = PyTuple_Pack(1, o);
        if (!one) return -1;
        int r = shape_arg(one, rank, dims);
        Py_DECREF(one);
        return r;
    }
    PyObject *fast = PySequence_Fast(o, "a shape must be a sequence of ints");
    if (!fast) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (n > SPMD_MAX_RANK) {
        Py_DECREF(fast);
        PyErr_Format(error_type(SPMD_ERR_INVALID),
                     "shape of rank %zd: at most %d dimensions", n, SPMD_MAX_RANK);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *idx = PyNumber_Index(PySequence_Fast_GET_ITEM(fast, i));
        long long v = idx ? PyLong_AsLongLong(idx) : -1;
        Py_XDECREF(idx);
        if (v == -1 && PyErr_Occurred()) {
            Py_DECREF(fast);
            return -1;
        }
        dims[i] = v;
    }
    Py_DECREF(fast);
    *rank = (int)n;
    return 0;
}

PyObject *shape_tuple(int rank, const int64_t *dims)
{
    PyObject *t = PyTuple_New(rank);
    for (int i = 0; t && i < rank; i++) {
        PyObject *d = PyLong_FromLongLong((long long)dims[i]);
        if (!d) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, d);
    }
    return t;
}

PyObject *tensor_shape_tuple(const spmd_tensor *t)
{
    int64_t dims[SPMD_MAX_RANK];
    int rank = spmd_tensor_rank(t);
    for (int i = 0; i < rank; i++) dims[i] = spmd_tensor_dim(t, i);
    return shape_tuple(rank, dims);
}

int axes_mask(PyObject *o, int rank, uint32_t *mask)
{
    *mask = 0;
    if (o == Py_None) {
        *mask = rank ? (uint32_t)((1u << rank) - 1) : 0;
        return 0;
    }
    PyObject *seq = PyLong_Check(o) || PyIndex_Check(o) ? PyTuple_Pack(1, o) : PySequence_Tuple(o);
    if (!seq) return -1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(seq); i++) {
        long given = PyLong_AsLong(PyTuple_GET_ITEM(seq, i)), a = given;
        if (given == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return -1;
        }
        if (a < 0) a += rank;
        if (a < 0 || a >= rank) {
            Py_DECREF(seq);
            PyErr_Format(error_type(SPMD_ERR_INVALID),
                         "axis %ld is out of range for a tensor of rank %d", given, rank);
            return -1;
        }
        *mask |= 1u << a;
    }
    Py_DECREF(seq);
    return 0;
}

int numpy_type(spmd_dtype d)
{
    switch (d) {
    case SPMD_F32: return NPY_FLOAT32;
    case SPMD_I32: return NPY_INT32;
    default: return -1;
    }
}

int dtype_arg(PyObject *o, spmd_dtype *out)
{
    if (PyUnicode_Check(o)) {
        const char *s = PyUnicode_AsUTF8(o);
        if (!s) return -1;
        static const struct { const char *name; spmd_dtype d; } names[] = {
            {"f32", SPMD_F32}, {"i32", SPMD_I32}, {"bf16", SPMD_BF16}, {"bfloat16", SPMD_BF16}};
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
            if (!strcmp(s, names[i].name)) {
                *out = names[i].d;
                return 0;
            }
    }
    PyArray_Descr *descr = NULL;
    if (!PyArray_DescrConverter(o, &descr)) return -1;
    int num = descr->type_num;
    Py_DECREF(descr);
    if (num == NPY_FLOAT32) *out = SPMD_F32;
    else if (num == NPY_INT32) *out = SPMD_I32;
    else {
        PyErr_Format(error_type(SPMD_ERR_UNSUPPORTED), "dtype %R: libspmd tensors are float32 or int32", o);
        return -1;
    }
    return 0;
}

int axes_text(PyObject *o, const char **out, PyObject **keep)
{
    *out = NULL;
    *keep = NULL;
    if (o == Py_None) return 0;
    if (PyUnicode_Check(o)) {
        Py_INCREF(o);
        *keep = o;
    } else {
        PyObject *comma = PyUnicode_FromString(",");
        *keep = comma ? PyUnicode_Join(comma, o) : NULL;
        Py_XDECREF(comma);
        if (!*keep) return -1;
    }
    *out = PyUnicode_AsUTF8(*keep);
    return *out ? 0 : -1;
}

/* One entry of a partition spec as text: None, an axis name, an axis
 * index of mesh m, or a tuple of those ("(a, b)"). */
static PyObject *spec_entry_text(PyObject *e, const spmd_mesh *m, bool inner)
{
    if (e == Py_None && !inner) return PyUnicode_FromString("None");
    if (PyUnicode_Check(e)) return Py_NewRef(e);
    if (PyLong_Check(e)) {
        long a = PyLong_AsLong(e);
        if (a == -1 && PyErr_Occurred()) return NULL;
        if (!m || a < 0 || a >= spmd_mesh_rank(m)) {
            PyErr_Format(error_type(SPMD_ERR_INVALID),
                         "mesh axis index %ld is out of range for a mesh of rank %d",
                         a, m ? spmd_mesh_rank(m) : 0);
            return NULL;
        }
        return PyUnicode_FromString(spmd_mesh_axis_name(m, (int)a));
    }
    if (!inner && (PyTuple_Check(e) || PyList_Check(e))) {
        PyObject *parts = PyList_New(0);
        for (Py_ssize_t i = 0; parts && i < PySequence_Size(e); i++) {
            PyObject *item = PySequence_GetItem(e, i);
            PyObject *t = item ? spec_entry_text(item, m, true) : NULL;
            Py_XDECREF(item);
            if (!t || PyList_Append(parts, t) < 0) Py_CLEAR(parts);
            Py_XDECREF(t);
        }
        if (!parts) return NULL;
        PyObject *sep = PyUnicode_FromString(", ");
        PyObject *joined = sep ? PyUnicode_Join(sep, parts) : NULL;
        Py_XDECREF(sep);
        Py_DECREF(parts);
        PyObject *r = joined ? PyUnicode_FromFormat("(%U)", joined) : NULL;
        Py_XDECREF(joined);
        return r;
    }
    PyErr_Format(PyExc_TypeError,
                 "a partition spec entry is an axis name, an axis index, a tuple of those, or None; "
                 "got %R", e);
    return NULL;
}

PyObject *spec_text(PyObject *spec, const spmd_mesh *m)
{
    if (PyUnicode_Check(spec)) return Py_NewRef(spec);
    if (!PyTuple_Check(spec) && !PyList_Check(spec)) {
        PyErr_Format(PyExc_TypeError, "a partition spec is a str or a tuple, not %s",
                     Py_TYPE(spec)->tp_name);
        return NULL;
    }
    PyObject *parts = PyList_New(0);
    for (Py_ssize_t i = 0; parts && i < PySequence_Size(spec); i++) {
        PyObject *item = PySequence_GetItem(spec, i);
        PyObject *t = item ? spec_entry_text(item, m, false) : NULL;
        Py_XDECREF(item);
        if (!t || PyList_Append(parts, t) < 0) Py_CLEAR(parts);
        Py_XDECREF(t);
    }
    if (!parts) return NULL;
    PyObject *sep = PyUnicode_FromString(", ");
    PyObject *r = sep ? PyUnicode_Join(sep, parts) : NULL;
    Py_XDECREF(sep);
    Py_DECREF(parts);
    return r;
}

int count_arg(const char *who, const char *name, PyObject *o, uint64_t max, const char *zero,
              uint64_t *out)
{
    PyObject *v = PyNumber_Index(o);
    if (!v) return -1;
    PyObject *top = PyLong_FromUnsignedLongLong(max), *none = PyLong_FromLong(0);
    int below = top && none ? PyObject_RichCompareBool(v, none, Py_LT) : -1;
    int above = below == 0 ? PyObject_RichCompareBool(v, top, Py_GT) : below;
    Py_XDECREF(top);
    Py_XDECREF(none);
    if (below == 0 && above == 0) *out = (uint64_t)PyLong_AsUnsignedLongLong(v);
    else if (below > 0 || above > 0)
        PyErr_Format(error_type(SPMD_ERR_INVALID), "%s: %s wants an integer from 0%s%s%s to %llu, got %S",
                     who, name, zero ? " (" : "", zero ? zero : "", zero ? ")" : "",
                     (unsigned long long)max, v);
    Py_DECREF(v);
    return PyErr_Occurred() ? -1 : 0;
}

int mesh_arg(PyObject *o, MeshObject **out)
{
    if (!PyObject_TypeCheck(o, MeshType)) {
        PyErr_Format(PyExc_TypeError, "expected a libspmd Mesh, got %s", Py_TYPE(o)->tp_name);
        return -1;
    }
    *out = (MeshObject *)o;
    return 0;
}

int mesh_axis_arg(const spmd_mesh *m, PyObject *o, int *axis)
{
    if (PyUnicode_Check(o)) {
        const char *name = PyUnicode_AsUTF8(o);
        if (!name) return -1;
        *axis = spmd_mesh_axis_index(m, name);
        if (*axis < 0) {
            raise_status(SPMD_ERR_INVALID);
            return -1;
        }
        return 0;
    }
    long a = PyLong_AsLong(o);
    if (a == -1 && PyErr_Occurred()) return -1;
    if (a < 0 || a >= spmd_mesh_rank(m)) {
        PyErr_Format(error_type(SPMD_ERR_INVALID), "mesh axis %ld is out of range for a mesh of rank %d", a,
                     spmd_mesh_rank(m));
        return -1;
    }
    *axis = (int)a;
    return 0;
}

int graph_keep_mesh(GraphObject *g, MeshObject *m)
{
    int has = PySequence_Contains(g->meshes, (PyObject *)m);
    if (has < 0) return -1;
    return has ? 0 : PyList_Append(g->meshes, (PyObject *)m);
}
