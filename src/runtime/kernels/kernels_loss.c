/*
 * Lookups and losses: embedding and its backward, cross-entropy and its
 * backward, mean squared error.
 *
 * Bad ids and targets are reported by thread 0 only, after a scan of all
 * of them in index order, so the message names the first bad item whatever
 * nth is.  Every thread just skips the bad items in its own part.
 *
 * The scalar losses are reduced by thread 0 alone, in double, so that they
 * are bitwise the same for any nth: a kernel call has no barrier inside
 * it, so threads cannot combine partial sums.
 */
#include "runtime/kernels/kernels_ops.h"

#include <math.h>
#include <string.h>

/* On thread 0: the position of the first id outside [0, limit), or -1
 * (always -1 on other threads, which must not report). */
static int64_t first_bad_id(const kern_args *a, const int32_t *ids, int64_t n, int64_t limit)
{
    if (a->ith != 0) return -1;
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= limit) return i;
    return -1;
}

static void check_targets(const kern_args *a, const int32_t *targets, int64_t rows, int64_t v)
{
    int64_t bad = first_bad_id(a, targets, rows, v);
    if (bad >= 0)
        kern_fail(a, SPMD_ERR_INVALID,
                  "cross_entropy: target %d at position %lld is outside the %lld classes",
                  (int)targets[bad], (long long)bad, (long long)v);
}

/* ---- embedding ---------------------------------------------------------------- */

/* The rows of a table (or its gradient) this device holds: the first one's
 * global index, and the whole vocabulary the ids are checked against.  A
 * table split over the vocabulary holds block `member` of `local` rows
 * (fix_vocab_rows); a whole one starts at 0. */
static void table_block(const kern_args *a, int64_t local, int64_t *offset, int64_t *vocab)
{
    const spmd_tensor *t = a->node;
    *offset = 0;
    *vocab = local;
    if (!t->attr.embed.global) return;
    *vocab = t->attr.embed.global;
    if (a->dev) *offset = (int64_t)a->dev->member[t->attr.embed.spec] * local;
}

/* (table [V, D], ids i32 [...]) -> out [..., D]; a bad id leaves its row
 * zero.  Over a table split on the vocabulary an id outside this device's
 * block also gives zeros: the output is one addend of a pending sum over
 * the blocks. */
void kern_embedding(const kern_args *a)
{
    const spmd_tensor *t = a->node;
    const spmd_tensor *tab = t->in[0];
    const int64_t L = tab->dims[0], D = tab->dims[1];
    const int64_t n = kn_numel(t->in[1]);
    const int32_t *ids = a->in[1];
    const float *table = a->in[0];
    float *out = a->out;
    int64_t offset, V;
    table_block(a, L, &offset, &V);
    int64_t bad = first_bad_id(a, ids, n, V);
    if (bad >= 0)
        kern_fail(a, SPMD_ERR_INVALID,
                  "embedding: id %d at position %lld is outside the table's %lld rows",
                  (int)ids[bad], (long long)bad, (long long)V);
    int64_t b, e;
    kern_split(n, a->ith, a->nth, 1, &b, &e);
    for (int64_t i = b; i < e; i++) {
        int64_t id = ids[i], row = id - offset;
        if (id >= 0 && id < V && row >= 0 && row < L)
            memcpy(out + i * D, table + row * D, (size_t)D * sizeof *out);
        else
            memset(out + i * D, 0, (size_t)D * sizeof *out);
    }
}

/* (ids i32 [...], dout [..., D]) -> dtable [rows, D], dout rows added at
 * their ids.  Threads own disjoint rows of dtable and each scans all ids
 * in index order, so a row's sum has the same order for any nth.  A
 * gradient split over the vocabulary takes only the ids of its block; its
 * padding rows stay zero. */
