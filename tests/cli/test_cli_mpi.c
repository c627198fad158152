/*
 * `spmd` over several processes, through mpirun: the same run over P
 * processes gives the one-process losses bit for bit (tensor, sequence
 * and context parallelism included), each process holds
 * 1/P of the bytes, a failing or killed process ends the job with its
 * cause, a stopped one through the collective watchdog (a slow one does
 * not; a stopped pipeline stage's neighbour names the stage transfer),
 * and explain marks the axes that cross processes.  A GPT with
 * experts over 2x4 ('data', 'expert') on 2 processes: the one-process
 * bits, one device's losses within 1e-5, the same dropped counts.
 *
 * Every mpirun runs through scripts/mpirun.sh (support_mpi.h): under a
 * timeout, oversubscribed (this machine may have fewer cores than
 * processes) and allowed to run as root.  Without MPI at build time the
 * tests are skipped, saying why.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <cJSON.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support_files.h"
#include "support_json.h"
#include "support_mpi.h"
#include "support_tool.h"

#if defined(SPMD_MPIEXEC) && defined(SPMD_TOOL_PATH)

enum { TIMEOUT_S = 120 };

static char *dir;
static char out[1 << 16];
static char mpirun[2048]; /* scripts/mpirun.sh's command line, TIMEOUT_S (setup) */

/* `spmd ARGS` on `procs` processes (0: without mpirun); its exit status. */
static int run_spmd(int procs, const char *args)
{
    char cmd[8192];
    if (procs)
        snprintf(cmd, sizeof cmd, "%s -n %d '%s' %s", mpirun, procs, SPMD_TOOL_PATH, args);
    else
        snprintf(cmd, sizeof cmd, "%s", args);
    int rc = procs ? support_run_tool("env", cmd, NULL, out, sizeof out) : run_tool(cmd, out, sizeof out);
    if (procs && support_mpi_timed_out(rc))
        fail_msg("timed out after %d s: spmd %s", TIMEOUT_S, args);
    return rc;
}

typedef struct run_figures {
    float loss[16];
    int steps;
    double param_bytes[8], allocated_bytes[8];
    int processes;
    int read_in_place; /* gathers of shared parameters, read where they lie */
} run_figures;

/* The losses and per-process bytes of a report. */
static run_figures figures(const char *path)
{
    run_figures r = {0};
    cJSON *j = support_load_json(path);
    const cJSON *loss = cJSON_GetObjectItemCaseSensitive(j, "loss"), *v;
    cJSON_ArrayForEach(v, loss)
    {
        assert_true(r.steps < 16 && cJSON_IsNumber(v));
        r.loss[r.steps++] = (float)v->valuedouble;
    }
    const cJSON *procs = cJSON_GetObjectItemCaseSensitive(j, "processes");
    cJSON_ArrayForEach(v, procs)
    {
        assert_true(r.processes < 8);
        r.param_bytes[r.processes] = cJSON_GetObjectItemCaseSensitive(v, "param_bytes")->valuedouble;
        r.allocated_bytes[r.processes] =
            cJSON_GetObjectItemCaseSensitive(v, "allocated_bytes")->valuedouble;
        r.processes++;
    }
    const cJSON *colls = cJSON_GetObjectItemCaseSensitive(j, "collectives");
    cJSON_ArrayForEach(v, colls)
    {
        r.read_in_place += (int)cJSON_GetObjectItemCaseSensitive(v, "read_in_place")->valuedouble;
    }
    cJSON_Delete(j);
    return r;
}

/* 10 steps of `model` on `mesh` over `procs` processes against the same
 * run in one process: the same losses, bit for bit, each process 1/P of
 * the one-process parameters, and the one process less memory.  One compute thread per device in both runs,
 * so the kernel scratch is alike too. */
