/*
 * Tensor and sequence parallelism for the GPT (spmd_gpt_shard_tensor_parallel)
 * and the grouped splits it rests on.
 *
 * - Grouped splits: a [6, 4] parameter marked "3*x, None" is initialised,
 *   written and read back as the one-device tensor; reshapes carry a
 *   grouped split to the [3, 2, 4] view's split and back.
 * - Equivalence: a small GPT trained 4 AdamW steps with --tp on meshes 2
 *   ('tensor'), 2x2 ('data', 'tensor') and 2x2x2 (with FSDP), with and
 *   without sequence parallelism, gives the one-device losses and weights
 *   within 1e-5.
 * - Checkpoints: saved from tensor-parallel meshes (grouped blocks), loaded
 *   on one device and on another mesh, every parameter and moment equal.
 * - Structure (per block: the counts with two blocks minus those with
 *   one): two all-reduces over 'tensor' in the forward pass and two in the
 *   backward pass, no activation gathered over it; with sequence
 *   parallelism, reduce-scatters and all-gathers in their place and no
 *   all-reduce of an activation.  The vocabulary (50257, uneven) is split:
 *   no local value has a dim of 50257, the loss gathers only row stats.
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
#include "spmd/checkpoint.h"
#include "spmd/data.h"
#include "spmd/mesh.h"
#include "spmd/models.h"
#include "spmd/train.h"

#include "support_gpt.h"

enum { STEPS = 4, BATCH = 8 };

/* ---- Grouped splits -------------------------------------------------------------- */

static void test_grouped_param_round_trip(void **state)
{
    (void)state;
    spmd_mesh *mesh = spmd_mesh_parse("2", "x");
    float got[2][24];
    for (int run = 0; run < 2; run++) {
        spmd_graph *g = spmd_graph_create(NULL);
        spmd_tensor *w = spmd_param(g, "w", 2, (const int64_t[]){6, 4},
                                    (spmd_init){SPMD_INIT_NORMAL, 1.0f});
        spmd_tensor *y = spmd_scale(g, w, 2.0f);
        assert_int_equal(spmd_graph_mark_output(g, y), SPMD_OK);
        if (run) assert_int_equal(spmd_mark_sharding(g, w, mesh, "3*x, None"), SPMD_OK);
        spmd_program *p = spmd_compile(g, &(spmd_compile_options){.seed = 3});
        assert_non_null(p);
        assert_int_equal(spmd_program_read(p, w, got[run], sizeof got[run]), SPMD_OK);
        if (run) {
            char spec[64];
            assert_string_equal(spmd_get_sharding(w, spec, sizeof spec), "3*x, None");
            /* Written and read back through the groups. */
            float mine[24], back[24], twice[24];
            for (int i = 0; i < 24; i++) mine[i] = (float)i;
            assert_int_equal(spmd_program_write(p, w, mine, sizeof mine), SPMD_OK);
            assert_int_equal(spmd_program_run(p), SPMD_OK);
            assert_int_equal(spmd_program_read(p, w, back, sizeof back), SPMD_OK);
            assert_memory_equal(mine, back, sizeof mine);
            assert_int_equal(spmd_program_read(p, y, twice, sizeof twice), SPMD_OK);
            for (int i = 0; i < 24; i++) assert_true(twice[i] == 2.0f * mine[i]);
        }
        spmd_program_free(p);
        spmd_graph_free(g);
    }
    /* Initialised by global index: the same values on any layout. */
    assert_memory_equal(got[0], got[1], sizeof got[0]);
    spmd_mesh_free(mesh);
}

