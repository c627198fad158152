/*
 * The name index: spmd_graph_find finds each of 200,000 named tensors, and
 * building and searching such a graph compares about one name per lookup
 * (counted by ir_name_compares, not timed), so naming n tensors is linear,
 * not quadratic; renames move a name, duplicates are refused, and an
 * index that cannot grow fails the builder or rename with SPMD_ERR_NOMEM
 * and leaves the graph usable.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "ir/ir.h"
#include "spmd/spmd.h"
#include "support_alloc.h"

enum { MANY = 200000 };

/* Names like a model's: long shared prefixes, numbers inside. */
static const char *name_of(int i, char *buf, size_t size)
{
    static const char *const last[] = {"weight", "bias", "exp_avg", "exp_avg_sq"};
    snprintf(buf, size, "h.%d.mlp.c_fc.%s", i / 4, last[i % 4]);
    return buf;
}

/* A graph of n named scalars; the name comparisons building it took. */
static spmd_graph *named_graph(int n, uint64_t *compares)
{
    spmd_graph *g = spmd_graph_create(NULL);
    assert_non_null(g);
    uint64_t before = ir_name_compares();
    char name[64];
    for (int i = 0; i < n; i++) {
        spmd_tensor *t = spmd_param(g, name_of(i, name, sizeof name), 0, NULL,
                                    (spmd_init){SPMD_INIT_ZEROS, 0});
        if (!t) fail_msg("param %d: %s", i, spmd_last_error());
    }
    *compares = ir_name_compares() - before;
    return g;
}

static void test_find_each_of_many(void **state)
{
    (void)state;
    uint64_t built;
    spmd_graph *g = named_graph(MANY, &built);
    /* A new name is looked up once (to refuse a duplicate): a linear scan
     * would compare some n^2 / 2 = 2e10 names here. */
    print_message("building %d names: %llu comparisons\n", MANY, (unsigned long long)built);
    assert_true(built <= 2ull * MANY);

    uint64_t before = ir_name_compares();
    char name[64];
    for (int i = 0; i < MANY; i++) {
        spmd_tensor *t = spmd_graph_find(g, name_of(i, name, sizeof name));
        assert_non_null(t);
        assert_int_equal(spmd_tensor_rank(t), 0);
        assert_string_equal(spmd_tensor_name(t), name);
        assert_ptr_equal(t, spmd_graph_tensor(g, i));
    }
    uint64_t found = ir_name_compares() - before;
    print_message("finding them: %llu comparisons\n", (unsigned long long)found);
    assert_true(found <= 2ull * MANY);
    assert_null(spmd_graph_find(g, "h.0.mlp.c_proj.weight"));
    assert_null(spmd_graph_find(g, ""));
    assert_null(spmd_graph_find(g, NULL));
    spmd_graph_free(g);
}

/* The work per name does not grow with the graph: a name among 200,000
 * costs at most one comparison more than twice what it costs among 1,000
 * (a scan would cost 200 times as much). */
static void test_work_per_name_is_flat(void **state)
{
    (void)state;
    uint64_t small, large;
    spmd_graph_free(named_graph(MANY / 200, &small));
    spmd_graph_free(named_graph(MANY, &large));
    print_message("%d names: %llu, %d names: %llu comparisons\n", MANY / 200,
                  (unsigned long long)small, MANY, (unsigned long long)large);
    assert_true(large * (MANY / 200) <= (2 * small + MANY / 200) * MANY);
}

