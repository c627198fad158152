/*
 * Op builders: each checks its operands' shapes and records one node.
 * Errors name the op and the shapes involved; nothing is computed here.
 */
#include "ir/ir.h"
#include "base/error.h"

#include <stdio.h>
#include <string.h>

#define SHAPE_BUF 96
#define LABEL_BUF 160 /* a name and a shape: ir_label */

/* Every failure below is recorded on g too (ir_error), so that the NULL a
 * failed builder returns reports it again where it is used (any_null). */

static bool any_null(spmd_graph *g, const char *op, spmd_tensor *const *xs, int n)
{
    if (!g) {
        base_error(SPMD_ERR_INVALID, "%s: graph is NULL", op);
        return true;
    }
    for (int i = 0; i < n; i++)
        if (!xs[i]) {
            ir_null_operand(g, op, i);
            return true;
        }
    return false;
}

static spmd_tensor *fail_shape2(spmd_graph *g, const char *op, const char *why,
                                const spmd_tensor *a, const spmd_tensor *b)
{
    char sa[SHAPE_BUF], sb[SHAPE_BUF];
    ir_error(g, SPMD_ERR_SHAPE, "%s: %s: %s and %s", op, why, ir_shape_str(a, sa, sizeof sa),
             ir_shape_str(b, sb, sizeof sb));
    return NULL;
}

static spmd_tensor *fail_shape1(spmd_graph *g, const char *op, const char *why,
                                const spmd_tensor *a)
{
    char sa[SHAPE_BUF];
    ir_error(g, SPMD_ERR_SHAPE, "%s: %s: %s", op, why, ir_shape_str(a, sa, sizeof sa));
    return NULL;
}

static bool want_f32(spmd_graph *g, const char *op, const spmd_tensor *t)
{
    if (t->dtype == SPMD_F32) return true;
    char s[SHAPE_BUF];
    ir_error(g, SPMD_ERR_INVALID, "%s: expects f32, got %s %s", op, spmd_dtype_name(t->dtype),
             ir_shape_str(t, s, sizeof s));
    return false;
}

static bool want_float(spmd_graph *g, const char *op, const spmd_tensor *t)
{
    if (t->dtype == SPMD_F32 || t->dtype == SPMD_BF16) return true;
    char s[SHAPE_BUF];
    ir_error(g, SPMD_ERR_INVALID, "%s: expects f32 or bf16, got %s %s", op,
             spmd_dtype_name(t->dtype), ir_shape_str(t, s, sizeof s));
    return false;
}

static bool want_i32(spmd_graph *g, const char *op, const spmd_tensor *t)
{
    if (t->dtype == SPMD_I32) return true;
    char s[SHAPE_BUF];
    ir_error(g, SPMD_ERR_INVALID, "%s: expects i32 ids, got %s %s", op, spmd_dtype_name(t->dtype),
             ir_shape_str(t, s, sizeof s));
    return false;
}

/* ---- Elementwise ------------------------------------------------------------ */

/* numpy broadcasting of shape (ar, ad) and b into (rank, dims); false if
 * incompatible.  dims may be ad. */
static bool broadcast_dims(int ar, const int64_t *ad, const spmd_tensor *b, int *rank, int64_t *dims)
{
    int r = ar > b->rank ? ar : b->rank;
    int64_t out[SPMD_MAX_RANK];
    for (int i = 0; i < r; i++) {
        int ia = ar - r + i, ib = b->rank - r + i;
        int64_t da = ia >= 0 ? ad[ia] : 1, db = ib >= 0 ? b->dims[ib] : 1;
        if (da != db && da != 1 && db != 1) return false;
        out[i] = da > db ? da : db;
    }
    memcpy(dims, out, (size_t)r * sizeof *dims);
    *rank = r;
    return true;
}

/* numpy broadcasting of a and b into out; false if incompatible. */
static bool broadcast_shape(const spmd_tensor *a, const spmd_tensor *b, int *rank, int64_t *dims)
{
    return broadcast_dims(a->rank, a->dims, b, rank, dims);
}

static spmd_tensor *binary(spmd_graph *g, ir_op op, spmd_tensor *a, spmd_tensor *b)
{
    spmd_tensor *in[2] = {a, b};
    if (any_null(g, ir_op_name(op), in, 2)) return NULL;
    if (!want_f32(g, ir_op_name(op), a) || !want_f32(g, ir_op_name(op), b)) return NULL;
    int rank;
    int64_t dims[SPMD_MAX_RANK];
    if (!broadcast_shape(a, b, &rank, dims))
        return fail_shape2(g, ir_op_name(op), "shapes do not broadcast", a, b);
    return ir_node_new(g, op, SPMD_F32, rank, dims, in, 2);
}

spmd_tensor *spmd_add(spmd_graph *g, spmd_tensor *a, spmd_tensor *b) { return binary(g, IR_ADD, a, b); }
spmd_tensor *spmd_sub(spmd_graph *g, spmd_tensor *a, spmd_tensor *b) { return binary(g, IR_SUB, a, b); }
spmd_tensor *spmd_mul(spmd_graph *g, spmd_tensor *a, spmd_tensor *b) { return binary(g, IR_MUL, a, b); }
spmd_tensor *spmd_div(spmd_graph *g, spmd_tensor *a, spmd_tensor *b) { return binary(g, IR_DIV, a, b); }

static spmd_tensor *unary(spmd_graph *g, ir_op op, spmd_tensor *x)
{
    if (any_null(g, ir_op_name(op), &x, 1) || !want_f32(g, ir_op_name(op), x)) return NULL;
    return ir_node_new(g, op, SPMD_F32, x->rank, x->dims, &x, 1);
}

/* An activation function: its backward helper reads x, kept in bf16
 * under mixed precision (autocast.c). */
static spmd_tensor *activation(spmd_graph *g, ir_op op, spmd_tensor *x)
{
    spmd_tensor *t = unary(g, op, x);
    if (t) ir_autocast_keep(g, x);
    return t;
}

spmd_tensor *spmd_scale(spmd_graph *g, spmd_tensor *x, float c)
{
    spmd_tensor *t = unary(g, IR_SCALE, x);
    if (t) t->attr.scale.c = c;
    return t;
}

spmd_tensor *spmd_neg(spmd_graph *g, spmd_tensor *x) { return unary(g, IR_NEG, x); }
spmd_tensor *spmd_exp(spmd_graph *g, spmd_tensor *x) { return unary(g, IR_EXP, x); }
spmd_tensor *spmd_log(spmd_graph *g, spmd_tensor *x) { return unary(g, IR_LOG, x); }
spmd_tensor *spmd_tanh(spmd_graph *g, spmd_tensor *x) { return unary(g, IR_TANH, x); }
spmd_tensor *spmd_gelu(spmd_graph *g, spmd_tensor *x) { return activation(g, IR_GELU, x); }
spmd_tensor *spmd_relu(spmd_graph *g, spmd_tensor *x) { return activation(g, IR_RELU, x); }
spmd_tensor *spmd_sqrt(spmd_graph *g, spmd_tensor *x) { return unary(g, IR_SQRT, x); }
spmd_tensor *spmd_rsqrt(spmd_graph *g, spmd_tensor *x) { return unary(g, IR_RSQRT, x); }
spmd_tensor *spmd_gelu_erf(spmd_graph *g, spmd_tensor *x) { return activation(g, IR_GELU_ERF, x); }
spmd_tensor *spmd_silu(spmd_graph *g, spmd_tensor *x) { return activation(g, IR_SILU, x); }
spmd_tensor *spmd_sigmoid(spmd_graph *g, spmd_tensor *x) { return unary(g, IR_SIGMOID, x); }

spmd_tensor *spmd_pow_scalar(spmd_graph *g, spmd_tensor *x, float p)
{
    spmd_tensor *t = unary(g, IR_POW_SCALAR, x);
    if (t) t->attr.scale.c = p;
    return t;
}

spmd_tensor *spmd_elementwise(spmd_graph *g, const char *op, spmd_tensor *const *in, int n_in,
                              float c)
{
    int found = ir_op_lookup(op);
    if (found < 0 || !ir_op_is_plain_elementwise((ir_op)found)) {
        const char *why = found < 0 ? "no op of that name" : "not a plain elementwise op";
        ir_error(g, SPMD_ERR_INVALID, "elementwise: '%s': %s", op ? op : "(null)", why);
        return NULL;
    }
    return ir_elementwise(g, (ir_op)found, in, n_in, c);
}

spmd_tensor *ir_elementwise(spmd_graph *g, ir_op o, spmd_tensor *const *in, int n_in, float c)
{
    const char *op = ir_op_name(o);
    int arity = ir_op_arity(o);
    if (n_in != arity || !in) {
        ir_error(g, SPMD_ERR_INVALID, "elementwise: %s takes %d operand%s, got %d", op, arity,
                 arity == 1 ? "" : "s", n_in);
        return NULL;
    }
    if (c != 0.0f && !ir_op_reads_constant(o)) {
        ir_error(g, SPMD_ERR_INVALID, "elementwise: %s takes no constant, got %g", op, (double)c);
        return NULL;
    }
    if (arity == 2) return binary(g, o, in[0], in[1]);
    spmd_tensor *t = unary(g, o, in[0]);
    if (t) t->attr.scale.c = c;
    return t;
}

