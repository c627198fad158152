/*
 * Flags, model building, data feeding and evaluation shared by
 * `spmd train` and `spmd explain`.  Flags map onto cli_opts; the library
 * reads no environment.
 */
#include "cli.h"
#include "processes.h"

#include <ctype.h>
#include <errno.h>
#include <fnmatch.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

int cli_fail(const char *fmt, ...)
{
    /* One write per message: under mpirun other processes' output must not
     * land inside it.  Over several processes every one prints its errors:
     * say whose. */
    char line[4096];
    size_t n = cli_processes() > 1
                   ? (size_t)snprintf(line, sizeof line, "spmd: process %d: ", cli_process_rank())
                   : (size_t)snprintf(line, sizeof line, "spmd: ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - n - 1, fmt, ap);
    va_end(ap);
    strcat(line, "\n");
    fputs(line, stderr);
    fflush(stderr);
    return 2;
}

void cli_usage(FILE *f, const char *command)
{
    fprintf(f,
            "usage: spmd %s [flags]   (each as --flag VALUE or --flag=VALUE)\n"
            "  --mesh SHAPE         device mesh, e.g. 8 or 4x2 (4x2)\n"
            "  --axes NAMES         mesh axis names (replica,fsdp)\n"
            "  --devices N          device workers (the mesh size; alone: a mesh N, axis 'data')\n"
            "  --processes P        explain: plan the mesh over P processes, the device at mesh\n"
            "                       position r in process r / (devices / P); axes whose groups\n"
            "                       cross processes are priced as the network (1; under\n"
            "                       mpirun, its process count)\n"
            "  --net-latency US --net-bandwidth GBPS   the network's figures for those prices\n"
            "                       (measured under mpirun, else 25 us and 1.25 GB/s)\n"
            "  --fsdp AXIS|none     shard every parameter on its largest dim over AXIS\n"
            "                       (default: the axis named fsdp when the mesh has one)\n"
            "  --shard PATTERN=SPEC shard the tensors whose names match the glob and whose rank\n"
            "                       fits the spec, e.g. '*.weight=fsdp,None'; repeatable, later\n"
            "                       rules win; the inputs' batch dim is split over every mesh\n"
            "                       axis unless a rule names them\n"
            "  --tp AXIS            GPT tensor parallelism (Megatron-LM) over AXIS: heads, MLP\n"
            "                       hidden units and vocabulary split; the batch goes over the\n"
            "                       other axes, --fsdp splits the weights' other dim\n"
            "  --sp on|off          with --tp: sequence parallelism, the residual stream split\n"
            "                       over the sequence on the tensor axis (off)\n"
            "  --model gpt|mlp      model (gpt)\n"
            "  --layers N --dim N --heads N --seq N   GPT shape (2, 96, 4, 40)\n"
            "  --vocab N            vocabulary (the data's)\n"
            "  --context N          GPT position table rows (--seq)\n"
            "  --hidden N           MLP width (128); --layers sets its depth\n"
            "  --data PATH          arith (built-in additions), a text file, or llm.c token\n"
            "                       shards (FILE.bin or a glob) (arith)\n"
            "  --batch N            global batch (32)\n"
            "  --steps N            training steps (2000)\n"
            "  --optimizer sgd|adamw  (adamw)\n"
            "  --lr X               peak learning rate (adamw 3e-3, sgd 0.1)\n"
            "  --schedule cosine|constant  cosine: warmup, then decay to lr/10 at --steps;\n"
            "                       constant: warmup, then lr (adamw cosine, sgd constant)\n"
            "  --warmup N           warmup steps, lr rising linearly from 0 (cosine: steps/10+1,\n"
            "                       constant: 0)\n"
            "  --weight-decay X     adamw: decoupled (0.01); sgd: added to the gradient (0)\n"
            "  --beta1 X --beta2 X --eps X   adamw moments (0.9, 0.999, 1e-8)\n"
            "  --clip X             clip the global gradient norm at X, 0 for none (adamw 1, sgd 0)\n"
            "  --zero on|off        shard the optimizer state and the update over the axes each\n"
            "                       parameter is replicated over (ZeRO-1/2) (off)\n"
            "  --save DIR           write a sharded checkpoint to DIR at the end\n"
            "  --save-every N       and every N steps (0: only at the end)\n"
            "  --keep K             keep the newest K checkpoints in DIR, 0 for all (0)\n"
            "  --resume DIR         continue from DIR's latest checkpoint, on any mesh, to\n"
            "                       step --steps\n"
            "  --init FILE          start the GPT from GPT-2 weights: Hugging Face safetensors or\n"
            "                       an llm.c checkpoint; the shape is the file's (shape flags may\n"
            "                       only repeat it; heads: the file, config.json beside it, or\n"
            "                       dim/64); --seq at most its context (default 40 or the context)\n"
            "  --data-order shuffled|sequential  token shards: sampled windows, or windows\n"
            "                       one after another in file order as llm.c reads them\n"
            "                       (shuffled)\n"
            "  --checkpoint on|off  recompute GPT block activations in backward (off)\n"
            "  --eval N             held-out samples scored at the end, at most the held-out\n"
            "                       set's size (256)\n"
            "  --val-every N        validation loss every N steps and at the last (0: off)\n"
            "  --val-batches K      batches of --batch samples per validation (4)\n"
            "  --val-data PATH      validate on PATH's held-out split (same kinds as --data)\n"
            "                       instead of --data's; alone, validates at the last step\n"
            "  --seed N             initialisation and data seed, 0 to 2^64-1 (1)\n"
            "  --copies AXIS        one model per group along mesh axis AXIS, independent\n"
            "                       (a sweep): --seed, --lr, --warmup and --weight-decay then\n"
            "                       take one value or one per copy, comma-separated\n"
            "  --same-data on|off   copies: every copy reads copy 0's batches (off)\n"
            "  --threads N          compute threads in all, per process under mpirun (every\n"
            "                       core; under mpirun, the host's cores / its processes)\n"
            "  --json FILE          write a JSON report\n"
            "  --log FILE.jsonl     append one JSON object per step (step, loss, lr, grad_norm,\n"
            "                       ms, tokens_per_s)\n"
            "  --plot FILE.svg      draw the loss (and validation loss) and learning rate by\n"
            "                       step at the end (as spmd plot draws a --log file)\n"
            "  --log-every N        output that is not a terminal gets a line every N steps\n"
            "                       (and the first and last); a terminal, one live line (steps/20)\n"
            "  --on-nonfinite stop|continue  a NaN or infinite loss or gradient norm ends\n"
            "                       the run (stop)\n"
            "  --memory-check on|off  refuse a run whose memory need exceeds what the\n"
            "                       machine has available (on)\n"
            "  --blas NAME          GEMM library: auto, openblas, blis or a CBLAS .so path (auto)\n"
            "  --blas-core NAME     OpenBLAS core type, e.g. SkylakeX (fits the CPU)\n",
            command);
}

static void defaults(cli_opts *o)
{
    memset(o, 0, sizeof *o);
    strcpy(o->model, "gpt");
    o->mlp = (spmd_mlp_config){.hidden = 128, .layers = 2};
    o->batch = 32;
    o->steps = 2000;
    o->seed = 1;
    o->mesh = "4x2";
    o->axes = "replica,fsdp";
    /* The GPT's shape and the optimizer's settings stay unset (0, NaN)
     * until every flag is read: their defaults depend on other flags. */
    o->optimizer = (spmd_optimizer){.kind = SPMD_OPTIMIZER_ADAMW, .weight_decay = NAN, .beta1 = NAN,
                                    .beta2 = NAN, .eps = NAN, .clip_norm = NAN};
    o->warmup = -1;
    o->eval_samples = 256;
    o->memory_check = true;
}

/* Integer flags take min..CLI_INT_MAX unless their own range says less. */
#define CLI_INT_MAX 1000000000

typedef enum flag_kind {
    FLAG_INT,   /* an int field of cli_opts, in [min, CLI_INT_MAX] */
    FLAG_TEXT,  /* a const char * field of cli_opts, kept as given */
    FLAG_OTHER  /* parsed by name in set_flag */
} flag_kind;

typedef struct flag_spec {
    const char *name;
    flag_kind kind;
    size_t offset; /* FLAG_INT, FLAG_TEXT: the field in cli_opts */
    int min;       /* FLAG_INT */
    const char *why_min; /* FLAG_INT: why less than min means nothing, or NULL */
} flag_spec;

/* Every flag takes a value, as "--flag value" or "--flag=value".  One
 * table, so an unknown flag is known as such before its value is looked for. */
static const flag_spec flag_specs[] = {
    {"--model", FLAG_OTHER, 0, 0, NULL},
    {"--layers", FLAG_INT, offsetof(cli_opts, gpt.layers), 1,
     "a GPT needs at least one block and an MLP at least one hidden layer"},
    {"--dim", FLAG_INT, offsetof(cli_opts, gpt.dim), 1, NULL},
    {"--heads", FLAG_INT, offsetof(cli_opts, gpt.heads), 1, NULL},
    {"--seq", FLAG_INT, offsetof(cli_opts, gpt.seq), 1, NULL},
    {"--context", FLAG_INT, offsetof(cli_opts, gpt.context), 1, NULL},
    {"--vocab", FLAG_INT, offsetof(cli_opts, gpt.vocab), 2, "one token leaves nothing to predict"},
    {"--hidden", FLAG_INT, offsetof(cli_opts, mlp.hidden), 1, NULL},
    {"--batch", FLAG_INT, offsetof(cli_opts, batch), 1, NULL},
    {"--steps", FLAG_INT, offsetof(cli_opts, steps), 1, NULL},
    {"--threads", FLAG_INT, offsetof(cli_opts, threads), 1, NULL},
    {"--devices", FLAG_INT, offsetof(cli_opts, devices), 1, NULL},
    {"--processes", FLAG_INT, offsetof(cli_opts, processes), 1, NULL},
    {"--eval", FLAG_INT, offsetof(cli_opts, eval_samples), 0, NULL},
    {"--val-every", FLAG_INT, offsetof(cli_opts, val_every), 0, NULL},
    {"--val-batches", FLAG_INT, offsetof(cli_opts, val_batches), 1, NULL},
    {"--val-data", FLAG_TEXT, offsetof(cli_opts, val_data), 0, NULL},
    {"--warmup", FLAG_OTHER, 0, 0, NULL},
    {"--copies", FLAG_TEXT, offsetof(cli_opts, copies), 0, NULL},
    {"--same-data", FLAG_OTHER, 0, 0, NULL},
    {"--zero", FLAG_OTHER, 0, 0, NULL},
    {"--save-every", FLAG_INT, offsetof(cli_opts, save_every), 0, NULL},
    {"--keep", FLAG_INT, offsetof(cli_opts, keep), 0, NULL},
    {"--weight-decay", FLAG_OTHER, 0, 0, NULL},
    {"--beta1", FLAG_OTHER, 0, 0, NULL},
    {"--beta2", FLAG_OTHER, 0, 0, NULL},
    {"--eps", FLAG_OTHER, 0, 0, NULL},
    {"--clip", FLAG_OTHER, 0, 0, NULL},
    {"--net-latency", FLAG_OTHER, 0, 0, NULL},
    {"--net-bandwidth", FLAG_OTHER, 0, 0, NULL},
    {"--schedule", FLAG_OTHER, 0, 0, NULL},
    {"--data-order", FLAG_OTHER, 0, 0, NULL},
    {"--seed", FLAG_OTHER, 0, 0, NULL},
    {"--lr", FLAG_OTHER, 0, 0, NULL},
    {"--optimizer", FLAG_OTHER, 0, 0, NULL},
    {"--checkpoint", FLAG_OTHER, 0, 0, NULL},
    {"--on-nonfinite", FLAG_OTHER, 0, 0, NULL},
    {"--memory-check", FLAG_OTHER, 0, 0, NULL},
    {"--mesh", FLAG_OTHER, 0, 0, NULL},
    {"--axes", FLAG_OTHER, 0, 0, NULL},
    {"--shard", FLAG_OTHER, 0, 0, NULL},
    {"--fsdp", FLAG_TEXT, offsetof(cli_opts, fsdp), 0, NULL},
    {"--tp", FLAG_TEXT, offsetof(cli_opts, tp), 0, NULL},
    {"--sp", FLAG_OTHER, 0, 0, NULL},
    {"--data", FLAG_TEXT, offsetof(cli_opts, data), 0, NULL},
    {"--json", FLAG_TEXT, offsetof(cli_opts, json), 0, NULL},
    {"--log", FLAG_TEXT, offsetof(cli_opts, log), 0, NULL},
    {"--plot", FLAG_TEXT, offsetof(cli_opts, plot), 0, NULL},
    {"--log-every", FLAG_INT, offsetof(cli_opts, log_every), 1, NULL},
    {"--save", FLAG_TEXT, offsetof(cli_opts, save), 0, NULL},
    {"--resume", FLAG_TEXT, offsetof(cli_opts, resume), 0, NULL},
    {"--init", FLAG_TEXT, offsetof(cli_opts, init), 0, NULL},
    {"--blas", FLAG_TEXT, offsetof(cli_opts, blas), 0, NULL},
    {"--blas-core", FLAG_TEXT, offsetof(cli_opts, blas_core), 0, NULL},
};

/* The flag spelled by the first `len` characters of `arg`, or NULL. */
static const flag_spec *find_flag(const char *arg, size_t len)
{
    for (size_t i = 0; i < sizeof flag_specs / sizeof *flag_specs; i++)
        if (strlen(flag_specs[i].name) == len && !strncmp(flag_specs[i].name, arg, len))
            return &flag_specs[i];
    return NULL;
}

static int parse_int(const flag_spec *fs, const char *text, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || *end || end == text || v < fs->min || v > CLI_INT_MAX) {
        bool why = fs->why_min && !errno && !*end && end != text && v < fs->min;
        return cli_fail("%s wants an integer from %d to %d, got '%s'%s%s", fs->name, fs->min,
                        CLI_INT_MAX, text, why ? ": " : "", why ? fs->why_min : "");
    }
    *out = (int)v;
    return 0;
}

