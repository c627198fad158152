/*
 * GPT-2 weights in (spmd/weights.h): Hugging Face safetensors and llm.c
 * checkpoints, recognised from their first bytes and mapped onto the
 * parameters spmd_gpt_build makes (train/gpt_weights.h).
 *
 * A load opens and checks the whole file first (header, every tensor's
 * presence, dtype and shape, the file's size), reads every parameter into
 * staging, and only then writes the program: nothing is half loaded.
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
#include "base/error.h"
#include "runtime/executor.h"
#include "spmd/weights.h"
#include "train/checkpoint.h"
#include "train/checkpoint_fs.h"
#include "train/safetensors.h"

#define WHAT "weights"
#define LLMC_VERSION_PLAIN 1 /* fp32, no padding */
#define LLMC_VERSION_BF16 5
#define SHARD_MAGIC 20240520 /* llm.c token shards: data, not weights */
#define HF_PREFIX "transformer."
#define CONFIG_JSON_MAX ((size_t)1 << 20)

/* ---- The parameter table ------------------------------------------------------------- */

const gw_group GW_GROUPS[] = {
    {"wte.weight", false, false, U_V, U_C},
    {"wpe.weight", false, false, U_T, U_C},
    {"ln_1.weight", true, false, U_C, U_NONE},
    {"ln_1.bias", true, false, U_C, U_NONE},
    {"attn.c_attn.weight", true, true, U_3C, U_C},
    {"attn.c_attn.bias", true, false, U_3C, U_NONE},
    {"attn.c_proj.weight", true, true, U_C, U_C},
    {"attn.c_proj.bias", true, false, U_C, U_NONE},
    {"ln_2.weight", true, false, U_C, U_NONE},
    {"ln_2.bias", true, false, U_C, U_NONE},
    {"mlp.c_fc.weight", true, true, U_4C, U_C},
    {"mlp.c_fc.bias", true, false, U_4C, U_NONE},
    {"mlp.c_proj.weight", true, true, U_C, U_4C},
    {"mlp.c_proj.bias", true, false, U_C, U_NONE},
    {"ln_f.weight", false, false, U_C, U_NONE},
    {"ln_f.bias", false, false, U_C, U_NONE},
};

int gw_context(const spmd_gpt_config *cfg) { return cfg->context ? cfg->context : cfg->seq; }

static int64_t unit_size(const spmd_gpt_config *cfg, gw_unit u)
{
    int64_t c = cfg->dim;
    switch (u) {
    case U_V: return cfg->vocab;
    case U_T: return gw_context(cfg);
    case U_C: return c;
    case U_3C: return 3 * c;
    case U_4C: return 4 * c;
    case U_NONE: break;
    }
    return 1;
}

int64_t gw_param_total(const spmd_gpt_config *cfg)
{
    return 4 + (int64_t)GW_BLOCK_GROUPS * cfg->layers;
}

void gw_param_of(const spmd_gpt_config *cfg, int gi, int layer, gw_param *p)
{
    const gw_group *g = &GW_GROUPS[gi];
    memset(p, 0, sizeof *p);
    p->group = gi;
    p->layer = g->per_layer ? layer : -1;
    if (g->per_layer) snprintf(p->name, sizeof p->name, "h.%d.%s", layer, g->name);
    else snprintf(p->name, sizeof p->name, "%s", g->name);
    p->rank = g->cols == U_NONE ? 1 : 2;
    p->shape[0] = unit_size(cfg, g->rows);
    p->shape[1] = unit_size(cfg, g->cols);
    p->file_shape[0] = g->conv1d ? p->shape[1] : p->shape[0];
    p->file_shape[1] = g->conv1d ? p->shape[0] : p->shape[1];
    p->numel = p->shape[0] * (p->rank == 2 ? p->shape[1] : 1);
}

void gw_param_at(const spmd_gpt_config *cfg, int64_t k, gw_param *p)
{
    int64_t blocks = (int64_t)GW_BLOCK_GROUPS * cfg->layers;
    if (k < GW_FIRST_BLOCK_GROUP) gw_param_of(cfg, (int)k, -1, p);
    else if (k < GW_FIRST_BLOCK_GROUP + blocks)
        gw_param_of(cfg, GW_FIRST_BLOCK_GROUP + (int)((k - 2) % GW_BLOCK_GROUPS),
                    (int)((k - 2) / GW_BLOCK_GROUPS), p);
    else gw_param_of(cfg, (int)(k - blocks + GW_BLOCK_GROUPS), -1, p);
}

