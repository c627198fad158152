/*
 * Activation checkpointing (spmd_grad_checkpointed): on a small GPT with a
 * checkpoint at every block output ("h.{i}.out"),
 *   - the loss and every parameter gradient are bitwise those of spmd_grad
 *     (the recompute runs the same kernels on the same values), and so are
 *     the losses of a few SGD steps;
 *   - the transient arena of a training step is clearly smaller (the
 *     numbers are printed);
 *   - the rewritten graph is in topological creation order, no backward op
 *     reads an activation the checkpoints should have dropped, and each
 *     block is recomputed once;
 *   - partitioned FSDP-style over a 4x2 mesh it follows the one-device
 *     losses;
 * a value that skips a checkpoint (read two segments later) is recomputed
 * right; and the errors: a checkpoint outside the loss's forward pass, a
 * leaf, NULLs, a second backward pass, allocation failures.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"
#include "spmd/mesh.h"
#include "spmd/models.h"
#include "spmd/spmd.h"
#include "spmd/train.h"
#include "support_alloc.h"

#define D(...) ((const int64_t[]){__VA_ARGS__})

enum { BATCH = 8, SEQ = 32, VOCAB = 64, LAYERS = 4, HEADS = 4, DIM = 64, STEPS = 4 };

static const spmd_gpt_config CFG = {
    .vocab = VOCAB, .seq = SEQ, .layers = LAYERS, .heads = HEADS, .dim = DIM};

typedef struct gpt_run {
    spmd_graph *g;
    spmd_mesh *m;
    spmd_gpt_tensors t;
    spmd_tensor *lr; /* NULL without SGD */
    spmd_program *p;
} gpt_run;

typedef struct run_opts {
    bool checkpoint; /* spmd_grad_checkpointed at every block output, else spmd_grad */
    bool sgd;        /* append SGD updates */
    bool grads_out;  /* mark every gradient an output, to read it */
    bool fsdp;       /* mesh 4x2 (replica, fsdp), batch and 2-D weights split */
} run_opts;

/* The GPT's block outputs, found by name as a caller would. */
static void block_outputs(spmd_graph *g, spmd_tensor **out)
{
    for (int i = 0; i < LAYERS; i++) {
        char name[32];
        snprintf(name, sizeof name, "h.%d.out", i);
        out[i] = spmd_graph_find(g, name);
        if (!out[i]) fail_msg("no tensor named %s", name);
    }
}

static void gpt_setup(gpt_run *r, run_opts o)
{
    memset(r, 0, sizeof *r);
    r->g = spmd_graph_create(NULL);
    assert_non_null(r->g);
    if (spmd_gpt_build(r->g, &CFG, BATCH, &r->t) != SPMD_OK)
        fail_msg("gpt: %s", spmd_last_error());
    if (o.fsdp) {
        r->m = spmd_mesh_parse("4x2", "replica,fsdp");
        assert_non_null(r->m);
        const char *batch = "(replica, fsdp), None";
        assert_int_equal(spmd_mark_sharding(r->g, r->t.input, r->m, batch), SPMD_OK);
        assert_int_equal(spmd_mark_sharding(r->g, r->t.targets, r->m, batch), SPMD_OK);
        for (int i = 0; i < spmd_graph_tensor_count(r->g); i++) {
            spmd_tensor *p = spmd_graph_tensor(r->g, i);
            if (spmd_tensor_is_param(p) && spmd_tensor_rank(p) == 2)
                assert_int_equal(spmd_mark_sharding(r->g, p, r->m, "fsdp, None"), SPMD_OK);
        }
    }
    assert_int_equal(spmd_graph_mark_output(r->g, r->t.loss), SPMD_OK);
    spmd_status st;
    if (o.checkpoint) {
        spmd_tensor *ck[LAYERS];
        block_outputs(r->g, ck);
        st = spmd_grad_checkpointed(r->g, r->t.loss, ck, LAYERS);
    } else {
        st = spmd_grad(r->g, r->t.loss);
    }
    if (st != SPMD_OK) fail_msg("grad: %s", spmd_last_error());
    if (o.grads_out)
        for (int i = 0; i < spmd_graph_tensor_count(r->g); i++) {
            spmd_tensor *p = spmd_graph_tensor(r->g, i);
            if (spmd_tensor_is_param(p))
                assert_int_equal(spmd_graph_mark_output(r->g, spmd_tensor_grad(p)), SPMD_OK);
        }
    if (o.sgd) {
        r->lr = spmd_input(r->g, "lr", SPMD_F32, 0, NULL);
        assert_int_equal(spmd_sgd(r->g, r->lr), SPMD_OK);
    }
    r->p = spmd_compile(r->g, &(spmd_compile_options){.threads = 2, .seed = 7});
    if (!r->p) fail_msg("compile: %s", spmd_last_error());
    if (r->lr) {
        float lrv = 0.1f;
        assert_int_equal(spmd_program_set_input(r->p, r->lr, &lrv, sizeof lrv), SPMD_OK);
    }
}

