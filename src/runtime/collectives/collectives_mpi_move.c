/*
 * The collectives over MPI that move data without summing it
 * (collectives_mpi_impl.h): all-gather, all-to-all, broadcast, permute.
 * Data goes straight from a member's buffer to its destinations; strided
 * blocks are packed or unpacked in the leader's staging.
 */
#ifdef SPMD_HAVE_MPI

#include "runtime/collectives/collectives_mpi_impl.h"

#include "base/error.h"

/* ---- All-gather --------------------------------------------------------------------- */

/* Copy member j's rows ([outer, inner] bytes at `from`) into its column
 * block of `out` ([outer, n * inner]). */
static void place_block(const mpi_group *g, unsigned char *out, const unsigned char *from, int j,
                        int64_t outer, int64_t inner)
{
    size_t row = (size_t)(inner * g->n);
    for (int64_t r = 0; r < outer; r++)
        copy(out + row * (size_t)r + (size_t)(inner * j), from + (size_t)(inner * r),
             (size_t)inner);
}

spmd_status coll_mpi_all_gather(coll_group *pub, int member, const void *in, void *out,
                                int64_t outer, int64_t inner_bytes)
{
    mpi_group *g = pub->impl;
    int l = coll_mpi_local_index(g, member, COLL_OP_ALL_GATHER);
    if (l < 0) return base_error_status();
    if (outer < 0 || inner_bytes < 0 || (outer * inner_bytes > 0 && (!in || !out)))
        return base_error(SPMD_ERR_INVALID, "all_gather: [%lld, %lld bytes]", (long long)outer,
                          (long long)inner_bytes);
    spmd_status st = coll_mpi_usable(g);
    if (st) return st;
    int64_t block = outer * inner_bytes;
    spmd_status prepared = SPMD_OK;
    if (l == 0 && outer > 1 && !coll_mpi_stage(g, (size_t)block * (size_t)(g->n - g->k)))
        prepared = base_error_status();
    coll_call call = {.op = COLL_OP_ALL_GATHER, .in = in, .out = out, .a = outer, .b = inner_bytes};
    st = coll_mpi_enter(g, l, call, prepared);
    if (st) return st;
    unsigned char *o = out, *stage = g->stage;
    if (l == 0) {
        /* Remote blocks straight into place when they are contiguous. */
        for (int j = 0; j < g->n; j++)
            if (g->local_of[j] < 0)
                coll_mpi_recv(g, outer == 1 ? o + inner_bytes * j : stage + block * g->remote_of[j],
                              block, g->proc_of[j]);
        for (int i = 0; i < g->k; i++)
            for (int c = 0; c < g->q; c++)
                if (c != g->me) coll_mpi_send(g, coll_shm_in(g->shm, i), block, c);
    }
    /* Local blocks, while the messages travel.  `in` may be this member's
     * own block of `out` (outer == 1). */
    for (int i = 0; i < g->k; i++)
        place_block(g, o, coll_shm_in(g->shm, i), g->local[i], outer, inner_bytes);
    if (l == 0) {
        st = coll_mpi_wait(g);
        if (!st && outer > 1)
            for (int j = 0; j < g->n; j++)
                if (g->local_of[j] < 0)
                    place_block(g, o, stage + block * g->remote_of[j], j, outer, inner_bytes);
    }
    st = coll_mpi_exchanged(g, l, st);
    if (!st && l != 0) {
        const unsigned char *lead = coll_shm_out(g->shm, 0);
        size_t row = (size_t)(inner_bytes * g->n);
        for (int64_t r = 0; r < outer; r++)
            for (int j = 0; j < g->n; j++)
                if (g->local_of[j] < 0)
                    copy(o + row * (size_t)r + (size_t)(inner_bytes * j),
                         lead + row * (size_t)r + (size_t)(inner_bytes * j), (size_t)inner_bytes);
    }
    coll_shm_sync(g->shm, l);
    return st;
}

/* ---- All-to-all, broadcast, permute --------------------------------------------------- */

/* Every message goes straight from a member's buffer to a member's buffer:
 * between two processes they are posted in the order (sending member,
 * receiving member) on both sides, so they match. */
