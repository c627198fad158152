/*
 * Forward ops against the reference oracle (tests/support/ref.c): every op of the
 * public API, over shapes that cover broadcasting (rank 0 included), every
 * reduction mask, every transpose form, and sizes that cross the kernels'
 * blocking (GEMM tiles, 64-row attention blocks, 256-column reduction
 * chunks), and the KV-cache decoding ops at drawn positions.  Each case is
 * compiled with 1, 2 and 3 threads; every result must be within
 * |got - want| <= 1e-5 + 1e-4 |want| of the oracle and bitwise the same on
 * every thread count.  Also: bad ids, targets and cache positions
 * are data errors at run time that name the op and the value, leave the
 * program usable, and do not hang a pool of threads; a GEMM that BLAS
 * cannot take fails the kernel with its status instead of passing; and
 * conv2d's builder refuses bad shapes naming both tensors.
 *
 * Inputs come from a seeded generator; each case draws from the seed and
 * its own label.  A failure prints the seed; SPMD_TEST_SEED=<seed> replays.
 */
#include <ctype.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "ref.h"
#include "runtime/blas.h"
#include "runtime/kernels/kernels.h"
#include "spmd/spmd.h"
#include "support_case.h"
#include "support_rng.h"

#define MAXT 8          /* inputs per case */
#define MAX_THREADS 3   /* every case runs on 1 .. MAX_THREADS threads */
#define ATOL 1e-5
#define RTOL 1e-4
#define WATCHDOG_S 30   /* a data-error test that takes longer has hung */
#define BAD_RUNS 25     /* times each bad input is tried: hangs are races */

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* SH(rank, dims...): a shape literal; SH(0) is a scalar. */
#define SH(r, ...) {(r), {__VA_ARGS__}}

/* ---- Seeded values ----------------------------------------------------------- */

static uint64_t test_seed;
static test_rng rng; /* the current case's, from the seed and its label */

/* ---- Text for failure messages ------------------------------------------------- */

static void shape_str(const spmd_tensor *t, char *buf, size_t size)
{
    size_t len = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < spmd_tensor_rank(t) && len < size; i++)
        len += (size_t)snprintf(buf + len, size - len, "%s%lld", i ? ", " : "",
                                (long long)spmd_tensor_dim(t, i));
    if (len < size) snprintf(buf + len, size - len, "]");
}

/* The multi-index of flat element `flat` of t. */
static void index_str(const spmd_tensor *t, int64_t flat, char *buf, size_t size)
{
    int r = spmd_tensor_rank(t);
    int64_t idx[SPMD_MAX_RANK];
    for (int i = r - 1; i >= 0; i--) {
        int64_t d = spmd_tensor_dim(t, i);
        idx[i] = flat % d;
        flat /= d;
    }
    size_t len = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < r && len < size; i++)
        len += (size_t)snprintf(buf + len, size - len, "%s%lld", i ? ", " : "", (long long)idx[i]);
    if (len < size) snprintf(buf + len, size - len, "]");
}

/* Whether msg holds the decimal number v as a whole token. */
static bool mentions_number(const char *msg, long long v)
{
    char num[32];
    snprintf(num, sizeof num, "%lld", v);
    size_t len = strlen(num);
    for (const char *p = strstr(msg, num); p; p = strstr(p + 1, num)) {
        bool left = p == msg || !(isdigit((unsigned char)p[-1]) || (v >= 0 && p[-1] == '-'));
        if (left && !isdigit((unsigned char)p[len])) return true;
    }
    return false;
}

/* ---- One case: a graph of inputs and one op, and the oracle's answer ---------- */

typedef struct opcase {
    char what[320];     /* label, then the shapes (filled in by oc_check) */
    spmd_graph *g;
    int n;
    spmd_tensor *in[MAXT];
    void *val[MAXT];    /* host values: float, or int32 for ids */
    float *ids_f32[MAXT]; /* i32 inputs: their values as floats, for the oracle */
    spmd_tensor *out;
    float *want;        /* the oracle, numel(out) floats */
} opcase;

static void oc_init(opcase *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void oc_init(opcase *c, const char *fmt, ...)
{
    memset(c, 0, sizeof *c);
    va_list ap;
    va_start(ap, fmt);
    c->g = test_case_start(c->what, sizeof c->what, test_seed, &rng, fmt, ap);
    va_end(ap);
}

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    assert_non_null(p);
    return p;
}

static spmd_tensor *oc_leaf(opcase *c, spmd_dtype dtype, int rank, const int64_t *dims)
{
    assert_true(c->n < MAXT);
    char name[16];
    snprintf(name, sizeof name, "x%d", c->n);
    spmd_tensor *t = spmd_input(c->g, name, dtype, rank, dims);
    if (!t) fail_msg("%s: input %s: %s", c->what, name, spmd_last_error());
    c->in[c->n] = t;
    c->val[c->n] = xmalloc(test_tensor_bytes(t));
    c->n++;
    return t;
}

/* An f32 input of random values. */
static spmd_tensor *oc_input(opcase *c, const shape *s, test_gen kind)
{
    spmd_tensor *t = oc_leaf(c, SPMD_F32, s->rank, s->dims);
    test_fill_values(&rng, c->val[c->n - 1], spmd_tensor_numel(t), kind);
    return t;
}

/* An i32 input of random ids in [0, limit). */
static spmd_tensor *oc_ids(opcase *c, int rank, const int64_t *dims, int32_t limit)
{
    spmd_tensor *t = oc_leaf(c, SPMD_I32, rank, dims);
    int32_t *v = c->val[c->n - 1];
    float *f = c->ids_f32[c->n - 1] = xmalloc(test_tensor_bytes(t));
    test_fill_ids(&rng, v, spmd_tensor_numel(t), limit);
    for (int64_t i = 0; i < spmd_tensor_numel(t); i++) f[i] = (float)v[i];
    return t;
}

/* Input i's values as floats (ids converted). */
static const float *oc_f(const opcase *c, int i)
{
    return c->ids_f32[i] ? c->ids_f32[i] : c->val[i];
}
static const int32_t *oc_i(const opcase *c, int i) { return c->val[i]; }

/* Records y as the case's result; returns the buffer the oracle fills. */
static float *oc_expect(opcase *c, spmd_tensor *y)
{
    if (!y) fail_msg("%s: building the op failed: %s", c->what, spmd_last_error());
    c->out = y;
    return c->want = xmalloc(test_tensor_bytes(y));
}

/* Appends "x0 [..], x1 [..] -> [..]" to the label. */
static void oc_describe(opcase *c)
{
    char s[96];
    size_t len = strlen(c->what);
    for (int i = 0; i <= c->n && len < sizeof c->what; i++) {
        const spmd_tensor *t = i < c->n ? c->in[i] : c->out;
        shape_str(t, s, sizeof s);
        if (i < c->n)
            len += (size_t)snprintf(c->what + len, sizeof c->what - len, "%s %s%s %s",
                                    i ? "," : ":", spmd_tensor_name(t),
                                    spmd_tensor_dtype(t) == SPMD_I32 ? " i32" : "", s);
        else
            snprintf(c->what + len, sizeof c->what - len, " -> %s", s);
    }
}

static spmd_program *oc_compile(const opcase *c, int nth)
{
    spmd_compile_options opts = {.threads = nth, .seed = 1};
    spmd_program *p = spmd_compile(c->g, &opts);
    if (!p) fail_msg("%s: compile, %d thread(s): %s", c->what, nth, spmd_last_error());
    for (int i = 0; i < c->n; i++)
        if (spmd_program_set_input(p, c->in[i], c->val[i], test_tensor_bytes(c->in[i])) != SPMD_OK)
            fail_msg("%s: set_input: %s", c->what, spmd_last_error());
    return p;
}

static void oc_run_read(const opcase *c, spmd_program *p, int nth, float *dst)
{
    if (spmd_program_run(p) != SPMD_OK)
        fail_msg("%s: run, %d thread(s): %s", c->what, nth, spmd_last_error());
    if (spmd_program_read(p, c->out, dst, test_tensor_bytes(c->out)) != SPMD_OK)
        fail_msg("%s: read: %s", c->what, spmd_last_error());
}

/* got against the oracle: fails naming the worst element. */
static void oc_compare(const opcase *c, const float *got, int nth)
{
    int64_t n = spmd_tensor_numel(c->out), bad = 0, worst = 0;
    double worst_ratio = -1.0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(got[i]) && isnan(c->want[i])) continue;
        double err = fabs((double)got[i] - (double)c->want[i]);
        double tol = ATOL + RTOL * fabs((double)c->want[i]);
        double ratio = isnan(err) ? INFINITY : err / tol;
        if (!(err <= tol)) bad++;
        if (ratio > worst_ratio) {
            worst_ratio = ratio;
            worst = i;
        }
    }
    if (!bad) return;
    char idx[96];
    index_str(c->out, worst, idx, sizeof idx);
    fail_msg("%s, %d thread(s): %lld of %lld elements off the oracle; worst at %s: got %.9g, "
             "want %.9g, |diff| %.3g > %.3g (seed %llu)",
             c->what, nth, (long long)bad, (long long)n, idx, (double)got[worst],
             (double)c->want[worst], fabs((double)got[worst] - (double)c->want[worst]),
             ATOL + RTOL * fabs((double)c->want[worst]), (unsigned long long)test_seed);
}

/* got on nth threads must be the bits of ref on one thread. */
static void oc_same_bits(const opcase *c, const float *ref, const float *got, int nth)
{
    int64_t n = spmd_tensor_numel(c->out);
    if (memcmp(ref, got, test_tensor_bytes(c->out)) == 0) return;
    int64_t i = 0;
    while (i < n && memcmp(&ref[i], &got[i], sizeof *got) == 0) i++;
    char idx[96];
    index_str(c->out, i, idx, sizeof idx);
    fail_msg("%s: not deterministic: at %s 1 thread gives %.9g, %d threads %.9g (seed %llu)",
             c->what, idx, (double)ref[i], nth, (double)got[i], (unsigned long long)test_seed);
}

static void oc_free(opcase *c, float **got)
{
    for (int t = 0; t < MAX_THREADS; t++) free(got[t]);
    for (int i = 0; i < c->n; i++) {
        free(c->val[i]);
        free(c->ids_f32[i]);
    }
    free(c->want);
    spmd_graph_free(c->g);
}

/* Runs the case on 1 .. MAX_THREADS threads against the oracle. */
static void oc_check(opcase *c)
{
    assert_non_null(c->out);
    oc_describe(c);
    assert_int_equal(spmd_graph_mark_output(c->g, c->out), SPMD_OK);
    float *got[MAX_THREADS] = {0};
    for (int t = 0; t < MAX_THREADS; t++) {
        got[t] = xmalloc(test_tensor_bytes(c->out));
        spmd_program *p = oc_compile(c, t + 1);
        oc_run_read(c, p, t + 1, got[t]);
        spmd_program_free(p);
        oc_compare(c, got[t], t + 1);
        if (t > 0) oc_same_bits(c, got[0], got[t], t + 1);
    }
    oc_free(c, got);
}

/* ---- Fill and elementwise ----------------------------------------------------- */

