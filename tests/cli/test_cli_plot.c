/*
 * `spmd plot LOG.jsonl --out FILE.svg` on the log of a real 30-step
 * `spmd train --log` run and on logs written here:
 *   - the chart has a series per curve with one point per logged step
 *     (data-points, and the vertices of its polylines), the axis titles
 *     and the title, and no temporary file is left;
 *   - a real renderer (rsvg-convert, Debian's librsvg2-bin; skipped with a
 *     note when it is missing) turns it into a PNG of the SVG's size, in
 *     which both lines show in their colours (decoded here with zlib), and
 *     into a PDF;
 *   - nulls break a line, validation losses ({"step":N,"val_loss":X}) are
 *     their own series, a second run appended to a log is a new line, and
 *     a title with markup is escaped;
 *   - a long log is drawn with at most 1000 vertices a line while
 *     data-points still counts every step;
 *   - a torn last line (no newline, not whole JSON: a full disk) is
 *     skipped, saying so;
 *   - every finite value is drawn, 1e308 too, on finite ticks;
 *   - refusals: a missing log (exit 1), a malformed line, a line without
 *     "step", an empty log, no --out, an unknown flag, an --out no file
 *     can be written to (a missing directory, a directory, a device)
 *     (exit 2), each with its message and no file written; a write that
 *     fails (exit 1) says why, and leaves an earlier plot whole.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "support_files.h"
#include "support_tool.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#ifndef SPMD_TOOL_PATH
#error "SPMD_TOOL_PATH must name the spmd binary"
#endif

enum { PATH = SUPPORT_PATH, OUT = 1 << 16, SVG_MAX = 1 << 20, TRAIN_STEPS = 30 };

/* The group's directory, with the log of a real training run in it. */
static char *dir;
static char train_log[PATH];

static int setup(void **state)
{
    (void)state;
    dir = support_temp_dir("test_cli_plot");
    support_path_in(train_log, dir, "train.jsonl");
    static char out[OUT];
    int rc = run_toolf(out, sizeof out, "train --steps %d --eval 0 --log %s", TRAIN_STEPS, train_log);
    if (rc != 0) print_error("spmd train failed (%d):\n%s\n", rc, out);
    return rc == 0 ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    support_drop_dir(dir);
    return 0;
}

/* ---- Files ------------------------------------------------------------------------------ */

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fputs(text, f) >= 0, 1);
    assert_int_equal(fclose(f), 0);
}

/* The whole file, NUL-terminated (malloc'd); its size in *len. */
static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    char *buf = malloc(SVG_MAX + 1);
    assert_non_null(buf);
    *len = fread(buf, 1, SVG_MAX, f);
    assert_true(*len < SVG_MAX);
    buf[*len] = '\0';
    fclose(f);
    return buf;
}

static bool exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Temporary files a write would leave beside its target start with '.'. */
static void no_temporary_files(void)
{
    assert_int_equal(support_count_entries(dir, ".") - 2, 0); /* less . and .. */
}

/* ---- The SVG ------------------------------------------------------------------------------ */

/* The opening tag of series `id`, NUL-terminated in tag; false if none. */
static bool series_tag(const char *svg, const char *id, char *tag, size_t size)
{
    char key[96];
    snprintf(key, sizeof key, "<g class=\"series %s\"", id);
    const char *p = strstr(svg, key);
    if (!p) return false;
    size_t n = strcspn(p, ">") + 1;
    assert_true(n < size);
    snprintf(tag, size, "%.*s", (int)n, p);
    return true;
}

/* An attribute of the tag, as text. */
static void attribute(const char *tag, const char *name, char *value, size_t size)
{
    char key[64];
    snprintf(key, sizeof key, " %s=\"", name);
    const char *p = strstr(tag, key);
    if (!p) fail_msg("no %s in %s", name, tag);
    p += strlen(key);
    snprintf(value, size, "%.*s", (int)strcspn(p, "\""), p);
}

