/*
 * Ready-made models, built only from the public graph API in spmd.h: a
 * multilayer perceptron and a GPT-2 style decoder.  Parameter names and
 * shapes follow PyTorch (nn.Linear weights are [out, in]; the GPT uses the
 * nanoGPT / Hugging Face GPT-2 names), so checkpoints and reference
 * computations map onto them one to one.
 *
 * Builders that return a status leave a message in spmd_last_error() on
 * failure; builders that return a tensor return NULL instead.
 */
#ifndef SPMD_MODELS_H
#define SPMD_MODELS_H

#include "spmd/mesh.h"
#include "spmd/spmd.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Multilayer perceptron ---------------------------------------------- */

/* `layers` hidden layers of width `hidden`, so layers + 1 Linear layers:
 *   fc.0: in_dim -> hidden, fc.1 .. fc.{layers-1}: hidden -> hidden,
 *   fc.{layers}: hidden -> out_dim   (layers == 0: one Linear in -> out).
 * Linear i has "fc.{i}.weight" [out, in] and "fc.{i}.bias" [out]; GELU
 * (tanh form) follows every Linear but the last.
 * Init: weights uniform in [-1/sqrt(in), 1/sqrt(in)) -- the distribution
 * PyTorch's nn.Linear gives its weights (kaiming_uniform with a = sqrt(5));
 * biases zero. */
typedef struct spmd_mlp_config {
    int in_dim;
    int hidden;
    int layers; /* hidden layers */
    int out_dim;
} spmd_mlp_config;

typedef struct spmd_mlp_tensors {
    spmd_tensor *input;   /* [B, in_dim] f32 */
    spmd_tensor *output;  /* [B, out_dim] */
    spmd_tensor *targets; /* set by spmd_mlp_add_loss */
    spmd_tensor *loss;    /* scalar; set by spmd_mlp_add_loss */
} spmd_mlp_tensors;

typedef enum spmd_mlp_loss_kind {
    SPMD_MLP_MSE = 0,          /* targets f32 [B, out_dim] */
    SPMD_MLP_CROSS_ENTROPY = 1 /* targets i32 [B], class ids in [0, out_dim) */
} spmd_mlp_loss_kind;

SPMD_API spmd_status spmd_mlp_validate(const spmd_mlp_config *cfg);
/* Trained elements of the model; -1 (with a message) for a bad config. */
SPMD_API int64_t spmd_mlp_param_count(const spmd_mlp_config *cfg);
/* Build the MLP on `x` [B, in_dim] f32, or, with x == NULL, on a new input
 * "input" [batch, in_dim] (batch is ignored when x is given).  Fills
 * out->input and out->output; out->targets and out->loss become NULL. */
SPMD_API spmd_status spmd_mlp_build(spmd_graph *g, const spmd_mlp_config *cfg,
                                    spmd_tensor *x, int batch, spmd_mlp_tensors *out);
/* Add the input "targets" and the scalar mean loss of out->output. */
SPMD_API spmd_status spmd_mlp_add_loss(spmd_graph *g, spmd_mlp_loss_kind kind,
                                       spmd_mlp_tensors *t);

/* ---- GPT-2 style decoder ---------------------------------------------- */

/* Parameters (C = dim, T = seq, V = vocab):
 *   wte.weight [V, C]   token embedding, also the (tied) LM head
 *   wpe.weight [context, C]   position embedding (rows 0..T-1 used)
 *   per block i:
 *     h.{i}.ln_1.weight, h.{i}.ln_1.bias           [C]
 *     h.{i}.attn.c_attn.weight [3C, C], .bias [3C]  (q, k, v in that order)
 *     h.{i}.attn.c_proj.weight [C, C],  .bias [C]
 *     h.{i}.ln_2.weight, h.{i}.ln_2.bias           [C]
 *     h.{i}.mlp.c_fc.weight    [4C, C], .bias [4C]
 *     h.{i}.mlp.c_proj.weight  [C, 4C], .bias [C]
 *   ln_f.weight, ln_f.bias [C]
 * Pre-norm blocks, causal attention, GELU (tanh form), LayerNorm eps 1e-5.
 * Block i's output [B, T, C] (the residual stream after its MLP) is the
 * tensor named "h.{i}.out": spmd_graph_find(g, "h.3.out") finds it, e.g.
 * to pass every block's output to spmd_grad_checkpointed (spmd/train.h).
 * Init as GPT-2 / nanoGPT: weights and embeddings normal(0, 0.02), the two
 * c_proj weights normal(0, 0.02 / sqrt(2 * layers)), biases zero,
 * LayerNorm weights one and biases zero. */
