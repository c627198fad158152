/* The alpha-beta cost model (see cost.h). */
#include "shard/cost.h"

/* Shared memory: a few microseconds per barrier, about memcpy speed for
 * the bytes (measured by bench_collectives on the development machine).
 * Network: a 10 Gb/s link with tens of microseconds per message. */
const cost_link COST_LOCAL = {3e-6, 10e9};
const cost_link COST_REMOTE = {25e-6, 1.25e9};

double cost_collective(const spmd_mesh *m, ir_op kind, const mesh_axes *axes, int64_t bytes)
{
    int n = mesh_axes_size(m, axes);
    if (n <= 1) return 0;
    cost_link link = COST_LOCAL;
    for (int i = 0; i < axes->n; i++)
        if (!m->local[axes->axis[i]]) link = COST_REMOTE;
    double steps = n - 1, share = (double)(n - 1) / n;
    if (kind == IR_ALL_REDUCE) steps *= 2, share *= 2;
    return steps * link.alpha_s + share * (double)bytes / link.bytes_per_s;
}
