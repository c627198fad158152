/*
 * Dropout end to end (docs/DESIGN.md, "Random numbers"):
 *
 *   - its statistics over 10^6 elements: the kept fraction within 4 sigma
 *     of 1 - p (each of Philox's four words too), every kept value
 *     exactly 1 / (1 - p), and the masks of two sites, two steps and two
 *     seeds different and uncorrelated (|r| < 4 / sqrt(n));
 *   - on meshes 1, 2, 4 and 2x2, with the batch and the hidden dim split
 *     plainly, unevenly (an empty block), over two axes and in groups, and
 *     the dropped value resharded from its operand, the masks, values,
 *     gradients and updated parameters of an elementwise chain under SGD
 *     are the one device's bit for bit, step after step (the step
 *     advancing); a two-layer MLP with its hidden layer dropped agrees
 *     within rounding;
 *   - gradient accumulation: each micro-batch draws its own mask, the
 *     same on every mesh;
 *   - a checkpoint keeps the step: a program on another mesh that loads
 *     it draws the masks the saving program draws next.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "spmd/checkpoint.h"
#include "spmd/mesh.h"
#include "spmd/spmd.h"
#include "spmd/train.h"
#include "support_files.h"

#define D(...) ((const int64_t[]){__VA_ARGS__})
#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    assert_non_null(p);
    return p;
}

static void ok(spmd_status st, const char *what)
{
    if (st != SPMD_OK) fail_msg("%s: %s", what, spmd_last_error());
}

static void read_all(const spmd_program *p, const spmd_tensor *t, float *dst)
{
    ok(spmd_program_read(p, t, dst, (size_t)spmd_tensor_numel(t) * sizeof *dst), "read");
}

/* ---- Statistics -------------------------------------------------------------------------- */

enum { STAT_N = 1000 * 1000 };

/* Two sites over the same ones. */
typedef struct stats {
    spmd_graph *g;
    spmd_tensor *x, *y[2];
    spmd_program *p;
} stats;

static void stats_build(stats *s, float p, uint64_t seed)
{
    s->g = spmd_graph_create(NULL);
    s->x = spmd_input(s->g, "x", SPMD_F32, 2, D(1000, 1000));
    for (int k = 0; k < 2; k++) {
        s->y[k] = spmd_dropout(s->g, s->x, p);
        ok(spmd_graph_mark_output(s->g, s->y[k]), "mark output");
    }
    s->p = spmd_compile(s->g, &(spmd_compile_options){.threads = 2, .seed = seed});
    assert_non_null(s->p);
    float *ones = xmalloc(STAT_N * sizeof *ones);
    for (int i = 0; i < STAT_N; i++) ones[i] = 1.0f;
    ok(spmd_program_set_input(s->p, s->x, ones, STAT_N * sizeof *ones), "set x");
    free(ones);
}

static void stats_free(stats *s)
{
    spmd_program_free(s->p);
    spmd_graph_free(s->g);
}

/* A run: each site's mask (1 kept) into keep[k]. */
static void stats_run(stats *s, float p, unsigned char *keep[2])
{
    ok(spmd_program_run(s->p), "run");
    float *y = xmalloc(STAT_N * sizeof *y);
    const float scale = (float)(1.0 / (1.0 - (double)p));
    for (int k = 0; k < 2; k++) {
        read_all(s->p, s->y[k], y);
        for (int i = 0; i < STAT_N; i++) {
            if (y[i] != 0.0f && y[i] != scale)
                fail_msg("p %g: element %d is %.9g, neither 0 nor 1 / (1 - p) = %.9g", (double)p, i,
                         (double)y[i], (double)scale);
            keep[k][i] = y[i] != 0.0f;
        }
    }
    free(y);
}

/* The kept count of a mask, of every 4th element from `lane` (stride 4),
 * or of all (stride 1), within 4 sigma of (1 - p) n. */
static void check_fraction(const unsigned char *keep, int lane, int stride, float p, const char *what)
{
    int64_t n = 0, kept = 0;
    for (int i = lane; i < STAT_N; i += stride, n++) kept += keep[i];
    double mean = (1.0 - p) * (double)n, sigma = sqrt((double)n * p * (1.0 - p));
    if (fabs((double)kept - mean) > 4.0 * sigma)
        fail_msg("%s, p %g: %lld of %lld kept, expected %.0f +- %.0f (4 sigma)", what, (double)p,
                 (long long)kept, (long long)n, mean, 4.0 * sigma);
}

