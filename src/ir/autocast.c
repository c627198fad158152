/*
 * Mixed precision's policy (spmd_graph_set_matmul_precision(g, SPMD_BF16),
 * DESIGN.md "Mixed precision"): which values the step holds in bf16, in
 * one place.
 *
 *   - Every matmul and bmm reads bf16 copies of its f32 operands
 *     (builders.c, matmul_operand), one per tensor, shared.
 *   - An activation that the backward pass keeps is kept as a bf16 copy,
 *     made in the forward pass as soon as the value exists: the input of a
 *     layernorm (the residual stream: layernorm's backward and xhat read
 *     it), of an activation function (gelu, gelu_erf, silu, relu: their
 *     backward helpers read it) and attention's q, k and v (its backward
 *     recomputes the probabilities from them).  The backward pass reads
 *     the copy, so the f32 value dies at its last forward reader.  The
 *     forward pass itself computes in f32 from the f32 values, as before.
 *   - The rest stays f32: the residual adds, the layernorm statistics
 *     (computed in double from the widened row), softmax and attention's
 *     probabilities, the logits and the loss, every gradient, reduction
 *     and collective sum, parameters and optimizer state.
 *
 * A kernel that reads a bf16 operand widens it to f32 exactly
 * (base/bf16.h); ops.def's bf16 column names those operands, and compile
 * refuses bf16 anywhere else.
 */
#include "ir/ir.h"

void ir_autocast_keep(spmd_graph *g, spmd_tensor *x)
{
    if (!g || !x || g->matmul_precision != SPMD_BF16 || x->dtype != SPMD_F32 ||
        ir_op_is_leaf(x->op) || x->bf16)
        return;
    /* A failure here (memory) is the graph's: the builder that called
     * goes on, and the next one reports it. */
    x->bf16 = ir_node_new(g, IR_CONVERT, SPMD_BF16, x->rank, x->dims, &x, 1);
}

spmd_tensor *ir_autocast_saved(const spmd_graph *g, spmd_tensor *x)
{
    if (g->matmul_precision != SPMD_BF16 || !x->bf16 || ir_op_is_leaf(x->op)) return x;
    return x->bf16;
}
