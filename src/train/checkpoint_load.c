/*
 * Loading a checkpoint onto any mesh (spmd/checkpoint.h), resharding on
 * the way:
 *
 *   1. find the step directory (DIR/latest, or DIR itself) and read its
 *      index: format and version;
 *   2. every file it lists: present, its size, its crc32 (a few threads,
 *      each over pieces of the files), a valid safetensors header;
 *   3. every parameter and state of the program: saved under its name with
 *      the same global shape and dtype, as blocks that tile it exactly;
 *      every device's block found, the caller's meta copied, the threads
 *      of step 4 started: nothing is allocated after this;
 *   4. each distinct block the program's devices hold is read (pread),
 *      from just the overlapping parts of the saved blocks, straight into
 *      the first device in mesh order that holds it (its padding zeroed),
 *      and copied from there to the other devices holding it; a few
 *      threads, largest blocks first.
 *
 * Every refusal happens before step 4, which writes into the program, so
 * a refused load leaves the program as it was.  Step 4 can still fail on
 * an I/O error or a file changed since step 2; the program is then partly
 * loaded and the message says so.
 */
#include "spmd/checkpoint.h"

#include <cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/arena.h"
#include "base/error.h"
#include "ir/ir.h"
#include "train/checkpoint.h"
#include "train/checkpoint_fs.h"
#include "train/json_text.h"
#include "train/safetensors.h"

#define WHAT "checkpoint load"

/* Files are checksummed in pieces this big, through a buffer per thread. */
enum { READ_BUFFER = 4 << 20, CRC_PIECE = 32 << 20 };
/* Threads that checksum and read. */
enum { LOAD_THREADS = 4 };

typedef struct saved_file {
    const char *name; /* in the index */
    char path[CKPT_PATH_MAX];
    int fd;
    uint64_t bytes;
    uint32_t crc;    /* the index's */
    int first_piece; /* its pieces in loader.pieces */
    st_header header;
} saved_file;

/* A piece of a file to checksum. */
typedef struct crc_piece {
    const saved_file *file;
    uint64_t at, n;
    uint32_t crc;
} crc_piece;

/* A saved block of one tensor: where it sits and where its bytes are. */
typedef struct saved_block {
    const saved_file *file;
    const st_entry *entry;
    int64_t start[SPMD_MAX_RANK], shape[SPMD_MAX_RANK];
} saved_block;

typedef struct saved_tensor {
    saved_block *blocks;
    int n;
} saved_tensor;

typedef struct loader {
    spmd_program *p;
    const spmd_allocator *alloc;
    char dir[CKPT_PATH_MAX]; /* the step directory */
    char index_path[CKPT_PATH_MAX];
    cJSON *index;
    saved_file *files;
    int n_files;
    crc_piece *pieces;
    int n_pieces;
    ckpt_workers workers;
    unsigned char **bufs; /* per thread, for the checksums */
    ckpt_layout layout;
    saved_tensor *saved; /* per layout tensor */
    void **dst;          /* [tensor * n_dev + dev_index]: the device's block */
} loader;

static checkpoint_load_hook_fn load_hook;
static void *load_hook_ctx;

void checkpoint_set_load_hook(checkpoint_load_hook_fn fn, void *ctx)
{
    load_hook = fn;
    load_hook_ctx = ctx;
}

/* ---- 1. The index --------------------------------------------------------------------- */

static spmd_status find_step_dir(loader *L, const char *dir)
{
    char index[CKPT_PATH_MAX], latest[CKPT_PATH_MAX], name[32];
    spmd_status st = ckpt_join(index, dir, CKPT_INDEX, WHAT);
    if (st == SPMD_OK) st = ckpt_join(latest, dir, CKPT_LATEST, WHAT);
    if (st != SPMD_OK) return st;
    if (ckpt_exists(index)) {
        snprintf(L->dir, sizeof L->dir, "%s", dir);
    } else if (!ckpt_exists(latest)) {
        return base_error(SPMD_ERR_IO, WHAT ": %s has neither a latest file nor an %s", dir,
                          CKPT_INDEX);
    } else {
        if ((st = ckpt_read_latest(L->alloc, dir, name, WHAT)) != SPMD_OK) return st;
        if ((st = ckpt_join(L->dir, dir, name, WHAT)) != SPMD_OK) return st;
    }
    return ckpt_join(L->index_path, L->dir, CKPT_INDEX, WHAT);
}

