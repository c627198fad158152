/*
 * Every column of every row of ops.def is true of the code (docs/DESIGN.md,
 * "Adding an op": this is its checklist).  The test adds no op; it walks
 * the table and, for each op, a small sample of it:
 *
 *   - every op has a sample here (a new op without one fails, which is the
 *     reminder to state its rules);
 *   - every op has a dimension signature whose dims match the operand and
 *     output sizes, or an explicit propagation rule (reshape);
 *   - an op whose signature binds a dim to whole granules (attention
 *     heads) names a partition fixup;
 *   - the linearity column fits the arity and is true: f(a + b) equals
 *     f(a) + f(b) in the operands it names, computed by the kernels;
 *   - the ops the partitioner emits into per-device programs claim no
 *     global rules (no linearity, fixup or backward rule);
 *   - partitioned over 2 devices, and over 3 (uneven blocks), with any one
 *     operand dim split, the op computes what it computes on one device:
 *     an op that needs a fixup (a rescaled mean, padded rows) and lacks
 *     one fails here; and so with the dim's split grouped (`2*x`, DESIGN
 *     "Grouped splits"): an op whose groups column claims it carries
 *     grouped splits and indexes along the dim fails here;
 *   - an op has an elementwise formula exactly when its signature is
 *     elementwise (every dim parallel, operands broadcast to the output),
 *     of its arity, unless its local form needs a fixup (dropout); fused, it computes its own kernel's bits, and the
 *     fused kernel refuses an op without a formula;
 *   - its kernel writes no scratch beyond the bytes its scratch column
 *     gives it on its sample;
 *   - its bf16 column: fed bf16 copies of its float operands, the op is
 *     refused unless the column lets it read them, and computes from them
 *     what it computes from the f32 values they hold where it does;
 *   - its kind column: a leaf has no kernel, a collective's kernel calls
 *     the transport (a counting group of one member) and a compute op's
 *     never does, and a collective that may fly takes no scratch.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/bf16.h"
#include "compile/compiled.h"
#include "compile/fuse.h"
#include "ir/ir.h"
#include "runtime/collectives/collectives.h"
#include "runtime/executor.h"
#include "runtime/kernels/kernels.h"
#include "shard/partition.h"
#include "shard/propagate.h"
#include "mesh/mesh.h"
#include "spmd/mesh.h"
#include "spmd/spmd.h"
#include "support_rng.h"

#define D(...) ((const int64_t[]){__VA_ARGS__})
#define ATOL 1e-5
#define RTOL 1e-4

/* ---- Samples ------------------------------------------------------------------------ */

typedef enum value_kind { V_ANY, V_POS, V_IDS, V_MASK } value_kind;

typedef struct sample {
    spmd_graph *g;
    int n_in;
    spmd_tensor *in[IR_MAX_INPUTS]; /* the op's operands: graph inputs */
    spmd_tensor *fed[IR_MAX_INPUTS]; /* what the op reads: in, or its bf16 copy */
    value_kind kind[IR_MAX_INPUTS];
    int32_t limit[IR_MAX_INPUTS];   /* V_IDS: ids in [0, limit) */
    int made[IR_MAX_INPUTS];        /* operand j was the made[j]-th one made */
    unsigned bf16;                  /* the operands made (bit k) fed as bf16 */
    spmd_tensor *out;               /* the op's node */
} sample;

static spmd_tensor *operand(sample *s, value_kind kind, int rank, const int64_t *dims)
{
    char name[16];
    int k = s->n_in++;
    snprintf(name, sizeof name, "in%d", k);
    spmd_tensor *t = spmd_input(s->g, name, kind == V_IDS ? SPMD_I32 : SPMD_F32, rank, dims);
    s->kind[k] = kind;
    s->limit[k] = 0;
    s->in[k] = s->fed[k] = t;
    if (s->bf16 >> k & 1) s->fed[k] = spmd_convert(s->g, t, SPMD_BF16);
    return s->fed[k];
}

static spmd_tensor *ids(sample *s, int rank, const int64_t *dims, int32_t limit)
{
    spmd_tensor *t = operand(s, V_IDS, rank, dims);
    s->limit[s->n_in - 1] = limit;
    return t;
}

static spmd_tensor *x46(sample *s) { return operand(s, V_ANY, 2, D(4, 6)); }
static spmd_tensor *pos46(sample *s) { return operand(s, V_POS, 2, D(4, 6)); }
static spmd_tensor *qkv(sample *s) { return operand(s, V_ANY, 3, D(2, 6, 8)); }
/* Attention's q, k and v: 5 rows split unevenly over 2 and 3 devices, so
 * a query block starts off the kernel's blocks and the last one pads. */
static spmd_tensor *qkv5(sample *s) { return operand(s, V_ANY, 3, D(2, 5, 8)); }
static spmd_tensor *mask46(sample *s) { return operand(s, V_MASK, 2, D(4, 6)); }
/* Batch normalisation: x [N, C, L] (split unevenly over 3 on N and L, and
 * over 2 on C), per-channel [C] operands (a variance is positive). */
static spmd_tensor *nch(sample *s) { return operand(s, V_ANY, 3, D(4, 3, 5)); }
static spmd_tensor *per_channel(sample *s, value_kind kind) { return operand(s, kind, 1, D(3)); }

/* Pooling samples: x [N, C, H, W] = [4, 6, 7, 5] (N and C split evenly
 * over 2 and in groups, H and W whole), windows of 3 rows and 2 columns
 * with padding, a stride and ceil_mode; max's columns dilated. */
static spmd_tensor *x4675(sample *s) { return operand(s, V_ANY, 4, D(4, 6, 7, 5)); }
static const spmd_pool2d max_pool = {.kernel = {3, 2}, .stride = {2, 1}, .padding = {1, 1},
                                     .dilation = {1, 2}, .ceil_mode = true};
static const spmd_pool2d avg_pool = {.kernel = {3, 2}, .stride = {2, 2}, .padding = {1, 0},
                                     .ceil_mode = true};

/* Builds a sample of `op` into s->g; false for ops that never appear in a
 * global graph (leaves and the partitioner's own ops). */
