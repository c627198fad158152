/*
 * A fused group of elementwise nodes (compile/fuse.h) in one pass: each
 * thread takes its elements of the root in blocks (fusion_block) and, per
 * block, computes every member in order into its scratch (the root into
 * the output; a stored member also to its memory), so the members'
 * values never leave the cache.  Each member
 * computes each element with its op's formula, the function its own
 * kernel calls (kernels_ops.h), so the bits are the unfused program's.
 */
#include "compile/fuse.h"
#include "runtime/kernels/kernels_ops.h"
#include "runtime/wait.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/resource.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

/* FUSED_STREAM: a group over at least this many elements writes its
 * root and stored members past the cache (stream_block): 4 MiB or more
 * each, they are not read again before other memory has evicted them,
 * and a plain store would first read every line it fills, a third more
 * memory traffic for the update.  So does an update (a group of
 * TUNE_MIN_MEMBERS or more: AdamW's new parameter and moments, which
 * nothing reads again in the step) from FUSE_LARGE elements: a device's
 * ZeRO slice is 1/n of a parameter, and with plain stores the MLP's
 * [512, 1024] slices on 2 'data' took about twice one device's time per
 * element ([1024, 1024] on 2 threads). */
enum { FUSED_ALIGN = 16, FUSED_STREAM = 1 << 20 };

_Static_assert(FUSE_MAX_STORED <= sizeof ((kern_args *)0)->stored / sizeof(void *),
               "kern_args.stored holds every stored member of a group");

/* Operand `src` of a member, elements [at, at + n) of the root, as a
 * pointer: a member's block in scratch, an input read in place, or a
 * broadcast input unrolled into `spare`.  *scalar says a one-element
 * input, whose value is then *value. */
static const float *operand(const kern_args *a, const fuse_group *g, const float *slots, int blk,
                            int src, int64_t at, int64_t n, float *spare, bool *scalar, float *value)
{
    *scalar = false;
    if (src >= 0) return slots + (size_t)src * (size_t)blk;
    int k = -1 - src;
    const float *x = a->in[k];
    int64_t nx = g->in_numel[k];
    if (nx == 1) {
        *scalar = true;
        *value = x[0];
        return NULL;
    }
    if (nx == kn_numel(g->domain)) return x + at;
    /* A trailing block repeated: element i of the root reads i % nx. */
    for (int64_t i = 0, j = at % nx; i < n; i++) {
        spare[i] = x[j];
        if (++j == nx) j = 0;
    }
    return spare;
}

/* One member over n elements: out[i] = its formula (ew_<ENUM>,
 * kernels_ops.h) of x[i] (and y[i], z[i]), a scalar operand broadcast as
 * the binary kernels broadcast it.  The cases come from ops.def's formula
 * column; an op without one is a broken invariant (fusion_build admits
 * only ops with a formula), reported, not skipped.  False then. */
