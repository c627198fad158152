/*
 * Structural tests of the SPMD partitioner: a marked training step goes
 * in, the list of collectives the partitioner inserted comes out, and each
 * case asserts which collectives appear (kind, mesh axes, phase, count,
 * and which tensor they move).  Each case also runs the step: one SGD step
 * of the sharded program against the same model built without marks on
 * one device (loss and every updated parameter).
 *
 * Cases:
 *   FSDP inside replicas (mesh 4x2 replica,fsdp): one forward all-gather
 *     over fsdp per weight, a reduce-scatter over fsdp and an all-reduce
 *     over replica per gradient, half the parameter bytes per device.
 *   Plain data parallelism (mesh 8 data): one all-reduce per gradient,
 *     no all-gather.
 *   Batch only on replica, weights on fsdp: what the fsdp pairs exchange.
 *   A reshape that moves an axis to another dim (GShard's experts, mesh
 *     4x2 data,expert): one all-to-all, no fallback; one whose output is
 *     wanted whole: a gather, a fallback.
 *   Megatron tensor parallelism (mesh 2x4 data,model): one all-reduce over
 *     model forward and one backward per block (the first block's backward
 *     one merged into the first layer's gradient sum when that layer is
 *     linear; see check_megatron).
 * Every case prints its collectives (phase, kind, axes, bytes, the value
 * moved with its propagated sharding, the consumer) for the log.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ir/ir.h"
#include "mesh/mesh.h"
#include "mesh/sharding.h"
#include "runtime/executor.h"
#include "shard/partition.h"
#include "spmd/mesh.h"
#include "spmd/models.h"
#include "spmd/spmd.h"
#include "support_rng.h"

#define D(...) ((const int64_t[]){__VA_ARGS__})
#define RTOL 1e-5
#define ATOL 1e-6
#define LR 0.1f

/* ---- A training step, built twice ---------------------------------------------- */

typedef struct step {
    spmd_graph *g;
    spmd_tensor *loss, *lr;
} step;

/* Builds the model into s->g; marks only when m is non-NULL. */
typedef void (*build_fn)(step *s, const spmd_mesh *m, const void *cfg);

static void finish_step(step *s)
{
    assert_non_null(s->loss);
    assert_int_equal(spmd_graph_mark_output(s->g, s->loss), SPMD_OK);
    assert_int_equal(spmd_grad(s->g, s->loss), SPMD_OK);
    s->lr = spmd_input(s->g, "lr", SPMD_F32, 0, NULL);
    assert_non_null(s->lr);
    assert_int_equal(spmd_sgd(s->g, s->lr), SPMD_OK);
}

static void mark(step *s, spmd_tensor *t, const spmd_mesh *m, const char *spec)
{
    if (!m) return;
    if (spmd_mark_sharding(s->g, t, m, spec) != SPMD_OK)
        fail_msg("mark %s as \"%s\": %s", spmd_tensor_name(t), spec, spmd_last_error());
}

static spmd_program *compile_and_run(step *s)
{
    spmd_compile_options opts = {.threads = 8, .seed = 7};
    spmd_program *p = spmd_compile(s->g, &opts);
    if (!p) fail_msg("compile: %s", spmd_last_error());
    for (int i = 0; i < spmd_graph_tensor_count(s->g); i++) {
        spmd_tensor *t = spmd_graph_tensor(s->g, i);
        if (strcmp(spmd_tensor_op_name(t), "input") != 0) continue;
        assert_int_equal(spmd_tensor_dtype(t), SPMD_F32);
        int64_t n = spmd_tensor_numel(t);
        float *v = malloc((size_t)n * sizeof *v);
        assert_non_null(v);
        if (t == s->lr) v[0] = LR;
        else test_fill_by_name(spmd_tensor_name(t), v, n); /* alike in both builds */
        assert_int_equal(spmd_program_set_input(p, t, v, (size_t)n * sizeof *v), SPMD_OK);
        free(v);
    }
    if (spmd_program_run(p) != SPMD_OK) fail_msg("run: %s", spmd_last_error());
    return p;
}

static bool close_to(double got, double want) { return fabs(got - want) <= ATOL + RTOL * fabs(want); }

/* One SGD step of the sharded program (already run) against the unmarked
 * one-device model: loss and every updated parameter. */
