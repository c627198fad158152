/*
 * Paths as a kind, by construction: the flag table declares what every
 * path names (flag_spec.h's path_kind), and the tool holds each path to
 * its kind's rules (tools/paths.c).  This test walks the table itself:
 *
 *   - every row whose value names a file or a directory declares a kind,
 *     and every operand does (paths_undeclared); a row planted without
 *     one, as a new flag would be written, is caught, naming it;
 *   - every declared input of every command, given a FIFO, is refused at
 *     once naming the flag (never waited on), and every declared output,
 *     given a FIFO, is refused and the FIFO left as it was;
 *   - every pair of train's output files on one file is refused, and
 *     each on the run's text and on a checkpoint's `latest`.
 *
 * So a path flag added with its kind gets these rules and these tests,
 * and one added without is a failure here.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "flag_table.h"
#include "paths.h"
#include "support_files.h"
#include "support_tool.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef SPMD_TOOL_PATH
#error "SPMD_TOOL_PATH must name the spmd binary"
#endif

static char *dir;
static char out[1 << 16];

static int setup(void **state)
{
    (void)state;
    dir = support_temp_dir("test_path_kinds");
    return dir ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    support_drop_dir(dir);
    return 0;
}

/* ---- The table ---------------------------------------------------------------------------- */

static void test_usage_words(void **state)
{
    (void)state;
    const char *paths[] = {"FILE", "DIR", "PATH", "FILE.json", "LOG.jsonl", "FILE.svg", "FILE|none"};
    const char *others[] = {"N", "X", "NAME", "TEXT", "A-B|N", "on|off", "SHAPE", "PATTERN=SPEC",
                            "AXIS|none", "sgd|adamw|adam|rmsprop|adagrad", "FILES"};
    for (size_t i = 0; i < sizeof paths / sizeof *paths; i++)
        if (!paths_value_names_path(paths[i])) fail_msg("'%s' names a path", paths[i]);
    for (size_t i = 0; i < sizeof others / sizeof *others; i++)
        if (paths_value_names_path(others[i])) fail_msg("'%s' names no path", others[i]);
}

static void test_every_path_declared(void **state)
{
    (void)state;
    char why[512];
    const char *bad = paths_undeclared(flag_rows, flag_row_count, flag_commands, flag_command_count,
                                       why, sizeof why);
    if (bad) fail_msg("%s", bad);
}

/* A new flag of train written without a path kind, and a command whose
 * operand has none: each caught, naming it. */
static void test_planted_path_without_kind_fails(void **state)
{
    (void)state;
    int n = flag_row_count;
    flag_spec *rows = calloc((size_t)n + 1, sizeof *rows);
    assert_non_null(rows);
    memcpy(rows, flag_rows, (size_t)n * sizeof *rows);
    rows[n] = (flag_spec){.name = "--dump", .commands = CMD_TRAIN, .kind = FLAG_TEXT,
                          .offset = offsetof(cli_opts, json), .value = "FILE.bin",
                          .help = "write the weights at the end"};
    char why[512];
    const char *bad = paths_undeclared(rows, n + 1, flag_commands, flag_command_count, why, sizeof why);
    if (!bad || !strstr(bad, "--dump") || !strstr(bad, "no path kind"))
        fail_msg("the planted row was not caught: %s", bad ? bad : "(nothing)");
    /* Declared, it passes; a kind on a value that names no path fails. */
    rows[n].path = PATH_OUT_FILE;
    assert_null(paths_undeclared(rows, n + 1, flag_commands, flag_command_count, why, sizeof why));
    rows[n].value = "N";
    assert_non_null(paths_undeclared(rows, n + 1, flag_commands, flag_command_count, why, sizeof why));
    free(rows);

    int m = flag_command_count;
    command_spec *commands = calloc((size_t)m + 1, sizeof *commands);
    assert_non_null(commands);
    memcpy(commands, flag_commands, (size_t)m * sizeof *commands);
    commands[m] = (command_spec){.command = CMD_PLOT, .name = "merge", .operand = "LOG.jsonl",
                                 .operand_noun = "log", .operands = true};
    bad = paths_undeclared(flag_rows, flag_row_count, commands, m + 1, why, sizeof why);
    if (!bad || !strstr(bad, "merge")) fail_msg("the planted operand was not caught");
    free(commands);
}

