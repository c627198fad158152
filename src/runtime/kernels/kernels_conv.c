/*
 * conv2d and its backward ops on gemm_f32: per image and group of
 * channels, the im2col matrix in the thread's scratch and one GEMM with
 * the group's weights (compile/tiles.h, conv_plan, says how the work is
 * cut, from the shapes alone).  Threads take whole work items: an image's
 * group (and tile of output columns) for y and dx, a group's block of
 * dw's rows over the whole batch for dw.  Each item runs the same GEMM
 * calls in the same order whatever nth is, so the bits do not depend on
 * the thread count, and an image's y and dx do not depend on which other
 * images a device holds (docs/DESIGN.md, "Convolutions").
 */
#include "runtime/kernels/kernels_ops.h"

#include "compile/tiles.h"
#include "runtime/gemm.h"

#include <string.h>

/* The t in [0, n) whose ix = base + t * stride lies in [0, size): [lo, hi). */
static void inside(int64_t base, int64_t stride, int64_t size, int64_t n, int64_t *lo,
                   int64_t *hi)
{
    int64_t l = base >= 0 ? 0 : kn_ceil_div(-base, stride);
    int64_t h = size - base <= 0 ? 0 : kn_ceil_div(size - base, stride);
    *lo = kn_min(l, n);
    *hi = kn_max_i(kn_min(h, n), *lo);
}

/* A stretch of a row of the im2col matrix that lies on one output row:
 * `len` columns, of which [lo, hi) read the image, at element `at` of the
 * channel and on by the column stride; the others are the padding's
 * zeros. */
typedef struct conv_run {
    int64_t len, lo, hi, at;
} conv_run;

/* The run of row k = (channel c, kernel row i, kernel column j) of the
 * im2col matrix from column q up to the end of q's output row or c1.
 * Column (oy, ox) reads x[c, oy * sh - ph + i * dh, ox * sw - pw + j * dw]. */
static conv_run run_at(const conv_plan *p, int64_t k, int64_t q, int64_t c1)
{
    const int64_t khw = p->kh * p->kw, i = k % khw / p->kw, j = k % p->kw;
    const int64_t oy = q / p->ow, ox0 = q % p->ow;
    conv_run r = {.len = kn_min(p->ow - ox0, c1 - q)};
    const int64_t iy = oy * p->stride[0] - p->pad[0] + i * p->dilation[0];
    if (iy < 0 || iy >= p->h) return r; /* lo = hi = 0: all padding */
    const int64_t ix = ox0 * p->stride[1] - p->pad[1] + j * p->dilation[1];
    inside(ix, p->stride[1], p->w, r.len, &r.lo, &r.hi);
    r.at = iy * p->w + ix + r.lo * p->stride[1];
    return r;
}

/* Rows [k0, k1) and columns [c0, c1) of the im2col matrix of x [cpg, H,
 * W] into col [k1 - k0, c1 - c0]. */
static void im2col(const conv_plan *p, const float *restrict x, int64_t k0, int64_t k1,
                   int64_t c0, int64_t c1, float *restrict col)
{
    const int64_t khw = p->kh * p->kw, sw = p->stride[1];
    for (int64_t k = k0; k < k1; k++) {
        const float *xc = x + k / khw * p->h * p->w;
        float *dst = col + (k - k0) * (c1 - c0);
        for (int64_t q = c0; q < c1;) {
            conv_run r = run_at(p, k, q, c1);
            for (int64_t t = 0; t < r.lo; t++) dst[t] = 0.0f;
            if (sw == 1) memcpy(dst + r.lo, xc + r.at, (size_t)(r.hi - r.lo) * sizeof *dst);
            else
                for (int64_t t = r.lo; t < r.hi; t++) dst[t] = xc[r.at + (t - r.lo) * sw];
            for (int64_t t = r.hi; t < r.len; t++) dst[t] = 0.0f;
            dst += r.len;
            q += r.len;
        }
    }
}

/* dx [cpg, H, W] += columns [c0, c1) of an im2col matrix col [kdim, c1 -
 * c0], each entry into the element it was read from: row by row, column by
 * column, so every element sums its entries in one order. */
static void col2im_add(const conv_plan *p, const float *restrict col, int64_t c0, int64_t c1,
                       float *restrict dx)
{
    const int64_t khw = p->kh * p->kw, sw = p->stride[1];
    for (int64_t k = 0; k < p->kdim; k++) {
        float *xc = dx + k / khw * p->h * p->w;
        const float *src = col + k * (c1 - c0);
        for (int64_t q = c0; q < c1;) {
            conv_run r = run_at(p, k, q, c1);
            for (int64_t t = r.lo; t < r.hi; t++) xc[r.at + (t - r.lo) * sw] += src[t];
            src += r.len;
            q += r.len;
        }
    }
}

static bool gemm_ok(const kern_args *a, spmd_status st)
{
    if (st == SPMD_OK) return true;
    kern_fail(a, st, "%s: %s", ir_op_name(a->node->op), spmd_last_error());
    return false;
}

/* y [N, Cout, OH, OW] = conv2d(x [N, Cin, H, W], w [Cout, Cin/groups, KH, KW]):
 * per image, group and tile of columns, y = w_g [opg, kdim] . im2col. */
