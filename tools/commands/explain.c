/*
 * `spmd explain`: how a training step is partitioned, without running it:
 * each named tensor's sharding, each collective (kind, mesh axes, bytes per
 * device, phase, the value it moves), per-device memory and the fallbacks.
 * The text is the library's (spmd_program_explain, which the Python
 * package prints too); the tool adds what only it knows, and --json.
 */
#include "commands/explain.h"

#include "explain_trace.h"
#include "flags.h"
#include "json_file.h"
#include "message.h"
#include "model.h"
#include "report.h"

#include <cJSON.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Every named tensor's shape and sharding, for --json. */
static cJSON *tensors_json(const spmd_graph *g)
{
    cJSON *list = cJSON_CreateArray();
    for (int i = 0; i < spmd_graph_tensor_count(g); i++) {
        const spmd_tensor *t = spmd_graph_tensor(g, i);
        if (!spmd_tensor_name(t)) continue;
        char spec[256];
        spmd_get_sharding(t, spec, sizeof spec);
        if (!spec[0]) snprintf(spec, sizeof spec, "replicated");
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", spmd_tensor_name(t));
        cJSON *dims = cJSON_AddArrayToObject(o, "shape");
        for (int d = 0; d < spmd_tensor_rank(t); d++)
            cJSON_AddItemToArray(dims, cJSON_CreateNumber((double)spmd_tensor_dim(t, d)));
        cJSON_AddStringToObject(o, "sharding", spec);
        cJSON_AddItemToArray(list, o);
    }
    return list;
}

/* Each collective's estimate and measured median, for --json. */
static cJSON *measured_json(const spmd_program *p, const explain_measured *meas)
{
    cJSON *list = cJSON_CreateArray();
    for (int i = 0; i < meas->n; i++) {
        spmd_collective_info c;
        spmd_program_collective(p, i, &c);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "collective", i);
        cJSON_AddStringToObject(o, "kind", c.kind);
        cJSON_AddStringToObject(o, "value", c.tensor);
        /* No step: never measured. */
        cJSON_AddBoolToObject(o, "read_in_place", c.in_place && !c.written);
        cJSON_AddBoolToObject(o, "written_in_place", c.written);
        cJSON_AddNumberToObject(o, "estimate_us", c.seconds * 1e6);
        if (isnan(meas->median_us[i])) cJSON_AddNullToObject(o, "measured_us");
        else cJSON_AddNumberToObject(o, "measured_us", meas->median_us[i]);
        cJSON_AddNumberToObject(o, "samples", meas->samples[i]);
        cJSON_AddItemToArray(list, o);
    }
    return list;
}

/* The bubble: of a step's M + S - 1 slots of micro-batch work (forward,
 * then backward), each stage computes in M and waits in S - 1, in
 * GPipe's order and in 1F1B's alike. */
static double bubble(const cli_model *m)
{
    return (double)(m->stages - 1) / (m->micro_batches + m->stages - 1);
}

/* With --pp: the schedule, its computed bubble and, from a trace, each
 * device's measured idle fraction (docs/design/stages.md, "The bubble"). */
static void put_schedule(const cli_opts *o, const cli_model *m, const explain_measured *meas)
{
    if (o->pp_1f1b)
        printf("\nschedule: 1F1B, %d micro-batches over %d stages (stage s runs S-s-1 forwards, then one "
               "forward and one backward by turns: it holds at most S-s micro-batches' activations); ",
               m->micro_batches, m->stages);
    else
        printf("\nschedule: GPipe, %d micro-batches over %d stages (every forward, then every backward: "
               "each stage holds all M micro-batches' activations); ", m->micro_batches, m->stages);
    printf("bubble (S-1)/(M+S-1) = %d/%d = %.1f%% of a step idle on each device\n", m->stages - 1,
           m->micro_batches + m->stages - 1, 100 * bubble(m));
    if (!meas->idle) return;
    printf("  measured idle (steps %d to %d: not computing, in stage transfers or waiting to wake):",
           meas->first_step, meas->last_step);
    for (int d = 0; d < meas->n_devices; d++)
        if (!isnan(meas->idle[d])) printf(" device %d %.1f%%,", d, 100 * meas->idle[d]);
    printf(" mean %.1f%%\n", 100 * explain_idle_mean(meas));
    /* Per step, and the least disturbed step's (explain_idle_best). */
    int best_step = 0;
    double best = explain_idle_best(meas, &best_step);
    if (isnan(best)) return;
    printf("  measured idle per step (mean of the devices):");
    for (int k = 0; k < meas->n_steps; k++)
        if (!isnan(meas->step_idle[k])) printf(" step %d %.1f%%,", meas->steps[k], 100 * meas->step_idle[k]);
    printf(" least %.1f%% (step %d)\n", 100 * best, best_step);
}

