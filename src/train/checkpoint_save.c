/*
 * Saving a checkpoint (spmd/checkpoint.h).  Each writing device puts the
 * real part of the blocks it writes (train/checkpoint.h says which: about
 * equal shares) into its own safetensors file, straight from its buffers:
 * nothing is gathered.  Up to SAVE_THREADS files are written at the same
 * time, each by one thread that checksums as it writes; the test hook
 * hears of each file once it is fsynced, from one thread at a time.  Then
 * index.json, and the commit:
 *
 *   DIR/.tmp-step-N-<pid>/   every file written and fsynced, then the directory
 *   -> DIR/step-N            rename, fsync DIR
 *   DIR/latest               written aside, fsynced, renamed over, fsync DIR
 *   older step-* beyond `keep` deleted
 *
 * so that at every moment `latest` names a complete checkpoint.
 */
#include "spmd/checkpoint.h"

#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/arena.h"
#include "base/error.h"
#include "ir/ir.h"
#include "mesh/sharding.h"
#include "train/checkpoint.h"
#include "train/checkpoint_fs.h"
#include "train/checkpoint_hook.h"
#include "train/checkpoint_paths.h"
#include "train/safetensors.h"

#define WHAT "checkpoint save"

/* Writes go through a buffer this big, so small row runs cost no syscall;
 * longer runs go out in pieces this big, each checksummed just before it
 * is written, while it is in cache. */
enum { WRITE_BUFFER = 4 << 20, WRITE_PIECE = 4 << 20 };
/* Files written at the same time. */
enum { SAVE_THREADS = 4 };

static checkpoint_hook_fn hook;
static void *hook_ctx;
/* The hook is called from one thread at a time. */
static pthread_mutex_t hook_lock = PTHREAD_MUTEX_INITIALIZER;

void checkpoint_set_hook(checkpoint_hook_fn fn, void *ctx)
{
    hook = fn;
    hook_ctx = ctx;
}

static spmd_status reached(const char *stage)
{
    pthread_mutex_lock(&hook_lock);
    bool go_on = !hook || hook(hook_ctx, stage);
    pthread_mutex_unlock(&hook_lock);
    if (!go_on) return base_error(SPMD_ERR_IO, WHAT ": stopped by the test hook after %s", stage);
    return SPMD_OK;
}

/* A file of the checkpoint, as the index lists it. */
typedef struct file_info {
    char name[32];
    uint64_t bytes;
    uint32_t crc;
} file_info;

/* ---- One file ------------------------------------------------------------------------ */

typedef struct writer {
    int fd;
    const char *path;
    unsigned char *buf;
    size_t len;
    uint64_t bytes; /* put so far */
    uint32_t crc;
    ckpt_workers *w; /* NULL: not one of several */
} writer;

/* n bytes at the end of the file, with their crc32. */
static spmd_status emit(writer *w, const void *data, size_t n)
{
    const unsigned char *p = data;
    while (n > 0) {
        if (w->w && ckpt_workers_stopping(w->w))
            return base_error(SPMD_ERR_IO, WHAT ": %s: stopped, another file failed", w->path);
        size_t piece = n < WRITE_PIECE ? n : WRITE_PIECE;
        w->crc = ckpt_crc32(w->crc, p, piece);
        spmd_status st = ckpt_write_all(w->fd, p, piece, w->path, WHAT);
        if (st != SPMD_OK) return st;
        p += piece;
        n -= piece;
    }
    return SPMD_OK;
}

static spmd_status flush(writer *w)
{
    spmd_status st = emit(w, w->buf, w->len);
    w->len = 0;
    return st;
}

static spmd_status put(writer *w, const void *data, size_t n)
{
    w->bytes += n;
    if (w->len + n > WRITE_BUFFER) {
        spmd_status st = flush(w);
        if (st != SPMD_OK) return st;
        if (n >= WRITE_BUFFER) return emit(w, data, n); /* a long run goes straight out */
    }
    memcpy(w->buf + w->len, data, n);
    w->len += n;
    return SPMD_OK;
}

typedef struct put_ctx {
    writer *w;
    const char *data;
    size_t es;
} put_ctx;

static spmd_status put_run(void *ctx, int64_t a, int64_t b, int64_t n)
{
    (void)b;
    put_ctx *c = ctx;
    return put(c->w, c->data + (size_t)a * c->es, (size_t)n * c->es);
}

