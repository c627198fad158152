/*
 * Schedule and liveness-based memory plan (see plan.h).
 *
 * Buffers are placed greedily in execution order: a step's output is
 * placed before the buffers that die at that step are released, so an
 * output never overlaps its own inputs (kernels are not in-place).
 */
#include "compile/plan.h"
#include "base/error.h"

#include <stdint.h>
#include <stdlib.h>
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
    int64_t live;    /* bytes taken and not given back */
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
    f->live += size;
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
    f->live -= size;
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

/* The dims of t before `dim` are all 1: each block along `dim` is one
 * run of t's bytes. */
static bool runs_along(const spmd_tensor *t, int dim)
{
    for (int k = 0; k < dim; k++)
        if (t->dims[k] != 1) return false;
    return true;
}

static _Thread_local bool views_off; /* plan_test_views(false) */

void plan_test_views(bool on) { views_off = !on; }

/* A slice whose block is one run of its source's bytes is a view of the
 * source instead of a copy, where the source is a parameter or state: the
 * update phase writes those only after every device finished its
 * schedule, so every reader during the run (a kernel, a collective in
 * flight, a peer's copy from it) sees what a copy made during the run
 * would hold.  One run: the dims before the split dim are all 1, and no
 * member's block has padding (exact), which the kernel would zero.  Not
 * an accumulator (written in place during the run), not an output or an
 * update value (read after the update phase has written the leaf). */
static void mark_views(plan *p, const spmd_graph *g)
{
    for (int i = 0; i < g->n_nodes; i++) p->view_of[i] = -1;
    if (views_off) return;
    for (int i = 0; i < g->n_nodes; i++) {
        const spmd_tensor *t = g->nodes[i];
        if (t->op != IR_SHARD_SLICE || !p->needed[i] || t->is_output || !t->attr.coll.exact) continue;
        const spmd_tensor *x = t->in[0];
        int d = t->attr.coll.dim;
        if ((x->op != IR_PARAM && x->op != IR_STATE) || x->accumulator ||
            x->dims[d] != t->attr.coll.global)
            continue;
        if (runs_along(t, d)) p->view_of[i] = x->id;
    }
    for (int i = 0; i < g->n_updates; i++) p->view_of[g->updates[i].value->id] = -1;
    for (int i = 0; i < g->n_nodes; i++) p->n_views += p->view_of[i] >= 0;
}

/* An all-gather of a shared parameter need not copy where its result is
 * the whole buffer the devices' blocks lie side by side in: gathered
 * along the split dim, whose dims before it are 1 (a block is a run of
 * the buffer), over a group of as many devices as the leaf has blocks.
 * With padding too: the buffer holds every block whole, as the gather
 * does.  The buffer is written only in the update phase, after every
 * device finished its schedule, so every reader sees what a copy would
 * hold.  Not an output or an update value (read after the update).  Run
 * before fusion drops absorbed nodes from `needed`. */
static void mark_gathers(plan *p, const spmd_graph *g, const plan_sharing *sh)
{
    for (int i = 0; i < g->n_nodes; i++) p->gather_leaf[i] = -1;
    if (!sh) return;
    for (int i = 0; i < g->n_nodes; i++) {
        const spmd_tensor *t = g->nodes[i], *x = t->in[0];
        if (t->op != IR_ALL_GATHER || !p->needed[i] || t->is_output || x->op != IR_PARAM ||
            sh->blocks[x->id] < 1 || sh->group_size[t->attr.coll.spec] != sh->blocks[x->id] ||
            !runs_along(x, t->attr.coll.dim))
            continue;
        p->gather_leaf[i] = x->id;
    }
    for (int i = 0; i < g->n_updates; i++) p->gather_leaf[g->updates[i].value->id] = -1;
    for (int i = 0; i < g->n_nodes; i++) p->n_gathers_in_place += p->gather_leaf[i] >= 0;
}

/* Held outside the arena, with no step: a leaf, a view of one, a
 * gather read in place, or one that lands in place. */
static bool outside(const plan *p, const spmd_tensor *t)
{
    return ir_op_is_leaf(t->op) || p->view_of[t->id] >= 0 || p->gather_leaf[t->id] >= 0 ||
           p->lands_in[t->id] >= 0;
}

/* ZeRO's update of a shared parameter or state: the value is the
 * all-gather of each member's new slice, and the target's buffer is the
 * one its sharers hold.  The gather need not run: in the update phase
 * each member writes its slice where the gather would have put it, in
 * the target's block, and the members of the group are exactly the
 * block's sharers, so every byte is written once.  The gather along a
 * dim whose dims before it are 1 (a slice is a run of the block), its
 * value read by nothing else, its operand computed in the arena (it then
 * lives to the end). */
static void mark_lands(plan *p, const spmd_graph *g, const plan_sharing *sh)
{
    for (int i = 0; i < g->n_nodes; i++) p->lands_in[i] = -1;
    if (!sh) return;
    for (int u = 0; u < g->n_updates; u++) {
        const spmd_tensor *v = g->updates[u].value, *x = g->updates[u].target;
        if (v->op != IR_ALL_GATHER || !p->needed[v->id] || v->is_output || x->accumulator ||
            sh->blocks[x->id] < 1 || sh->sharers[x->id] != sh->group_size[v->attr.coll.spec] ||
            !runs_along(v, v->attr.coll.dim) || outside(p, v->in[0]) || v->in[0]->op == IR_RESHAPE ||
            ir_nbytes(v) != ir_nbytes(x))
            continue;
        p->lands_in[v->id] = x->id;
    }
    for (int u = 0; u < g->n_updates; u++) /* its operand is no update's value */
        for (int w = 0; w < g->n_updates; w++)
            if (g->updates[w].value == g->updates[u].value->in[0]) p->lands_in[g->updates[u].value->id] = -1;
    for (int i = 0; i < g->n_nodes; i++) {
        const spmd_tensor *t = g->nodes[i];
        for (int j = 0; j < t->n_in; j++) /* read by a node, even one a group absorbed */
            if (p->lands_in[t->in[j]->id] >= 0) p->lands_in[t->in[j]->id] = -1;
    }
    for (int i = 0; i < g->n_nodes; i++) p->n_lands += p->lands_in[i] >= 0;
}

