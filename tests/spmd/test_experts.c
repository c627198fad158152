/*
 * The GPT with experts (GShard's mixture of experts, gpt_moe.c) and its
 * expert parallelism (spmd_gpt_shard_experts).
 *
 * - Equivalence: a small MoE GPT trained 4 AdamW steps on meshes 4
 *   ('expert'), 2x4 ('data', 'expert'), 2x2x2 with FSDP and 2x2x2 with
 *   tensor parallelism gives the one-device losses and expert weights
 *   within 1e-5 (the 3-D mesh tests' tolerance), the same dropped counts
 *   exactly, and the same bits when run again; spmd_gpt_param_count
 *   counts the experts' parameters as the graph holds them.
 * - Structure: each MoE block costs two all-to-alls over 'expert' forward
 *   and two backward, and no activation is all-gathered over any axis;
 *   each device holds E/n experts' weights: in the partitioned graph, and
 *   in the bytes the executor keeps for them and their optimizer state
 *   (a quarter of one device's on mesh 4, at most that on the others).
 * - Refusals: an expert axis that does not divide E, top-k above E, a
 *   capacity below one token, each naming its numbers.
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

enum { STEPS = 4, BATCH = 8, SEQ = 8 };

/* Capacity floor(2 x 8 x 1.0 / 4) = 4 of 16 assignments per expert and
 * sequence: tokens are dropped from the first step. */
static const spmd_gpt_config GPT = {.vocab = 16, .seq = SEQ, .layers = 2, .heads = 2, .dim = 16,
                                    .experts = 4, .top_k = 2, .capacity_factor = 1.0f};

typedef struct moe_case {
    const char *shape, *axes, *fsdp, *tensor;
} moe_case;

typedef struct moe_run {
    float loss[STEPS], dropped[STEPS];
    float *weight; /* h.1.moe.c_fc.weight after the steps */
    size_t bytes;
    size_t expert_bytes; /* the experts' weights and state a device holds */
} moe_run;

/* Marks g for case c (NULL: one device, nothing marked): the experts
 * over 'expert', tensor parallelism if asked, then the batch (and FSDP)
 * over the rest, as spmd train does. */
static void mark(spmd_graph *g, spmd_gpt_tensors *t, const spmd_mesh *mesh, const moe_case *c)
{
    if (!c) return;
    assert_int_equal(spmd_gpt_shard_experts(g, &GPT, mesh, "expert", c->tensor, NULL), SPMD_OK);
    if (c->tensor) {
        spmd_gpt_parallel how = {c->tensor, c->fsdp, NULL, false, NULL};
        assert_int_equal(spmd_gpt_shard_tensor_parallel(g, &GPT, mesh, &how), SPMD_OK);
    }
    spmd_tensor *in[2] = {t->input, t->targets};
    assert_int_equal(c->fsdp ? spmd_fsdp_wrap(g, mesh, c->fsdp, in, 2, NULL)
                             : spmd_shard_batch(g, mesh, in, 2, NULL),
                     SPMD_OK);
}

/* The bytes device `dev` holds for the experts' weights and biases
 * (h.*.moe.c_fc, c_proj) and their optimizer state, as the executor
 * keeps them: the measured side of each device holding E/n experts. */
static size_t expert_bytes(const spmd_graph *g, const spmd_program *p, int dev)
{
    size_t bytes = 0;
    for (int i = 0; i < spmd_graph_tensor_count(g); i++) {
        const spmd_tensor *t = spmd_graph_tensor(g, i);
        const char *name = spmd_tensor_name(t);
        if (!name || !strstr(name, ".moe.c_") || !executor_keeps(p, t)) continue;
        int pieces;
        assert_int_equal(executor_block_pieces(p, t, &pieces), SPMD_OK);
        for (int k = 0; k < pieces; k++) {
            executor_block b;
            assert_int_equal(executor_block_of(p, t, dev, k, &b), SPMD_OK);
            assert_non_null(b.data);
            size_t n = sizeof(float);
            for (int d = 0; d < b.rank; d++) n *= (size_t)b.ldims[d];
            bytes += n;
        }
    }
    return bytes;
}

