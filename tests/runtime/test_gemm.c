/*
 * The GEMM backends (src/runtime/gemm.c): the bf16 conversion helpers on
 * known values; oneDNN's f32 matmul against the CBLAS library within
 * rounding; the bf16 GEMM, on oneDNN and converted, within bf16 tolerance
 * of an f64 reference; transposes, odd shapes, leading dimensions past the
 * minimum, alpha and beta, bf16 and f32 operands and results.  Without
 * oneDNN (a build without its headers, or no libdnnl here) the oneDNN
 * checks say so and skip, and the converting path still runs; CTest's
 * test_gemm_avx2 runs it all again with oneDNN held to AVX2, a CPU
 * without native bf16.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <dirent.h>
#include <dlfcn.h>

#include "base/bf16.h"
#include "runtime/blas.h"
#include "runtime/gemm.h"
#include "runtime/onednn.h"

/* ---- Conversion helpers --------------------------------------------------- */

static float f_of(uint32_t bits) { return bf16_bits_f32(bits); }

static void test_bf16_known_values(void **state)
{
    (void)state;
    static const struct { uint32_t f32; bf16_bits want; } cases[] = {
        {0x3f800000u, 0x3f80}, /* 1.0 */
        {0x80000000u, 0x8000}, /* -0.0 */
        {0x3f808000u, 0x3f80}, /* 1 + 2^-8: a tie, to the even 1.0 */
        {0x3f818000u, 0x3f82}, /* a tie above an odd mantissa: up to even */
        {0x3f808001u, 0x3f81}, /* just past the tie: up */
        {0x3f807fffu, 0x3f80}, /* just below it: down */
        {0xbf818000u, 0xbf82}, /* negative ties likewise */
        {0x40490fdbu, 0x4049}, /* pi */
        {0x7f800000u, 0x7f80}, /* +inf */
        {0xff800000u, 0xff80}, /* -inf */
        {0x7f7fffffu, 0x7f80}, /* the largest f32 rounds past the largest bf16: inf */
        {0x7f7f7fffu, 0x7f7f}, /* the largest bf16, from just below the tie */
        {0x7fc00000u, 0x7fc0}, /* the quiet NaN */
        {0xffc00000u, 0xffc0}, /* negative NaN keeps its sign */
        {0x7f800001u, 0x7fc0}, /* a NaN whose payload is in the low bits: still NaN, quiet */
        {0x7fffffffu, 0x7fff}, /* never rounds into the next exponent (would be -0 / inf) */
        {0x00000001u, 0x0000}, /* the smallest f32 subnormal: to zero */
        {0x00008000u, 0x0000}, /* a subnormal tie to even zero */
        {0x00018000u, 0x0002}, /* a subnormal tie to even two */
        {0x00008001u, 0x0001}, /* past the tie: the smallest bf16 subnormal */
        {0x007fffffu, 0x0080}, /* the largest subnormal rounds up to the smallest normal */
        {0x80010000u, 0x8001}, /* a negative bf16 subnormal, exact */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bf16_bits got = bf16_from_f32(f_of(cases[i].f32));
        if (got != cases[i].want)
            fail_msg("bf16_from_f32(0x%08x) = 0x%04x, want 0x%04x", cases[i].f32, got,
                     cases[i].want);
        bf16_bits arr;
        float in = f_of(cases[i].f32);
        bf16_from_f32_n(&arr, &in, 1);
        assert_int_equal(arr, cases[i].want);
    }
    /* bf16 -> f32 is exact: every finite bf16 round-trips through f32. */
    for (uint32_t h = 0; h < 0x10000u; h++) {
        float f = bf16_to_f32((bf16_bits)h);
        assert_int_equal(bf16_f32_bits(f), h << 16);
        if (!isnan(f)) assert_int_equal(bf16_from_f32(f), h);
        else assert_true(isnan(bf16_to_f32(bf16_from_f32(f))));
    }
    assert_true(bf16_round(1.00390625f) == 1.0f); /* the 1 + 2^-8 tie */
    assert_true(bf16_round(-3.0f) == -3.0f);
}

/* The array form rounds as the scalar form does, on many bit patterns. */
static void test_bf16_array_matches_scalar(void **state)
{
    (void)state;
    enum { N = 1 << 16 };
    float *in = malloc(N * sizeof *in);
    bf16_bits *out = malloc(N * sizeof *out);
    assert_non_null(in);
    assert_non_null(out);
    uint32_t seed = 7;
    for (int i = 0; i < N; i++) {
        seed = seed * 1664525u + 1013904223u;
        uint32_t bits = seed;
        if (i % 4 == 1) bits = (bits & 0xffff0000u) | 0x8000u; /* exact ties */
        if (i % 16 == 3) bits |= 0x7f800000u;                  /* inf and NaN */
        in[i] = f_of(bits);
    }
    bf16_from_f32_n(out, in, N);
    for (int i = 0; i < N; i++) assert_int_equal(out[i], bf16_from_f32(in[i]));
    free(in);
    free(out);
}