/* Update values that can trade buffers with their targets: computed,
 * their own storage (no view shares it), not outputs (a read after the
 * run would find the swapped-out old value), one update each, of the
 * target's bytes.  None in an accumulating program: there the values are
 * computed in the arena (where the micro-batch's activations were) and
 * copied in, since a buffer of their own would sit idle through every
 * micro-batch beside the accumulators, and the copy is paid once per
 * K micro-batches.  None into a leaf that several devices share: each
 * would write the same buffer; they copy in a part each, but for a
 * gather that lands in place, whose members' slices (swapped too) lie in
 * the target's next buffer, each where the gather would put it. */
static void mark_swapped(plan *p, const spmd_graph *g, const plan_sharing *sh)
{
    for (int i = 0; i < g->n_updates && g->accumulate_steps <= 1; i++) {
        const spmd_tensor *v = g->updates[i].value, *x = g->updates[i].target;
        p->swapped[v->id] = p->needed[v->id] && !outside(p, v) && p->storage[v->id] == v->id &&
                            !v->is_output && ir_nbytes(v) == ir_nbytes(x) && p->in_place[v->id] < 0 &&
                            (!sh || sh->sharers[x->id] <= 1);
        /* A gather landing in place: its operand, the member's new
         * slice, is computed into the target's next buffer, and the
         * update phase trades the two instead of copying it in. */
        if (p->lands_in[v->id] >= 0) {
            const spmd_tensor *slice = v->in[0];
            p->swapped[slice->id] = p->needed[slice->id] && p->storage[slice->id] == slice->id &&
                                    !slice->is_output && p->in_place[slice->id] < 0;
        }
    }
    for (int i = 0; i < g->n_nodes; i++) /* a view of a value keeps it in the arena */
        if (p->needed[i] && p->storage[i] != i) p->swapped[p->storage[i]] = false;
    for (int i = 0; i < g->n_updates; i++)
        for (int j = 0; j < i; j++)
            if (g->updates[i].value == g->updates[j].value) p->swapped[g->updates[i].value->id] = false;
    for (int i = 0; i < g->n_nodes; i++)
        if (p->swapped[i]) p->swapped_bytes += ir_nbytes(g->nodes[i]);
}

/* prod[i]: the step that writes node i's storage (a fused root's step
 * for its stored members; a view's, its storage's), -1 for none. */
static void step_of_storage(const plan *p, const spmd_graph *g, const fusion *fu, int *prod)
{
    for (int i = 0; i < g->n_nodes; i++) prod[i] = -1;
    for (int s = 0; s < p->n_steps; s++) {
        const spmd_tensor *t = p->steps[s];
        prod[t->id] = s;
        const fuse_group *grp = fusion_group(fu, t);
        for (int j = 0; grp && j < grp->n_stored; j++) prod[grp->stored[j]->id] = s;
    }
    for (int i = 0; i < g->n_nodes; i++)
        if (p->storage[i] != i) prod[i] = prod[p->storage[i]];
}

/* ---- Collectives in flight ---------------------------------------------------------- */

/* One collective of the schedule, for schedule_async. */
typedef struct coll_item {
    int s;     /* its step */
    int ready; /* the step after its operand's producer (0: a leaf) */
    int read;  /* where its result is first read (n_steps: not on the device) */
    int key;   /* its place in the hand-over order */
    int64_t bytes; /* its operand's and result's, held from hand-over to wait */
    bool fly;
} coll_item;

/* The bytes in flight at step s (no earlier than the last hand-over) of
 * the first k collectives handed over, held[j] each: those waited for
 * after s.  Only the last `depth` can be: the count bound had each
 * earlier one waited for by the hand-over `depth` after it. */
static int64_t flying_at(const plan *p, const int64_t *held, int k, int depth, int s)
{
    int64_t sum = 0;
    for (int j = k > depth ? k - depth : 0; j < k; j++)
        if (p->wait_at[j] > s) sum += held[j];
    return sum;
}

/* Start and wait steps for the collectives in hand-over order `it`
 * (n of them), into held[] their bytes in hand-over order.  False where
 * the order cannot keep `depth` in flight, or `budget` bytes (a
 * collective would have to start where one that must be waited for
 * first starts): the caller then hands them over in schedule order,
 * where each collective's latest start is its own step, after every
 * earlier one's start. */
