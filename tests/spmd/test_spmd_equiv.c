/*
 * SPMD equivalence: a partitioned program computes what the same program
 * computes on one device, values and gradients alike.
 *
 * Each random case draws, from its own seed, a mesh of 1 to 8 devices with
 * 1 to 3 randomly named axes (device ids sometimes permuted), then a small
 * training graph over the core ops (matmul in every transpose form, bmm,
 * broadcasting arithmetic, unary ops (the activations, pow_scalar), where
 * over broadcast masks, reductions, max, softmax,
 * log_softmax, layernorm, attention, embedding, cross entropy, mse,
 * reshape, permute, slice, concat, dropout keyed by a step input, stage
 * transfers, copies without a stage axis) with random partition specs on some
 * inputs, parameters, intermediates and gradients: None, one axis or a
 * tuple of two per dim, uneven splits (and now and then empty blocks)
 * included, and grouped splits (2*x, 3*(x, y)) where they divide.  The same graph is built twice: without marks (compiled for
 * one device) and with them (partitioned).  Both get the same parameter
 * values and inputs; every marked output (the loss, some intermediates,
 * every parameter gradient, and the updated parameters when the case
 * appends SGD) must agree within |got - want| <= ATOL + RTOL |want|
 * (the worst element is reported), the partitioned program must give
 * bitwise the same results when run again, and parameters must start from
 * the same values on any mesh.  Every case must compile: no spec the test
 * draws is one the partitioner may refuse (cross entropy with its rows
 * split unevenly included: the padding rows are masked).
 *
 * Case i runs seed base + i; the base is printed at the start.  A failure
 * prints the case seed, the mesh, the specs and the graph, and
 *     SPMD_TEST_SEED=<case seed> SPMD_TEST_CASES=1 ./test_spmd_equiv
 * replays that case alone.  SPMD_TEST_CASES=<n> runs more (or fewer)
 * cases; SPMD_TEST_VERBOSE=1 prints every case, =2 also each case before
 * it runs and the shardings the partitioner chose.  The summary counts the
 * collectives the cases made the partitioner emit.  Fixed regression cases
 * (minimized reproducers of bugs this test found) run every time, and so
 * do fixed cases of the KV-cache decoding ops, which the random training
 * graphs cannot hold (they have no gradient), of vocabulary parallelism,
 * of convolutions (their 4-D images split over the batch, the channels and
 * the rows, meshes 2, 4 and 2x2), of pooling over [N, C, H, W] (batch,
 * channels, rows split; a pending sum through the averages), and of batch
 * normalisation over a batch split over 2, 4 and 2x2 devices, unevenly
 * over 3, with the channels or the spatial rows split (its statistics must
 * be the global batch's: the program must all-reduce their sums), and of
 * attention with its sequence split (meshes 2 and 4 over cp, 2x2 with the
 * batch or the heads split too).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "base/error.h"
#include "ir/ir.h"
#include "runtime/executor.h"
#include "shard/partition.h"
#include "spmd/mesh.h"
#include "spmd/spmd.h"
#include "support_rng.h"

#define ATOL 1e-5
#define RTOL 1e-4
#define DEFAULT_SEED 20261201u
#define DEFAULT_CASES 1500
#define MAX_LEAVES 48
#define MAX_OUTS 64
#define MAX_SAVED 24
#define MAX_NUMEL 4096 /* a value above this is not grown further */
#define LOG_SIZE 16384
#define SPEC_SIZE 4096

#define D(...) ((const int64_t[]){__VA_ARGS__})
#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* ---- A case --------------------------------------------------------------------------- */

typedef enum gen {
    GEN_ANY,    /* uniform [-1, 1): data */
    GEN_WEIGHT, /* uniform [-s, s), s set per leaf: weights */
    GEN_POS,    /* [0.5, 2): denominators */
    GEN_GAMMA,  /* [0.5, 1.5): layernorm scales */
    GEN_IDS,    /* int32 in [0, limit) */
    GEN_LR,     /* [0.05, 0.2): a learning rate */
    GEN_MASK,   /* f32 0 or 1: where's condition */
    GEN_STEP    /* a whole number in [0, 1000): dropout's step */
} gen;

typedef struct leaf {
    spmd_tensor *t; /* in the graph being built */
    gen kind;
    float scale;    /* GEN_WEIGHT */
    int32_t limit;  /* GEN_IDS */
    void *val;      /* host values, drawn once per case */
} leaf;

typedef struct mesh_desc {
    int rank;
    int shape[3];
    char names[3][16];
    int ids[8];
    bool permuted;
} mesh_desc;

typedef struct eq_case eq_case;
typedef void (*build_fn)(eq_case *c);

struct eq_case {
    uint64_t seed;
    const char *label;     /* regression cases: what they reproduce */
    mesh_desc md;
    spmd_mesh *mesh;
    build_fn build;
    bool random_marks;     /* draw specs (random cases) or take the builder's */
    /* Per build. */
    test_rng r;
    spmd_graph *g;
    bool apply_marks;      /* false: the one-device copy */
    int n_leaves;
    leaf leaves[MAX_LEAVES];
    int n_out;
    spmd_tensor *out[MAX_OUTS];
    int n_inter;           /* intermediates named so far */
    int n_marks;
    int n_saved;
    spmd_tensor *saved[MAX_SAVED];
    spmd_tensor *loss;
    bool sgd;              /* the graph updates its parameters */
    bool build_failed;
    char build_error[1024];
    char log[LOG_SIZE];
    size_t log_len;
    char specs[SPEC_SIZE];
    size_t specs_len;
    int threads;           /* partitioned program's thread count */
    unsigned expect;       /* fixed cases: VOCAB_*, POOL_LOCAL and BN_* forms the program must use */
};

/* Vocabulary-parallel forms a fixed case must make the partitioner use,
 * and what its program must go without. */
enum {
    VOCAB_LOOKUP = 1u << 0, /* embedding over a table split on V */
    VOCAB_GRAD = 1u << 1,   /* embedding_backward into a gradient split on V */
    VOCAB_LOSS = 1u << 2,   /* cross-entropy (and backward) over logits split on V */
    POOL_LOCAL = 1u << 3,   /* every pooling op pools its own block, no collective feeding it */
};

/* Batch normalisation over a split batch: the statistics' pending sums
 * are all-reduced (the global batch's statistics, never a device's). */
enum {
    BN_VAR_SUM = 1u << 4,  /* an all-reduce of batch_norm_var's pending sum */
    BN_GRAD_SUM = 1u << 5, /* an all-reduce of batch_norm_sums' */
};

/* The VOCAB_* and BN_* forms in program p's per-device graph. */
static unsigned program_forms(const spmd_program *p)
{
    const partition *part = executor_partition(p);
    unsigned found = 0;
    for (int i = 0; part && i < part->local->n_nodes; i++) {
        const spmd_tensor *t = part->local->nodes[i];
        if (t->op == IR_EMBEDDING && t->attr.embed.global) found |= VOCAB_LOOKUP;
        if (t->op == IR_EMBEDDING_BACKWARD && t->attr.embed.global) found |= VOCAB_GRAD;
        if (t->op == IR_VOCAB_CE_LOSS || t->op == IR_VOCAB_CE_BACKWARD) found |= VOCAB_LOSS;
        if (t->op == IR_ALL_REDUCE && t->in[0]->op == IR_BATCH_NORM_VAR) found |= BN_VAR_SUM;
        if (t->op == IR_ALL_REDUCE && t->in[0]->op == IR_BATCH_NORM_SUMS) found |= BN_GRAD_SUM;
    }
    return found;
}

static bool is_pool(ir_op op)
{
    return op == IR_MAX_POOL2D || op == IR_AVG_POOL2D || op == IR_ADAPTIVE_AVG_POOL2D ||
           op == IR_MAX_POOL2D_BACKWARD || op == IR_AVG_POOL2D_BACKWARD ||
           op == IR_ADAPTIVE_AVG_POOL2D_BACKWARD;
}

/* The pooling ops of program p that do not pool a block of their own:
 * whole on every device, or reading an operand a collective made (through
 * the block picks and masks that may follow it). */
static int pools_not_local(const spmd_program *p)
{
    const partition *part = executor_partition(p);
    int n = 0;
    for (int i = 0; part && i < part->g->n_nodes; i++) {
        const spmd_tensor *t = part->local_of[i];
        if (!t || !is_pool(t->op)) continue;
        bool whole = spmd_tensor_numel(t) == spmd_tensor_numel(part->g->nodes[i]), fed = false;
        for (int j = 0; j < t->n_in; j++) {
            const spmd_tensor *x = t->in[j];
            while (x->op == IR_SHARD_SLICE || x->op == IR_MASK_PADDING) x = x->in[0];
            fed = fed || ir_op_is_collective(x->op);
        }
        n += whole || fed;
    }
    return n;
}

static void textf(char *buf, size_t size, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void textf(char *buf, size_t size, size_t *len, const char *fmt, ...)
{
    if (*len >= size) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *len, size - *len, fmt, ap);
    va_end(ap);
    if (n > 0) *len += (size_t)n;
    if (*len >= size) *len = size - 1;
}

#define LOG(c, ...) textf((c)->log, sizeof (c)->log, &(c)->log_len, __VA_ARGS__)

static const char *shape_str(const spmd_tensor *t, char *buf, size_t size)
{
    size_t len = 0;
    buf[0] = '\0';
    textf(buf, size, &len, "[");
    for (int i = 0; i < spmd_tensor_rank(t); i++)
        textf(buf, size, &len, "%s%lld", i ? ", " : "", (long long)spmd_tensor_dim(t, i));
    textf(buf, size, &len, "]");
    return buf;
}

static const char *name_of(const spmd_tensor *t)
{
    const char *n = t ? spmd_tensor_name(t) : NULL;
    return n ? n : "?";
}

static void build_fail(eq_case *c, const char *what)
{
    if (c->build_failed) return;
    c->build_failed = true;
    snprintf(c->build_error, sizeof c->build_error, "%s: %s", what, spmd_last_error());
}

/* Mark t with `spec`, in the partitioned copy only; everything else, the
 * random draws included, is the same in both copies. */
static void mark(eq_case *c, spmd_tensor *t, const char *spec)
{
    if (!t || !c->apply_marks || c->build_failed) return;
    if (spmd_mark_sharding(c->g, t, c->mesh, spec) != SPMD_OK) {
        char why[600];
        snprintf(why, sizeof why, "mark_sharding %s \"%s\"", name_of(t), spec);
        build_fail(c, why);
        return;
    }
    char s[64];
    textf(c->specs, sizeof c->specs, &c->specs_len, "  %s %s: \"%s\"\n", name_of(t),
          shape_str(t, s, sizeof s), spec);
    c->n_marks++;
}

/* A random valid spec for dims of t: per dim None, one axis or a tuple of
 * two, each axis at most once; splits are mostly no finer than the dim
 * (uneven ones included), now and then finer (empty blocks). */
static void random_spec(eq_case *c, const spmd_tensor *t, char *buf, size_t size)
{
    const mesh_desc *md = &c->md;
    int rank = spmd_tensor_rank(t);
    bool used[3] = {false, false, false};
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < rank; i++) {
        int64_t dim = spmd_tensor_dim(t, i);
        bool finer_ok = test_rng_chance(&c->r, 0.1);
        double u = test_rng_unit(&c->r);
        int want = u < 0.45 ? 0 : u < 0.85 ? 1 : 2;
        int axes[2], n = 0;
        int64_t blocks = 1;
        for (int k = 0; k < want; k++) {
            int free_axes[3], nf = 0;
            for (int a = 0; a < md->rank; a++)
                if (!used[a] && (finer_ok || blocks * md->shape[a] <= dim)) free_axes[nf++] = a;
            if (!nf) break;
            int a = free_axes[test_rng_int(&c->r, 0, nf - 1)];
            used[a] = true;
            axes[n++] = a;
            blocks *= md->shape[a];
        }
        /* Now and then a grouped split (N*axes, docs/DESIGN.md "Grouped
         * splits") where it cuts the groups exactly. */
        bool grouped = test_rng_chance(&c->r, 0.15);
        int groups = test_rng_int(&c->r, 2, 3);
        if (i) textf(buf, size, &len, ", ");
        if (n && grouped && dim % (groups * blocks) == 0) textf(buf, size, &len, "%d*", groups);
        if (n == 0) textf(buf, size, &len, "None");
        else if (n == 1) textf(buf, size, &len, "%s", md->names[axes[0]]);
        else textf(buf, size, &len, "(%s, %s)", md->names[axes[0]], md->names[axes[1]]);
    }
}

/* Random cases mark a tensor with probability p (the draws happen in both
 * copies). */
static void maybe_mark(eq_case *c, spmd_tensor *t, double p)
{
    if (!t || !c->random_marks || spmd_tensor_rank(t) == 0) return;
    bool yes = test_rng_chance(&c->r, p);
    char spec[128];
    random_spec(c, t, spec, sizeof spec);
    if (yes) mark(c, t, spec);
}

/* Random cases: now and then split dim `dim` of t (a table's or the
 * logits' vocabulary) over one axis or a pair, unevenly included, the
 * other dims whole.  The draws happen in both copies. */
static void maybe_split_vocab(eq_case *c, spmd_tensor *t, int dim, double p)
{
    if (!t || !c->random_marks || c->build_failed) return;
    bool yes = test_rng_chance(&c->r, p);
    int a = test_rng_int(&c->r, 0, c->md.rank - 1), b = test_rng_int(&c->r, 0, c->md.rank - 1);
    bool pair = a != b && test_rng_chance(&c->r, 0.3);
    if (!yes) return;
    char spec[128];
    size_t len = 0;
    spec[0] = '\0';
    for (int i = 0; i < spmd_tensor_rank(t); i++) {
        if (i) textf(spec, sizeof spec, &len, ", ");
        if (i != dim) textf(spec, sizeof spec, &len, "None");
        else if (pair) textf(spec, sizeof spec, &len, "(%s, %s)", c->md.names[a], c->md.names[b]);
        else textf(spec, sizeof spec, &len, "%s", c->md.names[a]);
    }
    mark(c, t, spec);
}

