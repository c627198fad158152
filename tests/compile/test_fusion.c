/*
 * Fusion of elementwise chains: random graphs of elementwise ops (scalar
 * and bias broadcasts, values read twice, outputs in the middle of
 * chains) give the same bits fused and unfused, on one device and on a
 * mesh; chains do fuse; a sum of every element of a chain (the gradient
 * norm's squares) fuses into its sum without the chain's buffer, with the
 * sum's bits; a GPT trained with AdamW gives the same losses and
 * parameters fused and unfused, its update in a few passes.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compile/fuse.h"
#include "runtime/executor.h"
#include "runtime/kernels/kernels.h"
#include "spmd/data.h"
#include "spmd/mesh.h"
#include "spmd/models.h"
#include "spmd/train.h"
#include "support_rng.h"

enum { ROWS = 6, COLS = 40, NODES = 24, CASES = 60 };

/* A random elementwise graph over x [ROWS, COLS] and y [ROWS, COLS], with
 * a bias b [COLS] and scalars; `outs` get some nodes marked as outputs. */
static spmd_graph *random_graph(test_rng *r, spmd_tensor **outs, int *n_outs, const spmd_mesh *mesh)
{
    spmd_graph *g = spmd_graph_create(NULL);
    int64_t dims[2] = {ROWS, COLS}, bd[1] = {COLS};
    spmd_tensor *pool[NODES + 4];
    int n = 0;
    pool[n++] = spmd_input(g, "x", SPMD_F32, 2, dims);
    pool[n++] = spmd_input(g, "y", SPMD_F32, 2, dims);
    spmd_tensor *bias = spmd_input(g, "b", SPMD_F32, 1, bd);
    spmd_tensor *scalar = spmd_input(g, "s", SPMD_F32, 0, NULL);
    if (mesh) {
        assert_int_equal(spmd_mark_sharding(g, pool[0], mesh, "data, None"), SPMD_OK);
        assert_int_equal(spmd_mark_sharding(g, pool[1], mesh, "data, None"), SPMD_OK);
    }
    *n_outs = 0;
    for (int k = 0; k < NODES; k++) {
        spmd_tensor *a = pool[test_rng_int(r, 0, n - 1)], *b = pool[test_rng_int(r, 0, n - 1)];
        spmd_tensor *t = NULL;
        switch (test_rng_int(r, 0, 19)) {
        case 0: t = spmd_add(g, a, b); break;
        case 1: t = spmd_sub(g, a, b); break;
        case 2: t = spmd_mul(g, a, b); break;
        case 3: t = spmd_div(g, a, spmd_add(g, spmd_mul(g, b, b), scalar)); break;
        case 4: t = spmd_scale(g, a, test_rng_float(r, -2, 2)); break;
        case 5: t = spmd_neg(g, a); break;
        case 6: t = spmd_tanh(g, a); break;
        case 7: t = spmd_gelu(g, a); break;
        case 8: t = spmd_relu(g, a); break;
        case 9: t = spmd_add(g, a, bias); break;
        case 10: t = spmd_mul(g, a, scalar); break;
        case 11: t = spmd_sqrt(g, spmd_add(g, spmd_mul(g, a, a), scalar)); break;
        case 12: t = spmd_exp(g, spmd_scale(g, spmd_tanh(g, a), 0.5f)); break;
        case 14: t = spmd_gelu_erf(g, a); break;
        case 15: t = spmd_silu(g, a); break;
        case 16: t = spmd_sigmoid(g, a); break;
        case 17: t = spmd_pow_scalar(g, a, test_rng_chance(r, 0.5) ? 2.0f : 3.0f); break;
        /* where over a computed mask, a bias or a scalar in any slot. */
        case 18: t = spmd_where(g, spmd_relu(g, a), b, test_rng_chance(r, 0.5) ? bias : scalar); break;
        case 19: t = spmd_where(g, spmd_relu(g, bias), scalar, a); break;
        default: t = spmd_log(g, spmd_add(g, spmd_exp(g, a), scalar)); break;
        }
        assert_non_null(t);
        pool[n++] = t;
        /* Now and then a value in the middle of a chain is an output. */
        if (test_rng_chance(r, 0.15) && *n_outs < 6) outs[(*n_outs)++] = t;
    }
    outs[(*n_outs)++] = pool[n - 1];
    for (int i = 0; i < *n_outs; i++) assert_int_equal(spmd_graph_mark_output(g, outs[i]), SPMD_OK);
    return g;
}