static void gpt_teardown(gpt_run *r)
{
    spmd_program_free(r->p);
    spmd_graph_free(r->g);
    spmd_mesh_free(r->m);
}

static float step_loss(gpt_run *r, int step)
{
    int32_t in[BATCH * SEQ], tg[BATCH * SEQ];
    for (int i = 0; i < BATCH * SEQ; i++) {
        in[i] = (int32_t)((i * 7 + step * 3) % VOCAB);
        tg[i] = (int32_t)((i * 5 + step + i / 3) % VOCAB);
    }
    assert_int_equal(spmd_program_set_input(r->p, r->t.input, in, sizeof in), SPMD_OK);
    assert_int_equal(spmd_program_set_input(r->p, r->t.targets, tg, sizeof tg), SPMD_OK);
    if (spmd_program_run(r->p) != SPMD_OK) fail_msg("run: %s", spmd_last_error());
    float loss;
    assert_int_equal(spmd_program_read(r->p, r->t.loss, &loss, sizeof loss), SPMD_OK);
    assert_true(isfinite(loss));
    return loss;
}

/* Every gradient of `b` equals `a`'s, bitwise (the graphs have the same
 * parameters in the same order). */
static void expect_same_grads(const gpt_run *a, const gpt_run *b)
{
    int checked = 0;
    for (int i = 0; i < spmd_graph_tensor_count(a->g); i++) {
        spmd_tensor *p = spmd_graph_tensor(a->g, i);
        if (!spmd_tensor_is_param(p)) continue;
        spmd_tensor *q = spmd_graph_find(b->g, spmd_tensor_name(p));
        assert_non_null(q);
        size_t n = (size_t)spmd_tensor_numel(p);
        float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
        assert_non_null(x);
        assert_non_null(y);
        assert_int_equal(spmd_program_read(a->p, spmd_tensor_grad(p), x, n * sizeof *x), SPMD_OK);
        assert_int_equal(spmd_program_read(b->p, spmd_tensor_grad(q), y, n * sizeof *y), SPMD_OK);
        if (memcmp(x, y, n * sizeof *x) != 0) {
            double worst = 0;
            size_t at = 0;
            for (size_t k = 0; k < n; k++)
                if (fabs((double)x[k] - y[k]) > worst) worst = fabs((double)x[k] - y[k]), at = k;
            fail_msg("grad of %s differs: [%zu] %.9g vs %.9g (max |diff| %.3g)",
                     spmd_tensor_name(p), at, x[at], y[at], worst);
        }
        free(x);
        free(y);
        checked++;
    }
    assert_int_equal(checked, 4 + LAYERS * 12); /* wte, wpe, ln_f (2), 12 per block */
}

/* ---- Same values ---------------------------------------------------------------- */

static void test_same_loss_and_grads(void **state)
{
    (void)state;
    gpt_run plain, ckpt;
    gpt_setup(&plain, (run_opts){.grads_out = true});
    gpt_setup(&ckpt, (run_opts){.checkpoint = true, .grads_out = true});
    float a = step_loss(&plain, 0), b = step_loss(&ckpt, 0);
    assert_memory_equal(&a, &b, sizeof a);
    expect_same_grads(&plain, &ckpt);
    gpt_teardown(&plain);
    gpt_teardown(&ckpt);
}

static void test_same_sgd_losses(void **state)
{
    (void)state;
    gpt_run plain, ckpt;
    gpt_setup(&plain, (run_opts){.sgd = true});
    gpt_setup(&ckpt, (run_opts){.checkpoint = true, .sgd = true});
    float first = 0, last = 0;
    for (int s = 0; s < STEPS; s++) {
        /* One batch throughout, so the loss must fall. */
        float a = step_loss(&plain, 0), b = step_loss(&ckpt, 0);
        if (memcmp(&a, &b, sizeof a) != 0)
            fail_msg("step %d: loss %.9g without checkpoints, %.9g with", s, a, b);
        if (s == 0) first = a;
        last = a;
    }
    assert_true(last < first); /* it trains */
    gpt_teardown(&plain);
    gpt_teardown(&ckpt);
}

