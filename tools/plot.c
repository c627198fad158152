/*
 * Line charts as SVG (see plot.h): scales with nice round ticks, axes,
 * grid, legend and one group per series, written to memory first and then
 * onto the target in one rename.
 */
#include "plot.h"

#include "message.h"

#include "spmd/spmd.h"
#include "train/checkpoint_fs.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Room around the plot area: the title and legend above, tick labels and
 * axis titles below and beside. */
enum { TOP = 64, BOTTOM = 56, LEFT = 72, RIGHT_WITH_AXIS = 84, RIGHT_BARE = 28 };
/* About this many intervals between ticks on an axis. */
enum { TICK_INTERVALS = 5 };

/* Values lo..hi (whole ticks) drawn from pixel px_lo to px_hi.  Values
 * near the ends of the doubles are scaled first: lo, hi and step are in
 * units of 10^exp10 (0 but past 1e300, where a difference of two values,
 * or the tick past the largest, would overflow). */
typedef struct scale {
    double lo, hi, step;
    double px_lo, px_hi;
    int exp10;
    double unit; /* 10^exp10 */
} scale;

/* Past this a scale works in units of 10^SCALED_EXP10. */
#define SCALED_FROM 1e300
enum { SCALED_EXP10 = 20 };

/* The plot area and the scales of its axes. */
typedef struct frame {
    double left, right, top, bottom;
    scale x, y[2];
    bool has_side[2];
} frame;

/* A value in the scale's units (a tick: k * step) to its pixel. */
static double scaled_px(const scale *s, double u)
{
    return s->px_lo + (u - s->lo) / (s->hi - s->lo) * (s->px_hi - s->px_lo);
}

/* A value of the data to its pixel. */
static double to_px(const scale *s, double v)
{
    return scaled_px(s, s->exp10 ? v / s->unit : v);
}

