/*
 * Shared-memory collectives (see collectives.h): the devices of a world are
 * threads of one process, so a collective needs no messages.  Each group
 * has one slot per member, where the member publishes its buffer pointers
 * and sizes, and one reusable barrier.  After the entry barrier every
 * member reads its peers' buffers directly, so data moves once, without
 * staging copies; an exit barrier keeps every buffer alive and unchanged
 * until all peers have finished reading it.  Sums follow the canonical
 * tree over member ranks (collectives_tree.c), as every transport's do.
 * The MPI transport runs the in-process part of its collectives on
 * private groups of this world (collectives_impl.h).
 *
 * Waits spin briefly, yield a few times and then sleep on a futex (a
 * condition variable off Linux; wait.h), because a world often runs more
 * device threads than cores, and a spinning thread would then starve the
 * one it waits for.
 *
 * Abort: the barrier word holds an abort bit next to its generation, and
 * opening the barrier and aborting are both atomic operations on that one
 * word, so a barrier either opened before the abort (every member passes
 * it) or never opens (every member gets an error).  Only the entry barrier
 * of a collective may fail that way: once every member is past it, the
 * members only copy memory until the next barrier, so the later barriers
 * wait through an abort.  That costs at most one copy phase of latency and
 * guarantees that no member returns (so that its caller may free or
 * overwrite its buffer) while a peer may still be reading that buffer.
 */
#include "runtime/collectives.h"

#include "base/arena.h"
#include "base/error.h"
#include "runtime/collectives_impl.h"
#include "runtime/wait.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* Pauses before yielding, as in the thread pool: some 10-50 microseconds
 * when every device thread has a core, almost none when they share cores
 * (then the thread being waited for is often not running at all).  Then a
 * few sched_yield calls before sleeping: when device threads share cores,
 * yielding hands the core straight to a peer that still has to arrive,
 * which measured 4-8x faster than a futex sleep and wake for small
 * collectives with 4 and 8 threads on 2 cores; when nothing else is
 * runnable a yield returns at once, so this only bounds the spin. */
static const rt_wait_spin COLL_SPIN = {.pauses = 4096, .yields = 4};
static const rt_wait_spin COLL_SPIN_OVERSUBSCRIBED = {.pauses = 16, .yields = 16};

/* All-reduce chunks start at multiples of 64 bytes, so that two members
 * never write the same cache line of an aligned buffer. */
enum { CHUNK_BYTES = 64 };

enum { ABORT_MESSAGE = 256 };

#define ABORT_BIT 0x80000000u
#define GEN_MASK 0x7fffffffu

const char *const coll_op_names[] = {"all_reduce", "all_gather", "reduce_scatter",
                                     "all_to_all", "broadcast",  "permute"};

coll_call_text coll_call_name(coll_op op, coll_dtype type)
{
    coll_call_text t;
    if (type == COLL_F32)
        snprintf(t.text, sizeof t.text, "%s", coll_op_names[op]);
    else
        snprintf(t.text, sizeof t.text, "%s (%s)", coll_op_names[op], coll_dtype_name(type));
    return t;
}

/* What a member publishes for the current collective, alone on its cache
 * line because each member writes only its own.  Written before the entry
 * barrier, read by peers between the entry and exit barriers. */
typedef struct coll_slot {
    _Alignas(64) coll_call call;
    /* call.op and call.type again, for a peer's watchdog message, which
     * reads them while this member may publish its next call. */
    _Atomic int op, type;
    /* The generation of the last entry barrier this member arrived at: a
     * peer's watchdog sees who has not arrived. */
    _Atomic uint32_t arrived;
} coll_slot;

/* The word waited on (abort bit | generation) and the arrival count, on
 * separate cache lines so that arriving does not disturb the spinners. */
typedef struct coll_barrier {
    _Alignas(64) rt_wait_word word;
    _Alignas(64) _Atomic uint32_t count;
} coll_barrier;

struct coll_shm_group {
    coll_barrier bar;
    coll_group pub;
    struct coll_shm_group *next;
    coll_world *world;
    int *ranks;
    coll_slot *slots;
    coll_term *terms;  /* the summands: member i writes terms[i] before entering */
    bool hidden;       /* another transport's private group: never looked up */
};

