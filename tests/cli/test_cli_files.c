/*
 * The files `spmd` writes and reads, against careless use: an output is a
 * regular file or a new path (a FIFO or a directory is refused before the
 * run, and left as it was); no output is an input of the same command or
 * another output of it; --save is checked before the first step and
 * locked against a second writer; --keep deletes only checkpoints; the
 * temporaries of a killed save are cleaned; a log that cannot be written
 * stops the run; a FIFO given as an input is refused, never waited on.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "support_files.h"
#include "support_tool.h"

#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef SPMD_TOOL_PATH
#error "SPMD_TOOL_PATH must name the spmd binary"
#endif
#ifndef SPMD_TEST_TOOL_PATH
#error "SPMD_TEST_TOOL_PATH must name spmd-test, the binary with the test hooks"
#endif

/* A small run: a few milliseconds a step. */
#define MLP "train --model mlp --steps 3 --eval 0"
#define GPT "train --steps 2 --eval 0 --dim 32 --heads 2 --seq 16 --batch 16 --layers 1"

static char *dir;
static char out[1 << 16];

static int setup(void **state)
{
    (void)state;
    dir = support_temp_dir("test_cli_files");
    return dir ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    support_drop_dir(dir);
    return 0;
}

/* The tool with printf-style arguments, stopped after 30 s (a run that
 * would block on a FIFO times out instead of hanging the suite). */
