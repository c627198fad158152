/*
 * Compiling a graph: partition it over the marks' mesh (shard/), plan the
 * local program (plan.c), and size what a device will need (see
 * compiled.h).
 */
#include "compile/compiled.h"
#include "compile/stages.h"
#include "compile/tiles.h"
#include "base/arena.h"
#include "base/error.h"
#include "spmd/mesh.h"

#include <string.h>
#include <unistd.h>

/* bf16 only where a kernel takes it (ops.def's bf16 column): made by
 * convert, moved by the ops that move values, read by matmul and bmm
 * (summed in f32) and by the backward ops that widen a kept activation.
 * Everything else computes f32: a bf16 value elsewhere (a sum over bf16
 * addends, a user's bf16 input) is refused, naming the op. */
static spmd_status check_dtypes(const spmd_graph *g)
{
    for (int i = 0; i < g->n_nodes; i++) {
        const spmd_tensor *t = g->nodes[i];
        for (int j = 0; j < t->n_in; j++)
            if (t->in[j]->dtype == SPMD_BF16 && !ir_op_reads_bf16(t->op, j))
                return base_error(SPMD_ERR_UNSUPPORTED,
                                  "compile: %s node %d reads bf16 (operand %d); only convert, "
                                  "matmul, bmm, the ops that move values and the backward ops "
                                  "that read a kept activation take bf16",
                                  ir_op_name(t->op), i, j);
        if (t->dtype == SPMD_BF16 && !ir_op_makes_bf16(t->op))
            return base_error(SPMD_ERR_UNSUPPORTED,
                              "compile: %s node %d is bf16; only convert makes bf16 values "
                              "(inputs, parameters and state are f32 or i32)",
                              ir_op_name(t->op), i);
    }
    return SPMD_OK;
}

/* Leave every tensor's sharding on the graph, for spmd_get_sharding: what
 * the program holds (leaves, outputs) or what its op produces.  Tensors
 * point at shared copies in the graph's arena (a model has a few dozen
 * distinct shardings), so a compile adds little to the graph. */
static spmd_status record_shardings(const compiled *c, spmd_graph *g)
{
    base_intern shared;
    base_intern_init(&shared, &g->arena, sizeof(sharding));
    spmd_status st = SPMD_OK;
    for (int i = 0; i < g->n_nodes && st == SPMD_OK; i++) {
        const sharding *s = c->part.local_of[i] ? &c->part.held[i] : &c->part.prop.nodes[i].out;
        const sharding *copy = base_intern_get(&shared, s);
        if (copy) g->nodes[i]->sharding = copy;
        else st = SPMD_ERR_NOMEM;
    }
    base_intern_free(&shared);
    return st;
}

/* ---- Kernel scratch: ops.def's scratch column ---------------------------------- */

typedef size_t (*scratch_fn)(const spmd_tensor *t);

static size_t scratch_none(const spmd_tensor *t)
{
    (void)t;
    return 0;
}

/* A block of query rows against all keys: its scores. */
static size_t scratch_attention(const spmd_tensor *t)
{
    if (t->n_in < 2 || t->in[1]->rank != 3) return 0;
    return (size_t)COMPILE_ATTN_BLOCK * (size_t)t->in[1]->dims[1] * sizeof(float);
}

/* The forward's scores plus their gradients; with bf16 q, k and v (kept
 * under mixed precision, ir/autocast.c) also one head of each widened to
 * f32, [T, C / heads] of q and [S, C / heads] of k and v. */
static size_t scratch_attention_backward(const spmd_tensor *t)
{
    size_t n = 2 * scratch_attention(t);
    bool narrow = t->n_in >= 3 && (t->in[0]->dtype == SPMD_BF16 || t->in[1]->dtype == SPMD_BF16 ||
                                   t->in[2]->dtype == SPMD_BF16);
    if (narrow && t->in[0]->rank == 3 && t->in[1]->rank == 3 && t->attr.attention.heads > 0)
        n += (size_t)(t->in[0]->dims[1] + 2 * t->in[1]->dims[1]) *
             (size_t)(t->in[0]->dims[2] / t->attr.attention.heads) * sizeof(float);
    return n;
}

