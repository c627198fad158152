/*
 * The architecture the code keeps: the include order of the layers
 * (docs/DESIGN.md, "Layers"):
 *
 *   base < ir < mesh < shard < compile < runtime < train, models < api < tools
 *
 * A file may include headers of its own layer or of layers below it, and
 * the public headers (spmd/) from anywhere; never a header from a layer
 * above.  This test reads every source file under src/ and tools/, their
 * subfolders too (src/runtime/kernels/ is part of runtime), and fails on
 * an include that goes up, or on a folder the order does not name (a new
 * folder must be given its place here and in the design).  A path that
 * starts with a subfolder of the file's own layer stays in it (tools/
 * includes its headers by their path from tools/: "commands/train.h").
 * A private header, NAME_impl.h, is what the files of one family share
 * (collectives_impl.h: collectives_shm.c, collectives_tree.c, ...;
 * collectives_mpi_impl.h: the collectives_mpi*.c files): only files of its
 * own folder named NAME or NAME_... include it.
 * (The design sections the sources cite are checked by test_docs.)
 * Inside a layer the order allows any include, so the headers of src/
 * are also checked for an include circle.
 *
 * Inside tools/ the modules (each a .c with its own .h beside it, in
 * tools/ or a subfolder: commands/) keep an order of their own
 * (tool_groups below): a module may include its own header and those of
 * modules in earlier groups, so no include can go round in a circle.
 *
 * Every folder of src/ (a module: base, ir, ...; its subfolders are
 * families inside it) has a test home: tests/<folder>/ holding at least
 * one test_*.c, so a module's tests are found by its name and a new
 * module comes with its tests (docs/tests.md).
 */
#include <dirent.h>
#include <stdlib.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "support_files.h"

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

/* Whether `word` (its first `len` characters) is one of `words`,
 * space-separated. */
static bool names_word(const char *words, const char *word, size_t len)
{
    for (const char *p = words; *p;) {
        size_t n = strcspn(p, " ");
        if (n == len && !strncmp(p, word, len)) return true;
        p += n;
        while (*p == ' ') p++;
    }
    return false;
}

/* Whether line `line` of a file in layer `rank` includes a header from a
 * layer above; writes the included path's folder to `folder`.  `own`
 * names the layer's subfolders (space-separated): a path from the
 * layer's own folder ("commands/train.h" in tools/) stays in it. */
static bool includes_upward(int rank, const char *own, const char *line, char *folder,
                            size_t size)
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
    if (names_word(own, p, len)) return false;
    int to = layer_rank(p, len);
    return to < 0 || to > rank;
}

/* Whether `file` of `folder` may include `path` (as written in the
 * include): anything but a private header NAME_impl.h, which only the
 * files of its family (NAME.c, NAME_*.c, NAME_*.h) in its folder may. */
static bool may_include(const char *folder, const char *file, const char *path)
{
    const char *slash = strrchr(path, '/'), *name = slash ? slash + 1 : path;
    size_t n = strlen(name), suffix = strlen("_impl.h");
    if (n <= suffix || strcmp(name + n - suffix, "_impl.h")) return true;
    if (slash && (strlen(folder) != (size_t)(slash - path) ||
                  strncmp(folder, path, (size_t)(slash - path))))
        return false;
    size_t family = n - suffix;
    return !strncmp(file, name, family) && (file[family] == '.' || file[family] == '_');
}

/* The names of the subfolders of root/folder, space-separated, into out. */
static void subfolders(const char *root, const char *folder, char *out, size_t size)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", root, folder);
    size_t n = 0;
    out[0] = '\0';
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.' && e->d_type == DT_DIR)
            n += (size_t)snprintf(out + n, size - n, "%s%s", n ? " " : "", e->d_name);
    closedir(d);
    assert_true(n < size);
}

