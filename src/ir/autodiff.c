/*
 * Reverse-mode autodiff as graph rewriting: spmd_grad appends, for each node
 * on a path from a parameter to the loss, the ops that compute the adjoint
 * of its inputs (one vjp_* rule per op, named in ops.def's vjp column).
 * The backward pass is ordinary graph ops, so it is compiled, sharded and
 * scheduled exactly like the forward pass.
 */
#include "ir/ir.h"
#include "base/error.h"

#include <stdio.h>
#include <string.h>

/* ---- Helpers ---------------------------------------------------------------- */

/* The status for a builder that returned NULL: the failure it recorded on
 * g, which spmd_grad's error scope makes this call's own (not one the
 * user's earlier calls left).  Raised again so that the message is the
 * one that goes with the status. */
static spmd_status builder_failed(const spmd_graph *g)
{
    if (ir_graph_status(g) == SPMD_OK) return BASE_INTERNAL("a builder failed without a message");
    return ir_error_raise(g);
}

/* While spmd_grad runs: which nodes need adjoints, indexed by id.  Rules
 * skip inputs outside this set, so e.g. the data input of the first matmul
 * costs no backward matmul.  Outside spmd_grad every f32 input is wanted. */
static _Thread_local const bool *want_set;
static _Thread_local int want_count;

static bool wants(const spmd_tensor *t, int i)
{
    const spmd_tensor *x = t->in[i];
    if (x->dtype == SPMD_I32) return false; /* ids, targets; f32 and bf16 have adjoints (f32) */
    if (want_set && x->id < want_count) return want_set[x->id];
    return true;
}

/* Every wanted input got a contribution, else a builder failed. */
static spmd_status done(const spmd_tensor *t, spmd_tensor *const *dx)
{
    for (int i = 0; i < t->n_in; i++)
        if (wants(t, i) && !dx[i]) return builder_failed(t->graph);
    return SPMD_OK;
}

spmd_tensor *ir_reduce_to_shape(spmd_graph *g, spmd_tensor *dy, const spmd_tensor *x)
{
    if (!dy || !x) return ir_null_operand(g, "reduce_to_shape", dy ? 1 : 0);
    if (ir_same_shape(dy, x)) return dy;
    char a[128], b[128];
    int lead = dy->rank - x->rank;
    if (lead < 0) {
        ir_error(g, SPMD_ERR_SHAPE, "reduce_to_shape: %s has fewer dims than %s",
                 ir_label(dy, a, sizeof a), ir_label(x, b, sizeof b));
        return NULL;
    }
    uint32_t axes = 0;
    bool inner = false; /* a kept dim of x is 1 where dy's is not */
    for (int i = 0; i < lead; i++) axes |= 1u << i;
    for (int i = 0; i < x->rank; i++) {
        int64_t d = dy->dims[lead + i];
        if (x->dims[i] == d) continue;
        if (x->dims[i] != 1) {
            ir_error(g, SPMD_ERR_SHAPE, "reduce_to_shape: %s does not broadcast to %s",
                     ir_label(x, b, sizeof b), ir_label(dy, a, sizeof a));
            return NULL;
        }
        axes |= 1u << (lead + i);
        inner = true;
    }
    /* Only leading dims: dropping them leaves x's shape.  Inner 1-dims
     * must stay in place, so keep every dim and drop the leading 1s after. */
    spmd_tensor *s = axes ? spmd_sum(g, dy, axes, inner) : dy;
    if (!s) return NULL;
    if (ir_same_shape(s, x)) return s;
    return spmd_reshape(g, s, x->rank, x->dims);
}

/* Broadcast dy, the adjoint of a reduction of x over `axes`, back to x's
 * shape.  Without keepdim the reduced dims are first put back as 1s so
 * that broadcasting lines up dims that follow a reduced one. */
static spmd_tensor *unreduce(spmd_graph *g, spmd_tensor *dy, const spmd_tensor *x,
                             uint32_t axes, bool keepdim)
{
    if (!keepdim) {
        int64_t dims[SPMD_MAX_RANK];
        for (int i = 0; i < x->rank; i++) dims[i] = (axes >> i) & 1u ? 1 : x->dims[i];
        dy = spmd_reshape(g, dy, x->rank, dims);
    }
    return spmd_expand(g, dy, x->rank, x->dims);
}

static uint32_t last_axis(const spmd_tensor *t) { return 1u << (t->rank - 1); }

/* ---- Rules -------------------------------------------------------------------
 * t = op(in[0], in[1], ...), dy has t's shape; each rule writes the adjoint
 * of in[i] into dx[i] for every wanted input. */

static spmd_status vjp_none(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy, spmd_tensor **dx)
{
    (void)g, (void)dy, (void)dx;
    char buf[160];
    return base_error(SPMD_ERR_UNSUPPORTED,
                      "cannot differentiate through %s (%s): the op only appears in backward "
                      "passes and has no backward rule",
                      ir_op_name(t->op), ir_label(t, buf, sizeof buf));
}

