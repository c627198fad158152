/*
 * GPT-2 weights in and out (spmd/weights.h):
 *   - the committed files of tests/vectors/make_weights_vectors.py (a small
 *     random GPT-2 written in PyTorch, saved as a Hugging Face safetensors
 *     file with the "transformer." prefix, mask buffers and a tied lm_head,
 *     and as an llm.c version-3 checkpoint whose padding rows are not zero)
 *     load into a libspmd GPT with every parameter bit-identical to
 *     PyTorch's, and give PyTorch's logits and loss within 1e-5, on one
 *     device and on a 4x2 mesh with FSDP;
 *   - inspect finds the format and shape, and the heads from the llm.c
 *     header, the file's metadata, a config.json beside it, or dim / 64;
 *   - each refusal names the file and the cause: a missing file, truncated
 *     files, an unknown magic, a token shard, llm.c versions 2 and 5, a
 *     missing tensor, a tensor of the wrong shape (both shapes named), an
 *     unsupported dtype, an unknown tensor, an untied lm_head, a program of
 *     another shape or head count; a refused load changes nothing;
 *   - save in both formats from a 4x2 mesh and load on one device gives
 *     the same bits; the llm.c file is version 3, its vocabulary padded to
 *     128 rows with zeros; a bad save leaves no file behind;
 *   - export from a checkpoint saved on 4x2 (meta.config) gives the saved
 *     parameters bit for bit, and an export of an export is the same file
 *     byte for byte; exports of checkpoints without a GPT config refused.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "support_files.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fcntl.h>

#include "spmd/checkpoint.h"
#include "spmd/mesh.h"
#include "spmd/models.h"
#include "spmd/spmd.h"
#include "spmd/train.h"
#include "spmd/weights.h"
#include "support_check.h"
#include "support_vectors.h"
#include "train/checkpoint_fs.h"
#include "train/safetensors.h"

/* float32 against PyTorch's float64 result; make_weights_vectors.py checks
 * that PyTorch's own float32 run uses under a quarter of it. */
#define ATOL 1e-5
#define RTOL 1e-5

enum { PATH = SUPPORT_PATH, MAX_TENSORS = 64 };

static const char *HF_FILE = "gpt_weights.safetensors";
static const char *LLMC_FILE = "gpt_weights_llmc.bin";

/* ---- Files ------------------------------------------------------------------------------ */

static const char *vector_path(char *buf, const char *name) { return support_path_in(buf, tv_dir(), name); }

static unsigned char *read_bytes(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    unsigned char *buf = malloc((size_t)sb.st_size + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)sb.st_size, f), (size_t)sb.st_size);
    fclose(f);
    *size = (size_t)sb.st_size;
    return buf;
}

static void write_bytes(const char *path, const void *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, size, f), size);
    assert_int_equal(fclose(f), 0);
}

static void write_text(const char *path, const char *text) { write_bytes(path, text, strlen(text)); }

/* ---- Safetensors files as the tests rewrite them ------------------------------------------ */

typedef struct st_tensor {
    char name[96];
    spmd_dtype dtype;
    int rank;
    int64_t shape[SPMD_MAX_RANK];
    unsigned char *data;
    size_t bytes;
} st_tensor;

typedef struct st_file {
    int n;
    st_tensor t[MAX_TENSORS];
} st_file;

static void st_load(const char *path, st_file *f)
{
    memset(f, 0, sizeof *f);
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    struct stat sb;
    assert_int_equal(fstat(fd, &sb), 0);
    st_header h;
    if (st_header_read(NULL, fd, (uint64_t)sb.st_size, path, &h) != SPMD_OK)
        fail_msg("%s", spmd_last_error());
    assert_true(h.n <= MAX_TENSORS);
    for (int i = 0; i < h.n; i++) {
        st_tensor *t = &f->t[f->n++];
        const st_entry *e = &h.entries[i];
        snprintf(t->name, sizeof t->name, "%s", e->name);
        t->dtype = e->dtype;
        t->rank = e->rank;
        memcpy(t->shape, e->shape, sizeof t->shape);
        t->bytes = (size_t)(e->end - e->begin);
        t->data = malloc(t->bytes ? t->bytes : 1);
        assert_non_null(t->data);
        assert_int_equal(pread(fd, t->data, t->bytes, (off_t)(h.data_start + e->begin)),
                         (ssize_t)t->bytes);
    }
    st_header_free(NULL, &h);
    close(fd);
}