/* Scan every .c/.h/.def file of one folder under root ("runtime",
 * "runtime/kernels") and of its subfolders; its layer is the path's first
 * part, whose subfolders `own` names.  Counts and prints violations. */
static int scan_folder(const char *root, const char *folder, const char *own)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", root, folder);
    int rank = layer_rank(folder, strcspn(folder, "/"));
    if (rank < 0) {
        print_error("folder %s is not in the layer order (tests/project/test_layers.c)\n", dir);
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
        if (e->d_name[0] != '.' && e->d_type == DT_DIR) {
            char sub[1024];
            snprintf(sub, sizeof sub, "%s/%s", folder, e->d_name);
            bad += scan_folder(root, sub, own);
            continue;
        }
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
            const char *inc = line + strspn(line, " \t");
            const char *end = strncmp(inc, "#include \"", 10) ? NULL : strchr(inc + 10, '"');
            if (end) {
                char path_inc[256];
                snprintf(path_inc, sizeof path_inc, "%.*s", (int)(end - inc - 10), inc + 10);
                if (!may_include(folder, e->d_name, path_inc)) {
                    print_error("%s:%d: %s includes %s, a private header of another family\n",
                                path, n, e->d_name, path_inc);
                    bad++;
                }
            }
            if (!includes_upward(rank, own, line, to, sizeof to)) continue;
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
    char own[512];
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' || e->d_type != DT_DIR) continue;
        subfolders(src, e->d_name, own, sizeof own);
        bad += scan_folder(src, e->d_name, own);
        folders++;
    }
    closedir(d);
    subfolders(SPMD_SOURCE_DIR, "tools", own, sizeof own);
    bad += scan_folder(SPMD_SOURCE_DIR, "tools", own);
    assert_int_equal(folders, 9); /* base ir mesh shard compile runtime train models api */
    assert_int_equal(bad, 0);
}

/* ---- The order inside tools/ ---------------------------------------------------------- */

/* tools/ modules from the bottom up; a group's modules never include one
 * another.  The entry point (spmd.c) has no header. */
static const char *const tool_groups[] = {
    "message unicode_class",                          /* cli_fail; code point classes */
    "processes bpe",                                  /* MPI; GPT-2's BPE */
    /* leaves; a command's settings; the log; a launch's hosts and its mpirun watched */
    "test_hooks json_file plot vocab weights options run_log launch_hosts launch_watch",
    "flag_spec plot_curves plot_trace",               /* a flag row; training curves, a trace's step */
    "flag_values",                                    /* reading a flag's value */
    "flag_table",                                     /* the flag table and the commands */
    "flag_usage settings_agree",                      /* usage text; settings across processes */
    "flag_settle paths",                              /* defaults across flags; a command's paths */
    "flags",                                          /* the parser, the commands' interface */
    "copies",                                         /* per-copy settings */
    "model",                                          /* build, marks, compile */
    "feed report run_checkpoint trace explain_trace", /* pieces of a run; a trace read back */
    "train explain sample export visualize plot_cmd tokenize launch", /* the commands */
    "spmd",                                           /* main */
};
static const char *const tool_entry_point = "spmd";

/* One source file by name and text: the real tree's, or a test's own. */
typedef struct source_text {
    const char *name; /* "flags.c", "commands/train.c": its path from the folder */
    const char *text;
} source_text;

/* The group of module `name` (its first `len` characters); -1 if none. */
static int module_group(const char *const *groups, size_t n_groups, const char *name, size_t len)
{
    for (size_t g = 0; g < n_groups; g++)
        for (const char *p = groups[g]; *p;) {
            size_t n = strcspn(p, " ");
            if (n == len && !strncmp(p, name, len)) return (int)g;
            p += n;
            while (*p == ' ') p++;
        }
    return -1;
}

/* The file name of a path ("commands/train.c": "train.c"). */
static const char *base_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* The module of a file name ("flags.c": "flags"), as a length of it. */
static size_t module_len(const char *file)
{
    const char *dot = strrchr(file, '.');
    return dot ? (size_t)(dot - file) : strlen(file);
}

