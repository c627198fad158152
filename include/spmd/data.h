/*
 * Training data.  Sample order and content are functions of (seed, global
 * sample index) only, so every mesh sees the same global batch.
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

#ifdef __cplusplus
}
#endif
#endif
