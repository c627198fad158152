/*
 * Which device writes (or reads) which block of each persistent tensor
 * (train/checkpoint.h).  A block several devices hold, replicated over
 * some mesh axes, is read on load by the first of them in mesh order and
 * written on save by the holder the balance below picks.  On pipeline
 * stages only the devices of a tensor's home stage hold it.
 */
#include "train/checkpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/arena.h"
#include "base/error.h"
#include "ir/ir.h"

int64_t ckpt_volume(int rank, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < rank; i++) n *= shape[i];
    return n;
}

const char *ckpt_shape_str(int rank, const int64_t *shape, char *buf, size_t size)
{
    size_t n = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < rank && n < size; i++)
        n += (size_t)snprintf(buf + n, size - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (n < size) snprintf(buf + n, size - n, "]");
    return buf;
}

/* Where a device's block sits among the tensor's blocks: its block index
 * per dim, row-major over the nonempty blocks per dim.  Blocks of one
 * tensor all have the same local dims, so the start says which it is. */
/* Boxes of a grouped block (pieces > 1) count within their group. */
static int64_t block_key(const spmd_tensor *t, const executor_block *b, int pieces)
{
    int64_t key = 0;
    for (int i = 0; i < t->rank; i++) {
        int64_t dim = i == 0 ? t->dims[0] / pieces : t->dims[i];
        int64_t per_dim = (dim + b->ldims[i] - 1) / b->ldims[i];
        key = key * per_dim + b->start[i] % dim / b->ldims[i];
    }
    return key;
}

static int64_t key_count(const spmd_tensor *t, const executor_block *b, int pieces)
{
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++) {
        int64_t dim = i == 0 ? t->dims[0] / pieces : t->dims[i];
        n *= (dim + b->ldims[i] - 1) / b->ldims[i];
    }
    return n;
}

/* Add tensor ti's distinct blocks; `first` has room for n_dev entries. */
static spmd_status add_tensor_blocks(ckpt_layout *l, int ti, int *first, int copy, const char *what)
{
    const spmd_tensor *t = l->tensors[ti];
    int piece = l->piece[ti], pieces = l->pieces[ti];
    for (int d = 0; d < l->n_dev; d++) l->held[ti * l->n_dev + d] = -1;
    if (ckpt_volume(t->rank, t->dims) == 0) return SPMD_OK;
    executor_block b;
    spmd_status st = executor_block_of(l->p, t, 0, piece, &b);
    if (st != SPMD_OK) return st;
    /* Every nonempty block is some device's, so there are at most n_dev. */
    int64_t keys = key_count(t, &b, pieces);
    if (keys > l->n_dev)
        return base_error(SPMD_ERR_INTERNAL, "%s: '%s' has %lld blocks on %d devices", what,
                          t->name, (long long)keys, l->n_dev);
    for (int64_t k = 0; k < keys; k++) first[k] = -1;
    for (int d = 0; d < l->n_dev; d++) {
        if (d > 0 && (st = executor_block_of(l->p, t, d, piece, &b)) != SPMD_OK) return st;
        if (ckpt_volume(b.rank, b.valid) == 0) continue; /* all padding */
        if (b.off_stage) continue;                       /* never updated there */
        if (copy >= 0 && b.copy != copy) continue;       /* another model's */
        int64_t key = block_key(t, &b, pieces);
        if (first[key] < 0) {
            if (!base_grow(l->alloc, (void **)&l->blocks, &l->cap_blocks, l->n_blocks + 1,
                           sizeof *l->blocks, 64, "checkpoint blocks"))
                return SPMD_ERR_NOMEM;
            first[key] = l->n_blocks;
            size_t es = spmd_dtype_size(t->dtype);
            l->blocks[l->n_blocks++] = (ckpt_block){
                .tensor = ti,
                .dev_index = d,
                .b = b,
                .writer = d,
                .writer_device = b.device,
                .writer_data = b.data,
                .bytes = (uint64_t)ckpt_volume(b.rank, b.valid) * es,
                .padded = (uint64_t)ckpt_volume(b.rank, b.ldims) * es};
        }
        l->held[ti * l->n_dev + d] = first[key];
    }
    return SPMD_OK;
}

typedef struct sized {
    uint64_t bytes;
    int block;
} sized;

static int larger_first(const void *a, const void *b)
{
    const sized *x = a, *y = b;
    if (x->bytes != y->bytes) return x->bytes < y->bytes ? 1 : -1;
    return (x->block > y->block) - (x->block < y->block);
}

/* by_size, and each block's writer: largest first, to the holder with the
 * fewest bytes so far (ties: the first in mesh order). */
