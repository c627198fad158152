/*
 * The multi-device runtime: a device that fails makes every device return
 * the error (nothing hangs) and the program runs again afterwards; many
 * more device workers than cores (64 on a mesh 8x8); a permuted device-id
 * list; the same seed and mesh give the same bits; a traced run
 * (spmd_program_trace_begin) computes the same bits, and its timeline
 * accounts for the measured run on every device; on one device of 2 and
 * 3 threads, whose small steps thread 0 runs alone without barriers
 * between them (solo steps), the bits of 1 thread, and a failing small
 * step fails the run and nothing hangs.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <time.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "spmd/mesh.h"
#include "spmd/models.h"
#include "spmd/spmd.h"

enum { BATCH = 8, SEQ = 8, VOCAB = 32 };

/* The tiny GPT's width and depth (the trace test wants steps of a few ms),
 * the threads its program runs on, whether collectives run as blocking
 * steps (no overlap), and the bytes that may be in flight (0: the default). */
static int gpt_dim = 16, gpt_layers = 1, gpt_threads = 2;
static bool gpt_no_overlap;
static size_t gpt_inflight_bytes;

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
    spmd_gpt_config cfg = {.vocab = VOCAB, .seq = SEQ, .layers = gpt_layers, .heads = 2, .dim = gpt_dim};
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
    r->p = spmd_compile(r->g, &(spmd_compile_options){.threads = gpt_threads, .seed = 7,
                                                      .overlap = !gpt_no_overlap,
                                                      .inflight_bytes = gpt_inflight_bytes});
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

/* Collectives in flight or as blocking steps, and in flight under half
 * the bytes at once: the same bits on every mesh these tests use, and a
 * device that fails still fails every device. */
static void test_overlap_same_bits(void **state)
{
    (void)state;
    signal(SIGALRM, on_alarm);
    alarm(120);
    static const char *const meshes[][4] = {
        {"2x4", "replica,fsdp", "(replica, fsdp), None", "fsdp, None"},
        {"2x2", "replica,fsdp", "(replica, fsdp), None", "fsdp, None"},
        {"4x2", "replica,fsdp", "(replica, fsdp), None", "fsdp, None"},
        {"8x8", "data,model", "data, None", "model, None"},
    };
    for (size_t m = 0; m < sizeof meshes / sizeof *meshes; m++) {
        gpt_run on, off, half;
        gpt_no_overlap = false;
        gpt_setup(&on, meshes[m][0], meshes[m][1], meshes[m][2], meshes[m][3], NULL);
        gpt_no_overlap = true;
        gpt_setup(&off, meshes[m][0], meshes[m][1], meshes[m][2], meshes[m][3], NULL);
        gpt_no_overlap = false;
        size_t most, fewer;
        spmd_program_overlap(on.p, &most, NULL);
        gpt_inflight_bytes = most / 2;
        gpt_setup(&half, meshes[m][0], meshes[m][1], meshes[m][2], meshes[m][3], NULL);
        gpt_inflight_bytes = 0;
        int half_flying = spmd_program_overlap(half.p, &fewer, NULL);
        assert_true(half_flying > 0);
        assert_true(fewer <= most / 2);
        /* The overlapped program has collectives in flight. */
        assert_int_equal(spmd_program_trace_begin(on.p, 1), SPMD_OK);
        for (int s = 0; s < 3; s++) {
            float x = step_loss(&on, s), y = step_loss(&off, s), z = step_loss(&half, s);
            assert_memory_equal(&x, &y, sizeof x);
            assert_memory_equal(&z, &y, sizeof z);
        }
        int flying = 0;
        for (int i = 0; i < spmd_program_trace_count(on.p); i++) {
            spmd_trace_event e;
            assert_int_equal(spmd_program_trace_event(on.p, i, &e), SPMD_OK);
            flying += e.kind == SPMD_TRACE_IN_FLIGHT;
        }
        print_message("mesh %s: %d collectives in flight per step (each device's %zu bytes at "
                      "most at once; %d of %d within %zu)\n", meshes[m][0], flying, most,
                      half_flying, spmd_program_overlap(on.p, NULL, NULL), fewer);
        assert_true(flying > 0);
        gpt_teardown(&on);
        gpt_teardown(&off);
        gpt_teardown(&half);
    }
    /* A bad id on some devices, collectives in flight on all of them. */
    gpt_run r;
    gpt_setup(&r, "4x2", "replica,fsdp", "(replica, fsdp), None", "fsdp, None", NULL);
    for (int k = 0; k < 3; k++) {
        feed(&r, k, BATCH * SEQ - 1 - k);
        assert_int_not_equal(spmd_program_run(r.p), SPMD_OK);
        assert_non_null(strstr(spmd_last_error(), "embedding"));
        assert_true(isfinite(step_loss(&r, k)));
    }
    gpt_teardown(&r);
    alarm(0);
}