/* What a device's current wait tells the others (coll_shm_waiting). */
typedef struct coll_waiting {
    _Alignas(64) _Atomic int64_t since;
    _Atomic int on;
} coll_waiting;

struct coll_world {
    int n;
    _Atomic int64_t timeout_ns; /* the watchdog's limit; 0: off */
    coll_waiting *waiting;      /* [n] */
    rt_waiter wait; /* for every barrier of the world */
    spmd_allocator alloc;
    /* Guards the group list and the abort message; groups are never freed
     * before the world, so a group pointer stays valid without it. */
    pthread_mutex_t mu;
    coll_shm_group *groups;
    _Atomic bool aborted;
    char message[ABORT_MESSAGE];
    /* Devices in other processes (collectives_impl.h), or NULL. */
    const coll_world_ext *ext;
    void *ext_state;
};

/* ---- The barrier ------------------------------------------------------------ */

static uint32_t gen_of(uint32_t word) { return word & GEN_MASK; }

/* Under w->mu: the first abort names the cause (later ones are its
 * consequences); every barrier's word gets the abort bit. */
static void abort_locked(coll_world *w, const char *message)
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

typedef enum bar_result { BAR_OPEN, BAR_ABORTED, BAR_TIMEOUT } bar_result;

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
    if (closed) abort_locked(w, msg);
    pthread_mutex_unlock(&w->mu);
    if (!closed)
        return (cur & GEN_MASK) != gen_of(atomic_load(&b->word.value)) ? BAR_OPEN : BAR_ABORTED;
    if (w->ext) w->ext->abort(w->ext_state, msg);
    base_error(SPMD_ERR_TIMEOUT, "%s", msg);
    return BAR_TIMEOUT;
}

/* Wait for every member of the group.  BAR_OPEN once the barrier opened;
 * otherwise only when `may_abort` (entry barriers; `member` is the
 * caller's rank): BAR_ABORTED when the world was aborted before it could
 * open, in which case it never opens (opening checks the abort bit in the
 * same compare-and-swap), so every member of this barrier fails alike;
 * BAR_TIMEOUT, its message recorded, when the watchdog fired here.
 *
 * The watchdog: past the spin, the waiter wakes every tick (an eighth of
 * the limit) and counts a peer's arrival as progress; when none came for
 * the limit, it looks at the members that have not arrived.  If each of
 * them waits, live, in another collective (coll_shm_wait_live), that
 * wait's watchdog names the cause, and this one waits on; else it fires,
 * naming the first that is not waiting live. */
static bar_result barrier_wait(coll_shm_group *g, int member, bool may_abort)
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

/* ---- Entry and exit ---------------------------------------------------------- */

static spmd_status aborted_error(coll_world *w)
{
    char msg[ABORT_MESSAGE];
    pthread_mutex_lock(&w->mu);
    memcpy(msg, w->message, sizeof msg);
    pthread_mutex_unlock(&w->mu);
    return base_error(SPMD_ERR_BACKEND, "collective aborted: %s", msg);
}

static spmd_status check_member(const coll_group *pub, int member, coll_op op)
{
    if (member < 0 || member >= pub->size)
        return base_error(SPMD_ERR_INVALID, "%s: member %d of a group of %d", coll_op_names[op],
                          member, pub->size);
    return SPMD_OK;
}

static bool same_call(const coll_call *x, const coll_call *y)
{
    if (x->op != y->op || x->type != y->type || x->a != y->a || x->b != y->b ||
        x->root != y->root)
        return false;
    if (x->op == COLL_OP_PERMUTE &&
        (x->src_n != y->src_n || memcmp(x->src, y->src, sizeof *x->src * (size_t)x->src_n) != 0))
        return false;
    return true;
}

/* coll_set_delay_us: how long each member's call waits before it is
 * published (0: not at all). */
static _Atomic int64_t delay_us;

void coll_set_delay_us(int64_t us) { atomic_store(&delay_us, us > 0 ? us : 0); }

