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
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef SPMD_TOOL_PATH
#error "SPMD_TOOL_PATH must name the spmd binary"
#endif

#include "support_json.h"
#include "support_tool.h" /* run_tool */

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
             "--vocab 50257 --context 1024 --seq 64 --batch 1 --steps 2 --optimizer sgd "
             "--lr 0.0001 --eval 0 --json %s", report_path);
    int rc = run_tool(args, out, sizeof out);
    if (rc != 0) fprintf(stderr, "%s\n", out);
    assert_int_equal(rc, 0);
    cJSON *j = support_load_json(report_path);
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

/* The default run, shortened: the loss falls well below its start and
 * the held-out accuracy rises well above chance (10% per digit). */
static void test_default_run_learns(void **state)
{
    (void)state;
    static char out[1 << 16];
    char args[256];
    snprintf(args, sizeof args, "train --steps 300 --json %s", report_path);
    int rc = run_tool(args, out, sizeof out);
    if (rc != 0) fprintf(stderr, "%s\n", out);
    assert_int_equal(rc, 0);
    cJSON *j = support_load_json(report_path);
    const cJSON *loss = cJSON_GetObjectItemCaseSensitive(j, "loss");
    int n = cJSON_GetArraySize(loss);
    double first = cJSON_GetArrayItem(loss, 0)->valuedouble;
    double last = cJSON_GetArrayItem(loss, n - 1)->valuedouble;
    assert_true(last < 0.6 * first);
    assert_true(number(j, "accuracy") > 0.3);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(j, "peak_bytes_per_device")), 8);
    cJSON_Delete(j);
}

/* One short run's report; the caller frees it. */
static cJSON *run_report(const char *flags)
{
    static char out[1 << 16];
    char args[512];
    snprintf(args, sizeof args, "train --eval 0 --json %s %s", report_path, flags);
    int rc = run_tool(args, out, sizeof out);
    if (rc != 0) fprintf(stderr, "%s\n", out);
    assert_int_equal(rc, 0);
    return support_load_json(report_path);
}

static double loss_at(const cJSON *j, int step)
{
    return cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "loss"), step)->valuedouble;
}

static double first_of(const cJSON *j, const char *key)
{
    return cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, key), 0)->valuedouble;
}

/* Same seed, same global batch, 20 steps: every mesh follows the
 * one-device losses within 1e-3 relative, with ZeRO (the default) and
 * without; the same mesh twice gives the same bits; without ZeRO,
 * parameter + gradient + optimizer bytes per device are a half with
 * fsdp = 2 and an eighth with fsdp = 8 of pure data parallelism's, and
 * ZeRO's on mesh 8 (the state an eighth) 0.56 of it. */
static void test_meshes_agree(void **state)
{
    (void)state;
    const char *meshes[] = {"--mesh 8 --axes data --zero off", "--mesh 4x2 --axes replica,fsdp --zero off",
                            "--mesh 2x4 --axes replica,fsdp", "--mesh 1x8 --axes replica,fsdp --zero off",
                            "--mesh 8 --axes data"};
    enum { STEPS = 20 };
    cJSON *one = run_report("--steps 20 --mesh 1 --axes data");
    double dp_bytes = 0;
    for (int k = 0; k < 5; k++) {
        char flags[128];
        snprintf(flags, sizeof flags, "--steps %d %s", STEPS, meshes[k]);
        cJSON *j = run_report(flags);
        for (int s = 0; s < STEPS; s++) {
            double a = loss_at(one, s), b = loss_at(j, s);
            if (fabs(a - b) > 1e-3 * fabs(a)) fail_msg("%s: step %d loss %g vs one device %g", meshes[k], s, b, a);
        }
        double bytes = first_of(j, "param_bytes_per_device");
        if (k == 0) dp_bytes = bytes;
        if (k == 1) assert_true(fabs(bytes / dp_bytes - 0.5) < 0.05 * 0.5);
        if (k == 3) assert_true(fabs(bytes / dp_bytes - 0.125) < 0.05 * 0.125);
        /* ZeRO: the parameters and gradients whole, the AdamW state an
         * eighth: (1 + 1 + 2/8) / 4 of it. */
        if (k == 4) assert_true(fabs(bytes / dp_bytes - 0.5625) < 0.05 * 0.5625);
        cJSON_Delete(j);
    }
    cJSON *again = run_report("--steps 20 --mesh 4x2 --axes replica,fsdp");
    cJSON *twice = run_report("--steps 20 --mesh 4x2 --axes replica,fsdp");
    for (int s = 0; s < STEPS; s++) {
        double a = loss_at(again, s), b = loss_at(twice, s);
        assert_memory_equal(&a, &b, sizeof a);
    }
    cJSON_Delete(again);
    cJSON_Delete(twice);
    cJSON_Delete(one);
}

