/*
 * The GEMM backend choice (see gemm.h): per shape class and precision,
 * the CBLAS library or oneDNN, set by a spec string or by measuring; and
 * the bf16 GEMM with its converting fallback.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "runtime/gemm.h"

#include "base/bf16.h"
#include "base/error.h"
#include "runtime/blas.h"
#include "runtime/onednn.h"

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- Classes ------------------------------------------------------------ */

int gemm_class_of(bool ta, bool tb, int64_t m, int64_t n, int64_t k)
{
    /* m*n*k can pass int64 for absurd sizes: compare in double. */
    bool large = (double)m * (double)n * (double)k >= (double)GEMM_LARGE_MNK;
    return ((ta ? 2 : 0) + (tb ? 1 : 0)) * 2 + (large ? 1 : 0);
}

const char *gemm_class_name(int cls)
{
    static const char *const names[GEMM_CLASSES] = {"nn-small", "nn-large", "nt-small",
                                                    "nt-large", "tn-small", "tn-large",
                                                    "tt-small", "tt-large"};
    return cls >= 0 && cls < GEMM_CLASSES ? names[cls] : "?";
}

void gemm_class_shape(int cls, bool *ta, bool *tb, int64_t *m, int64_t *n, int64_t *k)
{
    *ta = (cls / 2) >= 2;
    *tb = (cls / 2) % 2 == 1;
    bool large = cls % 2 == 1;
    *m = large ? 128 : 64;
    *n = large ? 192 : 48;
    *k = 768;
}

static const char *backend_name(gemm_backend b)
{
    return b == GEMM_ONEDNN ? "onednn" : b == GEMM_CONVERT ? "convert" : "cblas";
}

static bool backend_fits(gemm_type precision, gemm_backend backend)
{
    if (precision == GEMM_F32) return backend == GEMM_CBLAS || backend == GEMM_ONEDNN;
    return backend == GEMM_CONVERT || backend == GEMM_ONEDNN;
}

/* ---- The choice ----------------------------------------------------------- */

/* Set before the first run (gemm_select), read by the workers after. */
static gemm_backend f32_choice[GEMM_CLASSES];      /* default: all CBLAS */
static gemm_backend bf16_choice[GEMM_CLASSES];
static bool bf16_set[GEMM_CLASSES];                /* chosen, not the default */
static pthread_once_t bf16_once = PTHREAD_ONCE_INIT;
static bool measured;

/* bf16 classes nobody chose: oneDNN where it computes bf16 natively. */
static void bf16_defaults(void)
{
    gemm_backend b = onednn_bf16_native() ? GEMM_ONEDNN : GEMM_CONVERT;
    for (int c = 0; c < GEMM_CLASSES; c++)
        if (!bf16_set[c]) bf16_choice[c] = b;
}

gemm_backend gemm_backend_of(gemm_type precision, int cls)
{
    if (cls < 0 || cls >= GEMM_CLASSES) return GEMM_CBLAS;
    if (precision == GEMM_F32) return f32_choice[cls];
    pthread_once(&bf16_once, bf16_defaults);
    return bf16_choice[cls];
}

/* ---- Per-thread buffers for converted operands ---------------------------- */

enum { BUF_A, BUF_B, BUF_C, BUF_COUNT };

typedef struct bufs {
    void *p[BUF_COUNT];
    size_t size[BUF_COUNT];
} bufs;

static pthread_key_t bufs_key;
static pthread_once_t bufs_once = PTHREAD_ONCE_INIT;

static void bufs_free(void *p)
{
    bufs *b = p;
    for (int i = 0; i < BUF_COUNT; i++) free(b->p[i]);
    free(b);
}

static void bufs_key_make(void) { pthread_key_create(&bufs_key, bufs_free); }

static void *thread_buffer(int which, size_t bytes)
{
    pthread_once(&bufs_once, bufs_key_make);
    bufs *b = pthread_getspecific(bufs_key);
    if (!b) {
        if (!(b = calloc(1, sizeof *b))) return NULL;
        if (pthread_setspecific(bufs_key, b) != 0) {
            free(b);
            return NULL;
        }
    }
    if (bytes <= b->size[which]) return b->p[which];
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) return NULL;
    free(b->p[which]);
    b->p[which] = p;
    b->size[which] = bytes;
    return p;
}

