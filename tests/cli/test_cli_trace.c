/*
 * `spmd train --trace FILE.json --trace-plot FILE.svg`:
 *   - the file parses (cJSON) as trace events: an object with traceEvents,
 *     complete events ("ph":"X") with name, cat, ts, dur, pid and tid,
 *     metadata events ("ph":"M") naming the process and each device's
 *     thread: a track per device of the default mesh (2x2x2);
 *   - the steps asked for, and only those (the default: 3 after the first;
 *     --trace-steps A-B; a count of all the steps: all of them; a resumed
 *     run: the steps of A-B it runs, saying which it did not), each a
 *     "step N" event on every track, inside
 *     which the device's nodes (compute, collectives, the update) add up
 *     to the step within 10% with the wake box before them (the device's
 *     thread being scheduled; the step is timed around the run by the
 *     caller's thread; test_spmd_runtime checks the same against a clock
 *     read around spmd_program_run);
 *   - every collective carries its kind, axes, bytes and the value it moves;
 *     those in flight (--overlap on) sit on a track per device's
 *     communication thread ("device N comm"), none with --overlap off;
 *   - the SVG has a lane per device and renders with rsvg-convert (skipped
 *     with a note without it); with --overlap on, under every device a
 *     thinner lane for its communication thread whose boxes name their
 *     collective's kind, axes and bytes, and none with overlap off;
 *   - docs/train.md shows docs/trace.svg, the default run's picture (overlap off:
 *     no communication lanes), which has a lane per device and renders too;
 *   - under mpirun (2 processes; skipped without MPI) the tracks are
 *     (process, device) pairs, every device once, each process's own;
 *   - refusals: --trace-steps that is not A-B or a count, or past the last
 *     step, or without --trace (exit 2, nothing run);
 *   - `spmd explain --trace FILE.json` with the traced run's flags prints
 *     a measured column next to the estimate for every collective, each a
 *     number that parses, their sum, and --json's "measured" list; a trace
 *     of another mesh, model or plan (--zero off) is refused naming the
 *     flags and figures that differ,
 *     and so is --json on the trace itself, and a trace with impossible
 *     fields (a negative duration, steps that do not run forward).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cJSON.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support_files.h"
#include "support_mpi.h"
#include "support_tool.h"

#ifndef SPMD_TOOL_PATH
#error "SPMD_TOOL_PATH must name the spmd binary"
#endif

enum { OUT = 1 << 16, DEVICES = 8, MOST_STEPS = 16 };

static char *dir;
static char out[OUT];

static int setup(void **state)
{
    (void)state;
    dir = support_temp_dir("test_cli_trace");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    support_drop_dir(dir);
    return 0;
}

static cJSON *load(const char *path)
{
    size_t len;
    char *text = support_read_file(path, &len);
    assert_non_null(text);
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root) fail_msg("%s does not parse as JSON", path);
    return root;
}

static double number(const cJSON *e, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(e, key);
    if (!cJSON_IsNumber(v)) fail_msg("an event without a number \"%s\"", key);
    return v->valuedouble;
}

static const char *text(const cJSON *e, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(e, key);
    if (!cJSON_IsString(v)) fail_msg("an event without a string \"%s\"", key);
    return v->valuestring;
}

typedef struct track {
    int pid, tid;
} track;

/* A device's communication thread's track: tid COMM_TID + device. */
enum { COMM_TID = 1 << 20 };

typedef struct checked {
    int tracks, steps;
    int step[MOST_STEPS];
    track track[2 * DEVICES];
    int comm_tracks, flying; /* communication tracks; collectives in flight on them */
} checked;

static int track_of(const checked *c, int pid, int tid)
{
    for (int i = 0; i < c->tracks; i++)
        if (c->track[i].pid == pid && c->track[i].tid == tid) return i;
    return -1;
}

