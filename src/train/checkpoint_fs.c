/*
 * Files and directories for checkpoints (train/checkpoint_fs.h).  POSIX
 * calls only; durability comes from fsync on each file and on the
 * directory that names it, since a rename is only as durable as its
 * directory.
 */
#include "train/checkpoint_fs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "base/arena.h"
#include "base/error.h"
#include "runtime/pool.h"
#include "train/checkpoint.h"

spmd_status ckpt_join(char *buf, const char *dir, const char *name, const char *what)
{
    int n = snprintf(buf, CKPT_PATH_MAX, "%s/%s", dir, name);
    if (n < 0 || n >= CKPT_PATH_MAX)
        return base_error(SPMD_ERR_INVALID, "%s: path %s/%s is longer than %d bytes", what, dir,
                          name, CKPT_PATH_MAX - 1);
    return SPMD_OK;
}

spmd_status ckpt_write_all(int fd, const void *buf, size_t n, const char *path, const char *what)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0)
            return base_error(SPMD_ERR_IO, "%s: cannot write %s: %s", what, path,
                              w < 0 ? strerror(errno) : "no progress");
        p += w;
        n -= (size_t)w;
    }
    return SPMD_OK;
}

spmd_status ckpt_pread_all(int fd, void *buf, size_t n, uint64_t off, const char *path,
                           const char *what)
{
    char *p = buf;
    while (n > 0) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0)
            return base_error(SPMD_ERR_IO, "%s: cannot read %s: %s", what, path, strerror(errno));
        if (r == 0)
            return base_error(SPMD_ERR_IO, "%s: %s ends at byte %llu, %zu bytes short", what, path,
                              (unsigned long long)off, n);
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return SPMD_OK;
}

spmd_status ckpt_mkdirs(const char *path, const char *what)
{
    char buf[CKPT_PATH_MAX];
    if (!path[0]) return base_error(SPMD_ERR_INVALID, "%s: the directory name is empty", what);
    if (strlen(path) >= sizeof buf)
        return base_error(SPMD_ERR_INVALID, "%s: path %s is too long", what, path);
    strcpy(buf, path);
    /* Each prefix ending before a '/', then the whole path. */
    for (char *s = buf + 1;; s++) {
        if (*s != '/' && *s != '\0') continue;
        char c = *s;
        *s = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST)
            return base_error(SPMD_ERR_IO, "%s: cannot create directory %s: %s", what, buf,
                              strerror(errno));
        *s = c;
        if (!c) break;
    }
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return base_error(SPMD_ERR_IO, "%s: %s is not a directory", what, path);
    return SPMD_OK;
}

spmd_status ckpt_fsync_dir(const char *path, const char *what)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return base_error(SPMD_ERR_IO, "%s: cannot open %s: %s", what, path, strerror(errno));
    int rc = fsync(fd);
    int err = errno;
    close(fd);
    /* Some file systems cannot sync a directory; their renames are as
     * durable as they get. */
    if (rc != 0 && err != EINVAL && err != ENOTSUP)
        return base_error(SPMD_ERR_IO, "%s: cannot sync %s: %s", what, path, strerror(err));
    return SPMD_OK;
}

spmd_status ckpt_remove_tree(const char *path, const char *what)
{
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT) return SPMD_OK;
        return base_error(SPMD_ERR_IO, "%s: cannot remove %s: %s", what, path, strerror(errno));
    }
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        if (!d)
            return base_error(SPMD_ERR_IO, "%s: cannot open %s: %s", what, path, strerror(errno));
        struct dirent *e;
        spmd_status ok = SPMD_OK;
        while (ok == SPMD_OK && (e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char sub[CKPT_PATH_MAX];
            ok = ckpt_join(sub, path, e->d_name, what);
            if (ok == SPMD_OK) ok = ckpt_remove_tree(sub, what);
        }
        closedir(d);
        if (ok != SPMD_OK) return ok;
        if (rmdir(path) != 0)
            return base_error(SPMD_ERR_IO, "%s: cannot remove %s: %s", what, path, strerror(errno));
        return SPMD_OK;
    }
    if (unlink(path) != 0 && errno != ENOENT)
        return base_error(SPMD_ERR_IO, "%s: cannot remove %s: %s", what, path, strerror(errno));
    return SPMD_OK;
}