static int int_attribute(const char *tag, const char *name)
{
    char v[32];
    attribute(tag, name, v, sizeof v);
    return atoi(v);
}

typedef struct series_facts {
    int points, drawn, runs; /* its attributes */
    int vertices;            /* counted in its polylines */
} series_facts;

static int count_vertices(const char *from, const char *to)
{
    int n = 0;
    for (const char *p = strstr(from, "points=\""); p && p < to; p = strstr(p, "points=\"")) {
        p += strlen("points=\"");
        for (const char *q = p; *q != '"'; q++) n += *q == ',';
    }
    return n;
}

/* The facts of series `id`; fails the test if the SVG has none. */
static series_facts series_of(const char *svg, const char *id)
{
    char tag[512];
    if (!series_tag(svg, id, tag, sizeof tag)) fail_msg("no series %s", id);
    const char *body = strstr(svg, tag) + strlen(tag), *end = strstr(body, "</g>");
    assert_non_null(end);
    return (series_facts){int_attribute(tag, "data-points"), int_attribute(tag, "data-drawn"),
                          int_attribute(tag, "data-runs"), count_vertices(body, end)};
}

static void expect_text(const char *svg, const char *text)
{
    if (!strstr(svg, text)) fail_msg("the SVG has no %s", text);
}

/* ---- Rendering ----------------------------------------------------------------------------- */

static bool have_renderer(void)
{
    if (system("command -v rsvg-convert >/dev/null 2>&1") == 0) return true;
    print_message("note: no rsvg-convert (librsvg2-bin; scripts/install-deps.sh --tests): "
                  "the charts are not rendered\n");
    return false;
}

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

typedef struct image {
    uint32_t width, height, channels;
    unsigned char *pixels; /* rows of width * channels bytes */
} image;

static int paeth(int a, int b, int c)
{
    int p = a + b - c, pa = abs(p - a), pb = abs(p - b), pc = abs(p - c);
    return pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
}

/* Undo the PNG row filters of `raw` (each row: a filter byte, then the
 * row) into img->pixels. */
static void unfilter(image *img, const unsigned char *raw)
{
    size_t bpp = img->channels, stride = img->width * bpp;
    for (size_t y = 0; y < img->height; y++) {
        int filter = raw[y * (stride + 1)];
        const unsigned char *in = raw + y * (stride + 1) + 1;
        unsigned char *row = img->pixels + y * stride, *up = y ? row - stride : NULL;
        for (size_t i = 0; i < stride; i++) {
            int a = i >= bpp ? row[i - bpp] : 0, b = up ? up[i] : 0, c = up && i >= bpp ? up[i - bpp] : 0;
            int pred = filter == 0 ? 0 : filter == 1 ? a : filter == 2 ? b : filter == 3 ? (a + b) / 2 : paeth(a, b, c);
            row[i] = (unsigned char)(in[i] + pred);
        }
        assert_in_range(filter, 0, 4);
    }
}

/* An 8-bit RGB or RGBA PNG, as rsvg-convert writes them: signature, IHDR,
 * the IDAT chunks inflated, the rows unfiltered. */
static image read_png(const char *path)
{
    size_t len;
    unsigned char *png = (unsigned char *)read_all(path, &len);
    assert_true(len > 33);
    assert_memory_equal(png, "\x89PNG\r\n\x1a\n", 8);
    assert_memory_equal(png + 12, "IHDR", 4);
    image img = {be32(png + 16), be32(png + 20), png[25] == 6 ? 4 : 3, NULL};
    assert_int_equal(png[24], 8);                     /* bit depth */
    assert_true(png[25] == 6 || png[25] == 2);        /* RGBA or RGB */
    assert_int_equal(png[28], 0);                     /* not interlaced */
    unsigned char *idat = malloc(len);
    size_t n_idat = 0;
    for (size_t at = 8; at + 12 <= len; at += 12 + be32(png + at)) {
        uint32_t size = be32(png + at);
        assert_true(at + 12 + size <= len);
        if (!memcmp(png + at + 4, "IDAT", 4)) {
            memcpy(idat + n_idat, png + at + 8, size);
            n_idat += size;
        }
    }
    uLongf raw_len = (uLongf)img.height * (img.width * img.channels + 1);
    unsigned char *raw = malloc(raw_len);
    img.pixels = malloc((size_t)img.height * img.width * img.channels);
    assert_true(raw && idat && img.pixels);
    assert_int_equal(uncompress(raw, &raw_len, idat, n_idat), Z_OK);
    assert_int_equal(raw_len, (uLongf)img.height * (img.width * img.channels + 1));
    unfilter(&img, raw);
    free(raw), free(idat), free(png);
    return img;
}