static bool build_sample(ir_op op, sample *s)
{
    spmd_graph *g = s->g;
    spmd_tensor *o = NULL;
    switch (op) {
    case IR_INPUT:
    case IR_PARAM:
    case IR_STATE:
    case IR_ALL_REDUCE:
    case IR_ALL_GATHER:
    case IR_REDUCE_SCATTER:
    case IR_ALL_TO_ALL:
    case IR_SHARD_SLICE:
    case IR_MASK_PADDING:
    case IR_VOCAB_CE_STATS:
    case IR_VOCAB_CE_LOSS:
    case IR_VOCAB_CE_BACKWARD:
        return false;
    case IR_FILL: o = spmd_fill(g, 2, D(4, 6), 1.5f); break;
    case IR_ADD: o = spmd_add(g, x46(s), x46(s)); break;
    case IR_SUB: o = spmd_sub(g, x46(s), x46(s)); break;
    case IR_MUL: o = spmd_mul(g, x46(s), x46(s)); break;
    case IR_DIV: o = spmd_div(g, x46(s), pos46(s)); break;
    case IR_EXPAND: o = spmd_expand(g, operand(s, V_ANY, 2, D(1, 6)), 2, D(4, 6)); break;
    case IR_WHERE: o = spmd_where(g, mask46(s), x46(s), operand(s, V_ANY, 1, D(6))); break;
    case IR_SCALE: o = spmd_scale(g, x46(s), -0.75f); break;
    case IR_NEG: o = spmd_neg(g, x46(s)); break;
    case IR_EXP: o = spmd_exp(g, x46(s)); break;
    case IR_LOG: o = spmd_log(g, pos46(s)); break;
    case IR_TANH: o = spmd_tanh(g, x46(s)); break;
    case IR_GELU: o = spmd_gelu(g, x46(s)); break;
    case IR_RELU: o = spmd_relu(g, x46(s)); break;
    case IR_SQRT: o = spmd_sqrt(g, pos46(s)); break;
    case IR_RSQRT: o = spmd_rsqrt(g, pos46(s)); break;
    case IR_GELU_ERF: o = spmd_gelu_erf(g, x46(s)); break;
    case IR_SILU: o = spmd_silu(g, x46(s)); break;
    case IR_SIGMOID: o = spmd_sigmoid(g, x46(s)); break;
    case IR_POW_SCALAR: o = spmd_pow_scalar(g, pos46(s), 1.5f); break;
    case IR_DROPOUT: o = ir_dropout(g, x46(s), operand(s, V_POS, 0, NULL), 0.5f, 3); break;
    case IR_SUM: o = spmd_sum(g, x46(s), 1u << 1, false); break;
    case IR_MEAN: o = spmd_mean(g, x46(s), 1u << 1, false); break;
    case IR_MAX: o = spmd_max(g, x46(s), 1, false); break;
    case IR_CUMSUM: o = spmd_cumsum(g, x46(s), 1, false); break;
    case IR_SOFTMAX: o = spmd_softmax(g, x46(s)); break;
    case IR_LOG_SOFTMAX: o = spmd_log_softmax(g, x46(s)); break;
    case IR_LAYERNORM:
        o = spmd_layernorm(g, x46(s), operand(s, V_POS, 1, D(6)), operand(s, V_ANY, 1, D(6)),
                           1e-5f);
        break;
    case IR_BATCH_NORM_VAR: o = spmd_batch_norm_var(g, nch(s), per_channel(s, V_ANY)); break;
    case IR_BATCH_NORM:
        o = spmd_batch_norm(g, nch(s), per_channel(s, V_ANY), per_channel(s, V_POS),
                            per_channel(s, V_ANY), per_channel(s, V_ANY), 1e-5f);
        break;
    case IR_MATMUL: o = spmd_matmul(g, x46(s), operand(s, V_ANY, 2, D(6, 5)), false, false); break;
    case IR_BMM:
        o = spmd_bmm(g, operand(s, V_ANY, 3, D(2, 4, 6)), operand(s, V_ANY, 3, D(2, 6, 5)), false,
                     false);
        break;
    case IR_ATTENTION: o = spmd_attention(g, qkv5(s), qkv5(s), qkv5(s), 2); break;
    case IR_CONV2D: { /* strided, padded and dilated; groups 1: Cin summed */
        spmd_conv2d_options opts = {.stride = {2, 1}, .padding = {1, 0}, .dilation = {1, 2}};
        spmd_tensor *x = operand(s, V_ANY, 4, D(2, 4, 5, 6));
        o = spmd_conv2d(g, x, operand(s, V_ANY, 4, D(3, 4, 3, 2)), &opts);
        break;
    }

    case IR_CACHE_WRITE:
        o = spmd_cache_write(g, qkv(s), operand(s, V_ANY, 3, D(2, 2, 8)), ids(s, 1, D(1), 5));
        break;
    case IR_CACHED_ATTENTION:
        o = spmd_cached_attention(g, operand(s, V_ANY, 3, D(2, 2, 8)), qkv(s), qkv(s),
                                  ids(s, 1, D(1), 5), 2);
        break;
    case IR_MAX_POOL2D: o = spmd_max_pool2d(g, x4675(s), &max_pool); break;
    case IR_AVG_POOL2D: o = spmd_avg_pool2d(g, x4675(s), &avg_pool); break;
    case IR_ADAPTIVE_AVG_POOL2D: o = spmd_adaptive_avg_pool2d(g, x4675(s), 3, 2); break;
    case IR_EMBEDDING: o = spmd_embedding(g, operand(s, V_ANY, 2, D(10, 6)), ids(s, 1, D(4), 10)); break;
    case IR_CROSS_ENTROPY: o = spmd_cross_entropy(g, operand(s, V_ANY, 2, D(4, 10)), ids(s, 1, D(4), 10)); break;
    case IR_MSE: o = spmd_mse(g, x46(s), x46(s)); break;
    case IR_RESHAPE: o = spmd_reshape(g, x46(s), 3, D(4, 2, 3)); break;
    case IR_PERMUTE: o = spmd_permute(g, x46(s), (const int[]){1, 0}); break;
    case IR_SLICE: o = spmd_slice(g, x46(s), 1, 1, 3); break;
    case IR_CONCAT: {
        spmd_tensor *xs[2] = {x46(s), x46(s)};
        o = spmd_concat(g, xs, 2, 0);
        break;
    }
    case IR_SHARDING_CONSTRAINT: o = ir_sharding_constraint(g, x46(s)); break;
    case IR_STAGE_TRANSFER: o = spmd_stage_transfer(g, x46(s), 0, 1); break;
    case IR_CONVERT: { /* to the other type */
        spmd_tensor *x = x46(s);
        o = spmd_convert(g, x, x->dtype == SPMD_BF16 ? SPMD_F32 : SPMD_BF16);
        break;
    }
    case IR_PAD: o = ir_pad(g, operand(s, V_ANY, 2, D(4, 3)), 1, 1, 6); break;
    case IR_GELU_BACKWARD: o = ir_gelu_backward(g, x46(s), x46(s)); break;
    case IR_RELU_BACKWARD: o = ir_relu_backward(g, x46(s), x46(s)); break;
    case IR_GELU_ERF_BACKWARD: o = ir_gelu_erf_backward(g, x46(s), x46(s)); break;
    case IR_SILU_BACKWARD: o = ir_silu_backward(g, x46(s), x46(s)); break;
    case IR_MAX_BACKWARD: o = ir_max_backward(g, x46(s), operand(s, V_ANY, 1, D(4)), 1, false); break;
    case IR_LAYERNORM_XHAT: o = ir_layernorm_xhat(g, x46(s), 1e-5f); break;
    case IR_LAYERNORM_BACKWARD:
        o = ir_layernorm_backward(g, x46(s), operand(s, V_POS, 1, D(6)), x46(s), 1e-5f);
        break;
    case IR_BATCH_NORM_SUMS:
        o = ir_batch_norm_sums(g, nch(s), per_channel(s, V_ANY), per_channel(s, V_POS), nch(s), 1e-5f);
        break;
    case IR_BATCH_NORM_BACKWARD:
        o = ir_batch_norm_backward(g, nch(s), per_channel(s, V_ANY), per_channel(s, V_POS),
                                   per_channel(s, V_ANY), nch(s), operand(s, V_ANY, 2, D(2, 3)),
                                   1e-5f);
        break;
    case IR_ATTENTION_BACKWARD:
        o = ir_attention_backward(g, qkv5(s), qkv5(s), qkv5(s), qkv5(s), 2);
        break;
    case IR_CONV2D_BACKWARD_INPUT: { /* 2 groups of 2 channels: split in whole groups */
        ir_conv c = {.stride = {2, 2}, .pad = {1, 1}, .dilation = {1, 1}, .groups = 2};
        spmd_tensor *dy = operand(s, V_ANY, 4, D(2, 4, 3, 3));
        o = ir_conv2d_backward_input(g, dy, operand(s, V_ANY, 4, D(4, 2, 3, 3)), D(2, 4, 5, 5), &c);
        break;
    }
    case IR_CONV2D_BACKWARD_WEIGHT: { /* depthwise: any channel split; the batch summed */
        ir_conv c = {.stride = {1, 1}, .pad = {1, 0}, .dilation = {1, 1}, .groups = 4};
        spmd_tensor *x = operand(s, V_ANY, 4, D(3, 4, 5, 5));
        o = ir_conv2d_backward_weight(g, x, operand(s, V_ANY, 4, D(3, 4, 5, 3)), D(4, 1, 3, 3), &c);
        break;
    }
    case IR_EMBEDDING_BACKWARD: o = ir_embedding_backward(g, ids(s, 1, D(4), 10), x46(s), 10); break;
    case IR_MAX_POOL2D_BACKWARD:
        o = ir_max_pool2d_backward(g, x4675(s), operand(s, V_ANY, 4, D(4, 6, 4, 5)), &max_pool);
        break;
    case IR_AVG_POOL2D_BACKWARD:
        o = ir_avg_pool2d_backward(g, operand(s, V_ANY, 4, D(4, 6, 4, 3)), 7, 5, &avg_pool);
        break;
    case IR_ADAPTIVE_AVG_POOL2D_BACKWARD:
        o = ir_adaptive_avg_pool2d_backward(g, operand(s, V_ANY, 4, D(4, 6, 3, 2)), 7, 5);
        break;
    case IR_CROSS_ENTROPY_BACKWARD:
        o = ir_cross_entropy_backward(g, operand(s, V_ANY, 2, D(4, 10)), ids(s, 1, D(4), 10),
                                      operand(s, V_ANY, 0, NULL));
        break;
    case IR_OP_COUNT:
        break;
    default:
        /* A plain elementwise op (ops.def's kernel column kern_formula)
         * without a case of its own: positive operands, inside the domain
         * of every such formula, and a constant where it reads one. */
        if (ir_op_is_plain_elementwise(op)) {
            spmd_tensor *xs[2] = {pos46(s), ir_op_arity(op) == 2 ? pos46(s) : NULL};
            o = spmd_elementwise(g, ir_op_name(op), xs, ir_op_arity(op),
                                 ir_op_reads_constant(op) ? 1.5f : 0.0f);
        }
        break;
    }
    /* An op without a case here lands on fail(): add a sample for it.
     * With operands fed as bf16, a builder may refuse them. */
    if (!o && s->bf16) return false;
    if (!o) fail_msg("%s: no sample in tests/ops/test_op_rules.c (%s)", ir_op_name(op), spmd_last_error());
    assert_int_equal(o->op, op);
    s->out = o;
    /* Operand j of the sample is operand j of the op (C evaluates the
     * builders' arguments in no set order). */
    sample made = *s;
    assert_int_equal(o->n_in, made.n_in);
    for (int j = 0; j < o->n_in; j++) {
        int k = 0;
        /* A builder may convert an operand itself (matmul: both in bf16
         * when one is). */
        const spmd_tensor *x = o->in[j]->op == IR_CONVERT && s->bf16 ? o->in[j]->in[0] : o->in[j];
        while (k < made.n_in && made.fed[k] != o->in[j] && made.fed[k] != x) k++;
        if (k == made.n_in) fail_msg("%s: operand %d (%s) is none of the sample's", ir_op_name(op), j, ir_op_name(o->in[j]->op));
        s->in[j] = made.in[k];
        s->fed[j] = made.fed[k];
        s->kind[j] = made.kind[k];
        s->limit[j] = made.limit[k];
        s->made[j] = k;
    }
    return true;
}