void kern_embedding_backward(const kern_args *a)
{
    const spmd_tensor *t = a->node;
    const int64_t L = t->dims[0], D = t->dims[1];
    const int64_t n = kn_numel(t->in[0]);
    const int32_t *ids = a->in[0];
    const float *dout = a->in[1];
    float *dtab = a->out;
    int64_t offset, V;
    table_block(a, L, &offset, &V);
    int64_t bad = first_bad_id(a, ids, n, V);
    if (bad >= 0)
        kern_fail(a, SPMD_ERR_INVALID,
                  "embedding_backward: id %d at position %lld is outside the gradient's "
                  "%lld rows",
                  (int)ids[bad], (long long)bad, (long long)V);
    int64_t r0, r1;
    kern_split(L, a->ith, a->nth, 1, &r0, &r1);
    if (r0 == r1) return;
    memset(dtab + r0 * D, 0, (size_t)((r1 - r0) * D) * sizeof *dtab);
    for (int64_t i = 0; i < n; i++) {
        int64_t id = ids[i], row = id - offset;
        if (id < 0 || id >= V || row < r0 || row >= r1) continue;
        float *restrict dst = dtab + row * D;
        const float *restrict src = dout + i * D;
        for (int64_t j = 0; j < D; j++) dst[j] += src[j];
    }
}

/* ---- cross-entropy -------------------------------------------------------------- */

/* The max of one row of v columns and the sum of exp(x - max) over it,
 * in double; an empty row (a block of padding only) has max -inf and sum
 * 0. */
static void row_max_sumexp(const float *restrict x, int64_t v, float *max, double *sum)
{
    *max = -INFINITY;
    *sum = 0.0;
    if (v <= 0) return;
    float m = kn_max(x, v);
    double acc[KN_LANES] = {0};
    int64_t i = 0;
    for (; i + KN_LANES <= v; i += KN_LANES)
        for (int l = 0; l < KN_LANES; l++) acc[l] += (double)kn_expf(x[i + l] - m);
    for (int l = 0; i < v; i++, l++) acc[l] += (double)kn_expf(x[i] - m);
    *max = m;
    *sum = kn_lanes_total(acc);
}

/* log(sum exp(x)) of one row, max subtracted first; the sum in double. */
static double row_logsumexp(const float *restrict x, int64_t v)
{
    float m;
    double s;
    row_max_sumexp(x, v, &m, &s);
    return (double)m + log(s);
}

/* Rows and classes of logits [..., V]; the rows are the targets. */
static void ce_view(const spmd_tensor *logits, const spmd_tensor *targets, int64_t *rows,
                    int64_t *v)
{
    *v = logits->rank > 0 ? logits->dims[logits->rank - 1] : 1;
    *rows = kn_numel(targets);
}

/* (logits [..., V], targets i32 [...]) -> scalar mean over targets of
 * -log_softmax(logits)[target].  A bad target is reported and its row
 * left out of the sum (the mean still divides by all rows). */
/* Is row r (row-major over the targets' dims) padding of a dimension a
 * partitioned program split unevenly?  Its global index along that dim is
 * the device's block times the block size plus the local index. */
static bool row_is_padding(const kern_args *a, int64_t r)
{
    const spmd_tensor *targets = a->node->in[1];
    const int64_t *global = a->node->attr.rows.global;
    for (int d = targets->rank - 1; d >= 0; d--) {
        int64_t local = targets->dims[d], i = r % local;
        r /= local;
        if (global[d] && a->dev &&
            (int64_t)a->dev->member[a->node->attr.rows.spec[d]] * local + i >= global[d])
            return true;
    }
    return false;
}

static bool any_padding(const kern_args *a)
{
    for (int d = 0; d < a->node->in[1]->rank; d++)
        if (a->node->attr.rows.global[d]) return true;
    return false;
}

void kern_cross_entropy(const kern_args *a)
{
    if (a->ith != 0) return;
    const spmd_tensor *t = a->node;
    int64_t rows, v;
    ce_view(t->in[0], t->in[1], &rows, &v);
    const float *logits = a->in[0];
    const int32_t *targets = a->in[1];
    check_targets(a, targets, rows, v);
    double total = 0.0;
    bool padded = any_padding(a);
    for (int64_t r = 0; r < rows; r++) {
        int32_t tg = targets[r];
        if (tg < 0 || tg >= v || (padded && row_is_padding(a, r))) continue;
        const float *x = logits + r * v;
        total += row_logsumexp(x, v) - (double)x[tg];
    }
    *(float *)a->out = (float)(total / (double)rows);
}

