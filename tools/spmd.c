/*
 * The `spmd` command-line tool.  Subcommands:
 *   spmd train [flags]   build a model, compile one training step, run it
 * Flags map onto a config struct here; the library reads no environment.
 */
#include "spmd/data.h"
#include "spmd/models.h"
#include "spmd/spmd.h"

#include <cJSON.h>

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- Options ------------------------------------------------------------- */

typedef struct mesh_opts {
    int rank;
    int shape[4];
    char axes[64];
} mesh_opts;

typedef struct train_opts {
    char model[8];          /* "gpt" or "mlp" */
    spmd_gpt_config gpt;
    spmd_mlp_config mlp;
    int batch, steps, threads;
    float lr;
    uint64_t seed;
    mesh_opts mesh;
    const char *json;       /* report path or NULL */
    const char *blas;       /* "auto", "openblas", "blis" */
    const char *blas_core;  /* OpenBLAS core type or NULL */
} train_opts;

static void train_defaults(train_opts *o)
{
    memset(o, 0, sizeof *o);
    strcpy(o->model, "gpt");
    o->gpt = (spmd_gpt_config){.vocab = 64, .seq = 32, .layers = 2, .heads = 4, .dim = 64};
    o->mlp = (spmd_mlp_config){.in_dim = 32, .hidden = 128, .layers = 2, .out_dim = 32};
    o->batch = 16;
    o->steps = 60;
    o->lr = 0.1f;
    o->seed = 1;
    o->mesh = (mesh_opts){.rank = 1, .shape = {1}};
    strcpy(o->mesh.axes, "data");
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: spmd train [flags]\n"
            "  --model gpt|mlp      model to train (gpt)\n"
            "  --layers N --dim N --heads N --seq N --vocab N   GPT shape (2, 64, 4, 32, 64)\n"
            "  --context N          GPT position table rows (1024, as GPT-2; at least --seq)\n"
            "  --hidden N           MLP width (128); --layers sets its depth\n"
            "  --batch N            global batch (16)\n"
            "  --steps N            training steps (60)\n"
            "  --lr X               SGD learning rate (0.1)\n"
            "  --seed N             initialisation and data seed (1)\n"
            "  --threads N          compute threads (all cores)\n"
            "  --mesh SHAPE         device mesh, e.g. 1 or 4x2 (1)\n"
            "  --axes NAMES         mesh axis names, e.g. data or replica,fsdp (data)\n"
            "  --json FILE          write a JSON report\n"
            "  --blas NAME          GEMM library: auto, openblas or blis (auto)\n"
            "  --blas-core NAME     OpenBLAS core type, e.g. SkylakeX (fits the CPU)\n");
}

/* Print "spmd: <message>" and return the usage-error exit code. */
__attribute__((format(printf, 1, 2))) static int fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "spmd: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return 2;
}

static int parse_int(const char *flag, const char *text, int min, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || *end || end == text || v < min || v > 1000000000L)
        return fail("%s wants an integer, got '%s'", flag, text);
    *out = (int)v;
    return 0;
}

static int parse_mesh(const char *text, mesh_opts *m)
{
    const char *p = text;
    m->rank = 0;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 4096 || m->rank == 4)
            return fail("--mesh wants sizes like 8 or 4x2, got '%s'", text);
        m->shape[m->rank++] = (int)v;
        p = end;
        if (*p == 'x' || *p == 'X') p++;
        else if (*p) return fail("--mesh wants sizes like 8 or 4x2, got '%s'", text);
    }
    return m->rank ? 0 : fail("--mesh is empty");
}

