/*
 * The MPI collectives under mpirun (test_collectives_mpi launches it):
 *
 *   mpirun -n P mpi_collectives_worker [--devices L] [--abort]
 *
 * P processes with L device threads each (world rank r in process r / L).
 * Every device runs every collective on every group it is in: the whole
 * world, rows and columns of each 2-D layout of the world, runs of 1 to 8
 * devices at several offsets and strides, and groups whose member order
 * is not rank order (reversed, interleaved across processes), with odd
 * counts, counts the group does not divide, in place and not.  Groups are
 * visited in one global order, so devices of different groups run their
 * collectives at the same time.  Every sum must be the bits of the
 * canonical tree over member ranks, computed here independently (the
 * shared-memory transport is held to the same reference in
 * test_collectives), every copy exact.
 *
 * --abort: process 0's devices enter an all-reduce (small and large) over
 * groups across processes that no device of the other processes ever
 * joins; coll_world_abort from another thread must end their waits with
 * the abort's message within 2 seconds, later calls must fail at once,
 * also after coll_world_reset, while groups inside the process work again.
 * Also: processes that disagree about a group fail connect alike.
 *
 * --stall, --slow: the watchdog (see test_stall and test_slow below): a
 * process that never joins is named, with its host, within the limit; a
 * collective that takes longer than the limit in all but makes progress
 * is not ended.
 *
 * Rank 0 prints one line per failure and then PASS or FAIL; the exit
 * status is 0 only on PASS.
 */
#include "base/bf16.h"
#include "base/error.h"
#include "runtime/collectives/collectives.h"

#include "support_values.h"
#include <mpi.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { MAX_GROUPS = 512, MAX_MEMBERS = 64, MAX_DEVICES = 16 };

static int P, RANK, L, N;
static coll_world *W;
static _Atomic long checks, failures;

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...)
{
    if (atomic_fetch_add(&failures, 1) < 20) {
        va_list ap;
        va_start(ap, fmt);
        fprintf(stderr, "process %d: ", RANK);
        vfprintf(stderr, fmt, ap);
        fprintf(stderr, "\n");
        va_end(ap);
    }
}

/* ---- The reference -------------------------------------------------------- */

typedef struct grp {
    int size;
    int ranks[MAX_MEMBERS];
} grp;

/* The canonical tree: the left part holds the largest power of two of
 * members below the node's size. */
static float ref_tree(const grp *gr, int lo, int hi, int64_t i, int call)
{
    if (hi - lo == 1) return fval(gr->ranks[lo], i, call);
    int half = 1 << 30;
    while (half >= hi - lo) half >>= 1;
    return ref_tree(gr, lo, lo + half, i, call) + ref_tree(gr, lo + half, hi, i, call);
}

static float ref_sum(const grp *gr, int64_t i, int call)
{
    return ref_tree(gr, 0, gr->size, i, call);
}

static void *xmalloc(size_t bytes)
{
    void *p = calloc(bytes ? bytes : 1, 1);
    if (!p) abort();
    return p;
}

#define OK(st, what)                                                                         \
    do {                                                                                     \
        atomic_fetch_add(&checks, 1);                                                        \
        if ((st) != SPMD_OK) {                                                               \
            fail("%s on a group of %d: %s (%s)", (what), gr->size, spmd_status_name(st),      \
                 spmd_last_error());                                                         \
            return;                                                                          \
        }                                                                                    \
    } while (0)

/* ---- Each collective against its reference -------------------------------------------- */

static void check_all_reduce(coll_group *g, const grp *gr, int m, int64_t count, int call)
{
    float *buf = xmalloc(sizeof *buf * (size_t)count);
    for (int64_t i = 0; i < count; i++) buf[i] = fval(gr->ranks[m], i, call);
    spmd_status st = g->ops->all_reduce(g, m, buf, count, COLL_F32);
    OK(st, "all_reduce");
    for (int64_t i = 0; i < count; i++) {
        float want = ref_sum(gr, i, call);
        if (memcmp(&buf[i], &want, sizeof want) != 0) {
            fail("all_reduce n=%d count=%lld member %d: [%lld] = %a, want %a", gr->size,
                 (long long)count, m, (long long)i, buf[i], want);
            break;
        }
    }
    free(buf);
}

/* The bf16 reductions: each member's values rounded to bf16, the
 * canonical tree over their f32 widenings, the sum rounded once. */
