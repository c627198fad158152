/*
 * Paths as a kind (tools/paths.c), end to end: the paths the later flags
 * and commands take (--trace, --trace-plot, tokenize's texts and shards,
 * plot's inputs, --encoder, --tokenizer, sample --resume) held to the
 * rules every path is:
 *
 *   - no output in a checkpoint, the command's or one on disk: a trace on
 *     a step's index.json, a picture on `latest`, a log on the `latest`
 *     of a --save directory not made yet;
 *   - no output on an input of the command (--data's text, tokenize's own
 *     input shard) or on another output (--trace with --json, --log,
 *     --plot's file, --trace-plot; a dangling symbolic link to another
 *     output's new file);
 *   - an input that is a FIFO refused, never waited on (each run under a
 *     deadline: before, each hung in open());
 *   - messages naming the real flag (--trace, not --json), the trace file
 *     a failed write was for, and sample --resume for a loop of links.
 *
 * Each refusal leaves every file as it was.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "support_files.h"
#include "support_tool.h"

#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef SPMD_TOOL_PATH
#error "SPMD_TOOL_PATH must name the spmd binary"
#endif

/* A small GPT run: a few milliseconds a step. */
#define GPT "train --steps 3 --eval 0 --dim 32 --heads 2 --seq 16 --batch 16 --layers 1"

static char *dir;
static char out[1 << 16];

static int setup(void **state)
{
    (void)state;
    dir = support_temp_dir("test_cli_paths");
    return dir ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    support_drop_dir(dir);
    return 0;
}

/* The tool with printf-style arguments, stopped after 20 s: a run that
 * would block on a FIFO times out instead of hanging the suite. */
