/*
 * Connecting an MPI world's groups (collectives_mpi_impl.h): every process
 * lists the groups it asked for, all of them check the union alike, and
 * each makes the communicators of its groups in one global order.
 */
#ifdef SPMD_HAVE_MPI

#include "runtime/collectives/collectives_mpi_impl.h"

#include "base/arena.h"
#include "base/error.h"

#include <limits.h>
#include <stdlib.h>

/* A group as connect lists it: [size, rank 0, rank 1, ...]. */
static int key_cmp(const int *a, const int *b)
{
    if (a[0] != b[0]) return a[0] < b[0] ? -1 : 1;
    for (int i = 1; i <= a[0]; i++)
        if (a[i] != b[i]) return a[i] < b[i] ? -1 : 1;
    return 0;
}

typedef struct listing {
    const int *key;
    int proc; /* the process that asked for the group */
} listing;

static int listing_cmp(const void *x, const void *y)
{
    const listing *a = x, *b = y;
    int c = key_cmp(a->key, b->key);
    return c ? c : (a->proc > b->proc) - (a->proc < b->proc);
}

/* Whether the processes that asked for the group, e[0 .. count), are the
 * processes its devices live in (both ascending). */
static bool listed_by_its_processes(const mpi_world *w, const listing *e, int count)
{
    const int *key = e[0].key;
    int seen = 0;
    for (int want = 0; want < w->procs; want++) {
        bool has = false;
        for (int i = 1; i <= key[0] && !has; i++) has = key[i] / w->local == want;
        if (!has) continue;
        if (seen >= count || e[seen].proc != want) return false;
        seen++;
    }
    return seen == count;
}

static spmd_status make_comm(mpi_world *w, mpi_group *g, int tag)
{
    MPI_Group all, sub;
    int rc = MPI_Comm_group(w->comm, &all);
    if (rc != MPI_SUCCESS) return coll_mpi_error(rc, "MPI_Comm_group");
    rc = MPI_Group_incl(all, g->q, g->procs, &sub);
    MPI_Group_free(&all);
    if (rc != MPI_SUCCESS) return coll_mpi_error(rc, "MPI_Group_incl");
    rc = MPI_Comm_create_group(w->comm, sub, tag, &g->comm);
    MPI_Group_free(&sub);
    if (rc != MPI_SUCCESS) {
        g->comm = MPI_COMM_NULL;
        return coll_mpi_error(rc, "MPI_Comm_create_group");
    }
    MPI_Comm_set_errhandler(g->comm, MPI_ERRORS_RETURN);
    int rank = -1;
    MPI_Comm_rank(g->comm, &rank);
    if (rank != g->me)
        return BASE_INTERNAL("a group's communicator ranks its processes differently");
    return SPMD_OK;
}

/* Every process lists the groups it asked for and has not connected;
 * all processes get every list, so all of them see the same union, check
 * it alike, and make the communicators in the same order (sorted by
 * member list), each process only those of its groups.  That order makes
 * MPI_Comm_create_group, which waits for the group's processes, free of
 * deadlock: the first group not yet made has every process at it. */
static spmd_status connect_locked(mpi_world *w)
{
    const spmd_allocator *a = &w->alloc;
    int mine_len = 0;
    for (mpi_group *g = w->groups; g; g = g->next)
        if (g->comm == MPI_COMM_NULL) mine_len += 1 + g->n;
    int *mine = base_alloc(a, sizeof *mine * (size_t)(mine_len + 1), "connect");
    int *lens = base_alloc(a, sizeof *lens * (size_t)w->procs, "connect");
    int *displs = base_alloc(a, sizeof *displs * (size_t)w->procs, "connect");
    int *all = NULL;
    listing *e = NULL;
    spmd_status st = SPMD_OK;
    if (!mine || !lens || !displs) {
        st = SPMD_ERR_NOMEM;
        goto done;
    }
    int at = 0;
    for (mpi_group *g = w->groups; g; g = g->next)
        if (g->comm == MPI_COMM_NULL) {
            mine[at++] = g->n;
            memcpy(mine + at, g->ranks, sizeof *mine * (size_t)g->n);
            at += g->n;
        }
    int rc = MPI_Allgather(&mine_len, 1, MPI_INT, lens, 1, MPI_INT, w->comm);
    if (rc != MPI_SUCCESS) {
        st = coll_mpi_error(rc, "MPI_Allgather");
        goto done;
    }
    int64_t total = 0;
    for (int p = 0; p < w->procs; p++) {
        displs[p] = (int)total;
        total += lens[p];
    }
    if (total > INT_MAX) {
        st = base_error(SPMD_ERR_UNSUPPORTED, "collectives: %lld group entries to connect",
                        (long long)total);
        goto done;
    }
    all = base_alloc(a, sizeof *all * (size_t)(total + 1), "connect");
    if (!all) {
        st = SPMD_ERR_NOMEM;
        goto done;
    }
    rc = MPI_Allgatherv(mine, mine_len, MPI_INT, all, lens, displs, MPI_INT, w->comm);
    if (rc != MPI_SUCCESS) {
        st = coll_mpi_error(rc, "MPI_Allgatherv");
        goto done;
    }
    int entries = 0;
    for (int64_t i = 0; i < total; i += 1 + all[i]) entries++;
    e = base_alloc(a, sizeof *e * (size_t)(entries + 1), "connect");
    if (!e) {
        st = SPMD_ERR_NOMEM;
        goto done;
    }
    entries = 0;
    for (int p = 0; p < w->procs; p++)
        for (int i = displs[p]; i < displs[p] + lens[p]; i += 1 + all[i])
            e[entries++] = (listing){all + i, p};
    qsort(e, (size_t)entries, sizeof *e, listing_cmp);
    for (int i = 0, j; i < entries; i = j) {
        for (j = i + 1; j < entries && key_cmp(e[j].key, e[i].key) == 0;) j++;
        if (!listed_by_its_processes(w, e + i, j - i)) {
            st = base_error(SPMD_ERR_INVALID,
                            "collectives: processes disagree about a group of %d devices (%d, "
                            "...): %d processes asked for it, not every process holding one of "
                            "its devices (each must ask for each group it is in)",
                            e[i].key[0], e[i].key[1], j - i);
            goto done;
        }
    }
    for (int i = 0, j, run = 0; i < entries; i = j, run++) {
        bool here = false;
        for (j = i; j < entries && key_cmp(e[j].key, e[i].key) == 0; j++)
            here |= e[j].proc == w->rank;
        if (!here) continue;
        mpi_group *g = w->groups;
        while (g && !(g->n == e[i].key[0] &&
                      !memcmp(g->ranks, e[i].key + 1, sizeof(int) * (size_t)g->n)))
            g = g->next;
        if (!g) {
            st = BASE_INTERNAL("a connected group is not in the list");
            goto done;
        }
        st = make_comm(w, g, run % 32768);
        if (st) goto done;
    }
done:
    base_free(a, mine);
    base_free(a, lens);
    base_free(a, displs);
    base_free(a, all);
    base_free(a, e);
    return st;
}

spmd_status coll_mpi_world_connect(void *state)
{
    mpi_world *w = state;
    pthread_mutex_lock(&w->mu);
    spmd_status st = connect_locked(w);
    pthread_mutex_unlock(&w->mu);
    return st;
}

#endif
