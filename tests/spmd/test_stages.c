/*
 * Pipeline stages (docs/DESIGN.md, "Pipeline stages"): the GPT split into
 * S stages over a mesh's stage axis, M micro-batches a step, trains as the
 * GPT without stages accumulating the same M micro-batches on one device
 * (the losses within 1e-5 relative, the weights within 1e-5), on 2 and 4
 * stages, on an uneven split and on 2 stages x 2 data replicas; a rerun gives the same bits; a
 * checkpoint saved on stages resumes on them bit for bit and on one device; the
 * embeddings run on the first stage and the loss on the last, as explain
 * says; bad input
 * is refused with its reason.
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

enum { STEPS = 5, MICRO = 2, SEQ = 8, VOCAB = 16 };

static const spmd_gpt_config CFG = {.vocab = VOCAB, .seq = SEQ, .layers = 4, .heads = 2, .dim = 16};

typedef struct setup {
    spmd_mesh *mesh;
    spmd_graph *g;
    spmd_gpt_tensors t;
    spmd_trainer *tr;
    spmd_program *p;
    int micro; /* micro-batches per step: fed at once with stages, one by one without */
} setup;

static spmd_optimizer adamw(void)
{
    return (spmd_optimizer){.kind = SPMD_OPTIMIZER_ADAMW, .weight_decay = 0.1f, .clip_norm = 1.0f};
}

/* The GPT without stages, accumulating `micro` micro-batches, on one device. */
static void make_plain(setup *s, const spmd_gpt_config *cfg, int micro)
{
    memset(s, 0, sizeof *s);
    s->micro = micro;
    s->g = spmd_graph_create(NULL);
    assert_int_equal(spmd_gpt_build(s->g, cfg, MICRO, &s->t), SPMD_OK);
    spmd_optimizer opt = adamw();
    opt.accumulate_steps = micro;
    s->tr = spmd_trainer_create(s->g, s->t.loss,
                                &(spmd_trainer_options){.optimizer = opt,
                                                        .compile = {.seed = 3, .threads = 2}});
    if (!s->tr) fail_msg("plain: %s", spmd_last_error());
    s->p = spmd_trainer_program(s->tr);
}

/* The other axes beside the stage axis "pp", in this order, and
 * activation checkpointing. */
typedef struct layout {
    bool fsdp;       /* 2 along "fsdp": each stage's parameters split */
    bool tensor;     /* 2 along "tensor": Megatron's splits inside each stage */
    int replicas;    /* along "data", which splits each micro-batch */
    bool checkpoint; /* every micro-batch's block outputs kept, the rest recomputed */
    spmd_pipeline_schedule schedule;
} layout;

/* The graph's block outputs, every micro-batch's ("mb{k}." before all
 * but the first's), as the checkpoints; their count. */
static int block_outputs(spmd_graph *g, const spmd_gpt_config *cfg, int micro, spmd_tensor **cuts)
{
    int n = 0;
    for (int k = 0; k < micro; k++)
        for (int i = 0; i < cfg->layers; i++) {
            char name[48];
            if (k) snprintf(name, sizeof name, "mb%d.h.%d.out", k, i);
            else snprintf(name, sizeof name, "h.%d.out", i);
            assert_non_null(cuts[n++] = spmd_graph_find(g, name));
        }
    return n;
}

/* The GPT on `stages` stages of a mesh "pp" with the other axes of `l`
 * (mesh false: one device). */