spmd_status coll_mpi_all_to_all(coll_group *pub, int member, const void *in, void *out,
                                int64_t bytes)
{
    mpi_group *g = pub->impl;
    int l = coll_mpi_local_index(g, member, COLL_OP_ALL_TO_ALL);
    if (l < 0) return base_error_status();
    if (bytes < 0 || (bytes > 0 && (!in || !out)))
        return base_error(SPMD_ERR_INVALID, "all_to_all: blocks of %lld bytes", (long long)bytes);
    if (in == out && bytes > 0)
        return base_error(SPMD_ERR_INVALID, "all_to_all: out must not be in");
    spmd_status st = coll_mpi_usable(g);
    if (st) return st;
    coll_call call = {.op = COLL_OP_ALL_TO_ALL, .in = in, .out = out, .a = bytes};
    st = coll_mpi_enter(g, l, call, SPMD_OK);
    if (st) return st;
    if (l == 0) {
        for (int i = 0; i < g->n; i++)
            if (g->local_of[i] < 0)
                for (int jl = 0; jl < g->k; jl++)
                    coll_mpi_recv(g, (unsigned char *)coll_shm_out(g->shm, jl) + bytes * i, bytes,
                                  g->proc_of[i]);
        for (int il = 0; il < g->k; il++)
            for (int j = 0; j < g->n; j++)
                if (g->local_of[j] < 0)
                    coll_mpi_send(g, (const unsigned char *)coll_shm_in(g->shm, il) + bytes * j,
                                  bytes, g->proc_of[j]);
    }
    for (int il = 0; il < g->k; il++)
        copy((unsigned char *)out + bytes * g->local[il],
             (const unsigned char *)coll_shm_in(g->shm, il) + bytes * member, (size_t)bytes);
    /* The leader writes into its peers' outputs: they leave after it. */
    return coll_mpi_exchanged(g, l, l == 0 ? coll_mpi_wait(g) : SPMD_OK);
}

/* A binomial tree over the group's processes, rooted at the root's
 * process; inside each process the members copy from the root or the
 * leader. */
static spmd_status broadcast_exchange(mpi_group *g, int root, int64_t bytes)
{
    int q = g->q, rp = g->proc_of[root];
    int v = (g->me - rp + q) % q;
    void *source = coll_shm_out(g->shm, rp == g->me ? g->local_of[root] : 0);
    int mask = 1;
    for (; mask < q; mask <<= 1)
        if (v & mask) {
            coll_mpi_recv(g, source, bytes, (v - mask + rp) % q);
            spmd_status st = coll_mpi_wait(g);
            if (st) return st;
            break;
        }
    for (mask >>= 1; mask > 0; mask >>= 1)
        if (v + mask < q) coll_mpi_send(g, source, bytes, (v + mask + rp) % q);
    return coll_mpi_wait(g);
}

spmd_status coll_mpi_broadcast(coll_group *pub, int member, void *buf, int64_t bytes, int root)
{
    mpi_group *g = pub->impl;
    int l = coll_mpi_local_index(g, member, COLL_OP_BROADCAST);
    if (l < 0) return base_error_status();
    if (root < 0 || root >= g->n)
        return base_error(SPMD_ERR_INVALID, "broadcast: root %d of a group of %d", root, g->n);
    if (bytes < 0 || (bytes > 0 && !buf))
        return base_error(SPMD_ERR_INVALID, "broadcast: %lld bytes", (long long)bytes);
    spmd_status st = coll_mpi_usable(g);
    if (st) return st;
    coll_call call = {.op = COLL_OP_BROADCAST, .in = buf, .out = buf, .a = bytes, .root = root};
    st = coll_mpi_enter(g, l, call, SPMD_OK);
    if (st) return st;
    st = coll_mpi_exchanged(g, l, l == 0 ? broadcast_exchange(g, root, bytes) : SPMD_OK);
    int source = g->proc_of[root] == g->me ? g->local_of[root] : 0;
    if (!st && l != source) copy(buf, coll_shm_out(g->shm, source), (size_t)bytes);
    coll_shm_sync(g->shm, l);
    return st;
}

spmd_status coll_mpi_permute(coll_group *pub, int member, const void *in, void *out,
                             int64_t bytes, const int *src)
{
    mpi_group *g = pub->impl;
    int l = coll_mpi_local_index(g, member, COLL_OP_PERMUTE);
    if (l < 0) return base_error_status();
    if (!src || bytes < 0 || (bytes > 0 && (!in || !out)))
        return base_error(SPMD_ERR_INVALID, "permute: %lld bytes, source table %p",
                          (long long)bytes, (const void *)src);
    for (int i = 0; i < g->n; i++)
        if (src[i] >= g->n)
            return base_error(SPMD_ERR_INVALID, "permute: member %d reads member %d of %d", i,
                              src[i], g->n);
    spmd_status st = coll_mpi_usable(g);
    if (st) return st;
    coll_call call = {.op = COLL_OP_PERMUTE, .in = in, .out = out, .a = bytes, .src = src};
    st = coll_mpi_enter(g, l, call, SPMD_OK);
    if (st) return st;
    if (l == 0) {
        for (int jl = 0; jl < g->k; jl++) {
            int s = src[g->local[jl]];
            if (s >= 0 && g->local_of[s] < 0)
                coll_mpi_recv(g, coll_shm_out(g->shm, jl), bytes, g->proc_of[s]);
        }
        for (int i = 0; i < g->n; i++)
            if (g->local_of[i] < 0 && src[i] >= 0 && g->local_of[src[i]] >= 0)
                coll_mpi_send(g, coll_shm_in(g->shm, g->local_of[src[i]]), bytes, g->proc_of[i]);
    }
    if (src[member] >= 0 && g->local_of[src[member]] >= 0)
        copy(out, coll_shm_in(g->shm, g->local_of[src[member]]), (size_t)bytes);
    return coll_mpi_exchanged(g, l, l == 0 ? coll_mpi_wait(g) : SPMD_OK);
}

#endif
