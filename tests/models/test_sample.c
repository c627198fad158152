/*
 * GPT decoding with a KV cache (spmd_gpt_build_decode) against the
 * training graph's forward pass (spmd_gpt_build), which recomputes the
 * whole prefix for every new token:
 *
 *   - fed one position at a time, the decoding step gives at each position
 *     the logits the full forward pass gives there, within tolerance;
 *   - greedy generation with the cache picks the same tokens as greedy
 *     generation that reruns the full forward pass on each prefix;
 *   - on a mesh (batch over every axis, parameters FSDP, as spmd train
 *     lays them out; and a batch that does not divide), the step gives the
 *     one-device logits, and the caches are split on the batch like the
 *     activations;
 *   - it gives the same bits on 1 and 3 threads and when run again;
 *   - a position past the context fails the run, naming the position;
 *     a bad batch or shape is refused when building.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "spmd/mesh.h"
#include "spmd/models.h"
#include "spmd/spmd.h"
#include "spmd/train.h"
#include "support_rng.h"

#define ATOL 1e-4
#define RTOL 1e-3
#define SEED 7

enum { VOCAB = 11 };
static const spmd_gpt_config cfg = {.vocab = VOCAB, .seq = 12, .context = 12, .layers = 2,
                                    .heads = 2, .dim = 16};

typedef struct decoder {
    spmd_graph *g;
    spmd_gpt_decode_tensors t;
    spmd_program *p;
    spmd_mesh *mesh; /* the marks' mesh, which must outlive the graph */
    int batch;
} decoder;

typedef struct full_model {
    spmd_graph *g;
    spmd_gpt_tensors t;
    spmd_program *p;
    int batch;
} full_model;

static spmd_program *compile(spmd_graph *g, int threads)
{
    spmd_compile_options o = {.threads = threads, .seed = SEED};
    spmd_program *p = spmd_compile(g, &o);
    if (!p) fail_msg("compile (%d threads): %s", threads, spmd_last_error());
    return p;
}

/* The decoding step for `batch` rows; on `mesh` (may be NULL) laid out as
 * spmd train lays out training: the batch over every axis, the
 * parameters FSDP over `fsdp` (NULL: none). */
static void decoder_open(decoder *d, int batch, const char *mesh, const char *axes,
                         const char *fsdp, int threads)
{
    memset(d, 0, sizeof *d);
    d->batch = batch;
    d->g = spmd_graph_create(NULL);
    assert_non_null(d->g);
    if (spmd_gpt_build_decode(d->g, &cfg, batch, &d->t) != SPMD_OK)
        fail_msg("build_decode: %s", spmd_last_error());
    if (mesh) {
        d->mesh = spmd_mesh_parse(mesh, axes);
        assert_non_null(d->mesh);
        spmd_status st = fsdp ? spmd_fsdp_wrap(d->g, d->mesh, fsdp, &d->t.input, 1, NULL)
                              : spmd_shard_batch(d->g, d->mesh, &d->t.input, 1, NULL);
        if (st != SPMD_OK) fail_msg("marks: %s", spmd_last_error());
    }
    d->p = compile(d->g, threads);
}

static void decoder_close(decoder *d)
{
    spmd_program_free(d->p);
    spmd_graph_free(d->g);
    spmd_mesh_free(d->mesh);
}

/* One position: every row's token there in, [batch, V] logits out. */
static void decoder_step(decoder *d, int position, const int32_t *tokens, float *logits)
{
    int32_t pos = position;
    assert_int_equal(spmd_program_set_input(d->p, d->t.input, tokens,
                                            (size_t)d->batch * sizeof *tokens), SPMD_OK);
    assert_int_equal(spmd_program_set_input(d->p, d->t.position, &pos, sizeof pos), SPMD_OK);
    if (spmd_program_run(d->p) != SPMD_OK) fail_msg("decode run: %s", spmd_last_error());
    assert_int_equal(spmd_program_read(d->p, d->t.logits, logits,
                                       (size_t)d->batch * cfg.vocab * sizeof *logits), SPMD_OK);
}

static void full_open(full_model *f, int batch)
{
    memset(f, 0, sizeof *f);
    f->batch = batch;
    f->g = spmd_graph_create(NULL);
    assert_non_null(f->g);
    if (spmd_gpt_build(f->g, &cfg, batch, &f->t) != SPMD_OK)
        fail_msg("build: %s", spmd_last_error());
    assert_int_equal(spmd_graph_mark_output(f->g, f->t.logits), SPMD_OK);
    f->p = compile(f->g, 2);
}

static void full_close(full_model *f)
{
    spmd_program_free(f->p);
    spmd_graph_free(f->g);
}