spmd_tensor *spmd_where(spmd_graph *g, spmd_tensor *cond, spmd_tensor *a, spmd_tensor *b)
{
    spmd_tensor *in[3] = {cond, a, b};
    if (any_null(g, "where", in, 3)) return NULL;
    if (cond->dtype != SPMD_F32 && cond->dtype != SPMD_I32) {
        char sc[SHAPE_BUF];
        ir_error(g, SPMD_ERR_INVALID, "where: the condition must be f32 or i32, got %s %s",
                 spmd_dtype_name(cond->dtype), ir_shape_str(cond, sc, sizeof sc));
        return NULL;
    }
    if (!want_f32(g, "where", a) || !want_f32(g, "where", b)) return NULL;
    int rank;
    int64_t dims[SPMD_MAX_RANK];
    if (!broadcast_shape(cond, a, &rank, dims) || !broadcast_dims(rank, dims, b, &rank, dims)) {
        char sc[SHAPE_BUF], sa[SHAPE_BUF], sb[SHAPE_BUF];
        ir_error(g, SPMD_ERR_SHAPE, "where: shapes do not broadcast: cond %s, a %s and b %s",
                 ir_shape_str(cond, sc, sizeof sc), ir_shape_str(a, sa, sizeof sa),
                 ir_shape_str(b, sb, sizeof sb));
        return NULL;
    }
    return ir_node_new(g, IR_WHERE, SPMD_F32, rank, dims, in, 3);
}

spmd_tensor *spmd_expand(spmd_graph *g, spmd_tensor *x, int rank, const int64_t *dims)
{
    if (any_null(g, "expand", &x, 1) || !want_f32(g, "expand", x)) return NULL;
    if (rank < x->rank || rank > SPMD_MAX_RANK || (rank > 0 && !dims)) {
        ir_error(g, SPMD_ERR_SHAPE, "expand: cannot expand rank %d to rank %d", x->rank, rank);
        return NULL;
    }
    for (int i = 0; i < x->rank; i++) {
        int64_t from = x->dims[i], to = dims[rank - x->rank + i];
        if (from != to && from != 1) {
            char sa[SHAPE_BUF];
            ir_error(g, SPMD_ERR_SHAPE,
                     "expand: %s does not broadcast to dimension %d of size %lld",
                     ir_shape_str(x, sa, sizeof sa), rank - x->rank + i, (long long)to);
            return NULL;
        }
    }
    return ir_node_new(g, IR_EXPAND, SPMD_F32, rank, dims, &x, 1);
}

spmd_tensor *ir_sharding_constraint(spmd_graph *g, spmd_tensor *x)
{
    if (any_null(g, "sharding_constraint", &x, 1)) return NULL;
    return ir_node_new(g, IR_SHARDING_CONSTRAINT, x->dtype, x->rank, x->dims, &x, 1);
}

spmd_tensor *spmd_stage_transfer(spmd_graph *g, spmd_tensor *x, int from, int to)
{
    if (any_null(g, "stage_transfer", &x, 1)) return NULL;
    if (from < 0 || to < 0 || from > INT16_MAX || to > INT16_MAX || from == to) {
        ir_error(g, SPMD_ERR_INVALID,
                 "stage_transfer: from stage %d to stage %d; stages are two different numbers "
                 "in 0..%d", from, to, INT16_MAX);
        return NULL;
    }
    spmd_tensor *t = ir_node_new(g, IR_STAGE_TRANSFER, x->dtype, x->rank, x->dims, &x, 1);
    if (!t) return NULL;
    t->attr.stage.from = from;
    t->attr.stage.to = to;
    t->stage = (int16_t)to; /* the value lives where it arrives */
    return t;
}

spmd_status spmd_graph_set_stage(spmd_graph *g, int stage)
{
    if (!g) return base_error(SPMD_ERR_INVALID, "graph_set_stage: graph is NULL");
    if (stage < -1 || stage > INT16_MAX)
        return base_error(SPMD_ERR_INVALID,
                          "graph_set_stage: stage %d is outside -1 (none) .. %d", stage, INT16_MAX);
    g->stage = stage;
    return SPMD_OK;
}

int spmd_tensor_stage(const spmd_tensor *t) { return t ? t->stage : -1; }

spmd_status spmd_graph_set_micro_batch(spmd_graph *g, int micro)
{
    if (!g) return base_error(SPMD_ERR_INVALID, "graph_set_micro_batch: graph is NULL");
    if (micro < -1 || micro > INT16_MAX)
        return base_error(SPMD_ERR_INVALID,
                          "graph_set_micro_batch: micro-batch %d is outside -1 (none) .. %d", micro,
                          INT16_MAX);
    g->micro = micro;
    return SPMD_OK;
}

/* dx = dy * f'(x) of an elementwise activation f: x and dy of one shape. */
static spmd_tensor *grad_helper(spmd_graph *g, ir_op op, spmd_tensor *x, spmd_tensor *dy)
{
    spmd_tensor *in[2] = {x, dy};
    if (any_null(g, ir_op_name(op), in, 2)) return NULL;
    if (!ir_same_shape(x, dy)) return fail_shape2(g, ir_op_name(op), "shapes differ", x, dy);
    return ir_node_new(g, op, SPMD_F32, x->rank, x->dims, in, 2);
}

spmd_tensor *ir_gelu_backward(spmd_graph *g, spmd_tensor *x, spmd_tensor *dy)
{
    return grad_helper(g, IR_GELU_BACKWARD, x, dy);
}

spmd_tensor *ir_relu_backward(spmd_graph *g, spmd_tensor *x, spmd_tensor *dy)
{
    return grad_helper(g, IR_RELU_BACKWARD, x, dy);
}

spmd_tensor *ir_gelu_erf_backward(spmd_graph *g, spmd_tensor *x, spmd_tensor *dy)
{
    return grad_helper(g, IR_GELU_ERF_BACKWARD, x, dy);
}

spmd_tensor *ir_silu_backward(spmd_graph *g, spmd_tensor *x, spmd_tensor *dy)
{
    return grad_helper(g, IR_SILU_BACKWARD, x, dy);
}

/* ---- Reductions ------------------------------------------------------------- */

static spmd_tensor *reduce(spmd_graph *g, ir_op op, spmd_tensor *x, uint32_t axes, bool keepdim)
{
    if (any_null(g, ir_op_name(op), &x, 1) || !want_f32(g, ir_op_name(op), x)) return NULL;
    if (axes == 0 || (x->rank < 32 && (axes >> x->rank) != 0)) {
        ir_error(g, SPMD_ERR_INVALID, "%s: axes mask 0x%x does not fit rank %d", ir_op_name(op),
                 axes, x->rank);
        return NULL;
    }
    int rank = 0;
    int64_t dims[SPMD_MAX_RANK];
    for (int i = 0; i < x->rank; i++) {
        if (axes & (1u << i)) {
            if (keepdim) dims[rank++] = 1;
        } else {
            dims[rank++] = x->dims[i];
        }
    }
    spmd_tensor *t = ir_node_new(g, op, SPMD_F32, rank, dims, &x, 1);
    if (t) {
        t->attr.reduce.axes = axes;
        t->attr.reduce.keepdim = keepdim;
    }
    return t;
}

spmd_tensor *spmd_sum(spmd_graph *g, spmd_tensor *x, uint32_t axes, bool keepdim)
{
    return reduce(g, IR_SUM, x, axes, keepdim);
}

spmd_tensor *spmd_mean(spmd_graph *g, spmd_tensor *x, uint32_t axes, bool keepdim)
{
    return reduce(g, IR_MEAN, x, axes, keepdim);
}

static bool axis_ok(spmd_graph *g, const char *op, const spmd_tensor *x, int axis)
{
    if (axis >= 0 && axis < x->rank) return true;
    char s[SHAPE_BUF];
    ir_error(g, SPMD_ERR_INVALID, "%s: axis %d outside %s", op, axis, ir_shape_str(x, s, sizeof s));
    return false;
}

spmd_tensor *spmd_max(spmd_graph *g, spmd_tensor *x, int axis, bool keepdim)
{
    if (any_null(g, "max", &x, 1) || !want_f32(g, "max", x)) return NULL;
    if (axis < 0) axis += x->rank;
    if (!axis_ok(g, "max", x, axis)) return NULL;
    spmd_tensor *t = reduce(g, IR_MAX, x, 1u << axis, keepdim);
    if (t) {
        t->attr.max.axis = axis;
        t->attr.max.keepdim = keepdim;
    }
    return t;
}

spmd_tensor *spmd_cumsum(spmd_graph *g, spmd_tensor *x, int axis, bool reverse)
{
    if (any_null(g, "cumsum", &x, 1) || !want_f32(g, "cumsum", x)) return NULL;
    if (axis < 0) axis += x->rank;
    if (!axis_ok(g, "cumsum", x, axis)) return NULL;
    spmd_tensor *t = ir_node_new(g, IR_CUMSUM, SPMD_F32, x->rank, x->dims, &x, 1);
    if (t) {
        t->attr.cumsum.axis = axis;
        t->attr.cumsum.reverse = reverse;
    }
    return t;
}