static int parse_train(int argc, char **argv, train_opts *o)
{
    train_defaults(o);
    for (int i = 0; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            usage(stdout);
            exit(0);
        }
        if (i + 1 >= argc) return fail("%s needs a value", f);
        const char *v = argv[++i];
        int rc = 0;
        if (!strcmp(f, "--model")) {
            if (strcmp(v, "gpt") && strcmp(v, "mlp")) return fail("--model is gpt or mlp, got '%s'", v);
            strcpy(o->model, v);
        } else if (!strcmp(f, "--layers")) {
            rc = parse_int(f, v, 0, &o->gpt.layers);
            o->mlp.layers = o->gpt.layers;
        } else if (!strcmp(f, "--dim")) rc = parse_int(f, v, 1, &o->gpt.dim);
        else if (!strcmp(f, "--heads")) rc = parse_int(f, v, 1, &o->gpt.heads);
        else if (!strcmp(f, "--seq")) rc = parse_int(f, v, 1, &o->gpt.seq);
        else if (!strcmp(f, "--context")) rc = parse_int(f, v, 1, &o->gpt.context);
        else if (!strcmp(f, "--vocab")) rc = parse_int(f, v, 2, &o->gpt.vocab);
        else if (!strcmp(f, "--hidden")) rc = parse_int(f, v, 1, &o->mlp.hidden);
        else if (!strcmp(f, "--batch")) rc = parse_int(f, v, 1, &o->batch);
        else if (!strcmp(f, "--steps")) rc = parse_int(f, v, 1, &o->steps);
        else if (!strcmp(f, "--threads")) rc = parse_int(f, v, 1, &o->threads);
        else if (!strcmp(f, "--seed")) {
            int s;
            rc = parse_int(f, v, 0, &s);
            o->seed = (uint64_t)s;
        } else if (!strcmp(f, "--lr")) {
            char *end;
            o->lr = strtof(v, &end);
            if (*end || end == v || !(o->lr > 0)) return fail("--lr wants a positive number, got '%s'", v);
        } else if (!strcmp(f, "--mesh")) rc = parse_mesh(v, &o->mesh);
        else if (!strcmp(f, "--axes")) {
            if (strlen(v) >= sizeof o->mesh.axes) return fail("--axes is too long: '%s'", v);
            strcpy(o->mesh.axes, v);
        } else if (!strcmp(f, "--json")) o->json = v;
        else if (!strcmp(f, "--blas")) o->blas = v;
        else if (!strcmp(f, "--blas-core")) o->blas_core = v;
        else {
            usage(stderr);
            return fail("unknown flag '%s'", f);
        }
        if (rc) return rc;
    }
    if (!o->gpt.context) o->gpt.context = o->gpt.seq > 1024 ? o->gpt.seq : 1024;
    int devices = 1, axes = 1;
    for (int i = 0; i < o->mesh.rank; i++) devices *= o->mesh.shape[i];
    for (const char *p = o->mesh.axes; *p; p++) axes += *p == ',';
    if (axes != o->mesh.rank) return fail("--axes '%s' names a different number of axes than --mesh has", o->mesh.axes);
    if (devices > 1)
        return fail("a mesh of more than one device needs the SPMD partitioner, which is not "
                    "built yet; use --mesh 1 --axes data");
    return 0;
}

/* ---- Training ------------------------------------------------------------ */

typedef struct model {
    spmd_graph *g;
    spmd_tensor *input, *targets, *loss, *lr;
    int64_t params;
    int64_t tokens_per_step;
    double flops_per_step;
} model;

static int build_model(const train_opts *o, model *m)
{
    m->g = spmd_graph_create(NULL);
    if (!m->g) return 1;
    spmd_status st;
    if (!strcmp(o->model, "gpt")) {
        spmd_gpt_tensors t;
        st = spmd_gpt_build(m->g, &o->gpt, o->batch, &t);
        m->input = t.input, m->targets = t.targets, m->loss = t.loss;
        m->params = spmd_gpt_param_count(&o->gpt);
        m->tokens_per_step = (int64_t)o->batch * o->gpt.seq;
    } else {
        spmd_mlp_config c = o->mlp;
        c.in_dim = c.out_dim = o->gpt.vocab;
        spmd_mlp_tensors t;
        st = spmd_mlp_build(m->g, &c, NULL, o->batch, &t);
        if (st == SPMD_OK) st = spmd_mlp_add_loss(m->g, SPMD_MLP_CROSS_ENTROPY, &t);
        m->input = t.input, m->targets = t.targets, m->loss = t.loss;
        m->params = spmd_mlp_param_count(&c);
        m->tokens_per_step = o->batch;
    }
    if (st != SPMD_OK) return 1;
    /* Forward + backward: 6 flops per parameter per token for the weights
     * that multiply (not the position table, which is only added), plus
     * attention's 12 * layers * dim * seq per token (as nanoGPT counts). */
    double mults = (double)m->params, attn = 0;
    if (!strcmp(o->model, "gpt")) {
        mults -= (double)o->gpt.context * o->gpt.dim;
        attn = 12.0 * o->gpt.layers * o->gpt.dim * o->gpt.seq;
    }
    m->flops_per_step = (6.0 * mults + attn) * (double)m->tokens_per_step;
    m->lr = spmd_input(m->g, "lr", SPMD_F32, 0, NULL);
    if (spmd_graph_mark_output(m->g, m->loss) != SPMD_OK) return 1;
    if (spmd_grad(m->g, m->loss) != SPMD_OK) return 1;
    if (spmd_sgd(m->g, m->lr) != SPMD_OK) return 1;
    return 0;
}

