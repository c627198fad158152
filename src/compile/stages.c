/*
 * Pipeline stages at compile (docs/DESIGN.md, "Pipeline stages"): the
 * placements the graph was built with, completed and checked, then
 * carried to the per-device program.
 */
#include "compile/stages.h"

#include "base/error.h"
#include "mesh/mesh.h"

#include <stdint.h>
#include <stdlib.h>

static const char *label(const spmd_tensor *t, char *buf, size_t size) { return ir_label(t, buf, size); }

/* A mark made before the stage axis was declared. */
static spmd_status check_marks(const spmd_graph *g, const spmd_mesh *m)
{
    for (int i = 0; i < g->n_nodes; i++) {
        const spmd_tensor *t = g->nodes[i];
        if (!t->mark) continue;
        for (int d = 0; d < t->mark->rank; d++)
            for (int k = 0; k < t->mark->dim[d].n; k++)
                if (m->stage[t->mark->dim[d].axis[k]]) {
                    char a[96];
                    return base_error(SPMD_ERR_INVALID,
                                      "compile: %s is marked split over axis '%s', which is the "
                                      "stage axis (nothing is split over it)",
                                      label(t, a, sizeof a), m->names[t->mark->dim[d].axis[k]]);
                }
    }
    return SPMD_OK;
}

static spmd_status crossing(const spmd_tensor *t, int st, const spmd_tensor *x, int sx)
{
    char a[96], b[96];
    return base_error(SPMD_ERR_INVALID,
                      "compile: %s on stage %d reads %s on stage %d; a value crosses stages only "
                      "through spmd_stage_transfer",
                      label(t, a, sizeof a), st, label(x, b, sizeof b), sx);
}

spmd_status stages_settle(spmd_graph *g, const bool *needed, bool overlap, int16_t *stage_of)
{
    const spmd_mesh *m = g->mesh;
    int axis = mesh_stage_axis(m), stages = m->shape[axis];
    spmd_status st = check_marks(g, m);
    if (st != SPMD_OK) return st;
    if (overlap)
        return base_error(SPMD_ERR_UNSUPPORTED,
                          "compile: collectives in flight (overlap) with a stage axis ('%s') are "
                          "not built", m->names[axis]);
    /* A leaf's home: the stage of its update (-1 until found). */
    for (int i = 0; i < g->n_nodes; i++) stage_of[i] = -1;
    for (int i = 0; i < g->n_nodes; i++) {
        const spmd_tensor *t = g->nodes[i];
        if (ir_op_is_leaf(t->op) || !needed[i]) continue;
        int s = t->stage;
        if (t->op == IR_STAGE_TRANSFER) {
            const spmd_tensor *x = t->in[0];
            int sx = ir_op_is_leaf(x->op) ? -1 : stage_of[x->id];
            if (sx >= 0 && sx != t->attr.stage.from) return crossing(t, t->attr.stage.from, x, sx);
            if (t->attr.stage.from >= stages || t->attr.stage.to >= stages) {
                char a[96];
                return base_error(SPMD_ERR_INVALID,
                                  "compile: %s goes from stage %d to stage %d, but the stage axis "
                                  "'%s' has %d devices",
                                  label(t, a, sizeof a), t->attr.stage.from, t->attr.stage.to,
                                  m->names[axis], stages);
            }
        } else {
            for (int j = 0; j < t->n_in; j++) {
                const spmd_tensor *x = t->in[j];
                int sx = ir_op_is_leaf(x->op) ? -1 : stage_of[x->id];
                if (sx < 0) continue;
                if (s < 0) s = sx; /* unplaced: its operands' */
                else if (sx != s) return crossing(t, s, x, sx);
            }
        }
        if (s >= stages) {
            char a[96];
            return base_error(SPMD_ERR_INVALID,
                              "compile: %s is placed on stage %d, but the stage axis '%s' has %d "
                              "devices (stages 0..%d)",
                              label(t, a, sizeof a), s, m->names[axis], stages, stages - 1);
        }
        stage_of[i] = (int16_t)s;
    }
    /* A leaf's home is the stage of its update. Only its home's devices
     * hold it, so an unplaced node reading it (the optimizer's decay of
     * a moment) runs there, which may give another leaf a home: to a
     * fixed point. */
    for (bool moved = true; moved;) {
        moved = false;
        for (int u = 0; u < g->n_updates; u++) {
            const ir_update *up = &g->updates[u];
            if (needed[up->value->id] && stage_of[up->target->id] != stage_of[up->value->id]) {
                stage_of[up->target->id] = stage_of[up->value->id];
                moved = true;
            }
        }
        for (int i = 0; i < g->n_nodes; i++) {
            const spmd_tensor *t = g->nodes[i];
            if (ir_op_is_leaf(t->op) || !needed[i] || stage_of[i] >= 0 || t->op == IR_STAGE_TRANSFER)
                continue;
            for (int j = 0; j < t->n_in && stage_of[i] < 0; j++)
                if (stage_of[t->in[j]->id] >= 0) {
                    stage_of[i] = stage_of[t->in[j]->id];
                    moved = true;
                }
        }
    }
    /* The partitioner places each node's local nodes by its stage. */
    for (int i = 0; i < g->n_nodes; i++)
        if (!ir_op_is_leaf(g->nodes[i]->op) && needed[i]) g->nodes[i]->stage = stage_of[i];
    /* A leaf updated on one stage is read there only (no other stage
     * holds it), and a value placed by the leaves it reads is read on
     * its stage only. */
    for (int i = 0; i < g->n_nodes; i++) {
        const spmd_tensor *t = g->nodes[i];
        if (ir_op_is_leaf(t->op) || !needed[i] || stage_of[i] < 0) continue;
        int s = t->op == IR_STAGE_TRANSFER ? t->attr.stage.from : stage_of[i];
        for (int j = 0; j < t->n_in; j++) {
            const spmd_tensor *x = t->in[j];
            if (stage_of[x->id] < 0 || stage_of[x->id] == s) continue;
            if (!ir_op_is_leaf(x->op)) return crossing(t, s, x, stage_of[x->id]);
            char a[96], b[96];
            return base_error(SPMD_ERR_INVALID,
                              "compile: %s is updated on stage %d but %s on stage %d reads it; "
                              "pass it through spmd_stage_transfer",
                              label(x, a, sizeof a), stage_of[x->id], label(t, b, sizeof b), s);
        }
    }
    return SPMD_OK;
}

