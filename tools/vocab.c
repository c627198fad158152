/*
 * Text to token ids and back for `spmd sample` (vocab.h).  An llm.c
 * tokenizer file holds each token's bytes and nothing of GPT-2's merge
 * rules, so prompts are split greedily, longest token first; GPT-2's BPE
 * (bpe.h) splits them as GPT-2 does.
 */
#include "vocab.h"

#include "message.h"

#include "spmd/data.h"
#include "train/checkpoint_fs.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LLMC_TOKENIZER_MAGIC 20240328u
#define LLMC_HEADER_INTS 256
/* GPT-2 has 50257 tokens; anything past a few million is not a tokenizer. */
#define LLMC_MAX_VOCAB (1 << 24)

void vocab_arith(vocab *v)
{
    memset(v, 0, sizeof *v);
    v->kind = VOCAB_ARITH;
    v->size = SPMD_ARITH_VOCAB;
    v->eot = -1;
}

void vocab_bytes(vocab *v)
{
    memset(v, 0, sizeof *v);
    v->kind = VOCAB_BYTES;
    v->size = 256;
    v->eot = -1;
}

int vocab_load_bpe(vocab *v, const char *dir)
{
    memset(v, 0, sizeof *v);
    v->kind = VOCAB_BPE;
    v->bpe = bpe_load(dir, "--encoder");
    if (!v->bpe) return 2;
    v->size = bpe_vocab_size(v->bpe);
    v->eot = bpe_eot(v->bpe);
    return 0;
}

void vocab_free(vocab *v)
{
    bpe_free(v->bpe);
    for (int i = 0; v->text && i < v->size; i++) free(v->text[i]);
    free(v->text);
    free(v->len);
    free(v->slots);
    memset(v, 0, sizeof *v);
}

