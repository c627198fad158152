/*
 * `spmd train`: compile one training step and run it for --steps steps,
 * with a live progress line, a summary and an optional JSON report.
 */
#include "commands/train.h"

#include "copies.h"
#include "feed.h"
#include "flags.h"
#include "json_file.h"
#include "message.h"
#include "model.h"
#include "plot.h"
#include "plot_curves.h"
#include "processes.h"
#include "report.h"
#include "run_checkpoint.h"
#include "run_log.h"
#include "test_hooks.h"
#include "trace.h"
#include "weights.h"

#include <cJSON.h>

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Exit status of a run stopped by a non-finite loss or gradient norm (an
 * interrupted run exits 128 + the signal, as a shell reports it). */
enum { EXIT_DIVERGED = 3 };

/* Why a run ended before its last step; step 0 when it did not. */
typedef struct train_stop {
    int step;        /* the last step run, from 1 (counting saved steps) */
    int signal;      /* SIGINT or SIGTERM, or 0 */
    char reason[32]; /* "loss is nan", "SIGINT" */
} train_stop;

/* The first SIGINT or SIGTERM asks the run to stop once the step under
 * way is done, so the report keeps every loss so far; the handlers go back
 * to the default at once, so a second signal ends the process. */
static volatile sig_atomic_t stop_signal;

static void on_stop_signal(int sig)
{
    stop_signal = sig;
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
}

static void catch_stop_signals(void)
{
    struct sigaction sa = {.sa_handler = on_stop_signal, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGINT);
    sigaddset(&sa.sa_mask, SIGTERM);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

/* A signal received by now stops the run after step `done`. */
static void note_signal(train_stop *stop, int done)
{
    int sig = stop_signal;
    if (stop->step || !sig) return;
    *stop = (train_stop){.step = done, .signal = sig};
    snprintf(stop->reason, sizeof stop->reason, "%s", sig == SIGINT ? "SIGINT" : "SIGTERM");
}

/* A non-finite loss or gradient norm, as "loss is nan"; false if none:
 * once either is, every later step only spreads it. */
static bool nonfinite(float loss, float norm, char *why, size_t size)
{
    bool bad_loss = !isfinite(loss);
    if (!bad_loss && isfinite(norm)) return false;
    float v = bad_loss ? loss : norm;
    snprintf(why, size, "%s is %s", bad_loss ? "loss" : "grad norm",
             isnan(v) ? "nan" : v > 0 ? "inf" : "-inf");
    return true;
}

/* Devices dim 0 of `t` is split over, from its sharding's first entry (an
 * axis, a tuple of axes, or None); their axes go to `axes` as "(a, b)". */
static int batch_devices(const cli_model *m, const spmd_tensor *t, char *axes, size_t size)
{
    char spec[256];
    spmd_get_sharding(t, spec, sizeof spec);
    spec[spec[0] == '(' ? strcspn(spec, ")") : strcspn(spec, ",|")] = '\0';
    int devices = 1;
    snprintf(axes, size, "(");
    for (char *tok = strtok(spec, "(), "); tok; tok = strtok(NULL, "(), ")) {
        int a = strcmp(tok, "None") ? spmd_mesh_axis_index(m->mesh, tok) : -1;
        if (a < 0) continue;
        size_t n = strlen(axes);
        snprintf(axes + n, size - n, axes[1] ? ", %s" : "%s", tok);
        devices *= spmd_mesh_axis_size(m->mesh, a);
    }
    size_t n = strlen(axes);
    snprintf(axes + n, size - n, ")");
    return devices;
}

/* What the plan does that a user would want to know before the first
 * step: gathers an op forced, a propagation that did not settle, and a
 * batch padded to fit the mesh. */
static void warn_plan(const cli_opts *o, const cli_model *m, const spmd_program *p)
{
    enum { SHOWN = 5 };
    fflush(stdout); /* the header first, where both go to one file */
    int nf = spmd_program_fallback_count(p);
    if (nf)
        fprintf(stderr, "spmd: warning: %d whole-tensor gather%s an op forced (fallbacks):\n", nf,
                nf > 1 ? "s" : "");
    for (int i = 0; i < nf && i < SHOWN; i++) {
        char line[256];
        spmd_program_fallback(p, i, line, sizeof line);
        fprintf(stderr, "  %s\n", line);
    }
    if (nf > SHOWN) fprintf(stderr, "  and %d more (spmd explain lists them)\n", nf - SHOWN);
    int unsettled = spmd_program_propagation_unsettled(p);
    if (unsettled)
        fprintf(stderr, "spmd: warning: sharding propagation not settled after %d rounds: some "
                "unmarked tensors may stay replicated (spmd explain)\n", unsettled);
    if (!m->mesh) return;
    char axes[128], what[96];
    int devices = batch_devices(m, m->train.input, axes, sizeof axes);
    int64_t rows = spmd_tensor_dim(m->train.input, 0);
    if (devices < 2 || rows % devices == 0) return;
    if (rows == o->batch) snprintf(what, sizeof what, "batch %d does", o->batch);
    else snprintf(what, sizeof what, "batch %d x seq %d = %lld rows do", o->batch, o->gpt.seq, (long long)rows);
    int64_t block = (rows + devices - 1) / devices;
    fprintf(stderr,
            "spmd: warning: %s not divide over the %d devices of %s: blocks of %lld with padding "
            "(%lld of %lld rows)\n",
            what, devices, axes, (long long)block, (long long)(block * devices - rows),
            (long long)(block * devices));
}

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

/* Twice the room (at least 1024 steps) for the time, the loss and the
 * dropped count of each step, `copies` losses a step (step i, copy c at
 * i * copies + c). */
static int grow_records(float **losses, double **ms, double **drops, size_t *room, int copies)
{
    size_t want = *room ? 2 * *room : 1024;
    float *l = realloc(*losses, want * (size_t)copies * sizeof *l);
    if (l) *losses = l;
    double *d = l ? realloc(*drops, want * sizeof *d) : NULL;
    if (d) *drops = d;
    double *t = d ? realloc(*ms, want * sizeof *t) : NULL;
    if (!t) return cli_fail("out of memory for the records of %zu steps", want);
    *ms = t;
    *room = want;
    return 0;
}

/* A number for a JSON line: null when not finite. */
static const char *json_number(double v, char *buf, size_t size)
{
    if (isfinite(v)) snprintf(buf, size, "%.9g", v);
    else snprintf(buf, size, "null");
    return buf;
}

/* The losses of one step, "1.2345" or, with copies, "1.2345 | 1.3456 | ...". */
static const char *loss_text(const float *loss, int copies, char *buf, size_t size)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int c = 0; c < copies && n < size; c++)
        n += (size_t)snprintf(buf + n, size - n, c ? " | %.4f" : "%.4f", (double)loss[c]);
    return buf;
}

