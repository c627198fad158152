/*
 * GPT-2 weights out (spmd/weights.h): a program's GPT parameters as one
 * Hugging Face safetensors file or llm.c checkpoint, written under a
 * temporary name and renamed into place; and the export of a checkpoint's
 * GPT, built on one device from the configuration its meta records.
 */
#include "train/gpt_weights.h"

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/arena.h"
#include "base/bf16.h"
#include "base/error.h"
#include "runtime/executor.h"
#include "spmd/checkpoint.h"
#include "spmd/weights.h"
#include "train/checkpoint.h"
#include "train/checkpoint_fs.h"
#include "train/json_text.h"
#include "train/safetensors.h"

#define LLMC_VOCAB_ROUND 128

/* ---- Writing ------------------------------------------------------------------------ */

/* A file written under a temporary name beside its final one. */
typedef struct writer {
    const char *path;
    char tmp[CKPT_PATH_MAX], dir[CKPT_PATH_MAX];
    int fd;
} writer;

#define WHAT_SAVE "weights save"

static spmd_status writer_open(writer *w, const char *path)
{
    memset(w, 0, sizeof *w);
    w->path = path;
    w->fd = -1;
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    struct stat sb;
    if (!*base || (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)))
        return base_error(SPMD_ERR_INVALID, WHAT_SAVE ": %s names a directory, not a file", path);
    /* Renaming over a FIFO or a device would replace it: never meant. */
    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode))
        return base_error(SPMD_ERR_INVALID, WHAT_SAVE ": %s is not a regular file", path);
    int n = slash ? snprintf(w->dir, sizeof w->dir, "%.*s", (int)(slash - path), path)
                  : snprintf(w->dir, sizeof w->dir, ".");
    if (slash == path) snprintf(w->dir, sizeof w->dir, "/");
    int m = snprintf(w->tmp, sizeof w->tmp, "%s/.%s.tmp-%ld", w->dir, base, (long)getpid());
    if (n < 0 || m < 0 || (size_t)m >= sizeof w->tmp)
        return base_error(SPMD_ERR_INVALID, WHAT_SAVE ": path %s is too long", path);
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0)
        return base_error(SPMD_ERR_IO, WHAT_SAVE ": cannot create %s: %s", w->tmp, strerror(errno));
    return SPMD_OK;
}

static spmd_status writer_put(writer *w, const void *buf, size_t n)
{
    return ckpt_write_all(w->fd, buf, n, w->tmp, WHAT_SAVE);
}

/* Sync and rename into place when st is OK; otherwise drop the file. */
static spmd_status writer_close(writer *w, spmd_status st)
{
    if (w->fd < 0) return st;
    if (st == SPMD_OK && fsync(w->fd) != 0)
        st = base_error(SPMD_ERR_IO, WHAT_SAVE ": cannot sync %s: %s", w->tmp, strerror(errno));
    if (close(w->fd) != 0 && st == SPMD_OK)
        st = base_error(SPMD_ERR_IO, WHAT_SAVE ": cannot close %s: %s", w->tmp, strerror(errno));
    w->fd = -1;
    if (st == SPMD_OK && rename(w->tmp, w->path) != 0)
        st = base_error(SPMD_ERR_IO, WHAT_SAVE ": cannot rename %s to %s: %s", w->tmp, w->path,
                        strerror(errno));
    if (st != SPMD_OK) {
        unlink(w->tmp);
        return st;
    }
    return ckpt_fsync_dir(w->dir, WHAT_SAVE);
}

/* Buffers for one parameter at a time: `buf` its values, `tmp` a Conv1D
 * weight transposed. */
typedef struct saver {
    const spmd_program *p;
    const spmd_gpt_config *cfg;
    const spmd_allocator *alloc;
    writer w;
    float *buf, *tmp;
    spmd_dtype dtype; /* of the file's values: F32, or BF16 (rounded into `half`) */
    bf16_bits *half;
} saver;

/* Parameter `w` in libspmd's layout, or Hugging Face's when hf. */
static spmd_status save_param(saver *s, const gw_param *w, bool hf)
{
    const spmd_tensor *t;
    size_t bytes = (size_t)w->numel * sizeof(float);
    spmd_status st = gw_program_param(s->p, w, WHAT_SAVE, &t);
    if (st == SPMD_OK) st = spmd_program_read(s->p, t, s->buf, bytes);
    if (st != SPMD_OK) return st;
    float *v = s->buf;
    if (hf && GW_GROUPS[w->group].conv1d) {
        gw_transpose(s->buf, w->shape[0], w->shape[1], s->tmp);
        v = s->tmp;
    }
    if (s->dtype != SPMD_BF16) return writer_put(&s->w, v, bytes);
    bf16_from_f32_n(s->half, v, (size_t)w->numel);
    return writer_put(&s->w, s->half, (size_t)w->numel * sizeof *s->half);
}

