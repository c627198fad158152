/*
 * GEMM benchmark: which BLAS library and kernel the runtime loads, and the
 * GFLOP/s of bare single-precision GEMM on square and GPT-2-sized shapes,
 * on one thread and on several threads that split the rows of C between
 * them (BLAS threading stays at 1, as in the executor).  Median of several
 * timed samples.
 *
 * The core reported is the one the loaded OpenBLAS runs
 * (openblas_get_corename, through blas_name), not what was asked for:
 * libspmd loads OpenBLAS with the --core given, else the one CPUID says
 * fits, whatever OPENBLAS_CORETYPE says, and a release may also not force
 * every core it names.
 *
 *   bench_gemm [--library auto|openblas|blis] [--core NAME] [--threads N]
 *              [--quick] [--info]
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pthread barriers, clock_gettime */
#endif

#include "runtime/blas.h"

#include "bench_time.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

typedef struct shape {
    const char *label;
    int m, n, k;
    bool ta, tb;
} shape;

/* GPT-2 small: d_model 768, MLP 3072, QKV 2304, vocab 50257; M = B*T
 * tokens.  Backward shapes: dX = dY W^T (tb), dW = X^T dY (ta). */
static const shape shapes[] = {
    {"square 256", 256, 256, 256, false, false},
    {"square 512", 512, 512, 512, false, false},
    {"square 1024", 1024, 1024, 1024, false, false},
    {"square 2048", 2048, 2048, 2048, false, false},
    {"gpt2 qkv      M=256", 256, 2304, 768, false, false},
    {"gpt2 attn-out M=256", 256, 768, 768, false, false},
    {"gpt2 mlp-up   M=256", 256, 3072, 768, false, false},
    {"gpt2 mlp-down M=256", 256, 768, 3072, false, false},
    {"gpt2 mlp-up   M=1024", 1024, 3072, 768, false, false},
    {"gpt2 mlp-down M=1024", 1024, 768, 3072, false, false},
    {"gpt2 qkv      M=1024", 1024, 2304, 768, false, false},
    {"gpt2 dX up^T  M=1024", 1024, 768, 3072, false, true},
    {"gpt2 dW up    M=1024", 768, 3072, 1024, true, false},
    {"gpt2 lm-head  M=256", 256, 50257, 768, false, true},
};

enum { MAX_THREADS = 64, SAMPLES = 5 };

/* ---- A tiny fork-join pool: worker 0 is the calling thread. ---------- */

typedef struct job {
    const shape *s;
    const float *a, *b;
    float *c;
    int iters;
} job;

static struct {
    int n;
    pthread_t tid[MAX_THREADS];
    pthread_barrier_t start, done;
    job job;
    bool quit;
} pool;

/* Rows [m0, m1) of C for thread `t` of `n`. */
static void run_part(int t, int n)
{
    const job *j = &pool.job;
    const shape *s = j->s;
    int m0 = (int)((long long)s->m * t / n), m1 = (int)((long long)s->m * (t + 1) / n);
    if (m1 <= m0)
        return;
    /* A is [M, K] (lda K), or [K, M] (lda M) when transposed. */
    const float *a = s->ta ? j->a + m0 : j->a + (size_t)m0 * s->k;
    int lda = s->ta ? s->m : s->k;
    int ldb = s->tb ? s->k : s->n;
    for (int it = 0; it < j->iters; it++)
        blas_sgemm(s->ta, s->tb, m1 - m0, s->n, s->k, 1.0f, a, lda, j->b, ldb, 0.0f,
                   j->c + (size_t)m0 * s->n, s->n);
}

static void *worker(void *arg)
{
    int t = (int)(size_t)arg;
    for (;;) {
        pthread_barrier_wait(&pool.start);
        if (pool.quit)
            return NULL;
        run_part(t, pool.n);
        pthread_barrier_wait(&pool.done);
    }
}

static void pool_start(int n)
{
    pool.n = n;
    pthread_barrier_init(&pool.start, NULL, (unsigned)n);
    pthread_barrier_init(&pool.done, NULL, (unsigned)n);
    for (int t = 1; t < n; t++)
        pthread_create(&pool.tid[t], NULL, worker, (void *)(size_t)t);
}

static void pool_stop(void)
{
    pool.quit = true;
    pthread_barrier_wait(&pool.start);
    for (int t = 1; t < pool.n; t++)
        pthread_join(pool.tid[t], NULL);
    pthread_barrier_destroy(&pool.start);
    pthread_barrier_destroy(&pool.done);
    pool.quit = false;
}

/* Seconds for `iters` GEMMs on `threads` threads. */
static double timed_run(int threads, const shape *s, const float *a, const float *b,
                        float *c, int iters)
{
    pool.job = (job){s, a, b, c, iters};
    double t0 = now_s();
    if (threads == 1) {
        run_part(0, 1);
    } else {
        pthread_barrier_wait(&pool.start);
        run_part(0, threads);
        pthread_barrier_wait(&pool.done);
    }
    return now_s() - t0;
}

/* Median GFLOP/s; each sample runs enough iterations to last `min_s`. */
static double measure(int threads, const shape *s, const float *a, const float *b, float *c,
                      double min_s)
{
    double flops = 2.0 * s->m * s->n * s->k;
    double t = timed_run(threads, s, a, b, c, 1); /* warm-up */
    int iters = 1;
    if (t < min_s)
        iters = (int)(min_s / (t > 1e-7 ? t : 1e-7)) + 1;
    double rate[SAMPLES];
    for (int i = 0; i < SAMPLES; i++)
        rate[i] = flops * iters / timed_run(threads, s, a, b, c, iters) * 1e-9;
    qsort(rate, SAMPLES, sizeof rate[0], cmp_double);
    return rate[SAMPLES / 2];
}

