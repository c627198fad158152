/*
 * `spmd train --save / --resume`: a resumed run continues the one it was
 * saved from, bit for bit on the same mesh and within 1e-5 on another; a
 * save killed at any point leaves the previous checkpoint to resume from;
 * a damaged or mismatched checkpoint is refused before the first step,
 * naming the file and the cause.  Also the optimizer and schedule flags,
 * which a checkpoint records, and the other optimizers (RMSprop, Adagrad,
 * Adam with amsgrad, SGD with dampening or Nesterov) resumed bit for bit.
 * Pipeline stages: a checkpoint saved on stages resumes on the same stages
 * bit for bit and on one device or 4 stages within 1e-5, and one saved on
 * one device resumes on stages.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "support_files.h"
#include "support_tool.h"

#include <cJSON.h>
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef SPMD_TOOL_PATH
#error "SPMD_TOOL_PATH must name the spmd binary"
#endif
#ifndef SPMD_TEST_TOOL_PATH
#error "SPMD_TEST_TOOL_PATH must name spmd-test, the binary with the test hooks"
#endif

/* Each test works in a directory of its own. */
static char dir[64];
static char out[1 << 16];

static void remove_tree(const char *path)
{
    DIR *d = opendir(path);
    if (!d) {
        remove(path);
        return;
    }
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char sub[512];
        snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
        remove_tree(sub);
    }
    closedir(d);
    rmdir(path);
}

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "test_cli_checkpoint_XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    remove_tree(dir);
    return 0;
}

/* Run the tool with printf-style arguments; fails the test on an exit
 * status other than `want`. */
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

static void has(const char *text, const char *part)
{
    if (!strstr(text, part)) fail_msg("\"%s\" not in:\n%s", part, text);
}

/* The losses of a report, into `loss` (at most n); their count. */
static int report_losses(const char *path, double *loss, int n)
{
    static char text[1 << 20];
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("no report %s", path);
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = '\0';
    cJSON *j = cJSON_Parse(text);
    assert_non_null(j);
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(j, "loss");
    int count = cJSON_GetArraySize(l);
    assert_true(count <= n);
    for (int i = 0; i < count; i++) loss[i] = cJSON_GetArrayItem(l, i)->valuedouble;
    cJSON_Delete(j);
    return count;
}

enum { STEPS = 12, HALF = 6 };
#define SHAPE "--steps 12 --eval 0 --dim 32 --heads 2 --seq 16"
#define SMALL SHAPE " --batch 16"

/* The losses of an uninterrupted run with `flags`, into full[STEPS]. */
static void full_run(const char *flags, double *full)
{
    tool(0, "train " SMALL " %s --json %s/full.json", flags, dir);
    char path[128];
    snprintf(path, sizeof path, "%s/full.json", dir);
    assert_int_equal(report_losses(path, full, STEPS), STEPS);
}

/* Resume with `flags` from `from` (a checkpoint directory) and compare
 * steps `first`+1 .. STEPS with `full`: bitwise when tol is 0. */
static void expect_resumed(const char *flags, const char *from, int first, const double *full, double tol)
{
    tool(0, "train " SMALL " %s --resume %s --json %s/resumed.json", flags, from, dir);
    char said[64], path[128];
    snprintf(said, sizeof said, "resumed: step %d of %d", first, STEPS);
    has(out, said);
    double loss[STEPS];
    snprintf(path, sizeof path, "%s/resumed.json", dir);
    assert_int_equal(report_losses(path, loss, STEPS), STEPS - first);
    for (int i = 0; i < STEPS - first; i++) {
        double want = full[first + i], got = loss[i];
        if (tol == 0 ? got != want : fabs(got - want) > tol * fabs(want))
            fail_msg("%s from %s: step %d loss %.9g, uninterrupted %.9g", flags, from, first + i + 1,
                     got, want);
    }
}

/* ---- Resume ------------------------------------------------------------------ */

