/*
 * Counter-based random numbers: every value is a pure function of
 * (seed, stream, index), so a parameter's initial values depend only on
 * its name and global element index, never on how it is sharded or on
 * which thread fills it.  Two generators: splitmix64 finalisers (the
 * initial values, the data sets' draws) and Philox-4x32-10 (dropout's
 * masks, keyed by seed, step and site: docs/DESIGN.md, "Random numbers").
 */
#ifndef SPMD_BASE_RNG_H
#define SPMD_BASE_RNG_H

#include <stdint.h>

/* A stream id from a name (FNV-1a, then mixed). */
uint64_t base_rng_stream(const char *name);
/* 64 random bits for (seed, stream, index). */
uint64_t base_rng_bits(uint64_t seed, uint64_t stream, uint64_t index);
/* Uniform in [0, 1). */
float base_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index);
/* Standard normal (Box-Muller over two draws of the same counter). */
float base_rng_normal(uint64_t seed, uint64_t stream, uint64_t index);

/* Philox-4x32-10 (Salmon, Moraes, Dror and Shaw, "Parallel Random
 * Numbers: As Easy as 1, 2, 3", SC 2011): 128 random bits, out[0..3], for
 * the 128-bit counter ctr[0..3] under the 64-bit key key[0..1]. */
void base_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);
/* The key of one stream of Philox counters: `seed` as a key, the four
 * words as a counter, the first two words out (a key folded with the
 * words, as JAX's fold_in folds data into a key). */
void base_philox_key(uint64_t seed, const uint32_t words[4], uint32_t key[2]);

#endif
