/*
 * Counter-based random numbers: every value is a pure function of
 * (seed, stream, index), so a parameter's initial values depend only on
 * its name and global element index, never on how it is sharded or on
 * which thread fills it.
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

#endif