/* One device of several threads: its small steps (every one of this GPT's
 * but a few) run on thread 0 alone, with no barrier between them.  The
 * bits are 1 thread's, step after step; a bad token id fails the
 * embedding (a solo step) and the run, the parameters stay, nothing hangs,
 * and the next good batch runs. */
static void test_solo_steps(void **state)
{
    (void)state;
    signal(SIGALRM, on_alarm);
    alarm(60);
    gpt_run one, two, three;
    gpt_threads = 1;
    gpt_setup(&one, NULL, NULL, NULL, NULL, NULL);
    gpt_threads = 2;
    gpt_setup(&two, NULL, NULL, NULL, NULL, NULL);
    gpt_threads = 3;
    gpt_setup(&three, NULL, NULL, NULL, NULL, NULL);
    gpt_threads = 2;
    for (int s = 0; s < 4; s++) {
        float a = step_loss(&one, s), b = step_loss(&two, s), c = step_loss(&three, s);
        assert_memory_equal(&a, &b, sizeof a);
        assert_memory_equal(&a, &c, sizeof a);
    }
    spmd_tensor *wte = spmd_graph_find(two.g, "wte.weight");
    static float before[VOCAB * 16], after[VOCAB * 16];
    for (int k = 0; k < 3; k++) {
        feed(&two, k, k);
        assert_int_equal(spmd_program_read(two.p, wte, before, sizeof before), SPMD_OK);
        assert_int_not_equal(spmd_program_run(two.p), SPMD_OK);
        assert_non_null(strstr(spmd_last_error(), "embedding"));
        assert_int_equal(spmd_program_read(two.p, wte, after, sizeof after), SPMD_OK);
        assert_memory_equal(before, after, sizeof before);
        assert_true(isfinite(step_loss(&two, k)));
    }
    alarm(0);
    gpt_teardown(&one);
    gpt_teardown(&two);
    gpt_teardown(&three);
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


static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec * 1e-3;
}

/* Tracing: the same bits as untraced; per run and device the nodes follow
 * one another and add up to the run's time, as measured here around
 * spmd_program_run, within 10% (in each device's best of 8 runs: on a
 * host that takes time from the machine, any few runs may each lose a
 * wake-up); collectives are named; only the runs asked for are recorded. */
