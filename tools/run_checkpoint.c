/*
 * Saving and resuming a `spmd train` run: the library writes and reads the
 * sharded tensors (spmd/checkpoint.h); this file adds what only the tool
 * knows, as the checkpoint's "meta" object:
 *
 *   config     the model: {model, vocab, seq, context, layers, heads, dim,
 *              and with experts experts, top_k, capacity_factor,
 *              expert_blocks ("1,3")} for a
 *              GPT, {model, vocab, seq, layers, hidden} for the MLP
 *   optimizer  {kind, lr, schedule, warmup, steps, weight_decay, clip,
 *              and the kind's own: momentum, dampening, nesterov (sgd);
 *              beta1, beta2, eps, amsgrad (adamw, adam); momentum,
 *              alpha, eps, centered (rmsprop); lr_decay,
 *              initial_accumulator, eps (adagrad)}
 *   data       {source, order, seed, batch, accumulate (with --pp
 *              the micro-batches), samples}: samples is the data
 *              position, the training samples consumed so far
 *   rng        {seed}: every random draw is a pure function of (seed,
 *              stream, index), so the seed and the data position are the
 *              whole random state
 *
 * A resumed run continues at the saved step and data position with the
 * flags it is given; settings that differ from the saved ones are named in
 * a warning (the run will not match an uninterrupted one), and a different
 * model or optimizer kind is refused.
 */
#include "run_checkpoint.h"

#include "copies.h"
#include "message.h"
#include "processes.h"
#include "test_hooks.h"

#include "models/gpt_moe.h"
#include "spmd/checkpoint.h"
#include "train/checkpoint.h"
#include "train/checkpoint_fs.h"

#include <cJSON.h>

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

static const char *data_source(const cli_opts *o) { return o->data ? o->data : "arith"; }

/* The blocks with experts, "1,3": which ones is the model's rule
 * (gpt_moe_layer), saved so that a change of the rule is seen on resume. */
static void expert_blocks(const spmd_gpt_config *cfg, char *buf, size_t size)
{
    size_t at = 0;
    buf[0] = 0;
    for (int i = 0; i < cfg->layers && at < size; i++)
        if (gpt_moe_layer(cfg, i)) at += (size_t)snprintf(buf + at, size - at, at ? ",%d" : "%d", i);
}

