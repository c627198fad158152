/*
 * libspmd._core: the CPython binding of the public C API (the headers in include/spmd/).
 *
 * Four types, each owning one C handle: Mesh (spmd_mesh), Graph
 * (spmd_graph), Tensor (a node of a Graph) and Program (spmd_program).
 * Nothing here computes or checks what the library computes or checks:
 * every method converts its arguments, calls the C function and turns a
 * failure into a Python exception carrying spmd_last_error() (see
 * raise_status).  What the binding does check is what would otherwise
 * read or write out of bounds or dangle: sequence lengths the C side takes
 * on trust (a perm, axis names, device ids, copy seeds), array shapes and
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
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <spmd/checkpoint.h>
#include <spmd/mesh.h>
#include <spmd/models.h>
#include <spmd/spmd.h>
#include <spmd/train.h>

#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef SPMD_HAVE_MPI
#include <mpi.h>
#endif

/* ---- Errors ------------------------------------------------------------ */

/* The exception for a status: bad input of any kind is a ValueError (as
 * Python's own functions raise for a value they cannot take), then
 * MemoryError, OSError for files, RuntimeError for the rest (a missing
 * BLAS, a broken invariant).  The exception carries spmd_last_error() and,
 * as `status`, the status's name. */
static PyObject *raise_status(spmd_status st)
{
    PyObject *type;
    switch (st) {
    case SPMD_ERR_INVALID:
    case SPMD_ERR_SHAPE:
    case SPMD_ERR_UNSUPPORTED: type = PyExc_ValueError; break;
    case SPMD_ERR_NOMEM: type = PyExc_MemoryError; break;
    case SPMD_ERR_IO: type = PyExc_OSError; break;
    case SPMD_ERR_TIMEOUT: type = PyExc_TimeoutError; break;
    default: type = PyExc_RuntimeError; break;
    }
    const char *msg = spmd_last_error();
    if (st == SPMD_OK) msg = "libspmd returned no result and recorded no failure";
    else if (!msg[0]) msg = spmd_status_name(st);
    PyObject *text = PyUnicode_DecodeUTF8(msg, (Py_ssize_t)strlen(msg), "replace");
    PyObject *exc = text ? PyObject_CallOneArg(type, text) : NULL;
    Py_XDECREF(text);
    if (!exc) return NULL;
    PyObject *name = PyUnicode_FromString(spmd_status_name(st));
    if (name) PyObject_SetAttrString(exc, "status", name);
    Py_XDECREF(name);
    PyErr_SetObject(type, exc);
    Py_DECREF(exc);
    return NULL;
}

/* For a NULL handle or tensor: the failure the library just recorded. */
static PyObject *raise_last(void) { return raise_status(spmd_last_status()); }

/* 0 on SPMD_OK, else -1 with the exception set. */
static int check(spmd_status st)
{
    if (st == SPMD_OK) return 0;
    raise_status(st);
    return -1;
}

#define RETURN_STATUS(call)                  \
    do {                                     \
        if (check(call) < 0) return NULL;    \
        Py_RETURN_NONE;                      \
    } while (0)

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

static PyTypeObject *MeshType, *GraphType, *TensorType, *ProgramType;
static PyTypeObject *OptimizerTensorsType;

/* ---- Argument conversion ------------------------------------------------- */

static int graph_open(GraphObject *g)
{
    if (g && g->g) return 0;
    PyErr_SetString(PyExc_ValueError, "the graph is closed");
    return -1;
}

static int program_open(ProgramObject *p)
{
    if (p->p) return 0;
    PyErr_SetString(PyExc_ValueError, "the program is closed");
    return -1;
}

static const char *tensor_label(const spmd_tensor *t)
{
    const char *name = spmd_tensor_name(t);
    return name ? name : spmd_tensor_op_name(t);
}

/* A Tensor of graph g, or None for NULL when allow_none (the C API then
 * reports the graph's first failure, or that the operand is NULL). */
static int tensor_arg(GraphObject *g, PyObject *o, spmd_tensor **out, bool allow_none)
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
        PyErr_Format(PyExc_ValueError, "tensor '%s' belongs to another graph",
                     t->graph && t->graph->g ? tensor_label(t->t) : "?");
        return -1;
    }
    *out = t->t;
    return 0;
}

/* A sequence of tensors of g into a new array (PyMem_Free it). */
static int tensor_list(GraphObject *g, PyObject *seq, spmd_tensor ***out, int *n)
{
    *out = NULL;
    *n = 0;
    PyObject *fast = PySequence_Fast(seq, "expected a sequence of Tensors");
    if (!fast) return -1;
    Py_ssize_t len = PySequence_Fast_GET_SIZE(fast);
    if (len > INT_MAX) {
        Py_DECREF(fast);
        PyErr_SetString(PyExc_ValueError, "too many tensors");
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

/* A shape: a sequence of ints (or one int, as NumPy takes), at most
 * SPMD_MAX_RANK of them.  The C side checks the sizes. */
static int shape_arg(PyObject *o, int *rank, int64_t dims[SPMD_MAX_RANK])
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
        PyErr_Format(PyExc_ValueError, "shape of rank %zd: at most %d dimensions", n, SPMD_MAX_RANK);
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

static PyObject *shape_tuple(int rank, const int64_t *dims)
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

static PyObject *tensor_shape_tuple(const spmd_tensor *t)
{
    int64_t dims[SPMD_MAX_RANK];
    int rank = spmd_tensor_rank(t);
    for (int i = 0; i < rank; i++) dims[i] = spmd_tensor_dim(t, i);
    return shape_tuple(rank, dims);
}

/* Reduction axes: an int, a sequence of ints (negative counts from the
 * end, as NumPy's) or None for all, as the C API's bit mask. */
static int axes_mask(PyObject *o, int rank, uint32_t *mask)
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
            PyErr_Format(PyExc_ValueError, "axis %ld is out of range for a tensor of rank %d", given, rank);
            return -1;
        }
        *mask |= 1u << a;
    }
    Py_DECREF(seq);
    return 0;
}

