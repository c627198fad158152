/*
 * The architecture the code keeps: the include order of the layers
 * (docs/DESIGN.md, "Layers"), and design sections cited by the sources:
 *
 *   base < ir < mesh < shard < compile < runtime < train, models < api < tools
 *
 * A file may include headers of its own layer or of layers below it, and
 * the public headers (spmd/) from anywhere; never a header from a layer
 * above.  This test reads every source file under src/ and tools/ and
 * fails on an include that goes up, or on a folder the order does not
 * name (a new folder must be given its place here and in the design).
 * Every section of the design a source file cites (the file name, a
 * comma, then quoted section names) must be a heading of docs/DESIGN.md.
 */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#ifndef SPMD_SOURCE_DIR
#error "SPMD_SOURCE_DIR must name the source tree"
#endif

static const struct {
    const char *folder;
    int rank;
} layers[] = {
    {"base", 0},    {"ir", 1},      {"mesh", 2},   {"shard", 3}, {"compile", 4},
    {"runtime", 5}, {"train", 6},   {"models", 6}, {"api", 7},    {"tools", 8},
};

/* Rank of a layer folder; -1 when the order does not name it. */
static int layer_rank(const char *folder, size_t len)
{
    for (size_t i = 0; i < sizeof layers / sizeof layers[0]; i++)
        if (strlen(layers[i].folder) == len && !strncmp(layers[i].folder, folder, len))
            return layers[i].rank;
    return -1;
}

/* Whether line `line` of a file in layer `rank` includes a header from a
 * layer above; writes the included path's folder to `folder`. */
static bool includes_upward(int rank, const char *line, char *folder, size_t size)
{
    const char *p = line;
    while (*p == ' ' || *p == '\t') p++;
    if (strncmp(p, "#include \"", 10) != 0) return false;
    p += 10;
    const char *slash = strchr(p, '/'), *quote = strchr(p, '"');
    if (!slash || !quote || slash > quote) return false; /* same folder: "cli.h" */
    size_t len = (size_t)(slash - p);
    snprintf(folder, size, "%.*s", (int)len, p);
    if (len == 4 && !strncmp(p, "spmd", 4)) return false; /* public headers */
    int to = layer_rank(p, len);
    return to < 0 || to > rank;
}

/* Scan every .c/.h/.def file of one folder; count and print violations. */
static int scan_folder(const char *root, const char *folder)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", root, folder);
    int rank = layer_rank(folder, strlen(folder));
    if (rank < 0) {
        print_error("folder %s is not in the layer order (tests/test_layers.c)\n", dir);
        return 1;
    }
    DIR *d = opendir(dir);
    if (!d) {
        print_error("cannot open %s\n", dir);
        return 1;
    }
    int bad = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *dot = strrchr(e->d_name, '.');
        if (!dot || (strcmp(dot, ".c") && strcmp(dot, ".h") && strcmp(dot, ".def"))) continue;
        char path[1536];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) {
            print_error("cannot read %s\n", path);
            bad++;
            continue;
        }
        char line[1024], to[64];
        for (int n = 1; fgets(line, sizeof line, f); n++) {
            if (!includes_upward(rank, line, to, sizeof to)) continue;
            print_error("%s:%d: layer %s includes from %s, %s: %s", path, n, folder, to,
                        layer_rank(to, strlen(to)) < 0 ? "a folder outside the order"
                                                       : "a layer above it",
                        line);
            bad++;
        }
        fclose(f);
    }
    closedir(d);
    return bad;
}

static void test_every_include_goes_down(void **state)
{
    (void)state;
    char src[1024];
    snprintf(src, sizeof src, "%s/src", SPMD_SOURCE_DIR);
    DIR *d = opendir(src);
    assert_non_null(d);
    int bad = 0, folders = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' || e->d_type != DT_DIR) continue;
        bad += scan_folder(src, e->d_name);
        folders++;
    }
    closedir(d);
    bad += scan_folder(SPMD_SOURCE_DIR, "tools");
    assert_int_equal(folders, 9); /* base ir mesh shard compile runtime train models api */
    assert_int_equal(bad, 0);
}

