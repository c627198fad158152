/*
 * The MPI transport of the collectives (collectives.h), as its files share
 * it.  Devices are threads of P processes, `local` devices in each; world
 * rank r lives in process r / local.  The world handed out is the
 * shared-memory world of this process's devices, extended
 * (collectives_impl.h): a group whose members all live here is a plain
 * shared-memory group; any other group is an MPI group, below.
 *
 * An MPI group runs every collective in three parts.  The members in this
 * process meet in a private shared-memory group (its barrier and slots);
 * the first of them, the leader, exchanges data with the other processes'
 * leaders over the group's communicator, reading and writing its local
 * peers' buffers directly; then the local members share the result in
 * memory.  With one member per process only the exchange is left; with
 * several, it is hierarchical, as NCCL and Horovod do it.
 *
 * Same bits as the shared-memory transport: sums follow the canonical tree
 * (collectives_tree.c).  Where a subtree's members all live in one process,
 * that process adds them locally and sends the subtree's sum; other
 * members' values are sent raw.  These "units" are the maximal subtrees
 * inside one process, in canonical order; one per process when each
 * process holds an aligned power-of-two run of member ranks.  The owner of
 * an element (a chunk of an all-reduce, a member's block of a
 * reduce-scatter) receives every unit's values for it and evaluates the
 * tree over the units.  MPI's own reductions are never used: their order
 * is theirs.
 *
 * Threads: device threads of different groups call collectives at the
 * same time, so MPI must run with MPI_THREAD_MULTIPLE.  Only the leader of
 * a group calls MPI for it, on the group's own communicator, one
 * collective at a time, so messages of a group match in posting order.
 *
 * Abort: every wait for MPI polls (MPI_Testall) and checks the world's
 * failure flag, so a local abort never leaves a thread blocked in MPI.  On
 * an abort, pending receives are cancelled and pending requests freed; the
 * peers' state is then unknown, so every group that crosses processes
 * fails for good (a reset brings back only this process's groups).
 * Telling the other processes is the caller's job (MPI_Abort).
 *
 * Its files, one concept each:
 *   collectives_mpi_xfer.c     the leader's messages: posting, the polled
 *                              wait and its watchdog, giving up
 *   collectives_mpi_call.c     a call of the local members: entering,
 *                              the leader's outcome, staging
 *   collectives_mpi_reduce.c   all-reduce and reduce-scatter (the sums)
 *   collectives_mpi_move.c     all-gather, all-to-all, broadcast, permute
 *   collectives_mpi_group.c    groups: members, processes and units
 *   collectives_mpi_connect.c  one communicator per group, agreed on by
 *                              every process
 *   collectives_mpi.c          the world: creating, gathering over its
 *                              processes, aborting, freeing
 */
#ifndef SPMD_RUNTIME_COLLECTIVES_MPI_IMPL_H
#define SPMD_RUNTIME_COLLECTIVES_MPI_IMPL_H

#ifdef SPMD_HAVE_MPI

#include "runtime/collectives/collectives.h"
#include "runtime/collectives/collectives_impl.h"

#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum {
    MESSAGE = 256,
    /* Polls between two looks at the clock, once a wait yields. */
    CLOCK_POLLS = 16,
    /* Polls of a wait before each further poll yields the core, as Open
     * MPI's own waits do when oversubscribed: device threads and processes
     * often outnumber cores. */
    POLL_SPINS = 64,
};

typedef struct mpi_world mpi_world;

/* A maximal subtree of the canonical tree inside one process: members
 * [lo, hi), in the group's process `proc` (an index into procs[]). */
typedef struct mpi_unit {
    int lo, hi, proc;
} mpi_unit;

/* The leader's requests of one exchange, and what each receive expects. */
typedef struct mpi_xfer {
    MPI_Request *req;
    MPI_Status *st;
    int64_t *expect; /* bytes a receive must get; -1 for a send */
    int *peer;       /* the process (index in procs[]) at the other end */
    int *idx;        /* MPI_Testsome's completed indices and statuses */
    MPI_Status *got;
    int n, cap;
    spmd_status err; /* a post that failed (its message recorded); the wait reports it */
} mpi_xfer;

typedef struct mpi_group {
    coll_group pub;
    mpi_world *world;
    struct mpi_group *next;
    int n;             /* members */
    int *ranks;        /* [n] world ranks, in member order */
    int q;             /* processes that hold members */
    int *procs;        /* [q] their ranks in the world communicator, ascending */
    int me;            /* this process's index in procs[], its rank in comm */
    int *proc_of;      /* [n] index in procs[] of each member's process */
    int k;             /* members in this process */
    int *local;        /* [k] their member ranks, ascending; local[0] leads */
    int *local_of;     /* [n] a member's index in local[], or -1 */
    int *remote_of;    /* [n] a member's index among the others, or -1 */
    int n_units;
    mpi_unit *units;   /* canonical order */
    int *slot;         /* [n_units] index among this process's units, or among the others' */
    int *inner;        /* [n_units] index among this process's units of several members, or -1 */
    int n_local_units, n_inner_units, n_remote_units;
    coll_term *terms;  /* [k][n]: each local member's terms for a sum */
    coll_shm_group *shm; /* the local members' barrier and slots */
    int lead;          /* the leader's rank in this process's shared-memory world */
    coll_op op;        /* the leader's current call, for the watchdog's message */
    coll_dtype type;   /* and its element type */
    MPI_Comm comm;     /* MPI_COMM_NULL until coll_world_connect */
    /* The leader's: requests, staging memory, and the outcome of its parts,
     * which the local members read after the next barrier.  Two records,
     * so that the leader's record for the next call never overwrites one a
     * member may still be reading. */
    mpi_xfer x;
    void *stage;
    size_t stage_bytes;
    spmd_status entry_status, status;
    char entry_message[MESSAGE], message[MESSAGE];
    /* Set by the leader when an exchange failed: the peers' state is
     * unknown, so the group is not used again. */
    bool broken;
    char broken_message[MESSAGE];
} mpi_group;

