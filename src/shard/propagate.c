/*
 * Sharding propagation over iteration dimensions (see propagate.h for the
 * rules and their order).  Reshape, which has no einsum form, carries
 * shardings through groups of dims whose sizes multiply to the same
 * product (reshape_map below).
 */
#include "shard/propagate.h"
#include "shard/cost.h"
#include "base/error.h"

#include <string.h>

/* ---- Small helpers ---------------------------------------------------------- */

static uint32_t axes_mask(const mesh_axes *a)
{
    uint32_t m = 0;
    for (int i = 0; i < a->n; i++) m |= 1u << a->axis[i];
    return m;
}

/* Can an iteration dim of `size` (with `granule`) be split over `axes`?
 * Blocks must hold whole granules; uneven splits are padded, but a
 * granule-bound dim (attention heads) must divide exactly.  A granule of
 * 1 (one channel per head) is bound too: 6 heads over 5 devices once
 * split unevenly, and each device ran 6 / 5 = 1 head of 2 channels. */
bool shard_splittable(const spmd_mesh *m, const mesh_axes *axes, int64_t size, int64_t granule)
{
    int64_t blocks = mesh_axes_size(m, axes);
    if (blocks <= 1) return blocks == 1;
    /* A grouped split is exact, and never cuts heads: a device's channels
     * would belong to as many heads as groups. */
    if (mesh_axes_groups(axes) > 1) return granule <= 0 && size % (blocks * mesh_axes_groups(axes)) == 0;
    if (granule > 0) return size % (blocks * granule) == 0;
    return size >= blocks;
}

static sharding project_out(const shard_node *n, const spmd_tensor *t)
{
    sharding s = sharding_replicated(t->rank);
    for (int i = 0; i < t->rank; i++)
        if (n->sig->out[i] >= 0) s.dim[i] = n->iter[n->sig->out[i]];
    for (int it = 0; it < n->sig->n_iter; it++)
        if (n->sig->kind[it] == IR_ITER_SUM) s.partial |= axes_mask(&n->iter[it]);
    s.partial |= n->through;
    return s;
}

/* ---- Reshape ------------------------------------------------------------------ */

/* Carry sharding `from` (over dims `fd`) to dims `td` of the same element
 * count.  Dims group into runs whose products match.  Inside a run the
 * split must be exact (no padding moves across a reshape) and lay each
 * device's part out as one contiguous stretch of every group: the run is
 * G groups (whole leading dims and the first split dim's own groups),
 * each cut over the axes of the split dims, major first.  The target
 * dims then take the same: whole dims up to G, a grouped split where G
 * ends inside a dim ([B, T, 3, C] with C split is [B, T, 3C] as 3*axes),
 * the axes dealt major first while they divide.  Runs that cannot be
 * carried stay whole. */
