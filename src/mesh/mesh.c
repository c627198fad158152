/*
 * Device meshes: creation with validation, the text forms ("4x2",
 * "replica,fsdp"), coordinates and groups along mesh axes.
 *
 * A mesh is allocated with the default allocator, not a graph's: one mesh
 * is shared by the graphs and programs partitioned over it and outlives
 * them.  The struct, the ids and their inverse are one allocation.
 */
#include "mesh/mesh.h"
#include "base/arena.h"
#include "base/error.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- Text building --------------------------------------------------------- */

void mesh_text_init(mesh_text *t, char *buf, size_t size)
{
    t->buf = buf;
    t->size = buf ? size : 0;
    t->len = 0;
    if (t->size) buf[0] = '\0';
}

void mesh_text_add(mesh_text *t, const char *fmt, ...)
{
    if (!t->size) return;
    size_t at = mesh_text_written(t);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->buf + at, t->size - at, fmt, ap);
    va_end(ap);
    if (n > 0) t->len += (size_t)n;
}

const char *mesh_text_excerpt(const char *text, size_t at, char *buf, size_t size)
{
    size_t len = strlen(text);
    if (len < size) return memcpy(buf, text, len + 1);
    size_t keep = size - 7; /* room for "..." at both ends and the NUL */
    size_t start = at > keep / 2 ? at - keep / 2 : 0;
    if (start + keep > len) start = len - keep;
    snprintf(buf, size, "%s%.*s%s", start ? "..." : "", (int)keep, text + start,
             start + keep < len ? "..." : "");
    return buf;
}

size_t mesh_text_written(const mesh_text *t)
{
    if (!t->size) return 0;
    return t->len < t->size ? t->len : t->size - 1;
}

void mesh_text_axes(mesh_text *t, const spmd_mesh *m, const mesh_axes *axes)
{
    for (int i = 0; i < axes->n; i++)
        mesh_text_add(t, "%s%s", i ? ", " : "", m->names[axes->axis[i]]);
}

/* "4x2" */
static const char *shape_str(int rank, const int *shape, char *buf, size_t size)
{
    mesh_text t;
    mesh_text_init(&t, buf, size);
    for (int a = 0; a < rank; a++) mesh_text_add(&t, a ? "x%d" : "%d", shape[a]);
    return buf;
}

static bool ids_are_identity(const spmd_mesh *m)
{
    for (int i = 0; i < m->n_devices; i++)
        if (m->ids[i] != i) return false;
    return true;
}

const char *mesh_describe(const spmd_mesh *m, char *buf, size_t size)
{
    mesh_text t;
    char shape[96];
    mesh_text_init(&t, buf, size);
    mesh_text_add(&t, "%s", shape_str(m->rank, m->shape, shape, sizeof shape));
    mesh_axes all = mesh_axes_from_mask(m, ~0u);
    mesh_text_add(&t, " (");
    mesh_text_axes(&t, m, &all);
    mesh_text_add(&t, ")");
    if (!ids_are_identity(m)) {
        mesh_text_add(&t, " devices ");
        for (int i = 0; i < m->n_devices; i++) mesh_text_add(&t, i ? ",%d" : "%d", m->ids[i]);
    }
    return t.size ? buf : "";
}

bool mesh_equal(const spmd_mesh *a, const spmd_mesh *b)
{
    if (a == b) return true;
    if (!a || !b || a->rank != b->rank) return false;
    for (int i = 0; i < a->rank; i++)
        if (a->shape[i] != b->shape[i] || strcmp(a->names[i], b->names[i]) != 0) return false;
    return memcmp(a->ids, b->ids, (size_t)a->n_devices * sizeof *a->ids) == 0;
}

/* ---- Creation ------------------------------------------------------------------ */

