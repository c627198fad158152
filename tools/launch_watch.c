/* mpirun run and watched to its end (launch_watch.h). */
#include "launch_watch.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

/* After ending mpirun with SIGTERM, a second SIGTERM this much later
 * (mpirun, already aborting, takes the second as "terminate now"), and
 * SIGKILL later still. */
#define SECOND_TERM_S 2.0
#define KILL_S 5.0

/* What Open MPI's mpirun prints (4.1 and 5.0 alike, from its help texts)
 * when a process calls MPI_Abort and when it loses a host's daemon; the
 * abort's error code follows on a later line: "with errorcode N." (4.1),
 * "Errorcode: N" (5.0). */
static const char ABORTED[] = "MPI_ABORT was invoked";
static const char *const ERROR_CODE[] = {"with errorcode ", "Errorcode: "};
static const char LOST_DAEMON[] = "has lost communication with a remote daemon";

static volatile sig_atomic_t passed; /* a signal passed on to mpirun */
static volatile pid_t mpirun_pid;

/* A signal from a terminal (the kernel's) reached mpirun too, as one of
 * the launcher's process group; one sent by a process to the launcher
 * alone is passed on. */
static void pass_on(int sig, siginfo_t *info, void *ctx)
{
    (void)ctx;
    passed = sig;
    if (mpirun_pid > 0 && info && (info->si_code == SI_USER || info->si_code == SI_QUEUE))
        kill(mpirun_pid, sig);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* What mpirun's standard error has said so far. */
typedef struct job_news {
    char line[1024]; /* the line being read (its start, when longer) */
    size_t len;
    bool aborted, lost_daemon;
    int code; /* the abort's error code; 0: not said */
} job_news;

static void read_line(job_news *j)
{
    j->line[j->len] = '\0';
    if (strstr(j->line, ABORTED)) j->aborted = true;
    if (strstr(j->line, LOST_DAEMON)) j->lost_daemon = true;
    for (size_t i = 0; i < sizeof ERROR_CODE / sizeof *ERROR_CODE && j->aborted && !j->code; i++) {
        const char *at = strstr(j->line, ERROR_CODE[i]);
        if (at) j->code = atoi(at + strlen(ERROR_CODE[i]));
    }
    j->len = 0;
}

static void scan(job_news *j, const char *buf, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (buf[i] == '\n') read_line(j);
        else if (j->len < sizeof j->line - 1) j->line[j->len++] = buf[i];
    }
}

/* Everything readable on fd now, passed to stderr and scanned; false at
 * the end of the pipe. */
static bool relay(int fd, job_news *j)
{
    char buf[4096];
    for (;;) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n == 0) return false;
        if (n < 0) return errno == EAGAIN || errno == EINTR;
        for (ssize_t off = 0; off < n;) {
            ssize_t w = write(STDERR_FILENO, buf + off, (size_t)(n - off));
            if (w < 0 && errno != EINTR) break; /* our stderr is gone: keep reading */
            if (w > 0) off += w;
        }
        scan(j, buf, (size_t)n);
    }
}

static void start(char *const argv[], int err[2], pid_t parent)
{
#ifdef __linux__
    /* The launcher killed outright must not leave the job running. */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
#else
    (void)parent;
#endif
    close(err[0]);
    if (dup2(err[1], STDERR_FILENO) < 0) _exit(127);
    close(err[1]);
    execvp(argv[0], argv);
    dprintf(STDERR_FILENO, "spmd: launch: cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(127);
}

int launch_watch_run(char *const argv[], double abort_wait_s)
{
    int err[2];
    if (pipe2(err, O_CLOEXEC) != 0) {
        fprintf(stderr, "spmd: launch: cannot make a pipe: %s\n", strerror(errno));
        return 127;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t parent = getpid(), pid = fork();
    if (pid < 0) {
        fprintf(stderr, "spmd: launch: cannot start %s: %s\n", argv[0], strerror(errno));
        close(err[0]), close(err[1]);
        return 127;
    }
    if (pid == 0) start(argv, err, parent);
    close(err[1]);
    fcntl(err[0], F_SETFL, O_NONBLOCK);
    mpirun_pid = pid;
    struct sigaction pass = {.sa_sigaction = pass_on, .sa_flags = SA_SIGINFO}, old[4];
    const int sigs[4] = {SIGINT, SIGQUIT, SIGTERM, SIGHUP};
    for (int i = 0; i < 4; i++) sigaction(sigs[i], &pass, &old[i]);

    job_news news = {0};
    bool open = true, ended_by_us = false;
    double ending_since = -1, ended_at = 0;
    int terms = 0, status = 0;
    for (;;) {
        if (open) {
            struct pollfd pf = {.fd = err[0], .events = POLLIN};
            if (poll(&pf, 1, 100) > 0) open = relay(err[0], &news);
        } else {
            struct timespec nap = {0, 100 * 1000 * 1000};
            nanosleep(&nap, NULL);
        }
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid) break;
        if (w < 0 && errno != EINTR) {
            status = 127 << 8;
            break;
        }
        double t = now_s();
        if (ending_since < 0 && (news.aborted || passed)) ending_since = t;
        if (ending_since < 0 || t - ending_since < abort_wait_s) continue;
        if (!ended_by_us) {
            ended_by_us = true;
            ended_at = t;
            fprintf(stderr,
                    "spmd: launch: the job %s %.0f s ago and mpirun has not ended it: it waits for "
                    "a host's daemon it cannot reach (until TCP gives up the connection); ending "
                    "mpirun\n",
                    news.aborted ? "aborted" : "was signalled", t - ending_since);
            kill(pid, SIGTERM);
            terms = 1;
        } else if (terms == 1 && t - ended_at >= SECOND_TERM_S) {
            kill(pid, SIGTERM);
            terms = 2;
        } else if (terms == 2 && t - ended_at >= KILL_S) {
            kill(pid, SIGKILL);
            terms = 3;
        }
    }
    /* What mpirun wrote last (a process it started may hold the pipe
     * open: take only what is there). */
    if (open) relay(err[0], &news);
    if (news.len) read_line(&news);
    close(err[0]);
    mpirun_pid = 0;
    for (int i = 0; i < 4; i++) sigaction(sigs[i], &old[i], NULL);

    int code = news.code > 0 ? news.code : 1;
    if (ended_by_us) return code;
    int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (rc == 0 && (news.aborted || news.lost_daemon)) {
        fprintf(stderr, "spmd: launch: mpirun exited 0 after %s: exit %d\n",
                news.aborted ? "a process called MPI_Abort" : "losing a host's daemon", code);
        return code;
    }
    return rc;
}