/* Open, fill by `fill`, fsync and close tmp/name; its size and crc32 into
 * *info (not its name). */
typedef spmd_status (*fill_fn)(void *ctx, writer *w);

static spmd_status write_file(const char *tmp, const char *name, unsigned char *buf, fill_fn fill,
                              void *ctx, ckpt_workers *workers, file_info *info)
{
    char path[CKPT_PATH_MAX];
    spmd_status st = ckpt_join(path, tmp, name, WHAT);
    if (st != SPMD_OK) return st;
    writer w = {.fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644),
                .path = path,
                .buf = buf,
                .w = workers};
    if (w.fd < 0)
        return base_error(SPMD_ERR_IO, WHAT ": cannot create %s: %s", path, strerror(errno));
    st = fill(ctx, &w);
    if (st == SPMD_OK) st = flush(&w);
    if (st == SPMD_OK && fsync(w.fd) != 0)
        st = base_error(SPMD_ERR_IO, WHAT ": cannot sync %s: %s", path, strerror(errno));
    if (close(w.fd) != 0 && st == SPMD_OK)
        st = base_error(SPMD_ERR_IO, WHAT ": cannot close %s: %s", path, strerror(errno));
    info->bytes = w.bytes;
    info->crc = w.crc;
    return st;
}

/* ---- The devices' files --------------------------------------------------------------- */

/* The file of a device that writes blocks. */
typedef struct device_file {
    int dev_index;
    unsigned char *header;
    size_t header_size;
    uint64_t data_bytes;
    file_info info;
} device_file;

typedef struct saver {
    const ckpt_layout *l;
    const char *tmp;
    device_file *files; /* mesh order */
    int n_files;
    ckpt_workers workers;
    unsigned char **bufs; /* one per thread */
} saver;

typedef struct fill_device_ctx {
    const ckpt_layout *l;
    const device_file *f;
} fill_device_ctx;

static spmd_status fill_device(void *ctx, writer *w)
{
    const fill_device_ctx *c = ctx;
    const ckpt_layout *l = c->l;
    spmd_status st = put(w, c->f->header, c->f->header_size);
    /* Blocks in the order of the header's entries. */
    for (int i = 0; st == SPMD_OK && i < l->n_blocks; i++) {
        const ckpt_block *k = &l->blocks[i];
        if (k->writer != c->f->dev_index) continue;
        static const int64_t zero[SPMD_MAX_RANK];
        put_ctx pc = {w, k->writer_data, spmd_dtype_size(l->tensors[k->tensor]->dtype)};
        st = ckpt_box_runs(k->b.rank, k->b.valid, k->b.ldims, zero, k->b.valid, zero, put_run, &pc);
    }
    return st;
}

static void file_name(int device, char *buf) { snprintf(buf, 32, "dev-%04d.safetensors", device); }

/* The file entry of a block: its tensor's name, "<name>#<k>" for box k > 0
 * of a grouped block (a device's boxes share one file).  NULL: no memory. */
static char *entry_name(const ckpt_layout *l, const ckpt_block *k)
{
    const spmd_tensor *t = l->tensors[k->tensor];
    size_t len = strlen(t->name) + 16;
    char *name = base_alloc(l->alloc, len, "checkpoint file");
    if (name) snprintf(name, len, l->piece[k->tensor] ? "%s#%d" : "%s", t->name, l->piece[k->tensor]);
    return name;
}

/* The header of device dev_index's file, which holds n blocks. */
static spmd_status build_header(const ckpt_layout *l, int dev_index, int n, device_file *f)
{
    st_entry *entries = base_calloc(l->alloc, (size_t)n * sizeof *entries, "checkpoint file");
    if (!entries) return SPMD_ERR_NOMEM;
    spmd_status st = SPMD_OK;
    n = 0;
    for (int i = 0; i < l->n_blocks && st == SPMD_OK; i++) {
        const ckpt_block *k = &l->blocks[i];
        if (k->writer != dev_index) continue;
        const spmd_tensor *t = l->tensors[k->tensor];
        st_entry *e = &entries[n++];
        *e = (st_entry){.name = entry_name(l, k), .dtype = t->dtype, .rank = k->b.rank};
        if (!e->name) st = SPMD_ERR_NOMEM;
        memcpy(e->shape, k->b.valid, sizeof e->shape);
        file_name(k->writer_device, f->info.name);
    }
    f->dev_index = dev_index;
    if (st == SPMD_OK)
        st = st_header_build(l->alloc, entries, n, &f->header, &f->header_size, &f->data_bytes);
    for (int i = 0; i < n; i++) base_free(l->alloc, (void *)entries[i].name);
    base_free(l->alloc, entries);
    return st;
}