static bool schedule_in_order(plan *p, const coll_item *it, int n, int depth, int64_t budget,
                              int64_t *held)
{
    int k = 0, not_before = 0, last_start = 0;
    for (int i = 0; i < n; i++) {
        if (!it[i].fly) {
            for (int j = 0; j < k; j++)
                if (p->wait_at[j] > it[i].s) p->wait_at[j] = it[i].s;
            not_before = it[i].s + 1;
            continue;
        }
        /* At its own step at the latest, and no later than any collective
         * handed over after it. */
        int latest = it[i].s;
        for (int j = i + 1; j < n; j++)
            if (it[j].s < latest) latest = it[j].s;
        int start = it[i].ready > last_start ? it[i].ready : last_start;
        if (start < not_before) start = not_before;
        if (k >= depth && start < p->wait_at[k - depth]) start = p->wait_at[k - depth];
        /* The byte budget: later, until enough of what flies is waited for. */
        int64_t room = budget - it[i].bytes;
        while (start < latest && flying_at(p, held, k, depth, start) > room) {
            int next = latest;
            for (int j = k > depth ? k - depth : 0; j < k; j++)
                if (p->wait_at[j] > start && p->wait_at[j] < next) next = p->wait_at[j];
            start = next;
        }
        if (start > latest) start = latest;
        if (k >= depth && p->wait_at[k - depth] > start) {
            if (start <= p->start_at[k - depth]) return false;
            p->wait_at[k - depth] = start;
        }
        /* Still no room at its latest start: the earliest handed over are
         * waited for there (the thread runs them first). */
        for (int j = k > depth ? k - depth : 0; j < k && flying_at(p, held, k, depth, start) > room; j++) {
            if (p->wait_at[j] <= start) continue;
            if (start <= p->start_at[j]) return false;
            p->wait_at[j] = start;
        }
        held[k] = it[i].bytes;
        p->async_step[k] = it[i].s;
        p->start_at[k] = start;
        p->wait_at[k] = it[i].read;
        p->async_of[it[i].s] = k;
        last_start = start;
        k++;
    }
    p->n_async = k;
    return true;
}

/* When each collective is handed over and waited for (plan.h).  Every
 * device hands them over in one order, the plan's, and its communication
 * thread runs them in it.  That order is the schedule order, except that
 * an all-gather (a parameter's) is handed over as soon as the all-gather
 * `depth` - 1 places before it in the schedule is first read, or a
 * nearer one where those between would exceed the byte budget: a
 * prefetch, ahead of the gradients' reductions of the layers between (in
 * schedule order, the backward pass's next gather would queue behind this
 * layer's reduce-scatter and be waited for at once), but never past a
 * collective that stays a step.  A collective may start once its operand
 * is written (the step after its producer), no earlier than the one
 * before it, only when the one `depth` places before it has been waited
 * for, and only when its operand and result fit the budget beside those
 * in flight; it starts at its own step at the latest (and no later than
 * any handed over after it), and the ones in its way are then waited for
 * there.  It is waited for where its result is first read.  A collective
 * that cannot gain (its operand written just before it, its result read
 * just after), or whose operand and result alone exceed the budget, stays
 * a step of its own; every collective before it is waited for by then,
 * and none after it starts before it. */