cJSON *run_checkpoint_settings(const cli_opts *o, const cli_model *m)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *config = cJSON_AddObjectToObject(root, "config");
    bool gpt = !strcmp(o->model, "gpt");
    cJSON_AddStringToObject(config, "model", o->model);
    cJSON_AddNumberToObject(config, "vocab", m->gpt.vocab);
    cJSON_AddNumberToObject(config, "seq", m->gpt.seq);
    if (gpt) {
        cJSON_AddNumberToObject(config, "context", m->gpt.context ? m->gpt.context : m->gpt.seq);
        cJSON_AddNumberToObject(config, "layers", m->gpt.layers);
        cJSON_AddNumberToObject(config, "heads", m->gpt.heads);
        cJSON_AddNumberToObject(config, "dim", m->gpt.dim);
        if (m->gpt.experts) {
            cJSON_AddNumberToObject(config, "experts", m->gpt.experts);
            cJSON_AddNumberToObject(config, "top_k", m->gpt.top_k);
            cJSON_AddNumberToObject(config, "capacity_factor", m->gpt.capacity_factor);
            char blocks[256];
            expert_blocks(&m->gpt, blocks, sizeof blocks);
            cJSON_AddStringToObject(config, "expert_blocks", blocks);
        }
    } else {
        cJSON_AddNumberToObject(config, "layers", o->mlp.layers);
        cJSON_AddNumberToObject(config, "hidden", o->mlp.hidden);
    }
    /* The matmuls' precision; the checkpoint's values are f32 either way. */
    cJSON_AddStringToObject(config, "precision", o->bf16 ? "bf16" : "fp32");
    /* The gradients' reductions' (--reduce-precision). */
    cJSON_AddStringToObject(config, "reduce_precision", o->bf16_reduce ? "bf16" : "fp32");
    const spmd_optimizer *opt = &o->optimizer;
    cJSON *optim = cJSON_AddObjectToObject(root, "optimizer");
    cJSON_AddStringToObject(optim, "kind", cli_optimizer_word(opt->kind));
    cJSON_AddNumberToObject(optim, "lr", o->lr);
    cJSON_AddStringToObject(optim, "schedule", o->lr_constant ? "constant" : "cosine");
    cJSON_AddNumberToObject(optim, "warmup", o->warmup);
    cJSON_AddNumberToObject(optim, "steps", o->steps);
    cJSON_AddNumberToObject(optim, "weight_decay", opt->weight_decay);
    /* Each optimizer's own settings. */
    switch (opt->kind) {
    case SPMD_OPTIMIZER_SGD:
        cJSON_AddNumberToObject(optim, "momentum", opt->momentum);
        cJSON_AddNumberToObject(optim, "dampening", opt->dampening);
        cJSON_AddStringToObject(optim, "nesterov", opt->nesterov ? "on" : "off");
        break;
    case SPMD_OPTIMIZER_ADAMW:
    case SPMD_OPTIMIZER_ADAM:
        cJSON_AddNumberToObject(optim, "beta1", opt->beta1);
        cJSON_AddNumberToObject(optim, "beta2", opt->beta2);
        cJSON_AddNumberToObject(optim, "eps", opt->eps);
        cJSON_AddStringToObject(optim, "amsgrad", opt->amsgrad ? "on" : "off");
        break;
    case SPMD_OPTIMIZER_RMSPROP:
        cJSON_AddNumberToObject(optim, "momentum", opt->momentum);
        cJSON_AddNumberToObject(optim, "alpha", opt->alpha);
        cJSON_AddNumberToObject(optim, "eps", opt->eps);
        cJSON_AddStringToObject(optim, "centered", opt->centered ? "on" : "off");
        break;
    case SPMD_OPTIMIZER_ADAGRAD:
        cJSON_AddNumberToObject(optim, "lr_decay", opt->lr_decay);
        cJSON_AddNumberToObject(optim, "initial_accumulator", opt->initial_accumulator_value);
        cJSON_AddNumberToObject(optim, "eps", opt->eps);
        break;
    }
    cJSON_AddNumberToObject(optim, "clip", opt->clip_norm);
    cJSON *data = cJSON_AddObjectToObject(root, "data");
    cJSON_AddStringToObject(data, "source", data_source(o));
    cJSON_AddStringToObject(data, "order", o->data_sequential ? "sequential" : "shuffled");
    /* 64 bits do not fit a JSON number (a double): the seed is text. */
    char seed[24];
    snprintf(seed, sizeof seed, "%" PRIu64, o->seed);
    cJSON_AddStringToObject(data, "seed", seed);
    cJSON_AddNumberToObject(data, "batch", o->batch);
    /* Micro-batches are accumulation: --pp's M steps as --accumulate M. */
    cJSON_AddNumberToObject(data, "accumulate",
                            o->optimizer.accumulate_steps > 1 ? o->optimizer.accumulate_steps
                                                              : m->micro_batches);
    return root;
}

/* ---- Save ------------------------------------------------------------------------ */

/* The lock of --save DIR: held until the process ends (closing it would
 * drop it). */
static int save_lock = -1;

/* The probe's name: a run killed while it held one leaves it behind, and
 * the next run removes it under the lock. */
#define PROBE_PREFIX ".write-test-"

/* A file made, written and synced in `dir`, then removed: a read-only,
 * full or foreign directory fails here rather than at the first save. */
static int check_writable(const char *dir)
{
    char probe[CLI_PATH_MAX];
    snprintf(probe, sizeof probe, "%s/" PROBE_PREFIX "XXXXXX", dir);
    int fd = mkstemp(probe);
    if (fd < 0) {
        cli_fail("--save %s: cannot create a file there: %s", dir, strerror(errno));
        return 1;
    }
    test_hooks_phase("probe");
    int err = write(fd, "\n", 1) == 1 ? 0 : errno ? errno : EIO;
    if (!err && fsync(fd) != 0) err = errno;
    close(fd);
    unlink(probe);
    if (!err) return 0;
    cli_fail("--save %s: cannot write a file there: %s", dir, strerror(err));
    return 1;
}

