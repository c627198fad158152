/*
 * Meshes and shardings: mesh creation and its errors, coordinates and
 * groups (also with permuted device ids), the partition-spec parser and
 * printer (round trips and every error, each naming token and column),
 * GSPMD HloSharding text, block arithmetic with padding, the ASCII
 * picture, and marks on a graph.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"
#include "mesh/sharding.h"
#include "spmd/mesh.h"

/* Fails the test with the whole text when `part` is not in it. */
#define assert_contains(text, part)                                                        \
    do {                                                                                   \
        if (!strstr((text), (part))) fail_msg("\"%s\" does not contain \"%s\"", (text), (part)); \
    } while (0)

static const char *const REPLICA_FSDP[] = {"replica", "fsdp"};
static const int SHAPE_4X2[] = {4, 2};
/* Device ids by row-major coordinate: the fsdp = 0 column of the 4x2
 * mesh holds 0, 4, 1, 5 and the fsdp = 1 column 2, 6, 3, 7. */
static const int PERMUTED[] = {0, 2, 4, 6, 1, 3, 5, 7};

static spmd_mesh *mesh_4x2(const int *ids)
{
    spmd_mesh *m = spmd_mesh_create(2, SHAPE_4X2, REPLICA_FSDP, ids);
    assert_non_null(m);
    return m;
}

/* ---- Meshes ------------------------------------------------------------------- */

static void test_mesh_create_and_query(void **state)
{
    (void)state;
    spmd_mesh *m = mesh_4x2(NULL);
    assert_int_equal(spmd_mesh_devices(m), 8);
    assert_int_equal(spmd_mesh_rank(m), 2);
    assert_int_equal(spmd_mesh_axis_size(m, 0), 4);
    assert_int_equal(spmd_mesh_axis_size(m, 1), 2);
    assert_string_equal(spmd_mesh_axis_name(m, 1), "fsdp");
    assert_int_equal(spmd_mesh_axis_index(m, "fsdp"), 1);
    assert_true(spmd_mesh_axis_is_local(m, 0));
    assert_int_equal(spmd_mesh_set_axis_local(m, 0, false), SPMD_OK);
    assert_false(spmd_mesh_axis_is_local(m, 0));
    assert_int_equal(spmd_mesh_axis_size(m, 2), -1);
    assert_contains(spmd_last_error(), "axis 2");
    assert_null(spmd_mesh_axis_name(m, -1));

    spmd_mesh *p = spmd_mesh_parse(" 4 x 2 ", " replica , fsdp");
    assert_non_null(p);
    assert_true(mesh_equal(m, p));
    spmd_mesh_free(p);
    p = spmd_mesh_parse("8", "data");
    assert_non_null(p);
    assert_int_equal(spmd_mesh_devices(p), 8);
    assert_string_equal(spmd_mesh_axis_name(p, 0), "data");
    char buf[128];
    assert_string_equal(mesh_describe(m, buf, sizeof buf), "4x2 (replica, fsdp)");
    spmd_mesh_free(p);
    spmd_mesh_free(m);
}

