/*
 * The partitioner and the resharding planner (see partition.h).
 *
 * Every global node gets a local node with the padded block shape of the
 * sharding its op produces.  Operands are resharded to what the op needs
 * by reshard(), which orders its steps to move the fewest bytes: pending
 * sums go first into reduce-scatters where the target splits a dim over
 * the summed axes, then free local slices shrink the value, then the
 * remaining sums are all-reduced, then axes that must leave a dim are
 * moved (all-to-all) or gathered, then the last slices.  Each resharded
 * value is cached per (node, sharding); a parameter is resharded again in
 * each phase (ZeRO-3), so its forward gather dies before the backward pass.
 */
#include "shard/partition.h"
#include "shard/cost.h"
#include "base/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

typedef struct variant {
    const sharding *s;   /* a copy shared through builder.shardings */
    spmd_tensor *t;
    int phase;           /* part_phase it was made for; -1: the node's own value */
    struct variant *next;
} variant;

typedef struct builder {
    partition *p;
    variant **variants; /* per global node id; the first is what the op produced */
    /* The variants and their shardings (one copy of each), freed when the
     * local program is built, so that what comes next reuses the memory. */
    base_arena arena;
    base_intern shardings;
    int node;            /* the global node being partitioned, for messages */
    /* The one failure channel: the first failure of any step, its status
     * and message together, set only by record(). */
    ir_failure failure;
} builder;

/* ---- Failures ------------------------------------------------------------------------ */

/* Every failure of a step goes through here: the first one is kept, with
 * its message, and partition_build reports it.  A step that fails
 * returns NULL (or a status) only after recording why. */
static spmd_status record(builder *b, spmd_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static spmd_status record(builder *b, spmd_status status, const char *fmt, ...)
{
    if (b->failure.status == SPMD_OK) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(b->failure.message, sizeof b->failure.message, fmt, ap);
        va_end(ap);
        b->failure.status = status;
    }
    return b->failure.status;
}

/* An allocation of the partitioner's own failed; returns NULL for the
 * caller to pass on. */
static void *fail_nomem(builder *b, const char *what)
{
    record(b, SPMD_ERR_NOMEM, "partition: out of memory for %s", what);
    return NULL;
}

/* A builder call on the local graph: when it refused (NULL), the local
 * graph keeps why, its first failure with its message, which is recorded.
 * A refusal without one is a libspmd bug, reported where the call is. */
static spmd_tensor *local_call(builder *b, spmd_tensor *t, const char *file, int line)
{
    if (t) return t;
    const spmd_graph *lg = b->p->local;
    if (ir_graph_status(lg) != SPMD_OK) record(b, lg->failure.status, "%s", lg->failure.message);
    else
        record(b, SPMD_ERR_INTERNAL, "internal error at %s:%d: partition: node %d: a builder "
               "call on the local graph failed without recording why", file, line, b->node);
    return NULL;
}
#define LOCAL(b, call) local_call((b), (call), __FILE__, __LINE__)

/* The status of a step that returned NULL: what it recorded.  Every path
 * to a NULL records; should one not, that is a libspmd bug, reported with
 * the place that found it. */
static spmd_status step_failed(builder *b, const char *file, int line)
{
    if (b->failure.status != SPMD_OK) return b->failure.status;
    return record(b, SPMD_ERR_INTERNAL, "internal error at %s:%d: partition: node %d: a step "
                  "failed without recording why", file, line, b->node);
}
#define failed(b) step_failed((b), __FILE__, __LINE__)

/* ---- Growing arrays ------------------------------------------------------------ */

static bool grow(partition *p, void **items, int *cap, int need, size_t size)
{
    return base_grow(&p->alloc, items, cap, need, size, 16, "partition report");
}

static int spec_index(partition *p, const mesh_axes *axes)
{
    for (int i = 0; i < p->n_specs; i++)
        if (p->specs[i].n == axes->n && !memcmp(p->specs[i].axis, axes->axis, (size_t)axes->n))
            return i;
    if (!grow(p, (void **)&p->specs, &p->cap_specs, p->n_specs + 1, sizeof *p->specs)) return -1;
    p->specs[p->n_specs] = *axes;
    return p->n_specs++;
}

part_phase partition_phase(const spmd_graph *g, int node)
{
    if (!g->has_grad || node < g->backward_begin) return PART_FORWARD;
    if (node < g->backward_end) return PART_BACKWARD;
    return PART_UPDATE;
}

const char *partition_phase_name(part_phase phase)
{
    static const char *const names[] = {"forward", "backward", "update"};
    return names[phase];
}

const char *partition_collective_name(ir_op kind)
{
    switch (kind) {
    case IR_ALL_GATHER: return "all-gather";
    case IR_REDUCE_SCATTER: return "reduce-scatter";
    case IR_ALL_REDUCE: return "all-reduce";
    case IR_ALL_TO_ALL: return "all-to-all";
    default: return ir_op_name(kind);
    }
}

