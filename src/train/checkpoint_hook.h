/*
 * A test's hook into spmd_checkpoint_save: called after each durable step
 * of a save, so a test can stop the save there (return false: the save
 * fails as an I/O error would) or kill the process, and check what a crash
 * at that moment leaves.  `stage` names what was just completed: each
 * "dev-NNNN.safetensors" and "index.json" (in the temporary directory),
 * then "step-NNNNNNNN" (renamed into place), then "latest" (replaced;
 * older checkpoints not yet deleted).  Not for use outside tests.
 */
#ifndef SPMD_TRAIN_CHECKPOINT_HOOK_H
#define SPMD_TRAIN_CHECKPOINT_HOOK_H

#include <stdbool.h>

typedef bool (*checkpoint_hook_fn)(void *ctx, const char *stage);

/* NULL removes the hook. */
void checkpoint_set_hook(checkpoint_hook_fn fn, void *ctx);

#endif
