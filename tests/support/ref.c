/*
 * Reference ops for tests (see ref.h): one output element at a time, its
 * multi-index decoded and the inputs read by index arithmetic.
 */
#include "ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define REF_PI 3.14159265358979323846

int64_t ref_numel(const int64_t *dims, int rank)
{
    int64_t n = 1;
    for (int i = 0; i < rank; i++) n *= dims[i];
    return n;
}

/* Multi-index of flat position `flat` in dims. */
static void unflatten(int64_t flat, const int64_t *dims, int rank, int64_t *idx)
{
    for (int i = rank - 1; i >= 0; i--) {
        idx[i] = dims[i] ? flat % dims[i] : 0;
        flat = dims[i] ? flat / dims[i] : 0;
    }
}

static int64_t flatten(const int64_t *idx, const int64_t *dims, int rank)
{
    int64_t f = 0;
    for (int i = 0; i < rank; i++) f = f * dims[i] + idx[i];
    return f;
}

int ref_broadcast_shape(const int64_t *ad, int ar, const int64_t *bd, int br, int64_t *od)
{
    int r = ar > br ? ar : br;
    for (int i = 0; i < r; i++) {
        int64_t x = i - (r - ar) >= 0 ? ad[i - (r - ar)] : 1;
        int64_t y = i - (r - br) >= 0 ? bd[i - (r - br)] : 1;
        if (x != y && x != 1 && y != 1) return -1;
        od[i] = x == 1 ? y : x;
    }
    return r;
}

/* Flat position in x (dims xd, rank xr) of the output index idx (rank r)
 * under broadcasting. */
static int64_t bcast_source(const int64_t *idx, int r, const int64_t *xd, int xr)
{
    int64_t f = 0;
    for (int i = 0; i < xr; i++) {
        int64_t j = idx[i + r - xr];
        f = f * xd[i] + (xd[i] == 1 ? 0 : j);
    }
    return f;
}

/* ---- Elementwise ---------------------------------------------------------------- */

void ref_fill(float *out, int64_t n, float value)
{
    for (int64_t i = 0; i < n; i++) out[i] = value;
}

void ref_binary(ref_binop op, const float *a, const int64_t *ad, int ar, const float *b,
                const int64_t *bd, int br, float *out)
{
    int64_t od[REF_MAX_RANK], idx[REF_MAX_RANK];
    int r = ref_broadcast_shape(ad, ar, bd, br, od);
    if (r < 0) return;
    int64_t n = ref_numel(od, r);
    for (int64_t i = 0; i < n; i++) {
        unflatten(i, od, r, idx);
        double x = a[bcast_source(idx, r, ad, ar)], y = b[bcast_source(idx, r, bd, br)];
        double z = 0;
        switch (op) {
        case REF_ADD: z = x + y; break;
        case REF_SUB: z = x - y; break;
        case REF_MUL: z = x * y; break;
        case REF_DIV: z = x / y; break;
        }
        out[i] = (float)z;
    }
}

void ref_expand(const float *x, const int64_t *xd, int xr, const int64_t *od, int orank,
                float *out)
{
    int64_t idx[REF_MAX_RANK];
    int64_t n = ref_numel(od, orank);
    for (int64_t i = 0; i < n; i++) {
        unflatten(i, od, orank, idx);
        out[i] = x[bcast_source(idx, orank, xd, xr)];
    }
}

static double gelu_d(double x)
{
    const double k = sqrt(2.0 / REF_PI);
    return 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)));
}

/* Philox-4x32-10 as its paper states it: ten rounds of two 32 x 32-bit
 * products whose halves are crossed with the other words and the round
 * key, the key bumped by the Weyl constants between rounds. */
static void ref_philox(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3], k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        uint64_t a = (uint64_t)0xD2511F53u * c0, b = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(b >> 32) ^ c1 ^ k0, n2 = (uint32_t)(a >> 32) ^ c3 ^ k1;
        c0 = n0, c1 = (uint32_t)b, c2 = n2, c3 = (uint32_t)a;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

void ref_dropout(const float *x, int64_t n, float p, uint64_t seed, uint64_t step, int micro,
                 int site, float *out)
{
    uint32_t words[4] = {(uint32_t)step, (uint32_t)(step >> 32), (uint32_t)micro, (uint32_t)site};
    uint32_t seed_key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)}, k[4];
    ref_philox(words, seed_key, k);
    double threshold = (double)p * 4294967296.0;
    float scale = (float)(1.0 / (1.0 - (double)p));
    for (int64_t i = 0; i < n; i++) {
        uint32_t ctr[4] = {(uint32_t)(i / 4), (uint32_t)((uint64_t)i >> 34), 0, 0}, bits[4];
        ref_philox(ctr, k, bits);
        out[i] = (double)bits[i % 4] >= floor(threshold) ? x[i] * scale : 0.0f;
    }
}

void ref_unary(ref_unop op, const float *x, int64_t n, float c, float *out)
{
    for (int64_t i = 0; i < n; i++) {
        double v = x[i], y = 0;
        switch (op) {
        case REF_SCALE: y = v * c; break;
        case REF_NEG: y = -v; break;
        case REF_EXP: y = exp(v); break;
        case REF_LOG: y = log(v); break;
        case REF_TANH: y = tanh(v); break;
        case REF_GELU: y = gelu_d(v); break;
        case REF_RELU: y = isnan(v) ? v : (v > 0 ? v : 0); break;
        case REF_SQRT: y = sqrt(v); break;
        case REF_RSQRT: y = 1.0 / sqrt(v); break;
        case REF_GELU_ERF: y = 0.5 * v * (1.0 + erf(v / sqrt(2.0))); break;
        case REF_SILU: y = v / (1.0 + exp(-v)); break;
        case REF_SIGMOID: y = 1.0 / (1.0 + exp(-v)); break;
        case REF_POW: y = pow(v, (double)c); break;
        }
        out[i] = (float)y;
    }
}