/* A batch the mesh does not divide (10 over 8 devices): padded rows are
 * masked out of the loss, and the losses follow one device's. */
static void test_uneven_batch(void **state)
{
    (void)state;
    cJSON *one = run_report("--steps 5 --batch 10 --mesh 1 --axes data");
    cJSON *mesh = run_report("--steps 5 --batch 10");
    for (int s = 0; s < 5; s++) {
        double a = loss_at(one, s), b = loss_at(mesh, s);
        if (fabs(a - b) > 1e-4 * fabs(a)) fail_msg("step %d: loss %g on 4x2, %g on one device", s, b, a);
    }
    cJSON_Delete(one);
    cJSON_Delete(mesh);
}

/* Activation checkpointing lowers peak bytes per device on the GPT and
 * leaves the losses unchanged. */
static void test_checkpointing_lowers_peak(void **state)
{
    (void)state;
    cJSON *off = run_report("--steps 5 --layers 4 --checkpoint off");
    cJSON *on = run_report("--steps 5 --layers 4 --checkpoint on");
    assert_true(first_of(on, "peak_bytes_per_device") < 0.9 * first_of(off, "peak_bytes_per_device"));
    for (int s = 0; s < 5; s++) assert_true(fabs(loss_at(on, s) - loss_at(off, s)) <= 1e-6 * fabs(loss_at(off, s)));
    cJSON_Delete(off);
    cJSON_Delete(on);
}

/* A text file as data: byte-level, vocabulary 256. */
static void test_text_data(void **state)
{
    (void)state;
    char path[64];
    snprintf(path, sizeof path, "test_cli_text_%d.txt", (int)getpid());
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (int i = 0; i < 200; i++) fprintf(f, "the quick brown fox %d jumps over the lazy dog\n", i);
    fclose(f);
    char flags[256];
    snprintf(flags, sizeof flags, "--steps 5 --data %s", path);
    cJSON *j = run_report(flags);
    assert_true(loss_at(j, 0) > 4.0); /* about ln 256 at the start */
    cJSON_Delete(j);
    static char out[4096];
    assert_int_not_equal(run_tool("train --data /nonexistent/file.bin", out, sizeof out), 0);
    assert_non_null(strstr(out, "nonexistent"));
    remove(path);
}

/* The motivating case by hand: the 4x2 FSDP-in-replicas run follows the
 * one-device run step by step, and explain reports its plan. */
static void test_mesh_run_matches_one_device(void **state)
{
    (void)state;
    static char out[1 << 16];
    char args[512];
    const int steps = 5;
    double one[5], mesh[5];
    for (int k = 0; k < 2; k++) {
        snprintf(args, sizeof args, "train --steps %d --eval 0 --json %s %s", steps, report_path,
                 k ? "--mesh 4x2 --axes replica,fsdp --fsdp none --shard '*.weight=fsdp,None'"
                   : "--mesh 1 --axes data");
        int rc = run_tool(args, out, sizeof out);
        if (rc != 0) fprintf(stderr, "%s\n", out);
        assert_int_equal(rc, 0);
        cJSON *j = support_load_json(report_path);
        const cJSON *loss = cJSON_GetObjectItemCaseSensitive(j, "loss");
        for (int s = 0; s < steps; s++) (k ? mesh : one)[s] = cJSON_GetArrayItem(loss, s)->valuedouble;
        if (k) {
            assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(j, "peak_bytes_per_device")), 8);
            assert_true(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(j, "collectives")) > 0);
        }
        cJSON_Delete(j);
    }
    for (int s = 0; s < steps; s++) assert_true(fabs(one[s] - mesh[s]) <= 1e-3 * fabs(one[s]));
}