static spmd_status read_index(loader *L, int64_t *step)
{
    char *text;
    size_t len;
    spmd_status st = ckpt_read_file(L->alloc, L->index_path, CKPT_MAX_INDEX, &text, &len, WHAT);
    if (st != SPMD_OK) return st;
    L->index = cJSON_ParseWithLength(text, len);
    if (!L->index) {
        char why[256];
        st = base_error(SPMD_ERR_IO, WHAT ": %s %s", L->index_path,
                        json_text_why_not(text, len, why, sizeof why));
        base_free(L->alloc, text);
        return st;
    }
    base_free(L->alloc, text);
    if (!cJSON_IsObject(L->index))
        return base_error(SPMD_ERR_IO, WHAT ": %s is not a JSON object", L->index_path);
    const cJSON *format = cJSON_GetObjectItemCaseSensitive(L->index, "format"),
                *version = cJSON_GetObjectItemCaseSensitive(L->index, "version"),
                *s = cJSON_GetObjectItemCaseSensitive(L->index, "step"),
                *meta = cJSON_GetObjectItemCaseSensitive(L->index, "meta");
    if (!cJSON_IsString(format) || strcmp(format->valuestring, CKPT_FORMAT) != 0)
        return base_error(SPMD_ERR_IO, WHAT ": %s is not a %s index (its \"format\" is not \"%s\")",
                          L->index_path, CKPT_FORMAT, CKPT_FORMAT);
    if (!cJSON_IsNumber(version))
        return base_error(SPMD_ERR_IO, WHAT ": %s has no version number", L->index_path);
    if (version->valuedouble != CKPT_VERSION)
        return base_error(SPMD_ERR_UNSUPPORTED,
                          WHAT ": %s is a checkpoint of version %g; this library reads version %d",
                          L->index_path, version->valuedouble, CKPT_VERSION);
    if (!st_json_count(s, step) || (meta && !cJSON_IsObject(meta)) ||
        !cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(L->index, "tensors")) ||
        !cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(L->index, "files")))
        return base_error(SPMD_ERR_IO, WHAT ": %s lacks its step, meta, tensors or files",
                          L->index_path);
    return SPMD_OK;
}

/* ---- 2. The files ----------------------------------------------------------------------- */

/* A file name from the index: a plain name inside the step directory. */
static bool plain_name(const char *name)
{
    return name[0] && name[0] != '.' && !strchr(name, '/') && strlen(name) < 256;
}

static bool parse_crc(const cJSON *item, uint32_t *out)
{
    if (!cJSON_IsString(item) || strlen(item->valuestring) != 8) return false;
    for (int i = 0; i < 8; i++)
        if (!isxdigit((unsigned char)item->valuestring[i])) return false;
    *out = (uint32_t)strtoul(item->valuestring, NULL, 16);
    return true;
}

