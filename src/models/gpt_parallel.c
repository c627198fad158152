/*
 * Megatron-LM's tensor (and sequence) parallelism for the GPT of gpt.c,
 * as marks (docs/DESIGN.md, "Tensor and sequence parallelism"): the
 * partitioner then places the collectives, as GSPMD does for the same
 * annotations.  Heads, the MLP's hidden units and the vocabulary are
 * split over the tensor axis; an FSDP axis, if given, splits the other
 * dim of the same weights; sequence parallelism splits the residual
 * stream over the sequence between the blocks' matmuls.  Context
 * parallelism splits the inputs' sequence, and so every activation's,
 * over its own axis (docs/DESIGN.md, "Sequence-split attention").  Expert
 * parallelism (GShard) splits the experts over an expert axis.
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
    const char *seq;               /* the context axis, or "None" */
    const char *expert;            /* spmd_gpt_shard_experts' axis */
} tp_specs;

/* Mark the tensor called `name` with `pattern`, where T stands for the
 * tensor axis, F for the FSDP axis (None without), B for the batch, S
 * for the activations' sequence (the context axis, None without) and X
 * for the expert axis.
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
        const char *with = *c == 'T'   ? s->tp
                           : *c == 'F' ? s->fsdp
                           : *c == 'B' ? s->batch
                           : *c == 'S' ? s->seq
                           : *c == 'X' ? s->expert
                                       : NULL;
        if (with) n += (size_t)snprintf(spec + n, sizeof spec - n, "%s", with);
        else spec[n++] = *c;
    }
    if (n >= sizeof spec) return base_error(SPMD_ERR_INVALID, "gpt tensor parallel: spec too long");
    spec[n] = '\0';
    return spmd_mark_sharding(s->g, t, s->m, spec);
}

/* "(a, b)" of every axis but the tensor and context axes (-1: none) and
 * the independent ones, or "None": where the batch goes. */
static void batch_axes(const spmd_mesh *m, int tp, int cp, char *buf, size_t size)
{
    size_t n = (size_t)snprintf(buf, size, "(");
    bool any = false;
    for (int a = 0; a < spmd_mesh_rank(m) && n < size; a++) {
        if (a == tp || a == cp || spmd_mesh_axis_is_independent(m, a) || spmd_mesh_stage_axis(m) == a)
            continue;
        n += (size_t)snprintf(buf + n, size - n, "%s%s", any ? ", " : "",
                              spmd_mesh_axis_name(m, a));
        any = true;
    }
    if (!any) snprintf(buf, size, "None");
    else if (n < size) snprintf(buf + n, size - n, ")");
}

/* The context axis of `how` (-1 when none): its index, checked against
 * the sequence and the tensor axis. */
static spmd_status context_axis(const spmd_gpt_config *cfg, const spmd_mesh *m,
                                const spmd_gpt_parallel *how, int *cp)
{
    *cp = -1;
    if (!how->context) return SPMD_OK;
    *cp = spmd_mesh_axis_index(m, how->context);
    if (*cp < 0) return SPMD_ERR_INVALID; /* the message names the axis and the mesh's axes */
    if (how->tensor && !strcmp(how->tensor, how->context))
        return base_error(SPMD_ERR_INVALID, "gpt context parallel: axis '%s' cannot be both the "
                          "context axis and the tensor axis", how->context);
    if (how->sequence)
        return base_error(SPMD_ERR_INVALID, "gpt context parallel: sequence parallelism splits "
                          "the sequence over the tensor axis, and the context axis '%s' splits it "
                          "already", how->context);
    int n = spmd_mesh_axis_size(m, *cp);
    if (cfg->seq % n)
        return base_error(SPMD_ERR_SHAPE, "gpt context parallel: a sequence of %d tokens does "
                          "not split over axis '%s' of %d devices", cfg->seq, how->context, n);
    return SPMD_OK;
}

/* The specs of `how` on mesh m, the batch in `batch`. */
static spmd_status specs_of(spmd_graph *g, const spmd_gpt_config *cfg, const spmd_mesh *m,
                            const spmd_gpt_parallel *how, tp_specs *s, char *batch,
                            size_t size)
{
    spmd_status st = spmd_gpt_validate(cfg);
    if (st != SPMD_OK) return st;
    int tp = how->tensor ? spmd_mesh_axis_index(m, how->tensor) : -1, cp;
    if (how->tensor && tp < 0) return SPMD_ERR_INVALID;
    if ((st = context_axis(cfg, m, how, &cp)) != SPMD_OK) return st;
    if (how->batch) snprintf(batch, size, "%s", how->batch);
    else batch_axes(m, tp, cp, batch, size);
    *s = (tp_specs){g, m, how->tensor, how->fsdp ? how->fsdp : "None", batch,
                    how->context ? how->context : "None", NULL};
    return SPMD_OK;
}