static float ref_tree_bf16(const grp *gr, int lo, int hi, int64_t i, int call)
{
    if (hi - lo == 1) return bf16_round(fval(gr->ranks[lo], i, call));
    int half = 1 << 30;
    while (half >= hi - lo) half >>= 1;
    return ref_tree_bf16(gr, lo, lo + half, i, call) + ref_tree_bf16(gr, lo + half, hi, i, call);
}

static void check_all_reduce_bf16(coll_group *g, const grp *gr, int member, int64_t count,
                                  int call)
{
    uint16_t *buf = xmalloc(sizeof *buf * (size_t)count);
    for (int64_t i = 0; i < count; i++) buf[i] = bf16_from_f32(fval(gr->ranks[member], i, call));
    spmd_status st = g->ops->all_reduce(g, member, buf, count, COLL_BF16);
    OK(st, "all_reduce_bf16");
    for (int64_t i = 0; i < count && st == SPMD_OK; i++) {
        uint16_t want = bf16_from_f32(ref_tree_bf16(gr, 0, gr->size, i, call));
        if (buf[i] != want) {
            fail("all_reduce_bf16 n=%d count=%lld member %d: [%lld] = %#x, want %#x", gr->size, (long long)count, member, (long long)i, buf[i], want);
            break;
        }
    }
    free(buf);
}

static void check_reduce_scatter_bf16(coll_group *g, const grp *gr, int member,
                                      int64_t outer, int64_t inner, bool in_place, int call)
{
    int n = gr->size;
    uint16_t *in = xmalloc(sizeof *in * (size_t)(outer * n * inner));
    for (int64_t x = 0; x < outer * n * inner; x++)
        in[x] = bf16_from_f32(fval(gr->ranks[member], x, call));
    uint16_t *out = in_place ? in + inner * member : xmalloc(sizeof *out * (size_t)(outer * inner));
    spmd_status st = g->ops->reduce_scatter(g, member, in, out, outer, inner, COLL_BF16);
    OK(st, "reduce_scatter_bf16");
    for (int64_t r = 0; r < outer && st == SPMD_OK; r++)
        for (int64_t x = 0; x < inner; x++) {
            uint16_t want =
                bf16_from_f32(ref_tree_bf16(gr, 0, n, (r * n + member) * inner + x, call));
            if (out[r * inner + x] != want) {
                fail("reduce_scatter_bf16 n=%d [%lld, %lld] member %d: [%lld, %lld] = %#x, want %#x", n, (long long)outer, (long long)inner, member, (long long)r, (long long)x, out[r * inner + x], want);
                r = outer;
                break;
            }
        }
    if (!in_place) free(out);
    free(in);
}

static void check_reduce_scatter(coll_group *g, const grp *gr, int m, int64_t outer,
                                 int64_t inner, bool in_place, int call)
{
    int n = gr->size;
    float *in = xmalloc(sizeof *in * (size_t)(outer * n * inner));
    for (int64_t x = 0; x < outer * n * inner; x++) in[x] = fval(gr->ranks[m], x, call);
    float *out = in_place ? in + inner * m : xmalloc(sizeof *out * (size_t)(outer * inner));
    spmd_status st = g->ops->reduce_scatter(g, m, in, out, outer, inner, COLL_F32);
    OK(st, "reduce_scatter");
    for (int64_t r = 0; r < outer; r++)
        for (int64_t x = 0; x < inner; x++) {
            float want = ref_sum(gr, (r * n + m) * inner + x, call);
            if (memcmp(&out[r * inner + x], &want, sizeof want) != 0) {
                fail("reduce_scatter n=%d [%lld, %lld]%s member %d: [%lld, %lld] = %a, want %a",
                     n, (long long)outer, (long long)inner, in_place ? " in place" : "", m,
                     (long long)r, (long long)x, out[r * inner + x], want);
                r = outer;
                break;
            }
        }
    if (!in_place) free(out);
    free(in);
}

