/*
 * `spmd export CKPT --out FILE [--format hf|llmc]` on a checkpoint the
 * library saved from a GPT trained one AdamW step on a 4x2 mesh with FSDP
 * (so the checkpoint also holds optimizer state, which export leaves out):
 *   - both formats are written, and each loads back (spmd_weights_load)
 *     into a one-device GPT with the program's parameters bit for bit;
 *   - an independent reader (tests/support/read_export.py: standard-library Python
 *     and numpy) checks each file against its format and finds every tensor
 *     equal, in both files, to a raw dump of the program's parameters;
 *   - refusals: no checkpoint or no --out (usage, exit 2), an unknown
 *     --format, a directory that is no checkpoint, a checkpoint without a
 *     GPT configuration, an output directory that does not exist (exit 1,
 *     the cause named, no file left behind).
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

#include "spmd/checkpoint.h"
#include "spmd/mesh.h"
#include "spmd/models.h"
#include "spmd/spmd.h"
#include "spmd/train.h"
#include "spmd/weights.h"
#include "support_tool.h"
#include "train/checkpoint_fs.h"

#ifndef SPMD_TOOL_PATH
#error "SPMD_TOOL_PATH must name the spmd binary"
#endif
#ifndef SPMD_SOURCE_DIR
#error "SPMD_SOURCE_DIR must name the source tree"
#endif

enum { PATH = SUPPORT_PATH, BATCH = 8, OUT = 1 << 16 };

static const spmd_gpt_config CFG = {.vocab = 37, .seq = 8, .context = 16, .layers = 2, .heads = 2,
                                    .dim = 16};
static const char *META = "{\"config\":{\"model\":\"gpt\",\"vocab\":37,\"seq\":8,\"context\":16,"
                          "\"layers\":2,\"heads\":2,\"dim\":16}}";

static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n++;
    closedir(d);
    return n - 2; /* "." and ".." */
}

static void expect_output(const char *out, const char *needle)
{
    if (!strstr(out, needle)) fail_msg("output does not mention '%s':\n%s", needle, out);
}

/* ---- A trained GPT and its checkpoint ------------------------------------------------------ */

typedef struct trained {
    spmd_graph *g;
    spmd_mesh *mesh;
    spmd_trainer *tr;
    spmd_program *p;
} trained;

/* One AdamW step on a 4x2 mesh, FSDP over 'fsdp'; saved to dir/ckpt. */
static void train_and_save(trained *m, const char *ckpt)
{
    memset(m, 0, sizeof *m);
    m->g = spmd_graph_create(NULL);
    assert_non_null(m->g);
    spmd_gpt_tensors t;
    if (spmd_gpt_build(m->g, &CFG, BATCH, &t) != SPMD_OK) fail_msg("gpt: %s", spmd_last_error());
    m->mesh = spmd_mesh_parse("4x2", "replica,fsdp");
    assert_non_null(m->mesh);
    spmd_tensor *in[] = {t.input, t.targets};
    assert_int_equal(spmd_fsdp_wrap(m->g, m->mesh, "fsdp", in, 2, NULL), SPMD_OK);
    spmd_trainer_options opts = {
        .optimizer = {.kind = SPMD_OPTIMIZER_ADAMW, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f},
        .compile = {.threads = 2, .seed = 5}};
    m->tr = spmd_trainer_create(m->g, t.loss, &opts);
    if (!m->tr) fail_msg("trainer: %s", spmd_last_error());
    m->p = spmd_trainer_program(m->tr);
    int32_t ids[BATCH * 8], next[BATCH * 8];
    for (int i = 0; i < BATCH * 8; i++) ids[i] = (i * 7) % 37, next[i] = (i * 7 + 3) % 37;
    assert_int_equal(spmd_program_set_input(m->p, t.input, ids, sizeof ids), SPMD_OK);
    assert_int_equal(spmd_program_set_input(m->p, t.targets, next, sizeof next), SPMD_OK);
    float loss;
    assert_int_equal(spmd_trainer_step(m->tr, 1e-2f, &loss, NULL), SPMD_OK);
    assert_true(isfinite(loss));
    if (spmd_checkpoint_save(m->p, ckpt, 1, META, 0) != SPMD_OK)
        fail_msg("save: %s", spmd_last_error());
}

static void trained_free(trained *m)
{
    spmd_trainer_free(m->tr);
    spmd_graph_free(m->g);
    spmd_mesh_free(m->mesh);
}