static void test_explain_json(void **state)
{
    (void)state;
    static char out[1 << 16];
    char args[512];
    snprintf(args, sizeof args,
             "explain --model mlp --mesh 4x2 --axes replica,fsdp --fsdp none --shard '*.weight=fsdp,None' "
             "--json %s", report_path);
    int rc = run_tool(args, out, sizeof out);
    if (rc != 0) fprintf(stderr, "%s\n", out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "all-gather"));
    cJSON *j = support_load_json(report_path);
    const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(j, "tensors");
    bool found = false;
    for (int i = 0; i < cJSON_GetArraySize(tensors); i++) {
        const cJSON *t = cJSON_GetArrayItem(tensors, i);
        if (!strcmp(cJSON_GetObjectItemCaseSensitive(t, "name")->valuestring, "fc.0.weight")) {
            assert_string_equal(cJSON_GetObjectItemCaseSensitive(t, "sharding")->valuestring, "fsdp, None");
            found = true;
        }
    }
    assert_true(found);
    const cJSON *colls = cJSON_GetObjectItemCaseSensitive(j, "collectives");
    int gathers = 0;
    bool weight_moved = false;
    for (int i = 0; i < cJSON_GetArraySize(colls); i++) {
        const cJSON *c = cJSON_GetArrayItem(colls, i);
        const cJSON *moves = cJSON_GetObjectItemCaseSensitive(c, "moves");
        /* One name per collective of the entry: the value it moves. */
        assert_int_equal(cJSON_GetArraySize(moves), (int)number(c, "count"));
        if (!strcmp(cJSON_GetObjectItemCaseSensitive(c, "kind")->valuestring, "all-gather") &&
            !strcmp(cJSON_GetObjectItemCaseSensitive(c, "phase")->valuestring, "forward")) {
            gathers += (int)number(c, "count");
            for (int k = 0; k < cJSON_GetArraySize(moves); k++)
                weight_moved |= !strcmp(cJSON_GetArrayItem(moves, k)->valuestring, "fc.0.weight");
        }
    }
    assert_true(weight_moved);
    assert_int_equal(gathers, 3); /* one per weight of the 3-layer MLP */
    assert_int_equal((int)number(j, "fallback_count"), 0);
    cJSON_Delete(j);
}

/* explain --overlap on states the in-flight budget and the most bytes in
 * flight at once, within it; --inflight-mib lowers both; without
 * --overlap on the flag is refused. */
static void test_explain_in_flight(void **state)
{
    (void)state;
    static char out[1 << 16];
    char args[512];
    double bytes[2], budget[2], flying[2];
    const char *const budgets[] = {"", "--inflight-mib 0.1"};
    for (int r = 0; r < 2; r++) {
        snprintf(args, sizeof args, "explain --overlap on %s --json %s", budgets[r], report_path);
        int rc = run_tool(args, out, sizeof out);
        if (rc != 0) fail_msg("spmd %s: exit %d\n%s", args, rc, out);
        assert_non_null(strstr(out, r ? "of a budget of 102.4 KiB" : "of a budget of 64.0 MiB"));
        cJSON *j = support_load_json(report_path);
        const cJSON *fly = cJSON_GetObjectItemCaseSensitive(j, "in_flight");
        bytes[r] = number(fly, "bytes"), budget[r] = number(fly, "budget_bytes");
        flying[r] = number(fly, "collectives");
        cJSON_Delete(j);
        assert_true(flying[r] > 0 && bytes[r] > 0 && bytes[r] <= budget[r]);
    }
    assert_true(budget[0] == 64.0 * 1024 * 1024 && budget[1] == 104857);
    assert_true(bytes[1] < bytes[0]);
    assert_true(flying[1] <= flying[0]);
    int rc = run_tool("explain --inflight-mib 1", out, sizeof out);
    assert_int_equal(rc, 2);
    assert_non_null(strstr(out, "--inflight-mib bounds the collectives in flight: it needs --overlap on"));
}

/* --tp on 2x2x2 with FSDP: explain's report shows c_attn split by heads
 * (3*tensor) and FSDP on its other dim, the batch off 'tensor', and no
 * all-gather over 'tensor' of anything but the loss's row stats; --sp
 * turns the all-reduces into reduce-scatters.  Bad uses are refused. */
