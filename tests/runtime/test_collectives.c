/*
 * Shared-memory collectives: every collective on teams of 1 to 16 device
 * threads (more threads than this machine has cores), on the whole world
 * and on the rows and columns of a 4x2 mesh at the same time, against
 * serial references computed here.  Sums must be the bits of the
 * canonical pairwise tree over member ranks on every member (8 members:
 * ((x0+x1)+(x2+x3))+((x4+x5)+(x6+x7))), which test_tree_order also checks
 * against sums written out by hand.  Then barrier reuse (1000 calls
 * back to back), mismatched calls, allocation through the hook, and abort:
 * members blocked in a collective must wake with an error, every member
 * must stop after the same collective, and the world must work again
 * after a reset.  A world of 4096 devices is set up in work linear in the
 * ranks its groups hold (counted).  The watchdog: a member that never arrives is named by
 * the waits that end within the limit (and no wait blames a peer that is
 * itself waiting, live), and arrivals a second apart under a 3 s limit are
 * progress however long the call takes in all.  Every test runs under an alarm so that a hang fails
 * instead of blocking CI.
 *
 * Member threads cannot use cmocka's asserts (they jump out of the test on
 * the main thread), so they record failures and the main thread reports.
 */
#include "support_values.h"
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "base/bf16.h"
#include "base/error.h"
#include "runtime/collectives/collectives.h"
#include "runtime/collectives/collectives_impl.h"
#include "support_alloc.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { MAX_THREADS = 16, HANG_SECONDS = 300 };

/* ---- Teams of device threads ------------------------------------------------------- */

typedef struct team team;
typedef void (*body_fn)(team *t, int rank);

struct team {
    int n;
    coll_world *w;
    body_fn body;
    void *arg;
    _Atomic int failures;
    pthread_mutex_t mu;
    char first[512];
};

typedef struct member_arg {
    team *t;
    int rank;
} member_arg;

static void team_fail(team *t, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void team_fail(team *t, int line, const char *fmt, ...)
{
    if (atomic_fetch_add(&t->failures, 1) > 0) return;
    pthread_mutex_lock(&t->mu);
    int k = snprintf(t->first, sizeof t->first, "line %d: ", line);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->first + k, sizeof t->first - (size_t)k, fmt, ap);
    va_end(ap);
    pthread_mutex_unlock(&t->mu);
}

#define CHECK(t, cond, ...)                                    \
    do {                                                       \
        if (!(cond)) team_fail((t), __LINE__, __VA_ARGS__);    \
    } while (0)

#define CHECK_OK(t, st, what)                                                                \
    CHECK((t), (st) == SPMD_OK, "%s: %s (%s)", (what), spmd_status_name(st), spmd_last_error())

static void *member_main(void *p)
{
    member_arg *m = p;
    m->t->body(m->t, m->rank);
    return NULL;
}

/* Run body(rank) on n threads of world w; returns the failed checks and
 * copies the first message to `first`.  Safe off the main thread. */
static int run_team_quiet(int n, coll_world *w, body_fn body, void *arg, char *first,
                          size_t size)
{
    team t = {.n = n, .w = w, .body = body, .arg = arg};
    atomic_init(&t.failures, 0);
    pthread_mutex_init(&t.mu, NULL);
    pthread_t tid[MAX_THREADS];
    member_arg args[MAX_THREADS];
    int started = 0;
    for (int i = 0; i < n; i++) {
        args[i] = (member_arg){&t, i};
        if (pthread_create(&tid[i], NULL, member_main, &args[i]) != 0) {
            /* The others would wait for it forever: let them go. */
            team_fail(&t, __LINE__, "could not start thread %d", i);
            coll_world_abort(w, "test thread failed to start");
            break;
        }
        started++;
    }
    for (int i = 0; i < started; i++) pthread_join(tid[i], NULL);
    pthread_mutex_destroy(&t.mu);
    snprintf(first, size, "%s", t.first);
    return atomic_load(&t.failures);
}

/* The same on the main thread, failing the test if any check failed. */
static void run_team(int n, coll_world *w, body_fn body, void *arg)
{
    char first[512];
    int failures = run_team_quiet(n, w, body, arg, first, sizeof first);
    if (failures) fail_msg("%d failed checks, first: %s", failures, first);
}

/* A group as the test sees it: world ranks in member order. */
typedef struct grp {
    int size;
    int ranks[MAX_THREADS];
} grp;

static coll_group *get_group(team *t, const grp *gr)
{
    coll_group *g = coll_world_group(t->w, gr->size, gr->ranks);
    CHECK(t, g && g->size == gr->size, "group of %d: %s", gr->size, spmd_last_error());
    return g;
}

/* Zeroed, so that nothing reads as uninitialised. */
static void *xmalloc(size_t bytes)
{
    void *p = calloc(bytes ? bytes : 1, 1);
    if (!p) abort();
    return p;
}

/* The canonical sum of members [lo, hi): the left part has the largest
 * power of two of members below hi - lo, written here independently of
 * the library's coll_tree_mid. */
static float ref_tree(const grp *gr, int lo, int hi, int64_t i, int call)
{
    if (hi - lo == 1) return fval(gr->ranks[lo], i, call);
    int half = 1 << 30;
    while (half >= hi - lo) half >>= 1;
    return ref_tree(gr, lo, lo + half, i, call) + ref_tree(gr, lo + half, hi, i, call);
}

/* The canonical float sum of element i of every member's input. */
static float ref_sum(const grp *gr, int64_t i, int call)
{
    return ref_tree(gr, 0, gr->size, i, call);
}

/* ---- Each collective against its reference --------------------------------------- */

