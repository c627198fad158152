/* Graph.compile (core.h): a Program for the graph's marks. */
#include "core.h"

static PyObject *graph_compile(GraphObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"seed", "threads", "plan_only", "unfused", "copy_seeds", "mpi",
                             "collective_timeout", "overlap", "inflight_bytes", "schedule", NULL};
    int plan_only = 0, unfused = 0, over_processes = 0, overlap = 0;
    double collective_timeout = 0;
    PyObject *seed_o = NULL, *threads_o = NULL, *inflight_o = NULL, *seeds_o = Py_None;
    uint64_t seed = 0, threads = 0, inflight_bytes = 0;
    const char *schedule = "gpipe";
    /* The integers are read whole and checked before they are narrowed;
     * the library checks the rest (collective_timeout's range). */
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$OOppOpdpOs:compile", kwlist, &seed_o, &threads_o,
                                     &plan_only, &unfused, &seeds_o, &over_processes,
                                     &collective_timeout, &overlap, &inflight_o, &schedule) ||
        graph_open(self) < 0 ||
        (seed_o && count_arg("compile", "seed", seed_o, UINT64_MAX, NULL, &seed) < 0) ||
        (threads_o && count_arg("compile", "threads", threads_o, INT_MAX, "every core", &threads) < 0) ||
        (inflight_o &&
         count_arg("compile", "inflight_bytes", inflight_o, PY_SSIZE_T_MAX, "the default", &inflight_bytes) < 0))
        return NULL;
    bool one_f_one_b = strcmp(schedule, "1f1b") == 0;
    if (!one_f_one_b && strcmp(schedule, "gpipe") != 0) {
        PyErr_Format(PyExc_ValueError, "compile: schedule '%s': 'gpipe' or '1f1b'", schedule);
        return NULL;
    }
    /* Over processes: MPI_COMM_WORLD (mpi.c). */
    const void *comm;
    if (mpi_compile_comm(over_processes, &comm) < 0) return NULL;
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
            PyErr_Format(error_type(SPMD_ERR_INVALID),
                         "copy_seeds: %zd seeds for %d copies", PyTuple_GET_SIZE(tuple),
                         copies);
        seeds = tuple && !PyErr_Occurred() ? PyMem_Calloc((size_t)copies, sizeof *seeds) : NULL;
        for (int i = 0; seeds && i < copies; i++) {
            char name[32];
            snprintf(name, sizeof name, "copy_seeds[%d]", i);
            if (count_arg("compile", name, PyTuple_GET_ITEM(tuple, i), UINT64_MAX, NULL, &seeds[i]) < 0) {
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
    spmd_compile_options opts = {.threads = (int)threads, .seed = seed, .plan_only = plan_only,
                                 .copy_seeds = seeds, .unfused = unfused, .mpi_comm = comm,
                                 .collective_timeout_s = collective_timeout, .overlap = overlap,
                                 .inflight_bytes = (size_t)inflight_bytes,
                                 .schedule = one_f_one_b ? SPMD_SCHEDULE_1F1B : SPMD_SCHEDULE_GPIPE};
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

PyMethodDef graph_compile_methods[] = {
    {"compile", KW(graph_compile),
     "compile(*, seed=0, threads=0, plan_only=False, unfused=False, copy_seeds=None, mpi=False, "
     "collective_timeout=0, overlap=False, inflight_bytes=0, schedule='gpipe') -> Program; "
     "mpi=True: over the processes of MPI_COMM_WORLD (mpi_start), each running its run of devices; "
     "collective_timeout: seconds a device may wait in a collective without progress before its "
     "run raises TimeoutError (0: the default, 100; negative: never; at most 1e7 either way); "
     "overlap=True: collectives in flight on each device's communication thread while it computes (the same bits), "
     "their operands and results at most inflight_bytes at once (0: the default, 64 MiB); "
     "schedule: on pipeline stages, 'gpipe' (every forward, then every backward) or '1f1b' "
     "(one forward and one backward by turns, by the micro-batches set_micro_batch tagged)"},
    {NULL}};
