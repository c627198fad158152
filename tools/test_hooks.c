/* The tests' hooks (see test_hooks.h): read only by spmd-test. */
#include "test_hooks.h"

#ifdef SPMD_TOOL_TEST_HOOKS

#include "processes.h"

#include "train/checkpoint_hook.h"

#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

bool test_hooks_bad_token(int step)
{
    const char *hook = getenv("SPMD_TEST_BAD_TOKEN");
    int proc = -1, at = -1;
    if (!hook || sscanf(hook, "%d:%d", &proc, &at) != 2) return false;
    return proc == processes_rank() && at == step + 1;
}

void test_hooks_phase(const char *fmt, ...)
{
    const char *file = getenv("SPMD_TEST_PHASES"), *stop = getenv("SPMD_TEST_PHASE_STOP");
    if (!file && !stop) return;
    char phase[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(phase, sizeof phase, fmt, ap);
    va_end(ap);
    if (file) {
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        char line[384];
        int n = snprintf(line, sizeof line, "P%d %ld %ld.%09ld %s\n", processes_rank(),
                         (long)getpid(), (long)t.tv_sec, t.tv_nsec, phase);
        int fd = open(file, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
        if (fd >= 0 && n > 0) {
            if (write(fd, line, (size_t)n) != n) {} /* a test's record: nothing to do */
            close(fd);
        }
    }
    const char *colon = stop ? strchr(stop, ':') : NULL;
    if (colon && atoi(stop) == processes_rank() && !strcmp(colon + 1, phase)) raise(SIGSTOP);
}

void test_hooks_step_begin(int step)
{
    test_hooks_phase("step %d", step + 1);
    const char *stop = getenv("SPMD_TEST_STOP"), *delay = getenv("SPMD_TEST_DELAY");
    int proc = -1, at = -1;
    double seconds = 0;
    if (stop && sscanf(stop, "%d:%d", &proc, &at) == 2 && proc == processes_rank() &&
        at == step + 1) {
        fprintf(stderr, "spmd: test: process %d stops at step %d\n", proc, at);
        fflush(stderr);
        raise(SIGSTOP);
    }
    if (delay && sscanf(delay, "%d:%lf", &proc, &seconds) == 2 && proc == processes_rank() &&
        seconds > 0) {
        struct timespec nap = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
        while (nanosleep(&nap, &nap) != 0) {}
    }
}

void test_hooks_network_round(int round, double latency_s, double bytes_per_s)
{
    if (!getenv("SPMD_TEST_NET_ROUNDS")) return;
    fprintf(stderr, "spmd: test: network round %d: %.1f us per message, %.2f GB/s\n", round,
            latency_s * 1e6, bytes_per_s / 1e9);
}

typedef struct pause_at {
    long step;
    const char *stage;
} pause_at;

static pause_at armed;

static bool pause_hook(void *ctx, const char *stage)
{
    const pause_at *at = ctx;
    test_hooks_phase("save %ld %s", at->step, stage);
    if (!at->stage || strcmp(stage, at->stage)) return true;
    fprintf(stderr, "spmd: test: save of step %ld paused after %s\n", at->step, stage);
    fflush(stderr);
    for (;;) pause();
}

void test_hooks_save_begin(int step)
{
    test_hooks_phase("save %d", step);
    const char *test = getenv("SPMD_TEST_SAVE_PAUSE");
    const char *colon = test ? strchr(test, ':') : NULL;
    bool pause = colon && atol(test) == step;
    if (!pause && !getenv("SPMD_TEST_PHASES") && !getenv("SPMD_TEST_PHASE_STOP")) return;
    armed = (pause_at){step, pause ? colon + 1 : NULL};
    checkpoint_set_hook(pause_hook, &armed);
}

void test_hooks_save_end(void)
{
    checkpoint_set_hook(NULL, NULL);
    if (armed.step) test_hooks_phase("saved %ld", armed.step);
    armed.step = 0;
}

size_t test_hooks_shard_tokens(size_t max)
{
    const char *hook = getenv("SPMD_TEST_SHARD_TOKENS");
    long n = hook ? atol(hook) : 0;
    return n > 0 && (size_t)n < max ? (size_t)n : max;
}

double test_hooks_free_bytes(double real)
{
    const char *hook = getenv("SPMD_TEST_FREE_BYTES");
    return hook ? atof(hook) : real;
}

#else

bool test_hooks_bad_token(int step)
{
    (void)step;
    return false;
}

void test_hooks_step_begin(int step) { (void)step; }
void test_hooks_network_round(int round, double latency_s, double bytes_per_s)
{
    (void)round, (void)latency_s, (void)bytes_per_s;
}
void test_hooks_save_begin(int step) { (void)step; }
void test_hooks_save_end(void) {}
size_t test_hooks_shard_tokens(size_t max) { return max; }
double test_hooks_free_bytes(double real) { return real; }
void test_hooks_phase(const char *fmt, ...) { (void)fmt; }

#endif
