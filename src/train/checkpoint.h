/*
 * What saving and loading a checkpoint share (spmd/checkpoint.h): the
 * format's name and version, and the layout of a program's persistent
 * tensors over its devices: the distinct blocks of each tensor, the first
 * device in mesh order that holds each (the one that writes it, or reads
 * it on load) and which block every device holds.
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
    int tensor;       /* index in ckpt_layout.tensors */
    int dev_index;    /* the first device in mesh order that holds it */
    executor_block b; /* that device's copy */
} ckpt_block;

typedef struct ckpt_layout {
    const spmd_program *p;
    const spmd_allocator *alloc; /* the graph's */
    int n_dev;
    int n_tensors;
    const spmd_tensor **tensors; /* parameters and state the program keeps, graph order */
    int n_blocks, cap_blocks;
    ckpt_block *blocks; /* by tensor, then by first holder */
    int *held;          /* [tensor * n_dev + dev_index]: a block index, -1 for none */
} ckpt_layout;

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

/* The layout of runnable program p; `what` prefixes messages. */
spmd_status ckpt_layout_build(const spmd_program *p, ckpt_layout *out, const char *what);
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
