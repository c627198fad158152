/*
 * What the optimizer's files share (optim.c builds the update,
 * optim_settings.c checks the settings and fills in their defaults).
 */
#ifndef SPMD_TRAIN_OPTIM_IMPL_H
#define SPMD_TRAIN_OPTIM_IMPL_H

#include "spmd/train.h"

/* Check `opt` (one group's settings, or spmd_optimizer_apply's) and fill
 * `r` with the settings in force: each kind's defaults for its zeros
 * (betas, eps, alpha).  `who` prefixes messages. */
spmd_status optim_resolve(const spmd_optimizer *opt, const char *who, spmd_optimizer *r);

/* With groups: refuse a setting in `opt` that each group has its own
 * of, and weight_decay_input. */
spmd_status optim_check_shared(const spmd_optimizer *opt, const char *who);

/* Group `index`'s settings in force: opt's shared ones with the group's
 * own, checked as optim_resolve checks, messages naming the group. */
spmd_status optim_resolve_group(const spmd_optimizer *opt, const spmd_optimizer_group *group,
                                int index, const char *who, spmd_optimizer *r);

#endif
