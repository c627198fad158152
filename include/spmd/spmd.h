/*
 * libspmd public API: build a training program for one logical device, then
 * compile and run it.  Every handle is opaque; every function that can fail
 * returns a status (or NULL) and leaves a message in spmd_last_error(),
 * which a call that succeeds clears (see there).
 *
 * Graph-building functions accept NULL operands: a graph keeps the first
 * failure of a builder on it, and a NULL operand reports that failure
 * again, so a whole model can be built and checked once.
 */
#ifndef SPMD_SPMD_H
#define SPMD_SPMD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(SPMD_BUILDING) && defined(__GNUC__)
#define SPMD_API __attribute__((visibility("default")))
#else
#define SPMD_API
#endif

#define SPMD_MAX_RANK 6

/* ---- Status and errors ------------------------------------------------ */

typedef enum spmd_status {
    SPMD_OK = 0,
    SPMD_ERR_INVALID,     /* bad argument or malformed input */
    SPMD_ERR_SHAPE,       /* shapes that do not fit the op */
    SPMD_ERR_NOMEM,       /* an allocation failed */
    SPMD_ERR_IO,          /* a file could not be read or written */
    SPMD_ERR_UNSUPPORTED, /* valid request the library cannot do (yet) */
    SPMD_ERR_BACKEND,     /* BLAS or another backend is missing or failed */
    SPMD_ERR_INTERNAL,    /* a broken invariant: a libspmd bug */
    SPMD_ERR_TIMEOUT      /* a collective made no progress for its timeout */
} spmd_status;

/* The message of the last failure on this thread, "" when none.  A call
 * that returns spmd_status clears it when it returns SPMD_OK, and one that
 * returns a handle or a tensor (spmd_compile, spmd_mesh_parse, spmd_add,
 * spmd_graph_find, ...) when it returns one (not NULL); a call that fails
 * leaves its own message, whatever calls the library made inside it.
 * Calls that return a count, a size, a flag, a name or nothing
 * (spmd_status_name, spmd_program_free, ...) leave it as it is, so
 * printing spmd_status_name(st) and spmd_last_error() together is safe.
 * So after a call that succeeded it is "", and after one that failed it
 * says why; spmd_clear_error() clears it by hand. */
SPMD_API const char *spmd_last_error(void);
/* The status of the failure spmd_last_error() describes (SPMD_OK when it
 * is ""): how a caller that got a NULL handle or tensor learns the kind of
 * failure (a binding raising the matching exception, say). */
SPMD_API spmd_status spmd_last_status(void);
SPMD_API const char *spmd_status_name(spmd_status status);
SPMD_API void spmd_clear_error(void);

/* The first failure of a builder call on graph g (spmd_add, spmd_input, a
 * model's builder, and those spmd_grad and the optimizers make), SPMD_OK
 * when none failed.  When one did, its message is put back in
 * spmd_last_error(), so after building a whole model one check gives the
 * cause: later messages on this thread may be about something else.  A
 * NULL operand given to a builder of g reports this failure, or, when g
 * has none, that the operand is NULL. */
struct spmd_graph;
SPMD_API spmd_status spmd_graph_status(const struct spmd_graph *g);

/* ---- Allocation ------------------------------------------------------- */

/* One allocator hook for everything a graph or program owns.  Tests use it
 * to make allocation fail on purpose. NULL everywhere means malloc/free. */
typedef struct spmd_allocator {
    void *(*alloc)(void *ctx, size_t bytes); /* 64-byte aligned */
    void (*free)(void *ctx, void *ptr);
    void *ctx;
} spmd_allocator;

/* ---- Data types -------------------------------------------------------- */

typedef enum spmd_dtype {
    SPMD_F32 = 0,
    SPMD_I32 = 1,  /* token ids and class targets */
    SPMD_BF16 = 2  /* bfloat16: matmul operands under mixed precision (below) */
} spmd_dtype;

SPMD_API size_t spmd_dtype_size(spmd_dtype dtype);
SPMD_API const char *spmd_dtype_name(spmd_dtype dtype);

/* ---- Graph ------------------------------------------------------------- */

typedef struct spmd_graph spmd_graph;
typedef struct spmd_tensor spmd_tensor;

SPMD_API spmd_graph *spmd_graph_create(const spmd_allocator *alloc);
SPMD_API void spmd_graph_free(spmd_graph *g);

/* How a parameter or state tensor starts: values are a function of
 * (seed, tensor name, global element index) only. */
typedef enum spmd_init_kind {
    SPMD_INIT_ZEROS = 0,
    SPMD_INIT_ONES,
    SPMD_INIT_NORMAL,  /* mean 0, standard deviation `scale` */
    SPMD_INIT_UNIFORM, /* uniform in [-scale, scale) */
    SPMD_INIT_CONSTANT /* every element `scale` (Adagrad's initial accumulator) */
} spmd_init_kind;

typedef struct spmd_init {
    spmd_init_kind kind;
    float scale;
} spmd_init;

/* Leaves.  `name` is copied; names are unique within a graph. */
SPMD_API spmd_tensor *spmd_input(spmd_graph *g, const char *name, spmd_dtype dtype,
                                 int rank, const int64_t *dims);
SPMD_API spmd_tensor *spmd_param(spmd_graph *g, const char *name, int rank,
                                 const int64_t *dims, spmd_init init);