/* Whether a file is named `stem` (its first `len` characters) + `ext`;
 * with `any_folder`, in any folder ("train" finds "commands/train.c"). */
static bool has_file(const source_text *files, size_t n, const char *stem, size_t len,
                     const char *ext, bool any_folder)
{
    for (size_t i = 0; i < n; i++) {
        const char *name = any_folder ? base_name(files[i].name) : files[i].name;
        if (module_len(name) == len && !strncmp(name, stem, len) && !strcmp(name + len, ext))
            return true;
    }
    return false;
}

/* The module an include names, as a pointer into it and a length: a
 * header with no folder ("x.h"), or one of `files` by its path
 * ("commands/train.h"); 0 for any other (a layer's or a system's). */
static size_t included_module(const source_text *files, size_t n, const char *inc, size_t len,
                              const char **module)
{
    if (len <= 2 || strncmp(inc + len - 2, ".h", 2)) return 0;
    const char *slash = memchr(inc, '/', len);
    if (slash) {
        bool listed = false;
        for (size_t i = 0; i < n && !listed; i++)
            listed = strlen(files[i].name) == len && !strncmp(files[i].name, inc, len);
        if (!listed) return 0;
        while ((slash = memchr(inc, '/', len))) len -= (size_t)(slash + 1 - inc), inc = slash + 1;
    }
    *module = inc;
    return len - 2;
}

/* Check one folder's files against `groups`: every file's module is in
 * the order, every .c but the entry point's has its .h beside it, every
 * module of the order has files, and every include of a module's header
 * ("x.h", "commands/x.h") names the file's own module or one of an
 * earlier group.  Prints each violation; returns their count. */
static int check_module_order(const char *folder, const char *const *groups, size_t n_groups,
                              const char *entry, const source_text *files, size_t n_files)
{
    int bad = 0;
    for (size_t i = 0; i < n_files; i++) {
        const char *path = files[i].name, *name = base_name(path);
        size_t len = module_len(name);
        int from = module_group(groups, n_groups, name, len);
        if (from < 0) {
            print_error("%s/%s: module %.*s is not in the order (tests/project/test_layers.c, "
                        "tool_groups)\n", folder, path, (int)len, name);
            bad++;
            continue;
        }
        if (!strcmp(name + len, ".c") && strncmp(name, entry, len) &&
            !has_file(files, n_files, path, module_len(path), ".h", false)) {
            print_error("%s/%s has no header %.*s.h of its own\n", folder, path, (int)len, name);
            bad++;
        }
        int line = 1;
        for (const char *p = files[i].text; *p; line++) {
            const char *end = strchr(p, '\n');
            size_t n = end ? (size_t)(end - p) : strlen(p);
            const char *q = p;
            while (q < p + n && (*q == ' ' || *q == '\t')) q++;
            if ((size_t)(p + n - q) > 10 && !strncmp(q, "#include \"", 10)) {
                const char *inc = q + 10, *quote = memchr(inc, '"', (size_t)(p + n - inc));
                size_t inc_len = quote ? (size_t)(quote - inc) : 0;
                const char *module = NULL;
                size_t mod = included_module(files, n_files, inc, inc_len, &module);
                int to = mod ? module_group(groups, n_groups, module, mod) : -1;
                bool own = mod == len && !strncmp(module, name, len);
                if (mod && !own && (to < 0 || to >= from)) {
                    print_error("%s/%s:%d: module %.*s (group %d) includes %.*s, %s\n", folder,
                                path, line, (int)len, name, from, (int)inc_len, inc,
                                to < 0   ? "of no module in the order"
                                : to > from ? "of a later group"
                                            : "of its own group (modules of a group include "
                                              "none of the others)");
                    bad++;
                }
            }
            p += n + (end != NULL);
        }
    }
    for (size_t g = 0; g < n_groups; g++)
        for (const char *p = groups[g]; *p;) {
            size_t n = strcspn(p, " ");
            if (!has_file(files, n_files, p, n, ".c", true) &&
                !has_file(files, n_files, p, n, ".h", true)) {
                print_error("%s: the order names module %.*s, which has no file\n", folder, (int)n,
                            p);
                bad++;
            }
            p += n;
            while (*p == ' ') p++;
        }
    return bad;
}