void stages_place(compiled *c)
{
    spmd_graph *lg = c->part.local;
    for (int i = 0; i < lg->n_nodes; i++)
        if (ir_op_is_leaf(lg->nodes[i]->op)) lg->nodes[i]->stage = -1;
    for (int u = 0; u < lg->n_updates; u++) lg->updates[u].target->stage = lg->updates[u].value->stage;
}

/* The 1F1B order on S stages of M micro-batches, as slots of a clock
 * where each forward and each backward takes one: stage s runs S - s - 1
 * forwards (its warm-up), then one forward and one backward by turns,
 * then the backwards left; a forward waits for the stage before it, a
 * backward for the stage after it (the last stage's for its own
 * forward).  time[(s * M + m) * 2 + b] is the slot of micro-batch m's
 * forward (b 0) or backward (b 1) on stage s. */
static void one_f_one_b_slots(int stages, int micro, int64_t *time)
{
    int *next = calloc((size_t)stages, sizeof *next); /* the stage's next in its order */
    int64_t *free_at = calloc((size_t)stages, sizeof *free_at);
    for (size_t i = 0; i < (size_t)stages * (size_t)micro * 2; i++) time[i] = -1;
    if (!next || !free_at) { /* no order: GPipe's, by creation */
        free(next), free(free_at);
        return;
    }
    for (int left = stages * micro * 2; left > 0;) {
        int before = left;
        for (int s = 0; s < stages; s++) {
            while (next[s] < 2 * micro) {
                /* The k-th of stage s's order: warm-up forwards, then by
                 * turns (forward, backward), then backwards. */
                int k = next[s], warm = stages - s - 1 < micro ? stages - s - 1 : micro, m, b;
                int steady = 2 * (micro - warm), j = k - warm;
                if (k < warm) m = k, b = 0;
                else if (j < steady) m = j % 2 ? j / 2 : warm + j / 2, b = j % 2;
                else m = k - micro, b = 1;
                int64_t dep = -1;
                if (b == 0 && s > 0) dep = time[((size_t)(s - 1) * micro + m) * 2];
                if (b == 1) dep = s + 1 < stages ? time[((size_t)(s + 1) * micro + m) * 2 + 1]
                                                 : time[((size_t)s * micro + m) * 2];
                if ((b == 0 && s > 0 && dep < 0) || (b == 1 && dep < 0)) break;
                int64_t t = dep + 1 > free_at[s] ? dep + 1 : free_at[s];
                time[((size_t)s * micro + m) * 2 + b] = t;
                free_at[s] = t + 1;
                next[s]++;
                left--;
            }
        }
        if (left == before) break; /* cannot happen: the order is a pipeline's */
    }
    free(next), free(free_at);
}

spmd_status stages_priority(const compiled *c, int64_t **out)
{
    *out = NULL;
    const spmd_graph *lg = c->local;
    int stages = c->mesh->shape[mesh_stage_axis(c->mesh)], micro = 0;
    for (int i = 0; i < lg->n_nodes; i++)
        if (lg->nodes[i]->micro + 1 > micro) micro = lg->nodes[i]->micro + 1;
    if (micro == 0) return SPMD_OK; /* nothing tagged: GPipe's order */
    size_t nn = (size_t)(lg->n_nodes ? lg->n_nodes : 1);
    int64_t *key = base_alloc(&c->alloc, nn * sizeof *key, "the 1F1B schedule");
    int64_t *time = base_alloc(&c->alloc, (size_t)stages * (size_t)micro * 2 * sizeof *time,
                               "the 1F1B schedule");
    if (!key || !time) {
        base_free(&c->alloc, key);
        base_free(&c->alloc, time);
        return SPMD_ERR_NOMEM;
    }
    one_f_one_b_slots(stages, micro, time);
    /* A transfer sends what its sender's slot made, after every stage's
     * work of that slot: both its devices meet it as their slot ends, so
     * that a transfer (a rendezvous) never holds a device that could
     * compute.  Keyed at the receiver's slot instead, the sender would
     * first compute its next slot's work, and the receiver wait for it. */
    for (int i = 0; i < lg->n_nodes; i++) {
        const spmd_tensor *t = lg->nodes[i];
        bool backward = lg->backward_begin > 0 && i >= lg->backward_begin;
        bool transfer = t->op == IR_STAGE_TRANSFER;
        int s = transfer ? t->attr.stage.from : t->stage;
        if (lg->backward_end > 0 && i >= lg->backward_end) key[i] = INT64_MAX; /* the update: last */
        else if (t->micro < 0 || s < 0) key[i] = -1;                         /* as soon as it can */
        else key[i] = 2 * time[((size_t)s * micro + t->micro) * 2 + backward] + transfer;
    }
    base_free(&c->alloc, time);
    *out = key;
    return SPMD_OK;
}
