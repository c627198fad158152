/*
 * Internal view of the graph IR: the node struct, per-op attributes, the op
 * table generated from ops.def, and dimension signatures.
 *
 * A graph is a list of nodes in creation order.  An op can only name nodes
 * that already exist, so creation order is a topological order.
 */
#ifndef SPMD_IR_H
#define SPMD_IR_H

#include "spmd/spmd.h"
#include "base/arena.h"

/* Declared in mesh/ (sharding.h, spmd/mesh.h); the IR only points at them. */
struct sharding;
struct spmd_mesh;

#define IR_MAX_INPUTS 16 /* also the most tensors one concat takes */
#define IR_MAX_ITER 12

typedef enum ir_op {
#define OP(e, name, arity, sig, lin, fix, vjp, kern, groups, formula, scratch, kind, bf16) IR_##e,
#include "ir/ops.def"
#undef OP
    IR_OP_COUNT
} ir_op;

/* A 2-D convolution's attributes (CONV2D and its backward ops): per
 * spatial dim (rows, columns) the stride, the zeros padded on both sides
 * and the dilation; and the groups the channels fall into. */
typedef struct ir_conv {
    int stride[2], pad[2], dilation[2];
    int groups;
} ir_conv;

/* Per-op attributes; which member is live depends on the op. */
typedef union ir_attr {
    struct { bool ta, tb; } matmul;          /* MATMUL, BMM */
    struct { uint32_t axes; bool keepdim; } reduce; /* SUM, MEAN */
    struct { int axis; bool keepdim; } max;  /* MAX, MAX_BACKWARD */
    struct { int axis; bool reverse; } cumsum; /* CUMSUM */
    struct { int axis; int64_t start, len; } slice; /* SLICE: x[start:start+len] */
    struct { int axis; int64_t start, total; } pad; /* PAD: zeros, x at [start:] */
    struct { int axis; } concat;
    struct { int perm[SPMD_MAX_RANK]; } permute; /* out dim i = in dim perm[i] */
    /* (CACHED_)ATTENTION(_BACKWARD).  In a per-device program whose
     * query rows are split (sequence-split attention, fix_attention),
     * `rows` is the whole sequence and `spec` the group whose member rank
     * is the device's block of query rows; rows 0: the queries are whole. */
    struct { int heads; int spec; int64_t rows; } attention;
    struct { float c; } scale;              /* SCALE, POW_SCALAR; `c` of every unary formula (ops.def) */
    struct { float eps; } norm;              /* LAYERNORM* */
    /* BATCH_NORM*: x [N, C, ...], the channels on dim 1.  `count`: the
     * elements one channel's statistics run over in the global graph (N
     * times the spatial size), which a device's kernel divides by, so its
     * share of a split sum is exact; `training` (BATCH_NORM): the mean and
     * var operands are x's own batch statistics, and its backward rule
     * differentiates through them (autodiff.c).  BATCH_NORM_VAR in a
     * per-device program: for each dim of x split unevenly, its group
     * (spec) and whole size (global; 0: not padded), so that the kernel
     * leaves the padding out of the sum. */
    struct {
        float eps;
        bool training;
        int64_t count;
        int spec[SPMD_MAX_RANK];
        int64_t global[SPMD_MAX_RANK];
    } bnorm;
    struct { float value; } fill;
    ir_conv conv;                            /* CONV2D* */
    /* MAX_POOL2D, AVG_POOL2D and their backward ops: stride and dilation
     * resolved (never 0).  The adaptive pools need none: their windows
     * follow from the shapes. */
    spmd_pool2d pool;
    /* EMBEDDING(_BACKWARD): `rows` is the backward's V and `table` the id
     * of the forward table whose gradient it is (-1: none), which
     * propagation splits the gradient's rows like.  In a per-device
     * program whose table (or gradient) is split over the vocabulary,
     * `global` is the whole V and `spec` the group whose member rank is the
     * device's block of rows; global 0: the table is whole. */
    struct { int64_t rows, global; int spec, table; } embed;
    /* Collectives and shard-local ops over the group `spec` of the
     * program's group list (its members rank the blocks):
     *   ALL_REDUCE      sum over the group
     *   ALL_GATHER      concatenate members' blocks along `dim`
     *   REDUCE_SCATTER  sum, keep this member's block of `dim`
     *   ALL_TO_ALL      split `dim` into blocks sent to members, concatenate
     *                   the received ones along `dim2`
     *   SHARD_SLICE     this member's block of `dim` (free), zeros past `global`;
     *                   `exact`: the members' blocks tile `global` (no padding)
     *   MASK_PADDING    zero elements of `dim` at global index >= `global` */
    struct { int spec, dim, dim2; int64_t global; bool exact; } coll;
    /* STAGE_TRANSFER: the stage the value leaves and the one it reaches. */
    struct { int from, to; } stage;
    /* CROSS_ENTROPY(_BACKWARD) and the VOCAB_CE_* ops in a per-device
     * program: for each dim of the targets split unevenly, its group (spec)
     * and whole size; rows past that size are padding and count for
     * nothing.  global 0: not padded.  Logits split over the vocabulary
     * (the VOCAB_CE_* ops only): `vocab` is the whole V and `vocab_spec`
     * the group whose member rank is the device's block of columns. */
    struct {
        int spec[SPMD_MAX_RANK];
        int64_t global[SPMD_MAX_RANK];
        int vocab_spec;
        int64_t vocab;
    } rows;
    /* DROPOUT: the probability of a drop, the site (which of its graph's
     * dropouts: spmd_dropout numbers them), and per dim where a device's
     * block lies in the whole tensor (fix_dropout): the group whose member
     * rank is the block (-1: the dim is whole), the split's groups (1:
     * plain) and the whole size.  Sixteen bits each keep the union (and
     * every node) at the size `rows` gives it. */
    struct {
        float p;
        int site;
        int16_t spec[SPMD_MAX_RANK];
        int16_t groups[SPMD_MAX_RANK];
        int64_t global[SPMD_MAX_RANK];
    } dropout;
} ir_attr;