/* Opaque pixels within a small distance of colour "#rrggbb", in rows
 * from `first_row` on. */
static int pixels_like(const image *img, const char *colour, uint32_t first_row)
{
    unsigned r, g, b;
    assert_int_equal(sscanf(colour, "#%2x%2x%2x", &r, &g, &b), 3);
    int n = 0;
    for (size_t i = (size_t)first_row * img->width; i < (size_t)img->width * img->height; i++) {
        const unsigned char *p = img->pixels + i * img->channels;
        bool opaque = img->channels == 3 || p[3] > 200;
        n += opaque && abs(p[0] - (int)r) + abs(p[1] - (int)g) + abs(p[2] - (int)b) < 40;
    }
    return n;
}

/* The series' colour, from its group's stroke. */
static void series_colour(const char *svg, const char *id, char *colour, size_t size)
{
    char tag[512];
    assert_true(series_tag(svg, id, tag, sizeof tag));
    attribute(tag, "stroke", colour, size);
}

/* The first row below the legend, whose strokes have the series' colours. */
static uint32_t below_legend(const char *svg)
{
    const char *legend = strstr(svg, "<g class=\"legend\">");
    assert_non_null(legend);
    char line[256];
    snprintf(line, sizeof line, "%.*s", (int)strcspn(legend, "/"), legend);
    char y[32];
    attribute(line, "y1", y, sizeof y);
    return (uint32_t)atof(y) + 8;
}

/* Render `svg_path` as PNG and PDF: the PNG has the SVG's size and each
 * listed series shows, below the legend, in at least `min_pixels` pixels
 * of its colour. */
static void expect_renders(const char *svg_path, const char *const *ids, int n_ids, int min_pixels)
{
    char png_path[PATH + 8], pdf_path[PATH + 8], cmd[4 * PATH];
    snprintf(png_path, sizeof png_path, "%s.png", svg_path);
    snprintf(pdf_path, sizeof pdf_path, "%s.pdf", svg_path);
    snprintf(cmd, sizeof cmd, "rsvg-convert -f png -o '%s' '%s'", png_path, svg_path);
    assert_int_equal(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "rsvg-convert -f pdf -o '%s' '%s'", pdf_path, svg_path);
    assert_int_equal(system(cmd), 0);

    size_t len;
    char *svg = read_all(svg_path, &len), *pdf = read_all(pdf_path, &len);
    assert_memory_equal(pdf, "%PDF-", 5);
    image img = read_png(png_path);
    char tag[256];
    snprintf(tag, sizeof tag, "%.*s", (int)strcspn(strstr(svg, "<svg"), ">"), strstr(svg, "<svg"));
    assert_int_equal(img.width, (uint32_t)int_attribute(tag, "width"));
    assert_int_equal(img.height, (uint32_t)int_attribute(tag, "height"));
    for (int i = 0; i < n_ids; i++) {
        char colour[16];
        series_colour(svg, ids[i], colour, sizeof colour);
        int n = pixels_like(&img, colour, below_legend(svg));
        if (n < min_pixels) fail_msg("series %s (%s): %d pixels of its colour, want %d", ids[i], colour, n, min_pixels);
    }
    free(img.pixels), free(svg), free(pdf);
    unlink(png_path), unlink(pdf_path);
}

