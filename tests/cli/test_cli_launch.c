/*
 * `spmd launch`: the mpirun line it builds (--dry-run on, against a
 * stand-in mpirun that says it is Open MPI 4.1 or 5, so both releases'
 * lines are checked on any machine), what it refuses, how it watches the
 * job end (stand-ins that print Open MPI's abort notice and then hang, or
 * exit 0; the launcher killed or signalled), and a real 2-process local
 * launch of `spmd train` with the same losses, bit for bit, as the same
 * run under plain mpirun (scripts/mpirun.sh), and of a run whose process
 * fails.  A host cut off mid-run is test_multihost's (network
 * namespaces).  Every run is under a timeout.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "support_files.h"
#include "support_json.h"
#include "support_mpi.h"
#include "support_tool.h"

#ifdef SPMD_TOOL_PATH

static char *dir;
static char out[1 << 16];
static char tool[PATH_MAX]; /* the tool's real path: the line names it so */
static char fake4[SUPPORT_PATH], fake5[SUPPORT_PATH], fake_log[SUPPORT_PATH];

/* A stand-in mpirun: --version says `version`; otherwise it does what
 * $FAKE_DO says, writing what it saw to $FAKE_LOG:
 *   args        print its arguments, one a line, and exit 0
 *   abort-hang  print Open MPI 4.1's abort notice (error code 3) and wait
 *               forever, counting SIGTERMs (the second ends it)
 *   abort-0     print 5.0's notice (error code 4) and exit 0
 *   lost-0      print PRRTE's lost-daemon notice and exit 0
 *   wait        wait; a SIGTERM ends it, exit 143 */
static void write_fake(const char *path, const char *version)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f,
            "#!/bin/sh\n"
            "[ \"$1\" = --version ] && { echo 'mpirun (Open MPI) %s'; exit 0; }\n"
            "echo started >>\"$FAKE_LOG\"\n"
            "case \"$FAKE_DO\" in\n"
            "args) printf '%%s\\n' \"$@\";;\n"
            "abort-hang) printf 'MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD\\n"
            "with errorcode 3.\\n' >&2\n"
            "  n=0; trap 'n=$((n+1)); echo TERM >>\"$FAKE_LOG\"; [ $n -ge 2 ] && exit 143' TERM\n"
            "  while :; do sleep 0.05; done;;\n"
            "abort-0) printf 'MPI_ABORT was invoked on rank 0 in communicator MPI_COMM_WORLD\\n"
            "  Proc: [[1,1],0]\\n  Errorcode: 4\\n' >&2; exit 0;;\n"
            "lost-0) echo 'PRTE has lost communication with a remote daemon.' >&2; exit 0;;\n"
            "wait) trap 'echo TERM >>\"$FAKE_LOG\"; exit 143' TERM\n"
            "  while :; do sleep 0.05; done;;\n"
            "esac\n",
            version);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(chmod(path, 0755), 0);
}

static int setup(void **state)
{
    (void)state;
    dir = support_temp_dir("spmd-launch");
    assert_non_null(realpath(SPMD_TOOL_PATH, tool));
    write_fake(support_path_in(fake4, dir, "mpirun4"), "4.1.4");
    write_fake(support_path_in(fake5, dir, "mpirun5"), "5.0.7");
    support_path_in(fake_log, dir, "fake.log");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    support_drop_dir(dir);
    return 0;
}

/* `spmd launch --dry-run on ARGS` with extra environment `env`: its
 * output, the line, in out; fails on a non-zero exit. */
static void dry_run(const char *env, const char *args)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "-u SLURM_JOB_NODELIST -u SLURM_NODELIST -u SLURM_NTASKS "
             "-u SLURM_TASKS_PER_NODE %s '%s' launch --dry-run on %s", env, SPMD_TOOL_PATH, args);
    int rc = support_run_tool("env", cmd, NULL, out, sizeof out);
    if (rc != 0) fail_msg("exit %d: launch %s\n%s", rc, args, out);
}

