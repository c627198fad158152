/* `spmd train --trace` (see trace.h). */
#include "trace.h"

#include "flag_table.h"
#include "json_file.h"
#include "message.h"
#include "plot.h"
#include "plot_trace.h"
#include "processes.h"
#include "settings_agree.h"

#include <cJSON.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { DEFAULT_STEPS = 3 };

/* A device's communication thread's track: its collectives in flight. */
enum { COMM_TID = 1 << 20 };

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec * 1e-3;
}

/* A whole number from 1 that fills `text`. */
static bool whole(const char *text, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < 1 || v > 1000000000) return false;
    *out = (int)v;
    return true;
}

int trace_prepare(const cli_opts *o, trace_steps *t)
{
    *t = (trace_steps){0};
    if (!o->trace && !o->trace_plot) {
        if (o->trace_steps) return cli_fail("--trace-steps needs --trace FILE.json or --trace-plot FILE.svg");
        return 0;
    }
    char fallback[16];
    snprintf(fallback, sizeof fallback, "%d", DEFAULT_STEPS);
    const char *spec = o->trace_steps ? o->trace_steps : fallback;
    const char *dash = strchr(spec, '-');
    if (dash) {
        char a[16];
        snprintf(a, sizeof a, "%.*s", (int)(dash - spec < 15 ? dash - spec : 15), spec);
        if (!whole(a, &t->a) || !whole(dash + 1, &t->b) || t->b < t->a)
            return cli_fail("--trace-steps %s: expected A-B, steps from 1 with A <= B, or a count",
                            spec);
        if (t->b > o->steps)
            return cli_fail("--trace-steps %s: the run has %d steps", spec, o->steps);
    } else if (!whole(spec, &t->count)) {
        return cli_fail("--trace-steps %s: expected A-B, steps from 1 with A <= B, or a count", spec);
    }
    trace_resumed(o, t, 0);
    return 0;
}

void trace_resumed(const cli_opts *o, trace_steps *t, int done)
{
    if (!t->a && !t->count) return; /* nothing traced */
    if (t->count) {
        /* The first step run touches every page for the first time: the
         * ones after it, when the run has them. */
        int left = o->steps - done;
        t->first = left > t->count ? done + 2 : done + 1;
        t->last = t->first + t->count - 1 < o->steps ? t->first + t->count - 1 : o->steps;
        if (left <= 0) t->first = t->last = 0;
        return;
    }
    t->first = t->a > done ? t->a : done + 1;
    t->last = t->b;
    if (t->first > t->last) t->first = t->last = 0;
    if (t->a > done || processes_rank() != 0) return;
    if (!t->first) {
        fprintf(stderr, "spmd: warning: --trace-steps %d-%d: these steps were before the resume at "
                        "step %d; no trace written\n", t->a, t->b, done + 1);
    } else if (t->a == done) {
        fprintf(stderr, "spmd: warning: --trace-steps %d-%d: step %d was before the resume at step "
                        "%d; tracing steps %d to %d\n", t->a, t->b, t->a, done + 1, t->first, t->last);
    } else {
        fprintf(stderr, "spmd: warning: --trace-steps %d-%d: steps %d to %d were before the resume "
                        "at step %d; tracing steps %d to %d\n", t->a, t->b, t->a, done, done + 1,
                t->first, t->last);
    }
}

static int micro_batches(const cli_opts *o)
{
    return o->optimizer.accumulate_steps > 1 ? o->optimizer.accumulate_steps : 1;
}

int trace_before_step(const cli_opts *o, trace_steps *t, spmd_program *p, int step)
{
    if (!t->first || step != t->first) return 0;
    t->origin_us = now_us();
    if (spmd_program_trace_begin(p, (t->last - t->first + 1) * micro_batches(o)) != SPMD_OK) {
        cli_fail("--trace: %s", spmd_last_error());
        return 1;
    }
    t->started = true;
    return 0;
}

