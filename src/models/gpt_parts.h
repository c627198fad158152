/*
 * The pieces of the GPT that its training graph (gpt.c) and its decoding
 * graph (gpt_decode.c) share, so both make the same parameters: the same
 * names, shapes and init, and so the same values for a seed.
 */
#ifndef SPMD_MODELS_GPT_PARTS_H
#define SPMD_MODELS_GPT_PARTS_H

#include "spmd/models.h"

#define GPT_STD 0.02f

/* Rows of wpe: the model's context, which sequences may not fill. */
int gpt_context(const spmd_gpt_config *cfg);
/* GPT-2 scales the projections into the residual stream so its variance
 * does not grow with depth (two per block). */
float gpt_proj_std(const spmd_gpt_config *cfg);
/* LayerNorm over the last dim with parameters "<prefix>.weight", ".bias" [c]. */
spmd_tensor *gpt_layernorm(spmd_graph *g, spmd_tensor *x, const char *prefix, int64_t c);
/* y = x W^T + b with W "<prefix>.weight" [out, in] (nn.Linear's layout, as
 * nanoGPT uses it) and b "<prefix>.bias" [out]; x W^T is named
 * "<prefix>.matmul", y "<prefix>.out". */
spmd_tensor *gpt_linear(spmd_graph *g, spmd_tensor *x, const char *prefix, int64_t in,
                        int64_t out, float std);
/* x named `name` (NULL passes through; a clash is this builder's failure);
 * while the graph builds micro-batch m > 0 (spmd_graph_set_micro_batch),
 * "mb{m}.<name>": the GPT with stages builds the model once per
 * micro-batch (gpt_stages.c) and micro-batch 0's activations keep the
 * names of the GPT without. */
spmd_tensor *gpt_named(spmd_graph *g, spmd_tensor *x, const char *name);
/* Parameter `name`: while the graph builds a micro-batch, the one it
 * holds already if any (the GPT with stages reads each parameter in
 * every micro-batch), else a new one. */
spmd_tensor *gpt_param(spmd_graph *g, const char *name, int rank, const int64_t *dims, spmd_init init);
/* The decoder blocks [first, last) on x [B, T, C] (gpt.c). */
spmd_tensor *gpt_blocks(spmd_graph *g, const spmd_gpt_config *cfg, int first, int last, spmd_tensor *x);
/* A graph op returned NULL: the failure it recorded on g, this build's own
 * in the caller's error scope, raised again so the message goes with it. */
spmd_status gpt_build_failed(const spmd_graph *g);

#endif
