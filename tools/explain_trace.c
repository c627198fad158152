/* `spmd explain --trace` (see explain_trace.h). */
#include "explain_trace.h"

#include "flag_table.h"
#include "message.h"
#include "settings_agree.h"

#include "train/checkpoint_fs.h"

#include <cJSON.h>

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The whole of a regular file, NUL-terminated; NULL with a message. */
static char *read_whole(const char *path, size_t *len)
{
    const char *why;
    int fd = ckpt_open_regular(path, &why); /* without blocking: a FIFO is refused */
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        if (why) cli_fail("--trace %s: %s (the trace spmd train --trace wrote)", path, why);
        else cli_fail("--trace %s: cannot open it: %s", path, strerror(errno));
        if (fd >= 0) close(fd);
        return NULL;
    }
    size_t size = (size_t)st.st_size, got = 0;
    char *text = malloc(size + 1);
    while (text && got < size) {
        ssize_t r = read(fd, text + got, size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    int err = errno;
    close(fd);
    if (!text || got != size) {
        cli_fail("--trace %s: cannot read it: %s", path, text ? strerror(err) : "out of memory");
        free(text);
        return NULL;
    }
    text[size] = '\0';
    *len = size;
    return text;
}

static const char *string_of(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static bool number_of(const cJSON *o, const char *key, double *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) return false;
    *out = v->valuedouble;
    return true;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* A box's start and length in microseconds: never negative, and within a
 * week of the trace's start (a few steps are traced; past that, sums of
 * boxes could reach infinity). */
#define TRACE_MOST_US 6.048e11

/* A field no run writes: refused naming the event, the field and its
 * value.  0, or 2 with a message. */
static int impossible(const char *path, int event, const char *name, const char *key, double v,
                      const char *rule)
{
    char where[128];
    if (event < 0) snprintf(where, sizeof where, "its otherData");
    else snprintf(where, sizeof where, "its event %d (%s)", event, name ? name : "unnamed");
    return cli_fail("--trace %s: %s has \"%s\" %.10g, %s: not a trace as spmd train --trace "
                    "writes one", path, where, key, v, rule);
}

/* Whether `v` is a whole number in [lo, 2^53]. */
static bool whole_from(double v, double lo)
{
    return v >= lo && v <= 9007199254740992.0 && v == floor(v);
}

/* The fields every later step reads, checked for what no run can have:
 * negative or endless boxes, counts below zero, steps that do not run
 * forward.  0, or 2 with a message. */
static int check_fields(const char *path, const cJSON *events, const cJSON *about)
{
    const struct {
        const char *key;
        double lo;
        const char *rule;
    } counts[] = {{"params", 0, "a count of parameters is a whole number from 0"},
                  {"collectives", 0, "a count of collectives is a whole number from 0"},
                  {"first_step", 1, "steps count from 1"},
                  {"processes", 1, "a run has a whole number of processes from 1"}};
    for (size_t i = 0; i < sizeof counts / sizeof *counts; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(about, counts[i].key);
        if (cJSON_IsNumber(v) && !whole_from(v->valuedouble, counts[i].lo))
            return impossible(path, -1, NULL, counts[i].key, v->valuedouble, counts[i].rule);
    }
    double first = 1, last = 1;
    if (number_of(about, "first_step", &first) && number_of(about, "last_step", &last) &&
        !whole_from(last, first))
        return impossible(path, -1, NULL, "last_step", last, "before its first_step");
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, events)
    {
        static const char *const keys[] = {"ts", "dur"};
        for (int k = 0; k < 2; k++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(e, keys[k]);
            if (v && (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble <= TRACE_MOST_US)))
                return impossible(path, i, string_of(e, "name"), keys[k],
                                  cJSON_IsNumber(v) ? v->valuedouble : NAN,
                                  "where a box starts and lasts from 0 to a week of microseconds");
        }
        i++;
    }
    return 0;
}

/* Text that grows, for a message. */
typedef struct said {
    char buf[2048];
    size_t len;
    int items;
} said;

