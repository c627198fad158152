/*
 * Sharded checkpoints (spmd/checkpoint.h), on an MLP with FSDP marks over a
 * 4x2 mesh ('replica', 'fsdp') and AdamW state (hidden width 31, so every
 * split over 'fsdp' is uneven), after two steps:
 *   - loaded into a fresh program on the same mesh, every parameter and
 *     state tensor is bit-identical, and so is the next step's loss; every
 *     device writes a share, each block once;
 *   - on a data-parallel mesh (4 devices, everything replicated) the
 *     bytes are spread evenly over all four files, and load bit-identically
 *     onto 1, 4x2 and 2x2 meshes;
 *   - loaded onto meshes 1, 8 ('data'), 2x4 and 2x2x2 (FSDP over one axis),
 *     every tensor read whole is bit-identical (resharding moves data
 *     exactly), and the loss after one more update agrees within rounding;
 *   - uneven splits, blocks of padding only, a scalar and a mesh with
 *     permuted device ids round-trip, and device padding stays zero;
 *   - refusals leave the program untouched and name the file and cause:
 *     a missing file, a truncated one, a flipped byte (crc32), an index of
 *     another version, a shape that differs, a tensor the checkpoint lacks,
 *     no checkpoint, a `latest` that names no step; bad save arguments;
 *     a file cut short after the checks (the load hook) is an error that
 *     says the program is partly loaded;
 *   - the save hook sees each file once, then the index, the step
 *     directory and `latest`, in that order;
 *   - atomicity: a writer killed after any file (fork, SIGKILL from the
 *     test hook) leaves `latest` at a complete checkpoint that loads; keep=2
 *     deletes older ones only once the new one is complete; a stopped save
 *     leaves nothing behind; a step saved again is replaced whole;
 *   - every allocation of a save and of a load failing in turn is reported,
 *     leaks nothing and leaves the program and the directory as they were;
 *   - the files open with an independent safetensors reader
 *     (tests/support/read_safetensors.py, standard-library Python), whose sums of
 *     each block match the device's block.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "support_files.h"

#include <cJSON.h>
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "runtime/executor.h"
#include "spmd/checkpoint.h"
#include "spmd/mesh.h"
#include "spmd/models.h"
#include "spmd/spmd.h"
#include "spmd/train.h"
#include "support_alloc.h"
#include "train/checkpoint.h"
#include "train/checkpoint_fs.h"
#include "train/checkpoint_hook.h"

#ifndef SPMD_SOURCE_DIR
#error "SPMD_SOURCE_DIR must name the source tree"
#endif

enum { BATCH = 16, IN = 13, CLASSES = 10, PATH = SUPPORT_PATH };

/* ---- Files and directories ------------------------------------------------------------ */

static bool exists(const char *dir, const char *name)
{
    char p[PATH];
    struct stat st;
    return stat(support_path_in(p, dir, name), &st) == 0;
}

static long file_size(const char *path)
{
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    return (long)st.st_size;
}

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    long n = file_size(path);
    char *s = malloc((size_t)n + 1);
    assert_non_null(s);
    assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = '\0';
    fclose(f);
    return s;
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    assert_int_equal(fclose(f), 0);
}

static void expect_latest(const char *dir, const char *step_name)
{
    char p[PATH], want[64];
    char *got = read_text(support_path_in(p, dir, "latest"));
    snprintf(want, sizeof want, "%s\n", step_name);
    assert_string_equal(got, want);
    free(got);
}

/* ---- Programs --------------------------------------------------------------------------- */

typedef struct model {
    spmd_graph *g;
    spmd_mesh *m;
    spmd_mlp_tensors t;
    spmd_trainer *tr;
    spmd_program *p;
} model;

typedef struct model_opts {
    const char *mesh, *axes, *fsdp; /* no mesh: one device; no fsdp: data-parallel */
    int hidden;
    bool sgd; /* SGD with momentum, not AdamW */
    bool zero_off; /* every replica holds all the optimizer state (ZeRO is the default) */
    uint64_t seed;
    const spmd_allocator *alloc; /* NULL: malloc */
} model_opts;

static const model_opts FSDP_4X2 = {
    .mesh = "4x2", .axes = "replica,fsdp", .fsdp = "fsdp", .hidden = 31, .seed = 7};

static void model_build(model *md, model_opts o)
{
    memset(md, 0, sizeof *md);
    md->g = spmd_graph_create(o.alloc);
    assert_non_null(md->g);
    spmd_mlp_config cfg = {.in_dim = IN, .hidden = o.hidden, .layers = 2, .out_dim = CLASSES};
    if (spmd_mlp_build(md->g, &cfg, NULL, BATCH, &md->t) != SPMD_OK ||
        spmd_mlp_add_loss(md->g, SPMD_MLP_CROSS_ENTROPY, &md->t) != SPMD_OK)
        fail_msg("mlp: %s", spmd_last_error());
    if (o.mesh) {
        md->m = spmd_mesh_parse(o.mesh, o.axes);
        assert_non_null(md->m);
        spmd_tensor *in[] = {md->t.input, md->t.targets};
        if ((o.fsdp ? spmd_fsdp_wrap(md->g, md->m, o.fsdp, in, 2, NULL)
                    : spmd_shard_batch(md->g, md->m, in, 2, NULL)) != SPMD_OK)
            fail_msg("fsdp: %s", spmd_last_error());
    }
    spmd_trainer_options opts = {.compile = {.threads = 2, .seed = o.seed}};
    opts.optimizer = o.sgd ? (spmd_optimizer){.kind = SPMD_OPTIMIZER_SGD, .momentum = 0.9f}
                           : (spmd_optimizer){.kind = SPMD_OPTIMIZER_ADAMW,
                                              .weight_decay = 0.01f,
                                              .clip_norm = 1.0f};
    if (o.zero_off) opts.optimizer.zero = SPMD_ZERO_OFF;
    md->tr = spmd_trainer_create(md->g, md->t.loss, &opts);
    if (!md->tr) fail_msg("trainer: %s", spmd_last_error());
    md->p = spmd_trainer_program(md->tr);
}

