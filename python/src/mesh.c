/* libspmd._core.Mesh: a named mesh of devices (spmd_mesh; core.h). */
#include "core.h"

PyTypeObject *MeshType;

static PyObject *mesh_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"shape", "axis_names", "device_ids", NULL};
    PyObject *shape, *names = Py_None, *ids = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OO:Mesh", kwlist, &shape, &names, &ids))
        return NULL;
    spmd_mesh *m = NULL;
    if (PyUnicode_Check(shape)) {
        /* The text form "4x2", "replica,fsdp", as spmd --mesh/--axes. */
        if (ids != Py_None) {
            PyErr_SetString(error_type(SPMD_ERR_INVALID), "device_ids need the shape as a tuple, not text");
            return NULL;
        }
        const char *axes;
        PyObject *keep;
        if (axes_text(names, &axes, &keep) < 0) return NULL;
        m = spmd_mesh_parse(PyUnicode_AsUTF8(shape), axes);
        Py_XDECREF(keep);
    } else {
        if (names == Py_None) {
            PyErr_SetString(error_type(SPMD_ERR_INVALID), "a mesh needs axis names (one per dimension)");
            return NULL;
        }
        PyObject *dims = PySequence_Tuple(shape);
        PyObject *comma = PyUnicode_FromString(",");
        PyObject *nm = dims && comma ? (PyUnicode_Check(names) ? PyUnicode_Split(names, comma, -1)
                                                               : PySequence_Tuple(names))
                                     : NULL;
        Py_XDECREF(comma);
        PyObject *idt = nm && ids != Py_None ? PySequence_Tuple(ids) : NULL;
        Py_ssize_t rank = dims ? PyTuple_GET_SIZE(dims) : 0;
        int *sizes = NULL, *perm = NULL;
        const char **axis = NULL;
        long long devices = 1;
        if (!nm || (ids != Py_None && !idt)) goto mesh_fail;
        if (PySequence_Size(nm) != rank) {
            PyErr_Format(error_type(SPMD_ERR_INVALID),
                         "a mesh of rank %zd needs %zd axis names, got %zd", rank, rank,
                         PySequence_Size(nm));
            goto mesh_fail;
        }
        sizes = PyMem_Calloc((size_t)rank + 1, sizeof *sizes);
        axis = PyMem_Calloc((size_t)rank + 1, sizeof *axis);
        if (!sizes || !axis) {
            PyErr_NoMemory();
            goto mesh_fail;
        }
        for (Py_ssize_t i = 0; i < rank; i++) {
            PyObject *item = PySequence_GetItem(nm, i);
            long s = PyLong_AsLong(PyTuple_GET_ITEM(dims, i));
            if (s == -1 && PyErr_Occurred()) {
                Py_XDECREF(item);
                goto mesh_fail;
            }
            if (s < INT_MIN || s > INT_MAX) s = -1; /* refused by the C side */
            sizes[i] = (int)s;
            devices *= s > 0 ? s : 1;
            axis[i] = item && PyUnicode_Check(item) ? PyUnicode_AsUTF8(item) : NULL;
            Py_XDECREF(item); /* the tuple keeps the str alive */
            if (!axis[i]) {
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "axis names must be str");
                goto mesh_fail;
            }
        }
        if (idt) {
            if (PyTuple_GET_SIZE(idt) != devices) {
                PyErr_Format(error_type(SPMD_ERR_INVALID), "device_ids: %zd ids for a mesh of %lld devices",
                             PyTuple_GET_SIZE(idt), devices);
                goto mesh_fail;
            }
            perm = PyMem_Calloc((size_t)devices, sizeof *perm);
            if (!perm) {
                PyErr_NoMemory();
                goto mesh_fail;
            }
            for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(idt); i++) {
                PyObject *idx = PyNumber_Index(PyTuple_GET_ITEM(idt, i));
                long v = idx ? PyLong_AsLong(idx) : -1;
                Py_XDECREF(idx);
                if (v == -1 && PyErr_Occurred()) goto mesh_fail;
                perm[i] = v < INT_MIN || v > INT_MAX ? -1 : (int)v;
            }
        }
        m = spmd_mesh_create((int)rank, sizes, axis, perm);
        if (!m) raise_last();
    mesh_fail:
        PyMem_Free(sizes);
        PyMem_Free(axis);
        PyMem_Free(perm);
        Py_XDECREF(dims);
        Py_XDECREF(nm);
        Py_XDECREF(idt);
        if (!m) return NULL;
    }
    if (!m) return raise_last();
    MeshObject *self = (MeshObject *)type->tp_alloc(type, 0);
    if (!self) {
        spmd_mesh_free(m);
        return NULL;
    }
    self->m = m;
    return (PyObject *)self;
}