static void check_numerics(spmd_program *sharded, const step *s, build_fn build, const void *cfg)
{
    step ref = {spmd_graph_create(NULL), NULL, NULL};
    assert_non_null(ref.g);
    build(&ref, NULL, cfg);
    spmd_program *one = compile_and_run(&ref);
    assert_int_equal(spmd_program_devices(one), 1);

    float got, want;
    assert_int_equal(spmd_program_read(sharded, s->loss, &got, sizeof got), SPMD_OK);
    assert_int_equal(spmd_program_read(one, ref.loss, &want, sizeof want), SPMD_OK);
    if (!close_to(got, want)) fail_msg("loss: sharded %.9g, one device %.9g", got, want);

    int checked = 0;
    assert_int_equal(spmd_graph_tensor_count(s->g), spmd_graph_tensor_count(ref.g));
    for (int i = 0; i < spmd_graph_tensor_count(s->g); i++) {
        spmd_tensor *t = spmd_graph_tensor(s->g, i), *r = spmd_graph_tensor(ref.g, i);
        if (!spmd_tensor_is_param(t)) continue;
        assert_string_equal(spmd_tensor_name(t), spmd_tensor_name(r));
        int64_t n = spmd_tensor_numel(t);
        float *a = malloc((size_t)n * sizeof *a), *b = malloc((size_t)n * sizeof *b);
        assert_non_null(a);
        assert_non_null(b);
        assert_int_equal(spmd_program_read(sharded, t, a, (size_t)n * sizeof *a), SPMD_OK);
        assert_int_equal(spmd_program_read(one, r, b, (size_t)n * sizeof *b), SPMD_OK);
        for (int64_t k = 0; k < n; k++)
            if (!close_to(a[k], b[k]))
                fail_msg("%s[%lld] after one step: sharded %.9g, one device %.9g",
                         spmd_tensor_name(t), (long long)k, a[k], b[k]);
        free(a);
        free(b);
        checked++;
    }
    assert_true(checked > 0);
    spmd_program_free(one);
    spmd_graph_free(ref.g);
}

/* ---- Reading the collectives ------------------------------------------------------ */

static const char *axes_text(const spmd_mesh *m, const mesh_axes *a, char *buf, size_t size)
{
    mesh_text t;
    mesh_text_init(&t, buf, size);
    mesh_text_add(&t, "[");
    mesh_text_axes(&t, m, a);
    mesh_text_add(&t, "]");
    return buf;
}

static const char *node_label(const spmd_graph *g, int id, char *buf, size_t size)
{
    if (id < 0) return snprintf(buf, size, "(output)"), buf;
    const spmd_tensor *t = spmd_graph_tensor(g, id);
    const char *name = spmd_tensor_name(t);
    if (name) snprintf(buf, size, "#%d %s '%s'", id, spmd_tensor_op_name(t), name);
    else snprintf(buf, size, "#%d %s", id, spmd_tensor_op_name(t));
    return buf;
}

static void print_colls(const char *title, const partition *pt)
{
    printf("%s: %d collectives, %d fallbacks\n", title, pt->n_colls, pt->n_fallbacks);
    for (int i = 0; i < pt->n_colls; i++) {
        const part_collective *c = &pt->colls[i];
        char axes[64], moved[96], user[96], spec[96];
        const shard_node *n = &pt->prop.nodes[c->tensor];
        printf("  %-8s %-14s %-16s %6lld B  %-34s (%s) -> %s\n", partition_phase_name(c->phase),
               partition_collective_name(c->kind), axes_text(pt->m, &c->axes, axes, sizeof axes),
               (long long)c->bytes, node_label(pt->g, c->tensor, moved, sizeof moved),
               sharding_format(&n->out, pt->m, spec, sizeof spec),
               node_label(pt->g, c->consumer, user, sizeof user));
    }
    for (int i = 0; i < pt->n_fallbacks; i++) {
        char moved[96], user[96];
        printf("  fallback %s -> %s\n", node_label(pt->g, pt->fallbacks[i].tensor, moved, sizeof moved),
               node_label(pt->g, pt->fallbacks[i].consumer, user, sizeof user));
    }
}

/* ---- Models ------------------------------------------------------------------------ */

typedef struct mlp_case {
    spmd_mlp_config cfg;
    int batch;
    const char *input_spec;   /* NULL: unmarked */
    const char *weight_spec;  /* NULL: unmarked */
    const char *bias_spec;    /* for biases whose size the fsdp axis divides */
    int bias_divisor;
} mlp_case;