/* ---- Products --------------------------------------------------------------- */

typedef struct shape {
    int m, n, k;
} shape;

static const shape shapes[] = {{1, 1, 1}, {7, 13, 5}, {37, 61, 129}, {64, 48, 768}, {130, 3, 17},
                               {3, 200, 64}};

static float rand_unit(uint32_t *seed)
{
    *seed = *seed * 1664525u + 1013904223u;
    return (float)(*seed >> 8) / 16777216.0f - 0.5f;
}

/* Stored matrix for op(X) of rows x cols, with a leading dimension `pad`
 * past the minimum; returns the leading dimension. */
static int64_t stored_dims(bool t, int rows, int cols, int pad, int64_t *stored_rows)
{
    *stored_rows = t ? cols : rows;
    return (t ? rows : cols) + pad;
}

static double op_at(const float *x, bool t, int64_t ld, int i, int j)
{
    return t ? x[(int64_t)j * ld + i] : x[(int64_t)i * ld + j];
}

typedef struct problem {
    bool ta, tb;
    int m, n, k;
    int64_t lda, ldb, ldc;
    float *a, *b, *c0; /* f32 operands and the starting C */
    size_t na, nb, nc;
} problem;

/* Operands stored with padding past their rows (a tile of a larger
 * matrix, as the matmul kernel passes them), or dense. */
static problem problem_make(bool ta, bool tb, shape s, uint32_t seed, bool dense)
{
    problem p = {.ta = ta, .tb = tb, .m = s.m, .n = s.n, .k = s.k};
    int64_t ra, rb;
    p.lda = stored_dims(ta, s.m, s.k, dense ? 0 : 3, &ra);
    p.ldb = stored_dims(tb, s.k, s.n, dense ? 0 : 5, &rb);
    p.ldc = s.n + (dense ? 0 : 2);
    p.na = (size_t)(ra * p.lda), p.nb = (size_t)(rb * p.ldb), p.nc = (size_t)(s.m * p.ldc);
    p.a = malloc(p.na * sizeof(float));
    p.b = malloc(p.nb * sizeof(float));
    p.c0 = malloc(p.nc * sizeof(float));
    assert_non_null(p.a);
    assert_non_null(p.b);
    assert_non_null(p.c0);
    for (size_t i = 0; i < p.na; i++) p.a[i] = rand_unit(&seed);
    for (size_t i = 0; i < p.nb; i++) p.b[i] = rand_unit(&seed);
    for (size_t i = 0; i < p.nc; i++) p.c0[i] = rand_unit(&seed);
    return p;
}

static void problem_free(problem *p) { free(p->a), free(p->b), free(p->c0); }

/* The f64 reference of alpha op(A) op(B) + beta C0 at (i, j), with each
 * operand passed through `round` first (identity for f32), and the sum of
 * |terms| that bounds its rounding error. */
static double reference(const problem *p, float alpha, float beta, int i, int j,
                        bool bf16_inputs, double *abs_sum)
{
    double sum = 0, mag = 0;
    for (int l = 0; l < p->k; l++) {
        double x = op_at(p->a, p->ta, p->lda, i, l), y = op_at(p->b, p->tb, p->ldb, l, j);
        if (bf16_inputs) x = bf16_round((float)x), y = bf16_round((float)y);
        sum += x * y;
        mag += fabs(x * y);
    }
    double c = p->c0[(int64_t)i * p->ldc + j];
    *abs_sum = fabs(alpha) * mag + fabs(beta * c);
    return alpha * sum + beta * c;
}

static const float alphas[] = {1.0f, 0.5f, 2.0f}, betas[] = {0.0f, 1.0f, -0.5f};

