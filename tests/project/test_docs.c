/*
 * The documentation stays whole (README.md and docs/):
 *
 *   - every relative link of README.md and docs/ (any depth) resolves: the
 *     file exists, and a `#anchor` names a heading of the target by
 *     GitHub's rule (lower case, punctuation dropped, spaces to hyphens, a
 *     repeated heading numbered -1, -2, ...);
 *   - README.md stays short (README_MAX_LINES), the rest living in docs/;
 *   - docs/DESIGN.md's table of sections lists every heading of the design
 *     pages (docs/design/) with a link to it, and every section a source
 *     cites (`docs/DESIGN.md, "Errors"`, or several joined by "," or "and",
 *     across comment lines too) is in that table, so the citations in
 *     src/, tools/, python/, include/, tests/ and the scripts cannot rot.
 *
 * The checks are functions of text, run here on the real tree and on
 * small documents with a fault planted.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <ctype.h>
#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "support_files.h"

#ifndef SPMD_SOURCE_DIR
#error "SPMD_SOURCE_DIR must name the source tree"
#endif

enum { README_MAX_LINES = 250, MAX_NAME = 256, MAX_ITEMS = 4096 };

/* A list of strings (headings' slugs, section names, file paths). */
typedef struct list {
    int n;
    char *item[MAX_ITEMS];
} list;

static void list_add(list *l, const char *s, size_t len)
{
    assert_true(l->n < MAX_ITEMS);
    l->item[l->n] = strndup(s, len);
    assert_non_null(l->item[l->n]);
    l->n++;
}

static bool list_has(const list *l, const char *s)
{
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->item[i], s)) return true;
    return false;
}

static void list_free(list *l)
{
    for (int i = 0; i < l->n; i++) free(l->item[i]);
    l->n = 0;
}

/* ---- Markdown ------------------------------------------------------------------------- */

/* Whether `line` opens or closes a fenced code block (``` or ~~~). */
static bool is_fence(const char *line)
{
    while (*line == ' ') line++;
    return !strncmp(line, "```", 3) || !strncmp(line, "~~~", 3);
}

/* GitHub's anchor of a heading's text, into out: inline code's backticks,
 * emphasis and a link's target dropped, ASCII letters lowered, every
 * character but letters, digits, '_', '-' and spaces dropped (bytes past
 * ASCII kept, as letters of other scripts are), spaces made hyphens. */
static void slug(const char *text, size_t len, char *out, size_t size)
{
    size_t o = 0;
    for (size_t i = 0; i < len && o + 1 < size; i++) {
        unsigned char c = (unsigned char)text[i];
        if (c == ']' && i + 1 < len && text[i + 1] == '(') { /* [text](target): the text */
            while (i < len && text[i] != ')') i++;
            continue;
        }
        if (isalnum(c) || c == '_' || c == '-' || c >= 0x80) out[o++] = (char)tolower(c);
        else if (c == ' ') out[o++] = '-';
    }
    out[o] = '\0';
}

/* The anchors of a Markdown text's headings ("#" to "######", outside
 * fenced code), a repeated one numbered as GitHub numbers it. */
static void anchors_of(const char *md, list *out)
{
    bool fenced = false;
    for (const char *line = md; *line;) {
        size_t len = strcspn(line, "\n");
        if (is_fence(line)) fenced = !fenced;
        else if (!fenced && line[0] == '#') {
            size_t h = 0;
            while (h < len && line[h] == '#') h++;
            if (h <= 6 && h < len && line[h] == ' ') {
                char base[MAX_NAME], name[MAX_NAME + 16];
                size_t end = len;
                while (end > h && (line[end - 1] == ' ' || line[end - 1] == '#')) end--;
                slug(line + h + 1, end - h - 1, base, sizeof base);
                snprintf(name, sizeof name, "%s", base);
                for (int k = 1; list_has(out, name); k++) snprintf(name, sizeof name, "%s-%d", base, k);
                list_add(out, name, strlen(name));
            }
        }
        line += len + (line[len] == '\n');
    }
}

