/*
 * The executor: runs a compiled program (compile/compiled.h) on one device
 * or, when the graph carries sharding marks, on every device of the mesh.
 *
 * A multi-device program is the partitioner's per-device graph, run by
 * one worker per device (threads of this process) with shared-memory
 * collectives between them; over MPI, each process runs only its own
 * devices (a contiguous run of mesh positions) and the collectives cross
 * processes where groups do.  Each device owns its arena and
 * the blocks of the inputs, parameters and state it holds; the user reads
 * and writes whole (global) tensors, which the program splits and
 * assembles.  Every device runs its schedule on its own thread pool,
 * every thread on every node (kernels split work by thread index), with a
 * barrier between nodes.
 *
 * The program borrows its graph and mesh: both must outlive it.
 */
#include "base/address_space.h"
#include "base/error.h"
#include "base/rng.h"
#include "compile/report.h"
#include "runtime/blas.h"
#include "runtime/collectives.h"
#include "runtime/executor.h"
#include "runtime/kernels.h"
#include "runtime/pool.h"
#include "runtime/wait.h"
#include "spmd/mesh.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

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
    void **leaf_data;         /* per local node id: inputs, params, state */
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
    /* Gradient accumulation: micro-batches run since the last step's
     * update (spmd_program_accumulate), and whether the run under way is
     * one of them. */
    int micro_done;
    bool micro_run;
    trace trace;
    inflight fly;
};

static bool is_persistent(const spmd_tensor *t) { return t->op == IR_PARAM || t->op == IR_STATE; }

static void *data_of(const device *d, const spmd_tensor *t)
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

/* ---- Blocks: a device's part of a global tensor ------------------------------------ */

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

static block block_of(const spmd_program *p, const spmd_tensor *t, int dev)
{
    block b = {.rank = t->rank};
    const spmd_tensor *lt = p->c.partitioned ? p->c.part.local_of[t->id] : t;
    for (int i = 0; i < t->rank; i++) {
        const sharding *held = p->c.partitioned ? &p->c.part.held[t->id] : NULL;
        int64_t groups = held ? mesh_axes_groups(&held->dim[i]) : 1;
        b.gdims[i] = t->dims[i];
        b.ldims[i] = lt->dims[i];
        b.group[i] = lt->dims[i] / groups;
        b.group_stride[i] = t->dims[i] / groups;
        b.start[i] = held ? sharding_block_index(held, p->c.mesh, i, dev) * b.group[i] : 0;
        int64_t v = groups > 1 ? b.ldims[i] : b.gdims[i] - b.start[i];
        b.valid[i] = v < 0 ? 0 : v > b.ldims[i] ? b.ldims[i] : v;
    }
    return b;
}

/* Global index of the block's local element i along dim d; -1: padding. */
static int64_t block_global(const block *b, int d, int64_t i)
{
    int64_t j = b->first[d] + i;
    if (j >= b->valid[d]) return -1;
    return j / b->group[d] * b->group_stride[d] + b->start[d] + j % b->group[d];
}

/* Visit the block's rows along the last dim in runs of consecutive global
 * elements: fn(local offset, global offset, real elements, padding
 * elements), offsets in elements. */
typedef void (*row_fn)(void *ctx, int64_t local, int64_t global, int64_t n, int64_t pad);

static void for_rows(const block *b, row_fn fn, void *ctx)
{
    int r = b->rank;
    if (r == 0) {
        fn(ctx, 0, 0, 1, 0);
        return;
    }
    int64_t rows = 1;
    for (int i = 0; i < r - 1; i++) rows *= b->ldims[i];
    int64_t last = b->ldims[r - 1];
    for (int64_t row = 0; row < rows; row++) {
        /* Local multi-index of the row -> global offset, or padding. */
        int64_t rest = row, goff = 0, gstride = b->gdims[r - 1];
        bool pad = false;
        for (int i = r - 2; i >= 0; i--) {
            int64_t g = block_global(b, i, rest % b->ldims[i]);
            rest /= b->ldims[i];
            if (g < 0) pad = true;
            goff += g * gstride;
            gstride *= b->gdims[i];
        }
        if (pad) {
            fn(ctx, row * last, 0, 0, last);
            continue;
        }
        /* The row's runs end at group boundaries and at the padding. */
        for (int64_t i = 0; i < last;) {
            int64_t g = block_global(b, r - 1, i);
            if (g < 0) {
                fn(ctx, row * last + i, 0, 0, last - i);
                break;
            }
            int64_t j = b->first[r - 1] + i;
            int64_t end = (j / b->group[r - 1] + 1) * b->group[r - 1];
            if (end > b->valid[r - 1]) end = b->valid[r - 1];
            int64_t n = end - j < last - i ? end - j : last - i;
            fn(ctx, row * last + i, goff + g, n, 0);
            i += n;
        }
    }
}

typedef struct copy_ctx {
    char *local;
    char *global;
    size_t es;
    bool to_local;
} copy_ctx;

static void copy_row(void *ctx, int64_t local, int64_t global, int64_t n, int64_t pad)
{
    copy_ctx *c = ctx;
    char *l = c->local + (size_t)local * c->es, *g = c->global + (size_t)global * c->es;
    if (c->to_local) {
        memcpy(l, g, (size_t)n * c->es);
        memset(l + (size_t)n * c->es, 0, (size_t)pad * c->es);
    } else {
        memcpy(g, l, (size_t)n * c->es);
    }
}

/* Only this process's blocks (of copy `copy`; -1: of every copy): reads
 * only the rows of `src` they cover. */
static void scatter(spmd_program *p, const spmd_tensor *t, const void *src, int copy)
{
    for (int d = 0; d < p->n_local; d++) {
        if (copy >= 0 && p->dev[d].copy != copy) continue;
        const spmd_tensor *lt = p->c.partitioned ? p->c.part.local_of[t->id] : t;
        block b = block_of(p, t, p->dev[d].id);
        copy_ctx c = {p->dev[d].leaf_data[lt->id], (char *)src, spmd_dtype_size(t->dtype), true};
        for_rows(&b, copy_row, &c);
    }
}

static void assemble(const spmd_program *p, const spmd_tensor *t, void *dst, int copy)
{
    for (int d = 0; d < p->n_local; d++) {
        if (p->dev[d].copy != copy) continue;
        const spmd_tensor *lt = p->c.partitioned ? p->c.part.local_of[t->id] : t;
        block b = block_of(p, t, p->dev[d].id);
        copy_ctx c = {data_of(&p->dev[d], lt), dst, spmd_dtype_size(t->dtype), false};
        for_rows(&b, copy_row, &c);
    }
}

/* ---- Parameter initialisation ------------------------------------------------------ */

/* Values depend on (seed, name, global element index) only: the same on
 * any thread count and any sharding. */
typedef struct init_ctx {
    const spmd_tensor *t;
    float *x;
    uint64_t seed, stream;
} init_ctx;

static void init_row(void *ctx, int64_t local, int64_t global, int64_t n, int64_t pad)
{
    init_ctx *c = ctx;
    float *x = c->x + local, s = c->t->init.scale;
    for (int64_t i = 0; i < n; i++) {
        uint64_t gi = (uint64_t)(global + i);
        switch (c->t->init.kind) {
        case SPMD_INIT_ZEROS: x[i] = 0.0f; break;
        case SPMD_INIT_ONES: x[i] = 1.0f; break;
        case SPMD_INIT_NORMAL: x[i] = s * base_rng_normal(c->seed, c->stream, gi); break;
        case SPMD_INIT_UNIFORM:
            x[i] = s * (2.0f * base_rng_uniform(c->seed, c->stream, gi) - 1.0f);
            break;
        }
    }
    memset(x + n, 0, (size_t)pad * sizeof *x);
}

/* Thread ith of device d fills its share of each global leaf's block. */
static void init_worker(void *ctx, int ith, int nth)
{
    device *d = ctx;
    spmd_program *p = d->prog;
    for (int i = 0; i < p->c.g->n_nodes; i++) {
        const spmd_tensor *t = p->c.g->nodes[i];
        if (!ir_op_is_leaf(t->op)) continue;
        const spmd_tensor *lt = p->c.partitioned ? p->c.part.local_of[i] : t;
        if (!lt) continue;
        block b = block_of(p, t, d->id);
        if (d->share_rank && p->share_as[lt->id] >= 0 && d->share_rank[lt->id] != 0) continue;
        if (!is_persistent(t)) {
            if (ith == 0) memset(d->leaf_data[lt->id], 0, ir_nbytes(lt));
            continue;
        }
        /* Split the block's leading dim over threads: rows [lo, hi). */
        if (t->rank > 0) {
            int64_t lo, hi;
            kern_split(b.ldims[0], ith, nth, 1, &lo, &hi);
            int64_t row = ir_numel(lt) / (b.ldims[0] ? b.ldims[0] : 1);
            block part = b;
            part.ldims[0] = hi - lo;
            part.first[0] = lo;
            init_ctx c = {t, (float *)d->leaf_data[lt->id] + lo * row, d->seed,
                          base_rng_stream(t->name)};
            if (hi > lo) for_rows(&part, init_row, &c);
        } else if (ith == 0) {
            init_ctx c = {t, d->leaf_data[lt->id], d->seed, base_rng_stream(t->name)};
            for_rows(&b, init_row, &c);
        }
    }
}

static void device_init(void *ctx, int ith, int nth)
{
    (void)nth;
    spmd_program *p = ctx;
    rt_pool_run(p->dev[ith].pool, init_worker, &p->dev[ith]);
}

/* ---- Collectives in flight --------------------------------------------------------- */