/* The validation losses of a run, with the step each was taken after. */
typedef struct val_records {
    int n, room;
    int *step;
    double *loss;
} val_records;

static int val_record(val_records *v, int step, double loss)
{
    if (v->n == v->room) {
        int room = v->room ? 2 * v->room : 64;
        int *s = realloc(v->step, (size_t)room * sizeof *s);
        if (s) v->step = s;
        double *l = s ? realloc(v->loss, (size_t)room * sizeof *l) : NULL;
        if (!l) return cli_fail("out of memory for the validation records");
        v->loss = l;
        v->room = room;
    }
    v->step[v->n] = step;
    v->loss[v->n++] = loss;
    return 0;
}

/* The report of `steps` steps run after step `start` (non-finite losses
 * print as null). */
static int report(const cli_opts *o, const cli_model *m, const spmd_program *p, const float *losses,
                  const double *drops, int start, int steps, double ms, const double *accuracy,
                  const train_stop *stop, const val_records *val_of)
{
    const val_records *val = &val_of[0]; /* copy 0's, as the top-level figures */
    cJSON *root = cJSON_CreateObject();
    cJSON_AddItemToObject(root, "mesh", report_mesh(m));
    cJSON_AddStringToObject(root, "model", o->model);
    cJSON_AddNumberToObject(root, "params", (double)m->params);
    cJSON_AddItemToObject(root, "settings", run_checkpoint_settings(o, m));
    if (start) cJSON_AddNumberToObject(root, "resumed_at", start);
    cJSON_AddNumberToObject(root, "steps", steps);
    cJSON *loss = cJSON_AddArrayToObject(root, "loss");
    for (int i = 0; i < steps; i++)
        cJSON_AddItemToArray(loss, cJSON_CreateNumber(losses[(size_t)i * (size_t)m->copies]));
    if (m->train.dropped) { /* experts: the assignments past capacity, each step's and in all */
        cJSON *dropped = cJSON_AddArrayToObject(root, "dropped");
        double total = 0;
        for (int i = 0; i < steps; i++) {
            cJSON_AddItemToArray(dropped, cJSON_CreateNumber(drops[i]));
            total += drops[i];
        }
        cJSON_AddNumberToObject(root, "dropped_total", total);
        cJSON_AddNumberToObject(root, "assignments_per_step",
                                (double)o->gpt.top_k * (double)(m->tokens_per_step / m->copies) *
                                    (double)(o->gpt.layers / 2));
    }
    if (stop->step) {
        cJSON *stopped = cJSON_AddObjectToObject(root, "stopped");
        cJSON_AddNumberToObject(stopped, "step", stop->step);
        cJSON_AddStringToObject(stopped, "reason", stop->reason);
    }
    cJSON_AddNumberToObject(root, "ms_per_step", ms);
    cJSON_AddNumberToObject(root, "tokens_per_s", (double)m->tokens_per_step / (ms / 1e3));
    cJSON_AddNumberToObject(root, "flops_per_step", m->flops_per_step);
    cJSON_AddItemToObject(root, "param_bytes_per_device", report_per_device(p, (double)model_param_bytes(p)));
    cJSON_AddItemToObject(root, "peak_bytes_per_device", report_per_device(p, (double)spmd_program_peak_bytes(p)));
    cJSON_AddItemToObject(root, "processes", report_processes(p));
    cJSON_AddItemToObject(root, "collectives", report_collectives(p));
    if (accuracy[0] >= 0) cJSON_AddNumberToObject(root, "accuracy", accuracy[0]);
    cJSON *copies = m->copies > 1 ? cJSON_AddArrayToObject(root, "copies") : NULL;
    for (int c = 0; copies && c < m->copies; c++) {
        cJSON *e = copies_json(o, c, losses, m->copies, steps);
        if (accuracy[c] >= 0) cJSON_AddNumberToObject(e, "accuracy", accuracy[c]);
        cJSON *vl = val_of[c].n ? cJSON_AddArrayToObject(e, "val_loss") : NULL;
        for (int i = 0; vl && i < val_of[c].n; i++) {
            cJSON *v = cJSON_CreateObject();
            cJSON_AddNumberToObject(v, "step", val_of[c].step[i]);
            double x = val_of[c].loss[i];
            cJSON_AddItemToObject(v, "loss", isfinite(x) ? cJSON_CreateNumber(x) : cJSON_CreateNull());
            cJSON_AddItemToArray(vl, v);
        }
        cJSON_AddItemToArray(copies, e);
    }
    if (val->n) {
        cJSON *list = cJSON_AddArrayToObject(root, "val_loss");
        for (int i = 0; i < val->n; i++) {
            cJSON *e = cJSON_CreateObject();
            cJSON_AddNumberToObject(e, "step", val->step[i]);
            cJSON_AddItemToObject(e, "loss", isfinite(val->loss[i]) ? cJSON_CreateNumber(val->loss[i])
                                                                   : cJSON_CreateNull());
            cJSON_AddItemToArray(list, e);
        }
        cJSON *src = cJSON_AddObjectToObject(root, "validation");
        cJSON_AddStringToObject(src, "data", spmd_dataset_describe(m->val_data ? m->val_data : m->data));
        cJSON_AddStringToObject(src, "split", "held-out");
        cJSON_AddNumberToObject(src, "batches", o->val_batches);
        cJSON_AddNumberToObject(src, "samples", (double)o->val_batches * o->batch);
    }
    cJSON_AddStringToObject(root, "data", spmd_dataset_describe(m->data));
    return json_file_write("--json", "the report", o->json, root);
}

