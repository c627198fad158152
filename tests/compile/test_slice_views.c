/*
 * Slices that are views (plan.view_of): ZeRO reads each replicated
 * parameter through its optimizer state's sharding, a slice of the
 * parameter.  Where the device's block is one run of the parameter's
 * bytes with no padding, the plan has no step and no arena for it and the
 * device reads the parameter's buffer at its block; the losses and
 * weights are those of the plan that copies every slice, bit for bit, on
 * meshes 2 'data', 4x2 (replica, fsdp) and 8 'data', with collectives in
 * flight and with gradient accumulation.  An uneven split keeps its copy.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "compile/plan.h"
#include "ir/ir.h"
#include "runtime/executor.h"
#include "spmd/mesh.h"
#include "spmd/models.h"
#include "spmd/train.h"

/* OUT = 13 rows split over 2 or 8 devices are padded: the last layer's
 * slices stay copies. */
enum { BATCH = 16, IN = 16, HIDDEN = 32, OUT = 13, STEPS = 4 };

typedef struct setting {
    const char *shape, *axes, *fsdp; /* fsdp: the axis spmd_fsdp_wrap shards over, or NULL */
    bool overlap;
    int accumulate;
} setting;

typedef struct result {
    float loss[STEPS];
    float weight[HIDDEN * HIDDEN]; /* fc.1.weight */
    int views, slice_steps;
    size_t arena;
    bool last_layer_copied; /* the slices of fc.2.weight are steps */
    int last_layer_steps;   /* and how many */
} result;

static void feed(spmd_program *p, const spmd_mlp_tensors *t, int k)
{
    float x[BATCH * IN];
    int32_t y[BATCH];
    for (int i = 0; i < BATCH * IN; i++) x[i] = sinf(0.37f * (float)i + (float)k);
    for (int i = 0; i < BATCH; i++) y[i] = (i * 7 + k) % OUT;
    assert_int_equal(spmd_program_set_input(p, t->input, x, sizeof x), SPMD_OK);
    assert_int_equal(spmd_program_set_input(p, t->targets, y, sizeof y), SPMD_OK);
}

/* The plan's slices: views, slice steps, and whether the slices of the
 * local leaf named `name` are all steps (true when it has none). */
static void inspect(const compiled *c, const char *name, result *r)
{
    const plan *pl = &c->plan;
    r->views = pl->n_views;
    r->arena = pl->arena_bytes;
    r->last_layer_copied = true;
    for (int s = 0; s < pl->n_steps; s++) {
        const spmd_tensor *t = pl->steps[s];
        assert_int_equal(pl->view_of[t->id], -1); /* a view is no step */
        r->slice_steps += t->op == IR_SHARD_SLICE;
        r->last_layer_steps += t->op == IR_SHARD_SLICE && t->in[0]->name && !strcmp(t->in[0]->name, name);
    }
    for (int i = 0; i < c->local->n_nodes; i++) {
        const spmd_tensor *t = c->local->nodes[i];
        if (pl->view_of[i] >= 0) {
            const spmd_tensor *leaf = c->local->nodes[pl->view_of[i]];
            assert_int_equal(t->op, IR_SHARD_SLICE);
            assert_ptr_equal(t->in[0], leaf);
            assert_int_equal(leaf->op, IR_PARAM); /* ZeRO's view of a parameter */
        }
        if (t->op == IR_SHARD_SLICE && pl->needed[i] && t->in[0]->name &&
            !strcmp(t->in[0]->name, name) && pl->view_of[i] >= 0)
            r->last_layer_copied = false;
    }
}