/* The communication thread mostly sleeps: it spins briefly for the next
 * hand-over.  A compute thread waiting for a result spins as the pool's
 * threads do, since the result is often a moment away. */
static const rt_wait_spin COMM_IDLE_SPIN = {.pauses = 256, .yields = 0};
static const rt_wait_spin COMM_IDLE_SPIN_CROWDED = {.pauses = 16, .yields = 0};
static const rt_wait_spin COMM_BUSY_SPIN = {.pauses = 2048, .yields = 0};
static const rt_wait_spin COMM_BUSY_SPIN_CROWDED = {.pauses = 16, .yields = 2};

static int64_t clock_ns(void);
static int64_t trace_clock(const spmd_program *p);

/* The trace slots of async collective k in a device's row: the thread's
 * start and end, thread 0's wait's start and end. */
static size_t inflight_slot(const spmd_program *p, int k)
{
    return 2 * (size_t)p->c.plan.n_steps + 3 + 4 * (size_t)k;
}

/* Run the collective of number `seq` on the communication thread: the
 * same kernel thread 0 runs for a step of its own. */
static void comm_run(dev_comm *c, uint32_t seq)
{
    device *d = c->d;
    spmd_program *p = d->prog;
    const plan *pl = &p->c.plan;
    int k = c->queue[seq % (uint32_t)pl->n_async];
    const spmd_tensor *t = pl->steps[pl->async_step[k]];
    char message[sizeof c->message];
    message[0] = '\0';
    _Atomic int st = SPMD_OK;
    kern_args a = {0};
    a.node = t;
    a.in[0] = data_of(d, t->in[0]);
    a.out = data_of(d, t);
    a.nth = 1;
    a.status = &st;
    a.message = message;
    a.message_size = sizeof message;
    a.dev = &d->kd;
    int64_t *tr = d->trace_row;
    if (tr) tr[inflight_slot(p, k)] = trace_clock(p);
    kern_for(t->op)(&a);
    if (tr) tr[inflight_slot(p, k) + 1] = trace_clock(p);
    int outcome = atomic_load(&st);
    if (outcome != SPMD_OK) {
        bool first = false;
        if (atomic_compare_exchange_strong(&c->failed, &first, true)) {
            snprintf(c->message, sizeof c->message, "%s", message);
            /* Peers may wait in later collectives for this device. */
            coll_world_abort(p->world, message);
        }
    }
    atomic_store(&c->status[k], outcome);
}

static void *comm_main(void *arg)
{
    dev_comm *c = arg;
    uint32_t next = atomic_load(&c->done.value);
    for (;;) {
        uint32_t issued = atomic_load(&c->issued.value);
        if (issued == next) issued = rt_wait_while(&c->idle, &c->issued, next);
        if (atomic_load(&c->quit)) break;
        for (; next != issued; next++) {
            comm_run(c, next);
            atomic_store(&c->done.value, next + 1);
            rt_wait_notify(&c->busy, &c->done);
        }
    }
    return NULL;
}

static spmd_status comm_start(spmd_program *p, device *d)
{
    int n = p->c.plan.n_async;
    dev_comm *c = base_calloc(&p->alloc, sizeof *c, "communication thread");
    if (!c) return SPMD_ERR_NOMEM;
    d->comm = c;
    c->d = d;
    c->queue = base_calloc(&p->alloc, (size_t)n * sizeof *c->queue, "communication thread");
    c->status = base_calloc(&p->alloc, (size_t)n * sizeof *c->status, "communication thread");
    if (!c->queue || !c->status) return SPMD_ERR_NOMEM;
    rt_wait_word_init(&c->issued, 0);
    rt_wait_word_init(&c->done, 0);
    atomic_init(&c->quit, false);
    atomic_init(&c->failed, false);
    /* Every thread of the process that takes part: compute and communication. */
    int threads = p->n_local * (p->c.nth + 1);
    rt_wait_init(&c->idle, threads, COMM_IDLE_SPIN, COMM_IDLE_SPIN_CROWDED);
    rt_wait_init(&c->busy, threads, COMM_BUSY_SPIN, COMM_BUSY_SPIN_CROWDED);
    if (pthread_create(&c->thread, NULL, comm_main, c) != 0) {
        rt_wait_destroy(&c->idle);
        rt_wait_destroy(&c->busy);
        return base_error(SPMD_ERR_NOMEM, "compile: cannot start device %d's communication thread",
                          d->id);
    }
    c->started = true;
    return SPMD_OK;
}

static void comm_stop(spmd_program *p, device *d)
{
    dev_comm *c = d->comm;
    if (!c) return;
    if (c->started) {
        atomic_store(&c->quit, true);
        atomic_fetch_add(&c->issued.value, 1);
        rt_wait_wake(&c->idle, &c->issued);
        pthread_join(c->thread, NULL);
        rt_wait_destroy(&c->idle);
        rt_wait_destroy(&c->busy);
    }
    base_free(&p->alloc, c->queue);
    base_free(&p->alloc, (void *)c->status);
    base_free(&p->alloc, c);
    d->comm = NULL;
}

/* The wait lists by step, and the micro-batch's numbering. */
static spmd_status inflight_build(spmd_program *p)
{
    const plan *pl = &p->c.plan;
    inflight *f = &p->fly;
    int n = pl->n_async, ns = pl->n_steps;
    f->wait_off = base_calloc(&p->alloc, (size_t)(ns + 2) * sizeof *f->wait_off, "schedule");
    f->wait_list = base_alloc(&p->alloc, (size_t)n * sizeof *f->wait_list, "schedule");
    f->micro_rank = base_alloc(&p->alloc, (size_t)n * sizeof *f->micro_rank, "schedule");
    int *at = base_alloc(&p->alloc, (size_t)(ns + 1) * sizeof *at, "schedule");
    if (!f->wait_off || !f->wait_list || !f->micro_rank || !at) {
        base_free(&p->alloc, at);
        return SPMD_ERR_NOMEM;
    }
    for (int k = 0; k < n; k++) f->wait_off[pl->wait_at[k] + 1]++;
    for (int s = 0; s <= ns; s++) f->wait_off[s + 1] += f->wait_off[s];
    memcpy(at, f->wait_off, (size_t)(ns + 1) * sizeof *at);
    for (int k = 0; k < n; k++) f->wait_list[at[pl->wait_at[k]]++] = k;
    base_free(&p->alloc, at);
    for (int k = 0; k < n; k++) {
        const spmd_tensor *t = pl->steps[pl->async_step[k]];
        f->micro_rank[k] = !p->c.micro || p->c.micro[t->id] ? f->n_micro++ : -1;
    }
    return SPMD_OK;
}

static void inflight_free(spmd_program *p)
{
    base_free(&p->alloc, p->fly.wait_off);
    base_free(&p->alloc, p->fly.wait_list);
    base_free(&p->alloc, p->fly.micro_rank);
}

/* Async collective k's number in this run, or -1 when the run skips it. */
static int inflight_rank(const spmd_program *p, int k)
{
    return p->micro_run ? p->fly.micro_rank[k] : k;
}

/* ---- Compile and set up devices --------------------------------------------------- */

/* Every op of the local program has a kernel (a leaf has none: the
 * executor places it). */
static spmd_status check_kernels(const spmd_graph *g)
{
    for (int i = 0; i < g->n_nodes; i++) {
        const spmd_tensor *t = g->nodes[i];
        if (!ir_op_is_leaf(t->op) && !kern_for(t->op))
            return base_error(SPMD_ERR_INTERNAL, "compile: no kernel for %s", ir_op_name(t->op));
    }
    return SPMD_OK;
}

/* Device memory, counted for spmd_program_allocated_bytes. */
static void *device_alloc(spmd_program *p, size_t bytes, const char *what)
{
    void *x = base_alloc(&p->alloc, bytes, what);
    if (x) p->allocated += bytes;
    return x;
}

/* Where each view's block lies in its leaf on device d: the block the
 * slice's kernel would copy (copy_member_block), rows [m b, (m + 1) b) of
 * the split dim for member m of its group, is one run of the leaf's
 * bytes, its own bytes long, since the dims before it are 1.  A gather
 * read in place starts where the leaf's shared buffer does: this
 * device's block index times the block's bytes before its block. */
static spmd_status setup_views(spmd_program *p, device *d)
{
    const plan *pl = &p->c.plan;
    if (!pl->n_views && !pl->n_gathers_in_place) return SPMD_OK;
    const spmd_graph *lg = p->c.local;
    d->view_offset = base_calloc(&p->alloc, (size_t)lg->n_nodes * sizeof *d->view_offset, "views");
    if (!d->view_offset) return SPMD_ERR_NOMEM;
    for (int i = 0; i < lg->n_nodes; i++) {
        const spmd_tensor *t = lg->nodes[i];
        if (pl->view_of[i] >= 0)
            d->view_offset[i] = (ptrdiff_t)((size_t)d->member[t->attr.coll.spec] * ir_nbytes(t));
        if (pl->gather_leaf[i] >= 0)
            d->view_offset[i] = -(ptrdiff_t)((size_t)d->member[t->attr.coll.spec] * ir_nbytes(t->in[0]));
    }
    return SPMD_OK;
}

/* Which leaves (and update values trading buffers with them) take a
 * shared buffer's layout: program.share_as. */
