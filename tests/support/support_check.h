/*
 * Comparing float arrays in tests: one tolerance rule, and a failure that
 * names the worst element rather than the first.
 */
#ifndef SPMD_TESTS_SUPPORT_CHECK_H
#define SPMD_TESTS_SUPPORT_CHECK_H

#include <stdbool.h>
#include <stdint.h>

/* |got - want| <= atol + rtol |want| everywhere (a NaN never is); else
 * print the worst element, labelled `what`, and return false, so that a
 * caller can report every array before failing. */
bool test_close_enough(const char *what, const float *got, const float *want, int64_t n,
                       double atol, double rtol);

#endif