/* Saved halfway (--save-every) and resumed on the same mesh: the same
 * losses as a run never stopped, bit for bit, for SGD and AdamW. */
static void test_resume_same_mesh_is_bitwise(void **state)
{
    (void)state;
    const char *meshes[] = {"--mesh 1 --axes data", "--mesh 8 --axes data",
                            "--mesh 4x2 --axes replica,fsdp"};
    const char *optimizers[] = {"--optimizer sgd", "--optimizer adamw"};
    for (int m = 0; m < 3; m++)
        for (int o = 0; o < 2; o++) {
            char flags[128], ck[128], from[160];
            snprintf(flags, sizeof flags, "%s %s", meshes[m], optimizers[o]);
            snprintf(ck, sizeof ck, "%s/ck%d%d", dir, m, o);
            double full[STEPS];
            full_run(flags, full);
            tool(0, "train " SMALL " %s --save %s --save-every %d", flags, ck, HALF);
            has(out, "checkpoint: step 6 saved");
            has(out, "checkpoint: step 12 saved");
            snprintf(from, sizeof from, "%s/step-%08d", ck, HALF);
            expect_resumed(flags, from, HALF, full, 0);
        }
}

/* The other optimizers, their own settings on, saved halfway on 4x2 and
 * resumed there: bit for bit, every state of theirs in the checkpoint. */
static void test_resume_other_optimizers_is_bitwise(void **state)
{
    (void)state;
    const char *optimizers[] = {
        "--optimizer rmsprop --momentum 0.5 --centered on --weight-decay 0.01",
        "--optimizer adagrad --lr-decay 0.1 --initial-accumulator 0.1",
        "--optimizer adam --amsgrad on --weight-decay 0.01",
        "--optimizer sgd --momentum 0.9 --dampening 0.1",
        "--optimizer sgd --momentum 0.9 --nesterov on",
    };
    for (size_t o = 0; o < sizeof optimizers / sizeof *optimizers; o++) {
        char flags[192], ck[128], from[160];
        snprintf(flags, sizeof flags, "--mesh 4x2 --axes replica,fsdp %s", optimizers[o]);
        snprintf(ck, sizeof ck, "%s/other%zu", dir, o);
        double full[STEPS];
        full_run(flags, full);
        tool(0, "train " SMALL " %s --save %s --save-every %d", flags, ck, HALF);
        snprintf(from, sizeof from, "%s/step-%08d", ck, HALF);
        expect_resumed(flags, from, HALF, full, 0);
    }
}

/* Saved on one mesh, resumed on another: each device reads the blocks it
 * needs; the losses agree within 1e-5. */
static void test_resume_on_another_mesh(void **state)
{
    (void)state;
    const char *pairs[][2] = {
        {"--mesh 4x2 --axes replica,fsdp", "--mesh 1 --axes data"},
        {"--mesh 8 --axes data", "--mesh 2x4 --axes replica,fsdp"},
        {"--mesh 1 --axes data", "--mesh 2x2x2 --axes data,fsdp,tensor --fsdp fsdp"},
    };
    for (int i = 0; i < 3; i++) {
        char ck[128], from[160];
        snprintf(ck, sizeof ck, "%s/ck%d", dir, i);
        double full[STEPS];
        full_run(pairs[i][0], full);
        tool(0, "train " SMALL " %s --save %s --save-every %d", pairs[i][0], ck, HALF);
        snprintf(from, sizeof from, "%s/step-%08d", ck, HALF);
        expect_resumed(pairs[i][1], from, HALF, full, 1e-5);
    }
}

/* Stages and no stages: each parameter and state is saved from its home
 * stage's devices and loaded there; --microbatches M is --accumulate M. */