/* The probes of runs killed while they checked `dir` (check_writable).
 * A live probe of another run, refused by the lock, may go too: it has
 * its file open, and its unlink fails harmlessly. */
static void remove_probes(const char *dir)
{
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        char path[CLI_PATH_MAX];
        if (!strncmp(e->d_name, PROBE_PREFIX, strlen(PROBE_PREFIX)) &&
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name) < (int)sizeof path)
            unlink(path);
    }
    if (d) closedir(d);
}

/* The temporaries in dir and its copy-C directories; the count removed. */
static int remove_temporaries(const char *dir, int *removed)
{
    int n = 0;
    if (ckpt_remove_temporaries(dir, &n, "--save") != SPMD_OK) return cli_fail("%s", spmd_last_error());
    *removed += n;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        char sub[CLI_PATH_MAX];
        if (strncmp(e->d_name, "copy-", 5) || snprintf(sub, sizeof sub, "%s/%s", dir, e->d_name) >= (int)sizeof sub)
            continue;
        if (ckpt_remove_temporaries(sub, &n, "--save") != SPMD_OK) {
            closedir(d);
            return cli_fail("%s", spmd_last_error());
        }
        *removed += n;
    }
    if (d) closedir(d);
    return 0;
}

int run_checkpoint_prepare(const cli_opts *o)
{
    if (!o->save || processes_rank() != 0) return 0;
    if (ckpt_mkdirs(o->save, "--save") != SPMD_OK) {
        cli_fail("%s", spmd_last_error());
        return 1;
    }
    int rc = check_writable(o->save), removed = 0;
    if (!rc && ckpt_lock_dir(o->save, &save_lock, "--save") != SPMD_OK) {
        cli_fail("%s", spmd_last_error());
        rc = 1;
    }
    if (!rc) test_hooks_phase("lock");
    /* Under the lock no other run writes here: every temporary is a
     * killed save's.  Without locks (a file system that has none) they
     * stay, since another writer may own them. */
    if (!rc && save_lock >= 0) {
        remove_probes(o->save);
        rc = remove_temporaries(o->save, &removed) ? 1 : 0;
    }
    if (!rc && removed)
        printf("checkpoint: removed %d unfinished save%s a killed run left in %s\n", removed,
               removed > 1 ? "s" : "", o->save);
    if (!rc) test_hooks_phase("prepared");
    return rc;
}

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

/* The bytes of one checkpoint of p: every saved block's, of every copy;
 * -1 when the layout cannot be had. */
static double checkpoint_bytes(const cli_model *m, const spmd_program *p)
{
    double bytes = 0;
    for (int c = 0; c < m->copies; c++) {
        ckpt_layout l;
        if (ckpt_layout_build(p, c, &l, "--save") != SPMD_OK) return -1;
        for (int b = 0; b < l.n_blocks; b++) bytes += (double)l.blocks[b].bytes;
        ckpt_layout_free(&l);
    }
    return bytes;
}

int run_checkpoint_check_room(const cli_opts *o, const cli_model *m, const spmd_program *p)
{
    struct statvfs vfs;
    if (!o->save || processes_rank() != 0 || statvfs(o->save, &vfs) != 0) return 0;
    double avail = test_hooks_free_bytes((double)vfs.f_bavail * (double)vfs.f_frsize);
    double need = checkpoint_bytes(m, p);
    /* The files' headers and the index: a few KiB a tensor at most. */
    double margin = need * 0.01 + (1 << 20);
    if (need < 0 || avail >= need + margin) return 0;
    cli_fail("--save %s: a checkpoint of this run takes %.1f MiB, and %.1f MiB more is kept free "
             "for its files' headers and index (1%% of it and 1 MiB): its file system has %.1f MiB "
             "free, %.1f MiB needed: make room, or --save elsewhere", o->save, need / 1048576.0,
             margin / 1048576.0, avail / 1048576.0, (need + margin) / 1048576.0);
    return 1;
}

