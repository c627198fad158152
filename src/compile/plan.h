/*
 * Schedule and memory plan for one device's program.
 *
 * The schedule is the creation order (a topological order) restricted to
 * the nodes that outputs and updates need; with collectives in flight
 * (plan_build_overlap) a gradient's reduction and the elementwise steps
 * feeding it move up to just after the gradient, and so does a gradient
 * accumulator's sum, always.  The memory plan gives every
 * computed tensor an offset in one arena, reusing a buffer once its last
 * reader has run; a reshape of a computed tensor shares its input's buffer.
 * An update's value (not an output, for one update) lives outside the
 * arena in a buffer of its own: the executor swaps it with its target's
 * after a step instead of copying (but in an accumulating program); a
 * gradient accumulator's is computed in place.  A slice of a parameter
 * or state that is one run of its bytes is a view of it, no step.
 */
#ifndef SPMD_COMPILE_PLAN_H
#define SPMD_COMPILE_PLAN_H

#include "compile/fuse.h"
#include "ir/ir.h"

typedef struct plan {
    spmd_allocator alloc;
    int n_nodes;          /* graph size when planned */
    spmd_tensor **steps;  /* computed nodes in execution order */
    int n_steps;
    bool *needed;         /* per node id */
    int *storage;         /* per node id: node whose bytes it uses (itself, or a reshape's source) */
    int64_t *offset;      /* per node id: arena offset of its storage, -1 for leaves */
    /* Per node id: an update value in a buffer of its own (offset -1), or
     * the slice a gather that lands in place writes (lands_in), in its
     * target's next buffer. */
    bool *swapped;
    /* Per node id: for a gradient accumulator's new value, computed into
     * the accumulator's own buffer (an elementwise op: each element read
     * before it is written), the accumulator's node id; else -1.  No
     * arena, no second buffer, nothing to trade after a run. */
    int *in_place;
    /* Per node id: for a slice that is a view of a parameter or state
     * (one run of its bytes, written only after the run: mark_views in
     * plan_marks.c), the leaf's node id; else -1.  No step, no arena: the
     * executor reads the leaf's buffer at the device's block. */
    int *view_of;
    int n_views;
    /* Per node id: for an all-gather of a shared parameter read in place
     * (its result is the parameter's buffer: mark_gathers in
     * plan_marks.c), the parameter's node id; else -1.  No step, no
     * arena. */
    int *gather_leaf;
    int n_gathers_in_place;
    /* Per node id: for an update's value that is an all-gather into a
     * shared parameter or state (mark_lands in plan_marks.c), the
     * target's node id; else -1.  No step, no arena: each member's
     * operand, which lives to the end, goes into its part of the target's
     * buffer in the update phase, copied, or (swapped) computed into the
     * target's next buffer that the update phase trades with the
     * target's. */
    int *lands_in;
    int n_lands;
    size_t arena_bytes;
    /* With stages, per stage: the arena a device of it holds, the common
     * region and its stage's (plan.c, "regions"); n_stage_arenas 0 and
     * NULL without. */
    int n_stage_arenas;
    size_t *stage_arena_bytes;
    size_t swapped_bytes; /* the bytes of those buffers */
    /* Collectives in flight (docs/DESIGN.md, "Schedule and memory plan"):
     * n_async collectives run on the device's communication thread, in
     * schedule order; async k is step async_step[k], handed over before
     * step start_at[k] runs and waited for before step wait_at[k] runs
     * (n_steps: at the schedule's end), start_at[k] < wait_at[k].  Per
     * step, its index k or -1 (a step of its own).  The arena keeps each
     * one's operand and result from start to wait. */
    int n_async;
    int *async_step, *start_at, *wait_at;
    int *async_of;         /* per step */
    int overlap_depth;     /* at most this many in flight at once; 0: none */
    /* And at most this many operand and result bytes (0 without overlap):
     * a collective of more stays a step of its own. */
    size_t inflight_budget;
    size_t serial_arena_bytes; /* the arena with every collective a step of its own */
    size_t inflight_bytes; /* most operand and result bytes in flight at once */
    /* Arena bytes live as the backward pass begins (the graph's
     * backward_begin; 0 without one): the activations the forward pass
     * keeps for the backward, and the loss. */
    size_t held_bytes;
} plan;

/* Collectives in flight at once, at most (a cap beside the byte budget):
 * the next layer's all-gather while this one computes, or a gradient's
 * reduction while the next gradient is computed. */
enum { PLAN_OVERLAP_DEPTH = 4 };

/* Set needed[i] (n_nodes entries, false on entry) for every node that an
 * output or an update reads, directly or not: the schedule's nodes and
 * the leaves they read. */
void plan_mark_needed(const spmd_graph *g, bool *needed);
/* Parameters and state held once per process (docs/DESIGN.md, "Shared
 * parameters"), per node id of the local graph: `blocks`, for a leaf whose
 * devices' blocks lie side by side in one buffer per copy, the number of
 * blocks (1: whole), else 0; `sharers`, the devices holding each block.
 * `group_size`: per collective spec, its group's devices. */
typedef struct plan_sharing {
    const int *blocks, *sharers, *group_size;
} plan_sharing;
/* Plan graph g, with fusion f (NULL: none): an absorbed node has no step
 * and no memory, and a group's root reads the group's inputs.  SPMD_OK
 * or an error with a message. */
spmd_status plan_build(plan *p, const spmd_graph *g, const spmd_allocator *alloc, const fusion *f);
/* The same, with up to `depth` collectives in flight (0: every
 * collective a step of its own, as plan_build), their operands and
 * results at most `budget` bytes at once; with `sharing` (NULL: none)
 * gathers of shared leaves are read in place and updates' gathers into
 * them land in place; with `stages` (NULL: none) the program's stages
 * are planned as that says. */
typedef struct plan_stages {
    /* Per node id (NULL: none): the schedule takes, of the steps ready,
     * the smallest first, then the earliest made (the 1F1B order,
     * stages.h). */
    const int64_t *priority;
} plan_stages;
spmd_status plan_build_overlap(plan *p, const spmd_graph *g, const spmd_allocator *alloc,
                               const fusion *f, int depth, size_t budget, const plan_sharing *sharing,
                               const plan_stages *stages);
void plan_free(plan *p);
/* Free blocks the memory planner looked at on this thread, in all (a test
 * hook: per step placed it grows with the log of the free list's length,
 * where a scan of the list made planning quadratic in the model's depth). */
uint64_t plan_free_block_visits(void);
/* A test hook: with false, the plans this thread builds copy every slice
 * as before views (plan.view_of all -1), for comparing bits; true by
 * default. */
void plan_test_views(bool on);
/* A test hook: with false, the plans this thread builds give every
 * update value but an accumulator's sum a buffer of its own, traded in
 * after the run (plan.swapped), as before values were computed in place;
 * true by default. */
void plan_test_updates_in_place(bool on);

#endif
