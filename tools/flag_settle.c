/*
 * Settling the model commands' flags (flag_settle.h): the defaults that
 * depend on other settings, the checks across flags, and under mpirun the
 * agreement of every process on the result.
 */
#include "flag_settle.h"

#include "flag_table.h"
#include "flag_values.h"
#include "message.h"
#include "processes.h"
#include "settings_agree.h"
#include "weights.h"

#include <stdio.h>

/* Each optimizer setting not given takes its row's default for the
 * optimizer (PyTorch's, but AdamW decays 0.01 and clips at 1 as nanoGPT
 * does); an AdamW setting given with sgd is an error.  The warmup's
 * default then follows the schedule. */
static int optimizer_defaults(cli_opts *o)
{
    bool adamw = o->optimizer.kind == SPMD_OPTIMIZER_ADAMW;
    for (int i = 0; i < flag_row_count; i++) {
        const flag_spec *fs = &flag_rows[i];
        if (!(fs->commands & o->command) || !fs->adamw) continue;
        if (!adamw && !fs->sgd && o->given[i])
            return cli_fail("%s is an AdamW setting; --optimizer sgd takes --lr, --weight-decay "
                            "and --clip", fs->name);
        if (o->given[i]) continue;
        char value[32]; /* a copy: reading may cut it */
        snprintf(value, sizeof value, "%s", adamw ? fs->adamw : fs->sgd ? fs->sgd : "0");
        int rc = flag_set(fs, value, o);
        if (rc) return rc;
    }
    if (!flags_given(o, "--warmup")) o->warmup = o->lr_constant ? 0 : o->steps / 10 + 1;
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
    /* Asked for in any way, validation reads --val-batches batches. */
    if ((o->val_every || o->val_data) && !o->val_batches) o->val_batches = VAL_BATCHES;
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
