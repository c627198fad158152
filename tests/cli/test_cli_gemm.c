/*
 * `spmd train --blas` and the GEMM backends end to end: the default runs
 * f32 on the CBLAS library; `--blas onednn` trains a GPT on oneDNN's matmul
 * to the default's losses within f32 rounding, with the same bits on 1 and
 * 2 threads (or is refused with the reason where there is no oneDNN); `--blas measure` prints its choice as
 * a --blas value, and that value gives the measured run's bits again; a
 * spec with an unknown key or a backend of the wrong precision is refused
 * before the first step, naming what is wrong; `--precision bf16` (the
 * activations kept in bf16 as well as the matmuls' operands) trains on the
 * default mesh, following the f32 run within bf16's rounding.
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

#include "runtime/onednn.h"
#include "support_files.h"
#include "support_tool.h"

#ifndef SPMD_TOOL_PATH
#error "SPMD_TOOL_PATH must name the spmd binary"
#endif

#define GPT "train --model gpt --mesh 2 --axes data --steps 6 --eval 0"

static char out[1 << 16];

enum { STEPS = 6 };

/* The losses of a run's log, every step; the log's text in *text. */
static void read_losses(const char *log, double *loss, char **text)
{
    size_t len;
    *text = support_read_file(log, &len);
    assert_non_null(*text);
    const char *p = *text;
    for (int i = 0; i < STEPS; i++) {
        p = strstr(p, "\"loss\":");
        assert_non_null(p);
        loss[i] = strtod(p + 7, NULL);
        p += 7;
    }
}

/* The "loss" fields only, in order, as printed (the exact decimals). */
static void loss_fields(const char *text, char *buf, size_t size)
{
    buf[0] = 0;
    for (const char *p = text; (p = strstr(p, "\"loss\":")); p += 7) {
        size_t n = strcspn(p, ",}");
        size_t len = strlen(buf);
        snprintf(buf + len, size - len, "%.*s;", (int)n, p);
    }
}

/* The logs `a` and `b` in dir hold the same losses, bit for bit (as
 * printed: every digit the log writes). */
static void assert_same_losses(const char *dir, const char *a, const char *b)
{
    char pa[SUPPORT_PATH], pb[SUPPORT_PATH];
    double la[STEPS], lb[STEPS];
    char *ta, *tb;
    read_losses(support_path_in(pa, dir, a), la, &ta);
    read_losses(support_path_in(pb, dir, b), lb, &tb);
    static char fa[4096], fb[4096];
    loss_fields(ta, fa, sizeof fa);
    loss_fields(tb, fb, sizeof fb);
    assert_string_equal(fa, fb);
    free(ta);
    free(tb);
}

static void train_on(const char *dir, const char *name, const char *blas, int threads)
{
    char log[SUPPORT_PATH];
    support_path_in(log, dir, name);
    int rc = run_toolf(out, sizeof out, GPT " --threads %d --log %s --blas '%s'", threads, log,
                       blas);
    if (rc != 0) fail_msg("spmd " GPT " --blas %s: exit %d:\n%s", blas, rc, out);
}

static void train(const char *dir, const char *name, const char *blas)
{
    train_on(dir, name, blas, 2);
}

static void test_onednn_trains_like_cblas(void **state)
{
    (void)state;
    char *dir = support_temp_dir("spmd-cli-gemm");
    if (!onednn_available()) {
        int rc = run_toolf(out, sizeof out, GPT " --threads 2 --blas onednn");
        assert_int_not_equal(rc, 0);
        assert_non_null(strstr(out, onednn_why_not()));
        assert_null(strstr(out, "step    1/"));
        print_message("note: no oneDNN here (%s): refused, as it should be\n", onednn_why_not());
        support_drop_dir(dir);
        return;
    }
    double base[STEPS], dnnl[STEPS];
    char *base_text, *dnnl_text;
    train(dir, "cblas.jsonl", "auto");
    assert_null(strstr(out, "oneDNN"));
    read_losses(support_path_in((char[SUPPORT_PATH]){0}, dir, "cblas.jsonl"), base, &base_text);
    train(dir, "onednn.jsonl", "onednn");
    assert_non_null(strstr(out, "oneDNN"));
    read_losses(support_path_in((char[SUPPORT_PATH]){0}, dir, "onednn.jsonl"), dnnl, &dnnl_text);
    /* Other kernels, other rounding: the same losses to f32 accuracy over
     * a few steps of training, never the same trajectory by accident. */
    for (int i = 0; i < STEPS; i++)
        if (fabs(base[i] - dnnl[i]) > 1e-4 * fabs(base[i]))
            fail_msg("step %d: loss %.9g on the CBLAS library, %.9g on oneDNN", i + 1, base[i],
                     dnnl[i]);
    /* Every tile is one oneDNN call whatever the thread count: the same
     * bits on one thread. */
    train_on(dir, "onednn1.jsonl", "onednn", 1);
    assert_same_losses(dir, "onednn.jsonl", "onednn1.jsonl");
    free(base_text);
    free(dnnl_text);
    support_drop_dir(dir);
}

