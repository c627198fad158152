/*
 * Collectives over a group of devices, behind one interface (a vtable) so
 * that the shared-memory transport for devices in one process and an MPI
 * transport for devices in other processes are two implementations.
 *
 * Every member of a group calls the same collective with the same sizes,
 * in the same order (the SPMD program guarantees it).  Sums are taken in
 * member-rank order, so results are the same bits on every run and on
 * every member.  A failing device aborts the world: every pending and
 * later collective returns SPMD_ERR_BACKEND instead of waiting forever.
 *
 * Layouts: all-gather and reduce-scatter work on a tensor viewed as
 * [outer, n * inner] whose member j owns the column block [outer, j*inner ..
 * (j+1)*inner), so gathering along any dimension needs no extra transpose:
 * outer = product of the dims before it, inner = the local size of that
 * dim times the product of the dims after it.
 */
#ifndef SPMD_RUNTIME_COLLECTIVES_H
#define SPMD_RUNTIME_COLLECTIVES_H

#include "spmd/spmd.h"

typedef struct coll_world coll_world;
typedef struct coll_group coll_group;

typedef enum coll_dtype { COLL_F32 = 0, COLL_I32 = 1 } coll_dtype;

typedef struct coll_ops {
    /* buf [count] summed over the group, in place. */
    spmd_status (*all_reduce)(coll_group *g, int member, float *buf, int64_t count);
    /* in [outer, inner] from every member -> out [outer, n * inner]. */
    spmd_status (*all_gather)(coll_group *g, int member, const void *in, void *out,
                              int64_t outer, int64_t inner_bytes);
    /* in [outer, n * inner] summed over members -> out [outer, inner], the
     * member's own column block. */
    spmd_status (*reduce_scatter)(coll_group *g, int member, const float *in, float *out,
                                  int64_t outer, int64_t inner);
    /* in: n blocks of `bytes`, block j for member j -> out: n blocks, block i
     * from member i. */
    spmd_status (*all_to_all)(coll_group *g, int member, const void *in, void *out,
                              int64_t bytes);
    /* buf of `bytes` copied from member `root` to every member. */
    spmd_status (*broadcast)(coll_group *g, int member, void *buf, int64_t bytes, int root);
    /* out of member i = in of member src[i] (src is the same on every member;
     * src[i] < 0 leaves out untouched). */
    spmd_status (*permute)(coll_group *g, int member, const void *in, void *out, int64_t bytes,
                           const int *src);
} coll_ops;

struct coll_group {
    const coll_ops *ops;
    int size;       /* members */
    void *impl;     /* transport state */
};

/* The shared-memory world: `n` devices of one process, one thread each. */
coll_world *coll_shm_world_create(int n, const spmd_allocator *alloc);
void coll_world_free(coll_world *w);
/* A group of `size` devices given by their world ranks, in member-rank
 * order.  Every member's thread asks for the same group with the same
 * list; the group is created once and shared (thread-safe). */
coll_group *coll_world_group(coll_world *w, int size, const int *world_ranks);
/* Make every waiting and later collective fail with `message`. */
void coll_world_abort(coll_world *w, const char *message);
bool coll_world_aborted(const coll_world *w);
/* Clear an abort so the world can be used again (all devices idle). */
void coll_world_reset(coll_world *w);

#endif
