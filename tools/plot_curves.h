/*
 * A run's training curves (loss, validation loss, learning rate by step)
 * and the charts of them: what `spmd train --plot` and `spmd plot` draw.
 */
#ifndef SPMD_TOOLS_PLOT_CURVES_H
#define SPMD_TOOLS_PLOT_CURVES_H

#include "plot.h"

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
/* One curve of each of n runs (their loss, or their gradient norm in the
 * loss's place) on one chart, a colour per run named names[i] (series ids
 * "run-I"), the left axis titled `y_title`.  0, or 1 with a message. */
int plot_write_runs_svg(const char *path, const char *title, const char *y_title,
                        const plot_training *runs, const char *const *names, int n);

#endif