static void test_fill(void **state)
{
    (void)state;
    static const struct {
        shape s;
        float value;
    } cases[] = {
        {SH(0), 3.25f}, {SH(1, 5), -2.0f}, {SH(3, 3, 7, 11), 0.5f}, {SH(2, 1, 1), 0.0f},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        opcase c;
        oc_init(&c, "fill %g", (double)cases[i].value);
        spmd_tensor *y = spmd_fill(c.g, cases[i].s.rank, cases[i].s.dims, cases[i].value);
        ref_fill(oc_expect(&c, y), spmd_tensor_numel(y), cases[i].value);
        oc_check(&c);
    }
}

typedef struct shape_pair {
    shape a, b;
} shape_pair;

/* Same shapes, trailing match, 1-dims on both sides, rank 0 on either side
 * and both, [1] and [1, 1] scalars, the smaller operand on the left, outer
 * products, and sizes that the threads split mid-row. */
static const shape_pair broadcast_pairs[] = {
    {SH(3, 2, 3, 4), SH(3, 2, 3, 4)},
    {SH(3, 2, 3, 4), SH(1, 4)},
    {SH(3, 2, 1, 4), SH(2, 3, 1)},
    {SH(2, 2, 3), SH(0)},
    {SH(0), SH(3, 5, 2, 7)},
    {SH(0), SH(0)},
    {SH(1, 1), SH(2, 9, 13)},
    {SH(2, 9, 13), SH(2, 1, 1)},
    {SH(1, 4), SH(3, 2, 3, 4)},
    {SH(3, 2, 3, 1), SH(3, 1, 1, 4)},
    {SH(2, 37, 50), SH(1, 50)},
    {SH(2, 37, 1), SH(2, 37, 50)},
    {SH(4, 2, 1, 5, 1), SH(3, 3, 1, 6)},
    {SH(3, 7, 1, 33), SH(3, 7, 5, 33)},
};

static void test_binary(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        spmd_tensor *(*fn)(spmd_graph *, spmd_tensor *, spmd_tensor *);
        ref_binop op;
        test_gen b_kind; /* div gets positive denominators */
    } ops[] = {
        {"add", spmd_add, REF_ADD, GEN_ANY},
        {"sub", spmd_sub, REF_SUB, GEN_ANY},
        {"mul", spmd_mul, REF_MUL, GEN_ANY},
        {"div", spmd_div, REF_DIV, GEN_POS},
    };
    for (size_t k = 0; k < ARRAY_LEN(ops); k++)
        for (size_t i = 0; i < ARRAY_LEN(broadcast_pairs); i++) {
            const shape_pair *s = &broadcast_pairs[i];
            opcase c;
            oc_init(&c, "%s #%zu", ops[k].name, i);
            spmd_tensor *a = oc_input(&c, &s->a, GEN_ANY);
            spmd_tensor *b = oc_input(&c, &s->b, ops[k].b_kind);
            ref_binary(ops[k].op, oc_f(&c, 0), s->a.dims, s->a.rank, oc_f(&c, 1), s->b.dims,
                       s->b.rank, oc_expect(&c, ops[k].fn(c.g, a, b)));
            oc_check(&c);
        }
}

static void test_expand(void **state)
{
    (void)state;
    static const shape_pair cases[] = { /* from a, to b */
        {SH(2, 3, 1), SH(3, 2, 3, 4)},       {SH(1, 4), SH(3, 2, 3, 4)},
        {SH(0), SH(3, 2, 3, 4)},             {SH(3, 2, 1, 4), SH(3, 2, 3, 4)},
        {SH(1, 1), SH(2, 5, 7)},             {SH(2, 1, 50), SH(3, 3, 7, 50)},
        {SH(3, 5, 1, 1), SH(3, 5, 6, 7)},    {SH(3, 2, 3, 4), SH(4, 2, 2, 3, 4)},
        {SH(3, 2, 3, 4), SH(3, 2, 3, 4)},    {SH(0), SH(0)},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        const shape *from = &cases[i].a, *to = &cases[i].b;
        opcase c;
        oc_init(&c, "expand #%zu", i);
        spmd_tensor *x = oc_input(&c, from, GEN_ANY);
        ref_expand(oc_f(&c, 0), from->dims, from->rank, to->dims, to->rank,
                   oc_expect(&c, spmd_expand(c.g, x, to->rank, to->dims)));
        oc_check(&c);
    }
}

static void test_unary(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        spmd_tensor *(*fn)(spmd_graph *, spmd_tensor *); /* NULL: scale by c */
        ref_unop op;
        test_gen kind;
        float c;
    } ops[] = {
        {"scale", NULL, REF_SCALE, GEN_ANY, -1.5f},
        {"scale", NULL, REF_SCALE, GEN_ANY, 0.0f},
        {"neg", spmd_neg, REF_NEG, GEN_ANY, 0},
        {"exp", spmd_exp, REF_EXP, GEN_WIDE, 0},
        {"log", spmd_log, REF_LOG, GEN_POS, 0},
        {"tanh", spmd_tanh, REF_TANH, GEN_WIDE, 0},
        {"gelu", spmd_gelu, REF_GELU, GEN_WIDE, 0},
        {"relu", spmd_relu, REF_RELU, GEN_ANY, 0},
        {"sqrt", spmd_sqrt, REF_SQRT, GEN_POS, 0},
        {"rsqrt", spmd_rsqrt, REF_RSQRT, GEN_POS, 0},
        {"gelu_erf", spmd_gelu_erf, REF_GELU_ERF, GEN_WIDE, 0},
        {"silu", spmd_silu, REF_SILU, GEN_WIDE, 0},
        {"sigmoid", spmd_sigmoid, REF_SIGMOID, GEN_WIDE, 0},
    };
    static const shape shapes[] = {SH(3, 3, 5, 37), SH(0), SH(2, 1, 20)};
    for (size_t k = 0; k < ARRAY_LEN(ops); k++)
        for (size_t i = 0; i < ARRAY_LEN(shapes); i++) {
            opcase c;
            char by[32] = "";
            if (!ops[k].fn) snprintf(by, sizeof by, " by %g", (double)ops[k].c);
            oc_init(&c, "%s%s #%zu", ops[k].name, by, i);
            spmd_tensor *x = oc_input(&c, &shapes[i], ops[k].kind);
            spmd_tensor *y = ops[k].fn ? ops[k].fn(c.g, x) : spmd_scale(c.g, x, ops[k].c);
            ref_unary(ops[k].op, oc_f(&c, 0), spmd_tensor_numel(x), ops[k].c, oc_expect(&c, y));
            oc_check(&c);
        }
}

/* x^p: the exponents computed as products, sqrt and reciprocals (any sign
 * where defined), and ones that go through powf (positive x). */
static void test_pow_scalar(void **state)
{
    (void)state;
    static const struct {
        float p;
        test_gen kind;
    } cases[] = {
        {2.0f, GEN_ANY},  {3.0f, GEN_ANY},   {1.0f, GEN_ANY},   {0.0f, GEN_ANY},
        {-1.0f, GEN_ANY}, {-2.0f, GEN_POS},  {0.5f, GEN_POS},   {-0.5f, GEN_POS},
        {1.5f, GEN_POS},  {-1.25f, GEN_POS}, {4.0f, GEN_ANY},
    };
    static const shape shapes[] = {SH(3, 3, 5, 37), SH(0)};
    for (size_t k = 0; k < ARRAY_LEN(cases); k++)
        for (size_t i = 0; i < ARRAY_LEN(shapes); i++) {
            opcase c;
            oc_init(&c, "pow_scalar %g #%zu", (double)cases[k].p, i);
            spmd_tensor *x = oc_input(&c, &shapes[i], cases[k].kind);
            ref_unary(REF_POW, oc_f(&c, 0), spmd_tensor_numel(x), cases[k].p,
                      oc_expect(&c, spmd_pow_scalar(c.g, x, cases[k].p)));
            oc_check(&c);
        }
}

/* The activations and their backward helpers far out on both sides, where
 * e^-x overflows or vanishes: finite values, no NaN. */
static void test_activation_tails(void **state)
{
    (void)state;
    static const float tails[] = {-1e30f, -1e4f, -100.0f, -88.8f, -87.0f, -20.0f, -6.0f, -1e-3f,
                                  0.0f,   1e-3f, 6.0f,    20.0f,  87.0f,  88.8f,  100.0f, 1e4f,
                                  1e30f};
    const shape s = SH(1, (int64_t)ARRAY_LEN(tails));
    static const struct {
        const char *name;
        spmd_tensor *(*fn)(spmd_graph *, spmd_tensor *);
        ref_unop op;
    } ops[] = {
        {"gelu_erf", spmd_gelu_erf, REF_GELU_ERF},
        {"silu", spmd_silu, REF_SILU},
        {"sigmoid", spmd_sigmoid, REF_SIGMOID},
    };
    for (size_t k = 0; k < ARRAY_LEN(ops); k++) {
        opcase c;
        oc_init(&c, "%s tails", ops[k].name);
        spmd_tensor *x = oc_leaf(&c, SPMD_F32, s.rank, s.dims);
        memcpy(c.val[0], tails, sizeof tails);
        ref_unary(ops[k].op, oc_f(&c, 0), s.dims[0], 0.0f, oc_expect(&c, ops[k].fn(c.g, x)));
        oc_check(&c);
    }
    static const struct {
        const char *name;
        spmd_tensor *(*fn)(spmd_graph *, spmd_tensor *, spmd_tensor *);
        void (*ref)(const float *, const float *, int64_t, float *);
    } grads[] = {
        {"gelu_erf_backward", ir_gelu_erf_backward, ref_gelu_erf_backward},
        {"silu_backward", ir_silu_backward, ref_silu_backward},
    };
    for (size_t k = 0; k < ARRAY_LEN(grads); k++) {
        opcase c;
        oc_init(&c, "%s tails", grads[k].name);
        spmd_tensor *x = oc_leaf(&c, SPMD_F32, s.rank, s.dims);
        memcpy(c.val[0], tails, sizeof tails);
        spmd_tensor *dy = oc_input(&c, &s, GEN_ANY);
        grads[k].ref(oc_f(&c, 0), oc_f(&c, 1), s.dims[0], oc_expect(&c, grads[k].fn(c.g, x, dy)));
        oc_check(&c);
    }
}

/* The backward helpers of gelu_erf and silu (the ops autodiff emits) on
 * drawn values against their derivatives in double. */
static void test_activation_backward(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        spmd_tensor *(*fn)(spmd_graph *, spmd_tensor *, spmd_tensor *);
        void (*ref)(const float *, const float *, int64_t, float *);
    } grads[] = {
        {"gelu_erf_backward", ir_gelu_erf_backward, ref_gelu_erf_backward},
        {"silu_backward", ir_silu_backward, ref_silu_backward},
        {"gelu_backward", ir_gelu_backward, ref_gelu_backward},
        {"relu_backward", ir_relu_backward, ref_relu_backward},
    };
    static const shape shapes[] = {SH(3, 3, 5, 37), SH(0), SH(2, 1, 20)};
    for (size_t k = 0; k < ARRAY_LEN(grads); k++)
        for (size_t i = 0; i < ARRAY_LEN(shapes); i++) {
            opcase c;
            oc_init(&c, "%s #%zu", grads[k].name, i);
            spmd_tensor *x = oc_input(&c, &shapes[i], GEN_WIDE);
            spmd_tensor *dy = oc_input(&c, &shapes[i], GEN_ANY);
            grads[k].ref(oc_f(&c, 0), oc_f(&c, 1), spmd_tensor_numel(x),
                         oc_expect(&c, grads[k].fn(c.g, x, dy)));
            oc_check(&c);
        }
}