static spmd_status make_staged_as(setup *s, const spmd_gpt_config *cfg, int stages, int micro,
                                  bool mesh, const layout *l)
{
    memset(s, 0, sizeof *s);
    s->micro = micro;
    s->g = spmd_graph_create(NULL);
    spmd_status st = spmd_gpt_build_stages(s->g, cfg, MICRO, stages, micro, &s->t);
    if (st != SPMD_OK) return st;
    if (mesh) {
        char shape[32], axes[64], batch[64] = "";
        int n = snprintf(shape, sizeof shape, "%d", stages);
        snprintf(axes, sizeof axes, "pp");
        const char *other[] = {l->fsdp ? "fsdp" : NULL, l->tensor ? "tensor" : NULL,
                               l->replicas > 1 ? "data" : NULL};
        int sizes[] = {2, 2, l->replicas};
        for (int a = 0; a < 3; a++) {
            if (!other[a]) continue;
            n += snprintf(shape + n, sizeof shape - (size_t)n, "x%d", sizes[a]);
            strcat(axes, ","), strcat(axes, other[a]);
            if (a != 1) strcat(batch, *batch ? ", " : ""), strcat(batch, other[a]);
        }
        s->mesh = spmd_mesh_parse(shape, axes);
        assert_int_equal(spmd_mesh_set_stage_axis(s->mesh, 0), SPMD_OK);
        if (l->tensor) {
            /* Each stage's blocks split over 'tensor', the inputs' rows
             * over the other axes. */
            spmd_gpt_parallel how = {.tensor = "tensor", .fsdp = l->fsdp ? "fsdp" : NULL};
            if (spmd_gpt_shard_tensor_parallel(s->g, cfg, s->mesh, &how) != SPMD_OK)
                return spmd_last_status();
        } else {
            /* The inputs on every stage, each micro-batch's samples over
             * the other axes (the marks give the graph its mesh). */
            char spec[96];
            snprintf(spec, sizeof spec, !*batch ? "None, None, None"
                                        : strchr(batch, ',') ? "None, (%s), None" : "None, %s, None",
                     batch);
            assert_int_equal(spmd_mark_sharding(s->g, s->t.input, s->mesh, spec), SPMD_OK);
            assert_int_equal(spmd_mark_sharding(s->g, s->t.targets, s->mesh, spec), SPMD_OK);
        }
        if (l->fsdp) assert_int_equal(spmd_fsdp_wrap(s->g, s->mesh, "fsdp", NULL, 0, NULL), SPMD_OK);
    }
    spmd_tensor *cuts[64];
    int n_cuts = l->checkpoint ? block_outputs(s->g, cfg, micro, cuts) : 0;
    s->tr = spmd_trainer_create(s->g, s->t.loss,
                                &(spmd_trainer_options){.optimizer = adamw(),
                                                        .checkpoints = n_cuts ? cuts : NULL,
                                                        .n_checkpoints = n_cuts,
                                                        .compile = {.seed = 3, .threads = 4,
                                                                    .schedule = l->schedule}});
    if (!s->tr) return spmd_last_status();
    s->p = spmd_trainer_program(s->tr);
    return SPMD_OK;
}

static spmd_status make_staged(setup *s, const spmd_gpt_config *cfg, int stages, int micro, bool mesh)
{
    return make_staged_as(s, cfg, stages, micro, mesh, &(layout){0});
}

static void setup_free(setup *s)
{
    spmd_trainer_free(s->tr);
    spmd_graph_free(s->g);
    spmd_mesh_free(s->mesh);
}

/* Samples [first, first + n * MICRO) as the program's inputs. */
static void feed(setup *s, int64_t first, int n)
{
    size_t k = (size_t)n * MICRO * SEQ;
    int32_t *ids = malloc(k * sizeof *ids), *tg = malloc(k * sizeof *tg);
    assert_int_equal(spmd_data_sequences(7, first, n * MICRO, SEQ, VOCAB, ids, tg), SPMD_OK);
    assert_int_equal(spmd_program_set_input(s->p, s->t.input, ids, k * sizeof *ids), SPMD_OK);
    assert_int_equal(spmd_program_set_input(s->p, s->t.targets, tg, k * sizeof *tg), SPMD_OK);
    free(ids), free(tg);
}

/* Step `step` over the samples from step * micro * MICRO on. */
static float train_step(setup *s, int step, bool staged, float *norm)
{
    float loss = 0.0f;
    int64_t first = (int64_t)step * s->micro * MICRO;
    if (staged) {
        feed(s, first, s->micro);
    } else {
        for (int k = 0; k < s->micro - 1; k++) {
            feed(s, first + (int64_t)k * MICRO, 1);
            if (spmd_trainer_accumulate(s->tr, NULL) != SPMD_OK)
                fail_msg("accumulate: %s", spmd_last_error());
        }
        feed(s, first + (int64_t)(s->micro - 1) * MICRO, 1);
    }
    if (spmd_trainer_step(s->tr, 1e-2f, &loss, norm) != SPMD_OK) fail_msg("step: %s", spmd_last_error());
    return loss;
}