static void test_measured_choice_repeats(void **state)
{
    (void)state;
    char *dir = support_temp_dir("spmd-cli-gemm");
    train(dir, "measured.jsonl", "measure");
    const char *line = strstr(out, "GEMM backends measured: --blas '");
    if (!line) fail_msg("no measured choice printed:\n%s", out);
    char spec[1024];
    line += strlen("GEMM backends measured: --blas '");
    size_t n = strcspn(line, "'");
    assert_true(n < sizeof spec);
    snprintf(spec, sizeof spec, "%.*s", (int)n, line);
    assert_non_null(strstr(spec, "f32-nn-small="));
    assert_non_null(strstr(spec, "bf16-tt-large="));
    train(dir, "repeated.jsonl", spec);
    assert_null(strstr(out, "GEMM backends measured"));
    assert_same_losses(dir, "measured.jsonl", "repeated.jsonl");
    support_drop_dir(dir);
}

static void expect_refused(const char *blas, const char *why)
{
    int rc = run_toolf(out, sizeof out, GPT " --threads 2 --blas '%s'", blas);
    if (rc == 0) fail_msg("--blas %s accepted:\n%s", blas, out);
    if (!strstr(out, why)) fail_msg("--blas %s: no \"%s\" in:\n%s", blas, why, out);
    assert_null(strstr(out, "step    1/"));
}

static void test_bad_specs_refused(void **state)
{
    (void)state;
    expect_refused("auto:f32=fast", "an unknown backend");
    expect_refused("auto:bf16=cblas", "bf16 runs on onednn or convert");
    expect_refused("openblas:f32-nx-small=onednn", "an unknown shape class");
    expect_refused("auto:fp8=onednn", "not f32 or bf16");
    expect_refused("auto:f32", "unknown library 'auto:f32'");
    expect_refused("mkl", "unknown library 'mkl'");
}

/* The default mesh (4x2, FSDP), bf16 against fp32: the same run within
 * bf16's rounding (test_precision's 1e-2), and says how it multiplies. */
static void test_bf16_on_default_mesh(void **state)
{
    (void)state;
    char *dir = support_temp_dir("spmd-cli-bf16");
    char f32[SUPPORT_PATH], bf16[SUPPORT_PATH];
    support_path_in(f32, dir, "f32.jsonl");
    support_path_in(bf16, dir, "bf16.jsonl");
#define RUN "train --steps 6 --eval 0 --threads 2 --log %s --precision %s"
    int rc = run_toolf(out, sizeof out, RUN, f32, "fp32");
    if (rc != 0) fail_msg("spmd train --precision fp32: exit %d:\n%s", rc, out);
    rc = run_toolf(out, sizeof out, RUN, bf16, "bf16");
#undef RUN
    if (rc != 0) fail_msg("spmd train --precision bf16: exit %d:\n%s", rc, out);
    assert_non_null(strstr(out, "bf16 matmuls: "));
    double a[STEPS], b[STEPS];
    char *ta, *tb;
    read_losses(f32, a, &ta);
    read_losses(bf16, b, &tb);
    double worst = 0;
    for (int i = 0; i < STEPS; i++) worst = fmax(worst, fabs(b[i] - a[i]) / fabs(a[i]));
    if (!(worst > 0 && worst < 1e-2)) fail_msg("bf16 losses %.3g relative from fp32's", worst);
    free(ta);
    free(tb);
    support_drop_dir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_onednn_trains_like_cblas),
        cmocka_unit_test(test_measured_choice_repeats),
        cmocka_unit_test(test_bad_specs_refused),
        cmocka_unit_test(test_bf16_on_default_mesh),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
