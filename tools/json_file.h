/*
 * JSON files written atomically: a temporary file beside the target,
 * synced, then renamed over it, so a failure leaves any earlier file whole.
 */
#ifndef SPMD_TOOLS_JSON_FILE_H
#define SPMD_TOOLS_JSON_FILE_H

struct cJSON;

/* Refuse (message, exit code 2) a --json path no report could be written
 * to: a directory, a device, a place where no file can be created. */
int json_file_check_path(const char *path);
/* Writes and frees `root`; over several processes only process 0 writes.
 * 0, or 1 with a message. */
int json_file_write(const char *path, struct cJSON *root);

#endif