static void test_trace_timeline(void **state)
{
    (void)state;
    enum { RUNS = 8 };
    gpt_run a, b;
    gpt_dim = 128, gpt_layers = 4;
    gpt_setup(&a, "2x2", "replica,fsdp", "(replica, fsdp), None", "fsdp, None", NULL);
    gpt_no_overlap = true; /* traced and in flight, or neither: the same bits */
    gpt_setup(&b, "2x2", "replica,fsdp", "(replica, fsdp), None", "fsdp, None", NULL);
    gpt_no_overlap = false;
    assert_int_equal(spmd_program_trace_count(a.p), 0);
    assert_int_equal(spmd_program_trace_begin(a.p, 0), SPMD_ERR_INVALID);
    float x = step_loss(&a, 0), y = step_loss(&b, 0);
    assert_memory_equal(&x, &y, sizeof x);
    assert_int_equal(spmd_program_trace_begin(a.p, RUNS), SPMD_OK);
    double measured[RUNS + 1];
    for (int s = 1; s <= RUNS + 1; s++) {
        feed(&a, s, -1);
        double t0 = now_us();
        assert_int_equal(spmd_program_run(a.p), SPMD_OK);
        measured[s - 1] = now_us() - t0;
        assert_int_equal(spmd_program_read(a.p, a.t.loss, &x, sizeof x), SPMD_OK);
        y = step_loss(&b, s);
        assert_memory_equal(&x, &y, sizeof x); /* traced or not, the same bits */
    }
    assert_int_equal(spmd_program_trace_end(a.p), SPMD_OK);
    int n = spmd_program_trace_count(a.p), devices = spmd_program_devices(a.p);
    assert_true(n > RUNS * devices * 2);
    double sum[RUNS][8] = {{0}}, end[RUNS][8];
    int runs = 0, collectives = 0, flying = 0;
    double run_start[RUNS] = {0};
    for (int i = 0; i < n; i++) {
        spmd_trace_event e;
        assert_int_equal(spmd_program_trace_event(a.p, i, &e), SPMD_OK);
        assert_true(e.run >= 0 && e.run < RUNS); /* the last run is not recorded */
        if (e.kind == SPMD_TRACE_IN_FLIGHT) {
            /* On the communication thread, inside the run, beside the
             * device's steps; thread 0 may wait longer than it runs. */
            spmd_collective_info c;
            assert_int_equal(spmd_program_collective(a.p, e.collective, &c), SPMD_OK);
            assert_true(e.dur_us >= 0 && e.wait_us >= 0 && e.start_us >= run_start[e.run]);
            assert_true(e.device >= 0 && e.device < devices);
            flying++;
            continue;
        }
        assert_true(e.dur_us >= 0 && e.wait_us >= 0 && e.wait_us <= e.dur_us + 1e-3);
        if (e.kind == SPMD_TRACE_RUN) {
            assert_int_equal(e.device, -1);
            assert_string_equal(e.name, "step");
            run_start[e.run] = e.start_us;
            runs++;
            continue;
        }
        assert_true(e.device >= 0 && e.device < devices);
        /* Each node begins where the one before it on its device ended. */
        if (sum[e.run][e.device] > 0) assert_true(fabs(e.start_us - end[e.run][e.device]) < 1e-3 ||
                                                  e.kind == SPMD_TRACE_UPDATE);
        sum[e.run][e.device] += e.dur_us;
        end[e.run][e.device] = e.start_us + e.dur_us;
        if (e.kind == SPMD_TRACE_COLLECTIVE) {
            spmd_collective_info c;
            assert_int_equal(spmd_program_collective(a.p, e.collective, &c), SPMD_OK);
            assert_true(c.bytes > 0 && c.axes[0] && c.kind);
            collectives++;
        } else if (e.kind == SPMD_TRACE_COMPUTE) {
            assert_non_null(e.op);
            assert_true(e.name[0] && e.shape[0]);
        }
    }
    assert_int_equal(runs, RUNS);
    /* Every collective but a gather read in place, which is no step. */
    int copied = 0;
    for (int i = 0; i < spmd_program_collective_count(a.p); i++) {
        spmd_collective_info c;
        assert_int_equal(spmd_program_collective(a.p, i, &c), SPMD_OK);
        copied += !c.in_place;
    }
    assert_int_equal(collectives, RUNS * devices * copied);
    assert_true(flying > 0 && flying % (RUNS * devices) == 0);
    /* Every run's nodes fit in it; a device's best run is mostly covered
     * by them (in any one run, on a shared machine, a device's thread may
     * wake late, which is no node's time; under a load of several times
     * the cores every run lost 10-25% so; a timeline that drops a
     * device's nodes, or records another's, is far off). */
    for (int d = 0; d < devices; d++) {
        double best = 0;
        for (int r = 0; r < RUNS; r++) {
            double ratio = sum[r][d] / measured[r];
            print_message("run %d device %d: nodes %.0f us of %.0f us measured (%.3f)\n", r, d,
                          sum[r][d], measured[r], ratio);
            assert_true(ratio <= 1.0);
            best = ratio > best ? ratio : best;
        }
        assert_true(best > 0.6);
    }
    gpt_teardown(&a);
    gpt_teardown(&b);
    gpt_dim = 16, gpt_layers = 1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_failing_device_fails_all),
        cmocka_unit_test(test_many_workers_and_permuted_ids),
        cmocka_unit_test(test_same_mesh_same_bits),
        cmocka_unit_test(test_overlap_same_bits),
        cmocka_unit_test(test_solo_steps),
        cmocka_unit_test(test_plan_only),
        cmocka_unit_test(test_trace_timeline),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