/* Dropout against the reference's own Philox: spmd_dropout (the graph's
 * step state, 0 on the first run; site 0) and the op keyed by a step fed
 * as an input and another site; the seed is oc_compile's.  Then the
 * builder's refusals. */
static void test_dropout(void **state)
{
    (void)state;
    static const float ps[] = {0.1f, 0.5f, 1.0f};
    static const shape shapes[] = {SH(3, 3, 5, 37), SH(0), SH(2, 1, 20), SH(1, 1000)};
    for (size_t k = 0; k < ARRAY_LEN(ps); k++)
        for (size_t i = 0; i < ARRAY_LEN(shapes); i++)
            for (int keyed = 0; keyed <= 1; keyed++) {
                opcase c;
                oc_init(&c, "dropout p %g%s #%zu", (double)ps[k], keyed ? " keyed" : "", i);
                spmd_tensor *x = oc_input(&c, &shapes[i], GEN_ANY), *y;
                if (keyed) {
                    spmd_tensor *step = oc_leaf(&c, SPMD_F32, 0, NULL);
                    *(float *)c.val[1] = 70001.0f;
                    y = ir_dropout(c.g, x, step, ps[k], 5);
                } else {
                    y = spmd_dropout(c.g, x, ps[k]);
                }
                ref_dropout(oc_f(&c, 0), spmd_tensor_numel(x), ps[k], 1, keyed ? 70001 : 0, 0,
                            keyed ? 5 : 0, oc_expect(&c, y));
                oc_check(&c);
            }

    spmd_graph *g = spmd_graph_create(NULL);
    spmd_tensor *x = spmd_input(g, "x", SPMD_F32, 2, (const int64_t[]){2, 3});
    assert_ptr_equal(spmd_dropout(g, x, 0.0f), x); /* nothing dropped: x itself */
    assert_null(spmd_graph_find(g, "rng.step"));
    assert_null(spmd_dropout(g, x, 1.5f));
    assert_non_null(strstr(spmd_last_error(), "p 1.5 is outside [0, 1]"));
    assert_null(spmd_dropout(g, x, NAN));
    spmd_tensor *ids = spmd_input(g, "ids", SPMD_I32, 1, (const int64_t[]){3});
    assert_null(spmd_dropout(g, ids, 0.5f));
    assert_non_null(strstr(spmd_last_error(), "dropout: expects f32, got i32 [3]"));
    assert_null(ir_dropout(g, x, x, 0.5f, 0));
    assert_non_null(strstr(spmd_last_error(), "the step must be an f32 scalar, got f32 [2, 3]"));
    assert_null(spmd_graph_find(g, "rng.step")); /* a refused dropout makes no state */
    spmd_graph_free(g);

    g = spmd_graph_create(NULL);
    x = spmd_input(g, "rng.step", SPMD_F32, 2, (const int64_t[]){2, 3});
    assert_null(spmd_dropout(g, x, 0.5f));
    assert_non_null(strstr(spmd_last_error(), "already has a tensor named 'rng.step'"));
    spmd_graph_free(g);
}

/* where(cond, a, b) over broadcast triples, the condition a 0/1 mask in
 * f32 and in i32 (drawn ids below 2; some i32 values beyond 0 and 1 too). */
static void test_where(void **state)
{
    (void)state;
    static const struct {
        shape c, a, b;
    } cases[] = {
        {SH(3, 2, 3, 4), SH(3, 2, 3, 4), SH(3, 2, 3, 4)},
        {SH(2, 4, 5), SH(0), SH(2, 4, 5)},          /* masked_fill: a scalar fill */
        {SH(2, 4, 5), SH(2, 4, 5), SH(0)},
        {SH(2, 1, 5), SH(2, 4, 1), SH(1, 5)},       /* all three broadcast */
        {SH(0), SH(2, 3, 7), SH(2, 3, 7)},
        {SH(4, 1, 1, 9, 9), SH(4, 2, 3, 9, 9), SH(1, 9)}, /* a causal mask over heads */
        {SH(3, 2, 37, 50), SH(3, 2, 37, 50), SH(2, 37, 1)},
        {SH(0), SH(0), SH(0)},
    };
    for (int i32 = 0; i32 <= 1; i32++)
        for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
            opcase c;
            oc_init(&c, "where %s cond #%zu", i32 ? "i32" : "f32", i);
            spmd_tensor *cond;
            if (i32) {
                cond = oc_ids(&c, cases[i].c.rank, cases[i].c.dims, 3);
            } else {
                cond = oc_leaf(&c, SPMD_F32, cases[i].c.rank, cases[i].c.dims);
                float *m = c.val[0];
                for (int64_t k = 0; k < spmd_tensor_numel(cond); k++)
                    m[k] = (float)test_rng_int(&rng, 0, 1);
            }
            spmd_tensor *a = oc_input(&c, &cases[i].a, GEN_ANY);
            spmd_tensor *b = oc_input(&c, &cases[i].b, GEN_ANY);
            ref_where(oc_f(&c, 0), cases[i].c.dims, cases[i].c.rank, oc_f(&c, 1), cases[i].a.dims,
                      cases[i].a.rank, oc_f(&c, 2), cases[i].b.dims, cases[i].b.rank,
                      oc_expect(&c, spmd_where(c.g, cond, a, b)));
            oc_check(&c);
        }
}

/* The builders' refusals name the op, the cause and the shapes. */
static void test_new_op_errors(void **state)
{
    (void)state;
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_tensor *x = spmd_input(g, "x", SPMD_F32, 2, (const int64_t[]){4, 6});
    spmd_tensor *y = spmd_input(g, "y", SPMD_F32, 2, (const int64_t[]){4, 5});
    assert_null(spmd_where(g, x, x, y));
    assert_int_equal(spmd_graph_status(g), SPMD_ERR_SHAPE);
    if (!strstr(spmd_last_error(), "where: shapes do not broadcast: cond [4, 6], a [4, 6] and b [4, 5]"))
        fail_msg("where's shape error: %s", spmd_last_error());
    spmd_graph *h = spmd_graph_create(NULL);
    spmd_tensor *hx = spmd_input(h, "x", SPMD_F32, 1, (const int64_t[]){6});
    spmd_tensor *hi = spmd_input(h, "ids", SPMD_I32, 1, (const int64_t[]){6});
    assert_null(spmd_where(h, hx, hi, hx));
    if (!strstr(spmd_last_error(), "where: expects f32, got i32 [6]"))
        fail_msg("where's dtype error: %s", spmd_last_error());
    assert_null(spmd_silu(h, hi));
    assert_null(spmd_pow_scalar(h, NULL, 2.0f));
    assert_non_null(strstr(spmd_last_error(), "where")); /* the graph's first failure again */
    spmd_graph_free(h);
    /* An i32 condition is taken; NULL operands are named. */
    spmd_graph *k = spmd_graph_create(NULL);
    spmd_tensor *kx = spmd_input(k, "x", SPMD_F32, 2, (const int64_t[]){4, 6});
    spmd_tensor *ki = spmd_input(k, "ids", SPMD_I32, 1, (const int64_t[]){6});
    assert_non_null(spmd_where(k, ki, kx, kx));
    assert_null(spmd_where(k, ki, kx, NULL));
    if (!strstr(spmd_last_error(), "where: operand 2 is NULL"))
        fail_msg("where's NULL operand: %s", spmd_last_error());
    spmd_graph_free(k);
    spmd_graph_free(g);
}

/* ---- Reductions and row normalisations ------------------------------------------ */

/* Every mask (sum, mean) or axis (max) of each: a plain 3-D shape, a 4-D
 * one with a size-1 dim, columns past one 256-column chunk, one long row,
 * a reduced middle dim that is long, and size-1 dims only (one element). */
static const shape reduce_shapes[] = {
    SH(3, 3, 4, 5), SH(4, 2, 3, 1, 70), SH(2, 3, 300), SH(1, 700), SH(3, 2, 260, 3),
    SH(3, 5, 2, 300), SH(4, 1, 6, 1, 5), SH(2, 1, 1),
};

static void test_sum_mean(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        spmd_tensor *(*fn)(spmd_graph *, spmd_tensor *, uint32_t, bool);
        void (*ref)(const float *, const int64_t *, int, uint32_t, float *);
    } ops[] = {{"sum", spmd_sum, ref_sum}, {"mean", spmd_mean, ref_mean}};
    for (size_t k = 0; k < ARRAY_LEN(ops); k++)
        for (size_t i = 0; i < ARRAY_LEN(reduce_shapes); i++) {
            const shape *s = &reduce_shapes[i];
            for (uint32_t axes = 1; axes < (1u << s->rank); axes++)
                for (int keep = 0; keep < 2; keep++) {
                    opcase c;
                    oc_init(&c, "%s #%zu axes 0x%x keepdim %d", ops[k].name, i, axes, keep);
                    spmd_tensor *x = oc_input(&c, s, GEN_ANY);
                    ops[k].ref(oc_f(&c, 0), s->dims, s->rank, axes,
                               oc_expect(&c, ops[k].fn(c.g, x, axes, keep)));
                    oc_check(&c);
                }
        }
}

static void test_max(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(reduce_shapes); i++) {
        const shape *s = &reduce_shapes[i];
        for (int axis = 0; axis < s->rank; axis++)
            for (int keep = 0; keep < 2; keep++) {
                opcase c;
                oc_init(&c, "max #%zu axis %d keepdim %d", i, axis, keep);
                spmd_tensor *x = oc_input(&c, s, GEN_WIDE);
                ref_max(oc_f(&c, 0), s->dims, s->rank, axis,
                        oc_expect(&c, spmd_max(c.g, x, axis, keep)));
                oc_check(&c);
            }
    }
}

/* Every axis of the reduction shapes, both directions: each element's
 * sum is the reference's, in the same order (exactly equal). */
static void test_cumsum(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(reduce_shapes); i++) {
        const shape *s = &reduce_shapes[i];
        for (int axis = 0; axis < s->rank; axis++)
            for (int reverse = 0; reverse < 2; reverse++) {
                opcase c;
                oc_init(&c, "cumsum #%zu axis %d reverse %d", i, axis, reverse);
                spmd_tensor *x = oc_input(&c, s, GEN_ANY);
                ref_cumsum(oc_f(&c, 0), s->dims, s->rank, axis, reverse,
                           oc_expect(&c, spmd_cumsum(c.g, x, axis, reverse)));
                oc_check(&c);
            }
    }
}

/* NaN passes through relu, and the first NaN along the axis is max. */
static void test_nan(void **state)
{
    (void)state;
    static const shape shapes[] = {SH(3, 3, 4, 5), SH(2, 7, 70), SH(3, 2, 300, 2)};
    for (size_t i = 0; i < ARRAY_LEN(shapes); i++) {
        const shape *s = &shapes[i];
        opcase c;
        oc_init(&c, "relu with NaNs #%zu", i);
        spmd_tensor *x = oc_input(&c, s, GEN_NAN);
        ref_unary(REF_RELU, oc_f(&c, 0), spmd_tensor_numel(x), 0.0f,
                  oc_expect(&c, spmd_relu(c.g, x)));
        oc_check(&c);
        for (int axis = 0; axis < s->rank; axis++) {
            oc_init(&c, "max with NaNs #%zu axis %d", i, axis);
            x = oc_input(&c, s, GEN_NAN);
            ref_max(oc_f(&c, 0), s->dims, s->rank, axis,
                    oc_expect(&c, spmd_max(c.g, x, axis, false)));
            oc_check(&c);
        }
    }
}

