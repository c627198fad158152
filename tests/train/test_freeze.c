/*
 * Frozen parameters (spmd_param_freeze): held constant as fine-tuning
 * holds a layer with requires_grad=False.
 *
 *   A constant: a model with a frozen embedding and a frozen inner weight
 *     trains under AdamW with clipping exactly as the same model with
 *     those two as state tensors of the same names (the same initial
 *     values): the same losses and trained weights bit for bit; the frozen
 *     ones keep their initial bits, have no gradient and no optimizer
 *     state, and spmd_graph_param_count leaves them out.
 *   Under FSDP (spmd_fsdp_wrap over 4x2 replica, fsdp): the frozen
 *     weights are marked and gathered like the others (the inner one again
 *     in the backward pass, which reads it), keep their bits, and the run
 *     follows one device.
 *   Checkpoints save and load them; spmd_sgd passes over them too.
 *   Refusals: freezing what is no parameter, or after spmd_grad; a group
 *     naming a frozen parameter; a graph whose parameters are all frozen.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spmd/checkpoint.h"
#include "spmd/mesh.h"
#include "spmd/spmd.h"
#include "spmd/train.h"
#include "support_check.h"
#include "support_files.h"
#include "support_rng.h"

#define D(...) ((const int64_t[]){__VA_ARGS__})

enum { VOCAB = 16, DIM = 8, HIDDEN = 16, OUT = 8, BATCH = 16, STEPS = 5 };
#define MAX_NUMEL (VOCAB * HIDDEN)

/* How the model's two frozen tensors are made. */
typedef enum { AS_FROZEN, AS_STATE } frozen_as;

typedef struct model {
    spmd_graph *g;
    spmd_program *p;
    spmd_mesh *m;
    spmd_tensor *ids, *y, *loss;
    spmd_optimizer_tensors ot;
} model;

static spmd_tensor *find(spmd_graph *g, const char *name)
{
    spmd_tensor *t = spmd_graph_find(g, name);
    if (!t) fail_msg("the graph has no tensor '%s'", name);
    return t;
}

/* mse(relu(embedding(emb, ids) w1) w2 + b2, y): emb and w2 frozen (or
 * states), w1 and b2 trained; the backward pass reads w2 to reach w1. */
static void build(model *r, frozen_as how, const char *mesh)
{
    memset(r, 0, sizeof *r);
    spmd_graph *g = r->g = spmd_graph_create(NULL);
    assert_non_null(g);
    spmd_tensor *(*leaf)(spmd_graph *, const char *, int, const int64_t *, spmd_init) =
        how == AS_STATE ? spmd_state : spmd_param;
    spmd_tensor *emb = leaf(g, "emb", 2, D(VOCAB, DIM), (spmd_init){SPMD_INIT_NORMAL, 1.0f});
    spmd_tensor *w1 = spmd_param(g, "w1", 2, D(DIM, HIDDEN), (spmd_init){SPMD_INIT_NORMAL, 0.3f});
    spmd_tensor *w2 = leaf(g, "w2", 2, D(HIDDEN, OUT), (spmd_init){SPMD_INIT_NORMAL, 0.3f});
    spmd_tensor *b2 = spmd_param(g, "b2", 1, D(OUT), (spmd_init){SPMD_INIT_UNIFORM, 0.1f});
    if (how == AS_FROZEN) {
        assert_int_equal(spmd_param_freeze(emb), SPMD_OK);
        assert_int_equal(spmd_param_freeze(w2), SPMD_OK);
        assert_int_equal(spmd_param_freeze(w2), SPMD_OK); /* twice is once */
    }
    r->ids = spmd_input(g, "ids", SPMD_I32, 1, D(BATCH));
    r->y = spmd_input(g, "y", SPMD_F32, 2, D(BATCH, OUT));
    spmd_tensor *h = spmd_relu(g, spmd_matmul(g, spmd_embedding(g, emb, r->ids), w1, false, false));
    r->loss = spmd_mse(g, spmd_add(g, spmd_matmul(g, h, w2, false, false), b2), r->y);
    assert_int_equal(spmd_graph_mark_output(g, r->loss), SPMD_OK);
    if (mesh) {
        r->m = spmd_mesh_parse(mesh, "replica,fsdp");
        spmd_tensor *in[2] = {r->ids, r->y};
        assert_int_equal(spmd_fsdp_wrap(g, r->m, "fsdp", in, 2, NULL), SPMD_OK);
    }
    assert_int_equal(spmd_grad(g, r->loss), SPMD_OK);
    spmd_optimizer opt = {.kind = SPMD_OPTIMIZER_ADAMW, .weight_decay = 0.1f, .clip_norm = 0.5f};
    if (spmd_optimizer_apply(g, &opt, &r->ot) != SPMD_OK) fail_msg("optimizer: %s", spmd_last_error());
    spmd_compile_options co = {.threads = mesh ? 8 : 2, .seed = 7};
    r->p = spmd_compile(g, &co);
    if (!r->p) fail_msg("compile: %s", spmd_last_error());
}