/* NumPy's type number for a dtype, -1 for one NumPy has no type for. */
static int numpy_type(spmd_dtype d)
{
    switch (d) {
    case SPMD_F32: return NPY_FLOAT32;
    case SPMD_I32: return NPY_INT32;
    default: return -1;
    }
}

/* A dtype argument: the library's names ("f32", "i32", "bf16"), or
 * anything numpy.dtype() takes that is float32 or int32. */
static int dtype_arg(PyObject *o, spmd_dtype *out)
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
        PyErr_Format(PyExc_ValueError, "dtype %R: libspmd tensors are float32 or int32", o);
        return -1;
    }
    return 0;
}

/* A comma-separated list of mesh axes: a str as it is, a sequence of
 * names joined with ","; None stays NULL.  *keep holds the text. */
static int axes_text(PyObject *o, const char **out, PyObject **keep)
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
            PyErr_Format(PyExc_ValueError, "mesh axis index %ld is out of range for a mesh of rank %d",
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

/* A partition spec as the C API's text: a str as it is; a tuple or list
 * of entries (PyTorch/XLA's form) joined with ", ".  Returns a new str. */
static PyObject *spec_text(PyObject *spec, const spmd_mesh *m)
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

static int mesh_arg(PyObject *o, MeshObject **out)
{
    if (!PyObject_TypeCheck(o, MeshType)) {
        PyErr_Format(PyExc_TypeError, "expected a libspmd Mesh, got %s", Py_TYPE(o)->tp_name);
        return -1;
    }
    *out = (MeshObject *)o;
    return 0;
}

/* A mesh axis given by name or index. */
static int mesh_axis_arg(const spmd_mesh *m, PyObject *o, int *axis)
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
        PyErr_Format(PyExc_ValueError, "mesh axis %ld is out of range for a mesh of rank %d", a,
                     spmd_mesh_rank(m));
        return -1;
    }
    *axis = (int)a;
    return 0;
}

/* The graph keeps every mesh its marks use alive. */
static int graph_keep_mesh(GraphObject *g, MeshObject *m)
{
    int has = PySequence_Contains(g->meshes, (PyObject *)m);
    if (has < 0) return -1;
    return has ? 0 : PyList_Append(g->meshes, (PyObject *)m);
}

/* ---- Processes (MPI) ------------------------------------------------------ */

#define NO_MPI                                                                                     \
    "this libspmd was built without MPI (install libopenmpi-dev and rebuild: CMake builds the "   \
    "MPI transport when it finds MPI)"

#ifdef SPMD_HAVE_MPI
/* What mpi_start found: the processes of MPI_COMM_WORLD, this one's rank,
 * and how many of them share this host (they share its cores). */
static struct {
    bool started; /* MPI is initialised with MPI_THREAD_MULTIPLE */
    bool owned;   /* this module initialised it, so it finalises it */
    int size, rank, here;
} mpi = {.size = 1, .here = 1};

/* Run by Py_FinalizeEx after the modules are torn down, so the programs
 * (and their communicators) are gone first. */
static void mpi_end(void)
{
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (mpi.owned && !finalized) MPI_Finalize();
}

static const char *mpi_level_name(int level)
{
    switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    default: return "MPI_THREAD_MULTIPLE";
    }
}
#endif

static PyObject *mod_mpi_start(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
#ifdef SPMD_HAVE_MPI
    if (!mpi.started) {
        int initialized = 0, finalized = 0, level = MPI_THREAD_SINGLE;
        MPI_Initialized(&initialized);
        MPI_Finalized(&finalized);
        if (finalized) {
            PyErr_SetString(PyExc_RuntimeError, "mpi_start: MPI is already finalized");
            return NULL;
        }
        if (!initialized) {
            if (MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &level) != MPI_SUCCESS) {
                PyErr_SetString(PyExc_RuntimeError, "mpi_start: MPI_Init_thread failed");
                return NULL;
            }
            mpi.owned = true;
            if (Py_AtExit(mpi_end) < 0) {
                PyErr_SetString(PyExc_RuntimeError, "mpi_start: cannot register MPI_Finalize at exit");
                return NULL;
            }
        } else {
            MPI_Query_thread(&level); /* started by another package (mpi4py) */
        }
        if (level != MPI_THREAD_MULTIPLE) {
            PyErr_Format(PyExc_RuntimeError,
                         "mpi_start: MPI runs with %s, but the device threads call MPI at the same "
                         "time: MPI_THREAD_MULTIPLE is needed",
                         mpi_level_name(level));
            return NULL;
        }
        MPI_Comm_size(MPI_COMM_WORLD, &mpi.size);
        MPI_Comm_rank(MPI_COMM_WORLD, &mpi.rank);
        MPI_Comm host;
        if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, mpi.rank, MPI_INFO_NULL, &host) ==
            MPI_SUCCESS) {
            MPI_Comm_size(host, &mpi.here);
            MPI_Comm_free(&host);
        }
        mpi.started = true;
    }
    return Py_BuildValue("(iii)", mpi.size, mpi.rank, mpi.here);