static void test_onednn_f32_matches_cblas(void **state)
{
    (void)state;
    if (!onednn_available()) {
        print_message("note: no oneDNN here (%s): skipped\n", onednn_why_not());
        skip();
    }
    print_message("%s against %s\n", onednn_name(), blas_name());
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int t = 0; t < 4; t++)
            for (int v = 0; v < 6; v++) {
                /* Padded (packed dense for oneDNN, gemm.c) and dense. */
                problem p = problem_make(t & 2, t & 1, shapes[si], (uint32_t)(si * 31 + t), v >= 3);
                float *c_blas = malloc(p.nc * sizeof(float)), *c_dnnl = malloc(p.nc * sizeof(float));
                assert_non_null(c_blas);
                assert_non_null(c_dnnl);
                memcpy(c_blas, p.c0, p.nc * sizeof(float));
                memcpy(c_dnnl, p.c0, p.nc * sizeof(float));
                float alpha = alphas[v % 3], beta = betas[v % 3];
                assert_int_equal(gemm_f32_on(GEMM_CBLAS, p.ta, p.tb, p.m, p.n, p.k, alpha, p.a,
                                             p.lda, p.b, p.ldb, beta, c_blas, p.ldc),
                                 SPMD_OK);
                assert_int_equal(gemm_f32_on(GEMM_ONEDNN, p.ta, p.tb, p.m, p.n, p.k, alpha, p.a,
                                             p.lda, p.b, p.ldb, beta, c_dnnl, p.ldc),
                                 SPMD_OK);
                for (int i = 0; i < p.m; i++) {
                    for (int j = 0; j < p.n; j++) {
                        double mag;
                        double want = reference(&p, alpha, beta, i, j, false, &mag);
                        double tol = 2.0 * (p.k + 2) * 0x1p-24 * mag + 1e-30;
                        int64_t at = (int64_t)i * p.ldc + j;
                        if (fabs(c_dnnl[at] - want) > tol || fabs(c_blas[at] - want) > tol ||
                            fabs(c_dnnl[at] - c_blas[at]) > tol)
                            fail_msg("%dx%dx%d %c%c alpha %g beta %g at (%d,%d): oneDNN %.9g, "
                                     "CBLAS %.9g, f64 %.9g",
                                     p.m, p.n, p.k, p.ta ? 'T' : 'N', p.tb ? 'T' : 'N',
                                     (double)alpha, (double)beta, i, j,
                                     (double)c_dnnl[at], (double)c_blas[at], want);
                    }
                    /* The padding past n is untouched. */
                    for (int64_t j = p.n; j < p.ldc && i + 1 < p.m; j++)
                        assert_true(c_dnnl[(int64_t)i * p.ldc + j] == p.c0[(int64_t)i * p.ldc + j]);
                }
                free(c_blas), free(c_dnnl);
                problem_free(&p);
            }
}

/* bf16 GEMM on `backend`: every operand and result type, dense and
 * padded (oneDNN's fast kernels take only dense matrices: the padded are
 * packed first, gemm.c), against f64; a padded C's padding untouched. */
