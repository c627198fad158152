/*
 * Parameter initialisation: every device fills its blocks of the
 * parameters and state, and zeroes its other leaves, when first needed.
 * Deferred from compile because a caller who loads a model (GPT-2
 * weights, a PyTorch module's) writes every parameter first: drawing 124M's normal
 * values took half of its compile for nothing.
 */
#include "runtime/executor_impl.h"
#include "base/rng.h"

#include <string.h>

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
        case SPMD_INIT_CONSTANT: x[i] = s; break;
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
        if (!p->init_pending[(size_t)t->id * (size_t)p->copies + (size_t)d->copy]) continue;
        const spmd_tensor *lt = p->c.partitioned ? p->c.part.local_of[i] : t;
        if (!lt || !exec_on_stage(d, lt)) continue; /* another stage's: not held here */
        block b = exec_block_of(p, t, d->id);
        if (d->share_rank && p->share_as[lt->id] >= 0 && d->share_rank[lt->id] != 0) continue;
        if (!ir_is_persistent(t)) {
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
            if (hi > lo) exec_for_rows(&part, init_row, &c);
        } else if (ith == 0) {
            init_ctx c = {t, d->leaf_data[lt->id], d->seed, base_rng_stream(t->name)};
            exec_for_rows(&b, init_row, &c);
        }
    }
}

static void device_init(void *ctx, int ith, int nth)
{
    (void)nth;
    spmd_program *p = ctx;
    rt_pool_run(p->dev[ith].pool, init_worker, &p->dev[ith]);
}

spmd_status exec_init_params(spmd_program *p)
{
    const spmd_graph *g = p->c.g;
    size_t n = (size_t)(g->n_nodes ? g->n_nodes : 1) * (size_t)p->copies;
    p->init_pending = base_calloc(&p->alloc, n * sizeof *p->init_pending, "initial values' marks");
    if (!p->init_pending) return SPMD_ERR_NOMEM;
    for (int i = 0; i < g->n_nodes; i++)
        if (ir_op_is_leaf(g->nodes[i]->op))
            for (int c = 0; c < p->copies; c++)
                p->init_pending[(size_t)i * (size_t)p->copies + (size_t)c] = true;
    return SPMD_OK;
}

void exec_init_pending(const spmd_program *p)
{
    if (!p->init_pending) return;
    /* A program is never defined const: the const of a read is the
     * caller's promise not to change what it computes, which holds. */
    spmd_program *mp = (spmd_program *)p;
    if (p->n_local > 1) rt_pool_run(mp->outer, device_init, mp);
    else rt_pool_run(p->dev[0].pool, init_worker, &p->dev[0]);
    base_free(&mp->alloc, mp->init_pending);
    mp->init_pending = NULL;
}

void exec_note_leaf_written(spmd_program *p, const spmd_tensor *t, int copy)
{
    if (!p->init_pending) return;
    bool *mark = &p->init_pending[(size_t)t->id * (size_t)p->copies];
    for (int c = 0; c < p->copies; c++)
        if (copy < 0 || c == copy) mark[c] = false;
}
