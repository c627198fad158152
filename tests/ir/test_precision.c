/*
 * bf16 mixed precision (spmd_graph_set_matmul_precision, spmd_convert):
 * the conversion rounds to nearest even both ways exactly; a GPT trained
 * with bf16 matmuls follows the f32 run within bf16's rounding, and on
 * meshes 8 and 4x2 (FSDP) follows its own one-device run about as closely
 * as f32 runs follow each other across meshes; FSDP gathers the bf16
 * copies of the weights, half the bytes; gradients reduced in bf16
 * (spmd_graph_set_reduce_precision) follow f32-reduced runs within bf16's
 * tolerance, in half the bytes; bf16 where no kernel takes it is refused,
 * naming the op.  The activations the backward pass keeps are bf16
 * copies (ir/autocast.c's policy): the planned values' types say so,
 * the backward pass reads no f32 activation but the logits, the held
 * bytes and the arena of an activation-bound GPT shrink by more than a
 * third, and the gradients stay within bf16's rounding of the f32 ones;
 * tensor and sequence parallelism on bf16 follow one device too.
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

#include "base/bf16.h"
#include "ir/ir.h"
#include "runtime/executor.h"
#include "spmd/data.h"
#include "spmd/mesh.h"
#include "spmd/models.h"
#include "spmd/train.h"

enum { STEPS = 8, BATCH = 8, SEQ = 16, VOCAB = 32 };

static const spmd_gpt_config CFG = {.vocab = VOCAB, .seq = SEQ, .layers = 2, .heads = 2, .dim = 32};

/* What a run's gradients' reductions move (the update's reduce-scatters
 * and all-reduces of "*.grad"), and how many are named "in bf16". */
typedef struct reductions {
    int64_t bytes;
    int count, in_bf16;
} reductions;

/* Losses of STEPS AdamW steps of the GPT on `shape` ("" for one device):
 * with a "tensor" axis tensor parallel over it (sequence parallel too),
 * the batch over "data"; else FSDP-wrapped over "fsdp" when the mesh has
 * it, else the batch split.  Gradients reduced in `reduce`. */
static void train_reduced(const char *shape, const char *axes, spmd_dtype precision,
                          spmd_dtype reduce, float *loss, int64_t *gather_bytes, reductions *red)
{
    spmd_mesh *mesh = *shape ? spmd_mesh_parse(shape, axes) : NULL;
    spmd_graph *g = spmd_graph_create(NULL);
    assert_int_equal(spmd_graph_set_matmul_precision(g, precision), SPMD_OK);
    assert_int_equal(spmd_graph_set_reduce_precision(g, reduce), SPMD_OK);
    spmd_gpt_tensors t;
    assert_int_equal(spmd_gpt_build(g, &CFG, BATCH, &t), SPMD_OK);
    spmd_tensor *in[2] = {t.input, t.targets};
    if (mesh && strstr(axes, "tensor")) {
        spmd_gpt_parallel how = {"tensor", NULL, NULL, true, NULL};
        assert_int_equal(spmd_gpt_shard_tensor_parallel(g, &CFG, mesh, &how), SPMD_OK);
        assert_int_equal(spmd_shard_batch(g, mesh, in, 2, "data"), SPMD_OK);
    } else if (mesh) {
        assert_int_equal(strstr(axes, "fsdp") ? spmd_fsdp_wrap(g, mesh, "fsdp", in, 2, NULL)
                                              : spmd_shard_batch(g, mesh, in, 2, NULL),
                         SPMD_OK);
    }
    spmd_optimizer opt = {.kind = SPMD_OPTIMIZER_ADAMW, .weight_decay = 0.1f, .clip_norm = 1.0f};
    spmd_trainer *tr = spmd_trainer_create(
        g, t.loss, &(spmd_trainer_options){.optimizer = opt, .compile = {.seed = 9, .threads = 2}});
    if (!tr) fail_msg("trainer: %s", spmd_last_error());
    spmd_program *p = spmd_trainer_program(tr);
    int32_t ids[BATCH * SEQ], tg[BATCH * SEQ];
    for (int s = 0; s < STEPS; s++) {
        assert_int_equal(spmd_data_sequences(5, (int64_t)s * BATCH, BATCH, SEQ, VOCAB, ids, tg), SPMD_OK);
        assert_int_equal(spmd_program_set_input(p, t.input, ids, sizeof ids), SPMD_OK);
        assert_int_equal(spmd_program_set_input(p, t.targets, tg, sizeof tg), SPMD_OK);
        if (spmd_trainer_step(tr, 3e-3f, &loss[s], NULL) != SPMD_OK)
            fail_msg("step %d: %s", s, spmd_last_error());
    }
    if (gather_bytes) *gather_bytes = 0;
    if (red) *red = (reductions){0};
    for (int i = 0; i < spmd_program_collective_count(p); i++) {
        spmd_collective_info c;
        assert_int_equal(spmd_program_collective(p, i, &c), SPMD_OK);
        if (gather_bytes && !strcmp(c.kind, "all-gather") && strstr(c.tensor, "c_fc.weight"))
            *gather_bytes += c.bytes;
        if (red && !strcmp(c.phase, "update") && strstr(c.tensor, ".grad") &&
            (!strcmp(c.kind, "reduce-scatter") || !strcmp(c.kind, "all-reduce"))) {
            red->bytes += c.bytes;
            red->count++;
            red->in_bf16 += strstr(c.tensor, ".grad in bf16") != NULL;
        }
    }
    spmd_trainer_free(tr);
    spmd_graph_free(g);
    spmd_mesh_free(mesh);
}