static void model_free(model *md)
{
    spmd_trainer_free(md->tr);
    spmd_graph_free(md->g);
    spmd_mesh_free(md->m);
}

/* One step on batch `step`: the same data on any mesh. */
static float model_step(model *md, int step)
{
    float x[BATCH * IN];
    int32_t y[BATCH];
    for (int i = 0; i < BATCH * IN; i++) x[i] = sinf(0.37f * (float)i + 1.3f * (float)step);
    for (int i = 0; i < BATCH; i++) y[i] = (int32_t)((i * 7 + step * 3) % CLASSES);
    assert_int_equal(spmd_program_set_input(md->p, md->t.input, x, sizeof x), SPMD_OK);
    assert_int_equal(spmd_program_set_input(md->p, md->t.targets, y, sizeof y), SPMD_OK);
    float loss;
    if (spmd_trainer_step(md->tr, 1e-2f, &loss, NULL) != SPMD_OK)
        fail_msg("step: %s", spmd_last_error());
    assert_true(isfinite(loss));
    return loss;
}

static void save_ok(const spmd_program *p, const char *dir, int64_t step, const char *meta,
                    int keep)
{
    if (spmd_checkpoint_save(p, dir, step, meta, keep) != SPMD_OK)
        fail_msg("save step %lld: %s", (long long)step, spmd_last_error());
}

static int64_t load_ok(spmd_program *p, const char *dir)
{
    int64_t step = -1;
    if (spmd_checkpoint_load(p, dir, &step, NULL) != SPMD_OK)
        fail_msg("load %s: %s", dir, spmd_last_error());
    return step;
}

/* Every parameter and state tensor of (g, p), whole, one after another in
 * graph order; *bytes their size. */
static unsigned char *read_all(const spmd_graph *g, const spmd_program *p, size_t *bytes)
{
    size_t n = 0;
    for (int i = 0; i < spmd_graph_tensor_count(g); i++) {
        const spmd_tensor *t = spmd_graph_tensor(g, i);
        if (executor_keeps(p, t)) n += (size_t)spmd_tensor_numel(t) * 4;
    }
    unsigned char *all = malloc(n ? n : 1), *at = all;
    assert_non_null(all);
    for (int i = 0; i < spmd_graph_tensor_count(g); i++) {
        const spmd_tensor *t = spmd_graph_tensor(g, i);
        if (!executor_keeps(p, t)) continue;
        size_t size = (size_t)spmd_tensor_numel(t) * 4;
        assert_int_equal(spmd_program_read(p, t, at, size), SPMD_OK);
        at += size;
    }
    *bytes = n;
    return all;
}

/* Every kept tensor of a has the same bits in b (found by name), and b
 * keeps no others. */
static void expect_same_values(const spmd_graph *ga, const spmd_program *pa, const spmd_graph *gb,
                               const spmd_program *pb)
{
    int n = 0, nb = 0;
    for (int i = 0; i < spmd_graph_tensor_count(ga); i++) {
        const spmd_tensor *t = spmd_graph_tensor(ga, i);
        if (!executor_keeps(pa, t)) continue;
        const spmd_tensor *u = spmd_graph_find(gb, spmd_tensor_name(t));
        if (!u || !executor_keeps(pb, u))
            fail_msg("'%s' is not kept by the other program", spmd_tensor_name(t));
        size_t count = (size_t)spmd_tensor_numel(t);
        float *x = malloc(count * 4 + 4), *y = malloc(count * 4 + 4);
        assert_non_null(x);
        assert_non_null(y);
        assert_int_equal(spmd_program_read(pa, t, x, count * 4), SPMD_OK);
        assert_int_equal(spmd_program_read(pb, u, y, count * 4), SPMD_OK);
        for (size_t k = 0; k < count; k++)
            if (memcmp(&x[k], &y[k], 4) != 0)
                fail_msg("'%s'[%zu]: %.9g, loaded %.9g", spmd_tensor_name(t), k, x[k], y[k]);
        free(x);
        free(y);
        n++;
    }
    for (int i = 0; i < spmd_graph_tensor_count(gb); i++)
        nb += executor_keeps(pb, spmd_graph_tensor(gb, i));
    assert_true(n > 0);
    assert_int_equal(n, nb);
}

/* Every device's padding (elements past the valid extent) is zero. */
static void expect_zero_padding(const spmd_graph *g, const spmd_program *p)
{
    for (int i = 0; i < spmd_graph_tensor_count(g); i++) {
        const spmd_tensor *t = spmd_graph_tensor(g, i);
        if (!executor_keeps(p, t)) continue;
        for (int d = 0; d < spmd_program_devices(p); d++) {
            executor_block b;
            assert_int_equal(executor_block_of(p, t, d, 0, &b), SPMD_OK);
            int64_t n = 1, idx[SPMD_MAX_RANK] = {0};
            for (int k = 0; k < b.rank; k++) n *= b.ldims[k];
            for (int64_t e = 0; e < n; e++) {
                bool pad = false;
                for (int k = 0; k < b.rank; k++) pad |= idx[k] >= b.valid[k];
                if (pad && ((const float *)b.data)[e] != 0.0f)
                    fail_msg("'%s' on device %d: padding element %lld is %g", spmd_tensor_name(t),
                             b.device, (long long)e, ((const float *)b.data)[e]);
                for (int k = b.rank - 1; k >= 0 && ++idx[k] == b.ldims[k]; k--) idx[k] = 0;
            }
        }
    }
}

/* What index.json says of the files: each file's data bytes (the real
 * bytes of the blocks it holds), the number of blocks, the largest. */
typedef struct shares {
    int n_files, n_blocks;
    char names[16][32];
    double bytes[16];
    double largest, total;
} shares;

