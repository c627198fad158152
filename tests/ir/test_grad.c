/*
 * Gradient checks: for every differentiable op, spmd_grad's gradients
 * against central finite differences of the compiled forward pass.
 *
 * Each case makes loss = sum(op(params...) * R) with R a fixed random input,
 * so every output element gets its own weight in the adjoint.  Inputs are
 * drawn from a seeded generator; a failure prints the seed, and
 * SPMD_TEST_SEED=<seed> replays it.  Also: the errors spmd_grad reports.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "base/error.h"
#include "ir/ir.h"
#include "spmd/spmd.h"
#include "support_case.h"
#include "support_rng.h"

#define D(...) ((const int64_t[]){__VA_ARGS__})
#define MAXT 8

/* ---- Seeded values -------------------------------------------------------- */

static uint64_t test_seed;
/* The current case's: each case draws from the seed and its own name, so
 * one case replays the same whatever runs before it. */
static test_rng rng;

/* ---- The check --------------------------------------------------------------- */

typedef struct gcheck {
    char what[128];
    spmd_graph *g;
    int np, ni;
    spmd_tensor *p[MAXT];
    float *pv[MAXT];
    spmd_tensor *in[MAXT];
    void *iv[MAXT];
    double h, rtol, atol;
} gcheck;

static void gc_init(gcheck *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void gc_init(gcheck *c, const char *fmt, ...)
{
    memset(c, 0, sizeof *c);
    va_list ap;
    va_start(ap, fmt);
    c->g = test_case_start(c->what, sizeof c->what, test_seed, &rng, fmt, ap);
    va_end(ap);
    c->h = 1e-2;
    c->rtol = 2e-2;
    c->atol = 1e-3;
}

static spmd_tensor *gc_param(gcheck *c, const char *name, int rank, const int64_t *dims,
                             test_gen kind)
{
    assert_true(c->np < MAXT);
    spmd_tensor *t = spmd_param(c->g, name, rank, dims, (spmd_init){SPMD_INIT_ZEROS, 0.0f});
    if (!t) fail_msg("%s: param %s: %s", c->what, name, spmd_last_error());
    float *v = malloc((size_t)spmd_tensor_numel(t) * sizeof *v);
    assert_non_null(v);
    test_fill_values(&rng, v, spmd_tensor_numel(t), kind);
    c->p[c->np] = t;
    c->pv[c->np++] = v;
    return t;
}

static spmd_tensor *gc_input(gcheck *c, const char *name, int rank, const int64_t *dims,
                             test_gen kind)
{
    assert_true(c->ni < MAXT);
    spmd_tensor *t = spmd_input(c->g, name, SPMD_F32, rank, dims);
    if (!t) fail_msg("%s: input %s: %s", c->what, name, spmd_last_error());
    float *v = malloc((size_t)spmd_tensor_numel(t) * sizeof *v);
    assert_non_null(v);
    test_fill_values(&rng, v, spmd_tensor_numel(t), kind);
    c->in[c->ni] = t;
    c->iv[c->ni++] = v;
    return t;
}

/* int32 ids in [0, limit), or the given values when `values` is not NULL. */
static spmd_tensor *gc_ids(gcheck *c, const char *name, int rank, const int64_t *dims,
                           int32_t limit, const int32_t *values)
{
    assert_true(c->ni < MAXT);
    spmd_tensor *t = spmd_input(c->g, name, SPMD_I32, rank, dims);
    if (!t) fail_msg("%s: input %s: %s", c->what, name, spmd_last_error());
    int64_t n = spmd_tensor_numel(t);
    int32_t *v = malloc((size_t)n * sizeof *v);
    assert_non_null(v);
    if (values) memcpy(v, values, (size_t)n * sizeof *v);
    else test_fill_ids(&rng, v, n, limit);
    c->in[c->ni] = t;
    c->iv[c->ni++] = v;
    return t;
}

static float gc_loss(gcheck *c, spmd_program *prog, spmd_tensor *loss)
{
    for (int i = 0; i < c->ni; i++)
        assert_int_equal(
            spmd_program_set_input(prog, c->in[i], c->iv[i], test_tensor_bytes(c->in[i])),
            SPMD_OK);
    spmd_status st = spmd_program_run(prog);
    if (st != SPMD_OK) fail_msg("%s: run: %s", c->what, spmd_last_error());
    float l = 0;
    assert_int_equal(spmd_program_read(prog, loss, &l, sizeof l), SPMD_OK);
    return l;
}

/* loss = sum(y * R); check every parameter's gradient; free everything. */
static void gc_run(gcheck *c, spmd_tensor *y)
{
    if (!y) fail_msg("%s: building the op failed: %s", c->what, spmd_last_error());
    int rank = spmd_tensor_rank(y);
    int64_t dims[SPMD_MAX_RANK];
    for (int i = 0; i < rank; i++) dims[i] = spmd_tensor_dim(y, i);
    spmd_tensor *r = gc_input(c, "R", rank, dims, GEN_ANY);
    spmd_tensor *loss = spmd_mul(c->g, y, r);
    if (rank > 0) loss = spmd_sum(c->g, loss, (1u << rank) - 1, false);
    if (!loss) fail_msg("%s: loss: %s", c->what, spmd_last_error());

    spmd_status st = spmd_grad(c->g, loss);
    if (st != SPMD_OK) fail_msg("%s: spmd_grad: %s", c->what, spmd_last_error());
    assert_int_equal(spmd_graph_mark_output(c->g, loss), SPMD_OK);
    for (int k = 0; k < c->np; k++) {
        spmd_tensor *gr = spmd_tensor_grad(c->p[k]);
        assert_non_null(gr);
        assert_int_equal(spmd_graph_mark_output(c->g, gr), SPMD_OK);
    }

    spmd_compile_options opts = {.threads = 1, .seed = 1};
    spmd_program *prog = spmd_compile(c->g, &opts);
    if (!prog) fail_msg("%s: compile: %s", c->what, spmd_last_error());
    for (int k = 0; k < c->np; k++)
        assert_int_equal(
            spmd_program_write(prog, c->p[k], c->pv[k], test_tensor_bytes(c->p[k])), SPMD_OK);
    (void)gc_loss(c, prog, loss);
    /* Every gradient now, before any perturbed run overwrites them. */
    float *grads[MAXT];
    for (int k = 0; k < c->np; k++) {
        size_t bytes = test_tensor_bytes(c->p[k]);
        grads[k] = malloc(bytes);
        assert_non_null(grads[k]);
        assert_int_equal(spmd_program_read(prog, spmd_tensor_grad(c->p[k]), grads[k], bytes),
                         SPMD_OK);
    }

    int bad = 0;
    for (int k = 0; k < c->np; k++) {
        spmd_tensor *p = c->p[k];
        int64_t n = spmd_tensor_numel(p);
        const float *grad = grads[k];
        float *v = c->pv[k];
        for (int64_t i = 0; i < n; i++) {
            float v0 = v[i];
            float vp = (float)(v0 + c->h), vm = (float)(v0 - c->h);
            v[i] = vp;
            assert_int_equal(spmd_program_write(prog, p, v, test_tensor_bytes(p)), SPMD_OK);
            double lp = gc_loss(c, prog, loss);
            v[i] = vm;
            assert_int_equal(spmd_program_write(prog, p, v, test_tensor_bytes(p)), SPMD_OK);
            double lm = gc_loss(c, prog, loss);
            v[i] = v0;
            /* Divide by the step the floats really took. */
            double num = (lp - lm) / ((double)vp - (double)vm);
            double ana = grad[i];
            double mag = fabs(num) > fabs(ana) ? fabs(num) : fabs(ana);
            if (fabs(num - ana) > c->atol + c->rtol * mag) {
                if (bad < 8)
                    print_message("%s: d loss / d %s[%lld]: autodiff %.6g, finite "
                                  "differences %.6g (seed %llu)\n",
                                  c->what, spmd_tensor_name(p), (long long)i, ana, num,
                                  (unsigned long long)test_seed);
                bad++;
            }
        }
        assert_int_equal(spmd_program_write(prog, p, v, test_tensor_bytes(p)), SPMD_OK);
    }
    for (int k = 0; k < c->np; k++) free(grads[k]);

    spmd_program_free(prog);
    spmd_graph_free(c->g);
    for (int k = 0; k < c->np; k++) free(c->pv[k]);
    for (int i = 0; i < c->ni; i++) free(c->iv[i]);
    if (bad)
        fail_msg("%s: %d gradient element(s) off; replay with SPMD_TEST_SEED=%llu", c->what,
                 bad, (unsigned long long)test_seed);
}

/* ---- Elementwise --------------------------------------------------------------- */

typedef struct shape_pair {
    shape a, b;
} shape_pair;

/* Same shapes, trailing match, 1-dims on both sides, a scalar, and the
 * smaller operand on the left. */
static const shape_pair broadcast_pairs[] = {
    {{3, {2, 3, 4}}, {3, {2, 3, 4}}},
    {{3, {2, 3, 4}}, {1, {4}}},
    {{3, {2, 1, 4}}, {2, {3, 1}}},
    {{2, {2, 3}}, {0, {0}}},
    {{1, {4}}, {3, {2, 3, 4}}},
    {{3, {2, 3, 1}}, {3, {1, 1, 4}}},
};

typedef spmd_tensor *(*binary_fn)(spmd_graph *, spmd_tensor *, spmd_tensor *);

static void check_binary(const char *name, binary_fn fn, test_gen b_kind)
{
    for (size_t i = 0; i < sizeof broadcast_pairs / sizeof broadcast_pairs[0]; i++) {
        const shape_pair *s = &broadcast_pairs[i];
        gcheck c;
        gc_init(&c, "%s, shapes %zu", name, i);
        spmd_tensor *a = gc_param(&c, "a", s->a.rank, s->a.dims, GEN_ANY);
        spmd_tensor *b = gc_param(&c, "b", s->b.rank, s->b.dims, b_kind);
        gc_run(&c, fn(c.g, a, b));
    }
}

static void test_add(void **state)
{
    (void)state;
    check_binary("add", spmd_add, GEN_ANY);
}

static void test_sub(void **state)
{
    (void)state;
    check_binary("sub", spmd_sub, GEN_ANY);
}

static void test_mul(void **state)
{
    (void)state;
    check_binary("mul", spmd_mul, GEN_ANY);
}

static void test_div(void **state)
{
    (void)state;
    check_binary("div", spmd_div, GEN_POS);
}

static void test_expand(void **state)
{
    (void)state;
    static const shape from[] = {{2, {3, 1}}, {1, {4}}, {0, {0}}, {3, {2, 1, 4}}};
    for (size_t i = 0; i < sizeof from / sizeof from[0]; i++) {
        gcheck c;
        gc_init(&c, "expand %zu", i);
        spmd_tensor *x = gc_param(&c, "x", from[i].rank, from[i].dims, GEN_ANY);
        gc_run(&c, spmd_expand(c.g, x, 3, D(2, 3, 4)));
    }
}

static spmd_tensor *scale_by(spmd_graph *g, spmd_tensor *x) { return spmd_scale(g, x, -1.5f); }

static void test_unary(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        spmd_tensor *(*fn)(spmd_graph *, spmd_tensor *);
        test_gen kind;
    } ops[] = {
        {"scale", scale_by, GEN_ANY},   {"neg", spmd_neg, GEN_ANY},
        {"exp", spmd_exp, GEN_ANY},     {"log", spmd_log, GEN_POS},
        {"tanh", spmd_tanh, GEN_ANY},   {"gelu", spmd_gelu, GEN_ANY},
        {"relu", spmd_relu, GEN_AWAY0}, {"sqrt", spmd_sqrt, GEN_POS},
        {"rsqrt", spmd_rsqrt, GEN_POS},
        {"gelu_erf", spmd_gelu_erf, GEN_WIDE}, {"silu", spmd_silu, GEN_WIDE},
        {"sigmoid", spmd_sigmoid, GEN_WIDE},
    };
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        gcheck c;
        gc_init(&c, "%s", ops[i].name);
        spmd_tensor *x = gc_param(&c, "x", 3, D(2, 3, 4), ops[i].kind);
        gc_run(&c, ops[i].fn(c.g, x));
    }
}

