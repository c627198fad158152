/*
 * ZeRO (spmd_optimizer.zero): the optimizer state, held gradient
 * and update split over the axes a parameter is replicated over.  On a
 * data-parallel mesh without clipping the losses and weights are the plain
 * optimizer's bits (the reduce-scatter sums as the all-reduce does); with
 * clipping, or FSDP on 2x2, they agree within float rounding; the state is
 * sharded and each device holds less.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"
#include "runtime/executor.h"
#include "shard/partition.h"
#include "spmd/data.h"
#include "spmd/mesh.h"
#include "spmd/models.h"
#include "spmd/train.h"

enum { STEPS = 5 };

typedef struct run {
    float loss[STEPS];
    float *weight;
    size_t bytes, persistent;
    char state_spec[128];
} run;

static void train(const char *shape, const char *axes, const char *fsdp, bool zero,
                  spmd_optimizer_kind kind, float clip, run *r)
{
    spmd_gpt_config cfg = {.vocab = 16, .seq = 8, .layers = 2, .heads = 2, .dim = 16};
    spmd_mesh *mesh = spmd_mesh_parse(shape, axes);
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_gpt_tensors t;
    assert_int_equal(spmd_gpt_build(g, &cfg, 8, &t), SPMD_OK);
    spmd_tensor *in[2] = {t.input, t.targets};
    assert_int_equal(fsdp ? spmd_fsdp_wrap(g, mesh, fsdp, in, 2, NULL) : spmd_shard_batch(g, mesh, in, 2, NULL),
                     SPMD_OK);
    spmd_optimizer opt = {.kind = kind, .weight_decay = 0.1f, .clip_norm = clip, .zero = zero ? SPMD_ZERO_ON : SPMD_ZERO_OFF};
    if (kind == SPMD_OPTIMIZER_SGD) opt.momentum = 0.9f;
    spmd_trainer *tr = spmd_trainer_create(
        g, t.loss, &(spmd_trainer_options){.optimizer = opt, .compile = {.seed = 5, .threads = 4}});
    assert_non_null(tr);
    spmd_program *p = spmd_trainer_program(tr);
    int32_t ids[8 * 8], tg[8 * 8];
    for (int s = 0; s < STEPS; s++) {
        assert_int_equal(spmd_data_sequences(2, s * 8, 8, cfg.seq, cfg.vocab, ids, tg), SPMD_OK);
        assert_int_equal(spmd_program_set_input(p, t.input, ids, sizeof ids), SPMD_OK);
        assert_int_equal(spmd_program_set_input(p, t.targets, tg, sizeof tg), SPMD_OK);
        assert_int_equal(spmd_trainer_step(tr, 1e-2f, &r->loss[s], NULL), SPMD_OK);
    }
    spmd_tensor *w = spmd_graph_find(g, "h.0.mlp.c_fc.weight");
    r->bytes = (size_t)spmd_tensor_numel(w) * sizeof(float);
    r->weight = malloc(r->bytes);
    assert_int_equal(spmd_program_read(p, w, r->weight, r->bytes), SPMD_OK);
    r->persistent = spmd_program_persistent_bytes(p);
    const char *state = kind == SPMD_OPTIMIZER_ADAMW ? "h.0.mlp.c_fc.weight.exp_avg"
                                                    : "h.0.mlp.c_fc.weight.momentum";
    spmd_get_sharding(spmd_graph_find(g, state), r->state_spec, sizeof r->state_spec);
    spmd_trainer_free(tr);
    spmd_graph_free(g);
    spmd_mesh_free(mesh);
}

/* Data parallel over 4: the same bits (without clipping: the global norm
 * of sharded gradients sums in another order), the state split 4 ways. */