void gw_transpose(const float *src, int64_t rows, int64_t cols, float *dst)
{
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) dst[j * rows + i] = src[i * cols + j];
}

/* ---- The program's parameters -------------------------------------------------------- */

spmd_status gw_program_param(const spmd_program *p, const gw_param *w, const char *what,
                             const spmd_tensor **out)
{
    const spmd_tensor *t = spmd_graph_find(executor_compiled(p)->g, w->name);
    bool fits = t && spmd_tensor_is_param(t) && spmd_tensor_dtype(t) == SPMD_F32 &&
                spmd_tensor_rank(t) == w->rank && spmd_tensor_dim(t, 0) == w->shape[0] &&
                (w->rank == 1 || spmd_tensor_dim(t, 1) == w->shape[1]);
    if (fits) {
        *out = t;
        return SPMD_OK;
    }
    char a[64];
    return base_error(SPMD_ERR_INVALID,
                      "%s: the program has no f32 parameter '%s' %s: was it built by "
                      "spmd_gpt_build with this configuration?",
                      what, w->name, ckpt_shape_str(w->rank, w->shape, a, sizeof a));
}

spmd_status gw_check_program(const spmd_program *p, const spmd_gpt_config *cfg,
                             const char *what)
{
    spmd_status st = executor_check_runnable(p, what);
    if (st != SPMD_OK) return st;
    if (spmd_gpt_validate(cfg) != SPMD_OK) return SPMD_ERR_INVALID;
    for (int64_t k = 0; k < gw_param_total(cfg); k++) {
        gw_param w;
        const spmd_tensor *t;
        gw_param_at(cfg, k, &w);
        if ((st = gw_program_param(p, &w, what, &t)) != SPMD_OK) return st;
    }
    return SPMD_OK;
}

/* ---- Reading a file ----------------------------------------------------------------- */

/* Elements before parameter p in an llm.c file whose wte has vp rows. */
static int64_t llmc_offset(const spmd_gpt_config *cfg, int64_t vp, const gw_param *p)
{
    int64_t at = 0;
    gw_param q;
    for (int gi = 0; gi < p->group; gi++) {
        gw_param_of(cfg, gi, 0, &q);
        int64_t n = gi == 0 ? vp * q.shape[1] : q.numel;
        at += GW_GROUPS[gi].per_layer ? n * cfg->layers : n;
    }
    return at + (p->layer > 0 ? p->layer * p->numel : 0);
}

/* An open weights file and what its header says. */
typedef struct wfile {
    const char *path;
    int fd;
    uint64_t bytes;
    spmd_weights_format format;
    spmd_gpt_config cfg; /* the shape it holds; heads 0 when unknown */
    spmd_weights_heads heads_from;
    /* Hugging Face */
    st_header st;
    const char *prefix; /* "" or "transformer." */
    const st_entry *lm_head;
    int meta_heads; /* n_head of the metadata, 0 if none */
    /* llm.c */
    int version;
    int64_t vp; /* wte rows in the file */
} wfile;

static void wfile_close(wfile *f)
{
    if (f->fd >= 0) close(f->fd);
    st_header_free(NULL, &f->st);
    f->fd = -1;
}

static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const unsigned char *p) { return le32(p) | (uint64_t)le32(p + 4) << 32; }

/* "vocab 37, context 16, 2 layers, dim 16" */
static const char *shape_words(const spmd_gpt_config *c, char *buf, size_t size)
{
    snprintf(buf, size, "vocab %d, context %d, %d layer%s, dim %d", c->vocab, gw_context(c),
             c->layers, c->layers == 1 ? "" : "s", c->dim);
    return buf;
}

/* spmd_gpt_validate on a file's shape; heads may be unknown (0) yet. */
static spmd_status check_shape(const wfile *f)
{
    spmd_gpt_config c = f->cfg;
    if (!c.heads) c.heads = 1;
    if (spmd_gpt_validate(&c) == SPMD_OK) return SPMD_OK;
    char why[512];
    snprintf(why, sizeof why, "%s", spmd_last_error());
    return base_error(SPMD_ERR_INVALID, WHAT ": %s holds no valid GPT: %s", f->path, why);
}

/* ---- llm.c -------------------------------------------------------------------------- */

