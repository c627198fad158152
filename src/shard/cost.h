/*
 * The alpha-beta cost model (docs/DESIGN.md, "Cost model"): a collective over a
 * group costs a latency per message (alpha) plus its bytes over the link
 * bandwidth (beta per byte), per mesh axis, since an axis whose groups stay
 * inside one process moves bytes through shared memory and one that
 * crosses processes goes over the network.  A group over several axes is
 * priced at its slowest axis.  Ring algorithms: an all-reduce moves
 * 2(n-1)/n of the buffer, an all-gather, reduce-scatter or all-to-all
 * (n-1)/n of the whole tensor.
 */
#ifndef SPMD_SHARD_COST_H
#define SPMD_SHARD_COST_H

#include "ir/ir.h"
#include "mesh/mesh.h"

/* Inside one process (shared memory); across processes the mesh's network. */
extern const cost_link COST_LOCAL;

/* Estimated seconds of collective `kind` over `axes` moving a tensor of
 * `bytes` (the whole tensor: the gathered or unreduced side).  Axes that
 * cross processes are priced with the mesh's network figures
 * (spmd_mesh_set_network; a 10 Gb/s link by default). */
double cost_collective(const spmd_mesh *m, ir_op kind, const mesh_axes *axes, int64_t bytes);
/* The same with every axis priced as local: what propagation ranks
 * operands by, so that where devices live never changes the program. */
double cost_collective_unplaced(const spmd_mesh *m, ir_op kind, const mesh_axes *axes, int64_t bytes);

#endif