void ref_gelu_backward(const float *x, const float *dy, int64_t n, float *out)
{
    const double k = sqrt(2.0 / REF_PI), c = 0.044715;
    for (int64_t i = 0; i < n; i++) {
        double v = x[i];
        double th = tanh(k * (v + c * v * v * v));
        double g = 0.5 * (1 + th) + 0.5 * v * (1 - th * th) * k * (1 + 3 * c * v * v);
        out[i] = (float)(dy[i] * g);
    }
}

void ref_relu_backward(const float *x, const float *dy, int64_t n, float *out)
{
    for (int64_t i = 0; i < n; i++) out[i] = x[i] > 0 ? dy[i] : 0.0f;
}

void ref_gelu_erf_backward(const float *x, const float *dy, int64_t n, float *out)
{
    for (int64_t i = 0; i < n; i++) {
        double v = x[i];
        double g = 0.5 * (1.0 + erf(v / sqrt(2.0))) + v * exp(-0.5 * v * v) / sqrt(2.0 * REF_PI);
        out[i] = (float)(dy[i] * g);
    }
}

void ref_silu_backward(const float *x, const float *dy, int64_t n, float *out)
{
    for (int64_t i = 0; i < n; i++) {
        double v = x[i], s = 1.0 / (1.0 + exp(-v));
        out[i] = (float)(dy[i] * (s + v * s * (1.0 - s)));
    }
}

void ref_where(const float *cond, const int64_t *cd, int cr, const float *a, const int64_t *ad,
               int ar, const float *b, const int64_t *bd, int br, float *out)
{
    int64_t ab[REF_MAX_RANK], od[REF_MAX_RANK], idx[REF_MAX_RANK];
    int rab = ref_broadcast_shape(ad, ar, bd, br, ab);
    if (rab < 0) return;
    int r = ref_broadcast_shape(cd, cr, ab, rab, od);
    if (r < 0) return;
    int64_t n = ref_numel(od, r);
    for (int64_t i = 0; i < n; i++) {
        unflatten(i, od, r, idx);
        out[i] = cond[bcast_source(idx, r, cd, cr)] != 0 ? a[bcast_source(idx, r, ad, ar)]
                                                          : b[bcast_source(idx, r, bd, br)];
    }
}

/* ---- Reductions ------------------------------------------------------------------ */

/* The output dims of reducing `axes` of (xd, xr) (keepdim=false). */
static int reduced_dims(const int64_t *xd, int xr, uint32_t axes, int64_t *od)
{
    int r = 0;
    for (int i = 0; i < xr; i++)
        if (!((axes >> i) & 1u)) od[r++] = xd[i];
    return r;
}

/* One pass over x, each element added into its output's double sum. */
static void sum_or_mean(const float *x, const int64_t *xd, int xr, uint32_t axes, bool mean,
                        float *out)
{
    int64_t od[REF_MAX_RANK], idx[REF_MAX_RANK], oidx[REF_MAX_RANK];
    int orank = reduced_dims(xd, xr, axes, od);
    int64_t nout = ref_numel(od, orank), n = ref_numel(xd, xr), count = 1;
    for (int i = 0; i < xr; i++)
        if ((axes >> i) & 1u) count *= xd[i];
    if (nout == 0) return;
    double *acc = calloc((size_t)nout, sizeof *acc);
    if (!acc) return;
    for (int64_t i = 0; i < n; i++) {
        unflatten(i, xd, xr, idx);
        int r = 0;
        for (int d = 0; d < xr; d++)
            if (!((axes >> d) & 1u)) oidx[r++] = idx[d];
        acc[flatten(oidx, od, orank)] += x[i];
    }
    for (int64_t o = 0; o < nout; o++) out[o] = (float)(mean ? acc[o] / (double)count : acc[o]);
    free(acc);
}

void ref_sum(const float *x, const int64_t *xd, int xr, uint32_t axes, float *out)
{
    sum_or_mean(x, xd, xr, axes, false, out);
}

void ref_mean(const float *x, const int64_t *xd, int xr, uint32_t axes, float *out)
{
    sum_or_mean(x, xd, xr, axes, true, out);
}

/* Position along `axis` of the first maximum (first NaN if any) for the
 * output element whose multi-index, without axis, is oidx. */
static int64_t argmax_at(const float *x, const int64_t *xd, int xr, int axis,
                         const int64_t *oidx)
{
    int64_t idx[REF_MAX_RANK];
    for (int d = 0, r = 0; d < xr; d++)
        if (d != axis) idx[d] = oidx[r++];
    int64_t best = 0;
    for (int64_t l = 0; l < xd[axis]; l++) {
        idx[axis] = l;
        float v = x[flatten(idx, xd, xr)];
        idx[axis] = best;
        float m = x[flatten(idx, xd, xr)];
        if (isnan(m)) break;
        if (isnan(v) || v > m) best = l;
    }
    return best;
}

