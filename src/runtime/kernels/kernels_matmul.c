/*
 * matmul and bmm on top of gemm_f32, or gemm_bf16 when an operand is bf16
 * (single-threaded GEMMs; the threads here split the output).
 *
 * The output is cut into tiles whose size depends only on the shapes
 * (gemm_tiles, compile/tiles.h), and each tile is one gemm_f32 call;
 * threads take contiguous runs of tiles.
 * Splitting "one block of rows per thread" instead would hand BLAS
 * different m for different nth, and BLAS libraries pick different code
 * paths (small-matrix kernels, edge kernels, K blocking) by size, which
 * changes the rounding: with fixed tiles every element is computed by the
 * same call whatever nth is, so results are bitwise identical.
 */
#include "runtime/kernels/kernels_ops.h"

#include "base/error.h"
#include "compile/tiles.h"
#include "runtime/gemm.h"

#include <string.h>

/* One product C[m, n] = op(A) op(B), given by its row-major operands, each
 * f32 or bf16 (then the bf16 GEMM sums in f32); C is f32. */
typedef struct gemm_desc {
    bool ta, tb;
    int64_t m, n, k;
    const void *a, *b;
    gemm_type a_type, b_type;
    float *c;
    int64_t lda, ldb, ldc;
    int64_t sa, sb, sc; /* batch strides, in elements */
} gemm_desc;

static gemm_type gemm_type_of(const spmd_tensor *t) { return t->dtype == SPMD_BF16 ? GEMM_BF16 : GEMM_F32; }

/* Element `i` of an operand of type `type`. */
static const void *element(const void *base, gemm_type type, int64_t i)
{
    return (const char *)base + (size_t)i * (type == GEMM_BF16 ? 2 : 4);
}

/* Tile (i0, j0) of size (mm, nn) of batch entry `bi`. */
static spmd_status gemm_tile(const gemm_desc *g, int64_t bi, int64_t i0, int64_t j0, int64_t mm,
                             int64_t nn)
{
    float *c = g->c + bi * g->sc + i0 * g->ldc + j0;
    if (g->k == 0) {
        for (int64_t i = 0; i < mm; i++) memset(c + i * g->ldc, 0, (size_t)nn * sizeof *c);
        return SPMD_OK;
    }
    /* op(A) row i0: A[i0, :] or, transposed, A[:, i0]; likewise for B. */
    const void *pa = element(g->a, g->a_type, bi * g->sa + (g->ta ? i0 : i0 * g->lda));
    const void *pb = element(g->b, g->b_type, bi * g->sb + (g->tb ? j0 * g->ldb : j0));
    if (g->a_type == GEMM_F32 && g->b_type == GEMM_F32)
        return gemm_f32(g->ta, g->tb, mm, nn, g->k, 1.0f, pa, g->lda, pb, g->ldb, 0.0f, c,
                        g->ldc);
    return gemm_bf16(g->ta, g->tb, mm, nn, g->k, 1.0f, pa, g->a_type, g->lda, pb, g->b_type,
                     g->ldb, 0.0f, c, GEMM_F32, g->ldc);
}

/* A tile BLAS refuses fails the step (kern_fail: the first failing
 * thread's status and message win); this thread's other tiles are left,
 * since the step's outputs are not used. */
static void gemm_run(const kern_args *a, const gemm_desc *g, int64_t batch)
{
    if (batch == 0 || g->m == 0 || g->n == 0) return;
    int64_t tm, tn;
    gemm_tiles(batch, g->m, g->n, g->a_type == GEMM_BF16 || g->b_type == GEMM_BF16, &tm,
               &tn);
    const int64_t gm = kn_ceil_div(g->m, tm), gn = kn_ceil_div(g->n, tn);
    int64_t b, e;
    kern_split(batch * gm * gn, a->ith, a->nth, 1, &b, &e);
    for (int64_t u = b; u < e; u++) {
        int64_t bi = u / (gm * gn), r = u % (gm * gn);
        int64_t i0 = (r / gn) * tm, j0 = (r % gn) * tn;
        spmd_status st = gemm_tile(g, bi, i0, j0, kn_min(tm, g->m - i0), kn_min(tn, g->n - j0));
        if (st != SPMD_OK) {
            kern_fail(a, st, "%s: %s", ir_op_name(a->node->op), spmd_last_error());
            return;
        }
    }
}

/*
 * matmul, attr.matmul.ta/tb:
 *   !ta: a [L..., K] (as [M, K]), b [K, N] or, tb, [N, K] -> out [L..., N]
 *    ta: a [L..., M] (as [K, M]), b [L..., N] (as [K, N]) -> out [M, N]:
 *        the weight gradient, contracting over all leading dims;
 *        ta and tb (2-D only): a [K, M], b [N, K] -> out [M, N].
 */
void kern_matmul(const kern_args *a)
{
    const spmd_tensor *t = a->node;
    const spmd_tensor *at = t->in[0];
    gemm_desc g = {0};
    g.ta = t->attr.matmul.ta;
    g.tb = t->attr.matmul.tb;
    const int64_t a_last = at->rank > 0 ? at->dims[at->rank - 1] : 1;
    if (!g.ta) {
        g.k = a_last;
        g.n = t->rank > 0 ? t->dims[t->rank - 1] : 1;
        g.m = g.n > 0 ? kn_numel(t) / g.n : 0;
        g.lda = g.k;
    } else {
        g.m = a_last;
        g.n = t->dims[1];
        g.k = g.m > 0 ? kn_numel(at) / g.m : 0;
        g.lda = g.m;
    }
    g.ldb = g.tb ? g.k : g.n;
    g.ldc = g.n;
    g.a = a->in[0];
    g.b = a->in[1];
    g.a_type = gemm_type_of(t->in[0]);
    g.b_type = gemm_type_of(t->in[1]);
    g.c = a->out;
    gemm_run(a, &g, 1);
}

/* bmm: a [B..., M, K] (ta: [B..., K, M]), b [B..., K, N] (tb: [B..., N, K])
 * -> out [B..., M, N], one product per batch index. */
void kern_bmm(const kern_args *a)
{
    const spmd_tensor *t = a->node;
    const spmd_tensor *at = t->in[0];
    const int r = t->rank;
    if (r < 2 || at->rank < 2) return; /* the builder only makes rank >= 2 */
    gemm_desc g = {0};
    g.ta = t->attr.matmul.ta;
    g.tb = t->attr.matmul.tb;
    g.m = t->dims[r - 2];
    g.n = t->dims[r - 1];
    g.k = g.ta ? at->dims[at->rank - 2] : at->dims[at->rank - 1];
    g.lda = g.ta ? g.m : g.k;
    g.ldb = g.tb ? g.k : g.n;
    g.ldc = g.n;
    g.sa = g.m * g.k;
    g.sb = g.k * g.n;
    g.sc = g.m * g.n;
    g.a = a->in[0];
    g.b = a->in[1];
    g.a_type = gemm_type_of(t->in[0]);
    g.b_type = gemm_type_of(t->in[1]);
    g.c = a->out;
    const int64_t batch = kn_numel_dims(t->dims, r - 2);
    gemm_run(a, &g, batch);
}