/* 1, 2 or 5 times a power of ten, the first at least `raw`. */
static double nice_step(double raw, bool whole)
{
    double mag = pow(10, floor(log10(raw)));
    double f = raw / mag;
    double step = (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
    return whole && step < 1 ? 1 : step;
}

/* The nice step after `step`: 1 -> 2 -> 5 -> 10. */
static double next_nice(double step)
{
    double mag = pow(10, floor(log10(step) + 1e-9));
    double f = step / mag;
    return (f < 1.5 ? 2 : f < 3.5 ? 5 : 10) * mag;
}

/* Ticks at or around lo and hi; the slack keeps a value that rounding
 * put a hair past a tick (0.003 / 0.001 = 3.0000000000000004) from
 * costing an interval. */
static double tick_below(double v, double step)
{
    return floor(v / step + 1e-9);
}

static double tick_above(double v, double step)
{
    return ceil(v / step - 1e-9);
}

/* A scale over lo..hi widened to whole ticks: about TICK_INTERVALS of
 * them, or exactly `intervals` (2 or more), so that a second axis's ticks
 * meet the first one's grid lines.  A single value gets room around it (a
 * constant learning rate is still a line, not a division by zero). */
static scale make_scale(double lo, double hi, bool whole, bool from_zero, int intervals, double px_lo,
                        double px_hi)
{
    int exp10 = fmax(fabs(lo), fabs(hi)) > SCALED_FROM ? SCALED_EXP10 : 0;
    double unit = exp10 ? pow(10, exp10) : 1;
    if (exp10) lo /= unit, hi /= unit, whole = false;
    if (from_zero && lo > 0) lo = 0;
    if (!(lo < hi)) {
        double pad = lo != 0 ? fabs(lo) / 10 : 1;
        hi = lo + pad;
        if (!(from_zero && lo == 0)) lo -= pad;
    }
    if (intervals < 2) intervals = 0; /* one interval cannot always hold lo..hi */
    scale s = {.px_lo = px_lo, .px_hi = px_hi, .exp10 = exp10, .unit = unit};
    s.step = nice_step((hi - lo) / (intervals ? intervals : TICK_INTERVALS), whole);
    while (intervals && tick_above(hi, s.step) - tick_below(lo, s.step) > intervals)
        s.step = next_nice(s.step);
    s.lo = tick_below(lo, s.step) * s.step;
    s.hi = intervals ? s.lo + intervals * s.step : tick_above(hi, s.step) * s.step;
    return s;
}

/* Ticks k * step for k in first..last. */
static void tick_range(const scale *s, long long *first, long long *last)
{
    *first = llround(s->lo / s->step);
    *last = llround(s->hi / s->step);
}

/* Fixed decimals as fine as the step ("0.0005", "0.00002"); where that
 * would be long, one digit and an exponent ("2.0e-07"), alike on every
 * tick of the axis.  `v` is in the scale's units; a scaled axis writes
 * the exponent of the value itself ("1.5e+308", which may be past the
 * largest double: the tick above the largest value). */
static void tick_label(const scale *s, double v, char *buf, size_t size)
{
    double biggest = fmax(fabs(s->lo), fabs(s->hi));
    if (s->exp10) {
        char text[32], *e;
        snprintf(text, sizeof text, "%.1e", v);
        if (v == 0 || !(e = strchr(text, 'e'))) snprintf(buf, size, "0");
        else snprintf(buf, size, "%.*se%+03d", (int)(e - text), text, atoi(e + 1) + s->exp10);
    } else if (s->step >= 1e-6 && biggest < 1e7) {
        int decimals = s->step >= 1 ? 0 : (int)-floor(log10(s->step) + 1e-9);
        snprintf(buf, size, "%.*f", decimals, v);
    } else {
        snprintf(buf, size, "%.1e", v);
    }
}

/* ---- Text ----------------------------------------------------------------------------- */

/* Length of the valid UTF-8 sequence at s, or 0. */
static int utf8_length(const unsigned char *s)
{
    int n = s[0] < 0x80 ? 1 : (s[0] >> 5) == 6 ? 2 : (s[0] >> 4) == 14 ? 3 : (s[0] >> 3) == 30 ? 4 : 0;
    for (int i = 1; i < n; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    return n;
}

/* `text` (NULL: none) as XML character data: markup escaped, and what no
 * XML parser takes (control characters, bytes that are not UTF-8: a file
 * name may hold them) replaced, so the file always renders. */
static void xml_text(FILE *f, const char *text)
{
    const unsigned char *s = (const unsigned char *)(text ? text : "");
    while (*s) {
        int n = utf8_length(s);
        if (*s == '&') fputs("&amp;", f);
        else if (*s == '<') fputs("&lt;", f);
        else if (*s == '>') fputs("&gt;", f);
        else if (*s == '"') fputs("&quot;", f);
        else if (n == 1 && *s < 0x20) fputc(' ', f);
        else if (n == 0) fputc('?', f);
        else fwrite(s, 1, (size_t)n, f);
        s += n ? n : 1;
    }
}

/* Characters of UTF-8 text, to estimate its width. */
static int text_chars(const char *text)
{
    int n = 0;
    for (const unsigned char *s = (const unsigned char *)(text ? text : ""); *s; s++)
        n += (*s & 0xC0) != 0x80;
    return n;
}

/* ---- The frame -------------------------------------------------------------------------- */

bool plot_point_drawn(const plot_point *p)
{
    return isfinite(p->x) && isfinite(p->y);
}

static void extend(double v, double *lo, double *hi)
{
    if (v < *lo) *lo = v;
    if (v > *hi) *hi = v;
}

/* The plot area and scales that hold every drawable point. */
static frame make_frame(const plot_chart *chart, const plot_series *series, int n_series)
{
    frame fr = {.top = TOP, .bottom = PLOT_HEIGHT - BOTTOM, .left = LEFT};
    double x_lo = INFINITY, x_hi = -INFINITY, y_lo[2] = {INFINITY, INFINITY}, y_hi[2] = {-INFINITY, -INFINITY};
    for (int i = 0; i < n_series; i++) {
        const plot_series *s = &series[i];
        fr.has_side[s->side] = true;
        for (int j = 0; j < s->n; j++) {
            if (!plot_point_drawn(&s->points[j])) continue;
            extend(s->points[j].x, &x_lo, &x_hi);
            extend(s->points[j].y, &y_lo[s->side], &y_hi[s->side]);
        }
    }
    fr.right = PLOT_WIDTH - (fr.has_side[PLOT_RIGHT] ? RIGHT_WITH_AXIS : RIGHT_BARE);
    /* No point at all: an empty unit square rather than no chart. */
    if (x_lo > x_hi) x_lo = 0, x_hi = 1;
    fr.x = make_scale(x_lo, x_hi, chart->x_whole, false, 0, fr.left, fr.right);
    for (int side = 0; side < 2; side++)
        if (y_lo[side] > y_hi[side]) y_lo[side] = 0, y_hi[side] = 1;
    const bool *zero = chart->y_from_zero;
    fr.y[PLOT_LEFT] = make_scale(y_lo[0], y_hi[0], false, zero[0], 0, fr.bottom, fr.top);
    /* The right axis takes as many intervals as the left, so the grid
     * lines serve both. */
    const scale *l = &fr.y[PLOT_LEFT];
    int intervals = fr.has_side[PLOT_LEFT] ? (int)llround((l->hi - l->lo) / l->step) : 0;
    fr.y[PLOT_RIGHT] = make_scale(y_lo[1], y_hi[1], false, zero[1], intervals, fr.bottom, fr.top);
    return fr;
}

/* ---- Drawing ------------------------------------------------------------------------------ */

static void draw_title(FILE *f, const char *title)
{
    fprintf(f, "<text class=\"title\" x=\"%d\" y=\"26\" text-anchor=\"middle\" font-size=\"16\" "
               "font-weight=\"bold\">", PLOT_WIDTH / 2);
    xml_text(f, title);
    fputs("</text>\n", f);
}

/* Light lines at the x ticks and at the ticks of the left axis (the right
 * one's when only it is drawn), under everything else. */
static void draw_grid(FILE *f, const frame *fr)
{
    long long first, last;
    fputs("<g class=\"grid\" stroke=\"#e4e4e4\" stroke-width=\"1\">\n", f);
    tick_range(&fr->x, &first, &last);
    for (long long k = first; k <= last; k++) {
        double x = scaled_px(&fr->x, (double)k * fr->x.step);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", x, fr->top, x, fr->bottom);
    }
    const scale *y = &fr->y[fr->has_side[PLOT_LEFT] ? PLOT_LEFT : PLOT_RIGHT];
    tick_range(y, &first, &last);
    for (long long k = first; k <= last; k++) {
        double py = scaled_px(y, (double)k * y->step);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", fr->left, py, fr->right, py);
    }
    fputs("</g>\n", f);
}

static void draw_x_axis(FILE *f, const frame *fr, const char *title)
{
    long long first, last;
    fprintf(f, "<g class=\"axis x-axis\" stroke=\"#333\">\n"
               "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n",
            fr->left, fr->bottom, fr->right, fr->bottom);
    tick_range(&fr->x, &first, &last);
    for (long long k = first; k <= last; k++) {
        double v = (double)k * fr->x.step, x = scaled_px(&fr->x, v);
        char label[32];
        tick_label(&fr->x, v, label, sizeof label);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", x, fr->bottom, x,
                fr->bottom + 5);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" stroke=\"none\">%s</text>\n", x,
                fr->bottom + 19, label);
    }
    fprintf(f, "<text class=\"axis-title\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" stroke=\"none\">",
            (fr->left + fr->right) / 2, fr->bottom + 42);
    xml_text(f, title);
    fputs("</text>\n</g>\n", f);
}

