/*
 * The partitioner (see partition.h): every global node gets a local node
 * with the padded block shape of the sharding its op produces, its
 * operands resharded to what the op needs (partition_reshard.c) and its local form
 * fixed where it differs from the global one (partition_fixups.c).  Then
 * outputs are resolved and each update's value is resharded to its
 * target's.
 */
#include "shard/partition_impl.h"
#include "base/error.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* ---- Failures ------------------------------------------------------------------------ */

spmd_status part_record(builder *b, spmd_status status, const char *fmt, ...)
{
    if (b->failure.status == SPMD_OK) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(b->failure.message, sizeof b->failure.message, fmt, ap);
        va_end(ap);
        b->failure.status = status;
    }
    return b->failure.status;
}

void *part_fail_nomem(builder *b, const char *what)
{
    part_record(b, SPMD_ERR_NOMEM, "partition: out of memory for %s", what);
    return NULL;
}

/* A builder call on the local graph: when it refused (NULL), the local
 * graph keeps why, its first failure with its message, which is recorded.
 * A refusal without one is a libspmd bug, reported where the call is. */
spmd_tensor *part_local_call(builder *b, spmd_tensor *t, const char *file, int line)
{
    if (t) return t;
    const spmd_graph *lg = b->p->local;
    if (ir_graph_status(lg) != SPMD_OK)
        part_record(b, lg->failure.status, "%s", lg->failure.message);
    else
        part_record(b, SPMD_ERR_INTERNAL, "internal error at %s:%d: partition: node %d: a "
                    "builder call on the local graph failed without recording why", file, line,
                    b->node);
    return NULL;
}

/* The status of a step that returned NULL: what it recorded.  Every path
 * to a NULL records; should one not, that is a libspmd bug, reported with
 * the place that found it. */
spmd_status part_step_failed(builder *b, const char *file, int line)
{
    if (b->failure.status != SPMD_OK) return b->failure.status;
    return part_record(b, SPMD_ERR_INTERNAL, "internal error at %s:%d: partition: node %d: a "
                       "step failed without recording why", file, line, b->node);
}

/* ---- Phases and names ----------------------------------------------------------------- */

part_phase partition_phase(const spmd_graph *g, int node)
{
    if (!g->has_grad || node < g->backward_begin) return PART_FORWARD;
    if (node < g->backward_end) return PART_BACKWARD;
    return PART_UPDATE;
}

const char *partition_phase_name(part_phase phase)
{
    static const char *const names[] = {"forward", "backward", "update"};
    return names[phase];
}

/* A collective's name as reports spell it: its op's name with hyphens
 * ("all-gather"), made once; other ops by their names. */
static char spelled[IR_OP_COUNT][32];
static pthread_once_t spelled_once = PTHREAD_ONCE_INIT;

static void spell_names(void)
{
    for (int op = 0; op < IR_OP_COUNT; op++) {
        snprintf(spelled[op], sizeof spelled[op], "%s", ir_op_name((ir_op)op));
        for (char *c = spelled[op]; *c; c++)
            if (*c == '_') *c = '-';
    }
}

const char *partition_collective_name(ir_op kind)
{
    if ((unsigned)kind >= IR_OP_COUNT || !ir_op_is_collective(kind)) return ir_op_name(kind);
    pthread_once(&spelled_once, spell_names);
    return spelled[kind];
}

/* ---- Ops ------------------------------------------------------------------------------------ */

