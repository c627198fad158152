/* libspmd._core.Graph: its life, queries, marks and autodiff (core.h);
 * its builders (builders.c), training layer (training.c) and compile
 * (compile.c) bring their own methods. */
#include "core.h"

#include <string.h>

PyTypeObject *GraphType;

static PyObject *graph_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    (void)args;
    (void)kw;
    GraphObject *self = (GraphObject *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    self->meshes = PyList_New(0);
    if (!self->meshes) {
        Py_DECREF(self);
        return NULL;
    }
    self->g = spmd_graph_create(NULL);
    if (!self->g) {
        Py_DECREF(self);
        return raise_last();
    }
    return (PyObject *)self;
}

/* Subclasses may take their own arguments: __init__ ignores them. */
static int graph_init(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    (void)args;
    (void)kw;
    return 0;
}

static int graph_traverse(GraphObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->meshes);
    Py_VISIT(Py_TYPE(self)); /* a heap type's instances visit it */
    return 0;
}

/* Nothing to break: meshes never refer back, and they must outlive g. */
static int graph_clear(GraphObject *self)
{
    (void)self;
    return 0;
}

static void graph_dealloc(GraphObject *self)
{
    PyObject_GC_UnTrack(self);
    /* Every Tensor and Program holds a reference, so none is left. */
    spmd_graph_free(self->g);
    self->g = NULL;
    Py_CLEAR(self->meshes);
    PyTypeObject *type = Py_TYPE(self);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

static PyObject *graph_close(GraphObject *self, PyObject *unused)
{
    (void)unused;
    if (self->programs) {
        PyErr_Format(error_type(SPMD_ERR_INVALID), "the graph has %d open program%s: close them first",
                     self->programs, self->programs == 1 ? "" : "s");
        return NULL;
    }
    spmd_graph_free(self->g);
    self->g = NULL;
    Py_RETURN_NONE;
}

PyObject *graph_enter(PyObject *self, PyObject *unused)
{
    (void)unused;
    return Py_NewRef(self);
}

static PyObject *graph_exit(GraphObject *self, PyObject *args)
{
    (void)args;
    return graph_close(self, NULL);
}


static PyObject *graph_find(GraphObject *self, PyObject *name_o)
{
    const char *name = PyUnicode_Check(name_o) ? PyUnicode_AsUTF8(name_o) : NULL;
    if (!name) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "find(name): name is a str");
        return NULL;
    }
    if (graph_open(self) < 0) return NULL;
    spmd_tensor *t = spmd_graph_find(self->g, name);
    if (!t) Py_RETURN_NONE;
    return wrap_tensor(self, t);
}

/* Tensors in creation order; with params_only, the parameters alone. */
static PyObject *graph_list(GraphObject *self, bool params_only)
{
    if (graph_open(self) < 0) return NULL;
    PyObject *list = PyList_New(0);
    int n = spmd_graph_tensor_count(self->g);
    for (int i = 0; list && i < n; i++) {
        spmd_tensor *t = spmd_graph_tensor(self->g, i);
        if (params_only && !spmd_tensor_is_param(t)) continue;
        PyObject *o = wrap_tensor(self, t);
        if (!o || PyList_Append(list, o) < 0) Py_CLEAR(list);
        Py_XDECREF(o);
    }
    return list;
}

static PyObject *graph_tensors(GraphObject *self, PyObject *unused)
{
    (void)unused;
    return graph_list(self, false);
}

static PyObject *graph_params(GraphObject *self, PyObject *unused)
{
    (void)unused;
    return graph_list(self, true);
}

static Py_ssize_t graph_len(GraphObject *self)
{
    if (graph_open(self) < 0) return -1;
    return spmd_graph_tensor_count(self->g);
}

static PyObject *graph_get_param_count(GraphObject *self, void *unused)
{
    (void)unused;
    if (graph_open(self) < 0) return NULL;
    return PyLong_FromLongLong((long long)spmd_graph_param_count(self->g));
}

PyObject *graph_get_mesh(GraphObject *self, void *unused)
{
    (void)unused;
    if (PyList_GET_SIZE(self->meshes) == 0) Py_RETURN_NONE;
    return Py_NewRef(PyList_GET_ITEM(self->meshes, 0));
}