/* [A-Za-z_][A-Za-z0-9_]*, and not None, which means "no axis" in specs. */
static spmd_status check_name(int axis, const char *name)
{
    if (!name) return base_error(SPMD_ERR_INVALID, "mesh axis %d has no name (NULL)", axis);
    if (strlen(name) >= MESH_MAX_NAME)
        return base_error(SPMD_ERR_INVALID,
                          "mesh axis name '%s' is too long (at most %d characters)", name,
                          MESH_MAX_NAME - 1);
    bool ok = isalpha((unsigned char)name[0]) || name[0] == '_';
    for (const char *p = name; ok && *p; p++) ok = isalnum((unsigned char)*p) || *p == '_';
    if (!ok)
        return base_error(SPMD_ERR_INVALID,
                          "mesh axis name '%s' is not an identifier ([A-Za-z_][A-Za-z0-9_]*)",
                          name);
    if (strcmp(name, "None") == 0)
        return base_error(SPMD_ERR_INVALID,
                          "mesh axis name 'None' is reserved: it means no axis in a "
                          "partition spec");
    return SPMD_OK;
}

static spmd_status check_axes(int rank, const int *shape, const char *const *names, int *n_devices)
{
    if (rank < 1 || rank > MESH_MAX_AXES)
        return base_error(SPMD_ERR_INVALID, "a mesh has 1 to %d axes, got %d", MESH_MAX_AXES, rank);
    if (!shape || !names) return base_error(SPMD_ERR_INVALID, "mesh shape or axis names is NULL");
    for (int a = 0; a < rank; a++) {
        spmd_status st = check_name(a, names[a]);
        if (st) return st;
        for (int b = 0; b < a; b++)
            if (strcmp(names[a], names[b]) == 0)
                return base_error(SPMD_ERR_INVALID,
                                  "mesh axis name '%s' is used twice (axes %d and %d)", names[a],
                                  b, a);
    }
    char text[96];
    shape_str(rank, shape, text, sizeof text);
    double devices = 1; /* cannot overflow, and is exact far past the limit */
    for (int a = 0; a < rank; a++) {
        if (shape[a] < 1)
            return base_error(SPMD_ERR_INVALID,
                              "mesh %s: axis '%s' has size %d; sizes must be at least 1", text,
                              names[a], shape[a]);
        devices *= shape[a];
    }
    if (devices > MESH_MAX_DEVICES)
        return base_error(SPMD_ERR_INVALID,
                          "mesh %s has %.0f devices, more than %d devices, the most a mesh "
                          "can have",
                          text, devices, MESH_MAX_DEVICES);
    *n_devices = (int)devices;
    return SPMD_OK;
}

/* Fill m->ids and m->position from `ids`, which must be a permutation. */
static spmd_status set_ids(spmd_mesh *m, const int *ids, int n_ids)
{
    char text[96];
    shape_str(m->rank, m->shape, text, sizeof text);
    if (ids && n_ids >= 0 && n_ids != m->n_devices)
        return base_error(SPMD_ERR_INVALID, "mesh %s has %d devices, got %d ids", text,
                          m->n_devices, n_ids);
    for (int i = 0; i < m->n_devices; i++) m->position[i] = -1;
    for (int i = 0; i < m->n_devices; i++) {
        int id = ids ? ids[i] : i;
        if (id < 0 || id >= m->n_devices)
            return base_error(SPMD_ERR_INVALID,
                              "mesh %s: device id %d at position %d is outside 0..%d", text, id, i,
                              m->n_devices - 1);
        if (m->position[id] >= 0)
            return base_error(SPMD_ERR_INVALID,
                              "mesh %s: device id %d appears twice (positions %d and %d); ids must "
                              "be a permutation of 0..%d",
                              text, id, m->position[id], i, m->n_devices - 1);
        m->ids[i] = id;
        m->position[id] = i;
    }
    return SPMD_OK;
}

spmd_mesh *mesh_create(int rank, const int *shape, const char *const *names, const int *ids,
                       int n_ids)
{
    int n = 0;
    if (check_axes(rank, shape, names, &n)) return NULL;
    size_t bytes = sizeof(spmd_mesh) + 2 * (size_t)n * sizeof(int);
    spmd_mesh *m = base_calloc(NULL, bytes, "mesh");
    if (!m) return NULL;
    m->rank = rank;
    m->processes = 1;
    m->network = MESH_DEFAULT_NETWORK;
    m->n_devices = n;
    m->ids = (int *)(m + 1);
    m->position = m->ids + n;
    for (int a = 0; a < rank; a++) {
        m->shape[a] = shape[a];
        strcpy(m->names[a], names[a]);
        m->local[a] = true;
    }
    if (set_ids(m, ids, n_ids)) {
        base_free(NULL, m);
        return NULL;
    }
    return m;
}

