/*
 * Initial values, filled when first needed: a parameter the caller writes
 * before the first run keeps what was written, the others read and train
 * from the seed's values as if every leaf had been filled at compile, on
 * a split weight and per copy of an independent axis.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <string.h>

#include "spmd/mesh.h"
#include "spmd/models.h"
#include "spmd/train.h"

enum { BATCH = 4, IN = 6, HIDDEN = 8, OUT = 3, WEIGHT = HIDDEN * IN };

typedef struct model {
    spmd_mesh *mesh;
    spmd_graph *g;
    spmd_mlp_tensors t;
    spmd_tensor *lr;
    spmd_program *p;
} model;

/* A trained MLP on `shape`/`axes`: fc.0.weight split over 'data', the
 * batch too; axis 'copy', when the mesh has it, independent. */
static void build(model *m, const char *shape, const char *axes)
{
    static const uint64_t seeds[] = {5, 9};
    m->mesh = spmd_mesh_parse(shape, axes);
    assert_non_null(m->mesh);
    int copy = spmd_mesh_axis_index(m->mesh, "copy");
    spmd_clear_error();
    if (copy >= 0) assert_int_equal(spmd_mesh_set_axis_independent(m->mesh, copy, true), SPMD_OK);
    m->g = spmd_graph_create(NULL);
    spmd_mlp_config cfg = {.in_dim = IN, .hidden = HIDDEN, .layers = 1, .out_dim = OUT};
    assert_int_equal(spmd_mlp_build(m->g, &cfg, NULL, BATCH, &m->t), SPMD_OK);
    assert_int_equal(spmd_mlp_add_loss(m->g, SPMD_MLP_CROSS_ENTROPY, &m->t), SPMD_OK);
    assert_int_equal(spmd_mark_sharding(m->g, m->t.input, m->mesh, "data, None"), SPMD_OK);
    spmd_tensor *w = spmd_graph_find(m->g, "fc.0.weight");
    assert_int_equal(spmd_mark_sharding(m->g, w, m->mesh, "data, None"), SPMD_OK);
    assert_int_equal(spmd_graph_mark_output(m->g, m->t.loss), SPMD_OK);
    assert_int_equal(spmd_grad(m->g, m->t.loss), SPMD_OK);
    spmd_optimizer opt = {.kind = SPMD_OPTIMIZER_ADAMW, .weight_decay = 0.01f};
    spmd_optimizer_tensors ot;
    assert_int_equal(spmd_optimizer_apply(m->g, &opt, &ot), SPMD_OK);
    m->lr = ot.lr;
    m->p = spmd_compile(m->g, &(spmd_compile_options){.seed = 3, .copy_seeds = copy >= 0 ? seeds : NULL});
    assert_non_null(m->p);
}

static void drop(model *m)
{
    spmd_program_free(m->p);
    spmd_graph_free(m->g);
    spmd_mesh_free(m->mesh);
}

static void read_param(const model *m, int copy, const char *name, float *x, size_t n)
{
    spmd_tensor *t = spmd_graph_find(m->g, name);
    spmd_status st = spmd_program_read_copy(m->p, copy, t, x, n * sizeof *x);
    if (st != SPMD_OK) fail_msg("%s: %s", name, spmd_last_error());
}

/* Every copy's batch and one run. */
static void step(const model *m, int copies)
{
    float x[BATCH * IN];
    int32_t y[BATCH];
    for (int i = 0; i < BATCH * IN; i++) x[i] = (float)((i * 7) % 11) / 11.0f - 0.5f;
    for (int i = 0; i < BATCH; i++) y[i] = i % OUT;
    float lr = 0.01f;
    assert_int_equal(spmd_program_set_input(m->p, m->lr, &lr, sizeof lr), SPMD_OK);
    for (int c = 0; c < copies; c++) {
        assert_int_equal(spmd_program_set_input_copy(m->p, c, m->t.input, x, sizeof x), SPMD_OK);
        assert_int_equal(spmd_program_set_input_copy(m->p, c, m->t.targets, y, sizeof y), SPMD_OK);
    }
    assert_int_equal(spmd_program_run(m->p), SPMD_OK);
}

