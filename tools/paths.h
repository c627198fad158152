/*
 * Paths as a kind: every flag value and operand that names a file or a
 * directory is declared in the flag table as an input or an output
 * (flag_spec.h's path_kind), and the rules of its kind are applied here,
 * to all of a command's paths together, before the command does any
 * work:
 *
 *   - every path resolved through its symbolic links, dangling ones
 *     included (a dangling link's target is the file a write would make);
 *     a loop of links is refused;
 *   - an input that is there is a regular file (opened without blocking,
 *     so a FIFO is refused, never waited on), a directory input a
 *     directory, and the files read in one (--encoder's) regular files;
 *   - an output is a regular file or a new path (never a FIFO, a device
 *     or a directory), on no input of the command and on no other output
 *     of it (the same inode, or the same resolved path), and outside every
 *     checkpoint: the command's own (--save, --resume, export's CKPT, even
 *     before they exist) and any on disk, where it may be neither one of
 *     the checkpoint directory's own names (latest, step-*, ...) nor
 *     anything in a step directory; last, a file can be created where it
 *     goes.
 *
 * A new path flag gets every rule by its row; paths_undeclared finds a
 * row whose value names a path but declares no kind (test_path_kinds).
 */
#ifndef SPMD_TOOLS_PATHS_H
#define SPMD_TOOLS_PATHS_H

#include "flag_table.h"
#include "options.h"

#include <stdbool.h>
#include <stddef.h>

/* The command's paths checked together: 0, or 2 with a message naming
 * the command, the flag (or the operand) and the path, and for a pair
 * both. */
int paths_check(const cli_opts *o);

/* Whether a usage word names a file or a directory: FILE, DIR, PATH, or
 * a word with an extension (FILE.json, LOG.jsonl), alone or among
 * alternatives ("FILE|none"). */
bool paths_value_names_path(const char *value);

/* The first row of `rows` or command of `commands` whose path is not
 * declared as the rule above says (a value naming a path without a path
 * kind, a path kind on a value that names none, a directory kind without
 * its files, an operand without a kind), with why in why[size]; NULL when
 * every one is. */
const char *paths_undeclared(const flag_spec *rows, int n_rows, const command_spec *commands,
                             int n_commands, char *why, size_t size);

#endif
