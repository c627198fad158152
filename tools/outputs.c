/* The files a command writes, checked before it runs (see outputs.h). */
#include "outputs.h"

#include "options.h"
#include "message.h"

#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int outputs_check_target(const char *flag, const char *path)
{
    if (!path) return 0;
    if (!path[0]) return cli_fail("%s '': an empty path names no file", flag);
    struct stat st;
    if (stat(path, &st) != 0) return 0; /* a new file */
    if (S_ISDIR(st.st_mode)) return cli_fail("%s %s: it is a directory, not a file", flag, path);
    if (!S_ISREG(st.st_mode))
        return cli_fail("%s %s: it is not a regular file (a FIFO, a device or a socket): only a "
                        "regular file or a new path is written", flag, path);
    return 0;
}

/* The absolute path with no symbolic link: realpath, or for a file not
 * there yet its directory's realpath and its name; false when neither. */
static bool canonical(const char *path, char *buf)
{
    char dir[PATH_MAX];
    if (realpath(path, buf)) return true;
    const char *slash = strrchr(path, '/');
    const char *name = slash ? slash + 1 : path;
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == path) snprintf(dir, sizeof dir, "/");
    else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    char real[PATH_MAX];
    if (!realpath(dir, real)) return false;
    return (size_t)snprintf(buf, PATH_MAX, "%s/%s", strcmp(real, "/") ? real : "", name) < PATH_MAX;
}

/* Whether a and b name one file: the same inode where both exist, else
 * the same canonical path. */
static bool same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    bool ea = stat(a, &sa) == 0, eb = stat(b, &sb) == 0;
    if (ea && eb) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    if (ea != eb) return false;
    char ca[PATH_MAX], cb[PATH_MAX];
    return canonical(a, ca) && canonical(b, cb) ? !strcmp(ca, cb) : !strcmp(a, b);
}

int outputs_check_apart(const outputs_file *out, int n_out, const outputs_file *in, int n_in)
{
    struct stat st;
    for (int i = 0; i < n_out; i++) {
        if (!out[i].path) continue;
        for (int j = i + 1; j < n_out; j++)
            if (out[j].path && same_file(out[i].path, out[j].path))
                return cli_fail("%s %s and %s %s name one file: each would overwrite the other",
                                out[i].flag, out[i].path, out[j].flag, out[j].path);
        for (int j = 0; j < n_in; j++)
            if (in[j].path && stat(in[j].path, &st) == 0 && same_file(out[i].path, in[j].path))
                return cli_fail("%s %s is the file %s %s reads: writing it would destroy the input",
                                out[i].flag, out[i].path, in[j].flag, in[j].path);
    }
    return 0;
}

/* Whether the path below a checkpoint directory, "latest" or
 * "step-00000004/index.json", is one of the checkpoint's own. */
static bool checkpoint_name(const char *rest)
{
    size_t n = strcspn(rest, "/");
    const char *const names[] = {"latest", ".lock"}, *const prefixes[] = {"step-", ".tmp-step-", "copy-"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (n == strlen(names[i]) && !strncmp(rest, names[i], n)) return true;
    for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++)
        if (!strncmp(rest, prefixes[i], strlen(prefixes[i]))) return true;
    return false;
}

int outputs_check_outside(const outputs_file *out, int n_out, const outputs_file *in, bool whole)
{
    char dir[PATH_MAX], file[PATH_MAX];
    if (!in->path || !realpath(in->path, dir)) return 0;
    size_t n = strlen(dir);
    for (int i = 0; i < n_out; i++) {
        if (!out[i].path || !canonical(out[i].path, file)) continue;
        if (strncmp(file, dir, n) || (file[n] != '/' && file[n] != '\0')) continue;
        if (whole || (file[n] == '/' && checkpoint_name(file + n + 1)))
            return cli_fail("%s %s lies inside the checkpoint %s %s: writing there would damage "
                            "the checkpoint", out[i].flag, out[i].path, in->flag, in->path);
    }
    return 0;
}

int outputs_check_train(const cli_opts *o)
{
    /* --save last: a directory, so not a file target, but no file's path. */
    const outputs_file out[] = {{"--log", o->log}, {"--json", o->json}, {"--plot", o->plot}, {"--save", o->save}};
    const outputs_file in[] = {{"--data", o->data}, {"--val-data", o->val_data}, {"--init", o->init}};
    enum { N_FILES = sizeof out / sizeof *out - 1, N_IN = sizeof in / sizeof *in };
    int rc = 0;
    for (int i = 0; i < N_FILES && !rc; i++) rc = outputs_check_target(out[i].flag, out[i].path);
    if (!rc) rc = outputs_check_apart(out, N_FILES + 1, in, N_IN);
    const outputs_file resume = {"--resume", o->resume}, save = {"--save", o->save};
    if (!rc) rc = outputs_check_outside(out, N_FILES, &resume, false);
    if (!rc) rc = outputs_check_outside(out, N_FILES, &save, false);
    return rc;
}