struct mpi_world {
    coll_world *shm; /* this process's devices; the world handed out */
    coll_world_ext ext;
    MPI_Comm comm;   /* a duplicate of the caller's */
    int procs, rank, local;
    spmd_allocator alloc;
    pthread_mutex_t mu; /* the group list, and connect */
    mpi_group *groups;
    /* Every process's host (MPI_Get_processor_name), for messages. */
    char (*hosts)[MPI_MAX_PROCESSOR_NAME];
    /* An abort: every group that crosses processes fails from then on. */
    _Atomic bool failed;
    pthread_mutex_t fail_mu;
    char failure[MESSAGE];
};

/* ---- Messages (collectives_mpi_xfer.c) ------------------------------------------- */

/* An MPI call's failure `rc`, recorded as SPMD_ERR_BACKEND naming `what`. */
spmd_status coll_mpi_error(int rc, const char *what);
/* Post a send to, or a receive from, process `peer` of the group (its
 * index in procs[], its rank in the group's communicator) of `bytes`, in
 * pieces.  Messages between two processes match in posting order. */
void coll_mpi_send(mpi_group *g, const void *buf, int64_t bytes, int peer);
void coll_mpi_recv(mpi_group *g, void *buf, int64_t bytes, int peer);
/* Wait for everything posted, polling, so that an abort of the world ends
 * the wait; a receive that got other than the bytes it expected is a
 * mismatch.  Any failure breaks the group for good. */
spmd_status coll_mpi_wait(mpi_group *g);
/* The error every call returns after the world's abort. */
spmd_status coll_mpi_failure(mpi_world *w);

/* ---- A call of the local members (collectives_mpi_call.c) ------------------------- */

/* Staging of at least `bytes` (never NULL); false with the error recorded. */
bool coll_mpi_stage(mpi_group *g, size_t bytes);
/* The local index of `member`, or -1 with an error. */
int coll_mpi_local_index(mpi_group *g, int member, coll_op op);
/* Whether the group can take a call at all (the same answer on every
 * local member). */
spmd_status coll_mpi_usable(mpi_group *g);
/* Meet the local members; the leader records `prepared`, the outcome of
 * what it readied for the call, which every member returns if it failed. */
spmd_status coll_mpi_enter(mpi_group *g, int l, coll_call call, spmd_status prepared);
/* After the leader's exchange: the leader records its outcome `st`, every
 * member waits for it and returns it. */
spmd_status coll_mpi_exchanged(mpi_group *g, int l, spmd_status st);

static inline const void *in_of(const mpi_group *g, int l) { return coll_shm_in(g->shm, l); }
static inline void *out_of(const mpi_group *g, int l) { return coll_shm_out(g->shm, l); }

static inline bool local_unit(const mpi_group *g, const mpi_unit *u) { return u->proc == g->me; }

static inline void copy(void *dst, const void *src, size_t bytes)
{
    if (dst != src && bytes) memcpy(dst, src, bytes);
}

/* ---- The collectives (coll_ops; collectives_mpi_reduce.c, _move.c) --------------------- */

spmd_status coll_mpi_all_reduce(coll_group *pub, int member, void *buf, int64_t count,
                                coll_dtype type);
spmd_status coll_mpi_reduce_scatter(coll_group *pub, int member, const void *in, void *out,
                                    int64_t outer, int64_t inner, coll_dtype type);
spmd_status coll_mpi_all_gather(coll_group *pub, int member, const void *in, void *out,
                                int64_t outer, int64_t inner_bytes);
spmd_status coll_mpi_all_to_all(coll_group *pub, int member, const void *in, void *out,
                                int64_t bytes);
spmd_status coll_mpi_broadcast(coll_group *pub, int member, void *buf, int64_t bytes, int root);
spmd_status coll_mpi_permute(coll_group *pub, int member, const void *in, void *out,
                             int64_t bytes, const int *src);

/* ---- Groups (collectives_mpi_group.c, _connect.c) ------------------------------------- */

/* coll_world_ext's group: a shared-memory group when every member lives
 * here, else the MPI group of those members, made on first ask. */
coll_group *coll_mpi_world_group(void *state, int size, const int *ranks);
void coll_mpi_group_free(mpi_world *w, mpi_group *g);
/* coll_world_ext's connect: the communicators of the groups asked for
 * since the last connect. */
spmd_status coll_mpi_world_connect(void *state);

#endif /* SPMD_HAVE_MPI */
#endif
