/*
 * All-reduce and reduce-scatter over MPI (collectives_mpi_impl.h), for
 * every element type: the sums follow the canonical tree, evaluated over
 * units, so they give the shared-memory transport's bits.
 *
 * Values travel in the call's element type where that keeps the bits and
 * in f32 where it must: a unit of one member sends its values, a unit of
 * several its f32 partial sum (which a narrower type could not carry
 * without changing the result).  The owner of an element evaluates the
 * tree over them and stores the sum in the type, rounded once.  f32 is
 * the sums' own type, so an f32 all-reduce sums a unit in place, into its
 * first member's buffer; other types sum it into staging.
 */
#ifdef SPMD_HAVE_MPI

#include "runtime/collectives/collectives_mpi_impl.h"

#include "base/error.h"

enum {
    /* An all-reduce takes one round, every process getting every unit
     * whole and summing all of it, while each process receives at most
     * this many values that way (count times the other processes): there
     * latency rules, and with two processes both ways move the same bytes. */
    SMALL_ALL_REDUCE = 65536,
    /* Chunks start at multiples of 16 elements (64 bytes of f32, where
     * local members write their units' sums). */
    CHUNK_ELEMS = 16,
};

/* Elements [lo, hi) of `count` that part i of n holds. */
static void chunk_of(int64_t count, int n, int i, int64_t *lo, int64_t *hi)
{
    int64_t units = (count + CHUNK_ELEMS - 1) / CHUNK_ELEMS;
    int64_t a = (units / n * i + units % n * i / n) * CHUNK_ELEMS;
    int64_t b = (units / n * (i + 1) + units % n * (i + 1) / n) * CHUNK_ELEMS;
    *lo = a < count ? a : count;
    *hi = b < count ? b : count;
}

static bool single(const mpi_unit *u) { return u->hi - u->lo == 1; }

/* What unit u sends: its member's values, or its f32 sum. */
static coll_dtype wire_type(const mpi_group *g, int u, coll_dtype type)
{
    return single(&g->units[u]) ? type : COLL_F32;
}

/* Sum this process's units of several members in f32, elements [from, to)
 * of each, from its members' inputs (of `type`, viewed flat) into `sums`
 * (unit u at sums + inner[u] * stride) or, without sums, in place into the
 * unit's first member's buffer (f32). */
static void sum_local_units(mpi_group *g, int l, coll_dtype type, float *sums, int64_t stride,
                            int64_t from, int64_t to)
{
    coll_term *t = g->terms + (size_t)l * (size_t)g->n;
    for (int u = 0; u < g->n_units; u++) {
        const mpi_unit *un = &g->units[u];
        if (g->inner[u] < 0) continue;
        for (int m = un->lo; m < un->hi; m++)
            t[m] = (coll_term){in_of(g, g->local_of[m]), type, 0, m + 1};
        float *out = sums ? sums + stride * g->inner[u] : out_of(g, g->local_of[un->lo]);
        coll_tree_sum(t, un->lo, un->hi, 0, from, out + from, COLL_F32, to - from);
    }
}

/* ---- All-reduce ------------------------------------------------------------------- */

static bool one_round(const mpi_group *g, int64_t count)
{
    return count * (g->q - 1) <= SMALL_ALL_REDUCE;
}

/* Staging of an all-reduce: the sums of this process's units of several
 * members (count each; none for f32, summed in place), then room for f32
 * for each remote unit's part of this process's chunk. */
static float *all_reduce_sums(const mpi_group *g, coll_dtype type)
{
    return type == COLL_F32 ? NULL : g->stage;
}

static size_t all_reduce_stage_floats(const mpi_group *g, coll_dtype type, int64_t count,
                                      int64_t chunk)
{
    return (type == COLL_F32 ? 0 : (size_t)count * (size_t)g->n_inner_units) +
           (size_t)chunk * (size_t)g->n_remote_units;
}

/* Local unit u's values from element `at`. */
static coll_term all_reduce_term(const mpi_group *g, int u, coll_dtype type, const float *sums,
                                 int64_t count, int64_t at)
{
    const mpi_unit *un = &g->units[u];
    if (single(un) || !sums)
        return (coll_term){coll_elem(in_of(g, g->local_of[un->lo]), type, at), type, 0, un->hi};
    return (coll_term){sums + count * g->inner[u] + at, COLL_F32, 0, un->hi};
}

/* The leader's exchange.  Each process owns a chunk: it receives every
 * other process's units for it, evaluates the tree there, into the
 * leader's buffer, and sends the result to every process.  Small buffers
 * take one round instead: every process gets every unit whole and
 * evaluates all of it. */