/* Each parameter as dir/NAME.f32, raw little-endian float32. */
static void dump_params(const trained *m, const char *dir)
{
    for (int i = 0; i < spmd_graph_tensor_count(m->g); i++) {
        const spmd_tensor *t = spmd_graph_tensor(m->g, i);
        if (!spmd_tensor_is_param(t)) continue;
        size_t bytes = (size_t)spmd_tensor_numel(t) * sizeof(float);
        float *v = malloc(bytes);
        assert_non_null(v);
        assert_int_equal(spmd_program_read(m->p, t, v, bytes), SPMD_OK);
        char name[256], path[PATH];
        snprintf(name, sizeof name, "%s.f32", spmd_tensor_name(t));
        FILE *f = fopen(support_path_in(path, dir, name), "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(v, 1, bytes, f), bytes);
        assert_int_equal(fclose(f), 0);
        free(v);
    }
}

/* The file loads into a one-device GPT with m's parameters, bit for bit. */
static void expect_same_weights(const trained *m, const char *file)
{
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_gpt_tensors t;
    assert_int_equal(spmd_gpt_build(g, &CFG, 1, &t), SPMD_OK);
    spmd_compile_options opts = {.threads = 1, .seed = 9};
    spmd_program *p = spmd_compile(g, &opts);
    assert_non_null(p);
    if (spmd_weights_load(p, &CFG, file) != SPMD_OK) fail_msg("load: %s", spmd_last_error());
    for (int i = 0; i < spmd_graph_tensor_count(g); i++) {
        const spmd_tensor *a = spmd_graph_tensor(g, i);
        if (!spmd_tensor_is_param(a)) continue;
        const spmd_tensor *b = spmd_graph_find(m->g, spmd_tensor_name(a));
        size_t bytes = (size_t)spmd_tensor_numel(a) * sizeof(float);
        float *x = malloc(bytes), *y = malloc(bytes);
        assert_int_equal(spmd_program_read(p, a, x, bytes), SPMD_OK);
        assert_int_equal(spmd_program_read(m->p, b, y, bytes), SPMD_OK);
        if (memcmp(x, y, bytes)) fail_msg("%s: %s differs", file, spmd_tensor_name(a));
        free(x);
        free(y);
    }
    spmd_program_free(p);
    spmd_graph_free(g);
}

/* /usr/bin/python3 with numpy, or a note and false. */
static bool have_numpy(void)
{
    if (access("/usr/bin/python3", X_OK) != 0) {
        print_message("note: no /usr/bin/python3: the independent reader is not run\n");
        return false;
    }
    if (system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") != 0) {
        print_message("note: /usr/bin/python3 has no numpy (python3-numpy; scripts/install-deps.sh "
                      "--tests installs it): the independent reader is not run\n");
        return false;
    }
    return true;
}

static void test_export_both_formats(void **state)
{
    (void)state;
    char *dir = support_temp_dir("spmd-export");
    char ckpt[PATH], hf[PATH], llmc[PATH], dump[PATH], *out = malloc(OUT);
    assert_non_null(out);
    trained m;
    train_and_save(&m, support_path_in(ckpt, dir, "ckpt"));

    int rc = run_toolf(out, OUT, "export %s --out %s", ckpt, support_path_in(hf, dir, "model.safetensors"));
    if (rc != 0) fail_msg("export hf: %d\n%s", rc, out);
    expect_output(out, "step 1");
    expect_output(out, "Hugging Face GPT-2 safetensors");
    expect_output(out, "vocab 37, context 16, 2 layers, 2 heads, dim 16");
    rc = run_toolf(out, OUT, "export --format=llmc %s --out %s", ckpt, support_path_in(llmc, dir, "model.bin"));
    if (rc != 0) fail_msg("export llmc: %d\n%s", rc, out);
    expect_output(out, "llm.c checkpoint");
    expect_same_weights(&m, hf);
    expect_same_weights(&m, llmc);

    if (have_numpy()) {
        assert_int_equal(mkdir(support_path_in(dump, dir, "dump"), 0755), 0);
        dump_params(&m, dump);
        char cmd[4 * PATH];
        snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/tests/support/read_export.py --hf %s --llmc %s "
                 "--expect %s 2>&1", SPMD_SOURCE_DIR, hf, llmc, dump);
        FILE *p = popen(cmd, "r");
        assert_non_null(p);
        size_t n = fread(out, 1, OUT - 1, p);
        out[n] = '\0';
        int status = pclose(p);
        if (status != 0) fail_msg("read_export.py failed:\n%s", out);
        expect_output(out, "h.1.mlp.c_fc.weight\t[64, 16]\t");
        expect_output(out, "all 28 tensors equal");
    }
    /* --dtype bf16: a BF16 safetensors file of half the data bytes, each
     * weight the round to nearest even of the f32 master (checked by the
     * independent reader on the dumps); --init refuses it, naming the
     * dtype (training starts from the f32 masters the checkpoint keeps). */
    char half[PATH];
    rc = run_toolf(out, OUT, "export %s --out %s --dtype bf16", ckpt,
                   support_path_in(half, dir, "model-bf16.safetensors"));
    if (rc != 0) fail_msg("export bf16: %d\n%s", rc, out);
    expect_output(out, "(Hugging Face GPT-2 safetensors, bf16, ");
    struct stat s32, s16;
    assert_int_equal(stat(hf, &s32), 0);
    assert_int_equal(stat(half, &s16), 0);
    assert_true(s16.st_size < s32.st_size && s16.st_size > s32.st_size / 2);
    if (have_numpy()) {
        char cmd[4 * PATH];
        snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/tests/support/read_export.py --bf16 %s --expect %s 2>&1",
                 SPMD_SOURCE_DIR, half, dump);
        FILE *p = popen(cmd, "r");
        assert_non_null(p);
        size_t n = fread(out, 1, OUT - 1, p);
        out[n] = '\0';
        if (pclose(p) != 0) fail_msg("read_export.py --bf16 failed:\n%s", out);
        expect_output(out, "h.1.mlp.c_fc.weight\t[64, 16]\tBF16");
        expect_output(out, "all 28 tensors the bf16 rounding");
    }
    rc = run_toolf(out, OUT, "train --init %s --steps 1 --eval 0 --data arith", half);
    assert_int_equal(rc, 2);
    expect_output(out, "has dtype BF16; libspmd reads F32 weights only");
    rc = run_toolf(out, OUT, "export %s --out %s --dtype bf16 --format llmc", ckpt,
                   support_path_in(half, dir, "model-bf16.bin"));
    assert_int_equal(rc, 2);
    expect_output(out, "--dtype bf16 writes safetensors (--format hf) only");
    trained_free(&m);
    free(out);
    support_drop_dir(dir);
}