/* ---- Memory --------------------------------------------------------------------- */

static void test_less_memory(void **state)
{
    (void)state;
    gpt_run plain, ckpt;
    gpt_setup(&plain, (run_opts){.sgd = true});
    gpt_setup(&ckpt, (run_opts){.checkpoint = true, .sgd = true});
    size_t pa = spmd_program_arena_bytes(plain.p), ca = spmd_program_arena_bytes(ckpt.p);
    size_t pp = spmd_program_peak_bytes(plain.p), cp = spmd_program_peak_bytes(ckpt.p);
    printf("GPT %d layers, dim %d, seq %d, batch %d, vocab %d, one SGD step:\n"
           "  arena  %9zu bytes without checkpoints, %9zu with (%.1f%%)\n"
           "  peak   %9zu bytes without checkpoints, %9zu with (%.1f%%)\n"
           "  nodes  %9d without checkpoints, %9d with\n",
           LAYERS, DIM, SEQ, BATCH, VOCAB, pa, ca, 100.0 * (double)ca / (double)pa, pp, cp,
           100.0 * (double)cp / (double)pp, spmd_graph_tensor_count(plain.g),
           spmd_graph_tensor_count(ckpt.g));
    assert_true(ca < pa * 8 / 10);
    assert_true(cp < pp);
    /* Parameters and inputs are what they were. */
    assert_int_equal(spmd_program_persistent_bytes(plain.p), spmd_program_persistent_bytes(ckpt.p));
    gpt_teardown(&plain);
    gpt_teardown(&ckpt);
}

/* ---- Structure -------------------------------------------------------------------- */

static void test_rewritten_graph(void **state)
{
    (void)state;
    gpt_run plain, ckpt;
    gpt_setup(&plain, (run_opts){0});
    gpt_setup(&ckpt, (run_opts){.checkpoint = true});
    const spmd_graph *g = ckpt.g;
    spmd_tensor *ck[LAYERS];
    block_outputs(ckpt.g, ck);
    int nf = g->backward_begin, last = ck[LAYERS - 1]->id;
    assert_int_equal(nf, plain.g->backward_begin); /* the forward pass is untouched */
    assert_int_equal(g->backward_end, g->n_nodes);
    assert_true(g->n_nodes > plain.g->n_nodes);

    int attention = 0, clones = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const spmd_tensor *t = g->nodes[i];
        assert_int_equal(t->id, i);
        for (int j = 0; j < t->n_in; j++)
            if (t->in[j]->id >= i) fail_msg("node %d (%s) reads node %d", i, ir_op_name(t->op), t->in[j]->id);
        if (i < nf) continue;
        /* Forward values the backward pass reads are leaves, checkpoints,
         * or the model's head after the last checkpoint. */
        for (int j = 0; j < t->n_in; j++) {
            const spmd_tensor *x = t->in[j];
            bool is_ckpt = false;
            for (int k = 0; k < LAYERS; k++) is_ckpt |= x == ck[k];
            if (x->id < nf && !ir_op_is_leaf(x->op) && !is_ckpt && x->id <= last)
                fail_msg("backward node %d (%s) reads forward %s #%d", i, ir_op_name(t->op),
                         ir_op_name(x->op), x->id);
        }
        if (t->op == IR_ATTENTION) attention++;
        /* Clones are forward ops in the backward pass: unnamed, not outputs. */
        if (t->op == IR_ATTENTION || t->op == IR_GELU || t->op == IR_LAYERNORM) {
            assert_null(t->name);
            assert_false(t->is_output);
            clones++;
        }
    }
    assert_int_equal(attention, LAYERS); /* each block recomputed once */
    assert_int_equal(clones, 4 * LAYERS);   /* attention, gelu, ln_1, ln_2 */
    gpt_teardown(&plain);
    gpt_teardown(&ckpt);
}

/* ---- On a mesh ------------------------------------------------------------------------ */

