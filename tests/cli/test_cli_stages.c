/*
 * spmd train --pp AXIS --microbatches M (docs/design/stages.md): the GPT
 * on 2 and 4 pipeline stages, on 2 stages x 2 data replicas and on 2
 * stages x 2 fsdp x 2 data, with a tensor axis inside each stage (--tp)
 * and with activation checkpointing, trains as --accumulate M does on one
 * device (the losses within 1e-5 relative over 50 steps; in bf16 within
 * 1e-3 of bf16 with --accumulate), in GPipe's order and in 1F1B's (the
 * same bits: one graph, another order), a rerun gives the same bits, the
 * banner and explain show the stages, explain shows the bubble computed
 * and measured from a trace (on 2 stages x 8 micro-batches within 10
 * points of GPipe's 1/9), the stages' activations dropping with
 * checkpoints and what crosses between stages (the activations and their
 * gradients, the tied head weight and its gradient, the norm's scalars:
 * the bytes each pair of stages exchanges a step), and a split over the
 * stage axis, what is not built or makes no pipeline is refused naming
 * the flags.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "support_files.h"
#include "support_json.h"
#include "support_tool.h"

#include <cJSON.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef SPMD_TOOL_PATH
#error "SPMD_TOOL_PATH must name the spmd binary"
#endif

static char out[1 << 16];
static char dir[64];

static void tool(int want, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tool(int want, const char *fmt, ...)
{
    char args[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    tool_limits limits = {.timeout_s = 300};
    int rc = support_run_tool(SPMD_TOOL_PATH, args, &limits, out, sizeof out);
    if (rc != want) fail_msg("spmd %s: exit %d, not %d; output:\n%s", args, rc, want, out);
}

static void has(const char *part)
{
    if (!strstr(out, part)) fail_msg("\"%s\" not in:\n%s", part, out);
}

enum { STEPS = 50 };
#define SHAPE "--steps 50 --eval 0 --layers 4 --dim 32 --heads 2 --seq 16 --batch 4 --threads 2"

/* The losses of a run's --json report. */
static void losses(const char *flags, const char *name, double *loss)
{
    char path[128];
    snprintf(path, sizeof path, "%s/%s.json", dir, name);
    tool(0, "train " SHAPE " %s --json %s", flags, path);
    static char text[1 << 20];
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("no report %s", path);
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    remove(path);
    text[len] = '\0';
    cJSON *j = cJSON_Parse(text);
    assert_non_null(j);
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(j, "loss");
    assert_int_equal(cJSON_GetArraySize(l), STEPS);
    for (int i = 0; i < STEPS; i++) loss[i] = cJSON_GetArrayItem(l, i)->valuedouble;
    cJSON_Delete(j);
}

/* The staged run with the mesh's `split` flags and `more` against
 * --accumulate M with `more` on one device: the losses within `tol`
 * relative; a rerun gives the same bits; where `other` names flags of
 * another staged run (another schedule), its losses the same bits too
 * (one graph, another order). */
static void same_with_as(const char *mesh, const char *axes, int micro, const char *split,
                         const char *more, double tol, const char *other)
{
    double want[STEPS], got[STEPS], again[STEPS];
    char flags[256];
    snprintf(flags, sizeof flags, "--accumulate %d %s", micro, more);
    losses(flags, "accumulate", want);
    snprintf(flags, sizeof flags, "--mesh %s --axes %s --pp pp --microbatches %d %s %s", mesh,
             axes, micro, split, more);
    losses(flags, "stages", got);
    has("micro-batches over");
    losses(flags, "again", again);
    for (int i = 0; i < STEPS; i++) {
        if (fabs(got[i] - want[i]) > tol * fabs(want[i]))
            fail_msg("%s %s %s step %d: loss %.9g with stages, %.9g with --accumulate %d", mesh,
                     split, more, i + 1, got[i], want[i], micro);
        if (memcmp(&got[i], &again[i], sizeof got[i]))
            fail_msg("%s %s %s step %d: %.17g, then %.17g", mesh, split, more, i + 1, got[i],
                     again[i]);
    }
    if (!other) return;
    snprintf(flags, sizeof flags, "--mesh %s --axes %s --pp pp --microbatches %d %s %s", mesh,
             axes, micro, other, more);
    losses(flags, "other", again);
    for (int i = 0; i < STEPS; i++)
        if (memcmp(&got[i], &again[i], sizeof got[i]))
            fail_msg("%s step %d: %.17g with '%s', %.17g with '%s'", mesh, i + 1, got[i], split,
                     again[i], other);
}