static void train(const setting *set, bool views, result *r)
{
    memset(r, 0, sizeof *r);
    spmd_mesh *mesh = spmd_mesh_parse(set->shape, set->axes);
    assert_non_null(mesh);
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_mlp_config cfg = {.in_dim = IN, .hidden = HIDDEN, .layers = 2, .out_dim = OUT};
    spmd_mlp_tensors t;
    assert_int_equal(spmd_mlp_build(g, &cfg, NULL, BATCH, &t), SPMD_OK);
    assert_int_equal(spmd_mlp_add_loss(g, SPMD_MLP_CROSS_ENTROPY, &t), SPMD_OK);
    spmd_tensor *in[2] = {t.input, t.targets};
    assert_int_equal(set->fsdp ? spmd_fsdp_wrap(g, mesh, set->fsdp, in, 2, NULL)
                               : spmd_shard_batch(g, mesh, in, 2, NULL),
                     SPMD_OK);
    spmd_optimizer opt = {.kind = SPMD_OPTIMIZER_ADAMW, .weight_decay = 0.1f, .clip_norm = 1.0f,
                          .zero = SPMD_ZERO_ON, .accumulate_steps = set->accumulate};
    plan_test_views(views);
    spmd_trainer *tr = spmd_trainer_create(
        g, t.loss,
        &(spmd_trainer_options){.optimizer = opt,
                                .compile = {.seed = 3, .threads = 2, .overlap = set->overlap}});
    plan_test_views(true);
    assert_non_null(tr);
    spmd_program *p = spmd_trainer_program(tr);
    inspect(executor_compiled(p), "fc.2.weight", r);
    for (int s = 0; s < STEPS; s++) {
        int k = s * (set->accumulate > 1 ? set->accumulate : 1);
        for (int m = 1; m < set->accumulate; m++, k++) {
            feed(p, &t, k);
            assert_int_equal(spmd_trainer_accumulate(tr, NULL), SPMD_OK);
        }
        feed(p, &t, k);
        assert_int_equal(spmd_trainer_step(tr, 1e-2f, &r->loss[s], NULL), SPMD_OK);
    }
    assert_int_equal(spmd_program_read(p, spmd_graph_find(g, "fc.1.weight"), r->weight, sizeof r->weight),
                     SPMD_OK);
    spmd_trainer_free(tr);
    spmd_graph_free(g);
    spmd_mesh_free(mesh);
}

static void check(const setting *set)
{
    result copied, viewed;
    train(set, false, &copied);
    train(set, true, &viewed);
    assert_int_equal(copied.views, 0);
    assert_true(viewed.views > 0);
    /* Each view is a slice step less, and no arena byte more. */
    assert_int_equal(viewed.slice_steps + viewed.views, copied.slice_steps);
    assert_true(viewed.arena <= copied.arena);
    assert_true(viewed.last_layer_copied);
    assert_memory_equal(viewed.loss, copied.loss, sizeof viewed.loss);
    assert_memory_equal(viewed.weight, copied.weight, sizeof viewed.weight);
    for (int s = 0; s < STEPS; s++) assert_true(isfinite(viewed.loss[s]));
}

static void test_data_2(void **state)
{
    (void)state;
    check(&(setting){"2", "data", NULL, false, 0});
}

static void test_replica_fsdp_4x2(void **state)
{
    (void)state;
    check(&(setting){"4x2", "replica,fsdp", "fsdp", false, 0});
}

static void test_data_8(void **state)
{
    (void)state;
    check(&(setting){"8", "data", NULL, false, 0});
}

/* A view read by collectives on the communication thread. */
static void test_in_flight(void **state)
{
    (void)state;
    check(&(setting){"4x2", "replica,fsdp", "fsdp", true, 0});
    check(&(setting){"2", "data", NULL, true, 0});
}

/* Micro-batches skip the update, and the parameters' buffers are written
 * by copies (no swaps) once per step. */
static void test_accumulate(void **state)
{
    (void)state;
    check(&(setting){"4x2", "replica,fsdp", "fsdp", false, 2});
    check(&(setting){"2", "data", NULL, true, 2});
}

/* The last layer's 13 rows over 2 devices: padded, so its slices copy
 * (the weight's block of dim 1 is not one run either). */
static void test_uneven_copies(void **state)
{
    (void)state;
    result r;
    train(&(setting){"2", "data", NULL, false, 0}, true, &r);
    assert_true(r.last_layer_copied);
    assert_true(r.last_layer_steps > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_data_2),     cmocka_unit_test(test_replica_fsdp_4x2),
        cmocka_unit_test(test_data_8),     cmocka_unit_test(test_in_flight),
        cmocka_unit_test(test_accumulate), cmocka_unit_test(test_uneven_copies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