static void check_all_reduce(team *t, coll_group *g, const grp *gr, int member, int64_t count,
                             int call)
{
    float *buf = xmalloc(sizeof *buf * (size_t)count);
    for (int64_t i = 0; i < count; i++) buf[i] = fval(gr->ranks[member], i, call);
    spmd_status st = g->ops->all_reduce(g, member, buf, count, COLL_F32);
    CHECK_OK(t, st, "all_reduce");
    for (int64_t i = 0; i < count && st == SPMD_OK; i++) {
        float want = ref_sum(gr, i, call);
        if (memcmp(&buf[i], &want, sizeof want) != 0) {
            team_fail(t, __LINE__, "all_reduce n=%d count=%lld member %d: [%lld] = %a, want %a",
                      gr->size, (long long)count, member, (long long)i, buf[i], want);
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

static void check_all_reduce_bf16(team *t, coll_group *g, const grp *gr, int member, int64_t count,
                                  int call)
{
    uint16_t *buf = xmalloc(sizeof *buf * (size_t)count);
    for (int64_t i = 0; i < count; i++) buf[i] = bf16_from_f32(fval(gr->ranks[member], i, call));
    spmd_status st = g->ops->all_reduce(g, member, buf, count, COLL_BF16);
    CHECK_OK(t, st, "all_reduce_bf16");
    for (int64_t i = 0; i < count && st == SPMD_OK; i++) {
        uint16_t want = bf16_from_f32(ref_tree_bf16(gr, 0, gr->size, i, call));
        if (buf[i] != want) {
            team_fail(t, __LINE__, "all_reduce_bf16 n=%d count=%lld member %d: [%lld] = %#x, want %#x", gr->size, (long long)count, member, (long long)i, buf[i], want);
            break;
        }
    }
    free(buf);
}

static void check_reduce_scatter_bf16(team *t, coll_group *g, const grp *gr, int member,
                                      int64_t outer, int64_t inner, bool in_place, int call)
{
    int n = gr->size;
    uint16_t *in = xmalloc(sizeof *in * (size_t)(outer * n * inner));
    for (int64_t x = 0; x < outer * n * inner; x++)
        in[x] = bf16_from_f32(fval(gr->ranks[member], x, call));
    uint16_t *out = in_place ? in + inner * member : xmalloc(sizeof *out * (size_t)(outer * inner));
    spmd_status st = g->ops->reduce_scatter(g, member, in, out, outer, inner, COLL_BF16);
    CHECK_OK(t, st, "reduce_scatter_bf16");
    for (int64_t r = 0; r < outer && st == SPMD_OK; r++)
        for (int64_t x = 0; x < inner; x++) {
            uint16_t want =
                bf16_from_f32(ref_tree_bf16(gr, 0, n, (r * n + member) * inner + x, call));
            if (out[r * inner + x] != want) {
                team_fail(t, __LINE__, "reduce_scatter_bf16 n=%d [%lld, %lld] member %d: [%lld, %lld] = %#x, want %#x", n, (long long)outer, (long long)inner, member, (long long)r, (long long)x, out[r * inner + x], want);
                r = outer;
                break;
            }
        }
    if (!in_place) free(out);
    free(in);
}

static void check_all_gather(team *t, coll_group *g, const grp *gr, int member, int64_t outer,
                             int64_t inner, bool in_place, int call)
{
    int n = gr->size;
    unsigned char *out = xmalloc((size_t)(outer * inner * n));
    memset(out, 0xEE, (size_t)(outer * inner * n));
    unsigned char *in = in_place ? out + inner * member : xmalloc((size_t)(outer * inner));
    for (int64_t x = 0; x < outer * inner; x++) in[x] = bval(gr->ranks[member], x, call);
    spmd_status st = g->ops->all_gather(g, member, in, out, outer, inner);
    CHECK_OK(t, st, "all_gather");
    for (int64_t r = 0; r < outer && st == SPMD_OK; r++)
        for (int j = 0; j < n; j++)
            for (int64_t x = 0; x < inner; x++) {
                unsigned char got = out[(r * n + j) * inner + x];
                unsigned char want = bval(gr->ranks[j], r * inner + x, call);
                if (got != want) {
                    team_fail(t, __LINE__,
                              "all_gather n=%d [%lld, %lld]%s member %d: row %lld block %d "
                              "byte %lld = %d, want %d",
                              n, (long long)outer, (long long)inner, in_place ? " in place" : "",
                              member, (long long)r, j, (long long)x, got, want);
                    r = outer;
                    j = n;
                    break;
                }
            }
    if (!in_place) free(in);
    free(out);
}

static void check_reduce_scatter(team *t, coll_group *g, const grp *gr, int member,
                                 int64_t outer, int64_t inner, bool in_place, int call)
{
    int n = gr->size;
    float *in = xmalloc(sizeof *in * (size_t)(outer * n * inner));
    for (int64_t x = 0; x < outer * n * inner; x++) in[x] = fval(gr->ranks[member], x, call);
    float *out = in_place ? in + inner * member : xmalloc(sizeof *out * (size_t)(outer * inner));
    spmd_status st = g->ops->reduce_scatter(g, member, in, out, outer, inner, COLL_F32);
    CHECK_OK(t, st, "reduce_scatter");
    for (int64_t r = 0; r < outer && st == SPMD_OK; r++)
        for (int64_t x = 0; x < inner; x++) {
            float want = ref_sum(gr, (r * n + member) * inner + x, call);
            if (memcmp(&out[r * inner + x], &want, sizeof want) != 0) {
                team_fail(t, __LINE__,
                          "reduce_scatter n=%d [%lld, %lld]%s member %d: [%lld, %lld] = %a, "
                          "want %a",
                          n, (long long)outer, (long long)inner, in_place ? " in place" : "",
                          member, (long long)r, (long long)x, out[r * inner + x], want);
                r = outer;
                break;
            }
        }
    if (!in_place) free(out);
    free(in);
}

static void check_all_to_all(team *t, coll_group *g, const grp *gr, int member, int64_t bytes,
                             int call)
{
    int n = gr->size;
    unsigned char *in = xmalloc((size_t)(bytes * n)), *out = xmalloc((size_t)(bytes * n));
    for (int64_t x = 0; x < bytes * n; x++) in[x] = bval(gr->ranks[member], x, call);
    spmd_status st = g->ops->all_to_all(g, member, in, out, bytes);
    CHECK_OK(t, st, "all_to_all");
    for (int i = 0; i < n && st == SPMD_OK; i++)
        for (int64_t x = 0; x < bytes; x++)
            if (out[i * bytes + x] != bval(gr->ranks[i], member * bytes + x, call)) {
                team_fail(t, __LINE__, "all_to_all n=%d bytes=%lld member %d: block %d byte %lld",
                          n, (long long)bytes, member, i, (long long)x);
                i = n;
                break;
            }
    free(in);
    free(out);
}

static void check_broadcast(team *t, coll_group *g, const grp *gr, int member, int64_t bytes,
                            int root, int call)
{
    unsigned char *buf = xmalloc((size_t)bytes);
    for (int64_t x = 0; x < bytes; x++) buf[x] = bval(gr->ranks[member], x, call);
    spmd_status st = g->ops->broadcast(g, member, buf, bytes, root);
    CHECK_OK(t, st, "broadcast");
    for (int64_t x = 0; x < bytes && st == SPMD_OK; x++)
        if (buf[x] != bval(gr->ranks[root], x, call)) {
            team_fail(t, __LINE__, "broadcast n=%d root %d member %d: byte %lld", gr->size, root,
                      member, (long long)x);
            break;
        }
    free(buf);
}

/* A ring shift: member i receives from member i-1, except member `hole`
 * (if >= 0), which receives nothing and keeps its output. */
static void check_permute(team *t, coll_group *g, const grp *gr, int member, int64_t bytes,
                          int hole, int call)
{
    int n = gr->size;
    if (bytes < 0) return;
    int src[MAX_THREADS];
    for (int i = 0; i < n; i++) src[i] = i == hole ? -1 : (i + n - 1) % n;
    unsigned char *in = xmalloc((size_t)bytes), *out = xmalloc((size_t)bytes);
    for (int64_t x = 0; x < bytes; x++) in[x] = bval(gr->ranks[member], x, call);
    memset(out, 0xAB, (size_t)bytes);
    spmd_status st = g->ops->permute(g, member, in, out, bytes, src);
    CHECK_OK(t, st, "permute");
    for (int64_t x = 0; x < bytes && st == SPMD_OK; x++) {
        unsigned char want = src[member] < 0 ? 0xAB : bval(gr->ranks[src[member]], x, call);
        if (out[x] != want) {
            team_fail(t, __LINE__, "permute n=%d member %d (from %d): byte %lld", n, member,
                      src[member], (long long)x);
            break;
        }
    }
    free(in);
    free(out);
}

/* Every collective with odd and even sizes, a leading and a non-leading
 * dimension, in place and not, on group `gr` as member `member`. */
static void run_suite(team *t, const grp *gr, int member)
{
    coll_group *g = get_group(t, gr);
    if (!g) return;
    int n = gr->size, call = 0;
    static const int64_t counts[] = {0, 1, 7, 1001, 40009};
    for (size_t c = 0; c < sizeof counts / sizeof *counts; c++)
        check_all_reduce(t, g, gr, member, counts[c], call++);
    static const int64_t inners[] = {1, 7, 1001};
    for (size_t c = 0; c < 3; c++) {
        for (int64_t outer = 1; outer <= 3; outer += 2) {
            check_all_gather(t, g, gr, member, outer, inners[c], false, call++);
            check_reduce_scatter(t, g, gr, member, outer, inners[c], false, call++);
        }
        check_all_gather(t, g, gr, member, 1, inners[c], true, call++);
        check_reduce_scatter(t, g, gr, member, 1, inners[c], true, call++);
        check_all_to_all(t, g, gr, member, inners[c], call++);
        check_broadcast(t, g, gr, member, inners[c], 0, call++);
        check_broadcast(t, g, gr, member, inners[c], n - 1, call++);
        check_broadcast(t, g, gr, member, inners[c], n / 2, call++);
        check_permute(t, g, gr, member, inners[c], -1, call++);
        check_permute(t, g, gr, member, inners[c], n / 2, call++);
    }
    /* Reduce-scatter of a large block: several summing blocks per row. */
    check_reduce_scatter(t, g, gr, member, 2, 5003, false, call++);
    /* The bf16 reductions (gradients reduced in bf16). */
    for (size_t c = 0; c < sizeof counts / sizeof *counts; c++)
        check_all_reduce_bf16(t, g, gr, member, counts[c], call++);
    check_reduce_scatter_bf16(t, g, gr, member, 3, 1001, false, call++);
    check_reduce_scatter_bf16(t, g, gr, member, 1, 7, true, call++);
    check_reduce_scatter_bf16(t, g, gr, member, 2, 5003, false, call++);
}

static grp whole_world(int n)
{
    grp gr = {.size = n};
    for (int i = 0; i < n; i++) gr.ranks[i] = i;
    return gr;
}

/* ---- Tests ----------------------------------------------------------------------- */

static int arm_alarm(void **state)
{
    (void)state;
    alarm(HANG_SECONDS); /* SIGALRM's default action ends the process: a hang fails */
    return 0;
}

static int disarm_alarm(void **state)
{
    (void)state;
    alarm(0);
    return 0;
}

/* The canonical order written out by hand, against the reference used
 * everywhere here and against coll_tree_sum given members or partial sums
 * (subtrees) as its terms.  The data makes other orders give other bits. */
static void test_tree_order(void **state)
{
    (void)state;
    enum { LEN = 3000 };
    static float x[8][LEN], part[3][LEN], out[LEN];
    for (int m = 0; m < 8; m++)
        for (int64_t e = 0; e < LEN; e++) x[m][e] = fval(m, e, 99);
    coll_term terms[8];
    int left_to_right_differs = 0;
    for (int n = 1; n <= 8; n++) {
        grp gr = whole_world(n);
        for (int m = 0; m < n; m++) terms[m] = (coll_term){x[m], COLL_F32, 0, m + 1};
        coll_tree_sum(terms, 0, n, 0, 0, out, COLL_F32, LEN);
        for (int64_t e = 0; e < LEN; e++) {
            const float *v[8];
            for (int m = 0; m < 8; m++) v[m] = &x[m][e];
            float want;
            switch (n) {
            case 1: want = *v[0]; break;
            case 2: want = *v[0] + *v[1]; break;
            case 3: want = (*v[0] + *v[1]) + *v[2]; break;
            case 4: want = (*v[0] + *v[1]) + (*v[2] + *v[3]); break;
            case 5: want = ((*v[0] + *v[1]) + (*v[2] + *v[3])) + *v[4]; break;
            case 6: want = ((*v[0] + *v[1]) + (*v[2] + *v[3])) + (*v[4] + *v[5]); break;
            case 7: want = ((*v[0] + *v[1]) + (*v[2] + *v[3])) + ((*v[4] + *v[5]) + *v[6]); break;
            default:
                want = ((*v[0] + *v[1]) + (*v[2] + *v[3])) + ((*v[4] + *v[5]) + (*v[6] + *v[7]));
            }
            float ref = ref_sum(&gr, e, 99), seq = *v[0];
            for (int m = 1; m < n; m++) seq += *v[m];
            if (memcmp(&seq, &want, sizeof want) != 0) left_to_right_differs++;
            if (memcmp(&ref, &want, sizeof want) != 0 || memcmp(&out[e], &want, sizeof want) != 0)
                fail_msg("n=%d element %lld: hand %a, reference %a, coll_tree_sum %a", n,
                         (long long)e, want, ref, out[e]);
        }
    }
    assert_true(left_to_right_differs > 0);

    /* Partial sums as terms: 7 members as [0,4) + [4,6) + 6, and as
     * 0 + 1 + [2,4) + [4,6) + 6; a row stride and a column offset. */
    for (int m = 0; m < 7; m++) terms[m] = (coll_term){x[m], COLL_F32, 0, m + 1};
    coll_tree_sum(terms, 0, 4, 0, 0, part[0], COLL_F32, LEN);
    coll_tree_sum(terms, 4, 6, 0, 0, part[1], COLL_F32, LEN);
    coll_tree_sum(terms, 2, 4, 0, 0, part[2], COLL_F32, LEN);
    static float want[LEN];
    coll_tree_sum(terms, 0, 7, 0, 0, want, COLL_F32, LEN);
    coll_term a[7] = {[0] = {part[0], COLL_F32, 0, 4}, [4] = {part[1], COLL_F32, 0, 6},
                      [6] = {x[6], COLL_F32, 0, 7}};
    coll_term b[7] = {[0] = {x[0], COLL_F32, 0, 1}, [1] = {x[1], COLL_F32, 0, 2},
                      [2] = {part[2], COLL_F32, 0, 4}, [4] = {part[1], COLL_F32, 0, 6},
                      [6] = {x[6], COLL_F32, 0, 7}};
    coll_tree_sum(a, 0, 7, 0, 0, out, COLL_F32, LEN);
    assert_memory_equal(out, want, sizeof out);
    coll_tree_sum(b, 0, 7, 0, 0, out, COLL_F32, LEN);
    assert_memory_equal(out, want, sizeof out);
    /* Rows of 1000 floats, row 2 from column 500: elements 2500 .. 2999. */
    for (int m = 0; m < 7; m++) terms[m] = (coll_term){x[m], COLL_F32, 1000, m + 1};
    coll_tree_sum(terms, 0, 7, 2, 500, out, COLL_F32, 500);
    assert_memory_equal(out, want + 2500, 500 * sizeof *out);
    /* In place, into a member's own elements: inside a subtree (member 3
     * of 7), and an operand of the root's own sum (member 2 of 3, member
     * 0 and member 1 of 2). */
    memcpy(part[0], x[3], sizeof part[0]);
    for (int m = 0; m < 7; m++) terms[m] = (coll_term){m == 3 ? part[0] : x[m], COLL_F32, 0, m + 1};
    coll_tree_sum(terms, 0, 7, 0, 0, part[0], COLL_F32, LEN);
    assert_memory_equal(part[0], want, sizeof want);
    for (int n = 2; n <= 3; n++)
        for (int own = n == 2 ? 0 : 2; own < n; own++) {
            for (int m = 0; m < n; m++) terms[m] = (coll_term){x[m], COLL_F32, 0, m + 1};
            coll_tree_sum(terms, 0, n, 0, 0, want, COLL_F32, LEN);
            memcpy(part[0], x[own], sizeof part[0]);
            terms[own].base = part[0];
            coll_tree_sum(terms, 0, n, 0, 0, part[0], COLL_F32, LEN);
            assert_memory_equal(part[0], want, sizeof want);
        }
}

static void body_world_suite(team *t, int rank)
{
    grp gr = whole_world(t->n);
    run_suite(t, &gr, rank);
}

static void test_world_sizes(void **state)
{
    (void)state;
    static const int sizes[] = {1, 2, 3, 4, 8, 16};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        coll_world *w = coll_shm_world_create(sizes[i], NULL);
        assert_non_null(w);
        run_team(sizes[i], w, body_world_suite, NULL);
        assert_false(coll_world_aborted(w));
        coll_world_free(w);
    }
}

/* A 4x2 mesh: device r is at row r / 2, column r % 2.  Rows {0,1}, {2,3},
 * ... and columns {0,2,4,6}, {1,3,5,7} run their collectives at the same
 * time, and so does every device's group of one. */
static void mesh_groups(int rank, grp *row, grp *col, grp *self, int *in_row, int *in_col)
{
    *row = (grp){.size = 2, .ranks = {rank / 2 * 2, rank / 2 * 2 + 1}};
    *col = (grp){.size = 4, .ranks = {rank % 2, rank % 2 + 2, rank % 2 + 4, rank % 2 + 6}};
    *self = (grp){.size = 1, .ranks = {rank}};
    *in_row = rank % 2;
    *in_col = rank / 2;
}

static void body_mesh_suite(team *t, int rank)
{
    grp row, col, self;
    int in_row, in_col;
    mesh_groups(rank, &row, &col, &self, &in_row, &in_col);
    run_suite(t, &row, in_row);
    run_suite(t, &col, in_col);
    run_suite(t, &self, 0);
    /* Interleaved: a row step then a column step, as a 2-D sharded
     * program does. */
    coll_group *gr = get_group(t, &row), *gc = get_group(t, &col);
    if (!gr || !gc) return;
    for (int k = 0; k < 20; k++) {
        check_all_reduce(t, gr, &row, in_row, 33 + k, 1000 + k);
        check_all_reduce(t, gc, &col, in_col, 65 + k, 2000 + k);
        check_all_gather(t, gc, &col, in_col, 3, 5, false, 3000 + k);
        check_reduce_scatter(t, gr, &row, in_row, 3, 9, false, 4000 + k);
    }
}

static void test_mesh_4x2(void **state)
{
    (void)state;
    coll_world *w = coll_shm_world_create(8, NULL);
    assert_non_null(w);
    run_team(8, w, body_mesh_suite, NULL);
    coll_world_free(w);
}

/* 1000 small collectives back to back: a barrier reused before a slow
 * member has left it would show up as a wrong sum or a hang. */
static void body_repeat(team *t, int rank)
{
    grp gr = whole_world(t->n);
    coll_group *g = get_group(t, &gr);
    if (!g) return;
    for (int k = 0; k < 1000; k++) {
        check_all_reduce(t, g, &gr, rank, 3, k);
        if (k % 10 == 0) check_broadcast(t, g, &gr, rank, 5, k % t->n, k);
    }
    if (t->n == 8) {
        grp row, col, self;
        int in_row, in_col;
        mesh_groups(rank, &row, &col, &self, &in_row, &in_col);
        coll_group *gr2 = get_group(t, &row), *gc = get_group(t, &col);
        if (!gr2 || !gc) return;
        for (int k = 0; k < 1000; k++) {
            check_all_reduce(t, gr2, &row, in_row, 2, k);
            check_all_reduce(t, gc, &col, in_col, 2, k);
        }
    }
}

static void test_repeated(void **state)
{
    (void)state;
    static const int sizes[] = {2, 3, 8, 16};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        coll_world *w = coll_shm_world_create(sizes[i], NULL);
        assert_non_null(w);
        run_team(sizes[i], w, body_repeat, NULL);
        coll_world_free(w);
    }
}

/* Every thread asks for the same groups at once and must get one object. */
static void body_lookup(team *t, int rank)
{
    _Atomic(coll_group *) *seen = t->arg;
    grp gr = whole_world(t->n);
    grp rev = {.size = 2, .ranks = {1, 0}};
    (void)rank;
    for (int k = 0; k < 100; k++) {
        coll_group *g = coll_world_group(t->w, gr.size, gr.ranks);
        coll_group *r = coll_world_group(t->w, rev.size, rev.ranks);
        coll_group *expect = NULL, *expect_r = NULL;
        atomic_compare_exchange_strong(&seen[0], &expect, g);
        atomic_compare_exchange_strong(&seen[1], &expect_r, r);
        CHECK(t, g && g == atomic_load(&seen[0]), "whole-world group differs");
        CHECK(t, r && r == atomic_load(&seen[1]), "group {1, 0} differs");
    }
}

static void test_groups(void **state)
{
    (void)state;
    coll_world *w = coll_shm_world_create(16, NULL);
    assert_non_null(w);
    _Atomic(coll_group *) seen[2];
    atomic_init(&seen[0], NULL);
    atomic_init(&seen[1], NULL);
    run_team(16, w, body_lookup, seen);

    int a[] = {0, 1}, b[] = {1, 0}, c[] = {0, 1, 2};
    coll_group *ga = coll_world_group(w, 2, a);
    assert_non_null(ga);
    assert_ptr_equal(ga, coll_world_group(w, 2, a));
    assert_ptr_equal(atomic_load(&seen[1]), coll_world_group(w, 2, b));
    assert_ptr_not_equal(ga, coll_world_group(w, 2, b));
    assert_ptr_not_equal(ga, coll_world_group(w, 3, c));
    assert_int_equal(ga->size, 2);

    int dup[] = {3, 3}, out_of_range[] = {0, 16}, negative[] = {-1};
    spmd_clear_error();
    assert_null(coll_world_group(w, 2, dup));
    assert_non_null(strstr(spmd_last_error(), "twice"));
    assert_null(coll_world_group(w, 2, out_of_range));
    assert_null(coll_world_group(w, 1, negative));
    assert_null(coll_world_group(w, 0, a));
    assert_null(coll_world_group(w, 17, a));
    assert_null(coll_shm_world_create(0, NULL));

    /* Bad arguments fail at once on the calling member. */
    float x = 1;
    assert_int_equal(ga->ops->all_reduce(ga, 2, &x, 1, COLL_F32), SPMD_ERR_INVALID);
    assert_int_equal(ga->ops->all_reduce(ga, 0, &x, -1, COLL_F32), SPMD_ERR_INVALID);
    assert_int_equal(ga->ops->all_reduce(ga, 0, &x, 1, (coll_dtype)7), SPMD_ERR_INVALID);
    assert_int_equal(ga->ops->reduce_scatter(ga, 0, &x, &x, 1, 1, (coll_dtype)-1),
                     SPMD_ERR_INVALID);
    assert_int_equal(ga->ops->broadcast(ga, 0, &x, 4, 2), SPMD_ERR_INVALID);
    int bad_src[] = {0, 5};
    assert_int_equal(ga->ops->permute(ga, 0, &x, &x, 4, bad_src), SPMD_ERR_INVALID);
    assert_int_equal(ga->ops->all_to_all(ga, 0, &x, &x, 4), SPMD_ERR_INVALID);
    coll_world_free(w);
    coll_world_free(NULL);
}

/* A world of COLL_MAX_MEMBERS devices is set up in time linear in the
 * ranks asked for: every device of a 64x64 mesh asks for its row, its
 * column and the whole world, as a program's devices do, and the world
 * looks at a few rank entries per rank asked (its checks, its index of
 * groups), counted, never timed.  The duplicate check that compared each
 * rank with those before it looked at size^2 / 2 per request: some 3e10
 * here, the minutes `spmd sample --mesh 4096` spent starting. */
static void test_big_world_setup_is_linear(void **state)
{
    (void)state;
    enum { SIDE = 64, N = SIDE * SIDE };
    assert_int_equal(N, COLL_MAX_MEMBERS);
    coll_world *w = coll_shm_world_create(N, NULL);
    assert_non_null(w);
    static int all[N];
    for (int k = 0; k < N; k++) all[k] = k;
    uint64_t asked = 0, calls = 0, before = coll_world_rank_visits(w);
    coll_group *whole = NULL, *rows[SIDE] = {0}, *cols[SIDE] = {0};
    for (int d = 0; d < N; d++) {
        int row = d / SIDE, col = d % SIDE, r[SIDE], c[SIDE];
        for (int k = 0; k < SIDE; k++) {
            r[k] = row * SIDE + k;
            c[k] = k * SIDE + col;
        }
        coll_group *gw = coll_world_group(w, N, all), *gr = coll_world_group(w, SIDE, r),
                   *gc = coll_world_group(w, SIDE, c);
        assert_non_null(gw);
        assert_non_null(gr);
        assert_non_null(gc);
        /* Each group is made once and shared by its members. */
        if (!whole) whole = gw;
        if (!rows[row]) rows[row] = gr;
        if (!cols[col]) cols[col] = gc;
        assert_ptr_equal(gw, whole);
        assert_ptr_equal(gr, rows[row]);
        assert_ptr_equal(gc, cols[col]);
        asked += N + 2 * SIDE;
        calls += 3;
    }
    uint64_t visits = coll_world_rank_visits(w) - before;
    print_message("%d devices: %llu ranks asked for in %llu requests, %llu rank entries looked at\n", N,
                  (unsigned long long)asked, (unsigned long long)calls, (unsigned long long)visits);
    if (visits > 4 * (asked + calls))
        fail_msg("%llu rank entries looked at for %llu ranks asked for: not linear",
                 (unsigned long long)visits, (unsigned long long)asked);
    /* A duplicate is still found wherever it is, and named. */
    all[N - 1] = 0;
    spmd_clear_error();
    assert_null(coll_world_group(w, N, all));
    assert_non_null(strstr(spmd_last_error(), "rank 0 twice"));
    coll_world_free(w);
}

/* Members that disagree about a call all fail, and the group still works. */
static void body_mismatch(team *t, int rank)
{
    grp gr = whole_world(t->n);
    coll_group *g = get_group(t, &gr);
    if (!g) return;
    float buf[8] = {0};
    spmd_status st = g->ops->all_reduce(g, rank, buf, 5 + rank, COLL_F32);
    CHECK(t, st == SPMD_ERR_INTERNAL, "mismatched all_reduce gave %s", spmd_status_name(st));
    CHECK(t, strstr(spmd_last_error(), "mismatch") != NULL, "message: %s", spmd_last_error());
    if (rank == 0)
        st = g->ops->broadcast(g, rank, buf, 4, 0);
    else
        st = g->ops->all_reduce(g, rank, buf, 1, COLL_F32);
    CHECK(t, st == SPMD_ERR_INTERNAL, "broadcast vs all_reduce gave %s", spmd_status_name(st));
    /* The same sizes of another element type: a mismatch too, named. */
    st = g->ops->all_reduce(g, rank, buf, 4, rank == 1 ? COLL_BF16 : COLL_F32);
    CHECK(t, st == SPMD_ERR_INTERNAL, "f32 vs bf16 all_reduce gave %s", spmd_status_name(st));
    CHECK(t, strstr(spmd_last_error(), "all_reduce (bf16)") != NULL, "message: %s",
          spmd_last_error());
    check_all_reduce(t, g, &gr, rank, 1001, 7);
    check_permute(t, g, &gr, rank, 9, -1, 8);
}

static void test_mismatch(void **state)
{
    (void)state;
    coll_world *w = coll_shm_world_create(3, NULL);
    assert_non_null(w);
    run_team(3, w, body_mismatch, NULL);
    coll_world_free(w);
}

/* ---- Allocation through the hook --------------------------------------------------- */

static void test_allocator(void **state)
{
    (void)state;
    test_alloc c;
    spmd_allocator a = test_alloc_init(&c, -1);
    coll_world *w = coll_shm_world_create(4, &a);
    assert_non_null(w);
    int r[] = {0, 1, 2, 3};
    assert_non_null(coll_world_group(w, 4, r));
    assert_non_null(coll_world_group(w, 2, r + 2));
    assert_true(atomic_load(&c.allocs) >= 3);
    coll_world_free(w);
    assert_int_equal(atomic_load(&c.allocs), atomic_load(&c.frees));

    /* Failing allocations: NULL with a message, nothing leaked. */
    for (long left = 0; left < 4; left++) {
        test_alloc_set_budget(&c, left);
        spmd_clear_error();
        w = coll_shm_world_create(4, &a);
        if (w) {
            coll_group *g = coll_world_group(w, 4, r);
            if (!g) assert_non_null(strstr(spmd_last_error(), "out of memory"));
            coll_world_free(w);
        } else {
            assert_non_null(strstr(spmd_last_error(), "out of memory"));
        }
        assert_int_equal(atomic_load(&c.allocs), atomic_load(&c.frees));
    }
}

/* ---- Abort ------------------------------------------------------------------------ */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct abort_state {
    _Atomic double aborted_at;
    double returned_at[MAX_THREADS];
} abort_state;

/* Device 0 never joins: devices 1, 2 wait in group {0, 1, 2} and devices
 * 3, 4 in group {0, 3, 4}, asleep by the time device 0 aborts. */
static void body_blocked(team *t, int rank)
{
    abort_state *as = t->arg;
    grp a = {.size = 3, .ranks = {0, 1, 2}}, b = {.size = 3, .ranks = {0, 3, 4}};
    coll_group *ga = get_group(t, &a), *gb = get_group(t, &b);
    if (!ga || !gb) return;
    if (rank == 0) {
        struct timespec nap = {0, 200 * 1000 * 1000};
        nanosleep(&nap, NULL);
        atomic_store(&as->aborted_at, now_s());
        coll_world_abort(t->w, "device 0 failed");
        coll_world_abort(t->w, "a later abort keeps the first message");
        CHECK(t, coll_world_aborted(t->w), "not aborted");
        return;
    }
    float buf[1000] = {0};
    coll_group *g = rank <= 2 ? ga : gb;
    spmd_status st = g->ops->all_reduce(g, rank <= 2 ? rank : rank - 2, buf, 1000, COLL_F32);
    as->returned_at[rank] = now_s();
    CHECK(t, st == SPMD_ERR_BACKEND, "blocked all_reduce gave %s", spmd_status_name(st));
    CHECK(t, !strcmp(spmd_last_error(), "collective aborted: device 0 failed"), "message: %s",
          spmd_last_error());
    /* Later calls fail at once, in any group, even a group of one. */
    st = g->ops->broadcast(g, rank <= 2 ? rank : rank - 2, buf, 4, 0);
    CHECK(t, st == SPMD_ERR_BACKEND, "broadcast after abort gave %s", spmd_status_name(st));
    grp self = {.size = 1, .ranks = {rank}};
    coll_group *gs = get_group(t, &self);
    if (gs) {
        st = gs->ops->all_reduce(gs, 0, buf, 3, COLL_F32);
        CHECK(t, st == SPMD_ERR_BACKEND, "group of one after abort gave %s",
              spmd_status_name(st));
    }
}

static void body_after_reset(team *t, int rank)
{
    grp a = {.size = 3, .ranks = {0, 1, 2}}, b = {.size = 3, .ranks = {0, 3, 4}};
    grp gw = whole_world(t->n), self = {.size = 1, .ranks = {rank}};
    coll_group *ga = get_group(t, &a), *gb = get_group(t, &b), *gs = get_group(t, &self);
    if (!ga || !gb || !gs) return;
    if (rank <= 2) check_all_reduce(t, ga, &a, rank, 1001, 1);
    if (rank == 0 || rank >= 3) check_all_reduce(t, gb, &b, rank ? rank - 2 : 0, 77, 2);
    run_suite(t, &gw, rank);
    check_all_reduce(t, gs, &self, 0, 5, 3);
}

static void test_abort_wakes_blocked(void **state)
{
    (void)state;
    coll_world *w = coll_shm_world_create(5, NULL);
    assert_non_null(w);
    abort_state as;
    memset(&as, 0, sizeof as);
    atomic_init(&as.aborted_at, 0.0);
    run_team(5, w, body_blocked, &as);
    double slowest = 0;
    for (int r = 1; r < 5; r++) {
        double dt = as.returned_at[r] - atomic_load(&as.aborted_at);
        assert_true(dt >= 0);
        if (dt > slowest) slowest = dt;
    }
    print_message("slowest wake after abort: %.3f ms\n", slowest * 1e3);
    assert_true(slowest < 2.0); /* promptly, even under a sanitizer */
    assert_true(coll_world_aborted(w));
    coll_world_reset(w);
    assert_false(coll_world_aborted(w));
    run_team(5, w, body_after_reset, NULL);
    coll_world_free(w);
}

/* After a reset the world works again, the watchdog still on. */
static void body_after_watch(team *t, int rank)
{
    grp gw = whole_world(t->n);
    run_suite(t, &gw, rank);
}
/* ---- The watchdog ------------------------------------------------------------------- */

enum { WATCH_S = 1 };

typedef struct watch_state {
    double began, returned_at[MAX_THREADS];
    spmd_status st[MAX_THREADS];
    char message[MAX_THREADS][512];
} watch_state;

/* Device 3 never arrives (as if stuck computing): devices 1 and 2 wait
 * for it in {1, 2, 3}; device 0 waits in {0, 1} for device 1, which is
 * itself waiting, live: device 0's watchdog leaves the blame to theirs. */
static void body_stalled(team *t, int rank)
{
    watch_state *ws = t->arg;
    grp a = {.size = 2, .ranks = {0, 1}}, b = {.size = 3, .ranks = {1, 2, 3}};
    coll_group *ga = get_group(t, &a), *gb = get_group(t, &b);
    if (!ga || !gb || rank == 3) return;
    float buf[64] = {0};
    spmd_status st = rank == 0 ? ga->ops->all_reduce(ga, 0, buf, 64, COLL_F32)
                               : gb->ops->all_reduce(gb, rank - 1, buf, 64, COLL_F32);
    ws->returned_at[rank] = now_s();
    ws->st[rank] = st;
    snprintf(ws->message[rank], sizeof ws->message[rank], "%s", spmd_last_error());
    /* Device 1 then owes device 0 the call on {0, 1}: it fails at once. */
    if (rank == 1) {
        st = ga->ops->all_reduce(ga, 1, buf, 64, COLL_F32);
        CHECK(t, st == SPMD_ERR_BACKEND, "a call after the timeout gave %s",
              spmd_status_name(st));
    }
}

static void test_watchdog_names_missing(void **state)
{
    (void)state;
    coll_world *w = coll_shm_world_create(4, NULL);
    assert_non_null(w);
    assert_int_equal(coll_world_timeout_ns(w), (int64_t)SPMD_COLLECTIVE_TIMEOUT_S * 1000000000);
    coll_world_set_timeout(w, -1);
    assert_int_equal(coll_world_timeout_ns(w), 0);
    coll_world_set_timeout(w, WATCH_S);
    watch_state ws;
    memset(&ws, 0, sizeof ws);
    ws.began = now_s();
    run_team(4, w, body_stalled, &ws);
    /* Every waiting thread came back: the one whose watchdog fired with
     * the timeout, the others with the abort it caused. */
    int fired = -1;
    for (int r = 0; r < 3; r++) {
        double dt = ws.returned_at[r] - ws.began;
        print_message("device %d after %.2f s: %s: %s\n", r, dt, spmd_status_name(ws.st[r]),
                      ws.message[r]);
        assert_true(dt >= WATCH_S * 0.99);
        assert_true(dt < WATCH_S + 60); /* the bound, with a loaded machine's slack */
        /* Whoever reports, the device waited for is device 3. */
        if (!strstr(ws.message[r], "for device 3 (member 2), which had not arrived"))
            fail_msg("device %d does not name device 3: %s", r, ws.message[r]);
        if (ws.st[r] == SPMD_ERR_TIMEOUT) {
            assert_int_equal(fired, -1);
            fired = r;
            assert_true(r == 1 || r == 2);
            assert_non_null(strstr(ws.message[r], "collective timeout: all_reduce: device "));
            assert_non_null(strstr(ws.message[r], " of 3) waited "));
        } else {
            assert_int_equal(ws.st[r], SPMD_ERR_BACKEND);
            assert_non_null(strstr(ws.message[r], "collective aborted: collective timeout: "));
        }
    }
    assert_int_not_equal(fired, -1);
    assert_true(coll_world_aborted(w));
    coll_world_reset(w);
    run_team(4, w, body_after_watch, NULL);
    coll_world_free(w);
}

/* Members arrive a second apart, 4 s in all, under a 3 s limit: every
 * arrival is progress, so nobody's watchdog fires. */
static void body_staggered(team *t, int rank)
{
    watch_state *ws = t->arg;
    grp gw = whole_world(t->n);
    coll_group *g = get_group(t, &gw);
    if (!g) return;
    struct timespec until;
    double at = ws->began + rank * 1.0;
    until.tv_sec = (time_t)at;
    until.tv_nsec = (long)((at - (double)until.tv_sec) * 1e9);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, NULL) != 0) {}
    check_all_reduce(t, g, &gw, rank, 1001, 7);
    ws->returned_at[rank] = now_s();
}