static spmd_status assign_writers(ckpt_layout *l)
{
    size_t nb = (size_t)(l->n_blocks ? l->n_blocks : 1);
    l->by_size = base_alloc(l->alloc, nb * sizeof *l->by_size, "checkpoint blocks");
    sized *order = base_alloc(l->alloc, nb * sizeof *order, "checkpoint blocks");
    uint64_t *share = base_calloc(l->alloc, (size_t)l->n_dev * sizeof *share, "checkpoint blocks");
    spmd_status st = l->by_size && order && share ? SPMD_OK : SPMD_ERR_NOMEM;
    for (int k = 0; st == SPMD_OK && k < l->n_blocks; k++)
        order[k] = (sized){l->blocks[k].bytes, k};
    if (st == SPMD_OK && l->n_blocks > 1)
        qsort(order, (size_t)l->n_blocks, sizeof *order, larger_first);
    for (int i = 0; st == SPMD_OK && i < l->n_blocks; i++) {
        int k = order[i].block;
        ckpt_block *blk = &l->blocks[k];
        l->by_size[i] = k;
        const int *held = &l->held[blk->tensor * l->n_dev];
        int best = -1;
        for (int d = blk->dev_index; d < l->n_dev; d++)
            if (held[d] == k && (best < 0 || share[d] < share[best])) best = d;
        share[best] += blk->bytes;
        if (best == blk->writer) continue;
        executor_block b;
        if ((st = executor_block_of(l->p, l->tensors[blk->tensor], best, l->piece[blk->tensor], &b)) !=
            SPMD_OK)
            break;
        blk->writer = best;
        blk->writer_device = b.device;
        blk->writer_data = b.data;
    }
    base_free(l->alloc, order);
    base_free(l->alloc, share);
    return st;
}

/* What a checkpoint holds: what the program keeps, but for gradient
 * accumulators (a sum in progress, started afresh by every step). */
static bool saved(const spmd_program *p, const spmd_tensor *t)
{
    return executor_keeps(p, t) && !t->accumulator;
}

spmd_status ckpt_layout_build(const spmd_program *p, int copy, ckpt_layout *l, const char *what)
{
    memset(l, 0, sizeof *l);
    const compiled *c = executor_compiled(p);
    l->p = p;
    l->alloc = &c->g->alloc;
    l->n_dev = spmd_program_devices(p);
    const spmd_graph *g = c->g;
    spmd_status st = SPMD_OK;
    for (int i = 0; st == SPMD_OK && i < g->n_nodes; i++) {
        int pieces = 0;
        if (saved(p, g->nodes[i])) st = executor_block_pieces(p, g->nodes[i], &pieces);
        l->n_tensors += pieces;
    }
    if (st != SPMD_OK) return st;
    size_t nt = (size_t)(l->n_tensors ? l->n_tensors : 1), nd = (size_t)l->n_dev;
    l->tensors = base_alloc(l->alloc, nt * sizeof *l->tensors, "checkpoint tensors");
    l->piece = base_alloc(l->alloc, nt * sizeof *l->piece, "checkpoint tensors");
    l->pieces = base_alloc(l->alloc, nt * sizeof *l->pieces, "checkpoint tensors");
    l->held = base_alloc(l->alloc, nt * nd * sizeof *l->held, "checkpoint blocks");
    int *first = base_alloc(l->alloc, nd * sizeof *first, "checkpoint blocks");
    st = l->tensors && l->piece && l->pieces && l->held && first ? SPMD_OK : SPMD_ERR_NOMEM;
    int n = 0;
    for (int i = 0; st == SPMD_OK && i < g->n_nodes; i++) {
        int pieces = 0;
        if (saved(p, g->nodes[i])) st = executor_block_pieces(p, g->nodes[i], &pieces);
        for (int k = 0; k < pieces; k++, n++) {
            l->tensors[n] = g->nodes[i];
            l->piece[n] = k;
            l->pieces[n] = pieces;
        }
    }
    for (int ti = 0; st == SPMD_OK && ti < l->n_tensors; ti++)
        st = add_tensor_blocks(l, ti, first, copy, what);
    base_free(l->alloc, first);
    if (st == SPMD_OK) st = assign_writers(l);
    if (st != SPMD_OK) ckpt_layout_free(l);
    return st;
}

void ckpt_layout_free(ckpt_layout *l)
{
    if (!l->alloc) return;
    base_free(l->alloc, l->tensors);
    base_free(l->alloc, l->piece);
    base_free(l->alloc, l->pieces);
    base_free(l->alloc, l->blocks);
    base_free(l->alloc, l->held);
    base_free(l->alloc, l->by_size);
    memset(l, 0, sizeof *l);
}

spmd_status ckpt_box_runs(int rank, const int64_t *ext, const int64_t *adims, const int64_t *aorg,
                          const int64_t *bdims, const int64_t *borg, ckpt_run_fn fn, void *ctx)
{
    if (rank == 0) return fn(ctx, 0, 0, 1);
    if (ckpt_volume(rank, ext) == 0) return SPMD_OK;
    /* Dims [outer, rank) form one run: each after the first is whole in
     * the box and in both arrays. */
    int outer = rank - 1;
    int64_t run = ext[rank - 1];
    while (outer > 0 && ext[outer] == adims[outer] && ext[outer] == bdims[outer]) {
        outer--;
        run *= ext[outer];
    }
    int64_t idx[SPMD_MAX_RANK] = {0};
    for (;;) {
        int64_t a = 0, b = 0;
        for (int i = 0; i < rank; i++) {
            a = a * adims[i] + aorg[i] + idx[i];
            b = b * bdims[i] + borg[i] + idx[i];
        }
        spmd_status st = fn(ctx, a, b, run);
        if (st != SPMD_OK) return st;
        /* Next index over the dims before `outer` (odometer). */
        int i = outer - 1;
        while (i >= 0 && ++idx[i] == ext[i]) idx[i--] = 0;
        if (i < 0) return SPMD_OK;
    }
}
