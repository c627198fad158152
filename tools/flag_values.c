/*
 * A flag's value read into cli_opts by its row's kind (flag_values.h):
 * the integer, number and choice readers with their refusals, and the
 * rows' own readers (--model, --optimizer, the per-copy lists, --shard,
 * --prompt).
 */
#include "flag_values.h"

#include "message.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse_int(const flag_spec *fs, const char *text, int *out)
{
    long max = fs->max ? (long)fs->max : CLI_INT_MAX, min = (long)fs->min;
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || *end || end == text || v < min || v > max) {
        bool why = fs->why_min && !errno && !*end && end != text && v < min;
        return cli_fail("%s wants an integer from %ld to %ld, got '%s'%s%s", fs->name, min, max,
                        text, why ? ": " : "", why ? fs->why_min : "");
    }
    *out = (int)v;
    return 0;
}

/* Any 64-bit unsigned value.  strtoull would wrap "-1" to the largest, so
 * only digits are taken. */
static int parse_u64(const char *flag, const char *text, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (!isdigit((unsigned char)text[0]) || errno || *end)
        return cli_fail("%s wants an integer from 0 to %" PRIu64 ", got '%s'", flag, UINT64_MAX,
                        text);
    *out = (uint64_t)v;
    return 0;
}

/* A finite number in [min, max), or [min, max] when max_included. */
static int parse_float(const flag_spec *fs, const char *text, float *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || *end || end == text || !(v >= fs->min) || v > fs->max ||
        (!fs->max_included && v == fs->max))
        return cli_fail("%s wants a number from %g to %g (%s), got '%s'", fs->name, fs->min,
                        fs->max, fs->max_included ? "included" : "excluded", text);
    *out = (float)v;
    return 0;
}

/* "a|b": a is false, b true. */
static int parse_choice(const flag_spec *fs, const char *v, bool *is_b)
{
    const char *bar = strchr(fs->choices, '|');
    size_t a_len = (size_t)(bar - fs->choices);
    bool a = strlen(v) == a_len && !strncmp(v, fs->choices, a_len), b = !strcmp(v, bar + 1);
    if (!a && !b)
        return cli_fail("%s is %.*s or %s, got '%s'", fs->name, (int)a_len, fs->choices, bar + 1, v);
    *is_b = b;
    return 0;
}

int flag_set_model(const flag_spec *fs, char *v, cli_opts *o)
{
    static const flag_spec choice = {.name = "--model", .choices = "gpt|mlp"};
    (void)fs;
    bool mlp = false;
    int rc = parse_choice(&choice, v, &mlp);
    strcpy(o->model, mlp ? "mlp" : "gpt");
    return rc;
}

int flag_set_optimizer(const flag_spec *fs, char *v, cli_opts *o)
{
    for (int k = 0; k < CLI_OPTIMIZERS; k++)
        if (!strcmp(v, cli_optimizer_word((spmd_optimizer_kind)k))) {
            o->optimizer.kind = (spmd_optimizer_kind)k;
            return 0;
        }
    char words[96] = "";
    for (int k = 0; k < CLI_OPTIMIZERS; k++) {
        size_t n = strlen(words);
        snprintf(words + n, sizeof words - n, "%s%s", k == 0 ? "" : k + 1 < CLI_OPTIMIZERS ? ", " : " or ",
                 cli_optimizer_word((spmd_optimizer_kind)k));
    }
    return cli_fail("%s is %s, got '%s'", fs->name, words, v);
}

/* --seed, --lr, --warmup or --weight-decay: one value, or a comma-separated list of one
 * per copy; the first is also the run's (copy 0's).  `v` is ours to cut. */