struct spmd_tensor {
    int id;                 /* index in the graph's creation order */
    ir_op op;
    spmd_dtype dtype;
    int rank;
    int64_t dims[SPMD_MAX_RANK];
    int n_in;
    bool is_output;
    bool has_update;        /* PARAM, STATE: the target of an update (one at most) */
    /* The pipeline stage the node is placed on (docs/DESIGN.md, "Pipeline
     * stages"); -1: not placed. */
    int16_t stage;
    /* The micro-batch it computes (spmd_graph_set_micro_batch); -1: none.
     * The 1F1B schedule orders by it. */
    int16_t micro;
    ir_attr attr;
    char *name;             /* NULL if unnamed; arena-owned */
    spmd_init init;         /* PARAM, STATE */
    /* PARAM after spmd_grad: its gradient.  An accumulator STATE (the
     * optimizer's, with accumulate_steps > 1): the gradient it sums over
     * micro-batches, whose sharding it takes, pending sums included. */
    spmd_tensor *grad;
    /* Mixed precision: this f32 tensor's bf16 copy, made once for every
     * matmul that reads it (spmd_graph_set_matmul_precision); for a
     * parameter's copy, the backward pass's copy of the same parameter
     * (autodiff.c, backward_operand). */
    spmd_tensor *bf16;
    bool accumulator;       /* STATE: a gradient accumulator (above; kept in local graphs too) */
    bool frozen;            /* PARAM: held constant, not trained (spmd_param_freeze) */
    spmd_graph *graph;
    struct sharding *mark;     /* the user's spmd_mark_sharding, arena-owned; NULL if none */
    /* What the last compile decided (shared copies, never written
     * through); NULL before one. */
    const struct sharding *sharding;
    /* The n_in operands, allocated with the node: a deep model has
     * hundreds of thousands of nodes, and room for IR_MAX_INPUTS in each
     * took 128 of a node's 328 bytes. */
    spmd_tensor *in[];
};

typedef struct ir_update {
    spmd_tensor *target; /* PARAM or STATE */
    spmd_tensor *value;
} ir_update;

/* A failure as spmd_last_error() reports it; status SPMD_OK: none. */
typedef struct ir_failure {
    spmd_status status;
    char message[1024];
} ir_failure;