static void test_data_parallel_same_bits(void **state)
{
    (void)state;
    for (int k = 0; k < 4; k++) {
        spmd_optimizer_kind kind = k & 1 ? SPMD_OPTIMIZER_SGD : SPMD_OPTIMIZER_ADAMW;
        float clip = k < 2 ? 0.0f : 0.5f;
        run plain = {0}, zero = {0};
        train("4", "data", NULL, false, kind, clip, &plain);
        train("4", "data", NULL, true, kind, clip, &zero);
        if (clip == 0.0f) {
            assert_memory_equal(plain.loss, zero.loss, sizeof plain.loss);
            assert_memory_equal(plain.weight, zero.weight, plain.bytes);
        }
        for (int s = 0; s < STEPS; s++) assert_true(fabsf(plain.loss[s] - zero.loss[s]) <= 1e-5f);
        assert_null(strstr(plain.state_spec, "data"));
        assert_non_null(strstr(zero.state_spec, "data"));
        assert_true(zero.persistent * 10 < plain.persistent * 7); /* the state split 4 ways */
        free(plain.weight), free(zero.weight);
    }
}

/* FSDP on 2x2 (replica, fsdp): the state split over both axes; the sums
 * group differently, so the results agree within rounding. */
static void test_fsdp_replicas(void **state)
{
    (void)state;
    run plain = {0}, zero = {0};
    train("2x2", "replica,fsdp", "fsdp", false, SPMD_OPTIMIZER_ADAMW, 1.0f, &plain);
    train("2x2", "replica,fsdp", "fsdp", true, SPMD_OPTIMIZER_ADAMW, 1.0f, &zero);
    for (int s = 0; s < STEPS; s++) assert_true(fabsf(plain.loss[s] - zero.loss[s]) <= 1e-5f);
    for (size_t i = 0; i < plain.bytes / sizeof(float); i++)
        assert_true(fabsf(plain.weight[i] - zero.weight[i]) <= 1e-5f);
    assert_non_null(strstr(zero.state_spec, "fsdp"));
    assert_non_null(strstr(zero.state_spec, "replica"));
    assert_null(strstr(plain.state_spec, "replica"));
    assert_true(zero.persistent < plain.persistent);
    free(plain.weight), free(zero.weight);
}

/* The optimizer re-marks values with sharding constraints (the held
 * gradient, ZeRO's view of a parameter); the devices' programs read the
 * resharded value instead of copying it whole first. */
static void test_no_identity_copies(void **state)
{
    (void)state;
    spmd_gpt_config cfg = {.vocab = 16, .seq = 8, .layers = 1, .heads = 2, .dim = 16};
    spmd_mesh *mesh = spmd_mesh_parse("2x2", "replica,fsdp");
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_gpt_tensors t;
    assert_int_equal(spmd_gpt_build(g, &cfg, 8, &t), SPMD_OK);
    spmd_tensor *in[2] = {t.input, t.targets};
    assert_int_equal(spmd_fsdp_wrap(g, mesh, "fsdp", in, 2, NULL), SPMD_OK);
    spmd_optimizer opt = {.kind = SPMD_OPTIMIZER_ADAMW, .zero = SPMD_ZERO_ON};
    spmd_trainer *tr = spmd_trainer_create(g, t.loss, &(spmd_trainer_options){.optimizer = opt});
    assert_non_null(tr);
    const spmd_graph *local = executor_partition(spmd_trainer_program(tr))->local;
    int identities = 0, global = 0;
    for (int i = 0; i < local->n_nodes; i++)
        identities += local->nodes[i]->op == IR_SHARDING_CONSTRAINT ||
                      (local->nodes[i]->op == IR_SCALE && local->nodes[i]->attr.scale.c == 1.0f);
    for (int i = 0; i < g->n_nodes; i++) global += g->nodes[i]->op == IR_SHARDING_CONSTRAINT;
    assert_true(global > 0);
    assert_int_equal(identities, 0);
    spmd_trainer_free(tr);
    spmd_graph_free(g);
    spmd_mesh_free(mesh);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_data_parallel_same_bits),
        cmocka_unit_test(test_fsdp_replicas),
        cmocka_unit_test(test_no_identity_copies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