static spmd_status setup_share_as(spmd_program *p)
{
    const compiled *c = &p->c;
    if (!c->share_blocks) return SPMD_OK;
    const spmd_graph *lg = c->local;
    p->share_as = base_alloc(&p->alloc, (size_t)lg->n_nodes * sizeof *p->share_as, "shared leaves");
    if (!p->share_as) return SPMD_ERR_NOMEM;
    for (int i = 0; i < lg->n_nodes; i++)
        p->share_as[i] = ir_op_is_leaf(lg->nodes[i]->op) && c->share_blocks[i] > 0 ? i : -1;
    for (int u = 0; u < lg->n_updates; u++) {
        const ir_update *up = &lg->updates[u];
        if (c->plan.swapped[up->value->id] && p->share_as[up->target->id] >= 0)
            p->share_as[up->value->id] = up->target->id;
        const spmd_tensor *slice = up->value->in[0];
        if (c->plan.lands_in[up->value->id] >= 0 && c->plan.swapped[slice->id])
            p->share_as[slice->id] = up->target->id;
    }
    return SPMD_OK;
}

/* Where in its target's block a landing gather's slice lies on device d:
 * the member's part, as the gather would put it; 0 for other nodes. */
static size_t slice_offset(const spmd_program *p, const device *d, int node)
{
    const spmd_graph *lg = p->c.local;
    for (int u = 0; u < lg->n_updates; u++) {
        const spmd_tensor *v = lg->updates[u].value;
        if (p->c.plan.lands_in[v->id] >= 0 && v->in[0]->id == node)
            return (size_t)d->member[v->attr.coll.spec] * ir_nbytes(v->in[0]);
    }
    return 0;
}

/* One buffer per copy for each shared leaf (and swapped value), every
 * block side by side: device d's block at its block index times the
 * block's bytes, along the leaf's one split dim (compiled.share_blocks).
 * Its rank among the devices of its copy holding the same block is
 * share_rank.  After every device here is set up; only where every
 * device of the mesh is in this process. */
static spmd_status setup_shared(spmd_program *p)
{
    const spmd_graph *g = p->c.g, *lg = p->c.local;
    if (!p->share_as) return SPMD_OK;
    for (int k = 0; k < p->n_local; k++) {
        device *d = &p->dev[k];
        d->share_rank = base_calloc(&p->alloc, (size_t)lg->n_nodes * sizeof *d->share_rank, "shared leaves");
        if (!d->share_rank) return SPMD_ERR_NOMEM;
    }
    /* The global node of each shared leaf, for its blocks. */
    for (int gi = 0; gi < g->n_nodes; gi++) {
        const spmd_tensor *t = g->nodes[gi], *lt = p->c.part.local_of[gi];
        if (!lt || !ir_op_is_leaf(t->op) || p->share_as[lt->id] != lt->id) continue;
        const sharding *held = &p->c.part.held[gi];
        int split = -1;
        for (int dim = 0; dim < held->rank; dim++)
            if (held->dim[dim].n) split = dim;
        size_t bytes = ir_nbytes(lt), whole = bytes * (size_t)p->c.share_blocks[lt->id];
        /* The node itself and each update value taking its layout. */
        for (int v = 0; v < lg->n_nodes; v++) {
            if (p->share_as[v] != lt->id) continue;
            for (int copy = 0; copy < p->copies; copy++) {
                char *buf = NULL;
                for (int k = 0; k < p->n_local; k++) {
                    device *d = &p->dev[k];
                    if (d->copy != copy) continue;
                    if (!buf) {
                        buf = device_alloc(p, whole, t->name ? t->name : "shared leaf");
                        if (!buf) return SPMD_ERR_NOMEM;
                        memset(buf, 0, whole);
                        p->shared_bufs[p->n_shared_bufs++] = buf;
                    }
                    int64_t index = split >= 0 ? sharding_block_index(held, p->c.mesh, split, d->id) : 0;
                    d->leaf_data[v] = buf + (size_t)index * bytes + slice_offset(p, d, v);
                    int rank = 0;
                    for (int j = 0; j < k; j++)
                        rank += p->dev[j].copy == copy && p->dev[j].leaf_data[v] == d->leaf_data[v];
                    d->share_rank[v] = rank;
                }
            }
        }
    }
    return SPMD_OK;
}

static spmd_status setup_device(spmd_program *p, device *d, int id, const uint64_t *copy_seeds)
{
    const spmd_graph *lg = p->c.local;
    d->prog = p;
    d->id = id;
    d->copy = p->c.mesh ? mesh_copy_of(p->c.mesh, p->c.mesh->position[id]) : 0;
    d->seed = copy_seeds ? copy_seeds[d->copy] : p->seed;
    d->leaf_data = base_calloc(&p->alloc, (size_t)(lg->n_nodes ? lg->n_nodes : 1) * sizeof(void *),
                               "program tensors");
    if (!d->leaf_data) return SPMD_ERR_NOMEM;
    for (int i = 0; i < lg->n_nodes; i++) {
        const spmd_tensor *t = lg->nodes[i];
        if (!ir_op_is_leaf(t->op) && !p->c.plan.swapped[i]) continue;
        if (p->share_as && p->share_as[i] >= 0) continue; /* setup_shared */
        d->leaf_data[i] = device_alloc(p, ir_nbytes(t), t->name ? t->name : "update value");
        if (!d->leaf_data[i]) return SPMD_ERR_NOMEM;
        /* A value's buffer becomes its target's after a step: zero padding. */
        if (!ir_op_is_leaf(t->op)) memset(d->leaf_data[i], 0, ir_nbytes(t));
    }
    if (p->c.plan.arena_bytes) {
        d->arena = device_alloc(p, p->c.plan.arena_bytes, "activation arena");
        if (!d->arena) return SPMD_ERR_NOMEM;
    }
    if (p->c.scratch_each) {
        d->scratch = device_alloc(p, p->c.scratch_each * (size_t)p->c.nth, "kernel scratch");
        if (!d->scratch) return SPMD_ERR_NOMEM;
    }
    d->pool = rt_pool_create(p->c.nth, &p->alloc);
    if (!d->pool) return SPMD_ERR_NOMEM;
    if (p->c.partitioned) {
        int n = p->c.part.n_specs ? p->c.part.n_specs : 1;
        d->groups = base_calloc(&p->alloc, (size_t)n * sizeof *d->groups, "device groups");
        d->member = base_calloc(&p->alloc, (size_t)n * sizeof *d->member, "device groups");
        if (!d->groups || !d->member) return SPMD_ERR_NOMEM;
        for (int s = 0; s < p->c.part.n_specs; s++) {
            int members[MESH_MAX_DEVICES];
            int size = mesh_group(p->c.mesh, id, &p->c.part.specs[s], members);
            /* World ranks are mesh positions: device ids may be permuted. */
            for (int k = 0; k < size; k++) members[k] = p->c.mesh->position[members[k]];
            d->groups[s] = coll_world_group(p->world, size, members);
            if (!d->groups[s]) return SPMD_ERR_NOMEM;
            d->member[s] = mesh_group_rank(p->c.mesh, id, &p->c.part.specs[s]);
        }
        d->kd = (kern_device){id, d->groups, d->member, p->world, p->c.mesh, p->c.part.specs};
    }
    return setup_views(p, d);
}

/* Refuse up front a mesh the address-space limit (ulimit -v) cannot hold,
 * rather than fail partway through starting its threads: each worker
 * thread maps a stack, and each device its memory.  Both are lower
 * bounds, so nothing that would run is refused. */
static spmd_status check_address_space(const spmd_program *p)
{
    struct rlimit as;
    if (getrlimit(RLIMIT_AS, &as) != 0 || as.rlim_cur == RLIM_INFINITY) return SPMD_OK;
    size_t stack = 0;
    pthread_attr_t attr;
    if (pthread_attr_init(&attr) == 0) {
        pthread_attr_getstacksize(&attr, &stack);
        pthread_attr_destroy(&attr);
    }
    /* Started threads: one per device here but the caller's, each
     * device's pool but its first, and its communication thread. */
    int n = p->n_local;
    long threads = (n > 1 ? n - 1 : 0) + (long)n * (p->c.nth - 1) + (p->c.plan.n_async ? n : 0);
    double per_device = (double)compiled_peak_bytes(&p->c);
    double need = (double)threads * (double)stack + n * per_device;
    double mapped = (double)base_mapped_bytes();
    double left = (double)as.rlim_cur - mapped;
    if (need <= left) return SPMD_OK;
    const double gib = 1024.0 * 1024.0 * 1024.0;
    return base_error(SPMD_ERR_NOMEM,
                      "compile: %d devices need at least %.2f GiB of address space (%ld threads "
                      "with %zu MiB stacks, %.1f MiB per device) and the address-space limit "
                      "(ulimit -v) leaves %.2f GiB",
                      n, need / gib, threads, stack >> 20, per_device / (1024.0 * 1024.0),
                      left < 0 ? 0.0 : left / gib);
}

