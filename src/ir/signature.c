/*
 * Dimension signatures: each op's iteration space, einsum style.  Sharding
 * propagation and partitioning are written once over these, not per op
 * (docs/DESIGN.md, "Dimension signatures").
 *
 * An iteration dimension is PARALLEL (any sharding is exact), SUM (a linear
 * reduction: sharding it leaves a partial sum) or FULL (each device needs it
 * whole: a softmax row, a layernorm row, a concat axis).
 */
#include "ir/ir.h"

#include <stdio.h>
#include <string.h>

static int add_iter(ir_dimsig *s, int64_t size, ir_iter_kind kind, char letter)
{
    int i = s->n_iter++;
    s->size[i] = size;
    s->kind[i] = (uint8_t)kind;
    s->granule[i] = 0; /* any split; attention channels set whole heads */
    s->letter[i] = letter;
    return i;
}

static void init_sig(ir_dimsig *s, const spmd_tensor *t)
{
    memset(s, 0, sizeof *s);
    memset(s->in, -1, sizeof s->in);
    memset(s->out, -1, sizeof s->out);
    s->n_in = t->n_in;
    for (int j = 0; j < t->n_in; j++) s->in_rank[j] = t->in[j]->rank;
    s->out_rank = t->rank;
}

/* Letters for generic dims: a, b, c, ... skipping those an op uses. */
static char generic_letter(int i) { return (char)('a' + i); }

/* Output dims become parallel iterations; return nothing else. */
static bool sig_leaf(const spmd_tensor *t, ir_dimsig *s)
{
    for (int i = 0; i < t->rank; i++) s->out[i] = (int8_t)add_iter(s, t->dims[i], IR_ITER_PARALLEL, generic_letter(i));
    return true;
}

static bool sig_fill(const spmd_tensor *t, ir_dimsig *s) { return sig_leaf(t, s); }

/* numpy broadcasting: an operand's size-1 dim under a larger output dim
 * maps to no iteration (every device reads the same single element). */
static bool sig_broadcast(const spmd_tensor *t, ir_dimsig *s)
{
    sig_leaf(t, s);
    for (int j = 0; j < t->n_in; j++) {
        const spmd_tensor *x = t->in[j];
        for (int i = 0; i < x->rank; i++) {
            int o = t->rank - x->rank + i;
            if (x->dims[i] == t->dims[o]) s->in[j][i] = s->out[o];
        }
    }
    return true;
}

static bool sig_elementwise(const spmd_tensor *t, ir_dimsig *s) { return sig_broadcast(t, s); }

/* Input dims are the iterations; reduced ones are SUM (sum, mean) or FULL
 * (max: not linear). */
static bool sig_reduce(const spmd_tensor *t, ir_dimsig *s)
{
    const spmd_tensor *x = t->in[0];
    uint32_t axes = t->op == IR_MAX ? 1u << t->attr.max.axis : t->attr.reduce.axes;
    bool keepdim = t->op == IR_MAX ? t->attr.max.keepdim : t->attr.reduce.keepdim;
    ir_iter_kind reduced = t->op == IR_MAX ? IR_ITER_FULL : IR_ITER_SUM;
    int o = 0;
    for (int i = 0; i < x->rank; i++) {
        bool r = axes & (1u << i);
        int it = add_iter(s, x->dims[i], r ? reduced : IR_ITER_PARALLEL, generic_letter(i));
        s->in[0][i] = (int8_t)it;
        if (!r) s->out[o++] = (int8_t)it;
        else if (keepdim) o++; /* a kept size-1 dim maps to nothing */
    }
    return true;
}

/* max_backward(x, dy): x's dims, the max axis FULL; dy is x reduced. */
static bool sig_reduce_backward(const spmd_tensor *t, ir_dimsig *s)
{
    const spmd_tensor *x = t->in[0];
    int axis = t->attr.max.axis, o = 0;
    for (int i = 0; i < x->rank; i++) {
        int it = add_iter(s, x->dims[i], i == axis ? IR_ITER_FULL : IR_ITER_PARALLEL,
                          generic_letter(i));
        s->in[0][i] = s->out[i] = (int8_t)it;
        if (i != axis) s->in[1][o++] = (int8_t)it;
        else if (t->attr.max.keepdim) o++;
    }
    return true;
}

/* A scan along one axis (cumsum): that dim FULL, every other parallel;
 * x and y share the layout. */