/* One global batch for `step`: GPT reads token sequences; the MLP reads a
 * one-hot of the first token and predicts the second. */
static int fill_batch(const train_opts *o, int step, int32_t *tok, int32_t *tgt, float *onehot)
{
    int seq = strcmp(o->model, "gpt") ? 2 : o->gpt.seq;
    if (spmd_data_sequences(o->seed, (int64_t)step * o->batch, o->batch, seq, o->gpt.vocab, tok, tgt))
        return 1;
    if (!strcmp(o->model, "gpt")) return 0;
    int v = o->gpt.vocab;
    memset(onehot, 0, sizeof(float) * (size_t)o->batch * (size_t)v);
    for (int b = 0; b < o->batch; b++) {
        onehot[(size_t)b * v + tok[(size_t)b * 2]] = 1.0f;
        tgt[b] = tok[(size_t)b * 2 + 1];
    }
    return 0;
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

static int write_report(const train_opts *o, const model *m, const spmd_program *p,
                        const float *losses, double ms_median)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *mesh = cJSON_AddObjectToObject(root, "mesh");
    cJSON *shape = cJSON_AddArrayToObject(mesh, "shape");
    for (int i = 0; i < o->mesh.rank; i++) cJSON_AddItemToArray(shape, cJSON_CreateNumber(o->mesh.shape[i]));
    cJSON *axes = cJSON_AddArrayToObject(mesh, "axes");
    char names[64];
    strcpy(names, o->mesh.axes);
    for (char *tok = strtok(names, ","); tok; tok = strtok(NULL, ",")) cJSON_AddItemToArray(axes, cJSON_CreateString(tok));
    cJSON_AddStringToObject(root, "model", o->model);
    cJSON_AddNumberToObject(root, "params", (double)m->params);
    cJSON_AddNumberToObject(root, "steps", o->steps);
    cJSON *loss = cJSON_AddArrayToObject(root, "loss");
    for (int i = 0; i < o->steps; i++) cJSON_AddItemToArray(loss, cJSON_CreateNumber(losses[i]));
    cJSON_AddNumberToObject(root, "ms_per_step", ms_median);
    cJSON_AddNumberToObject(root, "tokens_per_s", (double)m->tokens_per_step / (ms_median / 1e3));
    cJSON_AddNumberToObject(root, "flops_per_step", m->flops_per_step);
    cJSON *pb = cJSON_AddArrayToObject(root, "param_bytes_per_device");
    cJSON_AddItemToArray(pb, cJSON_CreateNumber((double)spmd_program_persistent_bytes(p)));
    cJSON *peak = cJSON_AddArrayToObject(root, "peak_bytes_per_device");
    cJSON_AddItemToArray(peak, cJSON_CreateNumber((double)spmd_program_peak_bytes(p)));
    cJSON_AddArrayToObject(root, "collectives");
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) return fail("could not format the JSON report");
    FILE *f = fopen(o->json, "w");
    int rc = 0;
    if (!f || fputs(text, f) < 0 || fputc('\n', f) < 0) rc = fail("cannot write %s: %s", o->json, strerror(errno));
    if (f && fclose(f) != 0 && !rc) rc = fail("cannot write %s: %s", o->json, strerror(errno));
    free(text);
    return rc;
}

