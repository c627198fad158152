/*
 * Internal to the planner (plan.h): what its files share.  plan.c builds
 * a plan: the steps, the marks of what lives outside the arena
 * (plan_marks.c), the schedule's order (plan_reorder.c, plan_hoist.c),
 * the collectives in flight (plan_inflight.c), and the placement, over
 * the free list of plan_freelist.c.
 */
#ifndef SPMD_COMPILE_PLAN_IMPL_H
#define SPMD_COMPILE_PLAN_IMPL_H

#include "compile/plan.h"

#include <stdint.h>

/* ---- The free list (plan_freelist.c) ---------------------------------------- */

/* A free block of the arena, in two trees (plan_freelist.c). */
typedef struct free_block {
    int64_t offset, size;
    int child[2][2]; /* [order][left, right]; -1: none */
} free_block;

typedef struct freelist {
    free_block *slots;
    int root[2];   /* per order; -1: empty */
    int fresh;     /* slots[fresh..] were never used (left untouched: no page faults) */
    int unused;    /* first slot released for reuse, chained through child[0][0]; -1: none */
    int64_t end;   /* current arena size */
    uint64_t visits; /* free blocks looked at, for plan_free_block_visits */
    int64_t live;    /* bytes taken and not given back */
} freelist;

/* An empty arena whose free blocks take `slots` (one per node suffices:
 * there are never more free blocks than released buffers). */
freelist freelist_empty(free_block *slots);
/* Best fit among free blocks; else grow the arena.  Returns the offset. */
int64_t freelist_take(freelist *f, int64_t size);
/* Release [offset, offset + size), merged with the free blocks it touches. */
void freelist_give(freelist *f, int64_t offset, int64_t size);
/* Add f's visits to this thread's count (plan_free_block_visits). */
void freelist_tally(const freelist *f);

/* ---- What the planner's passes share ----------------------------------------- */

/* What node t reads when it runs: its group's inputs for a fused root. */
static inline int reads(const spmd_tensor *t, const fusion *fu, const spmd_tensor *const **in)
{
    const fuse_group *grp = fusion_group(fu, t);
    *in = grp ? grp->in : (const spmd_tensor *const *)t->in;
    return grp ? grp->n_in : t->n_in;
}

/* Held outside the arena, with no step: a leaf, a view of one, a
 * gather read in place, or one that lands in place. */
static inline bool outside(const plan *p, const spmd_tensor *t)
{
    return ir_op_is_leaf(t->op) || p->view_of[t->id] >= 0 || p->gather_leaf[t->id] >= 0 ||
           p->lands_in[t->id] >= 0;
}

/* An elementwise step: a formula op, or a fused group's root. */
static inline bool elementwise(const spmd_tensor *t, const fusion *fu)
{
    return ir_op_formula_arity(t->op) > 0 || fusion_group(fu, t);
}

/* prod[i]: the step that writes node i's storage (a fused root's step
 * for its stored members; a view's, its storage's), -1 for none. */
void plan_step_of_storage(const plan *p, const spmd_graph *g, const fusion *fu, int *prod);

/* ---- The passes --------------------------------------------------------------- */

/* Before the steps are listed (plan_marks.c): gathers of shared leaves
 * read in place (mark_gathers), fusion's absorbed nodes dropped from
 * `needed`, slices that are views of leaves (mark_views), gathers that
 * land in place (mark_lands). */
void plan_mark_outside(plan *p, const spmd_graph *g, const fusion *fu, const plan_sharing *sh);
/* Once storage and the steps are known (plan_marks.c): accumulators'
 * sums and the update values that can be computed in place
 * (mark_in_place, mark_updates_in_place), update values in buffers of
 * their own (mark_swapped). */
spmd_status plan_mark_buffers(plan *p, const spmd_graph *g, const fusion *fu, const plan_sharing *sh);

/* The list schedule that moves collectives up to what they read
 * (plan_reorder.c). */
spmd_status plan_reorder(plan *p, const spmd_graph *g, const fusion *fu, const int64_t *priority);
/* Accumulators' sums moved up to their gradients (plan_hoist.c); *moved:
 * whether any moved. */
spmd_status plan_hoist_sums(plan *p, const spmd_graph *g, const fusion *fu, bool *moved);
/* When each collective in flight is handed over and waited for
 * (plan_inflight.c); written_in_place: per node id, an accumulator that
 * a sum writes in place. */
spmd_status plan_schedule_async(plan *p, const spmd_graph *g, const fusion *fu, int depth,
                                size_t budget_bytes, const bool *written_in_place);

#endif