static void feed(spmd_program *p, spmd_graph *g)
{
    static float v[ROWS * COLS];
    const char *names[] = {"x", "y", "b", "s"};
    size_t sizes[] = {ROWS * COLS, ROWS * COLS, COLS, 1};
    for (int i = 0; i < 4; i++) {
        test_fill_by_name(names[i], v, (int64_t)sizes[i]);
        if (i == 3) v[0] = 0.75f; /* keeps the logs and divisions finite */
        assert_int_equal(spmd_program_set_input(p, spmd_graph_find(g, names[i]), v, sizes[i] * sizeof *v),
                         SPMD_OK);
    }
}

static void compare_random(const char *shape)
{
    uint64_t seed = test_announce_seed(shape ? "test_fusion (mesh)" : "test_fusion", 11);
    spmd_mesh *mesh = shape ? spmd_mesh_parse(shape, "data") : NULL;
    int fused_groups = 0;
    for (int c = 0; c < CASES; c++) {
        char label[32];
        snprintf(label, sizeof label, "case %d", c);
        test_rng r = test_rng_for(seed, label);
        spmd_tensor *outs[8];
        int n_outs;
        spmd_graph *g = random_graph(&r, outs, &n_outs, mesh);
        spmd_program *fused = spmd_compile(g, &(spmd_compile_options){.threads = 3});
        spmd_program *plain = spmd_compile(g, &(spmd_compile_options){.threads = 2, .unfused = true});
        assert_non_null(fused);
        assert_non_null(plain);
        fused_groups += executor_compiled(fused)->fusion.n_groups;
        assert_int_equal(executor_compiled(plain)->fusion.n_groups, 0);
        feed(fused, g), feed(plain, g);
        assert_int_equal(spmd_program_run(fused), SPMD_OK);
        assert_int_equal(spmd_program_run(plain), SPMD_OK);
        for (int i = 0; i < n_outs; i++) {
            size_t bytes = (size_t)spmd_tensor_numel(outs[i]) * sizeof(float);
            float *a = malloc(bytes), *b = malloc(bytes);
            assert_int_equal(spmd_program_read(fused, outs[i], a, bytes), SPMD_OK);
            assert_int_equal(spmd_program_read(plain, outs[i], b, bytes), SPMD_OK);
            if (memcmp(a, b, bytes)) fail_msg("case %d (seed %llu): output %d differs", c,
                                              (unsigned long long)seed, i);
            free(a), free(b);
        }
        spmd_program_free(fused);
        spmd_program_free(plain);
        spmd_graph_free(g);
    }
    /* The graphs are mostly chains: many groups formed. */
    assert_true(fused_groups > CASES);
    spmd_mesh_free(mesh);
}

static void test_random_graphs(void **state)
{
    (void)state;
    compare_random(NULL);
}

static void test_random_graphs_on_mesh(void **state)
{
    (void)state;
    compare_random("3");
}

/* where's formula takes three operands: a masked fill (mask [COLS], fill
 * a scalar) between two elementwise ops is one group, with the fused
 * bits; with an i32 mask, which a group cannot read, where runs on its
 * own (and so do its neighbours), with the same bits as unfused. */