/* Any 64-bit unsigned value.  strtoull would wrap "-1" to the largest, so
 * only digits are taken. */
static int parse_u64(const char *flag, const char *text, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (!isdigit((unsigned char)text[0]) || errno || *end)
        return cli_fail("%s wants an integer from 0 to %" PRIu64 ", got '%s'", flag, UINT64_MAX,
                        text);
    *out = (uint64_t)v;
    return 0;
}

/* A finite number in [min, max), or [min, max] when max_included. */
static int parse_float(const char *flag, const char *text, double min, double max,
                       bool max_included, float *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || *end || end == text || !(v >= min) || v > max || (!max_included && v == max))
        return cli_fail("%s wants a number from %g to %g (%s), got '%s'", flag, min, max,
                        max_included ? "included" : "excluded", text);
    *out = (float)v;
    return 0;
}

static int parse_choice(const char *flag, const char *v, const char *a, const char *b, bool *is_b)
{
    if (strcmp(v, a) && strcmp(v, b)) return cli_fail("%s is %s or %s, got '%s'", flag, a, b, v);
    *is_b = !strcmp(v, b);
    return 0;
}

/* --seed, --lr, --warmup or --weight-decay: one value, or a comma-separated list of one
 * per copy; the first is also the run's (copy 0's).  `v` is ours to cut. */
