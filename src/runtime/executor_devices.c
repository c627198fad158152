/*
 * Setting up this process's devices from the compiled program: each
 * device's buffers (leaves, arena, scratch), thread pool and collective
 * groups, and the buffers that the devices of a copy share.
 */
#include "runtime/executor_impl.h"
#include "base/address_space.h"
#include "base/error.h"
#include "spmd/mesh.h"

#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

/* Every op of the local program has a kernel (a leaf has none: the
 * executor places it). */
static spmd_status check_kernels(const spmd_graph *g)
{
    for (int i = 0; i < g->n_nodes; i++) {
        const spmd_tensor *t = g->nodes[i];
        if (!ir_op_is_leaf(t->op) && !kern_for(t->op))
            return base_error(SPMD_ERR_INTERNAL, "compile: no kernel for %s", ir_op_name(t->op));
    }
    return SPMD_OK;
}

/* Device memory, counted for spmd_program_allocated_bytes and, when it
 * is one device's own (d not NULL), for that device. */
static void *device_alloc(spmd_program *p, device *d, size_t bytes, const char *what)
{
    void *x = base_alloc(&p->alloc, bytes, what);
    if (x) p->allocated += bytes;
    if (x && d) d->allocated += bytes;
    return x;
}

/* The stage of the device at mesh id `id`, or -1 without a stage axis. */
static int stage_of_device(const spmd_program *p, int id)
{
    return p->c.partitioned && mesh_stage_axis(p->c.mesh) >= 0 ? mesh_stage_of(p->c.mesh, id) : -1;
}

/* Whether a device of `stage` holds local node t's buffer: on a stage
 * mesh a parameter, its optimizer state and their update values live on
 * their home stage only (docs/DESIGN.md, "Stages as built"); another
 * stage's devices never read or write them. */
static bool holds(int stage, const spmd_tensor *t)
{
    return stage < 0 || t->stage < 0 || t->stage == stage;
}

/* Where each view's block lies in its leaf on device d: the block the
 * slice's kernel would copy (copy_member_block), rows [m b, (m + 1) b) of
 * the split dim for member m of its group, is one run of the leaf's
 * bytes, its own bytes long, since the dims before it are 1.  A gather
 * read in place starts where the leaf's shared buffer does: this
 * device's block index times the block's bytes before its block. */
static spmd_status setup_views(spmd_program *p, device *d)
{
    const plan *pl = &p->c.plan;
    if (!pl->n_views && !pl->n_gathers_in_place) return SPMD_OK;
    const spmd_graph *lg = p->c.local;
    d->view_offset = base_calloc(&p->alloc, (size_t)lg->n_nodes * sizeof *d->view_offset, "views");
    if (!d->view_offset) return SPMD_ERR_NOMEM;
    for (int i = 0; i < lg->n_nodes; i++) {
        const spmd_tensor *t = lg->nodes[i];
        if (pl->view_of[i] >= 0)
            d->view_offset[i] = (ptrdiff_t)((size_t)d->member[t->attr.coll.spec] * ir_nbytes(t));
        if (pl->gather_leaf[i] >= 0)
            d->view_offset[i] = -(ptrdiff_t)((size_t)d->member[t->attr.coll.spec] * ir_nbytes(t->in[0]));
    }
    return SPMD_OK;
}

/* Which leaves (and update values trading buffers with them) take a
 * shared buffer's layout: program.share_as. */
static spmd_status setup_share_as(spmd_program *p)
{
    const compiled *c = &p->c;
    if (!c->share_blocks) return SPMD_OK;
    const spmd_graph *lg = c->local;
    p->share_as = base_alloc(&p->alloc, (size_t)lg->n_nodes * sizeof *p->share_as, "shared leaves");
    if (!p->share_as) return SPMD_ERR_NOMEM;
    for (int i = 0; i < lg->n_nodes; i++)
        p->share_as[i] = ir_op_is_leaf(lg->nodes[i]->op) && c->share_blocks[i] > 0 ? i : -1;
    for (int u = 0; u < lg->n_updates; u++) {
        const ir_update *up = &lg->updates[u];
        if (c->plan.swapped[up->value->id] && p->share_as[up->target->id] >= 0)
            p->share_as[up->value->id] = up->target->id;
        const spmd_tensor *slice = up->value->in[0];
        if (c->plan.lands_in[up->value->id] >= 0 && c->plan.swapped[slice->id])
            p->share_as[slice->id] = up->target->id;
    }
    return SPMD_OK;
}

/* Where in its target's block a landing gather's slice lies on device d:
 * the member's part, as the gather would put it; 0 for other nodes. */