/* Written with the library's header builder: no metadata. */
static void st_save(const char *path, const st_file *f)
{
    st_entry e[MAX_TENSORS];
    for (int i = 0; i < f->n; i++) {
        e[i] = (st_entry){.name = f->t[i].name, .dtype = f->t[i].dtype, .rank = f->t[i].rank};
        memcpy(e[i].shape, f->t[i].shape, sizeof e[i].shape);
    }
    unsigned char *header;
    size_t size;
    uint64_t data;
    assert_int_equal(st_header_build(NULL, e, f->n, &header, &size, &data), SPMD_OK);
    FILE *out = fopen(path, "wb");
    assert_non_null(out);
    assert_int_equal(fwrite(header, 1, size, out), size);
    for (int i = 0; i < f->n; i++)
        assert_int_equal(fwrite(f->t[i].data, 1, f->t[i].bytes, out), f->t[i].bytes);
    assert_int_equal(fclose(out), 0);
    free(header);
}

static void st_free(st_file *f)
{
    for (int i = 0; i < f->n; i++) free(f->t[i].data);
    f->n = 0;
}

static st_tensor *st_get(st_file *f, const char *name)
{
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->t[i].name, name)) return &f->t[i];
    fail_msg("no tensor %s", name);
    return NULL;
}

static void st_remove(st_file *f, const char *name)
{
    st_tensor *t = st_get(f, name);
    free(t->data);
    int i = (int)(t - f->t);
    memmove(&f->t[i], &f->t[i + 1], (size_t)(f->n - i - 1) * sizeof *t);
    f->n--;
}

/* ---- Models ------------------------------------------------------------------------------ */

typedef struct model {
    spmd_gpt_config cfg;
    spmd_graph *g;
    spmd_mesh *mesh;
    spmd_gpt_tensors t;
    spmd_program *p;
} model;

/* A GPT of `cfg` for `batch` rows; on a mesh, FSDP over 'fsdp'. */
static void model_build(model *md, spmd_gpt_config cfg, int batch, const char *mesh,
                        const char *axes, uint64_t seed)
{
    memset(md, 0, sizeof *md);
    md->cfg = cfg;
    md->g = spmd_graph_create(NULL);
    assert_non_null(md->g);
    if (spmd_gpt_build(md->g, &cfg, batch, &md->t) != SPMD_OK) fail_msg("gpt: %s", spmd_last_error());
    assert_int_equal(spmd_graph_mark_output(md->g, md->t.logits), SPMD_OK);
    assert_int_equal(spmd_graph_mark_output(md->g, md->t.loss), SPMD_OK);
    if (mesh) {
        md->mesh = spmd_mesh_parse(mesh, axes);
        assert_non_null(md->mesh);
        spmd_tensor *in[] = {md->t.input, md->t.targets};
        if (spmd_fsdp_wrap(md->g, md->mesh, "fsdp", in, 2, NULL) != SPMD_OK)
            fail_msg("fsdp: %s", spmd_last_error());
    }
    spmd_compile_options opts = {.threads = 2, .seed = seed};
    md->p = spmd_compile(md->g, &opts);
    if (!md->p) fail_msg("compile: %s", spmd_last_error());
}

static void model_free(model *md)
{
    spmd_program_free(md->p);
    spmd_graph_free(md->g);
    spmd_mesh_free(md->mesh);
}

/* Every parameter, whole, in graph order; *bytes their size. */
static float *read_params(const model *md, size_t *bytes)
{
    size_t n = (size_t)spmd_graph_param_count(md->g);
    float *all = malloc(n * sizeof *all), *at = all;
    assert_non_null(all);
    for (int i = 0; i < spmd_graph_tensor_count(md->g); i++) {
        const spmd_tensor *t = spmd_graph_tensor(md->g, i);
        if (!spmd_tensor_is_param(t)) continue;
        size_t size = (size_t)spmd_tensor_numel(t) * sizeof *at;
        assert_int_equal(spmd_program_read(md->p, t, at, size), SPMD_OK);
        at += spmd_tensor_numel(t);
    }
    *bytes = n * sizeof *all;
    return all;
}

static void expect_same_params(const model *a, const model *b)
{
    size_t na, nb;
    float *pa = read_params(a, &na), *pb = read_params(b, &nb);
    assert_int_equal(na, nb);
    if (memcmp(pa, pb, na) != 0) fail_msg("the parameters differ");
    free(pa);
    free(pb);
}

static void load_ok(model *md, const char *path)
{
    if (spmd_weights_load(md->p, &md->cfg, path) != SPMD_OK)
        fail_msg("load %s: %s", path, spmd_last_error());
}

static void expect_error(spmd_status st, const char *a, const char *b, const char *c)
{
    assert_int_not_equal(st, SPMD_OK);
    const char *msg = spmd_last_error();
    const char *needles[] = {a, b, c};
    for (int i = 0; i < 3; i++)
        if (needles[i] && !strstr(msg, needles[i]))
            fail_msg("error '%s' does not mention '%s'", msg, needles[i]);
}