static spmd_status vjp_leaf(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy, spmd_tensor **dx)
{
    (void)g, (void)t, (void)dy, (void)dx;
    return SPMD_OK;
}

static spmd_status vjp_add(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy, spmd_tensor **dx)
{
    if (wants(t, 0)) dx[0] = ir_reduce_to_shape(g, dy, t->in[0]);
    if (wants(t, 1)) dx[1] = ir_reduce_to_shape(g, dy, t->in[1]);
    return done(t, dx);
}

static spmd_status vjp_sub(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy, spmd_tensor **dx)
{
    if (wants(t, 0)) dx[0] = ir_reduce_to_shape(g, dy, t->in[0]);
    /* Negate after reducing: the reduced tensor is the smaller one. */
    if (wants(t, 1)) dx[1] = spmd_neg(g, ir_reduce_to_shape(g, dy, t->in[1]));
    return done(t, dx);
}

static spmd_status vjp_mul(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy, spmd_tensor **dx)
{
    spmd_tensor *a = t->in[0], *b = t->in[1];
    if (wants(t, 0)) dx[0] = ir_reduce_to_shape(g, spmd_mul(g, dy, b), a);
    if (wants(t, 1)) dx[1] = ir_reduce_to_shape(g, spmd_mul(g, dy, a), b);
    return done(t, dx);
}

/* y = a / b: da = dy / b, db = -dy a / b^2 = -(dy / b) y. */
static spmd_status vjp_div(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy, spmd_tensor **dx)
{
    spmd_tensor *a = t->in[0], *b = t->in[1];
    spmd_tensor *q = spmd_div(g, dy, b); /* t's shape */
    if (wants(t, 0)) dx[0] = ir_reduce_to_shape(g, q, a);
    if (wants(t, 1)) dx[1] = spmd_neg(g, ir_reduce_to_shape(g, spmd_mul(g, q, t), b));
    return done(t, dx);
}

static spmd_status vjp_expand(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy, spmd_tensor **dx)
{
    dx[0] = ir_reduce_to_shape(g, dy, t->in[0]);
    return done(t, dx);
}

static spmd_status vjp_scale(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy, spmd_tensor **dx)
{
    dx[0] = spmd_scale(g, dy, t->attr.scale.c);
    return done(t, dx);
}

/* The same mask on dy: the same op with the forward's step and site, so
 * the mask is drawn again, never kept.  No adjoint reaches the step. */
static spmd_status vjp_dropout(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy, spmd_tensor **dx)
{
    if (!wants(t, 0)) return SPMD_OK;
    dx[0] = ir_dropout(g, dy, t->in[1], t->attr.dropout.p, t->attr.dropout.site);
    return dx[0] ? SPMD_OK : builder_failed(g);
}

/* The value goes back the way it came: dy from stage `to` to `from`. */
static spmd_status vjp_stage_transfer(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy,
                                      spmd_tensor **dx)
{
    dx[0] = spmd_stage_transfer(g, dy, t->attr.stage.to, t->attr.stage.from);
    return done(t, dx);
}

/* The constraint is x itself: the adjoint passes through (mark_adjoint
 * gives it the constraint's mark, as JAX transposes a sharding
 * constraint). */
static spmd_status vjp_sharding_constraint(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy,
                                           spmd_tensor **dx)
{
    (void)g;
    if (wants(t, 0)) dx[0] = dy;
    return done(t, dx);
}

/* Adjoints are f32 whatever the value's type: a bf16 copy's passes back
 * as it came. */
static spmd_status vjp_convert(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy, spmd_tensor **dx)
{
    (void)g;
    if (wants(t, 0)) dx[0] = dy;
    return done(t, dx);
}

static spmd_status vjp_neg(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy, spmd_tensor **dx)
{
    dx[0] = spmd_neg(g, dy);
    return done(t, dx);
}

static spmd_status vjp_exp(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy, spmd_tensor **dx)
{
    dx[0] = spmd_mul(g, dy, t);
    return done(t, dx);
}

static spmd_status vjp_log(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy, spmd_tensor **dx)
{
    dx[0] = spmd_div(g, dy, t->in[0]);
    return done(t, dx);
}

/* dy (1 - y^2) written as dy - (dy y) y: no constant tensor needed. */
static spmd_status vjp_tanh(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy, spmd_tensor **dx)
{
    dx[0] = spmd_sub(g, dy, spmd_mul(g, spmd_mul(g, dy, t), t));
    return done(t, dx);
}

/* Activations whose gradient is a backward helper op of (x, dy). */
#define DEFINE_HELPER_VJP(NAME, HELPER)                                                         \
    static spmd_status NAME(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy, spmd_tensor **dx)   \
    {                                                                                           \
        dx[0] = HELPER(g, ir_autocast_saved(g, t->in[0]), dy); /* x as kept (autocast.c) */    \
        return done(t, dx);                                                                     \
    }

DEFINE_HELPER_VJP(vjp_gelu, ir_gelu_backward)
DEFINE_HELPER_VJP(vjp_relu, ir_relu_backward)
DEFINE_HELPER_VJP(vjp_gelu_erf, ir_gelu_erf_backward)
DEFINE_HELPER_VJP(vjp_silu, ir_silu_backward)

