/*
 * libspmd._core: the CPython binding of the public C API (the headers in include/spmd/).
 *
 * Four types, each owning one C handle: Mesh (spmd_mesh), Graph
 * (spmd_graph), Tensor (a node of a Graph) and Program (spmd_program).
 * Nothing here computes or checks what the library computes or checks:
 * every method converts its arguments, calls the C function and turns a
 * failure into a Python exception carrying spmd_last_error() (see
 * errors.c).  What the binding does check is what would otherwise read or
 * write out of bounds or dangle: sequence lengths the C side takes on
 * trust (a perm, axis names, device ids, copy seeds), array shapes and
 * dtypes against the tensor's, a tensor of another graph, a closed handle.
 *
 * Lifetimes: a Tensor and a Program hold a reference to their Graph, and a
 * Graph to every Mesh its marks use (the C API wants the mesh to outlive
 * the graph), so no handle is freed under another.  Graph.close() refuses
 * while a program of it is open; a Program is freed before it lets go of
 * its Graph, even when the cycle collector breaks a cycle through a
 * subclass's __dict__.
 *
 * The GIL is held during every call: the C handles are not thread-safe,
 * and holding it serialises the calls made on them from Python threads.
 *
 * Processes: built with the library's MPI, the module can start MPI
 * itself (mpi_start, as a program that owns MPI does, finalising it when
 * the interpreter exits) and compile a program over MPI_COMM_WORLD
 * (compile(mpi=True)).  libspmd/__init__.py decides when.
 *
 * This header is private to the module's files, one concept each:
 * errors.c, convert.c (arguments), mpi.c, mesh.c, tensor.c, graph.c (its
 * life, queries and marks), builders.c, training.c, compile.c, program.c
 * and module.c (module functions and registration).
 */
#ifndef SPMD_PYTHON_CORE_H
#define SPMD_PYTHON_CORE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Every file sees NumPy's C API through the table module.c imports. */
#define PY_ARRAY_UNIQUE_SYMBOL spmd_python_ARRAY_API
#ifndef SPMD_PYTHON_IMPORTS_NUMPY
#define NO_IMPORT_ARRAY
#endif
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <spmd/checkpoint.h>
#include <spmd/mesh.h>
#include <spmd/models.h>
#include <spmd/spmd.h>
#include <spmd/train.h>

#include <stdbool.h>

/* ---- Object layouts ----------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    spmd_mesh *m;
} MeshObject;

typedef struct {
    PyObject_HEAD
    spmd_graph *g;    /* NULL once closed */
    PyObject *meshes; /* list: every Mesh a mark of g uses, kept alive */
    int programs;     /* open Programs compiled from g */
} GraphObject;

typedef struct {
    PyObject_HEAD
    GraphObject *graph;
    spmd_tensor *t;
} TensorObject;

typedef struct {
    PyObject_HEAD
    GraphObject *graph;
    spmd_program *p; /* NULL once closed */
} ProgramObject;

/* Method tables take one function type each: the cast goes through
 * void (*)(void), which says that the mismatch is meant. */
#define FN(f) (PyCFunction)(void (*)(void))(f)
#define GET(f) (getter)(void (*)(void))(f)
#define SET(f) (setter)(void (*)(void))(f)
#define KW(f) FN(f), METH_VARARGS | METH_KEYWORDS

/* The types, made at registration (each by its file). */
extern PyTypeObject *MeshType, *GraphType, *TensorType, *ProgramType;
extern PyTypeObject *OptimizerTensorsType;

/* ---- Errors (errors.c) --------------------------------------------------- */

/* The class of libspmd.errors for a status (borrowed): the library's
 * failures and the binding's own refusals alike raise it, e.g.
 * error_type(SPMD_ERR_INVALID) for a bad argument. */
PyObject *error_type(spmd_status st);
/* Raise the exception for a failed status, carrying spmd_last_error();
 * returns NULL. */
PyObject *raise_status(spmd_status st);
/* For a NULL handle or tensor: the failure the library just recorded. */
PyObject *raise_last(void);
/* 0 on SPMD_OK, else -1 with the exception set. */
int check(spmd_status st);

#define RETURN_STATUS(call)                  \
    do {                                     \
        if (check(call) < 0) return NULL;    \
        Py_RETURN_NONE;                      \
    } while (0)

/* ---- Argument conversion (convert.c) ------------------------------------- */

