/*
 * One step of a trace (trace.h) as an SVG picture: a lane per device,
 * time across, each node of the schedule a box, coloured by what it is
 * (compute, or the collective's kind; the update grey).
 */
#ifndef SPMD_TOOLS_PLOT_TRACE_H
#define SPMD_TOOLS_PLOT_TRACE_H

#include <spmd/spmd.h>

/* The events of one run (spmd_program_trace_event's), device events only
 * drawn; `kinds[i]` names event i's collective kind (NULL for compute).
 * Written whole or not at all; 0, or 1 with a message. */
int plot_write_trace_svg(const char *path, const char *title, const spmd_trace_event *events,
                         const char *const *kinds, int n);

#endif
