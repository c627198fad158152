/*
 * A libFuzzer target's driver without libFuzzer: runs the target's
 * LLVMFuzzerTestOneInput on every file named (a directory: each regular
 * file in it, in name order), once each, as `fuzzer -runs=0 DIR` would.
 * Linked with each fuzz/fuzz_*.c by any C compiler, so the committed
 * corpora (fuzz/corpus/<target>/, which keep every input a fuzzer found
 * failing) replay as tests in every build; a failed check aborts.
 *
 *   replay_fuzz_spec fuzz/corpus/fuzz_spec [FILE...]
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Runs the target on one file's bytes; 0, or 1 if it cannot be read. */
static int replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        return 1;
    }
    uint8_t *data = NULL;
    size_t size = 0, cap = 0;
    for (;;) {
        if (size == cap) {
            cap = cap ? 2 * cap : 4096;
            uint8_t *more = realloc(data, cap);
            if (!more) {
                fprintf(stderr, "replay: out of memory reading %s\n", path);
                free(data);
                fclose(f);
                return 1;
            }
            data = more;
        }
        size_t n = fread(data + size, 1, cap - size, f);
        size += n;
        if (n == 0) break;
    }
    int failed = ferror(f);
    fclose(f);
    if (failed) {
        fprintf(stderr, "replay: cannot read %s\n", path);
        free(data);
        return 1;
    }
    fprintf(stderr, "replay: %s (%zu bytes)\n", path, size);
    LLVMFuzzerTestOneInput(data, size);
    free(data);
    return 0;
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

/* Every regular file in `dir`; the number replayed, or -1. */
static int replay_dir(const char *dir)
{
    struct dirent **names;
    int n = scandir(dir, &names, NULL, by_name), replayed = 0, bad = 0;
    if (n < 0) {
        fprintf(stderr, "replay: cannot read the directory %s\n", dir);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        char path[4096];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]->d_name);
        if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
            bad |= replay_file(path);
            replayed++;
        }
        free(names[i]);
    }
    free(names);
    return bad ? -1 : replayed;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR|FILE...\n", argv[0]);
        return 2;
    }
    int total = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "replay: no such file or directory: %s\n", argv[i]);
            return 1;
        }
        int n = S_ISDIR(st.st_mode) ? replay_dir(argv[i]) : replay_file(argv[i]) ? -1 : 1;
        if (n < 0) return 1;
        total += n;
    }
    if (total == 0) {
        fprintf(stderr, "replay: no inputs in %s\n", argv[1]);
        return 1;
    }
    printf("replay: %d inputs, every check held\n", total);
    return 0;
}
