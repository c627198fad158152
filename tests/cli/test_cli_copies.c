/*
 * `spmd train --copies AXIS`: independent models on one mesh.  Each copy's
 * losses are the bits of the same model trained alone on a mesh of its
 * group's shape with that copy's seed and learning rate; no collective
 * crosses the copy axis and a device holds what one copy needs; a sweep
 * ranks the copies and reports each; bad lists and a split over the copy
 * axis are refused.
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

#include "support_files.h"
#include "support_json.h"
#include "support_tool.h"

#ifndef SPMD_TOOL_PATH
#error "SPMD_TOOL_PATH must name the spmd binary"
#endif

static char *dir;
static char out[1 << 16];

static const cJSON *item(const cJSON *j, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    assert_non_null(v);
    return v;
}

/* Every step's loss of `copy` in a copies report equals the loss of a run
 * alone (its report at `solo`), bit for bit. */
static void same_losses(const cJSON *copies_report, int copy, const char *solo)
{
    const cJSON *c = cJSON_GetArrayItem(item(copies_report, "copies"), copy);
    assert_non_null(c);
    cJSON *s = support_load_json(solo);
    const cJSON *a = item(c, "loss"), *b = item(s, "loss");
    assert_int_equal(cJSON_GetArraySize(a), cJSON_GetArraySize(b));
    for (int i = 0; i < cJSON_GetArraySize(a); i++) {
        float x = (float)cJSON_GetArrayItem(a, i)->valuedouble, y = (float)cJSON_GetArrayItem(b, i)->valuedouble;
        if (memcmp(&x, &y, sizeof x))
            fail_msg("copy %d step %d: loss %.9g, alone %.9g", copy, i + 1, (double)x, (double)y);
    }
    cJSON_Delete(s);
}

/* 4x2 (copy, fsdp): four models with their own seeds, learning rates and
 * weight decays (fed each step), each the bits of a 2-device fsdp run of
 * its own (decay compiled in). */
static void test_copies_match_solo_runs(void **state)
{
    (void)state;
    const char *seeds[] = {"1", "2", "3", "4"}, *lrs[] = {"1e-3", "3e-3", "1e-2", "3e-2"};
    const char *wds[] = {"0", "0.1", "0.5", "2"};
    const char *common = "--steps 8 --batch 8 --eval 0";
    char report[SUPPORT_PATH], solo[SUPPORT_PATH];
    support_path_in(report, dir, "copies.json");
    support_path_in(solo, dir, "solo.json");
    if (run_toolf(out, sizeof out,
                  "train %s --mesh 4x2 --axes copy,fsdp --copies copy --seed 1,2,3,4 "
                  "--lr 1e-3,3e-3,1e-2,3e-2 --weight-decay 0,0.1,0.5,2 --json %s", common, report) != 0)
        fail_msg("%s", out);
    assert_non_null(strstr(out, "copies ranked by final training loss"));
    cJSON *r = support_load_json(report);
    assert_int_equal(cJSON_GetArraySize(item(r, "copies")), 4);
    for (int c = 0; c < 4; c++) {
        if (run_toolf(out, sizeof out,
                      "train %s --mesh 2 --axes fsdp --seed %s --lr %s --weight-decay %s --json %s",
                      common, seeds[c], lrs[c], wds[c], solo) != 0)
            fail_msg("%s", out);
        same_losses(r, c, solo);
        const cJSON *e = cJSON_GetArrayItem(item(r, "copies"), c);
        assert_string_equal(item(e, "seed")->valuestring, seeds[c]);
        double lr = strtod(lrs[c], NULL);
        assert_true(fabs(item(e, "lr")->valuedouble - lr) <= 1e-6 * lr);
    }
    /* No collective over the copy axis. */
    const cJSON *coll;
    cJSON_ArrayForEach(coll, item(r, "collectives"))
    {
        const cJSON *axis;
        cJSON_ArrayForEach(axis, item(coll, "axes")) assert_string_not_equal(axis->valuestring, "copy");
    }
    cJSON_Delete(r);
}

/* 2x2x2 (copy, data, fsdp): two models, each data-parallel over two pairs,
 * each the bits of a 2x2 (data, fsdp) run of its own; validation too. */