/* A block of query rows against every cached key. */
static size_t scratch_cached_attention(const spmd_tensor *t)
{
    if (t->n_in < 2 || t->in[1]->rank != 3) return 0;
    return (size_t)COMPILE_ATTN_BLOCK * (size_t)t->in[1]->dims[1] * sizeof(float);
}

/* A row of a bf16 operand 0 widened to f32 (layernorm's backward ops on
 * a kept activation, ir/autocast.c). */
static size_t scratch_widen_row(const spmd_tensor *t)
{
    const spmd_tensor *x = t->n_in > 0 ? t->in[0] : NULL;
    if (!x || x->dtype != SPMD_BF16 || x->rank < 1) return 0;
    return (size_t)x->dims[x->rank - 1] * sizeof(float);
}

/* A tile of the im2col matrix (compile/tiles.h, conv_plan). */
static size_t scratch_conv2d(const spmd_tensor *t) { return conv_scratch_bytes(t); }

/* Pooling works a row of the pooled output at a time (kernels_pool.c):
 * its sums in double (avg_pool2d), each output's share of its gradient
 * (avg_pool2d_backward), or the running maxima and their positions
 * (max_pool2d_backward); the pooled row is the result's, or the last
 * operand's in the backward ops. */
static size_t pooled_row(const spmd_tensor *pooled) { return (size_t)pooled->dims[pooled->rank - 1]; }
static size_t scratch_pool_sums(const spmd_tensor *t) { return pooled_row(t) * sizeof(double); }
static size_t scratch_pool_shares(const spmd_tensor *t)
{
    return pooled_row(t->in[0]) * sizeof(float);
}
static size_t scratch_max_pool_backward(const spmd_tensor *t)
{
    return pooled_row(t->in[1]) * (sizeof(int64_t) + sizeof(float));
}

/* Packed send and receive buffers (thread 0 only). */
static size_t scratch_all_to_all(const spmd_tensor *t) { return 2 * ir_nbytes(t->in[0]); }

static const scratch_fn scratch_table[] = {
#define OP(e, name, arity, sig, lin, fix, vjp, kern, groups, formula, scratch, kind, bf16) scratch,
#include "ir/ops.def"
#undef OP
};

_Static_assert(sizeof scratch_table / sizeof scratch_table[0] == IR_OP_COUNT,
               "scratch table out of step with ops.def");

size_t compile_scratch_bytes(const spmd_tensor *t)
{
    return (unsigned)t->op < IR_OP_COUNT ? scratch_table[t->op](t) : 0;
}


/* No mark splits over an independent axis (one declared after marking):
 * copies share nothing. */
static spmd_status check_independent_axes(const spmd_graph *g)
{
    const spmd_mesh *m = g->mesh;
    for (int i = 0; i < g->n_nodes; i++) {
        const spmd_tensor *t = g->nodes[i];
        if (!t->mark) continue;
        for (int d = 0; d < t->mark->rank; d++)
            for (int k = 0; k < t->mark->dim[d].n; k++)
                if (m->independent[t->mark->dim[d].axis[k]])
                    return base_error(SPMD_ERR_INVALID,
                                      "compile: '%s' is marked split over axis '%s', which is "
                                      "independent (each copy is a model of its own)",
                                      t->name ? t->name : ir_op_name(t->op),
                                      m->names[t->mark->dim[d].axis[k]]);
    }
    return SPMD_OK;
}

/* What a micro-batch runs: every node the forward and backward pass's
 * outputs (the loss) and the accumulators' sums need.  The update's
 * nodes (the reductions of the sums among them) wait for the step's
 * last micro-batch. */
