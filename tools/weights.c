/*
 * `spmd train --init FILE`: a GPT that starts from GPT-2 weights
 * (spmd/weights.h).  The file gives the model's shape; a shape flag may
 * only repeat it, since a model of another shape could not hold the
 * weights.  The sequence length is not in the file (its context is):
 * --seq's default is cut to the context if that is shorter.
 */
#include "weights.h"

#include "message.h"

#include "spmd/weights.h"

#include <stdio.h>
#include <string.h>

static const char *format_words(spmd_weights_format f)
{
    return f == SPMD_WEIGHTS_HF ? "Hugging Face GPT-2 safetensors" : "llm.c checkpoint";
}

static const char *heads_words(spmd_weights_heads from)
{
    switch (from) {
    case SPMD_HEADS_FILE: return "recorded in the file";
    case SPMD_HEADS_CONFIG_JSON: return "from config.json beside it";
    case SPMD_HEADS_GPT2_RULE: return "dim / 64, GPT-2's head size";
    case SPMD_HEADS_UNKNOWN: break;
    }
    return "unknown";
}

/* Whether the file (or its config.json) says how many heads. */
static bool recorded(const spmd_weights_info *info)
{
    return info->heads_from == SPMD_HEADS_FILE || info->heads_from == SPMD_HEADS_CONFIG_JSON;
}

/* Where the model's head count came from. */
static const char *heads_origin(const spmd_weights_info *info, int heads)
{
    if (recorded(info) || (info->heads_from == SPMD_HEADS_GPT2_RULE && heads == info->config.heads))
        return heads_words(info->heads_from);
    return "--heads";
}

/* A shape field: the file's value unless a flag gave it, and then it must
 * be the file's.  The value is said as before + value + after ("2" "
 * layers"). */
static int take(const char *init, const char *flag, bool given, int *field, int from_file,
                const char *before, const char *after)
{
    if (!given || *field == from_file) {
        *field = from_file;
        return 0;
    }
    return cli_fail("%s %d, but --init %s has %s%d%s (leave %s out to take the file's)", flag,
                    *field, init, before, from_file, after, flag);
}

/* --heads against the file's count, which may be unknown or only GPT-2's
 * rule (then any flag wins). */
static int take_heads(const char *init, bool given, spmd_gpt_config *gpt,
                      const spmd_weights_info *info)
{
    const spmd_gpt_config *f = &info->config;
    if (given && recorded(info) && gpt->heads != f->heads)
        return cli_fail("--heads %d, but --init %s has %d heads (%s); leave --heads out to take "
                        "them", gpt->heads, init, f->heads, heads_words(info->heads_from));
    if (given) return 0;
    if (info->heads_from == SPMD_HEADS_UNKNOWN)
        return cli_fail("--init %s: the number of heads is not in the file, there is no "
                        "config.json beside it, and dim %d is not a multiple of 64 (GPT-2's head "
                        "size): give --heads", init, f->dim);
    gpt->heads = f->heads;
    return 0;
}

/* --seq: not in the file, and at most its context. */
static int take_seq(const char *init, bool given, spmd_gpt_config *gpt, int context)
{
    if (!given && gpt->seq > context) gpt->seq = context;
    if (gpt->seq > context)
        return cli_fail("--seq %d is longer than the context of --init %s (%d positions)",
                        gpt->seq, init, context);
    return 0;
}

int weights_init_config(const char *init, const char *model, const char *resume,
                        const weights_shape_given *given, spmd_gpt_config *gpt)
{
    if (strcmp(model, "gpt"))
        return cli_fail("--init loads GPT-2 weights; --model %s cannot take them", model);
    if (resume)
        return cli_fail("--init %s and --resume %s both give the starting weights; use one",
                        init, resume);
    spmd_weights_info info;
    if (spmd_weights_inspect(init, &info) != SPMD_OK)
        return cli_fail("--init: %s", spmd_last_error());
    const spmd_gpt_config *f = &info.config;
    int rc = take(init, "--vocab", given->vocab, &gpt->vocab, f->vocab, "a vocabulary of ", "");
    if (!rc)
        rc = take(init, "--context", given->context, &gpt->context, f->context, "", " positions");
    if (!rc) rc = take(init, "--layers", given->layers, &gpt->layers, f->layers, "", " layers");
    if (!rc) rc = take(init, "--dim", given->dim, &gpt->dim, f->dim, "dim ", "");
    if (!rc) rc = take_heads(init, given->heads, gpt, &info);
    if (!rc) rc = take_seq(init, given->seq, gpt, f->context);
    return rc;
}

int weights_init_apply(const char *init, const spmd_gpt_config *gpt, spmd_program *p)
{
    if (!init) return 0;
    spmd_weights_info info;
    spmd_status st = spmd_weights_inspect(init, &info);
    if (st == SPMD_OK) st = spmd_weights_load(p, gpt, init);
    if (st != SPMD_OK) {
        cli_fail("--init: %s", spmd_last_error());
        /* Weights the model cannot take (an untied lm_head): the file the
         * user named, as a shape it refuses. */
        return st == SPMD_ERR_UNSUPPORTED || st == SPMD_ERR_INVALID || st == SPMD_ERR_SHAPE ? 2 : 1;
    }
    const spmd_gpt_config *c = gpt; /* the model built: vocabulary resolved */
    printf("init: %s (%s): vocab %d, context %d, %d layers, %d heads (%s), dim %d; optimizer "
           "state starts at zero\n",
           init, format_words(info.format), c->vocab, c->context ? c->context : c->seq,
           c->layers, c->heads, heads_origin(&info, c->heads), c->dim);
    return 0;
}