#else
    PyErr_SetString(PyExc_ValueError, NO_MPI);
    return NULL;
#endif
}

static PyObject *mod_mpi_abort(PyObject *mod, PyObject *code_o)
{
    (void)mod;
    long code = PyLong_AsLong(code_o);
    if (code == -1 && PyErr_Occurred()) return NULL;
#ifdef SPMD_HAVE_MPI
    if (mpi.started) {
        fflush(stdout);
        fflush(stderr);
        /* Open MPI 5's launcher may drop what was written just before an
         * MPI_Abort (the traceback): a moment for mpirun to read it, as
         * the spmd tool gives (tools/processes.c). */
        struct timespec moment = {0, 200 * 1000 * 1000};
        nanosleep(&moment, NULL);
        MPI_Abort(MPI_COMM_WORLD, (int)code);
    }
#endif
    Py_RETURN_NONE;
}

/* ---- Mesh ----------------------------------------------------------------- */

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
            PyErr_SetString(PyExc_ValueError, "device_ids need the shape as a tuple, not text");
            return NULL;
        }
        const char *axes;
        PyObject *keep;
        if (axes_text(names, &axes, &keep) < 0) return NULL;
        m = spmd_mesh_parse(PyUnicode_AsUTF8(shape), axes);
        Py_XDECREF(keep);
    } else {
        if (names == Py_None) {
            PyErr_SetString(PyExc_ValueError, "a mesh needs axis names (one per dimension)");
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
            PyErr_Format(PyExc_ValueError, "a mesh of rank %zd needs %zd axis names, got %zd", rank, rank,
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
                PyErr_Format(PyExc_ValueError, "device_ids: %zd ids for a mesh of %lld devices",
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

/* ---- Tensor ----------------------------------------------------------------- */

static PyObject *wrap_tensor(GraphObject *g, spmd_tensor *t)
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
    PyErr_SetString(PyExc_ValueError, "the tensor's graph is closed");
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
    PyErr_SetString(PyExc_RuntimeError, "text longer than 1 MiB");
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
    {"is_param", GET(tensor_get_is_param), NULL, "whether it is a trained parameter", NULL},
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

/* ---- Graph: leaves and the builder table ---------------------------------------- */

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
        PyErr_Format(PyExc_RuntimeError, "the graph has %d open program%s: close them first",
                     self->programs, self->programs == 1 ? "" : "s");
        return NULL;
    }
    spmd_graph_free(self->g);
    self->g = NULL;
    Py_RETURN_NONE;
}

static PyObject *graph_enter(PyObject *self, PyObject *unused)
{
    (void)unused;
    return Py_NewRef(self);
}

static PyObject *graph_exit(GraphObject *self, PyObject *args)
{
    (void)args;
    return graph_close(self, NULL);
}

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
        PyErr_Format(PyExc_ValueError, "init %R: one of 'zeros', 'ones', 'normal', 'uniform'", o);
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

/* ---- Graph: builders with other arguments ------------------------------------------- */

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
        PyErr_Format(PyExc_ValueError, "permute: %d entries for a tensor of rank %d", rank,
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

/* ---- Graph: queries, marks, autodiff, training layer ------------------------------------ */

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

static PyObject *graph_get_mesh(GraphObject *self, void *unused)
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

static PyObject *wrap_or_none(GraphObject *g, spmd_tensor *t)
{
    if (!t) Py_RETURN_NONE;
    return wrap_tensor(g, t);
}

static int optimizer_kind_arg(const char *kind, spmd_optimizer_kind *out)
{
    if (!strcmp(kind, "adamw")) *out = SPMD_OPTIMIZER_ADAMW;
    else if (!strcmp(kind, "adam")) *out = SPMD_OPTIMIZER_ADAM;
    else if (!strcmp(kind, "sgd")) *out = SPMD_OPTIMIZER_SGD;
    else {
        PyErr_Format(PyExc_ValueError, "optimizer kind '%s': 'adamw', 'adam' or 'sgd'", kind);
        return -1;
    }
    return 0;
}

/* Betas and eps left out (None) are 0, the C API's "default"; given ones
 * go through as they are, so SGD refuses them with its own message. */
static int betas_eps_args(PyObject *betas, PyObject *eps_o, float *beta1, float *beta2, float *eps)
{
    if (betas && betas != Py_None) {
        PyObject *pair = PySequence_Tuple(betas);
        int ok = pair && PyArg_ParseTuple(pair, "ff;betas is a pair of floats", beta1, beta2);
        Py_XDECREF(pair);
        if (!ok) return -1;
    }
    if (eps_o && eps_o != Py_None) {
        *eps = (float)PyFloat_AsDouble(eps_o);
        if (PyErr_Occurred()) return -1;
    }
    return 0;
}

/* shard_state=: None (the default, ZeRO on), True or False. */
static int zero_arg(PyObject *o, spmd_zero *zero)
{
    if (o == Py_None) {
        *zero = SPMD_ZERO_DEFAULT;
        return 0;
    }
    int on = PyObject_IsTrue(o);
    if (on < 0) return -1;
    *zero = on ? SPMD_ZERO_ON : SPMD_ZERO_OFF;
    return 0;
}

static PyObject *graph_optimizer_apply(GraphObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"kind",      "momentum",    "weight_decay",       "betas",
                             "eps",       "clip_norm",   "shard_state",        "weight_decay_input",
                             "accumulate_steps", NULL};
    const char *kind = "adamw";
    PyObject *betas = Py_None, *eps_o = Py_None;
    spmd_optimizer opt = {0};
    PyObject *shard = Py_None;
    int wd_input = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|s$ffOOfOpi:optimizer_apply", kwlist, &kind, &opt.momentum,
                                     &opt.weight_decay, &betas, &eps_o, &opt.clip_norm, &shard, &wd_input,
                                     &opt.accumulate_steps) ||
        graph_open(self) < 0 || optimizer_kind_arg(kind, &opt.kind) < 0 ||
        betas_eps_args(betas, eps_o, &opt.beta1, &opt.beta2, &opt.eps) < 0 ||
        zero_arg(shard, &opt.zero) < 0)
        return NULL;
    opt.weight_decay_input = wd_input;
    spmd_optimizer_tensors out = {0};
    if (check(spmd_optimizer_apply(self->g, &opt, &out)) < 0) return NULL;
    PyObject *r = PyStructSequence_New(OptimizerTensorsType);
    if (!r) return NULL;
    spmd_tensor *fields[] = {out.lr, out.grad_norm, out.weight_decay};
    for (int i = 0; i < 3; i++) {
        PyObject *t = wrap_or_none(self, fields[i]);
        if (!t) {
            Py_DECREF(r);
            return NULL;
        }
        PyStructSequence_SetItem(r, i, t);
    }
    return r;
}

