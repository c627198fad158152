/*
 * `spmd explain`: how a training step is partitioned, without running it:
 * each named tensor's sharding, each collective (kind, mesh axes, bytes per
 * device, phase, the value it moves), per-device memory and the fallbacks.
 */
#include "explain.h"

#include "explain_trace.h"
#include "flags.h"
#include "json_file.h"
#include "message.h"
#include "model.h"
#include "outputs.h"
#include "report.h"

#include <cJSON.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void shape_text(const spmd_tensor *t, char *buf, size_t size)
{
    size_t n = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < spmd_tensor_rank(t); i++)
        n += (size_t)snprintf(buf + n, size - n, i ? ", %lld" : "%lld", (long long)spmd_tensor_dim(t, i));
    snprintf(buf + n, size - n, "]");
}

/* Which axes cross processes, when planned over several. */
static void print_processes(const cli_model *m)
{
    int procs = m->mesh ? spmd_mesh_processes(m->mesh) : 1;
    if (procs < 2) return;
    char across[256] = "", inside[256] = "";
    for (int a = 0; a < spmd_mesh_rank(m->mesh); a++) {
        char *list = spmd_mesh_axis_is_local(m->mesh, a) ? inside : across;
        size_t n = strlen(list);
        snprintf(list + n, sizeof across - n, "%s%s", n ? ", " : "", spmd_mesh_axis_name(m->mesh, a));
    }
    printf("processes: %d x %d devices (mesh position r in process r / %d); across processes: %s; "
           "inside a process: %s\n",
           procs, spmd_mesh_devices(m->mesh) / procs, spmd_mesh_devices(m->mesh) / procs,
           across[0] ? across : "none", inside[0] ? inside : "none");
    double latency, bandwidth;
    spmd_mesh_network(m->mesh, &latency, &bandwidth);
    printf("network (prices the axes across processes): %.1f us per message, %.2f GB/s (%s)\n",
           latency * 1e6, bandwidth / 1e9, m->network_source);
}

static void print_tensors(const cli_model *m, cJSON *list)
{
    printf("\ntensors (named):\n  %-34s %-18s %s\n", "name", "shape", "sharding");
    for (int i = 0; i < spmd_graph_tensor_count(m->train.g); i++) {
        const spmd_tensor *t = spmd_graph_tensor(m->train.g, i);
        if (!spmd_tensor_name(t)) continue;
        char shape[96], spec[256];
        shape_text(t, shape, sizeof shape);
        spmd_get_sharding(t, spec, sizeof spec);
        if (!spec[0]) snprintf(spec, sizeof spec, "replicated");
        printf("  %-34s %-18s %s\n", spmd_tensor_name(t), shape, spec);
        if (!list) continue;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", spmd_tensor_name(t));
        cJSON *dims = cJSON_AddArrayToObject(o, "shape");
        for (int d = 0; d < spmd_tensor_rank(t); d++)
            cJSON_AddItemToArray(dims, cJSON_CreateNumber((double)spmd_tensor_dim(t, d)));
        cJSON_AddStringToObject(o, "sharding", spec);
        cJSON_AddItemToArray(list, o);
    }
}

/* With --accumulate K the forward and backward collectives run once per
 * micro-batch (column "x": K a step), the update's once a step.  With a
 * trace (`meas`), each one's measured median next to its estimate. */