/* The sample of op, its output marked, the operands made (bit k of
 * `bf16`) fed to it as bf16 copies; false for ops without one. */
static bool new_sample_fed(ir_op op, unsigned bf16, sample *s)
{
    memset(s, 0, sizeof *s);
    s->bf16 = bf16;
    s->g = spmd_graph_create(NULL);
    assert_non_null(s->g);
    if (build_sample(op, s)) {
        assert_int_equal(spmd_graph_mark_output(s->g, s->out), SPMD_OK);
        return true;
    }
    spmd_graph_free(s->g);
    s->g = NULL;
    return false;
}

static bool new_sample(ir_op op, sample *s) { return new_sample_fed(op, 0, s); }

/* ---- Running a sample ------------------------------------------------------------------ */

typedef struct values {
    void *in[IR_MAX_INPUTS];
} values;

static void draw(const sample *s, test_rng *r, values *v)
{
    for (int j = 0; j < s->n_in; j++) {
        int64_t n = spmd_tensor_numel(s->in[j]);
        v->in[j] = calloc((size_t)(n ? n : 1), 4);
        assert_non_null(v->in[j]);
        for (int64_t i = 0; i < n; i++) {
            if (s->kind[j] == V_IDS) ((int32_t *)v->in[j])[i] = test_rng_int(r, 0, s->limit[j] - 1);
            else if (s->kind[j] == V_POS) ((float *)v->in[j])[i] = test_rng_float(r, 0.5f, 2.0f);
            else if (s->kind[j] == V_MASK) ((float *)v->in[j])[i] = (float)test_rng_int(r, 0, 1);
            else ((float *)v->in[j])[i] = test_rng_float(r, -1.0f, 1.0f);
        }
    }
}

