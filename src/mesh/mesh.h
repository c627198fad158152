/*
 * Device meshes (docs/DESIGN.md, "Mesh"): N devices, a permutation of device
 * ids, a logical shape and one name per axis.  The device at mesh
 * coordinate c is ids[row-major(c)].  A group of device p along an ordered
 * list of axes is every device sharing p's coordinates off those axes,
 * ranked by its coordinates on them (first axis major).
 */
#ifndef SPMD_MESH_MESH_H
#define SPMD_MESH_MESH_H

#include "spmd/mesh.h"

#define MESH_MAX_AXES 8
#define MESH_MAX_DEVICES 4096
#define MESH_MAX_NAME 32

/* Link figures: a latency per message and a bandwidth. */
typedef struct cost_link {
    double alpha_s;       /* seconds per message */
    double bytes_per_s;   /* bandwidth */
} cost_link;

/* The network figures a mesh starts with. */
extern const cost_link MESH_DEFAULT_NETWORK;

struct spmd_mesh {
    int rank;                                   /* number of axes */
    int shape[MESH_MAX_AXES];
    char names[MESH_MAX_AXES][MESH_MAX_NAME];
    bool local[MESH_MAX_AXES];                  /* groups stay inside one process */
    bool independent[MESH_MAX_AXES];            /* spmd_mesh_set_axis_independent: copies */
    bool stage[MESH_MAX_AXES];                  /* spmd_mesh_set_stage_axis: at most one */
    int processes;                              /* spmd_mesh_place_processes; 1 by default */
    cost_link network;                          /* spmd_mesh_set_network */
    int n_devices;
    int *ids;                                   /* ids[row-major coord] = device id */
    int *position;                              /* position[device id] = row-major coord */
};

/* An ordered list of mesh axes (major to minor).  As a tensor dim's split
 * it may be grouped (docs/DESIGN.md, "Grouped splits"): groups > 1 views
 * the dim as [groups, size / groups] and splits the second over the axes,
 * so each device holds a block of every group (GPT-2's fused q | k | v
 * split by heads).  0 and 1 both mean one group; collectives ignore it. */
typedef struct mesh_axes {
    int8_t n;
    int8_t axis[MESH_MAX_AXES];
    int16_t groups; /* small: a sharding holds one per dim, and every node several */
} mesh_axes;

/* The groups of a dim's split: 1 for a plain split. */
static inline int64_t mesh_axes_groups(const mesh_axes *a) { return a->groups > 1 ? a->groups : 1; }

/* spmd_mesh_create with the length of `ids` checked against the mesh
 * ("mesh 4x2 has 8 devices, got 6 ids"), for callers that read ids from
 * text.  ids NULL means 0..N-1; n_ids < 0 trusts ids to hold N entries. */
spmd_mesh *mesh_create(int rank, const int *shape, const char *const *names, const int *ids,
                       int n_ids);
/* "4x2 (replica, fsdp)", plus " devices 7,6,..." when ids are permuted:
 * what error messages call the mesh. */
const char *mesh_describe(const spmd_mesh *m, char *buf, size_t size);
/* Same shape, axis names and device ids (process-locality is not
 * compared: it prices collectives, it does not move data). */
bool mesh_equal(const spmd_mesh *a, const spmd_mesh *b);
/* The copy (0 .. spmd_mesh_copies - 1) the device at mesh position `pos`
 * belongs to: its row-major index over the independent axes. */
int mesh_copy_of(const spmd_mesh *m, int pos);
/* The stage axis (spmd_mesh_set_stage_axis), -1 for none. */
int mesh_stage_axis(const spmd_mesh *m);
/* The device's coordinate on the stage axis: its stage; -1 without one. */
int mesh_stage_of(const spmd_mesh *m, int device);
/* Whether the batch and ZeRO's splits leave axis a out: an independent
 * axis (each copy has its own) or the stage axis (every stage sees the
 * same micro-batches). */
bool mesh_axis_holds_no_split(const spmd_mesh *m, int a);
/* Whether groups along `axis` cross processes when each process holds an
 * aligned run of `per_process` mesh positions (process-major layout). */
bool mesh_axis_crosses(const spmd_mesh *m, int axis, int per_process);
/* Index of the axis called name[0..len), -1 if none (no message). */
int mesh_find_axis(const spmd_mesh *m, const char *name, size_t len);

/* Bit a set for each axis a of `axes`. */
uint32_t mesh_axes_mask(const mesh_axes *axes);
/* The axes whose bits are set in `mask`, in mesh order. */
mesh_axes mesh_axes_from_mask(const spmd_mesh *m, uint32_t mask);
/* Set coords on `axes` to group rank `index` (the inverse of
 * mesh_group_rank); coordinates on other axes are left alone. */
void mesh_set_coords(const spmd_mesh *m, const mesh_axes *axes, int index, int *coords);
/* The device id at mesh coordinates `coords`. */
int mesh_device_at(const spmd_mesh *m, const int *coords);

/* Coordinates of `device` (its id) on every axis. */
void mesh_coords(const spmd_mesh *m, int device, int *coords);
/* Product of the sizes of `axes`. */
int mesh_axes_size(const spmd_mesh *m, const mesh_axes *axes);
/* Rank of `device` within its group along `axes` (mixed radix, first axis
 * major). */
int mesh_group_rank(const spmd_mesh *m, int device, const mesh_axes *axes);
/* Device ids of the group of `device` along `axes`, in rank order; returns
 * the group size.  `members` must hold mesh_axes_size entries. */
int mesh_group(const spmd_mesh *m, int device, const mesh_axes *axes, int *members);
/* Index of the group itself among all groups along `axes` (0..N/size-1),
 * ranked by the coordinates off `axes`. */
int mesh_group_index(const spmd_mesh *m, int device, const mesh_axes *axes);

/* Text appended to a fixed buffer, snprintf style: what does not fit is
 * dropped (the buffer stays terminated) and `len` counts every byte that
 * was asked for. */
typedef struct mesh_text {
    char *buf;
    size_t size, len;
} mesh_text;

void mesh_text_init(mesh_text *t, char *buf, size_t size);
void mesh_text_add(mesh_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* "replica, fsdp" */
void mesh_text_axes(mesh_text *t, const spmd_mesh *m, const mesh_axes *axes);
/* Bytes actually in the buffer (len, capped by the size). */
size_t mesh_text_written(const mesh_text *t);

/* `text` as an error message quotes it: whole when it fits in `size`
 * bytes, else the stretch around byte offset `at` with "..." where it is
 * cut, so that a long spec cannot crowd the reason and the column out of
 * the message.  Returns buf; MESH_EXCERPT_SIZE is a good size. */
enum { MESH_EXCERPT_SIZE = 72 };
const char *mesh_text_excerpt(const char *text, size_t at, char *buf, size_t size);

#endif