static spmd_status mark_micro(compiled *c)
{
    const spmd_graph *g = c->g, *lg = c->local;
    size_t nn = (size_t)(lg->n_nodes ? lg->n_nodes : 1);
    c->micro = base_calloc(&c->alloc, nn * sizeof *c->micro, "the micro-batch schedule");
    if (!c->micro) return SPMD_ERR_NOMEM;
    for (int i = 0; i < g->n_nodes; i++) {
        const spmd_tensor *lt = g->nodes[i]->is_output ? compiled_local(c, g->nodes[i]) : NULL;
        if (lt && partition_phase(g, i) != PART_UPDATE) c->micro[lt->id] = true;
    }
    for (int u = 0; u < lg->n_updates; u++)
        if (lg->updates[u].target->accumulator) c->micro[lg->updates[u].value->id] = true;
    ir_mark_inputs(lg, c->micro, lg->n_nodes - 1);
    return SPMD_OK;
}

static _Thread_local bool sharing_off; /* compile_test_sharing(false) */

void compile_test_sharing(bool on) { sharing_off = !on; }

/* Which leaves every device of a copy can hold in one buffer: parameters
 * and state, whose blocks are the same on every device that holds them
 * (an accumulator's sums are each device's own), whole or split on one
 * dim whose dims before it are 1, in plain blocks (not grouped), so that
 * the blocks lie side by side, block i at i times its bytes. */
static spmd_status mark_shared(compiled *c)
{
    const spmd_graph *g = c->g, *lg = c->local;
    const spmd_mesh *m = c->mesh;
    size_t nn = (size_t)(lg->n_nodes ? lg->n_nodes : 1);
    size_t ns = (size_t)(c->part.n_specs ? c->part.n_specs : 1);
    c->share_blocks = base_calloc(&c->alloc, nn * sizeof *c->share_blocks, "shared leaves");
    c->sharers = base_calloc(&c->alloc, nn * sizeof *c->sharers, "shared leaves");
    c->group_size = base_calloc(&c->alloc, ns * sizeof *c->group_size, "shared leaves");
    if (!c->share_blocks || !c->sharers || !c->group_size) return SPMD_ERR_NOMEM;
    int per_copy = c->n_dev;
    for (int a = 0; a < m->rank; a++)
        if (m->independent[a]) per_copy /= m->shape[a];
    for (int s = 0; s < c->part.n_specs; s++) c->group_size[s] = mesh_axes_size(m, &c->part.specs[s]);
    for (int i = 0; i < g->n_nodes; i++) {
        const spmd_tensor *t = g->nodes[i], *lt = c->part.local_of[i];
        if (!lt || !ir_is_persistent(t) || t->accumulator || lt->accumulator) continue;
        const sharding *held = &c->part.held[i];
        int split = -1, n_split = 0;
        bool plain = !held->partial;
        for (int d = 0; d < held->rank; d++) {
            if (!held->dim[d].n) continue;
            split = d, n_split++;
            plain = plain && mesh_axes_groups(&held->dim[d]) == 1;
        }
        for (int d = 0; d < split; d++) plain = plain && lt->dims[d] == 1;
        if (!plain || n_split > 1) continue;
        int blocks = split >= 0 ? mesh_axes_size(m, &held->dim[split]) : 1;
        c->share_blocks[lt->id] = blocks;
        c->sharers[lt->id] = per_copy / blocks;
    }
    return SPMD_OK;
}

