/*
 * The executor runs a compiled program (compile/compiled.h) on one device
 * or, when the graph carries sharding marks, on every device of the mesh.
 * This header is internal to it: the program and its devices, and what
 * the executor's files share (executor.h is the layer's interface).
 *
 * A multi-device program is the partitioner's per-device graph, run by
 * one worker per device (threads of this process) with shared-memory
 * collectives between them; over MPI, each process runs only its own
 * devices (a contiguous run of mesh positions) and the collectives cross
 * processes where groups do.  Each device owns its arena and the blocks
 * of the inputs, parameters and state it holds; the user reads and writes
 * whole (global) tensors, which the program splits and assembles.  Every
 * device runs its schedule on its own thread pool, every thread on every
 * node (kernels split work by thread index), with a barrier between
 * nodes.
 *
 * The program borrows its graph and mesh: both must outlive it.
 *
 * The files, one concept each: executor_program.c (spmd_compile and
 * spmd_program_free), executor_devices.c (setting devices up),
 * executor_blocks.c (a device's block of a global tensor),
 * executor_init.c (parameter initialisation), executor_inflight.c
 * (collectives in flight), executor_run.c (a run), executor_update.c (its
 * update phase), executor_accumulate.c (gradient accumulation),
 * executor_io.c (data in and out), executor_processes.c (reading across
 * processes), executor_checkpoint.c (blocks for checkpoints),
 * executor_report.c (reports) and executor_timeline.c (the timeline).
 * Functions shared among them take the exec_ prefix (executor_: the
 * interface).
 */
#ifndef SPMD_RUNTIME_EXECUTOR_IMPL_H
#define SPMD_RUNTIME_EXECUTOR_IMPL_H

#include "runtime/collectives/collectives.h"
#include "runtime/executor.h"
#include "runtime/kernels/kernels.h"
#include "runtime/pool.h"
#include "runtime/wait.h"

#include <pthread.h>
#include <time.h>

typedef struct device device;

/* A device's communication thread (docs/DESIGN.md, "Runtime"): it runs the
 * collectives the plan puts in flight (plan.n_async), one at a time, in
 * the order thread 0 hands them over, which is the schedule's on every
 * device.  `issued` and `done` count hand-overs and completions since
 * the program began; a run's k-th collective is number base + k. */
typedef struct dev_comm {
    _Alignas(64) rt_wait_word issued; /* bumped by thread 0 per hand-over (and to stop) */
    _Alignas(64) rt_wait_word done;   /* bumped by the thread per collective run */
    _Alignas(64) _Atomic bool quit;
    rt_waiter idle;                   /* the thread waiting for work */
    rt_waiter busy;                   /* compute threads waiting for a result */
    device *d;
    int *queue;                       /* [n_async]: async index of number seq, at seq % n_async */
    _Atomic int *status;              /* [n_async]: each one's outcome in the latest run */
    _Atomic bool failed;              /* a collective failed this run: `message` says why */
    char message[512];
    uint32_t base;                    /* `done` when the run began (set before it) */
    pthread_t thread;
    bool started;
} dev_comm;

struct device {
    struct spmd_program *prog;
    int id;                   /* device id in the mesh */
    int copy;                 /* its copy (independent mesh axes), 0 without */
    uint64_t seed;            /* its copy's initialisation seed */
    rt_pool *pool;
    unsigned char *arena;
    unsigned char *scratch;   /* nth slices of scratch_each bytes */
    void **leaf_data;         /* per local node id: inputs, params, state (NULL: another stage's) */
    size_t allocated;         /* bytes held for this device alone (not shared buffers) */
    /* Per local node id, for a view of a leaf (plan.view_of) or a gather
     * read in place (plan.gather_leaf): where it starts, in bytes from
     * where this device's block of the leaf lies (a gather's is before
     * it: the first block of the shared buffer); NULL without either. */
    ptrdiff_t *view_offset;
    /* Per local node id, for a leaf in a shared buffer (program.share_as):
     * this device's rank among the devices holding the same block, which
     * says the part it initialises and copies an update into. */
    int *share_rank;
    kern_device kd;
    coll_group **groups;      /* per spec */
    int *member;              /* per spec */
    coll_group **stage_pairs; /* kern_device.pairs; NULL without a stage axis */
    /* First failure of the current run, one word per step parity and one
     * for the steps thread 0 runs alone (see run_worker); at most one of
     * them is set in a run. */
    _Atomic int status[3];
    char message[512];
    /* While tracing: this run's row of trace.times, written by thread 0
     * (see run_worker) and, for collectives in flight, the communication
     * thread; NULL otherwise. */
    int64_t *trace_row;
    dev_comm *comm;             /* NULL when no collective runs in flight */
};

/* The timeline (spmd_program_trace_begin): per traced run and device a
 * row of trace_stride() clock readings (nanoseconds since `origin`):
 * thread 0's start of the schedule, then per step the end of its share
 * and the end of the step's barrier, then the update's start and end,
 * then per collective in flight four (inflight_slot). */
