/*
 * The GPT of gpt.c as a decoding step: one new position per run, the keys
 * and values of earlier positions kept in per-block state tensors (the KV
 * cache), so generating a token costs one position's work rather than a
 * forward pass over the whole prefix.  Parameters are made by the same
 * helpers as the training graph, so they carry the same names and values.
 */
#include "spmd/models.h"

#include "base/error.h"
#include "ir/ir.h"
#include "models/gpt_parts.h"

#include <stdio.h>
#include <string.h>

/* The attention of one block at the position: the new key and value rows
 * go into the block's caches (and, as their updates, stay there), then
 * the query attends over cache rows 0..position.  a [B, 1, C] -> [B, 1, C]. */
static spmd_tensor *cached_attention(spmd_graph *g, const spmd_gpt_config *cfg, int layer,
                                     spmd_tensor *a, spmd_tensor *position, int batch)
{
    int64_t c = cfg->dim;
    char p[64];
    snprintf(p, sizeof p, "h.%d.attn.c_attn", layer);
    spmd_tensor *qkv = gpt_linear(g, a, p, c, 3 * c, GPT_STD); // [B, 1, 3C]: q | k | v
    spmd_tensor *q = spmd_slice(g, qkv, 2, 0, c);
    spmd_tensor *kv[2] = {spmd_slice(g, qkv, 2, c, c), spmd_slice(g, qkv, 2, 2 * c, c)};
    static const char *const which[2] = {"k_cache", "v_cache"};
    const int64_t dims[3] = {batch, gpt_context(cfg), c};
    for (int i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "h.%d.attn.%s", layer, which[i]);
        spmd_tensor *cache = spmd_state(g, p, 3, dims, (spmd_init){SPMD_INIT_ZEROS, 0});
        kv[i] = spmd_cache_write(g, cache, kv[i], position);
        if (kv[i] && spmd_graph_set_update(g, cache, kv[i]) != SPMD_OK) {
            ir_error_keep(g);
            return NULL;
        }
    }
    return spmd_cached_attention(g, q, kv[0], kv[1], position, cfg->heads);
}

/* Block `layer` at the position, as gpt.c's block: x [B, 1, C]. */
static spmd_tensor *decode_block(spmd_graph *g, const spmd_gpt_config *cfg, int layer,
                                 spmd_tensor *x, spmd_tensor *position, int batch)
{
    int64_t c = cfg->dim;
    float proj_std = gpt_proj_std(cfg);
    char p[64];
    snprintf(p, sizeof p, "h.%d.ln_1", layer);
    spmd_tensor *a = gpt_layernorm(g, x, p, c);
    a = cached_attention(g, cfg, layer, a, position, batch);
    snprintf(p, sizeof p, "h.%d.attn.c_proj", layer);
    x = spmd_add(g, x, gpt_linear(g, a, p, c, c, proj_std));

    snprintf(p, sizeof p, "h.%d.ln_2", layer);
    spmd_tensor *m = gpt_layernorm(g, x, p, c);
    snprintf(p, sizeof p, "h.%d.mlp.c_fc", layer);
    m = spmd_gelu(g, gpt_linear(g, m, p, c, 4 * c, GPT_STD));
    snprintf(p, sizeof p, "h.%d.mlp.c_proj", layer);
    return spmd_add(g, x, gpt_linear(g, m, p, 4 * c, c, proj_std));
}

spmd_status spmd_gpt_build_decode(spmd_graph *g, const spmd_gpt_config *cfg, int batch,
                                  spmd_gpt_decode_tensors *out)
{
    if (!out)
        return base_error(SPMD_ERR_INVALID, "gpt decode: output struct is NULL");
    memset(out, 0, sizeof *out);
    if (!g)
        return base_error(SPMD_ERR_INVALID, "gpt decode: graph is NULL");
    spmd_status st = spmd_gpt_validate(cfg);
    if (st != SPMD_OK)
        return st;
    if (batch <= 0)
        return base_error(SPMD_ERR_INVALID, "gpt decode: batch (%d) must be positive", batch);
    if (cfg->experts > 0)
        return base_error(SPMD_ERR_UNSUPPORTED, "gpt decode: a GPT with experts (%d) has no "
                          "decoding graph: its capacity is per trained sequence", cfg->experts);

    int64_t c = cfg->dim, v = cfg->vocab;
    spmd_init emb_init = {SPMD_INIT_NORMAL, GPT_STD};
    ir_failure outer;
    ir_error_scope_begin(g, &outer);
    spmd_tensor *ids = spmd_input(g, "input", SPMD_I32, 2, (const int64_t[]){batch, 1});
    spmd_tensor *position = spmd_input(g, "position", SPMD_I32, 1, (const int64_t[]){1});
    spmd_tensor *wte = spmd_param(g, "wte.weight", 2, (const int64_t[]){v, c}, emb_init);
    spmd_tensor *wpe =
        spmd_param(g, "wpe.weight", 2, (const int64_t[]){gpt_context(cfg), c}, emb_init);
    /* Row `position` of wpe [1, C], broadcast over the batch. */
    spmd_tensor *x = spmd_add(g, spmd_embedding(g, wte, ids), spmd_embedding(g, wpe, position));
    for (int i = 0; i < cfg->layers && x; i++)
        x = decode_block(g, cfg, i, x, position, batch);
    x = gpt_layernorm(g, x, "ln_f", c);
    spmd_tensor *logits = spmd_matmul(g, x, wte, false, true); // [B, 1, V], tied head
    st = logits ? spmd_graph_mark_output(g, logits) : gpt_build_failed(g);
    ir_error_scope_end(g, &outer);
    if (st != SPMD_OK)
        return st;

    out->input = ids;
    out->position = position;
    out->logits = logits;
    return SPMD_OK;
}
