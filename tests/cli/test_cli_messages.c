/*
 * Messages that name their cause: a spec's syntax error (a comma too
 * many, partial(...) as an entry, torch_xla's integer axes), the
 * 31-character limit of an axis name, a --blas that names no library
 * (exit 2, a usage error), a memory refusal's advice at 4096
 * replicating devices (shard more, not "a bigger mesh"), a message cut at
 * 4 KiB saying so, a visualize --shape past 2^62 refused and a
 * 4096-device picture drawn whole; a --shape of too many dimensions told
 * the limit, the free-space refusal's margin, a checkpoint index nested
 * too deep named as such, an explain --trace of another plan naming what
 * differs; the experts' flags named in their refusals, and explain of
 * an expert-parallel GPT.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "support_files.h"
#include "support_tool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char out[1 << 16];

/* `spmd args` exits `rc` and says `text`. */
static void expect(const char *args, int rc, const char *text)
{
    int got = run_tool(args, out, sizeof out);
    if (got != rc || !strstr(out, text))
        fail_msg("spmd %s: exit %d (want %d), no '%s' in:\n%s", args, got, rc, text, out);
}

static void test_spec_syntax_named(void **state)
{
    (void)state;
    expect("explain --shard '*.weight=fsdp,None,'", 2,
           "--shard '*.weight=fsdp,None,': the spec has an empty entry at column 11 (a comma too "
           "many)");
    expect("explain --shard '*.weight=fsdp,,None'", 2, "empty entry at column 6");
    expect("explain --shard '*.weight=partial(fsdp),None'", 2,
           "partial(...) at column 1 is not an entry: it goes last, after a '|'");
    expect("explain --shard '*.weight=0, None'", 2,
           "an axis index '0' at column 1: axes go by name here, not by torch_xla's mesh index "
           "(mesh axes: replica, fsdp");
    /* A grouped split still reads as one. */
    expect("explain --shard '*.weight=2*fsdp,None'", 2, "into 2 groups");
}

static void test_axis_name_limit_stated(void **state)
{
    (void)state;
    char args[256], name[40];
    memset(name, 'a', 32);
    name[32] = '\0';
    snprintf(args, sizeof args, "explain --mesh 4x2 --axes %s,b", name);
    expect(args, 2, "too long (at most 31 characters)");
    name[31] = '\0'; /* 31 is taken */
    snprintf(args, sizeof args, "explain --mesh 4x2 --axes %s,b", name);
    expect(args, 0, name);
}

/* Experts: each refusal names its flags and numbers; explain on 2x4
 * ('data', 'expert') shows the all-to-alls over 'expert', the experts
 * split over it, and no activation gathered forward or backward. */
static void test_experts_named(void **state)
{
    (void)state;
    expect("explain --mesh 4 --axes expert --experts 6 --ep expert", 2,
           "--ep expert: --experts 6 do not split over the axis's 4 devices (6 % 4 = 2)");
    expect("explain --mesh 1 --axes data --experts 4 --experts-top-k 5", 2,
           "--experts-top-k 5 is more than --experts 4");
    expect("explain --mesh 1 --axes data --experts 64 --experts-top-k 1 --capacity-factor 1", 2,
           "--capacity-factor 1: more experts than fit the capacity: --experts 64 take "
           "floor(--experts-top-k 1 x --seq 40 x 1 / 64) = 0 tokens each; give "
           "--capacity-factor 1.6 or more");
    expect("explain --mesh 1 --axes data --experts 4 --layers 1", 2, "--layers 1 has none");
    expect("explain --mesh 4 --axes data --ep data", 2, "--ep data: expert parallelism needs --experts");
    expect("explain --mesh 2x4 --axes data,expert --experts 4 --ep expert", 0,
           "forward   all-to-all      expert");
    assert_non_null(strstr(out, "backward  all-to-all      expert"));
    assert_non_null(strstr(out, "h.1.moe.c_fc.weight"));
    assert_non_null(strstr(strstr(out, "h.1.moe.c_fc.weight"), "expert, None, None"));
    assert_null(strstr(out, "forward   all-gather"));
    assert_null(strstr(out, "backward  all-gather"));
}