/* y = sigmoid(x): dx = dy y (1 - y), written as q - q y with q = dy y. */
static spmd_status vjp_sigmoid(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy, spmd_tensor **dx)
{
    spmd_tensor *q = spmd_mul(g, dy, t);
    dx[0] = spmd_sub(g, q, spmd_mul(g, q, t));
    return done(t, dx);
}

/* d|x| = dy sign(x): 0 at 0, as torch. */
static spmd_status vjp_abs(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy, spmd_tensor **dx)
{
    spmd_tensor *x = t->in[0];
    dx[0] = spmd_mul(g, dy, ir_elementwise(g, IR_SIGN, &x, 1, 0.0f));
    return done(t, dx);
}

/* softplus_b(x): dx = dy sigmoid(b x) (which is 1 in f32 past the
 * threshold, where softplus is x). */
static spmd_status vjp_softplus(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy, spmd_tensor **dx)
{
    float b = t->attr.scale.c == 0.0f ? 1.0f : t->attr.scale.c;
    dx[0] = spmd_mul(g, dy, spmd_sigmoid(g, spmd_scale(g, t->in[0], b)));
    return done(t, dx);
}

/* sign and the comparisons are flat wherever they have a slope: no
 * gradient flows. */
static spmd_status vjp_flat(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy, spmd_tensor **dx)
{
    (void)g, (void)t, (void)dy, (void)dx;
    return SPMD_OK;
}

/* y = x^p: dx = dy p x^(p-1); p = 0 gives zeros and p = 1 dy itself, as
 * in torch, so no x^-1 is formed where it could be infinite. */
static spmd_status vjp_pow_scalar(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy, spmd_tensor **dx)
{
    spmd_tensor *x = t->in[0];
    float p = t->attr.scale.c;
    if (p == 0.0f) {
        dx[0] = spmd_scale(g, dy, 0.0f);
    } else if (p == 1.0f) {
        dx[0] = dy;
    } else {
        spmd_tensor *d = p == 2.0f ? x : spmd_pow_scalar(g, x, p - 1.0f);
        dx[0] = spmd_mul(g, dy, spmd_scale(g, d, p));
    }
    return done(t, dx);
}

/* y = where(cond, a, b): da = where(cond, dy, 0) and db = where(cond, 0,
 * dy), each summed over the dims its operand was broadcast on.  cond gets
 * no adjoint (a step function: zero almost everywhere), wanted or not. */
static spmd_status vjp_where(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy, spmd_tensor **dx)
{
    spmd_tensor *cond = t->in[0];
    if (!wants(t, 1) && !wants(t, 2)) return SPMD_OK;
    spmd_tensor *zero = spmd_fill(g, 0, NULL, 0.0f);
    if (wants(t, 1)) {
        dx[1] = ir_reduce_to_shape(g, spmd_where(g, cond, dy, zero), t->in[1]);
        if (!dx[1]) return builder_failed(g);
    }
    if (wants(t, 2)) {
        dx[2] = ir_reduce_to_shape(g, spmd_where(g, cond, zero, dy), t->in[2]);
        if (!dx[2]) return builder_failed(g);
    }
    return SPMD_OK;
}

/* y = x^(1/2): dx = dy / (2 y). */
static spmd_status vjp_sqrt(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy, spmd_tensor **dx)
{
    dx[0] = spmd_div(g, spmd_scale(g, dy, 0.5f), t);
    return done(t, dx);
}

/* y = x^(-1/2): dx = -dy x^(-3/2) / 2 = -dy y^3 / 2. */
static spmd_status vjp_rsqrt(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy, spmd_tensor **dx)
{
    spmd_tensor *y3 = spmd_mul(g, spmd_mul(g, t, t), t);
    dx[0] = spmd_mul(g, spmd_scale(g, dy, -0.5f), y3);
    return done(t, dx);
}

static spmd_status vjp_sum(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy, spmd_tensor **dx)
{
    dx[0] = unreduce(g, dy, t->in[0], t->attr.reduce.axes, t->attr.reduce.keepdim);
    return done(t, dx);
}

static spmd_status vjp_mean(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy, spmd_tensor **dx)
{
    const spmd_tensor *x = t->in[0];
    uint32_t axes = t->attr.reduce.axes;
    int64_t count = 1;
    for (int i = 0; i < x->rank; i++)
        if ((axes >> i) & 1u) count *= x->dims[i];
    /* Scale before broadcasting: dy is the smaller tensor. */
    spmd_tensor *s = spmd_scale(g, dy, (float)(1.0 / (double)count));
    dx[0] = unreduce(g, s, x, axes, t->attr.reduce.keepdim);
    return done(t, dx);
}

static spmd_status vjp_max(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy, spmd_tensor **dx)
{
    dx[0] = ir_max_backward(g, t->in[0], dy, t->attr.max.axis, t->attr.max.keepdim);
    return done(t, dx);
}

