/*
 * GEMM tiling (see tiles.h).
 */
#include "compile/tiles.h"

/* Aim for at least this many tiles so that up to 64 threads have work,
 * but never cut a tile below about 64 x 64 (BLAS needs some size to run
 * at speed). */
enum { MM_MIN_TILES = 64, MM_MIN_SIDE = 64, MM_ROUND = 16 };

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Halve the longer side until there are enough tiles. */
void gemm_tiles(int64_t batch, int64_t m, int64_t n, int64_t *tm, int64_t *tn)
{
    int64_t bm = m > 1 ? m : 1, bn = n > 1 ? n : 1;
    while (batch * ceil_div(m, bm) * ceil_div(n, bn) < MM_MIN_TILES) {
        if (bm >= bn && bm > MM_MIN_SIDE)
            bm = round_up(ceil_div(bm, 2), MM_ROUND);
        else if (bn > MM_MIN_SIDE)
            bn = round_up(ceil_div(bn, 2), MM_ROUND);
        else
            break;
    }
    *tm = bm;
    *tn = bn;
}

/* Each tile is one gemm_f32 call; with every tile inside one block it
 * keeps its sizes and leading dimensions and only B's address differs, so
 * every element gets the same bits.  Not bf16, whose GEMM converts B
 * through per-call buffers. */
bool matmul_reads_blocks(const spmd_tensor *t, int64_t block_rows)
{
    if (t->op != IR_MATMUL || t->n_in != 2 || t->attr.matmul.ta || !t->attr.matmul.tb ||
        t->rank < 1 || t->in[1]->rank != 2 || t->dtype != SPMD_F32 ||
        t->in[0]->dtype != SPMD_F32 || t->in[1]->dtype != SPMD_F32)
        return false;
    int64_t n = t->dims[t->rank - 1], numel = 1;
    for (int d = 0; d < t->rank; d++) numel *= t->dims[d];
    if (block_rows <= 0 || n == 0 || n % block_rows != 0 || numel == 0) return false;
    int64_t tm, tn;
    gemm_tiles(1, numel / n, n, &tm, &tn);
    return block_rows % tn == 0;
}
