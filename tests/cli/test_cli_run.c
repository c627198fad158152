/*
 * `spmd train` when a run goes wrong: a diverging loss, more memory than
 * the machine has, a report path nothing can be written to, a report
 * write that fails, a signal mid-run, and plans that deserve a warning.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

/* Sanitizers reserve terabytes of address space: no ulimit -v under them. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#else
#define SANITIZED 0
#endif

#include "support_tool.h"

#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <poll.h>
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

/* Each test works in a directory of its own, so that a report's
 * temporary files would show. */
static char dir[64], report[96];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "test_cli_run_XXXXXX");
    if (!mkdtemp(dir)) return -1;
    snprintf(report, sizeof report, "%s/report.json", dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) remove(path);
    }
    if (d) closedir(d);
    rmdir(dir);
    return 0;
}

static int entries(const char *path)
{
    DIR *d = opendir(path);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

/* A file's bytes, NUL-terminated; the length, or -1 when it cannot be read. */
static long slurp(const char *path, char *buf, size_t size)
{
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    size_t n = fread(buf, 1, size - 1, f);
    fclose(f);
    buf[n] = '\0';
    return (long)n;
}

static cJSON *load_report(void)
{
    static char text[1 << 20];
    assert_true(slurp(report, text, sizeof text) > 0);
    cJSON *j = cJSON_Parse(text);
    assert_non_null(j);
    return j;
}

static const cJSON *item(const cJSON *j, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!v) fail_msg("the report has no \"%s\"", key);
    return v;
}

/* ---- A run to act on while it goes ---------------------------------------------- */

/* The tool with its output on a pipe, for tests that signal it mid-run or
 * start it under a file-size limit (support_run_tool does neither). */
typedef struct child {
    pid_t pid;
    int out;
    char text[1 << 16]; /* the output's latest part */
    size_t len;
} child;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Start the tool with `args` (NULL-terminated); file_limit > 0 sets its
 * RLIMIT_FSIZE, with SIGXFSZ ignored so that writes past it fail (EFBIG)
 * rather than kill it. */
static void child_start(child *c, const char *const *args, rlim_t file_limit)
{
    const char *argv[40] = {SPMD_TOOL_PATH};
    int n = 0;
    for (; args[n]; n++) {
        assert_true(n + 2 < 40);
        argv[n + 1] = args[n];
    }
    argv[n + 1] = NULL;
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    fflush(NULL); /* nothing buffered here gets written twice */
    c->pid = fork();
    assert_true(c->pid >= 0);
    if (c->pid == 0) {
        dup2(fds[1], STDOUT_FILENO);
        dup2(fds[1], STDERR_FILENO);
        close(fds[0]);
        close(fds[1]);
        if (file_limit) {
            struct rlimit r = {file_limit, file_limit};
            signal(SIGXFSZ, SIG_IGN);
            setrlimit(RLIMIT_FSIZE, &r);
        }
        execv(SPMD_TOOL_PATH, (char *const *)argv);
        _exit(127);
    }
    close(fds[1]);
    c->out = fds[0];
    c->len = 0;
    c->text[0] = '\0';
}

/* Read its output until it holds `want` (NULL: until it ends); false if
 * `seconds` pass first.  A full buffer drops its older half. */
static bool child_read(child *c, const char *want, double seconds)
{
    double deadline = now_s() + seconds;
    while (!want || !strstr(c->text, want)) {
        double left = deadline - now_s();
        if (left <= 0) return false;
        struct pollfd p = {.fd = c->out, .events = POLLIN};
        int ready = poll(&p, 1, (int)(left * 1e3) + 1);
        if (ready < 0 && errno == EINTR) continue;
        assert_true(ready >= 0);
        if (ready == 0) continue;
        char buf[4096];
        ssize_t got = read(c->out, buf, sizeof buf);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return !want;
        if (c->len + (size_t)got >= sizeof c->text) {
            size_t keep = sizeof c->text / 2;
            memmove(c->text, c->text + c->len - keep, keep);
            c->len = keep;
        }
        memcpy(c->text + c->len, buf, (size_t)got);
        c->len += (size_t)got;
        c->text[c->len] = '\0';
    }
    return true;
}

/* The rest of its output and its exit status; minus the signal that
 * killed it; -1000 when it is still going after `seconds` (then killed). */