static void train(const char *shape, const char *axes, spmd_dtype precision, float *loss,
                  int64_t *gather_bytes)
{
    train_reduced(shape, axes, precision, SPMD_F32, loss, gather_bytes, NULL);
}

static double max_rel(const float *a, const float *b)
{
    double m = 0;
    for (int s = 0; s < STEPS; s++) m = fmax(m, fabs((double)a[s] - b[s]) / fabs((double)b[s]));
    return m;
}

/* Round to nearest even, both ways exact: ties, the largest finite
 * values, subnormals, infinities and NaN, through a program's convert ops. */
static void test_convert_rounds_to_nearest_even(void **state)
{
    (void)state;
    const float x[] = {1.0f, 1.00390625f /* 1 + 2^-8: a tie, to even (1) */,
                       1.01171875f /* 1 + 3 * 2^-8: a tie, to even (1 + 2^-6) */,
                       -2.5f, 3.0e38f, 3.4e38f /* past bf16's largest: infinity */,
                       1e-40f /* subnormal */, INFINITY, -INFINITY, NAN, 0.0f, -0.0f};
    enum { N = sizeof x / sizeof *x };
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_tensor *in = spmd_input(g, "x", SPMD_F32, 1, (const int64_t[]){N});
    spmd_tensor *h = spmd_convert(g, in, SPMD_BF16), *back = spmd_convert(g, h, SPMD_F32);
    assert_ptr_equal(spmd_convert(g, h, SPMD_BF16), h); /* already bf16 */
    assert_int_equal(spmd_graph_mark_output(g, h), SPMD_OK);
    assert_int_equal(spmd_graph_mark_output(g, back), SPMD_OK);
    spmd_program *p = spmd_compile(g, &(spmd_compile_options){.threads = 1});
    assert_non_null(p);
    assert_int_equal(spmd_program_set_input(p, in, x, sizeof x), SPMD_OK);
    assert_int_equal(spmd_program_run(p), SPMD_OK);
    uint16_t bits[N];
    float y[N];
    assert_int_equal(spmd_program_read(p, h, bits, sizeof bits), SPMD_OK);
    assert_int_equal(spmd_program_read(p, back, y, sizeof y), SPMD_OK);
    const uint16_t want[] = {0x3f80, 0x3f80, 0x3f82, 0xc020, 0x7f62, 0x7f80,
                             0x0001, 0x7f80, 0xff80, 0,      0x0000, 0x8000};
    for (int i = 0; i < N; i++) {
        if (i == 9) {
            assert_true((bits[i] & 0x7f80) == 0x7f80 && (bits[i] & 0x7f)); /* a NaN */
            assert_true(isnan(y[i]));
            continue;
        }
        if (bits[i] != want[i]) fail_msg("x[%d] = %g: bf16 0x%04x, want 0x%04x", i, (double)x[i], bits[i], want[i]);
        assert_true(y[i] == bf16_to_f32(want[i]) || (isinf(y[i]) && isinf(bf16_to_f32(want[i]))));
    }
    spmd_program_free(p);
    spmd_graph_free(g);
}