static void read_shares(const char *step_dir, shares *out)
{
    char p[PATH];
    memset(out, 0, sizeof *out);
    char *text = read_text(support_path_in(p, step_dir, "index.json"));
    cJSON *index = cJSON_Parse(text);
    free(text);
    assert_non_null(index);
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(index, "files"), *f, *t, *b, *x;
    cJSON_ArrayForEach(f, files) {
        assert_true(out->n_files < 16);
        snprintf(out->names[out->n_files++], 32, "%s", f->string);
    }
    cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(index, "tensors")) {
        cJSON_ArrayForEach(b, cJSON_GetObjectItemCaseSensitive(t, "blocks")) {
            double n = 4; /* F32 and I32 */
            cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(b, "shape")) n *= x->valuedouble;
            const char *file = cJSON_GetObjectItemCaseSensitive(b, "file")->valuestring;
            int i = 0;
            while (i < out->n_files && strcmp(out->names[i], file)) i++;
            if (i == out->n_files)
                fail_msg("a block of '%s' is in %s, not listed", t->string, file);
            out->bytes[i] += n;
            out->total += n;
            if (n > out->largest) out->largest = n;
            out->n_blocks++;
        }
    }
    cJSON_Delete(index);
}

/* ---- (a) The same mesh ------------------------------------------------------------------ */

static void test_same_mesh_round_trip(void **state)
{
    (void)state;
    char *dir = support_temp_dir("spmd-ckpt"), p[PATH];
    model a, b;
    model_build(&a, FSDP_4X2);
    model_step(&a, 0);
    model_step(&a, 1);
    save_ok(a.p, dir, 2, "{\"data_position\": 32, \"note\": \"x\"}", 0);

    model_opts fresh = FSDP_4X2;
    fresh.seed = 99;
    model_build(&b, fresh);
    /* Another seed: nothing matches until loaded. */
    size_t bytes;
    unsigned char *va = read_all(a.g, a.p, &bytes), *vb = read_all(b.g, b.p, &bytes);
    assert_true(memcmp(va, vb, bytes) != 0);
    free(va);
    free(vb);
    int64_t step = -1;
    char *meta = NULL;
    if (spmd_checkpoint_load(b.p, dir, &step, &meta) != SPMD_OK)
        fail_msg("load: %s", spmd_last_error());
    assert_int_equal(step, 2);
    assert_non_null(meta);
    assert_string_equal(meta, "{\"data_position\":32,\"note\":\"x\"}");
    free(meta);
    expect_same_values(a.g, a.p, b.g, b.p);
    expect_zero_padding(b.g, b.p);

    /* The next step from the loaded state is the original's, bit for bit. */
    float la = model_step(&a, 2), lb = model_step(&b, 2);
    if (memcmp(&la, &lb, sizeof la) != 0) fail_msg("next loss %.9g, after loading %.9g", la, lb);
    expect_same_values(a.g, a.p, b.g, b.p);

    /* FSDP over 'fsdp' on 4x2: each distinct block is held by the 4
     * replicas of its 'fsdp' index, and written by one of them: all 8
     * devices write a share. */
    support_path_in(p, dir, "step-00000002");
    assert_true(exists(p, "index.json"));
    shares sh;
    read_shares(p, &sh);
    assert_int_equal(sh.n_files, 8);
    assert_int_equal(support_count_entries(p, "dev-"), 8);
    for (int d = 0; d < 8; d++) {
        char name[32];
        snprintf(name, sizeof name, "dev-%04d.safetensors", d);
        assert_true(exists(p, name));
    }
    expect_latest(dir, "step-00000002");
    model_free(&a);
    model_free(&b);
    support_drop_dir(dir);
}

/* ---- (b) Other meshes --------------------------------------------------------------------- */

static void test_reshard_on_load(void **state)
{
    (void)state;
    static const model_opts targets[] = {
        {.hidden = 31, .seed = 99},
        {.mesh = "8", .axes = "data", .fsdp = "data", .hidden = 31, .seed = 99},
        {.mesh = "2x4", .axes = "replica,fsdp", .fsdp = "fsdp", .hidden = 31, .seed = 99},
        {.mesh = "2x2x2", .axes = "a,b,c", .fsdp = "b", .hidden = 31, .seed = 99},
    };
    enum { N = sizeof targets / sizeof targets[0] };
    char *dir = support_temp_dir("spmd-ckpt"), *again = support_temp_dir("spmd-ckpt");
    model a;
    model_build(&a, FSDP_4X2);
    model_step(&a, 0);
    model_step(&a, 1);
    save_ok(a.p, dir, 2, NULL, 0);
    float next[N];
    for (int i = 0; i < N; i++) {
        model b, c;
        model_build(&b, targets[i]);
        assert_int_equal(load_ok(b.p, dir), 2);
        expect_same_values(a.g, a.p, b.g, b.p);
        expect_zero_padding(b.g, b.p);
        /* And back: saved from this mesh, loaded onto 4x2. */
        save_ok(b.p, again, 2 + i, NULL, 1);
        model_opts back = FSDP_4X2;
        back.seed = 5;
        model_build(&c, back);
        assert_int_equal(load_ok(c.p, again), 2 + i);
        expect_same_values(a.g, a.p, c.g, c.p);
        /* The loss after one update, which reads the loaded optimizer state. */
        model_step(&b, 2);
        next[i] = model_step(&b, 3);
        model_free(&b);
        model_free(&c);
    }
    /* keep=1: only the newest of the saves above is left. */
    assert_int_equal(support_count_entries(again, "step-"), 1);
    /* Other meshes sum in another order: the same loss within rounding. */
    model_step(&a, 2);
    float want = model_step(&a, 3);
    for (int i = 0; i < N; i++)
        if (fabsf(next[i] - want) > 1e-5f * fabsf(want) + 1e-6f)
            fail_msg("mesh %s: next loss %.9g, on 4x2 %.9g",
                     targets[i].mesh ? targets[i].mesh : "1", next[i], want);
    model_free(&a);
    support_drop_dir(dir);
    support_drop_dir(again);
}

/* A data-parallel mesh without ZeRO holds every block on all 4 devices: the blocks
 * are spread over all four files (each within one block of an even
 * share), and load bit-identically onto other meshes. */