static void test_mesh_errors(void **state)
{
    (void)state;
    static const int ids6[] = {0, 1, 2, 3, 4, 5};
    static const int twice[] = {0, 1, 2, 2, 4, 5, 6, 7};
    static const int outside[] = {0, 1, 2, 3, 4, 5, 6, 8};
    assert_null(mesh_create(2, SHAPE_4X2, REPLICA_FSDP, ids6, 6));
    assert_contains(spmd_last_error(), "mesh 4x2 has 8 devices, got 6 ids");
    assert_null(spmd_mesh_create(2, SHAPE_4X2, REPLICA_FSDP, twice));
    assert_contains(spmd_last_error(), "device id 2 appears twice (positions 2 and 3)");
    assert_null(spmd_mesh_create(2, SHAPE_4X2, REPLICA_FSDP, outside));
    assert_contains(spmd_last_error(), "device id 8 at position 7 is outside 0..7");

    const char *same[] = {"data", "data"}, *digit[] = {"1x", "b"}, *dash[] = {"a-b", "c"};
    const char *none[] = {"None", "b"}, *empty[] = {"", "b"};
    assert_null(spmd_mesh_create(2, SHAPE_4X2, same, NULL));
    assert_contains(spmd_last_error(), "'data' is used twice");
    assert_null(spmd_mesh_create(2, SHAPE_4X2, digit, NULL));
    assert_contains(spmd_last_error(), "'1x' is not an identifier");
    assert_null(spmd_mesh_create(2, SHAPE_4X2, dash, NULL));
    assert_contains(spmd_last_error(), "'a-b'");
    assert_null(spmd_mesh_create(2, SHAPE_4X2, none, NULL));
    assert_contains(spmd_last_error(), "'None' is reserved");
    assert_null(spmd_mesh_create(2, SHAPE_4X2, empty, NULL));
    assert_contains(spmd_last_error(), "'' is not an identifier");

    const int zero[] = {4, 0};
    assert_null(spmd_mesh_create(2, zero, REPLICA_FSDP, NULL));
    assert_contains(spmd_last_error(), "mesh 4x0: axis 'fsdp' has size 0");
    assert_null(spmd_mesh_create(0, SHAPE_4X2, REPLICA_FSDP, NULL));
    assert_contains(spmd_last_error(), "1 to 8 axes, got 0");
    const int nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    assert_null(spmd_mesh_create(9, nine, REPLICA_FSDP, NULL));
    assert_contains(spmd_last_error(), "got 9");
    assert_null(spmd_mesh_parse("4096x2", "a,b"));
    assert_contains(spmd_last_error(), "more than 4096 devices");

    assert_null(spmd_mesh_parse("4x2", "replica"));
    assert_contains(spmd_last_error(), "\"4x2\" has 2 axes but \"replica\" names 1");
    assert_null(spmd_mesh_parse("4x", "a,b"));
    assert_contains(spmd_last_error(), "empty size at column 3");
    assert_null(spmd_mesh_parse("4xa", "a,b"));
    assert_contains(spmd_last_error(), "'a' is not a size");
    assert_null(spmd_mesh_parse("4x2", "a, ,b"));
    assert_contains(spmd_last_error(), "empty axis name at column 3");
    assert_null(spmd_mesh_parse("2x2x2x2x2x2x2x2x2", "a,b,c,d,e,f,g,h,i"));
    assert_contains(spmd_last_error(), "more than 8 axes");

    spmd_mesh *m = mesh_4x2(NULL);
    assert_int_equal(spmd_mesh_axis_index(m, "fsdq"), -1);
    assert_contains(spmd_last_error(), "no axis 'fsdq' (its axes: replica, fsdp)");
    spmd_mesh_free(m);
}

/* ---- Coordinates and groups ------------------------------------------------------ */

static void assert_group(const spmd_mesh *m, int device, const char *axes, const int *want, int n)
{
    int got[8];
    assert_int_equal(spmd_mesh_group(m, device, axes, got, 8), n);
    for (int i = 0; i < n; i++) assert_int_equal(got[i], want[i]);
}