struct spmd_graph {
    spmd_allocator alloc;
    base_arena arena;       /* nodes and names */
    spmd_tensor **nodes;
    int n_nodes, cap_nodes;
    /* spmd_graph_find's index of the names the leaf builders and
     * spmd_tensor_set_name give: open addressing by name hash, each slot a
     * tensor or NULL, the capacity a power of two, at most half full.  A
     * renamed tensor also stays in its old name's slot, where its name no
     * longer matches.  (The partitioner names its local graph's leaves
     * directly; nothing looks them up.) */
    spmd_tensor **names;
    int n_names, cap_names;
    ir_update *updates;
    int n_updates, cap_updates;
    bool has_grad;
    /* Nodes [backward_begin, backward_end) are the backward pass; later
     * ones (optimizer updates) the update phase.  0 before spmd_grad.
     * With gradient accumulation the sums into the accumulators end the
     * backward pass. */
    int backward_begin, backward_end;
    /* Gradient accumulation (spmd_optimizer.accumulate_steps): micro-batches
     * per optimizer step (0: none), and the scalar input the program feeds
     * itself, 0 on a step's first micro-batch (the sums start afresh) and
     * 1 after. */
    int accumulate_steps;
    spmd_tensor *accumulate_keep;
    /* The operands' type matmul and bmm are built with: SPMD_F32, or
     * SPMD_BF16 (f32 operands converted, products summed in f32). */
    spmd_dtype matmul_precision;
    /* The gradients' reductions (spmd_graph_set_reduce_precision): SPMD_F32,
     * or SPMD_BF16 (the partitioner sends them as bf16). */
    spmd_dtype reduce_precision;
    const struct spmd_mesh *mesh; /* the mesh of every mark; NULL when none */
    /* Pipeline stages (spmd_graph_set_stage): the stage new nodes are
     * placed on (-1: none). */
    int stage;
    int micro; /* spmd_graph_set_micro_batch: new nodes' micro-batch (-1: none) */
    /* Dropout (dropout.c): the state scalar "rng.step" that counts the runs
     * and keys the masks with the step, created with the first dropout
     * (NULL before), and the dropouts built so far, each one's site. */
    spmd_tensor *rng_step;
    int dropout_sites;
    /* The first failure of a builder call on this graph: what a NULL that
     * a failed builder returned stands for when it reaches the next one. */
    ir_failure failure;
};

/* ---- Dimension signatures ---------------------------------------------- */

typedef enum ir_iter_kind {
    IR_ITER_PARALLEL = 0, /* independent: any sharding keeps results exact */
    IR_ITER_SUM,          /* linear reduction: sharding leaves a partial sum */
    IR_ITER_FULL          /* must be whole on each device (softmax row, ...) */
} ir_iter_kind;

typedef struct ir_dimsig {
    int n_iter;
    int64_t size[IR_MAX_ITER];
    uint8_t kind[IR_MAX_ITER];     /* ir_iter_kind */
    int64_t granule[IR_MAX_ITER];  /* > 0: a shard must hold exact multiples (heads) */
    char letter[IR_MAX_ITER];      /* for printing: "mk,kn->mn" */
    int n_in;
    int in_rank[IR_MAX_INPUTS], out_rank;
    int8_t in[IR_MAX_INPUTS][SPMD_MAX_RANK]; /* iteration index, -1: none */
    int8_t out[SPMD_MAX_RANK];
} ir_dimsig;

/* In which operands an op is linear, so that a pending sum on them may
 * pass through it instead of being resolved first (ops.def's linearity
 * column; propagate.c applies it). */
typedef enum ir_linearity {
    LIN_NONE = 0, /* resolve every pending sum first */
    LIN_ONE,      /* linear in its only operand: scale, sum, slice, reshape */
    LIN_EACH,     /* in each operand alone: one may be partial (mul, matmul) */
    LIN_FIRST,    /* in the first operand only (div by a whole value) */
    LIN_ALL       /* in all together: every operand the same pending sum (add) */
} ir_linearity;

ir_linearity ir_op_linearity(ir_op op);

/* Fill `sig` for node `t`; false when the op has no einsum form (reshape)
 * and needs an explicit rule. */
bool ir_signature(const spmd_tensor *t, ir_dimsig *sig);
/* "mk,kn->mn"; writes at most `size` bytes. */
void ir_signature_format(const ir_dimsig *sig, char *buf, size_t size);

/* ---- Op table ------------------------------------------------------------ */

const char *ir_op_name(ir_op op);
int ir_op_arity(ir_op op);

/* What an op is to the layers that schedule and run it (ops.def's kind
 * column). */
