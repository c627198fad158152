/*
 * Causal multi-head self-attention, forward and backward, without storing
 * the T x T probabilities between them: the backward pass recomputes them.
 *
 * Head h of q, k, v [B, T, C] is the strided view [T, D] at channel h*D
 * with row stride C, so every product is a gemm_f32 on views and no
 * head is ever copied out.  Query rows go in blocks of KN_ATTN_BLOCK: a
 * block [t0, t1) only needs keys [0, t1), which skips most of the masked
 * half of the scores, and bounds the scratch to KN_ATTN_BLOCK x T floats.
 * Every GEMM shape depends only on (T, D, block), never on the thread
 * split, so results are bitwise the same for any nth.
 */
#include "runtime/kernels/kernels_ops.h"

#include "base/bf16.h"
#include "runtime/gemm.h"

#include <math.h>

typedef struct attn_dims {
    int64_t B, T, C, H, D;
    int64_t nblk; /* query blocks per head */
    float scale;  /* 1/sqrt(D) */
} attn_dims;

static bool attn_dims_get(const spmd_tensor *t, attn_dims *d)
{
    const spmd_tensor *q = t->in[0];
    d->B = q->dims[0];
    d->T = q->dims[1];
    d->C = q->dims[2];
    d->H = t->attr.attention.heads;
    if (d->H <= 0 || d->B == 0 || d->T == 0 || d->C == 0) return false;
    d->D = d->C / d->H;
    if (d->D == 0) return false;
    d->nblk = kn_ceil_div(d->T, KN_ATTN_BLOCK);
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

/* Scores of query rows [t0, t1) against keys [0, t1) as probabilities:
 * p [t1 - t0, t1] with row stride ldp, zero above the diagonal; q's and
 * k's rows ld apart. */
static spmd_status attn_probs(const attn_dims *d, const float *qh, const float *kh, int64_t ld,
                              int64_t t0, int64_t t1, float *p, int64_t ldp)
{
    const int64_t rows = t1 - t0;
    spmd_status st = gemm_f32(false, true, rows, t1, d->D, d->scale, qh + t0 * ld, ld, kh,
                              ld, 0.0f, p, ldp);
    if (st != SPMD_OK) return st;
    for (int64_t i = 0; i < rows; i++) {
        float *pr = p + i * ldp;
        int64_t n = t0 + i + 1; /* keys 0..t */
        kn_softmax_row(pr, pr, n);
        for (int64_t s = n; s < t1; s++) pr[s] = 0.0f;
    }
    return SPMD_OK;
}

/* (q, k, v [B, T, C]) -> out [B, T, C]; head h on channels [h*D, (h+1)*D):
 *   out[b, t, h] = sum_{s <= t} softmax_s(q_t . k_s / sqrt(D)) v_s.
 * Work items are (b, h, query block); each writes its own rows of its own
 * head. */
void kern_attention(const kern_args *a)
{
    attn_dims d = {0}; /* zeroed: without jump threading GCC cannot see attn_dims_get set it */
    if (!attn_dims_get(a->node, &d)) return;
    const float *q = a->in[0], *k = a->in[1], *v = a->in[2];
    float *out = a->out;
    float *p = a->scratch; /* [KN_ATTN_BLOCK, T] */
    int64_t b, e;
    kern_split(d.B * d.H * d.nblk, a->ith, a->nth, 1, &b, &e);
    for (int64_t u = b; u < e; u++) {
        int64_t bh = u / d.nblk, blk = u % d.nblk;
        int64_t bi = bh / d.H, h = bh % d.H;
        int64_t t0 = blk * KN_ATTN_BLOCK, t1 = kn_min(d.T, t0 + KN_ATTN_BLOCK);
        int64_t off = bi * d.T * d.C + h * d.D; /* head h of batch bi, row 0 */
        if (!gemm_ok(a, attn_probs(&d, q + off, k + off, d.C, t0, t1, p, d.T)) ||
            !gemm_ok(a, gemm_f32(false, false, t1 - t0, d.D, t1, 1.0f, p, d.T, v + off, d.C,
                                 0.0f, out + off + t0 * d.C, d.C)))
            return;
    }
}

/* Head h of x [B, T, C] at `off` (its row 0) into w [T, D]: bf16
 * widened exactly, f32 copied. */
static void widen_head(const attn_dims *d, const void *x, spmd_dtype dtype, int64_t off, float *w)
{
    for (int64_t t = 0; t < d->T; t++) {
        if (dtype == SPMD_BF16)
            bf16_to_f32_n(w + t * d->D, (const bf16_bits *)x + off + t * d->C, (size_t)d->D);
        else
            memcpy(w + t * d->D, (const float *)x + off + t * d->C, (size_t)d->D * sizeof *w);
    }
}

/* (q, k, v, dout [B, T, C]) -> [3, B, T, C] = dq, dk, dv.  Per query block,
 * with P the probabilities and S the scaled scores:
 *   dV += P^T dO,  dP = dO V^T,  dS = P * (dP - rowsum(P * dP)),
 *   dQ  = dS K / sqrt(D),  dK += dS^T Q / sqrt(D).
 * dK and dV of a head sum over all query blocks, so a work item is a whole
 * (b, h); its blocks run last to first: the last block touches every key,
 * so it initialises dK, dV (beta 0) and the others accumulate (beta 1).
 * q, k and v may be bf16 (kept so under mixed precision, ir/autocast.c;
 * a leaf among them stays f32): a work item then widens its head of each
 * into scratch ([T, D], rows D apart) and computes in f32 as from f32
 * operands. */
void kern_attention_backward(const kern_args *a)
{
    attn_dims d = {0}; /* zeroed: without jump threading GCC cannot see attn_dims_get set it */
    if (!attn_dims_get(a->node, &d)) return;
    spmd_tensor *const *in = a->node->in;
    const bool narrow = in[0]->dtype == SPMD_BF16 || in[1]->dtype == SPMD_BF16 ||
                        in[2]->dtype == SPMD_BF16;
    const float *dout = a->in[3];
    const int64_t n = d.B * d.T * d.C;
    float *dq = a->out, *dk = dq + n, *dv = dq + 2 * n;
    float *p = a->scratch;                  /* [KN_ATTN_BLOCK, T] */
    float *ds = p + KN_ATTN_BLOCK * d.T;    /* [KN_ATTN_BLOCK, T] */
    float *wide = ds + KN_ATTN_BLOCK * d.T; /* bf16 operands: q, k, v heads [T, D] */
    int64_t b, e;
    kern_split(d.B * d.H, a->ith, a->nth, 1, &b, &e);
    for (int64_t bh = b; bh < e; bh++) {
        int64_t bi = bh / d.H, h = bh % d.H;
        int64_t off = bi * d.T * d.C + h * d.D;
        /* The head's q, k, v at qh, kh, vh, rows ld apart. */
        const float *qh, *kh, *vh;
        int64_t ld;
        if (narrow) {
            float *w = wide;
            for (int i = 0; i < 3; i++) widen_head(&d, a->in[i], in[i]->dtype, off, w + i * d.T * d.D);
            qh = w, kh = w + d.T * d.D, vh = w + 2 * d.T * d.D, ld = d.D;
        } else {
            qh = (const float *)a->in[0] + off, kh = (const float *)a->in[1] + off;
            vh = (const float *)a->in[2] + off, ld = d.C;
        }
        for (int64_t blk = d.nblk - 1; blk >= 0; blk--) {
            const int64_t t0 = blk * KN_ATTN_BLOCK, t1 = kn_min(d.T, t0 + KN_ATTN_BLOCK);
            const int64_t rows = t1 - t0;
            const float beta = blk == d.nblk - 1 ? 0.0f : 1.0f;
            const float *qb = qh + t0 * ld, *dob = dout + off + t0 * d.C;
            /* dP [rows, t1] = dO_blk V^T, turned into dS row by row. */
            if (!gemm_ok(a, attn_probs(&d, qh, kh, ld, t0, t1, p, d.T)) ||
                !gemm_ok(a, gemm_f32(false, true, rows, t1, d.D, 1.0f, dob, d.C, vh, ld,
                                     0.0f, ds, d.T)))
                return;
            for (int64_t i = 0; i < rows; i++) {
                const float *restrict pr = p + i * d.T;
                float *restrict dr = ds + i * d.T;
                int64_t cnt = t0 + i + 1;
                double acc[KN_LANES] = {0};
                int64_t s = 0;
                for (; s + KN_LANES <= cnt; s += KN_LANES)
                    for (int l = 0; l < KN_LANES; l++)
                        acc[l] += (double)pr[s + l] * (double)dr[s + l];
                for (int l = 0; s < cnt; s++, l++) acc[l] += (double)pr[s] * (double)dr[s];
                const float c = (float)kn_lanes_total(acc);
                for (s = 0; s < cnt; s++) dr[s] = pr[s] * (dr[s] - c);
                for (; s < t1; s++) dr[s] = 0.0f;
            }
            if (!gemm_ok(a, gemm_f32(true, false, t1, d.D, rows, 1.0f, p, d.T, dob, d.C, beta,
                                     dv + off, d.C)) ||
                !gemm_ok(a, gemm_f32(true, false, t1, d.D, rows, d.scale, ds, d.T, qb, ld,
                                     beta, dk + off, d.C)) ||
                !gemm_ok(a, gemm_f32(false, false, rows, d.D, t1, d.scale, ds, d.T, kh,
                                     ld, 0.0f, dq + off + t0 * d.C, d.C)))
                return;
        }
    }
}