void trace_after_step(trace_steps *t, spmd_program *p, int step)
{
    if (t->started && step == t->last) spmd_program_trace_end(p);
}

/* One complete event ("ph":"X") on track (pid, tid). */
static cJSON *complete(cJSON *list, const char *name, const char *cat, double ts, double dur, int pid,
                       int tid)
{
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "name", name);
    cJSON_AddStringToObject(e, "cat", cat);
    cJSON_AddStringToObject(e, "ph", "X");
    cJSON_AddNumberToObject(e, "ts", ts);
    cJSON_AddNumberToObject(e, "dur", dur);
    cJSON_AddNumberToObject(e, "pid", pid);
    cJSON_AddNumberToObject(e, "tid", tid);
    cJSON_AddItemToArray(list, e);
    return cJSON_AddObjectToObject(e, "args");
}

static void metadata(cJSON *list, const char *what, int pid, int tid, const char *name, int sort)
{
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "name", what);
    cJSON_AddStringToObject(e, "ph", "M");
    cJSON_AddNumberToObject(e, "pid", pid);
    if (tid >= 0) cJSON_AddNumberToObject(e, "tid", tid);
    cJSON *args = cJSON_AddObjectToObject(e, "args");
    if (name) cJSON_AddStringToObject(args, "name", name);
    else cJSON_AddNumberToObject(args, "sort_index", sort);
    cJSON_AddItemToArray(list, e);
}

/* The name of traced run r: "step 4", "step 4 micro-batch 2". */
static void run_name(const cli_opts *o, const trace_steps *t, int run, char *buf, size_t size)
{
    int k = micro_batches(o);
    if (k > 1) snprintf(buf, size, "step %d micro-batch %d", t->first + run / k, run % k + 1);
    else snprintf(buf, size, "step %d", t->first + run);
}

/* The devices (thread ids) of this process's events, into ids; their
 * count.  *flying: whether any has collectives in flight. */
static int traced_devices(const spmd_program *p, int *ids, int room, bool *flying)
{
    int n = 0;
    *flying = false;
    for (int i = 0, total = spmd_program_trace_count(p); i < total; i++) {
        spmd_trace_event e;
        if (spmd_program_trace_event(p, i, &e) != SPMD_OK || e.kind == SPMD_TRACE_RUN) continue;
        *flying |= e.kind == SPMD_TRACE_IN_FLIGHT;
        bool seen = false;
        for (int k = 0; k < n; k++) seen |= ids[k] == e.device;
        if (!seen && n < room) ids[n++] = e.device;
    }
    return n;
}

/* A collective in flight, on the device's communication track: when the
 * thread ran it, and how long the device's thread 0 waited for it. */
static void add_inflight_event(cJSON *list, const spmd_program *p, const spmd_trace_event *e,
                               int pid, double shift)
{
    spmd_collective_info c;
    if (spmd_program_collective(p, e->collective, &c) != SPMD_OK) return;
    cJSON *args = complete(list, c.kind, "collective", e->start_us + shift, e->dur_us, pid,
                           COMM_TID + e->device);
    cJSON_AddStringToObject(args, "node", e->name);
    cJSON_AddStringToObject(args, "shape", e->shape);
    cJSON_AddStringToObject(args, "op", e->op);
    cJSON_AddBoolToObject(args, "in_flight", true);
    cJSON_AddNumberToObject(args, "device_wait_us", e->wait_us);
    cJSON_AddNumberToObject(args, "collective", e->collective); /* explain --trace's index */
    cJSON_AddStringToObject(args, "kind", c.kind);
    cJSON_AddStringToObject(args, "axes", c.axes);
    cJSON_AddNumberToObject(args, "bytes", (double)c.bytes);
    cJSON_AddStringToObject(args, "value", c.tensor);
    cJSON_AddStringToObject(args, "phase", c.phase);
    cJSON_AddNumberToObject(args, "estimate_us", c.seconds * 1e6);
}

