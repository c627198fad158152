/*
 * All-gathers read in place (plan.gather_leaf): under FSDP a parameter
 * split on its rows is gathered whole for the forward pass's x W^T.
 * Where every device is in this process the matmul reads each member's
 * block of rows from the member's own buffer instead: no step, no arena.
 * The losses and weights are those of the plan that gathers, bit for bit,
 * for an MLP and a GPT on meshes 2 'fsdp', 4x2 (replica, fsdp) and
 * 8 'fsdp', with collectives in flight and with gradient accumulation;
 * gathers with another reader (dX = dY W, the embedding's lookup) and
 * blocks that a GEMM tile would straddle keep the copy.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compile/plan.h"
#include "ir/ir.h"
#include "runtime/executor.h"
#include "spmd/data.h"
#include "spmd/mesh.h"
#include "spmd/models.h"
#include "spmd/train.h"

/* The MLP's hidden rows: 512 over 8 devices are 64 rows, a whole GEMM
 * tile of columns (kernels_matmul.c); OUT = 13 rows are padded. */
enum { STEPS = 3, BATCH = 16, IN = 32, HIDDEN = 512, OUT = 13, SEQ = 32, VOCAB = 64, GPT_BATCH = 8 };

static const spmd_gpt_config GPT = {.vocab = VOCAB, .seq = SEQ, .layers = 1, .heads = 4, .dim = 256};

typedef struct setting {
    bool gpt;
    const char *shape, *axes;
    bool overlap;
    int accumulate;
} setting;

typedef struct result {
    float loss[STEPS];
    float *weight; /* the watched weight, whole */
    size_t n_weight;
    int in_place, gather_steps;
} result;

/* Every gather read in place is an all-gather of a parameter along dim 0
 * with no step and no arena bytes, read only as the B of x B^T. */
static void inspect(const compiled *c, result *r)
{
    const plan *pl = &c->plan;
    r->in_place = pl->n_gathers_in_place;
    for (int s = 0; s < pl->n_steps; s++) {
        const spmd_tensor *t = pl->steps[s];
        assert_int_equal(pl->gather_leaf[t->id], -1);
        r->gather_steps += t->op == IR_ALL_GATHER;
    }
    for (int i = 0; i < c->local->n_nodes; i++) {
        const spmd_tensor *t = c->local->nodes[i];
        if (pl->gather_leaf[i] >= 0) {
            assert_int_equal(t->op, IR_ALL_GATHER);
            assert_int_equal(t->attr.coll.dim, 0);
            assert_int_equal(pl->gather_leaf[i], t->in[0]->id);
            assert_int_equal(t->in[0]->op, IR_PARAM);
            assert_int_equal(pl->offset[i], -1);
        }
        for (int j = 0; j < t->n_in && pl->needed[i]; j++)
            if (pl->gather_leaf[t->in[j]->id] >= 0) {
                assert_int_equal(t->op, IR_MATMUL);
                assert_int_equal(j, 1);
                assert_true(t->attr.matmul.tb && !t->attr.matmul.ta);
            }
    }
}

static void feed(spmd_program *p, const setting *set, spmd_tensor *input, spmd_tensor *targets, int k)
{
    if (set->gpt) {
        int32_t ids[GPT_BATCH * SEQ], tg[GPT_BATCH * SEQ];
        assert_int_equal(spmd_data_sequences(7, (int64_t)k * GPT_BATCH, GPT_BATCH, SEQ, VOCAB, ids, tg), SPMD_OK);
        assert_int_equal(spmd_program_set_input(p, input, ids, sizeof ids), SPMD_OK);
        assert_int_equal(spmd_program_set_input(p, targets, tg, sizeof tg), SPMD_OK);
        return;
    }
    float x[BATCH * IN];
    int32_t y[BATCH];
    for (int i = 0; i < BATCH * IN; i++) x[i] = sinf(0.37f * (float)i + (float)k);
    for (int i = 0; i < BATCH; i++) y[i] = (i * 7 + k) % OUT;
    assert_int_equal(spmd_program_set_input(p, input, x, sizeof x), SPMD_OK);
    assert_int_equal(spmd_program_set_input(p, targets, y, sizeof y), SPMD_OK);
}