/* ---- Axis lists --------------------------------------------------------------------- */

static bool is_prefix(const mesh_axes *a, const mesh_axes *b)
{
    return a->n <= b->n && !memcmp(a->axis, b->axis, (size_t)a->n);
}

static int common_prefix(const mesh_axes *a, const mesh_axes *b)
{
    int k = 0;
    while (k < a->n && k < b->n && a->axis[k] == b->axis[k]) k++;
    return k;
}

static mesh_axes tail(const mesh_axes *a, int from)
{
    mesh_axes t = {0};
    for (int i = from; i < a->n; i++) t.axis[t.n++] = a->axis[i];
    return t;
}

static void append(mesh_axes *a, const mesh_axes *more)
{
    for (int i = 0; i < more->n; i++) a->axis[a->n++] = more->axis[i];
}

static uint32_t used_axes(const sharding *s) { return sharding_dim_axes(s) | s->partial; }

/* ---- Emitting per-device ops ---------------------------------------------------------- */

static spmd_tensor *emit_coll(builder *b, ir_op kind, spmd_tensor *x, const mesh_axes *axes,
                              int dim, int dim2, int64_t global, const int64_t *dims, int gid,
                              int consumer)
{
    partition *p = b->p;
    if (!x) return NULL;
    int spec = spec_index(p, axes);
    if (spec < 0) return fail_nomem(b, "the collective groups");
    spmd_tensor *t = LOCAL(b, ir_node_new(p->local, kind, x->dtype, x->rank, dims, &x, 1));
    if (!t) return NULL;
    t->attr.coll.spec = spec;
    t->attr.coll.dim = dim;
    t->attr.coll.dim2 = dim2;
    t->attr.coll.global = global;
    if (kind == IR_SHARD_SLICE || kind == IR_MASK_PADDING) return t;
    if (!grow(p, (void **)&p->colls, &p->cap_colls, p->n_colls + 1, sizeof *p->colls))
        return fail_nomem(b, "the collectives");
    size_t bytes = ir_nbytes(t) > ir_nbytes(x) ? ir_nbytes(t) : ir_nbytes(x);
    p->colls[p->n_colls++] = (part_collective){
        kind, *axes, (int64_t)bytes, cost_collective(p->m, kind, axes, (int64_t)bytes),
        partition_phase(p->g, consumer >= 0 ? consumer : gid), gid, consumer, t->id, t->dtype};
    return t;
}

/* Whether resolving node gid's pending sum for `consumer` is a gradient's
 * reduction: a value of the backward pass resolved for the update, or the
 * update's sharding constraint of one (optim.c's held gradient, which
 * takes its operand's pending sum and resolves it itself).  The norm's
 * sum of squares is the update's own value and stays f32. */
static bool gradient_sum(const spmd_graph *g, int gid, int consumer)
{
    if (consumer < 0 || partition_phase(g, consumer) != PART_UPDATE) return false;
    const spmd_tensor *t = g->nodes[gid];
    if (t->op == IR_SHARDING_CONSTRAINT && partition_phase(g, gid) == PART_UPDATE)
        t = t->in[0];
    return partition_phase(g, t->id) == PART_BACKWARD;
}

/* A pending sum resolved: all-reduce or reduce-scatter.  Under
 * spmd_graph_set_reduce_precision(SPMD_BF16) a gradient's goes as bf16:
 * each device's value converted (nearest even), the collective over bf16
 * (summed in f32 over the widened values in the canonical order, rounded
 * once), the result converted back to f32 for the update. */
static spmd_tensor *emit_sum(builder *b, ir_op kind, spmd_tensor *x, const mesh_axes *axes,
                             int dim, const int64_t *dims, int gid, int consumer)
{
    partition *p = b->p;
    const spmd_graph *g = p->g;
    if (!x || g->reduce_precision != SPMD_BF16 || x->dtype != SPMD_F32 ||
        !gradient_sum(g, gid, consumer))
        return emit_coll(b, kind, x, axes, dim, 0, 0, dims, gid, consumer);
    spmd_tensor *half = LOCAL(b, spmd_convert(p->local, x, SPMD_BF16));
    spmd_tensor *sum = emit_coll(b, kind, half, axes, dim, 0, 0, dims, gid, consumer);
    return sum ? LOCAL(b, spmd_convert(p->local, sum, SPMD_F32)) : NULL;
}

static void dims_of(const spmd_tensor *x, int64_t *dims) { memcpy(dims, x->dims, sizeof x->dims); }

