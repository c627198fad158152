/*
 * Flags, model building and data feeding shared by `spmd train` and
 * `spmd explain`.  Flags map onto cli_opts; the library reads no
 * environment.
 */
#include "cli.h"

#include <errno.h>
#include <fnmatch.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

int cli_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "spmd: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return 2;
}

void cli_usage(FILE *f, const char *command)
{
    fprintf(f,
            "usage: spmd %s [flags]\n"
            "  --model gpt|mlp      model to train (gpt)\n"
            "  --layers N --dim N --heads N --seq N --vocab N   GPT shape (2, 64, 4, 32, 64)\n"
            "  --context N          GPT position table rows (1024, as GPT-2; at least --seq)\n"
            "  --hidden N           MLP width (128); --layers sets its depth\n"
            "  --batch N            global batch (16)\n"
            "  --steps N            training steps (60)\n"
            "  --lr X               SGD learning rate (0.1)\n"
            "  --seed N             initialisation and data seed (1)\n"
            "  --threads N          compute threads in all (every core)\n"
            "  --mesh SHAPE         device mesh, e.g. 8 or 4x2 (1)\n"
            "  --axes NAMES         mesh axis names, e.g. data or replica,fsdp (data)\n"
            "  --shard PATTERN=SPEC shard the tensors whose names match the glob, e.g.\n"
            "                       '*.weight=fsdp,None' or 'input=(replica,fsdp),None';\n"
            "                       repeatable, later rules win; the batch dim of the\n"
            "                       inputs is split over every mesh axis unless a rule\n"
            "                       names them\n"
            "  --json FILE          write a JSON report\n"
            "  --blas NAME          GEMM library: auto, openblas or blis (auto)\n"
            "  --blas-core NAME     OpenBLAS core type, e.g. SkylakeX (fits the CPU)\n",
            command);
}

static void defaults(cli_opts *o)
{
    memset(o, 0, sizeof *o);
    strcpy(o->model, "gpt");
    o->gpt = (spmd_gpt_config){.vocab = 64, .seq = 32, .layers = 2, .heads = 4, .dim = 64};
    o->mlp = (spmd_mlp_config){.in_dim = 32, .hidden = 128, .layers = 2, .out_dim = 32};
    o->batch = 16;
    o->steps = 60;
    o->lr = 0.1f;
    o->seed = 1;
    o->mesh = "1";
    o->axes = "data";
}

static int parse_int(const char *flag, const char *text, int min, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || *end || end == text || v < min || v > 1000000000L)
        return cli_fail("%s wants an integer of at least %d, got '%s'", flag, min, text);
    *out = (int)v;
    return 0;
}

int cli_parse(int argc, char **argv, const char *command, cli_opts *o)
{
    defaults(o);
    for (int i = 0; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            cli_usage(stdout, command);
            return -1;
        }
        if (i + 1 >= argc) return cli_fail("%s needs a value", f);
        const char *v = argv[++i];
        int rc = 0;
        if (!strcmp(f, "--model")) {
            if (strcmp(v, "gpt") && strcmp(v, "mlp")) return cli_fail("--model is gpt or mlp, got '%s'", v);
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
            int s = 0;
            rc = parse_int(f, v, 0, &s);
            o->seed = (uint64_t)s;
        } else if (!strcmp(f, "--lr")) {
            char *end;
            o->lr = strtof(v, &end);
            if (*end || end == v || !(o->lr > 0)) return cli_fail("--lr wants a positive number, got '%s'", v);
        } else if (!strcmp(f, "--mesh")) o->mesh = v;
        else if (!strcmp(f, "--axes")) o->axes = v;
        else if (!strcmp(f, "--shard")) {
            const char *eq = strchr(v, '=');
            if (!eq || eq == v) return cli_fail("--shard wants PATTERN=SPEC, got '%s'", v);
            if (o->n_shards == CLI_MAX_SHARDS) return cli_fail("more than %d --shard rules", CLI_MAX_SHARDS);
            /* Split in place: argv strings are ours to modify. */
            argv[i][eq - v] = '\0';
            o->shards[o->n_shards++] = (cli_shard){v, eq + 1};
        } else if (!strcmp(f, "--json")) o->json = v;
        else if (!strcmp(f, "--blas")) o->blas = v;
        else if (!strcmp(f, "--blas-core")) o->blas_core = v;
        else {
            cli_usage(stderr, command);
            return cli_fail("unknown flag '%s'", f);
        }
        if (rc) return rc;
    }
    if (!o->gpt.context) o->gpt.context = o->gpt.seq > 1024 ? o->gpt.seq : 1024;
    return 0;
}

