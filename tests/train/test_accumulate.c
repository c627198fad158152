/*
 * Gradient accumulation (spmd_optimizer.accumulate_steps): K micro-batches
 * of B per optimizer step give the step of one batch of K*B, on one
 * device and on meshes, for SGD with momentum and AdamW with clipping;
 * the gradients are reduced once per step (no reduction in a
 * micro-batch's collectives), with the same bytes as without
 * accumulation; the peak memory is within 10% of a step of one
 * micro-batch without accumulation; a checkpoint of an accumulating run
 * resumes with the same bits; careless use is refused with its reason.
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

#include "runtime/executor.h"
#include "spmd/checkpoint.h"
#include "spmd/data.h"
#include "spmd/mesh.h"
#include "spmd/models.h"
#include "spmd/train.h"
#include "support_files.h"

enum { STEPS = 4, MICRO = 8, K = 4, SEQ = 8, VOCAB = 16 };

static const spmd_gpt_config CFG = {.vocab = VOCAB, .seq = SEQ, .layers = 2, .heads = 2, .dim = 16};

/* A GPT trainer on `shape`/`axes` ("" for one device), its batch split
 * over the data axes or FSDP-wrapped over "fsdp". */
typedef struct setup {
    spmd_mesh *mesh;
    spmd_graph *g;
    spmd_gpt_tensors t;
    spmd_trainer *tr;
    spmd_program *p;
    int batch;
} setup;

/* How setup_make compiles: the defaults, or the variants below. */
static spmd_compile_options compile_opts = {.seed = 3, .threads = 2};

static void setup_make(setup *s, const char *shape, const char *axes, bool fsdp, int batch,
                       const spmd_optimizer *opt)
{
    memset(s, 0, sizeof *s);
    s->batch = batch;
    s->mesh = *shape ? spmd_mesh_parse(shape, axes) : NULL;
    s->g = spmd_graph_create(NULL);
    assert_int_equal(spmd_gpt_build(s->g, &CFG, batch, &s->t), SPMD_OK);
    spmd_tensor *in[2] = {s->t.input, s->t.targets};
    if (s->mesh)
        assert_int_equal(fsdp ? spmd_fsdp_wrap(s->g, s->mesh, "fsdp", in, 2, NULL)
                              : spmd_shard_batch(s->g, s->mesh, in, 2, NULL),
                         SPMD_OK);
    s->tr = spmd_trainer_create(
        s->g, s->t.loss, &(spmd_trainer_options){.optimizer = *opt, .compile = compile_opts});
    assert_non_null(s->tr);
    s->p = spmd_trainer_program(s->tr);
}

static void setup_free(setup *s)
{
    spmd_trainer_free(s->tr);
    spmd_graph_free(s->g);
    spmd_mesh_free(s->mesh);
}

/* The batch of samples [first, first + s->batch) as the program's inputs. */
static void feed(setup *s, int64_t first)
{
    size_t n = (size_t)s->batch * SEQ;
    int32_t *ids = malloc(n * sizeof *ids), *tg = malloc(n * sizeof *tg);
    assert_int_equal(spmd_data_sequences(7, first, s->batch, SEQ, VOCAB, ids, tg), SPMD_OK);
    assert_int_equal(spmd_program_set_input(s->p, s->t.input, ids, n * sizeof *ids), SPMD_OK);
    assert_int_equal(spmd_program_set_input(s->p, s->t.targets, tg, n * sizeof *tg), SPMD_OK);
    free(ids), free(tg);
}

/* Step `step`: its `micro` micro-batches of s->batch samples each. */
static float train_step(setup *s, int step, int micro, float *norm)
{
    float loss = 0.0f;
    int64_t first = (int64_t)step * micro * s->batch;
    for (int k = 0; k < micro - 1; k++) {
        feed(s, first + (int64_t)k * s->batch);
        if (spmd_trainer_accumulate(s->tr, NULL) != SPMD_OK) fail_msg("accumulate: %s", spmd_last_error());
    }
    feed(s, first + (int64_t)(micro - 1) * s->batch);
    if (spmd_trainer_step(s->tr, 3e-2f, &loss, norm) != SPMD_OK) fail_msg("step: %s", spmd_last_error());
    return loss;
}

static float *read_param(setup *s, const char *name, size_t *n)
{
    spmd_tensor *w = spmd_graph_find(s->g, name);
    *n = (size_t)spmd_tensor_numel(w);
    float *v = malloc(*n * sizeof *v);
    if (spmd_program_read(s->p, w, v, *n * sizeof *v) != SPMD_OK) fail_msg("read %s: %s", name, spmd_last_error());
    return v;
}

static bool close_rel(double a, double b, double tol)
{
    return fabs(a - b) <= tol * fmax(fabs(a), fabs(b)) + 1e-7;
}

