/*
 * GEMM benchmark: every GEMM backend at the shapes of a GPT-2 124M
 * training step, in one run: the CBLAS library the runtime loads
 * (OpenBLAS), BLIS if installed, oneDNN's f32 matmul, oneDNN's bf16
 * matmul (bf16 operands, f32 accumulation and result) and the converting
 * bf16 fallback (operands rounded to bf16, multiplied by the CBLAS
 * library).  GFLOP/s, median of several timed samples, on 1 thread and
 * on N threads that split the rows of C between them (every backend runs
 * single-threaded inside, as in the executor).  Then the shape classes
 * `--blas measure` compares (the executor's tiles) and what it would pick,
 * and conv2d at resnet18's shapes (batch 64, 32 x 32 images): forward,
 * input gradient and weight gradient, each a one-op program run by the
 * executor on 1 and N threads (im2col and the GEMM backend chosen), in
 * GFLOP/s of the convolution's 2 N Cout OH OW Cin/groups KH KW.
 *
 * The core reported is the one the loaded OpenBLAS runs
 * (openblas_get_corename, through blas_name), not what was asked for:
 * libspmd loads OpenBLAS with the --core given, else the one CPUID says
 * fits, whatever OPENBLAS_CORETYPE says, and a release may also not force
 * every core it names.
 *
 *   bench_gemm [--library auto|openblas|blis] [--core NAME] [--threads N]
 *              [--quick] [--info] [--conv]
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pthread barriers, clock_gettime */
#endif

#include "base/bf16.h"
#include "ir/ir.h"
#include "runtime/blas.h"
#include "runtime/gemm.h"
#include "runtime/onednn.h"

#include "bench_time.h"

#include "spmd/spmd.h"

#include <dlfcn.h>
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

/* GPT-2 124M: d_model 768, MLP 3072, QKV 2304, vocab 50257 (the LM head
 * is the tied token embedding [V, C], so logits = X wte^T); M = batch *
 * seq tokens.  Backward: dX = dY W^T (NT), dW = X^T dY (TN). */
static const shape shapes[] = {
    {"qkv        fwd", 256, 2304, 768, false, false},
    {"attn-out   fwd", 256, 768, 768, false, false},
    {"mlp-up     fwd", 256, 3072, 768, false, false},
    {"mlp-down   fwd", 256, 768, 3072, false, false},
    {"lm-head    fwd", 256, 50257, 768, false, true},
    {"qkv        dX", 256, 768, 2304, false, true},
    {"mlp-up     dX", 256, 768, 3072, false, true},
    {"mlp-down   dX", 256, 3072, 768, false, true},
    {"lm-head    dX", 256, 768, 50257, false, false},
    {"qkv        dW", 768, 2304, 256, true, false},
    {"mlp-up     dW", 768, 3072, 256, true, false},
    {"lm-head    dW", 50257, 768, 256, true, false},
    {"mlp-up  fwd M=1024", 1024, 3072, 768, false, false},
    {"mlp-down fwd M=1024", 1024, 768, 3072, false, false},
    {"lm-head fwd M=1024", 1024, 50257, 768, false, true},
};

enum { MAX_THREADS = 64, SAMPLES = 5 };

/* ---- The backends --------------------------------------------------------- */

typedef enum backend { B_CBLAS, B_BLIS, B_ONEDNN_F32, B_ONEDNN_BF16, B_CONVERT, B_COUNT } backend;

static const char *backend_label[B_COUNT] = {"cblas", "BLIS", "oneDNN f32", "oneDNN bf16",
                                             "bf16 convert"};

/* BLIS beside the runtime's CBLAS library: opened here, single-threaded. */
typedef void (*cblas_sgemm_fn)(int, int, int, int, int, int, float, const float *, int,
                               const float *, int, float, float *, int);
static cblas_sgemm_fn blis_sgemm;
static char blis_name[64] = "not installed (libblis4)";

static void blis_open(void)
{
    void *h = dlopen("libblis.so.4", RTLD_NOW | RTLD_LOCAL);
    if (!h) return;
    long (*threads)(long) = (long (*)(long))dlsym(h, "bli_thread_set_num_threads");
    const char *(*version)(void) = (const char *(*)(void))dlsym(h, "bli_info_get_version_str");
    blis_sgemm = (cblas_sgemm_fn)dlsym(h, "cblas_sgemm");
    if (!blis_sgemm) return;
    if (threads) threads(1);
    snprintf(blis_name, sizeof blis_name, "BLIS %s", version ? version() : "");
}

