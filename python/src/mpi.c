/* Processes: starting MPI, ending the job, the communicator a program
 * compiles over (core.h). */
#include "core.h"

#include <string.h>
#include <time.h>

#ifdef SPMD_HAVE_MPI
#include <mpi.h>
#endif

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
            PyErr_SetString(error_type(SPMD_ERR_BACKEND), "mpi_start: MPI is already finalized");
            return NULL;
        }
        if (!initialized) {
            if (MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &level) != MPI_SUCCESS) {
                PyErr_SetString(error_type(SPMD_ERR_BACKEND), "mpi_start: MPI_Init_thread failed");
                return NULL;
            }
            mpi.owned = true;
            if (Py_AtExit(mpi_end) < 0) {
                PyErr_SetString(error_type(SPMD_ERR_BACKEND),
                                "mpi_start: cannot register MPI_Finalize at exit");
                return NULL;
            }
        } else {
            MPI_Query_thread(&level); /* started by another package (mpi4py) */
        }
        if (level != MPI_THREAD_MULTIPLE) {
            PyErr_Format(error_type(SPMD_ERR_BACKEND),
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
    PyErr_SetString(error_type(SPMD_ERR_UNSUPPORTED), NO_MPI);
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

int mpi_compile_comm(bool over_processes, const void **comm)
{
    *comm = NULL;
    if (!over_processes) return 0;
#ifdef SPMD_HAVE_MPI
    /* MPI_COMM_WORLD, which the world duplicates at compile. */
    static MPI_Comm world;
    if (!mpi.started) {
        PyErr_SetString(error_type(SPMD_ERR_INVALID),
                        "compile(mpi=True): MPI is not started (mpi_start() first)");
        return -1;
    }
    world = MPI_COMM_WORLD;
    *comm = &world;
    return 0;
#else
    PyErr_SetString(error_type(SPMD_ERR_UNSUPPORTED), NO_MPI);
    return -1;
#endif
}

/* The MPI library's own line (MPI_Get_library_version, callable before
 * MPI_Init) and the MPI standard it implements; None without MPI. */
static PyObject *mod_mpi_library_version(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
#ifdef SPMD_HAVE_MPI
    char text[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0, major = 0, minor = 0;
    if (MPI_Get_library_version(text, &len) != MPI_SUCCESS ||
        MPI_Get_version(&major, &minor) != MPI_SUCCESS) {
        PyErr_SetString(error_type(SPMD_ERR_BACKEND), "mpi_library_version: MPI does not say");
        return NULL;
    }
    if (len < 0 || len >= MPI_MAX_LIBRARY_VERSION_STRING) len = MPI_MAX_LIBRARY_VERSION_STRING - 1;
    text[len] = '\0';
    Py_ssize_t first_line = (Py_ssize_t)strcspn(text, "\n");
    return Py_BuildValue("(s#ii)", text, first_line, major, minor);
#else
    Py_RETURN_NONE;
#endif
}

static PyMethodDef mpi_methods[] = {
    {"mpi_start", FN(mod_mpi_start), METH_NOARGS,
     "mpi_start() -> (processes, rank, processes on this host): initialise MPI (MPI_THREAD_MULTIPLE) "
     "unless it is, finalising it at exit if it was not; ValueError when built without MPI"},
    {"mpi_abort", FN(mod_mpi_abort), METH_O,
     "mpi_abort(code): end every process of the job (MPI_Abort); nothing before mpi_start"},
    {"mpi_library_version", FN(mod_mpi_library_version), METH_NOARGS,
     "mpi_library_version() -> (the MPI library's version line, MPI standard major, minor); None "
     "when built without MPI"},
    {NULL}};

#ifdef SPMD_HAVE_MPI
static const bool mpi_built = true;
#else
static const bool mpi_built = false;
#endif

int mpi_register(PyObject *mod)
{
    if (PyModule_AddFunctions(mod, mpi_methods) < 0) return -1;
    return PyModule_AddObjectRef(mod, "HAVE_MPI", mpi_built ? Py_True : Py_False);
}
