/* libspmd._core.Program: a compiled program (spmd_program; core.h): set
 * inputs, run, read and write, its figures, checkpoints. */
#include "core.h"

#include <stdlib.h>
#include <string.h>

PyTypeObject *ProgramType;

/* Free the C program before letting go of the graph it was compiled
 * from: the cycle collector may clear this object first. */
static void program_release(ProgramObject *self)
{
    if (self->p) {
        spmd_program_free(self->p);
        self->p = NULL;
        self->graph->programs--;
    }
}

static int program_traverse(ProgramObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->graph);
    Py_VISIT(Py_TYPE(self)); /* a heap type's instances visit it */
    return 0;
}

static int program_clear(ProgramObject *self)
{
    program_release(self);
    Py_CLEAR(self->graph);
    return 0;
}

static void program_dealloc(ProgramObject *self)
{
    PyObject_GC_UnTrack(self);
    program_clear(self);
    PyTypeObject *type = Py_TYPE(self);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

static PyObject *program_close(ProgramObject *self, PyObject *unused)
{
    (void)unused;
    program_release(self);
    Py_RETURN_NONE;
}

static PyObject *program_exit(ProgramObject *self, PyObject *args)
{
    (void)args;
    return program_close(self, NULL);
}

/* A tensor of the program's graph, given as a Tensor or by name. */
static int program_tensor(ProgramObject *self, PyObject *o, spmd_tensor **out)
{
    if (program_open(self) < 0) return -1;
    if (PyUnicode_Check(o)) {
        const char *name = PyUnicode_AsUTF8(o);
        if (!name) return -1;
        *out = spmd_graph_find(self->graph->g, name);
        if (!*out) {
            PyErr_Format(PyExc_KeyError, "no tensor named '%s' in the program's graph", name);
            return -1;
        }
        return 0;
    }
    return tensor_arg(self->graph, o, out, false);
}

/* -1 for "every copy" (None), else the copy's index. */
static int copy_arg(PyObject *o, int *copy)
{
    *copy = -1;
    if (o == Py_None) return 0;
    long c = PyLong_AsLong(o);
    if (c == -1 && PyErr_Occurred()) return -1;
    if (c < 0 || c > INT_MAX) {
        PyErr_Format(error_type(SPMD_ERR_INVALID), "copy %ld is out of range", c);
        return -1;
    }
    *copy = (int)c;
    return 0;
}

/* The array as a C-contiguous, aligned block of the tensor's dtype and
 * shape: a different dtype or shape is refused (naming both), never cast
 * or broadcast; a list or other array-like is converted to the dtype. */
static PyArrayObject *array_for(const spmd_tensor *t, PyObject *o, const char *what)
{
    int num = numpy_type(spmd_tensor_dtype(t));
    if (num < 0) {
        PyErr_Format(error_type(SPMD_ERR_UNSUPPORTED),
                     "%s '%s': dtype %s has no NumPy type", what, tensor_label(t),
                     spmd_dtype_name(spmd_tensor_dtype(t)));
        return NULL;
    }
    if (PyArray_Check(o) && PyArray_TYPE((PyArrayObject *)o) != num) {
        PyArray_Descr *want = PyArray_DescrFromType(num);
        PyErr_Format(error_type(SPMD_ERR_INVALID),
                     "%s '%s': an array of %S for a tensor of %S", what, tensor_label(t),
                     (PyObject *)PyArray_DESCR((PyArrayObject *)o), (PyObject *)want);
        Py_XDECREF(want);
        return NULL;
    }
    PyArrayObject *a = (PyArrayObject *)PyArray_FROM_OTF(o, num, NPY_ARRAY_IN_ARRAY);
    if (!a) return NULL;
    int rank = spmd_tensor_rank(t);
    bool same = PyArray_NDIM(a) == rank;
    for (int i = 0; same && i < rank; i++) same = PyArray_DIM(a, i) == spmd_tensor_dim(t, i);
    if (!same) {
        PyObject *want = tensor_shape_tuple(t);
        PyObject *got = PyObject_GetAttrString((PyObject *)a, "shape");
        if (want && got)
            PyErr_Format(error_type(SPMD_ERR_SHAPE),
                         "%s '%s': an array of shape %R for a tensor of shape %R", what,
                         tensor_label(t), got, want);
        Py_XDECREF(want);
        Py_XDECREF(got);
        Py_DECREF(a);
        return NULL;
    }
    return a;
}

typedef spmd_status (*put_fn)(spmd_program *, const spmd_tensor *, const void *, size_t);
typedef spmd_status (*put_copy_fn)(spmd_program *, int, const spmd_tensor *, const void *, size_t);

static PyObject *program_put(ProgramObject *self, PyObject *args, PyObject *kw, const char *fmt,
                             const char *what, put_fn all, put_copy_fn one)
{
    static char *kwlist[] = {"tensor", "array", "copy", NULL};
    PyObject *t_o, *arr_o, *copy_o = Py_None;
    spmd_tensor *t;
    int copy;
    if (!PyArg_ParseTupleAndKeywords(args, kw, fmt, kwlist, &t_o, &arr_o, &copy_o) ||
        program_tensor(self, t_o, &t) < 0 || copy_arg(copy_o, &copy) < 0)
        return NULL;
    PyArrayObject *a = array_for(t, arr_o, what);
    if (!a) return NULL;
    const void *data = PyArray_DATA(a);
    size_t bytes = (size_t)PyArray_NBYTES(a);
    spmd_status st = copy < 0 ? all(self->p, t, data, bytes) : one(self->p, copy, t, data, bytes);
    Py_DECREF(a);
    RETURN_STATUS(st);
}

static PyObject *program_set_input(ProgramObject *self, PyObject *args, PyObject *kw)
{
    return program_put(self, args, kw, "OO|O:set_input", "set_input", spmd_program_set_input,
                       spmd_program_set_input_copy);
}

static PyObject *program_write(ProgramObject *self, PyObject *args, PyObject *kw)
{
    return program_put(self, args, kw, "OO|O:write", "write", spmd_program_write, spmd_program_write_copy);
}

static PyObject *program_read(ProgramObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"tensor", "copy", NULL};
    PyObject *t_o, *copy_o = Py_None;
    spmd_tensor *t;
    int copy;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:read", kwlist, &t_o, &copy_o) ||
        program_tensor(self, t_o, &t) < 0 || copy_arg(copy_o, &copy) < 0)
        return NULL;
    int num = numpy_type(spmd_tensor_dtype(t)), rank = spmd_tensor_rank(t);
    npy_intp dims[SPMD_MAX_RANK];
    for (int i = 0; i < rank; i++) dims[i] = (npy_intp)spmd_tensor_dim(t, i);
    PyArrayObject *a = num < 0 ? NULL : (PyArrayObject *)PyArray_SimpleNew(rank, dims, num);
    if (!a) return num < 0 ? raise_status(SPMD_ERR_UNSUPPORTED) : NULL;
    size_t bytes = (size_t)PyArray_NBYTES(a);
    spmd_status st = copy < 0 ? spmd_program_read(self->p, t, PyArray_DATA(a), bytes)
                              : spmd_program_read_copy(self->p, copy, t, PyArray_DATA(a), bytes);
    if (check(st) < 0) {
        Py_DECREF(a);
        return NULL;
    }
    return (PyObject *)a;
}

