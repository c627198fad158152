/*
 * The `spmd` tool end to end: runs the binary (its path comes from the
 * build as SPMD_TOOL_PATH) and checks its JSON report and its errors.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef SPMD_TOOL_PATH
#error "SPMD_TOOL_PATH must name the spmd binary"
#endif

/* Run the tool with `args`; capture stderr+stdout into out; return the
 * exit status. */
static int run_tool(const char *args, char *out, size_t size)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", SPMD_TOOL_PATH, args);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    size_t n = fread(out, 1, size - 1, f);
    out[n] = '\0';
    int status = pclose(f);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static cJSON *load_json(const char *path)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    cJSON *j = cJSON_Parse(buf);
    assert_non_null(j);
    return j;
}

static double number(const cJSON *j, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    assert_true(cJSON_IsNumber(v));
    return v->valuedouble;
}

static char report_path[64];

static int setup(void **state)
{
    (void)state;
    snprintf(report_path, sizeof report_path, "test_cli_report_%d.json", (int)getpid());
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    remove(report_path);
    return 0;
}

/* The GPT-2 124M configuration trains on one device; its first loss is
 * near ln(vocab) and its memory is reported. */
static void test_gpt2_124m_one_device(void **state)
{
    (void)state;
    static char out[1 << 16];
    char args[512];
    snprintf(args, sizeof args,
             "train --mesh 1 --axes data --model gpt --layers 12 --heads 12 --dim 768 "
             "--vocab 50257 --seq 64 --batch 1 --steps 2 --lr 0.0001 --json %s", report_path);
    int rc = run_tool(args, out, sizeof out);
    if (rc != 0) fprintf(stderr, "%s\n", out);
    assert_int_equal(rc, 0);
    cJSON *j = load_json(report_path);
    assert_int_equal((int64_t)number(j, "params"), 124439808);
    const cJSON *loss = cJSON_GetObjectItemCaseSensitive(j, "loss");
    assert_int_equal(cJSON_GetArraySize(loss), 2);
    double first = cJSON_GetArrayItem(loss, 0)->valuedouble;
    assert_true(fabs(first - log(50257.0)) < 0.5);
    assert_true(number(j, "ms_per_step") > 0);
    const cJSON *peak = cJSON_GetObjectItemCaseSensitive(j, "peak_bytes_per_device");
    assert_int_equal(cJSON_GetArraySize(peak), 1);
    /* At least the parameters themselves. */
    assert_true(cJSON_GetArrayItem(peak, 0)->valuedouble > 124439808.0 * 4);
    cJSON_Delete(j);
}

/* The default-sized run learns its synthetic sequences. */
static void test_small_gpt_learns(void **state)
{
    (void)state;
    static char out[1 << 16];
    char args[256];
    snprintf(args, sizeof args, "train --steps 40 --json %s", report_path);
    int rc = run_tool(args, out, sizeof out);
    if (rc != 0) fprintf(stderr, "%s\n", out);
    assert_int_equal(rc, 0);
    cJSON *j = load_json(report_path);
    const cJSON *loss = cJSON_GetObjectItemCaseSensitive(j, "loss");
    int n = cJSON_GetArraySize(loss);
    double first = cJSON_GetArrayItem(loss, 0)->valuedouble;
    double last = cJSON_GetArrayItem(loss, n - 1)->valuedouble;
    assert_true(last < 0.7 * first);
    cJSON_Delete(j);
}

static void test_refuses_larger_mesh(void **state)
{
    (void)state;
    char out[4096];
    int rc = run_tool("train --mesh 4x2 --axes replica,fsdp", out, sizeof out);
    assert_int_not_equal(rc, 0);
    assert_non_null(strstr(out, "mesh"));
}

static void test_bad_flags(void **state)
{
    (void)state;
    char out[4096];
    assert_int_not_equal(run_tool("train --steps banana", out, sizeof out), 0);
    assert_non_null(strstr(out, "banana"));
    assert_int_not_equal(run_tool("train --frobnicate 3", out, sizeof out), 0);
    assert_non_null(strstr(out, "--frobnicate"));
    assert_int_not_equal(run_tool("train --mesh 2 --axes a,b", out, sizeof out), 0);
    assert_int_not_equal(run_tool("train --dim 30 --heads 4", out, sizeof out), 0);
    assert_non_null(strstr(out, "heads"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_gpt2_124m_one_device, setup, teardown),
        cmocka_unit_test_setup_teardown(test_small_gpt_learns, setup, teardown),
        cmocka_unit_test(test_refuses_larger_mesh),
        cmocka_unit_test(test_bad_flags),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
