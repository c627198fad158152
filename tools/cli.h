/*
 * The `spmd` tool's shared pieces: flags (one struct for train and
 * explain), building the model with its marks, and messages.
 */
#ifndef SPMD_TOOLS_CLI_H
#define SPMD_TOOLS_CLI_H

#include "spmd/checkpoint.h"
#include "spmd/data.h"
#include "spmd/mesh.h"
#include "spmd/models.h"
#include "spmd/spmd.h"
#include "spmd/train.h"

#include <stdio.h>

#define CLI_MAX_SHARDS 64
/* Values a per-copy list (--seed, --lr, --warmup) may hold. */
#define CLI_MAX_COPIES 64
/* Room for a path the tool builds (a copy's checkpoint directory). */
#define CLI_PATH_MAX 4096

typedef struct cli_shard {
    const char *pattern; /* glob over tensor names */
    const char *spec;
} cli_shard;

typedef struct cli_opts {
    char model[8]; /* "gpt" or "mlp" */
    spmd_gpt_config gpt;
    spmd_mlp_config mlp;
    int batch, steps, threads, devices;
    int processes;     /* explain: plan for this many processes; under mpirun, its -n */
    float net_latency_us, net_gbps; /* the network's figures; 0: measured under mpirun, or assumed */
    float lr;          /* 0: the optimizer's default */
    uint64_t seed;     /* copy 0's, as lr and warmup: the lists below give each copy's */
    const char *mesh;  /* "4x2" */
    const char *axes;  /* "replica,fsdp" */
    const char *fsdp;  /* axis, "none", or NULL: "fsdp" when the mesh has it */
    const char *tp;    /* --tp: the GPT's tensor-parallel axis, NULL: none */
    bool sp;           /* --sp: sequence parallelism on that axis */
    const char *data;  /* NULL: the synthetic addition set */
    spmd_optimizer optimizer;
    bool lr_constant;  /* --schedule constant (default for sgd) */
    bool schedule_given;
    int warmup;        /* warmup steps; -1: steps / 10 + 1 with cosine, 0 constant */
    bool data_sequential; /* --data-order sequential */
    const char *save;  /* --save DIR: checkpoint at the end (and every save_every) */
    int save_every;    /* 0: only at the end */
    int keep;          /* checkpoints kept in --save DIR; 0 keeps all */
    const char *resume; /* --resume DIR: continue from its latest checkpoint */
    const char *init;  /* --init FILE: GPT-2 weights to start from (weights.c) */
    bool checkpoint;   /* recompute each GPT block's activations in backward */
    int eval_samples;  /* held-out samples scored at the end */
    const char *val_data; /* --val-data: validation source; NULL: --data's held-out split */
    int val_every;     /* validate every N steps (and at the last); 0: only at the last, if asked */
    int val_batches;   /* batches per validation (0: validation off unless asked for) */
    bool keep_nonfinite; /* --on-nonfinite continue: train on past a NaN/inf loss */
    bool memory_check;   /* --memory-check on: refuse a run that cannot fit */
    const char *copies; /* --copies AXIS: an independent mesh axis, one model per group */
    bool same_data;    /* --same-data: every copy reads copy 0's batches */
    int n_seeds, n_lrs, n_warmups, n_wds; /* values given in each list (0: flag not given) */
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
    const char *blas, *blas_core;
} cli_opts;

/* One model graph (training step or held-out evaluation). */
typedef struct cli_graph {
    spmd_graph *g;
    spmd_tensor *input, *targets, *loss, *logits;
} cli_graph;

typedef struct cli_model {
    spmd_mesh *mesh;     /* NULL on one device */
    const char *network_source; /* how the network figures were had: "measured", "given", "assumed" */
    spmd_dataset *data;
    cli_graph train;
    spmd_optimizer_tensors opt;
    cli_graph eval;      /* forward only; eval.g NULL without accuracy or validation */
    int copies;          /* models trained side by side (--copies), 1 without */
    spmd_dataset *copy_data[CLI_MAX_COPIES]; /* copy c's data (its seed's order); [0] is data */
    spmd_dataset *val_data; /* --val-data; NULL: validation reads data's held-out split */
    bool accuracy;       /* the data has a held-out accuracy and --eval asks for it */
    spmd_gpt_config gpt; /* the shape built, vocabulary resolved (mlp: vocab, layers) */
    int64_t params, tokens_per_step;
    double flops_per_step;
} cli_model;

/* "spmd: <message>" on stderr; returns 2 (usage error). */
int cli_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void cli_usage(FILE *f, const char *command);
/* Parse train/explain flags; 0, or an exit code (help printed: -1). */
int cli_parse(int argc, char **argv, const char *command, cli_opts *o);
/* Data, mesh, model, marks, gradient and optimizer; 0 or an exit code. */
int cli_build(const cli_opts *o, cli_model *m);
void cli_model_free(cli_model *m);
/* The --shard rules (later rules win), then FSDP for the parameters left
 * and the batch over every axis for c's inputs left (c->targets may be
 * NULL); 0 or an exit code. */
int cli_apply_marks(const cli_opts *o, spmd_mesh *mesh, cli_graph *c);
/* Compile a graph with the BLAS and thread choices of the flags; a
 * plan-only program (explain) allocates nothing and cannot run. */