/* Every property the header lists of the trace at `path`. */
static checked check_trace(const char *path)
{
    checked c = {0};
    cJSON *root = load(path);
    const cJSON *events = cJSON_GetObjectItemCaseSensitive(root, "traceEvents");
    assert_true(cJSON_IsArray(events));
    const cJSON *e;
    /* The tracks, named by metadata. */
    cJSON_ArrayForEach(e, events) {
        const char *ph = text(e, "ph");
        assert_true(!strcmp(ph, "X") || !strcmp(ph, "M"));
        if (strcmp(ph, "M") || strcmp(text(e, "name"), "thread_name")) continue;
        int pid = (int)number(e, "pid"), tid = (int)number(e, "tid");
        char want[32];
        if (tid >= COMM_TID) {
            snprintf(want, sizeof want, "device %d comm", tid - COMM_TID);
            assert_string_equal(text(cJSON_GetObjectItemCaseSensitive(e, "args"), "name"), want);
            c.comm_tracks++;
            continue;
        }
        assert_true(track_of(&c, pid, tid) < 0 && c.tracks < 2 * DEVICES);
        snprintf(want, sizeof want, "device %d", tid);
        assert_string_equal(text(cJSON_GetObjectItemCaseSensitive(e, "args"), "name"), want);
        c.track[c.tracks++] = (track){pid, tid};
    }
    /* The steps: on every track, the nodes inside each step add up to it. */
    cJSON_ArrayForEach(e, events) {
        if (strcmp(text(e, "ph"), "X") || strcmp(text(e, "cat"), "step")) continue;
        int pid = (int)number(e, "pid"), tid = (int)number(e, "tid");
        double ts = number(e, "ts"), dur = number(e, "dur"), sum = 0;
        assert_true(track_of(&c, pid, tid) >= 0);
        int step = (int)number(cJSON_GetObjectItemCaseSensitive(e, "args"), "step");
        bool seen = false;
        for (int i = 0; i < c.steps; i++) seen |= c.step[i] == step;
        if (!seen && c.steps < MOST_STEPS) c.step[c.steps++] = step;
        const cJSON *n;
        int nodes = 0;
        cJSON_ArrayForEach(n, events) {
            if (strcmp(text(n, "ph"), "X") || (int)number(n, "pid") != pid ||
                (int)number(n, "tid") != tid)
                continue;
            const char *cat = text(n, "cat");
            if (strcmp(cat, "compute") && strcmp(cat, "collective") && strcmp(cat, "update") &&
                strcmp(cat, "wake"))
                continue;
            double nts = number(n, "ts"), ndur = number(n, "dur");
            assert_true(ndur >= 0);
            if (nts < ts || nts >= ts + dur) continue;
            assert_true(nts + ndur <= ts + dur + 1); /* inside the step (1 us of rounding) */
            sum += ndur;
            nodes++;
        }
        assert_true(nodes > 10);
        if (sum < 0.9 * dur || sum > dur + 1)
            fail_msg("step %d on track %d/%d: its nodes add up to %.0f us of %.0f us", step, pid,
                     tid, sum, dur);
    }
    /* Collectives say what they move. */
    int collectives = 0;
    cJSON_ArrayForEach(e, events) {
        if (strcmp(text(e, "ph"), "X") || strcmp(text(e, "cat"), "collective")) continue;
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");
        const char *kind = text(args, "kind");
        assert_true(!strcmp(kind, "all-gather") || !strcmp(kind, "reduce-scatter") ||
                    !strcmp(kind, "all-reduce") || !strcmp(kind, "all-to-all"));
        assert_string_equal(text(e, "name"), kind);
        assert_true(text(args, "axes")[0] && text(args, "value")[0]);
        assert_true(number(args, "bytes") > 0);
        collectives++;
        /* In flight: on its device's communication track. */
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(args, "in_flight"))) {
            assert_true((int)number(e, "tid") >= COMM_TID);
            assert_true(number(args, "device_wait_us") >= 0 && number(e, "dur") >= 0);
            c.flying++;
        } else {
            assert_true((int)number(e, "tid") < COMM_TID);
        }
    }
    assert_true(collectives > 0);
    cJSON_Delete(root);
    return c;
}

