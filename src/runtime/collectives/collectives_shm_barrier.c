/*
 * The shared-memory barrier (collectives_shm_impl.h): one word of abort bit
 * and generation that members wait on, the abort that closes every
 * barrier of a world, and the watchdog that names whom a wait waited for.
 */
#include "runtime/collectives/collectives_shm_impl.h"

#include "base/error.h"

#include <stdio.h>

static uint32_t gen_of(uint32_t word) { return word & GEN_MASK; }

void coll_shm_abort_locked(coll_world *w, const char *message)
{
    if (!atomic_load(&w->aborted)) {
        snprintf(w->message, sizeof w->message, "%s", message ? message : "(no reason given)");
        atomic_store(&w->aborted, true);
    }
    for (coll_shm_group *g = w->groups; g; g = g->next) {
        atomic_fetch_or(&g->bar.word.value, ABORT_BIT);
        rt_wait_wake(&w->wait, &g->bar.word);
    }
}

static void set_waiting(coll_world *w, int rank, int64_t since, int on)
{
    atomic_store_explicit(&w->waiting[rank].since, since, memory_order_relaxed);
    atomic_store_explicit(&w->waiting[rank].on, on, memory_order_relaxed);
}

/* The world rank of this process's device `rank` (in an MPI world, this
 * process's ranks start at ext->first). */
static int world_rank(const coll_world *w, int rank) { return (w->ext ? w->ext->first : 0) + rank; }

/* The watchdog fired at the entry barrier of `g` for `member`: the
 * barrier is closed for good (the abort bit set, unless it opened or was
 * aborted meanwhile), the world aborted with the message naming the
 * member waited for. */
static bar_result barrier_expired(coll_shm_group *g, int member, uint32_t cur, int blame,
                                  bool blamed_waits, int64_t waited_ns)
{
    coll_world *w = g->world;
    coll_barrier *b = &g->bar;
    int op = atomic_load_explicit(&g->slots[member].op, memory_order_relaxed);
    int type = atomic_load_explicit(&g->slots[member].type, memory_order_relaxed);
    char msg[ABORT_MESSAGE];
    snprintf(msg, sizeof msg,
             "collective timeout: %s: device %d (member %d of %d) waited %.1f s without "
             "progress for device %d (member %d)%s, which had not arrived",
             coll_call_name((coll_op)op, (coll_dtype)type).text, world_rank(w, g->ranks[member]),
             member, g->pub.size, (double)waited_ns * 1e-9, world_rank(w, g->ranks[blame]), blame,
             blamed_waits ? ", itself waiting in a collective with no progress" : "");
    /* Closing this barrier and aborting the world are one step under the
     * world's mutex, so a member that finds the barrier closed reads this
     * message as the abort's cause. */
    pthread_mutex_lock(&w->mu);
    bool closed = atomic_compare_exchange_strong(&b->word.value, &cur, cur | ABORT_BIT);
    if (closed) coll_shm_abort_locked(w, msg);
    pthread_mutex_unlock(&w->mu);
    if (!closed)
        return (cur & GEN_MASK) != gen_of(atomic_load(&b->word.value)) ? BAR_OPEN : BAR_ABORTED;
    if (w->ext) w->ext->abort(w->ext_state, msg);
    base_error(SPMD_ERR_TIMEOUT, "%s", msg);
    return BAR_TIMEOUT;
}

