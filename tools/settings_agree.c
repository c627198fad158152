/*
 * The settings every process of a run under mpirun must share
 * (settings_agree.h): the settled value of each row of the flag table, as
 * text, compared with process 0's by processes_agree; then the bytes of
 * the input files the flags name, as a crc32 and a length each.
 */
#include "settings_agree.h"

#include "flag_table.h"
#include "message.h"
#include "processes.h"

#include "train/checkpoint.h"
#include "train/checkpoint_fs.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

char *settings_value_text(const flag_spec *fs, const cli_opts *o)
{
    settings_text t = {0};
    settings_value(&t, fs, o);
    if (t.failed) {
        free(t.buf);
        return NULL;
    }
    return t.buf;
}

/* ---- The input files' bytes ---------------------------------------------------------------- */

/* "file FLAG PATH" and "crc32 X (N bytes)" (or why it cannot be read):
 * the pair processes_agree phrases as a file read differently. */
static void file_digest(settings_text *t, const char *flag, const char *path)
{
    char name[4096 + 64], value[128];
    snprintf(name, sizeof name, "file %s %s", flag, path);
    int fd = ckpt_open_input(path);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        snprintf(value, sizeof value, "(cannot be read: %s)", strerror(errno));
    } else if (!S_ISREG(st.st_mode)) {
        snprintf(value, sizeof value, "(not a regular file)");
    } else {
        static unsigned char buf[1 << 20];
        uint32_t crc = 0;
        long long bytes = 0;
        ssize_t n;
        while ((n = read(fd, buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR))
            if (n > 0) crc = ckpt_crc32(crc, buf, (size_t)n), bytes += n;
        if (n < 0) snprintf(value, sizeof value, "(cannot be read: %s)", strerror(errno));
        else snprintf(value, sizeof value, "crc32 %08" PRIx32 " (%lld bytes)", crc, bytes);
    }
    if (fd >= 0) close(fd);
    settings_put(t, name, strlen(name) + 1);
    settings_put(t, value, strlen(value) + 1);
}

/* A checkpoint directory's bytes: its index (whose crc32 of every block
 * file stands for the files) and `latest`; each copy's, with copies. */
static void checkpoint_digest(settings_text *t, const char *flag, const char *dir)
{
    char path[4096], name[4096];
    snprintf(path, sizeof path, "%s/index.json", dir);
    if (access(path, F_OK) == 0) {
        file_digest(t, flag, path);
        return;
    }
    snprintf(path, sizeof path, "%s/latest", dir);
    if (access(path, F_OK) == 0) {
        file_digest(t, flag, path);
        char step[32];
        if (ckpt_read_latest(NULL, dir, step, flag) == SPMD_OK) {
            snprintf(name, sizeof name, "%s/%s/index.json", dir, step);
            file_digest(t, flag, name);
        }
        return;
    }
    for (int c = 0;; c++) { /* --copies: DIR/copy-C */
        snprintf(path, sizeof path, "%s/copy-%d", dir, c);
        if (access(path, F_OK) != 0) break;
        checkpoint_digest(t, flag, path);
    }
}

/* The files an input flag names: the paths a glob matches (a data set of
 * shards), both files of an --encoder folder, a checkpoint's index and
 * `latest`.  A name that matches no file (--data arith) has none. */
static void input_digests(settings_text *t, const char *flag, const char *value)
{
    char path[4096];
    if (!strcmp(flag, "--resume")) {
        checkpoint_digest(t, flag, value);
    } else if (!strcmp(flag, "--encoder")) {
        static const char *const files[] = {"encoder.json", "vocab.bpe"};
        for (int i = 0; i < 2; i++) {
            snprintf(path, sizeof path, "%s/%s", value, files[i]);
            file_digest(t, flag, path);
        }
    } else {
        glob_t g = {0};
        if (glob(value, 0, NULL, &g) == 0)
            for (size_t i = 0; i < g.gl_pathc; i++) file_digest(t, flag, g.gl_pathv[i]);
        globfree(&g);
    }
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
    /* The inputs' bytes, after every setting: a name that differs is
     * named as a setting first. */
    static const char *const inputs[] = {"--data", "--val-data", "--init", "--resume", "--tokenizer",
                                         "--encoder"};
    for (int i = 0; i < flag_row_count; i++) {
        const flag_spec *fs = &flag_rows[i];
        if (!(fs->commands & o->command) || fs->kind != FLAG_TEXT) continue;
        const char *value = *(const char *const *)(const void *)((const char *)o + fs->offset);
        for (size_t k = 0; value && k < sizeof inputs / sizeof *inputs; k++)
            if (!strcmp(fs->name, inputs[k])) input_digests(&t, fs->name, value);
    }
    int rc = t.failed ? cli_fail("out of memory listing the settings") : 0;
    if (!rc) rc = processes_agree(t.buf, t.len);
    free(t.buf);
    return rc;
}