/* A y axis at the left or right edge of the plot area: ticks and labels
 * outside it, the title turned along it. */
static void draw_y_axis(FILE *f, const frame *fr, plot_side side, const char *title)
{
    const scale *y = &fr->y[side];
    bool left = side == PLOT_LEFT;
    double edge = left ? fr->left : fr->right, out = left ? -1 : 1;
    long long first, last;
    fprintf(f, "<g class=\"axis y-axis %s\" stroke=\"#333\">\n"
               "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n",
            left ? "left" : "right", edge, fr->top, edge, fr->bottom);
    tick_range(y, &first, &last);
    for (long long k = first; k <= last; k++) {
        double v = (double)k * y->step, py = scaled_px(y, v);
        char label[32];
        tick_label(y, v, label, sizeof label);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", edge, py, edge + 5 * out, py);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\" stroke=\"none\">%s</text>\n",
                edge + 8 * out, py + 4, left ? "end" : "start", label);
    }
    double tx = left ? 18 : PLOT_WIDTH - 12, ty = (fr->top + fr->bottom) / 2;
    fprintf(f, "<text class=\"axis-title\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" "
               "transform=\"rotate(-90 %.1f %.1f)\" stroke=\"none\">",
            tx, ty, tx, ty);
    xml_text(f, title);
    fputs("</text>\n</g>\n", f);
}

