/*
 * Independent copies (`--copies AXIS`): one model per group along an
 * independent mesh axis, each with its own seed, learning rate, warmup,
 * weight decay and data, trained side by side (copies.c).
 */
#ifndef SPMD_TOOLS_COPIES_H
#define SPMD_TOOLS_COPIES_H

#include "options.h"

#include "spmd/data.h"
#include "spmd/mesh.h"

#include <stdbool.h>
#include <stdint.h>

struct cJSON;

/* Copy c's settings from the per-copy lists (the run's for every copy
 * when a list has one value), and its learning rate at `step` (from 0). */
uint64_t copies_seed(const cli_opts *o, int c);
float copies_lr(const cli_opts *o, int c);
int copies_warmup(const cli_opts *o, int c);
float copies_weight_decay(const cli_opts *o, int c);
float copies_lr_at(const cli_opts *o, int c, int step);
/* The seeds to compile with (spmd_compile_options.copy_seeds); NULL: one for all. */
const uint64_t *copies_seeds(const cli_opts *o);
/* With --copies, declare the axis independent on `mesh` (NULL: one
 * device, refused), check the lists' lengths against the copies and open
 * each copy's data into copy_data[c] (left NULL where it reads copy 0's);
 * *count gets the copies, 1 without.  0, or 2 with a message. */
int copies_setup(const cli_opts *o, spmd_mesh *mesh, int *count, spmd_dataset **copy_data);
/* copy_data[0 .. CLI_MAX_COPIES). */
void copies_free(spmd_dataset **copy_data);
/* Print the copies ranked by `final` (one loss each; non-finite last). */
void copies_rank(const cli_opts *o, int copies, const double *final, bool validated);
/* Copy c's settings and losses (losses[i * stride + c] for step i). */
struct cJSON *copies_json(const cli_opts *o, int c, const float *losses, int stride, int steps);

#endif
