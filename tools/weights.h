/*
 * `spmd train --init FILE` (and `spmd sample --init`): a GPT that starts
 * from GPT-2 weights (spmd/weights.h).  The file gives the model's shape;
 * a shape flag may only repeat it.
 */
#ifndef SPMD_TOOLS_WEIGHTS_H
#define SPMD_TOOLS_WEIGHTS_H

#include "spmd/models.h"
#include "spmd/spmd.h"

#include <stdbool.h>

/* Which fields of the GPT's shape the command line gave. */
typedef struct weights_shape_given {
    bool vocab, seq, context, layers, heads, dim;
} weights_shape_given;

/* Take the GPT's shape from the file `init` for every field of `gpt` not
 * `given` (those hold the flags' defaults; --seq's is cut to the file's
 * context), refusing given ones that differ from the file; `model` and
 * `resume` are the run's flags (--init is for a GPT, and not with
 * --resume).  0, or an exit code with a message. */
int weights_init_config(const char *init, const char *model, const char *resume,
                        const weights_shape_given *given, spmd_gpt_config *gpt);
/* Write the file's weights into the compiled training program p of a GPT
 * of shape `gpt` (every parameter, whole; the program shards them);
 * optimizer state stays zero.  0 without `init`; 0, or 1 with a message. */
int weights_init_apply(const char *init, const spmd_gpt_config *gpt, spmd_program *p);

#endif