static void check_all_gather(coll_group *g, const grp *gr, int m, int64_t outer, int64_t inner,
                             bool in_place, int call)
{
    int n = gr->size;
    unsigned char *out = xmalloc((size_t)(outer * inner * n));
    memset(out, 0xEE, (size_t)(outer * inner * n));
    unsigned char *in = in_place ? out + inner * m : xmalloc((size_t)(outer * inner));
    for (int64_t x = 0; x < outer * inner; x++) in[x] = bval(gr->ranks[m], x, call);
    spmd_status st = g->ops->all_gather(g, m, in, out, outer, inner);
    OK(st, "all_gather");
    for (int64_t r = 0; r < outer; r++)
        for (int j = 0; j < n; j++)
            for (int64_t x = 0; x < inner; x++)
                if (out[(r * n + j) * inner + x] != bval(gr->ranks[j], r * inner + x, call)) {
                    fail("all_gather n=%d [%lld, %lld]%s member %d: row %lld block %d byte %lld",
                         n, (long long)outer, (long long)inner, in_place ? " in place" : "", m,
                         (long long)r, j, (long long)x);
                    r = outer;
                    j = n;
                    break;
                }
    if (!in_place) free(in);
    free(out);
}

static void check_all_to_all(coll_group *g, const grp *gr, int m, int64_t bytes, int call)
{
    int n = gr->size;
    unsigned char *in = xmalloc((size_t)(bytes * n)), *out = xmalloc((size_t)(bytes * n));
    for (int64_t x = 0; x < bytes * n; x++) in[x] = bval(gr->ranks[m], x, call);
    spmd_status st = g->ops->all_to_all(g, m, in, out, bytes);
    OK(st, "all_to_all");
    for (int i = 0; i < n; i++)
        for (int64_t x = 0; x < bytes; x++)
            if (out[i * bytes + x] != bval(gr->ranks[i], m * bytes + x, call)) {
                fail("all_to_all n=%d bytes=%lld member %d: block %d byte %lld", n,
                     (long long)bytes, m, i, (long long)x);
                i = n;
                break;
            }
    free(in);
    free(out);
}

static void check_broadcast(coll_group *g, const grp *gr, int m, int64_t bytes, int root, int call)
{
    unsigned char *buf = xmalloc((size_t)bytes);
    for (int64_t x = 0; x < bytes; x++) buf[x] = bval(gr->ranks[m], x, call);
    spmd_status st = g->ops->broadcast(g, m, buf, bytes, root);
    OK(st, "broadcast");
    for (int64_t x = 0; x < bytes; x++)
        if (buf[x] != bval(gr->ranks[root], x, call)) {
            fail("broadcast n=%d root %d member %d: byte %lld", gr->size, root, m, (long long)x);
            break;
        }
    free(buf);
}

/* Member i receives from member i - shift (mod n); member `hole` (if >= 0)
 * receives nothing and keeps its output. */
static void check_permute(coll_group *g, const grp *gr, int m, int64_t bytes, int shift, int hole,
                          int call)
{
    int n = gr->size, src[MAX_MEMBERS];
    if (bytes < 0) return;
    for (int i = 0; i < n; i++) src[i] = i == hole ? -1 : (i + n - shift % n) % n;
    unsigned char *in = xmalloc((size_t)bytes), *out = xmalloc((size_t)bytes);
    for (int64_t x = 0; x < bytes; x++) in[x] = bval(gr->ranks[m], x, call);
    memset(out, 0xAB, (size_t)bytes);
    spmd_status st = g->ops->permute(g, m, in, out, bytes, src);
    OK(st, "permute");
    for (int64_t x = 0; x < bytes; x++) {
        unsigned char want = src[m] < 0 ? 0xAB : bval(gr->ranks[src[m]], x, call);
        if (out[x] != want) {
            fail("permute n=%d member %d (from %d): byte %lld", n, m, src[m], (long long)x);
            break;
        }
    }
    free(in);
    free(out);
}

