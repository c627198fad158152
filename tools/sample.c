/*
 * `spmd sample`: text generation from a trained GPT (a checkpoint of
 * `spmd train --save`, or GPT-2 weights with --init), on a mesh as
 * training runs.  The decoding step (spmd_gpt_build_decode) keeps each
 * block's keys and values in a KV cache, so every new token costs one
 * position; `--cache off` instead reruns the training graph's forward pass
 * over the whole prefix for every token, the reference the cache must
 * match.  Temperature and top-k sampling happen here, on the logits read
 * back, with the counter-based RNG: a token is a function of the seed, the
 * row and its position, so a seed gives the same text every time.
 */
#include "cli.h"
#include "vocab.h"

#include "base/rng.h"
#include "spmd/weights.h"

#include <cJSON.h>

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_PROMPTS 256
#define MAX_SAMPLES 4096
#define DEFAULT_TOKENS 32

typedef struct sample_opts {
    cli_opts o;              /* the flags spmd train shares: mesh, marks, weights, shape */
    const char *prompts[MAX_PROMPTS];
    int n_prompts;
    int samples;             /* rows; 0: one per prompt */
    int tokens;              /* new tokens per row; 0: DEFAULT_TOKENS or what fits */
    float temperature;
    int top_k;               /* 0: every token */
    const char *tokenizer;
    bool cache;
    bool shape_given, data_given;
} sample_opts;

/* One row of the batch: its tokens (prompt, then generated) and where the
 * generated part starts and ends. */
typedef struct sample_row {
    int32_t *tokens; /* [context] */
    int prompt, end;
} sample_row;

typedef struct sampler {
    sample_opts *s;
    spmd_gpt_config cfg;
    vocab voc;
    const char *source;   /* the data the model was trained on: decides the vocab */
    spmd_mesh *mesh;
    cli_graph fwd;        /* the training graph's forward pass */
    spmd_program *fwd_p;
    spmd_graph *dec_g;    /* the decoding step */
    spmd_gpt_decode_tensors dec;
    spmd_program *dec_p;
    int rows, context;
    sample_row *row;
    float *logits;        /* [rows, V] at the current position */
    char *meta;           /* the checkpoint's meta, or NULL */
    char source_buf[1024]; /* the checkpoint's data source */
} sampler;

static void sample_usage(FILE *f)
{
    fprintf(f,
            "usage: spmd sample [flags]   (each as --flag VALUE or --flag=VALUE)\n"
            "  --resume DIR         a checkpoint of spmd train --save (its latest step): the\n"
            "                       model's shape and data come from it\n"
            "  --init FILE          or GPT-2 weights (Hugging Face safetensors, llm.c checkpoint)\n"
            "                       (neither: a new model of the shape flags, as train makes)\n"
            "  --prompt TEXT        the text to continue; repeatable, one row each (default: a\n"
            "                       newline; arith: a random digit; GPT-2: its end-of-text token)\n"
            "  --samples N          rows; row r continues prompt r modulo the prompts (one per\n"
            "                       prompt)\n"
            "  --tokens N           new tokens per row (%d, or what fits in the context)\n"
            "  --temperature T      0 picks the likeliest token; higher is more random (1)\n"
            "  --top-k K            sample among the K likeliest tokens, 0 for all (0)\n"
            "  --seed N             sampling seed, 0 to 2^64-1 (1); also the new model's init\n"
            "  --tokenizer FILE     llm.c tokenizer file (gpt2_tokenizer.bin) for GPT-2's\n"
            "                       vocabulary\n"
            "  --cache on|off       keep keys and values (on), or rerun the whole prefix for\n"
            "                       every token (off: the reference, slower)\n"
            "  --mesh, --axes, --devices, --fsdp, --shard, --threads, --blas, --blas-core\n"
            "                       as spmd train (the batch of rows is split like training's)\n"
            "  --data, --layers, --dim, --heads, --seq, --context, --vocab\n"
            "                       without --resume: the model's data and shape, as train\n",
            DEFAULT_TOKENS);
}