static void same_with(const char *mesh, const char *axes, int micro, const char *split,
                      const char *more, double tol)
{
    same_with_as(mesh, axes, micro, split, more, tol, NULL);
}

static void same_as_accumulation(const char *mesh, const char *axes, int micro)
{
    same_with(mesh, axes, micro, "", "", 1e-5);
}

static void test_two_stages(void **state)
{
    (void)state;
    same_with_as("2", "pp", 4, "--pp-schedule gpipe", "", 1e-5, "--pp-schedule 1f1b");
}

static void test_four_stages(void **state)
{
    (void)state;
    same_with("4", "pp", 8, "--pp-schedule 1f1b", "", 1e-5);
}

/* 2 stages x 2 fsdp x 2 data: each stage's parameters over 'fsdp' (the
 * axis of that name, by default), its samples over both. */
static void test_stages_fsdp_data(void **state)
{
    (void)state;
    same_as_accumulation("2x2x2", "pp,fsdp,data", 4);
}

/* Each stage's micro-batches split over a data axis. */
static void test_two_stages_two_replicas(void **state)
{
    (void)state;
    same_as_accumulation("2x2", "pp,data", 2);
}

/* A tensor axis inside each stage: Megatron's splits of each block and
 * of the tied head, on 2 stages x 2 tensor and x 2 data, and with
 * sequence parallelism. */
static void test_stages_and_tensor_parallelism(void **state)
{
    (void)state;
    same_with("2x2", "pp,tensor", 4, "--tp tensor", "", 1e-5);
    same_with("2x2x2", "pp,tensor,data", 4, "--tp tensor", "", 1e-5);
    same_with("2x2", "pp,tensor", 4, "--tp tensor --sp on", "", 1e-5);
}

/* Bytes of explain's text "N.N KiB" (B, KiB, MiB, GiB) at `at`. */
static double bytes_at(const char *at)
{
    char unit[8] = "";
    double v = 0;
    if (sscanf(at, "%lf %7s", &v, unit) != 2) fail_msg("no size at \"%.40s\"", at);
    return v * (!strcmp(unit, "KiB") ? 1024.0 : !strcmp(unit, "MiB") ? 1048576.0
                : !strcmp(unit, "GiB") ? 1073741824.0 : 1.0);
}

/* Explain's "(X of activations at most)" of stage s, in bytes. */
static double stage_activations(int s)
{
    char head[32];
    snprintf(head, sizeof head, "stage %d: ", s);
    const char *line = strstr(out, head), *end = line ? strstr(line, " of activations at most") : NULL;
    if (!end) fail_msg("no activations of stage %d in:\n%s", s, out);
    const char *at = end;
    while (at > line && at[-1] != '(') at--;
    return bytes_at(at);
}

/* Activation checkpointing per stage: the same losses; explain shows
 * each stage's activations at most drop. */
static void test_stages_with_activation_checkpointing(void **state)
{
    (void)state;
    same_with("2", "pp", 4, "", "--checkpoint on", 1e-5);
    same_with("2x2", "pp,tensor", 4, "--tp tensor", "--checkpoint on", 1e-5);
    const char *flags = "--mesh 2 --axes pp --pp pp --microbatches 4 --layers 4 --dim 32 --heads 2 "
                        "--seq 16 --batch 4";
    double before[2], after[2];
    tool(0, "explain %s", flags);
    for (int s = 0; s < 2; s++) before[s] = stage_activations(s);
    tool(0, "explain %s --checkpoint on", flags);
    for (int s = 0; s < 2; s++) {
        after[s] = stage_activations(s);
        if (!(after[s] < before[s]))
            fail_msg("stage %d: %.0f bytes of activations at most with --checkpoint on, %.0f "
                     "without", s, after[s], before[s]);
    }
}