/* The stored rows x cols of a matrix with leading dimension ld, packed
 * densely (leading dimension cols) as `to`: copied, or f32 rounded to
 * bf16. */
static void pack_dense(void *dst, gemm_type to, const void *src, gemm_type t, int64_t rows,
                       int64_t cols, int64_t ld)
{
    size_t el = t == GEMM_F32 ? sizeof(float) : sizeof(bf16_bits);
    for (int64_t i = 0; i < rows; i++) {
        const char *s = (const char *)src + (size_t)(i * ld) * el;
        if (t == GEMM_F32 && to == GEMM_BF16)
            bf16_from_f32_n((bf16_bits *)dst + i * cols, (const float *)s, (size_t)cols);
        else
            memcpy((char *)dst + (size_t)(i * cols) * el, s, (size_t)cols * el);
    }
}

/* The same, as f32 values that are bf16 numbers (f32 inputs rounded). */
static void pack_rounded_f32(float *dst, const void *src, gemm_type t, int64_t rows,
                             int64_t cols, int64_t ld)
{
    for (int64_t i = 0; i < rows; i++) {
        float *d = dst + i * cols;
        if (t == GEMM_F32) {
            const float *s = (const float *)src + i * ld;
            for (int64_t j = 0; j < cols; j++) d[j] = bf16_round(s[j]);
        } else {
            bf16_to_f32_n(d, (const bf16_bits *)src + i * ld, (size_t)cols);
        }
    }
}

static spmd_status no_buffer(size_t bytes)
{
    return base_error(SPMD_ERR_NOMEM, "gemm: no %zu-byte buffer for packed operands",
                      bytes);
}

/* ---- Running a product on a given backend --------------------------------- */

/* Rounded to bf16 and multiplied in f32 by the CBLAS library. */
static spmd_status run_bf16_converted(bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                                      float alpha, const void *a, gemm_type a_type, int64_t lda,
                                      const void *b, gemm_type b_type, int64_t ldb, float beta,
                                      void *c, gemm_type c_type, int64_t ldc)
{
    /* Stored shapes: A is m x k, or k x m transposed; B is k x n, or n x k. */
    int64_t a_rows = ta ? k : m, a_cols = ta ? m : k;
    int64_t b_rows = tb ? n : k, b_cols = tb ? k : n;
    size_t a_bytes = (size_t)(a_rows * a_cols) * sizeof(float);
    size_t b_bytes = (size_t)(b_rows * b_cols) * sizeof(float);
    size_t c_bytes = (size_t)(m * n) * sizeof(float);
    float *fa = NULL, *fb = NULL; /* none when k = 0: C = beta C */
    if (k > 0) {
        if (!(fa = thread_buffer(BUF_A, a_bytes))) return no_buffer(a_bytes);
        if (!(fb = thread_buffer(BUF_B, b_bytes))) return no_buffer(b_bytes);
        pack_rounded_f32(fa, a, a_type, a_rows, a_cols, lda);
        pack_rounded_f32(fb, b, b_type, b_rows, b_cols, ldb);
    }
    int64_t plda = k > 0 ? a_cols : 1, pldb = k > 0 ? b_cols : 1;
    if (c_type == GEMM_F32)
        return blas_sgemm(ta, tb, m, n, k, alpha, fa, plda, fb, pldb, beta, c, ldc);
    float *fc = thread_buffer(BUF_C, c_bytes);
    if (!fc) return no_buffer(c_bytes);
    bf16_bits *hc = c;
    if (beta != 0.0f)
        for (int64_t i = 0; i < m; i++) bf16_to_f32_n(fc + i * n, hc + i * ldc, (size_t)n);
    spmd_status st = blas_sgemm(ta, tb, m, n, k, alpha, fa, plda, fb, pldb, beta, fc, n);
    if (st != SPMD_OK) return st;
    for (int64_t i = 0; i < m; i++) bf16_from_f32_n(hc + i * ldc, fc + i * n, (size_t)n);
    return SPMD_OK;
}