static float *read_param(setup *s, const char *name, size_t *n)
{
    spmd_tensor *w = spmd_graph_find(s->g, name);
    assert_non_null(w);
    *n = (size_t)spmd_tensor_numel(w);
    float *v = malloc(*n * sizeof *v);
    if (spmd_program_read(s->p, w, v, *n * sizeof *v) != SPMD_OK) fail_msg("read %s: %s", name, spmd_last_error());
    return v;
}

static bool close_rel(double a, double b, double tol)
{
    return fabs(a - b) <= tol * fmax(fabs(a), fabs(b)) + 1e-7;
}

/* S stages (beside the other axes of `l`), M micro-batches against
 * accumulation over the same M. */
static void compare_as(const spmd_gpt_config *cfg, int stages, int micro, const layout *l)
{
    setup plain, staged;
    make_plain(&plain, cfg, micro);
    if (make_staged_as(&staged, cfg, stages, micro, true, l) != SPMD_OK)
        fail_msg("%d stages: %s", stages, spmd_last_error());
    for (int s = 0; s < STEPS; s++) {
        float np = 0, ns = 0;
        float lp = train_step(&plain, s, false, &np), ls = train_step(&staged, s, true, &ns);
        if (!close_rel(lp, ls, 1e-5) || !close_rel(np, ns, 1e-5))
            fail_msg("%d stages step %d: loss %.8g vs %.8g, grad norm %.8g vs %.8g", stages, s, lp,
                     ls, np, ns);
    }
    char last[64];
    snprintf(last, sizeof last, "h.%d.mlp.c_proj.weight", cfg->layers - 1);
    const char *const names[] = {"wte.weight", "wpe.weight", "h.0.attn.c_attn.weight", last,
                                 "ln_f.weight"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        size_t n;
        float *a = read_param(&plain, names[i], &n), *b = read_param(&staged, names[i], &n);
        for (size_t j = 0; j < n; j++)
            if (fabsf(a[j] - b[j]) > 1e-5f)
                fail_msg("%d stages %s[%zu]: %.8g vs %.8g", stages, names[i], j, a[j], b[j]);
        free(a), free(b);
    }
    setup_free(&plain);
    setup_free(&staged);
}

static void compare(const spmd_gpt_config *cfg, int stages, int micro)
{
    compare_as(cfg, stages, micro, &(layout){0});
}

static void test_two_stages_train_as_accumulation(void **state)
{
    (void)state;
    compare(&CFG, 2, 4);
}

static void test_four_stages_train_as_accumulation(void **state)
{
    (void)state;
    compare(&CFG, 4, 4);
}

/* 5 layers on 2 stages: 3 and 2. */
static void test_an_uneven_split_trains_as_accumulation(void **state)
{
    (void)state;
    assert_int_equal(spmd_gpt_stage_first_layer(5, 2, 1), 3);
    assert_int_equal(spmd_gpt_stage_first_layer(5, 2, 2), 5);
    assert_int_equal(spmd_gpt_stage_first_layer(6, 4, 3), 5);
    spmd_gpt_config cfg = CFG;
    cfg.layers = 5;
    compare(&cfg, 2, 3);
}

/* 2 stages x 2 replicas: each stage's gradients reduced over 'data'
 * inside it, ZeRO's state split over 'data', the norm over both. */
static void test_stages_beside_a_data_axis(void **state)
{
    (void)state;
    compare_as(&CFG, 2, 4, &(layout){.replicas = 2});
}

/* 2 stages x 2 fsdp x 2 data: each stage's parameters split over
 * 'fsdp', gathered where its blocks read them. */
static void test_stages_fsdp_and_data(void **state)
{
    (void)state;
    compare_as(&CFG, 2, 4, &(layout){.fsdp = true, .replicas = 2});
}

/* 2 stages x 2 tensor, and x 2 data: each stage's blocks and the tied
 * head split as Megatron's tensor parallelism splits them without
 * stages, its collectives inside the stage. */
static void test_stages_and_tensor_parallelism(void **state)
{
    (void)state;
    compare_as(&CFG, 2, 4, &(layout){.tensor = true});
    compare_as(&CFG, 2, 4, &(layout){.tensor = true, .replicas = 2});
}

/* The transfers of a compiled program. */
static int transfers_of(const setup *s)
{
    const partition *part = executor_partition(s->p);
    assert_non_null(part);
    int n = 0;
    for (int i = 0; i < part->local->n_nodes; i++) n += part->local->nodes[i]->op == IR_STAGE_TRANSFER;
    return n;
}