static spmd_status schedule_async(plan *p, const spmd_graph *g, const fusion *fu, int depth,
                                  size_t budget_bytes, const bool *written_in_place)
{
    int n = g->n_nodes, ns = p->n_steps;
    size_t nn = (size_t)(n ? n : 1), nsz = (size_t)(ns ? ns : 1);
    int *prod = base_alloc(&p->alloc, nn * sizeof *prod, "memory plan");
    int *first_read = base_alloc(&p->alloc, nn * sizeof *first_read, "memory plan");
    coll_item *it = base_alloc(&p->alloc, nsz * sizeof *it, "memory plan");
    /* held: each one's bytes in hand-over order; first, each all-gather's. */
    int64_t *held = base_alloc(&p->alloc, nsz * sizeof *held, "memory plan");
    p->async_of = base_alloc(&p->alloc, nsz * sizeof *p->async_of, "memory plan");
    p->async_step = base_alloc(&p->alloc, nsz * sizeof *p->async_step, "memory plan");
    p->start_at = base_alloc(&p->alloc, nsz * sizeof *p->start_at, "memory plan");
    p->wait_at = base_alloc(&p->alloc, nsz * sizeof *p->wait_at, "memory plan");
    if (!prod || !first_read || !it || !held || !p->async_of || !p->async_step || !p->start_at ||
        !p->wait_at) {
        base_free(&p->alloc, prod);
        base_free(&p->alloc, first_read);
        base_free(&p->alloc, it);
        base_free(&p->alloc, held);
        return SPMD_ERR_NOMEM;
    }
    int64_t budget = budget_bytes > (size_t)INT64_MAX ? INT64_MAX : (int64_t)budget_bytes;
    step_of_storage(p, g, fu, prod);
    for (int i = 0; i < n; i++) first_read[i] = -1;
    for (int s = 0; s < ns; s++) p->async_of[s] = -1;
    /* The first step that reads each storage on the device's threads.  A
     * collective that may fly reads on the communication thread, after
     * every collective before it: a reduce-scatter read only by the
     * all-reduce after it (a 2D mesh's gradient) need not be waited for
     * by the device (if that reader stays a step of its own, it is
     * waited for there, as every collective before one is). */
    for (int s = 0; s < ns; s++) {
        if (ir_op_may_fly(p->steps[s]->op)) continue;
        const spmd_tensor *const *in;
        int n_in = reads(p->steps[s], fu, &in);
        for (int j = 0; j < n_in; j++) {
            int src = p->storage[in[j]->id];
            if (first_read[src] < 0) first_read[src] = s;
        }
    }
    int m = 0, not_before = 0, leaves = 0; /* leaves: the all-gathers so far */
    int *leaf_read = first_read; /* reused: where the all-gathers so far are first read */
    int64_t *leaf_bytes = held;  /* and their bytes */
    for (int s = 0; s < ns; s++) {
        const spmd_tensor *t = p->steps[s];
        if (!ir_op_is_collective(t->op)) continue;
        const spmd_tensor *x = t->in[0];
        coll_item c;
        c.s = s;
        c.ready = prod[p->storage[x->id]] + 1; /* 0 for a leaf */
        c.read = first_read[t->id] < 0 ? ns : first_read[t->id];
        c.bytes = (int64_t)(ir_nbytes(t) + ir_nbytes(x));
        c.fly = ir_op_may_fly(t->op) && !written_in_place[x->id] && (c.ready < s || c.read > s + 1) &&
                c.bytes <= budget;
        c.key = s;
        it[m++] = c;
    }
    /* The hand-over keys of the all-gathers (a parameter's: prefetches). */
    for (int i = 0; i < m; i++) {
        coll_item *c = &it[i];
        if (!c->fly) {
            not_before = c->s + 1;
            continue;
        }
        if (p->steps[c->s]->op != IR_ALL_GATHER) continue;
        /* Handed over where the w-th gather before it is first read: w
         * gathers, itself among them, then fly at once, at most depth - 1
         * (a place left for a reduction) and the budget's bytes. */
        int w = 1;
        int64_t sum = c->bytes;
        while (w < depth - 1 && w <= leaves && leaf_bytes[leaves - w] <= budget - sum)
            sum += leaf_bytes[leaves - w++];
        int key = leaves >= w ? leaf_read[leaves - w] : 0;
        if (key < not_before) key = not_before;
        if (key < c->ready) key = c->ready;
        if (key < c->key) c->key = key;
        leaf_bytes[leaves] = c->bytes;
        leaf_read[leaves++] = c->read;
    }
    /* Stable insertion sort by key (the schedule order among equals;
     * a step of its own keeps its place: no key crosses it). */
    for (int i = 1; i < m; i++) {
        coll_item c = it[i];
        int j = i;
        for (; j > 0 && it[j - 1].key > c.key; j--) it[j] = it[j - 1];
        it[j] = c;
    }
    if (!schedule_in_order(p, it, m, depth, budget, held)) {
        for (int s = 0; s < ns; s++) p->async_of[s] = -1;
        for (int i = 1; i < m; i++) {
            coll_item c = it[i];
            int j = i;
            for (; j > 0 && it[j - 1].s > c.s; j--) it[j] = it[j - 1];
            it[j] = c;
        }
        for (int i = 0; i < m; i++) it[i].key = it[i].s;
        if (!schedule_in_order(p, it, m, depth, budget, held)) {
            base_free(&p->alloc, prod);
            base_free(&p->alloc, first_read);
            base_free(&p->alloc, it);
            base_free(&p->alloc, held);
            return base_error(SPMD_ERR_INTERNAL, "plan: no order of the collectives in flight");
        }
    }
    base_free(&p->alloc, it);
    base_free(&p->alloc, held);
    int k = p->n_async;
    p->overlap_depth = depth;
    p->inflight_budget = budget_bytes;
    /* A collective whose result another one in flight reads is done by
     * the time that one is (the thread runs them in order): waited for no
     * later, so that its operand is not kept longer. */
    for (int j = k - 1; j >= 0; j--) {
        const spmd_tensor *t = p->steps[p->async_step[j]];
        int q = prod[p->storage[t->in[0]->id]];
        int c = q >= 0 ? p->async_of[q] : -1;
        if (c >= 0 && p->wait_at[c] > p->wait_at[j]) p->wait_at[c] = p->wait_at[j];
    }
    base_free(&p->alloc, prod);
    base_free(&p->alloc, first_read);
    /* The most operand and result bytes in flight at once. */
    int64_t *delta = base_calloc(&p->alloc, (nsz + 1) * sizeof *delta, "memory plan");
    if (!delta) return SPMD_ERR_NOMEM;
    for (int j = 0; j < k; j++) {
        const spmd_tensor *t = p->steps[p->async_step[j]];
        if (p->start_at[j] >= p->wait_at[j])
            return base_error(SPMD_ERR_INTERNAL, "plan: collective %s#%d waited for at step %d, "
                              "before it starts at %d", ir_op_name(t->op), t->id, p->wait_at[j],
                              p->start_at[j]);
        int64_t bytes = (int64_t)(ir_nbytes(t) + ir_nbytes(t->in[0]));
        delta[p->start_at[j]] += bytes;
        delta[p->wait_at[j]] -= bytes;
    }
    int64_t now = 0;
    for (int s = 0; s <= ns; s++) {
        now += delta[s];
        if ((size_t)now > p->inflight_bytes) p->inflight_bytes = (size_t)now;
    }
    base_free(&p->alloc, delta);
    if (p->inflight_bytes > budget_bytes)
        return base_error(SPMD_ERR_INTERNAL, "plan: %zu bytes in flight at once, over the budget of %zu",
                          p->inflight_bytes, budget_bytes);
    return SPMD_OK;
}

/* Heap of step indices, smallest key first: urgent steps before the
 * others, each kind in creation order. */
typedef struct heap {
    int *at, n;
    const bool *urgent;
} heap;

static bool heap_less(const heap *h, int a, int b)
{
    if (h->urgent[a] != h->urgent[b]) return h->urgent[a];
    return a < b;
}

static void heap_push(heap *h, int x)
{
    int i = h->n++;
    while (i > 0 && heap_less(h, x, h->at[(i - 1) / 2])) {
        h->at[i] = h->at[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->at[i] = x;
}

static int heap_pop(heap *h)
{
    int top = h->at[0], x = h->at[--h->n], i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && heap_less(h, h->at[c + 1], h->at[c])) c++;
        if (!heap_less(h, h->at[c], x)) break;
        h->at[i] = h->at[c];
        i = c;
    }
    if (h->n) h->at[i] = x;
    return top;
}