/* Calls found(target, target_len, line, ctx) for each link or image of a
 * Markdown text, `[text](target)` or `![alt](target)`, outside fenced
 * code and inline code; a link's title ("target "title"") is left out. */
typedef void (*link_fn)(const char *target, size_t len, int line, void *ctx);

static void links_of(const char *md, link_fn found, void *ctx)
{
    bool fenced = false, line_start = true;
    int line = 1;
    for (const char *p = md; *p; p++) {
        if (line_start && is_fence(p)) fenced = !fenced;
        line_start = *p == '\n';
        if (*p == '\n') {
            line++;
            continue;
        }
        if (fenced) continue;
        if (*p == '`') { /* inline code: up to a run of as many backticks, in the paragraph */
            size_t run = strspn(p, "`");
            const char *q = p + run, *close = NULL;
            for (; *q && strncmp(q, "\n\n", 2); q++) {
                if (*q != '`') continue;
                size_t r = strspn(q, "`");
                if (r == run) {
                    close = q;
                    break;
                }
                q += r - 1;
            }
            if (!close) {
                p += run - 1;
                continue;
            }
            for (const char *c = p; c < close; c++) line += *c == '\n';
            p = close + run - 1;
            continue;
        }
        if (*p == ']' && p[1] == '(') {
            const char *t = p + 2;
            size_t len = strcspn(t, ") \n");
            found(t, len, line, ctx);
        }
    }
}

/* ---- Files ----------------------------------------------------------------------------- */

static char *read_text(const char *path)
{
    size_t len;
    return support_read_file(path, &len);
}

static bool is_file(const char *path)
{
    struct stat st;
    return !stat(path, &st) && S_ISREG(st.st_mode);
}

static bool is_dir(const char *path)
{
    struct stat st;
    return !stat(path, &st) && S_ISDIR(st.st_mode);
}

static bool ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), m = strlen(tail);
    return n >= m && !strcmp(s + n - m, tail);
}

/* Files under `dir` (relative to the source tree, recursively; hidden
 * folders and caches left out) whose names `keep` accepts. */
static void files_under(const char *dir, bool (*keep)(const char *name), list *out)
{
    char path[3 * SUPPORT_PATH];
    snprintf(path, sizeof path, "%s/%s", SPMD_SOURCE_DIR, dir);
    DIR *d = opendir(path);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' || !strcmp(e->d_name, "__pycache__")) continue;
        char rel[2 * SUPPORT_PATH];
        snprintf(rel, sizeof rel, "%s/%s", dir, e->d_name);
        snprintf(path, sizeof path, "%s/%s", SPMD_SOURCE_DIR, rel);
        struct stat st;
        if (stat(path, &st)) continue;
        if (S_ISDIR(st.st_mode)) files_under(rel, keep, out);
        else if (S_ISREG(st.st_mode) && keep(e->d_name)) list_add(out, rel, strlen(rel));
    }
    closedir(d);
}

static bool is_markdown(const char *name) { return ends_with(name, ".md"); }

/* ---- Links ------------------------------------------------------------------------------ */

typedef struct link_check {
    const char *root; /* the tree's folder */
    const char *file; /* relative to the root */
    int bad;
} link_check;

/* One link of `c->file`: a relative one must name a file, and its anchor
 * a heading of that file (of this one for a bare "#anchor"). */