static void test_rename_and_duplicates(void **state)
{
    (void)state;
    spmd_graph *g = spmd_graph_create(NULL);
    int64_t d[1] = {4};
    spmd_tensor *a = spmd_input(g, "a", SPMD_F32, 1, d);
    spmd_tensor *b = spmd_input(g, "b", SPMD_F32, 1, d);
    spmd_tensor *sum = spmd_add(g, a, b);
    assert_non_null(sum);
    assert_null(spmd_graph_find(g, "sum"));

    /* A computed tensor named after it was made. */
    assert_int_equal(spmd_tensor_set_name(sum, "sum"), SPMD_OK);
    assert_ptr_equal(spmd_graph_find(g, "sum"), sum);

    /* A rename frees the old name for another tensor. */
    assert_int_equal(spmd_tensor_set_name(a, "x"), SPMD_OK);
    assert_null(spmd_graph_find(g, "a"));
    assert_ptr_equal(spmd_graph_find(g, "x"), a);
    spmd_tensor *a2 = spmd_input(g, "a", SPMD_F32, 1, d);
    assert_non_null(a2);
    assert_ptr_equal(spmd_graph_find(g, "a"), a2);
    assert_ptr_equal(spmd_graph_find(g, "x"), a);

    /* Taken names are refused, by builders and renames alike. */
    assert_null(spmd_input(g, "b", SPMD_F32, 1, d));
    assert_non_null(strstr(spmd_last_error(), "already has a tensor named 'b'"));
    assert_int_equal(spmd_tensor_set_name(sum, "x"), SPMD_ERR_INVALID);
    assert_ptr_equal(spmd_graph_find(g, "x"), a);
    assert_ptr_equal(spmd_graph_find(g, "sum"), sum);
    spmd_graph_free(g);

    /* Many renames back and forth (each leaves a stale slot until the
     * index grows) keep every name where it belongs. */
    g = spmd_graph_create(NULL);
    spmd_tensor *t[64];
    char name[32];
    for (int i = 0; i < 64; i++) {
        snprintf(name, sizeof name, "t%d", i);
        t[i] = spmd_input(g, name, SPMD_F32, 1, d);
    }
    for (int round = 0; round < 50; round++)
        for (int i = 0; i < 64; i++) {
            snprintf(name, sizeof name, "t%d.r%d", i, round);
            assert_int_equal(spmd_tensor_set_name(t[i], name), SPMD_OK);
        }
    for (int i = 0; i < 64; i++) {
        snprintf(name, sizeof name, "t%d.r49", i);
        assert_ptr_equal(spmd_graph_find(g, name), t[i]);
        snprintf(name, sizeof name, "t%d.r48", i);
        assert_null(spmd_graph_find(g, name));
    }
    spmd_graph_free(g);
}

/* The index grows by reallocation: when that fails, the builder fails
 * with SPMD_ERR_NOMEM and every name made before is still found. */
static void test_index_growth_failure(void **state)
{
    (void)state;
    test_alloc ta;
    spmd_allocator alloc = test_alloc_init(&ta, -1);
    spmd_graph *g = spmd_graph_create(&alloc);
    char name[32];
    int made = 0;
    for (; made < 32; made++) { /* fills the first 64 slots half */
        snprintf(name, sizeof name, "p%d", made);
        assert_non_null(spmd_input(g, name, SPMD_F32, 0, NULL));
    }
    spmd_tensor *last = spmd_graph_find(g, "p31");
    test_alloc_set_budget(&ta, 0);
    snprintf(name, sizeof name, "p%d", made);
    assert_null(spmd_input(g, name, SPMD_F32, 0, NULL));
    assert_int_equal(spmd_graph_status(g), SPMD_ERR_NOMEM);
    assert_null(spmd_graph_find(g, name));
    assert_int_equal(spmd_tensor_set_name(last, "renamed"), SPMD_ERR_NOMEM);
    assert_ptr_equal(spmd_graph_find(g, "p31"), last);
    test_alloc_set_budget(&ta, -1);
    for (int i = 0; i < made; i++) {
        snprintf(name, sizeof name, "p%d", i);
        assert_non_null(spmd_graph_find(g, name));
    }
    spmd_graph_free(g);
    assert_int_equal(atomic_load(&ta.allocs), atomic_load(&ta.frees));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_find_each_of_many),
        cmocka_unit_test(test_work_per_name_is_flat),
        cmocka_unit_test(test_rename_and_duplicates),
        cmocka_unit_test(test_index_growth_failure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
