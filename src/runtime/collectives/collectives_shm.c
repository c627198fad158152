/*
 * The shared-memory collectives (collectives_shm_impl.h): a member
 * publishes its call in its slot and meets its peers at the entry
 * barrier, then reads their buffers directly; sums follow the canonical
 * tree (collectives_tree.c).
 */
#include "runtime/collectives/collectives_shm_impl.h"

#include "base/error.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

/* All-reduce chunks start at multiples of 64 bytes, so that two members
 * never write the same cache line of an aligned buffer. */
enum { CHUNK_BYTES = 64 };

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

/* ---- Entry and exit ---------------------------------------------------------- */

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
spmd_status coll_shm_enter(coll_shm_group *g, int member, const coll_call *call)
{
    delay();
    coll_slot *s = &g->slots[member];
    s->call = *call;
    atomic_store_explicit(&s->op, (int)call->op, memory_order_relaxed);
    atomic_store_explicit(&s->type, (int)call->type, memory_order_relaxed);
    bar_result r = coll_shm_barrier_wait(g, member, true);
    if (r == BAR_TIMEOUT) return SPMD_ERR_TIMEOUT;
    if (r == BAR_ABORTED) return coll_shm_aborted_error(g->world);
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
            coll_shm_sync(g, member);
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
    return coll_shm_enter(g, member, &call);
}

/* After the last read of a peer's buffer: nobody returns (and lets its
 * caller reuse the buffer) until every peer is done with it. */
static void leave(coll_shm_group *g, int member) { coll_shm_sync(g, member); }

/* A group of one has nobody to wait for, but still fails after an abort. */
static spmd_status alone(coll_shm_group *g)
{
    if (atomic_load(&g->world->aborted)) return coll_shm_aborted_error(g->world);
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
    coll_shm_sync(g, member);
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

const coll_ops coll_shm_ops = {
    .all_reduce = shm_all_reduce,
    .all_gather = shm_all_gather,
    .reduce_scatter = shm_reduce_scatter,
    .all_to_all = shm_all_to_all,
    .broadcast = shm_broadcast,
    .permute = shm_permute,
};

/* ---- What the MPI transport reads (collectives_impl.h) --------------------------- */

const void *coll_shm_in(const coll_shm_group *g, int member) { return g->slots[member].call.in; }

void *coll_shm_out(const coll_shm_group *g, int member) { return g->slots[member].call.out; }