static void test_softmax(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        spmd_tensor *(*fn)(spmd_graph *, spmd_tensor *);
        void (*ref)(const float *, const int64_t *, int, float *);
    } ops[] = {{"softmax", spmd_softmax, ref_softmax},
               {"log_softmax", spmd_log_softmax, ref_log_softmax}};
    static const shape shapes[] = {SH(1, 6), SH(3, 3, 5, 7), SH(2, 4, 100), SH(2, 2, 1),
                                   SH(4, 2, 3, 1, 33)};
    for (size_t k = 0; k < ARRAY_LEN(ops); k++)
        for (size_t i = 0; i < ARRAY_LEN(shapes); i++) {
            opcase c;
            oc_init(&c, "%s #%zu", ops[k].name, i);
            spmd_tensor *x = oc_input(&c, &shapes[i], GEN_WIDE);
            ops[k].ref(oc_f(&c, 0), shapes[i].dims, shapes[i].rank,
                       oc_expect(&c, ops[k].fn(c.g, x)));
            oc_check(&c);
        }
}

static void test_layernorm(void **state)
{
    (void)state;
    static const shape shapes[] = {SH(3, 2, 3, 6), SH(2, 4, 5), SH(2, 7, 129), SH(2, 3, 1),
                                   SH(1, 40)};
    for (size_t i = 0; i < ARRAY_LEN(shapes); i++) {
        const shape *s = &shapes[i];
        const shape d = SH(1, s->dims[s->rank - 1]);
        opcase c;
        oc_init(&c, "layernorm #%zu", i);
        spmd_tensor *x = oc_input(&c, s, GEN_WIDE);
        spmd_tensor *gamma = oc_input(&c, &d, GEN_ANY);
        spmd_tensor *beta = oc_input(&c, &d, GEN_ANY);
        ref_layernorm(oc_f(&c, 0), s->dims, s->rank, oc_f(&c, 1), oc_f(&c, 2), 1e-5f,
                      oc_expect(&c, spmd_layernorm(c.g, x, gamma, beta, 1e-5f)));
        oc_check(&c);
    }
}

/* ---- Pooling ------------------------------------------------------------------------ */

typedef struct pool_case {
    shape x;
    spmd_pool2d pool;
} pool_case;

/* torch's NCHW pools: ResNet's stem (3x3, stride 2, padding 1), the
 * defaults (stride the kernel), MaxPool1d's [N, C, 1, L], rank 3,
 * ceil_mode (a last window over the padding, or past it), dilation (max
 * only), a window wider than the stride, and divisor_override. */
static const pool_case max_cases[] = {
    {SH(4, 2, 3, 12, 13), {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}}},
    {SH(4, 2, 3, 7, 5), {.kernel = {2, 2}}},
    {SH(4, 2, 3, 1, 11), {.kernel = {1, 3}, .stride = {1, 2}, .padding = {0, 1}, .ceil_mode = true}},
    {SH(3, 4, 9, 8),
     {.kernel = {3, 2}, .stride = {2, 1}, .padding = {1, 1}, .dilation = {1, 2}, .ceil_mode = true}},
    {SH(4, 1, 2, 10, 9), {.kernel = {4, 3}, .stride = {3, 2}, .padding = {2, 1}, .dilation = {2, 3}}},
    {SH(4, 3, 5, 6, 6), {.kernel = {5, 5}, .stride = {1, 1}, .padding = {2, 2}}},
};

static const pool_case avg_cases[] = {
    {SH(4, 2, 3, 12, 13),
     {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}, .count_include_pad = true}},
    {SH(4, 2, 3, 12, 13), {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}}},
    {SH(4, 2, 3, 7, 5), {.kernel = {2, 2}, .ceil_mode = true, .count_include_pad = true}},
    {SH(4, 2, 3, 7, 5), {.kernel = {3, 2}, .stride = {2, 2}, .padding = {1, 0}, .ceil_mode = true}},
    {SH(3, 4, 9, 8), {.kernel = {2, 3}, .stride = {1, 2}, .padding = {1, 1}, .divisor_override = 5}},
    {SH(4, 2, 3, 1, 11),
     {.kernel = {1, 4}, .stride = {1, 3}, .padding = {0, 2}, .ceil_mode = true,
      .count_include_pad = true}},
    {SH(4, 3, 5, 6, 6), {.kernel = {5, 5}, .stride = {1, 1}, .padding = {2, 2}}},
};

/* The reference's form of a case's window: stride and dilation given. */
static ref_pool ref_pool_of(const spmd_pool2d *p)
{
    ref_pool r = {.ceil_mode = p->ceil_mode, .count_include_pad = p->count_include_pad,
                  .divisor_override = p->divisor_override};
    for (int d = 0; d < 2; d++) {
        r.kernel[d] = p->kernel[d];
        r.stride[d] = p->stride[d] ? p->stride[d] : p->kernel[d];
        r.padding[d] = p->padding[d];
        r.dilation[d] = p->dilation[d] ? p->dilation[d] : 1;
    }
    return r;
}

/* x's shape pooled by r. */
static shape pooled_shape(const shape *x, const ref_pool *r)
{
    shape s = *x;
    s.dims[s.rank - 2] = ref_pool_out(r, 0, x->dims[x->rank - 2]);
    s.dims[s.rank - 1] = ref_pool_out(r, 1, x->dims[x->rank - 1]);
    return s;
}

/* Values with many ties (0, 1 and 2), so that the first maximum matters. */
static spmd_tensor *tied_input(opcase *c, const shape *s)
{
    spmd_tensor *t = oc_input(c, s, GEN_ANY);
    float *v = c->val[c->n - 1];
    for (int64_t i = 0; i < spmd_tensor_numel(t); i++) v[i] = (float)test_rng_int(&rng, 0, 2);
    return t;
}

enum { POOL_PLAIN, POOL_TIED, POOL_NAN, POOL_VALUES };
static const char *const pool_values[POOL_VALUES] = {"", ", tied", ", NaNs"};

static spmd_tensor *pool_input(opcase *c, const shape *s, int values)
{
    if (values == POOL_TIED) return tied_input(c, s);
    return oc_input(c, s, values == POOL_NAN ? GEN_NAN : GEN_WIDE);
}

/* max_pool2d and its backward against the reference: drawn values, ties
 * (the gradient goes to the first maximum in row-major order) and NaNs. */
static void test_max_pool2d(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(max_cases); i++)
        for (int values = 0; values < POOL_VALUES; values++) {
            const pool_case *pc = &max_cases[i];
            ref_pool r = ref_pool_of(&pc->pool);
            shape ys = pooled_shape(&pc->x, &r);
            opcase c;
            oc_init(&c, "max_pool2d #%zu%s", i, pool_values[values]);
            spmd_tensor *x = pool_input(&c, &pc->x, values);
            ref_max_pool2d(oc_f(&c, 0), pc->x.dims, pc->x.rank, &r,
                           oc_expect(&c, spmd_max_pool2d(c.g, x, &pc->pool)));
            oc_check(&c);

            oc_init(&c, "max_pool2d_backward #%zu%s", i, pool_values[values]);
            x = pool_input(&c, &pc->x, values);
            spmd_tensor *dy = oc_input(&c, &ys, GEN_ANY);
            ref_max_pool2d_backward(oc_f(&c, 0), pc->x.dims, pc->x.rank, &r, oc_f(&c, 1),
                                    oc_expect(&c, ir_max_pool2d_backward(c.g, x, dy, &pc->pool)));
            oc_check(&c);
        }
}

static void test_avg_pool2d(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(avg_cases); i++) {
        const pool_case *pc = &avg_cases[i];
        ref_pool r = ref_pool_of(&pc->pool);
        shape ys = pooled_shape(&pc->x, &r);
        opcase c;
        oc_init(&c, "avg_pool2d #%zu", i);
        spmd_tensor *x = oc_input(&c, &pc->x, GEN_WIDE);
        ref_avg_pool2d(oc_f(&c, 0), pc->x.dims, pc->x.rank, &r,
                       oc_expect(&c, spmd_avg_pool2d(c.g, x, &pc->pool)));
        oc_check(&c);

        oc_init(&c, "avg_pool2d_backward #%zu", i);
        spmd_tensor *dy = oc_input(&c, &ys, GEN_ANY);
        int64_t h = pc->x.dims[pc->x.rank - 2], w = pc->x.dims[pc->x.rank - 1];
        ref_avg_pool2d_backward(oc_f(&c, 0), pc->x.dims, pc->x.rank, &r,
                                oc_expect(&c, ir_avg_pool2d_backward(c.g, dy, h, w, &pc->pool)));
        oc_check(&c);
    }
}

/* Adaptive windows: uneven (7 rows to 2), one output (the mean), the
 * identity, more outputs than inputs, rank 3, and a large plane. */
static void test_adaptive_avg_pool2d(void **state)
{
    (void)state;
    static const struct {
        shape x;
        int64_t oh, ow;
    } cases[] = {
        {SH(4, 2, 3, 7, 5), 2, 3}, {SH(4, 2, 3, 7, 5), 1, 1}, {SH(4, 2, 3, 7, 5), 7, 5},
        {SH(4, 2, 3, 7, 5), 4, 7}, {SH(3, 4, 9, 8), 4, 3},    {SH(4, 1, 2, 33, 40), 3, 5},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        const shape *xs = &cases[i].x;
        shape ys = *xs;
        ys.dims[ys.rank - 2] = cases[i].oh;
        ys.dims[ys.rank - 1] = cases[i].ow;
        opcase c;
        oc_init(&c, "adaptive_avg_pool2d #%zu", i);
        spmd_tensor *x = oc_input(&c, xs, GEN_WIDE);
        ref_adaptive_avg_pool2d(oc_f(&c, 0), xs->dims, xs->rank, cases[i].oh, cases[i].ow,
                                oc_expect(&c, spmd_adaptive_avg_pool2d(c.g, x, cases[i].oh,
                                                                       cases[i].ow)));
        oc_check(&c);

        oc_init(&c, "adaptive_avg_pool2d_backward #%zu", i);
        spmd_tensor *dy = oc_input(&c, &ys, GEN_ANY);
        int64_t h = xs->dims[xs->rank - 2], w = xs->dims[xs->rank - 1];
        ref_adaptive_avg_pool2d_backward(oc_f(&c, 0), xs->dims, xs->rank, cases[i].oh, cases[i].ow,
                                         oc_expect(&c, ir_adaptive_avg_pool2d_backward(c.g, dy, h, w)));
        oc_check(&c);
    }
}

/* The pooling builders' refusals name the op, the cause and the shapes
 * or sizes on both sides. */