static int parse_copy_list(const char *f, char *v, cli_opts *o)
{
    size_t len = strlen(v);
    if (len && (v[0] == ',' || v[len - 1] == ',' || strstr(v, ",,")))
        return cli_fail("%s '%s' has an empty value in its list", f, v);
    int n = 0;
    char *save = NULL;
    for (char *item = strtok_r(v, ",", &save); item; item = strtok_r(NULL, ",", &save), n++) {
        if (n == CLI_MAX_COPIES) return cli_fail("%s lists more than %d values", f, CLI_MAX_COPIES);
        int rc = 0;
        if (!strcmp(f, "--seed")) {
            rc = parse_u64(f, item, &o->seeds[n]);
        } else if (!strcmp(f, "--weight-decay")) {
            rc = parse_float(f, item, 0, 1e6, true, &o->wds[n]);
        } else if (!strcmp(f, "--lr")) {
            char *end;
            o->lrs[n] = strtof(item, &end);
            if (*end || end == item || !(o->lrs[n] > 0) || !isfinite(o->lrs[n]))
                rc = cli_fail("--lr wants a positive number (or one per copy, comma-separated), "
                              "got '%s'", item);
        } else {
            static const flag_spec warmup = {"--warmup", FLAG_INT, 0, 0, NULL};
            rc = parse_int(&warmup, item, &o->warmups[n]);
        }
        if (rc) return rc;
    }
    if (n == 0) return cli_fail("%s needs a value", f);
    if (!strcmp(f, "--seed")) o->n_seeds = n, o->seed = o->seeds[0];
    else if (!strcmp(f, "--lr")) o->n_lrs = n, o->lr = o->lrs[0];
    else if (!strcmp(f, "--weight-decay")) {
        /* A list is fed each step: the update decays if any copy does. */
        o->n_wds = n;
        o->optimizer.weight_decay = o->wds[0];
        for (int i = 1; i < n; i++)
            if (o->wds[i] > o->optimizer.weight_decay) o->optimizer.weight_decay = o->wds[i];
        o->optimizer.weight_decay_input = n > 1;
    }
    else o->n_warmups = n, o->warmup = o->warmups[0];
    return 0;
}

/* One flag's value into `o`; `v` is argv's, ours to modify. */
static int set_flag(const flag_spec *fs, char *v, cli_opts *o, bool *mesh_given)
{
    char *field = (char *)o + fs->offset;
    if (fs->kind == FLAG_INT) return parse_int(fs, v, (int *)(void *)field);
    if (fs->kind == FLAG_TEXT) {
        *(const char **)(void *)field = v;
        return 0;
    }
    const char *f = fs->name;
    int rc = 0;
    bool b = false;
    if (!strcmp(f, "--model")) {
        rc = parse_choice(f, v, "gpt", "mlp", &b);
        strcpy(o->model, b ? "mlp" : "gpt");
    } else if (!strcmp(f, "--seed") || !strcmp(f, "--lr") || !strcmp(f, "--warmup")) {
        rc = parse_copy_list(f, v, o);
    } else if (!strcmp(f, "--optimizer")) {
        rc = parse_choice(f, v, "adamw", "sgd", &b);
        o->optimizer.kind = b ? SPMD_OPTIMIZER_SGD : SPMD_OPTIMIZER_ADAMW;
    } else if (!strcmp(f, "--weight-decay")) {
        rc = parse_copy_list(f, v, o);
    } else if (!strcmp(f, "--beta1")) {
        rc = parse_float(f, v, 0, 1, false, &o->optimizer.beta1);
    } else if (!strcmp(f, "--beta2")) {
        rc = parse_float(f, v, 0, 1, false, &o->optimizer.beta2);
    } else if (!strcmp(f, "--eps")) {
        rc = parse_float(f, v, 0, 1, true, &o->optimizer.eps);
    } else if (!strcmp(f, "--clip")) {
        rc = parse_float(f, v, 0, 1e30, true, &o->optimizer.clip_norm);
    } else if (!strcmp(f, "--net-latency")) {
        rc = parse_float(f, v, 0, 1e6, false, &o->net_latency_us);
    } else if (!strcmp(f, "--net-bandwidth")) {
        rc = parse_float(f, v, 1e-6f, 1e6, true, &o->net_gbps);
    } else if (!strcmp(f, "--schedule")) {
        rc = parse_choice(f, v, "cosine", "constant", &b);
        o->lr_constant = b;
        o->schedule_given = true;
    } else if (!strcmp(f, "--data-order")) {
        rc = parse_choice(f, v, "shuffled", "sequential", &b);
        o->data_sequential = b;
    } else if (!strcmp(f, "--zero")) {
        rc = parse_choice(f, v, "off", "on", &b);
        o->optimizer.shard_state = b;
    } else if (!strcmp(f, "--sp")) {
        rc = parse_choice(f, v, "off", "on", &b);
        o->sp = b;
    } else if (!strcmp(f, "--same-data")) {
        rc = parse_choice(f, v, "off", "on", &b);
        o->same_data = b;
    } else if (!strcmp(f, "--checkpoint")) {
        rc = parse_choice(f, v, "off", "on", &b);
        o->checkpoint = b;
    } else if (!strcmp(f, "--on-nonfinite")) {
        rc = parse_choice(f, v, "stop", "continue", &b);
        o->keep_nonfinite = b;
    } else if (!strcmp(f, "--memory-check")) {
        rc = parse_choice(f, v, "off", "on", &b);
        o->memory_check = b;
    } else if (!strcmp(f, "--mesh")) {
        o->mesh = v, *mesh_given = true;
    } else if (!strcmp(f, "--axes")) {
        o->axes = v, *mesh_given = true;
    } else if (!strcmp(f, "--shard")) {
        char *eq = strchr(v, '=');
        if (!eq || eq == v) return cli_fail("--shard wants PATTERN=SPEC, got '%s'", v);
        if (o->n_shards == CLI_MAX_SHARDS) return cli_fail("more than %d --shard rules", CLI_MAX_SHARDS);
        *eq = '\0'; /* split in place */
        o->shards[o->n_shards++] = (cli_shard){v, eq + 1};
    }
    return rc;
}

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
        if (!adamw && !isnan(*moments[i]))
            return cli_fail("%s is an AdamW setting; --optimizer sgd takes --lr, --weight-decay "
                            "and --clip", names[i]);
        if (isnan(*moments[i])) *moments[i] = adamw ? adam[i] : 0.0f;
    }
    if (isnan(opt->weight_decay)) opt->weight_decay = adamw ? 0.01f : 0.0f;
    if (isnan(opt->clip_norm)) opt->clip_norm = adamw ? 1.0f : 0.0f;
    if (!o->schedule_given) o->lr_constant = !adamw;
    if (o->warmup < 0) o->warmup = o->lr_constant ? 0 : o->steps / 10 + 1;
    if (!o->lr) o->lr = adamw ? 3e-3f : 0.1f;
    return 0;
}

