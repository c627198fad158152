/*
 * Pipeline stages at compile (docs/DESIGN.md, "Pipeline stages"): the
 * placements the graph was built with, completed and checked, then
 * carried to the per-device program.
 */
#include "compile/stages.h"

#include "base/error.h"
#include "mesh/mesh.h"

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