static void test_pool_errors(void **state)
{
    (void)state;
    static const struct {
        int rank;
        int64_t dims[4];
        spmd_pool2d pool;
        bool max;
        const char *message;
    } cases[] = {
        {2, {7, 5}, {.kernel = {2, 2}}, true, "max_pool2d: needs [N, C, H, W] or [C, H, W]: [7, 5]"},
        {4, {1, 2, 7, 5}, {.kernel = {3, 3}, .padding = {2, 1}}, true,
         "max_pool2d: padding 2 over the rows is more than half the kernel 3"},
        {4, {1, 2, 7, 5}, {.kernel = {3, 0}}, false, "avg_pool2d: kernel 0, stride 0, dilation 1 "
                                                      "over the columns: each must be positive"},
        {4, {1, 2, 7, 5}, {.kernel = {2, 2}, .dilation = {1, 2}}, false,
         "avg_pool2d: dilation 2 over the columns; average pooling takes adjacent positions"},
        {4, {1, 2, 7, 5}, {.kernel = {2, 2}, .divisor_override = 3}, true,
         "max_pool2d: divisor_override 3; only average pooling divides"},
        {4, {1, 2, 7, 2}, {.kernel = {3, 3}}, true,
         "max_pool2d: a window of 3 columns (dilation 1, padding 0) does not fit in the input's 2 "
         "columns"},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        spmd_graph *g = spmd_graph_create(NULL);
        spmd_tensor *x = spmd_input(g, "x", SPMD_F32, cases[i].rank, cases[i].dims);
        spmd_tensor *y = cases[i].max ? spmd_max_pool2d(g, x, &cases[i].pool)
                                      : spmd_avg_pool2d(g, x, &cases[i].pool);
        assert_null(y);
        if (!strstr(spmd_last_error(), cases[i].message))
            fail_msg("pool error #%zu: %s\n  want: %s", i, spmd_last_error(), cases[i].message);
        spmd_graph_free(g);
    }
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_tensor *x = spmd_input(g, "x", SPMD_F32, 4, (const int64_t[]){2, 3, 7, 5});
    spmd_tensor *dy = spmd_input(g, "dy", SPMD_F32, 4, (const int64_t[]){2, 3, 4, 4});
    const spmd_pool2d p = {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}};
    assert_null(ir_max_pool2d_backward(g, x, dy, &p));
    if (!strstr(spmd_last_error(), "max_pool2d_backward: the gradient [2, 3, 4, 4] is not the "
                                   "input [2, 3, 7, 5] pooled (to 4 rows and 3 columns)"))
        fail_msg("max_pool2d_backward's shape error: %s", spmd_last_error());
    assert_null(spmd_adaptive_avg_pool2d(g, x, 0, 3));
    if (!strstr(spmd_last_error(), "adaptive_avg_pool2d: output size 0x3 for [2, 3, 7, 5]"))
        fail_msg("adaptive_avg_pool2d's size error: %s", spmd_last_error());
    spmd_graph_free(g);
}

/* Batch normalisation over [N, C] (a row of 300 channels crosses the
 * kernels' chunks of 256), [N, C, L], NCHW and NCDHW: the variance around
 * a given mean, training mode (x's batch statistics), evaluation mode
 * (given statistics), without weight and bias too. */
static void test_batch_norm(void **state)
{
    (void)state;
    static const shape shapes[] = {SH(2, 4, 3), SH(2, 5, 300), SH(3, 2, 3, 5), SH(4, 2, 3, 4, 5),
                                   SH(5, 2, 4, 1, 1, 3), SH(3, 1, 2, 1)};
    for (size_t i = 0; i < ARRAY_LEN(shapes); i++) {
        const shape *s = &shapes[i];
        const shape ch = SH(1, s->dims[1]);
        opcase c;
        oc_init(&c, "batch_norm_var #%zu", i);
        spmd_tensor *x = oc_input(&c, s, GEN_WIDE);
        spmd_tensor *mean = oc_input(&c, &ch, GEN_ANY);
        ref_batch_norm_var(oc_f(&c, 0), s->dims, s->rank, oc_f(&c, 1),
                           oc_expect(&c, spmd_batch_norm_var(c.g, x, mean)));
        oc_check(&c);

        oc_init(&c, "batch_norm training #%zu", i);
        x = oc_input(&c, s, GEN_WIDE);
        spmd_tensor *w = oc_input(&c, &ch, GEN_ANY), *b = oc_input(&c, &ch, GEN_ANY), *var;
        assert_int_equal(spmd_batch_norm_stats(c.g, x, &mean, &var), SPMD_OK);
        ref_batch_norm(oc_f(&c, 0), s->dims, s->rank, NULL, NULL, oc_f(&c, 1), oc_f(&c, 2), 1e-5f,
                       oc_expect(&c, spmd_batch_norm(c.g, x, mean, var, w, b, 1e-5f)));
        oc_check(&c);

        oc_init(&c, "batch_norm evaluation #%zu", i);
        x = oc_input(&c, s, GEN_WIDE);
        mean = oc_input(&c, &ch, GEN_ANY);
        var = oc_input(&c, &ch, GEN_POS);
        float *ones = xmalloc((size_t)s->dims[1] * sizeof *ones);
        float *zeros = xmalloc((size_t)s->dims[1] * sizeof *zeros);
        for (int64_t k = 0; k < s->dims[1]; k++) ones[k] = 1.0f, zeros[k] = 0.0f;
        ref_batch_norm(oc_f(&c, 0), s->dims, s->rank, oc_f(&c, 1), oc_f(&c, 2), ones, zeros, 1e-3f,
                       oc_expect(&c, spmd_batch_norm(c.g, x, mean, var, NULL, NULL, 1e-3f)));
        oc_check(&c);
        free(ones);
        free(zeros);
    }
}

/* ---- Linear algebra and attention ------------------------------------------------ */

typedef struct mm_case {
    shape a, b;
    bool ta, tb;
} mm_case;

static void check_products(const char *name, const mm_case *cases, size_t n,
                           spmd_tensor *(*fn)(spmd_graph *, spmd_tensor *, spmd_tensor *, bool,
                                              bool),
                           void (*ref)(const float *, const int64_t *, int, const float *,
                                       const int64_t *, int, bool, bool, float *))
{
    for (size_t i = 0; i < n; i++) {
        const mm_case *m = &cases[i];
        opcase c;
        oc_init(&c, "%s #%zu (ta %d, tb %d)", name, i, m->ta, m->tb);
        spmd_tensor *a = oc_input(&c, &m->a, GEN_ANY);
        spmd_tensor *b = oc_input(&c, &m->b, GEN_ANY);
        ref(oc_f(&c, 0), m->a.dims, m->a.rank, oc_f(&c, 1), m->b.dims, m->b.rank, m->ta, m->tb,
            oc_expect(&c, fn(c.g, a, b, m->ta, m->tb)));
        oc_check(&c);
    }
}

static void test_matmul(void **state)
{
    (void)state;
    static const mm_case cases[] = {
        /* a [L..., K] x b [K, N] */
        {SH(2, 3, 4), SH(2, 4, 5), false, false},
        {SH(3, 2, 3, 4), SH(2, 4, 5), false, false},
        {SH(4, 2, 2, 3, 4), SH(2, 4, 5), false, false},
        {SH(2, 130, 33), SH(2, 33, 70), false, false},   /* several GEMM tiles */
        {SH(3, 2, 65, 16), SH(2, 16, 70), false, false},
        /* a [L..., K] x b [N, K]^T */
        {SH(2, 3, 4), SH(2, 5, 4), false, true},
        {SH(3, 2, 3, 4), SH(2, 5, 4), false, true},
        {SH(2, 130, 24), SH(2, 70, 24), false, true},
        {SH(3, 3, 67, 9), SH(2, 80, 9), false, true},
        /* a [L..., M]^T x b [L..., N], contracting every L */
        {SH(2, 3, 4), SH(2, 3, 5), true, false},
        {SH(3, 2, 3, 4), SH(3, 2, 3, 5), true, false},
        {SH(4, 2, 2, 3, 4), SH(4, 2, 2, 3, 5), true, false},
        {SH(3, 2, 40, 70), SH(3, 2, 40, 66), true, false},
        {SH(2, 60, 130), SH(2, 60, 9), true, false},
        /* a [K, M]^T x b [N, K]^T */
        {SH(2, 4, 3), SH(2, 5, 4), true, true},
        {SH(2, 20, 70), SH(2, 130, 20), true, true},
    };
    check_products("matmul", cases, ARRAY_LEN(cases), spmd_matmul, ref_matmul);
}

static void test_bmm(void **state)
{
    (void)state;
    static const mm_case cases[] = {
        {SH(3, 2, 3, 4), SH(3, 2, 4, 5), false, false},
        {SH(3, 2, 3, 4), SH(3, 2, 5, 4), false, true},
        {SH(3, 2, 4, 3), SH(3, 2, 4, 5), true, false},
        {SH(3, 2, 4, 3), SH(3, 2, 5, 4), true, true},
        {SH(4, 2, 3, 5, 4), SH(4, 2, 3, 4, 6), false, false},
        {SH(4, 2, 3, 5, 4), SH(4, 2, 3, 6, 4), false, true},
        {SH(4, 2, 3, 4, 5), SH(4, 2, 3, 4, 6), true, false},
        {SH(4, 2, 3, 4, 5), SH(4, 2, 3, 6, 4), true, true},
        {SH(3, 3, 70, 20), SH(3, 3, 20, 66), false, false},
        {SH(3, 2, 130, 16), SH(3, 2, 70, 16), false, true},
        {SH(3, 1, 24, 130), SH(3, 1, 24, 70), true, false},
    };
    check_products("bmm", cases, ARRAY_LEN(cases), spmd_bmm, ref_bmm);
}

static void test_attention(void **state)
{
    (void)state;
    /* 1, 2 and 4 heads; T below, at and across the 64-row query blocks. */
    static const struct {
        int64_t B, T, C;
        int heads;
    } cases[] = {
        {2, 4, 8, 1},   {2, 4, 8, 2},   {1, 5, 8, 4},    {1, 1, 4, 4},  {1, 64, 16, 2},
        {2, 70, 16, 1}, {1, 70, 32, 2}, {2, 70, 12, 4},  {1, 130, 8, 1}, {1, 130, 32, 2},
        {2, 130, 32, 4}, {3, 65, 12, 4},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        const shape s = SH(3, cases[i].B, cases[i].T, cases[i].C);
        opcase c;
        oc_init(&c, "attention #%zu, %d head(s)", i, cases[i].heads);
        spmd_tensor *q = oc_input(&c, &s, GEN_ANY);
        spmd_tensor *k = oc_input(&c, &s, GEN_ANY);
        spmd_tensor *v = oc_input(&c, &s, GEN_ANY);
        ref_attention(oc_f(&c, 0), oc_f(&c, 1), oc_f(&c, 2), s.dims[0], s.dims[1], s.dims[2],
                      cases[i].heads, oc_expect(&c, spmd_attention(c.g, q, k, v, cases[i].heads)));
        oc_check(&c);
    }
}

/* conv2d and its two backward ops against the reference's loops: strides,
 * padding (some rows all padding), dilation, groups (depthwise included),
 * pointwise (1x1, the GEMM on the image itself, and strided), a patch
 * embedding's kernel as large as its stride, an im2col matrix past one
 * tile of columns (16 channels of 90 x 90: two tiles), and small images
 * several to a GEMM (conv_plan's imgs: most cases here), the batch's last
 * set shorter (3 x 3 outputs 15 to a GEMM, 20 images; 1 x 1 outputs, 130
 * images, grouped and pointwise). */
