/*
 * The usage text (flag_usage.h): each command's flags from the table,
 * their help wrapped in a column, and the commands' list.
 */
#include "flag_usage.h"

#include "flag_table.h"

#include <string.h>

enum { USAGE_WIDTH = 92, HELP_COLUMN = 24 };

/* `left` then `text` wrapped at USAGE_WIDTH, the text at HELP_COLUMN. */
static void usage_row(FILE *f, const char *left, const char *text)
{
    int col = fprintf(f, "  %s", left);
    if (col > HELP_COLUMN - 2) {
        fputs("\n", f);
        col = 0;
    }
    const char *p = text;
    while (*p) {
        fprintf(f, "%*s", HELP_COLUMN - col, "");
        col = HELP_COLUMN;
        /* The longest run of whole words that fits. */
        size_t room = USAGE_WIDTH - HELP_COLUMN, take = strlen(p);
        if (take > room) {
            take = room;
            while (take > 0 && p[take] != ' ') take--;
            if (take == 0) take = strcspn(p, " ");
        }
        fprintf(f, "%.*s\n", (int)take, p);
        col = 0;
        p += take;
        while (*p == ' ') p++;
    }
    if (col) fputs("\n", f);
}

/* A row's defaults by optimizer, the optimizers of one value together:
 * "adamw, adam 1; sgd, rmsprop, adagrad 0"; one value alone when every
 * optimizer taking the row has it ("0.99").  False: no optimizer's row. */
static bool optimizer_defaults_text(const flag_spec *fs, char *buf, size_t size)
{
    bool done[CLI_OPTIMIZERS] = {0};
    int takers = 0, values = 0;
    for (int k = 0; k < CLI_OPTIMIZERS; k++) takers += fs->by_optimizer[k] != NULL;
    buf[0] = '\0';
    for (int k = 0; k < CLI_OPTIMIZERS; k++) {
        if (!fs->by_optimizer[k] || done[k]) continue;
        size_t n = strlen(buf);
        int same = 0;
        for (int j = k; j < CLI_OPTIMIZERS; j++) {
            if (!fs->by_optimizer[j] || strcmp(fs->by_optimizer[j], fs->by_optimizer[k])) continue;
            done[j] = true;
            same++;
            n += (size_t)snprintf(buf + n, n < size ? size - n : 0, "%s%s",
                                  same > 1 ? ", " : values ? "; " : "",
                                  cli_optimizer_word((spmd_optimizer_kind)j));
        }
        if (same == takers) n = 0; /* every taker's: the value alone */
        snprintf(buf + n, n < size ? size - n : 0, "%s%s", n ? " " : "", fs->by_optimizer[k]);
        values++;
    }
    return takers > 0;
}

void flags_usage(FILE *f, cli_command command)
{
    const command_spec *c = flag_command_of(command);
    fprintf(f, "usage: spmd %s %s   (each flag as --flag VALUE or --flag=VALUE)\n", c->name,
            c->synopsis);
    if (c->operand) usage_row(f, c->operand, c->operand_help);
    for (int i = 0; i < flag_row_count; i++) {
        const flag_spec *fs = &flag_rows[i];
        if (!(fs->commands & command)) continue;
        char left[64], text[512];
        snprintf(left, sizeof left, "%s %s", fs->name, fs->value);
        const char *shown = fs->shown ? fs->shown : fs->initial;
        char by_optimizer[160];
        if (!shown && optimizer_defaults_text(fs, by_optimizer, sizeof by_optimizer))
            shown = by_optimizer;
        if (shown && shown[0]) snprintf(text, sizeof text, "%s (%s)", fs->help, shown);
        else snprintf(text, sizeof text, "%s", fs->help);
        usage_row(f, left, text);
    }
}

void flags_usage_commands(FILE *f)
{
    fprintf(f, "usage: spmd COMMAND [flags]   (spmd COMMAND --help lists its flags)\n");
    for (int i = 0; i < flag_command_count; i++) {
        fprintf(f, "  spmd %s %s\n", flag_commands[i].name, flag_commands[i].synopsis);
        fprintf(f, "%*s%s\n", HELP_COLUMN, "", flag_commands[i].what);
    }
}

/* "spmd train and explain" for the commands in `bits`. */
void flag_command_names(unsigned bits, char *buf, size_t size)
{
    size_t n = (size_t)snprintf(buf, size, "spmd");
    int count = 0, total = 0;
    for (int i = 0; i < flag_command_count; i++) total += !!(bits & flag_commands[i].command);
    for (int i = 0; i < flag_command_count && n < size; i++) {
        if (!(bits & flag_commands[i].command)) continue;
        count++;
        const char *sep = count == 1 ? " " : count == total ? " and " : ", ";
        n += (size_t)snprintf(buf + n, size - n, "%s%s", sep, flag_commands[i].name);
    }
}