/* Every writing device's file and a buffer for each thread, all
 * allocated before anything is written. */
static spmd_status saver_prepare(saver *s)
{
    const ckpt_layout *l = s->l;
    int *count = base_calloc(l->alloc, (size_t)l->n_dev * sizeof *count, "checkpoint files");
    s->files = base_calloc(l->alloc, (size_t)l->n_dev * sizeof *s->files, "checkpoint files");
    spmd_status st = count && s->files ? SPMD_OK : SPMD_ERR_NOMEM;
    /* This process's writing devices (over MPI the others write theirs). */
    for (int i = 0; st == SPMD_OK && i < l->n_blocks; i++)
        if (l->blocks[i].writer_data) count[l->blocks[i].writer]++;
    for (int d = 0; st == SPMD_OK && d < l->n_dev; d++)
        if (count[d] > 0 && (st = build_header(l, d, count[d], &s->files[s->n_files])) == SPMD_OK)
            s->n_files++;
    base_free(l->alloc, count);
    if (st != SPMD_OK) return st;
    ckpt_workers_start(&s->workers, l->alloc,
                       s->n_files < SAVE_THREADS ? (s->n_files ? s->n_files : 1) : SAVE_THREADS);
    s->bufs = base_calloc(l->alloc, (size_t)s->workers.n * sizeof *s->bufs, "checkpoint buffers");
    if (!s->bufs) return SPMD_ERR_NOMEM;
    for (int i = 0; i < s->workers.n; i++)
        if (!(s->bufs[i] = base_alloc(l->alloc, WRITE_BUFFER, "checkpoint write buffer")))
            return SPMD_ERR_NOMEM;
    return SPMD_OK;
}

static void saver_free(saver *s)
{
    const spmd_allocator *alloc = s->l->alloc;
    for (int i = 0; s->bufs && i < s->workers.n; i++) base_free(alloc, s->bufs[i]);
    base_free(alloc, s->bufs);
    ckpt_workers_stop(&s->workers);
    for (int i = 0; s->files && i < s->n_files; i++) base_free(alloc, s->files[i].header);
    base_free(alloc, s->files);
}

/* Job: file `job`, then the hook. */
static spmd_status write_device(void *ctx, int job, int thread)
{
    saver *s = ctx;
    device_file *f = &s->files[job];
    fill_device_ctx c = {s->l, f};
    spmd_status st = write_file(s->tmp, f->info.name, s->bufs[thread], fill_device, &c,
                                &s->workers, &f->info);
    if (st == SPMD_OK && f->info.bytes != f->header_size + f->data_bytes)
        st = BASE_INTERNAL("checkpoint save: a file's size differs from its header's");
    if (st == SPMD_OK) st = reached(f->info.name);
    return st;
}

/* ---- The index -------------------------------------------------------------------------- */

static bool add_mesh(cJSON *root, const spmd_mesh *m)
{
    cJSON *mesh = cJSON_AddObjectToObject(root, "mesh");
    int64_t shape[MESH_MAX_AXES];
    int rank = m ? m->rank : 0;
    for (int i = 0; i < rank; i++) shape[i] = m->shape[i];
    cJSON *axes = mesh && st_json_add_counts(mesh, "shape", rank, shape)
                      ? cJSON_AddArrayToObject(mesh, "axes")
                      : NULL;
    for (int i = 0; axes && i < rank; i++) {
        cJSON *x = cJSON_CreateString(m->names[i]);
        if (!x || !cJSON_AddItemToArray(axes, x)) {
            cJSON_Delete(x);
            return false;
        }
    }
    return axes != NULL;
}