/* Gather axes `s` of dim d (the minor end of its list) back into it. */
static spmd_tensor *gather(builder *b, spmd_tensor *x, sharding *cur, int d, int keep,
                           const int64_t *gdims, int gid, int consumer)
{
    mesh_axes s = tail(&cur->dim[d], keep);
    int64_t dims[SPMD_MAX_RANK];
    dims_of(x, dims);
    dims[d] *= mesh_axes_size(b->p->m, &s);
    x = emit_coll(b, IR_ALL_GATHER, x, &s, d, 0, 0, dims, gid, consumer);
    cur->dim[d].n = keep;
    /* A whole dim gathered from padded blocks: drop the padding. */
    if (x && keep == 0 && x->dims[d] > gdims[d])
        x = LOCAL(b, spmd_slice(b->p->local, x, d, 0, gdims[d]));
    return x;
}

/* This device's block of dim d over the further axes `s`. */
static spmd_tensor *slice(builder *b, spmd_tensor *x, sharding *cur, int d, const mesh_axes *s,
                          const int64_t *gdims, int gid)
{
    int64_t n = mesh_axes_size(b->p->m, s);
    int64_t whole = cur->dim[d].n == 0 ? gdims[d] : x->dims[d];
    int64_t dims[SPMD_MAX_RANK];
    dims_of(x, dims);
    dims[d] = (whole + n - 1) / n;
    x = emit_coll(b, IR_SHARD_SLICE, x, s, d, 0, whole, dims, gid, -1);
    if (x) x->attr.coll.exact = whole % n == 0; /* the plan may view a leaf's block (plan.h) */
    append(&cur->dim[d], s);
    return x;
}

/* Can dim d, now split over cur->dim[d], be split further by `s` locally
 * without moving padding?  From a whole dim always; from a split dim only
 * when every split is exact. */
static bool exact_split(const partition *p, const sharding *cur, int d, const mesh_axes *s,
                        const int64_t *gdims)
{
    if (cur->dim[d].n == 0) return true;
    int64_t have = sharding_blocks(cur, p->m, d), more = mesh_axes_size(p->m, s);
    return gdims[d] % (have * more) == 0;
}

/* ---- Resharding -------------------------------------------------------------------------- */

static spmd_tensor *reshard_plain(builder *b, spmd_tensor *x, sharding cur, const sharding *want,
                                  const int64_t *gdims, int gid, int consumer)
{
    partition *p = b->p;
    const spmd_mesh *m = p->m;
    int r = want->rank;
    uint32_t resolve = cur.partial & ~want->partial;

    /* 1. Sums into the dims the target splits over their axes. */
    for (int d = 0; d < r && x && resolve; d++) {
        if (!is_prefix(&cur.dim[d], &want->dim[d])) continue;
        mesh_axes s = {0};
        for (int k = cur.dim[d].n; k < want->dim[d].n && (resolve >> want->dim[d].axis[k] & 1); k++)
            s.axis[s.n++] = want->dim[d].axis[k];
        if (!s.n || !exact_split(p, &cur, d, &s, gdims)) continue;
        int64_t n = mesh_axes_size(m, &s);
        if (cur.dim[d].n == 0 && x->dims[d] % n) /* pad a whole dim to n blocks */
            x = LOCAL(b, ir_pad(p->local, x, d, 0, (x->dims[d] + n - 1) / n * n));
        if (!x) return NULL;
        int64_t dims[SPMD_MAX_RANK];
        dims_of(x, dims);
        dims[d] /= n;
        x = emit_sum(b, IR_REDUCE_SCATTER, x, &s, d, dims, gid, consumer);
        append(&cur.dim[d], &s);
        resolve &= ~mesh_axes_mask(&s);
        cur.partial &= ~mesh_axes_mask(&s);
    }
    /* 2. Free slices on axes the value does not use at all (shrink first). */
    for (int d = 0; d < r && x; d++) {
        if (!is_prefix(&cur.dim[d], &want->dim[d]) || cur.dim[d].n == want->dim[d].n) continue;
        mesh_axes s = tail(&want->dim[d], cur.dim[d].n);
        if ((mesh_axes_mask(&s) & used_axes(&cur)) || !exact_split(p, &cur, d, &s, gdims)) continue;
        x = slice(b, x, &cur, d, &s, gdims, gid);
    }
    /* 3. The remaining sums. */
    if (x && resolve) {
        mesh_axes s = mesh_axes_from_mask(m, resolve);
        int64_t dims[SPMD_MAX_RANK];
        dims_of(x, dims);
        x = emit_sum(b, IR_ALL_REDUCE, x, &s, 0, dims, gid, consumer);
        cur.partial &= ~resolve;
    }
    /* 4. Axes that must leave a dim: all-to-all when the target wants the
     * axis next on another dim and nothing is padded, else all-gather. */
    for (int d = 0; d < r && x; d++) {
        int keep = common_prefix(&cur.dim[d], &want->dim[d]);
        if (keep == cur.dim[d].n) continue;
        if (cur.dim[d].n - keep == 1) {
            int8_t ax = cur.dim[d].axis[keep];
            for (int e = 0; e < r; e++) {
                if (e == d || !is_prefix(&cur.dim[e], &want->dim[e]) ||
                    want->dim[e].n <= cur.dim[e].n || want->dim[e].axis[cur.dim[e].n] != ax)
                    continue;
                int64_t n = m->shape[ax];
                if (gdims[d] % sharding_blocks(&cur, m, d) || x->dims[e] % n ||
                    gdims[e] % (sharding_blocks(&cur, m, e) * n))
                    break;
                mesh_axes s = {.n = 1, .axis = {ax}};
                int64_t dims[SPMD_MAX_RANK];
                dims_of(x, dims);
                dims[e] /= n;
                dims[d] *= n;
                x = emit_coll(b, IR_ALL_TO_ALL, x, &s, e, d, 0, dims, gid, consumer);
                cur.dim[d].n = keep;
                cur.dim[e].axis[cur.dim[e].n++] = ax;
                break;
            }
            if (cur.dim[d].n == keep) continue;
        }
        /* Padded blocks cannot be regrouped: gather the whole dim. */
        if (gdims[d] % sharding_blocks(&cur, m, d)) keep = 0;
        x = gather(b, x, &cur, d, keep, gdims, gid, consumer);
    }
    /* 5. The last slices (from a whole dim if a split would move padding). */
    for (int d = 0; d < r && x; d++) {
        if (cur.dim[d].n == want->dim[d].n) continue;
        mesh_axes s = tail(&want->dim[d], cur.dim[d].n);
        if (!exact_split(p, &cur, d, &s, gdims)) {
            x = gather(b, x, &cur, d, 0, gdims, gid, consumer);
            s = want->dim[d];
        }
        if (x) x = slice(b, x, &cur, d, &s, gdims, gid);
    }
    if (x && !sharding_equal(&cur, want)) {
        record(b, SPMD_ERR_INTERNAL, "partition: resharding node %d did not reach its target", gid);
        return NULL;
    }
    return x;
}

