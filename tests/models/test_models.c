/*
 * The model builders against an independent PyTorch implementation: loss,
 * outputs and every parameter gradient of the MLP, one GPT block and a tiny
 * GPT must match tests/vectors/<case>.bin (see make_vectors.py).  Also the GPT-2
 * small parameter count, config validation and the vector reader itself.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spmd/models.h"
#include "spmd/spmd.h"
#include "support_check.h"
#include "support_vectors.h"

/* float32 against float64 truth: make_vectors.py checks PyTorch's own
 * float32 run uses well under a tenth of this. */
#define ATOL 1e-4
#define RTOL 1e-3

static const tv_record *need(const tv_file *v, const char *name)
{
    const tv_record *r = tv_find(v, name);
    if (!r)
        fail_msg("vector record '%s' is missing", name);
    return r;
}

static const int32_t *config_of(const tv_file *v, int64_t n)
{
    const tv_record *r = need(v, "config");
    assert_int_equal(r->dtype, TV_I32);
    assert_int_equal(r->numel, n);
    return r->data;
}

/* The record and the tensor have the same dtype and shape. */
static void expect_shape(const tv_record *r, const spmd_tensor *t)
{
    assert_non_null(t);
    bool same = r->rank == spmd_tensor_rank(t) &&
                (r->dtype == TV_I32) == (spmd_tensor_dtype(t) == SPMD_I32);
    for (int i = 0; same && i < r->rank; i++)
        same = r->dims[i] == spmd_tensor_dim(t, i);
    if (!same)
        fail_msg("'%s': vector and graph tensor differ in dtype or shape", r->name);
}

static bool compare_read(spmd_program *p, const spmd_tensor *t, const tv_record *want)
{
    if (want->rank == 0) /* a scalar loss: accept [] or [1] */
        assert_int_equal(spmd_tensor_numel(t), 1);
    else
        expect_shape(want, t);
    float *got = malloc(want->bytes ? want->bytes : 1);
    assert_non_null(got);
    assert_int_equal(spmd_program_read(p, t, got, want->bytes), SPMD_OK);
    bool ok = test_close_enough(want->name, got, want->data, want->numel, ATOL, RTOL);
    free(got);
    return ok;
}

/* Append the backward pass, load parameters and inputs from the vectors,
 * run once and compare loss, `out` (record `out_name`) and every parameter
 * gradient. */
static void check_model(spmd_graph *g, const tv_file *v, spmd_tensor *const *inputs, int n_inputs,
                        spmd_tensor *out, const char *out_name, spmd_tensor *loss)
{
    assert_non_null(loss);
    assert_int_equal(spmd_grad(g, loss), SPMD_OK);
    assert_int_equal(spmd_graph_mark_output(g, loss), SPMD_OK);
    assert_int_equal(spmd_graph_mark_output(g, out), SPMD_OK);

    /* Every parameter the graph has must be in the vectors, and the other
     * way round (counted by the .grad records). */
    int n_tensors = spmd_graph_tensor_count(g), n_params = 0, n_grads = 0;
    for (int i = 0; i < n_tensors; i++) {
        spmd_tensor *t = spmd_graph_tensor(g, i);
        if (!spmd_tensor_is_param(t))
            continue;
        n_params++;
        assert_non_null(spmd_tensor_grad(t));
        assert_int_equal(spmd_graph_mark_output(g, spmd_tensor_grad(t)), SPMD_OK);
    }
    for (int i = 0; i < v->count; i++) {
        size_t len = strlen(v->records[i].name);
        n_grads += len > 5 && strcmp(v->records[i].name + len - 5, ".grad") == 0;
    }
    assert_int_equal(n_params, n_grads);

    spmd_compile_options opts = {.threads = 1, .seed = 1};
    spmd_program *p = spmd_compile(g, &opts);
    if (!p)
        fail_msg("compile: %s", spmd_last_error());

    for (int i = 0; i < n_tensors; i++) {
        spmd_tensor *t = spmd_graph_tensor(g, i);
        if (!spmd_tensor_is_param(t))
            continue;
        const tv_record *r = need(v, spmd_tensor_name(t));
        expect_shape(r, t);
        assert_int_equal(spmd_program_write(p, t, r->data, r->bytes), SPMD_OK);
    }
    for (int i = 0; i < n_inputs; i++) {
        const tv_record *r = need(v, spmd_tensor_name(inputs[i]));
        expect_shape(r, inputs[i]);
        assert_int_equal(spmd_program_set_input(p, inputs[i], r->data, r->bytes), SPMD_OK);
    }
    if (spmd_program_run(p) != SPMD_OK)
        fail_msg("run: %s", spmd_last_error());

    bool ok = compare_read(p, loss, need(v, "loss"));
    ok &= compare_read(p, out, need(v, out_name));
    for (int i = 0; i < n_tensors; i++) {
        spmd_tensor *t = spmd_graph_tensor(g, i);
        if (!spmd_tensor_is_param(t))
            continue;
        char name[256];
        snprintf(name, sizeof name, "%s.grad", spmd_tensor_name(t));
        ok &= compare_read(p, spmd_tensor_grad(t), need(v, name));
    }
    spmd_program_free(p);
    assert_true(ok);
}