static void test_where_fuses(void **state)
{
    (void)state;
    for (int i32 = 0; i32 <= 1; i32++) {
        spmd_graph *g = spmd_graph_create(NULL);
        int64_t dims[2] = {ROWS, COLS}, bd[1] = {COLS};
        spmd_tensor *x = spmd_input(g, "x", SPMD_F32, 2, dims);
        spmd_tensor *m = spmd_input(g, "m", i32 ? SPMD_I32 : SPMD_F32, 1, bd);
        spmd_tensor *fill = spmd_input(g, "s", SPMD_F32, 0, NULL);
        spmd_tensor *w = spmd_where(g, m, spmd_scale(g, x, 0.5f), fill);
        spmd_tensor *y = spmd_exp(g, w);
        assert_non_null(y);
        assert_int_equal(spmd_graph_mark_output(g, y), SPMD_OK);
        spmd_program *fused = spmd_compile(g, &(spmd_compile_options){.threads = 3});
        spmd_program *plain = spmd_compile(g, &(spmd_compile_options){.threads = 1, .unfused = true});
        assert_non_null(fused);
        assert_non_null(plain);
        const fusion *f = &executor_compiled(fused)->fusion;
        assert_int_equal(f->absorbed[w->id], !i32);
        /* scale-where-exp; with an i32 mask no group of two is left. */
        assert_int_equal(f->n_groups, !i32);
        if (!i32) assert_int_equal(f->groups[0].n_steps, 3);
        float xv[ROWS * COLS], fv = -1.5f, out[2][ROWS * COLS];
        union { float f[COLS]; int32_t i[COLS]; } mv;
        test_fill_by_name("x", xv, ROWS * COLS);
        for (int k = 0; k < COLS; k++) {
            if (i32) mv.i[k] = k % 3 == 0 ? 0 : k; /* any nonzero integer selects a */
            else mv.f[k] = k % 3 == 0 ? 0.0f : 1.0f;
        }
        spmd_program *ps[2] = {fused, plain};
        for (int v = 0; v < 2; v++) {
            assert_int_equal(spmd_program_set_input(ps[v], x, xv, sizeof xv), SPMD_OK);
            assert_int_equal(spmd_program_set_input(ps[v], m, &mv, sizeof mv), SPMD_OK);
            assert_int_equal(spmd_program_set_input(ps[v], fill, &fv, sizeof fv), SPMD_OK);
            assert_int_equal(spmd_program_run(ps[v]), SPMD_OK);
            assert_int_equal(spmd_program_read(ps[v], y, out[v], sizeof out[v]), SPMD_OK);
        }
        assert_memory_equal(out[0], out[1], sizeof out[0]);
        for (int k = 0; k < ROWS * COLS; k++) {
            float want = k % COLS % 3 == 0 ? expf(fv) : expf(xv[k] * 0.5f);
            assert_true(out[0][k] == want || fabsf(out[0][k] - want) <= 1e-6f * want);
        }
        spmd_program_free(fused);
        spmd_program_free(plain);
        spmd_graph_free(g);
    }
}

/* sum(x * x) over every element, and over all but a size-1 dim: one
 * group rooted at the sum (the squares absorbed, no memory of their own),
 * the unfused bits on 1 and 3 threads; a sum that keeps a dim is no root. */
static void test_sum_of_squares_fuses(void **state)
{
    (void)state;
    enum { N = 3 * 1000 + 5 }; /* blocks of 256 and a tail past the lanes */
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_tensor *x = spmd_input(g, "x", SPMD_F32, 3, (const int64_t[]){3, 1, 1000 + 2});
    spmd_tensor *x2 = spmd_input(g, "x2", SPMD_F32, 1, (const int64_t[]){N});
    spmd_tensor *sq = spmd_mul(g, x, x);
    spmd_tensor *all = spmd_sum(g, sq, 1u | 4u, false); /* dim 1 is 1: every element */
    spmd_tensor *sq2 = spmd_scale(g, spmd_mul(g, x2, x2), 0.5f);
    spmd_tensor *all2 = spmd_sum(g, sq2, 1u, true);
    spmd_tensor *rows = spmd_sum(g, spmd_mul(g, x, spmd_exp(g, x)), 4u, false); /* keeps dim 0 */
    assert_non_null(rows);
    assert_int_equal(spmd_graph_mark_output(g, all), SPMD_OK);
    assert_int_equal(spmd_graph_mark_output(g, all2), SPMD_OK);
    assert_int_equal(spmd_graph_mark_output(g, rows), SPMD_OK);
    float xv[3 * 1002], x2v[N], out[3][5];
    test_fill_by_name("x", xv, 3 * 1002);
    test_fill_by_name("x2", x2v, N);
    for (int v = 0; v < 3; v++) {
        spmd_program *p = spmd_compile(g, &(spmd_compile_options){.threads = v == 1 ? 3 : 1,
                                                                  .unfused = v == 2});
        assert_non_null(p);
        if (v < 2) {
            const compiled *c = executor_compiled(p);
            const fuse_group *ga = fusion_group(&c->fusion, all), *gb = fusion_group(&c->fusion, all2);
            assert_non_null(ga);
            assert_non_null(gb);
            assert_true(ga->sum && gb->sum);
            assert_int_equal(ga->n_steps, 2);
            assert_int_equal(gb->n_steps, 3);
            assert_true(c->fusion.absorbed[sq->id] && c->fusion.absorbed[sq2->id]);
            const fuse_group *gr = fusion_group(&c->fusion, rows);
            assert_true(!gr || !gr->sum);
        }
        assert_int_equal(spmd_program_set_input(p, x, xv, sizeof xv), SPMD_OK);
        assert_int_equal(spmd_program_set_input(p, x2, x2v, sizeof x2v), SPMD_OK);
        assert_int_equal(spmd_program_run(p), SPMD_OK);
        assert_int_equal(spmd_program_read(p, all, &out[v][0], sizeof(float)), SPMD_OK);
        assert_int_equal(spmd_program_read(p, all2, &out[v][1], sizeof(float)), SPMD_OK);
        assert_int_equal(spmd_program_read(p, rows, &out[v][2], 3 * sizeof(float)), SPMD_OK);
        spmd_program_free(p);
    }
    assert_memory_equal(out[0], out[2], sizeof out[0]);
    assert_memory_equal(out[1], out[2], sizeof out[0]);
    double want = 0;
    for (int k = 0; k < 3 * 1002; k++) want += (double)xv[k] * xv[k];
    assert_true(fabs(out[0][0] - want) <= 1e-5 * want);
    spmd_graph_free(g);
}