static sharding reshape_map(const spmd_mesh *m, const sharding *from, int fr, const int64_t *fd,
                            int tr, const int64_t *td)
{
    sharding out = sharding_replicated(tr);
    int i = 0, j = 0;
    while (i < fr || j < tr) {
        int i0 = i, j0 = j;
        int64_t pi = i < fr ? fd[i++] : 1, pj = j < tr ? td[j++] : 1;
        while (pi != pj) {
            if (pi < pj && i < fr) pi *= fd[i++];
            else if (pj < pi && j < tr) pj *= td[j++];
            else break;
        }
        /* Axes of source dims i0..i-1, major first; each dim split exactly. */
        int8_t axes[MESH_MAX_AXES];
        int n = 0, first = -1;
        bool exact = true;
        for (int d = i0; d < i; d++) {
            int64_t b = sharding_blocks(from, m, d);
            if (fd[d] % b != 0 || !sharding_groups_exact(from, m, d, fd[d])) exact = false;
            if (from->dim[d].n && first < 0) first = d;
            for (int k = 0; k < from->dim[d].n; k++) axes[n++] = from->dim[d].axis[k];
        }
        if (!exact || n == 0) continue;
        /* The run's groups: the whole dims before the first split one, and
         * that dim's own groups. */
        int64_t groups = mesh_axes_groups(&from->dim[first]);
        for (int d = i0; d < first; d++) groups *= fd[d];
        /* After the first split dim, the stretch stays contiguous only if
         * every dim before a split one is cut down to single elements, and
         * only the first split dim may be grouped.  [4, 6] as (x, y)
         * holds tiles, not stretches: carrying those made a marked
         * reshape's operand need a layout whose local reshape is not the
         * mark, nor anything reshape_map gives back. */
        bool contiguous = true;
        for (int d = first + 1; d < i && contiguous; d++) {
            if (!from->dim[d].n) continue;
            if (mesh_axes_groups(&from->dim[d]) > 1) contiguous = false;
            for (int e = first; e < d; e++)
                if (fd[e] / mesh_axes_groups(&from->dim[e]) / sharding_blocks(from, m, e) != 1)
                    contiguous = false;
        }
        if (!contiguous) continue;
        /* Whole target dims up to the groups; the dim where they end takes
         * what is left of them as its own. */
        int d = j0;
        int64_t before = 1;
        while (d < j && before * td[d] <= groups && groups % (before * td[d]) == 0)
            before *= td[d++];
        if (d == j || td[d] % (groups / before) != 0) continue;
        int64_t inner_groups = groups / before;
        /* Deal the axes to target dims from d on, major first, while they
         * divide; a grouped dim takes them all. */
        int k = 0;
        for (int e = d; e < j && k < n; e++) {
            int64_t size = e == d ? td[e] / inner_groups : td[e], blocks = 1;
            while (k < n) {
                int64_t next = blocks * m->shape[axes[k]];
                if (size % next != 0) break;
                blocks = next;
                out.dim[e].axis[out.dim[e].n++] = axes[k++];
            }
            if (e == d && inner_groups > 1) {
                out.dim[e].groups = (int16_t)inner_groups;
                break;
            }
            /* Remaining axes may only continue on the next dim if this one
             * is fully split (block size 1). */
            if (blocks < size && k < n && e + 1 < j) break;
        }
        if (k < n) {
            /* Could not deal every axis: leave the whole run unsharded. */
            for (int e = j0; e < j; e++) out.dim[e].n = 0, out.dim[e].groups = 0;
        }
    }
    out.partial = from->partial;
    return out;
}

/* ---- The choice per op ---------------------------------------------------------- */

/* What it would cost to gather every split dim of x: the price of
 * letting another operand win a clash over x.  Priced as if every axis
 * were inside one process: the program must not depend on where devices
 * live, so a run over processes computes the one-process run's bits. */
static double losing_cost(const shard_plan *p, const spmd_tensor *x)
{
    const sharding *s = &p->nodes[x->id].out;
    double c = 0;
    for (int i = 0; i < x->rank; i++)
        c += cost_collective_unplaced(p->m, IR_ALL_GATHER, &s->dim[i], (int64_t)ir_nbytes(x));
    return c;
}

static bool same_split(const mesh_axes *a, const mesh_axes *b)
{
    return a->n == b->n && !memcmp(a->axis, b->axis, (size_t)a->n) &&
           mesh_axes_groups(a) == mesh_axes_groups(b);
}

/* The blocks operand j would make the op sum over alone: the sizes of its
 * axes on SUM iteration dims that no other operand splits that dim over.
 * Winning a clash with such a split turns the output into a pending sum
 * (a reduction the size of the output) where the other operand's split
 * would have kept it split: sequence parallelism's weight gradients,
 * dW = dY^T Y with dY split on the sequence and Y on the heads. */