/* ---- Against the PyTorch vectors ---------------------------------------- */

static void test_mlp_matches_torch(void **state)
{
    (void)state;
    tv_file v;
    tv_load_case("mlp", &v);
    const int32_t *c = config_of(&v, 4);
    spmd_mlp_config cfg = {.in_dim = c[0], .hidden = c[1], .layers = c[2], .out_dim = c[3]};
    int batch = (int)need(&v, "input")->dims[0];

    spmd_graph *g = spmd_graph_create(NULL);
    assert_non_null(g);
    spmd_mlp_tensors t;
    assert_int_equal(spmd_mlp_build(g, &cfg, NULL, batch, &t), SPMD_OK);
    assert_int_equal(spmd_mlp_add_loss(g, SPMD_MLP_MSE, &t), SPMD_OK);
    assert_string_equal(spmd_tensor_name(t.input), "input");
    assert_int_equal(spmd_graph_param_count(g), spmd_mlp_param_count(&cfg));

    spmd_tensor *inputs[] = {t.input, t.targets};
    check_model(g, &v, inputs, 2, t.output, "output", t.loss);
    spmd_graph_free(g);
    tv_free(&v);
}

static spmd_gpt_config gpt_config_of(const tv_file *v)
{
    const int32_t *c = config_of(v, 5);
    return (spmd_gpt_config){.vocab = c[0], .seq = c[1], .layers = c[2], .heads = c[3], .dim = c[4]};
}

static void test_gpt_block_matches_torch(void **state)
{
    (void)state;
    tv_file v;
    tv_load_case("gpt_block", &v);
    spmd_gpt_config cfg = gpt_config_of(&v);
    const tv_record *x_rec = need(&v, "input");

    spmd_graph *g = spmd_graph_create(NULL);
    assert_non_null(g);
    spmd_tensor *x = spmd_input(g, "input", SPMD_F32, x_rec->rank, x_rec->dims);
    spmd_tensor *targets = spmd_input(g, "targets", SPMD_F32, x_rec->rank, x_rec->dims);
    spmd_tensor *y = spmd_gpt_block(g, &cfg, 0, x); // [B, T, C]
    if (!y)
        fail_msg("gpt block: %s", spmd_last_error());
    spmd_tensor *loss = spmd_mse(g, y, targets);

    spmd_tensor *inputs[] = {x, targets};
    check_model(g, &v, inputs, 2, y, "output", loss);
    spmd_graph_free(g);
    tv_free(&v);
}

static void test_gpt_matches_torch(void **state)
{
    (void)state;
    tv_file v;
    tv_load_case("gpt", &v);
    spmd_gpt_config cfg = gpt_config_of(&v);
    int batch = (int)need(&v, "input")->dims[0];

    spmd_graph *g = spmd_graph_create(NULL);
    assert_non_null(g);
    spmd_gpt_tensors t;
    if (spmd_gpt_build(g, &cfg, batch, &t) != SPMD_OK)
        fail_msg("gpt build: %s", spmd_last_error());
    assert_int_equal(spmd_graph_param_count(g), spmd_gpt_param_count(&cfg));

    spmd_tensor *inputs[] = {t.input, t.targets};
    check_model(g, &v, inputs, 2, t.logits, "logits", t.loss);
    spmd_graph_free(g);
    tv_free(&v);
}