/* The operands: f32 and their bf16 roundings. */
typedef struct operands {
    const float *a, *b;
    const bf16_bits *ha, *hb;
    float *c;
} operands;

/* Rows [m0, m1) of C on backend `be`. */
static void run_rows(backend be, const shape *s, const operands *o, int m0, int m1)
{
    /* A is [M, K] (lda K), or [K, M] (lda M) when transposed. */
    size_t a_off = s->ta ? (size_t)m0 : (size_t)m0 * (size_t)s->k;
    int lda = s->ta ? s->m : s->k, ldb = s->tb ? s->k : s->n, m = m1 - m0;
    float *c = o->c + (size_t)m0 * (size_t)s->n;
    switch (be) {
    case B_CBLAS:
        blas_sgemm(s->ta, s->tb, m, s->n, s->k, 1.0f, o->a + a_off, lda, o->b, ldb, 0.0f, c, s->n);
        break;
    case B_BLIS:
        blis_sgemm(101, s->ta ? 112 : 111, s->tb ? 112 : 111, m, s->n, s->k, 1.0f, o->a + a_off,
                   lda, o->b, ldb, 0.0f, c, s->n);
        break;
    case B_ONEDNN_F32:
        gemm_f32_on(GEMM_ONEDNN, s->ta, s->tb, m, s->n, s->k, 1.0f, o->a + a_off, lda, o->b, ldb,
                    0.0f, c, s->n);
        break;
    case B_ONEDNN_BF16:
    case B_CONVERT:
        gemm_bf16_on(be == B_CONVERT ? GEMM_CONVERT : GEMM_ONEDNN, s->ta, s->tb, m, s->n, s->k,
                     1.0f, o->ha + a_off, GEMM_BF16, lda, o->hb, GEMM_BF16, ldb, 0.0f, c,
                     GEMM_F32, s->n);
        break;
    default: break;
    }
}

static bool backend_present(backend be)
{
    if (be == B_BLIS) return blis_sgemm != NULL;
    if (be == B_ONEDNN_F32 || be == B_ONEDNN_BF16) return onednn_available();
    return true;
}

/* ---- A tiny fork-join pool: worker 0 is the calling thread. ---------- */

typedef struct job {
    backend be;
    const shape *s;
    const operands *o;
    int iters;
} job;

static struct {
    int n;
    pthread_t tid[MAX_THREADS];
    pthread_barrier_t start, done;
    job job;
    bool quit;
} pool;

/* Rows of C for thread `t` of `n`. */
static void run_part(int t, int n)
{
    const job *j = &pool.job;
    int m0 = (int)((long long)j->s->m * t / n), m1 = (int)((long long)j->s->m * (t + 1) / n);
    if (m1 <= m0) return;
    for (int it = 0; it < j->iters; it++) run_rows(j->be, j->s, j->o, m0, m1);
}

static void *worker(void *arg)
{
    int t = (int)(size_t)arg;
    for (;;) {
        pthread_barrier_wait(&pool.start);
        if (pool.quit) return NULL;
        run_part(t, pool.n);
        pthread_barrier_wait(&pool.done);
    }
}

static void pool_start(int n)
{
    pool.n = n;
    pthread_barrier_init(&pool.start, NULL, (unsigned)n);
    pthread_barrier_init(&pool.done, NULL, (unsigned)n);
    for (int t = 1; t < n; t++) pthread_create(&pool.tid[t], NULL, worker, (void *)(size_t)t);
}

static void pool_stop(void)
{
    pool.quit = true;
    pthread_barrier_wait(&pool.start);
    for (int t = 1; t < pool.n; t++) pthread_join(pool.tid[t], NULL);
    pthread_barrier_destroy(&pool.start);
    pthread_barrier_destroy(&pool.done);
    pool.quit = false;
}