static void same_bits_with(const char *model, const char *mesh, const char *axes, int procs,
                           const char *extra)
{
    int devices = 1;
    for (const char *c = mesh; *c; c++)
        if (*c >= '1' && *c <= '9') devices *= *c - '0';
    char one[SUPPORT_PATH], many[SUPPORT_PATH], args[4096];
    support_path_in(one, dir, "one.json");
    support_path_in(many, dir, "many.json");
    const char *common = "--steps 10 --eval 0 --batch 16 --seq 24 --dim 32 --heads 2 --hidden 32";
    snprintf(args, sizeof args, "train --model %s --mesh %s --axes %s %s %s --threads %d --json %s",
             model, mesh, axes, common, extra, devices, one);
    if (run_spmd(0, args) != 0) fail_msg("one process: %s", out);
    snprintf(args, sizeof args, "train --model %s --mesh %s --axes %s %s %s --threads %d --json %s",
             model, mesh, axes, common, extra, devices / procs, many);
    if (run_spmd(procs, args) != 0) fail_msg("%d processes: %s", procs, out);
    run_figures a = figures(one), b = figures(many);
    assert_int_equal(a.steps, 10);
    assert_int_equal(b.steps, 10);
    for (int s = 0; s < 10; s++)
        if (memcmp(&a.loss[s], &b.loss[s], sizeof(float)))
            fail_msg("%s on %s over %d processes: step %d loss %.9g, one process %.9g", model, mesh,
                     procs, s + 1, (double)b.loss[s], (double)a.loss[s]);
    assert_int_equal(a.processes, 1);
    assert_int_equal(b.processes, procs);
    /* Over processes every device holds its own blocks and every gather
     * copies; in one process the replicas of a parameter hold one buffer
     * (shared parameters), and its gathers are read or written in place:
     * less memory than the processes' together, which agree. */
    assert_int_equal(b.read_in_place, 0);
    for (int q = 0; q < procs; q++) {
        assert_true(b.param_bytes[q] * procs == a.param_bytes[0]);
        assert_true(a.allocated_bytes[0] < b.allocated_bytes[q] * procs);
        assert_true(b.allocated_bytes[q] == b.allocated_bytes[0]);
    }
    /* Process 0 alone prints: one summary. */
    const char *done = strstr(out, "done: loss");
    assert_non_null(done);
    assert_null(strstr(done + 1, "done: loss"));
}

static void same_bits(const char *model, const char *mesh, const char *axes, int procs)
{
    same_bits_with(model, mesh, axes, procs, "");
}

static void test_gpt_data_8(void **state) { (void)state; same_bits("gpt", "8", "data", 4); }
static void test_gpt_4x2_p2(void **state) { (void)state; same_bits("gpt", "4x2", "replica,fsdp", 2); }
static void test_gpt_4x2_p4(void **state) { (void)state; same_bits("gpt", "4x2", "replica,fsdp", 4); }
static void test_gpt_4x2_p8(void **state) { (void)state; same_bits("gpt", "4x2", "replica,fsdp", 8); }
static void test_gpt_2x4(void **state) { (void)state; same_bits("gpt", "2x4", "replica,fsdp", 2); }
static void test_gpt_2x2x2(void **state) { (void)state; same_bits("gpt", "2x2x2", "a,b,fsdp", 4); }
/* Tensor and sequence parallelism (grouped c_attn blocks, the vocabulary
 * split) with FSDP, 'tensor' inside each process. */
static void test_gpt_tp_sp_2x2x2(void **state)
{
    (void)state;
    same_bits_with("gpt", "2x2x2", "data,fsdp,tensor", 4, "--fsdp fsdp --tp tensor --sp on");
}
/* Context parallelism: the sequence over 'cp' across the processes (k
 * and v all-gathered, their gradients reduce-scattered over MPI), and
 * with FSDP over the same axis ('data' inside each process keeps
 * replicas that one process shares). */
static void test_gpt_cp_p2(void **state)
{
    (void)state;
    same_bits_with("gpt", "2x2", "cp,data", 2, "--cp cp");
    same_bits_with("gpt", "2x2", "cp,data", 2, "--cp cp --fsdp cp");
}

/* Pipeline stages over processes: the activations and their gradients
 * cross between processes point to point, the loss is read from the
 * last stage's process; the one-process bits, in GPipe's order on 2
 * processes and 1F1B's on 4.  (Stages hold no shared
 * parameters in one process, so same_bits_with's memory checks do not
 * apply.) */