static spmd_status llmc_version(wfile *f, int32_t version)
{
    if (version == GW_LLMC_VERSION_PADDED || version == LLMC_VERSION_PLAIN) {
        f->version = version;
        return SPMD_OK;
    }
    if (version == LLMC_VERSION_BF16)
        return base_error(SPMD_ERR_UNSUPPORTED,
                          WHAT ": %s is an llm.c checkpoint of version 5 (bf16 parameters); "
                          "libspmd reads the fp32 versions 1 and 3",
                          f->path);
    return base_error(SPMD_ERR_UNSUPPORTED,
                      WHAT ": %s is an llm.c checkpoint of version %d; libspmd reads the fp32 "
                      "versions 1 and 3",
                      f->path, version);
}

/* The file must hold the header and exactly the parameters it describes. */
static spmd_status llmc_check_size(const wfile *f)
{
    spmd_gpt_config padded = f->cfg;
    padded.vocab = (int)f->vp;
    padded.heads = 1;
    int64_t count = spmd_gpt_param_count(&padded);
    char words[128];
    if (count < 0 || (uint64_t)count > (UINT64_MAX - GW_LLMC_HEADER_BYTES) / 4)
        return base_error(SPMD_ERR_INVALID, WHAT ": %s: its header describes too large a GPT",
                          f->path);
    uint64_t want = GW_LLMC_HEADER_BYTES + 4 * (uint64_t)count;
    if (f->bytes == want) return SPMD_OK;
    return base_error(SPMD_ERR_IO,
                      WHAT ": %s is %s: %llu bytes, but an llm.c checkpoint of %s (wte padded to "
                      "%lld rows) is %llu bytes",
                      f->path, f->bytes < want ? "truncated" : "longer than its header says",
                      (unsigned long long)f->bytes, shape_words(&f->cfg, words, sizeof words),
                      (long long)f->vp, (unsigned long long)want);
}

static spmd_status llmc_open(wfile *f)
{
    unsigned char raw[GW_LLMC_HEADER_BYTES];
    if (f->bytes < GW_LLMC_HEADER_BYTES)
        return base_error(SPMD_ERR_IO,
                          WHAT ": %s is truncated: %llu bytes, shorter than the %d-byte header of "
                          "an llm.c checkpoint",
                          f->path, (unsigned long long)f->bytes, GW_LLMC_HEADER_BYTES);
    spmd_status st = ckpt_pread_all(f->fd, raw, sizeof raw, 0, f->path, WHAT);
    if (st != SPMD_OK) return st;
    int32_t h[8];
    for (int i = 0; i < 8; i++) h[i] = (int32_t)le32(raw + 4 * i);
    if ((st = llmc_version(f, h[1])) != SPMD_OK) return st;
    f->format = SPMD_WEIGHTS_LLMC;
    f->cfg = (spmd_gpt_config){.vocab = h[3], .seq = h[2], .context = h[2], .layers = h[4],
                               .heads = h[5], .dim = h[6]};
    f->vp = f->version == GW_LLMC_VERSION_PADDED ? h[7] : h[3];
    f->heads_from = SPMD_HEADS_FILE;
    if (f->vp < f->cfg.vocab)
        return base_error(SPMD_ERR_INVALID,
                          WHAT ": %s: its header pads the vocabulary %d to %lld rows, fewer "
                          "than it has",
                          f->path, f->cfg.vocab, (long long)f->vp);
    if ((st = check_shape(f)) != SPMD_OK) return st;
    return llmc_check_size(f);
}

/* ---- Hugging Face safetensors -------------------------------------------------------- */

/* A message st_header_read recorded, as this file's: its "checkpoint
 * load: " prefix would mislead here. */
static spmd_status hf_header_failed(spmd_status st)
{
    char why[1024];
    const char *msg = spmd_last_error(), *lead = "checkpoint load: ";
    if (!strncmp(msg, lead, strlen(lead))) msg += strlen(lead);
    snprintf(why, sizeof why, "%s", msg);
    return base_error(st, WHAT ": %s", why);
}

static bool is_buffer_name(const char *name)
{
    /* h.{i}.attn.bias and h.{i}.attn.masked_bias: the causal mask and its
     * fill value, buffers some transformers versions saved. */
    if (strncmp(name, "h.", 2) != 0) return false;
    const char *s = name + 2;
    if (*s < '0' || *s > '9') return false;
    while (*s >= '0' && *s <= '9') s++;
    return !strcmp(s, ".attn.bias") || !strcmp(s, ".attn.masked_bias");
}