/* bf16 on stages against bf16 with --accumulate on one device: within
 * bf16's rounding of f32's reorderings (two data replicas differ from one
 * device by about 1e-4 relative here too); the watchdog's flag taken. */
static void test_stages_in_bf16(void **state)
{
    (void)state;
    same_with("2", "pp", 4, "", "--precision bf16", 1e-3);
    same_with("2x2", "pp,data", 4, "", "--precision bf16 --reduce-precision bf16", 1e-3);
    tool(0, "train --steps 2 --eval 0 --layers 4 --dim 32 --heads 2 --seq 16 --batch 4 --mesh 2 "
            "--axes pp --pp pp --collective-timeout 60");
}

static void test_explain_shows_the_stages(void **state)
{
    (void)state;
    tool(0, "explain --mesh 2 --axes pp --pp pp --layers 5 --batch 4");
    has("batch 4 x 2 micro-batches over 2 stages");
    has("stages: 2 along 'pp'");
    has("stage 0: blocks 0-2 + wte.weight, wpe.weight");
    has("stage 1: blocks 3-4 + ln_f.weight, ln_f.bias");
    has("of activations at most");
    has("schedule: GPipe, 2 micro-batches over 2 stages");
    tool(0, "explain --mesh 2 --axes pp --pp pp --layers 5 --batch 4 --microbatches 8 --pp-schedule 1f1b");
    has("schedule: 1F1B, 8 micro-batches over 2 stages");
    has("bubble (S-1)/(M+S-1) = 1/9");
}

/* The bytes explain says each device of stage `from` sends its partner
 * on stage `to` a step; 0 where it names no such pair. */
static double sent(int from, int to)
{
    char line[96];
    snprintf(line, sizeof line, "  stage %d to stage %d: ", from, to);
    const char *at = strstr(out, line);
    return at ? atof(at + strlen(line)) : 0;
}

/* What crosses between stages (docs/design/stages.md, "What crosses"):
 * explain's table of stage transfers, per step and device, is the
 * activations (M micro-batches of [b / data, T, dim] f32) forward to the
 * next stage and their gradients back, the tied head weight [V, dim]
 * from the first stage to the last and its gradient back, each stage's
 * sum of gradient squares (one f32) to the last and the clipping scale
 * (one f32) from it; no collective spans the stage axis, and no other
 * pair of stages exchanges anything. */
static void check_crossing(int stages, int data, int micro)
{
    enum { T = 16, DIM = 32, BATCH = 4 };
    char mesh[32], axes[32];
    snprintf(mesh, sizeof mesh, data > 1 ? "%dx%d" : "%d", stages, data);
    snprintf(axes, sizeof axes, data > 1 ? "pp,data" : "pp");
    tool(0, "explain --mesh %s --axes %s --pp pp --microbatches %d --layers 4 --dim %d --heads 2 "
            "--seq %d --batch %d", mesh, axes, micro, DIM, T, BATCH);
    has("stage transfers per step (what each device sends its partner on the other stage; "
        "nothing else crosses: no collective spans it)");
    const char *wte = strstr(out, "\n  wte.weight ");
    long vocab = 0;
    if (!wte || sscanf(wte, "\n  wte.weight [%ld, ", &vocab) != 1) fail_msg("no wte.weight in:\n%s", out);
    double activations = (double)micro * (BATCH / data) * T * DIM * 4, head = (double)vocab * DIM * 4;
    for (int s = 0; s < stages; s++)
        for (int r = 0; r < stages; r++) {
            double want = 0;
            if (r == s + 1 || r == s - 1) want += activations;
            if (s == 0 && r == stages - 1) want += head;
            if (s == stages - 1 && r == 0) want += head;
            if (s != r && (r == stages - 1 || s == stages - 1)) want += 4;
            if (sent(s, r) != want)
                fail_msg("%s: stage %d to stage %d: %.0f bytes, not %.0f:\n%s", mesh, s, r, sent(s, r),
                         want, out);
        }
}

