/*
 * The resharding planner (partition_impl.h): a value moved between any
 * two shardings by reshard(), which orders its steps to move the fewest
 * bytes: pending sums go first into reduce-scatters where the target
 * splits a dim over the summed axes, then free local slices shrink the
 * value, then the remaining sums are all-reduced, then axes that must
 * leave a dim are moved (all-to-all) or gathered, then the last slices.
 * Each resharded value is cached per (node, sharding); a parameter is
 * resharded again in each phase (ZeRO-3), so its forward gather dies
 * before the backward pass, and so are sequence-split attention's keys
 * and values.  Also the operands an op cannot use as they
 * arrive (fallbacks), and the local share of a split value.
 */
#include "shard/partition_impl.h"
#include "shard/cost.h"

#include <string.h>

/* ---- The report's arrays ------------------------------------------------------------ */

static bool grow(partition *p, void **items, int *cap, int need, size_t size)
{
    return base_grow(&p->alloc, items, cap, need, size, 16, "partition report");
}

int part_spec_index(partition *p, const mesh_axes *axes)
{
    for (int i = 0; i < p->n_specs; i++)
        if (p->specs[i].n == axes->n && !memcmp(p->specs[i].axis, axes->axis, (size_t)axes->n))
            return i;
    if (!grow(p, (void **)&p->specs, &p->cap_specs, p->n_specs + 1, sizeof *p->specs)) return -1;
    p->specs[p->n_specs] = *axes;
    return p->n_specs++;
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

spmd_tensor *part_emit_coll(builder *b, ir_op kind, spmd_tensor *x, const mesh_axes *axes,
                            int dim, int dim2, int64_t global, const int64_t *dims, int gid,
                            int consumer)
{
    partition *p = b->p;
    if (!x) return NULL;
    int spec = part_spec_index(p, axes);
    if (spec < 0) return part_fail_nomem(b, "the collective groups");
    spmd_tensor *t = LOCAL(b, ir_node_new(p->local, kind, x->dtype, x->rank, dims, &x, 1));
    if (!t) return NULL;
    t->attr.coll.spec = spec;
    t->attr.coll.dim = dim;
    t->attr.coll.dim2 = dim2;
    t->attr.coll.global = global;
    if (kind == IR_SHARD_SLICE || kind == IR_MASK_PADDING) return t;
    if (!grow(p, (void **)&p->colls, &p->cap_colls, p->n_colls + 1, sizeof *p->colls))
        return part_fail_nomem(b, "the collectives");
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
        return part_emit_coll(b, kind, x, axes, dim, 0, 0, dims, gid, consumer);
    spmd_tensor *half = LOCAL(b, spmd_convert(p->local, x, SPMD_BF16));
    spmd_tensor *sum = part_emit_coll(b, kind, half, axes, dim, 0, 0, dims, gid, consumer);
    return sum ? LOCAL(b, spmd_convert(p->local, sum, SPMD_F32)) : NULL;
}

/* Gather axes `s` of dim d (the minor end of its list) back into it. */
static spmd_tensor *gather(builder *b, spmd_tensor *x, sharding *cur, int d, int keep,
                           const int64_t *gdims, int gid, int consumer)
{
    mesh_axes s = tail(&cur->dim[d], keep);
    int64_t dims[SPMD_MAX_RANK];
    dims_of(x, dims);
    dims[d] *= mesh_axes_size(b->p->m, &s);
    x = part_emit_coll(b, IR_ALL_GATHER, x, &s, d, 0, 0, dims, gid, consumer);
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
    x = part_emit_coll(b, IR_SHARD_SLICE, x, s, d, 0, whole, dims, gid, -1);
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
                x = part_emit_coll(b, IR_ALL_TO_ALL, x, &s, e, d, 0, dims, gid, consumer);
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
        part_record(b, SPMD_ERR_INTERNAL, "partition: resharding node %d did not reach its target",
                    gid);
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
            part_record(b, SPMD_ERR_UNSUPPORTED, "partition: node %d: a rank-%d value with "
                        "grouped splits has more than %d dims in its groups' view", gid,
                        view->rank, SPMD_MAX_RANK);
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

/* Whether x, resharded for `consumer`, is resharded again in each phase
 * rather than kept from one to the next: a parameter (or its bf16 copy),
 * and the keys and values of sequence-split attention's backward op,
 * whose gathers would otherwise live from the forward pass to the
 * backward pass, a whole sequence per layer (docs/DESIGN.md,
 * "Sequence-split attention"). */
static bool resharded_per_phase(const spmd_graph *g, const spmd_tensor *x, int consumer)
{
    if (x->op == IR_PARAM || ir_is_param_copy(x)) return true;
    const spmd_tensor *c = consumer >= 0 ? g->nodes[consumer] : NULL;
    return c && c->op == IR_ATTENTION_BACKWARD && (c->in[1] == x || c->in[2] == x);
}

/* The local value of global node `gid` with sharding `want`.  A value
 * resharded for one phase is resharded again for another where
 * resharded_per_phase says, as FSDP (ZeRO-3) gathers a weight again in
 * the backward pass instead of keeping the forward pass's copy alive in
 * between. */
spmd_tensor *part_value(builder *b, const spmd_tensor *x, const sharding *want, int consumer)
{
    variant *first = b->variants[x->id];
    int phase = (int)partition_phase(b->p->g, consumer >= 0 ? consumer : x->id);
    bool per_phase = resharded_per_phase(b->p->g, x, consumer);
    for (variant *v = first; v; v = v->next)
        if (sharding_equal(v->s, want) && (v->phase < 0 || v->phase == phase || !per_phase))
            return v->t;
    if (!first) {
        part_record(b, SPMD_ERR_INTERNAL, "partition: node %d used before it was partitioned",
                    x->id);
        return NULL;
    }
    spmd_tensor *t = reshard(b, first->t, *first->s, want, x->dims, x->id, consumer);
    if (!t) return NULL;
    variant *v = base_arena_alloc(&b->arena, sizeof *v);
    const sharding *s = base_intern_get(&b->shardings, want);
    if (!v || !s) return part_fail_nomem(b, "a resharded value");
    *v = (variant){s, t, phase, first->next};
    first->next = v;
    return t;
}

bool part_add_variant(builder *b, int gid, const sharding *s, spmd_tensor *t)
{
    variant *v = base_arena_alloc(&b->arena, sizeof *v);
    const sharding *copy = base_intern_get(&b->shardings, s);
    if (!v || !copy) {
        part_fail_nomem(b, "a local value");
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
        part_fail_nomem(b, "the fallbacks");
        return false;
    }
    p->fallbacks[p->n_fallbacks++] = (part_fallback){tensor, consumer};
    return true;
}

/* The mesh axes of the dims of s. */
static uint32_t split_axes(const sharding *s)
{
    uint32_t mask = 0;
    for (int i = 0; i < s->rank; i++) mask |= mesh_axes_mask(&s->dim[i]);
    return mask;
}

/* Whether every split dim of x under s is split exactly (no padding). */
static bool split_exactly(const spmd_mesh *m, const sharding *s, const spmd_tensor *x)
{
    for (int i = 0; i < s->rank; i++)
        if (x->dims[i] % sharding_blocks(s, m, i) != 0) return false;
    return true;
}

/* An operand arriving split on a dim its op cannot split that way is a
 * fallback: counted, shown by explain.  The op cannot when the dim is FULL
 * or unmapped, or when its iteration cannot be cut into that many blocks
 * (32 rows over 65 devices; heads that do not divide): then every device
 * computes the whole dim.  Not fallbacks: parameters (gathering a stored
 * shard before use is the FSDP plan itself: a LayerNorm scale is always
 * gathered), the keys and values of attention gathered along the
 * sequence (sequence-split attention's plan), and an axis the op gave to
 * another dim (a choice the cost model made; for a reshape, any axis its
 * need keeps). */
bool part_check_fallback(builder *b, const spmd_tensor *t, int j, const sharding *have,
                         const sharding *need)
{
    const partition *p = b->p;
    const shard_node *n = &p->prop.nodes[t->id];
    if (ir_is_persistent(t->in[j])) return true;
    /* A reshape (no signature) gathers only the axes its need drops; one
     * that moves an exact split to another dim ([E, G, ...] split on G
     * over (data, expert) to E over expert, G over data: GShard's
     * experts) is an all-to-all, nothing gathered whole. */
    if (!n->sig && (split_axes(have) & ~split_axes(need)) == 0 &&
        split_exactly(p->m, have, t->in[j]))
        return true;
    bool keys = (t->op == IR_ATTENTION || t->op == IR_ATTENTION_BACKWARD) && (j == 1 || j == 2);
    for (int i = 0; i < have->rank; i++) {
        if (have->dim[i].n <= need->dim[i].n || (keys && i == 1)) continue;
        int it = n->sig ? n->sig->in[j][i] : -1;
        if (it < 0 || n->sig->kind[it] == IR_ITER_FULL ||
            !shard_splittable(p->m, &have->dim[i], n->sig->size[it], n->sig->granule[it]))
            return note_fallback(b, t->in[j]->id, t->id);
    }
    return true;
}

/* Product over the dims of `s` split by any axis of `mask`... of local vs
 * global sizes: used to rescale means computed on local blocks. */
double part_local_share(const partition *p, const spmd_tensor *x, const sharding *s,
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