/* The safetensors header of the file, with metadata a Hugging Face loader
 * checks ("format": "pt") and the heads, which no tensor shows. */
static spmd_status hf_header(const saver *s, unsigned char **out, size_t *size)
{
    int64_t n = gw_param_total(s->cfg);
    gw_param *ps = base_alloc(s->alloc, (size_t)n * sizeof *ps, "weights header");
    st_entry *es = base_alloc(s->alloc, (size_t)n * sizeof *es, "weights header");
    spmd_status st = ps && es ? SPMD_OK : SPMD_ERR_NOMEM;
    for (int64_t k = 0; st == SPMD_OK && k < n; k++) {
        gw_param_at(s->cfg, k, &ps[k]);
        es[k] = (st_entry){.name = ps[k].name, .dtype = s->dtype, .rank = ps[k].rank};
        memcpy(es[k].shape, ps[k].file_shape, sizeof ps[k].file_shape);
    }
    unsigned char *plain = NULL;
    size_t plain_size = 0;
    uint64_t data_bytes;
    if (st == SPMD_OK) st = st_header_build(s->alloc, es, (int)n, &plain, &plain_size, &data_bytes);
    base_free(s->alloc, ps);
    base_free(s->alloc, es);
    if (st != SPMD_OK) return st;
    /* Put "__metadata__" first in the JSON object; re-pad to 8 bytes. */
    char meta[96];
    int m = snprintf(meta, sizeof meta, "{\"__metadata__\":{\"format\":\"pt\",\"n_head\":\"%d\"},",
                     s->cfg->heads);
    size_t json = plain_size - 8;
    while (json > 0 && plain[8 + json - 1] == ' ') json--;
    size_t len = (size_t)m + json - 1, padded = (len + 7) / 8 * 8;
    unsigned char *buf = base_alloc(s->alloc, 8 + padded, "weights header");
    if (buf) {
        for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)padded >> (8 * i));
        memcpy(buf + 8, meta, (size_t)m);
        memcpy(buf + 8 + m, plain + 9, json - 1);
        memset(buf + 8 + len, ' ', padded - len);
    }
    base_free(s->alloc, plain);
    *out = buf;
    *size = 8 + padded;
    return buf ? SPMD_OK : SPMD_ERR_NOMEM;
}

static spmd_status save_hf(saver *s)
{
    unsigned char *header;
    size_t size;
    spmd_status st = hf_header(s, &header, &size);
    if (st != SPMD_OK) return st;
    st = writer_put(&s->w, header, size);
    base_free(s->alloc, header);
    for (int64_t k = 0; st == SPMD_OK && k < gw_param_total(s->cfg); k++) {
        gw_param w;
        gw_param_at(s->cfg, k, &w);
        st = save_param(s, &w, true);
    }
    return st;
}

/* Zero rows that pad wte to vp rows. */
static spmd_status save_padding(saver *s, int64_t floats)
{
    int64_t chunk = (int64_t)s->cfg->dim * 4; /* tmp holds at least 4C * C floats */
    memset(s->tmp, 0, (size_t)chunk * sizeof *s->tmp);
    spmd_status st = SPMD_OK;
    for (int64_t done = 0; st == SPMD_OK && done < floats; done += chunk) {
        int64_t n = floats - done < chunk ? floats - done : chunk;
        st = writer_put(&s->w, s->tmp, (size_t)n * sizeof *s->tmp);
    }
    return st;
}

static spmd_status save_llmc(saver *s)
{
    const spmd_gpt_config *c = s->cfg;
    int64_t vp = ((int64_t)c->vocab + LLMC_VOCAB_ROUND - 1) / LLMC_VOCAB_ROUND * LLMC_VOCAB_ROUND;
    if (vp > INT32_MAX)
        return base_error(SPMD_ERR_INVALID, WHAT_SAVE ": vocab %d padded is past int32", c->vocab);
    /* magic, version, maxT, V, L, NH, C, Vp; the rest zero */
    int32_t h[GW_LLMC_HEADER_INTS] = {GW_LLMC_MAGIC, GW_LLMC_VERSION_PADDED, gw_context(c),
                                      c->vocab, c->layers, c->heads, c->dim, (int32_t)vp};
    unsigned char raw[GW_LLMC_HEADER_BYTES];
    for (int i = 0; i < GW_LLMC_HEADER_INTS; i++)
        for (int b = 0; b < 4; b++) raw[4 * i + b] = (unsigned char)((uint32_t)h[i] >> (8 * b));
    spmd_status st = writer_put(&s->w, raw, sizeof raw);
    for (int gi = 0; st == SPMD_OK && gi < GW_N_GROUPS; gi++) {
        int layers = GW_GROUPS[gi].per_layer ? c->layers : 1;
        for (int l = 0; st == SPMD_OK && l < layers; l++) {
            gw_param w;
            gw_param_of(c, gi, l, &w);
            st = save_param(s, &w, false);
        }
        if (st == SPMD_OK && gi == 0) st = save_padding(s, (vp - c->vocab) * c->dim);
    }
    return st;
}