static void test_groups(void **state)
{
    (void)state;
    spmd_mesh *m = mesh_4x2(NULL);
    int coords[MESH_MAX_AXES];
    mesh_coords(m, 5, coords);
    assert_int_equal(coords[0], 2);
    assert_int_equal(coords[1], 1);
    assert_group(m, 5, "fsdp", (const int[]){4, 5}, 2);
    assert_group(m, 5, "replica", (const int[]){1, 3, 5, 7}, 4);
    assert_group(m, 5, "replica, fsdp", (const int[]){0, 1, 2, 3, 4, 5, 6, 7}, 8);
    assert_group(m, 5, "fsdp,replica", (const int[]){0, 2, 4, 6, 1, 3, 5, 7}, 8);
    assert_group(m, 5, "", (const int[]){5}, 1);

    mesh_axes fsdp = {.n = 1, .axis = {1}}, replica = {.n = 1, .axis = {0}};
    assert_int_equal(mesh_group_rank(m, 5, &fsdp), 1);
    assert_int_equal(mesh_group_rank(m, 5, &replica), 2);
    assert_int_equal(mesh_group_index(m, 5, &fsdp), 2);
    assert_int_equal(mesh_group_index(m, 5, &replica), 1);

    int members[8];
    assert_int_equal(spmd_mesh_group(m, 5, "replica", members, 2), -1);
    assert_contains(spmd_last_error(), "4 members, capacity is 2");
    assert_int_equal(spmd_mesh_group(m, 8, "fsdp", members, 8), -1);
    assert_contains(spmd_last_error(), "device 8 is outside 0..7");
    assert_int_equal(spmd_mesh_group(m, 0, "fsdp, data", members, 8), -1);
    assert_contains(spmd_last_error(), "no axis 'data'");
    assert_int_equal(spmd_mesh_group(m, 0, "fsdp,fsdp", members, 8), -1);
    assert_contains(spmd_last_error(), "'fsdp' is named twice");
    spmd_mesh_free(m);

    /* Permuted ids: device 5 sits at row-major position 6, coordinate (3, 0). */
    m = mesh_4x2(PERMUTED);
    mesh_coords(m, 5, coords);
    assert_int_equal(coords[0], 3);
    assert_int_equal(coords[1], 0);
    assert_group(m, 5, "fsdp", (const int[]){5, 7}, 2);
    assert_group(m, 5, "replica", (const int[]){0, 4, 1, 5}, 4);
    assert_int_equal(mesh_group_rank(m, 5, &replica), 3);
    spmd_mesh_free(m);
}

/* Process placement: on 4x2, 2 or 4 processes keep 'fsdp' inside one and
 * 'replica' across; 8 put both across; and on other meshes every axis is
 * local exactly when no group along it straddles two processes' runs of
 * positions (checked member by member). */
static void test_place_processes(void **state)
{
    (void)state;
    spmd_mesh *m = mesh_4x2(PERMUTED);
    assert_int_equal(spmd_mesh_processes(m), 1);
    assert_true(spmd_mesh_axis_is_local(m, 0) && spmd_mesh_axis_is_local(m, 1));
    const struct {
        int processes;
        bool replica, fsdp;
    } cases[] = {{1, true, true}, {2, false, true}, {4, false, true}, {8, false, false}};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(spmd_mesh_place_processes(m, cases[i].processes), SPMD_OK);
        assert_int_equal(spmd_mesh_processes(m), cases[i].processes);
        assert_int_equal(spmd_mesh_axis_is_local(m, 0), cases[i].replica);
        assert_int_equal(spmd_mesh_axis_is_local(m, 1), cases[i].fsdp);
    }
    assert_int_equal(spmd_mesh_place_processes(m, 3), SPMD_ERR_INVALID);
    assert_contains(spmd_last_error(), "3 processes do not divide the 8 devices");
    assert_int_equal(spmd_mesh_place_processes(m, 0), SPMD_ERR_INVALID);
    spmd_mesh_free(m);

    const char *const names[] = {"a", "b", "c"};
    const int shapes[][3] = {{2, 3, 4}, {3, 2, 2}, {4, 4, 1}, {6, 1, 2}};
    for (int k = 0; k < 4; k++) {
        m = spmd_mesh_create(3, shapes[k], names, NULL);
        assert_non_null(m);
        int n = spmd_mesh_devices(m);
        for (int procs = 1; procs <= n; procs++) {
            if (n % procs) continue;
            assert_int_equal(spmd_mesh_place_processes(m, procs), SPMD_OK);
            for (int a = 0; a < 3; a++) {
                bool local = true;
                for (int d = 0; d < n; d++) {
                    int members[64];
                    int size = spmd_mesh_group(m, d, names[a], members, 64);
                    for (int j = 0; j < size; j++)
                        local &= m->position[members[j]] / (n / procs) == m->position[d] / (n / procs);
                }
                if (local != spmd_mesh_axis_is_local(m, a))
                    fail_msg("mesh %dx%dx%d over %d processes: axis %s local %d, expected %d",
                             shapes[k][0], shapes[k][1], shapes[k][2], procs, names[a],
                             spmd_mesh_axis_is_local(m, a), local);
            }
        }
        spmd_mesh_free(m);
    }
}