static void free_values(const sample *s, values *v)
{
    for (int j = 0; j < s->n_in; j++) free(v->in[j]);
}

/* The sample's output for the given operand values, from program p. */
static float *run(spmd_program *p, const sample *s, const values *v)
{
    for (int j = 0; j < s->n_in; j++) {
        size_t bytes = (size_t)spmd_tensor_numel(s->in[j]) * 4;
        assert_int_equal(spmd_program_set_input(p, s->in[j], v->in[j], bytes), SPMD_OK);
    }
    if (spmd_program_run(p) != SPMD_OK) fail_msg("run: %s", spmd_last_error());
    int64_t n = spmd_tensor_numel(s->out);
    float *y = calloc((size_t)(n ? n : 1), sizeof *y);
    assert_non_null(y);
    if (s->out->dtype == SPMD_BF16) { /* read as it is, compared as f32 */
        bf16_bits *h = calloc((size_t)(n ? n : 1), sizeof *h);
        assert_non_null(h);
        assert_int_equal(spmd_program_read(p, s->out, h, (size_t)n * sizeof *h), SPMD_OK);
        bf16_to_f32_n(y, h, (size_t)n);
        free(h);
        return y;
    }
    assert_int_equal(spmd_program_read(p, s->out, y, (size_t)n * sizeof *y), SPMD_OK);
    return y;
}

static spmd_program *compile(const sample *s)
{
    spmd_program *p = spmd_compile(s->g, &(spmd_compile_options){.threads = 1});
    if (!p) fail_msg("%s: compile: %s", ir_op_name(s->out->op), spmd_last_error());
    return p;
}

static void assert_close(const float *got, const float *want, int64_t n, const char *what)
{
    for (int64_t i = 0; i < n; i++)
        if (!(fabs((double)got[i] - want[i]) <= ATOL + RTOL * fabs((double)want[i])))
            fail_msg("%s: element %lld is %.8g, want %.8g", what, (long long)i, (double)got[i],
                     (double)want[i]);
}

/* ---- Structural facts -------------------------------------------------------------------- */

static bool partitioner_only(ir_op op)
{
    return op >= IR_ALL_REDUCE; /* ops.def lists the partitioner's ops last */
}

/* Whether t's signature is elementwise: every dim parallel, the output's
 * dims its iterations in order, and every operand dim the output dim it
 * aligns with (numpy, from the right) or broadcast (size 1, no
 * iteration). */
static bool elementwise_signature(const spmd_tensor *t, const ir_dimsig *sig)
{
    if (t->n_in == 0 || sig->n_iter != t->rank) return false;
    for (int it = 0; it < sig->n_iter; it++)
        if (sig->kind[it] != IR_ITER_PARALLEL) return false;
    for (int i = 0; i < t->rank; i++)
        if (sig->out[i] != i) return false;
    for (int j = 0; j < t->n_in; j++) {
        const spmd_tensor *x = t->in[j];
        if (x->rank > t->rank) return false;
        for (int i = 0; i < x->rank; i++) {
            int it = sig->in[j][i];
            if (it != t->rank - x->rank + i && !(it < 0 && x->dims[i] == 1)) return false;
        }
    }
    return true;
}

