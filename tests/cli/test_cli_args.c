/*
 * The `spmd` tool's flags: a stray word or an unknown flag is named as
 * such, every flag takes --flag=value, every refused number states the
 * range it had to be in, --seed takes any 64-bit value, an unknown BLAS
 * core is refused with the known ones, --eval stops at the held-out set,
 * a huge --steps starts at once, and a model without layers is refused.
 * A bare `spmd` prints the commands as a usage error; a flag of another
 * command is refused naming the commands that take it.
 * Runs that would go on for long if a check regressed have a deadline.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "spmd/data.h"
#include "spmd/spmd.h"

#ifndef SPMD_TOOL_PATH
#error "SPMD_TOOL_PATH must name the spmd binary"
#endif

#include "support_tool.h"

/* A run on one device of a model small enough that a step takes
 * milliseconds, so a test spends its time on what it checks. */
#define SMALL "--mesh 1 --axes data --model mlp --hidden 16 --batch 4 --seq 8 --threads 1"

enum { DEADLINE_S = 300 }; /* far beyond what any run here needs */

static char out[1 << 16];

static int run_limited(const char *args, const tool_limits *limits)
{
    int rc = support_run_tool(SPMD_TOOL_PATH, args, limits, out, sizeof out);
    if (rc == TOOL_TIMED_OUT)
        fail_msg("spmd %s: still running after %d s:\n%s", args, limits->timeout_s, out);
    return rc;
}

static int run(const char *args)
{
    tool_limits limits = {.timeout_s = DEADLINE_S};
    return run_limited(args, &limits);
}

static void expect_ok(const char *args)
{
    int rc = run(args);
    if (rc != 0) fail_msg("spmd %s: exit %d, wanted 0:\n%s", args, rc, out);
}

/* The run is refused as a usage error (exit 2), with every text of the
 * NULL-terminated list in its message. */
static void expect_refused(const char *args, ...)
{
    int rc = run(args);
    if (rc != 2) fail_msg("spmd %s: exit %d, wanted 2:\n%s", args, rc, out);
    va_list ap;
    va_start(ap, args);
    for (const char *text; (text = va_arg(ap, const char *));)
        if (!strstr(out, text)) fail_msg("spmd %s: no \"%s\" in:\n%s", args, text, out);
    va_end(ap);
}

static void expect_absent(const char *args, const char *text)
{
    if (strstr(out, text)) fail_msg("spmd %s: \"%s\" should not be in:\n%s", args, text, out);
}

/* A word where a flag belongs is named as a stray word, and an unknown
 * flag as an unknown flag, even last on the line with no value after it. */
static void test_stray_word_and_unknown_flag(void **state)
{
    (void)state;
    expect_refused("train foo", "unexpected argument 'foo'", NULL);
    expect_absent("train foo", "needs a value");
    expect_refused("train --steps 3 foo", "unexpected argument 'foo'", NULL);
    expect_refused("explain --bogus", "unknown flag '--bogus'", NULL);
    expect_absent("explain --bogus", "needs a value");
    expect_refused("train --bogus=3", "unknown flag '--bogus'", NULL);
    expect_refused("train --steps", "--steps needs a value", NULL);
}

/* A bare `spmd` is a usage error (exit 2, as git's): the commands on
 * stderr, and no run starts.  `spmd --help` prints the same and exits 0. */
static void test_bare_spmd_prints_usage(void **state)
{
    (void)state;
    expect_refused("", "usage: spmd COMMAND", "spmd train [flags]", "spmd explain",
                   "spmd visualize", "spmd export CKPT", "spmd sample", "spmd plot LOG.jsonl", NULL);
    expect_absent("", "start-up");
    expect_absent("", "spmd train:");
    expect_refused("trian", "unknown command 'trian'", NULL);
    expect_ok("--help");
    assert_non_null(strstr(out, "spmd train [flags]"));
}

/* One table serves every command: a flag that another command takes is
 * refused with the commands that take it, and every command reads
 * --flag=value (visualize too). */
