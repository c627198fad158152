/*
 * Blocks for checkpoints: each device's block of a parameter or state,
 * box by box (executor.h).
 */
#include "runtime/executor_impl.h"
#include "base/error.h"
#include "spmd/mesh.h"

#include <string.h>

bool executor_keeps(const spmd_program *p, const spmd_tensor *t)
{
    return p && p->dev && t && t->graph == p->c.g && ir_is_persistent(t) &&
           compiled_local(&p->c, t) != NULL;
}

/* The boxes of block b of t (any device's: they all have the same). */
static spmd_status block_pieces(const block *b, const spmd_tensor *t, int *pieces)
{
    *pieces = 1;
    for (int i = 0; i < b->rank; i++) {
        if (b->group[i] == b->ldims[i]) continue;
        /* A box per group, contiguous in the block, needs the grouped
         * dim to lead (the GPT's c_attn: 3*tensor on dim 0). */
        if (i > 0)
            return base_error(SPMD_ERR_UNSUPPORTED,
                              "block_of: '%s' is held in a grouped split on dim %d; checkpoints "
                              "take grouped splits on the first dim only", t->name, i);
        *pieces = (int)(b->ldims[i] / b->group[i]);
    }
    return SPMD_OK;
}

spmd_status executor_block_pieces(const spmd_program *p, const spmd_tensor *t, int *pieces)
{
    spmd_status st = executor_check_runnable(p, "block_of");
    if (st != SPMD_OK) return st;
    if (!t || !pieces) return base_error(SPMD_ERR_INVALID, "block_of: tensor or count is NULL");
    block b = exec_block_of(p, t, p->c.mesh ? p->c.mesh->ids[0] : 0);
    return block_pieces(&b, t, pieces);
}

spmd_status executor_block_of(const spmd_program *p, const spmd_tensor *t, int dev_index,
                              int piece, executor_block *out)
{
    spmd_status st = executor_check_runnable(p, "block_of");
    if (st != SPMD_OK) return st;
    if (!t || !out) return base_error(SPMD_ERR_INVALID, "block_of: tensor or block is NULL");
    if (!executor_keeps(p, t))
        return base_error(SPMD_ERR_INVALID,
                          "block_of: '%s' is not a parameter or state this program keeps",
                          t->name ? t->name : ir_op_name(t->op));
    if (dev_index < 0 || dev_index >= p->c.n_dev)
        return base_error(SPMD_ERR_INVALID, "block_of: device index %d, the program has %d",
                          dev_index, p->c.n_dev);
    exec_init_pending(p);
    /* A device of another process: where its block lies, not its data. */
    bool here = dev_index >= p->first && dev_index < p->first + p->n_local;
    const device *d = here ? &p->dev[dev_index - p->first] : NULL;
    int id = p->c.mesh ? p->c.mesh->ids[dev_index] : 0;
    block b = exec_block_of(p, t, id);
    int pieces;
    if ((st = block_pieces(&b, t, &pieces)) != SPMD_OK) return st;
    if (piece < 0 || piece >= pieces)
        return base_error(SPMD_ERR_INVALID, "block_of: piece %d of '%s', which has %d", piece,
                          t->name, pieces);
    memset(out, 0, sizeof *out);
    out->device = id;
    out->copy = p->c.mesh ? mesh_copy_of(p->c.mesh, dev_index) : 0;
    out->rank = b.rank;
    /* Only a tensor's home stage updates it (-1: every stage, as the
     * step count); the other stages' copies keep their first value. */
    int home = compiled_local(&p->c, t)->stage;
    out->off_stage = p->c.mesh && mesh_stage_axis(p->c.mesh) >= 0 && home >= 0 &&
                     mesh_stage_of(p->c.mesh, id) != home;
    size_t offset = 0;
    for (int i = 0; i < b.rank; i++) {
        out->start[i] = b.start[i];
        out->ldims[i] = b.ldims[i];
        out->valid[i] = b.valid[i];
    }
    if (pieces > 1) {
        /* Group `piece` of the leading dim: rows [piece * group, +group). */
        out->start[0] = piece * b.group_stride[0] + b.start[0];
        out->ldims[0] = out->valid[0] = b.group[0];
        offset = (size_t)(piece * b.group[0]) * (ir_nbytes(compiled_local(&p->c, t)) / (size_t)b.ldims[0]);
    }
    out->data = d ? (char *)data_of(d, compiled_local(&p->c, t)) + offset : NULL;
    return SPMD_OK;
}