static void train(const moe_case *c, moe_run *r)
{
    spmd_mesh *mesh = c ? spmd_mesh_parse(c->shape, c->axes) : NULL;
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_gpt_tensors t;
    assert_int_equal(spmd_gpt_build(g, &GPT, BATCH, &t), SPMD_OK);
    assert_non_null(t.dropped);
    assert_non_null(t.aux_loss);
    assert_int_equal(spmd_gpt_param_count(&GPT), spmd_graph_param_count(g));
    mark(g, &t, mesh, c);
    spmd_optimizer opt = {.kind = SPMD_OPTIMIZER_ADAMW, .weight_decay = 0.1f, .clip_norm = 1.0f};
    spmd_trainer *tr = spmd_trainer_create(
        g, t.loss, &(spmd_trainer_options){.optimizer = opt, .compile = {.seed = 7, .threads = 8}});
    assert_non_null(tr);
    spmd_program *p = spmd_trainer_program(tr);
    for (int s = 0; s < STEPS; s++) {
        support_gpt_step(tr, &t, &GPT, BATCH, s, &r->loss[s]);
        assert_int_equal(spmd_program_read(p, t.dropped, &r->dropped[s], sizeof r->dropped[s]),
                         SPMD_OK);
    }
    r->expert_bytes = expert_bytes(g, p, 0);
    for (int d = 1; d < spmd_program_devices(p); d++)
        assert_int_equal(expert_bytes(g, p, d), r->expert_bytes);
    r->weight = support_read_tensor(g, p, "h.1.moe.c_fc.weight", &r->bytes);
    spmd_trainer_free(tr);
    spmd_graph_free(g);
    spmd_mesh_free(mesh);
}

static const moe_case CASES[] = {
    {"4", "expert", NULL, NULL},
    {"2x4", "data,expert", NULL, NULL},
    {"2x2x2", "data,fsdp,expert", "fsdp", NULL},
    {"2x2x2", "data,tensor,expert", NULL, "tensor"},
};

static void test_gpt_equals_one_device(void **state)
{
    (void)state;
    moe_run one = {0};
    train(NULL, &one);
    float routed = 0;
    for (int s = 0; s < STEPS; s++) routed += one.dropped[s];
    assert_true(routed > 0); /* the capacity binds: the count is tested */
    for (size_t k = 0; k < sizeof CASES / sizeof CASES[0]; k++) {
        moe_run r = {0};
        train(&CASES[k], &r);
        for (int s = 0; s < STEPS; s++) {
            if (fabsf(r.loss[s] - one.loss[s]) > 1e-5f)
                fail_msg("mesh %s (%s): step %d loss %.7f, one device %.7f", CASES[k].shape,
                         CASES[k].axes, s, r.loss[s], one.loss[s]);
            if (r.dropped[s] != one.dropped[s])
                fail_msg("mesh %s (%s): step %d dropped %g, one device %g", CASES[k].shape,
                         CASES[k].axes, s, r.dropped[s], one.dropped[s]);
        }
        /* A device holds a quarter of the experts' weights and state on
         * mesh 4; less where the other axes split the state (ZeRO) or
         * the weights too. */
        bool expert_only = !strcmp(CASES[k].shape, "4");
        if (expert_only ? r.expert_bytes * 4 != one.expert_bytes
                        : r.expert_bytes * 4 > one.expert_bytes)
            fail_msg("mesh %s (%s): a device holds %zu bytes of experts, one device %zu",
                     CASES[k].shape, CASES[k].axes, r.expert_bytes, one.expert_bytes);
        for (size_t i = 0; i < r.bytes / sizeof(float); i++)
            if (fabsf(r.weight[i] - one.weight[i]) > 1e-5f)
                fail_msg("mesh %s (%s): expert weight [%zu] %.7f, one device %.7f", CASES[k].shape,
                         CASES[k].axes, i, r.weight[i], one.weight[i]);
        free(r.weight);
    }
    free(one.weight);
}

static void test_same_bits_again(void **state)
{
    (void)state;
    moe_run a = {0}, b = {0};
    train(&CASES[1], &a);
    train(&CASES[1], &b);
    assert_memory_equal(a.loss, b.loss, sizeof a.loss);
    assert_memory_equal(a.dropped, b.dropped, sizeof a.dropped);
    assert_memory_equal(a.weight, b.weight, a.bytes);
    free(a.weight), free(b.weight);
}

/* Collectives of activations by phase and kind over 'expert', and
 * all-gathers of activations over any axis, for a GPT of `layers`. */
typedef struct counts {
    int over_expert[2][IR_OP_COUNT];
    int gathers;
    int64_t experts_held; /* rows of h.1.moe.c_fc.weight on a device */
} counts;