static const ref_conv conv_cases[] = {
    {.x = {2, 3, 6, 7}, .w = {4, 3, 3, 3}, .stride = {1, 1}, .pad = {1, 1}, .dilation = {1, 1}, .groups = 1},
    {.x = {2, 4, 9, 8}, .w = {6, 4, 3, 2}, .stride = {2, 3}, .pad = {1, 2}, .dilation = {2, 1}, .groups = 1},
    {.x = {1, 4, 5, 5}, .w = {6, 2, 3, 3}, .stride = {1, 1}, .pad = {0, 1}, .dilation = {1, 1}, .groups = 2},
    {.x = {2, 6, 7, 7}, .w = {6, 1, 3, 3}, .stride = {2, 2}, .pad = {1, 1}, .dilation = {1, 1}, .groups = 6},
    {.x = {3, 5, 4, 6}, .w = {7, 5, 1, 1}, .stride = {1, 1}, .pad = {0, 0}, .dilation = {1, 1}, .groups = 1},
    {.x = {2, 4, 5, 5}, .w = {3, 4, 1, 1}, .stride = {2, 2}, .pad = {0, 0}, .dilation = {1, 1}, .groups = 1},
    {.x = {2, 3, 32, 32}, .w = {8, 3, 16, 16}, .stride = {16, 16}, .pad = {0, 0}, .dilation = {1, 1}, .groups = 1},
    {.x = {1, 2, 3, 3}, .w = {3, 2, 2, 2}, .stride = {2, 1}, .pad = {3, 2}, .dilation = {1, 2}, .groups = 1},
    {.x = {1, 16, 90, 90}, .w = {4, 16, 3, 3}, .stride = {1, 1}, .pad = {1, 1}, .dilation = {1, 1}, .groups = 1},
    {.x = {20, 3, 5, 5}, .w = {4, 3, 3, 3}, .stride = {2, 2}, .pad = {1, 1}, .dilation = {1, 1}, .groups = 1},
    {.x = {130, 4, 1, 1}, .w = {6, 2, 3, 3}, .stride = {1, 1}, .pad = {1, 1}, .dilation = {1, 1}, .groups = 2},
    {.x = {130, 3, 1, 1}, .w = {5, 3, 1, 1}, .stride = {1, 1}, .pad = {0, 0}, .dilation = {1, 1}, .groups = 1},
};

/* conv2d's refusals name both tensors of a mismatch, and the attribute. */
static void test_conv2d_errors(void **state)
{
    (void)state;
    static const struct {
        int64_t x[4], w[4];
        spmd_conv2d_options o;
        const char *want;
    } cases[] = {
        {{2, 6, 5, 5}, {4, 4, 3, 3}, {.groups = 2},
         "conv2d: w 'w' [4, 4, 3, 3] has 4 input channels per group, x 'x' [2, 6, 5, 5] has 3 "
         "(Cin 6 over 2 groups)"},
        {{2, 6, 5, 5}, {4, 2, 3, 3}, {.groups = 3},
         "conv2d: 3 groups do not divide the input channels of x 'x' [2, 6, 5, 5] (Cin 6) or "
         "the output channels of w 'w' [4, 2, 3, 3] (Cout 4)"},
        {{1, 2, 4, 4}, {3, 2, 3, 3}, {.dilation = {1, 2}},
         "conv2d: the kernel of w 'w' [3, 2, 3, 3] spans 5 columns (dilation 2), more than the "
         "4 of x 'x' [1, 2, 4, 4] padded by 0"},
        {{1, 2, 4, 4}, {3, 2, 3, 3}, {.stride = {-1, 1}},
         "conv2d: stride -1, padding 0, dilation 0 over the rows; none may be negative"},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        spmd_graph *g = spmd_graph_create(NULL);
        spmd_tensor *x = spmd_input(g, "x", SPMD_F32, 4, cases[i].x);
        spmd_tensor *w = spmd_input(g, "w", SPMD_F32, 4, cases[i].w);
        assert_null(spmd_conv2d(g, x, w, &cases[i].o));
        if (!strstr(spmd_last_error(), cases[i].want))
            fail_msg("conv2d refusal #%zu: %s\n  want: %s", i, spmd_last_error(), cases[i].want);
        spmd_graph_free(g);
    }
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_tensor *x3 = spmd_input(g, "x", SPMD_F32, 3, (const int64_t[]){2, 3, 5});
    spmd_tensor *w = spmd_input(g, "w", SPMD_F32, 4, (const int64_t[]){4, 3, 3, 3});
    assert_null(spmd_conv2d(g, x3, w, NULL));
    if (!strstr(spmd_last_error(), "conv2d: x [N, Cin, H, W] must be 4-D, got 'x' [2, 3, 5]"))
        fail_msg("conv2d's rank error: %s", spmd_last_error());
    spmd_graph_free(g);
}

static void test_conv2d(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(conv_cases); i++) {
        ref_conv rc = conv_cases[i];
        ref_conv_shape(&rc);
        const shape xs = SH(4, rc.x[0], rc.x[1], rc.x[2], rc.x[3]);
        const shape ws = SH(4, rc.w[0], rc.w[1], rc.w[2], rc.w[3]);
        const shape ys = SH(4, rc.y[0], rc.y[1], rc.y[2], rc.y[3]);
        const ir_conv attr = {.stride = {rc.stride[0], rc.stride[1]},
                              .pad = {rc.pad[0], rc.pad[1]},
                              .dilation = {rc.dilation[0], rc.dilation[1]},
                              .groups = rc.groups};
        const spmd_conv2d_options opts = {.stride = {rc.stride[0], rc.stride[1]},
                                          .padding = {rc.pad[0], rc.pad[1]},
                                          .dilation = {rc.dilation[0], rc.dilation[1]},
                                          .groups = rc.groups};
        opcase c;
        oc_init(&c, "conv2d #%zu, %d group(s)", i, rc.groups);
        spmd_tensor *x = oc_input(&c, &xs, GEN_ANY), *w = oc_input(&c, &ws, GEN_ANY);
        ref_conv2d(&rc, oc_f(&c, 0), oc_f(&c, 1), oc_expect(&c, spmd_conv2d(c.g, x, w, &opts)));
        oc_check(&c);

        oc_init(&c, "conv2d_backward_input #%zu", i);
        spmd_tensor *dy = oc_input(&c, &ys, GEN_ANY);
        w = oc_input(&c, &ws, GEN_ANY);
        ref_conv2d_backward_input(&rc, oc_f(&c, 0), oc_f(&c, 1),
                                  oc_expect(&c, ir_conv2d_backward_input(c.g, dy, w, rc.x, &attr)));
        oc_check(&c);

        oc_init(&c, "conv2d_backward_weight #%zu", i);
        x = oc_input(&c, &xs, GEN_ANY);
        dy = oc_input(&c, &ys, GEN_ANY);
        ref_conv2d_backward_weight(&rc, oc_f(&c, 0), oc_f(&c, 1),
                                   oc_expect(&c, ir_conv2d_backward_weight(c.g, x, dy, rc.w, &attr)));
        oc_check(&c);
    }
}

/* Decoding: T new rows at a drawn position of a cache of S rows.  T across
 * the 64-row query blocks, T = S (the whole cache: plain causal attention),
 * and one row, decoding's usual case. */
typedef struct cache_case {
    int64_t B, T, S, C;
    int heads;
} cache_case;

static const cache_case cache_cases[] = {
    {1, 1, 1, 4, 1},  {2, 1, 9, 8, 2},   {3, 1, 40, 12, 4}, {2, 3, 10, 8, 4},
    {1, 70, 70, 8, 2}, {2, 66, 140, 16, 2}, {1, 5, 5, 6, 3},  {2, 1, 130, 32, 1},
};

static void test_cache_write(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(cache_cases); i++) {
        const cache_case *k = &cache_cases[i];
        const shape cache = SH(3, k->B, k->S, k->C), rows = SH(3, k->B, k->T, k->C);
        opcase c;
        oc_init(&c, "cache_write #%zu", i);
        spmd_tensor *x = oc_input(&c, &cache, GEN_ANY);
        spmd_tensor *r = oc_input(&c, &rows, GEN_ANY);
        spmd_tensor *pos = oc_ids(&c, 1, (const int64_t[]){1}, (int32_t)(k->S - k->T + 1));
        ref_cache_write(oc_f(&c, 0), oc_f(&c, 1), k->B, k->S, k->T, k->C, oc_i(&c, 2)[0],
                        oc_expect(&c, spmd_cache_write(c.g, x, r, pos)));
        oc_check(&c);
    }
}

static void test_cached_attention(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(cache_cases); i++) {
        const cache_case *k = &cache_cases[i];
        const shape q = SH(3, k->B, k->T, k->C), kv = SH(3, k->B, k->S, k->C);
        opcase c;
        oc_init(&c, "cached_attention #%zu, %d head(s)", i, k->heads);
        spmd_tensor *qt = oc_input(&c, &q, GEN_ANY);
        spmd_tensor *kt = oc_input(&c, &kv, GEN_ANY);
        spmd_tensor *vt = oc_input(&c, &kv, GEN_ANY);
        spmd_tensor *pos = oc_ids(&c, 1, (const int64_t[]){1}, (int32_t)(k->S - k->T + 1));
        spmd_tensor *y = spmd_cached_attention(c.g, qt, kt, vt, pos, k->heads);
        ref_cached_attention(oc_f(&c, 0), oc_f(&c, 1), oc_f(&c, 2), k->B, k->T, k->S, k->C,
                             k->heads, oc_i(&c, 3)[0], oc_expect(&c, y));
        oc_check(&c);
    }
}

/* ---- Lookups and losses ------------------------------------------------------------ */

/* The result of case c: embedding of inputs table [V, D] and ids. */
static void expect_embedding(opcase *c, int table_at, int ids_at)
{
    spmd_tensor *table = c->in[table_at], *ids = c->in[ids_at];
    spmd_tensor *y = spmd_embedding(c->g, table, ids);
    int64_t V = spmd_tensor_dim(table, 0), D = spmd_tensor_dim(table, 1);
    int64_t bad = ref_embedding(oc_f(c, table_at), V, D, oc_i(c, ids_at),
                                spmd_tensor_numel(ids), oc_expect(c, y));
    assert_int_equal(bad, -1);
}

static void test_embedding(void **state)
{
    (void)state;
    static const struct {
        int64_t V, D;
        shape ids;
    } cases[] = {
        {10, 6, SH(2, 2, 3)}, {7, 33, SH(1, 15)}, {50, 8, SH(2, 4, 25)},
        {5, 3, SH(0)},        {3, 4, SH(3, 2, 2, 2)},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        const shape tab = SH(2, cases[i].V, cases[i].D);
        opcase c;
        oc_init(&c, "embedding #%zu", i);
        oc_input(&c, &tab, GEN_ANY);
        oc_ids(&c, cases[i].ids.rank, cases[i].ids.dims, (int32_t)tab.dims[0]);
        expect_embedding(&c, 0, 1);
        oc_check(&c);
    }
}

/* The result of case c: cross_entropy of logits [..., V] (with these
 * values; not necessarily an input) against input `targets_at`. */
static void expect_cross_entropy(opcase *c, spmd_tensor *logits, const float *logit_values,
                                 int targets_at)
{
    spmd_tensor *targets = c->in[targets_at];
    spmd_tensor *y = spmd_cross_entropy(c->g, logits, targets);
    int64_t V = spmd_tensor_dim(logits, spmd_tensor_rank(logits) - 1), bad = 0;
    *oc_expect(c, y) = ref_cross_entropy(logit_values, spmd_tensor_numel(targets), V,
                                         oc_i(c, targets_at), &bad);
    assert_int_equal(bad, -1);
}