/* The validation loss of every copy after step `done`: printed, logged
 * (copy 0's as val_loss, every copy's as copy_val_loss), recorded. */
static int validate(const cli_opts *o, const cli_model *m, const spmd_program *p,
                    spmd_program *eval, int done, run_log *log, val_records *val)
{
    float loss[CLI_MAX_COPIES];
    for (int c = 0; c < m->copies; c++) {
        double x = 0;
        int rc = feed_val_loss(o, m, p, eval, c, &x);
        if (!rc) rc = val_record(&val[c], done, x);
        if (rc) return rc;
        loss[c] = (float)x;
    }
    char text[16 * CLI_MAX_COPIES];
    printf("step %4d/%d  val loss %s (%d batches of %d)\n", done, o->steps,
           loss_text(loss, m->copies, text, sizeof text), o->val_batches, o->batch);
    fflush(stdout);
    FILE *line = log ? run_log_begin(log) : NULL;
    if (line) {
        char x[32];
        fprintf(line, "{\"step\":%d,\"val_loss\":%s", done, json_number(loss[0], x, sizeof x));
        for (int c = 0; m->copies > 1 && c < m->copies; c++)
            fprintf(line, "%s%s", c ? "," : ",\"copy_val_loss\":[", json_number(loss[c], x, sizeof x));
        fprintf(line, "%s}", m->copies > 1 ? "]" : "");
    }
    if (log) return run_log_end(log, done);
    return 0;
}