/* bf16 matmuls change each step's loss by bf16's rounding (operands to 8
 * bits of mantissa, about 4e-3 relative each; the loss moves much less),
 * and not by more: the run is the f32 run, rounded. */
static void test_bf16_follows_f32(void **state)
{
    (void)state;
    float f32[STEPS], bf16[STEPS];
    train("", "", SPMD_F32, f32, NULL);
    train("", "", SPMD_BF16, bf16, NULL);
    double d = max_rel(bf16, f32);
    if (!(d > 0 && d < 1e-2)) fail_msg("bf16 differs from f32 by %.3g relative", d);
}

/* Across meshes the bf16 copies round the same values the same way; only
 * the f32 sums go in another order, as in f32 runs: the f32 tolerance
 * (1e-5), scaled by the 2^16 between f32's and bf16's mantissa where a
 * changed sum meets a rounding, bounded at 1e-3. */
static void test_bf16_meshes_follow_one_device(void **state)
{
    (void)state;
    float one[STEPS], data[STEPS], fsdp[STEPS], tp[STEPS], f32_one[STEPS], f32_fsdp[STEPS];
    int64_t bytes_bf16 = 0, bytes_f32 = 0;
    train("", "", SPMD_BF16, one, NULL);
    train("8", "data", SPMD_BF16, data, NULL);
    train("4x2", "replica,fsdp", SPMD_BF16, fsdp, &bytes_bf16);
    /* Heads, hidden units and vocabulary split, the residual stream (and
     * its bf16 copies) split over the sequence: gathered in bf16. */
    train("2x2", "data,tensor", SPMD_BF16, tp, NULL);
    train("", "", SPMD_F32, f32_one, NULL);
    train("4x2", "replica,fsdp", SPMD_F32, f32_fsdp, &bytes_f32);
    double d8 = max_rel(data, one), d42 = max_rel(fsdp, one), dtp = max_rel(tp, one);
    double f = max_rel(f32_fsdp, f32_one);
    if (d8 > 1e-3 || d42 > 1e-3 || dtp > 1e-3)
        fail_msg("bf16 on 8: %.3g, on 4x2: %.3g, 2x2 tensor and sequence parallel: %.3g from one "
                 "device (f32 on 4x2: %.3g)",
                 d8, d42, dtp, f);
    /* The weights' copies are gathered: half the bytes. */
    assert_true(bytes_f32 > 0);
    assert_int_equal(bytes_bf16 * 2, bytes_f32);
}

/* Gradients reduced in bf16 (spmd_graph_set_reduce_precision): each
 * device's gradient rounded to bf16 (2^-9 relative) before the sum, the
 * sum rounded once; AdamW's update divides most of that out, so the
 * losses follow the f32-reduced run within the bf16 tolerance above
 * (1e-3 relative), and do differ.  Every gradient reduction moves half the
 * bytes and says so; the norm's and the loss's sums stay f32; the run is
 * the same bits when repeated; on one device nothing is reduced and the
 * setting changes nothing. */
static void test_bf16_reduction(void **state)
{
    (void)state;
    const char *shapes[][2] = {{"8", "data"}, {"4x2", "replica,fsdp"}};
    for (int k = 0; k < 2; k++) {
        float f32[STEPS], bf16[STEPS], again[STEPS];
        reductions r32, r16;
        train_reduced(shapes[k][0], shapes[k][1], SPMD_F32, SPMD_F32, f32, NULL, &r32);
        train_reduced(shapes[k][0], shapes[k][1], SPMD_F32, SPMD_BF16, bf16, NULL, &r16);
        train_reduced(shapes[k][0], shapes[k][1], SPMD_F32, SPMD_BF16, again, NULL, NULL);
        double d = max_rel(bf16, f32);
        if (!(d > 0 && d < 1e-3))
            fail_msg("mesh %s: bf16-reduced differs from f32-reduced by %.3g relative",
                     shapes[k][0], d);
        assert_memory_equal(bf16, again, sizeof bf16);
        assert_true(r32.count > 0);
        assert_int_equal(r16.count, r32.count);
        assert_int_equal(r32.in_bf16, 0);
        assert_int_equal(r16.in_bf16, r16.count);
        assert_int_equal(r16.bytes * 2, r32.bytes);
    }
    /* bf16 matmuls and bf16 reductions together, FSDP on 4x2. */
    float both[STEPS], matmuls[STEPS];
    train_reduced("4x2", "replica,fsdp", SPMD_BF16, SPMD_BF16, both, NULL, NULL);
    train("4x2", "replica,fsdp", SPMD_BF16, matmuls, NULL);
    double d = max_rel(both, matmuls);
    if (!(d > 0 && d < 1e-3)) fail_msg("bf16 reductions on bf16 matmuls: %.3g relative", d);
    float one[STEPS], one_f32[STEPS];
    train_reduced("", "", SPMD_F32, SPMD_BF16, one, NULL, NULL);
    train("", "", SPMD_F32, one_f32, NULL);
    assert_memory_equal(one, one_f32, sizeof one);
}