void ref_max(const float *x, const int64_t *xd, int xr, int axis, float *out)
{
    int64_t od[REF_MAX_RANK], oidx[REF_MAX_RANK], idx[REF_MAX_RANK];
    int orank = reduced_dims(xd, xr, 1u << axis, od);
    int64_t nout = ref_numel(od, orank);
    for (int64_t o = 0; o < nout; o++) {
        unflatten(o, od, orank, oidx);
        if (xd[axis] == 0) {
            out[o] = -INFINITY;
            continue;
        }
        int64_t l = argmax_at(x, xd, xr, axis, oidx);
        for (int d = 0, r = 0; d < xr; d++) idx[d] = d == axis ? l : oidx[r++];
        out[o] = x[flatten(idx, xd, xr)];
    }
}

void ref_max_backward(const float *x, const int64_t *xd, int xr, int axis, const float *dy,
                      float *out)
{
    int64_t od[REF_MAX_RANK], oidx[REF_MAX_RANK], idx[REF_MAX_RANK];
    int orank = reduced_dims(xd, xr, 1u << axis, od);
    memset(out, 0, (size_t)ref_numel(xd, xr) * sizeof *out);
    if (xd[axis] == 0) return;
    int64_t nout = ref_numel(od, orank);
    for (int64_t o = 0; o < nout; o++) {
        unflatten(o, od, orank, oidx);
        int64_t l = argmax_at(x, xd, xr, axis, oidx);
        for (int d = 0, r = 0; d < xr; d++) idx[d] = d == axis ? l : oidx[r++];
        out[flatten(idx, xd, xr)] = dy[o];
    }
}

void ref_cumsum(const float *x, const int64_t *xd, int xr, int axis, bool reverse, float *out)
{
    int64_t idx[REF_MAX_RANK];
    int64_t n = ref_numel(xd, xr);
    for (int64_t i = 0; i < n; i++) {
        unflatten(i, xd, xr, idx);
        int64_t at = idx[axis], from = reverse ? at : 0, to = reverse ? xd[axis] : at + 1;
        double acc = 0.0;
        for (int64_t l = from; l < to; l++) {
            idx[axis] = reverse ? to - 1 - (l - from) : l;
            acc += x[flatten(idx, xd, xr)];
        }
        out[i] = (float)acc;
    }
}

/* ---- Row normalisations ------------------------------------------------------------ */

static int64_t last_dim(const int64_t *xd, int xr) { return xr > 0 ? xd[xr - 1] : 1; }

void ref_softmax(const float *x, const int64_t *xd, int xr, float *out)
{
    int64_t d = last_dim(xd, xr), rows = d ? ref_numel(xd, xr) / d : 0;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr_ = x + r * d;
        double m = -INFINITY, s = 0;
        for (int64_t i = 0; i < d; i++) m = xr_[i] > m ? xr_[i] : m;
        for (int64_t i = 0; i < d; i++) s += exp(xr_[i] - m);
        for (int64_t i = 0; i < d; i++) out[r * d + i] = (float)(exp(xr_[i] - m) / s);
    }
}

void ref_log_softmax(const float *x, const int64_t *xd, int xr, float *out)
{
    int64_t d = last_dim(xd, xr), rows = d ? ref_numel(xd, xr) / d : 0;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr_ = x + r * d;
        double m = -INFINITY, s = 0;
        for (int64_t i = 0; i < d; i++) m = xr_[i] > m ? xr_[i] : m;
        for (int64_t i = 0; i < d; i++) s += exp(xr_[i] - m);
        for (int64_t i = 0; i < d; i++) out[r * d + i] = (float)(xr_[i] - m - log(s));
    }
}

static void moments(const float *x, int64_t d, double *mean, double *var)
{
    double s = 0, v = 0;
    for (int64_t i = 0; i < d; i++) s += x[i];
    *mean = s / (double)d;
    for (int64_t i = 0; i < d; i++) v += (x[i] - *mean) * (x[i] - *mean);
    *var = v / (double)d;
}

void ref_layernorm(const float *x, const int64_t *xd, int xr, const float *gamma,
                   const float *beta, float eps, float *out)
{
    int64_t d = last_dim(xd, xr), rows = d ? ref_numel(xd, xr) / d : 0;
    for (int64_t r = 0; r < rows; r++) {
        double mean, var;
        moments(x + r * d, d, &mean, &var);
        double rstd = 1.0 / sqrt(var + eps);
        for (int64_t i = 0; i < d; i++)
            out[r * d + i] = (float)((x[r * d + i] - mean) * rstd * gamma[i] + beta[i]);
    }
}

/* x [N, C, S...] as (n, c, s): the element of channel c at batch row n
 * and spatial offset s. */
static int64_t bn_spatial(const int64_t *xd, int xr) { return ref_numel(xd + 2, xr - 2); }

/* Per-channel mean and biased variance, the variance around `mean` when
 * given (else around the channel's own mean). */
static void channel_moments(const float *x, const int64_t *xd, int xr, int64_t c,
                            const float *mean, double *mu, double *var)
{
    int64_t n = xd[0], ch = xd[1], s = bn_spatial(xd, xr);
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < n; i++)
        for (int64_t k = 0; k < s; k++) sum += x[(i * ch + c) * s + k];
    *mu = mean ? (double)mean[c] : sum / (double)(n * s);
    for (int64_t i = 0; i < n; i++)
        for (int64_t k = 0; k < s; k++) {
            double d = x[(i * ch + c) * s + k] - *mu;
            sq += d * d;
        }
    *var = sq / (double)(n * s);
}

void ref_batch_norm_var(const float *x, const int64_t *xd, int xr, const float *mean, float *out)
{
    for (int64_t c = 0; c < xd[1]; c++) {
        double mu, var;
        channel_moments(x, xd, xr, c, mean, &mu, &var);
        out[c] = (float)var;
    }
}