static void build_mlp(step *s, const spmd_mesh *m, const void *arg)
{
    const mlp_case *c = arg;
    spmd_mlp_tensors t;
    assert_int_equal(spmd_mlp_build(s->g, &c->cfg, NULL, c->batch, &t), SPMD_OK);
    assert_int_equal(spmd_mlp_add_loss(s->g, SPMD_MLP_MSE, &t), SPMD_OK);
    if (c->input_spec) mark(s, t.input, m, c->input_spec);
    for (int i = 0; i <= c->cfg.layers; i++) {
        char name[48];
        snprintf(name, sizeof name, "fc.%d.weight", i);
        if (c->weight_spec) mark(s, spmd_graph_find(s->g, name), m, c->weight_spec);
        snprintf(name, sizeof name, "fc.%d.bias", i);
        spmd_tensor *b = spmd_graph_find(s->g, name);
        if (c->bias_spec && spmd_tensor_dim(b, 0) % c->bias_divisor == 0)
            mark(s, b, m, c->bias_spec);
    }
    s->loss = t.loss;
    finish_step(s);
}

typedef enum first_layer {
    FIRST_SCALE,       /* x = x0 * scale, scale [D] */
    FIRST_LINEAR,      /* x = x0 W0^T, W0 [D, D] */
    FIRST_GELU_LINEAR  /* x = gelu(x0 W0^T): its backward needs dx whole */
} first_layer;

typedef struct mega_case {
    int batch, dim, hidden, blocks;
    first_layer first; /* replicated, before the blocks */
} mega_case;

/* A replicated first layer, then per block x = gelu(x W1^T) W2^T with
 * W1 [H, D] split on its output features and W2 [D, H] on its input
 * features (Megatron-LM's column- then row-parallel pair); MSE loss. */
static void build_megatron(step *s, const spmd_mesh *m, const void *arg)
{
    const mega_case *c = arg;
    spmd_graph *g = s->g;
    spmd_init w_init = {SPMD_INIT_UNIFORM, 0.3f}, around1 = {SPMD_INIT_NORMAL, 1.0f};
    spmd_tensor *x0 = spmd_input(g, "input", SPMD_F32, 2, D(c->batch, c->dim));
    mark(s, x0, m, "data, None");
    spmd_tensor *x;
    if (c->first == FIRST_SCALE) {
        x = spmd_mul(g, x0, spmd_param(g, "scale", 1, D(c->dim), around1));
    } else {
        x = spmd_matmul(g, x0, spmd_param(g, "w0", 2, D(c->dim, c->dim), w_init), false, true);
        if (c->first == FIRST_GELU_LINEAR) x = spmd_gelu(g, x);
    }
    for (int b = 0; b < c->blocks; b++) {
        char name[32];
        snprintf(name, sizeof name, "block.%d.w1", b);
        spmd_tensor *w1 = spmd_param(g, name, 2, D(c->hidden, c->dim), w_init);
        snprintf(name, sizeof name, "block.%d.w2", b);
        spmd_tensor *w2 = spmd_param(g, name, 2, D(c->dim, c->hidden), w_init);
        mark(s, w1, m, "model, None");
        mark(s, w2, m, "None, model");
        x = spmd_matmul(g, spmd_gelu(g, spmd_matmul(g, x, w1, false, true)), w2, false, true);
    }
    spmd_tensor *targets = spmd_input(g, "targets", SPMD_F32, 2, D(c->batch, c->dim));
    s->loss = spmd_mse(g, x, targets);
    finish_step(s);
}

/* ---- Cases: the sharded step, compiled and run --------------------------------------- */

typedef struct sharded_case {
    spmd_mesh *m;
    step s;
    spmd_program *p;
    const partition *pt;
    int n_params;
    spmd_tensor *params[32];
    /* from_grad[k][id]: node id descends from (or is) params[k]'s gradient */
    bool *from_grad[32];
    bool *from_input; /* node id descends from an input other than lr */
} sharded_case;

static void case_open(sharded_case *c, const char *title, const char *shape, const char *axes,
                      build_fn build, const void *cfg)
{
    memset(c, 0, sizeof *c);
    c->m = spmd_mesh_parse(shape, axes);
    assert_non_null(c->m);
    c->s.g = spmd_graph_create(NULL);
    assert_non_null(c->s.g);
    build(&c->s, c->m, cfg);
    c->p = compile_and_run(&c->s);
    c->pt = executor_partition(c->p);
    assert_non_null(c->pt);
    print_colls(title, c->pt);

    const spmd_graph *g = c->s.g;
    int n = spmd_graph_tensor_count(g);
    c->from_input = calloc((size_t)n, sizeof *c->from_input);
    assert_non_null(c->from_input);
    for (int i = 0; i < n; i++) {
        const spmd_tensor *t = g->nodes[i];
        if (t->op == IR_INPUT) c->from_input[i] = t != c->s.lr;
        for (int j = 0; j < t->n_in; j++) c->from_input[i] |= c->from_input[t->in[j]->id];
    }
    for (int i = 0; i < n; i++) {
        spmd_tensor *t = g->nodes[i];
        if (!spmd_tensor_is_param(t)) continue;
        assert_true(c->n_params < 32);
        int k = c->n_params++;
        c->params[k] = t;
        c->from_grad[k] = calloc((size_t)n, sizeof *c->from_grad[k]);
        assert_non_null(c->from_grad[k]);
        spmd_tensor *grad = spmd_tensor_grad(t);
        assert_non_null(grad);
        /* Creation order is a topological order. */
        for (int v = grad->id; v < n; v++) {
            const spmd_tensor *u = g->nodes[v];
            c->from_grad[k][v] = v == grad->id;
            for (int j = 0; j < u->n_in; j++) c->from_grad[k][v] |= c->from_grad[k][u->in[j]->id];
        }
    }
}