static void test_replicated_spread(void **state)
{
    (void)state;
    static const model_opts DATA_4 = {.mesh = "4", .axes = "data", .hidden = 31, .zero_off = true,
                                      .seed = 7};
    static const model_opts targets[] = {
        {.mesh = "4", .axes = "data", .hidden = 31, .seed = 99},
        {.hidden = 31, .seed = 99},
        {.mesh = "4x2", .axes = "replica,fsdp", .fsdp = "fsdp", .hidden = 31, .seed = 99},
        {.mesh = "2x2", .axes = "data,fsdp", .fsdp = "fsdp", .hidden = 31, .seed = 99},
    };
    char *dir = support_temp_dir("spmd-ckpt"), p[PATH];
    model a;
    model_build(&a, DATA_4);
    model_step(&a, 0);
    model_step(&a, 1);
    save_ok(a.p, dir, 2, NULL, 0);
    support_path_in(p, dir, "step-00000002");
    shares sh;
    read_shares(p, &sh);
    assert_int_equal(sh.n_files, 4);
    assert_int_equal(support_count_entries(p, "dev-"), 4);
    /* One block per tensor (all replicated), largest first to the least
     * loaded device: no share is more than a block away from another. */
    int kept = 0;
    for (int i = 0; i < spmd_graph_tensor_count(a.g); i++)
        kept += executor_keeps(a.p, spmd_graph_tensor(a.g, i));
    assert_int_equal(sh.n_blocks, kept);
    double lo = sh.bytes[0], hi = sh.bytes[0];
    for (int i = 0; i < 4; i++) {
        char name[32];
        snprintf(name, sizeof name, "dev-%04d.safetensors", i);
        assert_string_equal(sh.names[i], name);
        lo = sh.bytes[i] < lo ? sh.bytes[i] : lo;
        hi = sh.bytes[i] > hi ? sh.bytes[i] : hi;
    }
    if (hi - lo > sh.largest)
        fail_msg("shares from %.0f to %.0f bytes; the largest block is %.0f", lo, hi, sh.largest);
    assert_true(hi < sh.total / 2);

    for (size_t i = 0; i < sizeof targets / sizeof *targets; i++) {
        model b;
        model_build(&b, targets[i]);
        assert_int_equal(load_ok(b.p, dir), 2);
        expect_same_values(a.g, a.p, b.g, b.p);
        expect_zero_padding(b.g, b.p);
        if (i == 0) {
            /* The same mesh: the next step too, bit for bit. */
            float la = model_step(&a, 2), lb = model_step(&b, 2);
            if (memcmp(&la, &lb, sizeof la) != 0)
                fail_msg("next loss %.9g, after loading %.9g", la, lb);
            expect_same_values(a.g, a.p, b.g, b.p);
            /* Back where a was, for the other meshes. */
            assert_int_equal(load_ok(a.p, dir), 2);
        }
        model_free(&b);
    }
    model_free(&a);
    support_drop_dir(dir);
}

/* ---- (c) Uneven splits ---------------------------------------------------------------------- */

/* w1 [7, 5], w2 [5, 9], w3 [3] and a scalar state s, marked by specs (NULL:
 * unmarked) over mesh m (NULL: one device). */
typedef struct toy {
    spmd_graph *g;
    spmd_mesh *m;
    spmd_program *p;
} toy;

static void toy_build(toy *t, spmd_mesh *m, const char *s1, const char *s2, const char *s3,
                      uint64_t seed)
{
    t->g = spmd_graph_create(NULL);
    t->m = m;
    spmd_graph *g = t->g;
    spmd_init normal = {SPMD_INIT_NORMAL, 1.0f};
    spmd_tensor *w[3] = {spmd_param(g, "w1", 2, (const int64_t[]){7, 5}, normal),
                         spmd_param(g, "w2", 2, (const int64_t[]){5, 9}, normal),
                         spmd_param(g, "w3", 1, (const int64_t[]){3}, normal)};
    spmd_tensor *s = spmd_state(g, "s", 0, NULL, (spmd_init){SPMD_INIT_ONES, 0});
    const char *specs[3] = {s1, s2, s3};
    spmd_tensor *loss = spmd_mul(g, s, s);
    for (int i = 0; i < 3; i++) {
        if (m && specs[i]) assert_int_equal(spmd_mark_sharding(g, w[i], m, specs[i]), SPMD_OK);
        loss = spmd_add(
            g, loss,
            spmd_sum(g, spmd_mul(g, w[i], w[i]), (1u << spmd_tensor_rank(w[i])) - 1, false));
    }
    if (spmd_graph_status(g) != SPMD_OK) fail_msg("toy: %s", spmd_last_error());
    assert_int_equal(spmd_graph_mark_output(g, loss), SPMD_OK);
    t->p = spmd_compile(g, &(spmd_compile_options){.threads = 2, .seed = seed});
    if (!t->p) fail_msg("compile: %s", spmd_last_error());
}

static void toy_free(toy *t)
{
    spmd_program_free(t->p);
    spmd_graph_free(t->g);
    spmd_mesh_free(t->m);
}

/* Blocks index.json lists for tensor `name`. */
static int saved_blocks(const char *step_dir, const char *name)
{
    char p[PATH];
    char *text = read_text(support_path_in(p, step_dir, "index.json"));
    cJSON *index = cJSON_Parse(text);
    free(text);
    assert_non_null(index);
    const cJSON *t =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(index, "tensors"), name);
    assert_non_null(t);
    int n = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(t, "blocks"));
    cJSON_Delete(index);
    return n;
}

