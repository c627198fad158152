/* Spin, yield, then sleep until a word changes (see wait.h). */
#include "runtime/wait.h"

#include <limits.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#if RT_WAIT_FUTEX
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

static inline void cpu_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Processes that share this host's CPUs (rt_wait_share_cpus). */
static _Atomic int sharers = 1;

void rt_wait_share_cpus(int processes) { atomic_store(&sharers, processes > 1 ? processes : 1); }

/* CPUs this process may run on (1 if unknown): its affinity, or, when
 * that is the whole host and other processes of the run share it, its
 * share of the host. */
static int usable_cpus(void)
{
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    int n = online > 0 ? (int)online : 1;
#if defined(__linux__) && defined(CPU_COUNT)
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0 && CPU_COUNT(&set) < n)
        return CPU_COUNT(&set); /* bound by the launcher: its CPUs are its own */
#endif
    n /= atomic_load(&sharers);
    return n > 0 ? n : 1;
}

int64_t rt_wait_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec + 1;
}

void rt_wait_init(rt_waiter *w, int threads, rt_wait_spin fits, rt_wait_spin crowded)
{
    w->spin = threads <= usable_cpus() ? fits : crowded;
#if !RT_WAIT_FUTEX
    pthread_mutex_init(&w->mu, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv, &attr);
    pthread_condattr_destroy(&attr);
#endif
}

void rt_wait_destroy(rt_waiter *w)
{
#if !RT_WAIT_FUTEX
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
#else
    (void)w;
#endif
}

void rt_wait_word_init(rt_wait_word *word, uint32_t value)
{
    atomic_init(&word->value, value);
    atomic_init(&word->sleepers, 0);
}

/* Sleep until woken, or at most until `deadline` (rt_wait_now_ns; 0: no
 * limit). */
#if RT_WAIT_FUTEX
static void word_sleep(rt_waiter *w, rt_wait_word *word, uint32_t old, int64_t deadline)
{
    (void)w;
    struct timespec rel, *limit = NULL;
    if (deadline) {
        int64_t left = deadline - rt_wait_now_ns();
        if (left <= 0) return;
        rel.tv_sec = (time_t)(left / 1000000000);
        rel.tv_nsec = (long)(left % 1000000000);
        limit = &rel;
    }
    /* Returns at once (EAGAIN) if the word already moved; spurious wakeups,
     * EINTR and the timeout are handled by the caller's loop. */
    syscall(SYS_futex, (uint32_t *)&word->value, FUTEX_WAIT_PRIVATE, old, limit, NULL, 0);
}

void rt_wait_wake(rt_waiter *w, rt_wait_word *word)
{
    (void)w;
    syscall(SYS_futex, (uint32_t *)&word->value, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}
#else
static void word_sleep(rt_waiter *w, rt_wait_word *word, uint32_t old, int64_t deadline)
{
    struct timespec abs = {(time_t)((deadline - 1) / 1000000000), (long)((deadline - 1) % 1000000000)};
    pthread_mutex_lock(&w->mu);
    while (atomic_load(&word->value) == old) {
        if (!deadline) pthread_cond_wait(&w->cv, &w->mu);
        else if (pthread_cond_timedwait(&w->cv, &w->mu, &abs) != 0) break;
    }
    pthread_mutex_unlock(&w->mu);
}

void rt_wait_wake(rt_waiter *w, rt_wait_word *word)
{
    (void)word;
    /* Taking the mutex orders the wake after a waiter's check-then-wait. */
    pthread_mutex_lock(&w->mu);
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}
#endif

uint32_t rt_wait_while(rt_waiter *w, rt_wait_word *word, uint32_t old)
{
    return rt_wait_while_for(w, word, old, 0, NULL);
}

uint32_t rt_wait_while_for(rt_waiter *w, rt_wait_word *word, uint32_t old, int64_t timeout_ns,
                           _Atomic int64_t *asleep)
{
    uint32_t v;
    for (int i = 0; i < w->spin.pauses; i++) {
        v = atomic_load_explicit(&word->value, memory_order_acquire);
        if (v != old) return v;
        cpu_pause();
    }
    for (int i = 0; i < w->spin.yields; i++) {
        v = atomic_load_explicit(&word->value, memory_order_acquire);
        if (v != old) return v;
        sched_yield();
    }
    /* The clock is read only from here on: the spin stays as cheap as it was. */
    int64_t deadline = 0;
    if (timeout_ns > 0 || asleep) {
        int64_t now = rt_wait_now_ns();
        if (asleep && atomic_load_explicit(asleep, memory_order_relaxed) == 0)
            atomic_store_explicit(asleep, now, memory_order_relaxed);
        if (timeout_ns > 0) deadline = now + timeout_ns;
    }
    atomic_fetch_add(&word->sleepers, 1);
    while ((v = atomic_load(&word->value)) == old) {
        if (deadline && rt_wait_now_ns() >= deadline) break;
        word_sleep(w, word, old, deadline);
    }
    atomic_fetch_sub(&word->sleepers, 1);
    return v;
}

void rt_wait_notify(rt_waiter *w, rt_wait_word *word)
{
    if (atomic_load(&word->sleepers) > 0) rt_wait_wake(w, word);
}
