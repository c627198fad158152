/* The failing, counting allocator hook for tests (see support_alloc.h). */
#include "support_alloc.h"

#include <stdlib.h>

static void *budget_alloc(void *ctx, size_t bytes)
{
    test_alloc *a = ctx;
    /* Take one from a positive budget; 0 stays 0 (every later call fails),
     * and a negative budget is never touched. */
    long left = atomic_load(&a->budget);
    while (left > 0 && !atomic_compare_exchange_weak(&a->budget, &left, left - 1)) {
    }
    if (left == 0) return NULL;
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 1) != 0) return NULL;
    atomic_fetch_add(&a->allocs, 1);
    return p;
}

static void budget_free(void *ctx, void *p)
{
    test_alloc *a = ctx;
    if (p) atomic_fetch_add(&a->frees, 1);
    free(p);
}

spmd_allocator test_alloc_init(test_alloc *a, long budget)
{
    atomic_init(&a->budget, budget);
    atomic_init(&a->allocs, 0);
    atomic_init(&a->frees, 0);
    return (spmd_allocator){budget_alloc, budget_free, a};
}

void test_alloc_set_budget(test_alloc *a, long budget) { atomic_store(&a->budget, budget); }
