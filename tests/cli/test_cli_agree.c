/*
 * Processes that must agree: a launch whose two processes' command lines
 * differ in a setting (as `mpirun -n 1 spmd A : -n 1 spmd B` would start
 * them) is refused by every process, before anything is compiled or
 * measured, naming the setting and both values, exit 2; settings that are
 * each process's own (--threads) may differ.  Input files are compared by
 * their bytes: one relative --data name that names two files (a working
 * directory each) is refused naming both digests and hosts.
 *
 * The two command lines are started by rank (`mpirun -n 2 sh -c ...`
 * picks A for process 0, B for process 1), not with mpirun's colon:
 * Debian 13's mpirun (Open MPI 5.0.7) crashes on a colon-separated launch
 * before starting anything (scripts/mpirun.sh).  Every mpirun runs
 * through that script: under `timeout`, oversubscribed and allowed to run
 * as root.  Without MPI at build time the tests are skipped, saying why.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "support_files.h"
#include "support_mpi.h"
#include "support_tool.h"

#if defined(SPMD_MPIEXEC) && defined(SPMD_TOOL_PATH)

enum { TIMEOUT_S = 60 };

static char out[1 << 16];

/* `spmd A` as process 0 and `spmd B` as process 1; the job's exit status.
 * Each process's rank comes from mpirun's environment (both releases set
 * OMPI_COMM_WORLD_RANK and PMIX_RANK). */
static int run_mpmd(const char *a, const char *b)
{
    char cmd[8192], mpirun[2048];
    snprintf(cmd, sizeof cmd,
             "%s -n 2 sh -c 'if [ \"${OMPI_COMM_WORLD_RANK:-$PMIX_RANK}\" = 0 ]; "
             "then exec \"$0\" %s; else exec \"$0\" %s; fi' '%s'",
             support_mpirun(mpirun, sizeof mpirun, TIMEOUT_S), a, b, SPMD_TOOL_PATH);
    int rc = support_run_tool("env", cmd, NULL, out, sizeof out);
    if (support_mpi_timed_out(rc))
        fail_msg("timed out after %d s: spmd %s : spmd %s\n%s", TIMEOUT_S, a, b, out);
    return rc;
}

/* `spmd ARGS` as both processes, process 0 in directory `a` and process
 * 1 in `b` (an MPMD launch with a working directory each, or hosts whose
 * files differ); the job's exit status. */