/* Two masks differ, and their correlation is within 4 / sqrt(n) of 0. */
static void check_independent(const unsigned char *a, const unsigned char *b, const char *what)
{
    double n = STAT_N, ka = 0, kb = 0, both = 0;
    int64_t differ = 0;
    for (int i = 0; i < STAT_N; i++) {
        ka += a[i];
        kb += b[i];
        both += a[i] & b[i];
        differ += a[i] != b[i];
    }
    if (!differ) fail_msg("%s: the same mask", what);
    double r = (both * n - ka * kb) / sqrt(ka * (n - ka) * kb * (n - kb));
    if (fabs(r) > 4.0 / sqrt(n)) fail_msg("%s: correlation %.5f, beyond 4 / sqrt(n)", what, r);
}

static void test_statistics(void **state)
{
    (void)state;
    static const float ps[] = {0.1f, 0.5f};
    unsigned char *keep[3][2];
    for (int r = 0; r < 3; r++)
        for (int k = 0; k < 2; k++) keep[r][k] = xmalloc(STAT_N);
    for (size_t j = 0; j < ARRAY_LEN(ps); j++) {
        float p = ps[j];
        stats s, other;
        stats_build(&s, p, 5);
        stats_run(&s, p, keep[0]);
        stats_run(&s, p, keep[1]); /* the next step */
        stats_build(&other, p, 6);
        stats_run(&other, p, keep[2]);
        check_fraction(keep[0][0], 0, 1, p, "site 0");
        check_fraction(keep[0][1], 0, 1, p, "site 1");
        check_fraction(keep[1][0], 0, 1, p, "site 0, step 1");
        for (int lane = 0; lane < 4; lane++) check_fraction(keep[0][0], lane, 4, p, "a word of the four");
        check_independent(keep[0][0], keep[0][1], "two sites");
        check_independent(keep[0][0], keep[1][0], "two steps");
        check_independent(keep[0][1], keep[1][1], "two steps of site 1");
        check_independent(keep[0][0], keep[2][0], "two seeds");
        stats_free(&s);
        stats_free(&other);
    }
    for (int r = 0; r < 3; r++)
        for (int k = 0; k < 2; k++) free(keep[r][k]);
}

/* ---- An elementwise chain on meshes, bit for bit ------------------------------------------ */

enum { B = 6, H = 12, STEPS = 3 };

/* x [B, H] a parameter: y1 = dropout(x, 0.3), y2 = dropout(tanh(y1), 0.5),
 * loss = sum(y2 * R), SGD with lr.  Every value but the loss is computed
 * element by element, so any mesh gives the one device's bits. */
typedef struct chain {
    spmd_mesh *mesh;
    spmd_graph *g;
    spmd_tensor *x, *r, *lr, *y1, *y2, *loss;
    spmd_program *p;
} chain;

/* The chain on `shape` (NULL: one device, no marks), x and y1 marked as
 * given (NULL: not marked). */
static void chain_build(chain *c, const char *shape, const char *axes, const char *x_spec,
                        const char *y1_spec)
{
    memset(c, 0, sizeof *c);
    c->g = spmd_graph_create(NULL);
    spmd_graph *g = c->g;
    c->x = spmd_param(g, "x", 2, D(B, H), (spmd_init){SPMD_INIT_UNIFORM, 1.0f});
    c->r = spmd_input(g, "R", SPMD_F32, 2, D(B, H));
    c->lr = spmd_input(g, "lr", SPMD_F32, 0, NULL);
    c->y1 = spmd_dropout(g, c->x, 0.3f);
    c->y2 = spmd_dropout(g, spmd_tanh(g, c->y1), 0.5f);
    c->loss = spmd_sum(g, spmd_mul(g, c->y2, c->r), 3, false);
    assert_non_null(c->loss);
    if (shape) {
        c->mesh = spmd_mesh_parse(shape, axes);
        assert_non_null(c->mesh);
        if (x_spec) ok(spmd_mark_sharding(g, c->x, c->mesh, x_spec), x_spec);
        if (y1_spec) ok(spmd_mark_sharding(g, c->y1, c->mesh, y1_spec), y1_spec);
    }
    ok(spmd_grad(g, c->loss), "grad");
    spmd_tensor *outs[] = {c->loss, c->y1, c->y2, spmd_tensor_grad(c->x)};
    for (size_t i = 0; i < ARRAY_LEN(outs); i++) ok(spmd_graph_mark_output(g, outs[i]), "output");
    ok(spmd_sgd(g, c->lr), "sgd");
    c->p = spmd_compile(g, &(spmd_compile_options){.threads = 2, .seed = 3});
    if (!c->p) fail_msg("compile on %s (x %s, y1 %s): %s", shape, x_spec, y1_spec, spmd_last_error());
    float r[B * H], lr = 0.1f;
    for (int i = 0; i < B * H; i++) r[i] = (float)((i * 7) % 11) / 5.0f - 1.0f;
    ok(spmd_program_set_input(c->p, c->r, r, sizeof r), "set R");
    ok(spmd_program_set_input(c->p, c->lr, &lr, sizeof lr), "set lr");
}