/* ---- Spec text ----------------------------------------------------------------------- */

static void test_spec_round_trip(void **state)
{
    (void)state;
    static const struct {
        int rank;
        const char *text, *printed;
    } cases[] = {
        {2, "(replica, fsdp), None", "(replica, fsdp), None"},
        {2, "fsdp, None", "fsdp, None"},
        {2, "None, fsdp", "None, fsdp"},
        {2, "None, None", "None, None"},
        {2, "replica, fsdp", "replica, fsdp"},
        {2, "(fsdp, replica), None", "(fsdp, replica), None"},
        {2, "('replica', 'fsdp'), None", "(replica, fsdp), None"},
        {2, "(\"replica\",\"fsdp\"),None", "(replica, fsdp), None"},
        {2, "  (  replica ,fsdp ) ,\tNone  ", "(replica, fsdp), None"},
        {2, "('fsdp',), None", "fsdp, None"},
        {2, "(fsdp), 'replica'", "fsdp, replica"},
        {2, "fsdp, None | partial(replica)", "fsdp, None | partial(replica)"},
        {2, "None,None|partial( 'replica' )", "None, None | partial(replica)"},
        {0, "", ""},
        {0, "   ", ""},
        {0, "| partial(fsdp, replica)", "| partial(replica, fsdp)"},
        {3, "replica, None, fsdp", "replica, None, fsdp"},
        {3, "None, (fsdp, replica), None", "None, (fsdp, replica), None"},
        {1, "(replica, fsdp)", "(replica, fsdp)"},
    };
    spmd_mesh *m = mesh_4x2(NULL);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        sharding s, again;
        char buf[128];
        if (sharding_parse(cases[i].text, m, cases[i].rank, &s) != SPMD_OK)
            fail_msg("\"%s\": %s", cases[i].text, spmd_last_error());
        assert_string_equal(sharding_format(&s, m, buf, sizeof buf), cases[i].printed);
        assert_int_equal(sharding_parse(buf, m, cases[i].rank, &again), SPMD_OK);
        assert_true(sharding_equal(&s, &again));
    }
    /* Truncation keeps the buffer terminated. */
    sharding s;
    char small[5];
    assert_int_equal(sharding_parse("(replica, fsdp), None", m, 2, &s), SPMD_OK);
    assert_string_equal(sharding_format(&s, m, small, sizeof small), "(rep");
    assert_int_equal(sharding_dim_axes(&s), 3);
    spmd_mesh_free(m);
}

