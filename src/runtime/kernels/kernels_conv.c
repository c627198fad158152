/*
 * conv2d and its backward ops on gemm_f32: per image and group of
 * channels, the im2col matrix in the thread's scratch and one GEMM with
 * the group's weights (compile/tiles.h, conv_plan, says how the work is
 * cut, from the shapes alone); small images several to a GEMM, their
 * matrices side by side.  Threads take whole work items: an image's group
 * (and tile of output columns), or a set of small images' group, for y
 * and dx, a group's block of dw's rows over the whole batch for dw.  Each
 * item runs the same GEMM calls in the same order whatever nth is, so the
 * bits do not depend on the thread count (docs/design/kernels.md,
 * "Convolutions").
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

/* Row k = (channel c, kernel row i, kernel column j) of the im2col
 * matrix: column (oy, ox) reads x[c, oy * sh + y0, ox * sw + x0], which
 * lies inside the image for ox in [lo, hi) and rows oy whose input row is
 * in [0, H); elsewhere it is the padding's zero. */
typedef struct conv_tap {
    int64_t y0, x0, lo, hi;
} conv_tap;

static conv_tap tap_of(const conv_plan *p, int64_t k)
{
    const int64_t i = k % (p->kh * p->kw) / p->kw, j = k % p->kw;
    conv_tap t = {.y0 = i * p->dilation[0] - p->pad[0], .x0 = j * p->dilation[1] - p->pad[1]};
    inside(t.x0, p->stride[1], p->w, p->ow, &t.lo, &t.hi);
    return t;
}

/* Of output row oy's columns [ox, end): those that read the image, [*lo,
 * *hi), from element *at of the channel on by the column stride. */
static void row_inside(const conv_plan *p, conv_tap t, int64_t oy, int64_t ox, int64_t end,
                       int64_t *lo, int64_t *hi, int64_t *at)
{
    const int64_t iy = oy * p->stride[0] + t.y0;
    *lo = *hi = end;
    if (iy < 0 || iy >= p->h) return;
    *lo = kn_max_i(ox, kn_min(t.lo, end));
    *hi = kn_max_i(*lo, kn_min(t.hi, end));
    *at = iy * p->w + t.x0 + *lo * p->stride[1];
}

/* Rows [k0, k1) and columns [c0, c1) of the im2col matrices of m images,
 * x [cpg, H, W] and on by xstride, into the rows of col [k1 - k0, ld],
 * image i's columns from i * (c1 - c0). */
static void im2col(const conv_plan *p, const float *restrict x, int64_t xstride, int64_t m,
                   int64_t k0, int64_t k1, int64_t c0, int64_t c1, float *restrict col, int64_t ld)
{
    const int64_t khw = p->kh * p->kw, sw = p->stride[1], oy0 = c0 / p->ow, ox0 = c0 % p->ow;
    for (int64_t k = k0; k < k1; k++) {
        const conv_tap t = tap_of(p, k);
        const float *xk = x + k / khw * p->h * p->w;
        for (int64_t img = 0; img < m; img++) {
            const float *xc = xk + img * xstride;
            float *dst = col + (k - k0) * ld + img * (c1 - c0);
            for (int64_t q = c0, oy = oy0, ox = ox0; q < c1; oy++, ox = 0) {
                const int64_t end = kn_min(p->ow, ox + c1 - q);
                int64_t lo, hi, at = 0;
                row_inside(p, t, oy, ox, end, &lo, &hi, &at);
                for (int64_t o = ox; o < lo; o++) *dst++ = 0.0f;
                if (sw == 1) memcpy(dst, xc + at, (size_t)(hi - lo) * sizeof *dst);
                else
                    for (int64_t o = 0; o < hi - lo; o++) dst[o] = xc[at + o * sw];
                dst += hi - lo;
                for (int64_t o = hi; o < end; o++) *dst++ = 0.0f;
                q += end - ox;
            }
        }
    }
}

/* dx of m images, [cpg, H, W] and on by xstride, += columns [c0, c1) of
 * their im2col matrices in the rows of col [kdim, ld] (image i's from i *
 * (c1 - c0)), each entry into the element it was read from: row by row,
 * column by column, so every element sums its entries in one order. */
