/*
 * `spmd train --init FILE`, with the files of
 * tests/vectors/make_weights_vectors.py (a random GPT-2 in PyTorch, as a
 * Hugging Face safetensors file and as an llm.c checkpoint):
 *   - fed the vectors' batch (their token stream as an llm.c token shard,
 *     read with --data-order sequential: row b is stream[8b : 8b + 8]),
 *     the loss of step 1 is PyTorch's within 1e-5, from either file, on
 *     one device and on a 2x2 mesh with FSDP; the run says where its
 *     weights and shape came from; on pipeline stages it is the loss of
 *     --accumulate over the same micro-batches on one device;
 *   - started from the file, one step of SGD at lr 1e-30 (too small to
 *     move any weight), saved with --save and exported with `spmd export`:
 *     every parameter is PyTorch's, bit for bit, on FSDP and on stages;
 *   - the shape comes from the file (explain shows it), and flags that
 *     differ from the file, --seq past its context, --model mlp, --resume,
 *     and an unknown head count are refused before anything runs, naming
 *     the flag, the file and both values.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "support_files.h"

#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "spmd/models.h"
#include "spmd/spmd.h"
#include "spmd/weights.h"
#include "support_tool.h"
#include "support_vectors.h"
#include "train/checkpoint_fs.h"

#ifndef SPMD_TOOL_PATH
#error "SPMD_TOOL_PATH must name the spmd binary"
#endif

enum { PATH = SUPPORT_PATH, OUT = 1 << 16, FILLER = 67 };

#define TOL 1e-5

static char hf[PATH], llmc[PATH];

static int setup(void **state)
{
    (void)state;
    snprintf(hf, sizeof hf, "%s/gpt_weights.safetensors", tv_dir());
    snprintf(llmc, sizeof llmc, "%s/gpt_weights_llmc.bin", tv_dir());
    return 0;
}

static void expect_output(const char *out, const char *needle)
{
    if (!strstr(out, needle)) fail_msg("output does not mention '%s':\n%s", needle, out);
}

static const tv_record *need(const tv_file *v, const char *name)
{
    const tv_record *r = tv_find(v, name);
    if (!r) fail_msg("vector record '%s' is missing", name);
    return r;
}

/* The vectors' token stream, then FILLER more tokens (the held-out tail),
 * as an llm.c token shard: 256 int32 (magic, version 1, count), uint16s. */
static void write_shard(const tv_file *v, const char *path)
{
    const tv_record *s = need(v, "stream");
    const int32_t *tok = s->data;
    int32_t n = (int32_t)s->numel + FILLER;
    int32_t header[256] = {20240520, 1, n};
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(header, sizeof header, 1, f), 1);
    for (int32_t i = 0; i < n; i++) {
        uint16_t t = (uint16_t)(i < s->numel ? tok[i] : i % 37);
        assert_int_equal(fwrite(&t, sizeof t, 1, f), 1);
    }
    assert_int_equal(fclose(f), 0);
}

static double first_loss(const char *report)
{
    FILE *f = fopen(report, "rb");
    assert_non_null(f);
    char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    cJSON *j = cJSON_Parse(buf);
    assert_non_null(j);
    const cJSON *loss = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "loss"), 0);
    assert_true(cJSON_IsNumber(loss));
    double v = loss->valuedouble;
    cJSON_Delete(j);
    return v;
}

/* Step 1's loss from `file` on the vectors' batch; the run's output in
 * `out` (OUT bytes). */
static double init_loss(const tv_file *v, const char *file, const char *extra, char *out)
{
    char *dir = support_temp_dir("spmd-init"), shard[PATH], report[PATH];
    write_shard(v, support_path_in(shard, dir, "tokens.bin"));
    int rc = run_toolf(out, OUT,
                 "train --init %s %s --data %s --data-order sequential --batch 4 --seq 8 --steps 1 "
                 "--eval 0 --threads 2 --json %s",
                 file, extra, shard, support_path_in(report, dir, "r.json"));
    if (rc != 0) fail_msg("train: %d\n%s", rc, out);
    double loss = first_loss(report);
    support_drop_dir(dir);
    return loss;
}

