/*
 * Where a path lies (train/checkpoint_paths.h): resolved through its
 * symbolic links, and whether it falls in a checkpoint.
 */
#include "train/checkpoint_paths.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "train/checkpoint.h"
#include "train/checkpoint_fs.h"

/* Links followed in one resolution before it is taken for a loop (the
 * kernel's own limit). */
enum { MAX_LINKS = 40 };

/* `cur` without its last component ("/a/b" -> "/a"; "" is the root). */
static void drop_last(char *cur)
{
    char *slash = strrchr(cur, '/');
    if (slash) *slash = '\0';
}

spmd_status ckpt_resolve(const char *path, char *out, const char *what)
{
    if (!path || !path[0]) return base_error(SPMD_ERR_INVALID, "%s: an empty path names no file", what);
    /* `cur` is resolved ("" for the root); `rest` the components still to
     * walk, a link's target put in front of them. */
    char cur[CKPT_PATH_MAX] = "", rest[2 * CKPT_PATH_MAX], link[CKPT_PATH_MAX];
    if (path[0] != '/' && !getcwd(cur, sizeof cur))
        return base_error(SPMD_ERR_IO, "%s: %s: the working directory cannot be read: %s", what,
                          path, strerror(errno));
    if (!strcmp(cur, "/")) cur[0] = '\0';
    if (strlen(path) >= sizeof rest)
        return base_error(SPMD_ERR_INVALID, "%s: path %.80s... is too long", what, path);
    strcpy(rest, path);
    int links = 0;
    bool missing = false; /* below a missing component nothing exists: the rest is as written */
    for (char *r = rest; *r;) {
        while (*r == '/') r++;
        size_t n = strcspn(r, "/");
        if (!n) break;
        char name[CKPT_PATH_MAX];
        memcpy(name, r, n);
        name[n] = '\0';
        r += n;
        if (!strcmp(name, ".")) continue;
        if (!strcmp(name, "..")) { /* `cur` has no link in it: its parent is the real one */
            drop_last(cur);
            continue;
        }
        size_t len = strlen(cur);
        if (len + 1 + n >= sizeof cur)
            return base_error(SPMD_ERR_INVALID, "%s: path %s is too long", what, path);
        cur[len] = '/';
        memcpy(cur + len + 1, name, n + 1);
        if (missing) continue;
        struct stat st;
        if (lstat(cur, &st) != 0) {
            if (errno == ENOENT || errno == ENOTDIR) {
                missing = true;
                continue;
            }
            return base_error(SPMD_ERR_IO, "%s: %s: cannot look at %s: %s", what, path, cur,
                              strerror(errno));
        }
        if (!S_ISLNK(st.st_mode)) continue;
        if (++links > MAX_LINKS)
            return base_error(SPMD_ERR_IO, "%s: %s: a loop of symbolic links (more than %d "
                              "followed)", what, path, MAX_LINKS);
        ssize_t k = readlink(cur, link, sizeof link - 1);
        if (k <= 0)
            return base_error(SPMD_ERR_IO, "%s: %s: cannot read the link %s: %s", what, path, cur,
                              k < 0 ? strerror(errno) : "it is empty");
        link[k] = '\0';
        /* The target, then what was left after the link. */
        size_t tail = strlen(r);
        if ((size_t)k + 1 + tail >= sizeof rest)
            return base_error(SPMD_ERR_INVALID, "%s: path %s is too long", what, path);
        memmove(rest + k + 1, r, tail + 1);
        memcpy(rest, link, (size_t)k);
        rest[k] = '/';
        r = rest;
        if (link[0] == '/') cur[0] = '\0';
        else drop_last(cur); /* relative to the link's directory */
    }
    snprintf(out, CKPT_PATH_MAX, "%s", cur[0] ? cur : "/");
    return SPMD_OK;
}

static bool prefixed(const char *name, const char *prefix)
{
    return !strncmp(name, prefix, strlen(prefix));
}

/* A step directory's name, or a save's temporary one. */
static bool step_like(const char *name)
{
    return prefixed(name, "step-") || prefixed(name, ".tmp-step-") || prefixed(name, ".del-step-");
}

bool ckpt_own_name(const char *name, bool copies_apart)
{
    return !strcmp(name, CKPT_LATEST) || !strcmp(name, CKPT_LOCK) || step_like(name) ||
           (!copies_apart && prefixed(name, "copy-"));
}

