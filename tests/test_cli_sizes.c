/*
 * Counts that scale a run's work or memory, checked before anything is
 * allocated: a billion --layers refused naming the shape (train and
 * explain), a billion --val-batches capped at the held-out split's
 * batches, a 4096-device `sample --mesh` planned against the memory, and
 * the address-space pre-check counting the BLAS library and OpenBLAS's
 * GEMM buffer.  Every run has a deadline: without the checks they grow
 * for as long as memory lasts, validate forever, or fail at step 1.
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

#include <stdio.h>
#include <string.h>

static char out[1 << 16];

/* `spmd args` with a deadline and, outside sanitizers, an address-space
 * cap of `cap_mib` (0: none); its exit status. */
static int run_capped(const char *args, size_t cap_mib)
{
    tool_limits limits = {.timeout_s = 60,
                          .max_address_space = SANITIZED ? 0 : cap_mib << 20};
    int rc = support_run_tool(SPMD_TOOL_PATH, args, &limits, out, sizeof out);
    if (rc == TOOL_TIMED_OUT) fail_msg("spmd %s: still running after 60 s:\n%s", args, out);
    return rc;
}

static void expect_in(const char *args, const char *text)
{
    if (!strstr(out, text)) fail_msg("spmd %s: no '%s' in:\n%s", args, text, out);
}

static void test_layers_refused_before_building(void **state)
{
    (void)state;
    const char *args = "train --layers 1000000000 --steps 1 --eval 0";
    assert_int_equal(run_capped(args, 4096), 2);
    expect_in(args, "not enough memory: --layers 1000000000 --dim 96");
    expect_in(args, "its parameters, gradients and optimizer state, and its graph");
    expect_in(args, "--memory-check off");
    /* explain allocates no parameters, but builds the graph. */
    args = "explain --model mlp --layers 1000000000";
    assert_int_equal(run_capped(args, 4096), 2);
    expect_in(args, "not enough memory: --layers 1000000000 --hidden 128 needs at least");
    expect_in(args, "(its graph)");
}

static void test_val_batches_capped(void **state)
{
    (void)state;
    const char *args = "train --val-batches 1000000000 --val-every 1 --steps 2 --eval 0 --dim 32 "
                       "--heads 2 --seq 16 --batch 64";
    int rc = run_capped(args, 0);
    if (rc != 0) fail_msg("spmd %s: exit %d:\n%s", args, rc, out);
    expect_in(args, "--val-batches 1000000000: the held-out split has 1017 samples, 16 batches of "
                    "64; validating on those");
    expect_in(args, "val loss");
    expect_in(args, "(16 batches of 64)");
}

static void test_sample_mesh_planned(void **state)
{
    (void)state;
    if (SANITIZED) skip();
    const char *args = "sample --mesh 4096 --axes data --tokens 2";
    assert_int_equal(run_capped(args, 4096), 2);
    expect_in(args, "not enough address space");
    expect_in(args, "x 4096 devices");
    expect_in(args, "try a smaller --mesh");
}

/* The default run under 340 MiB of address space: its plan is about 240
 * MiB, but loading OpenBLAS maps 39 MiB and its first product a 128 MiB
 * buffer (made only where twice that fits). */
static void test_blas_buffer_counted(void **state)
{
    (void)state;
    if (SANITIZED) skip();
    const char *args = "train --steps 2 --eval 0";
    assert_int_equal(run_capped(args, 340), 2);
    expect_in(args, "not enough address space");
    expect_in(args, "the BLAS library and its GEMM buffer");
    assert_null(strstr(out, "step 1 failed"));
    /* With room for them it runs. */
    assert_int_equal(run_capped(args, 480), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layers_refused_before_building),
        cmocka_unit_test(test_val_batches_capped),
        cmocka_unit_test(test_sample_mesh_planned),
        cmocka_unit_test(test_blas_buffer_counted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