/* A program written before any read against one whose values were read
 * (so filled) first, then written the same: the same bits after a step. */
static void check_written_before_filled(const char *shape, const char *axes, int copies, int written_copy)
{
    float mine[WEIGHT];
    for (int i = 0; i < WEIGHT; i++) mine[i] = 0.01f * (float)(i % 13) - 0.05f;
    model late, early;
    build(&late, shape, axes);
    build(&early, shape, axes);
    float before[WEIGHT], bias[HIDDEN], bias_early[HIDDEN];
    for (int c = 0; c < copies; c++) read_param(&early, c, "fc.0.weight", before, WEIGHT);
    spmd_tensor *w_late = spmd_graph_find(late.g, "fc.0.weight");
    spmd_tensor *w_early = spmd_graph_find(early.g, "fc.0.weight");
    if (written_copy < 0) {
        assert_int_equal(spmd_program_write(late.p, w_late, mine, sizeof mine), SPMD_OK);
        assert_int_equal(spmd_program_write(early.p, w_early, mine, sizeof mine), SPMD_OK);
    } else {
        assert_int_equal(spmd_program_write_copy(late.p, written_copy, w_late, mine, sizeof mine), SPMD_OK);
        assert_int_equal(spmd_program_write_copy(early.p, written_copy, w_early, mine, sizeof mine), SPMD_OK);
    }
    for (int c = 0; c < copies; c++) {
        float got[WEIGHT];
        read_param(&late, c, "fc.0.weight", got, WEIGHT);
        if (written_copy < 0 || c == written_copy) assert_memory_equal(got, mine, sizeof mine);
        read_param(&late, c, "fc.0.bias", bias, HIDDEN);
        read_param(&early, c, "fc.0.bias", bias_early, HIDDEN);
        assert_memory_equal(bias, bias_early, sizeof bias);
    }
    step(&late, copies);
    step(&early, copies);
    for (int c = 0; c < copies; c++)
        for (const char *const *name = (const char *const[]){"fc.0.weight", "fc.0.bias", "fc.1.weight", NULL};
             *name; name++) {
            float a[WEIGHT], b[WEIGHT];
            size_t n = strcmp(*name, "fc.0.bias") == 0 ? HIDDEN : strcmp(*name, "fc.1.weight") == 0 ? OUT * HIDDEN : WEIGHT;
            read_param(&late, c, *name, a, n);
            read_param(&early, c, *name, b, n);
            assert_memory_equal(a, b, n * sizeof *a);
        }
    drop(&late);
    drop(&early);
}

static void test_written_before_filled_split(void **state)
{
    (void)state;
    check_written_before_filled("2", "data", 1, -1);
}

static void test_written_one_copy(void **state)
{
    (void)state;
    check_written_before_filled("2x2", "copy,data", 2, 1);
}

/* A copy written alone: the other copy trains from its own seed's values,
 * as a program with nothing written does. */
static void test_unwritten_copy_keeps_its_seed(void **state)
{
    (void)state;
    model written, untouched;
    build(&written, "2x2", "copy,data");
    build(&untouched, "2x2", "copy,data");
    float mine[WEIGHT] = {0};
    spmd_tensor *w = spmd_graph_find(written.g, "fc.0.weight");
    assert_int_equal(spmd_program_write_copy(written.p, 1, w, mine, sizeof mine), SPMD_OK);
    step(&written, 2);
    step(&untouched, 2);
    float a[WEIGHT], b[WEIGHT];
    read_param(&written, 0, "fc.0.weight", a, WEIGHT);
    read_param(&untouched, 0, "fc.0.weight", b, WEIGHT);
    assert_memory_equal(a, b, sizeof a);
    drop(&written);
    drop(&untouched);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_written_before_filled_split),
        cmocka_unit_test(test_written_one_copy),
        cmocka_unit_test(test_unwritten_copy_keeps_its_seed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