static bool exists(const char *dir, const char *name, const char *sub)
{
    char path[CKPT_PATH_MAX];
    struct stat st;
    int n = snprintf(path, sizeof path, "%s/%s%s%s", dir, name, sub ? "/" : "", sub ? sub : "");
    return n > 0 && n < (int)sizeof path && lstat(path, &st) == 0;
}

/* Whether dir/latest is a regular file that names a step, as a
 * checkpoint's does (a file of the user's called latest is not). */
static bool latest_names_a_step(const char *dir)
{
    char path[CKPT_PATH_MAX], text[64];
    if (snprintf(path, sizeof path, "%s/" CKPT_LATEST, dir) >= (int)sizeof path) return false;
    int fd = ckpt_open_input(path);
    if (fd < 0) return false;
    struct stat st;
    ssize_t n = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? pread(fd, text, sizeof text - 1, 0) : -1;
    close(fd);
    if (n <= 0) return false;
    text[n] = '\0';
    text[strcspn(text, " \t\r\n")] = '\0';
    int64_t step;
    return ckpt_parse_step_name(text, &step);
}

/* Whether `dir` is a checkpoint directory on disk: its latest names a
 * step, or it holds a step directory with an index. */
static bool checkpoint_dir(const char *dir)
{
    if (latest_names_a_step(dir)) return true;
    DIR *d = opendir(dir);
    bool found = false;
    for (struct dirent *e; d && !found && (e = readdir(d));)
        found = step_like(e->d_name) && exists(dir, e->d_name, CKPT_INDEX);
    if (d) closedir(d);
    return found;
}

static bool known_dir(const char *dir, const char *const *known, int n_known)
{
    for (int i = 0; i < n_known; i++)
        if (known[i] && !strcmp(known[i], dir)) return true;
    return false;
}

bool ckpt_path_in_checkpoint(const char *path, const char *const *known, int n_known,
                             bool copies_apart, char *ckpt)
{
    char dir[CKPT_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    if (known_dir(dir, known, n_known)) {
        if (ckpt) snprintf(ckpt, CKPT_PATH_MAX, "%s", dir);
        return true;
    }
    /* Each ancestor, from the path's directory up, with the name below it
     * on the way to the path. */
    for (char *slash; (slash = strrchr(dir, '/')) != NULL && slash[1];) {
        char name[CKPT_PATH_MAX];
        snprintf(name, sizeof name, "%s", slash + 1);
        if (slash == dir) slash[1] = '\0'; /* the root */
        else *slash = '\0';
        if (!ckpt_own_name(name, copies_apart)) continue;
        /* A step directory with its index is a checkpoint wherever it is. */
        bool step = step_like(name) && exists(dir, name, CKPT_INDEX);
        if (step || known_dir(dir, known, n_known) || checkpoint_dir(dir)) {
            /* A step directory names its checkpoint best; else the directory. */
            int n = !ckpt ? 0
                    : step ? snprintf(ckpt, CKPT_PATH_MAX, "%s%s%s", dir, strcmp(dir, "/") ? "/" : "", name)
                           : snprintf(ckpt, CKPT_PATH_MAX, "%s", dir);
            if (n >= CKPT_PATH_MAX) snprintf(ckpt, CKPT_PATH_MAX, "%s", dir);
            return true;
        }
    }
    return false;
}

spmd_status ckpt_check_save_dir(const char *dir, const char *what)
{
    char real[CKPT_PATH_MAX], ckpt[CKPT_PATH_MAX];
    spmd_status st = ckpt_resolve(dir, real, what);
    if (st != SPMD_OK) return st;
    struct stat sb;
    int there = stat(real, &sb) == 0 ? 0 : errno;
    if (!there && !S_ISDIR(sb.st_mode))
        return base_error(SPMD_ERR_IO, "%s: %s is not a directory", what, dir);
    if (there == ENOTDIR)
        return base_error(SPMD_ERR_IO, "%s: cannot create directory %s: it would lie under a "
                          "file, not a directory", what, dir);
    if (ckpt_path_in_checkpoint(real, NULL, 0, true, ckpt))
        return base_error(SPMD_ERR_INVALID, "%s: %s lies inside the checkpoint %s: a save there "
                          "would mix its files into that checkpoint's", what, dir, ckpt);
    return SPMD_OK;
}
