/*
 * Training data (spmd/data.h): samples are pure functions of (seed, split,
 * index) whatever the batch size or offset; arith problems are correct
 * sums, held-out operand pairs never reach a training sample and the score
 * mask marks exactly the answer digits; text and shard windows stay on
 * their side of the held-out boundary; and every bad file (missing, short,
 * wrong magic or version, truncated, tokens beyond the vocabulary) fails
 * with a message that names the file and the cause, as does a shard cut
 * short while the data set reads it (no SIGBUS).  The formats docs/train.md's
 * "Data files" states are the ones read: a shard written as it says opens,
 * and llm.c's other files (checkpoint, tokenizer) and version 2 shards are
 * refused naming what they are.  Files are written to a fresh directory
 * under $TMPDIR (or the build directory) and removed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "spmd/data.h"
#include "spmd/weights.h"

#define has(msg, s) assert_non_null(strstr((msg), (s)))

/* ---- Helpers ---------------------------------------------------------------- */

static void make_dir(char *dir, size_t size)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, size, "%s/spmd_test_data_XXXXXX", tmp && *tmp ? tmp : ".");
    assert_non_null(mkdtemp(dir));
}

static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    char path[1024];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            if (rmdir(path) != 0) unlink(path);
        }
    closedir(d);
    assert_int_equal(rmdir(dir), 0);
}

static void write_bytes(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (n) assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* An llm.c shard with the given header fields and `n` tokens (the header
 * may claim a different count). */
static void write_shard(const char *path, int32_t magic, int32_t version, int32_t count,
                        const uint16_t *tokens, size_t n)
{
    size_t bytes = 1024 + 2 * n;
    uint8_t *buf = calloc(1, bytes);
    assert_non_null(buf);
    int32_t h[3] = {magic, version, count};
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 4; k++) buf[4 * i + k] = (uint8_t)((uint32_t)h[i] >> (8 * k));
    for (size_t i = 0; i < n; i++) {
        buf[1024 + 2 * i] = (uint8_t)(tokens[i] & 0xff);
        buf[1024 + 2 * i + 1] = (uint8_t)(tokens[i] >> 8);
    }
    write_bytes(path, buf, bytes);
    free(buf);
}

static uint64_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return *s >> 33;
}

/* n random tokens in [lo, lo + span). */
static uint16_t *random_tokens(size_t n, int lo, int span, uint64_t seed)
{
    uint16_t *t = malloc(n * sizeof *t);
    assert_non_null(t);
    for (size_t i = 0; i < n; i++) t[i] = (uint16_t)(lo + (int)(lcg(&seed) % (uint64_t)span));
    return t;
}

/* One sample's seq+1 tokens from a batch row: the input, then the last
 * target; also checks that targets are the input shifted by one. */
static void sample_tokens(const int32_t *in, const int32_t *tg, int seq, int32_t *out)
{
    for (int t = 0; t + 1 < seq; t++) assert_int_equal(tg[t], in[t + 1]);
    memcpy(out, in, (size_t)seq * sizeof *out);
    out[seq] = tg[seq - 1];
}

/* ---- Argument checks --------------------------------------------------------- */

static void test_bad_arguments(void **state)
{
    (void)state;
    spmd_clear_error();
    assert_null(spmd_dataset_open(NULL, 0, 1));
    has(spmd_last_error(), "seq");
    assert_null(spmd_dataset_open("", 8, 1));
    has(spmd_last_error(), "empty source");
    assert_null(spmd_dataset_open("arith:7", 8, 1));
    has(spmd_last_error(), "arith:N");
    spmd_dataset_free(NULL);

    spmd_dataset *d = spmd_dataset_open("arith", 8, 1);
    assert_non_null(d);
    int32_t in[16], tg[16];
    uint8_t mask[16];
    assert_int_equal(spmd_dataset_batch(d, SPMD_SPLIT_TRAIN, 0, 0, in, tg), SPMD_ERR_INVALID);
    assert_int_equal(spmd_dataset_batch(d, SPMD_SPLIT_TRAIN, -1, 1, in, tg), SPMD_ERR_INVALID);
    assert_int_equal(spmd_dataset_batch(d, SPMD_SPLIT_TRAIN, INT64_MAX, 2, in, tg),
                     SPMD_ERR_INVALID);
    assert_int_equal(spmd_dataset_batch(d, (spmd_split)5, 0, 1, in, tg), SPMD_ERR_INVALID);
    has(spmd_last_error(), "split");
    assert_int_equal(spmd_dataset_batch(d, SPMD_SPLIT_TRAIN, 0, 1, NULL, tg), SPMD_ERR_INVALID);
    assert_int_equal(spmd_dataset_score_mask(d, SPMD_SPLIT_TRAIN, 0, 1, NULL), SPMD_ERR_INVALID);
    assert_int_equal(spmd_dataset_score_mask(d, SPMD_SPLIT_TRAIN, 0, 2, mask), SPMD_OK);
    assert_int_equal(spmd_dataset_check_vocab(d, 0), SPMD_ERR_INVALID);
    assert_int_equal(spmd_dataset_batch(NULL, SPMD_SPLIT_TRAIN, 0, 1, in, tg), SPMD_ERR_INVALID);
    spmd_dataset_free(d);

    /* The stateless generator the tool uses is still there. */
    assert_int_equal(spmd_data_sequences(3, 0, 2, 8, 16, in, tg), SPMD_OK);
    for (int i = 0; i < 16; i++) assert_true(in[i] >= 0 && in[i] < 16);
}

