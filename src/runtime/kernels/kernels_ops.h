/*
 * Internal to the CPU kernels: one declaration per kernel, generated from
 * ops.def's kernel column so that the table in kernels.c, these prototypes
 * and the definitions in kernels_*.c cannot drift apart; the elementwise
 * formulas, generated from its formula column; and the few helpers that
 * several kernel files share.
 *
 * kern_leaf appears on three rows, kern_reshape on two; repeating an
 * identical declaration is legal C.
 */
#ifndef SPMD_RUNTIME_KERNELS_OPS_H
#define SPMD_RUNTIME_KERNELS_OPS_H

#include "compile/compiled.h"
#include "runtime/kernels/kernels.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#define OP(e, name, arity, sig, lin, fix, vjp, kern, groups, formula, scratch, kind, bf16) void kern(const kern_args *args);
#include "ir/ops.def"
#undef OP

/* Elements of a shape (1 for rank 0). */
static inline int64_t kn_numel_dims(const int64_t *dims, int rank)
{
    int64_t n = 1;
    for (int i = 0; i < rank; i++) n *= dims[i];
    return n;
}

static inline int64_t kn_numel(const spmd_tensor *t) { return kn_numel_dims(t->dims, t->rank); }

/* Bytes per element of the dtypes the layout kernels move around. */
static inline size_t kn_elsize(spmd_dtype dtype) { return dtype == SPMD_BF16 ? 2 : 4; }

/* Eight double lanes, combined in a fixed order: the loop vectorises
 * without -ffast-math, and the result depends only on x and n, never on
 * which thread runs it. */
enum { KN_LANES = 8 };

static inline void kn_lanes_add(double *restrict acc, const float *restrict x, int64_t n)
{
    int64_t i = 0;
    for (; i + KN_LANES <= n; i += KN_LANES)
        for (int l = 0; l < KN_LANES; l++) acc[l] += (double)x[i + l];
    for (int l = 0; i < n; i++, l++) acc[l] += (double)x[i];
}

static inline double kn_lanes_total(const double *acc)
{
    double s = 0.0;
    for (int l = 0; l < KN_LANES; l++) s += acc[l];
    return s;
}

static inline double kn_sum(const float *restrict x, int64_t n)
{
    double acc[KN_LANES] = {0};
    kn_lanes_add(acc, x, n);
    return kn_lanes_total(acc);
}

/* Whether v replaces the running maximum m: larger, or the first NaN.
 * Bitwise operators, not || and &&, keep it free of branches so that
 * loops using it vectorise. */
static inline bool kn_max_takes(float v, float m) { return (v > m) | ((v != v) & (m == m)); }

/* Largest element; a NaN wins, like torch.max.  The main loop keeps 16
 * plain running maxima (v > m ? v : m, which vectorises) and a flag for
 * NaNs; only a row that holds a NaN is scanned again for its first one.
 * The maximum does not depend on the order it is taken in, so this equals
 * a left-to-right scan. */
static inline float kn_max(const float *restrict x, int64_t n)
{
    enum { W = 16 };
    float m = x[0];
    int nan = x[0] != x[0];
    int64_t i = 0;
    if (n >= 2 * W) {
        float lane[W];
        int lnan[W];
        for (int l = 0; l < W; l++) {
            lane[l] = x[l];
            lnan[l] = x[l] != x[l];
        }
        for (i = W; i + W <= n; i += W) {
            /* Unrolled, the lanes become 16 scalar selects that GCC does
             * not vectorise; kept as a loop, they become one vector. */
#pragma GCC unroll 1
            for (int l = 0; l < W; l++) {
                const float v = x[i + l];
                lane[l] = v > lane[l] ? v : lane[l];
                lnan[l] |= v != v;
            }
        }
        for (int l = 0; l < W; l++) {
            m = lane[l] > m ? lane[l] : m;
            nan |= lnan[l];
        }
    }
    for (; i < n; i++) {
        m = x[i] > m ? x[i] : m;
        nan |= x[i] != x[i];
    }
    if (nan)
        for (i = 0; i < n; i++)
            if (x[i] != x[i]) return x[i];
    return m;
}

