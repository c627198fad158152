/*
 * Graph construction: shape errors that name the op and both shapes, error
 * chaining through NULL operands (the graph's first failure, never a
 * message left by another graph or call), names, dimension signatures, the
 * memory plan's buffer reuse, and allocation failures injected through the
 * allocator hook (reported as SPMD_ERR_NOMEM).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "compile/plan.h"
#include "ir/ir.h"
#include "spmd/mesh.h"
#include "spmd/spmd.h"
#include "support_alloc.h"

/* Fails the test with the whole text when `part` is not in it. */
#define assert_contains(text, part)                                                        \
    do {                                                                                   \
        if (!strstr((text), (part))) fail_msg("\"%s\" does not contain \"%s\"", (text), (part)); \
    } while (0)

static spmd_tensor *input2(spmd_graph *g, const char *name, int64_t a, int64_t b)
{
    int64_t d[2] = {a, b};
    return spmd_input(g, name, SPMD_F32, 2, d);
}

static void test_matmul_mismatch_names_op_and_shapes(void **state)
{
    (void)state;
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_tensor *a = input2(g, "a", 4, 3), *b = input2(g, "b", 5, 6);
    spmd_clear_error();
    assert_null(spmd_matmul(g, a, b, false, false));
    const char *msg = spmd_last_error();
    assert_non_null(strstr(msg, "matmul"));
    assert_non_null(strstr(msg, "[4, 3]"));
    assert_non_null(strstr(msg, "[5, 6]"));
    spmd_graph_free(g);
}

static void test_broadcast_mismatch(void **state)
{
    (void)state;
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_tensor *a = input2(g, "a", 4, 3), *b = input2(g, "b", 2, 3);
    assert_null(spmd_add(g, a, b));
    assert_non_null(strstr(spmd_last_error(), "add"));
    assert_non_null(strstr(spmd_last_error(), "[4, 3]"));
    assert_non_null(strstr(spmd_last_error(), "[2, 3]"));
    int64_t bias_dims[1] = {3};
    spmd_tensor *bias = spmd_input(g, "bias", SPMD_F32, 1, bias_dims);
    spmd_tensor *y = spmd_add(g, a, bias);
    assert_non_null(y);
    assert_int_equal(spmd_tensor_rank(y), 2);
    assert_int_equal(spmd_tensor_dim(y, 0), 4);
    spmd_graph_free(g);
}

/* The first failure's message survives later ops on its NULL result. */
static void test_error_chains_through_null(void **state)
{
    (void)state;
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_tensor *a = input2(g, "a", 4, 3), *b = input2(g, "b", 5, 6);
    spmd_clear_error();
    spmd_tensor *y = spmd_matmul(g, a, b, false, true);
    y = spmd_gelu(g, y);
    y = spmd_sum(g, y, 3, false);
    assert_null(y);
    assert_non_null(strstr(spmd_last_error(), "matmul"));
    spmd_graph_free(g);
}

/* A NULL operand on a graph where nothing failed is the user's own NULL:
 * it is named as such, not explained by whatever failed last on the
 * thread (a mesh parse, a builder of another graph). */
static void test_stale_error_does_not_leak(void **state)
{
    (void)state;
    spmd_clear_error();
    assert_null(spmd_mesh_parse("4x", "replica, fsdp"));
    assert_contains(spmd_last_error(), "mesh shape");
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_tensor *x = input2(g, "x", 4, 3);
    assert_null(spmd_add(g, NULL, x));
    assert_contains(spmd_last_error(), "add: operand 0 is NULL");
    assert_int_equal(spmd_graph_status(g), SPMD_ERR_INVALID);
    assert_contains(spmd_last_error(), "add: operand 0 is NULL");

    /* Graph a fails; a NULL on graph b is b's own failure. */
    spmd_graph *a = spmd_graph_create(NULL), *b = spmd_graph_create(NULL);
    spmd_tensor *bad = spmd_matmul(a, input2(a, "p", 4, 3), input2(a, "q", 5, 6), false, false);
    assert_null(bad);
    assert_contains(spmd_last_error(), "matmul");
    assert_int_equal(spmd_graph_status(b), SPMD_OK);
    assert_null(spmd_gelu(b, bad));
    assert_contains(spmd_last_error(), "gelu: operand 0 is NULL");
    assert_null(strstr(spmd_last_error(), "matmul"));
    assert_int_equal(spmd_graph_status(b), SPMD_ERR_INVALID);
    assert_int_equal(spmd_graph_status(a), SPMD_ERR_SHAPE);
    assert_contains(spmd_last_error(), "matmul");
    assert_int_equal(spmd_graph_mark_output(b, NULL), SPMD_ERR_INVALID);
    assert_contains(spmd_last_error(), "gelu: operand 0 is NULL");

    assert_int_equal(spmd_graph_status(NULL), SPMD_ERR_INVALID);
    spmd_graph_free(g);
    spmd_graph_free(a);
    spmd_graph_free(b);
}

