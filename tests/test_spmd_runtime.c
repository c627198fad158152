/*
 * The multi-device runtime: a device that fails makes every device return
 * the error (nothing hangs) and the program runs again afterwards; many
 * more device workers than cores (64 on a mesh 8x8); a permuted device-id
 * list; the same seed and mesh give the same bits.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "spmd/mesh.h"
#include "spmd/models.h"
#include "spmd/spmd.h"

enum { BATCH = 8, SEQ = 8, VOCAB = 32 };

typedef struct gpt_run {
    spmd_graph *g;
    spmd_mesh *m;
    spmd_gpt_tensors t;
    spmd_program *p;
} gpt_run;

/* A tiny GPT; with a mesh, the batch is split over every axis and the
 * matrices over the last axis. */
static void gpt_setup(gpt_run *r, const char *shape, const char *axes, const char *batch_spec,
                      const char *weight_spec, const int *ids)
{
    memset(r, 0, sizeof *r);
    r->g = spmd_graph_create(NULL);
    spmd_gpt_config cfg = {.vocab = VOCAB, .seq = SEQ, .layers = 1, .heads = 2, .dim = 16};
    assert_int_equal(spmd_gpt_build(r->g, &cfg, BATCH, &r->t), SPMD_OK);
    if (shape) {
        r->m = ids ? spmd_mesh_create(2, (const int[]){4, 2}, (const char *const[]){"a", "b"}, ids)
                   : spmd_mesh_parse(shape, axes);
        assert_non_null(r->m);
        assert_int_equal(spmd_mark_sharding(r->g, r->t.input, r->m, batch_spec), SPMD_OK);
        assert_int_equal(spmd_mark_sharding(r->g, r->t.targets, r->m, batch_spec), SPMD_OK);
        for (int i = 0; i < spmd_graph_tensor_count(r->g); i++) {
            spmd_tensor *p = spmd_graph_tensor(r->g, i);
            if (spmd_tensor_is_param(p) && spmd_tensor_rank(p) == 2)
                assert_int_equal(spmd_mark_sharding(r->g, p, r->m, weight_spec), SPMD_OK);
        }
    }
    spmd_graph_mark_output(r->g, r->t.loss);
    assert_int_equal(spmd_grad(r->g, r->t.loss), SPMD_OK);
    spmd_tensor *lr = spmd_input(r->g, "lr", SPMD_F32, 0, NULL);
    assert_int_equal(spmd_sgd(r->g, lr), SPMD_OK);
    r->p = spmd_compile(r->g, &(spmd_compile_options){.threads = 2, .seed = 7});
    if (!r->p) fail_msg("compile: %s", spmd_last_error());
    float lrv = 0.05f;
    assert_int_equal(spmd_program_set_input(r->p, lr, &lrv, sizeof lrv), SPMD_OK);
}

static void gpt_teardown(gpt_run *r)
{
    spmd_program_free(r->p);
    spmd_graph_free(r->g);
    spmd_mesh_free(r->m);
}

static void feed(gpt_run *r, int step, int bad_at)
{
    int32_t in[BATCH * SEQ], tg[BATCH * SEQ];
    for (int i = 0; i < BATCH * SEQ; i++) {
        in[i] = (int32_t)((i * 7 + step * 3) % VOCAB);
        tg[i] = (int32_t)((i * 5 + step) % VOCAB);
    }
    if (bad_at >= 0) in[bad_at] = VOCAB + 5;
    assert_int_equal(spmd_program_set_input(r->p, r->t.input, in, sizeof in), SPMD_OK);
    assert_int_equal(spmd_program_set_input(r->p, r->t.targets, tg, sizeof tg), SPMD_OK);
}

static float step_loss(gpt_run *r, int step)
{
    feed(r, step, -1);
    if (spmd_program_run(r->p) != SPMD_OK) fail_msg("run: %s", spmd_last_error());
    float loss;
    assert_int_equal(spmd_program_read(r->p, r->t.loss, &loss, sizeof loss), SPMD_OK);
    return loss;
}

static void on_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "test_spmd_runtime: a run hung\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(1);
}

/* A bad token id on the devices holding the last rows: those devices fail
 * in the embedding, the others are released from their collectives, and
 * the run reports the first-hand error. */