/* ---- Series ------------------------------------------------------------------------------- */

/* One vertex " x,y"; with f NULL, nothing (a count only). */
static void vertex(FILE *f, const frame *fr, const plot_series *s, int i)
{
    if (!f) return;
    const plot_point *p = &s->points[i];
    fprintf(f, " %.1f,%.1f", to_px(&fr->x, p->x), to_px(&fr->y[s->side], p->y));
}

/* The column of the chart an x falls in, for thinning. */
static int column_of(const frame *fr, double x)
{
    double u = (to_px(&fr->x, x) - fr->left) / (fr->right - fr->left);
    int c = (int)(u * PLOT_COLUMNS);
    return c < 0 ? 0 : c >= PLOT_COLUMNS ? PLOT_COLUMNS - 1 : c;
}

/* The points low and high, in their order along the line; how many. */
static int extremes(FILE *f, const frame *fr, const plot_series *s, int low, int high)
{
    vertex(f, fr, s, low < high ? low : high);
    if (low == high) return 1;
    vertex(f, fr, s, low < high ? high : low);
    return 2;
}

/* A long run as the lowest and highest point of each column it crosses:
 * every pixel the full line would reach is still reached. */
static int thinned_run(FILE *f, const frame *fr, const plot_series *s, int from, int to)
{
    int drawn = 0, column = column_of(fr, s->points[from].x), low = from, high = from;
    for (int i = from + 1; i < to; i++) {
        int c = column_of(fr, s->points[i].x);
        double y = s->points[i].y;
        if (c != column) {
            drawn += extremes(f, fr, s, low, high);
            column = c, low = high = i;
        } else if (y < s->points[low].y) {
            low = i;
        } else if (y > s->points[high].y) {
            high = i;
        }
    }
    return drawn + extremes(f, fr, s, low, high);
}

/* The vertices of the unbroken run [from, to); how many. */
static int run_vertices(FILE *f, const frame *fr, const plot_series *s, int from, int to)
{
    if (to - from > PLOT_MAX_DRAWN) return thinned_run(f, fr, s, from, to);
    for (int i = from; i < to; i++) vertex(f, fr, s, i);
    return to - from;
}

/* The next unbroken run at or after *i, as [*from, *i); false at the end. */
static bool next_run(const plot_series *s, int *i, int *from)
{
    while (*i < s->n && !plot_point_drawn(&s->points[*i])) (*i)++;
    if (*i == s->n) return false;
    *from = *i;
    while (*i < s->n && plot_point_drawn(&s->points[*i])) (*i)++;
    return true;
}

static void dot(FILE *f, const frame *fr, const plot_series *s, int i)
{
    const plot_point *p = &s->points[i];
    fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"%s\" stroke=\"none\"/>\n",
            to_px(&fr->x, p->x), to_px(&fr->y[s->side], p->y), s->colour);
}

/* Each run a polyline (a lone point a dot), or, with f NULL, only the
 * counts: finite points, runs and vertices drawn. */
static void runs(FILE *f, const frame *fr, const plot_series *s, int *points, int *n_runs, int *drawn)
{
    *points = *n_runs = *drawn = 0;
    for (int i = 0, from; next_run(s, &i, &from);) {
        (*n_runs)++;
        *points += i - from;
        if (i - from == 1) {
            if (f && !s->markers) dot(f, fr, s, from);
            (*drawn)++;
            continue;
        }
        if (f) fputs("<polyline points=\"", f);
        *drawn += run_vertices(f, fr, s, from, i);
        if (f) fputs("\"/>\n", f);
    }
}

static void draw_series(FILE *f, const frame *fr, const plot_series *s)
{
    int points, n_runs, drawn;
    runs(NULL, fr, s, &points, &n_runs, &drawn);
    fprintf(f, "<g class=\"series %s\" id=\"%s\" data-points=\"%d\" data-drawn=\"%d\" data-runs=\"%d\" "
               "fill=\"none\" stroke=\"%s\" stroke-width=\"2\" stroke-linejoin=\"round\"%s>\n",
            s->id, s->id, points, drawn, n_runs, s->colour, s->dashed ? " stroke-dasharray=\"6 4\"" : "");
    runs(f, fr, s, &points, &n_runs, &drawn);
    for (int i = 0; s->markers && i < s->n; i++)
        if (plot_point_drawn(&s->points[i])) dot(f, fr, s, i);
    fputs("</g>\n", f);
}

