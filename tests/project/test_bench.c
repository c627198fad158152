/*
 * What the benchmarks tell and leave behind (docs/benchmarks.md):
 * bench_gemm reports the OpenBLAS core the library really loaded, the one
 * this process's own BLAS reports too, and says that an inherited
 * OPENBLAS_CORETYPE naming another is not used, and times every GEMM
 * backend in one run; bench_checkpoint writes
 * its checkpoint under $TMPDIR (a shrunken shape here) and leaves nothing
 * there or in its working directory, and refuses an unusable $TMPDIR with
 * the cause.  The benchmarks are built only where SPMD_BUILD_BENCH is on
 * (CMakeLists.txt then passes SPMD_BENCH_DIR); elsewhere this skips.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "runtime/blas.h"
#include "support_files.h"
#include "support_tool.h"

#ifdef SPMD_BENCH_DIR
enum { OUT = 1 << 14 };

static char out[OUT];

/* bench/NAME with `args`, run by env (so `args` may start with VAR=value
 * and -C DIR), under a timeout. */
static int run_bench(const char *env_args, const char *name, const char *args)
{
    char cmd[4 * SUPPORT_PATH];
    int n = snprintf(cmd, sizeof cmd, "%s \"%s/%s\" %s 2>&1", env_args, SPMD_BENCH_DIR, name, args);
    assert_true(n > 0 && (size_t)n < sizeof cmd);
    tool_limits limits = {.timeout_s = 300};
    return support_run_tool("env", cmd, &limits, out, sizeof out);
}
#endif

static void test_gemm_reports_the_core_loaded(void **state)
{
    (void)state;
#ifndef SPMD_BENCH_DIR
    print_message("note: benchmarks not built (SPMD_BUILD_BENCH=OFF)\n");
    skip();
#else
    if (blas_init(BLAS_AUTO, NULL) != SPMD_OK || strncmp(blas_name(), "OpenBLAS", 8) != 0) {
        print_message("note: no OpenBLAS here (%s): no core to report\n", blas_name());
        skip();
    }
    /* The core this process's OpenBLAS runs: "OpenBLAS 0.3.21 (Cooperlake)". */
    const char *open = strrchr(blas_name(), '(');
    assert_non_null(open);
    char core[64], want[128];
    snprintf(core, sizeof core, "%.*s", (int)strcspn(open + 1, ")"), open + 1);
    /* An inherited core type other than the one loaded: Prescott, unless
     * this CPU is that old. */
    const char *inherited = strcasecmp(core, "Prescott") ? "Prescott" : "Haswell";
    char env_args[128];
    snprintf(env_args, sizeof env_args, "OPENBLAS_CORETYPE=%s", inherited);
    int rc = run_bench(env_args, "bench_gemm", "--info");
    if (rc != 0) fail_msg("bench_gemm --info failed (%d):\n%s", rc, out);
    snprintf(want, sizeof want, "core loaded: %s (", core);
    if (!strstr(out, want)) fail_msg("bench_gemm does not report the core loaded, %s:\n%s", core, out);
    snprintf(want, sizeof want, "OPENBLAS_CORETYPE=%s in the environment is not used", inherited);
    if (!strstr(out, want)) fail_msg("bench_gemm does not say %s:\n%s", want, out);
#endif
}

/* bench_gemm times every backend, the shape classes too, in one run. */
static void test_gemm_bench_times_every_backend(void **state)
{
    (void)state;
#ifndef SPMD_BENCH_DIR
    print_message("note: benchmarks not built (SPMD_BUILD_BENCH=OFF)\n");
    skip();
#else
    int rc = run_bench("", "bench_gemm", "--quick");
    if (rc != 0) fail_msg("bench_gemm --quick failed (%d):\n%s", rc, out);
    static const char *const want[] = {"BLIS: ", "oneDNN: ", "bf16 GEMMs by default: ",
                                       "oneDNN f32", "oneDNN bf16", "bf16 convert",
                                       "1 thread", "2 threads", "qkv        fwd", "nt-large"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(out, want[i])) fail_msg("bench_gemm --quick: no \"%s\" in:\n%s", want[i], out);
#endif
}

static void test_checkpoint_bench_leaves_nothing_behind(void **state)
{
    (void)state;
#ifndef SPMD_BENCH_DIR
    print_message("note: benchmarks not built (SPMD_BUILD_BENCH=OFF)\n");
    skip();
#else
    char *tmp = support_temp_dir("spmd-bench-tmp"), *cwd = support_temp_dir("spmd-bench-cwd");
    char env_args[3 * SUPPORT_PATH];
    snprintf(env_args, sizeof env_args, "-C \"%s\" TMPDIR=\"%s\"", cwd, tmp);
    int rc = run_bench(env_args, "bench_checkpoint", "--layers 1 --dim 64 --vocab 512 --reps 1");
    if (rc != 0) fail_msg("bench_checkpoint failed (%d):\n%s", rc, out);
    char where[SUPPORT_PATH + 32];
    snprintf(where, sizeof where, "in %s/bench_checkpoint.", tmp);
    if (!strstr(out, where)) fail_msg("the checkpoint was not written under $TMPDIR:\n%s", out);
    assert_non_null(strstr(out, "save: median"));
    assert_int_equal(support_count_entries(tmp, ""), 2); /* . and .. */
    assert_int_equal(support_count_entries(cwd, ""), 2);

    /* A $TMPDIR it cannot write under: refused, naming it. */
    snprintf(env_args, sizeof env_args, "-C \"%s\" TMPDIR=\"%s/missing\"", cwd, tmp);
    rc = run_bench(env_args, "bench_checkpoint", "--layers 1 --dim 64 --vocab 512 --reps 1");
    assert_int_equal(rc, 1);
    snprintf(where, sizeof where, "cannot make a directory under %s/missing", tmp);
    if (!strstr(out, where)) fail_msg("no \"%s\" in:\n%s", where, out);
    assert_int_equal(support_count_entries(cwd, ""), 2);
    support_drop_dir(tmp);
    support_drop_dir(cwd);
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm_reports_the_core_loaded),
        cmocka_unit_test(test_gemm_bench_times_every_backend),
        cmocka_unit_test(test_checkpoint_bench_leaves_nothing_behind),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