/* How many times `what` occurs in text. */
static int count_of(const char *text, const char *what)
{
    int n = 0;
    for (const char *at = text; (at = strstr(at, what)); at++) n++;
    return n;
}

/* The picture at svg has a lane per device and both kinds of box; with
 * collectives in flight (`flying`), under every device a communication
 * lane with boxes that name the collective's kind, axes, bytes and value
 * (each device of the default runs has some every step), else none; and
 * rsvg-convert renders it as a PNG, to png. */
static void check_picture(const char *svg, const char *png, bool flying)
{
    size_t len;
    char *picture = support_read_file(svg, &len);
    assert_non_null(picture);
    assert_int_equal(count_of(picture, "<g class=\"lane\""), DEVICES);
    assert_non_null(strstr(picture, "class=\"collective\""));
    assert_non_null(strstr(picture, "class=\"compute\""));
    int comm = count_of(picture, "<g class=\"comm\""), boxes = 0;
    assert_int_equal(comm, flying ? DEVICES : 0);
    for (const char *at = picture; (at = strstr(at, "<g class=\"comm\"")); at++) {
        /* The lane's boxes, up to its group's end. */
        const char *end = strstr(at, "</g>");
        assert_non_null(end);
        for (const char *b = at; (b = strstr(b, "<rect class=")) && b < end; b++) {
            assert_true(!strncmp(b, "<rect class=\"in-flight\"", strlen("<rect class=\"in-flight\"")));
            const char *t = strstr(b, "<title>");
            assert_non_null(t);
            t += strlen("<title>");
            char kind[32], axes[64], unit[8];
            double bytes;
            if (sscanf(t, "%31s over %63[^:]: %lf %7s of ", kind, axes, &bytes, unit) != 4)
                fail_msg("a box in flight without its kind, axes and bytes: %.120s", t);
            assert_true(!strcmp(kind, "all-gather") || !strcmp(kind, "reduce-scatter") ||
                        !strcmp(kind, "all-reduce"));
            assert_true(bytes > 0);
            const char *close = strstr(t, "</title>"), *fly = strstr(t, " in flight; ");
            assert_true(fly && fly < close);
            boxes++;
        }
    }
    assert_true(flying ? boxes > 0 : boxes == 0);
    assert_int_equal(count_of(picture, "class=\"in-flight\""), boxes);
    /* The legend names the thin lanes when there are any. */
    assert_true(!strstr(picture, "comm: in flight") == !flying);
    free(picture);
    if (system("command -v rsvg-convert >/dev/null 2>&1") != 0) {
        print_message("note: no rsvg-convert (librsvg2-bin): %s is not rendered\n", svg);
        return;
    }
    char cmd[3 * SUPPORT_PATH];
    snprintf(cmd, sizeof cmd, "rsvg-convert -f png -o '%s' '%s'", png, svg);
    assert_int_equal(system(cmd), 0);
    unsigned char *image = (unsigned char *)support_read_file(png, &len);
    assert_true(len > 1024);
    assert_memory_equal(image, "\x89PNG\r\n\x1a\n", 8);
    free(image);
}

static void test_readme_picture(void **state)
{
    (void)state;
    char path[SUPPORT_PATH], png[SUPPORT_PATH];
    size_t len;
    char *readme = support_read_file(support_path_in(path, SPMD_SOURCE_DIR, "docs/train.md"), &len);
    assert_non_null(readme);
    assert_non_null(strstr(readme, "](trace.svg)"));
    free(readme);
    check_picture(support_path_in(path, SPMD_SOURCE_DIR, "docs/trace.svg"),
                  support_path_in(png, dir, "readme.png"), false);
}

