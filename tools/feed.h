/*
 * The data into the compiled programs (feed.c): each training step's
 * batch, learning rate and weight decay for every copy; the held-out
 * accuracy; the validation loss.
 */
#ifndef SPMD_TOOLS_FEED_H
#define SPMD_TOOLS_FEED_H

#include "model.h"

#include <stdbool.h>
#include <stdint.h>

/* The learning rate of `step` (from 0) by the schedule flags (copy 0's). */
float feed_lr(const cli_opts *o, int step);
/* The global batch of the training split from sample `first` on, and the
 * learning rate of `step` (from 0), for every copy; 0, or an exit code. */
int feed_step(const cli_opts *o, const cli_model *m, spmd_program *p, int step, int64_t first);
/* Cap --eval at the held-out set's size and --val-batches at its batches,
 * saying so on stdout: past it, evaluation only scores the same problems
 * again, for as long as asked. */
void feed_cap_eval(cli_opts *o, const cli_model *m);
/* Called after each batch the accuracy scores, with the samples scored so far. */
typedef void (*feed_progress)(void *ctx, int64_t scored);
/* Held-out accuracy of copy `copy`'s trained parameters (read from
 * `train`) over --eval samples: the share of scored targets predicted
 * exactly; -1 when there is none.  `progress` may be NULL. */
double feed_accuracy(const cli_opts *o, const cli_model *m, const spmd_program *train,
                     spmd_program *eval, int copy, feed_progress progress, void *ctx);
/* Whether the run validates at step `done` (from 1) of `steps`: every
 * --val-every steps and at the last (model_validates: whether at all). */
bool feed_validates_at(const cli_opts *o, int done, int steps);
/* The mean loss of the trained parameters (read from `train`) over the
 * --val-batches validation batches, computed by the forward-only `eval`
 * program (no gradients, no optimizer state touched); 0, or 1 with a
 * message. */
int feed_val_loss(const cli_opts *o, const cli_model *m, const spmd_program *train,
                  spmd_program *eval, int copy, double *loss);

#endif
