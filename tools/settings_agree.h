/*
 * Under mpirun every process must run with the same settings
 * (settings_agree.c): each compares its settled flags with process 0's
 * and all refuse together, naming the first that differs.
 */
#ifndef SPMD_TOOLS_SETTINGS_AGREE_H
#define SPMD_TOOLS_SETTINGS_AGREE_H

#include "options.h"

/* Every row of the flag table for o->command, but the few that may
 * differ by process (threads, BLAS, process 0's outputs), compared with
 * process 0's: 0, or an exit code with a message (on every process). */
int settings_agree(const cli_opts *o);

struct flag_spec;
/* One row's settled value in o as the comparison renders it ("64",
 * "0.003", "on", "(none)"), allocated (free it); NULL when out of memory.
 * A trace records its run's flags with it, for explain --trace to name
 * those that differ. */
char *settings_value_text(const struct flag_spec *fs, const cli_opts *o);

#endif