static void test_default_run(void **state)
{
    (void)state;
    char trace[SUPPORT_PATH], svg[SUPPORT_PATH], png[SUPPORT_PATH];
    support_path_in(trace, dir, "default.json");
    support_path_in(svg, dir, "default.svg");
    support_path_in(png, dir, "default.png");
    int rc = run_toolf(out, sizeof out,
                       "train --steps 5 --eval 0 --overlap on --trace %s --trace-plot %s", trace, svg);
    if (rc) fail_msg("spmd train --trace failed (%d):\n%s", rc, out);
    checked c = check_trace(trace);
    assert_int_equal(c.tracks, DEVICES);
    for (int d = 0; d < DEVICES; d++) assert_true(track_of(&c, 0, d) >= 0);
    /* Collectives in flight, each device's on a track of its own. */
    assert_int_equal(c.comm_tracks, DEVICES);
    assert_true(c.flying > 0);
    assert_int_equal(c.steps, 3);
    for (int i = 0; i < 3; i++) assert_int_equal(c.step[i], 2 + i);

    check_picture(svg, png, true);
}

static void test_steps_asked(void **state)
{
    (void)state;
    char trace[SUPPORT_PATH], svg[SUPPORT_PATH], png[SUPPORT_PATH];
    support_path_in(trace, dir, "steps.json");
    support_path_in(svg, dir, "steps.svg");
    support_path_in(png, dir, "steps.png");
    int rc = run_toolf(out, sizeof out,
                       "train --model mlp --steps 4 --eval 0 --trace %s --trace-steps 3-4 "
                       "--trace-plot %s", trace, svg);
    if (rc) fail_msg("spmd train --trace-steps 3-4 failed (%d):\n%s", rc, out);
    checked c = check_trace(trace);
    /* Without overlap (the default) every collective is a step of its
     * device's track. */
    assert_int_equal(c.comm_tracks, 0);
    assert_int_equal(c.flying, 0);
    assert_int_equal(c.steps, 2);
    assert_int_equal(c.step[0], 3);
    assert_int_equal(c.step[1], 4);
    check_picture(svg, png, false); /* no communication lanes */
}

/* A count of all the run's steps traces them all, the first included
 * (a count traces the steps after the first only when the run has them). */
static void test_count_of_every_step(void **state)
{
    (void)state;
    char trace[SUPPORT_PATH];
    support_path_in(trace, dir, "count.json");
    int rc = run_toolf(out, sizeof out, "train --model mlp --steps 5 --eval 0 --trace %s --trace-steps 5",
                       trace);
    if (rc) fail_msg("--trace-steps 5 failed (%d):\n%s", rc, out);
    checked c = check_trace(trace);
    assert_int_equal(c.steps, 5);
    for (int i = 0; i < 5; i++) assert_int_equal(c.step[i], 1 + i);
    /* 2 of 5: the two after the first. */
    rc = run_toolf(out, sizeof out, "train --model mlp --steps 5 --eval 0 --trace %s --trace-steps 2",
                   trace);
    if (rc) fail_msg("--trace-steps 2 failed (%d):\n%s", rc, out);
    c = check_trace(trace);
    assert_int_equal(c.steps, 2);
    assert_int_equal(c.step[0], 2);
    assert_int_equal(c.step[1], 3);
}

/* A run resumed at step 3 (from a checkpoint of step 2) traces the steps
 * of --trace-steps 2-4 it runs, 3 and 4, saying step 2 was before the
 * resume; a range wholly before it traces nothing, saying so; a count
 * counts from the resumed run's first step. */
