/*
 * Layout kernels: reshape (a contiguous copy), permute, slice, pad, concat.
 * They move raw elements of any dtype (i32 ids get sliced and reshaped
 * too), so they work on bytes with the node's element size.
 *
 * slice, pad, concat and reshape are one pattern: seen around the axis as
 * [outer, width], each output row is a few contiguous runs taken from
 * inputs (one per input) with zeros between them.  Threads split the
 * output elements in runs of 16 (64 bytes for f32).
 */
#include "runtime/kernels/kernels_ops.h"

#include <string.h>

enum { LAYOUT_ALIGN = 16 };

/* Output columns [col0, col0 + len) of row r come from src + r * stride
 * (all in elements). */
typedef struct piece {
    int64_t col0, len;
    const char *src;
    int64_t stride;
} piece;

/* Output elements [e0, e1) of rows of `width` elements made of pieces
 * (sorted by col0, disjoint) and zeros elsewhere. */
static void copy_pieces(char *out, int64_t width, const piece *pc, int np, size_t es,
                        int64_t e0, int64_t e1)
{
    if (width <= 0) return;
    for (int64_t i = e0; i < e1;) {
        const int64_t row = i / width, lo = i % width;
        const int64_t hi = kn_min(width, lo + (e1 - i)); /* columns [lo, hi) */
        char *orow = out + (size_t)(row * width) * es;
        int64_t c = lo;
        for (int k = 0; k < np && c < hi; k++) {
            const int64_t p0 = kn_max_i(pc[k].col0, c), p1 = kn_min(pc[k].col0 + pc[k].len, hi);
            if (p1 <= p0) continue;
            if (p0 > c) memset(orow + (size_t)c * es, 0, (size_t)(p0 - c) * es);
            memcpy(orow + (size_t)p0 * es,
                   pc[k].src + (size_t)(row * pc[k].stride + (p0 - pc[k].col0)) * es,
                   (size_t)(p1 - p0) * es);
            c = p1;
        }
        if (c < hi) memset(orow + (size_t)c * es, 0, (size_t)(hi - c) * es);
        i += hi - lo;
    }
}

/* x viewed as [outer, dims[axis], inner]. */
static void around_axis(const spmd_tensor *x, int axis, int64_t *outer, int64_t *inner)
{
    *outer = kn_numel_dims(x->dims, axis);
    *inner = kn_numel_dims(x->dims + axis + 1, x->rank - axis - 1);
}

static void run_pieces(const kern_args *a, int64_t width, const piece *pc, int np)
{
    const spmd_tensor *t = a->node;
    int64_t b, e;
    kern_split(kn_numel(t), a->ith, a->nth, LAYOUT_ALIGN, &b, &e);
    copy_pieces(a->out, width, pc, np, kn_elsize(t->dtype), b, e);
}

/* x [..] -> out [..] with the same number of elements. */
void kern_reshape(const kern_args *a)
{
    const int64_t n = kn_numel(a->node);
    const piece pc = {0, n, a->in[0], 0};
    run_pieces(a, n, &pc, 1);
}

/* x [.., L, ..] -> out [.., len, ..] = x[.., start:start+len, ..] on
 * attr.slice.axis. */
void kern_slice(const kern_args *a)
{
    const spmd_tensor *t = a->node;
    const int axis = t->attr.slice.axis;
    int64_t outer, inner;
    around_axis(t->in[0], axis, &outer, &inner);
    const int64_t L = t->in[0]->dims[axis];
    const size_t es = kn_elsize(t->dtype);
    const int64_t width = t->attr.slice.len * inner;
    const piece pc = {0, width, (const char *)a->in[0] + (size_t)(t->attr.slice.start * inner) * es,
                      L * inner};
    run_pieces(a, width, &pc, 1);
}

/* x [.., L, ..] -> out [.., total, ..]: zeros with x at [start, start+L)
 * on attr.pad.axis (the adjoint of slice). */
void kern_pad(const kern_args *a)
{
    const spmd_tensor *t = a->node;
    const int axis = t->attr.pad.axis;
    int64_t outer, inner;
    around_axis(t->in[0], axis, &outer, &inner);
    const int64_t L = t->in[0]->dims[axis];
    const piece pc = {t->attr.pad.start * inner, L * inner, a->in[0], L * inner};
    run_pieces(a, t->attr.pad.total * inner, &pc, 1);
}

/* (x0 [.., L0, ..], x1 [.., L1, ..], ...) -> out [.., L0+L1+..., ..] on
 * attr.concat.axis. */
void kern_concat(const kern_args *a)
{
    const spmd_tensor *t = a->node;
    const int axis = t->attr.concat.axis;
    int64_t outer, inner;
    around_axis(t, axis, &outer, &inner);
    piece pc[IR_MAX_INPUTS];
    int64_t col = 0;
    for (int i = 0; i < t->n_in; i++) {
        const int64_t w = t->in[i]->dims[axis] * inner;
        pc[i] = (piece){col, w, a->in[i], w};
        col += w;
    }
    run_pieces(a, col, pc, t->n_in);
}

/* x [..] -> out [..], out dim i = x dim attr.permute.perm[i].  Output dims
 * of size 1 are dropped and dims that stay adjacent in x are merged, so a
 * permute that keeps the last dim copies whole runs; otherwise the inner
 * loop gathers with a stride. */
void kern_permute(const kern_args *a)
{
    const spmd_tensor *t = a->node;
    const spmd_tensor *x = t->in[0];
    const int r = t->rank;
    int64_t xs[SPMD_MAX_RANK];
    int64_t s = 1;
    for (int i = r - 1; i >= 0; i--) {
        xs[i] = s;
        s *= x->dims[i];
    }
    int64_t dims[SPMD_MAX_RANK], st[SPMD_MAX_RANK];
    int n = 0;
    for (int i = 0; i < r; i++) {
        const int64_t d = t->dims[i], si = xs[t->attr.permute.perm[i]];
        if (d == 1) continue;
        if (n > 0 && st[n - 1] == si * d) {
            dims[n - 1] *= d;
            st[n - 1] = si;
            continue;
        }
        dims[n] = d;
        st[n] = si;
        n++;
    }
    if (n == 0) {
        dims[0] = 1;
        st[0] = 1;
        n = 1;
    }
    const size_t es = kn_elsize(t->dtype);
    const int64_t len = dims[n - 1], step = st[n - 1];
    int64_t b, e;
    kern_split(kn_numel(t), a->ith, a->nth, LAYOUT_ALIGN, &b, &e);
    const char *in = a->in[0];
    char *out = a->out;
    for (int64_t i = b; i < e;) {
        int64_t row = i / len, col = i % len;
        const int64_t cnt = kn_min(len - col, e - i);
        int64_t off = col * step;
        for (int k = n - 2; k >= 0; k--) {
            off += (row % dims[k]) * st[k];
            row /= dims[k];
        }
        if (step == 1) {
            memcpy(out + (size_t)i * es, in + (size_t)off * es, (size_t)cnt * es);
        } else if (es == 4) {
            const uint32_t *restrict src = (const uint32_t *)in + off;
            uint32_t *restrict dst = (uint32_t *)out + i;
            for (int64_t j = 0; j < cnt; j++) dst[j] = src[j * step];
        } else {
            const uint16_t *restrict src = (const uint16_t *)in + off;
            uint16_t *restrict dst = (uint16_t *)out + i;
            for (int64_t j = 0; j < cnt; j++) dst[j] = src[j * step];
        }
        i += cnt;
    }
}