/* The files of root/sub and its subfolders whose extension is one of
 * `exts` (space-separated: ".c .h"), read whole and named by their path
 * from root ("runtime/kernels/kernels.h"; names and texts on the heap),
 * after the n already in `files`; returns the new count. */
static size_t read_sources(const char *root, const char *sub, const char *exts,
                           source_text *files, size_t n, size_t room)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s%s%s", root, *sub ? "/" : "", sub);
    DIR *d = opendir(dir);
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d));) {
        char name[512];
        snprintf(name, sizeof name, "%s%s%s", sub, *sub ? "/" : "", e->d_name);
        if (e->d_name[0] != '.' && e->d_type == DT_DIR) {
            n = read_sources(root, name, exts, files, n, room);
            continue;
        }
        const char *dot = strrchr(e->d_name, '.');
        if (!dot || !names_word(exts, dot, strlen(dot))) continue;
        assert_true(n < room);
        char path[1536];
        snprintf(path, sizeof path, "%s/%s", root, name);
        size_t size;
        files[n++] = (source_text){strdup(name), support_read_file(path, &size)};
        assert_non_null(files[n - 1].name);
    }
    closedir(d);
    return n;
}

/* The .c and .h files of tools/, subfolders too, named by their path
 * from tools/. */
static size_t read_tool_files(source_text *files, size_t room)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tools", SPMD_SOURCE_DIR);
    return read_sources(dir, "", ".c .h", files, 0, room);
}

static void free_tool_files(source_text *files, size_t n)
{
    for (size_t i = 0; i < n; i++) free((char *)files[i].name), free((char *)files[i].text);
}

static int check_tools(const source_text *files, size_t n)
{
    return check_module_order("tools", tool_groups, sizeof tool_groups / sizeof *tool_groups,
                              tool_entry_point, files, n);
}

enum { MAX_TOOL_FILES = 128 };

static void test_tools_keep_their_order(void **state)
{
    (void)state;
    source_text files[MAX_TOOL_FILES];
    size_t n = read_tool_files(files, MAX_TOOL_FILES);
    assert_true(n > 20);
    assert_int_equal(check_tools(files, n), 0);
    free_tool_files(files, n);
}

/* The tools/ text of `name`, with `line` added after its first line. */
static char *planted(const source_text *files, size_t n, const char *name, const char *line)
{
    for (size_t i = 0; i < n; i++) {
        if (strcmp(files[i].name, name)) continue;
        const char *text = files[i].text, *nl = strchr(text, '\n');
        size_t head = nl ? (size_t)(nl - text) + 1 : strlen(text);
        char *out = malloc(strlen(text) + strlen(line) + 2);
        assert_non_null(out);
        sprintf(out, "%.*s%s\n%s", (int)head, text, line, text + head);
        return out;
    }
    fail_msg("no tools/%s", name);
    return NULL;
}

/* The check on the real files with an include circle planted in memory:
 * it fails, naming the include that closes the circle, and only then. */