spmd_status spmd_weights_save(const spmd_program *p, const spmd_gpt_config *cfg,
                              spmd_weights_format format, const char *path)
{
    return spmd_weights_save_as(p, cfg, format, SPMD_F32, path);
}

spmd_status spmd_weights_save_as(const spmd_program *p, const spmd_gpt_config *cfg,
                                 spmd_weights_format format, spmd_dtype dtype, const char *path)
{
    spmd_status st = gw_check_program(p, cfg, WHAT_SAVE);
    if (st != SPMD_OK) return st;
    if (!spmd_weights_format_name(format))
        return base_error(SPMD_ERR_INVALID, WHAT_SAVE ": unknown format %d", (int)format);
    if (dtype != SPMD_F32 && dtype != SPMD_BF16)
        return base_error(SPMD_ERR_INVALID, WHAT_SAVE ": dtype %s; weights are written as f32 or "
                          "bf16", spmd_dtype_name(dtype));
    if (dtype == SPMD_BF16 && format != SPMD_WEIGHTS_HF)
        return base_error(SPMD_ERR_UNSUPPORTED, WHAT_SAVE ": bf16 weights are written as "
                          "safetensors (hf) only; llm.c's bf16 checkpoint (version 5) is not");
    if (!path) return base_error(SPMD_ERR_INVALID, WHAT_SAVE ": the path is NULL");
    if (!st_host_little_endian())
        return base_error(SPMD_ERR_UNSUPPORTED, WHAT_SAVE ": weights files are little-endian and "
                          "this host is not");
    saver s = {.p = p, .cfg = cfg, .alloc = &executor_compiled(p)->alloc, .dtype = dtype};
    int64_t c = cfg->dim, most = (int64_t)cfg->vocab * c;
    if (gw_context(cfg) * c > most) most = gw_context(cfg) * c;
    if (4 * c * c > most) most = 4 * c * c;
    s.buf = base_alloc(s.alloc, (size_t)most * sizeof(float), "weights save buffer");
    s.tmp = base_alloc(s.alloc, (size_t)(4 * c * c) * sizeof(float), "weights save buffer");
    if (dtype == SPMD_BF16)
        s.half = base_alloc(s.alloc, (size_t)most * sizeof *s.half, "weights save buffer");
    st = s.buf && s.tmp && (s.half || dtype != SPMD_BF16) ? writer_open(&s.w, path)
                                                          : SPMD_ERR_NOMEM;
    if (st == SPMD_OK) st = format == SPMD_WEIGHTS_HF ? save_hf(&s) : save_llmc(&s);
    st = writer_close(&s.w, st);
    base_free(s.alloc, s.buf);
    base_free(s.alloc, s.tmp);
    base_free(s.alloc, s.half);
    return st;
}

/* ---- Checkpoints ----------------------------------------------------------------------- */

#define WHAT_EXPORT "export"

/* index.json of the checkpoint DIR/latest names, or of DIR itself. */
static spmd_status index_path(const char *dir, char *out, const char *what)
{
    char name[32], step_dir[CKPT_PATH_MAX];
    spmd_status st = ckpt_join(out, dir, CKPT_INDEX, what);
    if (st != SPMD_OK || ckpt_exists(out)) return st;
    char latest[CKPT_PATH_MAX];
    if ((st = ckpt_join(latest, dir, CKPT_LATEST, what)) != SPMD_OK) return st;
    if (!ckpt_exists(latest))
        return base_error(SPMD_ERR_IO, "%s: %s is not a checkpoint: it has neither a "
                          "latest file nor an " CKPT_INDEX, what, dir);
    if ((st = ckpt_read_latest(NULL, dir, name, what)) != SPMD_OK) return st;
    if ((st = ckpt_join(step_dir, dir, name, what)) != SPMD_OK) return st;
    return ckpt_join(out, step_dir, CKPT_INDEX, what);
}