/* The dtypes and the metadata, from the header's JSON: st_header_read
 * refuses a dtype other than F32 or I32 without saying which it is.  A
 * header that does not parse is left to st_header_read's message. */
static spmd_status hf_peek(wfile *f, uint64_t json_bytes)
{
    char *json = base_alloc(NULL, json_bytes ? json_bytes : 1, f->path);
    if (!json) return SPMD_ERR_NOMEM;
    spmd_status st = ckpt_pread_all(f->fd, json, json_bytes, 8, f->path, WHAT);
    cJSON *root = st == SPMD_OK ? cJSON_ParseWithLength(json, json_bytes) : NULL;
    base_free(NULL, json);
    const cJSON *item;
    uint64_t end = 0; /* of the data the entries place */
    cJSON_ArrayForEach(item, root) {
        if (st != SPMD_OK) break;
        const char *name = item->string;
        int64_t e;
        const cJSON *off = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
        if (st_json_count(cJSON_GetArrayItem(off, 1), &e) && (uint64_t)e > end) end = (uint64_t)e;
        if (!strcmp(name, "__metadata__")) {
            const cJSON *h = cJSON_GetObjectItemCaseSensitive(item, "n_head");
            if (cJSON_IsString(h)) f->meta_heads = atoi(h->valuestring);
            if (cJSON_IsString(h) && f->meta_heads <= 0)
                st = base_error(SPMD_ERR_INVALID, WHAT ": %s: its metadata's n_head '%s' is not a "
                                "positive number", f->path, h->valuestring);
            continue;
        }
        const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(item, "dtype");
        size_t np = strlen(HF_PREFIX);
        const char *tail = !strncmp(name, HF_PREFIX, np) ? name + np : name;
        if (cJSON_IsString(dtype) && strcmp(dtype->valuestring, "F32") && !is_buffer_name(tail))
            st = base_error(SPMD_ERR_UNSUPPORTED,
                            WHAT ": %s: tensor '%s' has dtype %s; libspmd reads F32 weights only",
                            f->path, name, dtype->valuestring);
    }
    cJSON_Delete(root);
    if (st == SPMD_OK && end > f->bytes - 8 - json_bytes)
        st = base_error(SPMD_ERR_IO, WHAT ": %s is truncated: %llu bytes, but its header places "
                        "tensor data up to byte %llu", f->path, (unsigned long long)f->bytes,
                        (unsigned long long)(8 + json_bytes + end));
    return st;
}

static const st_entry *hf_find(const wfile *f, const char *name)
{
    char full[96];
    snprintf(full, sizeof full, "%s%s", f->prefix, name);
    return st_header_find(&f->st, full);
}

/* wte and wpe give vocab, dim and context. */
static spmd_status hf_embeddings(wfile *f)
{
    const st_entry *wte = hf_find(f, "wte.weight");
    if (!wte)
        return base_error(SPMD_ERR_IO, WHAT ": %s: tensor 'wte.weight' is missing (nor is there "
                          "'" HF_PREFIX "wte.weight'): not a GPT-2 file", f->path);
    const st_entry *wpe = hf_find(f, "wpe.weight");
    if (!wpe)
        return base_error(SPMD_ERR_IO, WHAT ": %s: tensor '%swpe.weight' is missing", f->path,
                          f->prefix);
    char a[64], b[64];
    if (wte->rank != 2 || wpe->rank != 2 || wpe->shape[1] != wte->shape[1] ||
        wte->shape[0] > INT32_MAX || wte->shape[1] > INT32_MAX || wpe->shape[0] > INT32_MAX)
        return base_error(SPMD_ERR_SHAPE,
                          WHAT ": %s: wte.weight %s and wpe.weight %s are not [vocab, dim] and "
                          "[context, dim]",
                          f->path, ckpt_shape_str(wte->rank, wte->shape, a, sizeof a),
                          ckpt_shape_str(wpe->rank, wpe->shape, b, sizeof b));
    f->cfg.vocab = (int)wte->shape[0];
    f->cfg.dim = (int)wte->shape[1];
    f->cfg.context = f->cfg.seq = (int)wpe->shape[0];
    return SPMD_OK;
}

