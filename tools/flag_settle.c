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
#include <string.h>

/* Whether row fs is some optimizer's setting. */
static bool optimizer_row(const flag_spec *fs)
{
    for (int k = 0; k < CLI_OPTIMIZERS; k++)
        if (fs->by_optimizer[k]) return true;
    return false;
}

/* A setting of other optimizers given: refused, naming them and what
 * this one takes. */
static int not_this_optimizers(const cli_opts *o, const flag_spec *fs)
{
    char theirs[96] = "", ours[320] = "";
    for (int k = 0; k < CLI_OPTIMIZERS; k++) {
        if (!fs->by_optimizer[k]) continue;
        size_t n = strlen(theirs);
        snprintf(theirs + n, sizeof theirs - n, "%s%s", n ? ", " : "",
                 cli_optimizer_word((spmd_optimizer_kind)k));
    }
    for (int i = 0; i < flag_row_count; i++) {
        const flag_spec *r = &flag_rows[i];
        if (!(r->commands & o->command) || !r->by_optimizer[o->optimizer.kind]) continue;
        size_t n = strlen(ours);
        snprintf(ours + n, sizeof ours - n, "%s%s", n ? ", " : "", r->name);
    }
    return cli_fail("%s is a setting of --optimizer %s; --optimizer %s takes %s", fs->name, theirs,
                    cli_optimizer_word(o->optimizer.kind), ours);
}

/* Each optimizer setting not given takes its row's default for the
 * optimizer (PyTorch's, but AdamW and Adam clip at 1 and warm up to a
 * cosine, AdamW decaying 0.01, as nanoGPT does); a setting of other
 * optimizers given is an error.  The warmup's default then follows the
 * schedule. */
static int optimizer_defaults(cli_opts *o)
{
    spmd_optimizer_kind kind = o->optimizer.kind;
    for (int i = 0; i < flag_row_count; i++) {
        const flag_spec *fs = &flag_rows[i];
        if (!(fs->commands & o->command) || !optimizer_row(fs)) continue;
        if (!fs->by_optimizer[kind]) {
            if (o->given[i]) return not_this_optimizers(o, fs);
            continue; /* left 0, which the library takes as unset */
        }
        if (o->given[i]) continue;
        char value[32]; /* a copy: reading may cut it */
        snprintf(value, sizeof value, "%s", fs->by_optimizer[kind]);
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