/* y_i = sum_{j<=i} x_j: dx_j = sum_{i>=j} dy_i, the scan the other way. */
static spmd_status vjp_cumsum(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy, spmd_tensor **dx)
{
    dx[0] = spmd_cumsum(g, dy, t->attr.cumsum.axis, !t->attr.cumsum.reverse);
    return done(t, dx);
}

/* Pooling: the backward ops take the forward's windows; max_pool2d's finds
 * each window's maximum again in x rather than keeping its position. */
static spmd_status vjp_max_pool2d(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy,
                                  spmd_tensor **dx)
{
    dx[0] = ir_max_pool2d_backward(g, t->in[0], dy, &t->attr.pool);
    return done(t, dx);
}

static spmd_status vjp_avg_pool2d(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy,
                                  spmd_tensor **dx)
{
    const spmd_tensor *x = t->in[0];
    dx[0] = ir_avg_pool2d_backward(g, dy, x->dims[x->rank - 2], x->dims[x->rank - 1],
                                   &t->attr.pool);
    return done(t, dx);
}

static spmd_status vjp_adaptive_avg_pool2d(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy,
                                           spmd_tensor **dx)
{
    const spmd_tensor *x = t->in[0];
    dx[0] = ir_adaptive_avg_pool2d_backward(g, dy, x->dims[x->rank - 2], x->dims[x->rank - 1]);
    return done(t, dx);
}

/* y = softmax(x) over the last dim: dx = y (dy - sum(dy y)). */
static spmd_status vjp_softmax(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy,
                               spmd_tensor **dx)
{
    spmd_tensor *s = spmd_sum(g, spmd_mul(g, dy, t), last_axis(t), true); /* [..., 1] */
    dx[0] = spmd_mul(g, t, spmd_sub(g, dy, s));
    return done(t, dx);
}

/* y = log_softmax(x): softmax(x) = exp(y), dx = dy - exp(y) sum(dy). */
static spmd_status vjp_log_softmax(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy,
                                   spmd_tensor **dx)
{
    spmd_tensor *s = spmd_sum(g, dy, last_axis(t), true); /* [..., 1] */
    dx[0] = spmd_sub(g, dy, spmd_mul(g, spmd_exp(g, t), s));
    return done(t, dx);
}

/* y = xhat gamma + beta, xhat = (x - mean) / sqrt(var + eps) per row;
 * gamma and beta broadcast over the leading dims, so their adjoints are
 * sums over those dims. */
static spmd_status vjp_layernorm(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy,
                                 spmd_tensor **dx)
{
    spmd_tensor *gamma = t->in[1], *beta = t->in[2];
    spmd_tensor *x = ir_autocast_saved(g, t->in[0]); /* bf16 under mixed precision */
    float eps = t->attr.norm.eps;
    if (wants(t, 0)) dx[0] = ir_layernorm_backward(g, x, gamma, dy, eps);
    if (wants(t, 1))
        dx[1] = ir_reduce_to_shape(g, spmd_mul(g, dy, ir_layernorm_xhat(g, x, eps)), gamma);
    if (wants(t, 2)) dx[2] = ir_reduce_to_shape(g, dy, beta);
    return done(t, dx);
}

/* v [C] as [C, 1, ...], which broadcasts against x [N, C, S...]. */
static spmd_tensor *channel_column(spmd_graph *g, spmd_tensor *v, const spmd_tensor *x)
{
    int64_t dims[SPMD_MAX_RANK];
    dims[0] = x->dims[1];
    for (int i = 1; i < x->rank - 1; i++) dims[i] = 1;
    return spmd_reshape(g, v, x->rank - 1, dims);
}

/* Every dim of x [N, C, ...] but the channels. */
static uint32_t non_channel_axes(const spmd_tensor *x) { return ((1u << x->rank) - 1) & ~2u; }

/* v = sum((x - m)^2) / n per channel: dx = 2 (x - m) dv / n, and dm = -the
 * sum of that over the batch and spatial dims.  A training-mode
 * batch_norm does not come here: its rule covers its statistics. */
static spmd_status vjp_batch_norm_var(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy,
                                      spmd_tensor **dx)
{
    spmd_tensor *x = t->in[0], *m = t->in[1];
    float k = (float)(2.0 / (double)t->attr.bnorm.count);
    spmd_tensor *d = spmd_sub(g, x, channel_column(g, m, x));
    spmd_tensor *gx = spmd_mul(g, d, channel_column(g, spmd_scale(g, dy, k), x));
    if (wants(t, 0)) dx[0] = gx;
    if (wants(t, 1)) dx[1] = spmd_neg(g, spmd_sum(g, gx, non_channel_axes(x), false));
    return done(t, dx);
}

