/*
 * Plans need no GEMM library (docs/DESIGN.md, "Kernels and BLAS"): with the
 * BLAS loader made to fail (a library file that does not exist), a graph
 * still compiles, plan-only or runnable, and its reports (collectives,
 * memory) are what `spmd explain` prints; only running it fails, with the
 * loader's message, every time.  Its own process: the BLAS choice is
 * process-wide.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "spmd/mesh.h"
#include "spmd/models.h"
#include "spmd/spmd.h"

#define MISSING "/nonexistent/libcblas.so.3"

static void test_plans_without_blas(void **state)
{
    (void)state;
    assert_int_equal(spmd_blas_select(MISSING, NULL), SPMD_ERR_BACKEND);
    assert_non_null(strstr(spmd_last_error(), MISSING));
    assert_null(spmd_blas_describe());

    /* The motivating case: an MLP on 4x2 with its weights over fsdp. */
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_mesh *mesh = spmd_mesh_parse("4x2", "replica,fsdp");
    assert_non_null(g);
    assert_non_null(mesh);
    spmd_mlp_tensors t;
    spmd_mlp_config cfg = {.in_dim = 8, .hidden = 16, .layers = 2, .out_dim = 4};
    assert_int_equal(spmd_mlp_build(g, &cfg, NULL, 16, &t), SPMD_OK);
    assert_int_equal(spmd_mlp_add_loss(g, SPMD_MLP_CROSS_ENTROPY, &t), SPMD_OK);
    assert_int_equal(spmd_mark_sharding(g, t.input, mesh, "(replica, fsdp), None"), SPMD_OK);
    for (int i = 0; i < spmd_graph_tensor_count(g); i++) {
        spmd_tensor *x = spmd_graph_tensor(g, i);
        if (spmd_tensor_is_param(x) && spmd_tensor_rank(x) == 2)
            assert_int_equal(spmd_mark_sharding(g, x, mesh, "fsdp, None"), SPMD_OK);
    }
    spmd_tensor *lr = spmd_input(g, "lr", SPMD_F32, 0, NULL);
    assert_int_equal(spmd_graph_mark_output(g, t.loss), SPMD_OK);
    assert_int_equal(spmd_grad(g, t.loss), SPMD_OK);
    assert_int_equal(spmd_sgd(g, lr), SPMD_OK);

    spmd_program *plan = spmd_compile(g, &(spmd_compile_options){.plan_only = true});
    assert_non_null(plan);
    int n = spmd_program_collective_count(plan);
    assert_true(n > 0);
    bool gathers = false;
    for (int i = 0; i < n; i++) {
        spmd_collective_info c;
        assert_int_equal(spmd_program_collective(plan, i, &c), SPMD_OK);
        if (!strcmp(c.kind, "all-gather") && !strcmp(c.axes, "fsdp")) gathers = true;
    }
    assert_true(gathers);
    assert_true(spmd_program_peak_bytes(plan) > spmd_program_persistent_bytes(plan));
    assert_int_equal(spmd_program_run(plan), SPMD_ERR_INVALID); /* plan-only: cannot run */

    /* Runnable: set up, and refused at the first run, naming the library. */
    spmd_program *p = spmd_compile(g, NULL);
    assert_non_null(p);
    assert_int_equal(spmd_program_collective_count(p), n);
    for (int attempt = 0; attempt < 2; attempt++) {
        spmd_clear_error();
        assert_int_equal(spmd_program_run(p), SPMD_ERR_BACKEND);
        assert_non_null(strstr(spmd_last_error(), MISSING));
    }
    /* Too late to choose another library: the failure stays. */
    assert_int_equal(spmd_blas_select("auto", NULL), SPMD_ERR_INVALID);

    spmd_program_free(p);
    spmd_program_free(plan);
    spmd_mesh_free(mesh);
    spmd_graph_free(g);
}

static void test_unknown_library_names(void **state)
{
    (void)state;
    assert_int_equal(spmd_blas_select("mkl", NULL), SPMD_ERR_INVALID);
    assert_non_null(strstr(spmd_last_error(), "'mkl'"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unknown_library_names),
        cmocka_unit_test(test_plans_without_blas),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
