/*
 * Pooling over the last two dims (ops.def's pooling rows): max_pool2d,
 * avg_pool2d, adaptive_avg_pool2d and their backward ops.  A thread takes
 * whole (n, c) planes, and every element of a plane is computed by the
 * same arithmetic in the same order whatever the thread count.
 *
 * The fixed windows (max, avg) are walked tap by tap: for the tap (ki, kj)
 * of the windows of an output row, every output whose tap falls inside
 * the input reads x[ih, ow * stride + off], a loop over independent
 * outputs that vectorises.  Each output still meets its taps in row-major
 * order, torch's scan order, so ties and NaNs resolve as torch's do and
 * an average adds in torch's order (in double here).  The adaptive windows
 * differ in size from output to output; they are summed a contiguous run
 * of columns at a time.
 */
#include "runtime/kernels/kernels_ops.h"

#include <math.h>
#include <string.h>

typedef struct pool_shape {
    int64_t planes, h, w, oh, ow;
} pool_shape;

/* x [.., h, w] and its pooled form [.., oh, ow]. */
static pool_shape shape_of(const spmd_tensor *x, const spmd_tensor *pooled)
{
    return (pool_shape){.planes = kn_numel_dims(x->dims, x->rank - 2),
                        .h = x->dims[x->rank - 2],
                        .w = x->dims[x->rank - 1],
                        .oh = pooled->dims[pooled->rank - 2],
                        .ow = pooled->dims[pooled->rank - 1]};
}

static int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

/* The outputs [lo, hi) of a row whose tap at `off` (position o * stride +
 * off) falls inside [0, size). */
static void tap_outputs(int64_t off, int64_t stride, int64_t size, int64_t out, int64_t *lo,
                        int64_t *hi)
{
    int64_t l = -floor_div(off, stride); /* ceil(-off / stride) */
    int64_t h = floor_div(size - 1 - off, stride) + 1;
    *lo = l > 0 ? l : 0;
    *hi = h < out ? h : out;
    if (*hi < *lo) *hi = *lo;
}

/* torch's max_pool2d: a larger value, or any NaN, takes the window. */
static inline bool pool_takes(float v, float m) { return (v > m) | (v != v); }

void kern_max_pool2d(const kern_args *a)
{
    const spmd_tensor *t = a->node;
    const spmd_pool2d *p = &t->attr.pool;
    const pool_shape s = shape_of(t->in[0], t);
    const int64_t sw = p->stride[1];
    int64_t b, e;
    kern_split(s.planes, a->ith, a->nth, 1, &b, &e);
    for (int64_t plane = b; plane < e; plane++) {
        const float *x = (const float *)a->in[0] + plane * s.h * s.w;
        float *y = (float *)a->out + plane * s.oh * s.ow;
        for (int64_t oh = 0; oh < s.oh; oh++) {
            float *restrict yr = y + oh * s.ow;
            for (int64_t ow = 0; ow < s.ow; ow++) yr[ow] = -INFINITY;
            for (int64_t ki = 0; ki < p->kernel[0]; ki++) {
                int64_t ih = oh * p->stride[0] - p->padding[0] + ki * p->dilation[0];
                if (ih < 0 || ih >= s.h) continue;
                const float *restrict xr = x + ih * s.w;
                for (int64_t kj = 0; kj < p->kernel[1]; kj++) {
                    int64_t off = kj * p->dilation[1] - p->padding[1], lo, hi;
                    tap_outputs(off, sw, s.w, s.ow, &lo, &hi);
                    for (int64_t ow = lo; ow < hi; ow++) {
                        float v = xr[ow * sw + off], m = yr[ow];
                        yr[ow] = pool_takes(v, m) ? v : m;
                    }
                }
            }
        }
    }
}

/* (x, dy) -> dx: each window's maximum found again from x (the forward's
 * scan: its first valid position, then any larger value or NaN), and dy
 * added there, the outputs in order.  A window with no position inside
 * the input (dilation wider than it) passes nothing. */
