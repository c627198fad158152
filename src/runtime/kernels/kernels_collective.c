/*
 * Kernels of the ops the partitioner emits: collectives over a group of
 * devices and the shard-local slice and padding mask.  A collective is one
 * call per device, so thread 0 of each device makes it while the device's
 * other threads wait at the node's barrier.
 */
#include "runtime/collectives/collectives.h"
#include "runtime/kernels/kernels.h"
#include "runtime/kernels/kernels_ops.h"

#include "mesh/mesh.h"

#include <string.h>

/* Product of dims [from, to). */
static int64_t span(const spmd_tensor *t, int from, int to)
{
    int64_t n = 1;
    for (int i = from; i < to; i++) n *= t->dims[i];
    return n;
}

static coll_group *group_of(const kern_args *a) { return a->dev->groups[a->node->attr.coll.spec]; }
static int member_of(const kern_args *a) { return a->dev->member[a->node->attr.coll.spec]; }

/* The element type a sum over the group is stored in: bf16 for a gradient
 * reduced in bf16, else f32. */
static coll_dtype sum_type(const spmd_tensor *t)
{
    return t->dtype == SPMD_BF16 ? COLL_BF16 : COLL_F32;
}

static void check(const kern_args *a, spmd_status st)
{
    if (st == SPMD_OK) return;
    if (st != SPMD_ERR_TIMEOUT) {
        kern_fail(a, st, "%s: %s", ir_op_name(a->node->op), spmd_last_error());
        return;
    }
    /* The watchdog's "collective timeout: OP: whom it waited for", with the
     * collective's axes put in: "collective timeout: OP over AXES: ...". */
    const char *why = spmd_last_error(), *prefix = "collective timeout: ";
    if (!strncmp(why, prefix, strlen(prefix))) {
        why += strlen(prefix);
        const char *colon = strstr(why, ": ");
        if (colon) why = colon + 2;
    }
    if (a->node->op == IR_STAGE_TRANSFER) {
        kern_fail(a, st, "collective timeout: stage_transfer from stage %d to stage %d: %s",
                  a->node->attr.stage.from, a->node->attr.stage.to, why);
        return;
    }
    char axes[128];
    mesh_text t;
    mesh_text_init(&t, axes, sizeof axes);
    const mesh_axes *spec = &a->dev->specs[a->node->attr.coll.spec];
    mesh_text_axes(&t, a->dev->mesh, spec);
    kern_fail(a, st, "collective timeout: %s over %s '%s': %s", ir_op_name(a->node->op),
              spec->n == 1 ? "axis" : "axes", axes, why);
}

/* out = sum over the group of in. */
void kern_all_reduce(const kern_args *a)
{
    if (a->ith != 0) return;
    const spmd_tensor *t = a->node;
    memcpy(a->out, a->in[0], ir_nbytes(t));
    coll_group *g = group_of(a);
    check(a, g->ops->all_reduce(g, member_of(a), a->out, ir_numel(t), sum_type(t)));
}

/* x from stage `from` to stage `to`: a permute over the pair of devices
 * that differ only in their stage, the receiver's member reading the
 * sender's; a copy where there is no stage axis (one program holds every
 * stage).  In a group of one member (a test's) the member reads itself. */
void kern_stage_transfer(const kern_args *a)
{
    if (a->ith != 0) return;
    const spmd_tensor *t = a->node;
    int from = t->attr.stage.from, to = t->attr.stage.to;
    const kern_device *dev = a->dev;
    if (!dev || !dev->pairs) {
        memcpy(a->out, a->in[0], ir_nbytes(t));
        return;
    }
    coll_group *g = dev->pairs[from * dev->stages + to];
    int src[2] = {0, -1};
    int member = 0;
    if (g->size == 2) {
        int lower = from < to ? from : to;
        int sender = from == lower ? 0 : 1;
        member = dev->stage == lower ? 0 : 1;
        src[sender] = -1;
        src[1 - sender] = sender;
    }
    /* The receiver does not hold x (another stage's): it passes its own
     * output, which no member reads. */
    const void *in = dev->stage == to && g->size == 2 ? a->out : a->in[0];
    check(a, g->ops->permute(g, member, in, a->out, (int64_t)ir_nbytes(t), src));
}