/* Persistent but not trained (optimizer moments, step counters). */
SPMD_API spmd_tensor *spmd_state(spmd_graph *g, const char *name, int rank,
                                 const int64_t *dims, spmd_init init);
/* Hold parameter p constant, as fine-tuning holds a layer PyTorch gives
 * requires_grad=False or leaves out of the optimizer: spmd_grad gives it
 * no gradient (nor computes one) and the optimizer neither updates it nor
 * keeps state for it.  It stays a parameter in every other way: its
 * initialisation, its mark (spmd_fsdp_wrap marks it too, and FSDP gathers
 * it where it is read), spmd_program_write and _read, checkpoints.  Before
 * spmd_grad; freezing twice is freezing once. */
SPMD_API spmd_status spmd_param_freeze(spmd_tensor *p);
SPMD_API spmd_tensor *spmd_fill(spmd_graph *g, int rank, const int64_t *dims, float value);

/* Elementwise with numpy broadcasting. */
SPMD_API spmd_tensor *spmd_add(spmd_graph *g, spmd_tensor *a, spmd_tensor *b);
SPMD_API spmd_tensor *spmd_sub(spmd_graph *g, spmd_tensor *a, spmd_tensor *b);
SPMD_API spmd_tensor *spmd_mul(spmd_graph *g, spmd_tensor *a, spmd_tensor *b);
SPMD_API spmd_tensor *spmd_div(spmd_graph *g, spmd_tensor *a, spmd_tensor *b);
SPMD_API spmd_tensor *spmd_scale(spmd_graph *g, spmd_tensor *x, float c);
SPMD_API spmd_tensor *spmd_neg(spmd_graph *g, spmd_tensor *x);
SPMD_API spmd_tensor *spmd_exp(spmd_graph *g, spmd_tensor *x);
SPMD_API spmd_tensor *spmd_log(spmd_graph *g, spmd_tensor *x);
SPMD_API spmd_tensor *spmd_tanh(spmd_graph *g, spmd_tensor *x);
SPMD_API spmd_tensor *spmd_gelu(spmd_graph *g, spmd_tensor *x); /* tanh form */
SPMD_API spmd_tensor *spmd_relu(spmd_graph *g, spmd_tensor *x);
SPMD_API spmd_tensor *spmd_sqrt(spmd_graph *g, spmd_tensor *x);
SPMD_API spmd_tensor *spmd_rsqrt(spmd_graph *g, spmd_tensor *x);
/* Any plain elementwise op of the op table by its name ("abs", "add";
 * spmd_op_describe lists them; the builders above and below build the
 * same ops): n_in f32 operands, one, or two broadcast as numpy does; `c`
 * is the constant of a unary op whose formula reads one (scale's factor,
 * pow_scalar's exponent), and 0 for every other op. */
SPMD_API spmd_tensor *spmd_elementwise(spmd_graph *g, const char *op, spmd_tensor *const *in,
                                       int n_in, float c);
/* The op table, for front ends that build ops by name (the Python
 * package): ops 0 .. spmd_op_count() - 1. */
typedef struct spmd_op_info {
    const char *name;
    int arity;           /* operands; -1: any number (concat) */
    bool elementwise;    /* plain elementwise: spmd_elementwise builds it */
    bool constant;       /* its formula reads the constant c */
    bool differentiable; /* it has a backward rule */
} spmd_op_info;
SPMD_API int spmd_op_count(void);
SPMD_API spmd_status spmd_op_describe(int index, spmd_op_info *info);
/* Exact GELU, x * 0.5 * (1 + erf(x / sqrt(2))): torch's nn.GELU(). */
SPMD_API spmd_tensor *spmd_gelu_erf(spmd_graph *g, spmd_tensor *x);
/* x * sigmoid(x) (SiLU, swish: Llama's SwiGLU). */
SPMD_API spmd_tensor *spmd_silu(spmd_graph *g, spmd_tensor *x);
SPMD_API spmd_tensor *spmd_sigmoid(spmd_graph *g, spmd_tensor *x);
/* x^p elementwise for a constant p (torch.pow(x, p)); p = 2, 3, 0.5, -0.5,
 * -1 and -2 are computed as products, sqrt and reciprocals, as torch does. */
SPMD_API spmd_tensor *spmd_pow_scalar(spmd_graph *g, spmd_tensor *x, float p);
/* cond != 0 ? a : b elementwise, numpy broadcasting over all three
 * (torch.where; masked_fill(mask, v) is where(mask, v, x)).  cond is f32
 * (a 0/1 mask; NaN counts as nonzero) or i32; a and b are f32.  No
 * gradient flows into cond. */
SPMD_API spmd_tensor *spmd_where(spmd_graph *g, spmd_tensor *cond, spmd_tensor *a,
                                 spmd_tensor *b);
/* Broadcast x to `dims` (numpy rules). */
SPMD_API spmd_tensor *spmd_expand(spmd_graph *g, spmd_tensor *x, int rank, const int64_t *dims);