static void chain_free(chain *c)
{
    spmd_program_free(c->p);
    spmd_graph_free(c->g);
    spmd_mesh_free(c->mesh);
}

/* What a step leaves: y1, y2, the gradient and the updated x, and the loss. */
typedef struct chain_values {
    float y1[B * H], y2[B * H], dx[B * H], x[B * H], loss;
} chain_values;

static void chain_step(chain *c, chain_values *v)
{
    ok(spmd_program_run(c->p), "run");
    read_all(c->p, c->y1, v->y1);
    read_all(c->p, c->y2, v->y2);
    read_all(c->p, spmd_tensor_grad(c->x), v->dx);
    read_all(c->p, c->x, v->x);
    read_all(c->p, c->loss, &v->loss);
}

static void same_bits(const float *got, const float *want, int n, const char *what, const char *label,
                      int step)
{
    for (int i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof *got) != 0)
            fail_msg("%s, step %d: %s[%d] is %.9g, the one device's %.9g", label, step, what, i,
                     (double)got[i], (double)want[i]);
}

static void test_meshes_draw_the_one_device_masks(void **state)
{
    (void)state;
    static const struct {
        const char *shape, *axes, *x, *y1;
    } cases[] = {
        {"1", "x", "x, None", NULL},
        {"2", "x", "x, None", NULL},              /* the batch */
        {"2", "x", "None, x", NULL},              /* the hidden dim */
        {"2", "x", "None, 2*x", "x, None"},       /* grouped, then resharded */
        {"4", "x", "x, None", NULL},              /* 6 rows over 4: 2, 2, 2, 0 */
        {"4", "x", "None, x", "x, None"},
        {"4", "x", "None, 3*x", NULL},
        {"2x2", "x,y", "x, y", NULL},
        {"2x2", "x,y", "y, x", "(x, y), None"},
        {"2x2", "x,y", "(x, y), None", "None, (y, x)"},
        {"2x2", "x,y", "y, 3*x", NULL},
        {"2x2", "x,y", NULL, "x, y"},            /* x whole, the dropped value split */
    };
    chain one;
    chain_build(&one, NULL, NULL, NULL, NULL);
    chain_values want[STEPS];
    for (int s = 0; s < STEPS; s++) chain_step(&one, &want[s]);
    chain_free(&one);
    /* The steps draw different masks. */
    assert_true(memcmp(want[0].y1, want[1].y1, sizeof want[0].y1) != 0);
    for (size_t k = 0; k < ARRAY_LEN(cases); k++) {
        char label[160];
        snprintf(label, sizeof label, "mesh %s (%s), x '%s', y1 '%s'", cases[k].shape, cases[k].axes,
                 cases[k].x ? cases[k].x : "-", cases[k].y1 ? cases[k].y1 : "-");
        chain c;
        chain_build(&c, cases[k].shape, cases[k].axes, cases[k].x, cases[k].y1);
        for (int s = 0; s < STEPS; s++) {
            chain_values got;
            chain_step(&c, &got);
            same_bits(got.y1, want[s].y1, B * H, "y1", label, s);
            same_bits(got.y2, want[s].y2, B * H, "y2", label, s);
            same_bits(got.dx, want[s].dx, B * H, "dx", label, s);
            same_bits(got.x, want[s].x, B * H, "updated x", label, s);
            if (!(fabsf(got.loss - want[s].loss) <= 1e-5f + 1e-5f * fabsf(want[s].loss)))
                fail_msg("%s, step %d: loss %.9g, the one device's %.9g", label, s, (double)got.loss,
                         (double)want[s].loss);
        }
        chain_free(&c);
    }
}

/* ---- A two-layer MLP, within rounding ------------------------------------------------------ */

enum { MB = 8, MIN = 6, MH = 16, MOUT = 4 };

typedef struct mlp {
    spmd_mesh *mesh;
    spmd_graph *g;
    spmd_tensor *in, *target, *lr, *w1, *w2, *d, *loss;
    spmd_program *p;
} mlp;