static void test_only_activations_cross(void **state)
{
    (void)state;
    check_crossing(2, 1, 4);
    check_crossing(2, 2, 4);
    check_crossing(4, 1, 4);
}

/* How often `part` occurs in `text`. */
static int count_of(const char *text, const char *part)
{
    int n = 0;
    for (const char *p = strstr(text, part); p; p = strstr(p + 1, part)) n++;
    return n;
}

/* The bubble: explain shows GPipe's computed (S-1)/(M+S-1) and, from a
 * trace of --threads 1 on 2 stages x 8 micro-batches, each device's
 * measured idle fraction, finite and in [0, 1] (how near the computed
 * one it comes depends on the machine's load: docs/design/stages.md).
 * The trace holds only each device's own stage's nodes; every one of
 * the 8 micro-batches computes on both devices, its compute boxes named
 * "<op> mb<m>" with the argument micro_batch; the picture names the
 * micro-batch of each box and greys the stage transfers. */
static void test_bubble_computed_and_measured(void **state)
{
    (void)state;
    const char *flags = "--mesh 2 --axes pp --pp pp --microbatches 8 --layers 4 --dim 32 --heads 2 "
                        "--seq 16 --batch 4 --threads 1";
    char trace[128], report[128], svg[128];
    snprintf(trace, sizeof trace, "%s/trace.json", dir);
    snprintf(report, sizeof report, "%s/explain.json", dir);
    snprintf(svg, sizeof svg, "%s/trace.svg", dir);
    tool(0, "explain %s", flags);
    has("schedule: GPipe, 8 micro-batches over 2 stages");
    has("bubble (S-1)/(M+S-1) = 1/9 = 11.1% of a step idle on each device");
    tool(0, "train --steps 3 --eval 0 %s --trace %s --trace-plot %s", flags, trace, svg);
    cJSON *t = support_load_json(trace);
    const cJSON *e;
    int boxes = 0;
    bool computes[2][8] = {{false}};
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(t, "traceEvents"))
    {
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");
        const cJSON *op = cJSON_GetObjectItemCaseSensitive(args, "op");
        const cJSON *tid = cJSON_GetObjectItemCaseSensitive(e, "tid");
        if (!cJSON_IsString(op) || !cJSON_IsNumber(tid)) continue;
        boxes++;
        /* The embedding is the first stage's (device 0), the loss the last's. */
        if (!strcmp(op->valuestring, "embedding")) assert_int_equal(tid->valueint, 0);
        if (!strcmp(op->valuestring, "cross_entropy")) assert_int_equal(tid->valueint, 1);
        const cJSON *micro = cJSON_GetObjectItemCaseSensitive(args, "micro_batch");
        if (!micro) continue;
        int m = micro->valueint;
        assert_true(m >= 0 && m < 8 && tid->valueint >= 0 && tid->valueint < 2);
        char name[96];
        snprintf(name, sizeof name, "%s mb%d", op->valuestring, m);
        assert_string_equal(cJSON_GetObjectItemCaseSensitive(e, "name")->valuestring, name);
        if (strcmp(op->valuestring, "stage_transfer")) computes[tid->valueint][m] = true;
    }
    assert_true(boxes > 0);
    for (int d = 0; d < 2; d++)
        for (int m = 0; m < 8; m++)
            if (!computes[d][m]) fail_msg("no compute of micro-batch %d on device %d", m, d);
    cJSON_Delete(t);
    size_t len;
    char *picture = support_read_file(svg, &len);
    assert_non_null(picture);
    /* Hovering names the micro-batch (the numbers over the boxes need
     * room, which a loaded machine's long waits can take from them). */
    assert_true(count_of(picture, "class=\"transfer\"") > 0);
    assert_true(count_of(picture, " micro-batch 7</title>") > 0);
    free(picture);
    remove(svg);
    tool(0, "explain %s --trace %s --json %s", flags, trace, report);
    has("measured idle (steps 1 to 3");
    cJSON *j = support_load_json(report);
    remove(trace);
    remove(report);
    const cJSON *pipe = cJSON_GetObjectItemCaseSensitive(j, "pipeline");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(pipe, "schedule")->valuestring, "gpipe");
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(pipe, "stages")->valueint, 2);
    assert_int_equal(cJSON_GetObjectItemCaseSensitive(pipe, "microbatches")->valueint, 8);
    assert_true(fabs(cJSON_GetObjectItemCaseSensitive(pipe, "bubble")->valuedouble - 1.0 / 9) < 1e-12);
    const cJSON *idle = cJSON_GetObjectItemCaseSensitive(pipe, "measured_idle");
    assert_int_equal(cJSON_GetArraySize(idle), 2);
    cJSON_ArrayForEach(e, idle)
    {
        assert_true(cJSON_IsNumber(e));
        assert_true(isfinite(e->valuedouble) && e->valuedouble >= 0 && e->valuedouble <= 1);
    }
    double mean = cJSON_GetObjectItemCaseSensitive(pipe, "measured_idle_mean")->valuedouble;
    assert_true(isfinite(mean) && mean >= 0 && mean <= 1);
    cJSON_Delete(j);
}

