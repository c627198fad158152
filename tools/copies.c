/*
 * Independent copies (`--copies AXIS`): one model per group along an
 * independent mesh axis, each with its own seed, learning rate, warmup and
 * data stream, trained side by side with no collective between them (a
 * sweep in one job).  The lists come from --seed, --lr, --warmup and
 * --weight-decay (one value for every copy, or one each); this file checks
 * them against the mesh, opens each copy's data, and ranks and reports the
 * copies.
 */
#include "copies.h"

#include "message.h"

#include <cJSON.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint64_t copies_seed(const cli_opts *o, int c) { return o->n_seeds > 1 ? o->seeds[c] : o->seed; }
float copies_lr(const cli_opts *o, int c) { return o->n_lrs > 1 ? o->lrs[c] : o->lr; }
int copies_warmup(const cli_opts *o, int c) { return o->n_warmups > 1 ? o->warmups[c] : o->warmup; }
float copies_weight_decay(const cli_opts *o, int c)
{
    return o->n_wds > 1 ? o->wds[c] : o->optimizer.weight_decay;
}

float copies_lr_at(const cli_opts *o, int c, int step)
{
    float lr = copies_lr(o, c);
    return spmd_lr_schedule(step, copies_warmup(o, c), o->steps, lr, o->lr_constant ? lr : lr / 10);
}

/* A list of n values fits `copies` copies: one for all, or one each. */
static int check_count(const char *flag, int n, int copies, const char *axis)
{
    if (n <= 1 || n == copies) return 0;
    if (copies == 1)
        return cli_fail("%s lists %d values, one per copy, but the run has no copies (--copies "
                        "AXIS names the mesh axis whose groups train models of their own)",
                        flag, n);
    return cli_fail("%s lists %d values; the %d copies along '%s' take one value for all, or %d", flag,
                    n, copies, axis, copies);
}

int copies_setup(const cli_opts *o, spmd_mesh *mesh, int *count, spmd_dataset **copy_data)
{
    *count = 1;
    if (o->copies) {
        if (!mesh) return cli_fail("--copies %s: the run has one device", o->copies);
        int a = spmd_mesh_axis_index(mesh, o->copies);
        if (a < 0) return cli_fail("--copies %s: %s", o->copies, spmd_last_error());
        if (spmd_mesh_set_axis_independent(mesh, a, true) != SPMD_OK)
            return cli_fail("--copies %s: %s", o->copies, spmd_last_error());
        *count = spmd_mesh_copies(mesh);
    }
    int rc = check_count("--seed", o->n_seeds, *count, o->copies);
    if (!rc) rc = check_count("--lr", o->n_lrs, *count, o->copies);
    if (!rc) rc = check_count("--warmup", o->n_warmups, *count, o->copies);
    if (!rc) rc = check_count("--weight-decay", o->n_wds, *count, o->copies);
    if (rc) return rc;
    if (o->same_data && *count == 1) return cli_fail("--same-data: the run has no copies (--copies AXIS)");
    /* Each copy reads the order its seed gives, as a run of its own would. */
    for (int c = 1; c < *count && !o->same_data; c++) {
        if (copies_seed(o, c) == o->seed) continue;
        copy_data[c] = spmd_dataset_open(o->data, o->gpt.seq, copies_seed(o, c));
        if (!copy_data[c])
            return cli_fail("--data %s: %s", o->data ? o->data : "arith", spmd_last_error());
        if (o->data_sequential && spmd_dataset_set_order(copy_data[c], SPMD_DATA_SEQUENTIAL) != SPMD_OK)
            return cli_fail("--data-order sequential: %s", spmd_last_error());
    }
    return 0;
}

void copies_free(spmd_dataset **copy_data)
{
    for (int c = 0; c < CLI_MAX_COPIES; c++) spmd_dataset_free(copy_data[c]);
}

const uint64_t *copies_seeds(const cli_opts *o) { return o->n_seeds > 1 ? o->seeds : NULL; }

/* ---- Ranking and reporting ------------------------------------------------------ */

typedef struct ranked {
    int copy;
    double loss;
} ranked;

static int by_loss(const void *x, const void *y)
{
    const ranked *a = x, *b = y;
    bool fa = isfinite(a->loss), fb = isfinite(b->loss);
    if (fa != fb) return fa ? -1 : 1; /* diverged copies last */
    if (fa && a->loss != b->loss) return a->loss < b->loss ? -1 : 1;
    return a->copy - b->copy;
}

void copies_rank(const cli_opts *o, int copies, const double *final, bool validated)
{
    ranked r[CLI_MAX_COPIES];
    for (int c = 0; c < copies; c++) r[c] = (ranked){c, final[c]};
    qsort(r, (size_t)copies, sizeof *r, by_loss);
    printf("copies ranked by final %s loss:\n", validated ? "validation" : "training");
    for (int i = 0; i < copies; i++) {
        int c = r[i].copy;
        printf("  %d. copy %d: %s%.4f  (seed %llu, lr %g, warmup %d, weight decay %g)\n", i + 1, c,
               isfinite(r[i].loss) ? "" : "diverged, ", r[i].loss,
               (unsigned long long)copies_seed(o, c), (double)copies_lr(o, c), copies_warmup(o, c),
               (double)copies_weight_decay(o, c));
    }
}

cJSON *copies_json(const cli_opts *o, int c, const float *losses, int stride, int steps)
{
    cJSON *e = cJSON_CreateObject();
    cJSON_AddNumberToObject(e, "copy", c);
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)copies_seed(o, c));
    cJSON_AddStringToObject(e, "seed", seed);
    cJSON_AddNumberToObject(e, "lr", copies_lr(o, c));
    cJSON_AddNumberToObject(e, "warmup", copies_warmup(o, c));
    cJSON_AddNumberToObject(e, "weight_decay", copies_weight_decay(o, c));
    cJSON *loss = cJSON_AddArrayToObject(e, "loss");
    for (int i = 0; i < steps; i++) {
        float v = losses[(size_t)i * (size_t)stride + (size_t)c];
        cJSON_AddItemToArray(loss, isfinite(v) ? cJSON_CreateNumber(v) : cJSON_CreateNull());
    }
    return e;
}