/* The file's entry in the index, its size on disk; opened. */
static spmd_status open_file(loader *L, const cJSON *item, saved_file *f)
{
    int64_t bytes;
    f->name = item->string;
    if (!plain_name(f->name) ||
        !st_json_count(cJSON_GetObjectItemCaseSensitive(item, "bytes"), &bytes) ||
        !parse_crc(cJSON_GetObjectItemCaseSensitive(item, "crc32"), &f->crc))
        return base_error(SPMD_ERR_IO,
                          WHAT ": %s lists file \"%s\" without a plain name, bytes and crc32",
                          L->index_path, f->name);
    f->bytes = (uint64_t)bytes;
    spmd_status st = ckpt_join(f->path, L->dir, f->name, WHAT);
    if (st != SPMD_OK) return st;
    f->fd = ckpt_open_input(f->path);
    if (f->fd < 0) {
        int err = errno;
        return base_error(SPMD_ERR_IO, WHAT ": %s: %s%s", f->path, strerror(err),
                          err == ENOENT ? " (the checkpoint lists it: a file is missing)" : "");
    }
    struct stat sb;
    if (fstat(f->fd, &sb) != 0)
        return base_error(SPMD_ERR_IO, WHAT ": cannot stat %s: %s", f->path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return base_error(SPMD_ERR_IO, WHAT ": %s is not a regular file", f->path);
    if ((uint64_t)sb.st_size != f->bytes)
        return base_error(SPMD_ERR_IO,
                          WHAT ": %s is %lld bytes, %s says %lld (truncated or overwritten)",
                          f->path, (long long)sb.st_size, CKPT_INDEX, (long long)bytes);
    return SPMD_OK;
}

/* Job: the crc32 of a piece of a file. */
static spmd_status crc_job(void *ctx, int job, int thread)
{
    loader *L = ctx;
    crc_piece *c = &L->pieces[job];
    unsigned char *buf = L->bufs[thread];
    uint32_t sum = 0;
    for (uint64_t at = 0; at < c->n;) {
        if (ckpt_workers_stopping(&L->workers))
            return base_error(SPMD_ERR_IO, WHAT ": stopped");
        size_t n = c->n - at < READ_BUFFER ? (size_t)(c->n - at) : READ_BUFFER;
        spmd_status st = ckpt_pread_all(c->file->fd, buf, n, c->at + at, c->file->path, WHAT);
        if (st != SPMD_OK) return st;
        sum = ckpt_crc32(sum, buf, n);
        at += n;
    }
    c->crc = sum;
    return SPMD_OK;
}

/* Every file the index lists: its size, its crc32, its header. */
static spmd_status check_files(loader *L)
{
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(L->index, "files"), *item;
    int n = cJSON_GetArraySize(files);
    L->files = base_calloc(L->alloc, (size_t)(n ? n : 1) * sizeof *L->files, "checkpoint files");
    if (!L->files) return SPMD_ERR_NOMEM;
    spmd_status st = SPMD_OK;
    cJSON_ArrayForEach(item, files) {
        saved_file *f = &L->files[L->n_files++];
        f->fd = -1;
        if ((st = open_file(L, item, f)) != SPMD_OK) return st;
        f->first_piece = L->n_pieces;
        L->n_pieces += (int)((f->bytes + CRC_PIECE - 1) / CRC_PIECE);
    }
    L->pieces = base_alloc(L->alloc, (size_t)(L->n_pieces ? L->n_pieces : 1) * sizeof *L->pieces,
                           "checkpoint files");
    if (!L->pieces) return SPMD_ERR_NOMEM;
    for (int i = 0; i < L->n_files; i++) {
        const saved_file *f = &L->files[i];
        for (uint64_t at = 0, k = 0; at < f->bytes; at += CRC_PIECE, k++) {
            uint64_t left = f->bytes - at;
            L->pieces[f->first_piece + (int)k] =
                (crc_piece){.file = f, .at = at, .n = left < CRC_PIECE ? left : CRC_PIECE};
        }
    }
    /* The threads for the checksums here and for step 4. */
    ckpt_workers_start(&L->workers, L->alloc, LOAD_THREADS);
    L->bufs = base_calloc(L->alloc, (size_t)L->workers.n * sizeof *L->bufs, "checkpoint buffers");
    if (!L->bufs) return SPMD_ERR_NOMEM;
    for (int i = 0; i < L->workers.n; i++)
        if (!(L->bufs[i] = base_alloc(L->alloc, READ_BUFFER, "checkpoint read buffer")))
            return SPMD_ERR_NOMEM;
    if ((st = ckpt_workers_run(&L->workers, L->n_pieces, crc_job, L)) != SPMD_OK) return st;
    for (int i = 0; i < L->n_files; i++) {
        saved_file *f = &L->files[i];
        uint32_t sum = 0;
        for (int k = f->first_piece; k < L->n_pieces && L->pieces[k].file == f; k++)
            sum = ckpt_crc32_combine(sum, L->pieces[k].crc, L->pieces[k].n);
        if (sum != f->crc)
            return base_error(SPMD_ERR_IO, WHAT ": %s is corrupt: its crc32 is %08x, %s says %08x",
                              f->path, (unsigned)sum, CKPT_INDEX, (unsigned)f->crc);
        if ((st = st_header_read(L->alloc, f->fd, f->bytes, f->path, &f->header)) != SPMD_OK)
            return st;
    }
    return SPMD_OK;
}

/* ---- 3. The tensors --------------------------------------------------------------------- */

static bool parse_dims(const cJSON *a, int rank, int64_t *out)
{
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != rank) return false;
    int i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, a) {
        if (!st_json_count(x, &out[i++])) return false;
    }
    return true;
}