static size_t slice_offset(const spmd_program *p, const device *d, int node)
{
    const spmd_graph *lg = p->c.local;
    for (int u = 0; u < lg->n_updates; u++) {
        const spmd_tensor *v = lg->updates[u].value;
        if (p->c.plan.lands_in[v->id] >= 0 && v->in[0]->id == node)
            return (size_t)d->member[v->attr.coll.spec] * ir_nbytes(v->in[0]);
    }
    return 0;
}

/* A device's place in one copy's shared buffer: sorted by place, then
 * device, so the devices holding the same block come together in device
 * order. */
typedef struct shared_place {
    const char *at;
    int device;
} shared_place;

static int by_place(const void *a, const void *b)
{
    const shared_place *x = a, *y = b;
    if (x->at != y->at) return x->at < y->at ? -1 : 1;
    return (x->device > y->device) - (x->device < y->device);
}

/* share_rank of node v for the n devices of one copy (their places):
 * each device's rank among those of the copy holding the same block, in
 * device order.  Sorted, so n log n: counting the devices before each
 * with the same block took most of the start-up of 4096 devices. */
static void rank_sharers(spmd_program *p, int v, shared_place *places, int n)
{
    qsort(places, (size_t)n, sizeof *places, by_place);
    for (int i = 0, rank = 0; i < n; i++) {
        rank = i > 0 && places[i].at == places[i - 1].at ? rank + 1 : 0;
        p->dev[places[i].device].share_rank[v] = rank;
    }
}

/* One buffer per copy for each shared leaf (and swapped value), every
 * block side by side: device d's block at its block index times the
 * block's bytes, along the leaf's one split dim (compiled.share_blocks).
 * Its rank among the devices of its copy holding the same block is
 * share_rank.  After every device here is set up; only where every
 * device of the mesh is in this process. */
static spmd_status setup_shared(spmd_program *p)
{
    const spmd_graph *g = p->c.g, *lg = p->c.local;
    if (!p->share_as) return SPMD_OK;
    for (int k = 0; k < p->n_local; k++) {
        device *d = &p->dev[k];
        d->share_rank = base_calloc(&p->alloc, (size_t)lg->n_nodes * sizeof *d->share_rank, "shared leaves");
        if (!d->share_rank) return SPMD_ERR_NOMEM;
    }
    shared_place *places = base_alloc(&p->alloc, (size_t)p->n_local * sizeof *places, "shared leaves");
    if (!places) return SPMD_ERR_NOMEM;
    spmd_status st = SPMD_OK;
    /* The global node of each shared leaf, for its blocks. */
    for (int gi = 0; gi < g->n_nodes; gi++) {
        const spmd_tensor *t = g->nodes[gi], *lt = p->c.part.local_of[gi];
        if (!lt || !ir_op_is_leaf(t->op) || p->share_as[lt->id] != lt->id) continue;
        const sharding *held = &p->c.part.held[gi];
        int split = -1;
        for (int dim = 0; dim < held->rank; dim++)
            if (held->dim[dim].n) split = dim;
        size_t bytes = ir_nbytes(lt), whole = bytes * (size_t)p->c.share_blocks[lt->id];
        /* The node itself and each update value taking its layout. */
        for (int v = 0; v < lg->n_nodes && st == SPMD_OK; v++) {
            if (p->share_as[v] != lt->id) continue;
            for (int copy = 0; copy < p->copies; copy++) {
                char *buf = NULL;
                int n = 0;
                for (int k = 0; k < p->n_local; k++) {
                    device *d = &p->dev[k];
                    if (d->copy != copy) continue;
                    if (!buf) {
                        buf = device_alloc(p, NULL, whole, t->name ? t->name : "shared leaf");
                        if (!buf) {
                            st = SPMD_ERR_NOMEM;
                            break;
                        }
                        memset(buf, 0, whole);
                        p->shared_bufs[p->n_shared_bufs++] = buf;
                    }
                    int64_t index = split >= 0 ? sharding_block_index(held, p->c.mesh, split, d->id) : 0;
                    d->leaf_data[v] = buf + (size_t)index * bytes + slice_offset(p, d, v);
                    places[n++] = (shared_place){d->leaf_data[v], k};
                }
                if (st != SPMD_OK) break;
                rank_sharers(p, v, places, n);
            }
        }
        if (st != SPMD_OK) break;
    }
    base_free(&p->alloc, places);
    return st;
}

/* Pipeline stages: the device's stage, and the group of it and its peer
 * on each other stage its program sends to or receives from (the lower
 * stage's member first), at from * stages + to and to * stages + from. */