static spmd_status emit_op(builder *b, const spmd_tensor *t)
{
    partition *p = b->p;
    const shard_node *n = &p->prop.nodes[t->id];
    spmd_tensor *in[IR_MAX_INPUTS];
    sharding need[IR_MAX_INPUTS];
    for (int j = 0; j < t->n_in; j++) {
        need[j] = shard_operand_need(&p->prop, t, j);
        const variant *have = b->variants[t->in[j]->id];
        if (have && !part_check_fallback(b, t, j, have->s, &need[j])) return failed(b);
        in[j] = part_value(b, t->in[j], &need[j], t->id);
        if (!in[j]) return failed(b);
    }
    /* Sums over split, padded dims: zero the padding first. */
    if (n->sig) {
        for (int it = 0; it < n->sig->n_iter; it++) {
            const mesh_axes *ax = &n->iter[it];
            int64_t blocks = mesh_axes_size(p->m, ax);
            if (n->sig->kind[it] != IR_ITER_SUM || !ax->n || n->sig->size[it] % blocks == 0)
                continue;
            for (int j = 0; j < t->n_in; j++)
                for (int i = 0; i < t->in[j]->rank; i++) {
                    if (n->sig->in[j][i] != it || in[j]->dtype == SPMD_I32) continue;
                    int64_t dims[SPMD_MAX_RANK];
                    dims_of(in[j], dims);
                    in[j] = part_emit_coll(b, IR_MASK_PADDING, in[j], ax, i, 0, n->sig->size[it],
                                           dims, t->in[j]->id, t->id);
                    if (!in[j]) return failed(b);
                }
        }
    }
    sharding out = shard_produced(&p->prop, t);
    /* A sharding constraint (how the optimizer re-marks a value: the held
     * gradient, ZeRO's view of a parameter) is its operand: the device's
     * program reads the resharded operand instead of copying it whole
     * first. */
    if (t->op == IR_SHARDING_CONSTRAINT)
        return part_add_variant(b, t->id, &out, in[0]) ? SPMD_OK : SPMD_ERR_NOMEM;
    int64_t dims[SPMD_MAX_RANK];
    sharding_local_dims(&out, p->m, t->rank, t->dims, dims);
    spmd_tensor *lt = LOCAL(b, ir_node_new(p->local, t->op, t->dtype, t->rank, dims, in, t->n_in));
    if (!lt) return failed(b);
    lt->attr = t->attr;
    if (t->op == IR_STAGE_TRANSFER) {
        if (!base_grow(&p->alloc, (void **)&p->transfers, &p->cap_transfers, p->n_transfers + 1,
                       sizeof *p->transfers, 16, "partition report")) {
            part_fail_nomem(b, "the stage transfers");
            return failed(b);
        }
        p->transfers[p->n_transfers++] = (part_transfer){t->id, lt->id};
    }

    lt = part_fixup(b, t, need, lt);
    if (!lt) return failed(b);
    if (!part_add_variant(b, t->id, &out, lt)) return failed(b);
    return SPMD_OK;
}

static spmd_status emit_leaf(builder *b, const spmd_tensor *t)
{
    partition *p = b->p;
    sharding s = p->prop.nodes[t->id].out;
    /* Leaves hold whole values, but for a gradient accumulator, which
     * holds its gradient's pending sum (each device its addend). */
    if (!t->accumulator) s.partial = 0;
    int64_t dims[SPMD_MAX_RANK];
    sharding_local_dims(&s, p->m, t->rank, t->dims, dims);
    spmd_tensor *lt = LOCAL(b, ir_node_new(p->local, t->op, t->dtype, t->rank, dims, NULL, 0));
    if (!lt) return failed(b);
    lt->name = base_arena_strdup(&p->local->arena, t->name);
    lt->init = t->init;
    lt->accumulator = t->accumulator;
    if (!lt->name) part_fail_nomem(b, "a name");
    if (!lt->name || !part_add_variant(b, t->id, &s, lt)) return failed(b);
    p->local_of[t->id] = lt;
    p->held[t->id] = s;
    return SPMD_OK;
}

/* ---- Entry points ---------------------------------------------------------------------------- */

/* Pipeline stages (docs/DESIGN.md, "Pipeline stages"): the local nodes
 * made for global node t run on t's stage, and so do the reshards of its
 * operands, but for a transfer's, which run on the sender's; nothing is
 * placed without a stage axis. */
static void place(partition *p, const spmd_tensor *t)
{
    if (mesh_stage_axis(p->m) < 0) return;
    p->local->stage = t->op == IR_STAGE_TRANSFER ? t->attr.stage.from : t->stage;
    p->local->micro = t->micro;
}