static bool sig_scan(const spmd_tensor *t, ir_dimsig *s)
{
    int axis = t->attr.cumsum.axis;
    for (int i = 0; i < t->rank; i++) {
        bool scanned = i == axis;
        s->out[i] = s->in[0][i] = (int8_t)add_iter(s, t->dims[i],
                                                    scanned ? IR_ITER_FULL : IR_ITER_PARALLEL,
                                                    scanned ? 's' : generic_letter(i));
    }
    return true;
}

/* Rows over the last dim (softmax, layernorm): the row is FULL; [D]
 * operands (gamma, beta) map to it. */
static bool sig_rowwise(const spmd_tensor *t, ir_dimsig *s)
{
    for (int i = 0; i < t->rank; i++) {
        bool last = i == t->rank - 1;
        s->out[i] = (int8_t)add_iter(s, t->dims[i], last ? IR_ITER_FULL : IR_ITER_PARALLEL,
                                     last ? 'd' : generic_letter(i));
    }
    for (int j = 0; j < t->n_in; j++) {
        const spmd_tensor *x = t->in[j];
        for (int i = 0; i < x->rank; i++) s->in[j][i] = s->out[t->rank - x->rank + i];
    }
    return true;
}

/* How operand j of a batch-norm op is laid out: like x, [C], or [2, C]
 * (batch_norm_sums' output, which batch_norm_backward reads last). */
typedef enum bn_form { BN_LIKE_X, BN_CHANNELS, BN_PAIR } bn_form;

static bn_form bn_operand_form(ir_op op, int j)
{
    if (j == 0) return BN_LIKE_X;
    if (op == IR_BATCH_NORM_SUMS && j == 3) return BN_LIKE_X;      /* dy */
    if (op == IR_BATCH_NORM_BACKWARD && j == 4) return BN_LIKE_X;  /* dy */
    if (op == IR_BATCH_NORM_BACKWARD && j == 5) return BN_PAIR;    /* the sums */
    return BN_CHANNELS;
}

/* Batch normalisation, x [N, C, S...] with the channels on dim 1
 * ("nchw,c->c", "nchw,c,c,c,c->nchw").  The statistics rows
 * (batch_norm_var, batch_norm_sums) sum over every dim but C: a batch
 * split leaves a pending sum, which the partitioner resolves with an
 * all-reduce.  The other rows are elementwise with the [C] operands on
 * the channel iteration.  The [2] of the sums is FULL: the two sums
 * travel together. */
static bool sig_channels(const spmd_tensor *t, ir_dimsig *s)
{
    static const char *const spatial[] = {"", "", "", "l", "hw", "dhw", "tdhw"};
    const spmd_tensor *x = t->in[0];
    bool reduces = t->op == IR_BATCH_NORM_VAR || t->op == IR_BATCH_NORM_SUMS;
    int it[SPMD_MAX_RANK], pair = -1;
    for (int i = 0; i < x->rank; i++) {
        char letter = i == 0 ? 'n' : i == 1 ? 'c' : spatial[x->rank][i - 2];
        ir_iter_kind kind = i == 1 || !reduces ? IR_ITER_PARALLEL : IR_ITER_SUM;
        it[i] = add_iter(s, x->dims[i], kind, letter);
    }
    if (t->op == IR_BATCH_NORM_SUMS || t->op == IR_BATCH_NORM_BACKWARD)
        pair = add_iter(s, 2, IR_ITER_FULL, 's');
    for (int j = 0; j < t->n_in; j++) {
        switch (bn_operand_form(t->op, j)) {
        case BN_LIKE_X:
            for (int i = 0; i < x->rank; i++) s->in[j][i] = (int8_t)it[i];
            break;
        case BN_CHANNELS: s->in[j][0] = (int8_t)it[1]; break;
        case BN_PAIR:
            s->in[j][0] = (int8_t)pair;
            s->in[j][1] = (int8_t)it[1];
            break;
        }
    }
    if (t->op == IR_BATCH_NORM_VAR) {
        s->out[0] = (int8_t)it[1];
    } else if (t->op == IR_BATCH_NORM_SUMS) {
        s->out[0] = (int8_t)pair;
        s->out[1] = (int8_t)it[1];
    } else {
        for (int i = 0; i < x->rank; i++) s->out[i] = (int8_t)it[i];
    }
    return true;
}