static void col2im_add(const conv_plan *p, const float *restrict col, int64_t ld, int64_t m,
                       int64_t c0, int64_t c1, float *restrict dx, int64_t xstride)
{
    const int64_t khw = p->kh * p->kw, sw = p->stride[1], oy0 = c0 / p->ow, ox0 = c0 % p->ow;
    for (int64_t k = 0; k < p->kdim; k++) {
        const conv_tap t = tap_of(p, k);
        float *xk = dx + k / khw * p->h * p->w;
        for (int64_t img = 0; img < m; img++) {
            float *xc = xk + img * xstride;
            const float *src = col + k * ld + img * (c1 - c0);
            for (int64_t q = c0, oy = oy0, ox = ox0; q < c1; oy++, ox = 0) {
                const int64_t end = kn_min(p->ow, ox + c1 - q);
                int64_t lo, hi, at = 0;
                row_inside(p, t, oy, ox, end, &lo, &hi, &at);
                for (int64_t o = 0; o < hi - lo; o++) xc[at + o * sw] += src[lo - ox + o];
                src += end - ox;
                q += end - ox;
            }
        }
    }
}

static bool gemm_ok(const kern_args *a, spmd_status st)
{
    if (st == SPMD_OK) return true;
    kern_fail(a, st, "%s: %s", ir_op_name(a->node->op), spmd_last_error());
    return false;
}

/* A set of small images (conv_plan's imgs): `m` images from img0, each
 * [.., OH*OW] of a group, side by side in a matrix [.., m * OH*OW]. */
typedef struct conv_set {
    int64_t img0, m, ncol;
} conv_set;

static conv_set set_at(const conv_plan *p, int64_t s)
{
    conv_set c = {.img0 = s * p->imgs};
    c.m = kn_min(p->imgs, p->n - c.img0);
    c.ncol = c.m * p->ohw;
    return c;
}

/* Rows [k0, k1) of the set's im2col matrices of group g: col [k1 - k0, ncol]. */
static void im2col_set(const conv_plan *p, const float *x, conv_set s, int64_t g, int64_t k0,
                       int64_t k1, float *col)
{
    im2col(p, x + (s.img0 * p->cin + g * p->cpg) * p->h * p->w, p->cin * p->h * p->w, s.m, k0, k1,
           0, p->ohw, col, s.ncol);
}

/* The set's dy of group g, [opg, ncol] (dy is [N, Cout, OH*OW]). */
static void gather_dy(const conv_plan *p, const float *dy, conv_set s, int64_t g, float *dst)
{
    for (int64_t i = 0; i < s.m; i++)
        for (int64_t o = 0; o < p->opg; o++)
            memcpy(dst + o * s.ncol + i * p->ohw,
                   dy + ((s.img0 + i) * p->cout + g * p->opg + o) * p->ohw,
                   (size_t)p->ohw * sizeof *dst);
}

/* y for sets of images: per set and group, out [opg, ncol] = w_g . im2col,
 * copied to each image's rows of y. */
static void conv2d_sets(const kern_args *a, const conv_plan *p)
{
    const float *x = a->in[0], *w = a->in[1];
    float *y = a->out;
    int64_t b, e;
    kern_split(kn_ceil_div(p->n, p->imgs) * p->groups, a->ith, a->nth, 1, &b, &e);
    for (int64_t u = b; u < e; u++) {
        const conv_set s = set_at(p, u / p->groups);
        const int64_t g = u % p->groups;
        float *col = a->scratch, *out = col + p->kdim * s.ncol;
        im2col_set(p, x, s, g, 0, p->kdim, col);
        if (!gemm_ok(a, gemm_f32(false, false, p->opg, s.ncol, p->kdim, 1.0f,
                                 w + g * p->opg * p->kdim, p->kdim, col, s.ncol, 0.0f, out,
                                 s.ncol)))
            return;
        for (int64_t i = 0; i < s.m; i++)
            for (int64_t o = 0; o < p->opg; o++)
                memcpy(y + ((s.img0 + i) * p->cout + g * p->opg + o) * p->ohw,
                       out + o * s.ncol + i * p->ohw, (size_t)p->ohw * sizeof *y);
    }
}

/* dx for sets of images: per set and group, col [kdim, ncol] = w_g^T . dy
 * of the set, added back into each image's dx. */
static void conv2d_backward_input_sets(const kern_args *a, const conv_plan *p)
{
    const float *dy = a->in[0], *w = a->in[1];
    float *dx = a->out;
    int64_t b, e;
    kern_split(kn_ceil_div(p->n, p->imgs) * p->groups, a->ith, a->nth, 1, &b, &e);
    for (int64_t u = b; u < e; u++) {
        const conv_set s = set_at(p, u / p->groups);
        const int64_t g = u % p->groups;
        float *dys = a->scratch, *col = dys + p->opg * s.ncol;
        gather_dy(p, dy, s, g, dys);
        if (!gemm_ok(a, gemm_f32(true, false, p->kdim, s.ncol, p->opg, 1.0f,
                                 w + g * p->opg * p->kdim, p->kdim, dys, s.ncol, 0.0f, col,
                                 s.ncol)))
            return;
        float *dxg = dx + (s.img0 * p->cin + g * p->cpg) * p->h * p->w;
        for (int64_t i = 0; i < s.m; i++)
            memset(dxg + i * p->cin * p->h * p->w, 0, (size_t)(p->cpg * p->h * p->w) * sizeof *dxg);
        col2im_add(p, col, s.ncol, s.m, 0, p->ohw, dxg, p->cin * p->h * p->w);
    }
}