static void test_spec_errors(void **state)
{
    (void)state;
    static const struct {
        int rank;
        const char *text, *want;
    } cases[] = {
        {2, "(replica, fsdq), None", "unknown axis 'fsdq' at column 11 (mesh axes: replica, fsdp)"},
        {2, "'fsdq', None", "unknown axis 'fsdq' at column 1"},
        {2, "fsdp, (replica, fsdp)", "axis 'fsdp' used twice (column 17), first at column 1"},
        {2, "fsdp, None | partial(fsdp)", "axis 'fsdp' used twice (column 22)"},
        {2, "fsdp, None, None", "3 entries for a rank-2 tensor"},
        {2, "", "0 entries for a rank-2 tensor"},
        {0, "None", "1 entry for a rank-0 tensor"},
        {2, "(replica, fsdp, None", "unbalanced parentheses: '(' at column 1 is never closed"},
        {2, "None) , fsdp", "')' at column 5 has no matching '('"},
        {2, "fsdp, , None", "empty entry at column 7"},
        {2, ", fsdp", "empty entry at column 1"},
        {2, "fsdp, None,", "empty entry at column 12"},
        {2, "(replica,, fsdp), None", "empty entry at column 10"},
        {2, "(), None", "empty tuple '()' at column 1"},
        {2, "fsdp replica", "unexpected 'replica' at column 6"},
        {2, "(fsdp replica), None", "unexpected 'replica' at column 7"},
        {2, "fsdp; None", "unexpected ';' at column 5"},
        {2, "fsdp,\xc3\xa9", "unexpected byte 0xc3 at column 6"},
        {2, "'fsdp, None", "quote ' at column 1 is never closed"},
        {2, "((replica), fsdp)", "'(' at column 2 opens a tuple inside the one at column 1"},
        {2, "(None, fsdp), None", "None at column 2 cannot be part of a tuple"},
        {2, "fsdp, None | sum(replica)", "expected partial(axes) after the '|' at column 12"},
        {2, "fsdp, None | partial", "expected '(' after the partial at column 14"},
        {2, "fsdp, None | partial()", "empty partial '()' at column 21"},
        {2, "fsdp, None | partial(replica) x", "unexpected 'x' at column 31"},
        {2, "fsdp, | partial(replica)", "empty entry at column 7"},
    };
    spmd_mesh *m = mesh_4x2(NULL);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        sharding s;
        char spec[128];
        spmd_clear_error();
        assert_int_equal(sharding_parse(cases[i].text, m, cases[i].rank, &s), SPMD_ERR_INVALID);
        snprintf(spec, sizeof spec, "spec \"%s\": ", cases[i].text);
        assert_contains(spmd_last_error(), spec);
        assert_contains(spmd_last_error(), cases[i].want);
    }
    spmd_mesh_free(m);
}

/* "<head>" then `unit` repeated until the text is `len` bytes, then
 * "<tail>" written over its last bytes; the caller frees it. */
static char *long_text(const char *head, const char *unit, size_t len, const char *tail)
{
    char *s = malloc(len + 1);
    assert_non_null(s);
    size_t n = strlen(head), u = strlen(unit);
    memcpy(s, head, n);
    for (size_t i = n; i < len; i++) s[i] = unit[(i - n) % u];
    memcpy(s + len - strlen(tail), tail, strlen(tail));
    s[len] = '\0';
    return s;
}

/* A spec of 10,000 characters is cut down in the message to the stretch
 * where the trouble is, so the reason and its column are never lost off
 * the end of it. */
static void test_long_spec_errors(void **state)
{
    (void)state;
    spmd_mesh *m = mesh_4x2(NULL);
    sharding s;
    /* A run of junk right after the first entry. */
    char *junk = long_text("fsdp, ", "x", 10000, "");
    spmd_clear_error();
    assert_int_equal(sharding_parse(junk, m, 2, &s), SPMD_ERR_INVALID);
    assert_contains(spmd_last_error(), "(10000 characters)");
    assert_contains(spmd_last_error(), "unknown axis 'xxxxxxxx");
    assert_contains(spmd_last_error(), "...' at column 7 (mesh axes: replica, fsdp)");
    assert_true(strlen(spmd_last_error()) < 300);

    /* A bad byte at column 9001, deep in a long list of entries. */
    char *deep = long_text("", "None, ", 10000, "");
    deep[9000] = ';';
    assert_int_equal(sharding_parse(deep, m, 2, &s), SPMD_ERR_INVALID);
    assert_contains(spmd_last_error(), "unexpected ';' at column 9001");
    assert_contains(spmd_last_error(), ";"); /* the excerpt shows the spot */
    assert_contains(spmd_last_error(), "...\" (10000 characters)");

    /* Too many entries (10000 = 6 x 1666 + 4: the last is a whole None):
     * the count still shows. */
    char *many = long_text("", "None, ", 10000, "");
    assert_int_equal(sharding_parse(many, m, 2, &s), SPMD_ERR_INVALID);
    assert_contains(spmd_last_error(), "1667 entries for a rank-2 tensor");

    /* Through a mark, which adds the tensor's name in front. */
    spmd_graph *g = spmd_graph_create(NULL);
    const int64_t dims[2] = {16, 8};
    spmd_tensor *x = spmd_input(g, "x", SPMD_F32, 2, dims);
    assert_int_equal(spmd_mark_sharding(g, x, m, deep), SPMD_ERR_INVALID);
    assert_contains(spmd_last_error(), "mark_sharding 'x': spec \"...");
    assert_contains(spmd_last_error(), "unexpected ';' at column 9001");
    assert_null(x->mark);

    /* A mesh text with a long gap: the column of the empty size shows. */
    char *gap = long_text("4x", " ", 10000, "x2");
    assert_null(spmd_mesh_parse(gap, "replica, fsdp"));
    assert_contains(spmd_last_error(), "empty size at column 3");

    free(junk);
    free(deep);
    free(many);
    free(gap);
    spmd_graph_free(g);
    spmd_mesh_free(m);
}