/* One group's dict ({params: [names], weight_decay, momentum, betas, eps})
 * into `gr`; the names' UTF-8 stays valid while `keep` (a new list of the
 * name strings) lives. */
static int optimizer_group_arg(PyObject *d, int index, spmd_optimizer_group *gr, const char ***names,
                               PyObject **keep)
{
    *names = NULL;
    *keep = NULL;
    if (!PyDict_Check(d)) {
        PyErr_Format(PyExc_TypeError, "groups[%d]: expected a dict, got %s", index, Py_TYPE(d)->tp_name);
        return -1;
    }
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(d, &pos, &key, &value)) {
        const char *k = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
        if (!k || (strcmp(k, "params") && strcmp(k, "weight_decay") && strcmp(k, "momentum") &&
                   strcmp(k, "betas") && strcmp(k, "eps"))) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError,
                             "groups[%d]: key %R is not one of params, weight_decay, momentum, betas, eps",
                             index, key);
            return -1;
        }
    }
    PyObject *params = PyDict_GetItemString(d, "params"); /* borrowed */
    if (!params) {
        PyErr_Format(PyExc_ValueError, "groups[%d] has no 'params' (a list of parameter names)", index);
        return -1;
    }
    *keep = PySequence_List(params);
    if (!*keep) return -1;
    Py_ssize_t n = PyList_GET_SIZE(*keep);
    if (n > INT_MAX) {
        PyErr_Format(PyExc_ValueError, "groups[%d]: too many parameters", index);
        return -1;
    }
    *names = PyMem_Calloc((size_t)(n ? n : 1), sizeof **names);
    if (!*names) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *s = PyList_GET_ITEM(*keep, i);
        (*names)[i] = PyUnicode_Check(s) ? PyUnicode_AsUTF8(s) : NULL;
        if (!(*names)[i]) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_TypeError, "groups[%d]: parameter %zd is a %s, not a name", index, i,
                             Py_TYPE(s)->tp_name);
            return -1;
        }
    }
    *gr = (spmd_optimizer_group){.params = *names, .n_params = (int)n};
    float *floats[] = {&gr->weight_decay, &gr->momentum};
    const char *float_keys[] = {"weight_decay", "momentum"};
    for (int i = 0; i < 2; i++) {
        PyObject *v = PyDict_GetItemString(d, float_keys[i]);
        if (v && v != Py_None) {
            *floats[i] = (float)PyFloat_AsDouble(v);
            if (PyErr_Occurred()) return -1;
        }
    }
    return betas_eps_args(PyDict_GetItemString(d, "betas"), PyDict_GetItemString(d, "eps"), &gr->beta1,
                          &gr->beta2, &gr->eps);
}