/* ---- Every declared path, held to its kind ------------------------------------------------ */

/* The tool under a deadline, so a FIFO waited on fails instead of hanging. */
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

static bool is_fifo(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISFIFO(st.st_mode);
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

/* The files a command's run needs, made once. */
typedef struct fixture {
    char fifo[SUPPORT_PATH], fifo_dir[SUPPORT_PATH], log[SUPPORT_PATH], text[SUPPORT_PATH];
    char ck[SUPPORT_PATH], svg[SUPPORT_PATH], shards[SUPPORT_PATH];
} fixture;

static void make_fixture(fixture *f)
{
    support_path_in(f->fifo, dir, "fifo");
    assert_int_equal(mkfifo(f->fifo, 0644), 0);
    /* A directory whose every file is a FIFO, for the directory inputs. */
    support_path_in(f->fifo_dir, dir, "fifos");
    assert_int_equal(mkdir(f->fifo_dir, 0755), 0);
    for (int i = 0; i < flag_row_count; i++)
        for (const char *const *name = flag_rows[i].path_files; name && *name; name++) {
            char p[SUPPORT_PATH];
            if (access(support_path_in(p, f->fifo_dir, *name), F_OK) != 0)
                assert_int_equal(mkfifo(p, 0644), 0);
        }
    support_path_in(f->log, dir, "run.jsonl");
    write_text(f->log, "{\"step\":1,\"loss\":2.5}\n");
    support_path_in(f->text, dir, "doc.txt");
    write_text(f->text, "some text for the paths to read, and then some more of it\n");
    support_path_in(f->svg, dir, "chart.svg");
    support_path_in(f->shards, dir, "shards");
    support_path_in(f->ck, dir, "ck");
    int rc = tool("train --model mlp --steps 2 --eval 0 --save %s", f->ck);
    if (rc != 0) fail_msg("the checkpoint: exit %d\n%s", rc, out);
}

/* A run of `command` that reads and writes what it needs, with `extra`
 * after its flags (a flag given twice: the later one counts) and
 * `operand` for its operand (NULL: its usual one). */
static int run(const fixture *f, cli_command command, const char *extra, const char *operand)
{
    switch (command) {
    case CMD_TRAIN: return tool("train --model mlp --steps 2 --eval 0 %s", extra);
    case CMD_EXPLAIN: return tool("explain --model mlp %s", extra);
    case CMD_SAMPLE: return tool("sample --tokens 1 --mesh 1 --axes data %s", extra);
    case CMD_EXPORT: return tool("export %s --out %s/x.st %s", operand ? operand : f->ck, dir, extra);
    case CMD_PLOT: return tool("plot %s --out %s %s", operand ? operand : f->log, f->svg, extra);
    case CMD_TOKENIZE:
        return tool("tokenize %s --out %s %s", operand ? operand : f->text, f->shards, extra);
    case CMD_VISUALIZE: return tool("visualize --shape 8 --spec None %s", extra);
    case CMD_LAUNCH: return tool("launch --dry-run on %s -- train --model mlp --steps 1", extra);
    }
    return -1;
}

/* What a FIFO given as a path of `kind` is refused as: a file (a
 * directory input's files too) says what it is; a directory, that it is
 * none. */
static const char *refusal(path_kind kind)
{
    return kind == PATH_IN_CHECKPOINT || kind == PATH_OUT_DIR || kind == PATH_OUT_CHECKPOINT
               ? "not a directory"
               : "FIFO";
}

static void expect_refused(int rc, const char *what, const char *flag, const char *why, const char *fifo)
{
    if (rc == TOOL_TIMED_OUT) fail_msg("%s: still running after 20 s (waiting on a FIFO?)", what);
    if (rc != 2 || !strstr(out, flag) || !strstr(out, why))
        fail_msg("%s: exit %d, want 2 naming %s and '%s':\n%s", what, rc, flag, why, out);
    if (!is_fifo(fifo)) fail_msg("%s: the FIFO was replaced", what);
}

static void test_every_declared_path_refuses_a_fifo(void **state)
{
    (void)state;
    fixture f;
    make_fixture(&f);
    int checked = 0;
    for (int c = 0; c < flag_command_count; c++) {
        const command_spec *cs = &flag_commands[c];
        for (int i = 0; i < flag_row_count; i++) {
            const flag_spec *fs = &flag_rows[i];
            if (!(fs->commands & cs->command) || fs->path == PATH_NONE) continue;
            const char *given = fs->path == PATH_IN_DIR ? f.fifo_dir : f.fifo;
            char extra[SUPPORT_PATH + 64], what[128];
            snprintf(extra, sizeof extra, "%s %s", fs->name, given);
            snprintf(what, sizeof what, "spmd %s %s FIFO", cs->name, fs->name);
            expect_refused(run(&f, cs->command, extra, NULL), what, fs->name, refusal(fs->path), f.fifo);
            checked++;
        }
        if (cs->operand_path != PATH_NONE) {
            char what[128];
            snprintf(what, sizeof what, "spmd %s FIFO (its %s)", cs->name, cs->operand);
            expect_refused(run(&f, cs->command, "", f.fifo), what, f.fifo, refusal(cs->operand_path), f.fifo);
            checked++;
        }
    }
    assert_true(checked >= 20);
}

/* train's output files: each pair on one file, each on the run's text
 * and on a checkpoint's latest, all refused naming both. */
static void test_every_train_output_kept_apart(void **state)
{
    (void)state;
    fixture f;
    make_fixture(&f);
    const char *outs[16];
    int n = 0;
    for (int i = 0; i < flag_row_count && n < 16; i++)
        if ((flag_rows[i].commands & CMD_TRAIN) && flag_rows[i].path == PATH_OUT_FILE)
            outs[n++] = flag_rows[i].name;
    assert_true(n >= 5);
    char x[SUPPORT_PATH], latest[SUPPORT_PATH], what[128];
    support_path_in(x, dir, "x");
    support_path_in(latest, f.ck, "latest");
    for (int a = 0; a < n; a++) {
        for (int b = a + 1; b < n; b++) {
            snprintf(what, sizeof what, "%s x %s x", outs[a], outs[b]);
            int rc = tool("train --model mlp --steps 2 --eval 0 %s %s %s %s", outs[a], x, outs[b], x);
            if (rc != 2 || !strstr(out, outs[a]) || !strstr(out, outs[b]) || !strstr(out, "name one file"))
                fail_msg("%s: exit %d:\n%s", what, rc, out);
            assert_int_equal(access(x, F_OK), -1);
        }
        int rc = tool("train --model mlp --steps 2 --eval 0 --seq 8 --data %s %s %s", f.text, outs[a], f.text);
        if (rc != 2 || !strstr(out, outs[a]) || !strstr(out, "--data"))
            fail_msg("%s on --data: exit %d:\n%s", outs[a], rc, out);
        rc = tool("train --model mlp --steps 2 --eval 0 %s %s", outs[a], latest);
        if (rc != 2 || !strstr(out, outs[a]) || !strstr(out, "inside the checkpoint"))
            fail_msg("%s on a checkpoint's latest: exit %d:\n%s", outs[a], rc, out);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_usage_words),
        cmocka_unit_test(test_every_path_declared),
        cmocka_unit_test(test_planted_path_without_kind_fails),
        cmocka_unit_test_setup_teardown(test_every_declared_path_refuses_a_fifo, setup, teardown),
        cmocka_unit_test_setup_teardown(test_every_train_output_kept_apart, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
