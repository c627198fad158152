/*
 * The plan's marks of what lives outside the arena or in a buffer of its
 * own (plan.h): views of leaves, gathers read in place or landing in
 * place, accumulators' sums computed in place, update values that trade
 * buffers with their targets.
 */
#include "compile/plan_impl.h"

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
        if (!ir_is_persistent(x) || x->accumulator ||
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

void plan_mark_outside(plan *p, const spmd_graph *g, const fusion *fu, const plan_sharing *sh)
{
    mark_gathers(p, g, sh);
    for (int i = 0; fu && fu->absorbed && i < g->n_nodes; i++)
        if (fu->absorbed[i]) p->needed[i] = false;
    mark_views(p, g);
    mark_lands(p, g, sh);
}

/* The member of fused group grp that computes v: the root, or the one
 * stored as v; -1 when grp does not compute v. */
static int member_of(const fuse_group *grp, const spmd_tensor *v)
{
    if (grp->root == v) return grp->n_steps - 1;
    for (int j = 0; j < grp->n_stored; j++)
        if (grp->stored[j] == v)
            for (int m = 0; m < grp->n_steps; m++)
                if (grp->steps[m].stored == j) return m;
    return -1;
}

/* Whether a member after m of grp reads external input x: it would find
 * the new value where member m wrote it, block by block. */
static bool read_after(const fuse_group *grp, int m, const spmd_tensor *x)
{
    for (int k = 0; k < grp->n_in; k++)
        if (grp->in[k] == x)
            for (int s = m + 1; s < grp->n_steps; s++)
                for (int j = 0; j < ir_op_formula_arity(grp->steps[s].op); j++)
                    if (grp->steps[s].src[j] == -1 - k) return true;
    return false;
}

/* Update values computed into their targets' buffers, as accumulators'
 * sums are: no second buffer per parameter and moment (GPT-2 124M's
 * AdamW held 1.5 GB of them) and none to fault in on the first step.
 * Where a program has no collective (one device, or copies that share
 * nothing), so no peer reads the target during the run; the value
 * elementwise (a formula op, or a fused group's root or stored member),
 * its own storage, not an output, of the target's bytes, one update per
 * value; the target read by no view, gather or other device, and by no
 * step after the value's, nor in the value's group by a member after
 * the value's. And the failure model holds ([Failure model], runtime.md:
 * a failed run leaves the parameters as they were): every step from the
 * value's on is elementwise, whose kernels do not fail. */
static _Thread_local bool updates_in_place_off; /* plan_test_updates_in_place(false) */

void plan_test_updates_in_place(bool on) { updates_in_place_off = !on; }

static spmd_status mark_updates_in_place(plan *p, const spmd_graph *g, const fusion *fu,
                                         const plan_sharing *sh)
{
    if (g->accumulate_steps > 1 || updates_in_place_off) return SPMD_OK;
    int ns = p->n_steps, last_failable = -1;
    for (int s = 0; s < ns; s++) {
        if (ir_op_is_collective(p->steps[s]->op)) return SPMD_OK;
        if (!elementwise(p->steps[s], fu)) last_failable = s;
    }
    size_t nn = (size_t)(g->n_nodes ? g->n_nodes : 1);
    int *prod = base_alloc(&p->alloc, nn * sizeof *prod, "memory plan");
    int *last_read = base_alloc(&p->alloc, nn * sizeof *last_read, "memory plan");
    if (!prod || !last_read) {
        base_free(&p->alloc, prod);
        base_free(&p->alloc, last_read);
        return SPMD_ERR_NOMEM;
    }
    plan_step_of_storage(p, g, fu, prod);
    for (int i = 0; i < g->n_nodes; i++) {
        last_read[i] = -1;
        /* A target some view or gather reads in place stays out. */
        if (p->view_of[i] >= 0) last_read[p->view_of[i]] = ns;
        if (p->gather_leaf[i] >= 0) last_read[p->gather_leaf[i]] = ns;
        if (p->lands_in[i] >= 0) last_read[p->lands_in[i]] = ns;
    }
    for (int s = 0; s < ns; s++) {
        const spmd_tensor *const *in;
        int n_in = reads(p->steps[s], fu, &in);
        for (int j = 0; j < n_in; j++)
            if (ir_op_is_leaf(in[j]->op) && last_read[in[j]->id] < s) last_read[in[j]->id] = s;
    }
    for (int u = 0; u < g->n_updates; u++) {
        const spmd_tensor *v = g->updates[u].value, *x = g->updates[u].target;
        int s = prod[v->id];
        if (x->accumulator || s < 0 || s <= last_failable || !p->needed[v->id] || outside(p, v) ||
            p->storage[v->id] != v->id || v->is_output || ir_nbytes(v) != ir_nbytes(x) ||
            ir_op_formula_arity(v->op) <= 0 || (sh && sh->sharers[x->id] > 1) || last_read[x->id] > s)
            continue;
        const fuse_group *grp = fusion_group(fu, p->steps[s]);
        if (grp && (member_of(grp, v) < 0 || read_after(grp, member_of(grp, v), x))) continue;
        if (!grp && p->steps[s] != v) continue;
        p->in_place[v->id] = x->id;
    }
    for (int u = 0; u < g->n_updates; u++) /* one update per value and per target */
        for (int w = 0; w < u; w++)
            if (g->updates[w].value == g->updates[u].value || g->updates[w].target == g->updates[u].target) {
                if (!g->updates[u].target->accumulator) p->in_place[g->updates[u].value->id] = -1;
                if (!g->updates[w].target->accumulator) p->in_place[g->updates[w].value->id] = -1;
            }
    base_free(&p->alloc, prod);
    base_free(&p->alloc, last_read);
    return SPMD_OK;
}

spmd_status plan_mark_buffers(plan *p, const spmd_graph *g, const fusion *fu, const plan_sharing *sh)
{
    mark_in_place(p, g);
    spmd_status st = mark_updates_in_place(p, g, fu, sh);
    if (st != SPMD_OK) return st;
    for (int i = 0; i < g->n_nodes; i++) /* a view of a value keeps it in the arena */
        if (p->needed[i] && p->storage[i] != i) p->in_place[p->storage[i]] = -1;
    mark_swapped(p, g, sh);
    return SPMD_OK;
}