spmd_mesh *spmd_mesh_create(int rank, const int *shape, const char *const *axis_names,
                            const int *device_ids)
{
    return mesh_create(rank, shape, axis_names, device_ids, -1);
}

void spmd_mesh_free(spmd_mesh *m) { base_free(NULL, m); }

/* ---- Text form -------------------------------------------------------------- */

typedef char mesh_item[MESH_MAX_NAME];

/* Split `text` at any of `seps` into trimmed, non-empty items.  `what`
 * ("mesh shape") and `item` ("size") name things in messages. */
static spmd_status split_list(const char *text, const char *seps, const char *what,
                              const char *item, mesh_item *items, int *n)
{
    if (!text) return base_error(SPMD_ERR_INVALID, "%s is NULL", what);
    *n = 0;
    const char *p = text;
    for (;;) {
        size_t len = strcspn(p, seps);
        const char *start = p, *end = p + len;
        while (start < end && isspace((unsigned char)*start)) start++;
        while (end > start && isspace((unsigned char)end[-1])) end--;
        int column = (int)((start == end ? p : start) - text) + 1;
        char quoted[MESH_EXCERPT_SIZE];
        mesh_text_excerpt(text, (size_t)column - 1, quoted, sizeof quoted);
        if (start == end)
            return base_error(SPMD_ERR_INVALID, "%s \"%s\": empty %s at column %d", what, quoted,
                              item, column);
        if (*n == MESH_MAX_AXES)
            return base_error(SPMD_ERR_INVALID, "%s \"%s\": more than %d axes", what, quoted,
                              MESH_MAX_AXES);
        if ((size_t)(end - start) >= MESH_MAX_NAME)
            return base_error(SPMD_ERR_INVALID,
                              "%s \"%s\": %s at column %d is too long (at most %d characters)",
                              what, quoted, item, column, MESH_MAX_NAME - 1);
        memcpy(items[*n], start, (size_t)(end - start));
        items[(*n)++][end - start] = '\0';
        if (!p[len]) return SPMD_OK;
        p += len + 1;
    }
}

spmd_mesh *spmd_mesh_parse(const char *shape, const char *axes)
{
    mesh_item sizes[MESH_MAX_AXES], names[MESH_MAX_AXES];
    int rank = 0, n_names = 0, dims[MESH_MAX_AXES];
    if (split_list(shape, "xX", "mesh shape", "size", sizes, &rank)) return NULL;
    if (split_list(axes, ",", "mesh axes", "axis name", names, &n_names)) return NULL;
    char quoted[MESH_EXCERPT_SIZE], quoted_axes[MESH_EXCERPT_SIZE];
    mesh_text_excerpt(shape, 0, quoted, sizeof quoted);
    for (int a = 0; a < rank; a++) {
        if (strspn(sizes[a], "0123456789") != strlen(sizes[a])) {
            base_error(SPMD_ERR_INVALID, "mesh shape \"%s\": '%s' is not a size", quoted,
                       sizes[a]);
            return NULL;
        }
        /* One size past the limit is refused here, as written, since it
         * may not fit an int; products of smaller ones in spmd_mesh_create. */
        unsigned long long v = strtoull(sizes[a], NULL, 10);
        if (v > MESH_MAX_DEVICES) {
            base_error(SPMD_ERR_INVALID,
                       "mesh shape \"%s\": size %s is more than %d devices, the most a "
                       "mesh can have",
                       quoted, sizes[a], MESH_MAX_DEVICES);
            return NULL;
        }
        dims[a] = (int)v;
    }
    if (n_names != rank) {
        base_error(SPMD_ERR_INVALID, "mesh shape \"%s\" has %d axes but \"%s\" names %d",
                   quoted, rank, mesh_text_excerpt(axes, 0, quoted_axes, sizeof quoted_axes),
                   n_names);
        return NULL;
    }
    const char *ptrs[MESH_MAX_AXES];
    for (int a = 0; a < rank; a++) ptrs[a] = names[a];
    return spmd_mesh_create(rank, dims, ptrs, NULL);
}

