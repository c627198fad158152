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

static int64_t round_up(int64_t n) { return (n + ALIGN - 1) / ALIGN * ALIGN; }

/* ---- Free list --------------------------------------------------------------
 *
 * The free blocks of the arena, neighbours always merged.  A deep model
 * leaves thousands of them, so they are not scanned: each block sits in two
 * treaps (search trees kept balanced by a pseudo-random priority per slot),
 * one ordered by offset, to find a released block's neighbours and the
 * block at the end of the arena, and one by (size, offset), to find the
 * best fit: the smallest block that is large enough, the lowest offset
 * among equals.  Placement is the same as a scan of an offset-sorted list
 * would give, in O(log n) per step. */

enum { BY_OFFSET, BY_SIZE };

typedef struct block {
    int64_t offset, size;
    int child[2][2]; /* [order][left, right]; -1: none */
} block;

typedef struct freelist {
    block *slots;
    int root[2];   /* per order; -1: empty */
    int fresh;     /* slots[fresh..] were never used (left untouched: no page faults) */
    int unused;    /* first slot released for reuse, chained through child[0][0]; -1: none */
    int64_t end;   /* current arena size */
    uint64_t visits; /* free blocks looked at, for plan_free_block_visits */
} freelist;

#define LEFT(f, o, i) ((f)->slots[i].child[o][0])
#define RIGHT(f, o, i) ((f)->slots[i].child[o][1])

static _Thread_local uint64_t visits_done;

uint64_t plan_free_block_visits(void) { return visits_done; }

/* A fixed pseudo-random priority per slot: deterministic plans. */
static uint32_t priority(int i)
{
    uint32_t x = (uint32_t)i * 0x9E3779B1u;
    x ^= x >> 15;
    x *= 0x85EBCA77u;
    return x ^ (x >> 13);
}

/* Does slot a come before slot b in order o? */
static bool before(freelist *f, int o, int a, int b)
{
    const block *x = &f->slots[a], *y = &f->slots[b];
    f->visits++;
    if (o == BY_SIZE && x->size != y->size) return x->size < y->size;
    return x->offset < y->offset;
}

/* Split tree t into the blocks before slot k (*lo) and the rest (*hi). */
static void split(freelist *f, int o, int t, int k, int *lo, int *hi)
{
    if (t < 0) {
        *lo = *hi = -1;
    } else if (before(f, o, t, k)) {
        split(f, o, RIGHT(f, o, t), k, &RIGHT(f, o, t), hi);
        *lo = t;
    } else {
        split(f, o, LEFT(f, o, t), k, lo, &LEFT(f, o, t));
        *hi = t;
    }
}

/* Join trees a and b, every block of a before every block of b. */
static int join(freelist *f, int o, int a, int b)
{
    if (a < 0) return b;
    if (b < 0) return a;
    f->visits++;
    if (priority(a) > priority(b)) {
        RIGHT(f, o, a) = join(f, o, RIGHT(f, o, a), b);
        return a;
    }
    LEFT(f, o, b) = join(f, o, a, LEFT(f, o, b));
    return b;
}

static int insert(freelist *f, int o, int t, int k)
{
    if (t < 0 || priority(k) > priority(t)) {
        split(f, o, t, k, &LEFT(f, o, k), &RIGHT(f, o, k));
        return k;
    }
    if (before(f, o, k, t)) LEFT(f, o, t) = insert(f, o, LEFT(f, o, t), k);
    else RIGHT(f, o, t) = insert(f, o, RIGHT(f, o, t), k);
    return t;
}

static int erase(freelist *f, int o, int t, int k)
{
    if (t == k) return join(f, o, LEFT(f, o, k), RIGHT(f, o, k));
    if (before(f, o, k, t)) LEFT(f, o, t) = erase(f, o, LEFT(f, o, t), k);
    else RIGHT(f, o, t) = erase(f, o, RIGHT(f, o, t), k);
    return t;
}

static void tree_insert(freelist *f, int o, int k) { f->root[o] = insert(f, o, f->root[o], k); }
static void tree_erase(freelist *f, int o, int k) { f->root[o] = erase(f, o, f->root[o], k); }

/* A new free block, in neither tree yet.  There are never more free
 * blocks than released buffers, so the slots (one per node) suffice. */
static int new_block(freelist *f, int64_t offset, int64_t size)
{
    int k = f->unused;
    if (k >= 0) f->unused = f->slots[k].child[0][0];
    else k = f->fresh++;
    f->slots[k] = (block){offset, size, {{-1, -1}, {-1, -1}}};
    return k;
}

static void drop_block(freelist *f, int k)
{
    tree_erase(f, BY_OFFSET, k);
    tree_erase(f, BY_SIZE, k);
    f->slots[k].child[0][0] = f->unused;
    f->unused = k;
}

/* Best fit among free blocks; else grow the arena (extending a free block
 * that touches the end, so the arena does not grow needlessly). */
