/*
 * Setting up a test case over a fresh graph, as the op and gradient checks
 * do: a printf-style label that keys the case's own random stream
 * (support_rng.h), so one case draws the same values whatever runs before
 * it, and random values for the case's inputs.
 */
#ifndef SPMD_TESTS_SUPPORT_CASE_H
#define SPMD_TESTS_SUPPORT_CASE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "spmd/spmd.h"
#include "support_rng.h"

/* A tensor shape, {rank, {dims...}}; rank 0 is a scalar. */
typedef struct shape {
    int rank;
    int64_t dims[SPMD_MAX_RANK];
} shape;

/* The values an input is drawn from. */
typedef enum test_gen {
    GEN_ANY,     /* uniform [-1, 1) */
    GEN_WIDE,    /* uniform [-4, 4): exp, tanh, gelu, logits away from 0 */
    GEN_POS,     /* uniform [0.5, 2): log, sqrt, rsqrt, denominators */
    GEN_NAN,     /* GEN_ANY with one value in 16 a NaN */
    GEN_AWAY0,   /* |x| in [0.2, 1): relu's kink stays outside x +- h */
    GEN_DISTINCT /* distinct, at least 0.1 apart, shuffled: max keeps its argmax */
} test_gen;

void test_fill_values(test_rng *r, float *v, int64_t n, test_gen kind);
/* n ids uniform in [0, limit). */
void test_fill_ids(test_rng *r, int32_t *v, int64_t n, int32_t limit);

/* Start a case: its label, from fmt and ap, into label[size]; *r the
 * label's stream under `seed`; this thread's error cleared.  Returns a
 * fresh graph (the test fails when there is none). */
spmd_graph *test_case_start(char *label, size_t size, uint64_t seed, test_rng *r,
                            const char *fmt, va_list ap) __attribute__((format(printf, 5, 0)));

/* Bytes of a tensor of 4-byte elements (f32, i32). */
size_t test_tensor_bytes(const spmd_tensor *t);

#endif