/* The run's settings as copy c trains: its seed, learning rate, warmup,
 * and its directory under --save / --resume (DIR/copy-C); the run's own
 * without copies. */
static cli_opts copy_opts(const cli_opts *o, const cli_model *m, int c, char *save, char *resume)
{
    cli_opts oc = *o;
    if (m->copies == 1) return oc;
    oc.seed = copies_seed(o, c);
    oc.lr = copies_lr(o, c);
    oc.warmup = copies_warmup(o, c);
    oc.optimizer.weight_decay = copies_weight_decay(o, c);
    if (o->save) snprintf(save, CLI_PATH_MAX, "%s/copy-%d", o->save, c), oc.save = save;
    if (o->resume) snprintf(resume, CLI_PATH_MAX, "%s/copy-%d", o->resume, c), oc.resume = resume;
    return oc;
}

static int save_copy(const cli_opts *o, const cli_model *m, const spmd_program *p, int copy, int step,
                     int64_t samples)
{
    cJSON *meta = run_checkpoint_settings(o, m);
    cJSON *data = cJSON_GetObjectItemCaseSensitive(meta, "data");
    cJSON_AddNumberToObject(data, "samples", (double)samples);
    cJSON *rng = cJSON_AddObjectToObject(meta, "rng");
    cJSON_AddStringToObject(rng, "seed", cJSON_GetObjectItemCaseSensitive(data, "seed")->valuestring);
    char *text = cJSON_PrintUnformatted(meta);
    cJSON_Delete(meta);
    if (!text) return cli_fail("checkpoint of step %d: out of memory", step);

    test_hooks_save_begin(step);
    double t0 = now_ms();
    spmd_status st = spmd_checkpoint_save_copy(p, copy, o->save, step, text, o->keep);
    test_hooks_save_end();
    free(text);
    if (st != SPMD_OK) {
        cli_fail("--save %s: %s", o->save, spmd_last_error());
        return 1;
    }
    printf("checkpoint: step %d saved to %s/step-%08d in %.0f ms\n", step, o->save, step,
           now_ms() - t0);
    fflush(stdout);
    return 0;
}

int run_checkpoint_save(const cli_opts *o, const cli_model *m, const spmd_program *p, int step, int64_t samples)
{
    /* With copies, one checkpoint per copy: DIR/copy-C, its own settings. */
    int rc = 0;
    for (int c = 0; !rc && c < m->copies; c++) {
        char save[CLI_PATH_MAX], resume[CLI_PATH_MAX];
        cli_opts oc = copy_opts(o, m, c, save, resume);
        rc = save_copy(&oc, m, p, c, step, samples);
    }
    return rc;
}

/* ---- Resume ---------------------------------------------------------------------- */

static const cJSON *item(const cJSON *obj, const char *key)
{
    return cJSON_GetObjectItemCaseSensitive(obj, key);
}

/* Warn when a saved setting differs from the run's: "--lr 0.001 where the
 * checkpoint trained with 0.003".  Returns whether it differs. */
static bool differs_number(const char *flag, const cJSON *saved, double now)
{
    if (!cJSON_IsNumber(saved) || (float)saved->valuedouble == (float)now) return false;
    fprintf(stderr, "spmd: warning: resuming with %s %g where the checkpoint trained with %g\n",
            flag, now, saved->valuedouble);
    return true;
}

static bool differs_text(const char *flag, const cJSON *saved, const char *now)
{
    if (!cJSON_IsString(saved) || !strcmp(saved->valuestring, now)) return false;
    fprintf(stderr, "spmd: warning: resuming with %s %s where the checkpoint trained with %s\n",
            flag, now, saved->valuestring);
    return true;
}

/* A number of a config, 0 when absent (a model without experts). */
static double config_number(const cJSON *config, const char *key)
{
    const cJSON *n = item(config, key);
    return cJSON_IsNumber(n) ? n->valuedouble : 0;
}

