/*
 * CPU kernels, one per op (ops.def's kernel column).  Every kernel splits its
 * work by (ith, nth): thread ith of nth computes a disjoint part of the
 * output, each output element always by the same arithmetic in the same
 * order, so results do not depend on nth.  The executor runs all nth
 * threads on a node, then a barrier, then the next node.
 */
#ifndef SPMD_RUNTIME_KERNELS_H
#define SPMD_RUNTIME_KERNELS_H

#include "ir/ir.h"

#include <stdatomic.h>

struct coll_group;
struct coll_world;

/* What a device's kernels need to know about the device: its groups for
 * each mesh-axis list the program uses (indexed by attr.coll.spec), and its
 * rank in each, which is also the block of a dimension it holds. */
typedef struct kern_device {
    int device;
    struct coll_group *const *groups;
    const int *member;
    struct coll_world *world;
    const struct spmd_mesh *mesh;    /* for messages: a collective's axes */
    const struct mesh_axes *specs;   /* the collectives' axes, by attr.coll.spec */
    /* Pipeline stages: the device's stage, and per pair of stages (index
     * from * stages + to) the group of this device and its peer on the
     * other stage, the lower stage's member first; NULL without a stage
     * axis. */
    int stage, stages;
    struct coll_group *const *pairs;
} kern_device;

typedef struct kern_args {
    const spmd_tensor *node;            /* op, attributes, shapes */
    const void *in[IR_MAX_INPUTS];      /* contiguous row-major inputs */
    void *out;                          /* contiguous row-major output */
    void *scratch;                      /* this thread's scratch space */
    int ith, nth;
    /* A kernel that finds bad data (an id outside a table) stores a
     * status here (first one wins, via kern_fail) and skips the bad item;
     * the executor turns it into the step's error. */
    _Atomic int *status;
    char *message;          /* shared buffer for the winner's message */
    size_t message_size;
    const kern_device *dev; /* NULL on a one-device program */
    const struct fuse_group *fused; /* kern_fused's group (compile/fuse.h) */
    void *stored[4];                /* where its stored members go (FUSE_MAX_STORED) */
    /* What the run tells the kernels that draw random numbers (dropout):
     * the device's seed (its copy's), and the micro-batch's index in its
     * step (0 without gradient accumulation). */
    uint64_t seed;
    int micro;
} kern_args;

typedef void (*kern_fn)(const kern_args *a);

/* The kernel of `op`; NULL for leaves. */
kern_fn kern_for(ir_op op);
/* A fused group of elementwise nodes (a->fused), in one pass; its inputs
 * are the group's external inputs. */
void kern_fused(const kern_args *a);
/* A test hook: large groups' blocks of `elements` (FUSE_BLOCK or
 * FUSE_BLOCK_LARGE) from now on, or 0 to measure them again
 * (kernels_fused.c, tune_block). */
void kern_fused_set_block(int elements);

/* Record a data error from inside a kernel (message via base_error is
 * thread-local, so the kernel also writes the message once). */
void kern_fail(const kern_args *a, spmd_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* [begin, end) of n items for thread ith of nth, in blocks of `align`. */
void kern_split(int64_t n, int ith, int nth, int64_t align, int64_t *begin, int64_t *end);

#endif
