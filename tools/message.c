/* The tool's messages (see message.h). */
#include "message.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

static int process_rank = -1;
static bool line_open;

const char *message_bytes(double bytes, char *buf, size_t size)
{
    const char *unit[] = {"B", "KiB", "MiB", "GiB"};
    int u = 0;
    while (bytes >= 1024 && u < 3) bytes /= 1024, u++;
    snprintf(buf, size, u ? "%.1f %s" : "%.0f %s", bytes, unit[u]);
    return buf;
}

void message_set_process(int rank) { process_rank = rank; }

void message_open_line(void) { line_open = true; }

void message_close_line(void)
{
    if (line_open) fputc('\n', stdout);
    line_open = false;
}

int cli_fail(const char *fmt, ...)
{
    message_close_line();
    fflush(stdout); /* what came before, first, where both go to one file */
    /* One write per message: under mpirun other processes' output must not
     * land inside it.  Over several processes every one prints its errors:
     * say whose. */
    char line[4096];
    size_t n = process_rank >= 0
                   ? (size_t)snprintf(line, sizeof line, "spmd: process %d: ", process_rank)
                   : (size_t)snprintf(line, sizeof line, "spmd: ");
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(line + n, sizeof line - n - 1, fmt, ap);
    va_end(ap);
    if (len >= 0 && (size_t)len >= sizeof line - n - 1) {
        /* A long value in the message (a 100 KB --prompt): cut, saying so. */
        char tail[64];
        int t = snprintf(tail, sizeof tail, "... (message cut: %zu bytes in all)", n + (size_t)len);
        memcpy(line + sizeof line - 2 - t, tail, (size_t)t + 1);
    }
    strcat(line, "\n");
    fputs(line, stderr);
    fflush(stderr);
    return 2;
}
