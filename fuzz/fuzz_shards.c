/*
 * Fuzz target: data files (src/train/dataset_shards.c, dataset_text.c,
 * dataset.c).
 *
 * The input is written to a file named in.bin (an llm.c token shard) and
 * to one named in.txt (byte-level text) in a private temporary directory,
 * and each is opened with spmd_dataset_open(path, seq, 1) for seq 1 and 8;
 * so is a glob (*.bin in a subdirectory) over three copies of it (a.bin,
 * b_val.bin, c.bin: two training files and one held out by name).
 * Opening must never crash; a failure must leave a message.  A dataset that
 * opens is checked against vocab 50257 and against its own vocabulary (it
 * must pass) and, for shards, one below it (it must fail), and gives
 * batches at a few sample indices of both splits whose tokens lie in
 * [0, vocab) and whose targets are the inputs shifted by one.  Nothing may
 * leak: LeakSanitizer checks memory, and the lowest free descriptor must
 * not move.
 *
 * Run:  cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DSPMD_FUZZ=ON \
 *         -DSPMD_BUILD_TESTS=OFF -DSPMD_BUILD_BENCH=OFF -DSPMD_BUILD_EXAMPLES=OFF
 *       cmake --build build-fuzz --target fuzz_shards
 *       mkdir -p corpus-shards && build-fuzz/fuzz/fuzz_shards corpus-shards \
 *         fuzz/corpus/fuzz_shards -max_len=4096 -max_total_time=180 -rss_limit_mb=2048
 * Files go under $TMPDIR (else /tmp), in a directory removed at exit.
 * Every build replays fuzz/corpus/fuzz_shards once as the test fuzz_shards_corpus
 * (fuzz/replay.c); add an input found failing there.
 */
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "spmd/data.h"

#define CHECK(cond, ...)                                                               \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "fuzz_shards: check failed: %s: ", #cond);                 \
            fprintf(stderr, __VA_ARGS__);                                              \
            fprintf(stderr, "\n");                                                     \
            abort();                                                                   \
        }                                                                              \
    } while (0)

static char dir[512], bin_path[600], txt_path[600], glob_pattern[600], glob_paths[3][640];
static const char *const GLOB_NAMES[3] = {"a.bin", "b_val.bin", "c.bin"};
static int free_fd = -1; /* the lowest free descriptor before any dataset opened */

static void remove_files(void)
{
    unlink(bin_path);
    unlink(txt_path);
    for (int i = 0; i < 3; i++) unlink(glob_paths[i]);
    char sub[600];
    snprintf(sub, sizeof sub, "%s/glob", dir);
    rmdir(sub);
    rmdir(dir);
}

static int lowest_free_fd(void)
{
    int fd = open("/dev/null", O_RDONLY);
    CHECK(fd >= 0, "cannot open /dev/null");
    close(fd);
    return fd;
}

static void setup(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/spmd_fuzz_shards_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    CHECK(mkdtemp(dir), "cannot make a directory under %s", tmp && *tmp ? tmp : "/tmp");
    snprintf(bin_path, sizeof bin_path, "%s/in.bin", dir);
    snprintf(txt_path, sizeof txt_path, "%s/in.txt", dir);
    snprintf(glob_pattern, sizeof glob_pattern, "%s/glob", dir);
    CHECK(mkdir(glob_pattern, 0700) == 0, "cannot make %s", glob_pattern);
    for (int i = 0; i < 3; i++)
        snprintf(glob_paths[i], sizeof glob_paths[i], "%s/%s", glob_pattern, GLOB_NAMES[i]);
    snprintf(glob_pattern, sizeof glob_pattern, "%s/glob/*.bin", dir);
    atexit(remove_files);
    free_fd = lowest_free_fd();
}

static void write_file(const char *path, const uint8_t *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    CHECK(f, "cannot write %s", path);
    CHECK(!size || fwrite(data, 1, size, f) == size, "short write to %s", path);
    CHECK(fclose(f) == 0, "cannot close %s", path);
}