static const saved_file *find_file(const loader *L, const char *name)
{
    for (int i = 0; i < L->n_files; i++)
        if (!strcmp(L->files[i].name, name)) return &L->files[i];
    return NULL;
}

static bool overlap(int rank, const saved_block *a, const saved_block *b)
{
    for (int i = 0; i < rank; i++)
        if (a->start[i] >= b->start[i] + b->shape[i] || b->start[i] >= a->start[i] + a->shape[i])
            return false;
    return true;
}

/* A block's `key` ("start" or "shape"): `rank` whole numbers >= 0.  The
 * refusal says which it is: absent, not such a list, or a value that is
 * negative or not whole (naming the value). */
static spmd_status block_dims(const loader *L, const spmd_tensor *t, const cJSON *item,
                              const char *key, int64_t *out)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(item, key);
    if (parse_dims(a, t->rank, out)) return SPMD_OK;
    if (!a)
        return base_error(SPMD_ERR_IO, WHAT ": %s: a block of '%s' lacks its %s", L->index_path,
                          t->name, key);
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != t->rank)
        return base_error(SPMD_ERR_IO, WHAT ": %s: a block of '%s' has a %s that is not a list of "
                                            "%d numbers (the tensor's rank)",
                          L->index_path, t->name, key, t->rank);
    int i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, a) {
        int64_t v;
        if (!st_json_count(x, &v)) {
            if (cJSON_IsNumber(x) && x->valuedouble < 0)
                return base_error(SPMD_ERR_IO,
                                  WHAT ": %s: a block of '%s' has %s[%d] = %g, which is negative",
                                  L->index_path, t->name, key, i, x->valuedouble);
            char *text = cJSON_PrintUnformatted(x);
            spmd_status st = base_error(SPMD_ERR_IO,
                                        WHAT ": %s: a block of '%s' has %s[%d] = %s, which is not "
                                             "a whole number",
                                        L->index_path, t->name, key, i, text ? text : "?");
            cJSON_free(text);
            return st;
        }
        i++;
    }
    return BASE_INTERNAL("a block's dims parse and do not");
}

static spmd_status parse_block(const loader *L, const spmd_tensor *t, const cJSON *item,
                               saved_block *b)
{
    const cJSON *file = cJSON_GetObjectItemCaseSensitive(item, "file");
    char shape[128];
    if (!cJSON_IsString(file))
        return base_error(SPMD_ERR_IO, WHAT ": %s: a block of '%s' lacks its file (a name)",
                          L->index_path, t->name);
    spmd_status st = block_dims(L, t, item, "start", b->start);
    if (!st) st = block_dims(L, t, item, "shape", b->shape);
    if (st) return st;
    for (int i = 0; i < t->rank; i++)
        if (b->start[i] + b->shape[i] > t->dims[i])
            return base_error(SPMD_ERR_IO, WHAT ": %s: a block of '%s' reaches past its shape %s",
                              L->index_path, t->name,
                              ckpt_shape_str(t->rank, t->dims, shape, sizeof shape));
    if (!(b->file = find_file(L, file->valuestring)))
        return base_error(SPMD_ERR_IO,
                          WHAT ": %s: a block of '%s' is in \"%s\", which it does not list",
                          L->index_path, t->name, file->valuestring);
    /* The file's entry: the tensor's name, unless the index names another
     * (a device's second box of a grouped block). */
    const cJSON *entry = cJSON_GetObjectItemCaseSensitive(item, "entry");
    const char *name = cJSON_IsString(entry) ? entry->valuestring : t->name;
    b->entry = st_header_find(&b->file->header, name);
    if (!b->entry || b->entry->dtype != t->dtype || b->entry->rank != t->rank ||
        memcmp(b->entry->shape, b->shape, (size_t)t->rank * sizeof *b->shape) != 0)
        return base_error(SPMD_ERR_IO, WHAT ": %s has no %s entry '%s' of shape %s, as %s says",
                          b->file->path, st_dtype_name(t->dtype), name,
                          ckpt_shape_str(t->rank, b->shape, shape, sizeof shape), CKPT_INDEX);
    return SPMD_OK;
}

