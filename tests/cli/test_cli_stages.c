/*
 * spmd train --pp AXIS --microbatches M (docs/design/stages.md): the GPT
 * on 2 and 4 pipeline stages, on 2 stages x 2 data replicas and on 2
 * stages x 2 fsdp x 2 data, trains
 * as --accumulate M does on one device (the losses within 1e-5 relative
 * over the steps), a rerun gives the same bits, the banner and explain
 * show the stages, and what is not built or makes no pipeline is refused
 * naming the flags.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "support_tool.h"

#include <cJSON.h>
#include <math.h>
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

enum { STEPS = 20 };
#define SHAPE "--steps 20 --eval 0 --layers 4 --dim 32 --heads 2 --seq 16 --batch 4 --threads 2"

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

static void same_as_accumulation(const char *mesh, const char *axes, int micro)
{
    double want[STEPS], got[STEPS], again[STEPS];
    char flags[160];
    snprintf(flags, sizeof flags, "--accumulate %d", micro);
    losses(flags, "accumulate", want);
    snprintf(flags, sizeof flags, "--mesh %s --axes %s --pp pp --microbatches %d", mesh, axes, micro);
    losses(flags, "stages", got);
    has("micro-batches over");
    losses(flags, "again", again);
    for (int i = 0; i < STEPS; i++) {
        if (fabs(got[i] - want[i]) > 1e-5 * fabs(want[i]))
            fail_msg("%s step %d: loss %.9g with stages, %.9g with --accumulate %d", mesh, i + 1,
                     got[i], want[i], micro);
        if (memcmp(&got[i], &again[i], sizeof got[i]))
            fail_msg("%s step %d: %.17g, then %.17g", mesh, i + 1, got[i], again[i]);
    }
}

static void test_two_stages(void **state)
{
    (void)state;
    same_as_accumulation("2", "pp", 4);
}

static void test_four_stages(void **state)
{
    (void)state;
    same_as_accumulation("4", "pp", 4);
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

static void test_explain_shows_the_stages(void **state)
{
    (void)state;
    tool(0, "explain --mesh 2 --axes pp --pp pp --layers 5 --batch 4");
    has("batch 4 x 2 micro-batches over 2 stages");
    has("stages: 2 along 'pp'");
    has("stage 0: blocks 0-2 + wte.weight, wpe.weight");
    has("stage 1: blocks 3-4 + ln_f.weight, ln_f.bias");
    has("of activations at most");
}

static void test_refusals(void **state)
{
    (void)state;
    tool(2, "train --steps 1 --microbatches 4");
    has("--microbatches 4: micro-batches are --pp's");
    tool(2, "train --steps 1 --mesh 4 --axes pp --pp pp --layers 4 --microbatches 2");
    has("--microbatches 2 for 4 stages");
    tool(2, "train --steps 1 --mesh 4 --axes pp --pp pp --layers 2");
    has("4 stages for --layers 2");
    tool(2, "train --steps 1 --mesh 2 --axes data --pp pp");
    has("--pp pp");
    tool(2, "train --steps 1 --mesh 2x2 --axes pp,tensor --pp pp --tp tensor");
    has("--pp pp with --tp is not built yet");
    tool(2, "train --steps 1 --mesh 2 --axes pp --pp pp --accumulate 2");
    has("--accumulate");
    tool(2, "train --steps 1 --mesh 2 --axes pp --pp pp --shard 'input=None,pp,None'");
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
        cmocka_unit_test(test_explain_shows_the_stages),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
