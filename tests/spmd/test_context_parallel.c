/*
 * Context parallelism for the GPT (spmd_gpt_shard_context_parallel): the
 * sequence split over a mesh axis, attention gathering the keys and
 * values (docs/DESIGN.md, "Sequence-split attention").  Attention alone
 * on a split sequence is checked against one device by test_spmd_equiv's
 * fixed cases.
 *
 * - Equivalence: a small GPT trained 4 AdamW steps with its sequence over
 *   'cp' on meshes 2 and 4 ('cp'), 2x2 ('data', 'cp'), 2x2 ('cp',
 *   'tensor', with tensor parallelism), 2x2x2 (with FSDP) and 4 with FSDP
 *   over 'cp' too gives the one-device losses and weights within 1e-5.
 * - Structure (per block: the counts with two blocks minus those with
 *   one): over 'cp' the forward pass all-gathers k and v and nothing
 *   else; the backward pass gathers them again (the forward's copies are
 *   not kept) and reduce-scatters attention's gradients twice (for
 *   c_attn's weight gradient, and c_attn's data gradient); no activation
 *   is all-reduced, and no gather counts as a fallback.
 * - Marks and errors: the inputs are marked "batch, cp"; a context axis
 *   that does not divide the sequence, or that is also the tensor axis,
 *   or context and sequence parallelism together, are refused with the
 *   numbers and axes named.
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

#include "ir/ir.h"
#include "runtime/executor.h"
#include "shard/partition.h"
#include "spmd/data.h"
#include "spmd/mesh.h"
#include "spmd/models.h"
#include "spmd/train.h"

#include "support_gpt.h"

enum { STEPS = 4, BATCH = 4 };

/* seq 12: over 4 devices, blocks of 3 rows. */
static const spmd_gpt_config GPT = {.vocab = 16, .seq = 12, .layers = 2, .heads = 4, .dim = 16};

typedef struct cp_case {
    const char *shape, *axes, *tensor, *fsdp;
} cp_case;

typedef struct cp_run {
    float loss[STEPS];
    float *weight; /* h.0.attn.c_attn.weight after the steps */
    size_t bytes;
} cp_run;

/* Marks g for case c (NULL: one device, nothing marked). */
static void mark(spmd_graph *g, const spmd_gpt_config *cfg, spmd_gpt_tensors *t,
                 const spmd_mesh *mesh, const cp_case *c)
{
    if (!c) return;
    spmd_gpt_parallel how = {c->tensor, c->fsdp, NULL, false, "cp"};
    assert_int_equal(spmd_gpt_shard_context_parallel(g, cfg, mesh, &how), SPMD_OK);
    if (c->tensor) assert_int_equal(spmd_gpt_shard_tensor_parallel(g, cfg, mesh, &how), SPMD_OK);
    spmd_tensor *in[2] = {t->input, t->targets};
    assert_int_equal(c->fsdp ? spmd_fsdp_wrap(g, mesh, c->fsdp, in, 2, NULL)
                             : spmd_shard_batch(g, mesh, in, 2, NULL),
                     SPMD_OK);
}

static void train(const cp_case *c, cp_run *r)
{
    spmd_mesh *mesh = c ? spmd_mesh_parse(c->shape, c->axes) : NULL;
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_gpt_tensors t;
    assert_int_equal(spmd_gpt_build(g, &GPT, BATCH, &t), SPMD_OK);
    mark(g, &GPT, &t, mesh, c);
    spmd_optimizer opt = {.kind = SPMD_OPTIMIZER_ADAMW, .weight_decay = 0.1f, .clip_norm = 1.0f};
    spmd_trainer *tr = spmd_trainer_create(
        g, t.loss, &(spmd_trainer_options){.optimizer = opt, .compile = {.seed = 7, .threads = 8}});
    assert_non_null(tr);
    spmd_program *p = spmd_trainer_program(tr);
    for (int s = 0; s < STEPS; s++) support_gpt_step(tr, &t, &GPT, BATCH, s, &r->loss[s]);
    r->weight = support_read_tensor(g, p, "h.0.attn.c_attn.weight", &r->bytes);
    spmd_trainer_free(tr);
    spmd_graph_free(g);
    spmd_mesh_free(mesh);
}