/* ---- Queries ------------------------------------------------------------------ */

static bool axis_ok(const spmd_mesh *m, int axis, const char *what)
{
    if (!m) {
        base_error(SPMD_ERR_INVALID, "%s: mesh is NULL", what);
        return false;
    }
    if (axis < 0 || axis >= m->rank) {
        base_error(SPMD_ERR_INVALID, "%s: axis %d is outside 0..%d", what, axis, m->rank - 1);
        return false;
    }
    return true;
}

int spmd_mesh_devices(const spmd_mesh *m) { return m ? m->n_devices : 0; }
int spmd_mesh_rank(const spmd_mesh *m) { return m ? m->rank : 0; }

int spmd_mesh_axis_size(const spmd_mesh *m, int axis)
{
    return axis_ok(m, axis, "mesh_axis_size") ? m->shape[axis] : -1;
}

const char *spmd_mesh_axis_name(const spmd_mesh *m, int axis)
{
    return axis_ok(m, axis, "mesh_axis_name") ? m->names[axis] : NULL;
}

int mesh_find_axis(const spmd_mesh *m, const char *name, size_t len)
{
    for (int a = 0; a < m->rank; a++)
        if (strlen(m->names[a]) == len && memcmp(m->names[a], name, len) == 0) return a;
    return -1;
}

int spmd_mesh_axis_index(const spmd_mesh *m, const char *name)
{
    if (!m || !name) {
        base_error(SPMD_ERR_INVALID, "mesh_axis_index: mesh or name is NULL");
        return -1;
    }
    int a = mesh_find_axis(m, name, strlen(name));
    if (a < 0) {
        char axes[MESH_MAX_AXES * (MESH_MAX_NAME + 2)];
        mesh_text t;
        mesh_text_init(&t, axes, sizeof axes);
        mesh_axes all = mesh_axes_from_mask(m, ~0u);
        mesh_text_axes(&t, m, &all);
        char quoted[MESH_EXCERPT_SIZE];
        base_error(SPMD_ERR_INVALID, "the mesh has no axis '%s' (its axes: %s)",
                   mesh_text_excerpt(name, 0, quoted, sizeof quoted), axes);
    }
    return a;
}

spmd_status spmd_mesh_set_axis_local(spmd_mesh *m, int axis, bool local)
{
    if (!axis_ok(m, axis, "mesh_set_axis_local")) return SPMD_ERR_INVALID;
    m->local[axis] = local;
    return SPMD_OK;
}

bool spmd_mesh_axis_is_local(const spmd_mesh *m, int axis)
{
    return axis_ok(m, axis, "mesh_axis_is_local") && m->local[axis];
}

spmd_status spmd_mesh_set_axis_independent(spmd_mesh *m, int axis, bool independent)
{
    if (!axis_ok(m, axis, "mesh_set_axis_independent")) return SPMD_ERR_INVALID;
    if (independent && m->stage[axis])
        return base_error(SPMD_ERR_INVALID,
                          "mesh_set_axis_independent: axis '%s' is the stage axis", m->names[axis]);
    m->independent[axis] = independent;
    return SPMD_OK;
}

bool spmd_mesh_axis_is_independent(const spmd_mesh *m, int axis)
{
    return axis_ok(m, axis, "mesh_axis_is_independent") && m->independent[axis];
}

spmd_status spmd_mesh_set_stage_axis(spmd_mesh *m, int axis)
{
    if (m && axis == -1) {
        memset(m->stage, 0, sizeof m->stage);
        return SPMD_OK;
    }
    if (!axis_ok(m, axis, "mesh_set_stage_axis")) return SPMD_ERR_INVALID;
    if (m->independent[axis])
        return base_error(SPMD_ERR_INVALID,
                          "mesh_set_stage_axis: axis '%s' is independent (copies of a model); "
                          "a stage axis splits one model", m->names[axis]);
    memset(m->stage, 0, sizeof m->stage);
    m->stage[axis] = true;
    return SPMD_OK;
}

int spmd_mesh_stage_axis(const spmd_mesh *m) { return m ? mesh_stage_axis(m) : -1; }