/* ---- HloSharding ----------------------------------------------------------------------- */

static void test_hlo_text(void **state)
{
    (void)state;
    static const struct {
        bool permuted;
        int rank;
        const char *spec, *hlo;
    } cases[] = {
        {false, 2, "fsdp, None", "{devices=[2,1,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}"},
        {false, 2, "(replica, fsdp), None", "{devices=[8,1]0,1,2,3,4,5,6,7}"},
        {false, 2, "(fsdp, replica), None", "{devices=[8,1]0,2,4,6,1,3,5,7}"},
        {false, 2, "None, fsdp", "{devices=[1,2,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}"},
        {false, 2, "replica, fsdp", "{devices=[4,2]0,1,2,3,4,5,6,7}"},
        {false, 2, "replica, None", "{devices=[4,1,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"},
        {false, 2, "None, None", "{replicated}"},
        {false, 0, "", "{replicated}"},
        {false, 2, "fsdp, None | partial(replica)",
         "{devices=[2,1,4]0,2,4,6,1,3,5,7 last_tile_dims={unreduced}}"},
        {false, 2, "None, None | partial(replica)",
         "{devices=[1,1,4,2]0,1,2,3,4,5,6,7 last_tile_dims={unreduced, replicated}}"},
        {false, 0, "| partial(replica, fsdp)", "{unreduced}"},
        /* Replicated groups are listed sorted, as XLA's PartialTile does. */
        {true, 2, "fsdp, None", "{devices=[2,1,4]0,1,4,5,2,3,6,7 last_tile_dim_replicate}"},
        {true, 2, "replica, fsdp", "{devices=[4,2]0,2,4,6,1,3,5,7}"},
    };
    spmd_mesh *plain = mesh_4x2(NULL), *permuted = mesh_4x2(PERMUTED);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const spmd_mesh *m = cases[i].permuted ? permuted : plain;
        sharding s;
        char buf[160];
        assert_int_equal(sharding_parse(cases[i].spec, m, cases[i].rank, &s), SPMD_OK);
        assert_string_equal(sharding_format_hlo(&s, m, buf, sizeof buf), cases[i].hlo);
    }
    spmd_mesh_free(plain);
    spmd_mesh_free(permuted);
}

/* ---- Blocks ------------------------------------------------------------------------------ */

static void test_blocks_and_padding(void **state)
{
    (void)state;
    spmd_mesh *m = mesh_4x2(NULL);
    sharding s;
    assert_int_equal(sharding_parse("replica, fsdp", m, 2, &s), SPMD_OK);
    const int64_t dims[2] = {10, 6};
    assert_int_equal(sharding_blocks(&s, m, 0), 4);
    assert_int_equal(sharding_block_size(&s, m, 0, 10), 3);
    const int64_t valid[4] = {3, 3, 3, 1};
    for (int b = 0; b < 4; b++) assert_int_equal(sharding_block_valid(&s, m, 0, 10, b), valid[b]);
    assert_int_equal(sharding_block_valid(&s, m, 0, 3, 3), 0); /* 3 over 4: 1, 1, 1, 0 */
    assert_true(sharding_has_padding(&s, m, dims));
    int64_t local[2];
    sharding_local_dims(&s, m, 2, dims, local);
    assert_int_equal(local[0], 3);
    assert_int_equal(local[1], 3);
    assert_int_equal(sharding_block_index(&s, m, 0, 5), 2);
    assert_int_equal(sharding_block_index(&s, m, 1, 5), 1);
    const int64_t even[2] = {8, 6};
    assert_false(sharding_has_padding(&s, m, even));

    sharding r = sharding_replicated(2);
    assert_int_equal(sharding_blocks(&r, m, 1), 1);
    assert_int_equal(sharding_block_size(&r, m, 1, 7), 7);
    assert_false(sharding_equal(&r, &s));
    spmd_mesh_free(m);
}

