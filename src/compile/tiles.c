/*
 * GEMM tiling and the convolutions' work (see tiles.h).
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

/* The im2col matrix: at most about 4 MiB per thread, one tile (and one
 * GEMM) per image for resnet18's layers from 28 x 28 down and for
 * 32 x 32 images, two for its stem and 56 x 56 layers.  dw: its rows in 4
 * work items (multiples of 8), so that threads share a layer whatever its
 * batch: 16 items ran dw's 64 x 576 x 1024 products at 47 GFLOP/s a
 * thread, 4 at 55-65 (bench_gemm's conv table).  An image of fewer than
 * CONV_COLS output positions shares its GEMM with the next images, up to
 * CONV_COLS columns in all (and the matrices and the product within the
 * 4 MiB): the BLAS packs the weights once per call, which for resnet18's
 * last layers on 32 x 32 images (2 x 2 and 1 x 1 outputs) took most of a
 * per-image call, and dw's product summed a single position per call. */
enum { CONV_COL_FLOATS = 1 << 20, CONV_DW_ITEMS = 4, CONV_ROUND = 8, CONV_COLS = 128 };

void conv_plan_of(const spmd_tensor *t, conv_plan *p)
{
    ir_conv_roles role = ir_conv_roles_of(t->op);
    const int64_t *x = ir_conv_dims(t, role.x), *w = ir_conv_dims(t, role.w),
                  *y = ir_conv_dims(t, role.y);
    const ir_conv *c = &t->attr.conv;
    p->n = x[0], p->cin = x[1], p->h = x[2], p->w = x[3];
    p->cout = w[0], p->kh = w[2], p->kw = w[3];
    p->oh = y[2], p->ow = y[3];
    for (int d = 0; d < 2; d++) {
        p->stride[d] = c->stride[d];
        p->pad[d] = c->pad[d];
        p->dilation[d] = c->dilation[d];
    }
    p->groups = c->groups > 0 ? c->groups : 1;
    p->cpg = p->cin / p->groups;
    p->opg = p->cout / p->groups;
    p->kdim = p->cpg * p->kh * p->kw;
    p->ohw = p->oh * p->ow;
    p->pointwise = p->kh == 1 && p->kw == 1 && p->stride[0] == 1 && p->stride[1] == 1 &&
                   p->pad[0] == 0 && p->pad[1] == 0;
    int64_t k = p->kdim > 0 ? p->kdim : 1, cols = p->ohw > 0 ? p->ohw : 1;
    if (k * cols > CONV_COL_FLOATS) {
        int64_t tiles = ceil_div(k * cols, CONV_COL_FLOATS);
        cols = round_up(ceil_div(cols, tiles), CONV_ROUND);
        if (cols > p->ohw) cols = p->ohw > 0 ? p->ohw : 1;
    }
    p->cols = cols;
    int64_t rows = round_up(ceil_div(k, CONV_DW_ITEMS), CONV_ROUND);
    p->rows = rows < k ? rows : k;
    p->imgs = 1;
    if (p->ohw > 0 && cols == p->ohw && p->ohw < CONV_COLS) {
        int64_t imgs = ceil_div(CONV_COLS, p->ohw), fit = CONV_COL_FLOATS / (p->ohw * (k + p->opg));
        if (imgs > fit) imgs = fit;
        if (imgs > p->n) imgs = p->n;
        if (imgs > 1) p->imgs = imgs;
    }
}

size_t conv_scratch_bytes(const spmd_tensor *t)
{
    conv_plan p;
    conv_plan_of(t, &p);
    int64_t rows = t->op == IR_CONV2D_BACKWARD_WEIGHT ? p.rows : p.kdim;
    /* Images side by side: their matrix and the product's operand or
     * result of opg rows (y before it is copied out, dy gathered). */
    if (p.imgs > 1) return (size_t)((rows + p.opg) * p.imgs * p.ohw) * sizeof(float);
    if (p.pointwise) return 0;
    return (size_t)rows * (size_t)p.cols * sizeof(float);
}
