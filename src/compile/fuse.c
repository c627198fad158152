/* Fusion of elementwise chains (see fuse.h). */
#include "compile/fuse.h"

#include "base/arena.h"
#include "base/error.h"

#include <string.h>

/* A use that keeps a node out of every group: it must be in memory. */
enum { PINNED = 1 << 20 };

/* The ops with an elementwise formula in ops.def: kern_fused computes
 * them. */
static bool fusible_op(ir_op op) { return ir_op_formula_arity(op) > 0; }

static bool same_dims(const spmd_tensor *a, const spmd_tensor *b)
{
    if (a->rank != b->rank) return false;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i] != b->dims[i]) return false;
    return true;
}

/* Whether x, broadcast to the root's shape, repeats as a trailing block of
 * it (a scalar, a bias over rows, the same shape): element i of the root
 * reads element i % numel(x).  Its leading dims beyond the block are 1. */
static bool trailing_block(const spmd_tensor *x, const spmd_tensor *root)
{
    if (x->dtype != SPMD_F32 || x->rank > root->rank) return false;
    int off = root->rank - x->rank, i = 0;
    while (i < x->rank && x->dims[i] == 1) i++; /* leading ones */
    for (; i < x->rank; i++)
        if (x->dims[i] != root->dims[i + off]) return false;
    return true;
}

typedef struct builder {
    const spmd_graph *g;
    const bool *needed;
    const bool *micro; /* NULL, or per node: run by micro-batches (fusion_build) */
    const int *uses;
    const int *updates; /* per node: updates it is the value of */
    bool *taken;       /* already a member or a root of a group */
    fuse_group *grp;
    int member_id[FUSE_MAX_MEMBERS]; /* node ids, as steps */
    int pending;       /* members begun and not yet added (ancestors on the way down) */
    bool full;         /* an input found no room: the group is given up */
    bool share;        /* absorb nodes read several times, if all their readers join */
} builder;

/* Whether x runs when the group's root does: a micro-batch runs whole
 * groups, and a device its stage's nodes (docs/DESIGN.md, "Pipeline
 * stages"). */
static bool same_run(const builder *b, const spmd_tensor *x)
{
    if (x->stage != b->grp->root->stage) return false; /* devices run their stage's nodes */
    if (x->micro != b->grp->root->micro) return false;  /* 1F1B runs them apart */
    return !b->micro || b->micro[x->id] == b->micro[b->grp->root->id];
}

/* Whether x may be computed inside the group rather than read: an
 * elementwise f32 node of the root's shape that only this consumer reads. */
static bool absorbable(const builder *b, const spmd_tensor *x)
{
    return fusible_op(x->op) && x->dtype == SPMD_F32 && b->needed[x->id] && !b->taken[x->id] &&
           b->uses[x->id] == 1 && same_dims(x, b->grp->domain) && same_run(b, x);
}

/* Whether x, read more than once, may be computed inside the group: the
 * group must then hold every one of its readers (checked when it is
 * complete: all_readers_inside). */
static bool shareable(const builder *b, const spmd_tensor *x)
{
    return b->share && fusible_op(x->op) && x->dtype == SPMD_F32 && b->needed[x->id] &&
           !b->taken[x->id] && b->uses[x->id] > 1 && b->uses[x->id] < PINNED &&
           same_dims(x, b->grp->domain) && same_run(b, x);
}

/* x's step if it is a member already (a shared one met again), else -1. */
static int member_step(const builder *b, const spmd_tensor *x)
{
    for (int k = 0; k < b->grp->n_steps; k++)
        if (b->member_id[k] == x->id) return k;
    return -1;
}

/* Whether every reader of each shared member is in the group. */
static bool all_readers_inside(const builder *b)
{
    const fuse_group *grp = b->grp;
    for (int k = 0; k < grp->n_steps; k++) {
        int readers = 0, id = b->member_id[k];
        if (b->uses[id] <= 1 || b->uses[id] >= PINNED) continue;
        for (int s = 0; s < grp->n_steps; s++) {
            int n_in = b->g->nodes[b->member_id[s]]->n_in;
            for (int j = 0; j < n_in; j++) readers += grp->steps[s].src[j] == k;
        }
        if (readers != b->uses[id]) return false;
    }
    return true;
}

/* Whether x may be computed inside the group and stored besides the root:
 * an update's value (one update, not an output) that only this consumer
 * otherwise reads, with room for another stored member. */
