/*
 * Which backend runs each GEMM: the CBLAS library of blas.c or oneDNN's
 * matmul (onednn.c), for f32 products and for bf16 ones (bf16 inputs,
 * f32 accumulation).  Products fall into shape classes (the transposes,
 * and small or large by m*n*k); each class of each precision has one
 * backend, so a product's bits depend only on its shape and the choice,
 * never on timing during a run.
 *
 * The choice is a string, the value of spmd_blas_select and `--blas`:
 *
 *   LIB[:KEY=BACKEND,...]
 *
 * LIB is the CBLAS library (auto, openblas, blis, a file path), or
 * "onednn" (auto, with every f32 class on oneDNN), or "measure": auto,
 * with each class timed on its backends now and given the fastest
 * (gemm_choice_spec then gives the choice in this same form, to repeat
 * it exactly).  KEY is f32 or bf16 (every class of that precision) or one
 * class, such as f32-nt-small or bf16-tn-large; BACKEND is cblas or
 * onednn for f32 and onednn or convert for bf16.
 *
 * By default every f32 product runs on the CBLAS library (the bits libspmd
 * always had), and bf16 ones on oneDNN where its kernels compute bf16
 * natively (AVX512_BF16 or AMX), else converted: the inputs rounded to
 * bf16 and multiplied in f32 by the CBLAS library, the same numbers at no
 * more than f32 speed.
 */
#ifndef SPMD_RUNTIME_GEMM_H
#define SPMD_RUNTIME_GEMM_H

#include "spmd/spmd.h"

typedef enum gemm_type { GEMM_F32 = 0, GEMM_BF16 = 1 } gemm_type;

typedef enum gemm_backend {
    GEMM_CBLAS = 0,   /* f32: the CBLAS library */
    GEMM_ONEDNN = 1,  /* f32 or bf16: oneDNN's matmul */
    GEMM_CONVERT = 2, /* bf16: rounded to bf16, multiplied in f32 by the CBLAS library */
} gemm_backend;

/* Transposes (nn, nt, tn, tt) times sizes (small, large). */
enum { GEMM_CLASSES = 8 };
/* m*n*k from which a product is large: the executor's tiles of GPT-2
 * small at 256 tokens are below it, those at 1024 tokens above. */
#define GEMM_LARGE_MNK ((int64_t)1 << 22)

int gemm_class_of(bool ta, bool tb, int64_t m, int64_t n, int64_t k);
const char *gemm_class_name(int cls); /* "nt-small" */
/* A product typical of the class, as the executor's tiles are: the one
 * `measure` times (for GEMM_MEASURE_SECONDS per backend). */
void gemm_class_shape(int cls, bool *ta, bool *tb, int64_t *m, int64_t *n, int64_t *k);
#define GEMM_MEASURE_SECONDS 0.04

/* Row-major C = alpha * op(A) op(B) + beta * C in f32, by the backend
 * chosen for the product's class (blas_sgemm's contract otherwise; a
 * product oneDNN has no kernel for runs on the CBLAS library). */
spmd_status gemm_f32(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                     const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                     float *c, int64_t ldc);

/* The bf16 GEMM: A and B f32 or bf16 (f32 ones rounded to bf16, nearest
 * even, as base/bf16.h rounds), products summed in f32, C = alpha * sum +
 * beta * C in f32, or rounded to bf16 when C is bf16. */
spmd_status gemm_bf16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                      const void *a, gemm_type a_type, int64_t lda, const void *b,
                      gemm_type b_type, int64_t ldb, float beta, void *c, gemm_type c_type,
                      int64_t ldc);

/* The same on a given backend, whatever the choice (tests, benchmarks);
 * a backend that cannot run the precision is refused, one that cannot
 * run the shape hands it on as above. */
spmd_status gemm_f32_on(gemm_backend backend, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                        float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                        float beta, float *c, int64_t ldc);
spmd_status gemm_bf16_on(gemm_backend backend, bool ta, bool tb, int64_t m, int64_t n,
                         int64_t k, float alpha, const void *a, gemm_type a_type, int64_t lda,
                         const void *b, gemm_type b_type, int64_t ldb, float beta, void *c,
                         gemm_type c_type, int64_t ldc);

/* The backend of a class now (the default until a choice is made). */
gemm_backend gemm_backend_of(gemm_type precision, int cls);

/* Parse and apply a choice (see above); loads the CBLAS library. */
spmd_status gemm_select(const char *spec, const char *coretype);

/* Median GFLOP/s of `backend` on a product of that shape on this thread
 * (the measurement `measure` makes), or a negative value if the backend
 * cannot run it. */
double gemm_rate(gemm_type precision, gemm_backend backend, bool ta, bool tb, int64_t m,
                 int64_t n, int64_t k, double seconds);

/* Whether the choice was measured (`measure`). */
bool gemm_measured(void);
/* The choice as a spec string that repeats it (LIB:KEY=BACKEND,...). */
const char *gemm_choice_spec(void);
/* What runs f32 GEMMs: blas_name() when every class is on the CBLAS
 * library, else the libraries and which classes each runs. */
const char *gemm_describe_f32(void);
/* What runs bf16 GEMMs, and whether it is slow, with the reason. */
const char *gemm_describe_bf16(void);

#endif