spmd_status compile_graph(compiled *c, spmd_graph *g, const compile_options *opts)
{
    int threads = opts->threads, devices_here = opts->devices_here;
    memset(c, 0, sizeof *c);
    c->alloc = g->alloc;
    c->g = g;
    c->local = g;
    c->mesh = g->mesh;
    c->n_dev = g->mesh ? spmd_mesh_devices(g->mesh) : 1;
    if (threads <= 0) threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    /* Each device here gets its share of the threads, at least one. */
    c->nth = threads / (devices_here > 0 ? devices_here : c->n_dev);
    if (c->nth < 1) c->nth = 1;
    if (c->nth > 256) c->nth = 256;

    spmd_status st = check_dtypes(g);
    if (st != SPMD_OK) return st;
    if (g->mesh && (st = check_independent_axes(g)) != SPMD_OK) return st;
    bool staged = g->mesh && mesh_stage_axis(g->mesh) >= 0;
    if (g->mesh) {
        /* Only the nodes that outputs and updates need are partitioned. */
        size_t nn = (size_t)(g->n_nodes ? g->n_nodes : 1);
        bool *needed = base_calloc(&c->alloc, nn * sizeof *needed, "schedule");
        int16_t *stage_of = staged ? base_alloc(&c->alloc, nn * sizeof *stage_of, "stages") : NULL;
        if (!needed || (staged && !stage_of)) {
            base_free(&c->alloc, needed);
            base_free(&c->alloc, stage_of);
            return SPMD_ERR_NOMEM;
        }
        plan_mark_needed(g, needed);
        st = staged ? stages_settle(g, needed, opts->overlap, stage_of) : SPMD_OK;
        if (st == SPMD_OK) {
            st = partition_build(&c->part, g, g->mesh, needed, &c->alloc);
            c->partitioned = true;
        }
        base_free(&c->alloc, needed);
        if (st == SPMD_OK && staged) stages_place(c);
        base_free(&c->alloc, stage_of);
        if (st != SPMD_OK) return st;
        c->local = c->part.local;
        if ((st = check_dtypes(c->local)) != SPMD_OK) return st;
        if ((st = record_shardings(c, g)) != SPMD_OK) return st;
    }
    if (c->local->accumulate_steps > 1 && (st = mark_micro(c)) != SPMD_OK) return st;
    if (opts->fuse) {
        size_t nn = (size_t)(c->local->n_nodes ? c->local->n_nodes : 1);
        bool *needed = base_calloc(&c->alloc, nn * sizeof *needed, "fusion");
        if (!needed) return SPMD_ERR_NOMEM;
        plan_mark_needed(c->local, needed);
        st = fusion_build(&c->fusion, c->local, needed, c->micro, &c->alloc);
        base_free(&c->alloc, needed);
        if (st != SPMD_OK) return st;
    }
    int depth = opts->overlap && c->partitioned && c->n_dev > 1 ? PLAN_OVERLAP_DEPTH : 0;
    size_t budget = opts->inflight_bytes ? opts->inflight_bytes : (size_t)SPMD_INFLIGHT_MIB << 20;
    /* Peers' blocks can be read in place only where every peer is here
     * (and explain's plan over processes, spmd_mesh_place_processes, is
     * one that runs in one). */
    bool shared = c->partitioned && !staged && (devices_here <= 0 || devices_here == c->n_dev) &&
                  spmd_mesh_processes(g->mesh) <= 1 && !sharing_off;
    if (shared && (st = mark_shared(c)) != SPMD_OK) return st;
    plan_sharing sharing = {c->share_blocks, c->sharers, c->group_size};
    int64_t *priority = NULL;
    if (staged && opts->one_f_one_b && (st = stages_priority(c, &priority)) != SPMD_OK) return st;
    st = plan_build_overlap(&c->plan, c->local, &c->alloc, &c->fusion, depth, budget,
                            shared ? &sharing : NULL, staged ? &(plan_stages){priority} : NULL);
    base_free(&c->alloc, priority);
    if (st != SPMD_OK) return st;
    for (int s = 0; s < c->plan.n_steps; s++) {
        const fuse_group *grp = fusion_group(&c->fusion, c->plan.steps[s]);
        size_t need = grp ? fusion_scratch_bytes(grp) : compile_scratch_bytes(c->plan.steps[s]);
        if (need > c->scratch_each) c->scratch_each = need;
    }
    c->scratch_each = (c->scratch_each + 63) / 64 * 64;
    for (int i = 0; i < c->local->n_nodes; i++) {
        const spmd_tensor *t = c->local->nodes[i];
        if (!ir_op_is_leaf(t->op)) continue;
        if (ir_is_persistent(t)) c->persistent_bytes += ir_nbytes(t);
        else c->input_bytes += ir_nbytes(t);
    }
    return SPMD_OK;
}

