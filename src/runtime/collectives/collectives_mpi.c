/*
 * The MPI world (collectives.h, coll_mpi_world_create): this process's
 * shared-memory world, extended (coll_world_ext) with the groups that
 * cross processes (collectives_mpi_impl.h); gathers over the processes;
 * aborting and freeing.  Built without MPI, only coll_world_create is
 * here, and it refuses a communicator.
 */
#ifdef SPMD_HAVE_MPI

#include "runtime/collectives/collectives_mpi_impl.h"

#include "base/arena.h"
#include "base/error.h"
#include "runtime/wait.h"

#include <limits.h>
#include <sched.h>
#include <stdio.h>

/* ---- Gathers over processes --------------------------------------------------------- */

/* One MPI_Allgatherv of bytes: its counts and displacements are ints, so
 * a gather of 2 GiB or more in all is refused. */
static spmd_status mpi_world_gather(void *state, const void *in, void *out, const int64_t *bytes_of)
{
    mpi_world *w = state;
    int64_t total = 0;
    for (int q = 0; q < w->procs; q++) total += bytes_of[q];
    if (total > INT_MAX)
        return base_error(SPMD_ERR_UNSUPPORTED,
                          "collectives: a gather over processes of %lld bytes (MPI counts stop "
                          "at 2 GiB)", (long long)total);
    int *counts = base_alloc(&w->alloc, 2 * (size_t)w->procs * sizeof *counts, "process gather");
    if (!counts) return SPMD_ERR_NOMEM;
    int *displs = counts + w->procs;
    for (int q = 0, at = 0; q < w->procs; q++) {
        counts[q] = (int)bytes_of[q];
        displs[q] = at;
        at += counts[q];
    }
    /* Polled, as every wait of the world: the watchdog watches it too. */
    MPI_Request req;
    int rc = MPI_Iallgatherv(in, counts[w->rank], MPI_BYTE, out, counts, displs, MPI_BYTE,
                             w->comm, &req);
    if (rc != MPI_SUCCESS) {
        base_free(&w->alloc, counts);
        return coll_mpi_error(rc, "MPI_Iallgatherv");
    }
    int64_t limit = coll_world_timeout_ns(w->shm), since = 0;
    spmd_status st = SPMD_OK;
    for (int spins = 0;; spins++) {
        int done = 0;
        rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
            st = coll_mpi_error(rc, "MPI_Iallgatherv");
            break;
        }
        if (done) break;
        if (spins < POLL_SPINS) continue;
        sched_yield();
        if (limit <= 0 || spins % CLOCK_POLLS) continue;
        int64_t now = rt_wait_now_ns();
        if (!since) since = now;
        if (now - since < limit) continue;
        /* A collective over every process cannot say which is missing. */
        st = base_error(SPMD_ERR_TIMEOUT,
                        "collective timeout: a gather over the %d processes: process %d on %s "
                        "waited %.1f s for the others",
                        w->procs, w->rank, w->hosts[w->rank], (double)(now - since) * 1e-9);
        char msg[MESSAGE];
        snprintf(msg, sizeof msg, "%s", spmd_last_error());
        coll_world_abort(w->shm, msg);
        base_error(SPMD_ERR_TIMEOUT, "%s", msg);
        /* MPI can neither cancel nor free a collective's request: it is
         * left behind, and the caller ends the job (MPI_Abort). */
        break;
    }
    base_free(&w->alloc, counts);
    return st;
}

/* ---- The world --------------------------------------------------------------------- */

static void mpi_world_abort(void *state, const char *message)
{
    mpi_world *w = state;
    pthread_mutex_lock(&w->fail_mu);
    if (!atomic_load(&w->failed)) {
        snprintf(w->failure, sizeof w->failure, "%s", message);
        atomic_store(&w->failed, true);
    }
    pthread_mutex_unlock(&w->fail_mu);
}

static void mpi_world_free(void *state)
{
    mpi_world *w = state;
    for (mpi_group *g = w->groups, *next; g; g = next) {
        next = g->next;
        coll_mpi_group_free(w, g);
    }
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (w->comm != MPI_COMM_NULL && !finalized) MPI_Comm_free(&w->comm);
    pthread_mutex_destroy(&w->mu);
    pthread_mutex_destroy(&w->fail_mu);
    spmd_allocator a = w->alloc;
    base_free(&a, w->hosts);
    base_free(&a, w);
}

static const char *thread_level(int level)
{
    switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    default: return "MPI_THREAD_MULTIPLE";
    }
}