static PyObject *program_run(ProgramObject *self, PyObject *unused)
{
    (void)unused;
    if (program_open(self) < 0) return NULL;
    RETURN_STATUS(spmd_program_run(self->p));
}

static PyObject *program_accumulate(ProgramObject *self, PyObject *unused)
{
    (void)unused;
    if (program_open(self) < 0) return NULL;
    RETURN_STATUS(spmd_program_accumulate(self->p));
}

/* The program's figures, one getter each: which function is the
 * getter's closure. */
static PyObject *program_get_size(ProgramObject *self, void *f)
{
    if (program_open(self) < 0) return NULL;
    return PyLong_FromSize_t(((size_t(*)(const spmd_program *))f)(self->p));
}

static PyObject *program_get_int(ProgramObject *self, void *f)
{
    if (program_open(self) < 0) return NULL;
    return PyLong_FromLong(((int (*)(const spmd_program *))f)(self->p));
}

static PyObject *program_get_graph(ProgramObject *self, void *unused)
{
    (void)unused;
    return Py_NewRef(self->graph);
}

static PyObject *program_get_closed(ProgramObject *self, void *unused)
{
    (void)unused;
    return PyBool_FromLong(self->p == NULL);
}

static PyObject *program_local_devices(ProgramObject *self, PyObject *unused)
{
    (void)unused;
    if (program_open(self) < 0) return NULL;
    int first = 0, n = spmd_program_local_devices(self->p, &first);
    return Py_BuildValue("(ii)", first, n);
}