static void test_tensor_parallel_flags(void **state)
{
    (void)state;
    static char out[1 << 16];
    for (int sp = 0; sp < 2; sp++) {
        int rc = run_toolf(out, sizeof out,
                           "explain --mesh 2x2x2 --axes data,fsdp,tensor --fsdp fsdp --tp tensor "
                           "--sp %s --vocab 50 --json %s", sp ? "on" : "off", report_path);
        if (rc != 0) fprintf(stderr, "%s\n", out);
        assert_int_equal(rc, 0);
        cJSON *j = support_load_json(report_path);
        const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(j, "tensors");
        int seen = 0;
        for (int i = 0; i < cJSON_GetArraySize(tensors); i++) {
            const cJSON *t = cJSON_GetArrayItem(tensors, i);
            const char *name = cJSON_GetObjectItemCaseSensitive(t, "name")->valuestring;
            const char *spec = cJSON_GetObjectItemCaseSensitive(t, "sharding")->valuestring;
            if (!strcmp(name, "h.0.attn.c_attn.weight")) assert_string_equal(spec, "3*tensor, fsdp"), seen++;
            if (!strcmp(name, "input")) assert_string_equal(spec, "(data, fsdp), None"), seen++;
            if (!strcmp(name, "wte.weight")) assert_string_equal(spec, "tensor, fsdp"), seen++;
        }
        assert_int_equal(seen, 3);
        const cJSON *colls = cJSON_GetObjectItemCaseSensitive(j, "collectives");
        int reduces = 0, scatters = 0;
        for (int i = 0; i < cJSON_GetArraySize(colls); i++) {
            const cJSON *c = cJSON_GetArrayItem(colls, i);
            const char *kind = cJSON_GetObjectItemCaseSensitive(c, "kind")->valuestring;
            const char *phase = cJSON_GetObjectItemCaseSensitive(c, "phase")->valuestring;
            const cJSON *axes = cJSON_GetObjectItemCaseSensitive(c, "axes");
            if (cJSON_GetArraySize(axes) != 1 ||
                strcmp(cJSON_GetArrayItem(axes, 0)->valuestring, "tensor") || strcmp(phase, "forward"))
                continue;
            const cJSON *moves = cJSON_GetObjectItemCaseSensitive(c, "moves");
            for (int k = 0; k < cJSON_GetArraySize(moves); k++) {
                const char *what = cJSON_GetArrayItem(moves, k)->valuestring;
                if (!strcmp(kind, "all-gather") && !sp && strncmp(what, "cross_entropy", 13))
                    fail_msg("all-gather of %s over tensor", what);
                reduces += !strcmp(kind, "all-reduce") && !strncmp(what, "h.", 2);
                scatters += !strcmp(kind, "reduce-scatter") && !strncmp(what, "h.", 2);
            }
        }
        /* Two per block of the default two-block GPT, over 'tensor'. */
        assert_int_equal(sp ? scatters : reduces, 4);
        assert_int_equal(sp ? reduces : scatters, 0);
        cJSON_Delete(j);
    }
    assert_int_equal(run_tool("train --mesh 4 --axes tensor --tp tensor --heads 3 --dim 96", out,
                              sizeof out), 2);
    assert_non_null(strstr(out, "3 heads do not split over axis 'tensor' of 4"));
    assert_int_equal(run_tool("train --model mlp --mesh 2 --axes tensor --tp tensor", out, sizeof out), 2);
    assert_non_null(strstr(out, "--tp: tensor parallelism is for --model gpt"));
    assert_int_equal(run_tool("train --mesh 2 --axes data --sp on", out, sizeof out), 2);
    assert_non_null(strstr(out, "give --tp AXIS"));
}

/* --cp on 2x2 (data, cp): the inputs split on the batch and the
 * sequence; over 'cp', per block, the forward pass all-gathers k and v,
 * the backward pass gathers them again and reduce-scatters attention's
 * gradients twice, and no activation is all-reduced.  Bad uses are
 * refused, naming the numbers and axes. */
