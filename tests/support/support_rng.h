/*
 * Seeded random numbers for tests: splitmix64, with streams keyed by a
 * label (FNV-1a of a case's name or a tensor's name), so one case draws
 * the same values whatever runs before it, and a failure is replayed by
 * its seed alone (SPMD_TEST_SEED).
 */
#ifndef SPMD_TESTS_SUPPORT_RNG_H
#define SPMD_TESTS_SUPPORT_RNG_H

#include <stdbool.h>
#include <stdint.h>

typedef struct test_rng {
    uint64_t s;
} test_rng;

/* splitmix64's finaliser: a well-mixed 64-bit function of z. */
uint64_t test_mix64(uint64_t z);
/* The generator for `label` under `seed`: state seed ^ FNV-1a(label). */
test_rng test_rng_for(uint64_t seed, const char *label);

uint64_t test_rng_next(test_rng *r);
/* Uniform in [0, 1), from the top 53 bits. */
double test_rng_unit(test_rng *r);
/* Uniform in [lo, hi). */
float test_rng_float(test_rng *r, float lo, float hi);
/* Uniform in [lo, hi] (inclusive). */
int test_rng_int(test_rng *r, int lo, int hi);
bool test_rng_chance(test_rng *r, double p);

/* n values uniform in [-1, 1) from `name` alone (no seed): inputs that
 * two builds of the same model get alike without sharing state. */
void test_fill_by_name(const char *name, float *v, int64_t n);

/* $SPMD_TEST_SEED, else `fallback` (a fixed default keeps CI repeatable). */
uint64_t test_env_seed(uint64_t fallback);
/* test_env_seed, and say it: "<test>: seed N (SPMD_TEST_SEED=N replays it)". */
uint64_t test_announce_seed(const char *test, uint64_t fallback);

#endif
