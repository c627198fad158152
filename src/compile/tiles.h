/*
 * How kern_matmul cuts a product's output into tiles (runtime/
 * kernels_matmul.c), from the shapes alone.
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

#endif