static void delay(void)
{
    int64_t us = atomic_load_explicit(&delay_us, memory_order_relaxed);
    if (us <= 0) return;
    struct timespec t = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000};
    while (nanosleep(&t, &t) != 0) {
    }
}

/* Publish this member's call and wait for every member.  Then check that
 * all of them called the same collective with the same sizes: a mismatch
 * is a bug in the program, and reading peers' buffers with the wrong sizes
 * would read past their ends, so every member fails instead. */
static spmd_status enter_call(coll_shm_group *g, int member, const coll_call *call)
{
    delay();
    coll_slot *s = &g->slots[member];
    s->call = *call;
    atomic_store_explicit(&s->op, (int)call->op, memory_order_relaxed);
    atomic_store_explicit(&s->type, (int)call->type, memory_order_relaxed);
    bar_result r = barrier_wait(g, member, true);
    if (r == BAR_TIMEOUT) return SPMD_ERR_TIMEOUT;
    if (r == BAR_ABORTED) return aborted_error(g->world);
    int n = g->pub.size;
    for (int i = 1; i < n; i++) {
        const coll_call *s0 = &g->slots[0].call, *si = &g->slots[i].call;
        if (!same_call(s0, si)) {
            /* The message reads the slots, so it comes first: after the
             * barrier a peer may already publish its next call. */
            spmd_status st = base_error(
                SPMD_ERR_INTERNAL,
                "collective mismatch in a group of %d: member 0 called %s(%lld, %lld, root %d), "
                "member %d %s(%lld, %lld, root %d)",
                n, coll_call_name(s0->op, s0->type).text, (long long)s0->a, (long long)s0->b,
                s0->root, i, coll_call_name(si->op, si->type).text, (long long)si->a,
                (long long)si->b, si->root);
            /* Keep the slots unchanged until every member has checked them. */
            barrier_wait(g, member, false);
            return st;
        }
    }
    return SPMD_OK;
}

static spmd_status enter(coll_shm_group *g, int member, coll_op op, coll_dtype type,
                         const void *in, int64_t a, int64_t b, int root, const int *src)
{
    coll_call call = {.op = op, .type = type, .in = in, .a = a, .b = b, .root = root,
                      .src = src, .src_n = src ? g->pub.size : 0};
    return enter_call(g, member, &call);
}

/* After the last read of a peer's buffer: nobody returns (and lets its
 * caller reuse the buffer) until every peer is done with it. */
static void leave(coll_shm_group *g, int member) { barrier_wait(g, member, false); }

/* A group of one has nobody to wait for, but still fails after an abort. */
static spmd_status alone(coll_shm_group *g)
{
    if (atomic_load(&g->world->aborted)) return aborted_error(g->world);
    return SPMD_OK;
}

static void copy(void *dst, const void *src, size_t bytes)
{
    if (dst != src && bytes) memcpy(dst, src, bytes);
}

/* Elements [lo, hi) of `count` elements of `type` that member i of n
 * reduces. */
static void chunk_of(int64_t count, coll_dtype type, int n, int i, int64_t *lo, int64_t *hi)
{
    int64_t unit = CHUNK_BYTES / (int64_t)coll_dtype_size(type);
    int64_t units = (count + unit - 1) / unit;
    int64_t a = (units / n * i + units % n * i / n) * unit;
    int64_t b = (units / n * (i + 1) + units % n * (i + 1) / n) * unit;
    *lo = a < count ? a : count;
    *hi = b < count ? b : count;
}

/* ---- The collectives ----------------------------------------------------------- */

/* Member j sums chunk j of every member's buffer into its own buffer (only
 * j reads or writes chunk j in this phase, so in place is safe); then
 * every member copies chunk i from member i.  Three barriers, no scratch. */
