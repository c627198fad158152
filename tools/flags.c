/*
 * The flags' parser (see flags.h): argv read row by row against the flag
 * table, each row's initial value first.  The library reads no
 * environment, and neither does this parser: only argv.
 */
#include "flags.h"

#include "flag_values.h"
#include "message.h"
#include "paths.h"

#include <stdio.h>
#include <string.h>

/* The row of the flag spelled by the first `len` characters of `arg` for
 * `command`, or -1; `elsewhere` gets the other commands that take it. */
static int find_flag(const char *arg, size_t len, cli_command command, unsigned *elsewhere)
{
    *elsewhere = 0;
    for (int i = 0; i < flag_row_count; i++) {
        const flag_spec *fs = &flag_rows[i];
        if (strlen(fs->name) != len || strncmp(fs->name, arg, len)) continue;
        if (fs->commands & command) return i;
        *elsewhere |= fs->commands;
    }
    return -1;
}

static int defaults(cli_command command, cli_opts *o)
{
    memset(o, 0, sizeof *o);
    o->command = command;
    /* sample, which has no --model, builds a GPT. */
    strcpy(o->model, "gpt");
    /* Each row's initial value, parsed as a given one would be (a copy:
     * parsing may cut it). */
    for (int i = 0; i < flag_row_count; i++) {
        const flag_spec *fs = &flag_rows[i];
        if (!(fs->commands & command) || !fs->initial) continue;
        char value[64];
        snprintf(value, sizeof value, "%s", fs->initial);
        if (fs->kind == FLAG_TEXT) {
            *(const char **)(void *)((char *)o + fs->offset) = fs->initial;
            continue;
        }
        int rc = flag_set(fs, value, o);
        if (rc) return rc;
    }
    return 0;
}

int flags_read(int argc, char **argv, cli_command command, cli_opts *o)
{
    const command_spec *c = flag_command_of(command);
    int rc = defaults(command, o);
    if (rc) return rc;
    for (int i = 0; i < argc; i++) {
        char *arg = argv[i];
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
            flags_usage(stdout, command);
            return -1;
        }
        if (arg[0] != '-') {
            if (!c->operand)
                return cli_fail("unexpected argument '%s': spmd %s takes only flags (--help lists "
                                "them)", arg, c->name);
            if (c->operands) {
                if (o->n_operands == CLI_MAX_TEXTS)
                    return cli_fail("%s takes at most %d %ss", c->name, CLI_MAX_TEXTS,
                                    c->operand_noun);
                o->operands[o->n_operands++] = arg;
                continue;
            }
            if (o->operand)
                return cli_fail("%s takes one %s, got '%s' and '%s'", c->name, c->operand_noun,
                                o->operand, arg);
            o->operand = arg;
            continue;
        }
        char *eq = strchr(arg, '=');
        size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
        unsigned elsewhere;
        int row = find_flag(arg, len, command, &elsewhere);
        if (row < 0) {
            flags_usage(stderr, command);
            if (!elsewhere) return cli_fail("unknown flag '%.*s'", (int)len, arg);
            char names[128];
            flag_command_names(elsewhere, names, sizeof names);
            return cli_fail("unknown flag '%.*s' for spmd %s (a flag of %s)", (int)len, arg,
                            c->name, names);
        }
        const flag_spec *fs = &flag_rows[row];
        char *v = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
        if (!v) return cli_fail("%s needs a value", fs->name);
        o->given[row] = true;
        rc = flag_set(fs, v, o);
        if (rc) return rc;
    }
    return 0;
}

int flags_parse(int argc, char **argv, cli_command command, cli_opts *o)
{
    int rc = flags_read(argc, argv, command, o);
    if (!rc) rc = paths_check(o);
    if (!rc && (command & MODEL_COMMANDS)) rc = flags_settle(o);
    return rc;
}