/* "h.{i}.rest" -> i, or -1. */
static int64_t block_index(const char *name, const char **rest)
{
    if (strncmp(name, "h.", 2) != 0 || name[2] < '0' || name[2] > '9') return -1;
    char *end;
    errno = 0;
    long long i = strtoll(name + 2, &end, 10);
    if (errno || *end != '.' || i > INT32_MAX - 1) return -1;
    if (rest) *rest = end + 1;
    return i;
}

static bool is_param_name(const char *name)
{
    const char *rest = NULL;
    bool block = block_index(name, &rest) >= 0;
    for (int gi = 0; gi < GW_N_GROUPS; gi++)
        if (GW_GROUPS[gi].per_layer == block && !strcmp(block ? rest : name, GW_GROUPS[gi].name))
            return true;
    return false;
}

/* Layers: one more than the highest block index; and every tensor must be
 * a parameter, a mask buffer or the tied head. */
static spmd_status hf_names(wfile *f)
{
    int64_t top = -1;
    size_t np = strlen(f->prefix);
    for (int i = 0; i < f->st.n; i++) {
        const char *name = f->st.entries[i].name;
        if (!strcmp(name, "lm_head.weight")) {
            f->lm_head = &f->st.entries[i];
            continue;
        }
        const char *tail = !strncmp(name, f->prefix, np) ? name + np : NULL;
        if (!tail || (!is_param_name(tail) && !is_buffer_name(tail)))
            return base_error(SPMD_ERR_IO,
                              WHAT ": %s: tensor '%s' is not part of a GPT-2 (%swte, %swpe, "
                              "%sh.N.*, %sln_f, lm_head and the attention mask buffers)",
                              f->path, name, f->prefix, f->prefix, f->prefix, f->prefix);
        int64_t b = block_index(tail, NULL);
        if (b > top) top = b;
    }
    if (top < 0)
        return base_error(SPMD_ERR_IO, WHAT ": %s: no transformer blocks (no tensor '%sh.0.*')",
                          f->path, f->prefix);
    f->cfg.layers = (int)(top + 1);
    return SPMD_OK;
}

/* Every parameter of the shape, F32, in Conv1D layout where it belongs. */
static spmd_status hf_check_params(const wfile *f)
{
    char a[64], b[64];
    for (int64_t k = 0; k < gw_param_total(&f->cfg); k++) {
        gw_param p;
        gw_param_at(&f->cfg, k, &p);
        const st_entry *e = hf_find(f, p.name);
        if (!e)
            return base_error(SPMD_ERR_IO, WHAT ": %s: tensor '%s%s' is missing", f->path,
                              f->prefix, p.name);
        if (e->dtype != SPMD_F32)
            return base_error(SPMD_ERR_UNSUPPORTED, WHAT ": %s: tensor '%s' has dtype %s; "
                              "libspmd reads F32 weights only", f->path, e->name,
                              st_dtype_name(e->dtype));
        bool same = e->rank == p.rank && e->shape[0] == p.file_shape[0] &&
                    (p.rank == 1 || e->shape[1] == p.file_shape[1]);
        if (!same)
            return base_error(SPMD_ERR_SHAPE,
                              WHAT ": %s: tensor '%s' has shape %s; a GPT-2 of dim %d needs %s%s",
                              f->path, e->name, ckpt_shape_str(e->rank, e->shape, a, sizeof a),
                              f->cfg.dim, ckpt_shape_str(p.rank, p.file_shape, b, sizeof b),
                              GW_GROUPS[p.group].conv1d ? " (Conv1D's [in, out])" : "");
    }
    const st_entry *head = f->lm_head;
    if (head && (head->dtype != SPMD_F32 || head->rank != 2 || head->shape[0] != f->cfg.vocab ||
                 head->shape[1] != f->cfg.dim)) {
        int64_t want[2] = {f->cfg.vocab, f->cfg.dim};
        return base_error(SPMD_ERR_SHAPE,
                          WHAT ": %s: tensor 'lm_head.weight' has shape %s; tied to wte it needs "
                          "F32 %s",
                          f->path, ckpt_shape_str(f->lm_head->rank, f->lm_head->shape, a, sizeof a),
                          ckpt_shape_str(2, want, b, sizeof b));
    }
    return SPMD_OK;
}

/* The directory part of `path` + "/config.json". */
static spmd_status config_json_path(const char *path, char *out)
{
    const char *slash = strrchr(path, '/');
    int n = slash ? snprintf(out, CKPT_PATH_MAX, "%.*s/config.json", (int)(slash - path), path)
                  : snprintf(out, CKPT_PATH_MAX, "config.json");
    if (n < 0 || n >= CKPT_PATH_MAX)
        return base_error(SPMD_ERR_INVALID, WHAT ": %s: path too long", path);
    return SPMD_OK;
}