/* The forward pass over tokens [batch, seq]: logits [batch, seq, V]. */
static void full_forward(full_model *f, const int32_t *tokens, float *logits)
{
    size_t n = (size_t)f->batch * cfg.seq;
    int32_t *zeros = calloc(n, sizeof *zeros);
    assert_non_null(zeros);
    assert_int_equal(spmd_program_set_input(f->p, f->t.input, tokens, n * sizeof *tokens), SPMD_OK);
    assert_int_equal(spmd_program_set_input(f->p, f->t.targets, zeros, n * sizeof *zeros), SPMD_OK);
    free(zeros);
    if (spmd_program_run(f->p) != SPMD_OK) fail_msg("forward run: %s", spmd_last_error());
    assert_int_equal(spmd_program_read(f->p, f->t.logits, logits, n * cfg.vocab * sizeof *logits),
                     SPMD_OK);
}

static void expect_close(const char *what, int position, const float *want, const float *got,
                         size_t n)
{
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - (double)want[i]);
        if (!(err <= ATOL + RTOL * fabs((double)want[i])))
            fail_msg("%s, position %d, element %zu: got %.7g, want %.7g", what, position, i,
                     (double)got[i], (double)want[i]);
    }
}

static int argmax(const float *row, int n)
{
    int best = 0;
    for (int k = 1; k < n; k++)
        if (row[k] > row[best]) best = k;
    return best;
}

static int32_t *random_tokens(const char *label, size_t n)
{
    test_rng r = test_rng_for(SEED, label);
    int32_t *t = malloc(n * sizeof *t);
    assert_non_null(t);
    for (size_t i = 0; i < n; i++) t[i] = test_rng_int(&r, 0, cfg.vocab - 1);
    return t;
}

/* Column `position` of tokens [batch, seq]. */
static void column(const int32_t *tokens, int batch, int position, int32_t *out)
{
    for (int b = 0; b < batch; b++) out[b] = tokens[b * cfg.seq + position];
}

static void test_decode_matches_forward(void **state)
{
    (void)state;
    enum { B = 3 };
    const int T = cfg.seq, V = cfg.vocab;
    int32_t *tokens = random_tokens("tokens", (size_t)B * T);
    float *full = malloc((size_t)B * T * V * sizeof *full), step[B * VOCAB], want[B * VOCAB];
    int32_t col[B];
    assert_non_null(full);
    full_model f;
    full_open(&f, B);
    full_forward(&f, tokens, full);
    decoder d;
    decoder_open(&d, B, NULL, NULL, NULL, 2);
    for (int p = 0; p < T; p++) {
        column(tokens, B, p, col);
        decoder_step(&d, p, col, step);
        for (int b = 0; b < B; b++)
            memcpy(want + b * V, full + ((size_t)b * T + p) * V, V * sizeof *want);
        expect_close("decoding against the forward pass", p, want, step, (size_t)B * V);
    }
    decoder_close(&d);
    full_close(&f);
    free(full);
    free(tokens);
}

/* Greedy generation from a 3-token prompt to the context, once with the
 * cache and once rerunning the forward pass over each prefix (later
 * positions zero: causal attention ignores them). */
static void test_greedy_with_and_without_cache(void **state)
{
    (void)state;
    enum { B = 2, PROMPT = 3 };
    const int T = cfg.seq, V = cfg.vocab;
    int32_t *cached = random_tokens("prompt", (size_t)B * T);
    int32_t *plain = calloc((size_t)B * T, sizeof *plain);
    float *full = malloc((size_t)B * T * V * sizeof *full), step[B * VOCAB], want[B * VOCAB];
    int32_t col[B];
    assert_non_null(plain);
    assert_non_null(full);
    for (int b = 0; b < B; b++) memcpy(plain + b * T, cached + b * T, PROMPT * sizeof *plain);
    full_model f;
    full_open(&f, B);
    decoder d;
    decoder_open(&d, B, NULL, NULL, NULL, 1);
    for (int p = 0; p + 1 < T; p++) {
        column(cached, B, p, col);
        decoder_step(&d, p, col, step);
        full_forward(&f, plain, full);
        for (int b = 0; b < B; b++) {
            memcpy(want + b * V, full + ((size_t)b * T + p) * V, V * sizeof *want);
            if (p + 1 < PROMPT) continue;
            cached[b * T + p + 1] = argmax(step + b * V, V);
            plain[b * T + p + 1] = argmax(want + b * V, V);
        }
        expect_close("greedy decoding against the forward pass", p, want, step, (size_t)B * V);
    }
    for (int i = 0; i < B * T; i++)
        if (cached[i] != plain[i])
            fail_msg("row %d position %d: %d with the cache, %d without", i / T, i % T, cached[i],
                     plain[i]);
    decoder_close(&d);
    full_close(&f);
    free(full);
    free(plain);
    free(cached);
}

