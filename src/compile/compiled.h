/*
 * A compiled program (docs/DESIGN.md, "Layers" and "Schedule and memory
 * plan"): a graph turned into what every device runs, with nothing
 * allocated for running it.  The runtime executes one; reports (`spmd
 * explain`) read one.  Planning is kept apart from running as ggml keeps
 * ggml_graph_plan apart from ggml_graph_compute, so a plan-only compile
 * needs no devices, no threads and no BLAS.
 *
 * On one device the local program is the user's graph itself; with a mesh
 * (the graph's sharding marks) it is the partitioner's per-device graph,
 * the same for every device.
 */
#ifndef SPMD_COMPILE_COMPILED_H
#define SPMD_COMPILE_COMPILED_H

#include "compile/plan.h"
#include "shard/partition.h"

/* Query rows the attention kernels take at a time: their scratch is this
 * many rows of scores per thread. */
enum { COMPILE_ATTN_BLOCK = 64 };

typedef struct compiled {
    spmd_allocator alloc;
    const spmd_graph *g;      /* the user's graph (borrowed) */
    const spmd_mesh *mesh;    /* the marks' mesh; NULL on one device */
    bool partitioned;
    partition part;           /* partitioned only */
    const spmd_graph *local;  /* what every device runs */
    fusion fusion;            /* elementwise groups of `local` run as one pass */
    plan plan;                /* schedule and memory plan of `local` */
    int n_dev;                /* devices */
    int nth;                  /* compute threads per device (of this process) */
    size_t scratch_each;      /* kernel scratch per thread, 64-byte multiple */
    size_t persistent_bytes;  /* parameters and state, every stage's (compiled_persistent_bytes: per device) */
    size_t input_bytes;       /* per device: input blocks */
    /* Gradient accumulation (local->accumulate_steps > 1): per local node
     * id, whether a micro-batch that is not a step's last runs it (the
     * forward and backward pass and the sums into the accumulators, not
     * the update); NULL without accumulation. */
    bool *micro;
    /* Parameters and state held once per copy where every device is in
     * this process (docs/DESIGN.md, "Shared parameters"): per local node
     * and per collective spec, plan_sharing's arrays (plan.h); NULL where
     * nothing is shared. */
    int *share_blocks, *sharers, *group_size;
} compiled;

/* How compile_graph compiles (spmd_compile_options, read by the runtime,
 * which knows how many devices this process runs). */
typedef struct compile_options {
    int threads;           /* compute threads in all; 0: every core */
    int devices_here;      /* the devices this process runs, which share the
                            * threads; 0: every device of the mesh */
    bool fuse;             /* fuse elementwise chains (fuse.h) */
    /* On a mesh, run collectives in flight while the device computes
     * (plan.h: PLAN_OVERLAP_DEPTH at once), their operands and results
     * at most `inflight_bytes` at once (0: SPMD_INFLIGHT_MIB MiB). */
    bool overlap;
    size_t inflight_bytes;
    /* On a stage axis: the 1F1B schedule (stages.h), else GPipe's. */
    bool one_f_one_b;
} compile_options;

/* Partition graph g (with a mesh), fuse and plan it as `opts` says.
 * Records every tensor's sharding on g, for spmd_get_sharding.  Errors:
 * bf16 where no kernel takes it, marks on another mesh, and whatever
 * partitioning and planning report. */
spmd_status compile_graph(compiled *c, spmd_graph *g, const compile_options *opts);
void compiled_free(compiled *c);
/* A test hook: with false, the programs this thread compiles hold every
 * leaf in each device's own buffer (no gather read in place, no update
 * landing in place), for comparing bits; true by default. */
void compile_test_sharing(bool on);

/* The local node that holds global node t (leaves and outputs), or NULL
 * when the program does not keep it. */
const spmd_tensor *compiled_local(const compiled *c, const spmd_tensor *t);
/* The sharding a kept global node is held with (replicated on one device). */
sharding compiled_held(const compiled *c, const spmd_tensor *t);

/* Per-thread scratch bytes that node t's kernel needs (0 for most). */
size_t compile_scratch_bytes(const spmd_tensor *t);

/* Per device: persistent + inputs + activation arena + update values in
 * buffers of their own + scratch; on pipeline stages, the most of any
 * stage's device. */
size_t compiled_peak_bytes(const compiled *c);
/* The arena bytes a device of `stage` allocates: the common region and
 * its stage's (plan.c; -1, or without stages: the whole arena). */
size_t compiled_stage_arena_bytes(const compiled *c, int stage);
/* Per device: parameters and state, and parameters alone (not state); on
 * pipeline stages, those of the stage holding the most. */
size_t compiled_persistent_bytes(const compiled *c);
size_t compiled_param_bytes(const compiled *c);

#endif
