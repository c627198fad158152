/*
 * Line charts as SVG: series of (x, y) points against a shared x axis and
 * a left or right y axis.  plot_curves.h draws a run's training curves
 * with them; plot_cmd.c is `spmd plot LOG.jsonl --out FILE.svg`.
 */
#ifndef SPMD_TOOLS_PLOT_H
#define SPMD_TOOLS_PLOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* A point whose x or y is not finite (a null in a log) is not drawn, and
 * the line breaks there; every finite one is, up to +-DBL_MAX. */
typedef struct plot_point {
    double x, y;
} plot_point;

/* Whether the point is drawn (both finite). */
bool plot_point_drawn(const plot_point *p);

typedef enum plot_side { PLOT_LEFT, PLOT_RIGHT } plot_side;

typedef struct plot_series {
    const char *name;   /* legend text: "train loss"; NULL: not in the legend */
    const char *id;     /* id and class in the SVG: letters, digits, '-' */
    const char *colour; /* an SVG colour: "#1f77b4" */
    plot_side side;     /* the y axis it is read against */
    bool dashed;        /* a dashed line (tells a right-axis series apart) */
    bool markers;       /* a dot at every point drawn (sparse series) */
    const plot_point *points;
    int n;
} plot_series;

typedef struct plot_chart {
    const char *title;      /* NULL for none, as for the axis titles */
    const char *x_title;
    const char *y_title[2]; /* by plot_side; an axis no series uses is not drawn */
    bool x_whole;           /* x counts something (steps): ticks on whole numbers */
    bool y_from_zero[2];    /* by plot_side: the axis starts at 0 (or below) */
} plot_chart;

/* Each series becomes `<g class="series ID" id="ID" data-points="N"
 * data-drawn="D" data-runs="R">` with one <polyline> per unbroken run
 * (a run of one point is a <circle>): N counts the finite points given,
 * R the runs, D the vertices drawn.  D is N unless a run has more than
 * PLOT_MAX_DRAWN points: such a run is drawn by the lowest and highest
 * point of each of PLOT_COLUMNS columns across the chart, which draws the
 * same picture at the chart's size in a bounded number of bytes.
 * The chart is PLOT_WIDTH x PLOT_HEIGHT, with axes, nice round ticks,
 * axis titles, a legend and the title.  It is written whole or not at
 * all: a temporary file beside `path`, renamed over it.  0, or 1 (for
 * an exit status) with the reason on stderr as "spmd: ...". */
enum { PLOT_WIDTH = 800, PLOT_HEIGHT = 450, PLOT_COLUMNS = 500, PLOT_MAX_DRAWN = 2 * PLOT_COLUMNS };
int plot_write_svg(const char *path, const plot_chart *chart, const plot_series *series,
                   int n_series);
/* For other pictures (plot_trace.h): `text` as XML character data, and
 * an SVG of n bytes written whole, as plot_write_svg writes its own. */
void plot_xml(FILE *f, const char *text);
int plot_write_file(const char *path, const char *svg, size_t n);

#endif
