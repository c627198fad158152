/*
 * Independent mesh axes in the library: a program over a mesh with an
 * independent axis holds one model per group along it; each copy starts
 * from its own seed, takes its own inputs, and reads and writes alone;
 * marks that split over the axis are refused.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <string.h>

#include "spmd/mesh.h"
#include "spmd/models.h"

enum { BATCH = 4, IN = 6, OUT = 3 };

typedef struct model {
    spmd_mesh *mesh;
    spmd_graph *g;
    spmd_mlp_tensors t;
    spmd_program *p;
} model;

/* An MLP with its batch split over 'data' on `shape`/`axes`; axis
 * 'copy', when the mesh has it, independent. */
static void build(model *m, const char *shape, const char *axes, const uint64_t *seeds, uint64_t seed)
{
    m->mesh = spmd_mesh_parse(shape, axes);
    assert_non_null(m->mesh);
    int copy = spmd_mesh_axis_index(m->mesh, "copy");
    spmd_clear_error();
    if (copy >= 0) assert_int_equal(spmd_mesh_set_axis_independent(m->mesh, copy, true), SPMD_OK);
    m->g = spmd_graph_create(NULL);
    spmd_mlp_config cfg = {.in_dim = IN, .hidden = 8, .layers = 1, .out_dim = OUT};
    assert_int_equal(spmd_mlp_build(m->g, &cfg, NULL, BATCH, &m->t), SPMD_OK);
    assert_int_equal(spmd_mark_sharding(m->g, m->t.input, m->mesh, "data, None"), SPMD_OK);
    assert_int_equal(spmd_graph_mark_output(m->g, m->t.output), SPMD_OK);
    m->p = spmd_compile(m->g, &(spmd_compile_options){.seed = seed, .copy_seeds = seeds});
    assert_non_null(m->p);
}

static void drop(model *m)
{
    spmd_program_free(m->p);
    spmd_graph_free(m->g);
    spmd_mesh_free(m->mesh);
}

static void read_weight(const model *m, int copy, float *w)
{
    spmd_tensor *t = spmd_graph_find(m->g, "fc.0.weight");
    assert_int_equal(spmd_program_read_copy(m->p, copy, t, w, sizeof(float) * 8 * IN), SPMD_OK);
}

static void test_each_copy_is_its_own_model(void **state)
{
    (void)state;
    const uint64_t seeds[2] = {7, 8};
    model both, a, b;
    build(&both, "2x2", "copy,data", seeds, 1);
    build(&a, "2", "data", NULL, 7);
    build(&b, "2", "data", NULL, 8);
    assert_int_equal(spmd_program_copies(both.p), 2);
    assert_int_equal(spmd_program_copies(a.p), 1);

    /* Initial values: copy c is the solo model of seed c's. */
    float w[2][8 * IN], solo[2][8 * IN];
    read_weight(&both, 0, w[0]);
    read_weight(&both, 1, w[1]);
    read_weight(&a, 0, solo[0]);
    read_weight(&b, 0, solo[1]);
    assert_memory_equal(w[0], solo[0], sizeof w[0]);
    assert_memory_equal(w[1], solo[1], sizeof w[1]);
    assert_memory_not_equal(w[0], w[1], sizeof w[0]);

    /* Inputs per copy: outputs are each solo model's on its own input. */
    float x[2][BATCH * IN], y[2][BATCH * OUT], ys[BATCH * OUT];
    for (int i = 0; i < BATCH * IN; i++) x[0][i] = 0.1f * (float)i, x[1][i] = 1.0f - 0.05f * (float)i;
    for (int c = 0; c < 2; c++)
        assert_int_equal(spmd_program_set_input_copy(both.p, c, both.t.input, x[c], sizeof x[c]), SPMD_OK);
    assert_int_equal(spmd_program_run(both.p), SPMD_OK);
    for (int c = 0; c < 2; c++) {
        assert_int_equal(spmd_program_read_copy(both.p, c, both.t.output, y[c], sizeof y[c]), SPMD_OK);
        model *solo_m = c ? &b : &a;
        assert_int_equal(spmd_program_set_input(solo_m->p, solo_m->t.input, x[c], sizeof x[c]), SPMD_OK);
        assert_int_equal(spmd_program_run(solo_m->p), SPMD_OK);
        assert_int_equal(spmd_program_read(solo_m->p, solo_m->t.output, ys, sizeof ys), SPMD_OK);
        assert_memory_equal(y[c], ys, sizeof ys);
    }

    /* A write to one copy leaves the other; read is copy 0's. */
    spmd_tensor *wt = spmd_graph_find(both.g, "fc.0.weight");
    float zero[8 * IN] = {0}, back[8 * IN];
    assert_int_equal(spmd_program_write_copy(both.p, 1, wt, zero, sizeof zero), SPMD_OK);
    read_weight(&both, 1, back);
    assert_memory_equal(back, zero, sizeof zero);
    assert_int_equal(spmd_program_read(both.p, wt, back, sizeof back), SPMD_OK);
    assert_memory_equal(back, w[0], sizeof back);

    /* Copies out of range. */
    assert_int_equal(spmd_program_read_copy(both.p, 2, wt, back, sizeof back), SPMD_ERR_INVALID);
    assert_non_null(strstr(spmd_last_error(), "copy 2, the program has 2"));
    assert_int_equal(spmd_program_set_input_copy(both.p, -1, both.t.input, x[0], sizeof x[0]),
                     SPMD_ERR_INVALID);
    drop(&both), drop(&a), drop(&b);
}

/* No split over an independent axis: refused when marking, and at compile
 * when the axis is declared after the mark. */
static void test_marks_over_copies_refused(void **state)
{
    (void)state;
    spmd_mesh *mesh = spmd_mesh_parse("2x2", "copy,data");
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_mlp_tensors t;
    spmd_mlp_config cfg = {.in_dim = IN, .hidden = 8, .layers = 1, .out_dim = OUT};
    assert_int_equal(spmd_mlp_build(g, &cfg, NULL, BATCH, &t), SPMD_OK);
    assert_int_equal(spmd_mark_sharding(g, t.input, mesh, "(copy, data), None"), SPMD_OK);
    assert_int_equal(spmd_mesh_set_axis_independent(mesh, 0, true), SPMD_OK);
    assert_true(spmd_mesh_axis_is_independent(mesh, 0));
    assert_int_equal(spmd_mesh_copies(mesh), 2);
    assert_null(spmd_compile(g, NULL));
    assert_non_null(strstr(spmd_last_error(), "axis 'copy', which is independent"));
    spmd_tensor *w = spmd_graph_find(g, "fc.0.weight");
    assert_int_equal(spmd_mark_sharding(g, w, mesh, "copy, None"), SPMD_ERR_INVALID);
    assert_non_null(strstr(spmd_last_error(), "'copy', which is independent"));
    spmd_graph_free(g);
    spmd_mesh_free(mesh);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_copy_is_its_own_model),
        cmocka_unit_test(test_marks_over_copies_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