/* The experts' settings are the model's shape and routing, not a setting
 * to change mid-run: refused when they differ, naming both sides. */
static int compare_experts(const cli_opts *o, const cJSON *now, const cJSON *saved)
{
    const char *numbers[][2] = {{"--experts", "experts"},
                                {"--experts-top-k", "top_k"},
                                {"--capacity-factor", "capacity_factor"}};
    for (size_t i = 0; i < sizeof numbers / sizeof *numbers; i++) {
        double a = config_number(now, numbers[i][1]), b = config_number(saved, numbers[i][1]);
        if ((float)a != (float)b)
            return cli_fail("--resume %s: %s %g, but the checkpoint was trained with %s %g", o->resume,
                            numbers[i][0], a, numbers[i][0], b);
    }
    const cJSON *a = item(now, "expert_blocks"), *b = item(saved, "expert_blocks");
    if (cJSON_IsString(a) && cJSON_IsString(b) && strcmp(a->valuestring, b->valuestring))
        return cli_fail("--resume %s: this run has experts in blocks %s, but the checkpoint in "
                        "blocks %s",
                        o->resume, a->valuestring, b->valuestring);
    return 0;
}

/* The saved settings against the run's own; 0 or an exit code. */
static int compare_settings(const cli_opts *o, const cli_model *m, const cJSON *meta)
{
    cJSON *now = run_checkpoint_settings(o, m);
    const cJSON *cfg = item(meta, "config"), *opt = item(meta, "optimizer"), *data = item(meta, "data");
    const cJSON *kind = item(opt, "kind"), *model = item(cfg, "model");
    int rc = 0;
    if (!cJSON_IsString(model) || !cJSON_IsString(kind) || !cJSON_IsObject(data))
        rc = cli_fail("--resume %s: its meta lacks the model, optimizer or data settings: not a "
                      "checkpoint written by spmd train", o->resume);
    else if (strcmp(model->valuestring, o->model))
        rc = cli_fail("--resume %s: --model %s, but the checkpoint holds a %s", o->resume, o->model,
                      model->valuestring);
    else if (strcmp(kind->valuestring, item(item(now, "optimizer"), "kind")->valuestring))
        rc = cli_fail("--resume %s: --optimizer %s, but the checkpoint holds %s's state", o->resume,
                      item(item(now, "optimizer"), "kind")->valuestring, kind->valuestring);
    if (!rc) rc = compare_experts(o, item(now, "config"), cfg);
    if (rc) {
        cJSON_Delete(now);
        return rc;
    }
    bool any = false;
    const cJSON *nopt = item(now, "optimizer"), *ndata = item(now, "data");
    const char *numbers[][2] = {{"--lr", "lr"},
                                {"--warmup", "warmup"},
                                {"--steps", "steps"},
                                {"--weight-decay", "weight_decay"},
                                {"--momentum", "momentum"},
                                {"--dampening", "dampening"},
                                {"--beta1", "beta1"},
                                {"--beta2", "beta2"},
                                {"--alpha", "alpha"},
                                {"--lr-decay", "lr_decay"},
                                {"--initial-accumulator", "initial_accumulator"},
                                {"--eps", "eps"},
                                {"--clip", "clip"}};
    for (size_t i = 0; i < sizeof numbers / sizeof *numbers; i++) {
        const cJSON *n = item(nopt, numbers[i][1]);
        if (n) any |= differs_number(numbers[i][0], item(opt, numbers[i][1]), n->valuedouble);
    }
    const char *choices[][2] = {{"--nesterov", "nesterov"}, {"--amsgrad", "amsgrad"},
                                {"--centered", "centered"}};
    for (size_t i = 0; i < sizeof choices / sizeof *choices; i++) {
        const cJSON *c = item(nopt, choices[i][1]);
        if (c) any |= differs_text(choices[i][0], item(opt, choices[i][1]), c->valuestring);
    }
    any |= differs_text("--schedule", item(opt, "schedule"), item(nopt, "schedule")->valuestring);
    any |= differs_text("--precision", item(cfg, "precision"),
                        item(item(now, "config"), "precision")->valuestring);
    any |= differs_text("--reduce-precision", item(cfg, "reduce_precision"),
                        item(item(now, "config"), "reduce_precision")->valuestring);
    any |= differs_text("--data", item(data, "source"), item(ndata, "source")->valuestring);
    any |= differs_text("--data-order", item(data, "order"), item(ndata, "order")->valuestring);
    any |= differs_text("--seed", item(data, "seed"), item(ndata, "seed")->valuestring);
    any |= differs_number("--batch", item(data, "batch"), o->batch);
    any |= differs_number("--accumulate", item(data, "accumulate"),
                          item(ndata, "accumulate")->valuedouble);
    if (any)
        fprintf(stderr, "spmd: warning: the resumed run will differ from one never interrupted\n");
    cJSON_Delete(now);
    return 0;
}