static void test_steps_of_a_resumed_run(void **state)
{
    (void)state;
    char ck[SUPPORT_PATH], trace[SUPPORT_PATH];
    support_path_in(ck, dir, "resume-ck");
    support_path_in(trace, dir, "resumed.json");
    int rc = run_toolf(out, sizeof out, "train --model mlp --steps 2 --eval 0 --save %s", ck);
    if (rc) fail_msg("the checkpoint failed (%d):\n%s", rc, out);
    rc = run_toolf(out, sizeof out,
                   "train --model mlp --steps 5 --eval 0 --resume %s --trace %s --trace-steps 2-4", ck,
                   trace);
    if (rc) fail_msg("resumed with --trace-steps 2-4 failed (%d):\n%s", rc, out);
    if (!strstr(out, "--trace-steps 2-4: step 2 was before the resume at step 3; tracing steps 3 to 4"))
        fail_msg("no note of the steps before the resume:\n%s", out);
    checked c = check_trace(trace);
    assert_int_equal(c.steps, 2);
    assert_int_equal(c.step[0], 3);
    assert_int_equal(c.step[1], 4);
    assert_int_equal(unlink(trace), 0);
    rc = run_toolf(out, sizeof out,
                   "train --model mlp --steps 5 --eval 0 --resume %s --trace %s --trace-steps 1-2", ck,
                   trace);
    if (rc) fail_msg("resumed with --trace-steps 1-2 failed (%d):\n%s", rc, out);
    if (!strstr(out, "--trace-steps 1-2: these steps were before the resume at step 3; no trace written"))
        fail_msg("no note that nothing was traced:\n%s", out);
    assert_int_not_equal(access(trace, F_OK), 0);
    rc = run_toolf(out, sizeof out, "train --model mlp --steps 5 --eval 0 --resume %s --trace %s", ck,
                   trace);
    if (rc) fail_msg("resumed with the default steps failed (%d):\n%s", rc, out);
    c = check_trace(trace);
    assert_int_equal(c.steps, 3); /* the default 3, of the 3 left: all of them */
    for (int i = 0; i < 3; i++) assert_int_equal(c.step[i], 3 + i);
}

static void test_refusals(void **state)
{
    (void)state;
    char trace[SUPPORT_PATH];
    support_path_in(trace, dir, "refused.json");
    static const char *const bad[] = {"0", "4-3", "x", "2-9", "-3"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int rc = run_toolf(out, sizeof out, "train --steps 5 --trace %s --trace-steps %s", trace, bad[i]);
        assert_int_equal(rc, 2);
        assert_non_null(strstr(out, "--trace-steps"));
        assert_int_not_equal(access(trace, F_OK), 0);
    }
    assert_int_equal(run_tool("train --steps 5 --trace-steps 2", out, sizeof out), 2);
    assert_non_null(strstr(out, "needs --trace"));
}

/* explain's collective lines, with the measured column: each
 * "phase kind axes N UNIT est meas moves"; how many parse. */
static int measured_lines(const char *text, int *listed)
{
    const char *at = strstr(text, "collectives per step (");
    assert_non_null(at);
    *listed = atoi(at + strlen("collectives per step ("));
    assert_non_null(strstr(at, "est. us meas. us"));
    int parsed = 0;
    for (const char *line = strchr(at, '\n'); line && *line; line = strchr(line + 1, '\n')) {
        char phase[16], kind[32], axes[64], unit[8], moves[96];
        double bytes, est, meas;
        if (sscanf(line + 1, " %15s %31s %63s %lf %7s %lf %lf %95s", phase, kind, axes, &bytes, unit,
                   &est, &meas, moves) != 8)
            continue;
        if (strcmp(phase, "forward") && strcmp(phase, "backward") && strcmp(phase, "update")) continue;
        assert_true(est > 0);
        assert_true(meas > 0);
        parsed++;
    }
    return parsed;
}

