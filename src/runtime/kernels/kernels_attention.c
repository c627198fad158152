/*
 * Causal multi-head self-attention, forward and backward, without storing
 * the T x T probabilities between them: the backward pass recomputes them.
 *
 * Head h of q [B, T, C] and of k, v [B, S, C] is the strided view [T, D]
 * (or [S, D]) at channel h*D with row stride C, so every product is a
 * gemm_f32 on views and no head is ever copied out.  Query rows go in
 * blocks of KN_ATTN_BLOCK: a block [t0, t1) only needs keys [0, t1),
 * which skips most of the masked half of the scores, and bounds the
 * scratch to KN_ATTN_BLOCK x S floats.  Every GEMM shape depends only on
 * (T, S, D, block), never on the thread split, so results are bitwise the
 * same for any nth.
 *
 * Sequence-split attention (fix_attention): a device holds a block of T
 * of the S query rows, the first at global row q0, and every key; query
 * row i is global row q0 + i and sees keys [0, q0 + i].  Rows past the
 * whole sequence (the padding of an uneven split) attend to nothing.
 * Whole queries are the case q0 = 0, T = S.
 */
#include "runtime/kernels/kernels_ops.h"

#include "base/bf16.h"
#include "runtime/gemm.h"

#include <math.h>

typedef struct attn_dims {
    int64_t B, T, S, C, H, D;
    int64_t q0;    /* the global row of query row 0 */
    int64_t valid; /* query rows inside the sequence: min(T, S - q0) */
    int64_t nblk;  /* blocks of the valid query rows, per head */
    float scale;   /* 1/sqrt(D) */
} attn_dims;

static bool attn_dims_get(const kern_args *a, attn_dims *d)
{
    const spmd_tensor *t = a->node, *q = t->in[0];
    d->B = q->dims[0];
    d->T = q->dims[1];
    d->S = t->in[1]->dims[1];
    d->C = q->dims[2];
    d->H = t->attr.attention.heads;
    if (d->H <= 0 || d->B == 0 || d->T == 0 || d->S == 0 || d->C == 0) return false;
    d->D = d->C / d->H;
    if (d->D == 0) return false;
    d->q0 = 0;
    if (t->attr.attention.rows && a->dev)
        d->q0 = (int64_t)a->dev->member[t->attr.attention.spec] * d->T;
    d->valid = kn_min(d->T, d->S - kn_min(d->S, d->q0));
    d->nblk = kn_ceil_div(d->valid, KN_ATTN_BLOCK);
    d->scale = (float)(1.0 / sqrt((double)d->D));
    return true;
}

/* A product BLAS refuses fails the step (the first failing thread's
 * status and message win); the caller stops its work item. */
static bool gemm_ok(const kern_args *a, spmd_status st)
{
    if (st == SPMD_OK) return true;
    kern_fail(a, st, "%s: %s", ir_op_name(a->node->op), spmd_last_error());
    return false;
}

/* Zero rows [r0, r1) of the head at x (rows C apart, D wide). */
static void zero_rows(const attn_dims *d, float *x, int64_t r0, int64_t r1)
{
    for (int64_t r = r0; r < r1; r++) memset(x + r * d->C, 0, (size_t)d->D * sizeof *x);
}

/* Scores of query rows [t0, t1) against keys [0, q0 + t1) as
 * probabilities: p [t1 - t0, q0 + t1] with row stride ldp, zero past
 * each row's own position; q's rows ldq apart, k's ldk. */
static spmd_status attn_probs(const attn_dims *d, const float *qh, int64_t ldq, const float *kh,
                              int64_t ldk, int64_t t0, int64_t t1, float *p, int64_t ldp)
{
    const int64_t rows = t1 - t0, keys = d->q0 + t1;
    spmd_status st = gemm_f32(false, true, rows, keys, d->D, d->scale, qh + t0 * ldq, ldq, kh,
                              ldk, 0.0f, p, ldp);
    if (st != SPMD_OK) return st;
    for (int64_t i = 0; i < rows; i++) {
        float *pr = p + i * ldp;
        int64_t n = d->q0 + t0 + i + 1; /* keys 0..q0+t */
        kn_softmax_row(pr, pr, n);
        for (int64_t s = n; s < keys; s++) pr[s] = 0.0f;
    }
    return SPMD_OK;
}