static void test_blas_not_a_library(void **state)
{
    (void)state;
    expect("train --blas /etc/hostname --steps 1 --eval 0", 2, "BLAS: cannot load /etc/hostname");
    expect("train --blas nosuchlib --steps 1 --eval 0", 2, "BLAS: unknown library 'nosuchlib'");
}

static void test_memory_advice_at_4096_devices(void **state)
{
    (void)state;
    int rc = run_tool("train --devices 4096 --dim 512 --heads 8 --layers 8 --steps 1 --eval 0 "
                      "--seq 64",
                      out, sizeof out);
    if (rc != 2 || !strstr(out, "not enough")) fail_msg("exit %d:\n%s", rc, out);
    assert_non_null(strstr(out, "x 4096 devices"));
    assert_non_null(strstr(out, "sharding more of the model over the mesh (--fsdp, --shard"));
    assert_null(strstr(out, "bigger mesh"));
}

/* A 6000-byte --mesh: its message is cut, and says so with its length. */
static void test_long_message_cut_saying_so(void **state)
{
    (void)state;
    int rc = run_tool("train --mesh \"$(head -c 6000 /dev/zero | tr '\\0' x)\"", out, sizeof out);
    assert_int_equal(rc, 2);
    const char *cut = strstr(out, "... (message cut: ");
    if (!cut || strlen(out) > 4096) fail_msg("no cut named in %zu bytes:\n%.300s", strlen(out), out);
    assert_true(strtol(cut + strlen("... (message cut: "), NULL, 10) > 6000);
}

static void test_visualize_shape_past_2_62(void **state)
{
    (void)state;
    expect("visualize --shape 9223372036854775807,6 --spec fsdp,None --mesh 2 --axes fsdp", 2,
           "--shape: size 9223372036854775807 is more than 2^62");
    expect("visualize --shape 99999999999999999999,6 --spec fsdp,None --mesh 2 --axes fsdp", 2,
           "is more than 2^62");
    expect("visualize --shape 4611686018427387904,6 --spec fsdp,None --mesh 2 --axes fsdp", 0,
           "blocks of [2305843009213693952, 6]");
}

/* A --shape of more dimensions than a tensor has is told the limit, not
 * to use positive sizes. */
static void test_visualize_dimension_limit(void **state)
{
    (void)state;
    expect("visualize --shape 1,1,1,1,1,1,1,1,1 --spec None --mesh 2 --axes fsdp", 2,
           "--shape '1,1,1,1,1,1,1,1,1' has 9 dimensions; a tensor has at most 6");
    expect("visualize --shape 2,-3 --spec fsdp,None --mesh 2 --axes fsdp", 2, "positive sizes");
}

/* The free-space refusal states the margin it keeps beyond the
 * checkpoint's bytes (spmd-test's SPMD_TEST_FREE_BYTES stands for a
 * nearly full disk). */
static void test_free_space_margin_stated(void **state)
{
    (void)state;
    char *dir = support_temp_dir("test_cli_messages"), args[SUPPORT_PATH + 64];
    snprintf(args, sizeof args, "train --model mlp --steps 1 --eval 0 --save %s/ck", dir);
    setenv("SPMD_TEST_FREE_BYTES", "1048576", 1);
    int rc = support_run_tool(SPMD_TEST_TOOL_PATH, args, NULL, out, sizeof out);
    unsetenv("SPMD_TEST_FREE_BYTES");
    support_drop_dir(dir);
    if (rc != 1 || !strstr(out, "a checkpoint of this run takes 0.2 MiB, and 1.0 MiB more is kept "
                                "free for its files' headers and index (1% of it and 1 MiB): its "
                                "file system has 1.0 MiB free, 1.2 MiB needed"))
        fail_msg("exit %d:\n%s", rc, out);
}

/* A checkpoint index that is valid JSON nested 200,000 deep is refused
 * as too deep, with the limit, not as "not a JSON object". */
