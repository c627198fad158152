/*
 * The settings every process of a run under mpirun must share
 * (settings_agree.h): the settled value of each row of the flag table, as
 * text, compared with process 0's by processes_agree.
 */
#include "settings_agree.h"

#include "flag_table.h"
#include "message.h"
#include "processes.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Text that grows: the settings' name and value pairs. */
typedef struct settings_text {
    char *buf;
    size_t len, cap;
    bool failed;
} settings_text;

static void settings_put(settings_text *t, const char *s, size_t n)
{
    if (t->failed) return;
    if (t->len + n + 1 > t->cap) {
        size_t cap = (t->len + n + 1) * 2;
        char *buf = realloc(t->buf, cap);
        if (!buf) {
            t->failed = true;
            return;
        }
        t->buf = buf, t->cap = cap;
    }
    memcpy(t->buf + t->len, s, n);
    t->len += n;
    t->buf[t->len] = '\0';
}

static void settings_printf(settings_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void settings_printf(settings_text *t, const char *fmt, ...)
{
    char part[64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(part, sizeof part, fmt, ap);
    va_end(ap);
    settings_put(t, part, n < (int)sizeof part ? (size_t)n : sizeof part - 1);
}

/* A float as its shortest text that reads back as it (0.01, not
 * 0.00999999978). */
static void settings_float(settings_text *t, const char *sep, float v)
{
    char text[32];
    for (int digits = 6; digits <= 9; digits++) {
        snprintf(text, sizeof text, "%.*g", digits, (double)v);
        if (strtof(text, NULL) == v) break;
    }
    settings_printf(t, "%s%s", sep, text);
}

/* One row's settled value, as text; NUL-terminated in t. */
static void settings_value(settings_text *t, const flag_spec *fs, const cli_opts *o)
{
    const char *field = (const char *)o + fs->offset;
    const char *name = fs->name;
    switch (fs->kind) {
    case FLAG_INT: settings_printf(t, "%d", *(const int *)(const void *)field); break;
    case FLAG_FLOAT: settings_float(t, "", *(const float *)(const void *)field); break;
    case FLAG_TEXT: {
        const char *v = *(const char *const *)(const void *)field;
        settings_put(t, v ? v : "(none)", strlen(v ? v : "(none)"));
        break;
    }
    case FLAG_CHOICE: {
        const char *bar = strchr(fs->choices, '|');
        if (*(const bool *)(const void *)field) settings_put(t, bar + 1, strlen(bar + 1));
        else settings_put(t, fs->choices, (size_t)(bar - fs->choices));
        break;
    }
    case FLAG_CUSTOM:
        if (!strcmp(name, "--model")) settings_put(t, o->model, strlen(o->model));
        else if (!strcmp(name, "--optimizer"))
            settings_put(t, cli_optimizer_word(o->optimizer.kind),
                         strlen(cli_optimizer_word(o->optimizer.kind)));
        else if (!strcmp(name, "--shard"))
            for (int i = 0; i < o->n_shards; i++) {
                settings_printf(t, "%s", i ? " " : "");
                settings_put(t, o->shards[i].pattern, strlen(o->shards[i].pattern));
                settings_put(t, "=", 1);
                settings_put(t, o->shards[i].spec, strlen(o->shards[i].spec));
            }
        else if (!strcmp(name, "--prompt"))
            for (int i = 0; i < o->n_prompts; i++) {
                settings_put(t, "'", 1);
                settings_put(t, o->prompts[i], strlen(o->prompts[i]));
                settings_put(t, i + 1 < o->n_prompts ? "' " : "'", i + 1 < o->n_prompts ? 2 : 1);
            }
        else /* a per-copy list: its values, else the settled one */
            for (int i = 0, n = !strcmp(name, "--seed") ? o->n_seeds : !strcmp(name, "--lr") ? o->n_lrs
                                 : !strcmp(name, "--warmup") ? o->n_warmups : o->n_wds;
                 i < (n ? n : 1); i++) {
                const char *sep = i ? "," : "";
                if (!strcmp(name, "--seed"))
                    settings_printf(t, "%s%" PRIu64, sep, n ? o->seeds[i] : o->seed);
                else if (!strcmp(name, "--lr"))
                    settings_float(t, sep, n ? o->lrs[i] : o->lr);
                else if (!strcmp(name, "--warmup"))
                    settings_printf(t, "%s%d", sep, n ? o->warmups[i] : o->warmup);
                else
                    settings_float(t, sep, n ? o->wds[i] : o->optimizer.weight_decay);
            }
        break;
    }
    settings_put(t, "", 0);
    t->len++; /* the value's NUL */
}

/* Every process compares its settled settings with process 0's: each row
 * of the table for this command (so a new flag is compared by
 * construction), but those that may differ by process: its threads, its
 * host's BLAS, and the outputs only process 0 writes. */
int settings_agree(const cli_opts *o)
{
    static const char *const own[] = {"--threads", "--blas", "--blas-core", "--json",
                                      "--log", "--plot", "--log-every"};
    settings_text t = {0};
    char command[32];
    snprintf(command, sizeof command, "spmd %s", flag_command_of(o->command)->name);
    settings_put(&t, "command", 8);
    settings_put(&t, command, strlen(command) + 1);
    for (int i = 0; i < flag_row_count; i++) {
        const flag_spec *fs = &flag_rows[i];
        bool mine = false;
        for (size_t k = 0; k < sizeof own / sizeof *own; k++) mine |= !strcmp(fs->name, own[k]);
        if (!(fs->commands & o->command) || mine) continue;
        settings_put(&t, fs->name, strlen(fs->name) + 1);
        settings_value(&t, fs, o);
    }
    int rc = t.failed ? cli_fail("out of memory listing the settings") : 0;
    if (!rc) rc = processes_agree(t.buf, t.len);
    free(t.buf);
    return rc;
}