static int64_t sum_blocks(const shard_plan *p, const spmd_tensor *t, int j)
{
    const shard_node *n = &p->nodes[t->id];
    const sharding *s = &p->nodes[t->in[j]->id].out;
    int64_t blocks = 1;
    for (int i = 0; i < t->in[j]->rank; i++) {
        int it = n->sig->in[j][i];
        if (it < 0 || n->sig->kind[it] != IR_ITER_SUM || !s->dim[i].n) continue;
        bool shared = false;
        for (int k = 0; k < t->n_in && !shared; k++) {
            if (k == j || p->nodes[t->in[k]->id].level == SHARD_UNKNOWN) continue;
            const sharding *o = &p->nodes[t->in[k]->id].out;
            for (int e = 0; e < t->in[k]->rank; e++)
                if (n->sig->in[k][e] == it && same_split(&o->dim[e], &s->dim[i])) shared = true;
        }
        if (!shared) blocks *= mesh_axes_size(p->m, &s->dim[i]);
    }
    return blocks;
}

/* Operands ordered by the priority rules of propagate.h. */
static void order_operands(const shard_plan *p, const spmd_tensor *t, int *order)
{
    double cost[IR_MAX_INPUTS];
    int64_t sums[IR_MAX_INPUTS];
    order[0] = 0;
    if (t->n_in < 2) return; /* nothing to order (and no costs to price) */
    for (int j = 0; j < t->n_in; j++) {
        order[j] = j;
        cost[j] = losing_cost(p, t->in[j]);
        sums[j] = sum_blocks(p, t, j);
    }
    for (int a = 1; a < t->n_in; a++) {
        for (int b = a; b > 0; b--) {
            const spmd_tensor *x = t->in[order[b - 1]], *y = t->in[order[b]];
            const shard_node *nx = &p->nodes[x->id], *ny = &p->nodes[y->id];
            int kx = nx->data * 4 + (nx->level == SHARD_MARKED) * 2;
            int ky = ny->data * 4 + (ny->level == SHARD_MARKED) * 2;
            double cx = cost[order[b - 1]], cy = cost[order[b]];
            int64_t sx = sums[order[b - 1]], sy = sums[order[b]];
            bool swap = ky > kx ||
                        (ky == kx && (sy < sx || (sy == sx && (cy > cx || (cy == cx && ir_numel(y) > ir_numel(x))))));
            if (!swap) break;
            int tmp = order[b - 1];
            order[b - 1] = order[b];
            order[b] = tmp;
        }
    }
}

/* Mesh axes that operands other than `except` split their dims over.  A
 * pending sum over such an axis must not pass through: the output could
 * not be split over it, so that operand (a weight marked over it, say)
 * would be gathered whole; the sum is resolved first instead. */
static uint32_t split_by_others(const shard_plan *p, const spmd_tensor *t, int except)
{
    uint32_t mask = 0;
    for (int j = 0; j < t->n_in; j++) {
        const shard_node *n = &p->nodes[t->in[j]->id];
        if (j != except && n->level) mask |= sharding_dim_axes(&n->out);
    }
    return mask;
}

/* A pending sum passes through an op that is linear in the partial
 * operands (its linearity in ops.def) instead of being resolved first.
 * Returns the partial axes that pass and the operands that keep them. */
static uint32_t linear_through(const shard_plan *p, const spmd_tensor *t, uint32_t *operands)
{
    uint32_t part[IR_MAX_INPUTS];
    for (int j = 0; j < t->n_in; j++) {
        const shard_node *n = &p->nodes[t->in[j]->id];
        part[j] = n->level ? n->out.partial : 0;
    }
    *operands = 0;
    switch (ir_op_linearity(t->op)) {
    case LIN_ONE:
        if (!part[0]) return 0;
        *operands = 1;
        return part[0];
    case LIN_EACH:
        /* Exactly one operand may be partial, and only its axes the other
         * operand does not split stay pending. */
        if (part[0] && !part[1]) part[0] &= ~split_by_others(p, t, 0);
        else if (part[1] && !part[0]) part[1] &= ~split_by_others(p, t, 1);
        if (part[0] && !part[1]) return *operands = 1, part[0];
        if (part[1] && !part[0]) return *operands = 2, part[1];
        return 0;
    case LIN_FIRST:
        part[0] &= ~split_by_others(p, t, 0);
        if (part[0] && !part[1]) return *operands = 1, part[0];
        return 0;
    case LIN_ALL:
        for (int j = 0; j < t->n_in; j++)
            if (!part[j] || part[j] != part[0]) return 0;
        *operands = (1u << t->n_in) - 1;
        return part[0];
    case LIN_NONE:
        return 0;
    }
    return 0;
}

