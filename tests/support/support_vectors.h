/*
 * Reader for reference test vectors (tests/vectors/<case>.bin, written by
 * tests/vectors/make_vectors.py, which documents the format): named f32 or
 * i32 arrays with their shapes.
 */
#ifndef SPMD_TESTS_SUPPORT_VECTORS_H
#define SPMD_TESTS_SUPPORT_VECTORS_H

#include <stddef.h>
#include <stdint.h>

#define TV_MAX_RANK 8

typedef enum tv_dtype { TV_F32 = 0, TV_I32 = 1 } tv_dtype;

typedef struct tv_record {
    const char *name;  /* NUL-terminated copy */
    tv_dtype dtype;
    int rank;
    int64_t dims[TV_MAX_RANK];
    int64_t numel;
    const void *data;  /* numel floats or int32s, native byte order */
    size_t bytes;
} tv_record;

typedef struct tv_file {
    int count;
    tv_record *records;
    void *storage; /* one block behind all names and data */
} tv_file;

/* Load `path` into `f`.  Returns 0, or -1 with a message naming the file
 * and the problem (bad magic, truncation, bad dtype, ...) in err. */
int tv_load(const char *path, tv_file *f, char *err, size_t err_size);
/* Parse an in-memory image; the same checks as tv_load. */
int tv_parse(const void *bytes, size_t size, tv_file *f, char *err, size_t err_size);
/* Load <tv_dir()>/<name>.bin, or fail the running cmocka test with tv_load's
 * message. */
void tv_load_case(const char *name, tv_file *f);
/* The record called `name`, or NULL. */
const tv_record *tv_find(const tv_file *f, const char *name);
void tv_free(tv_file *f);

/* Where the .bin files are: $SPMD_VECTOR_DIR, else the compile-time
 * SPMD_VECTOR_DIR, else "tests/vectors". */
const char *tv_dir(void);

#endif
