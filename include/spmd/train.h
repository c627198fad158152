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
    SPMD_OPTIMIZER_SGD = 0,  /* momentum (dampening, Nesterov), L2 weight decay */
    SPMD_OPTIMIZER_ADAMW,    /* decoupled weight decay */
    SPMD_OPTIMIZER_ADAM,     /* L2 weight decay, added to the gradient */
    SPMD_OPTIMIZER_RMSPROP,  /* L2 weight decay; momentum, centered */
    SPMD_OPTIMIZER_ADAGRAD   /* L2 weight decay; lr decay */
} spmd_optimizer_kind;

/* ZeRO (stages 1 and 2), spmd_optimizer.zero: keep the optimizer state,
 * the held gradient and the update split over the mesh axes a parameter
 * is replicated over (not independent ones), on its largest dim, so each
 * device updates its share; the gradient is reduce-scattered instead of
 * all-reduced and the new parameter all-gathered back.  No effect without
 * a mesh, or on a parameter split over every axis already.  The default
 * (0) is on: the same bytes move, each device does 1/n of the update and
 * holds 1/n of the state, and the same seed and mesh give the same bits.
 * Off updates every replica whole (the plan before ZeRO was the default:
 * its bits, where ZeRO's sums run in another order, clipping's norm and
 * FSDP plus replicas). */
typedef enum spmd_zero {
    SPMD_ZERO_DEFAULT = 0, /* on */
    SPMD_ZERO_ON,
    SPMD_ZERO_OFF
} spmd_zero;

/* PyTorch's semantics and order of operations: torch.optim.SGD,
 * torch.optim.Adam, torch.optim.AdamW, torch.optim.RMSprop and
 * torch.optim.Adagrad, each setting of the same name meaning what it
 * means there.  A setting the kind does not take must be 0 (false). */
typedef struct spmd_optimizer {
    spmd_optimizer_kind kind;
    float momentum;     /* SGD, RMSprop: 0 for none */
    float weight_decay; /* AdamW: decoupled; the others: added to the gradient */
    float beta1, beta2; /* Adam, AdamW (0.9, 0.999 when both are 0) */
    /* Adam, AdamW, RMSprop: 1e-8 when 0; Adagrad: 1e-10 when 0 */
    float eps;
    float dampening;    /* SGD: momentum's dampening (needs momentum) */
    bool nesterov;      /* SGD: Nesterov momentum (needs momentum, no dampening) */
    bool amsgrad;       /* Adam, AdamW: the running maximum of the second moment */
    float alpha;        /* RMSprop: the square average's decay (0.99 when 0) */
    bool centered;      /* RMSprop: divide by the variance, not the square average */
    float lr_decay;     /* Adagrad: step t's lr is lr / (1 + (t - 1) lr_decay) */
    float initial_accumulator_value; /* Adagrad: where the sum of squares starts */
    bool maximize;      /* every kind: ascend, as if the gradient were negated */
    float clip_norm;    /* > 0: scale gradients so their global norm is at most this */
    spmd_zero zero;     /* ZeRO: on unless SPMD_ZERO_OFF (spmd_zero above) */
    /* Read the decay from the f32 scalar input "weight_decay", fed each
     * step, instead of compiling it in: copies (or runs) may then decay
     * differently; weight_decay above only says whether the update decays
     * at all (non-zero).  The same bits as the compiled-in constant. */
    bool weight_decay_input;
    /* Gradient accumulation: the optimizer step's batch is this many
     * micro-batches (0 or 1: none).  Each micro-batch's forward and
     * backward add its gradients into accumulators in their local form
     * (a pending sum or a shard, no collective); the cross-device
     * reduction and the update run once, on the mean of the micro-batches'
     * gradients, as one step on their concatenated batch.  The
     * accumulators are states "<param>.grad_acc"; the program feeds its
     * own input "accumulate.keep".  Run
     * spmd_program_accumulate once per micro-batch but the last, then
     * spmd_program_run (spmd_trainer_accumulate, spmd_trainer_step).  Here,
     * not on the trainer, because the optimizer is what reads the
     * gradients: the accumulators sit between the two. */
    int accumulate_steps;
} spmd_optimizer;

/* The scalar inputs and outputs an optimizer adds. */
typedef struct spmd_optimizer_tensors {
    spmd_tensor *lr;        /* input "lr", f32 scalar, fed each step */
    spmd_tensor *grad_norm; /* the global gradient norm (before clipping), an output */
    spmd_tensor *weight_decay; /* input "weight_decay" (weight_decay_input), else NULL */
} spmd_optimizer_tensors;