/* Tensor ti of the program: saved with its shape and dtype, as blocks
 * that tile it (none overlap, and together they hold every element). */
static spmd_status check_tensor(loader *L, int ti)
{
    const spmd_tensor *t = L->layout.tensors[ti];
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(L->index, "tensors"), t->name);
    const char *kind = t->op == IR_PARAM ? "parameter" : "state";
    if (!item)
        return base_error(SPMD_ERR_INVALID, WHAT ": %s '%s' of the program is not in %s", kind,
                          t->name, L->index_path);
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(item, "dtype"),
                *shape = cJSON_GetObjectItemCaseSensitive(item, "shape"),
                *blocks = cJSON_GetObjectItemCaseSensitive(item, "blocks");
    int64_t dims[SPMD_MAX_RANK];
    int rank = cJSON_GetArraySize(shape);
    if (!cJSON_IsString(dtype) || !cJSON_IsArray(blocks) || rank > SPMD_MAX_RANK ||
        !parse_dims(shape, rank, dims))
        return base_error(SPMD_ERR_IO, WHAT ": %s: '%s' lacks its dtype, shape or blocks",
                          L->index_path, t->name);
    if (rank != t->rank || memcmp(dims, t->dims, (size_t)rank * sizeof *dims) != 0 ||
        strcmp(dtype->valuestring, st_dtype_name(t->dtype)) != 0) {
        char saved[128], ours[128];
        return base_error(
            SPMD_ERR_SHAPE, WHAT ": %s '%s' is %s %s in %s, %s %s in the program", kind, t->name,
            dtype->valuestring, ckpt_shape_str(rank, dims, saved, sizeof saved), L->index_path,
            st_dtype_name(t->dtype), ckpt_shape_str(t->rank, t->dims, ours, sizeof ours));
    }
    saved_tensor *s = &L->saved[ti];
    int n = cJSON_GetArraySize(blocks);
    s->blocks = base_alloc(L->alloc, (size_t)(n ? n : 1) * sizeof *s->blocks, "checkpoint blocks");
    if (!s->blocks) return SPMD_ERR_NOMEM;
    int64_t covered = 0;
    const cJSON *b;
    cJSON_ArrayForEach(b, blocks) {
        saved_block *sb = &s->blocks[s->n];
        spmd_status st = parse_block(L, t, b, sb);
        if (st != SPMD_OK) return st;
        for (int j = 0; j < s->n; j++)
            if (overlap(t->rank, sb, &s->blocks[j]))
                return base_error(SPMD_ERR_IO, WHAT ": %s: two blocks of '%s' overlap",
                                  L->index_path, t->name);
        covered += ckpt_volume(t->rank, sb->shape);
        s->n++;
    }
    if (covered != ckpt_volume(t->rank, t->dims))
        return base_error(
            SPMD_ERR_IO, WHAT ": %s: the blocks of '%s' hold %lld of its %lld elements",
            L->index_path, t->name, (long long)covered, (long long)ckpt_volume(t->rank, t->dims));
    return SPMD_OK;
}

/* Every device's block pointer, found before anything is written. */
static spmd_status find_destinations(loader *L)
{
    const ckpt_layout *l = &L->layout;
    size_t n = (size_t)(l->n_tensors ? l->n_tensors : 1) * (size_t)l->n_dev;
    L->dst = base_alloc(L->alloc, n * sizeof *L->dst, "checkpoint blocks");
    if (!L->dst) return SPMD_ERR_NOMEM;
    for (int ti = 0; ti < l->n_tensors; ti++)
        for (int d = 0; d < l->n_dev; d++) {
            executor_block b;
            spmd_status st = executor_block_of(l->p, l->tensors[ti], d, l->piece[ti], &b);
            if (st != SPMD_OK) return st;
            L->dst[ti * l->n_dev + d] = b.data;
        }
    return SPMD_OK;
}

/* ---- 4. Into the program ----------------------------------------------------------------- */

/* Zero the padding of a row-major block of dims ldims[] whose first
 * valid[] elements per dim are real. */
