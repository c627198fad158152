/*
 * The training layer: optimizers and learning-rate schedules, the FSDP
 * wrapper, activation checkpointing.  Optimizer updates are graph ops
 * appended after spmd_grad, so they are partitioned with the rest of the
 * step and their state is sharded like its parameter.
 */
#ifndef SPMD_TRAIN_H
#define SPMD_TRAIN_H

#include "spmd/mesh.h"
#include "spmd/spmd.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Optimizers ----------------------------------------------------------- */

typedef enum spmd_optimizer_kind {
    SPMD_OPTIMIZER_SGD = 0,  /* with momentum and (L2) weight decay */
    SPMD_OPTIMIZER_ADAMW
} spmd_optimizer_kind;

/* PyTorch's semantics (torch.optim.SGD, torch.optim.AdamW). */
typedef struct spmd_optimizer {
    spmd_optimizer_kind kind;
    float momentum;     /* SGD: 0 for plain SGD */
    float weight_decay; /* SGD: added to the gradient; AdamW: decoupled */
    float beta1, beta2; /* AdamW (0.9, 0.999 when both are 0) */
    float eps;          /* AdamW (1e-8 when 0) */
    float clip_norm;    /* > 0: scale gradients so their global norm is at most this */
} spmd_optimizer;

/* The scalar inputs and outputs an optimizer adds. */
typedef struct spmd_optimizer_tensors {
    spmd_tensor *lr;        /* input "lr", f32 scalar, fed each step */
    spmd_tensor *grad_norm; /* the global gradient norm (before clipping), an output */
} spmd_optimizer_tensors;

/* Append the update of every parameter (spmd_grad first).  State tensors
 * ("<param>.momentum", "<param>.exp_avg", "<param>.exp_avg_sq", "opt.step")
 * start at zero and take their parameter's sharding; each gradient is held
 * in its parameter's sharding too (so FSDP reduce-scatters it).  The
 * global norm is a sum over every shard. */
SPMD_API spmd_status spmd_optimizer_apply(spmd_graph *g, const spmd_optimizer *opt,
                                          spmd_optimizer_tensors *out);

/* Linear warmup over `warmup` steps to `peak`, then cosine decay to `floor`
 * at `total` steps (and `floor` after).  step counts from 0. */
SPMD_API float spmd_lr_schedule(int step, int warmup, int total, float peak, float floor);

/* ---- FSDP wrapper ------------------------------------------------------------- */

/* PyTorch/XLA FSDPv2's behaviour: every parameter not already marked is
 * sharded on its largest dimension over mesh axis `axis` (replicated when no
 * dimension is at least the axis size), and each of `inputs` (n of them) has
 * its batch (first) dimension split over `data_axes` (comma-separated; NULL
 * for every mesh axis) unless already marked. */
SPMD_API spmd_status spmd_fsdp_wrap(spmd_graph *g, const spmd_mesh *m, const char *axis,
                                    spmd_tensor *const *inputs, int n, const char *data_axes);

/* ---- Activation checkpointing ---------------------------------------------------- */

/* spmd_grad with activation checkpointing: the forward values between
 * consecutive checkpoints are recomputed in the backward pass instead of
 * kept, so only the `checkpoints` (e.g. each transformer block's output)
 * live from the forward to the backward pass. */
SPMD_API spmd_status spmd_grad_checkpointed(spmd_graph *g, spmd_tensor *loss,
                                            spmd_tensor *const *checkpoints, int n);

#ifdef __cplusplus
}
#endif
#endif