typedef struct trace {
    bool on;
    int room, runs;           /* rows for `room` runs; `runs` recorded */
    int64_t origin;
    int64_t *times;           /* [run][local device][stride] */
    int64_t *run_begin, *run_end; /* per run, the caller's thread */
    bool *micro;              /* per run: a micro-batch */
    int *micro_steps, n_micro_steps; /* the steps a micro-batch runs */
    int *collective;          /* per local node id: its collective's index, or -1 */
} trace;

/* Where the plan's collectives in flight are handed over and waited for,
 * shared by the devices: waits at step s are wait_list[wait_off[s] ..
 * wait_off[s + 1]) (s = n_steps: at the end); a micro-batch runs only
 * some, and micro_rank[k] numbers those. */
typedef struct inflight {
    int *wait_off, *wait_list;
    int *micro_rank;
    int n_micro;
} inflight;

struct spmd_program {
    spmd_allocator alloc;
    compiled c;               /* what every device runs, and its sizes */
    device *dev;              /* this process's devices; NULL for a plan-only program */
    int first, n_local;       /* dev[k] is the device at mesh position first + k */
    int process, processes;   /* this process's index among those running the mesh */
    int copies;               /* independent models (spmd_mesh_copies), 1 without */
    size_t allocated;         /* bytes held for this process's devices */
    /* Leaves held once per copy (compiled.share_blocks, docs/DESIGN.md,
     * "Shared parameters"): per local node, the leaf whose buffer layout
     * it takes (itself; for an update value that trades buffers with a
     * shared leaf, its target), else -1; NULL where nothing is shared.
     * Their buffers, freed once. */
    int *share_as;
    void **shared_bufs;
    int n_shared_bufs;
    rt_pool *outer;           /* one thread per device here */
    coll_world *world;
    uint64_t seed;
    bool blas_loaded;         /* BLAS is loaded on the first run */
    /* Per global node id and copy ([id * copies + copy]): whether
     * set_input has filled that input of that copy since compile.  A run
     * refuses an input never set rather than compute on zeros. */
    bool *input_set;
    bool inputs_checked; /* every read input was set once: an input stays set */
    /* Per global node id and copy, as input_set: whether that leaf of that
     * copy still waits for its initial value (exec_init_pending); NULL
     * once none does. */
    bool *init_pending;
    /* Gradient accumulation: micro-batches run since the last step's
     * update (spmd_program_accumulate), and whether the run under way is
     * one of them. */
    int micro_done;
    bool micro_run;
    trace trace;
    inflight fly;
};


/* Whether device d runs node t, or holds t's value where t is a leaf or
 * an output (docs/DESIGN.md, "Pipeline stages"): every node without a
 * stage axis; with one, the nodes of its stage and those placed on none,
 * and a transfer on the two devices it joins. */
static inline bool exec_on_stage(const device *d, const spmd_tensor *t)
{
    int s = d->kd.stage;
    if (!d->stage_pairs || t->stage < 0) return true;
    if (t->op == IR_STAGE_TRANSFER) return s == t->attr.stage.from || s == t->attr.stage.to;
    return t->stage == s;
}

static inline void *data_of(const device *d, const spmd_tensor *t)
{
    /* Leaves, update values in buffers of their own (plan.swapped), and
     * accumulators' sums, in the accumulator's (plan.in_place).  A view
     * reads its leaf's buffer as it is now (a swap after a step moves it). */
    const plan *pl = &d->prog->c.plan;
    if (ir_op_is_leaf(t->op) || pl->swapped[t->id]) return d->leaf_data[t->id];
    if (pl->in_place[t->id] >= 0) return d->leaf_data[pl->in_place[t->id]];
    if (pl->view_of[t->id] >= 0) return (char *)d->leaf_data[pl->view_of[t->id]] + d->view_offset[t->id];
    if (pl->gather_leaf[t->id] >= 0)
        return (char *)d->leaf_data[pl->gather_leaf[t->id]] + d->view_offset[t->id];
    return d->arena + pl->offset[t->id];
}

/* ---- Blocks (executor_blocks.c) --------------------------------------------------- */

/* Where device d's block of global tensor t lies, per dim.  The block
 * holds ldims elements; local index i (counted from `first`, so that a
 * part of the block can be visited) is element j = first + i of the
 * block, which is padding from `valid` on, else global index
 * (j / group) * group_stride + start + j % group: a plain split is one
 * group, a grouped one (mesh.h) a run of `group` elements in each. */
typedef struct block {
    int rank;
    int64_t gdims[SPMD_MAX_RANK], ldims[SPMD_MAX_RANK], start[SPMD_MAX_RANK],
        valid[SPMD_MAX_RANK], first[SPMD_MAX_RANK], group[SPMD_MAX_RANK],
        group_stride[SPMD_MAX_RANK];
} block;

/* Device dev's block of global tensor t. */
block exec_block_of(const spmd_program *p, const spmd_tensor *t, int dev);
/* Global index of the block's local element i along dim d; -1: padding. */
int64_t exec_block_global(const block *b, int d, int64_t i);