/* A trainer (AdamW, clipping) of a GPT of config cfg, batch b, in
 * `precision` on one device or on mesh `shape` (FSDP over "fsdp"); *g
 * its graph, *loss its loss. */
static spmd_trainer *trainer(const spmd_gpt_config *cfg, int b, spmd_dtype precision,
                             const char *shape, spmd_graph **g, spmd_gpt_tensors *t,
                             spmd_mesh **mesh)
{
    *mesh = *shape ? spmd_mesh_parse(shape, "replica,fsdp") : NULL;
    *g = spmd_graph_create(NULL);
    assert_int_equal(spmd_graph_set_matmul_precision(*g, precision), SPMD_OK);
    assert_int_equal(spmd_gpt_build(*g, cfg, b, t), SPMD_OK);
    spmd_tensor *in[2] = {t->input, t->targets};
    if (*mesh) assert_int_equal(spmd_fsdp_wrap(*g, *mesh, "fsdp", in, 2, NULL), SPMD_OK);
    spmd_optimizer opt = {.kind = SPMD_OPTIMIZER_ADAMW, .weight_decay = 0.1f, .clip_norm = 1.0f};
    spmd_trainer *tr = spmd_trainer_create(
        *g, t->loss, &(spmd_trainer_options){.optimizer = opt, .compile = {.seed = 9, .threads = 2}});
    if (!tr) fail_msg("trainer: %s", spmd_last_error());
    return tr;
}

/* The backward ops that read a kept activation read it in bf16, in the
 * program each device runs; every bf16 value there is read only where
 * the policy says a kernel takes bf16 (ir_op_reads_bf16) or moves it. */
static void check_kept_bf16(const spmd_graph *local, const bool *needed)
{
    int kept = 0;
    for (int i = 0; i < local->n_nodes; i++) {
        const spmd_tensor *t = local->nodes[i];
        if (!needed[i]) continue;
        int wide = 0;
        switch (t->op) {
        case IR_LAYERNORM_BACKWARD:
        case IR_LAYERNORM_XHAT:
        case IR_GELU_BACKWARD: wide = 1; break;
        case IR_ATTENTION_BACKWARD: wide = 3; break;
        default: break;
        }
        for (int j = 0; j < wide; j++) {
            if (t->in[j]->dtype != SPMD_BF16)
                fail_msg("%s node %d reads operand %d in %s, not bf16", ir_op_name(t->op), i, j,
                         spmd_dtype_name(t->in[j]->dtype));
            kept++;
        }
        for (int j = 0; j < t->n_in; j++)
            if (t->in[j]->dtype == SPMD_BF16 && !ir_op_reads_bf16(t->op, j) &&
                t->op != IR_CONVERT && t->op != IR_RESHAPE && t->op != IR_SLICE &&
                t->op != IR_ALL_GATHER && t->op != IR_SHARDING_CONSTRAINT)
                fail_msg("%s node %d reads bf16 operand %d", ir_op_name(t->op), i, j);
    }
    /* Per block: two layernorms (backward and xhat each), gelu, attention's q, k, v;
     * and the final layernorm. */
    assert_int_equal(kept, CFG.layers * (2 * 2 + 1 + 3) + 2);
}

/* The policy (ir/autocast.c) as planned: on one device and on 4x2 (FSDP)
 * the backward ops read the kept bf16 copies; on one device, the only f32
 * activation the backward pass reads is the logits (the loss stays f32). */