void ref_batch_norm(const float *x, const int64_t *xd, int xr, const float *mean,
                    const float *var, const float *weight, const float *bias, float eps,
                    float *out)
{
    int64_t n = xd[0], ch = xd[1], s = bn_spatial(xd, xr);
    for (int64_t c = 0; c < ch; c++) {
        double mu, v;
        channel_moments(x, xd, xr, c, NULL, &mu, &v);
        if (mean) mu = mean[c];
        if (var) v = var[c];
        double rstd = 1.0 / sqrt(v + eps);
        for (int64_t i = 0; i < n; i++)
            for (int64_t k = 0; k < s; k++) {
                int64_t at = (i * ch + c) * s + k;
                out[at] = (float)((x[at] - mu) * rstd * weight[c] + bias[c]);
            }
    }
}

void ref_layernorm_xhat(const float *x, const int64_t *xd, int xr, float eps, float *out)
{
    int64_t d = last_dim(xd, xr), rows = d ? ref_numel(xd, xr) / d : 0;
    for (int64_t r = 0; r < rows; r++) {
        double mean, var;
        moments(x + r * d, d, &mean, &var);
        double rstd = 1.0 / sqrt(var + eps);
        for (int64_t i = 0; i < d; i++) out[r * d + i] = (float)((x[r * d + i] - mean) * rstd);
    }
}

void ref_layernorm_backward(const float *x, const int64_t *xd, int xr, const float *gamma,
                            const float *dy, float eps, float *out)
{
    int64_t d = last_dim(xd, xr), rows = d ? ref_numel(xd, xr) / d : 0;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr_ = x + r * d, *dyr = dy + r * d;
        double mean, var;
        moments(xr_, d, &mean, &var);
        double rstd = 1.0 / sqrt(var + eps), mg = 0, mgx = 0;
        for (int64_t i = 0; i < d; i++) {
            double g = (double)dyr[i] * gamma[i];
            mg += g;
            mgx += g * (xr_[i] - mean) * rstd;
        }
        mg /= (double)d;
        mgx /= (double)d;
        for (int64_t i = 0; i < d; i++) {
            double xh = (xr_[i] - mean) * rstd;
            out[r * d + i] = (float)(rstd * ((double)dyr[i] * gamma[i] - mg - xh * mgx));
        }
    }
}

/* ---- Pooling ------------------------------------------------------------------------ */

int64_t ref_pool_out(const ref_pool *p, int d, int64_t size)
{
    double span = (double)(size + 2 * p->padding[d] - p->dilation[d] * (p->kernel[d] - 1) - 1);
    double q = span / (double)p->stride[d];
    int64_t out = (int64_t)(p->ceil_mode ? ceil(q) : floor(q)) + 1;
    /* ceil_mode: the last window starts inside the input or its left padding */
    if (p->ceil_mode && (out - 1) * p->stride[d] >= size + p->padding[d]) out--;
    return out;
}

/* The planes, rows and columns of x [.., H, W] and of its pooled form. */
typedef struct ref_planes {
    int64_t n, h, w, oh, ow;
} ref_planes;

static ref_planes planes_of(const int64_t *xd, int xr, int64_t oh, int64_t ow)
{
    return (ref_planes){ref_numel(xd, xr - 2), xd[xr - 2], xd[xr - 1], oh, ow};
}

/* The window's maximum over its positions inside the input, scanned in
 * row-major order; *at its flat position in the plane (the first valid
 * one when no value beats -inf), -1 for none. */
static double max_window(const float *x, const ref_planes *s, const ref_pool *p, int64_t i,
                         int64_t j, int64_t *at)
{
    double m = -INFINITY;
    *at = -1;
    for (int64_t ki = 0; ki < p->kernel[0]; ki++) {
        int64_t r = i * p->stride[0] - p->padding[0] + ki * p->dilation[0];
        if (r < 0 || r >= s->h) continue;
        for (int64_t kj = 0; kj < p->kernel[1]; kj++) {
            int64_t c = j * p->stride[1] - p->padding[1] + kj * p->dilation[1];
            if (c < 0 || c >= s->w) continue;
            double v = x[r * s->w + c];
            if (*at < 0 || v > m || isnan(v)) {
                m = v;
                *at = r * s->w + c;
            }
        }
    }
    return m;
}

void ref_max_pool2d(const float *x, const int64_t *xd, int xr, const ref_pool *p, float *out)
{
    ref_planes s = planes_of(xd, xr, ref_pool_out(p, 0, xd[xr - 2]), ref_pool_out(p, 1, xd[xr - 1]));
    for (int64_t n = 0; n < s.n; n++)
        for (int64_t i = 0; i < s.oh; i++)
            for (int64_t j = 0; j < s.ow; j++) {
                int64_t at;
                out[(n * s.oh + i) * s.ow + j] = (float)max_window(x + n * s.h * s.w, &s, p, i, j, &at);
            }
}