/* Activation checkpointing per stage: each block's outputs kept, the
 * rest recomputed on its stage; what a transfer brought is kept too, so
 * the backward sends nothing twice (the transfers of the plain graph),
 * and each stage's part of the arena shrinks. Trains as accumulation, on
 * 2 stages and on 2 stages x 2 tensor. */
static void test_stages_with_activation_checkpointing(void **state)
{
    (void)state;
    compare_as(&CFG, 2, 4, &(layout){.checkpoint = true});
    compare_as(&CFG, 2, 4, &(layout){.tensor = true, .checkpoint = true});
    setup plain, kept;
    assert_int_equal(make_staged(&plain, &CFG, 2, 4, true), SPMD_OK);
    assert_int_equal(make_staged_as(&kept, &CFG, 2, 4, true, &(layout){.checkpoint = true}), SPMD_OK);
    assert_int_equal(transfers_of(&kept), transfers_of(&plain));
    const compiled *a = executor_compiled(plain.p), *b = executor_compiled(kept.p);
    for (int d = 0; d < 2; d++)
        if (compiled_stage_arena_bytes(b, d) >= compiled_stage_arena_bytes(a, d))
            fail_msg("stage %d: %zu bytes of arena with checkpoints, %zu without", d,
                     compiled_stage_arena_bytes(b, d), compiled_stage_arena_bytes(a, d));
    setup_free(&plain);
    setup_free(&kept);
}

/* Two runs of one seed: the same losses, bit for bit; and the graph with
 * stages on one device (every transfer a copy) computes what the mesh
 * does within rounding. */
static void test_same_seed_same_bits(void **state)
{
    (void)state;
    setup a, b, one;
    assert_int_equal(make_staged(&a, &CFG, 2, 4, true), SPMD_OK);
    assert_int_equal(make_staged(&b, &CFG, 2, 4, true), SPMD_OK);
    assert_int_equal(make_staged(&one, &CFG, 2, 4, false), SPMD_OK);
    /* Where the per-device program runs its ops. */
    const partition *part = executor_partition(a.p);
    assert_non_null(part);
    int lookups = 0, losses = 0, transfers = 0;
    for (int i = 0; i < part->local->n_nodes; i++) {
        const spmd_tensor *t = part->local->nodes[i];
        if (t->op == IR_EMBEDDING) lookups++, assert_int_equal(t->stage, 0);
        if (t->op == IR_CROSS_ENTROPY) losses++, assert_int_equal(t->stage, 1);
        transfers += t->op == IR_STAGE_TRANSFER;
    }
    assert_int_equal(lookups, 4);
    assert_int_equal(losses, 4);
    /* Per micro-batch the activation and its gradient; wte to the head and
     * its gradient back; the norm's sum and the clipping scale. */
    assert_int_equal(transfers, 4 * 2 + 2 + 2);
    /* Explain names each stage's blocks and other parameters. */
    char *text = NULL;
    assert_int_equal(spmd_program_explain(a.p, NULL, &text), SPMD_OK);
    if (!strstr(text, "stages: 2 along 'pp'") ||
        !strstr(text, "stage 0: blocks 0-1 + wte.weight, wpe.weight, ") ||
        !strstr(text, "stage 1: blocks 2-3 + ln_f.weight, ln_f.bias, "))
        fail_msg("explain:\n%s", text);
    free(text);
    for (int s = 0; s < 3; s++) {
        float la = train_step(&a, s, true, NULL), lb = train_step(&b, s, true, NULL);
        float l1 = train_step(&one, s, true, NULL);
        if (memcmp(&la, &lb, sizeof la) != 0) fail_msg("step %d: %.9g then %.9g", s, la, lb);
        if (!close_rel(la, l1, 1e-5)) fail_msg("step %d: mesh %.9g, one device %.9g", s, la, l1);
    }
    /* A checkpoint saved from each parameter's home stage, loaded into
     * fresh programs on the mesh and on one device: their next step is
     * the saved program's (bit for bit on the same mesh). */
    char *ck = support_temp_dir("test_stages_ck");
    if (spmd_checkpoint_save(a.p, ck, 3, NULL, 0) != SPMD_OK)
        fail_msg("save: %s", spmd_last_error());
    setup c, d;
    assert_int_equal(make_staged(&c, &CFG, 2, 4, true), SPMD_OK);
    assert_int_equal(make_staged(&d, &CFG, 2, 4, false), SPMD_OK);
    if (spmd_checkpoint_load(c.p, ck, NULL, NULL) != SPMD_OK ||
        spmd_checkpoint_load(d.p, ck, NULL, NULL) != SPMD_OK)
        fail_msg("load: %s", spmd_last_error());
    support_drop_dir(ck);
    float la = train_step(&a, 3, true, NULL), lc = train_step(&c, 3, true, NULL);
    float ld = train_step(&d, 3, true, NULL);
    if (memcmp(&la, &lc, sizeof la) != 0) fail_msg("resumed: %.9g, saved program %.9g", lc, la);
    if (!close_rel(la, ld, 1e-5))
        fail_msg("resumed on one device: %.9g, saved program %.9g", ld, la);
    setup_free(&c);
    setup_free(&d);
    setup_free(&a);
    setup_free(&b);
    setup_free(&one);
}

