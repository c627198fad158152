/*
 * GPT-2 style decoder as a graph builder: token + position embeddings,
 * pre-norm transformer blocks (causal attention, GELU MLP or, in every
 * other block, a mixture of experts: gpt_moe.c), a final
 * LayerNorm and an LM head tied to the token embedding.  Names, shapes and
 * init follow nanoGPT so its checkpoints and numerics carry over.
 */
#include "spmd/models.h"

#include "base/error.h"
#include "ir/ir.h"
#include "models/gpt_moe.h"
#include "models/gpt_parts.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

int gpt_context(const spmd_gpt_config *cfg) { return cfg->context ? cfg->context : cfg->seq; }

spmd_status spmd_gpt_validate(const spmd_gpt_config *cfg)
{
    if (!cfg)
        return base_error(SPMD_ERR_INVALID, "gpt: config is NULL");
    if (cfg->vocab <= 0 || cfg->seq <= 0 || cfg->layers <= 0 || cfg->heads <= 0 || cfg->dim <= 0)
        return base_error(SPMD_ERR_INVALID,
                          "gpt: vocab (%d), seq (%d), layers (%d), heads (%d) and dim (%d) "
                          "must all be positive",
                          cfg->vocab, cfg->seq, cfg->layers, cfg->heads, cfg->dim);
    if (cfg->context < 0 || (cfg->context > 0 && cfg->context < cfg->seq))
        return base_error(SPMD_ERR_INVALID,
                          "gpt: context (%d) must be 0 (same as seq) or at least seq (%d)",
                          cfg->context, cfg->seq);
    if (cfg->dim % cfg->heads != 0)
        return base_error(SPMD_ERR_INVALID, "gpt: dim (%d) is not a multiple of heads (%d)",
                          cfg->dim, cfg->heads);
    spmd_status st = gpt_moe_validate(cfg);
    if (st != SPMD_OK) return st;
    /* The count below must fit in int64; checked in double to avoid overflow. */
    double c = cfg->dim, e = cfg->experts;
    double total = ((double)cfg->vocab + gpt_context(cfg) + 2) * c + cfg->layers * (12 * c * c + 13 * c);
    if (e > 0) total += (cfg->layers / 2) * (e * c + (e - 1) * (8 * c * c + 5 * c));
    if (total > 0x1p62)
        return base_error(SPMD_ERR_INVALID,
                          "gpt: %.3g parameters is more than the 2^62 it can count", total);
    return SPMD_OK;
}

int64_t spmd_gpt_param_count(const spmd_gpt_config *cfg)
{
    if (spmd_gpt_validate(cfg) != SPMD_OK)
        return -1;
    int64_t c = cfg->dim;
    /* Per block: two LayerNorms (4C), c_attn (3C*C + 3C), attn.c_proj
     * (C*C + C), c_fc (4C*C + 4C), mlp.c_proj (4C*C + C). */
    int64_t block = 12 * c * c + 13 * c, total = 0;
    for (int i = 0; i < cfg->layers; i++)
        total += gpt_moe_layer(cfg, i) ? block - (8 * c * c + 5 * c) + gpt_moe_block_params(cfg) : block;
    return (int64_t)cfg->vocab * c + (int64_t)gpt_context(cfg) * c + total + 2 * c;
}

spmd_status gpt_build_failed(const spmd_graph *g)
{
    if (ir_graph_status(g) == SPMD_OK)
        return base_error(SPMD_ERR_INTERNAL, "gpt: a graph op failed without a message");
    return ir_error_raise(g);
}

float gpt_proj_std(const spmd_gpt_config *cfg)
{
    return (float)(GPT_STD / sqrt(2.0 * cfg->layers));
}

spmd_tensor *gpt_layernorm(spmd_graph *g, spmd_tensor *x, const char *prefix, int64_t c)
{
    char name[64];
    snprintf(name, sizeof name, "%s.weight", prefix);
    spmd_tensor *w = gpt_param(g, name, 1, (const int64_t[]){c}, (spmd_init){SPMD_INIT_ONES, 0});
    snprintf(name, sizeof name, "%s.bias", prefix);
    spmd_tensor *b = gpt_param(g, name, 1, (const int64_t[]){c}, (spmd_init){SPMD_INIT_ZEROS, 0});
    return spmd_layernorm(g, x, w, b, SPMD_GPT_LN_EPS);
}

spmd_tensor *gpt_linear(spmd_graph *g, spmd_tensor *x, const char *prefix, int64_t in,
                        int64_t out, float std)
{
    char name[64];
    snprintf(name, sizeof name, "%s.weight", prefix);
    spmd_tensor *w = gpt_param(g, name, 2, (const int64_t[]){out, in},
                               (spmd_init){SPMD_INIT_NORMAL, std});
    snprintf(name, sizeof name, "%s.bias", prefix);
    spmd_tensor *b = gpt_param(g, name, 1, (const int64_t[]){out},
                               (spmd_init){SPMD_INIT_ZEROS, 0});
    /* "<prefix>.matmul" and "<prefix>.out", for tensor parallelism's marks. */
    snprintf(name, sizeof name, "%s.matmul", prefix);
    spmd_tensor *y = gpt_named(g, spmd_matmul(g, x, w, false, true), name);
    snprintf(name, sizeof name, "%s.out", prefix);
    return gpt_named(g, spmd_add(g, y, b), name);
}