/* After a shape error, every later use of its NULL on that graph reports
 * that first failure with its status, whatever failed in between. */
static void test_first_failure_is_carried(void **state)
{
    (void)state;
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_tensor *a = input2(g, "a", 4, 3), *b = input2(g, "b", 5, 6);
    assert_int_equal(spmd_graph_status(g), SPMD_OK);
    spmd_tensor *y = spmd_matmul(g, a, b, false, true);
    assert_null(spmd_mesh_parse("2x2", "only_one_name")); /* unrelated, in between */
    y = spmd_sum(g, spmd_gelu(g, y), 3, false);
    assert_null(y);
    assert_contains(spmd_last_error(), "matmul");
    assert_contains(spmd_last_error(), "[4, 3]");

    /* A later failure of its own says why, but is not the graph's first. */
    assert_null(spmd_add(g, a, b));
    assert_contains(spmd_last_error(), "add");
    spmd_clear_error();
    assert_int_equal(spmd_graph_status(g), SPMD_ERR_SHAPE);
    assert_contains(spmd_last_error(), "matmul");

    assert_null(spmd_mesh_parse("2x2", "only_one_name"));
    assert_int_equal(spmd_graph_mark_output(g, y), SPMD_ERR_SHAPE);
    assert_contains(spmd_last_error(), "matmul");
    assert_null(spmd_mesh_parse("2x2", "only_one_name"));
    assert_int_equal(spmd_grad(g, y), SPMD_ERR_SHAPE);
    assert_contains(spmd_last_error(), "matmul");
    assert_int_equal(spmd_graph_set_update(g, NULL, y), SPMD_ERR_SHAPE);
    assert_int_equal(spmd_sgd(g, NULL), SPMD_ERR_SHAPE);
    spmd_graph_free(g);
}

/* A builder that runs out of memory reports SPMD_ERR_NOMEM (the graph's
 * status and every later use of its NULL), and spmd_grad failing that way
 * says so even on a graph whose first failure is an older shape error. */
