/*
 * Batch normalisation per channel of x [N, C, S...] (the channels on dim
 * 1, S the spatial dims, none for [N, C]): the variance row, the
 * normalisation, and the two rows of its backward pass (sums and dx).
 *
 * The statistics rows split the channels over the threads: each channel's
 * sum runs in double, over the batch in order, so the result does not
 * depend on nth.  The elementwise rows split the planes (n, c) of S
 * elements, or the rows of an [N, C] tensor, and compute each element
 * from per-channel constants that every thread derives alike.
 */
#include "runtime/kernels/kernels_ops.h"

#include <math.h>

/* Channels one thread handles at a time along an [N, C] row. */
enum { BN_CHUNK = 256 };

/* x as [n, c, s]: batch, channels, elements of one plane. */
typedef struct bn_view {
    int64_t n, c, s;
} bn_view;

static bn_view view_of(const spmd_tensor *x)
{
    bn_view v = {x->dims[0], x->dims[1], kn_numel_dims(x->dims + 2, x->rank - 2)};
    return v;
}

/* 1 / sqrt(var + eps), in double. */
static double inv_std(float var, float eps) { return 1.0 / sqrt((double)var + (double)eps); }

/* ---- Padding (batch_norm_var in a per-device program) ----------------------- */

/* How many of the device's indices along x's dim d are real: its local
 * size, less the padding past the whole dim when the dim is split
 * unevenly (fix_channel_padding); the real ones come first. */
static int64_t valid_extent(const kern_args *a, int d)
{
    const spmd_tensor *t = a->node;
    int64_t local = t->in[0]->dims[d], global = t->attr.bnorm.global[d];
    if (!global || !a->dev) return local;
    int64_t first = (int64_t)a->dev->member[t->attr.bnorm.spec[d]] * local;
    int64_t left = global - first;
    return left < 0 ? 0 : left < local ? left : local;
}

/* The real elements of one plane as runs of `len` along the last dim:
 * the whole plane when no spatial dim is padded. */
typedef struct plane_runs {
    int64_t runs, len;
    int nd; /* spatial dims before the last */
    int64_t valid[SPMD_MAX_RANK], stride[SPMD_MAX_RANK];
} plane_runs;

static void plane_runs_make(const kern_args *a, plane_runs *pr)
{
    const spmd_tensor *x = a->node->in[0];
    int r = x->rank;
    pr->runs = 1;
    pr->nd = 0;
    pr->len = kn_numel_dims(x->dims + 2, r - 2);
    bool padded = false;
    for (int d = 2; d < r; d++) padded = padded || valid_extent(a, d) != x->dims[d];
    if (!padded) return;
    pr->len = valid_extent(a, r - 1);
    pr->nd = r - 3;
    for (int k = 0; k < pr->nd; k++) {
        pr->valid[k] = valid_extent(a, 2 + k);
        pr->stride[k] = kn_numel_dims(x->dims + 3 + k, r - 3 - k);
        pr->runs *= pr->valid[k];
    }
}

static int64_t run_offset(const plane_runs *pr, int64_t k)
{
    int64_t off = 0;
    for (int i = pr->nd - 1; i >= 0; i--) {
        off += (k % pr->valid[i]) * pr->stride[i];
        k /= pr->valid[i];
    }
    return off;
}

/* ---- batch_norm_var ------------------------------------------------------------ */

/* acc's lanes += (x[i] - m)^2. */
static void add_squared_deviations(double *restrict acc, const float *restrict x, int64_t n,
                                   double m)
{
    int64_t i = 0;
    for (; i + KN_LANES <= n; i += KN_LANES)
        for (int l = 0; l < KN_LANES; l++) {
            double d = (double)x[i + l] - m;
            acc[l] += d * d;
        }
    for (int l = 0; i < n; i++, l++) {
        double d = (double)x[i] - m;
        acc[l] += d * d;
    }
}

/* (x [N, C, S...], mean [C]) -> sum over n and s of (x - mean)^2 / count:
 * the biased variance, or a device's share of it. */
