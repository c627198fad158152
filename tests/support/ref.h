/*
 * Reference implementations of libspmd's ops for tests: plain loops over
 * multi-indices, every sum and every intermediate in double, rounded to
 * float once at the end.  They are meant to be obviously right rather
 * than fast, and share no code with the library.
 *
 * Conventions:
 *   - tensors are contiguous row-major float arrays (int32 for ids and
 *     targets) described by (dims, rank); rank 0 is one element;
 *   - the caller allocates every output; its shape is stated per function;
 *   - reductions write the same layout whether or not a dim is "kept", so
 *     there is no keepdim argument;
 *   - semantics follow include/spmd/spmd.h (PyTorch conventions).
 */
#ifndef SPMD_TESTS_REF_H
#define SPMD_TESTS_REF_H

#include <stdbool.h>
#include <stdint.h>

#define REF_MAX_RANK 6

int64_t ref_numel(const int64_t *dims, int rank);

/* numpy broadcasting of two shapes into od; returns the output rank, or
 * -1 when the shapes do not broadcast. */
int ref_broadcast_shape(const int64_t *ad, int ar, const int64_t *bd, int br, int64_t *od);

/* ---- Elementwise -------------------------------------------------------- */

typedef enum ref_binop { REF_ADD, REF_SUB, REF_MUL, REF_DIV } ref_binop;

typedef enum ref_unop {
    REF_SCALE, /* x * c */
    REF_NEG,
    REF_EXP,
    REF_LOG,
    REF_TANH,
    REF_GELU,  /* tanh form */
    REF_RELU,  /* NaN passes through */
    REF_SQRT,
    REF_RSQRT,
    REF_GELU_ERF, /* 0.5 x (1 + erf(x / sqrt 2)) */
    REF_SILU,     /* x sigmoid(x) */
    REF_SIGMOID,
    REF_POW       /* x^c */
} ref_unop;

void ref_fill(float *out, int64_t n, float value);
/* out: the broadcast shape of a and b. */
void ref_binary(ref_binop op, const float *a, const int64_t *ad, int ar, const float *b,
                const int64_t *bd, int br, float *out);
/* x broadcast to (od, orank). */
void ref_expand(const float *x, const int64_t *xd, int xr, const int64_t *od, int orank,
                float *out);
/* out[i] = f(x[i]) for n elements; c is used by REF_SCALE and REF_POW only. */
void ref_unary(ref_unop op, const float *x, int64_t n, float c, float *out);
/* Dropout of n elements, element i the i-th of the whole tensor:
 * x[i] / (1 - p) unless 32 bits of Philox-4x32-10 fall below p * 2^32,
 * else 0.  The bits are word i % 4 of Philox(counter (i / 4, 0, 0),
 * key k), k the first two words of Philox(counter (step, 0, micro, site),
 * key seed) (docs/DESIGN.md, "Random numbers"). */
void ref_dropout(const float *x, int64_t n, float p, uint64_t seed, uint64_t step, int micro,
                 int site, float *out);
/* dx = dy * gelu'(x), dy * (x > 0); n elements. */
void ref_gelu_backward(const float *x, const float *dy, int64_t n, float *out);
void ref_relu_backward(const float *x, const float *dy, int64_t n, float *out);
/* dx = dy * gelu_erf'(x), dy * silu'(x); n elements. */
void ref_gelu_erf_backward(const float *x, const float *dy, int64_t n, float *out);
void ref_silu_backward(const float *x, const float *dy, int64_t n, float *out);
/* out = cond != 0 ? a : b, numpy broadcasting over the three (out: their
 * broadcast shape); cond's values as floats. */
void ref_where(const float *cond, const int64_t *cd, int cr, const float *a, const int64_t *ad,
               int ar, const float *b, const int64_t *bd, int br, float *out);

/* ---- Reductions ---------------------------------------------------------- */

/* Over the dims whose bit is set in `axes`; out: x's dims without them. */
void ref_sum(const float *x, const int64_t *xd, int xr, uint32_t axes, float *out);
void ref_mean(const float *x, const int64_t *xd, int xr, uint32_t axes, float *out);
/* Max over `axis` (a NaN, the first, wins); out: x's dims without axis. */
void ref_max(const float *x, const int64_t *xd, int xr, int axis, float *out);
/* dx (x's shape): dy (the reduced shape) at the first maximum, else 0. */
void ref_max_backward(const float *x, const int64_t *xd, int xr, int axis, const float *dy,
                      float *out);