/* ---- Design citations ---------------------------------------------------------------- */

/* Whether docs/DESIGN.md has a heading `title` ("## Title", any depth). */
static bool design_has_heading(const char *title)
{
    char path[1024], line[512];
    snprintf(path, sizeof path, "%s/docs/DESIGN.md", SPMD_SOURCE_DIR);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
        if (line[0] != '#') continue;
        char *p = line;
        while (*p == '#') p++;
        while (*p == ' ') p++;
        p[strcspn(p, "\n")] = '\0';
        found = !strcmp(p, title);
    }
    fclose(f);
    return found;
}

/* Check every citation in one file: the design's file name, a comma, and
 * one quoted section name or several joined by "and".  Returns the bad
 * ones. */
static int check_citations(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int bad = 0;
    char line[1024];
    for (int n = 1; fgets(line, sizeof line, f); n++) {
        const char *p = strstr(line, "DESIGN.md, \"");
        if (!p) continue;
        p += strlen("DESIGN.md, ");
        while (*p == '"') {
            const char *end = strchr(p + 1, '"');
            if (!end) break;
            char title[256];
            snprintf(title, sizeof title, "%.*s", (int)(end - p - 1), p + 1);
            if (!design_has_heading(title)) {
                print_error("%s:%d cites \"%s\", which docs/DESIGN.md has no heading for\n", path,
                            n, title);
                bad++;
            }
            p = end + 1;
            while (*p == ' ' || !strncmp(p, "and ", 4)) p += *p == ' ' ? 1 : 4;
        }
    }
    fclose(f);
    return bad;
}

static int check_folder_citations(const char *folder, int *files)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", SPMD_SOURCE_DIR, folder);
    DIR *d = opendir(dir);
    if (!d) return 0;
    int bad = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[1536];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (e->d_type == DT_DIR) {
            char sub[1024];
            snprintf(sub, sizeof sub, "%s/%s", folder, e->d_name);
            bad += check_folder_citations(sub, files);
            continue;
        }
        bad += check_citations(path);
        (*files)++;
    }
    closedir(d);
    return bad;
}

static void test_design_citations_exist(void **state)
{
    (void)state;
    assert_true(design_has_heading("Layers"));
    assert_false(design_has_heading("No such section"));
    int files = 0, bad = 0;
    const char *folders[] = {"src", "include", "tools", "tests", "bench", "examples"};
    for (size_t i = 0; i < sizeof folders / sizeof folders[0]; i++)
        bad += check_folder_citations(folders[i], &files);
    assert_true(files > 50);
    assert_int_equal(bad, 0);
}

/* The checker itself: it must see an upward include, and only that. */
static void test_checker_sees_violations(void **state)
{
    (void)state;
    char to[64];
    int shard = layer_rank("shard", 5), runtime = layer_rank("runtime", 7);
    assert_true(includes_upward(shard, "#include \"runtime/executor.h\"\n", to, sizeof to));
    assert_string_equal(to, "runtime");
    assert_true(includes_upward(shard, "#include \"nowhere/x.h\"\n", to, sizeof to));
    assert_false(includes_upward(runtime, "#include \"shard/partition.h\"\n", to, sizeof to));
    assert_false(includes_upward(shard, "#include \"shard/cost.h\"\n", to, sizeof to));
    assert_false(includes_upward(0, "#include \"spmd/spmd.h\"\n", to, sizeof to));
    assert_false(includes_upward(0, "#include <stdio.h>\n", to, sizeof to));
    assert_false(includes_upward(7, "#include \"cli.h\"\n", to, sizeof to));
    assert_int_equal(layer_rank("train", 5), layer_rank("models", 6));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checker_sees_violations),
        cmocka_unit_test(test_every_include_goes_down),
        cmocka_unit_test(test_design_citations_exist),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