/* FNV-1a over a token's bytes. */
static uint64_t bytes_hash(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

/* The token whose bytes are s[0, n), or -1.  The lowest id wins a tie, as
 * the table is filled in id order and keeps the first. */
static int find_token(const vocab *v, const char *s, size_t n)
{
    size_t mask = v->n_slots - 1;
    for (size_t i = bytes_hash(s, n) & mask;; i = (i + 1) & mask) {
        int id = v->slots[i];
        if (id < 0) return -1;
        if (v->len[id] == n && !memcmp(v->text[id], s, n)) return id;
    }
}

static int index_tokens(vocab *v)
{
    v->n_slots = 1;
    while (v->n_slots < 2 * (size_t)v->size) v->n_slots *= 2;
    v->slots = malloc(v->n_slots * sizeof *v->slots);
    if (!v->slots) return 1;
    memset(v->slots, 0xff, v->n_slots * sizeof *v->slots);
    size_t mask = v->n_slots - 1;
    for (int id = 0; id < v->size; id++) {
        if (find_token(v, v->text[id], v->len[id]) >= 0) continue;
        size_t i = bytes_hash(v->text[id], v->len[id]) & mask;
        while (v->slots[i] >= 0) i = (i + 1) & mask;
        v->slots[i] = id;
    }
    return 0;
}

/* The tokens after the header: a length byte (1..255), then the bytes. */
static int read_tokens(vocab *v, FILE *f, const char *path)
{
    v->text = calloc((size_t)v->size, sizeof *v->text);
    v->len = calloc((size_t)v->size, sizeof *v->len);
    if (!v->text || !v->len) return cli_fail("--tokenizer %s: out of memory", path);
    for (int id = 0; id < v->size; id++) {
        int n = fgetc(f);
        if (n == EOF)
            return cli_fail("--tokenizer %s: the file ends at token %d of the %d its header "
                            "announces", path, id, v->size);
        if (n == 0)
            return cli_fail("--tokenizer %s: token %d has length 0: not an llm.c tokenizer file",
                            path, id);
        v->text[id] = malloc((size_t)n + 1);
        if (!v->text[id]) return cli_fail("--tokenizer %s: out of memory", path);
        if (fread(v->text[id], 1, (size_t)n, f) != (size_t)n)
            return cli_fail("--tokenizer %s: the file ends inside token %d of the %d its header "
                            "announces", path, id, v->size);
        v->text[id][n] = '\0';
        v->len[id] = (uint8_t)n;
        if (n > v->max_len) v->max_len = n;
    }
    if (fgetc(f) != EOF)
        return cli_fail("--tokenizer %s: bytes follow the last of the %d tokens its header "
                        "announces: not an llm.c tokenizer file", path, v->size);
    if (index_tokens(v)) return cli_fail("--tokenizer %s: out of memory", path);
    return 0;
}

int vocab_load_llmc(vocab *v, const char *path)
{
    memset(v, 0, sizeof *v);
    v->kind = VOCAB_LLMC;
    const char *why;
    int fd = ckpt_open_regular(path, &why); /* without blocking: a FIFO is refused */
    FILE *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
    if (!f) {
        int err = errno;
        if (fd >= 0) close(fd);
        return cli_fail("--tokenizer %s: %s", path, why ? why : strerror(err));
    }
    uint32_t header[LLMC_HEADER_INTS];
    int rc = 0;
    if (fread(header, sizeof *header, LLMC_HEADER_INTS, f) != LLMC_HEADER_INTS)
        rc = cli_fail("--tokenizer %s: shorter than the 1024-byte header of an llm.c tokenizer "
                      "file", path);
    else if (header[0] != LLMC_TOKENIZER_MAGIC)
        rc = cli_fail("--tokenizer %s: not an llm.c tokenizer file (magic %u, want %u)", path,
                      header[0], LLMC_TOKENIZER_MAGIC);
    else if (header[1] != 1 && header[1] != 2)
        rc = cli_fail("--tokenizer %s: llm.c tokenizer version %u; versions 1 and 2 are read",
                      path, header[1]);
    else if (header[2] == 0 || header[2] > LLMC_MAX_VOCAB)
        rc = cli_fail("--tokenizer %s: a vocabulary of %u tokens (want 1 to %d)", path, header[2],
                      LLMC_MAX_VOCAB);
    if (!rc) {
        v->size = (int)header[2];
        v->eot = header[1] == 2 && header[3] < header[2] ? (int)header[3] : -1;
        rc = read_tokens(v, f, path);
    }
    fclose(f);
    if (rc) vocab_free(v);
    return rc;
}

/* GPT-2's BPE ids of text into ids (room for strlen(text)). */
static int encode_bpe(const vocab *v, const char *flag, const char *text, int32_t *ids)
{
    int32_t *got = NULL;
    size_t n = 0, cap = 0;
    if (bpe_encode(v->bpe, text, strlen(text), &got, &n, &cap)) {
        free(got);
        cli_fail("%s '%s': out of memory", flag, text);
        return -1;
    }
    if (n) memcpy(ids, got, n * sizeof *ids);
    free(got);
    return (int)n;
}

int vocab_encode(const vocab *v, const char *flag, const char *text, int32_t *ids)
{
    if (v->kind == VOCAB_BPE) return encode_bpe(v, flag, text, ids);
    int n = 0;
    for (size_t i = 0, len = strlen(text); i < len;) {
        int id = -1;
        size_t used = 1;
        if (v->kind == VOCAB_BYTES) {
            id = (uint8_t)text[i];
        } else if (v->kind == VOCAB_ARITH) {
            const char *at = strchr(SPMD_ARITH_ALPHABET, text[i]);
            id = at ? (int)(at - SPMD_ARITH_ALPHABET) : -1;
        } else {
            for (used = len - i < (size_t)v->max_len ? len - i : (size_t)v->max_len; used > 0;
                 used--)
                if ((id = find_token(v, text + i, used)) >= 0) break;
        }
        if (id < 0) {
            const char *what = v->kind == VOCAB_ARITH ? "the arith data's symbols (0-9, +, = and "
                                                        "newline)"
                                                      : "the tokenizer's tokens";
            cli_fail("%s '%s': the byte 0x%02x at offset %zu is not among %s", flag, text,
                     (unsigned)(uint8_t)text[i], i, what);
            return -1;
        }
        ids[n++] = id;
        i += used;
    }
    return n;
}

void vocab_decode(const vocab *v, int32_t id, char *out, size_t size, size_t *n)
{
    char tmp[32];
    const char *s = tmp;
    size_t len;
    if (v->kind == VOCAB_ARITH && id >= 0 && id < v->size) {
        tmp[0] = SPMD_ARITH_ALPHABET[id];
        len = 1;
    } else if (v->kind == VOCAB_BYTES && id >= 0 && id < v->size) {
        tmp[0] = (char)id;
        len = 1;
    } else if (v->kind == VOCAB_LLMC && id >= 0 && id < v->size) {
        s = v->text[id];
        len = v->len[id];
    } else if (v->kind == VOCAB_BPE && id >= 0 && id < v->size) {
        s = bpe_token(v->bpe, id, &len);
    } else {
        len = (size_t)snprintf(tmp, sizeof tmp, "<|%d|>", (int)id);
    }
    if (*n + len >= size) len = *n + 1 < size ? size - *n - 1 : 0;
    memcpy(out + *n, s, len);
    *n += len;
    out[*n] = '\0';
}