spmd_tensor *gpt_param(spmd_graph *g, const char *name, int rank, const int64_t *dims, spmd_init init)
{
    /* Only the micro-batches share: a name taken otherwise is refused. */
    spmd_tensor *t = g && g->micro >= 0 ? spmd_graph_find(g, name) : NULL;
    if (t && t->op == IR_PARAM) return t;
    return spmd_param(g, name, rank, dims, init);
}

spmd_tensor *gpt_named(spmd_graph *g, spmd_tensor *x, const char *name)
{
    char micro[80];
    if (g && g->micro > 0) {
        snprintf(micro, sizeof micro, "mb%d.%s", g->micro, name);
        name = micro;
    }
    if (x && spmd_tensor_set_name(x, name) != SPMD_OK) {
        ir_error_keep(g); /* x is lost with it: a failure of this builder */
        return NULL;
    }
    return x;
}

/* Part `which` (q, k, v) of parts [B, T, 3, C]: [B, T, C]. */
static spmd_tensor *qkv_part(spmd_graph *g, spmd_tensor *parts, int which)
{
    if (!parts) return NULL;
    int64_t b = spmd_tensor_dim(parts, 0), t = spmd_tensor_dim(parts, 1);
    spmd_tensor *part = spmd_slice(g, parts, 2, which, 1);
    return spmd_reshape(g, part, 3, (const int64_t[]){b, t, spmd_tensor_dim(parts, 3)});
}

/* x [B, T, C] -> [B, T, C]; the caller has checked cfg and x.  An MoE
 * block adds its auxiliary loss and dropped count to `moe`. */
static spmd_tensor *block(spmd_graph *g, const spmd_gpt_config *cfg, int layer, spmd_tensor *x,
                          gpt_moe_sums *moe)
{
    int64_t c = cfg->dim;
    float proj_std = gpt_proj_std(cfg);
    char p[64];

    snprintf(p, sizeof p, "h.%d.ln_1", layer);
    spmd_tensor *a = gpt_layernorm(g, x, p, c);
    snprintf(p, sizeof p, "h.%d.attn.c_attn", layer);
    spmd_tensor *qkv = gpt_linear(g, a, p, c, 3 * c, GPT_STD); // [B, T, 3C]: q | k | v
    /* q, k and v through [B, T, 3, C]: a 3C dim split by heads (3*tensor,
     * the Megatron layout in GPT-2's fused weight) is that view's C dim
     * split, which the slices keep (DESIGN.md, "Grouped splits"). */
    int64_t b = spmd_tensor_dim(x, 0), t = spmd_tensor_dim(x, 1);
    spmd_tensor *parts = spmd_reshape(g, qkv, 4, (const int64_t[]){b, t, 3, c});
    spmd_tensor *q = qkv_part(g, parts, 0);                // [B, T, C]
    spmd_tensor *k = qkv_part(g, parts, 1);
    spmd_tensor *v = qkv_part(g, parts, 2);
    snprintf(p, sizeof p, "h.%d.attn.y", layer);
    a = gpt_named(g, spmd_attention(g, q, k, v, cfg->heads), p); // [B, T, C]
    snprintf(p, sizeof p, "h.%d.attn.c_proj", layer);
    x = spmd_add(g, x, gpt_linear(g, a, p, c, c, proj_std));
    snprintf(p, sizeof p, "h.%d.mid", layer);
    x = gpt_named(g, x, p);

    snprintf(p, sizeof p, "h.%d.ln_2", layer);
    spmd_tensor *m = gpt_layernorm(g, x, p, c);
    if (gpt_moe_layer(cfg, layer)) {
        x = spmd_add(g, x, gpt_moe_ffn(g, cfg, layer, m, moe));
        snprintf(p, sizeof p, "h.%d.out", layer);
        return gpt_named(g, x, p);
    }
    snprintf(p, sizeof p, "h.%d.mlp.c_fc", layer);
    m = gpt_linear(g, m, p, c, 4 * c, GPT_STD);
    snprintf(p, sizeof p, "h.%d.mlp.gelu", layer);
    m = gpt_named(g, spmd_gelu(g, m), p); // [B, T, 4C]
    snprintf(p, sizeof p, "h.%d.mlp.c_proj", layer);
    x = spmd_add(g, x, gpt_linear(g, m, p, 4 * c, c, proj_std)); // [B, T, C]

    /* Named so callers can find each block's output (the usual activation
     * checkpoint, spmd_grad_checkpointed) with spmd_graph_find. */
    snprintf(p, sizeof p, "h.%d.out", layer);
    return gpt_named(g, x, p);
}

