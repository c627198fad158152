/*
 * How failures are reported (docs/DESIGN.md, "Errors"):
 *
 * - spmd_last_error(): a public call that succeeds (SPMD_OK, or a handle
 *   or tensor) clears it; one that fails leaves its own message, which
 *   the library's own successful calls inside it never clear; calls that
 *   return a count or a name leave it as it is.
 * - A run refuses a program input never set since compile (of any copy
 *   it runs), naming it; an input nothing reads need not be set.
 * - set_input and write refuse each other's tensors.
 * - spmd_compile refuses its options' numbers out of range, naming them.
 * - The partitioner under every allocation failure reports out of memory
 *   (status and message), leaks nothing, and never "failed without
 *   recording why".
 * - Sharding propagation that stops at its round limit still changing
 *   says so (spmd_program_propagation_unsettled); one that settles says
 *   nothing.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "ir/ir.h"
#include "shard/partition.h"
#include "spmd/mesh.h"
#include "spmd/models.h"
#include "spmd/train.h"
#include "support_alloc.h"

#define assert_contains(s, sub)                                                               \
    do {                                                                                      \
        if (!strstr((s), (sub))) fail_msg("\"%s\" does not contain \"%s\"", (s), (sub));      \
    } while (0)

/* ---- spmd_last_error ---------------------------------------------------------------- */

static void test_success_clears_last_error(void **state)
{
    (void)state;
    /* A handle. */
    assert_null(spmd_mesh_parse("2x", "data"));
    assert_true(spmd_last_error()[0] != '\0');
    spmd_mesh *mesh = spmd_mesh_parse("2", "data");
    assert_non_null(mesh);
    assert_string_equal(spmd_last_error(), "");
    assert_int_equal(base_error_status(), SPMD_OK);

    /* A status; and a tensor. */
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_tensor *x = spmd_input(g, "x", SPMD_F32, 2, (const int64_t[]){4, 3});
    assert_int_equal(spmd_mark_sharding(g, x, mesh, "data, nope"), SPMD_ERR_INVALID);
    assert_contains(spmd_last_error(), "nope");
    assert_int_equal(spmd_mark_sharding(g, x, mesh, "data, None"), SPMD_OK);
    assert_string_equal(spmd_last_error(), "");
    assert_null(spmd_param(g, "x", 1, (const int64_t[]){3}, (spmd_init){SPMD_INIT_ZEROS, 0}));
    assert_contains(spmd_last_error(), "'x'");
    spmd_tensor *y = spmd_tanh(g, x);
    assert_non_null(y);
    assert_string_equal(spmd_last_error(), "");

    /* Names and counts leave it as it is: a caller may print the status's
     * name and the message in one call. */
    assert_int_equal(spmd_graph_mark_output(NULL, y), SPMD_ERR_INVALID);
    char before[256];
    snprintf(before, sizeof before, "%s", spmd_last_error());
    assert_true(before[0] != '\0');
    (void)spmd_status_name(SPMD_ERR_INVALID);
    (void)spmd_graph_tensor_count(g);
    (void)spmd_tensor_name(y);
    assert_string_equal(spmd_last_error(), before);

    spmd_graph_free(g);
    spmd_mesh_free(mesh);
}

/* The library's own successful calls inside a failing one do not clear
 * its message: spmd_trainer_create marks the loss an output (which
 * succeeds), then differentiates it, which fails. */
static void test_inner_calls_keep_the_failure(void **state)
{
    (void)state;
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_tensor *w = spmd_param(g, "w", 1, (const int64_t[]){3}, (spmd_init){SPMD_INIT_ONES, 0});
    spmd_tensor *not_scalar = spmd_tanh(g, w);
    assert_non_null(not_scalar);
    spmd_trainer_options opts = {.optimizer = {.kind = SPMD_OPTIMIZER_SGD}};
    assert_null(spmd_trainer_create(g, not_scalar, &opts));
    assert_true(spmd_last_error()[0] != '\0');
    assert_int_not_equal(base_error_status(), SPMD_OK);
    spmd_graph_free(g);

    spmd_graph *g2 = spmd_graph_create(NULL);
    spmd_gpt_config bad = {.vocab = 16, .seq = 8, .layers = 1, .heads = 3, .dim = 16};
    spmd_gpt_tensors t;
    assert_int_not_equal(spmd_gpt_build(g2, &bad, 2, &t), SPMD_OK);
    assert_contains(spmd_last_error(), "heads");
    spmd_graph_free(g2);
}