spmd_tensor *ir_max_backward(spmd_graph *g, spmd_tensor *x, spmd_tensor *dy, int axis,
                             bool keepdim)
{
    spmd_tensor *in[2] = {x, dy};
    if (any_null(g, "max_backward", in, 2)) return NULL;
    if (!axis_ok(g, "max_backward", x, axis)) return NULL;
    int64_t want = (int64_t)ir_numel(x) / x->dims[axis];
    if (ir_numel(dy) != want || dy->rank != (keepdim ? x->rank : x->rank - 1))
        return fail_shape2(g, "max_backward", "gradient does not match the reduced input", x, dy);
    spmd_tensor *t = ir_node_new(g, IR_MAX_BACKWARD, SPMD_F32, x->rank, x->dims, in, 2);
    if (t) {
        t->attr.max.axis = axis;
        t->attr.max.keepdim = keepdim;
    }
    return t;
}

/* ---- Row normalisations ------------------------------------------------------ */

static spmd_tensor *rowwise(spmd_graph *g, ir_op op, spmd_tensor *x)
{
    if (any_null(g, ir_op_name(op), &x, 1) || !want_f32(g, ir_op_name(op), x)) return NULL;
    if (x->rank < 1) return fail_shape1(g, ir_op_name(op), "needs rank >= 1", x);
    return ir_node_new(g, op, SPMD_F32, x->rank, x->dims, &x, 1);
}

spmd_tensor *spmd_softmax(spmd_graph *g, spmd_tensor *x) { return rowwise(g, IR_SOFTMAX, x); }
spmd_tensor *spmd_log_softmax(spmd_graph *g, spmd_tensor *x) { return rowwise(g, IR_LOG_SOFTMAX, x); }

/* gamma and beta must be [D] where D is x's last dimension. */
static bool check_affine(spmd_graph *g, const char *op, const spmd_tensor *x, const spmd_tensor *p)
{
    if (p->rank == 1 && x->rank >= 1 && p->dims[0] == x->dims[x->rank - 1]) return true;
    fail_shape2(g, op, "scale/shift must be [D] for input [..., D]", x, p);
    return false;
}

spmd_tensor *spmd_layernorm(spmd_graph *g, spmd_tensor *x, spmd_tensor *gamma,
                            spmd_tensor *beta, float eps)
{
    spmd_tensor *in[3] = {x, gamma, beta};
    if (any_null(g, "layernorm", in, 3)) return NULL;
    if (!want_f32(g, "layernorm", x)) return NULL;
    if (x->rank < 1) return fail_shape1(g, "layernorm", "needs rank >= 1", x);
    if (!check_affine(g, "layernorm", x, gamma) || !check_affine(g, "layernorm", x, beta))
        return NULL;
    if (!(eps > 0)) {
        ir_error(g, SPMD_ERR_INVALID, "layernorm: eps must be positive, got %g", (double)eps);
        return NULL;
    }
    spmd_tensor *t = ir_node_new(g, IR_LAYERNORM, SPMD_F32, x->rank, x->dims, in, 3);
    if (t) {
        t->attr.norm.eps = eps;
        ir_autocast_keep(g, x); /* for its backward, under mixed precision */
    }
    return t;
}

/* x f32, or a bf16 copy kept for the backward pass (autocast.c). */
spmd_tensor *ir_layernorm_xhat(spmd_graph *g, spmd_tensor *x, float eps)
{
    if (any_null(g, "layernorm_xhat", &x, 1) || !want_float(g, "layernorm_xhat", x)) return NULL;
    if (x->rank < 1) return fail_shape1(g, "layernorm_xhat", "needs rank >= 1", x);
    spmd_tensor *t = ir_node_new(g, IR_LAYERNORM_XHAT, SPMD_F32, x->rank, x->dims, &x, 1);
    if (t) t->attr.norm.eps = eps;
    return t;
}

spmd_tensor *ir_layernorm_backward(spmd_graph *g, spmd_tensor *x, spmd_tensor *gamma,
                                   spmd_tensor *dy, float eps)
{
    spmd_tensor *in[3] = {x, gamma, dy};
    if (any_null(g, "layernorm_backward", in, 3)) return NULL;
    if (!check_affine(g, "layernorm_backward", x, gamma)) return NULL;
    if (!ir_same_shape(x, dy)) return fail_shape2(g, "layernorm_backward", "shapes differ", x, dy);
    spmd_tensor *t = ir_node_new(g, IR_LAYERNORM_BACKWARD, SPMD_F32, x->rank, x->dims, in, 3);
    if (t) t->attr.norm.eps = eps;
    return t;
}

/* ---- Pooling ------------------------------------------------------------------ */

static const char *const pool_axis[2] = {"rows", "columns"};

/* A pooled dim's size, torch's: rounded toward minus infinity (a window
 * may be wider than the padded input), and with ceil_mode no window
 * starting in the right padding; < 1 when no window fits. */
static int64_t pool_out_size(int64_t size, int64_t kernel, int64_t stride, int64_t padding,
                         int64_t dilation, bool ceil_mode)
{
    int64_t span = size + 2 * padding - dilation * (kernel - 1) - 1 + (ceil_mode ? stride - 1 : 0);
    int64_t out = (span >= 0 ? span / stride : -((-span + stride - 1) / stride)) + 1;
    if (ceil_mode && (out - 1) * stride >= size + padding) out--;
    return out;
}

/* *out: *in with torch's defaults resolved (stride the kernel, dilation
 * 1), checked as torch checks them; false (recorded on g) if refused. */
static bool pool_resolve(spmd_graph *g, const char *op, const spmd_pool2d *in, bool max,
                         spmd_pool2d *out)
{
    if (!in) {
        ir_error(g, SPMD_ERR_INVALID, "%s: the pooling's parameters are NULL", op);
        return false;
    }
    *out = *in;
    for (int d = 0; d < 2; d++) {
        if (!out->stride[d]) out->stride[d] = out->kernel[d];
        if (!out->dilation[d]) out->dilation[d] = 1;
        long long k = out->kernel[d], s = out->stride[d], p = out->padding[d], dil = out->dilation[d];
        if (k < 1 || s < 1 || dil < 1 || p < 0) {
            ir_error(g, SPMD_ERR_INVALID,
                     "%s: kernel %lld, stride %lld, dilation %lld over the %s: each must be "
                     "positive (and padding %lld not negative)", op, k, s, dil, pool_axis[d], p);
            return false;
        }
        if (2 * p > k) {
            ir_error(g, SPMD_ERR_INVALID,
                     "%s: padding %lld over the %s is more than half the kernel %lld", op, p,
                     pool_axis[d], k);
            return false;
        }
        if (!max && dil != 1) {
            ir_error(g, SPMD_ERR_INVALID,
                     "%s: dilation %lld over the %s; average pooling takes adjacent positions",
                     op, dil, pool_axis[d]);
            return false;
        }
    }
    if (max ? out->divisor_override != 0 : out->divisor_override < 0) {
        ir_error(g, SPMD_ERR_INVALID, "%s: divisor_override %lld; %s", op,
                 (long long)out->divisor_override,
                 max ? "only average pooling divides" : "it must be positive (0: none)");
        return false;
    }
    if (max) out->count_include_pad = false;
    return true;
}

/* x [N, C, H, W] or [C, H, W] with rows and columns, f32. */
static bool pool_input_ok(spmd_graph *g, const char *op, const spmd_tensor *x)
{
    if (!want_f32(g, op, x)) return false;
    if (x->rank != 3 && x->rank != 4) {
        fail_shape1(g, op, "needs [N, C, H, W] or [C, H, W]", x);
        return false;
    }
    if (x->dims[x->rank - 2] < 1 || x->dims[x->rank - 1] < 1) {
        fail_shape1(g, op, "needs at least one row and one column", x);
        return false;
    }
    return true;
}

/* The pooled size of x [.., h, w]; false (recorded) when a dim has none. */
static bool pool_out_dims(spmd_graph *g, const char *op, const spmd_pool2d *p, int64_t h,
                          int64_t w, int64_t *out)
{
    const int64_t in[2] = {h, w};
    for (int d = 0; d < 2; d++) {
        out[d] = pool_out_size(in[d], p->kernel[d], p->stride[d], p->padding[d], p->dilation[d],
                               p->ceil_mode);
        if (out[d] < 1) {
            ir_error(g, SPMD_ERR_SHAPE,
                     "%s: a window of %lld %s (dilation %lld, padding %lld) does not fit in the "
                     "input's %lld %s",
                     op, (long long)p->kernel[d], pool_axis[d], (long long)p->dilation[d],
                     (long long)p->padding[d], (long long)in[d], pool_axis[d]);
            return false;
        }
    }
    return true;
}

/* x's dims with its last two replaced by (h, w). */
static void pool_dims(const spmd_tensor *x, int64_t h, int64_t w, int64_t *dims)
{
    memcpy(dims, x->dims, (size_t)x->rank * sizeof *dims);
    dims[x->rank - 2] = h;
    dims[x->rank - 1] = w;
}