static bool sig_matmul(const spmd_tensor *t, ir_dimsig *s)
{
    const spmd_tensor *a = t->in[0], *b = t->in[1];
    bool ta = t->attr.matmul.ta, tb = t->attr.matmul.tb;
    if (!ta) {
        /* a [L..., K] . b [K, N] -> [L..., N]: "btk,kn->btn" */
        static const char lead[] = "bt";
        int r = a->rank;
        for (int i = 0; i < r - 1; i++) {
            char l = r == 2 ? 'm' : (i < 2 && r - 1 <= 2 ? lead[i] : generic_letter(i));
            s->in[0][i] = s->out[i] = (int8_t)add_iter(s, a->dims[i], IR_ITER_PARALLEL, l);
        }
        int k = add_iter(s, a->dims[r - 1], IR_ITER_SUM, 'k');
        int n = add_iter(s, t->dims[r - 1], IR_ITER_PARALLEL, 'n');
        s->in[0][r - 1] = (int8_t)k;
        s->in[1][tb ? 1 : 0] = (int8_t)k;
        s->in[1][tb ? 0 : 1] = (int8_t)n;
        s->out[r - 1] = (int8_t)n;
    } else if (tb) {
        /* a [K, M]^T . b [N, K]^T: "km,nk->mn" */
        int m = add_iter(s, a->dims[1], IR_ITER_PARALLEL, 'm');
        int n = add_iter(s, b->dims[0], IR_ITER_PARALLEL, 'n');
        int k = add_iter(s, a->dims[0], IR_ITER_SUM, 'k');
        s->in[0][0] = (int8_t)k, s->in[0][1] = (int8_t)m;
        s->in[1][0] = (int8_t)n, s->in[1][1] = (int8_t)k;
        s->out[0] = (int8_t)m, s->out[1] = (int8_t)n;
    } else {
        /* a [L..., M]^T . b [L..., N]: the weight-gradient form, "btm,btn->mn" */
        static const char lead[] = "bt";
        int r = a->rank;
        for (int i = 0; i < r - 1; i++) {
            char l = r == 2 ? 'k' : (r - 1 <= 2 ? lead[i] : generic_letter(i));
            s->in[0][i] = s->in[1][i] = (int8_t)add_iter(s, a->dims[i], IR_ITER_SUM, l);
        }
        int m = add_iter(s, a->dims[r - 1], IR_ITER_PARALLEL, 'm');
        int n = add_iter(s, b->dims[r - 1], IR_ITER_PARALLEL, 'n');
        s->in[0][r - 1] = (int8_t)m;
        s->in[1][r - 1] = (int8_t)n;
        s->out[0] = (int8_t)m, s->out[1] = (int8_t)n;
    }
    return true;
}

static bool sig_bmm(const spmd_tensor *t, ir_dimsig *s)
{
    const spmd_tensor *a = t->in[0];
    int r = a->rank;
    bool ta = t->attr.matmul.ta, tb = t->attr.matmul.tb;
    for (int i = 0; i < r - 2; i++)
        s->in[0][i] = s->in[1][i] = s->out[i] =
            (int8_t)add_iter(s, a->dims[i], IR_ITER_PARALLEL, generic_letter(i));
    int m = add_iter(s, t->dims[r - 2], IR_ITER_PARALLEL, 'm');
    int n = add_iter(s, t->dims[r - 1], IR_ITER_PARALLEL, 'n');
    int k = add_iter(s, ta ? a->dims[r - 2] : a->dims[r - 1], IR_ITER_SUM, 'k');
    s->in[0][r - 2] = (int8_t)(ta ? k : m), s->in[0][r - 1] = (int8_t)(ta ? m : k);
    s->in[1][r - 2] = (int8_t)(tb ? n : k), s->in[1][r - 1] = (int8_t)(tb ? k : n);
    s->out[r - 2] = (int8_t)m, s->out[r - 1] = (int8_t)n;
    return true;
}

/* q [b,t,c], k and v [b,s,c] -> [b,t,c]: "btc,bsc,bsc->btc".  Channels
 * shard in whole heads (granule = head_dim).  Query rows are parallel: a
 * device with a block of them attends from it to every key (the causal
 * mask offset by the block, fix_attention), so keys and values are
 * gathered along s, which stays whole.  The backward op,
 * "btc,bsc,bsc,btc->xbsc", stacks dq, dk and dv on x: dk and dv sum over
 * the query rows, so t is SUM there, and dq (one query row per row) takes
 * its rows on s, zero outside the device's block: a query split leaves
 * the three as one pending sum that reduce-scatters onto the operands'
 * split (docs/DESIGN.md, "Sequence-split attention"). */