static PyObject *graph_optimizer_apply_groups(GraphObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"kind", "groups", "clip_norm", "shard_state", "accumulate_steps", NULL};
    const char *kind = "adamw";
    PyObject *groups_o;
    spmd_optimizer opt = {0};
    PyObject *shard = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sO|$fOi:optimizer_apply_groups", kwlist, &kind, &groups_o,
                                     &opt.clip_norm, &shard, &opt.accumulate_steps) ||
        graph_open(self) < 0 || optimizer_kind_arg(kind, &opt.kind) < 0 || zero_arg(shard, &opt.zero) < 0)
        return NULL;
    PyObject *groups = PySequence_Tuple(groups_o);
    if (!groups) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(groups);
    if (n < 1 || n > INT_MAX) {
        Py_DECREF(groups);
        PyErr_SetString(PyExc_ValueError, "optimizer_apply_groups: groups must hold at least one group");
        return NULL;
    }
    spmd_optimizer_group *gr = PyMem_Calloc((size_t)n, sizeof *gr);
    const char ***names = PyMem_Calloc((size_t)n, sizeof *names);
    PyObject **keep = PyMem_Calloc((size_t)n, sizeof *keep);
    spmd_tensor **lrs = PyMem_Calloc((size_t)n, sizeof *lrs);
    PyObject *r = NULL;
    if (!gr || !names || !keep || !lrs) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (optimizer_group_arg(PyTuple_GET_ITEM(groups, i), (int)i, &gr[i], &names[i], &keep[i]) < 0) goto done;
    if (check(spmd_optimizer_apply_groups(self->g, &opt, gr, (int)n, NULL, lrs)) < 0) goto done;
    r = PyList_New(n);
    for (Py_ssize_t i = 0; r && i < n; i++) {
        PyObject *t = wrap_tensor(self, lrs[i]);
        if (!t) Py_CLEAR(r);
        else PyList_SET_ITEM(r, i, t);
    }
done:
    for (Py_ssize_t i = 0; names && keep && i < n; i++) {
        PyMem_Free(names[i]);
        Py_XDECREF(keep[i]);
    }
    PyMem_Free(gr);
    PyMem_Free(names);
    PyMem_Free(keep);
    PyMem_Free(lrs);
    Py_DECREF(groups);
    return r;
}

static PyObject *graph_sgd(GraphObject *self, PyObject *lr_o)
{
    spmd_tensor *lr;
    if (tensor_arg(self, lr_o, &lr, true) < 0) return NULL;
    RETURN_STATUS(spmd_sgd(self->g, lr));
}

typedef spmd_status (*batch_fn)(spmd_graph *, const spmd_mesh *, const char *, spmd_tensor *const *, int,
                                const char *);

static spmd_status shard_batch_as_wrap(spmd_graph *g, const spmd_mesh *m, const char *axis,
                                       spmd_tensor *const *inputs, int n, const char *data_axes)
{
    (void)axis;
    return spmd_shard_batch(g, m, inputs, n, data_axes);
}

/* fsdp_wrap(mesh, axis="fsdp", inputs=(), data_axes=None) and
 * shard_batch(mesh, inputs, data_axes=None). */
static PyObject *graph_batch_marks(GraphObject *self, PyObject *mesh_o, const char *axis, PyObject *inputs_o,
                                   PyObject *data_o, batch_fn f)
{
    MeshObject *mesh;
    spmd_tensor **inputs = NULL;
    int n = 0;
    const char *data;
    PyObject *keep;
    if (graph_open(self) < 0 || mesh_arg(mesh_o, &mesh) < 0 || tensor_list(self, inputs_o, &inputs, &n) < 0)
        return NULL;
    if (axes_text(data_o, &data, &keep) < 0) {
        PyMem_Free(inputs);
        return NULL;
    }
    spmd_status st = f(self->g, mesh->m, axis, inputs, n, data);
    PyMem_Free(inputs);
    Py_XDECREF(keep);
    if (check(st) < 0 || graph_keep_mesh(self, mesh) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *graph_fsdp_wrap(GraphObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"mesh", "axis", "inputs", "data_axes", NULL};
    PyObject *mesh, *inputs = NULL, *data = Py_None;
    const char *axis = "fsdp";
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|sOO:fsdp_wrap", kwlist, &mesh, &axis, &inputs, &data))
        return NULL;
    PyObject *none = inputs ? NULL : PyTuple_New(0);
    PyObject *r = graph_batch_marks(self, mesh, axis, inputs ? inputs : none, data, spmd_fsdp_wrap);
    Py_XDECREF(none);
    return r;
}

static PyObject *graph_shard_batch(GraphObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"mesh", "inputs", "data_axes", NULL};
    PyObject *mesh, *inputs, *data = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|O:shard_batch", kwlist, &mesh, &inputs, &data)) return NULL;
    return graph_batch_marks(self, mesh, NULL, inputs, data, shard_batch_as_wrap);
}

/* The ready-made models of spmd/models.h, for comparisons with a model
 * built here: each returns a dict of its tensors. */