void kern_max_pool2d_backward(const kern_args *a)
{
    const spmd_tensor *t = a->node;
    const spmd_pool2d *p = &t->attr.pool;
    const pool_shape s = shape_of(t, t->in[1]);
    const int64_t sw = p->stride[1];
    int64_t *restrict at = a->scratch;           /* [ow]: the maximum's position in the plane */
    float *restrict best = (float *)(at + s.ow); /* [ow]: its value */
    int64_t b, e;
    kern_split(s.planes, a->ith, a->nth, 1, &b, &e);
    for (int64_t plane = b; plane < e; plane++) {
        const float *x = (const float *)a->in[0] + plane * s.h * s.w;
        const float *dy = (const float *)a->in[1] + plane * s.oh * s.ow;
        float *dx = (float *)a->out + plane * s.h * s.w;
        memset(dx, 0, (size_t)(s.h * s.w) * sizeof *dx);
        for (int64_t oh = 0; oh < s.oh; oh++) {
            for (int64_t ow = 0; ow < s.ow; ow++) {
                at[ow] = -1;
                best[ow] = -INFINITY;
            }
            for (int64_t ki = 0; ki < p->kernel[0]; ki++) {
                int64_t ih = oh * p->stride[0] - p->padding[0] + ki * p->dilation[0];
                if (ih < 0 || ih >= s.h) continue;
                const float *restrict xr = x + ih * s.w;
                for (int64_t kj = 0; kj < p->kernel[1]; kj++) {
                    int64_t off = kj * p->dilation[1] - p->padding[1], lo, hi;
                    tap_outputs(off, sw, s.w, s.ow, &lo, &hi);
                    for (int64_t ow = lo; ow < hi; ow++) {
                        float v = xr[ow * sw + off];
                        bool take = pool_takes(v, best[ow]) | (at[ow] < 0);
                        best[ow] = take ? v : best[ow];
                        at[ow] = take ? ih * s.w + ow * sw + off : at[ow];
                    }
                }
            }
            const float *dyr = dy + oh * s.ow;
            for (int64_t ow = 0; ow < s.ow; ow++)
                if (at[ow] >= 0) dx[at[ow]] += dyr[ow];
        }
    }
}

/* Output o's window along a dim of `size`: its positions inside the input
 * [*lo, *hi), and its size with the padding but not the overhang ceil_mode
 * adds past it (count_include_pad's divisor, as torch's). */
static int64_t avg_window(int64_t o, int64_t k, int64_t stride, int64_t pad, int64_t size,
                          int64_t *lo, int64_t *hi)
{
    int64_t start = o * stride - pad;
    int64_t end = kn_min(start + k, size + pad);
    *lo = start > 0 ? start : 0;
    *hi = kn_min(end, size);
    return end - start;
}

/* What an average divides a window's sum by; 0 for a window with no
 * position inside the input (its output and gradient are 0). */
static int64_t avg_divisor(const spmd_pool2d *p, int64_t oh, int64_t ow, const pool_shape *s)
{
    int64_t h0, h1, w0, w1;
    int64_t rows = avg_window(oh, p->kernel[0], p->stride[0], p->padding[0], s->h, &h0, &h1);
    int64_t cols = avg_window(ow, p->kernel[1], p->stride[1], p->padding[1], s->w, &w0, &w1);
    if (h1 <= h0 || w1 <= w0) return 0;
    if (p->divisor_override > 0) return p->divisor_override;
    return p->count_include_pad ? rows * cols : (h1 - h0) * (w1 - w0);
}

void kern_avg_pool2d(const kern_args *a)
{
    const spmd_tensor *t = a->node;
    const spmd_pool2d *p = &t->attr.pool;
    const pool_shape s = shape_of(t->in[0], t);
    const int64_t sw = p->stride[1];
    double *restrict acc = a->scratch; /* [ow] */
    int64_t b, e;
    kern_split(s.planes, a->ith, a->nth, 1, &b, &e);
    for (int64_t plane = b; plane < e; plane++) {
        const float *x = (const float *)a->in[0] + plane * s.h * s.w;
        float *y = (float *)a->out + plane * s.oh * s.ow;
        for (int64_t oh = 0; oh < s.oh; oh++) {
            int64_t h0, h1;
            avg_window(oh, p->kernel[0], p->stride[0], p->padding[0], s.h, &h0, &h1);
            for (int64_t ow = 0; ow < s.ow; ow++) acc[ow] = 0.0;
            for (int64_t ih = h0; ih < h1; ih++) {
                const float *restrict xr = x + ih * s.w;
                for (int64_t kj = 0; kj < p->kernel[1]; kj++) {
                    int64_t off = kj - p->padding[1], lo, hi;
                    tap_outputs(off, sw, s.w, s.ow, &lo, &hi);
                    for (int64_t ow = lo; ow < hi; ow++) acc[ow] += (double)xr[ow * sw + off];
                }
            }
            float *yr = y + oh * s.ow;
            for (int64_t ow = 0; ow < s.ow; ow++) {
                int64_t div = avg_divisor(p, oh, ow, &s);
                yr[ow] = div ? (float)(acc[ow] / (double)div) : 0.0f;
            }
        }
    }
}

/* dy -> dx: each output's share, dy over its divisor (in f32, as torch's),
 * added to every position of its window inside the input. */