/* The goal: on 2 stages x 8 micro-batches (M = 4S) the measured idle
 * fraction of a step within 10 points of (S-1)/(M+S-1) = 1/9, in
 * GPipe's order and in 1F1B's.  A shape whose micro-batch is long against a transfer's wake-up
 * (dim 256: a stage's micro-batch takes milliseconds), one thread per
 * device, and the least idle of 4 traced steps: the bubble is in every
 * step, while other work on a shared machine only adds idle time, to
 * some steps more than others (docs/design/stages.md, "The bubble"). */
static void bubble_within_ten_points(const char *schedule)
{
    char flags[256], trace[128], report[128];
    snprintf(flags, sizeof flags, "--mesh 2 --axes pp --pp pp --microbatches 8 --layers 4 --dim 256 "
             "--heads 2 --seq 64 --batch 8 --threads 1 --pp-schedule %s", schedule);
    snprintf(trace, sizeof trace, "%s/bubble.json", dir);
    snprintf(report, sizeof report, "%s/bubble-explain.json", dir);
    tool(0, "train --steps 5 --eval 0 %s --trace %s --trace-steps 4", flags, trace); /* steps 2 to 5 */
    tool(0, "explain %s --trace %s --json %s", flags, trace, report);
    has("measured idle per step (mean of the devices): step 2 ");
    cJSON *j = support_load_json(report);
    remove(trace);
    remove(report);
    const cJSON *pipe = cJSON_GetObjectItemCaseSensitive(j, "pipeline");
    const cJSON *steps = cJSON_GetObjectItemCaseSensitive(pipe, "measured_idle_steps"), *e;
    assert_int_equal(cJSON_GetArraySize(steps), 4);
    double least = 1;
    cJSON_ArrayForEach(e, steps)
    {
        double idle = cJSON_GetObjectItemCaseSensitive(e, "idle")->valuedouble;
        assert_true(isfinite(idle) && idle >= 0 && idle <= 1);
        least = fmin(least, idle);
    }
    double best = cJSON_GetObjectItemCaseSensitive(pipe, "measured_idle_least")->valuedouble;
    assert_true(best == least);
    print_message("%s: measured idle: least step %.1f%%, over the steps %.1f%%; the bubble 11.1%%\n",
                  schedule, 100 * best,
                  100 * cJSON_GetObjectItemCaseSensitive(pipe, "measured_idle_mean")->valuedouble);
    if (fabs(best - 1.0 / 9) > 0.10)
        fail_msg("%s: the least idle step measured %.1f%%, more than 10 points from the bubble's 11.1%%",
                 schedule, 100 * best);
    cJSON_Delete(j);
}

static void test_bubble_within_ten_points(void **state)
{
    (void)state;
    bubble_within_ten_points("gpipe");
    bubble_within_ten_points("1f1b");
}