static void case_close(sharded_case *c, build_fn build, const void *cfg)
{
    check_numerics(c->p, &c->s, build, cfg);
    for (int k = 0; k < c->n_params; k++) free(c->from_grad[k]);
    free(c->from_input);
    spmd_program_free(c->p);
    spmd_graph_free(c->s.g);
    spmd_mesh_free(c->m);
}

/* The parameter whose gradient collective i moves (or a value computed
 * from it: grad * lr, the updated parameter); -1 if none. */
static int grad_owner(const sharded_case *c, const part_collective *coll)
{
    int owner = -1;
    for (int k = 0; k < c->n_params; k++) {
        if (!c->from_grad[k][coll->tensor]) continue;
        assert_int_equal(owner, -1); /* a gradient never feeds another */
        owner = k;
    }
    return owner;
}

/* Do the collective's axes read exactly `names` ("fsdp", "replica,fsdp")? */
static bool axes_are(const spmd_mesh *m, const mesh_axes *a, const char *names)
{
    char buf[128];
    mesh_text t;
    mesh_text_init(&t, buf, sizeof buf);
    for (int i = 0; i < a->n; i++) mesh_text_add(&t, i ? ",%s" : "%s", m->names[a->axis[i]]);
    return strcmp(buf, names) == 0;
}

static bool uses_axis(const spmd_mesh *m, const mesh_axes *a, const char *name)
{
    for (int i = 0; i < a->n; i++)
        if (!strcmp(m->names[a->axis[i]], name)) return true;
    return false;
}

enum { ANY_PHASE = 7, FWD = 1 << PART_FORWARD, BWD = 1 << PART_BACKWARD, UPD = 1 << PART_UPDATE };

/* Collectives of `kind` (IR_OP_COUNT: any) over exactly `axes` (NULL:
 * any) in the phases of `phases` moving the gradient chain of param k
 * (k == -1: any tensor; k == -2: no gradient). */
static int count(const sharded_case *c, ir_op kind, const char *axes, int phases, int k)
{
    int n = 0;
    for (int i = 0; i < c->pt->n_colls; i++) {
        const part_collective *x = &c->pt->colls[i];
        if (kind != IR_OP_COUNT && x->kind != kind) continue;
        if (axes && !axes_are(c->m, &x->axes, axes)) continue;
        if (!(phases >> x->phase & 1)) continue;
        int owner = grad_owner(c, x);
        if (k == -2 ? owner != -1 : k >= 0 && owner != k) continue;
        n++;
    }
    return n;
}

static const char *param_name(const sharded_case *c, int k) { return spmd_tensor_name(c->params[k]); }

#define EXPECT_COUNT(got, want, ...)                                                           \
    do {                                                                                       \
        int got_ = (got), want_ = (want);                                                      \
        if (got_ != want_) {                                                                   \
            print_error(__VA_ARGS__);                                                          \
            fail_msg("  got %d, want %d", got_, want_);                                        \
        }                                                                                      \
    } while (0)

/* ---- 1. FSDP inside replicas ------------------------------------------------------------ */

/* The per-device bytes of every parameter, and of the resolved gradient
 * (what the replica all-reduce carries), against the unsharded model. */
static void expect_half_memory(const sharded_case *c, build_fn build, const void *cfg)
{
    step ref = {spmd_graph_create(NULL), NULL, NULL};
    build(&ref, NULL, cfg);
    spmd_compile_options opts = {.threads = 1, .seed = 7};
    spmd_program *one = spmd_compile(ref.g, &opts);
    assert_non_null(one);
    double whole = (double)spmd_program_persistent_bytes(one);
    double mine = (double)spmd_program_persistent_bytes(c->p);
    printf("  parameter bytes per device: %.0f of %.0f (%.3f)\n", mine, whole, mine / whole);
    if (fabs(mine / whole - 0.5) > 0.025)
        fail_msg("parameters per device: %.0f bytes of %.0f, want about half", mine, whole);
    double grads = 0;
    for (int i = 0; i < c->pt->n_colls; i++) {
        const part_collective *x = &c->pt->colls[i];
        if (x->kind == IR_ALL_REDUCE && grad_owner(c, x) >= 0) grads += (double)x->bytes;
    }
    printf("  resolved gradient bytes per device: %.0f of %.0f (%.3f)\n", grads, whole, grads / whole);
    if (fabs(grads / whole - 0.5) > 0.025)
        fail_msg("resolved gradients per device: %.0f bytes of %.0f, want about half", grads, whole);
    spmd_program_free(one);
    spmd_graph_free(ref.g);
}

