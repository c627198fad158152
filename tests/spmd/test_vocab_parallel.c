/*
 * Vocabulary parallelism on the GPT (docs/DESIGN.md, "Dimension
 * signatures" and "Partition"): the tied table wte.weight [V, C] marked
 * split on V over the mesh's one axis, with GPT-2's V = 50257 (uneven over
 * 2, 4 and 8 blocks).  The lookup becomes a masked lookup and a pending
 * sum, the LM head keeps the logits split on V, cross-entropy runs on the
 * blocks (statistics all-gathered, never the logits), and the table's
 * gradient stays split too.  Checked:
 *   - three training steps (SGD and AdamW) give the one-device losses
 *     within 1e-5;
 *   - no tensor of the per-device program has a dim of the whole V: no
 *     [B, T, V] logits and no [V, C] table or gradient on any device, in
 *     forward, backward or update;
 *   - the loss's statistics are all-gathered over the axis (forward and
 *     backward), so explain lists them.
 * Also on 2x2 (data, tensor) with the batch over data: the same.  And the
 * FSDP plan (spmd_fsdp_wrap on 2x2 replica, fsdp, which marks wte on V over
 * fsdp): the batch takes fsdp first, so the table is gathered as before
 * and nothing is vocabulary-parallel.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ir/ir.h"
#include "runtime/executor.h"
#include "shard/partition.h"
#include "spmd/data.h"
#include "spmd/mesh.h"
#include "spmd/models.h"
#include "spmd/spmd.h"
#include "spmd/train.h"

enum { STEPS = 3, BATCH = 4, VOCAB = 50257 };
#define TOL 1e-5

static const spmd_gpt_config gpt = {.vocab = VOCAB, .seq = 8, .layers = 1, .heads = 2, .dim = 32};

typedef enum layout {
    ONE_DEVICE,
    TENSOR,      /* wte on V over the mesh's one axis "tensor" */
    DATA_TENSOR, /* 2x2 (data, tensor): the batch over data, wte on V over tensor */
    FSDP         /* 2x2 (replica, fsdp): spmd_fsdp_wrap */
} layout;

/* No tensor of the per-device program has a dim of the whole V, and the
 * loss's statistics are all-gathered once forward and once backward. */
static void check_vocab_parallel(const spmd_program *p, const char *what)
{
    const partition *part = executor_partition(p);
    assert_non_null(part);
    const spmd_graph *lg = part->local;
    for (int i = 0; i < lg->n_nodes; i++) {
        const spmd_tensor *x = lg->nodes[i];
        for (int d = 0; d < x->rank; d++)
            if (x->dims[d] == VOCAB) {
                char s[64];
                fail_msg("%s: local node %d (%s %s) holds the whole vocabulary", what, i,
                         ir_op_name(x->op), ir_shape_str(x, s, sizeof s));
            }
    }
    int gathers[2] = {0, 0};
    for (int c = 0; c < part->n_colls; c++) {
        const part_collective *pc = &part->colls[c];
        ir_op op = part->g->nodes[pc->tensor]->op;
        if (pc->kind != IR_ALL_GATHER) continue;
        if (op == IR_CROSS_ENTROPY) gathers[0]++;
        if (op == IR_CROSS_ENTROPY_BACKWARD) gathers[1]++;
    }
    assert_int_equal(gathers[0], 1);
    assert_int_equal(gathers[1], 1);
}

/* FSDP: the table is gathered whole where it is used (forward and
 * backward), and no op is vocabulary-parallel. */
static void check_fsdp_gathers_table(const spmd_program *p)
{
    const partition *part = executor_partition(p);
    assert_non_null(part);
    for (int i = 0; i < part->local->n_nodes; i++) {
        const spmd_tensor *x = part->local->nodes[i];
        assert_false(x->op == IR_EMBEDDING && x->attr.embed.global);
        assert_false(x->op == IR_VOCAB_CE_STATS);
    }
    int gathers = 0;
    for (int c = 0; c < part->n_colls; c++) {
        const part_collective *pc = &part->colls[c];
        const char *name = part->g->nodes[pc->tensor]->name;
        if (pc->kind == IR_ALL_GATHER && name && !strcmp(name, "wte.weight")) gathers++;
    }
    assert_true(gathers >= 2);
}

