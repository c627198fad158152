/* Training curves and their charts (see plot_curves.h). */
#include "plot_curves.h"

#include "message.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- Curves ------------------------------------------------------------------------------ */

static int push(plot_curve *c, double x, double y)
{
    if (c->n == c->room) {
        bool full = c->room > INT_MAX / 2; /* an int counts the points */
        int room = full ? c->room : c->room ? 2 * c->room : 256;
        plot_point *p = full ? NULL : realloc(c->points, (size_t)room * sizeof *p);
        if (!p) {
            cli_fail("no room for more than %d points on a curve", c->room);
            return 1;
        }
        c->points = p;
        c->room = room;
    }
    c->points[c->n++] = (plot_point){x, y};
    return 0;
}

int plot_curve_add(plot_curve *c, double x, double y)
{
    /* A step that goes back starts another run of steps: a gap first, so
     * no line joins the end of one to the start of the next. */
    bool back = c->n > 0 && isfinite(c->points[c->n - 1].x) && !(x > c->points[c->n - 1].x);
    if (back && push(c, NAN, NAN)) return 1;
    return push(c, x, y);
}

void plot_training_free(plot_training *t)
{
    free(t->loss.points);
    free(t->val_loss.points);
    free(t->lr.points);
    *t = (plot_training){0};
}

int plot_write_training_svg(const char *path, const char *title, const plot_training *t)
{
    const plot_series all[] = {
        {"train loss", "train-loss", "#1f77b4", PLOT_LEFT, false, false, t->loss.points, t->loss.n},
        /* Validation comes every so many steps: dots show where. */
        {"validation loss", "val-loss", "#ff7f0e", PLOT_LEFT, false, true, t->val_loss.points,
         t->val_loss.n},
        {"learning rate (right axis)", "lr", "#2ca02c", PLOT_RIGHT, true, false, t->lr.points, t->lr.n},
    };
    plot_series shown[3];
    int n = 0;
    for (int i = 0; i < 3; i++)
        if (all[i].n > 0) shown[n++] = all[i];
    const plot_chart chart = {.title = title,
                              .x_title = "step",
                              .y_title = {"loss", "learning rate"},
                              .x_whole = true,
                              .y_from_zero = {false, true}};
    return plot_write_svg(path, &chart, shown, n);
}

int plot_write_copies_svg(const char *path, const char *title, const plot_training *copies, int n)
{
    /* Matplotlib's ten category colours, again past ten copies. */
    static const char *const colours[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                          "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
    plot_series *series = calloc((size_t)(2 * n > 0 ? 2 * n : 1), sizeof *series);
    char(*names)[32] = calloc((size_t)(3 * n > 0 ? 3 * n : 1), sizeof *names);
    if (!series || !names) {
        free(series), free(names);
        cli_fail("out of memory for the plot of %d copies", n);
        return 1;
    }
    int k = 0;
    for (int c = 0; c < n; c++) {
        const char *colour = colours[c % 10];
        char *loss_name = names[3 * c], *loss_id = names[3 * c + 1], *val_id = names[3 * c + 2];
        snprintf(loss_name, 32, "copy %d", c);
        snprintf(loss_id, 32, "copy-%d-loss", c);
        snprintf(val_id, 32, "copy-%d-val", c);
        if (copies[c].loss.n)
            series[k++] = (plot_series){loss_name, loss_id, colour, PLOT_LEFT, false, false,
                                        copies[c].loss.points, copies[c].loss.n};
        if (copies[c].val_loss.n)
            /* Dots in the line's colour: no legend entry of their own. */
            series[k++] = (plot_series){NULL, val_id, colour, PLOT_LEFT, false, true,
                                        copies[c].val_loss.points, copies[c].val_loss.n};
    }
    const plot_chart chart = {.title = title,
                              .x_title = "step",
                              .y_title = {"loss", NULL},
                              .x_whole = true,
                              .y_from_zero = {false, false}};
    int rc = plot_write_svg(path, &chart, series, k);
    free(series), free(names);
    return rc;
}

int plot_write_runs_svg(const char *path, const char *title, const char *y_title,
                        const plot_training *runs, const char *const *names, int n)
{
    static const char *const colours[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"};
    enum { MAX_RUNS = 4 };
    plot_series series[MAX_RUNS];
    char ids[MAX_RUNS][16];
    int k = 0;
    for (int i = 0; i < n && i < MAX_RUNS; i++) {
        snprintf(ids[i], sizeof ids[i], "run-%d", i);
        if (runs[i].loss.n)
            series[k++] = (plot_series){names[i], ids[i], colours[i], PLOT_LEFT, false, false,
                                        runs[i].loss.points, runs[i].loss.n};
    }
    const plot_chart chart = {.title = title,
                              .x_title = "step",
                              .y_title = {y_title, NULL},
                              .x_whole = true,
                              .y_from_zero = {false, false}};
    return plot_write_svg(path, &chart, series, k);
}