static int tool(const char *bin, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int tool(const char *bin, const char *fmt, ...)
{
    char args[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    tool_limits limits = {.timeout_s = 30};
    return support_run_tool(bin, args, &limits, out, sizeof out);
}

static void has(const char *part)
{
    if (!strstr(out, part)) fail_msg("no '%s' in:\n%s", part, out);
}

/* Refused with exit status `want` before any step ran, naming `parts`. */
static void refused(int rc, int want, const char *const *parts)
{
    if (rc != want) fail_msg("exit %d, want %d; output:\n%s", rc, want, out);
    for (; *parts; parts++) has(*parts);
    if (strstr(out, "step    1/")) fail_msg("refused only after running:\n%s", out);
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

/* A checkpoint of a small GPT at DIR/NAME, its step 2. */
static const char *checkpoint(char *ck, const char *name)
{
    support_path_in(ck, dir, name);
    int rc = tool(SPMD_TOOL_PATH, GPT " --save %s", ck);
    if (rc != 0) fail_msg("the checkpoint: exit %d\n%s", rc, out);
    return ck;
}

/* A FIFO or a directory as --log, --json, --plot, export --out, plot
 * --out: refused before the run, naming the file, which stays as it was. */
static void test_outputs_must_be_files(void **state)
{
    (void)state;
    char fifo[SUPPORT_PATH], ck[SUPPORT_PATH], log[SUPPORT_PATH];
    support_path_in(fifo, dir, "fifo");
    assert_int_equal(mkfifo(fifo, 0644), 0);
    const char *flags[] = {"--log", "--json", "--plot"};
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++) {
        refused(tool(SPMD_TOOL_PATH, MLP " %s %s", flags[i], fifo), 2,
                (const char *[]){flags[i], fifo, "not a regular file", NULL});
        assert_true(is_fifo(fifo));
        refused(tool(SPMD_TOOL_PATH, MLP " %s %s", flags[i], dir), 2,
                (const char *[]){flags[i], "directory", NULL});
    }
    refused(tool(SPMD_TOOL_PATH, MLP " --json ''"), 2, (const char *[]){"--json ''", "empty", NULL});
    refused(tool(SPMD_TOOL_PATH, "export %s --out %s", checkpoint(ck, "ck"), fifo), 2,
            (const char *[]){"--out", fifo, "not a regular file", NULL});
    assert_true(is_fifo(fifo));
    support_path_in(log, dir, "run.jsonl");
    write_text(log, "{\"step\":1,\"loss\":2.5}\n");
    refused(tool(SPMD_TOOL_PATH, "plot %s --out %s", log, fifo), 2,
            (const char *[]){"--out", fifo, "not a regular file", NULL});
    assert_true(is_fifo(fifo));
}

/* An output on an input of the same command, or two outputs on one file:
 * refused naming both flags; the input is as it was. */
static void test_outputs_apart_from_inputs_and_each_other(void **state)
{
    (void)state;
    char log[SUPPORT_PATH], x[SUPPORT_PATH], ck[SUPPORT_PATH], latest[SUPPORT_PATH];
    support_path_in(log, dir, "run.jsonl");
    const char *line = "{\"step\":1,\"loss\":2.5}\n";
    write_text(log, line);
    refused(tool(SPMD_TOOL_PATH, "plot %s --out %s", log, log), 2,
            (const char *[]){"--out", "LOG", "destroy the input", NULL});
    size_t len;
    char *text = support_read_file(log, &len);
    assert_string_equal(text, line);
    free(text);

    support_path_in(x, dir, "x");
    const char *pairs[][2] = {{"--log", "--json"}, {"--log", "--plot"}, {"--json", "--plot"}, {"--log", "--save"}};
    for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++) {
        refused(tool(SPMD_TOOL_PATH, MLP " %s %s %s %s", pairs[i][0], x, pairs[i][1], x), 2,
                (const char *[]){pairs[i][0], pairs[i][1], "name one file", NULL});
        assert_int_equal(access(x, F_OK), -1); /* nothing written */
    }
    /* One file under two names is still one file. */
    char alias[SUPPORT_PATH + 8];
    snprintf(alias, sizeof alias, "%s/./x", dir);
    refused(tool(SPMD_TOOL_PATH, MLP " --log %s --json %s", x, alias), 2,
            (const char *[]){"--log", "--json", "name one file", NULL});
    /* A text data set is an input of the run. */
    char data[SUPPORT_PATH];
    support_path_in(data, dir, "data.txt");
    write_text(data, "hello world, hello files\n");
    refused(tool(SPMD_TOOL_PATH, GPT " --data %s --log %s", data, data), 2,
            (const char *[]){"--log", "--data", NULL});

    checkpoint(ck, "ck");
    support_path_in(latest, ck, "latest");
    text = support_read_file(latest, &len);
    refused(tool(SPMD_TOOL_PATH, "export %s --out %s", ck, latest), 2,
            (const char *[]){"--out", "CKPT", "inside the checkpoint", NULL});
    char *after = support_read_file(latest, &len);
    assert_string_equal(after, text);
    free(after);
    free(text);
    /* A log of the run beside its checkpoints is fine; on `latest` it is not. */
    char beside[SUPPORT_PATH];
    int rc = tool(SPMD_TOOL_PATH, MLP " --save %s --log %s", ck, support_path_in(beside, ck, "train.jsonl"));
    if (rc != 0) fail_msg("a log beside the checkpoints: exit %d\n%s", rc, out);
    refused(tool(SPMD_TOOL_PATH, MLP " --save %s --log %s", ck, latest), 2,
            (const char *[]){"--log", "--save", NULL});
}

/* --save that cannot be a directory, or has no room for a checkpoint:
 * refused before the first step. */
static void test_save_checked_before_the_first_step(void **state)
{
    (void)state;
    char file[SUPPORT_PATH], under[SUPPORT_PATH + 8], fresh[SUPPORT_PATH + 8];
    support_path_in(file, dir, "plain");
    write_text(file, "not a directory\n");
    /* Usage errors (exit 2), as for every path flag. */
    refused(tool(SPMD_TOOL_PATH, MLP " --save %s", file), 2, (const char *[]){"--save", file, NULL});
    snprintf(under, sizeof under, "%s/sub", file);
    refused(tool(SPMD_TOOL_PATH, MLP " --save %s", under), 2, (const char *[]){"--save", under, NULL});
    refused(tool(SPMD_TOOL_PATH, MLP " --save ''"), 2, (const char *[]){"--save", "empty", NULL});
    /* A missing directory is made, parents and all. */
    snprintf(fresh, sizeof fresh, "%s/a/b", dir);
    int rc = tool(SPMD_TOOL_PATH, MLP " --save %s", fresh);
    if (rc != 0) fail_msg("exit %d\n%s", rc, out);
    has("checkpoint: step 3 saved");
    /* A file system without room for one checkpoint (spmd-test's
     * SPMD_TEST_FREE_BYTES stands for a full disk). */
    setenv("SPMD_TEST_FREE_BYTES", "4096", 1);
    rc = tool(SPMD_TEST_TOOL_PATH, MLP " --save %s", fresh);
    unsetenv("SPMD_TEST_FREE_BYTES");
    refused(rc, 1, (const char *[]){"--save", fresh, "a checkpoint of this run takes", "MiB free", NULL});
}

/* spmd-test TRAIN-ARGS in the background, paused in its first save (the
 * SPMD_TEST_SAVE_PAUSE hook) once its output, in `log`, says so. */
static pid_t start_paused(const char *args, const char *pause, const char *log)
{
    write_text(log, "");
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_APPEND);
        dup2(fd, 1);
        dup2(fd, 2);
        setenv("SPMD_TEST_SAVE_PAUSE", pause, 1);
        char cmd[4096];
        snprintf(cmd, sizeof cmd, "exec %s %s", SPMD_TEST_TOOL_PATH, args);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 600; i++) {
        size_t len;
        char *text = support_read_file(log, &len);
        bool paused = strstr(text, "paused after") != NULL;
        free(text);
        if (paused) return pid;
        struct timespec t = {0, 50 * 1000 * 1000};
        nanosleep(&t, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    fail_msg("the first run never paused");
    return -1;
}

/* A run saving into DIR holds its lock: a second is refused naming the
 * first's process.  Once the first is killed mid-save its lock holds
 * nothing, and the next run removes the temporary the kill left. */
static void test_one_writer_per_directory(void **state)
{
    (void)state;
    char ck[SUPPORT_PATH], log[SUPPORT_PATH], args[SUPPORT_PATH + 64], holder[64];
    support_path_in(ck, dir, "ck");
    support_path_in(log, dir, "first.log");
    snprintf(args, sizeof args, MLP " --save %s", ck);
    pid_t first = start_paused(args, "3:index.json", log);
    snprintf(holder, sizeof holder, "process %ld", (long)first);
    int rc = tool(SPMD_TOOL_PATH, MLP " --save %s", ck);
    kill(first, SIGKILL);
    waitpid(first, NULL, 0);
    refused(rc, 1, (const char *[]){ck, "in use", holder, NULL});
    assert_int_equal(support_count_entries(ck, ".tmp-step-"), 1);
    rc = tool(SPMD_TOOL_PATH, MLP " --save %s", ck);
    if (rc != 0) fail_msg("after the first was killed: exit %d\n%s", rc, out);
    has("removed 1 unfinished save");
    has("checkpoint: step 3 saved");
    assert_int_equal(support_count_entries(ck, ".tmp-step-"), 0);
}

/* --keep 1 deletes older checkpoints but not a step-* directory without
 * an index.json, nor one whose index.json is not a libspmd checkpoint's
 * index (a user's JSON, one cut short). */
static void test_keep_deletes_only_checkpoints(void **state)
{
    (void)state;
    char ck[SUPPORT_PATH], mine[SUPPORT_PATH], note[SUPPORT_PATH], step1[SUPPORT_PATH];
    support_path_in(ck, dir, "ck");
    assert_int_equal(mkdir(ck, 0755), 0);
    assert_int_equal(mkdir(support_path_in(mine, ck, "step-00000000"), 0755), 0);
    write_text(support_path_in(note, mine, "notes.txt"), "mine\n");
    const char *indexes[] = {"{\"experiment\": \"mine\", \"step\": 1}\n",
                             "{\"format\": \"libspmd-checkpoint\", \"vers"};
    char users[2][SUPPORT_PATH], index[SUPPORT_PATH];
    for (int i = 0; i < 2; i++) {
        char name[32];
        snprintf(name, sizeof name, "step-0000000%d", i + 1);
        assert_int_equal(mkdir(support_path_in(users[i], dir, name), 0755), 0);
        write_text(support_path_in(index, users[i], "index.json"), indexes[i]);
    }
    int rc = tool(SPMD_TOOL_PATH, MLP " --save %s --save-every 1 --keep 1", ck);
    if (rc != 0) fail_msg("exit %d\n%s", rc, out);
    assert_int_equal(access(note, F_OK), 0);
    assert_int_equal(access(support_path_in(step1, ck, "step-00000001"), F_OK), -1);
    /* The user's directories among the run's step-*: a run of 5 steps
     * resumed in a copy of the checkpoints with them beside. */
    char ck2[SUPPORT_PATH], step[SUPPORT_PATH];
    support_path_in(ck2, dir, "ck2");
    rc = tool(SPMD_TOOL_PATH, MLP " --save %s", ck2);
    if (rc != 0) fail_msg("exit %d\n%s", rc, out);
    for (int i = 0; i < 2; i++) {
        char name[32], to[SUPPORT_PATH];
        snprintf(name, sizeof name, "step-0000000%d", i + 1);
        assert_int_equal(rename(users[i], support_path_in(to, ck2, name)), 0);
        snprintf(users[i], sizeof users[i], "%s", to);
    }
    rc = tool(SPMD_TOOL_PATH, "train --model mlp --steps 5 --eval 0 --resume %s --save %s "
                              "--save-every 1 --keep 1", ck2, ck2);
    if (rc != 0) fail_msg("exit %d\n%s", rc, out);
    for (int i = 0; i < 2; i++) {
        if (access(support_path_in(index, users[i], "index.json"), F_OK) != 0)
            fail_msg("--keep 1 deleted %s, whose index.json is not a checkpoint's", users[i]);
    }
    assert_int_equal(access(support_path_in(step, ck2, "step-00000003"), F_OK), -1);
    assert_int_equal(access(support_path_in(step, ck2, "step-00000005"), F_OK), 0);
}

/* A log that cannot be written (here: past RLIMIT_FSIZE, as on a full
 * disk) stops the run at that step, exit 1, naming the log; the line cut
 * short is taken back, so the log holds whole lines only. */
static void test_log_write_error_stops_the_run(void **state)
{
    (void)state;
    char log[SUPPORT_PATH];
    support_path_in(log, dir, "run.jsonl");
    struct rlimit old, small;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    small = old;
    small.rlim_cur = 300; /* about two lines */
    void (*was)(int) = signal(SIGXFSZ, SIG_IGN);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &small), 0);
    int rc = tool(SPMD_TOOL_PATH, "train --model mlp --steps 50 --eval 0 --log %s", log);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, was);
    if (rc != 1) fail_msg("exit %d\n%s", rc, out);
    has("--log");
    has("cannot write the line of step");
    has("the run stops");
    if (strstr(out, "done:")) fail_msg("the run went on:\n%s", out);
    size_t len;
    char *text = support_read_file(log, &len);
    if (len == 0 || text[len - 1] != '\n') fail_msg("the log ends in a torn line:\n%s", text);
    int lines = 0;
    for (char *line = text, *end; (end = strchr(line, '\n')); line = end + 1, lines++)
        if (strncmp(line, "{\"step\":", 8) || end[-1] != '}') fail_msg("a line is not whole:\n%s", text);
    assert_true(lines >= 1);
    free(text);
    /* A torn line an earlier run left (a machine that went down) is
     * removed, saying so, before the next run appends. */
    FILE *f = fopen(log, "a");
    assert_non_null(f);
    fputs("{\"step\":115,\"loss\":1", f);
    assert_int_equal(fclose(f), 0);
    rc = tool(SPMD_TOOL_PATH, "train --model mlp --steps 2 --eval 0 --log %s", log);
    if (rc != 0) fail_msg("exit %d\n%s", rc, out);
    has("removed its torn last line (20 bytes");
    text = support_read_file(log, &len);
    if (strstr(text, "115")) fail_msg("the torn line is still there:\n%s", text);
    free(text);
}