/* ---- Model and marks ------------------------------------------------------ */

/* The batch dim over every mesh axis: "(a, b), None, ..." for rank r. */
static void batch_spec(const spmd_mesh *m, int rank, char *buf, size_t size)
{
    size_t n = 0;
    int axes = spmd_mesh_rank(m);
    n += (size_t)snprintf(buf + n, size - n, axes > 1 ? "(" : "");
    for (int a = 0; a < axes; a++)
        n += (size_t)snprintf(buf + n, size - n, a ? ", %s" : "%s", spmd_mesh_axis_name(m, a));
    n += (size_t)snprintf(buf + n, size - n, axes > 1 ? ")" : "");
    for (int i = 1; i < rank; i++) n += (size_t)snprintf(buf + n, size - n, ", None");
}

/* Entries of a spec: top-level commas + 1 ("" has none).  A rule applies
 * to the matching tensors of that rank, so '*.weight=fsdp,None' shards the
 * matrices and leaves the LayerNorm vectors alone. */
static int spec_entries(const char *spec)
{
    int depth = 0, n = 0;
    bool any = false;
    for (const char *c = spec; *c && *c != '|'; c++) {
        if (*c == '(') depth++;
        else if (*c == ')') depth--;
        else if (*c == ',' && depth == 0) n++;
        if (*c != ' ') any = true;
    }
    return any ? n + 1 : 0;
}

/* Apply the --shard rules (later rules win), then the batch default to
 * inputs no rule named. */
static int apply_marks(const cli_opts *o, cli_model *m)
{
    bool used[CLI_MAX_SHARDS] = {false};
    for (int i = 0; i < spmd_graph_tensor_count(m->g); i++) {
        spmd_tensor *t = spmd_graph_tensor(m->g, i);
        const char *name = spmd_tensor_name(t);
        if (!name) continue;
        int rule = -1;
        for (int r = 0; r < o->n_shards; r++)
            if (fnmatch(o->shards[r].pattern, name, 0) == 0 &&
                spec_entries(o->shards[r].spec) == spmd_tensor_rank(t))
                rule = r;
        if (rule >= 0) {
            used[rule] = true;
            if (spmd_mark_sharding(m->g, t, m->mesh, o->shards[rule].spec) != SPMD_OK)
                return cli_fail("--shard '%s=%s': %s", o->shards[rule].pattern, o->shards[rule].spec,
                                spmd_last_error());
        } else if ((t == m->input || t == m->targets) && spmd_tensor_rank(t) > 0) {
            char spec[256];
            batch_spec(m->mesh, spmd_tensor_rank(t), spec, sizeof spec);
            if (spmd_mark_sharding(m->g, t, m->mesh, spec) != SPMD_OK)
                return cli_fail("batch sharding of '%s': %s", name, spmd_last_error());
        }
    }
    for (int r = 0; r < o->n_shards; r++)
        if (!used[r]) {
            /* A rule can also be overridden by a later one: only complain
             * when it fits no tensor at all. */
            bool any = false;
            for (int i = 0; i < spmd_graph_tensor_count(m->g) && !any; i++) {
                const spmd_tensor *t = spmd_graph_tensor(m->g, i);
                any = spmd_tensor_name(t) && fnmatch(o->shards[r].pattern, spmd_tensor_name(t), 0) == 0 &&
                      spec_entries(o->shards[r].spec) == spmd_tensor_rank(t);
            }
            if (!any)
                return cli_fail("--shard '%s=%s' fits no tensor: no name matches with a rank of %d",
                                o->shards[r].pattern, o->shards[r].spec, spec_entries(o->shards[r].spec));
        }
    return 0;
}