static void test_uneven_splits(void **state)
{
    (void)state;
    char *dir = support_temp_dir("spmd-ckpt"), *again = support_temp_dir("spmd-ckpt"), p[PATH];
    toy src;
    toy_build(&src, spmd_mesh_parse("4x2", "replica,fsdp"), "(replica, fsdp), None", "None, fsdp",
              "replica", 1);
    /* Values that make a misplaced element or a zero show. */
    const char *names[] = {"w1", "w2", "w3", "s"};
    for (int i = 0; i < 4; i++) {
        const spmd_tensor *t = spmd_graph_find(src.g, names[i]);
        float v[64];
        for (int k = 0; k < spmd_tensor_numel(t); k++)
            v[k] = 100.0f * (float)(i + 1) + 0.25f * (float)k;
        assert_int_equal(spmd_program_write(src.p, t, v, (size_t)spmd_tensor_numel(t) * 4),
                         SPMD_OK);
    }
    save_ok(src.p, dir, 0, NULL, 0);
    /* 7 rows over 8 devices: the eighth block is padding only, not written;
     * 3 over the 4 replicas likewise; the scalar once. */
    support_path_in(p, dir, "step-00000000");
    assert_int_equal(saved_blocks(p, "w1"), 7);
    assert_int_equal(saved_blocks(p, "w2"), 2);
    assert_int_equal(saved_blocks(p, "w3"), 3);
    assert_int_equal(saved_blocks(p, "s"), 1);

    int ids[] = {3, 1, 2, 0};
    toy dst[3];
    toy_build(&dst[0], NULL, NULL, NULL, NULL, 2);
    toy_build(&dst[1], spmd_mesh_parse("3", "x"), "x, None", "None, x", "x", 2);
    toy_build(&dst[2],
              spmd_mesh_create(2, (const int[]){2, 2}, (const char *const[]){"a", "b"}, ids),
              "(b, a), None", "a, b", NULL, 2);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(load_ok(dst[i].p, dir), 0);
        expect_same_values(src.g, src.p, dst[i].g, dst[i].p);
        expect_zero_padding(dst[i].g, dst[i].p);
    }
    /* From the permuted mesh back onto 4x2. */
    save_ok(dst[2].p, again, 1, NULL, 0);
    toy back;
    toy_build(&back, spmd_mesh_parse("4x2", "replica,fsdp"), "(replica, fsdp), None", "None, fsdp",
              "replica", 3);
    assert_int_equal(load_ok(back.p, again), 1);
    expect_same_values(src.g, src.p, back.g, back.p);
    expect_zero_padding(back.g, back.p);
    for (int i = 0; i < 3; i++) toy_free(&dst[i]);
    toy_free(&back);
    toy_free(&src);
    support_drop_dir(dir);
    support_drop_dir(again);
}

/* ---- (d) Refusals ------------------------------------------------------------------------ */

/* A load of dir into md fails with `want`, a message holding each needle,
 * and md's values, step and meta untouched. */
static void expect_refused(const model *md, const char *dir, spmd_status want, const char *n1,
                           const char *n2, const char *n3)
{
    size_t bytes, after_bytes;
    unsigned char *before = read_all(md->g, md->p, &bytes);
    int64_t step = -7;
    char *meta = (char *)"untouched";
    spmd_status st = spmd_checkpoint_load(md->p, dir, &step, &meta);
    const char *msg = spmd_last_error();
    if (st != want)
        fail_msg("load %s: %s (%s), wanted %s", dir, spmd_status_name(st), msg,
                 spmd_status_name(want));
    const char *needles[] = {n1, n2, n3};
    for (int i = 0; i < 3; i++)
        if (needles[i] && !strstr(msg, needles[i])) fail_msg("'%s' not in: %s", needles[i], msg);
    assert_int_equal(step, -7);
    assert_null(meta);
    unsigned char *after = read_all(md->g, md->p, &after_bytes);
    assert_int_equal(after_bytes, bytes);
    assert_memory_equal(before, after, bytes);
    free(before);
    free(after);
}

static void flip_byte(const char *path, long at)
{
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, at, SEEK_SET), 0);
    int c = fgetc(f);
    assert_true(c != EOF);
    assert_int_equal(fseek(f, at, SEEK_SET), 0);
    fputc(c ^ 0x10, f);
    assert_int_equal(fclose(f), 0);
}

/* The load hook: cut dev-0001.safetensors of the step directory short. */
static void cut_short(void *ctx, const char *step_dir)
{
    char p[PATH];
    (void)ctx;
    assert_int_equal(truncate(support_path_in(p, step_dir, "dev-0001.safetensors"), 16), 0);
}

