/*
 * `spmd train`: compile one training step and run it for --steps steps,
 * with a live progress line, a summary and an optional JSON report.
 */
#include "cli.h"

#include <cJSON.h>

#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int report(const cli_opts *o, const cli_model *m, const spmd_program *p, const float *losses,
                  double ms, double accuracy)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddItemToObject(root, "mesh", cli_mesh_json(m));
    cJSON_AddStringToObject(root, "model", o->model);
    cJSON_AddNumberToObject(root, "params", (double)m->params);
    cJSON_AddNumberToObject(root, "steps", o->steps);
    cJSON *loss = cJSON_AddArrayToObject(root, "loss");
    for (int i = 0; i < o->steps; i++) cJSON_AddItemToArray(loss, cJSON_CreateNumber(losses[i]));
    cJSON_AddNumberToObject(root, "ms_per_step", ms);
    cJSON_AddNumberToObject(root, "tokens_per_s", (double)m->tokens_per_step / (ms / 1e3));
    cJSON_AddNumberToObject(root, "flops_per_step", m->flops_per_step);
    cJSON_AddItemToObject(root, "param_bytes_per_device", cli_per_device(p, (double)cli_param_bytes(p)));
    cJSON_AddItemToObject(root, "peak_bytes_per_device", cli_per_device(p, (double)spmd_program_peak_bytes(p)));
    cJSON_AddItemToObject(root, "collectives", cli_collectives_json(p));
    if (accuracy >= 0) cJSON_AddNumberToObject(root, "accuracy", accuracy);
    cJSON_AddStringToObject(root, "data", spmd_dataset_describe(m->data));
    return cli_write_json(o->json, root);
}

int cmd_train(int argc, char **argv)
{
    cli_opts o;
    int rc = cli_parse(argc, argv, "train", &o);
    if (rc) return rc < 0 ? 0 : rc;
    cli_model m;
    rc = cli_build(&o, &m);
    spmd_program *p = rc ? NULL : cli_compile(&o, m.train.g, false);
    spmd_program *eval = p && m.eval.g ? cli_compile(&o, m.eval.g, false) : NULL;
    if (!p || (m.eval.g && !eval)) {
        spmd_program_free(p);
        cli_model_free(&m);
        return rc ? rc : 1;
    }
    char mesh[128];
    cli_mesh_text(&m, mesh, sizeof mesh);
    printf("spmd train: %s, %.2fM parameters, mesh %s, batch %d, %s, %s\n", o.model,
           (double)m.params / 1e6, mesh, o.batch,
           o.optimizer.kind == SPMD_OPTIMIZER_ADAMW ? "AdamW" : "SGD", spmd_blas_describe());
    printf("data: %s\n", spmd_dataset_describe(m.data));
    printf("per device: %.1f MiB peak, %.1f MiB parameters + gradients + optimizer state, "
           "%d collectives per step\n",
           (double)spmd_program_peak_bytes(p) / 1048576.0, (double)cli_param_bytes(p) / 1048576.0,
           spmd_program_collective_count(p));

    float *losses = malloc((size_t)o.steps * sizeof *losses);
    double *ms = malloc((size_t)o.steps * sizeof *ms);
    rc = !losses || !ms ? cli_fail("out of memory") : 0;
    double start = now_ms();
    for (int s = 0; s < o.steps && !rc; s++) {
        double t0 = now_ms();
        rc = cli_feed(&o, &m, p, s);
        if (rc) break;
        spmd_status st = spmd_program_run(p);
        if (st == SPMD_OK) st = spmd_program_read(p, m.train.loss, &losses[s], sizeof losses[s]);
        if (st != SPMD_OK) {
            fprintf(stderr, "\nspmd: step %d failed: %s\n", s + 1, spmd_last_error());
            rc = 1;
            break;
        }
        ms[s] = now_ms() - t0;
        double elapsed = (now_ms() - start) / 1e3;
        double eta = elapsed / (s + 1) * (o.steps - s - 1);
        printf("\rstep %4d/%d  loss %.4f  %.0f tok/s  %.1f ms/step  eta %.0fs   ", s + 1, o.steps,
               (double)losses[s], (double)m.tokens_per_step / (ms[s] / 1e3), ms[s], eta);
        fflush(stdout);
    }
    printf("\n");
    if (!rc) {
        double *sorted = malloc((size_t)o.steps * sizeof *sorted);
        if (!sorted) {
            rc = cli_fail("out of memory");
            goto out;
        }
        memcpy(sorted, ms, (size_t)o.steps * sizeof *ms);
        qsort(sorted, (size_t)o.steps, sizeof *sorted, cmp_double);
        double median = sorted[o.steps / 2];
        free(sorted);
        double accuracy = cli_accuracy(&o, &m, p, eval);
        printf("done: loss %.4f -> %.4f, median %.1f ms/step (%.0f tok/s, %.2f GFLOP/s)\n",
               (double)losses[0], (double)losses[o.steps - 1], median,
               (double)m.tokens_per_step / (median / 1e3), m.flops_per_step / (median / 1e3) / 1e9);
        if (accuracy >= 0)
            printf("held-out accuracy: %.1f%% of %d samples' answer digits (chance 10%%)\n",
                   accuracy * 100, o.eval_samples);
        printf("per device: %.1f MiB peak, %.1f MiB parameters + gradients + optimizer state; "
               "%d collectives per step\n",
               (double)spmd_program_peak_bytes(p) / 1048576.0, (double)cli_param_bytes(p) / 1048576.0,
               spmd_program_collective_count(p));
        if (o.json) rc = report(&o, &m, p, losses, median, accuracy);
    }
out:
    free(losses), free(ms);
    spmd_program_free(eval);
    spmd_program_free(p);
    cli_model_free(&m);
    return rc;
}
