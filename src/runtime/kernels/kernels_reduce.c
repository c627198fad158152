/*
 * Reductions: sum and mean over a set of axes, max over one axis and its
 * backward, the cumulative sum along one axis.  Each output element is reduced by exactly one thread in a
 * fixed order (double accumulators), so results do not depend on nth; a
 * reduction to one scalar therefore runs on one thread, which is fine for
 * the small scalars a training step reduces.
 */
#include "runtime/kernels/kernels_ops.h"

#include <math.h>
#include <string.h>

/* Columns one thread accumulates at a time in a column-wise reduction. */
enum { RED_CHUNK = 256 };

/* ---- sum, mean -------------------------------------------------------------- */

/*
 * x's dims are regrouped: size-1 dims dropped, runs of neighbouring dims
 * that are all reduced or all kept merged.  What is left alternates between
 * kept and reduced groups and has two shapes of inner loop:
 *   - the last group is reduced (e.g. sum over rows' last dim): each output
 *     is a sum of contiguous runs, added into 8 double lanes;
 *   - the last group is kept (e.g. a bias gradient, sum over [M] of
 *     [M, N]): a chunk of output columns accumulates whole rows of x, which
 *     vectorises across columns.
 */
typedef struct red_plan {
    int nk, nr;                           /* kept, reduced groups */
    int64_t kd[SPMD_MAX_RANK], ks[SPMD_MAX_RANK]; /* kept sizes, x strides */
    int64_t rd[SPMD_MAX_RANK], rs[SPMD_MAX_RANK]; /* reduced sizes, x strides */
    bool last_reduced;
    int64_t inner;                        /* size of the last group */
    int64_t n_out, n_red;                 /* outputs, elements per output */
} red_plan;

static void red_plan_make(const spmd_tensor *x, uint32_t axes, red_plan *p)
{
    int64_t gd[SPMD_MAX_RANK];
    bool gr[SPMD_MAX_RANK];
    int ng = 0;
    int64_t n_red = 1;
    for (int i = 0; i < x->rank; i++) {
        bool r = (axes >> i) & 1u;
        if (r) n_red *= x->dims[i];
        if (x->dims[i] == 1) continue;
        if (ng > 0 && gr[ng - 1] == r) {
            gd[ng - 1] *= x->dims[i];
        } else {
            gd[ng] = x->dims[i];
            gr[ng] = r;
            ng++;
        }
    }
    p->n_red = n_red;
    p->nk = p->nr = 0;
    int64_t stride = 1;
    for (int g = ng - 1; g >= 0; g--) {
        if (gr[g]) {
            p->rd[p->nr] = gd[g];
            p->rs[p->nr++] = stride;
        } else {
            p->kd[p->nk] = gd[g];
            p->ks[p->nk++] = stride;
        }
        stride *= gd[g];
    }
    /* Groups were collected innermost first; flip to outermost first. */
    for (int i = 0; i < p->nk / 2; i++) {
        int64_t t = p->kd[i]; p->kd[i] = p->kd[p->nk - 1 - i]; p->kd[p->nk - 1 - i] = t;
        t = p->ks[i]; p->ks[i] = p->ks[p->nk - 1 - i]; p->ks[p->nk - 1 - i] = t;
    }
    for (int i = 0; i < p->nr / 2; i++) {
        int64_t t = p->rd[i]; p->rd[i] = p->rd[p->nr - 1 - i]; p->rd[p->nr - 1 - i] = t;
        t = p->rs[i]; p->rs[i] = p->rs[p->nr - 1 - i]; p->rs[p->nr - 1 - i] = t;
    }
    p->last_reduced = ng == 0 || gr[ng - 1];
    p->inner = ng == 0 ? 1 : gd[ng - 1];
    p->n_out = kn_numel_dims(p->kd, p->nk);
}

/* Offset in x of multi-index number i over dims d[0..n) with strides s. */
static inline int64_t red_offset(const int64_t *d, const int64_t *s, int n, int64_t i)
{
    int64_t off = 0;
    for (int k = n - 1; k >= 0; k--) {
        off += (i % d[k]) * s[k];
        i /= d[k];
    }
    return off;
}

/* The mean divides the double total before rounding, so it is as exact
 * as the sum. */
