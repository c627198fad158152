/*
 * GShard's mixture of experts as the GPT's feed-forward layer in every
 * other block (docs/DESIGN.md, "Experts"): a softmax gate over E experts,
 * top-k by repeated first arg-max, positions within each expert's
 * capacity by a cumulative sum over the group's tokens, tokens past the
 * capacity dropped, and the dispatch and combine as contractions over a
 * one-hot [G, S, E, C] mask.  Static shapes throughout: the batch's
 * sequences are the groups (G = B, S = T), and the sharding constraints
 * named here are where GShard annotates; spmd_gpt_shard_experts marks
 * them, and the partitioner's reshard between them is the all-to-all.
 */
#include "models/gpt_moe.h"

#include "base/error.h"
#include "ir/ir.h"
#include "models/gpt_parts.h"

#include <math.h>
#include <stdio.h>

bool gpt_moe_layer(const spmd_gpt_config *cfg, int layer)
{
    return cfg->experts > 0 && layer % 2 == 1;
}

int64_t gpt_moe_capacity(const spmd_gpt_config *cfg)
{
    /* floor, as GShard's 2S/E and Switch's int(); the small nudge keeps a
     * product that is a whole number in decimal (1.1 x 40) from rounding
     * to one below it in binary. */
    double c = (double)cfg->top_k * cfg->seq * cfg->capacity_factor / cfg->experts;
    return (int64_t)floor(c + 1e-9);
}

spmd_status gpt_moe_validate(const spmd_gpt_config *cfg)
{
    if (cfg->experts < 0)
        return base_error(SPMD_ERR_INVALID, "gpt: experts (%d) must be 0 (no experts) or positive",
                          cfg->experts);
    if (cfg->experts == 0) return SPMD_OK;
    if (cfg->layers < 2)
        return base_error(SPMD_ERR_INVALID,
                          "gpt: experts replace the MLP of every other block (h.1, h.3, ...): "
                          "%d layer has none; give at least 2", cfg->layers);
    if (cfg->top_k < 1 || cfg->top_k > cfg->experts)
        return base_error(SPMD_ERR_INVALID,
                          "gpt: top-k (%d) must be from 1 to the number of experts (%d)",
                          cfg->top_k, cfg->experts);
    if (cfg->top_k > SPMD_GPT_MAX_TOP_K)
        return base_error(SPMD_ERR_INVALID, "gpt: top-k (%d) is more than the %d choices a token "
                          "may make", cfg->top_k, SPMD_GPT_MAX_TOP_K);
    if (!(cfg->capacity_factor > 0) || !isfinite(cfg->capacity_factor))
        return base_error(SPMD_ERR_INVALID, "gpt: capacity factor (%g) must be a positive number",
                          (double)cfg->capacity_factor);
    if (gpt_moe_capacity(cfg) < 1)
        return base_error(SPMD_ERR_INVALID,
                          "gpt: more experts than fit the capacity: %d experts take floor(top-k "
                          "%d x %d tokens x capacity factor %g / %d) = 0 tokens each; raise the "
                          "capacity factor to at least %g or use fewer experts",
                          cfg->experts, cfg->top_k, cfg->seq, (double)cfg->capacity_factor,
                          cfg->experts, (double)cfg->experts / ((double)cfg->top_k * cfg->seq));
    return SPMD_OK;
}

int64_t gpt_moe_block_params(const spmd_gpt_config *cfg)
{
    int64_t c = cfg->dim, e = cfg->experts;
    /* The gate (E*C, no bias) and E MLPs of GPT-2's shape (8C*C + 5C). */
    return e * c + e * (8 * c * c + 5 * c);
}

static spmd_tensor *moe_param(spmd_graph *g, const char *prefix, const char *what, int rank,
                              const int64_t *dims, spmd_init init)
{
    char name[64];
    snprintf(name, sizeof name, "%s.%s", prefix, what);
    return spmd_param(g, name, rank, dims, init);
}

/* A sharding constraint on x named "<prefix>.<what>". */
static spmd_tensor *constrained(spmd_graph *g, spmd_tensor *x, const char *prefix,
                                const char *what)
{
    char name[64];
    snprintf(name, sizeof name, "%s.%s", prefix, what);
    return gpt_named(g, ir_sharding_constraint(g, x), name);
}