static void check_fsdp(const char *title, const mlp_case *cfg)
{
    sharded_case c;
    case_open(&c, title, "4x2", "replica,fsdp", build_mlp, cfg);
    assert_int_equal(c.pt->n_fallbacks, 0);
    int marked = 0;
    for (int k = 0; k < c.n_params; k++) {
        const spmd_tensor *w = c.params[k];
        bool sharded = w->mark != NULL;
        marked += sharded;
        /* Forward: one all-gather over fsdp of the parameter itself.
         * Backward: gathered again (ZeRO-3) where the input gradient needs
         * it -- every weight matrix but the first layer's; biases never. */
        int gathers = 0, regathers = 0;
        for (int i = 0; i < c.pt->n_colls; i++) {
            const part_collective *x = &c.pt->colls[i];
            if (x->tensor != w->id) continue;
            if (x->kind != IR_ALL_GATHER || x->phase == PART_UPDATE || !axes_are(c.m, &x->axes, "fsdp"))
                fail_msg("%s: unexpected %s over %d axes in the %s phase", param_name(&c, k),
                         partition_collective_name(x->kind), x->axes.n, partition_phase_name(x->phase));
            if (x->phase == PART_FORWARD) gathers++;
            else regathers++;
        }
        EXPECT_COUNT(gathers, sharded ? 1 : 0, "%s: forward all-gathers over [fsdp]\n", param_name(&c, k));
        bool input_grad = w->rank == 2 && strcmp(param_name(&c, k), "fc.0.weight") != 0;
        EXPECT_COUNT(regathers, sharded && input_grad ? 1 : 0, "%s: backward all-gathers over [fsdp]\n",
                     param_name(&c, k));
        marked += sharded && input_grad;
        /* Gradient: reduce-scatter over fsdp into the parameter's shard,
         * then all-reduce over replica; nothing else. */
        if (sharded) {
            EXPECT_COUNT(count(&c, IR_REDUCE_SCATTER, "fsdp", BWD | UPD, k), 1,
                         "%s: gradient reduce-scatters over [fsdp]\n", param_name(&c, k));
            EXPECT_COUNT(count(&c, IR_ALL_REDUCE, "replica", BWD | UPD, k), 1,
                         "%s: gradient all-reduces over [replica]\n", param_name(&c, k));
            EXPECT_COUNT(count(&c, IR_OP_COUNT, NULL, ANY_PHASE, k), 2,
                         "%s: collectives on the gradient\n", param_name(&c, k));
        } else {
            /* A replicated parameter's gradient is summed over both axes at once. */
            EXPECT_COUNT(count(&c, IR_ALL_REDUCE, "replica,fsdp", BWD | UPD, k), 1,
                         "%s: gradient all-reduces over [replica, fsdp]\n", param_name(&c, k));
            EXPECT_COUNT(count(&c, IR_OP_COUNT, NULL, ANY_PHASE, k), 1,
                         "%s: collectives on the gradient\n", param_name(&c, k));
        }
    }
    /* No all-gather of anything but the marked parameters (forward, and
     * again in backward). */
    EXPECT_COUNT(count(&c, IR_ALL_GATHER, NULL, ANY_PHASE, -1), marked, "all-gathers in all\n");
    /* Besides those: only the loss, summed over every device. */
    for (int i = 0; i < c.pt->n_colls; i++) {
        const part_collective *x = &c.pt->colls[i];
        if (x->kind == IR_ALL_GATHER || grad_owner(&c, x) >= 0) continue;
        assert_int_equal(x->kind, IR_ALL_REDUCE);
        assert_int_equal(x->tensor, c.s.loss->id);
    }
    expect_half_memory(&c, build_mlp, cfg);
    case_close(&c, build_mlp, cfg);
}

static void test_fsdp_in_replicas(void **state)
{
    (void)state;
    mlp_case cfg = {{16, 32, 2, 8}, 16, "(replica, fsdp), None", "fsdp, None", "fsdp", 2};
    check_fsdp("fsdp in replicas (mesh 4x2)", &cfg);
}