static spmd_status shm_all_reduce(coll_group *pub, int member, void *buf, int64_t count,
                                  coll_dtype type)
{
    coll_shm_group *g = pub->impl;
    spmd_status st = check_member(pub, member, COLL_OP_ALL_REDUCE);
    if (st) return st;
    if (!coll_dtype_valid(type))
        return base_error(SPMD_ERR_INVALID, "all_reduce: element type %d", (int)type);
    if (count < 0 || (count > 0 && !buf))
        return base_error(SPMD_ERR_INVALID, "all_reduce: %lld %s values at %p", (long long)count,
                          coll_dtype_name(type), buf);
    int n = pub->size;
    if (n == 1) return alone(g);
    g->terms[member] = (coll_term){buf, type, 0, member + 1};
    st = enter(g, member, COLL_OP_ALL_REDUCE, type, buf, count, 0, 0, NULL);
    if (st) return st;
    int64_t lo, hi;
    chunk_of(count, type, n, member, &lo, &hi);
    coll_tree_sum(g->terms, 0, n, 0, lo, coll_elem(buf, type, lo), type, hi - lo);
    /* Every chunk is reduced, and nobody reads peers' inputs any more. */
    barrier_wait(g, member, false);
    size_t es = coll_dtype_size(type);
    for (int k = 1; k < n; k++) {
        int i = (member + k) % n; /* staggered, so members start on different peers */
        chunk_of(count, type, n, i, &lo, &hi);
        copy(coll_elem(buf, type, lo), coll_elem(g->slots[i].call.in, type, lo),
             es * (size_t)(hi - lo));
    }
    leave(g, member);
    return SPMD_OK;
}

static spmd_status shm_all_gather(coll_group *pub, int member, const void *in, void *out,
                                  int64_t outer, int64_t inner_bytes)
{
    coll_shm_group *g = pub->impl;
    spmd_status st = check_member(pub, member, COLL_OP_ALL_GATHER);
    if (st) return st;
    if (outer < 0 || inner_bytes < 0 || (outer * inner_bytes > 0 && (!in || !out)))
        return base_error(SPMD_ERR_INVALID, "all_gather: [%lld, %lld bytes]",
                          (long long)outer, (long long)inner_bytes);
    int n = pub->size;
    if (n == 1) {
        st = alone(g);
        if (!st) copy(out, in, (size_t)(outer * inner_bytes));
        return st;
    }
    st = enter(g, member, COLL_OP_ALL_GATHER, COLL_F32, in, outer, inner_bytes, 0, NULL);
    if (st) return st;
    unsigned char *o = out;
    size_t inner = (size_t)inner_bytes, row = inner * (size_t)n;
    if (outer == 1) {
        /* `in` may be this member's own block of `out` (in place). */
        for (int k = 0; k < n; k++) {
            int j = (member + k) % n;
            copy(o + inner * (size_t)j, g->slots[j].call.in, inner);
        }
    } else {
        /* Row by row, so the output is written front to back. */
        for (int64_t r = 0; r < outer; r++)
            for (int j = 0; j < n; j++)
                copy(o + row * (size_t)r + inner * (size_t)j,
                     (const unsigned char *)g->slots[j].call.in + inner * (size_t)r, inner);
    }
    leave(g, member);
    return SPMD_OK;
}

static spmd_status shm_reduce_scatter(coll_group *pub, int member, const void *in, void *out,
                                      int64_t outer, int64_t inner, coll_dtype type)
{
    coll_shm_group *g = pub->impl;
    spmd_status st = check_member(pub, member, COLL_OP_REDUCE_SCATTER);
    if (st) return st;
    if (!coll_dtype_valid(type))
        return base_error(SPMD_ERR_INVALID, "reduce_scatter: element type %d", (int)type);
    if (outer < 0 || inner < 0 || (outer * inner > 0 && (!in || !out)))
        return base_error(SPMD_ERR_INVALID, "reduce_scatter: [%lld, %lld %s values]",
                          (long long)outer, (long long)inner, coll_dtype_name(type));
    int n = pub->size;
    if (n == 1) {
        st = alone(g);
        if (!st) copy(out, in, coll_dtype_size(type) * (size_t)(outer * inner));
        return st;
    }
    g->terms[member] = (coll_term){in, type, inner * n, member + 1};
    st = enter(g, member, COLL_OP_REDUCE_SCATTER, type, in, outer, inner, 0, NULL);
    if (st) return st;
    /* Only this member reads its own column block, so `out` may be that
     * block of `in` (outer == 1). */
    for (int64_t r = 0; r < outer; r++)
        coll_tree_sum(g->terms, 0, n, r, inner * member, coll_elem(out, type, inner * r), type,
                      inner);
    leave(g, member);
    return SPMD_OK;
}