static void reduce_sum(const kern_args *a, uint32_t axes, bool mean)
{
    const spmd_tensor *t = a->node;
    red_plan p;
    red_plan_make(t->in[0], axes, &p);
    if (p.n_out == 0) return;
    const float *x = a->in[0];
    float *out = a->out;
    const double div = mean ? (double)p.n_red : 1.0;

    if (p.last_reduced) {
        /* Outputs o: kept groups index o; reduced groups but the last
         * index the contiguous runs of length `inner`. */
        const int nouter = p.nr > 0 ? p.nr - 1 : 0;
        const int64_t runs = kn_numel_dims(p.rd, nouter);
        const int64_t len = p.nr > 0 ? p.inner : 1;
        int64_t b, e;
        kern_split(p.n_out, a->ith, a->nth, 16, &b, &e);
        for (int64_t o = b; o < e; o++) {
            int64_t base = red_offset(p.kd, p.ks, p.nk, o);
            double acc[KN_LANES] = {0};
            for (int64_t r = 0; r < runs; r++)
                kn_lanes_add(acc, x + base + red_offset(p.rd, p.rs, nouter, r), len);
            out[o] = (float)(kn_lanes_total(acc) / div);
        }
        return;
    }

    /* Last group kept: units are (outer output row, chunk of columns). */
    const int64_t cols = p.inner;
    const int64_t chunks = kn_ceil_div(cols, RED_CHUNK);
    const int64_t rows_out = p.n_out / cols;
    const int64_t runs = kn_numel_dims(p.rd, p.nr);
    int64_t b, e;
    kern_split(rows_out * chunks, a->ith, a->nth, 1, &b, &e);
    double acc[RED_CHUNK];
    for (int64_t u = b; u < e; u++) {
        int64_t ro = u / chunks, c0 = (u % chunks) * RED_CHUNK;
        int64_t n = kn_min(RED_CHUNK, cols - c0);
        /* The last kept group is the contiguous columns. */
        int64_t base = red_offset(p.kd, p.ks, p.nk - 1, ro) + c0;
        for (int64_t j = 0; j < n; j++) acc[j] = 0.0;
        for (int64_t r = 0; r < runs; r++) {
            const float *restrict xr = x + base + red_offset(p.rd, p.rs, p.nr, r);
            for (int64_t j = 0; j < n; j++) acc[j] += (double)xr[j];
        }
        float *restrict orow = out + ro * cols + c0;
        for (int64_t j = 0; j < n; j++) orow[j] = (float)(acc[j] / div);
    }
}

/* x [..] -> sum over attr.reduce.axes (bit i = dim i), dims kept as 1 with
 * keepdim (the layout is the same either way). */
void kern_sum(const kern_args *a) { reduce_sum(a, a->node->attr.reduce.axes, false); }

/* As sum, divided by the number of elements reduced (0/0 = NaN when a
 * reduced dim is empty, as in PyTorch). */
void kern_mean(const kern_args *a) { reduce_sum(a, a->node->attr.reduce.axes, true); }

/* ---- max, max_backward -------------------------------------------------------- */

/* x viewed as [outer, len, inner] around `axis`. */
static void axis_view(const spmd_tensor *x, int axis, int64_t *outer, int64_t *len,
                      int64_t *inner)
{
    *outer = kn_numel_dims(x->dims, axis);
    *len = x->rank > 0 ? x->dims[axis] : 1;
    *inner = x->rank > 0 ? kn_numel_dims(x->dims + axis + 1, x->rank - axis - 1) : 1;
}

/* For a chunk of n columns of one outer row: the maximum and the index of
 * its first occurrence along len. */
static void max_columns(const float *x, int64_t len, int64_t inner, int64_t n,
                        float *restrict m, int64_t *restrict idx)
{
    for (int64_t j = 0; j < n; j++) {
        m[j] = x[j];
        idx[j] = 0;
    }
    for (int64_t l = 1; l < len; l++) {
        const float *restrict xl = x + l * inner;
        for (int64_t j = 0; j < n; j++) {
            bool take = kn_max_takes(xl[j], m[j]);
            m[j] = take ? xl[j] : m[j];
            idx[j] = take ? l : idx[j];
        }
    }
}

/* x [.., L, ..] -> max over attr.max.axis [.., (1), ..].  Empty rows give
 * -inf (the builder should not let them through). */