static bool add_tensor(cJSON *tensors, const ckpt_layout *l, int ti)
{
    const spmd_tensor *t = l->tensors[ti];
    const compiled *c = executor_compiled(l->p);
    sharding s = compiled_held(c, t);
    char spec[512];
    cJSON *item = cJSON_AddObjectToObject(tensors, t->name);
    if (!item || !st_json_add_counts(item, "shape", t->rank, t->dims) ||
        !cJSON_AddStringToObject(item, "dtype", st_dtype_name(t->dtype)) ||
        !cJSON_AddStringToObject(item, "sharding", sharding_format(&s, c->mesh, spec, sizeof spec)))
        return false;
    /* The blocks of every entry of t (a grouped block's boxes). */
    cJSON *blocks = cJSON_AddArrayToObject(item, "blocks");
    for (int i = 0; blocks && i < l->n_blocks; i++) {
        const ckpt_block *k = &l->blocks[i];
        if (l->tensors[k->tensor] != t) continue;
        char name[32];
        file_name(k->writer_device, name);
        cJSON *b = cJSON_CreateObject();
        if (!b || !cJSON_AddItemToArray(blocks, b)) {
            cJSON_Delete(b);
            return false;
        }
        if (!cJSON_AddStringToObject(b, "file", name) ||
            !st_json_add_counts(b, "start", t->rank, k->b.start) ||
            !st_json_add_counts(b, "shape", t->rank, k->b.valid))
            return false;
        if (l->piece[k->tensor]) {
            char *entry = entry_name(l, k);
            bool ok = entry && cJSON_AddStringToObject(b, "entry", entry);
            base_free(l->alloc, entry);
            if (!ok) return false;
        }
    }
    return blocks != NULL;
}

/* index.json's text (cJSON's allocation: cJSON_free it), NULL when out
 * of memory.  Takes over `meta`. */
static char *index_text(const ckpt_layout *l, int64_t step, cJSON *meta, const file_info *files,
                        int n_files)
{
    cJSON *root = cJSON_CreateObject();
    if (!root || !cJSON_AddItemToObject(root, "format", cJSON_CreateString(CKPT_FORMAT)) ||
        !cJSON_AddNumberToObject(root, "version", CKPT_VERSION) ||
        !cJSON_AddNumberToObject(root, "step", (double)step) ||
        !add_mesh(root, executor_compiled(l->p)->mesh) ||
        !cJSON_AddItemToObject(root, "meta", meta)) {
        cJSON_Delete(meta);
        cJSON_Delete(root);
        return NULL;
    }
    cJSON *tensors = cJSON_AddObjectToObject(root, "tensors");
    bool ok = tensors != NULL;
    for (int i = 0; ok && i < l->n_tensors; i++) ok = l->piece[i] || add_tensor(tensors, l, i);
    cJSON *list = ok ? cJSON_AddObjectToObject(root, "files") : NULL;
    ok = list != NULL;
    for (int i = 0; ok && i < n_files; i++) {
        char crc[16];
        const file_info *info = &files[i];
        snprintf(crc, sizeof crc, "%08x", (unsigned)info->crc);
        cJSON *f = cJSON_AddObjectToObject(list, info->name);
        ok = f && cJSON_AddNumberToObject(f, "bytes", (double)info->bytes) &&
             cJSON_AddStringToObject(f, "crc32", crc);
    }
    char *text = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    return text;
}

typedef struct text_file {
    const char *text;
} text_file;

static spmd_status fill_text(void *ctx, writer *w)
{
    const text_file *t = ctx;
    spmd_status st = put(w, t->text, strlen(t->text));
    return st == SPMD_OK ? put(w, "\n", 1) : st;
}

/* ---- Commit ----------------------------------------------------------------------------- */

/* Move the finished tmp directory to `final`.  A step directory of that
 * number may be there already (the same step saved again after a
 * restart): it is swapped out in one exchange, so that a `latest` naming
 * it always finds a whole checkpoint; the old one is left at tmp. */
static spmd_status commit(const spmd_allocator *alloc, const char *dir, const char *tmp,
                          const char *final, const char *step_name)
{
    if (rename(tmp, final) == 0) return SPMD_OK;
    if (errno != EEXIST && errno != ENOTEMPTY)
        return base_error(SPMD_ERR_IO, WHAT ": cannot rename %s to %s: %s", tmp, final,
                          strerror(errno));
#ifdef RENAME_EXCHANGE
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) == 0) return SPMD_OK;
#endif
    /* No exchange here: replace it in two renames, unless `latest`
     * names it (a crash in between would leave `latest` naming nothing). */
    char latest[32];
    if (ckpt_read_latest(alloc, dir, latest, WHAT) == SPMD_OK && !strcmp(latest, step_name))
        return base_error(SPMD_ERR_IO,
                          WHAT ": cannot replace %s, which %s/latest names: this file system "
                               "cannot exchange two directories atomically",
                          final, dir);
    char aside[CKPT_PATH_MAX];
    if (snprintf(aside, sizeof aside, "%s.old", tmp) >= (int)sizeof aside)
        return base_error(SPMD_ERR_INVALID, WHAT ": path %s is too long", tmp);
    if (rename(final, aside) != 0 || rename(tmp, final) != 0)
        return base_error(SPMD_ERR_IO, WHAT ": cannot replace %s: %s", final, strerror(errno));
    if (rename(aside, tmp) != 0) return ckpt_remove_tree(aside, WHAT);
    return SPMD_OK;
}