spmd_status spmd_gpt_shard_context_parallel(spmd_graph *g, const spmd_gpt_config *cfg,
                                            const spmd_mesh *m, const spmd_gpt_parallel *how)
{
    if (!g || !m || !how || !how->context)
        return base_error(SPMD_ERR_INVALID,
                          "gpt context parallel: graph, mesh, options or axis is NULL");
    tp_specs s;
    char batch[256];
    spmd_status st = specs_of(g, cfg, m, how, &s, batch, sizeof batch);
    /* The inputs' sequence; propagation carries it to every activation,
     * and attention gathers the keys and values it needs. */
    if (st == SPMD_OK) st = mark(&s, "input", "B, S");
    if (st == SPMD_OK) st = mark(&s, "targets", "B, S");
    return st;
}

/* The inputs' marks: [B, T], or [M, b, T] from spmd_gpt_build_stages (the
 * micro-batches whole, each one's rows as the batch), `micro` then M. */
static spmd_status staged_inputs(const tp_specs *s, int *micro)
{
    spmd_tensor *input = spmd_graph_find(s->g, "input");
    bool staged = input && spmd_tensor_rank(input) == 3;
    *micro = staged ? (int)spmd_tensor_dim(input, 0) : 1;
    const char *spec = staged ? "None, B, S" : "B, S";
    spmd_status st = mark(s, "input", spec);
    return st == SPMD_OK ? mark(s, "targets", spec) : st;
}

/* Micro-batch k's activations (the whole batch's without stages): the
 * names spmd_gpt_build_stages gives them, "mb{k}." before all but the
 * first micro-batch's. */
static spmd_status mark_activations(const tp_specs *s, const spmd_gpt_config *cfg,
                                    const spmd_gpt_parallel *how, int k)
{
    char mb[16] = "";
    if (k > 0) snprintf(mb, sizeof mb, "mb%d.", k);
    char name[80];
    snprintf(name, sizeof name, "%slogits", mb);
    spmd_status st = mark(s, name, "B, S, T");
    for (int i = 0; i < cfg->layers && st == SPMD_OK; i++) {
        static const char *const rules[][2] = {
            {"attn.c_attn.weight", "3*T, F"},  {"attn.c_attn.bias", "3*T"},
            {"attn.c_attn.matmul", "B, S, 3*T"},
            {"attn.c_proj.weight", "F, T"},
            {"mlp.c_fc.weight", "T, F"},       {"mlp.c_fc.bias", "T"},
            {"mlp.c_fc.matmul", "B, S, T"},
            {"mlp.c_proj.weight", "F, T"},
            /* The row-parallel matmuls' inputs, so their adjoints (marked
             * alike) keep the backward pass on the same plan. */
            {"attn.y", "B, S, T"},                {"mlp.gelu", "B, S, T"},
        };
        for (size_t r = 0; r < sizeof rules / sizeof rules[0] && st == SPMD_OK; r++) {
            /* An MoE block has no mlp.*: spmd_gpt_shard_experts splits its
             * experts' hidden units over the tensor axis. */
            if (cfg->experts > 0 && i % 2 == 1 && !strncmp(rules[r][0], "mlp.", 4)) continue;
            /* The weights are every micro-batch's; the activations its own. */
            bool weight = strstr(rules[r][0], "weight") || strstr(rules[r][0], "bias");
            snprintf(name, sizeof name, "%sh.%d.%s", weight ? "" : mb, i, rules[r][0]);
            st = mark(s, name, rules[r][1]);
        }
        /* Sequence parallelism: the residual stream (and so the LayerNorms
         * and dropout-free adds on it) split over the sequence. */
        static const char *const stream[] = {"attn.c_proj.out", "mid", "mlp.c_proj.out", "out"};
        for (size_t r = 0; how->sequence && r < sizeof stream / sizeof stream[0] && st == SPMD_OK;
             r++) {
            bool moe = cfg->experts > 0 && i % 2 == 1;
            snprintf(name, sizeof name, "%sh.%d.%s", mb, i, moe && r == 2 ? "moe.out" : stream[r]);
            st = mark(s, name, "B, T, None");
        }
    }
    snprintf(name, sizeof name, "%sembed", mb);
    if (how->sequence && st == SPMD_OK) st = mark(s, name, "B, T, None");
    return st;
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
    tp_specs s;
    char batch[256];
    if ((st = specs_of(g, cfg, m, how, &s, batch, sizeof batch)) != SPMD_OK) return st;

    /* The batch, off the tensor axis; weights: column-parallel c_attn
     * (q | k | v each split by heads) and c_fc, row-parallel c_proj, the
     * vocabulary of the tied wte.  The activations keep the context
     * axis's sequence split, if any. */
    int micro = 1;
    st = staged_inputs(&s, &micro);
    if (st == SPMD_OK) st = mark(&s, "wte.weight", "T, F");
    for (int k = 0; k < micro && st == SPMD_OK; k++)
        st = mark_activations(&s, cfg, how, k);
    return st;
}

