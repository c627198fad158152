/*
 * What the collective transports share and nothing else uses (docs/DESIGN.md,
 * "Collectives", "Determinism"):
 *
 * - the element types of a reduction (their sizes and names);
 * - the canonical summation order of a group (collectives_tree.c), which
 *   every transport follows so that every path gives the same bits;
 * - the shared-memory groups that the MPI transport runs the in-process
 *   part of a hierarchical collective on (collectives_shm*.c), and the hook
 *   by which an MPI world extends the shared-memory world of its process.
 */
#ifndef SPMD_RUNTIME_COLLECTIVES_IMPL_H
#define SPMD_RUNTIME_COLLECTIVES_IMPL_H

#include "runtime/collectives/collectives.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The largest group (MESH_MAX_DEVICES), which bounds the tree's height. */
enum { COLL_MAX_MEMBERS = 4096 };

/* ---- Element types -------------------------------------------------------------- */

/* Switches without a default: a new coll_dtype that one of them misses
 * is a compiler warning (-Wswitch). */
static inline bool coll_dtype_valid(coll_dtype type)
{
    switch (type) {
    case COLL_F32:
    case COLL_BF16: return true;
    }
    return false;
}

static inline size_t coll_dtype_size(coll_dtype type)
{
    switch (type) {
    case COLL_F32: return 4;
    case COLL_BF16: return 2;
    }
    return 0;
}

static inline const char *coll_dtype_name(coll_dtype type)
{
    switch (type) {
    case COLL_F32: return "f32";
    case COLL_BF16: return "bf16";
    }
    return "?";
}

/* Element i of an array of `type` at p (like strchr, without the const). */
static inline void *coll_elem(const void *p, coll_dtype type, int64_t i)
{
    return (char *)p + (size_t)i * coll_dtype_size(type);
}

/* ---- The canonical summation order --------------------------------------------- */

/* The sum over members [lo, hi) is the sum over [lo, mid) plus the sum over
 * [mid, hi), with mid - lo the largest power of two below hi - lo; one
 * member is its own value.  8 members: ((x0+x1)+(x2+x3))+((x4+x5)+(x6+x7));
 * 6: ((x0+x1)+(x2+x3))+(x4+x5). */
static inline int coll_tree_mid(int lo, int hi)
{
    int m = 1;
    while (2 * m < hi - lo) m *= 2;
    return lo + m;
}

/* A node of the tree whose value is already known (a member's input, or a
 * partial sum a process computed): element (row, col) is element
 * row * stride + col of `base`, of `type` (widened to f32 where the tree
 * reads it; f32 is read in place).  The node is [i, end) for terms[i]. */
typedef struct coll_term {
    const void *base;
    coll_dtype type;
    int64_t stride;
    int end;
} coll_term;

/* out[c] = the tree's sum over [lo, hi) of element (row, col + c) for c in
 * [0, len), summed in f32 and stored as `type` (rounded to nearest even
 * when that is narrower).  terms[i], for each i that starts a known node,
 * describes it; those nodes must cover [lo, hi) and be nodes of the tree
 * (every member [i, i+1) is one).  `out` may be the same memory as a
 * term's elements: each block is summed from its terms before it is
 * written. */
void coll_tree_sum(const coll_term *terms, int lo, int hi, int64_t row, int64_t col, void *out,
                   coll_dtype type, int64_t len);

/* ---- The shared-memory world as other transports use it ---------------------------- */

typedef enum coll_op {
    COLL_OP_ALL_REDUCE,
    COLL_OP_ALL_GATHER,
    COLL_OP_REDUCE_SCATTER,
    COLL_OP_ALL_TO_ALL,
    COLL_OP_BROADCAST,
    COLL_OP_PERMUTE
} coll_op;

extern const char *const coll_op_names[];

/* One member's call as the members of a group compare it. */
typedef struct coll_call {
    coll_op op;
    coll_dtype type;  /* a reduction's elements; COLL_F32 for the others */
    const void *in;
    void *out;
    int64_t a, b;     /* sizes */
    int root;
    const int *src;   /* permute's source table, of src_n entries */
    int src_n;
} coll_call;

/* How messages name a call: "all_reduce", "reduce_scatter (bf16)". */
typedef struct coll_call_text {
    char text[48];
} coll_call_text;
coll_call_text coll_call_name(coll_op op, coll_dtype type);

/* A transport that extends a process's shared-memory world with devices in
 * other processes.  coll_world_group, _connect, _gather_processes, _abort and _free call these
 * (abort after the shared-memory world is aborted, free before it is freed). */
typedef struct coll_world_ext {
    coll_group *(*group)(void *state, int size, const int *world_ranks);
    spmd_status (*connect)(void *state);
    spmd_status (*gather)(void *state, const void *in, void *out, const int64_t *bytes_of);
    void (*abort)(void *state, const char *message);
    void (*free)(void *state);
    int first, count, size; /* this process's world ranks, and the world's */
} coll_world_ext;

void coll_shm_world_extend(coll_world *w, const coll_world_ext *ext, void *state);
/* A group of this process's devices, by their ranks in the shared-memory
 * world: coll_world_group without the extension. */
coll_group *coll_shm_world_group(coll_world *w, int size, const int *ranks);
/* The error every collective returns after an abort, with its first cause. */
spmd_status coll_shm_aborted_error(coll_world *w);

/* The watchdog's limit in nanoseconds (0: off), and how often a wait
 * looks at the clock while it sleeps: an eighth of the limit, so a stall
 * is seen between the limit and 9/8 of it after the last progress. */
int64_t coll_world_timeout_ns(const coll_world *w);
int64_t coll_world_tick_ns(int64_t timeout_ns);
/* What a wait of this process's device `rank` (its shared-memory world
 * rank) tells the other waits: since when it has made no progress
 * (rt_wait_now_ns; 0: not waiting) and, when it only waits because the
 * device it waits for is itself waiting, that device (else -1).  A wait
 * whose limit passes while the device it waits for waits on, live, in
 * another collective leaves the blame to that one
 * (collectives_shm_barrier.c). */
void coll_shm_waiting(coll_world *w, int rank, int64_t since, int on);
/* Whether device `rank` waits in a collective that is live: the chain of
 * waits it waits on ends in one that made progress within 3/2 of the
 * limit, without coming back to `me`. */
bool coll_shm_wait_live(coll_world *w, int rank, int me, int64_t now, int64_t timeout_ns);

/* A group of this process's devices that only its owner uses (never
 * returned by a lookup), freed and aborted with the world. */
typedef struct coll_shm_group coll_shm_group;
coll_shm_group *coll_shm_group_private(coll_world *w, int size, const int *ranks);
/* Publish this member's call and wait for every member; fails after an
 * abort and when members made different calls, as every shared-memory
 * collective. */
spmd_status coll_shm_enter(coll_shm_group *g, int member, const coll_call *call);
/* A barrier that waits through an abort: between phases and to leave
 * (`member`: the caller's rank in the group). */
void coll_shm_sync(coll_shm_group *g, int member);
/* What member `member` published for the current call. */
const void *coll_shm_in(const coll_shm_group *g, int member);
void *coll_shm_out(const coll_shm_group *g, int member);

#endif