static int child_finish(child *c, double seconds)
{
    bool ended = child_read(c, NULL, seconds);
    if (!ended) kill(c->pid, SIGKILL);
    close(c->out);
    int status = 0;
    while (waitpid(c->pid, &status, 0) < 0) assert_int_equal(errno, EINTR);
    if (!ended) return -1000;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

/* ---- Divergence ------------------------------------------------------------------- */

/* A learning rate of 1e30 makes the loss NaN within a few steps: the run
 * stops there, exits 3, names the step, reports no accuracy, and the
 * report records the stop; --on-nonfinite continue runs every step. */
static void test_divergence_stops_the_run(void **state)
{
    (void)state;
    static char out[1 << 16];
    char args[256];
    snprintf(args, sizeof args, "train --lr 1e30 --steps 20 --eval 64 --json %s", report);
    int rc = run_tool(args, out, sizeof out);
    if (rc != 3) fprintf(stderr, "%s\n", out);
    assert_int_equal(rc, 3);
    cJSON *j = load_report();
    const cJSON *stopped = item(j, "stopped");
    int step = (int)item(stopped, "step")->valuedouble;
    char reason[32];
    snprintf(reason, sizeof reason, "%s", item(stopped, "reason")->valuestring);
    assert_true(step >= 1 && step < 20);
    assert_true(strstr(reason, "nan") || strstr(reason, "inf"));
    assert_int_equal((int)item(j, "steps")->valuedouble, step);
    assert_int_equal(cJSON_GetArraySize(item(j, "loss")), step);
    assert_null(cJSON_GetObjectItemCaseSensitive(j, "accuracy"));
    cJSON_Delete(j);
    char named[64];
    snprintf(named, sizeof named, "step %d: %s", step, reason);
    assert_non_null(strstr(out, named));
    assert_null(strstr(out, "accuracy"));

    snprintf(args, sizeof args, "train --lr 1e30 --steps 20 --eval 64 --on-nonfinite continue --json %s",
             report);
    rc = run_tool(args, out, sizeof out);
    if (rc != 0) fprintf(stderr, "%s\n", out);
    assert_int_equal(rc, 0);
    j = load_report();
    assert_int_equal(cJSON_GetArraySize(item(j, "loss")), 20);
    assert_null(cJSON_GetObjectItemCaseSensitive(j, "stopped"));
    cJSON_Delete(j);
}

/* ---- Memory ------------------------------------------------------------------------- */

/* 8 devices x about 450 GiB: more than any machine running these tests
 * has.  Refused before anything is allocated, with the figure and what to
 * change.  The address-space cap only keeps a tool without the check from
 * taking the machine down; MemAvailable is what refuses it.  --memory-check
 * off skips the check (and the compiler then fails to allocate). */
static void test_memory_beyond_the_machine_refused(void **state)
{
    (void)state;
    static char out[1 << 16];
    const char *big = "train --seq 100000 --batch 64 --dim 1024 --heads 8 --layers 8 --steps 1";
    tool_limits cap = {.timeout_s = 60, .max_address_space = SANITIZED ? 0 : (size_t)4 << 30};
    int rc = support_run_tool(SPMD_TOOL_PATH, big, &cap, out, sizeof out);
    if (rc != 2) fprintf(stderr, "%s\n", out);
    assert_int_equal(rc, 2);
    assert_non_null(strstr(out, "not enough memory"));
    assert_non_null(strstr(out, "GiB per device x 8 devices"));
    assert_non_null(strstr(out, "available"));
    assert_non_null(strstr(out, "--checkpoint on"));
    assert_null(strstr(out, "ms/step  eta"));

    if (SANITIZED) return; /* unchecked, the run would need the cap it cannot have */
    char args[256];
    snprintf(args, sizeof args, "%s --memory-check off", big);
    rc = support_run_tool(SPMD_TOOL_PATH, args, &cap, out, sizeof out);
    assert_int_not_equal(rc, 0);
    assert_null(strstr(out, "not enough memory"));
}

/* Under a 384 MiB address-space limit (ulimit -v), a run that maps about
 * 570 MiB is refused up front, naming the limit. */
static void test_address_space_limit_respected(void **state)
{
    (void)state;
    if (SANITIZED) skip(); /* sanitizers reserve terabytes of address space */
    static char out[1 << 16];
    tool_limits cap = {.timeout_s = 60, .max_address_space = (size_t)384 << 20};
    int rc = support_run_tool(SPMD_TOOL_PATH, "train --seq 400 --batch 64 --steps 1 --eval 0", &cap, out,
                              sizeof out);
    if (rc != 2) fprintf(stderr, "%s\n", out);
    assert_int_equal(rc, 2);
    assert_non_null(strstr(out, "ulimit -v"));
    assert_non_null(strstr(out, "--memory-check off"));
    assert_null(strstr(out, "ms/step  eta"));
}

/* ---- The report ------------------------------------------------------------------- */

/* A --json path nothing can be written to is refused before the first
 * step, naming it; /dev/full stays the device it is. */
static void test_report_path_checked_before_the_run(void **state)
{
    (void)state;
    static char out[1 << 16];
    char missing[128];
    snprintf(missing, sizeof missing, "%s/no/such/dir/r.json", dir);
    const char *paths[] = {"/proc/spmd_test_report.json", dir, "/dev/full", missing};
    for (int i = 0; i < 4; i++) {
        char args[256];
        snprintf(args, sizeof args, "train --steps 3 --eval 0 --json %s", paths[i]);
        int rc = run_tool(args, out, sizeof out);
        if (rc == 0 || !strstr(out, paths[i]) || strstr(out, "ms/step  eta"))
            fail_msg("--json %s: exit %d, output:\n%s", paths[i], rc, out);
    }
    struct stat st;
    assert_int_equal(stat("/dev/full", &st), 0);
    assert_true(S_ISCHR(st.st_mode));
    assert_int_equal(entries(dir), 0);
}

/* With a 2 KiB file-size limit the report cannot be written: the run
 * fails saying why, the earlier report is left whole, and no temporary
 * file stays behind. */
static void test_report_written_atomically(void **state)
{
    (void)state;
    static char out[1 << 16], before[1 << 16], after[1 << 16];
    char args[256];
    snprintf(args, sizeof args, "train --steps 2 --eval 0 --json %s", report);
    int rc = run_tool(args, out, sizeof out);
    if (rc != 0) fprintf(stderr, "%s\n", out);
    assert_int_equal(rc, 0);
    long size = slurp(report, before, sizeof before);
    assert_true(size > 2048); /* else the limit below would not bite */

    const char *limited[] = {"train", "--steps", "3", "--eval", "0", "--json", report, NULL};
    child c;
    child_start(&c, limited, 2048);
    rc = child_finish(&c, 60);
    if (rc <= 0) fail_msg("exit %d, output:\n%s", rc, c.text);
    assert_non_null(strstr(c.text, report));
    assert_non_null(strstr(c.text, strerror(EFBIG)));
    assert_int_equal(slurp(report, after, sizeof after), size);
    assert_string_equal(after, before);
    assert_int_equal(entries(dir), 1);
}

/* ---- Signals -------------------------------------------------------------------- */

/* A long run signalled once it has printed its first step: it finishes
 * the step under way, says so, writes the report with every loss so far
 * and exits 128 + the signal. */
static void interrupt_run(int sig, const char *name)
{
    const char *args[] = {"train", "--model", "mlp", "--mesh", "1", "--axes", "data", "--steps", "1000000",
                          "--eval", "0", "--json", report, NULL};
    child c;
    child_start(&c, args, 0);
    if (!child_read(&c, "ms/step  eta", 60)) {
        child_finish(&c, 0);
        fail_msg("no step within 60 s:\n%s", c.text);
    }
    assert_int_equal(kill(c.pid, sig), 0);
    int rc = child_finish(&c, 30);
    if (rc != 128 + sig) fail_msg("%s: exit %d, output:\n%s", name, rc, c.text);
    char said[64];
    snprintf(said, sizeof said, "interrupted by %s after step ", name);
    const char *at = strstr(c.text, said);
    assert_non_null(at);
    int step = atoi(at + strlen(said));
    assert_true(step >= 1);
    assert_non_null(strstr(c.text, report));

    cJSON *j = load_report();
    const cJSON *stopped = item(j, "stopped");
    assert_int_equal((int)item(stopped, "step")->valuedouble, step);
    assert_string_equal(item(stopped, "reason")->valuestring, name);
    const cJSON *loss = item(j, "loss");
    assert_int_equal(cJSON_GetArraySize(loss), step);
    for (int i = 0; i < step; i++) assert_true(cJSON_IsNumber(cJSON_GetArrayItem(loss, i)));
    cJSON_Delete(j);
}

static void test_sigint_stops_after_the_step(void **state)
{
    (void)state;
    interrupt_run(SIGINT, "SIGINT");
}

static void test_sigterm_stops_after_the_step(void **state)
{
    (void)state;
    interrupt_run(SIGTERM, "SIGTERM");
}

/* Signalled twice inside a step of seconds (one thread, batch 1024): the
 * first signal waits for the step, the second ends the process at once. */
static void test_second_signal_ends_at_once(void **state)
{
    (void)state;
    const char *args[] = {"train", "--mesh", "1", "--axes", "data", "--batch", "1024", "--threads", "1",
                          "--steps", "1000", "--eval", "0", NULL};
    child c;
    child_start(&c, args, 0);
    /* The header is out just before the first step starts. */
    if (!child_read(&c, "per device:", 60)) {
        child_finish(&c, 0);
        fail_msg("no header within 60 s:\n%s", c.text);
    }
    usleep(300 * 1000);
    assert_int_equal(kill(c.pid, SIGINT), 0);
    usleep(200 * 1000); /* handled before the next: signals do not queue */
    int status;
    assert_int_equal(waitpid(c.pid, &status, WNOHANG), 0);
    double t0 = now_s();
    assert_int_equal(kill(c.pid, SIGINT), 0);
    int rc = child_finish(&c, 30);
    if (rc != -SIGINT) fail_msg("exit %d, output:\n%s", rc, c.text);
    assert_true(now_s() - t0 < 0.5);
    assert_null(strstr(c.text, "ms/step  eta"));
}

/* ---- Logs ------------------------------------------------------------------------------- */

/* Output to a pipe (not a terminal): one plain line at the first step,
 * every --log-every steps and the last, no carriage return; --log appends
 * one JSON object per step whose losses are the report's. */
static void test_plain_progress_and_jsonl_log(void **state)
{
    (void)state;
    static char out[1 << 16];
    char args[512], log[128];
    snprintf(log, sizeof log, "%s/log.jsonl", dir);
    snprintf(args, sizeof args, "train --model mlp --mesh 1 --axes data --steps 25 --eval 0 "
             "--log-every 10 --log %s --json %s", log, report);
    int rc = run_tool(args, out, sizeof out);
    if (rc != 0) fail_msg("exit %d:\n%s", rc, out);
    assert_null(strchr(out, '\r'));
    int lines = 0;
    for (const char *at = out; (at = strstr(at, "ms/step  eta")); at++) lines++;
    assert_int_equal(lines, 4); /* steps 1, 10, 20, 25 */
    const char *want[] = {"\nstep    1/25 ", "\nstep   10/25 ", "\nstep   20/25 ", "\nstep   25/25 "};
    for (int i = 0; i < 4; i++)
        if (!strstr(out, want[i])) fail_msg("no \"%s\" in:\n%s", want[i] + 1, out);

    /* Twice: the log is appended to. */
    assert_int_equal(run_tool(args, out, sizeof out), 0);
    cJSON *j = load_report();
    const cJSON *loss = item(j, "loss");
    static char text[1 << 16];
    assert_true(slurp(log, text, sizeof text) > 0);
    int n = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"), n++) {
        cJSON *o = cJSON_Parse(line);
        if (!o) fail_msg("line %d is not JSON: %s", n + 1, line);
        assert_int_equal((int)item(o, "step")->valuedouble, n % 25 + 1);
        assert_true((float)item(o, "loss")->valuedouble == (float)cJSON_GetArrayItem(loss, n % 25)->valuedouble);
        assert_true(cJSON_IsNumber(item(o, "lr")) && cJSON_IsNumber(item(o, "grad_norm")));
        assert_true(item(o, "ms")->valuedouble > 0 && item(o, "tokens_per_s")->valuedouble > 0);
        cJSON_Delete(o);
    }
    assert_int_equal(n, 50);
    cJSON_Delete(j);

    snprintf(args, sizeof args, "train --steps 1 --log %s", dir); /* a directory */
    assert_int_equal(run_tool(args, out, sizeof out), 2);
    assert_non_null(strstr(out, "it is a directory, not a file"));
}