/* ---- A real run ---------------------------------------------------------------------------- */

static void test_plot_of_a_training_run(void **state)
{
    (void)state;
    char svg_path[PATH], out[OUT];
    support_path_in(svg_path, dir, "train.svg");
    assert_int_equal(run_toolf(out, sizeof out, "plot %s --out %s", train_log, svg_path), 0);
    assert_non_null(strstr(out, "30 losses, 0 validation losses, 30 learning rates"));
    size_t len;
    char *svg = read_all(svg_path, &len);
    series_facts loss = series_of(svg, "train-loss"), lr = series_of(svg, "lr");
    assert_int_equal(loss.points, TRAIN_STEPS);
    assert_int_equal(loss.drawn, TRAIN_STEPS);
    assert_int_equal(loss.vertices, TRAIN_STEPS);
    assert_int_equal(loss.runs, 1);
    assert_int_equal(lr.points, TRAIN_STEPS);
    assert_int_equal(lr.vertices, TRAIN_STEPS);
    char tag[512];
    assert_false(series_tag(svg, "val-loss", tag, sizeof tag)); /* the run logged none */
    expect_text(svg, "<title>train.jsonl</title>");
    expect_text(svg, ">step</text>");
    expect_text(svg, ">loss</text>");
    expect_text(svg, ">learning rate</text>");
    expect_text(svg, ">train loss</text>");
    free(svg);
    no_temporary_files();
    if (!have_renderer()) skip();
    const char *ids[] = {"train-loss", "lr"};
    expect_renders(svg_path, ids, 2, 300);
}

/* ---- Logs written here -------------------------------------------------------------------- */

/* Nulls, validation lines and a second run appended to the same log. */
static const char *GAPS_LOG =
    "{\"step\":1,\"loss\":3.0,\"lr\":0.001}\n"
    "{\"step\":2,\"loss\":2.5,\"lr\":0.001}\n"
    "{\"step\":3,\"loss\":null,\"lr\":0.001}\n"
    "{\"step\":4,\"loss\":2.0,\"lr\":0.001}\n"
    "{\"step\":4,\"val_loss\":2.2}\n"
    "\n"
    "{\"step\":5,\"loss\":1.5,\"lr\":0.001}\n"
    "{\"step\":6,\"loss\":1.4,\"lr\":0.001}\n"
    "{\"step\":6,\"val_loss\":null}\n"
    "{\"step\":1,\"loss\":3.1,\"lr\":0.001}\n"
    "{\"step\":2,\"loss\":2.9,\"lr\":0.001}\n"
    "{\"step\":2,\"val_loss\":3.0}\n";

static void test_gaps_validation_and_appended_runs(void **state)
{
    (void)state;
    char log[PATH], svg_path[PATH], out[OUT];
    write_text(support_path_in(log, dir, "gaps.jsonl"), GAPS_LOG);
    support_path_in(svg_path, dir, "gaps.svg");
    assert_int_equal(run_toolf(out, sizeof out, "plot %s --out %s --title 'a & b <c>'", log, svg_path), 0);
    size_t len;
    char *svg = read_all(svg_path, &len);
    series_facts loss = series_of(svg, "train-loss"), val = series_of(svg, "val-loss"),
                 lr = series_of(svg, "lr");
    /* 1-2 | 4-6 | (a second run) 1-2 */
    assert_int_equal(loss.points, 7);
    assert_int_equal(loss.runs, 3);
    assert_int_equal(loss.vertices, 7);
    /* 4 | (null) | 2: two lone points, drawn as dots */
    assert_int_equal(val.points, 2);
    assert_int_equal(val.runs, 2);
    assert_int_equal(lr.points, 8);
    assert_int_equal(lr.runs, 2);
    expect_text(svg, "<title>a &amp; b &lt;c&gt;</title>");
    expect_text(svg, ">validation loss</text>");
    free(svg);
    if (!have_renderer()) skip();
    const char *ids[] = {"train-loss", "val-loss", "lr"};
    expect_renders(svg_path, ids, 3, 10);
}

