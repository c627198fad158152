/*
 * `spmd train --trace FILE.json`: the timeline of a few steps, as the
 * trace events Perfetto and chrome://tracing load (one process per MPI
 * process, one thread per device: every op, fused chain and collective
 * of the schedule, the update, the step around them, and thread 0's
 * waits at the barriers), and with --trace-plot a picture of the first
 * traced step (plot_trace.h).  Recorded by spmd_program_trace_begin.
 */
#ifndef SPMD_TOOLS_TRACE_H
#define SPMD_TOOLS_TRACE_H

#include "model.h"

typedef struct trace_steps {
    int first, last;   /* steps traced, from 1; first 0: none */
    double origin_us;  /* this process's clock at spmd_program_trace_begin */
    bool started;
    /* What --trace-steps asked: steps a..b, or a count of them. */
    int a, b, count;
} trace_steps;

/* The steps --trace-steps asks for, of a run of o->steps steps (the
 * --trace and --trace-plot paths are tools/paths.c's).  0, or 2 with a
 * message.  A count N traces the N steps after the first (which touches
 * every page for the first time) when the run has them, else its last N,
 * the first among them. */
int trace_prepare(const cli_opts *o, trace_steps *t);
/* The steps traced once the run resumed after step `done`: a count
 * counts from the first step this run runs; of a range A-B, the steps
 * before the resume are said (on stderr, by process 0) and left out. */
void trace_resumed(const cli_opts *o, trace_steps *t, int done);
/* Before and after step `step` (from 1) of the loop: starts and stops
 * the recording.  0, or 1 with a message. */
int trace_before_step(const cli_opts *o, trace_steps *t, spmd_program *p, int step);
void trace_after_step(trace_steps *t, spmd_program *p, int step);
/* Write what was recorded (every process calls it); 0, or 1 with a message. */
int trace_write(const cli_opts *o, const cli_model *m, const spmd_program *p, const trace_steps *t);

#endif