/* ---- arith ----------------------------------------------------------------- */

enum { SEQ = 64, PROBLEM = 10 /* "07+58=065\n" */ };

/* Decodes a fixed-width problem at `p` (at least 5 tokens: "aa+bb").  Checks
 * the format and the sum of as much as is there; returns a * 100 + b. */
static int check_problem(const int32_t *p, int avail)
{
    static const char *shape = "dd+dd=ddd\n";
    char c[PROBLEM];
    for (int i = 0; i < avail && i < PROBLEM; i++) {
        assert_true(p[i] >= 0 && p[i] < SPMD_ARITH_VOCAB);
        c[i] = SPMD_ARITH_ALPHABET[p[i]];
        if (shape[i] == 'd') assert_true(c[i] >= '0' && c[i] <= '9');
        else assert_int_equal(c[i], shape[i]);
    }
    int a = (c[0] - '0') * 10 + (c[1] - '0'), b = (c[3] - '0') * 10 + (c[4] - '0');
    char want[16];
    snprintf(want, sizeof want, "%03d", a + b);
    for (int i = 6; i < avail && i < 9; i++) assert_int_equal(c[i], want[i - 6]);
    return a * 100 + b;
}

static void test_arith_format_and_determinism(void **state)
{
    (void)state;
    spmd_dataset *d = spmd_dataset_open(NULL, SEQ, 42);
    assert_non_null(d);
    assert_int_equal(spmd_dataset_vocab(d), SPMD_ARITH_VOCAB);
    assert_int_equal(spmd_dataset_seq(d), SEQ);
    assert_true(spmd_dataset_has_accuracy(d));
    has(spmd_dataset_describe(d), "arith: ");
    assert_int_equal(spmd_dataset_check_vocab(d, SPMD_ARITH_VOCAB), SPMD_OK);
    assert_int_equal(spmd_dataset_check_vocab(d, 12), SPMD_ERR_INVALID);
    has(spmd_last_error(), "vocab >= 13");

    enum { B = 16 };
    int32_t in[B * SEQ], tg[B * SEQ], in2[B * SEQ], tg2[B * SEQ], s[SEQ + 1];
    for (int split = 0; split < 2; split++) {
        assert_int_equal(spmd_dataset_batch(d, (spmd_split)split, 100, B, in, tg), SPMD_OK);
        for (int b = 0; b < B; b++) {
            sample_tokens(in + b * SEQ, tg + b * SEQ, SEQ, s);
            for (int at = 0; at + 5 <= SEQ + 1; at += PROBLEM) check_problem(s + at, SEQ + 1 - at);
        }
        /* Same samples whatever the batch split or offset. */
        for (int b = 0; b < B; b += 3) {
            int n = b + 3 <= B ? 3 : B - b;
            assert_int_equal(spmd_dataset_batch(d, (spmd_split)split, 100 + b, n, in2, tg2),
                             SPMD_OK);
            assert_memory_equal(in2, in + b * SEQ, (size_t)n * SEQ * sizeof *in);
            assert_memory_equal(tg2, tg + b * SEQ, (size_t)n * SEQ * sizeof *tg);
        }
    }
    /* A second handle with the same seed agrees; another seed does not. */
    spmd_dataset *same = spmd_dataset_open("arith", SEQ, 42);
    spmd_dataset *other = spmd_dataset_open("arith", SEQ, 43);
    assert_non_null(same);
    assert_non_null(other);
    assert_int_equal(spmd_dataset_batch(same, SPMD_SPLIT_HELDOUT, 100, B, in2, tg2), SPMD_OK);
    assert_memory_equal(in2, in, sizeof in);
    assert_int_equal(spmd_dataset_batch(other, SPMD_SPLIT_HELDOUT, 100, B, in2, tg2), SPMD_OK);
    assert_memory_not_equal(in2, in, sizeof in);
    /* The splits differ too. */
    assert_int_equal(spmd_dataset_batch(d, SPMD_SPLIT_TRAIN, 100, B, in2, tg2), SPMD_OK);
    assert_memory_not_equal(in2, in, sizeof in);
    spmd_dataset_free(same);
    spmd_dataset_free(other);
    spmd_dataset_free(d);
}

