/*
 * Scratch directories and paths for the tests that write files
 * (checkpoints, weights, exports).
 */
#ifndef SPMD_TESTS_SUPPORT_FILES_H
#define SPMD_TESTS_SUPPORT_FILES_H

#include <stddef.h>

/* Room for every path these tests build. */
enum { SUPPORT_PATH = 1024 };

/* A new empty directory /tmp/NAME-XXXXXX (malloc'd; support_drop_dir it). */
char *support_temp_dir(const char *name);
/* Remove the directory and all it holds, and free `dir`. */
void support_drop_dir(char *dir);
/* Entries of `dir` whose names start with `prefix` (temporary files left). */
int support_count_entries(const char *dir, const char *prefix);
/* "DIR/NAME" in buf (SUPPORT_PATH bytes); returns buf. */
const char *support_path_in(char *buf, const char *dir, const char *name);
/* The whole file `path`, NUL-terminated (malloc'd); its size in *len.
 * A file that cannot be read fails the test, naming it. */
char *support_read_file(const char *path, size_t *len);

#endif