/* --metric grad_norm draws the log's "grad_norm"; --compare a second
 * run's beside it, a colour each, named by the files (what
 * scripts/precision-curves.sh draws fp32 and bf16 runs with). */
static void test_grad_norm_and_compare(void **state)
{
    (void)state;
    char a[PATH], b[PATH], svg_path[PATH], out[OUT];
    write_text(support_path_in(a, dir, "fp32.jsonl"),
               "{\"step\":1,\"loss\":3,\"lr\":0.1,\"grad_norm\":2.5}\n"
               "{\"step\":2,\"loss\":2,\"lr\":0.1,\"grad_norm\":1.5}\n"
               "{\"step\":2,\"val_loss\":2.2}\n"
               "{\"step\":3,\"loss\":1,\"lr\":0.1,\"grad_norm\":0.5}\n");
    write_text(support_path_in(b, dir, "bf16.jsonl"),
               "{\"step\":1,\"loss\":3.1,\"lr\":0.1,\"grad_norm\":2.4}\n"
               "{\"step\":2,\"loss\":2.1,\"lr\":0.1,\"grad_norm\":null}\n");
    support_path_in(svg_path, dir, "norm.svg");
    assert_int_equal(run_toolf(out, sizeof out, "plot %s --metric grad_norm --compare %s --out %s",
                               a, b, svg_path), 0);
    expect_text(out, "(3 and 1 grad_norm points)");
    size_t len;
    char *svg = read_all(svg_path, &len);
    series_facts one = series_of(svg, "run-0"), two = series_of(svg, "run-1");
    assert_int_equal(one.points, 3);
    assert_int_equal(one.vertices, 3);
    assert_int_equal(two.points, 1); /* the null draws nothing */
    expect_text(svg, ">gradient norm</text>");
    expect_text(svg, ">fp32.jsonl</text>");
    expect_text(svg, ">bf16.jsonl</text>");
    assert_null(strstr(svg, "val-loss"));
    free(svg);
    /* The losses of both; one log's gradient norm alone. */
    assert_int_equal(run_toolf(out, sizeof out, "plot %s --compare %s --out %s", a, b, svg_path), 0);
    expect_text(out, "(3 and 2 loss points)");
    assert_int_equal(run_toolf(out, sizeof out, "plot %s --metric grad_norm --out %s", a, svg_path), 0);
    expect_text(out, "(3 grad_norm points)");
    /* A bad value of the metric is named; a --compare that is the --out refused. */
    write_text(b, "{\"step\":1,\"grad_norm\":\"big\"}\n");
    assert_int_equal(run_toolf(out, sizeof out, "plot %s --metric grad_norm --compare %s --out %s",
                               a, b, svg_path), 2);
    expect_text(out, "\"grad_norm\" is neither a number nor null");
    assert_int_equal(run_toolf(out, sizeof out, "plot %s --metric norm --out %s", a, svg_path), 2);
    expect_text(out, "--metric is loss or grad_norm");
}

/* A log of 5000 steps with noise: each line is drawn by the extremes of
 * 500 columns, yet the series still counts every step. */
static void test_long_log_is_thinned(void **state)
{
    (void)state;
    enum { STEPS = 5000 };
    char log[PATH], svg_path[PATH], out[OUT];
    support_path_in(log, dir, "long.jsonl");
    FILE *f = fopen(log, "w");
    assert_non_null(f);
    for (int s = 1; s <= STEPS; s++)
        fprintf(f, "{\"step\":%d,\"loss\":%.4f,\"lr\":%.6f}\n", s, 1.0 + 3.0 / s + (s % 7) * 0.01,
                s < 500 ? 1e-3 * s / 500 : 1e-3);
    assert_int_equal(fclose(f), 0);
    support_path_in(svg_path, dir, "long.svg");
    assert_int_equal(run_toolf(out, sizeof out, "plot %s --out %s", log, svg_path), 0);
    size_t len;
    char *svg = read_all(svg_path, &len);
    series_facts loss = series_of(svg, "train-loss");
    assert_int_equal(loss.points, STEPS);
    assert_in_range(loss.drawn, 500, 1000);
    assert_int_equal(loss.vertices, loss.drawn);
    assert_in_range(series_of(svg, "lr").drawn, 2, 1000);
    assert_in_range(len, 1, 40 * 1024);
    free(svg);
}

