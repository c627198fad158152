/*
 * The partitioner (docs/DESIGN.md, "Partition" and "Reshard"): turns a global
 * program and its propagated shardings into one per-device program, the
 * same for every device (shapes are the padded local blocks), with the
 * collectives inserted where an operand's sharding is not what its op
 * needs.  Pending sums are resolved only where a consumer needs the value
 * whole (all-reduce) or sharded (reduce-scatter).
 */
#ifndef SPMD_SHARD_PARTITION_H
#define SPMD_SHARD_PARTITION_H

#include "shard/propagate.h"

typedef enum part_phase { PART_FORWARD = 0, PART_BACKWARD, PART_UPDATE } part_phase;

/* One collective of the per-device program, for reports. */
typedef struct part_collective {
    ir_op kind;          /* IR_ALL_REDUCE, IR_ALL_GATHER, ... */
    mesh_axes axes;
    int64_t bytes;       /* per device: the larger of its input and output */
    double seconds;      /* estimated by the alpha-beta model */
    part_phase phase;
    int tensor;          /* global node id of the value moved */
    int consumer;        /* global node id of the op that needed it (-1: output) */
    int node;            /* local node id of the collective (the executor's trace) */
    spmd_dtype dtype;    /* what it moves: a gradient's f32 sum reduced in bf16 moves bf16 */
} part_collective;

/* One stage transfer of the per-device program, for reports: the global
 * node and the local node that runs it (docs/DESIGN.md, "Pipeline
 * stages"). */
typedef struct part_transfer {
    int tensor, node;
} part_transfer;

/* A whole-tensor gather forced by an op that cannot use a sharding. */
typedef struct part_fallback {
    int tensor, consumer;
} part_fallback;

typedef struct partition {
    const spmd_graph *g;
    const spmd_mesh *m;
    shard_plan prop;
    spmd_graph *local;      /* the per-device program */
    /* Per global node id: the local tensor that holds it and the sharding
     * it holds (outputs and leaves: resolved, no pending sums); held[i] is
     * set only where local_of[i] is not NULL. */
    spmd_tensor **local_of;
    sharding *held;
    mesh_axes *specs;       /* groups used by collectives, indexed by attr.coll.spec */
    int n_specs, cap_specs;
    part_collective *colls;
    int n_colls, cap_colls;
    part_fallback *fallbacks;
    int n_fallbacks, cap_fallbacks;
    part_transfer *transfers;
    int n_transfers, cap_transfers;
    spmd_allocator alloc;
} partition;

spmd_status partition_build(partition *p, const spmd_graph *g, const spmd_mesh *m,
                            const bool *needed, const spmd_allocator *alloc);
void partition_free(partition *p);
part_phase partition_phase(const spmd_graph *g, int node);
const char *partition_phase_name(part_phase phase);
/* A collective's kind as reports spell it ("all-gather", as NCCL and XLA
 * do), other ops by their IR name. */
const char *partition_collective_name(ir_op kind);
/* Whether ops.def names a partition fixup for `op` (its local form
 * differs from the global one: heads, rescaled means, padded rows). */
bool partition_has_fixup(ir_op op);

#endif
