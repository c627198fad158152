/*
 * The one-device executor: owns the arena and the persistent tensors of a
 * compiled program and runs its schedule on a pool of threads, every
 * thread on every node (kernels split work by thread index), with a
 * barrier between nodes.
 *
 * The program borrows its graph: the graph must outlive it.
 */
#include "base/error.h"
#include "base/rng.h"
#include "compile/plan.h"
#include "runtime/blas.h"
#include "runtime/kernels.h"
#include "runtime/pool.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

struct spmd_program {
    spmd_allocator alloc;
    const spmd_graph *g;
    plan plan;
    int nth;
    rt_pool *pool;
    unsigned char *arena;
    unsigned char *scratch;   /* nth slices of scratch_each bytes */
    size_t scratch_each;
    void **leaf_data;         /* per node id: storage of inputs, params, state */
    size_t persistent_bytes;  /* params and state */
    size_t input_bytes;
    uint64_t seed;
    /* First failure of the current run, one word per step parity (see
     * run_worker); at most one of them is ever set in a run. */
    _Atomic int status[2];
    char message[512];
};

static bool is_persistent(const spmd_tensor *t) { return t->op == IR_PARAM || t->op == IR_STATE; }

static void *data_of(const spmd_program *p, const spmd_tensor *t)
{
    if (ir_op_is_leaf(t->op)) return p->leaf_data[t->id];
    return p->arena + p->plan.offset[t->id];
}

/* ---- Parameter initialisation ------------------------------------------------ */

typedef struct init_job {
    spmd_program *p;
} init_job;

/* Values depend on (seed, name, element index) only: the same on any
 * thread count and, later, any sharding. */
static void init_range(const spmd_tensor *t, float *x, int64_t begin, int64_t end, uint64_t seed)
{
    uint64_t stream = base_rng_stream(t->name);
    float s = t->init.scale;
    switch (t->init.kind) {
    case SPMD_INIT_ZEROS:
        for (int64_t i = begin; i < end; i++) x[i] = 0.0f;
        break;
    case SPMD_INIT_ONES:
        for (int64_t i = begin; i < end; i++) x[i] = 1.0f;
        break;
    case SPMD_INIT_NORMAL:
        for (int64_t i = begin; i < end; i++) x[i] = s * base_rng_normal(seed, stream, (uint64_t)i);
        break;
    case SPMD_INIT_UNIFORM:
        for (int64_t i = begin; i < end; i++)
            x[i] = s * (2.0f * base_rng_uniform(seed, stream, (uint64_t)i) - 1.0f);
        break;
    }
}

static void init_worker(void *ctx, int ith, int nth)
{
    spmd_program *p = ctx;
    for (int i = 0; i < p->g->n_nodes; i++) {
        const spmd_tensor *t = p->g->nodes[i];
        if (!ir_op_is_leaf(t->op)) continue;
        int64_t b, e;
        kern_split(ir_numel(t), ith, nth, 16, &b, &e);
        if (is_persistent(t)) init_range(t, p->leaf_data[i], b, e, p->seed);
        else memset((char *)p->leaf_data[i] + b * 4, 0, (size_t)(e - b) * 4);
    }
}

/* ---- Compile -------------------------------------------------------------------- */

static spmd_status check_graph(const spmd_graph *g)
{
    for (int i = 0; i < g->n_nodes; i++) {
        const spmd_tensor *t = g->nodes[i];
        if (t->dtype == SPMD_BF16)
            return base_error(SPMD_ERR_UNSUPPORTED, "compile: %s node %d is bf16, not computed yet",
                              ir_op_name(t->op), i);
        if (!ir_op_is_leaf(t->op) && !kern_for(t->op))
            return base_error(SPMD_ERR_INTERNAL, "compile: no kernel for %s", ir_op_name(t->op));
    }
    return SPMD_OK;
}