/* A whole positive int from obj[key]; 0 when absent; -1 when not one. */
int gw_json_int(const cJSON *obj, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    int64_t n;
    if (!v) return 0;
    if (!st_json_count(v, &n) || n <= 0 || n > INT32_MAX) return -1;
    return (int)n;
}

/* n_head of a Hugging Face config.json beside the file, after checking
 * that it describes this file (n_embd, n_layer); 0 when there is none. */
static spmd_status config_json_heads(const wfile *f, int *heads)
{
    char path[CKPT_PATH_MAX];
    *heads = 0;
    spmd_status st = config_json_path(f->path, path);
    if (st != SPMD_OK || !ckpt_exists(path)) return st;
    char *text;
    size_t len;
    if ((st = ckpt_read_file(NULL, path, CONFIG_JSON_MAX, &text, &len, WHAT)) != SPMD_OK) return st;
    cJSON *root = cJSON_ParseWithLength(text, len);
    base_free(NULL, text);
    int h = gw_json_int(root, "n_head"), c = gw_json_int(root, "n_embd"),
        l = gw_json_int(root, "n_layer");
    if (!cJSON_IsObject(root) || h < 0 || c < 0 || l < 0)
        st = base_error(SPMD_ERR_IO, WHAT ": %s (beside %s) is not a JSON object with whole "
                        "positive n_head, n_embd and n_layer", path, f->path);
    else if ((c && c != f->cfg.dim) || (l && l != f->cfg.layers))
        st = base_error(SPMD_ERR_INVALID,
                        WHAT ": %s describes another model than %s: n_embd %d, n_layer %d; the "
                        "file holds dim %d, %d layers",
                        path, f->path, c, l, f->cfg.dim, f->cfg.layers);
    else *heads = h;
    cJSON_Delete(root);
    return st;
}

/* Heads: the metadata's n_head, else config.json's, else dim / 64. */
static spmd_status hf_heads(wfile *f)
{
    int h = f->meta_heads;
    f->heads_from = SPMD_HEADS_FILE;
    spmd_status st = SPMD_OK;
    if (!h) {
        f->heads_from = SPMD_HEADS_CONFIG_JSON;
        st = config_json_heads(f, &h);
    }
    if (st == SPMD_OK && !h && f->cfg.dim % 64 == 0) {
        f->heads_from = SPMD_HEADS_GPT2_RULE;
        h = f->cfg.dim / 64;
    }
    if (!h) f->heads_from = SPMD_HEADS_UNKNOWN;
    f->cfg.heads = h;
    if (st == SPMD_OK && h && f->cfg.dim % h)
        st = base_error(SPMD_ERR_INVALID, WHAT ": %s: %d heads (%s) do not divide dim %d",
                        f->path, h, f->heads_from == SPMD_HEADS_FILE ? "its metadata"
                                                                   : "config.json beside it",
                        f->cfg.dim);
    return st;
}

static spmd_status hf_open(wfile *f)
{
    f->format = SPMD_WEIGHTS_HF;
    uint64_t json_bytes = 0;
    unsigned char word[8];
    spmd_status st = ckpt_pread_all(f->fd, word, 8, 0, f->path, WHAT);
    if (st == SPMD_OK && (json_bytes = le64(word)) <= f->bytes - 8 && json_bytes <= ST_MAX_HEADER)
        st = hf_peek(f, json_bytes);
    if (st == SPMD_OK && (st = st_header_read(NULL, f->fd, f->bytes, f->path, &f->st)) != SPMD_OK)
        return hf_header_failed(st);
    if (st != SPMD_OK) return st;
    bool plain = st_header_find(&f->st, "wte.weight") ||
                 !st_header_find(&f->st, HF_PREFIX "wte.weight");
    f->prefix = plain ? "" : HF_PREFIX;
    if ((st = hf_embeddings(f)) != SPMD_OK || (st = hf_names(f)) != SPMD_OK) return st;
    if ((st = check_shape(f)) != SPMD_OK || (st = hf_check_params(f)) != SPMD_OK) return st;
    return hf_heads(f);
}

/* ---- Opening ------------------------------------------------------------------------ */