static bool storable(const builder *b, const spmd_tensor *x)
{
    return fusible_op(x->op) && x->dtype == SPMD_F32 && b->needed[x->id] && !b->taken[x->id] &&
           !x->is_output && b->updates[x->id] == 1 && b->uses[x->id] == PINNED + 1 &&
           same_dims(x, b->grp->domain) && b->grp->n_stored < FUSE_MAX_STORED && same_run(b, x);
}

/* Whether t sums every element of its f32 operand into one: a root whose
 * operand's chain may be fused (kern_sum adds such a sum in one run of
 * KN_LANES double lanes, on one thread, which kern_fused repeats). */
static bool sums_everything(const spmd_tensor *t)
{
    if (t->op != IR_SUM || t->dtype != SPMD_F32 || ir_numel(t) != 1) return false;
    const spmd_tensor *x = t->in[0];
    if (x->dtype != SPMD_F32) return false;
    for (int d = 0; d < x->rank; d++)
        if (x->dims[d] != 1 && !(t->attr.reduce.axes >> d & 1u)) return false;
    return true;
}

/* Whether node t can be a member: each operand absorbable (checked again
 * as it is added) or readable as a trailing block. */
static bool member_ok(const builder *b, const spmd_tensor *t)
{
    if (!fusible_op(t->op) || t->dtype != SPMD_F32) return false;
    for (int j = 0; j < t->n_in; j++)
        if (!absorbable(b, t->in[j]) && !trailing_block(t->in[j], b->grp->domain)) return false;
    return true;
}

/* x's index among the group's inputs, as an operand (-1 - k); 0 when
 * there is no room for another. */
static int external(builder *b, const spmd_tensor *x)
{
    fuse_group *grp = b->grp;
    for (int k = 0; k < grp->n_in; k++)
        if (grp->in[k] == x) return -1 - k;
    if (grp->n_in == IR_MAX_INPUTS) return 0;
    grp->in[grp->n_in] = x;
    grp->in_numel[grp->n_in] = ir_numel(x);
    return -1 - grp->n_in++;
}

/* Add t (member_ok) after the operands it absorbs; its step index. */
static int add_member(builder *b, const spmd_tensor *t)
{
    b->pending++;
    b->taken[t->id] = true;
    fuse_step s = {.op = t->op, .src = {0, 0, 0}, .stored = -1,
                   .c = ir_op_formula_arity(t->op) == 1 ? t->attr.scale.c : 0.0f};
    for (int j = 0; j < t->n_in; j++) {
        const spmd_tensor *x = t->in[j];
        /* Every member begun needs its step: absorb only with room left. */
        bool room = b->grp->n_steps + b->pending < FUSE_MAX_MEMBERS;
        int again = b->taken[x->id] ? member_step(b, x) : -1;
        if (again >= 0) {
            s.src[j] = (int8_t)again;
        } else if (room && (absorbable(b, x) || shareable(b, x)) && member_ok(b, x)) {
            s.src[j] = (int8_t)add_member(b, x);
        } else if (room && storable(b, x) && member_ok(b, x)) {
            int k = b->grp->n_stored;
            b->grp->stored[b->grp->n_stored++] = x;
            s.src[j] = (int8_t)add_member(b, x);
            b->grp->steps[s.src[j]].stored = (int8_t)k;
        } else {
            int k = external(b, x);
            if (k == 0) b->full = true;
            s.src[j] = (int8_t)k;
        }
    }
    b->pending--;
    b->member_id[b->grp->n_steps] = t->id;
    b->grp->steps[b->grp->n_steps] = s;
    return b->grp->n_steps++;
}