/* ---- Picture -------------------------------------------------------------------------------- */

static void test_visualize(void **state)
{
    (void)state;
    spmd_mesh *m = mesh_4x2(NULL);
    sharding s;
    char buf[1024];
    const int64_t dims[2] = {8, 4};
    assert_int_equal(sharding_parse("fsdp, None", m, 2, &s), SPMD_OK);
    int n = sharding_visualize(&s, m, 2, dims, buf, sizeof buf);
    assert_int_equal(n, (int)strlen(buf));
    assert_contains(buf, "[8, 4] as 'fsdp, None': blocks of [4, 4]\n");
    assert_contains(buf, "+---------+\n| 0,2,4,6 |\n+---------+\n| 1,3,5,7 |\n+---------+\n");

    assert_int_equal(sharding_parse("replica, fsdp", m, 2, &s), SPMD_OK);
    assert_true(sharding_visualize(&s, m, 2, dims, buf, sizeof buf) > 0);
    assert_contains(buf, "+---+---+\n| 0 | 1 |\n+---+---+\n| 2 | 3 |\n");
    assert_contains(buf, "| 6 | 7 |\n+---+---+\n");

    const int64_t ten[1] = {10};
    assert_int_equal(sharding_parse("replica", m, 1, &s), SPMD_OK);
    assert_true(sharding_visualize(&s, m, 1, ten, buf, sizeof buf) > 0);
    assert_contains(buf, "[10] as 'replica': blocks of [3], padded to [12]\n");
    assert_contains(buf, "| 0,1 | 2,3 | 4,5 | 6,7 |");

    /* Truncated output stays terminated and reports what it wrote. */
    char small[16];
    assert_int_equal(sharding_visualize(&s, m, 1, ten, small, sizeof small), 15);

    const int64_t three[3] = {2, 2, 2};
    assert_int_equal(sharding_parse("fsdp, None, None", m, 3, &s), SPMD_OK);
    assert_int_equal(sharding_visualize(&s, m, 3, three, buf, sizeof buf), -1);
    assert_contains(spmd_last_error(), "rank 3");
    spmd_mesh_free(m);
}

/* ---- Marks on a graph ------------------------------------------------------------------------ */

