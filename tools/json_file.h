/*
 * JSON files written atomically: a temporary file beside the target,
 * synced, then renamed over it, so a failure leaves any earlier file whole.
 */
#ifndef SPMD_TOOLS_JSON_FILE_H
#define SPMD_TOOLS_JSON_FILE_H

struct cJSON;

/* Writes and frees `root` at `path`, which `flag` gave ("--json") and
 * holds `what` ("the report"), as a failure's message says; over several
 * processes only process 0 writes.  0, or 1 with a message.  (Whether a
 * file can be written there is checked before the run: tools/paths.c.) */
int json_file_write(const char *flag, const char *what, const char *path, struct cJSON *root);

#endif