/* ---- Against PyTorch ------------------------------------------------------------------------- */

static const tv_record *need(const tv_file *v, const char *name)
{
    const tv_record *r = tv_find(v, name);
    if (!r) fail_msg("vector record '%s' is missing", name);
    return r;
}

/* config: [vocab, seq, layers, heads, dim, context] */
static spmd_gpt_config vector_config(const tv_file *v)
{
    const tv_record *r = need(v, "config");
    assert_int_equal(r->numel, 6);
    const int32_t *c = r->data;
    return (spmd_gpt_config){.vocab = c[0], .seq = c[1], .layers = c[2], .heads = c[3],
                             .dim = c[4], .context = c[5]};
}

/* Every parameter the program holds has PyTorch's bits. */
static void expect_torch_params(const model *md, const tv_file *v)
{
    for (int i = 0; i < spmd_graph_tensor_count(md->g); i++) {
        const spmd_tensor *t = spmd_graph_tensor(md->g, i);
        if (!spmd_tensor_is_param(t)) continue;
        const tv_record *r = need(v, spmd_tensor_name(t));
        assert_int_equal(r->numel, spmd_tensor_numel(t));
        float *got = malloc(r->bytes);
        assert_non_null(got);
        assert_int_equal(spmd_program_read(md->p, t, got, r->bytes), SPMD_OK);
        if (memcmp(got, r->data, r->bytes) != 0)
            fail_msg("%s differs from PyTorch's", spmd_tensor_name(t));
        free(got);
    }
}

/* The vectors' batch through the program: PyTorch's logits and loss. */
static void expect_torch_outputs(const model *md, const tv_file *v)
{
    const tv_record *in = need(v, "input"), *tg = need(v, "targets");
    const tv_record *logits = need(v, "logits"), *loss = need(v, "loss");
    assert_int_equal(spmd_program_set_input(md->p, md->t.input, in->data, in->bytes), SPMD_OK);
    assert_int_equal(spmd_program_set_input(md->p, md->t.targets, tg->data, tg->bytes), SPMD_OK);
    if (spmd_program_run(md->p) != SPMD_OK) fail_msg("run: %s", spmd_last_error());
    float *got = malloc(logits->bytes), l;
    assert_non_null(got);
    assert_int_equal(spmd_program_read(md->p, md->t.logits, got, logits->bytes), SPMD_OK);
    assert_int_equal(spmd_program_read(md->p, md->t.loss, &l, sizeof l), SPMD_OK);
    bool ok = test_close_enough("logits", got, logits->data, logits->numel, ATOL, RTOL);
    ok = test_close_enough("loss", &l, loss->data, 1, ATOL, RTOL) && ok;
    free(got);
    assert_true(ok);
}

static void torch_case(const char *file, const char *mesh, const char *axes)
{
    tv_file v;
    tv_load_case("gpt_weights", &v);
    spmd_gpt_config cfg = vector_config(&v);
    model md;
    model_build(&md, cfg, (int)need(&v, "input")->dims[0], mesh, axes, 99);
    char path[PATH];
    load_ok(&md, vector_path(path, file));
    expect_torch_params(&md, &v);
    expect_torch_outputs(&md, &v);
    model_free(&md);
    tv_free(&v);
}

static void test_hf_matches_torch(void **state)
{
    (void)state;
    torch_case(HF_FILE, NULL, NULL);
}

static void test_llmc_matches_torch(void **state)
{
    (void)state;
    torch_case(LLMC_FILE, NULL, NULL);
}

static void test_hf_matches_torch_on_4x2_fsdp(void **state)
{
    (void)state;
    torch_case(HF_FILE, "4x2", "replica,fsdp");
}

static void test_llmc_matches_torch_on_4x2_fsdp(void **state)
{
    (void)state;
    torch_case(LLMC_FILE, "4x2", "replica,fsdp");
}

/* ---- Inspect ------------------------------------------------------------------------------- */

static spmd_weights_info inspect_ok(const char *path)
{
    spmd_weights_info info;
    if (spmd_weights_inspect(path, &info) != SPMD_OK) fail_msg("inspect: %s", spmd_last_error());
    return info;
}

static void expect_shape(const spmd_gpt_config *c, int heads)
{
    assert_int_equal(c->vocab, 37);
    assert_int_equal(c->context, 16);
    assert_int_equal(c->layers, 2);
    assert_int_equal(c->dim, 16);
    assert_int_equal(c->heads, heads);
}