typedef struct spmd_gpt_config {
    int vocab;  /* V */
    int seq;    /* T: the sequence length trained on */
    int context; /* rows of wpe (GPT-2: 1024); 0 means seq */
    int layers;
    int heads;  /* must divide dim */
    int dim;    /* C */
    /* Mixture of experts (GShard; docs/DESIGN.md, "Experts"): with
     * experts E > 0 the odd blocks (h.1, h.3, ...; at least 2 layers) have
     * E expert MLPs in place of their MLP, each token routed to top_k K
     * of them (1 <= K <= E, at most SPMD_GPT_MAX_TOP_K) by a softmax gate,
     * each expert taking floor(K * T * capacity_factor / E) tokens of
     * each sequence (at least 1) and dropping the rest.  Parameters of such a
     * block, in place of its mlp.*:
     *   h.{i}.moe.gate.weight [E, C]
     *   h.{i}.moe.c_fc.weight [E, C, 4C], .bias [E, 4C]
     *   h.{i}.moe.c_proj.weight [E, 4C, C], .bias [E, C]
     * 0 experts: the dense GPT, as before. */
    int experts;
    int top_k;
    float capacity_factor;
} spmd_gpt_config;

#define SPMD_GPT_MAX_TOP_K 8
/* The auxiliary load-balancing loss's weight in the loss (Switch's and
 * GShard's 0.01). */
#define SPMD_GPT_MOE_AUX_WEIGHT 0.01f

typedef struct spmd_gpt_tensors {
    spmd_tensor *input;   /* "input"   i32 [B, T] token ids */
    spmd_tensor *targets; /* "targets" i32 [B, T] next-token ids */
    spmd_tensor *logits;  /* "logits" [B, T, V] */
    /* Scalar mean cross-entropy; with experts, plus SPMD_GPT_MOE_AUX_WEIGHT
     * times aux_loss. */
    spmd_tensor *loss;
    /* With experts (else NULL): "moe.aux_loss", the MoE layers' summed
     * load-balancing losses (each E * sum_e mean_t(gate_e) * mean_t(first
     * choice_e), averaged over the sequences); "moe.dropped", the
     * assignments past capacity over the batch and the MoE layers, an
     * output of the graph. */
    spmd_tensor *aux_loss;
    spmd_tensor *dropped;
} spmd_gpt_tensors;

#define SPMD_GPT_LN_EPS 1e-5f

SPMD_API spmd_status spmd_gpt_validate(const spmd_gpt_config *cfg);
/* Trained elements: V*C + context*C + layers*(12*C*C + 13*C) + 2*C
 * (124,439,808 for GPT-2 small); -1 (with a message) for a bad config. */
SPMD_API int64_t spmd_gpt_param_count(const spmd_gpt_config *cfg);
/* The whole model and its loss for `batch` sequences of cfg->seq tokens. */
SPMD_API spmd_status spmd_gpt_build(spmd_graph *g, const spmd_gpt_config *cfg, int batch,
                                    spmd_gpt_tensors *out);
/* One transformer block (parameters h.{layer}.*) on x [B, T, C] f32,
 * returning x + attn(ln_1(x)) followed by + mlp(ln_2(.)), [B, T, C],
 * named "h.{layer}.out".  For tests and for callers that assemble their
 * own stack. */
SPMD_API spmd_tensor *spmd_gpt_block(spmd_graph *g, const spmd_gpt_config *cfg, int layer,
                                     spmd_tensor *x);

/* ---- Pipeline stages (docs/DESIGN.md, "Pipeline stages") ---------------------- */

/* The model of spmd_gpt_build (the same parameters: names, shapes and
 * init) split into `stages` stages of contiguous layers, the first
 * layers % stages stages one layer more; the embeddings on stage 0, the
 * final norm, the tied head and the loss on the last.  The step takes
 * `micro_batches` micro-batches of `batch` sequences: "input" and
 * "targets" are i32 [micro_batches, batch, T] (micro-batch m is rows
 * m * batch .. of the global batch, as gradient accumulation takes them),
 * the loss the micro-batches' mean.  Micro-batch 0's activations carry
 * spmd_gpt_build's names, micro-batch m's "mb{m}." before them; `logits`
 * is micro-batch 0's.  Refused: more stages than layers, fewer
 * micro-batches than stages.  Compile it on a mesh whose stage axis
 * (spmd_mesh_set_stage_axis) has `stages` devices, or on one device. */
SPMD_API spmd_status spmd_gpt_build_stages(spmd_graph *g, const spmd_gpt_config *cfg, int batch,
                                           int stages, int micro_batches, spmd_gpt_tensors *out);
/* The first layer of stage `stage` of `stages` over `layers` layers
 * (stage == stages: layers); -1 for arguments out of range. */
SPMD_API int spmd_gpt_stage_first_layer(int layers, int stages, int stage);

/* ---- Tensor, sequence and context parallelism --------------------------------- */