/* A FIFO as --data, --val-data, --init, or in a checkpoint (latest,
 * index.json, a block file): refused as not a regular file, not waited on. */
static void test_fifo_inputs_refused(void **state)
{
    (void)state;
    char fifo[SUPPORT_PATH];
    support_path_in(fifo, dir, "in.txt");
    assert_int_equal(mkfifo(fifo, 0644), 0);
    const char *flags[] = {"--data", "--val-data", "--init"};
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++) {
        int rc = tool(SPMD_TOOL_PATH, GPT " %s %s", flags[i], fifo);
        if (rc <= 0) fail_msg("%s FIFO: exit %d\n%s", flags[i], rc, out);
        has("not a regular file");
    }
    const char *files[] = {"latest", "step-00000002/index.json", "step-00000002/dev-0000.safetensors"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char name[16], ck[SUPPORT_PATH], path[SUPPORT_PATH];
        snprintf(name, sizeof name, "ck%zu", i);
        checkpoint(ck, name);
        support_path_in(path, ck, files[i]);
        assert_int_equal(unlink(path), 0);
        assert_int_equal(mkfifo(path, 0644), 0);
        int rc = tool(SPMD_TOOL_PATH, GPT " --steps 4 --resume %s", ck);
        if (rc <= 0) fail_msg("%s a FIFO: exit %d\n%s", files[i], rc, out);
        has("not a regular file");
        rc = tool(SPMD_TOOL_PATH, "export %s --out %s/x.safetensors", ck, dir);
        if (rc <= 0) fail_msg("export, %s a FIFO: exit %d\n%s", files[i], rc, out);
        has("not a regular file");
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_outputs_must_be_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_outputs_apart_from_inputs_and_each_other, setup, teardown),
        cmocka_unit_test_setup_teardown(test_save_checked_before_the_first_step, setup, teardown),
        cmocka_unit_test_setup_teardown(test_one_writer_per_directory, setup, teardown),
        cmocka_unit_test_setup_teardown(test_keep_deletes_only_checkpoints, setup, teardown),
        cmocka_unit_test_setup_teardown(test_log_write_error_stops_the_run, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fifo_inputs_refused, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