static spmd_status setup_stage_pairs(spmd_program *p, device *d)
{
    const spmd_mesh *m = p->c.mesh;
    int axis = mesh_stage_axis(m), stages = m->shape[axis];
    d->stage_pairs = base_calloc(&p->alloc, (size_t)stages * (size_t)stages * sizeof *d->stage_pairs,
                                 "stage pairs");
    if (!d->stage_pairs) return SPMD_ERR_NOMEM;
    d->kd.stage = mesh_stage_of(m, d->id);
    d->kd.stages = stages;
    d->kd.pairs = d->stage_pairs;
    mesh_axes along = {.n = 1, .axis = {(int8_t)axis}};
    int by_stage[MESH_MAX_DEVICES];
    mesh_group(m, d->id, &along, by_stage);
    const spmd_graph *lg = p->c.local;
    for (int i = 0; i < lg->n_nodes; i++) {
        const spmd_tensor *t = lg->nodes[i];
        if (t->op != IR_STAGE_TRANSFER) continue;
        int from = t->attr.stage.from, to = t->attr.stage.to;
        if (from != d->kd.stage && to != d->kd.stage) continue;
        if (d->stage_pairs[from * stages + to]) continue;
        int lo = from < to ? from : to, hi = from < to ? to : from;
        int members[2] = {m->position[by_stage[lo]], m->position[by_stage[hi]]};
        coll_group *g = coll_world_group(p->world, 2, members);
        if (!g) return SPMD_ERR_NOMEM;
        d->stage_pairs[from * stages + to] = d->stage_pairs[to * stages + from] = g;
    }
    return SPMD_OK;
}

static spmd_status setup_device(spmd_program *p, device *d, int id, const uint64_t *copy_seeds)
{
    const spmd_graph *lg = p->c.local;
    d->prog = p;
    d->id = id;
    d->copy = p->c.mesh ? mesh_copy_of(p->c.mesh, p->c.mesh->position[id]) : 0;
    d->seed = copy_seeds ? copy_seeds[d->copy] : p->seed;
    d->leaf_data = base_calloc(&p->alloc, (size_t)(lg->n_nodes ? lg->n_nodes : 1) * sizeof(void *),
                               "program tensors");
    if (!d->leaf_data) return SPMD_ERR_NOMEM;
    int stage = stage_of_device(p, id);
    for (int i = 0; i < lg->n_nodes; i++) {
        const spmd_tensor *t = lg->nodes[i];
        if (!ir_op_is_leaf(t->op) && !p->c.plan.swapped[i]) continue;
        if (p->share_as && p->share_as[i] >= 0) continue; /* setup_shared */
        if (!holds(stage, t)) continue;
        d->leaf_data[i] = device_alloc(p, d, ir_nbytes(t), t->name ? t->name : "update value");
        if (!d->leaf_data[i]) return SPMD_ERR_NOMEM;
        /* A value's buffer becomes its target's after a step: zero padding. */
        if (!ir_op_is_leaf(t->op)) memset(d->leaf_data[i], 0, ir_nbytes(t));
    }
    size_t arena = compiled_stage_arena_bytes(&p->c, stage);
    if (arena) {
        d->arena = device_alloc(p, d, arena, "activation arena");
        if (!d->arena) return SPMD_ERR_NOMEM;
    }
    if (p->c.scratch_each) {
        d->scratch = device_alloc(p, d, p->c.scratch_each * (size_t)p->c.nth, "kernel scratch");
        if (!d->scratch) return SPMD_ERR_NOMEM;
    }
    d->pool = rt_pool_create(p->c.nth, &p->alloc);
    if (!d->pool) return SPMD_ERR_NOMEM;
    if (p->c.partitioned) {
        int n = p->c.part.n_specs ? p->c.part.n_specs : 1;
        d->groups = base_calloc(&p->alloc, (size_t)n * sizeof *d->groups, "device groups");
        d->member = base_calloc(&p->alloc, (size_t)n * sizeof *d->member, "device groups");
        if (!d->groups || !d->member) return SPMD_ERR_NOMEM;
        for (int s = 0; s < p->c.part.n_specs; s++) {
            int members[MESH_MAX_DEVICES];
            int size = mesh_group(p->c.mesh, id, &p->c.part.specs[s], members);
            /* World ranks are mesh positions: device ids may be permuted. */
            for (int k = 0; k < size; k++) members[k] = p->c.mesh->position[members[k]];
            d->groups[s] = coll_world_group(p->world, size, members);
            if (!d->groups[s]) return SPMD_ERR_NOMEM;
            d->member[s] = mesh_group_rank(p->c.mesh, id, &p->c.part.specs[s]);
        }
        d->kd = (kern_device){id, d->groups, d->member, p->world, p->c.mesh, p->c.part.specs,
                              .stage = -1};
        if (mesh_stage_axis(p->c.mesh) >= 0) {
            spmd_status st = setup_stage_pairs(p, d);
            if (st != SPMD_OK) return st;
        }
    }
    return setup_views(p, d);
}