static bool elementwise(const spmd_tensor *t, const fusion *fu)
{
    return ir_op_formula_arity(t->op) > 0 || fusion_group(fu, t);
}

/* With collectives in flight the schedule is no longer the creation order
 * alone: a collective whose operand comes out of a computation (a
 * gradient, through the optimizer's elementwise steps on it) is moved up,
 * with those elementwise steps, to just after that computation, so that
 * it runs while the rest of the pass computes (the optimizer's steps that
 * read its result stay where they were).  Every other step keeps its
 * place: a list schedule that takes the urgent steps first and the others
 * in creation order, which with no urgent step is the creation order.
 * Only the order changes, never what a step computes: the same bits. */
static spmd_status reorder(plan *p, const spmd_graph *g, const fusion *fu)
{
    int n = g->n_nodes, ns = p->n_steps;
    size_t nn = (size_t)(n ? n : 1), nsz = (size_t)(ns ? ns : 1);
    int *prod = base_alloc(&p->alloc, nn * sizeof *prod, "schedule");
    int *deg = base_calloc(&p->alloc, (nsz + 1) * sizeof *deg, "schedule");
    int *off = base_calloc(&p->alloc, (nsz + 2) * sizeof *off, "schedule");
    bool *urgent = base_calloc(&p->alloc, nsz * sizeof *urgent, "schedule");
    int *stack = base_alloc(&p->alloc, nsz * sizeof *stack, "schedule");
    spmd_tensor **order = base_alloc(&p->alloc, nsz * sizeof *order, "schedule");
    int *succ = NULL, *heap_at = NULL;
    spmd_status st = prod && deg && off && urgent && stack && order ? SPMD_OK : SPMD_ERR_NOMEM;
    if (st == SPMD_OK) step_of_storage(p, g, fu, prod);
    /* Edges producer -> reader, counted, then listed (CSR). */
    for (int s = 0; st == SPMD_OK && s < ns; s++) {
        const spmd_tensor *const *in;
        int n_in = reads(p->steps[s], fu, &in);
        for (int j = 0; j < n_in; j++) {
            int q = prod[p->storage[in[j]->id]];
            if (q >= 0 && q != s) off[q + 1]++, deg[s]++;
        }
    }
    if (st == SPMD_OK) {
        for (int s = 0; s < ns; s++) off[s + 1] += off[s];
        succ = base_alloc(&p->alloc, (size_t)(off[ns] ? off[ns] : 1) * sizeof *succ, "schedule");
        heap_at = base_alloc(&p->alloc, nsz * sizeof *heap_at, "schedule");
        if (!succ || !heap_at) st = SPMD_ERR_NOMEM;
    }
    if (st == SPMD_OK) {
        int *fill = stack; /* borrowed as each list's fill point */
        for (int s = 0; s < ns; s++) fill[s] = off[s];
        for (int s = 0; s < ns; s++) {
            const spmd_tensor *const *in;
            int n_in = reads(p->steps[s], fu, &in);
            for (int j = 0; j < n_in; j++) {
                int q = prod[p->storage[in[j]->id]];
                if (q >= 0 && q != s) succ[fill[q]++] = s;
            }
        }
        /* Urgent: a collective in flight and the elementwise steps
         * between it and a computation (not a leaf: a parameter's
         * gather is prefetched by the plan instead). */
        for (int c = 0; c < ns; c++) {
            const spmd_tensor *t = p->steps[c];
            if (!ir_op_may_fly(t->op)) continue;
            int x = prod[p->storage[t->in[0]->id]];
            if (x < 0 || urgent[x]) {
                urgent[c] = x >= 0;
                continue;
            }
            int top = 0, chain = 0;
            bool computed = false;
            stack[top++] = x;
            while (top > 0 && chain < 64) {
                int y = stack[--top];
                const spmd_tensor *u = p->steps[y];
                if (!elementwise(u, fu) || ir_op_is_collective(u->op)) {
                    computed = true;
                    continue;
                }
                chain++;
                const spmd_tensor *const *in;
                int n_in = reads(u, fu, &in);
                for (int j = 0; j < n_in && top < ns; j++) {
                    int q = prod[p->storage[in[j]->id]];
                    if (q >= 0) stack[top++] = q;
                }
            }
            if (!computed) continue;
            urgent[c] = true;
            /* Mark the chain (walked again, now that it qualifies). */
            top = 0;
            stack[top++] = x;
            while (top > 0) {
                int y = stack[--top];
                const spmd_tensor *u = p->steps[y];
                if (urgent[y] || !elementwise(u, fu) || ir_op_is_collective(u->op)) continue;
                urgent[y] = true;
                const spmd_tensor *const *in;
                int n_in = reads(u, fu, &in);
                for (int j = 0; j < n_in && top < ns; j++) {
                    int q = prod[p->storage[in[j]->id]];
                    if (q >= 0) stack[top++] = q;
                }
            }
        }
        heap h = {heap_at, 0, urgent};
        for (int s = 0; s < ns; s++)
            if (deg[s] == 0) heap_push(&h, s);
        int done = 0;
        while (h.n > 0) {
            int s = heap_pop(&h);
            order[done++] = p->steps[s];
            for (int e = off[s]; e < off[s + 1]; e++)
                if (--deg[succ[e]] == 0) heap_push(&h, succ[e]);
        }
        if (done != ns)
            st = base_error(SPMD_ERR_INTERNAL, "plan: %d of %d steps could be ordered", done, ns);
        else
            memcpy(p->steps, order, nsz * sizeof *order);
    }
    base_free(&p->alloc, prod);
    base_free(&p->alloc, deg);
    base_free(&p->alloc, off);
    base_free(&p->alloc, urgent);
    base_free(&p->alloc, stack);
    base_free(&p->alloc, order);
    base_free(&p->alloc, succ);
    base_free(&p->alloc, heap_at);
    return st;
}