/* The line is exactly `want` (after the mpirun's path), `self` the
 * spmd's real path. */
static void expect_line(const char *mpirun, const char *want)
{
    char line[8192];
    snprintf(line, sizeof line, "%s %s\n", mpirun, want);
    char *self = strstr(line, "SPMD");
    if (self) {
        char rest[8192];
        snprintf(rest, sizeof rest, "%s", self + 4);
        snprintf(self, sizeof line - (size_t)(self - line), "%s%s", tool, rest);
    }
    if (strcmp(out, line)) fail_msg("the line is\n%swant\n%s", out, line);
}

#define KEEPALIVE4                                                                                 \
    "--mca oob_tcp_keepalive_time 60 --mca oob_tcp_keepalive_intvl 20 "                           \
    "--mca oob_tcp_keepalive_probes 6"
#define KEEPALIVE5                                                                                 \
    "--prtemca oob_tcp_keepalive_time 60 --prtemca oob_tcp_keepalive_intvl 20 "                   \
    "--prtemca oob_tcp_keepalive_probes 6"

/* On this host alone: -n, by slot, oversubscribed (the processes share
 * the cores), not bound, the keepalive; a program as given. */
static void test_line_on_this_host(void **state)
{
    (void)state;
    char args[2048];
    snprintf(args, sizeof args, "--mpirun %s -n 2 -- python3 'my script.py' --x 1", fake4);
    dry_run("", args);
    expect_line(fake4, "-n 2 --map-by slot --oversubscribe --bind-to none " KEEPALIVE4
                       " python3 'my script.py' --x 1");
    /* Open MPI 5: PRRTE's settings and spelling. */
    snprintf(args, sizeof args, "--mpirun %s --per-host 3 python3 s.py", fake5);
    dry_run("", args);
    expect_line(fake5, "-n 3 --map-by slot:OVERSUBSCRIBE --bind-to none " KEEPALIVE5
                       " python3 s.py");
}

/* A command of spmd runs this spmd, by its real path; its flags follow it
 * untouched, with or without "--" (a spmd built without MPI refuses). */
static void test_line_spmd_command(void **state)
{
    (void)state;
#ifdef SPMD_MPIEXEC
    char args[2048];
    snprintf(args, sizeof args, "--mpirun %s -n 2 -- train --mesh 4x2 --steps 5", fake4);
    dry_run("", args);
    expect_line(fake4, "-n 2 --map-by slot --oversubscribe --bind-to none " KEEPALIVE4
                       " SPMD train --mesh 4x2 --steps 5");
    snprintf(args, sizeof args, "-n=2 --mpirun=%s sample --tokens 3 -n 4", fake4);
    dry_run("", args);
    expect_line(fake4, "-n 2 --map-by slot --oversubscribe --bind-to none " KEEPALIVE4
                       " SPMD sample --tokens 3 -n 4");
#else
    /* A spmd without MPI would run P unrelated one-process jobs. */
    char args[2048], cmd[4096];
    snprintf(args, sizeof args, "--mpirun %s -n 2 -- train --steps 5", fake4);
    snprintf(cmd, sizeof cmd, "launch %s", args);
    int rc = run_tool(cmd, out, sizeof out);
    if (rc != 2 || !strstr(out, "this spmd was built without MPI: its train cannot run over "
                                "processes"))
        fail_msg("exit %d, want the refusal of a spmd without MPI:\n%s", rc, out);
#endif
}

/* Hosts: a list with its slots or --per-host's, a hostfile (by slot, or
 * ppr with --per-host), the subnet on both TCP layers, --env and --mca
 * passed on, each release's spelling. */