/* The bytes of the parameters of stage s of `stages` over cfg's layers
 * (split as spmd_gpt_build_stages does: the first layers % stages one
 * more), by name: its blocks, the embeddings on the first stage, the
 * final norm on the last. */
static size_t stage_param_bytes(setup *s, const spmd_gpt_config *cfg, int stage, int stages)
{
    int per = cfg->layers / stages, extra = cfg->layers % stages;
    int first = stage * per + (stage < extra ? stage : extra), end = first + per + (stage < extra);
    size_t bytes = 0;
    for (int i = 0; i < spmd_graph_tensor_count(s->g); i++) {
        const spmd_tensor *t = spmd_graph_tensor(s->g, i);
        if (t->op != IR_PARAM) continue;
        int layer;
        bool mine = sscanf(t->name, "h.%d.", &layer) == 1 ? layer >= first && layer < end
                    : strncmp(t->name, "ln_f.", 5) == 0 ? stage == stages - 1
                                                         : stage == 0;
        if (mine) bytes += ir_nbytes(t);
    }
    return bytes;
}

/* Each device allocates its stage's parameters, AdamW's two moments and
 * the three's update values (buffers of their own): 6 x its parameters'
 * bytes, about 1/S of the layers', and the part of the arena its
 * stage's values lie in. */
static void each_device_holds_its_stage(int stages)
{
    spmd_gpt_config cfg = CFG;
    cfg.layers = 8;
    cfg.dim = 32;
    setup s;
    assert_int_equal(make_staged(&s, &cfg, stages, stages, true), SPMD_OK);
    train_step(&s, 0, true, NULL);
    const compiled *c = executor_compiled(s.p);
    size_t inputs = 2 * (size_t)stages * MICRO * SEQ * sizeof(int32_t);
    size_t scratch = c->scratch_each * (size_t)c->nth, all = 0;
    int first = 0;
    assert_int_equal(spmd_program_local_devices(s.p, &first), stages);
    for (int d = 0; d < stages; d++) {
        size_t params = stage_param_bytes(&s, &cfg, d, stages), arena = compiled_stage_arena_bytes(c, d);
        size_t got = executor_device_allocated(s.p, d) - inputs - scratch - arena;
        all += params;
        /* A few scalars besides (the step count and its update). */
        if (got < 6 * params || got > 6 * params + 256)
            fail_msg("stage %d of %d: %zu bytes besides inputs, scratch and arena, not 6 x %zu", d,
                     stages, got, params);
        assert_true(arena <= c->plan.arena_bytes);
    }
    assert_int_equal(all, stage_param_bytes(&s, &cfg, 0, 1));
    setup_free(&s);
}

static void test_each_device_holds_its_stage(void **state)
{
    (void)state;
    each_device_holds_its_stage(2);
    each_device_holds_its_stage(4);
}

/* 1F1B runs the graph GPipe runs in another order: the same bits step
 * by step, and accumulation's losses and weights within 1e-5. */
