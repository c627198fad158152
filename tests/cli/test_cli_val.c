/*
 * `spmd train --val-every / --val-batches / --val-data`: the validation
 * loss is printed, logged and reported at its steps; it equals a separate
 * forward-only computation of the saved parameters on the same batches;
 * validating changes nothing in training; bad values are refused.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <cJSON.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spmd/checkpoint.h"
#include "spmd/data.h"
#include "spmd/models.h"
#include "support_files.h"
#include "support_json.h"
#include "support_tool.h"

#ifndef SPMD_TOOL_PATH
#error "SPMD_TOOL_PATH must name the spmd binary"
#endif

static char *dir;
static char out[1 << 16];

/* The report's val_loss entry for `step`; NaN if none. */
static double val_loss_at(const cJSON *report, int step)
{
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(report, "val_loss"))
    {
        if ((int)cJSON_GetObjectItemCaseSensitive(e, "step")->valuedouble == step)
            return cJSON_GetObjectItemCaseSensitive(e, "loss")->valuedouble;
    }
    return NAN;
}

/* The mean loss over the first `batches` held-out batches of the built-in
 * additions, of the GPT saved in `ckpt`, computed on one device by a
 * forward-only program of its own: the oracle for the tool's validation. */
static double forward_only_loss(const char *ckpt, int batches, int batch)
{
    spmd_gpt_config cfg = {.vocab = SPMD_ARITH_VOCAB, .seq = 40, .layers = 2, .heads = 4, .dim = 96};
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_gpt_tensors t;
    assert_int_equal(spmd_gpt_build(g, &cfg, batch, &t), SPMD_OK);
    assert_int_equal(spmd_graph_mark_output(g, t.loss), SPMD_OK);
    spmd_program *p = spmd_compile(g, &(spmd_compile_options){.seed = 99});
    assert_non_null(p);
    if (spmd_checkpoint_load(p, ckpt, NULL, NULL) != SPMD_OK) fail_msg("%s", spmd_last_error());
    spmd_dataset *d = spmd_dataset_open("arith", cfg.seq, 1);
    assert_non_null(d);
    size_t n = (size_t)batch * (size_t)cfg.seq;
    int32_t *in = malloc(n * sizeof *in), *tg = malloc(n * sizeof *tg);
    double sum = 0;
    for (int k = 0; k < batches; k++) {
        float loss;
        assert_int_equal(spmd_dataset_batch(d, SPMD_SPLIT_HELDOUT, (int64_t)k * batch, batch, in, tg),
                         SPMD_OK);
        assert_int_equal(spmd_program_set_input(p, t.input, in, n * sizeof *in), SPMD_OK);
        assert_int_equal(spmd_program_set_input(p, t.targets, tg, n * sizeof *tg), SPMD_OK);
        assert_int_equal(spmd_program_run(p), SPMD_OK);
        assert_int_equal(spmd_program_read(p, t.loss, &loss, sizeof loss), SPMD_OK);
        sum += loss;
    }
    free(in), free(tg);
    spmd_dataset_free(d);
    spmd_program_free(p);
    spmd_graph_free(g);
    return sum / batches;
}

/* On the 4x2 mesh: validations at 10, 20 and the last step (25), in the
 * output, the log and the report; the last equals the forward-only loss of
 * the saved parameters within float rounding (the mesh sums in another
 * order than one device). */
static void test_val_loss_everywhere(void **state)
{
    (void)state;
    char report[SUPPORT_PATH], log[SUPPORT_PATH], ckpt[SUPPORT_PATH];
    support_path_in(report, dir, "val.json");
    support_path_in(log, dir, "val.jsonl");
    support_path_in(ckpt, dir, "ckpt");
    if (run_toolf(out, sizeof out,
                  "train --steps 25 --batch 16 --val-every 10 --val-batches 3 --eval 0 "
                  "--save %s --log %s --json %s", ckpt, log, report) != 0)
        fail_msg("%s", out);
    for (int s = 10; s <= 30; s += 10) {
        char line[64];
        snprintf(line, sizeof line, "step %4d/25  val loss ", s > 20 ? 25 : s);
        if (!strstr(out, line)) fail_msg("no '%s' in:\n%s", line, out);
    }
    assert_non_null(strstr(out, "(3 batches of 16)"));

    cJSON *r = support_load_json(report);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(r, "val_loss")), 3);
    double last = val_loss_at(r, 25);
    assert_true(isfinite(val_loss_at(r, 10)) && isfinite(val_loss_at(r, 20)) && isfinite(last));
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(r, "validation");
    assert_int_equal((int)cJSON_GetObjectItemCaseSensitive(v, "samples")->valuedouble, 48);
    cJSON_Delete(r);

    /* The log has the same three, as their own lines. */
    FILE *f = fopen(log, "r");
    assert_non_null(f);
    char line[512];
    int logged = 0;
    double logged_last = NAN;
    while (fgets(line, sizeof line, f)) {
        cJSON *j = cJSON_Parse(line);
        assert_non_null(j);
        const cJSON *vl = cJSON_GetObjectItemCaseSensitive(j, "val_loss");
        if (vl) logged++, logged_last = vl->valuedouble;
        cJSON_Delete(j);
    }
    fclose(f);
    assert_int_equal(logged, 3);
    assert_true(fabs(logged_last - last) <= 1e-6 * fabs(last));

    double oracle = forward_only_loss(ckpt, 3, 16);
    if (!(fabs(oracle - last) <= 1e-5 * fabs(oracle)))
        fail_msg("validation loss %.9g, forward-only on one device %.9g", last, oracle);
}