/* Reshard x from `from` to `to` in the view where each dim that `view`
 * groups is two, [groups, size / groups], the groups whole and the axes
 * on the second: plain splits there, which reshard_plain moves.  In that
 * view `from` and `to` must each group such a dim the same way or hold it
 * whole. */
static spmd_tensor *reshard_in_groups(builder *b, spmd_tensor *x, const sharding *from,
                                      const sharding *to, const sharding *view,
                                      const int64_t *gdims, int gid, int consumer)
{
    const spmd_mesh *m = b->p->m;
    sharding from_v = sharding_replicated(0), to_v = sharding_replicated(0);
    int64_t vgdims[SPMD_MAX_RANK], vlocal[SPMD_MAX_RANK], local[SPMD_MAX_RANK];
    int r = 0;
    from_v.partial = from->partial;
    to_v.partial = to->partial;
    for (int d = 0; d < view->rank; d++) {
        int64_t groups = view->dim[d].n ? mesh_axes_groups(&view->dim[d]) : 1;
        if (r + (groups > 1) >= SPMD_MAX_RANK) {
            record(b, SPMD_ERR_UNSUPPORTED, "partition: node %d: a rank-%d value with grouped "
                   "splits has more than %d dims in its groups' view", gid, view->rank,
                   SPMD_MAX_RANK);
            return NULL;
        }
        if (groups > 1) {
            vgdims[r] = vlocal[r] = groups; /* the groups: whole */
            r++;
        }
        mesh_axes f = from->dim[d], t = to->dim[d];
        f.groups = t.groups = 0;
        from_v.dim[r] = f;
        to_v.dim[r] = t;
        vgdims[r] = gdims[d] / groups;
        vlocal[r] = x->dims[d] / groups;
        r++;
    }
    from_v.rank = to_v.rank = r;
    x = LOCAL(b, spmd_reshape(b->p->local, x, r, vlocal));
    x = x ? reshard_plain(b, x, from_v, &to_v, vgdims, gid, consumer) : NULL;
    if (!x) return NULL;
    sharding_local_dims(to, m, to->rank, gdims, local);
    return LOCAL(b, spmd_reshape(b->p->local, x, to->rank, local));
}

/* Grouped splits (mesh.h): a split dim whose grouping changes is first
 * gathered whole in its own view; then the value reaches the target in
 * the target's view. */
static spmd_tensor *reshard(builder *b, spmd_tensor *x, sharding cur, const sharding *want,
                            const int64_t *gdims, int gid, int consumer)
{
    if (!sharding_has_groups(&cur) && !sharding_has_groups(want))
        return reshard_plain(b, x, cur, want, gdims, gid, consumer);
    sharding whole = cur;
    bool regroup = false;
    for (int d = 0; d < cur.rank; d++) {
        int64_t have = cur.dim[d].n ? mesh_axes_groups(&cur.dim[d]) : 1;
        int64_t need = want->dim[d].n ? mesh_axes_groups(&want->dim[d]) : 1;
        if (cur.dim[d].n && have != need) {
            whole.dim[d] = (mesh_axes){0};
            regroup = true;
        }
    }
    if (regroup) {
        x = reshard_in_groups(b, x, &cur, &whole, &cur, gdims, gid, consumer);
        cur = whole;
    }
    if (!x || sharding_equal(&cur, want)) return x;
    return reshard_in_groups(b, x, &cur, want, want, gdims, gid, consumer);
}