static PyObject *graph_get_closed(GraphObject *self, void *unused)
{
    (void)unused;
    return PyBool_FromLong(self->g == NULL);
}

static PyObject *graph_check(GraphObject *self, PyObject *unused)
{
    (void)unused;
    if (graph_open(self) < 0) return NULL;
    RETURN_STATUS(spmd_graph_status(self->g));
}

static PyObject *graph_mark_output(GraphObject *self, PyObject *x)
{
    spmd_tensor *t;
    if (tensor_arg(self, x, &t, true) < 0) return NULL;
    RETURN_STATUS(spmd_graph_mark_output(self->g, t));
}

static PyObject *graph_param_freeze(GraphObject *self, PyObject *x)
{
    spmd_tensor *t;
    if (tensor_arg(self, x, &t, true) < 0) return NULL;
    RETURN_STATUS(spmd_param_freeze(t));
}

static PyObject *graph_set_update(GraphObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"target", "value", NULL};
    PyObject *a, *b;
    spmd_tensor *t[2];
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO:set_update", kwlist, &a, &b) ||
        tensor_arg(self, a, &t[0], true) < 0 || tensor_arg(self, b, &t[1], true) < 0)
        return NULL;
    RETURN_STATUS(spmd_graph_set_update(self->g, t[0], t[1]));
}

static PyObject *graph_mark_sharding(GraphObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"tensor", "mesh", "spec", NULL};
    PyObject *x, *mesh_o, *spec_o;
    MeshObject *mesh;
    spmd_tensor *t;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO:mark_sharding", kwlist, &x, &mesh_o, &spec_o) ||
        tensor_arg(self, x, &t, true) < 0 || mesh_arg(mesh_o, &mesh) < 0)
        return NULL;
    PyObject *spec = spec_text(spec_o, mesh->m);
    if (!spec) return NULL;
    const char *text = PyUnicode_AsUTF8(spec);
    spmd_status st = text ? spmd_mark_sharding(self->g, t, mesh->m, text) : SPMD_OK;
    Py_DECREF(spec);
    if (!text || check(st) < 0 || graph_keep_mesh(self, mesh) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *graph_set_stage(GraphObject *self, PyObject *arg)
{
    if (graph_open(self) < 0) return NULL;
    long s = PyLong_AsLong(arg);
    if (s == -1 && PyErr_Occurred()) return NULL;
    RETURN_STATUS(spmd_graph_set_stage(self->g, s < INT_MIN || s > INT_MAX ? INT_MIN : (int)s));
}

static PyObject *graph_set_micro_batch(GraphObject *self, PyObject *arg)
{
    if (graph_open(self) < 0) return NULL;
    long m = PyLong_AsLong(arg);
    if (m == -1 && PyErr_Occurred()) return NULL;
    RETURN_STATUS(spmd_graph_set_micro_batch(self->g, m < INT_MIN || m > INT_MAX ? INT_MIN : (int)m));
}

static PyObject *graph_clear_sharding(GraphObject *self, PyObject *x)
{
    spmd_tensor *t;
    if (tensor_arg(self, x, &t, false) < 0) return NULL;
    RETURN_STATUS(spmd_clear_sharding(t));
}

static PyObject *graph_grad(GraphObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"loss", "checkpoints", NULL};
    PyObject *loss_o, *ckpt_o = Py_None;
    spmd_tensor *loss, **ckpt = NULL;
    int n = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:grad", kwlist, &loss_o, &ckpt_o) ||
        tensor_arg(self, loss_o, &loss, true) < 0 ||
        (ckpt_o != Py_None && tensor_list(self, ckpt_o, &ckpt, &n) < 0))
        return NULL;
    spmd_status st = ckpt ? spmd_grad_checkpointed(self->g, loss, ckpt, n) : spmd_grad(self->g, loss);
    PyMem_Free(ckpt);
    RETURN_STATUS(st);
}