/* Validating reads the parameters and touches nothing else: the training
 * losses are the same bits with and without it. */
static void test_validation_changes_no_training(void **state)
{
    (void)state;
    char plain[SUPPORT_PATH], with[SUPPORT_PATH];
    support_path_in(plain, dir, "plain.json");
    support_path_in(with, dir, "with.json");
    const char *flags = "train --steps 12 --batch 8 --eval 0 --mesh 2x2 --axes replica,fsdp";
    if (run_toolf(out, sizeof out, "%s --json %s", flags, plain) != 0) fail_msg("%s", out);
    if (run_toolf(out, sizeof out, "%s --val-every 3 --json %s", flags, with) != 0) fail_msg("%s", out);
    cJSON *a = support_load_json(plain), *b = support_load_json(with);
    const cJSON *la = cJSON_GetObjectItemCaseSensitive(a, "loss"),
                *lb = cJSON_GetObjectItemCaseSensitive(b, "loss");
    assert_int_equal(cJSON_GetArraySize(la), 12);
    for (int i = 0; i < 12; i++)
        assert_true(cJSON_GetArrayItem(la, i)->valuedouble == cJSON_GetArrayItem(lb, i)->valuedouble);
    assert_null(cJSON_GetObjectItemCaseSensitive(a, "val_loss"));
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(b, "val_loss")), 4);
    cJSON_Delete(a);
    cJSON_Delete(b);
}

/* --val-data: another text file's held-out split; alone it validates at
 * the last step. */
static void test_val_data(void **state)
{
    (void)state;
    char train_txt[SUPPORT_PATH], val_txt[SUPPORT_PATH], report[SUPPORT_PATH];
    support_path_in(train_txt, dir, "train.txt");
    support_path_in(val_txt, dir, "val.txt");
    support_path_in(report, dir, "text.json");
    FILE *a = fopen(train_txt, "w"), *b = fopen(val_txt, "w");
    assert_true(a && b);
    for (int i = 0; i < 400; i++) fprintf(a, "the quick brown fox %d jumps\n", i);
    for (int i = 0; i < 100; i++) fprintf(b, "a lazy dog sleeps %d times\n", i);
    fclose(a), fclose(b);
    if (run_toolf(out, sizeof out,
                  "train --data %s --val-data %s --steps 6 --batch 8 --seq 16 --json %s", train_txt,
                  val_txt, report) != 0)
        fail_msg("%s", out);
    assert_non_null(strstr(out, "step    6/6  val loss "));
    cJSON *r = support_load_json(report);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(r, "val_loss")), 1);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(r, "validation");
    assert_non_null(strstr(cJSON_GetObjectItemCaseSensitive(v, "data")->valuestring, "val.txt"));
    cJSON_Delete(r);
    /* Validation data whose tokens the model cannot read. */
    assert_int_equal(run_toolf(out, sizeof out, "train --val-data %s --steps 2", val_txt), 2);
    assert_non_null(strstr(out, "--val-data"));
}

static void test_bad_val_flags(void **state)
{
    (void)state;
    assert_int_equal(run_toolf(out, sizeof out, "train --val-every -1"), 2);
    assert_non_null(strstr(out, "--val-every"));
    assert_int_equal(run_toolf(out, sizeof out, "train --val-batches 0"), 2);
    assert_non_null(strstr(out, "--val-batches"));
    assert_int_equal(run_toolf(out, sizeof out, "train --val-every ten"), 2);
    assert_non_null(strstr(out, "ten"));
    assert_int_equal(run_toolf(out, sizeof out, "train --val-data %s/none.bin --steps 2", dir), 2);
    assert_non_null(strstr(out, "--val-data"));
    assert_non_null(strstr(out, "none.bin"));
}

static int setup(void **state)
{
    (void)state;
    dir = support_temp_dir("spmd-val");
    return dir ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    support_drop_dir(dir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_val_loss_everywhere),
        cmocka_unit_test(test_validation_changes_no_training),
        cmocka_unit_test(test_val_data),
        cmocka_unit_test(test_bad_val_flags),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
