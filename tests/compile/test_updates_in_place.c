/*
 * Update values computed into their targets' buffers (plan.in_place for
 * parameters and optimizer state): on one device the MLP's and the
 * GPT's AdamW updates (clipped) are all in place, take no buffer of their
 * own (the peak falls by their bytes) and give the bits of the plan that
 * trades buffers after the run; a run that fails leaves the parameters as
 * they were; a program with collectives keeps its swaps.
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

enum { BATCH = 8, IN = 12, HIDDEN = 24, OUT = 5, SEQ = 8, VOCAB = 16, STEPS = 3, MAX_PARAM = 4096 };

typedef struct result {
    float loss[STEPS];
    float weight[MAX_PARAM];
    size_t peak;
    int in_place, updates; /* of parameters and moments */
} result;

typedef struct model {
    spmd_graph *g;
    spmd_mesh *mesh;
    spmd_tensor *input, *targets, *loss, *lr, *weight;
    spmd_program *p;
    bool gpt;
} model;

static void build(model *m, bool gpt, const char *shape, const char *axes)
{
    memset(m, 0, sizeof *m);
    m->gpt = gpt;
    m->g = spmd_graph_create(NULL);
    if (gpt) {
        spmd_gpt_config cfg = {.vocab = VOCAB, .seq = SEQ, .layers = 2, .heads = 2, .dim = 16};
        spmd_gpt_tensors t;
        assert_int_equal(spmd_gpt_build(m->g, &cfg, BATCH, &t), SPMD_OK);
        m->input = t.input, m->targets = t.targets, m->loss = t.loss;
        m->weight = spmd_graph_find(m->g, "h.1.mlp.c_fc.weight");
    } else {
        spmd_mlp_config cfg = {.in_dim = IN, .hidden = HIDDEN, .layers = 2, .out_dim = OUT};
        spmd_mlp_tensors t;
        assert_int_equal(spmd_mlp_build(m->g, &cfg, NULL, BATCH, &t), SPMD_OK);
        assert_int_equal(spmd_mlp_add_loss(m->g, SPMD_MLP_CROSS_ENTROPY, &t), SPMD_OK);
        m->input = t.input, m->targets = t.targets, m->loss = t.loss;
        m->weight = spmd_graph_find(m->g, "fc.1.weight");
    }
    assert_non_null(m->weight);
    assert_true(ir_numel(m->weight) <= MAX_PARAM);
    if (shape) {
        m->mesh = spmd_mesh_parse(shape, axes);
        assert_non_null(m->mesh);
        assert_int_equal(spmd_mark_sharding(m->g, m->input, m->mesh, "data, None"), SPMD_OK);
    }
    assert_int_equal(spmd_graph_mark_output(m->g, m->loss), SPMD_OK);
    assert_int_equal(spmd_grad(m->g, m->loss), SPMD_OK);
    spmd_optimizer opt = {.kind = SPMD_OPTIMIZER_ADAMW, .weight_decay = 0.01f, .clip_norm = 0.5f};
    spmd_optimizer_tensors ot;
    assert_int_equal(spmd_optimizer_apply(m->g, &opt, &ot), SPMD_OK);
    m->lr = ot.lr;
    m->p = spmd_compile(m->g, &(spmd_compile_options){.seed = 7, .threads = 2});
    assert_non_null(m->p);
    float lr = 0.01f;
    assert_int_equal(spmd_program_set_input(m->p, m->lr, &lr, sizeof lr), SPMD_OK);
}

static void drop(model *m)
{
    spmd_program_free(m->p);
    spmd_graph_free(m->g);
    spmd_mesh_free(m->mesh);
}