/* ---- Flags ----------------------------------------------------------------------------- */

static int parse_count(const char *flag, const char *text, int min, int max, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || *end || end == text || v < min || v > max)
        return cli_fail("%s wants an integer from %d to %d, got '%s'", flag, min, max, text);
    *out = (int)v;
    return 0;
}

/* A sample flag's value into s; 1 when `name` is not one. */
static int set_sample_flag(sample_opts *s, const char *name, const char *v, int *rc)
{
    *rc = 0;
    if (!strcmp(name, "--prompt")) {
        if (s->n_prompts == MAX_PROMPTS) *rc = cli_fail("more than %d --prompt", MAX_PROMPTS);
        else if (!*v) *rc = cli_fail("--prompt is empty: give some text, or leave it out");
        else s->prompts[s->n_prompts++] = v;
    } else if (!strcmp(name, "--samples")) {
        *rc = parse_count(name, v, 1, MAX_SAMPLES, &s->samples);
    } else if (!strcmp(name, "--tokens")) {
        *rc = parse_count(name, v, 1, 1000000, &s->tokens);
    } else if (!strcmp(name, "--top-k")) {
        *rc = parse_count(name, v, 0, INT_MAX, &s->top_k);
    } else if (!strcmp(name, "--temperature")) {
        char *end;
        errno = 0;
        double t = strtod(v, &end);
        if (errno || *end || end == v || !(t >= 0) || t > 100)
            *rc = cli_fail("--temperature wants a number from 0 to 100, got '%s'", v);
        s->temperature = (float)t;
    } else if (!strcmp(name, "--tokenizer")) {
        s->tokenizer = v;
    } else if (!strcmp(name, "--cache")) {
        if (strcmp(v, "on") && strcmp(v, "off"))
            *rc = cli_fail("--cache is on or off, got '%s'", v);
        s->cache = !strcmp(v, "on");
    } else {
        return 1;
    }
    return 0;
}

/* The flags of spmd train that sample takes too, passed to cli_parse. */
static bool shared_flag(const char *name, sample_opts *s)
{
    static const char *const mesh[] = {"--mesh", "--axes",  "--devices", "--fsdp",
                                       "--shard", "--threads", "--seed", "--init",
                                       "--resume", "--blas", "--blas-core"};
    static const char *const shape[] = {"--layers", "--dim", "--heads", "--seq", "--context",
                                        "--vocab"};
    for (size_t i = 0; i < sizeof mesh / sizeof *mesh; i++)
        if (!strcmp(name, mesh[i])) return true;
    for (size_t i = 0; i < sizeof shape / sizeof *shape; i++)
        if (!strcmp(name, shape[i])) return s->shape_given = true;
    if (!strcmp(name, "--data")) return s->data_given = true;
    return false;
}

/* Sample's own flags here, the shared ones through cli_parse; 0, -1
 * after help, or an exit code. */