static void test_every_op_has_rules(void **state)
{
    (void)state;
    int samples = 0;
    for (int op = 0; op < IR_OP_COUNT; op++) {
        ir_linearity lin = ir_op_linearity((ir_op)op);
        int arity = ir_op_arity((ir_op)op);
        /* The linearity column fits the arity. */
        if (lin == LIN_ONE) assert_int_equal(arity, 1);
        if (lin == LIN_EACH || lin == LIN_FIRST) assert_int_equal(arity, 2);
        if (lin == LIN_ALL) assert_true(arity == -1 || arity >= 2);
        if (partitioner_only((ir_op)op) || ir_op_is_leaf((ir_op)op)) {
            assert_int_equal(lin, LIN_NONE);
            assert_false(partition_has_fixup((ir_op)op));
            assert_int_equal(ir_op_formula_arity((ir_op)op), 0);
            if (partitioner_only((ir_op)op)) assert_false(ir_op_has_vjp((ir_op)op));
        }

        sample s;
        if (!new_sample((ir_op)op, &s)) {
            assert_true(partitioner_only((ir_op)op) || ir_op_is_leaf((ir_op)op));
            continue;
        }
        samples++;
        const spmd_tensor *t = s.out;
        ir_dimsig sig;
        if (!ir_signature(t, &sig)) {
            if (!shard_has_explicit_rule((ir_op)op))
                fail_msg("%s: no dimension signature and no explicit sharding rule",
                         ir_op_name((ir_op)op));
            assert_int_equal(ir_op_formula_arity((ir_op)op), 0);
            spmd_graph_free(s.g);
            continue;
        }
        /* An elementwise op has its formula (fusion and its kernel share
         * it), and only an elementwise op has one; convert, which changes
         * the type, has none (fusion computes f32), nor has an op whose
         * local form needs a fixup (dropout's global indices: a fused pass
         * has no fixup), nor a collective (a stage transfer moves its
         * elements between devices, which no formula says). */
        int formula = ir_op_formula_arity((ir_op)op);
        bool fixup = partition_has_fixup((ir_op)op);
        if (elementwise_signature(t, &sig) && !formula && t->dtype == t->in[0]->dtype && !fixup &&
            !ir_op_is_collective((ir_op)op))
            fail_msg("%s: an elementwise signature but no formula in ops.def",
                     ir_op_name((ir_op)op));
        if (formula && fixup)
            fail_msg("%s: a formula and a fixup in ops.def: a fused pass would lose the fixup",
                     ir_op_name((ir_op)op));
        if (formula && !elementwise_signature(t, &sig))
            fail_msg("%s: a formula in ops.def but its signature is not elementwise",
                     ir_op_name((ir_op)op));
        if (formula && formula != t->n_in)
            fail_msg("%s: its formula takes %d operands, the op %d", ir_op_name((ir_op)op),
                     formula, t->n_in);
        /* The signature's dims are the operands' and the output's. */
        assert_int_equal(sig.n_in, t->n_in);
        assert_int_equal(sig.out_rank, t->rank);
        for (int j = 0; j < t->n_in; j++) {
            assert_int_equal(sig.in_rank[j], t->in[j]->rank);
            for (int i = 0; i < t->in[j]->rank; i++) {
                int it = sig.in[j][i];
                if (it < 0) continue; /* broadcast: one element for all */
                assert_true(it < sig.n_iter);
                if (sig.size[it] != t->in[j]->dims[i] && sig.kind[it] != IR_ITER_FULL)
                    fail_msg("%s: operand %d dim %d has %lld elements, its iteration %lld",
                             ir_op_name((ir_op)op), j, i, (long long)t->in[j]->dims[i],
                             (long long)sig.size[it]);
            }
        }
        for (int i = 0; i < t->rank; i++) {
            int it = sig.out[i];
            if (it >= 0 && sig.kind[it] != IR_ITER_FULL) assert_int_equal(sig.size[it], t->dims[i]);
            /* An output dim cannot be a reduction. */
            if (it >= 0) assert_int_not_equal(sig.kind[it], IR_ITER_SUM);
        }
        /* Whole granules (heads) per device need the op's fixup. */
        for (int it = 0; it < sig.n_iter; it++)
            if (sig.granule[it] > 0 && !partition_has_fixup((ir_op)op))
                fail_msg("%s: shards hold whole granules but ops.def names no fixup",
                         ir_op_name((ir_op)op));
        spmd_graph_free(s.g);
    }
    assert_true(samples >= 40);
}

/* ---- Linearity, by the kernels ------------------------------------------------------------- */

/* f(a + b) = f(a) + f(b) in the operands `which` (bit j), the others held. */
static void check_linear(ir_op op, uint32_t which)
{
    sample s;
    assert_true(new_sample(op, &s));
    spmd_program *p = compile(&s);
    test_rng r = test_rng_for(7, ir_op_name(op));
    values a, b, sum;
    draw(&s, &r, &a);
    draw(&s, &r, &b);
    draw(&s, &r, &sum);
    for (int j = 0; j < s.n_in; j++) {
        int64_t n = spmd_tensor_numel(s.in[j]);
        size_t bytes = (size_t)(n ? n : 1) * 4;
        if (!(which >> j & 1) || s.kind[j] == V_IDS) {
            memcpy(b.in[j], a.in[j], bytes); /* held */
            memcpy(sum.in[j], a.in[j], bytes);
            continue;
        }
        for (int64_t i = 0; i < n; i++)
            ((float *)sum.in[j])[i] = ((float *)a.in[j])[i] + ((float *)b.in[j])[i];
    }
    float *fa = run(p, &s, &a), *fb = run(p, &s, &b), *fsum = run(p, &s, &sum);
    int64_t n = spmd_tensor_numel(s.out);
    for (int64_t i = 0; i < n; i++) fa[i] += fb[i];
    char what[64];
    snprintf(what, sizeof what, "%s linear in operands 0x%x", ir_op_name(op), which);
    assert_close(fsum, fa, n, what);
    free(fa), free(fb), free(fsum);
    free_values(&s, &a), free_values(&s, &b), free_values(&s, &sum);
    spmd_program_free(p);
    spmd_graph_free(s.g);
}

static void test_linearity_holds(void **state)
{
    (void)state;
    int checked = 0;
    for (int op = 0; op < IR_OP_COUNT; op++) {
        switch (ir_op_linearity((ir_op)op)) {
        case LIN_NONE: continue;
        case LIN_ONE:
        case LIN_FIRST: check_linear((ir_op)op, 1u); break;
        case LIN_EACH:
            check_linear((ir_op)op, 1u);
            check_linear((ir_op)op, 2u);
            break;
        case LIN_ALL: check_linear((ir_op)op, 3u); break;
        }
        checked++;
    }
    assert_true(checked >= 10);
}

/* ---- Partitioned against one device ----------------------------------------------------------- */

/* Operand j of the sample, or its output for j = n_in. */
static spmd_tensor *operand_or_output(const sample *s, int j)
{
    return j < s->n_in ? s->in[j] : s->out;
}

/* Mark dim `dim` of operand j (the output for j = n_in) split over the
 * one axis of `mesh`, in `groups` groups (1: a plain split). */
static void mark_dim(sample *s, int j, int dim, const spmd_mesh *mesh, int groups)
{
    char spec[128] = "", split[16] = "x";
    if (groups > 1) snprintf(split, sizeof split, "%d*x", groups);
    spmd_tensor *t = operand_or_output(s, j);
    for (int i = 0; i < spmd_tensor_rank(t); i++)
        snprintf(spec + strlen(spec), sizeof spec - strlen(spec), "%s%s", i ? ", " : "",
                 i == dim ? split : "None");
    if (spmd_mark_sharding(s->g, t, mesh, spec) != SPMD_OK)
        fail_msg("%s: mark '%s' on operand %d (%d: the output): %s", ir_op_name(s->out->op),
                 spec, j, s->n_in, spmd_last_error());
}

/* The fewest groups (at least 2) that a grouped split of a dim of `size`
 * over `devices` cuts exactly; 0 when none does. */
static int groups_for(int64_t size, int devices)
{
    for (int groups = 2; groups * devices <= size; groups++)
        if (size % (groups * devices) == 0) return groups;
    return 0;
}