/* Dropout in training, as torch.nn.Dropout(p): each element of f32 x kept
 * with probability 1 - p and scaled by 1 / (1 - p), else 0.  The draws
 * are libspmd's own (Philox-4x32-10 of the program's seed, the step, this
 * dropout's site and the element's index in the whole tensor: not
 * PyTorch's stream), the same on any mesh and any thread or process
 * count.  Every run draws anew: the graph's state "rng.step", made with
 * its first dropout, counts the runs (a checkpoint keeps it), and each
 * micro-batch of gradient accumulation draws its own.  Sites are numbered
 * in the order the dropouts are built.  The gradient is dy under the same
 * mask.  p in [0, 1]; p = 0 is x itself (no op and no state), so an
 * evaluation graph is built with p = 0. */
SPMD_API spmd_tensor *spmd_dropout(spmd_graph *g, spmd_tensor *x, float p);

/* Reductions.  `axes` is a bit mask of dimensions (bit i = dim i). */
SPMD_API spmd_tensor *spmd_sum(spmd_graph *g, spmd_tensor *x, uint32_t axes, bool keepdim);
SPMD_API spmd_tensor *spmd_mean(spmd_graph *g, spmd_tensor *x, uint32_t axes, bool keepdim);
SPMD_API spmd_tensor *spmd_max(spmd_graph *g, spmd_tensor *x, int axis, bool keepdim);

/* The cumulative sum of x along `axis` (negative counts from the end):
 * y[.., i, ..] = x[.., 0, ..] + ... + x[.., i, ..], or with `reverse`
 * x[.., i, ..] + ... + x[.., n-1, ..] (the adjoint of the forward one).
 * Each element sums in double, in order along the axis; sums of 0/1
 * masks (positions within an expert's capacity) are exact. */
SPMD_API spmd_tensor *spmd_cumsum(spmd_graph *g, spmd_tensor *x, int axis, bool reverse);

/* Normalisations over the last dimension. */
SPMD_API spmd_tensor *spmd_softmax(spmd_graph *g, spmd_tensor *x);
SPMD_API spmd_tensor *spmd_log_softmax(spmd_graph *g, spmd_tensor *x);
SPMD_API spmd_tensor *spmd_layernorm(spmd_graph *g, spmd_tensor *x, spmd_tensor *gamma,
                                     spmd_tensor *beta, float eps);

/* Pooling over the last two dims of x [N, C, H, W] or [C, H, W] (NCHW), as
 * torch.nn.functional's.  Pairs are (rows, columns).  An output dim is
 * (H + 2 padding - dilation (kernel - 1) - 1) / stride + 1, rounded down,
 * or up with ceil_mode (then a window must start inside the input or its
 * left padding); padding is at most half the kernel.  max_pool2d never
 * takes a padded position; its gradient goes to each window's first
 * maximum in row-major order (a NaN wins), as torch's.  avg_pool2d
 * divides each window's sum by divisor_override when it is > 0, else by
 * the window's size, padding counted when count_include_pad (torch's
 * default is true; not the overhang ceil_mode adds past the padding). */
typedef struct spmd_pool2d {
    int64_t kernel[2];
    int64_t stride[2];     /* 0: the kernel (torch's default) */
    int64_t padding[2];    /* implicit, on both sides */
    int64_t dilation[2];   /* 0 or 1: adjacent positions; max_pool2d only */
    bool ceil_mode;
    bool count_include_pad; /* avg_pool2d only */
    int64_t divisor_override; /* avg_pool2d only; 0: none */
} spmd_pool2d;
SPMD_API spmd_tensor *spmd_max_pool2d(spmd_graph *g, spmd_tensor *x, const spmd_pool2d *pool);
SPMD_API spmd_tensor *spmd_avg_pool2d(spmd_graph *g, spmd_tensor *x, const spmd_pool2d *pool);
/* Average pooling to [.., out_h, out_w]: output row i averages input rows
 * floor(i H / out_h) .. ceil((i + 1) H / out_h) - 1, and so the columns
 * (torch's adaptive_avg_pool2d). */
SPMD_API spmd_tensor *spmd_adaptive_avg_pool2d(spmd_graph *g, spmd_tensor *x, int64_t out_h,
                                               int64_t out_w);

/* Batch normalisation (PyTorch's BatchNorm1d, 2d and 3d), x [N, C, ...]
 * f32 with the channels on dim 1, every other dim (the batch and the
 * spatial dims) averaged over.
 * batch_norm_var: the biased variance [C] of x around `mean` [C].
 * batch_norm_stats: x's batch statistics, *mean = spmd_mean over every
 * dim but 1 and *var = spmd_batch_norm_var(x, *mean).  A partitioned
 * program computes them over the global batch (the partitioner
 * all-reduces the sums of a split batch), as one device would.
 * batch_norm: (x - mean) / sqrt(var + eps) * weight + bias per channel,
 * mean, var, weight and bias [C]; weight NULL is 1 and bias NULL is 0
 * (affine=False).  With mean and var from spmd_batch_norm_stats of this
 * same x (training mode) the gradient flows through the statistics, as
 * PyTorch's training mode; any other mean and var (running statistics:
 * evaluation mode) are taken as they are, each with its own gradient.
 * Updating running statistics is the caller's spmd_graph_set_update of
 * state tensors (PyTorch: (1 - momentum) running + momentum batch, the
 * variance unbiased, n / (n - 1)). */
