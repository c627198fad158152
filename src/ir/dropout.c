/*
 * Dropout's builders (docs/DESIGN.md, "Random numbers"): the op, keyed by
 * a step and a site, and spmd_dropout, which keys it by the graph's step
 * state and numbers the sites in the order they are built.
 *
 * The step is the state scalar "rng.step", made with the graph's first
 * dropout, with the update step + 1: each run draws anew, every device
 * holds the same count, and whatever keeps the program's state (a
 * checkpoint, the Python package moving state between programs) keeps the
 * masks' place too.  The site is the dropout's rank among the graph's
 * dropouts, not its node id: marks and sharding constraints add nodes
 * that differ from mesh to mesh, never dropouts.
 */
#include "ir/ir.h"
#include "base/error.h"

#define STEP_NAME "rng.step"

_Static_assert(sizeof(((ir_attr *)0)->dropout) <= sizeof(((ir_attr *)0)->rows),
               "dropout's attributes would grow every node");

static bool probability_ok(spmd_graph *g, float p)
{
    if (p >= 0.0f && p <= 1.0f) return true;
    ir_error(g, SPMD_ERR_INVALID, "dropout: p %g is outside [0, 1] (the probability of a drop)",
             (double)p);
    return false;
}

/* x and p as dropout takes them; false with the failure recorded. */
static bool operands_ok(spmd_graph *g, const spmd_tensor *x, float p)
{
    if (!g) {
        base_error(SPMD_ERR_INVALID, "dropout: graph is NULL");
        return false;
    }
    if (!x) {
        ir_null_operand(g, "dropout", 0);
        return false;
    }
    if (x->dtype != SPMD_F32) {
        char s[96];
        ir_error(g, SPMD_ERR_INVALID, "dropout: expects f32, got %s %s", spmd_dtype_name(x->dtype),
                 ir_shape_str(x, s, sizeof s));
        return false;
    }
    return probability_ok(g, p);
}

spmd_tensor *ir_dropout(spmd_graph *g, spmd_tensor *x, spmd_tensor *step, float p, int site)
{
    if (!operands_ok(g, x, p)) return NULL;
    if (!step) return ir_null_operand(g, "dropout", 1);
    if (step->dtype != SPMD_F32 || step->rank != 0) {
        char s[96];
        ir_error(g, SPMD_ERR_SHAPE, "dropout: the step must be an f32 scalar, got %s %s",
                 spmd_dtype_name(step->dtype), ir_shape_str(step, s, sizeof s));
        return NULL;
    }
    spmd_tensor *in[2] = {x, step};
    spmd_tensor *t = ir_node_new(g, IR_DROPOUT, SPMD_F32, x->rank, x->dims, in, 2);
    if (!t) return NULL;
    t->attr.dropout.p = p;
    t->attr.dropout.site = site;
    for (int i = 0; i < x->rank; i++) {
        t->attr.dropout.spec[i] = -1;
        t->attr.dropout.groups[i] = 1;
        t->attr.dropout.global[i] = x->dims[i];
    }
    return t;
}

/* The graph's step state, made with its update on first use. */
static spmd_tensor *step_state(spmd_graph *g)
{
    if (g->rng_step) return g->rng_step;
    if (spmd_graph_find(g, STEP_NAME)) {
        ir_error(g, SPMD_ERR_INVALID,
                 "dropout: the graph already has a tensor named '%s', the name of the state "
                 "that counts dropout's steps (rename that tensor)", STEP_NAME);
        return NULL;
    }
    spmd_tensor *step = spmd_state(g, STEP_NAME, 0, NULL, (spmd_init){SPMD_INIT_ZEROS, 0.0f});
    spmd_tensor *next = spmd_add(g, step, spmd_fill(g, 0, NULL, 1.0f));
    if (!next) return NULL;
    if (spmd_graph_set_update(g, step, next) != SPMD_OK) {
        ir_error_keep(g);
        return NULL;
    }
    return g->rng_step = step;
}

spmd_tensor *spmd_dropout(spmd_graph *g, spmd_tensor *x, float p)
{
    if (!operands_ok(g, x, p)) return NULL;
    if (p == 0.0f) return x; /* nothing dropped: no op, and no state */
    spmd_tensor *step = step_state(g);
    if (!step) return NULL;
    spmd_tensor *t = ir_dropout(g, x, step, p, g->dropout_sites);
    if (t) g->dropout_sites++;
    return t;
}