/* Assign operand dims' axes to free iteration dims. */
static void take_axes(const shard_plan *p, ir_op op, shard_node *n, const int8_t *map, int rank,
                      const sharding *s, uint32_t *used)
{
    for (int i = 0; i < rank; i++) {
        int it = map[i];
        const mesh_axes *want = &s->dim[i];
        if (it < 0 || want->n == 0 || n->iter[it].n) continue;
        /* A grouped split only where the op carries one (ops.def). */
        if (mesh_axes_groups(want) > 1 && !ir_op_carries_groups(op)) continue;
        if (n->sig->kind[it] == IR_ITER_FULL) continue;
        uint32_t mask = axes_mask(want);
        if (mask & *used) continue;
        if (!shard_splittable(p->m, want, n->sig->size[it], n->sig->granule[it])) continue;
        n->iter[it] = *want;
        *used |= mask;
    }
}

/* Decide node t from its operands (and its own mark, which comes first). */
static void choose(shard_plan *p, const spmd_tensor *t)
{
    shard_node *n = &p->nodes[t->id];
    if (n->sig->n_iter) memset(n->iter, 0, (size_t)n->sig->n_iter * sizeof *n->iter);
    uint32_t used = 0;
    n->through = linear_through(p, t, &n->through_operands);
    used |= n->through;
    if (t->mark) take_axes(p, t->op, n, n->sig->out, t->rank, t->mark, &used);
    /* A table's gradient has rows no operand maps: split them like the
     * table (a vocabulary split), where the ids (first) left its axes
     * free; the incoming gradient comes after, and gives way (under
     * sequence parallelism it is split over the table's axis). */
    if (t->op == IR_EMBEDDING_BACKWARD && t->attr.embed.table >= 0) {
        const shard_node *ids = &p->nodes[t->in[0]->id], *table = &p->nodes[t->attr.embed.table];
        if (ids->level != SHARD_UNKNOWN)
            take_axes(p, t->op, n, n->sig->in[0], t->in[0]->rank, &ids->out, &used);
        if (table->level != SHARD_UNKNOWN) take_axes(p, t->op, n, n->sig->out, 1, &table->out, &used);
    }
    int order[IR_MAX_INPUTS];
    order_operands(p, t, order);
    for (int k = 0; k < t->n_in; k++) {
        int j = order[k];
        const shard_node *in = &p->nodes[t->in[j]->id];
        if (in->level == SHARD_UNKNOWN) continue;
        take_axes(p, t->op, n, n->sig->in[j], t->in[j]->rank, &in->out, &used);
    }
}

static bool any_known(const shard_plan *p, const spmd_tensor *t)
{
    for (int j = 0; j < t->n_in; j++)
        if (p->nodes[t->in[j]->id].level != SHARD_UNKNOWN) return true;
    return false;
}

/* Forward: every computed node from its operands.  Returns true if a
 * node's sharding changed. */