/* One object per step, as JSON Lines; a non-finite value is null.  The
 * figures are copy 0's; with copies, copy_loss lists every copy's loss. */
static int log_step(run_log *log, int step, const float *loss, const double *dropped, int copies,
                    float lr, float norm, double ms, double tok_s)
{
    char l[32], n[32], x[32];
    FILE *line = run_log_begin(log);
    if (!line) return run_log_end(log, step);
    fprintf(line, "{\"step\":%d,\"loss\":%s,\"lr\":%.9g,\"grad_norm\":%s,\"ms\":%.3f,\"tokens_per_s\":%.1f",
            step, json_number(loss[0], l, sizeof l), (double)lr, json_number(norm, n, sizeof n), ms,
            tok_s);
    for (int c = 0; copies > 1 && c < copies; c++)
        fprintf(line, "%s%s", c ? "," : ",\"copy_loss\":[", json_number(loss[c], x, sizeof x));
    if (copies > 1) fprintf(line, "]");
    if (dropped) fprintf(line, ",\"dropped\":%.0f", *dropped);
    fprintf(line, "}");
    return run_log_end(log, step);
}

/* The loss and learning rate of the `steps` steps run after step `first`,
 * and the validation losses, drawn as `spmd plot` draws a log; process 0
 * draws for the run.  0, or 1 with a message. */
static int plot_copies(const cli_opts *o, const char *title, const float *losses, int copies,
                       int first, int steps, const val_records *val);

static int plot_run(const cli_opts *o, const char *title, const float *losses, int copies,
                    int first, int steps, const val_records *val)
{
    if (processes_rank() != 0) return 0;
    if (copies > 1) return plot_copies(o, title, losses, copies, first, steps, val);
    plot_training t = {0};
    int rc = 0;
    for (int i = 0; i < steps && !rc; i++) {
        rc = plot_curve_add(&t.loss, first + i + 1, losses[(size_t)i * (size_t)copies]);
        if (!rc) rc = plot_curve_add(&t.lr, first + i + 1, feed_lr(o, first + i));
    }
    for (int i = 0; i < val->n && !rc; i++) rc = plot_curve_add(&t.val_loss, val->step[i], val->loss[i]);
    if (!rc) rc = plot_write_training_svg(o->plot, title, &t);
    plot_training_free(&t);
    return rc;
}

/* With copies, every copy's losses, a colour each. */
static int plot_copies(const cli_opts *o, const char *title, const float *losses, int copies,
                       int first, int steps, const val_records *val)
{
    plot_training *t = calloc((size_t)copies, sizeof *t);
    int rc = t ? 0 : cli_fail("out of memory for the plot");
    for (int c = 0; !rc && c < copies; c++) {
        for (int i = 0; i < steps && !rc; i++)
            rc = plot_curve_add(&t[c].loss, first + i + 1, losses[(size_t)i * (size_t)copies + (size_t)c]);
        for (int i = 0; i < val[c].n && !rc; i++)
            rc = plot_curve_add(&t[c].val_loss, val[c].step[i], val[c].loss[i]);
    }
    if (!rc) rc = plot_write_copies_svg(o->plot, title, t, copies);
    for (int c = 0; t && c < copies; c++) plot_training_free(&t[c]);
    free(t);
    return rc;
}

/* The start-up after the model is built, as one line of stdout that names
 * each phase as it starts and times it when done: a big model (GPT-2
 * 124M) spends a minute here, which must not look like a hang. */
static double phase_start;

static void phase_begin(const char *what)
{
    printf(", %s ", what);
    fflush(stdout);
    message_open_line();
    phase_start = now_ms();
}