static void stages_same_bits(const char *mesh, const char *axes, int procs, const char *schedule)
{
    char one[SUPPORT_PATH], many[SUPPORT_PATH], args[4096];
    support_path_in(one, dir, "one.json");
    support_path_in(many, dir, "many.json");
    const char *common = "--steps 10 --eval 0 --batch 4 --seq 24 --dim 32 --heads 2 --layers 4 "
                         "--pp pp --microbatches 4 --threads 1 --pp-schedule";
    snprintf(args, sizeof args, "train --mesh %s --axes %s %s %s --json %s", mesh, axes, common, schedule,
             one);
    if (run_spmd(0, args) != 0) fail_msg("one process: %s", out);
    snprintf(args, sizeof args, "train --mesh %s --axes %s %s %s --json %s", mesh, axes, common, schedule,
             many);
    if (run_spmd(procs, args) != 0) fail_msg("%d processes: %s", procs, out);
    run_figures a = figures(one), b = figures(many);
    assert_int_equal(a.steps, 10);
    assert_int_equal(b.steps, 10);
    for (int s = 0; s < 10; s++)
        if (memcmp(&a.loss[s], &b.loss[s], sizeof(float)))
            fail_msg("stages on %s over %d processes: step %d loss %.9g, one process %.9g", mesh,
                     procs, s + 1, (double)b.loss[s], (double)a.loss[s]);
}

static void test_gpt_stages_p2(void **state)
{
    (void)state;
    stages_same_bits("2x2", "pp,data", 2, "gpipe");
}

static void test_gpt_stages_p4(void **state)
{
    (void)state;
    stages_same_bits("4", "pp", 4, "1f1b");
}

/* Gradient accumulation: the micro-batches and the step's one reduction
 * over processes. */
static void test_gpt_accumulate_4x2_p2(void **state)
{
    (void)state;
    same_bits_with("gpt", "4x2", "replica,fsdp", 2, "--accumulate 3");
}
/* Gradients reduced in bf16 (--reduce-precision): the bf16 collectives
 * over processes give the shared-memory path's bits, with units of two
 * members in each process (4x2, 'replica' across) and of one (2). */
static void test_gpt_bf16_reduce(void **state)
{
    (void)state;
    same_bits_with("gpt", "4x2", "replica,fsdp", 2, "--precision bf16 --reduce-precision bf16");
    same_bits_with("gpt", "2", "data", 2, "--reduce-precision bf16");
}
/* Experts over an expert axis inside each process, 'data' across:
 * the all-to-alls in shared memory, the experts' gradients summed over
 * MPI; the one-process run's bits, one device's losses within 1e-5 and
 * the same dropped counts. */
static void test_gpt_experts_2x4_p2(void **state)
{
    (void)state;
    const char *moe = "--experts 4 --ep expert --capacity-factor 1";
    same_bits_with("gpt", "2x4", "data,expert", 2, moe);
    char single[SUPPORT_PATH], many[SUPPORT_PATH], args[4096];
    support_path_in(single, dir, "single.json");
    support_path_in(many, dir, "many.json");
    snprintf(args, sizeof args,
             "train --mesh 1 --axes data --experts 4 --capacity-factor 1 --steps 10 --eval 0 "
             "--batch 16 --seq 24 --dim 32 --heads 2 --threads 1 --json %s", single);
    if (run_spmd(0, args) != 0) fail_msg("one device: %s", out);
    run_figures a = figures(single), b = figures(many);
    for (int s = 0; s < 10; s++)
        if (fabsf(a.loss[s] - b.loss[s]) > 1e-5f)
            fail_msg("experts on 2x4 over 2 processes: step %d loss %.9g, one device %.9g", s + 1,
                     (double)b.loss[s], (double)a.loss[s]);
    cJSON *ja = support_load_json(single), *jb = support_load_json(many);
    const cJSON *da = cJSON_GetObjectItemCaseSensitive(ja, "dropped_total"),
                *db = cJSON_GetObjectItemCaseSensitive(jb, "dropped_total");
    assert_true(cJSON_IsNumber(da) && cJSON_IsNumber(db));
    assert_true(da->valuedouble > 0);
    assert_true(da->valuedouble == db->valuedouble);
    cJSON_Delete(ja), cJSON_Delete(jb);
}
static void test_mlp_data_8(void **state) { (void)state; same_bits("mlp", "8", "data", 2); }
static void test_mlp_4x2_p2(void **state) { (void)state; same_bits("mlp", "4x2", "replica,fsdp", 2); }
static void test_mlp_4x2_p4(void **state) { (void)state; same_bits("mlp", "4x2", "replica,fsdp", 4); }
static void test_mlp_4x2_p8(void **state) { (void)state; same_bits("mlp", "4x2", "replica,fsdp", 8); }
static void test_mlp_2x4(void **state) { (void)state; same_bits("mlp", "2x4", "replica,fsdp", 4); }
static void test_mlp_2x2x2(void **state) { (void)state; same_bits("mlp", "2x2x2", "a,b,fsdp", 2); }