static void test_line_hosts(void **state)
{
    (void)state;
    char args[4096], hostfile[SUPPORT_PATH];
    snprintf(args, sizeof args,
             "--mpirun %s --hosts node1:4,node-2:4 --subnet 10.1.0.0/24 --env PYTHONPATH "
             "--env A=b --mca plm_rsh_agent='/x y/agent' -- python3 s.py", fake4);
    dry_run("", args);
    expect_line(fake4, "-n 8 --host node1:4,node-2:4 --map-by slot --bind-to none " KEEPALIVE4
                       " --mca btl_tcp_if_include 10.1.0.0/24 --mca oob_tcp_if_include "
                       "10.1.0.0/24 -x PYTHONPATH -x A=b --mca plm_rsh_agent '/x y/agent' "
                       "python3 s.py");
    snprintf(args, sizeof args, "--mpirun %s --hosts a,b,c --per-host 2 -n 5 --subnet eth1 p", fake5);
    dry_run("", args);
    expect_line(fake5, "-n 5 --host a:2,b:2,c:2 --map-by slot --bind-to none " KEEPALIVE5
                       " --mca btl_tcp_if_include eth1 --prtemca oob_tcp_if_include eth1 p");
    FILE *f = fopen(support_path_in(hostfile, dir, "hosts"), "w");
    assert_non_null(f);
    fputs("a slots=4\nb slots=4\n", f);
    assert_int_equal(fclose(f), 0);
    snprintf(args, sizeof args, "--mpirun %s --hosts %s p", fake4, hostfile);
    dry_run("", args);
    char want[4096];
    snprintf(want, sizeof want, "--hostfile %s --map-by slot --bind-to none " KEEPALIVE4 " p",
             hostfile);
    expect_line(fake4, want);
    snprintf(args, sizeof args, "--mpirun %s --hosts %s --per-host 2 p", fake4, hostfile);
    dry_run("", args);
    snprintf(want, sizeof want, "--hostfile %s --map-by ppr:2:node --bind-to none " KEEPALIVE4 " p",
             hostfile);
    expect_line(fake4, want);
}

/* Inside a Slurm allocation: its compressed host list expanded, each
 * host's tasks as its slots, SLURM_NTASKS processes; --hosts wins. */
static void test_line_slurm(void **state)
{
    (void)state;
    char args[2048];
    const char *slurm = "SLURM_JOB_NODELIST='n[01-03],gpu7,r[1-2]-x[9-10]' "
                        "SLURM_TASKS_PER_NODE='2(x3),1,1(x4)' SLURM_NTASKS=10";
    snprintf(args, sizeof args, "--mpirun %s p", fake4);
    dry_run(slurm, args);
    expect_line(fake4, "-n 10 --host n01:2,n02:2,n03:2,gpu7:1,r1-x9:1,r1-x10:1,r2-x9:1,r2-x10:1 "
                       "--map-by slot --bind-to none " KEEPALIVE4 " p");
    /* Without the per-node counts: the tasks spread evenly. */
    dry_run("SLURM_JOB_NODELIST='a,b' SLURM_NTASKS=3", args);
    expect_line(fake4, "-n 3 --host a:2,b:1 --map-by slot --bind-to none " KEEPALIVE4 " p");
    snprintf(args, sizeof args, "--mpirun %s --hosts c:1 p", fake4);
    dry_run(slurm, args);
    expect_line(fake4, "-n 1 --host c:1 --map-by slot --bind-to none " KEEPALIVE4 " p");
}

/* `spmd launch ARGS` is refused (exit 2) saying each of the texts. */
static void refused(const char *args, const char *a, const char *b)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "-u SLURM_JOB_NODELIST -u SLURM_NODELIST '%s' launch %s",
             SPMD_TOOL_PATH, args);
    int rc = support_run_tool("env", cmd, NULL, out, sizeof out);
    if (rc != 2 || !strstr(out, a) || (b && !strstr(out, b)))
        fail_msg("launch %s: exit %d, want 2 with '%s'%s%s:\n%s", args, rc, a, b ? " and " : "",
                 b ? b : "", out);
}