static void test_failing_device_fails_all(void **state)
{
    (void)state;
    signal(SIGALRM, on_alarm);
    alarm(60);
    gpt_run r;
    gpt_setup(&r, "4x2", "replica,fsdp", "(replica, fsdp), None", "fsdp, None", NULL);
    spmd_tensor *wte = spmd_graph_find(r.g, "wte.weight");
    static float before[VOCAB * 16], after[VOCAB * 16];
    for (int k = 0; k < 5; k++) {
        feed(&r, k, BATCH * SEQ - 1 - k);
        assert_int_equal(spmd_program_read(r.p, wte, before, sizeof before), SPMD_OK);
        assert_int_not_equal(spmd_program_run(r.p), SPMD_OK);
        assert_non_null(strstr(spmd_last_error(), "embedding"));
        assert_non_null(strstr(spmd_last_error(), "device"));
        /* A failed step updates no device's parameters. */
        assert_int_equal(spmd_program_read(r.p, wte, after, sizeof after), SPMD_OK);
        assert_memory_equal(before, after, sizeof before);
        /* The program recovers: a good batch runs. */
        float loss = step_loss(&r, k);
        assert_true(isfinite(loss));
    }
    alarm(0);
    gpt_teardown(&r);
}

/* 64 device workers on a machine with a few cores, and a permuted mesh:
 * both follow the one-device losses. */
static void test_many_workers_and_permuted_ids(void **state)
{
    (void)state;
    gpt_run one, many, perm;
    gpt_setup(&one, NULL, NULL, NULL, NULL, NULL);
    gpt_setup(&many, "8x8", "data,model", "data, None", "model, None", NULL);
    const int ids[8] = {5, 2, 7, 0, 3, 6, 1, 4};
    gpt_setup(&perm, "4x2", "a,b", "(a, b), None", "b, None", ids);
    assert_int_equal(spmd_program_devices(many.p), 64);
    for (int s = 0; s < 3; s++) {
        float a = step_loss(&one, s), b = step_loss(&many, s), c = step_loss(&perm, s);
        assert_true(fabsf(a - b) <= 1e-4f * fabsf(a));
        assert_true(fabsf(a - c) <= 1e-4f * fabsf(a));
    }
    gpt_teardown(&one);
    gpt_teardown(&many);
    gpt_teardown(&perm);
}

/* Same seed, same mesh: the same bits, step after step. */
static void test_same_mesh_same_bits(void **state)
{
    (void)state;
    gpt_run a, b;
    gpt_setup(&a, "2x4", "replica,fsdp", "(replica, fsdp), None", "fsdp, None", NULL);
    gpt_setup(&b, "2x4", "replica,fsdp", "(replica, fsdp), None", "fsdp, None", NULL);
    for (int s = 0; s < 4; s++) {
        float x = step_loss(&a, s), y = step_loss(&b, s);
        assert_memory_equal(&x, &y, sizeof x);
    }
    gpt_teardown(&a);
    gpt_teardown(&b);
}

/* A plan-only program reports its plan and refuses to run. */
static void test_plan_only(void **state)
{
    (void)state;
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_mesh *m = spmd_mesh_parse("4x2", "replica,fsdp");
    spmd_gpt_config cfg = {.vocab = VOCAB, .seq = SEQ, .layers = 1, .heads = 2, .dim = 16};
    spmd_gpt_tensors t;
    assert_int_equal(spmd_gpt_build(g, &cfg, BATCH, &t), SPMD_OK);
    assert_int_equal(spmd_mark_sharding(g, t.input, m, "(replica, fsdp), None"), SPMD_OK);
    assert_int_equal(spmd_graph_mark_output(g, t.loss), SPMD_OK);
    assert_int_equal(spmd_grad(g, t.loss), SPMD_OK);
    assert_int_equal(spmd_sgd(g, spmd_input(g, "lr", SPMD_F32, 0, NULL)), SPMD_OK);
    spmd_program *p = spmd_compile(g, &(spmd_compile_options){.plan_only = true});
    assert_non_null(p);
    assert_int_equal(spmd_program_devices(p), 8);
    assert_true(spmd_program_collective_count(p) > 0);
    assert_true(spmd_program_peak_bytes(p) > 0);
    assert_int_equal(spmd_program_run(p), SPMD_ERR_INVALID);
    assert_non_null(strstr(spmd_last_error(), "plan_only"));
    float loss;
    assert_int_not_equal(spmd_program_read(p, t.loss, &loss, sizeof loss), SPMD_OK);
    spmd_program_free(p);
    spmd_graph_free(g);
    spmd_mesh_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_failing_device_fails_all),
        cmocka_unit_test(test_many_workers_and_permuted_ids),
        cmocka_unit_test(test_same_mesh_same_bits),
        cmocka_unit_test(test_plan_only),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