/* A log whose last line a full disk cut short ({"step":115,"loss":1, no
 * newline) is drawn from its whole lines, saying the torn one was
 * skipped; a line cut short before others is still refused (test_refusals). */
static void test_torn_last_line_skipped(void **state)
{
    (void)state;
    char log[PATH], svg_path[PATH], out[OUT];
    write_text(support_path_in(log, dir, "torn.jsonl"),
               "{\"step\":113,\"loss\":1.5,\"lr\":0.001}\n"
               "{\"step\":114,\"loss\":1.4,\"lr\":0.001}\n"
               "{\"step\":115,\"loss\":1");
    support_path_in(svg_path, dir, "torn.svg");
    int rc = run_toolf(out, sizeof out, "plot %s --out %s", log, svg_path);
    if (rc != 0) fail_msg("exit %d:\n%s", rc, out);
    expect_text(out, "torn.jsonl:3: skipped a torn last line");
    expect_text(out, "(2 losses");
    size_t len;
    char *svg = read_all(svg_path, &len);
    assert_int_equal(series_of(svg, "train-loss").points, 2);
    free(svg);
    /* The same as the run compared with. */
    rc = run_toolf(out, sizeof out, "plot %s --compare %s --out %s", train_log, log, svg_path);
    if (rc != 0) fail_msg("--compare: exit %d:\n%s", rc, out);
    expect_text(out, "torn.jsonl:3: skipped a torn last line");
}

/* Every number in the SVG's points and coordinates is finite and inside
 * the chart (no "nan", no "inf", nothing drawn off the page). */
static void all_coordinates_on_the_chart(const char *svg)
{
    if (strstr(svg, "nan") || strstr(svg, "inf")) fail_msg("a non-finite coordinate:\n%s", svg);
    for (const char *p = strstr(svg, "<polyline points=\""); p; p = strstr(p, "<polyline points=\"")) {
        p += strlen("<polyline points=\"");
        while (*p == ' ') p++;
        while (*p != '"') {
            char *end;
            double x = strtod(p, &end);
            assert_true(end > p && *end == ',');
            double y = strtod(end + 1, &end);
            if (!(x >= 0 && x <= 800 && y >= 0 && y <= 450)) fail_msg("vertex %g,%g off the chart", x, y);
            p = end;
            while (*p == ' ') p++;
        }
    }
}

/* Finite values near the ends of the doubles (losses of 1e308, a learning
 * rate of -1.7e308) are drawn like any other: every point, one line, on
 * axes whose ticks are finite numbers. */
static void test_extreme_finite_values(void **state)
{
    (void)state;
    char log[PATH], svg_path[PATH], out[OUT];
    write_text(support_path_in(log, dir, "huge.jsonl"),
               "{\"step\":1,\"loss\":1e308,\"lr\":-1.7e308}\n"
               "{\"step\":2,\"loss\":1.7976931348623157e308,\"lr\":0.001}\n"
               "{\"step\":3,\"loss\":2.5,\"lr\":1.7e308}\n"
               "{\"step\":4,\"loss\":-1e308,\"lr\":0.001}\n");
    support_path_in(svg_path, dir, "huge.svg");
    int rc = run_toolf(out, sizeof out, "plot %s --out %s", log, svg_path);
    if (rc != 0) fail_msg("exit %d:\n%s", rc, out);
    expect_text(out, "(4 losses, 0 validation losses, 4 learning rates)");
    size_t len;
    char *svg = read_all(svg_path, &len);
    series_facts loss = series_of(svg, "train-loss"), lr = series_of(svg, "lr");
    assert_int_equal(loss.points, 4);
    assert_int_equal(loss.runs, 1);
    assert_int_equal(loss.vertices, 4);
    assert_int_equal(lr.points, 4);
    assert_int_equal(lr.runs, 1);
    all_coordinates_on_the_chart(svg);
    expect_text(svg, "e+308</text>");
    free(svg);
}