static void mesh_dealloc(MeshObject *self)
{
    spmd_mesh_free(self->m);
    PyTypeObject *type = Py_TYPE(self);
    type->tp_free((PyObject *)self);
    Py_DECREF(type); /* instances of heap types hold their type */
}

static PyObject *mesh_get_shape(MeshObject *self, void *unused)
{
    (void)unused;
    int64_t dims[64];
    int rank = spmd_mesh_rank(self->m);
    for (int i = 0; i < rank && i < 64; i++) dims[i] = spmd_mesh_axis_size(self->m, i);
    return shape_tuple(rank < 64 ? rank : 64, dims);
}

static PyObject *mesh_get_axis_names(MeshObject *self, void *unused)
{
    (void)unused;
    int rank = spmd_mesh_rank(self->m);
    PyObject *t = PyTuple_New(rank);
    for (int i = 0; t && i < rank; i++) {
        PyObject *s = PyUnicode_FromString(spmd_mesh_axis_name(self->m, i));
        if (!s) Py_CLEAR(t);
        else PyTuple_SET_ITEM(t, i, s);
    }
    return t;
}

static PyObject *mesh_get_int(MeshObject *self, void *which)
{
    int (*f)(const spmd_mesh *) = (int (*)(const spmd_mesh *))which;
    return PyLong_FromLong(f(self->m));
}

static PyObject *mesh_devices(MeshObject *self, PyObject *unused)
{
    (void)unused;
    return PyLong_FromLong(spmd_mesh_devices(self->m));
}

static PyObject *mesh_axis_index(MeshObject *self, PyObject *name)
{
    int axis;
    if (mesh_axis_arg(self->m, name, &axis) < 0) return NULL;
    return PyLong_FromLong(axis);
}

static PyObject *mesh_axis_flag_set(MeshObject *self, PyObject *args, PyObject *kw, const char *fmt,
                                    spmd_status (*set)(spmd_mesh *, int, bool), const char *flag)
{
    char *kwlist[] = {"axis", (char *)flag, NULL};
    PyObject *a;
    int on = 1, axis;
    if (!PyArg_ParseTupleAndKeywords(args, kw, fmt, kwlist, &a, &on)) return NULL;
    if (mesh_axis_arg(self->m, a, &axis) < 0) return NULL;
    RETURN_STATUS(set(self->m, axis, on));
}

static PyObject *mesh_set_axis_local(MeshObject *self, PyObject *args, PyObject *kw)
{
    return mesh_axis_flag_set(self, args, kw, "O|p:set_axis_local", spmd_mesh_set_axis_local, "local");
}

static PyObject *mesh_set_axis_independent(MeshObject *self, PyObject *args, PyObject *kw)
{
    return mesh_axis_flag_set(self, args, kw, "O|p:set_axis_independent", spmd_mesh_set_axis_independent,
                              "independent");
}

static PyObject *mesh_axis_is_local(MeshObject *self, PyObject *a)
{
    int axis;
    if (mesh_axis_arg(self->m, a, &axis) < 0) return NULL;
    return PyBool_FromLong(spmd_mesh_axis_is_local(self->m, axis));
}

static PyObject *mesh_axis_is_independent(MeshObject *self, PyObject *a)
{
    int axis;
    if (mesh_axis_arg(self->m, a, &axis) < 0) return NULL;
    return PyBool_FromLong(spmd_mesh_axis_is_independent(self->m, axis));
}

static PyObject *mesh_set_stage_axis(MeshObject *self, PyObject *a)
{
    int axis = -1;
    if (a != Py_None && mesh_axis_arg(self->m, a, &axis) < 0) return NULL;
    RETURN_STATUS(spmd_mesh_set_stage_axis(self->m, axis));
}

static PyObject *mesh_place_processes(MeshObject *self, PyObject *arg)
{
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    RETURN_STATUS(spmd_mesh_place_processes(self->m, n < INT_MIN || n > INT_MAX ? -1 : (int)n));
}

static PyObject *mesh_set_network(MeshObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"latency_s", "bytes_per_s", NULL};
    double latency, bandwidth;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "dd:set_network", kwlist, &latency, &bandwidth))
        return NULL;
    RETURN_STATUS(spmd_mesh_set_network(self->m, latency, bandwidth));
}

static PyObject *mesh_network(MeshObject *self, PyObject *unused)
{
    (void)unused;
    double latency, bandwidth;
    spmd_mesh_network(self->m, &latency, &bandwidth);
    return Py_BuildValue("(dd)", latency, bandwidth);
}

