/*
 * Meshes and sharding marks: the named device mesh a program is
 * partitioned over, and PyTorch/XLA-style partition specs on tensors.
 */
#ifndef SPMD_MESH_PUBLIC_H
#define SPMD_MESH_PUBLIC_H

#include "spmd/spmd.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct spmd_mesh spmd_mesh;

/* A mesh of prod(shape) devices with the given axis names (unique,
 * [A-Za-z_][A-Za-z0-9_]*).  `device_ids` is a permutation of 0..N-1 giving
 * the device at each row-major coordinate, or NULL for 0..N-1. */
SPMD_API spmd_mesh *spmd_mesh_create(int rank, const int *shape, const char *const *axis_names,
                                     const int *device_ids);
/* From text: shape "4x2" (or "8"), axes "replica,fsdp". */
SPMD_API spmd_mesh *spmd_mesh_parse(const char *shape, const char *axes);
SPMD_API void spmd_mesh_free(spmd_mesh *m);

SPMD_API int spmd_mesh_devices(const spmd_mesh *m);
SPMD_API int spmd_mesh_rank(const spmd_mesh *m);
SPMD_API int spmd_mesh_axis_size(const spmd_mesh *m, int axis);
SPMD_API const char *spmd_mesh_axis_name(const spmd_mesh *m, int axis);
/* -1 (with a message naming the axis and the mesh's axes) if unknown. */
SPMD_API int spmd_mesh_axis_index(const spmd_mesh *m, const char *name);
/* Mark which axes keep their groups inside one process (all, by default). */
SPMD_API spmd_status spmd_mesh_set_axis_local(spmd_mesh *m, int axis, bool local);
SPMD_API bool spmd_mesh_axis_is_local(const spmd_mesh *m, int axis);
/* Declare an axis independent: the program runs once per group along it,
 * as separate models (copies) with their own parameters, optimizer state
 * and inputs, and nothing is split or summed over it, so no collective
 * crosses it.  A sharding mark that names it is refused.  Copies are
 * numbered by the devices' coordinates on the independent axes (row-major
 * over them); spmd_program_set_input_copy and friends address one. */
SPMD_API spmd_status spmd_mesh_set_axis_independent(spmd_mesh *m, int axis, bool independent);
/* Declare `axis` the pipeline's stage axis (docs/DESIGN.md, "Pipeline
 * stages"; -1: none): member s of it runs the nodes placed on stage s
 * (spmd_graph_set_stage), and values cross between stages only through
 * spmd_stage_transfer.  Nothing is split or summed over it: a sharding
 * mark that names it is refused, and the batch wrappers and ZeRO leave it
 * out.  At most one; declared before marking. */
SPMD_API spmd_status spmd_mesh_set_stage_axis(spmd_mesh *m, int axis);
/* The stage axis, -1 for none. */
SPMD_API int spmd_mesh_stage_axis(const spmd_mesh *m);
SPMD_API bool spmd_mesh_axis_is_independent(const spmd_mesh *m, int axis);
/* The product of the independent axes' sizes (1 without any). */
SPMD_API int spmd_mesh_copies(const spmd_mesh *m);
/* Lay the devices out over `processes` processes as a run over MPI does:
 * the device at mesh position r (row-major coordinates) lives in process
 * r / (devices / processes), so the minor axes stay inside a process.
 * Marks each axis local when every group along it stays inside one
 * process, remote otherwise (the cost model prices it as the network).
 * `processes` must divide the devices. */
SPMD_API spmd_status spmd_mesh_place_processes(spmd_mesh *m, int processes);
/* The processes of the last spmd_mesh_place_processes (1 by default). */
SPMD_API int spmd_mesh_processes(const spmd_mesh *m);
/* The network's alpha-beta figures, which price the axes that cross
 * processes (a measured latency per message and bandwidth); by default a
 * 10 Gb/s link with 25 us per message. */
SPMD_API spmd_status spmd_mesh_set_network(spmd_mesh *m, double latency_s, double bytes_per_s);
SPMD_API void spmd_mesh_network(const spmd_mesh *m, double *latency_s, double *bytes_per_s);
/* The devices of `device`'s group along the comma-separated `axes`, in
 * rank order; returns the group size or -1 with a message. */
SPMD_API int spmd_mesh_group(const spmd_mesh *m, int device, const char *axes, int *members,
                             int capacity);

/* ---- Sharding marks ------------------------------------------------------- */

/* Mark tensor t with a PyTorch/XLA partition spec over mesh m: one entry
 * per dimension, each an axis name, a parenthesised tuple of axes (major
 * to minor) or None, e.g. "(replica, fsdp), None".  Axes not named are
 * replicated; an axis is used at most once.  All marks of a graph use one
 * mesh, which must outlive the graph.  Errors name the token and its
 * column. */
SPMD_API spmd_status spmd_mark_sharding(spmd_graph *g, spmd_tensor *t, const spmd_mesh *m,
                                        const char *spec);
SPMD_API spmd_status spmd_clear_sharding(spmd_tensor *t);
/* The tensor's sharding as spec text: the propagated one once the graph
 * has been partitioned, else the mark; "" when it has neither. */