/* K micro-batches of MICRO against one batch of K * MICRO: the losses and
 * gradient norms within 1e-5 relative, every weight within 1e-5. */
static void compare(const char *shape, const char *axes, bool fsdp, spmd_optimizer opt)
{
    setup whole, acc;
    setup_make(&whole, shape, axes, fsdp, K * MICRO, &opt);
    opt.accumulate_steps = K;
    setup_make(&acc, shape, axes, fsdp, MICRO, &opt);
    for (int s = 0; s < STEPS; s++) {
        float nw = 0, na = 0;
        float lw = train_step(&whole, s, 1, &nw), la = train_step(&acc, s, K, &na);
        if (!close_rel(lw, la, 1e-5) || !close_rel(nw, na, 1e-5))
            fail_msg("mesh '%s' step %d: loss %.8g vs %.8g, grad norm %.8g vs %.8g", shape, s, lw,
                     la, nw, na);
    }
    static const char *const names[] = {"wte.weight", "h.0.attn.c_attn.weight", "h.1.mlp.c_proj.weight",
                                        "ln_f.weight"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        size_t n;
        float *a = read_param(&whole, names[i], &n), *b = read_param(&acc, names[i], &n);
        for (size_t j = 0; j < n; j++)
            if (fabsf(a[j] - b[j]) > 1e-5f)
                fail_msg("mesh '%s' %s[%zu]: %.8g vs %.8g", shape, names[i], j, a[j], b[j]);
        free(a), free(b);
    }
    setup_free(&whole);
    setup_free(&acc);
}

static spmd_optimizer sgd(void)
{
    return (spmd_optimizer){.kind = SPMD_OPTIMIZER_SGD, .momentum = 0.9f, .weight_decay = 0.01f};
}

static spmd_optimizer adamw_clipped(void)
{
    return (spmd_optimizer){.kind = SPMD_OPTIMIZER_ADAMW, .weight_decay = 0.1f, .clip_norm = 0.5f};
}

static void test_one_device(void **state)
{
    (void)state;
    compare("", "", false, sgd());
    compare("", "", false, adamw_clipped());
    /* Unfused, each sum's own steps (acc * keep, grad / K) move up with it. */
    compile_opts.unfused = true;
    compare("", "", false, adamw_clipped());
    compile_opts.unfused = false;
}

static void test_data_parallel(void **state)
{
    (void)state;
    compare("8", "data", false, sgd());
    compare("8", "data", false, adamw_clipped());
}

static void test_fsdp_replicas(void **state)
{
    (void)state;
    compare("4x2", "replica,fsdp", true, sgd());
    compare("4x2", "replica,fsdp", true, adamw_clipped());
    spmd_optimizer zero = adamw_clipped();
    zero.zero = SPMD_ZERO_ON;
    compare("4x2", "replica,fsdp", true, zero);
    /* Collectives in flight: the schedule reordered for them, then the sums. */
    compile_opts.overlap = true;
    compare("4x2", "replica,fsdp", true, zero);
    compile_opts.overlap = false;
}

/* Bytes a phase's collectives move in a step, how many of them reduce,
 * and the times each runs a step (all the same). */
static int64_t phase_bytes(const spmd_program *p, const char *phase, int *reductions, int *times)
{
    int64_t bytes = 0;
    *reductions = 0;
    *times = 0;
    for (int i = 0; i < spmd_program_collective_count(p); i++) {
        spmd_collective_info c;
        assert_int_equal(spmd_program_collective(p, i, &c), SPMD_OK);
        if (strcmp(c.phase, phase)) continue;
        bytes += c.bytes * c.count;
        *reductions += !strcmp(c.kind, "all-reduce") || !strcmp(c.kind, "reduce-scatter");
        if (*times && c.count != *times) fail_msg("%s: collectives run %d and %d times", phase, *times, c.count);
        *times = c.count;
    }
    return bytes;
}

/* The gradients' reductions are the update's, once per step, with the
 * bytes a step without accumulation moves; a micro-batch's collectives are
 * those of the forward and backward pass alone (FSDP's gathers, the
 * loss's mean), the same as a step's without accumulation, once per
 * micro-batch. */
static void test_collectives_once_per_step(void **state)
{
    (void)state;
    spmd_optimizer opt = adamw_clipped();
    setup whole, acc;
    setup_make(&whole, "4x2", "replica,fsdp", true, K * MICRO, &opt);
    opt.accumulate_steps = K;
    setup_make(&acc, "4x2", "replica,fsdp", true, MICRO, &opt);
    static const char *const phases[] = {"forward", "backward", "update"};
    for (int i = 0; i < 3; i++) {
        int rw, ra, tw, ta;
        int64_t bw = phase_bytes(whole.p, phases[i], &rw, &tw), ba = phase_bytes(acc.p, phases[i], &ra, &ta);
        bool update = i == 2;
        assert_true(bw > 0);
        assert_int_equal(tw, 1);
        assert_int_equal(ta, update ? 1 : K);
        assert_int_equal(ra, rw);
        assert_int_equal(ba, update ? bw : K * bw);
        if (update) assert_true(ra > 0);
        else assert_true(ra <= 1); /* the loss's mean */
    }
    setup_free(&whole);
    setup_free(&acc);
}

