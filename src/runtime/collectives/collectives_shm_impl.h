/*
 * The shared-memory transport of the collectives (collectives.h), as its
 * files share it.  The devices of a world are threads of one process, so
 * a collective needs no messages.  Each group has one slot per member,
 * where the member publishes its buffer pointers and sizes, and one
 * reusable barrier.  After the entry barrier every
 * member reads its peers' buffers directly, so data moves once, without
 * staging copies; an exit barrier keeps every buffer alive and unchanged
 * until all peers have finished reading it.  Sums follow the canonical
 * tree over member ranks (collectives_tree.c), as every transport's do.
 * The MPI transport runs the in-process part of its collectives on
 * private groups of this world (collectives_impl.h).
 *
 * Waits spin briefly, yield a few times and then sleep on a futex (a
 * condition variable off Linux; wait.h), because a world often runs more
 * device threads than cores, and a spinning thread would then starve the
 * one it waits for.
 *
 * Abort: the barrier word holds an abort bit next to its generation, and
 * opening the barrier and aborting are both atomic operations on that one
 * word, so a barrier either opened before the abort (every member passes
 * it) or never opens (every member gets an error).  Only the entry barrier
 * of a collective may fail that way: once every member is past it, the
 * members only copy memory until the next barrier, so the later barriers
 * wait through an abort.  That costs at most one copy phase of latency and
 * guarantees that no member returns (so that its caller may free or
 * overwrite its buffer) while a peer may still be reading that buffer.
 *
 * Its files:
 *   collectives_shm_barrier.c  the barrier, abort and the watchdog
 *   collectives_shm.c          entering a call, and the collectives
 *   collectives_shm_world.c    the world and its groups
 */
#ifndef SPMD_RUNTIME_COLLECTIVES_SHM_IMPL_H
#define SPMD_RUNTIME_COLLECTIVES_SHM_IMPL_H

#include "runtime/collectives/collectives.h"
#include "runtime/collectives/collectives_impl.h"
#include "runtime/wait.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

enum { ABORT_MESSAGE = 256 };

#define ABORT_BIT 0x80000000u
#define GEN_MASK 0x7fffffffu

/* What a member publishes for the current collective, alone on its cache
 * line because each member writes only its own.  Written before the entry
 * barrier, read by peers between the entry and exit barriers. */
typedef struct coll_slot {
    _Alignas(64) coll_call call;
    /* call.op and call.type again, for a peer's watchdog message, which
     * reads them while this member may publish its next call. */
    _Atomic int op, type;
    /* The generation of the last entry barrier this member arrived at: a
     * peer's watchdog sees who has not arrived. */
    _Atomic uint32_t arrived;
} coll_slot;

/* The word waited on (abort bit | generation) and the arrival count, on
 * separate cache lines so that arriving does not disturb the spinners. */
typedef struct coll_barrier {
    _Alignas(64) rt_wait_word word;
    _Alignas(64) _Atomic uint32_t count;
} coll_barrier;

struct coll_shm_group {
    coll_barrier bar;
    coll_group pub;
    struct coll_shm_group *next;
    coll_world *world;
    int *ranks;
    coll_slot *slots;
    coll_term *terms;  /* the summands: member i writes terms[i] before entering */
    bool hidden;       /* another transport's private group: never looked up */
    uint64_t key;      /* ranks_key of its ranks: its place in the world's index */
};

/* What a device's current wait tells the others (coll_shm_waiting). */
typedef struct coll_waiting {
    _Alignas(64) _Atomic int64_t since;
    _Atomic int on;
} coll_waiting;

struct coll_world {
    int n;
    _Atomic int64_t timeout_ns; /* the watchdog's limit; 0: off */
    coll_waiting *waiting;      /* [n] */
    rt_waiter wait; /* for every barrier of the world */
    spmd_allocator alloc;
    /* Guards the group list and the abort message; groups are never freed
     * before the world, so a group pointer stays valid without it. */
    pthread_mutex_t mu;
    coll_shm_group *groups;
    /* The groups that are looked up, by their ranks: open addressing on
     * ranks_key, at most half full, so finding a device's group reads its
     * ranks a bounded number of times however many groups there are. */
    coll_shm_group **index;
    int index_size, indexed;
    _Atomic bool aborted;
    char message[ABORT_MESSAGE];
    /* Devices in other processes (collectives_impl.h), or NULL. */
    const coll_world_ext *ext;
    void *ext_state;
    _Atomic uint64_t rank_visits; /* coll_world_rank_visits */
};

/* ---- The barrier (collectives_shm_barrier.c) ------------------------------------- */

typedef enum bar_result { BAR_OPEN, BAR_ABORTED, BAR_TIMEOUT } bar_result;

/* Wait for every member of the group.  BAR_OPEN once the barrier opened;
 * otherwise only when `may_abort` (entry barriers; `member` is the
 * caller's rank): BAR_ABORTED when the world was aborted before it could
 * open, in which case it never opens (opening checks the abort bit in the
 * same compare-and-swap), so every member of this barrier fails alike;
 * BAR_TIMEOUT, its message recorded, when the watchdog fired here.
 *
 * The watchdog: past the spin, the waiter wakes every tick (an eighth of
 * the limit) and counts a peer's arrival as progress; when none came for
 * the limit, it looks at the members that have not arrived.  If each of
 * them waits, live, in another collective (coll_shm_wait_live), that
 * wait's watchdog names the cause, and this one waits on; else it fires,
 * naming the first that is not waiting live. */
bar_result coll_shm_barrier_wait(coll_shm_group *g, int member, bool may_abort);
/* Under w->mu: the first abort names the cause (later ones are its
 * consequences); every barrier's word gets the abort bit. */
void coll_shm_abort_locked(coll_world *w, const char *message);

/* ---- The collectives (collectives_shm.c) ----------------------------------------- */

extern const coll_ops coll_shm_ops;

#endif
