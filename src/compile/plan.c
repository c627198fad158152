/*
 * Building the schedule and liveness-based memory plan (see plan.h): the
 * steps, the marks and the order (plan_impl.h names the files of each
 * pass), then the placement.
 *
 * Buffers are placed greedily in execution order: a step's output is
 * placed before the buffers that die at that step are released, so an
 * output never overlaps its own inputs (kernels are not in-place).
 */
#include "compile/plan_impl.h"
#include "base/error.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { ALIGN = 64 };

static int64_t round_up(int64_t n) { return (n + ALIGN - 1) / ALIGN * ALIGN; }

/* The arena in regions (docs/DESIGN.md, "Pipeline stages"): with stages,
 * each stage's values are planned in a region of their own after the
 * values of no stage (region 0, every device's), so that a device
 * allocates the common region and its stage's only and each stage's
 * buffers are reused along its own steps.  A transfer's result is its
 * receiver's.  Without stages there is one region: the plan as it was. */
typedef struct regions {
    freelist *f; /* [n] */
    int n;       /* 1, or 1 + the stages */
} regions;

static int stage_of_value(const spmd_tensor *t)
{
    return t->op == IR_STAGE_TRANSFER ? t->attr.stage.to : t->stage;
}

static int region_count(const spmd_graph *g, const plan_stages *stg)
{
    int stages = 0;
    if (!stg) return 1;
    for (int i = 0; i < g->n_nodes; i++) {
        int st = stage_of_value(g->nodes[i]);
        if (st + 1 > stages) stages = st + 1;
    }
    return stages > 0 ? stages + 1 : 1;
}

static freelist *region_of(const regions *r, const plan *p, const spmd_graph *g, int id)
{
    return r->n > 1 ? &r->f[stage_of_value(g->nodes[p->storage[id]]) + 1] : &r->f[0];
}

static int64_t take(const regions *r, const plan *p, const spmd_graph *g, const spmd_tensor *t)
{
    return freelist_take(region_of(r, p, g, t->id), round_up((int64_t)ir_nbytes(t)));
}

static void give(const regions *r, const plan *p, const spmd_graph *g, int id)
{
    freelist_give(region_of(r, p, g, id), p->offset[id], round_up((int64_t)ir_nbytes(g->nodes[id])));
}

/* Bytes taken and not given back: the common region's and the most of
 * one stage's (what one device holds). */
static int64_t live_bytes(const regions *r)
{
    int64_t most = 0;
    for (int k = 1; k < r->n; k++)
        if (r->f[k].live > most) most = r->f[k].live;
    return r->f[0].live + most;
}

/* Lay the regions out: the common one first, each stage's after it (all
 * stages' at the same offsets: a device holds one); the arena is the
 * largest, and each stage's size recorded. */
static spmd_status lay_out(plan *p, const spmd_graph *g, const regions *r)
{
    int64_t common = round_up(r->f[0].end), most = 0;
    for (int k = 1; k < r->n; k++)
        if (r->f[k].end > most) most = r->f[k].end;
    p->arena_bytes = (size_t)(common + most);
    if (r->n == 1) return SPMD_OK;
    for (int i = 0; i < g->n_nodes; i++)
        if (p->offset[i] >= 0 && !p->swapped[i] && p->in_place[i] < 0 &&
            stage_of_value(g->nodes[p->storage[i]]) >= 0)
            p->offset[i] += common;
    p->n_stage_arenas = r->n - 1;
    p->stage_arena_bytes = base_alloc(&p->alloc, (size_t)p->n_stage_arenas * sizeof *p->stage_arena_bytes,
                                      "memory plan");
    if (!p->stage_arena_bytes) return SPMD_ERR_NOMEM;
    for (int k = 1; k < r->n; k++) p->stage_arena_bytes[k - 1] = (size_t)(common + r->f[k].end);
    return SPMD_OK;
}

void plan_step_of_storage(const plan *p, const spmd_graph *g, const fusion *fu, int *prod)
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

/* The memory plan in schedule order, where plan_reorder or plan_hoist_sums made it
 * other than the creation order: each storage is placed at the step that
 * writes it and released after the last step that reads it.  With
 * collectives in flight (depth > 0) a collective's result is placed when
 * it is handed over, and its operand released only after the step it is
 * waited for at, so that no step's buffer overlaps either while the
 * communication thread reads and writes them. */