/* Independent copies over processes: process 0 runs copies 0 and 1, process
 * 1 copies 2 and 3; every copy's losses, validation and accuracy are the
 * one-process run's. */
static void test_copies_over_processes(void **state)
{
    (void)state;
    char one[SUPPORT_PATH], many[SUPPORT_PATH], args[4096];
    support_path_in(one, dir, "copies-one.json");
    support_path_in(many, dir, "copies-many.json");
    const char *flags = "train --mesh 4x2 --axes copy,fsdp --copies copy --lr 1e-3,3e-3,1e-2,3e-2 "
                        "--steps 6 --batch 8 --val-every 3 --val-batches 2 --eval 64";
    snprintf(args, sizeof args, "%s --threads 8 --json %s", flags, one);
    if (run_spmd(0, args) != 0) fail_msg("one process: %s", out);
    snprintf(args, sizeof args, "%s --threads 4 --json %s", flags, many);
    if (run_spmd(2, args) != 0) fail_msg("2 processes: %s", out);
    cJSON *a = support_load_json(one), *b = support_load_json(many);
    char *x = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(a, "copies"));
    char *y = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(b, "copies"));
    assert_non_null(strstr(x, "\"accuracy\""));
    assert_string_equal(x, y);
    free(x), free(y);
    cJSON_Delete(a);
    cJSON_Delete(b);
}

/* Checkpoints over processes: 2 processes save (each its devices' files,
 * process 0 the index); the run resumed from step 6 in one process and
 * over 4 continues with the uninterrupted run's losses, bit for bit. */
static void test_checkpoint_over_processes(void **state)
{
    (void)state;
    char ckpt[SUPPORT_PATH], step6[SUPPORT_PATH], straight[SUPPORT_PATH], saved[SUPPORT_PATH],
        res1[SUPPORT_PATH], res4[SUPPORT_PATH], args[4096];
    support_path_in(ckpt, dir, "ckpt");
    support_path_in(step6, ckpt, "step-00000006");
    support_path_in(straight, dir, "straight.json");
    support_path_in(saved, dir, "saved.json");
    support_path_in(res1, dir, "resumed1.json");
    support_path_in(res4, dir, "resumed4.json");
    const char *flags = "train --steps 10 --eval 0 --batch 16";
    snprintf(args, sizeof args, "%s --json %s", flags, straight);
    if (run_spmd(0, args) != 0) fail_msg("%s", out);
    snprintf(args, sizeof args, "%s --save %s --save-every 6 --json %s", flags, ckpt, saved);
    if (run_spmd(2, args) != 0) fail_msg("saving over 2 processes: %s", out);
    snprintf(args, sizeof args, "%s --resume %s --json %s", flags, step6, res1);
    if (run_spmd(0, args) != 0) fail_msg("resuming in one process: %s", out);
    snprintf(args, sizeof args, "%s --resume %s --json %s", flags, step6, res4);
    if (run_spmd(4, args) != 0) fail_msg("resuming over 4 processes: %s", out);
    run_figures a = figures(straight), m = figures(saved), b = figures(res1), c = figures(res4);
    assert_int_equal(m.steps, 10);
    assert_memory_equal(a.loss, m.loss, 10 * sizeof(float));
    assert_int_equal(b.steps, 4);
    assert_int_equal(c.steps, 4);
    assert_memory_equal(&a.loss[6], b.loss, 4 * sizeof(float));
    assert_memory_equal(&a.loss[6], c.loss, 4 * sizeof(float));
    /* Every device of the 4x2 mesh wrote a file (replicated blocks spread). */
    assert_int_equal(support_count_entries(step6, "dev-"), 8);

    /* Sampling from it over 2 processes writes the one-process text. */
    static char text[2][8192];
    for (int v = 0; v < 2; v++) {
        snprintf(args, sizeof args, "sample --resume %s --samples 2 --tokens 12 --seed 3", ckpt);
        if (run_spmd(v ? 2 : 0, args) != 0) fail_msg("sample: %s", out);
        const char *from = strstr(out, "--- sample 1");
        if (!from) fail_msg("no samples in: %s", out);
        const char *to = strstr(from, "arith:");
        if (!to) fail_msg("no summary in: %s", out);
        size_t len = (size_t)(to - from) < sizeof text[v] - 1 ? (size_t)(to - from) : sizeof text[v] - 1;
        memcpy(text[v], from, len);
        text[v][len] = '\0';
    }
    assert_string_equal(text[0], text[1]);
}