static PyMethodDef graph_core_methods[] = {
    {"find", FN(graph_find), METH_O, "find(name) -> the Tensor of that name, or None"},
    {"tensors", FN(graph_tensors), METH_NOARGS, "tensors() -> every Tensor, in creation order"},
    {"params", FN(graph_params), METH_NOARGS, "params() -> the parameters, in creation order"},
    {"check", FN(graph_check), METH_NOARGS,
     "check(): raise the first failure of a builder on this graph, if any"},
    {"mark_output", FN(graph_mark_output), METH_O, "mark_output(t): keep t readable after a run"},
    {"param_freeze", FN(graph_param_freeze), METH_O,
     "param_freeze(p): hold parameter p constant (no gradient, no update, no optimizer state); "
     "before grad"},
    {"set_update", KW(graph_set_update), "set_update(target, value): copy value into target after each run"},
    {"mark_sharding", KW(graph_mark_sharding),
     "mark_sharding(t, mesh, spec): spec as text \"(replica, fsdp), None\" or a tuple\n"
     "(('replica', 'fsdp'), None); entries an axis name or index, a tuple of them, or None"},
    {"clear_sharding", FN(graph_clear_sharding), METH_O, "clear_sharding(t): drop t's mark"},
    {"set_stage", FN(graph_set_stage), METH_O,
     "set_stage(s): place the nodes built from now on on pipeline stage s (-1: none)"},
    {"set_micro_batch", FN(graph_set_micro_batch), METH_O,
     "set_micro_batch(m): the nodes built from now on compute micro-batch m (-1: none), the order "
     "compile(schedule='1f1b') runs them in"},
    {"grad", KW(graph_grad),
     "grad(loss, checkpoints=None): append the backward pass (recomputing between checkpoints)"},
    {"close", FN(graph_close), METH_NOARGS, "close(): free the graph now (no program may be open)"},
    {"__enter__", FN(graph_enter), METH_NOARGS, NULL},
    {"__exit__", FN(graph_exit), METH_VARARGS, NULL},
    {NULL}};

static PyGetSetDef graph_getset[] = {
    {"param_count", GET(graph_get_param_count), NULL, "trained elements", NULL},
    {"mesh", GET(graph_get_mesh), NULL, "the mesh of the marks, or None", NULL},
    {"closed", GET(graph_get_closed), NULL, "whether close() was called", NULL},
    {NULL}};

static PyType_Slot graph_slots[] = {
    {Py_tp_doc, "Graph(): a training step for one logical device, built op by op."},
    {Py_tp_new, graph_new},
    {Py_tp_init, graph_init},
    {Py_tp_dealloc, graph_dealloc},
    {Py_tp_traverse, graph_traverse},
    {Py_tp_clear, graph_clear},
    {Py_tp_methods, NULL}, /* graph_register fills it */
    {Py_tp_getset, graph_getset},
    {Py_sq_length, graph_len},
    {0, NULL}};

/* The type's methods: this file's and those of the files of the Graph's
 * other concepts, in one table that lives as long as the type. */
static PyMethodDef *graph_methods(void)
{
    const PyMethodDef *parts[] = {graph_core_methods, graph_builder_methods, graph_training_methods,
                                  graph_compile_methods};
    size_t n = 0;
    for (size_t p = 0; p < sizeof parts / sizeof parts[0]; p++)
        for (const PyMethodDef *m = parts[p]; m->ml_name; m++) n++;
    PyMethodDef *all = PyMem_Calloc(n + 1, sizeof *all);
    if (!all) return (PyMethodDef *)PyErr_NoMemory();
    n = 0;
    for (size_t p = 0; p < sizeof parts / sizeof parts[0]; p++)
        for (const PyMethodDef *m = parts[p]; m->ml_name; m++) all[n++] = *m;
    return all;
}

int graph_register(PyObject *mod)
{
    static PyMethodDef *methods;
    if (!methods && !(methods = graph_methods())) return -1;
    for (PyType_Slot *s = graph_slots; s->slot; s++)
        if (s->slot == Py_tp_methods) s->pfunc = methods;
    GraphType = add_type(mod, "libspmd._core.Graph", sizeof(GraphObject),
                         Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC, graph_slots);
    return GraphType ? graph_add_table_builders(GraphType) : -1;
}