static void test_out_of_memory_status(void **state)
{
    (void)state;
    int builder_failures = 0, grad_failures = 0, grad_builder_failures = 0;
    for (int budget = 1; budget < 40; budget++) {
        test_alloc f;
        spmd_allocator al = test_alloc_init(&f, -1);
        spmd_graph *g = spmd_graph_create(&al);
        assert_non_null(g);
        int64_t d[1] = {8};
        spmd_tensor *w = spmd_param(g, "w", 1, d, (spmd_init){SPMD_INIT_ZEROS, 0});
        assert_null(spmd_add(g, w, input2(g, "wrong", 2, 3))); /* the older failure */
        assert_int_equal(spmd_graph_status(g), SPMD_ERR_SHAPE);

        test_alloc_set_budget(&f, budget);
        spmd_tensor *y = w;
        for (int i = 0; i < 100 && y; i++) y = spmd_tanh(g, y);
        spmd_tensor *loss = spmd_sum(g, y, 1, false);
        if (!loss) {
            builder_failures++;
            assert_int_equal(spmd_graph_mark_output(g, loss), SPMD_ERR_SHAPE); /* the first */
            test_alloc_set_budget(&f, -1);
            spmd_graph_free(g);
            continue;
        }
        int forward_nodes = g->n_nodes;
        spmd_status st = spmd_grad(g, loss);
        test_alloc_set_budget(&f, -1);
        if (st != SPMD_OK) {
            grad_failures++;
            grad_builder_failures += g->n_nodes > forward_nodes; /* a builder inside failed */
            assert_int_equal(st, SPMD_ERR_NOMEM);
            assert_contains(spmd_last_error(), "out of memory");
        }
        assert_int_equal(spmd_graph_status(g), SPMD_ERR_SHAPE);
        spmd_graph_free(g);
    }
    assert_true(grad_failures > 0);
    assert_true(grad_builder_failures > 0);

    /* On a graph without an older failure, the out-of-memory one is its first. */
    for (int budget = 1; budget < 12; budget++) {
        test_alloc f;
        spmd_allocator al = test_alloc_init(&f, budget);
        spmd_graph *g = spmd_graph_create(&al);
        assert_non_null(g);
        spmd_tensor *y = input2(g, "x", 4, 4);
        for (int i = 0; i < 200 && y; i++) y = spmd_tanh(g, y);
        if (y) {
            spmd_graph_free(g);
            continue;
        }
        builder_failures++;
        spmd_clear_error();
        assert_null(spmd_exp(g, y));
        assert_contains(spmd_last_error(), "out of memory");
        assert_int_equal(spmd_graph_status(g), SPMD_ERR_NOMEM);
        assert_int_equal(spmd_graph_mark_output(g, y), SPMD_ERR_NOMEM);
        spmd_graph_free(g);
    }
    assert_true(builder_failures > 0);
}

static void test_names_are_unique(void **state)
{
    (void)state;
    spmd_graph *g = spmd_graph_create(NULL);
    int64_t d[1] = {3};
    assert_non_null(spmd_param(g, "w", 1, d, (spmd_init){SPMD_INIT_ZEROS, 0}));
    assert_null(spmd_param(g, "w", 1, d, (spmd_init){SPMD_INIT_ZEROS, 0}));
    assert_non_null(strstr(spmd_last_error(), "'w'"));
    assert_null(spmd_input(g, "", SPMD_F32, 1, d));
    assert_non_null(spmd_graph_find(g, "w"));
    assert_null(spmd_graph_find(g, "nope"));
    spmd_graph_free(g);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_tensor *a = input2(g, "a", 4, 3);
    assert_null(spmd_slice(g, a, 1, 2, 5));
    assert_non_null(strstr(spmd_last_error(), "slice"));
    int64_t bad[2] = {5, 5};
    assert_null(spmd_reshape(g, a, 2, bad));
    assert_non_null(strstr(spmd_last_error(), "[4, 3]"));
    assert_non_null(strstr(spmd_last_error(), "[5, 5]"));
    int perm[2] = {0, 0};
    assert_null(spmd_permute(g, a, perm));
    assert_null(spmd_sum(g, a, 1u << 5, false));
    assert_null(spmd_attention(g, a, a, a, 2));
    int64_t zero[2] = {0, 3};
    assert_null(spmd_input(g, "z", SPMD_F32, 2, zero));
    assert_non_null(strstr(spmd_last_error(), "positive"));
    spmd_graph_free(g);
}

static void expect_sig(spmd_tensor *t, const char *want)
{
    char buf[64];
    spmd_tensor_signature(t, buf, sizeof buf);
    assert_string_equal(buf, want);
}