spmd_program *cli_compile(const cli_opts *o, spmd_graph *g, bool plan_only);
/* Refuse (message, exit code) a run whose programs need more memory than
 * this process can get: MemAvailable, and the room RLIMIT_AS leaves. */
int cli_check_memory(const cli_opts *o, const cli_model *m);
/* The learning rate of `step` (from 0) by the schedule flags (copy 0's). */
float cli_lr(const cli_opts *o, int step);
/* The global batch of the training split from sample `first` on, and the
 * learning rate of `step` (from 0), for every copy. */
int cli_feed(const cli_opts *o, const cli_model *m, spmd_program *p, int step, int64_t first);
/* Cap --eval at the held-out set's size, saying so on stdout: past it,
 * evaluation only scores the same problems again, for as long as asked. */
void cli_cap_eval(cli_opts *o, const cli_model *m);
/* Held-out accuracy of the trained parameters (read from `train`): the
 * share of scored targets predicted exactly; -1 when there is none. */
double cli_accuracy(const cli_opts *o, const cli_model *m, const spmd_program *train,
                    spmd_program *eval, int copy);
/* Copies (copies.c): each copy's settings from the per-copy lists, its
 * learning rate at `step`, and its data (its seed's order, or copy 0's). */
uint64_t cli_copy_seed(const cli_opts *o, int c);
float cli_copy_lr(const cli_opts *o, int c);
int cli_copy_warmup(const cli_opts *o, int c);
float cli_copy_weight_decay(const cli_opts *o, int c);
float cli_lr_of(const cli_opts *o, int c, int step);
spmd_dataset *cli_copy_data(const cli_model *m, int c);
/* With --copies, declare the axis independent, check the lists' lengths
 * against the copies and open each copy's data; 0, or 2 with a message. */
int cli_setup_copies(const cli_opts *o, cli_model *m);
void cli_free_copies(cli_model *m);
/* The seeds to compile with (spmd_compile_options.copy_seeds); NULL: one for all. */
const uint64_t *cli_copy_seeds(const cli_opts *o);
/* Print the copies ranked by `final` (one loss each; non-finite last). */
void cli_rank_copies(const cli_opts *o, const cli_model *m, const double *final, bool validated);
/* Copy c's settings and losses (losses[i * stride + c] for step i). */
struct cJSON *cli_copy_json(const cli_opts *o, int c, const float *losses, int stride, int steps);

/* Whether the run validates, and whether at step `done` (from 1) of
 * `steps`: every --val-every steps and at the last. */
bool cli_validates(const cli_opts *o);
bool cli_validates_at(const cli_opts *o, int done, int steps);
/* The mean loss of the trained parameters (read from `train`) over the
 * --val-batches validation batches, computed by the forward-only `eval`
 * program (no gradients, no optimizer state touched); 0, or 1 with a
 * message. */
int cli_val_loss(const cli_opts *o, const cli_model *m, const spmd_program *train,
                 spmd_program *eval, int copy, double *loss);
/* Per-device parameter + gradient + optimizer bytes. */
size_t cli_param_bytes(const spmd_program *p);

/* Report pieces (json.c).  cJSON handles stay opaque here. */
struct cJSON;
struct cJSON *cli_collectives_json(const spmd_program *p);
struct cJSON *cli_mesh_json(const cli_model *m);
struct cJSON *cli_per_device(const spmd_program *p, double value);
/* Per process: its devices, their parameter + gradient + optimizer bytes,
 * and the bytes it allocated for them (gathered from every process: each
 * calls it). */
struct cJSON *cli_processes_json(const spmd_program *p);
/* Refuse (message, exit code) a --json path no report could be written
 * to: a directory, a device, a place where no file can be created. */
int cli_check_report_path(const char *path);
/* Writes and frees `root`, atomically: a temporary file beside `path`,
 * synced, then renamed over it.  0, or 1 with a message. */
int cli_write_json(const char *path, struct cJSON *root);
/* The run's settings (model, optimizer, data), as saved in checkpoints
 * and reported (run_checkpoint.c). */
struct cJSON *cli_settings_json(const cli_opts *o, const cli_model *m);
/* Save program p at `step` to --save, with the data position `samples`;
 * 0, or 1 with a message. */
int cli_save(const cli_opts *o, const cli_model *m, const spmd_program *p, int step, int64_t samples);
/* Load --resume's latest checkpoint into p: the step it reached and its
 * data position; 0, or an exit code with a message. */
int cli_resume(const cli_opts *o, const cli_model *m, spmd_program *p, int *step, int64_t *samples);
/* "4x2 (replica, fsdp)" or "1 device". */
void cli_mesh_text(const cli_model *m, char *buf, size_t size);

/* --init (weights.c).  Take the GPT's shape from the file for every shape
 * field no flag set (0), refusing flags that differ from the file; called
 * by cli_parse before the shape defaults.  0, or an exit code with a
 * message. */
int cli_init_config(cli_opts *o);
/* Write the --init file's weights into the compiled training program p
 * (every parameter, whole; the program shards them); optimizer state
 * stays zero.  0 without --init; 0, or 1 with a message. */
int cli_init_apply(const cli_opts *o, const cli_model *m, spmd_program *p);

int cmd_train(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_explain(int argc, char **argv);
int cmd_visualize(int argc, char **argv);
int cmd_sample(int argc, char **argv);

#endif