static float *random_matrix(size_t n, unsigned *seed)
{
    float *p = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
    if (!p) {
        fprintf(stderr, "bench_gemm: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++) {
        *seed = *seed * 1664525u + 1013904223u;
        p[i] = (float)(*seed >> 8) / 16777216.0f - 0.5f;
    }
    return p;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: bench_gemm [--library auto|openblas|blis] [--core NAME] "
               "[--threads N] [--quick] [--info]\n"
               "  --library  which BLAS to load (default auto: OpenBLAS, else BLIS)\n"
               "  --core     OpenBLAS core type, e.g. SkylakeX, Haswell (default: the one "
               "CPUID says fits;\n"
               "             OPENBLAS_CORETYPE is not used)\n"
               "  --threads  threads for the second column (default 2)\n"
               "  --quick    shorter samples and only the first shapes\n"
               "  --info     print the library and core loaded, and stop\n");
}

int main(int argc, char **argv)
{
    blas_library lib = BLAS_AUTO;
    const char *core = NULL;
    int threads = 2;
    bool quick = false, info = false;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(arg, "--library") && val) {
            if (!strcmp(val, "auto"))
                lib = BLAS_AUTO;
            else if (!strcmp(val, "openblas"))
                lib = BLAS_OPENBLAS;
            else if (!strcmp(val, "blis"))
                lib = BLAS_BLIS;
            else {
                usage(stderr);
                return 2;
            }
            i++;
        } else if (!strcmp(arg, "--core") && val) {
            core = val;
            i++;
        } else if (!strcmp(arg, "--threads") && val) {
            threads = atoi(val);
            if (threads < 1 || threads > MAX_THREADS) {
                fprintf(stderr, "bench_gemm: --threads must be 1..%d\n", MAX_THREADS);
                return 2;
            }
            i++;
        } else if (!strcmp(arg, "--quick")) {
            quick = true;
        } else if (!strcmp(arg, "--info")) {
            info = true;
        } else if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }

    if (blas_init(lib, core) != SPMD_OK) {
        fprintf(stderr, "bench_gemm: %s\n", spmd_last_error());
        return 1;
    }
    printf("BLAS: %s\n", blas_name());
    if (strncmp(blas_name(), "OpenBLAS", 8) == 0) {
        /* blas_name() ends in "(CORE)", the core OpenBLAS itself reports. */
        char loaded[64] = "unknown";
        const char *open = strrchr(blas_name(), '(');
        if (open) snprintf(loaded, sizeof loaded, "%.*s", (int)strcspn(open + 1, ")"), open + 1);
        printf("core loaded: %s (%s)\n", loaded,
               core ? "asked for with --core" : "the one libspmd chose from CPUID");
        if (core && strcasecmp(core, loaded) != 0)
            printf("note: --core %s was asked for; this OpenBLAS runs %s\n", core, loaded);
        const char *env_core = getenv("OPENBLAS_CORETYPE");
        if (env_core && env_core[0] && strcasecmp(env_core, loaded) != 0)
            printf("note: OPENBLAS_CORETYPE=%s in the environment is not used: libspmd loads "
                   "OpenBLAS with --core, else the core CPUID says fits\n", env_core);
    }
    if (info) return 0;
    printf("GFLOP/s, median of %d samples", SAMPLES);
    if (threads > 1)
        printf("; the %d-thread column splits the rows of C", threads);
    printf("\n\n");
    char tcol[32] = "";
    if (threads > 1)
        snprintf(tcol, sizeof tcol, "%d threads", threads);
    printf("%-22s %5s %5s %5s %2s %9s %9s\n", "shape", "M", "N", "K", "op", "1 thread", tcol);

    size_t max_a = 0, max_b = 0, max_c = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const shape *s = &shapes[i];
        if ((size_t)s->m * s->k > max_a)
            max_a = (size_t)s->m * s->k;
        if ((size_t)s->k * s->n > max_b)
            max_b = (size_t)s->k * s->n;
        if ((size_t)s->m * s->n > max_c)
            max_c = (size_t)s->m * s->n;
    }
    unsigned seed = 12345;
    float *a = random_matrix(max_a, &seed), *b = random_matrix(max_b, &seed);
    float *c = random_matrix(max_c, &seed);

    if (threads > 1)
        pool_start(threads);
    double min_s = quick ? 0.01 : 0.05;
    size_t count = sizeof shapes / sizeof shapes[0];
    if (quick && count > 6)
        count = 6;
    for (size_t i = 0; i < count; i++) {
        const shape *s = &shapes[i];
        double g1 = measure(1, s, a, b, c, min_s);
        printf("%-22s %5d %5d %5d %c%c %9.1f", s->label, s->m, s->n, s->k, s->ta ? 'T' : 'N',
               s->tb ? 'T' : 'N', g1);
        if (threads > 1) {
            fflush(stdout);
            printf(" %9.1f", measure(threads, s, a, b, c, min_s));
        }
        printf("\n");
        fflush(stdout);
    }
    if (threads > 1)
        pool_stop();
    free(a);
    free(b);
    free(c);
    return 0;
}