/* Seconds for `iters` GEMMs on 1 or all the pool's threads. */
static double timed_run(bool all, backend be, const shape *s, const operands *o, int iters)
{
    pool.job = (job){be, s, o, iters};
    double t0 = now_s();
    if (!all) {
        run_part(0, 1);
    } else {
        pthread_barrier_wait(&pool.start);
        run_part(0, pool.n);
        pthread_barrier_wait(&pool.done);
    }
    return now_s() - t0;
}

/* Median GFLOP/s; each sample runs enough iterations to last `min_s`. */
static double measure(bool all, backend be, const shape *s, const operands *o, double min_s)
{
    double flops = 2.0 * s->m * s->n * s->k;
    double t = timed_run(all, be, s, o, 1); /* warm-up (and oneDNN makes its primitives) */
    int iters = 1;
    if (t < min_s) iters = (int)(min_s / (t > 1e-7 ? t : 1e-7)) + 1;
    double rate[SAMPLES];
    for (int i = 0; i < SAMPLES; i++) rate[i] = flops * iters / timed_run(all, be, s, o, iters) * 1e-9;
    return median(rate, SAMPLES);
}

static void *alloc_or_die(size_t bytes)
{
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) {
        fprintf(stderr, "bench_gemm: out of memory\n");
        exit(1);
    }
    return p;
}

static float *random_matrix(size_t n, unsigned *seed)
{
    float *p = alloc_or_die(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        *seed = *seed * 1664525u + 1013904223u;
        p[i] = (float)(*seed >> 8) / 16777216.0f - 0.5f;
    }
    return p;
}

/* ---- Convolutions ---------------------------------------------------------- */

/* resnet18's 3x3 convolution of a stage, its strided one into the next
 * stage and the 1x1 shortcut beside it, at 32 x 32 (CIFAR-sized images:
 * a batch of 64 keeps x and y at 16 MiB each). */
typedef struct conv_shape {
    const char *label;
    int64_t n, cin, h, cout, k;
    int stride, pad;
} conv_shape;

static const conv_shape conv_shapes[] = {
    {"3x3 64->64 s1", 64, 64, 32, 64, 3, 1, 1},
    {"3x3 64->128 s2", 64, 64, 32, 128, 3, 2, 1},
    {"1x1 64->128 s2", 64, 64, 32, 128, 1, 2, 0},
};

enum { CONV_FWD, CONV_DX, CONV_DW, CONV_OPS };
static const char *conv_op_label[CONV_OPS] = {"forward", "dx", "dw"};

static spmd_tensor *conv_input(spmd_graph *g, const char *name, const int64_t *dims)
{
    return spmd_input(g, name, SPMD_F32, 4, dims);
}

/* Median GFLOP/s of op `which` of conv `c` (batch n) on `threads`. */
static double conv_rate(const conv_shape *c, int64_t n, int which, int threads, double min_s)
{
    const int64_t oh = (c->h + 2 * c->pad - c->k) / c->stride + 1;
    const int64_t xd[4] = {n, c->cin, c->h, c->h}, wd[4] = {c->cout, c->cin, c->k, c->k},
                  yd[4] = {n, c->cout, oh, oh};
    const ir_conv attr = {{c->stride, c->stride}, {c->pad, c->pad}, {1, 1}, 1};
    const spmd_conv2d_options opts = {{c->stride, c->stride}, {c->pad, c->pad}, {1, 1}, 1};
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_tensor *a, *b, *out;
    if (which == CONV_FWD) {
        a = conv_input(g, "x", xd), b = conv_input(g, "w", wd);
        out = spmd_conv2d(g, a, b, &opts);
    } else if (which == CONV_DX) {
        a = conv_input(g, "dy", yd), b = conv_input(g, "w", wd);
        out = ir_conv2d_backward_input(g, a, b, xd, &attr);
    } else {
        a = conv_input(g, "x", xd), b = conv_input(g, "dy", yd);
        out = ir_conv2d_backward_weight(g, a, b, wd, &attr);
    }
    spmd_program *p = NULL;
    if (out && spmd_graph_mark_output(g, out) == SPMD_OK)
        p = spmd_compile(g, &(spmd_compile_options){.threads = threads});
    if (!p) {
        fprintf(stderr, "bench_gemm: conv %s %s: %s\n", c->label, conv_op_label[which],
                spmd_last_error());
        exit(1);
    }
    unsigned seed = 777;
    spmd_tensor *in[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        size_t count = (size_t)spmd_tensor_numel(in[i]);
        float *v = random_matrix(count, &seed);
        spmd_program_set_input(p, in[i], v, count * sizeof *v);
        free(v);
    }
    const double flops = 2.0 * n * c->cout * oh * oh * c->cin * c->k * c->k;
    double t0 = now_s();
    spmd_program_run(p); /* warm-up */
    double t = now_s() - t0;
    int iters = t < min_s ? (int)(min_s / (t > 1e-7 ? t : 1e-7)) + 1 : 1;
    double rate[SAMPLES];
    for (int i = 0; i < SAMPLES; i++) {
        t0 = now_s();
        for (int r = 0; r < iters; r++) spmd_program_run(p);
        rate[i] = flops * iters / (now_s() - t0) * 1e-9;
    }
    spmd_program_free(p);
    spmd_graph_free(g);
    return median(rate, SAMPLES);
}