static void test_arith_other_widths(void **state)
{
    (void)state;
    const char *src[2] = {"arith:1", "arith:3"};
    const char *shape[2] = {"d+d=dd\n", "ddd+ddd=dddd\n"};
    for (int k = 0; k < 2; k++) {
        spmd_dataset *d = spmd_dataset_open(src[k], 40, 7);
        assert_non_null(d);
        int32_t in[4 * 40], tg[4 * 40], s[41];
        assert_int_equal(spmd_dataset_batch(d, SPMD_SPLIT_HELDOUT, 0, 4, in, tg), SPMD_OK);
        int len = (int)strlen(shape[k]), digits = k ? 3 : 1;
        for (int b = 0; b < 4; b++) {
            sample_tokens(in + b * 40, tg + b * 40, 40, s);
            for (int at = 0; at + len <= 41; at += len) {
                long v[3] = {0, 0, 0};
                int field = 0;
                for (int i = 0; i < len; i++) {
                    char c = SPMD_ARITH_ALPHABET[s[at + i]];
                    if (shape[k][i] == 'd') v[field] = v[field] * 10 + (c - '0');
                    else {
                        assert_int_equal(c, shape[k][i]);
                        field++;
                    }
                }
                assert_int_equal(v[0] + v[1], v[2]);
                assert_true(v[0] < (digits == 1 ? 10 : 1000));
            }
        }
        spmd_dataset_free(d);
    }
}

/* No held-out pair (in either order) is in a training sample. */
static void test_arith_heldout_disjoint(void **state)
{
    (void)state;
    spmd_dataset *d = spmd_dataset_open("arith", SEQ, 5);
    assert_non_null(d);
    static uint8_t held[10000], trained[10000];
    memset(held, 0, sizeof held);
    memset(trained, 0, sizeof trained);
    enum { B = 100 };
    int32_t *in = malloc(B * SEQ * sizeof *in), *tg = malloc(B * SEQ * sizeof *tg), s[SEQ + 1];
    assert_non_null(in);
    assert_non_null(tg);
    for (int64_t first = 0; first < 3000; first += B) {
        assert_int_equal(spmd_dataset_batch(d, SPMD_SPLIT_HELDOUT, first, B, in, tg), SPMD_OK);
        for (int b = 0; b < B; b++) {
            sample_tokens(in + b * SEQ, tg + b * SEQ, SEQ, s);
            for (int at = 0; at + 5 <= SEQ + 1; at += PROBLEM) {
                int ab = check_problem(s + at, SEQ + 1 - at);
                held[ab] = held[(ab % 100) * 100 + ab / 100] = 1;
            }
        }
    }
    int nheld = 0;
    for (int i = 0; i < 10000; i++) nheld += held[i];
    assert_in_range(nheld, 500, 1500); /* about 10% of the pairs */
    for (int64_t first = 0; first < 4000; first += B) {
        assert_int_equal(spmd_dataset_batch(d, SPMD_SPLIT_TRAIN, first, B, in, tg), SPMD_OK);
        for (int b = 0; b < B; b++) {
            sample_tokens(in + b * SEQ, tg + b * SEQ, SEQ, s);
            for (int at = 0; at + 5 <= SEQ + 1; at += PROBLEM) {
                int ab = check_problem(s + at, SEQ + 1 - at);
                if (held[ab]) fail_msg("held-out pair %d+%d in training sample %lld", ab / 100,
                                       ab % 100, (long long)(first + b));
                trained[ab] = 1;
            }
        }
    }
    int ntrained = 0;
    for (int i = 0; i < 10000; i++) ntrained += trained[i];
    assert_true(ntrained + nheld > 9500); /* the training split covers the rest */
    free(in);
    free(tg);
    spmd_dataset_free(d);
}

/* The mask is 1 exactly where the target is an answer digit. */
static void test_arith_score_mask(void **state)
{
    (void)state;
    spmd_dataset *d = spmd_dataset_open("arith", SEQ, 9);
    assert_non_null(d);
    enum { B = 24 };
    int32_t in[B * SEQ], tg[B * SEQ], s[SEQ + 1];
    uint8_t mask[B * SEQ], part[3 * SEQ];
    for (int split = 0; split < 2; split++) {
        assert_int_equal(spmd_dataset_batch(d, (spmd_split)split, 7, B, in, tg), SPMD_OK);
        assert_int_equal(spmd_dataset_score_mask(d, (spmd_split)split, 7, B, mask), SPMD_OK);
        int marked = 0;
        for (int b = 0; b < B; b++) {
            sample_tokens(in + b * SEQ, tg + b * SEQ, SEQ, s);
            for (int t = 0; t < SEQ; t++) {
                int offset = (t + 1) % PROBLEM; /* of the target in its problem */
                int answer = offset >= 6 && offset <= 8;
                assert_int_equal(mask[b * SEQ + t], answer);
                if (answer) assert_true(tg[b * SEQ + t] <= 9);
                marked += answer;
            }
        }
        assert_true(marked > B * SEQ / 4);
        /* Same samples as the batch, at any offset. */
        assert_int_equal(spmd_dataset_score_mask(d, (spmd_split)split, 7 + 10, 3, part), SPMD_OK);
        assert_memory_equal(part, mask + 10 * SEQ, sizeof part);
    }
    spmd_dataset_free(d);
}

/* ---- Byte-level text --------------------------------------------------------- */

enum { TEXT_BYTES = 4000, TSEQ = 32 };