static void test_cross_entropy(void **state)
{
    (void)state;
    static const shape logits[] = {SH(2, 4, 7), SH(3, 2, 3, 5), SH(3, 3, 20, 37), SH(2, 1, 2),
                                   SH(2, 130, 64), SH(1, 9)};
    for (size_t i = 0; i < ARRAY_LEN(logits); i++) {
        const shape *s = &logits[i];
        opcase c;
        oc_init(&c, "cross_entropy #%zu", i);
        spmd_tensor *x = oc_input(&c, s, GEN_WIDE);
        oc_ids(&c, s->rank - 1, s->dims, (int32_t)s->dims[s->rank - 1]);
        expect_cross_entropy(&c, x, oc_f(&c, 0), 1);
        oc_check(&c);
    }
}

static void test_mse(void **state)
{
    (void)state;
    static const shape shapes[] = {SH(2, 3, 4), SH(1, 5), SH(3, 7, 13, 3), SH(0)};
    for (size_t i = 0; i < ARRAY_LEN(shapes); i++) {
        opcase c;
        oc_init(&c, "mse #%zu", i);
        spmd_tensor *a = oc_input(&c, &shapes[i], GEN_ANY);
        spmd_tensor *b = oc_input(&c, &shapes[i], GEN_ANY);
        *oc_expect(&c, spmd_mse(c.g, a, b)) =
            ref_mse(oc_f(&c, 0), oc_f(&c, 1), spmd_tensor_numel(a));
        oc_check(&c);
    }
}

/* ---- Layout ------------------------------------------------------------------------- */

/* Layout ops move raw elements of any dtype, so every case runs on f32
 * values and on i32 ids.  The ids are read back through an embedding of a
 * [LAYOUT_IDS, 1] table whose row i holds i: the result is the moved ids
 * as floats, in the same order, so one oracle serves both. */
enum { LAYOUT_IDS = 1000 };
static const spmd_dtype layout_dtypes[] = {SPMD_F32, SPMD_I32};

static spmd_tensor *layout_input(opcase *c, const shape *s, spmd_dtype dtype)
{
    return dtype == SPMD_I32 ? oc_ids(c, s->rank, s->dims, LAYOUT_IDS) : oc_input(c, s, GEN_ANY);
}

static float *layout_expect(opcase *c, spmd_tensor *y)
{
    if (y && spmd_tensor_dtype(y) == SPMD_I32) {
        spmd_tensor *table = oc_leaf(c, SPMD_F32, 2, (const int64_t[]){LAYOUT_IDS, 1});
        float *rows = c->val[c->n - 1];
        for (int i = 0; i < LAYOUT_IDS; i++) rows[i] = (float)i;
        y = spmd_embedding(c->g, table, y);
    }
    return oc_expect(c, y);
}

static void test_reshape(void **state)
{
    (void)state;
    static const shape_pair cases[] = { /* from a, to b */
        {SH(3, 2, 3, 4), SH(2, 6, 4)}, {SH(3, 2, 3, 4), SH(3, 4, 3, 2)},
        {SH(3, 2, 3, 4), SH(1, 24)},   {SH(3, 2, 3, 4), SH(4, 2, 1, 12, 1)},
        {SH(3, 5, 7, 9), SH(2, 35, 9)}, {SH(0), SH(2, 1, 1)},
        {SH(1, 1), SH(0)},
    };
    for (size_t k = 0; k < ARRAY_LEN(layout_dtypes); k++)
        for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
            opcase c;
            oc_init(&c, "reshape %s #%zu", spmd_dtype_name(layout_dtypes[k]), i);
            spmd_tensor *x = layout_input(&c, &cases[i].a, layout_dtypes[k]);
            spmd_tensor *y = spmd_reshape(c.g, x, cases[i].b.rank, cases[i].b.dims);
            /* Row-major order is kept: the same values in the same order. */
            memcpy(layout_expect(&c, y), oc_f(&c, 0), test_tensor_bytes(x));
            oc_check(&c);
        }
}

/* A stage transfer on one device (no stage axis) is a copy, of either
 * floating type or ids. */
static void test_stage_transfer(void **state)
{
    (void)state;
    static const shape cases[] = {SH(0), SH(1, 7), SH(3, 2, 3, 4), SH(2, 37, 50)};
    for (size_t k = 0; k < ARRAY_LEN(layout_dtypes); k++)
        for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
            opcase c;
            oc_init(&c, "stage_transfer %s #%zu", spmd_dtype_name(layout_dtypes[k]), i);
            spmd_tensor *x = layout_input(&c, &cases[i], layout_dtypes[k]);
            spmd_tensor *y = spmd_stage_transfer(c.g, x, 1, 0);
            memcpy(layout_expect(&c, y), oc_f(&c, 0), test_tensor_bytes(x));
            oc_check(&c);
        }
}

/* permute (perm given) or transpose (d0 != -1). */
typedef struct perm_case {
    shape s;
    int perm[SPMD_MAX_RANK];
    int d0, d1;
} perm_case;

static void test_permute_transpose(void **state)
{
    (void)state;
    static const perm_case cases[] = {
        {SH(3, 2, 3, 4), {0, 1, 2}, -1, 0},    {SH(3, 2, 3, 4), {0, 2, 1}, -1, 0},
        {SH(3, 2, 3, 4), {1, 0, 2}, -1, 0},    {SH(3, 2, 3, 4), {1, 2, 0}, -1, 0},
        {SH(3, 2, 3, 4), {2, 0, 1}, -1, 0},    {SH(3, 2, 3, 4), {2, 1, 0}, -1, 0},
        {SH(4, 2, 3, 1, 5), {3, 1, 2, 0}, -1, 0}, {SH(4, 2, 3, 1, 5), {0, 2, 3, 1}, -1, 0},
        {SH(4, 2, 3, 1, 5), {1, 0, 3, 2}, -1, 0}, {SH(3, 5, 17, 9), {2, 0, 1}, -1, 0},
        {SH(2, 33, 40), {1, 0}, -1, 0},        {SH(1, 7), {0}, -1, 0},
        {SH(3, 2, 3, 4), {0}, 0, 1},           {SH(3, 2, 3, 4), {0}, 1, 2},
        {SH(3, 2, 3, 4), {0}, 0, 2},           {SH(3, 2, 3, 4), {0}, 1, 1},
        {SH(4, 2, 3, 1, 4), {0}, 0, 3},        {SH(2, 33, 40), {0}, 1, 0},
    };
    for (size_t k = 0; k < ARRAY_LEN(layout_dtypes); k++)
        for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
            const perm_case *pc = &cases[i];
            const bool tr = pc->d0 >= 0;
            int perm[SPMD_MAX_RANK];
            memcpy(perm, pc->perm, sizeof perm);
            if (tr) {
                for (int d = 0; d < pc->s.rank; d++) perm[d] = d;
                perm[pc->d0] = pc->d1;
                perm[pc->d1] = pc->d0;
            }
            opcase c;
            oc_init(&c, "%s %s #%zu", tr ? "transpose" : "permute",
                    spmd_dtype_name(layout_dtypes[k]), i);
            spmd_tensor *x = layout_input(&c, &pc->s, layout_dtypes[k]);
            spmd_tensor *y = tr ? spmd_transpose(c.g, x, pc->d0, pc->d1)
                                : spmd_permute(c.g, x, pc->perm);
            ref_permute(oc_f(&c, 0), pc->s.dims, pc->s.rank, perm, layout_expect(&c, y));
            oc_check(&c);
        }
}

static void test_slice(void **state)
{
    (void)state;
    static const struct {
        shape s;
        int axis;
        int64_t start, len;
    } cases[] = {
        {SH(3, 4, 5, 6), 0, 1, 2},  {SH(3, 4, 5, 6), 0, 0, 4},   {SH(3, 4, 5, 6), 1, 2, 3},
        {SH(3, 4, 5, 6), 1, 4, 1},  {SH(3, 4, 5, 6), 2, 0, 1},   {SH(3, 4, 5, 6), 2, 1, 5},
        {SH(3, 4, 5, 6), 2, 3, 3},  {SH(3, 3, 70, 20), 1, 5, 60}, {SH(1, 70), 0, 17, 40},
    };
    for (size_t k = 0; k < ARRAY_LEN(layout_dtypes); k++)
        for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
            opcase c;
            oc_init(&c, "slice %s #%zu axis %d [%lld:+%lld]", spmd_dtype_name(layout_dtypes[k]),
                    i, cases[i].axis, (long long)cases[i].start, (long long)cases[i].len);
            spmd_tensor *x = layout_input(&c, &cases[i].s, layout_dtypes[k]);
            spmd_tensor *y = spmd_slice(c.g, x, cases[i].axis, cases[i].start, cases[i].len);
            ref_slice(oc_f(&c, 0), cases[i].s.dims, cases[i].s.rank, cases[i].axis,
                      cases[i].start, cases[i].len, layout_expect(&c, y));
            oc_check(&c);
        }
}

static void test_concat(void **state)
{
    (void)state;
    /* Parts of `base` that differ along `axis` only (lens[j] there). */
    static const struct {
        shape base;
        int axis, n;
        int64_t lens[3];
    } cases[] = {
        {SH(3, 2, 3, 4), 0, 2, {1, 3}},     {SH(3, 2, 3, 4), 0, 3, {2, 1, 3}},
        {SH(3, 2, 3, 4), 1, 2, {1, 3}},     {SH(3, 2, 3, 4), 1, 3, {2, 1, 3}},
        {SH(3, 2, 3, 4), 2, 2, {1, 3}},     {SH(3, 2, 3, 4), 2, 3, {2, 1, 3}},
        {SH(3, 3, 30, 17), 1, 3, {10, 1, 19}}, {SH(3, 3, 30, 17), 2, 2, {16, 17}},
        {SH(1, 0), 0, 2, {5, 70}},
    };
    for (size_t k = 0; k < ARRAY_LEN(layout_dtypes); k++)
        for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
            opcase c;
            oc_init(&c, "concat %s #%zu, %d parts on axis %d", spmd_dtype_name(layout_dtypes[k]),
                    i, cases[i].n, cases[i].axis);
            spmd_tensor *xs[3];
            shape parts[3];
            const float *vals[3];
            const int64_t *dims[3];
            for (int j = 0; j < cases[i].n; j++) {
                parts[j] = cases[i].base;
                parts[j].dims[cases[i].axis] = cases[i].lens[j];
                xs[j] = layout_input(&c, &parts[j], layout_dtypes[k]);
                vals[j] = oc_f(&c, j);
                dims[j] = parts[j].dims;
            }
            spmd_tensor *y = spmd_concat(c.g, xs, cases[i].n, cases[i].axis);
            ref_concat(vals, dims, cases[i].n, cases[i].base.rank, cases[i].axis,
                       layout_expect(&c, y));
            oc_check(&c);
        }
}

/* ---- Data errors at run time ------------------------------------------------------------ */

static void on_watchdog(int sig)
{
    (void)sig;
    static const char msg[] = "test_ops: a run did not finish in time: the pool hung\n";
    ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)w;
    _exit(1);
}

/* Teardown of the data-error tests: also after a failure. */
static int disarm_watchdog(void **state)
{
    (void)state;
    alarm(0);
    signal(SIGALRM, SIG_DFL);
    return 0;
}

/* Bad values put into an i32 input: value[0] at pos[0] is the one the
 * message must name; value[1] at pos[1] (if pos[1] >= 0) comes later, so
 * the first bad item must win on every thread count. */
typedef struct bad_data {
    int input;
    const char *op;
    int64_t pos[2];
    int32_t value[2];
} bad_data;

/* Like oc_check, and for each thread count: every bad_data run (BAD_RUNS
 * times) fails with a non-OK status and a message naming the op and the
 * value, and the next run with the good data gives the good result again.
 * A run that never returns trips the watchdog. */