static void test_inspect_finds_format_and_shape(void **state)
{
    (void)state;
    char path[PATH];
    spmd_weights_info hf = inspect_ok(vector_path(path, HF_FILE));
    assert_int_equal(hf.format, SPMD_WEIGHTS_HF);
    expect_shape(&hf.config, 0); /* dim 16: no GPT-2 rule, no metadata */
    assert_int_equal(hf.heads_from, SPMD_HEADS_UNKNOWN);
    spmd_weights_info llmc = inspect_ok(vector_path(path, LLMC_FILE));
    assert_int_equal(llmc.format, SPMD_WEIGHTS_LLMC);
    expect_shape(&llmc.config, 2);
    assert_int_equal(llmc.heads_from, SPMD_HEADS_FILE);
    assert_string_equal(spmd_weights_format_name(SPMD_WEIGHTS_HF), "hf");
    assert_string_equal(spmd_weights_format_name(SPMD_WEIGHTS_LLMC), "llmc");
}

static void copy_file(const char *from, const char *to)
{
    size_t n;
    unsigned char *b = read_bytes(from, &n);
    write_bytes(to, b, n);
    free(b);
}

static void test_heads_from_config_json(void **state)
{
    (void)state;
    char *dir = support_temp_dir("spmd-weights");
    char src[PATH], file[PATH], config[PATH];
    copy_file(vector_path(src, HF_FILE), support_path_in(file, dir, "model.safetensors"));
    support_path_in(config, dir, "config.json");
    write_text(config, "{\"model_type\": \"gpt2\", \"n_head\": 2, \"n_embd\": 16, \"n_layer\": 2}");
    spmd_weights_info info = inspect_ok(file);
    expect_shape(&info.config, 2);
    assert_int_equal(info.heads_from, SPMD_HEADS_CONFIG_JSON);

    /* A config.json of another model is not taken for this one's. */
    write_text(config, "{\"n_head\": 12, \"n_embd\": 768, \"n_layer\": 12}");
    spmd_weights_info bad;
    expect_error(spmd_weights_inspect(file, &bad), config, "n_embd 768", "dim 16");
    write_text(config, "{\"n_head\": \"two\"}");
    expect_error(spmd_weights_inspect(file, &bad), config, "n_head", NULL);
    write_text(config, "{\"n_head\": 3}");
    expect_error(spmd_weights_inspect(file, &bad), "3 heads", "dim 16", NULL);
    support_drop_dir(dir);
}

/* dim 64 without metadata: GPT-2's head size gives one head; a file
 * libspmd wrote records its heads in the metadata. */
static void test_heads_from_gpt2_rule_and_metadata(void **state)
{
    (void)state;
    char *dir = support_temp_dir("spmd-weights");
    char saved[PATH], plain[PATH];
    spmd_gpt_config cfg = {.vocab = 5, .seq = 2, .context = 3, .layers = 1, .heads = 2, .dim = 64};
    model md;
    model_build(&md, cfg, 1, NULL, NULL, 1);
    assert_int_equal(spmd_weights_save(md.p, &cfg, SPMD_WEIGHTS_HF, support_path_in(saved, dir, "a.st")),
                     SPMD_OK);
    spmd_weights_info info = inspect_ok(saved);
    assert_int_equal(info.heads_from, SPMD_HEADS_FILE);
    assert_int_equal(info.config.heads, 2);
    st_file f;
    st_load(saved, &f);
    st_save(support_path_in(plain, dir, "b.st"), &f);
    st_free(&f);
    info = inspect_ok(plain);
    assert_int_equal(info.heads_from, SPMD_HEADS_GPT2_RULE);
    assert_int_equal(info.config.heads, 1);
    assert_int_equal(info.config.context, 3);
    model_free(&md);
    support_drop_dir(dir);
}

/* ---- Refusals ---------------------------------------------------------------------------- */

/* A load refuses the file at `path` with a message naming it and a, b. */
static void expect_load_refused(const char *path, const char *a, const char *b)
{
    tv_file v;
    tv_load_case("gpt_weights", &v);
    model md;
    model_build(&md, vector_config(&v), 1, NULL, NULL, 3);
    expect_error(spmd_weights_load(md.p, &md.cfg, path), path, a, b);
    model_free(&md);
    tv_free(&v);
}

/* Inspect refuses it too: it reads every header, not the data. */
static void expect_refused(const char *path, const char *a, const char *b)
{
    spmd_weights_info info;
    expect_error(spmd_weights_inspect(path, &info), path, a, b);
    expect_load_refused(path, a, b);
}

/* The committed file `name` cut to `keep` bytes (or, keep < 0, short by
 * -keep) into dir/name. */