static int cmd_train(int argc, char **argv)
{
    train_opts o;
    int rc = parse_train(argc, argv, &o);
    if (rc) return rc;
    if (spmd_blas_select(o.blas, o.blas_core) != SPMD_OK) {
        fprintf(stderr, "spmd: %s\n", spmd_last_error());
        return 1;
    }
    model m = {0};
    if (build_model(&o, &m)) {
        fprintf(stderr, "spmd: cannot build the model: %s\n", spmd_last_error());
        spmd_graph_free(m.g);
        return 1;
    }
    spmd_compile_options copt = {.threads = o.threads, .seed = o.seed};
    spmd_program *p = spmd_compile(m.g, &copt);
    if (!p) {
        fprintf(stderr, "spmd: cannot compile: %s\n", spmd_last_error());
        spmd_graph_free(m.g);
        return 1;
    }
    printf("spmd train: %s, %.2fM parameters, mesh %d (%s), batch %d, %s\n", o.model,
           (double)m.params / 1e6, 1, o.mesh.axes, o.batch, spmd_blas_describe());
    printf("memory per device: %.1f MiB peak, %.1f MiB persistent\n",
           (double)spmd_program_peak_bytes(p) / 1048576.0,
           (double)spmd_program_persistent_bytes(p) / 1048576.0);

    int seq = strcmp(o.model, "gpt") ? 2 : o.gpt.seq;
    size_t ntok = (size_t)o.batch * (size_t)seq;
    int32_t *tok = malloc(ntok * sizeof *tok), *tgt = malloc(ntok * sizeof *tgt);
    float *onehot = malloc((size_t)o.batch * (size_t)o.gpt.vocab * sizeof *onehot);
    float *losses = malloc((size_t)o.steps * sizeof *losses);
    double *ms = malloc((size_t)o.steps * sizeof *ms);
    rc = !tok || !tgt || !onehot || !losses || !ms;
    double start = now_ms();
    for (int s = 0; s < o.steps && !rc; s++) {
        double t0 = now_ms();
        rc = fill_batch(&o, s, tok, tgt, onehot);
        bool gpt = !strcmp(o.model, "gpt");
        spmd_status st = rc ? SPMD_ERR_INVALID
                            : gpt ? spmd_program_set_input(p, m.input, tok, ntok * sizeof *tok)
                                  : spmd_program_set_input(p, m.input, onehot,
                                                           (size_t)o.batch * o.gpt.vocab * sizeof *onehot);
        if (st == SPMD_OK) st = spmd_program_set_input(p, m.targets, tgt, (gpt ? ntok : (size_t)o.batch) * sizeof *tgt);
        if (st == SPMD_OK) st = spmd_program_set_input(p, m.lr, &o.lr, sizeof o.lr);
        if (st == SPMD_OK) st = spmd_program_run(p);
        if (st == SPMD_OK) st = spmd_program_read(p, m.loss, &losses[s], sizeof losses[s]);
        if (st != SPMD_OK) {
            fprintf(stderr, "\nspmd: step %d failed: %s\n", s + 1, spmd_last_error());
            rc = 1;
            break;
        }
        ms[s] = now_ms() - t0;
        double elapsed = (now_ms() - start) / 1e3;
        double eta = elapsed / (s + 1) * (o.steps - s - 1);
        printf("\rstep %4d/%d  loss %.4f  %.0f tok/s  %.0f ms/step  eta %.0fs   ", s + 1, o.steps,
               (double)losses[s], (double)m.tokens_per_step / (ms[s] / 1e3), ms[s], eta);
        fflush(stdout);
    }
    printf("\n");
    if (!rc) {
        double *sorted = malloc((size_t)o.steps * sizeof *sorted);
        memcpy(sorted, ms, (size_t)o.steps * sizeof *ms);
        qsort(sorted, (size_t)o.steps, sizeof *sorted, cmp_double);
        double median = sorted[o.steps / 2];
        free(sorted);
        printf("done: loss %.4f -> %.4f, median %.1f ms/step, %.2f GFLOP/s, peak %.1f MiB/device\n",
               (double)losses[0], (double)losses[o.steps - 1], median,
               m.flops_per_step / (median / 1e3) / 1e9, (double)spmd_program_peak_bytes(p) / 1048576.0);
        if (o.json) rc = write_report(&o, &m, p, losses, median);
    }
    free(tok), free(tgt), free(onehot), free(losses), free(ms);
    spmd_program_free(p);
    spmd_graph_free(m.g);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) return cmd_train(0, NULL);
    if (!strcmp(argv[1], "train")) return cmd_train(argc - 2, argv + 2);
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "spmd: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