static void test_text_windows(void **state)
{
    (void)state;
    char dir[512], path[600];
    make_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/corpus.txt", dir);
    uint8_t *bytes = malloc(TEXT_BYTES);
    assert_non_null(bytes);
    uint64_t r = 11;
    for (int i = 0; i < TEXT_BYTES; i++) bytes[i] = (uint8_t)lcg(&r);
    bytes[17] = 200;
    write_bytes(path, bytes, TEXT_BYTES);

    spmd_dataset *d = spmd_dataset_open(path, TSEQ, 3);
    assert_non_null(d);
    assert_int_equal(spmd_dataset_vocab(d), 256);
    assert_false(spmd_dataset_has_accuracy(d));
    has(spmd_dataset_describe(d), "text: ");
    has(spmd_dataset_describe(d), "4000 bytes");
    const int boundary = TEXT_BYTES - TEXT_BYTES / 10;

    enum { B = 50 };
    int32_t in[B * TSEQ], tg[B * TSEQ], in2[B * TSEQ], tg2[B * TSEQ], s[TSEQ + 1];
    uint8_t w[TSEQ + 1];
    int max_end = 0;
    for (int split = 0; split < 2; split++)
        for (int64_t first = 0; first < 1000; first += B) {
            assert_int_equal(spmd_dataset_batch(d, (spmd_split)split, first, B, in, tg), SPMD_OK);
            for (int b = 0; b < B; b++) {
                sample_tokens(in + b * TSEQ, tg + b * TSEQ, TSEQ, s);
                for (int i = 0; i <= TSEQ; i++) w[i] = (uint8_t)s[i];
                const uint8_t *at = memmem(bytes, TEXT_BYTES, w, sizeof w);
                assert_non_null(at); /* a window of the file */
                int pos = (int)(at - bytes);
                if (split == SPMD_SPLIT_TRAIN) {
                    assert_true(pos + TSEQ + 1 <= boundary);
                    if (pos + TSEQ + 1 > max_end) max_end = pos + TSEQ + 1;
                } else {
                    assert_true(pos >= boundary);
                }
            }
        }
    assert_true(max_end > boundary - 100); /* training reaches the boundary */

    /* Deterministic whatever the batch size. */
    assert_int_equal(spmd_dataset_batch(d, SPMD_SPLIT_TRAIN, 20, 10, in, tg), SPMD_OK);
    for (int b = 0; b < 10; b++) {
        assert_int_equal(spmd_dataset_batch(d, SPMD_SPLIT_TRAIN, 20 + b, 1, in2, tg2), SPMD_OK);
        assert_memory_equal(in2, in + b * TSEQ, TSEQ * sizeof *in);
    }
    uint8_t mask[TSEQ];
    assert_int_equal(spmd_dataset_score_mask(d, SPMD_SPLIT_TRAIN, 0, 1, mask),
                     SPMD_ERR_UNSUPPORTED);
    has(spmd_last_error(), "no accuracy");
    /* A byte-level model needs all 256 bytes; the error finds the first
     * byte that does not fit. */
    assert_int_equal(spmd_dataset_check_vocab(d, 256), SPMD_OK);
    int first_big = 0;
    while (bytes[first_big] < 128) first_big++;
    assert_int_equal(spmd_dataset_check_vocab(d, 128), SPMD_ERR_INVALID);
    char want[64];
    snprintf(want, sizeof want, "byte %d", bytes[first_big]);
    has(spmd_last_error(), want);
    snprintf(want, sizeof want, "offset %d", first_big);
    has(spmd_last_error(), want);
    has(spmd_last_error(), path);
    spmd_dataset_free(d);
    free(bytes);
    remove_dir(dir);
}

static void test_text_errors(void **state)
{
    (void)state;
    char dir[512], path[600];
    make_dir(dir, sizeof dir);

    snprintf(path, sizeof path, "%s/missing.txt", dir);
    spmd_clear_error();
    assert_null(spmd_dataset_open(path, TSEQ, 1));
    has(spmd_last_error(), "cannot open");
    has(spmd_last_error(), path);

    snprintf(path, sizeof path, "%s/empty.txt", dir);
    write_bytes(path, "", 0);
    assert_null(spmd_dataset_open(path, TSEQ, 1));
    has(spmd_last_error(), "empty");

    snprintf(path, sizeof path, "%s/short.txt", dir);
    write_bytes(path, "hello, world\n", 13);
    assert_null(spmd_dataset_open(path, TSEQ, 1));
    has(spmd_last_error(), "too short");
    has(spmd_last_error(), "13 bytes");
    /* 2 * (seq + 1) bytes is just enough: one window each side. */
    spmd_dataset *d = spmd_dataset_open(path, 5, 1);
    assert_non_null(d);
    int32_t in[5], tg[5];
    assert_int_equal(spmd_dataset_batch(d, SPMD_SPLIT_HELDOUT, 0, 1, in, tg), SPMD_OK);
    assert_int_equal(in[0], 'w'); /* "world\n", the last 6 bytes */
    assert_int_equal(tg[4], '\n');
    assert_int_equal(spmd_dataset_batch(d, SPMD_SPLIT_TRAIN, 0, 1, in, tg), SPMD_OK);
    assert_true(in[0] == 'h' || in[0] == 'e'); /* the two windows in "hello, " */
    spmd_dataset_free(d);

    assert_null(spmd_dataset_open(dir, TSEQ, 1));
    has(spmd_last_error(), "not a regular file");

    if (geteuid() != 0) { /* root reads anything */
        snprintf(path, sizeof path, "%s/secret.txt", dir);
        write_bytes(path, "0123456789012345678901234567890123456789012345678901234567890123456789",
                    70);
        assert_int_equal(chmod(path, 0), 0);
        assert_null(spmd_dataset_open(path, TSEQ, 1));
        has(spmd_last_error(), "cannot open");
        has(spmd_last_error(), "Permission denied");
    }
    remove_dir(dir);
}

