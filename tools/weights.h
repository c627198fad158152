/*
 * `spmd train --init FILE` (and `spmd sample --init`): a GPT that starts
 * from GPT-2 weights (spmd/weights.h).  The file gives the model's shape;
 * a shape flag may only repeat it.
 */
#ifndef SPMD_TOOLS_WEIGHTS_H
#define SPMD_TOOLS_WEIGHTS_H

#include "spmd/models.h"
#include "spmd/spmd.h"

/* Take the GPT's shape from the file `init` for every field of `gpt` no
 * flag set (0), refusing flags that differ from the file; `model` and
 * `resume` are the run's flags (--init is for a GPT, and not with
 * --resume).  Called before the shape defaults.  0, or an exit code with
 * a message. */
int weights_init_config(const char *init, const char *model, const char *resume,
                        spmd_gpt_config *gpt);
/* Write the file's weights into the compiled training program p of a GPT
 * of shape `gpt` (every parameter, whole; the program shards them);
 * optimizer state stays zero.  0 without `init`; 0, or 1 with a message. */
int weights_init_apply(const char *init, const spmd_gpt_config *gpt, spmd_program *p);

#endif