/* Visit the block's rows along the last dim in runs of consecutive global
 * elements: fn(local offset, global offset, real elements, padding
 * elements), offsets in elements. */
typedef void (*row_fn)(void *ctx, int64_t local, int64_t global, int64_t n, int64_t pad);
void exec_for_rows(const block *b, row_fn fn, void *ctx);

/* A row_fn copying between a block (local) and a whole tensor (global). */
typedef struct copy_ctx {
    char *local;
    char *global;
    size_t es;
    bool to_local;
} copy_ctx;
void exec_copy_row(void *ctx, int64_t local, int64_t global, int64_t n, int64_t pad);

/* Global tensor t at `src` into this process's blocks of copy `copy`
 * (-1: of every copy). */
void exec_scatter(spmd_program *p, const spmd_tensor *t, const void *src, int copy);
/* This process's blocks of copy `copy` of t into the whole tensor at `dst`. */
void exec_assemble(const spmd_program *p, const spmd_tensor *t, void *dst, int copy);
/* Whether some of t's blocks live only in other processes
 * (executor_processes.c); then exec_assemble_across reads it. */
bool exec_spread_over_processes(const spmd_program *p, const spmd_tensor *t);
spmd_status exec_assemble_across(const spmd_program *p, const spmd_tensor *t, void *dst, int copy);

/* ---- Setting up and freeing (executor_devices.c, executor_init.c) --------------- */

/* This process's devices, after compile: refused up front where the
 * address space cannot hold them; their buffers, pools and groups. */
spmd_status exec_setup_devices(spmd_program *p, const spmd_compile_options *opts);
/* Every device's buffers, communication thread and pool. */
void exec_free_devices(spmd_program *p);
/* Every leaf of every copy marked for its initial value, filled when
 * first needed (exec_init_pending): a leaf the caller writes whole before
 * then (a loaded model, a checkpoint) never draws its random values. */
spmd_status exec_init_params(spmd_program *p);
/* The leaves still marked, to their initial values (parameters and state)
 * or zeros (the others), every device's threads a share of its blocks;
 * before anything reads a leaf: a run, a read, a checkpoint's block. */
void exec_init_pending(const spmd_program *p);
/* Leaf t of copy `copy` (-1: of every copy) was written whole. */
void exec_note_leaf_written(spmd_program *p, const spmd_tensor *t, int copy);

/* ---- Collectives in flight (executor_inflight.c) ---------------------------------- */

/* Device d's communication thread, started; stopped (joined) and freed. */
spmd_status exec_comm_start(spmd_program *p, device *d);
void exec_comm_stop(spmd_program *p, device *d);
/* The wait lists by step, and the micro-batch's numbering. */
spmd_status exec_inflight_build(spmd_program *p);
void exec_inflight_free(spmd_program *p);
/* Every thread of device d before step s (n_steps: the end): wait for the
 * collectives in flight whose results step s is the first to read.
 * False when one of them failed (thread 0 then holds its message in the
 * status word `status`, for the step to fail). */
bool exec_inflight_wait(device *d, int s, int ith, _Atomic int *status);
/* Thread 0: hand over async collective k (its operand is written). */
void exec_inflight_issue(device *d, int k, uint32_t *issued);
/* Thread 0, before the device's schedule returns: every collective it
 * handed over has finished, so no peer reads a buffer of this device
 * after the run (after an abort they fail at once). */
void exec_inflight_drain(device *d, uint32_t issued);

/* The trace slots of async collective k in a device's row: the thread's
 * start and end, thread 0's wait's start and end. */
static inline size_t inflight_slot(const spmd_program *p, int k)
{
    return 2 * (size_t)p->c.plan.n_steps + 3 + 4 * (size_t)k;
}

/* Async collective k's number in this run, or -1 when the run skips it. */
static inline int inflight_rank(const spmd_program *p, int k)
{
    return p->micro_run ? p->fly.micro_rank[k] : k;
}

/* ---- Runs (executor_run.c, executor_update.c, executor_io.c) ------------------------ */

/* One run: a whole step, or a micro-batch (p->micro_run). */
spmd_status exec_run(spmd_program *p);
/* The update phase of a run every device finished. */
void exec_update(spmd_program *p);
/* Input t of copy `copy` (-1: of every copy) was set. */
void exec_note_input_set(spmd_program *p, const spmd_tensor *t, int copy);

/* ---- The timeline (executor_timeline.c) ------------------------------------------- */

/* Its clock: nanoseconds, monotonic; trace_clock counts from the start of
 * tracing. */
static inline int64_t clock_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static inline int64_t trace_clock(const spmd_program *p) { return clock_ns() - p->trace.origin; }

/* Clock readings per traced run and device (see trace). */
static inline size_t trace_stride(const spmd_program *p)
{
    return 2 * (size_t)p->c.plan.n_steps + 3 + 4 * (size_t)p->c.plan.n_async;
}

/* The timeline's buffers freed, tracing off. */
void exec_trace_free(spmd_program *p);

#endif