static void conv_table(int threads, bool quick)
{
    const int64_t n = quick ? 2 : 64;
    const double min_s = quick ? 0.005 : 0.2;
    printf("\nconv2d, batch %lld, 32 x 32 images (im2col and the GEMM chosen), GFLOP/s, median "
           "of %d samples\n%-16s %12s %12s %12s %12s %12s %12s\n",
           (long long)n, SAMPLES, "shape", "fwd 1 thr", "dx 1 thr", "dw 1 thr", "fwd all", "dx all",
           "dw all");
    size_t count = sizeof conv_shapes / sizeof conv_shapes[0];
    for (size_t i = 0; i < (quick ? 1 : count); i++) {
        printf("%-16s", conv_shapes[i].label);
        for (int all = 0; all < 2; all++)
            for (int op = 0; op < CONV_OPS; op++)
                printf(" %12.1f", conv_rate(&conv_shapes[i], n, op, all ? threads : 1, min_s));
        printf("\n");
    }
    printf("(all: %d threads)\n", threads);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: bench_gemm [--library auto|openblas|blis] [--core NAME] "
               "[--threads N] [--quick] [--info] [--conv]\n"
               "  --library  which CBLAS library to load (default auto: OpenBLAS, else BLIS)\n"
               "  --core     OpenBLAS core type, e.g. SkylakeX, Haswell (default: the one "
               "CPUID says fits;\n"
               "             OPENBLAS_CORETYPE is not used)\n"
               "  --threads  threads for the second table (default 2)\n"
               "  --quick    shorter samples and only the first shapes\n"
               "  --info     print the libraries and core loaded, and stop\n"
               "  --conv     only the conv2d table\n");
}

static void print_table(const char *title, const double (*rates)[B_COUNT], size_t count)
{
    printf("\n%s\n%-20s %5s %5s %5s %2s", title, "shape", "M", "N", "K", "op");
    for (int be = 0; be < B_COUNT; be++) printf(" %12s", backend_label[be]);
    printf("\n");
    for (size_t i = 0; i < count; i++) {
        const shape *s = &shapes[i];
        printf("%-20s %5d %5d %5d %c%c", s->label, s->m, s->n, s->k, s->ta ? 'T' : 'N',
               s->tb ? 'T' : 'N');
        for (int be = 0; be < B_COUNT; be++) {
            if (rates[i][be] > 0) printf(" %12.1f", rates[i][be]);
            else printf(" %12s", "-");
        }
        printf("\n");
    }
}