static spmd_status build(builder *b, const bool *needed)
{
    partition *p = b->p;
    const spmd_graph *g = p->g;
    for (int i = 0; i < g->n_nodes; i++) {
        const spmd_tensor *t = g->nodes[i];
        /* Where the backward pass begins locally, for the memory plan's
         * held bytes (plan.h). */
        if (g->has_grad && i == g->backward_begin) p->local->backward_begin = p->local->n_nodes;
        if (needed && !needed[i] && !ir_op_is_leaf(t->op)) continue;
        b->node = i;
        place(p, t);
        spmd_status st = ir_op_is_leaf(t->op) ? emit_leaf(b, t) : emit_op(b, t);
        if (st != SPMD_OK) return st;
        /* A marked value is held as marked, whatever its op produced. */
        if (t->mark && !ir_op_is_leaf(t->op) && !part_value(b, t, t->mark, t->id)) return failed(b);
    }
    p->local->accumulate_steps = g->accumulate_steps;
    if (g->accumulate_keep) p->local->accumulate_keep = p->local_of[g->accumulate_keep->id];
    /* Outputs are resolved: no pending sums when read. */
    for (int i = 0; i < g->n_nodes; i++) {
        const spmd_tensor *t = g->nodes[i];
        if (!t->is_output || ir_op_is_leaf(t->op)) continue;
        b->node = i;
        place(p, t);
        sharding s = t->mark ? *t->mark : shard_produced(&p->prop, t);
        s.partial = 0;
        spmd_tensor *lt = part_value(b, t, &s, -1);
        if (!lt) return failed(b);
        lt->is_output = true;
        p->local_of[i] = lt;
        p->held[i] = s;
    }
    for (int u = 0; u < g->n_updates; u++) {
        const ir_update *up = &g->updates[u];
        b->node = up->value->id;
        place(p, up->value);
        spmd_tensor *lv = part_value(b, up->value, &p->held[up->target->id], up->value->id);
        if (!lv) return failed(b);
        /* set_update records its message as it returns a failure. */
        spmd_status st = spmd_graph_set_update(p->local, p->local_of[up->target->id], lv);
        if (st != SPMD_OK) return part_record(b, st, "%s", spmd_last_error());
    }
    p->local->stage = p->local->micro = -1;
    return SPMD_OK;
}

spmd_status partition_build(partition *p, const spmd_graph *g, const spmd_mesh *m,
                            const bool *needed, const spmd_allocator *alloc)
{
    memset(p, 0, sizeof *p);
    p->g = g;
    p->m = m;
    p->alloc = base_allocator_or_default(alloc);
    /* Propagation records its own failures (status and message) as it
     * returns them. */
    spmd_status st = shard_propagate(&p->prop, g, m, needed, &p->alloc);
    if (st != SPMD_OK) return st;
    size_t nn = (size_t)(g->n_nodes ? g->n_nodes : 1);
    p->local = spmd_graph_create(&p->alloc);
    p->local_of = base_calloc(&p->alloc, nn * sizeof *p->local_of, "partition");
    /* Not zeroed: only kept nodes' entries are set and read, and pages
     * that hold none are then never touched. */
    p->held = base_alloc(&p->alloc, nn * sizeof *p->held, "partition");
    builder b = {.p = p, .variants = base_calloc(&p->alloc, nn * sizeof(variant *), "partition")};
    base_arena_init(&b.arena, &p->alloc);
    base_intern_init(&b.shardings, &b.arena, sizeof(sharding));
    if (!p->local || !p->local_of || !p->held || !b.variants) part_fail_nomem(&b, "its tables");
    else if (build(&b, needed) != SPMD_OK) failed(&b);
    base_intern_free(&b.shardings);
    base_arena_free(&b.arena);
    base_free(&p->alloc, b.variants);
    if (b.failure.status == SPMD_OK) return SPMD_OK;
    return base_error(b.failure.status, "%s", b.failure.message);
}

void partition_free(partition *p)
{
    shard_plan_free(&p->prop);
    spmd_graph_free(p->local);
    base_free(&p->alloc, p->local_of);
    base_free(&p->alloc, p->held);
    base_free(&p->alloc, p->specs);
    base_free(&p->alloc, p->colls);
    base_free(&p->alloc, p->fallbacks);
    base_free(&p->alloc, p->transfers);
    memset(p, 0, sizeof *p);
}