static PyObject *program_input_rows(ProgramObject *self, PyObject *t_o)
{
    spmd_tensor *t;
    int64_t begin, end;
    if (program_tensor(self, t_o, &t) < 0 || check(spmd_program_input_rows(self->p, t, &begin, &end)) < 0)
        return NULL;
    return Py_BuildValue("(LL)", (long long)begin, (long long)end);
}

/* Every collective of a step, in program order, as the C API gives it. */
static PyObject *program_collectives(ProgramObject *self, PyObject *unused)
{
    (void)unused;
    if (program_open(self) < 0) return NULL;
    int n = spmd_program_collective_count(self->p);
    PyObject *list = PyList_New(n);
    for (int i = 0; list && i < n; i++) {
        spmd_collective_info c;
        if (check(spmd_program_collective(self->p, i, &c)) < 0) {
            Py_CLEAR(list);
            break;
        }
        PyObject *d = Py_BuildValue("{sssssLsdsisssz}", "kind", c.kind, "axes", c.axes, "bytes",
                                    (long long)c.bytes, "seconds", c.seconds, "count", c.count, "phase",
                                    c.phase, "tensor", c.tensor);
        if (!d) Py_CLEAR(list);
        else PyList_SET_ITEM(list, i, d);
    }
    return list;
}

static PyObject *program_fallbacks(ProgramObject *self, PyObject *unused)
{
    (void)unused;
    if (program_open(self) < 0) return NULL;
    int n = spmd_program_fallback_count(self->p);
    PyObject *list = PyList_New(n);
    for (int i = 0; list && i < n; i++) {
        char line[512];
        if (check(spmd_program_fallback(self->p, i, line, sizeof line)) < 0) {
            Py_CLEAR(list);
            break;
        }
        PyObject *s = PyUnicode_DecodeUTF8(line, (Py_ssize_t)strlen(line), "replace");
        if (!s) Py_CLEAR(list);
        else PyList_SET_ITEM(list, i, s);
    }
    return list;
}

static PyObject *program_save(ProgramObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"dir", "step", "meta_json", "keep", "copy", NULL};
    PyObject *dir_o, *copy_o = Py_None;
    long long step = 0;
    const char *meta = NULL;
    int keep = 0, copy;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|Lzi$O:save", kwlist, PyUnicode_FSConverter, &dir_o, &step,
                                     &meta, &keep, &copy_o))
        return NULL;
    if (program_open(self) < 0 || copy_arg(copy_o, &copy) < 0) {
        Py_DECREF(dir_o);
        return NULL;
    }
    const char *dir = PyBytes_AS_STRING(dir_o);
    spmd_status st = copy < 0 ? spmd_checkpoint_save(self->p, dir, step, meta, keep)
                              : spmd_checkpoint_save_copy(self->p, copy, dir, step, meta, keep);
    Py_DECREF(dir_o);
    RETURN_STATUS(st);
}

static PyObject *program_load(ProgramObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"dir", "copy", NULL};
    PyObject *dir_o, *copy_o = Py_None;
    int copy;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O&|$O:load", kwlist, PyUnicode_FSConverter, &dir_o, &copy_o))
        return NULL;
    if (program_open(self) < 0 || copy_arg(copy_o, &copy) < 0) {
        Py_DECREF(dir_o);
        return NULL;
    }
    int64_t step = 0;
    char *meta = NULL;
    const char *dir = PyBytes_AS_STRING(dir_o);
    spmd_status st = copy < 0 ? spmd_checkpoint_load(self->p, dir, &step, &meta)
                              : spmd_checkpoint_load_copy(self->p, copy, dir, &step, &meta);
    Py_DECREF(dir_o);
    if (check(st) < 0) return NULL;
    PyObject *r = Py_BuildValue("(Lz)", (long long)step, meta);
    free(meta); /* the C API's malloc'd copy */
    return r;
}

/* The report `spmd explain` prints, made by the library. */
static PyObject *program_explain_text(ProgramObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"model", "batch", NULL};
    spmd_explain_options o = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$zz:explain_text", kwlist, &o.model, &o.batch) ||
        program_open(self) < 0)
        return NULL;
    char *text;
    if (check(spmd_program_explain(self->p, &o, &text)) < 0) return NULL;
    PyObject *r = PyUnicode_DecodeUTF8(text, (Py_ssize_t)strlen(text), "replace");
    free(text); /* the C API's malloc'd text */
    return r;
}