static int64_t take(freelist *f, int64_t size)
{
    int best = -1;
    for (int t = f->root[BY_SIZE]; t >= 0; f->visits++) {
        if (f->slots[t].size >= size) best = t, t = LEFT(f, BY_SIZE, t);
        else t = RIGHT(f, BY_SIZE, t);
    }
    if (best >= 0) {
        block *b = &f->slots[best];
        int64_t off = b->offset;
        if (b->size == size) {
            drop_block(f, best);
        } else {
            /* What is left keeps its place among its neighbours by offset. */
            tree_erase(f, BY_SIZE, best);
            b->offset += size;
            b->size -= size;
            tree_insert(f, BY_SIZE, best);
        }
        return off;
    }
    int last = f->root[BY_OFFSET];
    while (last >= 0 && RIGHT(f, BY_OFFSET, last) >= 0) {
        last = RIGHT(f, BY_OFFSET, last);
        f->visits++;
    }
    if (last >= 0 && f->slots[last].offset + f->slots[last].size == f->end) {
        int64_t off = f->slots[last].offset;
        drop_block(f, last);
        f->end = off + size;
        return off;
    }
    int64_t off = f->end;
    f->end += size;
    return off;
}

/* Release [offset, offset + size), merged with the free blocks it touches. */
static void give(freelist *f, int64_t offset, int64_t size)
{
    int prev = -1, next = -1;
    for (int t = f->root[BY_OFFSET]; t >= 0; f->visits++) {
        if (f->slots[t].offset < offset) prev = t, t = RIGHT(f, BY_OFFSET, t);
        else next = t, t = LEFT(f, BY_OFFSET, t);
    }
    int k;
    if (prev >= 0 && f->slots[prev].offset + f->slots[prev].size == offset) {
        k = prev; /* grows at its end: same offset, new size */
        tree_erase(f, BY_SIZE, k);
        f->slots[k].size += size;
    } else {
        k = new_block(f, offset, size);
        tree_insert(f, BY_OFFSET, k);
    }
    if (next >= 0 && f->slots[k].offset + f->slots[k].size == f->slots[next].offset) {
        f->slots[k].size += f->slots[next].size;
        drop_block(f, next);
    }
    tree_insert(f, BY_SIZE, k);
}

/* ---- Schedule and placement -------------------------------------------------- */

void plan_mark_needed(const spmd_graph *g, bool *needed)
{
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i]->is_output) needed[i] = true;
    for (int i = 0; i < g->n_updates; i++) {
        needed[g->updates[i].target->id] = true;
        needed[g->updates[i].value->id] = true;
    }
    ir_mark_inputs(g, needed, g->n_nodes - 1);
}

/* What node t reads when it runs: its group's inputs for a fused root. */
static int reads(const spmd_tensor *t, const fusion *fu, const spmd_tensor *const **in)
{
    const fuse_group *grp = fusion_group(fu, t);
    *in = grp ? grp->in : (const spmd_tensor *const *)t->in;
    return grp ? grp->n_in : t->n_in;
}

/* Gradient accumulators' new values, computed into the accumulators:
 * the accumulator's only reader is this sum (acc * keep + grad / K, built
 * by the optimizer), elementwise, its own storage, read by no view.  The
 * update phase then reads the accumulator's buffer itself. */
static void mark_in_place(plan *p, const spmd_graph *g)
{
    for (int i = 0; i < g->n_nodes; i++) p->in_place[i] = -1;
    for (int i = 0; i < g->n_updates; i++) {
        const spmd_tensor *v = g->updates[i].value, *acc = g->updates[i].target;
        if (acc->accumulator && p->needed[v->id] && ir_op_formula_arity(v->op) > 0 &&
            p->storage[v->id] == v->id && !v->is_output && ir_nbytes(v) == ir_nbytes(acc))
            p->in_place[v->id] = acc->id;
    }
    for (int i = 0; i < g->n_nodes; i++) /* a view of a value keeps it in the arena */
        if (p->needed[i] && p->storage[i] != i) p->in_place[p->storage[i]] = -1;
}

/* Update values that can trade buffers with their targets: computed,
 * their own storage (no view shares it), not outputs (a read after the
 * run would find the swapped-out old value), one update each, of the
 * target's bytes. */
static void mark_swapped(plan *p, const spmd_graph *g)
{
    for (int i = 0; i < g->n_updates; i++) {
        const spmd_tensor *v = g->updates[i].value;
        p->swapped[v->id] = p->needed[v->id] && !ir_op_is_leaf(v->op) && p->storage[v->id] == v->id &&
                            !v->is_output && ir_nbytes(v) == ir_nbytes(g->updates[i].target) &&
                            p->in_place[v->id] < 0;
    }
    for (int i = 0; i < g->n_nodes; i++) /* a view of a value keeps it in the arena */
        if (p->needed[i] && p->storage[i] != i) p->swapped[p->storage[i]] = false;
    for (int i = 0; i < g->n_updates; i++)
        for (int j = 0; j < i; j++)
            if (g->updates[i].value == g->updates[j].value) p->swapped[g->updates[i].value->id] = false;
    for (int i = 0; i < g->n_nodes; i++)
        if (p->swapped[i]) p->swapped_bytes += ir_nbytes(g->nodes[i]);
}