/* ---- Program inputs ------------------------------------------------------------------ */

enum { IN = 4, OUT = 3, BATCH = 4 };

typedef struct mlp_program {
    spmd_mesh *mesh;
    spmd_graph *g;
    spmd_mlp_tensors t;
    spmd_tensor *unused;
    spmd_program *p;
} mlp_program;

/* An MLP with a cross-entropy loss and an input nothing reads; on `shape`
 * with its batch split over 'data' ('copy', when there, independent). */
static void mlp_compile(mlp_program *m, const char *shape, const char *axes)
{
    memset(m, 0, sizeof *m);
    m->g = spmd_graph_create(NULL);
    spmd_mlp_config cfg = {.in_dim = IN, .hidden = 8, .layers = 1, .out_dim = OUT};
    assert_int_equal(spmd_mlp_build(m->g, &cfg, NULL, BATCH, &m->t), SPMD_OK);
    assert_int_equal(spmd_mlp_add_loss(m->g, SPMD_MLP_CROSS_ENTROPY, &m->t), SPMD_OK);
    m->unused = spmd_input(m->g, "unused", SPMD_F32, 1, (const int64_t[]){2});
    assert_non_null(m->unused);
    assert_int_equal(spmd_graph_mark_output(m->g, m->t.loss), SPMD_OK);
    if (shape) {
        m->mesh = spmd_mesh_parse(shape, axes);
        int copy = spmd_mesh_axis_index(m->mesh, "copy");
        if (copy >= 0)
            assert_int_equal(spmd_mesh_set_axis_independent(m->mesh, copy, true), SPMD_OK);
        assert_int_equal(spmd_mark_sharding(m->g, m->t.input, m->mesh, "data, None"), SPMD_OK);
    }
    m->p = spmd_compile(m->g, &(spmd_compile_options){.threads = 2, .seed = 1});
    assert_non_null(m->p);
}

static void mlp_free(mlp_program *m)
{
    spmd_program_free(m->p);
    spmd_graph_free(m->g);
    spmd_mesh_free(m->mesh);
}

static const float X[BATCH * IN] = {0.5f, -1, 2, 0, 1, 1, -0.5f, 0.25f,
                                    0, 0.5f, 0.5f, -2, 1, -1, 0, 3};
static const int32_t Y[BATCH] = {2, 0, 1, 2};

static void test_unset_input_fails_the_run(void **state)
{
    (void)state;
    mlp_program m;
    mlp_compile(&m, NULL, NULL);
    assert_int_equal(spmd_program_set_input(m.p, m.t.input, X, sizeof X), SPMD_OK);
    assert_int_equal(spmd_program_run(m.p), SPMD_ERR_INVALID);
    assert_contains(spmd_last_error(), "input 'targets' was never set");
    assert_contains(spmd_last_error(), "spmd_program_set_input");
    /* Once set, it stays set: later runs reuse it ('unused' is never read). */
    assert_int_equal(spmd_program_set_input(m.p, m.t.targets, Y, sizeof Y), SPMD_OK);
    assert_int_equal(spmd_program_run(m.p), SPMD_OK);
    assert_string_equal(spmd_last_error(), "");
    assert_int_equal(spmd_program_run(m.p), SPMD_OK);
    mlp_free(&m);

    /* On a mesh, and with copies: each copy's inputs. */
    mlp_compile(&m, "2", "data");
    assert_int_equal(spmd_program_set_input(m.p, m.t.targets, Y, sizeof Y), SPMD_OK);
    assert_int_equal(spmd_program_run(m.p), SPMD_ERR_INVALID);
    assert_contains(spmd_last_error(), "input 'input' was never set");
    mlp_free(&m);

    mlp_compile(&m, "2x2", "copy,data");
    assert_int_equal(spmd_program_set_input_copy(m.p, 0, m.t.input, X, sizeof X), SPMD_OK);
    assert_int_equal(spmd_program_set_input_copy(m.p, 0, m.t.targets, Y, sizeof Y), SPMD_OK);
    assert_int_equal(spmd_program_run(m.p), SPMD_ERR_INVALID);
    assert_contains(spmd_last_error(), "input 'input' of copy 1 was never set");
    assert_int_equal(spmd_program_set_input_copy(m.p, 1, m.t.input, X, sizeof X), SPMD_OK);
    assert_int_equal(spmd_program_run(m.p), SPMD_ERR_INVALID);
    assert_contains(spmd_last_error(), "input 'targets' of copy 1 was never set");
    assert_int_equal(spmd_program_set_input(m.p, m.t.targets, Y, sizeof Y), SPMD_OK); /* every copy */
    assert_int_equal(spmd_program_run(m.p), SPMD_OK);
    mlp_free(&m);
}