void compiled_free(compiled *c)
{
    plan_free(&c->plan);
    fusion_free(&c->fusion);
    base_free(&c->alloc, c->micro);
    base_free(&c->alloc, c->share_blocks);
    base_free(&c->alloc, c->sharers);
    base_free(&c->alloc, c->group_size);
    if (c->partitioned) partition_free(&c->part);
    memset(c, 0, sizeof *c);
}

const spmd_tensor *compiled_local(const compiled *c, const spmd_tensor *t)
{
    return c->partitioned ? c->part.local_of[t->id] : t;
}

sharding compiled_held(const compiled *c, const spmd_tensor *t)
{
    return c->partitioned ? c->part.held[t->id] : sharding_replicated(t->rank);
}

/* On pipeline stages a device holds the leaves and update values of no
 * stage and of its own (the executor's rule), so the bytes "per device"
 * are those of the device holding the most: per stage, its parameters
 * and state, its parameters alone, and its update values in buffers of
 * their own.  stage -1: every one (a mesh without stages). */
typedef struct stage_bytes {
    size_t persistent, params, swapped;
} stage_bytes;

static stage_bytes held_on(const compiled *c, int stage)
{
    stage_bytes b = {0, 0, 0};
    for (int i = 0; i < c->local->n_nodes; i++) {
        const spmd_tensor *t = c->local->nodes[i];
        if (stage >= 0 && t->stage >= 0 && t->stage != stage) continue;
        if (ir_is_persistent(t)) b.persistent += ir_nbytes(t);
        if (t->op == IR_PARAM) b.params += ir_nbytes(t);
        if (c->plan.swapped[i]) b.swapped += ir_nbytes(t);
    }
    return b;
}

static int stage_count(const compiled *c) { return c->plan.n_stage_arenas; }

size_t compiled_peak_bytes(const compiled *c)
{
    size_t fixed = c->input_bytes + c->scratch_each * (size_t)c->nth;
    if (stage_count(c) == 0)
        return c->persistent_bytes + c->plan.arena_bytes + c->plan.swapped_bytes + fixed;
    size_t most = 0;
    for (int s = 0; s < stage_count(c); s++) {
        stage_bytes b = held_on(c, s);
        size_t bytes = b.persistent + compiled_stage_arena_bytes(c, s) + b.swapped + fixed;
        if (bytes > most) most = bytes;
    }
    return most;
}

/* The stage whose device holds the most parameters and state; -1 without
 * stages. */
static int fullest_stage(const compiled *c)
{
    int best = -1;
    size_t most = 0;
    for (int s = 0; s < stage_count(c); s++) {
        stage_bytes b = held_on(c, s);
        if (best < 0 || b.persistent + b.params > most) best = s, most = b.persistent + b.params;
    }
    return best;
}

size_t compiled_persistent_bytes(const compiled *c)
{
    return stage_count(c) == 0 ? c->persistent_bytes : held_on(c, fullest_stage(c)).persistent;
}

size_t compiled_stage_arena_bytes(const compiled *c, int stage)
{
    const plan *pl = &c->plan;
    if (stage < 0 || stage >= pl->n_stage_arenas) return pl->arena_bytes;
    return pl->stage_arena_bytes[stage];
}

size_t compiled_param_bytes(const compiled *c)
{
    return held_on(c, fullest_stage(c)).params;
}