static const char *gen_name(gen k)
{
    static const char *const names[] = {"any", "weight", "pos", "gamma", "ids", "lr", "mask", "step"};
    return names[k];
}

static spmd_tensor *add_leaf(eq_case *c, spmd_tensor *t, gen kind, float scale, int32_t limit)
{
    if (!t) {
        build_fail(c, "leaf");
        return NULL;
    }
    if (c->n_leaves >= MAX_LEAVES) {
        build_fail(c, "too many leaves");
        return NULL;
    }
    c->leaves[c->n_leaves++] = (leaf){t, kind, scale, limit, NULL};
    char s[64];
    LOG(c, "  %s %s %s %s", spmd_tensor_is_param(t) ? "param" : "input", name_of(t),
        shape_str(t, s, sizeof s), gen_name(kind));
    if (kind == GEN_WEIGHT) LOG(c, " %.3g", (double)scale);
    if (kind == GEN_IDS) LOG(c, " < %d", (int)limit);
    LOG(c, "\n");
    return t;
}

/* A parameter; its init (checked against the mesh) is drawn too. */
static spmd_tensor *param(eq_case *c, int rank, const int64_t *dims, gen kind, float scale)
{
    if (c->build_failed) return NULL;
    char name[16];
    snprintf(name, sizeof name, "w%d", c->n_leaves);
    static const spmd_init_kind kinds[] = {SPMD_INIT_NORMAL, SPMD_INIT_UNIFORM, SPMD_INIT_ONES,
                                           SPMD_INIT_ZEROS};
    spmd_init init = {kinds[test_rng_int(&c->r, 0, 3)], test_rng_float(&c->r, 0.05f, 1.0f)};
    spmd_tensor *t = add_leaf(c, spmd_param(c->g, name, rank, dims, init), kind, scale, 0);
    maybe_mark(c, t, 0.6);
    return t;
}

static spmd_tensor *input_of(eq_case *c, int rank, const int64_t *dims, gen kind)
{
    if (c->build_failed) return NULL;
    char name[16];
    snprintf(name, sizeof name, "x%d", c->n_leaves);
    spmd_tensor *t = add_leaf(c, spmd_input(c->g, name, SPMD_F32, rank, dims), kind, 1, 0);
    maybe_mark(c, t, 0.6);
    return t;
}

static spmd_tensor *input(eq_case *c, int rank, const int64_t *dims)
{
    return input_of(c, rank, dims, GEN_ANY);
}

static spmd_tensor *ids_input(eq_case *c, int rank, const int64_t *dims, int32_t limit)
{
    if (c->build_failed) return NULL;
    char name[16];
    snprintf(name, sizeof name, "i%d", c->n_leaves);
    spmd_tensor *t = add_leaf(c, spmd_input(c->g, name, SPMD_I32, rank, dims), GEN_IDS, 1, limit);
    maybe_mark(c, t, 0.5);
    return t;
}

static void add_output(eq_case *c, spmd_tensor *t)
{
    if (!t || c->build_failed) return;
    for (int i = 0; i < c->n_out; i++)
        if (c->out[i] == t) return;
    if (c->n_out >= MAX_OUTS) return;
    if (spmd_graph_mark_output(c->g, t) != SPMD_OK) {
        build_fail(c, "mark_output");
        return;
    }
    c->out[c->n_out++] = t;
}

/* Name and log a new value; random cases sometimes mark it or keep it as
 * an output. */
static spmd_tensor *note(eq_case *c, spmd_tensor *t, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static spmd_tensor *note(eq_case *c, spmd_tensor *t, const char *fmt, ...)
{
    if (c->build_failed) return NULL;
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (!t) {
        build_fail(c, what);
        return NULL;
    }
    char name[16], s[64];
    snprintf(name, sizeof name, "h%d", c->n_inter++);
    if (spmd_tensor_set_name(t, name) != SPMD_OK) {
        build_fail(c, "set_name");
        return NULL;
    }
    LOG(c, "  %s %s = %s\n", name, shape_str(t, s, sizeof s), what);
    if (c->random_marks) {
        maybe_mark(c, t, 0.15);
        if (test_rng_chance(&c->r, 0.2)) add_output(c, t);
    }
    return t;
}

static int rank_of(const spmd_tensor *t) { return spmd_tensor_rank(t); }
static int64_t dim_of(const spmd_tensor *t, int i) { return spmd_tensor_dim(t, i); }

static void dims_of(const spmd_tensor *t, int64_t *dims)
{
    for (int i = 0; i < rank_of(t); i++) dims[i] = dim_of(t, i);
}

static void save(eq_case *c, spmd_tensor *t)
{
    if (!t) return;
    if (c->n_saved < MAX_SAVED) c->saved[c->n_saved++] = t;
    else c->saved[test_rng_int(&c->r, 0, MAX_SAVED - 1)] = t;
}

/* ---- Random graphs: ops on the current value x ------------------------------------------ */

/* Each op returns the new current value, or NULL when it does not apply
 * to x's shape (having drawn, but built nothing). */

static float fan_scale(int64_t fan_in) { return 1.2f / sqrtf((float)fan_in); }

static spmd_tensor *activate(eq_case *c, spmd_tensor *x)
{
    switch (test_rng_int(&c->r, 0, 6)) {
    case 0: return note(c, spmd_tanh(c->g, x), "tanh(%s)", name_of(x));
    case 1: return note(c, spmd_gelu(c->g, x), "gelu(%s)", name_of(x));
    case 2: return note(c, spmd_relu(c->g, x), "relu(%s)", name_of(x));
    case 3: return note(c, spmd_gelu_erf(c->g, x), "gelu_erf(%s)", name_of(x));
    case 4: return note(c, spmd_silu(c->g, x), "silu(%s)", name_of(x));
    default: return x;
    }
}

/* x [..., K] @ W: W [K, N] or [N, K]; maybe + b [N]; maybe an activation. */
static spmd_tensor *op_linear(eq_case *c, spmd_tensor *x)
{
    int r = rank_of(x);
    if (r < 2) return NULL;
    int64_t k = dim_of(x, r - 1), n = test_rng_int(&c->r, 2, 10);
    bool tb = test_rng_chance(&c->r, 0.5);
    spmd_tensor *w = param(c, 2, tb ? D(n, k) : D(k, n), GEN_WEIGHT, fan_scale(k));
    spmd_tensor *y = note(c, spmd_matmul(c->g, x, w, false, tb), "matmul(%s, %s, ta 0, tb %d)",
                          name_of(x), name_of(w), tb);
    if (test_rng_chance(&c->r, 0.5)) {
        spmd_tensor *b = param(c, 1, D(n), GEN_WEIGHT, 0.3f);
        y = note(c, spmd_add(c->g, y, b), "add(%s, %s)", name_of(y), name_of(b));
    }
    return activate(c, y);
}

/* The weight-gradient form: x [L..., M]^T @ y [L..., N] -> [M, N]. */
static spmd_tensor *op_matmul_ta(eq_case *c, spmd_tensor *x)
{
    int r = rank_of(x);
    if (r < 2) return NULL;
    int64_t lead = 1, dims[SPMD_MAX_RANK];
    dims_of(x, dims);
    for (int i = 0; i < r - 1; i++) lead *= dims[i];
    spmd_tensor *y;
    if (test_rng_chance(&c->r, 0.5)) {
        dims[r - 1] = test_rng_int(&c->r, 2, 8);
        y = input(c, r, dims);
    } else {
        int64_t k = dims[r - 1], n = test_rng_int(&c->r, 2, 8);
        spmd_tensor *w = param(c, 2, D(k, n), GEN_WEIGHT, fan_scale(k));
        y = note(c, spmd_tanh(c->g, spmd_matmul(c->g, x, w, false, false)), "tanh(matmul(%s, %s))",
                 name_of(x), name_of(w));
    }
    spmd_tensor *z = note(c, spmd_matmul(c->g, x, y, true, false), "matmul(%s, %s, ta 1, tb 0)",
                          name_of(x), name_of(y));
    return note(c, spmd_scale(c->g, z, 1.0f / (float)lead), "scale(%s, 1/%lld)", name_of(z),
                (long long)lead);
}

/* Both transposes: x [K, M]^T @ W [N, K]^T -> [M, N]. */
static spmd_tensor *op_matmul_tt(eq_case *c, spmd_tensor *x)
{
    if (rank_of(x) != 2) return NULL;
    int64_t k = dim_of(x, 0), n = test_rng_int(&c->r, 2, 9);
    spmd_tensor *w = param(c, 2, D(n, k), GEN_WEIGHT, fan_scale(k));
    spmd_tensor *y = note(c, spmd_matmul(c->g, x, w, true, true), "matmul(%s, %s, ta 1, tb 1)",
                          name_of(x), name_of(w));
    return activate(c, y);
}

/* bmm against a batched weight, or x against itself (scores, then a
 * softmax or a scale). */
static spmd_tensor *op_bmm(eq_case *c, spmd_tensor *x)
{
    int r = rank_of(x);
    if (r < 3) return NULL;
    int64_t dims[SPMD_MAX_RANK];
    dims_of(x, dims);
    bool ta = test_rng_chance(&c->r, 0.4), tb = test_rng_chance(&c->r, 0.5);
    int64_t k = ta ? dims[r - 2] : dims[r - 1];
    if (test_rng_chance(&c->r, 0.5)) {
        int64_t n = test_rng_int(&c->r, 2, 7);
        dims[r - 2] = tb ? n : k;
        dims[r - 1] = tb ? k : n;
        spmd_tensor *w = param(c, r, dims, GEN_WEIGHT, fan_scale(k));
        spmd_tensor *y = note(c, spmd_bmm(c->g, x, w, ta, tb), "bmm(%s, %s, ta %d, tb %d)",
                              name_of(x), name_of(w), ta, tb);
        return activate(c, y);
    }
    /* x with itself: contract the same dim on both sides. */
    bool tb2 = !ta;
    spmd_tensor *s = note(c, spmd_bmm(c->g, x, x, ta, tb2), "bmm(%s, %s, ta %d, tb %d)",
                          name_of(x), name_of(x), ta, tb2);
    s = note(c, spmd_scale(c->g, s, 1.0f / (float)k), "scale(%s, 1/%lld)", name_of(s),
             (long long)k);
    if (test_rng_chance(&c->r, 0.5)) s = note(c, spmd_softmax(c->g, s), "softmax(%s)", name_of(s));
    return s;
}

static spmd_tensor *op_unary(eq_case *c, spmd_tensor *x)
{
    switch (test_rng_int(&c->r, 0, 11)) {
    case 11: /* a stage transfer, a copy on a mesh without a stage axis */
        return note(c, spmd_stage_transfer(c->g, x, 0, 1), "stage_transfer(%s, 0, 1)", name_of(x));
    case 6: { /* sqrt, rsqrt or log of exp(tanh(x)), in [0.37, 2.72] */
        spmd_tensor *t = note(c, spmd_exp(c->g, spmd_tanh(c->g, x)), "exp(tanh(%s))", name_of(x));
        switch (test_rng_int(&c->r, 0, 2)) {
        case 0: return note(c, spmd_sqrt(c->g, t), "sqrt(%s)", name_of(t));
        case 1: return note(c, spmd_rsqrt(c->g, t), "rsqrt(%s)", name_of(t));
        default: return note(c, spmd_log(c->g, t), "log(%s)", name_of(t));
        }
    }
    case 0: return note(c, spmd_tanh(c->g, x), "tanh(%s)", name_of(x));
    case 1: return note(c, spmd_gelu(c->g, x), "gelu(%s)", name_of(x));
    case 2: return note(c, spmd_relu(c->g, x), "relu(%s)", name_of(x));
    case 3: {
        float s = test_rng_float(&c->r, -1.5f, 1.5f);
        return note(c, spmd_scale(c->g, x, s), "scale(%s, %g)", name_of(x), (double)s);
    }
    case 4: return note(c, spmd_neg(c->g, x), "neg(%s)", name_of(x));
    case 7: return note(c, spmd_gelu_erf(c->g, x), "gelu_erf(%s)", name_of(x));
    case 8: return note(c, spmd_silu(c->g, x), "silu(%s)", name_of(x));
    case 9: return note(c, spmd_sigmoid(c->g, x), "sigmoid(%s)", name_of(x));
    case 10: { /* integer powers of x, fractional ones of exp(tanh(x)) */
        static const float powers[] = {2.0f, 3.0f, 0.5f, -1.5f, 1.25f};
        int k = test_rng_int(&c->r, 0, 4);
        spmd_tensor *t = x;
        if (k >= 2) t = note(c, spmd_exp(c->g, spmd_tanh(c->g, x)), "exp(tanh(%s))", name_of(x));
        return note(c, spmd_pow_scalar(c->g, t, powers[k]), "pow_scalar(%s, %g)", name_of(t),
                    (double)powers[k]);
    }
    default: {
        spmd_tensor *t = note(c, spmd_tanh(c->g, x), "tanh(%s)", name_of(x));
        return note(c, spmd_exp(c->g, t), "exp(%s)", name_of(t));
    }
    }
}

/* where(mask, x, p) or where(mask, p, x): the mask an f32 0/1 or i32 0/1
 * input and p a parameter, each of a shape that broadcasts to x's
 * (trailing dims of x, some of them 1; maybe a scalar: masked_fill). */
static spmd_tensor *op_where(eq_case *c, spmd_tensor *x)
{
    int r = rank_of(x);
    int64_t md[SPMD_MAX_RANK], pd[SPMD_MAX_RANK];
    int km = test_rng_int(&c->r, 0, r), kp = test_rng_int(&c->r, 0, r);
    for (int i = 0; i < km; i++)
        md[i] = test_rng_chance(&c->r, 0.3) ? 1 : dim_of(x, r - km + i);
    for (int i = 0; i < kp; i++)
        pd[i] = test_rng_chance(&c->r, 0.3) ? 1 : dim_of(x, r - kp + i);
    spmd_tensor *m = test_rng_chance(&c->r, 0.3) ? ids_input(c, km, md, 2)
                                                  : input_of(c, km, md, GEN_MASK);
    spmd_tensor *p = param(c, kp, pd, GEN_WEIGHT, 0.5f);
    bool left = test_rng_chance(&c->r, 0.5);
    spmd_tensor *a = left ? p : x, *b = left ? x : p;
    return note(c, spmd_where(c->g, m, a, b), "where(%s, %s, %s)", name_of(m), name_of(a),
                name_of(b));
}

/* x op p with p a parameter of a broadcastable shape (trailing dims of x,
 * some of them 1; maybe a scalar), p sometimes on the left. */
static spmd_tensor *op_broadcast(eq_case *c, spmd_tensor *x)
{
    int r = rank_of(x);
    int k = test_rng_int(&c->r, 0, r);
    int64_t dims[SPMD_MAX_RANK];
    for (int i = 0; i < k; i++) {
        dims[i] = dim_of(x, r - k + i);
        if (test_rng_chance(&c->r, 0.3)) dims[i] = 1;
    }
    int op = test_rng_int(&c->r, 0, 3);
    bool left = op != 3 && test_rng_chance(&c->r, 0.3);
    spmd_tensor *p = param(c, k, dims, op == 3 ? GEN_POS : GEN_WEIGHT, op == 2 ? 1.0f : 0.5f);
    if (test_rng_chance(&c->r, 0.2)) { /* broadcast explicitly first */
        int64_t xd[SPMD_MAX_RANK];
        dims_of(x, xd);
        spmd_tensor *e = note(c, spmd_expand(c->g, p, r, xd), "expand(%s)", name_of(p));
        p = e;
    }
    spmd_tensor *a = left ? p : x, *b = left ? x : p;
    static const char *const names[] = {"add", "sub", "mul", "div"};
    spmd_tensor *y;
    switch (op) {
    case 0: y = spmd_add(c->g, a, b); break;
    case 1: y = spmd_sub(c->g, a, b); break;
    case 2: y = spmd_mul(c->g, a, b); break;
    default: y = spmd_div(c->g, a, b); break;
    }
    return note(c, y, "%s(%s, %s)", names[op], name_of(a), name_of(b));
}

/* x op (an earlier value of x's shape), or x / exp(tanh(earlier)). */
static spmd_tensor *op_branch(eq_case *c, spmd_tensor *x)
{
    spmd_tensor *cand[MAX_SAVED];
    int n = 0;
    for (int i = 0; i < c->n_saved; i++) {
        spmd_tensor *s = c->saved[i];
        bool same = s != x && rank_of(s) == rank_of(x);
        for (int d = 0; same && d < rank_of(x); d++) same = dim_of(s, d) == dim_of(x, d);
        if (same) cand[n++] = s;
    }
    int op = test_rng_int(&c->r, 0, 3);
    if (!n) return NULL;
    spmd_tensor *s = cand[test_rng_int(&c->r, 0, n - 1)];
    switch (op) {
    case 0: return note(c, spmd_add(c->g, x, s), "add(%s, %s)", name_of(x), name_of(s));
    case 1: return note(c, spmd_sub(c->g, s, x), "sub(%s, %s)", name_of(s), name_of(x));
    case 2: return note(c, spmd_mul(c->g, x, s), "mul(%s, %s)", name_of(x), name_of(s));
    default: {
        spmd_tensor *d = note(c, spmd_exp(c->g, spmd_tanh(c->g, s)), "exp(tanh(%s))", name_of(s));
        return note(c, spmd_div(c->g, x, d), "div(%s, %s)", name_of(x), name_of(d));
    }
    }
}

static void axes_str(uint32_t axes, char *buf, size_t size)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < 6; i++)
        if (axes >> i & 1) textf(buf, size, &len, "%s%d", len ? "," : "", i);
}