static void drop(model *r)
{
    spmd_program_free(r->p);
    spmd_graph_free(r->g);
    spmd_mesh_free(r->m);
}

static float step(model *r, int s)
{
    test_rng rng = test_rng_for((uint64_t)s, "freeze");
    int32_t ids[BATCH];
    float y[BATCH * OUT], lr = 0.05f, loss = NAN;
    for (int i = 0; i < BATCH; i++) ids[i] = test_rng_int(&rng, 0, VOCAB - 1);
    for (int i = 0; i < BATCH * OUT; i++) y[i] = test_rng_float(&rng, -1.0f, 1.0f);
    assert_int_equal(spmd_program_set_input(r->p, r->ids, ids, sizeof ids), SPMD_OK);
    assert_int_equal(spmd_program_set_input(r->p, r->y, y, sizeof y), SPMD_OK);
    assert_int_equal(spmd_program_set_input(r->p, r->ot.lr, &lr, sizeof lr), SPMD_OK);
    if (spmd_program_run(r->p) != SPMD_OK) fail_msg("run: %s", spmd_last_error());
    assert_int_equal(spmd_program_read(r->p, r->loss, &loss, sizeof loss), SPMD_OK);
    return loss;
}

static int64_t read_named(const model *r, const char *name, float *v)
{
    spmd_tensor *t = find(r->g, name);
    int64_t n = spmd_tensor_numel(t);
    assert_true(n <= MAX_NUMEL);
    if (spmd_program_read(r->p, t, v, (size_t)n * sizeof *v) != SPMD_OK)
        fail_msg("read '%s': %s", name, spmd_last_error());
    return n;
}

static const char *const frozen_names[] = {"emb", "w2"};
static const char *const trained_names[] = {"w1", "b2"};

static void test_frozen_is_a_constant(void **state)
{
    (void)state;
    model a, b;
    build(&a, AS_FROZEN, NULL);
    build(&b, AS_STATE, NULL);
    float start[2][MAX_NUMEL];
    for (int k = 0; k < 2; k++) read_named(&a, frozen_names[k], start[k]);
    for (int s = 0; s < STEPS; s++) {
        float la = step(&a, s), lb = step(&b, s);
        assert_memory_equal(&la, &lb, sizeof la);
    }
    for (int k = 0; k < 2; k++) {
        float va[MAX_NUMEL], vb[MAX_NUMEL];
        int64_t n = read_named(&a, trained_names[k], va);
        read_named(&b, trained_names[k], vb);
        assert_memory_equal(va, vb, (size_t)n * sizeof *va);
        n = read_named(&a, frozen_names[k], va);
        assert_memory_equal(va, start[k], (size_t)n * sizeof *va); /* its first bits */
        spmd_tensor *t = find(a.g, frozen_names[k]);
        assert_true(spmd_tensor_is_param(t) && spmd_tensor_is_frozen(t));
        assert_null(spmd_tensor_grad(t));
        char name[32];
        snprintf(name, sizeof name, "%s.exp_avg", frozen_names[k]);
        assert_null(spmd_graph_find(a.g, name));
        snprintf(name, sizeof name, "%s.grad", frozen_names[k]);
        assert_null(spmd_graph_find(a.g, name));
        assert_false(spmd_tensor_is_frozen(find(a.g, trained_names[k])));
        assert_non_null(spmd_tensor_grad(find(a.g, trained_names[k])));
    }
    assert_int_equal(spmd_graph_param_count(a.g), DIM * HIDDEN + OUT);
    assert_int_equal(spmd_graph_tensor_count(a.g), spmd_graph_tensor_count(b.g));
    drop(&a);
    drop(&b);
}