static spmd_tensor *pool(spmd_graph *g, ir_op op, spmd_tensor *x, const spmd_pool2d *p)
{
    const char *name = ir_op_name(op);
    spmd_pool2d r;
    int64_t out[2], dims[SPMD_MAX_RANK];
    if (any_null(g, name, &x, 1) || !pool_input_ok(g, name, x) ||
        !pool_resolve(g, name, p, op == IR_MAX_POOL2D, &r) ||
        !pool_out_dims(g, name, &r, x->dims[x->rank - 2], x->dims[x->rank - 1], out))
        return NULL;
    pool_dims(x, out[0], out[1], dims);
    spmd_tensor *t = ir_node_new(g, op, SPMD_F32, x->rank, dims, &x, 1);
    if (t) t->attr.pool = r;
    return t;
}

spmd_tensor *spmd_max_pool2d(spmd_graph *g, spmd_tensor *x, const spmd_pool2d *p)
{
    return pool(g, IR_MAX_POOL2D, x, p);
}

spmd_tensor *spmd_avg_pool2d(spmd_graph *g, spmd_tensor *x, const spmd_pool2d *p)
{
    return pool(g, IR_AVG_POOL2D, x, p);
}

spmd_tensor *spmd_adaptive_avg_pool2d(spmd_graph *g, spmd_tensor *x, int64_t out_h, int64_t out_w)
{
    const char *name = "adaptive_avg_pool2d";
    if (any_null(g, name, &x, 1) || !pool_input_ok(g, name, x)) return NULL;
    if (out_h < 1 || out_w < 1) {
        char s[SHAPE_BUF];
        ir_error(g, SPMD_ERR_INVALID, "%s: output size %lldx%lld for %s; both must be positive",
                 name, (long long)out_h, (long long)out_w, ir_shape_str(x, s, sizeof s));
        return NULL;
    }
    int64_t dims[SPMD_MAX_RANK];
    pool_dims(x, out_h, out_w, dims);
    return ir_node_new(g, IR_ADAPTIVE_AVG_POOL2D, SPMD_F32, x->rank, dims, &x, 1);
}

/* dy is the gradient of x (x_dims, x_rank) pooled to `out`: the same rank
 * and leading dims, and that size. */
static bool pool_grad_ok(spmd_graph *g, const char *op, const spmd_tensor *dy, int x_rank,
                         const int64_t *x_dims, const int64_t *out)
{
    bool ok = dy->rank == x_rank && dy->dims[x_rank - 2] == out[0] &&
              dy->dims[x_rank - 1] == out[1];
    for (int i = 0; ok && i < x_rank - 2; i++) ok = dy->dims[i] == x_dims[i];
    if (ok) return true;
    char sd[SHAPE_BUF], sx[SHAPE_BUF];
    size_t n = (size_t)snprintf(sx, sizeof sx, "[");
    for (int i = 0; i < x_rank && n < sizeof sx; i++)
        n += (size_t)snprintf(sx + n, sizeof sx - n, i ? ", %lld" : "%lld", (long long)x_dims[i]);
    if (n < sizeof sx) snprintf(sx + n, sizeof sx - n, "]");
    ir_error(g, SPMD_ERR_SHAPE,
             "%s: the gradient %s is not the input %s pooled (to %lld rows and %lld columns)",
             op, ir_shape_str(dy, sd, sizeof sd), sx, (long long)out[0], (long long)out[1]);
    return false;
}

spmd_tensor *ir_max_pool2d_backward(spmd_graph *g, spmd_tensor *x, spmd_tensor *dy,
                                    const spmd_pool2d *p)
{
    const char *name = "max_pool2d_backward";
    spmd_tensor *in[2] = {x, dy};
    spmd_pool2d r;
    int64_t out[2];
    if (any_null(g, name, in, 2) || !pool_input_ok(g, name, x) || !want_f32(g, name, dy) ||
        !pool_resolve(g, name, p, true, &r))
        return NULL;
    int64_t h = x->dims[x->rank - 2], w = x->dims[x->rank - 1];
    if (!pool_out_dims(g, name, &r, h, w, out) || !pool_grad_ok(g, name, dy, x->rank, x->dims, out))
        return NULL;
    spmd_tensor *t = ir_node_new(g, IR_MAX_POOL2D_BACKWARD, SPMD_F32, x->rank, x->dims, in, 2);
    if (t) t->attr.pool = r;
    return t;
}

/* The average pools' backward: dx [.., h, w] from dy, which avg_pool2d's
 * window p must pool [.., h, w] to (the adaptive pool's, p NULL, fits
 * any). */
static spmd_tensor *avg_pool_backward(spmd_graph *g, ir_op op, spmd_tensor *dy, int64_t h,
                                      int64_t w, const spmd_pool2d *p)
{
    const char *name = ir_op_name(op);
    spmd_pool2d r = {.divisor_override = 0};
    if (any_null(g, name, &dy, 1) || !pool_input_ok(g, name, dy) ||
        (p && !pool_resolve(g, name, p, false, &r)))
        return NULL;
    if (h < 1 || w < 1) {
        ir_error(g, SPMD_ERR_SHAPE, "%s: an input of %lld rows and %lld columns; both must be "
                 "positive", name, (long long)h, (long long)w);
        return NULL;
    }
    int64_t dims[SPMD_MAX_RANK];
    pool_dims(dy, h, w, dims);
    if (p) {
        int64_t out[2];
        if (!pool_out_dims(g, name, &r, h, w, out) || !pool_grad_ok(g, name, dy, dy->rank, dims, out))
            return NULL;
    }
    spmd_tensor *t = ir_node_new(g, op, SPMD_F32, dy->rank, dims, &dy, 1);
    if (t && p) t->attr.pool = r;
    return t;
}

spmd_tensor *ir_avg_pool2d_backward(spmd_graph *g, spmd_tensor *dy, int64_t h, int64_t w,
                                    const spmd_pool2d *p)
{
    if (!p) {
        ir_error(g, SPMD_ERR_INVALID, "avg_pool2d_backward: the pooling's parameters are NULL");
        return NULL;
    }
    return avg_pool_backward(g, IR_AVG_POOL2D_BACKWARD, dy, h, w, p);
}

spmd_tensor *ir_adaptive_avg_pool2d_backward(spmd_graph *g, spmd_tensor *dy, int64_t h,
                                             int64_t w)
{
    return avg_pool_backward(g, IR_ADAPTIVE_AVG_POOL2D_BACKWARD, dy, h, w, NULL);
}

/* ---- Batch normalisation --------------------------------------------------- */

/* x [N, C, ...]: f32, rank 2 or more, the channels on dim 1. */
static bool check_channels_input(spmd_graph *g, const char *op, const spmd_tensor *x)
{
    if (!want_f32(g, op, x)) return false;
    if (x->rank >= 2) return true;
    fail_shape1(g, op, "needs x [N, C, ...] (rank >= 2, the channels on dim 1)", x);
    return false;
}

/* v must be f32 [C] for x [N, C, ...]; `what` names it in the message. */
static bool check_channel_vector(spmd_graph *g, const char *op, const char *what,
                                 const spmd_tensor *x, const spmd_tensor *v)
{
    if (!want_f32(g, op, v)) return false;
    if (v->rank == 1 && v->dims[0] == x->dims[1]) return true;
    char sx[SHAPE_BUF], sv[SHAPE_BUF];
    ir_error(g, SPMD_ERR_SHAPE, "%s: %s must be [C] for x [N, C, ...]: x %s, %s %s", op, what,
             ir_shape_str(x, sx, sizeof sx), what, ir_shape_str(v, sv, sizeof sv));
    return false;
}

/* Every dim of x but the channels: what the statistics run over. */
static uint32_t non_channel_axes(const spmd_tensor *x) { return ((1u << x->rank) - 1) & ~2u; }

/* The elements one channel's statistics run over (N times the spatial size). */
static int64_t per_channel_count(const spmd_tensor *x)
{
    return x->dims[1] > 0 ? ir_numel(x) / x->dims[1] : 0;
}

spmd_tensor *spmd_batch_norm_var(spmd_graph *g, spmd_tensor *x, spmd_tensor *mean)
{
    spmd_tensor *in[2] = {x, mean};
    if (any_null(g, "batch_norm_var", in, 2)) return NULL;
    if (!check_channels_input(g, "batch_norm_var", x) ||
        !check_channel_vector(g, "batch_norm_var", "mean", x, mean))
        return NULL;
    spmd_tensor *t = ir_node_new(g, IR_BATCH_NORM_VAR, SPMD_F32, 1, &x->dims[1], in, 2);
    if (t) t->attr.bnorm.count = per_channel_count(x);
    return t;
}

spmd_status spmd_batch_norm_stats(spmd_graph *g, spmd_tensor *x, spmd_tensor **mean,
                                  spmd_tensor **var)
{
    if (!mean || !var)
        return base_error(SPMD_ERR_INVALID, "batch_norm_stats: mean and var must not be NULL");
    *mean = *var = NULL;
    if (any_null(g, "batch_norm_stats", &x, 1)) return spmd_last_status();
    if (!check_channels_input(g, "batch_norm_stats", x)) return spmd_last_status();
    spmd_tensor *m = spmd_mean(g, x, non_channel_axes(x), false);
    spmd_tensor *v = spmd_batch_norm_var(g, x, m);
    if (!v) return spmd_last_status();
    *mean = m;
    *var = v;
    return SPMD_OK;
}