static int tool(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int tool(const char *fmt, ...)
{
    char args[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    tool_limits limits = {.timeout_s = 20};
    return support_run_tool(SPMD_TOOL_PATH, args, &limits, out, sizeof out);
}

/* Refused with exit 2 before any step, the output naming every one of
 * `parts` and none of `not` (may be NULL). */
static void refused(int rc, const char *const *parts, const char *not)
{
    if (rc == TOOL_TIMED_OUT) fail_msg("still running after 20 s (waiting on a FIFO?):\n%s", out);
    if (rc != 2) fail_msg("exit %d, want 2; output:\n%s", rc, out);
    for (; *parts; parts++)
        if (!strstr(out, *parts)) fail_msg("no '%s' in:\n%s", *parts, out);
    if (not && strstr(out, not)) fail_msg("'%s' in:\n%s", not, out);
    if (strstr(out, "step    1/")) fail_msg("refused only after running:\n%s", out);
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

/* The file's text, to compare before and after; the caller frees it. */
static char *text_of(const char *path)
{
    size_t len;
    char *text = support_read_file(path, &len);
    assert_non_null(text);
    return text;
}

static void unchanged(const char *path, const char *before)
{
    char *now = text_of(path);
    if (strcmp(now, before)) fail_msg("%s changed", path);
    free(now);
}

/* A checkpoint of the small GPT at DIR/ck: its step 3. */
static const char *checkpoint(char *ck)
{
    support_path_in(ck, dir, "ck");
    int rc = tool(GPT " --save %s", ck);
    if (rc != 0) fail_msg("the checkpoint: exit %d\n%s", rc, out);
    return ck;
}

/* A trace on a checkpoint's index, a picture on its latest: refused,
 * naming the checkpoint; the checkpoint as it was (before: both written
 * over, exit 0, and the only checkpoint could not be resumed). */
static void test_outputs_kept_out_of_checkpoints(void **state)
{
    (void)state;
    char ck[SUPPORT_PATH], index[SUPPORT_PATH], latest[SUPPORT_PATH];
    checkpoint(ck);
    support_path_in(index, ck, "step-00000003/index.json");
    support_path_in(latest, ck, "latest");
    char *index_text = text_of(index), *latest_text = text_of(latest);
    refused(tool(GPT " --trace %s", index), (const char *[]){"--trace", "inside the checkpoint", NULL},
            NULL);
    unchanged(index, index_text);
    refused(tool(GPT " --trace-plot %s", latest),
            (const char *[]){"--trace-plot", "inside the checkpoint", NULL}, NULL);
    unchanged(latest, latest_text);
    /* The same through a symbolic link to the index. */
    char link[SUPPORT_PATH];
    assert_int_equal(symlink(index, support_path_in(link, dir, "index-link.json")), 0);
    refused(tool(GPT " --json %s", link), (const char *[]){"--json", "inside the checkpoint", NULL}, NULL);
    unchanged(index, index_text);
    free(index_text), free(latest_text);
    /* A --save directory not made yet is a checkpoint too: its latest is
     * no log (before: the log went there and the save failed after the
     * run). */
    char fresh[SUPPORT_PATH], fresh_latest[SUPPORT_PATH];
    support_path_in(fresh, dir, "new-ck");
    refused(tool(GPT " --save %s --log %s", fresh, support_path_in(fresh_latest, fresh, "latest")),
            (const char *[]){"--log", "--save", "inside the checkpoint", NULL}, NULL);
    assert_int_equal(access(fresh, F_OK), -1);
}

/* An output on the command's input: the training text under --trace or
 * --trace-plot, tokenize's own input shard under --out --overwrite on.
 * Refused naming both; the input as it was. */
static void test_outputs_never_on_inputs(void **state)
{
    (void)state;
    char text[SUPPORT_PATH];
    support_path_in(text, dir, "in.txt");
    write_text(text, "hello world, hello paths; the training text must stay as it is\n");
    char *before = text_of(text);
    const char *flags[] = {"--trace", "--trace-plot"};
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++) {
        refused(tool(GPT " --data %s %s %s", text, flags[i], text),
                (const char *[]){flags[i], "--data", "destroy the input", NULL}, NULL);
        unchanged(text, before);
    }
    free(before);

    char shards[SUPPORT_PATH], shard[SUPPORT_PATH];
    support_path_in(shards, dir, "shards");
    assert_int_equal(mkdir(shards, 0755), 0);
    support_path_in(shard, shards, "train_000000.bin");
    write_text(shard, "the shard tokenize would write over\n");
    before = text_of(shard);
    refused(tool("tokenize %s --out %s --overwrite on", shard, shards),
            (const char *[]){"--out", "TEXT", "destroy the input", NULL}, NULL);
    unchanged(shard, before);
    free(before);
}

/* Two outputs on one file, in every pairing of the later outputs, and
 * through a dangling link whose target another output makes: refused
 * naming both flags; nothing written. */
static void test_two_outputs_on_one_file(void **state)
{
    (void)state;
    char x[SUPPORT_PATH];
    support_path_in(x, dir, "x");
    const char *pairs[][2] = {{"--trace", "--json"}, {"--trace-plot", "--trace"},
                              {"--plot", "--trace-plot"}, {"--log", "--trace"}};
    for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++) {
        refused(tool(GPT " %s %s %s %s", pairs[i][0], x, pairs[i][1], x),
                (const char *[]){pairs[i][0], pairs[i][1], "name one file", NULL}, NULL);
        assert_int_equal(access(x, F_OK), -1);
    }
    char report[SUPPORT_PATH], log[SUPPORT_PATH];
    support_path_in(report, dir, "q.json");
    assert_int_equal(symlink("q.json", support_path_in(log, dir, "q2.jsonl")), 0);
    refused(tool(GPT " --json %s --log %s", report, log),
            (const char *[]){"--json", "--log", "name one file", NULL}, NULL);
    assert_int_equal(access(report, F_OK), -1);
}

/* A FIFO where a command reads: plot's log and --compare, tokenize's
 * text, --encoder's encoder.json (tokenize and sample), sample
 * --tokenizer.  Refused naming the flag and the FIFO, at once. */
static void test_fifo_inputs_never_waited_on(void **state)
{
    (void)state;
    char fifo[SUPPORT_PATH], log[SUPPORT_PATH], svg[SUPPORT_PATH], shards[SUPPORT_PATH];
    char encoder[SUPPORT_PATH], vocab_json[SUPPORT_PATH], merges[SUPPORT_PATH];
    support_path_in(fifo, dir, "fifo");
    assert_int_equal(mkfifo(fifo, 0644), 0);
    support_path_in(log, dir, "run.jsonl");
    write_text(log, "{\"step\":1,\"loss\":2.5}\n");
    support_path_in(svg, dir, "chart.svg");
    support_path_in(shards, dir, "shards");
    refused(tool("plot %s --out %s", fifo, svg), (const char *[]){"LOG", fifo, "FIFO", NULL}, NULL);
    refused(tool("plot %s --compare %s --out %s", log, fifo, svg),
            (const char *[]){"--compare", fifo, "FIFO", NULL}, NULL);
    refused(tool("tokenize %s --out %s", fifo, shards), (const char *[]){"TEXT", fifo, "FIFO", NULL}, NULL);
    refused(tool("sample --tokenizer %s", fifo), (const char *[]){"--tokenizer", fifo, "FIFO", NULL}, NULL);
    /* An encoder folder whose encoder.json is a FIFO. */
    support_path_in(encoder, dir, "encoder");
    assert_int_equal(mkdir(encoder, 0755), 0);
    assert_int_equal(mkfifo(support_path_in(vocab_json, encoder, "encoder.json"), 0644), 0);
    write_text(support_path_in(merges, encoder, "vocab.bpe"), "#version: 0.2\n");
    char text[SUPPORT_PATH];
    write_text(support_path_in(text, dir, "doc.txt"), "some text\n");
    refused(tool("tokenize %s --out %s --encoder %s", text, shards, encoder),
            (const char *[]){"--encoder", "encoder.json", "FIFO", NULL}, NULL);
    refused(tool("sample --encoder %s --tokens 1", encoder),
            (const char *[]){"--encoder", "encoder.json", "FIFO", NULL}, NULL);
    assert_int_equal(access(svg, F_OK), -1);
    assert_int_equal(access(shards, F_OK), -1);
}

/* Messages that name their cause: a --trace path refused as --trace (it
 * was labelled --json); a trace that cannot be written says the trace
 * (it said "the report"); a loop of links under sample --resume names
 * sample and --resume (it was labelled export). */
static void test_messages_name_the_real_flag(void **state)
{
    (void)state;
    char sub[SUPPORT_PATH];
    support_path_in(sub, dir, "sub");
    assert_int_equal(mkdir(sub, 0755), 0);
    refused(tool(GPT " --trace %s", sub), (const char *[]){"--trace", sub, "directory", NULL}, "--json");
    refused(tool(GPT " --trace /dev/null"), (const char *[]){"--trace", "/dev/null", NULL}, "--json");

    /* A trace past a file-size limit, as on a full disk. */
    char trace[SUPPORT_PATH];
    support_path_in(trace, dir, "t.json");
    struct rlimit old, small;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    small = old;
    small.rlim_cur = 4096;
    void (*was)(int) = signal(SIGXFSZ, SIG_IGN);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &small), 0);
    int rc = tool(GPT " --trace %s", trace);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, was);
    if (rc != 1) fail_msg("exit %d, want 1:\n%s", rc, out);
    if (!strstr(out, "--trace") || !strstr(out, "cannot write the trace") || strstr(out, "report"))
        fail_msg("the failed trace write is not named:\n%s", out);

    char loop[SUPPORT_PATH];
    assert_int_equal(symlink("loop", support_path_in(loop, dir, "loop")), 0);
    refused(tool("sample --resume %s --tokens 1", loop),
            (const char *[]){"sample", "--resume", "loop of symbolic links", NULL}, "export");
    /* A loop at the checkpoint's latest, below the directory given. */
    char ck[SUPPORT_PATH], latest[SUPPORT_PATH];
    checkpoint(ck);
    support_path_in(latest, ck, "latest");
    assert_int_equal(unlink(latest), 0);
    assert_int_equal(symlink("latest", latest), 0);
    rc = tool("sample --resume %s --tokens 1", ck);
    if (rc <= 0 || !strstr(out, "sample --resume") || strstr(out, "export"))
        fail_msg("exit %d, want a refusal naming sample --resume:\n%s", rc, out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_outputs_kept_out_of_checkpoints, setup, teardown),
        cmocka_unit_test_setup_teardown(test_outputs_never_on_inputs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_two_outputs_on_one_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fifo_inputs_never_waited_on, setup, teardown),
        cmocka_unit_test_setup_teardown(test_messages_name_the_real_flag, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