/* [.., b, ..] blocks from every member -> [.., n*b, ..] along dim. */
void kern_all_gather(const kern_args *a)
{
    if (a->ith != 0) return;
    const spmd_tensor *x = a->node->in[0];
    int d = a->node->attr.coll.dim;
    int64_t outer = span(x, 0, d);
    int64_t inner = span(x, d, x->rank) * (int64_t)spmd_dtype_size(x->dtype);
    coll_group *g = group_of(a);
    check(a, g->ops->all_gather(g, member_of(a), a->in[0], a->out, outer, inner));
}

/* [.., n*b, ..] summed over members -> this member's [.., b, ..]. */
void kern_reduce_scatter(const kern_args *a)
{
    if (a->ith != 0) return;
    const spmd_tensor *t = a->node;
    int d = t->attr.coll.dim;
    int64_t outer = span(t, 0, d), inner = span(t, d, t->rank);
    coll_group *g = group_of(a);
    check(a, g->ops->reduce_scatter(g, member_of(a), a->in[0], a->out, outer, inner,
                                    sum_type(t)));
}

/* Split `dim` into n blocks, block j to member j; received blocks are
 * concatenated along `dim2`.  Packs into contiguous blocks first. */
void kern_all_to_all(const kern_args *a)
{
    if (a->ith != 0) return;
    const spmd_tensor *t = a->node, *x = t->in[0];
    coll_group *g = group_of(a);
    int n = g->size, d = t->attr.coll.dim, d2 = t->attr.coll.dim2;
    size_t es = spmd_dtype_size(x->dtype);
    size_t bytes = ir_nbytes(x), block = bytes / (size_t)n;
    char *send = a->scratch, *recv = send + bytes;
    /* Block j of the send buffer: x restricted to rows [j*b, (j+1)*b) of d. */
    int64_t outer = span(x, 0, d), rows = x->dims[d] / n, inner = span(x, d + 1, x->rank);
    for (int j = 0; j < n; j++)
        for (int64_t o = 0; o < outer; o++)
            memcpy(send + (size_t)j * block + (size_t)(o * rows * inner) * es,
                   (const char *)a->in[0] + (size_t)((o * x->dims[d] + j * rows) * inner) * es,
                   (size_t)(rows * inner) * es);
    spmd_status st = g->ops->all_to_all(g, member_of(a), send, recv, (int64_t)block);
    if (st != SPMD_OK) {
        check(a, st);
        return;
    }
    /* Received block i has x's shape with d split n ways; it fills the
     * i-th stretch of dim d2 of the output. */
    int64_t o2 = span(t, 0, d2), len = t->dims[d2] / n, in2 = span(t, d2 + 1, t->rank);
    for (int i = 0; i < n; i++)
        for (int64_t o = 0; o < o2; o++)
            memcpy((char *)a->out + (size_t)((o * t->dims[d2] + i * len) * in2) * es,
                   recv + (size_t)i * block + (size_t)(o * len * in2) * es, (size_t)(len * in2) * es);
}

/* This member's block of dim d (global size attr.coll.global, padded to
 * b = t->dims[d] rows per member) into a->out: the rows before the global
 * end copied from the input, the padding past it zeroed, so that sums over
 * d stay exact.  `whole`: the input holds the whole dim, so the block is
 * found at the member's offset; else it holds only the member's block. */
static void copy_member_block(const kern_args *a, bool whole)
{
    const spmd_tensor *t = a->node, *x = t->in[0];
    int d = t->attr.coll.dim;
    size_t es = spmd_dtype_size(t->dtype);
    int64_t b = t->dims[d], start = (int64_t)member_of(a) * b;
    int64_t valid = t->attr.coll.global - start;
    if (valid < 0) valid = 0;
    if (valid > b) valid = b;
    int64_t src_rows = whole ? x->dims[d] : b, src_start = whole ? start : 0;
    int64_t outer = span(t, 0, d), inner = span(t, d + 1, t->rank);
    int64_t lo, hi;
    kern_split(outer, a->ith, a->nth, 1, &lo, &hi);
    for (int64_t o = lo; o < hi; o++) {
        char *dst = (char *)a->out + (size_t)(o * b * inner) * es;
        if (valid)
            memcpy(dst, (const char *)a->in[0] + (size_t)((o * src_rows + src_start) * inner) * es,
                   (size_t)(valid * inner) * es);
        memset(dst + (size_t)(valid * inner) * es, 0, (size_t)((b - valid) * inner) * es);
    }
}

/* This member's block of a whole dim; past the global end, zeros. */
void kern_shard_slice(const kern_args *a) { copy_member_block(a, true); }

/* Copy, zeroing the padding of dim `dim` so sums over it stay exact. */
void kern_mask_padding(const kern_args *a) { copy_member_block(a, false); }