/* y = (x - mean) r weight + bias per channel, r = 1 / sqrt(var + eps),
 * xhat = (x - mean) r.  One batch_norm_sums row gives sum(dy) (the bias's
 * gradient) and sum(dy xhat) (the weight's), one pending sum for both
 * over a split batch.
 *   training (mean and var are x's batch statistics): dx is the whole
 *   derivative through them, r weight (dy - sum(dy) / n - xhat sum(dy
 *   xhat) / n), from batch_norm_backward; mean and var get nothing here
 *   (their share is in dx; any other use of them adds its own);
 *   evaluation: dx = dy r weight, dmean = -r weight sum(dy), dvar =
 *   -r^2 weight sum(dy xhat) / 2. */
static spmd_status vjp_batch_norm(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy,
                                  spmd_tensor **dx)
{
    spmd_tensor *x = t->in[0], *mean = t->in[1], *var = t->in[2], *w = t->in[3];
    const float eps = t->attr.bnorm.eps;
    const bool training = t->attr.bnorm.training;
    const int64_t c = x->dims[1];
    bool need_sums = wants(t, 3) || wants(t, 4) ||
                     (training ? wants(t, 0) : wants(t, 1) || wants(t, 2));
    spmd_tensor *sums = need_sums ? ir_batch_norm_sums(g, x, mean, var, dy, eps) : NULL;
    spmd_tensor *sum_dy = NULL, *sum_dy_xhat = NULL;
    if (sums) {
        sum_dy = spmd_reshape(g, spmd_slice(g, sums, 0, 0, 1), 1, &c);
        sum_dy_xhat = spmd_reshape(g, spmd_slice(g, sums, 0, 1, 1), 1, &c);
    }
    if (wants(t, 3)) dx[3] = sum_dy_xhat;
    if (wants(t, 4)) dx[4] = sum_dy;
    if (training) {
        if (wants(t, 0)) dx[0] = ir_batch_norm_backward(g, x, mean, var, w, dy, sums, eps);
        for (int j = 0; j < t->n_in; j++)
            if (j != 1 && j != 2 && wants(t, j) && !dx[j]) return builder_failed(g);
        return SPMD_OK;
    }
    spmd_tensor *r = spmd_rsqrt(g, spmd_add(g, var, spmd_fill(g, 0, NULL, eps)));
    spmd_tensor *wr = spmd_mul(g, w, r);
    if (wants(t, 0)) dx[0] = spmd_mul(g, dy, channel_column(g, wr, x));
    if (wants(t, 1)) dx[1] = spmd_neg(g, spmd_mul(g, wr, sum_dy));
    if (wants(t, 2)) dx[2] = spmd_scale(g, spmd_mul(g, spmd_mul(g, wr, r), sum_dy_xhat), -0.5f);
    return done(t, dx);
}

/*
 * matmul has three forms (spmd.h); each adjoint is again one of them:
 *   A  !ta:     a [L..., M, K], b [K, N] or [N, K] (tb), y [L..., M, N]
 *   B  ta, !tb: a [L..., K'], b [L..., N], y [K', N] (sum over L...)
 *   C  ta, tb:  a [K, M], b [N, K], y [M, N]
 */
/* A matmul operand as the backward pass reads it: a parameter's bf16
 * copy (mixed precision) made again, once, rather than the forward's, so
 * that the forward's dies after its last forward use instead of living
 * through the pass, as FSDP gathers a weight again (a pass over the
 * weights, against the bf16 weights' bytes held from the forward pass to
 * the backward). */
static spmd_tensor *backward_operand(spmd_graph *g, spmd_tensor *x)
{
    if (!ir_is_param_copy(x)) return x;
    if (!x->bf16) x->bf16 = ir_node_new(g, IR_CONVERT, x->dtype, x->rank, x->dims, x->in, 1);
    return x->bf16 ? x->bf16 : x;
}

static spmd_status vjp_matmul(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy,
                              spmd_tensor **dx)
{
    spmd_tensor *a = backward_operand(g, t->in[0]), *b = backward_operand(g, t->in[1]);
    bool ta = t->attr.matmul.ta, tb = t->attr.matmul.tb;
    bool wa = wants(t, 0), wb = wants(t, 1);
    if (!ta && !tb) {
        /* y = a b: da = dy b^T (A), db = a^T dy over L..., M (B). */
        if (wa) dx[0] = spmd_matmul(g, dy, b, false, true);
        if (wb) dx[1] = spmd_matmul(g, a, dy, true, false);
    } else if (!ta) {
        /* y = a b^T: da = dy b (A), db = dy^T a over L..., M (B). */
        if (wa) dx[0] = spmd_matmul(g, dy, b, false, false);
        if (wb) dx[1] = spmd_matmul(g, dy, a, true, false);
    } else if (!tb) {
        /* y = a^T b with rows flattened over L...: da = b dy^T (A with b
         * [L..., N] as the left operand), db = a dy (A). */
        if (wa) dx[0] = spmd_matmul(g, b, dy, false, true);
        if (wb) dx[1] = spmd_matmul(g, a, dy, false, false);
    } else {
        /* y = a^T b^T: da = b^T dy^T [K, M], db = dy^T a^T [N, K] (C). */
        if (wa) dx[0] = spmd_matmul(g, b, dy, true, true);
        if (wb) dx[1] = spmd_matmul(g, dy, a, true, true);
    }
    return done(t, dx);
}