/* ---- llm.c shards ----------------------------------------------------------- */

enum { MAGIC = 20240520, NTOK = 2000 };

static void test_shard_single_file(void **state)
{
    (void)state;
    char dir[512], path[600];
    make_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/tokens.bin", dir);
    uint16_t *tok = random_tokens(NTOK, 0, 1000, 21);
    tok[1500] = 999; /* the largest token, so vocab is 1000 */
    write_shard(path, MAGIC, 1, NTOK, tok, NTOK);

    spmd_dataset *d = spmd_dataset_open(path, TSEQ, 8);
    assert_non_null(d);
    assert_int_equal(spmd_dataset_vocab(d), 1000);
    assert_false(spmd_dataset_has_accuracy(d));
    has(spmd_dataset_describe(d), "shards: 1 file, 2000 tokens");
    assert_int_equal(spmd_dataset_check_vocab(d, 1000), SPMD_OK);
    assert_int_equal(spmd_dataset_check_vocab(d, 50257), SPMD_OK);

    const int boundary = NTOK - NTOK / 10;
    enum { B = 40 };
    int32_t in[B * TSEQ], tg[B * TSEQ], in2[B * TSEQ], tg2[B * TSEQ], s[TSEQ + 1];
    for (int split = 0; split < 2; split++)
        for (int64_t first = 0; first < 400; first += B) {
            assert_int_equal(spmd_dataset_batch(d, (spmd_split)split, first, B, in, tg), SPMD_OK);
            for (int b = 0; b < B; b++) {
                sample_tokens(in + b * TSEQ, tg + b * TSEQ, TSEQ, s);
                int pos = -1;
                for (int p = 0; p + TSEQ < NTOK && pos < 0; p++) {
                    int i = 0;
                    while (i <= TSEQ && tok[p + i] == s[i]) i++;
                    if (i > TSEQ) pos = p;
                }
                assert_true(pos >= 0);
                if (split == SPMD_SPLIT_TRAIN) assert_true(pos + TSEQ + 1 <= boundary);
                else assert_true(pos >= boundary);
            }
        }
    assert_int_equal(spmd_dataset_batch(d, SPMD_SPLIT_HELDOUT, 3, 6, in, tg), SPMD_OK);
    assert_int_equal(spmd_dataset_batch(d, SPMD_SPLIT_HELDOUT, 5, 2, in2, tg2), SPMD_OK);
    assert_memory_equal(in2, in + 2 * TSEQ, 2 * TSEQ * sizeof *in);
    assert_memory_equal(tg2, tg + 2 * TSEQ, 2 * TSEQ * sizeof *tg);
    spmd_dataset_free(d);
    free(tok);
    remove_dir(dir);
}

/* Whether every token of a split's samples is in [lo, hi). */
static void expect_split_range(spmd_dataset *d, spmd_split split, int lo, int hi)
{
    enum { B = 32 };
    int32_t in[B * TSEQ], tg[B * TSEQ];
    assert_int_equal(spmd_dataset_batch(d, split, 0, B, in, tg), SPMD_OK);
    for (int i = 0; i < B * TSEQ; i++) {
        assert_in_range(in[i], lo, hi - 1);
        assert_in_range(tg[i], lo, hi - 1);
    }
}

static void test_shard_glob(void **state)
{
    (void)state;
    char dir[512], path[600], pattern[600];
    make_dir(dir, sizeof dir);
    uint16_t *low = random_tokens(NTOK, 0, 500, 1), *high = random_tokens(NTOK, 500, 500, 2);

    /* No file named val: the first (sorted) file is held out. */
    snprintf(path, sizeof path, "%s/b_000001.bin", dir);
    write_shard(path, MAGIC, 1, NTOK, high, NTOK);
    snprintf(path, sizeof path, "%s/a_000000.bin", dir);
    write_shard(path, MAGIC, 1, NTOK, low, NTOK);
    snprintf(pattern, sizeof pattern, "%s/*.bin", dir);
    spmd_dataset *d = spmd_dataset_open(pattern, TSEQ, 4);
    assert_non_null(d);
    has(spmd_dataset_describe(d), "shards: 2 files, 4000 tokens");
    has(spmd_dataset_describe(d), "a_000000.bin held out");
    expect_split_range(d, SPMD_SPLIT_HELDOUT, 0, 500);
    expect_split_range(d, SPMD_SPLIT_TRAIN, 500, 1000);
    spmd_dataset_free(d);

    /* llm.c names: the val file is held out though it sorts last. */
    snprintf(path, sizeof path, "%s/x_train.bin", dir);
    write_shard(path, MAGIC, 1, NTOK, low, NTOK);
    snprintf(path, sizeof path, "%s/x_val.bin", dir);
    write_shard(path, MAGIC, 1, NTOK, high, NTOK);
    snprintf(pattern, sizeof pattern, "%s/x_*.bin", dir);
    d = spmd_dataset_open(pattern, TSEQ, 4);
    assert_non_null(d);
    has(spmd_dataset_describe(d), "named *val* held out");
    expect_split_range(d, SPMD_SPLIT_HELDOUT, 500, 1000);
    expect_split_range(d, SPMD_SPLIT_TRAIN, 0, 500);
    spmd_dataset_free(d);

    /* A bad file in the glob fails the whole set, by name. */
    snprintf(path, sizeof path, "%s/x_zbad.bin", dir);
    write_shard(path, 1234, 1, NTOK, low, NTOK);
    spmd_clear_error();
    assert_null(spmd_dataset_open(pattern, TSEQ, 4));
    has(spmd_last_error(), "x_zbad.bin");
    has(spmd_last_error(), "wrong magic");

    /* A glob that matches nothing. */
    snprintf(pattern, sizeof pattern, "%s/nothing_*.bin", dir);
    assert_null(spmd_dataset_open(pattern, TSEQ, 4));
    has(spmd_last_error(), "no file matches");
    has(spmd_last_error(), pattern);
    free(low);
    free(high);
    remove_dir(dir);
}