typedef enum ir_op_kind {
    IR_KIND_LEAF,       /* input, param, state: placed by the executor, no kernel */
    IR_KIND_COMPUTE,    /* a kernel on the device's own values */
    IR_KIND_COLLECTIVE, /* a collective that stays a step of the schedule (it packs
                         * through its thread's scratch: all-to-all) */
    IR_KIND_FLIES       /* a collective that reads only its operand and writes only
                         * its result, so a communication thread may run it while
                         * the device computes (compile/plan_inflight.c,
                         * runtime/executor_inflight.c) */
} ir_op_kind;
ir_op_kind ir_op_kind_of(ir_op op);
bool ir_op_is_leaf(ir_op op);
/* A parameter or state: a leaf whose value persists from run to run. */
bool ir_is_persistent(const spmd_tensor *t);
/* A parameter the backward pass and the optimizer train: not frozen. */
bool ir_is_trained(const spmd_tensor *t);
bool ir_op_is_collective(ir_op op); /* IR_KIND_COLLECTIVE or IR_KIND_FLIES */
bool ir_op_may_fly(ir_op op);       /* IR_KIND_FLIES */

/* Mixed precision (ops.def's bf16 column): whether op's kernel reads
 * operand `operand` in bf16, widening it exactly (matmul and bmm; the
 * backward ops that widen a kept activation; the ops that move values);
 * and whether its result may be bf16 (convert makes it, the ops that move
 * values move it).  Compile refuses bf16 anywhere else (compiled.c). */
bool ir_op_reads_bf16(ir_op op, int operand);
bool ir_op_makes_bf16(ir_op op);
/* The forward builders' call that keeps x's bf16 copy for the backward
 * pass (under bf16 precision, x computed and f32; autocast.c), and the
 * value the backward pass reads for forward value x (its kept copy, else
 * x). */
void ir_autocast_keep(spmd_graph *g, spmd_tensor *x);
spmd_tensor *ir_autocast_saved(const spmd_graph *g, spmd_tensor *x);
/* A parameter's bf16 copy (mixed precision): what FSDP gathers like the
 * parameter, and what the backward pass makes again (autodiff.c). */
bool ir_is_param_copy(const spmd_tensor *t);
bool ir_op_has_vjp(ir_op op);
/* Whether the op passes a grouped split of an operand dim through like a
 * plain one: its local form does not depend on where a device's elements
 * lie along the dim (ops.def's groups column; propagate.c). */
bool ir_op_carries_groups(ir_op op);
/* The operands the op's elementwise formula takes (ops.def's formula
 * column): 1 (x, and the constant c), 2 (x, y), 3 (x, y, z: where), or 0
 * for an op without one.  The ops with a formula are the fusible ones (compile/fuse.c). */
int ir_op_formula_arity(ir_op op);
/* A plain elementwise op: its kernel is the standard loop over its
 * formula (kern_formula) and it has a backward rule, so spmd_elementwise
 * builds it by name (the backward helpers, built by autodiff alone, are
 * not). */
bool ir_op_is_plain_elementwise(ir_op op);
/* Whether a unary formula reads the node's constant c (scale's factor,
 * pow_scalar's exponent): read from the formula as written. */
bool ir_op_reads_constant(ir_op op);
/* The op of that name, or -1. */
int ir_op_lookup(const char *name);
/* spmd_elementwise for an op of the table (a plain elementwise one). */
spmd_tensor *ir_elementwise(spmd_graph *g, ir_op op, spmd_tensor *const *in, int n_in, float c);

/* Backward rule: given node t and the adjoint dy of its output, add each
 * input's adjoint contribution into dx[i] (NULL where the input gets none).
 * Builds graph ops only; returns SPMD_OK or an error status. */
typedef spmd_status (*ir_vjp_fn)(spmd_graph *g, spmd_tensor *t, spmd_tensor *dy,
                                 spmd_tensor **dx);
ir_vjp_fn ir_op_vjp(ir_op op);

/* ---- Node construction (shared by the public builders and autodiff) ---- */

/* A new node with the given op, inputs, dtype and shape; NULL on error.
 * A NULL input is reported as ir_null_operand does. */
spmd_tensor *ir_node_new(spmd_graph *g, ir_op op, spmd_dtype dtype, int rank,
                         const int64_t *dims, spmd_tensor *const *in, int n_in);