static spmd_status shm_all_to_all(coll_group *pub, int member, const void *in, void *out,
                                  int64_t bytes)
{
    coll_shm_group *g = pub->impl;
    spmd_status st = check_member(pub, member, COLL_OP_ALL_TO_ALL);
    if (st) return st;
    if (bytes < 0 || (bytes > 0 && (!in || !out)))
        return base_error(SPMD_ERR_INVALID, "all_to_all: blocks of %lld bytes", (long long)bytes);
    int n = pub->size;
    if (n == 1) {
        st = alone(g);
        if (!st) copy(out, in, (size_t)bytes);
        return st;
    }
    /* Peers read `in` while this member writes `out`. */
    if (in == out && bytes > 0)
        return base_error(SPMD_ERR_INVALID, "all_to_all: out must not be in");
    st = enter(g, member, COLL_OP_ALL_TO_ALL, COLL_F32, in, bytes, 0, 0, NULL);
    if (st) return st;
    size_t b = (size_t)bytes;
    for (int k = 0; k < n; k++) {
        int i = (member + k) % n;
        copy((unsigned char *)out + b * (size_t)i,
             (const unsigned char *)g->slots[i].call.in + b * (size_t)member, b);
    }
    leave(g, member);
    return SPMD_OK;
}

static spmd_status shm_broadcast(coll_group *pub, int member, void *buf, int64_t bytes, int root)
{
    coll_shm_group *g = pub->impl;
    spmd_status st = check_member(pub, member, COLL_OP_BROADCAST);
    if (st) return st;
    if (root < 0 || root >= pub->size)
        return base_error(SPMD_ERR_INVALID, "broadcast: root %d of a group of %d", root,
                          pub->size);
    if (bytes < 0 || (bytes > 0 && !buf))
        return base_error(SPMD_ERR_INVALID, "broadcast: %lld bytes", (long long)bytes);
    if (pub->size == 1) return alone(g);
    st = enter(g, member, COLL_OP_BROADCAST, COLL_F32, buf, bytes, 0, root, NULL);
    if (st) return st;
    if (member != root) copy(buf, g->slots[root].call.in, (size_t)bytes);
    leave(g, member);
    return SPMD_OK;
}

/* Peers read `in` while this member writes `out`, so they must not overlap
 * (out == in only for a member that receives nothing or its own data). */
static spmd_status shm_permute(coll_group *pub, int member, const void *in, void *out,
                               int64_t bytes, const int *src)
{
    coll_shm_group *g = pub->impl;
    spmd_status st = check_member(pub, member, COLL_OP_PERMUTE);
    if (st) return st;
    int n = pub->size;
    if (!src || bytes < 0 || (bytes > 0 && (!in || !out)))
        return base_error(SPMD_ERR_INVALID, "permute: %lld bytes, source table %p",
                          (long long)bytes, (const void *)src);
    for (int i = 0; i < n; i++)
        if (src[i] >= n)
            return base_error(SPMD_ERR_INVALID, "permute: member %d reads member %d of %d", i,
                              src[i], n);
    if (n == 1) {
        st = alone(g);
        if (!st && src[0] == 0) copy(out, in, (size_t)bytes);
        return st;
    }
    st = enter(g, member, COLL_OP_PERMUTE, COLL_F32, in, bytes, 0, 0, src);
    if (st) return st;
    if (src[member] >= 0) copy(out, g->slots[src[member]].call.in, (size_t)bytes);
    leave(g, member);
    return SPMD_OK;
}

static const coll_ops shm_ops = {
    .all_reduce = shm_all_reduce,
    .all_gather = shm_all_gather,
    .reduce_scatter = shm_reduce_scatter,
    .all_to_all = shm_all_to_all,
    .broadcast = shm_broadcast,
    .permute = shm_permute,
};