/* sum or mean over random axes: the reduced value, or x minus the mean
 * (keepdim, or over leading axes without it: both broadcast back). */
static spmd_tensor *op_reduce(eq_case *c, spmd_tensor *x)
{
    int r = rank_of(x);
    if (r < 1) return NULL;
    uint32_t axes = (uint32_t)test_rng_int(&c->r, 1, (1 << r) - 1);
    bool keep = test_rng_chance(&c->r, 0.5), mean = test_rng_chance(&c->r, 0.5);
    int form = test_rng_int(&c->r, 0, 2);
    char ax[32];
    if (form == 1) keep = true; /* x - m must broadcast */
    if (form == 2) { /* center over a leading prefix, no keepdim */
        int k = test_rng_int(&c->r, 1, r);
        axes = (1u << k) - 1;
        keep = false;
    }
    axes_str(axes, ax, sizeof ax);
    spmd_tensor *m = note(c, mean ? spmd_mean(c->g, x, axes, keep) : spmd_sum(c->g, x, axes, keep),
                          "%s(%s, axes {%s}, keepdim %d)", mean ? "mean" : "sum", name_of(x), ax,
                          keep);
    if (form == 0) {
        if (!m || rank_of(m) == 0) return NULL; /* nothing left to carry on with */
        if (!mean) {
            float s = 1.0f / (float)(spmd_tensor_numel(x) / spmd_tensor_numel(m));
            m = note(c, spmd_scale(c->g, m, s), "scale(%s, %g)", name_of(m), (double)s);
        }
        return m;
    }
    if (!mean && m) {
        float s = 1.0f / (float)(spmd_tensor_numel(x) / (spmd_tensor_numel(m) ? spmd_tensor_numel(m) : 1));
        m = note(c, spmd_scale(c->g, m, s), "scale(%s, %g)", name_of(m), (double)s);
    }
    return note(c, spmd_sub(c->g, x, m), "sub(%s, %s)", name_of(x), name_of(m));
}

static spmd_tensor *op_max(eq_case *c, spmd_tensor *x)
{
    int r = rank_of(x);
    if (r < 1) return NULL;
    int axis = test_rng_int(&c->r, 0, r - 1);
    bool keep = test_rng_chance(&c->r, 0.5), center = test_rng_chance(&c->r, 0.5);
    if (center) keep = true;
    spmd_tensor *m = note(c, spmd_max(c->g, x, axis, keep), "max(%s, axis %d, keepdim %d)",
                          name_of(x), axis, keep);
    if (!center) return m && rank_of(m) > 0 ? m : NULL;
    return note(c, spmd_sub(c->g, x, m), "sub(%s, %s)", name_of(x), name_of(m));
}

/* A running sum along a random axis, either way, scaled by 1/len to
 * keep the values' size. */
static spmd_tensor *op_cumsum(eq_case *c, spmd_tensor *x)
{
    int r = rank_of(x);
    if (r < 1) return NULL;
    int axis = test_rng_int(&c->r, 0, r - 1);
    bool reverse = test_rng_chance(&c->r, 0.5);
    spmd_tensor *y = note(c, spmd_cumsum(c->g, x, axis, reverse), "cumsum(%s, axis %d, reverse %d)",
                          name_of(x), axis, reverse);
    float s = 1.0f / (float)dim_of(x, axis);
    return note(c, spmd_scale(c->g, y, s), "scale(%s, %g)", name_of(y), (double)s);
}

static spmd_tensor *op_softmax(eq_case *c, spmd_tensor *x)
{
    int r = rank_of(x);
    if (r < 1 || dim_of(x, r - 1) < 2) return NULL;
    if (test_rng_chance(&c->r, 0.5)) return note(c, spmd_softmax(c->g, x), "softmax(%s)", name_of(x));
    return note(c, spmd_log_softmax(c->g, x), "log_softmax(%s)", name_of(x));
}

static spmd_tensor *op_layernorm(eq_case *c, spmd_tensor *x)
{
    int r = rank_of(x);
    if (r < 1 || dim_of(x, r - 1) < 3) return NULL;
    int64_t n = dim_of(x, r - 1);
    spmd_tensor *gamma = param(c, 1, D(n), GEN_GAMMA, 1);
    spmd_tensor *beta = param(c, 1, D(n), GEN_WEIGHT, 0.5f);
    /* eps bounds 1 / std: rows of nearly equal values (after a centering
     * or a max) would otherwise amplify rounding past the tolerance. */
    return note(c, spmd_layernorm(c->g, x, gamma, beta, 1e-2f), "layernorm(%s, %s, %s)",
                name_of(x), name_of(gamma), name_of(beta));
}

/* Causal attention on [B, T, C]: heads dividing C; q, k, v x itself or
 * projections of it. */
static spmd_tensor *op_attention(eq_case *c, spmd_tensor *x)
{
    if (rank_of(x) != 3) return NULL;
    int64_t ch = dim_of(x, 2);
    int divs[16], nd = 0;
    for (int h = 1; h <= ch && nd < 16; h++)
        if (ch % h == 0) divs[nd++] = h;
    int heads = divs[test_rng_int(&c->r, 0, nd - 1)];
    spmd_tensor *q = x, *k = x, *v = x;
    if (test_rng_chance(&c->r, 0.6)) {
        spmd_tensor **qkv[3] = {&q, &k, &v};
        for (int i = 0; i < 3; i++) {
            bool tb = test_rng_chance(&c->r, 0.5);
            spmd_tensor *w = param(c, 2, D(ch, ch), GEN_WEIGHT, fan_scale(ch));
            *qkv[i] = note(c, spmd_matmul(c->g, x, w, false, tb), "matmul(%s, %s, ta 0, tb %d)",
                           name_of(x), name_of(w), tb);
        }
    }
    return note(c, spmd_attention(c->g, q, k, v, heads), "attention(%s, %s, %s, heads %d)",
                name_of(q), name_of(k), name_of(v), heads);
}

/* x + embedding(table, ids) with ids over x's leading dims. */
static spmd_tensor *op_embed_add(eq_case *c, spmd_tensor *x)
{
    int r = rank_of(x);
    if (r < 2) return NULL;
    int64_t dims[SPMD_MAX_RANK];
    dims_of(x, dims);
    int32_t vocab = test_rng_int(&c->r, 2, 12);
    spmd_tensor *table = param(c, 2, D(vocab, dims[r - 1]), GEN_WEIGHT, 0.5f);
    maybe_split_vocab(c, table, 0, 0.3);
    spmd_tensor *ids = ids_input(c, r - 1, dims, vocab);
    spmd_tensor *e = note(c, spmd_embedding(c->g, table, ids), "embedding(%s, %s)", name_of(table),
                          name_of(ids));
    return note(c, spmd_add(c->g, x, e), "add(%s, %s)", name_of(x), name_of(e));
}

static spmd_tensor *op_reshape(eq_case *c, spmd_tensor *x)
{
    int r = rank_of(x);
    int64_t dims[SPMD_MAX_RANK], to[SPMD_MAX_RANK];
    dims_of(x, dims);
    int form = test_rng_int(&c->r, 0, 2), nr = 0;
    if (form == 0 && r >= 2) { /* merge two neighbours */
        int i = test_rng_int(&c->r, 0, r - 2);
        for (int d = 0; d < r; d++) {
            if (d == i + 1) to[nr - 1] *= dims[d];
            else to[nr++] = dims[d];
        }
    } else if (form == 1 && r < 5) { /* split a composite dim */
        int i = test_rng_int(&c->r, 0, r - 1);
        int64_t f = 0;
        for (int64_t q = 2; q < dims[i]; q++)
            if (dims[i] % q == 0 && (!f || test_rng_chance(&c->r, 0.5))) f = q;
        if (!f) return NULL;
        for (int d = 0; d < r; d++) {
            if (d == i) {
                to[nr++] = f;
                to[nr++] = dims[d] / f;
            } else {
                to[nr++] = dims[d];
            }
        }
    } else if (form == 2 && r >= 2) { /* flatten the leading dims */
        to[0] = 1;
        for (int d = 0; d < r - 1; d++) to[0] *= dims[d];
        to[1] = dims[r - 1];
        nr = 2;
        if (r == 2) return NULL;
    } else {
        return NULL;
    }
    char s[64];
    spmd_tensor *y = spmd_reshape(c->g, x, nr, to);
    return note(c, y, "reshape(%s, %s)", name_of(x), y ? shape_str(y, s, sizeof s) : "?");
}

