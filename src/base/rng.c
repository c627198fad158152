/* Counter-based RNG: splitmix64 finalisers over (seed, stream, index). */
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