static void check_partitioned(ir_op op, const spmd_mesh *mesh, int *cases, int *grouped)
{
    sample ref;
    if (!new_sample(op, &ref)) return;
    spmd_program *one = compile(&ref);
    test_rng r = test_rng_for(11, ir_op_name(op));
    values v;
    draw(&ref, &r, &v);
    float *want = run(one, &ref, &v);
    int64_t n = spmd_tensor_numel(ref.out);
    int devices = spmd_mesh_devices(mesh);
    /* Each operand dim, then each output dim (the op's own mark). */
    for (int j = 0; j <= ref.n_in; j++) {
        const spmd_tensor *x = operand_or_output(&ref, j);
        for (int dim = 0; dim < x->rank; dim++) {
            /* A plain split, then a grouped one where the dim has room:
             * an op that carries groups (ops.def) must not care where a
             * device's elements lie. */
            int groups = groups_for(x->dims[dim], devices);
            for (int grouped_split = 0; grouped_split <= (groups > 0); grouped_split++) {
                sample s;
                assert_true(new_sample(op, &s));
                mark_dim(&s, j, dim, mesh, grouped_split ? groups : 1);
                spmd_program *p = compile(&s);
                float *got = run(p, &s, &v);
                char what[160], which[24] = "its output";
                if (j < ref.n_in) snprintf(which, sizeof which, "operand %d", j);
                snprintf(what, sizeof what, "%s with %s dim %d split %d ways%s",
                         ir_op_name(op), which, dim, devices,
                         grouped_split ? (ir_op_carries_groups(op) ? " in groups (it claims to "
                                                                     "carry grouped splits)"
                                                                   : " in groups")
                                       : "");
                assert_close(got, want, n, what);
                free(got);
                spmd_program_free(p);
                spmd_graph_free(s.g);
                (*cases)++;
                *grouped += grouped_split;
            }
        }
    }
    free(want);
    free_values(&ref, &v);
    spmd_program_free(one);
    spmd_graph_free(ref.g);
}

static void test_partitioned_equals_one_device(void **state)
{
    (void)state;
    int cases = 0, grouped = 0;
    for (int devices = 2; devices <= 3; devices++) {
        char shape[8];
        snprintf(shape, sizeof shape, "%d", devices);
        spmd_mesh *mesh = spmd_mesh_parse(shape, "x");
        assert_non_null(mesh);
        for (int op = 0; op < IR_OP_COUNT; op++) check_partitioned((ir_op)op, mesh, &cases, &grouped);
        spmd_mesh_free(mesh);
    }
    assert_true(cases >= 600);
    assert_true(grouped >= 250);
}

/* ---- Formulas: fused against the op's own kernel --------------------------------------------- */

/* The op's sample read by a neg (exact, so the op's bits pass through),
 * which absorbs the op into a fused group: the fused program must give
 * the unfused one's bits. */
static void check_fused(ir_op op)
{
    sample s;
    memset(&s, 0, sizeof s);
    s.g = spmd_graph_create(NULL);
    assert_non_null(s.g);
    assert_true(build_sample(op, &s));
    const spmd_tensor *member = s.out;
    s.out = spmd_neg(s.g, s.out);
    assert_non_null(s.out);
    assert_int_equal(spmd_graph_mark_output(s.g, s.out), SPMD_OK);
    spmd_program *fused = spmd_compile(s.g, &(spmd_compile_options){.threads = 1});
    spmd_program *plain = spmd_compile(s.g, &(spmd_compile_options){.threads = 1, .unfused = true});
    assert_non_null(fused);
    assert_non_null(plain);
    if (!executor_compiled(fused)->fusion.absorbed[member->id])
        fail_msg("%s: has a formula but was not fused into the neg that reads it", ir_op_name(op));
    test_rng r = test_rng_for(13, ir_op_name(op));
    values v;
    draw(&s, &r, &v);
    float *got = run(fused, &s, &v), *want = run(plain, &s, &v);
    int64_t n = spmd_tensor_numel(s.out);
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof got[i]) != 0)
            fail_msg("%s: fused, element %lld is %.9g, its kernel gives %.9g", ir_op_name(op),
                     (long long)i, (double)got[i], (double)want[i]);
    free(got), free(want);
    free_values(&s, &v);
    spmd_program_free(fused);
    spmd_program_free(plain);
    spmd_graph_free(s.g);
}

static void test_fused_formula_is_the_kernels(void **state)
{
    (void)state;
    int checked = 0;
    for (int op = 0; op < IR_OP_COUNT; op++) {
        if (!ir_op_formula_arity((ir_op)op)) continue;
        check_fused((ir_op)op);
        checked++;
    }
    assert_true(checked >= 16);
}

/* A member whose op has no formula is a broken invariant the fused kernel
 * reports, not a step it skips. */
static void test_fused_refuses_op_without_formula(void **state)
{
    (void)state;
    ir_op op = IR_SOFTMAX;
    assert_int_equal(ir_op_formula_arity(op), 0);
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_tensor *x = spmd_input(g, "x", SPMD_F32, 2, D(4, 6));
    spmd_tensor *t = spmd_softmax(g, x);
    assert_non_null(t);
    fuse_group grp = {.root = t, .domain = t, .n_steps = 1, .n_in = 1};
    grp.steps[0] = (fuse_step){.op = op, .src = {-1, 0}, .stored = -1};
    grp.in[0] = x;
    grp.in_numel[0] = 24;
    float in[24] = {0}, out[24];
    float *scratch = calloc(1, fusion_scratch_bytes(&grp));
    assert_non_null(scratch);
    _Atomic int status = SPMD_OK;
    char message[256] = "";
    kern_args a = {.node = t, .in = {in}, .out = out, .scratch = scratch, .ith = 0, .nth = 1,
                   .status = &status, .message = message, .message_size = sizeof message,
                   .fused = &grp};
    kern_fused(&a);
    assert_int_equal(status, SPMD_ERR_INTERNAL);
    assert_non_null(strstr(message, "softmax"));
    free(scratch);
    spmd_graph_free(g);
}

/* ---- The bf16 column, by the kernels ------------------------------------------------------------ */

/* Values a bf16 copy holds exactly. */
static void round_to_bf16(float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) x[i] = bf16_to_f32(bf16_from_f32(x[i]));
}

