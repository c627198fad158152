/* The module libspmd._core (core.h): its functions, and the registration
 * of every file's types and functions. */
#define SPMD_PYTHON_IMPORTS_NUMPY /* this file imports NumPy's C API for all */
#include "core.h"

#include <string.h>

static PyObject *mod_visualize(PyObject *mod, PyObject *args, PyObject *kw)
{
    (void)mod;
    static char *kwlist[] = {"mesh", "spec", "shape", NULL};
    PyObject *mesh_o, *spec_o, *shape;
    MeshObject *mesh;
    int rank;
    int64_t dims[SPMD_MAX_RANK];
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO:visualize", kwlist, &mesh_o, &spec_o, &shape) ||
        mesh_arg(mesh_o, &mesh) < 0 || shape_arg(shape, &rank, dims) < 0)
        return NULL;
    PyObject *spec = spec_text(spec_o, mesh->m);
    const char *text = spec ? PyUnicode_AsUTF8(spec) : NULL;
    PyObject *r = NULL;
    /* The picture's size is known only once drawn: grow until it fits. */
    for (size_t size = 4096; text && size <= (16u << 20); size *= 4) {
        char *buf = PyMem_Malloc(size);
        if (!buf) {
            PyErr_NoMemory();
            break;
        }
        int n = spmd_sharding_visualize(mesh->m, text, rank, dims, buf, size);
        if (n < 0) raise_status(SPMD_ERR_INVALID);
        else if ((size_t)n + 1 < size) r = PyUnicode_DecodeUTF8(buf, n, "replace");
        PyMem_Free(buf);
        if (n < 0 || r) break;
    }
    Py_XDECREF(spec);
    return r;
}

static PyObject *mod_lr_schedule(PyObject *mod, PyObject *args, PyObject *kw)
{
    (void)mod;
    static char *kwlist[] = {"step", "warmup", "total", "peak", "floor", NULL};
    int step, warmup, total;
    float peak, floor_lr;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iiiff:lr_schedule", kwlist, &step, &warmup, &total, &peak,
                                     &floor_lr))
        return NULL;
    return PyFloat_FromDouble(spmd_lr_schedule(step, warmup, total, peak, floor_lr));
}

static PyObject *mod_version(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    return PyUnicode_FromString(spmd_version());
}

static PyObject *mod_blas_describe_bf16(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    const char *s = spmd_blas_describe_bf16();
    return s ? PyUnicode_FromString(s) : raise_last();
}

static PyObject *mod_blas_describe(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    const char *s = spmd_blas_describe();
    return s ? PyUnicode_FromString(s) : raise_last();
}

static PyObject *mod_blas_select(PyObject *mod, PyObject *args, PyObject *kw)
{
    (void)mod;
    static char *kwlist[] = {"library", "coretype", NULL};
    const char *library = NULL, *coretype = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|zz:blas_select", kwlist, &library, &coretype)) return NULL;
    RETURN_STATUS(spmd_blas_select(library, coretype));
}

static PyMethodDef module_methods[] = {
    {"ops", FN(op_table), METH_NOARGS,
     "ops() -> the op table: [{name, arity, elementwise, constant, differentiable}, ...]"},
    {"visualize", KW(mod_visualize),
     "visualize(mesh, spec, shape) -> text: which devices hold which block of a 1-D or 2-D tensor"},
    {"lr_schedule", KW(mod_lr_schedule),
     "lr_schedule(step, warmup, total, peak, floor) -> linear warmup then cosine decay"},
    {"version", FN(mod_version), METH_NOARGS, "version() -> the C library's version"},
    {"blas_describe", FN(mod_blas_describe), METH_NOARGS,
     "blas_describe() -> the GEMM library and kernel the runtime loads"},
    {"blas_describe_bf16", FN(mod_blas_describe_bf16), METH_NOARGS,
     "blas_describe_bf16() -> what runs bf16 products (native, or converted to f32 and why)"},
    {"blas_select", KW(mod_blas_select),
     "blas_select(library=None, coretype=None): choose the GEMM library before the first run"},
    {NULL}};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "libspmd._core",
                                        "The CPython binding of libspmd's public C API.", -1, module_methods,
                                        NULL, NULL, NULL, NULL};

PyTypeObject *add_type(PyObject *mod, const char *name, int basicsize, unsigned flags, PyType_Slot *slots)
{
    PyType_Spec spec = {name, basicsize, 0, flags, slots};
    PyTypeObject *t = (PyTypeObject *)PyType_FromSpec(&spec);
    if (!t || PyModule_AddObjectRef(mod, strrchr(name, '.') + 1, (PyObject *)t) < 0) return NULL;
    return t;
}

PyMODINIT_FUNC PyInit__core(void);
PyMODINIT_FUNC PyInit__core(void)
{
    import_array();
    PyObject *mod = PyModule_Create(&module_def);
    if (!mod) return NULL;
    if (errors_register(mod) < 0 || mpi_register(mod) < 0 || mesh_register(mod) < 0 || graph_register(mod) < 0 ||
        tensor_register(mod) < 0 || program_register(mod) < 0 || training_register(mod) < 0) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