void kern_avg_pool2d_backward(const kern_args *a)
{
    const spmd_tensor *t = a->node;
    const spmd_pool2d *p = &t->attr.pool;
    const pool_shape s = shape_of(t, t->in[0]);
    const int64_t sw = p->stride[1];
    float *restrict share = a->scratch; /* [ow] */
    int64_t b, e;
    kern_split(s.planes, a->ith, a->nth, 1, &b, &e);
    for (int64_t plane = b; plane < e; plane++) {
        const float *dy = (const float *)a->in[0] + plane * s.oh * s.ow;
        float *dx = (float *)a->out + plane * s.h * s.w;
        memset(dx, 0, (size_t)(s.h * s.w) * sizeof *dx);
        for (int64_t oh = 0; oh < s.oh; oh++) {
            int64_t h0, h1;
            avg_window(oh, p->kernel[0], p->stride[0], p->padding[0], s.h, &h0, &h1);
            for (int64_t ow = 0; ow < s.ow; ow++) {
                int64_t div = avg_divisor(p, oh, ow, &s);
                share[ow] = div ? dy[oh * s.ow + ow] / (float)div : 0.0f;
            }
            for (int64_t ih = h0; ih < h1; ih++) {
                float *restrict dxr = dx + ih * s.w;
                for (int64_t kj = 0; kj < p->kernel[1]; kj++) {
                    int64_t off = kj - p->padding[1], lo, hi;
                    tap_outputs(off, sw, s.w, s.ow, &lo, &hi);
                    /* Stores a stride apart do not vectorise; adjacent ones do. */
                    if (sw == 1)
                        for (int64_t ow = lo; ow < hi; ow++) dxr[ow + off] += share[ow];
                    else
                        for (int64_t ow = lo; ow < hi; ow++) dxr[ow * sw + off] += share[ow];
                }
            }
        }
    }
}

/* torch's adaptive windows: output o of `out` along a dim of `size` takes
 * [floor(o size / out), ceil((o + 1) size / out)). */
static void adaptive_window(int64_t o, int64_t out, int64_t size, int64_t *lo, int64_t *hi)
{
    *lo = o * size / out;
    *hi = ((o + 1) * size + out - 1) / out;
}

void kern_adaptive_avg_pool2d(const kern_args *a)
{
    const spmd_tensor *t = a->node;
    const pool_shape s = shape_of(t->in[0], t);
    int64_t b, e;
    kern_split(s.planes, a->ith, a->nth, 1, &b, &e);
    for (int64_t plane = b; plane < e; plane++) {
        const float *x = (const float *)a->in[0] + plane * s.h * s.w;
        float *y = (float *)a->out + plane * s.oh * s.ow;
        for (int64_t oh = 0; oh < s.oh; oh++) {
            int64_t h0, h1;
            adaptive_window(oh, s.oh, s.h, &h0, &h1);
            for (int64_t ow = 0; ow < s.ow; ow++) {
                int64_t w0, w1;
                adaptive_window(ow, s.ow, s.w, &w0, &w1);
                double acc[KN_LANES] = {0};
                for (int64_t ih = h0; ih < h1; ih++) kn_lanes_add(acc, x + ih * s.w + w0, w1 - w0);
                y[oh * s.ow + ow] = (float)(kn_lanes_total(acc) / (double)((h1 - h0) * (w1 - w0)));
            }
        }
    }
}

void kern_adaptive_avg_pool2d_backward(const kern_args *a)
{
    const spmd_tensor *t = a->node;
    const pool_shape s = shape_of(t, t->in[0]);
    int64_t b, e;
    kern_split(s.planes, a->ith, a->nth, 1, &b, &e);
    for (int64_t plane = b; plane < e; plane++) {
        const float *dy = (const float *)a->in[0] + plane * s.oh * s.ow;
        float *dx = (float *)a->out + plane * s.h * s.w;
        memset(dx, 0, (size_t)(s.h * s.w) * sizeof *dx);
        for (int64_t oh = 0; oh < s.oh; oh++) {
            int64_t h0, h1;
            adaptive_window(oh, s.oh, s.h, &h0, &h1);
            for (int64_t ow = 0; ow < s.ow; ow++) {
                int64_t w0, w1;
                adaptive_window(ow, s.ow, s.w, &w0, &w1);
                const float share = dy[oh * s.ow + ow] / (float)((h1 - h0) * (w1 - w0));
                for (int64_t ih = h0; ih < h1; ih++) {
                    float *restrict dxr = dx + ih * s.w;
                    for (int64_t iw = w0; iw < w1; iw++) dxr[iw] += share;
                }
            }
        }
    }
}