/* Refuse up front a mesh the address-space limit (ulimit -v) cannot hold,
 * rather than fail partway through starting its threads: each worker
 * thread maps a stack, and each device its memory.  Both are lower
 * bounds, so nothing that would run is refused. */
static spmd_status check_address_space(const spmd_program *p)
{
    struct rlimit as;
    if (getrlimit(RLIMIT_AS, &as) != 0 || as.rlim_cur == RLIM_INFINITY) return SPMD_OK;
    size_t stack = 0;
    pthread_attr_t attr;
    if (pthread_attr_init(&attr) == 0) {
        pthread_attr_getstacksize(&attr, &stack);
        pthread_attr_destroy(&attr);
    }
    /* Started threads: one per device here but the caller's, each
     * device's pool but its first, and its communication thread. */
    int n = p->n_local;
    long threads = (n > 1 ? n - 1 : 0) + (long)n * (p->c.nth - 1) + (p->c.plan.n_async ? n : 0);
    /* A device of a stage holds only its stage's parameters and state. */
    bool staged = p->c.partitioned && mesh_stage_axis(p->c.mesh) >= 0;
    double per_device = staged ? (double)(p->c.input_bytes + p->c.scratch_each * (size_t)p->c.nth)
                               : (double)compiled_peak_bytes(&p->c);
    double need = (double)threads * (double)stack + n * per_device;
    double mapped = (double)base_mapped_bytes();
    double left = (double)as.rlim_cur - mapped;
    if (need <= left) return SPMD_OK;
    const double gib = 1024.0 * 1024.0 * 1024.0;
    return base_error(SPMD_ERR_NOMEM,
                      "compile: %d devices need at least %.2f GiB of address space (%ld threads "
                      "with %zu MiB stacks, %.1f MiB per device) and the address-space limit "
                      "(ulimit -v) leaves %.2f GiB",
                      n, need / gib, threads, stack >> 20, per_device / (1024.0 * 1024.0),
                      left < 0 ? 0.0 : left / gib);
}

spmd_status exec_setup_devices(spmd_program *p, const spmd_compile_options *opts)
{
    const spmd_graph *g = p->c.g;
    spmd_status st;
    if ((st = check_address_space(p)) != SPMD_OK) return st;
    if ((st = check_kernels(p->c.local)) != SPMD_OK) return st;
    if ((st = setup_share_as(p)) != SPMD_OK) return st;
    if (p->share_as) {
        size_t most = (size_t)p->c.local->n_nodes * (size_t)p->copies;
        p->shared_bufs = base_calloc(&p->alloc, (most ? most : 1) * sizeof *p->shared_bufs, "shared leaves");
        if (!p->shared_bufs) return SPMD_ERR_NOMEM;
    }
    p->dev = base_calloc(&p->alloc, (size_t)p->n_local * sizeof *p->dev, "devices");
    if (!p->dev) return SPMD_ERR_NOMEM;
    for (int d = 0; d < p->n_local; d++)
        if ((st = setup_device(p, &p->dev[d], g->mesh ? g->mesh->ids[p->first + d] : 0,
                               opts ? opts->copy_seeds : NULL)) != SPMD_OK)
            return st;
    return setup_shared(p);
}

void exec_free_devices(spmd_program *p)
{
    for (int d = 0; p->dev && d < p->n_local; d++) {
        device *dv = &p->dev[d];
        exec_comm_stop(p, dv);
        if (dv->pool) rt_pool_free(dv->pool);
        for (int i = 0; dv->leaf_data && i < p->c.local->n_nodes; i++)
            if (!p->share_as || p->share_as[i] < 0) base_free(&p->alloc, dv->leaf_data[i]);
        base_free(&p->alloc, dv->leaf_data);
        base_free(&p->alloc, dv->view_offset);
        base_free(&p->alloc, dv->share_rank);
        base_free(&p->alloc, dv->arena);
        base_free(&p->alloc, dv->scratch);
        base_free(&p->alloc, dv->groups);
        base_free(&p->alloc, dv->stage_pairs);
        base_free(&p->alloc, dv->member);
    }
    base_free(&p->alloc, p->dev);
    for (int i = 0; i < p->n_shared_bufs; i++) base_free(&p->alloc, p->shared_bufs[i]);
    base_free(&p->alloc, p->shared_bufs);
    base_free(&p->alloc, p->share_as);
}
