/*
 * The MPI collectives transport, through mpirun: each test runs
 * mpi_collectives_worker (tests/runtime/mpi_collectives_worker.c) on P processes
 * of L device threads and checks that it printed PASS and exited 0.
 * Every sum must be the canonical tree's bits; see the worker for what it
 * runs.  P = 2, 3, 4 with one device each (pure MPI), 2 x 4 and 4 x 2
 * (hierarchical: each process's members are aligned power-of-two runs, so
 * processes exchange partial sums), 2 x 3 and 3 x 2 (non-power-of-two:
 * raw members where a subtree spans processes), aborts, and the watchdog
 * (a process that never joins is named; a slow but moving collective is
 * not ended: 4.5 s in all under a 3 s limit).
 *
 * Every mpirun runs through scripts/mpirun.sh (support_mpi.h): under
 * `timeout 120`, oversubscribed (this machine may have fewer cores than
 * processes) and allowed to run as root.  Without MPI at build time the
 * tests are skipped, saying why.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "support_mpi.h"

#if defined(SPMD_MPIEXEC) && defined(SPMD_MPI_WORKER)

static void run_worker(int procs, int devices, const char *extra)
{
    char cmd[4096], mpirun[2048];
    /* scripts/mpirun.sh turns leak checking (in a sanitizer build) off for
     * the workers: Open MPI leaves its allocations to the exit;
     * test_collectives checks the library's own allocations. */
    snprintf(cmd, sizeof cmd, "%s -n %d '%s' --devices %d %s 2>&1",
             support_mpirun(mpirun, sizeof mpirun, 120), procs, SPMD_MPI_WORKER, devices, extra);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    static char out[1 << 16];
    size_t len = fread(out, 1, sizeof out - 1, f);
    out[len] = '\0';
    int status = pclose(f);
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    print_message("%s", out);
    if (support_mpi_timed_out(code)) fail_msg("%d x %d %s: timed out after 120 s", procs, devices, extra);
    if (code != 0 || !strstr(out, "\nPASS\n"))
        fail_msg("%d x %d %s: exit status %d (%s)", procs, devices, extra, code, cmd);
}

static void test_p2(void **state) { (void)state; run_worker(2, 1, ""); }
static void test_p3(void **state) { (void)state; run_worker(3, 1, ""); }
static void test_p4(void **state) { (void)state; run_worker(4, 1, ""); }
static void test_p2_hierarchical(void **state) { (void)state; run_worker(2, 4, ""); }
static void test_p4_hierarchical(void **state) { (void)state; run_worker(4, 2, ""); }
static void test_p2_uneven(void **state) { (void)state; run_worker(2, 3, ""); }
static void test_p3_uneven(void **state) { (void)state; run_worker(3, 2, ""); }
static void test_abort(void **state) { (void)state; run_worker(2, 1, "--abort"); }
static void test_abort_hierarchical(void **state) { (void)state; run_worker(3, 2, "--abort"); }
static void test_watchdog_stall(void **state) { (void)state; run_worker(2, 2, "--stall"); }
static void test_watchdog_slow(void **state) { (void)state; run_worker(4, 1, "--slow"); }

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_p2),
        cmocka_unit_test(test_p3),
        cmocka_unit_test(test_p4),
        cmocka_unit_test(test_p2_hierarchical),
        cmocka_unit_test(test_p4_hierarchical),
        cmocka_unit_test(test_p2_uneven),
        cmocka_unit_test(test_p3_uneven),
        cmocka_unit_test(test_abort),
        cmocka_unit_test(test_abort_hierarchical),
        cmocka_unit_test(test_watchdog_stall),
        cmocka_unit_test(test_watchdog_slow),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#else

static void test_mpi(void **state)
{
    (void)state;
    print_message("built without MPI (CMake did not find it): the MPI transport is not "
                  "built and not tested; apt-get install libopenmpi-dev openmpi-bin\n");
    skip();
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_mpi)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#endif