static void test_marks(void **state)
{
    (void)state;
    spmd_graph *g = spmd_graph_create(NULL), *other = spmd_graph_create(NULL);
    spmd_mesh *m = mesh_4x2(NULL), *same = mesh_4x2(NULL);
    spmd_mesh *data = spmd_mesh_parse("8", "data");
    const int64_t xd[2] = {16, 8}, wd[2] = {4, 8};
    spmd_tensor *x = spmd_input(g, "x", SPMD_F32, 2, xd);
    spmd_tensor *w = spmd_param(g, "w", 2, wd, (spmd_init){SPMD_INIT_ZEROS, 0});
    spmd_tensor *y = spmd_matmul(g, x, w, false, true);
    spmd_tensor *elsewhere = spmd_input(other, "z", SPMD_F32, 2, xd);
    char buf[160];

    assert_string_equal(spmd_get_sharding(x, buf, sizeof buf), "");
    assert_int_equal(spmd_mark_sharding(g, x, m, "('replica', 'fsdp'), None"), SPMD_OK);
    assert_int_equal(spmd_mark_sharding(g, w, same, "fsdp, None"), SPMD_OK); /* an equal mesh */
    assert_string_equal(spmd_get_sharding(x, buf, sizeof buf), "(replica, fsdp), None");
    assert_string_equal(spmd_get_hlo_sharding(x, buf, sizeof buf),
                        "{devices=[8,1]0,1,2,3,4,5,6,7}");
    assert_string_equal(spmd_get_sharding(w, buf, sizeof buf), "fsdp, None");
    assert_string_equal(spmd_get_sharding(y, buf, sizeof buf), "");
    assert_ptr_equal(g->mesh, m);

    /* A failed mark names the tensor and keeps the earlier mark. */
    assert_int_equal(spmd_mark_sharding(g, w, m, "fsdq, None"), SPMD_ERR_INVALID);
    assert_contains(spmd_last_error(),
                    "mark_sharding 'w': spec \"fsdq, None\": unknown axis 'fsdq'");
    assert_string_equal(spmd_get_sharding(w, buf, sizeof buf), "fsdp, None");
    assert_int_equal(spmd_mark_sharding(g, y, m, "replica"), SPMD_ERR_INVALID);
    assert_contains(spmd_last_error(), "#2 (matmul)");
    assert_contains(spmd_last_error(), "1 entry for a rank-2 tensor");

    assert_int_equal(spmd_mark_sharding(g, y, m, "None, None | partial(fsdp)"),
                     SPMD_ERR_UNSUPPORTED);
    assert_contains(spmd_last_error(), "partial(...)");
    assert_string_equal(spmd_get_sharding(y, buf, sizeof buf), "");

    assert_int_equal(spmd_mark_sharding(g, y, data, "data, None"), SPMD_ERR_INVALID);
    assert_contains(spmd_last_error(), "mesh 4x2 (replica, fsdp)");
    assert_contains(spmd_last_error(), "mesh 8 (data)");
    assert_int_equal(spmd_mark_sharding(g, elsewhere, m, "None, None"), SPMD_ERR_INVALID);
    assert_contains(spmd_last_error(), "another graph");
    spmd_clear_error();
    assert_int_equal(spmd_mark_sharding(g, NULL, m, "None"), SPMD_ERR_INVALID);
    assert_contains(spmd_last_error(), "tensor is NULL");

    /* The propagated sharding wins over the mark once it is there. */
    sharding propagated = sharding_replicated(2);
    propagated.partial = 1;
    y->sharding = &propagated;
    assert_string_equal(spmd_get_sharding(y, buf, sizeof buf), "None, None | partial(replica)");
    y->sharding = NULL;

    /* Clearing every mark frees the graph to use another mesh. */
    assert_int_equal(spmd_clear_sharding(x), SPMD_OK);
    assert_string_equal(spmd_get_sharding(x, buf, sizeof buf), "");
    assert_non_null(g->mesh);
    assert_int_equal(spmd_clear_sharding(w), SPMD_OK);
    assert_null(g->mesh);
    assert_int_equal(spmd_mark_sharding(g, y, data, "data, None"), SPMD_OK);
    assert_string_equal(spmd_get_hlo_sharding(y, buf, sizeof buf),
                        "{devices=[8,1]0,1,2,3,4,5,6,7}");

    spmd_graph_free(g);
    spmd_graph_free(other);
    spmd_mesh_free(m);
    spmd_mesh_free(same);
    spmd_mesh_free(data);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mesh_create_and_query),
        cmocka_unit_test(test_mesh_errors),
        cmocka_unit_test(test_groups),
        cmocka_unit_test(test_place_processes),
        cmocka_unit_test(test_spec_round_trip),
        cmocka_unit_test(test_spec_errors),
        cmocka_unit_test(test_long_spec_errors),
        cmocka_unit_test(test_hlo_text),
        cmocka_unit_test(test_blocks_and_padding),
        cmocka_unit_test(test_visualize),
        cmocka_unit_test(test_marks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