/* explain under mpirun -n 4 on 4x2: 'replica' crosses processes, 'fsdp'
 * stays inside; the network figures are measured; one copy printed. */
static void test_explain_marks_crossing_axes(void **state)
{
    (void)state;
    if (run_spmd(4, "explain --mesh 4x2 --axes replica,fsdp") != 0) fail_msg("%s", out);
    const char *line = strstr(out, "processes: 4 x 2 devices");
    if (!line || !strstr(line, "across processes: replica; inside a process: fsdp"))
        fail_msg("no process layout in:\n%s", out);
    assert_non_null(strstr(out, "(measured)"));
    assert_null(strstr(line + 1, "processes: 4 x 2 devices"));
    /* Figures from flags win; a count other than mpirun's is refused. */
    if (run_spmd(2, "explain --net-latency 40 --net-bandwidth 2.5") != 0) fail_msg("%s", out);
    assert_non_null(strstr(out, "40.0 us per message, 2.50 GB/s (given)"));
    assert_int_not_equal(run_spmd(2, "explain --processes 4"), 0);
    if (!strstr(out, "--processes 4, but mpirun started 2 processes"))
        fail_msg("no refusal of --processes 4 in:\n%s", out);
}

/* A process whose step fails (a token id out of range, fed by process 1
 * only, through spmd-test's hook SPMD_TEST_BAD_TOKEN) ends every process: the job exits non-zero, well inside the
 * timeout, with the failing process's message and no report. */
static void test_failing_process_ends_job(void **state)
{
    (void)state;
    char report[SUPPORT_PATH], args[4096];
    support_path_in(report, dir, "failed.json");
    snprintf(args, sizeof args,
             "-x SPMD_TEST_BAD_TOKEN=1:3 '%s' train --steps 50 --json %s", SPMD_TEST_TOOL_PATH,
             report);
    /* The hook's variable must reach the processes: mpirun -x. */
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "SPMD_TEST_BAD_TOKEN=1:3 %s -n 2 %s", mpirun, args);
    int rc = support_run_tool("env", cmd, NULL, out, sizeof out);
    if (support_mpi_timed_out(rc)) fail_msg("the job hung: %s", out);
    assert_int_not_equal(rc, 0);
    if (!strstr(out, "process 1: step 3 failed") || !strstr(out, "is outside the table"))
        fail_msg("no cause in:\n%s", out);
    assert_null(fopen(report, "r"));
}

/* A process that stops (SIGSTOP, through spmd-test's hook SPMD_TEST_STOP,
 * as a hung host or a dead link leaves it) mid-run: the other process's
 * watchdog (--collective-timeout 5) ends the job well inside the timeout,
 * non-zero, naming the collective, its axes, the process and host waited
 * for and the step, with no report.  Which collective it names depends on
 * where the peer stops (an all-reduce over 'replica', a reduce-scatter
 * over 'fsdp, replica', ...): every one of them crosses 'replica'. */