spmd_program *spmd_compile(spmd_graph *g, const spmd_compile_options *opts)
{
    if (!g) {
        base_error(SPMD_ERR_INVALID, "compile: graph is NULL");
        return NULL;
    }
    spmd_program *p = base_calloc(&g->alloc, sizeof *p, "program");
    if (!p) return NULL;
    p->alloc = g->alloc;
    p->seed = opts ? opts->seed : 0;
    bool plan_only = opts && opts->plan_only;
    const void *comm = opts && !plan_only ? opts->mpi_comm : NULL;
    int n_dev = g->mesh ? spmd_mesh_devices(g->mesh) : 1;
    p->n_local = n_dev;
    p->processes = 1;
    p->copies = spmd_mesh_copies(g->mesh);
    /* The world first: it says which devices run here, and the threads
     * are shared among those. */
    if (!plan_only && (g->mesh || comm)) {
        p->world = coll_world_create(n_dev, comm, &p->alloc);
        if (!p->world) goto fail;
        coll_world_set_timeout(p->world, opts ? opts->collective_timeout_s : 0);
        coll_world_local(p->world, &p->first, &p->n_local, NULL);
        p->processes = n_dev / p->n_local;
        p->process = p->first / p->n_local;
    }
    compile_options how = {
        .threads = opts ? opts->threads : 0,
        .devices_here = p->n_local,
        .fuse = !(opts && opts->unfused),
        .overlap = opts && opts->overlap,
        .inflight_bytes = opts ? opts->inflight_bytes : 0,
    };
    if (compile_graph(&p->c, g, &how) != SPMD_OK) goto fail;
    /* A plan-only program (explain) stops here: no devices, no BLAS. */
    if (plan_only) return p;

    if (check_address_space(p) != SPMD_OK) goto fail;
    if (check_kernels(p->c.local) != SPMD_OK) goto fail;
    if (setup_share_as(p) != SPMD_OK) goto fail;
    if (p->share_as) {
        size_t most = (size_t)p->c.local->n_nodes * (size_t)p->copies;
        p->shared_bufs = base_calloc(&p->alloc, (most ? most : 1) * sizeof *p->shared_bufs, "shared leaves");
        if (!p->shared_bufs) goto fail;
    }
    p->dev = base_calloc(&p->alloc, (size_t)p->n_local * sizeof *p->dev, "devices");
    p->input_set = base_calloc(&p->alloc, (size_t)(g->n_nodes ? g->n_nodes : 1) *
                                              (size_t)p->copies * sizeof *p->input_set,
                               "program inputs");
    if (!p->dev || !p->input_set) goto fail;
    for (int d = 0; d < p->n_local; d++)
        if (setup_device(p, &p->dev[d], g->mesh ? g->mesh->ids[p->first + d] : 0,
                         opts ? opts->copy_seeds : NULL) != SPMD_OK)
            goto fail;
    if (setup_shared(p) != SPMD_OK) goto fail;
    /* Groups that cross processes get their communicators (every process
     * asked for all of its groups above). */
    if (p->world && coll_world_connect(p->world) != SPMD_OK) goto fail;
    if (p->c.plan.n_async) {
        if (inflight_build(p) != SPMD_OK) goto fail;
        for (int d = 0; d < p->n_local; d++)
            if (comm_start(p, &p->dev[d]) != SPMD_OK) goto fail;
    }
    if (p->n_local > 1) {
        p->outer = rt_pool_create(p->n_local, &p->alloc);
        if (!p->outer) goto fail;
        rt_pool_run(p->outer, device_init, p);
    } else {
        rt_pool_run(p->dev[0].pool, init_worker, &p->dev[0]);
    }
    return p;

fail:
    spmd_program_free(p);
    return NULL;
}

static void trace_free(spmd_program *p);

void spmd_program_free(spmd_program *p)
{
    if (!p) return;
    if (p->outer) rt_pool_free(p->outer);
    for (int d = 0; p->dev && d < p->n_local; d++) {
        device *dv = &p->dev[d];
        comm_stop(p, dv);
        if (dv->pool) rt_pool_free(dv->pool);
        for (int i = 0; dv->leaf_data && i < p->c.local->n_nodes; i++)
            if (!p->share_as || p->share_as[i] < 0) base_free(&p->alloc, dv->leaf_data[i]);
        base_free(&p->alloc, dv->leaf_data);
        base_free(&p->alloc, dv->view_offset);
        base_free(&p->alloc, dv->share_rank);
        base_free(&p->alloc, dv->arena);
        base_free(&p->alloc, dv->scratch);
        base_free(&p->alloc, dv->groups);
        base_free(&p->alloc, dv->member);
    }
    base_free(&p->alloc, p->dev);
    for (int i = 0; i < p->n_shared_bufs; i++) base_free(&p->alloc, p->shared_bufs[i]);
    base_free(&p->alloc, p->shared_bufs);
    base_free(&p->alloc, p->share_as);
    base_free(&p->alloc, p->input_set);
    inflight_free(p);
    trace_free(p);
    if (p->world) coll_world_free(p->world);
    compiled_free(&p->c);
    spmd_allocator a = p->alloc;
    base_free(&a, p);
}

/* ---- Run ------------------------------------------------------------------------------ */

static int64_t clock_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static int64_t trace_clock(const spmd_program *p) { return clock_ns() - p->trace.origin; }

static size_t trace_stride(const spmd_program *p)
{
    return 2 * (size_t)p->c.plan.n_steps + 3 + 4 * (size_t)p->c.plan.n_async;
}

/* Every thread of device d before step s (n_steps: the end): wait for the
 * collectives in flight whose results step s is the first to read.
 * False when one of them failed (thread 0 then holds its message in the
 * status word `status`, for the step to fail). */
static bool inflight_wait(device *d, int s, int ith, _Atomic int *status)
{
    spmd_program *p = d->prog;
    dev_comm *c = d->comm;
    bool ok = true;
    for (int i = p->fly.wait_off[s]; i < p->fly.wait_off[s + 1]; i++) {
        int k = p->fly.wait_list[i], rank = inflight_rank(p, k);
        if (rank < 0) continue;
        int64_t *tr = ith == 0 ? d->trace_row : NULL;
        if (tr) tr[inflight_slot(p, k) + 2] = trace_clock(p);
        uint32_t want = c->base + (uint32_t)rank + 1, v = atomic_load(&c->done.value);
        while ((int32_t)(v - want) < 0) v = rt_wait_while(&c->busy, &c->done, v);
        if (tr) tr[inflight_slot(p, k) + 3] = trace_clock(p);
        if (atomic_load(&c->status[k]) == SPMD_OK) continue;
        ok = false;
        int expected = SPMD_OK;
        if (ith == 0 && atomic_compare_exchange_strong(status, &expected, atomic_load(&c->status[k])))
            snprintf(d->message, sizeof d->message, "%s", c->message);
    }
    return ok;
}

/* Thread 0: hand over async collective k (its operand is written). */
static void inflight_issue(device *d, int k, uint32_t *issued)
{
    spmd_program *p = d->prog;
    dev_comm *c = d->comm;
    int rank = inflight_rank(p, k);
    if (rank < 0) return;
    uint32_t seq = c->base + (uint32_t)rank;
    c->queue[seq % (uint32_t)p->c.plan.n_async] = k;
    atomic_store(&c->issued.value, seq + 1);
    rt_wait_notify(&c->idle, &c->issued);
    (*issued)++;
}

/* Thread 0, before the device's schedule returns: every collective it
 * handed over has finished, so no peer reads a buffer of this device
 * after the run (after an abort they fail at once). */
static void inflight_drain(device *d, uint32_t issued)
{
    dev_comm *c = d->comm;
    uint32_t want = c->base + issued, v = atomic_load(&c->done.value);
    while ((int32_t)(v - want) < 0) v = rt_wait_while(&c->busy, &c->done, v);
}

/* A step too small to share: the largest of its output and operands at
 * most this many elements, or a scalar output (a reduction to one scalar
 * runs on one thread anyway). */
enum { SOLO_ELEMENTS = 16384 };

/* Whether thread 0 runs step t alone (nth 1: every thread count gives the
 * same bits, "Determinism"), so that a run of such steps needs no barrier
 * between them: on a device of several threads each barrier is a hand-off
 * that costs more than these steps' work (the optimizer's scalars, the
 * norm's sums, small bias updates).  Collectives keep their barrier. */
static bool solo_step(const spmd_tensor *t, const fuse_group *grp)
{
    if (ir_op_is_collective(t->op)) return false;
    int64_t most = ir_numel(t);
    if (most == 1) return true;
    int n = grp ? grp->n_in : t->n_in;
    for (int j = 0; j < n; j++) {
        int64_t k = ir_numel(grp ? grp->in[j] : t->in[j]);
        most = k > most ? k : most;
    }
    return most <= SOLO_ELEMENTS;
}