static int run_in_dirs(const char *a, const char *b, const char *args)
{
    char cmd[8192], mpirun[2048];
    snprintf(cmd, sizeof cmd,
             "%s -n 2 sh -c 'if [ \"${OMPI_COMM_WORLD_RANK:-$PMIX_RANK}\" = 0 ]; "
             "then cd \"%s\"; else cd \"%s\"; fi && exec \"$0\" %s' '%s'",
             support_mpirun(mpirun, sizeof mpirun, TIMEOUT_S), a, b, args, SPMD_TOOL_PATH);
    int rc = support_run_tool("env", cmd, NULL, out, sizeof out);
    if (support_mpi_timed_out(rc)) fail_msg("timed out after %d s: spmd %s\n%s", TIMEOUT_S, args, out);
    return rc;
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

/* One relative --data name, two files (each process's working directory
 * holds its own): refused by both processes before the step is compiled,
 * naming the file, both digests and the hosts; the same bytes in both
 * places train. */
static void test_input_files_by_content(void **state)
{
    (void)state;
    char *top = support_temp_dir("test_cli_agree"), a[SUPPORT_PATH], b[SUPPORT_PATH], f[SUPPORT_PATH];
    assert_int_equal(mkdir(support_path_in(a, top, "a"), 0755), 0);
    assert_int_equal(mkdir(support_path_in(b, top, "b"), 0755), 0);
    write_text(support_path_in(f, a, "data.txt"), "the first text, read by process 0 alone\n");
    write_text(support_path_in(f, b, "data.txt"), "another text, which process 1 reads\n");
    const char *args = "train --steps 2 --eval 0 --dim 32 --heads 2 --seq 8 --batch 8 --layers 1 "
                       "--data data.txt";
    int rc = run_in_dirs(a, b, args);
    for (int p = 0; p < 2; p++) {
        char line[256];
        snprintf(line, sizeof line, "spmd: process %d: process 1 on host ", p);
        if (!strstr(out, line)) fail_msg("no '%s' in:\n%s", line, out);
    }
    const char *parts[] = {"reads --data data.txt as crc32 ", "(36 bytes), process 0 on host ",
                           "(40 bytes): every process must read the same files"};
    for (size_t i = 0; i < sizeof parts / sizeof *parts; i++)
        if (!strstr(out, parts[i])) fail_msg("no '%s' in:\n%s", parts[i], out);
    assert_int_equal(rc, 2);
    assert_null(strstr(out, "done: loss"));
    /* The same bytes: trained on. */
    write_text(support_path_in(f, b, "data.txt"), "the first text, read by process 0 alone\n");
    rc = run_in_dirs(a, b, args);
    if (rc != 0) fail_msg("the same files: exit %d\n%s", rc, out);
    support_drop_dir(top);
}

/* `extra` on process 1 only: refused by both processes, naming the flag
 * with process 1's value `theirs` and process 0's `ours`. */
static void refused(const char *command, const char *extra, const char *flag, const char *theirs,
                    const char *ours)
{
    char b[1024], said[512];
    snprintf(b, sizeof b, "%s %s", command, extra);
    int rc = run_mpmd(command, b);
    snprintf(said, sizeof said, "process 1 was started with %s %s, process 0 with %s %s", flag,
             theirs, flag, ours);
    for (int p = 0; p < 2; p++) {
        char line[640];
        snprintf(line, sizeof line, "spmd: process %d: %s", p, said);
        if (!strstr(out, line)) fail_msg("no '%s' in:\n%s", line, out);
    }
    assert_int_equal(rc, 2);
    /* Refused before the step was compiled or the network measured. */
    assert_null(strstr(out, "done: loss"));
    assert_null(strstr(out, "free()"));
}

static const char *const train = "train --steps 3 --eval 0";

static void test_batch(void **state) { (void)state; refused(train, "--batch 8", "--batch", "8", "32"); }
static void test_lr(void **state) { (void)state; refused(train, "--lr 0.01", "--lr", "0.01", "0.003"); }
static void test_steps(void **state)
{
    (void)state;
    refused(train, "--steps 4", "--steps", "4", "3");
}
static void test_dim(void **state) { (void)state; refused(train, "--dim 64", "--dim", "64", "96"); }
/* The in-flight budget changes when collectives run: one plan for all. */
static void test_inflight_mib(void **state)
{
    (void)state;
    refused("explain --overlap on", "--inflight-mib 1", "--inflight-mib", "1", "0");
}
static void test_prompt(void **state)
{
    (void)state;
    refused("sample --tokens 3 --prompt 1+2", "--prompt 4+4", "--prompt", "'1+2' '4+4'", "'1+2'");
}
/* A different command: named as the first setting. */
static void test_command(void **state)
{
    (void)state;
    int rc = run_mpmd("explain", "train");
    if (!strstr(out, "process 1 was started with command spmd train, process 0 with command spmd "
                     "explain"))
        fail_msg("no command named in:\n%s", out);
    assert_int_equal(rc, 2);
}
/* Each process's own thread count may differ: the plan is printed. */
static void test_threads_may_differ(void **state)
{
    (void)state;
    int rc = run_mpmd("explain --threads 2", "explain --threads 1");
    if (rc != 0) fail_msg("exit %d:\n%s", rc, out);
    assert_non_null(strstr(out, "processes: 2 x 4 devices"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch),     cmocka_unit_test(test_lr),
        cmocka_unit_test(test_steps),     cmocka_unit_test(test_dim),
        cmocka_unit_test(test_prompt),    cmocka_unit_test(test_command),
        cmocka_unit_test(test_inflight_mib),
        cmocka_unit_test(test_threads_may_differ),
        cmocka_unit_test(test_input_files_by_content),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#else

static void test_skipped(void **state)
{
    (void)state;
    print_message("built without MPI (or without the tool): an MPMD launch is not tested\n");
    skip();
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_skipped)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#endif
