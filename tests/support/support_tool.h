/*
 * Running the spmd tool from the test_cli* tests: its stdout and stderr
 * captured together, and, for runs that would go on for long, a deadline,
 * a text at which to stop it, or a cap on its address space.
 */
#ifndef SPMD_TESTS_SUPPORT_TOOL_H
#define SPMD_TESTS_SUPPORT_TOOL_H

#include <stdarg.h>
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

/* support_run_tool with no limits and its arguments made by vsnprintf. */
int support_run_toolv(const char *tool, char *out, size_t size, const char *fmt, va_list ap);

#ifdef SPMD_TOOL_PATH
/* This build's tool, run to its end. */
static inline int run_tool(const char *args, char *out, size_t size)
{
    return support_run_tool(SPMD_TOOL_PATH, args, NULL, out, size);
}

/* The same with printf-style arguments. */
static inline int run_toolf(char *out, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline int run_toolf(char *out, size_t size, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = support_run_toolv(SPMD_TOOL_PATH, out, size, fmt, ap);
    va_end(ap);
    return rc;
}
#endif

#endif
