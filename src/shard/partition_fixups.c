/*
 * The per-op fixups of the partitioner (partition_impl.h): where an op's
 * local form differs from its global one (heads split, means over split
 * dims, padded rows, a vocabulary split, dropout's global indices), the
 * fixup that ops.def names for the op turns the local node into one that
 * computes the device's share.
 */
#include "shard/partition_impl.h"

#include <string.h>

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

/* Attention (or its backward) whose query rows are split: the kernel
 * needs the device's block of them, which it finds at run time as its
 * member rank in the group of the rows' axes, for the causal mask and,
 * backward, the rows of dq; and its heads as fix_heads. */
static spmd_tensor *fix_attention(builder *b, const spmd_tensor *t, const sharding *need,
                                  spmd_tensor *lt)
{
    const spmd_tensor *q = t->in[0];
    lt = fix_heads(b, t, need, lt);
    if (!need[0].dim[1].n) return lt;
    lt->attr.attention.spec = part_spec_index(b->p, &need[0].dim[1]);
    lt->attr.attention.rows = q->dims[1];
    return lt->attr.attention.spec < 0 ? part_fail_nomem(b, "the collective groups") : lt;
}

/* A grouped convolution split over its channels in whole groups
 * (sig_conv2d): the device's channels hold local Cin / (Cin / groups)
 * groups. */
static spmd_tensor *fix_conv_groups(builder *b, const spmd_tensor *t, const sharding *need,
                                    spmd_tensor *lt)
{
    (void)b, (void)need;
    if (t->attr.conv.groups == 1) return lt;
    ir_conv_roles role = ir_conv_roles_of(t->op);
    int64_t per_group = ir_conv_dims(t, role.x)[1] / t->attr.conv.groups;
    lt->attr.conv.groups = (int)(ir_conv_dims(lt, role.x)[1] / per_group);
    return lt;
}

/* A mean over split dims is a local mean: rescale it to the global count
 * (the pending sum over the split axes then adds up to the mean). */
static spmd_tensor *fix_mean(builder *b, const spmd_tensor *t, const sharding *need,
                             spmd_tensor *lt)
{
    if (!sharding_dim_axes(&need[0])) return lt;
    double share = part_local_share(b->p, t->in[0], &need[0], t->attr.reduce.axes);
    return LOCAL(b, spmd_scale(b->p->local, lt, (float)share));
}

/* mse is a mean over every element. */
static spmd_tensor *fix_mse(builder *b, const spmd_tensor *t, const sharding *need,
                            spmd_tensor *lt)
{
    const spmd_tensor *x = t->in[0];
    return LOCAL(b, spmd_scale(b->p->local, lt,
                               (float)part_local_share(b->p, x, &need[0], (1u << x->rank) - 1)));
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
    lt->attr.embed.spec = part_spec_index(p, &out.dim[0]);
    lt->attr.embed.global = fwd ? t->in[0]->dims[0] : t->attr.embed.rows;
    return lt->attr.embed.spec < 0 ? part_fail_nomem(b, "the collective groups") : lt;
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
    attr.rows.vocab_spec = part_spec_index(p, vocab);
    attr.rows.vocab = t->in[0]->dims[t->in[0]->rank - 1];
    if (attr.rows.vocab_spec < 0) return part_fail_nomem(b, "the collective groups");
    int64_t dims[SPMD_MAX_RANK];
    memcpy(dims, targets->dims, (size_t)tr * sizeof *dims);
    dims[tr] = 3;
    spmd_tensor *stats = LOCAL(b, ir_node_new(p->local, IR_VOCAB_CE_STATS, SPMD_F32, tr + 1, dims,
                                              (spmd_tensor *[]){logits, targets}, 2));
    if (!stats) return NULL;
    stats->attr = attr;
    dims[tr] = 3 * mesh_axes_size(p->m, vocab);
    spmd_tensor *all = part_emit_coll(b, IR_ALL_GATHER, stats, vocab, tr, 0, 0, dims, t->id, t->id);
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
        lt->attr.rows.spec[i] = part_spec_index(p, &need[1].dim[i]);
        lt->attr.rows.global[i] = targets->dims[i];
        if (lt->attr.rows.spec[i] < 0) return part_fail_nomem(b, "the collective groups");
    }
    const mesh_axes *vocab = &need[0].dim[t->in[0]->rank - 1];
    if (vocab->n && !(lt = split_vocab_loss(b, t, vocab, lt))) return NULL;
    if (!sharding_dim_axes(&need[1])) return lt;
    return LOCAL(b, spmd_scale(p->local, lt, (float)part_local_share(p, targets, &need[1], rows)));
}

/* Dropout draws by an element's index in the whole tensor: per split dim
 * of its output, the group whose member rank is the device's block and
 * the split's groups (the whole sizes are in the attributes already). */
static spmd_tensor *fix_dropout(builder *b, const spmd_tensor *t, const sharding *need,
                                spmd_tensor *lt)
{
    (void)need;
    partition *p = b->p;
    sharding out = shard_produced(&p->prop, t);
    for (int i = 0; i < t->rank; i++) {
        const mesh_axes *axes = &out.dim[i];
        if (!axes->n) continue;
        int spec = part_spec_index(p, axes);
        if (spec < 0) return part_fail_nomem(b, "the collective groups");
        if (spec > INT16_MAX) {
            part_record(b, SPMD_ERR_UNSUPPORTED, "dropout: the program has more than %d axis "
                        "lists (collective groups)", INT16_MAX);
            return NULL;
        }
        lt->attr.dropout.spec[i] = (int16_t)spec;
        lt->attr.dropout.groups[i] = (int16_t)mesh_axes_groups(axes);
    }
    return lt;
}

/* batch_norm_var over x split unevenly along a summed dim: the padding
 * the partitioner zeroed would add (0 - mean)^2, so the kernel is told
 * the dim's group and whole size and leaves the padding out.  (The sum is
 * divided by the global count already: attr.bnorm.count.) */
static spmd_tensor *fix_channel_padding(builder *b, const spmd_tensor *t, const sharding *need,
                                        spmd_tensor *lt)
{
    partition *p = b->p;
    const spmd_tensor *x = t->in[0];
    for (int i = 0; i < x->rank; i++) {
        if (i == 1 || x->dims[i] % sharding_blocks(&need[0], p->m, i) == 0) continue;
        lt->attr.bnorm.spec[i] = part_spec_index(p, &need[0].dim[i]);
        lt->attr.bnorm.global[i] = x->dims[i];
        if (lt->attr.bnorm.spec[i] < 0) return part_fail_nomem(b, "the collective groups");
    }
    return lt;
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

spmd_tensor *part_fixup(builder *b, const spmd_tensor *t, const sharding *need, spmd_tensor *lt)
{
    return fixup_table[t->op](b, t, need, lt);
}