static counts count_collectives(int layers)
{
    spmd_gpt_config cfg = GPT;
    cfg.layers = layers;
    spmd_mesh *mesh = spmd_mesh_parse("2x4", "data,expert");
    int expert = spmd_mesh_axis_index(mesh, "expert");
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_gpt_tensors t;
    assert_int_equal(spmd_gpt_build(g, &cfg, BATCH, &t), SPMD_OK);
    assert_int_equal(spmd_gpt_shard_experts(g, &cfg, mesh, "expert", NULL, NULL), SPMD_OK);
    spmd_tensor *in[2] = {t.input, t.targets};
    assert_int_equal(spmd_shard_batch(g, mesh, in, 2, NULL), SPMD_OK);
    spmd_trainer *tr = spmd_trainer_create(
        g, t.loss, &(spmd_trainer_options){.optimizer = {.kind = SPMD_OPTIMIZER_SGD},
                                           .compile = {.threads = 4}});
    assert_non_null(tr);
    const partition *pt = executor_partition(spmd_trainer_program(tr));
    counts n = {0};
    for (int i = 0; i < pt->n_colls; i++) {
        const part_collective *k = &pt->colls[i];
        const spmd_tensor *moved = pt->g->nodes[k->tensor];
        if (moved->op == IR_PARAM || k->phase == PART_UPDATE) continue;
        if (k->kind == IR_ALL_GATHER) n.gathers++;
        bool over = false;
        for (int a = 0; a < k->axes.n; a++) over |= k->axes.axis[a] == expert;
        if (over) n.over_expert[k->phase][k->kind]++;
    }
    spmd_tensor *w = spmd_graph_find(g, "h.1.moe.c_fc.weight");
    char spec[64];
    assert_string_equal(spmd_get_sharding(w, spec, sizeof spec), "expert, None, None");
    for (int i = 0; i < pt->local->n_nodes; i++) {
        const spmd_tensor *l = pt->local->nodes[i];
        if (l->op == IR_PARAM && l->name && !strcmp(l->name, "h.1.moe.c_fc.weight"))
            n.experts_held = l->dims[0];
    }
    spmd_trainer_free(tr);
    spmd_graph_free(g);
    spmd_mesh_free(mesh);
    return n;
}

static void test_all_to_all_and_no_token_gathers(void **state)
{
    (void)state;
    /* 2 layers: one MoE block (h.1); 4 layers: two. */
    counts one = count_collectives(2), two = count_collectives(4);
    assert_int_equal(one.over_expert[PART_FORWARD][IR_ALL_TO_ALL], 2);
    assert_int_equal(one.over_expert[PART_BACKWARD][IR_ALL_TO_ALL], 2);
    assert_int_equal(two.over_expert[PART_FORWARD][IR_ALL_TO_ALL], 4);
    assert_int_equal(two.over_expert[PART_BACKWARD][IR_ALL_TO_ALL], 4);
    assert_int_equal(one.gathers, 0);
    assert_int_equal(two.gathers, 0);
    assert_int_equal(one.experts_held, GPT.experts / 4);
}

static void test_refusals_name_the_numbers(void **state)
{
    (void)state;
    spmd_gpt_config cfg = GPT;
    cfg.experts = 6;
    spmd_mesh *mesh = spmd_mesh_parse("4", "expert");
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_gpt_tensors t;
    assert_int_equal(spmd_gpt_build(g, &cfg, BATCH, &t), SPMD_OK);
    assert_int_equal(spmd_gpt_shard_experts(g, &cfg, mesh, "expert", NULL, NULL), SPMD_ERR_SHAPE);
    assert_non_null(strstr(spmd_last_error(), "6 experts do not split over the expert axis "
                                              "'expert' of 4 devices"));
    spmd_graph_free(g);
    spmd_mesh_free(mesh);

    cfg = GPT;
    cfg.top_k = 5;
    assert_int_equal(spmd_gpt_validate(&cfg), SPMD_ERR_INVALID);
    assert_non_null(strstr(spmd_last_error(), "top-k (5) must be from 1 to the number of experts (4)"));

    cfg = GPT;
    cfg.experts = 16, cfg.top_k = 9;
    assert_int_equal(spmd_gpt_validate(&cfg), SPMD_ERR_INVALID);
    assert_non_null(strstr(spmd_last_error(), "top-k (9) is more than the 8 choices"));

    cfg = GPT;
    cfg.experts = 64, cfg.top_k = 1, cfg.capacity_factor = 1.0f; /* 8 tokens, 64 experts */
    assert_int_equal(spmd_gpt_validate(&cfg), SPMD_ERR_INVALID);
    assert_non_null(strstr(spmd_last_error(), "more experts than fit the capacity: 64 experts"));
    assert_non_null(strstr(spmd_last_error(), "at least 8"));

    cfg = GPT;
    cfg.layers = 1;
    assert_int_equal(spmd_gpt_validate(&cfg), SPMD_ERR_INVALID);
    assert_non_null(strstr(spmd_last_error(), "every other block"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt_equals_one_device),
        cmocka_unit_test(test_same_bits_again),
        cmocka_unit_test(test_all_to_all_and_no_token_gathers),
        cmocka_unit_test(test_refusals_name_the_numbers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