/* Append the update of every trained parameter (spmd_grad first; a
 * frozen one, spmd_param_freeze, has neither update nor state).  State
 * tensors, each kind's as torch.optim names them ("<param>.momentum" for
 * SGD; "<param>.exp_avg", "<param>.exp_avg_sq" and with amsgrad
 * "<param>.max_exp_avg_sq" for Adam and AdamW; "<param>.square_avg",
 * "<param>.grad_avg" when centered and "<param>.momentum" for RMSprop;
 * "<param>.sum" for Adagrad) and "opt.step" start at zero (Adagrad's sum
 * at initial_accumulator_value) and take their parameter's sharding; each
 * gradient is held
 * in its parameter's sharding too (so FSDP reduce-scatters it), through a
 * marked copy that the update reads (spmd_tensor_grad stays the raw
 * gradient).  The global norm, "opt.grad_norm", is a sum over every shard
 * and an output whether or not clip_norm is set.  "opt.step" counts the
 * steps run; Adam's and AdamW's bias corrections, Adagrad's lr decay and
 * SGD's first step with dampening (the buffer takes the whole gradient)
 * come from it.
 *
 * The learning rate is the graph's f32 scalar input "lr", created here or
 * reused when the graph already has it.  `out` may be NULL.
 *
 * Refused with a message, leaving the graph as it was: NULL graph or
 * settings; no spmd_grad yet; negative or non-finite momentum, weight
 * decay, dampening, clip_norm, eps, lr_decay or initial accumulator; a
 * beta outside [0, 1), an alpha outside [0, 1]; a setting of another kind
 * (betas or eps for SGD, momentum for AdamW), named with the kinds that
 * take it; dampening without momentum, Nesterov without momentum or with
 * dampening (as torch refuses); no trained parameter; a tensor "lr" that is
 * not an f32 scalar input; a parameter that already has an update
 * (spmd_sgd or a second call) or was created after spmd_grad; state
 * names already taken.  After SPMD_ERR_NOMEM the graph may hold part of
 * the update and is only fit for spmd_graph_free. */
SPMD_API spmd_status spmd_optimizer_apply(spmd_graph *g, const spmd_optimizer *opt,
                                          spmd_optimizer_tensors *out);

/* One parameter group, as in torch.optim's param_groups: its parameters
 * and its own settings (the same meanings, zeros and defaults as in
 * spmd_optimizer). */
typedef struct spmd_optimizer_group {
    /* n_params parameter names, each exact or a pattern where '*' stands
     * for any run of characters (dots too) and '?' for any one: "*.bias",
     * "h.*.attn.c_attn.weight".  A group may be empty (n_params 0).
     * Patterns pass over frozen parameters (spmd_param_freeze). */
    const char *const *params;
    int n_params;
    float weight_decay;
    float momentum;     /* SGD, RMSprop */
    float beta1, beta2; /* Adam, AdamW */
    float eps;          /* Adam, AdamW, RMSprop, Adagrad */
    float dampening;    /* SGD */
    bool nesterov;      /* SGD */
    bool amsgrad;       /* Adam, AdamW */
    float alpha;        /* RMSprop */
    bool centered;      /* RMSprop */
    float lr_decay;     /* Adagrad */
    float initial_accumulator_value; /* Adagrad */
    bool maximize;
} spmd_optimizer_group;

/* spmd_optimizer_apply with parameter groups: every trained parameter in
 * exactly one of the n_groups groups, updated with that group's settings
 * and learning rate.  The kind, clip_norm, zero and accumulate_steps come
 * from `opt` and hold for all groups (clipping scales every gradient by
 * the norm over all of them, as clip_grad_norm_ over all parameters
 * does); opt's settings a group has (weight_decay to maximize) must be 0
 * (each group has its own) and weight_decay_input false.
 *
 * Group i's learning rate is its own f32 scalar input, fed each step:
 * "lr" for group 0 (as spmd_optimizer_apply's), "lr.1", "lr.2", ... for
 * the others, each created or reused like "lr".  out->lr is group 0's;
 * `lrs`, when not NULL, gets all n_groups of them in group order.  One
 * group holding every parameter, with opt's settings, builds the graph
 * spmd_optimizer_apply builds (the same bits).
 *
 * Refused with a message, leaving the graph as it was, for what
 * spmd_optimizer_apply refuses (a group's settings named by its index)
 * and: NULL groups or n_groups < 1; a NULL or negative parameter list; a
 * parameter in two groups or in none; a name or pattern that matches no
 * trained parameter (the message says when it names a frozen one);
 * per-group settings or weight_decay_input in `opt`; a tensor
 * "lr.<i>" that is not an f32 scalar input. */
SPMD_API spmd_status spmd_optimizer_apply_groups(spmd_graph *g, const spmd_optimizer *opt,
                                                 const spmd_optimizer_group *groups, int n_groups,
                                                 spmd_optimizer_tensors *out, spmd_tensor **lrs);

