/*
 * Running the spmd tool from the test_cli* tests: its stdout and stderr
 * captured together, and, for runs that would go on for long, a deadline,
 * a text at which to stop it, or a cap on its address space.
 */
#ifndef SPMD_TESTS_SUPPORT_TOOL_H
#define SPMD_TESTS_SUPPORT_TOOL_H

#include <stddef.h>

typedef struct tool_limits {
    const char *stop_at;      /* kill the tool once its output holds this; NULL: never */
    int stop_signal;          /* at stop_at, send this signal instead (once) and let it end */
    int timeout_s;            /* kill it after this many seconds; 0: never */
    size_t max_address_space; /* its RLIMIT_AS in bytes; 0: none */
} tool_limits;

/* What support_run_tool returns for a run that did not exit by itself. */
enum { TOOL_SIGNALLED = -1, TOOL_STOPPED = -2, TOOL_TIMED_OUT = -3 };

/* Runs the binary `tool` with `args` (shell words, as typed after the
 * program name); `limits` may be NULL.  The output goes to out, cut at
 * size - 1 bytes and NUL-terminated.  Returns the exit status, or
 * TOOL_SIGNALLED, TOOL_STOPPED, TOOL_TIMED_OUT. */
int support_run_tool(const char *tool, const char *args, const tool_limits *limits, char *out,
                     size_t size);

#ifdef SPMD_TOOL_PATH
/* This build's tool, run to its end. */
static inline int run_tool(const char *args, char *out, size_t size)
{
    return support_run_tool(SPMD_TOOL_PATH, args, NULL, out, size);
}
#endif

#endif