static spmd_tensor *op_permute(eq_case *c, spmd_tensor *x)
{
    int r = rank_of(x);
    if (r < 2) return NULL;
    if (test_rng_chance(&c->r, 0.4)) {
        int a = test_rng_int(&c->r, 0, r - 1), b = test_rng_int(&c->r, 0, r - 2);
        if (b >= a) b++;
        return note(c, spmd_transpose(c->g, x, a, b), "transpose(%s, %d, %d)", name_of(x), a, b);
    }
    int perm[SPMD_MAX_RANK];
    for (int i = 0; i < r; i++) perm[i] = i;
    for (int i = r - 1; i > 0; i--) {
        int j = test_rng_int(&c->r, 0, i);
        int t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    char ps[32];
    size_t len = 0;
    ps[0] = '\0';
    for (int i = 0; i < r; i++) textf(ps, sizeof ps, &len, "%s%d", i ? " " : "", perm[i]);
    return note(c, spmd_permute(c->g, x, perm), "permute(%s, (%s))", name_of(x), ps);
}

static spmd_tensor *op_slice(eq_case *c, spmd_tensor *x)
{
    int r = rank_of(x);
    if (r < 1) return NULL;
    int axis = test_rng_int(&c->r, 0, r - 1);
    int64_t d = dim_of(x, axis);
    if (d < 3) return NULL;
    int64_t len = test_rng_int(&c->r, 2, (int)d - 1);
    int64_t start = test_rng_int(&c->r, 0, (int)(d - len));
    return note(c, spmd_slice(c->g, x, axis, start, len), "slice(%s, axis %d, %lld:+%lld)",
                name_of(x), axis, (long long)start, (long long)len);
}

/* concat of x with 1 or 2 of: f(x), a slice of x, a new input, an
 * earlier value that fits. */
static spmd_tensor *op_concat(eq_case *c, spmd_tensor *x)
{
    int r = rank_of(x);
    if (r < 1 || spmd_tensor_numel(x) > MAX_NUMEL / 3) return NULL;
    int axis = test_rng_int(&c->r, 0, r - 1);
    int n = test_rng_int(&c->r, 2, 3);
    spmd_tensor *parts[3] = {x};
    char desc[128];
    size_t len = 0;
    desc[0] = '\0';
    textf(desc, sizeof desc, &len, "%s", name_of(x));
    for (int j = 1; j < n; j++) {
        spmd_tensor *p = NULL;
        int kind = test_rng_int(&c->r, 0, 2);
        if (kind == 0) {
            p = note(c, spmd_tanh(c->g, x), "tanh(%s)", name_of(x));
        } else if (kind == 1 && dim_of(x, axis) >= 2) {
            int64_t l = test_rng_int(&c->r, 1, (int)dim_of(x, axis) - 1);
            p = note(c, spmd_slice(c->g, x, axis, 0, l), "slice(%s, axis %d, 0:+%lld)", name_of(x),
                     axis, (long long)l);
        } else {
            int64_t dims[SPMD_MAX_RANK];
            dims_of(x, dims);
            dims[axis] = test_rng_int(&c->r, 1, 5);
            p = input(c, r, dims);
        }
        parts[j] = p;
        textf(desc, sizeof desc, &len, ", %s", name_of(p));
    }
    if (c->build_failed) return NULL;
    return note(c, spmd_concat(c->g, parts, n, axis), "concat(%s; axis %d)", desc, axis);
}

/* dropout(x, p) keyed by a step fed as an input (a program run twice must
 * give the same bits; spmd_dropout's step state advances) and a site of
 * its own: each element's draw by its index in the whole tensor, however
 * x is split. */
static spmd_tensor *op_dropout(eq_case *c, spmd_tensor *x)
{
    static const float ps[] = {0.1f, 0.5f, 0.9f};
    float p = ps[test_rng_int(&c->r, 0, 2)];
    int site = test_rng_int(&c->r, 0, 99);
    spmd_tensor *step = input_of(c, 0, NULL, GEN_STEP);
    if (!step) return NULL;
    return note(c, ir_dropout(c->g, x, step, p, site), "dropout(%s, %g, step %s, site %d)",
                name_of(x), (double)p, name_of(step), site);
}

typedef spmd_tensor *(*op_fn)(eq_case *c, spmd_tensor *x);

static const struct {
    op_fn fn;
    int weight;
} ops[] = {
    {op_linear, 6},    {op_matmul_ta, 2}, {op_matmul_tt, 2}, {op_bmm, 3},      {op_unary, 4},
    {op_broadcast, 4}, {op_branch, 3},    {op_reduce, 3},    {op_max, 2},      {op_softmax, 2},
    {op_layernorm, 3}, {op_attention, 3}, {op_embed_add, 2}, {op_reshape, 3},  {op_permute, 3},
    {op_slice, 2},     {op_concat, 2},    {op_where, 2},     {op_dropout, 2},    {op_cumsum, 2},
};

static op_fn pick_op(eq_case *c)
{
    int total = 0;
    for (size_t i = 0; i < ARRAY_LEN(ops); i++) total += ops[i].weight;
    int w = test_rng_int(&c->r, 0, total - 1);
    for (size_t i = 0; i < ARRAY_LEN(ops); i++) {
        if (w < ops[i].weight) return ops[i].fn;
        w -= ops[i].weight;
    }
    return ops[0].fn;
}

/* A scalar loss term from value v. */
static spmd_tensor *loss_term(eq_case *c, spmd_tensor *v)
{
    int r = rank_of(v);
    int64_t dims[SPMD_MAX_RANK];
    dims_of(v, dims);
    /* Odds: mse 30%, cross entropy 12%, mean 29%, mean of v * R 29%.
     * (Cross entropy was rarer while the partitioner refused uneven rows;
     * the odds stay, so that every seed still draws the case it did.) */
    int u = test_rng_int(&c->r, 0, 99);
    int kind = u < 30 ? 0 : u < 42 ? 1 : u < 71 ? 2 : 3;
    if (r == 0) kind = 2;
    if (kind == 0) { /* mse against a target */
        spmd_tensor *y = input(c, r, dims);
        return note(c, spmd_mse(c->g, v, y), "mse(%s, %s)", name_of(v), name_of(y));
    }
    if (kind == 1 && r >= 2) { /* cross entropy of a projection */
        int64_t k = dims[r - 1];
        int32_t classes = test_rng_int(&c->r, 2, 8);
        bool tb = test_rng_chance(&c->r, 0.5);
        spmd_tensor *w = param(c, 2, tb ? D(classes, k) : D(k, classes), GEN_WEIGHT, fan_scale(k));
        spmd_tensor *logits = note(c, spmd_matmul(c->g, v, w, false, tb),
                                   "matmul(%s, %s, ta 0, tb %d)", name_of(v), name_of(w), tb);
        maybe_split_vocab(c, logits, r - 1, 0.35);
        spmd_tensor *t = ids_input(c, r - 1, dims, classes);
        return note(c, spmd_cross_entropy(c->g, logits, t), "cross_entropy(%s, %s)",
                    name_of(logits), name_of(t));
    }
    if (kind == 3 && r >= 1) { /* sum(v * R) / numel */
        spmd_tensor *y = input(c, r, dims);
        spmd_tensor *p = note(c, spmd_mul(c->g, v, y), "mul(%s, %s)", name_of(v), name_of(y));
        spmd_tensor *s = note(c, spmd_sum(c->g, p, (1u << r) - 1, false), "sum(%s, all)", name_of(p));
        float k = 1.0f / (float)spmd_tensor_numel(v);
        return note(c, spmd_scale(c->g, s, k), "scale(%s, %g)", name_of(s), (double)k);
    }
    if (r == 0) return v;
    return note(c, spmd_mean(c->g, v, (1u << r) - 1, false), "mean(%s, all)", name_of(v));
}

static void build_random(eq_case *c)
{
    /* The start: data [dims] or an embedding of ids. */
    int r = test_rng_int(&c->r, 0, 9) < 4 ? 2 : test_rng_int(&c->r, 0, 9) < 7 ? 3 : 4;
    int64_t dims[SPMD_MAX_RANK];
    for (int i = 0; i < r; i++) {
        dims[i] = test_rng_int(&c->r, 2, r == 2 ? 12 : r == 3 ? 8 : 5);
        if (test_rng_chance(&c->r, 0.04)) dims[i] = 1;
    }
    spmd_tensor *x;
    if (test_rng_chance(&c->r, 0.25)) {
        int32_t vocab = test_rng_int(&c->r, 2, 12);
        int64_t width = test_rng_int(&c->r, 2, 10);
        spmd_tensor *table = param(c, 2, D(vocab, width), GEN_WEIGHT, 1.0f);
        maybe_split_vocab(c, table, 0, 0.3);
        spmd_tensor *ids = ids_input(c, r - 1, dims, vocab);
        x = note(c, spmd_embedding(c->g, table, ids), "embedding(%s, %s)", name_of(table),
                 name_of(ids));
    } else {
        x = input(c, r, dims);
    }
    save(c, x);
    int steps = test_rng_int(&c->r, 2, 9);
    for (int s = 0; s < steps && !c->build_failed; s++) {
        for (int tries = 0; tries < 8 && !c->build_failed; tries++) {
            spmd_tensor *y = pick_op(c)(c, x);
            if (!y) continue;
            if (spmd_tensor_numel(y) > MAX_NUMEL) continue;
            x = y;
            save(c, x);
            break;
        }
    }
    if (c->build_failed) return;
    /* A loss over the last value and maybe an earlier one. */
    spmd_tensor *loss = loss_term(c, x);
    int extra = test_rng_int(&c->r, 0, 2);
    for (int i = 0; i < extra && c->n_saved && !c->build_failed; i++) {
        spmd_tensor *v = c->saved[test_rng_int(&c->r, 0, c->n_saved - 1)];
        spmd_tensor *t = loss_term(c, v);
        loss = note(c, spmd_add(c->g, loss, t), "add(%s, %s)", name_of(loss), name_of(t));
    }
    c->loss = loss;
}

/* ---- Meshes ------------------------------------------------------------------------------- */

static void random_mesh(eq_case *c)
{
    static const int shapes[][3] = {
        {1, 0, 0}, {2, 0, 0}, {3, 0, 0}, {4, 0, 0}, {5, 0, 0}, {6, 0, 0}, {7, 0, 0}, {8, 0, 0},
        {2, 2, 0}, {2, 3, 0}, {3, 2, 0}, {2, 4, 0}, {4, 2, 0}, {1, 8, 0}, {8, 1, 0}, {1, 4, 0},
        {2, 1, 0}, {2, 2, 2}, {1, 2, 4}, {2, 1, 2}, {2, 2, 2}, {2, 4, 0}, {4, 2, 0}, {2, 3, 1},
    };
    static const char *const names[] = {"data", "fsdp", "model", "tp", "dp", "x", "y",
                                        "z", "replica", "seq", "expert", "a1"};
    test_rng r = {test_mix64(c->seed ^ 0x6d657368ull)};
    const int *s = shapes[test_rng_int(&r, 0, (int)ARRAY_LEN(shapes) - 1)];
    mesh_desc *md = &c->md;
    memset(md, 0, sizeof *md);
    int n = 1;
    for (int a = 0; a < 3 && s[a]; a++) {
        md->shape[md->rank++] = s[a];
        n *= s[a];
    }
    int pick[ARRAY_LEN(names)];
    for (size_t i = 0; i < ARRAY_LEN(names); i++) pick[i] = (int)i;
    for (int a = 0; a < md->rank; a++) {
        int j = test_rng_int(&r, a, (int)ARRAY_LEN(names) - 1);
        int t = pick[a];
        pick[a] = pick[j];
        pick[j] = t;
        snprintf(md->names[a], sizeof md->names[a], "%s", names[pick[a]]);
    }
    for (int i = 0; i < n; i++) md->ids[i] = i;
    md->permuted = test_rng_chance(&r, 0.4);
    if (md->permuted)
        for (int i = n - 1; i > 0; i--) {
            int j = test_rng_int(&r, 0, i);
            int t = md->ids[i];
            md->ids[i] = md->ids[j];
            md->ids[j] = t;
        }
    c->threads = n * (test_rng_chance(&r, 0.3) ? 2 : 1);
}

static spmd_mesh *make_mesh(const mesh_desc *md)
{
    const char *names[3] = {md->names[0], md->names[1], md->names[2]};
    return spmd_mesh_create(md->rank, md->shape, names, md->permuted ? md->ids : NULL);
}

static void mesh_label(const mesh_desc *md, char *buf, size_t size)
{
    size_t len = 0, n = 1;
    buf[0] = '\0';
    for (int a = 0; a < md->rank; a++) {
        textf(buf, size, &len, "%s%d", a ? "x" : "", md->shape[a]);
        n *= (size_t)md->shape[a];
    }
    textf(buf, size, &len, " (");
    for (int a = 0; a < md->rank; a++) textf(buf, size, &len, "%s%s", a ? ", " : "", md->names[a]);
    textf(buf, size, &len, ")");
    if (md->permuted) {
        textf(buf, size, &len, " devices ");
        for (size_t i = 0; i < n; i++) textf(buf, size, &len, "%s%d", i ? "," : "", md->ids[i]);
    }
}

/* ---- Building both copies ----------------------------------------------------------------- */

static void reset_build(eq_case *c, bool apply)
{
    c->r.s = test_mix64(c->seed ^ 0x67726170680aull);
    c->apply_marks = apply;
    c->n_leaves = c->n_out = c->n_inter = c->n_marks = c->n_saved = 0;
    c->loss = NULL;
    c->sgd = false;
    c->build_failed = false;
    c->build_error[0] = '\0';
    c->log_len = c->specs_len = 0;
    c->log[0] = c->specs[0] = '\0';
    spmd_clear_error();
    c->g = spmd_graph_create(NULL);
    assert_non_null(c->g);
}

/* Build one copy: the graph, its loss, the backward pass and the outputs. */
static void build_copy(eq_case *c, bool apply)
{
    reset_build(c, apply);
    c->build(c);
    if (c->build_failed) return;
    if (!c->loss) {
        build_fail(c, "no loss");
        return;
    }
    add_output(c, c->loss);
    if (spmd_grad(c->g, c->loss) != SPMD_OK) {
        build_fail(c, "spmd_grad");
        return;
    }
    int n_leaves = c->n_leaves;
    for (int i = 0; i < n_leaves; i++) {
        spmd_tensor *t = c->leaves[i].t;
        if (!spmd_tensor_is_param(t)) continue;
        spmd_tensor *gr = spmd_tensor_grad(t);
        add_output(c, gr);
        /* A gradient laid out on its own (ZeRO-style reduce-scatters). */
        maybe_mark(c, gr, 0.25);
    }
    /* Some random cases also update the parameters (plain SGD). */
    if (c->random_marks && test_rng_chance(&c->r, 0.25)) {
        spmd_tensor *lr = add_leaf(c, spmd_input(c->g, "lr", SPMD_F32, 0, NULL), GEN_LR, 1, 0);
        if (!lr || spmd_sgd(c->g, lr) != SPMD_OK) {
            build_fail(c, "sgd");
            return;
        }
        LOG(c, "  sgd(lr)\n");
        c->sgd = true;
    }
    /* A graph with no marks at all still runs partitioned: replicated. */
    if (apply && c->n_marks == 0 && c->n_leaves > 0) {
        spmd_tensor *t = c->leaves[0].t;
        char spec[64];
        size_t len = 0;
        spec[0] = '\0';
        for (int i = 0; i < spmd_tensor_rank(t); i++) textf(spec, sizeof spec, &len, "%sNone", i ? ", " : "");
        if (spmd_tensor_rank(t) > 0) mark(c, t, spec);
    }
}

/* Host values per leaf, a function of the case seed and the leaf index. */
static void draw_values(eq_case *c)
{
    for (int i = 0; i < c->n_leaves; i++) {
        leaf *l = &c->leaves[i];
        int64_t n = spmd_tensor_numel(l->t);
        test_rng r = {test_mix64(c->seed * 31 + (uint64_t)i + 0x76616c75ull)};
        l->val = malloc((size_t)(n ? n : 1) * 4);
        assert_non_null(l->val);
        float *f = l->val;
        int32_t *ids = l->val;
        for (int64_t k = 0; k < n; k++) {
            switch (l->kind) {
            case GEN_ANY: f[k] = test_rng_float(&r, -1.0f, 1.0f); break;
            case GEN_WEIGHT: f[k] = test_rng_float(&r, -l->scale, l->scale); break;
            case GEN_POS: f[k] = test_rng_float(&r, 0.5f, 2.0f); break;
            case GEN_GAMMA: f[k] = test_rng_float(&r, 0.5f, 1.5f); break;
            case GEN_IDS: ids[k] = (int32_t)(test_rng_next(&r) % (uint64_t)l->limit); break;
            case GEN_LR: f[k] = test_rng_float(&r, 0.05f, 0.2f); break;
            case GEN_MASK: f[k] = (float)(test_rng_next(&r) % 2u); break;
            case GEN_STEP: f[k] = (float)(test_rng_next(&r) % 1000u); break;
            }
        }
    }
}

/* ---- Running and comparing -------------------------------------------------------------- */

typedef enum outcome { CASE_PASS, CASE_FAIL } outcome;

typedef struct report {
    char text[8192];
    size_t len;
} report;

#define REPORT(rep, ...) textf((rep)->text, sizeof (rep)->text, &(rep)->len, __VA_ARGS__)

static size_t nbytes(const spmd_tensor *t) { return (size_t)spmd_tensor_numel(t) * 4; }

/* Compare got against want; report the worst element. */
static bool compare(report *rep, const char *what, const spmd_tensor *t, const float *want,
                    const float *got)
{
    int64_t n = spmd_tensor_numel(t), worst = -1, bad = 0;
    double worst_excess = 0;
    for (int64_t i = 0; i < n; i++) {
        double w = want[i], g = got[i];
        double tol = ATOL + RTOL * fabs(w);
        double err = fabs(g - w);
        bool ok = err <= tol; /* NaN fails */
        if (ok) continue;
        bad++;
        double excess = isnan(err) ? INFINITY : err / tol;
        if (worst < 0 || excess > worst_excess) worst = i, worst_excess = excess;
    }
    if (!bad) return true;
    char s[64];
    REPORT(rep, "    %s %s %s: %lld of %lld elements off; worst at flat %lld: want %.9g got %.9g "
                "(|diff| %.3g, %.1fx the tolerance)\n",
           what, name_of(t), shape_str(t, s, sizeof s), (long long)bad, (long long)n,
           (long long)worst, (double)want[worst], (double)got[worst],
           fabs((double)got[worst] - (double)want[worst]), worst_excess);
    return false;
}

/* Long text straight to stdout (cmocka's print_message cuts lines short). */
static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stdout, fmt, ap);
    va_end(ap);
    fflush(stdout);
}