/* Failures of builder calls (graph.c).  A builder that fails records the
 * failure on this thread and, when it is the graph's first, on the graph;
 * a NULL operand then reports the graph's first failure again, so a NULL
 * carries its cause and never picks up a message left by another graph or
 * an unrelated call.  g may be NULL (this thread only). */
spmd_status ir_error(spmd_graph *g, spmd_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The failure a callee has just recorded on this thread (base_alloc's out
 * of memory, a spec parse) becomes g's, if g has none yet; returns it. */
spmd_status ir_error_keep(spmd_graph *g);
/* Operand i of `op` is NULL: g's first failure raised again (the NULL is
 * what that failed call returned), else "<op>: operand i is NULL" as a
 * failure of its own.  Returns NULL. */
spmd_tensor *ir_null_operand(spmd_graph *g, const char *op, int i);
/* g's first failure put back on this thread; returns its status
 * (SPMD_OK, recording nothing, when there is none). */
spmd_status ir_error_raise(const spmd_graph *g);
/* The status of g's first failure; SPMD_OK when none or g is NULL. */
spmd_status ir_graph_status(const spmd_graph *g);
/* Operations that build on g and return a status of their own (spmd_grad,
 * the optimizers, the models) go by the failures their builders record
 * while they run, not by one the user's earlier calls left on g: begin
 * sets g's failure aside in *outer, end puts it back if there was one. */
void ir_error_scope_begin(spmd_graph *g, ir_failure *outer);
void ir_error_scope_end(spmd_graph *g, const ir_failure *outer);
/* "[4, 768]" into buf. */
const char *ir_shape_str(const spmd_tensor *t, char *buf, size_t size);
/* "'w1' [4, 8]", or "matmul #12 [4, 8]" for a node without a name: a
 * tensor as messages name it. */
const char *ir_label(const spmd_tensor *t, char *buf, size_t size);
/* Mark, transitively, the inputs of every marked node among ids
 * [0, last]: marked[i] then says "some marked node reads node i".  One
 * sweep from `last` down, since a node's inputs have smaller ids. */
void ir_mark_inputs(const spmd_graph *g, bool *marked, int last);
int64_t ir_numel(const spmd_tensor *t);
size_t ir_nbytes(const spmd_tensor *t);
/* Names spmd_graph_find compared on this thread, in all (a test hook: the
 * index keeps it near one per lookup, whatever the graph's size). */
uint64_t ir_name_compares(void);
bool ir_same_shape(const spmd_tensor *a, const spmd_tensor *b);
/* Builders of the ops that backward passes emit (shapes checked). */
spmd_tensor *ir_pad(spmd_graph *g, spmd_tensor *x, int axis, int64_t start, int64_t total);
spmd_tensor *ir_gelu_backward(spmd_graph *g, spmd_tensor *x, spmd_tensor *dy);
spmd_tensor *ir_relu_backward(spmd_graph *g, spmd_tensor *x, spmd_tensor *dy);
spmd_tensor *ir_gelu_erf_backward(spmd_graph *g, spmd_tensor *x, spmd_tensor *dy);
spmd_tensor *ir_silu_backward(spmd_graph *g, spmd_tensor *x, spmd_tensor *dy);
/* dropout of x with drop probability p, keyed by the f32 scalar `step`
 * and `site` (dropout.c): what spmd_dropout builds with the graph's step
 * state and next site, and the backward pass with the forward's key. */
spmd_tensor *ir_dropout(spmd_graph *g, spmd_tensor *x, spmd_tensor *step, float p, int site);
/* x under a node of its own, for the caller to mark: a sharding
 * constraint.  Its value is x; the partitioner emits no op for it, only
 * x resharded to the mark (docs/DESIGN.md, "Partition"). */
spmd_tensor *ir_sharding_constraint(spmd_graph *g, spmd_tensor *x);
/* dx for max over `axis`: dy (reduced shape, keepdim as given) routed to
 * the first maximum of each row of x; result has x's shape. */
spmd_tensor *ir_max_backward(spmd_graph *g, spmd_tensor *x, spmd_tensor *dy, int axis,
                             bool keepdim);
spmd_tensor *ir_layernorm_xhat(spmd_graph *g, spmd_tensor *x, float eps);
/* dx of layernorm(x, gamma, .) given dy. */
spmd_tensor *ir_layernorm_backward(spmd_graph *g, spmd_tensor *x, spmd_tensor *gamma,
                                   spmd_tensor *dy, float eps);
/* dx [.., H, W] of max_pool2d(x, pool) given dy: dy at each window's
 * maximum, found again from x. */
spmd_tensor *ir_max_pool2d_backward(spmd_graph *g, spmd_tensor *x, spmd_tensor *dy,
                                    const spmd_pool2d *pool);
/* dx [.., h, w] of avg_pool2d(x, pool) and of adaptive_avg_pool2d(x),
 * x [.., h, w], given dy: each window's share of its dy spread over it. */
spmd_tensor *ir_avg_pool2d_backward(spmd_graph *g, spmd_tensor *dy, int64_t h, int64_t w,
                                    const spmd_pool2d *pool);
spmd_tensor *ir_adaptive_avg_pool2d_backward(spmd_graph *g, spmd_tensor *dy, int64_t h,
                                             int64_t w);

/* Batch normalisation's backward rows: [2, C] of sum(dy) and sum(dy *
 * xhat) per channel, and dx of a training-mode batch_norm from them. */
spmd_tensor *ir_batch_norm_sums(spmd_graph *g, spmd_tensor *x, spmd_tensor *mean,
                                spmd_tensor *var, spmd_tensor *dy, float eps);
spmd_tensor *ir_batch_norm_backward(spmd_graph *g, spmd_tensor *x, spmd_tensor *mean,
                                    spmd_tensor *var, spmd_tensor *weight, spmd_tensor *dy,
                                    spmd_tensor *sums, float eps);
/* [3, B, T, C]: dq, dk, dv stacked. */
spmd_tensor *ir_attention_backward(spmd_graph *g, spmd_tensor *q, spmd_tensor *k,
                                   spmd_tensor *v, spmd_tensor *dout, int heads);
/* conv2d's backward ops (shapes checked against the forward's, whose
 * attributes `c` they take): dx [N, Cin, H, W] of x's dims `x_dims` from
 * dy and w (a transposed convolution), and dw [Cout, Cin/groups, KH, KW]
 * of w's dims `w_dims` from x and dy (a correlation summed over the
 * batch). */
spmd_tensor *ir_conv2d_backward_input(spmd_graph *g, spmd_tensor *dy, spmd_tensor *w,
                                      const int64_t *x_dims, const ir_conv *c);
spmd_tensor *ir_conv2d_backward_weight(spmd_graph *g, spmd_tensor *x, spmd_tensor *dy,
                                       const int64_t *w_dims, const ir_conv *c);
/* Where conv2d and its backward ops keep x, w and y: the operand index
 * of each, or -1 for the node's own output. */
typedef struct ir_conv_roles {
    int x, w, y;
} ir_conv_roles;
ir_conv_roles ir_conv_roles_of(ir_op op);
/* x's, w's or y's dims in node t (role: one of ir_conv_roles_of's). */
const int64_t *ir_conv_dims(const spmd_tensor *t, int role);
/* [rows, D]: dout rows scatter-added at ids. */
spmd_tensor *ir_embedding_backward(spmd_graph *g, spmd_tensor *ids, spmd_tensor *dout,
                                   int64_t rows);
/* dlogits = (softmax(logits) - onehot(targets)) * dloss / count(targets). */
spmd_tensor *ir_cross_entropy_backward(spmd_graph *g, spmd_tensor *logits,
                                       spmd_tensor *targets, spmd_tensor *dloss);

/* spmd_grad, also saying which forward node's backward rule emitted each
 * backward node, for rewrites that work per forward region (checkpoint.c).
 * rule_begin (one entry per node the graph has at the call) is NULL or
 * gets, for forward node i, the id of the first node its rule (and the
 * adjoint sums after it) appended, or -1 where the rule did not run.
 * Rules run from the loss down, so these ids grow as i falls, and node i
 * owns the backward nodes up to the next larger one (the last rule also
 * owns the gradient naming after it). */
spmd_status ir_grad(spmd_graph *g, spmd_tensor *loss, int *rule_begin);

/* Sum dy down to the shape of x (undoing numpy broadcasting). */
spmd_tensor *ir_reduce_to_shape(spmd_graph *g, spmd_tensor *dy, const spmd_tensor *x);

#endif
