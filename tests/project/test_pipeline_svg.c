/*
 * docs/design/pipeline.svg, the picture of the design's "Pipeline"
 * (docs/design/pipeline.md), stays true to it:
 *   - its stages (<g class="stage" data-stage="...">) are the ones the
 *     section's diagram names ("build -> autodiff -> ..."), in that order,
 *     and the section shows the picture;
 *   - every module a stage names (data-module, comma-separated, globs
 *     allowed) exists in the source tree;
 *   - a real renderer (rsvg-convert, Debian's librsvg2-bin; skipped with a
 *     note without it) draws it, as PNG at the SVG's size with something
 *     on it, and as PDF.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <glob.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support_files.h"

enum { MAX_STAGES = 16, NAME = 128 };

typedef struct stages {
    int n;
    char name[MAX_STAGES][NAME];
} stages;

static char *design, *svg;

static int setup(void **state)
{
    (void)state;
    char path[SUPPORT_PATH];
    size_t len;
    design = support_read_file(support_path_in(path, SPMD_SOURCE_DIR, "docs/design/pipeline.md"), &len);
    svg = support_read_file(support_path_in(path, SPMD_SOURCE_DIR, "docs/design/pipeline.svg"), &len);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    free(design), free(svg);
    return 0;
}

/* The body of the page's "# Pipeline", up to its first section. */
static char *pipeline_section(void)
{
    assert_memory_equal(design, "# Pipeline\n", strlen("# Pipeline\n"));
    const char *at = design + strlen("# Pipeline\n");
    const char *end = strstr(at, "\n## ");
    assert_non_null(end);
    char *body = strndup(at, (size_t)(end - at));
    assert_non_null(body);
    return body;
}

/* Appends p[0, n), without surrounding blanks, to s (if not empty). */
static void add_stage(stages *s, const char *p, size_t n)
{
    while (n && *p == ' ') p++, n--;
    while (n && p[n - 1] == ' ') n--;
    if (!n) return;
    assert_true(s->n < MAX_STAGES && n < NAME);
    snprintf(s->name[s->n++], NAME, "%.*s", (int)n, p);
}

/* The stage names of the section's diagram (its indented code block):
 * the words between the arrows, "build -> autodiff -> ...". */
static stages design_stages(void)
{
    char *body = pipeline_section();
    stages s = {0};
    for (char *line = strtok(body, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "    ", 4) != 0) continue;
        for (const char *p = line, *arrow;; p = arrow + 2) {
            arrow = strstr(p, "->");
            add_stage(&s, p, arrow ? (size_t)(arrow - p) : strlen(p));
            if (!arrow) break;
        }
    }
    free(body);
    return s;
}

/* Attribute `name` of the tag starting at `tag`, into out. */
static bool attribute(const char *tag, const char *name, char *out, size_t size)
{
    const char *close = strchr(tag, '>');
    char key[64];
    snprintf(key, sizeof key, " %s=\"", name);
    const char *at = strstr(tag, key);
    if (!at || !close || at > close) return false;
    at += strlen(key);
    size_t n = strcspn(at, "\"");
    snprintf(out, size, "%.*s", (int)n, at);
    return true;
}

/* The picture's stages, and each one's modules into modules[i]. */
static stages svg_stages(char modules[][SUPPORT_PATH])
{
    stages s = {0};
    for (const char *g = strstr(svg, "<g class=\"stage\""); g; g = strstr(g + 1, "<g class=\"stage\"")) {
        assert_true(s.n < MAX_STAGES);
        char name[NAME];
        if (!attribute(g, "data-stage", name, sizeof name)) fail_msg("a stage without data-stage");
        /* "&amp;" and the like would need decoding; the names have none. */
        assert_null(strchr(name, '&'));
        if (!attribute(g, "data-module", modules[s.n], SUPPORT_PATH))
            fail_msg("stage %s names no module", name);
        snprintf(s.name[s.n++], NAME, "%s", name);
    }
    return s;
}