spmd_program *spmd_compile(spmd_graph *g, const spmd_compile_options *opts)
{
    if (!g) {
        base_error(SPMD_ERR_INVALID, "compile: graph is NULL");
        return NULL;
    }
    if (check_graph(g) != SPMD_OK) return NULL;
    if (blas_init(BLAS_AUTO, NULL) != SPMD_OK) return NULL;

    spmd_program *p = base_calloc(&g->alloc, sizeof *p, "program");
    if (!p) return NULL;
    p->alloc = g->alloc;
    p->g = g;
    p->seed = opts ? opts->seed : 0;
    p->nth = opts && opts->threads > 0 ? opts->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (p->nth < 1) p->nth = 1;
    if (p->nth > 256) p->nth = 256;

    if (plan_build(&p->plan, g, &p->alloc) != SPMD_OK) goto fail;
    p->leaf_data = base_calloc(&p->alloc, (size_t)(g->n_nodes ? g->n_nodes : 1) * sizeof(void *),
                               "program tensors");
    if (!p->leaf_data) goto fail;
    for (int i = 0; i < g->n_nodes; i++) {
        const spmd_tensor *t = g->nodes[i];
        if (!ir_op_is_leaf(t->op)) continue;
        size_t bytes = ir_nbytes(t);
        p->leaf_data[i] = base_alloc(&p->alloc, bytes, t->name);
        if (!p->leaf_data[i]) goto fail;
        if (is_persistent(t)) p->persistent_bytes += bytes;
        else p->input_bytes += bytes;
    }
    if (p->plan.arena_bytes) {
        p->arena = base_alloc(&p->alloc, p->plan.arena_bytes, "activation arena");
        if (!p->arena) goto fail;
    }
    for (int s = 0; s < p->plan.n_steps; s++) {
        size_t need = kern_scratch_bytes(p->plan.steps[s], p->nth);
        if (need > p->scratch_each) p->scratch_each = need;
    }
    p->scratch_each = (p->scratch_each + 63) / 64 * 64;
    if (p->scratch_each) {
        p->scratch = base_alloc(&p->alloc, p->scratch_each * (size_t)p->nth, "kernel scratch");
        if (!p->scratch) goto fail;
    }
    p->pool = rt_pool_create(p->nth, &p->alloc);
    if (!p->pool) goto fail;
    rt_pool_run(p->pool, init_worker, p);
    return p;

fail:
    spmd_program_free(p);
    return NULL;
}

void spmd_program_free(spmd_program *p)
{
    if (!p) return;
    if (p->pool) rt_pool_free(p->pool);
    if (p->leaf_data)
        for (int i = 0; i < p->plan.n_nodes; i++) base_free(&p->alloc, p->leaf_data[i]);
    base_free(&p->alloc, p->leaf_data);
    base_free(&p->alloc, p->arena);
    base_free(&p->alloc, p->scratch);
    plan_free(&p->plan);
    spmd_allocator a = p->alloc;
    base_free(&a, p);
}

/* ---- Run ------------------------------------------------------------------------- */

static void run_worker(void *ctx, int ith, int nth)
{
    spmd_program *p = ctx;
    kern_args a = {0};
    a.ith = ith;
    a.nth = nth;
    a.message = p->message;
    a.message_size = sizeof p->message;
    a.scratch = p->scratch ? p->scratch + (size_t)ith * p->scratch_each : NULL;
    for (int s = 0; s < p->plan.n_steps; s++) {
        const spmd_tensor *t = p->plan.steps[s];
        a.node = t;
        for (int j = 0; j < t->n_in; j++) a.in[j] = data_of(p, t->in[j]);
        a.out = data_of(p, t);
        /* Steps alternate between two status words: a fast thread that
         * has passed this barrier and already fails step s + 1 writes the
         * other word, so a slow thread still reading step s's word cannot
         * stop one step early and leave the others at the next barrier. */
        a.status = &p->status[s & 1];
        kern_for(t->op)(&a);
        rt_pool_barrier(p->pool);
        /* Every thread reads this step's word after the same barrier, so
         * all stop at the same node. */
        if (atomic_load(a.status) != SPMD_OK) return;
    }
    /* Updates: copy new values into parameters and state. */
    const spmd_graph *g = p->g;
    for (int u = 0; u < g->n_updates; u++) {
        const ir_update *up = &g->updates[u];
        int64_t b, e;
        kern_split((int64_t)ir_nbytes(up->target), ith, nth, 64, &b, &e);
        memcpy((char *)data_of(p, up->target) + b, (const char *)data_of(p, up->value) + b,
               (size_t)(e - b));
    }
}

