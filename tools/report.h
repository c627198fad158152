/*
 * Pieces of the JSON reports (report.c); cJSON handles stay opaque here.
 */
#ifndef SPMD_TOOLS_REPORT_H
#define SPMD_TOOLS_REPORT_H

#include "model.h"

struct cJSON;

/* Collectives per step, grouped by kind, axes, bytes and phase, with the
 * values each group moves. */
struct cJSON *report_collectives(const spmd_program *p);
/* The mesh: shape, axes, and over several processes which axes stay
 * inside one and the network's figures. */
struct cJSON *report_mesh(const cli_model *m);
/* The same figure for every device. */
struct cJSON *report_per_device(const spmd_program *p, double value);
/* Per process: its devices, their parameter + gradient + optimizer bytes,
 * and the bytes it allocated for them (gathered from every process: each
 * calls it). */
struct cJSON *report_processes(const spmd_program *p);

#endif
