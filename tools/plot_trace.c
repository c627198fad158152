/* One traced step as an SVG picture (see plot_trace.h). */
#include "plot_trace.h"

#include "message.h"
#include "plot.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* COMM: the height of a communication thread's lane, under its device's
 * (LANE) after COMM_GAP: thinner, since it only ever runs collectives. */
enum { WIDTH = 1000, LEFT = 90, RIGHT = 20, TOP = 48, LANE = 30, COMM = 12, COMM_GAP = 2, GAP = 6,
       MOST_LANES = 64 };

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

/* A communication lane's background, in the lanes and the legend. */
static const char COMM_FILL[] = "#eeeeee";
/* Compute of the odd micro-batches (the GPT with stages), lighter than
 * the even ones' so that each micro-batch stands apart on its lane. */
static const char ODD_MICRO_FILL[] = "#93b1dd";
/* A stage transfer: mostly the wait for the neighbouring stage, so the
 * pipeline's bubble shows as these boxes. */
static const char TRANSFER_FILL[] = "#d9d9d9";

static bool is_transfer(const spmd_trace_event *e) { return e->op && !strcmp(e->op, "stage_transfer"); }

/* A device's lane, and whether a communication lane goes under it. */
typedef struct lane {
    int device;
    bool comm;
} lane;

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

static int lane_height(const lane *l) { return LANE + (l->comm ? COMM_GAP + COMM : 0) + GAP; }

/* What hovering a box shows: the node and its time; a collective's kind,
 * axes, bytes and value first. */
static void box_title(FILE *f, const spmd_trace_event *e, const spmd_collective_info *c)
{
    if (e->kind == SPMD_TRACE_UPDATE) {
        fprintf(f, "update %.1f us", e->dur_us);
        return;
    }
    if (!c->kind) {
        plot_xml(f, e->op ? e->op : "");
        fprintf(f, " ");
        plot_xml(f, e->name);
        fprintf(f, " %s %.1f us", e->shape, e->dur_us);
        if (e->micro_batch >= 0) fprintf(f, " micro-batch %d", e->micro_batch);
        return;
    }
    char bytes[32];
    fprintf(f, "%s over ", c->kind);
    plot_xml(f, c->axes);
    fprintf(f, ": %s of ", message_bytes((double)c->bytes, bytes, sizeof bytes));
    plot_xml(f, c->tensor);
    fprintf(f, " (");
    plot_xml(f, e->name);
    fprintf(f, " %s) %.1f us", e->shape, e->dur_us);
    if (e->kind == SPMD_TRACE_IN_FLIGHT)
        fprintf(f, " in flight; the device waited %.1f us for it", e->wait_us);
}

static void box(FILE *f, const spmd_trace_event *e, const spmd_collective_info *c, double t0,
                double span, int y, int height)
{
    double plot_w = WIDTH - LEFT - RIGHT;
    int k = colour_of(e, c->kind);
    const char *class = e->kind == SPMD_TRACE_IN_FLIGHT ? "in-flight"
                        : is_transfer(e)                 ? "transfer"
                        : k == 0                         ? "compute"
                        : k == N_COLOURS - 1             ? "update"
                                                         : "collective";
    double x = LEFT + (e->start_us - t0) / span * plot_w, w = e->dur_us / span * plot_w;
    const char *fill = is_transfer(e)                       ? TRANSFER_FILL
                       : k == 0 && e->micro_batch % 2 == 1 ? ODD_MICRO_FILL
                                                           : COLOURS[k].colour;
    fprintf(f, "<rect class=\"%s\" x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"%d\" fill=\"%s\"><title>",
            class, x, y, w > 0.3 ? w : 0.3, height, fill);
    box_title(f, e, c);
    fprintf(f, "</title></rect>\n");
}

/* A micro-batch's number over its run of boxes on a lane, where the run
 * is wide enough for it. */
static void micro_label(FILE *f, int micro, double from_us, double to_us, double t0, double span, int y)
{
    double plot_w = WIDTH - LEFT - RIGHT, x0 = LEFT + (from_us - t0) / span * plot_w,
           x1 = LEFT + (to_us - t0) / span * plot_w;
    if (micro < 0 || x1 - x0 < 10) return;
    fprintf(f, "<text class=\"micro\" x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" font-size=\"10\" "
               "fill=\"white\">%d</text>\n", (x0 + x1) / 2, y + LANE / 2 + 4, micro);
}

/* Over each run of a lane's boxes of one micro-batch, its number.  A
 * stage transfer ends the run and is in none (its box is mostly the wait
 * for the neighbour: no micro-batch's work), so a stage's forward and
 * backward of one micro-batch are two runs around the bubble. */
static void micro_labels(FILE *f, const spmd_trace_event *ev, int n, int device, double t0, double span,
                         int y)
{
    int micro = -1;
    double from = 0, to = 0;
    for (int i = 0; i < n; i++) {
        const spmd_trace_event *e = &ev[i];
        if (e->device != device || e->kind == SPMD_TRACE_RUN || e->kind == SPMD_TRACE_IN_FLIGHT) continue;
        bool transfer = is_transfer(e);
        if (transfer || e->micro_batch != micro) {
            micro_label(f, micro, from, to, t0, span, y);
            micro = transfer ? -1 : e->micro_batch, from = e->start_us;
        }
        to = e->start_us + e->dur_us;
    }
    micro_label(f, micro, from, to, t0, span, y);
}

