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
#include "runtime/kernels_ops.h"

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

/* (table [V, D], ids i32 [...]) -> out [..., D]; a bad id leaves its row
 * zero. */
void kern_embedding(const kern_args *a)
{
    const spmd_tensor *t = a->node;
    const spmd_tensor *tab = t->in[0];
    const int64_t V = tab->dims[0], D = tab->dims[1];
    const int64_t n = kn_numel(t->in[1]);
    const int32_t *ids = a->in[1];
    const float *table = a->in[0];
    float *out = a->out;
    int64_t bad = first_bad_id(a, ids, n, V);
    if (bad >= 0)
        kern_fail(a, SPMD_ERR_INVALID,
                  "embedding: id %d at position %lld is outside the table's %lld rows",
                  (int)ids[bad], (long long)bad, (long long)V);
    int64_t b, e;
    kern_split(n, a->ith, a->nth, 1, &b, &e);
    for (int64_t i = b; i < e; i++) {
        int32_t id = ids[i];
        if (id >= 0 && id < V)
            memcpy(out + i * D, table + (int64_t)id * D, (size_t)D * sizeof *out);
        else
            memset(out + i * D, 0, (size_t)D * sizeof *out);
    }
}

/* (ids i32 [...], dout [..., D]) -> dtable [rows, D], dout rows added at
 * their ids.  Threads own disjoint rows of dtable and each scans all ids
 * in index order, so a row's sum has the same order for any nth. */
void kern_embedding_backward(const kern_args *a)
{
    const spmd_tensor *t = a->node;
    const int64_t V = t->dims[0], D = t->dims[1];
    const int64_t n = kn_numel(t->in[0]);
    const int32_t *ids = a->in[0];
    const float *dout = a->in[1];
    float *dtab = a->out;
    int64_t bad = first_bad_id(a, ids, n, V);
    if (bad >= 0)
        kern_fail(a, SPMD_ERR_INVALID,
                  "embedding_backward: id %d at position %lld is outside the gradient's "
                  "%lld rows",
                  (int)ids[bad], (long long)bad, (long long)V);
    int64_t r0, r1;
    kern_split(V, a->ith, a->nth, 1, &r0, &r1);
    if (r0 == r1) return;
    memset(dtab + r0 * D, 0, (size_t)((r1 - r0) * D) * sizeof *dtab);
    for (int64_t i = 0; i < n; i++) {
        int64_t id = ids[i];
        if (id < r0 || id >= r1) continue;
        float *restrict dst = dtab + id * D;
        const float *restrict src = dout + i * D;
        for (int64_t j = 0; j < D; j++) dst[j] += src[j];
    }
}

/* ---- cross-entropy -------------------------------------------------------------- */

/* log(sum exp(x)) of one row, max subtracted first; the sum in double. */
static double row_logsumexp(const float *restrict x, int64_t v)
{
    float m = kn_max(x, v);
    double acc[KN_LANES] = {0};
    int64_t i = 0;
    for (; i + KN_LANES <= v; i += KN_LANES)
        for (int l = 0; l < KN_LANES; l++) acc[l] += (double)kn_expf(x[i + l] - m);
    for (int l = 0; i < v; i++, l++) acc[l] += (double)kn_expf(x[i] - m);
    return (double)m + log(kn_lanes_total(acc));
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