/* Running sums along `axis` (from the end with reverse), each in double
 * by its own multi-index walk; out: x's shape. */
void ref_cumsum(const float *x, const int64_t *xd, int xr, int axis, bool reverse, float *out);

/* ---- Row normalisations (last dim) ----------------------------------------- */

/* out: x's shape. */
void ref_softmax(const float *x, const int64_t *xd, int xr, float *out);
void ref_log_softmax(const float *x, const int64_t *xd, int xr, float *out);
/* x [..., D], gamma [D], beta [D]; biased variance. */
void ref_layernorm(const float *x, const int64_t *xd, int xr, const float *gamma,
                   const float *beta, float eps, float *out);
void ref_layernorm_xhat(const float *x, const int64_t *xd, int xr, float eps, float *out);
/* dx of layernorm given dy (x's shape). */
void ref_layernorm_backward(const float *x, const int64_t *xd, int xr, const float *gamma,
                            const float *dy, float eps, float *out);

/* ---- Pooling over the last two dims (x [.., H, W]) ----------------------------- */

/* A window (torch's pooling arguments), pairs (rows, columns), stride
 * and dilation given (never 0). */
typedef struct ref_pool {
    int64_t kernel[2], stride[2], padding[2], dilation[2];
    bool ceil_mode, count_include_pad;
    int64_t divisor_override; /* > 0: every window's divisor */
} ref_pool;

/* The pooled size of a dim of `size` along pair member d. */
int64_t ref_pool_out(const ref_pool *p, int d, int64_t size);
/* out [.., OH, OW]: each window's maximum of the positions inside x (a
 * NaN wins), -inf for a window without one. */
void ref_max_pool2d(const float *x, const int64_t *xd, int xr, const ref_pool *p, float *out);
/* dx (x's shape): dy [.., OH, OW] added at each window's first maximum in
 * row-major order (the last NaN, if any). */
void ref_max_pool2d_backward(const float *x, const int64_t *xd, int xr, const ref_pool *p,
                             const float *dy, float *out);
/* out [.., OH, OW]: each window's mean (its divisor as torch's). */
void ref_avg_pool2d(const float *x, const int64_t *xd, int xr, const ref_pool *p, float *out);
/* dx (shape xd): each dy over its window's divisor, spread over the window. */
void ref_avg_pool2d_backward(const float *dy, const int64_t *xd, int xr, const ref_pool *p,
                             float *out);
/* out [.., oh, ow]: output (i, j) the mean of rows floor(i H / oh) ..
 * ceil((i + 1) H / oh) - 1 and the columns alike. */
void ref_adaptive_avg_pool2d(const float *x, const int64_t *xd, int xr, int64_t oh, int64_t ow,
                             float *out);
void ref_adaptive_avg_pool2d_backward(const float *dy, const int64_t *xd, int xr, int64_t oh,
                                      int64_t ow, float *out);

/* ---- Batch normalisation (per channel, dim 1) ---------------------------------- */

/* x [N, C, ...], mean [C] -> the biased variance around mean [C]. */
void ref_batch_norm_var(const float *x, const int64_t *xd, int xr, const float *mean, float *out);
/* (x - mean) / sqrt(var + eps) * weight + bias per channel; mean and var
 * NULL: x's batch statistics (training mode). */
void ref_batch_norm(const float *x, const int64_t *xd, int xr, const float *mean,
                    const float *var, const float *weight, const float *bias, float eps,
                    float *out);

/* ---- Linear algebra ---------------------------------------------------------- */

/* spmd_matmul: !ta: a [L..., K], b [K, N] (tb: [N, K]) -> [L..., N];
 * ta: a [L..., M], b [L..., N] -> [M, N] contracting over L (2-D a and b
 * with ta and tb: a [K, M], b [N, K] -> [M, N]). */
void ref_matmul(const float *a, const int64_t *ad, int ar, const float *b, const int64_t *bd,
                int br, bool ta, bool tb, float *out);
/* a [B..., M, K] (ta: [B..., K, M]), b [B..., K, N] (tb: [B..., N, K]),
 * same batch dims -> [B..., M, N]. */