static void test_tools_order_sees_a_circle(void **state)
{
    (void)state;
    source_text files[MAX_TOOL_FILES];
    size_t n = read_tool_files(files, MAX_TOOL_FILES);
    source_text copy[MAX_TOOL_FILES];
    memcpy(copy, files, n * sizeof *files);
    /* flags.c <- commands/train.c already (train includes flags.h);
     * flags.c including commands/train.h closes a circle, from a
     * subfolder's header as from one beside it. */
    for (size_t i = 0; i < n; i++)
        if (!strcmp(copy[i].name, "flags.c"))
            copy[i].text = planted(files, n, "flags.c", "#include \"commands/train.h\"");
    assert_int_equal(check_tools(copy, n), 1);
    for (size_t i = 0; i < n; i++)
        if (copy[i].text != files[i].text) free((char *)copy[i].text), copy[i].text = files[i].text;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(copy[i].name, "flags.c"))
            copy[i].text = planted(files, n, "flags.c", "#include \"train.h\"");
    assert_int_equal(check_tools(copy, n), 1);
    for (size_t i = 0; i < n; i++)
        if (copy[i].text != files[i].text) free((char *)copy[i].text), copy[i].text = files[i].text;
    /* Two modules of one group that include each other. */
    for (size_t i = 0; i < n; i++) {
        if (!strcmp(copy[i].name, "feed.h")) copy[i].text = planted(files, n, "feed.h", "#include \"report.h\"");
        if (!strcmp(copy[i].name, "report.h")) copy[i].text = planted(files, n, "report.h", "#include \"feed.h\"");
    }
    assert_int_equal(check_tools(copy, n), 2);
    for (size_t i = 0; i < n; i++)
        if (copy[i].text != files[i].text) free((char *)copy[i].text), copy[i].text = files[i].text;
    free_tool_files(files, n);
}

/* ---- No include circle among src/'s headers ------------------------------------------------- */

/* Within a layer the order says nothing, so two headers of one folder
 * could include each other; this finds such a circle on the include
 * graph of the headers (a name "ir/ir.h" and its text each). */
enum { MAX_HEADERS = 256 };

static int header_index(const source_text *hs, size_t n, const char *name, size_t len)
{
    for (size_t i = 0; i < n; i++)
        if (strlen(hs[i].name) == len && !strncmp(hs[i].name, name, len)) return (int)i;
    return -1;
}

/* The headers header i includes: project headers by their path from
 * src/ ("ir/ir.h") or, without a folder, from header i's own. */
static int header_edges(const source_text *hs, size_t n, size_t i, int *to)
{
    int k = 0;
    const char *slash = strrchr(hs[i].name, '/');
    size_t folder = slash ? (size_t)(slash - hs[i].name) + 1 : 0;
    for (const char *p = hs[i].text; (p = strstr(p, "#include \""));) {
        p += 10;
        const char *q = strchr(p, '"');
        if (!q) break;
        char path[256];
        if (memchr(p, '/', (size_t)(q - p)))
            snprintf(path, sizeof path, "%.*s", (int)(q - p), p);
        else
            snprintf(path, sizeof path, "%.*s%.*s", (int)folder, hs[i].name, (int)(q - p), p);
        int j = header_index(hs, n, path, strlen(path));
        if (j >= 0) to[k++] = j;
        p = q;
    }
    return k;
}

/* Depth-first from header i: 1 on a circle, printed from where it
 * closes. */
static int find_circle(const source_text *hs, size_t n, size_t i, char *state, int *stack, int depth)
{
    state[i] = 1; /* on the path */
    stack[depth] = (int)i;
    int to[64], k = header_edges(hs, n, i, to);
    for (int e = 0; e < k; e++) {
        if (state[to[e]] == 1) {
            print_error("include circle:");
            int from = depth;
            while (stack[from] != to[e]) from--;
            for (int d = from; d <= depth; d++) print_error(" %s ->", hs[stack[d]].name);
            print_error(" %s\n", hs[to[e]].name);
            return 1;
        }
        if (!state[to[e]] && find_circle(hs, n, (size_t)to[e], state, stack, depth + 1)) return 1;
    }
    state[i] = 2; /* done */
    return 0;
}

