/* Paths as a kind: a command's paths checked together (see paths.h). */
#include "paths.h"

#include "message.h"

#include "train/checkpoint_fs.h"
#include "train/checkpoint_paths.h"

#include <ctype.h>
#include <errno.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* One path of the command. */
typedef struct path_item {
    const char *flag; /* "--trace", or the operand's word: "LOG" */
    char *path;       /* as given; DIR/NAME for a file of a directory flag */
    path_kind kind;   /* a directory flag's files: PATH_IN_FILE or PATH_OUT_FILE */
    bool in_dir;      /* a file of a directory flag, made by the command if need be */
    char real[CKPT_PATH_MAX]; /* resolved (ckpt_resolve) */
    bool exists;
    struct stat st;
} path_item;

typedef struct path_list {
    const char *command; /* "train" */
    path_item *items;
    int n, cap;
} path_list;

static bool is_checkpoint(path_kind k) { return k == PATH_IN_CHECKPOINT || k == PATH_OUT_CHECKPOINT; }

/* ---- The paths of a command ------------------------------------------------------------ */

static int add(path_list *l, const char *flag, const char *path, path_kind kind, bool in_dir)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 16;
        path_item *grown = realloc(l->items, (size_t)cap * sizeof *grown);
        if (!grown) return cli_fail("out of memory listing the paths");
        l->items = grown, l->cap = cap;
    }
    path_item *it = &l->items[l->n];
    *it = (path_item){.flag = flag, .path = strdup(path), .kind = kind, .in_dir = in_dir};
    if (!it->path) return cli_fail("out of memory listing the paths");
    l->n++;
    return 0;
}

/* A value that is a file only when one is there: the file, a glob's
 * matches, or none (a data set's built-in name "arith", a list of
 * hosts, a program found on PATH). */
static int add_if_there(path_list *l, const char *flag, const char *spec)
{
    struct stat st;
    if (lstat(spec, &st) == 0) return add(l, flag, spec, PATH_IN_FILE, false);
    if (!strpbrk(spec, "*?[")) return 0;
    glob_t g;
    int rc = 0;
    if (glob(spec, 0, NULL, &g) == 0)
        for (size_t i = 0; !rc && i < g.gl_pathc; i++) rc = add(l, flag, g.gl_pathv[i], PATH_IN_FILE, false);
    globfree(&g);
    return rc;
}

/* A value of `kind`: itself, and for a directory the files named in it. */
static int add_value(path_list *l, const char *flag, const char *value, path_kind kind,
                     const char *const *files)
{
    if (kind == PATH_IN_FILE_IF_THERE) return add_if_there(l, flag, value);
    int rc = add(l, flag, value, kind, false);
    for (int i = 0; !rc && files && files[i]; i++) {
        char path[CLI_PATH_MAX];
        if (snprintf(path, sizeof path, "%s/%s", value, files[i]) >= (int)sizeof path)
            return cli_fail("%s %s: the path is too long", flag, value);
        rc = add(l, flag, path, kind == PATH_OUT_DIR ? PATH_OUT_FILE : PATH_IN_FILE, true);
    }
    return rc;
}

/* The word an operand goes by in messages: the synopsis's, up to a dot
 * ("LOG.jsonl": "LOG"). */
static const char *operand_word(const command_spec *c, char *buf, size_t size)
{
    snprintf(buf, size, "%.*s", (int)strcspn(c->operand, ".["), c->operand);
    return buf;
}

static int collect(const cli_opts *o, path_list *l, char *word, size_t word_size)
{
    int rc = 0;
    for (int i = 0; !rc && i < flag_row_count; i++) {
        const flag_spec *fs = &flag_rows[i];
        if (!(fs->commands & o->command) || fs->path == PATH_NONE) continue;
        const char *value = *(const char *const *)(const void *)((const char *)o + fs->offset);
        if (value) rc = add_value(l, fs->name, value, fs->path, fs->path_files);
    }
    const command_spec *c = flag_command_of(o->command);
    if (rc || c->operand_path == PATH_NONE) return rc;
    const char *flag = operand_word(c, word, word_size);
    if (o->operand) rc = add_value(l, flag, o->operand, c->operand_path, NULL);
    for (int i = 0; !rc && i < o->n_operands; i++)
        rc = add_value(l, flag, o->operands[i], c->operand_path, NULL);
    return rc;
}

/* ---- The rules ---------------------------------------------------------------------------- */