static void test_copies_with_data_axis(void **state)
{
    (void)state;
    const char *common = "--steps 6 --batch 8 --eval 0 --val-every 3 --val-batches 2";
    char report[SUPPORT_PATH], solo[SUPPORT_PATH], plot[SUPPORT_PATH];
    support_path_in(report, dir, "copies3.json");
    support_path_in(solo, dir, "solo3.json");
    support_path_in(plot, dir, "copies3.svg");
    if (run_toolf(out, sizeof out,
                  "train %s --mesh 2x2x2 --axes copy,data,fsdp --copies copy --seed 5,6 "
                  "--lr 2e-3 --warmup 0,2 --json %s --plot %s", common, report, plot) != 0)
        fail_msg("%s", out);
    /* The plot draws every copy: its 6 losses and 2 validations each. */
    FILE *f = fopen(plot, "r");
    assert_non_null(f);
    static char svg[1 << 18];
    svg[fread(svg, 1, sizeof svg - 1, f)] = '\0';
    fclose(f);
    for (int c = 0; c < 2; c++) {
        char want[96];
        snprintf(want, sizeof want, "id=\"copy-%d-loss\" data-points=\"6\"", c);
        if (!strstr(svg, want)) fail_msg("no '%s' in the plot", want);
        snprintf(want, sizeof want, "id=\"copy-%d-val\" data-points=\"2\"", c);
        if (!strstr(svg, want)) fail_msg("no '%s' in the plot", want);
    }
    assert_non_null(strstr(out, "copies ranked by final validation loss"));
    cJSON *r = support_load_json(report);
    const char *seeds[] = {"5", "6"}, *warmups[] = {"0", "2"};
    for (int c = 0; c < 2; c++) {
        if (run_toolf(out, sizeof out,
                      "train %s --mesh 2x2 --axes data,fsdp --seed %s --lr 2e-3 --warmup %s --json %s",
                      common, seeds[c], warmups[c], solo) != 0)
            fail_msg("%s", out);
        same_losses(r, c, solo);
        cJSON *s = support_load_json(solo);
        const cJSON *a = item(cJSON_GetArrayItem(item(r, "copies"), c), "val_loss");
        const cJSON *b = item(s, "val_loss");
        assert_int_equal(cJSON_GetArraySize(a), 2);
        for (int k = 0; k < 2; k++)
            assert_true(item(cJSON_GetArrayItem(a, k), "loss")->valuedouble ==
                        item(cJSON_GetArrayItem(b, k), "loss")->valuedouble);
        cJSON_Delete(s);
    }
    cJSON_Delete(r);
}

/* explain names the copies, plans one copy: the same collectives and
 * per-device memory as the group's mesh alone. */
static void test_explain_one_copy(void **state)
{
    (void)state;
    char a[SUPPORT_PATH], b[SUPPORT_PATH];
    support_path_in(a, dir, "explain-copies.json");
    support_path_in(b, dir, "explain-solo.json");
    if (run_toolf(out, sizeof out, "explain --mesh 4x2 --axes copy,fsdp --copies copy --json %s", a) != 0)
        fail_msg("%s", out);
    assert_non_null(strstr(out, "copies: 4 along 'copy', independent"));
    if (run_toolf(out, sizeof out, "explain --mesh 2 --axes fsdp --json %s", b) != 0) fail_msg("%s", out);
    cJSON *x = support_load_json(a), *y = support_load_json(b);
    assert_int_equal((int)item(item(x, "copies"), "count")->valuedouble, 4);
    const char *same[] = {"collectives", "param_bytes_per_device", "peak_bytes_per_device"};
    for (int i = 0; i < 3; i++) {
        char *p = cJSON_PrintUnformatted(item(x, same[i])), *q = cJSON_PrintUnformatted(item(y, same[i]));
        /* Per device the figures repeat for every device: compare one. */
        if (i > 0) {
            assert_true(cJSON_GetArrayItem(item(x, same[i]), 0)->valuedouble ==
                        cJSON_GetArrayItem(item(y, same[i]), 0)->valuedouble);
        } else {
            assert_string_equal(p, q);
        }
        free(p), free(q);
    }
    cJSON_Delete(x);
    cJSON_Delete(y);
}

/* --save with copies writes one checkpoint per copy (DIR/copy-C, with its
 * own settings); --resume restores every copy, and a copy's checkpoint
 * resumes alone on its group's mesh: all continue with the uninterrupted
 * losses, bit for bit. */