/* meta.config of a parsed index. */
static spmd_status parse_config(const cJSON *index, const char *path, spmd_gpt_config *cfg,
                                const char *what)
{
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(index, "meta");
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(meta, "config");
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(c, "model");
    if (!cJSON_IsObject(c))
        return base_error(SPMD_ERR_INVALID, "%s: %s has no meta.config (the model "
                          "configuration spmd train --save records): which model it holds is "
                          "unknown", what, path);
    if (!cJSON_IsString(model) || strcmp(model->valuestring, "gpt"))
        return base_error(SPMD_ERR_UNSUPPORTED, "%s: %s holds model '%s'; only a GPT "
                          "exports to GPT-2 weights", what, path,
                          cJSON_IsString(model) ? model->valuestring : "(none)");
    const char *keys[] = {"vocab", "seq", "layers", "heads", "dim"};
    int *fields[] = {&cfg->vocab, &cfg->seq, &cfg->layers, &cfg->heads, &cfg->dim};
    for (int i = 0; i < 5; i++)
        if ((*fields[i] = gw_json_int(c, keys[i])) <= 0)
            return base_error(SPMD_ERR_INVALID, "%s: %s: meta.config.%s is missing or "
                              "not a positive whole number", what, path, keys[i]);
    if ((cfg->context = gw_json_int(c, "context")) < 0)
        return base_error(SPMD_ERR_INVALID, "%s: %s: meta.config.context is not a "
                          "positive whole number", what, path);
    if (spmd_gpt_validate(cfg) == SPMD_OK) return SPMD_OK;
    char why[512];
    snprintf(why, sizeof why, "%s", spmd_last_error());
    return base_error(SPMD_ERR_INVALID, "%s: %s: meta.config: %s", what, path, why);
}

/* The checkpoint's model configuration and step; messages prefixed `what`. */
static spmd_status checkpoint_config(const char *ckpt_dir, spmd_gpt_config *cfg, int64_t *step,
                                     const char *what)
{
    if (!ckpt_dir || !cfg) return base_error(SPMD_ERR_INVALID, "%s: NULL argument", what);
    memset(cfg, 0, sizeof *cfg);
    char path[CKPT_PATH_MAX];
    spmd_status st = index_path(ckpt_dir, path, what);
    char *text = NULL;
    size_t len;
    if (st == SPMD_OK) st = ckpt_read_file(NULL, path, CKPT_MAX_INDEX, &text, &len, what);
    if (st != SPMD_OK) return st;
    cJSON *index = cJSON_ParseWithLength(text, len);
    if (!index) {
        char why[256];
        st = base_error(SPMD_ERR_IO, "%s: %s %s", what, path,
                        json_text_why_not(text, len, why, sizeof why));
    }
    base_free(NULL, text);
    int64_t saved = 0;
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(index, "step");
    if (st == SPMD_OK && (!cJSON_IsObject(index) || !st_json_count(s, &saved)))
        st = base_error(SPMD_ERR_IO, "%s: %s is not a checkpoint index (JSON with a "
                        "step)", what, path);
    if (st == SPMD_OK) st = parse_config(index, path, cfg, what);
    cJSON_Delete(index);
    if (st == SPMD_OK && step) *step = saved;
    return st;
}

/* Read by export and by other callers (spmd sample --resume): its
 * messages name the checkpoint, not the export. */
spmd_status spmd_weights_checkpoint_config(const char *ckpt_dir, spmd_gpt_config *cfg,
                                           int64_t *step)
{
    return checkpoint_config(ckpt_dir, cfg, step, "checkpoint");
}

spmd_status spmd_weights_export(const char *ckpt_dir, spmd_weights_format format,
                                const char *path, spmd_gpt_config *cfg_out, int64_t *step)
{
    return spmd_weights_export_as(ckpt_dir, format, SPMD_F32, path, cfg_out, step);
}

spmd_status spmd_weights_export_as(const char *ckpt_dir, spmd_weights_format format,
                                   spmd_dtype dtype, const char *path, spmd_gpt_config *cfg_out,
                                   int64_t *step)
{
    spmd_gpt_config cfg;
    spmd_status st = checkpoint_config(ckpt_dir, &cfg, NULL, WHAT_EXPORT);
    if (st != SPMD_OK) return st;
    /* One sequence of one token: the parameters are all that is needed. */
    spmd_gpt_config small = cfg;
    small.context = gw_context(&cfg);
    small.seq = 1;
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_gpt_tensors t;
    spmd_program *p = NULL;
    if (!g) return SPMD_ERR_NOMEM;
    st = spmd_gpt_build(g, &small, 1, &t);
    if (st == SPMD_OK) {
        spmd_compile_options opts = {.threads = 1};
        p = spmd_compile(g, &opts);
        if (!p) st = base_error_status() != SPMD_OK ? base_error_status() : SPMD_ERR_INTERNAL;
    }
    int64_t saved = 0;
    if (st == SPMD_OK) st = spmd_checkpoint_load(p, ckpt_dir, &saved, NULL);
    if (st == SPMD_OK) st = spmd_weights_save_as(p, &small, format, dtype, path);
    spmd_program_free(p);
    spmd_graph_free(g);
    if (st == SPMD_OK && cfg_out) *cfg_out = cfg;
    if (st == SPMD_OK && step) *step = saved;
    return st;
}