/* 1 when the headers hold a circle (the first one found is printed). */
static int count_circles(const source_text *hs, size_t n)
{
    char state[MAX_HEADERS] = {0};
    int stack[MAX_HEADERS];
    for (size_t i = 0; i < n; i++)
        if (!state[i] && find_circle(hs, n, i, state, stack, 0)) return 1;
    return 0;
}

/* Every header under src/, named by its path from src/ ("ir/ir.h"). */
static size_t read_src_headers(source_text *hs, size_t room)
{
    char src[1024];
    snprintf(src, sizeof src, "%s/src", SPMD_SOURCE_DIR);
    return read_sources(src, "", ".h .def", hs, 0, room);
}

static void test_no_include_circle_in_src(void **state)
{
    (void)state;
    source_text hs[MAX_HEADERS];
    size_t n = read_src_headers(hs, MAX_HEADERS);
    assert_true(n > 40);
    assert_int_equal(count_circles(hs, n), 0);
    /* The check sees one planted in memory: two headers of one folder. */
    const source_text planted_pair[] = {
        {"ir/a.h", "#include \"ir/b.h\"\n#include <stdio.h>\n"},
        {"ir/b.h", "#include \"c.h\"\n"},
        {"ir/c.h", "#include \"ir/a.h\"\n"},
        {"ir/d.h", "#include \"ir/a.h\"\n"},
    };
    assert_int_equal(count_circles(planted_pair, 4), 1);
    assert_int_equal(count_circles(planted_pair + 3, 1), 0);
    for (size_t i = 0; i < n; i++) free((char *)hs[i].name), free((char *)hs[i].text);
}

/* ---- A test home for every module of src/ -------------------------------------------------- */

enum { MAX_TESTS = 256 };

/* How many of `modules` (folders of src/) have no test among `tests`
 * (paths under tests/: "ir/test_graph.c"); prints each. */
static int count_homeless(const char *const *modules, size_t n_modules, const char *const *tests,
                          size_t n_tests)
{
    int bad = 0;
    for (size_t m = 0; m < n_modules; m++) {
        size_t len = strlen(modules[m]);
        bool found = false;
        for (size_t t = 0; t < n_tests && !found; t++)
            found = !strncmp(tests[t], modules[m], len) && !strncmp(tests[t] + len, "/test_", 6) &&
                    !strchr(tests[t] + len + 1, '/') &&
                    !strcmp(tests[t] + strlen(tests[t]) - 2, ".c");
        if (!found) {
            print_error("src/%s has no test home: no tests/%s/test_*.c\n", modules[m], modules[m]);
            bad++;
        }
    }
    return bad;
}

/* The names of the folders under `dir` (on the heap). */
static size_t read_folders(const char *dir, char **out, size_t room)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    size_t n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.' || e->d_type != DT_DIR) continue;
        assert_true(n < room);
        out[n] = strdup(e->d_name);
        assert_non_null(out[n++]);
    }
    closedir(d);
    return n;
}