static bool sweep_forward(shard_plan *p, const bool *needed)
{
    bool changed = false;
    const spmd_graph *g = p->g;
    for (int i = 0; i < g->n_nodes; i++) {
        const spmd_tensor *t = g->nodes[i];
        shard_node *n = &p->nodes[i];
        if ((needed && !needed[i]) || (ir_op_is_leaf(t->op) && !t->accumulator)) continue;
        sharding before = n->out;
        uint8_t level_before = n->level;
        if (t->accumulator) {
            /* A gradient accumulator is held as its gradient is produced,
             * pending sums included: adding into it moves nothing. */
            const shard_node *grad = &p->nodes[t->grad->id];
            n->level = grad->level == SHARD_UNKNOWN ? SHARD_UNKNOWN : SHARD_DERIVED;
            if (n->level) n->out = shard_produced(p, t->grad);
        } else if (t->mark) {
            n->out = *t->mark;
            n->level = SHARD_MARKED;
            if (n->sig) choose(p, t);
        } else if (!any_known(p, t)) {
            n->level = SHARD_UNKNOWN;
        } else if (!n->sig) { /* the explicit rule: reshape */
            const spmd_tensor *x = t->in[0];
            n->out = reshape_map(p->m, &p->nodes[x->id].out, x->rank, x->dims, t->rank, t->dims);
            n->level = SHARD_DERIVED;
        } else {
            choose(p, t);
            n->out = project_out(n, t);
            n->level = SHARD_DERIVED;
        }
        if (n->level != level_before || !sharding_equal(&before, &n->out)) changed = true;
    }
    return changed;
}

/* Backward: unmarked leaves take the sharding their first consumer (in
 * program order) implies.  Only the first sets a leaf in a sweep (its
 * `swept` stamp), so a leaf whose later consumers ask for another
 * sharding (the optimizer's sharding constraint under ZeRO) is not
 * counted as changed every round. */
static bool sweep_backward(shard_plan *p, const bool *needed)
{
    bool changed = false;
    const spmd_graph *g = p->g;
    const int stamp = p->rounds + 1;
    for (int i = 0; i < g->n_nodes; i++) {
        const spmd_tensor *t = g->nodes[i];
        if ((needed && !needed[i]) || ir_op_is_leaf(t->op)) continue;
        if (p->nodes[i].level == SHARD_UNKNOWN) continue;
        for (int j = 0; j < t->n_in; j++) {
            const spmd_tensor *x = t->in[j];
            shard_node *nx = &p->nodes[x->id];
            if (!ir_op_is_leaf(x->op) || nx->level == SHARD_MARKED || nx->level == SHARD_DERIVED)
                continue;
            /* An earlier consumer set it (one reading it twice: its last
             * operand, as when every consumer overwrote it). */
            if (nx->swept == stamp && nx->swept_by != i) continue;
            nx->swept = stamp;
            nx->swept_by = i;
            sharding want = shard_operand_need(p, t, j);
            want.partial = 0;
            if (nx->level == SHARD_INFERRED && sharding_equal(&nx->out, &want)) continue;
            nx->out = want;
            nx->level = SHARD_INFERRED;
            changed = true;
        }
    }
    return changed;
}

/* ---- Entry points ------------------------------------------------------------------ */

bool shard_has_explicit_rule(ir_op op) { return op == IR_RESHAPE; }

sharding shard_produced(const shard_plan *p, const spmd_tensor *t)
{
    const shard_node *n = &p->nodes[t->id];
    if (ir_op_is_leaf(t->op)) return n->out;
    if (!n->sig) {
        /* reshape: what its operand, resharded as it needs, gives.  That is
         * not always n->out: a mark (or the round trip through reshape_map)
         * may ask for dims the reshape cannot carry, and the partitioner
         * then reshards the produced value to the mark.  Claiming n->out
         * here gave local blocks of the wrong shape. */
        const spmd_tensor *x = t->in[0];
        sharding need = shard_operand_need(p, t, 0);
        return reshape_map(p->m, &need, x->rank, x->dims, t->rank, t->dims);
    }
    return project_out(n, t);
}