static void mlp_build(mlp *m, const char *shape, const char *axes, const char *in_spec,
                      const char *w1_spec)
{
    memset(m, 0, sizeof *m);
    spmd_graph *g = m->g = spmd_graph_create(NULL);
    m->in = spmd_input(g, "in", SPMD_F32, 2, D(MB, MIN));
    m->target = spmd_input(g, "target", SPMD_F32, 2, D(MB, MOUT));
    m->lr = spmd_input(g, "lr", SPMD_F32, 0, NULL);
    m->w1 = spmd_param(g, "w1", 2, D(MIN, MH), (spmd_init){SPMD_INIT_NORMAL, 0.5f});
    m->w2 = spmd_param(g, "w2", 2, D(MH, MOUT), (spmd_init){SPMD_INIT_NORMAL, 0.5f});
    spmd_tensor *h = spmd_relu(g, spmd_matmul(g, m->in, m->w1, false, false));
    m->d = spmd_dropout(g, h, 0.25f);
    m->loss = spmd_mse(g, spmd_matmul(g, m->d, m->w2, false, false), m->target);
    assert_non_null(m->loss);
    if (shape) {
        m->mesh = spmd_mesh_parse(shape, axes);
        assert_non_null(m->mesh);
        if (in_spec) ok(spmd_mark_sharding(g, m->in, m->mesh, in_spec), in_spec);
        if (w1_spec) ok(spmd_mark_sharding(g, m->w1, m->mesh, w1_spec), w1_spec);
    }
    ok(spmd_grad(g, m->loss), "grad");
    spmd_tensor *outs[] = {m->loss, m->d, spmd_tensor_grad(m->w1), spmd_tensor_grad(m->w2)};
    for (size_t i = 0; i < ARRAY_LEN(outs); i++) ok(spmd_graph_mark_output(g, outs[i]), "output");
    ok(spmd_sgd(g, m->lr), "sgd");
    m->p = spmd_compile(g, &(spmd_compile_options){.threads = 2, .seed = 11});
    if (!m->p) fail_msg("compile on %s: %s", shape, spmd_last_error());
    float in[MB * MIN], target[MB * MOUT], lr = 0.05f;
    for (int i = 0; i < MB * MIN; i++) in[i] = (float)((i * 5) % 13) / 6.0f - 1.0f;
    for (int i = 0; i < MB * MOUT; i++) target[i] = (float)((i * 3) % 7) / 3.0f - 1.0f;
    ok(spmd_program_set_input(m->p, m->in, in, sizeof in), "set in");
    ok(spmd_program_set_input(m->p, m->target, target, sizeof target), "set target");
    ok(spmd_program_set_input(m->p, m->lr, &lr, sizeof lr), "set lr");
}

static void mlp_free(mlp *m)
{
    spmd_program_free(m->p);
    spmd_graph_free(m->g);
    spmd_mesh_free(m->mesh);
}

enum { MLP_VALUES = 1 + MB * MH + MIN * MH + MH * MOUT + MIN * MH };

/* loss, d, dw1, dw2 and the updated w1, one after the other. */
static void mlp_step(mlp *m, float *v)
{
    ok(spmd_program_run(m->p), "run");
    read_all(m->p, m->loss, v);
    read_all(m->p, m->d, v + 1);
    read_all(m->p, spmd_tensor_grad(m->w1), v + 1 + MB * MH);
    read_all(m->p, spmd_tensor_grad(m->w2), v + 1 + MB * MH + MIN * MH);
    read_all(m->p, m->w1, v + 1 + MB * MH + MIN * MH + MH * MOUT);
}

static void test_mlp_on_meshes(void **state)
{
    (void)state;
    static const struct {
        const char *shape, *axes, *in, *w1;
    } cases[] = {
        {"2", "x", "x, None", NULL},         /* data parallel */
        {"4", "x", NULL, "None, x"},         /* the hidden layer over 4 */
        {"2x2", "x,y", "x, None", "None, y"},
    };
    mlp one;
    mlp_build(&one, NULL, NULL, NULL, NULL);
    float want[STEPS][MLP_VALUES], got[MLP_VALUES];
    for (int s = 0; s < STEPS; s++) mlp_step(&one, want[s]);
    mlp_free(&one);
    for (size_t k = 0; k < ARRAY_LEN(cases); k++) {
        mlp m;
        mlp_build(&m, cases[k].shape, cases[k].axes, cases[k].in, cases[k].w1);
        for (int s = 0; s < STEPS; s++) {
            mlp_step(&m, got);
            for (int i = 0; i < MLP_VALUES; i++)
                if (!(fabs((double)got[i] - want[s][i]) <= 1e-5 + 1e-4 * fabs((double)want[s][i])))
                    fail_msg("mesh %s, step %d: value %d is %.9g, the one device's %.9g",
                             cases[k].shape, s, i, (double)got[i], (double)want[s][i]);
        }
        mlp_free(&m);
    }
}

