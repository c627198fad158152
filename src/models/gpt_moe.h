/*
 * The GPT's mixture-of-experts layer (gpt_moe.c): GShard's gating,
 * dispatch and combine over an expert dim, in every other block.
 */
#ifndef SPMD_MODELS_GPT_MOE_H
#define SPMD_MODELS_GPT_MOE_H

#include "spmd/models.h"

/* What the MoE layers of one graph add up: the auxiliary load-balancing
 * loss and the assignments dropped past capacity (NULL before the first). */
typedef struct gpt_moe_sums {
    spmd_tensor *aux, *dropped;
} gpt_moe_sums;

/* Whether block `layer` has experts in place of its MLP: the odd blocks
 * (h.1, h.3, ...), GShard's every other layer. */
bool gpt_moe_layer(const spmd_gpt_config *cfg, int layer);
/* C, each expert's slots per group: floor(K * T * F / E). */
int64_t gpt_moe_capacity(const spmd_gpt_config *cfg);
/* The experts' fields of cfg (experts 0: none, always valid). */
spmd_status gpt_moe_validate(const spmd_gpt_config *cfg);
/* Parameters of one MoE layer, in place of the dense MLP's. */
int64_t gpt_moe_block_params(const spmd_gpt_config *cfg);
/* The MoE layer of block `layer` on x [B, T, C] (ln_2's output): [B, T,
 * C], named "h.{layer}.moe.out" (its gates [B, T, E] "h.{layer}.moe.gates");
 * adds its auxiliary loss and dropped count to sums. */
spmd_tensor *gpt_moe_ffn(spmd_graph *g, const spmd_gpt_config *cfg, int layer, spmd_tensor *x,
                         gpt_moe_sums *sums);

#endif
