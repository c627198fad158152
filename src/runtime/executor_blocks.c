/*
 * A device's block of a global tensor: where it lies, and the copies
 * between a whole tensor and this process's blocks of it.
 */
#include "runtime/executor_impl.h"

#include <string.h>

block exec_block_of(const spmd_program *p, const spmd_tensor *t, int dev)
{
    block b = {.rank = t->rank};
    const spmd_tensor *lt = p->c.partitioned ? p->c.part.local_of[t->id] : t;
    for (int i = 0; i < t->rank; i++) {
        const sharding *held = p->c.partitioned ? &p->c.part.held[t->id] : NULL;
        int64_t groups = held ? mesh_axes_groups(&held->dim[i]) : 1;
        b.gdims[i] = t->dims[i];
        b.ldims[i] = lt->dims[i];
        b.group[i] = lt->dims[i] / groups;
        b.group_stride[i] = t->dims[i] / groups;
        b.start[i] = held ? sharding_block_index(held, p->c.mesh, i, dev) * b.group[i] : 0;
        int64_t v = groups > 1 ? b.ldims[i] : b.gdims[i] - b.start[i];
        b.valid[i] = v < 0 ? 0 : v > b.ldims[i] ? b.ldims[i] : v;
    }
    return b;
}

int64_t exec_block_global(const block *b, int d, int64_t i)
{
    int64_t j = b->first[d] + i;
    if (j >= b->valid[d]) return -1;
    return j / b->group[d] * b->group_stride[d] + b->start[d] + j % b->group[d];
}

void exec_for_rows(const block *b, row_fn fn, void *ctx)
{
    int r = b->rank;
    if (r == 0) {
        fn(ctx, 0, 0, 1, 0);
        return;
    }
    int64_t rows = 1;
    for (int i = 0; i < r - 1; i++) rows *= b->ldims[i];
    int64_t last = b->ldims[r - 1];
    for (int64_t row = 0; row < rows; row++) {
        /* Local multi-index of the row -> global offset, or padding. */
        int64_t rest = row, goff = 0, gstride = b->gdims[r - 1];
        bool pad = false;
        for (int i = r - 2; i >= 0; i--) {
            int64_t g = exec_block_global(b, i, rest % b->ldims[i]);
            rest /= b->ldims[i];
            if (g < 0) pad = true;
            goff += g * gstride;
            gstride *= b->gdims[i];
        }
        if (pad) {
            fn(ctx, row * last, 0, 0, last);
            continue;
        }
        /* The row's runs end at group boundaries and at the padding. */
        for (int64_t i = 0; i < last;) {
            int64_t g = exec_block_global(b, r - 1, i);
            if (g < 0) {
                fn(ctx, row * last + i, 0, 0, last - i);
                break;
            }
            int64_t j = b->first[r - 1] + i;
            int64_t end = (j / b->group[r - 1] + 1) * b->group[r - 1];
            if (end > b->valid[r - 1]) end = b->valid[r - 1];
            int64_t n = end - j < last - i ? end - j : last - i;
            fn(ctx, row * last + i, goff + g, n, 0);
            i += n;
        }
    }
}

void exec_copy_row(void *ctx, int64_t local, int64_t global, int64_t n, int64_t pad)
{
    copy_ctx *c = ctx;
    char *l = c->local + (size_t)local * c->es, *g = c->global + (size_t)global * c->es;
    if (c->to_local) {
        memcpy(l, g, (size_t)n * c->es);
        memset(l + (size_t)n * c->es, 0, (size_t)pad * c->es);
    } else {
        memcpy(g, l, (size_t)n * c->es);
    }
}

/* Only this process's blocks (of copy `copy`; -1: of every copy): reads
 * only the rows of `src` they cover. */
void exec_scatter(spmd_program *p, const spmd_tensor *t, const void *src, int copy)
{
    for (int d = 0; d < p->n_local; d++) {
        if (copy >= 0 && p->dev[d].copy != copy) continue;
        const spmd_tensor *lt = p->c.partitioned ? p->c.part.local_of[t->id] : t;
        if (!exec_on_stage(&p->dev[d], lt)) continue; /* its stage's devices hold it */
        block b = exec_block_of(p, t, p->dev[d].id);
        copy_ctx c = {p->dev[d].leaf_data[lt->id], (char *)src, spmd_dtype_size(t->dtype), true};
        exec_for_rows(&b, exec_copy_row, &c);
    }
    exec_note_leaf_written(p, t, copy);
}

void exec_assemble(const spmd_program *p, const spmd_tensor *t, void *dst, int copy)
{
    for (int d = 0; d < p->n_local; d++) {
        if (p->dev[d].copy != copy) continue;
        const spmd_tensor *lt = p->c.partitioned ? p->c.part.local_of[t->id] : t;
        if (!exec_on_stage(&p->dev[d], lt)) continue; /* its stage's devices hold it */
        block b = exec_block_of(p, t, p->dev[d].id);
        copy_ctx c = {data_of(&p->dev[d], lt), dst, spmd_dtype_size(t->dtype), false};
        exec_for_rows(&b, exec_copy_row, &c);
    }
}