static void test_context_parallel_flags(void **state)
{
    (void)state;
    static char out[1 << 16];
    int rc = run_toolf(out, sizeof out, "explain --mesh 2x2 --axes data,cp --cp cp --json %s",
                       report_path);
    if (rc != 0) fprintf(stderr, "%s\n", out);
    assert_int_equal(rc, 0);
    cJSON *j = support_load_json(report_path);
    const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(j, "tensors");
    int seen = 0;
    for (int i = 0; i < cJSON_GetArraySize(tensors); i++) {
        const cJSON *t = cJSON_GetArrayItem(tensors, i);
        const char *name = cJSON_GetObjectItemCaseSensitive(t, "name")->valuestring;
        const char *spec = cJSON_GetObjectItemCaseSensitive(t, "sharding")->valuestring;
        if (!strcmp(name, "input")) assert_string_equal(spec, "data, cp"), seen++;
        if (!strcmp(name, "h.1.attn.y")) assert_string_equal(spec, "data, cp, None"), seen++;
    }
    assert_int_equal(seen, 2);
    const cJSON *colls = cJSON_GetObjectItemCaseSensitive(j, "collectives");
    int n[2][3] = {{0}}; /* forward, backward: all-gathers, reduce-scatters, all-reduces */
    for (int i = 0; i < cJSON_GetArraySize(colls); i++) {
        const cJSON *c = cJSON_GetArrayItem(colls, i);
        const char *kind = cJSON_GetObjectItemCaseSensitive(c, "kind")->valuestring;
        const char *phase = cJSON_GetObjectItemCaseSensitive(c, "phase")->valuestring;
        const cJSON *axes = cJSON_GetObjectItemCaseSensitive(c, "axes");
        int ph = !strcmp(phase, "forward") ? 0 : !strcmp(phase, "backward") ? 1 : -1;
        if (ph < 0 || cJSON_GetArraySize(axes) != 1 ||
            strcmp(cJSON_GetArrayItem(axes, 0)->valuestring, "cp"))
            continue;
        int count = (int)cJSON_GetObjectItemCaseSensitive(c, "count")->valuedouble;
        n[ph][0] += !strcmp(kind, "all-gather") * count;
        n[ph][1] += !strcmp(kind, "reduce-scatter") * count;
        n[ph][2] += !strcmp(kind, "all-reduce") * count;
    }
    /* The default GPT has two blocks. */
    assert_int_equal(n[0][0], 4);
    assert_int_equal(n[1][0], 4);
    assert_int_equal(n[0][1], 0);
    assert_int_equal(n[1][1], 4);
    assert_int_equal(n[1][2], 0);
    cJSON_Delete(j);
    assert_int_equal(run_tool("train --mesh 4 --axes cp --cp cp --seq 42", out, sizeof out), 2);
    assert_non_null(strstr(out, "a sequence of 42 tokens does not split over axis 'cp' of 4 devices"));
    assert_int_equal(run_tool("train --mesh 2x2 --axes cp,tensor --cp tensor --tp tensor", out,
                              sizeof out), 2);
    assert_non_null(strstr(out, "'tensor' cannot be both the context axis and the tensor axis"));
    assert_int_equal(run_tool("train --mesh 2x2 --axes cp,tensor --cp cp --tp tensor --sp on", out,
                              sizeof out), 2);
    assert_non_null(strstr(out, "sequence parallelism"));
    assert_int_equal(run_tool("train --model mlp --mesh 2 --axes cp --cp cp", out, sizeof out), 2);
    assert_non_null(strstr(out, "--cp: context parallelism is for --model gpt"));
}

/* The milliseconds of "about X ms by the alpha-beta model" in explain's output. */
static double estimated_ms(const char *out)
{
    const char *at = strstr(out, "about ");
    assert_non_null(at);
    return atof(at + strlen("about "));
}

/* Planned over 4 processes, the 4x2 mesh keeps 'fsdp' inside a process
 * and sends 'replica' across: explain says so, the report marks it, and
 * the collectives over 'replica' cost more; train refuses the flag. */
static void test_explain_processes(void **state)
{
    (void)state;
    static char out[1 << 16];
    const char *flags = "--model mlp --mesh 4x2 --axes replica,fsdp --fsdp none --shard '*.weight=fsdp,None'";
    char args[512];
    snprintf(args, sizeof args, "explain %s", flags);
    assert_int_equal(run_tool(args, out, sizeof out), 0);
    assert_null(strstr(out, "processes:"));
    double one = estimated_ms(out);
    snprintf(args, sizeof args, "explain %s --processes 4 --json %s", flags, report_path);
    int rc = run_tool(args, out, sizeof out);
    if (rc != 0) fail_msg("%s", out);
    if (!strstr(out, "processes: 4 x 2 devices") ||
        !strstr(out, "across processes: replica; inside a process: fsdp"))
        fail_msg("no process layout in:\n%s", out);
    assert_true(estimated_ms(out) > 2 * one);
    cJSON *j = support_load_json(report_path);
    const cJSON *mesh = cJSON_GetObjectItemCaseSensitive(j, "mesh");
    assert_int_equal((int)number(mesh, "processes"), 4);
    const cJSON *local = cJSON_GetObjectItemCaseSensitive(mesh, "local");
    assert_int_equal(cJSON_GetArraySize(local), 2);
    assert_true(cJSON_IsFalse(cJSON_GetArrayItem(local, 0)));
    assert_true(cJSON_IsTrue(cJSON_GetArrayItem(local, 1)));
    cJSON_Delete(j);

    assert_int_equal(run_tool("explain --processes 3", out, sizeof out), 2);
    assert_non_null(strstr(out, "3 processes do not divide the 8 devices"));
    /* Training over processes is mpirun's (test_cli_mpi). */
    assert_int_equal(run_tool("train --processes 2", out, sizeof out), 2);
    assert_non_null(strstr(out, "mpirun -n 2"));
}