static spmd_status detect(wfile *f)
{
    unsigned char head[9] = {0};
    size_t n = f->bytes < sizeof head ? (size_t)f->bytes : sizeof head;
    spmd_status st = ckpt_pread_all(f->fd, head, n, 0, f->path, WHAT);
    if (st != SPMD_OK) return st;
    if (n >= 4 && le32(head) == GW_LLMC_MAGIC) return llmc_open(f);
    if (n >= 4 && le32(head) == SHARD_MAGIC)
        return base_error(SPMD_ERR_INVALID, WHAT ": %s is an llm.c token shard (magic %d): data "
                          "for --data, not model weights", f->path, SHARD_MAGIC);
    if (f->bytes < 8)
        return base_error(SPMD_ERR_IO, WHAT ": %s is %llu bytes: too short for a safetensors file "
                          "or an llm.c checkpoint", f->path, (unsigned long long)f->bytes);
    /* safetensors: a header length that fits the format's limit, then a
     * JSON object (or a length past the end: a truncated file). */
    uint64_t len = le64(head);
    if (len > 0 && len <= ST_MAX_HEADER && (len > f->bytes - 8 || head[8] == '{'))
        return hf_open(f);
    return base_error(SPMD_ERR_INVALID,
                      WHAT ": %s is neither a safetensors file (an 8-byte header length, then a "
                      "JSON header) nor an llm.c checkpoint (int32 magic %d); it starts with "
                      "%02x %02x %02x %02x %02x %02x %02x %02x",
                      f->path, GW_LLMC_MAGIC, head[0], head[1], head[2], head[3], head[4], head[5],
                      head[6], head[7]);
}

static spmd_status wfile_open(const char *path, wfile *f)
{
    memset(f, 0, sizeof *f);
    f->path = path;
    f->fd = -1;
    if (!path) return base_error(SPMD_ERR_INVALID, WHAT ": the path is NULL");
    if (!st_host_little_endian())
        return base_error(SPMD_ERR_UNSUPPORTED, WHAT ": %s: weights files are little-endian and "
                          "this host is not", path);
    f->fd = ckpt_open_input(path);
    if (f->fd < 0)
        return base_error(SPMD_ERR_IO, WHAT ": cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(f->fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        wfile_close(f);
        return base_error(SPMD_ERR_IO, WHAT ": %s is not a regular file", path);
    }
    f->bytes = (uint64_t)sb.st_size;
    spmd_status st = detect(f);
    if (st != SPMD_OK) wfile_close(f);
    return st;
}

const char *spmd_weights_format_name(spmd_weights_format format)
{
    switch (format) {
    case SPMD_WEIGHTS_HF: return "hf";
    case SPMD_WEIGHTS_LLMC: return "llmc";
    }
    return NULL;
}

spmd_status spmd_weights_inspect(const char *path, spmd_weights_info *info)
{
    if (!info) return base_error(SPMD_ERR_INVALID, WHAT ": info is NULL");
    memset(info, 0, sizeof *info);
    wfile f;
    spmd_status st = wfile_open(path, &f);
    if (st != SPMD_OK) return st;
    info->format = f.format;
    info->config = f.cfg;
    info->heads_from = f.heads_from;
    wfile_close(&f);
    return SPMD_OK;
}

/* ---- Loading ---------------------------------------------------------------------- */

/* The file must hold cfg's model. */
static spmd_status check_match(const wfile *f, const spmd_gpt_config *cfg)
{
    char a[128], b[128];
    if (f->cfg.vocab != cfg->vocab || f->cfg.context != gw_context(cfg) ||
        f->cfg.layers != cfg->layers || f->cfg.dim != cfg->dim)
        return base_error(SPMD_ERR_SHAPE, WHAT ": %s holds a GPT of %s; the program's has %s",
                          f->path, shape_words(&f->cfg, a, sizeof a),
                          shape_words(cfg, b, sizeof b));
    if (f->heads_from == SPMD_HEADS_FILE && f->cfg.heads != cfg->heads)
        return base_error(SPMD_ERR_SHAPE, WHAT ": %s records %d heads; the program's GPT has %d",
                          f->path, f->cfg.heads, cfg->heads);
    return SPMD_OK;
}

/* Parameter w from the file into dst (libspmd's layout); tmp holds any
 * Conv1D weight. */
