/*
 * `spmd sample`:
 *   - a seed gives the same text every time; the KV cache gives the text
 *     that rerunning the whole prefix (--cache off) gives, greedy and
 *     sampled, on one device and on a mesh, and the mesh the one-device
 *     text;
 *   - a checkpoint of `spmd train --save` (trained on a 2-device mesh) is
 *     sampled on another mesh, its shape and data taken from its meta;
 *   - prompts encode with the data's symbols, bytes, or an llm.c
 *     tokenizer file (longest token first), and output decodes with them;
 *   - every bad flag value, a wrong tokenizer file, and flags that do not
 *     apply are refused with exit status 2 and a message naming the flag
 *     and the value.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support_files.h"
#include "support_tool.h"

#ifndef SPMD_TOOL_PATH
#error "SPMD_TOOL_PATH must name the spmd binary"
#endif

/* A new arith model small enough to sample in milliseconds. */
#define TINY "--layers 1 --dim 16 --heads 2 --seq 24 --threads 2"

enum { OUT = 1 << 16 };

static char out[OUT];
static char *dir;

static int setup(void **state)
{
    (void)state;
    dir = support_temp_dir("spmd-sample");
    return dir ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    support_drop_dir(dir);
    return 0;
}

static void expect_ok(const char *args)
{
    int rc = run_tool(args, out, sizeof out);
    if (rc != 0) fail_msg("spmd %s: exit %d, wanted 0:\n%s", args, rc, out);
}

/* The samples of the last run: from the first "--- sample" line to the
 * "generated" line (which holds timings), with the "arith:" summary. */
static char *samples_of(const char *args)
{
    expect_ok(args);
    const char *b = strstr(out, "--- sample"), *e = strstr(out, "\ngenerated ");
    if (!b || !e) fail_msg("spmd %s: no samples in:\n%s", args, out);
    char *text = strndup(b, (size_t)(e - b));
    assert_non_null(text);
    return text;
}

static void expect_same(const char *a_args, const char *b_args)
{
    char *a = samples_of(a_args), *b = samples_of(b_args);
    if (strcmp(a, b))
        fail_msg("spmd %s gives:\n%s\nbut spmd %s gives:\n%s", a_args, a, b_args, b);
    free(a);
    free(b);
}

static void expect_refused(const char *args, ...)
{
    int rc = run_tool(args, out, sizeof out);
    if (rc != 2) fail_msg("spmd %s: exit %d, wanted 2:\n%s", args, rc, out);
    if (!strstr(out, "spmd: ")) fail_msg("spmd %s: no \"spmd: \" message in:\n%s", args, out);
    va_list ap;
    va_start(ap, args);
    for (const char *text; (text = va_arg(ap, const char *));)
        if (!strstr(out, text)) fail_msg("spmd %s: no \"%s\" in:\n%s", args, text, out);
    va_end(ap);
}

static void test_same_text_for_a_seed(void **state)
{
    (void)state;
    const char *args = "sample " TINY " --devices 1 --prompt 07+58= --prompt 3 --tokens 14 "
                       "--seed 5";
    expect_same(args, args);
    char *a = samples_of(args);
    expect_ok("sample " TINY " --devices 1 --prompt 07+58= --prompt 3 --tokens 14 --seed 6");
    if (strstr(out, a)) fail_msg("seeds 5 and 6 sample the same text:\n%s", a);
    free(a);
    if (!strstr(out, "tokens/s (KV cache")) fail_msg("no tokens/s in:\n%s", out);
}

static void test_cache_matches_full_prefix(void **state)
{
    (void)state;
    static const char *const runs[] = {
        "--devices 1 --temperature 0",
        "--devices 1 --temperature 0.8 --top-k 5 --seed 9",
        "--mesh 2x2 --axes replica,fsdp --temperature 1.5 --samples 3 --seed 2",
    };
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
        char a[512], b[600];
        snprintf(a, sizeof a, "sample " TINY " --prompt 12+34= --tokens 18 %s", runs[i]);
        snprintf(b, sizeof b, "%s --cache off", a);
        expect_same(a, b);
        if (!strstr(out, "no cache")) fail_msg("spmd %s does not say it ran without the cache", b);
    }
    /* The mesh's text is the one device's. */
    expect_same("sample " TINY " --prompt 12+34= --tokens 18 --samples 3 --seed 2 --devices 1",
                "sample " TINY " --prompt 12+34= --tokens 18 --samples 3 --seed 2 --mesh 3 "
                "--axes data");
}

static void test_checkpoint(void **state)
{
    (void)state;
    char ckpt[SUPPORT_PATH], args[2 * SUPPORT_PATH];
    support_path_in(ckpt, dir, "ckpt");
    snprintf(args, sizeof args,
             "train --layers 1 --dim 16 --heads 2 --seq 20 --batch 8 --steps 20 --mesh 2 --axes "
             "data --eval 0 --threads 2 --save %s", ckpt);
    expect_ok(args);
    snprintf(args, sizeof args, "sample --resume %s --devices 1 --prompt 41+17= --tokens 8", ckpt);
    char *one = samples_of(args);
    if (!strstr(out, "model: ") || !strstr(out, "step 20")) fail_msg("no model line in:\n%s", out);
    snprintf(args, sizeof args, "sample --resume %s --mesh 2x2 --axes replica,fsdp --prompt "
             "41+17= --tokens 8 --cache off", ckpt);
    char *mesh = samples_of(args);
    if (strcmp(one, mesh)) fail_msg("one device:\n%s\nmesh without the cache:\n%s", one, mesh);
    if (!strstr(one, "41+17=")) fail_msg("the prompt is not decoded:\n%s", one);
    free(one);
    free(mesh);
    /* No prompt: arith rows open with a digit, as the data's samples do. */
    snprintf(args, sizeof args, "sample --resume %s --devices 1 --samples 2 --tokens 5", ckpt);
    char *start = samples_of(args);
    const char *first = strstr(start, "(1 prompt + 5 new tokens)\n");
    if (!first || first[26] < '0' || first[26] > '9')
        fail_msg("a row without a prompt does not start with a digit:\n%s", start);
    free(start);
    /* The checkpoint gives shape and data. */
    snprintf(args, sizeof args, "sample --resume %s --dim 32", ckpt);
    expect_refused(args, "--resume", "shape", NULL);
    snprintf(args, sizeof args, "sample --resume %s --data arith", ckpt);
    expect_refused(args, "--resume", "--data", NULL);
}