int cli_parse(int argc, char **argv, const char *command, cli_opts *o)
{
    defaults(o);
    bool mesh_given = false;
    int rc;
    for (int i = 0; i < argc; i++) {
        char *arg = argv[i];
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
            cli_usage(stdout, command);
            return -1;
        }
        if (arg[0] != '-')
            return cli_fail("unexpected argument '%s': spmd %s takes only flags (--help lists "
                            "them)", arg, command);
        char *eq = strchr(arg, '=');
        size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
        const flag_spec *fs = find_flag(arg, len);
        if (!fs) {
            cli_usage(stderr, command);
            return cli_fail("unknown flag '%.*s'", (int)len, arg);
        }
        char *v = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
        if (!v) return cli_fail("%s needs a value", fs->name);
        rc = set_flag(fs, v, o, &mesh_given);
        if (rc) return rc;
    }
    if (o->init && (rc = cli_init_config(o))) return rc;
    if (!o->gpt.seq) o->gpt.seq = 40;
    if (!o->gpt.layers) o->gpt.layers = 2;
    if (!o->gpt.heads) o->gpt.heads = 4;
    if (!o->gpt.dim) o->gpt.dim = 96;
    o->mlp.layers = o->gpt.layers; /* --layers is either model's depth */
    rc = optimizer_defaults(o);
    if (rc) return rc;
    /* Asked for in any way, validation reads --val-batches batches (4). */
    if ((o->val_every || o->val_data) && !o->val_batches) o->val_batches = 4;
    if ((o->save_every || o->keep) && !o->save)
        return cli_fail("%s says how to save, but there is no --save DIR",
                        o->save_every ? "--save-every" : "--keep");
    /* Under mpirun the processes are its own. */
    int procs = cli_processes();
    if (procs > 1 && o->processes && o->processes != procs)
        return cli_fail("--processes %d, but mpirun started %d processes", o->processes, procs);
    if (procs > 1) o->processes = procs;
    /* --devices N alone: a mesh of N devices along one 'data' axis. */
    static char devices_text[16];
    if (o->devices && !mesh_given) {
        snprintf(devices_text, sizeof devices_text, "%d", o->devices);
        o->mesh = devices_text;
        o->axes = "data";
    }
    return 0;
}

/* ---- Marks ------------------------------------------------------------------ */

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

static bool rule_fits(const cli_shard *r, const spmd_tensor *t)
{
    const char *name = spmd_tensor_name(t);
    return name && fnmatch(r->pattern, name, 0) == 0 && spec_entries(r->spec) == spmd_tensor_rank(t);
}

int cli_apply_marks(const cli_opts *o, spmd_mesh *mesh, cli_graph *c)
{
    for (int i = 0; i < spmd_graph_tensor_count(c->g); i++) {
        spmd_tensor *t = spmd_graph_tensor(c->g, i);
        int rule = -1;
        for (int r = 0; r < o->n_shards; r++)
            if (rule_fits(&o->shards[r], t)) rule = r;
        if (rule >= 0 && spmd_mark_sharding(c->g, t, mesh, o->shards[rule].spec) != SPMD_OK)
            return cli_fail("--shard '%s=%s': %s", o->shards[rule].pattern, o->shards[rule].spec,
                            spmd_last_error());
    }
    for (int r = 0; r < o->n_shards; r++) {
        bool any = false;
        for (int i = 0; i < spmd_graph_tensor_count(c->g) && !any; i++)
            any = rule_fits(&o->shards[r], spmd_graph_tensor(c->g, i));
        if (!any)
            return cli_fail("--shard '%s=%s' fits no tensor: no name matches with a rank of %d",
                            o->shards[r].pattern, o->shards[r].spec, spec_entries(o->shards[r].spec));
    }
    const char *fsdp = o->fsdp;
    if (!fsdp) { /* FSDPv2's convention: the axis named fsdp, if any */
        fsdp = "none";
        for (int a = 0; a < spmd_mesh_rank(mesh); a++)
            if (!strcmp(spmd_mesh_axis_name(mesh, a), "fsdp")) fsdp = "fsdp";
    }
    spmd_tensor *inputs[2] = {c->input, c->targets};
    int n = c->targets ? 2 : 1;
    spmd_status st;
    /* Tensor parallelism marks its weights and the batch (off its axis)
     * first; FSDP then splits the other parameters. */
    if (o->tp) {
        if (strcmp(o->model, "gpt")) return cli_fail("--tp: tensor parallelism is for --model gpt");
        spmd_gpt_parallel how = {o->tp, strcmp(fsdp, "none") ? fsdp : NULL, NULL, o->sp};
        if (spmd_gpt_shard_tensor_parallel(c->g, &o->gpt, mesh, &how) != SPMD_OK)
            return cli_fail("--tp %s: %s", o->tp, spmd_last_error());
    } else if (o->sp) {
        return cli_fail("--sp on: sequence parallelism splits over the tensor axis: give --tp AXIS");
    }
    /* FSDP shards the parameters and the batch; without it, only the batch. */
    if (strcmp(fsdp, "none")) st = spmd_fsdp_wrap(c->g, mesh, fsdp, inputs, n, NULL);
    else st = spmd_shard_batch(c->g, mesh, inputs, n, NULL);
    if (st != SPMD_OK) return cli_fail("sharding with --fsdp %s: %s", fsdp, spmd_last_error());
    /* Copies need the mesh on the graph even where nothing is split (each
     * copy on one device): the input marked whole does it. */
    if (spmd_mesh_copies(mesh) > 1 && !spmd_get_sharding(c->input, (char[256]){0}, 256)[0]) {
        char whole[8 * SPMD_MAX_RANK] = "";
        for (int d = 0; d < spmd_tensor_rank(c->input); d++) strcat(whole, d ? ", None" : "None");
        if (spmd_mark_sharding(c->g, c->input, mesh, whole) != SPMD_OK)
            return cli_fail("--copies: %s", spmd_last_error());
    }
    return 0;
}