static void test_explain_measured(void **state)
{
    (void)state;
    char trace[SUPPORT_PATH], json[SUPPORT_PATH];
    support_path_in(trace, dir, "explain.json");
    support_path_in(json, dir, "explain-report.json");
    int rc = run_toolf(out, sizeof out, "train --model mlp --steps 4 --eval 0 --trace %s", trace);
    if (rc) fail_msg("spmd train --model mlp --trace failed (%d):\n%s", rc, out);
    rc = run_toolf(out, sizeof out, "explain --model mlp --trace %s --json %s", trace, json);
    if (rc) fail_msg("spmd explain --trace failed (%d):\n%s", rc, out);
    int listed = 0, parsed = measured_lines(out, &listed);
    assert_true(listed > 0);
    /* The default: steps 2-4, so every collective ran but the gathers
     * read or written in place, which are no step ("-"). */
    int in_place = 0;
    for (const char *at = strstr(out, ", read in place"); at; at = strstr(at + 1, ", read in place"))
        in_place++;
    for (const char *at = strstr(out, ", written in place"); at; at = strstr(at + 1, ", written in place"))
        in_place++;
    assert_int_equal(parsed + in_place, listed);
    const char *sum = strstr(out, "measured: ");
    assert_non_null(sum = strstr(sum + 1, "measured: ")); /* the note, then the sum */
    char *end;
    double ms = strtod(sum + strlen("measured: "), &end);
    assert_true(end > sum + strlen("measured: ") && ms > 0);
    cJSON *root = load(json);
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(root, "measured");
    assert_int_equal(cJSON_GetArraySize(list), listed);
    const cJSON *m;
    cJSON_ArrayForEach(m, list)
    {
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, "read_in_place")) ||
            cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, "written_in_place"))) {
            assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(m, "measured_us")));
            assert_int_equal((int)number(m, "samples"), 0);
            continue;
        }
        assert_true(number(m, "measured_us") > 0);
        assert_true(number(m, "estimate_us") > 0);
        assert_int_equal((int)number(m, "samples"), 3 * DEVICES); /* steps 2-4, every device */
    }
    cJSON_Delete(root);

    /* Another mesh, another model, another plan: refused, naming the
     * flags and the figures that differ. */
    rc = run_toolf(out, sizeof out, "explain --model mlp --mesh 8 --axes data --trace %s", trace);
    assert_int_equal(rc, 2);
    assert_non_null(strstr(out, "--mesh 4x2 (here 8), --axes replica,fsdp (here data)"));
    assert_non_null(strstr(out, "mesh 4x2 (replica, fsdp) (here 8 (data))"));
    rc = run_toolf(out, sizeof out, "explain --trace %s", trace);
    assert_int_equal(rc, 2);
    assert_non_null(strstr(out, "--model mlp (here gpt)"));
    assert_non_null(strstr(out, "model mlp (here gpt)"));
    rc = run_toolf(out, sizeof out, "explain --model mlp --zero off --trace %s", trace);
    assert_int_equal(rc, 2);
    /* ZeRO's plan has other collectives (a reduce-scatter for an
     * all-reduce, the new values' all-gather): named by the flag. */
    assert_non_null(strstr(out, "--zero on (here off)"));
    /* The report would replace the trace it reads. */
    rc = run_toolf(out, sizeof out, "explain --model mlp --trace %s --json %s", trace, trace);
    assert_int_equal(rc, 2);
    assert_non_null(strstr(out, "--json"));
    assert_non_null(strstr(out, "--trace"));
    /* Not a trace at all. */
    rc = run_toolf(out, sizeof out, "explain --model mlp --trace %s", json);
    assert_int_equal(rc, 2);
    assert_non_null(strstr(out, "not a trace"));
}

/* The trace at `from` with one field of its first event of category
 * `cat` (NULL: of otherData) set to `value`, written to `to`. */