static void run_suite(coll_group *g, const grp *gr, int m, int gi)
{
    int n = gr->size, call = gi * 1000;
    /* Both sides of the one-round limit (65536 floats over the group's
     * other processes: 65536, 32768, 21845 for 2, 3, 4 processes), chunks
     * of 16 floats that do not divide the count. */
    static const int64_t counts[] = {0, 1, 7, 1001, 21845, 21846, 32769, 65537, 100003};
    for (size_t c = 0; c < sizeof counts / sizeof *counts; c++)
        check_all_reduce(g, gr, m, counts[c], call++);
    /* The bf16 reductions: the f32 path's bits, rounded. */
    for (size_t c = 0; c < sizeof counts / sizeof *counts; c++)
        check_all_reduce_bf16(g, gr, m, counts[c], call++);
    check_reduce_scatter_bf16(g, gr, m, 3, 1001, false, call++);
    check_reduce_scatter_bf16(g, gr, m, 1, 7, true, call++);
    static const int64_t inners[] = {1, 7, 1001};
    for (size_t c = 0; c < 3; c++) {
        for (int64_t outer = 1; outer <= 3; outer += 2) {
            check_all_gather(g, gr, m, outer, inners[c], false, call++);
            check_reduce_scatter(g, gr, m, outer, inners[c], false, call++);
        }
        check_all_gather(g, gr, m, 1, inners[c], true, call++);
        check_reduce_scatter(g, gr, m, 1, inners[c], true, call++);
        check_all_to_all(g, gr, m, inners[c], call++);
        check_broadcast(g, gr, m, inners[c], 0, call++);
        check_broadcast(g, gr, m, inners[c], n - 1, call++);
        check_broadcast(g, gr, m, inners[c], n / 2, call++);
        check_permute(g, gr, m, inners[c], 1, -1, call++);
        check_permute(g, gr, m, inners[c], n / 2 + 1, n / 2, call++);
    }
    check_reduce_scatter(g, gr, m, 2, 5003, false, call++);
    check_all_gather(g, gr, m, 1, 300007, false, call++);
    check_reduce_scatter(g, gr, m, 1, 50021, false, call++);
    check_reduce_scatter(g, gr, m, 0, 5, false, call++);
    check_all_gather(g, gr, m, 0, 5, false, call++);
    check_broadcast(g, gr, m, 0, 0, call++);
}

/* ---- The groups ---------------------------------------------------------------------- */

static grp groups[MAX_GROUPS];
static int n_groups;

static void add_group(const grp *g)
{
    for (int i = 0; i < n_groups; i++)
        if (groups[i].size == g->size &&
            !memcmp(groups[i].ranks, g->ranks, sizeof(int) * (size_t)g->size))
            return;
    if (n_groups < MAX_GROUPS) groups[n_groups++] = *g;
}

/* The same list on every process. */
static void make_groups(void)
{
    grp g;
    g.size = N;
    for (int i = 0; i < N; i++) g.ranks[i] = i;
    add_group(&g);
    /* Rows (minor, consecutive ranks) and columns of each R x C layout. */
    for (int c = 2; c < N; c++) {
        if (N % c) continue;
        int r = N / c;
        for (int row = 0; row < r; row++) {
            g.size = c;
            for (int j = 0; j < c; j++) g.ranks[j] = row * c + j;
            add_group(&g);
        }
        for (int col = 0; col < c; col++) {
            g.size = r;
            for (int i = 0; i < r; i++) g.ranks[i] = i * c + col;
            add_group(&g);
        }
    }
    /* Runs of 1 to 8 devices at offsets 0 and 1, and strided. */
    for (int s = 1; s <= 8 && s <= N; s++) {
        for (int off = 0; off <= 1 && off + s <= N; off++) {
            g.size = s;
            for (int i = 0; i < s; i++) g.ranks[i] = off + i;
            add_group(&g);
        }
        int stride = N / s;
        g.size = s;
        for (int i = 0; i < s; i++) g.ranks[i] = (i * stride + N - 1) % N;
        add_group(&g);
    }
    /* Member order that is not rank order. */
    g.size = N;
    for (int i = 0; i < N; i++) g.ranks[i] = N - 1 - i;
    add_group(&g);
    for (int i = 0; i < N; i++) g.ranks[i] = i % 2 ? N / 2 + i / 2 : i / 2;
    if (N % 2 == 0) add_group(&g);
}

static int member_of(const grp *g, int rank)
{
    for (int i = 0; i < g->size; i++)
        if (g->ranks[i] == rank) return i;
    return -1;
}

static coll_group *handles[MAX_GROUPS];

static void *device_main(void *p)
{
    int rank = (int)(intptr_t)p;
    for (int gi = 0; gi < n_groups; gi++) {
        int m = member_of(&groups[gi], rank);
        if (m >= 0) run_suite(handles[gi], &groups[gi], m, gi);
    }
    return NULL;
}

static int run_devices(void *(*fn)(void *))
{
    pthread_t tid[MAX_DEVICES];
    for (int d = 0; d < L; d++)
        if (pthread_create(&tid[d], NULL, fn, (void *)(intptr_t)(RANK * L + d)) != 0) {
            fail("cannot start device thread %d", d);
            coll_world_abort(W, "thread start failed");
            for (int e = 0; e < d; e++) pthread_join(tid[e], NULL);
            return 1;
        }
    for (int d = 0; d < L; d++) pthread_join(tid[d], NULL);
    return 0;
}