/* Step 1 from `file` on the vectors' batch: PyTorch's loss. */
static void loss_case(const char *file, const char *extra, const char *init_line)
{
    tv_file v;
    tv_load_case("gpt_weights", &v);
    char *out = malloc(OUT);
    assert_non_null(out);
    double got = init_loss(&v, file, extra, out), want = *(const float *)need(&v, "loss")->data;
    expect_output(out, init_line);
    if (!(fabs(got - want) <= TOL + TOL * fabs(want)))
        fail_msg("step 1 loss %.9g, PyTorch's %.9g (%s %s)", got, want, file, extra);
    free(out);
    tv_free(&v);
}

static void test_loss_matches_torch_from_hf(void **state)
{
    (void)state;
    loss_case(hf, "--heads 2 --mesh 1 --axes data",
              "(Hugging Face GPT-2 safetensors): vocab 37, context 16, 2 layers, 2 heads "
              "(--heads), dim 16");
}

static void test_loss_matches_torch_from_llmc(void **state)
{
    (void)state;
    loss_case(llmc, "--mesh 1 --axes data",
              "(llm.c checkpoint): vocab 37, context 16, 2 layers, 2 heads (recorded in the "
              "file), dim 16");
}

static void test_loss_matches_torch_on_2x2_fsdp(void **state)
{
    (void)state;
    loss_case(llmc, "--mesh 2x2 --axes replica,fsdp", "init: ");
    loss_case(hf, "--heads 2 --mesh 2x2 --axes replica,fsdp", "init: ");
}

/* Each stage's parameters from the file: the loss of --accumulate over
 * the same micro-batches on one device. */
static void test_init_on_stages_as_accumulation(void **state)
{
    (void)state;
    tv_file v;
    tv_load_case("gpt_weights", &v);
    char *out = malloc(OUT);
    assert_non_null(out);
    const char *cases[][3] = {
        {llmc, "--batch 2 --mesh 2 --axes pp --pp pp --microbatches 2", "--batch 2 --accumulate 2"},
        {hf, "--heads 2 --batch 1 --mesh 2x2 --axes pp,data --pp pp --microbatches 4",
         "--heads 2 --batch 1 --accumulate 4"},
    };
    for (int i = 0; i < 2; i++) {
        double got = init_loss(&v, cases[i][0], cases[i][1], out);
        expect_output(out, "init: ");
        char one[128];
        snprintf(one, sizeof one, "%s --mesh 1 --axes data", cases[i][2]);
        double want = init_loss(&v, cases[i][0], one, out);
        if (!(fabs(got - want) <= TOL * fabs(want)))
            fail_msg("step 1 loss %.9g with %s, %.9g with %s", got, cases[i][1], want, one);
    }
    free(out);
    tv_free(&v);
}

/* --init, one step that moves nothing, --save, export: PyTorch's bits. */
static void init_save_export(const char *mesh)
{
    tv_file v;
    tv_load_case("gpt_weights", &v);
    char *dir = support_temp_dir("spmd-init"), shard[PATH], ckpt[PATH], file[PATH], *out = malloc(OUT);
    assert_non_null(out);
    write_shard(&v, support_path_in(shard, dir, "tokens.bin"));
    int rc = run_toolf(out, OUT,
                 "train --init %s --heads 2 --optimizer sgd --lr 1e-30 --data %s --batch 4 --seq 8 "
                 "--steps 1 --eval 0 --threads 2 %s --save %s",
                 hf, shard, mesh, support_path_in(ckpt, dir, "ckpt"));
    if (rc != 0) fail_msg("train: %d\n%s", rc, out);
    rc = run_toolf(out, OUT, "export %s --out %s", ckpt, support_path_in(file, dir, "out.safetensors"));
    if (rc != 0) fail_msg("export: %d\n%s", rc, out);

    const int32_t *c = need(&v, "config")->data;
    spmd_gpt_config cfg = {.vocab = c[0], .seq = c[1], .layers = c[2], .heads = c[3], .dim = c[4],
                           .context = c[5]};
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_gpt_tensors t;
    assert_int_equal(spmd_gpt_build(g, &cfg, 1, &t), SPMD_OK);
    spmd_compile_options opts = {.threads = 1, .seed = 3};
    spmd_program *p = spmd_compile(g, &opts);
    assert_non_null(p);
    if (spmd_weights_load(p, &cfg, file) != SPMD_OK) fail_msg("load: %s", spmd_last_error());
    for (int i = 0; i < spmd_graph_tensor_count(g); i++) {
        const spmd_tensor *x = spmd_graph_tensor(g, i);
        if (!spmd_tensor_is_param(x)) continue;
        const tv_record *r = need(&v, spmd_tensor_name(x));
        float *got = malloc(r->bytes);
        assert_int_equal(spmd_program_read(p, x, got, r->bytes), SPMD_OK);
        if (memcmp(got, r->data, r->bytes)) fail_msg("%s is not PyTorch's", r->name);
        free(got);
    }
    spmd_program_free(p);
    spmd_graph_free(g);
    free(out);
    support_drop_dir(dir);
    tv_free(&v);
}