static bool sig_attention(const spmd_tensor *t, ir_dimsig *s)
{
    const spmd_tensor *q = t->in[0];
    bool backward = t->op == IR_ATTENTION_BACKWARD;
    int stack = backward ? add_iter(s, 3, IR_ITER_FULL, 'x') : -1;
    int b = add_iter(s, q->dims[0], IR_ITER_PARALLEL, 'b');
    int tq = add_iter(s, q->dims[1], backward ? IR_ITER_SUM : IR_ITER_PARALLEL, 't');
    int ts = add_iter(s, t->in[1]->dims[1], IR_ITER_FULL, 's');
    int c = add_iter(s, q->dims[2], IR_ITER_PARALLEL, 'c');
    s->granule[c] = q->dims[2] / t->attr.attention.heads;
    int8_t qmap[3] = {(int8_t)b, (int8_t)tq, (int8_t)c};
    int8_t kvmap[3] = {(int8_t)b, (int8_t)ts, (int8_t)c};
    memcpy(s->in[0], qmap, 3);
    memcpy(s->in[1], kvmap, 3);
    memcpy(s->in[2], kvmap, 3);
    if (!backward) {
        memcpy(s->out, qmap, 3);
    } else {
        memcpy(s->in[3], qmap, 3);
        s->out[0] = (int8_t)stack;
        memcpy(s->out + 1, kvmap, 3);
    }
    return true;
}

/* conv2d and its backward ops over x [n,c,h,w], w [k,c,r,s] and y
 * [n,k,p,q] (cuDNN's letters), whichever operand or output holds each
 * (ir_conv_roles_of): "nchw,kcrs->nkpq" forward, "nkpq,kcrs->nchw" for
 * dx and "nchw,nkpq->kcrs" for dw.  The batch is parallel but summed in
 * dw; the input channels are summed in y, the output channels in dx.  Rows
 * and columns are FULL: a device convolves whole images (no halo
 * exchange), so a spatial split is gathered.  With groups, channel o of y
 * reads the input channels of its group alone: where Cin = Cout the
 * channels of x, y and w's rows are one parallel iteration split in whole
 * groups (granule Cin / groups; any split when that is 1, depthwise), and
 * w's per-group channels "g" are FULL; otherwise every channel dim is FULL
 * and only the batch splits. */
static bool sig_conv2d(const spmd_tensor *t, ir_dimsig *s)
{
    ir_conv_roles role = ir_conv_roles_of(t->op);
    const int64_t *x = ir_conv_dims(t, role.x), *w = ir_conv_dims(t, role.w),
                  *y = ir_conv_dims(t, role.y);
    bool dw = t->op == IR_CONV2D_BACKWARD_WEIGHT, dx = t->op == IR_CONV2D_BACKWARD_INPUT;
    int groups = t->attr.conv.groups;
    int n = add_iter(s, x[0], dw ? IR_ITER_SUM : IR_ITER_PARALLEL, 'n');
    int c, k, wc;
    if (groups == 1) {
        c = add_iter(s, x[1], dx || dw ? IR_ITER_PARALLEL : IR_ITER_SUM, 'c');
        k = add_iter(s, w[0], dx ? IR_ITER_SUM : IR_ITER_PARALLEL, 'k');
        wc = c;
    } else if (x[1] == w[0]) {
        c = k = add_iter(s, x[1], IR_ITER_PARALLEL, 'c');
        if (w[1] > 1) s->granule[c] = w[1];
        wc = add_iter(s, w[1], IR_ITER_FULL, 'g');
    } else {
        c = add_iter(s, x[1], IR_ITER_FULL, 'c');
        k = add_iter(s, w[0], IR_ITER_FULL, 'k');
        wc = add_iter(s, w[1], IR_ITER_FULL, 'g');
    }
    int h = add_iter(s, x[2], IR_ITER_FULL, 'h'), ww = add_iter(s, x[3], IR_ITER_FULL, 'w');
    int r = add_iter(s, w[2], IR_ITER_FULL, 'r'), ss = add_iter(s, w[3], IR_ITER_FULL, 's');
    int p = add_iter(s, y[2], IR_ITER_FULL, 'p'), q = add_iter(s, y[3], IR_ITER_FULL, 'q');
    const int8_t xmap[4] = {(int8_t)n, (int8_t)c, (int8_t)h, (int8_t)ww};
    const int8_t wmap[4] = {(int8_t)k, (int8_t)wc, (int8_t)r, (int8_t)ss};
    const int8_t ymap[4] = {(int8_t)n, (int8_t)k, (int8_t)p, (int8_t)q};
    memcpy(role.x < 0 ? s->out : s->in[role.x], xmap, 4);
    memcpy(role.w < 0 ? s->out : s->in[role.w], wmap, 4);
    memcpy(role.y < 0 ? s->out : s->in[role.y], ymap, 4);
    return true;
}

