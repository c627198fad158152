/*
 * Row normalisations over the last dimension: softmax, log_softmax, and
 * layernorm with the two ops its backward pass uses (xhat and dx).  Rows
 * are independent, so threads split the rows; each row's sums use double
 * lanes in a fixed order.
 */
#include "runtime/kernels/kernels_ops.h"

#include "base/bf16.h"

#include <math.h>

/* Rows and row length of a [..., D] tensor (D of a rank-0 tensor is 1). */
static void row_view(const spmd_tensor *t, int64_t *rows, int64_t *d)
{
    *d = t->rank > 0 ? t->dims[t->rank - 1] : 1;
    *rows = *d > 0 ? kn_numel(t) / *d : 0;
}

/* ---- softmax, log_softmax ------------------------------------------------- */

/* x [..., D] -> softmax over D, max subtracted first. */
void kern_softmax(const kern_args *a)
{
    int64_t rows, d, b, e;
    row_view(a->node, &rows, &d);
    kern_split(rows, a->ith, a->nth, 1, &b, &e);
    const float *x = a->in[0];
    float *y = a->out;
    for (int64_t r = b; r < e; r++) kn_softmax_row(x + r * d, y + r * d, d);
}

/* x [..., D] -> x - max - log(sum exp(x - max)). */
void kern_log_softmax(const kern_args *a)
{
    int64_t rows, d, b, e;
    row_view(a->node, &rows, &d);
    kern_split(rows, a->ith, a->nth, 1, &b, &e);
    for (int64_t r = b; r < e; r++) {
        const float *restrict x = (const float *)a->in[0] + r * d;
        float *restrict y = (float *)a->out + r * d;
        if (d == 0) continue;
        float m = kn_max(x, d);
        /* y holds the exponentials only until the sum is taken. */
        for (int64_t i = 0; i < d; i++) y[i] = kn_expf(x[i] - m);
        float shift = m + (float)log(kn_sum(y, d));
        for (int64_t i = 0; i < d; i++) y[i] = x[i] - shift;
    }
}

/* ---- layernorm ------------------------------------------------------------ */

/* Mean and 1/sqrt(biased variance + eps) of one row, two-pass in double. */
static void row_moments(const float *restrict x, int64_t d, float eps, float *mu, float *rstd)
{
    double mean = d > 0 ? kn_sum(x, d) / (double)d : 0.0;
    double acc[KN_LANES] = {0};
    int64_t i = 0;
    for (; i + KN_LANES <= d; i += KN_LANES)
        for (int l = 0; l < KN_LANES; l++) {
            double c = (double)x[i + l] - mean;
            acc[l] += c * c;
        }
    for (int l = 0; i < d; i++, l++) {
        double c = (double)x[i] - mean;
        acc[l] += c * c;
    }
    double var = d > 0 ? kn_lanes_total(acc) / (double)d : 0.0;
    *mu = (float)mean;
    *rstd = (float)(1.0 / sqrt(var + (double)eps));
}

/* (x [..., D], gamma [D], beta [D]) -> (x - mean) * rstd * gamma + beta. */
void kern_layernorm(const kern_args *a)
{
    int64_t rows, d, b, e;
    row_view(a->node, &rows, &d);
    kern_split(rows, a->ith, a->nth, 1, &b, &e);
    const float eps = a->node->attr.norm.eps;
    const float *restrict g = a->in[1];
    const float *restrict be = a->in[2];
    for (int64_t r = b; r < e; r++) {
        const float *restrict x = (const float *)a->in[0] + r * d;
        float *restrict y = (float *)a->out + r * d;
        float mu, rs;
        row_moments(x, d, eps, &mu, &rs);
        for (int64_t i = 0; i < d; i++) y[i] = (x[i] - mu) * rs * g[i] + be[i];
    }
}

/* Row r of x [..., D] as f32: in place, or, for a bf16 x (an activation
 * kept in bf16 under mixed precision, ir/autocast.c), widened exactly into
 * the thread's scratch (D floats, compile's scratch_widen_row). */
static const float *row_f32(const kern_args *a, int64_t r, int64_t d)
{
    if (a->node->in[0]->dtype != SPMD_BF16) return (const float *)a->in[0] + r * d;
    float *w = a->scratch;
    bf16_to_f32_n(w, (const bf16_bits *)a->in[0] + r * d, (size_t)d);
    return w;
}

/* x [..., D] -> xhat = (x - mean) * rstd: the backward pass of layernorm
 * needs it for gamma's gradient (sum of dy * xhat). */
void kern_layernorm_xhat(const kern_args *a)
{
    int64_t rows, d, b, e;
    row_view(a->node, &rows, &d);
    kern_split(rows, a->ith, a->nth, 1, &b, &e);
    const float eps = a->node->attr.norm.eps;
    for (int64_t r = b; r < e; r++) {
        const float *restrict x = row_f32(a, r, d);
        float *restrict y = (float *)a->out + r * d;
        float mu, rs;
        row_moments(x, d, eps, &mu, &rs);
        for (int64_t i = 0; i < d; i++) y[i] = (x[i] - mu) * rs;
    }
}

/* (x [..., D], gamma [D], dy [..., D]) -> dx [..., D]:
 *   g = dy * gamma,  dx = rstd * (g - mean(g) - xhat * mean(g * xhat)). */
void kern_layernorm_backward(const kern_args *a)
{
    int64_t rows, d, b, e;
    row_view(a->node, &rows, &d);
    kern_split(rows, a->ith, a->nth, 1, &b, &e);
    const float eps = a->node->attr.norm.eps;
    const float *restrict gamma = a->in[1];
    for (int64_t r = b; r < e; r++) {
        const float *restrict x = row_f32(a, r, d);
        const float *restrict dy = (const float *)a->in[2] + r * d;
        float *restrict dx = (float *)a->out + r * d;
        float mu, rs;
        row_moments(x, d, eps, &mu, &rs);
        double sg[KN_LANES] = {0}, sgx[KN_LANES] = {0};
        int64_t i = 0;
        for (; i + KN_LANES <= d; i += KN_LANES)
            for (int l = 0; l < KN_LANES; l++) {
                float gi = dy[i + l] * gamma[i + l];
                float xh = (x[i + l] - mu) * rs;
                sg[l] += (double)gi;
                sgx[l] += (double)gi * (double)xh;
            }
        for (int l = 0; i < d; i++, l++) {
            float gi = dy[i] * gamma[i];
            float xh = (x[i] - mu) * rs;
            sg[l] += (double)gi;
            sgx[l] += (double)gi * (double)xh;
        }
        const float mg = (float)(kn_lanes_total(sg) / (double)d);
        const float mgx = (float)(kn_lanes_total(sgx) / (double)d);
        for (i = 0; i < d; i++) {
            float xh = (x[i] - mu) * rs;
            dx[i] = rs * (dy[i] * gamma[i] - mg - xh * mgx);
        }
    }
}
