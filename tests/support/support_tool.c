/* Running the spmd tool from a test (see support_tool.h). */
#include "support_tool.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* The child: output into the pipe, the limit set, then the shell, which
 * execs the tool so that the pid we hold is the tool's. */
static void start_tool(const char *cmd, int pipe_out, const tool_limits *limits)
{
    dup2(pipe_out, STDOUT_FILENO);
    dup2(pipe_out, STDERR_FILENO);
    close(pipe_out);
    if (limits->max_address_space) {
        struct rlimit r = {limits->max_address_space, limits->max_address_space};
        setrlimit(RLIMIT_AS, &r);
    }
    execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
    _exit(127);
}

int support_run_tool(const char *tool, const char *args, const tool_limits *limits, char *out,
                     size_t size)
{
    static const tool_limits none;
    if (!limits) limits = &none;
    assert_true(size > 0);
    char cmd[4096];
    int n = snprintf(cmd, sizeof cmd, "exec '%s' %s", tool, args);
    assert_true(n > 0 && (size_t)n < sizeof cmd);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    fflush(NULL); /* nothing buffered here gets written twice */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        start_tool(cmd, fds[1], limits);
    }
    close(fds[1]);
    size_t len = 0;
    out[0] = '\0';
    bool stopped = false, timed_out = false, signalled = false;
    double deadline = limits->timeout_s ? now_s() + limits->timeout_s : 0;
    for (;;) {
        int wait_ms = -1;
        if (deadline) {
            double left = deadline - now_s();
            if (left <= 0) {
                timed_out = true;
                break;
            }
            wait_ms = (int)(left * 1e3) + 1;
        }
        struct pollfd pfd = {.fd = fds[0], .events = POLLIN};
        int ready = poll(&pfd, 1, wait_ms);
        if (ready < 0 && errno == EINTR) continue;
        assert_true(ready >= 0);
        if (ready == 0) continue; /* the deadline check above ends it */
        char buf[4096];
        ssize_t got = read(fds[0], buf, sizeof buf);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break; /* the tool is done */
        /* Past a full buffer, output is read and dropped, so the tool never
         * blocks on a full pipe. */
        size_t keep = (size_t)got < size - 1 - len ? (size_t)got : size - 1 - len;
        memcpy(out + len, buf, keep);
        len += keep;
        out[len] = '\0';
        if (limits->stop_at && !signalled && strstr(out, limits->stop_at)) {
            if (limits->stop_signal) {
                kill(pid, limits->stop_signal); /* and read on to its end */
                signalled = true;
                continue;
            }
            stopped = true;
            break;
        }
    }
    if (stopped || timed_out) kill(pid, SIGKILL);
    close(fds[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0) assert_int_equal(errno, EINTR);
    if (stopped) return TOOL_STOPPED;
    if (timed_out) return TOOL_TIMED_OUT;
    return WIFEXITED(status) ? WEXITSTATUS(status) : TOOL_SIGNALLED;
}

int support_run_toolv(const char *tool, char *out, size_t size, const char *fmt, va_list ap)
{
    char args[8192];
    int n = vsnprintf(args, sizeof args, fmt, ap);
    assert_true(n >= 0 && (size_t)n < sizeof args);
    return support_run_tool(tool, args, NULL, out, size);
}