static void phase_end(void)
{
    printf("%.1f s", (now_ms() - phase_start) / 1e3);
    fflush(stdout);
}

/* The memory check, BLAS and the programs (the step; the evaluation
 * when there is one); 0, or an exit code with a message. */
static int start_up(const cli_opts *o, const cli_model *m, double build_ms, spmd_program **p,
                    spmd_program **eval)
{
    printf("start-up: building %.1f s", build_ms / 1e3);
    message_open_line();
    int rc = 0;
    if (o->memory_check) {
        phase_begin("planning memory");
        if (!(rc = model_check_memory(o, m))) phase_end();
    }
    if (!rc) {
        phase_begin("loading BLAS");
        if (!(rc = model_select_blas(o))) phase_end();
    }
    if (!rc) {
        phase_begin("compiling the step");
        if (!(*p = model_compile(o, m->train.g, false))) rc = 1;
        else phase_end();
    }
    if (!rc && m->eval.g) {
        phase_begin("compiling the evaluation");
        if (!(*eval = model_compile(o, m->eval.g, false))) rc = 1;
        else phase_end();
    }
    message_close_line();
    return rc;
}

/* The held-out scoring at the end, one line on stdout: a count that
 * rises on a terminal, the time when done (on one device, GPT-2 124M
 * scores its 256 samples one at a time for a minute or two). */
typedef struct scoring {
    const char *what; /* "256 held-out samples" */
    int64_t total, before; /* samples of every copy; scored by the copies before this one */
} scoring;

static void on_scored(void *ctx, int64_t scored)
{
    const scoring *s = ctx;
    printf("\rscoring %s: %lld/%lld", s->what, (long long)(s->before + scored), (long long)s->total);
    fflush(stdout);
}

/* Every copy's held-out accuracy (-1: none, or a diverged or stopped model). */
static void score_all(const cli_opts *o, const cli_model *m, const spmd_program *p,
                      spmd_program *eval, bool stopped, const bool *gone, bool live,
                      double *accuracy)
{
    int scored_copies = 0;
    for (int c = 0; c < m->copies; c++) scored_copies += !(stopped || gone[c]);
    char what[96];
    snprintf(what, sizeof what, "%d held-out samples%s", o->eval_samples,
             m->copies > 1 ? " of each copy" : "");
    scoring s = {what, (int64_t)o->eval_samples * scored_copies, 0};
    bool shown = m->accuracy && eval && scored_copies > 0;
    if (shown) {
        printf("scoring %s", what);
        fflush(stdout);
        message_open_line();
    }
    double t0 = now_ms();
    for (int c = 0; c < m->copies; c++) {
        accuracy[c] = stopped || gone[c] ? -1
                                         : feed_accuracy(o, m, p, eval, c, live ? on_scored : NULL, &s);
        if (!(stopped || gone[c])) s.before += o->eval_samples;
    }
    if (!shown) return;
    if (live) printf("\rscoring %s: %.1f s         ", what, (now_ms() - t0) / 1e3);
    else printf(": %.1f s", (now_ms() - t0) / 1e3);
    message_close_line();
    fflush(stdout);
}

