/*
 * GEMM tiling (see tiles.h).
 */
#include "compile/tiles.h"

/* f32: aim for at least 64 tiles so that up to 64 threads have work, but
 * never cut a tile below about 64 x 64 (BLAS needs some size to run at
 * speed).  bf16: at least 8 tiles, none cut below about 128 x 128.  oneDNN's
 * bf16 kernels run several times faster than sgemm (on AMX) and cost more
 * per call (each packs its B into the instruction's layout, and a tile of a
 * larger matrix is first copied dense, runtime/gemm.c), so a small tile
 * spends most of its time outside the product: on the GPT-2 124M step (2
 * threads, AMX) these tiles made the bf16 step 1.12 times faster than f32's
 * tiles (703 to 628 ms), and 4 tiles would be a further 3%, at the cost of
 * idle threads on a device with more than 4. */
enum { MM_MIN_TILES = 64, MM_MIN_SIDE = 64, MM_ROUND = 16 };
enum { MM_BF16_MIN_TILES = 8, MM_BF16_MIN_SIDE = 128 };

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Halve the longer side until there are enough tiles. */
static void tiles(int64_t batch, int64_t m, int64_t n, int64_t min_tiles, int64_t min_side,
                  int64_t *tm, int64_t *tn)
{
    int64_t bm = m > 1 ? m : 1, bn = n > 1 ? n : 1;
    while (batch * ceil_div(m, bm) * ceil_div(n, bn) < min_tiles) {
        if (bm >= bn && bm > min_side)
            bm = round_up(ceil_div(bm, 2), MM_ROUND);
        else if (bn > min_side)
            bn = round_up(ceil_div(bn, 2), MM_ROUND);
        else
            break;
    }
    *tm = bm;
    *tn = bn;
}

void gemm_tiles(int64_t batch, int64_t m, int64_t n, bool bf16, int64_t *tm, int64_t *tn)
{
    if (bf16)
        tiles(batch, m, n, MM_BF16_MIN_TILES, MM_BF16_MIN_SIDE, tm, tn);
    else
        tiles(batch, m, n, MM_MIN_TILES, MM_MIN_SIDE, tm, tn);
}
