/*
 * Activation checkpointing as graph rewriting (spmd_grad_checkpointed).
 *
 * The plain backward pass (autodiff.c) reads forward activations directly,
 * and since the memory planner frees a buffer only after its last reader in
 * creation order, every activation a backward op reads stays alive from the
 * forward pass to that op.  With checkpoints, only the named tensors (and
 * the leaves) are kept; every other forward value a backward op reads is
 * recomputed in the backward pass by a clone of its forward op.
 *
 * The forward nodes are cut into segments by the checkpoints, in creation
 * order: with checkpoints c_1 < ... < c_k by id, segment s holds the nodes
 * after c_s up to and including c_{s+1} (segment 0 starts at the graph's
 * beginning), and the tail, segment k, those after c_k.  The nodes
 * after the last checkpoint (the model's head and the loss) are kept, as
 * torch.utils.checkpoint.checkpoint_sequential runs its last segment
 * normally: their backward runs right after the forward pass, so keeping
 * them costs nothing and recomputing them would only add work.  So are
 * outputs and update values, whose buffers live to the end anyway, and
 * the values a stage transfer brought: recomputing one would send it
 * again, so the stage that received it keeps it, as a checkpoint, and a
 * recomputation never leaves the stage of the value it recomputes.
 *
 * A backward node belongs to the segment of the forward node whose
 * backward rule emitted it (ir_grad reports which).  The rewrite runs
 * after the plain backward pass is built.  It walks the backward nodes in
 * their order; when one of segment s reads a forward value X that is not
 * kept, it reads instead the segment-s clone of X, built (once per
 * segment, memoised) from the clones of X's inputs down to kept values:
 * the checkpoints and leaves that bound the segment.  A value of an
 * earlier segment that segment s reads (a connection that skips a
 * checkpoint) is cloned again for s rather than shared with its own
 * segment's recompute, which comes later in the backward pass: sharing
 * would keep it alive from here to there, which is what checkpointing is
 * meant to avoid.  Clones are emitted on demand, just before their first
 * reader, so a segment's values are recomputed when its backward starts
 * (as PyTorch reruns a checkpointed function when backward reaches it),
 * and a value that only a later backward op of the segment reads is
 * recomputed just before that op rather than at the segment's start.
 *
 * Creation order is the graph's execution order and the planner's notion
 * of liveness, but ir_node_new can only append.  So the clones are
 * appended, and then the backward part of the node list is rewritten in
 * the order the walk emitted (each clone before its first reader, the
 * backward nodes in their original relative order), which is topological:
 * a clone reads forward nodes and earlier clones only.  Ids are reassigned
 * to match.  The forward part is untouched, and [backward_begin,
 * backward_end) still spans exactly the backward pass, clones included.
 */
#include "ir/ir.h"
#include "base/error.h"
#include "spmd/train.h"

#include <stdio.h>
#include <string.h>

/* One clone: forward node `id`'s clone for segment `seg`; entries of one
 * forward node are chained through `next` (a node is rarely cloned for
 * more than two segments, so a list beats a table of segments x nodes). */
typedef struct memo_entry {
    int seg;
    int next;
    spmd_tensor *clone;
} memo_entry;

/* A backward node input to point at a clone once every clone exists. */
typedef struct rewire {
    spmd_tensor *node;
    int input;
    spmd_tensor *clone;
} rewire;

typedef struct rewriter {
    spmd_graph *g;
    int n_fwd;        /* forward nodes are ids [0, n_fwd) */
    bool *is_ckpt;    /* per forward id */
    bool *kept;       /* per forward id: read from the forward pass as is */
    int *seg;         /* per forward id: its segment */
    int *head;        /* per forward id: its first memo entry, -1 if none */
    int *rule_begin;  /* per forward id: from ir_grad */
    int *bwd_seg;     /* per backward node (id - n_fwd): its segment */
    memo_entry *memo;
    int n_memo, cap_memo;
    spmd_tensor **order; /* the backward pass in its new order */
    int n_order, cap_order;
    spmd_tensor **stack; /* the depth-first walk of recompute() */
    int n_stack, cap_stack;
    rewire *rewires;
    int n_rewires, cap_rewires;
} rewriter;

/* ---- Helpers -------------------------------------------------------------------- */

/* Grow an array owned by the graph's allocator to hold `need` items. */
static bool grow(spmd_graph *g, void **items, int *cap, int need, size_t item_size)
{
    return base_grow(&g->alloc, items, cap, need, item_size, 64, "checkpoint rewrite");
}

