/*
 * Schedule and memory plan for one device's program.
 *
 * The schedule is the creation order (a topological order) restricted to
 * the nodes that outputs and updates need.  The memory plan gives every
 * computed tensor an offset in one arena, reusing a buffer once its last
 * reader has run; a reshape of a computed tensor shares its input's buffer.
 * An update's value (not an output, for one update) lives outside the
 * arena in a buffer of its own: the executor swaps it with its target's
 * after a step instead of copying; a gradient accumulator's is computed
 * in place.
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
    bool *swapped;        /* per node id: an update value in a buffer of its own (offset -1) */
    /* Per node id: for a gradient accumulator's new value, computed into
     * the accumulator's own buffer (an elementwise op: each element read
     * before it is written), the accumulator's node id; else -1.  No
     * arena, no second buffer, nothing to trade after a run. */
    int *in_place;
    size_t arena_bytes;
    size_t swapped_bytes; /* the bytes of those buffers */
    /* Arena bytes live as the backward pass begins (the graph's
     * backward_begin; 0 without one): the activations the forward pass
     * keeps for the backward, and the loss. */
    size_t held_bytes;
} plan;

/* Set needed[i] (n_nodes entries, false on entry) for every node that an
 * output or an update reads, directly or not: the schedule's nodes and
 * the leaves they read. */
void plan_mark_needed(const spmd_graph *g, bool *needed);
/* Plan graph g, with fusion f (NULL: none): an absorbed node has no step
 * and no memory, and a group's root reads the group's inputs.  SPMD_OK
 * or an error with a message. */
spmd_status plan_build(plan *p, const spmd_graph *g, const spmd_allocator *alloc, const fusion *f);
void plan_free(plan *p);
/* Free blocks the memory planner looked at on this thread, in all (a test
 * hook: per step placed it grows with the log of the free list's length,
 * where a scan of the list made planning quadratic in the model's depth). */
uint64_t plan_free_block_visits(void);

#endif