/* Sequential order: row b of batch k starts at token k*B*T + b*T of the
 * training part, file after file, wrapping round; other data refuses it. */
static void test_shard_sequential(void **state)
{
    (void)state;
    char dir[512], path[600], pattern[600];
    make_dir(dir, sizeof dir);
    uint16_t *a = random_tokens(NTOK, 0, 1000, 5), *b = random_tokens(NTOK, 0, 1000, 6);
    snprintf(path, sizeof path, "%s/s_train_0.bin", dir);
    write_shard(path, MAGIC, 1, NTOK, a, NTOK);
    snprintf(path, sizeof path, "%s/s_train_1.bin", dir);
    write_shard(path, MAGIC, 1, NTOK, b, NTOK);
    snprintf(path, sizeof path, "%s/s_val.bin", dir);
    write_shard(path, MAGIC, 1, NTOK, b, NTOK);
    snprintf(pattern, sizeof pattern, "%s/s_*.bin", dir);
    spmd_dataset *d = spmd_dataset_open(pattern, TSEQ, 4);
    assert_non_null(d);
    assert_int_equal(spmd_dataset_set_order(d, SPMD_DATA_SEQUENTIAL), SPMD_OK);

    enum { B = 4 };
    const int per_file = (NTOK - 1) / TSEQ; /* windows every TSEQ tokens in a file */
    int32_t in[B * TSEQ], tg[B * TSEQ], s[TSEQ + 1];
    for (int k = 0; k < 2 * per_file / B + 3; k++) {
        assert_int_equal(spmd_dataset_batch(d, SPMD_SPLIT_TRAIN, (int64_t)k * B, B, in, tg), SPMD_OK);
        for (int r = 0; r < B; r++) {
            int w = (k * B + r) % (2 * per_file); /* wraps round after both files */
            const uint16_t *file = w < per_file ? a : b;
            int at = (w % per_file) * TSEQ;
            sample_tokens(in + r * TSEQ, tg + r * TSEQ, TSEQ, s);
            for (int i = 0; i <= TSEQ; i++) assert_int_equal(s[i], file[at + i]);
        }
    }
    spmd_dataset_free(d);

    d = spmd_dataset_open("arith", TSEQ, 4);
    assert_non_null(d);
    assert_int_equal(spmd_dataset_set_order(d, SPMD_DATA_SEQUENTIAL), SPMD_ERR_UNSUPPORTED);
    has(spmd_last_error(), "llm.c token shards");
    assert_int_equal(spmd_dataset_set_order(d, SPMD_DATA_SHUFFLED), SPMD_OK);
    spmd_dataset_free(d);
    free(a);
    free(b);
    remove_dir(dir);
}

