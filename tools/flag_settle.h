/*
 * Settling the model commands' flags (flag_settle.c), after they are read:
 * train, explain and sample.
 */
#ifndef SPMD_TOOLS_FLAG_SETTLE_H
#define SPMD_TOOLS_FLAG_SETTLE_H

#include "options.h"

/* The model flags' defaults that depend on other flags (the --init file's
 * shape, the optimizer's settings), and the checks across flags; under
 * mpirun, every process's settled flags compared with process 0's: 0, or
 * an exit code with a message. */
int flags_settle(cli_opts *o);

#endif
