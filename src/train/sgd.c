/*
 * Plain SGD as graph ops, so the update is compiled (and partitioned) with
 * the rest of the step: the SGD of optim.c without momentum, weight decay
 * or clipping, on the caller's lr tensor, and without the step counter and
 * gradient norm spmd_optimizer_apply adds, and without ZeRO: every replica
 * updates whole (the plain plan, which test_spmd_structure reads).
 */
#include "train/optim.h"

#include "base/error.h"
#include "ir/ir.h"

spmd_status spmd_sgd(spmd_graph *g, spmd_tensor *lr)
{
    /* A NULL lr from a failed builder: report that failure. */
    if (!lr && ir_graph_status(g) != SPMD_OK) return ir_error_raise(g);
    if (!g || !lr) return base_error(SPMD_ERR_INVALID, "sgd: graph or lr is NULL");
    const spmd_optimizer plain = {.kind = SPMD_OPTIMIZER_SGD, .zero = SPMD_ZERO_OFF};
    return train_optimizer_append(g, &plain, lr, false, "sgd", NULL);
}