/* ---- Sizes and validation ---------------------------------------------- */

static void test_gpt2_small_param_count(void **state)
{
    (void)state;
    spmd_gpt_config gpt2 = {.vocab = 50257, .seq = 1024, .layers = 12, .heads = 12, .dim = 768};
    assert_int_equal(spmd_gpt_param_count(&gpt2), 124439808);

    /* The builder creates exactly what the formula counts (no compile, so
     * nothing the size of the model is allocated). */
    spmd_graph *g = spmd_graph_create(NULL);
    assert_non_null(g);
    spmd_gpt_tensors t;
    assert_int_equal(spmd_gpt_build(g, &gpt2, 1, &t), SPMD_OK);
    assert_int_equal(spmd_graph_param_count(g), 124439808);
    assert_int_equal(spmd_tensor_dim(t.logits, 2), 50257);
    spmd_graph_free(g);
}

static void expect_gpt_error(const spmd_gpt_config *cfg, int batch, const char *needle)
{
    spmd_graph *g = spmd_graph_create(NULL);
    assert_non_null(g);
    spmd_gpt_tensors t;
    spmd_clear_error();
    assert_int_not_equal(spmd_gpt_build(g, cfg, batch, &t), SPMD_OK);
    if (!strstr(spmd_last_error(), needle))
        fail_msg("error '%s' does not mention '%s'", spmd_last_error(), needle);
    assert_null(t.loss);
    /* Validation comes first, so a rejected config leaves the graph empty. */
    assert_int_equal(spmd_graph_tensor_count(g), 0);
    spmd_graph_free(g);
}

static void test_invalid_gpt_config(void **state)
{
    (void)state;
    const spmd_gpt_config ok = {.vocab = 37, .seq = 8, .layers = 2, .heads = 2, .dim = 16};
    spmd_gpt_config c;

    c = ok, c.heads = 3;
    expect_gpt_error(&c, 2, "heads");
    assert_int_equal(spmd_gpt_param_count(&c), -1);
    c = ok, c.vocab = 0;
    expect_gpt_error(&c, 2, "positive");
    c = ok, c.layers = -1;
    expect_gpt_error(&c, 2, "positive");
    c = ok, c.dim = 0;
    expect_gpt_error(&c, 2, "positive");
    expect_gpt_error(&ok, 0, "batch");
    expect_gpt_error(NULL, 2, "NULL");

    spmd_clear_error();
    assert_int_not_equal(spmd_gpt_build(NULL, &ok, 2, &(spmd_gpt_tensors){0}), SPMD_OK);
    assert_true(spmd_last_error()[0] != '\0');
    spmd_clear_error();
    assert_int_not_equal(spmd_gpt_validate(NULL), SPMD_OK);
    assert_true(spmd_last_error()[0] != '\0');

    /* The block builder: a layer outside the model, a wrong-width input. */
    spmd_graph *g = spmd_graph_create(NULL);
    assert_non_null(g);
    spmd_tensor *x = spmd_input(g, "x", SPMD_F32, 3, (const int64_t[]){2, 8, 16});
    spmd_clear_error();
    assert_null(spmd_gpt_block(g, &ok, 2, x));
    assert_non_null(strstr(spmd_last_error(), "layer"));
    spmd_tensor *narrow = spmd_input(g, "narrow", SPMD_F32, 3, (const int64_t[]){2, 8, 15});
    spmd_clear_error();
    assert_null(spmd_gpt_block(g, &ok, 0, narrow));
    assert_true(spmd_last_error()[0] != '\0');
    spmd_graph_free(g);
}