/* The status for an ir_node_new that returned NULL: the failure it
 * recorded on g, this call's own in spmd_grad_checkpointed's error scope
 * (an allocation; a clone that its original's checks accepted being
 * refused would be a bug here). */
static spmd_status node_failed(const spmd_graph *g)
{
    if (ir_graph_status(g) == SPMD_OK)
        return BASE_INTERNAL("cloning a forward node failed without a message");
    return ir_error_raise(g);
}

static spmd_tensor *memo_find(const rewriter *r, int seg, const spmd_tensor *x)
{
    for (int e = r->head[x->id]; e >= 0; e = r->memo[e].next)
        if (r->memo[e].seg == seg) return r->memo[e].clone;
    return NULL;
}

/* What segment `seg`'s backward reads for forward node x: x itself when
 * kept, else its clone (NULL while there is none yet). */
static spmd_tensor *resolve(const rewriter *r, int seg, spmd_tensor *x)
{
    return r->kept[x->id] ? x : memo_find(r, seg, x);
}

static bool push(rewriter *r, spmd_tensor *t)
{
    if (!grow(r->g, (void **)&r->stack, &r->cap_stack, r->n_stack + 1, sizeof *r->stack))
        return false;
    r->stack[r->n_stack++] = t;
    return true;
}

static bool emit(rewriter *r, spmd_tensor *t)
{
    if (!grow(r->g, (void **)&r->order, &r->cap_order, r->n_order + 1, sizeof *r->order))
        return false;
    r->order[r->n_order++] = t;
    return true;
}

/* ---- Recompute ------------------------------------------------------------------- */

/* Make sure forward node `root` (not kept) has a clone for segment `seg`,
 * cloning first whatever of its inputs has none.  The walk is an explicit
 * depth-first stack, not recursion: a segment can be thousands of nodes
 * deep when checkpoints are sparse.  A node stays on the stack until its
 * inputs are resolved; whatever was pushed above it is finished (cloned)
 * before it is on top again, so each node is looked at at most twice. */
static spmd_status recompute(rewriter *r, int seg, spmd_tensor *root)
{
    spmd_graph *g = r->g;
    r->n_stack = 0;
    if (!push(r, root)) return SPMD_ERR_NOMEM;
    while (r->n_stack > 0) {
        spmd_tensor *t = r->stack[r->n_stack - 1];
        if (memo_find(r, seg, t)) { /* pushed twice, done already */
            r->n_stack--;
            continue;
        }
        bool ready = true;
        for (int j = 0; j < t->n_in; j++) {
            if (resolve(r, seg, t->in[j])) continue;
            if (!push(r, t->in[j])) return SPMD_ERR_NOMEM;
            ready = false;
        }
        if (!ready) continue;

        spmd_tensor *in[IR_MAX_INPUTS];
        for (int j = 0; j < t->n_in; j++) in[j] = resolve(r, seg, t->in[j]);
        spmd_tensor *c = ir_node_new(g, t->op, t->dtype, t->rank, t->dims, in, t->n_in);
        if (!c) return node_failed(g);
        /* Same op, attributes and layout: the clone computes the same
         * values with the same kernel.  It shares the user's sharding
         * mark, so a recomputed activation is laid out as the forward
         * one was.  Names stay unique to the original and outputs are
         * the original's, so neither is copied. */
        c->attr = t->attr;
        c->mark = t->mark;
        c->stage = t->stage; /* recomputed on the stage that computed it */
        c->micro = t->micro;
        if (!grow(g, (void **)&r->memo, &r->cap_memo, r->n_memo + 1, sizeof *r->memo))
            return SPMD_ERR_NOMEM;
        r->memo[r->n_memo] = (memo_entry){seg, r->head[t->id], c};
        r->head[t->id] = r->n_memo++;
        if (!emit(r, c)) return SPMD_ERR_NOMEM;
        r->n_stack--;
    }
    return SPMD_OK;
}

/* ---- Checks ------------------------------------------------------------------------ */

/* Everything a call can refuse, checked before spmd_grad appends anything
 * so that a refused call leaves the graph as it was.  `reach` (loss->id + 1
 * entries) gets "the loss depends on it". */