static void test_resume_across_stages(void **state)
{
    (void)state;
#define STAGED "--layers 4 --batch 4 --threads 2"
#define PP2 STAGED " --mesh 2 --axes pp --pp pp --microbatches 4"
#define ONE STAGED " --mesh 1 --axes data --accumulate 4"
    const struct {
        const char *saved, *resumed;
        double tol;
    } cases[] = {
        {PP2, PP2, 0},
        {PP2, ONE, 1e-5},
        {PP2, STAGED " --mesh 4 --axes pp --pp pp --microbatches 4", 1e-5},
        {ONE, PP2, 1e-5},
        {ONE, STAGED " --mesh 2x2 --axes pp,data --pp pp --microbatches 4", 1e-5},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char ck[128], from[160];
        snprintf(ck, sizeof ck, "%s/ck%zu", dir, i);
        double full[STEPS];
        full_run(cases[i].saved, full);
        tool(0, "train " SMALL " %s --save %s --save-every %d", cases[i].saved, ck, HALF);
        snprintf(from, sizeof from, "%s/step-%08d", ck, HALF);
        expect_resumed(cases[i].resumed, from, HALF, full, cases[i].tol);
        if (strstr(out, "will differ"))
            fail_msg("%s from %s warned:\n%s", cases[i].resumed, from, out);
    }
#undef STAGED
#undef PP2
#undef ONE
}

/* ---- A save killed part way --------------------------------------------------------- */

/* kill -9 while saving step 8 (after a file, the index, the rename, or the
 * new `latest`): --resume DIR then starts from the newest complete
 * checkpoint (step 4 until `latest` names step 8) and continues as the
 * uninterrupted run did, and the next save succeeds.  The pause is a test
 * hook of spmd-test (SPMD_TEST_SAVE_PAUSE); spmd itself ignores it. */
static void test_killed_save_leaves_the_previous(void **state)
{
    (void)state;
    const char *flags = "--mesh 4x2 --axes replica,fsdp";
    double full[STEPS];
    full_run(flags, full);
    struct {
        const char *stage;
        int resumed_at;
    } cases[] = {{"dev-0000.safetensors", 4}, {"dev-0001.safetensors", 4}, {"index.json", 4},
                 {"step-00000008", 4},        {"latest", 8}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char ck[128], pause[64], args[512];
        snprintf(ck, sizeof ck, "%s/kill%zu", dir, i);
        snprintf(pause, sizeof pause, "8:%s", cases[i].stage);
        snprintf(args, sizeof args, "train " SMALL " %s --save %s --save-every 4 --keep 1", flags, ck);
        setenv("SPMD_TEST_SAVE_PAUSE", pause, 1);
        tool_limits limits = {.stop_at = "paused after", .timeout_s = 300};
        int rc = support_run_tool(SPMD_TEST_TOOL_PATH, args, &limits, out, sizeof out);
        unsetenv("SPMD_TEST_SAVE_PAUSE");
        if (rc != TOOL_STOPPED) fail_msg("%s: exit %d, output:\n%s", cases[i].stage, rc, out);
        char again[256];
        snprintf(again, sizeof again, "%s --save %s", flags, ck);
        expect_resumed(again, ck, cases[i].resumed_at, full, 0);
        /* The resumed run saved its end beside whatever the kill left. */
        char latest[160], text[64] = "";
        snprintf(latest, sizeof latest, "%s/latest", ck);
        FILE *f = fopen(latest, "r");
        assert_non_null(f);
        assert_non_null(fgets(text, sizeof text, f));
        fclose(f);
        has(text, "step-00000012");
    }
}

/* The release binary reads no test hook: with SPMD_TEST_SAVE_PAUSE set,
 * spmd saves step 4 (and its end) without stopping. */