static int parse_sample(int argc, char **argv, sample_opts *s, char **shared)
{
    memset(s, 0, sizeof *s);
    s->temperature = 1.0f;
    s->cache = true;
    int n = 0, rc;
    for (int i = 0; i < argc; i++) {
        char *arg = argv[i];
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
            sample_usage(stdout);
            return -1;
        }
        if (arg[0] != '-' || arg[1] != '-')
            return cli_fail("unexpected argument '%s': spmd sample takes only flags (--help "
                            "lists them)", arg);
        char name[64];
        const char *eq = strchr(arg, '=');
        size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
        snprintf(name, sizeof name, "%.*s", (int)(len < sizeof name ? len : sizeof name - 1), arg);
        const char *v = eq ? eq + 1 : i + 1 < argc ? argv[i + 1] : NULL;
        bool own = !strcmp(name, "--prompt") || !strcmp(name, "--samples") ||
                   !strcmp(name, "--tokens") || !strcmp(name, "--top-k") ||
                   !strcmp(name, "--temperature") || !strcmp(name, "--tokenizer") ||
                   !strcmp(name, "--cache");
        if (!own && !shared_flag(name, s)) {
            sample_usage(stderr);
            return cli_fail("unknown flag '%s' for spmd sample", name);
        }
        if (!v) return cli_fail("%s needs a value", name);
        if (!eq) i++;
        if (own) {
            set_sample_flag(s, name, v, &rc);
            if (rc) return rc;
            continue;
        }
        shared[n++] = arg;
        if (!eq) shared[n++] = argv[i];
    }
    /* Flags that do not apply, before cli_parse reads any file they name. */
    const char *resume = NULL, *init = NULL;
    for (int i = 0; i + 1 < n; i++) {
        if (!strcmp(shared[i], "--resume")) resume = shared[i + 1];
        if (!strcmp(shared[i], "--init")) init = shared[i + 1];
        if (!strncmp(shared[i], "--resume=", 9)) resume = shared[i] + 9;
        if (!strncmp(shared[i], "--init=", 7)) init = shared[i] + 7;
    }
    if (resume && (s->shape_given || s->data_given))
        return cli_fail("--resume %s gives the model's %s; leave %s out", resume,
                        s->shape_given ? "shape" : "data",
                        s->shape_given ? "the shape flags" : "--data");
    if (init && s->data_given)
        return cli_fail("--init %s has GPT-2's vocabulary; --data does not apply", init);
    return cli_parse(n, shared, "sample", &s->o);
}

/* ---- The model ---------------------------------------------------------------------- */

/* The shape and data source: the checkpoint's, the --init file's (via
 * cli_parse), or the flags' with the data's vocabulary. */
static int model_config(sampler *sp)
{
    sample_opts *s = sp->s;
    if (s->o.resume) {
        int64_t step;
        if (spmd_weights_checkpoint_config(s->o.resume, &sp->cfg, &step) != SPMD_OK)
            return cli_fail("--resume %s: %s", s->o.resume, spmd_last_error());
        return 0;
    }
    sp->cfg = s->o.gpt;
    if (s->o.init) {
        sp->source = "gpt2";
        return 0;
    }
    sp->source = s->o.data ? s->o.data : "arith";
    spmd_dataset *d = spmd_dataset_open(s->o.data, sp->cfg.seq, s->o.seed);
    if (!d) return cli_fail("--data %s: %s", sp->source, spmd_last_error());
    if (!sp->cfg.vocab) sp->cfg.vocab = spmd_dataset_vocab(d);
    spmd_dataset_free(d);
    if (spmd_gpt_validate(&sp->cfg) != SPMD_OK) return cli_fail("%s", spmd_last_error());
    return 0;
}

/* The checkpoint's data source, from its meta. */
static int meta_source(sampler *sp)
{
    cJSON *meta = cJSON_Parse(sp->meta ? sp->meta : "");
    const cJSON *src = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(meta, "data"), "source");
    char *source = sp->source_buf;
    if (cJSON_IsString(src)) snprintf(source, sizeof sp->source_buf, "%s", src->valuestring);
    cJSON_Delete(meta);
    if (!source[0])
        return cli_fail("--resume %s: its meta does not name the data it was trained on (data."
                        "source): not a checkpoint written by spmd train", sp->s->o.resume);
    sp->source = source;
    return 0;
}

/* Text the model reads and writes: the tokenizer file when given, else
 * the data's own symbols or bytes. */
static int choose_vocab(sampler *sp)
{
    const char *src = sp->source;
    bool arith = !strncmp(src, "arith", 5) && (!src[5] || src[5] == ':');
    size_t n = strlen(src);
    bool shards = !strcmp(src, "gpt2") || (n > 4 && !strcmp(src + n - 4, ".bin"));
    if (sp->s->tokenizer) {
        int rc = vocab_load_llmc(&sp->voc, sp->s->tokenizer);
        if (rc) return rc;
        if (sp->voc.size < sp->cfg.vocab)
            return cli_fail("--tokenizer %s has %d tokens; the model's vocabulary has %d",
                            sp->s->tokenizer, sp->voc.size, sp->cfg.vocab);
    } else if (arith && sp->cfg.vocab == SPMD_ARITH_VOCAB) {
        vocab_arith(&sp->voc);
    } else if (!shards && sp->cfg.vocab <= 256) {
        vocab_bytes(&sp->voc);
    } else {
        return cli_fail("the model's vocabulary of %d tokens (%s%s) needs a tokenizer: give "
                        "--tokenizer FILE (llm.c's gpt2_tokenizer.bin)",
                        sp->cfg.vocab, sp->s->o.init ? "GPT-2 weights from --init " : "data ",
                        sp->s->o.init ? sp->s->o.init : src);
    }
    return 0;
}

