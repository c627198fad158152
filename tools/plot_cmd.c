/*
 * Training curves and `spmd plot LOG.jsonl --out FILE.svg`: the log that
 * `spmd train --log` writes (one JSON object a line: step, loss, lr, ...;
 * a validation line {"step":N,"val_loss":X}) drawn as a loss chart.
 * An --out no file can be written to is refused first; any bad line
 * refuses the whole log, naming the line; either way nothing is written.
 */
#include "plot.h"

#include "cli.h"

#include <cJSON.h>

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* ---- The log ------------------------------------------------------------------------------- */

/* Where a message points: "LOG:LINE". */
typedef struct log_place {
    const char *path;
    int line;
} log_place;

/* A value of the log that is a number, null (NaN: a break in the line)
 * or absent (false); anything else is refused.  0, or 2 with a message. */
static int number_or_null(const log_place *at, const cJSON *obj, const char *key, bool *present,
                          double *v)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);
    *present = item != NULL;
    if (!item) return 0;
    if (cJSON_IsNull(item)) *v = NAN;
    else if (cJSON_IsNumber(item)) *v = item->valuedouble;
    else return cli_fail("%s:%d: \"%s\" is neither a number nor null", at->path, at->line, key);
    return 0;
}

/* One curve's point of this line, when the line has `key`. */
static int take(const log_place *at, const cJSON *obj, const char *key, double step, plot_curve *c)
{
    bool present;
    double v = NAN;
    int rc = number_or_null(at, obj, key, &present, &v);
    if (rc || !present) return rc;
    return plot_curve_add(c, step, v);
}

static bool blank(const char *s, const char *end)
{
    while (s < end && isspace((unsigned char)*s)) s++;
    return s == end;
}

/* One line's object into the curves; 0, or an exit status with a message. */
static int read_line(const log_place *at, const char *text, size_t len, plot_training *t)
{
    const char *end = text;
    cJSON *obj = cJSON_ParseWithLengthOpts(text, len, &end, false);
    int rc = 0;
    if (!obj || !cJSON_IsObject(obj) || !blank(end, text + len)) {
        int shown = len > 40 ? 40 : (int)len;
        rc = cli_fail("%s:%d: not a JSON object: '%.*s%s'", at->path, at->line, shown, text,
                      len > 40 ? "..." : "");
        cJSON_Delete(obj);
        return rc;
    }
    const cJSON *step = cJSON_GetObjectItemCaseSensitive(obj, "step");
    if (!cJSON_IsNumber(step) || !isfinite(step->valuedouble))
        rc = cli_fail("%s:%d: no \"step\" number: every line of the log names its step", at->path,
                      at->line);
    double x = rc ? 0 : step->valuedouble;
    if (!rc) rc = take(at, obj, "loss", x, &t->loss);
    if (!rc) rc = take(at, obj, "val_loss", x, &t->val_loss);
    if (!rc) rc = take(at, obj, "lr", x, &t->lr);
    cJSON_Delete(obj);
    return rc;
}

/* The curves of the log at `path`; 0, or an exit status with a message. */
static int read_log(const char *path, plot_training *t)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        cli_fail("cannot open the log %s: %s", path, strerror(errno));
        return 1;
    }
    char *line = NULL;
    size_t room = 0;
    ssize_t len;
    int rc = 0, objects = 0;
    log_place at = {path, 0};
    while (!rc && (len = getline(&line, &room, f)) >= 0) {
        at.line++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) len--;
        if (blank(line, line + len)) continue;
        rc = read_line(&at, line, (size_t)len, t);
        objects++;
    }
    if (!rc && ferror(f)) {
        cli_fail("cannot read the log %s: %s", path, strerror(errno));
        rc = 1;
    }
    free(line);
    fclose(f);
    if (!rc && !objects) rc = cli_fail("%s: the log is empty: no step to plot", path);
    return rc;
}

/* ---- The command ---------------------------------------------------------------------------- */

static void plot_usage(FILE *f)
{
    fprintf(f, "usage: spmd plot LOG.jsonl --out FILE.svg [--title TEXT]\n"
               "  LOG.jsonl       a log of spmd train --log: one JSON object a line with \"step\",\n"
               "                  and \"loss\", \"lr\" or \"val_loss\" (null: a break in the line)\n"
               "  --out FILE.svg  the chart to write (replaced in one step)\n"
               "  --title TEXT    its title (the log's file name)\n");
}

typedef struct plot_args {
    const char *log, *out, *title;
} plot_args;

/* Flags as "--flag VALUE" or "--flag=VALUE"; 0, -1 after help, or 2. */
static int parse(int argc, char **argv, plot_args *a)
{
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
            plot_usage(stdout);
            return -1;
        }
        if (arg[0] != '-') {
            if (a->log) return cli_fail("plot takes one log, got '%s' and '%s'", a->log, arg);
            a->log = arg;
            continue;
        }
        const char *eq = strchr(arg, '=');
        size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
        const char **field = len == 5 && !strncmp(arg, "--out", 5)     ? &a->out
                             : len == 7 && !strncmp(arg, "--title", 7) ? &a->title
                                                                       : NULL;
        if (!field) {
            plot_usage(stderr);
            return cli_fail("unknown flag '%.*s'", (int)len, arg);
        }
        const char *v = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
        if (!v) return cli_fail("%.*s needs a value", (int)len, arg);
        *field = v;
    }
    if (!a->log || !a->out) {
        plot_usage(stderr);
        return cli_fail("plot needs a log (spmd train --log FILE.jsonl) and --out FILE.svg");
    }
    return 0;
}

static int finite_points(const plot_curve *c)
{
    int n = 0;
    for (int i = 0; i < c->n; i++) n += plot_point_drawn(&c->points[i]);
    return n;
}

int cmd_plot(int argc, char **argv)
{
    plot_args a = {0};
    int rc = parse(argc, argv, &a);
    if (rc) return rc < 0 ? 0 : rc;
    if ((rc = plot_check_path("--out", a.out))) return rc;
    plot_training t = {0};
    rc = read_log(a.log, &t);
    if (!rc) {
        const char *slash = strrchr(a.log, '/');
        rc = plot_write_training_svg(a.out, a.title ? a.title : slash ? slash + 1 : a.log, &t);
    }
    if (!rc)
        printf("plot: %s -> %s (%d losses, %d validation losses, %d learning rates)\n", a.log, a.out,
               finite_points(&t.loss), finite_points(&t.val_loss), finite_points(&t.lr));
    plot_training_free(&t);
    return rc;
}