/* An llm.c tokenizer file: header (magic, version, vocabulary size, end of
 * text), then the tokens. */
static void write_tokenizer(const char *path, uint32_t magic, uint32_t version, int extra_tokens,
                            bool cut)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint32_t header[256] = {magic, version, (uint32_t)(256 + extra_tokens), 256};
    fwrite(header, sizeof header, 1, f);
    for (int b = 0; b < 256; b++) {
        fputc(1, f);
        fputc(b, f);
    }
    static const char *const words[] = {"<|end|>", "hello", " world", "he"};
    for (int i = 0; i < extra_tokens && i < 4; i++) {
        fputc((int)strlen(words[i]), f);
        if (!cut || i < 2) fputs(words[i], f);
    }
    fclose(f);
}

static void test_tokenizer(void **state)
{
    (void)state;
    char tok[SUPPORT_PATH], args[2 * SUPPORT_PATH];
    support_path_in(tok, dir, "tokenizer.bin");
    write_tokenizer(tok, 20240328, 2, 4, false);
    /* 260 tokens: only a tokenizer can print them. */
    expect_refused("sample " TINY " --vocab 260 --devices 1", "--tokenizer", "260", NULL);
    snprintf(args, sizeof args,
             "sample " TINY " --vocab 260 --devices 1 --tokenizer %s --prompt 'hello world!' "
             "--tokens 4", tok);
    char *text = samples_of(args);
    if (!strstr(text, "(3 prompt + 4 new tokens)\nhello world!"))
        fail_msg("'hello world!' is not 3 tokens (hello, ' world', '!') decoded back:\n%s", text);
    free(text);
    /* A tokenizer larger than the model: prompt tokens past its rows. */
    snprintf(args, sizeof args,
             "sample " TINY " --vocab 257 --devices 1 --tokenizer %s --prompt 'say hello'", tok);
    expect_refused(args, "--prompt 'say hello'", "token 257 ('hello')", "vocabulary of 257", NULL);
    snprintf(args, sizeof args, "sample " TINY " --vocab 261 --devices 1 --tokenizer %s", tok);
    expect_refused(args, "--tokenizer", "260 tokens", "261", NULL);

    write_tokenizer(tok, 20240520, 1, 4, false);
    snprintf(args, sizeof args, "sample " TINY " --vocab 260 --tokenizer %s", tok);
    expect_refused(args, "--tokenizer", tok, "magic 20240520", "20240328", NULL);
    write_tokenizer(tok, 20240328, 3, 4, false);
    expect_refused(args, "--tokenizer", "version 3", NULL);
    write_tokenizer(tok, 20240328, 1, 4, true);
    expect_refused(args, "--tokenizer", "ends inside token 258", NULL);
    FILE *f = fopen(tok, "wb");
    fputs("not a tokenizer", f);
    fclose(f);
    expect_refused(args, "--tokenizer", "header", NULL);
    expect_refused("sample " TINY " --vocab 260 --tokenizer /nonexistent/tok.bin",
                   "--tokenizer /nonexistent/tok.bin", NULL);
}

static void test_bad_flags(void **state)
{
    (void)state;
    static const struct {
        const char *args, *want1, *want2;
    } bad[] = {
        {"--tokens 0", "--tokens", "'0'"},
        {"--tokens lots", "--tokens", "'lots'"},
        {"--tokens 30", "--tokens 30", "context of 24"},
        {"--prompt 12+34=567890123456789012345", "--prompt", "no room"},
        {"--temperature -1", "--temperature", "'-1'"},
        {"--temperature warm", "--temperature", "'warm'"},
        {"--temperature nan", "--temperature", "'nan'"},
        {"--top-k -2", "--top-k", "'-2'"},
        {"--samples 0", "--samples", "'0'"},
        {"--cache maybe", "--cache", "'maybe'"},
        {"--prompt ''", "--prompt", "empty"},
        {"--prompt 12*3", "--prompt '12*3'", "0x2a"},
        {"--seed -1", "--seed", "'-1'"},
        {"--mesh 3x", "--mesh 3x", ""},
        {"--steps 5", "unknown flag '--steps'", ""},
        {"--tokens", "--tokens needs a value", ""},
        {"stray", "unexpected argument 'stray'", ""},
        {"--resume /nonexistent/ckpt", "--resume /nonexistent/ckpt", ""},
        {"--init /nonexistent/w.bin", "--init", "/nonexistent/w.bin"},
        {"--init /nonexistent/w.bin --data arith", "--init", "--data"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char args[256];
        snprintf(args, sizeof args, "sample " TINY " --devices 1 %s", bad[i].args);
        expect_refused(args, bad[i].want1, bad[i].want2, NULL);
    }
    expect_ok("sample --help");
    if (!strstr(out, "--temperature")) fail_msg("help lacks --temperature:\n%s", out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_text_for_a_seed),
        cmocka_unit_test(test_cache_matches_full_prefix),
        cmocka_unit_test(test_checkpoint),
        cmocka_unit_test(test_tokenizer),
        cmocka_unit_test(test_bad_flags),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
