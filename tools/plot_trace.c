/* One traced step as an SVG picture (see plot_trace.h). */
#include "plot_trace.h"

#include "message.h"
#include "plot.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { WIDTH = 1000, LEFT = 90, RIGHT = 20, TOP = 48, LANE = 30, GAP = 6, MOST_LANES = 64 };

typedef struct kind_colour {
    const char *kind, *label, *colour;
} kind_colour;

/* Compute first, then the collectives' kinds (spmd_collective_info), the update last. */
static const kind_colour COLOURS[] = {
    {"compute", "compute", "#4c72b0"},
    {"all-gather", "all-gather", "#dd8452"},
    {"reduce-scatter", "reduce-scatter", "#55a868"},
    {"all-reduce", "all-reduce", "#c44e52"},
    {"all-to-all", "all-to-all", "#8172b3"},
    {"update", "update", "#937860"},
};
enum { N_COLOURS = sizeof COLOURS / sizeof *COLOURS };

static int colour_of(const spmd_trace_event *e, const char *kind)
{
    if (e->kind == SPMD_TRACE_UPDATE) return N_COLOURS - 1;
    for (int c = 1; kind && c < N_COLOURS - 1; c++)
        if (!strcmp(kind, COLOURS[c].kind)) return c;
    return 0;
}

/* A round tick step (1, 2 or 5 times a power of ten) giving about 8 ticks. */
static double tick_step(double span)
{
    double raw = span / 8, p = pow(10, floor(log10(raw))), m = raw / p;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

static void draw(FILE *f, const char *title, const spmd_trace_event *ev, const char *const *kinds,
                 int n, const int *lanes, int n_lanes, double t0, double t1)
{
    int height = TOP + n_lanes * (LANE + GAP) + 70;
    double span = t1 > t0 ? t1 - t0 : 1, plot_w = WIDTH - LEFT - RIGHT;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
               "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n",
            WIDTH, height, WIDTH, height);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(f, "<text x=\"%d\" y=\"24\" font-size=\"15\">", LEFT);
    plot_xml(f, title);
    fprintf(f, "</text>\n");
    /* Time axis, in milliseconds from the step's first event. */
    int axis_y = TOP + n_lanes * (LANE + GAP);
    double step = tick_step(span / 1e3);
    fprintf(f, "<g class=\"axis\" stroke=\"#ccc\">\n");
    for (double v = 0; v <= span / 1e3 + 1e-9; v += step) {
        double x = LEFT + v * 1e3 / span * plot_w;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\"/>\n", x, TOP - 4, x, axis_y);
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" stroke=\"none\" "
                   "fill=\"#333\">%g</text>\n", x, axis_y + 16, v);
    }
    fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" stroke=\"none\" fill=\"#333\">"
               "ms</text>\n</g>\n", LEFT + plot_w / 2, axis_y + 32);
    for (int l = 0; l < n_lanes; l++) {
        int y = TOP + l * (LANE + GAP);
        fprintf(f, "<g class=\"lane\" data-device=\"%d\">\n<text x=\"%d\" y=\"%d\" "
                   "text-anchor=\"end\">device %d</text>\n", lanes[l], LEFT - 8, y + LANE / 2 + 4,
                lanes[l]);
        for (int i = 0; i < n; i++) {
            if (ev[i].device != lanes[l] || ev[i].kind == SPMD_TRACE_RUN) continue;
            int c = colour_of(&ev[i], kinds[i]);
            double x = LEFT + (ev[i].start_us - t0) / span * plot_w, w = ev[i].dur_us / span * plot_w;
            fprintf(f, "<rect class=\"%s\" x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"%d\" "
                       "fill=\"%s\"><title>", c == 0 ? "compute" : c == N_COLOURS - 1 ? "update" : "collective", x, y,
                    w > 0.3 ? w : 0.3, LANE, COLOURS[c].colour);
            plot_xml(f, ev[i].kind == SPMD_TRACE_UPDATE ? "update" : kinds[i] ? kinds[i] : ev[i].op);
            fprintf(f, " ");
            plot_xml(f, ev[i].name);
            fprintf(f, " %s %.1f us</title></rect>\n", ev[i].shape, ev[i].dur_us);
        }
        fprintf(f, "</g>\n");
    }
    /* Legend: the colours. */
    int x = LEFT, y = axis_y + 52;
    fprintf(f, "<g class=\"legend\">\n");
    for (int c = 0; c < N_COLOURS; c++) {
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"12\" fill=\"%s\"/>"
                   "<text x=\"%d\" y=\"%d\">%s</text>\n", x, y - 10, COLOURS[c].colour, x + 16,
                y, COLOURS[c].label);
        x += 24 + 8 * (int)strlen(COLOURS[c].label);
    }
    fprintf(f, "</g>\n</svg>\n");
}

int plot_write_trace_svg(const char *path, const char *title, const spmd_trace_event *events,
                         const char *const *kinds, int n)
{
    int lanes[MOST_LANES], n_lanes = 0;
    double t0 = INFINITY, t1 = -INFINITY;
    for (int i = 0; i < n; i++) {
        if (events[i].kind == SPMD_TRACE_RUN) continue;
        bool seen = false;
        for (int l = 0; l < n_lanes; l++) seen |= lanes[l] == events[i].device;
        if (!seen && n_lanes < MOST_LANES) lanes[n_lanes++] = events[i].device;
        t0 = fmin(t0, events[i].start_us);
        t1 = fmax(t1, events[i].start_us + events[i].dur_us);
    }
    if (!n_lanes) return cli_fail("--trace-plot %s: no step was traced", path), 1;
    char *svg = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&svg, &len);
    if (!f) return cli_fail("cannot write the plot %s: out of memory", path), 1;
    draw(f, title, events, kinds, n, lanes, n_lanes, t0, t1);
    bool failed = ferror(f) != 0;
    if (fclose(f) != 0) failed = true;
    int rc = failed ? (cli_fail("cannot write the plot %s: out of memory", path), 1)
                    : plot_write_file(path, svg, len);
    free(svg);
    return rc;
}