static const char *cut_copy(const char *dir, const char *name, long keep, char *out)
{
    char src[PATH];
    size_t n;
    unsigned char *b = read_bytes(vector_path(src, name), &n);
    size_t len = keep < 0 ? n - (size_t)-keep : (size_t)keep;
    write_bytes(support_path_in(out, dir, name), b, len);
    free(b);
    return out;
}

static void test_refuses_missing_and_truncated_files(void **state)
{
    (void)state;
    char *dir = support_temp_dir("spmd-weights");
    char p[PATH];
    expect_refused(support_path_in(p, dir, "none.safetensors"), "cannot open", "No such file");
    expect_refused(cut_copy(dir, HF_FILE, -100, p), "truncated: 37092 bytes", "up to byte 37192");
    expect_refused(cut_copy(dir, HF_FILE, 20, p), "not a valid safetensors file",
                   "past the end");
    expect_refused(cut_copy(dir, LLMC_FILE, -4, p), "truncated", "36604 bytes");
    expect_refused(cut_copy(dir, LLMC_FILE, 500, p), "truncated", "1024-byte header");
    expect_refused(cut_copy(dir, LLMC_FILE, 3, p), "too short", NULL);
    /* Trailing bytes: not the file its header describes. */
    char src[PATH];
    size_t n;
    unsigned char *b = read_bytes(vector_path(src, LLMC_FILE), &n);
    unsigned char *longer = calloc(n + 8, 1);
    memcpy(longer, b, n);
    write_bytes(support_path_in(p, dir, "long.bin"), longer, n + 8);
    expect_refused(p, "longer than its header says", NULL);
    free(b);
    free(longer);
    support_drop_dir(dir);
}

static void llmc_with_header_int(const char *dir, int index, int32_t value, char *out)
{
    char src[PATH];
    size_t n;
    unsigned char *b = read_bytes(vector_path(src, LLMC_FILE), &n);
    for (int i = 0; i < 4; i++) b[4 * index + i] = (unsigned char)((uint32_t)value >> (8 * i));
    write_bytes(support_path_in(out, dir, "edited.bin"), b, n);
    free(b);
}

static void test_refuses_wrong_magic_and_version(void **state)
{
    (void)state;
    char *dir = support_temp_dir("spmd-weights");
    char p[PATH];
    unsigned char junk[2048];
    memset(junk, 'x', sizeof junk);
    write_bytes(support_path_in(p, dir, "junk.bin"), junk, sizeof junk);
    expect_refused(p, "neither a safetensors file", "78 78 78 78");
    llmc_with_header_int(dir, 0, 20240520, p);
    expect_refused(p, "token shard", NULL);
    llmc_with_header_int(dir, 0, 20240327, p);
    expect_refused(p, "neither", NULL);
    llmc_with_header_int(dir, 1, 2, p);
    expect_refused(p, "version 2", "versions 1 and 3");
    llmc_with_header_int(dir, 1, 5, p);
    expect_refused(p, "version 5", "bf16");
    /* A header of no valid GPT. */
    llmc_with_header_int(dir, 5, 3, p); /* 3 heads do not divide dim 16 */
    expect_refused(p, "no valid GPT", "multiple of heads");
    llmc_with_header_int(dir, 7, 30, p); /* Vp below V */
    expect_refused(p, "pads the vocabulary 37 to 30 rows", NULL);
    support_drop_dir(dir);
}

/* The committed HF file with `edit` applied, into dir/edited.safetensors. */
typedef void (*st_edit)(st_file *f);

static const char *edited_hf(const char *dir, st_edit edit, char *out)
{
    char src[PATH];
    st_file f;
    st_load(vector_path(src, HF_FILE), &f);
    edit(&f);
    st_save(support_path_in(out, dir, "edited.safetensors"), &f);
    st_free(&f);
    return out;
}

static void drop_fc_bias(st_file *f) { st_remove(f, "transformer.h.1.mlp.c_fc.bias"); }

static void drop_wte(st_file *f)
{
    st_remove(f, "transformer.wte.weight");
    st_remove(f, "lm_head.weight");
}

static void unflip_c_attn(st_file *f)
{
    /* libspmd's layout, not Conv1D's: the bytes fit, the shape does not. */
    st_tensor *t = st_get(f, "transformer.h.0.attn.c_attn.weight");
    int64_t r = t->shape[0];
    t->shape[0] = t->shape[1];
    t->shape[1] = r;
}

static void wte_as_bf16(st_file *f)
{
    st_tensor *t = st_get(f, "transformer.wte.weight");
    t->dtype = SPMD_BF16;
    t->bytes /= 2;
}

static void add_unknown(st_file *f)
{
    st_tensor *t = &f->t[f->n++];
    *t = (st_tensor){.name = "transformer.h.0.attn.extra", .dtype = SPMD_F32, .rank = 1,
                     .shape = {1}, .bytes = 4};
    t->data = calloc(1, 4);
}

