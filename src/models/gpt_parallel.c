/*
 * Megatron-LM's tensor (and sequence) parallelism for the GPT of gpt.c,
 * as marks (docs/DESIGN.md, "Tensor and sequence parallelism"): the
 * partitioner then places the collectives, as GSPMD does for the same
 * annotations.  Heads, the MLP's hidden units and the vocabulary are
 * split over the tensor axis; an FSDP axis, if given, splits the other
 * dim of the same weights; sequence parallelism splits the residual
 * stream over the sequence between the blocks' matmuls.
 */
#include "spmd/models.h"
#include "spmd/mesh.h"

#include "base/error.h"

#include <stdio.h>
#include <string.h>

typedef struct tp_specs {
    spmd_graph *g;
    const spmd_mesh *m;
    const char *tp, *fsdp, *batch; /* fsdp: "None" without FSDP */
} tp_specs;

/* Mark the tensor called `name` with `pattern`, where T stands for the
 * tensor axis, F for the FSDP axis (None without) and B for the batch.
 * A mark the caller already made is kept (as spmd_fsdp_wrap keeps it). */
static spmd_status mark(const tp_specs *s, const char *name, const char *pattern)
{
    spmd_tensor *t = spmd_graph_find(s->g, name);
    if (!t)
        return base_error(SPMD_ERR_INVALID, "gpt tensor parallel: the graph has no tensor '%s' "
                          "(build it with spmd_gpt_build)", name);
    char had[8];
    if (spmd_get_sharding(t, had, sizeof had)[0]) return SPMD_OK;
    char spec[256];
    size_t n = 0;
    for (const char *c = pattern; *c && n < sizeof spec; c++) {
        const char *with = *c == 'T' ? s->tp : *c == 'F' ? s->fsdp : *c == 'B' ? s->batch : NULL;
        if (with) n += (size_t)snprintf(spec + n, sizeof spec - n, "%s", with);
        else spec[n++] = *c;
    }
    if (n >= sizeof spec) return base_error(SPMD_ERR_INVALID, "gpt tensor parallel: spec too long");
    spec[n] = '\0';
    return spmd_mark_sharding(s->g, t, s->m, spec);
}

/* "(a, b)" of every axis but the tensor axis and the independent ones, or
 * "None": where the batch goes. */
static void batch_axes(const spmd_mesh *m, int tp, char *buf, size_t size)
{
    size_t n = (size_t)snprintf(buf, size, "(");
    bool any = false;
    for (int a = 0; a < spmd_mesh_rank(m) && n < size; a++) {
        if (a == tp || spmd_mesh_axis_is_independent(m, a) || spmd_mesh_stage_axis(m) == a) continue;
        n += (size_t)snprintf(buf + n, size - n, "%s%s", any ? ", " : "",
                              spmd_mesh_axis_name(m, a));
        any = true;
    }
    if (!any) snprintf(buf, size, "None");
    else if (n < size) snprintf(buf + n, size - n, ")");
}

spmd_status spmd_gpt_shard_tensor_parallel(spmd_graph *g, const spmd_gpt_config *cfg,
                                           const spmd_mesh *m, const spmd_gpt_parallel *how)
{
    if (!g || !m || !how || !how->tensor)
        return base_error(SPMD_ERR_INVALID,
                          "gpt tensor parallel: graph, mesh, options or axis is NULL");
    spmd_status st = spmd_gpt_validate(cfg);
    if (st != SPMD_OK) return st;
    int tp = spmd_mesh_axis_index(m, how->tensor);
    if (tp < 0) return SPMD_ERR_INVALID; /* the message names the axis and the mesh's axes */
    int fsdp = how->fsdp ? spmd_mesh_axis_index(m, how->fsdp) : -1;
    if (how->fsdp && fsdp < 0) return SPMD_ERR_INVALID;
    if (fsdp == tp)
        return base_error(SPMD_ERR_INVALID, "gpt tensor parallel: axis '%s' cannot be both the "
                          "tensor axis and the FSDP axis", how->tensor);
    int t = spmd_mesh_axis_size(m, tp);
    /* Each device runs whole heads of q, k and v. */
    if (cfg->heads % t)
        return base_error(SPMD_ERR_SHAPE, "gpt tensor parallel: %d heads do not split over "
                          "axis '%s' of %d devices", cfg->heads, how->tensor, t);
    char batch[256];
    if (how->batch) snprintf(batch, sizeof batch, "%s", how->batch);
    else batch_axes(m, tp, batch, sizeof batch);
    tp_specs s = {g, m, how->tensor, how->fsdp ? how->fsdp : "None", batch};

    /* The batch, off the tensor axis; weights: column-parallel c_attn
     * (q | k | v each split by heads) and c_fc, row-parallel c_proj, the
     * vocabulary of the tied wte. */
    st = mark(&s, "input", "B, None");
    if (st == SPMD_OK) st = mark(&s, "targets", "B, None");
    if (st == SPMD_OK) st = mark(&s, "wte.weight", "T, F");
    if (st == SPMD_OK) st = mark(&s, "logits", "B, None, T");
    for (int i = 0; i < cfg->layers && st == SPMD_OK; i++) {
        static const char *const rules[][2] = {
            {"attn.c_attn.weight", "3*T, F"},  {"attn.c_attn.bias", "3*T"},
            {"attn.c_attn.matmul", "B, None, 3*T"},
            {"attn.c_proj.weight", "F, T"},
            {"mlp.c_fc.weight", "T, F"},       {"mlp.c_fc.bias", "T"},
            {"mlp.c_fc.matmul", "B, None, T"},
            {"mlp.c_proj.weight", "F, T"},
            /* The row-parallel matmuls' inputs, so their adjoints (marked
             * alike) keep the backward pass on the same plan. */
            {"attn.y", "B, None, T"},                {"mlp.gelu", "B, None, T"},
        };
        for (size_t r = 0; r < sizeof rules / sizeof rules[0] && st == SPMD_OK; r++) {
            char name[64];
            snprintf(name, sizeof name, "h.%d.%s", i, rules[r][0]);
            st = mark(&s, name, rules[r][1]);
        }
        /* Sequence parallelism: the residual stream (and so the LayerNorms
         * and dropout-free adds on it) split over the sequence. */
        static const char *const stream[] = {"attn.c_proj.out", "mid", "mlp.c_proj.out", "out"};
        for (size_t r = 0; how->sequence && r < sizeof stream / sizeof stream[0] && st == SPMD_OK;
             r++) {
            char name[64];
            snprintf(name, sizeof name, "h.%d.%s", i, stream[r]);
            st = mark(&s, name, "B, T, None");
        }
    }
    if (how->sequence && st == SPMD_OK) st = mark(&s, "embed", "B, T, None");
    return st;
}