static spmd_status check_args(spmd_graph *g, spmd_tensor *loss, spmd_tensor *const *ckpts,
                              int n, bool **reach_out)
{
    char buf[160];
    *reach_out = NULL;
    if (!g) return base_error(SPMD_ERR_INVALID, "spmd_grad_checkpointed: graph is NULL");
    if (g->has_grad)
        return base_error(SPMD_ERR_INVALID,
                          "spmd_grad_checkpointed: the graph already has a backward pass "
                          "(spmd_grad or spmd_grad_checkpointed runs once per graph)");
    if (!loss) {
        /* A builder failed on the way to the loss: that failure is the cause. */
        if (ir_graph_status(g) != SPMD_OK) return ir_error_raise(g);
        return base_error(SPMD_ERR_INVALID, "spmd_grad_checkpointed: loss is NULL");
    }
    if (loss->graph != g)
        return base_error(SPMD_ERR_INVALID,
                          "spmd_grad_checkpointed: loss %s belongs to another graph",
                          ir_label(loss, buf, sizeof buf));
    if (n < 0)
        return base_error(SPMD_ERR_INVALID, "spmd_grad_checkpointed: %d checkpoints", n);
    if (n > 0 && !ckpts)
        return base_error(SPMD_ERR_INVALID,
                          "spmd_grad_checkpointed: checkpoints is NULL but n is %d", n);
    for (int i = 0; i < n; i++) {
        if (ckpts[i]) continue;
        /* As with builders: a NULL from a failed builder reports that failure. */
        if (ir_graph_status(g) != SPMD_OK) return ir_error_raise(g);
        return base_error(SPMD_ERR_INVALID, "spmd_grad_checkpointed: checkpoint %d is NULL", i);
    }

    bool *reach = base_calloc(&g->alloc, ((size_t)loss->id + 1) * sizeof *reach,
                              "checkpoint reachability");
    if (!reach) return SPMD_ERR_NOMEM;
    reach[loss->id] = true;
    ir_mark_inputs(g, reach, loss->id);
    *reach_out = reach;

    for (int i = 0; i < n; i++) {
        const spmd_tensor *c = ckpts[i];
        if (c->graph != g)
            return base_error(SPMD_ERR_INVALID,
                              "spmd_grad_checkpointed: checkpoint %d belongs to another graph",
                              i);
        if (ir_op_is_leaf(c->op))
            return base_error(SPMD_ERR_INVALID,
                              "spmd_grad_checkpointed: checkpoint %d, %s, is a %s: leaves are "
                              "always kept, so only computed tensors can be checkpoints",
                              i, ir_label(c, buf, sizeof buf), ir_op_name(c->op));
        if (c->id > loss->id || !reach[c->id]) {
            char lb[160];
            return base_error(SPMD_ERR_INVALID,
                              "spmd_grad_checkpointed: checkpoint %d, %s, is not part of the "
                              "forward pass of the loss %s (the loss does not depend on it)",
                              i, ir_label(c, buf, sizeof buf), ir_label(loss, lb, sizeof lb));
        }
    }
    return SPMD_OK;
}

/* ---- The rewrite ---------------------------------------------------------------------- */

/* Segments, kept values, clones and the new backward order (see the top
 * of the file).  On failure nothing has been rewired yet, so dropping the
 * clones (nothing else refers to them) leaves the plain backward pass. */
