/*
 * Fuzz target: partition-spec text (src/mesh/sharding.c).
 *
 * The input, NUL-terminated, is parsed with sharding_parse for ranks 0..4
 * on a 1-D mesh (8 'data'), the (4, 2) ('replica', 'fsdp') mesh, the same
 * with permuted device ids, and a 3-D mesh (2x3x2 'x', 'y', 'z').  A spec
 * that parses must be well formed (each axis used once, partial axes off
 * the dims), print with sharding_format to text that parses back to the
 * same sharding and prints the same again, and give GSPMD HloSharding text
 * and (rank <= 2, small dims taken from the input) the ASCII picture
 * without crashing, also into buffers too small; a grouped split (N*axis)
 * has no picture, so drawing one must be refused with a message saying so.  A spec that fails must
 * return SPMD_ERR_INVALID and leave a message in spmd_last_error().
 *
 * Run:  cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DSPMD_FUZZ=ON \
 *         -DSPMD_BUILD_TESTS=OFF -DSPMD_BUILD_BENCH=OFF -DSPMD_BUILD_EXAMPLES=OFF
 *       cmake --build build-fuzz --target fuzz_spec
 *       mkdir -p corpus-spec && build-fuzz/fuzz/fuzz_spec corpus-spec fuzz/corpus/fuzz_spec \
 *         -dict=fuzz/spec.dict -max_total_time=180 -rss_limit_mb=2048
 * Every build replays fuzz/corpus/fuzz_spec once as the test fuzz_spec_corpus
 * (fuzz/replay.c); add an input found failing there.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mesh/sharding.h"

#define CHECK(cond, ...)                                                               \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "fuzz_spec: check failed: %s: ", #cond);                   \
            fprintf(stderr, __VA_ARGS__);                                              \
            fprintf(stderr, "\n");                                                     \
            abort();                                                                   \
        }                                                                              \
    } while (0)

enum { N_MESHES = 4 };
static spmd_mesh *meshes[N_MESHES];

static void make_meshes(void)
{
    static const char *const data[] = {"data"}, *const rf[] = {"replica", "fsdp"},
                             *const xyz[] = {"x", "y", "z"};
    static const int eight[] = {8}, four_two[] = {4, 2}, cube[] = {2, 3, 2};
    static const int permuted[] = {0, 2, 4, 6, 1, 3, 5, 7};
    meshes[0] = spmd_mesh_create(1, eight, data, NULL);
    meshes[1] = spmd_mesh_create(2, four_two, rf, NULL);
    meshes[2] = spmd_mesh_create(2, four_two, rf, permuted);
    meshes[3] = spmd_mesh_create(3, cube, xyz, NULL);
    for (int i = 0; i < N_MESHES; i++) CHECK(meshes[i], "mesh %d: %s", i, spmd_last_error());
}

/* Each mesh axis at most once over the dims and partial, all in range. */
static void check_well_formed(const sharding *s, const spmd_mesh *m, int rank, const char *text)
{
    CHECK(s->rank == rank, "\"%s\": rank %d, asked %d", text, s->rank, rank);
    uint32_t seen = 0;
    for (int d = 0; d < rank; d++) {
        CHECK(s->dim[d].n >= 0 && s->dim[d].n <= m->rank, "\"%s\": dim %d has %d axes", text, d,
              s->dim[d].n);
        for (int i = 0; i < s->dim[d].n; i++) {
            int a = s->dim[d].axis[i];
            CHECK(a >= 0 && a < m->rank, "\"%s\": axis %d", text, a);
            CHECK(!(seen & (1u << a)), "\"%s\": axis %d used twice", text, a);
            seen |= 1u << a;
        }
    }
    CHECK(!(s->partial & seen), "\"%s\": partial axes on a dim too", text);
    CHECK(!(s->partial >> m->rank), "\"%s\": partial 0x%x off the mesh", text, s->partial);
}

static void check_spec(const char *text, const spmd_mesh *m, int rank, const uint8_t *data,
                       size_t size)
{
    sharding s, again;
    spmd_clear_error();
    spmd_status st = sharding_parse(text, m, rank, &s);
    if (st != SPMD_OK) {
        CHECK(st == SPMD_ERR_INVALID, "\"%s\": status %d", text, (int)st);
        CHECK(spmd_last_error()[0] != '\0', "\"%s\": error without a message", text);
        return;
    }
    check_well_formed(&s, m, rank, text);

    /* format -> parse -> the same sharding, and the same text again. */
    char printed[512], reprinted[512];
    sharding_format(&s, m, printed, sizeof printed);
    CHECK(strlen(printed) < sizeof printed - 1, "\"%s\": printed text fills the buffer", text);
    st = sharding_parse(printed, m, rank, &again);
    CHECK(st == SPMD_OK, "\"%s\" printed as \"%s\" does not parse: %s", text, printed,
          spmd_last_error());
    CHECK(sharding_equal(&s, &again), "\"%s\" printed as \"%s\" parses differently", text,
          printed);
    sharding_format(&again, m, reprinted, sizeof reprinted);
    CHECK(strcmp(printed, reprinted) == 0, "\"%s\": \"%s\" then \"%s\"", text, printed,
          reprinted);

    /* Truncated printing stays terminated. */
    char small[7];
    sharding_format(&s, m, small, sizeof small);
    CHECK(strlen(small) < sizeof small, "\"%s\": unterminated", text);
    CHECK(strncmp(small, printed, strlen(small)) == 0, "\"%s\": truncated differently", text);

    char hlo[1024];
    sharding_format_hlo(&s, m, hlo, sizeof hlo);
    CHECK(hlo[0] == '{' && hlo[strlen(hlo) - 1] == '}', "\"%s\": hlo \"%s\"", text, hlo);
    sharding_format_hlo(&s, m, small, sizeof small);
    CHECK(strncmp(small, hlo, strlen(small)) == 0, "\"%s\": hlo truncated differently", text);

    if (rank <= 2) {
        int64_t dims[2] = {1 + (size ? data[0] % 24 : 7), 1 + (size > 1 ? data[1] % 24 : 5)};
        char pic[4096], tiny[19];
        spmd_clear_error();
        int n = sharding_visualize(&s, m, rank, dims, pic, sizeof pic);
        if (sharding_has_groups(&s)) {
            /* A grouped split holds a block of every group on each device,
             * which a picture of one block per device cannot show: refused
             * by design, with a message saying so. */
            CHECK(n == -1 && strstr(spmd_last_error(), "grouped split"),
                  "\"%s\": a grouped split drawn (%d) or refused without saying why: %s", text, n,
                  spmd_last_error());
            return;
        }
        CHECK(n >= 0 && (size_t)n == strlen(pic), "\"%s\": visualize returned %d for %zu bytes",
              text, n, strlen(pic));
        n = sharding_visualize(&s, m, rank, dims, tiny, sizeof tiny);
        CHECK(n >= 0 && (size_t)n == strlen(tiny) && strncmp(tiny, pic, (size_t)n) == 0,
              "\"%s\": truncated picture differs", text);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!meshes[0]) make_meshes();
    if (size > 4096) return 0;
    char *text = malloc(size + 1);
    if (!text) return 0;
    if (size) memcpy(text, data, size);
    text[size] = '\0';
    for (int i = 0; i < N_MESHES; i++)
        for (int rank = 0; rank <= 4; rank++) check_spec(text, meshes[i], rank, data, size);
    free(text);
    return 0;
}
