/*
 * The safetensors format (train/safetensors.h): building a header for
 * entries laid out in order, and reading one back with the checks the
 * reference reader makes, so that a file that passes here opens there.
 */
#include "train/safetensors.h"

#include <cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/arena.h"
#include "base/error.h"
#include "train/checkpoint_fs.h"

const char *st_dtype_name(spmd_dtype dtype)
{
    switch (dtype) {
    case SPMD_F32: return "F32";
    case SPMD_I32: return "I32";
    case SPMD_BF16: return "BF16";
    }
    return NULL;
}

static bool dtype_parse(const char *name, spmd_dtype *out)
{
    if (!strcmp(name, "F32"))
        *out = SPMD_F32;
    else if (!strcmp(name, "I32"))
        *out = SPMD_I32;
    else
        return false;
    return true;
}

bool st_host_little_endian(void)
{
    const uint16_t one = 1;
    unsigned char first;
    memcpy(&first, &one, 1);
    return first == 1;
}

bool st_json_count(const cJSON *item, int64_t *out)
{
    /* Integers as JSON numbers are exact up to 2^53. */
    if (!cJSON_IsNumber(item)) return false;
    double v = item->valuedouble;
    if (!(v >= 0 && v <= 9007199254740992.0) || v != (double)(int64_t)v) return false;
    *out = (int64_t)v;
    return true;
}

/* Bytes of `rank` dims of `es`-byte elements; false when past 2^62. */
static bool nbytes_of(int rank, const int64_t *shape, size_t es, uint64_t *out)
{
    uint64_t n = es;
    for (int i = 0; i < rank; i++) {
        if (shape[i] != 0 && n > ((uint64_t)1 << 62) / (uint64_t)shape[i]) return false;
        n *= (uint64_t)shape[i];
    }
    *out = n;
    return true;
}

/* ---- Writing --------------------------------------------------------------------------- */

bool st_json_add_counts(cJSON *obj, const char *key, int n, const int64_t *v)
{
    cJSON *a = cJSON_AddArrayToObject(obj, key);
    for (int i = 0; a && i < n; i++) {
        cJSON *x = cJSON_CreateNumber((double)v[i]);
        if (!x || !cJSON_AddItemToArray(a, x)) {
            cJSON_Delete(x);
            return false;
        }
    }
    return a != NULL;
}

/* {"dtype": ..., "shape": [...], "data_offsets": [b, e]}; NULL when out
 * of memory. */
static cJSON *entry_json(const st_entry *e, const char *dtype)
{
    int64_t offsets[2] = {(int64_t)e->begin, (int64_t)e->end};
    cJSON *item = cJSON_CreateObject();
    if (item && cJSON_AddStringToObject(item, "dtype", dtype) &&
        st_json_add_counts(item, "shape", e->rank, e->shape) &&
        st_json_add_counts(item, "data_offsets", 2, offsets))
        return item;
    cJSON_Delete(item);
    return NULL;
}

spmd_status st_header_build(const spmd_allocator *alloc, st_entry *entries, int n,
                            unsigned char **out, size_t *size, uint64_t *data_bytes)
{
    *out = NULL;
    cJSON *root = cJSON_CreateObject();
    uint64_t at = 0;
    bool ok = root != NULL;
    for (int i = 0; ok && i < n; i++) {
        st_entry *e = &entries[i];
        uint64_t bytes;
        const char *dtype = st_dtype_name(e->dtype);
        if (!dtype || !nbytes_of(e->rank, e->shape, spmd_dtype_size(e->dtype), &bytes)) {
            cJSON_Delete(root);
            return BASE_INTERNAL("safetensors: an entry of no known dtype or size");
        }
        e->begin = at;
        e->end = at + bytes;
        at = e->end;
        cJSON *item = entry_json(e, dtype);
        ok = item && cJSON_AddItemToObject(root, e->name, item);
        if (!ok) cJSON_Delete(item);
    }
    char *json = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!json) return base_error(SPMD_ERR_NOMEM, "safetensors: out of memory building a header");
    /* Spaces after the JSON so that the data starts 8-byte aligned. */
    size_t len = strlen(json), padded = (len + 7) / 8 * 8;
    unsigned char *buf = base_alloc(alloc, 8 + padded, "safetensors header");
    if (!buf) {
        cJSON_free(json);
        return SPMD_ERR_NOMEM;
    }
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    memcpy(buf + 8, json, len);
    memset(buf + 8 + len, ' ', padded - len);
    cJSON_free(json);
    *out = buf;
    *size = 8 + padded;
    *data_bytes = at;
    return SPMD_OK;
}

/* ---- Reading --------------------------------------------------------------------------- */

static spmd_status bad(const char *path, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static spmd_status bad(const char *path, const char *fmt, ...)
{
    char why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return base_error(SPMD_ERR_IO, "checkpoint load: %s is not a valid safetensors file: %s", path,
                      why);
}

/* One entry of the header JSON; its name is set by the caller. */
static spmd_status parse_entry(const cJSON *item, const char *path, st_entry *e)
{
    const char *name = item->string;
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(item, "dtype"),
                *shape = cJSON_GetObjectItemCaseSensitive(item, "shape"),
                *off = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    if (!cJSON_IsObject(item) || !cJSON_IsString(dtype) || !cJSON_IsArray(shape) ||
        !cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2)
        return bad(path, "entry '%s' lacks dtype, shape or data_offsets", name);
    if (!dtype_parse(dtype->valuestring, &e->dtype))
        return bad(path, "entry '%s' has a dtype other than F32 and I32", name);
    e->rank = cJSON_GetArraySize(shape);
    if (e->rank > SPMD_MAX_RANK) return bad(path, "entry '%s' has too many dims", name);
    int i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, shape) {
        if (!st_json_count(x, &e->shape[i++])) return bad(path, "entry '%s' has a bad shape", name);
    }
    int64_t b, en;
    if (!st_json_count(cJSON_GetArrayItem(off, 0), &b) ||
        !st_json_count(cJSON_GetArrayItem(off, 1), &en) || en < b)
        return bad(path, "entry '%s' has bad data_offsets", name);
    e->begin = (uint64_t)b;
    e->end = (uint64_t)en;
    uint64_t bytes;
    if (!nbytes_of(e->rank, e->shape, spmd_dtype_size(e->dtype), &bytes) ||
        bytes != e->end - e->begin)
        return bad(path, "entry '%s' has data_offsets that do not fit its shape", name);
    return SPMD_OK;
}