/* The losses of STEPS steps under `plan` on `devices` devices. */
static void train(layout how, int devices, spmd_optimizer_kind kind, float *loss)
{
    spmd_mesh *mesh = NULL;
    spmd_graph *g = spmd_graph_create(NULL);
    assert_non_null(g);
    spmd_gpt_tensors t;
    assert_int_equal(spmd_gpt_build(g, &gpt, BATCH, &t), SPMD_OK);
    spmd_tensor *wte = spmd_graph_find(g, "wte.weight");
    assert_non_null(wte);
    spmd_tensor *in[2] = {t.input, t.targets};
    char shape[16];
    snprintf(shape, sizeof shape, "%d", devices);
    switch (how) {
    case ONE_DEVICE: break;
    case TENSOR:
        mesh = spmd_mesh_parse(shape, "tensor");
        assert_non_null(mesh);
        assert_int_equal(spmd_mark_sharding(g, wte, mesh, "tensor, None"), SPMD_OK);
        break;
    case DATA_TENSOR:
        mesh = spmd_mesh_parse("2x2", "data,tensor");
        assert_non_null(mesh);
        assert_int_equal(spmd_mark_sharding(g, wte, mesh, "tensor, None"), SPMD_OK);
        assert_int_equal(spmd_mark_sharding(g, t.input, mesh, "data, None"), SPMD_OK);
        assert_int_equal(spmd_mark_sharding(g, t.targets, mesh, "data, None"), SPMD_OK);
        break;
    case FSDP:
        mesh = spmd_mesh_parse("2x2", "replica,fsdp");
        assert_non_null(mesh);
        assert_int_equal(spmd_fsdp_wrap(g, mesh, "fsdp", in, 2, NULL), SPMD_OK);
        break;
    }
    spmd_optimizer opt = {.kind = kind};
    spmd_trainer *tr = spmd_trainer_create(
        g, t.loss, &(spmd_trainer_options){.optimizer = opt, .compile = {.seed = 3, .threads = devices}});
    if (!tr) fail_msg("trainer on %d devices: %s", devices, spmd_last_error());
    spmd_program *p = spmd_trainer_program(tr);
    char what[64];
    snprintf(what, sizeof what, "%d devices, plan %d", devices, (int)how);
    if (how == TENSOR || how == DATA_TENSOR) check_vocab_parallel(p, what);
    if (how == FSDP) check_fsdp_gathers_table(p);

    int32_t ids[BATCH * 8], tg[BATCH * 8];
    for (int s = 0; s < STEPS; s++) {
        assert_int_equal(spmd_data_sequences(11, s * BATCH, BATCH, gpt.seq, gpt.vocab, ids, tg), SPMD_OK);
        assert_int_equal(spmd_program_set_input(p, t.input, ids, sizeof ids), SPMD_OK);
        assert_int_equal(spmd_program_set_input(p, t.targets, tg, sizeof tg), SPMD_OK);
        if (spmd_trainer_step(tr, kind == SPMD_OPTIMIZER_SGD ? 0.5f : 1e-2f, &loss[s], NULL) != SPMD_OK)
            fail_msg("step %d on %d devices: %s", s, devices, spmd_last_error());
    }
    spmd_trainer_free(tr);
    spmd_graph_free(g);
    spmd_mesh_free(mesh);
}

static void check_losses(const char *what, const float *got, const float *want)
{
    for (int s = 0; s < STEPS; s++) {
        print_message("%s, step %d: loss %.7f (one device %.7f)\n", what, s, (double)got[s],
                      (double)want[s]);
        if (!(fabs((double)got[s] - (double)want[s]) <= TOL))
            fail_msg("%s, step %d: loss %.9g, one device %.9g", what, s, (double)got[s],
                     (double)want[s]);
    }
}