void ref_max_pool2d_backward(const float *x, const int64_t *xd, int xr, const ref_pool *p,
                             const float *dy, float *out)
{
    ref_planes s = planes_of(xd, xr, ref_pool_out(p, 0, xd[xr - 2]), ref_pool_out(p, 1, xd[xr - 1]));
    int64_t n_in = ref_numel(xd, xr);
    double *acc = calloc((size_t)(n_in ? n_in : 1), sizeof *acc);
    if (!acc) abort();
    for (int64_t n = 0; n < s.n; n++)
        for (int64_t i = 0; i < s.oh; i++)
            for (int64_t j = 0; j < s.ow; j++) {
                int64_t at;
                max_window(x + n * s.h * s.w, &s, p, i, j, &at);
                if (at >= 0) acc[n * s.h * s.w + at] += dy[(n * s.oh + i) * s.ow + j];
            }
    for (int64_t k = 0; k < n_in; k++) out[k] = (float)acc[k];
    free(acc);
}

/* Output (i, j)'s window inside the input, rows [r0, r1) and columns
 * [c0, c1), and its divisor (0 when the window is empty). */
static int64_t avg_window(const ref_planes *s, const ref_pool *p, int64_t i, int64_t j,
                          int64_t *r0, int64_t *r1, int64_t *c0, int64_t *c1)
{
    int64_t rs = i * p->stride[0] - p->padding[0], cs = j * p->stride[1] - p->padding[1];
    /* A window ends at its kernel's end or the far padding's, whichever is first. */
    int64_t re = rs + p->kernel[0] < s->h + p->padding[0] ? rs + p->kernel[0] : s->h + p->padding[0];
    int64_t ce = cs + p->kernel[1] < s->w + p->padding[1] ? cs + p->kernel[1] : s->w + p->padding[1];
    int64_t padded = (re - rs) * (ce - cs);
    *r0 = rs < 0 ? 0 : rs, *r1 = re > s->h ? s->h : re;
    *c0 = cs < 0 ? 0 : cs, *c1 = ce > s->w ? s->w : ce;
    if (*r1 <= *r0 || *c1 <= *c0) return 0;
    if (p->divisor_override > 0) return p->divisor_override;
    return p->count_include_pad ? padded : (*r1 - *r0) * (*c1 - *c0);
}

void ref_avg_pool2d(const float *x, const int64_t *xd, int xr, const ref_pool *p, float *out)
{
    ref_planes s = planes_of(xd, xr, ref_pool_out(p, 0, xd[xr - 2]), ref_pool_out(p, 1, xd[xr - 1]));
    for (int64_t n = 0; n < s.n; n++)
        for (int64_t i = 0; i < s.oh; i++)
            for (int64_t j = 0; j < s.ow; j++) {
                int64_t r0, r1, c0, c1, div = avg_window(&s, p, i, j, &r0, &r1, &c0, &c1);
                double sum = 0;
                for (int64_t r = r0; r < r1; r++)
                    for (int64_t c = c0; c < c1; c++) sum += x[(n * s.h + r) * s.w + c];
                out[(n * s.oh + i) * s.ow + j] = div ? (float)(sum / (double)div) : 0.0f;
            }
}

void ref_avg_pool2d_backward(const float *dy, const int64_t *xd, int xr, const ref_pool *p,
                             float *out)
{
    ref_planes s = planes_of(xd, xr, ref_pool_out(p, 0, xd[xr - 2]), ref_pool_out(p, 1, xd[xr - 1]));
    int64_t n_in = ref_numel(xd, xr);
    double *acc = calloc((size_t)(n_in ? n_in : 1), sizeof *acc);
    if (!acc) abort();
    for (int64_t n = 0; n < s.n; n++)
        for (int64_t i = 0; i < s.oh; i++)
            for (int64_t j = 0; j < s.ow; j++) {
                int64_t r0, r1, c0, c1, div = avg_window(&s, p, i, j, &r0, &r1, &c0, &c1);
                if (!div) continue;
                double share = dy[(n * s.oh + i) * s.ow + j] / (double)div;
                for (int64_t r = r0; r < r1; r++)
                    for (int64_t c = c0; c < c1; c++) acc[(n * s.h + r) * s.w + c] += share;
            }
    for (int64_t k = 0; k < n_in; k++) out[k] = (float)acc[k];
    free(acc);
}

/* Output i of `out` along a dim of `size`: [floor(i size / out), ceil((i + 1) size / out)). */
static void adaptive_range(int64_t i, int64_t out, int64_t size, int64_t *lo, int64_t *hi)
{
    *lo = (int64_t)floor((double)i * (double)size / (double)out);
    *hi = (int64_t)ceil((double)(i + 1) * (double)size / (double)out);
}

void ref_adaptive_avg_pool2d(const float *x, const int64_t *xd, int xr, int64_t oh, int64_t ow,
                             float *out)
{
    ref_planes s = planes_of(xd, xr, oh, ow);
    for (int64_t n = 0; n < s.n; n++)
        for (int64_t i = 0; i < s.oh; i++)
            for (int64_t j = 0; j < s.ow; j++) {
                int64_t r0, r1, c0, c1;
                adaptive_range(i, s.oh, s.h, &r0, &r1);
                adaptive_range(j, s.ow, s.w, &c0, &c1);
                double sum = 0;
                for (int64_t r = r0; r < r1; r++)
                    for (int64_t c = c0; c < c1; c++) sum += x[(n * s.h + r) * s.w + c];
                out[(n * s.oh + i) * s.ow + j] = (float)(sum / (double)((r1 - r0) * (c1 - c0)));
            }
}

