/*
 * The shared-memory world and its groups (collectives_shm_impl.h), and
 * the world's calls for every transport: a world extended with devices in
 * other processes (coll_world_ext) hands groups, connect, gathers and
 * aborts to its extension as well.
 */
#include "runtime/collectives/collectives_shm_impl.h"

#include "base/arena.h"
#include "base/error.h"

#include <stdio.h>
#include <string.h>

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
    atomic_init(&w->rank_visits, 0);
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
    base_free(&w->alloc, w->index);
    pthread_mutex_destroy(&w->mu);
    rt_wait_destroy(&w->wait);
    base_free(&w->alloc, w->waiting);
    base_free(&w->alloc, w);
}

/* The ranks of a group, checked in one pass: each in the world, none
 * twice (a bit per world rank, so the check is linear in the group and
 * the world, where comparing each rank with those before it took minutes
 * for the 4096 devices' world groups of a 4096-device mesh). */
static bool valid_ranks(coll_world *w, int size, const int *ranks)
{
    if (size < 1 || size > w->n || !ranks) {
        base_error(SPMD_ERR_INVALID, "collectives: a group of %d in a world of %d", size, w->n);
        return false;
    }
    uint64_t seen[(COLL_MAX_MEMBERS + 63) / 64] = {0};
    atomic_fetch_add_explicit(&w->rank_visits, (uint64_t)size, memory_order_relaxed);
    for (int i = 0; i < size; i++) {
        int r = ranks[i];
        if (r < 0 || r >= w->n) {
            base_error(SPMD_ERR_INVALID, "collectives: rank %d in a world of %d", r, w->n);
            return false;
        }
        uint64_t bit = UINT64_C(1) << (r % 64);
        if (seen[r / 64] & bit) {
            base_error(SPMD_ERR_INVALID, "collectives: rank %d twice in a group", r);
            return false;
        }
        seen[r / 64] |= bit;
    }
    return true;
}

/* A hash of a group's ranks in order (FNV-1a over the 32-bit values,
 * then mixed): the key of the world's index. */
static uint64_t ranks_key(int size, const int *ranks)
{
    uint64_t h = 0xcbf29ce484222325u ^ (uint64_t)(uint32_t)size;
    for (int i = 0; i < size; i++) h = (h ^ (uint32_t)ranks[i]) * 0x100000001b3u;
    h ^= h >> 33;
    return h * 0xff51afd7ed558ccdu;
}

/* Under w->mu: the looked-up group of these ranks, or NULL. */
static coll_shm_group *index_find(coll_world *w, uint64_t key, int size, const int *ranks)
{
    if (!w->index_size) return NULL;
    unsigned mask = (unsigned)w->index_size - 1;
    for (unsigned at = (unsigned)key & mask;; at = (at + 1) & mask) {
        coll_shm_group *g = w->index[at];
        atomic_fetch_add_explicit(&w->rank_visits, 1, memory_order_relaxed);
        if (!g) return NULL;
        if (g->key != key || g->pub.size != size) continue;
        atomic_fetch_add_explicit(&w->rank_visits, (uint64_t)size, memory_order_relaxed);
        if (memcmp(g->ranks, ranks, sizeof *ranks * (size_t)size) == 0) return g;
    }
}

/* Under w->mu: index g, growing the index to stay at most half full. */
static bool index_add(coll_world *w, coll_shm_group *g)
{
    if (2 * (w->indexed + 1) > w->index_size) {
        int size = w->index_size ? 2 * w->index_size : 64;
        coll_shm_group **grown = base_calloc(&w->alloc, sizeof *grown * (size_t)size, "collective groups");
        if (!grown) return false;
        for (int i = 0; i < w->index_size; i++) {
            coll_shm_group *old = w->index[i];
            if (!old) continue;
            unsigned at = (unsigned)old->key & (unsigned)(size - 1);
            while (grown[at]) at = (at + 1) & (unsigned)(size - 1);
            grown[at] = old;
        }
        base_free(&w->alloc, w->index);
        w->index = grown;
        w->index_size = size;
    }
    unsigned mask = (unsigned)w->index_size - 1, at = (unsigned)g->key & mask;
    while (w->index[at]) at = (at + 1) & mask;
    w->index[at] = g;
    w->indexed++;
    return true;
}

/* Under w->mu: a group of these ranks, indexed by `key` unless hidden. */
static coll_shm_group *group_create(coll_world *w, int size, const int *ranks, bool hidden,
                                    uint64_t key)
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
    g->pub = (coll_group){&coll_shm_ops, size, g};
    /* A group made after an abort is aborted too, until the reset. */
    rt_wait_word_init(&g->bar.word, atomic_load(&w->aborted) ? ABORT_BIT : 0);
    atomic_init(&g->bar.count, 0);
    if (!hidden) {
        g->key = key;
        if (!index_add(w, g)) {
            group_free(w, g);
            return NULL;
        }
    }
    g->next = w->groups;
    w->groups = g;
    return g;
}

coll_group *coll_shm_world_group(coll_world *w, int size, const int *ranks)
{
    if (!w || !valid_ranks(w, size, ranks)) return NULL;
    uint64_t key = ranks_key(size, ranks);
    atomic_fetch_add_explicit(&w->rank_visits, (uint64_t)size, memory_order_relaxed);
    pthread_mutex_lock(&w->mu);
    coll_shm_group *g = index_find(w, key, size, ranks);
    if (!g) g = group_create(w, size, ranks, false, key);
    pthread_mutex_unlock(&w->mu);
    return g ? &g->pub : NULL;
}

uint64_t coll_world_rank_visits(const coll_world *w) { return atomic_load(&w->rank_visits); }

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
    coll_shm_abort_locked(w, message);
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
    for (int i = 0; i < w->n; i++) coll_shm_waiting(w, i, 0, -1);
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

coll_shm_group *coll_shm_group_private(coll_world *w, int size, const int *ranks)
{
    if (!valid_ranks(w, size, ranks)) return NULL;
    pthread_mutex_lock(&w->mu);
    coll_shm_group *g = group_create(w, size, ranks, true, 0);
    pthread_mutex_unlock(&w->mu);
    return g;
}

spmd_status coll_shm_aborted_error(coll_world *w)
{
    char msg[ABORT_MESSAGE];
    pthread_mutex_lock(&w->mu);
    memcpy(msg, w->message, sizeof msg);
    pthread_mutex_unlock(&w->mu);
    return base_error(SPMD_ERR_BACKEND, "collective aborted: %s", msg);
}