static void check_batches(spmd_dataset *d, int seq, const char *path)
{
    static const int64_t firsts[] = {0, 1, 7, 12345, INT64_MAX - 2};
    int vocab = spmd_dataset_vocab(d);
    int32_t input[2 * 8], targets[2 * 8];
    for (int split = 0; split < 2; split++)
        for (size_t i = 0; i < sizeof firsts / sizeof firsts[0]; i++) {
            spmd_status st = spmd_dataset_batch(d, (spmd_split)split, firsts[i], 2, input, targets);
            CHECK(st == SPMD_OK, "%s: batch at %lld of split %d: %s", path,
                  (long long)firsts[i], split, spmd_last_error());
            for (int b = 0; b < 2; b++)
                for (int t = 0; t < seq; t++) {
                    int32_t x = input[b * seq + t], y = targets[b * seq + t];
                    CHECK(x >= 0 && x < vocab && y >= 0 && y < vocab,
                          "%s: tokens %d, %d outside vocab %d", path, x, y, vocab);
                    if (t + 1 < seq)
                        CHECK(y == input[b * seq + t + 1], "%s: target %d is not the next input",
                              path, t);
                }
        }
}

/* Shards: vocab is the largest token + 1, so one less must fail.  Text:
 * vocab 128 passes exactly when every byte is ASCII. */
static void check_open(const char *path, int seq, bool shards, const uint8_t *data, size_t size)
{
    spmd_clear_error();
    spmd_dataset *d = spmd_dataset_open(path, seq, 1);
    if (!d) {
        CHECK(spmd_last_error()[0] != '\0', "%s: NULL without a message", path);
        return;
    }
    int vocab = spmd_dataset_vocab(d);
    CHECK(vocab >= 1 && vocab <= 65536, "%s: vocab %d", path, vocab);
    CHECK(shards || vocab == 256, "%s: text with vocab %d", path, vocab);
    CHECK(spmd_dataset_seq(d) == seq, "%s: seq %d", path, spmd_dataset_seq(d));
    CHECK(spmd_dataset_describe(d)[0] != '\0', "%s: no description", path);
    spmd_status st = spmd_dataset_check_vocab(d, 50257);
    CHECK(st == SPMD_OK || (st == SPMD_ERR_INVALID && vocab > 50257 && spmd_last_error()[0]),
          "%s: check_vocab(50257) with vocab %d: %d", path, vocab, (int)st);
    CHECK(spmd_dataset_check_vocab(d, vocab) == SPMD_OK, "%s: its own vocab %d fails: %s", path,
          vocab, spmd_last_error());
    if (shards && vocab > 1) {
        spmd_clear_error();
        CHECK(spmd_dataset_check_vocab(d, vocab - 1) == SPMD_ERR_INVALID &&
                  spmd_last_error()[0],
              "%s: vocab %d - 1 passes", path, vocab);
    }
    if (!shards) {
        bool ascii = true;
        for (size_t i = 0; i < size; i++) ascii = ascii && data[i] < 128;
        st = spmd_dataset_check_vocab(d, 128);
        CHECK(ascii ? st == SPMD_OK : st == SPMD_ERR_INVALID && spmd_last_error()[0],
              "%s: check_vocab(128) gives %d", path, (int)st);
    }
    check_batches(d, seq, path);
    spmd_dataset_free(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!dir[0]) setup();
    if (size > 1 << 16) return 0;
    write_file(bin_path, data, size);
    write_file(txt_path, data, size);
    for (int i = 0; i < 3; i++) write_file(glob_paths[i], data, size);
    static const int seqs[] = {1, 8};
    for (int i = 0; i < 2; i++) {
        check_open(bin_path, seqs[i], true, data, size);
        check_open(txt_path, seqs[i], false, data, size);
        check_open(glob_pattern, seqs[i], true, data, size);
    }
    int fd = lowest_free_fd();
    CHECK(fd == free_fd, "a descriptor leaked: the lowest free one is %d, was %d", fd, free_fd);
    return 0;
}