static void test_release_ignores_the_save_pause(void **state)
{
    (void)state;
    char ck[128], args[512];
    snprintf(ck, sizeof ck, "%s/release", dir);
    snprintf(args, sizeof args, "train " SMALL " --mesh 1 --axes data --save %s --save-every 4", ck);
    setenv("SPMD_TEST_SAVE_PAUSE", "4:latest", 1);
    tool_limits limits = {.stop_at = "paused after", .timeout_s = 300};
    int rc = support_run_tool(SPMD_TOOL_PATH, args, &limits, out, sizeof out);
    unsetenv("SPMD_TEST_SAVE_PAUSE");
    if (rc != 0) fail_msg("exit %d, output:\n%s", rc, out);
    has(out, "checkpoint: step 4 saved");
    assert_null(strstr(out, "paused"));
}

/* SIGINT mid-run: the run stops after the step under way and saves it,
 * and --resume continues from there. */
static void test_interrupted_run_saved(void **state)
{
    (void)state;
    char ck[128], args[512];
    snprintf(ck, sizeof ck, "%s/interrupted", dir);
    snprintf(args, sizeof args, "train --model mlp --mesh 1 --axes data --steps 1000000 --eval 0 --save %s", ck);
    tool_limits limits = {.stop_at = "ms/step  eta", .stop_signal = SIGINT, .timeout_s = 120};
    int rc = support_run_tool(SPMD_TOOL_PATH, args, &limits, out, sizeof out);
    if (rc != 130) fail_msg("exit %d, output:\n%s", rc, out);
    const char *at = strstr(out, "interrupted by SIGINT after step ");
    assert_non_null(at);
    int step = atoi(at + strlen("interrupted by SIGINT after step "));
    char saved[64];
    snprintf(saved, sizeof saved, "checkpoint: step %d saved", step);
    has(out, saved);
    tool(0, "train --model mlp --mesh 1 --axes data --steps %d --eval 0 --resume %s", step + 2, ck);
    snprintf(saved, sizeof saved, "resumed: step %d of %d", step, step + 2);
    has(out, saved);
}

/* ---- Refusals ----------------------------------------------------------------------- */

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

static char *read_text(const char *path)
{
    size_t len;
    return support_read_file(path, &len);
}

/* A fresh checkpoint of the default-shaped small GPT on 4x2, in `ck`. */
static void fresh_checkpoint(char *ck, size_t size, const char *name)
{
    snprintf(ck, size, "%s/%s", dir, name);
    tool(0, "train " SMALL " --steps 2 --save %s", ck);
}

/* Resume from a damaged checkpoint: refused (exit 2) before any step,
 * the message holding each of `parts`. */
static void expect_refused(const char *ck, const char *extra, const char *const *parts)
{
    tool(2, "train " SMALL " --resume %s %s", ck, extra);
    for (int i = 0; parts[i]; i++) has(out, parts[i]);
    if (strstr(out, "ms/step  eta")) fail_msg("a step ran before the refusal:\n%s", out);
}