static void run_worker(void *ctx, int ith, int nth)
{
    device *d = ctx;
    spmd_program *p = d->prog;
    const plan *pl = &p->c.plan;
    kern_args a = {0};
    a.ith = ith;
    a.nth = nth;
    a.message = d->message;
    a.message_size = sizeof d->message;
    a.scratch = d->scratch ? d->scratch + (size_t)ith * p->c.scratch_each : NULL;
    a.dev = p->c.partitioned ? &d->kd : NULL;
    int64_t *tr = ith == 0 ? d->trace_row : NULL; /* NULL: not tracing */
    if (tr) tr[0] = trace_clock(p);
    dev_comm *c = d->comm;
    uint32_t issued = 0; /* hand-overs this run (thread 0) */
    int next_start = 0;  /* the next async collective to hand over */
    int run = 0;         /* shared steps run, for the status word's parity */
    bool comm_ok = true; /* until a collective in flight fails */
    int last = -1;       /* the last step run (traced) */
    /* The last of a run of solo steps (thread 0's alone) since the last
     * barrier, -1 for none: the barrier it owes comes before the next
     * shared step, or at the end.  Solo steps report in status[2], which
     * every thread reads after that barrier: no thread can be writing it
     * for a later run of solo steps before they all passed the next
     * barrier. */
    int owed = -1;
    for (int s = 0; s <= pl->n_steps; s++) {
        const spmd_tensor *t = s < pl->n_steps ? pl->steps[s] : NULL;
        bool skipped = t && p->micro_run && !p->c.micro[t->id]; /* the update waits for the last */
        bool flying = t && c && pl->async_of[s] >= 0;
        /* A fused group's root reads the group's inputs. */
        const fuse_group *grp = t ? fusion_group(&p->c.fusion, t) : NULL;
        bool solo = nth > 1 && t && !skipped && !flying && solo_step(t, grp);
        if (owed >= 0 && !solo && !skipped && !flying) {
            rt_pool_barrier(d->pool);
            if (tr) tr[2 + 2 * owed] = trace_clock(p);
            owed = -1;
            if (atomic_load(&d->status[2]) != SPMD_OK) {
                if (ith == 0 && p->world) coll_world_abort(p->world, d->message);
                break;
            }
        }
        /* Alternate status words: a fast thread failing the next shared
         * step cannot be seen by a slow thread still checking this one,
         * so every thread of the device stops at the same node. */
        a.status = &d->status[solo ? 2 : run & 1];
        if (c) {
            comm_ok = inflight_wait(d, s, ith, a.status) && comm_ok;
            for (; ith == 0 && next_start < pl->n_async && pl->start_at[next_start] == s; next_start++)
                inflight_issue(d, next_start, &issued);
        }
        if (!t) {
            if (!comm_ok && ith == 0) coll_world_abort(p->world, d->message);
            /* The wait for what is still in flight at the end (results
             * the update or the caller reads) ends the last step, so the
             * steps still cover the schedule. */
            if (tr && last >= 0) tr[2 + 2 * last] = trace_clock(p);
            break;
        }
        if (skipped) continue;
        if (flying) {
            /* In flight on the communication thread: nothing to run here. */
            if (tr) tr[1 + 2 * s] = tr[2 + 2 * s] = trace_clock(p);
            last = s;
            continue;
        }
        if (solo) {
            owed = s;
            last = s;
            if (ith != 0 || atomic_load(&d->status[2]) != SPMD_OK) continue;
        }
        a.node = t;
        a.fused = grp;
        if (grp) {
            for (int j = 0; j < grp->n_in; j++) a.in[j] = data_of(d, grp->in[j]);
            for (int j = 0; j < grp->n_stored; j++) a.stored[j] = data_of(d, grp->stored[j]);
        } else
            for (int j = 0; j < t->n_in; j++) a.in[j] = data_of(d, t->in[j]);
        a.out = data_of(d, t);
        a.nth = solo ? 1 : nth;
        /* A result that failed to arrive is not computed on. */
        if (comm_ok) {
            if (grp) kern_fused(&a);
            else kern_for(t->op)(&a);
        }
        if (tr) tr[1 + 2 * s] = trace_clock(p);
        if (solo) {
            if (tr) tr[2 + 2 * s] = tr[1 + 2 * s]; /* no barrier: the next step goes on */
            continue;
        }
        rt_pool_barrier(d->pool);
        if (tr) tr[2 + 2 * s] = trace_clock(p);
        last = s;
        run++;
        if (atomic_load(a.status) != SPMD_OK) {
            /* Peers may be waiting for this device in a collective. */
            if (ith == 0 && p->world) coll_world_abort(p->world, d->message);
            break;
        }
    }
    if (c && ith == 0) inflight_drain(d, issued);
}

/* Updates: new values into parameters and state.  A second phase, run
 * only once every device finished its schedule, so a failing device
 * leaves every device's parameters as they were.  A value in a buffer of
 * its own trades buffers with its target (thread 0); the others are
 * copied (every thread a part).  Into a shared leaf each device holding
 * the block copies its part: an all-gather that lands in place
 * (plan.lands_in) its member's slice, where the gather would have put
 * it, unless the slice was computed there in the target's next buffer
 * (then each device trades its two pointers, so all do); another value
 * (the same on each) the share_rank-th part. */
static void update_worker(void *ctx, int ith, int nth)
{
    device *d = ctx;
    const spmd_program *p = d->prog;
    const spmd_graph *lg = p->c.local;
    const bool *swapped = p->c.plan.swapped;
    for (int u = 0; u < lg->n_updates; u++) {
        const ir_update *up = &lg->updates[u];
        if (p->micro_run && !up->target->accumulator) continue;
        if (p->c.plan.in_place[up->value->id] >= 0) continue; /* written where it goes */
        int64_t b, e;
        if (p->c.plan.lands_in[up->value->id] >= 0) {
            const spmd_tensor *slice = up->value->in[0];
            size_t n = ir_nbytes(slice), at = (size_t)d->member[up->value->attr.coll.spec] * n;
            if (swapped[slice->id]) { /* computed in the next buffer: trade the two */
                if (ith == 0) {
                    char *now = d->leaf_data[up->target->id];
                    d->leaf_data[up->target->id] = (char *)d->leaf_data[slice->id] - at;
                    d->leaf_data[slice->id] = now + at;
                }
                continue;
            }
            kern_split((int64_t)n, ith, nth, 64, &b, &e);
            memcpy((char *)data_of(d, up->target) + at + b, (const char *)data_of(d, slice) + b,
                   (size_t)(e - b));
            continue;
        }
        if (swapped[up->value->id]) {
            if (ith == 0) {
                void *old = d->leaf_data[up->target->id];
                d->leaf_data[up->target->id] = d->leaf_data[up->value->id];
                d->leaf_data[up->value->id] = old;
            }
            continue;
        }
        int64_t lo = 0, hi = (int64_t)ir_nbytes(up->target);
        if (p->share_as && p->share_as[up->target->id] >= 0)
            kern_split(hi, d->share_rank[up->target->id], p->c.sharers[up->target->id], 64, &lo, &hi);
        kern_split(hi - lo, ith, nth, 64, &b, &e);
        memcpy((char *)data_of(d, up->target) + lo + b, (const char *)data_of(d, up->value) + lo + b,
               (size_t)(e - b));
    }
}

static void device_run(void *ctx, int ith, int nth)
{
    (void)nth;
    spmd_program *p = ctx;
    rt_pool_run(p->dev[ith].pool, run_worker, &p->dev[ith]);
}

/* The update of device k, timed when traced (its pool's threads have all
 * returned when rt_pool_run does). */
static void update_device(spmd_program *p, int k)
{
    device *d = &p->dev[k];
    size_t n = 2 * (size_t)p->c.plan.n_steps + 1; /* after the steps' readings */
    if (d->trace_row) d->trace_row[n] = trace_clock(p);
    rt_pool_run(d->pool, update_worker, d);
    if (d->trace_row) d->trace_row[n + 1] = trace_clock(p);
}

static void device_update(void *ctx, int ith, int nth)
{
    (void)nth;
    update_device(ctx, ith);
}

static int device_status(const device *d)
{
    int st = atomic_load(&d->status[0]);
    if (!st) st = atomic_load(&d->status[1]);
    return st ? st : atomic_load(&d->status[2]);
}

static spmd_status check_runnable(const spmd_program *p, const char *what)
{
    if (!p) return base_error(SPMD_ERR_INVALID, "%s: program is NULL", what);
    if (!p->dev)
        return base_error(SPMD_ERR_INVALID, "%s: the program was compiled with plan_only", what);
    return SPMD_OK;
}

/* Every input the program reads was set for each copy run here: an input
 * never set would run as zeros, and a loss on all-zero targets looks like
 * a real one (ln V).  An input no output or update depends on is not
 * read, and need not be set. */
static spmd_status check_inputs_set(spmd_program *p)
{
    if (p->inputs_checked) return SPMD_OK;
    const spmd_graph *g = p->c.g;
    for (int i = 0; i < g->n_nodes; i++) {
        const spmd_tensor *t = g->nodes[i];
        if (t->op != IR_INPUT) continue;
        const spmd_tensor *lt = compiled_local(&p->c, t);
        /* A micro-batch reads only its own part's inputs (not "lr"). */
        const bool *reads = p->micro_run ? p->c.micro : p->c.plan.needed;
        if (!lt || !reads[lt->id]) continue;
        for (int d = 0; d < p->n_local; d++) {
            int copy = p->dev[d].copy;
            if (p->input_set[(size_t)i * (size_t)p->copies + (size_t)copy]) continue;
            const char *name = t->name ? t->name : "(unnamed)";
            if (p->copies > 1)
                return base_error(SPMD_ERR_INVALID,
                                  "run: input '%s' of copy %d was never set: "
                                  "spmd_program_set_input_copy (or spmd_program_set_input, "
                                  "for every copy) must fill it before the first run",
                                  name, copy);
            return base_error(SPMD_ERR_INVALID,
                              "run: input '%s' was never set: spmd_program_set_input must fill "
                              "it before the first run",
                              name);
        }
    }
    p->inputs_checked = !p->micro_run;
    return SPMD_OK;
}