static void test_stages_are_the_designs(void **state)
{
    (void)state;
    stages want = design_stages();
    static char modules[MAX_STAGES][SUPPORT_PATH];
    stages got = svg_stages(modules);
    assert_true(want.n >= 5);
    for (int i = 0; i < want.n || i < got.n; i++)
        if (i >= want.n || i >= got.n || strcmp(want.name[i], got.name[i]) != 0)
            fail_msg("stage %d: the design says \"%s\", the picture \"%s\"", i + 1,
                     i < want.n ? want.name[i] : "(none)", i < got.n ? got.name[i] : "(none)");
    char *body = pipeline_section();
    if (!strstr(body, "](pipeline.svg)")) fail_msg("docs/design/pipeline.md does not show pipeline.svg");
    free(body);
}

static void test_modules_exist(void **state)
{
    (void)state;
    static char modules[MAX_STAGES][SUPPORT_PATH];
    stages got = svg_stages(modules);
    for (int i = 0; i < got.n; i++) {
        /* The box shows the modules it is tagged with. */
        char shown[SUPPORT_PATH + 2];
        snprintf(shown, sizeof shown, ">%.*s<", SUPPORT_PATH - 1, modules[i]);
        if (!strstr(svg, shown)) fail_msg("stage %s does not show %s", got.name[i], modules[i]);
        int named = 0;
        for (char *m = strtok(modules[i], ", "); m; m = strtok(NULL, ", ")) {
            char pattern[SUPPORT_PATH];
            glob_t found;
            int rc = glob(support_path_in(pattern, SPMD_SOURCE_DIR, m), 0, NULL, &found);
            if (rc != 0) fail_msg("stage %s names %s, which is not in the tree", got.name[i], m);
            globfree(&found);
            named++;
        }
        assert_true(named > 0);
    }
}

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void test_renders(void **state)
{
    (void)state;
    if (system("command -v rsvg-convert >/dev/null 2>&1") != 0) {
        print_message("note: no rsvg-convert (librsvg2-bin; scripts/install-deps.sh --tests): "
                      "docs/design/pipeline.svg is not rendered\n");
        skip();
    }
    char *dir = support_temp_dir("spmd-pipeline-svg");
    char png[SUPPORT_PATH], pdf[SUPPORT_PATH], cmd[4 * SUPPORT_PATH];
    support_path_in(png, dir, "pipeline.png");
    support_path_in(pdf, dir, "pipeline.pdf");
    snprintf(cmd, sizeof cmd, "rsvg-convert -f png -o '%s' '%s/docs/design/pipeline.svg'", png,
             SPMD_SOURCE_DIR);
    assert_int_equal(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "rsvg-convert -f pdf -o '%s' '%s/docs/design/pipeline.svg'", pdf,
             SPMD_SOURCE_DIR);
    assert_int_equal(system(cmd), 0);

    size_t len;
    unsigned char *image = (unsigned char *)support_read_file(png, &len);
    assert_true(len > 33);
    assert_memory_equal(image, "\x89PNG\r\n\x1a\n", 8);
    assert_memory_equal(image + 12, "IHDR", 4);
    char width[16], height[16];
    assert_true(attribute(strstr(svg, "<svg"), "width", width, sizeof width));
    assert_true(attribute(strstr(svg, "<svg"), "height", height, sizeof height));
    assert_int_equal(be32(image + 16), (uint32_t)atoi(width));
    assert_int_equal(be32(image + 20), (uint32_t)atoi(height));
    /* A blank page of that size compresses to a few KB; boxes and text do not. */
    if (len < 16 * 1024) fail_msg("the PNG is %zu bytes: is anything drawn?", len);
    char *doc = support_read_file(pdf, &len);
    assert_memory_equal(doc, "%PDF-", 5);
    free(image), free(doc);
    support_drop_dir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stages_are_the_designs),
        cmocka_unit_test(test_modules_exist),
        cmocka_unit_test(test_renders),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