static void add_device_event(cJSON *list, const spmd_program *p, const spmd_trace_event *e, int pid,
                             double shift)
{
    double ts = e->start_us + shift;
    if (e->kind == SPMD_TRACE_UPDATE) {
        complete(list, "update", "update", ts, e->dur_us, pid, e->device);
        return;
    }
    spmd_collective_info c;
    bool coll = e->kind == SPMD_TRACE_COLLECTIVE &&
                spmd_program_collective(p, e->collective, &c) == SPMD_OK;
    /* A micro-batch's compute says which in its name, for the viewer's box. */
    char named[64];
    if (!coll && e->micro_batch >= 0) snprintf(named, sizeof named, "%s mb%d", e->op, e->micro_batch);
    cJSON *args = complete(list, coll ? c.kind : e->micro_batch >= 0 ? named : e->op,
                           coll ? "collective" : "compute", ts, e->dur_us, pid, e->device);
    cJSON_AddStringToObject(args, "node", e->name);
    cJSON_AddStringToObject(args, "shape", e->shape);
    cJSON_AddStringToObject(args, "op", e->op);
    cJSON_AddNumberToObject(args, "wait_us", e->wait_us);
    if (e->micro_batch >= 0) cJSON_AddNumberToObject(args, "micro_batch", e->micro_batch);
    if (coll) {
        cJSON_AddNumberToObject(args, "collective", e->collective); /* explain --trace's index */
        cJSON_AddStringToObject(args, "kind", c.kind);
        cJSON_AddStringToObject(args, "axes", c.axes);
        cJSON_AddNumberToObject(args, "bytes", (double)c.bytes);
        cJSON_AddStringToObject(args, "value", c.tensor);
        cJSON_AddStringToObject(args, "phase", c.phase);
        cJSON_AddNumberToObject(args, "estimate_us", c.seconds * 1e6);
    }
    /* Thread 0 waiting for the device's other threads to end the node. */
    if (e->wait_us >= 1.0)
        complete(list, "wait", "wait", ts + e->dur_us - e->wait_us, e->wait_us, pid, e->device);
}

/* This process's events, shifted by `shift` microseconds, into list. */
static int process_events(const cli_opts *o, const spmd_program *p, const trace_steps *t,
                          double shift, cJSON *list)
{
    enum { MOST = 4096 };
    static int ids[MOST];
    bool flying;
    int pid = spmd_program_process(p), n_ids = traced_devices(p, ids, MOST, &flying);
    char name[64];
    snprintf(name, sizeof name, "process %d", pid);
    metadata(list, "process_name", pid, -1, name, 0);
    metadata(list, "process_sort_index", pid, -1, NULL, pid);
    for (int k = 0; k < n_ids; k++) {
        snprintf(name, sizeof name, "device %d", ids[k]);
        metadata(list, "thread_name", pid, ids[k], name, 0);
        metadata(list, "thread_sort_index", pid, ids[k], NULL, 2 * ids[k]);
        if (!flying) continue;
        /* Below each device, its communication thread. */
        snprintf(name, sizeof name, "device %d comm", ids[k]);
        metadata(list, "thread_name", pid, COMM_TID + ids[k], name, 0);
        metadata(list, "thread_sort_index", pid, COMM_TID + ids[k], NULL, 2 * ids[k] + 1);
    }
    double run_begin = 0, run_end = 0, last_end = 0;
    int device = -1; /* whose events come now */
    for (int i = 0, n = spmd_program_trace_count(p); i <= n; i++) {
        spmd_trace_event e = {.kind = SPMD_TRACE_RUN};
        if (i < n && spmd_program_trace_event(p, i, &e) != SPMD_OK) {
            cli_fail("--trace: %s", spmd_last_error());
            return 1;
        }
        if (i < n && e.kind == SPMD_TRACE_OFF_STAGE) continue; /* another stage's: not run here */
        /* After a device's last event, it waited for the other devices
         * and the caller to end the run (a wake-up under load). */
        if (device >= 0 && (e.kind == SPMD_TRACE_RUN || e.device != device) && run_end > last_end)
            complete(list, "join", "wake", last_end + shift, run_end - last_end, pid, device);
        if (i == n) break;
        if (e.kind == SPMD_TRACE_IN_FLIGHT) {
            add_inflight_event(list, p, &e, pid, shift);
            continue;
        }
        if (e.kind != SPMD_TRACE_RUN) {
            /* Before its first node, the device waited for its thread to
             * wake; before the update, for its threads to wake again. */
            double from = e.device != device ? run_begin : last_end;
            if (e.start_us > from && (e.device != device || e.kind == SPMD_TRACE_UPDATE))
                complete(list, "wake", "wake", from + shift, e.start_us - from, pid, e.device);
            device = e.device;
            last_end = e.start_us + e.dur_us;
            add_device_event(list, p, &e, pid, shift);
            continue;
        }
        run_begin = e.start_us;
        run_end = e.start_us + e.dur_us;
        device = -1;
        /* Every device's track gets the step around its events. */
        run_name(o, t, e.run, name, sizeof name);
        for (int k = 0; k < n_ids; k++) {
            cJSON *args = complete(list, name, "step", e.start_us + shift, e.dur_us, pid, ids[k]);
            cJSON_AddNumberToObject(args, "step", t->first + e.run / micro_batches(o));
        }
    }
    return 0;
}