static void test_fsdp_mesh(void **state)
{
    (void)state;
    gpt_run one, mesh, mesh_plain;
    gpt_setup(&one, (run_opts){.sgd = true});
    gpt_setup(&mesh, (run_opts){.checkpoint = true, .sgd = true, .fsdp = true});
    gpt_setup(&mesh_plain, (run_opts){.sgd = true, .fsdp = true});
    assert_int_equal(spmd_program_devices(mesh.p), 8);
    /* Printed, not asserted: here the weights FSDP gathers for the forward
     * pass, reused by the backward pass, dominate each device's arena. */
    printf("on the 4x2 mesh, per device: arena %zu bytes without checkpoints, %zu with\n",
           spmd_program_arena_bytes(mesh_plain.p), spmd_program_arena_bytes(mesh.p));
    for (int s = 0; s < STEPS; s++) {
        float a = step_loss(&one, s), b = step_loss(&mesh, s), c = step_loss(&mesh_plain, s);
        if (!(fabsf(a - b) <= 1e-4f * fabsf(a)))
            fail_msg("step %d: loss %.9g on one device, %.9g on the mesh", s, a, b);
        /* The same partitioned program but for the recompute. */
        if (!(fabsf(c - b) <= 1e-6f * fabsf(c)))
            fail_msg("step %d: loss %.9g on the mesh, %.9g with checkpoints", s, c, b);
    }
    gpt_teardown(&one);
    gpt_teardown(&mesh);
    gpt_teardown(&mesh_plain);
}

/* ---- A value read across a checkpoint ---------------------------------------------------
 * x -> a = tanh(x W0) -> c0 = a W1 (checkpoint) -> b = tanh(c0 W2) * a
 * -> c1 = b W3 (checkpoint) -> loss = mse(tanh(c1) * a, y).  `a` belongs to
 * segment 0, but the backward of segment 1 and of the tail read it too:
 * each recomputes it rather than keep segment 0's recompute alive. */

typedef struct skip_graph {
    spmd_graph *g;
    spmd_tensor *x, *y, *loss, *ck[2];
} skip_graph;

static void skip_build(skip_graph *s)
{
    spmd_graph *g = s->g = spmd_graph_create(NULL);
    spmd_init init = {SPMD_INIT_UNIFORM, 0.5f};
    s->x = spmd_input(g, "x", SPMD_F32, 2, D(6, 8));
    s->y = spmd_input(g, "y", SPMD_F32, 2, D(6, 8));
    spmd_tensor *w[4];
    for (int i = 0; i < 4; i++) {
        char name[8];
        snprintf(name, sizeof name, "w%d", i);
        w[i] = spmd_param(g, name, 2, D(8, 8), init);
    }
    spmd_tensor *a = spmd_tanh(g, spmd_matmul(g, s->x, w[0], false, false));
    s->ck[0] = spmd_matmul(g, a, w[1], false, false);
    spmd_tensor *b = spmd_mul(g, spmd_tanh(g, spmd_matmul(g, s->ck[0], w[2], false, false)), a);
    s->ck[1] = spmd_matmul(g, b, w[3], false, false);
    s->loss = spmd_mse(g, spmd_mul(g, spmd_tanh(g, s->ck[1]), a), s->y);
    assert_non_null(s->loss);
    assert_int_equal(spmd_graph_mark_output(g, s->loss), SPMD_OK);
}

static void test_skip_connection(void **state)
{
    (void)state;
    skip_graph plain, ckpt;
    skip_build(&plain);
    skip_build(&ckpt);
    assert_int_equal(spmd_grad(plain.g, plain.loss), SPMD_OK);
    assert_int_equal(spmd_grad_checkpointed(ckpt.g, ckpt.loss, ckpt.ck, 2), SPMD_OK);
    float xv[48], yv[48];
    for (int i = 0; i < 48; i++) xv[i] = (float)((i * 37) % 17) / 8.0f - 1.0f, yv[i] = (float)(i % 5) / 5.0f;
    float gp[4][64], gc[4][64];
    skip_graph *both[2] = {&plain, &ckpt};
    for (int k = 0; k < 2; k++) {
        skip_graph *s = both[k];
        spmd_tensor *ws[4];
        for (int i = 0; i < 4; i++) {
            char name[8];
            snprintf(name, sizeof name, "w%d", i);
            ws[i] = spmd_graph_find(s->g, name);
            assert_int_equal(spmd_graph_mark_output(s->g, spmd_tensor_grad(ws[i])), SPMD_OK);
        }
        spmd_program *p = spmd_compile(s->g, &(spmd_compile_options){.threads = 1, .seed = 3});
        if (!p) fail_msg("compile: %s", spmd_last_error());
        assert_int_equal(spmd_program_set_input(p, s->x, xv, sizeof xv), SPMD_OK);
        assert_int_equal(spmd_program_set_input(p, s->y, yv, sizeof yv), SPMD_OK);
        assert_int_equal(spmd_program_run(p), SPMD_OK);
        for (int i = 0; i < 4; i++)
            assert_int_equal(spmd_program_read(p, spmd_tensor_grad(ws[i]), k ? gc[i] : gp[i],
                                               sizeof gp[i]),
                             SPMD_OK);
        spmd_program_free(p);
    }
    assert_memory_equal(gp, gc, sizeof gp);
    /* a (the first tanh) is recomputed three times: for the tail and
     * segment 1 (the muls' backward) and for segment 0 (tanh's and c0's). */
    int tanh_of_x = 0;
    for (int i = ckpt.g->backward_begin; i < ckpt.g->n_nodes; i++) {
        const spmd_tensor *t = ckpt.g->nodes[i];
        if (t->op == IR_TANH && t->in[0]->op == IR_MATMUL && t->in[0]->in[0] == ckpt.x) tanh_of_x++;
    }
    assert_int_equal(tanh_of_x, 3);
    spmd_graph_free(plain.g);
    spmd_graph_free(ckpt.g);
}