void ref_adaptive_avg_pool2d_backward(const float *dy, const int64_t *xd, int xr, int64_t oh,
                                      int64_t ow, float *out)
{
    ref_planes s = planes_of(xd, xr, oh, ow);
    int64_t n_in = ref_numel(xd, xr);
    double *acc = calloc((size_t)(n_in ? n_in : 1), sizeof *acc);
    if (!acc) abort();
    for (int64_t n = 0; n < s.n; n++)
        for (int64_t i = 0; i < s.oh; i++)
            for (int64_t j = 0; j < s.ow; j++) {
                int64_t r0, r1, c0, c1;
                adaptive_range(i, s.oh, s.h, &r0, &r1);
                adaptive_range(j, s.ow, s.w, &c0, &c1);
                double share = dy[(n * s.oh + i) * s.ow + j] / (double)((r1 - r0) * (c1 - c0));
                for (int64_t r = r0; r < r1; r++)
                    for (int64_t c = c0; c < c1; c++) acc[(n * s.h + r) * s.w + c] += share;
            }
    for (int64_t k = 0; k < n_in; k++) out[k] = (float)acc[k];
    free(acc);
}

/* ---- Linear algebra --------------------------------------------------------------------- */

/* out[m, n] = sum_k A(m, k) B(k, n), with A(m, k) = a[m * sam + k * sak]
 * and B(k, n) = b[k * sbk + n * sbn]. */
static void gemm_ref(int64_t M, int64_t N, int64_t K, const float *a, int64_t sam, int64_t sak,
                     const float *b, int64_t sbk, int64_t sbn, float *out)
{
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double s = 0;
            for (int64_t k = 0; k < K; k++) s += (double)a[m * sam + k * sak] * b[k * sbk + n * sbn];
            out[m * N + n] = (float)s;
        }
}

void ref_matmul(const float *a, const int64_t *ad, int ar, const float *b, const int64_t *bd,
                int br, bool ta, bool tb, float *out)
{
    (void)br;
    if (!ta) {
        int64_t K = ad[ar - 1], M = K ? ref_numel(ad, ar) / K : 0;
        int64_t N = tb ? bd[0] : bd[1];
        if (!K) M = ref_numel(ad, ar - 1);
        /* a [M, K]; b [K, N] or [N, K]. */
        gemm_ref(M, N, K, a, K, 1, b, tb ? 1 : N, tb ? K : 1, out);
    } else {
        int64_t M = ad[ar - 1], K = M ? ref_numel(ad, ar) / M : 0;
        int64_t N = tb ? bd[0] : bd[br - 1];
        /* a [K, M]; b [K, N] or [N, K]. */
        gemm_ref(M, N, K, a, 1, M, b, tb ? 1 : N, tb ? K : 1, out);
    }
}

void ref_bmm(const float *a, const int64_t *ad, int ar, const float *b, const int64_t *bd,
             int br, bool ta, bool tb, float *out)
{
    int64_t M = ta ? ad[ar - 1] : ad[ar - 2], K = ta ? ad[ar - 2] : ad[ar - 1];
    int64_t N = tb ? bd[br - 2] : bd[br - 1];
    int64_t batch = ref_numel(ad, ar - 2);
    for (int64_t i = 0; i < batch; i++)
        gemm_ref(M, N, K, a + i * M * K, ta ? 1 : K, ta ? M : 1, b + i * K * N, tb ? 1 : N,
                 tb ? K : 1, out + i * M * N);
}

/* ---- Convolution ---- */

void ref_conv_shape(ref_conv *c)
{
    c->y[0] = c->x[0];
    c->y[1] = c->w[0];
    for (int d = 0; d < 2; d++)
        c->y[2 + d] = (c->x[2 + d] + 2 * c->pad[d] - c->dilation[d] * (c->w[2 + d] - 1) - 1) /
                          c->stride[d] + 1;
}

/* Which of the three the loop below accumulates into. */
enum { CONV_Y, CONV_DX, CONV_DW };

/* Every term x[n, ci, iy, ix] * w[o, cg, i, j] of y[n, o, oy, ox], summed
 * in double into the one `what` names: y (from x and w), dx (from dy and
 * w, a = dy) or dw (from x and dy, b = dy). */
static void conv_terms(const ref_conv *c, int what, const float *a, const float *b, float *out)
{
    const int64_t *X = c->x, *W = c->w, *Y = c->y;
    const int64_t cpg = X[1] / c->groups, opg = W[0] / c->groups;
    const int64_t n_out = ref_numel(what == CONV_Y ? Y : what == CONV_DX ? X : W, 4);
    double *acc = calloc((size_t)(n_out ? n_out : 1), sizeof *acc);
    for (int64_t n = 0; n < X[0]; n++)
        for (int64_t o = 0; o < W[0]; o++)
            for (int64_t oy = 0; oy < Y[2]; oy++)
                for (int64_t ox = 0; ox < Y[3]; ox++)
                    for (int64_t cg = 0; cg < cpg; cg++)
                        for (int64_t i = 0; i < W[2]; i++)
                            for (int64_t j = 0; j < W[3]; j++) {
                                int64_t iy = oy * c->stride[0] - c->pad[0] + i * c->dilation[0];
                                int64_t ix = ox * c->stride[1] - c->pad[1] + j * c->dilation[1];
                                if (iy < 0 || iy >= X[2] || ix < 0 || ix >= X[3]) continue;
                                int64_t ci = o / opg * cpg + cg;
                                int64_t xi = ((n * X[1] + ci) * X[2] + iy) * X[3] + ix;
                                int64_t wi = ((o * W[1] + cg) * W[2] + i) * W[3] + j;
                                int64_t yi = ((n * Y[1] + o) * Y[2] + oy) * Y[3] + ox;
                                if (what == CONV_Y) acc[yi] += (double)a[xi] * b[wi];
                                else if (what == CONV_DX) acc[xi] += (double)a[yi] * b[wi];
                                else acc[wi] += (double)a[xi] * b[yi];
                            }
    for (int64_t i = 0; i < n_out; i++) out[i] = (float)acc[i];
    free(acc);
}