/* Whether mean and var are x's batch statistics as spmd_batch_norm_stats
 * makes them. */
static bool is_batch_stats(const spmd_tensor *x, const spmd_tensor *mean, const spmd_tensor *var)
{
    return mean->op == IR_MEAN && mean->in[0] == x && !mean->attr.reduce.keepdim &&
           mean->attr.reduce.axes == non_channel_axes(x) && var->op == IR_BATCH_NORM_VAR &&
           var->in[0] == x && var->in[1] == mean;
}

spmd_tensor *spmd_batch_norm(spmd_graph *g, spmd_tensor *x, spmd_tensor *mean, spmd_tensor *var,
                             spmd_tensor *weight, spmd_tensor *bias, float eps)
{
    spmd_tensor *in[5] = {x, mean, var, weight, bias};
    if (any_null(g, "batch_norm", in, 3)) return NULL;
    if (!check_channels_input(g, "batch_norm", x) ||
        !check_channel_vector(g, "batch_norm", "mean", x, mean) ||
        !check_channel_vector(g, "batch_norm", "var", x, var) ||
        (weight && !check_channel_vector(g, "batch_norm", "weight", x, weight)) ||
        (bias && !check_channel_vector(g, "batch_norm", "bias", x, bias)))
        return NULL;
    if (!(eps > 0)) {
        ir_error(g, SPMD_ERR_INVALID, "batch_norm: eps must be positive, got %g", (double)eps);
        return NULL;
    }
    /* No weight: 1, no bias: 0 (PyTorch's affine=False). */
    if (!weight && !(in[3] = spmd_fill(g, 1, &x->dims[1], 1.0f))) return NULL;
    if (!bias && !(in[4] = spmd_fill(g, 1, &x->dims[1], 0.0f))) return NULL;
    spmd_tensor *t = ir_node_new(g, IR_BATCH_NORM, SPMD_F32, x->rank, x->dims, in, 5);
    if (t) {
        t->attr.bnorm.eps = eps;
        t->attr.bnorm.count = per_channel_count(x);
        t->attr.bnorm.training = is_batch_stats(x, mean, var);
    }
    return t;
}

spmd_tensor *ir_batch_norm_sums(spmd_graph *g, spmd_tensor *x, spmd_tensor *mean,
                                spmd_tensor *var, spmd_tensor *dy, float eps)
{
    spmd_tensor *in[4] = {x, mean, var, dy};
    if (any_null(g, "batch_norm_sums", in, 4)) return NULL;
    if (!check_channels_input(g, "batch_norm_sums", x) ||
        !check_channel_vector(g, "batch_norm_sums", "mean", x, mean) ||
        !check_channel_vector(g, "batch_norm_sums", "var", x, var))
        return NULL;
    if (!ir_same_shape(x, dy)) return fail_shape2(g, "batch_norm_sums", "shapes differ", x, dy);
    spmd_tensor *t = ir_node_new(g, IR_BATCH_NORM_SUMS, SPMD_F32, 2, (int64_t[]){2, x->dims[1]},
                                 in, 4);
    if (t) {
        t->attr.bnorm.eps = eps;
        t->attr.bnorm.count = per_channel_count(x);
    }
    return t;
}

spmd_tensor *ir_batch_norm_backward(spmd_graph *g, spmd_tensor *x, spmd_tensor *mean,
                                    spmd_tensor *var, spmd_tensor *weight, spmd_tensor *dy,
                                    spmd_tensor *sums, float eps)
{
    spmd_tensor *in[6] = {x, mean, var, weight, dy, sums};
    if (any_null(g, "batch_norm_backward", in, 6)) return NULL;
    if (!check_channels_input(g, "batch_norm_backward", x) ||
        !check_channel_vector(g, "batch_norm_backward", "mean", x, mean) ||
        !check_channel_vector(g, "batch_norm_backward", "var", x, var) ||
        !check_channel_vector(g, "batch_norm_backward", "weight", x, weight))
        return NULL;
    if (!ir_same_shape(x, dy)) return fail_shape2(g, "batch_norm_backward", "shapes differ", x, dy);
    if (sums->rank != 2 || sums->dims[0] != 2 || sums->dims[1] != x->dims[1])
        return fail_shape2(g, "batch_norm_backward", "sums must be [2, C] for x [N, C, ...]", x,
                           sums);
    spmd_tensor *t = ir_node_new(g, IR_BATCH_NORM_BACKWARD, SPMD_F32, x->rank, x->dims, in, 6);
    if (t) {
        t->attr.bnorm.eps = eps;
        t->attr.bnorm.count = per_channel_count(x);
    }
    return t;
}

/* ---- Linear algebra ----------------------------------------------------------- */

spmd_tensor *spmd_convert(spmd_graph *g, spmd_tensor *x, spmd_dtype dtype)
{
    if (!x) return ir_null_operand(g, "convert", 0);
    if (!want_float(g, "convert", x)) return NULL;
    if (dtype != SPMD_F32 && dtype != SPMD_BF16) {
        ir_error(g, SPMD_ERR_INVALID, "convert: to %s; only f32 and bf16 convert",
                 spmd_dtype_name(dtype));
        return NULL;
    }
    if (x->dtype == dtype) return x;
    return ir_node_new(g, IR_CONVERT, dtype, x->rank, x->dims, &x, 1);
}

spmd_status spmd_graph_set_matmul_precision(spmd_graph *g, spmd_dtype dtype)
{
    if (!g) return base_error(SPMD_ERR_INVALID, "set_matmul_precision: graph is NULL");
    if (dtype != SPMD_F32 && dtype != SPMD_BF16)
        return base_error(SPMD_ERR_INVALID,
                          "set_matmul_precision: %s; matmuls take f32 or bf16 operands",
                          spmd_dtype_name(dtype));
    g->matmul_precision = dtype;
    return SPMD_OK;
}

spmd_status spmd_graph_set_reduce_precision(spmd_graph *g, spmd_dtype dtype)
{
    if (!g) return base_error(SPMD_ERR_INVALID, "set_reduce_precision: graph is NULL");
    if (dtype != SPMD_F32 && dtype != SPMD_BF16)
        return base_error(SPMD_ERR_INVALID,
                          "set_reduce_precision: %s; gradients are reduced in f32 or bf16",
                          spmd_dtype_name(dtype));
    g->reduce_precision = dtype;
    return SPMD_OK;
}

/* A matmul operand in the graph's matmul precision: under bf16 an f32
 * operand's bf16 copy, made once per tensor. */
static spmd_tensor *matmul_operand(spmd_graph *g, spmd_tensor *x)
{
    if (g->matmul_precision != SPMD_BF16 || x->dtype != SPMD_F32) return x;
    if (!x->bf16) x->bf16 = spmd_convert(g, x, SPMD_BF16);
    return x->bf16;
}

spmd_tensor *spmd_matmul(spmd_graph *g, spmd_tensor *a, spmd_tensor *b, bool trans_a,
                         bool trans_b)
{
    spmd_tensor *in[2] = {a, b};
    if (any_null(g, "matmul", in, 2)) return NULL;
    if (!want_float(g, "matmul", a) || !want_float(g, "matmul", b)) return NULL;
    if (a->rank < 2 || b->rank < 2)
        return fail_shape2(g, "matmul", "operands need rank >= 2", a, b);
    int64_t dims[SPMD_MAX_RANK];
    int rank;
    if (!trans_a) {
        /* a [L..., K] x b [K, N] (or [N, K]) -> [L..., N] */
        if (b->rank != 2) return fail_shape2(g, "matmul", "b must be 2-D", a, b);
        int64_t k = a->dims[a->rank - 1];
        int64_t kb = trans_b ? b->dims[1] : b->dims[0];
        if (k != kb)
            return fail_shape2(g, "matmul",
                               trans_b ? "contracted dims differ (a [..,K], b [N,K])"
                                       : "contracted dims differ (a [..,K], b [K,N])",
                               a, b);
        rank = a->rank;
        for (int i = 0; i < rank - 1; i++) dims[i] = a->dims[i];
        dims[rank - 1] = trans_b ? b->dims[0] : b->dims[1];
    } else if (trans_b) {
        /* a [K, M]^T x b [N, K]^T -> [M, N], 2-D only */
        if (a->rank != 2 || b->rank != 2)
            return fail_shape2(g, "matmul", "with both transposes operands must be 2-D", a, b);
        if (a->dims[0] != b->dims[1])
            return fail_shape2(g, "matmul", "contracted dims differ (a [K,M], b [N,K])", a, b);
        rank = 2;
        dims[0] = a->dims[1];
        dims[1] = b->dims[0];
    } else {
        /* a [L..., M]^T x b [L..., N] -> [M, N], contracting all of L */
        if (a->rank != b->rank)
            return fail_shape2(g, "matmul", "with trans_a both need the same leading dims", a, b);
        for (int i = 0; i < a->rank - 1; i++)
            if (a->dims[i] != b->dims[i])
                return fail_shape2(g, "matmul", "contracted leading dims differ", a, b);
        rank = 2;
        dims[0] = a->dims[a->rank - 1];
        dims[1] = b->dims[b->rank - 1];
    }
    if (!(in[0] = matmul_operand(g, a)) || !(in[1] = matmul_operand(g, b))) return NULL;
    spmd_tensor *t = ir_node_new(g, IR_MATMUL, SPMD_F32, rank, dims, in, 2);
    if (t) {
        t->attr.matmul.ta = trans_a;
        t->attr.matmul.tb = trans_b;
    }
    return t;
}