static PyObject *graph_mlp(GraphObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"in_dim", "hidden", "layers", "out_dim", "batch", "x", "loss", NULL};
    spmd_mlp_config cfg;
    int batch = 0;
    PyObject *x_o = Py_None;
    const char *loss = NULL;
    spmd_tensor *x;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iiii|i$Oz:mlp", kwlist, &cfg.in_dim, &cfg.hidden, &cfg.layers,
                                     &cfg.out_dim, &batch, &x_o, &loss) ||
        tensor_arg(self, x_o, &x, true) < 0)
        return NULL;
    spmd_mlp_tensors t;
    if (check(spmd_mlp_build(self->g, &cfg, x, batch, &t)) < 0) return NULL;
    if (loss) {
        spmd_mlp_loss_kind k;
        if (!strcmp(loss, "mse")) k = SPMD_MLP_MSE;
        else if (!strcmp(loss, "cross_entropy")) k = SPMD_MLP_CROSS_ENTROPY;
        else {
            PyErr_Format(PyExc_ValueError, "mlp loss '%s': 'mse' or 'cross_entropy'", loss);
            return NULL;
        }
        if (check(spmd_mlp_add_loss(self->g, k, &t)) < 0) return NULL;
    }
    PyObject *in = wrap_or_none(self, t.input), *out = wrap_or_none(self, t.output),
             *tg = wrap_or_none(self, t.targets), *ls = wrap_or_none(self, t.loss);
    PyObject *d = in && out && tg && ls
                      ? Py_BuildValue("{sOsOsOsO}", "input", in, "output", out, "targets", tg, "loss", ls)
                      : NULL;
    Py_XDECREF(in);
    Py_XDECREF(out);
    Py_XDECREF(tg);
    Py_XDECREF(ls);
    return d;
}

static PyObject *graph_gpt(GraphObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"vocab", "seq", "layers", "heads", "dim", "batch", "context", NULL};
    spmd_gpt_config cfg = {0};
    int batch;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iiiiii|i:gpt", kwlist, &cfg.vocab, &cfg.seq, &cfg.layers,
                                     &cfg.heads, &cfg.dim, &batch, &cfg.context) ||
        graph_open(self) < 0)
        return NULL;
    spmd_gpt_tensors t;
    if (check(spmd_gpt_build(self->g, &cfg, batch, &t)) < 0) return NULL;
    PyObject *o[4] = {wrap_tensor(self, t.input), wrap_tensor(self, t.targets), wrap_tensor(self, t.logits),
                      wrap_tensor(self, t.loss)};
    PyObject *d = o[0] && o[1] && o[2] && o[3] ? Py_BuildValue("{sOsOsOsO}", "input", o[0], "targets", o[1],
                                                               "logits", o[2], "loss", o[3])
                                               : NULL;
    for (int i = 0; i < 4; i++) Py_XDECREF(o[i]);
    return d;
}

/* ---- Graph: compile ------------------------------------------------------------------- */

static PyObject *graph_compile(GraphObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"seed", "threads", "plan_only", "unfused", "copy_seeds", "mpi",
                             "collective_timeout", "overlap", "inflight_bytes", NULL};
    unsigned long long seed = 0;
    int threads = 0, plan_only = 0, unfused = 0, over_processes = 0, overlap = 0;
    double collective_timeout = 0;
    Py_ssize_t inflight_bytes = 0;
    PyObject *seeds_o = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$KippOpdpn:compile", kwlist, &seed, &threads, &plan_only,
                                     &unfused, &seeds_o, &over_processes, &collective_timeout, &overlap,
                                     &inflight_bytes) ||
        graph_open(self) < 0)
        return NULL;
    if (inflight_bytes < 0) {
        PyErr_SetString(PyExc_ValueError, "compile: inflight_bytes must be 0 (the default) or more");
        return NULL;
    }
    /* Over processes: MPI_COMM_WORLD, which the world duplicates at compile. */
    const void *comm = NULL;
#ifdef SPMD_HAVE_MPI
    MPI_Comm world = MPI_COMM_WORLD;
    if (over_processes) {
        if (!mpi.started) {
            PyErr_SetString(PyExc_ValueError, "compile(mpi=True): MPI is not started (mpi_start() first)");
            return NULL;
        }
        comm = &world;
    }
#else
    if (over_processes) {
        PyErr_SetString(PyExc_ValueError, NO_MPI);
        return NULL;
    }