sharding shard_operand_need(const shard_plan *p, const spmd_tensor *t, int j)
{
    const shard_node *n = &p->nodes[t->id];
    const spmd_tensor *x = t->in[j];
    if (!n->sig) {
        /* reshape: the output's sharding carried back.  Reshape is linear,
         * so a pending sum passes through it: the operand keeps the partial
         * axes the output was given (the operand's own when unmarked).
         * Asking for it resolved here, while the output still claimed the
         * sum pending, all-reduced the value twice. */
        return reshape_map(p->m, &n->out, t->rank, t->dims, x->rank, x->dims);
    }
    sharding s = sharding_replicated(x->rank);
    for (int i = 0; i < x->rank; i++)
        if (n->sig->in[j][i] >= 0) s.dim[i] = n->iter[n->sig->in[j][i]];
    if (n->through_operands & (1u << j)) s.partial = n->through;
    return s;
}

/* Node t's signature, shared through `sigs`, and room for its choice. */
static spmd_status describe(shard_plan *p, base_intern *sigs, const spmd_tensor *t, shard_node *n)
{
    ir_dimsig sig;
    if (!ir_signature(t, &sig)) {
        if (shard_has_explicit_rule(t->op)) return SPMD_OK;
        return base_error(SPMD_ERR_INTERNAL,
                          "partition: %s has neither a dimension signature nor a "
                          "sharding rule (ops.def)", ir_op_name(t->op));
    }
    n->sig = base_intern_get(sigs, &sig);
    if (sig.n_iter) n->iter = base_arena_alloc(&p->arena, (size_t)sig.n_iter * sizeof *n->iter);
    return n->sig && (n->iter || !sig.n_iter) ? SPMD_OK : SPMD_ERR_NOMEM;
}

spmd_status shard_propagate(shard_plan *p, const spmd_graph *g, const spmd_mesh *m,
                            const bool *needed, const spmd_allocator *alloc)
{
    memset(p, 0, sizeof *p);
    p->g = g;
    p->m = m;
    p->alloc = base_allocator_or_default(alloc);
    base_arena_init(&p->arena, &p->alloc);
    p->n_nodes = g->n_nodes;
    p->nodes = base_alloc(&p->alloc, (size_t)(g->n_nodes ? g->n_nodes : 1) * sizeof *p->nodes,
                          "sharding propagation");
    if (!p->nodes) return SPMD_ERR_NOMEM;
    if (g->mesh && g->mesh != m)
        return base_error(SPMD_ERR_INVALID,
                          "partition: the graph's marks use another mesh than the one given");
    base_intern sigs;
    base_intern_init(&sigs, &p->arena, sizeof(ir_dimsig));
    spmd_status st = SPMD_OK;
    for (int i = 0; i < g->n_nodes && st == SPMD_OK; i++) {
        const spmd_tensor *t = g->nodes[i];
        shard_node *n = &p->nodes[i];
        *n = (shard_node){.out = sharding_replicated(t->rank), .data = t->op == IR_INPUT};
        for (int j = 0; j < t->n_in; j++) n->data |= p->nodes[t->in[j]->id].data;
        st = describe(p, &sigs, t, n);
        if (st != SPMD_OK || !t->mark) continue;
        if (t->mark->rank != t->rank)
            st = base_error(SPMD_ERR_SHAPE, "partition: mark of rank %d on a rank-%d tensor",
                            t->mark->rank, t->rank);
        n->out = *t->mark;
        n->level = SHARD_MARKED;
    }
    base_intern_free(&sigs);
    if (st != SPMD_OK) return st;
    while (!p->settled && p->rounds < SHARD_ROUNDS) {
        bool fwd = sweep_forward(p, needed);
        bool bwd = sweep_backward(p, needed);
        p->rounds++;
        p->settled = !fwd && !bwd;
    }
    /* Whatever is still unknown is replicated. */
    for (int i = 0; i < g->n_nodes; i++)
        if (p->nodes[i].level == SHARD_UNKNOWN) p->nodes[i].out = sharding_replicated(g->nodes[i]->rank);
    return SPMD_OK;
}

void shard_plan_free(shard_plan *p)
{
    base_free(&p->alloc, p->nodes);
    base_arena_free(&p->arena);
    memset(p, 0, sizeof *p);
}