/* ---- Model ---------------------------------------------------------------------- */

/* The model for `batch` rows of the data: a GPT over sequences, or an MLP
 * reading a one-hot token and predicting the next (a bigram model). */
static int build_graph(const cli_opts *o, const cli_model *m, cli_graph *c)
{
    c->g = spmd_graph_create(NULL);
    if (!c->g) return cli_fail("%s", spmd_last_error());
    spmd_status st;
    if (!strcmp(o->model, "gpt")) {
        spmd_gpt_tensors t;
        st = spmd_gpt_build(c->g, &o->gpt, o->batch, &t);
        c->input = t.input, c->targets = t.targets, c->loss = t.loss, c->logits = t.logits;
    } else {
        spmd_mlp_config cfg = o->mlp;
        cfg.in_dim = cfg.out_dim = o->gpt.vocab;
        spmd_mlp_tensors t;
        st = spmd_mlp_build(c->g, &cfg, NULL, o->batch * o->gpt.seq, &t);
        if (st == SPMD_OK) st = spmd_mlp_add_loss(c->g, SPMD_MLP_CROSS_ENTROPY, &t);
        c->input = t.input, c->targets = t.targets, c->loss = t.loss, c->logits = t.output;
    }
    if (st != SPMD_OK) return cli_fail("cannot build the model: %s", spmd_last_error());
    if (m->mesh) {
        int rc = cli_apply_marks(o, m->mesh, c);
        if (rc) return rc;
    }
    if (spmd_graph_mark_output(c->g, c->loss) != SPMD_OK) return cli_fail("%s", spmd_last_error());
    return 0;
}

/* Backward (checkpointing each GPT block if asked) and the optimizer. */
static int add_training(const cli_opts *o, cli_model *m)
{
    cli_graph *c = &m->train;
    spmd_status st;
    if (o->checkpoint && !strcmp(o->model, "gpt")) {
        spmd_tensor *cuts[256];
        int n = 0;
        for (int i = 0; i < o->gpt.layers && n < 256; i++) {
            char name[32];
            snprintf(name, sizeof name, "h.%d.out", i);
            if ((cuts[n] = spmd_graph_find(c->g, name))) n++;
        }
        st = spmd_grad_checkpointed(c->g, c->loss, cuts, n);
    } else {
        st = spmd_grad(c->g, c->loss);
    }
    if (st == SPMD_OK) st = spmd_optimizer_apply(c->g, &o->optimizer, &m->opt);
    if (st != SPMD_OK) return cli_fail("cannot build the training step: %s", spmd_last_error());
    return 0;
}

/* The network's figures, which price the axes that cross processes: the
 * flags', else measured when mpirun started several processes, else the
 * mesh's default. */
static int set_network(const cli_opts *o, cli_model *m)
{
    double latency = 0, bandwidth = 0;
    spmd_mesh_network(m->mesh, &latency, &bandwidth);
    m->network_source = "assumed";
    if (cli_processes() > 1) {
        if (cli_measure_network(&latency, &bandwidth)) return 1;
        m->network_source = "measured";
    }
    if (o->net_latency_us || o->net_gbps) m->network_source = "given";
    if (o->net_latency_us) latency = o->net_latency_us * 1e-6;
    if (o->net_gbps) bandwidth = o->net_gbps * 1e9;
    if (bandwidth <= 0) { /* a measurement too quick to tell: keep the default */
        m->network_source = "assumed";
        return 0;
    }
    if (spmd_mesh_set_network(m->mesh, latency, bandwidth) != SPMD_OK)
        return cli_fail("the network's figures: %s", spmd_last_error());
    return 0;
}