/* ---- The world and its groups ------------------------------------------------ */

coll_world *coll_shm_world_create(int n, const spmd_allocator *alloc)
{
    if (n < 1 || n > COLL_MAX_MEMBERS) {
        base_error(SPMD_ERR_INVALID, "collectives: a world of %d devices (1 to %d)", n,
                   COLL_MAX_MEMBERS);
        return NULL;
    }
    spmd_allocator a = base_allocator_or_default(alloc);
    coll_world *w = base_calloc(&a, sizeof *w, "collectives world");
    if (!w) return NULL;
    w->n = n;
    w->alloc = a;
    w->waiting = base_calloc(&a, sizeof *w->waiting * (size_t)n, "collectives world");
    if (!w->waiting) {
        base_free(&a, w);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        atomic_init(&w->waiting[i].since, 0);
        atomic_init(&w->waiting[i].on, -1);
    }
    atomic_init(&w->timeout_ns, 0);
    coll_world_set_timeout(w, 0);
    rt_wait_init(&w->wait, n, COLL_SPIN, COLL_SPIN_OVERSUBSCRIBED);
    pthread_mutex_init(&w->mu, NULL);
    atomic_init(&w->aborted, false);
    return w;
}

static void group_free(coll_world *w, coll_shm_group *g)
{
    base_free(&w->alloc, g->ranks);
    base_free(&w->alloc, g->slots);
    base_free(&w->alloc, g->terms);
    base_free(&w->alloc, g);
}

void coll_world_free(coll_world *w)
{
    if (!w) return;
    /* The extension's groups use this world's private groups: it goes first. */
    if (w->ext) w->ext->free(w->ext_state);
    for (coll_shm_group *g = w->groups, *next; g; g = next) {
        next = g->next;
        group_free(w, g);
    }
    pthread_mutex_destroy(&w->mu);
    rt_wait_destroy(&w->wait);
    base_free(&w->alloc, w->waiting);
    base_free(&w->alloc, w);
}

static bool valid_ranks(const coll_world *w, int size, const int *ranks)
{
    if (size < 1 || size > w->n || !ranks) {
        base_error(SPMD_ERR_INVALID, "collectives: a group of %d in a world of %d", size, w->n);
        return false;
    }
    for (int i = 0; i < size; i++) {
        if (ranks[i] < 0 || ranks[i] >= w->n) {
            base_error(SPMD_ERR_INVALID, "collectives: rank %d in a world of %d", ranks[i], w->n);
            return false;
        }
        for (int j = 0; j < i; j++)
            if (ranks[j] == ranks[i]) {
                base_error(SPMD_ERR_INVALID, "collectives: rank %d twice in a group", ranks[i]);
                return false;
            }
    }
    return true;
}

/* Under w->mu. */
static coll_shm_group *group_create(coll_world *w, int size, const int *ranks, bool hidden)
{
    coll_shm_group *g = base_calloc(&w->alloc, sizeof *g, "collective group");
    if (!g) return NULL;
    g->ranks = base_alloc(&w->alloc, sizeof *g->ranks * (size_t)size, "collective group");
    g->slots = base_calloc(&w->alloc, sizeof *g->slots * (size_t)size, "collective group");
    g->terms = base_calloc(&w->alloc, sizeof *g->terms * (size_t)size, "collective group");
    if (!g->ranks || !g->slots || !g->terms) {
        group_free(w, g);
        return NULL;
    }
    memcpy(g->ranks, ranks, sizeof *ranks * (size_t)size);
    for (int i = 0; i < size; i++) atomic_init(&g->slots[i].arrived, UINT32_MAX);
    g->world = w;
    g->hidden = hidden;
    g->pub = (coll_group){&shm_ops, size, g};
    /* A group made after an abort is aborted too, until the reset. */
    rt_wait_word_init(&g->bar.word, atomic_load(&w->aborted) ? ABORT_BIT : 0);
    atomic_init(&g->bar.count, 0);
    g->next = w->groups;
    w->groups = g;
    return g;
}