/* cache_write(cache [b,s,c], rows [b,t,c], pos [1]) -> [b,s,c]: the
 * position is global, so the cache rows s and the new rows t stay whole;
 * pos maps to no iteration (every device reads the same scalar). */
static bool sig_cache_write(const spmd_tensor *t, ir_dimsig *s)
{
    const spmd_tensor *rows = t->in[1];
    int b = add_iter(s, t->dims[0], IR_ITER_PARALLEL, 'b');
    int ts = add_iter(s, t->dims[1], IR_ITER_FULL, 's');
    int tt = add_iter(s, rows->dims[1], IR_ITER_FULL, 't');
    int c = add_iter(s, t->dims[2], IR_ITER_PARALLEL, 'c');
    int8_t cache_map[3] = {(int8_t)b, (int8_t)ts, (int8_t)c};
    int8_t rows_map[3] = {(int8_t)b, (int8_t)tt, (int8_t)c};
    memcpy(s->in[0], cache_map, 3);
    memcpy(s->in[1], rows_map, 3);
    memcpy(s->out, cache_map, 3);
    return true;
}

/* cached_attention(q [b,t,c], k and v [b,s,c], pos [1]) -> [b,t,c]:
 * "btc,bsc,bsc,1->btc", attention's form with the position as a scalar
 * every device reads whole.  Channels shard in whole heads. */
static bool sig_cached_attention(const spmd_tensor *t, ir_dimsig *s)
{
    const spmd_tensor *q = t->in[0], *k = t->in[1];
    int b = add_iter(s, q->dims[0], IR_ITER_PARALLEL, 'b');
    int tq = add_iter(s, q->dims[1], IR_ITER_FULL, 't');
    int ts = add_iter(s, k->dims[1], IR_ITER_FULL, 's');
    int c = add_iter(s, q->dims[2], IR_ITER_PARALLEL, 'c');
    s->granule[c] = q->dims[2] / t->attr.attention.heads;
    int8_t qmap[3] = {(int8_t)b, (int8_t)tq, (int8_t)c};
    int8_t kvmap[3] = {(int8_t)b, (int8_t)ts, (int8_t)c};
    memcpy(s->in[0], qmap, 3);
    memcpy(s->in[1], kvmap, 3);
    memcpy(s->in[2], kvmap, 3);
    memcpy(s->out, qmap, 3);
    return true;
}

/* embedding: table [v,d], ids [i...] -> [i..., d].  The lookup is the
 * contraction one_hot(ids) @ table over v, so v is SUM: a table split over
 * the vocabulary gives each device the rows of its block (zeros for other
 * ids) and a pending sum over the vocabulary's axes (fix_vocab_rows tells
 * the kernel its block).  The backward scatter-add is the transpose: it
 * sums over the ids dims and v is an output dim, so a gradient split over
 * the vocabulary holds only its block's rows. */
static bool sig_embedding(const spmd_tensor *t, ir_dimsig *s)
{
    bool fwd = t->op == IR_EMBEDDING;
    const spmd_tensor *ids = fwd ? t->in[1] : t->in[0];
    int64_t rows = fwd ? t->in[0]->dims[0] : t->attr.embed.rows;
    int64_t width = t->dims[t->rank - 1];
    int v = add_iter(s, rows, fwd ? IR_ITER_SUM : IR_ITER_PARALLEL, 'v');
    int d = add_iter(s, width, IR_ITER_PARALLEL, 'd');
    int idx[SPMD_MAX_RANK];
    for (int i = 0; i < ids->rank; i++)
        idx[i] = add_iter(s, ids->dims[i], fwd ? IR_ITER_PARALLEL : IR_ITER_SUM, generic_letter(i));
    if (fwd) {
        s->in[0][0] = (int8_t)v, s->in[0][1] = (int8_t)d;
        for (int i = 0; i < ids->rank; i++) s->in[1][i] = s->out[i] = (int8_t)idx[i];
        s->out[ids->rank] = (int8_t)d;
    } else {
        for (int i = 0; i < ids->rank; i++) s->in[0][i] = s->in[1][i] = (int8_t)idx[i];
        s->in[1][ids->rank] = (int8_t)d;
        s->out[0] = (int8_t)v, s->out[1] = (int8_t)d;
    }
    return true;
}