int cli_build(const cli_opts *o_in, cli_model *m)
{
    memset(m, 0, sizeof *m);
    cli_opts o = *o_in;
    if ((int64_t)o.batch * o.gpt.seq > INT_MAX / 64)
        return cli_fail("--batch %d x --seq %d is too many tokens per step (at most %d)", o.batch,
                        o.gpt.seq, INT_MAX / 64);
    m->data = spmd_dataset_open(o.data, o.gpt.seq, o.seed);
    if (!m->data) return cli_fail("--data %s: %s", o.data ? o.data : "arith", spmd_last_error());
    if (o.data_sequential && spmd_dataset_set_order(m->data, SPMD_DATA_SEQUENTIAL) != SPMD_OK)
        return cli_fail("--data-order sequential: %s", spmd_last_error());
    if (!o.gpt.vocab) o.gpt.vocab = spmd_dataset_vocab(m->data);
    if (spmd_dataset_check_vocab(m->data, o.gpt.vocab) != SPMD_OK) {
        if (o.init)
            return cli_fail("--init %s: its vocabulary of %d: %s", o.init, o.gpt.vocab, spmd_last_error());
        return cli_fail("--vocab %d: %s", o.gpt.vocab, spmd_last_error());
    }
    m->mesh = spmd_mesh_parse(o.mesh, o.axes);
    if (!m->mesh) return cli_fail("--mesh %s --axes %s: %s", o.mesh, o.axes, spmd_last_error());
    if (o.devices && o.devices != spmd_mesh_devices(m->mesh))
        return cli_fail("--devices %d but the mesh %s has %d devices", o.devices, o.mesh,
                        spmd_mesh_devices(m->mesh));
    int rc = cli_setup_copies(&o, m);
    if (rc) return rc;
    if (o.processes > 1 && spmd_mesh_place_processes(m->mesh, o.processes) != SPMD_OK)
        return cli_fail("%s %d: %s", cli_processes() > 1 ? "mpirun -n" : "--processes",
                        o.processes, spmd_last_error());
    rc = set_network(&o, m);
    if (rc) return rc;
    if (spmd_mesh_devices(m->mesh) == 1 && o.n_shards == 0 && !o.copies) {
        spmd_mesh_free(m->mesh); /* one device, nothing to partition */
        m->mesh = NULL;
    }
    m->gpt = o.gpt;
    rc = build_graph(&o, m, &m->train);
    if (rc) return rc;
    bool gpt = !strcmp(o.model, "gpt");
    m->params = gpt ? spmd_gpt_param_count(&o.gpt) : spmd_graph_param_count(m->train.g);
    m->tokens_per_step = (int64_t)o.batch * o.gpt.seq;
    /* Forward + backward: 6 flops per parameter per token for the weights
     * that multiply (not the position table, which is only added), plus
     * attention's 12 * layers * dim * seq per token (as nanoGPT counts). */
    double mults = (double)m->params, attn = 0;
    if (gpt) {
        mults -= (double)(o.gpt.context ? o.gpt.context : o.gpt.seq) * o.gpt.dim;
        attn = 12.0 * o.gpt.layers * o.gpt.dim * o.gpt.seq;
    }
    m->flops_per_step = (6.0 * mults + attn) * (double)m->tokens_per_step;
    /* Copies each run a batch of their own: the step does their work. */
    m->tokens_per_step *= m->copies;
    m->flops_per_step *= m->copies;
    rc = add_training(&o, m);
    if (rc) return rc;
    if (o.val_data) {
        m->val_data = spmd_dataset_open(o.val_data, o.gpt.seq, o.seed);
        if (!m->val_data) return cli_fail("--val-data %s: %s", o.val_data, spmd_last_error());
        if (spmd_dataset_check_vocab(m->val_data, o.gpt.vocab) != SPMD_OK)
            return cli_fail("--val-data %s: %s", o.val_data, spmd_last_error());
    }
    /* One forward-only program serves the accuracy and the validation
     * loss: logits for the one, the loss for the other. */
    m->accuracy = spmd_dataset_has_accuracy(m->data) && o.eval_samples > 0;
    if (m->accuracy || cli_validates(&o)) {
        rc = build_graph(&o, m, &m->eval);
        if (!rc && m->accuracy && spmd_graph_mark_output(m->eval.g, m->eval.logits) != SPMD_OK)
            rc = cli_fail("%s", spmd_last_error());
        if (!rc && spmd_graph_mark_output(m->eval.g, m->eval.loss) != SPMD_OK)
            rc = cli_fail("%s", spmd_last_error());
    }
    return rc;
}

void cli_model_free(cli_model *m)
{
    spmd_graph_free(m->train.g);
    spmd_graph_free(m->eval.g);
    spmd_mesh_free(m->mesh);
    spmd_dataset_free(m->data);
    spmd_dataset_free(m->val_data);
    cli_free_copies(m);
    memset(m, 0, sizeof *m);
}

spmd_program *cli_compile(const cli_opts *o, spmd_graph *g, bool plan_only)
{
    /* A plan (explain) needs no GEMM library: load it only to run. */
    static bool blas_chosen;
    if (!plan_only && !blas_chosen && spmd_blas_select(o->blas, o->blas_core) != SPMD_OK) {
        cli_fail("%s", spmd_last_error());
        return NULL;
    }
    if (!plan_only) blas_chosen = true;
    /* Processes on one host share its cores: each takes its share. */
    int threads = o->threads;
    if (!threads && cli_processes_here() > 1) {
        threads = (int)sysconf(_SC_NPROCESSORS_ONLN) / cli_processes_here();
        if (threads < 1) threads = 1;
    }
    spmd_compile_options copt = {.threads = threads, .seed = o->seed, .plan_only = plan_only,
                                 .mpi_comm = plan_only ? NULL : cli_mpi_comm(),
                                 .copy_seeds = cli_copy_seeds(o)};
    spmd_program *p = spmd_compile(g, &copt);
    if (!p) cli_fail("cannot compile: %s", spmd_last_error());
    return p;
}

/* A "Key:  123 kB" line of a /proc file, in bytes; -1 when absent. */
static double proc_bytes(const char *file, const char *key)
{
    FILE *f = fopen(file, "r");
    if (!f) return -1;
    char line[256];
    size_t n = strlen(key);
    double v = -1;
    while (v < 0 && fgets(line, sizeof line, f))
        if (!strncmp(line, key, n) && line[n] == ':') v = strtod(line + n + 1, NULL) * 1024;
    fclose(f);
    return v;
}

static const char *mem_text(double bytes, char *buf, size_t size)
{
    if (bytes >= 1024.0 * 1024 * 1024) snprintf(buf, size, "%.1f GiB", bytes / (1024.0 * 1024 * 1024));
    else snprintf(buf, size, "%.0f MiB", bytes / (1024.0 * 1024));
    return buf;
}

/* Address space a run maps beyond its plan: a stack per compute thread
 * and OpenBLAS's GEMM buffer.  Little of it is touched, but RLIMIT_AS
 * counts it all. */
#define THREAD_STACK_BYTES (8.0 * 1024 * 1024)
#define GEMM_BUFFER_BYTES (128.0 * 1024 * 1024)

