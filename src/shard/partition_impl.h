/*
 * Inside the partitioner (partition.h): the builder that partition.c
 * drives node by node, shared with the resharding planner (partition_reshard.c) and
 * the per-op fixups (partition_fixups.c).
 */
#ifndef SPMD_SHARD_PARTITION_IMPL_H
#define SPMD_SHARD_PARTITION_IMPL_H

#include "shard/partition.h"
#include "base/arena.h"

#include <string.h>

/* One local value of a global node, with the sharding it holds. */
typedef struct variant {
    const sharding *s;   /* a copy shared through builder.shardings */
    spmd_tensor *t;
    int phase;           /* part_phase it was made for; -1: the node's own value */
    struct variant *next;
} variant;

typedef struct builder {
    partition *p;
    variant **variants; /* per global node id; the first is what the op produced */
    /* The variants and their shardings (one copy of each), freed when the
     * local program is built, so that what comes next reuses the memory. */
    base_arena arena;
    base_intern shardings;
    int node;            /* the global node being partitioned, for messages */
    /* The one failure channel: the first failure of any step, its status
     * and message together, set only by part_record(). */
    ir_failure failure;
} builder;

/* ---- Failures (partition.c) ------------------------------------------------------------ */

/* Every failure of a step goes through here: the first one is kept, with
 * its message, and partition_build reports it.  A step that fails
 * returns NULL (or a status) only after recording why. */
spmd_status part_record(builder *b, spmd_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* An allocation of the partitioner's own failed; returns NULL for the
 * caller to pass on. */
void *part_fail_nomem(builder *b, const char *what);
/* A builder call on the local graph, through LOCAL: its result, or NULL
 * with the local graph's failure recorded. */
spmd_tensor *part_local_call(builder *b, spmd_tensor *t, const char *file, int line);
#define LOCAL(b, call) part_local_call((b), (call), __FILE__, __LINE__)
/* The status of a step that returned NULL, through failed(b): what it
 * recorded. */
spmd_status part_step_failed(builder *b, const char *file, int line);
#define failed(b) part_step_failed((b), __FILE__, __LINE__)

/* ---- Resharding (partition_reshard.c) ------------------------------------------------------------ */

static inline void dims_of(const spmd_tensor *x, int64_t *dims)
{
    memcpy(dims, x->dims, sizeof x->dims);
}

/* The index of the collective group `axes` in p->specs, added if new; -1
 * out of memory. */
int part_spec_index(partition *p, const mesh_axes *axes);
/* A per-device op of kind `kind` (a collective, a local slice or the
 * padding mask) on x, with result dims `dims`, moving global node gid's
 * value for `consumer` (-1: an output); a collective is also listed in
 * the report.  NULL after a recorded failure (or when x is NULL). */
spmd_tensor *part_emit_coll(builder *b, ir_op kind, spmd_tensor *x, const mesh_axes *axes,
                            int dim, int dim2, int64_t global, const int64_t *dims, int gid,
                            int consumer);
/* The local value of global node x with sharding `want`, resharded from
 * what its op produced (and cached) if need be. */
spmd_tensor *part_value(builder *b, const spmd_tensor *x, const sharding *want, int consumer);
/* Node gid's local value t, holding sharding s; the first one added is
 * what its op produced.  False after a recorded failure. */
bool part_add_variant(builder *b, int gid, const sharding *s, spmd_tensor *t);
/* Note operand j of t as a fallback if it arrives split (`have`) where
 * its op cannot split it (`need`).  False after a recorded failure. */
bool part_check_fallback(builder *b, const spmd_tensor *t, int j, const sharding *have,
                         const sharding *need);
/* Local over global size of x's dims in `dims_mask` under sharding s. */
double part_local_share(const partition *p, const spmd_tensor *x, const sharding *s,
                        uint32_t dims_mask);

/* ---- Fixups (partition_fixups.c) ------------------------------------------------------- */

/* The node that stands for global node t's local value, given lt, the
 * local node just made for it with operands resharded to `need`: lt, or
 * what ops.def's fixup for t's op makes of it.  NULL after a recorded
 * failure. */
spmd_tensor *part_fixup(builder *b, const spmd_tensor *t, const sharding *need, spmd_tensor *lt);

#endif
