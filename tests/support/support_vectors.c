/*
 * Reader for the reference vectors of tests/vectors/make_vectors.py.  Every
 * length is checked against the bytes left, so a truncated or corrupt file
 * gives a message, never a crash.
 */
#include "support_vectors.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define TV_MAGIC "SPMDVEC1"
#define TV_MAGIC_LEN 8

typedef struct cursor {
    const unsigned char *p;
    size_t left;
} cursor;

__attribute__((format(printf, 3, 4))) static int fail_with(char *err, size_t err_size,
                                                          const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (err && err_size)
        vsnprintf(err, err_size, fmt, ap);
    va_end(ap);
    return -1;
}

static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int take(cursor *c, size_t n, const unsigned char **out)
{
    if (c->left < n)
        return -1;
    *out = c->p;
    c->p += n;
    c->left -= n;
    return 0;
}

static int take_u32(cursor *c, uint32_t *v)
{
    const unsigned char *p;
    if (take(c, 4, &p))
        return -1;
    *v = le32(p);
    return 0;
}

static int take_i64(cursor *c, int64_t *v)
{
    const unsigned char *p;
    if (take(c, 8, &p))
        return -1;
    *v = (int64_t)((uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32);
    return 0;
}

static size_t round8(size_t n) { return (n + 7) & ~(size_t)7; }

/* One record from `c` into `r`, its name and data copied to `*store`. */
static int parse_record(cursor *c, int index, tv_record *r, unsigned char **store, char *err,
                        size_t err_size)
{
    uint32_t name_len, dtype, rank;
    const unsigned char *name, *data;

    if (take_u32(c, &name_len) || take(c, name_len, &name))
        return fail_with(err, err_size, "record %d: truncated name", index);
    char *copy = (char *)*store;
    memcpy(copy, name, name_len);
    copy[name_len] = '\0';
    *store += round8((size_t)name_len + 1);
    r->name = copy;

    if (take_u32(c, &dtype) || take_u32(c, &rank))
        return fail_with(err, err_size, "record '%s': truncated header", copy);
    if (dtype != TV_F32 && dtype != TV_I32)
        return fail_with(err, err_size, "record '%s': unknown dtype %u", copy, dtype);
    if (rank > TV_MAX_RANK)
        return fail_with(err, err_size, "record '%s': rank %u exceeds %d", copy, rank, TV_MAX_RANK);
    r->dtype = (tv_dtype)dtype;
    r->rank = (int)rank;
    r->numel = 1;
    for (uint32_t i = 0; i < rank; i++) {
        if (take_i64(c, &r->dims[i]))
            return fail_with(err, err_size, "record '%s': truncated dims", copy);
        if (r->dims[i] < 0 || (r->dims[i] > 0 && r->numel > (int64_t)(SIZE_MAX / 8) / r->dims[i]))
            return fail_with(err, err_size, "record '%s': bad dim %lld", copy, (long long)r->dims[i]);
        r->numel *= r->dims[i];
    }

    r->bytes = (size_t)r->numel * 4;
    if (take(c, r->bytes, &data))
        return fail_with(err, err_size, "record '%s': truncated data (%zu bytes, %zu left)", copy,
                    r->bytes, c->left);
    uint32_t *dst = (uint32_t *)*store; /* storage is 8-byte aligned */
    for (int64_t i = 0; i < r->numel; i++)
        dst[i] = le32(data + 4 * i);
    *store += round8(r->bytes);
    r->data = dst;
    return 0;
}

int tv_parse(const void *bytes, size_t size, tv_file *f, char *err, size_t err_size)
{
    memset(f, 0, sizeof *f);
    cursor c = {bytes, size};
    const unsigned char *magic;
    uint32_t count;

    if (take(&c, TV_MAGIC_LEN, &magic))
        return fail_with(err, err_size, "truncated: %zu bytes, shorter than the magic", size);
    if (memcmp(magic, TV_MAGIC, TV_MAGIC_LEN) != 0)
        return fail_with(err, err_size, "bad magic: not an " TV_MAGIC " vector file");
    if (take_u32(&c, &count))
        return fail_with(err, err_size, "truncated: no record count");
    /* Each record takes at least 12 bytes, which bounds a corrupt count. */
    if (count > c.left / 12)
        return fail_with(err, err_size, "truncated: %u records cannot fit in %zu bytes", count, c.left);

    /* Names and data are copied out, each padded to 8 bytes, so the file
     * size plus 16 bytes a record is always enough. */
    f->records = calloc(count ? count : 1, sizeof *f->records);
    f->storage = malloc(size + 16 * (size_t)count + 8);
    if (!f->records || !f->storage) {
        tv_free(f);
        return fail_with(err, err_size, "out of memory for %u records", count);
    }
    unsigned char *store = f->storage;
    for (uint32_t i = 0; i < count; i++) {
        if (parse_record(&c, (int)i, &f->records[i], &store, err, err_size)) {
            tv_free(f);
            return -1;
        }
    }
    if (c.left != 0) {
        tv_free(f);
        return fail_with(err, err_size, "%zu trailing bytes after %u records", c.left, count);
    }
    f->count = (int)count;
    return 0;
}

int tv_load(const char *path, tv_file *f, char *err, size_t err_size)
{
    memset(f, 0, sizeof *f);
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return fail_with(err, err_size, "%s: cannot open", path);
    unsigned char *buf = NULL;
    long size = -1;
    if (fseek(fp, 0, SEEK_END) == 0)
        size = ftell(fp);
    if (size >= 0 && fseek(fp, 0, SEEK_SET) == 0)
        buf = malloc((size_t)size + 1);
    size_t got = buf ? fread(buf, 1, (size_t)size, fp) : 0;
    fclose(fp);
    if (!buf || got != (size_t)size) {
        free(buf);
        return fail_with(err, err_size, "%s: cannot read", path);
    }

    char why[256];
    int rc = tv_parse(buf, (size_t)size, f, why, sizeof why);
    free(buf);
    if (rc)
        return fail_with(err, err_size, "%s: %s", path, why);
    return 0;
}

void tv_load_case(const char *name, tv_file *f)
{
    char path[1024], err[512];
    snprintf(path, sizeof path, "%s/%s.bin", tv_dir(), name);
    if (tv_load(path, f, err, sizeof err) != 0)
        fail_msg("%s (set SPMD_VECTOR_DIR to the tests/vectors folder)", err);
}

const tv_record *tv_find(const tv_file *f, const char *name)
{
    for (int i = 0; i < f->count; i++)
        if (strcmp(f->records[i].name, name) == 0)
            return &f->records[i];
    return NULL;
}

void tv_free(tv_file *f)
{
    free(f->records);
    free(f->storage);
    memset(f, 0, sizeof *f);
}

const char *tv_dir(void)
{
    const char *env = getenv("SPMD_VECTOR_DIR");
    if (env && *env)
        return env;
#ifdef SPMD_VECTOR_DIR
    return SPMD_VECTOR_DIR;
#else
    return "tests/vectors";
#endif
}
