/*
 * Internal access to the compiled program behind a runnable one, for tests
 * (the public reports of spmd/mesh.h read the same object), and to each
 * device's blocks of the persistent tensors, for checkpoints.
 */
#ifndef SPMD_RUNTIME_EXECUTOR_H
#define SPMD_RUNTIME_EXECUTOR_H

#include "compile/compiled.h"

const compiled *executor_compiled(const spmd_program *p);
/* The partition behind a multi-device program; NULL on one device. */
const partition *executor_partition(const spmd_program *p);

/* One device's block of a parameter or state tensor, as checkpoints write
 * and read it: the block starts at global index start[], holds ldims[]
 * elements per dim (row-major at `data`, padded), of which valid[] are
 * real; the padding is zero and must stay zero. */
typedef struct executor_block {
    int device; /* its id in the mesh (0 on one device) */
    int copy;   /* its copy (independent mesh axes), 0 without */
    int rank;
    int64_t start[SPMD_MAX_RANK], ldims[SPMD_MAX_RANK], valid[SPMD_MAX_RANK];
    void *data;
    /* A device off the tensor's home pipeline stage: its copy is never
     * updated, so checkpoints neither write nor load it. */
    bool off_stage;
} executor_block;

/* Bytes the device dev[local] of this process allocated for itself:
 * its blocks of inputs, parameters, state and update values, its arena
 * and scratch (a shared buffer is no one device's); 0 out of range. */
size_t executor_device_allocated(const spmd_program *p, int local);

/* A NULL or plan-only program is an error: "<what>: ...". */
spmd_status executor_check_runnable(const spmd_program *p, const char *what);
/* Whether t is a parameter or state that runnable program p holds a block
 * of on every device (a partitioned program drops leaves nothing reads). */
bool executor_keeps(const spmd_program *p, const spmd_tensor *t);
/* How many boxes each device's block of kept tensor t is: 1, or the
 * groups of a grouped split of its first dim (one box per group); a
 * grouped split of another dim is refused. */
spmd_status executor_block_pieces(const spmd_program *p, const spmd_tensor *t, int *pieces);
/* Box `piece` of the block of kept tensor t on the device at row-major
 * mesh position dev_index (0 .. spmd_program_devices(p) - 1: mesh order);
 * for a device of another process (a run over MPI) its place, with data
 * NULL. */
spmd_status executor_block_of(const spmd_program *p, const spmd_tensor *t, int dev_index,
                              int piece, executor_block *out);
/* Every process's `bytes_each` bytes at `in`, in process order, into
 * `out` on every process (collective over the program's processes; a
 * copy with one). */
spmd_status executor_gather_processes(const spmd_program *p, const void *in, void *out,
                                      int64_t bytes_each);

#endif