static void check_link(const char *target, size_t len, int line, void *ctx)
{
    link_check *c = ctx;
    char t[SUPPORT_PATH];
    snprintf(t, sizeof t, "%.*s", (int)len, target);
    if (strstr(t, "://") || !strncmp(t, "mailto:", 7)) return;
    char *hash = strchr(t, '#');
    const char *anchor = NULL;
    if (hash) *hash = '\0', anchor = hash + 1;
    char path[3 * SUPPORT_PATH];
    if (!t[0]) snprintf(path, sizeof path, "%s/%s", c->root, c->file);
    else {
        const char *slash = strrchr(c->file, '/');
        int dir = slash ? (int)(slash - c->file) : 0;
        snprintf(path, sizeof path, "%s/%.*s%s%s", c->root, dir, c->file, dir ? "/" : "", t);
    }
    if (!is_file(path) && !(!anchor && is_dir(path))) {
        print_error("%s:%d links to %.*s: no such file\n", c->file, line, (int)len, target);
        c->bad++;
        return;
    }
    if (!anchor || !ends_with(path, ".md")) return;
    char *md = read_text(path);
    list anchors = {0};
    anchors_of(md, &anchors);
    if (!list_has(&anchors, anchor)) {
        print_error("%s:%d links to %.*s: no heading has the anchor #%s\n", c->file, line, (int)len,
                    target, anchor);
        c->bad++;
    }
    list_free(&anchors);
    free(md);
}

/* The bad links of one Markdown file of the tree at `root`. */
static int check_links_in(const char *root, const char *file)
{
    char path[SUPPORT_PATH];
    snprintf(path, sizeof path, "%s/%s", root, file);
    char *md = read_text(path);
    link_check c = {root, file, 0};
    links_of(md, check_link, &c);
    free(md);
    return c.bad;
}

/* ---- The design's sections ---------------------------------------------------------------- */

/* The rows of DESIGN.md's table under "## Sections": each section's name
 * and the target of its link. */
static void design_sections(const char *design, list *names, list *targets)
{
    const char *at = strstr(design, "\n## Sections\n");
    if (!at) return;
    at += strlen("\n## Sections\n");
    for (const char *line = at; *line && *line != '#';) {
        size_t len = strcspn(line, "\n");
        if (line[0] == '|' && strncmp(line, "|---", 4)) {
            const char *name = line + 1, *bar = memchr(name, '|', len - 1);
            const char *link = bar ? strstr(bar, "](") : NULL;
            const char *close = link ? strchr(link, ')') : NULL;
            if (close && close < line + len) {
                while (*name == ' ') name++;
                size_t n = (size_t)(bar - name);
                while (n && name[n - 1] == ' ') n--;
                if (strncmp(name, "section", n) || n != strlen("section")) {
                    list_add(names, name, n);
                    list_add(targets, link + 2, (size_t)(close - link - 2));
                }
            }
        }
        line += len + (line[len] == '\n');
    }
}

/* Whether each row of the table links to the heading it names. */
static int check_rows_link_their_headings(const list *names, const list *targets)
{
    int bad = 0;
    for (int i = 0; i < names->n; i++) {
        const char *hash = strchr(targets->item[i], '#');
        char want[MAX_NAME];
        slug(names->item[i], strlen(names->item[i]), want, sizeof want);
        if (!hash || strcmp(hash + 1, want)) {
            print_error("DESIGN.md: section \"%s\" links to %s, not to its heading #%s\n", names->item[i],
                        targets->item[i], want);
            bad++;
        }
    }
    return bad;
}

/* Whether every heading of the design page `page` (its text `md`, its
 * path "design/NAME.md" as DESIGN.md links it) is a row that links to it. */
static int check_page_headings_listed(const char *page, const char *md, const list *names,
                                      const list *targets)
{
    int bad = 0;
    bool fenced = false;
    for (const char *line = md; *line;) {
        size_t len = strcspn(line, "\n");
        if (is_fence(line)) fenced = !fenced;
        else if (!fenced && line[0] == '#') {
            size_t h = strspn(line, "#");
            char title[MAX_NAME];
            snprintf(title, sizeof title, "%.*s", (int)(len - h - 1), line + h + 1);
            int row = -1;
            for (int i = 0; i < names->n && row < 0; i++)
                if (!strcmp(names->item[i], title)) row = i;
            size_t plen = strlen(page);
            if (row < 0) {
                print_error("%s: heading \"%s\" is not in DESIGN.md's table of sections\n", page, title);
                bad++;
            } else if (strncmp(targets->item[row], page, plen) || targets->item[row][plen] != '#') {
                print_error("DESIGN.md: section \"%s\" links to %s, but %s holds it\n", title,
                            targets->item[row], page);
                bad++;
            }
        }
        line += len + (line[len] == '\n');
    }
    return bad;
}

