/*
 * `spmd explain --trace FILE.json`: the collectives' measured times, read
 * from a timeline `spmd train --trace` wrote, for explain to print next to
 * the cost model's estimates.
 */
#ifndef SPMD_TOOLS_EXPLAIN_TRACE_H
#define SPMD_TOOLS_EXPLAIN_TRACE_H

#include "options.h"

#include "spmd/mesh.h"

/* Per collective of the plan (its index in spmd_program_collective). */
typedef struct explain_measured {
    int n;
    double *median_us; /* over every traced run of it on every device; NAN: never traced */
    int *samples;      /* how many boxes the median is of */
    int first_step, last_step;
    /* With pipeline stages (--pp), per mesh device: the fraction of the
     * traced steps it was not computing (waiting in its stage transfers,
     * or to wake); NAN: none of its steps traced.  NULL without stages. */
    int n_devices;
    double *idle;
    /* With stages, per traced step (steps[k], first to last): the mean
     * over the devices of the fraction of that step each was idle; NAN
     * where no device's step was traced.  NULL without stages. */
    int n_steps;
    int *steps;
    double *step_idle;
} explain_measured;

/* Reads `path` and checks it is a trace of this plan: the run's model,
 * parameter count and mesh (o->model, `params`, `mesh`, as explain names
 * them) and every traced collective's kind, bytes and value against
 * program p's; with --pp, each device's idle fraction.  0, or 2 with a message naming what differs: the traced
 * run's flags that differ from o's, then the figures (or 1 when the file
 * cannot be read). */
int explain_trace_read(const char *path, const cli_opts *o, double params, const char *mesh,
                       const spmd_program *p, explain_measured *out);
/* The measured idle fractions' mean over the devices traced; NAN: none. */
double explain_idle_mean(const explain_measured *m);
/* The least idle traced step's figure (step_idle), its step in *step;
 * NAN: none.  Other work on the machine only adds idle time (a device
 * descheduled makes its neighbour wait), more in some steps than in
 * others, while the schedule's own bubble is in every step: the least
 * disturbed step measures it best (docs/design/stages.md, "The bubble"). */
double explain_idle_best(const explain_measured *m, int *step);
void explain_measured_free(explain_measured *m);

#endif
