/*
 * The safetensors file format (Hugging Face), as checkpoints write and
 * read it: an 8-byte little-endian header length N, N bytes of JSON
 *     {name: {"dtype": "F32", "shape": [d0, ...], "data_offsets": [b, e]}, ...}
 * padded with spaces so that the data starts 8-byte aligned, then the
 * data, raw little-endian, row-major.  Offsets count from the start of the
 * data; every data byte belongs to exactly one tensor.  A header may also
 * hold "__metadata__" (string to string), which readers skip.
 */
#ifndef SPMD_TRAIN_SAFETENSORS_H
#define SPMD_TRAIN_SAFETENSORS_H

#include <stdbool.h>
#include <stdint.h>

#include "spmd/spmd.h"

/* The reference reader refuses larger headers. */
#define ST_MAX_HEADER (100u << 20)

typedef struct st_entry {
    const char *name;
    spmd_dtype dtype;
    int rank;
    int64_t shape[SPMD_MAX_RANK];
    uint64_t begin, end; /* bytes, from the start of the data */
} st_entry;

/* "F32", "I32"; NULL for a dtype the format has no name for here. */
const char *st_dtype_name(spmd_dtype dtype);
/* Whether this host stores numbers little-endian, as the files do. */
bool st_host_little_endian(void);
/* A JSON number that is a whole count in [0, 2^53] (exact as a double). */
struct cJSON;
bool st_json_count(const struct cJSON *item, int64_t *out);
/* obj[key] = [v0, ...] as JSON numbers; false when out of memory. */
bool st_json_add_counts(struct cJSON *obj, const char *key, int n, const int64_t *v);

/* The header of a file holding `n` entries laid out one after another in
 * that order: sets each entry's begin and end, and returns the header
 * (length word, JSON, padding) in *out, allocated from `alloc`, with its
 * size in *size.  The data is then *data_bytes long. */
spmd_status st_header_build(const spmd_allocator *alloc, st_entry *entries, int n,
                            unsigned char **out, size_t *size, uint64_t *data_bytes);

/* A file's parsed header. */
typedef struct st_header {
    int n;
    st_entry *entries;   /* header order */
    uint64_t data_start; /* file offset of the data: 8 + N */
    uint64_t data_bytes;
    char *names; /* the entries' names */
} st_header;

/* Read and check the header of the open file `fd` of `file_bytes` bytes,
 * named `path` in messages: the length against the file, the JSON, each
 * entry's dtype (F32 or I32), shape and offsets, and that the entries
 * tile the data without gap or overlap. */
spmd_status st_header_read(const spmd_allocator *alloc, int fd, uint64_t file_bytes,
                           const char *path, st_header *out);
void st_header_free(const spmd_allocator *alloc, st_header *h);
/* The entry called `name`, or NULL. */
const st_entry *st_header_find(const st_header *h, const char *name);

#endif
