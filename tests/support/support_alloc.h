/*
 * An allocator hook for tests that makes allocations fail on demand: it
 * hands out 64-byte aligned blocks while its budget lasts, then NULL, and
 * counts what it hands out and takes back, so a test can walk the failure
 * point through a call and check that nothing leaked.  Atomic, because the
 * collectives allocate from device threads.
 */
#ifndef SPMD_TESTS_SUPPORT_ALLOC_H
#define SPMD_TESTS_SUPPORT_ALLOC_H

#include <stdatomic.h>

#include "spmd/spmd.h"

typedef struct test_alloc {
    _Atomic long budget; /* allocations left; < 0: unlimited */
    _Atomic long allocs, frees;
} test_alloc;

/* Zero counts and `budget`; returns the hook that draws on `a`. */
spmd_allocator test_alloc_init(test_alloc *a, long budget);
void test_alloc_set_budget(test_alloc *a, long budget);

#endif