/* A step's place after hoist_sums: after step `major`, sums (by their
 * own step, `minor`) after the step itself (-1), members in step order. */
typedef struct hoisted {
    int major, minor, s;
} hoisted;

static int hoisted_cmp(const void *x, const void *y)
{
    const hoisted *a = x, *b = y;
    if (a->major != b->major) return a->major < b->major ? -1 : 1;
    if (a->minor != b->minor) return a->minor < b->minor ? -1 : 1;
    return (a->s > b->s) - (a->s < b->s);
}

/* Gradient accumulation: each accumulator's sum (plan.in_place) runs
 * right after the last step it reads, its gradient's, so that the
 * gradient dies there instead of at the end of the backward pass, where
 * the optimizer's creation order puts every sum (and where a step without
 * accumulation holds all its gradients for the update).  A sum moves up
 * with its members, the elementwise steps that only it reads (unfused:
 * acc * keep and grad / K), in their order; one that reads only leaves,
 * or another sum, stays.  Only the order changes, never a step's
 * arithmetic.  *moved: whether any sum moved. */
static spmd_status hoist_sums(plan *p, const spmd_graph *g, const fusion *fu, bool *moved)
{
    int n = g->n_nodes, ns = p->n_steps;
    *moved = false;
    bool any = false;
    for (int s = 0; s < ns && !any; s++) any = p->in_place[p->steps[s]->id] >= 0;
    if (!any) return SPMD_OK;
    size_t nn = (size_t)(n ? n : 1), nsz = (size_t)(ns ? ns : 1);
    int *prod = base_alloc(&p->alloc, nn * sizeof *prod, "schedule");
    int *readers = base_calloc(&p->alloc, nn * sizeof *readers, "schedule");
    int *seen = base_alloc(&p->alloc, nn * sizeof *seen, "schedule");
    int *sum_of = base_alloc(&p->alloc, nsz * sizeof *sum_of, "schedule"); /* -1: no sum's member */
    int *after = base_alloc(&p->alloc, nsz * sizeof *after, "schedule");  /* a sum's place */
    int *stack = base_alloc(&p->alloc, nsz * sizeof *stack, "schedule");
    hoisted *order = base_alloc(&p->alloc, nsz * sizeof *order, "schedule");
    spmd_tensor **steps = base_alloc(&p->alloc, nsz * sizeof *steps, "schedule");
    spmd_status st = prod && readers && seen && sum_of && after && stack && order && steps
                         ? SPMD_OK
                         : SPMD_ERR_NOMEM;
    if (st == SPMD_OK) {
        step_of_storage(p, g, fu, prod);
        for (int i = 0; i < n; i++) seen[i] = -1;
        for (int s = 0; s < ns; s++) sum_of[s] = after[s] = -1;
        /* The steps reading each storage (each step once); outputs and
         * update values are read after the run as well. */
        for (int s = 0; s < ns; s++) {
            const spmd_tensor *const *in;
            int n_in = reads(p->steps[s], fu, &in);
            for (int j = 0; j < n_in; j++) {
                int src = p->storage[in[j]->id];
                if (seen[src] != s) seen[src] = s, readers[src]++;
            }
        }
        for (int i = 0; i < n; i++)
            if (p->needed[i] && g->nodes[i]->is_output) readers[p->storage[i]] = n;
        for (int i = 0; i < g->n_updates; i++) readers[p->storage[g->updates[i].value->id]] = n;
        /* Each sum's members, back from it; the latest other step they
         * read is the sum's place. */
        for (int r = 0; r < ns; r++) {
            if (p->in_place[p->steps[r]->id] < 0) continue;
            int top = 0;
            sum_of[r] = r;
            stack[top++] = r;
            while (top > 0) {
                const spmd_tensor *const *in;
                int n_in = reads(p->steps[stack[--top]], fu, &in);
                for (int j = 0; j < n_in; j++) {
                    int src = p->storage[in[j]->id], q = prod[src];
                    if (q < 0 || sum_of[q] == r) continue;
                    const spmd_tensor *u = p->steps[q];
                    const fuse_group *grp = fusion_group(fu, u);
                    if (sum_of[q] < 0 && elementwise(u, fu) && !ir_op_is_collective(u->op) && src == u->id &&
                        readers[src] == 1 && !(grp && (grp->sum || grp->n_stored))) {
                        sum_of[q] = r;
                        stack[top++] = q;
                    } else if (q > after[r]) {
                        after[r] = q;
                    }
                }
            }
        }
        for (int r = 0; r < ns; r++)
            if (sum_of[r] == r && after[r] >= 0 && sum_of[after[r]] >= 0) after[r] = -1;
        for (int s = 0; s < ns; s++) {
            int r = sum_of[s] >= 0 && after[sum_of[s]] >= 0 ? sum_of[s] : -1;
            order[s] = r < 0 ? (hoisted){s, -1, s} : (hoisted){after[r], r, s};
            *moved |= r == s;
        }
        qsort(order, (size_t)ns, sizeof *order, hoisted_cmp);
        for (int s = 0; s < ns; s++) steps[s] = p->steps[order[s].s];
        memcpy(p->steps, steps, nsz * sizeof *steps);
    }
    base_free(&p->alloc, prod);
    base_free(&p->alloc, readers);
    base_free(&p->alloc, seen);
    base_free(&p->alloc, sum_of);
    base_free(&p->alloc, after);
    base_free(&p->alloc, stack);
    base_free(&p->alloc, order);
    base_free(&p->alloc, steps);
    return st;
}