SPMD_API const char *spmd_get_sharding(const spmd_tensor *t, char *buf, size_t size);
/* The same sharding as GSPMD HloSharding text ("{devices=[4,1,2]0,1,...
 * last_tile_dim_replicate}", "{replicated}"). */
SPMD_API const char *spmd_get_hlo_sharding(const spmd_tensor *t, char *buf, size_t size);

/* Draw which devices hold which block of a 1-D or 2-D tensor of `dims`
 * sharded by `spec` (as JAX's visualize_tensor_sharding does).  Returns
 * the bytes written, or -1 with a message. */
SPMD_API int spmd_sharding_visualize(const spmd_mesh *m, const char *spec, int rank,
                                     const int64_t *dims, char *buf, size_t size);

/* ---- What a compiled multi-device program does ---------------------------- */

/* One collective the partitioner inserted. */
typedef struct spmd_collective_info {
    const char *kind;   /* "all-gather", "reduce-scatter", "all-reduce", "all-to-all" */
    char axes[64];      /* mesh axes, comma-separated: "replica,fsdp" */
    int64_t bytes;      /* per device: the larger of its input and output */
    double seconds;     /* estimated by the per-axis alpha-beta cost model */
    int count;          /* times per step: 1, or with gradient accumulation the
                         * micro-batches a step takes (forward and backward) */
    const char *phase;  /* "forward", "backward" or "update" */
    char tensor[96];    /* the value it moves (a pending sum: named by its source) */
    /* In flight (spmd_compile_options.overlap): the steps of the
     * device's schedule that run between its hand-over to the device's
     * communication thread and the wait for its result; 0: a blocking
     * step of the schedule. */
    int in_flight_steps;
    /* An all-gather of a parameter held once per process (one process,
     * shared memory): listed, but nothing is copied and it is no step of
     * the schedule.  Read in place: its readers read the parameter's
     * buffer; `written`: an update's gather whose members each write their
     * slice into the parameter in the update phase. */
    bool in_place, written;
} spmd_collective_info;

/* Collectives per step, in program order (0 on one device). */
SPMD_API int spmd_program_collective_count(const spmd_program *p);
SPMD_API spmd_status spmd_program_collective(const spmd_program *p, int i,
                                             spmd_collective_info *out);
/* Collectives in flight per step (0 without a mesh, or with
 * without spmd_compile_options.overlap); *bytes, when not NULL: the most bytes
 * of their operands and results in flight at once per device;
 * *arena_extra: how many more bytes each device's activation arena takes
 * than with every collective a blocking step (they stay alive from
 * hand-over to wait). */
SPMD_API int spmd_program_overlap(const spmd_program *p, size_t *bytes, size_t *arena_extra);
/* The bytes that may be in flight at once per device, which *bytes above
 * never exceeds (spmd_compile_options.inflight_bytes, or its default); 0
 * without overlap, or on a program with no collective that could fly. */
SPMD_API size_t spmd_program_inflight_budget(const spmd_program *p);
/* Bytes of the parameters one device holds (its blocks; on pipeline
 * stages, the stage holding the most). */
SPMD_API size_t spmd_program_param_bytes(const spmd_program *p);
/* Whole-tensor gathers forced by an op that cannot use a sharding. */
SPMD_API int spmd_program_fallback_count(const spmd_program *p);
SPMD_API spmd_status spmd_program_fallback(const spmd_program *p, int i, char *buf, size_t size);
/* Sharding propagation repeats its sweeps until no sharding changes, for
 * at most a fixed number of rounds (docs/DESIGN.md, "Priorities").  0 when
 * it settled (and for a program on one device); else the rounds it ran
 * before it stopped with shardings still changing.  Such a plan is valid
 * (what is still unknown is replicated), but tensors late in a long chain
 * of unmarked ones may stay replicated where more rounds would split
 * them: marking them settles it.  spmd explain and spmd train report it. */
SPMD_API int spmd_program_propagation_unsettled(const spmd_program *p);

/* What a caller knows of a program that the program does not: the parts
 * of spmd_program_explain's text that come from outside.  Zero (or a NULL
 * pointer to it) leaves each out or at its default. */
typedef struct spmd_explain_options {
    const char *model;          /* the first line's name of what is planned; NULL: "graph" */
    const char *batch;          /* appended to the first line ("batch 32"); NULL: nothing */
    const char *network_source; /* where the network's figures come from ("measured",
                                 * "given"); NULL: "set_network" */
    /* Each collective's measured median in microseconds (NaN: never
     * measured), in program order, and the steps measured: a column
     * beside the estimates (spmd explain --trace); NULL: none. */
    const double *measured_us;
    int first_step, last_step;
} spmd_explain_options;

/* The report `spmd explain` prints, for a compiled (or plan-only) program:
 * the mesh and which axes cross processes, every named tensor's shape and
 * sharding, every collective (phase, kind, axes, bytes per device, the
 * estimated time, the value it moves; in flight or not), memory per
 * device, the fallbacks and an unsettled propagation.  *text: the whole
 * text, lines ending in a newline, to free() (NULL on failure). */
SPMD_API spmd_status spmd_program_explain(const spmd_program *p, const spmd_explain_options *o,
                                          char **text);

#ifdef __cplusplus
}
#endif
#endif