static void test_refusals(void **state)
{
    (void)state;
    char *dir = support_temp_dir("spmd-ckpt"), case_dir[PATH], step_dir[PATH], p[PATH];
    model a, b;
    model_build(&a, FSDP_4X2);
    model_step(&a, 0);
    model_build(
        &b, (model_opts){
                .mesh = "2x4", .axes = "replica,fsdp", .fsdp = "fsdp", .hidden = 31, .seed = 99});

    const char *cases[] = {"missing", "truncated", "flipped", "version", "negative"};
    for (int i = 0; i < 5; i++) {
        support_path_in(case_dir, dir, cases[i]);
        save_ok(a.p, case_dir, 1, NULL, 0);
        support_path_in(step_dir, case_dir, "step-00000001");
    }
    support_path_in(step_dir, dir, "missing/step-00000001");
    assert_int_equal(unlink(support_path_in(p, step_dir, "dev-0001.safetensors")), 0);
    expect_refused(&b, support_path_in(case_dir, dir, "missing"), SPMD_ERR_IO, "dev-0001.safetensors",
                   "missing", NULL);

    support_path_in(step_dir, dir, "truncated/step-00000001");
    support_path_in(p, step_dir, "dev-0000.safetensors");
    assert_int_equal(truncate(p, file_size(p) - 3), 0);
    expect_refused(&b, support_path_in(case_dir, dir, "truncated"), SPMD_ERR_IO, "dev-0000.safetensors",
                   "truncated", NULL);

    support_path_in(step_dir, dir, "flipped/step-00000001");
    support_path_in(p, step_dir, "dev-0001.safetensors");
    flip_byte(p, file_size(p) - 5);
    expect_refused(&b, support_path_in(case_dir, dir, "flipped"), SPMD_ERR_IO, "dev-0001.safetensors",
                   "crc32", NULL);

    support_path_in(step_dir, dir, "version/step-00000001");
    char *text = read_text(support_path_in(p, step_dir, "index.json"));
    cJSON *index = cJSON_Parse(text);
    free(text);
    cJSON_SetNumberValue(cJSON_GetObjectItemCaseSensitive(index, "version"), 2);
    text = cJSON_Print(index);
    write_text(p, text);
    cJSON_free(text);
    cJSON_Delete(index);
    expect_refused(&b, support_path_in(case_dir, dir, "version"), SPMD_ERR_UNSUPPORTED, "index.json",
                   "version 2", "version 1");

    /* A negative block start is named as such, not as a missing key. */
    support_path_in(step_dir, dir, "negative/step-00000001");
    text = read_text(support_path_in(p, step_dir, "index.json"));
    index = cJSON_Parse(text);
    free(text);
    cJSON *blocks = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(index, "tensors"),
                                         "fc.0.weight"),
        "blocks");
    cJSON *start = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(blocks, 0), "start");
    assert_non_null(start);
    cJSON_SetNumberValue(cJSON_GetArrayItem(start, 0), -3);
    text = cJSON_Print(index);
    write_text(p, text);
    cJSON_free(text);
    cJSON_Delete(index);
    expect_refused(&b, support_path_in(case_dir, dir, "negative"), SPMD_ERR_IO, "'fc.0.weight'",
                   "start[0] = -3", "which is negative");

    /* A checkpoint that loads, into programs it does not fit. */
    support_path_in(case_dir, dir, "good");
    save_ok(a.p, case_dir, 1, NULL, 0);
    assert_int_equal(load_ok(b.p, case_dir), 1);
    model wider, sgd;
    model_build(
        &wider,
        (model_opts){
            .mesh = "4x2", .axes = "replica,fsdp", .fsdp = "fsdp", .hidden = 32, .seed = 99});
    expect_refused(&wider, case_dir, SPMD_ERR_SHAPE, "'fc.0.weight'", "[31, 13]", "[32, 13]");
    model_build(&sgd, (model_opts){.mesh = "4x2",
                                   .axes = "replica,fsdp",
                                   .fsdp = "fsdp",
                                   .hidden = 31,
                                   .sgd = true,
                                   .seed = 99});
    expect_refused(&sgd, case_dir, SPMD_ERR_INVALID, "'fc.0.weight.momentum'", "not in", NULL);
    model_free(&wider);
    model_free(&sgd);

    /* A file cut short after every check passed: only reading finds it,
     * and the program is partly loaded by then; a good load mends it. */
    support_path_in(case_dir, dir, "partly");
    save_ok(a.p, case_dir, 1, NULL, 0);
    checkpoint_set_load_hook(cut_short, NULL);
    assert_int_equal(spmd_checkpoint_load(b.p, case_dir, NULL, NULL), SPMD_ERR_IO);
    checkpoint_set_load_hook(NULL, NULL);
    const char *msg = spmd_last_error();
    if (!strstr(msg, "dev-0001.safetensors") || !strstr(msg, "the program is partly loaded"))
        fail_msg("load of a file cut short: %s", msg);
    assert_int_equal(load_ok(b.p, support_path_in(p, dir, "good")), 1);
    expect_same_values(a.g, a.p, b.g, b.p);

    /* No checkpoint at all, and a `latest` that names no step. */
    support_path_in(case_dir, dir, "empty");
    assert_int_equal(mkdir(case_dir, 0777), 0);
    expect_refused(&b, case_dir, SPMD_ERR_IO, "neither", NULL, NULL);
    write_text(support_path_in(p, case_dir, "latest"), "../good/step-00000001\n");
    expect_refused(&b, case_dir, SPMD_ERR_IO, "latest", "step name", NULL);

    /* Saves refused before anything is written. */
    support_path_in(case_dir, dir, "refused");
    assert_int_equal(spmd_checkpoint_save(a.p, case_dir, 1, "[1, 2]", 0), SPMD_ERR_INVALID);
    assert_non_null(strstr(spmd_last_error(), "meta"));
    assert_int_equal(spmd_checkpoint_save(a.p, case_dir, -1, NULL, 0), SPMD_ERR_INVALID);
    assert_int_equal(spmd_checkpoint_save(a.p, case_dir, 1, NULL, -1), SPMD_ERR_INVALID);
    assert_int_equal(spmd_checkpoint_save(NULL, case_dir, 1, NULL, 0), SPMD_ERR_INVALID);
    assert_int_equal(spmd_checkpoint_save(a.p, NULL, 1, NULL, 0), SPMD_ERR_INVALID);
    assert_false(exists(dir, "refused"));
    spmd_program *plan_only = spmd_compile(a.g, &(spmd_compile_options){.plan_only = true});
    assert_non_null(plan_only);
    assert_int_equal(spmd_checkpoint_save(plan_only, case_dir, 1, NULL, 0), SPMD_ERR_INVALID);
    assert_int_equal(spmd_checkpoint_load(plan_only, support_path_in(p, dir, "good"), NULL, NULL),
                     SPMD_ERR_INVALID);
    spmd_program_free(plan_only);

    model_free(&a);
    model_free(&b);
    support_drop_dir(dir);
}

/* ---- (e) Atomicity ------------------------------------------------------------------------ */

static bool kill_at(void *ctx, const char *stage)
{
    if (!strcmp(stage, ctx)) raise(SIGKILL);
    return true;
}

static bool stop_at(void *ctx, const char *stage) { return strcmp(stage, ctx) != 0; }

/* Save in a child process that the hook kills right after `stage`. */
static void save_killed_at(const model *md, const char *dir, int64_t step, const char *stage)
{
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        checkpoint_set_hook(kill_at, (void *)stage);
        spmd_checkpoint_save(md->p, dir, step, NULL, 2);
        _exit(3); /* the hook should have killed it */
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL)
        fail_msg("the writer was to die after %s; status %d", stage, status);
}