/* How spmd_gpt_shard_tensor_parallel splits a GPT.  `tensor` names the
 * mesh axis that splits the heads (q, k and v of GPT-2's fused c_attn:
 * its weight [3C, C] is marked "3*tensor, ..."), the MLP's hidden units
 * and the vocabulary (the tied wte and the logits: the lookup and the
 * loss then run on vocabulary blocks).  `fsdp`, if not NULL, names the
 * axis that splits the same weights' other dim (3-D parallelism with the
 * batch axes); `batch` is the spec of the activations' batch dim (NULL:
 * every axis but the tensor axis and the independent ones, as
 * spmd_shard_batch gives the inputs when told those axes).  `sequence`
 * adds sequence parallelism: the residual stream ("embed", "h.{i}.mid",
 * "h.{i}.out") split over the sequence on the tensor axis, so each
 * block's all-reduces become reduce-scatters and all-gathers.  `context`,
 * if not NULL, names the context-parallel axis: the activations'
 * sequence is split over it (spmd_gpt_shard_context_parallel), and the
 * batch (when NULL) goes over the axes left. */
typedef struct spmd_gpt_parallel {
    const char *tensor;
    const char *fsdp;
    const char *batch;
    bool sequence;
    const char *context;
} spmd_gpt_parallel;

/* Marks a graph from spmd_gpt_build (on mesh m) as `how` says, the
 * inputs' batch included; marks the caller already made are kept, the
 * other tensors stay unmarked (spmd_fsdp_wrap afterwards shards the
 * remaining parameters).  The heads must split evenly over the tensor
 * axis.  A graph from spmd_gpt_build_stages is marked alike inside each
 * stage: the inputs [M, b, T] "None, batch, None", every micro-batch's
 * activations as the one batch's (the batch leaves the stage axis out). */
SPMD_API spmd_status spmd_gpt_shard_tensor_parallel(spmd_graph *g, const spmd_gpt_config *cfg,
                                                    const spmd_mesh *m,
                                                    const spmd_gpt_parallel *how);

/* Expert parallelism for a GPT with experts (GShard): the experts' weights
 * split on E over axis `expert` (and their hidden units over `tensor`, if
 * not NULL), the dispatched tokens [E, B, capacity, C] split on E over
 * `expert` and on the sequences over the other batch axes, and the tokens
 * returned [B, E, capacity, C] split on the sequences over every batch axis (`batch`, or
 * NULL: every axis but `tensor` and the independent ones, the expert axis
 * last among them for the reshard to be one all-to-all).  The expert
 * axis's size must divide E.  Marks the caller already made are kept. */
SPMD_API spmd_status spmd_gpt_shard_experts(spmd_graph *g, const spmd_gpt_config *cfg,
                                            const spmd_mesh *m, const char *expert,
                                            const char *tensor, const char *batch);
/* Context parallelism (sequence-split attention): marks the inputs
 * ("input", "targets") "batch, context", so every activation is split on
 * the sequence over how->context and each attention gathers the keys and
 * values of the whole sequence (docs/DESIGN.md, "Sequence-split
 * attention").  Call it before spmd_gpt_shard_tensor_parallel (with the
 * same `how`, whose marks then keep the sequence split) and
 * spmd_fsdp_wrap or spmd_shard_batch (which keep the inputs' marks).  The
 * context axis must divide the sequence and differ from the tensor axis;
 * `sequence` (sequence parallelism) is refused with it. */
SPMD_API spmd_status spmd_gpt_shard_context_parallel(spmd_graph *g, const spmd_gpt_config *cfg,
                                                     const spmd_mesh *m,
                                                     const spmd_gpt_parallel *how);

/* ---- GPT-2 decoding with a KV cache ------------------------------------------ */

/* One new position per run for `batch` sequences, with the parameters of
 * spmd_gpt_build (same names, shapes and init), so weights and checkpoints
 * load into it by name.  Each run reads "input" i32 [B, 1] (every row's
 * token at the position) and "position" i32 [1] (p, from 0 to context-1;
 * a run past the context fails), and gives the logits of the next token
 * [B, 1, V].  The keys and values of every earlier position are kept in
 * the state tensors
 *     h.{i}.attn.k_cache, h.{i}.attn.v_cache   [B, context, C]
 * (zeros at first): a run writes row p of each and attends over rows
 * 0..p, so a step costs one position, not the whole prefix.  Feeding
 * positions 0, 1, 2, ... in turn gives, at each, the logits that
 * spmd_gpt_build's forward pass gives at that position for the same
 * tokens.  Positions must be fed in order: row p is overwritten, rows
 * after it are stale until written again.  The caches are laid out like
 * the activations, so on a mesh they take the batch sharding of the new
 * rows (and their heads where a mesh axis splits them) unless marked. */
typedef struct spmd_gpt_decode_tensors {
    spmd_tensor *input;    /* "input" i32 [B, 1] */
    spmd_tensor *position; /* "position" i32 [1] */
    spmd_tensor *logits;   /* [B, 1, V], marked as an output */
} spmd_gpt_decode_tensors;

SPMD_API spmd_status spmd_gpt_build_decode(spmd_graph *g, const spmd_gpt_config *cfg, int batch,
                                           spmd_gpt_decode_tensors *out);

#ifdef __cplusplus
}
#endif
#endif