static void test_signatures(void **state)
{
    (void)state;
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_tensor *x = input2(g, "x", 8, 4), *w = input2(g, "w", 6, 4);
    expect_sig(spmd_matmul(g, x, w, false, true), "mk,nk->mn");
    spmd_tensor *y = spmd_matmul(g, x, w, false, true);
    expect_sig(spmd_matmul(g, y, x, true, false), "km,kn->mn");
    int64_t d3[3] = {2, 5, 4};
    spmd_tensor *x3 = spmd_input(g, "x3", SPMD_F32, 3, d3);
    expect_sig(spmd_matmul(g, x3, w, false, true), "btk,nk->btn");
    int64_t db[1] = {4};
    spmd_tensor *b = spmd_input(g, "b", SPMD_F32, 1, db);
    expect_sig(spmd_add(g, x, b), "ab,b->ab");
    expect_sig(spmd_softmax(g, x), "ad->ad");
    expect_sig(spmd_sum(g, x, 1u, false), "ab->b");
    expect_sig(spmd_attention(g, x3, x3, x3, 2), "btc,bsc,bsc->btc");
    ir_dimsig sig;
    spmd_tensor *att = spmd_attention(g, x3, x3, x3, 2);
    assert_true(ir_signature(att, &sig));
    assert_int_equal(sig.granule[3], 2); /* channels shard in whole heads */
    int64_t dr[2] = {4, 8};
    char buf[64];
    spmd_tensor_signature(spmd_reshape(g, x, 2, dr), buf, sizeof buf);
    assert_non_null(strstr(buf, "explicit rule"));
    spmd_graph_free(g);
}

/* A chain of same-size ops needs two live buffers, not one per op. */
static void test_plan_reuses_buffers(void **state)
{
    (void)state;
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_tensor *x = input2(g, "x", 64, 64);
    spmd_tensor *y = x;
    for (int i = 0; i < 10; i++) y = spmd_tanh(g, y);
    spmd_graph_mark_output(g, y);
    plan p;
    assert_int_equal(plan_build(&p, g, NULL, NULL), SPMD_OK);
    assert_int_equal(p.n_steps, 10);
    assert_int_equal(p.arena_bytes, 2 * 64 * 64 * 4);
    plan_free(&p);
    spmd_graph_free(g);
}

/* Unused branches are not scheduled; reshapes of computed tensors share
 * their bytes. */
static void test_plan_prunes_and_aliases(void **state)
{
    (void)state;
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_tensor *x = input2(g, "x", 8, 8);
    spmd_tensor *dead = spmd_exp(g, x);
    (void)dead;
    spmd_tensor *y = spmd_tanh(g, x);
    int64_t d[1] = {64};
    spmd_tensor *r = spmd_reshape(g, y, 1, d);
    spmd_graph_mark_output(g, r);
    plan p;
    assert_int_equal(plan_build(&p, g, NULL, NULL), SPMD_OK);
    assert_int_equal(p.n_steps, 1);
    assert_false(p.needed[dead->id]);
    assert_int_equal(p.offset[r->id], p.offset[y->id]);
    plan_free(&p);
    spmd_graph_free(g);
}

/* Allocation failures injected through the hook come back as errors. */
static void test_allocation_failure_is_clean(void **state)
{
    (void)state;
    for (int budget = 0; budget < 12; budget++) {
        test_alloc f;
        spmd_allocator a = test_alloc_init(&f, budget);
        spmd_graph *g = spmd_graph_create(&a);
        if (!g) {
            assert_non_null(strstr(spmd_last_error(), "out of memory"));
            continue;
        }
        spmd_tensor *x = input2(g, "x", 4, 4);
        spmd_tensor *y = spmd_tanh(g, x);
        for (int i = 0; i < 200 && y; i++) y = spmd_tanh(g, y);
        if (y) spmd_graph_mark_output(g, y);
        spmd_program *p = y ? spmd_compile(g, &(spmd_compile_options){.threads = 1}) : NULL;
        if (!p) assert_true(strlen(spmd_last_error()) > 0);
        spmd_program_free(p);
        spmd_graph_free(g);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_mismatch_names_op_and_shapes),
        cmocka_unit_test(test_broadcast_mismatch),
        cmocka_unit_test(test_error_chains_through_null),
        cmocka_unit_test(test_stale_error_does_not_leak),
        cmocka_unit_test(test_first_failure_is_carried),
        cmocka_unit_test(test_out_of_memory_status),
        cmocka_unit_test(test_names_are_unique),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_signatures),
        cmocka_unit_test(test_plan_reuses_buffers),
        cmocka_unit_test(test_plan_prunes_and_aliases),
        cmocka_unit_test(test_allocation_failure_is_clean),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