/* The memory plan in schedule order, where reorder or hoist_sums made it
 * other than the creation order: each storage is placed at the step that
 * writes it and released after the last step that reads it.  With
 * collectives in flight (depth > 0) a collective's result is placed when
 * it is handed over, and its operand released only after the step it is
 * waited for at, so that no step's buffer overlaps either while the
 * communication thread reads and writes them. */
static spmd_status place_scheduled(plan *p, const spmd_graph *g, const fusion *fu, int depth,
                                   size_t budget, freelist *f)
{
    int n = g->n_nodes, ns = p->n_steps;
    size_t nn = (size_t)(n ? n : 1);
    bool *written_in_place = base_calloc(&p->alloc, nn * sizeof *written_in_place, "memory plan");
    int *pos = base_alloc(&p->alloc, nn * sizeof *pos, "memory plan");
    int *last = base_alloc(&p->alloc, nn * sizeof *last, "memory plan");
    int *head = base_alloc(&p->alloc, (size_t)(ns + 1) * sizeof *head, "memory plan");
    int *next = base_alloc(&p->alloc, nn * sizeof *next, "memory plan");
    spmd_status st = written_in_place && pos && last && head && next ? SPMD_OK : SPMD_ERR_NOMEM;
    for (int i = 0; st == SPMD_OK && i < n; i++)
        if (p->in_place[i] >= 0) written_in_place[p->in_place[i]] = true;
    if (st == SPMD_OK && depth > 0) st = schedule_async(p, g, fu, depth, budget, written_in_place);
    if (st == SPMD_OK) {
        for (int i = 0; i < n; i++) pos[i] = last[i] = -1;
        for (int s = 0; s <= ns; s++) head[s] = -1;
        for (int s = 0; s < ns; s++) {
            const spmd_tensor *t = p->steps[s];
            pos[t->id] = s;
            const fuse_group *grp = fusion_group(fu, t);
            for (int j = 0; grp && j < grp->n_stored; j++) pos[grp->stored[j]->id] = s;
        }
        for (int i = 0; i < n; i++)
            if (p->storage[i] != i) pos[i] = pos[p->storage[i]];
        /* The last step reading each storage; ns: to the end. */
        for (int i = 0; i < n; i++) {
            const spmd_tensor *t = g->nodes[i];
            if (!p->needed[i] || outside(p, t) || pos[i] < 0) continue;
            int s = p->storage[i];
            if (last[s] < pos[i]) last[s] = pos[i];
            const spmd_tensor *const *in;
            int n_in = reads(t, fu, &in);
            for (int j = 0; j < n_in; j++) {
                int src = p->storage[in[j]->id];
                if (last[src] < pos[i]) last[src] = pos[i];
            }
            if (t->is_output) last[s] = ns;
        }
        for (int i = 0; i < g->n_updates; i++) {
            const spmd_tensor *v = g->updates[i].value;
            last[p->storage[v->id]] = ns;
            if (p->lands_in[v->id] >= 0) last[p->storage[v->in[0]->id]] = ns;
        }
        for (int k = 0; k < p->n_async; k++) {
            int src = p->storage[p->steps[p->async_step[k]]->in[0]->id];
            if (last[src] >= 0 && last[src] < p->wait_at[k]) last[src] = p->wait_at[k];
        }
        for (int i = 0; i < n; i++) {
            const spmd_tensor *t = g->nodes[i];
            if (!p->needed[i] || outside(p, t) || p->storage[i] != i || p->swapped[i] ||
                p->in_place[i] >= 0 || last[i] < 0 || last[i] >= ns)
                continue;
            next[i] = head[last[i]];
            head[last[i]] = i;
        }
        int k = 0;
        bool held = false;
        for (int s = 0; s < ns; s++) {
            /* The backward pass begins at its first step (reorder and
             * hoist_sums move only later steps, and only after one of its). */
            if (!held && g->backward_begin > 0 && p->steps[s]->id >= g->backward_begin) {
                p->held_bytes = (size_t)f->live;
                held = true;
            }
            for (; k < p->n_async && p->start_at[k] == s; k++) {
                const spmd_tensor *c = p->steps[p->async_step[k]];
                if (!p->swapped[c->id]) p->offset[c->id] = take(f, round_up((int64_t)ir_nbytes(c)));
            }
            const spmd_tensor *t = p->steps[s];
            const fuse_group *grp = fusion_group(fu, t);
            for (int j = 0; grp && j < grp->n_stored; j++) {
                const spmd_tensor *m = grp->stored[j];
                if (!p->swapped[m->id] && p->in_place[m->id] < 0 && p->offset[m->id] < 0)
                    p->offset[m->id] = take(f, round_up((int64_t)ir_nbytes(m)));
            }
            if (!p->swapped[t->id] && p->in_place[t->id] < 0 && p->offset[t->id] < 0)
                p->offset[t->id] = take(f, round_up((int64_t)ir_nbytes(t)));
            for (int r = head[s]; r >= 0; r = next[r])
                if (p->offset[r] >= 0) give(f, p->offset[r], round_up((int64_t)ir_nbytes(g->nodes[r])));
        }
        for (int i = 0; i < n; i++)
            if (p->needed[i] && p->storage[i] != i) p->offset[i] = p->offset[p->storage[i]];
    }
    base_free(&p->alloc, written_in_place);
    base_free(&p->alloc, pos);
    base_free(&p->alloc, last);
    base_free(&p->alloc, head);
    base_free(&p->alloc, next);
    return st;
}