static int resolve(const path_list *l, path_item *it)
{
    if (!it->path[0]) return cli_fail("%s %s '': an empty path names no file", l->command, it->flag);
    char what[256];
    snprintf(what, sizeof what, "%s %s", l->command, it->flag);
    if (ckpt_resolve(it->path, it->real, what) != SPMD_OK) return cli_fail("%s", spmd_last_error());
    it->exists = stat(it->real, &it->st) == 0;
    return 0;
}

/* What the path is, by its kind: an input there a regular file (or a
 * directory), an output a regular file or a new path. */
static int check_kind(const path_list *l, const path_item *it)
{
    if (it->kind == PATH_OUT_CHECKPOINT) {
        /* The library's rule, which its own saves keep too. */
        char what[256];
        snprintf(what, sizeof what, "%s %s", l->command, it->flag);
        return ckpt_check_save_dir(it->path, what) == SPMD_OK ? 0 : cli_fail("%s", spmd_last_error());
    }
    if (!it->exists) return 0;
    bool dir = S_ISDIR(it->st.st_mode);
    switch (it->kind) {
    case PATH_IN_FILE: {
        const char *why;
        int fd = ckpt_open_regular(it->real, &why);
        if (fd >= 0) close(fd);
        if (why)
            return cli_fail("%s %s %s: it is %s; only a regular file is read", l->command,
                            it->flag, it->path, why);
        return 0; /* one that cannot be opened is the reader's to name */
    }
    case PATH_IN_DIR:
    case PATH_IN_CHECKPOINT:
    case PATH_OUT_DIR:
        if (!dir) return cli_fail("%s %s %s: not a directory", l->command, it->flag, it->path);
        return 0;
    case PATH_OUT_FILE:
        if (dir) return cli_fail("%s %s %s: it is a directory, not a file", l->command, it->flag, it->path);
        if (!S_ISREG(it->st.st_mode))
            return cli_fail("%s %s %s: it is %s: only a regular file or a new path is written",
                            l->command, it->flag, it->path, ckpt_not_regular(it->st.st_mode));
        return 0;
    default:
        return 0;
    }
}

/* Whether a and b name one file: one inode where both are there, else one
 * resolved path. */
static bool same_file(const path_item *a, const path_item *b)
{
    if (a->exists && b->exists) return a->st.st_dev == b->st.st_dev && a->st.st_ino == b->st.st_ino;
    return !strcmp(a->real, b->real);
}

static bool is_output(path_kind k) { return k == PATH_OUT_FILE || k == PATH_OUT_DIR || k == PATH_OUT_CHECKPOINT; }

/* No two outputs on one file, no output file on an input. */
static int check_apart(const path_list *l)
{
    for (int i = 0; i < l->n; i++) {
        const path_item *a = &l->items[i];
        if (!is_output(a->kind)) continue;
        for (int j = i + 1; j < l->n; j++) {
            const path_item *b = &l->items[j];
            if (is_output(b->kind) && same_file(a, b))
                return cli_fail("%s %s %s and %s %s name one file: each would overwrite the other",
                                l->command, a->flag, a->path, b->flag, b->path);
        }
        for (int j = 0; a->kind == PATH_OUT_FILE && j < l->n; j++) {
            const path_item *b = &l->items[j];
            if (b->kind == PATH_IN_FILE && b->exists && same_file(a, b))
                return cli_fail("%s %s %s is the file %s %s reads: writing it would destroy the input",
                                l->command, a->flag, a->path, b->flag, b->path);
        }
    }
    return 0;
}

/* No output file in a checkpoint: the command's own, or one on disk. */
static int check_outside_checkpoints(const path_list *l)
{
    const char **known = calloc((size_t)l->n + 1, sizeof *known);
    if (!known) return cli_fail("out of memory checking the paths");
    int n_known = 0, rc = 0;
    for (int i = 0; i < l->n; i++)
        if (is_checkpoint(l->items[i].kind)) known[n_known++] = l->items[i].real;
    for (int i = 0; !rc && i < l->n; i++) {
        const path_item *a = &l->items[i];
        char ckpt[CKPT_PATH_MAX];
        if (a->kind != PATH_OUT_FILE || !ckpt_path_in_checkpoint(a->real, known, n_known, false, ckpt))
            continue;
        /* Named by the flag that gave it, when one did (a step directory
         * of it names it too). */
        const path_item *by = NULL;
        for (int j = 0; !by && j < l->n; j++) {
            const path_item *b = &l->items[j];
            size_t n = strlen(b->real);
            if (is_checkpoint(b->kind) && !strncmp(ckpt, b->real, n) &&
                (ckpt[n] == '\0' || (ckpt[n] == '/' && !strchr(ckpt + n + 1, '/'))))
                by = b;
        }
        if (by)
            rc = cli_fail("%s %s %s lies inside the checkpoint %s %s: writing there would damage "
                          "the checkpoint", l->command, a->flag, a->path, by->flag, by->path);
        else
            rc = cli_fail("%s %s %s lies inside the checkpoint %s: writing there would damage the "
                          "checkpoint", l->command, a->flag, a->path, ckpt);
    }
    free(known);
    return rc;
}