coll_world *coll_mpi_world_create(MPI_Comm comm, int local_devices, const spmd_allocator *alloc)
{
    int initialized = 0, finalized = 0, level = MPI_THREAD_SINGLE;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized || finalized) {
        base_error(SPMD_ERR_INVALID, "collectives: MPI is %s (MPI_Init_thread with "
                                     "MPI_THREAD_MULTIPLE comes first)",
                   finalized ? "finalized" : "not initialised");
        return NULL;
    }
    MPI_Query_thread(&level);
    if (level != MPI_THREAD_MULTIPLE) {
        base_error(SPMD_ERR_UNSUPPORTED,
                   "collectives: MPI runs with %s, but device threads call MPI at the same time: "
                   "initialise it with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) on an MPI "
                   "library that provides it",
                   thread_level(level));
        return NULL;
    }
    if (comm == MPI_COMM_NULL) {
        base_error(SPMD_ERR_INVALID, "collectives: MPI_COMM_NULL");
        return NULL;
    }
    int procs = 0, rank = 0;
    MPI_Comm_size(comm, &procs);
    MPI_Comm_rank(comm, &rank);
    if (local_devices < 1 || (int64_t)procs * local_devices > COLL_MAX_MEMBERS) {
        base_error(SPMD_ERR_INVALID,
                   "collectives: %d processes of %d devices (1 to %d devices in all)", procs,
                   local_devices, COLL_MAX_MEMBERS);
        return NULL;
    }
    /* Processes on one host share its cores: their waits must not spin
     * as if each had them all. */
    MPI_Comm host;
    if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &host) == MPI_SUCCESS) {
        int here = 1;
        MPI_Comm_size(host, &here);
        MPI_Comm_free(&host);
        rt_wait_share_cpus(here);
    }
    spmd_allocator a = base_allocator_or_default(alloc);
    mpi_world *w = base_calloc(&a, sizeof *w, "collectives world");
    if (!w) return NULL;
    w->shm = coll_shm_world_create(local_devices, &a);
    if (!w->shm) {
        base_free(&a, w);
        return NULL;
    }
    int rc = MPI_Comm_dup(comm, &w->comm);
    if (rc != MPI_SUCCESS) {
        coll_mpi_error(rc, "MPI_Comm_dup");
        coll_world_free(w->shm);
        base_free(&a, w);
        return NULL;
    }
    MPI_Comm_set_errhandler(w->comm, MPI_ERRORS_RETURN);
    /* Every process's host, once, so that the watchdog can name the host
     * of the process a collective waited for. */
    w->hosts = base_calloc(&a, sizeof *w->hosts * (size_t)procs, "collectives world");
    char name[MPI_MAX_PROCESSOR_NAME] = {0};
    int name_len = 0;
    if (MPI_Get_processor_name(name, &name_len) != MPI_SUCCESS || name_len <= 0)
        snprintf(name, sizeof name, "(unknown host)");
    int hosts_ok = w->hosts != NULL, all_ok = 0;
    rc = MPI_Allreduce(&hosts_ok, &all_ok, 1, MPI_INT, MPI_MIN, w->comm);
    if (rc == MPI_SUCCESS && all_ok)
        rc = MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, w->hosts,
                           MPI_MAX_PROCESSOR_NAME, MPI_CHAR, w->comm);
    if (rc != MPI_SUCCESS || !all_ok) {
        if (rc != MPI_SUCCESS) coll_mpi_error(rc, "MPI_Allgather of the hosts");
        else base_error(SPMD_ERR_NOMEM, "collectives: out of memory for the processes' hosts");
        base_free(&a, w->hosts);
        MPI_Comm_free(&w->comm);
        coll_world_free(w->shm);
        base_free(&a, w);
        return NULL;
    }
    for (int q = 0; q < procs; q++) w->hosts[q][MPI_MAX_PROCESSOR_NAME - 1] = '\0';
    w->procs = procs;
    w->rank = rank;
    w->local = local_devices;
    w->alloc = a;
    pthread_mutex_init(&w->mu, NULL);
    pthread_mutex_init(&w->fail_mu, NULL);
    atomic_init(&w->failed, false);
    w->ext = (coll_world_ext){
        .group = coll_mpi_world_group,
        .connect = coll_mpi_world_connect,
        .gather = mpi_world_gather,
        .abort = mpi_world_abort,
        .free = mpi_world_free,
        .first = rank * local_devices,
        .count = local_devices,
        .size = procs * local_devices,
    };
    coll_shm_world_extend(w->shm, &w->ext, w);
    return w->shm;
}

coll_world *coll_world_create(int devices, const void *mpi_comm, const spmd_allocator *alloc)
{
    if (!mpi_comm) return coll_shm_world_create(devices, alloc);
    MPI_Comm comm = *(const MPI_Comm *)mpi_comm;
    int initialized = 0, procs = 0;
    MPI_Initialized(&initialized);
    if (initialized && comm != MPI_COMM_NULL) MPI_Comm_size(comm, &procs);
    if (procs > 0 && devices % procs != 0) {
        base_error(SPMD_ERR_INVALID,
                   "compile: the mesh's %d devices do not divide over the %d processes of the "
                   "communicator (each process runs devices / processes of them)",
                   devices, procs);
        return NULL;
    }
    /* Anything else wrong (MPI not initialised, a null communicator) is
     * named by the world itself. */
    return coll_mpi_world_create(comm, procs > 0 ? devices / procs : devices, alloc);
}

#else
#include "runtime/collectives/collectives.h"

#include "base/error.h"

coll_world *coll_world_create(int devices, const void *mpi_comm, const spmd_allocator *alloc)
{
    if (!mpi_comm) return coll_shm_world_create(devices, alloc);
    base_error(SPMD_ERR_UNSUPPORTED,
               "compile: a run over MPI processes needs a libspmd built with MPI (this one was "
               "built without it: install libopenmpi-dev and configure with -DSPMD_MPI=ON)");
    return NULL;
}
#endif