static void test_one_f_one_b_trains_as_gpipe(void **state)
{
    (void)state;
    for (int stages = 2; stages <= 4; stages += 2) {
        setup gpipe, one_f;
        assert_int_equal(make_staged_as(&gpipe, &CFG, stages, 2 * stages, true, &(layout){0}), SPMD_OK);
        assert_int_equal(make_staged_as(&one_f, &CFG, stages, 2 * stages, true,
                                        &(layout){.schedule = SPMD_SCHEDULE_1F1B}),
                         SPMD_OK);
        for (int s = 0; s < 3; s++) {
            float a = train_step(&gpipe, s, true, NULL), b = train_step(&one_f, s, true, NULL);
            if (memcmp(&a, &b, sizeof a) != 0)
                fail_msg("%d stages step %d: GPipe %.9g, 1F1B %.9g", stages, s, a, b);
        }
        setup_free(&gpipe);
        setup_free(&one_f);
        compare_as(&CFG, stages, 2 * stages, &(layout){.schedule = SPMD_SCHEDULE_1F1B});
    }
    compare_as(&CFG, 2, 4, &(layout){.fsdp = true, .replicas = 2, .schedule = SPMD_SCHEDULE_1F1B});
    compare_as(&CFG, 2, 4, &(layout){.tensor = true, .checkpoint = true, .schedule = SPMD_SCHEDULE_1F1B});
}

/* What a device of each stage allocates besides its inputs, with M
 * micro-batches on 2 stages. */
static void allocated_per_stage(spmd_pipeline_schedule schedule, int micro, size_t out[2])
{
    spmd_gpt_config cfg = CFG;
    cfg.dim = 32;
    setup s;
    assert_int_equal(make_staged_as(&s, &cfg, 2, micro, true, &(layout){.schedule = schedule}), SPMD_OK);
    train_step(&s, 0, true, NULL);
    size_t inputs = 2 * (size_t)micro * MICRO * SEQ * sizeof(int32_t);
    for (int d = 0; d < 2; d++) out[d] = executor_device_allocated(s.p, d) - inputs;
    setup_free(&s);
}

/* 1F1B holds at most S - s micro-batches' activations on stage s (and
 * the gradients' running sums) whatever M: what a device allocates at
 * M = 8S is within 10% of M = 2S's (the free list's fragments differ),
 * and less than GPipe's at M = 2S; GPipe's grows with M. */
static void test_one_f_one_b_bounds_activations(void **state)
{
    (void)state;
    size_t one_2s[2], one_8s[2], gpipe_2s[2], gpipe_8s[2];
    allocated_per_stage(SPMD_SCHEDULE_1F1B, 4, one_2s);
    allocated_per_stage(SPMD_SCHEDULE_1F1B, 16, one_8s);
    allocated_per_stage(SPMD_SCHEDULE_GPIPE, 4, gpipe_2s);
    allocated_per_stage(SPMD_SCHEDULE_GPIPE, 16, gpipe_8s);
    for (int d = 0; d < 2; d++) {
        if ((double)one_8s[d] > 1.1 * (double)one_2s[d] || one_8s[d] >= gpipe_2s[d])
            fail_msg("1F1B stage %d: %zu bytes at M = 16, %zu at M = 4 (GPipe %zu at M = 4)", d,
                     one_8s[d], one_2s[d], gpipe_2s[d]);
        if ((double)gpipe_8s[d] < 1.5 * (double)gpipe_2s[d])
            fail_msg("GPipe stage %d: %zu bytes at M = 16, %zu at M = 4: it holds every micro-batch", d,
                     gpipe_8s[d], gpipe_2s[d]);
    }
}

static void expect_refused(spmd_status st, const char *what)
{
    if (st == SPMD_OK) fail_msg("accepted; expected a refusal naming '%s'", what);
    if (!strstr(spmd_last_error(), what)) fail_msg("'%s' does not name '%s'", spmd_last_error(), what);
}