/* One row under the title: a stroke of each series' line and its name
 * (a series without a name is not listed). */
static void draw_legend(FILE *f, const frame *fr, const plot_series *series, int n_series)
{
    double x = fr->left, y = 46;
    fputs("<g class=\"legend\">\n", f);
    for (int i = 0; i < n_series; i++) {
        const plot_series *s = &series[i];
        if (!s->name) continue;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"%s/>\n",
                x, y, x + 24, y, s->colour, s->dashed ? " stroke-dasharray=\"6 4\"" : "");
        if (s->markers)
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"%s\"/>\n", x + 12, y, s->colour);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">", x + 30, y + 4);
        xml_text(f, s->name);
        fputs("</text>\n", f);
        x += 30 + 6.5 * text_chars(s->name) + 22; /* about 6.5 px a character at 12 px */
    }
    fputs("</g>\n", f);
}

static void draw_chart(FILE *f, const plot_chart *chart, const plot_series *series, int n_series)
{
    frame fr = make_frame(chart, series, n_series);
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
               "font-family=\"sans-serif\" font-size=\"12\">\n<title>",
            PLOT_WIDTH, PLOT_HEIGHT, PLOT_WIDTH, PLOT_HEIGHT);
    xml_text(f, chart->title);
    fprintf(f, "</title>\n<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", PLOT_WIDTH, PLOT_HEIGHT);
    draw_title(f, chart->title);
    draw_grid(f, &fr);
    draw_x_axis(f, &fr, chart->x_title);
    for (int side = 0; side < 2; side++)
        if (fr.has_side[side]) draw_y_axis(f, &fr, (plot_side)side, chart->y_title[side]);
    for (int i = 0; i < n_series; i++) draw_series(f, &fr, &series[i]);
    draw_legend(f, &fr, series, n_series);
    fputs("</svg>\n", f);
}

/* ---- Writing -------------------------------------------------------------------------------- */

/* Why a file at `path` cannot be written (renaming over a directory or a
 * device is never meant; a path too long has no room), or NULL; its
 * directory goes to `dir` and its name to *name. */
static const char *not_a_file(const char *path, char *dir, size_t size, const char **name)
{
    const char *slash = strrchr(path, '/');
    *name = slash ? slash + 1 : path;
    if (!**name) return "it names a directory";
    size_t dir_len = !slash || slash == path ? 1 : (size_t)(slash - path);
    if (dir_len >= size) return "the path is too long";
    snprintf(dir, size, "%.*s", (int)dir_len, slash ? path : ".");
    struct stat st;
    if (stat(path, &st) != 0) return NULL; /* a new file */
    if (S_ISDIR(st.st_mode)) return "it is a directory";
    return S_ISREG(st.st_mode) ? NULL : "it is not a regular file";
}

/* `path` replaced by `n` bytes of `data` in one rename; 0 or 1 with a message. */
static int replace_file(const char *path, const char *data, size_t n)
{
    char dir[PATH_MAX], what[PATH_MAX + 32];
    const char *name, *why = not_a_file(path, dir, sizeof dir, &name);
    if (why) {
        cli_fail("cannot write the plot %s: %s", path, why);
        return 1;
    }
    snprintf(what, sizeof what, "cannot write the plot %s", path);
    if (ckpt_replace_file(dir, name, data, n, what) == SPMD_OK) return 0;
    cli_fail("%s", spmd_last_error());
    return 1;
}

int plot_write_svg(const char *path, const plot_chart *chart, const plot_series *series, int n_series)
{
    char *svg = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&svg, &len);
    if (!f) {
        cli_fail("cannot write the plot %s: out of memory", path);
        return 1;
    }
    draw_chart(f, chart, series, n_series);
    bool failed = ferror(f) != 0;
    if (fclose(f) != 0) failed = true;
    int rc = 0;
    if (failed) {
        cli_fail("cannot write the plot %s: out of memory", path);
        rc = 1;
    } else {
        rc = replace_file(path, svg, len);
    }
    free(svg);
    return rc;
}

void plot_xml(FILE *f, const char *text) { xml_text(f, text); }

int plot_write_file(const char *path, const char *svg, size_t n) { return replace_file(path, svg, n); }
