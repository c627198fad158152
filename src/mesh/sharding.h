/*
 * Shardings (docs/DESIGN.md, "Sharding"): for each tensor dimension an ordered
 * list of mesh axes (major to minor), a set of partial axes (the value is a
 * pending sum over them), every other axis replicated.  An axis is used at
 * most once.
 *
 * Text form, parsed and printed everywhere (PyTorch/XLA partition specs):
 *     (replica, fsdp), None          dim 0 over replica x fsdp, dim 1 whole
 *     fsdp, None | partial(replica)  printed for pending sums
 *     3*tensor, fsdp                 dim 0 as 3 runs, each split over tensor
 * A dimension of size D split into B blocks holds ceil(D / B) elements per
 * device, the last blocks padded.
 */
#ifndef SPMD_MESH_SHARDING_H
#define SPMD_MESH_SHARDING_H

#include "mesh/mesh.h"

typedef struct sharding {
    int rank;
    mesh_axes dim[SPMD_MAX_RANK]; /* axes splitting each dim, major first */
    uint32_t partial;             /* bit a: pending sum over mesh axis a */
} sharding;

/* Every dim whole, nothing partial. */
sharding sharding_replicated(int rank);

/* Parse `text` for a tensor of `rank` dims on mesh m.  Errors (status
 * SPMD_ERR_INVALID, message naming the token and its 1-based column):
 * unknown axis, axis used twice, rank mismatch, unbalanced parentheses,
 * empty entry, stray characters. */
spmd_status sharding_parse(const char *text, const spmd_mesh *m, int rank, sharding *out);
/* "(replica, fsdp), None"; returns buf. */
const char *sharding_format(const sharding *s, const spmd_mesh *m, char *buf, size_t size);
/* GSPMD HloSharding text for a tensor with this sharding:
 * "{devices=[4,1,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}", "{replicated}". */
const char *sharding_format_hlo(const sharding *s, const spmd_mesh *m, char *buf, size_t size);

bool sharding_equal(const sharding *a, const sharding *b);
/* Whether some split dim is grouped (N*axis). */
bool sharding_has_groups(const sharding *s);
/* A grouped split must cut every group exactly (no padding). */
bool sharding_groups_exact(const sharding *s, const spmd_mesh *m, int d, int64_t global);
/* Mask of mesh axes used by dims (not partial). */
uint32_t sharding_dim_axes(const sharding *s);
/* Number of blocks dim d is split into. */
int64_t sharding_blocks(const sharding *s, const spmd_mesh *m, int d);
/* Elements of dim d each device holds: ceil(global / blocks). */
int64_t sharding_block_size(const sharding *s, const spmd_mesh *m, int d, int64_t global);
/* Elements of block `block` of dim d that hold data, the rest being
 * padding: 10 over 4 blocks gives 3, 3, 3, 1. */
int64_t sharding_block_valid(const sharding *s, const spmd_mesh *m, int d, int64_t global,
                             int64_t block);
/* Which block of dim d `device` holds (mixed radix over the dim's axes);
 * in a grouped split, its block of every group. */
int64_t sharding_block_index(const sharding *s, const spmd_mesh *m, int d, int device);
/* Local (per-device, padded) shape of a tensor with global `dims`. */
void sharding_local_dims(const sharding *s, const spmd_mesh *m, int rank, const int64_t *dims,
                         int64_t *local);
/* True if some dim's block size times its blocks exceeds its size. */
bool sharding_has_padding(const sharding *s, const spmd_mesh *m, const int64_t *dims);

/* ASCII picture of which devices hold which block of a 1-D or 2-D tensor
 * of `dims` (as visualize_tensor_sharding draws it).  Returns the bytes
 * written (truncated at size) or -1 with a message for rank > 2. */
int sharding_visualize(const sharding *s, const spmd_mesh *m, int rank, const int64_t *dims,
                       char *buf, size_t size);

#endif