static void test_grouped_spec_errors(void **state)
{
    (void)state;
    spmd_mesh *mesh = spmd_mesh_parse("4", "x");
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_tensor *w = spmd_param(g, "w", 2, (const int64_t[]){6, 8}, (spmd_init){SPMD_INIT_ZEROS, 0});
    /* 6 as 3 groups of 2 cannot be cut into 4 blocks; 8 as 2 of 4 can. */
    assert_int_equal(spmd_mark_sharding(g, w, mesh, "3*x, None"), SPMD_ERR_SHAPE);
    assert_non_null(strstr(spmd_last_error(), "3 groups of 4 blocks"));
    assert_int_equal(spmd_mark_sharding(g, w, mesh, "3, None"), SPMD_ERR_INVALID);
    assert_non_null(strstr(spmd_last_error(), "wants '*'"));
    assert_int_equal(spmd_mark_sharding(g, w, mesh, "3*None, None"), SPMD_ERR_INVALID);
    assert_non_null(strstr(spmd_last_error(), "cannot be grouped"));
    assert_int_equal(spmd_mark_sharding(g, w, mesh, "0*x, None"), SPMD_ERR_INVALID);
    assert_int_equal(spmd_mark_sharding(g, w, mesh, "None, 2*"), SPMD_ERR_INVALID);
    assert_non_null(strstr(spmd_last_error(), "'*' at column 8 wants an axis"));
    assert_int_equal(spmd_mark_sharding(g, w, mesh, "None, 2*x"), SPMD_OK);
    char spec[64];
    assert_string_equal(spmd_get_sharding(w, spec, sizeof spec), "None, 2*x");
    spmd_graph_free(g);
    spmd_mesh_free(mesh);
}

/* [3, 2, 4] with dim 1 split is [6, 4] as "3*x" (and the other way),
 * values included. */
static void test_grouped_reshape(void **state)
{
    (void)state;
    spmd_mesh *mesh = spmd_mesh_parse("2", "x");
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_tensor *a = spmd_input(g, "a", SPMD_F32, 3, (const int64_t[]){3, 2, 4});
    spmd_tensor *flat = spmd_reshape(g, spmd_exp(g, a), 2, (const int64_t[]){6, 4});
    spmd_tensor *back = spmd_reshape(g, spmd_neg(g, flat), 3, (const int64_t[]){3, 2, 4});
    assert_int_equal(spmd_mark_sharding(g, a, mesh, "None, x, None"), SPMD_OK);
    assert_int_equal(spmd_graph_mark_output(g, flat), SPMD_OK);
    assert_int_equal(spmd_graph_mark_output(g, back), SPMD_OK);
    spmd_program *p = spmd_compile(g, NULL);
    assert_non_null(p);
    char spec[64];
    assert_string_equal(spmd_get_sharding(flat, spec, sizeof spec), "3*x, None");
    assert_string_equal(spmd_get_sharding(back, spec, sizeof spec), "None, x, None");
    assert_int_equal(executor_partition(p)->n_colls, 0);
    float in[24], got[24], got_back[24];
    for (int i = 0; i < 24; i++) in[i] = (float)i / 24.0f;
    assert_int_equal(spmd_program_set_input(p, a, in, sizeof in), SPMD_OK);
    assert_int_equal(spmd_program_run(p), SPMD_OK);
    assert_int_equal(spmd_program_read(p, flat, got, sizeof got), SPMD_OK);
    assert_int_equal(spmd_program_read(p, back, got_back, sizeof got_back), SPMD_OK);
    for (int i = 0; i < 24; i++) {
        assert_true(got[i] == expf(in[i]));
        assert_true(got_back[i] == -expf(in[i]));
    }
    spmd_program_free(p);
    spmd_graph_free(g);
    spmd_mesh_free(mesh);
}

/* ---- The GPT ------------------------------------------------------------------------- */

typedef struct tp_case {
    const char *shape, *axes, *fsdp, *batch; /* batch: the data axes, "" for none */
    bool sequence;
} tp_case;

typedef struct tp_run {
    float loss[STEPS];
    float *weight; /* h.0.attn.c_attn.weight after the steps */
    size_t bytes;
} tp_run;

static const spmd_gpt_config GPT = {.vocab = 16, .seq = 8, .layers = 2, .heads = 4, .dim = 16};

/* Marks g for case c (NULL: one device, nothing marked). */
static void mark(spmd_graph *g, const spmd_gpt_config *cfg, spmd_gpt_tensors *t,
                 const spmd_mesh *mesh, const tp_case *c)
{
    if (!c) return;
    spmd_gpt_parallel how = {"tensor", c->fsdp, NULL, c->sequence, NULL};
    assert_int_equal(spmd_gpt_shard_tensor_parallel(g, cfg, mesh, &how), SPMD_OK);
    spmd_tensor *in[2] = {t->input, t->targets};
    assert_int_equal(c->fsdp ? spmd_fsdp_wrap(g, mesh, c->fsdp, in, 2, c->batch)
                             : spmd_shard_batch(g, mesh, in, 2, c->batch),
                     SPMD_OK);
}

