/* Seeded random numbers for tests (see support_rng.h). */
#include "support_rng.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>

#include <cmocka.h>

uint64_t test_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

test_rng test_rng_for(uint64_t seed, const char *label)
{
    uint64_t h = 1469598103934665603ull;
    for (const char *s = label; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return (test_rng){seed ^ h};
}

uint64_t test_rng_next(test_rng *r) { return test_mix64(r->s += 0x9e3779b97f4a7c15ull); }

double test_rng_unit(test_rng *r) { return (double)(test_rng_next(r) >> 11) / 9007199254740992.0; }

float test_rng_float(test_rng *r, float lo, float hi)
{
    return lo + (hi - lo) * (float)test_rng_unit(r);
}

int test_rng_int(test_rng *r, int lo, int hi)
{
    return lo + (int)(test_rng_next(r) % (uint64_t)(hi - lo + 1));
}

bool test_rng_chance(test_rng *r, double p) { return test_rng_unit(r) < p; }

void test_fill_by_name(const char *name, float *v, int64_t n)
{
    test_rng r = test_rng_for(0, name);
    for (int64_t i = 0; i < n; i++) v[i] = test_rng_float(&r, -1.0f, 1.0f);
}

uint64_t test_env_seed(uint64_t fallback)
{
    const char *env = getenv("SPMD_TEST_SEED");
    return env ? strtoull(env, NULL, 10) : fallback;
}

uint64_t test_announce_seed(const char *test, uint64_t fallback)
{
    uint64_t seed = test_env_seed(fallback);
    print_message("%s: seed %llu (SPMD_TEST_SEED=%llu replays it)\n", test,
                  (unsigned long long)seed, (unsigned long long)seed);
    return seed;
}