/* An output size fsdp does not divide: fc.2.weight [5, 32] is split into
 * padded blocks of 3 rows, fc.2.bias [5] stays replicated. */
static void test_fsdp_in_replicas_uneven(void **state)
{
    (void)state;
    mlp_case cfg = {{16, 32, 2, 5}, 16, "(replica, fsdp), None", "fsdp, None", "fsdp", 2};
    check_fsdp("fsdp in replicas, 5 outputs (mesh 4x2)", &cfg);
}

/* ---- 2. Plain data parallelism ------------------------------------------------------------ */

static void test_data_parallel(void **state)
{
    (void)state;
    mlp_case cfg = {{16, 32, 2, 8}, 16, "data, None", NULL, NULL, 1};
    sharded_case c;
    case_open(&c, "data parallel (mesh 8)", "8", "data", build_mlp, &cfg);
    assert_int_equal(c.pt->n_fallbacks, 0);
    for (int k = 0; k < c.n_params; k++) {
        EXPECT_COUNT(count(&c, IR_ALL_REDUCE, "data", BWD | UPD, k), 1,
                     "%s: gradient all-reduces over [data]\n", param_name(&c, k));
        EXPECT_COUNT(count(&c, IR_OP_COUNT, NULL, ANY_PHASE, k), 1,
                     "%s: collectives on the gradient\n", param_name(&c, k));
    }
    EXPECT_COUNT(count(&c, IR_ALL_GATHER, NULL, ANY_PHASE, -1), 0, "all-gathers\n");
    /* The only other collective: the loss, read whole. */
    for (int i = 0; i < c.pt->n_colls; i++) {
        const part_collective *x = &c.pt->colls[i];
        if (grad_owner(&c, x) >= 0) continue;
        assert_int_equal(x->kind, IR_ALL_REDUCE);
        assert_int_equal(x->tensor, c.s.loss->id);
        assert_int_equal(x->consumer, -1);
    }
    EXPECT_COUNT(c.pt->n_colls, c.n_params + 1, "collectives in all\n");
    case_close(&c, build_mlp, &cfg);
}

/* A batch the mesh cannot split (4 rows over 9 devices: fewer rows than
 * blocks) leaves every device computing the whole batch: the input,
 * though marked split, is gathered whole, and that gather is a fallback,
 * counted and named like any other. */
static void test_unsplittable_batch_is_a_fallback(void **state)
{
    (void)state;
    mlp_case cfg = {{16, 32, 2, 8}, 4, "data, None", NULL, NULL, 1};
    sharded_case c;
    case_open(&c, "batch 4 over 9 devices (mesh 9)", "9", "data", build_mlp, &cfg);
    bool input_gathered = false;
    for (int i = 0; i < c.pt->n_fallbacks; i++) {
        const spmd_tensor *t = c.s.g->nodes[c.pt->fallbacks[i].tensor];
        if (t->op == IR_INPUT && !strcmp(spmd_tensor_name(t), "input")) input_gathered = true;
    }
    assert_true(input_gathered);
    assert_true(spmd_program_fallback_count(c.p) >= 1);
    /* The explain text (the library's, which the tool prints) lists it. */
    char line[256], *text = NULL;
    assert_int_equal(spmd_program_fallback(c.p, 0, line, sizeof line), SPMD_OK);
    assert_int_equal(spmd_program_explain(c.p, NULL, &text), SPMD_OK);
    assert_non_null(strstr(text, "spmd explain: graph, "));
    assert_non_null(strstr(text, line));
    free(text);
    assert_int_equal(spmd_program_explain(NULL, NULL, &text), SPMD_ERR_INVALID);
    assert_null(text);
    case_close(&c, build_mlp, &cfg);
}

/* GShard's experts, backward: the gradient of [E, G, C, M] comes as
 * [E, G, C, M, 1] split on G over (data, expert), and the reshape that
 * drops the 1 is wanted as E over expert, G over data.  The reshape
 * could carry either; moving 'expert' from G to E is one all-to-all and
 * nothing is gathered whole, so it is no fallback.  A reshape whose
 * output is wanted whole gathers its operand: that one is. */