/* The local value of global node `gid` with sharding `want`.  A
 * parameter (or its bf16 copy) resharded for one phase is resharded
 * again for another, as FSDP (ZeRO-3) gathers a weight again in the
 * backward pass instead of keeping the forward pass's copy alive in
 * between. */
static spmd_tensor *value(builder *b, const spmd_tensor *x, const sharding *want, int consumer)
{
    variant *first = b->variants[x->id];
    int phase = (int)partition_phase(b->p->g, consumer >= 0 ? consumer : x->id);
    for (variant *v = first; v; v = v->next)
        if (sharding_equal(v->s, want) && (v->phase < 0 || v->phase == phase || !(x->op == IR_PARAM || ir_is_param_copy(x))))
            return v->t;
    if (!first) {
        record(b, SPMD_ERR_INTERNAL, "partition: node %d used before it was partitioned", x->id);
        return NULL;
    }
    spmd_tensor *t = reshard(b, first->t, *first->s, want, x->dims, x->id, consumer);
    if (!t) return NULL;
    variant *v = base_arena_alloc(&b->arena, sizeof *v);
    const sharding *s = base_intern_get(&b->shardings, want);
    if (!v || !s) return fail_nomem(b, "a resharded value");
    *v = (variant){s, t, phase, first->next};
    first->next = v;
    return t;
}

static bool add_variant(builder *b, int gid, const sharding *s, spmd_tensor *t)
{
    variant *v = base_arena_alloc(&b->arena, sizeof *v);
    const sharding *copy = base_intern_get(&b->shardings, s);
    if (!v || !copy) {
        fail_nomem(b, "a local value");
        return false;
    }
    *v = (variant){copy, t, -1, b->variants[gid]};
    b->variants[gid] = v;
    return true;
}

/* ---- Fallbacks and local shares ----------------------------------------------------------- */

static bool note_fallback(builder *b, int tensor, int consumer)
{
    partition *p = b->p;
    if (!grow(p, (void **)&p->fallbacks, &p->cap_fallbacks, p->n_fallbacks + 1,
              sizeof *p->fallbacks)) {
        fail_nomem(b, "the fallbacks");
        return false;
    }
    p->fallbacks[p->n_fallbacks++] = (part_fallback){tensor, consumer};
    return true;
}

/* An operand arriving split on a dim its op cannot split that way is a
 * fallback: counted, shown by explain.  The op cannot when the dim is FULL
 * or unmapped, or when its iteration cannot be cut into that many blocks
 * (32 rows over 65 devices; heads that do not divide): then every device
 * computes the whole dim.  Not fallbacks: parameters (gathering a stored
 * shard before use is the FSDP plan itself: a LayerNorm scale is always
 * gathered), and an axis the op gave to another dim (a choice the cost
 * model made). */
static bool check_fallback(builder *b, const spmd_tensor *t, int j, const sharding *have,
                           const sharding *need)
{
    const partition *p = b->p;
    const shard_node *n = &p->prop.nodes[t->id];
    if (t->in[j]->op == IR_PARAM || t->in[j]->op == IR_STATE) return true;
    for (int i = 0; i < have->rank; i++) {
        if (have->dim[i].n <= need->dim[i].n) continue;
        int it = n->sig ? n->sig->in[j][i] : -1;
        if (it < 0 || n->sig->kind[it] == IR_ITER_FULL ||
            !shard_splittable(p->m, &have->dim[i], n->sig->size[it], n->sig->granule[it]))
            return note_fallback(b, t->in[j]->id, t->id);
    }
    return true;
}

/* Product over the dims of `s` split by any axis of `mask`... of local vs
 * global sizes: used to rescale means computed on local blocks. */
static double local_share(const partition *p, const spmd_tensor *x, const sharding *s,
                          uint32_t dims_mask)
{
    double local = 1, global = 1;
    for (int i = 0; i < x->rank; i++) {
        if (!(dims_mask >> i & 1)) continue;
        global *= (double)x->dims[i];
        local *= (double)sharding_block_size(s, p->m, i, x->dims[i]);
    }
    return local / global;
}

/* ---- Fixups: where an op's local form differs from its global one -------------------- */

/* Each takes the local node lt just made for global node t (operands
 * resharded to `need`) and returns the node that stands for t's local
 * value; NULL on failure.  ops.def names each op's fixup. */