/* logits [n..., v], targets [n...] -> scalar: the mean over n is linear
 * (SUM); the backward keeps n parallel.  v may be split: the partitioner
 * lowers a split softmax into per-block statistics, an all-gather of them
 * and a combination (fix_loss_rows), so no device holds whole rows; the
 * loss is then the same on every block, the gradient split like the
 * logits. */
static bool sig_cross_entropy(const spmd_tensor *t, ir_dimsig *s)
{
    bool fwd = t->op == IR_CROSS_ENTROPY;
    const spmd_tensor *logits = t->in[0];
    int r = logits->rank;
    for (int i = 0; i < r - 1; i++) {
        int it = add_iter(s, logits->dims[i], fwd ? IR_ITER_SUM : IR_ITER_PARALLEL,
                          r == 2 ? 'n' : generic_letter(i));
        s->in[0][i] = s->in[1][i] = (int8_t)it;
        if (!fwd) s->out[i] = (int8_t)it;
    }
    int v = add_iter(s, logits->dims[r - 1], IR_ITER_PARALLEL, 'v');
    s->in[0][r - 1] = (int8_t)v;
    if (!fwd) s->out[r - 1] = (int8_t)v;
    return true;
}

/* mse(a, b) -> scalar: every dim is summed. */
static bool sig_mse(const spmd_tensor *t, ir_dimsig *s)
{
    const spmd_tensor *a = t->in[0];
    for (int i = 0; i < a->rank; i++)
        s->in[0][i] = s->in[1][i] = (int8_t)add_iter(s, a->dims[i], IR_ITER_SUM, generic_letter(i));
    return true;
}

/* Pooling over the last two dims: x [n, c, h, w] (or [c, h, w]) and the
 * pooled [n, c, i, j].  A window reads neighbouring rows and columns, so
 * h, w, i and j stay whole (a spatial split is gathered); each (n, c)
 * plane pools alone, so the leading dims are parallel.  Operands and
 * result map to these by their role: the forward reads x and makes the
 * pooled; the backward makes x's gradient from the pooled gradient, its
 * last operand, and (max) from x before it. */
typedef struct pool_iters {
    int lead[2], h, w, i, j, n_lead;
} pool_iters;

static pool_iters pool_iters_make(ir_dimsig *s, const spmd_tensor *x, const spmd_tensor *pooled)
{
    pool_iters p;
    p.n_lead = x->rank - 2;
    for (int d = 0; d < p.n_lead; d++)
        p.lead[d] = add_iter(s, x->dims[d], IR_ITER_PARALLEL, "nc"[d + 2 - p.n_lead]);
    p.h = add_iter(s, x->dims[x->rank - 2], IR_ITER_FULL, 'h');
    p.w = add_iter(s, x->dims[x->rank - 1], IR_ITER_FULL, 'w');
    p.i = add_iter(s, pooled->dims[pooled->rank - 2], IR_ITER_FULL, 'i');
    p.j = add_iter(s, pooled->dims[pooled->rank - 1], IR_ITER_FULL, 'j');
    return p;
}

static void pool_map(const pool_iters *p, int8_t *map, bool pooled)
{
    for (int d = 0; d < p->n_lead; d++) map[d] = (int8_t)p->lead[d];
    map[p->n_lead] = (int8_t)(pooled ? p->i : p->h);
    map[p->n_lead + 1] = (int8_t)(pooled ? p->j : p->w);
}

/* "nchw->ncij" */
static bool sig_pool(const spmd_tensor *t, ir_dimsig *s)
{
    pool_iters p = pool_iters_make(s, t->in[0], t);
    pool_map(&p, s->in[0], false);
    pool_map(&p, s->out, true);
    return true;
}

/* "nchw,ncij->nchw" (max), "ncij->nchw" (average) */
static bool sig_pool_backward(const spmd_tensor *t, ir_dimsig *s)
{
    pool_iters p = pool_iters_make(s, t, t->in[t->n_in - 1]);
    for (int k = 0; k < t->n_in; k++) pool_map(&p, s->in[k], k == t->n_in - 1);
    pool_map(&p, s->out, false);
    return true;
}

