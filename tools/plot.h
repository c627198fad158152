/*
 * Loss plots as SVG.  plot.c draws line charts: series of (x, y) points
 * against a shared x axis and a left or right y axis.  plot_cmd.c keeps a
 * run's training curves (loss, validation loss, learning rate by step),
 * draws them on one chart, and is `spmd plot LOG.jsonl --out FILE.svg`,
 * which reads the curves from a `spmd train --log` file.
 */
#ifndef SPMD_TOOLS_PLOT_H
#define SPMD_TOOLS_PLOT_H

#include <stdbool.h>

/* ---- Line charts (plot.c) ------------------------------------------------------- */

/* A point whose x or y is not finite (a null in a log) or beyond
 * +-1e300 is not drawn, and the line breaks there. */
typedef struct plot_point {
    double x, y;
} plot_point;

/* Whether the point is drawn (finite, within +-1e300). */
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
/* Refuse, before a long run, a path no plot could be written to (a
 * directory, a device, a place where no file can be created): 0, or 2
 * with "spmd: FLAG PATH: why". */
int plot_check_path(const char *flag, const char *path);

/* ---- Training curves (plot_cmd.c) ------------------------------------------------- */

/* Points in the order given, growing as they come. */
typedef struct plot_curve {
    plot_point *points;
    int n, room;
} plot_curve;

/* One run's curves by step: loss and learning rate at every step, and
 * the validation loss where it was measured. */
typedef struct plot_training {
    plot_curve loss, val_loss, lr;
} plot_training;

/* Append (x, y); a non-finite y (NaN for a null) breaks the line.  An x
 * that does not pass the last one (a log that a second run, or a resumed
 * one, appended to) starts a new line rather than one drawn back across
 * the chart.  0, or 1 with a message (out of memory). */
int plot_curve_add(plot_curve *c, double x, double y);
void plot_training_free(plot_training *t);
/* The curves on one chart: losses against the left axis, the learning
 * rate (dashed) against the right; a curve without points is left out.
 * 0, or 1 with a message (plot_write_svg). */
int plot_write_training_svg(const char *path, const char *title, const plot_training *t);
/* The losses of n copies (independent models) on one chart, a colour per
 * copy: training loss as a line, validation loss as dots (series ids
 * "copy-C-loss" and "copy-C-val"); the learning rates, which differ, are
 * left out.  0, or 1 with a message. */
int plot_write_copies_svg(const char *path, const char *title, const plot_training *copies, int n);

/* `spmd plot LOG.jsonl --out FILE.svg [--title TEXT]`: 0, or the exit
 * status with a message (2: bad flags, an --out no file can be written
 * to, a bad log; 1: a log that cannot be read, a write that fails). */
int cmd_plot(int argc, char **argv);

#endif