static void print_case(const eq_case *c, const char *outcome_text, const report *rep)
{
    char mt[256];
    mesh_label(&c->md, mt, sizeof mt);
    say("---- case seed %llu%s%s: %s\n", (unsigned long long)c->seed,
                  c->label ? ", " : "", c->label ? c->label : "", outcome_text);
    if (!c->label)
        say("  replay: SPMD_TEST_SEED=%llu SPMD_TEST_CASES=1 ./test_spmd_equiv\n",
                      (unsigned long long)c->seed);
    say("  mesh %s, %d threads\n  specs:\n%s  graph:\n%s", mt, c->threads,
                  c->specs[0] ? c->specs : "    (none)\n", c->log);
    if (rep && rep->len) say("%s", rep->text);
}

static bool trace; /* SPMD_TEST_VERBOSE=2: print each case before running it */

/* What the partitioned programs did, over all cases: a check that the
 * cases exercise the partitioner, printed with the summary. */
static struct {
    long ops[IR_OP_COUNT];
    long padded_leaves;
    long vocab_lookups, vocab_grads; /* over tables split on V */
} stats;

static void count_program(const spmd_program *p)
{
    const partition *part = executor_partition(p);
    if (!part) return;
    const spmd_graph *lg = part->local;
    for (int i = 0; i < lg->n_nodes; i++) {
        const spmd_tensor *t = lg->nodes[i];
        stats.ops[t->op]++;
        if (t->op == IR_EMBEDDING && t->attr.embed.global) stats.vocab_lookups++;
        if (t->op == IR_EMBEDDING_BACKWARD && t->attr.embed.global) stats.vocab_grads++;
    }
    for (int i = 0; i < part->g->n_nodes; i++) {
        const spmd_tensor *t = part->g->nodes[i];
        if (ir_op_is_leaf(t->op) && part->local_of[i] &&
            sharding_has_padding(&part->held[i], part->m, t->dims))
            stats.padded_leaves++;
    }
}

static outcome run_case(eq_case *c, bool verbose, int *n_outputs)
{
    c->mesh = make_mesh(&c->md);
    assert_non_null(c->mesh);
    report rep = {.len = 0};
    rep.text[0] = '\0';

    /* The one-device copy, then the partitioned copy (whose log is kept). */
    build_copy(c, false);
    if (c->build_failed) {
        print_case(c, "the test built a bad graph", NULL);
        fail_msg("case seed %llu: building the graph failed: %s", (unsigned long long)c->seed,
                 c->build_error);
    }
    spmd_graph *ga = c->g;
    int n_leaves = c->n_leaves, n_out = c->n_out;
    spmd_tensor *leaves_a[MAX_LEAVES], *out_a[MAX_OUTS];
    for (int i = 0; i < n_leaves; i++) leaves_a[i] = c->leaves[i].t;
    for (int i = 0; i < n_out; i++) out_a[i] = c->out[i];
    draw_values(c);
    void *vals[MAX_LEAVES];
    for (int i = 0; i < n_leaves; i++) vals[i] = c->leaves[i].val;

    build_copy(c, true);
    for (int i = 0; i < c->n_leaves && i < n_leaves; i++) c->leaves[i].val = vals[i];
    if (c->build_failed) {
        print_case(c, "the test built a bad graph", NULL);
        fail_msg("case seed %llu: building the marked graph failed: %s",
                 (unsigned long long)c->seed, c->build_error);
    }
    spmd_graph *gb = c->g;
    assert_int_equal(c->n_leaves, n_leaves);
    assert_int_equal(c->n_out, n_out);

    outcome result = CASE_PASS;
    if (trace) print_case(c, "running", NULL);
    spmd_compile_options oa = {.threads = 1, .seed = c->seed & 0xffff};
    spmd_compile_options ob = {.threads = c->threads, .seed = c->seed & 0xffff};
    spmd_program *pa = spmd_compile(ga, &oa);
    if (!pa) {
        print_case(c, "FAIL", NULL);
        fail_msg("case seed %llu: one-device compile failed: %s", (unsigned long long)c->seed,
                 spmd_last_error());
    }
    spmd_program *pb = spmd_compile(gb, &ob);
    float *want = NULL, *got = NULL, *again = NULL;
    if (!pb) {
        REPORT(&rep, "    partitioned compile failed (%s): %s\n",
               spmd_status_name(base_error_status()), spmd_last_error());
        result = CASE_FAIL;
        goto done;
    }
    count_program(pb);
    unsigned forms = c->expect & ~POOL_LOCAL;
    if ((program_forms(pb) & forms) != forms) {
        REPORT(&rep, "    the program lacks a form it must use (wanted 0x%x, found 0x%x)\n",
               forms, program_forms(pb));
        result = CASE_FAIL;
    }
    int not_local = pools_not_local(pb);
    if ((c->expect & POOL_LOCAL) && not_local) {
        REPORT(&rep, "    %d pooling op%s of the program pool%s no block of its own or read%s a "
               "collective's result\n", not_local, not_local == 1 ? "" : "s",
               not_local == 1 ? "s" : "", not_local == 1 ? "s" : "");
        result = CASE_FAIL;
    }
    if (trace) {
        say("  shardings after partitioning:\n");
        for (int i = 0; i < spmd_graph_tensor_count(gb); i++) {
            spmd_tensor *t = spmd_graph_tensor(gb, i);
            char sh[128], s[64];
            say("    #%d %s %s %s: %s\n", i, spmd_tensor_op_name(t), name_of(t),
                shape_str(t, s, sizeof s), spmd_get_sharding(t, sh, sizeof sh));
        }
    }
    if (spmd_program_devices(pb) != spmd_mesh_devices(c->mesh)) {
        REPORT(&rep, "    program runs on %d devices, the mesh has %d\n", spmd_program_devices(pb),
               spmd_mesh_devices(c->mesh));
        result = CASE_FAIL;
        goto done;
    }

    size_t most = 4;
    for (int i = 0; i < n_leaves; i++)
        if (nbytes(leaves_a[i]) > most) most = nbytes(leaves_a[i]);
    for (int i = 0; i < n_out; i++)
        if (nbytes(out_a[i]) > most) most = nbytes(out_a[i]);
    want = malloc(most);
    got = malloc(most);
    again = malloc(most);
    assert_true(want && got && again);

    /* Parameters start the same on any mesh, and write/read round-trips. */
    for (int i = 0; i < n_leaves; i++) {
        spmd_tensor *ta = leaves_a[i], *tb = c->leaves[i].t;
        if (!spmd_tensor_is_param(ta)) {
            assert_int_equal(spmd_program_set_input(pa, ta, c->leaves[i].val, nbytes(ta)), SPMD_OK);
            assert_int_equal(spmd_program_set_input(pb, tb, c->leaves[i].val, nbytes(tb)), SPMD_OK);
            continue;
        }
        assert_int_equal(spmd_program_read(pa, ta, want, nbytes(ta)), SPMD_OK);
        assert_int_equal(spmd_program_read(pb, tb, got, nbytes(tb)), SPMD_OK);
        if (memcmp(want, got, nbytes(ta)) != 0) {
            REPORT(&rep, "    initial values of %s differ from the one-device program's\n",
                   name_of(ta));
            compare(&rep, "init", ta, want, got);
            result = CASE_FAIL;
        }
        assert_int_equal(spmd_program_write(pa, ta, c->leaves[i].val, nbytes(ta)), SPMD_OK);
        assert_int_equal(spmd_program_write(pb, tb, c->leaves[i].val, nbytes(tb)), SPMD_OK);
        assert_int_equal(spmd_program_read(pb, tb, got, nbytes(tb)), SPMD_OK);
        if (memcmp(got, c->leaves[i].val, nbytes(tb)) != 0) {
            REPORT(&rep, "    %s does not read back what was written\n", name_of(tb));
            result = CASE_FAIL;
        }
    }

    if (spmd_program_run(pa) != SPMD_OK) {
        print_case(c, "FAIL", NULL);
        fail_msg("case seed %llu: one-device run failed: %s", (unsigned long long)c->seed,
                 spmd_last_error());
    }
    if (spmd_program_run(pb) != SPMD_OK) {
        REPORT(&rep, "    partitioned run failed: %s\n", spmd_last_error());
        result = CASE_FAIL;
        goto done;
    }
    float **first = calloc((size_t)n_out, sizeof *first);
    assert_non_null(first);
    for (int i = 0; i < n_out; i++) {
        spmd_tensor *ta = out_a[i], *tb = c->out[i];
        assert_int_equal(spmd_program_read(pa, ta, want, nbytes(ta)), SPMD_OK);
        assert_int_equal(spmd_program_read(pb, tb, got, nbytes(tb)), SPMD_OK);
        first[i] = malloc(nbytes(tb) ? nbytes(tb) : 1);
        assert_non_null(first[i]);
        memcpy(first[i], got, nbytes(tb));
        const char *what = tb == c->loss ? "loss" : strstr(name_of(tb), ".grad") ? "gradient" : "value";
        if (!compare(&rep, what, tb, want, got)) result = CASE_FAIL;
    }
    /* With SGD: the updated parameters agree; then the partitioned program
     * gets its starting values back for the second run. */
    float **updated = calloc((size_t)n_leaves, sizeof *updated);
    assert_non_null(updated);
    for (int i = 0; c->sgd && i < n_leaves; i++) {
        spmd_tensor *ta = leaves_a[i], *tb = c->leaves[i].t;
        if (!spmd_tensor_is_param(ta)) continue;
        updated[i] = malloc(nbytes(tb) ? nbytes(tb) : 1);
        assert_non_null(updated[i]);
        assert_int_equal(spmd_program_read(pa, ta, want, nbytes(ta)), SPMD_OK);
        assert_int_equal(spmd_program_read(pb, tb, updated[i], nbytes(tb)), SPMD_OK);
        if (!compare(&rep, "updated", tb, want, updated[i])) result = CASE_FAIL;
        assert_int_equal(spmd_program_write(pb, tb, c->leaves[i].val, nbytes(tb)), SPMD_OK);
    }
    /* Determinism: a second run gives the same bits. */
    if (spmd_program_run(pb) != SPMD_OK) {
        REPORT(&rep, "    second partitioned run failed: %s\n", spmd_last_error());
        result = CASE_FAIL;
    } else {
        for (int i = 0; i < n_out; i++) {
            spmd_tensor *tb = c->out[i];
            assert_int_equal(spmd_program_read(pb, tb, again, nbytes(tb)), SPMD_OK);
            if (memcmp(first[i], again, nbytes(tb)) != 0) {
                REPORT(&rep, "    %s differs bitwise between two runs\n", name_of(tb));
                result = CASE_FAIL;
            }
        }
        for (int i = 0; i < n_leaves; i++) {
            spmd_tensor *tb = c->leaves[i].t;
            if (!updated[i]) continue;
            assert_int_equal(spmd_program_read(pb, tb, again, nbytes(tb)), SPMD_OK);
            if (memcmp(updated[i], again, nbytes(tb)) != 0) {
                REPORT(&rep, "    updated %s differs bitwise between two runs\n", name_of(tb));
                result = CASE_FAIL;
            }
        }
    }
    for (int i = 0; i < n_out; i++) free(first[i]);
    free(first);
    for (int i = 0; i < n_leaves; i++) free(updated[i]);
    free(updated);
    *n_outputs += n_out;

done:
    if (result == CASE_FAIL) print_case(c, "FAIL", &rep);
    else if (verbose && result == CASE_PASS) print_case(c, "pass", NULL);
    free(want);
    free(got);
    free(again);
    spmd_program_free(pa);
    spmd_program_free(pb);
    spmd_graph_free(ga);
    spmd_graph_free(gb);
    for (int i = 0; i < n_leaves; i++) free(vals[i]);
    spmd_mesh_free(c->mesh);
    c->mesh = NULL;
    return result;
}

