/*
 * The `spmd` tool's messages: every error and refusal is one line on
 * stderr, "spmd: <message>" ("spmd: process R: <message>" over several
 * processes).  The bottom of the tool's modules: every other one uses it.
 */
#ifndef SPMD_TOOLS_MESSAGE_H
#define SPMD_TOOLS_MESSAGE_H

#include <stddef.h>

/* The message on stderr; returns 2 (usage error). */
int cli_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Bytes as the tool shows them ("6.5 KiB", "384 B"), into buf. */
const char *message_bytes(double bytes, char *buf, size_t size);

/* Over several processes, name this one (`rank`) in every message;
 * -1 for none (one process). */
void message_set_process(int rank);

/* Progress that leaves its line of stdout open (a phase under way) says
 * so; a message then starts on a line of its own.  Closing the line ends
 * it with a newline, if still open. */
void message_open_line(void);
void message_close_line(void);

#endif