static void untie_head(st_file *f)
{
    st_tensor *t = st_get(f, "lm_head.weight");
    float *v = (float *)(void *)t->data;
    v[5 * 16 + 3] += 1.0f;
}

static void test_refuses_bad_tensors(void **state)
{
    (void)state;
    char *dir = support_temp_dir("spmd-weights");
    char p[PATH];
    expect_refused(edited_hf(dir, drop_fc_bias, p), "'transformer.h.1.mlp.c_fc.bias' is missing",
                   NULL);
    expect_refused(edited_hf(dir, drop_wte, p), "'wte.weight' is missing", NULL);
    expect_refused(edited_hf(dir, unflip_c_attn, p),
                   "'transformer.h.0.attn.c_attn.weight' has shape [48, 16]",
                   "needs [16, 48] (Conv1D's [in, out])");
    expect_refused(edited_hf(dir, wte_as_bf16, p), "'transformer.wte.weight' has dtype BF16",
                   "F32 weights only");
    expect_refused(edited_hf(dir, add_unknown, p), "'transformer.h.0.attn.extra' is not part of "
                   "a GPT-2", NULL);
    expect_load_refused(edited_hf(dir, untie_head, p), "lm_head.weight differs from wte.weight",
                   "row 5, column 3");
    support_drop_dir(dir);
}

/* A refused load leaves every parameter as it was. */
static void test_refused_load_changes_nothing(void **state)
{
    (void)state;
    tv_file v;
    tv_load_case("gpt_weights", &v);
    char *dir = support_temp_dir("spmd-weights");
    char p[PATH];
    model md;
    model_build(&md, vector_config(&v), 2, "4x2", "replica,fsdp", 3);
    size_t n0, n1;
    float *before = read_params(&md, &n0);
    /* Found only after every parameter was read: the head is checked last. */
    assert_int_not_equal(spmd_weights_load(md.p, &md.cfg, edited_hf(dir, untie_head, p)), SPMD_OK);
    float *after = read_params(&md, &n1);
    assert_int_equal(n0, n1);
    assert_memory_equal(before, after, n0);
    free(after);
    assert_int_not_equal(spmd_weights_load(md.p, &md.cfg, edited_hf(dir, drop_fc_bias, p)), SPMD_OK);
    after = read_params(&md, &n1);
    assert_memory_equal(before, after, n0);
    free(after);
    free(before);
    model_free(&md);
    support_drop_dir(dir);
    tv_free(&v);
}

static void test_refuses_a_program_of_another_shape(void **state)
{
    (void)state;
    tv_file v;
    tv_load_case("gpt_weights", &v);
    char path[PATH];
    spmd_gpt_config cfg = vector_config(&v);
    cfg.layers = 1;
    model md;
    model_build(&md, cfg, 1, NULL, NULL, 3);
    expect_error(spmd_weights_load(md.p, &md.cfg, vector_path(path, HF_FILE)), path, "2 layers",
                 "1 layer");
    model_free(&md);

    cfg = vector_config(&v);
    cfg.heads = 4;
    model_build(&md, cfg, 1, NULL, NULL, 3);
    expect_error(spmd_weights_load(md.p, &md.cfg, vector_path(path, LLMC_FILE)), path,
                 "records 2 heads", "has 4");
    /* Safetensors files without heads take any. */
    load_ok(&md, vector_path(path, HF_FILE));
    /* A config that is not the program's. */
    spmd_gpt_config other = md.cfg;
    other.dim = 32;
    other.heads = 2;
    expect_error(spmd_weights_load(md.p, &other, path), "no f32 parameter 'wte.weight' [37, 32]",
                 NULL, NULL);
    expect_error(spmd_weights_load(NULL, &md.cfg, path), NULL, NULL, NULL);
    model_free(&md);
    tv_free(&v);
}

/* ---- Save --------------------------------------------------------------------------------- */

static const spmd_gpt_config SMALL = {.vocab = 37, .seq = 8, .context = 16, .layers = 2,
                                      .heads = 2, .dim = 16};

static int32_t le32_at(const unsigned char *b, int i)
{
    return (int32_t)((uint32_t)b[4 * i] | (uint32_t)b[4 * i + 1] << 8 |
                     (uint32_t)b[4 * i + 2] << 16 | (uint32_t)b[4 * i + 3] << 24);
}