/* ---- Regression cases: minimized reproducers of bugs this test found ----------------------- */

/* loss = mean(v * v): a non-trivial adjoint for v. */
static void square_loss(eq_case *c, spmd_tensor *v)
{
    spmd_tensor *sq = note(c, spmd_mul(c->g, v, v), "mul(%s, %s)", name_of(v), name_of(v));
    c->loss = note(c, spmd_mean(c->g, sq, (1u << rank_of(sq)) - 1, false), "mean(%s, all)",
                   name_of(sq));
}

/* propagate.c, shard_operand_need: the gradient of a [1] bias is a
 * keepdim sum (partial over the batch axis) reshaped to [1]; the reshape
 * produced a pending sum but asked for its operand resolved, so the sum
 * was all-reduced twice (the gradient came out times the axis size). */
static void reg_reshape_of_partial(eq_case *c)
{
    spmd_tensor *x = input(c, 2, D(4, 6));
    spmd_tensor *b = param(c, 1, D(1), GEN_WEIGHT, 0.5f);
    spmd_tensor *w = param(c, 2, D(6, 8), GEN_WEIGHT, 0.4f);
    mark(c, w, "None, data");
    spmd_tensor *h = note(c, spmd_add(c->g, x, b), "add(%s, %s)", name_of(x), name_of(b));
    square_loss(c, note(c, spmd_matmul(c->g, h, w, false, false), "matmul(%s, %s)", name_of(h),
                        name_of(w)));
}

/* propagate.c, shard_produced: a marked reshape claimed to produce its
 * mark, but (y, tp) on [42, 7] carries back to the operand [6, 7, 7] only
 * as (y, None, None), 7 not splitting evenly over tp, so the local reshape
 * was given a block shape ([14, 4]) that did not hold its operand's
 * elements ([2, 7, 7]). */
static void reg_marked_reshape(eq_case *c)
{
    spmd_tensor *x = input(c, 3, D(6, 7, 7));
    spmd_tensor *h = note(c, spmd_tanh(c->g, x), "tanh(%s)", name_of(x));
    spmd_tensor *r = note(c, spmd_reshape(c->g, h, 2, D(42, 7)), "reshape(%s, [42, 7])", name_of(h));
    mark(c, r, "y, tp");
    add_output(c, r);
    spmd_tensor *w = param(c, 2, D(7, 3), GEN_WEIGHT, 0.4f);
    square_loss(c, note(c, spmd_matmul(c->g, r, w, false, false), "matmul(%s, %s)", name_of(r),
                        name_of(w)));
}

/* propagate.c, splittable (and signature.c, add_iter): with one channel
 * per head (granule 1) the channels of attention were split like any dim,
 * unevenly: 6 heads over 5 devices ran 6 / 5 = 1 head of 2 channels on
 * each. */
static void reg_attention_uneven_heads(eq_case *c)
{
    spmd_tensor *x = input(c, 3, D(2, 3, 6));
    mark(c, x, "None, None, replica");
    spmd_tensor *w = param(c, 2, D(6, 6), GEN_WEIGHT, 0.5f);
    spmd_tensor *q = note(c, spmd_matmul(c->g, x, w, false, false), "matmul(%s, %s)", name_of(x),
                          name_of(w));
    spmd_tensor *a = note(c, spmd_attention(c->g, q, x, x, 6), "attention(%s, %s, %s, heads 6)",
                          name_of(q), name_of(x), name_of(x));
    add_output(c, a);
    square_loss(c, a);
}

/* propagate.c, reshape_map: the mark (None, fsdp) on [2, 3] was carried
 * back to the operand's [6] as (fsdp), though a device's column of [2, 3]
 * is no stretch of [6]; the local reshape of (fsdp) then gave rows, not
 * the mark, and reshape_map could not say what it gave. */
static void reg_reshape_mark_minor_split(eq_case *c)
{
    spmd_tensor *x = input(c, 2, D(6, 4));
    spmd_tensor *w = param(c, 1, D(4), GEN_WEIGHT, 0.5f);
    spmd_tensor *h = note(c, spmd_mul(c->g, x, w), "mul(%s, %s)", name_of(x), name_of(w));
    spmd_tensor *r = note(c, spmd_reshape(c->g, h, 3, D(2, 3, 4)), "reshape(%s, [2, 3, 4])",
                          name_of(h));
    mark(c, r, "None, fsdp, None");
    add_output(c, r);
    square_loss(c, r);
}

/* KV-cache decoding, one step: T new rows written into the key and value
 * caches at a position read at run time, and attention of the new queries
 * over the caches.  The ops have no gradient, so the loss reads them
 * through inputs only.  `cache_spec`: how the caches are marked (NULL:
 * left to propagation, which gives them the new rows' sharding). */
static void decode_step(eq_case *c, int64_t B, int64_t T, int64_t S, int64_t C, int heads,
                        const char *rows_spec, const char *cache_spec)
{
    spmd_tensor *q = input(c, 3, D(B, T, C)), *k = input(c, 3, D(B, T, C));
    spmd_tensor *v = input(c, 3, D(B, T, C));
    spmd_tensor *kc = input(c, 3, D(B, S, C)), *vc = input(c, 3, D(B, S, C));
    spmd_tensor *pos = ids_input(c, 1, D(1), (int32_t)(S - T + 1));
    mark(c, q, rows_spec);
    mark(c, k, rows_spec);
    mark(c, v, rows_spec);
    if (cache_spec) mark(c, kc, cache_spec);
    spmd_tensor *k_all = note(c, spmd_cache_write(c->g, kc, k, pos), "cache_write(%s, %s, %s)",
                              name_of(kc), name_of(k), name_of(pos));
    spmd_tensor *v_all = note(c, spmd_cache_write(c->g, vc, v, pos), "cache_write(%s, %s, %s)",
                              name_of(vc), name_of(v), name_of(pos));
    spmd_tensor *a = note(c, spmd_cached_attention(c->g, q, k_all, v_all, pos, heads),
                          "cached_attention(%s, %s, %s, %s, heads %d)", name_of(q), name_of(k_all),
                          name_of(v_all), name_of(pos), heads);
    add_output(c, k_all);
    add_output(c, a);
    square_loss(c, a);
}

/* The batch over one axis, heads over the other: 2 of 4 heads each. */
static void reg_decode_batch_heads(eq_case *c)
{
    decode_step(c, 4, 1, 7, 8, 4, "data, None, tp", NULL);
}

/* A batch of 4 over 3 devices (padded rows), two new rows. */
static void reg_decode_uneven_batch(eq_case *c)
{
    decode_step(c, 4, 2, 9, 6, 2, "data, None, None", "data, None, None");
}

/* A cache split along its positions is gathered (a fallback): the
 * position is global. */
static void reg_decode_cache_split_on_positions(eq_case *c)
{
    decode_step(c, 2, 1, 9, 4, 2, "None, None, None", "None, data, None");
}

/* ---- Vocabulary parallelism: tables and logits split on V ---------------------------- */

/* loss = mean((embedding(table, ids) + x)^2), table [V, 6] marked
 * `table_spec`, ids [3, 4] marked `ids_spec` (NULL: left unmarked). */
static void vocab_embedding(eq_case *c, int64_t V, const char *table_spec, const char *ids_spec)
{
    spmd_tensor *table = param(c, 2, D(V, 6), GEN_WEIGHT, 0.8f);
    mark(c, table, table_spec);
    spmd_tensor *ids = ids_input(c, 2, D(3, 4), (int32_t)V);
    if (ids_spec) mark(c, ids, ids_spec);
    spmd_tensor *e = note(c, spmd_embedding(c->g, table, ids), "embedding(%s, %s)",
                          name_of(table), name_of(ids));
    add_output(c, e);
    spmd_tensor *x = input(c, 3, D(3, 4, 6));
    square_loss(c, note(c, spmd_add(c->g, e, x), "add(%s, %s)", name_of(e), name_of(x)));
}

static void vocab_embed_even(eq_case *c) { vocab_embedding(c, 8, "tp, None", NULL); }
/* 10 rows over 4 blocks (3, 3, 3, 1); the ids' 3 rows over 2 as well. */
static void vocab_embed_uneven(eq_case *c) { vocab_embedding(c, 10, "tp, None", "data, None"); }
static void vocab_embed_two_axes_even(eq_case *c) { vocab_embedding(c, 8, "(data, tp), None", NULL); }
/* 9 rows over 4 blocks of 3: the last block is all padding. */
static void vocab_embed_two_axes_uneven(eq_case *c) { vocab_embedding(c, 9, "(tp, data), None", NULL); }

/* cross_entropy(x @ w, targets): x [rows..., 5] marked `x_spec` (NULL:
 * unmarked), w [5, V] marked `w_spec`, so the logits split like both. */
static void vocab_ce(eq_case *c, int rank, const int64_t *rows, int64_t V, const char *x_spec,
                     const char *w_spec)
{
    int64_t dims[SPMD_MAX_RANK];
    memcpy(dims, rows, (size_t)(rank - 1) * sizeof *dims);
    dims[rank - 1] = 5;
    spmd_tensor *x = input(c, rank, dims);
    if (x_spec) mark(c, x, x_spec);
    spmd_tensor *w = param(c, 2, D(5, V), GEN_WEIGHT, 0.8f);
    mark(c, w, w_spec);
    spmd_tensor *logits = note(c, spmd_matmul(c->g, x, w, false, false), "matmul(%s, %s)",
                               name_of(x), name_of(w));
    add_output(c, logits);
    spmd_tensor *t = ids_input(c, rank - 1, rows, (int32_t)V);
    if (x_spec && rank == 2) mark(c, t, "data");
    c->loss = note(c, spmd_cross_entropy(c->g, logits, t), "cross_entropy(%s, %s)",
                   name_of(logits), name_of(t));
}

static void vocab_ce_even(eq_case *c) { vocab_ce(c, 2, D(6), 8, NULL, "None, tp"); }
/* 7 classes over 3 blocks (3, 3, 1). */
static void vocab_ce_uneven(eq_case *c) { vocab_ce(c, 2, D(5), 7, NULL, "None, tp"); }
/* Rows over data (5 over 2: a padding row), 7 classes over tp (3). */
static void vocab_ce_rows_uneven(eq_case *c) { vocab_ce(c, 2, D(5), 7, "data, None", "None, tp"); }
/* [3, 2] rows, the first over data; 5 classes over tp. */
static void vocab_ce_rows_3d(eq_case *c) { vocab_ce(c, 3, D(3, 2), 5, "data, None, None", "None, tp"); }
/* 6 classes over tp x data (4 blocks of 2: the last all padding). */
static void vocab_ce_two_axes(eq_case *c) { vocab_ce(c, 2, D(4), 6, NULL, "None, (tp, data)"); }

/* A tied language model: x = embedding(wte, ids) + pos, a layer, logits
 * = h wte^T, cross-entropy; wte [V, 6] marked `wte_spec`. */
static void vocab_tied_lm(eq_case *c, int64_t V, const char *wte_spec, const char *ids_spec)
{
    spmd_tensor *wte = param(c, 2, D(V, 6), GEN_WEIGHT, 0.8f);
    mark(c, wte, wte_spec);
    spmd_tensor *ids = ids_input(c, 2, D(3, 4), (int32_t)V);
    spmd_tensor *targets = ids_input(c, 2, D(3, 4), (int32_t)V);
    if (ids_spec) mark(c, ids, ids_spec), mark(c, targets, ids_spec);
    spmd_tensor *e = note(c, spmd_embedding(c->g, wte, ids), "embedding(%s, %s)", name_of(wte),
                          name_of(ids));
    spmd_tensor *pos = input(c, 3, D(3, 4, 6));
    spmd_tensor *x = note(c, spmd_add(c->g, e, pos), "add(%s, %s)", name_of(e), name_of(pos));
    spmd_tensor *w = param(c, 2, D(6, 6), GEN_WEIGHT, 0.5f);
    spmd_tensor *h = note(c, spmd_tanh(c->g, spmd_matmul(c->g, x, w, false, false)),
                          "tanh(matmul(%s, %s))", name_of(x), name_of(w));
    spmd_tensor *logits = note(c, spmd_matmul(c->g, h, wte, false, true), "matmul(%s, %s, tb 1)",
                               name_of(h), name_of(wte));
    add_output(c, logits);
    c->loss = note(c, spmd_cross_entropy(c->g, logits, targets), "cross_entropy(%s, %s)",
                   name_of(logits), name_of(targets));
}

static void vocab_tied_even(eq_case *c) { vocab_tied_lm(c, 8, "tp, None", NULL); }
/* 11 rows over 4 (3, 3, 3, 2), the batch of 3 over data. */
static void vocab_tied_uneven(eq_case *c) { vocab_tied_lm(c, 11, "tp, None", "data, None"); }