static void train(const tp_case *c, tp_run *r)
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

static const tp_case CASES[] = {
    {"2", "tensor", NULL, "", false},
    {"2", "tensor", NULL, "", true},
    {"2x2", "data,tensor", NULL, "data", false},
    {"2x2", "data,tensor", NULL, "data", true},
    {"2x2x2", "data,fsdp,tensor", "fsdp", "data, fsdp", false},
    {"2x2x2", "data,fsdp,tensor", "fsdp", "data, fsdp", true},
    {"4", "tensor", NULL, "", false}, /* one head of q, k and v per device */
};

static void test_gpt_equals_one_device(void **state)
{
    (void)state;
    tp_run one = {0};
    train(NULL, &one);
    for (size_t k = 0; k < sizeof CASES / sizeof CASES[0]; k++) {
        tp_run r = {0};
        train(&CASES[k], &r);
        for (int s = 0; s < STEPS; s++) {
            if (fabsf(r.loss[s] - one.loss[s]) > 1e-5f)
                fail_msg("mesh %s%s: step %d loss %.7f, one device %.7f", CASES[k].shape,
                         CASES[k].sequence ? " with sp" : "", s, r.loss[s], one.loss[s]);
        }
        for (size_t i = 0; i < r.bytes / sizeof(float); i++)
            if (fabsf(r.weight[i] - one.weight[i]) > 1e-5f)
                fail_msg("mesh %s%s: c_attn weight [%zu] %.7f, one device %.7f", CASES[k].shape,
                         CASES[k].sequence ? " with sp" : "", i, r.weight[i], one.weight[i]);
        free(r.weight);
    }
    free(one.weight);
}

/* Collectives over 'tensor' by phase and kind; activations only
 * (parameters and their gradients move for FSDP and the update). */
typedef struct counts {
    int n[3][IR_OP_COUNT];
    int gathers; /* all-gathers of activations over 'tensor' but the loss's row stats */
    int whole_v; /* local values with a dim of the whole vocabulary */
} counts;

static counts count_tensor_collectives(int layers, bool sequence)
{
    spmd_gpt_config cfg = GPT;
    cfg.layers = layers;
    cfg.vocab = 50257; /* uneven over 'tensor': padded blocks */
    spmd_mesh *mesh = spmd_mesh_parse("2x2", "data,tensor");
    int tensor = spmd_mesh_axis_index(mesh, "tensor");
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_gpt_tensors t;
    assert_int_equal(spmd_gpt_build(g, &cfg, BATCH, &t), SPMD_OK);
    tp_case c = {"2x2", "data,tensor", NULL, "data", sequence};
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
        bool over_tensor = false;
        for (int a = 0; a < k->axes.n; a++) over_tensor |= k->axes.axis[a] == tensor;
        if (!over_tensor || moved->op == IR_PARAM || k->phase == PART_UPDATE) continue;
        n.n[k->phase][k->kind]++;
        if (k->kind == IR_ALL_GATHER && moved->op != IR_CROSS_ENTROPY &&
            moved->op != IR_CROSS_ENTROPY_BACKWARD)
            n.gathers++;
    }
    for (int i = 0; i < pt->local->n_nodes; i++)
        for (int d = 0; d < pt->local->nodes[i]->rank; d++)
            n.whole_v += pt->local->nodes[i]->dims[d] == cfg.vocab;
    spmd_trainer_free(tr);
    spmd_graph_free(g);
    spmd_mesh_free(mesh);
    return n;
}

