/*
 * Fusion of elementwise chains (docs/DESIGN.md, "Fusion"): a group of
 * elementwise nodes of one shape, each read only by the next ones in the
 * group, runs as one pass over memory: its members are computed block by
 * block in a thread's scratch, and only the group's root, the last member,
 * is written out, and the members stored besides it: an update's value
 * (the AdamW moments) read by nothing else in the graph.  The graph is not
 * changed: the schedule skips the absorbed and stored members (the plan
 * gives the absorbed no memory) and gives the root the group's external
 * inputs; the executor runs the root with kern_fused.
 *
 * Every member computes each element with the same arithmetic as its own
 * kernel, so a fused program gives the unfused program's bits.
 */
#ifndef SPMD_COMPILE_FUSE_H
#define SPMD_COMPILE_FUSE_H

#include "ir/ir.h"

/* Elements a fused group computes at a time, per member, in scratch
 * (fusion_block): FUSE_BLOCK, or FUSE_BLOCK_LARGE over a domain of at
 * least FUSE_LARGE elements, where a member's call and dispatch would
 * otherwise cost a tenth of its loop (AdamW's group is about 15 members
 * over every parameter) and the larger blocks still stay in L2; small
 * groups keep small scratch.  Both are multiples of the sum's lanes.  The
 * scratch is sized for fusion_block; a large group of many members (the
 * update's) may run in FUSE_BLOCK blocks within it, whichever the process
 * measures faster (kernels_fused.c, tune_block). */
enum {
    FUSE_BLOCK = 256,
    FUSE_BLOCK_LARGE = 1024,
    FUSE_LARGE = 1 << 16,
    FUSE_MAX_MEMBERS = 32,
    FUSE_MAX_STORED = 4
};

/* One member: op over operands that are earlier members (>= 0, their
 * index) or the group's external inputs (-1 - k for input k). */
typedef struct fuse_step {
    ir_op op;
    int8_t src[3];
    int8_t stored; /* also written to the group's stored member of this index; -1: not */
    float c;       /* a unary formula's constant: the node's attr.scale.c (ops.def) */
} fuse_step;

typedef struct fuse_group {
    const spmd_tensor *root;
    /* The elements the members compute: the root itself, or, for a sum
     * root (`sum`), its operand.  A sum root adds up every element of its
     * operand into one (a scalar: the gradient norm's sums of squares),
     * on one thread in kern_sum's order, so its operand chain is computed
     * block by block and never written. */
    const spmd_tensor *domain;
    bool sum;
    int n_steps;                         /* members, in topological order; the last is the root */
    fuse_step steps[FUSE_MAX_MEMBERS];
    int n_in;                            /* external inputs */
    const spmd_tensor *in[IR_MAX_INPUTS];
    int64_t in_numel[IR_MAX_INPUTS];     /* the domain's numel, or a trailing block of it (broadcast) */
    int n_stored;                        /* members written besides the root */
    const spmd_tensor *stored[FUSE_MAX_STORED];
} fuse_group;

typedef struct fusion {
    spmd_allocator alloc;
    int n_groups;
    fuse_group *groups;
    int *group_of;  /* per node id: its group's index if it is a root, else -1 */
    bool *absorbed; /* per node id: computed inside a group, never on its own, no memory */
    bool *stored;   /* per node id: computed inside a group, never on its own, in memory */
} fusion;

/* Find the groups of graph g among the `needed` nodes (plan_mark_needed);
 * groups of one member are not made.  With `micro` (per node, what a
 * micro-batch runs: compiled.h; NULL: no accumulation) a group's members
 * are all in it or all out, so a micro-batch runs whole groups.
 * Allocates; fusion_free frees. */
spmd_status fusion_build(fusion *f, const spmd_graph *g, const bool *needed, const bool *micro,
                         const spmd_allocator *alloc);
void fusion_free(fusion *f);
/* The group node t is the root of, or NULL. */
const fuse_group *fusion_group(const fusion *f, const spmd_tensor *t);
/* Elements per block of g's scratch, and of its kernel but where the
 * kernel measures (see FUSE_BLOCK). */
int fusion_block(const fuse_group *g);
/* Scratch per thread a group's kernel needs: a block per member and one
 * per operand of its widest formula for broadcast operands (two, or three
 * with a where). */
size_t fusion_scratch_bytes(const fuse_group *g);

#endif