static void test_stopped_process_ends_job(void **state)
{
    (void)state;
    char report[SUPPORT_PATH], cmd[8192];
    support_path_in(report, dir, "stopped.json");
    snprintf(cmd, sizeof cmd,
             "SPMD_TEST_STOP=1:3 %s -n 2 -x SPMD_TEST_STOP '%s' "
             "train --steps 50 --collective-timeout 5 --json %s",
             mpirun, SPMD_TEST_TOOL_PATH, report);
    int rc = support_run_tool("env", cmd, NULL, out, sizeof out);
    if (support_mpi_timed_out(rc)) fail_msg("the job hung: %s", out);
    assert_int_not_equal(rc, 0);
    const char *why = strstr(out, "collective timeout: ");
    if (!why) fail_msg("no collective timeout in:\n%s", out);
    if (!strstr(out, "process 0: step 3 failed: device ") ||
        !strstr(why, " over ax") || !strstr(why, "replica") || !strstr(why, "waited 5.") ||
        !strstr(why, "without progress for process 1 on "))
        fail_msg("the timeout does not name the collective, the process or the step:\n%s", out);
    assert_null(fopen(report, "r"));
}

/* Pipeline stages, one a process (mesh 2, 'pp'): the process of one
 * stage stops as step 3 begins (SPMD_TEST_STOP), and its neighbour's
 * watchdog (--collective-timeout 5) ends the job well inside the
 * timeout, non-zero, naming the stage transfer it waited in, the
 * process and host it waited for and the step, with no report; whichever
 * stage stops (its neighbour waits to send, or to receive). */
static void test_stopped_stage_ends_job(void **state)
{
    (void)state;
    for (int stopped = 0; stopped < 2; stopped++) {
        char report[SUPPORT_PATH], cmd[8192], failed[64], waited[64];
        support_path_in(report, dir, "stopped-stage.json");
        snprintf(cmd, sizeof cmd,
                 "SPMD_TEST_STOP=%d:3 %s -n 2 -x SPMD_TEST_STOP '%s' "
                 "train --mesh 2 --axes pp --pp pp --layers 2 --microbatches 2 --steps 50 "
                 "--eval 0 --threads 1 --collective-timeout 5 --json %s",
                 stopped, mpirun, SPMD_TEST_TOOL_PATH, report);
        int rc = support_run_tool("env", cmd, NULL, out, sizeof out);
        if (support_mpi_timed_out(rc)) fail_msg("the job hung: %s", out);
        assert_int_not_equal(rc, 0);
        snprintf(failed, sizeof failed, "process %d: step 3 failed: device %d: ", 1 - stopped,
                 1 - stopped);
        snprintf(waited, sizeof waited, "without progress for process %d on ", stopped);
        const char *why = strstr(out, "collective timeout: stage_transfer from stage ");
        if (!why || !strstr(out, failed) || !strstr(why, "waited 5.") || !strstr(why, waited))
            fail_msg("process %d stopped: the timeout does not name the stage transfer, the "
                     "process or the step:\n%s", stopped, out);
        assert_null(fopen(report, "r"));
    }
}

/* A slow process is not a dead one: process 1 sleeps 1 s before each of
 * 6 steps (SPMD_TEST_DELAY), 6 s of waiting in all under a 5 s watchdog,
 * and the run finishes. */
static void test_slow_process_runs(void **state)
{
    (void)state;
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "SPMD_TEST_DELAY=1:1 %s -n 2 -x SPMD_TEST_DELAY '%s' "
             "train --steps 6 --collective-timeout 5",
             mpirun, SPMD_TEST_TOOL_PATH);
    int rc = support_run_tool("env", cmd, NULL, out, sizeof out);
    if (rc != 0) fail_msg("exit %d:\n%s", rc, out);
    assert_null(strstr(out, "collective timeout"));
    assert_non_null(strstr(out, "step    6/6"));
}

/* The network measurement takes several rounds (spmd-test's hook
 * SPMD_TEST_NET_ROUNDS prints each) and prices with the least disturbed:
 * the lowest latency and the highest bandwidth of them. */
static void test_network_rounds(void **state)
{
    (void)state;
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "SPMD_TEST_NET_ROUNDS=1 %s -n 2 -x SPMD_TEST_NET_ROUNDS '%s' explain",
             mpirun, SPMD_TEST_TOOL_PATH);
    int rc = support_run_tool("env", cmd, NULL, out, sizeof out);
    if (rc != 0) fail_msg("exit %d:\n%s", rc, out);
    int rounds = 0;
    double least_us = 0, most_gbps = 0;
    for (const char *at = out; (at = strstr(at, "network round ")); at++) {
        int r = -1;
        double us = 0, gbps = 0;
        if (sscanf(at, "network round %d: %lf us per message, %lf GB/s", &r, &us, &gbps) != 3)
            fail_msg("a round's line does not parse:\n%s", out);
        assert_int_equal(r, rounds);
        if (!rounds || us < least_us) least_us = us;
        if (gbps > most_gbps) most_gbps = gbps;
        rounds++;
    }
    assert_int_equal(rounds, 5);
    /* Rounding is monotonic: the least of the rounded figures is the
     * rounded least. */
    char want[128];
    snprintf(want, sizeof want, ": %.1f us per message, %.2f GB/s (measured)", least_us, most_gbps);
    if (!strstr(out, want)) fail_msg("no '%s' in:\n%s", want, out);
}