/* A comparison of the op table by name (1 where it holds, else 0). */
static spmd_tensor *compare(spmd_graph *g, const char *op, spmd_tensor *a, spmd_tensor *b)
{
    spmd_tensor *in[2] = {a, b};
    return spmd_elementwise(g, op, in, 2, 0.0f);
}

/* The first maximum along the last dim as a one-hot (0/1, ties to the
 * lowest index as argmax): eq(x, max) marks every maximum, and a running
 * count of them keeps the one whose count is 1. */
static spmd_tensor *first_argmax_one_hot(spmd_graph *g, spmd_tensor *x, spmd_tensor *one)
{
    if (!x) return NULL;
    int last = spmd_tensor_rank(x) - 1;
    spmd_tensor *m = compare(g, "eq", x, spmd_max(g, x, last, true));
    return spmd_mul(g, m, compare(g, "eq", spmd_cumsum(g, m, last, false), one));
}

/* A [..., 1] view of x [...]. */
static spmd_tensor *trailing_one(spmd_graph *g, spmd_tensor *x)
{
    if (!x) return NULL;
    int r = spmd_tensor_rank(x);
    int64_t dims[SPMD_MAX_RANK];
    for (int i = 0; i < r; i++) dims[i] = spmd_tensor_dim(x, i);
    dims[r] = 1;
    return spmd_reshape(g, x, r + 1, dims);
}