static void test_init_save_export_keeps_the_weights(void **state)
{
    (void)state;
    init_save_export("--mesh 2x2 --axes replica,fsdp");
    init_save_export("--batch 2 --mesh 2 --axes pp --pp pp --microbatches 2");
}

static void test_shape_comes_from_the_file(void **state)
{
    (void)state;
    char *out = malloc(OUT);
    assert_non_null(out);
    int rc = run_toolf(out, OUT, "explain --init %s --mesh 1 --axes data --batch 2", llmc);
    if (rc != 0) fail_msg("explain: %d\n%s", rc, out);
    expect_output(out, "wte.weight                         [37, 16]");
    expect_output(out, "wpe.weight                         [16, 16]");
    expect_output(out, "h.1.mlp.c_proj.weight              [16, 64]");
    /* --seq defaults to the context when it is shorter than 40. */
    expect_output(out, "input                              [2, 16]");
    rc = run_toolf(out, OUT, "explain --init %s --heads 2 --seq 8 --layers 2 --vocab 37 --mesh 1 --axes data "
                  "--batch 2", hf);
    if (rc != 0) fail_msg("explain: %d\n%s", rc, out);
    expect_output(out, "input                              [2, 8]");
    free(out);
}

static void expect_refusal(const char *args, const char *a, const char *b)
{
    char *out = malloc(OUT);
    assert_non_null(out);
    int rc = run_toolf(out, OUT, "train %s", args);
    if (rc != 2) fail_msg("train %s: exit %d, not 2:\n%s", args, rc, out);
    expect_output(out, a);
    if (b) expect_output(out, b);
    free(out);
}

static void test_refuses_flags_that_clash(void **state)
{
    (void)state;
    char args[4 * PATH], msg[2 * PATH];
    snprintf(args, sizeof args, "--init %s --layers 4", llmc);
    snprintf(msg, sizeof msg, "--layers 4, but --init %s has 2 layers", llmc);
    expect_refusal(args, msg, NULL);
    snprintf(args, sizeof args, "--init %s --heads 2 --vocab 50", hf);
    snprintf(msg, sizeof msg, "--vocab 50, but --init %s has a vocabulary of 37", hf);
    expect_refusal(args, msg, NULL);
    snprintf(args, sizeof args, "--init %s --dim 32", llmc);
    expect_refusal(args, "--dim 32, but --init", "has dim 16");
    snprintf(args, sizeof args, "--init %s --context 32", llmc);
    expect_refusal(args, "--context 32, but --init", "has 16 positions");
    snprintf(args, sizeof args, "--init %s --heads 4", llmc);
    expect_refusal(args, "--heads 4, but --init", "has 2 heads (recorded in the file)");
    snprintf(args, sizeof args, "--init %s --seq 20", llmc);
    expect_refusal(args, "--seq 20 is longer than the context of --init", "(16 positions)");
    snprintf(args, sizeof args, "--init %s", hf);
    expect_refusal(args, "the number of heads is not in the file", "give --heads");
    snprintf(args, sizeof args, "--init %s --model mlp", llmc);
    expect_refusal(args, "--init loads GPT-2 weights; --model mlp", NULL);
    snprintf(args, sizeof args, "--init %s --resume /tmp", llmc);
    expect_refusal(args, "both give the starting weights", NULL);
    expect_refusal("--init /nonexistent/gpt2.bin", "cannot open /nonexistent/gpt2.bin",
                   "No such file");
    snprintf(args, sizeof args, "--init %s/make_weights_vectors.py", tv_dir());
    expect_refusal(args, "is neither a safetensors file", NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loss_matches_torch_from_hf),
        cmocka_unit_test(test_loss_matches_torch_from_llmc),
        cmocka_unit_test(test_loss_matches_torch_on_2x2_fsdp),
        cmocka_unit_test(test_init_on_stages_as_accumulation),
        cmocka_unit_test(test_init_save_export_keeps_the_weights),
        cmocka_unit_test(test_shape_comes_from_the_file),
        cmocka_unit_test(test_refuses_flags_that_clash),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