/* y = op(a) op(b) per batch, op = transpose where set.  reduce_to_shape
 * sums over batch dims that an operand broadcast, if the builder allows it. */
static spmd_status vjp_bmm(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy, spmd_tensor **dx)
{
    spmd_tensor *a = backward_operand(g, t->in[0]), *b = backward_operand(g, t->in[1]);
    bool ta = t->attr.matmul.ta, tb = t->attr.matmul.tb;
    spmd_tensor *da = NULL, *db = NULL;
    bool wa = wants(t, 0), wb = wants(t, 1);
    if (!ta && !tb) { /* a [M, K], b [K, N] */
        if (wa) da = spmd_bmm(g, dy, b, false, true);
        if (wb) db = spmd_bmm(g, a, dy, true, false);
    } else if (!ta) { /* a [M, K], b [N, K] */
        if (wa) da = spmd_bmm(g, dy, b, false, false);
        if (wb) db = spmd_bmm(g, dy, a, true, false);
    } else if (!tb) { /* a [K, M], b [K, N] */
        if (wa) da = spmd_bmm(g, b, dy, false, true);
        if (wb) db = spmd_bmm(g, a, dy, false, false);
    } else { /* a [K, M], b [N, K] */
        if (wa) da = spmd_bmm(g, b, dy, true, true);
        if (wb) db = spmd_bmm(g, dy, a, true, true);
    }
    if (wa) dx[0] = ir_reduce_to_shape(g, da, a);
    if (wb) dx[1] = ir_reduce_to_shape(g, db, b);
    return done(t, dx);
}

/* y = conv2d(x, w): dx is the transposed convolution of dy with w, dw
 * the correlation of x with dy summed over the batch; each its own op
 * (ops.def), as a convolution with stride or dilation cannot give dx. */
static spmd_status vjp_conv2d(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy, spmd_tensor **dx)
{
    spmd_tensor *x = t->in[0], *w = t->in[1];
    if (wants(t, 0)) dx[0] = ir_conv2d_backward_input(g, dy, w, x->dims, &t->attr.conv);
    if (wants(t, 1)) dx[1] = ir_conv2d_backward_weight(g, x, dy, w->dims, &t->attr.conv);
    return done(t, dx);
}

/* One fused backward kernel gives dq, dk, dv stacked as [3, B, T, C]. */
static spmd_status vjp_attention(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy,
                                 spmd_tensor **dx)
{
    /* q, k and v as kept: bf16 copies under mixed precision. */
    spmd_tensor *all = ir_attention_backward(g, ir_autocast_saved(g, t->in[0]),
                                             ir_autocast_saved(g, t->in[1]),
                                             ir_autocast_saved(g, t->in[2]), dy,
                                             t->attr.attention.heads);
    for (int i = 0; i < 3; i++) {
        if (!wants(t, i)) continue;
        spmd_tensor *x = t->in[i];
        dx[i] = spmd_reshape(g, spmd_slice(g, all, 0, i, 1), x->rank, x->dims);
    }
    return done(t, dx);
}

/* table [V, D], ids [...] (int32, no adjoint). */
static spmd_status vjp_embedding(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy,
                                 spmd_tensor **dx)
{
    spmd_tensor *table = t->in[0], *ids = t->in[1];
    if (wants(t, 0)) {
        dx[0] = ir_embedding_backward(g, ids, dy, table->dims[0]);
        if (dx[0]) dx[0]->attr.embed.table = table->id; /* its rows split like the table's */
    }
    return done(t, dx);
}

static spmd_status vjp_cross_entropy(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy,
                                     spmd_tensor **dx)
{
    if (wants(t, 0)) dx[0] = ir_cross_entropy_backward(g, t->in[0], t->in[1], dy);
    return done(t, dx);
}

/* y = mean((a - b)^2) over the N elements of a - b: da = dy 2 (a - b) / N;
 * dy is a scalar and broadcasts in the mul. */
static spmd_status vjp_mse(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy, spmd_tensor **dx)
{
    spmd_tensor *a = t->in[0], *b = t->in[1];
    spmd_tensor *d = spmd_sub(g, a, b);
    if (!d) return builder_failed(g);
    spmd_tensor *gd = spmd_mul(g, spmd_scale(g, d, (float)(2.0 / (double)ir_numel(d))), dy);
    if (wants(t, 0)) dx[0] = ir_reduce_to_shape(g, gd, a);
    if (wants(t, 1)) dx[1] = spmd_neg(g, ir_reduce_to_shape(g, gd, b));
    return done(t, dx);
}

static spmd_status vjp_reshape(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy,
                               spmd_tensor **dx)
{
    const spmd_tensor *x = t->in[0];
    dx[0] = spmd_reshape(g, dy, x->rank, x->dims);
    return done(t, dx);
}

/* Out dim i is in dim perm[i]; the inverse sends dim perm[i] back to i. */
static spmd_status vjp_permute(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy,
                               spmd_tensor **dx)
{
    int inv[SPMD_MAX_RANK];
    for (int i = 0; i < t->rank; i++) inv[t->attr.permute.perm[i]] = i;
    dx[0] = spmd_permute(g, dy, inv);
    return done(t, dx);
}