/* Over several processes, each one's events pass through a file beside
 * the trace ("FILE.json.part-R"), which process 0 merges and removes. */
static void part_path(const char *trace, int rank, char *buf, size_t size)
{
    snprintf(buf, size, "%s.part-%d", trace, rank);
}

static int write_part(const char *path, cJSON *list)
{
    char *text = cJSON_PrintUnformatted(list);
    FILE *f = text ? fopen(path, "w") : NULL;
    bool ok = f && fputs(text, f) >= 0;
    if (f && fclose(f) != 0) ok = false;
    free(text);
    if (!ok) cli_fail("--trace: cannot write %s: %s", path, strerror(errno));
    return ok ? 0 : 1;
}

static int merge_part(const char *path, cJSON *list)
{
    FILE *f = fopen(path, "r");
    char *text = NULL;
    size_t len = 0;
    FILE *m = f ? open_memstream(&text, &len) : NULL;
    char buf[65536];
    size_t got;
    while (m && (got = fread(buf, 1, sizeof buf, f)) > 0) fwrite(buf, 1, got, m);
    if (m) fclose(m);
    if (f) fclose(f);
    cJSON *part = text ? cJSON_Parse(text) : NULL;
    free(text);
    remove(path);
    if (!cJSON_IsArray(part)) {
        cJSON_Delete(part);
        return cli_fail("--trace: cannot read another process's events from %s", path), 1;
    }
    while (cJSON_GetArraySize(part) > 0) cJSON_AddItemToArray(list, cJSON_DetachItemFromArray(part, 0));
    cJSON_Delete(part);
    return 0;
}

/* The first traced step's events, drawn: each device's steps, and the
 * collectives its communication thread ran in flight. */
static int plot_first_step(const cli_opts *o, const spmd_program *p)
{
    int n = spmd_program_trace_count(p), kept = 0;
    spmd_trace_event *events = calloc((size_t)(n ? n : 1), sizeof *events);
    spmd_collective_info *colls = calloc((size_t)(n ? n : 1), sizeof *colls);
    if (!events || !colls) {
        free(events), free(colls);
        return cli_fail("--trace-plot: out of memory"), 1;
    }
    for (int i = 0; i < n; i++) {
        spmd_trace_event e;
        if (spmd_program_trace_event(p, i, &e) != SPMD_OK || e.run >= micro_batches(o) ||
            e.kind == SPMD_TRACE_OFF_STAGE)
            continue;
        bool coll = e.kind == SPMD_TRACE_COLLECTIVE || e.kind == SPMD_TRACE_IN_FLIGHT;
        if (!coll || spmd_program_collective(p, e.collective, &colls[kept]) != SPMD_OK)
            colls[kept] = (spmd_collective_info){.kind = NULL};
        events[kept++] = e;
    }
    char title[192];
    snprintf(title, sizeof title, "spmd train: %s, one step%s", o->model,
             spmd_program_processes(p) > 1 ? " (process 0's devices)" : "");
    int rc = plot_write_trace_svg(o->trace_plot, title, events, colls, kept);
    free(events), free(colls);
    return rc;
}