/* (q [B, T, C], k and v [B, S, C]) -> out [B, T, C]; head h on channels
 * [h*D, (h+1)*D):
 *   out[b, t, h] = sum_{s <= q0 + t} softmax_s(q_t . k_s / sqrt(D)) v_s.
 * Work items are (b, h, query block); each writes its own rows of its own
 * head.  Padding rows (past the sequence) are zero. */
void kern_attention(const kern_args *a)
{
    attn_dims d = {0}; /* zeroed: without jump threading GCC cannot see attn_dims_get set it */
    if (!attn_dims_get(a, &d)) return;
    const float *q = a->in[0], *k = a->in[1], *v = a->in[2];
    float *out = a->out;
    float *p = a->scratch; /* [KN_ATTN_BLOCK, S] */
    int64_t b, e;
    const int64_t pad = d.valid < d.T; /* one more work item per head: its padding rows */
    const int64_t per_head = d.nblk + pad;
    kern_split(d.B * d.H * per_head, a->ith, a->nth, 1, &b, &e);
    for (int64_t u = b; u < e; u++) {
        int64_t bh = u / per_head, blk = u % per_head;
        int64_t bi = bh / d.H, h = bh % d.H;
        int64_t qoff = bi * d.T * d.C + h * d.D, koff = bi * d.S * d.C + h * d.D;
        if (blk == d.nblk) {
            zero_rows(&d, out + qoff, d.valid, d.T);
            continue;
        }
        int64_t t0 = blk * KN_ATTN_BLOCK, t1 = kn_min(d.valid, t0 + KN_ATTN_BLOCK);
        if (!gemm_ok(a, attn_probs(&d, q + qoff, d.C, k + koff, d.C, t0, t1, p, d.S)) ||
            !gemm_ok(a, gemm_f32(false, false, t1 - t0, d.D, d.q0 + t1, 1.0f, p, d.S, v + koff,
                                 d.C, 0.0f, out + qoff + t0 * d.C, d.C)))
            return;
    }
}

/* `rows` rows of head h of x (rows C apart) at `off` into w [rows, D]:
 * bf16 widened exactly, f32 copied. */
static void widen_head(const attn_dims *d, const void *x, spmd_dtype dtype, int64_t off,
                       int64_t rows, float *w)
{
    for (int64_t t = 0; t < rows; t++) {
        if (dtype == SPMD_BF16)
            bf16_to_f32_n(w + t * d->D, (const bf16_bits *)x + off + t * d->C, (size_t)d->D);
        else
            memcpy(w + t * d->D, (const float *)x + off + t * d->C, (size_t)d->D * sizeof *w);
    }
}

/* (q, dout [B, T, C], k, v [B, S, C]) -> [3, B, S, C] = dq, dk, dv.  Per
 * query block, with P the probabilities and S the scaled scores:
 *   dV += P^T dO,  dP = dO V^T,  dS = P * (dP - rowsum(P * dP)),
 *   dQ  = dS K / sqrt(D),  dK += dS^T Q / sqrt(D).
 * dK and dV of a head sum over all query blocks, so a work item is a whole
 * (b, h); its blocks run last to first: the last block touches every key
 * it sees, so it initialises dK, dV (beta 0) and the others accumulate
 * (beta 1).  With split queries dq's rows outside [q0, q0 + T), and dk's
 * and dv's past the keys the block sees, are zero: the three are this
 * device's addend of a sum over the query blocks.  q, k and v may be bf16
 * (kept so under mixed precision, ir/autocast.c; a leaf among them stays
 * f32): a work item then widens its head of each into scratch ([T, D] and
 * [S, D], rows D apart) and computes in f32 as from f32 operands. */