/* A GPT with AdamW on 2x2 (data, fsdp), fused and unfused: the same
 * losses and parameters after 4 steps; each parameter's update takes at
 * most four passes. */
/* A trainer of g's loss with AdamW (decay and clipping): fused or not. */
static spmd_trainer *adamw_trainer(spmd_graph *g, spmd_tensor *loss, uint64_t seed, int threads,
                                   bool unfused)
{
    spmd_trainer_options opts = {
        .optimizer = {.kind = SPMD_OPTIMIZER_ADAMW, .weight_decay = 0.1f, .clip_norm = 1.0f},
        .compile = {.seed = seed, .threads = threads, .unfused = unfused}};
    spmd_trainer *tr = spmd_trainer_create(g, loss, &opts);
    assert_non_null(tr);
    return tr;
}

/* A copy of parameter `name` as p holds it; *bytes its size. */
static float *read_param(spmd_program *p, spmd_graph *g, const char *name, size_t *bytes)
{
    spmd_tensor *w = spmd_graph_find(g, name);
    assert_non_null(w);
    *bytes = (size_t)spmd_tensor_numel(w) * sizeof(float);
    float *x = malloc(*bytes);
    assert_non_null(x);
    assert_int_equal(spmd_program_read(p, w, x, *bytes), SPMD_OK);
    return x;
}

/* An MLP whose AdamW update is over large groups (a 512 x 512 weight,
 * 256K elements, fusion_block's FUSE_BLOCK_LARGE): the same losses and
 * parameters unfused and fused with either block the process may measure
 * faster (kern_fused_set_block), on one device of 2 threads and on 2
 * 'data' (ZeRO's slices). */
