/*
 * The usage text of `spmd` and its commands (flag_usage.c), made from the
 * flag table: `spmd COMMAND --help` prints it, a wrong flag prints it on
 * stderr.
 */
#ifndef SPMD_TOOLS_FLAG_USAGE_H
#define SPMD_TOOLS_FLAG_USAGE_H

#include "options.h"

#include <stddef.h>
#include <stdio.h>

/* Usage of one command, its flags from the table, to f. */
void flags_usage(FILE *f, cli_command command);
/* The commands, one line each (a bare `spmd`, `spmd --help`). */
void flags_usage_commands(FILE *f);
/* "spmd train and explain": the commands of `bits`, as messages name them. */
void flag_command_names(unsigned bits, char *buf, size_t size);

#endif