/* Reshape moves data between dims: no einsum form, an explicit rule. */
static bool sig_reshape(const spmd_tensor *t, ir_dimsig *s)
{
    (void)t, (void)s;
    return false;
}

static bool sig_permute(const spmd_tensor *t, ir_dimsig *s)
{
    const spmd_tensor *x = t->in[0];
    int it[SPMD_MAX_RANK];
    for (int i = 0; i < x->rank; i++) {
        it[i] = add_iter(s, x->dims[i], IR_ITER_PARALLEL, generic_letter(i));
        s->in[0][i] = (int8_t)it[i];
    }
    for (int i = 0; i < t->rank; i++) s->out[i] = (int8_t)it[t->attr.permute.perm[i]];
    return true;
}

/* slice and pad: the cut axis is FULL (sized like the larger side), the
 * other dims parallel. */
static bool sig_slice(const spmd_tensor *t, ir_dimsig *s)
{
    const spmd_tensor *x = t->in[0];
    int axis = t->op == IR_SLICE ? t->attr.slice.axis : t->attr.pad.axis;
    for (int i = 0; i < t->rank; i++) {
        bool cut = i == axis;
        int64_t size = cut && x->dims[i] > t->dims[i] ? x->dims[i] : t->dims[i];
        s->in[0][i] = s->out[i] =
            (int8_t)add_iter(s, size, cut ? IR_ITER_FULL : IR_ITER_PARALLEL, generic_letter(i));
    }
    return true;
}

static bool sig_concat(const spmd_tensor *t, ir_dimsig *s)
{
    int axis = t->attr.concat.axis;
    for (int i = 0; i < t->rank; i++) {
        int it = add_iter(s, t->dims[i], i == axis ? IR_ITER_FULL : IR_ITER_PARALLEL,
                          generic_letter(i));
        s->out[i] = (int8_t)it;
        for (int j = 0; j < t->n_in; j++) s->in[j][i] = (int8_t)it;
    }
    return true;
}

/* Per-device ops exist only after partitioning, where no propagation
 * runs: each output dim is its own parallel iteration. */
static bool sig_local(const spmd_tensor *t, ir_dimsig *s) { return sig_leaf(t, s); }

/* ---- Table --------------------------------------------------------------------- */

typedef bool (*sig_fn)(const spmd_tensor *t, ir_dimsig *s);

static const sig_fn sig_table[] = {
#define OP(e, name, arity, sig, lin, fix, vjp, kern, groups, formula, scratch, kind, bf16) sig,
#include "ir/ops.def"
#undef OP
};

_Static_assert(sizeof sig_table / sizeof sig_table[0] == IR_OP_COUNT, "op table out of step");

static const ir_linearity linearity_table[] = {
#define OP(e, name, arity, sig, lin, fix, vjp, kern, groups, formula, scratch, kind, bf16) lin,
#include "ir/ops.def"
#undef OP
};

_Static_assert(sizeof linearity_table / sizeof linearity_table[0] == IR_OP_COUNT,
               "linearity table out of step with ops.def");

ir_linearity ir_op_linearity(ir_op op)
{
    return (unsigned)op < IR_OP_COUNT ? linearity_table[op] : LIN_NONE;
}

bool ir_signature(const spmd_tensor *t, ir_dimsig *sig)
{
    init_sig(sig, t);
    return sig_table[t->op](t, sig);
}

/* A dim that maps to no iteration (a broadcast or kept size-1 dim) is '1'. */
static char letter_of(const ir_dimsig *sig, int8_t it) { return it < 0 ? '1' : sig->letter[it]; }

void ir_signature_format(const ir_dimsig *sig, char *buf, size_t size)
{
    size_t n = 0;
#define PUT(c) \
    do { \
        if (n + 1 < size) buf[n++] = (c); \
    } while (0)
    for (int j = 0; j < sig->n_in; j++) {
        if (j) PUT(',');
        for (int i = 0; i < sig->in_rank[j]; i++) PUT(letter_of(sig, sig->in[j][i]));
    }
    PUT('-');
    PUT('>');
    for (int i = 0; i < sig->out_rank; i++) PUT(letter_of(sig, sig->out[i]));
#undef PUT
    buf[n < size ? n : size - 1] = '\0';
}