static void say(said *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(said *s, const char *fmt, ...)
{
    if (s->len >= sizeof s->buf - 1) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(s->buf + s->len, sizeof s->buf - s->len, fmt, ap);
    va_end(ap);
    if (n > 0) s->len += (size_t)n < sizeof s->buf - s->len ? (size_t)n : sizeof s->buf - 1 - s->len;
    s->items++;
}

/* The flags of the traced run (the trace's otherData.flags) that differ
 * from this explain's, "--hidden 64 (here 65), ..."; none for a trace
 * without them.  Left out: each process's own settings and outputs, the
 * trace's own path, and what explain sets itself (no evaluation). */
static void flags_that_differ(const cJSON *about, const cli_opts *o, said *s)
{
    static const char *const skipped[] = {"--threads", "--blas", "--blas-core", "--json", "--log",
                                          "--plot", "--log-every", "--trace", "--eval",
                                          "--val-batches"};
    enum { SHOWN = 8 };
    const cJSON *flags = cJSON_GetObjectItemCaseSensitive(about, "flags");
    int differ = 0;
    for (int i = 0; cJSON_IsObject(flags) && i < flag_row_count; i++) {
        const flag_spec *fs = &flag_rows[i];
        bool skip = !(fs->commands & CMD_EXPLAIN);
        for (size_t k = 0; !skip && k < sizeof skipped / sizeof *skipped; k++)
            skip = !strcmp(fs->name, skipped[k]);
        const char *theirs = skip ? NULL : string_of(flags, fs->name);
        char *ours = theirs ? settings_value_text(fs, o) : NULL;
        if (ours && strcmp(theirs, ours) && differ++ < SHOWN)
            say(s, "%s%s %s (here %s)", s->items ? ", " : "", fs->name, theirs, ours);
        free(ours);
    }
    if (differ > SHOWN) say(s, " and %d flags more", differ - SHOWN);
}

/* What differs between the traced run and this plan: its flags, then the
 * figures that differ of model, parameters, mesh and collectives. */
static void what_differs(const cJSON *about, const cli_opts *o, const char *model, double params,
                         const char *mesh, int n, said *s)
{
    flags_that_differ(about, o, s);
    const char *t_model = string_of(about, "model"), *t_mesh = string_of(about, "mesh");
    double t_params = -1, t_n = -1;
    number_of(about, "params", &t_params);
    number_of(about, "collectives", &t_n);
    const char *sep = s->items ? "; " : "";
    int before = s->items;
    if (t_model && strcmp(t_model, model))
        say(s, "%smodel %s (here %s)", s->items > before ? ", " : sep, t_model, model);
    if (t_params != params)
        say(s, "%s%.0f parameters (here %.0f)", s->items > before ? ", " : sep, t_params, params);
    if (t_mesh && strcmp(t_mesh, mesh))
        say(s, "%smesh %s (here %s)", s->items > before ? ", " : sep, t_mesh, mesh);
    if (t_n != n)
        say(s, "%s%.0f collectives a step (here %d)", s->items > before ? ", " : sep, t_n, n);
}

/* The boxes of collective events, checked against p; 0 or 2.  A
 * collective in flight has two: its hand-over on the device's track (no
 * time) and its run on the communication track (in_flight), which is
 * its time; the first pass (in_flight) takes those, the second the
 * device tracks' boxes of collectives the first found none of (blocking
 * steps, or a trace made with --overlap off). */
static int collect(const char *path, const cJSON *events, const spmd_program *p, const char *differs,
                   double **durs, int *counts, bool in_flight)
{
    int n = spmd_program_collective_count(p);
    const cJSON *e;
    bool *had = calloc((size_t)(n ? n : 1), sizeof *had);
    if (!had) return cli_fail("--trace %s: out of memory", path), 1;
    for (int i = 0; i < n; i++) had[i] = counts[i] > 0;
    int rc = 0;
    cJSON_ArrayForEach(e, events)
    {
        const char *cat = string_of(e, "cat");
        if (!cat || strcmp(cat, "collective")) continue;
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(args, "in_flight")) != in_flight) continue;
        double index, dur, bytes;
        const char *kind = string_of(args, "kind"), *value = string_of(args, "value");
        if (!number_of(args, "collective", &index) || !number_of(e, "dur", &dur) ||
            !number_of(args, "bytes", &bytes) || !kind || !value) {
            rc = (cli_fail("--trace %s: a collective's box has no index, dur, kind, bytes or value "
                          "(not written by this version of spmd train --trace)", path), 2);
            break;
        }
        spmd_collective_info c;
        if (index < 0 || index >= n || index != floor(index) ||
            spmd_program_collective(p, (int)index, &c) != SPMD_OK) {
            rc = (cli_fail("--trace %s: it traced collective %.0f; this plan has %d (0 to %d): a "
                          "trace of other flags", path, index, n, n - 1), 2);
            break;
        }
        if (strcmp(c.kind, kind) || (double)c.bytes != bytes || strcmp(c.tensor, value)) {
            rc = (cli_fail("--trace %s: its collective %d is a %s of %s, %.0f bytes a device; this "
                          "plan's is a %s of %s, %lld bytes: a trace of other flags (%s)", path,
                          (int)index, kind, value, bytes, c.kind, c.tensor, (long long)c.bytes,
                          *differs ? differs : "--zero, --fsdp, --shard, --batch ..."), 2);
            break;
        }
        int i = (int)index;
        if (had[i]) continue;
        if ((counts[i] & (counts[i] - 1)) == 0) { /* 0, 1, 2, 4, ...: room for twice as many */
            double *grown = realloc(durs[i], (size_t)(counts[i] ? 2 * counts[i] : 1) * sizeof *grown);
            if (!grown) {
                rc = (cli_fail("--trace %s: out of memory", path), 1);
                break;
            }
            durs[i] = grown;
        }
        durs[i][counts[i]++] = dur;
    }
    free(had);
    return rc;
}

