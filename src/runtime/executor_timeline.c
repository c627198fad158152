/*
 * The timeline (spmd_program_trace_begin): clock readings of each traced
 * run's steps, update and collectives in flight, read back as events.
 */
#include "runtime/executor_impl.h"
#include "base/error.h"

#include <stdio.h>
#include <string.h>

void exec_trace_free(spmd_program *p)
{
    trace *tr = &p->trace;
    base_free(&p->alloc, tr->times);
    base_free(&p->alloc, tr->run_begin);
    base_free(&p->alloc, tr->run_end);
    base_free(&p->alloc, tr->micro);
    base_free(&p->alloc, tr->micro_steps);
    base_free(&p->alloc, tr->collective);
    *tr = (trace){0};
}

spmd_status spmd_program_trace_begin(spmd_program *p, int runs)
{
    spmd_status st = executor_check_runnable(p, "trace_begin");
    if (st != SPMD_OK) return st;
    if (runs < 1) return base_error(SPMD_ERR_INVALID, "trace_begin: runs %d is not positive", runs);
    exec_trace_free(p);
    trace *tr = &p->trace;
    const spmd_graph *lg = p->c.local;
    size_t rows = (size_t)runs * (size_t)p->n_local, nodes = (size_t)(lg->n_nodes ? lg->n_nodes : 1);
    size_t steps = (size_t)(p->c.plan.n_steps ? p->c.plan.n_steps : 1);
    tr->times = base_alloc(&p->alloc, rows * trace_stride(p) * sizeof *tr->times, "trace");
    tr->run_begin = base_alloc(&p->alloc, (size_t)runs * sizeof *tr->run_begin, "trace");
    tr->run_end = base_alloc(&p->alloc, (size_t)runs * sizeof *tr->run_end, "trace");
    tr->micro = base_alloc(&p->alloc, (size_t)runs * sizeof *tr->micro, "trace");
    tr->micro_steps = base_alloc(&p->alloc, steps * sizeof *tr->micro_steps, "trace");
    tr->collective = base_alloc(&p->alloc, nodes * sizeof *tr->collective, "trace");
    if (!tr->times || !tr->run_begin || !tr->run_end || !tr->micro || !tr->micro_steps ||
        !tr->collective) {
        exec_trace_free(p);
        return SPMD_ERR_NOMEM;
    }
    for (int s = 0; s < p->c.plan.n_steps; s++)
        if (!p->c.micro || p->c.micro[p->c.plan.steps[s]->id]) tr->micro_steps[tr->n_micro_steps++] = s;
    for (size_t i = 0; i < nodes; i++) tr->collective[i] = -1;
    for (int i = 0; p->c.partitioned && i < p->c.part.n_colls; i++)
        tr->collective[p->c.part.colls[i].node] = i;
    tr->room = runs;
    tr->origin = clock_ns();
    tr->on = true;
    return SPMD_OK;
}

spmd_status spmd_program_trace_end(spmd_program *p)
{
    spmd_status st = executor_check_runnable(p, "trace_end");
    if (st == SPMD_OK) p->trace.on = false;
    return st;
}

/* Collectives in flight that traced run `run` ran on each device. */
static int trace_run_inflight(const spmd_program *p, int run)
{
    if (!p->c.plan.n_async) return 0;
    return p->trace.micro[run] ? p->fly.n_micro : p->c.plan.n_async;
}

/* Events of one traced run: the run, then per device its steps, its
 * update and its collectives in flight. */
static int trace_run_events(const spmd_program *p, int run)
{
    int steps = p->trace.micro[run] ? p->trace.n_micro_steps : p->c.plan.n_steps;
    return 1 + p->n_local * (steps + 1 + trace_run_inflight(p, run));
}

int spmd_program_trace_count(const spmd_program *p)
{
    int n = 0;
    for (int r = 0; p && r < p->trace.runs; r++) n += trace_run_events(p, r);
    return n;
}

static double to_us(int64_t ns) { return (double)ns / 1e3; }

/* The time in a step's end slot; a step of another stage (which its
 * device skips) holds -1 - the slot of where the device's step before it
 * ended (executor_run.c). */
