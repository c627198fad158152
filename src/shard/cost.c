/* The alpha-beta cost model (see cost.h). */
#include "shard/cost.h"

/* Shared memory: a few microseconds per barrier, about memcpy speed for
 * the bytes (measured by bench_collectives on the development machine).
 * The network's figures are the mesh's (spmd_mesh_set_network). */
const cost_link COST_LOCAL = {3e-6, 10e9};

static double priced(cost_link link, ir_op kind, int n, int64_t bytes)
{
    double steps = n - 1, share = (double)(n - 1) / n;
    if (kind == IR_ALL_REDUCE) steps *= 2, share *= 2;
    return steps * link.alpha_s + share * (double)bytes / link.bytes_per_s;
}

double cost_collective(const spmd_mesh *m, ir_op kind, const mesh_axes *axes, int64_t bytes)
{
    int n = mesh_axes_size(m, axes);
    if (n <= 1) return 0;
    cost_link link = COST_LOCAL;
    for (int i = 0; i < axes->n; i++)
        if (!m->local[axes->axis[i]]) link = m->network;
    return priced(link, kind, n, bytes);
}

double cost_collective_unplaced(const spmd_mesh *m, ir_op kind, const mesh_axes *axes, int64_t bytes)
{
    int n = mesh_axes_size(m, axes);
    return n <= 1 ? 0 : priced(COST_LOCAL, kind, n, bytes);
}
