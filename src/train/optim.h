/*
 * Internal entry to the optimizer builder (optim.c), shared by the public
 * spmd_optimizer_apply and the older spmd_sgd, so the two cannot drift
 * apart.
 */
#ifndef SPMD_TRAIN_OPTIM_H
#define SPMD_TRAIN_OPTIM_H

#include "spmd/train.h"

/* Append `opt`'s update of every parameter, with `lr` (an f32 scalar of g)
 * as the learning rate.  `who` prefixes messages ("sgd", "optimizer").
 * With `bookkeeping`, also the step counter "opt.step", the global
 * gradient norm "opt.grad_norm" (an output, returned in out->grad_norm)
 * and the marked copies that hold gradients in their parameters'
 * shardings; spmd_sgd leaves them out so the graphs it always built stay
 * as they were (its update alone already lets propagation reduce-scatter
 * each gradient).  Everything is checked before anything is appended. */
spmd_status train_optimizer_append(spmd_graph *g, const spmd_optimizer *opt, spmd_tensor *lr,
                                   bool bookkeeping, const char *who,
                                   spmd_optimizer_tensors *out);

#endif