spmd_tensor *gpt_moe_ffn(spmd_graph *g, const spmd_gpt_config *cfg, int layer, spmd_tensor *x,
                         gpt_moe_sums *sums)
{
    if (!x) return NULL;
    const int64_t G = spmd_tensor_dim(x, 0), S = spmd_tensor_dim(x, 1), M = cfg->dim;
    const int64_t E = cfg->experts, C = gpt_moe_capacity(cfg), H = 4 * M;
    const int K = cfg->top_k;
    char p[48];
    snprintf(p, sizeof p, "h.%d.moe", layer);

    /* Gating: gates [G, S, E]. */
    spmd_tensor *wg = moe_param(g, p, "gate.weight", 2, (const int64_t[]){E, M},
                                (spmd_init){SPMD_INIT_NORMAL, GPT_STD});
    char name[64];
    snprintf(name, sizeof name, "%s.gates", p);
    spmd_tensor *gates = gpt_named(g, spmd_softmax(g, spmd_matmul(g, x, wg, false, true)), name);
    spmd_tensor *one = spmd_fill(g, 0, NULL, 1.0f);
    spmd_tensor *cap = spmd_fill(g, 0, NULL, (float)C);
    /* iota [C] = 0, 1, ..., C-1: a running count of ones, less one. */
    spmd_tensor *iota = spmd_sub(g, spmd_cumsum(g, spmd_fill(g, 1, (const int64_t[]){C}, 1.0f), 0,
                                                false), one);

    /* Choices in turn, each the first maximum of the gates left; its
     * tokens take places after every earlier choice's kept tokens (top-1
     * before top-2 for all tokens, as GShard). */
    spmd_tensor *masks[SPMD_GPT_MAX_TOP_K], *kept[SPMD_GPT_MAX_TOP_K], *pos[SPMD_GPT_MAX_TOP_K];
    spmd_tensor *left = gates, *taken = NULL, *filled = NULL, *dropped = NULL;
    for (int k = 0; k < K; k++) {
        masks[k] = first_argmax_one_hot(g, left, one);                         // [G, S, E]
        if (k + 1 < K) left = spmd_mul(g, left, spmd_sub(g, one, masks[k]));
        spmd_tensor *at = spmd_sub(g, spmd_cumsum(g, masks[k], 1, false), one); // 0-based
        if (filled) at = spmd_add(g, at, filled);
        pos[k] = at;
        kept[k] = spmd_mul(g, masks[k], compare(g, "lt", at, cap));
        spmd_tensor *count = spmd_sum(g, kept[k], 1u << 1, true);               // [G, 1, E]
        filled = filled ? spmd_add(g, filled, count) : count;
        taken = taken ? spmd_add(g, taken, masks[k]) : masks[k];
        spmd_tensor *lost = spmd_sum(g, spmd_sub(g, masks[k], kept[k]), 0x7u, false);
        dropped = dropped ? spmd_add(g, dropped, lost) : lost;
    }
    /* Combine weights: the gate itself for top-1 (Switch); from top-2 on,
     * normalised over the k chosen (GShard, Mixtral). */
    spmd_tensor *weight = gates;
    if (K > 1) weight = spmd_div(g, gates, spmd_sum(g, spmd_mul(g, gates, taken), 1u << 2, true));
    spmd_tensor *combine = NULL, *dispatch = NULL;                             // [G, S, E, C]
    for (int k = 0; k < K; k++) {
        spmd_tensor *slot = compare(g, "eq", trailing_one(g, pos[k]), iota);
        spmd_tensor *d = spmd_mul(g, trailing_one(g, kept[k]), slot);
        spmd_tensor *c = spmd_mul(g, trailing_one(g, spmd_mul(g, weight, kept[k])), slot);
        dispatch = dispatch ? spmd_add(g, dispatch, d) : d;
        combine = combine ? spmd_add(g, combine, c) : c;
    }

    /* GSEC,GSM->EGCM: each expert's slots, the groups still whole-batch
     * split until the constraint moves the split to the experts. */
    spmd_tensor *flat = spmd_reshape(g, dispatch, 3, (const int64_t[]){G, S, E * C});
    spmd_tensor *in = spmd_bmm(g, flat, x, true, false);                        // [G, EC, M]
    in = spmd_reshape(g, in, 4, (const int64_t[]){G, E, C, M});
    snprintf(name, sizeof name, "%s.to_experts", p); /* what the all-to-all moves */
    in = gpt_named(g, spmd_permute(g, in, (const int[]){1, 0, 2, 3}), name);
    in = constrained(g, in, p, "dispatched");

    /* The experts' MLPs on EGCM: bmm over E of [E, GC, M] by [E, M, H]. */
    spmd_tensor *w1 = moe_param(g, p, "c_fc.weight", 3, (const int64_t[]){E, M, H},
                                (spmd_init){SPMD_INIT_NORMAL, GPT_STD});
    spmd_tensor *b1 = moe_param(g, p, "c_fc.bias", 2, (const int64_t[]){E, H},
                                (spmd_init){SPMD_INIT_ZEROS, 0});
    spmd_tensor *w2 = moe_param(g, p, "c_proj.weight", 3, (const int64_t[]){E, H, M},
                                (spmd_init){SPMD_INIT_NORMAL, gpt_proj_std(cfg)});
    spmd_tensor *b2 = moe_param(g, p, "c_proj.bias", 2, (const int64_t[]){E, M},
                                (spmd_init){SPMD_INIT_ZEROS, 0});
    spmd_tensor *h = spmd_reshape(g, in, 3, (const int64_t[]){E, G * C, M});
    h = spmd_add(g, spmd_bmm(g, h, w1, false, false), spmd_reshape(g, b1, 3, (const int64_t[]){E, 1, H}));
    snprintf(name, sizeof name, "%s.gelu", p);
    h = gpt_named(g, spmd_gelu(g, h), name);                                    // [E, GC, H]
    h = spmd_add(g, spmd_bmm(g, h, w2, false, false), spmd_reshape(g, b2, 3, (const int64_t[]){E, 1, M}));
    h = constrained(g, spmd_reshape(g, h, 4, (const int64_t[]){E, G, C, M}), p, "expert_out");

    /* Back to the groups (the all-to-all), then GSEC,EGCM->GSM. */
    snprintf(name, sizeof name, "%s.from_experts", p);
    spmd_tensor *back = gpt_named(g, spmd_permute(g, h, (const int[]){1, 0, 2, 3}), name);
    back = constrained(g, back, p, "returned");
    back = spmd_reshape(g, back, 3, (const int64_t[]){G, E * C, M});
    spmd_tensor *y = spmd_bmm(g, spmd_reshape(g, combine, 3, (const int64_t[]){G, S, E * C}), back,
                              false, false);                                    // [G, S, M]
    snprintf(name, sizeof name, "%s.out", p);
    y = gpt_named(g, y, name);

    /* GShard's auxiliary loss per group, averaged over the groups:
     * E * sum_e mean_s(gates_e) * mean_s(first choice_e). */
    spmd_tensor *density = spmd_mean(g, masks[0], 1u << 1, false);             // [G, E]
    spmd_tensor *proxy = spmd_mean(g, gates, 1u << 1, false);
    spmd_tensor *aux = spmd_scale(g, spmd_sum(g, spmd_mul(g, density, proxy), 0x3u, false),
                                  (float)E / (float)G);
    sums->aux = sums->aux ? spmd_add(g, sums->aux, aux) : aux;
    sums->dropped = sums->dropped ? spmd_add(g, sums->dropped, dropped) : dropped;
    return y;
}