/* The collective of the program moving `tensor` in `phase`, if any. */
static bool moves(const spmd_program *p, const char *kind, const char *tensor, const char *phase)
{
    for (int i = 0; i < spmd_program_collective_count(p); i++) {
        spmd_collective_info c;
        assert_int_equal(spmd_program_collective(p, i, &c), SPMD_OK);
        if (!strcmp(c.kind, kind) && !strcmp(c.tensor, tensor) && !strcmp(c.phase, phase)) return true;
    }
    return false;
}

static void test_frozen_under_fsdp(void **state)
{
    (void)state;
    model one, mesh;
    build(&one, AS_FROZEN, NULL);
    build(&mesh, AS_FROZEN, "4x2");
    float start[2][MAX_NUMEL];
    for (int k = 0; k < 2; k++) read_named(&mesh, frozen_names[k], start[k]);
    for (int s = 0; s < STEPS; s++) {
        float a = step(&one, s), b = step(&mesh, s);
        assert_true(fabsf(a - b) <= 1e-5f * fabsf(a));
    }
    for (int k = 0; k < 2; k++) {
        float va[MAX_NUMEL], vb[MAX_NUMEL];
        int64_t n = read_named(&one, trained_names[k], va);
        read_named(&mesh, trained_names[k], vb);
        assert_true(test_close_enough(trained_names[k], vb, va, n, 1e-6, 1e-5));
        n = read_named(&mesh, frozen_names[k], vb);
        assert_memory_equal(vb, start[k], (size_t)n * sizeof *vb);
        char mark[64];
        spmd_get_sharding(find(mesh.g, frozen_names[k]), mark, sizeof mark);
        assert_non_null(strstr(mark, "fsdp")); /* spmd_fsdp_wrap marked it */
    }
    /* Gathered where read, as FSDP gathers every weight: w2 again in the
     * backward pass. */
    assert_true(moves(mesh.p, "all-gather", "emb", "forward"));
    assert_true(moves(mesh.p, "all-gather", "w2", "forward"));
    assert_true(moves(mesh.p, "all-gather", "w2", "backward"));
    assert_false(moves(mesh.p, "all-gather", "emb", "update"));
    assert_false(moves(mesh.p, "all-gather", "w2", "update"));
    drop(&one);
    drop(&mesh);
}

static void test_frozen_in_checkpoints(void **state)
{
    (void)state;
    model r;
    build(&r, AS_FROZEN, "4x2");
    step(&r, 0);
    float before[MAX_NUMEL], zeros[MAX_NUMEL] = {0}, after[MAX_NUMEL];
    int64_t n = read_named(&r, "w2", before);
    char *dir = support_temp_dir("spmd-freeze");
    assert_int_equal(spmd_checkpoint_save(r.p, dir, 1, NULL, 0), SPMD_OK);
    assert_int_equal(spmd_program_write(r.p, find(r.g, "w2"), zeros, (size_t)n * sizeof *zeros), SPMD_OK);
    assert_int_equal(spmd_checkpoint_load(r.p, dir, NULL, NULL), SPMD_OK);
    read_named(&r, "w2", after);
    assert_memory_equal(before, after, (size_t)n * sizeof *after);
    support_drop_dir(dir);
    drop(&r);
}

/* spmd_sgd's plain update passes over frozen parameters too. */
static void test_plain_sgd_passes_over_frozen(void **state)
{
    (void)state;
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_tensor *w = spmd_param(g, "w", 1, D(4), (spmd_init){SPMD_INIT_ONES, 0});
    spmd_tensor *f = spmd_param(g, "f", 1, D(4), (spmd_init){SPMD_INIT_ONES, 0});
    assert_int_equal(spmd_param_freeze(f), SPMD_OK);
    spmd_tensor *x = spmd_input(g, "x", SPMD_F32, 1, D(4));
    assert_int_equal(spmd_grad(g, spmd_sum(g, spmd_mul(g, spmd_mul(g, w, f), x), 1u, false)), SPMD_OK);
    spmd_tensor *lr = spmd_input(g, "lr", SPMD_F32, 0, NULL);
    assert_int_equal(spmd_sgd(g, lr), SPMD_OK);
    spmd_program *p = spmd_compile(g, &(spmd_compile_options){.threads = 1});
    assert_non_null(p);
    float xs[4] = {1, 2, 3, 4}, rate = 0.5f, wv[4], fv[4];
    assert_int_equal(spmd_program_set_input(p, x, xs, sizeof xs), SPMD_OK);
    assert_int_equal(spmd_program_set_input(p, lr, &rate, sizeof rate), SPMD_OK);
    assert_int_equal(spmd_program_run(p), SPMD_OK);
    assert_int_equal(spmd_program_read(p, w, wv, sizeof wv), SPMD_OK);
    assert_int_equal(spmd_program_read(p, f, fv, sizeof fv), SPMD_OK);
    for (int i = 0; i < 4; i++) {
        assert_true(wv[i] == 1.0f - 0.5f * xs[i]);
        assert_true(fv[i] == 1.0f);
    }
    spmd_program_free(p);
    spmd_graph_free(g);
}