typedef spmd_tensor *(*part_fixup_fn)(builder *b, const spmd_tensor *t, const sharding *need,
                                      spmd_tensor *lt);

static spmd_tensor *fix_none(builder *b, const spmd_tensor *t, const sharding *need,
                             spmd_tensor *lt)
{
    (void)b, (void)t, (void)need;
    return lt;
}

/* Attention (cached or not) split over its head channels: each device
 * runs its heads. */
static spmd_tensor *fix_heads(builder *b, const spmd_tensor *t, const sharding *need,
                              spmd_tensor *lt)
{
    const spmd_tensor *q = t->in[0];
    lt->attr.attention.heads =
        (int)(t->attr.attention.heads / sharding_blocks(&need[0], b->p->m, q->rank - 1));
    return lt;
}

/* A mean over split dims is a local mean: rescale it to the global count
 * (the pending sum over the split axes then adds up to the mean). */
static spmd_tensor *fix_mean(builder *b, const spmd_tensor *t, const sharding *need,
                             spmd_tensor *lt)
{
    if (!sharding_dim_axes(&need[0])) return lt;
    return LOCAL(b, spmd_scale(b->p->local, lt,
                               (float)local_share(b->p, t->in[0], &need[0], t->attr.reduce.axes)));
}

/* mse is a mean over every element. */
static spmd_tensor *fix_mse(builder *b, const spmd_tensor *t, const sharding *need,
                            spmd_tensor *lt)
{
    const spmd_tensor *x = t->in[0];
    return LOCAL(b, spmd_scale(b->p->local, lt,
                               (float)local_share(b->p, x, &need[0], (1u << x->rank) - 1)));
}

/* A table split over the vocabulary (the lookup's SUM dim, or the
 * backward's output rows): the kernel needs the device's block of rows,
 * which it finds at run time as its member rank in the group of the
 * vocabulary's axes, and the whole vocabulary to check ids against. */
static spmd_tensor *fix_vocab_rows(builder *b, const spmd_tensor *t, const sharding *need,
                                   spmd_tensor *lt)
{
    partition *p = b->p;
    bool fwd = t->op == IR_EMBEDDING;
    sharding out = fwd ? need[0] : shard_produced(&p->prop, t);
    if (!out.dim[0].n) return lt;
    lt->attr.embed.spec = spec_index(p, &out.dim[0]);
    lt->attr.embed.global = fwd ? t->in[0]->dims[0] : t->attr.embed.rows;
    return lt->attr.embed.spec < 0 ? fail_nomem(b, "the collective groups") : lt;
}

/* Cross-entropy (or its backward, `lt`) over logits split on the
 * vocabulary over `vocab`: no device may gather whole rows, so each
 * computes small per-row statistics of its block (max, sum of exps, the
 * target's logit), all-gathers them over the vocabulary's axes, and
 * combines them in member order (the same bits on every member): the loss
 * rows, or the block of the gradient.  Row padding and the rescaling to
 * the global row count stay as for whole rows. */
static spmd_tensor *split_vocab_loss(builder *b, const spmd_tensor *t, const mesh_axes *vocab,
                                     spmd_tensor *lt)
{
    partition *p = b->p;
    spmd_tensor *logits = lt->in[0], *targets = lt->in[1];
    int tr = targets->rank;
    ir_attr attr = lt->attr;
    attr.rows.vocab_spec = spec_index(p, vocab);
    attr.rows.vocab = t->in[0]->dims[t->in[0]->rank - 1];
    if (attr.rows.vocab_spec < 0) return fail_nomem(b, "the collective groups");
    int64_t dims[SPMD_MAX_RANK];
    memcpy(dims, targets->dims, (size_t)tr * sizeof *dims);
    dims[tr] = 3;
    spmd_tensor *stats = LOCAL(b, ir_node_new(p->local, IR_VOCAB_CE_STATS, SPMD_F32, tr + 1, dims,
                                              (spmd_tensor *[]){logits, targets}, 2));
    if (!stats) return NULL;
    stats->attr = attr;
    dims[tr] = 3 * mesh_axes_size(p->m, vocab);
    spmd_tensor *all = emit_coll(b, IR_ALL_GATHER, stats, vocab, tr, 0, 0, dims, t->id, t->id);
    if (!all) return NULL;
    spmd_tensor *out;
    if (t->op == IR_CROSS_ENTROPY)
        out = LOCAL(b, ir_node_new(p->local, IR_VOCAB_CE_LOSS, SPMD_F32, 0, NULL,
                                   (spmd_tensor *[]){all, targets}, 2));
    else
        out = LOCAL(b, ir_node_new(p->local, IR_VOCAB_CE_BACKWARD, SPMD_F32, lt->rank, lt->dims,
                                   (spmd_tensor *[]){logits, targets, all, lt->in[2]}, 4));
    if (out) out->attr = attr;
    return out;
}

