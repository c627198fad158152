/*
 * What saving and loading a checkpoint share (spmd/checkpoint.h): the
 * format's name and version, and the layout of a program's persistent
 * tensors over its devices: the distinct blocks of each tensor, which
 * device holds each (all of them; the first in mesh order reads it on
 * load), which of its holders writes it on save, and which block every
 * device holds.
 *
 * A block several devices hold (a replicated axis) is written by one of
 * them, chosen so that the devices write about equal shares: blocks go,
 * largest first, to whichever holder has the fewest bytes so far (ties:
 * the first in mesh order).  A pure function of the layout, so the same
 * program always writes the same files.
 */
#ifndef SPMD_TRAIN_CHECKPOINT_H
#define SPMD_TRAIN_CHECKPOINT_H

#include "runtime/executor.h"

#define CKPT_FORMAT "libspmd-checkpoint"
#define CKPT_VERSION 1
#define CKPT_INDEX "index.json"
#define CKPT_LATEST "latest"
/* The largest index.json a load reads. */
#define CKPT_MAX_INDEX ((size_t)256 << 20)

/* A block of a tensor that some device holds, with real elements. */
typedef struct ckpt_block {
    int tensor;              /* entry: index in ckpt_layout.tensors */
    int dev_index;           /* the first device in mesh order that holds it */
    executor_block b;        /* that device's copy */
    int writer;              /* the holder (mesh order) that writes it on save */
    int writer_device;       /* its device id: its file is dev-<id>.safetensors */
    const void *writer_data; /* its copy */
    uint64_t bytes;          /* real bytes (no padding) */
    uint64_t padded;         /* bytes of a device's copy, padding included */
} ckpt_block;

typedef struct ckpt_layout {
    const spmd_program *p;
    const spmd_allocator *alloc; /* the graph's */
    int n_dev;
    /* Entries: the parameters and state the program keeps, graph order,
     * a tensor once per box of its device blocks (grouped splits have a
     * box per group: executor_block_pieces). */
    int n_tensors;
    const spmd_tensor **tensors;
    int *piece, *pieces; /* each entry's box, and how many its tensor has */
    int n_blocks, cap_blocks;
    ckpt_block *blocks; /* by tensor, then by first holder */
    int *held;          /* [tensor * n_dev + dev_index]: a block index, -1 for none */
    int *by_size;       /* block indices, largest first (ties: in order) */
} ckpt_layout;

/* The saved "meta" of the checkpoint in `dir` (as spmd_checkpoint_load
 * finds it) as text the caller frees with free(), read before any tensor:
 * a caller can refuse settings that differ before the tensors' shapes
 * do. */
spmd_status ckpt_read_meta(const char *dir, char **meta_json);

/* A test's hook into spmd_checkpoint_load, called with the step
 * directory once everything is checked and just before the first byte is
 * written into the program: a test can change a file there, as an I/O
 * error or another process could, and see the load report a partly
 * loaded program.  NULL removes it.  Not for use outside tests. */
typedef void (*checkpoint_load_hook_fn)(void *ctx, const char *step_dir);
void checkpoint_set_load_hook(checkpoint_load_hook_fn fn, void *ctx);

/* ---- The checkpoint directory ---------------------------------------------------------- */

/* "step-00000042": the name of step 42's directory; buf holds 32 bytes. */
void ckpt_step_name(int64_t step, char *buf);
/* Whether `name` is a step directory's name ("step-" and digits), and its step. */
bool ckpt_parse_step_name(const char *name, int64_t *step);
/* The step directory DIR/latest names, into name[32]; an error when
 * DIR/latest is missing or holds anything but one step name. */
spmd_status ckpt_read_latest(const spmd_allocator *alloc, const char *dir, char *name,
                             const char *what);

/* ---- Blocks ----------------------------------------------------------------------------- */

/* The layout of runnable program p over the devices of copy `copy`
 * (independent mesh axes; -1: every device); `what` prefixes messages. */
spmd_status ckpt_layout_build(const spmd_program *p, int copy, ckpt_layout *out, const char *what);
void ckpt_layout_free(ckpt_layout *l);

/* Real elements of a block of `rank` dims of extent `shape`. */
int64_t ckpt_volume(int rank, const int64_t *shape);
/* "[4, 13]" */
const char *ckpt_shape_str(int rank, const int64_t *shape, char *buf, size_t size);

/* Visit a box of ext[] elements that sits at origin aorg[] in a row-major
 * array of dims adims[] and at borg[] in one of dims bdims[]: fn(ctx,
 * offset in a, offset in b, n) for each run of n elements contiguous in
 * both (offsets in elements; trailing dims the box fills in both merge
 * into one run).  Stops at the first failure fn returns. */
typedef spmd_status (*ckpt_run_fn)(void *ctx, int64_t a, int64_t b, int64_t n);
spmd_status ckpt_box_runs(int rank, const int64_t *ext, const int64_t *adims, const int64_t *aorg,
                          const int64_t *bdims, const int64_t *borg, ckpt_run_fn fn, void *ctx);

#endif
