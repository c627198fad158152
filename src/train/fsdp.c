/*
 * The FSDP wrapper, with PyTorch/XLA FSDPv2's behaviour: parameters are
 * sharded over one mesh axis on their largest dimension, the batch over
 * the data axes, and propagation does the rest (each weight all-gathered
 * before use, its gradient reduce-scattered, the optimizer state sharded
 * like it: ZeRO-3).  Marks the user already made are kept.
 */
#include "spmd/train.h"
#include "base/error.h"
#include "ir/ir.h"
#include "mesh/mesh.h"

#include <stdio.h>
#include <string.h>

/* "None, axis, None" with the axis on dim d; "" for rank 0. */
static void dim_spec(int rank, int d, const char *axis, char *buf, size_t size)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < rank && n < size; i++)
        n += (size_t)snprintf(buf + n, size - n, "%s%s", i ? ", " : "", i == d ? axis : "None");
}

spmd_status spmd_fsdp_wrap(spmd_graph *g, const spmd_mesh *m, const char *axis,
                           spmd_tensor *const *inputs, int n, const char *data_axes)
{
    if (!g || !m || !axis) return base_error(SPMD_ERR_INVALID, "fsdp: graph, mesh or axis is NULL");
    int a = spmd_mesh_axis_index(m, axis);
    if (a < 0) return SPMD_ERR_INVALID; /* the message names the axis and the mesh's axes */
    int size = spmd_mesh_axis_size(m, a);
    char spec[256];
    for (int i = 0; i < g->n_nodes; i++) {
        spmd_tensor *t = g->nodes[i];
        if (t->op != IR_PARAM || t->mark) continue;
        /* The largest dim that every device gets a piece of. */
        int best = -1;
        for (int d = 0; d < t->rank; d++)
            if (t->dims[d] >= size && (best < 0 || t->dims[d] > t->dims[best])) best = d;
        if (best < 0) continue;
        dim_spec(t->rank, best, axis, spec, sizeof spec);
        spmd_status st = spmd_mark_sharding(g, t, m, spec);
        if (st != SPMD_OK) return st;
    }
    return spmd_shard_batch(g, m, inputs, n, data_axes);
}

spmd_status spmd_shard_batch(spmd_graph *g, const spmd_mesh *m, spmd_tensor *const *inputs, int n,
                             const char *data_axes)
{
    if (!g || !m || (n > 0 && !inputs))
        return base_error(SPMD_ERR_INVALID, "shard_batch: graph, mesh or inputs is NULL");
    /* "(a, b)": every axis name fits (MESH_MAX_AXES names of MESH_MAX_NAME). */
    char batch[MESH_MAX_AXES * (MESH_MAX_NAME + 2) + 8];
    size_t k = 0;
    if (data_axes) {
        k = (size_t)snprintf(batch, sizeof batch, "(%s)", data_axes);
    } else {
        /* Every axis but the independent ones (each copy has its own batch)
         * and the stage axis (every stage sees the same micro-batches). */
        k = (size_t)snprintf(batch, sizeof batch, "(");
        for (int i = 0, named = 0; i < spmd_mesh_rank(m) && k < sizeof batch; i++) {
            if (mesh_axis_holds_no_split(m, i)) continue;
            k += (size_t)snprintf(batch + k, sizeof batch - k, "%s%s", named++ ? ", " : "",
                                  spmd_mesh_axis_name(m, i));
        }
        if (k < sizeof batch) k += (size_t)snprintf(batch + k, sizeof batch - k, ")");
    }
    if (k >= sizeof batch)
        return base_error(SPMD_ERR_INVALID, "shard_batch: data axes '%.40s...' are too long",
                          data_axes ? data_axes : batch);
    for (int j = 0; j < n; j++) {
        spmd_tensor *t = inputs[j];
        /* A NULL from a failed builder: report that failure. */
        if (!t && ir_graph_status(g) != SPMD_OK) return ir_error_raise(g);
        if (!t) return base_error(SPMD_ERR_INVALID, "shard_batch: input %d is NULL", j);
        if (t->mark || t->rank == 0 || !strcmp(batch, "()")) continue;
        /* "(a, b), None, None": the batch then whole dims. */
        char spec[sizeof batch + 8 * SPMD_MAX_RANK];
        size_t len = (size_t)snprintf(spec, sizeof spec, "%s", batch);
        for (int d = 1; d < t->rank; d++) len += (size_t)snprintf(spec + len, sizeof spec - len, ", None");
        spmd_status st = spmd_mark_sharding(g, t, m, spec);
        if (st != SPMD_OK) return st;
    }
    return SPMD_OK;
}