/* ---- Errors ---------------------------------------------------------------------------- */

static void expect_error(spmd_status st, const char *needle)
{
    assert_int_not_equal(st, SPMD_OK);
    if (!strstr(spmd_last_error(), needle))
        fail_msg("error \"%s\" does not mention \"%s\"", spmd_last_error(), needle);
    spmd_clear_error();
}

static void test_errors(void **state)
{
    (void)state;
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_gpt_tensors t;
    assert_int_equal(spmd_gpt_build(g, &CFG, BATCH, &t), SPMD_OK);
    spmd_tensor *ck[LAYERS];
    block_outputs(g, ck);
    spmd_tensor *stray = spmd_relu(g, ck[1]); /* the loss does not use it */
    spmd_graph *other = spmd_graph_create(NULL);
    spmd_tensor *foreign = spmd_fill(other, 1, D(4), 1.0f);
    int before = spmd_graph_tensor_count(g);
    spmd_clear_error();

    spmd_tensor *bad[2] = {ck[0], stray};
    expect_error(spmd_grad_checkpointed(g, t.loss, bad, 2), "not part of the forward pass");
    bad[1] = t.logits; /* fine */
    bad[0] = spmd_graph_find(g, "wte.weight");
    expect_error(spmd_grad_checkpointed(g, t.loss, bad, 2), "leaves are always kept");
    bad[0] = NULL;
    expect_error(spmd_grad_checkpointed(g, t.loss, bad, 2), "checkpoint 0 is NULL");
    bad[0] = foreign;
    expect_error(spmd_grad_checkpointed(g, t.loss, bad, 2), "another graph");
    expect_error(spmd_grad_checkpointed(g, t.loss, NULL, 2), "NULL");
    expect_error(spmd_grad_checkpointed(g, t.loss, ck, -1), "-1");
    expect_error(spmd_grad_checkpointed(g, NULL, ck, LAYERS), "loss is NULL");
    expect_error(spmd_grad_checkpointed(NULL, t.loss, ck, LAYERS), "graph is NULL");
    expect_error(spmd_grad_checkpointed(g, ck[2], ck, LAYERS), "not part of the forward pass");
    /* A loss that is not a scalar: spmd_grad's own check, still refused
     * before anything is appended. */
    expect_error(spmd_grad_checkpointed(g, t.logits, ck, 1), "scalar");
    /* Refused calls leave the graph as it was. */
    assert_int_equal(spmd_graph_tensor_count(g), before);
    assert_null(spmd_tensor_grad(spmd_graph_find(g, "wte.weight")));

    /* Duplicates are fine; then no second backward pass of either kind. */
    spmd_tensor *dup[3] = {ck[1], ck[0], ck[1]};
    assert_int_equal(spmd_grad_checkpointed(g, t.loss, dup, 3), SPMD_OK);
    assert_non_null(spmd_tensor_grad(spmd_graph_find(g, "wte.weight")));
    int after = spmd_graph_tensor_count(g);
    expect_error(spmd_grad_checkpointed(g, t.loss, ck, LAYERS), "already has a backward pass");
    expect_error(spmd_grad(g, t.loss), "already has a backward pass");
    assert_int_equal(spmd_graph_tensor_count(g), after);
    spmd_graph_free(g);
    spmd_graph_free(other);

    /* spmd_grad first, then checkpointing: refused too. */
    g = spmd_graph_create(NULL);
    assert_int_equal(spmd_gpt_build(g, &CFG, 2, &t), SPMD_OK);
    assert_int_equal(spmd_grad(g, t.loss), SPMD_OK);
    block_outputs(g, ck);
    expect_error(spmd_grad_checkpointed(g, t.loss, ck, LAYERS), "already has a backward pass");
    spmd_graph_free(g);
}