static spmd_program *experts_reshape(const spmd_mesh *m, const char *out_spec, spmd_graph **g)
{
    *g = spmd_graph_create(NULL);
    spmd_tensor *x = spmd_input(*g, "x", SPMD_F32, 5, D(4, 8, 4, 16, 1));
    assert_non_null(x);
    assert_int_equal(spmd_mark_sharding(*g, x, m, "None, (data, expert), None, None, None"), SPMD_OK);
    spmd_tensor *y = spmd_reshape(*g, x, 4, D(4, 8, 4, 16));
    assert_non_null(y);
    assert_int_equal(spmd_mark_sharding(*g, y, m, out_spec), SPMD_OK);
    assert_int_equal(spmd_graph_mark_output(*g, y), SPMD_OK);
    spmd_program *p = spmd_compile(*g, &(spmd_compile_options){.threads = 8});
    if (!p) fail_msg("compile: %s", spmd_last_error());
    float v[4 * 8 * 4 * 16], back[4 * 8 * 4 * 16];
    for (int i = 0; i < 4 * 8 * 4 * 16; i++) v[i] = (float)i;
    assert_int_equal(spmd_program_set_input(p, x, v, sizeof v), SPMD_OK);
    assert_int_equal(spmd_program_run(p), SPMD_OK);
    assert_int_equal(spmd_program_read(p, y, back, sizeof back), SPMD_OK);
    assert_memory_equal(v, back, sizeof v);
    return p;
}

static void test_reshape_moving_an_axis_is_no_fallback(void **state)
{
    (void)state;
    spmd_mesh *m = spmd_mesh_parse("4x2", "data,expert");
    spmd_graph *g;
    spmd_program *p = experts_reshape(m, "expert, data, None, None", &g);
    const partition *pt = executor_partition(p);
    print_colls("reshape to the experts' layout (mesh 4x2)", pt);
    assert_int_equal(pt->n_fallbacks, 0);
    assert_int_equal(pt->n_colls, 1);
    assert_int_equal(pt->colls[0].kind, IR_ALL_TO_ALL);
    assert_true(axes_are(m, &pt->colls[0].axes, "expert"));
    spmd_program_free(p);
    spmd_graph_free(g);

    p = experts_reshape(m, "None, None, None, None", &g);
    pt = executor_partition(p);
    print_colls("reshape to a whole output (mesh 4x2)", pt);
    assert_int_equal(pt->n_fallbacks, 1);
    assert_int_equal(pt->fallbacks[0].tensor, spmd_graph_find(g, "x")->id);
    spmd_program_free(p);
    spmd_graph_free(g);
    spmd_mesh_free(m);
}

/* ---- 3. Batch on replica only, weights on fsdp ---------------------------------------------- */

/* With the batch not split over fsdp, the fsdp pairs hold the same rows:
 * they act as a tensor-parallel group.  Weights marked on their output
 * features make fc.0 column-parallel; later layers get the activations
 * split on their input features, so the pair exchanges activations
 * (partial sums of matmul outputs, reduce-scattered) and, in the backward
 * pass, activation gradients; weights stay split (realigned by
 * all-to-all) and are never gathered whole. */
static void test_replica_input_fsdp_weights(void **state)
{
    (void)state;
    mlp_case cfg = {{16, 32, 2, 8}, 16, "replica, None", "fsdp, None", "fsdp", 2};
    sharded_case c;
    case_open(&c, "batch on replica, weights on fsdp (mesh 4x2)", "4x2", "replica,fsdp",
              build_mlp, &cfg);
    assert_int_equal(c.pt->n_fallbacks, 0);
    int acts[3] = {0}, weights = 0;
    for (int i = 0; i < c.pt->n_colls; i++) {
        const part_collective *x = &c.pt->colls[i];
        if (!uses_axis(c.m, &x->axes, "fsdp")) continue;
        const spmd_tensor *t = c.s.g->nodes[x->tensor];
        if (spmd_tensor_is_param(t)) {
            weights++;
            if (x->kind == IR_ALL_GATHER) fail_msg("%s is gathered whole", spmd_tensor_name(t));
        } else if (c.from_input[x->tensor] && grad_owner(&c, x) < 0 && x->tensor != c.s.loss->id) {
            acts[x->phase]++;
        }
    }
    printf("  over fsdp: %d on activations forward, %d backward; %d on weights\n",
           acts[PART_FORWARD], acts[PART_BACKWARD], weights);
    assert_true(acts[PART_FORWARD] > 0);
    assert_true(acts[PART_BACKWARD] > 0);
    /* Gradients come out in the parameters' fsdp split: only the replica
     * sum is left for them. */
    for (int k = 0; k < c.n_params; k++)
        EXPECT_COUNT(count(&c, IR_ALL_REDUCE, "replica", BWD | UPD, k), 1,
                     "%s: gradient all-reduces over [replica]\n", param_name(&c, k));
    case_close(&c, build_mlp, &cfg);
}

/* ---- 4. Megatron tensor parallelism --------------------------------------------------------- */

static const char *first_name(first_layer f)
{
    return f == FIRST_SCALE ? "x0 * scale" : f == FIRST_LINEAR ? "x0 W0^T" : "gelu(x0 W0^T)";
}