/* ---- Refusals ------------------------------------------------------------------------------- */

typedef struct refusal {
    const char *log_text; /* written to bad.jsonl first; NULL: no file */
    bool log, out;        /* pass bad.jsonl, and --out bad.svg */
    const char *more;     /* further arguments */
    int status;
    const char *message;
} refusal;

static void expect_refusal(const refusal *r)
{
    char log[PATH], svg_path[PATH], out[OUT];
    support_path_in(log, dir, "bad.jsonl");
    support_path_in(svg_path, dir, "bad.svg");
    unlink(log);
    if (r->log_text) write_text(log, r->log_text);
    int rc = run_toolf(out, sizeof out, "plot %s %s %s %s", r->log ? log : "", r->out ? "--out" : "",
                       r->out ? svg_path : "", r->more);
    if (rc != r->status || !strstr(out, r->message))
        fail_msg("plot %s: exit %d, want %d with '%s'; said:\n%s", r->more, rc, r->status, r->message,
                 out);
    assert_false(exists(svg_path));
    no_temporary_files();
}

static void test_refusals(void **state)
{
    (void)state;
    const char *one = "{\"step\":1,\"loss\":2}\n";
    const refusal cases[] = {
        {NULL, true, true, "", 1, "cannot open the log"},
        {"{\"step\":1,\"loss\":2}\n{\"step\":2,\"loss\":\n", true, true, "", 2,
         "bad.jsonl:2: not a JSON object"},
        {"{\"step\":1,\"loss\":2} trailing\n", true, true, "", 2, "bad.jsonl:1: not a JSON object"},
        {"[1, 2]\n", true, true, "", 2, "bad.jsonl:1: not a JSON object"},
        {"{\"step\":1,\"loss\":2}\n\n{\"loss\":2}\n", true, true, "", 2, "bad.jsonl:3: no \"step\""},
        {"{\"step\":\"one\",\"loss\":2}\n", true, true, "", 2, "bad.jsonl:1: no \"step\""},
        {"{\"step\":1,\"loss\":\"low\"}\n", true, true, "", 2, "\"loss\" is neither a number nor null"},
        {"", true, true, "", 2, "the log is empty"},
        {"\n  \n", true, true, "", 2, "the log is empty"},
        {one, true, false, "", 2, "needs a log"},
        {one, false, true, "", 2, "needs a log"},
        {one, true, true, "--colour red", 2, "unknown flag '--colour'"},
        {one, true, false, "other.jsonl", 2, "plot takes one log"},
        {one, true, false, "--out", 2, "--out needs a value"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) expect_refusal(&cases[i]);
}

/* An --out no plot can be written to is refused (exit 2) before the log
 * is read; a write that fails (exit 1, here past a file-size limit) says
 * why; either, like a bad log, leaves an earlier plot whole. */
static void test_failed_writes(void **state)
{
    (void)state;
    char log[PATH], svg_path[PATH], sub[PATH], out[OUT];
    write_text(support_path_in(log, dir, "ok.jsonl"), "{\"step\":1,\"loss\":2,\"lr\":0.1}\n");
    assert_int_equal(run_toolf(out, sizeof out, "plot %s --out %s/missing/x.svg", log, dir), 2);
    assert_non_null(strstr(out, "cannot create a file there"));
    support_path_in(sub, dir, "sub");
    assert_int_equal(mkdir(sub, 0755), 0);
    assert_int_equal(run_toolf(out, sizeof out, "plot %s --out %s", log, sub), 2);
    assert_non_null(strstr(out, "it is a directory"));
    assert_int_equal(run_toolf(out, sizeof out, "plot %s --out %s/", log, sub), 2);
    assert_int_equal(rmdir(sub), 0); /* still an empty directory */
    assert_int_equal(run_toolf(out, sizeof out, "plot %s --out /dev/null", log), 2);
    assert_non_null(strstr(out, "not a regular file"));

    write_text(support_path_in(svg_path, dir, "earlier.svg"), "earlier");
    /* The chart is some KiB; the limit lets a KiB or two be written (SIGXFSZ
     * ignored, so the write fails rather than the process). */
    char cmd[4 * PATH], said[PATH];
    support_path_in(said, dir, "said.txt");
    snprintf(cmd, sizeof cmd, "trap '' XFSZ; ulimit -f 2; exec '%s' plot %s --out %s >%s 2>&1",
             SPMD_TOOL_PATH, log, svg_path, said);
    int status = system(cmd);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 1);
    size_t len;
    char *text = read_all(said, &len);
    assert_non_null(strstr(text, "cannot write the plot"));
    free(text);
    unlink(said);

    write_text(log, "{\"step\":1,\"loss\":2}\nnot json\n");
    assert_int_equal(run_toolf(out, sizeof out, "plot %s --out %s", log, svg_path), 2);
    text = read_all(svg_path, &len);
    assert_string_equal(text, "earlier");
    free(text);
    unlink(svg_path), unlink(log);
    no_temporary_files();
}