static void test_refusals(void **state)
{
    (void)state;
    char args[2048];
    snprintf(args, sizeof args, "--mpirun %s -n 2", fake4);
    refused(args, "launch needs a command", NULL);
    snprintf(args, sizeof args, "--mpirun %s --hosts a:2,b:2 -n 5 p", fake4);
    refused(args, "-n 5 is more than the 4 slots of the 2 hosts of --hosts a:2,b:2", NULL);
    snprintf(args, sizeof args, "--mpirun %s --hosts 'a b:2' p", fake4);
    refused(args, "--hosts a b:2", "is not HOST or HOST:SLOTS");
    snprintf(args, sizeof args, "--mpirun %s --hosts a:0 p", fake4);
    refused(args, "'a:0' is not HOST or HOST:SLOTS", NULL);
    snprintf(args, sizeof args, "--mpirun %s --hosts %s/none p", fake4, dir);
    refused(args, "/none: No such file or directory", NULL);
    snprintf(args, sizeof args, "--mpirun %s --hosts %s p", fake4, dir);
    refused(args, "not a regular file", NULL);
    snprintf(args, sizeof args, "--mpirun %s -n 2 -n 3 --per-host 2 p", fake4);
    refused(args, "-n 3 and --per-host 2 on one host", NULL);
    refused("--mca btl p", "--mca wants KEY=VALUE", "got 'btl'");
    refused("--env 1X p", "--env wants NAME or NAME=VALUE", "got '1X'");
    refused("--mpirun /bin/echo p", "--mpirun /bin/echo: not Open MPI's mpirun",
            "echo (GNU coreutils)");
    snprintf(args, sizeof args, "--mpirun %s/none p", dir);
    refused(args, "/none: cannot run it: No such file or directory", NULL);
    snprintf(args, sizeof args, "--mpirun %s --subnet '10.0.0.0/8 x' p", fake4);
    refused(args, "--subnet '10.0.0.0/8 x': not a network", NULL);
    snprintf(args, sizeof args, "--mpirun %s -- plot log.jsonl", fake4);
    refused(args, "spmd plot does not run over processes", NULL);
    refused("--steps 3 -- train", "unknown flag '--steps' for spmd launch", NULL);
    const char *slurm_bad[][2] = {
        {"SLURM_JOB_NODELIST='n[1-'", "an unclosed or empty '['"},
        {"SLURM_JOB_NODELIST='n[3-1]'", "'3-1' in 'n[3-1]' is not a number or a range"},
        {"SLURM_JOB_NODELIST='a,b' SLURM_TASKS_PER_NODE='2(x3)'", "counts 3 hosts"},
        {"SLURM_JOB_NODELIST='a' SLURM_TASKS_PER_NODE='x'", "'x' is not N or N(xM)"},
    };
    for (size_t i = 0; i < sizeof slurm_bad / sizeof *slurm_bad; i++) {
        char cmd[4096];
        snprintf(cmd, sizeof cmd, "%s '%s' launch --mpirun %s p", slurm_bad[i][0], SPMD_TOOL_PATH,
                 fake4);
        int rc = support_run_tool("env", cmd, NULL, out, sizeof out);
        if (rc != 2 || !strstr(out, slurm_bad[i][1]))
            fail_msg("%s: exit %d, want 2 with '%s':\n%s", slurm_bad[i][0], rc, slurm_bad[i][1], out);
    }
}

/* ---- Watching the job -------------------------------------------------------------------- */

/* The stand-in run through the launcher, doing `what`; the exit status,
 * the output in out, its log truncated first. */
static int watched(const char *what, const char *flags)
{
    remove(fake_log);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "FAKE_DO=%s FAKE_LOG='%s' timeout -k 5 60 '%s' launch --mpirun %s %s p",
             what, fake_log, SPMD_TOOL_PATH, fake4, flags);
    return support_run_tool("env", cmd, NULL, out, sizeof out);
}