/* Every plain elementwise op of the op table (spmd_op_describe), built by
 * name, whatever builders and cases exist for it: an op added to ops.def
 * is checked here without a line of its own.  Operands positive (inside
 * every such formula's domain), two of them broadcast, a constant where
 * the formula reads one. */
static void test_every_elementwise_op(void **state)
{
    (void)state;
    int checked = 0;
    for (int i = 0; i < spmd_op_count(); i++) {
        spmd_op_info op;
        assert_int_equal(spmd_op_describe(i, &op), SPMD_OK);
        if (!op.elementwise || !op.differentiable) continue;
        gcheck c;
        gc_init(&c, "%s by name", op.name);
        spmd_tensor *in[2] = {gc_param(&c, "a", 3, D(2, 3, 4), GEN_POS),
                              op.arity == 2 ? gc_param(&c, "b", 2, D(3, 1), GEN_POS) : NULL};
        spmd_tensor *y = spmd_elementwise(c.g, op.name, in, op.arity, op.constant ? 1.5f : 0.0f);
        if (!y) fail_msg("%s: %s", op.name, spmd_last_error());
        gc_run(&c, y);
        checked++;
    }
    assert_true(checked >= 15);
}

/* spmd_elementwise names what it refuses. */
static void test_elementwise_by_name_refusals(void **state)
{
    (void)state;
    static const struct {
        const char *op;
        int n_in;
        float c;
        const char *says;
    } cases[] = {
        {"nosuch", 1, 0.0f, "'nosuch': no op of that name"},
        {"matmul", 2, 0.0f, "'matmul': not a plain elementwise op"},
        {"add", 1, 0.0f, "add takes 2 operands, got 1"},
        {"neg", 1, 2.0f, "neg takes no constant, got 2"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        spmd_graph *g = spmd_graph_create(NULL);
        spmd_tensor *x = spmd_input(g, "x", SPMD_F32, 1, D(4));
        spmd_tensor *in[2] = {x, x};
        assert_null(spmd_elementwise(g, cases[i].op, in, cases[i].n_in, cases[i].c));
        assert_int_equal(spmd_last_status(), SPMD_ERR_INVALID);
        if (!strstr(spmd_last_error(), cases[i].says))
            fail_msg("%s: says \"%s\", want \"%s\"", cases[i].op, spmd_last_error(), cases[i].says);
        spmd_graph_free(g);
    }
}

/* p x^(p-1), p = 0 and 1 included (their rules build no power). */
static void test_pow_scalar(void **state)
{
    (void)state;
    static const struct {
        float p;
        test_gen kind;
    } cases[] = {{2.0f, GEN_ANY},  {3.0f, GEN_ANY},   {1.0f, GEN_ANY}, {0.0f, GEN_ANY},
                 {0.5f, GEN_POS},  {-1.0f, GEN_POS},  {-2.0f, GEN_POS}, {1.5f, GEN_POS},
                 {-0.5f, GEN_POS}, {2.5f, GEN_POS}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        gcheck c;
        gc_init(&c, "pow_scalar %g", (double)cases[i].p);
        spmd_tensor *x = gc_param(&c, "x", 3, D(2, 3, 4), cases[i].kind);
        gc_run(&c, spmd_pow_scalar(c.g, x, cases[i].p));
    }
}

/* where(cond, a, b) with a and b parameters broadcast against the
 * condition: each gets dy where it was chosen, summed over its broadcast
 * dims.  The condition is an f32 mask input, an i32 one, or computed from
 * a parameter (relu of values away from 0, so the steps never cross a
 * switch): that parameter's gradient is zero. */
static void test_where(void **state)
{
    (void)state;
    static const struct {
        shape c, a, b;
    } cases[] = {
        {{3, {2, 3, 4}}, {3, {2, 3, 4}}, {3, {2, 3, 4}}},
        {{3, {2, 1, 4}}, {2, {3, 1}}, {0, {0}}},
        {{2, {3, 4}}, {3, {2, 3, 4}}, {1, {4}}},
    };
    for (int kind = 0; kind < 3; kind++)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            gcheck c;
            gc_init(&c, "where %s cond %zu", kind == 0 ? "f32" : kind == 1 ? "i32" : "computed", i);
            spmd_tensor *cond;
            if (kind == 0) {
                cond = gc_input(&c, "cond", cases[i].c.rank, cases[i].c.dims, GEN_ANY);
                float *m = c.iv[c.ni - 1];
                for (int64_t k = 0; k < spmd_tensor_numel(cond); k++) m[k] = (float)test_rng_int(&rng, 0, 1);
            } else if (kind == 1) {
                cond = gc_ids(&c, "cond", cases[i].c.rank, cases[i].c.dims, 2, NULL);
            } else {
                cond = spmd_relu(c.g, gc_param(&c, "pc", cases[i].c.rank, cases[i].c.dims, GEN_AWAY0));
            }
            spmd_tensor *a = gc_param(&c, "a", cases[i].a.rank, cases[i].a.dims, GEN_ANY);
            spmd_tensor *b = gc_param(&c, "b", cases[i].b.rank, cases[i].b.dims, GEN_ANY);
            gc_run(&c, spmd_where(c.g, cond, a, b));
        }
}