static int by_step_descending(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x < y) - (x > y);
}

/* Whether `path` is a libspmd checkpoint's index: a JSON object whose
 * "format" is CKPT_FORMAT.  A user's JSON, one cut short, a FIFO or a
 * missing file is not. */
static bool is_checkpoint_index(const spmd_allocator *alloc, const char *path)
{
    char *text;
    size_t len;
    if (ckpt_read_file(alloc, path, CKPT_MAX_INDEX, &text, &len, WHAT) != SPMD_OK) return false;
    cJSON *index = cJSON_ParseWithLength(text, len);
    base_free(alloc, text);
    const cJSON *format = cJSON_GetObjectItemCaseSensitive(index, "format");
    bool ours = cJSON_IsObject(index) && cJSON_IsString(format) &&
                !strcmp(format->valuestring, CKPT_FORMAT);
    cJSON_Delete(index);
    return ours;
}

/* Delete the step directories below `step` but the newest keep - 1, each
 * renamed out of the step-* names first, so none is ever half there.  Only
 * checkpoints count and go: a step-* directory whose index.json is missing
 * or not a libspmd checkpoint's index is not one (a user's, say) and is
 * left alone. */
static spmd_status prune(const spmd_allocator *alloc, const char *dir, int64_t step, int keep)
{
    if (keep <= 0) return SPMD_OK;
    DIR *d = opendir(dir);
    if (!d) return base_error(SPMD_ERR_IO, WHAT ": cannot list %s: %s", dir, strerror(errno));
    int64_t *older = NULL;
    int n = 0, cap = 0;
    spmd_status st = SPMD_OK;
    struct dirent *e;
    while ((e = readdir(d))) {
        int64_t s;
        char index[CKPT_PATH_MAX];
        if (!ckpt_parse_step_name(e->d_name, &s) || s >= step) continue;
        if (snprintf(index, sizeof index, "%s/%s/" CKPT_INDEX, dir, e->d_name) >= (int)sizeof index ||
            !is_checkpoint_index(alloc, index))
            continue;
        if (!base_grow(alloc, (void **)&older, &cap, n + 1, sizeof *older, 16, "checkpoint list")) {
            st = SPMD_ERR_NOMEM;
            break;
        }
        older[n++] = s;
    }
    closedir(d);
    if (n > 0) qsort(older, (size_t)n, sizeof *older, by_step_descending);
    for (int i = keep - 1; st == SPMD_OK && i < n; i++) {
        char name[32], path[CKPT_PATH_MAX], doomed_name[64], doomed[CKPT_PATH_MAX];
        ckpt_step_name(older[i], name);
        snprintf(doomed_name, sizeof doomed_name, ".del-%s-%ld", name, (long)getpid());
        st = ckpt_join(path, dir, name, WHAT);
        if (st == SPMD_OK) st = ckpt_join(doomed, dir, doomed_name, WHAT);
        if (st == SPMD_OK && rename(path, doomed) != 0)
            st = base_error(SPMD_ERR_IO, WHAT ": cannot remove %s: %s", path, strerror(errno));
        if (st == SPMD_OK) st = ckpt_remove_tree(doomed, WHAT);
    }
    base_free(alloc, older);
    return st;
}

/* ---- Save ------------------------------------------------------------------------------- */

