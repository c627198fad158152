/* `spmd explain --trace` (see explain_trace.h). */
#include "explain_trace.h"

#include "message.h"

#include "train/checkpoint_fs.h"

#include <cJSON.h>

#include <errno.h>
#include <fcntl.h>
#include <math.h>
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

/* "gpt, 0.23M parameters, mesh 4x2 (replica, fsdp), 100 collectives" */
static void run_text(char *buf, size_t size, const char *model, double params, const char *mesh, int n)
{
    snprintf(buf, size, "%s, %.2fM parameters, mesh %s, %d collectives a step", model, params / 1e6, mesh,
             n);
}

/* The boxes of collective events, checked against p; 0 or 2.  A
 * collective in flight has two: its hand-over on the device's track (no
 * time) and its run on the communication track (in_flight), which is
 * its time; the first pass (in_flight) takes those, the second the
 * device tracks' boxes of collectives the first found none of (blocking
 * steps, or a trace made with --overlap off). */
static int collect(const char *path, const cJSON *events, const spmd_program *p, double **durs,
                   int *counts, bool in_flight)
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
                          "plan's is a %s of %s, %lld bytes: a trace of other flags (--zero, "
                          "--fsdp, --shard, --batch ...)", path, (int)index, kind, value, bytes,
                          c.kind, c.tensor, (long long)c.bytes), 2);
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

int explain_trace_read(const char *path, const char *model, double params, const char *mesh,
                       const spmd_program *p, explain_measured *out)
{
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
    int n = spmd_program_collective_count(p);
    if (strcmp(t_model, model) || t_params != params || strcmp(t_mesh, mesh) || t_n != n) {
        char theirs[512], ours[512];
        run_text(theirs, sizeof theirs, t_model, t_params, t_mesh, (int)t_n);
        run_text(ours, sizeof ours, model, params, mesh, n);
        cJSON_Delete(root);
        return cli_fail("--trace %s: a trace of %s; this explain plans %s: explain with the flags "
                        "of the traced run", path, theirs, ours), 2;
    }
    double **durs = calloc((size_t)(n ? n : 1), sizeof *durs);
    out->n = n;
    out->median_us = calloc((size_t)(n ? n : 1), sizeof *out->median_us);
    out->samples = calloc((size_t)(n ? n : 1), sizeof *out->samples);
    int rc = durs && out->median_us && out->samples ? collect(path, events, p, durs, out->samples, true)
                                                    : (cli_fail("--trace: out of memory"), 1);
    if (!rc) rc = collect(path, events, p, durs, out->samples, false);
    for (int i = 0; !rc && i < n; i++) {
        int k = out->samples[i];
        if (!k) {
            out->median_us[i] = NAN;
            continue;
        }
        qsort(durs[i], (size_t)k, sizeof *durs[i], by_value);
        out->median_us[i] = k % 2 ? durs[i][k / 2] : 0.5 * (durs[i][k / 2 - 1] + durs[i][k / 2]);
    }
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
    *m = (explain_measured){0};
}