int main(int argc, char **argv)
{
    blas_library lib = BLAS_AUTO;
    const char *core = NULL;
    int threads = 2;
    bool quick = false, info = false, conv_only = false;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(arg, "--library") && val) {
            if (!strcmp(val, "auto")) lib = BLAS_AUTO;
            else if (!strcmp(val, "openblas")) lib = BLAS_OPENBLAS;
            else if (!strcmp(val, "blis")) lib = BLAS_BLIS;
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
        } else if (!strcmp(arg, "--conv")) {
            conv_only = true;
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
    if (strncmp(blas_name(), "BLIS", 4) != 0) blis_open();
    else snprintf(blis_name, sizeof blis_name, "the cblas column");
    printf("BLIS: %s\n", blis_name);
    printf("oneDNN: %s\n", onednn_available() ? onednn_name() : onednn_why_not());
    printf("bf16 GEMMs by default: %s\n", gemm_describe_bf16());
    if (info) return 0;
    if (conv_only) {
        conv_table(threads, quick);
        return 0;
    }
    backend_label[B_CBLAS] = strncmp(blas_name(), "OpenBLAS", 8) == 0 ? "OpenBLAS" : "cblas";

    size_t count = sizeof shapes / sizeof shapes[0];
    if (quick && count > 2) count = 2;
    size_t max_a = 0, max_b = 0, max_c = 0;
    for (size_t i = 0; i < count; i++) {
        const shape *s = &shapes[i];
        if ((size_t)s->m * s->k > max_a) max_a = (size_t)s->m * s->k;
        if ((size_t)s->k * s->n > max_b) max_b = (size_t)s->k * s->n;
        if ((size_t)s->m * s->n > max_c) max_c = (size_t)s->m * s->n;
    }
    unsigned seed = 12345;
    float *a = random_matrix(max_a, &seed), *b = random_matrix(max_b, &seed);
    float *c = random_matrix(max_c, &seed);
    bf16_bits *ha = alloc_or_die(max_a * sizeof *ha), *hb = alloc_or_die(max_b * sizeof *hb);
    bf16_from_f32_n(ha, a, max_a);
    bf16_from_f32_n(hb, b, max_b);
    operands o = {a, b, ha, hb, c};

    printf("GFLOP/s, median of %d samples; every backend single-threaded inside; bf16 columns: "
           "bf16 operands, f32 accumulation and result (convert: rounded to bf16, multiplied "
           "by the cblas library)\n", SAMPLES);
    double (*one)[B_COUNT] = calloc(count, sizeof *one), (*many)[B_COUNT] = calloc(count, sizeof *many);
    if (!one || !many) return 1;
    if (threads > 1) pool_start(threads);
    double min_s = quick ? 0.005 : 0.05;
    for (size_t i = 0; i < count; i++)
        for (int be = 0; be < B_COUNT; be++) {
            if (!backend_present((backend)be)) continue;
            one[i][be] = measure(false, (backend)be, &shapes[i], &o, min_s);
            if (threads > 1) many[i][be] = measure(true, (backend)be, &shapes[i], &o, min_s);
        }
    if (threads > 1) pool_stop();
    print_table("1 thread", (const double (*)[B_COUNT])one, count);
    if (threads > 1) {
        char title[64];
        snprintf(title, sizeof title, "%d threads (each a share of the rows of C)", threads);
        print_table(title, (const double (*)[B_COUNT])many, count);
    }

    /* The classes: what `--blas measure` times, and what it would pick. */
    printf("\nshape classes (`--blas measure` times these on one thread, m*n*k >= %lld is "
           "large):\n%-9s %5s %5s %5s %12s %12s %12s %12s\n",
           (long long)GEMM_LARGE_MNK, "class", "M", "N", "K", backend_label[B_CBLAS],
           "oneDNN f32", "oneDNN bf16", "bf16 convert");
    for (int cls = 0; cls < GEMM_CLASSES; cls++) {
        bool ta, tb;
        int64_t m, n, k;
        gemm_class_shape(cls, &ta, &tb, &m, &n, &k);
        double s = quick ? 0.01 : GEMM_MEASURE_SECONDS;
        double r[4] = {gemm_rate(GEMM_F32, GEMM_CBLAS, ta, tb, m, n, k, s),
                       gemm_rate(GEMM_F32, GEMM_ONEDNN, ta, tb, m, n, k, s),
                       gemm_rate(GEMM_BF16, GEMM_ONEDNN, ta, tb, m, n, k, s),
                       gemm_rate(GEMM_BF16, GEMM_CONVERT, ta, tb, m, n, k, s)};
        printf("%-9s %5lld %5lld %5lld", gemm_class_name(cls), (long long)m, (long long)n,
               (long long)k);
        for (int i = 0; i < 4; i++) {
            if (r[i] > 0) printf(" %12.1f", r[i]);
            else printf(" %12s", "-");
        }
        printf("\n");
    }
    free(one), free(many);
    free(a), free(b), free(c), free(ha), free(hb);
    conv_table(threads, quick);
    return 0;
}