SPMD_API spmd_tensor *spmd_batch_norm_var(spmd_graph *g, spmd_tensor *x, spmd_tensor *mean);
SPMD_API spmd_status spmd_batch_norm_stats(spmd_graph *g, spmd_tensor *x, spmd_tensor **mean,
                                           spmd_tensor **var);
SPMD_API spmd_tensor *spmd_batch_norm(spmd_graph *g, spmd_tensor *x, spmd_tensor *mean,
                                      spmd_tensor *var, spmd_tensor *weight, spmd_tensor *bias,
                                      float eps);

/* Linear algebra.  matmul: a [..., M, K] times b [K, N] (b [N, K] with
 * trans_b); with trans_a, a [L..., K'] and b [L..., N] contract over all
 * leading dims (the weight-gradient form) and give [K', N].
 * bmm: a [B..., M, K] times b [B..., K, N], transposes on the last two.
 * Operands are f32 or bf16 (each its own); products are summed in f32 and
 * the result is f32. */
SPMD_API spmd_tensor *spmd_matmul(spmd_graph *g, spmd_tensor *a, spmd_tensor *b,
                                  bool trans_a, bool trans_b);
SPMD_API spmd_tensor *spmd_bmm(spmd_graph *g, spmd_tensor *a, spmd_tensor *b,
                               bool trans_a, bool trans_b);

/* 2-D convolution as PyTorch's conv2d, NCHW: x [N, Cin, H, W] and weight
 * w [Cout, Cin / groups, KH, KW] give [N, Cout, OH, OW], OH = (H + 2 *
 * padding[0] - dilation[0] * (KH - 1) - 1) / stride[0] + 1 (OW likewise
 * with the [1]s).  Output channel o reads the input channels of its group,
 * o / (Cout / groups).  A bias is an add of [1, Cout, 1, 1].  f32 only.
 * opts NULL, or a zero field: stride 1, padding 0, dilation 1, groups 1. */
typedef struct spmd_conv2d_options {
    int stride[2];   /* rows, columns */
    int padding[2];  /* zeros on both sides: rows, columns */
    int dilation[2]; /* rows, columns */
    int groups;      /* Cin and Cout are multiples of it */
} spmd_conv2d_options;

SPMD_API spmd_tensor *spmd_conv2d(spmd_graph *g, spmd_tensor *x, spmd_tensor *w,
                                  const spmd_conv2d_options *opts);

/* Mixed precision, as torch.autocast(dtype=torch.bfloat16) does for
 * matmuls: with SPMD_BF16, every matmul and bmm built from now on (the
 * backward pass's too) reads bf16 copies of its f32 operands (one
 * spmd_convert per tensor, shared by all its matmuls) and sums in f32.
 * Parameters, their gradients, the optimizer and every other op stay f32;
 * a parameter's copy is what FSDP gathers, in half the bytes.  SPMD_F32
 * (the default) builds f32 matmuls again. */
SPMD_API spmd_status spmd_graph_set_matmul_precision(spmd_graph *g, spmd_dtype dtype);
/* The gradients' reductions, as FSDP2's MixedPrecisionPolicy(reduce_dtype):
 * with SPMD_BF16 the pending sums of the backward pass that the optimizer's
 * update reads (FSDP's reduce-scatters, the data axes' all-reduces) move
 * bf16: each device's gradient rounded to bf16 (nearest even), the sum over
 * the group taken in f32 over the widened values in the canonical order,
 * rounded to bf16 once and widened for the update; half the bytes.  Every
 * other sum (the forward's, the activations' gradients, the norm's) stays
 * f32.  Read when the graph is compiled.  SPMD_F32 (the default): f32
 * reductions, the bits libspmd always gave. */
SPMD_API spmd_status spmd_graph_set_reduce_precision(spmd_graph *g, spmd_dtype dtype);
/* Pipeline stages (docs/DESIGN.md, "Pipeline stages"): the nodes built
 * from now on are placed on stage `stage` of the mesh's stage axis
 * (spmd_mesh_set_stage_axis); -1 (the default) places none.  Autodiff
 * places each backward node where the node it differentiates is; nodes
 * left unplaced take their operands' stage when compiled. */
SPMD_API spmd_status spmd_graph_set_stage(spmd_graph *g, int stage);
/* The nodes built from now on compute micro-batch `micro` (-1, the
 * default: none); autodiff tags each backward node with its forward
 * node's.  The 1F1B schedule (spmd_compile_options.schedule) orders each
 * stage's work by it. */
SPMD_API spmd_status spmd_graph_set_micro_batch(spmd_graph *g, int micro);
/* The stage t is placed on, -1 for none. */
SPMD_API int spmd_tensor_stage(const spmd_tensor *t);
/* x of stage `from` on stage `to`: the only way a value crosses stages.
 * Sent point to point between the two devices that differ only in their
 * stage coordinate; a copy on a mesh without a stage axis.  Its gradient
 * goes back from `to` to `from`. */
SPMD_API spmd_tensor *spmd_stage_transfer(spmd_graph *g, spmd_tensor *x, int from, int to);
/* x as f32 or bf16 (rounded to nearest even); x itself when it has that
 * type already.  Its gradient is the f32 adjoint of the result. */
SPMD_API spmd_tensor *spmd_convert(spmd_graph *g, spmd_tensor *x, spmd_dtype dtype);

