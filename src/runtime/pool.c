/*
 * Thread pool and barrier (see pool.h).
 *
 * Every wait is on a 32-bit word that another thread changes: a worker
 * waits for the job generation to move, the caller for the count of busy
 * workers to reach zero, a barrier for the barrier generation to move.  A
 * waiter spins a little (a node of a small model takes microseconds, and a
 * sleep/wake costs about as much), then counts itself as a sleeper and
 * blocks; the thread that changes the word wakes only when someone sleeps,
 * so a pool whose threads all spin makes no system calls.
 *
 * The sleeper count works because both sides use sequentially consistent
 * operations: the waiter increments `sleepers` then re-reads the word, the
 * waker writes the word then reads `sleepers`, so at least one of them sees
 * the other (and the futex re-checks the word in the kernel).
 */
#include "runtime/pool.h"

#include "base/arena.h"
#include "base/error.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include <unistd.h>

#if defined(__linux__) && !defined(RT_POOL_NO_FUTEX)
#define RT_POOL_FUTEX 1
#include <linux/futex.h>
#include <sys/syscall.h>
#else
#define RT_POOL_FUTEX 0
#endif

/* Pauses before sleeping: a pause takes 5-40 ns depending on the CPU, so
 * this is some 10-50 microseconds.  When the pool has more threads than
 * the CPUs it may run on, the thread being waited for is often not
 * running at all and spinning only delays it: then barely spin. */
enum { SPIN_PAUSES = 2048, SPIN_PAUSES_OVERSUBSCRIBED = 16 };

static inline void cpu_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* A word that threads wait on, alone on its cache line so that spinning
 * on one does not slow writes to another. */
typedef struct wait_word {
    _Alignas(64) _Atomic uint32_t value;
    _Atomic int sleepers;
} wait_word;

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
    int spin;                 /* pauses before sleeping */

    /* The current job; written by the caller before `gen` moves. */
    void (*fn)(void *ctx, int ith, int nth);
    void *ctx;
    bool stop;

    wait_word gen;            /* bumped once per run (and to stop) */
    wait_word busy;           /* workers still inside the current job */
    wait_word bar_gen;        /* bumped when a barrier opens */
    _Alignas(64) _Atomic uint32_t bar_count; /* arrivals at the current barrier */

#if !RT_POOL_FUTEX
    pthread_mutex_t mu;
    pthread_cond_t cv;
#endif
};

/* ---- Sleeping on a word ---------------------------------------------------- */

#if RT_POOL_FUTEX
static void word_sleep(rt_pool *p, wait_word *w, uint32_t old)
{
    (void)p;
    /* Returns at once (EAGAIN) if the word already moved; spurious wakeups
     * and EINTR are handled by the caller's loop. */
    syscall(SYS_futex, (uint32_t *)&w->value, FUTEX_WAIT_PRIVATE, old, NULL, NULL, 0);
}

static void word_wake(rt_pool *p, wait_word *w)
{
    (void)p;
    syscall(SYS_futex, (uint32_t *)&w->value, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}
#else
/* One mutex and condition variable for every word of the pool: waking is
 * rare (only when someone sleeps), so sharing them costs little. */
static void word_sleep(rt_pool *p, wait_word *w, uint32_t old)
{
    pthread_mutex_lock(&p->mu);
    while (atomic_load(&w->value) == old) pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

static void word_wake(rt_pool *p, wait_word *w)
{
    (void)w;
    /* Taking the mutex orders the wake after a waiter's check-then-wait. */
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}
#endif

/* Wait until w->value != old; returns the new value (acquire). */
static uint32_t word_wait(rt_pool *p, wait_word *w, uint32_t old)
{
    uint32_t v;
    for (int i = 0; i < p->spin; i++) {
        v = atomic_load_explicit(&w->value, memory_order_acquire);
        if (v != old) return v;
        cpu_pause();
    }
    atomic_fetch_add(&w->sleepers, 1);
    while ((v = atomic_load(&w->value)) == old) word_sleep(p, w, old);
    atomic_fetch_sub(&w->sleepers, 1);
    return v;
}

/* After changing w->value with a seq_cst operation. */
static void word_notify(rt_pool *p, wait_word *w)
{
    if (atomic_load(&w->sleepers) > 0) word_wake(p, w);
}

/* CPUs this process may run on (1 if unknown). */
static int usable_cpus(void)
{
#if defined(__linux__) && defined(CPU_COUNT)
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
#endif
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* ---- Workers --------------------------------------------------------------- */

static void *worker_main(void *arg)
{
    worker *self = arg;
    rt_pool *p = self->pool;
    uint32_t seen = 0;
    for (;;) {
        /* The caller publishes fn/ctx/stop before bumping gen (seq_cst,
         * hence release), so the acquire here makes them visible. */
        seen = word_wait(p, &p->gen, seen);
        if (p->stop) break;
        p->fn(p->ctx, self->ith, p->nth);
        /* Release: our work is visible to the caller once it sees zero.
         * No field of the job is read after this. */
        if (atomic_fetch_sub(&p->busy.value, 1) == 1) word_notify(p, &p->busy);
    }
    return NULL;
}

static void stop_workers(rt_pool *p)
{
    p->stop = true;
    atomic_fetch_add(&p->gen.value, 1);
    word_notify(p, &p->gen);
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
    p->spin = nth <= usable_cpus() ? SPIN_PAUSES : SPIN_PAUSES_OVERSUBSCRIBED;
    atomic_init(&p->gen.value, 0);
    atomic_init(&p->gen.sleepers, 0);
    atomic_init(&p->busy.value, 0);
    atomic_init(&p->busy.sleepers, 0);
    atomic_init(&p->bar_gen.value, 0);
    atomic_init(&p->bar_gen.sleepers, 0);
    atomic_init(&p->bar_count, 0);
#if !RT_POOL_FUTEX
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
#endif
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
    word_notify(p, &p->gen);

    fn(ctx, 0, p->nth);

    uint32_t left = atomic_load_explicit(&p->busy.value, memory_order_acquire);
    while (left != 0) left = word_wait(p, &p->busy, left);
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
        word_notify(p, &p->bar_gen);
    } else {
        word_wait(p, &p->bar_gen, gen);
    }
}

int rt_pool_size(const rt_pool *p) { return p->nth; }

void rt_pool_free(rt_pool *p)
{
    if (!p) return;
    stop_workers(p);
#if !RT_POOL_FUTEX
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
#endif
    base_free(&p->alloc, p->threads);
    base_free(&p->alloc, p->workers);
    base_free(&p->alloc, p);
}
