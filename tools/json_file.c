/*
 * Writing a JSON file whole or not at all (the reports of `spmd train`
 * and `spmd explain`, the trace of `spmd train`).
 */
#include "json_file.h"

#include "message.h"
#include "processes.h"

#include <cJSON.h>

#include <errno.h>
#include <stdio.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Where a report goes: a symbolic link's target (replacing the link would
 * leave the target stale), else the path as given.  Only a regular file
 * may be replaced: renaming over a device or a directory is never meant.
 * 0, or errno with `why` set. */
static int report_target(const char *path, char *target, size_t size, const char **why)
{
    struct stat st;
    char resolved[PATH_MAX];
    *why = NULL;
    if (stat(path, &st) != 0) {
        snprintf(target, size, "%s", path);
        return 0;
    }
    if (S_ISDIR(st.st_mode)) *why = "is a directory";
    else if (!S_ISREG(st.st_mode)) *why = "is not a regular file";
    if (*why) return EINVAL;
    snprintf(target, size, "%s", realpath(path, resolved) ? resolved : path);
    return 0;
}

/* A new temporary file beside `target` (same directory, so rename() can
 * replace the target in one step); its name goes to `tmp`.  -1 with errno. */
static int temp_beside(const char *target, char *tmp, size_t size)
{
    const char *slash = strrchr(target, '/');
    int dir = slash ? (int)(slash - target) + 1 : 0;
    if ((size_t)snprintf(tmp, size, "%.*s.%s.XXXXXX", dir, target, target + dir) >= size) {
        errno = ENAMETOOLONG;
        return -1;
    }
    return mkstemp(tmp);
}

static int write_all(int fd, const char *text, size_t n)
{
    while (n) {
        ssize_t w = write(fd, text, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return w < 0 ? errno : EIO;
        text += w, n -= (size_t)w;
    }
    return 0;
}

/* The mode a new report gets: the old one's, else what the umask allows. */
static mode_t report_mode(const char *target)
{
    struct stat st;
    if (stat(target, &st) == 0) return st.st_mode & 07777;
    mode_t mask = umask(0);
    umask(mask);
    return 0666 & ~mask;
}

int json_file_write(const char *flag, const char *what, const char *path, cJSON *root)
{
    /* Over several processes, process 0 writes the run's one report. */
    if (processes_rank() != 0) {
        cJSON_Delete(root);
        return 0;
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) return cli_fail("%s %s: could not format %s: out of memory", flag, path, what);
    /* Written whole beside the target, then renamed over it: a failure
     * at any point leaves the earlier report, never a truncated one. */
    char target[PATH_MAX], tmp[PATH_MAX + 16];
    const char *why;
    int err = report_target(path, target, sizeof target, &why), fd = -1;
    if (!err && (fd = temp_beside(target, tmp, sizeof tmp)) < 0) err = errno;
    if (!err) err = write_all(fd, text, strlen(text));
    if (!err) err = write_all(fd, "\n", 1);
    if (!err && (fchmod(fd, report_mode(target)) != 0 || fsync(fd) != 0)) err = errno;
    if (fd >= 0 && close(fd) != 0 && !err) err = errno;
    if (!err && rename(tmp, target) != 0) err = errno;
    if (err && fd >= 0) unlink(tmp);
    free(text);
    if (!err) return 0;
    cli_fail("%s %s: cannot write %s: %s; an earlier file there is left as it was", flag, path,
             what, why ? why : strerror(err));
    return 1;
}