/* One run: a whole step, or a micro-batch (p->micro_run). */
static spmd_status execute(spmd_program *p)
{
    spmd_status ok;
    /* GEMM is loaded here, not at compile: plans need no BLAS. */
    if (!p->blas_loaded) {
        if ((ok = blas_init(BLAS_AUTO, NULL)) != SPMD_OK) return ok;
        p->blas_loaded = true;
    }
    if ((ok = check_inputs_set(p)) != SPMD_OK) return ok;
    trace *tr = &p->trace;
    bool traced = tr->on && tr->runs < tr->room;
    if (traced) tr->run_begin[tr->runs] = trace_clock(p);
    for (int d = 0; d < p->n_local; d++) {
        atomic_store(&p->dev[d].status[0], SPMD_OK);
        atomic_store(&p->dev[d].status[1], SPMD_OK);
        atomic_store(&p->dev[d].status[2], SPMD_OK);
        p->dev[d].message[0] = '\0';
        if (p->dev[d].comm) {
            dev_comm *c = p->dev[d].comm;
            c->base = atomic_load(&c->done.value);
            atomic_store(&c->failed, false);
            c->message[0] = '\0';
        }
        p->dev[d].trace_row = traced ? tr->times + ((size_t)tr->runs * (size_t)p->n_local +
                                                    (size_t)d) * trace_stride(p)
                                     : NULL;
    }
    if (p->n_local > 1) rt_pool_run(p->outer, device_run, p);
    else rt_pool_run(p->dev[0].pool, run_worker, &p->dev[0]);
    /* Report the device that failed first-hand, not one that only saw
     * the abort of a collective. */
    int failed = -1;
    for (int d = 0; d < p->n_local; d++) {
        int st = device_status(&p->dev[d]);
        if (!st) continue;
        if (st != SPMD_ERR_BACKEND) {
            failed = d;
            break;
        }
        if (failed < 0) failed = d;
    }
    if (p->world) coll_world_reset(p->world);
    if (failed < 0) {
        if (p->n_local > 1) rt_pool_run(p->outer, device_update, p);
        else update_device(p, 0);
        if (traced) {
            tr->run_end[tr->runs] = trace_clock(p);
            tr->micro[tr->runs++] = p->micro_run;
        }
        return SPMD_OK;
    }
    const device *dv = &p->dev[failed];
    int st = device_status(dv);
    if (p->c.n_dev > 1) return base_error((spmd_status)st, "device %d: %s", dv->id, dv->message);
    return base_error((spmd_status)st, "%s", dv->message);
}

/* ---- Reading across processes ------------------------------------------------------- */

/* The mesh axes t is held split over. */
static uint32_t split_axes(const spmd_program *p, const spmd_tensor *t)
{
    const sharding *s = &p->c.part.held[t->id];
    uint32_t mask = 0;
    for (int i = 0; i < s->rank; i++) mask |= mesh_axes_mask(&s->dim[i]);
    return mask;
}

/* Whether some of t's blocks live only in other processes.  Every
 * process decides alike (from the layout, not from what it holds), so
 * all of them take the same path in spmd_program_read.  With copies a
 * copy's devices may all be elsewhere: that path always. */
static bool spread_over_processes(const spmd_program *p, const spmd_tensor *t)
{
    if (p->processes == 1 || !p->c.partitioned) return false;
    if (p->copies > 1) return true;
    uint32_t mask = split_axes(p, t);
    for (int a = 0; a < p->c.mesh->rank; a++)
        if ((mask >> a & 1) && mesh_axis_crosses(p->c.mesh, a, p->n_local)) return true;
    return false;
}

/* The device at mesh position pos holds its block of copy `copy` first
 * (lowest position in the copy): its coordinates off the split and
 * independent axes are all 0, and it is in the copy. */
static bool first_holder(const spmd_mesh *m, uint32_t split, int pos, int copy)
{
    if (mesh_copy_of(m, pos) != copy) return false;
    for (int a = m->rank - 1; a >= 0; a--) {
        if (!(split >> a & 1) && !m->independent[a] && pos % m->shape[a] != 0) return false;
        pos /= m->shape[a];
    }
    return true;
}

/* Every process sends the blocks whose first holder it runs, in mesh
 * order; all of them receive everything and copy each block into place. */
static spmd_status assemble_across(const spmd_program *p, const spmd_tensor *t, void *dst,
                                   int copy)
{
    const spmd_mesh *m = p->c.mesh;
    const spmd_tensor *lt = p->c.part.local_of[t->id];
    size_t block_bytes = ir_nbytes(lt), es = spmd_dtype_size(t->dtype);
    uint32_t split = split_axes(p, t);
    spmd_allocator a = p->alloc;
    int64_t *bytes_of = base_calloc(&a, (size_t)p->processes * sizeof *bytes_of, "read");
    if (!bytes_of) return SPMD_ERR_NOMEM;
    int64_t total = 0;
    for (int pos = 0; pos < p->c.n_dev; pos++) {
        if (!first_holder(m, split, pos, copy)) continue;
        bytes_of[pos / p->n_local] += (int64_t)block_bytes;
        total += (int64_t)block_bytes;
    }
    unsigned char *mine = base_alloc(&a, (size_t)bytes_of[p->process] + 1, "read");
    unsigned char *all = base_alloc(&a, (size_t)total + 1, "read");
    spmd_status st = mine && all ? SPMD_OK : SPMD_ERR_NOMEM;
    size_t at = 0;
    for (int d = 0; st == SPMD_OK && d < p->n_local; d++) {
        if (!first_holder(m, split, p->first + d, copy)) continue;
        memcpy(mine + at, data_of(&p->dev[d], lt), block_bytes);
        at += block_bytes;
    }
    if (st == SPMD_OK) st = coll_world_gather_processes(p->world, mine, all, bytes_of);
    at = 0;
    for (int pos = 0; st == SPMD_OK && pos < p->c.n_dev; pos++) {
        if (!first_holder(m, split, pos, copy)) continue;
        block b = block_of(p, t, m->ids[pos]);
        copy_ctx c = {(char *)all + at, dst, es, false};
        for_rows(&b, copy_row, &c);
        at += block_bytes;
    }
    base_free(&a, mine);
    base_free(&a, all);
    base_free(&a, bytes_of);
    return st;
}

/* ---- Data in and out ---------------------------------------------------------------- */

static spmd_status check_access(const spmd_program *p, const spmd_tensor *t, size_t bytes,
                                const char *what)
{
    spmd_status ok = check_runnable(p, what);
    if (ok != SPMD_OK) return ok;
    if (!t) return base_error(SPMD_ERR_INVALID, "%s: tensor is NULL", what);
    if (t->graph != p->c.g)
        return base_error(SPMD_ERR_INVALID, "%s: tensor is not part of this program", what);
    if (bytes != ir_nbytes(t)) {
        char s[96];
        return base_error(SPMD_ERR_SHAPE, "%s: '%s' %s %s holds %zu bytes, buffer has %zu", what,
                          t->name ? t->name : ir_op_name(t->op), spmd_dtype_name(t->dtype),
                          ir_shape_str(t, s, sizeof s), ir_nbytes(t), bytes);
    }
    if (p->c.partitioned && !p->c.part.local_of[t->id])
        return base_error(SPMD_ERR_INVALID,
                          "%s: %s '%s' is not kept after a run; mark it with "
                          "spmd_graph_mark_output before compiling",
                          what, ir_op_name(t->op), t->name ? t->name : "(unnamed)");
    return SPMD_OK;
}

static spmd_status check_copy(const spmd_program *p, int copy, const char *what)
{
    if (copy < 0 || copy >= p->copies)
        return base_error(SPMD_ERR_INVALID, "%s: copy %d, the program has %d (0 to %d)", what, copy,
                          p->copies, p->copies - 1);
    return SPMD_OK;
}

static void note_input_set(spmd_program *p, const spmd_tensor *t, int copy)
{
    bool *set = &p->input_set[(size_t)t->id * (size_t)p->copies];
    for (int c = 0; c < p->copies; c++)
        if (copy < 0 || c == copy) set[c] = true;
}

/* An accumulator holds each device's own part of a sum in progress: no
 * whole value to read or write. */
static spmd_status accumulator_refused(const spmd_tensor *t, const char *what)
{
    return base_error(SPMD_ERR_INVALID,
                      "%s: '%s' is a gradient accumulator, which holds each device's part of "
                      "the sum of a step's micro-batches; read the gradient norm or the "
                      "parameters instead", what, t->name);
}

/* What put() writes: a program input, or a parameter or state. */
typedef enum put_kind { PUT_INPUT, PUT_PERSISTENT } put_kind;

/* set_input and write: into copy `copy`'s devices (one_copy), or every
 * copy's. */
static spmd_status put(spmd_program *p, put_kind kind, bool one_copy, int copy,
                       const spmd_tensor *t, const void *src, size_t bytes)
{
    const char *what = kind == PUT_INPUT ? "set_input" : "write";
    spmd_status st = check_access(p, t, bytes, what);
    if (st == SPMD_OK && one_copy) st = check_copy(p, copy, what);
    if (st != SPMD_OK) return st;
    if (t->accumulator) return accumulator_refused(t, what);
    if (kind == PUT_INPUT ? t->op != IR_INPUT : !is_persistent(t))
        return base_error(SPMD_ERR_INVALID, "%s: '%s' is a %s, not %s", what,
                          t->name ? t->name : "(unnamed)", ir_op_name(t->op),
                          kind == PUT_INPUT ? "an input" : "a param or state");
    scatter(p, t, src, one_copy ? copy : -1);
    if (kind == PUT_INPUT) note_input_set(p, t, one_copy ? copy : -1);
    return SPMD_OK;
}

spmd_status spmd_program_set_input(spmd_program *p, const spmd_tensor *t, const void *data,
                                   size_t bytes)
{
    return put(p, PUT_INPUT, false, 0, t, data, bytes);
}

spmd_status spmd_program_set_input_copy(spmd_program *p, int copy, const spmd_tensor *t,
                                        const void *data, size_t bytes)
{
    return put(p, PUT_INPUT, true, copy, t, data, bytes);
}

spmd_status spmd_program_write(spmd_program *p, const spmd_tensor *t, const void *src,
                               size_t bytes)
{
    return put(p, PUT_PERSISTENT, false, 0, t, src, bytes);
}

spmd_status spmd_program_write_copy(spmd_program *p, int copy, const spmd_tensor *t,
                                    const void *src, size_t bytes)
{
    return put(p, PUT_PERSISTENT, true, copy, t, src, bytes);
}

/* ---- Gradient accumulation ------------------------------------------------------------ */