static void edited_trace(const char *from, const char *to, const char *cat, const char *key,
                         double value)
{
    cJSON *root = load(from), *target = cJSON_GetObjectItemCaseSensitive(root, "otherData"), *e;
    if (cat) {
        target = NULL;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(root, "traceEvents"))
        {
            const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "cat");
            if (cJSON_IsString(c) && !strcmp(c->valuestring, cat)) {
                target = e;
                break;
            }
        }
    }
    assert_non_null(target);
    cJSON_ReplaceItemInObjectCaseSensitive(target, key, cJSON_CreateNumber(value));
    char *text = cJSON_PrintUnformatted(root);
    FILE *f = fopen(to, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
    free(text);
    cJSON_Delete(root);
}

/* A trace with fields no run can have (a negative or huge duration, a
 * start before the trace's, steps that do not run forward) is refused by
 * explain --trace naming the event and the field, not summed into a
 * negative or infinite measure. */
static void test_impossible_fields(void **state)
{
    (void)state;
    char trace[SUPPORT_PATH], bad[SUPPORT_PATH];
    support_path_in(trace, dir, "fields.json");
    support_path_in(bad, dir, "fields-bad.json");
    int rc = run_toolf(out, sizeof out, "train --model mlp --steps 4 --eval 0 --trace %s", trace);
    if (rc) fail_msg("spmd train --trace failed (%d):\n%s", rc, out);
    const struct {
        const char *cat, *key;
        double value;
        const char *said;
    } cases[] = {
        {"collective", "dur", -181.5, "\"dur\" -181.5"},
        {"collective", "dur", -1e308, "\"dur\" -1e+308"},
        {"step", "dur", 1e300, "\"dur\" 1e+300"},
        {"compute", "ts", -3, "\"ts\" -3"},
        {NULL, "first_step", 0, "\"first_step\" 0"},
        {NULL, "last_step", 1, "\"last_step\" 1"},
        {NULL, "params", -5901, "\"params\" -5901"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        edited_trace(trace, bad, cases[i].cat, cases[i].key, cases[i].value);
        rc = run_toolf(out, sizeof out, "explain --model mlp --trace %s", bad);
        if (rc != 2 || !strstr(out, cases[i].said) || strstr(out, "inf ms") || strstr(out, "measured: -"))
            fail_msg("%s %s = %g: exit %d, want 2 naming '%s':\n%s", cases[i].cat ? cases[i].cat : "otherData",
                     cases[i].key, cases[i].value, rc, cases[i].said, out);
    }
}

#ifdef SPMD_MPIEXEC
static void test_over_processes(void **state)
{
    (void)state;
    char trace[SUPPORT_PATH], cmd[4 * SUPPORT_PATH], mpirun[2048];
    support_path_in(trace, dir, "mpi.json");
    snprintf(cmd, sizeof cmd, "%s -n 2 '%s' train --steps 3 --eval 0 --trace %s",
             support_mpirun(mpirun, sizeof mpirun, 120), SPMD_TOOL_PATH, trace);
    int rc = support_run_tool("env", cmd, NULL, out, sizeof out);
    if (rc) fail_msg("spmd train --trace under mpirun failed (%d):\n%s", rc, out);
    checked c = check_trace(trace);
    assert_int_equal(c.tracks, DEVICES);
    /* Devices 0-3 in process 0, 4-7 in process 1. */
    for (int d = 0; d < DEVICES; d++) assert_true(track_of(&c, d / 4, d) >= 0);
    char part[SUPPORT_PATH + 16];
    snprintf(part, sizeof part, "%s.part-1", trace);
    assert_int_not_equal(access(part, F_OK), 0);
}
#else
static void test_over_processes(void **state)
{
    (void)state;
    print_message("note: built without MPI: --trace under mpirun is not tested\n");
    skip();
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_run),
        cmocka_unit_test(test_readme_picture),
        cmocka_unit_test(test_steps_asked),
        cmocka_unit_test(test_count_of_every_step),
        cmocka_unit_test(test_steps_of_a_resumed_run),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_explain_measured),
        cmocka_unit_test(test_impossible_fields),
        cmocka_unit_test(test_over_processes),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