static int fail_status(const char *what)
{
    cli_fail("%s: %s", what, spmd_last_error());
    return 1;
}

/* The forward pass (for --cache off over the whole context, else over one
 * position, only to load the weights into) and the decoding step, both
 * marked for the mesh as training is. */
static int build_programs(sampler *sp)
{
    sample_opts *s = sp->s;
    cli_opts *o = &s->o;
    sp->mesh = spmd_mesh_parse(o->mesh, o->axes);
    if (!sp->mesh) return cli_fail("--mesh %s --axes %s: %s", o->mesh, o->axes, spmd_last_error());
    if (o->devices && o->devices != spmd_mesh_devices(sp->mesh))
        return cli_fail("--devices %d but the mesh %s has %d devices", o->devices, o->mesh,
                        spmd_mesh_devices(sp->mesh));
    bool marks = spmd_mesh_devices(sp->mesh) > 1 || o->n_shards > 0;
    spmd_gpt_config fc = sp->cfg;
    fc.context = sp->context;
    fc.seq = s->cache ? 1 : sp->context;
    spmd_gpt_tensors ft;
    sp->fwd.g = spmd_graph_create(NULL);
    sp->dec_g = spmd_graph_create(NULL);
    if (!sp->fwd.g || !sp->dec_g) return fail_status("cannot build the model");
    if (spmd_gpt_build(sp->fwd.g, &fc, sp->rows, &ft) != SPMD_OK ||
        spmd_gpt_build_decode(sp->dec_g, &fc, sp->rows, &sp->dec) != SPMD_OK ||
        spmd_graph_mark_output(sp->fwd.g, ft.logits) != SPMD_OK)
        return cli_fail("cannot build the model: %s", spmd_last_error());
    sp->fwd.input = ft.input, sp->fwd.targets = ft.targets, sp->fwd.logits = ft.logits;
    cli_graph dec = {.g = sp->dec_g, .input = sp->dec.input, .logits = sp->dec.logits};
    int rc = 0;
    if (marks) rc = cli_apply_marks(o, sp->mesh, &sp->fwd);
    if (!rc && marks) rc = cli_apply_marks(o, sp->mesh, &dec);
    if (rc) return rc;
    sp->fwd_p = cli_compile(o, sp->fwd.g, false);
    if (!sp->fwd_p) return 1;
    if (s->cache && !(sp->dec_p = cli_compile(o, sp->dec_g, false))) return 1;
    return 0;
}

/* The weights into the forward program (by name, from any mesh), then
 * every parameter from there into the decoding step. */
static int load_weights(sampler *sp)
{
    const cli_opts *o = &sp->s->o;
    if (o->resume) {
        int64_t step;
        if (spmd_checkpoint_load(sp->fwd_p, o->resume, &step, &sp->meta) != SPMD_OK)
            return cli_fail("--resume %s: %s", o->resume, spmd_last_error());
        printf("model: %s step %lld\n", o->resume, (long long)step);
    } else if (o->init) {
        if (spmd_weights_load(sp->fwd_p, &sp->cfg, o->init) != SPMD_OK)
            return cli_fail("--init %s: %s", o->init, spmd_last_error());
        printf("model: %s\n", o->init);
    } else {
        printf("model: new, initialised from seed %llu\n", (unsigned long long)o->seed);
    }
    for (int i = 0; sp->dec_p && i < spmd_graph_tensor_count(sp->dec_g); i++) {
        spmd_tensor *t = spmd_graph_tensor(sp->dec_g, i);
        if (!spmd_tensor_is_param(t)) continue;
        spmd_tensor *src = spmd_graph_find(sp->fwd.g, spmd_tensor_name(t));
        size_t bytes = (size_t)spmd_tensor_numel(t) * sizeof(float);
        float *buf = malloc(bytes);
        spmd_status st = buf ? spmd_program_read(sp->fwd_p, src, buf, bytes) : SPMD_ERR_NOMEM;
        if (st == SPMD_OK) st = spmd_program_write(sp->dec_p, t, buf, bytes);
        free(buf);
        if (st != SPMD_OK) return fail_status("cannot copy the weights");
    }
    return 0;
}