static spmd_status place_scheduled(plan *p, const spmd_graph *g, const fusion *fu, int depth,
                                   size_t budget, const regions *r)
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
    if (st == SPMD_OK && depth > 0) st = plan_schedule_async(p, g, fu, depth, budget, written_in_place);
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
            /* The backward pass begins at its first step (plan_reorder and
             * plan_hoist_sums move only later steps, and only after one of its). */
            if (!held && g->backward_begin > 0 && p->steps[s]->id >= g->backward_begin) {
                p->held_bytes = (size_t)live_bytes(r);
                held = true;
            }
            for (; k < p->n_async && p->start_at[k] == s; k++) {
                const spmd_tensor *c = p->steps[p->async_step[k]];
                if (!p->swapped[c->id]) p->offset[c->id] = take(r, p, g, c);
            }
            const spmd_tensor *t = p->steps[s];
            const fuse_group *grp = fusion_group(fu, t);
            for (int j = 0; grp && j < grp->n_stored; j++) {
                const spmd_tensor *m = grp->stored[j];
                if (!p->swapped[m->id] && p->in_place[m->id] < 0 && p->offset[m->id] < 0)
                    p->offset[m->id] = take(r, p, g, m);
            }
            if (!p->swapped[t->id] && p->in_place[t->id] < 0 && p->offset[t->id] < 0)
                p->offset[t->id] = take(r, p, g, t);
            for (int d = head[s]; d >= 0; d = next[d])
                if (p->offset[d] >= 0) give(r, p, g, d);
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
                         int depth, size_t budget, const plan_sharing *sh, const plan_stages *stg)
{
    const int64_t *priority = stg ? stg->priority : NULL;
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
    regions r = {NULL, region_count(g, stg)};
    free_block *slots = base_alloc(&p->alloc, (size_t)r.n * (nn + 1) * sizeof *slots, "memory plan");
    r.f = base_alloc(&p->alloc, (size_t)r.n * sizeof *r.f, "memory plan");
    if (!p->steps || !p->needed || !p->storage || !p->offset || !p->swapped || !p->in_place ||
        !p->view_of || !p->gather_leaf || !p->lands_in || !last_use || !slots || !r.f) {
        base_free(&p->alloc, last_use);
        base_free(&p->alloc, slots);
        base_free(&p->alloc, r.f);
        plan_free(p);
        return SPMD_ERR_NOMEM;
    }
    for (int k = 0; k < r.n; k++) r.f[k] = freelist_empty(slots + (size_t)k * (nn + 1));

    plan_mark_needed(g, p->needed);
    plan_mark_outside(p, g, fu, sh);
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
    spmd_status ordered = depth > 0 || priority ? plan_reorder(p, g, fu, priority) : SPMD_OK;
    if (ordered != SPMD_OK) {
        base_free(&p->alloc, last_use);
        base_free(&p->alloc, slots);
        base_free(&p->alloc, r.f);
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
    bool moved = false;
    spmd_status st = plan_mark_buffers(p, g, fu, sh);
    if (st == SPMD_OK) st = plan_hoist_sums(p, g, fu, &moved);
    if (st == SPMD_OK && (depth > 0 || moved || priority)) {
        st = place_scheduled(p, g, fu, depth, budget, &r);
    } else if (st == SPMD_OK) {
        /* Walk nodes in order: place each computed storage at its first
         * definition, release storages whose last reader is this node. */
        for (int i = 0; i < n; i++) {
            const spmd_tensor *t = g->nodes[i];
            if (i == g->backward_begin && i > 0) p->held_bytes = (size_t)live_bytes(&r);
            if (!p->needed[i] || outside(p, t)) continue;
            int s = p->storage[i];
            /* A value in a buffer of its own, or its target's, takes no
             * arena, but its inputs die here all the same (a gradient, into
             * its accumulator). */
            if (!p->swapped[i] && p->in_place[i] < 0)
                p->offset[i] = s == i ? take(&r, p, g, t) : p->offset[s];
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
                if (!seen) give(&r, p, g, src);
            }
        }
    }
    if (st == SPMD_OK) st = lay_out(p, g, &r);
    p->serial_arena_bytes = p->arena_bytes;
    for (int k = 0; k < r.n; k++) freelist_tally(&r.f[k]);
    base_free(&p->alloc, last_use);
    base_free(&p->alloc, slots);
    base_free(&p->alloc, r.f);
    if (st != SPMD_OK) plan_free(p);
    return st;
}

spmd_status plan_build(plan *p, const spmd_graph *g, const spmd_allocator *alloc, const fusion *fu)
{
    return build(p, g, alloc, fu, 0, 0, NULL, NULL);
}

spmd_status plan_build_overlap(plan *p, const spmd_graph *g, const spmd_allocator *alloc,
                               const fusion *fu, int depth, size_t budget, const plan_sharing *sh,
                               const plan_stages *stages)
{
    bool any = false;
    for (int i = 0; depth > 0 && i < g->n_nodes && !any; i++) any = ir_op_may_fly(g->nodes[i]->op);
    if (!any) return build(p, g, alloc, fu, 0, 0, sh, stages);
    /* The arena without overlap first, for explain's extra bytes. */
    spmd_status st = build(p, g, alloc, fu, 0, 0, sh, stages);
    if (st != SPMD_OK) return st;
    size_t serial = p->arena_bytes;
    plan_free(p);
    if ((st = build(p, g, alloc, fu, depth, budget, sh, stages)) != SPMD_OK) return st;
    p->serial_arena_bytes = serial;
    return SPMD_OK;
}

void plan_free(plan *p)
{
    base_free(&p->alloc, p->steps);
    base_free(&p->alloc, p->needed);
    base_free(&p->alloc, p->storage);
    base_free(&p->alloc, p->offset);
    base_free(&p->alloc, p->stage_arena_bytes);
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