int cli_build(const cli_opts *o, cli_model *m)
{
    memset(m, 0, sizeof *m);
    m->mesh = spmd_mesh_parse(o->mesh, o->axes);
    if (!m->mesh) return cli_fail("--mesh %s --axes %s: %s", o->mesh, o->axes, spmd_last_error());
    if (spmd_mesh_devices(m->mesh) == 1 && o->n_shards == 0) {
        spmd_mesh_free(m->mesh); /* one device, nothing to partition */
        m->mesh = NULL;
    }
    m->g = spmd_graph_create(NULL);
    if (!m->g) return cli_fail("%s", spmd_last_error());
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
    if (st != SPMD_OK) return cli_fail("cannot build the model: %s", spmd_last_error());
    /* Forward + backward: 6 flops per parameter per token for the weights
     * that multiply (not the position table, which is only added), plus
     * attention's 12 * layers * dim * seq per token (as nanoGPT counts). */
    double mults = (double)m->params, attn = 0;
    if (!strcmp(o->model, "gpt")) {
        mults -= (double)o->gpt.context * o->gpt.dim;
        attn = 12.0 * o->gpt.layers * o->gpt.dim * o->gpt.seq;
    }
    m->flops_per_step = (6.0 * mults + attn) * (double)m->tokens_per_step;
    if (m->mesh) {
        int rc = apply_marks(o, m);
        if (rc) return rc;
    }
    m->lr = spmd_input(m->g, "lr", SPMD_F32, 0, NULL);
    if (spmd_graph_mark_output(m->g, m->loss) != SPMD_OK || spmd_grad(m->g, m->loss) != SPMD_OK ||
        spmd_sgd(m->g, m->lr) != SPMD_OK)
        return cli_fail("cannot build the training step: %s", spmd_last_error());
    return 0;
}

void cli_model_free(cli_model *m)
{
    spmd_graph_free(m->g);
    spmd_mesh_free(m->mesh);
    memset(m, 0, sizeof *m);
}

spmd_program *cli_compile(const cli_opts *o, cli_model *m)
{
    if (spmd_blas_select(o->blas, o->blas_core) != SPMD_OK) {
        cli_fail("%s", spmd_last_error());
        return NULL;
    }
    spmd_compile_options copt = {.threads = o->threads, .seed = o->seed};
    spmd_program *p = spmd_compile(m->g, &copt);
    if (!p) cli_fail("cannot compile: %s", spmd_last_error());
    return p;
}

size_t cli_param_bytes(const spmd_program *p)
{
    /* Gradients are resolved onto their parameter's sharding: one more
     * copy of the parameter bytes. */
    return spmd_program_persistent_bytes(p) + spmd_program_param_bytes(p);
}

/* ---- Data ---------------------------------------------------------------------- */

/* GPT reads token sequences; the MLP reads a one-hot of the first token
 * and predicts the second. */
int cli_feed(const cli_opts *o, const cli_model *m, spmd_program *p, int step)
{
    bool gpt = !strcmp(o->model, "gpt");
    int seq = gpt ? o->gpt.seq : 2, v = o->gpt.vocab;
    size_t ntok = (size_t)o->batch * (size_t)seq;
    int32_t *tok = malloc(ntok * sizeof *tok), *tgt = malloc(ntok * sizeof *tgt);
    float *onehot = gpt ? NULL : calloc((size_t)o->batch * (size_t)v, sizeof *onehot);
    int rc = !tok || !tgt || (!gpt && !onehot);
    if (!rc) rc = spmd_data_sequences(o->seed, (int64_t)step * o->batch, o->batch, seq, v, tok, tgt) != SPMD_OK;
    spmd_status st = SPMD_ERR_NOMEM;
    if (!rc && gpt) {
        st = spmd_program_set_input(p, m->input, tok, ntok * sizeof *tok);
        if (st == SPMD_OK) st = spmd_program_set_input(p, m->targets, tgt, ntok * sizeof *tgt);
    } else if (!rc) {
        for (int b = 0; b < o->batch; b++) {
            onehot[(size_t)b * v + tok[(size_t)b * 2]] = 1.0f;
            tgt[b] = tok[(size_t)b * 2 + 1];
        }
        st = spmd_program_set_input(p, m->input, onehot, (size_t)o->batch * v * sizeof *onehot);
        if (st == SPMD_OK) st = spmd_program_set_input(p, m->targets, tgt, (size_t)o->batch * sizeof *tgt);
    }
    if (st == SPMD_OK) st = spmd_program_set_input(p, m->lr, &o->lr, sizeof o->lr);
    free(tok), free(tgt), free(onehot);
    if (st != SPMD_OK) return cli_fail("cannot feed step %d: %s", step + 1, spmd_last_error());
    return 0;
}