static spmd_status rewrite(rewriter *r, spmd_tensor *const *ckpts, int n)
{
    spmd_graph *g = r->g;
    int nf = r->n_fwd, be = g->backward_end;

    for (int i = 0; i < n; i++) r->is_ckpt[ckpts[i]->id] = true;
    int last = -1;
    for (int i = 0; i < nf; i++)
        if (r->is_ckpt[i]) last = i;
    int s = 0;
    for (int i = 0; i < nf; i++) {
        const spmd_tensor *t = g->nodes[i];
        r->seg[i] = s;
        if (r->is_ckpt[i]) s++;
        /* A stage transfer is kept on the stage it reaches: recomputing it
         * would send the value again, and would reach back to the stage
         * it left (docs/DESIGN.md, "Pipeline stages"). */
        r->kept[i] = ir_op_is_leaf(t->op) || r->is_ckpt[i] || i > last || t->is_output ||
                     t->op == IR_STAGE_TRANSFER;
        r->head[i] = -1;
    }
    for (int i = 0; i < g->n_updates; i++) {
        const spmd_tensor *v = g->updates[i].value;
        if (v->id < nf) r->kept[v->id] = true;
    }

    /* Each backward node's segment: that of the forward node whose rule
     * emitted it.  A rule that emitted nothing (a parameter's) shares its
     * start with the next rule, which runs later and so wins here.  The
     * loss's seed, before every rule, reads nothing; call it the tail's. */
    for (int b = nf; b < be; b++) r->bwd_seg[b - nf] = -1;
    for (int i = nf - 1; i >= 0; i--)
        if (r->rule_begin[i] >= nf && r->rule_begin[i] < be)
            r->bwd_seg[r->rule_begin[i] - nf] = r->seg[i];
    for (int b = nf, cur = s; b < be; b++) {
        if (r->bwd_seg[b - nf] >= 0) cur = r->bwd_seg[b - nf];
        r->bwd_seg[b - nf] = cur;
    }

    spmd_status st = SPMD_OK;
    for (int i = nf; i < be && st == SPMD_OK; i++) {
        /* g->nodes moves when ir_node_new grows it: index it afresh. */
        spmd_tensor *b = g->nodes[i];
        for (int j = 0; j < b->n_in && st == SPMD_OK; j++) {
            spmd_tensor *x = b->in[j];
            if (x->id >= nf || r->kept[x->id]) continue;
            int seg = r->bwd_seg[i - nf];
            st = recompute(r, seg, x);
            if (st == SPMD_OK && !grow(g, (void **)&r->rewires, &r->cap_rewires,
                                       r->n_rewires + 1, sizeof *r->rewires))
                st = SPMD_ERR_NOMEM;
            if (st == SPMD_OK) r->rewires[r->n_rewires++] = (rewire){b, j, memo_find(r, seg, x)};
        }
        if (st == SPMD_OK && !emit(r, b)) st = SPMD_ERR_NOMEM;
    }
    if (st == SPMD_OK && r->n_order != g->n_nodes - nf)
        st = BASE_INTERNAL("the rewritten backward pass lost or duplicated nodes");
    if (st != SPMD_OK) {
        g->n_nodes = be;
        return st;
    }

    for (int i = 0; i < r->n_rewires; i++) {
        const rewire *w = &r->rewires[i];
        w->node->in[w->input] = w->clone;
    }
    for (int i = 0; i < r->n_order; i++) {
        g->nodes[nf + i] = r->order[i];
        r->order[i]->id = nf + i;
    }
    g->backward_end = g->n_nodes;
    return SPMD_OK;
}

spmd_status spmd_grad_checkpointed(spmd_graph *g, spmd_tensor *loss,
                                   spmd_tensor *const *checkpoints, int n)
{
    bool *reach = NULL;
    spmd_status st = check_args(g, loss, checkpoints, n, &reach);
    if (reach) base_free(&g->alloc, reach);
    if (st != SPMD_OK) return st;

    if (n == 0) return spmd_grad(g, loss);

    int nf = g->n_nodes;
    size_t nn = (size_t)(nf ? nf : 1);
    rewriter r = {.g = g, .n_fwd = nf};
    r.rule_begin = base_alloc(&g->alloc, nn * sizeof *r.rule_begin, "checkpoint rewrite");
    if (!r.rule_begin) return SPMD_ERR_NOMEM;
    ir_failure outer;
    ir_error_scope_begin(g, &outer);
    st = ir_grad(g, loss, r.rule_begin);
    if (st == SPMD_OK && g->backward_begin != nf)
        st = BASE_INTERNAL("the backward pass does not start after the forward pass");
    if (st == SPMD_OK) {
        size_t nb = (size_t)(g->n_nodes - nf ? g->n_nodes - nf : 1);
        r.is_ckpt = base_calloc(&g->alloc, nn * sizeof *r.is_ckpt, "checkpoint rewrite");
        r.kept = base_calloc(&g->alloc, nn * sizeof *r.kept, "checkpoint rewrite");
        r.seg = base_alloc(&g->alloc, nn * sizeof *r.seg, "checkpoint rewrite");
        r.head = base_alloc(&g->alloc, nn * sizeof *r.head, "checkpoint rewrite");
        r.bwd_seg = base_alloc(&g->alloc, nb * sizeof *r.bwd_seg, "checkpoint rewrite");
        if (!r.is_ckpt || !r.kept || !r.seg || !r.head || !r.bwd_seg) st = SPMD_ERR_NOMEM;
        else st = rewrite(&r, checkpoints, n);
    }

    base_free(&g->alloc, r.rule_begin);
    base_free(&g->alloc, r.bwd_seg);
    base_free(&g->alloc, r.is_ckpt);
    base_free(&g->alloc, r.kept);
    base_free(&g->alloc, r.seg);
    base_free(&g->alloc, r.head);
    base_free(&g->alloc, r.memo);
    base_free(&g->alloc, r.order);
    base_free(&g->alloc, r.stack);
    base_free(&g->alloc, r.rewires);
    ir_error_scope_end(g, &outer);
    return st;
}