spmd_status spmd_program_run(spmd_program *p)
{
    if (!p) return base_error(SPMD_ERR_INVALID, "run: program is NULL");
    atomic_store(&p->status[0], SPMD_OK);
    atomic_store(&p->status[1], SPMD_OK);
    p->message[0] = '\0';
    rt_pool_run(p->pool, run_worker, p);
    int status = atomic_load(&p->status[0]);
    if (status == SPMD_OK) status = atomic_load(&p->status[1]);
    if (status != SPMD_OK) return base_error((spmd_status)status, "%s", p->message);
    return SPMD_OK;
}

/* ---- Data in and out ------------------------------------------------------------ */

static spmd_status check_access(const spmd_program *p, const spmd_tensor *t, size_t bytes,
                                const char *what)
{
    if (!p || !t) return base_error(SPMD_ERR_INVALID, "%s: program or tensor is NULL", what);
    if (t->graph != p->g || t->id >= p->plan.n_nodes)
        return base_error(SPMD_ERR_INVALID, "%s: tensor is not part of this program", what);
    if (bytes != ir_nbytes(t)) {
        char s[96];
        return base_error(SPMD_ERR_SHAPE, "%s: '%s' %s %s holds %zu bytes, buffer has %zu", what,
                          t->name ? t->name : ir_op_name(t->op), spmd_dtype_name(t->dtype),
                          ir_shape_str(t, s, sizeof s), ir_nbytes(t), bytes);
    }
    return SPMD_OK;
}

spmd_status spmd_program_set_input(spmd_program *p, const spmd_tensor *t, const void *data,
                                   size_t bytes)
{
    spmd_status st = check_access(p, t, bytes, "set_input");
    if (st != SPMD_OK) return st;
    if (t->op != IR_INPUT)
        return base_error(SPMD_ERR_INVALID, "set_input: '%s' is a %s, not an input",
                          t->name ? t->name : "(unnamed)", ir_op_name(t->op));
    memcpy(p->leaf_data[t->id], data, bytes);
    return SPMD_OK;
}

spmd_status spmd_program_write(spmd_program *p, const spmd_tensor *t, const void *src,
                               size_t bytes)
{
    spmd_status st = check_access(p, t, bytes, "write");
    if (st != SPMD_OK) return st;
    if (!is_persistent(t))
        return base_error(SPMD_ERR_INVALID, "write: '%s' is a %s, not a param or state",
                          t->name ? t->name : "(unnamed)", ir_op_name(t->op));
    memcpy(p->leaf_data[t->id], src, bytes);
    return SPMD_OK;
}

spmd_status spmd_program_read(const spmd_program *p, const spmd_tensor *t, void *dst,
                              size_t bytes)
{
    spmd_status st = check_access(p, t, bytes, "read");
    if (st != SPMD_OK) return st;
    if (!ir_op_is_leaf(t->op) && !t->is_output)
        return base_error(SPMD_ERR_INVALID,
                          "read: %s '%s' is not kept after a run; mark it with "
                          "spmd_graph_mark_output before compiling",
                          ir_op_name(t->op), t->name ? t->name : "(unnamed)");
    memcpy(dst, data_of(p, t), bytes);
    return SPMD_OK;
}

/* ---- Memory report ---------------------------------------------------------------- */

size_t spmd_program_arena_bytes(const spmd_program *p) { return p ? p->plan.arena_bytes : 0; }
size_t spmd_program_persistent_bytes(const spmd_program *p) { return p ? p->persistent_bytes : 0; }

size_t spmd_program_peak_bytes(const spmd_program *p)
{
    if (!p) return 0;
    return p->persistent_bytes + p->input_bytes + p->plan.arena_bytes +
           p->scratch_each * (size_t)p->nth;
}