/* The run: build, check, compile, train, report; 0 or an exit code. */
static int train(cli_opts *o_in, run_log *log)
{
    cli_opts o = *o_in;
    int rc = 0;
    /* What would fail only after the run (the report) or kill it (memory)
     * is checked before it. */
    trace_steps traced;
    if ((rc = trace_prepare(&o, &traced))) return rc;
    cli_model m;
    double build_start = now_ms();
    rc = model_build(&o, &m);
    spmd_program *p = NULL, *eval = NULL;
    if (!rc) rc = start_up(&o, &m, now_ms() - build_start, &p, &eval);
    if (rc) {
        spmd_program_free(p);
        model_free(&m);
        return rc;
    }
    char mesh[128];
    model_mesh_text(&m, mesh, sizeof mesh);
    char batch[64];
    model_batch_text(&o, &m, batch, sizeof batch);
    printf("spmd train: %s, %.2fM parameters, mesh %s, %s, %s, %s\n", o.model,
           (double)m.params / 1e6, mesh, batch,
           cli_optimizer_title(o.optimizer.kind), spmd_blas_describe());
    if (o.blas && !strncmp(o.blas, "measure", 7))
        printf("GEMM backends measured: --blas '%s' repeats this choice (and these bits)\n",
               spmd_blas_choice());
    if (o.bf16) printf("bf16 matmuls: %s\n", spmd_blas_describe_bf16());
    printf("data: %s\n", spmd_dataset_describe(m.data));
    feed_cap_eval(&o, &m);
    printf("per device: %.1f MiB peak, %.1f MiB parameters + gradients + optimizer state, "
           "%d collectives per step\n",
           (double)spmd_program_peak_bytes(p) / 1048576.0, (double)model_param_bytes(p) / 1048576.0,
           spmd_program_collective_count(p));
    warn_plan(&o, &m, p);
    if (o.init) rc = weights_init_apply(o.init, &m.gpt, p);
    if (!rc) rc = run_checkpoint_check_room(&o, &m, p);
    /* Saved state last: it replaces what the flags set up. */
    int first = 0;      /* steps already run (a resumed run's saved step) */
    int64_t sample = 0; /* the data position: training samples consumed */
    double t_load = now_ms();
    if (!rc && o.resume && !(rc = run_checkpoint_resume(&o, &m, p, &first, &sample))) {
        printf("resumed: step %d of %d from %s (data position %lld samples) in %.0f ms\n", first,
               o.steps, o.resume, (long long)sample, now_ms() - t_load);
        fflush(stdout);
        trace_resumed(&o, &traced, first);
    }
    if (rc) {
        spmd_program_free(eval);
        spmd_program_free(p);
        model_free(&m);
        return rc;
    }

    /* Per-step records grow with the run: a long --steps must not claim
     * its whole history before the first step. */
    float *losses = NULL;
    double *ms = NULL, *drops = NULL;
    size_t room = 0;
    train_stop stop = {0};
    val_records val[CLI_MAX_COPIES] = {0};
    const int copies = m.copies;
    int diverged = 0; /* copies whose loss or gradient norm is no longer finite */
    bool gone[CLI_MAX_COPIES] = {0};
    int done = first; /* the last step run, from 1 */
    int saved = first; /* the last step in a checkpoint */
    /* Over processes each would see the signal after a step of its own:
     * they could stop at different steps, so a signal ends the job. */
    if (processes_count() == 1) catch_stop_signals();
    /* mpirun hands its processes a pseudo-terminal whatever its own output
     * is: over several processes, plain lines. */
    bool live = isatty(STDOUT_FILENO) && processes_count() == 1;
    int every = o.log_every ? o.log_every : o.steps / 20 > 1 ? o.steps / 20 : 1;
    double start = now_ms();
    /* The first step is the slowest (pages touched for the first time): a
     * terminal says it has begun, the live line then replaces it. */
    if (live && first < o.steps) {
        printf("step %4d/%d  running the first step", first + 1, o.steps);
        fflush(stdout);
    }
    const int micro = o.optimizer.accumulate_steps > 1 ? o.optimizer.accumulate_steps : 1;
    for (int s = first; s < o.steps && !rc && !stop.step; s++) {
        int i = s - first; /* records index */
        if ((size_t)i == room && (rc = grow_records(&losses, &ms, &drops, &room, copies))) break;
        float *loss = &losses[(size_t)i * (size_t)copies];
        if ((rc = trace_before_step(&o, &traced, p, s + 1))) break;
        test_hooks_step_begin(s);
        double t0 = now_ms();
        /* A step is its micro-batches (one without --accumulate), each
         * the next --batch samples; its loss their losses' mean, the loss
         * of their concatenated batch. */
        spmd_status st = SPMD_OK;
        double sum[CLI_MAX_COPIES] = {0};
        drops[i] = 0; /* copy 0's, over the micro-batches */
        for (int k = 0; k < micro && !rc && st == SPMD_OK; k++) {
            if ((rc = feed_step(&o, &m, p, s, sample))) break;
            sample += (int64_t)o.batch * m.micro_batches;
            st = k + 1 < micro ? spmd_program_accumulate(p) : spmd_program_run(p);
            for (int c = 0; c < copies && st == SPMD_OK; c++) {
                float l = 0.0f;
                st = spmd_program_read_copy(p, c, m.train.loss, &l, sizeof l);
                sum[c] += l;
            }
            float d = 0.0f;
            if (m.train.dropped && st == SPMD_OK)
                st = spmd_program_read_copy(p, 0, m.train.dropped, &d, sizeof d);
            drops[i] += d;
        }
        if (rc) break;
        float norm[CLI_MAX_COPIES] = {0};
        for (int c = 0; c < copies && st == SPMD_OK; c++) {
            loss[c] = (float)(sum[c] / micro);
            if (m.opt.grad_norm)
                st = spmd_program_read_copy(p, c, m.opt.grad_norm, &norm[c], sizeof *norm);
        }
        if (st != SPMD_OK) {
            if (live) printf("\n");
            fflush(stdout);
            cli_fail("step %d failed: %s", s + 1, spmd_last_error());
            rc = 1;
            break;
        }
        ms[i] = now_ms() - t0;
        trace_after_step(&traced, p, s + 1);
        double elapsed = (now_ms() - start) / 1e3;
        double eta = elapsed / (i + 1) * (o.steps - s - 1);
        double tok_s = (double)m.tokens_per_step / (ms[i] / 1e3);
        done = s + 1;
        /* A terminal gets one live line; a file or pipe, plain lines. */
        char text[16 * CLI_MAX_COPIES + 32];
        loss_text(loss, copies, text, sizeof text);
        if (m.train.dropped) /* experts: the step's assignments past capacity */
            snprintf(text + strlen(text), sizeof text - strlen(text), "  dropped %.0f", drops[i]);
        if (live)
            printf("\rstep %4d/%d  loss %s  %.0f tok/s  %.1f ms/step  eta %.0fs   ", done, o.steps,
                   text, tok_s, ms[i], eta);
        else if (done == first + 1 || done % every == 0 || done == o.steps)
            printf("step %4d/%d  loss %s  %.0f tok/s  %.1f ms/step  eta %.0fs\n", done, o.steps,
                   text, tok_s, ms[i], eta);
        fflush(stdout);
        if (log && (rc = log_step(log, done, loss, m.train.dropped ? &drops[i] : NULL, copies,
                                  feed_lr(&o, s), norm[0], ms[i], tok_s)))
            break;
        /* Copies share nothing: one that diverges is named and the others
         * train on, until none is left. */
        for (int c = 0; copies > 1 && !o.keep_nonfinite && c < copies; c++) {
            char why[32];
            if (gone[c] || !nonfinite(loss[c], norm[c], why, sizeof why)) continue;
            gone[c] = true;
            diverged++;
            if (live) printf("\n");
            fflush(stdout);
            fprintf(stderr, "spmd: copy %d: step %d: %s; the other copies train on\n", c, done, why);
        }
        if (copies > 1 && diverged == copies) {
            stop.step = done;
            snprintf(stop.reason, sizeof stop.reason, "every copy diverged");
            break;
        }
        if (copies == 1 && !o.keep_nonfinite &&
            nonfinite(loss[0], norm[0], stop.reason, sizeof stop.reason)) {
            stop.step = done;
            break; /* a diverged model is not saved */
        }
        if (feed_validates_at(&o, done, o.steps)) {
            if (live) printf("\n");
            if ((rc = validate(&o, &m, p, eval, done, log, val))) break;
        }
        note_signal(&stop, done);
        /* Periodic saves; the last step's (or a stopped run's) comes below. */
        if (o.save && o.save_every && done % o.save_every == 0 && done < o.steps && !stop.step) {
            if (live) printf("\n");
            rc = run_checkpoint_save(&o, &m, p, done, sample);
            saved = done;
        }
    }
    if (live) printf("\n");
    int run = done - first; /* steps run by this process */
    if (stop.step && !stop.signal) {
        fflush(stdout);
        fprintf(stderr, "spmd: step %d: %s; training stopped (--on-nonfinite continue trains on)%s\n",
                stop.step, stop.reason, o.save ? "; no checkpoint written of the diverged model" : "");
    }
    /* The end of the run, or a graceful stop, is saved: what was trained
     * is not lost. */
    if (!rc && o.save && (!stop.step || stop.signal) && done > saved) rc = run_checkpoint_save(&o, &m, p, done, sample);
    if (!rc && run > 0) {
        double *sorted = malloc((size_t)run * sizeof *sorted);
        if (!sorted) {
            rc = cli_fail("out of memory");
            goto out;
        }
        memcpy(sorted, ms, (size_t)run * sizeof *ms);
        qsort(sorted, (size_t)run, sizeof *sorted, cmp_double);
        double median = sorted[run / 2];
        free(sorted);
        /* A diverged or interrupted model has no accuracy worth reporting. */
        double accuracy[CLI_MAX_COPIES];
        score_all(&o, &m, p, eval, stop.step > 0, gone, live, accuracy);
        note_signal(&stop, done);
        char ended[64] = "done";
        if (stop.step) snprintf(ended, sizeof ended, "stopped after step %d of %d", stop.step, o.steps);
        char from[16 * CLI_MAX_COPIES], to[16 * CLI_MAX_COPIES];
        loss_text(losses, copies, from, sizeof from);
        loss_text(&losses[(size_t)(run - 1) * (size_t)copies], copies, to, sizeof to);
        printf("%s: loss %s -> %s, median %.1f ms/step (%.0f tok/s, %.2f GFLOP/s)\n", ended, from, to,
               median, (double)m.tokens_per_step / (median / 1e3),
               m.flops_per_step / (median / 1e3) / 1e9);
        for (int c = 0; c < copies; c++) {
            if (accuracy[c] < 0) continue;
            if (copies > 1) printf("copy %d: ", c);
            printf("held-out accuracy: %.1f%% of %d samples' answer digits (chance 10%%)\n",
                   accuracy[c] * 100, o.eval_samples);
        }
        if (copies > 1) {
            double final[CLI_MAX_COPIES];
            bool validated = val[0].n > 0;
            for (int c = 0; c < copies; c++)
                final[c] = validated ? val[c].loss[val[c].n - 1]
                                     : losses[(size_t)(run - 1) * (size_t)copies + (size_t)c];
            copies_rank(&o, m.copies, final, validated);
        }
        printf("per device: %.1f MiB peak, %.1f MiB parameters + gradients + optimizer state; "
               "%d collectives per step\n",
               (double)spmd_program_peak_bytes(p) / 1048576.0, (double)model_param_bytes(p) / 1048576.0,
               spmd_program_collective_count(p));
        fflush(stdout); /* the summary before any message about the report */
        if (m.train.dropped) {
            double total = 0;
            for (int i = 0; i < run; i++) total += drops[i];
            printf("experts: %.0f token assignments dropped past capacity in %d steps (%.2f%% of "
                   "%d x %lld a step)\n", total, run,
                   100.0 * total / ((double)run * o.gpt.top_k * (double)(m.tokens_per_step / copies) *
                                    (o.gpt.layers / 2)),
                   o.gpt.top_k * (o.gpt.layers / 2), (long long)(m.tokens_per_step / copies));
        }
        if (o.json) rc = report(&o, &m, p, losses, drops, first, run, median, accuracy, &stop, val);
        if (stop.signal)
            fprintf(stderr, "spmd: interrupted by %s after step %d%s%s\n", stop.reason, stop.step,
                    !o.json ? "" : rc ? "; the report could not be written" : "; report written to ",
                    o.json && !rc ? o.json : "");
        if (!rc) rc = trace_write(&o, &m, p, &traced);
        if (o.plot && !rc) {
            char title[192];
            snprintf(title, sizeof title, "spmd train: %s on %s", o.model, mesh);
            rc = plot_run(&o, title, losses, copies, first, run, val);
        }
        /* The stop's own status: a script must not take it for success. */
        if (stop.step) rc = stop.signal ? 128 + stop.signal : EXIT_DIVERGED;
    }
out:
    free(losses), free(ms), free(drops);
    for (int c = 0; c < CLI_MAX_COPIES; c++) free(val[c].step), free(val[c].loss);
    spmd_program_free(eval);
    spmd_program_free(p);
    model_free(&m);
    return rc;
}

int cmd_train(int argc, char **argv)
{
    cli_opts o;
    int rc = flags_parse(argc, argv, CMD_TRAIN, &o);
    if (rc) return rc < 0 ? 0 : rc;
    test_hooks_phase("start");
    if (o.processes > 1 && processes_count() == 1)
        return cli_fail("--processes plans a run over several processes (spmd explain); to train "
                        "over %d processes, start spmd with mpirun -n %d", o.processes, o.processes);
    /* The save directory before any work (flags_parse checked the paths). */
    if ((rc = run_checkpoint_prepare(&o))) return rc;
    run_log *log = NULL;
    /* Process 0 logs for the run. */
    if (o.log && processes_rank() == 0 && !(log = run_log_open(o.log))) return 1;
    rc = train(&o, log);
    int closed = run_log_close(log);
    return rc ? rc : closed;
}
