/* Counter-based RNG: splitmix64 finalisers over (seed, stream, index), and
 * Philox-4x32-10 (rng.h). */
#include "base/rng.h"

#include <math.h>

static uint64_t mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint64_t base_rng_stream(const char *name)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const unsigned char *p = (const unsigned char *)name; p && *p; p++) {
        h ^= *p;
        h *= 0x100000001b3ULL;
    }
    return mix(h);
}

uint64_t base_rng_bits(uint64_t seed, uint64_t stream, uint64_t index)
{
    return mix(mix(seed * 0x9e3779b97f4a7c15ULL + stream) + index * 0xd1b54a32d192ed03ULL);
}

float base_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index)
{
    /* 24 high bits: every float in [0,1) this can give is exact. */
    return (float)(base_rng_bits(seed, stream, index) >> 40) * (1.0f / 16777216.0f);
}

float base_rng_normal(uint64_t seed, uint64_t stream, uint64_t index)
{
    uint64_t r = base_rng_bits(seed, stream, index);
    double u1 = ((double)(r >> 11) + 1.0) * (1.0 / 9007199254740994.0); /* (0, 1] */
    double u2 = (double)(mix(r) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* One round: two 32x32 -> 64-bit products, their halves crossed with the
 * other two words and the round's key. */
static void philox_round(uint32_t c[4], const uint32_t k[2])
{
    uint64_t p0 = (uint64_t)0xD2511F53u * c[0], p1 = (uint64_t)0xCD9E8D57u * c[2];
    uint32_t y0 = (uint32_t)(p1 >> 32) ^ c[1] ^ k[0];
    uint32_t y2 = (uint32_t)(p0 >> 32) ^ c[3] ^ k[1];
    c[1] = (uint32_t)p1;
    c[3] = (uint32_t)p0;
    c[0] = y0;
    c[2] = y2;
}

void base_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t c[4] = {ctr[0], ctr[1], ctr[2], ctr[3]}, k[2] = {key[0], key[1]};
    for (int r = 0; r < 10; r++) {
        if (r) { /* the Weyl sequence of the key: golden ratio, sqrt(3) - 1 */
            k[0] += 0x9E3779B9u;
            k[1] += 0xBB67AE85u;
        }
        philox_round(c, k);
    }
    out[0] = c[0], out[1] = c[1], out[2] = c[2], out[3] = c[3];
}

void base_philox_key(uint64_t seed, const uint32_t words[4], uint32_t key[2])
{
    uint32_t seed_key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)}, out[4];
    base_philox4x32(words, seed_key, out);
    key[0] = out[0];
    key[1] = out[1];
}