/* Version 3, the shape in the header, wte padded to 128 zero rows. */
static void expect_llmc_layout(const char *path, const spmd_gpt_config *c)
{
    size_t n;
    unsigned char *b = read_bytes(path, &n);
    int32_t want[8] = {20240326, 3, c->context, c->vocab, c->layers, c->heads, c->dim, 128};
    for (int i = 0; i < 8; i++) assert_int_equal(le32_at(b, i), want[i]);
    for (int i = 8; i < 256; i++) assert_int_equal(le32_at(b, i), 0);
    spmd_gpt_config padded = *c;
    padded.vocab = 128;
    assert_int_equal(n, 1024 + 4 * (size_t)spmd_gpt_param_count(&padded));
    for (size_t i = 1024 + 4 * (size_t)c->vocab * (size_t)c->dim; i < 1024 + 4 * 128 * 16; i++)
        if (b[i]) fail_msg("padding byte %zu is %d", i, b[i]);
    free(b);
}

static void test_save_round_trips_bits(void **state)
{
    (void)state;
    char *dir = support_temp_dir("spmd-weights");
    char hf[PATH], llmc[PATH];
    model src, dst;
    model_build(&src, SMALL, 8, "4x2", "replica,fsdp", 11);
    assert_int_equal(spmd_weights_save(src.p, &SMALL, SPMD_WEIGHTS_HF, support_path_in(hf, dir, "m.safetensors")),
                     SPMD_OK);
    assert_int_equal(spmd_weights_save(src.p, &SMALL, SPMD_WEIGHTS_LLMC, support_path_in(llmc, dir, "m.bin")),
                     SPMD_OK);
    assert_int_equal(support_count_entries(dir, "."), 2); /* "." and "..": no temporary left */
    expect_llmc_layout(llmc, &SMALL);
    spmd_weights_info info = inspect_ok(hf);
    assert_int_equal(info.heads_from, SPMD_HEADS_FILE);
    assert_int_equal(info.config.heads, 2);

    /* The names and layouts of Hugging Face's gpt2: no prefix, no lm_head,
     * Conv1D weights [in, out]. */
    st_file f;
    st_load(hf, &f);
    assert_int_equal(f.n, 4 + 12 * SMALL.layers);
    st_tensor *fc = st_get(&f, "h.1.mlp.c_fc.weight");
    assert_int_equal(fc->shape[0], 16);
    assert_int_equal(fc->shape[1], 64);
    st_free(&f);

    const char *files[] = {hf, llmc};
    for (int i = 0; i < 2; i++) {
        model_build(&dst, SMALL, 1, NULL, NULL, 12);
        load_ok(&dst, files[i]);
        expect_same_params(&src, &dst);
        model_free(&dst);
        model_build(&dst, SMALL, 4, "2x2", "replica,fsdp", 13);
        load_ok(&dst, files[i]);
        expect_same_params(&src, &dst);
        model_free(&dst);
    }
    model_free(&src);
    support_drop_dir(dir);
}

static void test_save_refusals_leave_nothing(void **state)
{
    (void)state;
    char *dir = support_temp_dir("spmd-weights");
    char p[PATH];
    model md;
    model_build(&md, SMALL, 1, NULL, NULL, 1);
    expect_error(spmd_weights_save(md.p, &SMALL, SPMD_WEIGHTS_HF, support_path_in(p, dir, "no/such/x")),
                 "cannot create", "no/such", NULL);
    expect_error(spmd_weights_save(md.p, &SMALL, (spmd_weights_format)7, support_path_in(p, dir, "x")),
                 "unknown format 7", NULL, NULL);
    spmd_gpt_config wrong = SMALL;
    wrong.layers = 3;
    expect_error(spmd_weights_save(md.p, &wrong, SPMD_WEIGHTS_HF, support_path_in(p, dir, "x")),
                 "no f32 parameter 'h.2.ln_1.weight'", NULL, NULL);
    expect_error(spmd_weights_save(md.p, &SMALL, SPMD_WEIGHTS_HF, dir), "names a directory", NULL,
                 NULL);
    assert_int_equal(support_count_entries(dir, ""), 2); /* nothing but "." and ".." */
    model_free(&md);
    support_drop_dir(dir);
}

/* ---- Export from checkpoints ------------------------------------------------------------- */

static const char *META =
    "{\"config\":{\"model\":\"gpt\",\"vocab\":37,\"seq\":8,\"context\":16,\"layers\":2,"
    "\"heads\":2,\"dim\":16},\"data\":{\"batch\":8}}";