static void test_kept_values_are_bf16(void **state)
{
    (void)state;
    const char *shapes[] = {"", "4x2"};
    for (int m = 0; m < 2; m++) {
        spmd_graph *g;
        spmd_gpt_tensors t;
        spmd_mesh *mesh;
        spmd_trainer *tr = trainer(&CFG, BATCH, SPMD_BF16, shapes[m], &g, &t, &mesh);
        const compiled *c = executor_compiled(spmd_trainer_program(tr));
        check_kept_bf16(c->local, c->plan.needed);
        if (!*shapes[m]) {
            int f32_read = 0;
            for (int i = g->backward_begin; i < g->backward_end; i++) {
                const spmd_tensor *n = g->nodes[i];
                for (int j = 0; j < n->n_in; j++) {
                    const spmd_tensor *x = n->in[j];
                    if (x->id >= g->backward_begin || ir_op_is_leaf(x->op) || x->dtype != SPMD_F32)
                        continue;
                    if (n->op != IR_CROSS_ENTROPY_BACKWARD || j != 0)
                        fail_msg("backward %s node %d reads f32 forward %s node %d (%s)",
                                 ir_op_name(n->op), i, ir_op_name(x->op), x->id,
                                 x->name ? x->name : "unnamed");
                    f32_read++;
                }
            }
            assert_int_equal(f32_read, 1);
        }
        spmd_trainer_free(tr);
        spmd_graph_free(g);
        spmd_mesh_free(mesh);
    }
}

/* What the forward pass keeps for the backward is 2 bytes an element: the
 * held bytes (all in all, the logits and the loss included) of a GPT whose
 * arena is activations (a long sequence, a small vocabulary) shrink by
 * more than a third, and so does the planned arena at its peak; the
 * parameters' copies aside, nothing grows on 4x2. */
static void test_bf16_holds_less(void **state)
{
    (void)state;
    const spmd_gpt_config cfg = {.vocab = 64, .seq = 128, .layers = 4, .heads = 2, .dim = 64};
    const char *shapes[] = {"", "4x2"};
    for (int m = 0; m < 2; m++) {
        size_t held[2], arena[2];
        for (int k = 0; k < 2; k++) {
            spmd_graph *g;
            spmd_gpt_tensors t;
            spmd_mesh *mesh;
            spmd_trainer *tr = trainer(&cfg, 16, k ? SPMD_BF16 : SPMD_F32, shapes[m], &g, &t, &mesh);
            spmd_program *p = spmd_trainer_program(tr);
            held[k] = spmd_program_held_bytes(p);
            arena[k] = spmd_program_arena_bytes(p);
            spmd_trainer_free(tr);
            spmd_graph_free(g);
            spmd_mesh_free(mesh);
        }
        print_message("mesh %s: held %zu -> %zu bytes, arena %zu -> %zu\n", *shapes[m] ? shapes[m] : "1",
                      held[0], held[1], arena[0], arena[1]);
        assert_true(held[0] > 0);
        if (!(3 * held[1] <= 2 * held[0]) || !(3 * arena[1] <= 2 * arena[0]))
            fail_msg("mesh %s: bf16 holds %zu of f32's %zu bytes, arena %zu of %zu",
                     *shapes[m] ? shapes[m] : "1", held[1], held[0], arena[1], arena[0]);
    }
}

/* One step's gradients in bf16 follow the f32 ones within bf16's
 * rounding: each parameter's gradient within 5% of the f32 one's norm
 * (operands and kept activations rounded to 8 bits, about 4e-3 each),
 * the gradients' global norm within 1%. */