spmd_tensor *gpt_blocks(spmd_graph *g, const spmd_gpt_config *cfg, int first, int last, spmd_tensor *x)
{
    gpt_moe_sums moe = {0}; /* stages take no experts (gpt_stages.c refuses them) */
    for (int i = first; i < last && x; i++)
        x = block(g, cfg, i, x, &moe);
    return x;
}

spmd_tensor *spmd_gpt_block(spmd_graph *g, const spmd_gpt_config *cfg, int layer, spmd_tensor *x)
{
    if (!g) {
        base_error(SPMD_ERR_INVALID, "gpt block: graph is NULL");
        return NULL;
    }
    if (!x)
        return ir_null_operand(g, "gpt block", 0);
    if (spmd_gpt_validate(cfg) != SPMD_OK) {
        ir_error_keep(g);
        return NULL;
    }
    if (layer < 0 || layer >= cfg->layers) {
        ir_error(g, SPMD_ERR_INVALID, "gpt block: layer %d is outside [0, %d)", layer, cfg->layers);
        return NULL;
    }
    if (spmd_tensor_dtype(x) != SPMD_F32 || spmd_tensor_rank(x) != 3 ||
        spmd_tensor_dim(x, 2) != cfg->dim) {
        ir_error(g, SPMD_ERR_SHAPE, "gpt block: x must be f32 [B, T, %d]", cfg->dim);
        return NULL;
    }
    /* The block's own first failure is what its NULL reports, whatever the
     * caller's earlier calls left on g. */
    ir_failure outer;
    ir_error_scope_begin(g, &outer);
    gpt_moe_sums moe = {0}; /* a lone block's MoE sums go nowhere */
    spmd_tensor *y = block(g, cfg, layer, x, &moe);
    ir_error_scope_end(g, &outer);
    return y;
}

spmd_status spmd_gpt_build(spmd_graph *g, const spmd_gpt_config *cfg, int batch,
                           spmd_gpt_tensors *out)
{
    if (!out)
        return base_error(SPMD_ERR_INVALID, "gpt: output struct is NULL");
    memset(out, 0, sizeof *out);
    if (!g)
        return base_error(SPMD_ERR_INVALID, "gpt: graph is NULL");
    spmd_status st = spmd_gpt_validate(cfg);
    if (st != SPMD_OK)
        return st;
    if (batch <= 0)
        return base_error(SPMD_ERR_INVALID, "gpt: batch (%d) must be positive", batch);

    int64_t b = batch, t = cfg->seq, c = cfg->dim, v = cfg->vocab;
    spmd_init emb_init = {SPMD_INIT_NORMAL, GPT_STD};
    ir_failure outer;
    ir_error_scope_begin(g, &outer);
    spmd_tensor *ids = spmd_input(g, "input", SPMD_I32, 2, (const int64_t[]){b, t});
    spmd_tensor *targets = spmd_input(g, "targets", SPMD_I32, 2, (const int64_t[]){b, t});
    spmd_tensor *wte = spmd_param(g, "wte.weight", 2, (const int64_t[]){v, c}, emb_init);
    int64_t ctx = gpt_context(cfg);
    spmd_tensor *wpe = spmd_param(g, "wpe.weight", 2, (const int64_t[]){ctx, c}, emb_init);

    /* Positions 0..T-1: the first T rows of wpe, broadcast over the batch. */
    spmd_tensor *pos = ctx > t ? spmd_slice(g, wpe, 0, 0, t) : wpe; // [T, C]
    spmd_tensor *x = gpt_named(g, spmd_add(g, spmd_embedding(g, wte, ids), pos), "embed"); // [B, T, C]
    gpt_moe_sums moe = {0};
    for (int i = 0; i < cfg->layers && x; i++)
        x = block(g, cfg, i, x, &moe);
    x = gpt_layernorm(g, x, "ln_f", c);
    spmd_tensor *logits = gpt_named(g, spmd_matmul(g, x, wte, false, true), "logits"); // [B, T, V], tied head
    spmd_tensor *loss = spmd_cross_entropy(g, logits, targets);
    if (cfg->experts > 0) {
        moe.aux = gpt_named(g, moe.aux, "moe.aux_loss");
        moe.dropped = gpt_named(g, moe.dropped, "moe.dropped");
        loss = spmd_add(g, loss, spmd_scale(g, moe.aux, SPMD_GPT_MOE_AUX_WEIGHT));
    }
    st = loss && (cfg->experts == 0 || moe.dropped) ? SPMD_OK : gpt_build_failed(g);
    if (st == SPMD_OK && moe.dropped) st = spmd_graph_mark_output(g, moe.dropped);
    ir_error_scope_end(g, &outer);
    if (st != SPMD_OK)
        return st;

    out->input = ids;
    out->targets = targets;
    out->logits = logits;
    out->loss = loss;
    out->aux_loss = moe.aux;
    out->dropped = moe.dropped;
    return SPMD_OK;
}