/* The sample of op with the operands in `which` (bit j, operand j) fed as
 * bf16 copies: refused (by the builder or by compile) unless ops.def's
 * bf16 column lets the op read them; if it does, the kernel widens them
 * exactly, so the op computes what it computes from f32 operands holding
 * the same values, and a result it makes in bf16 holds those values
 * rounded. */
static void check_bf16_operands(ir_op op, unsigned which, int *checked)
{
    sample f;
    assert_true(new_sample(op, &f));
    unsigned made = 0;
    bool allowed = true;
    for (int j = 0; j < f.n_in; j++)
        if (which >> j & 1) {
            made |= 1u << f.made[j];
            allowed = allowed && ir_op_reads_bf16(op, j);
        }
    sample h;
    bool built = new_sample_fed(op, made, &h);
    spmd_program *ph = built ? spmd_compile(h.g, &(spmd_compile_options){.threads = 1}) : NULL;
    if (!allowed) {
        if (ph)
            fail_msg("%s: compiled with operands 0x%x in bf16, which ops.def's bf16 column "
                     "does not let it read", ir_op_name(op), which);
        assert_int_equal(spmd_last_status(), built ? SPMD_ERR_UNSUPPORTED : spmd_last_status());
    } else {
        if (!ph)
            fail_msg("%s: ops.def's bf16 column lets it read operands 0x%x in bf16, but: %s",
                     ir_op_name(op), which, spmd_last_error());
        spmd_program *pf = compile(&f);
        test_rng r = test_rng_for(23, ir_op_name(op));
        values v;
        draw(&f, &r, &v);
        /* Every float operand's values held by bf16 exactly (matmul reads
         * both operands in bf16 when one is). */
        for (int j = 0; j < f.n_in; j++)
            if (f.kind[j] != V_IDS) round_to_bf16(v.in[j], spmd_tensor_numel(f.in[j]));
        /* h's inputs are f's, made in the same order. */
        values vh = {0};
        for (int j = 0; j < h.n_in; j++) vh.in[j] = v.in[j];
        float *want = run(pf, &f, &v), *got = run(ph, &h, &vh);
        int64_t n = spmd_tensor_numel(f.out);
        if (h.out->dtype == SPMD_BF16) round_to_bf16(want, n);
        char what[96];
        snprintf(what, sizeof what, "%s reading operands 0x%x in bf16", ir_op_name(op), which);
        assert_close(got, want, n, what);
        free(want), free(got);
        free_values(&f, &v);
        spmd_program_free(pf);
        (*checked)++;
    }
    spmd_program_free(ph);
    if (built) spmd_graph_free(h.g);
    spmd_graph_free(f.g);
}

static void test_bf16_column_is_the_kernels(void **state)
{
    (void)state;
    int checked = 0;
    for (int op = 0; op < IR_OP_COUNT; op++) {
        sample s;
        if (!new_sample((ir_op)op, &s)) continue;
        unsigned floats = 0;
        for (int j = 0; j < s.n_in; j++)
            if (s.kind[j] != V_IDS && s.in[j]->dtype == SPMD_F32) floats |= 1u << j;
        spmd_graph_free(s.g);
        /* Each float operand alone, and all of them; the ops that move
         * values take operands of one type (concat refuses a mix). */
        bool moves = ir_op_makes_bf16((ir_op)op);
        for (int j = 0; j < IR_MAX_INPUTS; j++)
            if (floats >> j & 1 && !(moves && floats != 1u << j))
                check_bf16_operands((ir_op)op, 1u << j, &checked);
        if (floats & (floats - 1)) check_bf16_operands((ir_op)op, floats, &checked);
    }
    assert_true(checked >= 10);
}

/* ---- The kind column, by the kernels ------------------------------------------------------------ */

/* A one-member group of the shared-memory transport whose calls are
 * counted: a kernel that calls the transport is a collective's. */
static const coll_ops *transport;
static int transport_calls;

static spmd_status count_all_reduce(coll_group *g, int m, void *buf, int64_t n, coll_dtype type)
{
    transport_calls++;
    return transport->all_reduce(g, m, buf, n, type);
}
static spmd_status count_all_gather(coll_group *g, int m, const void *in, void *out, int64_t outer,
                                    int64_t inner_bytes)
{
    transport_calls++;
    return transport->all_gather(g, m, in, out, outer, inner_bytes);
}
static spmd_status count_reduce_scatter(coll_group *g, int m, const void *in, void *out,
                                        int64_t outer, int64_t inner, coll_dtype type)
{
    transport_calls++;
    return transport->reduce_scatter(g, m, in, out, outer, inner, type);
}
static spmd_status count_all_to_all(coll_group *g, int m, const void *in, void *out, int64_t bytes)
{
    transport_calls++;
    return transport->all_to_all(g, m, in, out, bytes);
}
static spmd_status count_broadcast(coll_group *g, int m, void *buf, int64_t bytes, int root)
{
    transport_calls++;
    return transport->broadcast(g, m, buf, bytes, root);
}
static spmd_status count_permute(coll_group *g, int m, const void *in, void *out, int64_t bytes,
                                 const int *src)
{
    transport_calls++;
    return transport->permute(g, m, in, out, bytes, src);
}

static const coll_ops counting_ops = {count_all_reduce, count_all_gather, count_reduce_scatter,
                                      count_all_to_all, count_broadcast, count_permute};

/* A node of a partitioner's op on x [4, 6] over a group of one member: its
 * blocks are the whole dim 1. */
static spmd_tensor *partitioner_node(spmd_graph *g, ir_op op, spmd_tensor **x)
{
    *x = spmd_input(g, "x", SPMD_F32, 2, D(4, 6));
    spmd_tensor *t = ir_node_new(g, op, SPMD_F32, 2, (*x)->dims, x, 1);
    assert_non_null(t);
    t->attr.coll.spec = 0;
    t->attr.coll.dim = op == IR_ALL_TO_ALL ? 0 : 1;
    t->attr.coll.dim2 = 1;
    t->attr.coll.global = 6;
    t->attr.coll.exact = true;
    return t;
}

/* Runs t's kernel (thread 0 of 1) with the counting group as every
 * collective's; the transport's calls it made. */