static void test_large_blocks_same_bits(void **state)
{
    (void)state;
    enum { B = 16, IN = 8, STEPS = 3 };
    const char *meshes[] = {"1", "2"};
    for (int mi = 0; mi < 2; mi++) {
        float loss[3][STEPS];
        float *weights[3] = {0};
        size_t wbytes = 0;
        for (int v = 0; v < 3; v++) { /* unfused, blocks of 1024, of 256 */
            kern_fused_set_block(v == 1 ? FUSE_BLOCK_LARGE : FUSE_BLOCK);
            spmd_mesh *mesh = spmd_mesh_parse(meshes[mi], "data");
            spmd_graph *g = spmd_graph_create(NULL);
            spmd_mlp_config cfg = {.in_dim = IN, .hidden = 512, .layers = 3, .out_dim = 4};
            spmd_mlp_tensors t;
            assert_int_equal(spmd_mlp_build(g, &cfg, NULL, B, &t), SPMD_OK);
            assert_int_equal(spmd_mlp_add_loss(g, SPMD_MLP_CROSS_ENTROPY, &t), SPMD_OK);
            assert_int_equal(spmd_mark_sharding(g, t.input, mesh, "data, None"), SPMD_OK);
            assert_int_equal(spmd_mark_sharding(g, t.targets, mesh, "data"), SPMD_OK);
            spmd_trainer *tr = adamw_trainer(g, t.loss, 5, 2, v == 0);
            spmd_program *p = spmd_trainer_program(tr);
            float x[B * IN];
            int32_t y[B];
            for (int s = 0; s < STEPS; s++) {
                for (int i = 0; i < B * IN; i++) x[i] = (float)((i * 7 + s * 3) % 11) / 11.0f - 0.5f;
                for (int i = 0; i < B; i++) y[i] = (i + s) % 4;
                assert_int_equal(spmd_program_set_input(p, t.input, x, sizeof x), SPMD_OK);
                assert_int_equal(spmd_program_set_input(p, t.targets, y, sizeof y), SPMD_OK);
                assert_int_equal(spmd_trainer_step(tr, 1e-2f, &loss[v][s], NULL), SPMD_OK);
            }
            weights[v] = read_param(p, g, "fc.1.weight", &wbytes);
            spmd_trainer_free(tr);
            spmd_graph_free(g);
            spmd_mesh_free(mesh);
        }
        for (int v = 1; v < 3; v++) {
            assert_memory_equal(loss[0], loss[v], sizeof loss[0]);
            assert_memory_equal(weights[0], weights[v], wbytes);
        }
        for (int v = 0; v < 3; v++) free(weights[v]);
    }
    kern_fused_set_block(0);
}

static void test_gpt_adamw_same_bits(void **state)
{
    (void)state;
    spmd_gpt_config cfg = {.vocab = 16, .seq = 8, .layers = 2, .heads = 2, .dim = 16};
    float loss[2][4];
    float *weights[2] = {0};
    size_t wbytes = 0;
    int steps_run[2];
    for (int v = 0; v < 2; v++) {
        spmd_mesh *mesh = spmd_mesh_parse("2x2", "data,fsdp");
        spmd_graph *g = spmd_graph_create(NULL);
        spmd_gpt_tensors t;
        assert_int_equal(spmd_gpt_build(g, &cfg, 4, &t), SPMD_OK);
        spmd_tensor *in[2] = {t.input, t.targets};
        assert_int_equal(spmd_fsdp_wrap(g, mesh, "fsdp", in, 2, NULL), SPMD_OK);
        spmd_trainer *tr = adamw_trainer(g, t.loss, 3, 4, v == 1);
        spmd_program *p = spmd_trainer_program(tr);
        steps_run[v] = executor_compiled(p)->plan.n_steps;
        int32_t ids[4 * 8], tg[4 * 8];
        for (int s = 0; s < 4; s++) {
            assert_int_equal(spmd_data_sequences(1, s * 4, 4, cfg.seq, cfg.vocab, ids, tg), SPMD_OK);
            assert_int_equal(spmd_program_set_input(p, t.input, ids, sizeof ids), SPMD_OK);
            assert_int_equal(spmd_program_set_input(p, t.targets, tg, sizeof tg), SPMD_OK);
            assert_int_equal(spmd_trainer_step(tr, 1e-2f, &loss[v][s], NULL), SPMD_OK);
        }
        weights[v] = read_param(p, g, "h.1.mlp.c_fc.weight", &wbytes);
        spmd_trainer_free(tr);
        spmd_graph_free(g);
        spmd_mesh_free(mesh);
    }
    assert_memory_equal(loss[0], loss[1], sizeof loss[0]);
    assert_memory_equal(weights[0], weights[1], wbytes);
    free(weights[0]), free(weights[1]);
    /* Fewer passes: the update's dozen elementwise ops per parameter fold
     * into a few groups. */
    print_message("steps: %d fused, %d unfused\n", steps_run[0], steps_run[1]);
    assert_true(steps_run[0] * 10 < steps_run[1] * 7);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_graphs),
        cmocka_unit_test(test_random_graphs_on_mesh),
        cmocka_unit_test(test_where_fuses),
        cmocka_unit_test(test_sum_of_squares_fuses),
        cmocka_unit_test(test_gpt_adamw_same_bits),
        cmocka_unit_test(test_large_blocks_same_bits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
