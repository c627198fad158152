/*
 * The files a command writes, checked before it does any work: each a
 * regular file or a new path (replacing a FIFO, a device or a directory is
 * never meant), no two on one file, none on a file or inside a directory
 * the same command reads.
 */
#ifndef SPMD_TOOLS_OUTPUTS_H
#define SPMD_TOOLS_OUTPUTS_H

/* A flag and the path it names; a NULL path is skipped. */
typedef struct outputs_file {
    const char *flag, *path;
} outputs_file;

/* `path` (of `flag`) is a regular file or a path with no file yet; 0, or 2
 * with a message naming the file and what it is. */
int outputs_check_target(const char *flag, const char *path);

/* No two of the `n_out` outputs name one file and none names one of the
 * `n_in` inputs (an input that does not exist, as a data spec such as
 * "arith", is no file); 0, or 2 with a message naming both flags. */
int outputs_check_apart(const outputs_file *out, int n_out, const outputs_file *in, int n_in);

/* None of the outputs lies inside the checkpoint directory `in`: with
 * `whole`, nowhere in it (a checkpoint the command reads); else on none
 * of its own names (latest, .lock, step-*, copy-*: a log beside the
 * checkpoints is fine).  0, or 2 with a message naming both flags. */
#include <stdbool.h>
int outputs_check_outside(const outputs_file *out, int n_out, const outputs_file *in, bool whole);

/* `spmd train`'s outputs (--log, --json, --plot) against each other and
 * its inputs (--data, --val-data, --init); 0, or 2 with a message. */
struct cli_opts;
int outputs_check_train(const struct cli_opts *o);

#endif
