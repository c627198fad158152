/*
 * The bare sgemm rate the benchmarks compare with: one product split by
 * rows over a thread pool, as the executor splits its GEMMs.
 */
#ifndef SPMD_BENCH_SGEMM_H
#define SPMD_BENCH_SGEMM_H

#include "runtime/blas.h"
#include "runtime/pool.h"

#include "bench_time.h"

#include <stdlib.h>

typedef struct gemm_job {
    const float *a, *b;
    float *c;
    int64_t m, n, k;
} gemm_job;

/* Persistent threads, as in the executor: BLAS keeps per-thread buffers,
 * so fresh threads per call would measure their set-up. */
static inline void gemm_part(void *ctx, int ith, int nth)
{
    const gemm_job *j = ctx;
    int64_t m0 = j->m * ith / nth, m1 = j->m * (ith + 1) / nth;
    blas_sgemm(false, false, m1 - m0, j->n, j->k, 1.0f, j->a + m0 * j->k, j->k, j->b, j->n, 0.0f,
               j->c + m0 * j->n, j->n);
}

static inline double sgemm_gflops(int64_t m, int64_t n, int64_t k, int threads, int reps)
{
    float *a = malloc(sizeof(float) * (size_t)(m * k)), *b = malloc(sizeof(float) * (size_t)(k * n));
    float *c = malloc(sizeof(float) * (size_t)(m * n));
    for (int64_t i = 0; i < m * k; i++) a[i] = (float)(i % 7) * 0.1f;
    for (int64_t i = 0; i < k * n; i++) b[i] = (float)(i % 5) * 0.1f;
    double *t = malloc(sizeof(double) * (size_t)reps);
    rt_pool *pool = rt_pool_create(threads, NULL);
    gemm_job job = {a, b, c, m, n, k};
    for (int r = -2; r < reps; r++) {
        double t0 = now_s();
        rt_pool_run(pool, gemm_part, &job);
        if (r >= 0) t[r] = now_s() - t0;
    }
    double best = median(t, reps);
    rt_pool_free(pool);
    free(a), free(b), free(c), free(t);
    return 2.0 * (double)m * (double)n * (double)k / best / 1e9;
}

#endif