/* Causal multi-head self-attention: q, k, v [B, T, C], C = heads * head_dim;
 * returns softmax(q k^T / sqrt(head_dim), causal) v as [B, T, C]. */
SPMD_API spmd_tensor *spmd_attention(spmd_graph *g, spmd_tensor *q, spmd_tensor *k,
                                     spmd_tensor *v, int heads);

/* Decoding with a KV cache.  `pos` is an int32 [1] tensor (an input fed
 * each run): the global position of the first new row.
 * cache_write: `cache` [B, S, C] with `rows` [B, T, C] written at rows
 * pos .. pos+T-1 (a run fails if they do not fit in S).
 * cached_attention: causal attention of q [B, T, C], at positions
 * pos .. pos+T-1, over the cached keys and values [B, S, C] at positions
 * 0 .. pos+t; C = heads * head_dim.  Inference only: no gradients. */
SPMD_API spmd_tensor *spmd_cache_write(spmd_graph *g, spmd_tensor *cache, spmd_tensor *rows,
                                       spmd_tensor *pos);
SPMD_API spmd_tensor *spmd_cached_attention(spmd_graph *g, spmd_tensor *q, spmd_tensor *k_cache,
                                            spmd_tensor *v_cache, spmd_tensor *pos, int heads);

/* Rows of `table` [V, D] picked by int32 `ids` [...] -> [..., D]. */
SPMD_API spmd_tensor *spmd_embedding(spmd_graph *g, spmd_tensor *table, spmd_tensor *ids);
/* Mean cross-entropy of logits [..., V] against int32 targets [...]. */
SPMD_API spmd_tensor *spmd_cross_entropy(spmd_graph *g, spmd_tensor *logits,
                                         spmd_tensor *targets);
/* Mean squared error, a scalar. */
SPMD_API spmd_tensor *spmd_mse(spmd_graph *g, spmd_tensor *a, spmd_tensor *b);

/* Layout. */
SPMD_API spmd_tensor *spmd_reshape(spmd_graph *g, spmd_tensor *x, int rank, const int64_t *dims);
SPMD_API spmd_tensor *spmd_permute(spmd_graph *g, spmd_tensor *x, const int *perm);
SPMD_API spmd_tensor *spmd_transpose(spmd_graph *g, spmd_tensor *x, int dim0, int dim1);
/* x[..., start:start+len, ...] along `axis`. */
SPMD_API spmd_tensor *spmd_slice(spmd_graph *g, spmd_tensor *x, int axis, int64_t start,
                                 int64_t len);
SPMD_API spmd_tensor *spmd_concat(spmd_graph *g, spmd_tensor *const *xs, int n, int axis);

/* Tensor queries. */
SPMD_API int spmd_tensor_rank(const spmd_tensor *t);
SPMD_API int64_t spmd_tensor_dim(const spmd_tensor *t, int i);
SPMD_API int64_t spmd_tensor_numel(const spmd_tensor *t);
SPMD_API spmd_dtype spmd_tensor_dtype(const spmd_tensor *t);
SPMD_API const char *spmd_tensor_name(const spmd_tensor *t); /* NULL if unnamed */
SPMD_API spmd_status spmd_tensor_set_name(spmd_tensor *t, const char *name);
SPMD_API const char *spmd_tensor_op_name(const spmd_tensor *t);
SPMD_API bool spmd_tensor_is_param(const spmd_tensor *t);
SPMD_API bool spmd_tensor_is_frozen(const spmd_tensor *t); /* spmd_param_freeze */
/* The gradient of a parameter after spmd_grad (NULL before, and for a
 * frozen one). */
SPMD_API spmd_tensor *spmd_tensor_grad(const spmd_tensor *t);
/* The iteration-space signature of the op, einsum style ("mk,nk->mn"). */
SPMD_API const char *spmd_tensor_signature(const spmd_tensor *t, char *buf, size_t size);

SPMD_API spmd_tensor *spmd_graph_find(const spmd_graph *g, const char *name);
SPMD_API int spmd_graph_tensor_count(const spmd_graph *g);
SPMD_API spmd_tensor *spmd_graph_tensor(const spmd_graph *g, int index); /* creation order */
SPMD_API int64_t spmd_graph_param_count(const spmd_graph *g); /* trained elements (not frozen) */

/* Keep `t` readable after a run. */
SPMD_API spmd_status spmd_graph_mark_output(spmd_graph *g, spmd_tensor *t);
/* After each run, copy `value` into the persistent tensor `target`. */
SPMD_API spmd_status spmd_graph_set_update(spmd_graph *g, spmd_tensor *target, spmd_tensor *value);

/* ---- Autodiff ---------------------------------------------------------- */

/* Append the reverse-mode backward pass of the scalar `loss`.  Afterwards
 * spmd_tensor_grad(p) gives dloss/dp for every parameter p not frozen. */
SPMD_API spmd_status spmd_grad(spmd_graph *g, spmd_tensor *loss);

/* ---- Optimizer updates -------------------------------------------------- */

/* Append plain SGD: p <- p - lr * dloss/dp for every trained parameter, with `lr`
 * a scalar f32 input (so schedules change it without recompiling).
 * Every replica updates whole (no ZeRO, which spmd_optimizer_apply uses
 * by default).  Requires spmd_grad first. */
SPMD_API spmd_status spmd_sgd(spmd_graph *g, spmd_tensor *lr);