/* (logits [..., V], targets i32 [...], dloss scalar) -> dlogits [..., V]
 *   = (softmax(logits) - onehot(target)) * dloss / rows;
 * rows with a bad target, or padding, get zero, matching their absence
 * from the loss. */
void kern_cross_entropy_backward(const kern_args *a)
{
    const spmd_tensor *t = a->node;
    int64_t rows, v;
    ce_view(t->in[0], t->in[1], &rows, &v);
    const float *logits = a->in[0];
    const int32_t *targets = a->in[1];
    const float g = (float)((double)*(const float *)a->in[2] / (double)rows);
    float *dl = a->out;
    check_targets(a, targets, rows, v);
    int64_t b, e;
    kern_split(rows, a->ith, a->nth, 1, &b, &e);
    bool padded = any_padding(a);
    for (int64_t r = b; r < e; r++) {
        float *restrict y = dl + r * v;
        int32_t tg = targets[r];
        if (tg < 0 || tg >= v || (padded && row_is_padding(a, r))) {
            memset(y, 0, (size_t)v * sizeof *y);
            continue;
        }
        kn_softmax_row(logits + r * v, y, v);
        y[tg] -= 1.0f;
        for (int64_t i = 0; i < v; i++) y[i] *= g;
    }
}

/* ---- cross-entropy over logits split on the vocabulary -------------------------- */

/* The columns of logits [.., local] this device holds: the first one's
 * global index, how many are real (the last blocks are padded) and the
 * whole vocabulary (fix_loss_rows records its group and size). */
static void vocab_block(const kern_args *a, int64_t local, int64_t *offset, int64_t *valid,
                        int64_t *vocab)
{
    const spmd_tensor *t = a->node;
    *offset = 0;
    *vocab = t->attr.rows.vocab ? t->attr.rows.vocab : local;
    if (t->attr.rows.vocab && a->dev) *offset = (int64_t)a->dev->member[t->attr.rows.vocab_spec] * local;
    int64_t n = *vocab - *offset;
    *valid = n < 0 ? 0 : n > local ? local : n;
}

/* One row's statistics from every block, combined in block order: the
 * global max, the sum of exp(x - max) over the whole row and the target's
 * logit (only its block gives a nonzero one). */
static void combine_stats(const float *restrict st, int64_t blocks, double *max, double *sum,
                          double *target)
{
    float m = -INFINITY;
    for (int64_t j = 0; j < blocks; j++)
        if (st[3 * j + 1] > 0.0f && st[3 * j] > m) m = st[3 * j];
    double s = 0.0, tl = 0.0;
    for (int64_t j = 0; j < blocks; j++) {
        if (st[3 * j + 1] > 0.0f) s += (double)st[3 * j + 1] * exp((double)st[3 * j] - (double)m);
        tl += (double)st[3 * j + 2];
    }
    *max = (double)m;
    *sum = s;
    *target = tl;
}

/* (logits [.., Vb], targets i32 [..]) -> [.., 3]: per row the max over
 * this block's real columns, the sum of exp(x - max) over them and the
 * target's logit if the target falls in this block, else 0.  Targets are
 * checked against the whole vocabulary. */
void kern_vocab_ce_stats(const kern_args *a)
{
    const spmd_tensor *t = a->node, *logits = t->in[0];
    const int64_t rows = kn_numel(t->in[1]), vb = logits->dims[logits->rank - 1];
    const float *x = a->in[0];
    const int32_t *targets = a->in[1];
    float *out = a->out;
    int64_t offset, valid, V;
    vocab_block(a, vb, &offset, &valid, &V);
    check_targets(a, targets, rows, V);
    int64_t b, e;
    kern_split(rows, a->ith, a->nth, 1, &b, &e);
    for (int64_t r = b; r < e; r++) {
        const float *row = x + r * vb;
        float m;
        double s;
        row_max_sumexp(row, valid, &m, &s);
        int64_t col = (int64_t)targets[r] - offset;
        out[3 * r] = m;
        out[3 * r + 1] = (float)s;
        out[3 * r + 2] = col >= 0 && col < valid ? row[col] : 0.0f;
    }
}