int mesh_stage_axis(const spmd_mesh *m)
{
    for (int a = 0; a < m->rank; a++)
        if (m->stage[a]) return a;
    return -1;
}

int mesh_stage_of(const spmd_mesh *m, int device)
{
    int axis = mesh_stage_axis(m);
    if (axis < 0) return -1;
    int pos = m->position[device];
    for (int a = m->rank - 1; a > axis; a--) pos /= m->shape[a];
    return pos % m->shape[axis];
}

bool mesh_axis_holds_no_split(const spmd_mesh *m, int a) { return m->independent[a] || m->stage[a]; }

int spmd_mesh_copies(const spmd_mesh *m)
{
    int n = 1;
    for (int a = 0; m && a < m->rank; a++)
        if (m->independent[a]) n *= m->shape[a];
    return n;
}

int mesh_copy_of(const spmd_mesh *m, int pos)
{
    int copy = 0, scale = 1;
    for (int a = m->rank - 1; a >= 0; a--) {
        int coord = pos % m->shape[a];
        pos /= m->shape[a];
        if (!m->independent[a]) continue;
        copy += coord * scale;
        scale *= m->shape[a];
    }
    return copy;
}

/* A 10 Gb/s network with tens of microseconds per message, until a
 * measurement or the user says otherwise. */
const cost_link MESH_DEFAULT_NETWORK = {25e-6, 1.25e9};

bool mesh_axis_crosses(const spmd_mesh *m, int axis, int per_process)
{
    /* Positions along an axis rise with it, in steps of the product of the
     * later axes' sizes; a group spans an aligned run of `span` positions.
     * Processes hold aligned runs of per_process positions: a boundary
     * between them inside such a run splits a group, unless groups are
     * single devices. */
    int span = 1;
    for (int a = axis; a < m->rank; a++) span *= m->shape[a];
    return m->shape[axis] > 1 && per_process % span != 0;
}

spmd_status spmd_mesh_place_processes(spmd_mesh *m, int processes)
{
    if (!m) return base_error(SPMD_ERR_INVALID, "mesh_place_processes: mesh is NULL");
    if (processes < 1 || m->n_devices % processes) {
        char text[256];
        return base_error(SPMD_ERR_INVALID,
                          "mesh_place_processes: %d processes do not divide the %d devices of "
                          "mesh %s evenly",
                          processes, m->n_devices, mesh_describe(m, text, sizeof text));
    }
    int per = m->n_devices / processes;
    for (int a = 0; a < m->rank; a++) m->local[a] = !mesh_axis_crosses(m, a, per);
    m->processes = processes;
    return SPMD_OK;
}

int spmd_mesh_processes(const spmd_mesh *m) { return m ? m->processes : 0; }

spmd_status spmd_mesh_set_network(spmd_mesh *m, double latency_s, double bytes_per_s)
{
    if (!m) return base_error(SPMD_ERR_INVALID, "mesh_set_network: mesh is NULL");
    if (!(latency_s >= 0 && latency_s < 1) || !(bytes_per_s > 0 && bytes_per_s < 1e15))
        return base_error(SPMD_ERR_INVALID,
                          "mesh_set_network: latency %g s and bandwidth %g bytes/s (a latency in "
                          "[0, 1) s and a positive bandwidth)",
                          latency_s, bytes_per_s);
    m->network = (cost_link){latency_s, bytes_per_s};
    return SPMD_OK;
}

void spmd_mesh_network(const spmd_mesh *m, double *latency_s, double *bytes_per_s)
{
    cost_link l = m ? m->network : MESH_DEFAULT_NETWORK;
    if (latency_s) *latency_s = l.alpha_s;
    if (bytes_per_s) *bytes_per_s = l.bytes_per_s;
}