/* A plan needs no GEMM library: with the BLAS loader pointed at a file
 * that does not exist, explain still prints the plan; train refuses
 * before its first step, naming the file. */
static void test_explain_without_blas(void **state)
{
    (void)state;
    static char out[1 << 16];
    const char *missing = "/nonexistent/libcblas.so.3";
    char args[256];
    snprintf(args, sizeof args, "explain --blas %s", missing);
    int rc = run_tool(args, out, sizeof out);
    if (rc != 0) fprintf(stderr, "%s\n", out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "all-gather"));
    assert_non_null(strstr(out, "peak"));
    snprintf(args, sizeof args, "train --steps 1 --eval 0 --blas %s", missing);
    assert_int_not_equal(run_tool(args, out, sizeof out), 0);
    assert_non_null(strstr(out, missing));
    assert_null(strstr(out, "step 1/1"));
}

static void test_bad_mesh_and_shard(void **state)
{
    (void)state;
    char out[4096];
    assert_int_not_equal(run_tool("train --mesh 4x2 --axes replica", out, sizeof out), 0);
    assert_non_null(strstr(out, "mesh"));
    assert_int_not_equal(run_tool("train --mesh 2 --axes data --shard 'input=(data,,x),None'", out, sizeof out), 0);
    assert_non_null(strstr(out, "column"));
    assert_int_not_equal(run_tool("train --mesh 2 --axes data --shard 'nothing*=data'", out, sizeof out), 0);
    assert_non_null(strstr(out, "nothing*"));
    assert_int_not_equal(run_tool("train --mesh 4x2 --devices 6", out, sizeof out), 0);
    assert_non_null(strstr(out, "--devices 6"));
    assert_int_not_equal(run_tool("train --fsdp model", out, sizeof out), 0);
    assert_non_null(strstr(out, "model"));
}

static void test_bad_flags(void **state)
{
    (void)state;
    static char out[1 << 14]; /* the usage text comes before the error */
    assert_int_not_equal(run_tool("train --steps banana", out, sizeof out), 0);
    assert_non_null(strstr(out, "banana"));
    assert_int_not_equal(run_tool("train --frobnicate 3", out, sizeof out), 0);
    assert_non_null(strstr(out, "--frobnicate"));
    assert_int_not_equal(run_tool("train --mesh 2 --axes a,b", out, sizeof out), 0);
    assert_int_not_equal(run_tool("visualize --mesh 4x2 --axes replica,fsdp --shape 8,6 --spec 'fsdq, None'", out, sizeof out), 0);
    assert_non_null(strstr(out, "fsdq"));
    assert_int_not_equal(run_tool("train --dim 30 --heads 4", out, sizeof out), 0);
    assert_non_null(strstr(out, "heads"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_gpt2_124m_one_device, setup, teardown),
        cmocka_unit_test_setup_teardown(test_default_run_learns, setup, teardown),
        cmocka_unit_test_setup_teardown(test_meshes_agree, setup, teardown),
        cmocka_unit_test_setup_teardown(test_checkpointing_lowers_peak, setup, teardown),
        cmocka_unit_test_setup_teardown(test_uneven_batch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_text_data, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mesh_run_matches_one_device, setup, teardown),
        cmocka_unit_test_setup_teardown(test_explain_json, setup, teardown),
        cmocka_unit_test_setup_teardown(test_explain_in_flight, setup, teardown),
        cmocka_unit_test_setup_teardown(test_explain_processes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tensor_parallel_flags, setup, teardown),
        cmocka_unit_test_setup_teardown(test_context_parallel_flags, setup, teardown),
        cmocka_unit_test(test_explain_without_blas),
        cmocka_unit_test(test_bad_mesh_and_shard),
        cmocka_unit_test(test_bad_flags),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