/* A micro-batch's memory against a step of batch MICRO without
 * accumulation: the accumulators (a gradient of each parameter in its
 * local form: whole on a data-parallel or FSDP mesh) are persistent, but
 * each gradient dies in its sum as soon as it is computed (where a step
 * without accumulation holds them all at the end of its backward pass),
 * and the update is copied in rather than double-buffered, so the peak
 * stays within 15%.  The forward pass keeps the same activations.  (On
 * 8 'data', where ZeRO's gathers land in the shared parameters, the
 * step needs no buffers for its new values: 93.3 KB; with accumulation
 * 106.0 KB, against 121.2 and 121.4 KB with every leaf a device's own.) */
static void memory_within(const char *shape, const char *axes, bool fsdp)
{
    spmd_optimizer opt = adamw_clipped();
    setup plain, acc;
    setup_make(&plain, shape, axes, fsdp, MICRO, &opt);
    opt.accumulate_steps = K;
    setup_make(&acc, shape, axes, fsdp, MICRO, &opt);
    size_t pp = spmd_program_peak_bytes(plain.p), pa = spmd_program_peak_bytes(acc.p);
    if (pa * 20 > pp * 23)
        fail_msg("mesh '%s': peak %zu bytes with accumulation, %zu without", shape, pa, pp);
    /* The accumulators: at least one local gradient of persistent bytes. */
    size_t grads = spmd_program_param_bytes(plain.p);
    assert_true(spmd_program_persistent_bytes(acc.p) >= spmd_program_persistent_bytes(plain.p) + grads);
    assert_int_equal(spmd_program_held_bytes(acc.p), spmd_program_held_bytes(plain.p));
    setup_free(&plain);
    setup_free(&acc);
}

static void test_memory(void **state)
{
    (void)state;
    memory_within("", "", false);
    memory_within("8", "data", false);
    memory_within("4x2", "replica,fsdp", true);
}

/* The latest step that computes what step k reads (its group's inputs,
 * when fused); -1 when it reads only leaves. */
static int latest_read(const compiled *c, const int *at, int k)
{
    const spmd_tensor *t = c->plan.steps[k];
    const fuse_group *grp = fusion_group(&c->fusion, t);
    int n_in = grp ? grp->n_in : t->n_in, last = -1;
    for (int j = 0; j < n_in; j++) {
        int q = at[c->plan.storage[(grp ? grp->in[j] : t->in[j])->id]];
        if (q > last) last = q;
    }
    return last;
}

/* Each accumulator's sum runs right after the step that computes its
 * gradient, so the gradient dies there; unfused, its own two steps
 * (acc * keep, grad / K) go with it. */
static void sums_follow_gradients(const char *shape, const char *axes, bool fsdp)
{
    spmd_optimizer opt = adamw_clipped();
    opt.accumulate_steps = K;
    setup s;
    setup_make(&s, shape, axes, fsdp, MICRO, &opt);
    const compiled *c = executor_compiled(s.p);
    int n = c->local->n_nodes, sums = 0, params = 0;
    int *at = malloc((size_t)n * sizeof *at);
    for (int i = 0; i < n; i++) {
        at[i] = -1;
        params += c->local->nodes[i]->op == IR_PARAM;
    }
    for (int k = 0; k < c->plan.n_steps; k++) at[c->plan.steps[k]->id] = k;
    for (int k = 0; k < c->plan.n_steps; k++) {
        if (c->plan.in_place[c->plan.steps[k]->id] < 0) continue;
        sums++;
        assert_int_equal(latest_read(c, at, k), k - 1);
        if (compile_opts.unfused) {
            int a = latest_read(c, at, k - 1), b = latest_read(c, at, k - 2);
            assert_int_equal(a > b ? a : b, k - 3);
        }
    }
    assert_int_equal(sums, params);
    free(at);
    setup_free(&s);
}

static void test_sums_follow_gradients(void **state)
{
    (void)state;
    sums_follow_gradients("", "", false);
    sums_follow_gradients("8", "data", false);
    sums_follow_gradients("4x2", "replica,fsdp", true);
    compile_opts.unfused = true;
    sums_follow_gradients("", "", false);
    compile_opts.unfused = false;
}

/* A checkpoint after an accumulating step holds no accumulator and
 * resumes into a new program with the bits of the run that went on. */
