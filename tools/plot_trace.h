/*
 * One step of a trace (trace.h) as an SVG picture: a lane per device,
 * time across, each node of the schedule a box, coloured by what it is
 * (compute, or the collective's kind; the update grey; with micro-batches,
 * each run of one micro-batch's boxes numbered, the odd ones' compute
 * lighter), and under a
 * device with collectives in flight a thinner lane for its communication
 * thread, those collectives coloured alike.
 */
#ifndef SPMD_TOOLS_PLOT_TRACE_H
#define SPMD_TOOLS_PLOT_TRACE_H

#include <spmd/mesh.h>
#include <spmd/spmd.h>

/* The events of one run (spmd_program_trace_event's): each device's on
 * its lane, those in flight (SPMD_TRACE_IN_FLIGHT) on its communication
 * lane; `colls[i]` is event i's collective (kind NULL for compute and the
 * update).  Written whole or not at all; 0, or 1 with a message. */
int plot_write_trace_svg(const char *path, const char *title, const spmd_trace_event *events,
                         const spmd_collective_info *colls, int n);

#endif