static spmd_status vjp_slice(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy, spmd_tensor **dx)
{
    int axis = t->attr.slice.axis;
    dx[0] = ir_pad(g, dy, axis, t->attr.slice.start, t->in[0]->dims[axis]);
    return done(t, dx);
}

static spmd_status vjp_concat(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy,
                              spmd_tensor **dx)
{
    int axis = t->attr.concat.axis;
    int64_t start = 0;
    for (int i = 0; i < t->n_in; i++) {
        int64_t len = t->in[i]->dims[axis];
        if (wants(t, i)) dx[i] = spmd_slice(g, dy, axis, start, len);
        start += len;
    }
    return done(t, dx);
}

/* ---- Op table ------------------------------------------------------------------ */

static const ir_vjp_fn vjp_table[] = {
#define OP(e, name, arity, sig, lin, fix, vjp, kern, groups, formula, scratch, kind, bf16) [IR_##e] = vjp,
#include "ir/ops.def"
#undef OP
};

_Static_assert(sizeof vjp_table / sizeof vjp_table[0] == IR_OP_COUNT, "vjp table out of step");

ir_vjp_fn ir_op_vjp(ir_op op) { return (unsigned)op < IR_OP_COUNT ? vjp_table[op] : NULL; }

bool ir_op_has_vjp(ir_op op)
{
    return (unsigned)op < IR_OP_COUNT && vjp_table[op] && vjp_table[op] != vjp_none;
}

/* ---- spmd_grad -------------------------------------------------------------------- */

/* Name p's gradient "<p>.grad".  An adjoint can be shared (y = p + q passes
 * dy to both) or be the seed itself, so a node that already carries a name
 * gets a same-shape reshape of its own to carry this one. */
static spmd_status name_grad(spmd_graph *g, spmd_tensor *p, spmd_tensor *gr, int n_forward)
{
    if (gr->name || gr->id < n_forward) {
        spmd_tensor *copy = spmd_reshape(g, gr, p->rank, p->dims);
        /* A builder may return its operand for a same-shape reshape. */
        if (copy == gr) copy = spmd_scale(g, gr, 1.0f);
        if (!copy) return builder_failed(g);
        gr = copy;
    }
    const char *pname = p->name ? p->name : "param";
    size_t len = strlen(pname) + sizeof ".grad";
    char *name = base_alloc(&g->alloc, len, "gradient name");
    if (!name) return SPMD_ERR_NOMEM;
    snprintf(name, len, "%s.grad", pname);
    spmd_status st = spmd_tensor_set_name(gr, name);
    base_free(&g->alloc, name);
    if (st != SPMD_OK) return st;
    p->grad = gr;
    return SPMD_OK;
}

/* A marked value's adjoint is laid out as the value is, as JAX transposes
 * a sharding constraint into the same constraint on the cotangent: the
 * backward pass then keeps the plan the marks made for the forward one
 * (tensor parallelism's splits, sequence parallelism's) instead of
 * letting the batch's split win every clash anew.  Parameters are left
 * alone (their gradients meet their layout at the update), and so is an
 * adjoint that is a forward value or already marked (y = a + b hands
 * the same adjoint to both). */
static spmd_status mark_adjoint(spmd_graph *g, const spmd_tensor *t, spmd_tensor *adj,
                                int n_forward)
{
    (void)g;
    /* Shared: a mark is never changed in place (spmd_mark_sharding makes a
     * new one). */
    if (t->mark && !ir_op_is_leaf(t->op) && !adj->mark && adj->id >= n_forward) adj->mark = t->mark;
    return SPMD_OK;
}

spmd_status spmd_grad(spmd_graph *g, spmd_tensor *loss) { return ir_grad(g, loss, NULL); }