/* No checkpoints: exactly spmd_grad's graph. */
static void test_no_checkpoints(void **state)
{
    (void)state;
    spmd_graph *a = spmd_graph_create(NULL), *b = spmd_graph_create(NULL);
    spmd_gpt_tensors ta, tb;
    assert_int_equal(spmd_gpt_build(a, &CFG, 2, &ta), SPMD_OK);
    assert_int_equal(spmd_gpt_build(b, &CFG, 2, &tb), SPMD_OK);
    assert_int_equal(spmd_grad(a, ta.loss), SPMD_OK);
    assert_int_equal(spmd_grad_checkpointed(b, tb.loss, NULL, 0), SPMD_OK);
    assert_int_equal(spmd_graph_tensor_count(a), spmd_graph_tensor_count(b));
    for (int i = 0; i < spmd_graph_tensor_count(a); i++)
        assert_int_equal(a->nodes[i]->op, b->nodes[i]->op);
    spmd_graph_free(a);
    spmd_graph_free(b);
}

/* ---- Allocation failures -----------------------------------------------------------------
 * Allocations fail from the k-th on, for every k until the call succeeds.
 * Every failure says "out of memory" and leaves a graph in topological
 * order with ids matching positions; one that comes after the backward
 * pass was built leaves exactly spmd_grad's graph, which still compiles. */

static void expect_well_formed(const spmd_graph *g)
{
    for (int i = 0; i < g->n_nodes; i++) {
        assert_int_equal(g->nodes[i]->id, i);
        for (int j = 0; j < g->nodes[i]->n_in; j++) assert_true(g->nodes[i]->in[j]->id < i);
    }
}

static void test_allocation_failure(void **state)
{
    (void)state;
    const spmd_gpt_config cfg = {.vocab = 16, .seq = 4, .layers = 2, .heads = 2, .dim = 8};
    spmd_graph *ref = spmd_graph_create(NULL);
    spmd_gpt_tensors t;
    assert_int_equal(spmd_gpt_build(ref, &cfg, 2, &t), SPMD_OK);
    assert_int_equal(spmd_grad(ref, t.loss), SPMD_OK);
    int plain_nodes = spmd_graph_tensor_count(ref);
    spmd_graph_free(ref);

    int late = 0;
    bool ok = false;
    for (int k = 0; k < 10000 && !ok; k++) {
        test_alloc f;
        spmd_allocator a = test_alloc_init(&f, -1);
        spmd_graph *g = spmd_graph_create(&a);
        assert_non_null(g);
        assert_int_equal(spmd_gpt_build(g, &cfg, 2, &t), SPMD_OK);
        spmd_tensor *ck[2] = {spmd_graph_find(g, "h.0.out"), spmd_graph_find(g, "h.1.out")};
        spmd_clear_error();
        test_alloc_set_budget(&f, k);
        spmd_status st = spmd_grad_checkpointed(g, t.loss, ck, 2);
        test_alloc_set_budget(&f, -1);
        expect_well_formed(g);
        if (st == SPMD_OK) {
            ok = true;
        } else {
            assert_int_equal(st, SPMD_ERR_NOMEM);
            assert_non_null(strstr(spmd_last_error(), "out of memory"));
            if (spmd_tensor_grad(spmd_graph_find(g, "wte.weight")) &&
                spmd_graph_tensor_count(g) == plain_nodes) {
                late++;
                spmd_graph_mark_output(g, t.loss);
                spmd_program *p = spmd_compile(g, &(spmd_compile_options){.threads = 1});
                if (!p) fail_msg("compile after a failed rewrite: %s", spmd_last_error());
                spmd_program_free(p);
            }
        }
        spmd_graph_free(g);
    }
    assert_true(ok);
    assert_true(late > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_loss_and_grads),
        cmocka_unit_test(test_same_sgd_losses),
        cmocka_unit_test(test_less_memory),
        cmocka_unit_test(test_rewritten_graph),
        cmocka_unit_test(test_fsdp_mesh),
        cmocka_unit_test(test_skip_connection),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_no_checkpoints),
        cmocka_unit_test(test_allocation_failure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
