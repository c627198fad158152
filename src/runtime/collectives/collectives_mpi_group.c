/*
 * MPI groups (collectives_mpi_impl.h): a group's members, the processes
 * that hold them, this process's members and leader, and its units (the
 * maximal subtrees of the canonical tree inside one process).  A group
 * whose members all live in this process is a plain shared-memory group.
 */
#ifdef SPMD_HAVE_MPI

#include "runtime/collectives/collectives_mpi_impl.h"

#include "base/arena.h"
#include "base/error.h"

void coll_mpi_group_free(mpi_world *w, mpi_group *g)
{
    const spmd_allocator *a = &w->alloc;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (g->comm != MPI_COMM_NULL && !finalized) MPI_Comm_free(&g->comm);
    base_free(a, g->ranks);
    base_free(a, g->procs);
    base_free(a, g->proc_of);
    base_free(a, g->local);
    base_free(a, g->local_of);
    base_free(a, g->remote_of);
    base_free(a, g->units);
    base_free(a, g->slot);
    base_free(a, g->inner);
    base_free(a, g->terms);
    base_free(a, g->x.req);
    base_free(a, g->x.st);
    base_free(a, g->x.expect);
    base_free(a, g->x.peer);
    base_free(a, g->x.idx);
    base_free(a, g->x.got);
    base_free(a, g->stage);
    base_free(a, g);
}

/* The maximal subtrees of [lo, hi) whose members share a process. */
static void find_units(mpi_group *g, int lo, int hi)
{
    bool one = true;
    for (int m = lo + 1; m < hi && one; m++) one = g->proc_of[m] == g->proc_of[lo];
    if (one) {
        g->units[g->n_units++] = (mpi_unit){lo, hi, g->proc_of[lo]};
        return;
    }
    int mid = coll_tree_mid(lo, hi);
    find_units(g, lo, mid);
    find_units(g, mid, hi);
}

static void *array(mpi_world *w, int n, size_t size, bool *ok)
{
    void *p = base_alloc(&w->alloc, size * (size_t)(n > 0 ? n : 1), "collective group");
    if (!p) *ok = false;
    return p;
}

/* An MPI group's calls (collectives_mpi_reduce.c, collectives_mpi_move.c). */
static const coll_ops mpi_ops = {
    .all_reduce = coll_mpi_all_reduce,
    .all_gather = coll_mpi_all_gather,
    .reduce_scatter = coll_mpi_reduce_scatter,
    .all_to_all = coll_mpi_all_to_all,
    .broadcast = coll_mpi_broadcast,
    .permute = coll_mpi_permute,
};

/* Under w->mu. */
static mpi_group *group_create(mpi_world *w, int size, const int *ranks)
{
    mpi_group *g = base_calloc(&w->alloc, sizeof *g, "collective group");
    if (!g) return NULL;
    g->world = w;
    g->n = size;
    g->comm = MPI_COMM_NULL;
    bool ok = true;
    g->ranks = array(w, size, sizeof *g->ranks, &ok);
    g->procs = array(w, size, sizeof *g->procs, &ok);
    g->proc_of = array(w, size, sizeof *g->proc_of, &ok);
    g->local = array(w, size, sizeof *g->local, &ok);
    g->local_of = array(w, size, sizeof *g->local_of, &ok);
    g->remote_of = array(w, size, sizeof *g->remote_of, &ok);
    g->units = array(w, size, sizeof *g->units, &ok);
    g->slot = array(w, size, sizeof *g->slot, &ok);
    g->inner = array(w, size, sizeof *g->inner, &ok);
    if (!ok) {
        coll_mpi_group_free(w, g);
        return NULL;
    }
    memcpy(g->ranks, ranks, sizeof *ranks * (size_t)size);
    /* The processes, ascending: a process's index is its rank in comm. */
    for (int m = 0; m < size; m++) {
        int p = ranks[m] / w->local, at = 0;
        while (at < g->q && g->procs[at] < p) at++;
        if (at < g->q && g->procs[at] == p) continue;
        memmove(g->procs + at + 1, g->procs + at, sizeof *g->procs * (size_t)(g->q - at));
        g->procs[at] = p;
        g->q++;
    }
    for (int c = 0; c < g->q; c++)
        if (g->procs[c] == w->rank) g->me = c;
    int remote = 0;
    for (int m = 0; m < size; m++) {
        int p = ranks[m] / w->local;
        for (int c = 0; c < g->q; c++)
            if (g->procs[c] == p) g->proc_of[m] = c;
        g->local_of[m] = g->remote_of[m] = -1;
        if (p == w->rank) {
            g->local_of[m] = g->k;
            g->local[g->k++] = m;
        } else {
            g->remote_of[m] = remote++;
        }
    }
    find_units(g, 0, size);
    for (int u = 0; u < g->n_units; u++) {
        const mpi_unit *un = &g->units[u];
        g->inner[u] = -1;
        if (local_unit(g, un)) {
            g->slot[u] = g->n_local_units++;
            if (un->hi - un->lo > 1) g->inner[u] = g->n_inner_units++;
        } else {
            g->slot[u] = g->n_remote_units++;
        }
    }
    g->terms = array(w, g->k * size, sizeof *g->terms, &ok);
    int local_ranks[COLL_MAX_MEMBERS];
    for (int i = 0; i < g->k; i++) local_ranks[i] = ranks[g->local[i]] - w->rank * w->local;
    g->lead = local_ranks[0];
    g->shm = ok ? coll_shm_group_private(w->shm, g->k, local_ranks) : NULL;
    if (!g->shm) {
        coll_mpi_group_free(w, g);
        return NULL;
    }
    g->pub = (coll_group){&mpi_ops, size, g};
    return g;
}

coll_group *coll_mpi_world_group(void *state, int size, const int *ranks)
{
    mpi_world *w = state;
    int n = w->procs * w->local;
    if (size < 1 || size > n || !ranks) {
        base_error(SPMD_ERR_INVALID, "collectives: a group of %d in a world of %d", size, n);
        return NULL;
    }
    int here = 0, first = w->rank * w->local;
    for (int i = 0; i < size; i++) {
        if (ranks[i] < 0 || ranks[i] >= n) {
            base_error(SPMD_ERR_INVALID, "collectives: rank %d in a world of %d", ranks[i], n);
            return NULL;
        }
        for (int j = 0; j < i; j++)
            if (ranks[j] == ranks[i]) {
                base_error(SPMD_ERR_INVALID, "collectives: rank %d twice in a group", ranks[i]);
                return NULL;
            }
        here += ranks[i] >= first && ranks[i] < first + w->local;
    }
    if (here == 0) {
        base_error(SPMD_ERR_INVALID,
                   "collectives: a group of %d with no device in process %d (devices %d to %d)",
                   size, w->rank, first, first + w->local - 1);
        return NULL;
    }
    if (here == size) {
        int local[COLL_MAX_MEMBERS];
        for (int i = 0; i < size; i++) local[i] = ranks[i] - first;
        return coll_shm_world_group(w->shm, size, local);
    }
    pthread_mutex_lock(&w->mu);
    mpi_group *g = w->groups;
    while (g && !(g->n == size && memcmp(g->ranks, ranks, sizeof *ranks * (size_t)size) == 0))
        g = g->next;
    if (!g) {
        g = group_create(w, size, ranks);
        if (g) {
            g->next = w->groups;
            w->groups = g;
        }
    }
    pthread_mutex_unlock(&w->mu);
    return g ? &g->pub : NULL;
}

#endif
