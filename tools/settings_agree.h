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

#endif