/* A step's box on a device's track. */
typedef struct step_box {
    int device, step;
    double from, to;
} step_box;

/* Each device's idle fraction over the traced steps, and each step's
 * mean over the devices (explain_trace.h): 1 - (its compute boxes, stage
 * transfers left out, and its update) over (its steps' boxes).  A box
 * counts in the step box of its track that it starts in.  A device's
 * tracks are its id; its communication thread's (ids from the mesh's
 * size up) are left out.  0, or 1. */
static int idle_fractions(const cJSON *events, int devices, int first, int last, explain_measured *out)
{
    /* Each traced step has a box: a trace claiming more steps than it has
     * events has boxes for none past that many. */
    if (last - first >= cJSON_GetArraySize(events)) last = first + cJSON_GetArraySize(events) - 1;
    if (last < first) last = first;
    int n_steps = last - first + 1, cells = devices * n_steps, n_boxes = 0;
    double *step = calloc((size_t)cells, sizeof *step), *busy = calloc((size_t)cells, sizeof *busy);
    step_box *boxes = malloc((size_t)(cJSON_GetArraySize(events) + 1) * sizeof *boxes);
    out->idle = calloc((size_t)devices, sizeof *out->idle);
    out->steps = calloc((size_t)n_steps, sizeof *out->steps);
    out->step_idle = calloc((size_t)n_steps, sizeof *out->step_idle);
    if (!step || !busy || !boxes || !out->idle || !out->steps || !out->step_idle) {
        free(step), free(busy), free(boxes);
        return cli_fail("--trace: out of memory"), 1;
    }
    out->n_devices = devices;
    out->n_steps = n_steps;
    const cJSON *e;
    cJSON_ArrayForEach(e, events)
    {
        const char *cat = string_of(e, "cat");
        double tid, ts, dur, number;
        if (!cat || strcmp(cat, "step") || !number_of(e, "tid", &tid) || !number_of(e, "ts", &ts) ||
            !number_of(e, "dur", &dur) || tid < 0 || tid >= devices || tid != floor(tid) ||
            !number_of(cJSON_GetObjectItemCaseSensitive(e, "args"), "step", &number) || number < first ||
            number > last || number != floor(number))
            continue;
        boxes[n_boxes++] = (step_box){(int)tid, (int)number - first, ts, ts + dur};
        step[(int)tid * n_steps + (int)number - first] += dur;
    }
    cJSON_ArrayForEach(e, events)
    {
        const char *cat = string_of(e, "cat"), *op = string_of(cJSON_GetObjectItemCaseSensitive(e, "args"), "op");
        double tid, ts, dur;
        if (!cat || !number_of(e, "tid", &tid) || !number_of(e, "ts", &ts) || !number_of(e, "dur", &dur) ||
            tid < 0 || tid >= devices || tid != floor(tid))
            continue;
        if (strcmp(cat, "update") && (strcmp(cat, "compute") || !op || !strcmp(op, "stage_transfer"))) continue;
        for (int b = 0; b < n_boxes; b++)
            if (boxes[b].device == (int)tid && ts >= boxes[b].from && ts <= boxes[b].to) {
                busy[(int)tid * n_steps + boxes[b].step] += dur;
                break;
            }
    }
    for (int d = 0; d < devices; d++) {
        double all = 0, used = 0;
        for (int k = 0; k < n_steps; k++) all += step[d * n_steps + k], used += busy[d * n_steps + k];
        out->idle[d] = all > 0 ? fmin(1, fmax(0, 1 - used / all)) : NAN; /* clock rounding at the ends */
    }
    for (int k = 0; k < n_steps; k++) {
        double sum = 0;
        int n = 0;
        for (int d = 0; d < devices; d++)
            if (step[d * n_steps + k] > 0) sum += fmin(1, fmax(0, 1 - busy[d * n_steps + k] / step[d * n_steps + k])), n++;
        out->steps[k] = first + k;
        out->step_idle[k] = n ? sum / n : NAN;
    }
    free(step), free(busy), free(boxes);
    return 0;
}