static const cp_case CASES[] = {
    {"2", "cp", NULL, NULL},
    {"4", "cp", NULL, NULL},
    {"2x2", "data,cp", NULL, NULL},
    {"2x2", "cp,tensor", "tensor", NULL},
    {"2x2x2", "fsdp,cp,tensor", "tensor", "fsdp"},
    {"4", "cp", NULL, "cp"}, /* FSDP over the context axis: the long-sequence plan */
};

static void test_gpt_equals_one_device(void **state)
{
    (void)state;
    cp_run one = {0};
    train(NULL, &one);
    for (size_t k = 0; k < sizeof CASES / sizeof CASES[0]; k++) {
        cp_run r = {0};
        train(&CASES[k], &r);
        for (int s = 0; s < STEPS; s++)
            if (fabsf(r.loss[s] - one.loss[s]) > 1e-5f)
                fail_msg("mesh %s (%s): step %d loss %.7f, one device %.7f", CASES[k].shape,
                         CASES[k].axes, s, r.loss[s], one.loss[s]);
        for (size_t i = 0; i < r.bytes / sizeof(float); i++)
            if (fabsf(r.weight[i] - one.weight[i]) > 1e-5f)
                fail_msg("mesh %s (%s): c_attn weight [%zu] %.7f, one device %.7f", CASES[k].shape,
                         CASES[k].axes, i, r.weight[i], one.weight[i]);
        free(r.weight);
    }
    free(one.weight);
}

/* Collectives over 'cp' of activations by phase and kind (parameters and
 * their gradients move for ZeRO's update); gathers of anything but k and
 * v (the [B, T, C] views of c_attn's output that attention reads). */
typedef struct counts {
    int n[3][IR_OP_COUNT];
    int other_gathers;
    int fallbacks;
} counts;

static counts count_cp_collectives(int layers)
{
    spmd_gpt_config cfg = GPT;
    cfg.layers = layers;
    spmd_mesh *mesh = spmd_mesh_parse("2x2", "data,cp");
    int cp = spmd_mesh_axis_index(mesh, "cp");
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_gpt_tensors t;
    assert_int_equal(spmd_gpt_build(g, &cfg, BATCH, &t), SPMD_OK);
    cp_case c = {"2x2", "data,cp", NULL, NULL};
    mark(g, &cfg, &t, mesh, &c);
    spmd_trainer *tr = spmd_trainer_create(
        g, t.loss, &(spmd_trainer_options){.optimizer = {.kind = SPMD_OPTIMIZER_SGD},
                                           .compile = {.threads = 4}});
    assert_non_null(tr);
    const partition *pt = executor_partition(spmd_trainer_program(tr));
    counts n = {0};
    for (int i = 0; i < pt->n_colls; i++) {
        const part_collective *k = &pt->colls[i];
        const spmd_tensor *moved = pt->g->nodes[k->tensor];
        bool over_cp = false;
        for (int a = 0; a < k->axes.n; a++) over_cp |= k->axes.axis[a] == cp;
        if (!over_cp || moved->op == IR_PARAM || k->phase == PART_UPDATE) continue;
        n.n[k->phase][k->kind]++;
        const spmd_tensor *user = k->consumer >= 0 ? pt->g->nodes[k->consumer] : NULL;
        if (k->kind == IR_ALL_GATHER &&
            !(user && (user->op == IR_ATTENTION || user->op == IR_ATTENTION_BACKWARD) &&
              (moved == user->in[1] || moved == user->in[2])))
            n.other_gathers++;
    }
    n.fallbacks = pt->n_fallbacks;
    spmd_trainer_free(tr);
    spmd_graph_free(g);
    spmd_mesh_free(mesh);
    return n;
}