bool ckpt_exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

int ckpt_open_input(const char *path)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return -1;
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    return fd;
}

int ckpt_open_regular(const char *path, const char **why)
{
    *why = NULL;
    int fd = ckpt_open_input(path);
    struct stat st;
    if (fd < 0) return -1;
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        errno = err;
        return -1;
    }
    if (S_ISREG(st.st_mode)) return fd;
    close(fd);
    *why = ckpt_not_regular(st.st_mode);
    errno = EINVAL;
    return -1;
}

const char *ckpt_not_regular(unsigned mode)
{
    if (S_ISREG(mode)) return NULL;
    return S_ISDIR(mode)    ? "a directory, not a regular file"
           : S_ISFIFO(mode) ? "a FIFO, not a regular file"
           : S_ISSOCK(mode) ? "a socket, not a regular file"
                            : "a device, not a regular file";
}

/* The holder a lock file names, "process 123 on host": what it wrote,
 * else the pid fcntl reports. */
static void lock_holder(int fd, char *buf, size_t size)
{
    char text[160] = "";
    ssize_t n = pread(fd, text, sizeof text - 1, 0);
    text[n > 0 ? n : 0] = '\0';
    long pid = 0;
    char host[128] = "";
    if (sscanf(text, "%ld %127s", &pid, host) >= 1 && pid > 0) {
        snprintf(buf, size, "process %ld%s%s", pid, host[0] ? " on " : "", host);
        return;
    }
    struct flock q = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    if (fcntl(fd, F_GETLK, &q) == 0 && q.l_type != F_UNLCK && q.l_pid > 0)
        snprintf(buf, size, "process %ld", (long)q.l_pid);
    else
        snprintf(buf, size, "another process");
}

/* The checkpoint directories whose lock this process holds, by the
 * directory's device and inode, and how many hold each.  A child made by
 * fork inherits the table but none of the locks: entries of another
 * process are not its own. */
typedef struct held_lock {
    dev_t dev;
    ino_t ino;
    pid_t pid;
    int fd, holders;
} held_lock;
enum { MAX_HELD = 64 };
static held_lock held[MAX_HELD];
static int n_held;
static pthread_mutex_t held_mutex = PTHREAD_MUTEX_INITIALIZER;

static spmd_status lock_file(const char *dir, int *out, const char *what);

spmd_status ckpt_lock_dir(const char *dir, int *out, const char *what)
{
    *out = -1;
    struct stat ds;
    if (stat(dir, &ds) != 0)
        return base_error(SPMD_ERR_IO, "%s: cannot lock %s: %s", what, dir, strerror(errno));
    pthread_mutex_lock(&held_mutex);
    pid_t me = getpid();
    for (int i = 0; i < n_held;) /* a parent's, before a fork */
        if (held[i].pid != me) {
            close(held[i].fd);
            held[i] = held[--n_held];
        } else {
            i++;
        }
    for (int i = 0; i < n_held; i++)
        if (held[i].dev == ds.st_dev && held[i].ino == ds.st_ino) {
            held[i].holders++;
            *out = held[i].fd;
            pthread_mutex_unlock(&held_mutex);
            return SPMD_OK;
        }
    spmd_status st = n_held < MAX_HELD ? lock_file(dir, out, what)
                                       : base_error(SPMD_ERR_IO, "%s: cannot lock %s: this process "
                                                    "holds %d locks already", what, dir, MAX_HELD);
    if (st == SPMD_OK && *out >= 0) held[n_held++] = (held_lock){ds.st_dev, ds.st_ino, me, *out, 1};
    pthread_mutex_unlock(&held_mutex);
    return st;
}

void ckpt_unlock_dir(int fd)
{
    if (fd < 0) return;
    pthread_mutex_lock(&held_mutex);
    for (int i = 0; i < n_held; i++) {
        if (held[i].fd != fd || held[i].pid != getpid()) continue;
        if (--held[i].holders == 0) {
            close(fd);
            held[i] = held[--n_held];
        }
        break;
    }
    pthread_mutex_unlock(&held_mutex);
}

/* DIR/.lock opened and locked (ckpt_lock_dir), for a directory this
 * process does not hold yet. */