/* `text` ("replica, fsdp"; blank: no axes) as mesh axes, each once. */
static spmd_status parse_axes(const spmd_mesh *m, const char *text, mesh_axes *out)
{
    mesh_item names[MESH_MAX_AXES];
    int n = 0;
    out->n = 0;
    if (text && strspn(text, " \t") == strlen(text)) return SPMD_OK;
    spmd_status st = split_list(text, ",", "mesh group axes", "axis name", names, &n);
    if (st) return st;
    for (int i = 0; i < n; i++) {
        int a = spmd_mesh_axis_index(m, names[i]);
        if (a < 0) return SPMD_ERR_INVALID;
        if (mesh_axes_mask(out) & (1u << a))
            return base_error(SPMD_ERR_INVALID, "mesh group axes \"%s\": axis '%s' is named twice",
                              text, names[i]);
        out->axis[out->n++] = (int8_t)a;
    }
    return SPMD_OK;
}

int spmd_mesh_group(const spmd_mesh *m, int device, const char *axes, int *members, int capacity)
{
    if (!m || !members) {
        base_error(SPMD_ERR_INVALID, "mesh_group: mesh or members is NULL");
        return -1;
    }
    if (device < 0 || device >= m->n_devices) {
        base_error(SPMD_ERR_INVALID, "mesh_group: device %d is outside 0..%d", device,
                   m->n_devices - 1);
        return -1;
    }
    mesh_axes list;
    if (parse_axes(m, axes, &list)) return -1;
    int size = mesh_axes_size(m, &list);
    if (size > capacity) {
        base_error(SPMD_ERR_INVALID, "mesh_group: the group has %d members, capacity is %d", size,
                   capacity);
        return -1;
    }
    return mesh_group(m, device, &list, members);
}

/* ---- Coordinates and groups ------------------------------------------------ */

uint32_t mesh_axes_mask(const mesh_axes *axes)
{
    uint32_t mask = 0;
    for (int i = 0; i < axes->n; i++) mask |= 1u << axes->axis[i];
    return mask;
}

mesh_axes mesh_axes_from_mask(const spmd_mesh *m, uint32_t mask)
{
    mesh_axes axes = {0};
    for (int a = 0; a < m->rank; a++)
        if (mask & (1u << a)) axes.axis[axes.n++] = (int8_t)a;
    return axes;
}

void mesh_coords(const spmd_mesh *m, int device, int *coords)
{
    int pos = m->position[device];
    for (int a = m->rank - 1; a >= 0; a--) {
        coords[a] = pos % m->shape[a];
        pos /= m->shape[a];
    }
}

int mesh_device_at(const spmd_mesh *m, const int *coords)
{
    int pos = 0;
    for (int a = 0; a < m->rank; a++) pos = pos * m->shape[a] + coords[a];
    return m->ids[pos];
}

int mesh_axes_size(const spmd_mesh *m, const mesh_axes *axes)
{
    int size = 1;
    for (int i = 0; i < axes->n; i++) size *= m->shape[axes->axis[i]];
    return size;
}

/* Mixed radix of `coords` on `axes`, first axis major. */
static int axes_rank(const spmd_mesh *m, const mesh_axes *axes, const int *coords)
{
    int r = 0;
    for (int i = 0; i < axes->n; i++) r = r * m->shape[axes->axis[i]] + coords[axes->axis[i]];
    return r;
}

void mesh_set_coords(const spmd_mesh *m, const mesh_axes *axes, int index, int *coords)
{
    for (int i = axes->n - 1; i >= 0; i--) {
        int a = axes->axis[i];
        coords[a] = index % m->shape[a];
        index /= m->shape[a];
    }
}

int mesh_group_rank(const spmd_mesh *m, int device, const mesh_axes *axes)
{
    int coords[MESH_MAX_AXES];
    mesh_coords(m, device, coords);
    return axes_rank(m, axes, coords);
}

int mesh_group(const spmd_mesh *m, int device, const mesh_axes *axes, int *members)
{
    int coords[MESH_MAX_AXES];
    mesh_coords(m, device, coords);
    int size = mesh_axes_size(m, axes);
    for (int r = 0; r < size; r++) {
        mesh_set_coords(m, axes, r, coords);
        members[r] = mesh_device_at(m, coords);
    }
    return size;
}

int mesh_group_index(const spmd_mesh *m, int device, const mesh_axes *axes)
{
    int coords[MESH_MAX_AXES];
    mesh_coords(m, device, coords);
    mesh_axes off = mesh_axes_from_mask(m, ~mesh_axes_mask(axes));
    return axes_rank(m, &off, coords);
}