static int count_in_log(const char *word)
{
    size_t len = 0;
    struct stat st;
    if (stat(fake_log, &st) != 0) return 0;
    char *text = support_read_file(fake_log, &len);
    int n = 0;
    for (const char *p = text; (p = strstr(p, word)); p++) n++;
    free(text);
    return n;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* mpirun that has printed the abort notice and does not end is ended
 * once --abort-wait has passed (a SIGTERM, then a second); the exit
 * status is the abort's error code, and the launcher says why. */
static void test_aborted_job_that_hangs_is_ended(void **state)
{
    (void)state;
    double t0 = now_s();
    int rc = watched("abort-hang", "--abort-wait 0.5");
    double took = now_s() - t0;
    if (rc != 3) fail_msg("exit %d, want the abort's 3:\n%s", rc, out);
    assert_non_null(strstr(out, "MPI_ABORT was invoked on rank 1")); /* passed through */
    assert_non_null(strstr(out, "spmd: launch: the job aborted"));
    assert_non_null(strstr(out, "ending mpirun"));
    assert_int_equal(count_in_log("TERM"), 2);
    if (took > 10) fail_msg("ended %.1f s after it started", took);
}

/* Open MPI 5.0.7's mpirun exits 0 after an abort or a lost daemon: the
 * launcher does not. */
static void test_exit_0_after_an_abort_is_not_success(void **state)
{
    (void)state;
    int rc = watched("abort-0", "");
    if (rc != 4) fail_msg("exit %d, want the abort's 4:\n%s", rc, out);
    assert_non_null(strstr(out, "mpirun exited 0 after a process called MPI_Abort: exit 4"));
    rc = watched("lost-0", "");
    if (rc != 1) fail_msg("exit %d, want 1:\n%s", rc, out);
    assert_non_null(strstr(out, "mpirun exited 0 after losing a host's daemon"));
    rc = watched("args", "");
    assert_int_equal(rc, 0);
}

/* The launcher in the background, its pid; the stand-in started. */
static pid_t start_launcher(void)
{
    remove(fake_log);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "FAKE_DO=wait FAKE_LOG='%s' exec '%s' launch --mpirun %s p >/dev/null 2>&1",
             fake_log, SPMD_TOOL_PATH, fake4);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 200 && !count_in_log("started"); i++) usleep(25 * 1000);
    assert_int_equal(count_in_log("started"), 1);
    return pid;
}

static bool log_says_within(const char *word, int want, double seconds)
{
    for (double t0 = now_s(); now_s() - t0 < seconds; usleep(25 * 1000))
        if (count_in_log(word) == want) return true;
    return false;
}

/* SIGTERM to the launcher reaches mpirun once, and its status is the
 * launcher's; the launcher killed outright leaves no job behind (mpirun
 * gets SIGTERM). */
static void test_signals_reach_mpirun(void **state)
{
    (void)state;
    pid_t pid = start_launcher();
    assert_int_equal(kill(pid, SIGTERM), 0);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 143);
    assert_int_equal(count_in_log("TERM"), 1);

    pid = start_launcher();
    assert_int_equal(kill(pid, SIGKILL), 0);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!log_says_within("TERM", 1, 5)) fail_msg("mpirun outlived its killed launcher");
}

/* ---- Real launches ------------------------------------------------------------------------ */

#ifdef SPMD_MPIEXEC

enum { TIMEOUT_S = 120 };
/* What scripts/mpirun.sh gives mpirun: root allowed, IPv4 only. */
#define MPI_ENV "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "                       \
                "OMPI_MCA_btl_tcp_disable_family=6 ASAN_OPTIONS=detect_leaks=0 "

/* `TOOL launch -n 2 -- ARGS` under a timeout; its exit status. */
static int launch_two(const char *tool_path, const char *env, const char *args)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, MPI_ENV "%s timeout -k 10 %d '%s' launch --mpirun '%s' -n 2 -- %s", env,
             TIMEOUT_S, tool_path, SPMD_MPIEXEC, args);
    int rc = support_run_tool("env", cmd, NULL, out, sizeof out);
    if (rc == 124 || rc == 137) fail_msg("timed out after %d s: launch %s\n%s", TIMEOUT_S, args, out);
    return rc;
}