static int64_t ended(const int64_t *row, size_t slot)
{
    return row[slot] >= 0 ? row[slot] : row[-1 - row[slot]];
}

spmd_status spmd_program_trace_event(const spmd_program *p, int i, spmd_trace_event *out)
{
    if (!out) return base_error(SPMD_ERR_INVALID, "trace_event: out is NULL");
    int total = spmd_program_trace_count(p), run = 0;
    if (!p || i < 0 || i >= total)
        return base_error(SPMD_ERR_INVALID, "trace_event: index %d outside 0..%d", i, total - 1);
    const trace *tr = &p->trace;
    while (i >= trace_run_events(p, run)) i -= trace_run_events(p, run++);
    memset(out, 0, sizeof *out);
    out->run = run;
    out->collective = -1;
    out->micro_batch = -1;
    if (i == 0) {
        out->kind = SPMD_TRACE_RUN;
        out->device = -1;
        out->start_us = to_us(tr->run_begin[run]);
        out->dur_us = to_us(tr->run_end[run] - tr->run_begin[run]);
        snprintf(out->name, sizeof out->name, "%s", tr->micro[run] ? "micro-batch" : "step");
        return SPMD_OK;
    }
    i--;
    bool micro = tr->micro[run];
    int steps = micro ? tr->n_micro_steps : p->c.plan.n_steps;
    int per_device = steps + 1 + trace_run_inflight(p, run), k = i / per_device;
    int j = i % per_device;
    size_t stride = trace_stride(p);
    const int64_t *row = tr->times + ((size_t)run * (size_t)p->n_local + (size_t)k) * stride;
    const size_t update = 2 * (size_t)p->c.plan.n_steps + 1;
    out->device = p->dev[k].id;
    if (j == steps) {
        out->kind = SPMD_TRACE_UPDATE;
        out->start_us = to_us(row[update]);
        out->dur_us = to_us(row[update + 1] - row[update]);
        snprintf(out->name, sizeof out->name, "update");
        return SPMD_OK;
    }
    const spmd_tensor *t;
    if (j > steps) {
        /* The run's (j - steps)-th collective in flight, on the device's
         * communication thread; wait_us: thread 0's wait for its result. */
        int f = j - steps - 1, a = 0;
        for (a = 0; micro && a < p->c.plan.n_async; a++)
            if (p->fly.micro_rank[a] == f) break;
        if (!micro) a = f;
        size_t slot = inflight_slot(p, a);
        t = p->c.plan.steps[p->c.plan.async_step[a]];
        out->kind = SPMD_TRACE_IN_FLIGHT;
        out->start_us = to_us(row[slot]);
        out->dur_us = to_us(row[slot + 1] - row[slot]);
        out->wait_us = to_us(row[slot + 3] - row[slot + 2]);
        out->collective = tr->collective[t->id];
    } else {
        /* A step begins where the one before it (of those this run ran) ended. */
        int s = micro ? tr->micro_steps[j] : j;
        int64_t begin = j == 0 ? row[0] : ended(row, 2 + 2 * (micro ? tr->micro_steps[j - 1] : j - 1));
        t = p->c.plan.steps[s];
        out->start_us = to_us(begin);
        out->collective = tr->collective[t->id];
        if (row[2 + 2 * s] < 0) {
            out->kind = SPMD_TRACE_OFF_STAGE;
        } else {
            out->dur_us = to_us(row[2 + 2 * s] - begin);
            out->wait_us = to_us(row[2 + 2 * s] - row[1 + 2 * s]);
            out->kind = out->collective >= 0 ? SPMD_TRACE_COLLECTIVE : SPMD_TRACE_COMPUTE;
        }
    }
    out->op = fusion_group(&p->c.fusion, t) ? "fused" : ir_op_name(t->op);
    if (t->name) snprintf(out->name, sizeof out->name, "%s", t->name);
    else snprintf(out->name, sizeof out->name, "%s#%d", ir_op_name(t->op), t->id);
    ir_shape_str(t, out->shape, sizeof out->shape);
    out->micro_batch = t->micro;
    return SPMD_OK;
}