/* ---- Warnings ----------------------------------------------------------------------- */

/* Batch 7 over the 8 devices of the default mesh: padded blocks and
 * whole-tensor gathers, both said before the first step; a batch of 32
 * has neither. */
static void test_plan_warnings(void **state)
{
    (void)state;
    static char out[1 << 16];
    int rc = run_tool("train --batch 7 --steps 1 --eval 0", out, sizeof out);
    if (rc != 0) fprintf(stderr, "%s\n", out);
    assert_int_equal(rc, 0);
    const char *uneven = strstr(out, "batch 7 does not divide over the 8 devices of (replica, fsdp): "
                                     "blocks of 1 with padding");
    const char *gathers = strstr(out, "whole-tensor gathers an op forced");
    const char *first_step = strstr(out, "ms/step  eta");
    assert_non_null(uneven);
    assert_non_null(gathers);
    assert_non_null(strstr(out, " more (spmd explain lists them)"));
    assert_non_null(first_step);
    assert_true(uneven < first_step && gathers < first_step);

    rc = run_tool("train --steps 1 --eval 0", out, sizeof out);
    assert_int_equal(rc, 0);
    assert_null(strstr(out, "warning"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_divergence_stops_the_run, setup, teardown),
        cmocka_unit_test_setup_teardown(test_memory_beyond_the_machine_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_address_space_limit_respected, setup, teardown),
        cmocka_unit_test_setup_teardown(test_report_path_checked_before_the_run, setup, teardown),
        cmocka_unit_test_setup_teardown(test_report_written_atomically, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sigint_stops_after_the_step, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sigterm_stops_after_the_step, setup, teardown),
        cmocka_unit_test_setup_teardown(test_second_signal_ends_at_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_plain_progress_and_jsonl_log, setup, teardown),
        cmocka_unit_test_setup_teardown(test_plan_warnings, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