/* docs/design/stages.md shows a pipelined step (scripts/readme-figures.py's
 * stages-trace): two lanes, the micro-batches' runs numbered (each of the
 * 8 forward and backward on both lanes, wide enough at that shape), the
 * stage transfers grey. */
static void test_docs_picture(void **state)
{
    (void)state;
    char path[SUPPORT_PATH];
    size_t len;
    char *page = support_read_file(support_path_in(path, SPMD_SOURCE_DIR, "docs/design/stages.md"), &len);
    assert_non_null(page);
    assert_non_null(strstr(page, "](stages-trace.svg)"));
    free(page);
    char *picture = support_read_file(support_path_in(path, SPMD_SOURCE_DIR, "docs/design/stages-trace.svg"), &len);
    assert_non_null(picture);
    assert_int_equal(count_of(picture, "<g class=\"lane\""), 2);
    assert_true(count_of(picture, "class=\"transfer\"") > 0);
    for (int m = 0; m < 8; m++) {
        char label[48];
        snprintf(label, sizeof label, "fill=\"white\">%d</text>", m);
        assert_int_equal(count_of(picture, label), 4);
    }
    free(picture);
}

static void test_refusals(void **state)
{
    (void)state;
    tool(2, "train --steps 1 --microbatches 4");
    has("--microbatches 4: micro-batches are --pp's");
    tool(2, "train --steps 1 --pp-schedule 1f1b");
    has("--pp-schedule 1f1b: a schedule of stages; give --pp AXIS");
    tool(2, "train --steps 1 --mesh 4 --axes pp --pp pp --layers 4 --microbatches 2");
    has("--microbatches 2 for 4 stages");
    tool(2, "train --steps 1 --mesh 4 --axes pp --pp pp --layers 2");
    has("4 stages for --layers 2");
    tool(2, "train --steps 1 --mesh 2 --axes data --pp pp");
    has("--pp pp");
    /* A split over the stage axis, naming both flags. */
    tool(2, "train --steps 1 --mesh 2x2 --axes pp,tensor --pp pp --tp pp");
    has("--tp pp with --pp pp: axis 'pp' is the stage axis");
    tool(2, "train --steps 1 --mesh 2x2 --axes pp,tensor --pp pp --tp pp --sp on");
    has("--tp pp (and --sp on) with --pp pp");
    tool(2, "train --steps 1 --mesh 2x2 --axes pp,fsdp --pp pp --fsdp pp");
    has("--fsdp pp with --pp pp");
    tool(2, "train --steps 1 --mesh 2x2 --axes pp,cp --pp pp --cp pp");
    has("--cp pp with --pp pp");
    tool(2, "train --steps 1 --mesh 2x2 --axes pp,tensor --pp pp --sp on");
    has("--sp on: sequence parallelism splits over the tensor axis");
    tool(2, "train --steps 1 --mesh 2x2 --axes pp,cp --pp pp --cp cp");
    has("--pp pp with --cp is not built yet");
    tool(2, "train --steps 1 --mesh 2 --axes pp --pp pp --accumulate 2");
    has("--accumulate");
    tool(2, "train --steps 1 --mesh 2 --axes pp --pp pp --shard 'input=None,pp,None'");
    has("--shard 'input=None,pp,None' with --pp pp");
    has("stage axis");
}

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "test_cli_stages_XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    rmdir(dir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_stages),
        cmocka_unit_test(test_four_stages),
        cmocka_unit_test(test_two_stages_two_replicas),
        cmocka_unit_test(test_stages_fsdp_data),
        cmocka_unit_test(test_stages_and_tensor_parallelism),
        cmocka_unit_test(test_stages_with_activation_checkpointing),
        cmocka_unit_test(test_stages_in_bf16),
        cmocka_unit_test(test_explain_shows_the_stages),
        cmocka_unit_test(test_only_activations_cross),
        cmocka_unit_test(test_bubble_computed_and_measured),
        cmocka_unit_test(test_bubble_within_ten_points),
        cmocka_unit_test(test_docs_picture),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