static cJSON *pipeline_json(const cli_opts *opts, const cli_model *m, const explain_measured *meas)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "schedule", opts->pp_1f1b ? "1f1b" : "gpipe");
    cJSON_AddNumberToObject(o, "stages", m->stages);
    cJSON_AddNumberToObject(o, "microbatches", m->micro_batches);
    cJSON_AddNumberToObject(o, "bubble", bubble(m));
    if (meas->idle) {
        cJSON *list = cJSON_AddArrayToObject(o, "measured_idle");
        for (int d = 0; d < meas->n_devices; d++)
            cJSON_AddItemToArray(list, isnan(meas->idle[d]) ? cJSON_CreateNull() : cJSON_CreateNumber(meas->idle[d]));
        double mean = explain_idle_mean(meas);
        if (isnan(mean)) cJSON_AddNullToObject(o, "measured_idle_mean");
        else cJSON_AddNumberToObject(o, "measured_idle_mean", mean);
        cJSON *steps = cJSON_AddArrayToObject(o, "measured_idle_steps");
        for (int k = 0; k < meas->n_steps; k++) {
            cJSON *one = cJSON_CreateObject();
            cJSON_AddNumberToObject(one, "step", meas->steps[k]);
            if (isnan(meas->step_idle[k])) cJSON_AddNullToObject(one, "idle");
            else cJSON_AddNumberToObject(one, "idle", meas->step_idle[k]);
            cJSON_AddItemToArray(steps, one);
        }
        int best_step = 0;
        double best = explain_idle_best(meas, &best_step);
        if (isnan(best)) {
            cJSON_AddNullToObject(o, "measured_idle_least");
        } else {
            cJSON_AddNumberToObject(o, "measured_idle_least", best);
            cJSON_AddNumberToObject(o, "measured_idle_least_step", best_step);
        }
    }
    return o;
}

int cmd_explain(int argc, char **argv)
{
    cli_opts o;
    int rc = flags_parse(argc, argv, CMD_EXPLAIN, &o);
    if (rc) return rc < 0 ? 0 : rc;
    o.eval_samples = o.val_batches = 0; /* nothing is evaluated: no evaluation graph */
    cli_model m;
    rc = model_build(&o, &m);
    spmd_program *p = rc ? NULL : model_compile(&o, m.train.g, true);
    if (!p) {
        model_free(&m);
        return rc ? rc : 1;
    }
    char mesh[128];
    model_mesh_text(&m, mesh, sizeof mesh);
    explain_measured meas = {0};
    if (o.trace && (rc = explain_trace_read(o.trace, &o, (double)m.params, mesh, p, &meas))) {
        spmd_program_free(p);
        model_free(&m);
        return rc;
    }
    /* The text is the library's (spmd_program_explain), with what only
     * the tool knows: the model, the batch, where the network's figures
     * come from and the trace's measures. */
    char batch[64];
    model_batch_text(&o, &m, batch, sizeof batch);
    spmd_explain_options how = {.model = o.model, .batch = batch, .network_source = m.network_source,
                                .measured_us = o.trace ? meas.median_us : NULL,
                                .first_step = meas.first_step, .last_step = meas.last_step};
    char *text;
    if (spmd_program_explain(p, &how, &text) != SPMD_OK) {
        rc = cli_fail("explain: %s", spmd_last_error());
        explain_measured_free(&meas);
        spmd_program_free(p);
        model_free(&m);
        return rc;
    }
    fputs(text, stdout);
    free(text);
    if (o.pp) put_schedule(&o, &m, &meas);
    /* The JSON report is built only when asked for: for a deep model it
     * costs as much as the text. */
    if (o.json) {
        cJSON *root = cJSON_CreateObject();
        cJSON_AddItemToObject(root, "mesh", report_mesh(&m));
        cJSON_AddStringToObject(root, "model", o.model);
        cJSON_AddNumberToObject(root, "params", (double)m.params);
        if (m.copies > 1) {
            cJSON *c = cJSON_AddObjectToObject(root, "copies");
            cJSON_AddNumberToObject(c, "count", m.copies);
            cJSON_AddStringToObject(c, "axis", o.copies);
        }
        cJSON_AddItemToObject(root, "tensors", tensors_json(m.train.g));
        int unsettled = spmd_program_propagation_unsettled(p);
        if (unsettled) cJSON_AddNumberToObject(root, "propagation_unsettled_rounds", unsettled);
        cJSON_AddItemToObject(root, "collectives", report_collectives(p));
        size_t fly_bytes, fly_extra;
        cJSON *fly = cJSON_AddObjectToObject(root, "in_flight");
        cJSON_AddNumberToObject(fly, "collectives", spmd_program_overlap(p, &fly_bytes, &fly_extra));
        cJSON_AddNumberToObject(fly, "bytes", (double)fly_bytes);
        cJSON_AddNumberToObject(fly, "budget_bytes", (double)spmd_program_inflight_budget(p));
        cJSON_AddNumberToObject(fly, "arena_extra_bytes", (double)fly_extra);
        if (o.trace) cJSON_AddItemToObject(root, "measured", measured_json(p, &meas));
        if (o.pp) cJSON_AddItemToObject(root, "pipeline", pipeline_json(&o, &m, &meas));
        cJSON_AddItemToObject(root, "param_bytes_per_device", report_per_device(p, (double)model_param_bytes(p)));
        cJSON_AddItemToObject(root, "peak_bytes_per_device", report_per_device(p, (double)spmd_program_peak_bytes(p)));
        int nf = spmd_program_fallback_count(p);
        cJSON *fb = cJSON_CreateArray();
        for (int i = 0; i < nf; i++) {
            char line[256];
            spmd_program_fallback(p, i, line, sizeof line);
            cJSON_AddItemToArray(fb, cJSON_CreateString(line));
        }
        cJSON_AddItemToObject(root, "fallbacks", fb);
        cJSON_AddNumberToObject(root, "fallback_count", nf);
        rc = json_file_write("--json", "the report", o.json, root);
    }
    explain_measured_free(&meas);
    spmd_program_free(p);
    model_free(&m);
    return rc;
}
