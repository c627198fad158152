/*
 * The GPT split into pipeline stages (docs/DESIGN.md, "Pipeline stages"):
 * the same parameters as spmd_gpt_build (names, shapes, init), built once
 * per micro-batch, each block on its stage, the values crossing between
 * stages through transfers.
 */
#include "spmd/models.h"

#include "base/error.h"
#include "ir/ir.h"
#include "models/gpt_parts.h"

#include <string.h>

int spmd_gpt_stage_first_layer(int layers, int stages, int stage)
{
    if (layers <= 0 || stages <= 0 || stage < 0 || stage > stages) return -1;
    /* The first layers % stages stages hold one layer more. */
    int base = layers / stages, extra = layers % stages;
    return stage * base + (stage < extra ? stage : extra);
}

static spmd_status check(const spmd_gpt_config *cfg, int batch, int stages, int micro_batches)
{
    spmd_status st = spmd_gpt_validate(cfg);
    if (st != SPMD_OK) return st;
    if (cfg->experts > 0)
        return base_error(SPMD_ERR_INVALID, "gpt stages: a GPT with experts (%d) on stages is not "
                          "built yet", cfg->experts);
    if (batch <= 0)
        return base_error(SPMD_ERR_INVALID, "gpt stages: micro-batch size (%d) must be positive",
                          batch);
    if (stages <= 0)
        return base_error(SPMD_ERR_INVALID, "gpt stages: %d stages; at least 1", stages);
    if (stages > cfg->layers)
        return base_error(SPMD_ERR_INVALID,
                          "gpt stages: %d stages for %d layers; each stage holds at least one layer",
                          stages, cfg->layers);
    if (micro_batches < stages)
        return base_error(SPMD_ERR_INVALID,
                          "gpt stages: %d micro-batches for %d stages; the schedule needs at least "
                          "one micro-batch per stage to fill the pipeline",
                          micro_batches, stages);
    return SPMD_OK;
}

/* Micro-batch m of ids [M, b, T]: [b, T]. */
static spmd_tensor *micro_rows(spmd_graph *g, spmd_tensor *ids, int m)
{
    int64_t b = spmd_tensor_dim(ids, 1), t = spmd_tensor_dim(ids, 2);
    return spmd_reshape(g, spmd_slice(g, ids, 0, m, 1), 2, (const int64_t[]){b, t});
}

/* Micro-batch m's forward pass and loss, stage by stage. */
static spmd_tensor *micro_batch(spmd_graph *g, const spmd_gpt_config *cfg, int stages, int m,
                                spmd_tensor *ids, spmd_tensor *targets, spmd_tensor *wte,
                                spmd_tensor *wpe, spmd_tensor *head_wte, spmd_tensor **logits)
{
    int64_t t = cfg->seq, c = cfg->dim;
    spmd_graph_set_micro_batch(g, m);
    spmd_graph_set_stage(g, 0);
    spmd_tensor *pos = gpt_context(cfg) > t ? spmd_slice(g, wpe, 0, 0, t) : wpe;
    spmd_tensor *x = gpt_named(g, spmd_add(g, spmd_embedding(g, wte, micro_rows(g, ids, m)), pos),
                               "embed");
    for (int s = 0; s < stages && x; s++) {
        spmd_graph_set_stage(g, s);
        if (s > 0) x = spmd_stage_transfer(g, x, s - 1, s);
        x = gpt_blocks(g, cfg, spmd_gpt_stage_first_layer(cfg->layers, stages, s),
                       spmd_gpt_stage_first_layer(cfg->layers, stages, s + 1), x);
    }
    x = gpt_layernorm(g, x, "ln_f", c);
    spmd_tensor *y = gpt_named(g, spmd_matmul(g, x, head_wte, false, true), "logits");
    if (m == 0) *logits = y; /* built last */
    return spmd_cross_entropy(g, y, micro_rows(g, targets, m));
}

spmd_status spmd_gpt_build_stages(spmd_graph *g, const spmd_gpt_config *cfg, int batch, int stages,
                                  int micro_batches, spmd_gpt_tensors *out)
{
    if (!out) return base_error(SPMD_ERR_INVALID, "gpt stages: output struct is NULL");
    memset(out, 0, sizeof *out);
    if (!g) return base_error(SPMD_ERR_INVALID, "gpt stages: graph is NULL");
    spmd_status st = check(cfg, batch, stages, micro_batches);
    if (st != SPMD_OK) return st;

    int64_t mb = micro_batches, b = batch, t = cfg->seq, c = cfg->dim, v = cfg->vocab;
    spmd_init emb_init = {SPMD_INIT_NORMAL, GPT_STD};
    int outer_stage = g->stage, outer_micro = g->micro;
    ir_failure outer;
    ir_error_scope_begin(g, &outer);
    spmd_tensor *ids = spmd_input(g, "input", SPMD_I32, 3, (const int64_t[]){mb, b, t});
    spmd_tensor *targets = spmd_input(g, "targets", SPMD_I32, 3, (const int64_t[]){mb, b, t});
    spmd_graph_set_stage(g, 0);
    spmd_tensor *wte = spmd_param(g, "wte.weight", 2, (const int64_t[]){v, c}, emb_init);
    spmd_tensor *wpe = spmd_param(g, "wpe.weight", 2, (const int64_t[]){gpt_context(cfg), c}, emb_init);
    /* The tied head reads wte from the first stage: one transfer for
     * every micro-batch (of none: the schedule runs it as soon as it
     * can), its gradient summed on the last before it goes back. */
    spmd_graph_set_stage(g, stages - 1);
    spmd_tensor *head_wte = stages > 1 ? spmd_stage_transfer(g, wte, 0, stages - 1) : wte;
    spmd_tensor *logits = NULL, *sum = NULL;
    /* The last micro-batch first: autodiff, from the last node made back,
     * then meets micro-batch 0's backward first, and each weight's
     * gradient sums the micro-batches in their order, so that 1F1B adds
     * each micro-batch's share as its backward runs instead of holding
     * them all to the last. */
    for (int m = micro_batches - 1; m >= 0; m--) {
        spmd_tensor *loss = micro_batch(g, cfg, stages, m, ids, targets, wte, wpe, head_wte, &logits);
        sum = !sum || !loss ? loss : spmd_add(g, sum, loss);
        if (!sum) break;
    }
    spmd_graph_set_micro_batch(g, -1);
    /* The step's loss: the micro-batches' mean, as accumulation takes it. */
    spmd_tensor *loss = sum ? spmd_scale(g, sum, 1.0f / (float)micro_batches) : NULL;
    st = loss ? SPMD_OK : gpt_build_failed(g);
    ir_error_scope_end(g, &outer);
    g->stage = outer_stage;
    g->micro = outer_micro;
    if (st != SPMD_OK) return st;
    out->input = ids;
    out->targets = targets;
    out->logits = logits;
    out->loss = loss;
    return SPMD_OK;
}