static spmd_status check_args(const spmd_program *p, const char *dir, int64_t step, int keep,
                              const char *meta_json, cJSON **meta)
{
    *meta = NULL;
    spmd_status st = executor_check_runnable(p, WHAT);
    if (st != SPMD_OK) return st;
    if (!dir || !dir[0]) return base_error(SPMD_ERR_INVALID, WHAT ": no directory given");
    /* Steps are JSON numbers in the index: exact up to 2^53. */
    if (step < 0 || step > ((int64_t)1 << 53))
        return base_error(SPMD_ERR_INVALID, WHAT ": step %lld is outside [0, 2^53]",
                          (long long)step);
    if (keep < 0) return base_error(SPMD_ERR_INVALID, WHAT ": keep is %d, not >= 0", keep);
    if (!st_host_little_endian())
        return base_error(SPMD_ERR_UNSUPPORTED, WHAT ": this host is big-endian; the files are "
                                                     "little-endian");
    /* The whole text must be the object, nothing after it. */
    *meta = meta_json ? cJSON_ParseWithOpts(meta_json, NULL, true) : cJSON_CreateObject();
    if (!cJSON_IsObject(*meta)) {
        cJSON_Delete(*meta);
        *meta = NULL;
        return base_error(SPMD_ERR_INVALID, WHAT ": meta is not a JSON object: %.60s%s",
                          meta_json ? meta_json : "(out of memory)",
                          meta_json && strlen(meta_json) > 60 ? "..." : "");
    }
    return SPMD_OK;
}

/* Over processes: whether every process got here with SPMD_OK (each
 * calls it at the same point); a failure elsewhere is named by process.
 * One process: its own status. */
static spmd_status agree(const spmd_program *p, spmd_status mine)
{
    int procs = spmd_program_processes(p);
    if (procs == 1) return mine;
    int *all = calloc((size_t)procs, sizeof *all), me = (int)mine;
    spmd_status st = all ? executor_gather_processes(p, &me, all, sizeof me) : SPMD_ERR_NOMEM;
    for (int q = 0; st == SPMD_OK && mine == SPMD_OK && q < procs; q++)
        if (all[q] != SPMD_OK)
            st = base_error((spmd_status)all[q], WHAT ": process %d of %d failed to save", q, procs);
    free(all);
    return mine != SPMD_OK ? mine : st;
}

/* Every process's files' names, sizes and checksums, in process order:
 * each sends a slot per device of its own (unused slots unnamed). */
static spmd_status gather_infos(const ckpt_layout *l, const saver *s, file_info **all, int *n_all)
{
    int first = 0, here = spmd_program_local_devices(l->p, &first);
    int procs = spmd_program_processes(l->p);
    file_info *mine = base_calloc(l->alloc, (size_t)here * sizeof *mine, "checkpoint files");
    *all = base_calloc(l->alloc, (size_t)here * (size_t)procs * sizeof **all, "checkpoint files");
    spmd_status st = mine && *all ? SPMD_OK : SPMD_ERR_NOMEM;
    for (int i = 0; st == SPMD_OK && i < s->n_files; i++) mine[i] = s->files[i].info;
    if (st == SPMD_OK)
        st = executor_gather_processes(l->p, mine, *all, (int64_t)here * (int64_t)sizeof *mine);
    base_free(l->alloc, mine);
    *n_all = 0;
    for (int i = 0; st == SPMD_OK && i < here * procs; i++)
        if ((*all)[i].name[0]) (*all)[(*n_all)++] = (*all)[i];
    return st;
}

/* Every file into tmp, fsynced, then tmp itself.  Over processes each
 * writes its devices' files, and process 0 the index, once all are. */
static spmd_status write_all_files(const ckpt_layout *l, int64_t step, cJSON *meta, const char *tmp)
{
    saver s = {.l = l, .tmp = tmp};
    spmd_status st = saver_prepare(&s);
    if (st == SPMD_OK) st = ckpt_workers_run(&s.workers, s.n_files, write_device, &s);
    file_info *infos = NULL;
    int n_infos = 0;
    st = agree(l->p, st);
    if (st == SPMD_OK) st = gather_infos(l, &s, &infos, &n_infos);
    char *text = NULL;
    bool writes_index = spmd_program_process(l->p) == 0;
    if (st == SPMD_OK && writes_index) {
        text = index_text(l, step, meta, infos, n_infos);
        meta = NULL;
        if (!text) st = base_error(SPMD_ERR_NOMEM, WHAT ": out of memory building %s", CKPT_INDEX);
    }
    cJSON_Delete(meta);
    base_free(l->alloc, infos);
    file_info index;
    if (st == SPMD_OK && writes_index)
        st = write_file(tmp, CKPT_INDEX, s.bufs[0], fill_text, &(text_file){text}, NULL, &index);
    if (text) cJSON_free(text);
    if (st == SPMD_OK && writes_index) st = reached(CKPT_INDEX);
    if (st == SPMD_OK && writes_index) st = ckpt_fsync_dir(tmp, WHAT);
    saver_free(&s);
    return st;
}