/* Cross-entropy is a mean over the target rows.  Rows split unevenly: the
 * kernel skips the padding rows; the mean over local rows is then
 * rescaled to the global count.  Logits split on the vocabulary: lowered
 * by split_vocab_loss. */
static spmd_tensor *fix_loss_rows(builder *b, const spmd_tensor *t, const sharding *need,
                                  spmd_tensor *lt)
{
    partition *p = b->p;
    const spmd_tensor *targets = t->in[1];
    uint32_t rows = (1u << targets->rank) - 1;
    for (int i = 0; i < targets->rank; i++) {
        if (targets->dims[i] % sharding_blocks(&need[1], p->m, i) == 0) continue;
        lt->attr.rows.spec[i] = spec_index(p, &need[1].dim[i]);
        lt->attr.rows.global[i] = targets->dims[i];
        if (lt->attr.rows.spec[i] < 0) return fail_nomem(b, "the collective groups");
    }
    const mesh_axes *vocab = &need[0].dim[t->in[0]->rank - 1];
    if (vocab->n && !(lt = split_vocab_loss(b, t, vocab, lt))) return NULL;
    if (!sharding_dim_axes(&need[1])) return lt;
    return LOCAL(b, spmd_scale(p->local, lt, (float)local_share(p, targets, &need[1], rows)));
}

static const part_fixup_fn fixup_table[] = {
#define OP(e, name, arity, sig, lin, fix, vjp, kern, groups, formula, scratch, kind, bf16) fix,
#include "ir/ops.def"
#undef OP
};

_Static_assert(sizeof fixup_table / sizeof fixup_table[0] == IR_OP_COUNT,
               "fixup table out of step with ops.def");

bool partition_has_fixup(ir_op op)
{
    return (unsigned)op < IR_OP_COUNT && fixup_table[op] != fix_none;
}

/* ---- Ops ------------------------------------------------------------------------------------ */

static spmd_status emit_op(builder *b, const spmd_tensor *t)
{
    partition *p = b->p;
    const shard_node *n = &p->prop.nodes[t->id];
    spmd_tensor *in[IR_MAX_INPUTS];
    sharding need[IR_MAX_INPUTS];
    for (int j = 0; j < t->n_in; j++) {
        need[j] = shard_operand_need(&p->prop, t, j);
        const variant *have = b->variants[t->in[j]->id];
        if (have && !check_fallback(b, t, j, have->s, &need[j])) return failed(b);
        in[j] = value(b, t->in[j], &need[j], t->id);
        if (!in[j]) return failed(b);
    }
    /* Sums over split, padded dims: zero the padding first. */
    if (n->sig) {
        for (int it = 0; it < n->sig->n_iter; it++) {
            const mesh_axes *ax = &n->iter[it];
            int64_t blocks = mesh_axes_size(p->m, ax);
            if (n->sig->kind[it] != IR_ITER_SUM || !ax->n || n->sig->size[it] % blocks == 0)
                continue;
            for (int j = 0; j < t->n_in; j++)
                for (int i = 0; i < t->in[j]->rank; i++) {
                    if (n->sig->in[j][i] != it || in[j]->dtype == SPMD_I32) continue;
                    int64_t dims[SPMD_MAX_RANK];
                    dims_of(in[j], dims);
                    in[j] = emit_coll(b, IR_MASK_PADDING, in[j], ax, i, 0, n->sig->size[it], dims,
                                      t->in[j]->id, t->id);
                    if (!in[j]) return failed(b);
                }
        }
    }
    sharding out = shard_produced(&p->prop, t);
    /* A sharding constraint (how the optimizer re-marks a value: the held
     * gradient, ZeRO's view of a parameter) is its operand: the device's
     * program reads the resharded operand instead of copying it whole
     * first. */
    if (t->op == IR_SHARDING_CONSTRAINT)
        return add_variant(b, t->id, &out, in[0]) ? SPMD_OK : SPMD_ERR_NOMEM;
    int64_t dims[SPMD_MAX_RANK];
    sharding_local_dims(&out, p->m, t->rank, t->dims, dims);
    spmd_tensor *lt = LOCAL(b, ir_node_new(p->local, t->op, t->dtype, t->rank, dims, in, t->n_in));
    if (!lt) return failed(b);
    lt->attr = t->attr;

    lt = fixup_table[t->op](b, t, need, lt);
    if (!lt) return failed(b);
    if (!add_variant(b, t->id, &out, lt)) return failed(b);
    return SPMD_OK;
}