static void check_bf16_backend(gemm_backend backend)
{
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int t = 0; t < 4; t++)
            for (int types = 0; types < 16; types++) {
                bool dense = types & 8;
                gemm_type at = types & 1 ? GEMM_BF16 : GEMM_F32;
                gemm_type bt = types & 2 ? GEMM_BF16 : GEMM_F32;
                gemm_type ct = types & 4 ? GEMM_BF16 : GEMM_F32;
                int v = (int)((si + (size_t)t + (size_t)types) % 3);
                problem p = problem_make(t & 2, t & 1, shapes[si], (uint32_t)(si * 17 + t), dense);
                /* Starting C as bf16 numbers, so a bf16 C holds it exactly. */
                for (size_t i = 0; i < p.nc; i++) p.c0[i] = bf16_round(p.c0[i]);
                bf16_bits *ha = malloc(p.na * sizeof(bf16_bits)), *hb = malloc(p.nb * sizeof(bf16_bits));
                void *c = malloc(p.nc * sizeof(float));
                assert_non_null(ha);
                assert_non_null(hb);
                assert_non_null(c);
                bf16_from_f32_n(ha, p.a, p.na);
                bf16_from_f32_n(hb, p.b, p.nb);
                if (ct == GEMM_F32) memcpy(c, p.c0, p.nc * sizeof(float));
                else bf16_from_f32_n(c, p.c0, p.nc);
                spmd_status st = gemm_bf16_on(backend, p.ta, p.tb, p.m, p.n, p.k, alphas[v],
                                              at == GEMM_F32 ? (void *)p.a : ha, at, p.lda,
                                              bt == GEMM_F32 ? (void *)p.b : hb, bt, p.ldb,
                                              betas[v], c, ct, p.ldc);
                if (st != SPMD_OK) fail_msg("gemm_bf16_on: %s", spmd_last_error());
                for (int i = 0; i < p.m; i++)
                    for (int j = 0; j < p.n; j++) {
                        double mag;
                        /* The products of the rounded inputs are exact in f32, so only f32
                         * accumulation (and a bf16 result's rounding) separate the two. */
                        double want = reference(&p, alphas[v], betas[v], i, j, true, &mag);
                        int64_t at_ = (int64_t)i * p.ldc + j;
                        double got = ct == GEMM_F32 ? ((float *)c)[at_]
                                                    : bf16_to_f32(((bf16_bits *)c)[at_]);
                        double tol = 2.0 * (p.k + 2) * 0x1p-24 * mag +
                                     (ct == GEMM_BF16 ? 0x1p-8 * (fabs(want) + 0x1p-24 * mag) : 0) +
                                     1e-30;
                        /* Against the unrounded inputs: bf16's own tolerance. */
                        double mag_f32;
                        double want_f32 = reference(&p, alphas[v], betas[v], i, j, false, &mag_f32);
                        double tol_f32 = 2.0 * 0x1p-8 * mag_f32 + tol;
                        if (fabs(got - want) > tol || fabs(got - want_f32) > tol_f32)
                            fail_msg("%s %dx%dx%d %c%c types %d alpha %g beta %g at (%d,%d): got "
                                     "%.9g, f64 of bf16 inputs %.9g (tol %.3g), of f32 inputs "
                                     "%.9g",
                                     backend == GEMM_ONEDNN ? "oneDNN" : "converted", p.m, p.n,
                                     p.k, p.ta ? 'T' : 'N', p.tb ? 'T' : 'N', types,
                                     (double)alphas[v], (double)betas[v], i, j, got, want, tol,
                                     want_f32);
                    }
                for (int i = 0; i + 1 < p.m; i++)
                    for (int64_t j = p.n; j < p.ldc; j++) {
                        int64_t at_ = (int64_t)i * p.ldc + j;
                        double got = ct == GEMM_F32 ? ((float *)c)[at_]
                                                    : bf16_to_f32(((bf16_bits *)c)[at_]);
                        if (got != p.c0[at_])
                            fail_msg("%s %dx%dx%d types %d: C's padding at (%d,%lld) written",
                                     backend == GEMM_ONEDNN ? "oneDNN" : "converted", p.m, p.n,
                                     p.k, types, i, (long long)j);
                    }
                free(ha), free(hb), free(c);
                problem_free(&p);
            }
}

static void test_bf16_converted(void **state)
{
    (void)state;
    check_bf16_backend(GEMM_CONVERT);
}

static void test_bf16_onednn(void **state)
{
    (void)state;
    if (!onednn_available()) {
        print_message("note: no oneDNN here (%s): skipped\n", onednn_why_not());
        skip();
    }
    print_message("%s, native bf16: %s\n", onednn_name(), onednn_bf16_native() ? "yes" : "no");
    check_bf16_backend(GEMM_ONEDNN);
}

/* The default: f32 on the CBLAS library; bf16 on oneDNN exactly where it
 * computes bf16 natively, and the description says which and why. */
static void test_defaults_described(void **state)
{
    (void)state;
    assert_int_equal(blas_init(BLAS_AUTO, NULL), SPMD_OK);
    for (int c = 0; c < GEMM_CLASSES; c++) assert_int_equal(gemm_backend_of(GEMM_F32, c), GEMM_CBLAS);
    assert_string_equal(gemm_describe_f32(), blas_name());
    /* test_gemm_avx2 runs this with oneDNN held to AVX2. */
    if (getenv("SPMD_TEST_NO_NATIVE_BF16")) assert_false(onednn_bf16_native());
    gemm_backend want = onednn_bf16_native() ? GEMM_ONEDNN : GEMM_CONVERT;
    for (int c = 0; c < GEMM_CLASSES; c++) assert_int_equal(gemm_backend_of(GEMM_BF16, c), want);
    const char *bf16 = gemm_describe_bf16();
    print_message("bf16 GEMMs: %s\n", bf16);
    if (want == GEMM_ONEDNN) {
        assert_non_null(strstr(bf16, onednn_name()));
        assert_null(strstr(bf16, "slow"));
    } else {
        assert_non_null(strstr(bf16, "converted to f32"));
        assert_non_null(strstr(bf16, "slow"));
        assert_non_null(strstr(bf16, onednn_available() ? "native bf16" : onednn_why_not()));
    }
    /* A product of each class goes where its class says. */
    assert_int_equal(gemm_class_of(false, false, 64, 48, 768), 0);
    assert_int_equal(gemm_class_of(false, true, 128, 192, 768), 3);
    assert_int_equal(gemm_class_of(true, false, 1, 1, 1), 4);
    assert_string_equal(gemm_class_name(7), "tt-large");
    /* The choice as a string: every class named, on the library loaded. */
    const char *spec = gemm_choice_spec();
    assert_non_null(strstr(spec, blas_library_key()));
    assert_non_null(strstr(spec, "f32-nn-small=cblas"));
    assert_non_null(strstr(spec, want == GEMM_ONEDNN ? "bf16-tt-large=onednn" : "bf16-tt-large=convert"));
}

