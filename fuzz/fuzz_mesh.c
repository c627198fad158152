/*
 * Fuzz target: mesh text (spmd_mesh_parse in src/mesh/mesh.c).
 *
 * The input is split at its first NUL or newline into the shape ("4x2")
 * and the axis names ("replica,fsdp"), both NUL-terminated.  Parsing must
 * never crash; a failure must leave a message in spmd_last_error().  A mesh
 * that parses must hold prod(shape) devices, print and parse back to an
 * equal mesh, and along every single axis (and, for small meshes, every set
 * of axes) its groups must partition the devices: each device in exactly
 * one group, of the axes' size, at its own group rank, all members sharing
 * the group index.  The public spmd_mesh_group is also asked for groups
 * along the raw axis text and the raw shape text.
 *
 * Run:  cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DSPMD_FUZZ=ON \
 *         -DSPMD_BUILD_TESTS=OFF -DSPMD_BUILD_BENCH=OFF -DSPMD_BUILD_EXAMPLES=OFF
 *       cmake --build build-fuzz --target fuzz_mesh
 *       mkdir -p corpus-mesh && build-fuzz/fuzz/fuzz_mesh corpus-mesh fuzz/corpus/fuzz_mesh \
 *         -max_total_time=180 -rss_limit_mb=2048
 * Every build replays fuzz/corpus/fuzz_mesh once as the test fuzz_mesh_corpus
 * (fuzz/replay.c); add an input found failing there.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mesh/mesh.h"

#define CHECK(cond, ...)                                                               \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "fuzz_mesh: check failed: %s: ", #cond);                   \
            fprintf(stderr, __VA_ARGS__);                                              \
            fprintf(stderr, "\n");                                                     \
            abort();                                                                   \
        }                                                                              \
    } while (0)

static int members[MESH_MAX_DEVICES], seen[MESH_MAX_DEVICES];

/* The groups along `axes` partition the devices. */
static void check_partition(const spmd_mesh *m, const mesh_axes *axes)
{
    int size = mesh_axes_size(m, axes), groups = 0;
    CHECK(size >= 1 && m->n_devices % size == 0, "group size %d of %d devices", size,
          m->n_devices);
    for (int d = 0; d < m->n_devices; d++) seen[d] = -1;
    for (int d = 0; d < m->n_devices; d++) {
        if (seen[d] >= 0) continue;
        int n = mesh_group(m, d, axes, members);
        int index = mesh_group_index(m, d, axes);
        CHECK(n == size, "group of %d has %d members, want %d", d, n, size);
        CHECK(index >= 0 && index < m->n_devices / size, "group index %d", index);
        for (int r = 0; r < n; r++) {
            int dev = members[r];
            CHECK(dev >= 0 && dev < m->n_devices, "member %d out of range", dev);
            CHECK(seen[dev] < 0, "device %d in groups of %d and %d", dev, seen[dev], d);
            seen[dev] = d;
            CHECK(mesh_group_rank(m, dev, axes) == r, "device %d: rank %d, listed at %d", dev,
                  mesh_group_rank(m, dev, axes), r);
            CHECK(mesh_group_index(m, dev, axes) == index, "device %d: group index %d, want %d",
                  dev, mesh_group_index(m, dev, axes), index);
        }
        CHECK(seen[d] == d, "device %d is not in its own group", d);
        groups++;
    }
    CHECK(groups * size == m->n_devices, "%d groups of %d for %d devices", groups, size,
          m->n_devices);
}

static void check_mesh(const spmd_mesh *m, const char *shape, const char *axes)
{
    CHECK(spmd_mesh_rank(m) >= 1 && spmd_mesh_rank(m) <= MESH_MAX_AXES, "rank %d", m->rank);
    int n = 1;
    for (int a = 0; a < m->rank; a++) {
        CHECK(m->shape[a] >= 1, "axis %d has size %d", a, m->shape[a]);
        n *= m->shape[a];
        CHECK(spmd_mesh_axis_index(m, m->names[a]) == a, "axis '%s' not found", m->names[a]);
    }
    CHECK(n == spmd_mesh_devices(m) && n <= MESH_MAX_DEVICES, "%d devices, shape says %d",
          spmd_mesh_devices(m), n);
    for (int i = 0; i < n; i++)
        CHECK(m->ids[i] == i && m->position[i] == i, "ids not the identity at %d", i);

    /* Printed back ("4x2", "a,b") it parses to the same mesh. */
    char shape2[MESH_MAX_AXES * 8], axes2[MESH_MAX_AXES * (MESH_MAX_NAME + 1)], desc[512];
    mesh_text ts, ta;
    mesh_text_init(&ts, shape2, sizeof shape2);
    mesh_text_init(&ta, axes2, sizeof axes2);
    for (int a = 0; a < m->rank; a++) {
        mesh_text_add(&ts, a ? "x%d" : "%d", m->shape[a]);
        mesh_text_add(&ta, a ? ",%s" : "%s", m->names[a]);
    }
    spmd_mesh *again = spmd_mesh_parse(shape2, axes2);
    CHECK(again && mesh_equal(m, again), "\"%s\" \"%s\" reprinted as \"%s\" \"%s\": %s", shape,
          axes, shape2, axes2, spmd_last_error());
    spmd_mesh_free(again);
    mesh_describe(m, desc, sizeof desc);
    CHECK(strncmp(desc, shape2, strlen(shape2)) == 0, "described as \"%s\"", desc);

    for (int a = 0; a < m->rank; a++) {
        mesh_axes one = {.n = 1, .axis = {(int8_t)a}};
        check_partition(m, &one);
    }
    /* Every set of axes, in mesh order and reversed, on small meshes. */
    if (n <= 64 && m->rank <= 6) {
        for (uint32_t mask = 0; mask < 1u << m->rank; mask++) {
            mesh_axes set = mesh_axes_from_mask(m, mask), rev = set;
            for (int i = 0; i < set.n; i++) rev.axis[i] = set.axis[set.n - 1 - i];
            check_partition(m, &set);
            check_partition(m, &rev);
        }
    }

    /* The public group query on the raw texts: a group or a message. */
    const char *texts[] = {axes, shape};
    for (int i = 0; i < 2; i++) {
        spmd_clear_error();
        int got = spmd_mesh_group(m, n - 1, texts[i], members, MESH_MAX_DEVICES);
        CHECK(got > 0 || (got == -1 && spmd_last_error()[0]), "group on \"%s\": %d", texts[i],
              got);
        for (int r = 0; r < got; r++)
            CHECK(members[r] >= 0 && members[r] < n, "member %d of %d", members[r], n);
    }
    /* The axes it was made with name every axis: the whole mesh. */
    CHECK(spmd_mesh_group(m, 0, axes, members, MESH_MAX_DEVICES) == n, "group along \"%s\": %s",
          axes, spmd_last_error());
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 1024) return 0;
    char *text = malloc(size + 2);
    if (!text) return 0;
    if (size) memcpy(text, data, size);
    text[size] = text[size + 1] = '\0';
    size_t cut = 0;
    while (cut < size && text[cut] != '\0' && text[cut] != '\n') cut++;
    text[cut] = '\0';
    const char *shape = text, *axes = text + cut + 1;

    spmd_clear_error();
    spmd_mesh *m = spmd_mesh_parse(shape, axes);
    if (!m) {
        CHECK(spmd_last_error()[0] != '\0', "\"%s\" \"%s\": NULL without a message", shape, axes);
    } else {
        check_mesh(m, shape, axes);
        spmd_mesh_free(m);
    }
    free(text);
    return 0;
}