static int test_collectives(void)
{
    make_groups();
    for (int gi = 0; gi < n_groups; gi++) {
        bool here = false;
        for (int i = 0; i < groups[gi].size; i++) here |= groups[gi].ranks[i] / L == RANK;
        if (!here) continue;
        handles[gi] = coll_world_group(W, groups[gi].size, groups[gi].ranks);
        if (!handles[gi] || handles[gi]->size != groups[gi].size) {
            fail("group %d: %s", gi, spmd_last_error());
            return 1;
        }
    }
    spmd_status st = coll_world_connect(W);
    if (st) {
        fail("connect: %s", spmd_last_error());
        return 1;
    }
    return run_devices(device_main);
}

/* ---- Abort --------------------------------------------------------------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static grp wait_groups[2]; /* across processes: the whole world, and {0, N-1} */
static coll_group *wait_handles[2];
static _Atomic double aborted_at;

static void *waiting_device(void *p)
{
    int rank = (int)(intptr_t)p;
    /* Device 0 waits in the whole world (large) and then in {0, N-1}
     * (small); the others of process 0 only in the whole world. */
    for (int k = 0; k < 2; k++) {
        const grp *gr = &wait_groups[k];
        int m = member_of(gr, rank);
        if (m < 0) continue;
        int64_t count = k == 0 ? (1 << 20) : 1000;
        float *buf = xmalloc(sizeof *buf * (size_t)count);
        spmd_status st = wait_handles[k]->ops->all_reduce(wait_handles[k], m, buf, count, COLL_F32);
        double dt = now_s() - atomic_load(&aborted_at);
        atomic_fetch_add(&checks, 1);
        if (st != SPMD_ERR_BACKEND || strcmp(spmd_last_error(), "collective aborted: test abort"))
            fail("waiting all_reduce (group %d) gave %s: %s", k, spmd_status_name(st),
                 spmd_last_error());
        else if (k == 0 && (dt < 0 || dt > 2.0))
            fail("waiting all_reduce returned %.3f s after the abort", dt);
        free(buf);
    }
    return NULL;
}

static void *aborter(void *p)
{
    (void)p;
    struct timespec nap = {0, 300 * 1000 * 1000};
    nanosleep(&nap, NULL);
    atomic_store(&aborted_at, now_s());
    coll_world_abort(W, "test abort");
    coll_world_abort(W, "a later abort keeps the first message");
    return NULL;
}

static int test_abort(void)
{
    if (P < 2) {
        fail("--abort needs 2 processes or more");
        return 1;
    }
    wait_groups[0].size = N;
    for (int i = 0; i < N; i++) wait_groups[0].ranks[i] = i;
    wait_groups[1] = (grp){.size = 2, .ranks = {0, N - 1}};
    for (int k = 0; k < 2; k++) {
        bool here = false;
        for (int i = 0; i < wait_groups[k].size; i++) here |= wait_groups[k].ranks[i] / L == RANK;
        if (here) wait_handles[k] = coll_world_group(W, wait_groups[k].size, wait_groups[k].ranks);
        if (here && !wait_handles[k]) fail("group: %s", spmd_last_error());
    }
    if (coll_world_connect(W) != SPMD_OK) {
        fail("connect: %s", spmd_last_error());
        return 1;
    }
    if (RANK == 0) {
        /* Nobody elsewhere ever joins. */
        atomic_store(&aborted_at, 1e300);
        pthread_t t;
        pthread_create(&t, NULL, aborter, NULL);
        run_devices(waiting_device);
        pthread_join(t, NULL);
        /* Later calls fail at once, also after a reset, on every group
         * across processes; a group inside the process works again. */
        float x[4] = {1, 2, 3, 4};
        for (int round = 0; round < 2; round++) {
            spmd_status st = wait_handles[1]->ops->all_reduce(wait_handles[1], 0, x, 4, COLL_F32);
            atomic_fetch_add(&checks, 1);
            if (st != SPMD_ERR_BACKEND || !strstr(spmd_last_error(), "test abort"))
                fail("all_reduce after the abort (round %d) gave %s: %s", round,
                     spmd_status_name(st), spmd_last_error());
            if (round == 0) coll_world_reset(W);
        }
        int self = 0;
        coll_group *gs = coll_world_group(W, 1, &self);
        spmd_status st = gs ? gs->ops->all_reduce(gs, 0, x, 4, COLL_F32) : SPMD_ERR_INTERNAL;
        atomic_fetch_add(&checks, 1);
        if (st != SPMD_OK || x[0] != 1)
            fail("a group of one after the reset gave %s", spmd_status_name(st));
    }
    return 0;
}