static void test_block_collectives(void **state)
{
    (void)state;
    for (int sp = 0; sp < 2; sp++) {
        counts one = count_tensor_collectives(1, sp), two = count_tensor_collectives(2, sp);
        int block[2][IR_OP_COUNT];
        for (int ph = 0; ph < 2; ph++)
            for (int k = 0; k < IR_OP_COUNT; k++) block[ph][k] = two.n[ph][k] - one.n[ph][k];
        /* Vocabulary parallel: the loss gathers its row stats, never the
         * logits; no device holds the whole vocabulary. */
        assert_int_equal(two.whole_v, 0);
        if (!sp) assert_int_equal(two.gathers, 0);
        if (!sp) {
            assert_int_equal(block[PART_FORWARD][IR_ALL_REDUCE], 2);
            assert_int_equal(block[PART_BACKWARD][IR_ALL_REDUCE], 2);
            for (int ph = 0; ph < 2; ph++) {
                assert_int_equal(block[ph][IR_ALL_GATHER], 0);
                assert_int_equal(block[ph][IR_REDUCE_SCATTER], 0);
                assert_int_equal(block[ph][IR_ALL_TO_ALL], 0);
            }
        } else {
            for (int ph = 0; ph < 2; ph++) {
                assert_int_equal(block[ph][IR_ALL_REDUCE], 0);
                assert_int_equal(block[ph][IR_REDUCE_SCATTER], 2);
                assert_int_equal(block[ph][IR_ALL_GATHER], 2);
            }
            /* c_proj's weight gradient reads the gathered adjoint, not
             * the attention output moved to the sequence split. */
            for (int ph = 0; ph < 2; ph++) assert_int_equal(block[ph][IR_ALL_TO_ALL], 0);
        }
    }
}

/* A compiled GPT (with its AdamW state) for case c, NULL: one device. */
typedef struct compiled_gpt {
    spmd_graph *g;
    spmd_mesh *mesh;
    spmd_trainer *tr;
} compiled_gpt;

static compiled_gpt compile_gpt(const tp_case *c, uint64_t seed)
{
    compiled_gpt r = {spmd_graph_create(NULL), c ? spmd_mesh_parse(c->shape, c->axes) : NULL, NULL};
    spmd_gpt_tensors t;
    assert_int_equal(spmd_gpt_build(r.g, &GPT, BATCH, &t), SPMD_OK);
    mark(r.g, &GPT, &t, r.mesh, c);
    r.tr = spmd_trainer_create(r.g, t.loss,
                               &(spmd_trainer_options){.optimizer = {.kind = SPMD_OPTIMIZER_ADAMW},
                                                       .compile = {.seed = seed, .threads = 8}});
    assert_non_null(r.tr);
    return r;
}

static void free_gpt(compiled_gpt *r)
{
    spmd_trainer_free(r->tr);
    spmd_graph_free(r->g);
    spmd_mesh_free(r->mesh);
}

/* Every parameter and state tensor of a equals b's. */
static void expect_same_values(const compiled_gpt *a, const compiled_gpt *b)
{
    const spmd_program *pa = spmd_trainer_program(a->tr), *pb = spmd_trainer_program(b->tr);
    int checked = 0;
    for (int i = 0; i < spmd_graph_tensor_count(a->g); i++) {
        spmd_tensor *t = spmd_graph_tensor(a->g, i);
        const char *name = spmd_tensor_name(t);
        if (!name || (!spmd_tensor_is_param(t) && !strstr(name, ".exp_avg"))) continue;
        spmd_tensor *u = spmd_graph_find(b->g, name);
        size_t bytes = (size_t)spmd_tensor_numel(t) * sizeof(float);
        float *x = malloc(bytes), *y = malloc(bytes);
        assert_int_equal(spmd_program_read(pa, t, x, bytes), SPMD_OK);
        assert_int_equal(spmd_program_read(pb, u, y, bytes), SPMD_OK);
        if (memcmp(x, y, bytes)) fail_msg("'%s' differs after the load", name);
        free(x), free(y);
        checked++;
    }
    assert_true(checked > 30);
}

/* Saved from tensor-parallel meshes (grouped blocks: a box per group),
 * loaded on one device and on another tensor-parallel mesh. */
