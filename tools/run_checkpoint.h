/*
 * Saving and resuming a `spmd train` run (run_checkpoint.c): the library
 * writes and reads the sharded tensors; the tool adds the run's settings
 * as the checkpoint's meta, and checks them on resume.
 */
#ifndef SPMD_TOOLS_RUN_CHECKPOINT_H
#define SPMD_TOOLS_RUN_CHECKPOINT_H

#include "model.h"

#include <stdint.h>

struct cJSON;

/* The run's settings (model, optimizer, data), as saved in checkpoints
 * and reported. */
struct cJSON *run_checkpoint_settings(const cli_opts *o, const cli_model *m);
/* Before the run: --save DIR made (with its parents) and written to, and
 * its lock taken for the rest of the process, so a second run saving
 * there is refused naming this one; then the temporaries a killed save
 * left there are removed.  Process 0 does it for the run.  0, or 1 with a
 * message. */
int run_checkpoint_prepare(const cli_opts *o);

/* Once p is compiled, before the first step: a checkpoint of p (every
 * copy's) fits in what --save's file system has free; 0, or 1 with a
 * message giving both figures.  Process 0 checks for the run. */
int run_checkpoint_check_room(const cli_opts *o, const cli_model *m, const spmd_program *p);

/* Save program p at `step` to --save (with copies, DIR/copy-C each), with
 * the data position `samples`; 0, or 1 with a message. */
int run_checkpoint_save(const cli_opts *o, const cli_model *m, const spmd_program *p, int step,
                        int64_t samples);
/* Load --resume's latest checkpoint into p: the step it reached and its
 * data position; 0, or an exit code with a message. */
int run_checkpoint_resume(const cli_opts *o, const cli_model *m, spmd_program *p, int *step,
                          int64_t *samples);

#endif