/* (stats [.., 3 * blocks], targets i32 [..]) -> scalar mean over the rows
 * of log(sum exp) - target logit; bad targets and padding rows count for
 * nothing, as in kern_cross_entropy.  Thread 0 alone, in double. */
void kern_vocab_ce_loss(const kern_args *a)
{
    if (a->ith != 0) return;
    const spmd_tensor *t = a->node, *stats = t->in[0];
    const int64_t rows = kn_numel(t->in[1]);
    const int64_t width = stats->dims[stats->rank - 1], blocks = width / 3;
    const float *st = a->in[0];
    const int32_t *targets = a->in[1];
    const int64_t V = t->attr.rows.vocab;
    bool padded = any_padding(a);
    double total = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        int32_t tg = targets[r];
        if (tg < 0 || tg >= V || (padded && row_is_padding(a, r))) continue;
        double m, s, tl;
        combine_stats(st + r * width, blocks, &m, &s, &tl);
        total += m + log(s) - tl;
    }
    *(float *)a->out = (float)(total / (double)rows);
}

/* (logits [.., Vb], targets i32 [..], stats [.., 3 * blocks], dloss) ->
 * this block of dlogits = (softmax - onehot(target)) * dloss / rows, the
 * softmax from the combined statistics; padding columns, padding rows
 * and rows with a bad target get zeros. */
void kern_vocab_ce_backward(const kern_args *a)
{
    const spmd_tensor *t = a->node, *logits = t->in[0], *stats = t->in[2];
    const int64_t rows = kn_numel(t->in[1]), vb = logits->dims[logits->rank - 1];
    const int64_t width = stats->dims[stats->rank - 1], blocks = width / 3;
    const float *x = a->in[0];
    const int32_t *targets = a->in[1];
    const float *st = a->in[2];
    const float g = (float)((double)*(const float *)a->in[3] / (double)rows);
    float *dl = a->out;
    int64_t offset, valid, V;
    vocab_block(a, vb, &offset, &valid, &V);
    bool padded = any_padding(a);
    int64_t b, e;
    kern_split(rows, a->ith, a->nth, 1, &b, &e);
    for (int64_t r = b; r < e; r++) {
        float *restrict y = dl + r * vb;
        int32_t tg = targets[r];
        if (tg < 0 || tg >= V || (padded && row_is_padding(a, r))) {
            memset(y, 0, (size_t)vb * sizeof *y);
            continue;
        }
        double m, s, tl;
        combine_stats(st + r * width, blocks, &m, &s, &tl);
        const float *restrict row = x + r * vb;
        const float mf = (float)m, inv = (float)(1.0 / s);
        for (int64_t c = 0; c < valid; c++) y[c] = kn_expf(row[c] - mf) * inv;
        int64_t col = (int64_t)tg - offset;
        if (col >= 0 && col < valid) y[col] -= 1.0f;
        for (int64_t c = 0; c < valid; c++) y[c] *= g;
        memset(y + valid, 0, (size_t)(vb - valid) * sizeof *y);
    }
}

/* ---- mse -------------------------------------------------------------------------- */

/* (a [..], b [..]) -> scalar mean((a - b)^2). */
void kern_mse(const kern_args *a)
{
    if (a->ith != 0) return;
    const int64_t n = kn_numel(a->node->in[0]);
    const float *restrict x = a->in[0];
    const float *restrict y = a->in[1];
    double acc[KN_LANES] = {0};
    int64_t i = 0;
    for (; i + KN_LANES <= n; i += KN_LANES)
        for (int l = 0; l < KN_LANES; l++) {
            double d = (double)x[i + l] - (double)y[i + l];
            acc[l] += d * d;
        }
    for (int l = 0; i < n; i++, l++) {
        double d = (double)x[i] - (double)y[i];
        acc[l] += d * d;
    }
    *(float *)a->out = (float)(kn_lanes_total(acc) / (double)n);
}