int cli_check_memory(const cli_opts *o, const cli_model *m)
{
    /* Plan-only programs allocate nothing: the figure comes before the
     * memory, not after the kernel has killed the run. */
    spmd_program *train = cli_compile(o, m->train.g, true);
    spmd_program *eval = train && m->eval.g ? cli_compile(o, m->eval.g, true) : NULL;
    if (!train || (m->eval.g && !eval)) {
        spmd_program_free(train);
        return 1;
    }
    /* This process runs its share of the devices. */
    int devices = spmd_program_devices(train) / (o->processes > 1 ? o->processes : 1);
    double per_device = (double)spmd_program_peak_bytes(train) + (eval ? (double)spmd_program_peak_bytes(eval) : 0);
    spmd_program_free(train);
    spmd_program_free(eval);
    /* The tool's own buffers: token ids, targets and score mask, and the
     * one-hot inputs and held-out logits of batch x seq x vocab floats. */
    double tokens = (double)o->batch * o->gpt.seq;
    double vocab = (double)spmd_tensor_dim(m->train.logits, spmd_tensor_rank(m->train.logits) - 1);
    double need = per_device * devices + tokens * (9.0 + 8.0 * vocab);
    char a[32], b[32], c[32];

    double avail = proc_bytes("/proc/meminfo", "MemAvailable");
    if (avail >= 0 && need > avail)
        return cli_fail("not enough memory: this run needs about %s (%s per device x %d devices, plus "
                        "input buffers) and this machine has %s available; try a bigger mesh, "
                        "--checkpoint on, or a smaller --batch or --seq (--memory-check off runs it "
                        "anyway)",
                        mem_text(need, a, sizeof a), mem_text(per_device, b, sizeof b), devices,
                        mem_text(avail, c, sizeof c));

    struct rlimit limit;
    if (getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return 0;
    /* Each device gets its share of the compute threads, at least one (as
     * the compiler splits them). */
    long threads = o->threads ? o->threads : sysconf(_SC_NPROCESSORS_ONLN);
    long per = threads / devices < 1 ? 1 : threads / devices > 256 ? 256 : threads / devices;
    double workers = (double)per * devices;
    double mapped = need + workers * THREAD_STACK_BYTES + GEMM_BUFFER_BYTES;
    /* What is mapped already counts against the limit too. */
    double room = fmax(0, (double)limit.rlim_cur - fmax(0, proc_bytes("/proc/self/status", "VmSize")));
    if (mapped <= room) return 0;
    return cli_fail("not enough address space: this run maps about %s (%s per device x %d devices, "
                    "plus input buffers, %.0f thread stacks and a GEMM buffer) and the address-space "
                    "limit (ulimit -v) leaves %s; raise the limit, or try a bigger mesh, "
                    "--checkpoint on, or a smaller --batch or --seq (--memory-check off runs it "
                    "anyway)",
                    mem_text(mapped, a, sizeof a), mem_text(per_device, b, sizeof b), devices, workers,
                    mem_text(room, c, sizeof c));
}

size_t cli_param_bytes(const spmd_program *p)
{
    /* Gradients are resolved onto their parameter's sharding: one more
     * copy of the parameter bytes. */
    return spmd_program_persistent_bytes(p) + spmd_program_param_bytes(p);
}

/* ---- Data and evaluation ----------------------------------------------------------- */

/* The samples of the batch whose rows this process's devices hold: all of
 * them in one process, a share of them over several.  A GPT's rows are
 * samples; the MLP's are tokens, seq to a sample. */
static int local_samples(const cli_opts *o, const cli_graph *c, const spmd_program *p,
                         int64_t *begin, int64_t *end)
{
    int64_t lo = 0, hi = 0, lo2 = 0, hi2 = 0;
    if (spmd_program_input_rows(p, c->input, &lo, &hi) != SPMD_OK ||
        spmd_program_input_rows(p, c->targets, &lo2, &hi2) != SPMD_OK)
        return cli_fail("cannot place the inputs: %s", spmd_last_error());
    if (hi2 > lo2) { /* both inputs' rows */
        if (hi <= lo) lo = lo2, hi = hi2;
        if (lo2 < lo) lo = lo2;
        if (hi2 > hi) hi = hi2;
    }
    int seq = !strcmp(o->model, "gpt") ? 1 : o->gpt.seq;
    *begin = lo / seq;
    *end = (hi + seq - 1) / seq;
    return 0;
}

/* Samples [first, first + batch) of a split into a graph's inputs, of
 * copy `copy` (CLI_EVERY_COPY: of every copy): only those this process's
 * devices hold are read. */
enum { CLI_EVERY_COPY = -1 };

static spmd_status set_input_of(spmd_program *p, int copy, const spmd_tensor *t,
                                const void *data, size_t bytes)
{
    if (copy == CLI_EVERY_COPY) return spmd_program_set_input(p, t, data, bytes);
    return spmd_program_set_input_copy(p, copy, t, data, bytes);
}

static int feed_split(const cli_opts *o, spmd_dataset *data, const cli_graph *c, spmd_program *p,
                      int copy, spmd_split split, int64_t first, int32_t *tok, int32_t *tgt)
{
    int seq = o->gpt.seq, v = spmd_tensor_dim(c->logits, spmd_tensor_rank(c->logits) - 1);
    size_t ntok = (size_t)o->batch * (size_t)seq;
    int64_t s0 = 0, s1 = 0;
    int rc = local_samples(o, c, p, &s0, &s1);
    if (rc) return rc;
    if (s1 > s0 && spmd_dataset_batch(data, split, first + s0, s1 - s0, tok + s0 * seq,
                                      tgt + s0 * seq) != SPMD_OK)
        return cli_fail("data: %s", spmd_last_error());
    spmd_status st;
    if (!strcmp(o->model, "gpt")) {
        st = set_input_of(p, copy, c->input, tok, ntok * sizeof *tok);
    } else {
        float *onehot = calloc(ntok * (size_t)v, sizeof *onehot);
        if (!onehot) return cli_fail("out of memory");
        for (size_t i = (size_t)(s0 * seq); i < (size_t)(s1 * seq); i++)
            onehot[i * (size_t)v + (size_t)tok[i]] = 1.0f;
        st = set_input_of(p, copy, c->input, onehot, ntok * (size_t)v * sizeof *onehot);
        free(onehot);
    }
    if (st == SPMD_OK) st = set_input_of(p, copy, c->targets, tgt, ntok * sizeof *tgt);
    if (st != SPMD_OK) return cli_fail("cannot feed the inputs: %s", spmd_last_error());
    return 0;
}

float cli_lr(const cli_opts *o, int step) { return cli_lr_of(o, 0, step); }

/* SPMD_TEST_BAD_TOKEN=PROCESS:STEP feeds process PROCESS a GPT token id
 * outside the vocabulary at step STEP (from 1), in its first row: its
 * step fails in the embedding, as a corrupt shard would make it, while
 * the other processes wait in a collective.  For the tests of failures
 * over processes (test_cli_mpi). */
static int feed_test_bad_token(const cli_opts *o, const cli_model *m, spmd_program *p, int step)
{
    const char *hook = getenv("SPMD_TEST_BAD_TOKEN");
    int proc = -1, at = -1;
    if (!hook || sscanf(hook, "%d:%d", &proc, &at) != 2) return 0;
    if (proc != cli_process_rank() || at != step + 1 || strcmp(o->model, "gpt")) return 0;
    int64_t s0 = 0, s1 = 0;
    int rc = local_samples(o, &m->train, p, &s0, &s1);
    size_t ntok = (size_t)o->batch * (size_t)o->gpt.seq;
    int32_t *tok = rc ? NULL : calloc(ntok, sizeof *tok);
    if (!tok) return rc ? rc : cli_fail("out of memory");
    tok[s0 * o->gpt.seq] = m->gpt.vocab + 7;
    if (spmd_program_set_input(p, m->train.input, tok, ntok * sizeof *tok) != SPMD_OK)
        rc = cli_fail("cannot feed the inputs: %s", spmd_last_error());
    free(tok);
    return rc;
}

int cli_feed(const cli_opts *o, const cli_model *m, spmd_program *p, int step, int64_t first)
{
    size_t ntok = (size_t)o->batch * (size_t)o->gpt.seq;
    int32_t *tok = malloc(ntok * sizeof *tok), *tgt = malloc(ntok * sizeof *tgt);
    int rc = tok && tgt ? 0 : cli_fail("out of memory");
    /* Each copy its own batch and learning rate. */
    for (int c = 0; !rc && c < m->copies; c++) {
        rc = feed_split(o, cli_copy_data(m, c), &m->train, p, c, SPMD_SPLIT_TRAIN, first, tok, tgt);
        float lr = cli_lr_of(o, c, step), wd = cli_copy_weight_decay(o, c);
        if (!rc && spmd_program_set_input_copy(p, c, m->opt.lr, &lr, sizeof lr) != SPMD_OK)
            rc = cli_fail("cannot feed the learning rate: %s", spmd_last_error());
        if (!rc && m->opt.weight_decay &&
            spmd_program_set_input_copy(p, c, m->opt.weight_decay, &wd, sizeof wd) != SPMD_OK)
            rc = cli_fail("cannot feed the weight decay: %s", spmd_last_error());
    }
    free(tok), free(tgt);
    if (!rc) rc = feed_test_bad_token(o, m, p, step);
    return rc;
}

/* Copy every parameter of copy `copy` of the training program into the
 * evaluation one. */
static int copy_params(const cli_model *m, const spmd_program *train, spmd_program *eval, int copy)
{
    for (int i = 0; i < spmd_graph_tensor_count(m->eval.g); i++) {
        spmd_tensor *t = spmd_graph_tensor(m->eval.g, i);
        if (!spmd_tensor_is_param(t)) continue;
        spmd_tensor *src = spmd_graph_find(m->train.g, spmd_tensor_name(t));
        size_t bytes = (size_t)spmd_tensor_numel(t) * sizeof(float);
        float *buf = malloc(bytes);
        spmd_status st = buf ? spmd_program_read_copy(train, copy, src, buf, bytes) : SPMD_ERR_NOMEM;
        if (st == SPMD_OK) st = spmd_program_write_copy(eval, copy, t, buf, bytes);
        free(buf);
        if (st != SPMD_OK) return cli_fail("evaluation: %s", spmd_last_error());
    }
    return 0;
}

void cli_cap_eval(cli_opts *o, const cli_model *m)
{
    int64_t size = spmd_dataset_heldout_size(m->data);
    if (!m->accuracy || o->eval_samples <= size) return;
    printf("--eval %d: the held-out set has %lld samples; scoring all of them\n", o->eval_samples,
           (long long)size);
    o->eval_samples = (int)size;
}

double cli_accuracy(const cli_opts *o, const cli_model *m, const spmd_program *train,
                    spmd_program *eval, int copy)
{
    if (!m->accuracy || !eval || copy_params(m, train, eval, copy)) return -1;
    spmd_dataset *data = cli_copy_data(m, copy);
    int v = (int)spmd_tensor_dim(m->eval.logits, spmd_tensor_rank(m->eval.logits) - 1);
    size_t ntok = (size_t)o->batch * (size_t)o->gpt.seq;
    int32_t *tok = malloc(ntok * sizeof *tok), *tgt = malloc(ntok * sizeof *tgt);
    uint8_t *mask = malloc(ntok);
    float *logits = malloc(ntok * (size_t)v * sizeof *logits);
    int64_t right = 0, scored = 0;
    bool ok = tok && tgt && mask && logits;
    for (int64_t first = 0; ok && first < o->eval_samples; first += o->batch) {
        /* Every copy's inputs: the program runs every copy, and one whose
         * inputs were never set refuses to run; only `copy`'s is read. */
        ok = !feed_split(o, data, &m->eval, eval, CLI_EVERY_COPY, SPMD_SPLIT_HELDOUT, first, tok,
                         tgt) &&
             /* Every process scores the whole batch: it needs every target. */
             (cli_processes() == 1 ||
              spmd_dataset_batch(data, SPMD_SPLIT_HELDOUT, first, o->batch, tok, tgt) == SPMD_OK) &&
             spmd_dataset_score_mask(data, SPMD_SPLIT_HELDOUT, first, o->batch, mask) == SPMD_OK &&
             spmd_program_run(eval) == SPMD_OK &&
             spmd_program_read_copy(eval, copy, m->eval.logits, logits,
                                    ntok * (size_t)v * sizeof *logits) == SPMD_OK;
        for (size_t i = 0; ok && i < ntok; i++) {
            /* Score exactly eval_samples samples, even mid-batch. */
            if (!mask[i] || first + (int64_t)(i / (size_t)o->gpt.seq) >= o->eval_samples) continue;
            const float *row = logits + i * (size_t)v;
            int best = 0;
            for (int k = 1; k < v; k++)
                if (row[k] > row[best]) best = k;
            right += best == tgt[i];
            scored++;
        }
    }
    if (!ok) cli_fail("evaluation: %s", spmd_last_error());
    free(tok), free(tgt), free(mask), free(logits);
    return ok && scored ? (double)right / (double)scored : -1;
}

/* ---- Validation ----------------------------------------------------------------------- */

bool cli_validates(const cli_opts *o) { return o->val_batches > 0; }

bool cli_validates_at(const cli_opts *o, int done, int steps)
{
    return cli_validates(o) && (done == steps || (o->val_every && done % o->val_every == 0));
}

int cli_val_loss(const cli_opts *o, const cli_model *m, const spmd_program *train,
                 spmd_program *eval, int copy, double *loss)
{
    if (!cli_validates(o) || !eval) return cli_fail("validation: no forward program");
    if (copy_params(m, train, eval, copy)) return 1;
    spmd_dataset *data = m->val_data ? m->val_data : cli_copy_data(m, copy);
    size_t ntok = (size_t)o->batch * (size_t)o->gpt.seq;
    int32_t *tok = malloc(ntok * sizeof *tok), *tgt = malloc(ntok * sizeof *tgt);
    double sum = 0;
    int rc = tok && tgt ? 0 : cli_fail("out of memory");
    /* The same batches every time: the held-out split's first ones. */
    for (int k = 0; !rc && k < o->val_batches; k++) {
        float batch_loss = 0;
        /* Every copy's inputs, as for the accuracy. */
        rc = feed_split(o, data, &m->eval, eval, CLI_EVERY_COPY, SPMD_SPLIT_HELDOUT,
                        (int64_t)k * o->batch, tok, tgt);
        if (!rc && (spmd_program_run(eval) != SPMD_OK ||
                    spmd_program_read_copy(eval, copy, m->eval.loss, &batch_loss,
                                           sizeof batch_loss) != SPMD_OK))
            rc = cli_fail("validation: %s", spmd_last_error());
        sum += batch_loss;
    }
    free(tok), free(tgt);
    *loss = sum / o->val_batches;
    return rc;
}