static void draw(FILE *f, const char *title, const spmd_trace_event *ev,
                 const spmd_collective_info *colls, int n, const lane *lanes, int n_lanes, double t0,
                 double t1)
{
    int axis_y = TOP;
    bool any_comm = false;
    for (int l = 0; l < n_lanes; l++) axis_y += lane_height(&lanes[l]), any_comm |= lanes[l].comm;
    bool any_micro = false, any_transfer = false;
    for (int i = 0; i < n; i++) any_micro |= ev[i].micro_batch >= 0, any_transfer |= is_transfer(&ev[i]);
    int height = axis_y + 70 + (any_micro || any_transfer ? 24 : 0);
    double span = t1 > t0 ? t1 - t0 : 1, plot_w = WIDTH - LEFT - RIGHT;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
               "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n",
            WIDTH, height, WIDTH, height);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(f, "<text x=\"%d\" y=\"24\" font-size=\"15\">", LEFT);
    plot_xml(f, title);
    fprintf(f, "</text>\n");
    /* Time axis, in milliseconds from the step's first event. */
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
    int y = TOP;
    for (int l = 0; l < n_lanes; l++) {
        int d = lanes[l].device;
        fprintf(f, "<g class=\"lane\" data-device=\"%d\">\n<text x=\"%d\" y=\"%d\" "
                   "text-anchor=\"end\">device %d</text>\n", d, LEFT - 8, y + LANE / 2 + 4, d);
        for (int i = 0; i < n; i++)
            if (ev[i].device == d && ev[i].kind != SPMD_TRACE_RUN && ev[i].kind != SPMD_TRACE_IN_FLIGHT)
                box(f, &ev[i], &colls[i], t0, span, y, LANE);
        micro_labels(f, ev, n, d, t0, span, y);
        fprintf(f, "</g>\n");
        if (lanes[l].comm) {
            /* The device's communication thread: its collectives in flight. */
            int cy = y + LANE + COMM_GAP;
            fprintf(f, "<g class=\"comm\" data-device=\"%d\">\n<text x=\"%d\" y=\"%d\" "
                       "text-anchor=\"end\" font-size=\"10\" fill=\"#555\">comm</text>\n"
                       "<rect x=\"%d\" y=\"%d\" width=\"%.0f\" height=\"%d\" fill=\"%s\"/>\n",
                    d, LEFT - 8, cy + COMM - 2, LEFT, cy, plot_w, COMM, COMM_FILL);
            for (int i = 0; i < n; i++)
                if (ev[i].device == d && ev[i].kind == SPMD_TRACE_IN_FLIGHT)
                    box(f, &ev[i], &colls[i], t0, span, cy, COMM);
            fprintf(f, "</g>\n");
        }
        y += lane_height(&lanes[l]);
    }
    /* Legend: the colours, and the thin lanes when there are any. */
    int x = LEFT, ly = axis_y + 52;
    fprintf(f, "<g class=\"legend\">\n");
    for (int c = 0; c < N_COLOURS; c++) {
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"12\" fill=\"%s\"/>"
                   "<text x=\"%d\" y=\"%d\">%s</text>\n", x, ly - 10, COLOURS[c].colour, x + 16,
                ly, COLOURS[c].label);
        x += 24 + 8 * (int)strlen(COLOURS[c].label);
    }
    if (any_comm) {
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"6\" fill=\"%s\" stroke=\"#999\"/>"
                   "<text x=\"%d\" y=\"%d\">comm: in flight</text>\n", x, ly - 7, COMM_FILL, x + 16, ly);
        x += 24 + 8 * (int)strlen("comm: in flight");
    }
    /* With stages, a second row: the micro-batches' shades and the transfers. */
    if (any_micro)
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"12\" fill=\"%s\"/>"
                   "<text x=\"%d\" y=\"%d\">compute of an odd micro-batch (each numbered)</text>\n", LEFT,
                ly + 8, ODD_MICRO_FILL, LEFT + 16, ly + 18);
    if (any_transfer)
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"12\" fill=\"%s\"/>"
                   "<text x=\"%d\" y=\"%d\">stage transfer (mostly waiting for the other stage)</text>\n",
                LEFT + 400, ly + 8, TRANSFER_FILL, LEFT + 416, ly + 18);
    fprintf(f, "</g>\n</svg>\n");
}

int plot_write_trace_svg(const char *path, const char *title, const spmd_trace_event *events,
                         const spmd_collective_info *colls, int n)
{
    lane lanes[MOST_LANES];
    int n_lanes = 0;
    double t0 = INFINITY, t1 = -INFINITY;
    for (int i = 0; i < n; i++) {
        if (events[i].kind == SPMD_TRACE_RUN) continue;
        int l = 0;
        while (l < n_lanes && lanes[l].device != events[i].device) l++;
        if (l == n_lanes && n_lanes < MOST_LANES) lanes[n_lanes++] = (lane){events[i].device, false};
        if (l < n_lanes && events[i].kind == SPMD_TRACE_IN_FLIGHT) lanes[l].comm = true;
        t0 = fmin(t0, events[i].start_us);
        t1 = fmax(t1, events[i].start_us + events[i].dur_us);
    }
    if (!n_lanes) return cli_fail("--trace-plot %s: no step was traced", path), 1;
    char *svg = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&svg, &len);
    if (!f) return cli_fail("cannot write the plot %s: out of memory", path), 1;
    draw(f, title, events, colls, n, lanes, n_lanes, t0, t1);
    bool failed = ferror(f) != 0;
    if (fclose(f) != 0) failed = true;
    int rc = failed ? (cli_fail("cannot write the plot %s: out of memory", path), 1)
                    : plot_write_file(path, svg, len);
    free(svg);
    return rc;
}
