/*
 * Sharding propagation (docs/DESIGN.md, "Propagate" and "Priorities").
 *
 * Every op's sharding is decided over its iteration dimensions: each
 * iteration dimension takes an ordered list of mesh axes (or none), each
 * axis at most once per op.  The output's sharding is the projection of
 * that choice onto the output's dims, partial over the axes of sharded SUM
 * dimensions (and over partial axes a linear op lets through).  Each
 * operand is resharded to the projection onto its dims.
 *
 * The choice, op by op in program order, takes operands in this order:
 * values that flow from the inputs (activations, data) before values that
 * flow only from parameters; within each, user marks first; then the one
 * whose split leaves the op less to sum (axes on summed dims no other
 * operand splits alike); then the one that would cost more to move (the
 * alpha-beta model of cost.h), then the larger tensor; then operand
 * position.  An operand whose axes clash with axes already taken is
 * resharded where it is used.  A backward sweep gives unmarked leaves the
 * sharding their consumers imply, and the two sweeps repeat to a fixpoint,
 * at most SHARD_ROUNDS times.  Nothing depends on hashes or pointers.
 */
#ifndef SPMD_SHARD_PROPAGATE_H
#define SPMD_SHARD_PROPAGATE_H

#include "ir/ir.h"
#include "mesh/sharding.h"

typedef enum shard_level {
    SHARD_UNKNOWN = 0,
    SHARD_INFERRED, /* given to an unmarked leaf by its consumers */
    SHARD_DERIVED,  /* computed from the operands */
    SHARD_MARKED    /* the user's mark: never changed */
} shard_level;

/* Per node, kept small: a deep model has hundreds of thousands of nodes. */
typedef struct shard_node {
    sharding out;                    /* the sharding the node produces */
    uint8_t level;                   /* shard_level */
    bool data;                       /* flows from an input */
    /* The op's dimension signature, one copy shared by all nodes that have
     * the same (the layers of a model repeat a few); NULL when the op has
     * none and an explicit rule (reshape). */
    const ir_dimsig *sig;
    mesh_axes *iter;                 /* the op's choice per iteration dim: sig->n_iter */
    uint32_t through;                /* partial axes the op lets through */
    uint32_t through_operands;       /* bit j: operand j stays partial */
    int swept, swept_by;             /* a leaf: the backward sweep (1, 2, ..) that set it, and the consumer */
} shard_node;

/* The most rounds of the two sweeps.  Each round carries a sharding one
 * leaf further along a chain of unmarked leaves (a leaf whose first
 * consumer also reads an earlier leaf), and real models settle in a few;
 * a plan that has not settled by then is still valid (what is unknown is
 * replicated) and is reported (shard_plan.settled). */
enum { SHARD_ROUNDS = 8 };

typedef struct shard_plan {
    const spmd_graph *g;
    const spmd_mesh *m;
    shard_node *nodes;               /* per node id */
    int n_nodes;
    int rounds;                      /* rounds of the two sweeps run */
    bool settled;                    /* the last round changed nothing */
    spmd_allocator alloc;
    base_arena arena;                /* the signatures and the iter arrays */
} shard_plan;

/* Decide every needed node's sharding.  `needed` is per node id (NULL:
 * all).  Errors: marks on a mesh other than m, a mark whose rank is not
 * the tensor's. */
spmd_status shard_propagate(shard_plan *p, const spmd_graph *g, const spmd_mesh *m,
                            const bool *needed, const spmd_allocator *alloc);
void shard_plan_free(shard_plan *p);

/* Can an iteration dim of `size` (blocks holding whole `granule`s when
 * > 0) be split over `axes`? */
bool shard_splittable(const spmd_mesh *m, const mesh_axes *axes, int64_t size, int64_t granule);

/* Ops without a dimension signature carry shardings by an explicit rule:
 * true when propagation has one for `op` (reshape). */
bool shard_has_explicit_rule(ir_op op);

/* The sharding node t's op produces (its mark may then ask for another). */
sharding shard_produced(const shard_plan *p, const spmd_tensor *t);
/* The sharding operand j of node t must have where t uses it. */
sharding shard_operand_need(const shard_plan *p, const spmd_tensor *t, int j);

#endif
