/*
 * Collectives over a group of devices, behind one interface (a vtable) so
 * that the shared-memory transport for devices in one process and an MPI
 * transport for devices in other processes are two implementations.
 *
 * Every member of a group calls the same collective with the same sizes,
 * in the same order (the SPMD program guarantees it).  Sums follow one
 * canonical order per group, a fixed pairwise tree over member ranks
 * (collectives_impl.h), on every transport, so results are the same bits
 * on every run, on every member, and whether the members are threads of
 * one process or spread over processes.  A failing device aborts the
 * world: every pending and later collective returns SPMD_ERR_BACKEND
 * instead of waiting forever.
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

/* The element type of a reduction (bf16: a gradient reduced in bf16,
 * spmd_graph_set_reduce_precision).  Every member's values are widened to
 * f32, summed in f32 in the canonical order, and the sum is stored in the
 * type, rounded to nearest even: the same bits on every transport.  A new
 * type (f16, say) is a size and two conversions (collectives_impl.h,
 * collectives_tree.c), not new entries in coll_ops. */
typedef enum coll_dtype { COLL_F32 = 0, COLL_BF16 = 1 } coll_dtype;

typedef struct coll_ops {
    /* buf [count] of `type` summed over the group, in place. */
    spmd_status (*all_reduce)(coll_group *g, int member, void *buf, int64_t count,
                              coll_dtype type);
    /* in [outer, inner] from every member -> out [outer, n * inner]. */
    spmd_status (*all_gather)(coll_group *g, int member, const void *in, void *out,
                              int64_t outer, int64_t inner_bytes);
    /* in [outer, n * inner] of `type` summed over members -> out [outer,
     * inner], the member's own column block. */
    spmd_status (*reduce_scatter)(coll_group *g, int member, const void *in, void *out,
                                  int64_t outer, int64_t inner, coll_dtype type);
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

#ifdef SPMD_HAVE_MPI
#include <mpi.h>
/* The MPI world (collectives_mpi*.c): the P processes of `comm`, each
 * running `local_devices` device threads, P * local_devices devices in all.
 * World rank r lives in process r / local_devices (process-major, so the
 * minor mesh axes stay inside a process); this process holds ranks
 * [rank * local_devices, (rank + 1) * local_devices).  Collective over
 * `comm`: one thread of every process calls it.  MPI must be initialised
 * with MPI_THREAD_MULTIPLE (device threads call MPI at the same time);
 * anything less is refused.  The world duplicates `comm`; free it with
 * coll_world_free (one thread of every process) before MPI_Finalize. */
coll_world *coll_mpi_world_create(MPI_Comm comm, int local_devices, const spmd_allocator *alloc);
#endif

/* The world of a program's `devices` devices: all of them in this process
 * when `mpi_comm` is NULL (shared memory), else spread over the processes
 * of the MPI_Comm that `mpi_comm` points at, devices / P in each (P must
 * divide `devices`; refused, naming both, otherwise, and refused in a
 * build without MPI). */
coll_world *coll_world_create(int devices, const void *mpi_comm, const spmd_allocator *alloc);

/* Collective over the world's processes (one thread of each) in an MPI
 * world; frees nothing else. */
void coll_world_free(coll_world *w);
/* A group of `size` devices given by their world ranks, in member-rank
 * order.  Every member's thread asks for the same group with the same
 * list; the group is created once and shared (thread-safe).  In an MPI
 * world a group must have a member in this process, and a group that
 * crosses processes can carry collectives only after coll_world_connect. */
coll_group *coll_world_group(coll_world *w, int size, const int *world_ranks);
/* The rank entries the shared-memory world's group requests looked at
 * so far (their checks and lookups): the tests count that setting up a
 * world is linear in the ranks its devices ask for. */
uint64_t coll_world_rank_visits(const coll_world *w);
/* Make the communicators of the groups asked for since the last connect:
 * one thread of every process of an MPI world calls it, the same number of
 * times, after every process asked for all its groups (each process asks
 * for every group that has a member in it) and before any collective on
 * them.  Fails alike on every process if processes disagree about a group.
 * Nothing to do (SPMD_OK) in a shared-memory world. */
spmd_status coll_world_connect(coll_world *w);
/* This process's devices: world ranks [first, first + count) of `size`. */
void coll_world_local(const coll_world *w, int *first, int *count, int *size);
/* Every process's `in` (bytes_of[q] bytes from process q), concatenated in
 * process order into `out` on every process: one thread of each process
 * calls it, as for connect.  A plain copy in a shared-memory world. */
spmd_status coll_world_gather_processes(coll_world *w, const void *in, void *out,
                                        const int64_t *bytes_of);
/* The watchdog (spmd_compile_options.collective_timeout_s): a member
 * that waits `seconds` in a collective without progress fails it with
 * SPMD_ERR_TIMEOUT, "collective timeout: OP: ...", naming whom it waited
 * for, and aborts the world with that message.  0: the default
 * (SPMD_COLLECTIVE_TIMEOUT_S), negative: never.  Set before any
 * collective runs; a world starts with the default. */
void coll_world_set_timeout(coll_world *w, double seconds);
/* A test hook for a slow transport: from now on every member's call of
 * every collective, in every world, sleeps `us` microseconds before it
 * meets its peers (0, the default: not at all). */
void coll_set_delay_us(int64_t us);

/* Make every waiting and later collective fail with `message`.  It does
 * not reach other processes: the caller ends the job (MPI_Abort) so that
 * their collectives do not wait for this one. */
void coll_world_abort(coll_world *w, const char *message);
bool coll_world_aborted(const coll_world *w);
/* Clear an abort so the world can be used again (all devices idle).  In an
 * MPI world the groups that cross processes stay failed: their peers'
 * state is unknown after an abort. */
void coll_world_reset(coll_world *w);

#endif