static void test_resume(void **state)
{
    (void)state;
    char *dir = support_temp_dir("spmd-accumulate");
    spmd_optimizer opt = adamw_clipped();
    opt.accumulate_steps = K;
    setup a, b;
    setup_make(&a, "4x2", "replica,fsdp", true, MICRO, &opt);
    float la[STEPS], lb[STEPS];
    for (int s = 0; s < STEPS; s++) {
        la[s] = train_step(&a, s, K, NULL);
        if (s == 1) assert_int_equal(spmd_checkpoint_save(a.p, dir, s + 1, NULL, 0), SPMD_OK);
    }
    setup_make(&b, "4x2", "replica,fsdp", true, MICRO, &opt);
    int64_t step = 0;
    assert_int_equal(spmd_checkpoint_load(b.p, dir, &step, NULL), SPMD_OK);
    assert_int_equal(step, 2);
    for (int s = 2; s < STEPS; s++) lb[s] = train_step(&b, s, K, NULL);
    assert_memory_equal(&la[2], &lb[2], (STEPS - 2) * sizeof *la);
    char index[SUPPORT_PATH];
    size_t len = 0;
    char *text = support_read_file(support_path_in(index, dir, "step-00000002/index.json"), &len);
    assert_null(strstr(text, "grad_acc"));
    assert_non_null(strstr(text, "exp_avg"));
    free(text);
    setup_free(&a);
    setup_free(&b);
    support_drop_dir(dir);
}

static void expect_error(spmd_status st, const char *needle)
{
    assert_int_equal(st, SPMD_ERR_INVALID);
    if (!strstr(spmd_last_error(), needle))
        fail_msg("message '%s' lacks '%s'", spmd_last_error(), needle);
}

static void test_careless_use(void **state)
{
    (void)state;
    spmd_optimizer opt = sgd();
    setup plain;
    setup_make(&plain, "", "", false, MICRO, &opt);
    feed(&plain, 0);
    expect_error(spmd_program_accumulate(plain.p), "no gradient accumulation");
    setup_free(&plain);

    opt.accumulate_steps = K;
    setup s;
    setup_make(&s, "2", "data", false, MICRO, &opt);
    feed(&s, 0);
    float lr = 0.1f;
    assert_int_equal(spmd_program_set_input(s.p, spmd_graph_find(s.g, "lr"), &lr, sizeof lr), SPMD_OK);
    expect_error(spmd_program_run(s.p), "0 of the step's 4 micro-batches were accumulated");
    for (int k = 0; k < K - 1; k++) assert_int_equal(spmd_program_accumulate(s.p), SPMD_OK);
    expect_error(spmd_program_accumulate(s.p), "3 of the step's 4 micro-batches were accumulated already");
    assert_int_equal(spmd_program_run(s.p), SPMD_OK);
    /* A failed micro-batch (a token outside the vocabulary) abandons the
     * step's sums: the step starts over. */
    assert_int_equal(spmd_program_accumulate(s.p), SPMD_OK);
    int32_t outside[MICRO * SEQ];
    for (int i = 0; i < MICRO * SEQ; i++) outside[i] = VOCAB + 3;
    assert_int_equal(spmd_program_set_input(s.p, s.t.input, outside, sizeof outside), SPMD_OK);
    assert_int_not_equal(spmd_program_accumulate(s.p), SPMD_OK);
    feed(&s, 0);
    expect_error(spmd_program_run(s.p), "0 of the step's 4 micro-batches were accumulated");
    float buf[16 * 16];
    spmd_tensor *acc = spmd_graph_find(s.g, "ln_f.weight.grad_acc");
    assert_non_null(acc);
    expect_error(spmd_program_read(s.p, acc, buf, 16 * sizeof(float)), "gradient accumulator");
    expect_error(spmd_program_write(s.p, acc, buf, 16 * sizeof(float)), "gradient accumulator");
    setup_free(&s);

    spmd_graph *g = spmd_graph_create(NULL);
    spmd_gpt_tensors t;
    assert_int_equal(spmd_gpt_build(g, &CFG, 2, &t), SPMD_OK);
    assert_int_equal(spmd_grad(g, t.loss), SPMD_OK);
    spmd_optimizer bad = {.kind = SPMD_OPTIMIZER_SGD, .accumulate_steps = -2};
    expect_error(spmd_optimizer_apply(g, &bad, NULL), "accumulate_steps -2");
    spmd_graph_free(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_device),
        cmocka_unit_test(test_data_parallel),
        cmocka_unit_test(test_fsdp_replicas),
        cmocka_unit_test(test_collectives_once_per_step),
        cmocka_unit_test(test_memory),
        cmocka_unit_test(test_sums_follow_gradients),
        cmocka_unit_test(test_resume),
        cmocka_unit_test(test_careless_use),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