/* Process 0 asks for a group that process 1 (which holds a member) does
 * not: connect fails alike on every process. */
static int test_disagree(void)
{
    coll_world *w = coll_mpi_world_create(MPI_COMM_WORLD, L, NULL);
    if (!w) {
        fail("world: %s", spmd_last_error());
        return 1;
    }
    int both[2] = {0, N - 1};
    int mine = RANK * L;
    if (RANK == 0 && !coll_world_group(w, 2, both)) fail("group: %s", spmd_last_error());
    if (!coll_world_group(w, 1, &mine)) fail("group of one: %s", spmd_last_error());
    spmd_status st = coll_world_connect(w);
    atomic_fetch_add(&checks, 1);
    if (st != SPMD_ERR_INVALID || !strstr(spmd_last_error(), "disagree"))
        fail("connect with a group only process 0 asked for gave %s: %s", spmd_status_name(st),
             spmd_last_error());
    coll_world_free(w);
    return 0;
}

/* ---- The watchdog ------------------------------------------------------------------- */

enum { STALL_S = 2 };

/* --stall (process 0 of 2 devices): device 0 leads a group across
 * processes that no other process joins ({0, N-1}); device 1 waits for
 * device 0 in the group of the two ({0, 1}), where device 0 never comes.
 * Device 0's watchdog must fire within the limit (and the slack of a
 * loaded machine) naming a process that had not delivered, and its host;
 * device 1's, which waits on a live wait, must leave the blame to it and
 * end with the abort device 0's timeout caused. */
static grp stall_groups[2];
static coll_group *stall_handles[2];
static double stall_began;

static void *stalled_device(void *p)
{
    int rank = (int)(intptr_t)p;
    const grp *gr = &stall_groups[rank == 0 ? 0 : 1];
    coll_group *g = stall_handles[rank == 0 ? 0 : 1];
    int m = member_of(gr, rank);
    float buf[1000] = {0};
    spmd_status st = g->ops->all_reduce(g, m, buf, 1000, COLL_F32);
    double dt = now_s() - stall_began;
    const char *msg = spmd_last_error();
    char host[MPI_MAX_PROCESSOR_NAME] = "";
    int len = 0;
    MPI_Get_processor_name(host, &len);
    char want[512];
    snprintf(want, sizeof want, "waited %d.", STALL_S);
    fprintf(stderr, "process %d device %d after %.2f s: %s: %s\n", RANK, rank, dt,
            spmd_status_name(st), msg);
    atomic_fetch_add(&checks, 1);
    if (dt < STALL_S * 0.99 || dt > STALL_S + 60) fail("device %d returned after %.2f s", rank, dt);
    if (!strstr(msg, "collective timeout: all_reduce: device 0 (process 0 on ") ||
        !strstr(msg, "without progress for process 1 on ") || !strstr(msg, host) ||
        !strstr(msg, "whose message had not arrived"))
        fail("device %d's message does not name the process waited for: %s", rank, msg);
    if (rank == 0 && st != SPMD_ERR_TIMEOUT)
        fail("device 0 gave %s, not a timeout", spmd_status_name(st));
    if (rank == 1 && (st != SPMD_ERR_BACKEND || strncmp(msg, "collective aborted: ", 20)))
        fail("device 1 gave %s (%s), not the abort", spmd_status_name(st), msg);
    return NULL;
}

static int test_stall(void)
{
    if (P != 2 || L != 2) {
        fail("--stall runs on 2 processes of 2 devices");
        return 1;
    }
    coll_world_set_timeout(W, STALL_S);
    stall_groups[0] = (grp){.size = 2, .ranks = {0, N - 1}};
    stall_groups[1] = (grp){.size = 2, .ranks = {0, 1}};
    for (int k = 0; k < 2; k++) {
        bool here = false;
        for (int i = 0; i < stall_groups[k].size; i++) here |= stall_groups[k].ranks[i] / L == RANK;
        if (here) stall_handles[k] = coll_world_group(W, stall_groups[k].size, stall_groups[k].ranks);
        if (here && !stall_handles[k]) fail("group: %s", spmd_last_error());
    }
    if (coll_world_connect(W) != SPMD_OK) {
        fail("connect: %s", spmd_last_error());
        return 1;
    }
    if (RANK == 0) {
        stall_began = now_s();
        run_devices(stalled_device);
    }
    return 0;
}