/* ---- Compile and run on one device ------------------------------------ */

typedef struct spmd_program spmd_program;

/* A graph with sharding marks (spmd/mesh.h) compiles to one program per
 * device of the marks' mesh, run by worker threads of this process with
 * shared-memory collectives (or spread over MPI processes: mpi_comm);
 * inputs, parameters and outputs are still read and written whole. */
typedef enum spmd_pipeline_schedule {
    SPMD_SCHEDULE_GPIPE = 0,
    SPMD_SCHEDULE_1F1B
} spmd_pipeline_schedule;

typedef struct spmd_compile_options {
    int threads;        /* compute threads in all (of this process); 0 = every core;
                           negative is refused */
    uint64_t seed;      /* parameter initialisation */
    bool plan_only;     /* partition and plan, allocate nothing: for reports
                           (collectives, memory); the program cannot run */
    /* A run over processes: points at an MPI_Comm of P processes (MPI
     * initialised with MPI_THREAD_MULTIPLE), each running devices / P of
     * the mesh's devices: the device at row-major mesh position r runs in
     * the process of rank r / (devices / P), so the minor mesh axes stay
     * inside a process.  NULL: every device runs in this process.  See
     * "Over processes" below. */
    const void *mpi_comm;
    /* With independent mesh axes (spmd_mesh_set_axis_independent): one
     * initialisation seed per copy, spmd_mesh_copies of them; NULL: `seed`
     * for every copy. */
    const uint64_t *copy_seeds;
    /* Run every elementwise op as its own pass instead of fusing chains of
     * them into one (the same bits either way): for comparisons. */
    bool unfused;
    /* The collective watchdog: a device that waits this many seconds in a
     * collective without progress (no peer arriving, no message of the
     * collective completing) fails its step with SPMD_ERR_TIMEOUT,
     * "collective timeout: ...", naming the collective, its axes and the
     * device or process (and host) it waited for, and every other wait of
     * this process ends.  0: the default, SPMD_COLLECTIVE_TIMEOUT_S;
     * negative: no watchdog (a dead peer is waited for forever); at most
     * SPMD_COLLECTIVE_TIMEOUT_MAX_S either way (NaN and more are refused). */
    double collective_timeout_s;
    /* Run each all-gather, reduce-scatter and all-reduce in flight on the
     * device's communication thread while it computes, instead of as a
     * blocking step of its schedule (the same bits either way).  Off by
     * default: on a quiet 2-core machine the hand-overs cost more than
     * they hide (README, "Benchmarks"); on a loaded one, or where the
     * transport is slow (between hosts), they gain. */
    bool overlap;
    /* With overlap: at most this many bytes of operands and results in
     * flight at once per device (and at most four collectives); one
     * whose operand and result alone are more stays a blocking step.
     * The same bits whatever it is.  0: SPMD_INFLIGHT_MIB MiB. */
    size_t inflight_bytes;
    /* On a mesh with a stage axis (docs/DESIGN.md, "Pipeline stages"):
     * the order each stage runs its micro-batches in.  GPipe (the
     * default): every forward, then every backward; 1F1B: after S - s - 1
     * forwards stage s alternates one forward and one backward, so it
     * holds at most S micro-batches' activations whatever their number
     * (the micro-batches tagged by spmd_graph_set_micro_batch).  The same
     * bits either way. */
    spmd_pipeline_schedule schedule;
} spmd_compile_options;

/* The watchdog's default: a dead link ends a job within two minutes,
 * while no collective of a healthy run goes this long without progress. */
#define SPMD_COLLECTIVE_TIMEOUT_S 100
/* The most collective_timeout_s takes either way: spmd_compile and the
 * tool's --collective-timeout refuse more. */
#define SPMD_COLLECTIVE_TIMEOUT_MAX_S 1e7
/* The in-flight budget's default, in MiB per device: far more than the
 * tests' and benchmarks' plans hold (the count binds there), yet a bound
 * on a large model's prefetch (docs/DESIGN.md, "Schedule and memory plan"). */
#define SPMD_INFLIGHT_MIB 64

SPMD_API spmd_program *spmd_compile(spmd_graph *g, const spmd_compile_options *opts);
SPMD_API void spmd_program_free(spmd_program *p);

/* Fill input t (of every copy).  It keeps its value until set again. */
SPMD_API spmd_status spmd_program_set_input(spmd_program *p, const spmd_tensor *t,
                                            const void *data, size_t bytes);
/* One step.  SPMD_ERR_INVALID, naming it, when an input that an output or
 * an update depends on was never set since compile (for a copy this
 * process runs): it would otherwise run as zeros. */
SPMD_API spmd_status spmd_program_run(spmd_program *p);
/* A program built with gradient accumulation (spmd_optimizer's
 * accumulate_steps K > 1) runs a step as K micro-batches: this, K - 1
 * times, each after setting that micro-batch's inputs, runs the forward
 * and backward pass and adds the gradients into the accumulators (no
 * update, and none of the update's collectives); spmd_program_run then
 * runs the last micro-batch and the update.  Outputs of the forward pass
 * (the loss) are that micro-batch's; the update's (the gradient norm)
 * are read after spmd_program_run.  SPMD_ERR_INVALID for a program
 * without accumulation, or called a K-th time; spmd_program_run is
 * refused after fewer than K - 1.  A micro-batch that fails (or a step
 * whose last one does) abandons the step's sums: the next call begins
 * the step again, parameters and optimizer state as they were. */