static void test_block_collectives(void **state)
{
    (void)state;
    counts one = count_cp_collectives(1), two = count_cp_collectives(2);
    int block[2][IR_OP_COUNT];
    for (int ph = 0; ph < 2; ph++)
        for (int k = 0; k < IR_OP_COUNT; k++) block[ph][k] = two.n[ph][k] - one.n[ph][k];
    assert_int_equal(two.other_gathers, 0);
    assert_int_equal(two.fallbacks, 0); /* gathering k and v is the plan */
    assert_int_equal(block[PART_FORWARD][IR_ALL_GATHER], 2); /* k and v */
    assert_int_equal(block[PART_BACKWARD][IR_ALL_GATHER], 2); /* k and v again */
    /* Attention's pending gradients reach c_attn: its weight gradient
     * reads them reduce-scattered ([B, T, 3C]), and its data gradient,
     * linear in them, is reduce-scattered at [B, T, C]. */
    assert_int_equal(block[PART_BACKWARD][IR_REDUCE_SCATTER], 2);
    for (int ph = 0; ph < 2; ph++) {
        assert_int_equal(block[ph][IR_ALL_REDUCE], 0);
        assert_int_equal(block[ph][IR_ALL_TO_ALL], 0);
    }
    assert_int_equal(block[PART_FORWARD][IR_REDUCE_SCATTER], 0);
}

/* The batch goes over every axis but the context (and tensor) axis. */
static void test_marks(void **state)
{
    (void)state;
    spmd_mesh *mesh = spmd_mesh_parse("2x2x2", "data,cp,tensor");
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_gpt_tensors t;
    assert_int_equal(spmd_gpt_build(g, &GPT, BATCH, &t), SPMD_OK);
    spmd_gpt_parallel how = {"tensor", NULL, NULL, false, "cp"};
    assert_int_equal(spmd_gpt_shard_context_parallel(g, &GPT, mesh, &how), SPMD_OK);
    assert_int_equal(spmd_gpt_shard_tensor_parallel(g, &GPT, mesh, &how), SPMD_OK);
    char spec[64];
    assert_string_equal(spmd_get_sharding(t.input, spec, sizeof spec), "data, cp");
    assert_string_equal(spmd_get_sharding(t.targets, spec, sizeof spec), "data, cp");
    assert_string_equal(spmd_get_sharding(spmd_graph_find(g, "h.0.attn.c_attn.matmul"), spec,
                                          sizeof spec),
                        "data, cp, 3*tensor");
    assert_string_equal(spmd_get_sharding(t.logits, spec, sizeof spec), "data, cp, tensor");
    spmd_graph_free(g);
    spmd_mesh_free(mesh);
}

static void test_errors(void **state)
{
    (void)state;
    spmd_mesh *mesh = spmd_mesh_parse("5x2", "cp,tensor");
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_gpt_tensors t;
    assert_int_equal(spmd_gpt_build(g, &GPT, BATCH, &t), SPMD_OK);
    spmd_gpt_parallel how = {NULL, NULL, NULL, false, "cp"};
    assert_int_equal(spmd_gpt_shard_context_parallel(g, &GPT, mesh, &how), SPMD_ERR_SHAPE);
    assert_non_null(strstr(spmd_last_error(),
                           "a sequence of 12 tokens does not split over axis 'cp' of 5 devices"));
    how.context = "tensor";
    how.tensor = "tensor";
    assert_int_equal(spmd_gpt_shard_context_parallel(g, &GPT, mesh, &how), SPMD_ERR_INVALID);
    assert_non_null(strstr(spmd_last_error(), "'tensor' cannot be both the context axis and the "
                                              "tensor axis"));
    assert_int_equal(spmd_gpt_shard_tensor_parallel(g, &GPT, mesh, &how), SPMD_ERR_INVALID);
    how = (spmd_gpt_parallel){"cp", NULL, NULL, true, "tensor"};
    assert_int_equal(spmd_gpt_shard_context_parallel(g, &GPT, mesh, &how), SPMD_ERR_INVALID);
    assert_non_null(strstr(spmd_last_error(), "sequence parallelism"));
    how = (spmd_gpt_parallel){NULL, NULL, NULL, false, "model"};
    assert_int_equal(spmd_gpt_shard_context_parallel(g, &GPT, mesh, &how), SPMD_ERR_INVALID);
    how.context = NULL;
    assert_int_equal(spmd_gpt_shard_context_parallel(g, &GPT, mesh, &how), SPMD_ERR_INVALID);
    /* Nothing was marked by the refused calls. */
    char spec[64];
    assert_string_equal(spmd_get_sharding(t.input, spec, sizeof spec), "");
    spmd_graph_free(g);
    spmd_mesh_free(mesh);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt_equals_one_device),
        cmocka_unit_test(test_block_collectives),
        cmocka_unit_test(test_marks),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