void kern_batch_norm_var(const kern_args *a)
{
    const spmd_tensor *t = a->node;
    const bn_view v = view_of(t->in[0]);
    const int64_t rows = valid_extent(a, 0);
    const double count = (double)t->attr.bnorm.count;
    const float *x = a->in[0], *mean = a->in[1];
    float *out = a->out;
    int64_t b, e;
    kern_split(v.c, a->ith, a->nth, 1, &b, &e);
    if (t->in[0]->rank == 2) { /* [N, C]: a chunk of channels reads whole rows */
        double acc[BN_CHUNK];
        for (int64_t c0 = b; c0 < e; c0 += BN_CHUNK) {
            int64_t n = kn_min(BN_CHUNK, e - c0);
            for (int64_t j = 0; j < n; j++) acc[j] = 0.0;
            for (int64_t r = 0; r < rows; r++) {
                const float *restrict xr = x + r * v.c + c0;
                for (int64_t j = 0; j < n; j++) {
                    double d = (double)xr[j] - (double)mean[c0 + j];
                    acc[j] += d * d;
                }
            }
            for (int64_t j = 0; j < n; j++) out[c0 + j] = (float)(acc[j] / count);
        }
        return;
    }
    plane_runs pr;
    plane_runs_make(a, &pr);
    for (int64_t c = b; c < e; c++) {
        double acc[KN_LANES] = {0};
        for (int64_t r = 0; r < rows; r++) {
            const float *plane = x + (r * v.c + c) * v.s;
            for (int64_t k = 0; k < pr.runs; k++)
                add_squared_deviations(acc, plane + run_offset(&pr, k), pr.len, (double)mean[c]);
        }
        out[c] = (float)(kn_lanes_total(acc) / count);
    }
}

/* ---- batch_norm_sums -------------------------------------------------------------- */

/* (x, mean [C], var [C], dy) -> [2, C]: sum(dy) and sum(dy * xhat) per
 * channel, xhat = (x - mean) / sqrt(var + eps).  The partitioner zeroes
 * dy's padding, which then adds nothing. */
void kern_batch_norm_sums(const kern_args *a)
{
    const spmd_tensor *t = a->node;
    const bn_view v = view_of(t->in[0]);
    const float eps = t->attr.bnorm.eps;
    const float *x = a->in[0], *mean = a->in[1], *var = a->in[2], *dy = a->in[3];
    float *out = a->out;
    int64_t b, e;
    kern_split(v.c, a->ith, a->nth, 1, &b, &e);
    if (t->in[0]->rank == 2) {
        double sdy[BN_CHUNK], sdx[BN_CHUNK];
        for (int64_t c0 = b; c0 < e; c0 += BN_CHUNK) {
            int64_t n = kn_min(BN_CHUNK, e - c0);
            for (int64_t j = 0; j < n; j++) sdy[j] = sdx[j] = 0.0;
            for (int64_t r = 0; r < v.n; r++) {
                const float *restrict xr = x + r * v.c + c0, *restrict dr = dy + r * v.c + c0;
                for (int64_t j = 0; j < n; j++) {
                    sdy[j] += (double)dr[j];
                    sdx[j] += (double)dr[j] * ((double)xr[j] - (double)mean[c0 + j]);
                }
            }
            for (int64_t j = 0; j < n; j++) {
                out[c0 + j] = (float)sdy[j];
                out[v.c + c0 + j] = (float)(sdx[j] * inv_std(var[c0 + j], eps));
            }
        }
        return;
    }
    for (int64_t c = b; c < e; c++) {
        double sdy[KN_LANES] = {0}, sdx[KN_LANES] = {0};
        const double m = (double)mean[c];
        for (int64_t r = 0; r < v.n; r++) {
            const float *restrict xp = x + (r * v.c + c) * v.s, *restrict dp = dy + (r * v.c + c) * v.s;
            int64_t i = 0;
            for (; i + KN_LANES <= v.s; i += KN_LANES)
                for (int l = 0; l < KN_LANES; l++) {
                    sdy[l] += (double)dp[i + l];
                    sdx[l] += (double)dp[i + l] * ((double)xp[i + l] - m);
                }
            for (int l = 0; i < v.s; i++, l++) {
                sdy[l] += (double)dp[i];
                sdx[l] += (double)dp[i] * ((double)xp[i] - m);
            }
        }
        out[c] = (float)kn_lanes_total(sdy);
        out[v.c + c] = (float)(kn_lanes_total(sdx) * inv_std(var[c], eps));
    }
}

/* ---- batch_norm and batch_norm_backward: elementwise per channel ---------------- */

/* Per-channel constants: y = x * k0 + k1 for the normalisation;
 * dx = (dy - k1 - (x - k2) * k3) * k0 for its backward pass. */