static bool run_step(const kern_args *a, const fuse_step *s, const float *restrict x, bool xs,
                     float xv, const float *restrict y, bool ys, float yv,
                     const float *restrict z, bool zs, float zv, float *restrict out, int64_t n)
{
#define BINARY(F)                                                                              \
    do {                                                                                       \
        if (!xs && !ys)                                                                        \
            for (int64_t i = 0; i < n; i++) out[i] = F(x[i], y[i]);                            \
        else if (!xs)                                                                          \
            for (int64_t i = 0; i < n; i++) out[i] = F(x[i], yv);                              \
        else if (!ys)                                                                          \
            for (int64_t i = 0; i < n; i++) out[i] = F(xv, y[i]);                              \
        else                                                                                   \
            for (int64_t i = 0; i < n; i++) out[i] = F(xv, yv);                                \
    } while (0)
#define TERNARY(F)                                                                             \
    do {                                                                                       \
        for (int64_t i = 0; i < n; i++)                                                        \
            out[i] = F(xs ? xv : x[i], ys ? yv : y[i], zs ? zv : z[i]);                        \
    } while (0)
#define UNARY(F)                                                                               \
    do {                                                                                       \
        for (int64_t i = 0; i < n; i++) out[i] = F(xs ? xv : x[i], c);                         \
    } while (0)
#define FUSED_CASE(op, fn, kind, expr) FUSED_CASE_##kind(op, fn)
#define FUSED_CASE_KN_EW_NONE(op, fn)
#define FUSED_CASE_KN_EW_UNARY(op, fn)                                                         \
    case op: UNARY(fn); return true;
#define FUSED_CASE_KN_EW_BINARY(op, fn)                                                        \
    case op: BINARY(fn); return true;
#define FUSED_CASE_KN_EW_TERNARY(op, fn)                                                       \
    case op: TERNARY(fn); return true;
    const float c = s->c;
    switch (s->op) {
#define OP(e, name, arity, sig, lin, fix, vjp, kern, groups, formula, scratch, kind, bf16)                     \
    FUSED_CASE(IR_##e, ew_##e, formula)
#include "ir/ops.def"
#undef OP
    default:
        kern_fail(a, SPMD_ERR_INTERNAL, "fused kernel: %s has no elementwise formula (ops.def)",
                  ir_op_name(s->op));
        return false;
    }
#undef FUSED_CASE_KN_EW_TERNARY
#undef FUSED_CASE_KN_EW_BINARY
#undef FUSED_CASE_KN_EW_UNARY
#undef FUSED_CASE_KN_EW_NONE
#undef FUSED_CASE
#undef BINARY
#undef TERNARY
#undef UNARY
}

/* n floats from a block in scratch to memory: with non-temporal stores
 * where the CPU has them and dst is 64-byte aligned (kern_fused fences
 * once after its last block), else a copy. */
static void stream_block(float *restrict dst, const float *restrict src, int64_t n, bool stream)
{
#if defined(__AVX512F__)
    if (stream && ((uintptr_t)dst & 63) == 0) {
        int64_t i = 0;
        for (; i + 16 <= n; i += 16) _mm512_stream_ps(dst + i, _mm512_loadu_ps(src + i));
        memcpy(dst + i, src + i, (size_t)(n - i) * sizeof *dst);
        return;
    }
#endif
    (void)stream;
    memcpy(dst, src, (size_t)n * sizeof *dst);
}

/*
 * The block of a large group (fusion_block's FUSE_BLOCK_LARGE, the
 * scratch's size, or FUSE_BLOCK), chosen by measuring both in this
 * process: which is faster depends on the CPU (on the AMD EPYC the larger
 * blocks made the AdamW update faster, fewer calls per element; on the
 * AMX Xeon the smaller, whose 15-odd member blocks stay in its L1, made it
 * 25% faster).  Calls that cover enough elements on their thread are
 * timed (per element and member), each size in turn, until each has
 * TUNE_SAMPLES; a call that took a page fault (a buffer's first touch, in
 * the first steps) is not counted.  The size with the lower median is
 * kept.  Every element is computed by the same formula whatever the
 * block, so the bits never depend on the choice, only the time.
 */
enum { TUNE_SAMPLES = 8, TUNE_MIN_ELEMENTS = FUSE_LARGE / 4, TUNE_MIN_MEMBERS = 8 };
static const int tune_blocks[2] = {FUSE_BLOCK_LARGE, FUSE_BLOCK};
static atomic_int tune_tries, tune_filled, tune_choice; /* choice: 0 undecided */
static atomic_int tune_claimed[2];
static _Atomic int64_t tune_ps[2][TUNE_SAMPLES]; /* picoseconds per element-member */

static int cmp_i64(const void *x, const void *y)
{
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return (a > b) - (a < b);
}

static void tune_decide(void)
{
    int64_t med[2];
    for (int c = 0; c < 2; c++) {
        int64_t v[TUNE_SAMPLES];
        for (int i = 0; i < TUNE_SAMPLES; i++)
            v[i] = atomic_load_explicit(&tune_ps[c][i], memory_order_relaxed);
        qsort(v, TUNE_SAMPLES, sizeof v[0], cmp_i64);
        med[c] = v[TUNE_SAMPLES / 2];
    }
    atomic_store(&tune_choice, med[1] < med[0] ? tune_blocks[1] : tune_blocks[0]);
}

static int64_t page_faults(void)
{
    struct rusage u;
    return getrusage(RUSAGE_THREAD, &u) == 0 ? (int64_t)u.ru_minflt + u.ru_majflt : -1;
}

typedef struct tune_sample {
    int which; /* index into tune_blocks, -1: not sampled */
    int64_t ns, faults;
} tune_sample;

void kern_fused_set_block(int elements)
{
    atomic_store(&tune_choice, 0);
    atomic_store(&tune_tries, 0);
    atomic_store(&tune_filled, 0);
    atomic_store(&tune_claimed[0], 0);
    atomic_store(&tune_claimed[1], 0);
    if (elements == FUSE_BLOCK || elements == FUSE_BLOCK_LARGE) atomic_store(&tune_choice, elements);
}

/* The block for a call over n elements of a large group; a sampled call
 * starts its clock in *t. */
static int tune_block(int64_t n, tune_sample *t)
{
    t->which = -1;
    int chosen = atomic_load_explicit(&tune_choice, memory_order_relaxed);
    if (chosen) return chosen;
    if (n < TUNE_MIN_ELEMENTS) return tune_blocks[0];
    int c = atomic_fetch_add(&tune_tries, 1) % 2;
    if (atomic_load(&tune_claimed[c]) >= TUNE_SAMPLES) c = 1 - c;
    if (atomic_load(&tune_claimed[c]) >= TUNE_SAMPLES) return tune_blocks[0]; /* deciding */
    t->which = c;
    t->faults = page_faults();
    t->ns = rt_wait_now_ns();
    return tune_blocks[c];
}

static void tune_record(const tune_sample *t, int64_t n, int members)
{
    if (t->which < 0) return;
    int64_t ns = rt_wait_now_ns() - t->ns;
    if (t->faults < 0 || page_faults() != t->faults) return;
    int slot = atomic_fetch_add(&tune_claimed[t->which], 1);
    if (slot >= TUNE_SAMPLES) return;
    atomic_store_explicit(&tune_ps[t->which][slot], ns * 1000 / (n * (members > 0 ? members : 1)),
                          memory_order_relaxed);
    if (atomic_fetch_add(&tune_filled, 1) + 1 == 2 * TUNE_SAMPLES) tune_decide();
}

/* Member k over elements [at, at + n) of the domain into o (and its
 * stored memory, streamed when `stream`); false when it failed the step. */
static bool fused_member(const kern_args *a, const fuse_group *g, int k, const float *slots,
                         int blk, float *spare, float *o, int64_t at, int64_t n, bool stream)
{
    const fuse_step *s = &g->steps[k];
    bool xs = false, ys = false, zs = false;
    float xv = 0, yv = 0, zv = 0;
    int arity = ir_op_formula_arity(s->op);
    const float *x = operand(a, g, slots, blk, s->src[0], at, n, spare, &xs, &xv);
    const float *y = arity >= 2 ? operand(a, g, slots, blk, s->src[1], at, n, spare + blk, &ys, &yv)
                                : NULL;
    const float *z = arity >= 3 ? operand(a, g, slots, blk, s->src[2], at, n, spare + 2 * blk, &zs, &zv)
                                : NULL;
    if (!run_step(a, s, x, xs, xv, y, ys, yv, z, zs, zv, o, n)) return false;
    if (s->stored >= 0) stream_block((float *)a->stored[s->stored] + at, o, n, stream);
    return true;
}

void kern_fused(const kern_args *a)
{
    const fuse_group *g = a->fused;
    int64_t b, e;
    /* A sum root: thread 0 takes every element, as kern_sum reduces to one
     * value; blocks of a multiple of KN_LANES elements keep each
     * element in the lane kern_sum adds it to, so the sum has its bits. */
    _Static_assert(FUSE_BLOCK % KN_LANES == 0 && FUSE_BLOCK_LARGE % KN_LANES == 0,
                   "a sum's blocks keep kern_sum's lanes");
    const int64_t numel = kn_numel(g->domain);
    const bool stream = !g->sum && (numel >= FUSED_STREAM ||
                                    (g->n_steps >= TUNE_MIN_MEMBERS && numel >= FUSE_LARGE));
    if (g->sum) b = 0, e = a->ith == 0 ? kn_numel(g->domain) : 0;
    else kern_split(kn_numel(g->domain), a->ith, a->nth, FUSED_ALIGN, &b, &e);
    /* A large group's block is measured (tune_block); a sum's stays. */
    tune_sample sample = {.which = -1};
    const int blk = !g->sum && fusion_block(g) == FUSE_BLOCK_LARGE && g->n_steps >= TUNE_MIN_MEMBERS
                        ? tune_block(e - b, &sample)
                        : fusion_block(g);
    double acc[KN_LANES] = {0};
    float *slots = a->scratch;
    float *spare = slots + (size_t)g->n_steps * (size_t)blk;
    float *out = a->out;
    for (int64_t at = b; at < e; at += blk) {
        int64_t n = kn_min(blk, e - at);
        if (g->sum) {
            const int last = g->n_steps - 1; /* the sum; the members before it */
            for (int k = 0; k < last; k++)
                if (!fused_member(a, g, k, slots, blk, spare, slots + (size_t)k * (size_t)blk, at, n, false))
                    return;
            kn_lanes_add(acc, slots + (size_t)g->steps[last].src[0] * (size_t)blk, n);
            continue;
        }
        for (int k = 0; k < g->n_steps; k++) {
            /* A streamed root goes through its own block in scratch. */
            bool root = k == g->n_steps - 1;
            float *o = root && !stream ? out + at : slots + (size_t)k * (size_t)blk;
            if (!fused_member(a, g, k, slots, blk, spare, o, at, n, stream)) {
                at = e; /* failed: no more blocks, but the fence below */
                break;
            }
            if (root && stream) stream_block(out + at, o, n, true);
        }
    }
#if defined(__AVX512F__)
    /* Non-temporal stores are weakly ordered: done before the barrier
     * after which other threads and devices read them. */
    if (stream) _mm_sfence();
#endif
    tune_record(&sample, e - b, g->n_steps);
    /* kern_sum's division by the one element count it reduces into. */
    if (g->sum && a->ith == 0) out[0] = (float)(kn_lanes_total(acc) / 1.0);
}