spmd_tensor *spmd_bmm(spmd_graph *g, spmd_tensor *a, spmd_tensor *b, bool trans_a, bool trans_b)
{
    spmd_tensor *in[2] = {a, b};
    if (any_null(g, "bmm", in, 2)) return NULL;
    if (!want_float(g, "bmm", a) || !want_float(g, "bmm", b)) return NULL;
    if (a->rank < 3 || a->rank != b->rank)
        return fail_shape2(g, "bmm", "operands need the same rank >= 3", a, b);
    int r = a->rank;
    for (int i = 0; i < r - 2; i++)
        if (a->dims[i] != b->dims[i]) return fail_shape2(g, "bmm", "batch dims differ", a, b);
    int64_t m = trans_a ? a->dims[r - 1] : a->dims[r - 2];
    int64_t ka = trans_a ? a->dims[r - 2] : a->dims[r - 1];
    int64_t kb = trans_b ? b->dims[r - 1] : b->dims[r - 2];
    int64_t n = trans_b ? b->dims[r - 2] : b->dims[r - 1];
    if (ka != kb) return fail_shape2(g, "bmm", "contracted dims differ", a, b);
    int64_t dims[SPMD_MAX_RANK];
    for (int i = 0; i < r - 2; i++) dims[i] = a->dims[i];
    dims[r - 2] = m;
    dims[r - 1] = n;
    if (!(in[0] = matmul_operand(g, a)) || !(in[1] = matmul_operand(g, b))) return NULL;
    spmd_tensor *t = ir_node_new(g, IR_BMM, SPMD_F32, r, dims, in, 2);
    if (t) {
        t->attr.matmul.ta = trans_a;
        t->attr.matmul.tb = trans_b;
    }
    return t;
}

/* ---- Convolution ----------------------------------------------------------------- */

ir_conv_roles ir_conv_roles_of(ir_op op)
{
    switch (op) {
    case IR_CONV2D_BACKWARD_INPUT: return (ir_conv_roles){.x = -1, .w = 1, .y = 0};
    case IR_CONV2D_BACKWARD_WEIGHT: return (ir_conv_roles){.x = 0, .w = -1, .y = 1};
    default: return (ir_conv_roles){.x = 0, .w = 1, .y = -1};
    }
}

const int64_t *ir_conv_dims(const spmd_tensor *t, int role)
{
    return role < 0 ? t->dims : t->in[role]->dims;
}

static const char *dims_str(const int64_t *dims, char *buf, size_t size)
{
    snprintf(buf, size, "[%lld, %lld, %lld, %lld]", (long long)dims[0], (long long)dims[1],
             (long long)dims[2], (long long)dims[3]);
    return buf;
}

/* The attributes opts asks for (a zero field: its default). */
static bool conv_attr(spmd_graph *g, const spmd_conv2d_options *opts, ir_conv *c)
{
    static const spmd_conv2d_options plain = {{1, 1}, {0, 0}, {1, 1}, 1};
    if (!opts) opts = &plain;
    for (int d = 0; d < 2; d++) {
        const char *axis = d ? "columns" : "rows";
        if (opts->stride[d] < 0 || opts->dilation[d] < 0 || opts->padding[d] < 0) {
            ir_error(g, SPMD_ERR_INVALID,
                     "conv2d: stride %d, padding %d, dilation %d over the %s; none may be "
                     "negative",
                     opts->stride[d], opts->padding[d], opts->dilation[d], axis);
            return false;
        }
        c->stride[d] = opts->stride[d] ? opts->stride[d] : 1;
        c->dilation[d] = opts->dilation[d] ? opts->dilation[d] : 1;
        c->pad[d] = opts->padding[d];
    }
    if (opts->groups < 0) {
        ir_error(g, SPMD_ERR_INVALID, "conv2d: %d groups; groups are at least 1", opts->groups);
        return false;
    }
    c->groups = opts->groups ? opts->groups : 1;
    return true;
}

/* y's dims from x's and w's under c, or false with an error naming x as
 * `xs` and w as `ws` (labels: names and shapes). */
static bool conv_out_dims(spmd_graph *g, const char *op, const int64_t *x, const int64_t *w,
                          const ir_conv *c, const char *xs, const char *ws, int64_t *y)
{
    for (int i = 0; i < 4; i++)
        if (x[i] < 1 || (w[i] < 1)) {
            ir_error(g, SPMD_ERR_SHAPE, "%s: x %s and w %s: every dim must be at least 1", op,
                     xs, ws);
            return false;
        }
    if (x[1] % c->groups != 0 || w[0] % c->groups != 0) {
        ir_error(g, SPMD_ERR_SHAPE,
                 "%s: %d groups do not divide the input channels of x %s (Cin %lld) or the "
                 "output channels of w %s (Cout %lld)",
                 op, c->groups, xs, (long long)x[1], ws, (long long)w[0]);
        return false;
    }
    if (w[1] != x[1] / c->groups) {
        ir_error(g, SPMD_ERR_SHAPE,
                 "%s: w %s has %lld input channels per group, x %s has %lld (Cin %lld over %d "
                 "groups)",
                 op, ws, (long long)w[1], xs, (long long)(x[1] / c->groups), (long long)x[1],
                 c->groups);
        return false;
    }
    y[0] = x[0];
    y[1] = w[0];
    for (int d = 0; d < 2; d++) {
        int64_t span = (int64_t)c->dilation[d] * (w[2 + d] - 1) + 1;
        int64_t padded = x[2 + d] + 2 * (int64_t)c->pad[d];
        if (padded < span) {
            ir_error(g, SPMD_ERR_SHAPE,
                     "%s: the kernel of w %s spans %lld %s (dilation %d), more than the %lld "
                     "of x %s padded by %d",
                     op, ws, (long long)span, d ? "columns" : "rows", c->dilation[d],
                     (long long)padded, xs, c->pad[d]);
            return false;
        }
        y[2 + d] = (padded - span) / c->stride[d] + 1;
    }
    return true;
}

static bool want_rank4(spmd_graph *g, const char *op, const char *what, const spmd_tensor *t)
{
    if (t->rank == 4) return true;
    char s[LABEL_BUF];
    ir_error(g, SPMD_ERR_SHAPE, "%s: %s must be 4-D, got %s", op, what, ir_label(t, s, sizeof s));
    return false;
}

spmd_tensor *spmd_conv2d(spmd_graph *g, spmd_tensor *x, spmd_tensor *w,
                         const spmd_conv2d_options *opts)
{
    spmd_tensor *in[2] = {x, w};
    if (any_null(g, "conv2d", in, 2)) return NULL;
    if (!want_f32(g, "conv2d", x) || !want_f32(g, "conv2d", w)) return NULL;
    if (!want_rank4(g, "conv2d", "x [N, Cin, H, W]", x) ||
        !want_rank4(g, "conv2d", "w [Cout, Cin / groups, KH, KW]", w))
        return NULL;
    ir_conv c;
    if (!conv_attr(g, opts, &c)) return NULL;
    char xs[LABEL_BUF], ws[LABEL_BUF];
    int64_t y[4];
    if (!conv_out_dims(g, "conv2d", x->dims, w->dims, &c, ir_label(x, xs, sizeof xs),
                       ir_label(w, ws, sizeof ws), y))
        return NULL;
    spmd_tensor *t = ir_node_new(g, IR_CONV2D, SPMD_F32, 4, y, in, 2);
    if (t) t->attr.conv = c;
    return t;
}

/* The forward's y dims from x and w must be dy's. */
static bool conv_check_dy(spmd_graph *g, const char *op, const int64_t *x, const int64_t *w,
                          const ir_conv *c, const char *xs, const char *ws,
                          const spmd_tensor *dy)
{
    int64_t y[4];
    if (!conv_out_dims(g, op, x, w, c, xs, ws, y)) return false;
    if (memcmp(y, dy->dims, sizeof y) == 0) return true;
    char ys[SHAPE_BUF], ds[LABEL_BUF];
    ir_error(g, SPMD_ERR_SHAPE, "%s: dy %s is not the forward's output %s (x %s, w %s)", op,
             ir_label(dy, ds, sizeof ds), dims_str(y, ys, sizeof ys), xs, ws);
    return false;
}

static bool conv_attr_valid(spmd_graph *g, const char *op, const ir_conv *c)
{
    bool ok = c && c->groups >= 1;
    for (int d = 0; ok && d < 2; d++)
        ok = c->stride[d] >= 1 && c->dilation[d] >= 1 && c->pad[d] >= 0;
    if (!ok) ir_error(g, SPMD_ERR_INVALID, "%s: not a convolution's attributes", op);
    return ok;
}