static void test_export_refusals(void **state)
{
    (void)state;
    char *dir = support_temp_dir("spmd-export");
    char ckpt[PATH], file[PATH], other[PATH], *out = malloc(OUT);
    assert_non_null(out);
    assert_int_equal(run_toolf(out, OUT, "export"), 2);
    expect_output(out, "usage: spmd export CKPT --out FILE");
    assert_int_equal(run_toolf(out, OUT, "export %s", dir), 2);
    expect_output(out, "needs a checkpoint and --out FILE");
    assert_int_equal(run_toolf(out, OUT, "export %s --out x --format gguf", dir), 2);
    expect_output(out, "--format is hf or llmc, got 'gguf'");
    assert_int_equal(run_toolf(out, OUT, "export %s --out x --flag", dir), 2);
    expect_output(out, "unknown flag '--flag'");
    assert_int_equal(run_toolf(out, OUT, "export --help"), 0);
    expect_output(out, "--format llmc");

    assert_int_equal(run_toolf(out, OUT, "export %s --out %s", dir, support_path_in(file, dir, "x.st")), 1);
    expect_output(out, "is not a checkpoint");
    /* A checkpoint whose meta has no model configuration. */
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_gpt_tensors t;
    assert_int_equal(spmd_gpt_build(g, &CFG, 1, &t), SPMD_OK);
    spmd_compile_options opts = {.threads = 1};
    spmd_program *p = spmd_compile(g, &opts);
    assert_non_null(p);
    assert_int_equal(spmd_checkpoint_save(p, support_path_in(ckpt, dir, "ckpt"), 3, "{}", 0), SPMD_OK);
    assert_int_equal(run_toolf(out, OUT, "export %s --out %s", ckpt, file), 1);
    expect_output(out, "no meta.config");
    assert_int_equal(spmd_checkpoint_save(p, ckpt, 4, META, 0), SPMD_OK);
    /* An --out no file can be made in is refused before the export (a
     * usage error, as every output's: tools/paths.c). */
    assert_int_equal(run_toolf(out, OUT, "export %s --out %s/missing/x.st", ckpt, dir), 2);
    expect_output(out, "cannot create");
    /* Nothing was written: the checkpoint is all there is. */
    assert_int_equal(count_entries(dir), 1);
    /* A step directory exports too. */
    assert_int_equal(run_toolf(out, OUT, "export %s/step-00000004 --out %s", ckpt, support_path_in(other, dir, "y.st")),
                     0);
    expect_output(out, "step 4");
    spmd_program_free(p);
    spmd_graph_free(g);
    free(out);
    support_drop_dir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_export_both_formats),
        cmocka_unit_test(test_export_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
