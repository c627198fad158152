/*
 * The `spmd` tool's flags, as the commands use them: one table
 * (flag_table.c) whose rows name the commands each flag applies to, its
 * kind and parsing, its default and its help text.  Every command parses
 * its argv through it (flags.c), so usage, parsing and the refusal of a
 * flag a command does not take all come from there; the model commands
 * then settle them (flag_settle.c).
 */
#ifndef SPMD_TOOLS_FLAGS_H
#define SPMD_TOOLS_FLAGS_H

#include "flag_settle.h"
#include "flag_table.h"
#include "flag_usage.h"
#include "options.h"

/* argv (the words after the command) into o, with the table's defaults
 * for the others: 0, -1 after --help (usage printed), or an exit code
 * with a message.  Nothing is read but argv. */
int flags_read(int argc, char **argv, cli_command command, cli_opts *o);
/* flags_read, the command's paths checked (paths.h: before settling
 * reads the --init file), then flags_settle for the model commands. */
int flags_parse(int argc, char **argv, cli_command command, cli_opts *o);

#endif
