/*
 * Settling the model commands' flags (flag_settle.h): the defaults that
 * depend on other settings, the checks across flags, and under mpirun the
 * agreement of every process on the result.
 */
#include "flag_settle.h"

#include "flag_table.h"
#include "message.h"
#include "processes.h"
#include "settings_agree.h"
#include "weights.h"

#include <stdio.h>

/* Each optimizer setting not given takes its kind's default (PyTorch's,
 * but AdamW decays 0.01 and clips at 1 as nanoGPT does); a setting of the
 * other kind is an error. */
static int optimizer_defaults(cli_opts *o)
{
    spmd_optimizer *opt = &o->optimizer;
    bool adamw = opt->kind == SPMD_OPTIMIZER_ADAMW;
    const char *names[] = {"--beta1", "--beta2", "--eps"};
    float *moments[] = {&opt->beta1, &opt->beta2, &opt->eps};
    const float adam[] = {0.9f, 0.999f, 1e-8f};
    for (int i = 0; i < 3; i++) {
        bool given = flags_given(o, names[i]);
        if (!adamw && given)
            return cli_fail("%s is an AdamW setting; --optimizer sgd takes --lr, --weight-decay "
                            "and --clip", names[i]);
        if (!given) *moments[i] = adamw ? adam[i] : 0.0f;
    }
    if (!flags_given(o, "--weight-decay")) opt->weight_decay = adamw ? 0.01f : 0.0f;
    if (!flags_given(o, "--clip")) opt->clip_norm = adamw ? 1.0f : 0.0f;
    if (!flags_given(o, "--schedule")) o->lr_constant = !adamw;
    if (!flags_given(o, "--warmup")) o->warmup = o->lr_constant ? 0 : o->steps / 10 + 1;
    if (!flags_given(o, "--lr")) o->lr = adamw ? 3e-3f : 0.1f;
    return 0;
}

int flags_settle(cli_opts *o)
{
    int rc;
    if (o->init) {
        /* The file's shape replaces the table's defaults, not the flags. */
        weights_shape_given given = {
            .vocab = flags_given(o, "--vocab"), .seq = flags_given(o, "--seq"),
            .context = flags_given(o, "--context"), .layers = flags_given(o, "--layers"),
            .heads = flags_given(o, "--heads"), .dim = flags_given(o, "--dim")};
        rc = weights_init_config(o->init, o->model, o->resume, &given, &o->gpt);
        if (rc) return rc;
    }
    o->mlp.layers = o->gpt.layers; /* --layers is either model's depth */
    rc = optimizer_defaults(o);
    if (rc) return rc;
    o->optimizer.zero = o->zero ? SPMD_ZERO_ON : SPMD_ZERO_OFF;
    /* Asked for in any way, validation reads --val-batches batches (4). */
    if ((o->val_every || o->val_data) && !o->val_batches) o->val_batches = 4;
    if (flags_given(o, "--inflight-mib") && !o->overlap)
        return cli_fail("--inflight-mib bounds the collectives in flight: it needs --overlap on");
    if ((o->save_every || o->keep) && !o->save)
        return cli_fail("%s says how to save, but there is no --save DIR",
                        o->save_every ? "--save-every" : "--keep");
    /* Under mpirun the processes are its own. */
    int procs = processes_count();
    if (procs > 1 && o->processes && o->processes != procs)
        return cli_fail("--processes %d, but mpirun started %d processes", o->processes, procs);
    if (procs > 1) o->processes = procs;
    /* --devices N alone: a mesh of N devices along one 'data' axis. */
    static char devices_text[16];
    if (o->devices && !flags_given(o, "--mesh") && !flags_given(o, "--axes")) {
        snprintf(devices_text, sizeof devices_text, "%d", o->devices);
        o->mesh = devices_text;
        o->axes = "data";
    }
    return procs > 1 ? settings_agree(o) : 0;
}