/* The step on `mesh` against one device, every position. */
static void check_mesh(const char *mesh, const char *axes, const char *fsdp, int batch,
                       const char *cache_sharding)
{
    const int T = cfg.seq, V = cfg.vocab;
    int32_t *tokens = random_tokens(mesh, (size_t)batch * T);
    int32_t *col = malloc((size_t)batch * sizeof *col);
    float *one = malloc((size_t)batch * V * sizeof *one);
    float *many = malloc((size_t)batch * V * sizeof *many);
    assert_true(col && one && many);
    decoder d1, dm;
    decoder_open(&d1, batch, NULL, NULL, NULL, 1);
    decoder_open(&dm, batch, mesh, axes, fsdp, 4);
    assert_int_equal(spmd_program_fallback_count(dm.p), 0);
    char s[128];
    spmd_get_sharding(spmd_graph_find(dm.g, "h.1.attn.v_cache"), s, sizeof s);
    if (strcmp(s, cache_sharding))
        fail_msg("mesh %s: the cache is laid out '%s', not '%s'", mesh, s, cache_sharding);
    char what[64];
    snprintf(what, sizeof what, "mesh %s against one device", mesh);
    for (int p = 0; p < T; p++) {
        column(tokens, batch, p, col);
        decoder_step(&d1, p, col, one);
        decoder_step(&dm, p, col, many);
        expect_close(what, p, one, many, (size_t)batch * V);
    }
    decoder_close(&d1);
    decoder_close(&dm);
    free(one);
    free(many);
    free(col);
    free(tokens);
}

static void test_decode_on_a_mesh(void **state)
{
    (void)state;
    check_mesh("2x2", "replica,fsdp", "fsdp", 4, "(replica, fsdp), None, None");
    check_mesh("3", "data", NULL, 4, "data, None, None");
}

static void test_same_bits(void **state)
{
    (void)state;
    enum { B = 2 };
    const int V = cfg.vocab;
    int32_t *tokens = random_tokens("bits", (size_t)B * cfg.seq);
    int32_t col[B];
    float a[B * VOCAB], b[B * VOCAB], again[B * VOCAB];
    decoder d1, d3;
    decoder_open(&d1, B, NULL, NULL, NULL, 1);
    decoder_open(&d3, B, NULL, NULL, NULL, 3);
    for (int p = 0; p < cfg.seq; p++) {
        column(tokens, B, p, col);
        decoder_step(&d1, p, col, a);
        decoder_step(&d3, p, col, b);
        if (memcmp(a, b, sizeof a)) fail_msg("position %d: 1 and 3 threads differ", p);
    }
    /* The same positions again overwrite the cache rows: the same bits. */
    for (int p = 0; p < cfg.seq; p++) {
        column(tokens, B, p, col);
        decoder_step(&d1, p, col, again);
    }
    assert_memory_equal(a, again, (size_t)B * V * sizeof *a);
    decoder_close(&d1);
    decoder_close(&d3);
    free(tokens);
}

static void test_refusals(void **state)
{
    (void)state;
    decoder d;
    decoder_open(&d, 1, NULL, NULL, NULL, 1);
    int32_t token = 0, pos = cfg.context;
    assert_int_equal(spmd_program_set_input(d.p, d.t.input, &token, sizeof token), SPMD_OK);
    assert_int_equal(spmd_program_set_input(d.p, d.t.position, &pos, sizeof pos), SPMD_OK);
    /* The position table has no row 12: the first op to read the
     * position fails, naming it. */
    assert_int_not_equal(spmd_program_run(d.p), SPMD_OK);
    if (!strstr(spmd_last_error(), " 12 "))
        fail_msg("the error \"%s\" does not name the position", spmd_last_error());
    decoder_close(&d);

    spmd_graph *g = spmd_graph_create(NULL);
    spmd_gpt_decode_tensors t;
    assert_int_equal(spmd_gpt_build_decode(g, &cfg, 0, &t), SPMD_ERR_INVALID);
    assert_non_null(strstr(spmd_last_error(), "batch (0)"));
    spmd_gpt_config bad = cfg;
    bad.heads = 3;
    assert_int_equal(spmd_gpt_build_decode(g, &bad, 1, &t), SPMD_ERR_INVALID);
    assert_null(t.logits);
    spmd_graph_free(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_matches_forward),
        cmocka_unit_test(test_greedy_with_and_without_cache),
        cmocka_unit_test(test_decode_on_a_mesh),
        cmocka_unit_test(test_same_bits),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