static spmd_status all_reduce_exchange(mpi_group *g, coll_dtype type, void *buf, int64_t count)
{
    bool whole = one_round(g, count);
    int64_t lo = 0, hi = count;
    if (!whole) chunk_of(count, g->q, g->me, &lo, &hi);
    int64_t len = hi - lo, es = (int64_t)coll_dtype_size(type);
    float *sums = all_reduce_sums(g, type);
    float *remote = (float *)g->stage + (sums ? count * g->n_inner_units : 0);
    coll_term *t = g->terms; /* the leader's row */
    for (int u = 0; u < g->n_units; u++) {
        const mpi_unit *un = &g->units[u];
        if (local_unit(g, un)) {
            t[un->lo] = all_reduce_term(g, u, type, sums, count, lo);
            continue;
        }
        float *at = remote + len * g->slot[u];
        coll_dtype wire = wire_type(g, u, type);
        t[un->lo] = (coll_term){at, wire, 0, un->hi};
        coll_mpi_recv(g, at, (int64_t)coll_dtype_size(wire) * len, un->proc);
    }
    for (int c = 0; c < g->q; c++) {
        if (c == g->me) continue;
        int64_t clo = 0, chi = count;
        if (!whole) chunk_of(count, g->q, c, &clo, &chi);
        for (int u = 0; u < g->n_units; u++) {
            if (!local_unit(g, &g->units[u])) continue;
            coll_term v = all_reduce_term(g, u, type, sums, count, clo);
            coll_mpi_send(g, v.base, (int64_t)coll_dtype_size(v.type) * (chi - clo), c);
        }
    }
    spmd_status st = coll_mpi_wait(g);
    if (st) return st;
    coll_tree_sum(t, 0, g->n, 0, 0, coll_elem(buf, type, lo), type, len);
    if (whole) return SPMD_OK;
    for (int c = 0; c < g->q; c++) {
        if (c == g->me) continue;
        int64_t clo, chi;
        chunk_of(count, g->q, c, &clo, &chi);
        coll_mpi_recv(g, coll_elem(buf, type, clo), es * (chi - clo), c);
        coll_mpi_send(g, coll_elem(buf, type, lo), es * len, c);
    }
    return coll_mpi_wait(g);
}

spmd_status coll_mpi_all_reduce(coll_group *pub, int member, void *buf, int64_t count,
                                coll_dtype type)
{
    mpi_group *g = pub->impl;
    int l = coll_mpi_local_index(g, member, COLL_OP_ALL_REDUCE);
    if (l < 0) return base_error_status();
    if (!coll_dtype_valid(type))
        return base_error(SPMD_ERR_INVALID, "all_reduce: element type %d", (int)type);
    if (count < 0 || (count > 0 && !buf))
        return base_error(SPMD_ERR_INVALID, "all_reduce: %lld %s values at %p", (long long)count,
                          coll_dtype_name(type), buf);
    spmd_status st = coll_mpi_usable(g);
    if (st) return st;
    spmd_status prepared = SPMD_OK;
    if (l == 0) {
        int64_t lo = 0, hi = count;
        if (!one_round(g, count)) chunk_of(count, g->q, g->me, &lo, &hi);
        if (!coll_mpi_stage(g, sizeof(float) * all_reduce_stage_floats(g, type, count, hi - lo)))
            prepared = base_error_status();
    }
    coll_call call = {.op = COLL_OP_ALL_REDUCE, .type = type, .in = buf, .out = buf, .a = count};
    st = coll_mpi_enter(g, l, call, prepared);
    if (st) return st;
    if (g->n_inner_units) {
        /* In place for f32: a unit's members are read by that unit's sum
         * only, and they all get the result in the end. */
        int64_t from, to;
        chunk_of(count, g->k, l, &from, &to);
        sum_local_units(g, l, type, all_reduce_sums(g, type), count, from, to);
        coll_shm_sync(g->shm, l);
    }
    st = coll_mpi_exchanged(g, l, l == 0 ? all_reduce_exchange(g, type, buf, count) : SPMD_OK);
    if (!st && l != 0) copy(buf, in_of(g, 0), coll_dtype_size(type) * (size_t)count);
    coll_shm_sync(g->shm, l);
    return st;
}

/* ---- Reduce-scatter ------------------------------------------------------------------ */

/* Staging of a reduce-scatter of [outer, n * inner], in floats, so each
 * region has room for f32 values (a unit of one member of a narrower type
 * uses part of its block): this process's unit sums (each [outer, n *
 * inner]), what it receives (for each local member, each remote unit's
 * [outer, inner]), and with outer > 1 what it sends, packed (for each
 * remote member, each local unit's [outer, inner]). */
typedef struct rs_stage {
    float *sums, *recv, *pack;
    int64_t block; /* outer * inner */
} rs_stage;

static rs_stage rs_layout(const mpi_group *g, float *stage, int64_t outer, int64_t inner,
                          size_t *floats)
{
    rs_stage s;
    s.block = outer * inner;
    size_t sums = (size_t)g->n_inner_units * (size_t)(outer * inner * g->n);
    size_t recv = (size_t)g->k * (size_t)g->n_remote_units * (size_t)s.block;
    size_t pack = outer > 1 ? (size_t)(g->n - g->k) * (size_t)g->n_local_units * (size_t)s.block
                            : 0;
    s.sums = stage;
    s.recv = stage ? stage + sums : NULL;
    s.pack = stage ? stage + sums + recv : NULL;
    if (floats) *floats = sums + recv + pack;
    return s;
}

/* Local unit u's [outer, n * inner] values from column `col`: its
 * member's input, or its f32 sum. */