static void test_damaged_checkpoints_refused(void **state)
{
    (void)state;
    char ck[128], path[256];

    fresh_checkpoint(ck, sizeof ck, "missing");
    snprintf(path, sizeof path, "%s/step-00000002/dev-0001.safetensors", ck);
    assert_int_equal(unlink(path), 0);
    expect_refused(ck, "", (const char *[]){"dev-0001.safetensors", "--resume", NULL});

    fresh_checkpoint(ck, sizeof ck, "truncated");
    snprintf(path, sizeof path, "%s/step-00000002/dev-0000.safetensors", ck);
    assert_int_equal(truncate(path, 1000), 0);
    expect_refused(ck, "", (const char *[]){"dev-0000.safetensors", "bytes", NULL});

    fresh_checkpoint(ck, sizeof ck, "flipped");
    snprintf(path, sizeof path, "%s/step-00000002/dev-0001.safetensors", ck);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    fseek(f, -4, SEEK_END);
    int c = fgetc(f);
    fseek(f, -4, SEEK_END);
    fputc(c ^ 0x40, f);
    fclose(f);
    expect_refused(ck, "", (const char *[]){"dev-0001.safetensors", "crc32", NULL});

    fresh_checkpoint(ck, sizeof ck, "version");
    snprintf(path, sizeof path, "%s/step-00000002/index.json", ck);
    char *text = read_text(path);
    cJSON *index = cJSON_Parse(text);
    free(text);
    assert_non_null(index);
    cJSON_ReplaceItemInObjectCaseSensitive(index, "version", cJSON_CreateNumber(7));
    text = cJSON_Print(index);
    write_text(path, text);
    free(text);
    cJSON_Delete(index);
    expect_refused(ck, "", (const char *[]){"index.json", "version 7", NULL});

    /* A negative data position is named as such, not as a missing key. */
    fresh_checkpoint(ck, sizeof ck, "position");
    snprintf(path, sizeof path, "%s/step-00000002/index.json", ck);
    text = read_text(path);
    index = cJSON_Parse(text);
    free(text);
    cJSON *data = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(index, "meta"),
                                                   "data");
    assert_non_null(data);
    cJSON_ReplaceItemInObjectCaseSensitive(data, "samples", cJSON_CreateNumber(-64));
    text = cJSON_Print(index);
    write_text(path, text);
    free(text);
    cJSON_Delete(index);
    expect_refused(ck, "", (const char *[]){"data position (data.samples) is -64",
                                            "which is negative", NULL});

    /* The model flags disagree with the saved tensors: named with both shapes. */
    fresh_checkpoint(ck, sizeof ck, "shape");
    expect_refused(ck, "--dim 48", (const char *[]){"wte.weight", "[13, 48]", "[13, 32]", NULL});

    /* AdamW's state cannot continue SGD. */
    expect_refused(ck, "--optimizer sgd",
                   (const char *[]){"--optimizer sgd", "adamw's state", NULL});

    /* A checkpoint at --steps or past it has nothing left to train. */
    expect_refused(ck, "--steps 2", (const char *[]){"step 2", "nothing is left to train", NULL});

    /* No checkpoint at all. */
    snprintf(path, sizeof path, "%s/none", dir);
    expect_refused(path, "", (const char *[]){"none", NULL});
}

/* The experts' settings are the model's: a resume that changes one is
 * refused before any tensor is read, naming the flag and both values. */
static void test_expert_settings_refused(void **state)
{
    (void)state;
    char ck[128];
    snprintf(ck, sizeof ck, "%s/experts", dir);
    tool(0, "train " SMALL " --layers 2 --experts 4 --experts-top-k 2 --steps 2 --save %s", ck);
    const char *moe = "--layers 2 --experts 4 --experts-top-k 2";
    char flags[128];
    snprintf(flags, sizeof flags, "--layers 2 --experts 8 --experts-top-k 2");
    expect_refused(ck, flags, (const char *[]){"--experts 8", "trained with --experts 4", NULL});
    snprintf(flags, sizeof flags, "%s --experts-top-k 1", moe);
    expect_refused(ck, flags,
                   (const char *[]){"--experts-top-k 1", "trained with --experts-top-k 2", NULL});
    snprintf(flags, sizeof flags, "%s --capacity-factor 2", moe);
    expect_refused(ck, flags,
                   (const char *[]){"--capacity-factor 2", "trained with --capacity-factor", NULL});
    expect_refused(ck, "--layers 2",
                   (const char *[]){"--experts 0", "trained with --experts 4", NULL});
    /* The same settings resume. */
    tool(0, "train " SMALL " %s --steps 3 --resume %s", moe, ck);
    has(out, "resumed: step 2 of 3");
}

/* Settings that differ from the saved ones are named in a warning. */
static void test_changed_settings_warned(void **state)
{
    (void)state;
    char ck[128];
    fresh_checkpoint(ck, sizeof ck, "warn");
    tool(0, "train " SMALL " --resume %s --lr 0.001 --seed 5 --precision bf16", ck);
    has(out, "warning: resuming with --lr 0.001 where the checkpoint trained with 0.003");
    has(out, "warning: resuming with --precision bf16 where the checkpoint trained with fp32");
    has(out, "warning: resuming with --seed 5 where the checkpoint trained with 1");
    has(out, "will differ from one never interrupted");
}