static PyMethodDef program_methods[] = {
    {"set_input", KW(program_set_input),
     "set_input(t, array, copy=None): fill input t (a Tensor or its name) of every copy, or of one"},
    {"run", FN(program_run), METH_NOARGS,
     "run(): one step (with accumulate_steps K: the step's last micro-batch and the update)"},
    {"accumulate", FN(program_accumulate), METH_NOARGS,
     "accumulate(): with accumulate_steps K, one of a step's first K - 1 micro-batches: forward,\n"
     "backward and the sum into the gradient accumulators, no update"},
    {"read", KW(program_read), "read(t, copy=None) -> a new ndarray of t's value (of copy 0, or of one)"},
    {"write", KW(program_write), "write(t, array, copy=None): overwrite a parameter or state tensor"},
    {"collectives", FN(program_collectives), METH_NOARGS,
     "collectives() -> a dict per collective of a step, in program order"},
    {"fallbacks", FN(program_fallbacks), METH_NOARGS,
     "fallbacks() -> the whole-tensor gathers an op forced, one line each"},
    {"explain_text", KW(program_explain_text),
     "explain_text(*, model=None, batch=None) -> the report `spmd explain` prints, as text: the\n"
     "mesh, every named tensor's sharding, every collective, memory per device, the fallbacks;\n"
     "model names what is planned on its first line (default 'graph'), batch follows it"},
    {"local_devices", FN(program_local_devices), METH_NOARGS,
     "local_devices() -> (first, count) of this process's devices"},
    {"input_rows", FN(program_input_rows), METH_O,
     "input_rows(t) -> (begin, end) of the first dim's rows this process's devices hold"},
    {"save", KW(program_save),
     "save(dir, step=0, meta_json=None, keep=0, *, copy=None): a sharded checkpoint"},
    {"load", KW(program_load), "load(dir, *, copy=None) -> (step, meta_json): load a checkpoint"},
    {"close", FN(program_close), METH_NOARGS, "close(): free the program now"},
    {"__enter__", FN(graph_enter), METH_NOARGS, NULL},
    {"__exit__", FN(program_exit), METH_VARARGS, NULL},
    {NULL}};

static PyGetSetDef program_getset[] = {
    {"graph", GET(program_get_graph), NULL, "the Graph it was compiled from", NULL},
    {"closed", GET(program_get_closed), NULL, "whether close() was called", NULL},
    {"peak_bytes", GET(program_get_size), NULL, "per device: arena plus persistent and input bytes",
     (void *)spmd_program_peak_bytes},
    {"persistent_bytes", GET(program_get_size), NULL, "per device: parameters and state",
     (void *)spmd_program_persistent_bytes},
    {"arena_bytes", GET(program_get_size), NULL, "per device: the transient arena",
     (void *)spmd_program_arena_bytes},
    {"param_bytes", GET(program_get_size), NULL, "per device: the parameters' blocks",
     (void *)spmd_program_param_bytes},
    {"allocated_bytes", GET(program_get_size), NULL, "what this process allocated for its devices",
     (void *)spmd_program_allocated_bytes},
    {"devices", GET(program_get_int), NULL, "devices the program runs on", (void *)spmd_program_devices},
    {"copies", GET(program_get_int), NULL, "copies along independent axes", (void *)spmd_program_copies},
    {"processes", GET(program_get_int), NULL, "processes running it", (void *)spmd_program_processes},
    {"process", GET(program_get_int), NULL, "this process's index", (void *)spmd_program_process},
    {"propagation_unsettled", GET(program_get_int), NULL,
     "0, or the rounds propagation ran without settling", (void *)spmd_program_propagation_unsettled},
    {NULL}};

static PyType_Slot program_slots[] = {
    {Py_tp_doc, "A compiled program (Graph.compile): set inputs, run, read and write."},
    {Py_tp_dealloc, program_dealloc},
    {Py_tp_traverse, program_traverse},
    {Py_tp_clear, program_clear},
    {Py_tp_methods, program_methods},
    {Py_tp_getset, program_getset},
    {0, NULL}};

int program_register(PyObject *mod)
{
    /* Programs come from Graph.compile only; Python subclasses add methods. */
    ProgramType = add_type(mod, "libspmd._core.Program", sizeof(ProgramObject),
                           Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC |
                               Py_TPFLAGS_DISALLOW_INSTANTIATION,
                           program_slots);
    return ProgramType ? 0 : -1;
}