static void test_shard_errors(void **state)
{
    (void)state;
    char dir[512], path[600];
    make_dir(dir, sizeof dir);
    uint16_t *tok = random_tokens(NTOK, 0, 100, 3);
    spmd_clear_error();

    snprintf(path, sizeof path, "%s/missing.bin", dir);
    assert_null(spmd_dataset_open(path, TSEQ, 1));
    has(spmd_last_error(), "cannot open");
    has(spmd_last_error(), path);

    snprintf(path, sizeof path, "%s/empty.bin", dir);
    write_bytes(path, "", 0);
    assert_null(spmd_dataset_open(path, TSEQ, 1));
    has(spmd_last_error(), "empty");
    has(spmd_last_error(), "truncated header");

    /* Right magic, then the file stops inside the header. */
    snprintf(path, sizeof path, "%s/short_header.bin", dir);
    uint8_t head[100] = {0};
    head[0] = (uint8_t)(MAGIC & 0xff), head[1] = (uint8_t)(MAGIC >> 8 & 0xff);
    head[2] = (uint8_t)(MAGIC >> 16 & 0xff), head[3] = (uint8_t)(MAGIC >> 24);
    write_bytes(path, head, sizeof head);
    assert_null(spmd_dataset_open(path, TSEQ, 1));
    has(spmd_last_error(), "truncated header");
    has(spmd_last_error(), "100 bytes");

    snprintf(path, sizeof path, "%s/magic.bin", dir);
    write_shard(path, 12345, 1, NTOK, tok, NTOK);
    assert_null(spmd_dataset_open(path, TSEQ, 1));
    has(spmd_last_error(), "wrong magic number 12345");
    has(spmd_last_error(), "expected 20240520");
    has(spmd_last_error(), "different format");
    has(spmd_last_error(), path);

    /* A text file named .bin is caught by its magic too. */
    snprintf(path, sizeof path, "%s/notes.bin", dir);
    write_bytes(path, "just some text", 14);
    assert_null(spmd_dataset_open(path, TSEQ, 1));
    has(spmd_last_error(), "wrong magic");

    snprintf(path, sizeof path, "%s/model.bin", dir);
    write_shard(path, 20240326, 3, NTOK, tok, NTOK);
    assert_null(spmd_dataset_open(path, TSEQ, 1));
    has(spmd_last_error(), "model checkpoint");

    snprintf(path, sizeof path, "%s/version.bin", dir);
    write_shard(path, MAGIC, 2, NTOK, tok, NTOK);
    assert_int_equal(spmd_dataset_open(path, TSEQ, 1), NULL);
    has(spmd_last_error(), "unsupported version 2");
    has(spmd_last_error(), "uint32");

    snprintf(path, sizeof path, "%s/truncated.bin", dir);
    write_shard(path, MAGIC, 1, NTOK, tok, NTOK / 2);
    assert_null(spmd_dataset_open(path, TSEQ, 1));
    has(spmd_last_error(), "header says 2000 tokens");
    has(spmd_last_error(), "truncated file");

    snprintf(path, sizeof path, "%s/trailing.bin", dir);
    write_shard(path, MAGIC, 1, NTOK / 2, tok, NTOK);
    assert_null(spmd_dataset_open(path, TSEQ, 1));
    has(spmd_last_error(), "trailing bytes");

    snprintf(path, sizeof path, "%s/zero.bin", dir);
    write_shard(path, MAGIC, 1, 0, tok, 0);
    assert_null(spmd_dataset_open(path, TSEQ, 1));
    has(spmd_last_error(), "zero tokens");

    snprintf(path, sizeof path, "%s/tiny.bin", dir);
    write_shard(path, MAGIC, 1, 40, tok, 40);
    assert_null(spmd_dataset_open(path, TSEQ, 1));
    has(spmd_last_error(), "too short for seq 32");

    /* Opens fine; the model's vocabulary check names file, index, token. */
    snprintf(path, sizeof path, "%s/big_token.bin", dir);
    tok[42] = 700;
    write_shard(path, MAGIC, 1, NTOK, tok, NTOK);
    spmd_dataset *d = spmd_dataset_open(path, TSEQ, 1);
    assert_non_null(d);
    assert_int_equal(spmd_dataset_vocab(d), 701);
    assert_int_equal(spmd_dataset_check_vocab(d, 701), SPMD_OK);
    assert_int_equal(spmd_dataset_check_vocab(d, 500), SPMD_ERR_INVALID);
    has(spmd_last_error(), path);
    has(spmd_last_error(), "token 700 at index 42");
    has(spmd_last_error(), "vocabulary 500");
    spmd_dataset_free(d);
    free(tok);
    remove_dir(dir);
}

/* Shards truncated under an open data set: the next batch that reads one
 * fails with SPMD_ERR_IO naming it, for a file kept open and for one opened
 * for each read (past half the open-file limit), and never with SIGBUS. */
static void test_shard_truncated_while_open(void **state)
{
    (void)state;
    char dir[512], path[600];
    make_dir(dir, sizeof dir);
    uint16_t *tok = random_tokens(NTOK, 0, 100, 5);
    enum { B = 40 };
    int32_t in[B * TSEQ], tg[B * TSEQ];

    snprintf(path, sizeof path, "%s/kept.bin", dir);
    write_shard(path, MAGIC, 1, NTOK, tok, NTOK);
    spmd_dataset *d = spmd_dataset_open(path, TSEQ, 1);
    assert_non_null(d);
    assert_int_equal(spmd_dataset_batch(d, SPMD_SPLIT_TRAIN, 0, B, in, tg), SPMD_OK);
    assert_int_equal(truncate(path, 1024 + 2 * 100), 0);
    assert_int_equal(spmd_dataset_batch(d, SPMD_SPLIT_TRAIN, 0, B, in, tg), SPMD_ERR_IO);
    has(spmd_last_error(), path);
    has(spmd_last_error(), "changed while in use");
    assert_int_equal(spmd_dataset_check_vocab(d, 50), SPMD_ERR_IO);
    has(spmd_last_error(), path);
    spmd_dataset_free(d);

    /* An open-file limit above the descriptors open now keeps all files
     * but the last open; the last, where nearly every training window is,
     * is opened for each read. */
    int high = 0;
    DIR *fds = opendir("/proc/self/fd");
    assert_non_null(fds);
    for (struct dirent *e; (e = readdir(fds));)
        if (atoi(e->d_name) > high) high = atoi(e->d_name);
    closedir(fds);
    int kept = high + 3, nfiles = kept + 1;
    struct rlimit saved, low;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &saved), 0);
    low = saved;
    low.rlim_cur = 2 * (rlim_t)kept;
    for (int i = 0; i < nfiles; i++) {
        snprintf(path, sizeof path, "%s/part%04d.bin", dir, i);
        int n = i == nfiles - 1 ? NTOK : TSEQ + 2;
        write_shard(path, MAGIC, 1, n, tok, (size_t)n);
    }
    snprintf(path, sizeof path, "%s/part*.bin", dir);
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
    d = spmd_dataset_open(path, TSEQ, 1);
    spmd_status first = d ? spmd_dataset_batch(d, SPMD_SPLIT_TRAIN, 0, B, in, tg) : SPMD_ERR_IO;
    snprintf(path, sizeof path, "%s/part%04d.bin", dir, nfiles - 1);
    assert_int_equal(truncate(path, 1024 + 2 * 100), 0);
    spmd_status after = d ? spmd_dataset_batch(d, SPMD_SPLIT_TRAIN, 0, B, in, tg) : SPMD_OK;
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &saved), 0);
    if (!d) fail_msg("open: %s", spmd_last_error());
    assert_int_equal(first, SPMD_OK);
    assert_int_equal(after, SPMD_ERR_IO);
    has(spmd_last_error(), path);
    has(spmd_last_error(), "changed while in use");
    spmd_dataset_free(d);
    free(tok);
    remove_dir(dir);
}