SPMD_API spmd_status spmd_program_accumulate(spmd_program *p);
/* Read an output, input or persistent tensor (of copy 0: see below). */
SPMD_API spmd_status spmd_program_read(const spmd_program *p, const spmd_tensor *t,
                                       void *dst, size_t bytes);
/* Overwrite a parameter or state tensor (of every copy). */
SPMD_API spmd_status spmd_program_write(spmd_program *p, const spmd_tensor *t,
                                        const void *src, size_t bytes);

/* Copies: with independent mesh axes the program runs one model per group
 * along them (spmd/mesh.h), numbered 0 .. spmd_program_copies - 1.
 * set_input and write above reach every copy; these reach one. */
SPMD_API int spmd_program_copies(const spmd_program *p);
SPMD_API spmd_status spmd_program_set_input_copy(spmd_program *p, int copy, const spmd_tensor *t,
                                                 const void *data, size_t bytes);
SPMD_API spmd_status spmd_program_write_copy(spmd_program *p, int copy, const spmd_tensor *t,
                                             const void *src, size_t bytes);
SPMD_API spmd_status spmd_program_read_copy(const spmd_program *p, int copy,
                                            const spmd_tensor *t, void *dst, size_t bytes);

/* Memory per device: the largest transient arena plus persistent and
 * input bytes; persistent: parameters and optimizer state.  On pipeline
 * stages, of the device holding the most. */
SPMD_API size_t spmd_program_peak_bytes(const spmd_program *p);
SPMD_API size_t spmd_program_persistent_bytes(const spmd_program *p);
SPMD_API size_t spmd_program_arena_bytes(const spmd_program *p);
/* Of the arena, the bytes live as the backward pass begins: the
 * activations the forward pass keeps for the backward (2 bytes an element
 * where mixed precision keeps them in bf16), and the loss; 0 for a
 * program without a backward pass. */
SPMD_API size_t spmd_program_held_bytes(const spmd_program *p);
/* Devices the program runs on: the mesh size of the graph's sharding
 * marks, or 1.  Memory figures above are per device. */
SPMD_API int spmd_program_devices(const spmd_program *p);
/* Bytes this process allocated for its devices: their blocks of inputs,
 * parameters and state, activation arenas and kernel scratch. */
SPMD_API size_t spmd_program_allocated_bytes(const spmd_program *p);

/* ---- Timeline --------------------------------------------------------------- *
 *
 * While tracing is on, each run (spmd_program_run or _accumulate) records,
 * on every device this process runs, when each node of the schedule (an
 * op, a fused chain or a collective) began and ended: thread 0 of the
 * device reads the clock after its share of the node and again after the
 * barrier that ends it.  Nothing is recorded, nor allocated, while tracing
 * is off, and the computed bits are the same either way. */

typedef enum spmd_trace_kind {
    SPMD_TRACE_RUN,        /* a whole run, timed by the caller's thread (device -1) */
    SPMD_TRACE_COMPUTE,    /* an op or a fused chain */
    SPMD_TRACE_COLLECTIVE, /* a collective: spmd_program_collective(collective) */
    SPMD_TRACE_UPDATE,     /* new values into parameters and state, after the schedule */
    /* A collective in flight (spmd_compile_options.overlap set): its
     * run on the device's communication thread, while the device computes;
     * wait_us is how long thread 0 waited for its result.  Its place in
     * the schedule is a SPMD_TRACE_COLLECTIVE event too, of next to no
     * time: the device's steps still add up to the run. */
    SPMD_TRACE_IN_FLIGHT,
    /* A node of another pipeline stage, which this device skips: no time,
     * where the device's step before it ended. */
    SPMD_TRACE_OFF_STAGE
} spmd_trace_kind;

typedef struct spmd_trace_event {
    spmd_trace_kind kind;
    int run;            /* the traced run, from 0 */
    int device;         /* mesh device id; -1 for SPMD_TRACE_RUN */
    double start_us;    /* microseconds since spmd_program_trace_begin */
    double dur_us;
    /* Of dur_us, how long thread 0 waited at the node's closing barrier
     * for the device's other threads (0 for a run or an update); the
     * schedule's last node adds the wait for collectives still in flight
     * at its end. */
    double wait_us;
    const char *op;     /* "matmul", "fused" for a fused chain; NULL for a run or an update */
    char name[96];      /* the node's name, else op#id; a run: "step", or "micro-batch" */
    char shape[64];     /* the node's (per-device) shape: "f32[64,1024]" */
    int collective;     /* index for spmd_program_collective; -1 if not one */
    /* The micro-batch the node computes (from 0: the GPT with stages,
     * spmd_gpt_build_stages); -1 if none, for a run or an update. */
    int micro_batch;
} spmd_trace_event;

/* Record the next `runs` runs (more are run but not recorded); forgets
 * the events of an earlier trace.  SPMD_ERR_INVALID for a program
 * compiled with plan_only or runs < 1; SPMD_ERR_NOMEM. */
