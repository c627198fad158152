/*
 * Schedule and liveness-based memory plan (see plan.h).
 *
 * Buffers are placed greedily in execution order: a step's output is
 * placed before the buffers that die at that step are released, so an
 * output never overlaps its own inputs (kernels are not in-place).
 */
#include "compile/plan.h"
#include "base/error.h"

#include <string.h>

enum { ALIGN = 64 };

typedef struct block {
    int64_t offset, size;
} block;

/* Free list of the arena, sorted by offset, with neighbours merged. */
typedef struct freelist {
    block *items;
    int n;
    int64_t end; /* current arena size */
} freelist;

static int64_t round_up(int64_t n) { return (n + ALIGN - 1) / ALIGN * ALIGN; }

/* Best fit among free blocks; else grow the arena (extending a free block
 * that touches the end, so the arena does not grow needlessly). */
static int64_t take(freelist *f, int64_t size)
{
    int best = -1;
    for (int i = 0; i < f->n; i++)
        if (f->items[i].size >= size && (best < 0 || f->items[i].size < f->items[best].size))
            best = i;
    if (best >= 0) {
        int64_t off = f->items[best].offset;
        f->items[best].offset += size;
        f->items[best].size -= size;
        if (f->items[best].size == 0) {
            memmove(&f->items[best], &f->items[best + 1], (size_t)(f->n - best - 1) * sizeof(block));
            f->n--;
        }
        return off;
    }
    if (f->n > 0 && f->items[f->n - 1].offset + f->items[f->n - 1].size == f->end) {
        int64_t off = f->items[f->n - 1].offset;
        f->end = off + size;
        f->n--;
        return off;
    }
    int64_t off = f->end;
    f->end += size;
    return off;
}

static void give(freelist *f, int64_t offset, int64_t size)
{
    int i = 0;
    while (i < f->n && f->items[i].offset < offset) i++;
    memmove(&f->items[i + 1], &f->items[i], (size_t)(f->n - i) * sizeof(block));
    f->items[i] = (block){offset, size};
    f->n++;
    if (i + 1 < f->n && f->items[i].offset + f->items[i].size == f->items[i + 1].offset) {
        f->items[i].size += f->items[i + 1].size;
        memmove(&f->items[i + 1], &f->items[i + 2], (size_t)(f->n - i - 2) * sizeof(block));
        f->n--;
    }
    if (i > 0 && f->items[i - 1].offset + f->items[i - 1].size == f->items[i].offset) {
        f->items[i - 1].size += f->items[i].size;
        memmove(&f->items[i], &f->items[i + 1], (size_t)(f->n - i - 1) * sizeof(block));
        f->n--;
    }
}

static void mark_needed(const spmd_graph *g, bool *needed)
{
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i]->is_output) needed[i] = true;
    for (int i = 0; i < g->n_updates; i++) {
        needed[g->updates[i].target->id] = true;
        needed[g->updates[i].value->id] = true;
    }
    ir_mark_inputs(g, needed, g->n_nodes - 1);
}

spmd_status plan_build(plan *p, const spmd_graph *g, const spmd_allocator *alloc)
{
    memset(p, 0, sizeof *p);
    p->alloc = base_allocator_or_default(alloc);
    int n = g->n_nodes;
    p->n_nodes = n;
    size_t nn = (size_t)(n ? n : 1);
    p->steps = base_alloc(&p->alloc, nn * sizeof *p->steps, "schedule");
    p->needed = base_calloc(&p->alloc, nn * sizeof *p->needed, "schedule");
    p->storage = base_alloc(&p->alloc, nn * sizeof *p->storage, "memory plan");
    p->offset = base_alloc(&p->alloc, nn * sizeof *p->offset, "memory plan");
    int *last_use = base_alloc(&p->alloc, nn * sizeof *last_use, "memory plan");
    freelist f = {base_alloc(&p->alloc, (nn + 1) * sizeof(block), "memory plan"), 0, 0};
    if (!p->steps || !p->needed || !p->storage || !p->offset || !last_use || !f.items) {
        base_free(&p->alloc, last_use);
        base_free(&p->alloc, f.items);
        plan_free(p);
        return SPMD_ERR_NOMEM;
    }

    mark_needed(g, p->needed);
    for (int i = 0; i < n; i++) {
        const spmd_tensor *t = g->nodes[i];
        p->offset[i] = -1;
        p->storage[i] = i;
        /* A reshape of a computed tensor is a view: same bytes. */
        if (t->op == IR_RESHAPE && !ir_op_is_leaf(t->in[0]->op))
            p->storage[i] = p->storage[t->in[0]->id];
        if (p->needed[i] && !ir_op_is_leaf(t->op) && !(t->op == IR_RESHAPE && p->storage[i] != i))
            p->steps[p->n_steps++] = (spmd_tensor *)t;
    }

    /* Last step at which each storage is read; outputs and update values
     * live to the end. */
    const int forever = n;
    for (int i = 0; i < n; i++) last_use[i] = -1;
    for (int i = 0; i < n; i++) {
        const spmd_tensor *t = g->nodes[i];
        if (!p->needed[i]) continue;
        int s = p->storage[i];
        if (last_use[s] < i) last_use[s] = i;
        for (int j = 0; j < t->n_in; j++) {
            int src = p->storage[t->in[j]->id];
            if (last_use[src] < i) last_use[src] = i;
        }
        if (t->is_output) last_use[s] = forever;
    }
    for (int i = 0; i < g->n_updates; i++) last_use[p->storage[g->updates[i].value->id]] = forever;

    /* Walk nodes in order: place each computed storage at its first
     * definition, release storages whose last reader is this node. */
    for (int i = 0; i < n; i++) {
        const spmd_tensor *t = g->nodes[i];
        if (!p->needed[i] || ir_op_is_leaf(t->op)) continue;
        int s = p->storage[i];
        if (s == i) p->offset[i] = take(&f, round_up((int64_t)ir_nbytes(t)));
        else p->offset[i] = p->offset[s];
        for (int j = 0; j <= t->n_in; j++) {
            int src = j < t->n_in ? p->storage[t->in[j]->id] : s;
            if (last_use[src] != i || ir_op_is_leaf(g->nodes[src]->op) || p->offset[src] < 0)
                continue;
            /* Release once, even when a node reads the same tensor twice. */
            bool seen = false;
            for (int k = 0; k < j && !seen; k++) seen = p->storage[t->in[k]->id] == src;
            if (!seen) give(&f, p->offset[src], round_up((int64_t)ir_nbytes(g->nodes[src])));
        }
    }
    p->arena_bytes = (size_t)f.end;
    base_free(&p->alloc, last_use);
    base_free(&p->alloc, f.items);
    return SPMD_OK;
}

void plan_free(plan *p)
{
    base_free(&p->alloc, p->steps);
    base_free(&p->alloc, p->needed);
    base_free(&p->alloc, p->storage);
    base_free(&p->alloc, p->offset);
    memset(p, 0, sizeof *p);
}