typedef void (*channel_consts_fn)(const kern_args *a, int64_t c, float k[4]);

/* alpha = weight / sqrt(var + eps), beta = bias - mean * alpha. */
static void apply_consts(const kern_args *a, int64_t c, float k[4])
{
    const float *mean = a->in[1], *var = a->in[2], *w = a->in[3], *bias = a->in[4];
    double alpha = (double)w[c] * inv_std(var[c], a->node->attr.bnorm.eps);
    k[0] = (float)alpha;
    k[1] = (float)((double)bias[c] - (double)mean[c] * (double)k[0]);
    k[2] = k[3] = 0.0f;
}

/* dx = weight r (dy - sum(dy) / n - xhat sum(dy xhat) / n), r = 1 /
 * sqrt(var + eps), xhat = (x - mean) r, n the global count. */
static void backward_consts(const kern_args *a, int64_t c, float k[4])
{
    const spmd_tensor *t = a->node;
    const float *mean = a->in[1], *var = a->in[2], *w = a->in[3], *sums = a->in[5];
    const int64_t channels = t->in[0]->dims[1];
    const double n = (double)t->attr.bnorm.count, r = inv_std(var[c], t->attr.bnorm.eps);
    k[0] = (float)((double)w[c] * r);
    k[1] = (float)((double)sums[c] / n);
    k[2] = mean[c];
    k[3] = (float)(r * (double)sums[channels + c] / n);
}

static inline float apply_one(float x, float k0, float k1) { return x * k0 + k1; }

static inline float backward_one(float x, float dy, float k0, float k1, float k2, float k3)
{
    return (dy - k1 - (x - k2) * k3) * k0;
}

/* x (and dy: backward) -> out, each element from its channel's constants.
 * Planes (n, c) of S elements split over the threads; an [N, C] tensor
 * splits its rows, a chunk of channels' constants made once per chunk. */
static void per_channel(const kern_args *a, channel_consts_fn consts, const float *dy)
{
    const bn_view v = view_of(a->node->in[0]);
    const float *x = a->in[0];
    float *out = a->out;
    int64_t b, e;
    if (a->node->in[0]->rank == 2) {
        kern_split(v.n, a->ith, a->nth, 1, &b, &e);
        float k[BN_CHUNK][4], kt[4][BN_CHUNK];
        for (int64_t c0 = 0; c0 < v.c; c0 += BN_CHUNK) {
            int64_t n = kn_min(BN_CHUNK, v.c - c0);
            for (int64_t j = 0; j < n; j++) {
                consts(a, c0 + j, k[j]);
                for (int q = 0; q < 4; q++) kt[q][j] = k[j][q];
            }
            for (int64_t r = b; r < e; r++) {
                const float *restrict xr = x + r * v.c + c0;
                float *restrict o = out + r * v.c + c0;
                if (!dy) {
                    for (int64_t j = 0; j < n; j++) o[j] = apply_one(xr[j], kt[0][j], kt[1][j]);
                } else {
                    const float *restrict dr = dy + r * v.c + c0;
                    for (int64_t j = 0; j < n; j++)
                        o[j] = backward_one(xr[j], dr[j], kt[0][j], kt[1][j], kt[2][j], kt[3][j]);
                }
            }
        }
        return;
    }
    kern_split(v.n * v.c, a->ith, a->nth, 1, &b, &e);
    for (int64_t p = b; p < e; p++) {
        float k[4];
        consts(a, p % v.c, k);
        const float *restrict xp = x + p * v.s;
        float *restrict o = out + p * v.s;
        if (!dy) {
            for (int64_t i = 0; i < v.s; i++) o[i] = apply_one(xp[i], k[0], k[1]);
        } else {
            const float *restrict dp = dy + p * v.s;
            for (int64_t i = 0; i < v.s; i++) o[i] = backward_one(xp[i], dp[i], k[0], k[1], k[2], k[3]);
        }
    }
}

/* (x, mean [C], var [C], weight [C], bias [C]) -> (x - mean) /
 * sqrt(var + eps) * weight + bias, as x * alpha + beta per channel. */
void kern_batch_norm(const kern_args *a) { per_channel(a, apply_consts, NULL); }

/* (x, mean, var, weight, dy, sums [2, C]) -> dx of a batch_norm whose mean
 * and var are x's batch statistics. */
void kern_batch_norm_backward(const kern_args *a) { per_channel(a, backward_consts, a->in[4]); }