#endif
    /* The program's type: a subclass's _program_class (libspmd.Program
     * adds explain() in Python), else the core type. */
    PyObject *cls = PyObject_GetAttrString((PyObject *)Py_TYPE(self), "_program_class");
    if (!cls) {
        PyErr_Clear();
        cls = Py_NewRef((PyObject *)ProgramType);
    }
    if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, ProgramType)) {
        Py_DECREF(cls);
        PyErr_SetString(PyExc_TypeError, "_program_class must be a subclass of libspmd._core.Program");
        return NULL;
    }
    uint64_t *seeds = NULL;
    if (seeds_o != Py_None) {
        /* The C side reads one seed per copy of the marks' mesh. */
        PyObject *mesh = graph_get_mesh(self, NULL);
        int copies = mesh && mesh != Py_None ? spmd_mesh_copies(((MeshObject *)mesh)->m) : 1;
        Py_XDECREF(mesh);
        PyObject *tuple = PySequence_Tuple(seeds_o);
        if (tuple && PyTuple_GET_SIZE(tuple) != copies)
            PyErr_Format(PyExc_ValueError, "copy_seeds: %zd seeds for %d copies", PyTuple_GET_SIZE(tuple),
                         copies);
        seeds = tuple && !PyErr_Occurred() ? PyMem_Calloc((size_t)copies, sizeof *seeds) : NULL;
        for (int i = 0; seeds && i < copies; i++) {
            seeds[i] = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(tuple, i));
            if (PyErr_Occurred()) {
                PyMem_Free(seeds);
                seeds = NULL;
            }
        }
        Py_XDECREF(tuple);
        if (!seeds) {
            Py_DECREF(cls);
            if (!PyErr_Occurred()) PyErr_NoMemory();
            return NULL;
        }
    }
    spmd_compile_options opts = {.threads = threads, .seed = seed, .plan_only = plan_only,
                                 .copy_seeds = seeds, .unfused = unfused, .mpi_comm = comm,
                                 .collective_timeout_s = collective_timeout, .overlap = overlap,
                                 .inflight_bytes = (size_t)inflight_bytes};
    spmd_program *p = spmd_compile(self->g, &opts);
    PyMem_Free(seeds);
    if (!p) {
        Py_DECREF(cls);
        return raise_last();
    }
    ProgramObject *prog = (ProgramObject *)((PyTypeObject *)cls)->tp_alloc((PyTypeObject *)cls, 0);
    Py_DECREF(cls);
    if (!prog) {
        spmd_program_free(p);
        return NULL;
    }
    prog->graph = (GraphObject *)Py_NewRef(self);
    prog->p = p;
    self->programs++;
    return (PyObject *)prog;
}

#define UNARY_METHOD(name, doc) {#name, FN(g_##name), METH_O, doc},
#define NARY_METHOD(name, doc) {#name, (PyCFunction)(void (*)(void))g_##name, METH_FASTCALL, doc},

static PyMethodDef graph_methods[] = {
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
    {"find", FN(graph_find), METH_O, "find(name) -> the Tensor of that name, or None"},
    {"tensors", FN(graph_tensors), METH_NOARGS, "tensors() -> every Tensor, in creation order"},
    {"params", FN(graph_params), METH_NOARGS, "params() -> the parameters, in creation order"},
    {"check", FN(graph_check), METH_NOARGS,
     "check(): raise the first failure of a builder on this graph, if any"},
    {"mark_output", FN(graph_mark_output), METH_O, "mark_output(t): keep t readable after a run"},
    {"set_update", KW(graph_set_update), "set_update(target, value): copy value into target after each run"},
    {"mark_sharding", KW(graph_mark_sharding),
     "mark_sharding(t, mesh, spec): spec as text \"(replica, fsdp), None\" or a tuple\n"
     "(('replica', 'fsdp'), None); entries an axis name or index, a tuple of them, or None"},
    {"clear_sharding", FN(graph_clear_sharding), METH_O, "clear_sharding(t): drop t's mark"},
    {"grad", KW(graph_grad),
     "grad(loss, checkpoints=None): append the backward pass (recomputing between checkpoints)"},
    {"optimizer_apply", KW(graph_optimizer_apply),
     "optimizer_apply(kind='adamw' (or 'adam', 'sgd'), *, momentum=0, weight_decay=0, betas=None, eps=None,\n"
     "clip_norm=0, shard_state=None, weight_decay_input=False, accumulate_steps=0)\n"
     "-> (lr, grad_norm, weight_decay); shard_state None or True: ZeRO (the default), False: off"},
    {"optimizer_apply_groups", KW(graph_optimizer_apply_groups),
     "optimizer_apply_groups(kind, groups, *, clip_norm=0, shard_state=None, accumulate_steps=0)\n"
     "-> each group's lr input:\n"
     "groups a list of dicts {params: [names], weight_decay, momentum, betas, eps}; group i's lr is\n"
     "the input 'lr' (i = 0) or 'lr.<i>'; shard_state None or True: ZeRO (the default), False: off"},
    {"sgd", FN(graph_sgd), METH_O, "sgd(lr): plain SGD with lr an f32 scalar input"},
    {"fsdp_wrap", KW(graph_fsdp_wrap),
     "fsdp_wrap(mesh, axis='fsdp', inputs=(), data_axes=None): FSDPv2's marks"},
    {"shard_batch", KW(graph_shard_batch), "shard_batch(mesh, inputs, data_axes=None): split the batch dim"},
    {"mlp", KW(graph_mlp),
     "mlp(in_dim, hidden, layers, out_dim, batch=0, *, x=None, loss=None) -> dict of tensors\n"
     "(spmd_mlp_build; loss 'mse' or 'cross_entropy' adds the targets and the loss)"},
    {"gpt", KW(graph_gpt), "gpt(vocab, seq, layers, heads, dim, batch, context=0) -> dict of tensors"},
    {"compile", KW(graph_compile),
     "compile(*, seed=0, threads=0, plan_only=False, unfused=False, copy_seeds=None, mpi=False, "
     "collective_timeout=0, overlap=False, inflight_bytes=0) -> Program; "
     "mpi=True: over the processes of MPI_COMM_WORLD (mpi_start), each running its run of devices; "
     "collective_timeout: seconds a device may wait in a collective without progress before its "
     "run raises TimeoutError (0: the default, 100; negative: never); "
     "overlap=True: collectives in flight on each device's communication thread while it computes (the same bits), "
     "their operands and results at most inflight_bytes at once (0: the default, 64 MiB)"},
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
    {Py_tp_methods, graph_methods},
    {Py_tp_getset, graph_getset},
    {Py_sq_length, graph_len},
    {0, NULL}};