/* md's state loaded from `from` is `want` (read_all bytes). */
static void expect_loads(const model *md, const char *from, int64_t step, const unsigned char *want,
                         size_t bytes)
{
    assert_int_equal(load_ok(md->p, from), step);
    size_t n;
    unsigned char *got = read_all(md->g, md->p, &n);
    assert_int_equal(n, bytes);
    assert_memory_equal(got, want, bytes);
    free(got);
}

/* The stages a save's hook saw, in order. */
typedef struct stages {
    int n;
    char names[16][32];
} stages;

static bool record_stage(void *ctx, const char *stage)
{
    stages *s = ctx;
    assert_true(s->n < 16);
    snprintf(s->names[s->n++], 32, "%s", stage);
    return true;
}

/* Each device's file once (any order: they are written at the same
 * time), then the index, the step directory and `latest`. */
static void test_hook_stages(void **state)
{
    (void)state;
    char *dir = support_temp_dir("spmd-ckpt");
    model a;
    model_build(&a, FSDP_4X2);
    stages seen = {0};
    checkpoint_set_hook(record_stage, &seen);
    save_ok(a.p, dir, 5, NULL, 0);
    checkpoint_set_hook(NULL, NULL);
    assert_int_equal(seen.n, 11);
    for (int d = 0; d < 8; d++) {
        char name[32];
        int times = 0;
        snprintf(name, sizeof name, "dev-%04d.safetensors", d);
        for (int i = 0; i < 8; i++) times += !strcmp(seen.names[i], name);
        if (times != 1) fail_msg("the hook saw %s %d times among the files", name, times);
    }
    assert_string_equal(seen.names[8], "index.json");
    assert_string_equal(seen.names[9], "step-00000005");
    assert_string_equal(seen.names[10], "latest");
    model_free(&a);
    support_drop_dir(dir);
}

static void test_atomic_save(void **state)
{
    (void)state;
    char *dir = support_temp_dir("spmd-ckpt"), p[PATH];
    model a, b;
    model_build(&a, FSDP_4X2);
    model_build(
        &b, (model_opts){
                .mesh = "2x4", .axes = "replica,fsdp", .fsdp = "fsdp", .hidden = 31, .seed = 99});
    model_step(&a, 0);
    save_ok(a.p, dir, 1, NULL, 2);
    model_step(&a, 1);
    save_ok(a.p, dir, 2, NULL, 2);
    size_t bytes;
    unsigned char *at2 = read_all(a.g, a.p, &bytes);
    model_step(&a, 2);
    unsigned char *at3 = read_all(a.g, a.p, &bytes);

    /* Killed before the rename, after any of the 8 devices' files (the
     * others perhaps half written) or the index: step 2 stays the latest
     * and whole. */
    for (int i = 0; i <= 8; i++) {
        char stage[32];
        if (i < 8)
            snprintf(stage, sizeof stage, "dev-%04d.safetensors", i);
        else
            snprintf(stage, sizeof stage, "index.json");
        save_killed_at(&a, dir, 3, stage);
        expect_latest(dir, "step-00000002");
        assert_false(exists(dir, "step-00000003"));
        assert_true(exists(dir, "step-00000001"));
        expect_loads(&b, dir, 2, at2, bytes);
    }
    /* Killed after the rename, before `latest`: both whole. */
    save_killed_at(&a, dir, 3, "step-00000003");
    expect_latest(dir, "step-00000002");
    expect_loads(&b, dir, 2, at2, bytes);
    expect_loads(&b, support_path_in(p, dir, "step-00000003"), 3, at3, bytes);
    /* Killed after `latest`, before deleting: nothing deleted yet. */
    save_killed_at(&a, dir, 3, "latest");
    expect_latest(dir, "step-00000003");
    assert_int_equal(support_count_entries(dir, "step-"), 3);
    expect_loads(&b, dir, 3, at3, bytes);
    /* The killed writers' temporary directories are never read. */
    assert_true(support_count_entries(dir, ".tmp-step-") >= 3);

    /* Step 3 saved again (it exists: replaced whole), keep=2 deletes step 1. */
    save_ok(a.p, dir, 3, NULL, 2);
    assert_false(exists(dir, "step-00000001"));
    assert_true(exists(dir, "step-00000002"));
    expect_latest(dir, "step-00000003");
    expect_loads(&b, dir, 3, at3, bytes);

    /* A save stopped between files fails, leaving nothing of its own. */
    char tmp[64];
    snprintf(tmp, sizeof tmp, ".tmp-step-00000004-%ld", (long)getpid());
    checkpoint_set_hook(stop_at, (void *)"dev-0001.safetensors");
    assert_int_equal(spmd_checkpoint_save(a.p, dir, 4, NULL, 2), SPMD_ERR_IO);
    checkpoint_set_hook(NULL, NULL);
    assert_non_null(strstr(spmd_last_error(), "dev-0001.safetensors"));
    assert_false(exists(dir, tmp));
    assert_false(exists(dir, "step-00000004"));
    expect_latest(dir, "step-00000003");
    assert_true(exists(dir, "step-00000002"));

    save_ok(a.p, dir, 4, NULL, 2);
    assert_false(exists(dir, "step-00000002"));
    assert_int_equal(support_count_entries(dir, "step-"), 2);
    expect_latest(dir, "step-00000004");
    expect_loads(&b, dir, 4, at3, bytes);

    free(at2);
    free(at3);
    model_free(&a);
    model_free(&b);
    support_drop_dir(dir);
}

/* ---- Allocation failures ----------------------------------------------------------------- */

/* Every allocation of a save and of a load fails in turn: each such call
 * reports SPMD_ERR_NOMEM, frees what it took, leaves no directory of its
 * own behind and (a load) the program untouched; then both succeed. */
