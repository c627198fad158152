/*
 * Thread pool and barrier (see pool.h).
 *
 * Every wait is on a 32-bit word that another thread changes (wait.h): a
 * worker waits for the job generation to move, the caller for the count of
 * busy workers to reach zero, a barrier for the barrier generation to move.
 * A waiter spins a little (a node of a small model takes microseconds, and
 * a sleep/wake costs about as much), then sleeps; the thread that changes
 * the word wakes only when someone sleeps, so a pool whose threads all spin
 * makes no system calls.
 */
#include "runtime/pool.h"

#include "base/arena.h"
#include "base/error.h"
#include "runtime/wait.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

/* Pauses before sleeping: a pause takes 5-40 ns depending on the CPU, so
 * this is some 10-50 microseconds.  When the pool has more threads than
 * the CPUs it may run on, the thread being waited for is often not
 * running at all and spinning only delays it: then barely spin.  The
 * pool goes straight from spinning to sleeping; only the collectives put
 * yields in between (collectives_shm_world.c says why). */
static const rt_wait_spin POOL_SPIN = {.pauses = 2048, .yields = 0};
static const rt_wait_spin POOL_SPIN_OVERSUBSCRIBED = {.pauses = 16, .yields = 0};

typedef struct worker {
    rt_pool *pool;
    int ith;
} worker;

struct rt_pool {
    int nth;
    spmd_allocator alloc;
    pthread_t *threads;
    worker *workers;
    int started;              /* workers actually running */
    rt_waiter wait;

    /* The current job; written by the caller before `gen` moves. */
    void (*fn)(void *ctx, int ith, int nth);
    void *ctx;
    bool stop;

    /* Each alone on its cache line, so that spinning on one does not slow
     * writes to another. */
    _Alignas(64) rt_wait_word gen;     /* bumped once per run (and to stop) */
    _Alignas(64) rt_wait_word busy;    /* workers still inside the current job */
    _Alignas(64) rt_wait_word bar_gen; /* bumped when a barrier opens */
    _Alignas(64) _Atomic uint32_t bar_count; /* arrivals at the current barrier */
};

/* ---- Workers --------------------------------------------------------------- */

static void *worker_main(void *arg)
{
    worker *self = arg;
    rt_pool *p = self->pool;
    uint32_t seen = 0;
    for (;;) {
        /* The caller publishes fn/ctx/stop before bumping gen (seq_cst,
         * hence release), so the acquire here makes them visible. */
        seen = rt_wait_while(&p->wait, &p->gen, seen);
        if (p->stop) break;
        p->fn(p->ctx, self->ith, p->nth);
        /* Release: our work is visible to the caller once it sees zero.
         * No field of the job is read after this. */
        if (atomic_fetch_sub(&p->busy.value, 1) == 1) rt_wait_notify(&p->wait, &p->busy);
    }
    return NULL;
}

static void stop_workers(rt_pool *p)
{
    p->stop = true;
    atomic_fetch_add(&p->gen.value, 1);
    rt_wait_notify(&p->wait, &p->gen);
    for (int i = 0; i < p->started; i++) pthread_join(p->threads[i], NULL);
    p->started = 0;
}

rt_pool *rt_pool_create(int nth, const spmd_allocator *alloc)
{
    if (nth < 1) {
        base_error(SPMD_ERR_INVALID, "thread pool: %d threads requested, need at least 1", nth);
        return NULL;
    }
    spmd_allocator a = base_allocator_or_default(alloc);
    rt_pool *p = base_alloc(&a, sizeof *p, "thread pool");
    if (!p) return NULL;
    memset(p, 0, sizeof *p);
    p->nth = nth;
    p->alloc = a;
    rt_wait_init(&p->wait, nth, POOL_SPIN, POOL_SPIN_OVERSUBSCRIBED);
    rt_wait_word_init(&p->gen, 0);
    rt_wait_word_init(&p->busy, 0);
    rt_wait_word_init(&p->bar_gen, 0);
    atomic_init(&p->bar_count, 0);
    if (nth > 1) {
        p->threads = base_alloc(&a, sizeof *p->threads * (size_t)(nth - 1), "thread pool");
        p->workers = base_alloc(&a, sizeof *p->workers * (size_t)(nth - 1), "thread pool");
        if (!p->threads || !p->workers) {
            rt_pool_free(p);
            return NULL;
        }
        for (int i = 0; i < nth - 1; i++) {
            p->workers[i] = (worker){p, i + 1};
            int rc = pthread_create(&p->threads[i], NULL, worker_main, &p->workers[i]);
            if (rc != 0) {
                rt_pool_free(p);
                base_error(SPMD_ERR_NOMEM, "thread pool: could not start worker %d of %d: %s",
                           i + 1, nth - 1, strerror(rc));
                return NULL;
            }
            p->started++;
        }
    }
    return p;
}

void rt_pool_run(rt_pool *p, void (*fn)(void *ctx, int ith, int nth), void *ctx)
{
    if (p->nth == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->busy.value, (uint32_t)(p->nth - 1), memory_order_relaxed);
    atomic_fetch_add(&p->gen.value, 1);
    rt_wait_notify(&p->wait, &p->gen);

    fn(ctx, 0, p->nth);

    uint32_t left = atomic_load_explicit(&p->busy.value, memory_order_acquire);
    while (left != 0) left = rt_wait_while(&p->wait, &p->busy, left);
}

void rt_pool_barrier(rt_pool *p)
{
    if (p->nth == 1) return;
    /* Read the generation before arriving: the barrier cannot open until
     * this thread arrives, so the value read is the current one. */
    uint32_t gen = atomic_load_explicit(&p->bar_gen.value, memory_order_acquire);
    if (atomic_fetch_add(&p->bar_count, 1) == (uint32_t)(p->nth - 1)) {
        /* Last to arrive: reset for the next barrier before opening this
         * one, so nobody can arrive at the next one early and miscount. */
        atomic_store_explicit(&p->bar_count, 0, memory_order_relaxed);
        atomic_fetch_add(&p->bar_gen.value, 1);
        rt_wait_notify(&p->wait, &p->bar_gen);
    } else {
        rt_wait_while(&p->wait, &p->bar_gen, gen);
    }
}

int rt_pool_size(const rt_pool *p) { return p->nth; }

void rt_pool_free(rt_pool *p)
{
    if (!p) return;
    stop_workers(p);
    rt_wait_destroy(&p->wait);
    base_free(&p->alloc, p->threads);
    base_free(&p->alloc, p->workers);
    base_free(&p->alloc, p);
}