static void test_deep_index_named(void **state)
{
    (void)state;
    char *dir = support_temp_dir("test_cli_messages"), ck[SUPPORT_PATH], index[2 * SUPPORT_PATH],
         args[2 * SUPPORT_PATH];
    support_path_in(ck, dir, "ck");
    snprintf(args, sizeof args, "train --model mlp --steps 1 --eval 0 --save %s", ck);
    int rc = run_tool(args, out, sizeof out);
    if (rc) fail_msg("the checkpoint: exit %d\n%s", rc, out);
    snprintf(index, sizeof index, "%s/step-00000001/index.json", ck);
    FILE *f = fopen(index, "w");
    assert_non_null(f);
    fputs("{\"format\": ", f);
    for (int i = 0; i < 200000; i++) fputc('[', f);
    for (int i = 0; i < 200000; i++) fputc(']', f);
    fputs("}\n", f);
    assert_int_equal(fclose(f), 0);
    snprintf(args, sizeof args, "train --model mlp --steps 2 --eval 0 --resume %s", ck);
    rc = run_tool(args, out, sizeof out);
    if (rc == 0 || !strstr(out, "index.json nests 200001 levels of arrays and objects deep; at most "
                                "1000 are read"))
        fail_msg("exit %d:\n%s", rc, out);
    snprintf(args, sizeof args, "export %s --out %s/x.safetensors", ck, dir);
    rc = run_tool(args, out, sizeof out);
    if (rc == 0 || !strstr(out, "nests 200001 levels")) fail_msg("export: exit %d:\n%s", rc, out);
    support_drop_dir(dir);
}

/* explain --trace of a plan other than the traced one names what
 * differs (the flags and the figures), not both runs' summaries. */
static void test_explain_trace_names_what_differs(void **state)
{
    (void)state;
    char *dir = support_temp_dir("test_cli_messages"), trace[SUPPORT_PATH], args[SUPPORT_PATH + 128];
    support_path_in(trace, dir, "t.json");
    snprintf(args, sizeof args, "train --model mlp --hidden 64 --steps 3 --eval 0 --trace %s", trace);
    int rc = run_tool(args, out, sizeof out);
    if (rc) fail_msg("the trace: exit %d\n%s", rc, out);
    snprintf(args, sizeof args, "explain --model mlp --hidden 65 --trace %s", trace);
    rc = run_tool(args, out, sizeof out);
    if (rc != 2 || !strstr(out, "--hidden 64 (here 65)") || strstr(out, "0.01M parameters"))
        fail_msg("--hidden 65: exit %d:\n%s", rc, out);
    snprintf(args, sizeof args, "explain --model mlp --hidden 128 --steps 5 --trace %s", trace);
    rc = run_tool(args, out, sizeof out);
    if (rc != 2 || !strstr(out, "--hidden 64 (here 128)") ||
        !strstr(out, "5901 parameters (here 19981)"))
        fail_msg("--hidden 128: exit %d:\n%s", rc, out);
    support_drop_dir(dir);
}

/* A 4096-device picture (74 KB) whole: it ends with the last device. */
static void test_visualize_4096_devices_whole(void **state)
{
    (void)state;
    static char big[1 << 18];
    int rc = run_tool("visualize --mesh 4096 --axes d --shape 4096,2 --spec d,None", big, sizeof big);
    assert_int_equal(rc, 0);
    size_t n = strlen(big);
    const char *last = "| 4095 |\n+------+\n";
    assert_true(n > 1 << 16);
    assert_string_equal(big + n - strlen(last), last);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spec_syntax_named),
        cmocka_unit_test(test_axis_name_limit_stated),
        cmocka_unit_test(test_blas_not_a_library),
        cmocka_unit_test(test_memory_advice_at_4096_devices),
        cmocka_unit_test(test_long_message_cut_saying_so),
        cmocka_unit_test(test_visualize_shape_past_2_62),
        cmocka_unit_test(test_visualize_4096_devices_whole),
        cmocka_unit_test(test_visualize_dimension_limit),
        cmocka_unit_test(test_free_space_margin_stated),
        cmocka_unit_test(test_deep_index_named),
        cmocka_unit_test(test_explain_trace_names_what_differs),
        cmocka_unit_test(test_experts_named),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