static void test_every_module_has_a_test_home(void **state)
{
    (void)state;
    char path[1024], *modules[32], *folders[32], *tests[MAX_TESTS];
    snprintf(path, sizeof path, "%s/src", SPMD_SOURCE_DIR);
    size_t n_modules = read_folders(path, modules, 32);
    snprintf(path, sizeof path, "%s/tests", SPMD_SOURCE_DIR);
    size_t n_folders = read_folders(path, folders, 32), n_tests = 0;
    for (size_t f = 0; f < n_folders; f++) {
        char dir[1536];
        snprintf(dir, sizeof dir, "%s/%s", path, folders[f]);
        DIR *d = opendir(dir);
        assert_non_null(d);
        for (struct dirent *e; (e = readdir(d));) {
            if (e->d_type != DT_REG) continue;
            assert_true(n_tests < MAX_TESTS);
            tests[n_tests] = malloc(strlen(folders[f]) + strlen(e->d_name) + 2);
            assert_non_null(tests[n_tests]);
            sprintf(tests[n_tests++], "%s/%s", folders[f], e->d_name);
        }
        closedir(d);
    }
    assert_true(n_modules >= 9 && n_tests > 50);
    assert_int_equal(count_homeless((const char *const *)modules, n_modules,
                                    (const char *const *)tests, n_tests), 0);

    /* A module planted in memory without a home fails, and so does one
     * whose folder holds no test_*.c or holds one only deeper down. */
    const char *with_new[33];
    memcpy(with_new, modules, n_modules * sizeof *modules);
    with_new[n_modules] = "plan";
    assert_int_equal(count_homeless(with_new, n_modules + 1, (const char *const *)tests, n_tests), 1);
    const char *const planted_modules[] = {"ir", "mesh", "shard"};
    const char *const planted_tests[] = {"ir/test_graph.c", "mesh/support_mesh.c",
                                         "shard/deeper/test_x.c", "mesh/test_mesh.py"};
    assert_int_equal(count_homeless(planted_modules, 3, planted_tests, 4), 2);
    assert_int_equal(count_homeless(planted_modules, 1, planted_tests, 1), 0);

    for (size_t i = 0; i < n_modules; i++) free(modules[i]);
    for (size_t i = 0; i < n_folders; i++) free(folders[i]);
    for (size_t i = 0; i < n_tests; i++) free(tests[i]);
}

/* The other rules, on files made up here. */
static void test_module_order_rules(void **state)
{
    (void)state;
    static const char *const groups[] = {"base", "middle other", "top"};
    const source_text ok[] = {
        {"base.h", "#include <stdio.h>\n"},
        {"base.c", "#include \"base.h\"\n"},
        {"middle.h", "#include \"base.h\"\n#include \"spmd/spmd.h\"\n"},
        {"middle.c", "#include \"middle.h\"\n#include \"base.h\"\n#include \"mesh/mesh.h\"\n"},
        {"other.h", ""},
        {"other.c", "#include \"other.h\"\n"},
        {"top.c", "#include \"middle.h\"\n#include \"other.h\"\n"},
    };
    assert_int_equal(check_module_order("t", groups, 3, "top", ok, 7), 0);
    source_text bad[7];
    memcpy(bad, ok, sizeof ok);
    bad[1].text = "#include \"base.h\"\n#include \"top.h\"\n"; /* up, to a later group */
    assert_int_equal(check_module_order("t", groups, 3, "top", bad, 7), 1);
    memcpy(bad, ok, sizeof ok);
    bad[5].text = "#include \"other.h\"\n  #include \"middle.h\"\n"; /* its own group */
    assert_int_equal(check_module_order("t", groups, 3, "top", bad, 7), 1);
    memcpy(bad, ok, sizeof ok);
    bad[4] = (source_text){"stray.h", ""}; /* a module outside the order; other.c loses its .h */
    assert_int_equal(check_module_order("t", groups, 3, "top", bad, 7), 2);
    /* An entry point other than the order's last needs its header. */
    assert_int_equal(check_module_order("t", groups, 3, "base", ok, 7), 1);
    /* A module in a subfolder: included by its path, its header beside it. */
    static const char *const flat[] = {"base", "middle", "top"};
    source_text nested[] = {
        {"base.h", ""},
        {"base.c", "#include \"base.h\"\n"},
        {"sub/middle.h", "#include \"base.h\"\n"},
        {"sub/middle.c", "#include \"sub/middle.h\"\n"},
        {"top.c", "#include \"sub/middle.h\"\n#include \"base.h\"\n"},
    };
    assert_int_equal(check_module_order("t", flat, 3, "top", nested, 5), 0);
    nested[1].text = "#include \"sub/middle.h\"\n"; /* up, from a subfolder's module */
    assert_int_equal(check_module_order("t", flat, 3, "top", nested, 5), 1);
    nested[1].text = "#include \"base.h\"\n";
    nested[2].name = "middle.h"; /* a header not beside its .c */
    assert_int_equal(check_module_order("t", flat, 3, "top", nested, 5), 1);
}