void kern_conv2d(const kern_args *a)
{
    conv_plan p;
    conv_plan_of(a->node, &p);
    const float *x = a->in[0], *w = a->in[1];
    float *y = a->out;
    const int64_t tiles = kn_ceil_div(p.ohw, p.cols);
    int64_t b, e;
    kern_split(p.n * p.groups * tiles, a->ith, a->nth, 1, &b, &e);
    for (int64_t u = b; u < e; u++) {
        const int64_t img = u / (p.groups * tiles), g = u / tiles % p.groups;
        const int64_t c0 = u % tiles * p.cols, c1 = kn_min(p.ohw, c0 + p.cols);
        const float *xg = x + (img * p.cin + g * p.cpg) * p.h * p.w;
        const float *cols = xg + c0;
        int64_t ldb = p.ohw;
        if (!p.pointwise) {
            im2col(&p, xg, 0, p.kdim, c0, c1, a->scratch);
            cols = a->scratch;
            ldb = c1 - c0;
        }
        float *yg = y + (img * p.cout + g * p.opg) * p.ohw + c0;
        if (!gemm_ok(a, gemm_f32(false, false, p.opg, c1 - c0, p.kdim, 1.0f, w + g * p.opg * p.kdim,
                                 p.kdim, cols, ldb, 0.0f, yg, p.ohw)))
            return;
    }
}

/* dx [N, Cin, H, W] from dy [N, Cout, OH, OW] and w: per image and group,
 * the im2col matrix's adjoint w_g^T . dy_g a tile of columns at a time,
 * added back into the elements it reads (pointwise: dx_g = w_g^T . dy_g). */
void kern_conv2d_backward_input(const kern_args *a)
{
    conv_plan p;
    conv_plan_of(a->node, &p);
    const float *dy = a->in[0], *w = a->in[1];
    float *dx = a->out;
    int64_t b, e;
    kern_split(p.n * p.groups, a->ith, a->nth, 1, &b, &e);
    for (int64_t u = b; u < e; u++) {
        const int64_t img = u / p.groups, g = u % p.groups;
        float *dxg = dx + (img * p.cin + g * p.cpg) * p.h * p.w;
        const float *dyg = dy + (img * p.cout + g * p.opg) * p.ohw;
        const float *wg = w + g * p.opg * p.kdim;
        if (p.pointwise) {
            if (!gemm_ok(a, gemm_f32(true, false, p.cpg, p.ohw, p.opg, 1.0f, wg, p.kdim, dyg,
                                     p.ohw, 0.0f, dxg, p.ohw)))
                return;
            continue;
        }
        memset(dxg, 0, (size_t)(p.cpg * p.h * p.w) * sizeof *dxg);
        for (int64_t c0 = 0; c0 < p.ohw; c0 += p.cols) {
            const int64_t c1 = kn_min(p.ohw, c0 + p.cols);
            float *col = a->scratch;
            if (!gemm_ok(a, gemm_f32(true, false, p.kdim, c1 - c0, p.opg, 1.0f, wg, p.kdim,
                                     dyg + c0, p.ohw, 0.0f, col, c1 - c0)))
                return;
            col2im_add(&p, col, c0, c1, dxg);
        }
    }
}

/* dw [Cout, Cin/groups, KH, KW] from x and dy: per group and block of
 * rows [k0, k1) of its [opg, kdim], the sum over images (in order) and
 * tiles of columns of dy_g . im2col^T, accumulated by the GEMM. */
void kern_conv2d_backward_weight(const kern_args *a)
{
    conv_plan p;
    conv_plan_of(a->node, &p);
    const float *x = a->in[0], *dy = a->in[1];
    float *dw = a->out;
    const int64_t blocks = kn_ceil_div(p.kdim, p.rows);
    int64_t b, e;
    kern_split(p.groups * blocks, a->ith, a->nth, 1, &b, &e);
    for (int64_t u = b; u < e; u++) {
        const int64_t g = u / blocks, k0 = u % blocks * p.rows, k1 = kn_min(p.kdim, k0 + p.rows);
        float *dwg = dw + g * p.opg * p.kdim + k0;
        float beta = 0.0f;
        for (int64_t img = 0; img < p.n; img++) {
            const float *xg = x + (img * p.cin + g * p.cpg) * p.h * p.w;
            const float *dyg = dy + (img * p.cout + g * p.opg) * p.ohw;
            for (int64_t c0 = 0; c0 < p.ohw; c0 += p.cols) {
                const int64_t c1 = kn_min(p.ohw, c0 + p.cols);
                const float *cols = xg + k0 * p.ohw + c0;
                int64_t ldb = p.ohw;
                if (!p.pointwise) {
                    im2col(&p, xg, k0, k1, c0, c1, a->scratch);
                    cols = a->scratch;
                    ldb = c1 - c0;
                }
                if (!gemm_ok(a, gemm_f32(false, true, p.opg, k1 - k0, c1 - c0, 1.0f, dyg + c0,
                                         p.ohw, cols, ldb, beta, dwg, p.kdim)))
                    return;
                beta = 1.0f;
            }
        }
        if (beta == 0.0f) /* no image: a zero gradient */
            for (int64_t o = 0; o < p.opg; o++)
                memset(dwg + o * p.kdim, 0, (size_t)(k1 - k0) * sizeof *dwg);
    }
}