/* ---- Micro-batches ------------------------------------------------------------------------ */

/* The chain's y1 with SGD over 2 micro-batches a step: per micro-batch of
 * two steps, y1 into v[step * 2 + micro]. */
static void accumulated_masks(const char *shape, const char *axes, const char *x_spec,
                              float v[4][B * H])
{
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_tensor *x = spmd_param(g, "x", 2, D(B, H), (spmd_init){SPMD_INIT_UNIFORM, 1.0f});
    spmd_tensor *y1 = spmd_dropout(g, x, 0.5f);
    spmd_tensor *loss = spmd_mean(g, spmd_mul(g, y1, y1), 3, false);
    spmd_mesh *mesh = shape ? spmd_mesh_parse(shape, axes) : NULL;
    if (mesh) ok(spmd_mark_sharding(g, x, mesh, x_spec), x_spec);
    ok(spmd_grad(g, loss), "grad");
    ok(spmd_graph_mark_output(g, y1), "output");
    spmd_optimizer_tensors t;
    ok(spmd_optimizer_apply(g, &(spmd_optimizer){.kind = SPMD_OPTIMIZER_SGD, .accumulate_steps = 2}, &t),
       "optimizer");
    spmd_program *p = spmd_compile(g, &(spmd_compile_options){.threads = 2, .seed = 4});
    assert_non_null(p);
    float lr = 0.1f;
    ok(spmd_program_set_input(p, t.lr, &lr, sizeof lr), "set lr");
    for (int step = 0; step < 2; step++) {
        ok(spmd_program_accumulate(p), "accumulate");
        read_all(p, y1, v[step * 2]);
        ok(spmd_program_run(p), "run");
        read_all(p, y1, v[step * 2 + 1]);
    }
    spmd_program_free(p);
    spmd_graph_free(g);
    spmd_mesh_free(mesh);
}

static void test_micro_batches_draw_their_own_masks(void **state)
{
    (void)state;
    float one[4][B * H], mesh[4][B * H];
    accumulated_masks(NULL, NULL, NULL, one);
    for (int a = 0; a < 4; a++)
        for (int b = a + 1; b < 4; b++)
            if (!memcmp(one[a], one[b], sizeof one[a]))
                fail_msg("micro-batches %d and %d drew the same mask", a, b);
    accumulated_masks("2x2", "x,y", "y, x", mesh);
    for (int a = 0; a < 4; a++) same_bits(mesh[a], one[a], B * H, "y1", "2x2, accumulating", a);
}

/* ---- Checkpoints --------------------------------------------------------------------------- */

static void test_checkpoint_resumes_the_masks(void **state)
{
    (void)state;
    char *dir = support_temp_dir("spmd-dropout");
    chain a, b;
    chain_values v;
    chain_build(&a, "2", "x", "x, None", NULL);
    chain_step(&a, &v);
    chain_step(&a, &v);
    ok(spmd_checkpoint_save(a.p, dir, 2, NULL, 0), "save");
    chain_values next;
    chain_step(&a, &next);

    chain_build(&b, "2x2", "x,y", "y, x", NULL);
    chain_values fresh;
    chain_step(&b, &fresh); /* step 0's masks, before the load */
    int64_t step = -1;
    ok(spmd_checkpoint_load(b.p, dir, &step, NULL), "load");
    assert_int_equal(step, 2);
    float count = -1.0f;
    read_all(b.p, spmd_graph_find(b.g, "rng.step"), &count);
    assert_true(count == 2.0f);
    chain_values resumed;
    chain_step(&b, &resumed);
    same_bits(resumed.y1, next.y1, B * H, "y1", "resumed on 2x2", 2);
    same_bits(resumed.y2, next.y2, B * H, "y2", "resumed on 2x2", 2);
    same_bits(resumed.dx, next.dx, B * H, "dx", "resumed on 2x2", 2);
    same_bits(resumed.x, next.x, B * H, "updated x", "resumed on 2x2", 2);
    chain_free(&a);
    chain_free(&b);
    support_drop_dir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_statistics),
        cmocka_unit_test(test_meshes_draw_the_one_device_masks),
        cmocka_unit_test(test_mlp_on_meshes),
        cmocka_unit_test(test_micro_batches_draw_their_own_masks),
        cmocka_unit_test(test_checkpoint_resumes_the_masks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