/* ---- Citations ---------------------------------------------------------------------------- */

/* Skips blanks, and at a line break the next line's comment leader
 * (" * ", "# ", "// "), so a citation may run over comment lines. */
static const char *skip_gap(const char *p)
{
    for (;;) {
        if (*p == ' ' || *p == '\t') p++;
        else if (*p == '\n') {
            p++;
            p += strspn(p, " \t");
            p += strspn(p, "*#/");
        } else return p;
    }
}

/* Checks every citation of the design in `text` (the file `file`):
 * "DESIGN" (".md" or "'s" may follow), an optional comma, then one or
 * more quoted section names joined by "," or "and"; each must be one of
 * `sections`.  Returns how many are not. */
static int check_citations(const char *text, const char *file, const list *sections)
{
    int bad = 0;
    for (const char *p = strstr(text, "DESIGN"); p; p = strstr(p + 1, "DESIGN")) {
        const char *q = p + strlen("DESIGN");
        if (!strncmp(q, ".md", 3)) q += 3;
        else if (!strncmp(q, "'s", 2)) q += 2;
        if (*q != ',' && *q != ' ' && *q != '\n') continue;
        q = skip_gap(q);
        if (*q == ',') q = skip_gap(q + 1);
        for (;;) {
            if (q[0] == '\\' && q[1] == '"') q++;
            if (*q != '"') break;
            char name[MAX_NAME];
            size_t n = 0;
            for (q++; *q && *q != '"' && n + 1 < sizeof name;) {
                if (*q == '\n' || *q == ' ') {
                    q = skip_gap(q);
                    if (*q != '"') name[n++] = ' ';
                } else name[n++] = *q++;
            }
            if (n && name[n - 1] == '\\') n--; /* an escaped quote's backslash */
            name[n] = '\0';
            if (*q != '"') break;
            q++;
            if (n && !list_has(sections, name)) {
                int line = 1;
                for (const char *c = text; c < p; c++) line += *c == '\n';
                print_error("%s:%d cites \"%s\", which docs/DESIGN.md's table of sections does not list\n",
                            file, line, name);
                bad++;
            }
            q = skip_gap(q);
            if (*q == ',') q = skip_gap(q + 1);
            else if (!strncmp(q, "and ", 4)) q = skip_gap(q + 4);
            else break;
        }
    }
    return bad;
}

static bool is_source(const char *name)
{
    static const char *const tails[] = {".c", ".h", ".def", ".py", ".sh", ".js", ".cmake", ".txt", ".in"};
    for (size_t i = 0; i < sizeof tails / sizeof tails[0]; i++)
        if (ends_with(name, tails[i])) return true;
    return !strcmp(name, "Makefile");
}

/* ---- On text with a fault planted ----------------------------------------------------------- */