/* e^x to about 1 ulp, written so that loops calling it vectorise (libm's
 * expf is a call that stops vectorisation, and exponentials dominate
 * softmax, attention and cross-entropy).  Cephes' method: x = n ln2 + r,
 * |r| <= ln2/2, e^r by a degree-6 polynomial, times 2^n built from the
 * exponent bits (as 2^(n-1) * 2, so n = 128 stays representable).
 * Results below e^-86 flush to 0; NaN and +-inf behave as in expf. */
static inline float kn_expf(float x)
{
    const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    float xc = x < -86.0f ? -86.0f : x;
    xc = xc > 88.72283f ? 88.72283f : xc;
    xc = x != x ? 0.0f : xc;
    const float t = xc * 1.44269504088896341f + magic;
    const float n = t - magic;
    float r = xc - n * 0.693359375f;  /* ln2 in two parts, so r is exact */
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t tb, mb;
    memcpy(&tb, &t, sizeof tb);
    memcpy(&mb, &magic, sizeof mb);
    const int32_t sbits = (tb - mb + 126) << 23; /* 2^(n-1) */
    float s;
    memcpy(&s, &sbits, sizeof s);
    float y = p * s * 2.0f;
    y = x < -86.0f ? 0.0f : y;
    y = x > 88.72283f ? INFINITY : y;
    return x != x ? x : y;
}

/* Softmax of one row into y (y may be x): the exponentials, then one
 * scale by 1/sum. */
static inline void kn_softmax_row(const float *x, float *y, int64_t n)
{
    if (n <= 0) return;
    float m = kn_max(x, n);
    for (int64_t i = 0; i < n; i++) y[i] = kn_expf(x[i] - m);
    float inv = (float)(1.0 / kn_sum(y, n));
    for (int64_t i = 0; i < n; i++) y[i] *= inv;
}

/* Attention works on blocks of this many query rows: the scratch the
 * compiled program sizes (compile_scratch_bytes) and the loops in
 * kernels_attention.c must agree. */
enum { KN_ATTN_BLOCK = COMPILE_ATTN_BLOCK };

/* Helpers of the elementwise formulas (ops.def) and of other kernels. */
#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_C 0.044715f

/* gelu(x) = 0.5 x (1 + tanh u), u = k (x + c x^3).  Since
 * 0.5 (1 + tanh u) = sigmoid(2u), this is x / (1 + e^-2u): one vectorised
 * exponential instead of a libm tanhf call, and no cancellation near 0. */
static inline float kn_gelu(float x)
{
    float u = GELU_K * (x + GELU_C * x * x * x);
    return x / (1.0f + kn_expf(-2.0f * u));
}

/* d gelu / dx = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) u'
 *             = s + 2 x s (1 - s) u',   s = sigmoid(2u), u' = k (1 + 3 c x^2). */
static inline float kn_gelu_grad(float x)
{
    float u = GELU_K * (x + GELU_C * x * x * x);
    float s = 1.0f / (1.0f + kn_expf(-2.0f * u));
    float du = GELU_K * (1.0f + 3.0f * GELU_C * x * x);
    return s + 2.0f * x * s * (1.0f - s) * du;
}

/* erfc(z) by the Chebyshev fit of Numerical Recipes' erfcc (fractional
 * error below 1.2e-7 in exact arithmetic; in float, within 1e-5 of the
 * true value relatively wherever it is above 1e-18): for a = |z|,
 * erfc(a) = t e^(P(t) - a^2), t = 1 / (1 + a/2), and erfc(-a) = 2 - erfc(a).
 * Branch-free over kn_expf, so the loops over it vectorise, where libm's
 * erfcf is a call per element (a seventh of a GELU-erf GPT's step). */
static inline float kn_erfcf(float z)
{
    const float a = fabsf(z);
    const float t = 1.0f / (1.0f + 0.5f * a);
    float p = 0.17087277f;
    p = p * t - 0.82215223f;
    p = p * t + 1.48851587f;
    p = p * t - 1.13520398f;
    p = p * t + 0.27886807f;
    p = p * t - 0.18628806f;
    p = p * t + 0.09678418f;
    p = p * t + 0.37409196f;
    p = p * t + 1.00002368f;
    p = p * t - 1.26551223f;
    const float e = t * kn_expf(p - a * a);
    return z >= 0.0f ? e : 2.0f - e;
}

/* Exact gelu(x) = 0.5 x (1 + erf(x / sqrt 2)), the 1 + erf written as
 * erfc(-x / sqrt 2) so that no cancellation loses the tail for x < 0. */