spmd_status fusion_build(fusion *f, const spmd_graph *g, const bool *needed, const bool *micro,
                         const spmd_allocator *alloc)
{
    memset(f, 0, sizeof *f);
    f->alloc = base_allocator_or_default(alloc);
    size_t nn = (size_t)(g->n_nodes ? g->n_nodes : 1);
    int *uses = base_calloc(&f->alloc, 2 * nn * sizeof *uses, "fusion");
    int *updates = uses + nn;
    f->group_of = base_alloc(&f->alloc, nn * sizeof *f->group_of, "fusion");
    f->absorbed = base_calloc(&f->alloc, nn * sizeof *f->absorbed, "fusion");
    f->stored = base_calloc(&f->alloc, nn * sizeof *f->stored, "fusion");
    bool *taken = base_calloc(&f->alloc, nn * sizeof *taken, "fusion");
    int cap = 0;
    spmd_status st = uses && f->group_of && f->absorbed && f->stored && taken ? SPMD_OK : SPMD_ERR_NOMEM;
    for (int i = 0; st == SPMD_OK && i < g->n_nodes; i++) {
        const spmd_tensor *t = g->nodes[i];
        f->group_of[i] = -1;
        if (!needed[i]) continue;
        for (int j = 0; j < t->n_in; j++) uses[t->in[j]->id]++;
        if (t->is_output) uses[i] += PINNED;
    }
    for (int i = 0; st == SPMD_OK && i < g->n_updates; i++) {
        uses[g->updates[i].value->id] += PINNED;
        updates[g->updates[i].value->id]++;
    }

    /* Roots from the end, so a chain joins the group of its last node. */
    fuse_group grp;
    for (int i = g->n_nodes - 1; st == SPMD_OK && i >= 0; i--) {
        const spmd_tensor *t = g->nodes[i];
        if (!needed[i] || taken[i] || ir_op_is_leaf(t->op)) continue;
        memset(&grp, 0, sizeof grp);
        grp.root = grp.domain = t;
        builder b = {.g = g, .needed = needed, .micro = micro, .uses = uses, .updates = updates,
                     .taken = taken, .grp = &grp};
        if (sums_everything(t)) {
            /* A sum root: its operand's chain, then the sum. */
            grp.domain = t->in[0];
            grp.sum = true;
            if (!absorbable(&b, t->in[0]) || !member_ok(&b, t->in[0])) continue;
            taken[i] = true;
            b.pending = 1; /* the sum's own step, after its members */
            int src = add_member(&b, t->in[0]);
            b.pending = 0;
            if (b.full) {
                for (int k = 0; k < grp.n_steps; k++) taken[b.member_id[k]] = false;
                continue;
            }
            b.member_id[grp.n_steps] = i;
            grp.steps[grp.n_steps++] = (fuse_step){.op = t->op, .src = {(int8_t)src, 0, 0}, .stored = -1};
        } else if (!member_ok(&b, t)) {
            continue;
        } else {
            /* First with members read several times; if one of their
             * readers stays outside, again without. */
            b.share = true;
            add_member(&b, t);
            if (!b.full && !all_readers_inside(&b)) {
                for (int k = 0; k < grp.n_steps; k++) taken[b.member_id[k]] = false;
                memset(&grp, 0, sizeof grp);
                grp.root = grp.domain = t;
                b = (builder){.g = g, .needed = needed, .micro = micro, .uses = uses,
                              .updates = updates, .taken = taken, .grp = &grp};
                add_member(&b, t);
            }
        }
        if (b.full || grp.n_steps < 2) {
            /* Not a group: its would-be members run on their own. */
            for (int k = 0; k < grp.n_steps; k++) taken[b.member_id[k]] = false;
            taken[i] = true;
            continue;
        }
        if (!base_grow(&f->alloc, (void **)&f->groups, &cap, f->n_groups + 1, sizeof grp, 16, "fusion")) {
            st = SPMD_ERR_NOMEM;
            break;
        }
        f->group_of[i] = f->n_groups;
        f->groups[f->n_groups++] = grp;
        for (int k = 0; k < grp.n_steps - 1; k++) {
            bool keeps = grp.steps[k].stored >= 0;
            f->stored[b.member_id[k]] = keeps;
            f->absorbed[b.member_id[k]] = !keeps;
        }
    }
    base_free(&f->alloc, uses);
    base_free(&f->alloc, taken);
    if (st != SPMD_OK) fusion_free(f);
    return st;
}

void fusion_free(fusion *f)
{
    if (!f->group_of && !f->groups && !f->absorbed && !f->stored) return;
    base_free(&f->alloc, f->groups);
    base_free(&f->alloc, f->group_of);
    base_free(&f->alloc, f->absorbed);
    base_free(&f->alloc, f->stored);
    memset(f, 0, sizeof *f);
}

const fuse_group *fusion_group(const fusion *f, const spmd_tensor *t)
{
    if (!f || !f->group_of) return NULL;
    int k = f->group_of[t->id];
    return k >= 0 ? &f->groups[k] : NULL;
}

int fusion_block(const fuse_group *g)
{
    return ir_numel(g->domain) >= FUSE_LARGE ? FUSE_BLOCK_LARGE : FUSE_BLOCK;
}

size_t fusion_scratch_bytes(const fuse_group *g)
{
    int spare = 2;
    for (int k = 0; k < g->n_steps; k++)
        if (ir_op_formula_arity(g->steps[k].op) > spare) spare = ir_op_formula_arity(g->steps[k].op);
    return (size_t)(g->n_steps + spare) * (size_t)fusion_block(g) * sizeof(float);
}
