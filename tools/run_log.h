/*
 * `spmd train --log FILE.jsonl`: one JSON object a line, appended, each
 * line written whole or not at all.  A line is built in memory and
 * handed to the file in one write; a write that fails part-way (a full
 * disk, a quota, a size limit) is taken back by truncating the file to
 * its last whole line, so a reader never meets a torn line the tool left.
 * A torn last line an earlier run left (a crash of the machine) is
 * removed, with a warning, before the first new line.
 */
#ifndef SPMD_TOOLS_RUN_LOG_H
#define SPMD_TOOLS_RUN_LOG_H

#include <stdio.h>

typedef struct run_log run_log;

/* The log at `path`, opened for appending; NULL with a message. */
run_log *run_log_open(const char *path);
/* A stream for the next line's text (without its newline), or NULL when
 * out of memory; run_log_end writes it. */
FILE *run_log_begin(run_log *l);
/* The line begun, and its newline, written whole; 0, or 1 with a message
 * naming the log and `step` (the run stops: a log with holes would pass
 * for a whole one). */
int run_log_end(run_log *l, int step);
/* Closes the log (NULL: nothing); 0, or 1 with a message. */
int run_log_close(run_log *l);

#endif