/* A file can be made where an output file goes (beside its resolved
 * target): a directory that is missing, read-only or full is found now,
 * not once the work is done. */
static int check_writable(const path_list *l, const path_item *it)
{
    if (it->kind != PATH_OUT_FILE || it->in_dir) return 0;
    char probe[CKPT_PATH_MAX + 32];
    const char *slash = strrchr(it->real, '/');
    snprintf(probe, sizeof probe, "%.*s/.%s.XXXXXX", (int)(slash - it->real), it->real, slash + 1);
    int fd = mkstemp(probe);
    if (fd < 0)
        return cli_fail("%s %s %s: cannot create a file there: %s", l->command, it->flag, it->path,
                        strerror(errno));
    close(fd);
    unlink(probe);
    return 0;
}

int paths_check(const cli_opts *o)
{
    path_list l = {.command = flag_command_of(o->command)->name};
    char word[32];
    int rc = collect(o, &l, word, sizeof word);
    for (int i = 0; !rc && i < l.n; i++) rc = resolve(&l, &l.items[i]);
    for (int i = 0; !rc && i < l.n; i++) rc = check_kind(&l, &l.items[i]);
    if (!rc) rc = check_apart(&l);
    if (!rc) rc = check_outside_checkpoints(&l);
    for (int i = 0; !rc && i < l.n; i++) rc = check_writable(&l, &l.items[i]);
    for (int i = 0; i < l.n; i++) free(l.items[i].path);
    free(l.items);
    return rc;
}

/* ---- The table's declarations ------------------------------------------------------------ */

/* Whether one alternative of a usage word names a path. */
static bool word_names_path(const char *w, size_t n)
{
    static const char *const words[] = {"FILE", "DIR", "PATH"};
    for (size_t i = 0; i < sizeof words / sizeof *words; i++)
        if (n == strlen(words[i]) && !strncmp(w, words[i], n)) return true;
    /* NAME.ext, the name in capitals: FILE.json, LOG.jsonl. */
    size_t caps = 0;
    while (caps < n && isupper((unsigned char)w[caps])) caps++;
    return caps > 0 && caps + 1 < n && w[caps] == '.';
}

bool paths_value_names_path(const char *value)
{
    for (const char *w = value; w && *w;) {
        size_t n = strcspn(w, "|");
        if (word_names_path(w, n)) return true;
        w += n + (w[n] == '|');
    }
    return false;
}

const char *paths_undeclared(const flag_spec *rows, int n_rows, const command_spec *commands,
                             int n_commands, char *why, size_t size)
{
    for (int i = 0; i < n_rows; i++) {
        const flag_spec *fs = &rows[i];
        bool names = fs->value && paths_value_names_path(fs->value);
        bool dir = fs->path == PATH_IN_DIR || fs->path == PATH_OUT_DIR;
        const char *wrong = names && fs->path == PATH_NONE ? "names a path but declares no path kind"
                            : !names && fs->path != PATH_NONE ? "declares a path kind but its value "
                                                                "names no file or directory"
                            : fs->path != PATH_NONE && fs->kind != FLAG_TEXT ? "declares a path kind "
                                                                               "but is not text"
                            : dir && !fs->path_files ? "is a directory kind without its files"
                            : !dir && fs->path_files ? "names files but is no directory kind"
                                                     : NULL;
        if (wrong) {
            snprintf(why, size, "flag row %d, %s %s, %s", i, fs->name, fs->value ? fs->value : "",
                     wrong);
            return why;
        }
    }
    for (int i = 0; i < n_commands; i++) {
        const command_spec *c = &commands[i];
        if (c->operand && c->operand_path == PATH_NONE) {
            snprintf(why, size, "command %s: its operand %s declares no path kind", c->name,
                     c->operand);
            return why;
        }
    }
    return NULL;
}