spmd_tensor *ir_conv2d_backward_input(spmd_graph *g, spmd_tensor *dy, spmd_tensor *w,
                                      const int64_t *x_dims, const ir_conv *c)
{
    static const char op[] = "conv2d_backward_input";
    spmd_tensor *in[2] = {dy, w};
    if (any_null(g, op, in, 2)) return NULL;
    if (!want_f32(g, op, dy) || !want_f32(g, op, w) || !want_rank4(g, op, "dy", dy) ||
        !want_rank4(g, op, "w", w) || !conv_attr_valid(g, op, c))
        return NULL;
    char xs[LABEL_BUF], ws[LABEL_BUF];
    if (!conv_check_dy(g, op, x_dims, w->dims, c, dims_str(x_dims, xs, sizeof xs),
                       ir_label(w, ws, sizeof ws), dy))
        return NULL;
    spmd_tensor *t = ir_node_new(g, IR_CONV2D_BACKWARD_INPUT, SPMD_F32, 4, x_dims, in, 2);
    if (t) t->attr.conv = *c;
    return t;
}

spmd_tensor *ir_conv2d_backward_weight(spmd_graph *g, spmd_tensor *x, spmd_tensor *dy,
                                       const int64_t *w_dims, const ir_conv *c)
{
    static const char op[] = "conv2d_backward_weight";
    spmd_tensor *in[2] = {x, dy};
    if (any_null(g, op, in, 2)) return NULL;
    if (!want_f32(g, op, x) || !want_f32(g, op, dy) || !want_rank4(g, op, "x", x) ||
        !want_rank4(g, op, "dy", dy) || !conv_attr_valid(g, op, c))
        return NULL;
    char xs[LABEL_BUF], ws[LABEL_BUF];
    if (!conv_check_dy(g, op, x->dims, w_dims, c, ir_label(x, xs, sizeof xs),
                       dims_str(w_dims, ws, sizeof ws), dy))
        return NULL;
    spmd_tensor *t = ir_node_new(g, IR_CONV2D_BACKWARD_WEIGHT, SPMD_F32, 4, w_dims, in, 2);
    if (t) t->attr.conv = *c;
    return t;
}

static bool check_qkv(spmd_graph *g, const char *op, spmd_tensor *q, spmd_tensor *k,
                      spmd_tensor *v, int heads)
{
    if (q->rank != 3) {
        fail_shape1(g, op, "q must be [B, T, C]", q);
        return false;
    }
    if (!ir_same_shape(q, k)) {
        fail_shape2(g, op, "q and k differ", q, k);
        return false;
    }
    if (!ir_same_shape(q, v)) {
        fail_shape2(g, op, "q and v differ", q, v);
        return false;
    }
    if (heads <= 0 || q->dims[2] % heads != 0) {
        char s[SHAPE_BUF];
        ir_error(g, SPMD_ERR_SHAPE, "%s: %d heads do not divide the channels of %s", op, heads,
                 ir_shape_str(q, s, sizeof s));
        return false;
    }
    return true;
}

spmd_tensor *spmd_attention(spmd_graph *g, spmd_tensor *q, spmd_tensor *k, spmd_tensor *v,
                            int heads)
{
    spmd_tensor *in[3] = {q, k, v};
    if (any_null(g, "attention", in, 3)) return NULL;
    if (!check_qkv(g, "attention", q, k, v, heads)) return NULL;
    spmd_tensor *t = ir_node_new(g, IR_ATTENTION, SPMD_F32, 3, q->dims, in, 3);
    if (t) {
        t->attr.attention.heads = heads;
        for (int i = 0; i < 3; i++) ir_autocast_keep(g, in[i]); /* for its backward */
    }
    return t;
}

spmd_tensor *ir_attention_backward(spmd_graph *g, spmd_tensor *q, spmd_tensor *k,
                                   spmd_tensor *v, spmd_tensor *dout, int heads)
{
    spmd_tensor *in[4] = {q, k, v, dout};
    if (any_null(g, "attention_backward", in, 4)) return NULL;
    if (!check_qkv(g, "attention_backward", q, k, v, heads)) return NULL;
    if (!ir_same_shape(q, dout))
        return fail_shape2(g, "attention_backward", "dout differs", q, dout);
    int64_t dims[4] = {3, q->dims[0], k->dims[1], q->dims[2]};
    spmd_tensor *t = ir_node_new(g, IR_ATTENTION_BACKWARD, SPMD_F32, 4, dims, in, 4);
    if (t) t->attr.attention.heads = heads;
    return t;
}

/* ---- Decoding with a KV cache ----------------------------------------------------- */

/* pos: the int32 [1] position a run reads. */
static bool check_position(spmd_graph *g, const char *op, const spmd_tensor *pos)
{
    if (!want_i32(g, op, pos)) return false;
    if (pos->rank != 1 || pos->dims[0] != 1) {
        fail_shape1(g, op, "the position must be one int32, shape [1]", pos);
        return false;
    }
    return true;
}

spmd_tensor *spmd_cache_write(spmd_graph *g, spmd_tensor *cache, spmd_tensor *rows,
                              spmd_tensor *pos)
{
    spmd_tensor *in[3] = {cache, rows, pos};
    if (any_null(g, "cache_write", in, 3)) return NULL;
    if (!want_f32(g, "cache_write", cache) || !want_f32(g, "cache_write", rows) ||
        !check_position(g, "cache_write", pos))
        return NULL;
    if (cache->rank != 3) return fail_shape1(g, "cache_write", "the cache must be [B, S, C]", cache);
    if (rows->rank != 3 || rows->dims[0] != cache->dims[0] || rows->dims[2] != cache->dims[2] ||
        rows->dims[1] > cache->dims[1])
        return fail_shape2(g, "cache_write", "rows must be [B, T, C] with T at most the cache's S",
                           cache, rows);
    return ir_node_new(g, IR_CACHE_WRITE, SPMD_F32, 3, cache->dims, in, 3);
}

spmd_tensor *spmd_cached_attention(spmd_graph *g, spmd_tensor *q, spmd_tensor *k_cache,
                                   spmd_tensor *v_cache, spmd_tensor *pos, int heads)
{
    static const char op[] = "cached_attention";
    spmd_tensor *in[4] = {q, k_cache, v_cache, pos};
    if (any_null(g, op, in, 4)) return NULL;
    if (!want_f32(g, op, q) || !want_f32(g, op, k_cache) || !want_f32(g, op, v_cache) ||
        !check_position(g, op, pos))
        return NULL;
    if (q->rank != 3) return fail_shape1(g, op, "q must be [B, T, C]", q);
    if (k_cache->rank != 3 || k_cache->dims[0] != q->dims[0] || k_cache->dims[2] != q->dims[2] ||
        k_cache->dims[1] < q->dims[1])
        return fail_shape2(g, op, "the key cache must be [B, S, C] with S at least T", q, k_cache);
    if (!ir_same_shape(k_cache, v_cache))
        return fail_shape2(g, op, "the key and value caches differ", k_cache, v_cache);
    if (heads <= 0 || q->dims[2] % heads != 0) {
        char s[SHAPE_BUF];
        ir_error(g, SPMD_ERR_SHAPE, "%s: %d heads do not divide the channels of %s", op, heads,
                 ir_shape_str(q, s, sizeof s));
        return NULL;
    }
    spmd_tensor *t = ir_node_new(g, IR_CACHED_ATTENTION, SPMD_F32, 3, q->dims, in, 4);
    if (t) t->attr.attention.heads = heads;
    return t;
}

/* ---- Lookups and losses ---------------------------------------------------------- */

spmd_tensor *spmd_embedding(spmd_graph *g, spmd_tensor *table, spmd_tensor *ids)
{
    spmd_tensor *in[2] = {table, ids};
    if (any_null(g, "embedding", in, 2)) return NULL;
    if (!want_f32(g, "embedding", table) || !want_i32(g, "embedding", ids)) return NULL;
    if (table->rank != 2) return fail_shape1(g, "embedding", "table must be [V, D]", table);
    if (ids->rank + 1 > SPMD_MAX_RANK)
        return fail_shape1(g, "embedding", "ids rank too large", ids);
    int64_t dims[SPMD_MAX_RANK];
    for (int i = 0; i < ids->rank; i++) dims[i] = ids->dims[i];
    dims[ids->rank] = table->dims[1];
    return ir_node_new(g, IR_EMBEDDING, SPMD_F32, ids->rank + 1, dims, in, 2);
}

spmd_tensor *ir_embedding_backward(spmd_graph *g, spmd_tensor *ids, spmd_tensor *dout,
                                   int64_t rows)
{
    spmd_tensor *in[2] = {ids, dout};
    if (any_null(g, "embedding_backward", in, 2)) return NULL;
    if (dout->rank != ids->rank + 1)
        return fail_shape2(g, "embedding_backward", "dout must be [ids..., D]", ids, dout);
    for (int i = 0; i < ids->rank; i++)
        if (ids->dims[i] != dout->dims[i])
            return fail_shape2(g, "embedding_backward", "dout must be [ids..., D]", ids, dout);
    int64_t dims[2] = {rows, dout->dims[dout->rank - 1]};
    spmd_tensor *t = ir_node_new(g, IR_EMBEDDING_BACKWARD, SPMD_F32, 2, dims, in, 2);
    if (t) {
        t->attr.embed.rows = rows;
        t->attr.embed.table = -1;
    }
    return t;
}

