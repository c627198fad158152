/*
 * Inputs for the collectives tests, shared by the in-process tests and the
 * MPI worker (header-only: the worker links no test support): element i
 * of device `rank`'s input to call `call`, a pure function of the three.
 */
#ifndef SPMD_TESTS_SUPPORT_VALUES_H
#define SPMD_TESTS_SUPPORT_VALUES_H

#include <stdint.h>

static inline uint32_t mix(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

static inline uint32_t hash3(int rank, int64_t i, int call)
{
    return mix((uint32_t)rank * 0x9e3779b9u ^ mix((uint32_t)i ^ mix((uint32_t)call + 12345u)));
}

/* Both signs and exponents over 2^-6 .. 2^9, so that another summation
 * order gives other bits and the bitwise checks mean something. */
static inline float fval(int rank, int64_t i, int call)
{
    uint32_t h = hash3(rank, i, call);
    float mant = (float)(h >> 8) / 16777216.0f - 0.5f;
    return mant * (float)(1u << (h & 15)) / 64.0f;
}

static inline unsigned char bval(int rank, int64_t i, int call)
{
    return (unsigned char)(hash3(rank, i, call) >> 24);
}

#endif