/* --slow (P processes of one device): process r joins an all-gather and
 * an all-reduce over the whole world 1.5 r seconds after the others'
 * start, under a limit of 3 s: process 0 waits 1.5 (P - 1) seconds in
 * all, but a message completes every 1.5 s, so nobody's watchdog fires. */
static int test_slow(void)
{
    grp gr = {.size = N};
    for (int i = 0; i < N; i++) gr.ranks[i] = i;
    coll_group *g = coll_world_group(W, N, gr.ranks);
    if (!g || coll_world_connect(W) != SPMD_OK) {
        fail("group: %s", spmd_last_error());
        return 1;
    }
    enum { LIMIT_S = 3 };
    coll_world_set_timeout(W, LIMIT_S);
    /* A common start: after a barrier, each process waits its turn. */
    MPI_Barrier(MPI_COMM_WORLD);
    double began = now_s();
    struct timespec nap = {(time_t)(1.5 * RANK), RANK % 2 ? 500 * 1000 * 1000 : 0};
    nanosleep(&nap, NULL);
    check_all_gather(g, &gr, RANK, 3, 100, false, 1);
    double waited = now_s() - began;
    MPI_Barrier(MPI_COMM_WORLD);
    nanosleep(&nap, NULL);
    check_all_reduce(g, &gr, RANK, 100000, 2);
    if (RANK == 0) {
        fprintf(stderr, "process 0 waited %.2f s in one all_gather under a %d s limit\n", waited,
                LIMIT_S);
        atomic_fetch_add(&checks, 1);
        if (P >= 4 && waited <= LIMIT_S)
            fail("the all_gather took %.2f s, not longer than the limit", waited);
    }
    return 0;
}

/* ---- Main ---------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_size(MPI_COMM_WORLD, &P);
    MPI_Comm_rank(MPI_COMM_WORLD, &RANK);
    L = 1;
    bool abort_mode = false, stall_mode = false, slow_mode = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--devices") && i + 1 < argc)
            L = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--abort"))
            abort_mode = true;
        else if (!strcmp(argv[i], "--stall"))
            stall_mode = true;
        else if (!strcmp(argv[i], "--slow"))
            slow_mode = true;
        else {
            if (RANK == 0)
                fprintf(stderr, "usage: mpi_collectives_worker [--devices L] "
                                "[--abort | --stall | --slow]\n");
            MPI_Finalize();
            return 2;
        }
    }
    N = P * L;
    if (L < 1 || L > MAX_DEVICES || N > MAX_MEMBERS) {
        if (RANK == 0) fprintf(stderr, "mpi_collectives_worker: %d x %d devices: too many\n", P, L);
        MPI_Finalize();
        return 2;
    }
    double t0 = now_s();
    W = coll_mpi_world_create(MPI_COMM_WORLD, L, NULL);
    if (!W) {
        fail("world: %s", spmd_last_error());
    } else {
        int first, count, size;
        coll_world_local(W, &first, &count, &size);
        if (first != RANK * L || count != L || size != N)
            fail("local devices %d + %d of %d", first, count, size);
        if (abort_mode) {
            test_abort();
            test_disagree();
        } else if (stall_mode) {
            test_stall();
        } else if (slow_mode) {
            test_slow();
        } else {
            test_collectives();
        }
    }
    /* Every process's verdict, once the others are done. */
    long mine[2] = {atomic_load(&failures), atomic_load(&checks)}, all[2];
    MPI_Allreduce(mine, all, 2, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (W) coll_world_free(W);
    if (RANK == 0) {
        printf("mpi_collectives_worker: %d processes x %d devices%s: %d groups, %ld checks, "
               "%ld failed, %.1f s\n%s\n",
               P, L, abort_mode ? " (abort)" : stall_mode ? " (stall)" : slow_mode ? " (slow)" : "",
               n_groups, all[1], all[0], now_s() - t0,
               all[0] ? "FAIL" : "PASS");
        fflush(stdout);
    }
    MPI_Finalize();
    return all[0] ? 1 : 0;
}