static spmd_status lock_file(const char *dir, int *out, const char *what)
{
    char path[CKPT_PATH_MAX];
    *out = -1;
    spmd_status st = ckpt_join(path, dir, CKPT_LOCK, what);
    if (st != SPMD_OK) return st;
    int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
    if (fd < 0)
        return base_error(SPMD_ERR_IO, "%s: cannot create the lock %s: %s", what, path,
                          strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return base_error(SPMD_ERR_IO, "%s: the lock %s is not a regular file", what, path);
    }
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    if (fcntl(fd, F_SETLK, &fl) != 0) {
        int err = errno;
        if (err == ENOLCK || err == ENOTSUP || err == EINVAL) {
            close(fd); /* a file system without locks: writers are not kept apart */
            return SPMD_OK;
        }
        char holder[192];
        lock_holder(fd, holder, sizeof holder);
        close(fd);
        if (err == EACCES || err == EAGAIN)
            return base_error(SPMD_ERR_IO,
                              "%s: %s is in use: %s is writing checkpoints there (its lock %s); "
                              "two runs saving into one directory would mix their steps",
                              what, dir, holder, path);
        return base_error(SPMD_ERR_IO, "%s: cannot lock %s: %s", what, path, strerror(err));
    }
    char host[128] = "", text[192];
    gethostname(host, sizeof host - 1);
    int n = snprintf(text, sizeof text, "%ld %s\n", (long)getpid(), host[0] ? host : "-");
    if (ftruncate(fd, 0) != 0 || pwrite(fd, text, (size_t)n, 0) != n) {
        int err = errno;
        close(fd);
        return base_error(SPMD_ERR_IO, "%s: cannot write the lock %s: %s", what, path,
                          strerror(err));
    }
    *out = fd;
    return SPMD_OK;
}

spmd_status ckpt_remove_temporaries(const char *dir, int *removed, const char *what)
{
    *removed = 0;
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return SPMD_OK;
        return base_error(SPMD_ERR_IO, "%s: cannot list %s: %s", what, dir, strerror(errno));
    }
    /* ckpt_replace_file's temporary of `latest`, from a save killed as it
     * wrote it. */
    static const char latest_tmp[] = "." CKPT_LATEST ".tmp-";
    spmd_status st = SPMD_OK;
    for (struct dirent *e; st == SPMD_OK && (e = readdir(d));) {
        if (strncmp(e->d_name, ".tmp-step-", 10) && strncmp(e->d_name, ".del-step-", 10) &&
            strncmp(e->d_name, latest_tmp, sizeof latest_tmp - 1))
            continue;
        char path[CKPT_PATH_MAX];
        st = ckpt_join(path, dir, e->d_name, what);
        if (st == SPMD_OK) st = ckpt_remove_tree(path, what);
        if (st == SPMD_OK) ++*removed;
    }
    closedir(d);
    return st;
}

spmd_status ckpt_read_file(const spmd_allocator *alloc, const char *path, size_t max, char **out,
                           size_t *len, const char *what)
{
    *out = NULL;
    int fd = ckpt_open_input(path);
    if (fd < 0)
        return base_error(SPMD_ERR_IO, "%s: cannot open %s: %s", what, path, strerror(errno));
    struct stat st;
    spmd_status ok = SPMD_OK;
    if (fstat(fd, &st) != 0) {
        ok = base_error(SPMD_ERR_IO, "%s: cannot stat %s: %s", what, path, strerror(errno));
    } else if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size > max) {
        ok = base_error(SPMD_ERR_IO, "%s: %s is not a regular file of at most %zu bytes", what,
                        path, max);
    } else {
        size_t n = (size_t)st.st_size;
        char *buf = base_alloc(alloc, n + 1, path);
        if (!buf) ok = SPMD_ERR_NOMEM;
        if (buf && (ok = ckpt_pread_all(fd, buf, n, 0, path, what)) == SPMD_OK) {
            buf[n] = '\0';
            *out = buf;
            *len = n;
        } else {
            base_free(alloc, buf);
        }
    }
    close(fd);
    return ok;
}