void kern_attention_backward(const kern_args *a)
{
    attn_dims d = {0}; /* zeroed: without jump threading GCC cannot see attn_dims_get set it */
    if (!attn_dims_get(a, &d)) return;
    spmd_tensor *const *in = a->node->in;
    const bool narrow = in[0]->dtype == SPMD_BF16 || in[1]->dtype == SPMD_BF16 ||
                        in[2]->dtype == SPMD_BF16;
    const float *dout = a->in[3];
    const int64_t n = d.B * d.S * d.C;
    float *dq = a->out, *dk = dq + n, *dv = dq + 2 * n;
    float *p = a->scratch;                  /* [KN_ATTN_BLOCK, S] */
    float *ds = p + KN_ATTN_BLOCK * d.S;    /* [KN_ATTN_BLOCK, S] */
    float *wide = ds + KN_ATTN_BLOCK * d.S; /* bf16 operands: q [T, D], k, v [S, D] */
    int64_t b, e;
    kern_split(d.B * d.H, a->ith, a->nth, 1, &b, &e);
    for (int64_t bh = b; bh < e; bh++) {
        int64_t bi = bh / d.H, h = bh % d.H;
        int64_t qoff = bi * d.T * d.C + h * d.D, koff = bi * d.S * d.C + h * d.D;
        /* The keys some valid query row sees (none on a device of padding
         * rows alone); the rest get nothing here. */
        const int64_t seen = d.valid ? d.q0 + d.valid : 0;
        zero_rows(&d, dq + koff, 0, kn_min(d.q0, d.S));
        zero_rows(&d, dq + koff, seen, d.S);
        zero_rows(&d, dk + koff, seen, d.S);
        zero_rows(&d, dv + koff, seen, d.S);
        if (!d.nblk) continue;
        /* The head's q, k, v at qh, kh, vh, rows ldq and ldk apart. */
        const float *qh, *kh, *vh;
        int64_t ldq, ldk;
        if (narrow) {
            float *w = wide;
            widen_head(&d, a->in[0], in[0]->dtype, qoff, d.T, w);
            widen_head(&d, a->in[1], in[1]->dtype, koff, d.S, w + d.T * d.D);
            widen_head(&d, a->in[2], in[2]->dtype, koff, d.S, w + (d.T + d.S) * d.D);
            qh = w, kh = w + d.T * d.D, vh = w + (d.T + d.S) * d.D, ldq = ldk = d.D;
        } else {
            qh = (const float *)a->in[0] + qoff, kh = (const float *)a->in[1] + koff;
            vh = (const float *)a->in[2] + koff, ldq = ldk = d.C;
        }
        for (int64_t blk = d.nblk - 1; blk >= 0; blk--) {
            const int64_t t0 = blk * KN_ATTN_BLOCK, t1 = kn_min(d.valid, t0 + KN_ATTN_BLOCK);
            const int64_t rows = t1 - t0, keys = d.q0 + t1;
            const float beta = blk == d.nblk - 1 ? 0.0f : 1.0f;
            const float *qb = qh + t0 * ldq, *dob = dout + qoff + t0 * d.C;
            /* dP [rows, keys] = dO_blk V^T, turned into dS row by row. */
            if (!gemm_ok(a, attn_probs(&d, qh, ldq, kh, ldk, t0, t1, p, d.S)) ||
                !gemm_ok(a, gemm_f32(false, true, rows, keys, d.D, 1.0f, dob, d.C, vh, ldk,
                                     0.0f, ds, d.S)))
                return;
            for (int64_t i = 0; i < rows; i++) {
                const float *restrict pr = p + i * d.S;
                float *restrict dr = ds + i * d.S;
                int64_t cnt = d.q0 + t0 + i + 1;
                double acc[KN_LANES] = {0};
                int64_t s = 0;
                for (; s + KN_LANES <= cnt; s += KN_LANES)
                    for (int l = 0; l < KN_LANES; l++)
                        acc[l] += (double)pr[s + l] * (double)dr[s + l];
                for (int l = 0; s < cnt; s++, l++) acc[l] += (double)pr[s] * (double)dr[s];
                const float c = (float)kn_lanes_total(acc);
                for (s = 0; s < cnt; s++) dr[s] = pr[s] * (dr[s] - c);
                for (; s < keys; s++) dr[s] = 0.0f;
            }
            if (!gemm_ok(a, gemm_f32(true, false, keys, d.D, rows, 1.0f, p, d.S, dob, d.C, beta,
                                     dv + koff, d.C)) ||
                !gemm_ok(a, gemm_f32(true, false, keys, d.D, rows, d.scale, ds, d.S, qb, ldq,
                                     beta, dk + koff, d.C)) ||
                !gemm_ok(a, gemm_f32(false, false, rows, d.D, keys, d.scale, ds, d.S, kh,
                                     ldk, 0.0f, dq + koff + (d.q0 + t0) * d.C, d.C)))
                return;
        }
    }
}