/* Linear warmup over `warmup` steps to `peak`, then cosine decay to `floor`
 * at `total` steps (and `floor` after).  step counts from 0: step s < warmup
 * gets peak * s / warmup (so step 0 gets 0, as in Hugging Face's
 * get_cosine_schedule_with_warmup), step `warmup` gets peak.  A negative
 * step or warmup counts as 0; total <= warmup gives the floor once warmup
 * ends. */
SPMD_API float spmd_lr_schedule(int step, int warmup, int total, float peak, float floor);

/* ---- FSDP wrapper ------------------------------------------------------------- */

/* PyTorch/XLA FSDPv2's behaviour: every parameter not already marked is
 * sharded on its largest dimension over mesh axis `axis` (replicated when no
 * dimension is at least the axis size), and each of `inputs` (n of them) has
 * its batch (first) dimension split over `data_axes` (comma-separated; NULL
 * for every mesh axis but the independent ones) unless already marked. */
SPMD_API spmd_status spmd_fsdp_wrap(spmd_graph *g, const spmd_mesh *m, const char *axis,
                                    spmd_tensor *const *inputs, int n, const char *data_axes);

/* Split the batch (first) dimension of each of `inputs` not already marked
 * over `data_axes` (comma-separated; NULL for every mesh axis but the
 * independent ones, major first): the data-parallel part of
 * spmd_fsdp_wrap on its own. */
SPMD_API spmd_status spmd_shard_batch(spmd_graph *g, const spmd_mesh *m,
                                      spmd_tensor *const *inputs, int n, const char *data_axes);

/* ---- Activation checkpointing ---------------------------------------------------- */

/* spmd_grad with activation checkpointing: the forward values between
 * consecutive checkpoints are recomputed in the backward pass instead of
 * kept, so only the `checkpoints` (e.g. each transformer block's output,
 * "h.{i}.out" in the GPT of spmd/models.h) live from the forward to the
 * backward pass.  On one device the gradients are the same bits as
 * spmd_grad's (the recompute runs the same kernels on the same values).
 *
 * The checkpoints (n of them, any order, repeats ignored) cut the forward
 * pass, in creation order, into segments; each segment's values that the
 * backward pass reads are recomputed from the checkpoints and leaves
 * (inputs, parameters, state), which are never recomputed, right before
 * that segment's backward ops first need them.  The values after the last
 * checkpoint (the model's head and the loss), outputs marked before the
 * call and update values are kept, not recomputed.  n == 0 is spmd_grad.
 *
 * Refused, leaving the graph as it was: a graph that already has a
 * backward pass, a NULL loss or checkpoint, a checkpoint that is a leaf,
 * of another graph, or not part of the loss's forward pass (the loss does
 * not depend on it).  After an allocation failure the graph is as a
 * failed spmd_grad leaves it, or holds spmd_grad's plain backward pass. */
SPMD_API spmd_status spmd_grad_checkpointed(spmd_graph *g, spmd_tensor *loss,
                                            spmd_tensor *const *checkpoints, int n);

/* ---- The training step ------------------------------------------------------------ */

/* Compile once, step many times: the graph's backward pass (checkpointed
 * at `checkpoints` when n_checkpoints > 0), the optimizer's update, and the
 * program over the mesh of the graph's marks (one device without marks). */
typedef struct spmd_trainer spmd_trainer;

typedef struct spmd_trainer_options {
    spmd_optimizer optimizer;
    spmd_tensor *const *checkpoints;
    int n_checkpoints;
    spmd_compile_options compile;
} spmd_trainer_options;

/* Takes over building the graph: after this, g only runs. */
SPMD_API spmd_trainer *spmd_trainer_create(spmd_graph *g, spmd_tensor *loss,
                                           const spmd_trainer_options *opts);
SPMD_API void spmd_trainer_free(spmd_trainer *t);
/* The compiled program: set inputs, read outputs and parameters here. */
SPMD_API spmd_program *spmd_trainer_program(const spmd_trainer *t);
/* One step at learning rate `lr`; the loss (and the gradient norm before
 * clipping) come back through the pointers when not NULL.  With
 * accumulation the loss is the mean of the step's micro-batches' losses:
 * the loss of their concatenated batch. */
SPMD_API spmd_status spmd_trainer_step(spmd_trainer *t, float lr, float *loss, float *grad_norm);
/* With optimizer.accumulate_steps K > 1: one micro-batch (its inputs set
 * by the caller) of the K a step takes, all but the last, which
 * spmd_trainer_step runs with the update; its loss when `loss` is not
 * NULL. */
SPMD_API spmd_status spmd_trainer_accumulate(spmd_trainer *t, float *loss);

#ifdef __cplusplus
}
#endif
#endif
