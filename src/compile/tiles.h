/*
 * How kern_matmul cuts a product's output into tiles (runtime/
 * kernels_matmul.c), and the convolution kernels their work
 * (runtime/kernels_conv.c), from the shapes alone.
 */
#ifndef SPMD_COMPILE_TILES_H
#define SPMD_COMPILE_TILES_H

#include "ir/ir.h"

#include <stdbool.h>
#include <stdint.h>

/* Tile sizes (tm rows, tn columns) for `batch` products of m x n, f32 or
 * bf16 (an operand in bf16: the bf16 GEMM), from the shapes alone, so every
 * element is computed by the same GEMM call whatever the thread count. */
void gemm_tiles(int64_t batch, int64_t m, int64_t n, bool bf16, int64_t *tm, int64_t *tn);

/* A conv2d node or one of its backward ops, as its kernel works it: per
 * image and group, y [opg, OH*OW] = w [opg, kdim] times the im2col matrix
 * [kdim, OH*OW] of the image's channels of the group (kdim = cpg * KH *
 * KW), built in the thread's scratch `cols` columns at a time so that it
 * stays a few MiB; dw's kdim rows go `rows` to a work item.  Pointwise
 * (1x1, stride 1, no padding) the image itself is the matrix.  Small
 * images go `imgs` to a GEMM (the last call of a device's batch takes
 * what is left), their matrices side by side: [kdim, imgs * OH*OW]. */
typedef struct conv_plan {
    int64_t n, cin, h, w, cout, kh, kw, oh, ow;
    int64_t stride[2], pad[2], dilation[2];
    int64_t groups, cpg, opg, kdim, ohw;
    bool pointwise;
    int64_t cols, rows, imgs;
} conv_plan;

void conv_plan_of(const spmd_tensor *t, conv_plan *p);
/* The per-thread scratch its kernel needs (ops.def's scratch column). */
size_t conv_scratch_bytes(const spmd_tensor *t);

#endif
