/*
 * The flag table (flag_table.c): every flag of every command, a row each
 * (flag_spec.h), and the commands with their synopses.  Usage, parsing,
 * settling and the agreement across processes all read their flags from
 * here, so a new flag is a new row.
 */
#ifndef SPMD_TOOLS_FLAG_TABLE_H
#define SPMD_TOOLS_FLAG_TABLE_H

#include "flag_spec.h"
#include "options.h"

#include <stdbool.h>

/* The commands that build a model, and those that run or plan its training. */
#define MODEL_COMMANDS (CMD_TRAIN | CMD_EXPLAIN | CMD_SAMPLE)
#define RUN_COMMANDS (CMD_TRAIN | CMD_EXPLAIN)

/* Batches a validation reads when the run asks for one (--val-every,
 * --val-data) and --val-batches is not given. */
#define VAL_BATCHES 4

typedef struct command_spec {
    cli_command command;
    const char *name;
    const char *synopsis; /* after "spmd NAME" */
    const char *what;     /* one line */
    const char *operand;  /* the word that is not a flag ("CKPT"), or NULL */
    const char *operand_noun; /* "checkpoint": "export takes one checkpoint" */
    const char *operand_help;
    bool operands;        /* any number of them (into o->operands) */
    path_kind operand_path; /* what an operand names (flag_spec.h) */
} command_spec;

/* The shards spmd tokenize writes into --out DIR. */
#define TOKENIZE_TRAIN_SHARD "train_000000.bin"
#define TOKENIZE_VAL_SHARD "val_000000.bin"

/* The rows, in the order the usage lists them; cli_opts.given is indexed
 * by row. */
extern const flag_spec flag_rows[];
extern const int flag_row_count;

/* The commands, in the order `spmd --help` lists them. */
extern const command_spec flag_commands[];
extern const int flag_command_count;

/* The command's entry (every cli_command has one). */
const command_spec *flag_command_of(cli_command command);
/* The command named `name` ("train"), or 0. */
cli_command flags_command(const char *name);
/* Whether `flag` ("--mesh") was given on the command line. */
bool flags_given(const cli_opts *o, const char *flag);

#endif