static void test_checkpoint_round_trip(void **state)
{
    (void)state;
    char dir[] = "/tmp/spmd-tp-ckpt-XXXXXX";
    assert_non_null(mkdtemp(dir));
    const tp_case *from[] = {&CASES[4], &CASES[0]}, *to[] = {NULL, &CASES[2]};
    for (int k = 0; k < 2; k++) {
        compiled_gpt a = compile_gpt(from[k], 11 + (uint64_t)k), b = compile_gpt(to[k], 99);
        int32_t ids[BATCH * 8], tg[BATCH * 8];
        assert_int_equal(spmd_data_sequences(2, 0, BATCH, GPT.seq, GPT.vocab, ids, tg), SPMD_OK);
        spmd_program *pa = spmd_trainer_program(a.tr);
        assert_int_equal(spmd_program_set_input(pa, spmd_graph_find(a.g, "input"), ids, sizeof ids), SPMD_OK);
        assert_int_equal(spmd_program_set_input(pa, spmd_graph_find(a.g, "targets"), tg, sizeof tg), SPMD_OK);
        assert_int_equal(spmd_trainer_step(a.tr, 1e-2f, NULL, NULL), SPMD_OK); /* moments nonzero */
        assert_int_equal(spmd_checkpoint_save(pa, dir, k + 1, NULL, 0), SPMD_OK);
        assert_int_equal(spmd_checkpoint_load(spmd_trainer_program(b.tr), dir, NULL, NULL), SPMD_OK);
        expect_same_values(&a, &b);
        free_gpt(&a), free_gpt(&b);
    }
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* The batch goes over every axis but the tensor axis; a mark the caller
 * made first is kept. */
static void test_marks_batch_and_keeps_marks(void **state)
{
    (void)state;
    spmd_mesh *mesh = spmd_mesh_parse("2x2", "data,tensor");
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_gpt_tensors t;
    assert_int_equal(spmd_gpt_build(g, &GPT, BATCH, &t), SPMD_OK);
    spmd_tensor *fc = spmd_graph_find(g, "h.0.mlp.c_fc.weight");
    assert_int_equal(spmd_mark_sharding(g, fc, mesh, "None, tensor"), SPMD_OK);
    spmd_gpt_parallel how = {"tensor", NULL, NULL, false, NULL};
    assert_int_equal(spmd_gpt_shard_tensor_parallel(g, &GPT, mesh, &how), SPMD_OK);
    char spec[64];
    assert_string_equal(spmd_get_sharding(fc, spec, sizeof spec), "None, tensor");
    assert_string_equal(spmd_get_sharding(t.input, spec, sizeof spec), "data, None");
    assert_string_equal(spmd_get_sharding(t.targets, spec, sizeof spec), "data, None");
    assert_string_equal(spmd_get_sharding(spmd_graph_find(g, "h.1.attn.c_attn.weight"), spec, sizeof spec),
                        "3*tensor, None");
    spmd_graph_free(g);
    spmd_mesh_free(mesh);
}

static void test_bad_tensor_parallel(void **state)
{
    (void)state;
    spmd_mesh *mesh = spmd_mesh_parse("8", "tensor");
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_gpt_tensors t;
    assert_int_equal(spmd_gpt_build(g, &GPT, BATCH, &t), SPMD_OK);
    spmd_gpt_parallel how = {"tensor", NULL, NULL, false, NULL};
    assert_int_equal(spmd_gpt_shard_tensor_parallel(g, &GPT, mesh, &how), SPMD_ERR_SHAPE);
    assert_non_null(strstr(spmd_last_error(), "4 heads do not split over axis 'tensor' of 8"));
    how.tensor = "model";
    assert_int_equal(spmd_gpt_shard_tensor_parallel(g, &GPT, mesh, &how), SPMD_ERR_INVALID);
    how = (spmd_gpt_parallel){"tensor", "tensor", NULL, false, NULL};
    assert_int_equal(spmd_gpt_shard_tensor_parallel(g, &GPT, mesh, &how), SPMD_ERR_INVALID);
    spmd_graph_free(g);
    spmd_mesh_free(mesh);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grouped_param_round_trip),
        cmocka_unit_test(test_grouped_spec_errors),
        cmocka_unit_test(test_grouped_reshape),
        cmocka_unit_test(test_gpt_equals_one_device),
        cmocka_unit_test(test_block_collectives),
        cmocka_unit_test(test_checkpoint_round_trip),
        cmocka_unit_test(test_marks_batch_and_keeps_marks),
        cmocka_unit_test(test_bad_tensor_parallel),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
