/*
 * Counts that scale a run's work or memory, checked before anything is
 * allocated: a billion --layers refused naming the shape (train and
 * explain), a billion --val-batches capped at the held-out split's
 * batches, a 4096-device `sample --mesh` planned against the memory, and
 * the address-space pre-check counting what the BLAS library and
 * OpenBLAS's GEMM buffer map, measured.  Every run has a deadline: without the checks they grow
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

#include <math.h>
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

/* A figure of the refusal: the size after `key`, in MiB ("388 MiB",
 * "1.2 GiB"). */
static double figure_mib(const char *key)
{
    const char *at = strstr(out, key);
    if (!at) fail_msg("no '%s' in:\n%s", key, out);
    double v = 0;
    char unit[8] = "";
    if (sscanf(at + strlen(key), "%lf %7s", &v, unit) != 2)
        fail_msg("no figure after '%s' in:\n%s", key, out);
    return !strncmp(unit, "GiB", 3) ? v * 1024 : v;
}

typedef struct refusal {
    double maps, blas, leaves; /* MiB: the run in all, the BLAS's share, the room */
} refusal;

/* `spmd args` under `cap_mib` refused up front for lack of address space,
 * counting the BLAS library and its GEMM buffer; its figures. */
static refusal refused_under(const char *args, size_t cap_mib)
{
    int rc = run_capped(args, cap_mib);
    if (rc != 2)
        fail_msg("spmd %s under %zu MiB: exit %d, not refused up front:\n%s", args, cap_mib, rc, out);
    expect_in(args, "not enough address space: this run maps about ");
    expect_in(args, "for the BLAS library and its GEMM buffer");
    assert_null(strstr(out, "step 1 failed"));
    refusal r = {figure_mib("maps about "), figure_mib("thread stacks, and "),
                 figure_mib("(ulimit -v) leaves ")};
    if (!(r.maps > r.leaves && r.blas > 0 && r.blas < r.maps))
        fail_msg("spmd %s under %zu MiB: figures that do not add up:\n%s", args, cap_mib, out);
    print_message("under %zu MiB: refused, maps %.0f MiB (BLAS %.0f), leaves %.0f\n", cap_mib, r.maps,
                  r.blas, r.leaves);
    return r;
}

/* The address-space pre-check counts what the BLAS maps, measured rather
 * than one release's figures (Debian's OpenBLAS 0.3.21 maps 39 MiB as it
 * loads, 0.3.29 170 MiB with a GEMM buffer for its own thread, and each a
 * 128 MiB buffer for the first product, made where twice that fits).
 * Under a cap that leaves room for the run's plan and stacks but not for
 * the BLAS it is refused up front, naming the BLAS; raised by what each
 * refusal says is missing (and 16 MiB), the cap is refused again, further
 * along, or the run finishes: it never starts only to fail at step 1. */
static void test_blas_buffer_counted(void **state)
{
    (void)state;
    if (SANITIZED) skip();
    const char *args = "train --steps 2 --eval 0";
    /* What is mapped before the BLAS (the tool and its libraries) and
     * what the run maps besides the BLAS, from a cap that holds neither. */
    size_t cap = 128;
    refusal r = refused_under(args, cap);
    double before = (double)cap - r.leaves, plan = r.maps - r.blas;
    /* Room for the plan and 64 MiB more: not for the BLAS. */
    cap = (size_t)ceil(before + plan) + 64;
    r = refused_under(args, cap);
    assert_true(r.maps - r.blas <= r.leaves);
    for (int tries = 0; tries < 5; tries++) {
        cap += (size_t)ceil(r.maps - r.leaves) + 16;
        int rc = run_capped(args, cap);
        if (rc == 0) {
            assert_non_null(strstr(out, "step    2/2"));
            print_message("under %zu MiB: ran\n", cap);
            return;
        }
        r = refused_under(args, cap);
    }
    fail_msg("spmd %s: still refused under %zu MiB:\n%s", args, cap, out);
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