static void test_bad_input_is_refused(void **state)
{
    (void)state;
    setup s;
    /* More stages than layers; fewer micro-batches than stages. */
    expect_refused(make_staged(&s, &CFG, 5, 5, false), "5 stages for 4 layers");
    setup_free(&s);
    expect_refused(make_staged(&s, &CFG, 4, 2, false), "2 micro-batches for 4 stages");
    setup_free(&s);
    /* A mark over the stage axis; the stage axis independent, or the
     * other way round. */
    spmd_mesh *m = spmd_mesh_parse("2x2", "pp,data");
    assert_int_equal(spmd_mesh_set_axis_independent(m, 1, true), SPMD_OK);
    expect_refused(spmd_mesh_set_stage_axis(m, 1), "axis 'data' is independent");
    assert_int_equal(spmd_mesh_set_axis_independent(m, 1, false), SPMD_OK);
    assert_int_equal(spmd_mesh_set_stage_axis(m, 0), SPMD_OK);
    assert_int_equal(spmd_mesh_stage_axis(m), 0);
    expect_refused(spmd_mesh_set_axis_independent(m, 0, true), "axis 'pp' is the stage axis");
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_gpt_tensors t;
    assert_int_equal(spmd_gpt_build_stages(g, &CFG, MICRO, 2, 2, &t), SPMD_OK);
    expect_refused(spmd_mark_sharding(g, t.input, m, "None, pp, None"), "stage axis");
    /* The graph's stages must fit the axis: 4 stages on 2 devices. */
    spmd_graph_free(g);
    g = spmd_graph_create(NULL);
    assert_int_equal(spmd_gpt_build_stages(g, &CFG, MICRO, 4, 4, &t), SPMD_OK);
    assert_int_equal(spmd_mark_sharding(g, t.input, m, "None, data, None"), SPMD_OK);
    spmd_graph_mark_output(g, t.loss);
    expect_refused(spmd_compile(g, &(spmd_compile_options){.threads = 1}) ? SPMD_OK : spmd_last_status(),
                   "has 2 devices");
    spmd_graph_free(g);
    /* A value read on another stage without a transfer. */
    g = spmd_graph_create(NULL);
    spmd_tensor *x = spmd_input(g, "x", SPMD_F32, 2, (const int64_t[]){4, 4});
    spmd_tensor *w = spmd_param(g, "w", 2, (const int64_t[]){4, 4}, (spmd_init){SPMD_INIT_NORMAL, 1});
    spmd_graph_set_stage(g, 0);
    spmd_tensor *y = spmd_matmul(g, x, w, false, false);
    spmd_graph_set_stage(g, 1);
    spmd_tensor *loss = spmd_mean(g, spmd_mul(g, y, y), 3, false);
    assert_non_null(loss);
    assert_int_equal(spmd_mark_sharding(g, x, m, "data, None"), SPMD_OK);
    spmd_graph_mark_output(g, loss);
    expect_refused(spmd_compile(g, &(spmd_compile_options){.threads = 1}) ? SPMD_OK : spmd_last_status(),
                   "crosses stages only through spmd_stage_transfer");
    spmd_graph_free(g);
    /* Collectives in flight are not built with stages. */
    g = spmd_graph_create(NULL);
    assert_int_equal(spmd_gpt_build_stages(g, &CFG, MICRO, 2, 2, &t), SPMD_OK);
    assert_int_equal(spmd_mark_sharding(g, t.input, m, "None, data, None"), SPMD_OK);
    spmd_graph_mark_output(g, t.loss);
    expect_refused(spmd_compile(g, &(spmd_compile_options){.threads = 1, .overlap = true})
                       ? SPMD_OK : spmd_last_status(),
                   "overlap");
    spmd_graph_free(g);
    /* A transfer to a stage of its own. */
    g = spmd_graph_create(NULL);
    x = spmd_input(g, "x", SPMD_F32, 1, (const int64_t[]){4});
    assert_null(spmd_stage_transfer(g, x, 1, 1));
    assert_non_null(strstr(spmd_last_error(), "from stage 1 to stage 1"));
    spmd_graph_free(g);
    spmd_mesh_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_stages_train_as_accumulation),
        cmocka_unit_test(test_four_stages_train_as_accumulation),
        cmocka_unit_test(test_an_uneven_split_trains_as_accumulation),
        cmocka_unit_test(test_stages_beside_a_data_axis),
        cmocka_unit_test(test_stages_fsdp_and_data),
        cmocka_unit_test(test_stages_and_tensor_parallelism),
        cmocka_unit_test(test_stages_with_activation_checkpointing),
        cmocka_unit_test(test_same_seed_same_bits),
        cmocka_unit_test(test_each_device_holds_its_stage),
        cmocka_unit_test(test_one_f_one_b_trains_as_gpipe),
        cmocka_unit_test(test_one_f_one_b_bounds_activations),
        cmocka_unit_test(test_bad_input_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