/* ---- Sampling -------------------------------------------------------------------------- */

/* The next token from logits [V]: the likeliest at temperature 0, else a
 * draw from softmax(logits / T) over the top-k, with uniform u. */
static int32_t pick_token(const float *logits, int V, float temperature, int top_k, double u,
                          double *p)
{
    int best = 0;
    for (int k = 1; k < V; k++)
        if (logits[k] > logits[best]) best = k;
    if (temperature == 0) return best;
    double floor_logit = -INFINITY;
    if (top_k > 0 && top_k < V) {
        /* The k-th largest logit: tokens below it get no probability. */
        for (int k = 0; k < V; k++) p[k] = logits[k];
        for (int k = 0; k < top_k; k++) {
            int at = k;
            for (int j = k + 1; j < V; j++)
                if (p[j] > p[at]) at = j;
            double tmp = p[k];
            p[k] = p[at];
            p[at] = tmp;
        }
        floor_logit = p[top_k - 1];
    }
    double sum = 0;
    for (int k = 0; k < V; k++) {
        p[k] = logits[k] >= floor_logit ? exp(((double)logits[k] - logits[best]) / temperature) : 0;
        sum += p[k];
    }
    double acc = 0, target = u * sum;
    for (int k = 0; k < V; k++) {
        acc += p[k];
        if (p[k] > 0 && target < acc) return k;
    }
    return best;
}

/* Row r's next token after position `pos`, from the logits read there. */
static void take_next(sampler *sp, int r, int pos, const float *logits, double *p)
{
    sample_row *row = &sp->row[r];
    if (pos + 1 < row->prompt || pos + 1 >= row->end) return;
    uint64_t index = (uint64_t)r * (uint64_t)sp->context + (uint64_t)pos + 1;
    double u = base_rng_uniform(sp->s->o.seed, base_rng_stream("sample"), index);
    row->tokens[pos + 1] =
        pick_token(logits, sp->cfg.vocab, sp->s->temperature, sp->s->top_k, u, p);
}

/* One position with the KV cache: every row's token at `pos` in, the
 * next-token logits [rows, V] out. */
static int step_cached(sampler *sp, int pos, int32_t *ids)
{
    for (int r = 0; r < sp->rows; r++) ids[r] = sp->row[r].tokens[pos];
    int32_t p = pos;
    size_t bytes = (size_t)sp->rows * (size_t)sp->cfg.vocab * sizeof(float);
    if (spmd_program_set_input(sp->dec_p, sp->dec.input, ids, (size_t)sp->rows * sizeof *ids) ||
        spmd_program_set_input(sp->dec_p, sp->dec.position, &p, sizeof p) ||
        spmd_program_run(sp->dec_p) ||
        spmd_program_read(sp->dec_p, sp->dec.logits, sp->logits, bytes))
        return fail_status("decoding");
    return 0;
}

/* One position without it: the forward pass over every row's whole
 * context (later positions do not reach earlier ones), logits at `pos`. */