static void losses(const char *report, float *loss, int *n)
{
    cJSON *j = support_load_json(report);
    const cJSON *v;
    *n = 0;
    cJSON_ArrayForEach(v, cJSON_GetObjectItemCaseSensitive(j, "loss"))
    {
        assert_true(*n < 16 && cJSON_IsNumber(v));
        loss[(*n)++] = (float)v->valuedouble;
    }
    cJSON_Delete(j);
}

/* 2 processes on this host through the launcher: the losses of the same
 * run under plain mpirun, bit for bit, and the line printed. */
static void test_two_processes_same_bits(void **state)
{
    (void)state;
    const char *run = "train --mesh 2x2 --axes replica,fsdp --steps 6 --eval 0 --batch 8 --seq 8 "
                      "--dim 16 --heads 2 --layers 1 --threads 1 --json";
    char a[SUPPORT_PATH], b[SUPPORT_PATH], args[4096], mpirun[2048];
    support_path_in(a, dir, "launched.json");
    support_path_in(b, dir, "mpirun.json");
    snprintf(args, sizeof args, "%s %s", run, a);
    int rc = launch_two(SPMD_TOOL_PATH, "", args);
    if (rc != 0) fail_msg("launch: exit %d\n%s", rc, out);
    char said[PATH_MAX + 256];
    snprintf(said, sizeof said, "spmd launch: %s -n 2 --map-by slot", SPMD_MPIEXEC);
    if (!strstr(out, said)) fail_msg("no '%s' in\n%s", said, out);
    snprintf(args, sizeof args, "%s -n 2 '%s' %s %s", support_mpirun(mpirun, sizeof mpirun, TIMEOUT_S),
             SPMD_TOOL_PATH, run, b);
    rc = support_run_tool("env", args, NULL, out, sizeof out);
    if (rc != 0) fail_msg("mpirun: exit %d\n%s", rc, out);
    float la[16], lb[16];
    int na, nb;
    losses(a, la, &na);
    losses(b, lb, &nb);
    assert_int_equal(na, 6);
    assert_int_equal(nb, 6);
    for (int s = 0; s < 6; s++)
        if (memcmp(&la[s], &lb[s], sizeof *la))
            fail_msg("step %d: launched %.9g, mpirun %.9g", s + 1, (double)la[s], (double)lb[s]);
}

/* A process that fails ends the job with its message, and the launcher's
 * status is not 0. */
static void test_failing_process_ends_the_job(void **state)
{
    (void)state;
    int rc = launch_two(SPMD_TEST_TOOL_PATH, "SPMD_TEST_BAD_TOKEN=1:2",
                        "train --mesh 2 --axes data --steps 50 --eval 0 --batch 8 --seq 8 --dim 16 "
                        "--heads 2 --layers 1 --threads 1");
    if (rc == 0 || !strstr(out, "spmd: process 1: step 2 failed"))
        fail_msg("exit %d, want a failure naming process 1's step 2:\n%s", rc, out);
    assert_null(strstr(out, "done: loss"));
}

#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_line_on_this_host),
        cmocka_unit_test(test_line_spmd_command),
        cmocka_unit_test(test_line_hosts),
        cmocka_unit_test(test_line_slurm),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_aborted_job_that_hangs_is_ended),
        cmocka_unit_test(test_exit_0_after_an_abort_is_not_success),
        cmocka_unit_test(test_signals_reach_mpirun),
#ifdef SPMD_MPIEXEC
        cmocka_unit_test(test_two_processes_same_bits),
        cmocka_unit_test(test_failing_process_ends_the_job),
#endif
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

#else

static void test_skipped(void **state)
{
    (void)state;
    print_message("built without the tool: spmd launch is not tested\n");
    skip();
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_skipped)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#endif
