/*
 * A row of the flag table (flag_table.c): a flag, the commands it applies
 * to, how its value is read (flag_values.c) and what the usage says of it
 * (flag_usage.c).  Every flag takes a value, as "--flag value" or
 * "--flag=value".
 */
#ifndef SPMD_TOOLS_FLAG_SPEC_H
#define SPMD_TOOLS_FLAG_SPEC_H

#include "options.h"

#include <stdbool.h>
#include <stddef.h>

/* Integer flags take min..CLI_INT_MAX unless their own range says less. */
#define CLI_INT_MAX 1000000000

typedef enum flag_kind {
    FLAG_INT,    /* an int field, in [min, max] (max 0: CLI_INT_MAX) */
    FLAG_FLOAT,  /* a float field, finite, in [min, max), or [min, max] when max_included */
    FLAG_TEXT,   /* a const char * field, kept as given */
    FLAG_CHOICE, /* a bool field: the first of `choices` ("off|on") false, the second true */
    FLAG_CUSTOM  /* parsed by the row's own `set` */
} flag_kind;

/* What a flag's value names when it names a file or a directory.  Every
 * such row declares one, and tools/paths.c applies the rules of its kind
 * to every path of a command together, before the command runs: a new
 * path flag gets them all by its row (test_path_kinds walks the table). */
typedef enum path_kind {
    PATH_NONE,           /* not a path */
    PATH_IN_FILE,        /* a file read: a regular file, opened without blocking */
    PATH_IN_DIR,         /* a directory whose `path_files` are read */
    PATH_IN_FILE_IF_THERE, /* a file only when one is there (or a glob matches): a data set
                            * (a built-in name such as "arith", a text file, token shards),
                            * launch's --hosts (a hostfile or HOST:SLOTS,...), --mpirun (a
                            * path or a name looked up on PATH) */
    PATH_IN_CHECKPOINT,  /* a checkpoint directory, or one of its step directories, read */
    PATH_OUT_FILE,       /* a file written: a regular file or a new path */
    PATH_OUT_DIR,        /* a directory its `path_files` are written into */
    PATH_OUT_CHECKPOINT, /* a directory checkpoints are saved into */
} path_kind;

typedef struct flag_spec flag_spec;
struct flag_spec {
    const char *name;
    unsigned commands; /* cli_command bits */
    flag_kind kind;
    size_t offset;     /* the field in cli_opts (not FLAG_CUSTOM) */
    const char *value; /* the value's name in the usage: "N", "on|off" */
    const char *help;
    const char *initial; /* the value before any flag, parsed as a given one; NULL: zero */
    const char *shown;   /* the usage's default; NULL: `initial` or the two below; "": none */
    /* The default by --optimizer (indexed by spmd_optimizer_kind), taken
     * when it is settled (flag_settle.c); a row with some but not this
     * optimizer's is a setting of the others: 0 under it, refused if
     * given.  All NULL: no optimizer's setting. */
    const char *by_optimizer[CLI_OPTIMIZERS];
    double min, max;
    bool max_included;   /* FLAG_FLOAT */
    const char *why_min; /* FLAG_INT: why less than min means nothing, or NULL */
    const char *choices; /* FLAG_CHOICE */
    int (*set)(const flag_spec *fs, char *v, cli_opts *o); /* FLAG_CUSTOM */
    path_kind path;      /* FLAG_TEXT: what the value names, if a path */
    const char *const *path_files; /* PATH_IN_DIR, PATH_OUT_DIR: the files in it, NULL-ended */
};

#endif