/* The stored rows x cols of an operand as a dense matrix of type `in`:
 * the operand where it lies if it is one, else packed into this thread's
 * buffer `which`. */
static const void *dense_operand(int which, gemm_type in, const void *x, gemm_type t,
                                 int64_t rows, int64_t cols, int64_t ld, spmd_status *st)
{
    if (t == in && ld == cols) return x;
    size_t bytes = (size_t)(rows * cols) * (in == GEMM_BF16 ? sizeof(bf16_bits) : sizeof(float));
    void *p = thread_buffer(which, bytes);
    if (!p) {
        *st = no_buffer(bytes);
        return NULL;
    }
    pack_dense(p, in, x, t, rows, cols, ld);
    return p;
}

/* oneDNN's matmul on dense operands, `in` the operands' type (A and B
 * converted to it), C of c_type.  Its fast kernels (brgemm: AMX,
 * AVX512_BF16, AVX-512) take only matrices stored densely: a tile of a
 * larger matrix (a leading dimension past its columns) gets its generic
 * JIT GEMM instead, several times slower in bf16 on AMX.  So an operand
 * that is not dense, or not of type `in`, is packed into this thread's
 * buffer, and a C that is not dense is computed in one and copied out. */
static spmd_status run_onednn_dense(gemm_type in, bool ta, bool tb, int64_t m, int64_t n,
                                    int64_t k, float alpha, const void *a, gemm_type a_type,
                                    int64_t lda, const void *b, gemm_type b_type, int64_t ldb,
                                    float beta, void *c, gemm_type c_type, int64_t ldc)
{
    int64_t a_rows = ta ? k : m, a_cols = ta ? m : k;
    int64_t b_rows = tb ? n : k, b_cols = tb ? k : n;
    spmd_status st = SPMD_OK;
    const void *ha = dense_operand(BUF_A, in, a, a_type, a_rows, a_cols, lda, &st);
    const void *hb = ha ? dense_operand(BUF_B, in, b, b_type, b_rows, b_cols, ldb, &st) : NULL;
    if (!hb) return st;
    onednn_type din = in == GEMM_BF16 ? ONEDNN_BF16 : ONEDNN_F32;
    onednn_type out = c_type == GEMM_BF16 ? ONEDNN_BF16 : ONEDNN_F32;
    if (ldc == n)
        return onednn_gemm(ta, tb, m, n, k, alpha, ha, a_cols, hb, b_cols, beta, c, n, din, out);
    size_t el = c_type == GEMM_BF16 ? sizeof(bf16_bits) : sizeof(float);
    size_t bytes = (size_t)(m * n) * el;
    char *hc = thread_buffer(BUF_C, bytes);
    if (!hc) return no_buffer(bytes);
    if (beta != 0.0f) pack_dense(hc, c_type, c, c_type, m, n, ldc);
    st = onednn_gemm(ta, tb, m, n, k, alpha, ha, a_cols, hb, b_cols, beta, hc, n, din, out);
    if (st != SPMD_OK) return st;
    for (int64_t i = 0; i < m; i++)
        memcpy((char *)c + (size_t)(i * ldc) * el, hc + (size_t)(i * n) * el, (size_t)n * el);
    return SPMD_OK;
}

