/*
 * What a compiled program does, for people and tools (`spmd explain`):
 * every collective the partitioner inserted, and the fallbacks that
 * gathered a whole tensor because an op could not use its sharding.
 * Read from the compiled object alone (see report.h).
 */
#include "compile/report.h"
#include "base/error.h"

#include <stdio.h>
#include <string.h>

/* The value a collective moves, named after where it comes from: a pending
 * sum passed through linear ops (lr * gradient) is named by its source, a
 * bf16 copy by what it copies. */
static void describe_tensor(const partition *p, int id, char *buf, size_t size)
{
    const spmd_graph *g = p->g;
    const spmd_tensor *t = g->nodes[id];
    for (int hops = 0; !t->name && hops < 16; hops++) {
        uint32_t through = p->prop.nodes[t->id].through_operands;
        int j = 0;
        while (j < t->n_in && !(through >> j & 1)) j++;
        if (j == t->n_in) break;
        t = t->in[j];
    }
    /* A bf16 copy (mixed precision) by what it copies: "wte.weight as bf16". */
    if (!t->name && t->op == IR_CONVERT && t->in[0]->name)
        snprintf(buf, size, "%s as %s", t->in[0]->name, spmd_dtype_name(t->dtype));
    else if (t->name) snprintf(buf, size, "%s", t->name);
    else snprintf(buf, size, "%s#%d", ir_op_name(t->op), t->id);
}

static const partition *partition_of(const compiled *c)
{
    return c && c->partitioned ? &c->part : NULL;
}

int compiled_collective_count(const compiled *c)
{
    const partition *p = partition_of(c);
    return p ? p->n_colls : 0;
}

spmd_status compiled_collective(const compiled *prog, int i, spmd_collective_info *out)
{
    const partition *p = partition_of(prog);
    if (!out) return base_error(SPMD_ERR_INVALID, "collective: out is NULL");
    if (!p || i < 0 || i >= p->n_colls)
        return base_error(SPMD_ERR_INVALID, "collective: index %d outside 0..%d", i,
                          p ? p->n_colls - 1 : -1);
    const part_collective *c = &p->colls[i];
    memset(out, 0, sizeof *out);
    out->kind = partition_collective_name(c->kind);
    size_t n = 0;
    for (int a = 0; a < c->axes.n && n < sizeof out->axes; a++)
        n += (size_t)snprintf(out->axes + n, sizeof out->axes - n, a ? ",%s" : "%s",
                              p->m->names[c->axes.axis[a]]);
    out->bytes = c->bytes;
    out->seconds = c->seconds;
    /* With accumulation the forward and backward pass run once per
     * micro-batch; the update (the gradients' reductions) once a step. */
    out->count = c->phase != PART_UPDATE && p->g->accumulate_steps > 1 ? p->g->accumulate_steps : 1;
    out->phase = partition_phase_name(c->phase);
    describe_tensor(p, c->tensor, out->tensor, sizeof out->tensor);
    /* A gradient reduced in bf16 (spmd_graph_set_reduce_precision). */
    if (c->dtype != p->g->nodes[c->tensor]->dtype) {
        size_t len = strlen(out->tensor);
        snprintf(out->tensor + len, sizeof out->tensor - len, " in %s", spmd_dtype_name(c->dtype));
    }
    const plan *pl = &prog->plan;
    bool node = c->node >= 0 && c->node < pl->n_nodes;
    out->written = pl->lands_in && node && pl->lands_in[c->node] >= 0;
    out->in_place = out->written || (pl->gather_leaf && node && pl->gather_leaf[c->node] >= 0);
    for (int k = 0; k < pl->n_async; k++)
        if (pl->steps[pl->async_step[k]]->id == c->node)
            out->in_flight_steps = pl->wait_at[k] - pl->start_at[k];
    return SPMD_OK;
}

int compiled_fallback_count(const compiled *c)
{
    const partition *p = partition_of(c);
    return p ? p->n_fallbacks : 0;
}

spmd_status compiled_fallback(const compiled *c, int i, char *buf, size_t size)
{
    const partition *p = partition_of(c);
    if (!p || i < 0 || i >= p->n_fallbacks || !buf)
        return base_error(SPMD_ERR_INVALID, "fallback: index %d outside the program's %d", i,
                          p ? p->n_fallbacks : 0);
    char what[96], shape[96];
    const part_fallback *f = &p->fallbacks[i];
    describe_tensor(p, f->tensor, what, sizeof what);
    const spmd_tensor *consumer = p->g->nodes[f->consumer];
    snprintf(buf, size, "%s %s gathered whole for %s#%d (%s)", what,
             ir_shape_str(p->g->nodes[f->tensor], shape, sizeof shape), ir_op_name(consumer->op),
             consumer->id, partition_phase_name(partition_phase(p->g, consumer->id)));
    return SPMD_OK;
}

int compiled_overlap(const compiled *c, size_t *bytes, size_t *arena_extra)
{
    const plan *pl = c ? &c->plan : NULL;
    if (bytes) *bytes = pl ? pl->inflight_bytes : 0;
    if (arena_extra)
        *arena_extra = pl && pl->arena_bytes > pl->serial_arena_bytes
                           ? pl->arena_bytes - pl->serial_arena_bytes : 0;
    return pl ? pl->n_async : 0;
}

int compiled_propagation_unsettled(const compiled *c)
{
    if (!c || !c->partitioned || c->part.prop.settled) return 0;
    return c->part.prop.rounds;
}