static void test_invalid_mlp_config(void **state)
{
    (void)state;
    const spmd_mlp_config ok = {.in_dim = 8, .hidden = 16, .layers = 2, .out_dim = 4};
    spmd_mlp_config bad[] = {ok, ok, ok, ok};
    bad[0].in_dim = 0;
    bad[1].out_dim = -3;
    bad[2].layers = -1;
    bad[3].hidden = 0;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        spmd_graph *g = spmd_graph_create(NULL);
        assert_non_null(g);
        spmd_mlp_tensors t;
        spmd_clear_error();
        assert_int_not_equal(spmd_mlp_build(g, &bad[i], NULL, 5, &t), SPMD_OK);
        assert_true(spmd_last_error()[0] != '\0');
        assert_int_equal(spmd_mlp_param_count(&bad[i]), -1);
        assert_int_equal(spmd_graph_tensor_count(g), 0);
        spmd_graph_free(g);
    }

    /* A caller's input of the wrong width is a shape error. */
    spmd_graph *g = spmd_graph_create(NULL);
    assert_non_null(g);
    spmd_tensor *x = spmd_input(g, "x", SPMD_F32, 2, (const int64_t[]){5, 7});
    spmd_mlp_tensors t;
    assert_int_equal(spmd_mlp_build(g, &ok, x, 0, &t), SPMD_ERR_SHAPE);
    /* No hidden layers: one Linear, in -> out. */
    spmd_mlp_config single = {.in_dim = 7, .hidden = 0, .layers = 0, .out_dim = 3};
    assert_int_equal(spmd_mlp_build(g, &single, x, 0, &t), SPMD_OK);
    assert_int_equal(spmd_tensor_dim(t.output, 1), 3);
    assert_int_equal(spmd_graph_param_count(g), spmd_mlp_param_count(&single));
    assert_int_equal(spmd_mlp_param_count(&single), 7 * 3 + 3);
    spmd_graph_free(g);
}

/* ---- The vector reader ------------------------------------------------- */

static void test_vector_reader_rejects_bad_files(void **state)
{
    (void)state;
    char path[1024], err[512];
    snprintf(path, sizeof path, "%s/mlp.bin", tv_dir());
    FILE *fp = fopen(path, "rb");
    if (!fp)
        fail_msg("%s: cannot open", path);
    static unsigned char buf[1 << 16];
    size_t size = fread(buf, 1, sizeof buf, fp);
    fclose(fp);
    assert_true(size > 12 && size < sizeof buf);

    tv_file f;
    assert_int_equal(tv_parse(buf, size, &f, err, sizeof err), 0);
    const tv_record *w = tv_find(&f, "fc.0.weight");
    assert_non_null(w);
    assert_int_equal(w->rank, 2);
    assert_null(tv_find(&f, "no.such.record"));
    tv_free(&f);

    /* Every proper prefix is a clean error, never a crash. */
    for (size_t n = 0; n < size; n++) {
        err[0] = '\0';
        assert_int_equal(tv_parse(buf, n, &f, err, sizeof err), -1);
        assert_true(err[0] != '\0');
    }
    assert_int_equal(tv_parse(buf, size - 1, &f, err, sizeof err), -1);
    assert_non_null(strstr(err, "truncated"));

    buf[size] = 0; /* one trailing byte */
    assert_int_equal(tv_parse(buf, size + 1, &f, err, sizeof err), -1);
    assert_non_null(strstr(err, "trailing"));

    buf[0] = 'X';
    assert_int_equal(tv_parse(buf, size, &f, err, sizeof err), -1);
    assert_non_null(strstr(err, "magic"));

    assert_int_equal(tv_load("/nonexistent/vectors.bin", &f, err, sizeof err), -1);
    assert_non_null(strstr(err, "/nonexistent/vectors.bin"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vector_reader_rejects_bad_files),
        cmocka_unit_test(test_gpt2_small_param_count),
        cmocka_unit_test(test_invalid_gpt_config),
        cmocka_unit_test(test_invalid_mlp_config),
        cmocka_unit_test(test_mlp_matches_torch),
        cmocka_unit_test(test_gpt_block_matches_torch),
        cmocka_unit_test(test_gpt_matches_torch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