void ref_conv2d(const ref_conv *c, const float *x, const float *w, float *y)
{
    conv_terms(c, CONV_Y, x, w, y);
}

void ref_conv2d_backward_input(const ref_conv *c, const float *dy, const float *w, float *dx)
{
    conv_terms(c, CONV_DX, dy, w, dx);
}

void ref_conv2d_backward_weight(const ref_conv *c, const float *x, const float *dy, float *dw)
{
    conv_terms(c, CONV_DW, x, dy, dw);
}

/* Probabilities p[s] (s <= t) of query t of head h in batch b. */
static void attn_row(const float *q, const float *k, int64_t T, int64_t C, int64_t D,
                     int64_t b, int64_t h, int64_t t, double *p)
{
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j <= t; j++) {
        double dot = 0;
        for (int64_t c = 0; c < D; c++)
            dot += (double)q[(b * T + t) * C + h * D + c] * k[(b * T + j) * C + h * D + c];
        p[j] = dot / sqrt((double)D);
        m = p[j] > m ? p[j] : m;
    }
    for (int64_t j = 0; j <= t; j++) s += (p[j] = exp(p[j] - m));
    for (int64_t j = 0; j <= t; j++) p[j] /= s;
}

void ref_attention(const float *q, const float *k, const float *v, int64_t B, int64_t T,
                   int64_t C, int heads, float *out)
{
    int64_t D = C / heads;
    double *p = malloc((size_t)(T ? T : 1) * sizeof *p);
    if (!p) return;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < heads; h++)
            for (int64_t t = 0; t < T; t++) {
                attn_row(q, k, T, C, D, b, h, t, p);
                for (int64_t c = 0; c < D; c++) {
                    double s = 0;
                    for (int64_t j = 0; j <= t; j++) s += p[j] * v[(b * T + j) * C + h * D + c];
                    out[(b * T + t) * C + h * D + c] = (float)s;
                }
            }
    free(p);
}

void ref_cache_write(const float *cache, const float *rows, int64_t B, int64_t S, int64_t T,
                     int64_t C, int64_t pos, float *out)
{
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++)
            for (int64_t c = 0; c < C; c++) {
                bool is_new = s >= pos && s < pos + T;
                out[(b * S + s) * C + c] =
                    is_new ? rows[(b * T + s - pos) * C + c] : cache[(b * S + s) * C + c];
            }
}

void ref_cached_attention(const float *q, const float *k, const float *v, int64_t B, int64_t T,
                          int64_t S, int64_t C, int heads, int64_t pos, float *out)
{
    int64_t D = C / heads;
    double *p = malloc((size_t)(S ? S : 1) * sizeof *p);
    if (!p) return;
    const double scale = 1.0 / sqrt((double)D);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < heads; h++)
            for (int64_t t = 0; t < T; t++) {
                int64_t n = pos + t + 1; /* keys 0 .. pos + t */
                double m = -INFINITY, sum = 0;
                for (int64_t j = 0; j < n; j++) {
                    double s = 0;
                    for (int64_t e = 0; e < D; e++)
                        s += (double)q[(b * T + t) * C + h * D + e] * k[(b * S + j) * C + h * D + e];
                    p[j] = s * scale;
                    m = p[j] > m ? p[j] : m;
                }
                for (int64_t j = 0; j < n; j++) sum += p[j] = exp(p[j] - m);
                for (int64_t e = 0; e < D; e++) {
                    double s = 0;
                    for (int64_t j = 0; j < n; j++) s += p[j] / sum * v[(b * S + j) * C + h * D + e];
                    out[(b * T + t) * C + h * D + e] = (float)s;
                }
            }
    free(p);
}

void ref_attention_backward(const float *q, const float *k, const float *v, const float *dout,
                            int64_t B, int64_t T, int64_t C, int heads, float *out)
{
    int64_t D = C / heads, n = B * T * C;
    double *acc = calloc((size_t)(n > 0 ? 3 * n : 1), sizeof *acc);
    double *p = malloc((size_t)(T ? T : 1) * sizeof *p);
    double *dp = malloc((size_t)(T ? T : 1) * sizeof *dp);
    if (!acc || !p || !dp) goto done;
    double *dq = acc, *dk = acc + n, *dv = acc + 2 * n;
    const double scale = 1.0 / sqrt((double)D);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < heads; h++)
            for (int64_t t = 0; t < T; t++) {
                attn_row(q, k, T, C, D, b, h, t, p);
                const float *dot_ = dout + (b * T + t) * C + h * D;
                /* dP[j] = dO_t . v_j; dS = P (dP - sum P dP). */
                double c = 0;
                for (int64_t j = 0; j <= t; j++) {
                    double s = 0;
                    for (int64_t e = 0; e < D; e++) s += (double)dot_[e] * v[(b * T + j) * C + h * D + e];
                    dp[j] = s;
                    c += p[j] * s;
                }
                for (int64_t j = 0; j <= t; j++) {
                    double ds = p[j] * (dp[j] - c) * scale;
                    for (int64_t e = 0; e < D; e++) {
                        int64_t it = (b * T + t) * C + h * D + e, ij = (b * T + j) * C + h * D + e;
                        dq[it] += ds * k[ij];
                        dk[ij] += ds * q[it];
                        dv[ij] += p[j] * dot_[e];
                    }
                }
            }
    for (int64_t i = 0; i < 3 * n; i++) out[i] = (float)acc[i];