static spmd_status run_f32(gemm_backend backend, bool ta, bool tb, int64_t m, int64_t n,
                           int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                           int64_t ldb, float beta, float *c, int64_t ldc)
{
    if (backend == GEMM_ONEDNN && m > 0 && n > 0 && k > 0) {
        spmd_status st = run_onednn_dense(GEMM_F32, ta, tb, m, n, k, alpha, a, GEMM_F32, lda, b,
                                          GEMM_F32, ldb, beta, c, GEMM_F32, ldc);
        if (st != SPMD_ERR_UNSUPPORTED) return st;
        spmd_clear_error(); /* no oneDNN kernel for this shape: the CBLAS library runs it */
    }
    return blas_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

static spmd_status run_bf16(gemm_backend backend, bool ta, bool tb, int64_t m, int64_t n,
                            int64_t k, float alpha, const void *a, gemm_type a_type, int64_t lda,
                            const void *b, gemm_type b_type, int64_t ldb, float beta, void *c,
                            gemm_type c_type, int64_t ldc)
{
    if (m <= 0 || n <= 0) return SPMD_OK;
    if (backend == GEMM_ONEDNN && k > 0) {
        spmd_status st = run_onednn_dense(GEMM_BF16, ta, tb, m, n, k, alpha, a, a_type, lda, b,
                                          b_type, ldb, beta, c, c_type, ldc);
        if (st != SPMD_ERR_UNSUPPORTED) return st;
        spmd_clear_error(); /* no oneDNN kernel for this shape: convert */
    }
    return run_bf16_converted(ta, tb, m, n, k, alpha, a, a_type, lda, b, b_type, ldb, beta, c,
                              c_type, ldc);
}

spmd_status gemm_f32_on(gemm_backend backend, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                        float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                        float beta, float *c, int64_t ldc)
{
    if (!backend_fits(GEMM_F32, backend))
        return base_error(SPMD_ERR_INVALID, "gemm: f32 runs on cblas or onednn, not %s",
                          backend_name(backend));
    return run_f32(backend, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

spmd_status gemm_bf16_on(gemm_backend backend, bool ta, bool tb, int64_t m, int64_t n,
                         int64_t k, float alpha, const void *a, gemm_type a_type, int64_t lda,
                         const void *b, gemm_type b_type, int64_t ldb, float beta, void *c,
                         gemm_type c_type, int64_t ldc)
{
    if (!backend_fits(GEMM_BF16, backend))
        return base_error(SPMD_ERR_INVALID, "gemm: bf16 runs on onednn or convert, not %s",
                          backend_name(backend));
    return run_bf16(backend, ta, tb, m, n, k, alpha, a, a_type, lda, b, b_type, ldb, beta, c,
                    c_type, ldc);
}

spmd_status gemm_f32(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                     const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                     float *c, int64_t ldc)
{
    return run_f32(f32_choice[gemm_class_of(ta, tb, m, n, k)], ta, tb, m, n, k, alpha, a, lda,
                   b, ldb, beta, c, ldc);
}

spmd_status gemm_bf16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                      const void *a, gemm_type a_type, int64_t lda, const void *b,
                      gemm_type b_type, int64_t ldb, float beta, void *c, gemm_type c_type,
                      int64_t ldc)
{
    gemm_backend backend = gemm_backend_of(GEMM_BF16, gemm_class_of(ta, tb, m, n, k));
    return run_bf16(backend, ta, tb, m, n, k, alpha, a, a_type, lda, b, b_type, ldb, beta, c,
                    c_type, ldc);
}

/* ---- Measuring ----------------------------------------------------------- */

static double seconds_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_rate(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

double gemm_rate(gemm_type precision, gemm_backend backend, bool ta, bool tb, int64_t m,
                 int64_t n, int64_t k, double seconds)
{
    enum { SAMPLES = 5 };
    if (!backend_fits(precision, backend) || m <= 0 || n <= 0 || k <= 0) return -1.0;
    if (backend == GEMM_ONEDNN && !onednn_available()) return -1.0;
    size_t na = (size_t)(m * k), nb = (size_t)(k * n), nc = (size_t)(m * n);
    size_t el = precision == GEMM_F32 ? sizeof(float) : sizeof(bf16_bits);
    void *a = malloc(na * el), *b = malloc(nb * el);
    float *c = malloc(nc * sizeof(float));
    double rate = -1.0;
    if (!a || !b || !c) goto done;
    uint32_t seed = 12345u;
    for (size_t i = 0; i < na + nb; i++) {
        seed = seed * 1664525u + 1013904223u;
        float v = (float)(seed >> 8) / 16777216.0f - 0.5f;
        if (precision == GEMM_F32)
            (i < na ? (float *)a : (float *)b)[i < na ? i : i - na] = v;
        else
            (i < na ? (bf16_bits *)a : (bf16_bits *)b)[i < na ? i : i - na] = bf16_from_f32(v);
    }
    int64_t lda = ta ? m : k, ldb = tb ? k : n;
    int iters = 1;
    double samples[SAMPLES];
    for (int s = -1; s < SAMPLES; s++) {
        double t0 = seconds_now();
        for (int i = 0; i < iters; i++) {
            spmd_status st =
                precision == GEMM_F32
                    ? run_f32(backend, ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, n)
                    : run_bf16(backend, ta, tb, m, n, k, 1.0f, a, GEMM_BF16, lda, b, GEMM_BF16,
                               ldb, 0.0f, c, GEMM_F32, n);
            if (st != SPMD_OK) goto done;
        }
        double t = seconds_now() - t0;
        if (s < 0) { /* warm-up: also sizes the samples */
            double per = t > 1e-7 ? t : 1e-7;
            iters = (int)(seconds / SAMPLES / per) + 1;
            continue;
        }
        samples[s] = 2.0 * (double)m * (double)n * (double)k * iters / t * 1e-9;
    }
    qsort(samples, SAMPLES, sizeof samples[0], cmp_rate);
    rate = samples[SAMPLES / 2];
done:
    free(a), free(b), free(c);
    return rate;
}

/* A backend other than the default one takes a class only if it measures
 * this much faster, so noise between two close backends does not flip
 * the choice from run to run. */
#define MEASURE_MARGIN 1.05

static gemm_backend measure_class(gemm_type precision, int cls, gemm_backend dflt)
{
    bool ta, tb;
    int64_t m, n, k;
    gemm_class_shape(cls, &ta, &tb, &m, &n, &k);
    gemm_backend other = dflt == GEMM_ONEDNN ? (precision == GEMM_F32 ? GEMM_CBLAS : GEMM_CONVERT)
                                             : GEMM_ONEDNN;
    double r_default = gemm_rate(precision, dflt, ta, tb, m, n, k, GEMM_MEASURE_SECONDS);
    double r_other = gemm_rate(precision, other, ta, tb, m, n, k, GEMM_MEASURE_SECONDS);
    if (r_other > 0 && (r_default <= 0 || r_other > MEASURE_MARGIN * r_default)) return other;
    return dflt;
}

/* ---- Choosing ------------------------------------------------------------ */

static spmd_status bad_spec(const char *spec, const char *why)
{
    return base_error(SPMD_ERR_INVALID,
                      "BLAS: '%s': %s (LIB[:KEY=BACKEND,...]: LIB auto, openblas, blis, onednn, "
                      "measure or a CBLAS file path; KEY f32, bf16, or f32-/bf16- and a class "
                      "nn|nt|tn|tt-small|large; BACKEND cblas|onednn for f32, onednn|convert "
                      "for bf16)",
                      spec, why);
}

/* One KEY=BACKEND into the tables; `set` marks the classes chosen. */
static spmd_status parse_option(const char *spec, const char *opt, size_t len,
                                gemm_backend f32[], bool f32_set[], gemm_backend b16[],
                                bool b16_set[])
{
    char item[64];
    if (len == 0 || len >= sizeof item) return bad_spec(spec, "an empty or overlong option");
    memcpy(item, opt, len);
    item[len] = 0;
    char *eq = strchr(item, '=');
    if (!eq) return bad_spec(spec, "an option without '='");
    *eq = 0;
    const char *key = item, *value = eq + 1;
    gemm_type precision;
    if (!strncmp(key, "f32", 3)) precision = GEMM_F32, key += 3;
    else if (!strncmp(key, "bf16", 4)) precision = GEMM_BF16, key += 4;
    else return bad_spec(spec, "an option key that is not f32 or bf16");
    int first = 0, last = GEMM_CLASSES - 1;
    if (*key) {
        if (*key++ != '-') return bad_spec(spec, "an unknown option key");
        int c = 0;
        while (c < GEMM_CLASSES && strcmp(key, gemm_class_name(c))) c++;
        if (c == GEMM_CLASSES) return bad_spec(spec, "an unknown shape class");
        first = last = c;
    }
    gemm_backend b;
    if (!strcmp(value, "cblas")) b = GEMM_CBLAS;
    else if (!strcmp(value, "onednn")) b = GEMM_ONEDNN;
    else if (!strcmp(value, "convert")) b = GEMM_CONVERT;
    else return bad_spec(spec, "an unknown backend");
    if (!backend_fits(precision, b))
        return bad_spec(spec, precision == GEMM_F32 ? "f32 runs on cblas or onednn"
                                                    : "bf16 runs on onednn or convert");
    if (b == GEMM_ONEDNN && !onednn_available())
        return base_error(SPMD_ERR_UNSUPPORTED, "BLAS: '%s' asks for oneDNN: %s", spec,
                          onednn_why_not());
    for (int c = first; c <= last; c++) {
        if (precision == GEMM_F32) f32[c] = b, f32_set[c] = true;
        else b16[c] = b, b16_set[c] = true;
    }
    return SPMD_OK;
}

spmd_status gemm_select(const char *spec, const char *coretype)
{
    if (!spec) spec = "auto";
    /* LIB, then options after the last ':' if they hold an '=' (a path
     * may hold a ':'). */
    const char *colon = strrchr(spec, ':');
    const char *opts = colon && strchr(colon, '=') ? colon + 1 : NULL;
    size_t lib_len = opts ? (size_t)(colon - spec) : strlen(spec);
    char lib[PATH_MAX];
    if (lib_len >= sizeof lib) return bad_spec(spec, "a library path too long");
    memcpy(lib, spec, lib_len);
    lib[lib_len] = 0;

    gemm_backend f32[GEMM_CLASSES] = {0}, b16[GEMM_CLASSES] = {0};
    bool f32_set[GEMM_CLASSES] = {0}, b16_set[GEMM_CLASSES] = {0};
    bool measure = false;
    if (!strcmp(lib, "onednn")) {
        if (!onednn_available())
            return base_error(SPMD_ERR_UNSUPPORTED, "BLAS: onednn: %s", onednn_why_not());
        for (int c = 0; c < GEMM_CLASSES; c++) f32[c] = GEMM_ONEDNN, f32_set[c] = true;
        snprintf(lib, sizeof lib, "auto");
    } else if (!strcmp(lib, "measure")) {
        measure = true;
        snprintf(lib, sizeof lib, "auto");
    }
    for (const char *p = opts; p && *p;) {
        size_t len = strcspn(p, ",");
        spmd_status st = parse_option(spec, p, len, f32, f32_set, b16, b16_set);
        if (st != SPMD_OK) return st;
        p += len + (p[len] == ',');
    }
    spmd_status st = blas_select(lib, coretype);
    if (st != SPMD_OK) return st;
    /* Before the first run (blas_select refuses later), so no worker reads
     * the tables while they change. */
    for (int c = 0; c < GEMM_CLASSES; c++) {
        if (f32_set[c]) f32_choice[c] = f32[c];
        else if (measure) f32_choice[c] = measure_class(GEMM_F32, c, GEMM_CBLAS);
        if (b16_set[c]) bf16_choice[c] = b16[c], bf16_set[c] = true;
    }
    if (measure) {
        gemm_backend dflt = onednn_bf16_native() ? GEMM_ONEDNN : GEMM_CONVERT;
        for (int c = 0; c < GEMM_CLASSES; c++)
            if (!bf16_set[c]) bf16_choice[c] = measure_class(GEMM_BF16, c, dflt), bf16_set[c] = true;
        measured = true;
    }
    return SPMD_OK;
}

/* ---- Describing ---------------------------------------------------------- */

static pthread_mutex_t describe_lock = PTHREAD_MUTEX_INITIALIZER;

/* "nn-small, nt-large" for the classes of `precision` on `backend`;
 * the count in *n. */
static void classes_on(gemm_type precision, gemm_backend backend, char *out, size_t size, int *n)
{
    out[0] = 0;
    *n = 0;
    for (int c = 0; c < GEMM_CLASSES; c++) {
        if (gemm_backend_of(precision, c) != backend) continue;
        size_t len = strlen(out);
        snprintf(out + len, size - len, "%s%s", *n ? ", " : "", gemm_class_name(c));
        ++*n;
    }
}

const char *gemm_describe_f32(void)
{
    static char text[512];
    char on[128];
    int n;
    pthread_mutex_lock(&describe_lock);
    classes_on(GEMM_F32, GEMM_ONEDNN, on, sizeof on, &n);
    if (n == 0) snprintf(text, sizeof text, "%s", blas_name());
    else if (n == GEMM_CLASSES) snprintf(text, sizeof text, "%s matmul", onednn_name());
    else snprintf(text, sizeof text, "%s; %s matmul for %s", blas_name(), onednn_name(), on);
    pthread_mutex_unlock(&describe_lock);
    return text;
}

const char *gemm_describe_bf16(void)
{
    static char text[768];
    char on[128], conv[128];
    int n_on, n_conv;
    pthread_mutex_lock(&describe_lock);
    classes_on(GEMM_BF16, GEMM_ONEDNN, on, sizeof on, &n_on);
    classes_on(GEMM_BF16, GEMM_CONVERT, conv, sizeof conv, &n_conv);
    char dnnl[256] = "", slow[384] = "";
    if (n_on)
        snprintf(dnnl, sizeof dnnl, "%s bf16 matmul, f32 accumulation%s%s%s", onednn_name(),
                 onednn_bf16_native() ? "" : " (emulated: this CPU has no native bf16)",
                 n_conv ? " for " : "", n_conv ? on : "");
    if (n_conv) {
        const char *why = !onednn_available() ? onednn_why_not()
                          : !onednn_bf16_native()
                              ? "oneDNN finds no native bf16 (AVX512_BF16 or AMX) on this CPU"
                              : "chosen";
        snprintf(slow, sizeof slow,
                 "converted to f32 and run by %s%s%s (slow: no faster than f32; %s)",
                 blas_name(), n_on ? " for " : "", n_on ? conv : "", why);
    }
    snprintf(text, sizeof text, "%s%s%s", dnnl, n_on && n_conv ? "; " : "", slow);
    pthread_mutex_unlock(&describe_lock);
    return text;
}

const char *gemm_choice_spec(void)
{
    static char text[PATH_MAX + 512];
    pthread_mutex_lock(&describe_lock);
    snprintf(text, sizeof text, "%s:", blas_library_key());
    for (int p = 0; p < 2; p++)
        for (int c = 0; c < GEMM_CLASSES; c++) {
            size_t len = strlen(text);
            snprintf(text + len, sizeof text - len, "%s%s-%s=%s", p + c ? "," : "",
                     p ? "bf16" : "f32", gemm_class_name(c),
                     backend_name(gemm_backend_of(p ? GEMM_BF16 : GEMM_F32, c)));
        }
    pthread_mutex_unlock(&describe_lock);
    return text;
}

bool gemm_measured(void) { return measured; }

/* ---- The public calls (spmd.h) -------------------------------------------- */

spmd_status spmd_blas_select(const char *library, const char *coretype)
{
    return gemm_select(library, coretype);
}

spmd_status spmd_blas_prepare(size_t *mapped, size_t *more) { return blas_prepare(mapped, more); }

const char *spmd_blas_describe(void)
{
    if (blas_init(BLAS_AUTO, NULL) != SPMD_OK) return NULL;
    return gemm_describe_f32();
}

const char *spmd_blas_describe_bf16(void)
{
    if (blas_init(BLAS_AUTO, NULL) != SPMD_OK) return NULL;
    return gemm_describe_bf16();
}

const char *spmd_blas_choice(void)
{
    if (blas_init(BLAS_AUTO, NULL) != SPMD_OK) return NULL;
    return gemm_choice_spec();
}