static void check_against_one_device(spmd_optimizer_kind kind)
{
    const char *opt = kind == SPMD_OPTIMIZER_SGD ? "sgd" : "adamw";
    float want[STEPS], got[STEPS];
    char what[64];
    train(ONE_DEVICE, 1, kind, want);
    for (int devices = 2; devices <= 8; devices *= 2) {
        train(TENSOR, devices, kind, got);
        snprintf(what, sizeof what, "%s, wte over %d devices", opt, devices);
        check_losses(what, got, want);
    }
    train(DATA_TENSOR, 4, kind, got);
    snprintf(what, sizeof what, "%s, batch over data, wte over tensor (2x2)", opt);
    check_losses(what, got, want);
    train(FSDP, 4, kind, got);
    snprintf(what, sizeof what, "%s, fsdp on 2x2", opt);
    check_losses(what, got, want);
}

static void test_gpt_vocab_split_sgd(void **state)
{
    (void)state;
    check_against_one_device(SPMD_OPTIMIZER_SGD);
}

static void test_gpt_vocab_split_adamw(void **state)
{
    (void)state;
    check_against_one_device(SPMD_OPTIMIZER_ADAMW);
}

/* An id or a target outside the vocabulary fails the step with the usual
 * message, which names the whole vocabulary, not a device's block. */
static void test_bad_ids_name_the_whole_vocabulary(void **state)
{
    (void)state;
    spmd_mesh *mesh = spmd_mesh_parse("3", "tensor");
    for (int loss = 0; loss < 2; loss++) {
        spmd_graph *g = spmd_graph_create(NULL);
        spmd_tensor *table = spmd_param(g, "table", 2, (const int64_t[]){10, 4},
                                        (spmd_init){SPMD_INIT_NORMAL, 0.5f});
        spmd_tensor *ids = spmd_input(g, "ids", SPMD_I32, 1, (const int64_t[]){3});
        spmd_tensor *targets = spmd_input(g, "targets", SPMD_I32, 1, (const int64_t[]){3});
        spmd_tensor *out = spmd_embedding(g, table, ids);
        if (loss) out = spmd_cross_entropy(g, spmd_matmul(g, out, table, false, true), targets);
        assert_non_null(out);
        assert_int_equal(spmd_graph_mark_output(g, out), SPMD_OK);
        assert_int_equal(spmd_mark_sharding(g, table, mesh, "tensor, None"), SPMD_OK);
        spmd_program *p = spmd_compile(g, &(spmd_compile_options){.threads = 3});
        assert_non_null(p);
        int32_t good[3] = {0, 9, 4}, bad[3] = {1, 12, 2};
        assert_int_equal(spmd_program_set_input(p, ids, loss ? good : bad, sizeof good), SPMD_OK);
        if (loss) assert_int_equal(spmd_program_set_input(p, targets, bad, sizeof bad), SPMD_OK);
        assert_int_equal(spmd_program_run(p), SPMD_ERR_INVALID);
        const char *msg = spmd_last_error();
        const char *want = loss ? "cross_entropy: target 12 at position 1 is outside the 10 classes"
                                : "embedding: id 12 at position 1 is outside the table's 10 rows";
        if (!strstr(msg, want)) fail_msg("message \"%s\", want \"%s\"", msg, want);
        if (loss) { /* and runs again once the data is good */
            assert_int_equal(spmd_program_set_input(p, targets, good, sizeof good), SPMD_OK);
            assert_int_equal(spmd_program_run(p), SPMD_OK);
        }
        spmd_program_free(p);
        spmd_graph_free(g);
    }
    spmd_mesh_free(mesh);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt_vocab_split_sgd),
        cmocka_unit_test(test_gpt_vocab_split_adamw),
        cmocka_unit_test(test_bad_ids_name_the_whole_vocabulary),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