static void test_watchdog_counts_progress(void **state)
{
    (void)state;
    coll_world *w = coll_shm_world_create(5, NULL);
    assert_non_null(w);
    coll_world_set_timeout(w, 3);
    watch_state ws;
    memset(&ws, 0, sizeof ws);
    ws.began = now_s();
    run_team(5, w, body_staggered, &ws);
    double waited = ws.returned_at[0] - ws.began;
    print_message("device 0 waited %.2f s in one all_reduce under a 3 s limit\n", waited);
    assert_true(waited > 3); /* longer than the limit in all */
    assert_false(coll_world_aborted(w));
    coll_world_free(w);
}

/* Abort at an arbitrary moment while every device loops over collectives:
 * each barrier either opened before the abort, for every member, or never
 * opens, so every device must complete the same number of calls, and no
 * device may leave a call while a peer reads its buffer (the buffer is
 * scribbled on at once after an error, which the checks or ASan catch). */
typedef struct storm {
    int aborter;        /* device that aborts, or -1 for the main thread */
    int abort_after;    /* calls before the device aborts */
    long done[MAX_THREADS];
} storm;

static void body_storm(team *t, int rank)
{
    storm *s = t->arg;
    grp gr = whole_world(t->n);
    coll_group *g = get_group(t, &gr);
    if (!g) return;
    int n = t->n;
    enum { COUNT = 4099 };
    float *buf = xmalloc(sizeof *buf * COUNT);
    float *gathered = xmalloc(sizeof *gathered * COUNT * (size_t)n);
    long k = 0;
    for (;; k++) {
        if (rank == s->aborter && k == s->abort_after) coll_world_abort(t->w, "storm");
        spmd_status st;
        if (k % 2 == 0) {
            for (int64_t i = 0; i < COUNT; i++) buf[i] = fval(rank, i, (int)k);
            st = g->ops->all_reduce(g, rank, buf, COUNT, COLL_F32);
            if (st == SPMD_OK && memcmp(&buf[COUNT - 1], &(float){ref_sum(&gr, COUNT - 1, (int)k)},
                                        sizeof(float)) != 0)
                team_fail(t, __LINE__, "storm: wrong all_reduce at call %ld", k);
        } else {
            for (int64_t i = 0; i < COUNT; i++) buf[i] = (float)(rank * 100000 + i);
            st = g->ops->all_gather(g, rank, buf, gathered, 1, sizeof *buf * COUNT);
            if (st == SPMD_OK)
                for (int j = 0; j < n; j++)
                    if (gathered[(size_t)j * COUNT + 17] != (float)(j * 100000 + 17))
                        team_fail(t, __LINE__, "storm: wrong all_gather at call %ld", k);
        }
        if (st != SPMD_OK) {
            CHECK(t, st == SPMD_ERR_BACKEND, "storm: %s", spmd_status_name(st));
            memset(buf, 0xFF, sizeof *buf * COUNT);
            break;
        }
    }
    free(buf);
    free(gathered);
    s->done[rank] = k;
}

