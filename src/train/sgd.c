/*
 * Plain SGD as graph ops, so the update is compiled (and, later,
 * partitioned) with the rest of the step.
 */
#include "ir/ir.h"
#include "base/error.h"

spmd_status spmd_sgd(spmd_graph *g, spmd_tensor *lr)
{
    if (!g || !lr) return base_error(SPMD_ERR_INVALID, "sgd: graph or lr is NULL");
    if (lr->rank != 0 || lr->dtype != SPMD_F32)
        return base_error(SPMD_ERR_SHAPE, "sgd: lr must be an f32 scalar, got rank %d %s",
                          lr->rank, spmd_dtype_name(lr->dtype));
    if (!g->has_grad) return base_error(SPMD_ERR_INVALID, "sgd: call spmd_grad first");
    int n = g->n_nodes; /* the update adds nodes; visit only the existing ones */
    for (int i = 0; i < n; i++) {
        spmd_tensor *p = g->nodes[i];
        if (p->op != IR_PARAM) continue;
        spmd_tensor *step = spmd_mul(g, p->grad, lr);
        spmd_tensor *next = spmd_sub(g, p, step);
        if (!next) return SPMD_ERR_INVALID;
        spmd_status st = spmd_graph_set_update(g, p, next);
        if (st != SPMD_OK) return st;
    }
    return SPMD_OK;
}
