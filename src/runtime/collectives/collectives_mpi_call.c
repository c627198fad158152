/*
 * A call of an MPI group's local members (collectives_mpi_impl.h): they
 * meet in the group's private shared-memory group, the leader alone
 * talks to the other processes, and every member returns the leader's
 * outcome.  The leader records an outcome before a barrier and every
 * member replays it after, so all of them fail alike.
 */
#ifdef SPMD_HAVE_MPI

#include "runtime/collectives/collectives_mpi_impl.h"

#include "base/arena.h"
#include "base/error.h"

#include <stdio.h>

bool coll_mpi_stage(mpi_group *g, size_t bytes)
{
    if (bytes < 64) bytes = 64; /* never NULL, even for empty calls */
    if (bytes <= g->stage_bytes) return true;
    base_free(&g->world->alloc, g->stage);
    g->stage_bytes = 0;
    g->stage = base_alloc(&g->world->alloc, bytes, "collective staging");
    if (!g->stage) return false;
    g->stage_bytes = bytes;
    return true;
}

static void record(spmd_status st, spmd_status *status, char *message)
{
    *status = st;
    if (st) snprintf(message, MESSAGE, "%s", spmd_last_error());
}

static spmd_status replay(spmd_status st, const char *message)
{
    return st ? base_error(st, "%s", message) : SPMD_OK;
}

int coll_mpi_local_index(mpi_group *g, int member, coll_op op)
{
    if (member < 0 || member >= g->n) {
        base_error(SPMD_ERR_INVALID, "%s: member %d of a group of %d", coll_op_names[op], member,
                   g->n);
        return -1;
    }
    if (g->local_of[member] < 0) {
        base_error(SPMD_ERR_INVALID, "%s: member %d (device %d) is not in process %d",
                   coll_op_names[op], member, g->ranks[member], g->world->rank);
        return -1;
    }
    return g->local_of[member];
}

/* Whether the group can take a call at all.  Every local member sees the
 * same answer: each cause is permanent once set, and an abort sets the
 * local barrier's abort bit before `failed`. */
spmd_status coll_mpi_usable(mpi_group *g)
{
    if (atomic_load(&g->world->failed)) return coll_mpi_failure(g->world);
    if (g->broken)
        return base_error(SPMD_ERR_BACKEND, "collective group failed earlier: %s",
                          g->broken_message);
    if (g->comm == MPI_COMM_NULL)
        return base_error(SPMD_ERR_INTERNAL,
                          "collectives: a group across processes used before coll_world_connect");
    return SPMD_OK;
}

/* Meet the local members.  The leader first records `prepared`, the outcome
 * of what it readied for the call (staging), which every member returns
 * if it failed, after a last barrier so that none of them still reads the
 * record when the leader writes the next one. */
spmd_status coll_mpi_enter(mpi_group *g, int l, coll_call call, spmd_status prepared)
{
    if (l == 0) {
        record(prepared, &g->entry_status, g->entry_message);
        g->op = call.op;
        g->type = call.type;
    }
    call.src_n = call.src ? g->n : 0;
    spmd_status st = coll_shm_enter(g->shm, l, &call);
    if (st) return st;
    st = replay(g->entry_status, g->entry_message);
    if (st) coll_shm_sync(g->shm, l);
    return st;
}

/* After the leader's exchange: the leader records its outcome, every
 * member waits for it and takes it. */
spmd_status coll_mpi_exchanged(mpi_group *g, int l, spmd_status st)
{
    if (l == 0) record(st, &g->status, g->message);
    coll_shm_sync(g->shm, l);
    return l == 0 ? st : replay(g->status, g->message);
}

#endif