bar_result coll_shm_barrier_wait(coll_shm_group *g, int member, bool may_abort)
{
    coll_barrier *b = &g->bar;
    coll_world *w = g->world;
    /* Read before arriving: the barrier cannot open until this thread
     * arrives, so this is the current generation. */
    uint32_t cur = atomic_load(&b->word.value);
    if (may_abort && (cur & ABORT_BIT)) return BAR_ABORTED;
    uint32_t gen = cur & GEN_MASK;
    if (may_abort) atomic_store_explicit(&g->slots[member].arrived, gen, memory_order_relaxed);
    uint32_t seen = atomic_fetch_add(&b->count, 1) + 1; /* arrivals, this one's included */
    if (seen == (uint32_t)g->pub.size) {
        /* Last to arrive: reset the count before opening, so that nobody
         * can arrive at the next barrier early and miscount. */
        atomic_store(&b->count, 0);
        cur = atomic_load(&b->word.value);
        for (;;) {
            if (may_abort && (cur & ABORT_BIT)) return BAR_ABORTED;
            uint32_t next = (cur & ABORT_BIT) | ((cur + 1) & GEN_MASK);
            if (atomic_compare_exchange_weak(&b->word.value, &cur, next)) break;
        }
        rt_wait_notify(&w->wait, &b->word);
        return BAR_OPEN;
    }
    int64_t limit = coll_world_timeout_ns(w);
    if (limit <= 0) {
        for (;;) {
            cur = rt_wait_while(&w->wait, &b->word, cur);
            if ((cur & GEN_MASK) != gen) return BAR_OPEN;
            if (may_abort && (cur & ABORT_BIT)) return BAR_ABORTED;
        }
    }
    int rank = g->ranks[member];
    _Atomic int64_t *since = &w->waiting[rank].since;
    int64_t tick = coll_world_tick_ns(limit);
    bar_result r;
    for (;;) {
        uint32_t v = rt_wait_while_for(&w->wait, &b->word, cur, tick, since);
        if (v != cur) {
            cur = v;
            if ((cur & GEN_MASK) != gen) {
                r = BAR_OPEN;
                break;
            }
            if (may_abort && (cur & ABORT_BIT)) {
                r = BAR_ABORTED;
                break;
            }
            continue;
        }
        int64_t now = rt_wait_now_ns();
        if (!may_abort) {
            /* Past an entry, members only copy memory or wait for their
             * leader's exchange, which has a watchdog of its own: this wait
             * is never the cause, so it shows itself live. */
            set_waiting(w, rank, now, -1);
            continue;
        }
        uint32_t count = atomic_load(&b->count);
        if (count != seen) { /* a peer arrived: progress */
            seen = count;
            set_waiting(w, rank, now, -1);
            continue;
        }
        int64_t from = atomic_load_explicit(since, memory_order_relaxed);
        if (from && now - from < limit) continue;
        /* The limit passed: whom is this member waiting for? */
        int blame = -1, live = -1;
        for (int m = 0; m < g->pub.size; m++) {
            if (m == member ||
                atomic_load_explicit(&g->slots[m].arrived, memory_order_relaxed) == gen)
                continue;
            if (coll_shm_wait_live(w, g->ranks[m], rank, now, limit)) {
                if (live < 0) live = m;
            } else if (blame < 0) {
                blame = m;
            }
        }
        if (blame < 0 && live >= 0) {
            /* Waiting on a live wait: keep this wait fresh, so that waits on
             * it wait on too. */
            set_waiting(w, rank, now, g->ranks[live]);
            continue;
        }
        if (blame < 0) continue; /* everyone arrived: the barrier opens now */
        bool blamed_waits =
            atomic_load_explicit(&w->waiting[g->ranks[blame]].since, memory_order_relaxed) != 0;
        r = barrier_expired(g, member, cur, blame, blamed_waits, from ? now - from : limit);
        break;
    }
    if (atomic_load_explicit(since, memory_order_relaxed)) set_waiting(w, rank, 0, -1);
    return r;
}

bool coll_shm_wait_live(coll_world *w, int rank, int me, int64_t now, int64_t timeout_ns)
{
    for (int hops = 0; hops <= w->n; hops++) {
        int64_t since = atomic_load_explicit(&w->waiting[rank].since, memory_order_relaxed);
        int on = atomic_load_explicit(&w->waiting[rank].on, memory_order_relaxed);
        if (!since) return false;
        if (on < 0) return now - since < timeout_ns + timeout_ns / 2;
        if (on == me) return false; /* a cycle: nobody else will fire */
        rank = on;
    }
    return false;
}

void coll_shm_waiting(coll_world *w, int rank, int64_t since, int on)
{
    set_waiting(w, rank, since, on);
}

int64_t coll_world_timeout_ns(const coll_world *w)
{
    return atomic_load_explicit(&w->timeout_ns, memory_order_relaxed);
}

int64_t coll_world_tick_ns(int64_t timeout_ns)
{
    int64_t tick = timeout_ns / 8;
    return tick > 1000000 ? tick : 1000000;
}

void coll_world_set_timeout(coll_world *w, double seconds)
{
    if (seconds == 0 || seconds != seconds) seconds = SPMD_COLLECTIVE_TIMEOUT_S; /* 0, NaN */
    int64_t ns = 0; /* negative: off */
    if (seconds > 0) {
        ns = seconds >= 1e9 ? (int64_t)1e18 : (int64_t)(seconds * 1e9);
        if (ns < 1) ns = 1;
    }
    atomic_store(&w->timeout_ns, ns);
}

void coll_shm_sync(coll_shm_group *g, int member) { coll_shm_barrier_wait(g, member, false); }