double explain_idle_mean(const explain_measured *m)
{
    double sum = 0;
    int n = 0;
    for (int d = 0; d < m->n_devices; d++)
        if (!isnan(m->idle[d])) sum += m->idle[d], n++;
    return n ? sum / n : NAN;
}

double explain_idle_best(const explain_measured *m, int *step)
{
    double best = NAN;
    for (int k = 0; k < m->n_steps; k++)
        if (!isnan(m->step_idle[k]) && (isnan(best) || m->step_idle[k] < best))
            best = m->step_idle[k], *step = m->steps[k];
    return best;
}

int explain_trace_read(const char *path, const cli_opts *o, double params, const char *mesh,
                       const spmd_program *p, explain_measured *out)
{
    const char *model = o->model;
    *out = (explain_measured){0};
    size_t len = 0;
    char *text = read_whole(path, &len);
    if (!text) return 1;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *events = cJSON_GetObjectItemCaseSensitive(root, "traceEvents");
    const cJSON *about = cJSON_GetObjectItemCaseSensitive(root, "otherData");
    const char *t_model = string_of(about, "model"), *t_mesh = string_of(about, "mesh");
    double t_params = -1, t_n = -1, first = 0, last = 0;
    if (!cJSON_IsArray(events) || !t_model || !t_mesh || !number_of(about, "params", &t_params) ||
        !number_of(about, "collectives", &t_n) || !number_of(about, "first_step", &first) ||
        !number_of(about, "last_step", &last)) {
        cJSON_Delete(root);
        return cli_fail("--trace %s: not a trace spmd train --trace wrote (no traceEvents, or no "
                        "model, params, mesh, collectives and steps in otherData)", path), 2;
    }
    int rc = check_fields(path, events, about);
    if (rc) {
        cJSON_Delete(root);
        return rc;
    }
    int n = spmd_program_collective_count(p);
    said differs = {.len = 0};
    what_differs(about, o, model, params, mesh, n, &differs);
    if (strcmp(t_model, model) || t_params != params || strcmp(t_mesh, mesh) || t_n != n) {
        cJSON_Delete(root);
        return cli_fail("--trace %s: a trace of another plan: %s: explain with the flags of the "
                        "traced run", path, differs.buf), 2;
    }
    double **durs = calloc((size_t)(n ? n : 1), sizeof *durs);
    out->n = n;
    out->median_us = calloc((size_t)(n ? n : 1), sizeof *out->median_us);
    out->samples = calloc((size_t)(n ? n : 1), sizeof *out->samples);
    rc = durs && out->median_us && out->samples ? collect(path, events, p, differs.buf, durs, out->samples, true)
                                                    : (cli_fail("--trace: out of memory"), 1);
    if (!rc) rc = collect(path, events, p, differs.buf, durs, out->samples, false);
    for (int i = 0; !rc && i < n; i++) {
        int k = out->samples[i];
        if (!k) {
            out->median_us[i] = NAN;
            continue;
        }
        qsort(durs[i], (size_t)k, sizeof *durs[i], by_value);
        out->median_us[i] = k % 2 ? durs[i][k / 2] : 0.5 * (durs[i][k / 2 - 1] + durs[i][k / 2]);
    }
    if (!rc && o->pp) rc = idle_fractions(events, spmd_program_devices(p), (int)first, (int)last, out);
    for (int i = 0; durs && i < n; i++) free(durs[i]);
    free(durs);
    cJSON_Delete(root);
    out->first_step = (int)first;
    out->last_step = (int)last;
    if (rc) explain_measured_free(out);
    return rc;
}

void explain_measured_free(explain_measured *m)
{
    free(m->median_us);
    free(m->samples);
    free(m->idle);
    free(m->steps);
    free(m->step_idle);
    *m = (explain_measured){0};
}