done:
    free(acc);
    free(p);
    free(dp);
}

/* ---- Lookups and losses ----------------------------------------------------------------- */

int64_t ref_embedding(const float *table, int64_t V, int64_t D, const int32_t *ids, int64_t n,
                      float *out)
{
    int64_t bad = -1;
    for (int64_t i = 0; i < n; i++) {
        bool ok = ids[i] >= 0 && ids[i] < V;
        if (!ok && bad < 0) bad = i;
        for (int64_t j = 0; j < D; j++) out[i * D + j] = ok ? table[ids[i] * D + j] : 0.0f;
    }
    return bad;
}

void ref_embedding_backward(const int32_t *ids, int64_t n, const float *dout, int64_t V,
                            int64_t D, float *out)
{
    double *acc = calloc((size_t)(V * D > 0 ? V * D : 1), sizeof *acc);
    if (!acc) return;
    for (int64_t i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < V)
            for (int64_t j = 0; j < D; j++) acc[ids[i] * D + j] += dout[i * D + j];
    for (int64_t i = 0; i < V * D; i++) out[i] = (float)acc[i];
    free(acc);
}

float ref_cross_entropy(const float *logits, int64_t rows, int64_t V, const int32_t *targets,
                        int64_t *first_bad)
{
    double total = 0;
    if (first_bad) *first_bad = -1;
    for (int64_t r = 0; r < rows; r++) {
        if (targets[r] < 0 || targets[r] >= V) {
            if (first_bad && *first_bad < 0) *first_bad = r;
            continue;
        }
        const float *x = logits + r * V;
        double m = -INFINITY, s = 0;
        for (int64_t i = 0; i < V; i++) m = x[i] > m ? x[i] : m;
        for (int64_t i = 0; i < V; i++) s += exp(x[i] - m);
        total += m + log(s) - x[targets[r]];
    }
    return (float)(total / (double)rows);
}

void ref_cross_entropy_backward(const float *logits, int64_t rows, int64_t V,
                                const int32_t *targets, float dloss, float *out)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *x = logits + r * V;
        float *y = out + r * V;
        if (targets[r] < 0 || targets[r] >= V) {
            for (int64_t i = 0; i < V; i++) y[i] = 0.0f;
            continue;
        }
        double m = -INFINITY, s = 0;
        for (int64_t i = 0; i < V; i++) m = x[i] > m ? x[i] : m;
        for (int64_t i = 0; i < V; i++) s += exp(x[i] - m);
        for (int64_t i = 0; i < V; i++) {
            double p = exp(x[i] - m) / s - (i == targets[r] ? 1.0 : 0.0);
            y[i] = (float)(p * dloss / (double)rows);
        }
    }
}

float ref_mse(const float *a, const float *b, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    return (float)(s / (double)n);
}

/* ---- Layout ------------------------------------------------------------------------------ */

void ref_permute(const float *x, const int64_t *xd, int xr, const int *perm, float *out)
{
    int64_t od[REF_MAX_RANK], oidx[REF_MAX_RANK], idx[REF_MAX_RANK];
    for (int i = 0; i < xr; i++) od[i] = xd[perm[i]];
    int64_t n = ref_numel(xd, xr);
    for (int64_t o = 0; o < n; o++) {
        unflatten(o, od, xr, oidx);
        for (int i = 0; i < xr; i++) idx[perm[i]] = oidx[i];
        out[o] = x[flatten(idx, xd, xr)];
    }
}

void ref_slice(const float *x, const int64_t *xd, int xr, int axis, int64_t start, int64_t len,
               float *out)
{
    int64_t od[REF_MAX_RANK], idx[REF_MAX_RANK];
    memcpy(od, xd, (size_t)xr * sizeof *od);
    od[axis] = len;
    int64_t n = ref_numel(od, xr);
    for (int64_t o = 0; o < n; o++) {
        unflatten(o, od, xr, idx);
        idx[axis] += start;
        out[o] = x[flatten(idx, xd, xr)];
    }
}

void ref_pad(const float *x, const int64_t *xd, int xr, int axis, int64_t start, int64_t total,
             float *out)
{
    int64_t od[REF_MAX_RANK], idx[REF_MAX_RANK];
    memcpy(od, xd, (size_t)xr * sizeof *od);
    od[axis] = total;
    int64_t n = ref_numel(od, xr);
    for (int64_t o = 0; o < n; o++) {
        unflatten(o, od, xr, idx);
        int64_t j = idx[axis] - start;
        if (j < 0 || j >= xd[axis]) {
            out[o] = 0.0f;
            continue;
        }
        idx[axis] = j;
        out[o] = x[flatten(idx, xd, xr)];
    }
}

void ref_concat(const float *const *xs, const int64_t *const *xdims, int n, int rank, int axis,
                float *out)
{
    int64_t od[REF_MAX_RANK], idx[REF_MAX_RANK];
    memcpy(od, xdims[0], (size_t)rank * sizeof *od);
    od[axis] = 0;
    for (int i = 0; i < n; i++) od[axis] += xdims[i][axis];
    int64_t total = ref_numel(od, rank);
    for (int64_t o = 0; o < total; o++) {
        unflatten(o, od, rank, idx);
        int i = 0;
        while (idx[axis] >= xdims[i][axis]) idx[axis] -= xdims[i++][axis];
        out[o] = xs[i][flatten(idx, xdims[i], rank)];
    }
}