static void test_bf16_gradients_follow_f32(void **state)
{
    (void)state;
    float *grads[2] = {NULL, NULL};
    int64_t offsets[64];
    int n_params = 0;
    int64_t total = 0;
    for (int k = 0; k < 2; k++) {
        spmd_graph *g = spmd_graph_create(NULL);
        assert_int_equal(spmd_graph_set_matmul_precision(g, k ? SPMD_BF16 : SPMD_F32), SPMD_OK);
        spmd_gpt_tensors t;
        assert_int_equal(spmd_gpt_build(g, &CFG, BATCH, &t), SPMD_OK);
        assert_int_equal(spmd_grad(g, t.loss), SPMD_OK);
        spmd_tensor *params[64];
        int np = 0;
        total = 0;
        for (int i = 0; i < g->n_nodes; i++)
            if (g->nodes[i]->op == IR_PARAM) {
                assert_true(np < 64);
                params[np] = g->nodes[i];
                offsets[np++] = total;
                total += spmd_tensor_numel(g->nodes[i]);
                assert_int_equal(spmd_graph_mark_output(g, spmd_tensor_grad(params[np - 1])), SPMD_OK);
            }
        n_params = np;
        spmd_program *p = spmd_compile(g, &(spmd_compile_options){.threads = 2, .seed = 9});
        if (!p) fail_msg("compile: %s", spmd_last_error());
        int32_t ids[BATCH * SEQ], tg[BATCH * SEQ];
        assert_int_equal(spmd_data_sequences(5, 0, BATCH, SEQ, VOCAB, ids, tg), SPMD_OK);
        assert_int_equal(spmd_program_set_input(p, t.input, ids, sizeof ids), SPMD_OK);
        assert_int_equal(spmd_program_set_input(p, t.targets, tg, sizeof tg), SPMD_OK);
        assert_int_equal(spmd_program_run(p), SPMD_OK);
        grads[k] = malloc((size_t)total * sizeof(float));
        for (int i = 0; i < np; i++)
            assert_int_equal(spmd_program_read(p, spmd_tensor_grad(params[i]), grads[k] + offsets[i],
                                               (size_t)spmd_tensor_numel(params[i]) * sizeof(float)),
                             SPMD_OK);
        spmd_program_free(p);
        spmd_graph_free(g);
    }
    double all_d = 0, all_n = 0, worst = 0;
    for (int i = 0; i < n_params; i++) {
        int64_t end = i + 1 < n_params ? offsets[i + 1] : total;
        double d = 0, n = 0;
        for (int64_t e = offsets[i]; e < end; e++) {
            double x = grads[1][e] - grads[0][e];
            d += x * x;
            n += (double)grads[0][e] * grads[0][e];
        }
        all_d += d, all_n += n;
        if (n > 0) worst = fmax(worst, sqrt(d / n));
    }
    print_message("gradients: %.3g of the f32 norm apart, the worst parameter %.3g\n",
                  sqrt(all_d / all_n), worst);
    assert_true(all_d > 0); /* bf16 did round something */
    assert_true(sqrt(all_d / all_n) < 1e-2);
    assert_true(worst < 5e-2);
    free(grads[0]);
    free(grads[1]);
}

/* bf16 where no kernel computes it is refused, naming the op. */
static void test_refusals(void **state)
{
    (void)state;
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_tensor *x = spmd_input(g, "x", SPMD_F32, 2, (const int64_t[]){4, 4});
    spmd_tensor *h = spmd_convert(g, x, SPMD_BF16);
    assert_null(spmd_add(g, h, h));
    assert_non_null(strstr(spmd_last_error(), "add: expects f32, got bf16"));
    assert_null(spmd_convert(g, x, SPMD_I32));
    assert_non_null(strstr(spmd_last_error(), "only f32 and bf16 convert"));
    assert_int_equal(spmd_graph_set_matmul_precision(g, SPMD_I32), SPMD_ERR_INVALID);
    assert_int_equal(spmd_graph_set_reduce_precision(g, SPMD_I32), SPMD_ERR_INVALID);
    assert_non_null(strstr(spmd_last_error(), "gradients are reduced in f32 or bf16"));
    spmd_graph_free(g);

    g = spmd_graph_create(NULL);
    assert_null(spmd_input(g, "b", SPMD_BF16, 2, (const int64_t[]){4, 4}));
    assert_non_null(strstr(spmd_last_error(), "input 'b': dtype bf16; inputs, parameters and state are f32 or i32"));
    spmd_graph_free(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_convert_rounds_to_nearest_even),
        cmocka_unit_test(test_bf16_follows_f32),
        cmocka_unit_test(test_bf16_meshes_follow_one_device),
        cmocka_unit_test(test_bf16_reduction),
        cmocka_unit_test(test_kept_values_are_bf16),
        cmocka_unit_test(test_bf16_holds_less),
        cmocka_unit_test(test_bf16_gradients_follow_f32),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