spmd_status ir_grad(spmd_graph *g, spmd_tensor *loss, int *rule_begin)
{
    char buf[160];
    if (!g) return base_error(SPMD_ERR_INVALID, "spmd_grad: graph is NULL");
    if (!loss) {
        /* A builder failed on the way to the loss: that failure is the cause. */
        if (ir_graph_status(g) != SPMD_OK) return ir_error_raise(g);
        return base_error(SPMD_ERR_INVALID, "spmd_grad: loss is NULL");
    }
    if (loss->graph != g)
        return base_error(SPMD_ERR_INVALID, "spmd_grad: loss %s belongs to another graph",
                          ir_label(loss, buf, sizeof buf));
    if (g->has_grad)
        return base_error(SPMD_ERR_INVALID,
                          "spmd_grad: the graph already has a backward pass (spmd_grad "
                          "runs once per graph)");
    if (loss->rank != 0)
        return base_error(SPMD_ERR_SHAPE, "spmd_grad: loss %s must be a scalar (rank 0)",
                          ir_label(loss, buf, sizeof buf));
    if (loss->dtype != SPMD_F32)
        return base_error(SPMD_ERR_INVALID, "spmd_grad: loss %s is %s, not f32",
                          ir_label(loss, buf, sizeof buf), spmd_dtype_name(loss->dtype));

    /* Backward nodes are appended while walking; only the forward ids
     * [0, n) index the arrays below. */
    int n = g->n_nodes;
    size_t nn = (size_t)n;
    const int outer_stage = g->stage, outer_micro = g->micro;
    ir_failure outer;
    ir_error_scope_begin(g, &outer);
    bool *from_param = base_calloc(&g->alloc, nn * sizeof(bool), "autodiff reachability");
    bool *need = base_calloc(&g->alloc, nn * sizeof(bool), "autodiff reachability");
    spmd_tensor **adj = base_calloc(&g->alloc, nn * sizeof *adj, "autodiff adjoints");
    spmd_status st = SPMD_OK;
    if (!from_param || !need || !adj) {
        st = SPMD_ERR_NOMEM;
        goto out;
    }

    /* need = depends on a trained (not frozen) param (forward sweep) and
     * reaches the loss (backward sweep), floating types only (not ids). */
    int last = loss->id;
    for (int i = 0; i <= last; i++) {
        const spmd_tensor *t = g->nodes[i];
        bool f = ir_is_trained(t);
        for (int j = 0; j < t->n_in && !f; j++) f = from_param[t->in[j]->id];
        from_param[i] = f && t->dtype != SPMD_I32;
    }
    need[last] = true;
    ir_mark_inputs(g, need, last);
    for (int i = 0; i <= last; i++) need[i] = need[i] && from_param[i];

    /* Refuse before appending anything, so a failed call leaves the graph
     * as it was. */
    for (int i = 0; i <= last; i++) {
        spmd_tensor *t = g->nodes[i];
        if (!need[i]) continue;
        ir_vjp_fn vjp = ir_op_vjp(t->op);
        if (!vjp) {
            st = BASE_INTERNAL("op without a backward rule in the table");
            goto out;
        }
        if (vjp == vjp_none) {
            st = vjp_none(g, t, NULL, NULL);
            goto out;
        }
    }

    g->has_grad = true;
    g->backward_begin = n;
    if (rule_begin)
        for (int i = 0; i < n; i++) rule_begin[i] = -1;
    want_set = need;
    want_count = n;
    /* Each rule's nodes on the stage of the node it differentiates, and
     * an adjoint's sum on its value's ("Pipeline stages"). */
    g->stage = loss->stage;
    g->micro = loss->micro;
    if (need[last]) {
        adj[last] = spmd_fill(g, 0, NULL, 1.0f);
        if (!adj[last]) {
            st = builder_failed(g);
            goto out;
        }
    }
    for (int i = last; i >= 0; i--) {
        spmd_tensor *t = g->nodes[i];
        if (!need[i] || !adj[i]) continue;
        st = mark_adjoint(g, t, adj[i], n);
        if (st != SPMD_OK) goto out;
        if (rule_begin) rule_begin[i] = g->n_nodes;
        spmd_tensor *dx[IR_MAX_INPUTS] = {0};
        g->stage = t->stage;
        g->micro = t->micro;
        st = ir_op_vjp(t->op)(g, t, adj[i], dx);
        if (st != SPMD_OK) goto out;
        for (int j = 0; j < t->n_in; j++) {
            spmd_tensor *x = t->in[j];
            if (!dx[j] || !need[x->id]) continue;
            if (!ir_same_shape(dx[j], x)) {
                char a[96];
                snprintf(a, sizeof a, "adjoint of input %d of %s has the wrong shape", j,
                         ir_op_name(t->op));
                st = BASE_INTERNAL(a);
                goto out;
            }
            g->stage = x->stage;
            g->micro = dx[j]->micro; /* each micro-batch's share summed as it comes */
            adj[x->id] = adj[x->id] ? spmd_add(g, adj[x->id], dx[j]) : dx[j];
            if (!adj[x->id]) {
                st = builder_failed(g);
                goto out;
            }
        }
    }

    for (int i = 0; i < n; i++) {
        spmd_tensor *p = g->nodes[i];
        if (!ir_is_trained(p)) continue;
        spmd_tensor *gr = i <= last ? adj[i] : NULL;
        g->stage = gr ? gr->stage : -1;
        g->micro = gr ? gr->micro : -1;
        if (!gr) { /* the loss does not depend on p */
            gr = spmd_fill(g, p->rank, p->dims, 0.0f);
            if (!gr) {
                st = builder_failed(g);
                goto out;
            }
        }
        st = name_grad(g, p, gr, n);
        if (st != SPMD_OK) goto out;
    }

out:
    ir_error_scope_end(g, &outer);
    if (g->has_grad) {
        g->backward_end = g->n_nodes;
        g->stage = outer_stage;
        g->micro = outer_micro;
    }
    want_set = NULL;
    want_count = 0;
    base_free(&g->alloc, from_param);
    base_free(&g->alloc, need);
    base_free(&g->alloc, adj);
    return st;
}