static void zero_padding(unsigned char *p, int rank, const int64_t *ldims, const int64_t *valid,
                         size_t es)
{
    if (rank == 0) return;
    size_t stride = es; /* bytes per index of the first dim */
    bool inner = false; /* padding in later dims */
    for (int i = 1; i < rank; i++) {
        stride *= (size_t)ldims[i];
        inner |= valid[i] < ldims[i];
    }
    if (inner)
        for (int64_t i = 0; i < valid[0]; i++)
            zero_padding(p + (size_t)i * stride, rank - 1, ldims + 1, valid + 1, es);
    memset(p + (size_t)valid[0] * stride, 0, (size_t)(ldims[0] - valid[0]) * stride);
}

typedef struct read_ctx {
    loader *L;
    const saved_file *file;
    uint64_t base; /* file offset of the saved block's first element */
    unsigned char *dst;
    size_t es;
} read_ctx;

static spmd_status read_run(void *ctx, int64_t a, int64_t b, int64_t n)
{
    read_ctx *c = ctx;
    if (ckpt_workers_stopping(&c->L->workers)) return base_error(SPMD_ERR_IO, WHAT ": stopped");
    return ckpt_pread_all(c->file->fd, c->dst + (size_t)a * c->es, (size_t)n * c->es,
                          c->base + (uint64_t)b * c->es, c->file->path, WHAT);
}

/* Job: the job-th largest block, from the parts of the saved blocks it
 * overlaps, into its first holder, then copied to its other holders; over
 * processes, its first holder in this process and the others here (a
 * block no device here holds is not read). */
static spmd_status load_block(void *ctx, int job, int thread)
{
    (void)thread;
    loader *L = ctx;
    const ckpt_layout *l = &L->layout;
    int k = l->by_size[job];
    const ckpt_block *blk = &l->blocks[k];
    const spmd_tensor *t = l->tensors[blk->tensor];
    const executor_block *b = &blk->b;
    size_t es = spmd_dtype_size(t->dtype);
    void *const *dst = &L->dst[blk->tensor * l->n_dev];
    const int *held = &l->held[blk->tensor * l->n_dev];
    int at = blk->dev_index;
    while (at < l->n_dev && (held[at] != k || !dst[at])) at++;
    if (at == l->n_dev) return SPMD_OK;
    unsigned char *first = dst[at];
    zero_padding(first, b->rank, b->ldims, b->valid, es);
    const saved_tensor *s = &L->saved[blk->tensor];
    for (int j = 0; j < s->n; j++) {
        const saved_block *sb = &s->blocks[j];
        int64_t ext[SPMD_MAX_RANK], dorg[SPMD_MAX_RANK], sorg[SPMD_MAX_RANK];
        bool empty = false;
        for (int i = 0; i < t->rank; i++) {
            int64_t lo = b->start[i] > sb->start[i] ? b->start[i] : sb->start[i];
            int64_t hi_b = b->start[i] + b->valid[i], hi_s = sb->start[i] + sb->shape[i];
            int64_t hi = hi_b < hi_s ? hi_b : hi_s;
            if (hi <= lo) empty = true;
            ext[i] = hi - lo;
            dorg[i] = lo - b->start[i];
            sorg[i] = lo - sb->start[i];
        }
        if (empty) continue;
        read_ctx c = {L, sb->file, sb->file->header.data_start + sb->entry->begin, first, es};
        spmd_status st = ckpt_box_runs(t->rank, ext, b->ldims, dorg, sb->shape, sorg, read_run, &c);
        if (st != SPMD_OK) return st;
    }
    /* Devices before the first hold other blocks, none, or live elsewhere. */
    for (int d = at + 1; d < l->n_dev; d++)
        if (held[d] == k && dst[d]) memcpy(dst[d], first, blk->padded);
    return SPMD_OK;
}

static void loader_free(loader *L)
{
    for (int i = 0; L->bufs && i < L->workers.n; i++) base_free(L->alloc, L->bufs[i]);
    base_free(L->alloc, L->bufs);
    ckpt_workers_stop(&L->workers);
    base_free(L->alloc, L->pieces);
    for (int i = 0; L->saved && i < L->layout.n_tensors; i++)
        base_free(L->alloc, L->saved[i].blocks);
    base_free(L->alloc, L->saved);
    base_free(L->alloc, L->dst);
    for (int i = 0; i < L->n_files; i++) {
        if (L->files[i].fd >= 0) close(L->files[i].fd);
        st_header_free(L->alloc, &L->files[i].header);
    }
    base_free(L->alloc, L->files);
    ckpt_layout_free(&L->layout);
    cJSON_Delete(L->index);
}