static int by_begin(const void *a, const void *b)
{
    const st_entry *x = a, *y = b;
    return (x->begin > y->begin) - (x->begin < y->begin);
}

/* Entries sorted by offset must tile [0, data_bytes) and names be unique. */
static spmd_status check_tiling(const spmd_allocator *alloc, const st_header *h, const char *path)
{
    st_entry *sorted = base_alloc(alloc, (size_t)(h->n ? h->n : 1) * sizeof *sorted, path);
    if (!sorted) return SPMD_ERR_NOMEM;
    memcpy(sorted, h->entries, (size_t)h->n * sizeof *sorted);
    qsort(sorted, (size_t)h->n, sizeof *sorted, by_begin);
    uint64_t at = 0;
    spmd_status ok = SPMD_OK;
    for (int i = 0; ok == SPMD_OK && i < h->n; i++) {
        if (sorted[i].begin != at)
            ok = bad(path, "entry '%s' does not start where the previous one ends", sorted[i].name);
        at = sorted[i].end;
    }
    base_free(alloc, sorted);
    if (ok == SPMD_OK && at != h->data_bytes)
        ok = bad(path, "%llu data bytes, the entries cover %llu", (unsigned long long)h->data_bytes,
                 (unsigned long long)at);
    for (int i = 0; ok == SPMD_OK && i < h->n; i++)
        for (int j = 0; j < i; j++)
            if (!strcmp(h->entries[i].name, h->entries[j].name)) {
                ok = bad(path, "entry '%s' appears twice", h->entries[i].name);
                break;
            }
    return ok;
}

static spmd_status parse_header(const spmd_allocator *alloc, const char *json, size_t len,
                                const char *path, st_header *h)
{
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, false);
    if (!cJSON_IsObject(root) || json[0] != '{') {
        cJSON_Delete(root);
        return bad(path, "%s", "the header is not a JSON object");
    }
    for (const char *s = end; s < json + len; s++)
        if (*s != ' ') {
            cJSON_Delete(root);
            return bad(path, "%s", "the header has bytes after its JSON other than spaces");
        }
    size_t names = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, root) {
        if (!strcmp(item->string, "__metadata__")) continue;
        h->n++;
        names += strlen(item->string) + 1;
    }
    h->entries = base_calloc(alloc, (size_t)(h->n ? h->n : 1) * sizeof *h->entries, path);
    h->names = base_alloc(alloc, names ? names : 1, path);
    spmd_status ok = h->entries && h->names ? SPMD_OK : SPMD_ERR_NOMEM;
    int i = 0;
    char *name = h->names;
    cJSON_ArrayForEach(item, root) {
        if (ok != SPMD_OK) break;
        if (!strcmp(item->string, "__metadata__")) continue;
        st_entry *e = &h->entries[i++];
        ok = parse_entry(item, path, e);
        strcpy(name, item->string);
        e->name = name;
        name += strlen(name) + 1;
    }
    cJSON_Delete(root);
    return ok;
}

spmd_status st_header_read(const spmd_allocator *alloc, int fd, uint64_t file_bytes,
                           const char *path, st_header *out)
{
    memset(out, 0, sizeof *out);
    unsigned char word[8];
    if (file_bytes < 8) return bad(path, "%s", "shorter than its 8-byte header length");
    spmd_status ok = ckpt_pread_all(fd, word, 8, 0, path, "checkpoint load");
    if (ok != SPMD_OK) return ok;
    uint64_t n = 0;
    for (int i = 0; i < 8; i++) n |= (uint64_t)word[i] << (8 * i);
    if (n > ST_MAX_HEADER || n > file_bytes - 8)
        return bad(path, "%s", "the header length is past the end of the file");
    char *json = base_alloc(alloc, n ? n : 1, path);
    if (!json) return SPMD_ERR_NOMEM;
    ok = ckpt_pread_all(fd, json, n, 8, path, "checkpoint load");
    out->data_start = 8 + n;
    out->data_bytes = file_bytes - 8 - n;
    if (ok == SPMD_OK) ok = parse_header(alloc, json, n, path, out);
    base_free(alloc, json);
    if (ok == SPMD_OK) ok = check_tiling(alloc, out, path);
    if (ok != SPMD_OK) st_header_free(alloc, out);
    return ok;
}

void st_header_free(const spmd_allocator *alloc, st_header *h)
{
    base_free(alloc, h->entries);
    base_free(alloc, h->names);
    memset(h, 0, sizeof *h);
}

const st_entry *st_header_find(const st_header *h, const char *name)
{
    for (int i = 0; i < h->n; i++)
        if (!strcmp(h->entries[i].name, name)) return &h->entries[i];
    return NULL;
}
