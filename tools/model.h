/*
 * The model that `spmd train`, `explain` and `sample` build from the
 * flags: data, mesh, the training graph with its marks, gradient and
 * optimizer, and a forward-only evaluation graph; compiled with the flags'
 * BLAS and thread choices (model.c).
 */
#ifndef SPMD_TOOLS_MODEL_H
#define SPMD_TOOLS_MODEL_H

#include "options.h"

#include "spmd/data.h"
#include "spmd/mesh.h"
#include "spmd/models.h"
#include "spmd/spmd.h"
#include "spmd/train.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One model graph (training step or held-out evaluation). */
typedef struct cli_graph {
    spmd_graph *g;
    spmd_tensor *input, *targets, *loss, *logits;
    spmd_tensor *dropped; /* a GPT with experts: assignments past capacity; else NULL */
} cli_graph;

typedef struct cli_model {
    spmd_mesh *mesh;     /* NULL on one device */
    const char *network_source; /* how the network figures were had: "measured", "given", "assumed" */
    spmd_dataset *data;
    cli_graph train;
    spmd_optimizer_tensors opt;
    cli_graph eval;      /* forward only; eval.g NULL without accuracy or validation */
    int copies;          /* models trained side by side (--copies), 1 without */
    spmd_dataset *copy_data[CLI_MAX_COPIES]; /* copy c's data (its seed's order); NULL: data */
    spmd_dataset *val_data; /* --val-data; NULL: validation reads data's held-out split */
    bool accuracy;       /* the data has a held-out accuracy and --eval asks for it */
    spmd_gpt_config gpt; /* the shape built, vocabulary resolved (mlp: vocab, layers) */
    int64_t params, tokens_per_step;
    double flops_per_step;
    /* --pp: the stages and the micro-batches a step feeds at once (1 and
     * 1 without; gradient accumulation feeds its own one by one). */
    int stages, micro_batches;
} cli_model;

/* Whether the run validates (--val-every, --val-batches or --val-data):
 * then the evaluation graph computes the loss. */
bool model_validates(const cli_opts *o);
/* Data, mesh, model, marks, gradient and optimizer; 0 or an exit code. */
int model_build(const cli_opts *o, cli_model *m);
void model_free(cli_model *m);
/* Copy c's data: its own, or copy 0's. */
spmd_dataset *model_copy_data(const cli_model *m, int c);
/* The --shard rules (later rules win), then FSDP for the parameters left
 * and the batch over every axis for c's inputs left (c->targets may be
 * NULL); 0 or an exit code. */
int model_apply_marks(const cli_opts *o, spmd_mesh *mesh, cli_graph *c);
/* Load the GEMM library --blas names (once); 0, or 1 with a message. */
int model_select_blas(const cli_opts *o);
/* Compile a graph with the BLAS and thread choices of the flags; a
 * plan-only program (explain) allocates nothing, loads no BLAS and cannot
 * run.  NULL after a message. */
spmd_program *model_compile(const cli_opts *o, spmd_graph *g, bool plan_only);
/* Refuse (message, exit code) a run whose programs need more memory than
 * this process can get: MemAvailable, and the room RLIMIT_AS leaves. */
int model_check_memory(const cli_opts *o, const cli_model *m);
/* The same for any one or two graphs (second may be NULL) and the tool's
 * own buffers of `tool_bytes`; `advice` ends the refusal ("try ..."). */
int model_check_programs(const cli_opts *o, spmd_graph *first, spmd_graph *second,
                         double tool_bytes, const char *advice);
/* Per-device parameter + gradient + optimizer bytes. */
size_t model_param_bytes(const spmd_program *p);
/* "4x2 (replica, fsdp)" or "1 device". */
void model_mesh_text(const cli_model *m, char *buf, size_t size);

/* "batch 32", or with --accumulate "batch 32 x 4 micro-batches", with
 * --pp "batch 32 x 4 micro-batches over 2 stages": what a
 * step trains on. */
void model_batch_text(const cli_opts *o, const cli_model *m, char *buf, size_t size);

#endif