/* ---- Reductions and row normalisations ------------------------------------------- */

static void check_reduce(const char *name,
                         spmd_tensor *(*fn)(spmd_graph *, spmd_tensor *, uint32_t, bool))
{
    for (uint32_t axes = 1; axes < 8; axes++)
        for (int keep = 0; keep < 2; keep++) {
            gcheck c;
            gc_init(&c, "%s axes 0x%x keepdim %d", name, axes, keep);
            spmd_tensor *x = gc_param(&c, "x", 3, D(2, 3, 4), GEN_ANY);
            gc_run(&c, fn(c.g, x, axes, keep));
        }
}

static void test_sum(void **state)
{
    (void)state;
    check_reduce("sum", spmd_sum);
}

static void test_mean(void **state)
{
    (void)state;
    check_reduce("mean", spmd_mean);
}

static void test_max(void **state)
{
    (void)state;
    for (int axis = 0; axis < 3; axis++)
        for (int keep = 0; keep < 2; keep++) {
            gcheck c;
            gc_init(&c, "max axis %d keepdim %d", axis, keep);
            spmd_tensor *x = gc_param(&c, "x", 3, D(2, 3, 4), GEN_DISTINCT);
            gc_run(&c, spmd_max(c.g, x, axis, keep));
        }
}

static void test_cumsum(void **state)
{
    (void)state;
    for (int axis = 0; axis < 3; axis++)
        for (int reverse = 0; reverse < 2; reverse++) {
            gcheck c;
            gc_init(&c, "cumsum axis %d reverse %d", axis, reverse);
            spmd_tensor *x = gc_param(&c, "x", 3, D(2, 3, 4), GEN_ANY);
            gc_run(&c, spmd_cumsum(c.g, x, axis, reverse));
        }
}

/* Pooling: max over distinct values (0.1 apart, so x +- h keeps each
 * window's maximum), ResNet's stem window, a dilated ceil_mode one and a
 * MaxPool1d-like row on [C, H, W]; the averages with padding counted and
 * not, a divisor override, and adaptive windows of uneven size. */
