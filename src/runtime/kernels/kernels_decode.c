/*
 * Decoding with a KV cache: writing new key/value rows into a cache at a
 * position read at run time, and causal attention of a few new query rows
 * over the cache.  The position is an int32 [1] input, so one compiled
 * program serves every step of a generation.
 *
 * Head h of a [B, S, C] cache is the strided view [S, D] at channel h*D
 * with row stride C, as in kernels_attention.c.  Query rows go in blocks
 * of KN_ATTN_BLOCK and every GEMM shape depends only on the shapes and the
 * position, never on the thread split, so results are bitwise the same for
 * any nth.
 */
#include "runtime/kernels/kernels_ops.h"

#include "runtime/gemm.h"

/* The position pos of the first of `rows` new rows, checked to fit with
 * them in a cache of `cap` rows; -1 (after kern_fail) when it does not. */
static int64_t read_position(const kern_args *a, const void *p, int64_t rows, int64_t cap)
{
    int32_t pos = *(const int32_t *)p;
    if (pos >= 0 && (int64_t)pos + rows <= cap) return pos;
    kern_fail(a, SPMD_ERR_INVALID,
              "%s: position %d with %lld new row(s) does not fit a cache of %lld rows",
              ir_op_name(a->node->op), (int)pos, (long long)rows, (long long)cap);
    return -1;
}

/* (cache [B, S, C], rows [B, T, C], pos) -> the cache with rows
 * pos .. pos+T-1 replaced.  Threads take runs of output rows.  A bad
 * position leaves the cache as it was. */
void kern_cache_write(const kern_args *a)
{
    const spmd_tensor *t = a->node;
    const int64_t B = t->dims[0], S = t->dims[1], C = t->dims[2], T = t->in[1]->dims[1];
    const float *cache = a->in[0], *rows = a->in[1];
    float *out = a->out;
    int64_t pos = read_position(a, a->in[2], T, S);
    int64_t b, e;
    kern_split(B * S, a->ith, a->nth, 1, &b, &e);
    for (int64_t r = b; r < e; r++) {
        int64_t bi = r / S, s = r % S;
        bool is_new = pos >= 0 && s >= pos && s < pos + T;
        const float *src = is_new ? rows + (bi * T + s - pos) * C : cache + r * C;
        memcpy(out + r * C, src, (size_t)C * sizeof *out);
    }
}

/* Query rows [t0, t1) of one head against keys [0, pos + t1) as
 * probabilities: p [t1 - t0, pos + t1] with row stride ldp, query row i
 * (at position pos + t0 + i) seeing keys up to its own position. */
static spmd_status cached_probs(const float *qh, const float *kh, int64_t C, int64_t D,
                                float scale, int64_t pos, int64_t t0, int64_t t1, float *p,
                                int64_t ldp)
{
    const int64_t rows = t1 - t0, keys = pos + t1;
    spmd_status st = gemm_f32(false, true, rows, keys, D, scale, qh + t0 * C, C, kh, C, 0.0f, p,
                              ldp);
    if (st != SPMD_OK) return st;
    for (int64_t i = 0; i < rows; i++) {
        float *pr = p + i * ldp;
        int64_t n = pos + t0 + i + 1;
        kn_softmax_row(pr, pr, n);
        for (int64_t s = n; s < keys; s++) pr[s] = 0.0f;
    }
    return SPMD_OK;
}

/* (q [B, T, C], k_cache, v_cache [B, S, C], pos) -> out [B, T, C]:
 *   out[b, t, h] = sum_{s <= pos + t} softmax_s(q_t . k_s / sqrt(D)) v_s.
 * Work items are (b, h, query block).  A bad position gives zeros. */
void kern_cached_attention(const kern_args *a)
{
    const spmd_tensor *t = a->node;
    const int64_t B = t->dims[0], T = t->dims[1], C = t->dims[2], S = t->in[1]->dims[1];
    const int64_t H = t->attr.attention.heads, D = H > 0 ? C / H : 0;
    if (B == 0 || T == 0 || D == 0) return;
    const float *q = a->in[0], *k = a->in[1], *v = a->in[2];
    float *out = a->out;
    float *p = a->scratch; /* [KN_ATTN_BLOCK, S] */
    const int64_t pos = read_position(a, a->in[3], T, S), nblk = kn_ceil_div(T, KN_ATTN_BLOCK);
    const float scale = (float)(1.0 / sqrt((double)D));
    int64_t b, e;
    kern_split(B * H * nblk, a->ith, a->nth, 1, &b, &e);
    for (int64_t u = b; u < e; u++) {
        int64_t bh = u / nblk, blk = u % nblk, bi = bh / H, h = bh % H;
        int64_t t0 = blk * KN_ATTN_BLOCK, t1 = kn_min(T, t0 + KN_ATTN_BLOCK);
        float *ob = out + bi * T * C + h * D + t0 * C;
        if (pos < 0) {
            for (int64_t i = 0; i < t1 - t0; i++) memset(ob + i * C, 0, (size_t)D * sizeof *ob);
            continue;
        }
        const float *qh = q + bi * T * C + h * D, *kh = k + bi * S * C + h * D,
                    *vh = v + bi * S * C + h * D;
        spmd_status st = cached_probs(qh, kh, C, D, scale, pos, t0, t1, p, S);
        if (st == SPMD_OK)
            st = gemm_f32(false, false, t1 - t0, D, pos + t1, 1.0f, p, S, vh, C, 0.0f, ob, C);
        if (st != SPMD_OK) {
            kern_fail(a, st, "%s: %s", ir_op_name(t->op), spmd_last_error());
            return;
        }
    }
}