static spmd_status build(plan *p, const spmd_graph *g, const spmd_allocator *alloc, const fusion *fu,
                         int depth, size_t budget, const plan_sharing *sh)
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
    p->view_of = base_alloc(&p->alloc, nn * sizeof *p->view_of, "memory plan");
    p->gather_leaf = base_alloc(&p->alloc, nn * sizeof *p->gather_leaf, "memory plan");
    p->lands_in = base_alloc(&p->alloc, nn * sizeof *p->lands_in, "memory plan");
    int *last_use = base_alloc(&p->alloc, nn * sizeof *last_use, "memory plan");
    block *slots = base_alloc(&p->alloc, (nn + 1) * sizeof *slots, "memory plan");
    if (!p->steps || !p->needed || !p->storage || !p->offset || !p->swapped || !p->in_place ||
        !p->view_of || !p->gather_leaf || !p->lands_in || !last_use || !slots) {
        base_free(&p->alloc, last_use);
        base_free(&p->alloc, slots);
        plan_free(p);
        return SPMD_ERR_NOMEM;
    }
    freelist f = {slots, {-1, -1}, 0, -1, 0, 0, 0};

    plan_mark_needed(g, p->needed);
    mark_gathers(p, g, sh);
    for (int i = 0; fu && fu->absorbed && i < n; i++)
        if (fu->absorbed[i]) p->needed[i] = false;
    mark_views(p, g);
    mark_lands(p, g, sh);
    for (int i = 0; i < n; i++) {
        const spmd_tensor *t = g->nodes[i];
        p->offset[i] = -1;
        p->storage[i] = i;
        /* A reshape of a computed tensor is a view: same bytes (of a leaf
         * or a leaf's view, a copy). */
        if (t->op == IR_RESHAPE && !outside(p, t->in[0]))
            p->storage[i] = p->storage[t->in[0]->id];
        /* A member a fused group stores has memory but no step of its own. */
        bool inside = fu && fu->stored && fu->stored[i];
        if (p->needed[i] && !outside(p, t) && !(t->op == IR_RESHAPE && p->storage[i] != i) && !inside)
            p->steps[p->n_steps++] = (spmd_tensor *)t;
    }
    spmd_status ordered = depth > 0 ? reorder(p, g, fu) : SPMD_OK;
    if (ordered != SPMD_OK) {
        base_free(&p->alloc, last_use);
        base_free(&p->alloc, slots);
        plan_free(p);
        return ordered;
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
    for (int i = 0; i < g->n_updates; i++) {
        const spmd_tensor *v = g->updates[i].value;
        last_use[p->storage[v->id]] = forever;
        if (p->lands_in[v->id] >= 0) last_use[p->storage[v->in[0]->id]] = forever;
    }
    mark_in_place(p, g);
    mark_swapped(p, g, sh);

    bool moved = false;
    spmd_status st = hoist_sums(p, g, fu, &moved);
    if (st == SPMD_OK && (depth > 0 || moved)) {
        st = place_scheduled(p, g, fu, depth, budget, &f);
    } else if (st == SPMD_OK) {
        /* Walk nodes in order: place each computed storage at its first
         * definition, release storages whose last reader is this node. */
        for (int i = 0; i < n; i++) {
            const spmd_tensor *t = g->nodes[i];
            if (i == g->backward_begin && i > 0) p->held_bytes = (size_t)f.live;
            if (!p->needed[i] || outside(p, t)) continue;
            int s = p->storage[i];
            /* A value in a buffer of its own, or its target's, takes no
             * arena, but its inputs die here all the same (a gradient, into
             * its accumulator). */
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
                if (!seen) give(&f, p->offset[src], round_up((int64_t)ir_nbytes(g->nodes[src])));
            }
        }
    }
    p->arena_bytes = (size_t)f.end;
    p->serial_arena_bytes = p->arena_bytes;
    visits_done += f.visits;
    base_free(&p->alloc, last_use);
    base_free(&p->alloc, slots);
    if (st != SPMD_OK) plan_free(p);
    return st;
}

spmd_status plan_build(plan *p, const spmd_graph *g, const spmd_allocator *alloc, const fusion *fu)
{
    return build(p, g, alloc, fu, 0, 0, NULL);
}

spmd_status plan_build_overlap(plan *p, const spmd_graph *g, const spmd_allocator *alloc,
                               const fusion *fu, int depth, size_t budget, const plan_sharing *sh)
{
    bool any = false;
    for (int i = 0; depth > 0 && i < g->n_nodes && !any; i++) any = ir_op_may_fly(g->nodes[i]->op);
    if (!any) return build(p, g, alloc, fu, 0, 0, sh);
    /* The arena without overlap first, for explain's extra bytes. */
    spmd_status st = build(p, g, alloc, fu, 0, 0, sh);
    if (st != SPMD_OK) return st;
    size_t serial = p->arena_bytes;
    plan_free(p);
    if ((st = build(p, g, alloc, fu, depth, budget, sh)) != SPMD_OK) return st;
    p->serial_arena_bytes = serial;
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
    base_free(&p->alloc, p->view_of);
    base_free(&p->alloc, p->gather_leaf);
    base_free(&p->alloc, p->lands_in);
    base_free(&p->alloc, p->async_of);
    base_free(&p->alloc, p->async_step);
    base_free(&p->alloc, p->start_at);
    base_free(&p->alloc, p->wait_at);
    memset(p, 0, sizeof *p);
}