static void test_flag_of_another_command(void **state)
{
    (void)state;
    expect_refused("explain --prompt hi", "unknown flag '--prompt' for spmd explain",
                   "(a flag of spmd sample)", NULL);
    expect_refused("plot log.jsonl --out x.svg --mesh 2",
                   "unknown flag '--mesh' for spmd plot",
                   "(a flag of spmd train, explain, visualize and sample)", NULL);
    expect_refused("export ckpt --out x --title t", "unknown flag '--title' for spmd export",
                   "(a flag of spmd plot)", NULL);
    expect_refused("visualize --shape 8,6 --spec data --steps 3", "unknown flag '--steps'", NULL);
    expect_ok("visualize --mesh=2 --axes=data --shape=8,6 --spec='data, None'");
    assert_non_null(strstr(out, "blocks of [4, 6]"));
    /* Each command's usage lists its own flags and no other's. */
    expect_ok("explain --help");
    assert_non_null(strstr(out, "--steps N"));
    assert_null(strstr(out, "--prompt"));
    expect_ok("sample --help");
    assert_non_null(strstr(out, "--prompt TEXT"));
    assert_null(strstr(out, "--steps"));
}

/* --flag=value is --flag value, for numbers, names, choices, the seed, the
 * learning rate and a --shard rule that has '=' of its own. */
static void test_flag_equals_value(void **state)
{
    (void)state;
    expect_ok("train --mesh=1 --axes=data --model=mlp --hidden=16 --batch=4 --seq=8 --threads=1 "
              "--steps=2 --eval=0 --seed=7 --lr=0.05 --optimizer=sgd --checkpoint=off "
              "--blas=auto");
    assert_non_null(strstr(out, "step    2/2"));
    expect_ok("explain --model=mlp --mesh=2 --axes=data --fsdp=none --shard='*.weight=data,None'");
    assert_non_null(strstr(out, "data, None"));
}

/* --collective-timeout takes seconds, 0 (the default) and any negative
 * value (no watchdog); the losses are the same either way; a value that
 * is not a number is refused. */
static void test_collective_timeout_values(void **state)
{
    (void)state;
    char first[256] = "";
    const char *values[] = {"0", "2.5", "-1", "-100"};
    for (int i = 0; i < 4; i++) {
        char args[512];
        snprintf(args, sizeof args,
                 "train --mesh 2 --axes data --model mlp --hidden 16 --batch 4 --threads 2 "
                 "--steps 2 --eval 0 --collective-timeout %s", values[i]);
        expect_ok(args);
        const char *done = strstr(out, "done: ");
        assert_non_null(done);
        const char *end = strchr(done, ',');
        assert_non_null(end);
        if (i == 0) snprintf(first, sizeof first, "%.*s", (int)(end - done), done);
        else if (strncmp(done, first, strlen(first))) fail_msg("%s, then %.*s", first, (int)(end - done), done);
    }
    expect_refused("train --collective-timeout soon", "--collective-timeout", "soon", NULL);
}

/* A mesh over the device limit names its real size and the limit, for one
 * axis too large to count and for a product of axes. */
static void test_mesh_size_in_message(void **state)
{
    (void)state;
    expect_refused("train --mesh 1000000 --axes data", "1000000", "4096", NULL);
    expect_absent("train --mesh 1000000 --axes data", "4097");
    expect_refused("train --mesh 99999999999999999999 --axes data", "99999999999999999999", "4096",
                   NULL);
    expect_refused("train --mesh 100x100 --axes a,b", "10000 devices", "4096", NULL);
}

/* Every integer flag out of range states both ends of its range, and a
 * limit a combination of flags breaks is stated too. */
static void test_int_flags_state_their_range(void **state)
{
    (void)state;
    expect_refused("train --steps 99999999999", "--steps wants an integer from 1 to 1000000000",
                   "99999999999", NULL);
    expect_refused("train --batch 0", "--batch wants an integer from 1 to 1000000000", NULL);
    expect_refused("train --eval -1", "--eval wants an integer from 0 to 1000000000", NULL);
    expect_refused("train --vocab 1", "--vocab wants an integer from 2 to 1000000000", NULL);
    expect_refused("train --threads 2.5", "--threads wants an integer from 1 to 1000000000", NULL);
    const char *seed_range = "--seed wants an integer from 0 to 18446744073709551615";
    expect_refused("train --seed -1", seed_range, NULL);
    expect_refused("train --seed 18446744073709551616", seed_range, NULL);
    expect_refused("train --seed 12abc", seed_range, NULL);
    expect_refused("train --batch 100000 --seq 1000", "at most 33554431", NULL);
    expect_refused("train --layers 1000000000 --dim 1000000 --heads 1", "2^62", NULL);
}