static int resume_copy(const cli_opts *o, const cli_model *m, spmd_program *p, int copy, int *step,
                       int64_t *samples)
{
    int64_t saved = 0;
    char *text = NULL;
    /* The settings first: a different model is named as such, not as
     * the first tensor whose shape differs. */
    if (ckpt_read_meta(o->resume, &text) != SPMD_OK)
        return cli_fail("--resume %s: %s", o->resume, spmd_last_error());
    cJSON *meta = cJSON_Parse(text);
    free(text);
    int rc = meta ? compare_settings(o, m, meta)
                  : cli_fail("--resume %s: cannot parse its meta", o->resume);
    cJSON_Delete(meta);
    if (rc) return rc;
    spmd_status st = m->copies > 1 ? spmd_checkpoint_load_copy(p, copy, o->resume, &saved, &text)
                                   : spmd_checkpoint_load(p, o->resume, &saved, &text);
    if (st != SPMD_OK) return cli_fail("--resume %s: %s", o->resume, spmd_last_error());
    meta = cJSON_Parse(text);
    free(text);
    if (!meta) rc = cli_fail("--resume %s: cannot parse its meta", o->resume);
    const cJSON *pos = item(item(meta, "data"), "samples");
    if (!rc && !cJSON_IsNumber(pos))
        rc = cli_fail("--resume %s: its meta lacks the data position (data.samples)", o->resume);
    else if (!rc && (pos->valuedouble < 0 || pos->valuedouble > 9e15 ||
                     pos->valuedouble != (double)(int64_t)pos->valuedouble))
        rc = cli_fail("--resume %s: its data position (data.samples) is %g, %s", o->resume,
                      pos->valuedouble,
                      pos->valuedouble < 0 ? "which is negative" : "not a count of samples");
    if (!rc && saved >= o->steps)
        rc = cli_fail("--resume %s: the checkpoint is at step %lld and --steps is %d: nothing is "
                      "left to train (a larger --steps continues it)",
                      o->resume, (long long)saved, o->steps);
    if (!rc) {
        *step = (int)saved;
        *samples = (int64_t)pos->valuedouble;
    }
    cJSON_Delete(meta);
    return rc;
}

int run_checkpoint_resume(const cli_opts *o, const cli_model *m, spmd_program *p, int *step, int64_t *samples)
{
    /* With copies, each copy from DIR/copy-C; all at one step and position. */
    int rc = 0;
    for (int c = 0; !rc && c < m->copies; c++) {
        char save[CLI_PATH_MAX], resume[CLI_PATH_MAX];
        cli_opts oc = copy_opts(o, m, c, save, resume);
        int at = 0;
        int64_t pos = 0;
        rc = resume_copy(&oc, m, p, c, &at, &pos);
        if (!rc && c > 0 && (at != *step || pos != *samples))
            rc = cli_fail("--resume %s: copy %d is at step %d (data position %lld), copy 0 at %d (%lld)",
                          o->resume, c, at, (long long)pos, *step, (long long)*samples);
        *step = at, *samples = pos;
    }
    return rc;
}
