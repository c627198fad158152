/*
 * `spmd plot LOG.jsonl --out FILE.svg`: the log that
 * `spmd train --log` writes (one JSON object a line: step, loss, lr, ...;
 * a validation line {"step":N,"val_loss":X}) drawn as a loss chart.
 * An --out no file can be written to is refused first; any bad line
 * refuses the whole log, naming the line; either way nothing is written.
 * But a last line without its newline that is not whole JSON is a write
 * cut short (a full disk, a machine that went down): it is skipped, saying
 * so, and the whole lines before it are drawn.
 */
#include "commands/plot_cmd.h"

#include "flags.h"
#include "message.h"
#include "paths.h"
#include "plot.h"
#include "plot_curves.h"

#include "train/checkpoint_fs.h"

#include <cJSON.h>

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* One line's object into the curves; 0, or an exit status with a message.
 * A line that `may_be_torn` (the last, without its newline) and does not
 * parse is left out, with *torn set. */
static int read_line(const log_place *at, const char *text, size_t len, bool grad_norm,
                     bool may_be_torn, bool *torn, plot_training *t)
{
    const char *end = text;
    cJSON *obj = cJSON_ParseWithLengthOpts(text, len, &end, false);
    int rc = 0;
    if (!obj && may_be_torn) {
        *torn = true;
        return 0;
    }
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
    if (grad_norm) { /* --metric grad_norm: the norm in the loss's curve */
        if (!rc) rc = take(at, obj, "grad_norm", x, &t->loss);
    } else {
        if (!rc) rc = take(at, obj, "loss", x, &t->loss);
        if (!rc) rc = take(at, obj, "val_loss", x, &t->val_loss);
        if (!rc) rc = take(at, obj, "lr", x, &t->lr);
    }
    cJSON_Delete(obj);
    return rc;
}

/* The curves of the log at `path`; 0, or an exit status with a message. */
static int read_log(const char *path, bool grad_norm, plot_training *t)
{
    const char *why;
    int fd = ckpt_open_regular(path, &why);
    FILE *f = fd >= 0 ? fdopen(fd, "r") : NULL;
    if (!f) {
        if (fd >= 0) close(fd);
        cli_fail("cannot open the log %s: %s", path, why ? why : strerror(errno));
        return 1;
    }
    char *line = NULL;
    size_t room = 0;
    ssize_t len;
    int rc = 0, objects = 0;
    log_place at = {path, 0};
    bool torn = false;
    while (!rc && (len = getline(&line, &room, f)) >= 0) {
        at.line++;
        bool last_without_newline = len > 0 && line[len - 1] != '\n';
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) len--;
        if (blank(line, line + len)) continue;
        rc = read_line(&at, line, (size_t)len, grad_norm, last_without_newline, &torn, t);
        if (torn) {
            int shown = len > 40 ? 40 : (int)len;
            fprintf(stderr, "spmd: warning: %s:%d: skipped a torn last line ('%.*s%s': no newline "
                            "and not whole JSON, a write cut short)\n",
                    path, at.line, shown, line, len > 40 ? "..." : "");
        } else {
            objects++;
        }
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

static int finite_points(const plot_curve *c)
{
    int n = 0;
    for (int i = 0; i < c->n; i++) n += plot_point_drawn(&c->points[i]);
    return n;
}

int cmd_plot(int argc, char **argv)
{
    cli_opts o;
    int rc = flags_read(argc, argv, CMD_PLOT, &o);
    if (rc) return rc < 0 ? 0 : rc;
    struct {
        const char *log, *out, *title;
    } a = {o.operand, o.out, o.title};
    if (!a.log || !a.out) {
        flags_usage(stderr, CMD_PLOT);
        return cli_fail("plot needs a log (spmd train --log FILE.jsonl) and --out FILE.svg");
    }
    int n_in = o.compare ? 2 : 1;
    if ((rc = paths_check(&o))) return rc;
    plot_training t = {0}, u = {0};
    rc = read_log(a.log, o.plot_grad_norm, &t);
    if (!rc && o.compare) rc = read_log(o.compare, o.plot_grad_norm, &u);
    const char *slash = strrchr(a.log, '/');
    const char *title = a.title ? a.title : slash ? slash + 1 : a.log;
    if (!rc && !o.compare && !o.plot_grad_norm) {
        rc = plot_write_training_svg(a.out, title, &t);
        if (!rc)
            printf("plot: %s -> %s (%d losses, %d validation losses, %d learning rates)\n", a.log,
                   a.out, finite_points(&t.loss), finite_points(&t.val_loss), finite_points(&t.lr));
    } else if (!rc) {
        /* One curve a run, named by its file. */
        const plot_training runs[2] = {t, u};
        const char *names[2] = {slash ? slash + 1 : a.log, NULL};
        if (o.compare) names[1] = strrchr(o.compare, '/') ? strrchr(o.compare, '/') + 1 : o.compare;
        const char *what = o.plot_grad_norm ? "gradient norm" : "loss";
        rc = plot_write_runs_svg(a.out, title, what, runs, names, n_in);
        if (!rc && o.compare)
            printf("plot: %s, %s -> %s (%d and %d %s points)\n", a.log, o.compare, a.out,
                   finite_points(&t.loss), finite_points(&u.loss), o.plot_grad_norm ? "grad_norm" : "loss");
        else if (!rc)
            printf("plot: %s -> %s (%d grad_norm points)\n", a.log, a.out, finite_points(&t.loss));
    }
    plot_training_free(&u);
    plot_training_free(&t);
    return rc;
}