void kern_max(const kern_args *a)
{
    const spmd_tensor *t = a->node;
    const spmd_tensor *xt = t->in[0];
    int64_t outer, len, inner;
    axis_view(xt, t->attr.max.axis, &outer, &len, &inner);
    const float *x = a->in[0];
    float *out = a->out;
    if (len == 0) {
        int64_t b, e;
        kern_split(outer * inner, a->ith, a->nth, 16, &b, &e);
        for (int64_t i = b; i < e; i++) out[i] = -INFINITY;
        return;
    }
    if (inner == 1) {
        int64_t b, e;
        kern_split(outer, a->ith, a->nth, 16, &b, &e);
        for (int64_t o = b; o < e; o++) out[o] = kn_max(x + o * len, len);
        return;
    }
    const int64_t chunks = kn_ceil_div(inner, RED_CHUNK);
    int64_t b, e;
    kern_split(outer * chunks, a->ith, a->nth, 1, &b, &e);
    int64_t idx[RED_CHUNK];
    for (int64_t u = b; u < e; u++) {
        int64_t o = u / chunks, c0 = (u % chunks) * RED_CHUNK;
        int64_t n = kn_min(RED_CHUNK, inner - c0);
        max_columns(x + o * len * inner + c0, len, inner, n, out + o * inner + c0, idx);
    }
}

/* (x [.., L, ..], dy [.., (1), ..]) -> dx [.., L, ..]: dy at the first
 * maximum along the axis, zero elsewhere.  dy has the same layout with or
 * without the kept dim. */
void kern_max_backward(const kern_args *a)
{
    const spmd_tensor *t = a->node;
    int64_t outer, len, inner;
    axis_view(t->in[0], t->attr.max.axis, &outer, &len, &inner);
    const float *x = a->in[0];
    const float *dy = a->in[1];
    float *dx = a->out;
    if (len == 0) return;
    if (inner == 1) {
        int64_t b, e;
        kern_split(outer, a->ith, a->nth, 1, &b, &e);
        for (int64_t o = b; o < e; o++) {
            const float *restrict xr = x + o * len;
            float *restrict dr = dx + o * len;
            int64_t best = 0;
            float m = xr[0];
            for (int64_t l = 1; l < len; l++)
                if (kn_max_takes(xr[l], m)) {
                    m = xr[l];
                    best = l;
                }
            memset(dr, 0, (size_t)len * sizeof *dr);
            dr[best] = dy[o];
        }
        return;
    }
    const int64_t chunks = kn_ceil_div(inner, RED_CHUNK);
    int64_t b, e;
    kern_split(outer * chunks, a->ith, a->nth, 1, &b, &e);
    float m[RED_CHUNK];
    int64_t idx[RED_CHUNK];
    for (int64_t u = b; u < e; u++) {
        int64_t o = u / chunks, c0 = (u % chunks) * RED_CHUNK;
        int64_t n = kn_min(RED_CHUNK, inner - c0);
        const float *xo = x + o * len * inner + c0;
        float *dxo = dx + o * len * inner + c0;
        const float *restrict dyo = dy + o * inner + c0;
        max_columns(xo, len, inner, n, m, idx);
        for (int64_t l = 0; l < len; l++) {
            float *restrict dl = dxo + l * inner;
            for (int64_t j = 0; j < n; j++) dl[j] = idx[j] == l ? dyo[j] : 0.0f;
        }
    }
}

/* ---- cumsum ------------------------------------------------------------------- */

/* x [.., L, ..] -> its running sums along attr.cumsum.axis, from the end
 * with reverse.  A thread takes whole outer rows or chunks of columns, and
 * each column runs along L in a double accumulator, so the sums do not
 * depend on nth. */
void kern_cumsum(const kern_args *a)
{
    const spmd_tensor *t = a->node;
    int64_t outer, len, inner;
    axis_view(t, t->attr.cumsum.axis, &outer, &len, &inner);
    const bool reverse = t->attr.cumsum.reverse;
    const int64_t chunks = kn_ceil_div(inner, RED_CHUNK);
    const float *x = a->in[0];
    float *y = a->out;
    int64_t b, e;
    kern_split(outer * chunks, a->ith, a->nth, 1, &b, &e);
    double acc[RED_CHUNK];
    for (int64_t u = b; u < e; u++) {
        int64_t o = u / chunks, c0 = (u % chunks) * RED_CHUNK;
        int64_t n = kn_min(RED_CHUNK, inner - c0);
        const float *xo = x + o * len * inner + c0;
        float *yo = y + o * len * inner + c0;
        for (int64_t j = 0; j < n; j++) acc[j] = 0.0;
        for (int64_t step = 0; step < len; step++) {
            int64_t l = reverse ? len - 1 - step : step;
            const float *restrict xl = xo + l * inner;
            float *restrict yl = yo + l * inner;
            for (int64_t j = 0; j < n; j++) {
                acc[j] += (double)xl[j];
                yl[j] = (float)acc[j];
            }
        }
    }
}