/* spmd_compile refuses a negative thread count and a NaN, infinite or
 * too long watchdog in the words of the tool's flags, naming the option
 * and the value (they were taken as the defaults). */
static void test_compile_options_are_checked(void **state)
{
    (void)state;
    mlp_program m;
    mlp_compile(&m, NULL, NULL);
    static const struct {
        spmd_compile_options opts;
        const char *says;
    } cases[] = {
        {{.threads = -1}, "compile: threads wants an integer from 0 (every core) to 2147483647, got -1"},
        {{.collective_timeout_s = NAN},
         "compile: collective_timeout_s wants a number from -1e+07 to 1e+07 (included), got nan"},
        {{.collective_timeout_s = -INFINITY}, "(included), got -inf"},
        {{.collective_timeout_s = SPMD_COLLECTIVE_TIMEOUT_MAX_S * 2}, "(included), got 2e+07"},
        {{.plan_only = true, .threads = -2}, "threads wants an integer from 0 (every core)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_null(spmd_compile(m.g, &cases[i].opts));
        assert_int_equal(spmd_last_status(), SPMD_ERR_INVALID);
        assert_contains(spmd_last_error(), cases[i].says);
    }
    spmd_program *p = spmd_compile(
        m.g, &(spmd_compile_options){.threads = 1, .collective_timeout_s = -SPMD_COLLECTIVE_TIMEOUT_MAX_S});
    assert_non_null(p);
    spmd_program_free(p);
    mlp_free(&m);
}

/* set_input takes inputs only and write params and state only, whatever
 * their messages say. */
static void test_set_input_and_write_refuse_each_other(void **state)
{
    (void)state;
    mlp_program m;
    mlp_compile(&m, NULL, NULL);
    spmd_tensor *w = spmd_graph_find(m.g, "fc.0.bias");
    float bias[8] = {0};
    assert_int_equal(spmd_program_set_input(m.p, w, bias, sizeof bias), SPMD_ERR_INVALID);
    assert_contains(spmd_last_error(), "set_input: 'fc.0.bias' is a param, not an input");
    assert_int_equal(spmd_program_write(m.p, m.t.targets, Y, sizeof Y), SPMD_ERR_INVALID);
    assert_contains(spmd_last_error(), "write: 'targets' is a input, not a param or state");
    assert_int_equal(spmd_program_write(m.p, w, bias, sizeof bias), SPMD_OK);
    mlp_free(&m);
}

/* ---- The partitioner out of memory --------------------------------------------------- */

/* Partition g (on its mesh) with allocation k and every later one failing,
 * for every k until it succeeds: each failure is SPMD_ERR_NOMEM with a
 * message that says so, and nothing is left allocated. */
static void partition_under_every_failure(spmd_graph *g, test_alloc *f, const spmd_allocator *al)
{
    int failures = 0;
    for (long k = 0;; k++) {
        long held = f->allocs - f->frees;
        spmd_clear_error();
        test_alloc_set_budget(f, k);
        partition part;
        spmd_status st = partition_build(&part, g, g->mesh, NULL, al);
        test_alloc_set_budget(f, -1);
        char message[1024];
        snprintf(message, sizeof message, "%s", spmd_last_error());
        spmd_status recorded = base_error_status();
        partition_free(&part);
        assert_int_equal(f->allocs - f->frees, held);
        if (st == SPMD_OK) break;
        failures++;
        if (st != SPMD_ERR_NOMEM || recorded != SPMD_ERR_NOMEM || !strstr(message, "out of memory"))
            fail_msg("allocation %ld failing: status %s (recorded %s), \"%s\"", k,
                     spmd_status_name(st), spmd_status_name(recorded), message);
        assert_null(strstr(message, "without"));
    }
    assert_true(failures > 10);
}

static void test_partition_out_of_memory(void **state)
{
    (void)state;
    test_alloc f;
    spmd_allocator al = test_alloc_init(&f, -1);

    /* A GPT with tensor and sequence parallelism and FSDP, trained by
     * AdamW with ZeRO: grouped splits, a vocabulary-split loss, fixups,
     * fallbacks and re-marked values. */
    spmd_mesh *mesh = spmd_mesh_parse("2x2", "fsdp,tensor");
    spmd_graph *g = spmd_graph_create(&al);
    spmd_gpt_config cfg = {.vocab = 15, .seq = 4, .layers = 1, .heads = 2, .dim = 8};
    spmd_gpt_tensors t;
    assert_int_equal(spmd_gpt_build(g, &cfg, 4, &t), SPMD_OK);
    spmd_gpt_parallel how = {"tensor", "fsdp", NULL, true, NULL};
    assert_int_equal(spmd_gpt_shard_tensor_parallel(g, &cfg, mesh, &how), SPMD_OK);
    spmd_tensor *in[2] = {t.input, t.targets};
    assert_int_equal(spmd_fsdp_wrap(g, mesh, "fsdp", in, 2, NULL), SPMD_OK);
    assert_int_equal(spmd_graph_mark_output(g, t.loss), SPMD_OK);
    assert_int_equal(spmd_grad(g, t.loss), SPMD_OK);
    spmd_optimizer opt = {.kind = SPMD_OPTIMIZER_ADAMW, .clip_norm = 1, .zero = SPMD_ZERO_ON};
    spmd_optimizer_tensors ot;
    assert_int_equal(spmd_optimizer_apply(g, &opt, &ot), SPMD_OK);
    partition_under_every_failure(g, &f, &al);
    spmd_graph_free(g);
    spmd_mesh_free(mesh);

    /* An MLP with an uneven batch over 3 devices (padding masked). */
    mesh = spmd_mesh_parse("3", "data");
    g = spmd_graph_create(&al);
    spmd_mlp_config mc = {.in_dim = IN, .hidden = 8, .layers = 1, .out_dim = OUT};
    spmd_mlp_tensors mt;
    assert_int_equal(spmd_mlp_build(g, &mc, NULL, 5, &mt), SPMD_OK);
    assert_int_equal(spmd_mlp_add_loss(g, SPMD_MLP_CROSS_ENTROPY, &mt), SPMD_OK);
    assert_int_equal(spmd_fsdp_wrap(g, mesh, "data", &mt.input, 1, NULL), SPMD_OK);
    assert_int_equal(spmd_graph_mark_output(g, mt.loss), SPMD_OK);
    assert_int_equal(spmd_grad(g, mt.loss), SPMD_OK);
    assert_int_equal(spmd_optimizer_apply(g, &(spmd_optimizer){.kind = SPMD_OPTIMIZER_SGD}, &ot),
                     SPMD_OK);
    partition_under_every_failure(g, &f, &al);
    spmd_graph_free(g);
    spmd_mesh_free(mesh);
    assert_int_equal(f.allocs, f.frees);
}

/* ---- Propagation's round limit ------------------------------------------------------- */

/* A chain of n adds, a_i = l_{i-1} + l_i over unmarked parameters l_i,
 * with l_0 marked split: each round carries the split one parameter
 * further (l_i's first consumer a_i reads l_{i-1}, settled a round
 * before), so a chain longer than the limit does not settle. */
static int unsettled_after_chain(int n)
{
    spmd_mesh *mesh = spmd_mesh_parse("2", "x");
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_tensor *prev = NULL, *total = NULL;
    for (int i = 0; i <= n; i++) {
        char name[16];
        snprintf(name, sizeof name, "l%d", i);
        spmd_tensor *l = spmd_param(g, name, 1, (const int64_t[]){8},
                                    (spmd_init){SPMD_INIT_ONES, 0});
        if (i == 0) assert_int_equal(spmd_mark_sharding(g, l, mesh, "x"), SPMD_OK);
        if (prev) {
            spmd_tensor *a = spmd_add(g, prev, l);
            total = total ? spmd_add(g, total, a) : a;
        }
        prev = l;
    }
    spmd_tensor *loss = spmd_sum(g, total, 1, false);
    assert_int_equal(spmd_graph_mark_output(g, loss), SPMD_OK);
    spmd_program *p = spmd_compile(g, &(spmd_compile_options){.plan_only = true});
    assert_non_null(p);
    int unsettled = spmd_program_propagation_unsettled(p);
    /* Settled or not, the plan is what the rounds gave: the parameters the
     * split reached are split, the rest replicated. */
    char spec[64];
    int reached = 0;
    for (int i = 1; i <= n; i++) {
        char name[16];
        snprintf(name, sizeof name, "l%d", i);
        spmd_get_sharding(spmd_graph_find(g, name), spec, sizeof spec);
        reached += !strcmp(spec, "x");
    }
    assert_int_equal(reached, unsettled ? unsettled : n);
    spmd_program_free(p);
    spmd_graph_free(g);
    spmd_mesh_free(mesh);
    return unsettled;
}

static void test_propagation_round_limit(void **state)
{
    (void)state;
    assert_int_equal(unsettled_after_chain(3), 0);
    assert_int_equal(unsettled_after_chain(6), 0);
    assert_int_equal(unsettled_after_chain(12), 8);

    /* A model settles, and a program on one device has nothing to say. */
    spmd_mesh *mesh = spmd_mesh_parse("2x2", "fsdp,tensor");
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_gpt_config cfg = {.vocab = 15, .seq = 4, .layers = 3, .heads = 2, .dim = 8};
    spmd_gpt_tensors t;
    assert_int_equal(spmd_gpt_build(g, &cfg, 4, &t), SPMD_OK);
    spmd_program *one = spmd_compile(g, &(spmd_compile_options){.plan_only = true});
    assert_non_null(one);
    assert_int_equal(spmd_program_propagation_unsettled(one), 0);
    spmd_program_free(one);
    spmd_gpt_parallel how = {"tensor", "fsdp", NULL, true, NULL};
    assert_int_equal(spmd_gpt_shard_tensor_parallel(g, &cfg, mesh, &how), SPMD_OK);
    spmd_tensor *in[2] = {t.input, t.targets};
    assert_int_equal(spmd_fsdp_wrap(g, mesh, "fsdp", in, 2, NULL), SPMD_OK);
    assert_int_equal(spmd_graph_mark_output(g, t.loss), SPMD_OK);
    assert_int_equal(spmd_grad(g, t.loss), SPMD_OK);
    spmd_optimizer_tensors ot;
    assert_int_equal(spmd_optimizer_apply(g, &(spmd_optimizer){.kind = SPMD_OPTIMIZER_ADAMW},
                                          &ot),
                     SPMD_OK);
    spmd_program *p = spmd_compile(g, &(spmd_compile_options){.plan_only = true});
    assert_non_null(p);
    assert_int_equal(spmd_program_propagation_unsettled(p), 0);
    spmd_program_free(p);
    spmd_graph_free(g);
    spmd_mesh_free(mesh);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_success_clears_last_error),
        cmocka_unit_test(test_inner_calls_keep_the_failure),
        cmocka_unit_test(test_unset_input_fails_the_run),
        cmocka_unit_test(test_set_input_and_write_refuse_each_other),
        cmocka_unit_test(test_compile_options_are_checked),
        cmocka_unit_test(test_partition_out_of_memory),
        cmocka_unit_test(test_propagation_round_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