static int step_full(sampler *sp, int pos, int32_t *ids, float *all)
{
    const int C = sp->context, V = sp->cfg.vocab;
    for (int r = 0; r < sp->rows; r++)
        memcpy(ids + (size_t)r * C, sp->row[r].tokens, C * sizeof *ids);
    size_t n = (size_t)sp->rows * C;
    if (spmd_program_set_input(sp->fwd_p, sp->fwd.input, ids, n * sizeof *ids) ||
        spmd_program_run(sp->fwd_p) ||
        spmd_program_read(sp->fwd_p, sp->fwd.logits, all, n * V * sizeof *all))
        return fail_status("forward pass");
    for (int r = 0; r < sp->rows; r++)
        memcpy(sp->logits + (size_t)r * V, all + ((size_t)r * C + pos) * V, V * sizeof *all);
    return 0;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Positions 0 .. the last row's end; returns 0 and the seconds spent on
 * prompt positions and on generated ones. */
static int generate(sampler *sp, double *prompt_s, double *gen_s)
{
    const int V = sp->cfg.vocab, C = sp->context;
    int last = 0, shortest = C;
    for (int r = 0; r < sp->rows; r++) {
        if (sp->row[r].end > last) last = sp->row[r].end;
        if (sp->row[r].prompt < shortest) shortest = sp->row[r].prompt;
    }
    size_t n = sp->s->cache ? (size_t)sp->rows : (size_t)sp->rows * C;
    int32_t *ids = calloc(n, sizeof *ids);
    float *all = sp->s->cache ? NULL : malloc(n * V * sizeof *all);
    double *p = malloc((size_t)V * sizeof *p);
    int rc = ids && p && (sp->s->cache || all) ? 0 : cli_fail("out of memory");
    /* The forward pass computes a loss too: its targets must be token ids. */
    if (!rc && !sp->s->cache &&
        spmd_program_set_input(sp->fwd_p, sp->fwd.targets, ids, n * sizeof *ids) != SPMD_OK)
        rc = fail_status("forward pass");
    *prompt_s = *gen_s = 0;
    for (int pos = 0; !rc && pos + 1 < last; pos++) {
        /* Without the cache, positions inside every prompt need no run. */
        if (!sp->s->cache && pos + 1 < shortest) continue;
        double t0 = now_s();
        rc = sp->s->cache ? step_cached(sp, pos, ids) : step_full(sp, pos, ids, all);
        for (int r = 0; !rc && r < sp->rows; r++)
            take_next(sp, r, pos, sp->logits + (size_t)r * V, p);
        *(pos + 1 < shortest ? prompt_s : gen_s) += now_s() - t0;
    }
    free(ids);
    free(all);
    free(p);
    return rc;
}

/* ---- Output ---------------------------------------------------------------------------- */

/* `width` decimal digits at s into *v; false if any is not a digit. */
static bool read_number(const char *s, int width, long *v)
{
    *v = 0;
    for (int i = 0; i < width; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        *v = *v * 10 + (s[i] - '0');
    }
    return true;
}

/* Whether line [s, s + n) is an addition "a+b=c" in the arith data's
 * format (operands of `digits` digits, the sum of digits + 1), and its
 * numbers. */
static bool addition_form(const char *s, size_t n, int digits, long *a, long *b, long *c)
{
    size_t d = (size_t)digits;
    return n == 3 * d + 3 && read_number(s, digits, a) && s[d] == '+' &&
           read_number(s + d + 1, digits, b) && s[2 * d + 1] == '=' &&
           read_number(s + 2 * d + 2, digits + 1, c);
}

/* Each line of a row's text that its generated part completes, checked
 * as an addition of the arith data: counts of such lines, of those that
 * are additions, and of right ones. */
static void check_additions(const char *text, size_t prompt_bytes, int digits, int *lines,
                            int *sums, int *right)
{
    size_t len = strlen(text);
    for (size_t at = 0; at < len;) {
        const char *nl = memchr(text + at, '\n', len - at);
        size_t end = nl ? (size_t)(nl - text) : len;
        if (nl && end > prompt_bytes && end > at) {
            long a, b, c;
            (*lines)++;
            if (addition_form(text + at, end - at, digits, &a, &b, &c)) {
                (*sums)++;
                *right += a + b == c;
            }
        }
        at = end + 1;
    }
}

static int arith_digits(const char *source)
{
    return source[5] == ':' ? atoi(source + 6) : 2;
}

static void print_rows(sampler *sp)
{
    bool arith = sp->voc.kind == VOCAB_ARITH;
    int lines = 0, sums = 0, right = 0;
    size_t size = (size_t)sp->context * 64 + 1;
    char *text = malloc(size);
    if (!text) return;
    for (int r = 0; r < sp->rows; r++) {
        const sample_row *row = &sp->row[r];
        size_t n = 0, prompt_bytes = 0;
        text[0] = '\0';
        for (int i = 0; i < row->end; i++) {
            vocab_decode(&sp->voc, row->tokens[i], text, size, &n);
            if (i + 1 == row->prompt) prompt_bytes = n;
        }
        printf("--- sample %d of %d (%d prompt + %d new tokens)\n%s%s", r + 1, sp->rows,
               row->prompt, row->end - row->prompt, text,
               n && text[n - 1] == '\n' ? "" : "\n");
        if (arith)
            check_additions(text, prompt_bytes, arith_digits(sp->source), &lines, &sums, &right);
    }
    free(text);
    if (arith)
        printf("arith: %d of %d sampled additions right (%.1f%%); %d of %d completed lines are "
               "additions\n",
               right, sums, sums ? 100.0 * right / sums : 0.0, sums, lines);
}

/* ---- The command ----------------------------------------------------------------------- */

/* Row r's first token when no prompt is given: where the data starts a
 * new piece of text.  GPT-2 text, after its end-of-text token; bytes,
 * after a newline; arith samples open a problem at position 0 (the model
 * finds digits by position), so a digit drawn from the seed. */
static int32_t default_start(const sampler *sp, int r)
{
    if (sp->voc.kind == VOCAB_ARITH)
        return (int32_t)(base_rng_bits(sp->s->o.seed, base_rng_stream("sample.start"),
                                       (uint64_t)r) % 10);
    if (sp->voc.kind == VOCAB_LLMC && sp->voc.eot >= 0 && sp->voc.eot < sp->cfg.vocab)
        return sp->voc.eot;
    return '\n' < sp->cfg.vocab ? '\n' : 0;
}

/* Prompt tokens the model has no row for (a tokenizer larger than its
 * vocabulary) are refused, naming the first. */
static int check_prompt_ids(const sampler *sp, const char *prompt, const int32_t *ids, int n)
{
    for (int i = 0; i < n; i++)
        if (ids[i] >= sp->cfg.vocab) {
            char text[64];
            size_t len = 0;
            vocab_decode(&sp->voc, ids[i], text, sizeof text, &len);
            return cli_fail("--prompt '%s': its token %d ('%s') is outside the model's "
                            "vocabulary of %d", prompt, (int)ids[i], text, sp->cfg.vocab);
        }
    return 0;
}

/* Rows, their prompts and ends; 0 or an exit code. */
static int setup_rows(sampler *sp)
{
    sample_opts *s = sp->s;
    int np = s->n_prompts ? s->n_prompts : 1;
    sp->rows = s->samples ? s->samples : np;
    sp->row = calloc((size_t)sp->rows, sizeof *sp->row);
    sp->logits = malloc((size_t)sp->rows * (size_t)sp->cfg.vocab * sizeof *sp->logits);
    if (!sp->row || !sp->logits) return cli_fail("out of memory");
    int longest = 0;
    for (int r = 0; r < sp->rows; r++) {
        sample_row *row = &sp->row[r];
        const char *prompt = s->n_prompts ? s->prompts[r % np] : NULL;
        /* Room for the context, and for every byte of the prompt as a
         * token (a prompt longer than the context is refused below). */
        size_t room = (size_t)sp->context + (prompt ? strlen(prompt) : 0) + 1;
        row->tokens = calloc(room, sizeof *row->tokens);
        if (!row->tokens) return cli_fail("out of memory");
        if (prompt) {
            row->prompt = vocab_encode(&sp->voc, "--prompt", prompt, row->tokens);
            if (row->prompt < 0) return 2;
            int rc = check_prompt_ids(sp, prompt, row->tokens, row->prompt);
            if (rc) return rc;
        } else {
            row->tokens[0] = default_start(sp, r);
            row->prompt = 1;
        }
        if (row->prompt > longest) longest = row->prompt;
    }
    int room = sp->context - longest;
    if (room < 1)
        return cli_fail("--prompt: the longest prompt (%d tokens) leaves no room for new tokens "
                        "in the model's context of %d positions", longest, sp->context);
    if (s->tokens > room)
        return cli_fail("--tokens %d: the longest prompt (%d token%s) leaves room for %d new "
                        "tokens in the model's context of %d positions",
                        s->tokens, longest, longest == 1 ? "" : "s", room, sp->context);
    int tokens = s->tokens ? s->tokens : room < DEFAULT_TOKENS ? room : DEFAULT_TOKENS;
    for (int r = 0; r < sp->rows; r++) sp->row[r].end = sp->row[r].prompt + tokens;
    return 0;
}

static void sampler_free(sampler *sp)
{
    for (int r = 0; sp->row && r < sp->rows; r++) free(sp->row[r].tokens);
    free(sp->row);
    free(sp->logits);
    free(sp->meta);
    spmd_program_free(sp->fwd_p);
    spmd_program_free(sp->dec_p);
    spmd_graph_free(sp->fwd.g);
    spmd_graph_free(sp->dec_g);
    spmd_mesh_free(sp->mesh);
    vocab_free(&sp->voc);
}

static int run_sample(sampler *sp)
{
    int rc = model_config(sp);
    if (!rc && !sp->s->o.resume) rc = choose_vocab(sp);
    if (rc) return rc;
    sp->context = sp->cfg.context ? sp->cfg.context : sp->cfg.seq;
    /* The rows need the vocabulary to encode prompts: with --resume it is
     * known once the checkpoint's meta is read, so build for the rows'
     * count first and encode after loading. */
    sp->rows = sp->s->samples ? sp->s->samples : sp->s->n_prompts ? sp->s->n_prompts : 1;
    if ((rc = build_programs(sp)) || (rc = load_weights(sp))) return rc;
    if (sp->s->o.resume && (rc = meta_source(sp))) return rc;
    if (!sp->voc.size && (rc = choose_vocab(sp))) return rc;
    if ((rc = setup_rows(sp))) return rc;
    char mesh[96];
    snprintf(mesh, sizeof mesh, "%s (%s)", sp->s->o.mesh, sp->s->o.axes);
    printf("sample: %d row(s) on mesh %s, %s, temperature %g, top-k %d, seed %llu\n", sp->rows,
           spmd_mesh_devices(sp->mesh) > 1 ? mesh : "of 1 device",
           sp->s->cache ? "KV cache" : "no cache (the whole prefix each token)",
           (double)sp->s->temperature, sp->s->top_k, (unsigned long long)sp->s->o.seed);
    double prompt_s, gen_s;
    if ((rc = generate(sp, &prompt_s, &gen_s))) return rc;
    print_rows(sp);
    int64_t made = 0;
    for (int r = 0; r < sp->rows; r++) made += sp->row[r].end - sp->row[r].prompt;
    printf("generated %lld tokens in %.3f s: %.0f tokens/s (%s; prompts took %.3f s)\n",
           (long long)made, gen_s, gen_s > 0 ? (double)made / gen_s : 0.0,
           sp->s->cache ? "KV cache" : "no cache", prompt_s);
    return 0;
}

int cmd_sample(int argc, char **argv)
{
    sample_opts s;
    char **shared = calloc((size_t)argc + 1, sizeof *shared);
    if (!shared) return cli_fail("out of memory");
    int rc = parse_sample(argc, argv, &s, shared);
    if (rc) {
        free(shared);
        return rc < 0 ? 0 : rc;
    }
    sampler sp = {.s = &s};
    rc = run_sample(&sp);
    sampler_free(&sp);
    free(shared);
    return rc;
}