static const spmd_pool2d grad_pools[] = {
    {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}},
    {.kernel = {3, 2}, .stride = {2, 1}, .padding = {1, 1}, .dilation = {1, 2}, .ceil_mode = true},
    {.kernel = {1, 3}, .stride = {1, 2}, .padding = {0, 1}, .ceil_mode = true},
};

static void test_max_pool2d(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof grad_pools / sizeof grad_pools[0]; i++) {
        gcheck c;
        gc_init(&c, "max_pool2d #%zu", i);
        spmd_tensor *x = i == 2 ? gc_param(&c, "x", 3, D(3, 1, 9), GEN_DISTINCT)
                                : gc_param(&c, "x", 4, D(2, 2, 7, 5), GEN_DISTINCT);
        gc_run(&c, spmd_max_pool2d(c.g, x, &grad_pools[i]));
    }
}

static void test_avg_pool2d(void **state)
{
    (void)state;
    static const spmd_pool2d pools[] = {
        {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}, .count_include_pad = true},
        {.kernel = {3, 2}, .stride = {2, 2}, .padding = {1, 0}, .ceil_mode = true},
        {.kernel = {2, 3}, .stride = {1, 2}, .padding = {1, 1}, .divisor_override = 5},
    };
    for (size_t i = 0; i < sizeof pools / sizeof pools[0]; i++) {
        gcheck c;
        gc_init(&c, "avg_pool2d #%zu", i);
        spmd_tensor *x = gc_param(&c, "x", 4, D(2, 2, 7, 5), GEN_ANY);
        gc_run(&c, spmd_avg_pool2d(c.g, x, &pools[i]));
    }
}

static void test_adaptive_avg_pool2d(void **state)
{
    (void)state;
    static const int64_t sizes[][2] = {{2, 3}, {1, 1}, {4, 7}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        gcheck c;
        gc_init(&c, "adaptive_avg_pool2d to %lldx%lld", (long long)sizes[i][0],
                (long long)sizes[i][1]);
        spmd_tensor *x = gc_param(&c, "x", 4, D(2, 2, 7, 5), GEN_ANY);
        gc_run(&c, spmd_adaptive_avg_pool2d(c.g, x, sizes[i][0], sizes[i][1]));
    }
}

static void test_softmax(void **state)
{
    (void)state;
    gcheck c;
    gc_init(&c, "softmax");
    gc_run(&c, spmd_softmax(c.g, gc_param(&c, "x", 3, D(2, 3, 5), GEN_ANY)));
    gc_init(&c, "softmax 1-D");
    gc_run(&c, spmd_softmax(c.g, gc_param(&c, "x", 1, D(6), GEN_ANY)));
}

static void test_log_softmax(void **state)
{
    (void)state;
    gcheck c;
    gc_init(&c, "log_softmax");
    gc_run(&c, spmd_log_softmax(c.g, gc_param(&c, "x", 3, D(2, 3, 5), GEN_ANY)));
    gc_init(&c, "log_softmax 2-D");
    gc_run(&c, spmd_log_softmax(c.g, gc_param(&c, "x", 2, D(4, 3), GEN_ANY)));
}

static void test_layernorm(void **state)
{
    (void)state;
    gcheck c;
    gc_init(&c, "layernorm");
    spmd_tensor *x = gc_param(&c, "x", 3, D(2, 3, 6), GEN_ANY);
    spmd_tensor *gamma = gc_param(&c, "gamma", 1, D(6), GEN_POS);
    spmd_tensor *beta = gc_param(&c, "beta", 1, D(6), GEN_ANY);
    gc_run(&c, spmd_layernorm(c.g, x, gamma, beta, 1e-5f));

    gc_init(&c, "layernorm 2-D");
    x = gc_param(&c, "x", 2, D(4, 5), GEN_ANY);
    gamma = gc_param(&c, "gamma", 1, D(5), GEN_ANY);
    beta = gc_param(&c, "beta", 1, D(5), GEN_ANY);
    gc_run(&c, spmd_layernorm(c.g, x, gamma, beta, 1e-5f));
}

/* Training mode: the gradient through x's batch statistics (the fused
 * backward rows); evaluation mode: each of x, mean, var, weight and bias
 * its own; the variance row alone. */
static void test_batch_norm(void **state)
{
    (void)state;
    static const shape shapes[] = {{2, {5, 3}}, {3, {3, 2, 4}}, {4, {2, 3, 2, 3}}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const shape *s = &shapes[i];
        const int64_t *ch = &s->dims[1];
        gcheck c;
        gc_init(&c, "batch_norm training, shape %zu", i);
        spmd_tensor *x = gc_param(&c, "x", s->rank, s->dims, GEN_ANY);
        spmd_tensor *w = gc_param(&c, "w", 1, ch, GEN_POS);
        spmd_tensor *b = gc_param(&c, "b", 1, ch, GEN_ANY);
        spmd_tensor *mean, *var;
        assert_int_equal(spmd_batch_norm_stats(c.g, x, &mean, &var), SPMD_OK);
        gc_run(&c, spmd_batch_norm(c.g, x, mean, var, w, b, 1e-5f));

        gc_init(&c, "batch_norm evaluation, shape %zu", i);
        x = gc_param(&c, "x", s->rank, s->dims, GEN_ANY);
        mean = gc_param(&c, "mean", 1, ch, GEN_ANY);
        var = gc_param(&c, "var", 1, ch, GEN_POS);
        w = gc_param(&c, "w", 1, ch, GEN_ANY);
        b = gc_param(&c, "b", 1, ch, GEN_ANY);
        gc_run(&c, spmd_batch_norm(c.g, x, mean, var, w, b, 1e-3f));

        gc_init(&c, "batch_norm_var, shape %zu", i);
        x = gc_param(&c, "x", s->rank, s->dims, GEN_ANY);
        mean = gc_param(&c, "mean", 1, ch, GEN_ANY);
        gc_run(&c, spmd_batch_norm_var(c.g, x, mean));
    }
}

static int count_ops(const spmd_graph *g, const char *op)
{
    int n = 0;
    for (int i = 0; i < spmd_graph_tensor_count(g); i++)
        n += strcmp(spmd_tensor_op_name(spmd_graph_tensor(g, i)), op) == 0;
    return n;
}

/* Training mode's backward is batch_norm_sums and batch_norm_backward (x
 * read twice), not the statistics' own rules (a pass over x for each);
 * evaluation mode has no batch_norm_backward. */