static void print_collectives(const spmd_program *p, int micro, const explain_measured *meas)
{
    int n = spmd_program_collective_count(p);
    double total = 0, per_micro = 0;
    printf("\ncollectives per step (%d):\n", n);
    if (micro > 1 && n)
        printf("  a step is %d micro-batches: the forward and backward ones run in each (x %d), "
               "the update's (the gradients' reductions) once\n", micro, micro);
    double est = 0, measured = 0;
    size_t fly_bytes, fly_extra;
    int flying = spmd_program_overlap(p, &fly_bytes, &fly_extra);
    if (n && meas)
        printf("  measured: the median of each collective's boxes in the trace (steps %d to %d, "
               "every device; a wait for a peer counts)\n", meas->first_step, meas->last_step);
    if (n) printf("  %-9s %-15s %-16s %12s %9s%s  %s%s%s\n", "phase", "kind", "axes", "bytes/device",
                  "est. us", meas ? " meas. us" : "", micro > 1 ? "x   " : "",
                  flying ? "in flight  " : "", "moves");
    for (int i = 0; i < n; i++) {
        spmd_collective_info c;
        char b[32], times[16] = "";
        spmd_program_collective(p, i, &c);
        total += (double)c.bytes * c.count;
        if (c.count > 1) per_micro += (double)c.bytes;
        est += c.seconds * c.count;
        if (micro > 1) snprintf(times, sizeof times, "%-3d ", c.count);
        char took[16] = "";
        if (meas && isnan(meas->median_us[i])) snprintf(took, sizeof took, " %9s", "-");
        else if (meas) snprintf(took, sizeof took, " %9.1f", meas->median_us[i]);
        if (meas && !isnan(meas->median_us[i])) measured += meas->median_us[i] * 1e-6 * c.count;
        /* In flight: over how many of the device's steps. */
        char fly[24] = "";
        if (flying && c.in_flight_steps) snprintf(fly, sizeof fly, "%-5d      ", c.in_flight_steps);
        else if (flying) snprintf(fly, sizeof fly, "%-11s", "-");
        printf("  %-9s %-15s %-16s %12s %9.1f%s  %s%s%s%s\n", c.phase, c.kind, c.axes,
               message_bytes((double)c.bytes, b, sizeof b), c.seconds * 1e6, took, times, fly, c.tensor,
               c.written ? ", written in place" : c.in_place ? ", read in place" : "");
    }
    char b[32], m[32], u[32], l[32];
    if (n && micro > 1)
        printf("  in all: %s per device per step (%s in each micro-batch, %s in the update), about "
               "%.2f ms by the alpha-beta model\n",
               message_bytes(total, b, sizeof b), message_bytes(per_micro, m, sizeof m),
               message_bytes(total - per_micro * micro, u, sizeof u), est * 1e3);
    else if (n)
        printf("  in all: %s per device per step, about %.2f ms by the alpha-beta model\n",
               message_bytes(total, b, sizeof b), est * 1e3);
    size_t budget = spmd_program_inflight_budget(p);
    if (flying || budget)
        printf("  in flight: %d of %d on each device's communication thread while it computes "
               "%s, %s of operands and results at most at once of a budget of %s, the arena %s "
               "larger\n",
               flying, n, flying ? "(column: the steps they span; -: a blocking step)"
                                 : "(each over the budget, or unable to gain)",
               message_bytes((double)fly_bytes, b, sizeof b),
               message_bytes((double)budget, l, sizeof l),
               message_bytes((double)fly_extra, m, sizeof m));
    if (n && meas)
        printf("  measured: %.2f ms a step (the medians summed), %.2fx the estimate\n", measured * 1e3,
               est > 0 ? measured / est : 0.0);
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

int cmd_explain(int argc, char **argv)
{
    cli_opts o;
    int rc = flags_parse(argc, argv, CMD_EXPLAIN, &o);
    if (rc) return rc < 0 ? 0 : rc;
    /* The report must not replace the trace it reads. */
    const outputs_file out[] = {{"--json", o.json}}, in[] = {{"--trace", o.trace}};
    if ((rc = outputs_check_apart(out, 1, in, 1))) return rc;
    o.eval_samples = o.val_batches = 0; /* nothing is evaluated: no evaluation graph */
    cli_model m;
    rc = model_build(&o, &m);
    spmd_program *p = rc ? NULL : model_compile(&o, m.train.g, true);
    if (!p) {
        model_free(&m);
        return rc ? rc : 1;
    }
    char mesh[128], a[32], b[32];
    model_mesh_text(&m, mesh, sizeof mesh);
    explain_measured meas = {0};
    if (o.trace && (rc = explain_trace_read(o.trace, o.model, (double)m.params, mesh, p, &meas))) {
        spmd_program_free(p);
        model_free(&m);
        return rc;
    }
    char batch[64];
    model_batch_text(&o, batch, sizeof batch);
    printf("spmd explain: %s, %.2fM parameters, mesh %s, %s\n", o.model, (double)m.params / 1e6,
           mesh, batch);
    print_processes(&m);
    if (m.copies > 1)
        printf("copies: %d along '%s', independent: each group along it trains a model of its own "
               "and no collective crosses it; the plan below is one copy's, on its group\n",
               m.copies, o.copies);
    /* The JSON report is built only when asked for: for a deep model it
     * costs as much as the printing. */
    cJSON *root = o.json ? cJSON_CreateObject() : NULL;
    if (root) {
        cJSON_AddItemToObject(root, "mesh", report_mesh(&m));
        cJSON_AddStringToObject(root, "model", o.model);
        cJSON_AddNumberToObject(root, "params", (double)m.params);
        if (m.copies > 1) {
            cJSON *c = cJSON_AddObjectToObject(root, "copies");
            cJSON_AddNumberToObject(c, "count", m.copies);
            cJSON_AddStringToObject(c, "axis", o.copies);
        }
    }
    print_tensors(&m, root ? cJSON_AddArrayToObject(root, "tensors") : NULL);
    print_collectives(p, o.optimizer.accumulate_steps, o.trace ? &meas : NULL);
    printf("\nmemory per device: %s parameters + gradients + optimizer state, %s peak\n",
           message_bytes((double)model_param_bytes(p), a, sizeof a), message_bytes((double)spmd_program_peak_bytes(p), b, sizeof b));
    int nf = spmd_program_fallback_count(p);
    printf("fallbacks (whole-tensor gathers an op forced): %d\n", nf);
    cJSON *fb = root ? cJSON_CreateArray() : NULL;
    for (int i = 0; i < nf; i++) {
        char line[256];
        spmd_program_fallback(p, i, line, sizeof line);
        printf("  %s\n", line);
        if (fb) cJSON_AddItemToArray(fb, cJSON_CreateString(line));
    }
    int unsettled = spmd_program_propagation_unsettled(p);
    if (unsettled)
        printf("propagation: not settled after %d rounds (a long chain of unmarked tensors): "
               "some may stay replicated where more rounds would split them; mark them\n",
               unsettled);
    if (root) {
        if (unsettled) cJSON_AddNumberToObject(root, "propagation_unsettled_rounds", unsettled);
        cJSON_AddItemToObject(root, "collectives", report_collectives(p));
        size_t fly_bytes, fly_extra;
        cJSON *fly = cJSON_AddObjectToObject(root, "in_flight");
        cJSON_AddNumberToObject(fly, "collectives", spmd_program_overlap(p, &fly_bytes, &fly_extra));
        cJSON_AddNumberToObject(fly, "bytes", (double)fly_bytes);
        cJSON_AddNumberToObject(fly, "budget_bytes", (double)spmd_program_inflight_budget(p));
        cJSON_AddNumberToObject(fly, "arena_extra_bytes", (double)fly_extra);
        if (o.trace) cJSON_AddItemToObject(root, "measured", measured_json(p, &meas));
        cJSON_AddItemToObject(root, "param_bytes_per_device", report_per_device(p, (double)model_param_bytes(p)));
        cJSON_AddItemToObject(root, "peak_bytes_per_device", report_per_device(p, (double)spmd_program_peak_bytes(p)));
        cJSON_AddItemToObject(root, "fallbacks", fb);
        cJSON_AddNumberToObject(root, "fallback_count", nf);
        rc = json_file_write(o.json, root);
    }
    explain_measured_free(&meas);
    spmd_program_free(p);
    model_free(&m);
    return rc;
}