/* y [N, Cout, OH, OW] = conv2d(x [N, Cin, H, W], w [Cout, Cin/groups, KH, KW]):
 * per image, group and tile of columns, y = w_g [opg, kdim] . im2col. */
void kern_conv2d(const kern_args *a)
{
    conv_plan p;
    conv_plan_of(a->node, &p);
    if (p.imgs > 1) {
        conv2d_sets(a, &p);
        return;
    }
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
            im2col(&p, xg, 0, 1, 0, p.kdim, c0, c1, a->scratch, c1 - c0);
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
    if (p.imgs > 1) {
        conv2d_backward_input_sets(a, &p);
        return;
    }
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
            col2im_add(&p, col, c1 - c0, 1, c0, c1, dxg, 0);
        }
    }
}

/* Block [k0, k1) of group g's dw rows, dwg, summed over small images a
 * set per GEMM (which sums over the set's positions); *beta 1 once
 * anything is in it. */
static bool dw_block_sets(const kern_args *a, const conv_plan *p, int64_t g, int64_t k0, int64_t k1,
                          float *dwg, float *beta)
{
    const float *x = a->in[0], *dy = a->in[1];
    for (int64_t set = 0; set * p->imgs < p->n; set++) {
        const conv_set s = set_at(p, set);
        float *dys = a->scratch, *col = dys + p->opg * s.ncol;
        gather_dy(p, dy, s, g, dys);
        im2col_set(p, x, s, g, k0, k1, col);
        if (!gemm_ok(a, gemm_f32(false, true, p->opg, k1 - k0, s.ncol, 1.0f, dys, s.ncol, col,
                                 s.ncol, *beta, dwg, p->kdim)))
            return false;
        *beta = 1.0f;
    }
    return true;
}

/* The same, image by image and tile by tile of columns. */
static bool dw_block_images(const kern_args *a, const conv_plan *p, int64_t g, int64_t k0,
                            int64_t k1, float *dwg, float *beta)
{
    const float *x = a->in[0], *dy = a->in[1];
    for (int64_t img = 0; img < p->n; img++) {
        const float *xg = x + (img * p->cin + g * p->cpg) * p->h * p->w;
        const float *dyg = dy + (img * p->cout + g * p->opg) * p->ohw;
        for (int64_t c0 = 0; c0 < p->ohw; c0 += p->cols) {
            const int64_t c1 = kn_min(p->ohw, c0 + p->cols);
            const float *cols = xg + k0 * p->ohw + c0;
            int64_t ldb = p->ohw;
            if (!p->pointwise) {
                im2col(p, xg, 0, 1, k0, k1, c0, c1, a->scratch, c1 - c0);
                cols = a->scratch;
                ldb = c1 - c0;
            }
            if (!gemm_ok(a, gemm_f32(false, true, p->opg, k1 - k0, c1 - c0, 1.0f, dyg + c0, p->ohw,
                                     cols, ldb, *beta, dwg, p->kdim)))
                return false;
            *beta = 1.0f;
        }
    }
    return true;
}

/* dw [Cout, Cin/groups, KH, KW] from x and dy: per group and block of
 * rows [k0, k1) of its [opg, kdim], the sum over images (in order) and
 * tiles of columns, or sets of small images, of dy_g . im2col^T,
 * accumulated by the GEMM. */
void kern_conv2d_backward_weight(const kern_args *a)
{
    conv_plan p;
    conv_plan_of(a->node, &p);
    float *dw = a->out;
    const int64_t blocks = kn_ceil_div(p.kdim, p.rows);
    int64_t b, e;
    kern_split(p.groups * blocks, a->ith, a->nth, 1, &b, &e);
    for (int64_t u = b; u < e; u++) {
        const int64_t g = u / blocks, k0 = u % blocks * p.rows, k1 = kn_min(p.kdim, k0 + p.rows);
        float *dwg = dw + g * p.opg * p.kdim + k0;
        float beta = 0.0f;
        if (!(p.imgs > 1 ? dw_block_sets : dw_block_images)(a, &p, g, k0, k1, dwg, &beta)) return;
        if (beta == 0.0f) /* no image: a zero gradient */
            for (int64_t o = 0; o < p.opg; o++)
                memset(dwg + o * p.kdim, 0, (size_t)(k1 - k0) * sizeof *dwg);
    }
}