/* docs/train.md's "## Data files" section, up to the next heading. */
static char *readme_data_files(void)
{
    FILE *f = fopen(SPMD_SOURCE_DIR "/docs/train.md", "rb");
    assert_non_null(f);
    static char text[1 << 20];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    char *at = strstr(text, "\n## Data files\n");
    if (!at) {
        fail_msg("docs/train.md has no \"## Data files\" section");
        return text;
    }
    char *end = strstr(at + 1, "\n#");
    if (end) *end = '\0';
    return at;
}

static void test_readme_states_the_formats_read(void **state)
{
    (void)state;
    const char *readme = readme_data_files();
    static const char *const stated[] = {
        "256 little-endian int32", "magic 20240520, version 1", "uint16 GPT-2 token ids",
        "version 2", "magic 20240326", "versions 1 and 3", "magic 20240328", "model.safetensors",
        "gpt2_124M.bin", "gpt2_tokenizer.bin", "dev/data/fineweb.py", "fineweb_train_*.bin"};
    for (size_t i = 0; i < sizeof stated / sizeof *stated; i++)
        if (!strstr(readme, stated[i])) fail_msg("docs/train.md's Data files does not say \"%s\"", stated[i]);

    char dir[512], path[600];
    make_dir(dir, sizeof dir);
    uint16_t *tok = random_tokens(NTOK, 0, 50257, 5);
    tok[7] = 50256; /* GPT-2's end of text */
    /* A shard as docs/train.md describes it opens, with GPT-2's tokens. */
    snprintf(path, sizeof path, "%s/fineweb_train_000001.bin", dir);
    write_shard(path, 20240520, 1, NTOK, tok, NTOK);
    spmd_dataset *d = spmd_dataset_open(path, TSEQ, 1);
    if (!d) fail_msg("%s", spmd_last_error());
    assert_int_equal(spmd_dataset_check_vocab(d, 50257), SPMD_OK);
    spmd_dataset_free(d);
    /* Version 2 is refused, naming it. */
    write_shard(path, 20240520, 2, NTOK, tok, NTOK);
    assert_null(spmd_dataset_open(path, TSEQ, 1));
    has(spmd_last_error(), "version 2");
    /* llm.c's checkpoint and tokenizer files, given as data, say what they are. */
    write_shard(path, 20240326, 3, NTOK, tok, NTOK);
    assert_null(spmd_dataset_open(path, TSEQ, 1));
    has(spmd_last_error(), "llm.c model checkpoint");
    write_shard(path, 20240328, 2, NTOK, tok, NTOK);
    assert_null(spmd_dataset_open(path, TSEQ, 1));
    has(spmd_last_error(), "llm.c tokenizer");
    /* A shard given as weights (--init) says it is data. */
    write_shard(path, 20240520, 1, NTOK, tok, NTOK);
    spmd_weights_info info;
    assert_int_not_equal(spmd_weights_inspect(path, &info), SPMD_OK);
    has(spmd_last_error(), "llm.c token shard");
    free(tok);
    remove_dir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_arith_format_and_determinism),
        cmocka_unit_test(test_arith_other_widths),
        cmocka_unit_test(test_arith_heldout_disjoint),
        cmocka_unit_test(test_arith_score_mask),
        cmocka_unit_test(test_text_windows),
        cmocka_unit_test(test_text_errors),
        cmocka_unit_test(test_shard_single_file),
        cmocka_unit_test(test_shard_glob),
        cmocka_unit_test(test_shard_sequential),
        cmocka_unit_test(test_shard_errors),
        cmocka_unit_test(test_shard_truncated_while_open),
        cmocka_unit_test(test_readme_states_the_formats_read),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