static spmd_status read_param(const wfile *f, const gw_param *w, float *dst, float *tmp)
{
    size_t bytes = (size_t)w->numel * sizeof(float);
    if (f->format == SPMD_WEIGHTS_LLMC) {
        uint64_t off = GW_LLMC_HEADER_BYTES + 4 * (uint64_t)llmc_offset(&f->cfg, f->vp, w);
        return ckpt_pread_all(f->fd, dst, bytes, off, f->path, WHAT);
    }
    const st_entry *e = hf_find(f, w->name);
    uint64_t off = f->st.data_start + e->begin;
    if (!GW_GROUPS[w->group].conv1d) return ckpt_pread_all(f->fd, dst, bytes, off, f->path, WHAT);
    spmd_status st = ckpt_pread_all(f->fd, tmp, bytes, off, f->path, WHAT);
    if (st == SPMD_OK) gw_transpose(tmp, w->file_shape[0], w->file_shape[1], dst);
    return st;
}

/* A tied head must be wte itself. */
static spmd_status check_lm_head(const wfile *f, const float *wte, float *tmp)
{
    if (!f->lm_head) return SPMD_OK;
    int64_t n = (int64_t)f->cfg.vocab * f->cfg.dim;
    spmd_status st = ckpt_pread_all(f->fd, tmp, (size_t)n * sizeof(float),
                                    f->st.data_start + f->lm_head->begin, f->path, WHAT);
    for (int64_t i = 0; st == SPMD_OK && i < n; i++)
        if (memcmp(&tmp[i], &wte[i], sizeof *tmp) != 0)
            return base_error(SPMD_ERR_UNSUPPORTED,
                              WHAT ": %s: lm_head.weight differs from wte.weight (first at row "
                              "%lld, column %lld): libspmd's GPT ties the head to wte",
                              f->path, (long long)(i / f->cfg.dim), (long long)(i % f->cfg.dim));
    return st;
}

/* Every parameter, read into `staging` (libspmd's order and layouts). */
static spmd_status read_all(const wfile *f, const spmd_allocator *alloc, float *staging)
{
    int64_t c = f->cfg.dim, vc = (int64_t)f->cfg.vocab * c;
    int64_t tmp_n = f->lm_head && vc > 4 * c * c ? vc : 4 * c * c;
    float *tmp = base_alloc(alloc, (size_t)tmp_n * sizeof *tmp, "weights staging");
    if (!tmp) return SPMD_ERR_NOMEM;
    spmd_status st = SPMD_OK;
    int64_t at = 0;
    for (int64_t k = 0; st == SPMD_OK && k < gw_param_total(&f->cfg); k++) {
        gw_param w;
        gw_param_at(&f->cfg, k, &w);
        st = read_param(f, &w, staging + at, tmp);
        at += w.numel;
    }
    if (st == SPMD_OK && f->format == SPMD_WEIGHTS_HF) st = check_lm_head(f, staging, tmp);
    base_free(alloc, tmp);
    return st;
}

static spmd_status write_all(spmd_program *p, const spmd_gpt_config *cfg, const float *staging)
{
    int64_t at = 0;
    for (int64_t k = 0; k < gw_param_total(cfg); k++) {
        gw_param w;
        const spmd_tensor *t;
        gw_param_at(cfg, k, &w);
        spmd_status st = gw_program_param(p, &w, WHAT, &t);
        if (st == SPMD_OK)
            st = spmd_program_write(p, t, staging + at, (size_t)w.numel * sizeof(float));
        if (st != SPMD_OK) return st;
        at += w.numel;
    }
    return SPMD_OK;
}

spmd_status spmd_weights_load(spmd_program *p, const spmd_gpt_config *cfg, const char *path)
{
    spmd_status st = gw_check_program(p, cfg, WHAT " load");
    if (st != SPMD_OK) return st;
    wfile f;
    if ((st = wfile_open(path, &f)) != SPMD_OK) return st;
    const spmd_allocator *alloc = &executor_compiled(p)->alloc;
    float *staging = NULL;
    st = check_match(&f, cfg);
    if (st == SPMD_OK) {
        int64_t n = spmd_gpt_param_count(cfg);
        staging = base_alloc(alloc, (size_t)n * sizeof *staging, "weights staging");
        st = staging ? read_all(&f, alloc, staging) : SPMD_ERR_NOMEM;
    }
    if (st == SPMD_OK) st = write_all(p, cfg, staging);
    base_free(alloc, staging);
    wfile_close(&f);
    return st;
}