int graph_open(GraphObject *g);
int program_open(ProgramObject *p);
/* The tensor's name, else its op's name: for messages. */
const char *tensor_label(const spmd_tensor *t);
/* A Tensor of graph g, or None for NULL when allow_none (the C API then
 * reports the graph's first failure, or that the operand is NULL). */
int tensor_arg(GraphObject *g, PyObject *o, spmd_tensor **out, bool allow_none);
/* A sequence of tensors of g into a new array (PyMem_Free it). */
int tensor_list(GraphObject *g, PyObject *seq, spmd_tensor ***out, int *n);
/* A shape: a sequence of ints (or one int, as NumPy takes), at most
 * SPMD_MAX_RANK of them.  The C side checks the sizes. */
int shape_arg(PyObject *o, int *rank, int64_t dims[SPMD_MAX_RANK]);
PyObject *shape_tuple(int rank, const int64_t *dims);
PyObject *tensor_shape_tuple(const spmd_tensor *t);
/* Reduction axes: an int, a sequence of ints (negative counts from the
 * end, as NumPy's) or None for all, as the C API's bit mask. */
int axes_mask(PyObject *o, int rank, uint32_t *mask);
/* NumPy's type number for a dtype, -1 for one NumPy has no type for. */
int numpy_type(spmd_dtype d);
/* A dtype argument: the library's names ("f32", "i32", "bf16"), or
 * anything numpy.dtype() takes that is float32 or int32. */
int dtype_arg(PyObject *o, spmd_dtype *out);
/* A comma-separated list of mesh axes: a str as it is, a sequence of
 * names joined with ","; None stays NULL.  *keep holds the text. */
int axes_text(PyObject *o, const char **out, PyObject **keep);
/* A partition spec as the C API's text: a str as it is; a tuple or list
 * of entries (PyTorch/XLA's form) joined with ", ".  Returns a new str. */
PyObject *spec_text(PyObject *spec, const spmd_mesh *m);
int mesh_arg(PyObject *o, MeshObject **out);
/* A Python int for argument NAME of WHO, from 0 to max, refused in the
 * words of the tool's flags: "WHO: NAME wants an integer from 0 to MAX,
 * got V" (InvalidError; `zero`, when not NULL, says what 0 means), never
 * wrapped to fit the C type; TypeError for what is not an int. */
int count_arg(const char *who, const char *name, PyObject *o, uint64_t max, const char *zero,
              uint64_t *out);
/* A mesh axis given by name or index. */
int mesh_axis_arg(const spmd_mesh *m, PyObject *o, int *axis);
/* The graph keeps every mesh its marks use alive. */
int graph_keep_mesh(GraphObject *g, MeshObject *m);

/* ---- The files' shared pieces -------------------------------------------- */

/* A new Tensor of g wrapping t; NULL t raises the recorded failure (tensor.c). */
PyObject *wrap_tensor(GraphObject *g, spmd_tensor *t);
/* The mesh of the graph's marks, or None (graph.c). */
PyObject *graph_get_mesh(GraphObject *self, void *unused);
/* `with` support shared by Graph and Program: returns self (graph.c). */
PyObject *graph_enter(PyObject *self, PyObject *unused);
/* The MPI communicator compile(mpi=...) passes: NULL without, else
 * MPI_COMM_WORLD once mpi_start ran; -1 with the exception set when it
 * cannot (mpi.c). */
int mpi_compile_comm(bool over_processes, const void **comm);

/* The Graph's methods, one table per file of their concept, joined into
 * the type's table at registration (graph.c). */
extern PyMethodDef graph_builder_methods[]; /* builders.c */
/* The plain elementwise ops of the op table as methods of type (builders.c),
 * and the table itself: _core.ops() -> [{name, arity, elementwise,
 * constant, differentiable}, ...]. */
int graph_add_table_builders(PyTypeObject *type);
PyObject *op_table(PyObject *mod, PyObject *unused);
extern PyMethodDef graph_training_methods[]; /* training.c */
extern PyMethodDef graph_compile_methods[];  /* compile.c */

/* ---- Registration: each file adds its type or functions to the module ---- */

/* A heap type from its slots, added to mod under the name after the last
 * '.' of `name` (module.c). */
PyTypeObject *add_type(PyObject *mod, const char *name, int basicsize, unsigned flags,
                       PyType_Slot *slots);
int errors_register(PyObject *mod);
int mpi_register(PyObject *mod);
int mesh_register(PyObject *mod);
int tensor_register(PyObject *mod);
int graph_register(PyObject *mod);
int training_register(PyObject *mod);
int program_register(PyObject *mod);

#endif