/* The checker itself: it must see an upward include, and only that. */
static void test_checker_sees_violations(void **state)
{
    (void)state;
    char to[64];
    int shard = layer_rank("shard", 5), runtime = layer_rank("runtime", 7);
    assert_true(includes_upward(shard, "", "#include \"runtime/executor.h\"\n", to, sizeof to));
    assert_string_equal(to, "runtime");
    assert_true(includes_upward(shard, "", "#include \"nowhere/x.h\"\n", to, sizeof to));
    assert_false(includes_upward(runtime, "", "#include \"shard/partition.h\"\n", to, sizeof to));
    assert_false(includes_upward(shard, "", "#include \"shard/cost.h\"\n", to, sizeof to));
    assert_false(includes_upward(0, "", "#include \"spmd/spmd.h\"\n", to, sizeof to));
    assert_false(includes_upward(0, "", "#include <stdio.h>\n", to, sizeof to));
    assert_false(includes_upward(7, "", "#include \"cli.h\"\n", to, sizeof to));
    /* A path from the layer's own folder: its subfolders only. */
    int tools = layer_rank("tools", 5);
    assert_false(includes_upward(tools, "commands", "#include \"commands/train.h\"\n", to, sizeof to));
    assert_true(includes_upward(tools, "", "#include \"commands/train.h\"\n", to, sizeof to));
    assert_true(includes_upward(runtime, "kernels collectives", "#include \"commandos/x.h\"\n", to,
                                sizeof to));
    assert_false(includes_upward(runtime, "kernels collectives", "#include \"runtime/kernels/kernels.h\"\n",
                                 to, sizeof to));
    assert_int_equal(layer_rank("train", 5), layer_rank("models", 6));
    /* Private headers: their family only, in their folder. */
    const char *coll = "runtime/collectives";
    assert_true(may_include(coll, "collectives_shm.c", "runtime/collectives/collectives_impl.h"));
    assert_true(may_include(coll, "collectives_mpi_impl.h", "runtime/collectives/collectives_impl.h"));
    assert_true(may_include(coll, "collectives_mpi.c", "runtime/collectives/collectives_mpi_impl.h"));
    assert_true(may_include(coll, "collectives_mpi_xfer.c", "runtime/collectives/collectives_mpi_impl.h"));
    assert_true(may_include("runtime/kernels", "kernels_collective.c", "runtime/collectives/collectives.h"));
    assert_false(may_include("runtime/kernels", "kernels_collective.c",
                             "runtime/collectives/collectives_impl.h"));
    assert_false(may_include(coll, "collectives_shm.c", "runtime/collectives/collectives_mpi_impl.h"));
    assert_false(may_include(coll, "collectivesx.c", "runtime/collectives/collectives_impl.h"));
    /* Its own folder only: not the folder above, nor another layer's. */
    assert_false(may_include("runtime", "collectives_x.c", "runtime/collectives/collectives_impl.h"));
    assert_false(may_include("tools", "collectives.c", "runtime/collectives/collectives_impl.h"));
    assert_true(may_include("tools", "flags.c", "flags.h"));
    assert_true(may_include("runtime", "executor_run.c", "runtime/executor_impl.h"));
    assert_false(may_include("runtime", "executorx.c", "runtime/executor_impl.h"));
    assert_true(may_include("compile", "plan_marks.c", "plan_impl.h"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checker_sees_violations),
        cmocka_unit_test(test_every_include_goes_down),
        cmocka_unit_test(test_no_include_circle_in_src),
        cmocka_unit_test(test_every_module_has_a_test_home),
        cmocka_unit_test(test_module_order_rules),
        cmocka_unit_test(test_tools_keep_their_order),
        cmocka_unit_test(test_tools_order_sees_a_circle),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