/* Step k's batch; `bad` puts a target out of range. */
static void feed(const model *m, int k, bool bad)
{
    int32_t ids[BATCH * SEQ], y[BATCH * SEQ];
    float x[BATCH * IN];
    int n = m->gpt ? BATCH * SEQ : BATCH, classes = m->gpt ? VOCAB : OUT;
    for (int i = 0; i < n; i++) y[i] = (i * 5 + k) % classes, ids[i] = (i * 3 + k) % VOCAB;
    if (bad) y[n - 1] = classes + 3;
    for (int i = 0; i < BATCH * IN; i++) x[i] = sinf(0.3f * (float)i + (float)k);
    if (m->gpt) assert_int_equal(spmd_program_set_input(m->p, m->input, ids, sizeof ids), SPMD_OK);
    else assert_int_equal(spmd_program_set_input(m->p, m->input, x, sizeof x), SPMD_OK);
    assert_int_equal(spmd_program_set_input(m->p, m->targets, y, (size_t)n * sizeof *y), SPMD_OK);
}

static void train(bool gpt, const char *shape, const char *axes, bool in_place, result *r)
{
    memset(r, 0, sizeof *r);
    plan_test_updates_in_place(in_place);
    model m;
    build(&m, gpt, shape, axes);
    plan_test_updates_in_place(true);
    const compiled *c = executor_compiled(m.p);
    const spmd_graph *lg = c->local;
    for (int u = 0; u < lg->n_updates; u++) {
        /* The step count is a scalar, counted before the gradients' norm. */
        if (ir_numel(lg->updates[u].target) == 1) continue;
        r->updates++;
        r->in_place += c->plan.in_place[lg->updates[u].value->id] >= 0;
    }
    r->peak = spmd_program_peak_bytes(m.p);
    for (int k = 0; k < STEPS; k++) {
        feed(&m, k, false);
        assert_int_equal(spmd_program_run(m.p), SPMD_OK);
        assert_int_equal(spmd_program_read(m.p, m.loss, &r->loss[k], sizeof(float)), SPMD_OK);
    }
    assert_int_equal(spmd_program_read(m.p, m.weight, r->weight, ir_nbytes(m.weight)), SPMD_OK);
    drop(&m);
}

static void check_one_device(bool gpt)
{
    result on, off;
    train(gpt, NULL, NULL, true, &on);
    train(gpt, NULL, NULL, false, &off);
    assert_true(on.updates > 0);
    assert_int_equal(on.in_place, on.updates); /* every parameter and moment */
    assert_int_equal(off.in_place, 0);
    assert_true(on.peak < off.peak);
    assert_memory_equal(on.loss, off.loss, sizeof on.loss);
    assert_memory_equal(on.weight, off.weight, sizeof on.weight);
}

static void test_mlp_one_device(void **state)
{
    (void)state;
    check_one_device(false);
}

static void test_gpt_one_device(void **state)
{
    (void)state;
    check_one_device(true);
}

/* Collectives: a peer may read a parameter while the run goes on. */
static void test_mesh_keeps_swaps(void **state)
{
    (void)state;
    result r;
    train(false, "2", "data", true, &r);
    assert_int_equal(r.in_place, 0);
}

/* A target out of range fails the run in the loss, before any update:
 * the parameters are as they were, and the next run trains. */
static void test_failed_run_leaves_parameters(void **state)
{
    (void)state;
    model m;
    build(&m, true, NULL, NULL);
    size_t bytes = ir_nbytes(m.weight);
    float before[MAX_PARAM], after[MAX_PARAM];
    assert_int_equal(spmd_program_read(m.p, m.weight, before, bytes), SPMD_OK);
    feed(&m, 0, true);
    assert_int_not_equal(spmd_program_run(m.p), SPMD_OK);
    assert_int_equal(spmd_program_read(m.p, m.weight, after, bytes), SPMD_OK);
    assert_memory_equal(before, after, bytes);
    feed(&m, 0, false);
    assert_int_equal(spmd_program_run(m.p), SPMD_OK);
    assert_int_equal(spmd_program_read(m.p, m.weight, after, bytes), SPMD_OK);
    assert_memory_not_equal(before, after, bytes);
    drop(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mlp_one_device),
        cmocka_unit_test(test_gpt_one_device),
        cmocka_unit_test(test_mesh_keeps_swaps),
        cmocka_unit_test(test_failed_run_leaves_parameters),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