int flag_set_copy_list(const flag_spec *fs, char *v, cli_opts *o)
{
    const char *f = fs->name;
    size_t len = strlen(v);
    if (len && (v[0] == ',' || v[len - 1] == ',' || strstr(v, ",,")))
        return cli_fail("%s '%s' has an empty value in its list", f, v);
    int n = 0;
    char *save = NULL;
    for (char *item = strtok_r(v, ",", &save); item; item = strtok_r(NULL, ",", &save), n++) {
        if (n == CLI_MAX_COPIES) return cli_fail("%s lists more than %d values", f, CLI_MAX_COPIES);
        int rc = 0;
        if (!strcmp(f, "--seed")) {
            rc = parse_u64(f, item, &o->seeds[n]);
        } else if (!strcmp(f, "--weight-decay")) {
            static const flag_spec decay = {.name = "--weight-decay", .min = 0, .max = 1e6,
                                            .max_included = true};
            rc = parse_float(&decay, item, &o->wds[n]);
        } else if (!strcmp(f, "--lr")) {
            char *end;
            o->lrs[n] = strtof(item, &end);
            if (*end || end == item || !(o->lrs[n] > 0) || !isfinite(o->lrs[n]))
                rc = cli_fail("--lr wants a positive number (or one per copy, comma-separated), "
                              "got '%s'", item);
        } else {
            static const flag_spec warmup = {.name = "--warmup", .min = 0};
            rc = parse_int(&warmup, item, &o->warmups[n]);
        }
        if (rc) return rc;
    }
    if (n == 0) return cli_fail("%s needs a value", f);
    if (!strcmp(f, "--seed")) o->n_seeds = n, o->seed = o->seeds[0];
    else if (!strcmp(f, "--lr")) o->n_lrs = n, o->lr = o->lrs[0];
    else if (!strcmp(f, "--weight-decay")) {
        /* A list is fed each step: the update decays if any copy does. */
        o->n_wds = n;
        o->optimizer.weight_decay = o->wds[0];
        for (int i = 1; i < n; i++)
            if (o->wds[i] > o->optimizer.weight_decay) o->optimizer.weight_decay = o->wds[i];
        o->optimizer.weight_decay_input = n > 1;
    }
    else o->n_warmups = n, o->warmup = o->warmups[0];
    return 0;
}

int flag_set_shard(const flag_spec *fs, char *v, cli_opts *o)
{
    (void)fs;
    char *eq = strchr(v, '=');
    if (!eq || eq == v) return cli_fail("--shard wants PATTERN=SPEC, got '%s'", v);
    if (o->n_shards == CLI_MAX_SHARDS) return cli_fail("more than %d --shard rules", CLI_MAX_SHARDS);
    *eq = '\0'; /* split in place */
    o->shards[o->n_shards++] = (cli_shard){v, eq + 1};
    return 0;
}

int flag_set_prompt(const flag_spec *fs, char *v, cli_opts *o)
{
    (void)fs;
    if (o->n_prompts == CLI_MAX_PROMPTS) return cli_fail("more than %d --prompt", CLI_MAX_PROMPTS);
    if (!*v) return cli_fail("--prompt is empty: give some text, or leave it out");
    o->prompts[o->n_prompts++] = v;
    return 0;
}

/* A name of letters, digits and '_', not starting with a digit. */
static bool setting_name(const char *s, size_t n)
{
    if (n == 0 || isdigit((unsigned char)s[0])) return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '_') return false;
    return true;
}

int flag_set_launch_list(const flag_spec *fs, char *v, cli_opts *o)
{
    bool mca = !strcmp(fs->name, "--mca");
    const char **list = mca ? o->mca : o->env;
    int *n = mca ? &o->n_mca : &o->n_env;
    if (*n == CLI_MAX_LAUNCH_SETTINGS)
        return cli_fail("more than %d %s", CLI_MAX_LAUNCH_SETTINGS, fs->name);
    const char *eq = strchr(v, '=');
    size_t name = eq ? (size_t)(eq - v) : strlen(v);
    if (mca && (!eq || !setting_name(v, name) || !eq[1]))
        return cli_fail("--mca wants KEY=VALUE, an Open MPI setting (btl_tcp_if_include=eth0), "
                        "got '%s'", v);
    if (!mca && !setting_name(v, name))
        return cli_fail("--env wants NAME or NAME=VALUE, an environment variable, got '%s'", v);
    list[(*n)++] = v;
    return 0;
}

/* One flag's value into `o`; `v` is ours to modify. */
int flag_set(const flag_spec *fs, char *v, cli_opts *o)
{
    char *field = (char *)o + fs->offset;
    bool b = false;
    int rc = 0;
    switch (fs->kind) {
    case FLAG_INT: return parse_int(fs, v, (int *)(void *)field);
    case FLAG_FLOAT: return parse_float(fs, v, (float *)(void *)field);
    case FLAG_TEXT: *(const char **)(void *)field = v; return 0;
    case FLAG_CHOICE:
        rc = parse_choice(fs, v, &b);
        *(bool *)(void *)field = b;
        return rc;
    case FLAG_CUSTOM: return fs->set(fs, v, o);
    }
    return 0;
}