typedef struct storm_run {
    int n;
    coll_world *w;
    storm *s;
    int failures;
    char first[512];
} storm_run;

static void *storm_team(void *p)
{
    storm_run *r = p;
    r->failures = run_team_quiet(r->n, r->w, body_storm, r->s, r->first, sizeof r->first);
    return NULL;
}

static void test_abort_storm(void **state)
{
    (void)state;
    static const int sizes[] = {2, 4, 8, 16};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        int n = sizes[i];
        coll_world *w = coll_shm_world_create(n, NULL);
        assert_non_null(w);
        long calls[4];
        for (int round = 0; round < 4; round++) {
            storm s;
            memset(&s, 0, sizeof s);
            if (round < 3) {
                s.aborter = (round * 5) % n;
                s.abort_after = 3 + round * 17;
                run_team(n, w, body_storm, &s);
            } else {
                /* From outside the team, at whatever point it has reached. */
                s.aborter = -1;
                storm_run r = {.n = n, .w = w, .s = &s};
                pthread_t tid;
                assert_int_equal(pthread_create(&tid, NULL, storm_team, &r), 0);
                struct timespec nap = {0, 30 * 1000 * 1000};
                nanosleep(&nap, NULL);
                coll_world_abort(w, "from outside");
                pthread_join(tid, NULL);
                if (r.failures) fail_msg("%d failed checks, first: %s", r.failures, r.first);
            }
            for (int r = 1; r < n; r++)
                if (s.done[r] != s.done[0])
                    fail_msg("n=%d round %d: device 0 completed %ld calls, device %d %ld", n,
                             round, s.done[0], r, s.done[r]);
            calls[round] = s.done[0];
            assert_true(coll_world_aborted(w));
            coll_world_reset(w);
            run_team(n, w, body_world_suite, NULL);
        }
        print_message("%2d devices: calls completed before the aborts: %ld, %ld, %ld, %ld\n", n,
                      calls[0], calls[1], calls[2], calls[3]);
        coll_world_free(w);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_tree_order, arm_alarm, disarm_alarm),
        cmocka_unit_test_setup_teardown(test_groups, arm_alarm, disarm_alarm),
        cmocka_unit_test_setup_teardown(test_big_world_setup_is_linear, arm_alarm, disarm_alarm),
        cmocka_unit_test_setup_teardown(test_allocator, arm_alarm, disarm_alarm),
        cmocka_unit_test_setup_teardown(test_world_sizes, arm_alarm, disarm_alarm),
        cmocka_unit_test_setup_teardown(test_mesh_4x2, arm_alarm, disarm_alarm),
        cmocka_unit_test_setup_teardown(test_repeated, arm_alarm, disarm_alarm),
        cmocka_unit_test_setup_teardown(test_mismatch, arm_alarm, disarm_alarm),
        cmocka_unit_test_setup_teardown(test_abort_wakes_blocked, arm_alarm, disarm_alarm),
        cmocka_unit_test_setup_teardown(test_abort_storm, arm_alarm, disarm_alarm),
        cmocka_unit_test_setup_teardown(test_watchdog_names_missing, arm_alarm, disarm_alarm),
        cmocka_unit_test_setup_teardown(test_watchdog_counts_progress, arm_alarm, disarm_alarm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