/* The batch axes less the expert axis: where the dispatched tokens keep
 * their sequences split ("None" when the expert axis is the only one). */
static void batch_without(const spmd_mesh *m, const char *batch, const char *expert, char *buf,
                          size_t size)
{
    size_t n = (size_t)snprintf(buf, size, "(");
    bool any = false;
    for (int a = 0; a < spmd_mesh_rank(m) && n < size; a++) {
        const char *name = spmd_mesh_axis_name(m, a);
        size_t len = strlen(name);
        bool in = false;
        for (const char *c = strstr(batch, name); c && !in; c = strstr(c + 1, name))
            in = (c == batch || strchr("(, ", c[-1])) && strchr("), ", c[len]);
        if (!in || !strcmp(name, expert)) continue;
        n += (size_t)snprintf(buf + n, size - n, "%s%s", any ? ", " : "", name);
        any = true;
    }
    if (!any) snprintf(buf, size, "None");
    else if (n < size) snprintf(buf + n, size - n, ")");
}

spmd_status spmd_gpt_shard_experts(spmd_graph *g, const spmd_gpt_config *cfg, const spmd_mesh *m,
                                   const char *expert, const char *tensor, const char *batch)
{
    if (!g || !m || !expert)
        return base_error(SPMD_ERR_INVALID, "gpt experts: graph, mesh or expert axis is NULL");
    spmd_status st = spmd_gpt_validate(cfg);
    if (st != SPMD_OK) return st;
    if (cfg->experts == 0)
        return base_error(SPMD_ERR_INVALID, "gpt experts: the model has no experts (experts 0)");
    int ep = spmd_mesh_axis_index(m, expert);
    if (ep < 0) return SPMD_ERR_INVALID; /* the message names the axis and the mesh's axes */
    int tp = tensor ? spmd_mesh_axis_index(m, tensor) : -1;
    if (tensor && tp < 0) return SPMD_ERR_INVALID;
    if (tp == ep)
        return base_error(SPMD_ERR_INVALID, "gpt experts: axis '%s' cannot be both the expert "
                          "axis and the tensor axis", expert);
    int n = spmd_mesh_axis_size(m, ep);
    if (cfg->experts % n)
        return base_error(SPMD_ERR_SHAPE, "gpt experts: %d experts do not split over the expert "
                          "axis '%s' of %d devices", cfg->experts, expert, n);
    char all[256], rest[256];
    if (batch) snprintf(all, sizeof all, "%s", batch);
    else batch_axes(m, tp, -1, all, sizeof all);
    batch_without(m, all, expert, rest, sizeof rest);
    /* X: the expert axis; T: the tensor axis (None without); B: every
     * batch axis; F here: the batch axes but the expert axis. */
    tp_specs s = {g, m, tensor ? tensor : "None", rest, all, "None", expert};
    static const char *const rules[][2] = {
        {"c_fc.weight", "X, None, T"},      {"c_fc.bias", "X, T"},
        {"c_proj.weight", "X, T, None"},    {"c_proj.bias", "X, None"},
        {"dispatched", "X, F, None, None"}, {"expert_out", "X, F, None, None"},
        {"returned", "B, None, None, None"},
    };
    for (int i = 1; i < cfg->layers && st == SPMD_OK; i += 2)
        for (size_t r = 0; r < sizeof rules / sizeof rules[0] && st == SPMD_OK; r++) {
            char name[64];
            snprintf(name, sizeof name, "h.%d.moe.%s", i, rules[r][0]);
            st = mark(&s, name, rules[r][1]);
        }
    return st;
}