/* The first loss of a short run with `seed`, as printed. */
static double first_loss(const char *seed)
{
    char args[512];
    snprintf(args, sizeof args, "train " SMALL " --steps 1 --eval 0 --seed %s", seed);
    expect_ok(args);
    const char *done = strstr(out, "loss ");
    assert_non_null(done);
    return strtod(done + strlen("loss "), NULL);
}

/* --seed takes any 64-bit value, and uses all of it: 2^32 + 1 is not 1. */
static void test_seed_is_64_bit(void **state)
{
    (void)state;
    expect_ok("explain --seed 18446744073709551615");
    assert_true(first_loss("4294967297") != first_loss("1"));
}

/* An unknown OpenBLAS core is refused before the first step, with the
 * list of known ones; a known one passes in any case, as OpenBLAS takes it. */
static void test_unknown_blas_core(void **state)
{
    (void)state;
    if (!spmd_blas_core_names()) skip(); /* not x86-64: no list to check against */
    assert_int_equal(spmd_blas_select("openblas", "NoSuchCore"), SPMD_ERR_INVALID);
    assert_non_null(strstr(spmd_last_error(), spmd_blas_core_names()));
    const char *args = "train " SMALL " --steps 1 --eval 0 --blas-core NoSuchCore";
    int rc = run(args);
    if (rc == 0) fail_msg("spmd %s: accepted:\n%s", args, out);
    assert_non_null(strstr(out, "NoSuchCore"));
    assert_non_null(strstr(out, "SkylakeX"));
    assert_non_null(strstr(out, "Haswell"));
    assert_null(strstr(out, "step    1/1"));
    expect_ok("train " SMALL " --steps 1 --eval 0 --blas-core prescott");
}

/* --eval past the held-out set scores the set once, saying so, instead of
 * evaluating for days; the set's size is what the data reports. */
static void test_eval_capped_at_heldout_set(void **state)
{
    (void)state;
    spmd_dataset *arith = spmd_dataset_open("arith", 8, 1);
    assert_non_null(arith);
    assert_int_equal(spmd_dataset_heldout_size(arith), 1017);
    spmd_dataset_free(arith);
    expect_ok("train " SMALL " --steps 1 --eval 1000000000");
    assert_non_null(strstr(
        out, "--eval 1000000000: the held-out set has 1017 samples; scoring all of them"));
    assert_non_null(strstr(out, "of 1017 samples"));
    expect_ok("train " SMALL " --steps 1 --eval 100");
    assert_null(strstr(out, "held-out set has"));
    assert_non_null(strstr(out, "of 100 samples"));
}

/* A billion steps start at once: the per-step records grow with the run
 * instead of being claimed up front (12 GB here).  Under a 4 GiB address
 * space, which the records of those steps could never fit, the run still
 * reaches its second step.  AddressSanitizer cannot run in a capped address
 * space, so there the run is only checked to start. */
static void test_huge_steps_start(void **state)
{
    (void)state;
    tool_limits limits = {.stop_at = "step    2/1000000000", .timeout_s = DEADLINE_S};
#if !defined(__SANITIZE_ADDRESS__)
    limits.max_address_space = (size_t)4 << 30;
#endif
    const char *args = "train " SMALL " --steps 1000000000 --eval 0 --log-every 1";
    int rc = run_limited(args, &limits);
    if (rc != TOOL_STOPPED) fail_msg("spmd %s: exit %d before its second step:\n%s", args, rc, out);
    expect_absent(args, "out of memory");
}

/* A model with no layers is refused, naming the flag and why. */
static void test_model_without_layers(void **state)
{
    (void)state;
    expect_refused("train " SMALL " --steps 1 --eval 0 --layers 0", "--layers", "from 1 to",
                   "an MLP at least one hidden layer", NULL);
    expect_refused("train --model gpt --layers 0 --steps 1 --eval 0", "--layers", "from 1 to",
                   "a GPT needs at least one block", NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bare_spmd_prints_usage),
        cmocka_unit_test(test_flag_of_another_command),
        cmocka_unit_test(test_stray_word_and_unknown_flag),
        cmocka_unit_test(test_flag_equals_value),
        cmocka_unit_test(test_collective_timeout_values),
        cmocka_unit_test(test_mesh_size_in_message),
        cmocka_unit_test(test_int_flags_state_their_range),
        cmocka_unit_test(test_seed_is_64_bit),
        cmocka_unit_test(test_unknown_blas_core),
        cmocka_unit_test(test_eval_capped_at_heldout_set),
        cmocka_unit_test(test_huge_steps_start),
        cmocka_unit_test(test_model_without_layers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