static void test_out_of_memory(void **state)
{
    (void)state;
    char *dir = support_temp_dir("spmd-ckpt"), *other = support_temp_dir("spmd-ckpt"), tmp[64];
    test_alloc f;
    spmd_allocator hook = test_alloc_init(&f, -1);
    model a, b;
    model_opts o = FSDP_4X2;
    o.alloc = &hook;
    model_build(&a, o);
    model_step(&a, 0);
    o.mesh = "2x4";
    o.seed = 99;
    model_build(&b, o);
    save_ok(a.p, other, 1, NULL, 0);
    snprintf(tmp, sizeof tmp, ".tmp-step-00000001-%ld", (long)getpid());
    int failures = 0;
    for (long k = 0;; k++) {
        long held = (long)(f.allocs - f.frees);
        test_alloc_set_budget(&f, k);
        spmd_status st = spmd_checkpoint_save(a.p, dir, 1, NULL, 0);
        test_alloc_set_budget(&f, -1);
        assert_int_equal((long)(f.allocs - f.frees), held);
        if (st == SPMD_OK) break;
        if (st != SPMD_ERR_NOMEM) fail_msg("save, %ld allocations: %s", k, spmd_last_error());
        assert_false(exists(dir, tmp));
        assert_false(exists(dir, "latest"));
        failures++;
    }
    for (long k = 0;; k++) {
        size_t bytes, after;
        unsigned char *before = read_all(b.g, b.p, &bytes);
        long held = (long)(f.allocs - f.frees);
        test_alloc_set_budget(&f, k);
        int64_t step = -1;
        spmd_status st = spmd_checkpoint_load(b.p, dir, &step, NULL);
        test_alloc_set_budget(&f, -1);
        assert_int_equal((long)(f.allocs - f.frees), held);
        unsigned char *now = read_all(b.g, b.p, &after);
        if (st == SPMD_OK) {
            free(before);
            free(now);
            assert_int_equal(step, 1);
            break;
        }
        if (st != SPMD_ERR_NOMEM) fail_msg("load, %ld allocations: %s", k, spmd_last_error());
        assert_memory_equal(before, now, bytes);
        free(before);
        free(now);
        failures++;
    }
    assert_true(failures > 10);
    expect_same_values(a.g, a.p, b.g, b.p);
    model_free(&a);
    model_free(&b);
    support_drop_dir(dir);
    support_drop_dir(other);
}

/* ---- (f) An independent reader -------------------------------------------------------------- */

/* The sum, in row-major order as doubles, of the real part of a block. */
static double block_sum(const executor_block *b)
{
    double s = 0;
    int64_t n = 1, idx[SPMD_MAX_RANK] = {0};
    for (int k = 0; k < b->rank; k++) n *= b->ldims[k];
    for (int64_t e = 0; e < n; e++) {
        bool pad = false;
        for (int k = 0; k < b->rank; k++) pad |= idx[k] >= b->valid[k];
        if (!pad) s += (double)((const float *)b->data)[e];
        for (int k = b->rank - 1; k >= 0 && ++idx[k] == b->ldims[k]; k--) idx[k] = 0;
    }
    return s;
}

static void test_independent_reader(void **state)
{
    (void)state;
    if (access("/usr/bin/python3", X_OK) != 0) {
        print_message("note: no /usr/bin/python3: the independent safetensors reader is not run\n");
        skip();
    }
    char *dir = support_temp_dir("spmd-ckpt"), cmd[4 * PATH], step_dir[PATH];
    model a;
    model_build(&a, FSDP_4X2);
    model_step(&a, 0);
    save_ok(a.p, dir, 1, NULL, 0);
    support_path_in(step_dir, dir, "step-00000001");
    shares sh;
    read_shares(step_dir, &sh);
    size_t n = (size_t)snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/tests/support/read_safetensors.py",
                                SPMD_SOURCE_DIR);
    for (int i = 0; i < sh.n_files; i++)
        n += (size_t)snprintf(cmd + n, sizeof cmd - n, " %s/%s", step_dir, sh.names[i]);
    assert_true(n < sizeof cmd);
    FILE *out = popen(cmd, "r");
    assert_non_null(out);
    char line[1024];
    int lines[8] = {0}, total = 0;
    while (fgets(line, sizeof line, out)) {
        /* FILE \t NAME \t DTYPE \t SHAPE \t SUM */
        char *field[5], *save = NULL, *s = line;
        for (int i = 0; i < 5; i++, s = NULL) field[i] = strtok_r(s, "\t\n", &save);
        if (!field[4]) fail_msg("reader printed: %s", line);
        /* The file of device id d on this mesh, whose ids are its positions. */
        const char *base = strrchr(field[0], '/');
        int dev = -1;
        if (!base || sscanf(base, "/dev-%d.safetensors", &dev) != 1 || dev < 0 || dev >= 8)
            fail_msg("reader printed file %s", field[0]);
        const spmd_tensor *t = spmd_graph_find(a.g, field[1]);
        if (!t) fail_msg("reader found '%s', which the model lacks", field[1]);
        executor_block b;
        assert_int_equal(executor_block_of(a.p, t, dev, 0, &b), SPMD_OK);
        char shape[128];
        size_t m = (size_t)snprintf(shape, sizeof shape, "[");
        for (int k = 0; k < b.rank; k++)
            m += (size_t)snprintf(shape + m, sizeof shape - m, "%s%lld", k ? ", " : "",
                                  (long long)b.valid[k]);
        snprintf(shape + m, sizeof shape - m, "]");
        assert_string_equal(field[2], "F32");
        assert_string_equal(field[3], shape);
        double want = block_sum(&b), got = strtod(field[4], NULL);
        if (got != want)
            fail_msg("'%s' on device %d: the reader sums %.17g, the block %.17g", field[1], dev,
                     got, want);
        lines[dev]++;
        total++;
    }
    assert_int_equal(pclose(out), 0);
    /* Every block the index lists, each from a device that holds it; all
     * 8 devices write some. */
    assert_int_equal(total, sh.n_blocks);
    for (int d = 0; d < 8; d++) assert_true(lines[d] > 0);
    model_free(&a);
    support_drop_dir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_mesh_round_trip),
        cmocka_unit_test(test_reshard_on_load),
        cmocka_unit_test(test_replicated_spread),
        cmocka_unit_test(test_uneven_splits),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_hook_stages),
        cmocka_unit_test(test_atomic_save),
        cmocka_unit_test(test_out_of_memory),
        cmocka_unit_test(test_independent_reader),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