/* spmd train --plot draws its own steps (and validations) at the end, the
 * same chart as spmd plot draws of the run's --log; a --plot path no file
 * can be written to is refused before the run. */
static void test_train_plot(void **state)
{
    (void)state;
    char run_svg[PATH], run_log[PATH], log_svg[PATH], out[OUT];
    support_path_in(run_svg, dir, "run.svg");
    support_path_in(run_log, dir, "run.jsonl");
    support_path_in(log_svg, dir, "run-log.svg");
    assert_int_equal(run_toolf(out, sizeof out,
                               "train --steps 12 --eval 0 --val-every 4 --plot %s --log %s", run_svg,
                               run_log), 0);
    assert_int_equal(run_toolf(out, sizeof out, "plot %s --out %s", run_log, log_svg), 0);
    size_t len;
    char *a = read_all(run_svg, &len), *b = read_all(log_svg, &len);
    assert_int_equal(series_of(a, "train-loss").points, 12);
    assert_int_equal(series_of(a, "lr").points, 12);
    assert_int_equal(series_of(a, "val-loss").points, 3);
    /* All but the title. */
    assert_string_equal(strstr(a, "<g class=\"grid\""), strstr(b, "<g class=\"grid\""));
    free(a), free(b);
    unlink(run_svg), unlink(run_log), unlink(log_svg);
    assert_int_equal(run_toolf(out, sizeof out, "train --steps 3 --plot %s", dir), 2);
    assert_non_null(strstr(out, "--plot"));
    no_temporary_files();
}

static void test_help(void **state)
{
    (void)state;
    char out[OUT];
    assert_int_equal(run_tool("plot --help", out, sizeof out), 0);
    assert_non_null(strstr(out, "usage: spmd plot LOG.jsonl --out FILE.svg"));
    assert_int_equal(run_tool("--help", out, sizeof out), 0);
    assert_non_null(strstr(out, "spmd plot LOG.jsonl"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plot_of_a_training_run),
        cmocka_unit_test(test_gaps_validation_and_appended_runs),
        cmocka_unit_test(test_long_log_is_thinned),
        cmocka_unit_test(test_grad_norm_and_compare),
        cmocka_unit_test(test_torn_last_line_skipped),
        cmocka_unit_test(test_extreme_finite_values),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_failed_writes),
        cmocka_unit_test(test_train_plot),
        cmocka_unit_test(test_help),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