spmd_status plan_build(plan *p, const spmd_graph *g, const spmd_allocator *alloc, const fusion *fu)
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
    p->swapped = base_calloc(&p->alloc, nn * sizeof *p->swapped, "memory plan");
    p->in_place = base_alloc(&p->alloc, nn * sizeof *p->in_place, "memory plan");
    int *last_use = base_alloc(&p->alloc, nn * sizeof *last_use, "memory plan");
    block *slots = base_alloc(&p->alloc, (nn + 1) * sizeof *slots, "memory plan");
    if (!p->steps || !p->needed || !p->storage || !p->offset || !p->swapped || !p->in_place ||
        !last_use || !slots) {
        base_free(&p->alloc, last_use);
        base_free(&p->alloc, slots);
        plan_free(p);
        return SPMD_ERR_NOMEM;
    }
    freelist f = {slots, {-1, -1}, 0, -1, 0, 0};

    plan_mark_needed(g, p->needed);
    for (int i = 0; fu && fu->absorbed && i < n; i++)
        if (fu->absorbed[i]) p->needed[i] = false;
    for (int i = 0; i < n; i++) {
        const spmd_tensor *t = g->nodes[i];
        p->offset[i] = -1;
        p->storage[i] = i;
        /* A reshape of a computed tensor is a view: same bytes. */
        if (t->op == IR_RESHAPE && !ir_op_is_leaf(t->in[0]->op))
            p->storage[i] = p->storage[t->in[0]->id];
        /* A member a fused group stores has memory but no step of its own. */
        bool inside = fu && fu->stored && fu->stored[i];
        if (p->needed[i] && !ir_op_is_leaf(t->op) && !(t->op == IR_RESHAPE && p->storage[i] != i) && !inside)
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
        const spmd_tensor *const *in;
        int n_in = reads(t, fu, &in);
        for (int j = 0; j < n_in; j++) {
            int src = p->storage[in[j]->id];
            if (last_use[src] < i) last_use[src] = i;
        }
        if (t->is_output) last_use[s] = forever;
    }
    for (int i = 0; i < g->n_updates; i++) last_use[p->storage[g->updates[i].value->id]] = forever;
    mark_in_place(p, g);
    mark_swapped(p, g);

    /* Walk nodes in order: place each computed storage at its first
     * definition, release storages whose last reader is this node. */
    int64_t live = 0; /* arena bytes taken and not given back */
    for (int i = 0; i < n; i++) {
        const spmd_tensor *t = g->nodes[i];
        if (i == g->backward_begin && i > 0) p->held_bytes = (size_t)live;
        if (!p->needed[i] || ir_op_is_leaf(t->op)) continue;
        int s = p->storage[i];
        /* A value in a buffer of its own, or its target's, takes no
         * arena, but its inputs die here all the same (a gradient, into
         * its accumulator). */
        if (!p->swapped[i] && p->in_place[i] < 0 && s == i) live += round_up((int64_t)ir_nbytes(t));
        if (!p->swapped[i] && p->in_place[i] < 0)
            p->offset[i] = s == i ? take(&f, round_up((int64_t)ir_nbytes(t))) : p->offset[s];
        const spmd_tensor *const *in;
        int n_in = reads(t, fu, &in);
        for (int j = 0; j <= n_in; j++) {
            int src = j < n_in ? p->storage[in[j]->id] : s;
            if (last_use[src] != i || ir_op_is_leaf(g->nodes[src]->op) || p->offset[src] < 0 ||
                p->swapped[src] || p->in_place[src] >= 0)
                continue;
            /* Release once, even when a node reads the same tensor twice. */
            bool seen = false;
            for (int k = 0; k < j && !seen; k++) seen = p->storage[in[k]->id] == src;
            if (!seen) {
                give(&f, p->offset[src], round_up((int64_t)ir_nbytes(g->nodes[src])));
                live -= round_up((int64_t)ir_nbytes(g->nodes[src]));
            }
        }
    }
    p->arena_bytes = (size_t)f.end;
    visits_done += f.visits;
    base_free(&p->alloc, last_use);
    base_free(&p->alloc, slots);
    return SPMD_OK;
}

void plan_free(plan *p)
{
    base_free(&p->alloc, p->steps);
    base_free(&p->alloc, p->needed);
    base_free(&p->alloc, p->storage);
    base_free(&p->alloc, p->offset);
    base_free(&p->alloc, p->swapped);
    base_free(&p->alloc, p->in_place);
    memset(p, 0, sizeof *p);
}