int trace_write(const cli_opts *o, const cli_model *m, const spmd_program *p, const trace_steps *t)
{
    if (!t->first) return 0;
    if (!t->started) {
        /* A run stopped early (every process alike). */
        if (processes_rank() == 0)
            fprintf(stderr, "spmd: warning: --trace-steps %d-%d: the run stopped before them; no "
                    "trace written\n", t->first, t->last);
        return 0;
    }
    int procs = processes_count(), rank = processes_rank(), rc = 0;
    if (o->trace_plot && rank == 0 && (rc = plot_first_step(o, p))) return rc;
    if (!o->trace) return 0;
    double *origins = calloc((size_t)procs, sizeof *origins);
    if (!origins) return cli_fail("--trace: out of memory"), 1;
    /* One clock for all: processes on one host share CLOCK_MONOTONIC. */
    rc = processes_gather_double(t->origin_us, origins);
    double base = origins[0];
    for (int r = 1; r < procs; r++) base = origins[r] < base ? origins[r] : base;
    free(origins);
    if (rc) return rc;
    cJSON *list = cJSON_CreateArray();
    rc = process_events(o, p, t, t->origin_us - base, list);
    char part[4096];
    if (!rc && rank > 0) {
        part_path(o->trace, rank, part, sizeof part);
        rc = write_part(part, list);
    }
    /* Every part is written before process 0 reads them. */
    double ready = rc, *all = calloc((size_t)procs, sizeof *all);
    if (!all || processes_gather_double(ready, all)) rc = 1;
    for (int r = 1; all && r < procs; r++)
        if (all[r] != 0) rc = 1;
    free(all);
    if (rank > 0) {
        cJSON_Delete(list);
        return rc;
    }
    for (int r = 1; !rc && r < procs; r++) {
        part_path(o->trace, r, part, sizeof part);
        rc = merge_part(part, list);
    }
    if (rc) {
        cJSON_Delete(list);
        return rc;
    }
    cJSON *root = cJSON_CreateObject();
    cJSON_AddItemToObject(root, "traceEvents", list);
    cJSON_AddStringToObject(root, "displayTimeUnit", "ms");
    cJSON *about = cJSON_AddObjectToObject(root, "otherData");
    cJSON_AddStringToObject(about, "model", o->model);
    char mesh[128];
    model_mesh_text(m, mesh, sizeof mesh);
    cJSON_AddStringToObject(about, "mesh", mesh);
    /* What explain --trace checks a plan against. */
    cJSON_AddNumberToObject(about, "params", (double)m->params);
    cJSON_AddNumberToObject(about, "collectives", spmd_program_collective_count(p));
    cJSON_AddNumberToObject(about, "first_step", t->first);
    cJSON_AddNumberToObject(about, "last_step", t->last);
    cJSON_AddNumberToObject(about, "processes", procs);
    cJSON_AddStringToObject(about, "clock", "CLOCK_MONOTONIC, microseconds from the first "
                            "process's start of the trace");
    /* The run's flags as settled, for explain --trace to name those that
     * differ from its own. */
    cJSON *flags = cJSON_AddObjectToObject(about, "flags");
    for (int i = 0; i < flag_row_count; i++) {
        if (!(flag_rows[i].commands & CMD_TRAIN)) continue;
        char *value = settings_value_text(&flag_rows[i], o);
        if (value) cJSON_AddStringToObject(flags, flag_rows[i].name, value);
        free(value);
    }
    return json_file_write("--trace", "the trace", o->trace, root);
}