spmd_status spmd_checkpoint_save(const spmd_program *p, const char *dir, int64_t step,
                                 const char *meta_json, int keep)
{
    return spmd_checkpoint_save_copy(p, 0, dir, step, meta_json, keep);
}

spmd_status spmd_checkpoint_save_copy(const spmd_program *p, int copy, const char *dir, int64_t step,
                                      const char *meta_json, int keep)
{
    cJSON *meta;
    spmd_status st = check_args(p, dir, step, keep, meta_json, &meta);
    if (st != SPMD_OK) return st;
    ckpt_layout l;
    if (copy < 0 || copy >= spmd_program_copies(p)) {
        cJSON_Delete(meta);
        return base_error(SPMD_ERR_INVALID, WHAT ": copy %d, the program has %d", copy,
                          spmd_program_copies(p));
    }
    if ((st = ckpt_layout_build(p, copy, &l, WHAT)) != SPMD_OK) {
        cJSON_Delete(meta);
        return st;
    }
    char step_name[32], tmp_name[64], tmp[CKPT_PATH_MAX], final[CKPT_PATH_MAX];
    ckpt_step_name(step, step_name);
    /* Over processes every one writes into the one directory process 0
     * makes; alone, a name of this process's own. */
    bool leader = spmd_program_process(p) == 0;
    if (spmd_program_processes(p) > 1) snprintf(tmp_name, sizeof tmp_name, ".tmp-%s-processes", step_name);
    else snprintf(tmp_name, sizeof tmp_name, ".tmp-%s-%ld", step_name, (long)getpid());
    /* Process 0 holds the writers' lock through the save, as a run of
     * the tool holds it through the run: a save into a directory another
     * process is writing checkpoints into is refused, naming it. */
    int lock = -1;
    if (leader) st = ckpt_check_save_dir(dir, WHAT);
    if (st == SPMD_OK) st = ckpt_mkdirs(dir, WHAT);
    if (st == SPMD_OK && leader) st = ckpt_lock_dir(dir, &lock, WHAT);
    if (st == SPMD_OK) st = ckpt_join(tmp, dir, tmp_name, WHAT);
    if (st == SPMD_OK) st = ckpt_join(final, dir, step_name, WHAT);
    /* A leftover of a failed save of this name. */
    if (st == SPMD_OK && leader) st = ckpt_remove_tree(tmp, WHAT);
    if (st == SPMD_OK && leader && mkdir(tmp, 0777) != 0)
        st = base_error(SPMD_ERR_IO, WHAT ": cannot create directory %s: %s", tmp, strerror(errno));
    st = agree(p, st);
    if (st != SPMD_OK) {
        cJSON_Delete(meta);
        ckpt_layout_free(&l);
        ckpt_unlock_dir(lock);
        return st;
    }
    st = write_all_files(&l, step, meta, tmp);
    /* Process 0 commits, once every file is written. */
    if (!leader) {
        ckpt_layout_free(&l);
        return agree(p, st);
    }
    if (st == SPMD_OK) st = commit(l.alloc, dir, tmp, final, step_name);
    if (st == SPMD_OK) st = ckpt_fsync_dir(dir, WHAT);
    if (st != SPMD_OK) {
        /* The previous checkpoint and `latest` are as they were; keep
         * this failure's message, not the clean-up's. */
        char message[1024];
        snprintf(message, sizeof message, "%s", spmd_last_error());
        ckpt_remove_tree(tmp, WHAT);
        ckpt_layout_free(&l);
        ckpt_unlock_dir(lock);
        agree(p, st);
        return base_error(st, "%s", message);
    }
    /* After an exchange, tmp holds the replaced checkpoint. */
    st = ckpt_remove_tree(tmp, WHAT);
    if (st == SPMD_OK) st = reached(step_name);
    char line[40];
    snprintf(line, sizeof line, "%s\n", step_name);
    if (st == SPMD_OK) st = ckpt_replace_file(dir, CKPT_LATEST, line, strlen(line), WHAT);
    if (st == SPMD_OK) st = reached(CKPT_LATEST);
    if (st == SPMD_OK) st = prune(l.alloc, dir, step, keep);
    ckpt_layout_free(&l);
    ckpt_unlock_dir(lock);
    return agree(p, st);
}
