/*
 * Shared parameters (compiled.share_blocks): where every device is in
 * this process, a parameter or state is held once per copy, its devices'
 * blocks side by side in one buffer.  An all-gather of a parameter whose
 * result is that buffer is read in place (plan.gather_leaf: FSDP's
 * gathers, forward and backward), and ZeRO's all-gather of an update
 * into a shared parameter or state lands in place (plan.lands_in: each
 * member writes its slice in the update phase): no step, no arena.  The
 * losses and weights are those of the program that holds every block in
 * each device's buffer and runs every gather, bit for bit, for an MLP
 * and a GPT on meshes 2 'fsdp', 2 'data', 4x2 (replica, fsdp) and
 * 8 'fsdp', with collectives in flight, with gradient accumulation and
 * with ZeRO off; a split on dim 1 and grouped splits keep their gathers.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compile/compiled.h"
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
    bool zero_off;
} setting;

typedef struct result {
    float loss[STEPS];
    float *weight; /* the watched weight, whole */
    size_t n_weight;
    int in_place, lands, gather_steps;
    size_t allocated;
} result;

/* Every gather read in place is an all-gather of a shared parameter with
 * no step and no arena bytes; every one that lands in place an update's
 * value whose operand lives to the end, in the target's next buffer. */
static void inspect(const compiled *c, result *r)
{
    const plan *pl = &c->plan;
    r->in_place = pl->n_gathers_in_place;
    r->lands = pl->n_lands;
    for (int s = 0; s < pl->n_steps; s++) {
        const spmd_tensor *t = pl->steps[s];
        assert_int_equal(pl->gather_leaf[t->id], -1);
        assert_int_equal(pl->lands_in[t->id], -1);
        r->gather_steps += t->op == IR_ALL_GATHER;
    }
    for (int i = 0; i < c->local->n_nodes; i++) {
        const spmd_tensor *t = c->local->nodes[i];
        if (pl->gather_leaf[i] >= 0) {
            assert_int_equal(t->op, IR_ALL_GATHER);
            assert_int_equal(pl->gather_leaf[i], t->in[0]->id);
            assert_int_equal(t->in[0]->op, IR_PARAM);
            assert_true(c->share_blocks[t->in[0]->id] > 0);
            assert_int_equal(pl->offset[i], -1);
        }
        if (pl->lands_in[i] >= 0) {
            assert_int_equal(t->op, IR_ALL_GATHER);
            assert_int_equal(pl->offset[i], -1);
            /* Its slice in the arena, or, outside accumulation, computed
             * in the target's next buffer (no arena). */
            if (c->local->accumulate_steps > 1) assert_true(pl->offset[t->in[0]->id] >= 0);
            else assert_true(pl->swapped[t->in[0]->id] && pl->offset[t->in[0]->id] < 0);
            assert_int_equal(c->sharers[pl->lands_in[i]], c->group_size[t->attr.coll.spec]);
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
    if (strstr(set->axes, "fsdp"))
        assert_int_equal(spmd_fsdp_wrap(g, mesh, "fsdp", in, 2, NULL), SPMD_OK);
    else
        assert_int_equal(spmd_shard_batch(g, mesh, in, 2, NULL), SPMD_OK);
    spmd_optimizer opt = {.kind = SPMD_OPTIMIZER_ADAMW, .weight_decay = 0.1f, .clip_norm = 1.0f,
                          .accumulate_steps = set->accumulate,
                          .zero = set->zero_off ? SPMD_ZERO_OFF : SPMD_ZERO_DEFAULT};
    compile_test_sharing(in_place);
    spmd_trainer *tr = spmd_trainer_create(
        g, loss,
        &(spmd_trainer_options){.optimizer = opt,
                                .compile = {.seed = 3, .threads = 2, .overlap = set->overlap}});
    compile_test_sharing(true);
    assert_non_null(tr);
    spmd_program *p = spmd_trainer_program(tr);
    inspect(executor_compiled(p), r);
    r->allocated = spmd_program_allocated_bytes(p);
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
    result copied, shared;
    train(set, false, &copied);
    train(set, true, &shared);
    assert_memory_equal(shared.loss, copied.loss, sizeof shared.loss);
    assert_int_equal(shared.n_weight, copied.n_weight);
    assert_memory_equal(shared.weight, copied.weight, shared.n_weight * sizeof *shared.weight);
    for (int s = 0; s < STEPS; s++) assert_true(isfinite(shared.loss[s]));
    assert_int_equal(copied.in_place, 0);
    assert_int_equal(copied.lands, 0);
    /* Every replicated update without ZeRO is an all-reduce, no gather. */
    if (!set->zero_off || strstr(set->axes, "fsdp")) assert_true(shared.in_place + shared.lands > 0);
    /* Each gather read or landing in place is a gather step less. */
    assert_int_equal(shared.gather_steps + shared.in_place + shared.lands, copied.gather_steps);
    /* Replicas hold one buffer: less memory (over 'fsdp' alone the
     * blocks are as many, and the arenas are planned apart). */
    if (strstr(set->axes, "data") || strstr(set->axes, "replica"))
        assert_true(shared.allocated < copied.allocated);
    free(copied.weight);
    free(shared.weight);
}

static void test_mlp(void **state)
{
    (void)state;
    check(&(setting){false, "2", "fsdp", false, 0, false});
    check(&(setting){false, "2", "data", false, 0, false});
    check(&(setting){false, "4x2", "replica,fsdp", false, 0, false});
    check(&(setting){false, "8", "fsdp", false, 0, false});
}

static void test_gpt(void **state)
{
    (void)state;
    check(&(setting){true, "2", "fsdp", false, 0, false});
    check(&(setting){true, "2", "data", false, 0, false});
    check(&(setting){true, "4x2", "replica,fsdp", false, 0, false});
    check(&(setting){true, "8", "fsdp", false, 0, false});
}

/* With collectives in flight on the communication thread beside it. */
static void test_in_flight(void **state)
{
    (void)state;
    check(&(setting){true, "4x2", "replica,fsdp", true, 0, false});
    check(&(setting){false, "8", "fsdp", true, 0, false});
    check(&(setting){false, "2", "data", true, 0, false});
}

/* Micro-batches read the same blocks; the update writes them once a step. */
static void test_accumulate(void **state)
{
    (void)state;
    check(&(setting){true, "4x2", "replica,fsdp", false, 2, false});
    check(&(setting){false, "2", "fsdp", true, 2, false});
    check(&(setting){false, "2", "data", false, 2, false});
}

/* Every replica updating whole: each copies its part of the same value
 * into the shared buffer. */
static void test_zero_off(void **state)
{
    (void)state;
    check(&(setting){false, "2", "data", false, 0, true});
    check(&(setting){true, "4x2", "replica,fsdp", false, 0, true});
}

/* What stays a gather: a split on a dim after one longer than 1, whose
 * blocks do not lie side by side (the MLP's last weight [13, 512], split
 * on its columns, forward and backward; the GPT's mlp.c_proj.weight). */
static void test_kept(void **state)
{
    (void)state;
    result r;
    train(&(setting){false, "2", "fsdp", false, 0, false}, true, &r);
    assert_int_equal(r.gather_steps, 2);
    assert_int_equal(r.in_place, 6); /* 2 weights forward and backward, 3 biases forward */
    free(r.weight);
    train(&(setting){true, "4x2", "replica,fsdp", false, 0, false}, true, &r);
    assert_true(r.in_place > 0 && r.lands > 0);
    assert_true(r.gather_steps > 0);
    free(r.weight);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mlp),        cmocka_unit_test(test_gpt),
        cmocka_unit_test(test_in_flight),  cmocka_unit_test(test_accumulate),
        cmocka_unit_test(test_zero_off),   cmocka_unit_test(test_kept),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