static PyObject *mesh_group(MeshObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"device", "axes", NULL};
    int device;
    PyObject *axes_o;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iO:group", kwlist, &device, &axes_o)) return NULL;
    const char *axes;
    PyObject *keep;
    if (axes_text(axes_o, &axes, &keep) < 0) return NULL;
    int cap = spmd_mesh_devices(self->m);
    int *members = PyMem_Calloc((size_t)cap, sizeof *members);
    if (!members) {
        Py_XDECREF(keep);
        return PyErr_NoMemory();
    }
    int n = spmd_mesh_group(self->m, device, axes ? axes : "", members, cap);
    Py_XDECREF(keep);
    PyObject *list = n < 0 ? raise_status(SPMD_ERR_INVALID) : PyList_New(n);
    for (int i = 0; list && i < n; i++) PyList_SET_ITEM(list, i, PyLong_FromLong(members[i]));
    PyMem_Free(members);
    return list;
}

static PyObject *mesh_repr(MeshObject *self)
{
    PyObject *shape = mesh_get_shape(self, NULL), *names = mesh_get_axis_names(self, NULL);
    PyObject *r = shape && names ? PyUnicode_FromFormat("Mesh(%R, %R)", shape, names) : NULL;
    Py_XDECREF(shape);
    Py_XDECREF(names);
    return r;
}

static PyMethodDef mesh_methods[] = {
    {"devices", FN(mesh_devices), METH_NOARGS, "devices() -> the number of devices"},
    {"axis_index", FN(mesh_axis_index), METH_O, "axis_index(name) -> the axis's index"},
    {"set_axis_local", KW(mesh_set_axis_local),
     "set_axis_local(axis, local=True): whether the axis's groups stay inside one process"},
    {"is_axis_local", FN(mesh_axis_is_local), METH_O, "is_axis_local(axis) -> bool"},
    {"set_axis_independent", KW(mesh_set_axis_independent),
     "set_axis_independent(axis, independent=True): each group along it is a copy, a model of its own"},
    {"is_axis_independent", FN(mesh_axis_is_independent), METH_O,
     "is_axis_independent(axis) -> bool"},
    {"set_stage_axis", FN(mesh_set_stage_axis), METH_O,
     "set_stage_axis(axis): the pipeline's stage axis (a name or index; None for none), before any mark"},
    {"place_processes", FN(mesh_place_processes), METH_O,
     "place_processes(P): lay the devices out over P processes as a run over MPI does"},
    {"set_network", KW(mesh_set_network),
     "set_network(latency_s, bytes_per_s): the figures that price axes across processes"},
    {"network", FN(mesh_network), METH_NOARGS, "network() -> (latency_s, bytes_per_s)"},
    {"group", KW(mesh_group),
     "group(device, axes) -> the devices of device's group along axes, in rank order"},
    {NULL}};

static PyGetSetDef mesh_getset[] = {
    {"shape", GET(mesh_get_shape), NULL, "the size of each axis", NULL},
    {"axis_names", GET(mesh_get_axis_names), NULL, "the name of each axis", NULL},
    {"rank", GET(mesh_get_int), NULL, "the number of axes", (void *)spmd_mesh_rank},
    {"processes", GET(mesh_get_int), NULL, "processes of the last place_processes",
     (void *)spmd_mesh_processes},
    {"copies", GET(mesh_get_int), NULL, "the product of the independent axes' sizes",
     (void *)spmd_mesh_copies},
    {"stage_axis", GET(mesh_get_int), NULL, "the index of the stage axis, -1 for none",
     (void *)spmd_mesh_stage_axis},
    {NULL}};

static PyType_Slot mesh_slots[] = {
    {Py_tp_doc, "Mesh(shape, axis_names, device_ids=None): a named mesh of devices.\n\n"
                "shape is a tuple of sizes or the text \"4x2\"; axis_names a tuple of names or\n"
                "the text \"replica,fsdp\"; device_ids (with a tuple shape) the device at each\n"
                "row-major coordinate."},
    {Py_tp_new, mesh_new},
    {Py_tp_dealloc, mesh_dealloc},
    {Py_tp_repr, mesh_repr},
    {Py_tp_methods, mesh_methods},
    {Py_tp_getset, mesh_getset},
    {0, NULL}};

int mesh_register(PyObject *mod)
{
    MeshType = add_type(mod, "libspmd._core.Mesh", sizeof(MeshObject),
                        Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE, mesh_slots);
    return MeshType ? 0 : -1;
}