/* Gradient accumulation's bookkeeping before a run: the micro-batch count
 * checked, and the accumulators' keep factor fed (0 on a step's first
 * micro-batch: the sums start afresh). */
static spmd_status begin_micro_batch(spmd_program *p, bool last, const char *what)
{
    const spmd_graph *g = p->c.g;
    const int steps = g->accumulate_steps;
    if (steps <= 1) {
        if (!last)
            return base_error(SPMD_ERR_INVALID,
                              "accumulate: the program has no gradient accumulation "
                              "(spmd_optimizer.accumulate_steps is %d): spmd_program_run "
                              "runs each step", steps);
        return SPMD_OK;
    }
    if (last && p->micro_done != steps - 1)
        return base_error(SPMD_ERR_INVALID,
                          "%s: %d of the step's %d micro-batches were accumulated; "
                          "spmd_program_accumulate runs %d before spmd_program_run runs the last "
                          "and the update",
                          what, p->micro_done, steps, steps - 1);
    if (!last && p->micro_done == steps - 1)
        return base_error(SPMD_ERR_INVALID,
                          "%s: %d of the step's %d micro-batches were accumulated already; "
                          "spmd_program_run runs the last and the update",
                          what, p->micro_done, steps);
    float keep = p->micro_done == 0 ? 0.0f : 1.0f;
    scatter(p, g->accumulate_keep, &keep, -1);
    note_input_set(p, g->accumulate_keep, -1);
    return SPMD_OK;
}

spmd_status spmd_program_accumulate(spmd_program *p)
{
    spmd_status ok = check_runnable(p, "accumulate");
    if (ok == SPMD_OK) ok = begin_micro_batch(p, false, "accumulate");
    if (ok != SPMD_OK) return ok;
    p->micro_run = true;
    ok = execute(p);
    p->micro_run = false;
    /* The sums are written in place: a failed micro-batch may have added
     * to some, so the step starts over. */
    p->micro_done = ok == SPMD_OK ? p->micro_done + 1 : 0;
    return ok;
}

spmd_status spmd_program_run(spmd_program *p)
{
    spmd_status ok = check_runnable(p, "run");
    if (ok == SPMD_OK) ok = begin_micro_batch(p, true, "run");
    if (ok != SPMD_OK) return ok;
    ok = execute(p);
    p->micro_done = 0; /* done, or (failed) started over: see above */
    return ok;
}

spmd_status spmd_program_read_copy(const spmd_program *p, int copy, const spmd_tensor *t,
                                   void *dst, size_t bytes)
{
    spmd_status st = check_access(p, t, bytes, "read");
    if (st == SPMD_OK) st = check_copy(p, copy, "read");
    if (st != SPMD_OK) return st;
    if (t->accumulator) return accumulator_refused(t, "read");
    if (!ir_op_is_leaf(t->op) && !t->is_output)
        return base_error(SPMD_ERR_INVALID,
                          "read: %s '%s' is not kept after a run; mark it with "
                          "spmd_graph_mark_output before compiling",
                          ir_op_name(t->op), t->name ? t->name : "(unnamed)");
    if (spread_over_processes(p, t)) return assemble_across(p, t, dst, copy);
    assemble(p, t, dst, copy);
    return SPMD_OK;
}

spmd_status spmd_program_read(const spmd_program *p, const spmd_tensor *t, void *dst,
                              size_t bytes)
{
    return spmd_program_read_copy(p, 0, t, dst, bytes);
}

spmd_status spmd_program_input_rows(const spmd_program *p, const spmd_tensor *t, int64_t *begin,
                                    int64_t *end)
{
    spmd_status st = check_access(p, t, t ? ir_nbytes(t) : 0, "input_rows");
    if (st != SPMD_OK) return st;
    if (!begin || !end) return base_error(SPMD_ERR_INVALID, "input_rows: begin or end is NULL");
    if (t->rank == 0) {
        *begin = 0, *end = 1;
        return SPMD_OK;
    }
    int64_t lo = t->dims[0], hi = 0;
    for (int d = 0; d < p->n_local; d++) {
        block b = block_of(p, t, p->dev[d].id);
        if (b.valid[0] == 0) continue; /* all padding */
        int64_t first = block_global(&b, 0, 0), last = block_global(&b, 0, b.valid[0] - 1);
        if (first < lo) lo = first;
        if (last + 1 > hi) hi = last + 1;
    }
    *begin = lo < hi ? lo : 0;
    *end = lo < hi ? hi : 0;
    return SPMD_OK;
}

/* ---- Reports (read from the compiled program) ------------------------------------------- */

size_t spmd_program_arena_bytes(const spmd_program *p) { return p ? p->c.plan.arena_bytes : 0; }
size_t spmd_program_held_bytes(const spmd_program *p) { return p ? p->c.plan.held_bytes : 0; }
size_t spmd_program_persistent_bytes(const spmd_program *p) { return p ? p->c.persistent_bytes : 0; }
int spmd_program_devices(const spmd_program *p) { return p ? p->c.n_dev : 0; }
int spmd_program_processes(const spmd_program *p) { return p ? p->processes : 0; }
int spmd_program_copies(const spmd_program *p) { return p ? (p->copies ? p->copies : 1) : 0; }
int spmd_program_process(const spmd_program *p) { return p ? p->process : 0; }
size_t spmd_program_allocated_bytes(const spmd_program *p) { return p ? p->allocated : 0; }

int spmd_program_local_devices(const spmd_program *p, int *first)
{
    if (first) *first = p ? p->first : 0;
    return p ? p->n_local : 0;
}
size_t spmd_program_param_bytes(const spmd_program *p) { return p ? compiled_param_bytes(&p->c) : 0; }
size_t spmd_program_peak_bytes(const spmd_program *p) { return p ? compiled_peak_bytes(&p->c) : 0; }

int spmd_program_collective_count(const spmd_program *p)
{
    return p ? compiled_collective_count(&p->c) : 0;
}

spmd_status spmd_program_collective(const spmd_program *p, int i, spmd_collective_info *out)
{
    return compiled_collective(p ? &p->c : NULL, i, out);
}

int spmd_program_overlap(const spmd_program *p, size_t *bytes, size_t *arena_extra)
{
    const plan *pl = p ? &p->c.plan : NULL;
    if (bytes) *bytes = pl ? pl->inflight_bytes : 0;
    if (arena_extra)
        *arena_extra = pl && pl->arena_bytes > pl->serial_arena_bytes
                           ? pl->arena_bytes - pl->serial_arena_bytes : 0;
    return pl ? pl->n_async : 0;
}

size_t spmd_program_inflight_budget(const spmd_program *p)
{
    return p ? p->c.plan.inflight_budget : 0;
}

int spmd_program_fallback_count(const spmd_program *p)
{
    return p ? compiled_fallback_count(&p->c) : 0;
}

spmd_status spmd_program_fallback(const spmd_program *p, int i, char *buf, size_t size)
{
    return compiled_fallback(p ? &p->c : NULL, i, buf, size);
}

int spmd_program_propagation_unsettled(const spmd_program *p)
{
    if (!p || !p->c.partitioned || p->c.part.prop.settled) return 0;
    return p->c.part.prop.rounds;
}

const compiled *executor_compiled(const spmd_program *p) { return p ? &p->c : NULL; }

const partition *executor_partition(const spmd_program *p)
{
    return p && p->c.partitioned ? &p->c.part : NULL;
}

/* ---- Blocks for checkpoints ------------------------------------------------------------ */

bool executor_keeps(const spmd_program *p, const spmd_tensor *t)
{
    return p && p->dev && t && t->graph == p->c.g && is_persistent(t) &&
           compiled_local(&p->c, t) != NULL;
}

/* The boxes of block b of t (any device's: they all have the same). */
static spmd_status block_pieces(const block *b, const spmd_tensor *t, int *pieces)
{
    *pieces = 1;
    for (int i = 0; i < b->rank; i++) {
        if (b->group[i] == b->ldims[i]) continue;
        /* A box per group, contiguous in the block, needs the grouped
         * dim to lead (the GPT's c_attn: 3*tensor on dim 0). */
        if (i > 0)
            return base_error(SPMD_ERR_UNSUPPORTED,
                              "block_of: '%s' is held in a grouped split on dim %d; checkpoints "
                              "take grouped splits on the first dim only", t->name, i);
        *pieces = (int)(b->ldims[i] / b->group[i]);
    }
    return SPMD_OK;
}

spmd_status executor_block_pieces(const spmd_program *p, const spmd_tensor *t, int *pieces)
{
    spmd_status st = check_runnable(p, "block_of");
    if (st != SPMD_OK) return st;
    if (!t || !pieces) return base_error(SPMD_ERR_INVALID, "block_of: tensor or count is NULL");
    block b = block_of(p, t, p->c.mesh ? p->c.mesh->ids[0] : 0);
    return block_pieces(&b, t, pieces);
}

