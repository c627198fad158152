/*
 * Where a path lies, as the checks on what a save or a command would write
 * need it: the path resolved through every symbolic link, a dangling one
 * included (its target is the file a write would make), and whether it
 * falls in a checkpoint: on one of a checkpoint directory's own names
 * (latest, the writers' lock, step-* and the temporaries of a save,
 * copy-*) or anywhere in a step directory.  Shared by
 * spmd_checkpoint_save (so a library user's save is held to it) and the
 * spmd tool's check of a command's paths (tools/paths.c).
 */
#ifndef SPMD_TRAIN_CHECKPOINT_PATHS_H
#define SPMD_TRAIN_CHECKPOINT_PATHS_H

#include <stdbool.h>

#include "spmd/spmd.h"

/* `path` as an absolute path with no ".", ".." or symbolic link in it,
 * into out[CKPT_PATH_MAX] (train/checkpoint_fs.h): every link followed,
 * dangling ones too; the part that does not exist yet taken as written.
 * An error (prefixed `what`) for an empty path, a loop of links, a path
 * too long, or a directory that cannot be read. */
spmd_status ckpt_resolve(const char *path, char *out, const char *what);

/* Whether `name`, an entry of a checkpoint directory, is one of the
 * checkpoint's own: latest, .lock, step-*, .tmp-step-*, .del-step-*, and
 * copy-* (a copy's checkpoint directory) unless `copies_apart`. */
bool ckpt_own_name(const char *name, bool copies_apart);

/* Whether the resolved path `path` falls in a checkpoint: in a step
 * directory (step-* or .tmp-step-* holding index.json, or any step-* of a
 * checkpoint directory), or on one of a checkpoint directory's own names
 * (ckpt_own_name).  A checkpoint directory is one of the `n_known`
 * resolved `known` ones (which need not exist yet), or a directory
 * holding `latest`, the writers' lock, or a step directory.  The path
 * equal to a known one falls in it too.  When it falls in one, that
 * directory goes to ckpt[CKPT_PATH_MAX] (may be NULL). */
bool ckpt_path_in_checkpoint(const char *path, const char *const *known, int n_known,
                             bool copies_apart, char *ckpt);

/* A directory a checkpoint may be saved into: not a file or anything
 * else that is not a directory, and not in another checkpoint (a copy's
 * directory, DIR/copy-C, is its own checkpoint).  SPMD_OK, or an error
 * prefixed `what` naming the path and why. */
spmd_status ckpt_check_save_dir(const char *dir, const char *what);

#endif