spmd_status ckpt_replace_file(const char *dir, const char *name, const void *data, size_t n,
                              const char *what)
{
    char path[CKPT_PATH_MAX], tmp_name[256], tmp[CKPT_PATH_MAX];
    snprintf(tmp_name, sizeof tmp_name, ".%s.tmp-%ld", name, (long)getpid());
    spmd_status ok = ckpt_join(path, dir, name, what);
    if (ok == SPMD_OK) ok = ckpt_join(tmp, dir, tmp_name, what);
    if (ok != SPMD_OK) return ok;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return base_error(SPMD_ERR_IO, "%s: cannot create %s: %s", what, tmp, strerror(errno));
    ok = ckpt_write_all(fd, data, n, tmp, what);
    if (ok == SPMD_OK && fsync(fd) != 0)
        ok = base_error(SPMD_ERR_IO, "%s: cannot sync %s: %s", what, tmp, strerror(errno));
    if (close(fd) != 0 && ok == SPMD_OK)
        ok = base_error(SPMD_ERR_IO, "%s: cannot close %s: %s", what, tmp, strerror(errno));
    if (ok == SPMD_OK && rename(tmp, path) != 0)
        ok = base_error(SPMD_ERR_IO, "%s: cannot rename %s to %s: %s", what, tmp, path,
                        strerror(errno));
    if (ok != SPMD_OK) {
        unlink(tmp);
        return ok;
    }
    return ckpt_fsync_dir(dir, what);
}

uint32_t ckpt_crc32(uint32_t crc, const void *buf, size_t n)
{
    const unsigned char *p = buf;
    /* zlib takes lengths as uInt. */
    while (n > 0) {
        uInt chunk = n > (1u << 30) ? (1u << 30) : (uInt)n;
        crc = (uint32_t)crc32(crc, p, chunk);
        p += chunk;
        n -= chunk;
    }
    return crc;
}

uint32_t ckpt_crc32_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b)
{
    return (uint32_t)crc32_combine(crc_a, crc_b, (z_off_t)len_b);
}

/* ---- Threads ------------------------------------------------------------------------ */

void ckpt_workers_start(ckpt_workers *w, const spmd_allocator *alloc, int want)
{
    w->pool = NULL;
    w->n = 1;
    atomic_init(&w->stop, 0);
    if (want > 1 && (w->pool = rt_pool_create(want, alloc)) != NULL) w->n = want;
}

void ckpt_workers_stop(ckpt_workers *w)
{
    rt_pool_free(w->pool);
    w->pool = NULL;
    w->n = 1;
}

typedef struct run_state {
    ckpt_workers *w;
    int n_jobs;
    ckpt_job_fn fn;
    void *ctx;
    atomic_int next;
    pthread_mutex_t lock;
    spmd_status st; /* the first failure */
    char message[1024];
} run_state;

static void run_jobs(void *arg, int ith, int nth)
{
    (void)nth;
    run_state *r = arg;
    while (!atomic_load(&r->w->stop)) {
        int job = atomic_fetch_add(&r->next, 1);
        if (job >= r->n_jobs) break;
        spmd_status st = r->fn(r->ctx, job, ith);
        if (st == SPMD_OK) continue;
        pthread_mutex_lock(&r->lock);
        if (r->st == SPMD_OK) {
            r->st = st;
            snprintf(r->message, sizeof r->message, "%s", spmd_last_error());
        }
        atomic_store(&r->w->stop, 1);
        pthread_mutex_unlock(&r->lock);
        break;
    }
}

spmd_status ckpt_workers_run(ckpt_workers *w, int n_jobs, ckpt_job_fn fn, void *ctx)
{
    run_state r = {
        .w = w, .n_jobs = n_jobs, .fn = fn, .ctx = ctx, .lock = PTHREAD_MUTEX_INITIALIZER};
    atomic_init(&r.next, 0);
    atomic_store(&w->stop, 0);
    if (w->pool && n_jobs > 1)
        rt_pool_run(w->pool, run_jobs, &r);
    else
        run_jobs(&r, 0, 1);
    if (r.st != SPMD_OK) return base_error(r.st, "%s", r.message);
    return SPMD_OK;
}

bool ckpt_workers_stopping(ckpt_workers *w)
{
    return atomic_load_explicit(&w->stop, memory_order_relaxed) != 0;
}
