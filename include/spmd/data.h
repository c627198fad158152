/*
 * Training data.  Sample order and content are functions of (seed, split,
 * global sample index) only, so every mesh and every batch size sees the
 * same samples: sample i is sample i whether it lands in a batch of 8 on one
 * device or a batch of 64 sharded over a 4x2 mesh.
 *
 * Two entry points: spmd_data_sequences, a stateless synthetic generator
 * kept for the tool's default; and spmd_dataset, an opaque handle over real
 * data (a synthetic addition task, a byte-level text file, or llm.c token
 * shards) with a held-out split.
 */
#ifndef SPMD_DATA_H
#define SPMD_DATA_H

#include "spmd/spmd.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Synthetic sequences, generated locally: sample i counts through the
 * vocabulary from a random start with a random stride, x_t = (a_i + t d_i)
 * mod vocab.  A model learns it by reading the stride off the context, so
 * the loss falls from ln(vocab) towards zero.  Fills `batch` samples
 * starting at global index `first`: input [batch, seq] and targets (the
 * next token) [batch, seq]. */
SPMD_API spmd_status spmd_data_sequences(uint64_t seed, int64_t first, int batch, int seq,
                                         int vocab, int32_t *input, int32_t *targets);

/* ---- Datasets ------------------------------------------------------------ */

typedef struct spmd_dataset spmd_dataset;

typedef enum spmd_split {
    SPMD_SPLIT_TRAIN = 0,
    SPMD_SPLIT_HELDOUT = 1
} spmd_split;

/* The arith set's characters; token id = index in this string, so
 * SPMD_ARITH_ALPHABET[token] prints a token. */
#define SPMD_ARITH_ALPHABET "0123456789+=\n"
#define SPMD_ARITH_VOCAB 13

/* Open a dataset whose samples are `seq` tokens (plus the next token as the
 * last target).  `source`:
 *   NULL or "arith"  integer addition as fixed-width text, "07+58=065\n":
 *                    operands 0..99, zero-padded, the sum in 3 digits.
 *                    "arith:N" uses N-digit operands (N = 1..3).  Samples
 *                    start at a problem boundary and run problems back to
 *                    back.  About 10% of the unordered operand pairs {a, b}
 *                    (a fixed hash, the same for every seed) are held out:
 *                    they appear only in the held-out split, in either order,
 *                    so held-out accuracy measures generalisation.
 *   a .bin path, or a glob of them (glob(3), sorted by name)
 *                    llm.c token shards: a 256 x int32 header (magic
 *                    20240520, version 1, token count) then uint16 tokens.
 *                    Held out: with several files, those whose name contains
 *                    "val" (llm.c's fineweb_val_000000.bin, tiny_shakespeare_
 *                    val.bin), else the first file; with one file, its last
 *                    10% of tokens.  Files are read with pread;
 *                    one changed under a run is an error naming it.
 *   any other path   a byte-level text file (vocab 256); its last 10% is held
 *                    out (at least seq+1 bytes; training windows never cross
 *                    into it).
 * A path that exists is taken literally; otherwise one with * ? [ is a glob.
 * Returns NULL with spmd_last_error() naming the cause (missing file, bad
 * header, file too short for seq, ...).  A handle is used by one thread at a
 * time. */
SPMD_API spmd_dataset *spmd_dataset_open(const char *source, int seq, uint64_t seed);
SPMD_API void spmd_dataset_free(spmd_dataset *d);

/* Tokens are in [0, vocab): 13 for arith, 256 for text, the largest token
 * seen + 1 for shards (50257 for GPT-2 data). */
SPMD_API int spmd_dataset_vocab(const spmd_dataset *d);
SPMD_API int spmd_dataset_seq(const spmd_dataset *d);
/* One line: "arith: ...", "text: FILE (N bytes, ...)", "shards: 3 files,
 * N tokens, ...".  Owned by the handle. */
SPMD_API const char *spmd_dataset_describe(const spmd_dataset *d);

/* Samples first .. first+batch-1 of a split: input [batch, seq] and targets
 * [batch, seq], targets[b][t] = the token after input[b][t].  Content and
 * order are pure functions of (seed, split, global sample index). */
SPMD_API spmd_status spmd_dataset_batch(spmd_dataset *d, spmd_split split, int64_t first,
                                        int batch, int32_t *input, int32_t *targets);

/* The order samples are drawn in.  Shuffled (the default): sample i is a
 * window chosen by (seed, split, i), the same on every mesh.  Sequential:
 * windows of seq+1 tokens starting every seq tokens, one after another in
 * file order (each file's segment in turn, wrapping round at the end), so
 * row b of batch k starts at token k*batch*seq + b*seq, the order llm.c's
 * loader reads a shard in when it does not shuffle.  Only llm.c token
 * shards have a sequential order; other data is refused with a message. */
typedef enum spmd_data_order {
    SPMD_DATA_SHUFFLED = 0,
    SPMD_DATA_SEQUENTIAL = 1
} spmd_data_order;
SPMD_API spmd_status spmd_dataset_set_order(spmd_dataset *d, spmd_data_order order);

/* Whether the data has a held-out accuracy (arith: yes; text, shards: no).
 * score_mask fills mask [batch, seq] for the same samples as
 * spmd_dataset_batch: 1 where targets[b][t] is an answer digit (every digit
 * of the zero-padded sum, not the '\n' after it), 0 elsewhere.  Accuracy =
 * correct argmax predictions at mask positions / mask positions. */
SPMD_API bool spmd_dataset_has_accuracy(const spmd_dataset *d);
/* How many held-out samples it takes to cover the held-out split, beyond
 * which scoring more only repeats it: arith, its held-out operand pairs
 * (1017 for "arith"; each sample holds several problems drawn from them);
 * text and shards, the windows of seq+1 tokens that fit in it. */
SPMD_API int64_t spmd_dataset_heldout_size(const spmd_dataset *d);
SPMD_API spmd_status spmd_dataset_score_mask(spmd_dataset *d, spmd_split split, int64_t first,
                                             int batch, uint8_t *mask);

/* Check every token of both splits is below `vocab` (the model's
 * vocabulary).  The error names the file, the position and the token. */
SPMD_API spmd_status spmd_dataset_check_vocab(const spmd_dataset *d, int vocab);

#ifdef __cplusplus
}
#endif
#endif
