/*
 * bfloat16: the top 16 bits of an IEEE binary32 (sign, 8 exponent bits,
 * 7 mantissa bits).  The one place libspmd converts between f32 and bf16,
 * so every kernel, backend and file format rounds the same way:
 * round to nearest, ties to even, on the bit pattern, which rounds
 * subnormals correctly too (hardware converters such as AVX512_BF16's
 * VCVTNEPS2BF16 flush them to zero; these helpers do not).  Infinities
 * stay infinite, a finite value past the largest bf16 becomes infinity,
 * and a NaN stays a NaN of the same sign (made quiet, so rounding never
 * turns it into an infinity).
 */
#ifndef SPMD_BASE_BF16_H
#define SPMD_BASE_BF16_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef uint16_t bf16_bits; /* a bf16 number as its bit pattern */

static inline uint32_t bf16_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float bf16_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* f32 -> bf16, round to nearest even. */
static inline bf16_bits bf16_from_f32(float f)
{
    uint32_t u = bf16_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep sign and payload top, set quiet bit */
        return (bf16_bits)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u); /* half an ulp, plus one on ties to odd */
    return (bf16_bits)(u >> 16);
}

/* bf16 -> f32: exact. */
static inline float bf16_to_f32(bf16_bits h) { return bf16_bits_f32((uint32_t)h << 16); }

/* f32 rounded to the nearest bf16 value, kept as f32. */
static inline float bf16_round(float f) { return bf16_to_f32(bf16_from_f32(f)); }

/* Arrays; written without branches in the loop so compilers vectorise it. */
static inline void bf16_from_f32_n(bf16_bits *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u = bf16_f32_bits(src[i]);
        uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
        uint32_t quiet_nan = (u >> 16) | 0x0040u;
        dst[i] = (bf16_bits)((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
    }
}

static inline void bf16_to_f32_n(float *dst, const bf16_bits *src, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = bf16_to_f32(src[i]);
}

#endif