void ref_bmm(const float *a, const int64_t *ad, int ar, const float *b, const int64_t *bd,
             int br, bool ta, bool tb, float *out);

/* Causal attention, q, k, v [B, T, C], C = heads * D -> out [B, T, C]. */
void ref_attention(const float *q, const float *k, const float *v, int64_t B, int64_t T,
                   int64_t C, int heads, float *out);
/* out [3, B, T, C]: dq, dk, dv given dout [B, T, C]. */
/* cache [B, S, C] with rows [B, T, C] written at rows pos .. pos+T-1. */
void ref_cache_write(const float *cache, const float *rows, int64_t B, int64_t S, int64_t T,
                     int64_t C, int64_t pos, float *out);
/* Attention of q [B, T, C] at positions pos .. pos+T-1 over the caches
 * k, v [B, S, C], query t seeing keys 0 .. pos+t -> out [B, T, C]. */
void ref_cached_attention(const float *q, const float *k, const float *v, int64_t B, int64_t T,
                          int64_t S, int64_t C, int heads, int64_t pos, float *out);
void ref_attention_backward(const float *q, const float *k, const float *v, const float *dout,
                            int64_t B, int64_t T, int64_t C, int heads, float *out);

/* ---- Convolution ---------------------------------------------------------------- */

/* A 2-D convolution: x [N, Cin, H, W], w [Cout, Cin / groups, KH, KW], y
 * [N, Cout, OH, OW]; per spatial dim (rows, columns) the stride, the
 * zeros padded on both sides and the dilation. */
typedef struct ref_conv {
    int64_t x[4], w[4], y[4];
    int stride[2], pad[2], dilation[2], groups;
} ref_conv;

/* Fill c->y from x, w and the attributes (PyTorch's formula). */
void ref_conv_shape(ref_conv *c);
void ref_conv2d(const ref_conv *c, const float *x, const float *w, float *y);
/* The adjoints of y = conv2d(x, w) for dy: dx [x] and dw [w]. */
void ref_conv2d_backward_input(const ref_conv *c, const float *dy, const float *w, float *dx);
void ref_conv2d_backward_weight(const ref_conv *c, const float *x, const float *dy, float *dw);

/* ---- Lookups and losses -------------------------------------------------------- */

/* table [V, D], n ids -> out [n, D]; a row of an id outside [0, V) is zero.
 * Returns the position of the first bad id, or -1. */
int64_t ref_embedding(const float *table, int64_t V, int64_t D, const int32_t *ids, int64_t n,
                      float *out);
/* out [V, D] = sum of dout rows [n, D] at their ids (bad ids skipped). */
void ref_embedding_backward(const int32_t *ids, int64_t n, const float *dout, int64_t V,
                            int64_t D, float *out);
/* Mean over `rows` of -log_softmax(logits[r])[targets[r]]; logits
 * [rows, V].  Rows with a target outside [0, V) add nothing but still
 * count in the mean; *first_bad (may be NULL) gets the first such row or
 * -1. */
float ref_cross_entropy(const float *logits, int64_t rows, int64_t V, const int32_t *targets,
                        int64_t *first_bad);
/* out [rows, V] = (softmax - onehot) * dloss / rows; zero rows for bad
 * targets. */
void ref_cross_entropy_backward(const float *logits, int64_t rows, int64_t V,
                                const int32_t *targets, float dloss, float *out);
/* mean((a - b)^2) over n elements. */
float ref_mse(const float *a, const float *b, int64_t n);

/* ---- Layout ----------------------------------------------------------------------- */

/* out dim i = x dim perm[i]. */
void ref_permute(const float *x, const int64_t *xd, int xr, const int *perm, float *out);
/* x[..., start:start+len, ...] on axis; out: x's dims with len on axis. */
void ref_slice(const float *x, const int64_t *xd, int xr, int axis, int64_t start, int64_t len,
               float *out);
/* Zeros of x's dims with `total` on axis, x at [start, start + x's len). */
void ref_pad(const float *x, const int64_t *xd, int xr, int axis, int64_t start, int64_t total,
             float *out);
/* n tensors of equal rank, equal dims except on axis -> their concat. */
void ref_concat(const float *const *xs, const int64_t *const *xdims, int n, int rank, int axis,
                float *out);

#endif