/* ---- Convolutions: fixed cases on meshes 2, 4 and 2x2 ----------------------------------- */

/* conv2d(x, w) with its attributes as text for the case's log. */
static spmd_tensor *conv(eq_case *c, spmd_tensor *x, spmd_tensor *w, spmd_conv2d_options o)
{
    return note(c, spmd_conv2d(c->g, x, w, &o), "conv2d(%s, %s, stride %d %d, pad %d %d, groups %d)",
                name_of(x), name_of(w), o.stride[0] ? o.stride[0] : 1, o.stride[1] ? o.stride[1] : 1,
                o.padding[0], o.padding[1], o.groups ? o.groups : 1);
}

/* x [N, 3, 6, 6] over `x_spec`, a 3x3 padded conv to 6 channels with w1
 * over `w1_spec`, tanh, and a strided conv to 4 channels with w2 over
 * `w2_spec`: a batch split convolves each device's images and leaves the
 * weight gradients pending sums over the batch; w1 over its output
 * channels gives channel-split activations, and w2 over its input
 * channels then a pending sum of y (Megatron's pair). */
static void conv_pair(eq_case *c, int64_t N, const char *x_spec, const char *w1_spec,
                      const char *w2_spec)
{
    spmd_tensor *x = input(c, 4, D(N, 3, 6, 6));
    if (x_spec) mark(c, x, x_spec);
    spmd_tensor *w1 = param(c, 4, D(6, 3, 3, 3), GEN_WEIGHT, 0.4f);
    if (w1_spec) mark(c, w1, w1_spec);
    spmd_tensor *w2 = param(c, 4, D(4, 6, 3, 3), GEN_WEIGHT, 0.3f);
    if (w2_spec) mark(c, w2, w2_spec);
    spmd_tensor *h = conv(c, x, w1, (spmd_conv2d_options){.padding = {1, 1}});
    h = note(c, spmd_tanh(c->g, h), "tanh(%s)", name_of(h));
    add_output(c, h);
    spmd_tensor *y = conv(c, h, w2, (spmd_conv2d_options){.stride = {2, 2}, .padding = {1, 0}});
    add_output(c, y);
    square_loss(c, y);
}

static void conv_batch(eq_case *c) { conv_pair(c, 4, "data, None, None, None", NULL, NULL); }
/* 5 images over 2 or 4: padding images, masked in the weight gradients' sums. */
static void conv_batch_uneven(eq_case *c) { conv_pair(c, 5, "data, None, None, None", NULL, NULL); }
static void conv_out_channels(eq_case *c) { conv_pair(c, 2, NULL, "tp, None, None, None", NULL); }
static void conv_in_channels(eq_case *c)
{
    conv_pair(c, 2, NULL, "tp, None, None, None", "None, tp, None, None");
}
static void conv_batch_and_channels(eq_case *c)
{
    conv_pair(c, 4, "data, None, None, None", "tp, None, None, None", "None, tp, None, None");
}
/* Rows split: gathered, each device convolving whole images. */
static void conv_rows(eq_case *c) { conv_pair(c, 2, "None, None, tp, None", NULL, NULL); }

/* A depthwise conv (8 channels, one each) between pointwise ones, the
 * channels over `spec`, and a 2-group conv whose channels split in whole
 * groups. */
static void conv_grouped(eq_case *c, const char *spec)
{
    spmd_tensor *x = input(c, 4, D(2, 8, 5, 5));
    mark(c, x, spec);
    spmd_tensor *dw = param(c, 4, D(8, 1, 3, 3), GEN_WEIGHT, 0.5f);
    spmd_tensor *gw = param(c, 4, D(8, 4, 3, 3), GEN_WEIGHT, 0.3f);
    spmd_tensor *pw = param(c, 4, D(3, 8, 1, 1), GEN_WEIGHT, 0.4f);
    spmd_tensor *h = conv(c, x, dw, (spmd_conv2d_options){.padding = {1, 1}, .groups = 8});
    h = conv(c, h, gw, (spmd_conv2d_options){.stride = {2, 1}, .padding = {1, 1}, .groups = 2});
    add_output(c, h);
    square_loss(c, conv(c, h, pw, (spmd_conv2d_options){0}));
}

static void conv_grouped_channels(eq_case *c) { conv_grouped(c, "None, tp, None, None"); }
static void conv_grouped_batch(eq_case *c) { conv_grouped(c, "data, tp, None, None"); }

/* ---- Pooling: batch and channels split need no communication --------------------------- */

/* x [N, C, 7, 5] marked `x_spec`, scaled and shifted per channel (w, b
 * [C, 1, 1] marked `w_spec`), then ResNet's max pool (3x3, stride 2,
 * padding 1) to [N, C, 4, 3], an average pool of that (3x3, stride 1,
 * padding 1 not counted), the adaptive average to 2x3, and MaxPool1d's
 * window on a row [N, C, 1, 5]; the loss reads the last three. */
static void pool_net(eq_case *c, int64_t N, int64_t C, const char *x_spec, const char *w_spec)
{
    spmd_tensor *x = input(c, 4, D(N, C, 7, 5));
    if (x_spec) mark(c, x, x_spec);
    spmd_tensor *w = param(c, 3, D(C, 1, 1), GEN_WEIGHT, 1.0f);
    spmd_tensor *b = param(c, 3, D(C, 1, 1), GEN_WEIGHT, 0.5f);
    if (w_spec) mark(c, w, w_spec), mark(c, b, w_spec);
    spmd_tensor *h = note(c, spmd_tanh(c->g, spmd_add(c->g, spmd_mul(c->g, x, w), b)),
                          "tanh(%s * %s + %s)", name_of(x), name_of(w), name_of(b));
    const spmd_pool2d stem = {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}};
    const spmd_pool2d avg = {.kernel = {3, 3}, .stride = {1, 1}, .padding = {1, 1}};
    const spmd_pool2d row = {.kernel = {1, 3}, .stride = {1, 2}, .padding = {0, 1},
                             .ceil_mode = true};
    spmd_tensor *m = note(c, spmd_max_pool2d(c->g, h, &stem), "max_pool2d(%s, 3x3 /2 pad 1)",
                          name_of(h));
    spmd_tensor *a = note(c, spmd_avg_pool2d(c->g, m, &avg), "avg_pool2d(%s, 3x3 /1 pad 1)",
                          name_of(m));
    spmd_tensor *r = note(c, spmd_slice(c->g, h, 2, 3, 1), "slice(%s, 2, 3, 1)", name_of(h));
    spmd_tensor *mr = note(c, spmd_max_pool2d(c->g, r, &row), "max_pool2d(%s, 1x3 /2 pad 1)",
                           name_of(r));
    spmd_tensor *ad = note(c, spmd_adaptive_avg_pool2d(c->g, h, 2, 3),
                           "adaptive_avg_pool2d(%s, 2x3)", name_of(h));
    add_output(c, m);
    add_output(c, ad);
    spmd_tensor *both = note(c, spmd_concat(c->g, (spmd_tensor *[]){a, ad}, 2, 2),
                             "concat(%s, %s, 2)", name_of(a), name_of(ad));
    square_loss(c, note(c, spmd_add(c->g, both, mr), "add(%s, %s)", name_of(both), name_of(mr)));
}

static void pool_batch(eq_case *c) { pool_net(c, 4, 3, "data, None, None, None", NULL); }
/* 6 channels over 4 blocks (2, 2, 2, 0). */
static void pool_channels(eq_case *c) { pool_net(c, 2, 6, "None, tp, None, None", "tp, None, None"); }
/* 3 rows of the batch over 2 (2, 1). */
static void pool_both(eq_case *c) { pool_net(c, 3, 4, "data, tp, None, None", "tp, None, None"); }
static void pool_channels_grouped(eq_case *c)
{
    pool_net(c, 2, 6, "None, 3*tp, None, None", "3*tp, None, None");
}
/* Rows split: every window reads across the blocks, so x is gathered. */
static void pool_rows(eq_case *c) { pool_net(c, 2, 3, "None, None, data, None", NULL); }

/* A pending sum through the averages: x [2, 3, 7, K] @ w [K, 5] with K
 * split leaves each device an addend, which avg_pool2d and
 * adaptive_avg_pool2d (linear) pool before it is summed. */
static void pool_pending_sum(eq_case *c)
{
    spmd_tensor *x = input(c, 4, D(2, 3, 7, 4));
    mark(c, x, "None, None, None, tp");
    spmd_tensor *w = param(c, 2, D(4, 5), GEN_WEIGHT, 0.6f);
    mark(c, w, "tp, None");
    spmd_tensor *y = note(c, spmd_matmul(c->g, x, w, false, false), "matmul(%s, %s)", name_of(x),
                          name_of(w));
    const spmd_pool2d avg = {.kernel = {3, 2}, .stride = {2, 1}, .padding = {1, 0},
                             .ceil_mode = true, .count_include_pad = true};
    spmd_tensor *a = note(c, spmd_avg_pool2d(c->g, y, &avg), "avg_pool2d(%s, 3x2 /2x1 pad 1x0)",
                          name_of(y));
    spmd_tensor *ad = note(c, spmd_adaptive_avg_pool2d(c->g, a, 3, 2),
                           "adaptive_avg_pool2d(%s, 3x2)", name_of(a));
    add_output(c, ad);
    square_loss(c, ad);
}

typedef struct regression {
    const char *label;
    int rank, shape[3];
    const char *names[3];
    build_fn build;
    unsigned expect; /* VOCAB_*, BN_* */
} regression;

static const regression vocab_cases[] = {
    {"vocab: embedding, table over 1 axis, even", 1, {2}, {"tp"}, vocab_embed_even,
     VOCAB_LOOKUP | VOCAB_GRAD},
    {"vocab: embedding, table over 1 axis, uneven", 2, {2, 4}, {"data", "tp"}, vocab_embed_uneven,
     VOCAB_LOOKUP | VOCAB_GRAD},
    {"vocab: embedding, table over 2 axes, even", 2, {2, 2}, {"data", "tp"},
     vocab_embed_two_axes_even, VOCAB_LOOKUP | VOCAB_GRAD},
    {"vocab: embedding, table over 2 axes, uneven", 2, {2, 2}, {"data", "tp"},
     vocab_embed_two_axes_uneven, VOCAB_LOOKUP | VOCAB_GRAD},
    {"vocab: cross entropy, even", 1, {4}, {"tp"}, vocab_ce_even, VOCAB_LOSS},
    {"vocab: cross entropy, uneven", 1, {3}, {"tp"}, vocab_ce_uneven, VOCAB_LOSS},
    {"vocab: cross entropy, rows split unevenly too", 2, {2, 3}, {"data", "tp"},
     vocab_ce_rows_uneven, VOCAB_LOSS},
    {"vocab: cross entropy, 3-d logits, rows split too", 2, {2, 2}, {"data", "tp"},
     vocab_ce_rows_3d, VOCAB_LOSS},
    {"vocab: cross entropy, over 2 axes", 2, {2, 2}, {"data", "tp"}, vocab_ce_two_axes, VOCAB_LOSS},
    {"vocab: tied embedding and LM head, even", 1, {2}, {"tp"}, vocab_tied_even,
     VOCAB_LOOKUP | VOCAB_GRAD | VOCAB_LOSS},
    {"vocab: tied embedding and LM head, uneven", 2, {2, 4}, {"data", "tp"}, vocab_tied_uneven,
     VOCAB_LOOKUP | VOCAB_GRAD | VOCAB_LOSS},
};

static const regression conv_cases[] = {
    {"conv: batch over 2", 1, {2}, {"data"}, conv_batch, 0},
    {"conv: batch over 4", 1, {4}, {"data"}, conv_batch, 0},
    {"conv: 5 images over 2", 1, {2}, {"data"}, conv_batch_uneven, 0},
    {"conv: 5 images over 4", 1, {4}, {"data"}, conv_batch_uneven, 0},
    {"conv: weight over output channels, 2", 1, {2}, {"tp"}, conv_out_channels, 0},
    {"conv: weight over output channels, 4", 1, {4}, {"tp"}, conv_out_channels, 0},
    {"conv: input channels over 2 (pending sum)", 1, {2}, {"tp"}, conv_in_channels, 0},
    {"conv: input channels over 4 (pending sum)", 1, {4}, {"tp"}, conv_in_channels, 0},
    {"conv: batch and channels, 2x2", 2, {2, 2}, {"data", "tp"}, conv_batch_and_channels, 0},
    {"conv: rows split, gathered", 1, {2}, {"tp"}, conv_rows, 0},
    {"conv: grouped, channels over 2", 1, {2}, {"tp"}, conv_grouped_channels, 0},
    {"conv: grouped, channels over 4", 1, {4}, {"tp"}, conv_grouped_channels, 0},
    {"conv: grouped, batch and channels, 2x2", 2, {2, 2}, {"data", "tp"}, conv_grouped_batch, 0},
};

/* ---- Batch normalisation over a split batch ------------------------------------------ */

/* A small convolution-free CNN step: x [N, C, H, W] marked `x_spec`, a
 * linear layer along W, BatchNorm2d in training mode (its batch
 * statistics kept as outputs: the global batch's), relu, a linear layer
 * to [N, 5], BatchNorm1d in training mode, then evaluation mode over
 * given running statistics.  Values and gradients must be one device's. */