SPMD_API spmd_status spmd_program_trace_begin(spmd_program *p, int runs);
/* Stop recording; the events stay readable until the next begin. */
SPMD_API spmd_status spmd_program_trace_end(spmd_program *p);
/* Events recorded (this process's devices), in order of run, then
 * device, then schedule: each run's SPMD_TRACE_RUN event first; a
 * device's SPMD_TRACE_IN_FLIGHT events follow its update. */
SPMD_API int spmd_program_trace_count(const spmd_program *p);
SPMD_API spmd_status spmd_program_trace_event(const spmd_program *p, int i,
                                              spmd_trace_event *out);

/* ---- Over processes (spmd_compile_options.mpi_comm) --------------------- *
 *
 * Every process builds the same graph and makes the same calls.  Compile,
 * run and read are collective over the processes: each calls them in the
 * same order.  set_input and write need not be (each process keeps only
 * its devices' blocks and reads only the part of the buffer they cover;
 * spmd_program_input_rows says which rows), so a process may fill only
 * those rows.  A failure on one process (a NULL compile, a failed run)
 * leaves the others waiting in their next collective call: end the job
 * (MPI_Abort), as an MPI program does. */

/* Processes running the program (1 without MPI) and this one's index in
 * them (its rank in the communicator). */
SPMD_API int spmd_program_processes(const spmd_program *p);
SPMD_API int spmd_program_process(const spmd_program *p);
/* This process's devices: mesh positions [*first, *first + count). */
SPMD_API int spmd_program_local_devices(const spmd_program *p, int *first);
/* The rows [*begin, *end) of input t's first dim that this process's
 * devices hold ([0, 0) when none; a scalar has the one row [0, 1)). */
SPMD_API spmd_status spmd_program_input_rows(const spmd_program *p, const spmd_tensor *t,
                                             int64_t *begin, int64_t *end);

/* ---- BLAS ---------------------------------------------------------------- */

/* The library's version ("0.1.0"), as the build that made it was told. */
SPMD_API const char *spmd_version(void);

/* The GEMM library is loaded when a program first runs (compiling, even
 * for reports, needs none), or by the two calls below. */
/* Which GEMM library and kernel the runtime loaded for f32 products
 * ("OpenBLAS 0.3.21 (SkylakeX)"; with oneDNN chosen for some shape
 * classes, both and the classes); loads it on first call. NULL on
 * failure. */
SPMD_API const char *spmd_blas_describe(void);
/* What runs bf16 GEMMs ("oneDNN 2.6.3 (avx512_core_bf16) bf16 matmul, f32
 * accumulation", or "converted to f32 and run by ... (slow: ...; the
 * reason)"); NULL when no BLAS loads. */
SPMD_API const char *spmd_blas_describe_bf16(void);
/* The backend choice as a string spmd_blas_select takes to make exactly
 * that choice again ("openblas:f32-nn-small=cblas,...,bf16-tt-large=onednn");
 * NULL when no BLAS loads. */
SPMD_API const char *spmd_blas_choice(void);
/* Choose the GEMM backends.  `library`: "auto" (NULL), "openblas", "blis"
 * or the path of a CBLAS library file (recognised by a '/'): every f32
 * product on that library; "onednn": every f32 product on oneDNN's
 * matmul; "measure": each shape class timed now on the CBLAS library and
 * on oneDNN and given the faster (the bits may then differ from the
 * default's: spmd_blas_choice gives the choice to repeat it).  Any of
 * these may end in ":KEY=BACKEND,..." choosing per precision and shape
 * class (f32=onednn, bf16=convert, f32-nt-small=cblas; see DESIGN
 * "Kernels and BLAS").  bf16 products run on oneDNN where its kernels
 * compute bf16 natively, else converted to f32.  `coretype`: the
 * OpenBLAS core type ("SkylakeX"; NULL picks the one CPUID says fits,
 * whatever OPENBLAS_CORETYPE the environment holds).  Call before the
 * first run; loads the library now, and a failure stays: every later run
 * reports it. */
SPMD_API spmd_status spmd_blas_select(const char *library, const char *coretype);
/* Have the GEMM library map now what a run's first product maps, and say
 * how much address space it takes, so that what a run has left under an
 * address-space limit (ulimit -v) can be measured before it starts: loads
 * the library (as spmd_blas_describe would, unless spmd_blas_select did)
 * and, with OpenBLAS, has it make the GEMM buffer its first product would
 * (made only where twice its size fits: OpenBLAS waits forever for a
 * mapping that fails).  *mapped (when not NULL) gets the bytes the
 * library has mapped, measured: loading it (Debian's OpenBLAS 0.3.21: 39
 * MiB; 0.3.29: 170 MiB, a buffer for its own thread among them) and its
 * buffers (128 MiB each).  SPMD_ERR_NOMEM, naming the limit, when the
 * address space cannot hold them; *more (when not NULL) then gets the
 * bytes that did not fit, else 0. */
SPMD_API spmd_status spmd_blas_prepare(size_t *mapped, size_t *more);
/* The OpenBLAS core types spmd_blas_select takes, as one line
 * ("Prescott, Core2, ..., SkylakeX, ..."); it refuses any other, ignoring
 * case as OpenBLAS does.  NULL off x86-64: no list, any name is passed on. */
SPMD_API const char *spmd_blas_core_names(void);

#ifdef __cplusplus
}
#endif
#endif