static void train(const setting *set, bool in_place, result *r)
{
    memset(r, 0, sizeof *r);
    spmd_mesh *mesh = spmd_mesh_parse(set->shape, set->axes);
    assert_non_null(mesh);
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_tensor *input, *targets, *loss;
    const char *watched;
    if (set->gpt) {
        spmd_gpt_tensors t;
        assert_int_equal(spmd_gpt_build(g, &GPT, GPT_BATCH, &t), SPMD_OK);
        input = t.input, targets = t.targets, loss = t.loss;
        watched = "h.0.attn.c_attn.weight";
    } else {
        spmd_mlp_config cfg = {.in_dim = IN, .hidden = HIDDEN, .layers = 2, .out_dim = OUT};
        spmd_mlp_tensors t;
        assert_int_equal(spmd_mlp_build(g, &cfg, NULL, BATCH, &t), SPMD_OK);
        assert_int_equal(spmd_mlp_add_loss(g, SPMD_MLP_CROSS_ENTROPY, &t), SPMD_OK);
        input = t.input, targets = t.targets, loss = t.loss;
        watched = "fc.1.weight";
    }
    spmd_tensor *in[2] = {input, targets};
    assert_int_equal(spmd_fsdp_wrap(g, mesh, "fsdp", in, 2, NULL), SPMD_OK);
    spmd_optimizer opt = {.kind = SPMD_OPTIMIZER_ADAMW, .weight_decay = 0.1f, .clip_norm = 1.0f,
                          .accumulate_steps = set->accumulate};
    plan_test_gathers(in_place);
    spmd_trainer *tr = spmd_trainer_create(
        g, loss,
        &(spmd_trainer_options){.optimizer = opt,
                                .compile = {.seed = 3, .threads = 2, .overlap = set->overlap}});
    plan_test_gathers(true);
    assert_non_null(tr);
    spmd_program *p = spmd_trainer_program(tr);
    inspect(executor_compiled(p), r);
    for (int s = 0; s < STEPS; s++) {
        int k = s * (set->accumulate > 1 ? set->accumulate : 1);
        for (int m = 1; m < set->accumulate; m++, k++) {
            feed(p, set, input, targets, k);
            assert_int_equal(spmd_trainer_accumulate(tr, NULL), SPMD_OK);
        }
        feed(p, set, input, targets, k);
        assert_int_equal(spmd_trainer_step(tr, 1e-2f, &r->loss[s], NULL), SPMD_OK);
    }
    spmd_tensor *w = spmd_graph_find(g, watched);
    r->n_weight = (size_t)spmd_tensor_numel(w);
    r->weight = malloc(r->n_weight * sizeof *r->weight);
    assert_non_null(r->weight);
    assert_int_equal(spmd_program_read(p, w, r->weight, r->n_weight * sizeof *r->weight), SPMD_OK);
    spmd_trainer_free(tr);
    spmd_graph_free(g);
    spmd_mesh_free(mesh);
}

static void check(const setting *set)
{
    result gathered, read;
    train(set, false, &gathered);
    train(set, true, &read);
    assert_int_equal(gathered.in_place, 0);
    assert_true(read.in_place > 0);
    /* Each gather read in place is a gather step less. */
    assert_int_equal(read.gather_steps + read.in_place, gathered.gather_steps);
    assert_memory_equal(read.loss, gathered.loss, sizeof read.loss);
    assert_int_equal(read.n_weight, gathered.n_weight);
    assert_memory_equal(read.weight, gathered.weight, read.n_weight * sizeof *read.weight);
    for (int s = 0; s < STEPS; s++) assert_true(isfinite(read.loss[s]));
    free(gathered.weight);
    free(read.weight);
}

static void test_mlp(void **state)
{
    (void)state;
    check(&(setting){false, "2", "fsdp", false, 0});
    check(&(setting){false, "4x2", "replica,fsdp", false, 0});
    check(&(setting){false, "8", "fsdp", false, 0});
}

static void test_gpt(void **state)
{
    (void)state;
    check(&(setting){true, "2", "fsdp", false, 0});
    check(&(setting){true, "4x2", "replica,fsdp", false, 0});
    check(&(setting){true, "8", "fsdp", false, 0});
}

/* With collectives in flight on the communication thread beside it. */
static void test_in_flight(void **state)
{
    (void)state;
    check(&(setting){true, "4x2", "replica,fsdp", true, 0});
    check(&(setting){false, "8", "fsdp", true, 0});
}

/* Micro-batches read the same blocks; the update writes them once a step. */
static void test_accumulate(void **state)
{
    (void)state;
    check(&(setting){true, "4x2", "replica,fsdp", false, 2});
    check(&(setting){false, "2", "fsdp", true, 2});
}

/* Which gathers stay copies: the tied embedding (also read by the
 * lookup), the backward pass's (dX = dY W contracts over W's rows), a
 * split on dim 1 (mlp.c_proj.weight), and the MLP's padded last layer. */
static void test_kept(void **state)
{
    (void)state;
    result r;
    train(&(setting){false, "2", "fsdp", false, 0}, true, &r);
    assert_int_equal(r.in_place, 2); /* fc.0 and fc.1, forward */
    assert_true(r.gather_steps > 0);
    free(r.weight);
    train(&(setting){true, "4x2", "replica,fsdp", false, 0}, true, &r);
    assert_int_equal(r.in_place, 3); /* c_attn, attn.c_proj, c_fc, forward */
    assert_true(r.gather_steps > 0);
    free(r.weight);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mlp),        cmocka_unit_test(test_gpt),
        cmocka_unit_test(test_in_flight),  cmocka_unit_test(test_accumulate),
        cmocka_unit_test(test_kept),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