static void oc_check_bad_data(opcase *c, const bad_data *bad, size_t nbad)
{
    oc_describe(c);
    assert_int_equal(spmd_graph_mark_output(c->g, c->out), SPMD_OK);
    signal(SIGALRM, on_watchdog);
    alarm(WATCHDOG_S);
    float *got[MAX_THREADS] = {0};
    for (int t = 0; t < MAX_THREADS; t++) {
        const int nth = t + 1;
        got[t] = xmalloc(test_tensor_bytes(c->out));
        float *again = xmalloc(test_tensor_bytes(c->out));
        spmd_program *p = oc_compile(c, nth);
        oc_run_read(c, p, nth, got[t]);
        oc_compare(c, got[t], nth);
        if (t > 0) oc_same_bits(c, got[0], got[t], nth);
        for (size_t b = 0; b < nbad * BAD_RUNS; b++) {
            const bad_data *d = &bad[b % nbad];
            const spmd_tensor *in = c->in[d->input];
            int32_t *ids = xmalloc(test_tensor_bytes(in));
            memcpy(ids, c->val[d->input], test_tensor_bytes(in));
            for (int j = 0; j < 2; j++)
                if (d->pos[j] >= 0) ids[d->pos[j]] = d->value[j];
            assert_int_equal(spmd_program_set_input(p, in, ids, test_tensor_bytes(in)), SPMD_OK);
            spmd_clear_error();
            spmd_status st = spmd_program_run(p);
            const char *msg = spmd_last_error();
            if (st == SPMD_OK)
                fail_msg("%s, %d thread(s): %s %d at %lld ran without an error", c->what, nth,
                         d->op, (int)d->value[0], (long long)d->pos[0]);
            if (!strstr(msg, d->op) || !mentions_number(msg, d->value[0]) ||
                (d->pos[1] >= 0 && mentions_number(msg, d->value[1])))
                fail_msg("%s, %d thread(s): bad %s value %d: status %s, message \"%s\" does "
                         "not name the op and that value (the first bad one)",
                         c->what, nth, d->op, (int)d->value[0], spmd_status_name(st), msg);
            free(ids);
            /* Good data again: the same program runs and gives the same bits. */
            assert_int_equal(
                spmd_program_set_input(p, in, c->val[d->input], test_tensor_bytes(in)), SPMD_OK);
            oc_run_read(c, p, nth, again);
            oc_same_bits(c, got[t], again, nth);
        }
        spmd_program_free(p);
        free(again);
    }
    oc_free(c, got);
}

static void test_embedding_bad_id(void **state)
{
    (void)state;
    static const bad_data bad[] = {
        {1, "embedding", {3, -1}, {6, 0}},            /* one past the end */
        {1, "embedding", {0, -1}, {-1, 0}},           /* negative */
        {1, "embedding", {9, -1}, {INT32_MAX, 0}},    /* the last position */
        {1, "embedding", {4, 7}, {1000, -7}},         /* the first of two */
    };
    opcase c;
    oc_init(&c, "embedding with bad ids");
    const shape tab = SH(2, 6, 5);
    oc_input(&c, &tab, GEN_ANY);
    oc_ids(&c, 2, (const int64_t[]){2, 5}, 6);
    expect_embedding(&c, 0, 1);
    oc_check_bad_data(&c, bad, ARRAY_LEN(bad));
}

static void test_cross_entropy_bad_target(void **state)
{
    (void)state;
    static const bad_data bad[] = {
        {1, "cross_entropy", {2, -1}, {5, 0}},
        {1, "cross_entropy", {0, -1}, {-3, 0}},
        {1, "cross_entropy", {11, -1}, {77, 0}},
        {1, "cross_entropy", {5, 6}, {-2, 9}},
    };
    opcase c;
    oc_init(&c, "cross_entropy with bad targets");
    const shape logits = SH(3, 3, 4, 5);
    spmd_tensor *x = oc_input(&c, &logits, GEN_WIDE);
    oc_ids(&c, 2, logits.dims, 5);
    expect_cross_entropy(&c, x, oc_f(&c, 0), 1);
    oc_check_bad_data(&c, bad, ARRAY_LEN(bad));
}

/* Both in one graph: the rows of a [V, V] table are the logits of a
 * bigram model, so a bad id stops the run before cross_entropy, and a bad
 * target fails the later node. */
static void test_chained_bad_data(void **state)
{
    (void)state;
    static const bad_data bad[] = {
        {1, "embedding", {20, -1}, {9, 0}},
        {2, "cross_entropy", {33, -1}, {-1, 0}},
        {1, "embedding", {0, -1}, {-5, 0}},
    };
    enum { V = 9 };
    const shape tab = SH(2, V, V);
    const int64_t bt[] = {3, 13};
    opcase c;
    oc_init(&c, "embedding into cross_entropy with bad data");
    spmd_tensor *table = oc_input(&c, &tab, GEN_WIDE);
    spmd_tensor *ids = oc_ids(&c, 2, bt, V);
    oc_ids(&c, 2, bt, V);
    spmd_tensor *logits = spmd_embedding(c.g, table, ids);
    assert_non_null(logits);
    float *rows = xmalloc((size_t)(bt[0] * bt[1] * V) * sizeof *rows);
    assert_int_equal(ref_embedding(oc_f(&c, 0), V, V, oc_i(&c, 1), bt[0] * bt[1], rows), -1);
    expect_cross_entropy(&c, logits, rows, 2);
    free(rows);
    oc_check_bad_data(&c, bad, ARRAY_LEN(bad));
}

/* A position past the cache (the new rows would not fit) or negative is a
 * data error of both decoding ops. */
static void test_cache_bad_position(void **state)
{
    (void)state;
    static const bad_data write_bad[] = {
        {2, "cache_write", {0, -1}, {8, 0}},  /* 8 + 2 rows > 9 */
        {2, "cache_write", {0, -1}, {-1, 0}},
        {2, "cache_write", {0, -1}, {INT32_MAX, 0}},
    };
    static const bad_data attn_bad[] = {
        {3, "cached_attention", {0, -1}, {9, 0}},
        {3, "cached_attention", {0, -1}, {-4, 0}},
    };
    const shape cache = SH(3, 2, 9, 8), rows = SH(3, 2, 2, 8);
    opcase c;
    oc_init(&c, "cache_write with bad positions");
    spmd_tensor *x = oc_input(&c, &cache, GEN_ANY);
    spmd_tensor *r = oc_input(&c, &rows, GEN_ANY);
    spmd_tensor *pos = oc_ids(&c, 1, (const int64_t[]){1}, 8);
    ref_cache_write(oc_f(&c, 0), oc_f(&c, 1), 2, 9, 2, 8, oc_i(&c, 2)[0],
                    oc_expect(&c, spmd_cache_write(c.g, x, r, pos)));
    oc_check_bad_data(&c, write_bad, ARRAY_LEN(write_bad));

    oc_init(&c, "cached_attention with bad positions");
    spmd_tensor *q = oc_input(&c, &rows, GEN_ANY);
    spmd_tensor *k = oc_input(&c, &cache, GEN_ANY);
    spmd_tensor *v = oc_input(&c, &cache, GEN_ANY);
    pos = oc_ids(&c, 1, (const int64_t[]){1}, 8);
    spmd_tensor *y = spmd_cached_attention(c.g, q, k, v, pos, 2);
    ref_cached_attention(oc_f(&c, 0), oc_f(&c, 1), oc_f(&c, 2), 2, 2, 9, 8, 2, oc_i(&c, 3)[0],
                         oc_expect(&c, y));
    oc_check_bad_data(&c, attn_bad, ARRAY_LEN(attn_bad));
}

/* A matmul [1, K] x [K, 1] with K = 2^31 + 64 is past the 32-bit CBLAS
 * interface: blas_sgemm refuses it before touching a matrix, and the
 * kernel records that as the step's status and message (the executor then
 * fails the step).  Building the graph allocates no data, so one-float
 * buffers stand in for the operands. */
static void test_refused_gemm_fails_the_kernel(void **state)
{
    (void)state;
    const int64_t k = ((int64_t)1 << 31) + 64;
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_tensor *a = spmd_input(g, "a", SPMD_F32, 2, (const int64_t[]){1, k});
    spmd_tensor *b = spmd_input(g, "b", SPMD_F32, 2, (const int64_t[]){k, 1});
    spmd_tensor *y = spmd_matmul(g, a, b, false, false);
    if (!y) fail_msg("building the matmul: %s", spmd_last_error());

    float in0 = 1.0f, in1 = 2.0f, out = -7.0f;
    spmd_clear_error();
    assert_int_equal(blas_sgemm(false, false, 1, 1, k, 1.0f, &in0, k, &in1, 1, 0.0f, &out, 1),
                     SPMD_ERR_UNSUPPORTED);
    assert_non_null(strstr(spmd_last_error(), "sgemm 1x1x2147483712"));
    assert_true(out == -7.0f);

    _Atomic int status = SPMD_OK;
    char message[256] = "";
    kern_args args = {.node = y, .in = {&in0, &in1}, .out = &out, .ith = 0, .nth = 1,
                      .status = &status, .message = message, .message_size = sizeof message};
    spmd_clear_error();
    kern_for(IR_MATMUL)(&args);
    assert_int_equal(status, SPMD_ERR_UNSUPPORTED);
    if (!strstr(message, "matmul: sgemm 1x1x2147483712"))
        fail_msg("the kernel's message \"%s\" does not name the product", message);
    assert_string_equal(spmd_last_error(), message);
    assert_true(out == -7.0f);
    spmd_graph_free(g);
}

int main(void)
{
    test_seed = test_announce_seed("test_ops", 20261207u);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fill),
        cmocka_unit_test(test_binary),
        cmocka_unit_test(test_expand),
        cmocka_unit_test(test_unary),
        cmocka_unit_test(test_pow_scalar),
        cmocka_unit_test(test_activation_tails),
        cmocka_unit_test(test_activation_backward),
        cmocka_unit_test(test_where),
        cmocka_unit_test(test_dropout),
        cmocka_unit_test(test_new_op_errors),
        cmocka_unit_test(test_sum_mean),
        cmocka_unit_test(test_max),
        cmocka_unit_test(test_cumsum),
        cmocka_unit_test(test_nan),
        cmocka_unit_test(test_softmax),
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_max_pool2d),
        cmocka_unit_test(test_avg_pool2d),
        cmocka_unit_test(test_adaptive_avg_pool2d),
        cmocka_unit_test(test_pool_errors),
        cmocka_unit_test(test_batch_norm),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_bmm),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_conv2d),
        cmocka_unit_test(test_conv2d_errors),
        cmocka_unit_test(test_cache_write),
        cmocka_unit_test(test_cached_attention),
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_cross_entropy),
        cmocka_unit_test(test_mse),
        cmocka_unit_test(test_reshape),
        cmocka_unit_test(test_stage_transfer),
        cmocka_unit_test(test_permute_transpose),
        cmocka_unit_test(test_slice),
        cmocka_unit_test(test_concat),
        cmocka_unit_test_teardown(test_embedding_bad_id, disarm_watchdog),
        cmocka_unit_test_teardown(test_cross_entropy_bad_target, disarm_watchdog),
        cmocka_unit_test_teardown(test_chained_bad_data, disarm_watchdog),
        cmocka_unit_test_teardown(test_cache_bad_position, disarm_watchdog),
        cmocka_unit_test(test_refused_gemm_fails_the_kernel),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