static void bn_step(eq_case *c, const int64_t *xd, const char *x_spec)
{
    const int64_t n = xd[0], ch = xd[1], h = xd[2], w = xd[3];
    spmd_tensor *x = input(c, 4, xd);
    mark(c, x, x_spec);
    spmd_tensor *wl = param(c, 2, D(w, 4), GEN_WEIGHT, fan_scale(w));
    spmd_tensor *hl = note(c, spmd_matmul(c->g, x, wl, false, false), "matmul(%s, %s)",
                           name_of(x), name_of(wl));
    spmd_tensor *gamma = param(c, 1, D(ch), GEN_GAMMA, 1), *beta = param(c, 1, D(ch), GEN_WEIGHT, 0.5f);
    spmd_tensor *mean = NULL, *var = NULL;
    if (hl && spmd_batch_norm_stats(c->g, hl, &mean, &var) != SPMD_OK) build_fail(c, "batch_norm_stats");
    note(c, mean, "mean of %s", name_of(hl));
    note(c, var, "batch_norm_var(%s, %s)", name_of(hl), name_of(mean));
    add_output(c, mean);
    add_output(c, var);
    spmd_tensor *y = note(c, spmd_batch_norm(c->g, hl, mean, var, gamma, beta, 1e-5f),
                          "batch_norm(%s, %s, %s, %s, %s)", name_of(hl), name_of(mean),
                          name_of(var), name_of(gamma), name_of(beta));
    add_output(c, y);
    spmd_tensor *r = note(c, spmd_relu(c->g, y), "relu(%s)", name_of(y));
    spmd_tensor *flat = note(c, spmd_reshape(c->g, r, 2, D(n, ch * h * 4)), "reshape(%s)", name_of(r));
    spmd_tensor *w2 = param(c, 2, D(ch * h * 4, 5), GEN_WEIGHT, fan_scale(ch * h * 4));
    spmd_tensor *z = note(c, spmd_matmul(c->g, flat, w2, false, false), "matmul(%s, %s)",
                          name_of(flat), name_of(w2));
    spmd_tensor *m2 = NULL, *v2 = NULL;
    if (z && spmd_batch_norm_stats(c->g, z, &m2, &v2) != SPMD_OK) build_fail(c, "batch_norm_stats");
    spmd_tensor *g2 = param(c, 1, D(5), GEN_GAMMA, 1);
    spmd_tensor *y2 = note(c, spmd_batch_norm(c->g, z, m2, v2, g2, NULL, 1e-5f),
                           "batch_norm(%s, its statistics, %s)", name_of(z), name_of(g2));
    add_output(c, v2);
    spmd_tensor *rm = input(c, 1, D(5)), *rv = input_of(c, 1, D(5), GEN_POS);
    spmd_tensor *y3 = note(c, spmd_batch_norm(c->g, y2, rm, rv, NULL, NULL, 1e-5f),
                           "batch_norm(%s, %s, %s)", name_of(y2), name_of(rm), name_of(rv));
    square_loss(c, y3);
}

static void bn_batch_over_2(eq_case *c) { bn_step(c, D(4, 3, 2, 5), "data, None, None, None"); }
static void bn_batch_over_4(eq_case *c) { bn_step(c, D(8, 3, 2, 5), "data, None, None, None"); }
static void bn_batch_over_2x2(eq_case *c) { bn_step(c, D(8, 3, 2, 5), "(data, tp), None, None, None"); }
static void bn_batch_and_channels(eq_case *c) { bn_step(c, D(4, 4, 2, 5), "data, tp, None, None"); }
/* 5 rows over 3 devices (2, 2, 1): padding rows left out of the sums. */
static void bn_batch_uneven(eq_case *c) { bn_step(c, D(5, 3, 2, 5), "data, None, None, None"); }
/* The spatial rows split (3 over 2: padding) with the batch whole. */
static void bn_spatial_uneven(eq_case *c) { bn_step(c, D(4, 3, 3, 5), "None, None, data, None"); }

static const regression batch_norm_cases[] = {
    {"batch norm: batch over 2", 1, {2}, {"data"}, bn_batch_over_2, BN_VAR_SUM | BN_GRAD_SUM},
    {"batch norm: batch over 4", 1, {4}, {"data"}, bn_batch_over_4, BN_VAR_SUM | BN_GRAD_SUM},
    {"batch norm: batch over 2x2", 2, {2, 2}, {"data", "tp"}, bn_batch_over_2x2,
     BN_VAR_SUM | BN_GRAD_SUM},
    {"batch norm: batch over data, channels over tp", 2, {2, 2}, {"data", "tp"},
     bn_batch_and_channels, BN_VAR_SUM | BN_GRAD_SUM},
    {"batch norm: batch over 3, uneven", 1, {3}, {"data"}, bn_batch_uneven,
     BN_VAR_SUM | BN_GRAD_SUM},
    {"batch norm: spatial rows over 2, uneven", 1, {2}, {"data"}, bn_spatial_uneven, 0},
};

/* Sequence-split attention: x [2, 150, 8] split on the sequence over cp
 * (150 rows: several kernel blocks of 64, a device's block starting off
 * them, and over 4 devices a padded last block), q, k and v projections
 * of it, 2 heads; over tp the heads split too.  The keys and values are
 * gathered, the causal mask offset by each device's block, and dq, dk, dv
 * reduce-scattered. */
static void attention_over_cp(eq_case *c, const char *x_spec, const char *qkv_spec)
{
    spmd_tensor *x = input(c, 3, D(2, 150, 8));
    mark(c, x, x_spec);
    spmd_tensor *qkv[3];
    for (int i = 0; i < 3; i++) {
        spmd_tensor *w = param(c, 2, D(8, 8), GEN_WEIGHT, 0.5f);
        qkv[i] = note(c, spmd_matmul(c->g, x, w, false, false), "matmul(%s, %s)", name_of(x),
                      name_of(w));
        if (qkv_spec) mark(c, qkv[i], qkv_spec);
    }
    spmd_tensor *a = note(c, spmd_attention(c->g, qkv[0], qkv[1], qkv[2], 2),
                          "attention(%s, %s, %s, heads 2)", name_of(qkv[0]), name_of(qkv[1]),
                          name_of(qkv[2]));
    add_output(c, a);
    square_loss(c, a);
}

static void attn_cp(eq_case *c) { attention_over_cp(c, "None, cp, None", NULL); }
static void attn_data_cp(eq_case *c) { attention_over_cp(c, "data, cp, None", NULL); }
static void attn_cp_tensor(eq_case *c) { attention_over_cp(c, "None, cp, None", "None, cp, tp"); }

static const regression attention_cases[] = {
    {"attention: sequence over 2", 1, {2}, {"cp"}, attn_cp, 0},
    {"attention: sequence over 4, uneven", 1, {4}, {"cp"}, attn_cp, 0},
    {"attention: batch over data, sequence over cp", 2, {2, 2}, {"data", "cp"}, attn_data_cp, 0},
    {"attention: sequence over cp, heads over tp", 2, {2, 2}, {"cp", "tp"}, attn_cp_tensor, 0},
};

static const regression regressions[] = {
    {"marked reshape splitting a minor dim", 1, {3}, {"fsdp"}, reg_reshape_mark_minor_split, 0},
    {"attention heads split unevenly", 1, {5}, {"replica"}, reg_attention_uneven_heads, 0},
    {"marked reshape the operand cannot carry", 2, {2, 3}, {"tp", "y"}, reg_marked_reshape, 0},
    {"reshape of a pending sum", 1, {2}, {"data"}, reg_reshape_of_partial, 0},
    {"decoding: batch and heads split", 2, {2, 2}, {"data", "tp"}, reg_decode_batch_heads, 0},
    {"decoding: batch split unevenly", 1, {3}, {"data"}, reg_decode_uneven_batch, 0},
    {"decoding: cache split on positions", 1, {3}, {"data"}, reg_decode_cache_split_on_positions, 0},
};

static const regression pool_cases[] = {
    {"pool: batch over 2", 1, {2}, {"data"}, pool_batch, POOL_LOCAL},
    {"pool: channels over 4, unevenly", 1, {4}, {"tp"}, pool_channels, POOL_LOCAL},
    {"pool: batch and channels over 2x2", 2, {2, 2}, {"data", "tp"}, pool_both, POOL_LOCAL},
    {"pool: channels in 3 groups over 2", 1, {2}, {"tp"}, pool_channels_grouped, POOL_LOCAL},
    {"pool: rows split over 2, gathered", 1, {2}, {"data"}, pool_rows, 0},
    {"pool: a pending sum through the averages", 1, {2}, {"tp"}, pool_pending_sum, 0},
};

/* ---- The tests --------------------------------------------------------------------------- */

static uint64_t base_seed;
static int n_cases = DEFAULT_CASES;
static bool verbose;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Fixed cases run on their own meshes; returns how many failed. */
static int run_fixed(const regression *cases, size_t count, uint64_t first_seed)
{
    int failed = 0, outputs = 0;
    for (size_t i = 0; i < count; i++) {
        const regression *rg = &cases[i];
        eq_case *c = calloc(1, sizeof *c);
        assert_non_null(c);
        c->seed = first_seed + i;
        c->label = rg->label;
        c->build = rg->build;
        c->expect = rg->expect;
        c->md.rank = rg->rank;
        for (int a = 0; a < rg->rank; a++) {
            c->md.shape[a] = rg->shape[a];
            snprintf(c->md.names[a], sizeof c->md.names[a], "%s", rg->names[a]);
        }
        int n = 1;
        for (int a = 0; a < rg->rank; a++) n *= rg->shape[a];
        c->threads = n;
        if (run_case(c, verbose, &outputs) != CASE_PASS) failed++;
        free(c);
    }
    return failed;
}

static void test_regressions(void **state)
{
    (void)state;
    int failed = run_fixed(regressions, ARRAY_LEN(regressions), 1000);
    if (failed) fail_msg("%d of %zu regression cases failed", failed, ARRAY_LEN(regressions));
}

/* Tables and logits split over the vocabulary: the partitioner must use
 * the vocabulary-parallel forms, and they must compute what one device
 * computes. */
static void test_vocab_parallel(void **state)
{
    (void)state;
    int failed = run_fixed(vocab_cases, ARRAY_LEN(vocab_cases), 2000);
    if (failed) fail_msg("%d of %zu vocabulary cases failed", failed, ARRAY_LEN(vocab_cases));
}

/* Convolutions split over the batch, the channels and the rows compute
 * what one device computes. */
static void test_conv_parallel(void **state)
{
    (void)state;
    int failed = run_fixed(conv_cases, ARRAY_LEN(conv_cases), 3000);
    if (failed) fail_msg("%d of %zu convolution cases failed", failed, ARRAY_LEN(conv_cases));
}

/* Pooling split over the batch or the channels computes what one device
 * computes, no collective feeding a pooling op; a split of the rows is
 * gathered. */
static void test_pooling(void **state)
{
    (void)state;
    int failed = run_fixed(pool_cases, ARRAY_LEN(pool_cases), 3000);
    if (failed) fail_msg("%d of %zu pooling cases failed", failed, ARRAY_LEN(pool_cases));
}

/* Attention with its sequence split: values and gradients one device's. */
static void test_sequence_split_attention(void **state)
{
    (void)state;
    int failed = run_fixed(attention_cases, ARRAY_LEN(attention_cases), 3000);
    if (failed) fail_msg("%d of %zu attention cases failed", failed, ARRAY_LEN(attention_cases));
}

/* Batch normalisation over a split batch: the statistics are the global
 * batch's (all-reduced), values and gradients one device's. */
static void test_batch_norm(void **state)
{
    (void)state;
    int failed = run_fixed(batch_norm_cases, ARRAY_LEN(batch_norm_cases), 3000);
    if (failed) fail_msg("%d of %zu batch norm cases failed", failed, ARRAY_LEN(batch_norm_cases));
}

static void test_random_equivalence(void **state)
{
    (void)state;
    int passed = 0, failed = 0, outputs = 0;
    double t0 = now_s();
    for (int i = 0; i < n_cases; i++) {
        eq_case *c = calloc(1, sizeof *c);
        assert_non_null(c);
        c->seed = base_seed + (uint64_t)i;
        c->build = build_random;
        c->random_marks = true;
        random_mesh(c);
        switch (run_case(c, verbose, &outputs)) {
        case CASE_PASS: passed++; break;
        case CASE_FAIL: failed++; break;
        }
        free(c);
    }
    print_message("test_spmd_equiv: %d cases from seed %llu: %d passed, %d failed; %d outputs "
                  "compared; %.1f s\n",
                  n_cases, (unsigned long long)base_seed, passed, failed, outputs, now_s() - t0);
    say("  per-device ops emitted: %ld all_reduce, %ld all_gather, %ld reduce_scatter, "
        "%ld all_to_all, %ld shard_slice, %ld mask_padding, %ld pad; %ld padded leaves\n",
        stats.ops[IR_ALL_REDUCE], stats.ops[IR_ALL_GATHER], stats.ops[IR_REDUCE_SCATTER],
        stats.ops[IR_ALL_TO_ALL], stats.ops[IR_SHARD_SLICE], stats.ops[IR_MASK_PADDING],
        stats.ops[IR_PAD], stats.padded_leaves);
    say("  vocabulary-parallel: %ld lookups and %ld gradients over split tables, %ld losses and "
        "%ld loss gradients over split logits\n",
        stats.vocab_lookups, stats.vocab_grads, stats.ops[IR_VOCAB_CE_LOSS],
        stats.ops[IR_VOCAB_CE_BACKWARD]);
    if (failed)
        fail_msg("%d of %d cases differ from the one-device program (seeds printed above)",
                 failed, n_cases);
}

int main(void)
{
    base_seed = test_env_seed(DEFAULT_SEED);
    const char *cases = getenv("SPMD_TEST_CASES");
    if (cases && atoi(cases) > 0) n_cases = atoi(cases);
    const char *v = getenv("SPMD_TEST_VERBOSE");
    verbose = v && *v && strcmp(v, "0") != 0;
    trace = v && atoi(v) >= 2;
    print_message("test_spmd_equiv: seed %llu, %d cases (SPMD_TEST_SEED=%llu replays them; "
                  "SPMD_TEST_CASES sets the count)\n",
                  (unsigned long long)base_seed, n_cases, (unsigned long long)base_seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_regressions),
        cmocka_unit_test(test_vocab_parallel),
        cmocka_unit_test(test_conv_parallel),
        cmocka_unit_test(test_pooling),
        cmocka_unit_test(test_batch_norm),
        cmocka_unit_test(test_sequence_split_attention),
        cmocka_unit_test(test_random_equivalence),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