static spmd_status emit_leaf(builder *b, const spmd_tensor *t)
{
    partition *p = b->p;
    sharding s = p->prop.nodes[t->id].out;
    /* Leaves hold whole values, but for a gradient accumulator, which
     * holds its gradient's pending sum (each device its addend). */
    if (!t->accumulator) s.partial = 0;
    int64_t dims[SPMD_MAX_RANK];
    sharding_local_dims(&s, p->m, t->rank, t->dims, dims);
    spmd_tensor *lt = LOCAL(b, ir_node_new(p->local, t->op, t->dtype, t->rank, dims, NULL, 0));
    if (!lt) return failed(b);
    lt->name = base_arena_strdup(&p->local->arena, t->name);
    lt->init = t->init;
    lt->accumulator = t->accumulator;
    if (!lt->name) fail_nomem(b, "a name");
    if (!lt->name || !add_variant(b, t->id, &s, lt)) return failed(b);
    p->local_of[t->id] = lt;
    p->held[t->id] = s;
    return SPMD_OK;
}

/* ---- Entry points ---------------------------------------------------------------------------- */

static spmd_status build(builder *b, const bool *needed)
{
    partition *p = b->p;
    const spmd_graph *g = p->g;
    for (int i = 0; i < g->n_nodes; i++) {
        const spmd_tensor *t = g->nodes[i];
        /* Where the backward pass begins locally, for the memory plan's
         * held bytes (plan.h). */
        if (g->has_grad && i == g->backward_begin) p->local->backward_begin = p->local->n_nodes;
        if (needed && !needed[i] && !ir_op_is_leaf(t->op)) continue;
        b->node = i;
        spmd_status st = ir_op_is_leaf(t->op) ? emit_leaf(b, t) : emit_op(b, t);
        if (st != SPMD_OK) return st;
        /* A marked value is held as marked, whatever its op produced. */
        if (t->mark && !ir_op_is_leaf(t->op) && !value(b, t, t->mark, t->id)) return failed(b);
    }
    p->local->accumulate_steps = g->accumulate_steps;
    if (g->accumulate_keep) p->local->accumulate_keep = p->local_of[g->accumulate_keep->id];
    /* Outputs are resolved: no pending sums when read. */
    for (int i = 0; i < g->n_nodes; i++) {
        const spmd_tensor *t = g->nodes[i];
        if (!t->is_output || ir_op_is_leaf(t->op)) continue;
        b->node = i;
        sharding s = t->mark ? *t->mark : shard_produced(&p->prop, t);
        s.partial = 0;
        spmd_tensor *lt = value(b, t, &s, -1);
        if (!lt) return failed(b);
        lt->is_output = true;
        p->local_of[i] = lt;
        p->held[i] = s;
    }
    for (int u = 0; u < g->n_updates; u++) {
        const ir_update *up = &g->updates[u];
        b->node = up->value->id;
        spmd_tensor *lv = value(b, up->value, &p->held[up->target->id], up->value->id);
        if (!lv) return failed(b);
        /* set_update records its message as it returns a failure. */
        spmd_status st = spmd_graph_set_update(p->local, p->local_of[up->target->id], lv);
        if (st != SPMD_OK) return record(b, st, "%s", spmd_last_error());
    }
    return SPMD_OK;
}

spmd_status partition_build(partition *p, const spmd_graph *g, const spmd_mesh *m,
                            const bool *needed, const spmd_allocator *alloc)
{
    memset(p, 0, sizeof *p);
    p->g = g;
    p->m = m;
    p->alloc = base_allocator_or_default(alloc);
    /* Propagation records its own failures (status and message) as it
     * returns them. */
    spmd_status st = shard_propagate(&p->prop, g, m, needed, &p->alloc);
    if (st != SPMD_OK) return st;
    size_t nn = (size_t)(g->n_nodes ? g->n_nodes : 1);
    p->local = spmd_graph_create(&p->alloc);
    p->local_of = base_calloc(&p->alloc, nn * sizeof *p->local_of, "partition");
    /* Not zeroed: only kept nodes' entries are set and read, and pages
     * that hold none are then never touched. */
    p->held = base_alloc(&p->alloc, nn * sizeof *p->held, "partition");
    builder b = {.p = p, .variants = base_calloc(&p->alloc, nn * sizeof(variant *), "partition")};
    base_arena_init(&b.arena, &p->alloc);
    base_intern_init(&b.shardings, &b.arena, sizeof(sharding));
    if (!p->local || !p->local_of || !p->held || !b.variants) fail_nomem(&b, "its tables");
    else if (build(&b, needed) != SPMD_OK) failed(&b);
    base_intern_free(&b.shardings);
    base_arena_free(&b.arena);
    base_free(&p->alloc, b.variants);
    if (b.failure.status == SPMD_OK) return SPMD_OK;
    return base_error(b.failure.status, "%s", b.failure.message);
}

void partition_free(partition *p)
{
    shard_plan_free(&p->prop);
    spmd_graph_free(p->local);
    base_free(&p->alloc, p->local_of);
    base_free(&p->alloc, p->held);
    base_free(&p->alloc, p->specs);
    base_free(&p->alloc, p->colls);
    base_free(&p->alloc, p->fallbacks);
    memset(p, 0, sizeof *p);
}