static void test_copies_checkpoints(void **state)
{
    (void)state;
    const char *flags = "train --mesh 4x2 --axes copy,fsdp --copies copy --lr 1e-3,3e-3,1e-2,3e-2 "
                        "--seed 1,2,3,4 --eval 0 --batch 8 --steps 10";
    char ckpt[SUPPORT_PATH], straight[SUPPORT_PATH], resumed[SUPPORT_PATH], solo[SUPPORT_PATH],
        copy2[SUPPORT_PATH], latest[SUPPORT_PATH], sub[SUPPORT_PATH];
    support_path_in(ckpt, dir, "ckpt");
    support_path_in(straight, dir, "straight.json");
    support_path_in(resumed, dir, "resumed.json");
    support_path_in(solo, dir, "solo-copy2.json");
    support_path_in(copy2, ckpt, "copy-2");
    if (run_toolf(out, sizeof out, "%s --json %s", flags, straight) != 0) fail_msg("%s", out);
    if (run_toolf(out, sizeof out, "%s --save %s --save-every 6", flags, ckpt) != 0) fail_msg("%s", out);
    /* Roll every copy back to step 6 (latest names the step to resume). */
    for (int c = 0; c < 4; c++) {
        snprintf(sub, sizeof sub, "copy-%d", c);
        char copy_dir[SUPPORT_PATH];
        support_path_in(copy_dir, ckpt, sub);
        FILE *f = fopen(support_path_in(latest, copy_dir, "latest"), "w");
        assert_non_null(f);
        fputs("step-00000006\n", f);
        fclose(f);
    }
    if (run_toolf(out, sizeof out, "%s --resume %s --json %s", flags, ckpt, resumed) != 0)
        fail_msg("%s", out);
    if (run_toolf(out, sizeof out,
                  "train --mesh 2 --axes fsdp --lr 1e-2 --seed 3 --eval 0 --batch 8 --steps 10 "
                  "--resume %s --json %s", copy2, solo) != 0)
        fail_msg("%s", out);
    cJSON *a = support_load_json(straight), *b = support_load_json(resumed), *s = support_load_json(solo);
    for (int c = 0; c < 4; c++) {
        const cJSON *la = item(cJSON_GetArrayItem(item(a, "copies"), c), "loss");
        const cJSON *lb = item(cJSON_GetArrayItem(item(b, "copies"), c), "loss");
        assert_int_equal(cJSON_GetArraySize(lb), 4);
        for (int i = 0; i < 4; i++)
            assert_true(cJSON_GetArrayItem(la, 6 + i)->valuedouble == cJSON_GetArrayItem(lb, i)->valuedouble);
        if (c == 2)
            for (int i = 0; i < 4; i++)
                assert_true(cJSON_GetArrayItem(la, 6 + i)->valuedouble ==
                            cJSON_GetArrayItem(item(s, "loss"), i)->valuedouble);
    }
    cJSON_Delete(a), cJSON_Delete(b), cJSON_Delete(s);
}

static void test_bad_copies(void **state)
{
    (void)state;
    const char *mesh = "--mesh 4x2 --axes copy,fsdp --copies copy --steps 2";
    assert_int_equal(run_toolf(out, sizeof out, "train %s --lr 1e-3,2e-3", mesh), 2);
    assert_non_null(strstr(out, "--lr lists 2 values; the 4 copies along 'copy'"));
    assert_int_equal(run_toolf(out, sizeof out, "train %s --lr 1e-3,abc,1,2", mesh), 2);
    assert_non_null(strstr(out, "'abc'"));
    assert_int_equal(run_toolf(out, sizeof out, "train %s --seed 1,2,x,4", mesh), 2);
    assert_non_null(strstr(out, "'x'"));
    assert_int_equal(run_toolf(out, sizeof out, "train %s --warmup 1,2,3", mesh), 2);
    assert_non_null(strstr(out, "--warmup lists 3 values"));
    assert_int_equal(run_toolf(out, sizeof out, "train %s --lr 1e-3,,2e-3", mesh), 2);
    assert_non_null(strstr(out, "empty"));
    assert_int_not_equal(run_toolf(out, sizeof out, "train %s --shard 'h.*.weight=copy, None'", mesh), 0);
    assert_non_null(strstr(out, "'copy', which is independent"));
    assert_int_not_equal(run_toolf(out, sizeof out, "train %s --fsdp copy", mesh), 0);
    assert_non_null(strstr(out, "independent"));
    assert_int_equal(run_toolf(out, sizeof out, "train --lr 1e-3,2e-3 --steps 2"), 2);
    assert_non_null(strstr(out, "no copies"));
    assert_int_equal(run_toolf(out, sizeof out, "train --mesh 4x2 --axes copy,fsdp --copies cpy"), 2);
    assert_non_null(strstr(out, "cpy"));
    assert_int_equal(run_toolf(out, sizeof out, "train --same-data on --steps 2"), 2);
    assert_non_null(strstr(out, "--same-data"));
}

static int setup(void **state)
{
    (void)state;
    dir = support_temp_dir("spmd-copies");
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
        cmocka_unit_test(test_copies_match_solo_runs),
        cmocka_unit_test(test_copies_with_data_axis),
        cmocka_unit_test(test_explain_one_copy),
        cmocka_unit_test(test_copies_checkpoints),
        cmocka_unit_test(test_bad_copies),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
