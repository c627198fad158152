/*
 * Waiting for a 32-bit word to change, for the thread pool and the
 * shared-memory collectives: spin with a pause instruction, then yield a
 * few times, then sleep (a futex on Linux, a condition variable elsewhere).
 * The thread that changes the word wakes sleepers only when there are some,
 * so threads that all spin make no system calls.
 *
 * The sleeper count works because both sides use sequentially consistent
 * operations: the waiter counts itself then re-reads the word, the waker
 * changes the word then reads the count, so at least one of them sees the
 * other (and the futex re-checks the word in the kernel).
 */
#ifndef SPMD_RUNTIME_WAIT_H
#define SPMD_RUNTIME_WAIT_H

#include <stdatomic.h>
#include <stdint.h>

#if defined(__linux__) && !defined(RT_WAIT_NO_FUTEX)
#define RT_WAIT_FUTEX 1
#else
#define RT_WAIT_FUTEX 0
#include <pthread.h>
#endif

/* A word that threads wait on and how many sleep on it.  Owners put each
 * on its own cache line (_Alignas(64)), so that spinning on one does not
 * slow writes to a neighbour. */
typedef struct rt_wait_word {
    _Atomic uint32_t value;
    _Atomic int sleepers;
} rt_wait_word;

/* How long a waiter spins before it sleeps: pause instructions, then
 * sched_yield calls.  Owners tune these for their waits (see pool.c and
 * collectives_shm_world.c). */
typedef struct rt_wait_spin {
    int pauses;
    int yields;
} rt_wait_spin;

/* What every word of one owner (a pool, a collectives world) waits with:
 * its spin, and off Linux the one mutex and condition variable they all
 * sleep on, since sleeping is the slow path. */
typedef struct rt_waiter {
    rt_wait_spin spin;
#if !RT_WAIT_FUTEX
    pthread_mutex_t mu;
    pthread_cond_t cv;
#endif
} rt_waiter;

/* For `threads` threads that wait on each other: `fits` when each can have
 * a CPU of its own, else `crowded` (then the thread being waited for is
 * often not running at all, and spinning only delays it). */
void rt_wait_init(rt_waiter *w, int threads, rt_wait_spin fits, rt_wait_spin crowded);
/* Say that `processes` processes of the run share this host's CPUs (the
 * MPI world does, from the communicator): waits made from then on count
 * only this process's share as its own. */
void rt_wait_share_cpus(int processes);
void rt_wait_destroy(rt_waiter *w);
void rt_wait_word_init(rt_wait_word *word, uint32_t value);

/* Wait until word->value differs from `old`; returns it (acquire). */
uint32_t rt_wait_while(rt_waiter *w, rt_wait_word *word, uint32_t old);
/* rt_wait_while that gives up once it has slept `timeout_ns` (counted from
 * the end of its spin, so the spin reads no clock): then it returns `old`.
 * timeout_ns <= 0 waits for good.  When it goes to sleep and `asleep` is
 * set and holds 0, it stores the clock there (rt_wait_now_ns), so others
 * can see how long this thread has waited. */
uint32_t rt_wait_while_for(rt_waiter *w, rt_wait_word *word, uint32_t old, int64_t timeout_ns,
                           _Atomic int64_t *asleep);
/* CLOCK_MONOTONIC in nanoseconds (never 0). */
int64_t rt_wait_now_ns(void);
/* After changing word->value with a seq_cst operation: wake its sleepers,
 * if it has any. */
void rt_wait_notify(rt_waiter *w, rt_wait_word *word);
/* Wake its sleepers without looking at the count. */
void rt_wait_wake(rt_waiter *w, rt_wait_word *word);

#endif