static bool check_targets(spmd_graph *g, const char *op, const spmd_tensor *logits,
                          const spmd_tensor *targets)
{
    bool ok = logits->rank >= 1 && targets->rank == logits->rank - 1;
    for (int i = 0; ok && i < targets->rank; i++) ok = targets->dims[i] == logits->dims[i];
    if (!ok)
        fail_shape2(g, op, "targets must be the leading dims of logits [..., V]", logits, targets);
    return ok;
}

spmd_tensor *spmd_cross_entropy(spmd_graph *g, spmd_tensor *logits, spmd_tensor *targets)
{
    spmd_tensor *in[2] = {logits, targets};
    if (any_null(g, "cross_entropy", in, 2)) return NULL;
    if (!want_f32(g, "cross_entropy", logits) || !want_i32(g, "cross_entropy", targets))
        return NULL;
    if (!check_targets(g, "cross_entropy", logits, targets)) return NULL;
    return ir_node_new(g, IR_CROSS_ENTROPY, SPMD_F32, 0, NULL, in, 2);
}

spmd_tensor *ir_cross_entropy_backward(spmd_graph *g, spmd_tensor *logits, spmd_tensor *targets,
                                       spmd_tensor *dloss)
{
    spmd_tensor *in[3] = {logits, targets, dloss};
    if (any_null(g, "cross_entropy_backward", in, 3)) return NULL;
    if (!check_targets(g, "cross_entropy_backward", logits, targets)) return NULL;
    if (dloss->rank != 0)
        return fail_shape1(g, "cross_entropy_backward", "dloss must be a scalar", dloss);
    return ir_node_new(g, IR_CROSS_ENTROPY_BACKWARD, SPMD_F32, logits->rank, logits->dims, in, 3);
}

spmd_tensor *spmd_mse(spmd_graph *g, spmd_tensor *a, spmd_tensor *b)
{
    spmd_tensor *in[2] = {a, b};
    if (any_null(g, "mse", in, 2)) return NULL;
    if (!want_f32(g, "mse", a) || !want_f32(g, "mse", b)) return NULL;
    if (!ir_same_shape(a, b)) return fail_shape2(g, "mse", "shapes differ", a, b);
    return ir_node_new(g, IR_MSE, SPMD_F32, 0, NULL, in, 2);
}

/* ---- Layout ------------------------------------------------------------------------ */

spmd_tensor *spmd_reshape(spmd_graph *g, spmd_tensor *x, int rank, const int64_t *dims)
{
    if (any_null(g, "reshape", &x, 1)) return NULL;
    if (rank < 0 || rank > SPMD_MAX_RANK || (rank > 0 && !dims)) {
        ir_error(g, SPMD_ERR_SHAPE, "reshape: bad target rank %d", rank);
        return NULL;
    }
    int64_t n = 1;
    for (int i = 0; i < rank; i++) n *= dims[i];
    if (n != ir_numel(x)) {
        char sa[SHAPE_BUF], sb[SHAPE_BUF];
        spmd_tensor probe = {.rank = rank};
        for (int i = 0; i < rank; i++) probe.dims[i] = dims[i];
        ir_error(g, SPMD_ERR_SHAPE, "reshape: %s and %s hold different element counts",
                 ir_shape_str(x, sa, sizeof sa), ir_shape_str(&probe, sb, sizeof sb));
        return NULL;
    }
    return ir_node_new(g, IR_RESHAPE, x->dtype, rank, dims, &x, 1);
}

spmd_tensor *spmd_permute(spmd_graph *g, spmd_tensor *x, const int *perm)
{
    if (any_null(g, "permute", &x, 1)) return NULL;
    if (!perm) {
        ir_error(g, SPMD_ERR_INVALID, "permute: perm is NULL");
        return NULL;
    }
    int64_t dims[SPMD_MAX_RANK];
    unsigned seen = 0;
    for (int i = 0; i < x->rank; i++) {
        if (perm[i] < 0 || perm[i] >= x->rank || (seen & (1u << perm[i]))) {
            char s[SHAPE_BUF];
            ir_error(g, SPMD_ERR_INVALID, "permute: entry %d (%d) is not a permutation of %s", i,
                     perm[i], ir_shape_str(x, s, sizeof s));
            return NULL;
        }
        seen |= 1u << perm[i];
        dims[i] = x->dims[perm[i]];
    }
    spmd_tensor *t = ir_node_new(g, IR_PERMUTE, x->dtype, x->rank, dims, &x, 1);
    if (t)
        for (int i = 0; i < x->rank; i++) t->attr.permute.perm[i] = perm[i];
    return t;
}

spmd_tensor *spmd_transpose(spmd_graph *g, spmd_tensor *x, int dim0, int dim1)
{
    if (any_null(g, "transpose", &x, 1)) return NULL;
    if (!axis_ok(g, "transpose", x, dim0) || !axis_ok(g, "transpose", x, dim1)) return NULL;
    int perm[SPMD_MAX_RANK];
    for (int i = 0; i < x->rank; i++) perm[i] = i;
    perm[dim0] = dim1;
    perm[dim1] = dim0;
    return spmd_permute(g, x, perm);
}

spmd_tensor *spmd_slice(spmd_graph *g, spmd_tensor *x, int axis, int64_t start, int64_t len)
{
    if (any_null(g, "slice", &x, 1)) return NULL;
    if (axis < 0) axis += x->rank;
    if (!axis_ok(g, "slice", x, axis)) return NULL;
    if (start < 0 || len <= 0 || start + len > x->dims[axis]) {
        char s[SHAPE_BUF];
        ir_error(g, SPMD_ERR_SHAPE, "slice: [%lld:%lld] is outside dimension %d of %s",
                 (long long)start, (long long)(start + len), axis, ir_shape_str(x, s, sizeof s));
        return NULL;
    }
    int64_t dims[SPMD_MAX_RANK];
    memcpy(dims, x->dims, sizeof dims);
    dims[axis] = len;
    spmd_tensor *t = ir_node_new(g, IR_SLICE, x->dtype, x->rank, dims, &x, 1);
    if (t) {
        t->attr.slice.axis = axis;
        t->attr.slice.start = start;
        t->attr.slice.len = len;
    }
    return t;
}

spmd_tensor *ir_pad(spmd_graph *g, spmd_tensor *x, int axis, int64_t start, int64_t total)
{
    if (any_null(g, "pad", &x, 1)) return NULL;
    if (!axis_ok(g, "pad", x, axis)) return NULL;
    if (start < 0 || start + x->dims[axis] > total) {
        char s[SHAPE_BUF];
        ir_error(g, SPMD_ERR_SHAPE, "pad: %s at %lld does not fit %lld along dimension %d",
                 ir_shape_str(x, s, sizeof s), (long long)start, (long long)total, axis);
        return NULL;
    }
    int64_t dims[SPMD_MAX_RANK];
    memcpy(dims, x->dims, sizeof dims);
    dims[axis] = total;
    spmd_tensor *t = ir_node_new(g, IR_PAD, x->dtype, x->rank, dims, &x, 1);
    if (t) {
        t->attr.pad.axis = axis;
        t->attr.pad.start = start;
        t->attr.pad.total = total;
    }
    return t;
}

spmd_tensor *spmd_concat(spmd_graph *g, spmd_tensor *const *xs, int n, int axis)
{
    if (!xs || n < 1 || n > IR_MAX_INPUTS) {
        ir_error(g, SPMD_ERR_INVALID, "concat: needs 1 to %d tensors, got %d", IR_MAX_INPUTS, n);
        return NULL;
    }
    if (any_null(g, "concat", xs, n)) return NULL;
    const spmd_tensor *x0 = xs[0];
    if (axis < 0) axis += x0->rank;
    if (!axis_ok(g, "concat", x0, axis)) return NULL;
    int64_t dims[SPMD_MAX_RANK];
    memcpy(dims, x0->dims, sizeof dims);
    dims[axis] = 0;
    for (int j = 0; j < n; j++) {
        const spmd_tensor *x = xs[j];
        if (x->dtype != x0->dtype) {
            ir_error(g, SPMD_ERR_INVALID, "concat: tensor %d is %s, tensor 0 %s: one type for all",
                     j, spmd_dtype_name(x->dtype), spmd_dtype_name(x0->dtype));
            return NULL;
        }
        bool ok = x->rank == x0->rank;
        for (int i = 0; ok && i < x->rank; i++) ok = i == axis || x->dims[i] == x0->dims[i];
        if (!ok) {
            char why[64];
            snprintf(why, sizeof why, "tensor %d differs from tensor 0 off axis %d", j, axis);
            return fail_shape2(g, "concat", why, x0, x);
        }
        dims[axis] += x->dims[axis];
    }
    spmd_tensor *t = ir_node_new(g, IR_CONCAT, x0->dtype, x0->rank, dims, xs, n);
    if (t) t->attr.concat.axis = axis;
    return t;
}