coll_group *coll_shm_world_group(coll_world *w, int size, const int *ranks)
{
    if (!w || !valid_ranks(w, size, ranks)) return NULL;
    pthread_mutex_lock(&w->mu);
    coll_shm_group *g = w->groups;
    while (g && !(!g->hidden && g->pub.size == size &&
                  memcmp(g->ranks, ranks, sizeof *ranks * (size_t)size) == 0))
        g = g->next;
    if (!g) g = group_create(w, size, ranks, false);
    pthread_mutex_unlock(&w->mu);
    return g ? &g->pub : NULL;
}

coll_group *coll_world_group(coll_world *w, int size, const int *world_ranks)
{
    if (w && w->ext) return w->ext->group(w->ext_state, size, world_ranks);
    return coll_shm_world_group(w, size, world_ranks);
}

spmd_status coll_world_connect(coll_world *w)
{
    if (!w) return base_error(SPMD_ERR_INVALID, "collectives: connect a NULL world");
    return w->ext ? w->ext->connect(w->ext_state) : SPMD_OK;
}

spmd_status coll_world_gather_processes(coll_world *w, const void *in, void *out,
                                        const int64_t *bytes_of)
{
    if (!w) return base_error(SPMD_ERR_INVALID, "collectives: gather over a NULL world");
    if (w->ext) return w->ext->gather(w->ext_state, in, out, bytes_of);
    if (bytes_of[0]) memcpy(out, in, (size_t)bytes_of[0]);
    return SPMD_OK;
}

void coll_world_local(const coll_world *w, int *first, int *count, int *size)
{
    if (first) *first = w->ext ? w->ext->first : 0;
    if (count) *count = w->ext ? w->ext->count : w->n;
    if (size) *size = w->ext ? w->ext->size : w->n;
}

void coll_world_abort(coll_world *w, const char *message)
{
    pthread_mutex_lock(&w->mu);
    abort_locked(w, message);
    pthread_mutex_unlock(&w->mu);
    if (w->ext) w->ext->abort(w->ext_state, message ? message : "(no reason given)");
}

bool coll_world_aborted(const coll_world *w) { return atomic_load(&w->aborted); }

void coll_world_reset(coll_world *w)
{
    pthread_mutex_lock(&w->mu);
    /* Every device is idle, so members that failed mid-barrier left their
     * arrivals behind: forget them. */
    for (coll_shm_group *g = w->groups; g; g = g->next) {
        atomic_store(&g->bar.count, 0);
        atomic_fetch_and(&g->bar.word.value, GEN_MASK);
        /* The aborted barrier never opened, so its generation comes again. */
        for (int i = 0; i < g->pub.size; i++) atomic_store(&g->slots[i].arrived, UINT32_MAX);
    }
    for (int i = 0; i < w->n; i++) set_waiting(w, i, 0, -1);
    w->message[0] = '\0';
    atomic_store(&w->aborted, false);
    pthread_mutex_unlock(&w->mu);
}

/* ---- What other transports use (collectives_impl.h) ----------------------------- */

void coll_shm_world_extend(coll_world *w, const coll_world_ext *ext, void *state)
{
    w->ext = ext;
    w->ext_state = state;
}

spmd_status coll_shm_aborted_error(coll_world *w) { return aborted_error(w); }

coll_shm_group *coll_shm_group_private(coll_world *w, int size, const int *ranks)
{
    if (!valid_ranks(w, size, ranks)) return NULL;
    pthread_mutex_lock(&w->mu);
    coll_shm_group *g = group_create(w, size, ranks, true);
    pthread_mutex_unlock(&w->mu);
    return g;
}

spmd_status coll_shm_enter(coll_shm_group *g, int member, const coll_call *call)
{
    return enter_call(g, member, call);
}

void coll_shm_sync(coll_shm_group *g, int member) { barrier_wait(g, member, false); }

const void *coll_shm_in(const coll_shm_group *g, int member) { return g->slots[member].call.in; }

void *coll_shm_out(const coll_shm_group *g, int member) { return g->slots[member].call.out; }
