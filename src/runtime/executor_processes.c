/*
 * Reading across processes: over MPI a tensor's blocks may live in other
 * processes, which send them.
 */
#include "runtime/executor_impl.h"
#include "spmd/mesh.h"

#include <string.h>

/* The mesh axes t is held split over. */
static uint32_t split_axes(const spmd_program *p, const spmd_tensor *t)
{
    const sharding *s = &p->c.part.held[t->id];
    uint32_t mask = 0;
    for (int i = 0; i < s->rank; i++) mask |= mesh_axes_mask(&s->dim[i]);
    return mask;
}

/* Whether some of t's blocks live only in other processes.  Every
 * process decides alike (from the layout, not from what it holds), so
 * all of them take the same path in spmd_program_read.  With copies a
 * copy's devices may all be elsewhere: that path always. */
bool exec_spread_over_processes(const spmd_program *p, const spmd_tensor *t)
{
    if (p->processes == 1 || !p->c.partitioned) return false;
    if (p->copies > 1) return true;
    uint32_t mask = split_axes(p, t);
    /* A value placed on a stage is held by that stage's devices only. */
    int stage_axis = mesh_stage_axis(p->c.mesh);
    const spmd_tensor *lt = p->c.part.local_of[t->id];
    if (stage_axis >= 0 && lt && lt->stage >= 0) mask |= 1u << stage_axis;
    for (int a = 0; a < p->c.mesh->rank; a++)
        if ((mask >> a & 1) && mesh_axis_crosses(p->c.mesh, a, p->n_local)) return true;
    return false;
}

/* The device at mesh position pos holds its block of copy `copy` first
 * (lowest position in the copy): its coordinates off the split and
 * independent axes are all 0 (on the stage axis, a value placed on a
 * stage: that stage), and it is in the copy. */
static bool first_holder(const spmd_mesh *m, uint32_t split, int pos, int copy, int stage)
{
    if (mesh_copy_of(m, pos) != copy) return false;
    for (int a = m->rank - 1; a >= 0; a--) {
        int want = m->stage[a] && stage >= 0 ? stage : 0;
        if (!(split >> a & 1) && !m->independent[a] && pos % m->shape[a] != want) return false;
        pos /= m->shape[a];
    }
    return true;
}

/* Every process sends the blocks whose first holder it runs, in mesh
 * order; all of them receive everything and copy each block into place. */
spmd_status exec_assemble_across(const spmd_program *p, const spmd_tensor *t, void *dst, int copy)
{
    const spmd_mesh *m = p->c.mesh;
    const spmd_tensor *lt = p->c.part.local_of[t->id];
    size_t block_bytes = ir_nbytes(lt), es = spmd_dtype_size(t->dtype);
    uint32_t split = split_axes(p, t);
    spmd_allocator a = p->alloc;
    int64_t *bytes_of = base_calloc(&a, (size_t)p->processes * sizeof *bytes_of, "read");
    if (!bytes_of) return SPMD_ERR_NOMEM;
    int64_t total = 0;
    for (int pos = 0; pos < p->c.n_dev; pos++) {
        if (!first_holder(m, split, pos, copy, lt->stage)) continue;
        bytes_of[pos / p->n_local] += (int64_t)block_bytes;
        total += (int64_t)block_bytes;
    }
    unsigned char *mine = base_alloc(&a, (size_t)bytes_of[p->process] + 1, "read");
    unsigned char *all = base_alloc(&a, (size_t)total + 1, "read");
    spmd_status st = mine && all ? SPMD_OK : SPMD_ERR_NOMEM;
    size_t at = 0;
    for (int d = 0; st == SPMD_OK && d < p->n_local; d++) {
        if (!first_holder(m, split, p->first + d, copy, lt->stage)) continue;
        memcpy(mine + at, data_of(&p->dev[d], lt), block_bytes);
        at += block_bytes;
    }
    if (st == SPMD_OK) st = coll_world_gather_processes(p->world, mine, all, bytes_of);
    at = 0;
    for (int pos = 0; st == SPMD_OK && pos < p->c.n_dev; pos++) {
        if (!first_holder(m, split, pos, copy, lt->stage)) continue;
        block b = exec_block_of(p, t, m->ids[pos]);
        copy_ctx c = {(char *)all + at, dst, es, false};
        exec_for_rows(&b, exec_copy_row, &c);
        at += block_bytes;
    }
    base_free(&a, mine);
    base_free(&a, all);
    base_free(&a, bytes_of);
    return st;
}

spmd_status executor_gather_processes(const spmd_program *p, const void *in, void *out,
                                      int64_t bytes_each)
{
    if (p->processes == 1) {
        memcpy(out, in, (size_t)bytes_each);
        return SPMD_OK;
    }
    spmd_allocator a = p->alloc;
    int64_t *bytes_of = base_alloc(&a, (size_t)p->processes * sizeof *bytes_of, "gather");
    if (!bytes_of) return SPMD_ERR_NOMEM;
    for (int q = 0; q < p->processes; q++) bytes_of[q] = bytes_each;
    spmd_status st = coll_world_gather_processes(p->world, in, out, bytes_of);
    base_free(&a, bytes_of);
    return st;
}