/* ---- Program ------------------------------------------------------------------------ */

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
        PyErr_Format(PyExc_ValueError, "copy %ld is out of range", c);
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
        PyErr_Format(PyExc_ValueError, "%s '%s': dtype %s has no NumPy type", what, tensor_label(t),
                     spmd_dtype_name(spmd_tensor_dtype(t)));
        return NULL;
    }
    if (PyArray_Check(o) && PyArray_TYPE((PyArrayObject *)o) != num) {
        PyArray_Descr *want = PyArray_DescrFromType(num);
        PyErr_Format(PyExc_ValueError, "%s '%s': an array of %S for a tensor of %S", what, tensor_label(t),
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
            PyErr_Format(PyExc_ValueError, "%s '%s': an array of shape %R for a tensor of shape %R", what,
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

/* ---- Module functions ----------------------------------------------------------------- */

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
    {"visualize", KW(mod_visualize),
     "visualize(mesh, spec, shape) -> text: which devices hold which block of a 1-D or 2-D tensor"},
    {"lr_schedule", KW(mod_lr_schedule),
     "lr_schedule(step, warmup, total, peak, floor) -> linear warmup then cosine decay"},
    {"blas_describe", FN(mod_blas_describe), METH_NOARGS,
     "blas_describe() -> the GEMM library and kernel the runtime loads"},
    {"blas_select", KW(mod_blas_select),
     "blas_select(library=None, coretype=None): choose the GEMM library before the first run"},
    {"mpi_start", FN(mod_mpi_start), METH_NOARGS,
     "mpi_start() -> (processes, rank, processes on this host): initialise MPI (MPI_THREAD_MULTIPLE) "
     "unless it is, finalising it at exit if it was not; ValueError when built without MPI"},
    {"mpi_abort", FN(mod_mpi_abort), METH_O,
     "mpi_abort(code): end every process of the job (MPI_Abort); nothing before mpi_start"},
    {NULL}};

static PyStructSequence_Field optimizer_fields[] = {
    {"lr", "the f32 scalar input 'lr', fed each step"},
    {"grad_norm", "the global gradient norm before clipping, an output"},
    {"weight_decay", "the input 'weight_decay' (weight_decay_input), else None"},
    {NULL, NULL}};

static PyStructSequence_Desc optimizer_desc = {"libspmd._core.OptimizerTensors",
                                               "The tensors optimizer_apply adds.", optimizer_fields, 3};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "libspmd._core",
                                        "The CPython binding of libspmd's public C API.", -1, module_methods,
                                        NULL, NULL, NULL, NULL};

static PyTypeObject *add_type(PyObject *mod, const char *name, int basicsize, unsigned flags,
                              PyType_Slot *slots)
{
    PyType_Spec spec = {name, basicsize, 0, flags, slots};
    PyTypeObject *t = (PyTypeObject *)PyType_FromSpec(&spec);
    if (!t || PyModule_AddObjectRef(mod, strrchr(name, '.') + 1, (PyObject *)t) < 0) return NULL;
    return t;
}

#ifdef SPMD_HAVE_MPI
static const bool mpi_built = true;
#else
static const bool mpi_built = false;
#endif

PyMODINIT_FUNC PyInit__core(void);
PyMODINIT_FUNC PyInit__core(void)
{
    import_array();
    PyObject *mod = PyModule_Create(&module_def);
    if (!mod) return NULL;
    unsigned base = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE;
    MeshType = add_type(mod, "libspmd._core.Mesh", sizeof(MeshObject), base, mesh_slots);
    GraphType = add_type(mod, "libspmd._core.Graph", sizeof(GraphObject), base | Py_TPFLAGS_HAVE_GC,
                         graph_slots);
    /* Tensors are made by the builders only (no tp_new), and not
     * subclassed: each wraps one node. */
    TensorType = add_type(mod, "libspmd._core.Tensor", sizeof(TensorObject),
                          Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_DISALLOW_INSTANTIATION,
                          tensor_slots);
    /* Programs come from Graph.compile only; Python subclasses add methods. */
    ProgramType = add_type(mod, "libspmd._core.Program", sizeof(ProgramObject),
                           base | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_DISALLOW_INSTANTIATION, program_slots);
    OptimizerTensorsType = PyStructSequence_NewType(&optimizer_desc);
    if (!MeshType || !GraphType || !TensorType || !ProgramType || !OptimizerTensorsType ||
        PyModule_AddObjectRef(mod, "OptimizerTensors", (PyObject *)OptimizerTensorsType) < 0 ||
        PyModule_AddObjectRef(mod, "HAVE_MPI", mpi_built ? Py_True : Py_False) < 0) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