#define KN_SQRT1_2 0.70710678118654752f
#define KN_INV_SQRT_2PI 0.39894228040143268f

static inline float kn_gelu_erf(float x) { return 0.5f * x * kn_erfcf(-x * KN_SQRT1_2); }

/* d gelu / dx = 0.5 (1 + erf(x / sqrt 2)) + x e^(-x^2/2) / sqrt(2 pi). */
static inline float kn_gelu_erf_grad(float x)
{
    return 0.5f * kn_erfcf(-x * KN_SQRT1_2) + x * kn_expf(-0.5f * x * x) * KN_INV_SQRT_2PI;
}

/* sigmoid(x) = 1 / (1 + e^-x): for x far below 0, e^-x is +inf and the
 * result 0, never NaN; far above, e^-x is 0 and the result 1. */
static inline float kn_sigmoid(float x) { return 1.0f / (1.0f + kn_expf(-x)); }

/* silu(x) = x sigmoid(x), as x / (1 + e^-x) (torch's form): -0 for x far
 * below 0, x far above. */
static inline float kn_silu(float x) { return x / (1.0f + kn_expf(-x)); }

/* d silu / dx = s (1 + x (1 - s)), s = sigmoid(x). */
static inline float kn_silu_grad(float x)
{
    float s = kn_sigmoid(x);
    return s * (1.0f + x * (1.0f - s));
}

/* x^p, the exponents torch computes without pow (products, sqrt and
 * reciprocals) computed as torch does, powf otherwise. */
static inline float kn_pow(float x, float p)
{
    if (p == 2.0f) return x * x;
    if (p == 3.0f) return x * x * x;
    if (p == 1.0f) return x;
    if (p == 0.5f) return sqrtf(x);
    if (p == -0.5f) return 1.0f / sqrtf(x);
    if (p == -1.0f) return 1.0f / x;
    if (p == -2.0f) return 1.0f / (x * x);
    return powf(x, p);
}

/* relu passes NaN through, as torch.relu does. */
static inline float kn_relu(float x) { return x > 0.0f ? x : (x != x ? x : 0.0f); }
static inline float kn_rsqrt(float x) { return 1.0f / sqrtf(x); }
/* log1p keeps the small values of a very negative b x. */
static inline float kn_softplus(float x, float c)
{
    const float b = c == 0.0f ? 1.0f : c;
    return b * x > 20.0f ? x : log1pf(kn_expf(b * x)) / b;
}

/* ops.def's formula column, one function per op that has a formula:
 * ew_<ENUM>(x, c) for EW_UNARY (c is the node's attr.scale.c),
 * ew_<ENUM>(x, y) for EW_BINARY and ew_<ENUM>(x, y, z) for EW_TERNARY.  The op's own kernel
 * (kernels_elementwise.c) and kern_fused (kernels_fused.c) both call it,
 * so the formula is written once and a fused member computes its
 * kernel's bits (the build does not contract a*b+c into FMAs: ISO C
 * mode).  EW_* stay defined for kernels_fused.c, which generates its
 * switch from the same column. */
#define EW_NONE KN_EW_NONE, ()
#define EW_UNARY(...) KN_EW_UNARY, (__VA_ARGS__)
#define EW_BINARY(...) KN_EW_BINARY, (__VA_ARGS__)
#define EW_TERNARY(...) KN_EW_TERNARY, (__VA_ARGS__)
#define KN_EW_DEFINE(fn, kind, expr) KN_EW_DEFINE_##kind(fn, expr)
#define KN_EW_DEFINE_KN_EW_NONE(fn, expr)
#define KN_EW_DEFINE_KN_EW_UNARY(fn, expr)                                                         \
    static inline float fn(float x, float c)                                                       \
    {                                                                                              \
        (void)c;                                                                                   \
        return expr;                                                                               \
    }
#define KN_EW_DEFINE_KN_EW_BINARY(fn, expr)                                                        \
    static inline float fn(float x, float y) { return expr; }
#define KN_EW_DEFINE_KN_EW_TERNARY(fn, expr)                                                       \
    static inline float fn(float x, float y, float z) { return expr; }
#define OP(e, name, arity, sig, lin, fix, vjp, kern, groups, formula, scratch, kind, bf16)                     \
    KN_EW_DEFINE(ew_##e, formula)
#include "ir/ops.def"
#undef OP

static inline int64_t kn_min(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t kn_max_i(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int64_t kn_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

#endif