static int transport_calls_of(const spmd_tensor *t, const kern_device *dev, const values *v)
{
    kern_fn kernel = kern_for(t->op);
    assert_non_null(kernel);
    size_t need = compile_scratch_bytes(t);
    void *scratch = calloc(1, need ? need : 1);
    int64_t n = spmd_tensor_numel(t);
    void *out = calloc((size_t)(n ? n : 1), 4);
    assert_non_null(scratch);
    assert_non_null(out);
    _Atomic int status = SPMD_OK;
    char message[256] = "";
    kern_args a = {.node = t, .out = out, .scratch = scratch, .ith = 0, .nth = 1, .status = &status,
                   .message = message, .message_size = sizeof message, .dev = dev};
    for (int j = 0; j < t->n_in; j++) a.in[j] = v->in[j];
    transport_calls = 0;
    kernel(&a);
    if (status != SPMD_OK) fail_msg("%s: its kernel failed: %s", ir_op_name(t->op), message);
    free(out);
    free(scratch);
    return transport_calls;
}

/* Every op's kind is what its kernel does: a leaf has no kernel; a
 * collective's kernel calls the transport and a compute op's never does;
 * a collective that may fly needs no scratch (it reads only its operand
 * and writes only its result). */
static void test_kind_column_is_the_kernels(void **state)
{
    (void)state;
    coll_world *w = coll_shm_world_create(1, NULL);
    assert_non_null(w);
    coll_group *real = coll_world_group(w, 1, (const int[]){0});
    assert_non_null(real);
    transport = real->ops;
    coll_group counted = *real;
    counted.ops = &counting_ops;
    coll_group *groups[1] = {&counted};
    const int member[1] = {0};
    const mesh_axes specs[1] = {{0}};
    /* A stage transfer's pair of stages (0 to 1, its sample's) is the
     * same one-member group. */
    coll_group *pairs[4] = {&counted, &counted, &counted, &counted};
    const kern_device dev = {.device = 0, .groups = groups, .member = member, .world = w,
                             .specs = specs, .stage = 0, .stages = 2, .pairs = pairs};
    int collectives = 0, computes = 0;
    for (int op = 0; op < IR_OP_COUNT; op++) {
        ir_op o = (ir_op)op;
        if (ir_op_is_leaf(o)) {
            assert_null(kern_for(o));
            continue;
        }
        sample s;
        spmd_graph *g = NULL;
        const spmd_tensor *t;
        values v = {0};
        test_rng r = test_rng_for(29, ir_op_name(o));
        if (new_sample(o, &s)) {
            t = s.out;
            draw(&s, &r, &v);
        } else if (partitioner_only(o) && o != IR_VOCAB_CE_STATS && o != IR_VOCAB_CE_LOSS &&
                   o != IR_VOCAB_CE_BACKWARD) {
            g = spmd_graph_create(NULL);
            spmd_tensor *x;
            t = partitioner_node(g, o, &x);
            s = (sample){.g = g, .n_in = 1, .in = {x}, .kind = {V_ANY}};
            draw(&s, &r, &v);
        } else {
            continue; /* the vocabulary's loss ops: the vocabulary tests */
        }
        int calls = transport_calls_of(t, &dev, &v);
        if (ir_op_is_collective(o) != (calls > 0))
            fail_msg("%s: ops.def's kind column says %s, but its kernel made %d call%s to the "
                     "transport", ir_op_name(o), ir_op_is_collective(o) ? "a collective" : "compute",
                     calls, calls == 1 ? "" : "s");
        if (ir_op_may_fly(o) && compile_scratch_bytes(t))
            fail_msg("%s: may fly (ops.def's kind column) but its kernel takes scratch",
                     ir_op_name(o));
        collectives += ir_op_is_collective(o);
        computes += !ir_op_is_collective(o);
        free_values(&s, &v);
        spmd_graph_free(s.g);
    }
    assert_int_equal(collectives, 5);
    assert_true(computes >= 40);
    coll_world_free(w);
}

/* ---- Scratch: what the kernel uses is what compile gives it ------------------------------------ */

enum { GUARD = 1 << 20, GUARD_BYTE = 0xA5 };

/* Runs the op's kernel on its sample with the scratch its ops.def row
 * sizes, followed by a guard of known bytes: it must leave the guard
 * alone.  (The partitioner's ops have no sample; all_to_all's buffers are
 * checked by the collective tests.) */
static void check_scratch(ir_op op, int *checked)
{
    sample s;
    if (!new_sample(op, &s)) return;
    kern_fn kernel = kern_for(op);
    assert_non_null(kernel);
    test_rng r = test_rng_for(17, ir_op_name(op));
    values v;
    draw(&s, &r, &v);
    size_t need = compile_scratch_bytes(s.out);
    unsigned char *scratch = malloc(need + GUARD);
    assert_non_null(scratch);
    memset(scratch, GUARD_BYTE, need + GUARD);
    int64_t n = spmd_tensor_numel(s.out);
    void *out = calloc((size_t)(n ? n : 1), 4);
    assert_non_null(out);
    _Atomic int status = SPMD_OK;
    char message[256] = "";
    kern_args a = {.node = s.out, .out = out, .scratch = scratch, .ith = 0, .nth = 1,
                   .status = &status, .message = message, .message_size = sizeof message};
    for (int j = 0; j < s.n_in; j++) a.in[j] = v.in[j];
    kernel(&a);
    if (status != SPMD_OK) fail_msg("%s: its kernel failed on its sample: %s", ir_op_name(op), message);
    for (size_t i = need; i < need + GUARD; i++)
        if (scratch[i] != GUARD_BYTE)
            fail_msg("%s: its kernel wrote scratch byte %zu, past the %zu bytes its scratch "
                     "column (ops.def) gives it", ir_op_name(op), i, need);
    free(out);
    free(scratch);
    free_values(&s, &v);
    spmd_graph_free(s.g);
    (*checked)++;
}

static void test_scratch_covers_the_kernel(void **state)
{
    (void)state;
    int checked = 0;
    for (int op = 0; op < IR_OP_COUNT; op++) check_scratch((ir_op)op, &checked);
    assert_true(checked >= 40);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_op_has_rules),
        /* Before any program runs: a kernel short of scratch crashes one. */
        cmocka_unit_test(test_scratch_covers_the_kernel),
        cmocka_unit_test(test_linearity_holds),
        cmocka_unit_test(test_partitioned_equals_one_device),
        cmocka_unit_test(test_fused_formula_is_the_kernels),
        cmocka_unit_test(test_fused_refuses_op_without_formula),
        cmocka_unit_test(test_bf16_column_is_the_kernels),
        cmocka_unit_test(test_kind_column_is_the_kernels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
