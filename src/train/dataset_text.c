/*
 * Byte-level text: the whole file in memory, one token per byte (vocab
 * 256).  A sample is a window of seq+1 bytes at a position drawn from
 * (seed, split, index).  The last 10% of the file (at least one window) is
 * held out, and training windows end before it, so held-out loss is on
 * bytes the model never trained on.
 */
#include "train/dataset.h"
#include "train/dataset_file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "base/rng.h"

typedef struct text {
    char *path;
    uint8_t *bytes;
    int64_t size;
    int64_t heldout_start; /* training windows lie in [0, heldout_start) */
    uint64_t stream[2];
} text;

static void text_destroy(void *impl)
{
    text *t = impl;
    free(t->path);
    free(t->bytes);
    free(t);
}

static spmd_status text_sample(const spmd_dataset *d, spmd_split split, uint64_t index,
                               int32_t *tokens, uint8_t *scored)
{
    (void)scored;
    const text *t = d->impl;
    int64_t begin = split == SPMD_SPLIT_TRAIN ? 0 : t->heldout_start;
    int64_t end = split == SPMD_SPLIT_TRAIN ? t->heldout_start : t->size;
    /* Windows of seq+1 bytes that fit in [begin, end). */
    uint64_t windows = (uint64_t)(end - begin - d->seq);
    int64_t at = begin + (int64_t)(base_rng_bits(d->seed, t->stream[split], index) % windows);
    for (int64_t i = 0; i <= d->seq; i++) tokens[i] = t->bytes[at + i];
    return SPMD_OK;
}

/* ", 'e'" for a printable byte, so the message shows what the text has. */
static const char *printable(uint8_t c)
{
    static _Thread_local char buf[8];
    if (c < 0x20 || c > 0x7e) return "";
    snprintf(buf, sizeof buf, ", '%c'", c);
    return buf;
}

static spmd_status text_check_vocab(const spmd_dataset *d, int vocab)
{
    const text *t = d->impl;
    for (int64_t i = 0; i < t->size; i++)
        if (t->bytes[i] >= vocab)
            return base_error(SPMD_ERR_INVALID,
                              "text: %s: byte %d (0x%02x%s) at offset %lld is not below the "
                              "model's vocabulary %d (byte-level text needs vocab 256)",
                              t->path, t->bytes[i], t->bytes[i], printable(t->bytes[i]),
                              (long long)i, vocab);
    return SPMD_OK;
}

static const dataset_ops text_ops = {text_sample, text_check_vocab, text_destroy};

/* Reads all of `path` into t->bytes. */
static spmd_status read_file(text *t, const char *path)
{
    int fd;
    int64_t size;
    spmd_status rc = dataset_open_file("text", path, &fd, &size);
    if (rc != SPMD_OK) return rc;
    if (size == 0)
        rc = base_error(SPMD_ERR_INVALID, "text: %s is empty", path);
    else if (!(t->bytes = malloc((size_t)size)))
        rc = base_error(SPMD_ERR_NOMEM, "text: out of memory for %s (%lld bytes)", path,
                        (long long)size);
    for (int64_t got = 0; rc == SPMD_OK && got < size;) {
        ssize_t r = read(fd, t->bytes + got, (size_t)(size - got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0)
            rc = base_error(SPMD_ERR_IO, "text: cannot read %s: %s", path, strerror(errno));
        else if (r == 0)
            rc = base_error(SPMD_ERR_IO, "text: %s shrank while reading (%lld of %lld bytes)",
                            path, (long long)got, (long long)size);
        else
            got += r;
    }
    if (rc == SPMD_OK) t->size = size;
    close(fd);
    return rc;
}

spmd_status dataset_text_open(spmd_dataset *d, const char *path)
{
    text *t = calloc(1, sizeof *t);
    if (!t || !(t->path = strdup(path))) {
        free(t);
        return base_error(SPMD_ERR_NOMEM, "text: out of memory");
    }
    spmd_status rc = read_file(t, path);
    int64_t tail = rc == SPMD_OK ? dataset_tail_len(t->size, d->seq) : 0;
    if (rc == SPMD_OK && tail == 0)
        rc = base_error(SPMD_ERR_INVALID,
                        "text: %s has %lld bytes, too short for seq %d: it needs a training "
                        "and a held-out window of seq+1 bytes each (at least %lld bytes)",
                        path, (long long)t->size, d->seq, 2 * ((long long)d->seq + 1));
    if (rc != SPMD_OK) {
        text_destroy(t);
        return rc;
    }
    t->heldout_start = t->size - tail;
    t->stream[SPMD_SPLIT_TRAIN] = base_rng_stream("data.text.train");
    t->stream[SPMD_SPLIT_HELDOUT] = base_rng_stream("data.text.heldout");
    d->impl = t;
    d->ops = &text_ops;
    d->vocab = 256;
    d->heldout_size = tail - d->seq;
    snprintf(d->describe, sizeof d->describe, "text: %s (%lld bytes, last %lld held out)", path,
             (long long)t->size, (long long)tail);
    return SPMD_OK;
}
