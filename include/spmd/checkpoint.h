/*
 * Sharded checkpoints: every parameter and state tensor of a program,
 * saved as the blocks its devices hold and loaded onto any mesh.
 *
 * A checkpoint is a directory DIR/step-NNNNNNNN/ with one safetensors
 * file per writing device (dev-NNNN.safetensors, NNNN its device id),
 * holding the real (unpadded) part of the blocks that device writes, and
 * index.json, which names every tensor's global shape, dtype, sharding
 * and blocks (file, start, shape) and every file's size and crc32.  Each
 * distinct block is written once: a block several devices hold (a
 * replicated axis) by one of them, chosen so that every device writes
 * about the same number of bytes.  Each file opens with any safetensors
 * reader.  DIR/latest is a one-line text file naming the newest complete
 * step.
 *
 * Saving is atomic: the files go (several at a time) to a temporary
 * directory; each is fsynced, then the directory, which is renamed into
 * place, and only then is `latest` replaced (by rename), so a crash at any
 * moment leaves the previous checkpoint whole and `latest` naming a
 * complete one.
 *
 * Loading reshards: each distinct block of the program is read once, just
 * the bytes of the saved blocks that overlap it, whatever mesh and
 * sharding wrote them, into the first device in mesh order that holds it,
 * and copied from there to the other devices that hold it.
 */
#ifndef SPMD_CHECKPOINT_H
#define SPMD_CHECKPOINT_H

#include "spmd/spmd.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Save every parameter and state tensor of runnable program p as
 * DIR/step-NNNNNNNN (DIR is created if missing; a step directory of the
 * same number is replaced atomically) and point DIR/latest at it.  The
 * save holds DIR's writers' lock (DIR/.lock, the one `spmd train --save`
 * holds through its run): a DIR another process is saving into is
 * refused, naming that process; so is a DIR that is not a directory or
 * lies in another checkpoint (its latest, a step directory).
 * `meta_json` is the caller's JSON object (the data position, the
 * configuration), kept in index.json as "meta"; NULL stores {}.  Once the
 * new checkpoint is complete, the oldest step directories of lower steps
 * are deleted so that `keep` remain, the new one included (keep 0 keeps
 * all; higher steps than the new one are left alone).  On failure
 * nothing in DIR changes but a leftover temporary directory may, after a
 * crash, remain (.tmp-step-*: never read). */
SPMD_API spmd_status spmd_checkpoint_save(const spmd_program *p, const char *dir, int64_t step,
                                          const char *meta_json, int keep);

/* Load the checkpoint DIR/latest names (or DIR itself, when it holds
 * index.json) into p, whose mesh and sharding may differ from the
 * writer's.  Checked before anything is written into p: the index's
 * format and version, every file's size and crc32 (every byte is read),
 * each file's safetensors header, and for every parameter and state
 * tensor of p a tensor of the same name, global shape and dtype whose
 * blocks cover it exactly (tensors p does not have are ignored); every
 * allocation is made then too.  A failure of any of these, out of memory
 * included, leaves p with the values it had; the message names the file
 * and the cause.  Then the blocks are read again, straight into p's
 * devices (no staging copy): a read that fails after the checks passed
 * (an I/O error, or a file cut short since it was checked) leaves p
 * partly loaded, and its message ends "the program is partly loaded";
 * load again before using p.  (A file rewritten in place between the
 * check and the read is not noticed.)
 * `step` (may be NULL) receives the saved step; `meta_json` (may be NULL)
 * a malloc'd copy of the saved "meta" object, which the caller frees with
 * free(); on failure *step is left alone and *meta_json is NULL. */
SPMD_API spmd_status spmd_checkpoint_load(spmd_program *p, const char *dir, int64_t *step,
                                          char **meta_json);

/* With independent mesh axes (copies, spmd/mesh.h): save copy `copy`'s
 * parameters and state alone (spmd_checkpoint_save saves copy 0's), and
 * load a checkpoint into copy `copy` alone (spmd_checkpoint_load loads it
 * into every copy).  The files are those of a program of the copy's
 * group: a copy's checkpoint loads into a program without copies, and
 * back. */
SPMD_API spmd_status spmd_checkpoint_save_copy(const spmd_program *p, int copy, const char *dir,
                                               int64_t step, const char *meta_json, int keep);
SPMD_API spmd_status spmd_checkpoint_load_copy(spmd_program *p, int copy, const char *dir,
                                               int64_t *step, char **meta_json);

#ifdef __cplusplus
}
#endif
#endif