spmd_status executor_block_of(const spmd_program *p, const spmd_tensor *t, int dev_index,
                              int piece, executor_block *out)
{
    spmd_status st = check_runnable(p, "block_of");
    if (st != SPMD_OK) return st;
    if (!t || !out) return base_error(SPMD_ERR_INVALID, "block_of: tensor or block is NULL");
    if (!executor_keeps(p, t))
        return base_error(SPMD_ERR_INVALID,
                          "block_of: '%s' is not a parameter or state this program keeps",
                          t->name ? t->name : ir_op_name(t->op));
    if (dev_index < 0 || dev_index >= p->c.n_dev)
        return base_error(SPMD_ERR_INVALID, "block_of: device index %d, the program has %d",
                          dev_index, p->c.n_dev);
    /* A device of another process: where its block lies, not its data. */
    bool here = dev_index >= p->first && dev_index < p->first + p->n_local;
    const device *d = here ? &p->dev[dev_index - p->first] : NULL;
    int id = p->c.mesh ? p->c.mesh->ids[dev_index] : 0;
    block b = block_of(p, t, id);
    int pieces;
    if ((st = block_pieces(&b, t, &pieces)) != SPMD_OK) return st;
    if (piece < 0 || piece >= pieces)
        return base_error(SPMD_ERR_INVALID, "block_of: piece %d of '%s', which has %d", piece,
                          t->name, pieces);
    memset(out, 0, sizeof *out);
    out->device = id;
    out->copy = p->c.mesh ? mesh_copy_of(p->c.mesh, dev_index) : 0;
    out->rank = b.rank;
    size_t offset = 0;
    for (int i = 0; i < b.rank; i++) {
        out->start[i] = b.start[i];
        out->ldims[i] = b.ldims[i];
        out->valid[i] = b.valid[i];
    }
    if (pieces > 1) {
        /* Group `piece` of the leading dim: rows [piece * group, +group). */
        out->start[0] = piece * b.group_stride[0] + b.start[0];
        out->ldims[0] = out->valid[0] = b.group[0];
        offset = (size_t)(piece * b.group[0]) * (ir_nbytes(compiled_local(&p->c, t)) / (size_t)b.ldims[0]);
    }
    out->data = d ? (char *)data_of(d, compiled_local(&p->c, t)) + offset : NULL;
    return SPMD_OK;
}

spmd_status executor_gather_processes(const spmd_program *p, const void *in, void *out,
                                      int64_t bytes_each)
{
    if (p->processes == 1) {
        memcpy(out, in, (size_t)bytes_each);
        return SPMD_OK;
    }
    spmd_allocator a = p->alloc;
    int64_t *bytes_of = base_alloc(&a, (size_t)p->processes * sizeof *bytes_of, "gather");
    if (!bytes_of) return SPMD_ERR_NOMEM;
    for (int q = 0; q < p->processes; q++) bytes_of[q] = bytes_each;
    spmd_status st = coll_world_gather_processes(p->world, in, out, bytes_of);
    base_free(&a, bytes_of);
    return st;
}

spmd_status executor_check_runnable(const spmd_program *p, const char *what)
{
    return check_runnable(p, what);
}

/* ---- Timeline ---------------------------------------------------------------------------- */

static void trace_free(spmd_program *p)
{
    trace *tr = &p->trace;
    base_free(&p->alloc, tr->times);
    base_free(&p->alloc, tr->run_begin);
    base_free(&p->alloc, tr->run_end);
    base_free(&p->alloc, tr->micro);
    base_free(&p->alloc, tr->micro_steps);
    base_free(&p->alloc, tr->collective);
    *tr = (trace){0};
}

spmd_status spmd_program_trace_begin(spmd_program *p, int runs)
{
    spmd_status st = check_runnable(p, "trace_begin");
    if (st != SPMD_OK) return st;
    if (runs < 1) return base_error(SPMD_ERR_INVALID, "trace_begin: runs %d is not positive", runs);
    trace_free(p);
    trace *tr = &p->trace;
    const spmd_graph *lg = p->c.local;
    size_t rows = (size_t)runs * (size_t)p->n_local, nodes = (size_t)(lg->n_nodes ? lg->n_nodes : 1);
    size_t steps = (size_t)(p->c.plan.n_steps ? p->c.plan.n_steps : 1);
    tr->times = base_alloc(&p->alloc, rows * trace_stride(p) * sizeof *tr->times, "trace");
    tr->run_begin = base_alloc(&p->alloc, (size_t)runs * sizeof *tr->run_begin, "trace");
    tr->run_end = base_alloc(&p->alloc, (size_t)runs * sizeof *tr->run_end, "trace");
    tr->micro = base_alloc(&p->alloc, (size_t)runs * sizeof *tr->micro, "trace");
    tr->micro_steps = base_alloc(&p->alloc, steps * sizeof *tr->micro_steps, "trace");
    tr->collective = base_alloc(&p->alloc, nodes * sizeof *tr->collective, "trace");
    if (!tr->times || !tr->run_begin || !tr->run_end || !tr->micro || !tr->micro_steps ||
        !tr->collective) {
        trace_free(p);
        return SPMD_ERR_NOMEM;
    }
    for (int s = 0; s < p->c.plan.n_steps; s++)
        if (!p->c.micro || p->c.micro[p->c.plan.steps[s]->id]) tr->micro_steps[tr->n_micro_steps++] = s;
    for (size_t i = 0; i < nodes; i++) tr->collective[i] = -1;
    for (int i = 0; p->c.partitioned && i < p->c.part.n_colls; i++)
        tr->collective[p->c.part.colls[i].node] = i;
    tr->room = runs;
    tr->origin = clock_ns();
    tr->on = true;
    return SPMD_OK;
}

spmd_status spmd_program_trace_end(spmd_program *p)
{
    spmd_status st = check_runnable(p, "trace_end");
    if (st == SPMD_OK) p->trace.on = false;
    return st;
}

/* Collectives in flight that traced run `run` ran on each device. */
static int trace_run_inflight(const spmd_program *p, int run)
{
    if (!p->c.plan.n_async) return 0;
    return p->trace.micro[run] ? p->fly.n_micro : p->c.plan.n_async;
}

/* Events of one traced run: the run, then per device its steps, its
 * update and its collectives in flight. */
static int trace_run_events(const spmd_program *p, int run)
{
    int steps = p->trace.micro[run] ? p->trace.n_micro_steps : p->c.plan.n_steps;
    return 1 + p->n_local * (steps + 1 + trace_run_inflight(p, run));
}

int spmd_program_trace_count(const spmd_program *p)
{
    int n = 0;
    for (int r = 0; p && r < p->trace.runs; r++) n += trace_run_events(p, r);
    return n;
}

static double to_us(int64_t ns) { return (double)ns / 1e3; }

spmd_status spmd_program_trace_event(const spmd_program *p, int i, spmd_trace_event *out)
{
    if (!out) return base_error(SPMD_ERR_INVALID, "trace_event: out is NULL");
    int total = spmd_program_trace_count(p), run = 0;
    if (!p || i < 0 || i >= total)
        return base_error(SPMD_ERR_INVALID, "trace_event: index %d outside 0..%d", i, total - 1);
    const trace *tr = &p->trace;
    while (i >= trace_run_events(p, run)) i -= trace_run_events(p, run++);
    memset(out, 0, sizeof *out);
    out->run = run;
    out->collective = -1;
    if (i == 0) {
        out->kind = SPMD_TRACE_RUN;
        out->device = -1;
        out->start_us = to_us(tr->run_begin[run]);
        out->dur_us = to_us(tr->run_end[run] - tr->run_begin[run]);
        snprintf(out->name, sizeof out->name, "%s", tr->micro[run] ? "micro-batch" : "step");
        return SPMD_OK;
    }
    i--;
    bool micro = tr->micro[run];
    int steps = micro ? tr->n_micro_steps : p->c.plan.n_steps;
    int per_device = steps + 1 + trace_run_inflight(p, run), k = i / per_device;
    int j = i % per_device;
    size_t stride = trace_stride(p);
    const int64_t *row = tr->times + ((size_t)run * (size_t)p->n_local + (size_t)k) * stride;
    const size_t update = 2 * (size_t)p->c.plan.n_steps + 1;
    out->device = p->dev[k].id;
    if (j == steps) {
        out->kind = SPMD_TRACE_UPDATE;
        out->start_us = to_us(row[update]);
        out->dur_us = to_us(row[update + 1] - row[update]);
        snprintf(out->name, sizeof out->name, "update");
        return SPMD_OK;
    }
    const spmd_tensor *t;
    if (j > steps) {
        /* The run's (j - steps)-th collective in flight, on the device's
         * communication thread; wait_us: thread 0's wait for its result. */
        int f = j - steps - 1, a = 0;
        for (a = 0; micro && a < p->c.plan.n_async; a++)
            if (p->fly.micro_rank[a] == f) break;
        if (!micro) a = f;
        size_t slot = inflight_slot(p, a);
        t = p->c.plan.steps[p->c.plan.async_step[a]];
        out->kind = SPMD_TRACE_IN_FLIGHT;
        out->start_us = to_us(row[slot]);
        out->dur_us = to_us(row[slot + 1] - row[slot]);
        out->wait_us = to_us(row[slot + 3] - row[slot + 2]);
        out->collective = tr->collective[t->id];
    } else {
        /* A step begins where the one before it (of those this run ran) ended. */
        int s = micro ? tr->micro_steps[j] : j;
        int64_t begin = j == 0 ? row[0] : row[2 + 2 * (micro ? tr->micro_steps[j - 1] : j - 1)];
        t = p->c.plan.steps[s];
        out->start_us = to_us(begin);
        out->dur_us = to_us(row[2 + 2 * s] - begin);
        out->wait_us = to_us(row[2 + 2 * s] - row[1 + 2 * s]);
        out->collective = tr->collective[t->id];
        out->kind = out->collective >= 0 ? SPMD_TRACE_COLLECTIVE : SPMD_TRACE_COMPUTE;
    }
    out->op = fusion_group(&p->c.fusion, t) ? "fused" : ir_op_name(t->op);
    if (t->name) snprintf(out->name, sizeof out->name, "%s", t->name);
    else snprintf(out->name, sizeof out->name, "%s#%d", ir_op_name(t->op), t->id);
    ir_shape_str(t, out->shape, sizeof out->shape);
    return SPMD_OK;
}