static coll_term rs_term(const mpi_group *g, const rs_stage *s, int u, coll_dtype type,
                         int64_t outer, int64_t inner, int64_t col)
{
    const mpi_unit *un = &g->units[u];
    int64_t width = inner * g->n;
    if (g->inner[u] < 0)
        return (coll_term){coll_elem(in_of(g, g->local_of[un->lo]), type, col), type, width,
                           un->hi};
    return (coll_term){s->sums + outer * width * g->inner[u] + col, COLL_F32, width, un->hi};
}

/* Remote unit u's [outer, inner] block for local member jl, as received. */
static float *rs_received(const mpi_group *g, const rs_stage *s, int u, int jl)
{
    return s->recv + s->block * (g->n_remote_units * jl + g->slot[u]);
}

/* Local unit u's [outer, inner] block for remote member j, packed. */
static float *rs_packed(const mpi_group *g, const rs_stage *s, int u, int j)
{
    return s->pack + s->block * (g->n_local_units * g->remote_of[j] + g->slot[u]);
}

static spmd_status reduce_scatter_exchange(mpi_group *g, coll_dtype type, int64_t outer,
                                           int64_t inner)
{
    rs_stage s = rs_layout(g, g->stage, outer, inner, NULL);
    for (int jl = 0; jl < g->k; jl++)
        for (int u = 0; u < g->n_units; u++)
            if (!local_unit(g, &g->units[u]))
                coll_mpi_recv(g, rs_received(g, &s, u, jl),
                              (int64_t)coll_dtype_size(wire_type(g, u, type)) * s.block,
                              g->units[u].proc);
    for (int j = 0; j < g->n; j++) {
        if (g->local_of[j] >= 0) continue;
        for (int u = 0; u < g->n_units; u++) {
            if (!local_unit(g, &g->units[u])) continue;
            coll_term v = rs_term(g, &s, u, type, outer, inner, inner * j);
            size_t es = coll_dtype_size(v.type);
            const unsigned char *from = v.base;
            if (outer > 1) {
                unsigned char *pack = (unsigned char *)rs_packed(g, &s, u, j);
                for (int64_t r = 0; r < outer; r++)
                    memcpy(pack + es * (size_t)(inner * r), from + es * (size_t)(v.stride * r),
                           es * (size_t)inner);
                from = pack;
            }
            coll_mpi_send(g, from, (int64_t)es * s.block, g->proc_of[j]);
        }
    }
    return coll_mpi_wait(g);
}

spmd_status coll_mpi_reduce_scatter(coll_group *pub, int member, const void *in, void *out,
                                    int64_t outer, int64_t inner, coll_dtype type)
{
    mpi_group *g = pub->impl;
    int l = coll_mpi_local_index(g, member, COLL_OP_REDUCE_SCATTER);
    if (l < 0) return base_error_status();
    if (!coll_dtype_valid(type))
        return base_error(SPMD_ERR_INVALID, "reduce_scatter: element type %d", (int)type);
    if (outer < 0 || inner < 0 || (outer * inner > 0 && (!in || !out)))
        return base_error(SPMD_ERR_INVALID, "reduce_scatter: [%lld, %lld %s values]",
                          (long long)outer, (long long)inner, coll_dtype_name(type));
    spmd_status st = coll_mpi_usable(g);
    if (st) return st;
    spmd_status prepared = SPMD_OK;
    if (l == 0) {
        size_t floats;
        rs_layout(g, NULL, outer, inner, &floats);
        if (!coll_mpi_stage(g, sizeof(float) * floats)) prepared = base_error_status();
    }
    coll_call call = {.op = COLL_OP_REDUCE_SCATTER, .type = type, .in = in, .out = out,
                      .a = outer, .b = inner};
    st = coll_mpi_enter(g, l, call, prepared);
    if (st) return st;
    rs_stage s = rs_layout(g, g->stage, outer, inner, NULL);
    if (g->n_inner_units) {
        int64_t from, to;
        chunk_of(outer * inner * g->n, g->k, l, &from, &to);
        sum_local_units(g, l, type, s.sums, outer * inner * g->n, from, to);
        coll_shm_sync(g->shm, l);
    }
    st = coll_mpi_exchanged(g, l,
                            l == 0 ? reduce_scatter_exchange(g, type, outer, inner) : SPMD_OK);
    if (!st) {
        /* Each member sums its own block over the units.  `out` may be that
         * block of `in` (outer == 1): nothing else reads it any more. */
        coll_term *t = g->terms + (size_t)l * (size_t)g->n;
        for (int u = 0; u < g->n_units; u++) {
            const mpi_unit *un = &g->units[u];
            if (local_unit(g, un))
                t[un->lo] = rs_term(g, &s, u, type, outer, inner, inner * member);
            else
                t[un->lo] = (coll_term){rs_received(g, &s, u, l), wire_type(g, u, type), inner,
                                        un->hi};
        }
        for (int64_t r = 0; r < outer; r++)
            coll_tree_sum(t, 0, g->n, r, 0, coll_elem(out, type, inner * r), type, inner);
    }
    coll_shm_sync(g->shm, l);
    return st;
}

#endif