/* A product with k = 0 is beta C on every backend, and m or n = 0 is
 * nothing at all. */
static void test_empty_products(void **state)
{
    (void)state;
    float c[4] = {1, 2, 3, 4}, a = 5, b = 6;
    assert_int_equal(gemm_f32_on(GEMM_ONEDNN, false, false, 2, 2, 0, 1.0f, &a, 1, &b, 2, 0.5f, c, 2),
                     SPMD_OK);
    assert_true(c[0] == 0.5f && c[3] == 2.0f);
    bf16_bits hc[4];
    bf16_from_f32_n(hc, c, 4);
    assert_int_equal(gemm_bf16_on(GEMM_ONEDNN, false, false, 2, 2, 0, 1.0f, &a, GEMM_F32, 1, &b,
                                  GEMM_F32, 2, 2.0f, hc, GEMM_BF16, 2),
                     SPMD_OK);
    assert_true(bf16_to_f32(hc[0]) == 1.0f && bf16_to_f32(hc[3]) == 4.0f);
    assert_int_equal(gemm_bf16_on(GEMM_CONVERT, false, false, 0, 2, 3, 1.0f, &a, GEMM_F32, 3, &b,
                                  GEMM_F32, 2, 0.0f, c, GEMM_F32, 2),
                     SPMD_OK);
    assert_int_equal(gemm_bf16_on(GEMM_CBLAS, false, false, 1, 1, 1, 1.0f, &a, GEMM_F32, 1, &b,
                                  GEMM_F32, 1, 0.0f, c, GEMM_F32, 1),
                     SPMD_ERR_INVALID);
}

static int threads_in_process(void)
{
    DIR *d = opendir("/proc/self/task");
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* oneDNN runs on the calling thread: its OpenMP runtime starts no team,
 * so the executor's workers are never oversubscribed; and the calling
 * thread's own OpenMP setting is as it was afterwards. */
static void test_onednn_starts_no_threads(void **state)
{
    (void)state;
    if (!onednn_available()) skip();
    int before = threads_in_process();
    if (before < 0) skip(); /* no /proc */
    /* Debian's oneDNN brings GNU OpenMP: ask it for a team of 3 here. */
    void *gomp = dlopen("libgomp.so.1", RTLD_NOW | RTLD_NOLOAD);
    void (*set_threads)(int) = gomp ? (void (*)(int))dlsym(gomp, "omp_set_num_threads") : NULL;
    int (*max_threads)(void) = gomp ? (int (*)(void))dlsym(gomp, "omp_get_max_threads") : NULL;
    if (set_threads && max_threads) set_threads(3);
    enum { M = 512, N = 512, K = 512 };
    float *a = calloc(M * K, sizeof *a), *b = calloc(K * N, sizeof *b), *c = calloc(M * N, sizeof *c);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    assert_int_equal(gemm_f32_on(GEMM_ONEDNN, false, false, M, N, K, 1.0f, a, K, b, N, 0.0f, c, N),
                     SPMD_OK);
    assert_int_equal(gemm_bf16_on(GEMM_ONEDNN, false, true, M, N, K, 1.0f, a, GEMM_F32, K, b,
                                  GEMM_F32, K, 0.0f, c, GEMM_F32, N),
                     SPMD_OK);
    assert_int_equal(threads_in_process(), before);
    if (set_threads && max_threads) assert_int_equal(max_threads(), 3);
    else print_message("note: no GNU OpenMP in this oneDNN: its setting not checked\n");
    if (gomp) dlclose(gomp);
    free(a), free(b), free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        /* First: before any oneDNN call could have started a team. */
        cmocka_unit_test(test_onednn_starts_no_threads),
        cmocka_unit_test(test_bf16_known_values),
        cmocka_unit_test(test_bf16_array_matches_scalar),
        cmocka_unit_test(test_defaults_described),
        cmocka_unit_test(test_onednn_f32_matches_cblas),
        cmocka_unit_test(test_bf16_converted),
        cmocka_unit_test(test_bf16_onednn),
        cmocka_unit_test(test_empty_products),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