/* A process killed with SIGKILL mid-run: mpirun ends the others and says
 * which process died. */
static void test_killed_process_ends_job(void **state)
{
    (void)state;
    char cmd[4096];
    /* Start a long run, wait for its first progress line, kill -9 one of
     * mpirun's children (a process of the run), and wait for the job. */
    /* The job is the timeout (scripts/mpirun.sh execs it), mpirun its child. */
    snprintf(cmd, sizeof cmd,
             "-c 'log=%s/killed.txt; "
             "%s -n 2 \"%s\" train --steps 100000 --log-every 1 >$log 2>&1 & job=$!; "
             "for i in $(seq 600); do grep -q \"step \" $log && break; sleep 0.1; done; "
             "mpirun=$(pgrep -P $job | head -1); victim=$(pgrep -P $mpirun | tail -1); "
             "kill -9 $victim; wait $job; echo \"job exit $?\"; cat $log'",
             dir, mpirun, SPMD_TOOL_PATH);
    int rc = support_run_tool("sh", cmd, NULL, out, sizeof out);
    assert_int_equal(rc, 0);
    const char *exit_line = strstr(out, "job exit ");
    assert_non_null(exit_line);
    int code = atoi(exit_line + strlen("job exit "));
    if (code == 0 || support_mpi_timed_out(code))
        fail_msg("exit %d after a kill -9:\n%s", code, out);
    if (!strstr(out, "signal 9")) fail_msg("mpirun did not name the killed process:\n%s", out);
}

static int setup(void **state)
{
    (void)state;
    dir = support_temp_dir("spmd-mpi");
    support_mpirun(mpirun, sizeof mpirun, TIMEOUT_S);
    return dir ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    support_drop_dir(dir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt_data_8),
        cmocka_unit_test(test_gpt_4x2_p2),
        cmocka_unit_test(test_gpt_4x2_p4),
        cmocka_unit_test(test_gpt_4x2_p8),
        cmocka_unit_test(test_gpt_2x4),
        cmocka_unit_test(test_gpt_2x2x2),
        cmocka_unit_test(test_gpt_tp_sp_2x2x2),
        cmocka_unit_test(test_gpt_cp_p2),
        cmocka_unit_test(test_gpt_accumulate_4x2_p2),
        cmocka_unit_test(test_gpt_stages_p2),
        cmocka_unit_test(test_gpt_stages_p4),
        cmocka_unit_test(test_gpt_bf16_reduce),
        cmocka_unit_test(test_gpt_experts_2x4_p2),
        cmocka_unit_test(test_mlp_data_8),
        cmocka_unit_test(test_mlp_4x2_p2),
        cmocka_unit_test(test_mlp_4x2_p4),
        cmocka_unit_test(test_mlp_4x2_p8),
        cmocka_unit_test(test_mlp_2x4),
        cmocka_unit_test(test_mlp_2x2x2),
        cmocka_unit_test(test_copies_over_processes),
        cmocka_unit_test(test_stopped_process_ends_job),
        cmocka_unit_test(test_stopped_stage_ends_job),
        cmocka_unit_test(test_slow_process_runs),
        cmocka_unit_test(test_network_rounds),
        cmocka_unit_test(test_checkpoint_over_processes),
        cmocka_unit_test(test_explain_marks_crossing_axes),
        cmocka_unit_test(test_failing_process_ends_job),
        cmocka_unit_test(test_killed_process_ends_job),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

#else

static void test_skipped(void **state)
{
    (void)state;
    print_message("built without MPI (or without the tool): the runs over processes are not "
                  "tested\n");
    skip();
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_skipped)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#endif