/* The saved "meta" as text the caller frees with free(), whatever cJSON
 * allocates with. */
static spmd_status copy_meta(const loader *L, char **out)
{
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(L->index, "meta");
    char *text = m ? cJSON_PrintUnformatted(m) : NULL;
    const char *src = m ? text : "{}";
    if (src && (*out = malloc(strlen(src) + 1))) strcpy(*out, src);
    if (text) cJSON_free(text);
    return *out ? SPMD_OK : base_error(SPMD_ERR_NOMEM, WHAT ": out of memory copying meta");
}

static spmd_status load(loader *L, int copy, const char *dir, int64_t *step, char **meta)
{
    spmd_status st = find_step_dir(L, dir);
    if (st == SPMD_OK) st = read_index(L, step);
    if (st == SPMD_OK) st = check_files(L);
    if (st == SPMD_OK) st = ckpt_layout_build(L->p, copy, &L->layout, WHAT);
    if (st != SPMD_OK) return st;
    const ckpt_layout *l = &L->layout;
    L->saved = base_calloc(L->alloc, (size_t)(l->n_tensors ? l->n_tensors : 1) * sizeof *L->saved,
                           "checkpoint tensors");
    if (!L->saved) return SPMD_ERR_NOMEM;
    for (int ti = 0; st == SPMD_OK && ti < l->n_tensors; ti++) st = check_tensor(L, ti);
    if (st == SPMD_OK) st = find_destinations(L);
    if (st == SPMD_OK && meta) st = copy_meta(L, meta);
    if (st != SPMD_OK) return st;
    /* From here on the program changes. */
    if (load_hook) load_hook(load_hook_ctx, L->dir);
    st = ckpt_workers_run(&L->workers, l->n_blocks, load_block, L);
    if (st != SPMD_OK) {
        char message[1024];
        snprintf(message, sizeof message, "%s", spmd_last_error());
        return base_error(st, "%s; the program is partly loaded", message);
    }
    return SPMD_OK;
}

spmd_status ckpt_read_meta(const char *dir, char **meta_json)
{
    *meta_json = NULL;
    if (!dir || !dir[0]) return base_error(SPMD_ERR_INVALID, WHAT ": no directory given");
    loader L = {0};
    int64_t step = 0;
    spmd_status st = find_step_dir(&L, dir);
    if (st == SPMD_OK) st = read_index(&L, &step);
    if (st == SPMD_OK) st = copy_meta(&L, meta_json);
    loader_free(&L);
    return st;
}

spmd_status spmd_checkpoint_load(spmd_program *p, const char *dir, int64_t *step, char **meta_json)
{
    return spmd_checkpoint_load_copy(p, -1, dir, step, meta_json);
}

spmd_status spmd_checkpoint_load_copy(spmd_program *p, int copy, const char *dir, int64_t *step,
                                      char **meta_json)
{
    if (meta_json) *meta_json = NULL;
    spmd_status st = executor_check_runnable(p, WHAT);
    if (st != SPMD_OK) return st;
    if (!dir || !dir[0]) return base_error(SPMD_ERR_INVALID, WHAT ": no directory given");
    if (!st_host_little_endian())
        return base_error(SPMD_ERR_UNSUPPORTED, WHAT ": this host is big-endian; the files are "
                                                     "little-endian");
    loader L = {.p = p, .alloc = &executor_compiled(p)->g->alloc};
    int64_t saved_step = 0;
    char *meta = NULL;
    if (copy < -1 || copy >= spmd_program_copies(p))
        return base_error(SPMD_ERR_INVALID, WHAT ": copy %d, the program has %d", copy,
                          spmd_program_copies(p));
    st = load(&L, copy, dir, &saved_step, meta_json ? &meta : NULL);
    loader_free(&L);
    if (st != SPMD_OK) {
        free(meta);
        return st;
    }
    if (step) *step = saved_step;
    if (meta_json) *meta_json = meta;
    return SPMD_OK;
}
