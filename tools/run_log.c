/* `spmd train --log` (see run_log.h). */
#include "run_log.h"

#include "message.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct run_log {
    const char *path;
    int fd;
    off_t whole;    /* the file's bytes up to its last whole line */
    char *line;     /* the line being built (open_memstream's buffer) */
    size_t len;
    FILE *building; /* NULL between lines */
};

/* Where the file's last whole line ends: after its last newline, 0 for
 * none; -1 with errno when it cannot be read. */
static off_t last_line_end(int fd, off_t size)
{
    char buf[4096];
    for (off_t end = size; end > 0;) {
        off_t from = end > (off_t)sizeof buf ? end - (off_t)sizeof buf : 0;
        ssize_t got = pread(fd, buf, (size_t)(end - from), from);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return got < 0 ? -1 : (errno = EIO, -1);
        for (ssize_t i = got; i > 0; i--)
            if (buf[i - 1] == '\n') return from + i;
        end = from;
    }
    return 0;
}

run_log *run_log_open(const char *path)
{
    run_log *l = calloc(1, sizeof *l);
    if (!l) {
        cli_fail("--log %s: out of memory", path);
        return NULL;
    }
    l->path = path;
    l->fd = open(path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    struct stat st;
    if (l->fd < 0 || fstat(l->fd, &st) != 0) {
        cli_fail("--log %s: cannot open it for appending: %s", path, strerror(errno));
        if (l->fd >= 0) close(l->fd);
        free(l);
        return NULL;
    }
    off_t whole = st.st_size > 0 ? last_line_end(l->fd, st.st_size) : 0;
    if (whole < 0 || (whole < st.st_size && ftruncate(l->fd, whole) != 0)) {
        cli_fail("--log %s: cannot take back its torn last line: %s", path, strerror(errno));
        close(l->fd);
        free(l);
        return NULL;
    }
    if (whole < st.st_size)
        fprintf(stderr, "spmd: warning: --log %s: removed its torn last line (%lld bytes without "
                        "a newline, a write an earlier run did not finish)\n",
                path, (long long)(st.st_size - whole));
    l->whole = whole;
    return l;
}

FILE *run_log_begin(run_log *l)
{
    if (l->building) fclose(l->building);
    free(l->line);
    l->line = NULL, l->len = 0;
    l->building = open_memstream(&l->line, &l->len);
    return l->building;
}

int run_log_end(run_log *l, int step)
{
    bool built = l->building && fputc('\n', l->building) != EOF && !ferror(l->building);
    if (l->building && fclose(l->building) != 0) built = false;
    l->building = NULL;
    if (!built) return cli_fail("--log %s: out of memory for the line of step %d; the run stops",
                                l->path, step), 1;
    size_t done = 0;
    int err = 0;
    while (done < l->len) {
        ssize_t n = write(l->fd, l->line + done, l->len - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            err = n < 0 ? errno : EIO;
            break;
        }
        done += (size_t)n;
    }
    if (!err) {
        l->whole += (off_t)done;
        return 0;
    }
    /* Take back the part written: the log keeps its whole lines. */
    if (done > 0 && ftruncate(l->fd, l->whole) != 0) {
        cli_fail("--log %s: cannot write the line of step %d: %s, and cannot take back the part "
                 "written: %s; the run stops", l->path, step, strerror(err), strerror(errno));
        return 1;
    }
    cli_fail("--log %s: cannot write the line of step %d: %s; the run stops (the log keeps the "
             "lines before it)", l->path, step, strerror(err));
    return 1;
}

int run_log_close(run_log *l)
{
    if (!l) return 0;
    if (l->building) fclose(l->building);
    free(l->line);
    int rc = close(l->fd) != 0 ? (cli_fail("--log %s: %s", l->path, strerror(errno)), 1) : 0;
    free(l);
    return rc;
}