static void expect_message(spmd_status st, spmd_status want, const char *needle)
{
    if (st != want)
        fail_msg("want %s for '%s', got %s (%s)", spmd_status_name(want), needle,
                 spmd_status_name(st), spmd_last_error());
    if (!strstr(spmd_last_error(), needle))
        fail_msg("message \"%s\" does not mention \"%s\"", spmd_last_error(), needle);
}

static void test_refusals(void **state)
{
    (void)state;
    expect_message(spmd_param_freeze(NULL), SPMD_ERR_INVALID, "NULL");
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_tensor *w = spmd_param(g, "w", 1, D(4), (spmd_init){SPMD_INIT_ONES, 0});
    spmd_tensor *f = spmd_param(g, "f", 1, D(4), (spmd_init){SPMD_INIT_ONES, 0});
    spmd_tensor *s = spmd_state(g, "s", 1, D(4), (spmd_init){SPMD_INIT_ONES, 0});
    spmd_tensor *x = spmd_input(g, "x", SPMD_F32, 1, D(4));
    expect_message(spmd_param_freeze(s), SPMD_ERR_INVALID, "'s' is not a parameter (its op is state)");
    expect_message(spmd_param_freeze(x), SPMD_ERR_INVALID, "'x' is not a parameter (its op is input)");
    assert_int_equal(spmd_param_freeze(f), SPMD_OK);
    spmd_tensor *y = spmd_mul(g, spmd_mul(g, w, f), spmd_mul(g, s, x));
    assert_int_equal(spmd_grad(g, spmd_sum(g, y, 1u, false)), SPMD_OK);
    expect_message(spmd_param_freeze(w), SPMD_ERR_INVALID, "freeze before spmd_grad");
    assert_int_equal(spmd_param_freeze(f), SPMD_OK); /* frozen already: nothing changes */

    /* A group naming a frozen parameter; patterns pass over it. */
    const char *const named[] = {"w", "f"}, *const all[] = {"*"};
    const spmd_optimizer sgd = {.kind = SPMD_OPTIMIZER_SGD};
    spmd_optimizer_group gr = {.params = named, .n_params = 2};
    int before = spmd_graph_tensor_count(g);
    expect_message(spmd_optimizer_apply_groups(g, &sgd, &gr, 1, NULL, NULL), SPMD_ERR_INVALID,
                   "group 0's 'f' matches only frozen parameters ('f'): a frozen parameter has "
                   "no update");
    assert_int_equal(spmd_graph_tensor_count(g), before);
    gr = (spmd_optimizer_group){.params = all, .n_params = 1, .momentum = 0.9f};
    assert_int_equal(spmd_optimizer_apply_groups(g, &sgd, &gr, 1, NULL, NULL), SPMD_OK);
    assert_non_null(spmd_graph_find(g, "w.momentum"));
    assert_null(spmd_graph_find(g, "f.momentum"));
    spmd_graph_free(g);

    /* Every parameter frozen: nothing to train. */
    g = spmd_graph_create(NULL);
    f = spmd_param(g, "f", 1, D(4), (spmd_init){SPMD_INIT_ONES, 0});
    x = spmd_input(g, "x", SPMD_F32, 1, D(4));
    assert_int_equal(spmd_param_freeze(f), SPMD_OK);
    assert_int_equal(spmd_grad(g, spmd_sum(g, spmd_mul(g, f, x), 1u, false)), SPMD_OK);
    expect_message(spmd_optimizer_apply(g, &sgd, NULL), SPMD_ERR_INVALID,
                   "no trained parameters (none, or all frozen)");
    assert_int_equal(spmd_graph_param_count(g), 0);
    spmd_graph_free(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_frozen_is_a_constant),
        cmocka_unit_test(test_frozen_under_fsdp),
        cmocka_unit_test(test_frozen_in_checkpoints),
        cmocka_unit_test(test_plain_sgd_passes_over_frozen),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
