/*
 * How kern_matmul cuts a product's output into tiles (runtime/
 * kernels_matmul.c), here because the plan depends on it too: a gather
 * read in place (plan.gather_leaf) needs every tile inside one block.
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

/* Whether kern_matmul can compute matmul t reading its B from blocks of
 * `block_rows` rows each lying apart (kern_args.b_blocks) with the very
 * arithmetic it would use on B whole: x B^T, all f32, B of rank 2, and
 * every output tile inside one block's columns. */
bool matmul_reads_blocks(const spmd_tensor *t, int64_t block_rows);

#endif