static void test_batch_norm_backward_rows(void **state)
{
    (void)state;
    for (int training = 0; training <= 1; training++) {
        spmd_graph *g = spmd_graph_create(NULL);
        const int64_t *dims = D(4, 3, 5), *ch = D(3);
        spmd_tensor *x = spmd_param(g, "x", 3, dims, (spmd_init){SPMD_INIT_NORMAL, 1.0f});
        spmd_tensor *w = spmd_param(g, "w", 1, ch, (spmd_init){SPMD_INIT_ONES, 0.0f});
        spmd_tensor *mean, *var;
        if (training) {
            assert_int_equal(spmd_batch_norm_stats(g, x, &mean, &var), SPMD_OK);
        } else {
            mean = spmd_state(g, "running_mean", 1, ch, (spmd_init){SPMD_INIT_ZEROS, 0.0f});
            var = spmd_state(g, "running_var", 1, ch, (spmd_init){SPMD_INIT_ONES, 0.0f});
        }
        spmd_tensor *y = spmd_batch_norm(g, x, mean, var, w, NULL, 1e-5f);
        spmd_tensor *loss = spmd_sum(g, spmd_mul(g, y, y), 7u, false);
        assert_int_equal(spmd_grad(g, loss), SPMD_OK);
        assert_int_equal(count_ops(g, "batch_norm_sums"), 1);
        assert_int_equal(count_ops(g, "batch_norm_backward"), training);
        assert_int_equal(count_ops(g, "sub"), 0); /* no rule of batch_norm_var ran */
        spmd_graph_free(g);
    }
}

/* ---- Linear algebra and attention ------------------------------------------------- */

typedef struct mm_case {
    shape a, b;
    bool ta, tb;
} mm_case;

static void test_matmul(void **state)
{
    (void)state;
    static const mm_case cases[] = {
        {{3, {2, 3, 4}}, {2, {4, 5}}, false, false},    /* [2, 3, 5] */
        {{2, {3, 4}}, {2, {4, 5}}, false, false},       /* [3, 5] */
        {{3, {2, 3, 4}}, {2, {5, 4}}, false, true},     /* [2, 3, 5] */
        {{2, {3, 4}}, {2, {5, 4}}, false, true},        /* [3, 5] */
        {{3, {2, 3, 4}}, {3, {2, 3, 5}}, true, false},  /* [4, 5] over 2, 3 */
        {{2, {3, 4}}, {2, {3, 5}}, true, false},        /* [4, 5] */
        {{2, {4, 3}}, {2, {5, 4}}, true, true},         /* [3, 5] */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const mm_case *m = &cases[i];
        gcheck c;
        gc_init(&c, "matmul %zu (ta %d, tb %d)", i, m->ta, m->tb);
        spmd_tensor *a = gc_param(&c, "a", m->a.rank, m->a.dims, GEN_ANY);
        spmd_tensor *b = gc_param(&c, "b", m->b.rank, m->b.dims, GEN_ANY);
        gc_run(&c, spmd_matmul(c.g, a, b, m->ta, m->tb));
    }
}