static void test_export_round_trips(void **state)
{
    (void)state;
    char *dir = support_temp_dir("spmd-weights");
    char ckpt[PATH], ckpt2[PATH], out1[PATH], out2[PATH], out3[PATH];
    model src, dst;
    model_build(&src, SMALL, 8, "4x2", "replica,fsdp", 21);
    assert_int_equal(spmd_checkpoint_save(src.p, support_path_in(ckpt, dir, "ckpt"), 7, META, 0), SPMD_OK);

    spmd_gpt_config cfg;
    int64_t step = -1;
    if (spmd_weights_export(ckpt, SPMD_WEIGHTS_HF, support_path_in(out1, dir, "a.safetensors"), &cfg,
                            &step) != SPMD_OK)
        fail_msg("export: %s", spmd_last_error());
    assert_int_equal(step, 7);
    assert_int_equal(cfg.context, 16);
    assert_int_equal(cfg.seq, 8);
    assert_int_equal(cfg.heads, 2);
    assert_int_equal(spmd_weights_export(ckpt, SPMD_WEIGHTS_LLMC, support_path_in(out2, dir, "a.bin"), NULL,
                                         NULL),
                     SPMD_OK);
    expect_llmc_layout(out2, &SMALL);

    /* Into a one-device model: the checkpoint's bits; saved again and
     * exported again: the same file. */
    model_build(&dst, SMALL, 1, NULL, NULL, 22);
    load_ok(&dst, out1);
    expect_same_params(&src, &dst);
    assert_int_equal(spmd_checkpoint_save(dst.p, support_path_in(ckpt2, dir, "ckpt2"), 1, META, 0), SPMD_OK);
    assert_int_equal(spmd_weights_export(ckpt2, SPMD_WEIGHTS_HF, support_path_in(out3, dir, "b.safetensors"),
                                         NULL, NULL),
                     SPMD_OK);
    size_t n1, n3;
    unsigned char *b1 = read_bytes(out1, &n1), *b3 = read_bytes(out3, &n3);
    assert_int_equal(n1, n3);
    assert_memory_equal(b1, b3, n1);
    free(b1);
    free(b3);
    load_ok(&dst, out2);
    expect_same_params(&src, &dst);
    model_free(&dst);
    model_free(&src);
    support_drop_dir(dir);
}

static void export_refused(const char *ckpt, const char *meta, const char *a, const char *b)
{
    char *dir = support_temp_dir("spmd-weights");
    char out[PATH];
    if (meta) {
        model md;
        model_build(&md, SMALL, 1, NULL, NULL, 1);
        assert_int_equal(spmd_checkpoint_save(md.p, ckpt, 1, meta, 0), SPMD_OK);
        model_free(&md);
    }
    expect_error(spmd_weights_export(ckpt, SPMD_WEIGHTS_HF, support_path_in(out, dir, "x"), NULL, NULL),
                 ckpt, a, b);
    assert_int_equal(support_count_entries(dir, ""), 2);
    support_drop_dir(dir);
}

static void test_export_refusals(void **state)
{
    (void)state;
    char *dir = support_temp_dir("spmd-weights");
    char p[PATH];
    export_refused(support_path_in(p, dir, "none"), NULL, "not a checkpoint", NULL);
    export_refused(support_path_in(p, dir, "a"), "{\"data\":{}}", "no meta.config", NULL);
    export_refused(support_path_in(p, dir, "b"), "{\"config\":{\"model\":\"mlp\",\"vocab\":37}}",
                   "model 'mlp'", "only a GPT");
    export_refused(support_path_in(p, dir, "c"),
                   "{\"config\":{\"model\":\"gpt\",\"vocab\":37,\"seq\":8,\"layers\":2,\"dim\":16}}",
                   "meta.config.heads", NULL);
    /* A configuration the saved tensors do not fit. */
    export_refused(support_path_in(p, dir, "d"),
                   "{\"config\":{\"model\":\"gpt\",\"vocab\":37,\"seq\":8,\"context\":16,"
                   "\"layers\":3,\"heads\":2,\"dim\":16}}",
                   "h.2.", NULL);
    support_drop_dir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hf_matches_torch),
        cmocka_unit_test(test_llmc_matches_torch),
        cmocka_unit_test(test_hf_matches_torch_on_4x2_fsdp),
        cmocka_unit_test(test_llmc_matches_torch_on_4x2_fsdp),
        cmocka_unit_test(test_inspect_finds_format_and_shape),
        cmocka_unit_test(test_heads_from_config_json),
        cmocka_unit_test(test_heads_from_gpt2_rule_and_metadata),
        cmocka_unit_test(test_refuses_missing_and_truncated_files),
        cmocka_unit_test(test_refuses_wrong_magic_and_version),
        cmocka_unit_test(test_refuses_bad_tensors),
        cmocka_unit_test(test_refused_load_changes_nothing),
        cmocka_unit_test(test_refuses_a_program_of_another_shape),
        cmocka_unit_test(test_save_round_trips_bits),
        cmocka_unit_test(test_save_refusals_leave_nothing),
        cmocka_unit_test(test_export_round_trips),
        cmocka_unit_test(test_export_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