/* ---- Gradient accumulation -------------------------------------------------------- */

/* --accumulate 4 with --batch 16 trains as --batch 64 does (within 1e-5:
 * the micro-batches' gradients add up in another order), says so, and a
 * run saved halfway resumes bit for bit, with the data position counted
 * in micro-batches. */
static void test_accumulate(void **state)
{
    (void)state;
    const char *mesh = "--mesh 4x2 --axes replica,fsdp";
    char path[128], ck[128], from[160];
    double whole[STEPS], acc[STEPS];
    tool(0, "train " SHAPE " --batch 64 %s --json %s/whole.json", mesh, dir);
    snprintf(path, sizeof path, "%s/whole.json", dir);
    assert_int_equal(report_losses(path, whole, STEPS), STEPS);
    char flags[128];
    snprintf(flags, sizeof flags, "%s --accumulate 4", mesh);
    full_run(flags, acc);
    has(out, "batch 16 x 4 micro-batches");
    for (int i = 0; i < STEPS; i++)
        if (fabs(acc[i] - whole[i]) > 1e-5 * fabs(whole[i]))
            fail_msg("step %d: loss %.9g with --accumulate 4, %.9g with --batch 64", i + 1, acc[i], whole[i]);
    snprintf(ck, sizeof ck, "%s/ck", dir);
    tool(0, "train " SMALL " %s --save %s --save-every %d", flags, ck, HALF);
    snprintf(from, sizeof from, "%s/step-%08d", ck, HALF);
    expect_resumed(flags, from, HALF, acc, 0);
    has(out, "data position 384 samples"); /* 6 steps of 4 x 16 */
}

/* ---- Optimizer flags -------------------------------------------------------------- */

/* Every optimizer setting reaches the report (and so the checkpoint,
 * which saves the same object), and changes the training. */