static void test_bmm(void **state)
{
    (void)state;
    static const mm_case cases[] = {
        {{3, {2, 3, 4}}, {3, {2, 4, 5}}, false, false},
        {{3, {2, 3, 4}}, {3, {2, 5, 4}}, false, true},
        {{3, {2, 4, 3}}, {3, {2, 4, 5}}, true, false},
        {{3, {2, 4, 3}}, {3, {2, 5, 4}}, true, true},
        {{4, {2, 2, 3, 4}}, {4, {2, 2, 4, 5}}, false, false},
        {{4, {2, 2, 4, 3}}, {4, {2, 2, 5, 4}}, true, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const mm_case *m = &cases[i];
        gcheck c;
        gc_init(&c, "bmm %zu (ta %d, tb %d)", i, m->ta, m->tb);
        spmd_tensor *a = gc_param(&c, "a", m->a.rank, m->a.dims, GEN_ANY);
        spmd_tensor *b = gc_param(&c, "b", m->b.rank, m->b.dims, GEN_ANY);
        gc_run(&c, spmd_bmm(c.g, a, b, m->ta, m->tb));
    }
}

/* conv2d: x and w both parameters; strides, padding, dilation, 2 groups
 * and depthwise, a pointwise 1x1 and a patch embedding. */
static void test_conv2d(void **state)
{
    (void)state;
    static const struct {
        int64_t x[4], w[4];
        spmd_conv2d_options o;
    } cases[] = {
        {{2, 3, 5, 5}, {4, 3, 3, 3}, {.padding = {1, 1}}},
        {{2, 2, 7, 6}, {3, 2, 3, 2}, {.stride = {2, 3}, .padding = {1, 2}, .dilation = {2, 1}}},
        {{1, 4, 5, 6}, {6, 2, 3, 3}, {.stride = {1, 2}, .padding = {1, 0}, .groups = 2}},
        {{2, 3, 6, 6}, {3, 1, 3, 3}, {.stride = {2, 2}, .padding = {1, 1}, .groups = 3}},
        {{2, 3, 4, 3}, {5, 3, 1, 1}, {.groups = 1}},
        {{1, 3, 8, 8}, {4, 3, 4, 4}, {.stride = {4, 4}}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        gcheck c;
        gc_init(&c, "conv2d %zu (groups %d)", i, cases[i].o.groups);
        spmd_tensor *x = gc_param(&c, "x", 4, cases[i].x, GEN_ANY);
        spmd_tensor *w = gc_param(&c, "w", 4, cases[i].w, GEN_ANY);
        gc_run(&c, spmd_conv2d(c.g, x, w, &cases[i].o));
    }
}

static void test_attention(void **state)
{
    (void)state;
    gcheck c;
    gc_init(&c, "attention, 2 heads");
    spmd_tensor *q = gc_param(&c, "q", 3, D(2, 4, 8), GEN_ANY);
    spmd_tensor *k = gc_param(&c, "k", 3, D(2, 4, 8), GEN_ANY);
    spmd_tensor *v = gc_param(&c, "v", 3, D(2, 4, 8), GEN_ANY);
    gc_run(&c, spmd_attention(c.g, q, k, v, 2));

    /* One tensor as q, k and v: three contributions summed. */
    gc_init(&c, "attention, shared q = k = v");
    spmd_tensor *x = gc_param(&c, "x", 3, D(1, 3, 4), GEN_ANY);
    gc_run(&c, spmd_attention(c.g, x, x, x, 2));
}

/* ---- Lookups and losses -------------------------------------------------------------- */

static void test_embedding(void **state)
{
    (void)state;
    gcheck c;
    gc_init(&c, "embedding");
    spmd_tensor *table = gc_param(&c, "table", 2, D(6, 4), GEN_ANY);
    /* Repeated rows add up; rows 1 and 4 are never picked. */
    spmd_tensor *ids = gc_ids(&c, "ids", 2, D(2, 3), 6, (const int32_t[]){0, 2, 2, 5, 0, 3});
    gc_run(&c, spmd_embedding(c.g, table, ids));
}

static void test_cross_entropy(void **state)
{
    (void)state;
    gcheck c;
    gc_init(&c, "cross_entropy 3-D");
    spmd_tensor *logits = gc_param(&c, "logits", 3, D(2, 3, 5), GEN_ANY);
    spmd_tensor *targets = gc_ids(&c, "targets", 2, D(2, 3), 5, NULL);
    gc_run(&c, spmd_cross_entropy(c.g, logits, targets));

    gc_init(&c, "cross_entropy 2-D");
    logits = gc_param(&c, "logits", 2, D(4, 7), GEN_ANY);
    targets = gc_ids(&c, "targets", 1, D(4), 7, NULL);
    gc_run(&c, spmd_cross_entropy(c.g, logits, targets));
}

static void test_mse(void **state)
{
    (void)state;
    gcheck c;
    gc_init(&c, "mse");
    spmd_tensor *a = gc_param(&c, "a", 2, D(3, 4), GEN_ANY);
    spmd_tensor *b = gc_param(&c, "b", 2, D(3, 4), GEN_ANY);
    gc_run(&c, spmd_mse(c.g, a, b));

    /* Targets as an input: only a gets a gradient. */
    gc_init(&c, "mse against an input");
    a = gc_param(&c, "a", 1, D(5), GEN_ANY);
    b = gc_input(&c, "target", 1, D(5), GEN_ANY);
    gc_run(&c, spmd_mse(c.g, a, b));
}

/* ---- Layout ------------------------------------------------------------------------------ */

static void test_reshape(void **state)
{
    (void)state;
    static const shape to[] = {{2, {6, 4}}, {3, {4, 3, 2}}, {1, {24}}, {4, {2, 1, 12, 1}}};
    for (size_t i = 0; i < sizeof to / sizeof to[0]; i++) {
        gcheck c;
        gc_init(&c, "reshape %zu", i);
        spmd_tensor *x = gc_param(&c, "x", 3, D(2, 3, 4), GEN_ANY);
        gc_run(&c, spmd_reshape(c.g, x, to[i].rank, to[i].dims));
    }
}

/* A transfer there and back (one device: copies): its adjoint is the
 * transfer back, placed on the stage the value left. */
static void test_stage_transfer(void **state)
{
    (void)state;
    gcheck c;
    gc_init(&c, "stage_transfer 0 -> 2 -> 1");
    spmd_tensor *x = gc_param(&c, "x", 2, D(3, 4), GEN_ANY);
    spmd_tensor *y = spmd_stage_transfer(c.g, spmd_stage_transfer(c.g, x, 0, 2), 2, 1);
    assert_int_equal(spmd_tensor_stage(y), 1);
    gc_run(&c, y);
}

static void test_permute(void **state)
{
    (void)state;
    static const int perms[][3] = {{2, 0, 1}, {1, 2, 0}, {0, 2, 1}, {2, 1, 0}};
    for (size_t i = 0; i < sizeof perms / sizeof perms[0]; i++) {
        gcheck c;
        gc_init(&c, "permute (%d %d %d)", perms[i][0], perms[i][1], perms[i][2]);
        spmd_tensor *x = gc_param(&c, "x", 3, D(2, 3, 4), GEN_ANY);
        gc_run(&c, spmd_permute(c.g, x, perms[i]));
    }
    gcheck c;
    gc_init(&c, "transpose 0 3 of 4-D");
    spmd_tensor *x = gc_param(&c, "x", 4, D(2, 3, 1, 4), GEN_ANY);
    gc_run(&c, spmd_transpose(c.g, x, 0, 3));
}

static void test_slice(void **state)
{
    (void)state;
    static const struct {
        int axis;
        int64_t start, len;
    } s[] = {{1, 1, 3}, {0, 1, 1}, {2, 0, 2}, {2, 2, 2}, {1, 0, 5}};
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) {
        gcheck c;
        gc_init(&c, "slice axis %d [%lld:+%lld]", s[i].axis, (long long)s[i].start,
                (long long)s[i].len);
        spmd_tensor *x = gc_param(&c, "x", 3, D(2, 5, 4), GEN_ANY);
        gc_run(&c, spmd_slice(c.g, x, s[i].axis, s[i].start, s[i].len));
    }
}

static void test_concat(void **state)
{
    (void)state;
    gcheck c;
    gc_init(&c, "concat axis 1");
    spmd_tensor *xs[3];
    xs[0] = gc_param(&c, "x0", 3, D(2, 1, 4), GEN_ANY);
    xs[1] = gc_param(&c, "x1", 3, D(2, 3, 4), GEN_ANY);
    xs[2] = gc_param(&c, "x2", 3, D(2, 2, 4), GEN_ANY);
    gc_run(&c, spmd_concat(c.g, xs, 3, 1));

    gc_init(&c, "concat axis 0");
    xs[0] = gc_param(&c, "x0", 2, D(1, 3), GEN_ANY);
    xs[1] = gc_param(&c, "x1", 2, D(2, 3), GEN_ANY);
    gc_run(&c, spmd_concat(c.g, xs, 2, 0));

    /* The last axis, with one part an input that gets no adjoint. */
    gc_init(&c, "concat last axis");
    xs[0] = gc_param(&c, "x0", 3, D(2, 2, 1), GEN_ANY);
    xs[1] = gc_input(&c, "x1", 3, D(2, 2, 2), GEN_ANY);
    xs[2] = gc_param(&c, "x2", 3, D(2, 2, 3), GEN_ANY);
    gc_run(&c, spmd_concat(c.g, xs, 3, 2));
}

/* ---- Whole graphs ------------------------------------------------------------------------- */

/* A small MLP with a reused weight, a shared input of two ops, a data input
 * and an unused parameter: accumulation and pruning together. */
static void test_composite(void **state)
{
    (void)state;
    gcheck c;
    gc_init(&c, "composite");
    spmd_tensor *x = gc_input(&c, "x", 2, D(3, 4), GEN_ANY);
    spmd_tensor *w = gc_param(&c, "w", 2, D(4, 4), GEN_ANY);
    spmd_tensor *b = gc_param(&c, "b", 1, D(4), GEN_ANY);
    spmd_tensor *unused = gc_param(&c, "unused", 1, D(3), GEN_ANY);
    (void)unused;
    spmd_tensor *h = spmd_tanh(c.g, spmd_add(c.g, spmd_matmul(c.g, x, w, false, true), b));
    h = spmd_matmul(c.g, h, w, false, false); /* w again */
    spmd_tensor *y = spmd_add(c.g, spmd_mul(c.g, h, h), spmd_exp(c.g, spmd_scale(c.g, h, 0.5f)));
    gc_run(&c, spmd_mean(c.g, y, 1, false));
}

/* Dropout with its key held (the step an input fed the same each run, as
 * finite differences run the program again and again): linear in x, its
 * adjoint is the same mask on dy. */
static void test_dropout(void **state)
{
    (void)state;
    static const float ps[] = {0.25f, 0.6f, 1.0f};
    for (size_t k = 0; k < sizeof ps / sizeof ps[0]; k++) {
        gcheck c;
        gc_init(&c, "dropout p %g", (double)ps[k]);
        spmd_tensor *x = gc_param(&c, "x", 3, D(2, 3, 5), GEN_ANY);
        spmd_tensor *step = gc_input(&c, "step", 0, NULL, GEN_ANY);
        *(float *)c.iv[c.ni - 1] = 3.0f;
        gc_run(&c, ir_dropout(c.g, x, step, ps[k], 2));
    }
}

/* spmd_dropout's gradient in the run that drew its mask, exactly: dloss/dx
 * = R / (1 - p) where y kept x (y != 0: x has no zeros), else 0. */
static void test_dropout_masks_the_adjoint(void **state)
{
    (void)state;
    const float p = 0.3f, scale = (float)(1.0 / (1.0 - (double)p));
    enum { N = 4096 };
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_tensor *x = spmd_param(g, "x", 1, D(N), (spmd_init){SPMD_INIT_UNIFORM, 1.0f});
    spmd_tensor *r = spmd_input(g, "R", SPMD_F32, 1, D(N));
    spmd_tensor *y = spmd_dropout(g, x, p);
    spmd_tensor *loss = spmd_sum(g, spmd_mul(g, y, r), 1, false);
    assert_int_equal(spmd_grad(g, loss), SPMD_OK);
    assert_int_equal(spmd_graph_mark_output(g, y), SPMD_OK);
    assert_int_equal(spmd_graph_mark_output(g, spmd_tensor_grad(x)), SPMD_OK);
    spmd_program *prog = spmd_compile(g, &(spmd_compile_options){.threads = 2, .seed = 9});
    assert_non_null(prog);
    static float rv[N], xv[N], yv[N], dx[N];
    for (int i = 0; i < N; i++) rv[i] = (float)(i % 7) - 3.5f;
    assert_int_equal(spmd_program_set_input(prog, r, rv, sizeof rv), SPMD_OK);
    assert_int_equal(spmd_program_run(prog), SPMD_OK);
    assert_int_equal(spmd_program_read(prog, x, xv, sizeof xv), SPMD_OK);
    assert_int_equal(spmd_program_read(prog, y, yv, sizeof yv), SPMD_OK);
    assert_int_equal(spmd_program_read(prog, spmd_tensor_grad(x), dx, sizeof dx), SPMD_OK);
    int kept = 0;
    for (int i = 0; i < N; i++) {
        assert_true(xv[i] != 0.0f);
        bool keep = yv[i] != 0.0f;
        kept += keep;
        if (keep) assert_true(yv[i] == xv[i] * scale);
        float want = keep ? rv[i] * scale : 0.0f;
        if (memcmp(&dx[i], &want, sizeof want) != 0)
            fail_msg("dx[%d] is %.9g, want %.9g (y %.9g)", i, (double)dx[i], (double)want,
                     (double)yv[i]);
    }
    assert_true(kept > N / 2 && kept < N * 9 / 10);
    spmd_program_free(prog);
    spmd_graph_free(g);
}

/* ---- What spmd_grad refuses ----------------------------------------------------------------- */

static void test_grad_names(void **state)
{
    (void)state;
    spmd_clear_error();
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_tensor *p = spmd_param(g, "p", 0, NULL, (spmd_init){SPMD_INIT_ONES, 0});
    spmd_tensor *q = spmd_param(g, "q", 0, NULL, (spmd_init){SPMD_INIT_ONES, 0});
    spmd_tensor *r = spmd_param(g, "r", 2, D(2, 3), (spmd_init){SPMD_INIT_ONES, 0});
    /* p + q hands the same adjoint to both; r is unused. */
    spmd_tensor *loss = spmd_add(g, p, q);
    assert_non_null(loss);
    assert_null(spmd_tensor_grad(p));
    assert_int_equal(spmd_grad(g, loss), SPMD_OK);
    assert_ptr_equal(spmd_graph_find(g, "p.grad"), spmd_tensor_grad(p));
    assert_ptr_equal(spmd_graph_find(g, "q.grad"), spmd_tensor_grad(q));
    assert_ptr_equal(spmd_graph_find(g, "r.grad"), spmd_tensor_grad(r));
    assert_int_equal(spmd_tensor_rank(spmd_tensor_grad(r)), 2);
    assert_int_equal(spmd_tensor_dim(spmd_tensor_grad(r), 1), 3);
    assert_string_equal(spmd_tensor_op_name(spmd_tensor_grad(r)), "fill");
    assert_true(g->has_grad);
    /* Twice is refused. */
    assert_int_equal(spmd_grad(g, loss), SPMD_ERR_INVALID);
    assert_non_null(strstr(spmd_last_error(), "already"));
    spmd_graph_free(g);
}

static void test_non_scalar_loss(void **state)
{
    (void)state;
    spmd_clear_error();
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_tensor *p = spmd_param(g, "p", 2, D(2, 3), (spmd_init){SPMD_INIT_ONES, 0});
    spmd_tensor *y = spmd_exp(g, p);
    assert_int_equal(spmd_tensor_set_name(y, "activations"), SPMD_OK);
    int before = spmd_graph_tensor_count(g);
    assert_int_equal(spmd_grad(g, y), SPMD_ERR_SHAPE);
    const char *msg = spmd_last_error();
    assert_non_null(strstr(msg, "activations"));
    assert_non_null(strstr(msg, "[2, 3]"));
    assert_int_equal(spmd_graph_tensor_count(g), before);
    assert_null(spmd_tensor_grad(p));

    /* An int32 scalar is no loss either. */
    spmd_tensor *n = spmd_input(g, "count", SPMD_I32, 0, NULL);
    assert_int_equal(spmd_grad(g, n), SPMD_ERR_INVALID);
    assert_non_null(strstr(spmd_last_error(), "count"));

    /* Neither refusal used up the graph's one backward pass. */
    assert_int_equal(spmd_grad(g, spmd_sum(g, y, 3, false)), SPMD_OK);
    assert_non_null(spmd_tensor_grad(p));
    spmd_graph_free(g);
}

static void test_backward_only_op(void **state)
{
    (void)state;
    spmd_clear_error();
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_tensor *p = spmd_param(g, "p", 2, D(2, 3), (spmd_init){SPMD_INIT_ONES, 0});
    spmd_tensor *dy = spmd_input(g, "dy", SPMD_F32, 2, D(2, 3));
    spmd_tensor *r = ir_relu_backward(g, p, dy);
    assert_non_null(r);
    spmd_tensor *loss = spmd_sum(g, r, 3, false);
    assert_non_null(loss);
    int before = spmd_graph_tensor_count(g);
    assert_int_equal(spmd_grad(g, loss), SPMD_ERR_UNSUPPORTED);
    assert_non_null(strstr(spmd_last_error(), "relu_backward"));
    /* Refused before anything was appended. */
    assert_int_equal(spmd_graph_tensor_count(g), before);
    assert_false(g->has_grad);
    assert_null(spmd_tensor_grad(p));

    /* The rule itself says the same when called directly. */
    assert_false(ir_op_has_vjp(IR_RELU_BACKWARD));
    assert_true(ir_op_has_vjp(IR_MATMUL));
    spmd_tensor *dx[IR_MAX_INPUTS] = {0};
    spmd_clear_error();
    assert_int_equal(ir_op_vjp(IR_RELU_BACKWARD)(g, r, r, dx), SPMD_ERR_UNSUPPORTED);
    assert_non_null(strstr(spmd_last_error(), "cannot differentiate through relu_backward"));
    spmd_graph_free(g);
}

/* Inputs no parameter reaches get no adjoint ops: the data input of a
 * matmul costs no second matmul. */
static void test_prunes_unneeded_adjoints(void **state)
{
    (void)state;
    spmd_clear_error();
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_tensor *x = spmd_input(g, "x", SPMD_F32, 2, D(3, 4));
    spmd_tensor *w = spmd_param(g, "w", 2, D(5, 4), (spmd_init){SPMD_INIT_ONES, 0});
    spmd_tensor *loss = spmd_sum(g, spmd_matmul(g, x, w, false, true), 3, false);
    assert_int_equal(spmd_grad(g, loss), SPMD_OK);
    int matmuls = 0;
    for (int i = 0; i < spmd_graph_tensor_count(g); i++)
        matmuls += strcmp(spmd_tensor_op_name(spmd_graph_tensor(g, i)), "matmul") == 0;
    assert_int_equal(matmuls, 2); /* forward and dw */
    spmd_tensor *gw = spmd_tensor_grad(w);
    assert_int_equal(spmd_tensor_rank(gw), 2);
    assert_int_equal(spmd_tensor_dim(gw, 0), 5);
    assert_int_equal(spmd_tensor_dim(gw, 1), 4);
    spmd_graph_free(g);
}

static void test_reduce_to_shape(void **state)
{
    (void)state;
    spmd_clear_error();
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_tensor *dy = spmd_input(g, "dy", SPMD_F32, 3, D(2, 3, 4));
    spmd_tensor *same = spmd_input(g, "same", SPMD_F32, 3, D(2, 3, 4));
    spmd_tensor *col = spmd_input(g, "col", SPMD_F32, 2, D(3, 1));
    spmd_tensor *row = spmd_input(g, "row", SPMD_F32, 1, D(4));
    spmd_tensor *bad = spmd_input(g, "bad", SPMD_F32, 1, D(5));
    assert_ptr_equal(ir_reduce_to_shape(g, dy, same), dy);
    spmd_tensor *r = ir_reduce_to_shape(g, dy, col);
    assert_non_null(r);
    assert_int_equal(spmd_tensor_rank(r), 2);
    assert_int_equal(spmd_tensor_dim(r, 0), 3);
    assert_int_equal(spmd_tensor_dim(r, 1), 1);
    r = ir_reduce_to_shape(g, dy, row);
    assert_non_null(r);
    assert_int_equal(spmd_tensor_rank(r), 1);
    assert_int_equal(spmd_tensor_dim(r, 0), 4);
    assert_null(ir_reduce_to_shape(g, dy, bad));
    assert_non_null(strstr(spmd_last_error(), "'bad' [5]"));
    spmd_graph_free(g);
}

int main(void)
{
    test_seed = test_announce_seed("test_grad", 20261129u);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grad_names),
        cmocka_unit_test(test_non_scalar_loss),
        cmocka_unit_test(test_backward_only_op),
        cmocka_unit_test(test_prunes_unneeded_adjoints),
        cmocka_unit_test(test_reduce_to_shape),
        cmocka_unit_test(test_add),
        cmocka_unit_test(test_sub),
        cmocka_unit_test(test_mul),
        cmocka_unit_test(test_div),
        cmocka_unit_test(test_expand),
        cmocka_unit_test(test_unary),
        cmocka_unit_test(test_every_elementwise_op),
        cmocka_unit_test(test_elementwise_by_name_refusals),
        cmocka_unit_test(test_pow_scalar),
        cmocka_unit_test(test_where),
        cmocka_unit_test(test_sum),
        cmocka_unit_test(test_mean),
        cmocka_unit_test(test_max),
        cmocka_unit_test(test_cumsum),
        cmocka_unit_test(test_max_pool2d),
        cmocka_unit_test(test_avg_pool2d),
        cmocka_unit_test(test_adaptive_avg_pool2d),
        cmocka_unit_test(test_softmax),
        cmocka_unit_test(test_log_softmax),
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_batch_norm),
        cmocka_unit_test(test_batch_norm_backward_rows),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_bmm),
        cmocka_unit_test(test_conv2d),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_cross_entropy),
        cmocka_unit_test(test_mse),
        cmocka_unit_test(test_reshape),
        cmocka_unit_test(test_permute),
        cmocka_unit_test(test_stage_transfer),
        cmocka_unit_test(test_slice),
        cmocka_unit_test(test_concat),
        cmocka_unit_test(test_composite),
        cmocka_unit_test(test_dropout),
        cmocka_unit_test(test_dropout_masks_the_adjoint),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