static void test_slug_is_githubs(void **state)
{
    (void)state;
    static const char *const cases[][2] = {
        {"GPT-2's BPE", "gpt-2s-bpe"},
        {"`spmd train`", "spmd-train"},
        {"Mixed precision (bf16)", "mixed-precision-bf16"},
        {"Text of your own: `spmd tokenize`", "text-of-your-own-spmd-tokenize"},
        {"Adding an op", "adding-an-op"},
        {"[Linked](x.md) heading", "linked-heading"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char out[MAX_NAME];
        slug(cases[i][0], strlen(cases[i][0]), out, sizeof out);
        assert_string_equal(out, cases[i][1]);
    }
    list a = {0};
    anchors_of("# Top\n\n## Same\n\n```\n# not a heading\n```\n\n## Same\n", &a);
    assert_int_equal(a.n, 3);
    assert_string_equal(a.item[1], "same");
    assert_string_equal(a.item[2], "same-1");
    list_free(&a);
}

static void write_file(const char *dir, const char *name, const char *text)
{
    char path[SUPPORT_PATH];
    FILE *f = fopen(support_path_in(path, dir, name), "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_planted_links_fail(void **state)
{
    (void)state;
    char *root = support_temp_dir("spmd-docs");
    char sub[SUPPORT_PATH];
    assert_int_equal(mkdir(support_path_in(sub, root, "docs"), 0700), 0);
    write_file(sub, "b.md", "# B\n\n## Part two\n");
    write_file(root, "a.md",
               "# A\n\nGood: [b](docs/b.md), [part](docs/b.md#part-two), [self](#a), [web](https://x.org/y),\n"
               "`[code](missing.md)`, [folder](docs).\n\n```\n[fenced](missing.md)\n```\n");
    assert_int_equal(check_links_in(root, "a.md"), 0);
    write_file(root, "a.md", "# A\n\n[gone](docs/c.md) and [wrong](docs/b.md#part-three)\nand [here](#b).\n");
    assert_int_equal(check_links_in(root, "a.md"), 3);
    write_file(sub, "c.md", "# C\n\n[up](../a.md#a) [sibling](b.md#b)\n");
    assert_int_equal(check_links_in(root, "docs/c.md"), 0);
    support_drop_dir(root);
}

static void test_planted_citations_fail(void **state)
{
    (void)state;
    list sections = {0};
    const char *names[] = {"Errors", "Shared parameters", "Partition", "Reshard", "Layers"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) list_add(&sections, names[i], strlen(names[i]));
    /* "DESI" "GN": this file is scanned for citations too. */
    const char *good = "/* Boundary (docs/DESI" "GN.md, \"Errors\"); held once (docs/DESI" "GN.md,\n"
                       " * \"Shared\n * parameters\"), see DESI" "GN \"Partition\" and \"Reshard\", \"Layers\"\n"
                       " * and DESI" "GN's\n * \"Errors\". */\n# CMake (docs/DESI" "GN.md, \"Errors\")\n"
                       "x = \" * the boundary (docs/DESI" "GN.md, \\\"Errors\\\"). */\"\n"
                       "DESI" "GN says \"Nothing\"; strstr(line, \"DESI" "GN\")\n";
    assert_int_equal(check_citations(good, "good.c", &sections), 0);
    const char *bad = "/* (docs/DESI" "GN.md, \"Error\") and (DESI" "GN.md, \"Partition\" and \"Resharding\")\n"
                      " * (docs/DESI" "GN.md,\n * \"Shared parameter\") */\n";
    assert_int_equal(check_citations(bad, "bad.c", &sections), 3);
    list_free(&sections);
}

static void test_planted_table_faults_fail(void **state)
{
    (void)state;
    const char *design = "# Design\n\n## Sections\n\n| section | page |\n|---|---|\n"
                         "| Mesh | [Concepts](design/concepts.md#mesh) |\n"
                         "| Sharding | [Concepts](design/concepts.md#mesh) |\n"
                         "| Errors | [Errors](design/errors.md#errors) |\n";
    list names = {0}, targets = {0};
    design_sections(design, &names, &targets);
    assert_int_equal(names.n, 3);
    assert_string_equal(names.item[2], "Errors");
    assert_string_equal(targets.item[0], "design/concepts.md#mesh");
    assert_int_equal(check_rows_link_their_headings(&names, &targets), 1); /* Sharding's link */
    assert_int_equal(check_page_headings_listed("design/concepts.md", "# Mesh\n\n## Sharding\n", &names,
                                                &targets),
                     0);
    /* A heading the table misses, and one it places on another page. */
    assert_int_equal(check_page_headings_listed("design/concepts.md", "# Mesh\n\n## Errors\n\n## New\n", &names,
                                                &targets),
                     2);
    list_free(&names), list_free(&targets);
}

/* ---- On the tree ------------------------------------------------------------------------------ */

static void test_links_resolve(void **state)
{
    (void)state;
    list files = {0};
    list_add(&files, "README.md", strlen("README.md"));
    files_under("docs", is_markdown, &files);
    assert_true(files.n > 10);
    int bad = 0;
    for (int i = 0; i < files.n; i++) bad += check_links_in(SPMD_SOURCE_DIR, files.item[i]);
    list_free(&files);
    if (bad) fail_msg("%d links of README.md and docs/ do not resolve", bad);
}

static void test_readme_is_short(void **state)
{
    (void)state;
    char *readme = read_text(SPMD_SOURCE_DIR "/README.md");
    int lines = 0;
    for (const char *p = readme; *p; p++) lines += *p == '\n';
    free(readme);
    if (lines > README_MAX_LINES)
        fail_msg("README.md has %d lines, more than %d: move the detail into docs/", lines, README_MAX_LINES);
}

static void test_design_table_lists_every_heading(void **state)
{
    (void)state;
    char *design = read_text(SPMD_SOURCE_DIR "/docs/DESIGN.md");
    list names = {0}, targets = {0}, pages = {0};
    design_sections(design, &names, &targets);
    assert_true(names.n > 0);
    int bad = check_rows_link_their_headings(&names, &targets);
    files_under("docs/design", is_markdown, &pages);
    assert_true(pages.n > 0);
    for (int i = 0; i < pages.n; i++) {
        char path[SUPPORT_PATH];
        char *md = read_text(support_path_in(path, SPMD_SOURCE_DIR, pages.item[i]));
        bad += check_page_headings_listed(pages.item[i] + strlen("docs/"), md, &names, &targets);
        free(md);
    }
    list_free(&names), list_free(&targets), list_free(&pages);
    free(design);
    if (bad) fail_msg("%d faults in docs/DESIGN.md's table of sections", bad);
}

static void test_citations_are_sections(void **state)
{
    (void)state;
    char *design = read_text(SPMD_SOURCE_DIR "/docs/DESIGN.md");
    list names = {0}, targets = {0}, files = {0};
    design_sections(design, &names, &targets);
    static const char *const folders[] = {"src", "tools", "python", "include", "tests", "scripts",
                                          "bench", "examples", "fuzz", "cmake"};
    for (size_t i = 0; i < sizeof folders / sizeof folders[0]; i++) files_under(folders[i], is_source, &files);
    list_add(&files, "CMakeLists.txt", strlen("CMakeLists.txt"));
    list_add(&files, "Makefile", strlen("Makefile"));
    assert_true(files.n > 100);
    int bad = 0;
    for (int i = 0; i < files.n; i++) {
        char path[SUPPORT_PATH];
        char *text = read_text(support_path_in(path, SPMD_SOURCE_DIR, files.item[i]));
        bad += check_citations(text, files.item[i], &names);
        free(text);
    }
    list_free(&names), list_free(&targets), list_free(&files);
    free(design);
    if (bad) fail_msg("%d citations name no section of docs/DESIGN.md", bad);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slug_is_githubs),
        cmocka_unit_test(test_planted_links_fail),
        cmocka_unit_test(test_planted_citations_fail),
        cmocka_unit_test(test_planted_table_faults_fail),
        cmocka_unit_test(test_links_resolve),
        cmocka_unit_test(test_readme_is_short),
        cmocka_unit_test(test_design_table_lists_every_heading),
        cmocka_unit_test(test_citations_are_sections),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