/*
 * Per block: the column-parallel W1 needs its input whole (no collective:
 * the input is replicated over model), the row-parallel W2 leaves a sum
 * over model, all-reduced once in the forward pass; in the backward pass
 * the block's input gradient is such a sum too, all-reduced once.
 *
 * Except where nothing needs that input gradient whole: after a linear
 * first layer (x0 * scale, x0 W0^T) the first block's input gradient only
 * feeds the first layer's weight gradient, which is linear in it.  The
 * pending sum over model then stays pending into that gradient and is
 * resolved together with its data-parallel sum: one all-reduce over
 * (data, model) instead of one over model on [B/data, D] plus one over
 * data on the gradient.  Any SPMD system that defers sums (GSPMD's
 * partial shardings) may do the same.  With gelu after the first layer
 * the gradient is needed whole and the model all-reduce is there.
 */
static void check_megatron(int blocks, first_layer first)
{
    mega_case cfg = {8, 16, 64, blocks, first};
    char title[96];
    snprintf(title, sizeof title, "megatron, %d block%s after %s (mesh 2x4)", blocks,
             blocks > 1 ? "s" : "", first_name(first));
    sharded_case c;
    case_open(&c, title, "2x4", "data,model", build_megatron, &cfg);
    assert_int_equal(c.pt->n_fallbacks, 0);
    bool deferred = first != FIRST_GELU_LINEAR;
    EXPECT_COUNT(count(&c, IR_ALL_REDUCE, "model", FWD, -2), blocks,
                 "%s: forward all-reduces over [model]\n", title);
    EXPECT_COUNT(count(&c, IR_ALL_REDUCE, "model", BWD, -2), deferred ? blocks - 1 : blocks,
                 "%s: backward all-reduces over [model]\n", title);
    /* Forward, each sums the row-parallel product x W2^T of a block. */
    for (int i = 0; i < c.pt->n_colls; i++) {
        const part_collective *x = &c.pt->colls[i];
        if (x->phase != PART_FORWARD || !axes_are(c.m, &x->axes, "model")) continue;
        const spmd_tensor *t = c.s.g->nodes[x->tensor];
        const char *w = t->op == IR_MATMUL ? spmd_tensor_name(t->in[1]) : NULL;
        if (!w || !strstr(w, ".w2")) fail_msg("%s: forward all-reduce over model of #%d", title, t->id);
    }
    /* No other collective over model alone: no gathered weights, no
     * resharded activations. */
    EXPECT_COUNT(count(&c, IR_OP_COUNT, "model", ANY_PHASE, -1), deferred ? 2 * blocks - 1 : 2 * blocks,
                 "%s: collectives over [model] in all\n", title);
    for (int i = 0; i < c.pt->n_colls; i++) {
        const part_collective *x = &c.pt->colls[i];
        if (uses_axis(c.m, &x->axes, "model") && x->kind != IR_ALL_REDUCE)
            fail_msg("%s: a %s over model", title, partition_collective_name(x->kind));
    }
    /* Gradients: the first layer's (replicated) over data, with the
     * deferred model sum when there is one; the blocks' (split over
     * model) over data. */
    for (int k = 0; k < c.n_params; k++) {
        bool first_param = k == 0;
        const char *axes = first_param && deferred ? "data,model" : "data";
        EXPECT_COUNT(count(&c, IR_ALL_REDUCE, axes, BWD | UPD, k), 1,
                     "%s: %s gradient all-reduces over [%s]\n", title, param_name(&c, k), axes);
        EXPECT_COUNT(count(&c, IR_OP_COUNT, NULL, ANY_PHASE, k), 1,
                     "%s: %s collectives on the gradient\n", title, param_name(&c, k));
    }
    case_close(&c, build_megatron, &cfg);
}

static void test_megatron_one_block(void **state)
{
    (void)state;
    check_megatron(1, FIRST_SCALE);
    check_megatron(1, FIRST_LINEAR);
    check_megatron(1, FIRST_GELU_LINEAR);
}

static void test_megatron_two_blocks(void **state)
{
    (void)state;
    check_megatron(2, FIRST_SCALE);
    check_megatron(2, FIRST_LINEAR);
    check_megatron(2, FIRST_GELU_LINEAR);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fsdp_in_replicas),
        cmocka_unit_test(test_fsdp_in_replicas_uneven),
        cmocka_unit_test(test_data_parallel),
        cmocka_unit_test(test_unsplittable_batch_is_a_fallback),
        cmocka_unit_test(test_reshape_moving_an_axis_is_no_fallback),
        cmocka_unit_test(test_replica_input_fsdp_weights),
        cmocka_unit_test(test_megatron_one_block),
        cmocka_unit_test(test_megatron_two_blocks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
