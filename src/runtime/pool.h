/*
 * The compute thread pool: nth-1 worker threads plus the calling thread run
 * one function together, and a reusable barrier lets that function step
 * through a whole program (node, barrier, node, ...) in a single run.
 *
 * Waiting spins briefly with a pause instruction and then sleeps (futex on
 * Linux, a condition variable elsewhere), because a program may run more
 * workers than there are cores and spinning would then starve them.
 */
#ifndef SPMD_RUNTIME_POOL_H
#define SPMD_RUNTIME_POOL_H

#include "spmd/spmd.h"

typedef struct rt_pool rt_pool;

/* A pool of `nth` threads (nth >= 1): nth-1 workers plus the caller of
 * rt_pool_run.  `alloc` may be NULL.  NULL with an error message on
 * failure. */
rt_pool *rt_pool_create(int nth, const spmd_allocator *alloc);

/* Run fn(ctx, ith, nth) on every thread, the caller as ith 0, and return
 * when all have returned.  Calls from one thread at a time; fn must not
 * call rt_pool_run itself. */
void rt_pool_run(rt_pool *p, void (*fn)(void *ctx, int ith, int nth), void *ctx);

/* Inside fn: wait until all nth threads have reached the barrier.  Every
 * thread must call it the same number of times per run.  Writes made
 * before the barrier are visible to every thread after it. */
void rt_pool_barrier(rt_pool *p);

int rt_pool_size(const rt_pool *p);

/* Stops and joins the workers.  NULL is fine. */
void rt_pool_free(rt_pool *p);

#endif