static void test_optimizer_flags(void **state)
{
    (void)state;
    char report[128];
    snprintf(report, sizeof report, "%s/opt.json", dir);
    tool(0, "train " SMALL " --weight-decay 0.1 --beta1 0.8 --beta2 0.95 --eps 1e-6 --clip 0 "
            "--schedule constant --warmup 3 --lr 0.002 --json %s", report);
    char *text = read_text(report);
    cJSON *j = cJSON_Parse(text);
    free(text);
    assert_non_null(j);
    const cJSON *opt = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "settings"),
                                                        "optimizer");
    assert_non_null(opt);
    struct {
        const char *key;
        double want;
    } numbers[] = {{"weight_decay", 0.1}, {"beta1", 0.8}, {"beta2", 0.95}, {"eps", 1e-6},
                   {"clip", 0},           {"warmup", 3},  {"lr", 0.002}};
    for (size_t i = 0; i < sizeof numbers / sizeof *numbers; i++) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(opt, numbers[i].key);
        if (!cJSON_IsNumber(n) || (float)n->valuedouble != (float)numbers[i].want)
            fail_msg("optimizer.%s is not %g", numbers[i].key, numbers[i].want);
    }
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(opt, "schedule")->valuestring, "constant");
    cJSON_Delete(j);

    /* The other optimizers' settings reach the report too. */
    const struct {
        const char *flags, *kind, *key;
        double want;
    } others[] = {
        {"--optimizer sgd --momentum 0.9 --dampening 0.25", "sgd", "dampening", 0.25},
        {"--optimizer rmsprop --alpha 0.9 --eps 1e-6", "rmsprop", "alpha", 0.9},
        {"--optimizer adagrad --lr-decay 0.5", "adagrad", "lr_decay", 0.5},
        {"--optimizer adagrad --initial-accumulator 0.25", "adagrad", "initial_accumulator", 0.25},
    };
    for (size_t i = 0; i < sizeof others / sizeof *others; i++) {
        tool(0, "train " SMALL " %s --json %s", others[i].flags, report);
        text = read_text(report);
        j = cJSON_Parse(text);
        free(text);
        opt = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "settings"),
                                               "optimizer");
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(opt, others[i].key);
        assert_string_equal(cJSON_GetObjectItemCaseSensitive(opt, "kind")->valuestring, others[i].kind);
        if (!cJSON_IsNumber(n) || (float)n->valuedouble != (float)others[i].want)
            fail_msg("%s: optimizer.%s is not %g", others[i].flags, others[i].key, others[i].want);
        cJSON_Delete(j);
    }

    /* Each flag changes the losses (step 1's lr is 0 during warmup, so compare the end). */
    double base[STEPS], other[STEPS];
    tool(0, "train " SMALL " --json %s", report);
    report_losses(report, base, STEPS);
    const char *flags[] = {"--weight-decay 0.5", "--beta1 0.5", "--beta2 0.9", "--eps 1e-3",
                           "--clip 0.01", "--schedule constant", "--warmup 0", "--amsgrad on",
                           "--optimizer adam", "--optimizer rmsprop", "--optimizer adagrad"};
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++) {
        tool(0, "train " SMALL " %s --json %s", flags[i], report);
        report_losses(report, other, STEPS);
        if (other[STEPS - 1] == base[STEPS - 1]) fail_msg("%s changed nothing", flags[i]);
    }

    /* Settings of the other optimizers, and values out of range. */
    tool(2, "train --optimizer sgd --beta2 0.9");
    has(out, "--beta2 is a setting of --optimizer adamw, adam; --optimizer sgd takes --lr, "
             "--schedule, --weight-decay, --momentum, --dampening, --nesterov, --clip");
    tool(2, "train --optimizer adagrad --centered on");
    has(out, "--centered is a setting of --optimizer rmsprop; --optimizer adagrad takes");
    tool(2, "train --optimizer lamb");
    has(out, "--optimizer is sgd, adamw, adam, rmsprop or adagrad, got 'lamb'");
    tool(2, "train --optimizer sgd --nesterov on");
    has(out, "Nesterov momentum needs a momentum and zero dampening");
    tool(2, "train --beta1 1");
    has(out, "--beta1 wants a number from 0 to 1 (excluded), got '1'");
    tool(2, "train --clip -1");
    has(out, "--clip wants a number from 0");
    tool(2, "train --schedule linear");
    has(out, "--schedule is cosine or constant, got 'linear'");
    tool(2, "train --data-order random");
    has(out, "--data-order is shuffled or sequential");
    tool(2, "train --save-every 5 --steps 10");
    has(out, "--save-every says how to save, but there is no --save DIR");
    tool(2, "train --keep 2 --steps 10");
    has(out, "--keep says how to save");
    tool(2, "train --data-order sequential --steps 1");
    has(out, "llm.c token shards");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_resume_same_mesh_is_bitwise, setup, teardown),
        cmocka_unit_test_setup_teardown(test_resume_on_another_mesh, setup, teardown),
        cmocka_unit_test_setup_teardown(test_resume_across_stages, setup, teardown),
        cmocka_unit_test_setup_teardown(test_killed_save_leaves_the_previous, setup, teardown),
        cmocka_unit_test_setup_teardown(test_release_ignores_the_save_pause, setup, teardown),
        cmocka_unit_test_setup_teardown(test_interrupted_run_saved, setup, teardown),
        cmocka_unit_test_setup_teardown(test_damaged_checkpoints_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_expert_settings_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_changed_settings_warned, setup, teardown),
        cmocka_unit_test_setup_teardown(test_accumulate, setup, teardown),
        cmocka_unit_test_setup_teardown(test_optimizer_flags, setup, teardown),
        cmocka_unit_test_setup_teardown(test_resume_other_optimizers_is_bitwise, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
