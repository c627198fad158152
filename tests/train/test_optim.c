/*
 * Optimizers and learning-rate schedules (spmd/train.h).
 *
 *   Against PyTorch: five steps of SGD with momentum and weight decay, SGD
 *     with clipping, AdamW, and AdamW with clipping and non-default betas,
 *     each under a warmup-cosine schedule, replayed from the trajectories
 *     torch.optim wrote (tests/vectors/optim.bin, make_optim_vectors.py):
 *     the lr of every step, the loss, the global gradient norm and every
 *     parameter after every step.
 *   Parameter groups against PyTorch (tests/vectors/optim_groups.bin): SGD
 *     with momentum, Adam (L2 decay) and AdamW in two groups (weights with
 *     weight decay, biases without, their own lr, momentum, betas and eps)
 *     with clipping over both, and Adam in one group, within 1e-7 + 1e-6
 *     |torch| of torch's float64 trajectory.
 *   spmd_lr_schedule at its key steps: start, mid-warmup, peak, the middle
 *     of the decay, the end and past it.
 *   SPMD: an MLP sharded FSDP-style over a 4x2 (replica, fsdp) mesh and
 *     trained with AdamW and clipping follows the one-device run (losses,
 *     gradient norms, parameters and moments), each device holds exactly
 *     half of the parameters and of the optimizer state, the moments are
 *     held in their parameter's sharding, and the update phase never
 *     gathers a parameter or a moment whole.
 *   Groups on meshes: two AdamW groups with clipping on 4x2 FSDP and under
 *     ZeRO on 8 follow one device within 1e-5 relative, the state sharded.
 *   Bookkeeping: "opt.step" counts steps, an existing input "lr" is reused;
 *     one group of every parameter is spmd_optimizer_apply bit for bit;
 *     "lr", "lr.1", ... are each group's, an existing one reused.
 *   Errors: bad settings and misuse (groups: a parameter in two groups or
 *     none, a name matching nothing, a group's bad settings by index) fail
 *     with a message and leave the graph as it was; allocation failures at
 *     every point say so.
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

#include "spmd/mesh.h"
#include "spmd/models.h"
#include "spmd/spmd.h"
#include "spmd/train.h"
#include "support_alloc.h"
#include "support_check.h"
#include "support_rng.h"
#include "support_vectors.h"

#define D(...) ((const int64_t[]){__VA_ARGS__})

/* float32 against float64 truth: make_optim_vectors.py checks that
 * torch's own float32 run uses well under a third of this. */
#define TORCH_ATOL 1e-6
#define TORCH_RTOL 1e-5
/* Each step's update (parameter after minus before) against torch's, to
 * a fraction of the largest element of the update: the parameters alone
 * hide errors in the update under their own size. */
#define UPDATE_ATOL 2e-7
#define UPDATE_RTOL 1e-5
/* A partitioned program against the same program on one device: sums
 * taken in another order. */
#define SPMD_ATOL 1e-6
#define SPMD_RTOL 1e-4
/* Parameter groups against torch's float64 truth, tighter: float32 torch
 * itself uses under half of this (make_optim_vectors.py checks). */
#define GROUPS_ATOL 1e-7
#define GROUPS_RTOL 1e-6
/* ... and with parameter groups. */
#define GROUPS_MESH_ATOL 1e-7
#define GROUPS_MESH_RTOL 1e-5
#define MAX_STEPS 16

/* got_after - got_before against want_after - want_before. */
static bool update_close(const char *what, const float *got_before, const float *got_after,
                         const float *want_before, const float *want_after, int64_t n)
{
    double scale = 0;
    for (int64_t i = 0; i < n; i++)
        scale = fmax(scale, fabs((double)want_after[i] - want_before[i]));
    double allowed = UPDATE_ATOL + UPDATE_RTOL * scale;
    for (int64_t i = 0; i < n; i++) {
        double got = (double)got_after[i] - got_before[i];
        double want = (double)want_after[i] - want_before[i];
        if (!(fabs(got - want) <= allowed)) {
            print_error("%s: element %lld of %lld moved %.9g, torch %.9g (|diff| %.3g, allowed "
                        "%.3g)\n", what, (long long)i, (long long)n, got, want, fabs(got - want),
                        allowed);
            return false;
        }
    }
    return true;
}

static float *read_all(const spmd_program *p, const spmd_tensor *t)
{
    size_t bytes = (size_t)spmd_tensor_numel(t) * sizeof(float);
    float *v = malloc(bytes);
    assert_non_null(v);
    if (spmd_program_read(p, t, v, bytes) != SPMD_OK)
        fail_msg("read '%s': %s", spmd_tensor_name(t), spmd_last_error());
    return v;
}

static float read_scalar(const spmd_program *p, const spmd_tensor *t)
{
    float v = NAN;
    if (spmd_program_read(p, t, &v, sizeof v) != SPMD_OK)
        fail_msg("read '%s': %s", spmd_tensor_name(t), spmd_last_error());
    return v;
}

static void set_scalar(spmd_program *p, const spmd_tensor *t, float v)
{
    if (spmd_program_set_input(p, t, &v, sizeof v) != SPMD_OK)
        fail_msg("set '%s': %s", spmd_tensor_name(t), spmd_last_error());
}

static spmd_tensor *find(spmd_graph *g, const char *name)
{
    spmd_tensor *t = spmd_graph_find(g, name);
    if (!t) fail_msg("the graph has no tensor '%s'", name);
    return t;
}

static spmd_program *compile(spmd_graph *g, int threads)
{
    spmd_compile_options opts = {.threads = threads, .seed = 11};
    spmd_program *p = spmd_compile(g, &opts);
    if (!p) fail_msg("compile: %s", spmd_last_error());
    return p;
}

/* An MLP with its MSE loss and backward pass: the graph an optimizer is
 * applied to. */
static spmd_mlp_tensors mlp_graph(spmd_graph *g, const spmd_mlp_config *cfg, int batch)
{
    spmd_mlp_tensors t;
    assert_int_equal(spmd_mlp_build(g, cfg, NULL, batch, &t), SPMD_OK);
    assert_int_equal(spmd_mlp_add_loss(g, SPMD_MLP_MSE, &t), SPMD_OK);
    assert_int_equal(spmd_graph_mark_output(g, t.loss), SPMD_OK);
    return t;
}

/* ---- Against PyTorch --------------------------------------------------------------------- */

static const char *const torch_cases[] = {"sgd_momentum", "sgd_clip", "adamw", "adamw_clip"};

static const tv_record *need(const tv_file *v, const char *name, int64_t numel)
{
    const tv_record *r = tv_find(v, name);
    if (!r) fail_msg("vector record '%s' is missing (rerun make_optim_vectors.py)", name);
    if (r->dtype != (strcmp(name, "config") == 0 ? TV_I32 : TV_F32) ||
        (numel >= 0 && r->numel != numel))
        fail_msg("vector record '%s': unexpected dtype or size", name);
    return r;
}

static const tv_record *need_case(const tv_file *v, const char *c, const char *what,
                                  int64_t numel)
{
    char name[128];
    snprintf(name, sizeof name, "%s.%s", c, what);
    return need(v, name, numel);
}

#define MAX_GROUPS 2

/* A torch case as built here: the MLP with its optimizer applied, each
 * group's learning-rate input and the lr torch used for it each step. */
typedef struct torch_replay {
    const char *name;
    spmd_graph *g;
    spmd_mlp_tensors t;
    spmd_tensor *lr[MAX_GROUPS];
    int n_groups;
    const float *lrs; /* [steps][n_groups] */
    spmd_tensor *grad_norm;
} torch_replay;

static spmd_mlp_config torch_config(const tv_file *v, int *batch, int *steps)
{
    const int32_t *cfgv = need(v, "config", 6)->data;
    *batch = cfgv[4];
    *steps = cfgv[5];
    assert_true(*steps > 0 && *steps <= MAX_STEPS);
    return (spmd_mlp_config){.in_dim = cfgv[0], .hidden = cfgv[1], .layers = cfgv[2],
                             .out_dim = cfgv[3]};
}

/* The MLP of the vectors with its backward pass, in r->g. */
static void torch_graph(const tv_file *v, torch_replay *r)
{
    int batch, steps;
    spmd_mlp_config cfg = torch_config(v, &batch, &steps);
    r->g = spmd_graph_create(NULL);
    assert_non_null(r->g);
    r->t = mlp_graph(r->g, &cfg, batch);
    assert_int_equal(spmd_grad(r->g, r->t.loss), SPMD_OK);
}

/* Run r's steps from the vectors' parameters and batch: every step's
 * loss, gradient norm, parameters and update against torch's (within
 * atol + rtol |torch|); frees r's graph.  The largest |diff| / (atol +
 * rtol |torch|) of any parameter comes back in *worst. */
static bool replay_steps(const tv_file *v, torch_replay *r, double atol, double rtol,
                         double *worst)
{
    int batch, steps;
    spmd_mlp_config cfg = torch_config(v, &batch, &steps);
    const char *name = r->name;
    spmd_graph *g = r->g;
    const float *losses = need_case(v, name, "loss", steps)->data;
    const float *norms = need_case(v, name, "grad_norm", steps)->data;
    spmd_program *p = compile(g, 1);
    int n_params = 0;
    for (int i = 0; i < spmd_graph_tensor_count(g); i++) {
        spmd_tensor *w = spmd_graph_tensor(g, i);
        if (!spmd_tensor_is_param(w)) continue;
        const tv_record *rec = need(v, spmd_tensor_name(w), spmd_tensor_numel(w));
        assert_int_equal(spmd_program_write(p, w, rec->data, rec->bytes), SPMD_OK);
        n_params++;
    }
    assert_int_equal(n_params, 2 * (cfg.layers + 1));
    const tv_record *x = need(v, "input", spmd_tensor_numel(r->t.input));
    const tv_record *y = need(v, "targets", spmd_tensor_numel(r->t.targets));
    assert_int_equal(spmd_program_set_input(p, r->t.input, x->data, x->bytes), SPMD_OK);
    assert_int_equal(spmd_program_set_input(p, r->t.targets, y->data, y->bytes), SPMD_OK);

    /* Each parameter as this run had it before the step, by tensor index. */
    int n_tensors = spmd_graph_tensor_count(g);
    float **before = calloc((size_t)n_tensors, sizeof *before);
    assert_non_null(before);
    for (int i = 0; i < n_tensors; i++)
        if (spmd_tensor_is_param(spmd_graph_tensor(g, i)))
            before[i] = read_all(p, spmd_graph_tensor(g, i));
    bool ok = true;
    char what[160];
    *worst = 0;
    for (int s = 0; s < steps; s++) {
        for (int k = 0; k < r->n_groups; k++) set_scalar(p, r->lr[k], r->lrs[s * r->n_groups + k]);
        if (spmd_program_run(p) != SPMD_OK) fail_msg("%s: run: %s", name, spmd_last_error());
        float loss = read_scalar(p, r->t.loss), norm = read_scalar(p, r->grad_norm);
        snprintf(what, sizeof what, "%s step %d loss", name, s);
        ok &= test_close_enough(what, &loss, &losses[s], 1, atol, rtol);
        snprintf(what, sizeof what, "%s step %d grad norm", name, s);
        ok &= test_close_enough(what, &norm, &norms[s], 1, atol, rtol);
        for (int i = 0; i < spmd_graph_tensor_count(g); i++) {
            spmd_tensor *w = spmd_graph_tensor(g, i);
            if (!spmd_tensor_is_param(w)) continue;
            int64_t n = spmd_tensor_numel(w);
            const tv_record *rec = need_case(v, name, spmd_tensor_name(w), steps * n);
            const float *want = (const float *)rec->data + s * n;
            const float *want_before = s ? want - n : need(v, spmd_tensor_name(w), n)->data;
            float *got = read_all(p, w);
            snprintf(what, sizeof what, "%s step %d '%s'", name, s, spmd_tensor_name(w));
            ok &= test_close_enough(what, got, want, n, atol, rtol);
            ok &= update_close(what, before[i], got, want_before, want, n);
            for (int64_t e = 0; e < n; e++)
                *worst = fmax(*worst, fabs((double)got[e] - want[e]) /
                                          (atol + rtol * fabs((double)want[e])));
            free(before[i]);
            before[i] = got;
        }
    }
    for (int i = 0; i < n_tensors; i++) free(before[i]);
    free(before);
    /* The counter saw every step. */
    assert_float_equal(read_scalar(p, find(g, "opt.step")), (float)steps, 0.0f);
    spmd_program_free(p);
    spmd_graph_free(g);
    r->g = NULL;
    return ok;
}

static void replay_torch_case(const tv_file *v, const char *name)
{
    int batch, steps;
    (void)torch_config(v, &batch, &steps);
    const float *set = need_case(v, name, "settings", 7)->data;
    const float *sched = need_case(v, name, "schedule", 4)->data;
    const float *lrs = need_case(v, name, "lr", steps)->data;

    torch_replay r = {.name = name, .n_groups = 1, .lrs = lrs};
    torch_graph(v, &r);
    spmd_optimizer opt = {.kind = (spmd_optimizer_kind)set[0], .momentum = set[1],
                          .weight_decay = set[2], .beta1 = set[3], .beta2 = set[4],
                          .eps = set[5], .clip_norm = set[6]};
    spmd_optimizer_tensors ot;
    if (spmd_optimizer_apply(r.g, &opt, &ot) != SPMD_OK)
        fail_msg("%s: optimizer: %s", name, spmd_last_error());
    assert_non_null(ot.lr);
    assert_non_null(ot.grad_norm);
    assert_ptr_equal(ot.lr, spmd_graph_find(r.g, "lr"));
    r.lr[0] = ot.lr;
    r.grad_norm = ot.grad_norm;
    /* The schedule is part of what is checked: torch's lr came from the
     * script's own formula. */
    bool ok = true;
    char what[160];
    for (int s = 0; s < steps; s++) {
        float lr = spmd_lr_schedule(s, (int)sched[0], (int)sched[1], sched[2], sched[3]);
        snprintf(what, sizeof what, "%s step %d lr", name, s);
        ok &= test_close_enough(what, &lr, &lrs[s], 1, 1e-12, 1e-6);
    }
    double worst;
    ok &= replay_steps(v, &r, TORCH_ATOL, TORCH_RTOL, &worst);
    if (!ok) fail_msg("%s does not follow torch.optim", name);
    printf("%s: %d steps follow torch.optim\n", name, steps);
}

/* ---- Parameter groups against PyTorch ------------------------------------------------------ */

static const char *const group_cases[] = {"sgd_groups", "adam", "adam_groups", "adamw_groups"};

/* Group 0 the weights by pattern, group 1 the biases by name, as
 * make_optim_vectors.py splits them. */
static const char *const weight_names[] = {"fc.*.weight"};
static const char *const bias_names[] = {"fc.0.bias", "fc.1.bias"};

static void replay_group_case(const tv_file *v, const char *name)
{
    int batch, steps;
    (void)torch_config(v, &batch, &steps);
    const tv_record *groups_rec = need_case(v, name, "groups", -1);
    int n_groups = (int)groups_rec->dims[0];
    assert_true(groups_rec->rank == 2 && groups_rec->dims[1] == 6 && n_groups >= 1 &&
                n_groups <= MAX_GROUPS);
    const float *gs = groups_rec->data;
    const float *set = need_case(v, name, "settings", 2)->data;
    const float *sched = need_case(v, name, "schedule", 4)->data;
    const float *lrs = need_case(v, name, "lr", (int64_t)steps * n_groups)->data;

    torch_replay r = {.name = name, .n_groups = n_groups, .lrs = lrs};
    torch_graph(v, &r);
    spmd_optimizer opt = {.kind = (spmd_optimizer_kind)set[0], .clip_norm = set[1]};
    spmd_optimizer_tensors ot;
    if (n_groups == 1) {
        /* One group is spmd_optimizer_apply with its settings. */
        opt.weight_decay = gs[1], opt.momentum = gs[2], opt.beta1 = gs[3], opt.beta2 = gs[4];
        opt.eps = gs[5];
        if (spmd_optimizer_apply(r.g, &opt, &ot) != SPMD_OK)
            fail_msg("%s: optimizer: %s", name, spmd_last_error());
        r.lr[0] = ot.lr;
    } else {
        spmd_optimizer_group groups[MAX_GROUPS] = {
            {.params = weight_names, .n_params = 1},
            {.params = bias_names, .n_params = 2},
        };
        for (int k = 0; k < n_groups; k++) {
            const float *row = gs + 6 * k;
            groups[k].weight_decay = row[1], groups[k].momentum = row[2];
            groups[k].beta1 = row[3], groups[k].beta2 = row[4], groups[k].eps = row[5];
        }
        if (spmd_optimizer_apply_groups(r.g, &opt, groups, n_groups, &ot, r.lr) != SPMD_OK)
            fail_msg("%s: optimizer: %s", name, spmd_last_error());
        assert_ptr_equal(r.lr[0], ot.lr);
        assert_ptr_equal(r.lr[0], find(r.g, "lr"));
        assert_ptr_equal(r.lr[1], find(r.g, "lr.1"));
    }
    r.grad_norm = ot.grad_norm;
    /* Each group's lr is the schedule times its factor. */
    bool ok = true;
    char what[160];
    for (int s = 0; s < steps; s++)
        for (int k = 0; k < n_groups; k++) {
            float lr = spmd_lr_schedule(s, (int)sched[0], (int)sched[1], sched[2], sched[3]) *
                       gs[6 * k];
            snprintf(what, sizeof what, "%s step %d group %d lr", name, s, k);
            ok &= test_close_enough(what, &lr, &lrs[s * n_groups + k], 1, 1e-12, 1e-6);
        }
    double worst;
    ok &= replay_steps(v, &r, GROUPS_ATOL, GROUPS_RTOL, &worst);
    if (!ok) fail_msg("%s does not follow torch.optim", name);
    printf("%s: %d steps of %d group(s) follow torch.optim (parameters use %.2f of the "
           "tolerance)\n", name, steps, n_groups, worst);
}

static void test_groups_against_torch(void **state)
{
    (void)state;
    tv_file v;
    tv_load_case("optim_groups", &v);
    for (size_t i = 0; i < sizeof group_cases / sizeof group_cases[0]; i++)
        replay_group_case(&v, group_cases[i]);
    tv_free(&v);
}

static void test_against_torch(void **state)
{
    (void)state;
    tv_file v;
    tv_load_case("optim", &v);
    for (size_t i = 0; i < sizeof torch_cases / sizeof torch_cases[0]; i++)
        replay_torch_case(&v, torch_cases[i]);
    tv_free(&v);
}

/* ---- The schedule ------------------------------------------------------------------------ */

static void test_lr_schedule(void **state)
{
    (void)state;
    const int warmup = 10, total = 110;
    const float peak = 1e-3f, floor = 1e-4f;
    /* Warmup from 0, linear, reaching the peak at step `warmup`. */
    assert_float_equal(spmd_lr_schedule(0, warmup, total, peak, floor), 0.0f, 0.0f);
    assert_float_equal(spmd_lr_schedule(5, warmup, total, peak, floor), 0.5e-3f, 1e-10f);
    assert_float_equal(spmd_lr_schedule(warmup, warmup, total, peak, floor), peak, 0.0f);
    /* Halfway through the decay: halfway between peak and floor. */
    assert_float_equal(spmd_lr_schedule(60, warmup, total, peak, floor), 5.5e-4f, 1e-10f);
    /* A quarter in: floor + (peak - floor) (1 + cos(pi / 4)) / 2. */
    double quarter = 1e-4 + 9e-4 * 0.5 * (1.0 + cos(M_PI / 4));
    assert_float_equal(spmd_lr_schedule(35, warmup, total, peak, floor), (float)quarter, 1e-10f);
    /* The floor at the end and after it. */
    assert_float_equal(spmd_lr_schedule(total, warmup, total, peak, floor), floor, 0.0f);
    assert_float_equal(spmd_lr_schedule(total + 1000, warmup, total, peak, floor), floor, 0.0f);
    /* Rising through warmup, never rising after it. */
    for (int s = 1; s <= total + 5; s++) {
        float a = spmd_lr_schedule(s - 1, warmup, total, peak, floor);
        float b = spmd_lr_schedule(s, warmup, total, peak, floor);
        if (s <= warmup ? !(b > a) : !(b <= a)) fail_msg("step %d: %g after %g", s, b, a);
    }
    /* No warmup starts at the peak; a constant schedule stays put; a
     * negative step counts as the first. */
    assert_float_equal(spmd_lr_schedule(0, 0, total, peak, floor), peak, 0.0f);
    assert_float_equal(spmd_lr_schedule(7, 0, 0, 0.1f, 0.1f), 0.1f, 0.0f);
    assert_float_equal(spmd_lr_schedule(-3, warmup, total, peak, floor), 0.0f, 0.0f);
}

/* ---- SPMD: FSDP (ZeRO-3) against one device ---------------------------------------------- */

#define FSDP_STEPS 5
#define FSDP_CLIP 0.1f

static const spmd_mlp_config fsdp_cfg = {.in_dim = 8, .hidden = 16, .layers = 2, .out_dim = 4};
static const int fsdp_batch = 16;

/* Every input from its name, so the sharded and one-device runs agree. */
static void set_inputs(spmd_program *p, spmd_tensor *const *ins, int n_ins)
{
    for (int k = 0; k < n_ins; k++) {
        int64_t n = spmd_tensor_numel(ins[k]);
        float *v = malloc((size_t)n * sizeof *v);
        assert_non_null(v);
        test_fill_by_name(spmd_tensor_name(ins[k]), v, n);
        assert_int_equal(spmd_program_set_input(p, ins[k], v, (size_t)n * sizeof *v), SPMD_OK);
        free(v);
    }
}

typedef struct fsdp_run {
    spmd_graph *g;
    spmd_program *p;
    spmd_mlp_tensors t;
    spmd_optimizer_tensors ot;
    spmd_tensor *lrs[2];
    float loss[FSDP_STEPS], norm[FSDP_STEPS];
} fsdp_run;

/* How a run is marked and updated. */
typedef struct train_setup {
    bool mark_biases; /* FSDP: biases "fsdp" too, else left to propagation */
    bool zero;        /* instead of FSDP: the batch over "data", ZeRO (else off) */
    /* Two groups: the weights decayed, the biases not, with their own
     * betas, eps and twice the learning rate ("lr.1"). */
    bool groups;
} train_setup;

static const char *const all_biases[] = {"*.bias"};

/* The MLP with AdamW and clipping, trained for FSDP_STEPS steps; over m
 * when m is given, marked FSDP-style (weights "fsdp, None", biases
 * "fsdp" with mark_biases) or, with zero, only its batch. */
static void fsdp_train(fsdp_run *r, const spmd_mesh *m, const train_setup *how)
{
    memset(r, 0, sizeof *r);
    r->g = spmd_graph_create(NULL);
    assert_non_null(r->g);
    r->t = mlp_graph(r->g, &fsdp_cfg, fsdp_batch);
    if (m && how->zero) {
        assert_int_equal(spmd_mark_sharding(r->g, r->t.input, m, "data, None"), SPMD_OK);
    } else if (m) {
        assert_int_equal(spmd_mark_sharding(r->g, r->t.input, m, "(replica, fsdp), None"), SPMD_OK);
        for (int i = 0; i <= fsdp_cfg.layers; i++) {
            char name[32];
            snprintf(name, sizeof name, "fc.%d.weight", i);
            assert_int_equal(spmd_mark_sharding(r->g, find(r->g, name), m, "fsdp, None"), SPMD_OK);
            snprintf(name, sizeof name, "fc.%d.bias", i);
            if (how->mark_biases)
                assert_int_equal(spmd_mark_sharding(r->g, find(r->g, name), m, "fsdp"), SPMD_OK);
        }
    }
    assert_int_equal(spmd_grad(r->g, r->t.loss), SPMD_OK);
    spmd_status st;
    if (how->groups) {
        spmd_optimizer opt = {.kind = SPMD_OPTIMIZER_ADAMW, .clip_norm = FSDP_CLIP,
                              .zero = how->zero ? SPMD_ZERO_ON : SPMD_ZERO_OFF};
        const spmd_optimizer_group groups[2] = {
            {.params = weight_names, .n_params = 1, .weight_decay = 0.1f},
            {.params = all_biases, .n_params = 1, .beta1 = 0.8f, .beta2 = 0.95f, .eps = 1e-6f},
        };
        st = spmd_optimizer_apply_groups(r->g, &opt, groups, 2, &r->ot, r->lrs);
    } else {
        spmd_optimizer opt = {.kind = SPMD_OPTIMIZER_ADAMW, .weight_decay = 0.01f,
                              .clip_norm = FSDP_CLIP, .zero = how->zero ? SPMD_ZERO_ON : SPMD_ZERO_OFF};
        st = spmd_optimizer_apply(r->g, &opt, &r->ot);
    }
    if (st != SPMD_OK) fail_msg("optimizer: %s", spmd_last_error());
    r->p = compile(r->g, m ? 8 : 2);

    spmd_tensor *ins[2] = {r->t.input, r->t.targets};
    set_inputs(r->p, ins, 2);
    for (int s = 0; s < FSDP_STEPS; s++) {
        float lr = spmd_lr_schedule(s, 1, FSDP_STEPS, 0.02f, 0.002f);
        set_scalar(r->p, r->ot.lr, lr);
        if (how->groups) set_scalar(r->p, r->lrs[1], 2.0f * lr);
        if (spmd_program_run(r->p) != SPMD_OK) fail_msg("run: %s", spmd_last_error());
        r->loss[s] = read_scalar(r->p, r->t.loss);
        r->norm[s] = read_scalar(r->p, r->ot.grad_norm);
    }
}

static void fsdp_free(fsdp_run *r)
{
    spmd_program_free(r->p);
    spmd_graph_free(r->g);
}

/* Every parameter and state tensor (moments, step) of the two runs. */
static bool same_persistent(const fsdp_run *a, const fsdp_run *b, double atol, double rtol)
{
    bool ok = true;
    int compared = 0;
    for (int i = 0; i < spmd_graph_tensor_count(b->g); i++) {
        spmd_tensor *want_t = spmd_graph_tensor(b->g, i);
        const char *op = spmd_tensor_op_name(want_t);
        if (strcmp(op, "param") != 0 && strcmp(op, "state") != 0) continue;
        spmd_tensor *got_t = find(a->g, spmd_tensor_name(want_t));
        float *got = read_all(a->p, got_t), *want = read_all(b->p, want_t);
        ok &= test_close_enough(spmd_tensor_name(want_t), got, want, spmd_tensor_numel(want_t),
                                atol, rtol);
        free(got);
        free(want);
        compared++;
    }
    /* 6 parameters, 12 moments, the step counter. */
    assert_int_equal(compared, 6 * 3 + 1);
    return ok;
}

static void check_fsdp_run(bool mark_biases)
{
    spmd_mesh *m = spmd_mesh_parse("4x2", "replica,fsdp");
    assert_non_null(m);
    fsdp_run one, sharded;
    const train_setup how = {.mark_biases = mark_biases};
    fsdp_train(&one, NULL, &how);
    fsdp_train(&sharded, m, &how);
    assert_int_equal(spmd_program_devices(one.p), 1);
    assert_int_equal(spmd_program_devices(sharded.p), 8);

    bool ok = test_close_enough("loss per step", sharded.loss, one.loss, FSDP_STEPS, SPMD_ATOL,
                                SPMD_RTOL);
    ok &= test_close_enough("grad norm per step", sharded.norm, one.norm, FSDP_STEPS, SPMD_ATOL,
                            SPMD_RTOL);
    ok &= same_persistent(&sharded, &one, SPMD_ATOL, SPMD_RTOL);
    if (!ok) fail_msg("the FSDP run does not follow the one-device run");
    /* Clipping acted (the norm starts above FSDP_CLIP) and training went on. */
    assert_true(one.norm[0] > FSDP_CLIP);
    assert_true(one.loss[FSDP_STEPS - 1] < one.loss[0]);

    /* Moments are held like their parameter. */
    char spec[128];
    assert_string_equal(spmd_get_sharding(find(sharded.g, "fc.1.weight.exp_avg"), spec,
                                          sizeof spec), "fsdp, None");
    assert_string_equal(spmd_get_sharding(find(sharded.g, "fc.1.weight.exp_avg_sq"), spec,
                                          sizeof spec), "fsdp, None");

    /* The update phase works on shards and resolves each gradient once: it
     * never gathers anything; a sharded gradient is reduce-scattered over
     * fsdp and all-reduced over replica, a replicated one all-reduced over
     * both; the only other collective is the norm's 4-byte sum. */
    int per_grad[3 * 2] = {0}, scalars = 0;
    for (int i = 0; i < spmd_program_collective_count(sharded.p); i++) {
        spmd_collective_info c;
        assert_int_equal(spmd_program_collective(sharded.p, i, &c), SPMD_OK);
        if (strcmp(c.phase, "update") != 0) continue;
        if (strcmp(c.kind, "all-gather") == 0)
            fail_msg("the update all-gathers %s over [%s]", c.tensor, c.axes);
        int layer = -1;
        char kind[16] = "";
        if (sscanf(c.tensor, "fc.%d.%15[a-z].grad", &layer, kind) == 2 && layer >= 0 &&
            layer <= fsdp_cfg.layers) {
            bool bias = strcmp(kind, "bias") == 0;
            bool sharded_grad = mark_biases || !bias;
            const char *want = strcmp(c.kind, "reduce-scatter") == 0 ? "fsdp"
                               : sharded_grad                        ? "replica"
                                                                     : "replica,fsdp";
            if (strcmp(c.axes, want) != 0 || (!sharded_grad && strcmp(c.kind, "all-reduce")))
                fail_msg("%s: %s over [%s]", c.tensor, c.kind, c.axes);
            per_grad[2 * layer + bias]++;
        } else if (c.bytes == 4 && strcmp(c.kind, "all-reduce") == 0) {
            scalars++;
        } else {
            fail_msg("the update moves %s (%s over [%s], %lld bytes)", c.tensor, c.kind, c.axes,
                     (long long)c.bytes);
        }
    }
    for (int k = 0; k < 6; k++)
        if (per_grad[k] != (mark_biases || k % 2 == 0 ? 2 : 1))
            fail_msg("fc.%d.%s.grad: %d collectives", k / 2, k % 2 ? "bias" : "weight",
                     per_grad[k]);
    assert_int_equal(scalars, 1);

    if (mark_biases) {
        /* Parameters and both moments split in half over fsdp (every dim
         * is even); only the step counter (4 bytes) is whole everywhere. */
        size_t whole = spmd_program_persistent_bytes(one.p);
        size_t mine = spmd_program_persistent_bytes(sharded.p);
        size_t params = (size_t)spmd_graph_param_count(one.g) * sizeof(float);
        assert_int_equal(whole, 3 * params + sizeof(float));
        assert_int_equal(mine, (whole - sizeof(float)) / 2 + sizeof(float));
        assert_int_equal(spmd_program_param_bytes(sharded.p), params / 2);
        printf("FSDP AdamW: %zu persistent bytes per device of %zu on one device\n", mine, whole);
    }
    fsdp_free(&sharded);
    fsdp_free(&one);
    spmd_mesh_free(m);
}

static void test_fsdp_adamw(void **state)
{
    (void)state;
    check_fsdp_run(true);
}

/* Biases left unmarked: their state follows what propagation gives them. */
static void test_fsdp_adamw_unmarked_biases(void **state)
{
    (void)state;
    check_fsdp_run(false);
}

/* ---- SPMD: parameter groups against one device ------------------------------------------- */

/* Two groups on a mesh follow the same two groups on one device: FSDP on
 * 4x2 (every parameter marked, so every moment halved) and ZeRO on a
 * data-parallel mesh of 8, where each group's state is split over "data". */
static void check_groups_on(const char *shape, const char *axes, const train_setup *how,
                            const char *state, const char *state_spec)
{
    spmd_mesh *m = spmd_mesh_parse(shape, axes);
    assert_non_null(m);
    fsdp_run one, sharded;
    fsdp_train(&one, NULL, how);
    fsdp_train(&sharded, m, how);
    assert_int_equal(spmd_program_devices(sharded.p), 8);
    assert_ptr_equal(sharded.lrs[1], find(sharded.g, "lr.1"));
    bool ok = test_close_enough("loss per step", sharded.loss, one.loss, FSDP_STEPS,
                                GROUPS_MESH_ATOL, GROUPS_MESH_RTOL);
    ok &= test_close_enough("grad norm per step", sharded.norm, one.norm, FSDP_STEPS,
                            GROUPS_MESH_ATOL, GROUPS_MESH_RTOL);
    ok &= same_persistent(&sharded, &one, GROUPS_MESH_ATOL, GROUPS_MESH_RTOL);
    if (!ok) fail_msg("groups on %s do not follow one device", shape);
    assert_true(one.norm[0] > FSDP_CLIP); /* clipping acted */
    char spec[128];
    assert_string_equal(spmd_get_sharding(find(sharded.g, state), spec, sizeof spec), state_spec);
    /* Each device holds less than the whole state. */
    assert_true(spmd_program_persistent_bytes(sharded.p) * 2 <=
                spmd_program_persistent_bytes(one.p) + sizeof(float));
    fsdp_free(&sharded);
    fsdp_free(&one);
    spmd_mesh_free(m);
}

static void test_groups_fsdp(void **state)
{
    (void)state;
    const train_setup how = {.mark_biases = true, .groups = true};
    check_groups_on("4x2", "replica,fsdp", &how, "fc.0.bias.exp_avg_sq", "fsdp");
}

static void test_groups_zero(void **state)
{
    (void)state;
    const train_setup how = {.zero = true, .groups = true};
    check_groups_on("8", "data", &how, "fc.1.weight.exp_avg", "data, None");
}

/* ---- Bookkeeping ------------------------------------------------------------------------- */

static spmd_graph *tiny_graph(void)
{
    spmd_graph *g = spmd_graph_create(NULL);
    assert_non_null(g);
    spmd_mlp_config cfg = {.in_dim = 3, .hidden = 4, .layers = 1, .out_dim = 2};
    spmd_mlp_tensors t = mlp_graph(g, &cfg, 2);
    assert_int_equal(spmd_grad(g, t.loss), SPMD_OK);
    return g;
}

static void test_existing_lr_input(void **state)
{
    (void)state;
    spmd_graph *g = tiny_graph();
    spmd_tensor *lr = spmd_input(g, "lr", SPMD_F32, 0, NULL);
    assert_non_null(lr);
    spmd_optimizer opt = {.kind = SPMD_OPTIMIZER_SGD, .momentum = 0.5f};
    spmd_optimizer_tensors ot;
    assert_int_equal(spmd_optimizer_apply(g, &opt, &ot), SPMD_OK);
    assert_ptr_equal(ot.lr, lr);
    assert_non_null(find(g, "fc.0.weight.momentum"));
    assert_null(spmd_graph_find(g, "fc.0.weight.exp_avg"));
    assert_ptr_equal(ot.grad_norm, find(g, "opt.grad_norm"));

    /* Zero learning rate: nothing moves, but the step counter does. */
    spmd_program *p = compile(g, 1);
    spmd_tensor *ins[2] = {find(g, "input"), find(g, "targets")};
    set_inputs(p, ins, 2);
    spmd_tensor *w = find(g, "fc.1.weight");
    float *before = read_all(p, w);
    set_scalar(p, lr, 0.0f);
    for (int s = 0; s < 3; s++) assert_int_equal(spmd_program_run(p), SPMD_OK);
    float *after = read_all(p, w);
    assert_memory_equal(before, after, (size_t)spmd_tensor_numel(w) * sizeof(float));
    assert_float_equal(read_scalar(p, find(g, "opt.step")), 3.0f, 0.0f);
    assert_true(read_scalar(p, ot.grad_norm) > 0.0f);
    free(before);
    free(after);
    spmd_program_free(p);
    spmd_graph_free(g);
}

/* ---- Errors ------------------------------------------------------------------------------ */

/* The call fails with `status`, a message containing `needle`, and no new
 * tensors. */
static void expect_refused(spmd_graph *g, const spmd_optimizer *opt, spmd_status status,
                           const char *needle)
{
    int before = spmd_graph_tensor_count(g);
    spmd_clear_error();
    spmd_optimizer_tensors ot = {(spmd_tensor *)1, (spmd_tensor *)1, (spmd_tensor *)1};
    spmd_status st = spmd_optimizer_apply(g, opt, &ot);
    if (st != status)
        fail_msg("want %s, got %s (%s)", spmd_status_name(status), spmd_status_name(st),
                 spmd_last_error());
    if (!strstr(spmd_last_error(), needle))
        fail_msg("message \"%s\" does not mention \"%s\"", spmd_last_error(), needle);
    assert_null(ot.lr);
    assert_null(ot.grad_norm);
    assert_null(ot.weight_decay);
    assert_int_equal(spmd_graph_tensor_count(g), before);
}

static void test_errors(void **state)
{
    (void)state;
    const spmd_optimizer sgd = {.kind = SPMD_OPTIMIZER_SGD};
    const spmd_optimizer adamw = {.kind = SPMD_OPTIMIZER_ADAMW};
    spmd_optimizer_tensors ot;
    assert_int_equal(spmd_optimizer_apply(NULL, &sgd, &ot), SPMD_ERR_INVALID);
    assert_non_null(strstr(spmd_last_error(), "NULL"));

    /* Before spmd_grad. */
    spmd_graph *g = spmd_graph_create(NULL);
    assert_non_null(g);
    spmd_mlp_config cfg = {.in_dim = 3, .hidden = 4, .layers = 1, .out_dim = 2};
    spmd_mlp_tensors t = mlp_graph(g, &cfg, 2);
    expect_refused(g, &sgd, SPMD_ERR_INVALID, "spmd_grad first");
    assert_int_equal(spmd_grad(g, t.loss), SPMD_OK);
    expect_refused(g, NULL, SPMD_ERR_INVALID, "NULL");

    /* Settings. */
    struct {
        spmd_optimizer opt;
        const char *needle;
    } bad[] = {
        {{.kind = SPMD_OPTIMIZER_SGD, .momentum = -0.9f}, "momentum"},
        {{.kind = SPMD_OPTIMIZER_SGD, .momentum = NAN}, "momentum"},
        {{.kind = SPMD_OPTIMIZER_SGD, .weight_decay = -0.01f}, "weight_decay"},
        {{.kind = SPMD_OPTIMIZER_SGD, .clip_norm = -1.0f}, "clip_norm"},
        {{.kind = SPMD_OPTIMIZER_SGD, .beta1 = 0.9f}, "beta1 is a setting of AdamW and Adam; SGD takes"},
        {{.kind = SPMD_OPTIMIZER_ADAMW, .momentum = 0.9f}, "momentum is a setting of SGD and RMSprop"},
        {{.kind = SPMD_OPTIMIZER_ADAMW, .beta1 = 1.0f, .beta2 = 0.999f}, "beta1"},
        {{.kind = SPMD_OPTIMIZER_ADAMW, .beta1 = 0.9f, .beta2 = 1.5f}, "beta2"},
        {{.kind = SPMD_OPTIMIZER_ADAMW, .beta1 = -0.1f, .beta2 = 0.9f}, "beta1"},
        {{.kind = SPMD_OPTIMIZER_ADAMW, .eps = -1e-8f}, "eps"},
        {{.kind = SPMD_OPTIMIZER_ADAMW, .weight_decay = INFINITY}, "weight_decay"},
        {{.kind = (spmd_optimizer_kind)7}, "unknown optimizer kind"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) expect_refused(g, &bad[i].opt,
                                                                            SPMD_ERR_INVALID,
                                                                            bad[i].needle);

    /* A tensor "lr" that is not an f32 scalar input. */
    spmd_graph *g2 = tiny_graph();
    assert_non_null(spmd_input(g2, "lr", SPMD_F32, 1, D(1)));
    expect_refused(g2, &sgd, SPMD_ERR_SHAPE, "f32 scalar");
    spmd_graph_free(g2);
    g2 = tiny_graph();
    assert_non_null(spmd_state(g2, "lr", 0, NULL, (spmd_init){SPMD_INIT_ONES, 0}));
    expect_refused(g2, &adamw, SPMD_ERR_INVALID, "'lr'");
    spmd_graph_free(g2);

    /* Twice, or after spmd_sgd. */
    assert_int_equal(spmd_optimizer_apply(g, &adamw, &ot), SPMD_OK);
    expect_refused(g, &adamw, SPMD_ERR_INVALID, "already has an update");
    g2 = tiny_graph();
    assert_int_equal(spmd_sgd(g2, spmd_input(g2, "rate", SPMD_F32, 0, NULL)), SPMD_OK);
    expect_refused(g2, &sgd, SPMD_ERR_INVALID, "already has an update");
    spmd_graph_free(g2);

    /* State names taken, and a parameter without a gradient. */
    g2 = tiny_graph();
    assert_non_null(spmd_state(g2, "fc.0.bias.exp_avg", 1, D(4), (spmd_init){0}));
    expect_refused(g2, &adamw, SPMD_ERR_INVALID, "fc.0.bias.exp_avg");
    spmd_graph_free(g2);
    g2 = tiny_graph();
    assert_non_null(spmd_param(g2, "late", 1, D(2), (spmd_init){0}));
    expect_refused(g2, &sgd, SPMD_ERR_INVALID, "'late'");
    spmd_graph_free(g2);

    /* spmd_sgd keeps its own checks. */
    g2 = tiny_graph();
    assert_int_equal(spmd_sgd(g2, NULL), SPMD_ERR_INVALID);
    assert_int_equal(spmd_sgd(g2, spmd_input(g2, "v", SPMD_F32, 1, D(3))), SPMD_ERR_SHAPE);
    assert_non_null(strstr(spmd_last_error(), "sgd: lr must be an f32 scalar"));
    spmd_graph_free(g2);
    spmd_graph_free(g);
}

/* ---- Parameter groups: one group, lr inputs, refusals --------------------------------------- */

static const char *const everything[] = {"*"};

/* One group holding every parameter is spmd_optimizer_apply: the same
 * bits, for every kind. */
static void test_one_group_same_bits(void **state)
{
    (void)state;
    const spmd_optimizer kinds[] = {
        {.kind = SPMD_OPTIMIZER_SGD, .momentum = 0.9f, .weight_decay = 0.01f, .clip_norm = 1.0f},
        {.kind = SPMD_OPTIMIZER_ADAMW, .weight_decay = 0.1f, .beta1 = 0.8f, .beta2 = 0.9f,
         .clip_norm = 1.0f},
        {.kind = SPMD_OPTIMIZER_ADAM, .weight_decay = 0.1f, .eps = 1e-6f, .clip_norm = 1.0f},
    };
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        float *w[2];
        for (int variant = 0; variant < 2; variant++) {
            spmd_graph *g = tiny_graph();
            spmd_optimizer_tensors ot;
            if (variant == 0) {
                assert_int_equal(spmd_optimizer_apply(g, &kinds[k], &ot), SPMD_OK);
            } else {
                spmd_optimizer shared = {.kind = kinds[k].kind, .clip_norm = kinds[k].clip_norm};
                spmd_optimizer_group one = {.params = everything, .n_params = 1,
                                            .weight_decay = kinds[k].weight_decay,
                                            .momentum = kinds[k].momentum,
                                            .beta1 = kinds[k].beta1, .beta2 = kinds[k].beta2,
                                            .eps = kinds[k].eps};
                spmd_tensor *lr = NULL;
                assert_int_equal(spmd_optimizer_apply_groups(g, &shared, &one, 1, &ot, &lr),
                                 SPMD_OK);
                assert_ptr_equal(lr, ot.lr);
            }
            spmd_program *p = compile(g, 1);
            spmd_tensor *ins[2] = {find(g, "input"), find(g, "targets")};
            set_inputs(p, ins, 2);
            set_scalar(p, ot.lr, 0.05f);
            for (int s = 0; s < 3; s++) assert_int_equal(spmd_program_run(p), SPMD_OK);
            w[variant] = read_all(p, find(g, "fc.0.weight"));
            spmd_program_free(p);
            spmd_graph_free(g);
        }
        assert_memory_equal(w[0], w[1], 4 * 3 * sizeof(float));
        free(w[0]);
        free(w[1]);
    }
}

/* "lr.1" already an input is reused; an empty group still gets its lr. */
static void test_group_lr_inputs(void **state)
{
    (void)state;
    spmd_graph *g = tiny_graph();
    spmd_tensor *lr1 = spmd_input(g, "lr.1", SPMD_F32, 0, NULL);
    assert_non_null(lr1);
    const spmd_optimizer sgd = {.kind = SPMD_OPTIMIZER_SGD};
    const spmd_optimizer_group groups[3] = {
        {.params = everything, .n_params = 1, .momentum = 0.9f},
        {.n_params = 0},
        {.n_params = 0},
    };
    spmd_tensor *lrs[3];
    spmd_optimizer_tensors ot;
    assert_int_equal(spmd_optimizer_apply_groups(g, &sgd, groups, 3, &ot, lrs), SPMD_OK);
    assert_ptr_equal(lrs[0], find(g, "lr"));
    assert_ptr_equal(lrs[1], lr1);
    assert_ptr_equal(lrs[2], find(g, "lr.2"));
    assert_ptr_equal(ot.lr, lrs[0]);
    assert_non_null(find(g, "fc.1.bias.momentum"));
    spmd_graph_free(g);
}

/* spmd_optimizer_apply_groups fails with `status` and a message with
 * `needle`, sets no outputs and adds no tensors. */
static void expect_groups_refused(spmd_graph *g, const spmd_optimizer *opt,
                                  const spmd_optimizer_group *groups, int n, spmd_status status,
                                  const char *needle)
{
    int before = spmd_graph_tensor_count(g);
    spmd_clear_error();
    spmd_optimizer_tensors ot = {(spmd_tensor *)1, (spmd_tensor *)1, (spmd_tensor *)1};
    spmd_tensor *lrs[2] = {(spmd_tensor *)1, (spmd_tensor *)1};
    spmd_status st = spmd_optimizer_apply_groups(g, opt, groups, n, &ot, n > 0 ? lrs : NULL);
    if (st != status)
        fail_msg("want %s, got %s (%s)", spmd_status_name(status), spmd_status_name(st),
                 spmd_last_error());
    if (!strstr(spmd_last_error(), needle))
        fail_msg("message \"%s\" does not mention \"%s\"", spmd_last_error(), needle);
    assert_null(ot.lr);
    assert_null(ot.grad_norm);
    assert_null(ot.weight_decay);
    if (n > 0) assert_null(lrs[0]);
    if (n > 1) assert_null(lrs[1]);
    assert_int_equal(spmd_graph_tensor_count(g), before);
}

static void test_group_errors(void **state)
{
    (void)state;
    const spmd_optimizer adamw = {.kind = SPMD_OPTIMIZER_ADAMW};
    const char *const fc_all[] = {"fc.*"}, *const fc0_bias[] = {"fc.0.bias"};
    const char *const typo[] = {"*.weight", "fc.9.bias"}, *const with_null[] = {"*", NULL};
    const spmd_optimizer_group split[2] = {{.params = weight_names, .n_params = 1},
                                           {.params = all_biases, .n_params = 1}};
    spmd_graph *g = tiny_graph();

    expect_groups_refused(NULL, &adamw, split, 2, SPMD_ERR_INVALID, "NULL");
    expect_groups_refused(g, NULL, split, 2, SPMD_ERR_INVALID, "NULL");
    expect_groups_refused(g, &adamw, NULL, 2, SPMD_ERR_INVALID, "groups is NULL");
    expect_groups_refused(g, &adamw, split, 0, SPMD_ERR_INVALID, "at least one");
    /* Membership: two groups, none, a name that matches nothing. */
    const spmd_optimizer_group twice[2] = {{.params = fc_all, .n_params = 1},
                                           {.params = fc0_bias, .n_params = 1}};
    expect_groups_refused(g, &adamw, twice, 2, SPMD_ERR_INVALID,
                          "parameter 'fc.0.bias' is in group 0 and in group 1");
    expect_groups_refused(g, &adamw, split, 1, SPMD_ERR_INVALID,
                          "parameter 'fc.0.bias' is in no group");
    const spmd_optimizer_group misnamed[1] = {{.params = typo, .n_params = 2}};
    expect_groups_refused(g, &adamw, misnamed, 1, SPMD_ERR_INVALID,
                          "group 0's 'fc.9.bias' matches no parameter");
    const spmd_optimizer_group nulls[2] = {{.params = with_null, .n_params = 2}, {0}};
    expect_groups_refused(g, &adamw, nulls, 2, SPMD_ERR_INVALID, "group 0's parameter 1 is NULL");
    const spmd_optimizer_group negative[2] = {{.params = everything, .n_params = 1},
                                              {.n_params = -1}};
    expect_groups_refused(g, &adamw, negative, 2, SPMD_ERR_INVALID, "-1 entries");
    /* Settings: each group's checked under its index; none in the shared ones. */
    spmd_optimizer_group bad[2] = {split[0], split[1]};
    bad[1].beta1 = 1.5f, bad[1].beta2 = 0.9f;
    expect_groups_refused(g, &adamw, bad, 2, SPMD_ERR_INVALID, "group 1: AdamW beta1 1.5");
    bad[1] = split[1], bad[1].momentum = 0.9f;
    expect_groups_refused(g, &(spmd_optimizer){.kind = SPMD_OPTIMIZER_ADAM}, bad, 2,
                          SPMD_ERR_INVALID, "group 1: momentum is a setting of SGD and RMSprop; Adam takes");
    bad[1] = split[1], bad[1].eps = 1e-8f;
    expect_groups_refused(g, &(spmd_optimizer){.kind = SPMD_OPTIMIZER_SGD}, bad, 2,
                          SPMD_ERR_INVALID, "group 1: eps is a setting of AdamW, Adam, RMSprop and Adagrad; SGD");
    expect_groups_refused(g, &(spmd_optimizer){.kind = SPMD_OPTIMIZER_ADAMW, .weight_decay = 0.1f},
                          split, 2, SPMD_ERR_INVALID, "with groups, weight_decay is each group's own");
    expect_groups_refused(g, &(spmd_optimizer){.kind = SPMD_OPTIMIZER_ADAMW,
                                               .weight_decay_input = true},
                          split, 2, SPMD_ERR_INVALID, "weight_decay_input");
    spmd_graph_free(g);

    /* "lr.1" that is not an f32 scalar input. */
    g = tiny_graph();
    assert_non_null(spmd_input(g, "lr.1", SPMD_F32, 1, D(2)));
    expect_groups_refused(g, &adamw, split, 2, SPMD_ERR_SHAPE, "lr.1 must be an f32 scalar");
    spmd_graph_free(g);
    g = tiny_graph();
    assert_non_null(spmd_state(g, "lr.1", 0, NULL, (spmd_init){SPMD_INIT_ONES, 0}));
    expect_groups_refused(g, &adamw, split, 2, SPMD_ERR_INVALID, "'lr.1' is a state");
    spmd_graph_free(g);

    /* A parameter created after spmd_grad, named by a group or not. */
    g = tiny_graph();
    assert_non_null(spmd_param(g, "late.weight", 1, D(2), (spmd_init){0}));
    expect_groups_refused(g, &adamw, split, 2, SPMD_ERR_INVALID,
                          "parameter 'late.weight' was created after spmd_grad");
    spmd_graph_free(g);
    g = tiny_graph();
    assert_non_null(spmd_param(g, "late", 1, D(2), (spmd_init){0}));
    expect_groups_refused(g, &adamw, split, 2, SPMD_ERR_INVALID,
                          "parameter 'late' was created after spmd_grad");
    spmd_graph_free(g);

    /* Groups after an update, and an update after groups. */
    g = tiny_graph();
    assert_int_equal(spmd_optimizer_apply_groups(g, &adamw, split, 2, NULL, NULL), SPMD_OK);
    expect_groups_refused(g, &adamw, split, 2, SPMD_ERR_INVALID, "already has an update");
    expect_refused(g, &adamw, SPMD_ERR_INVALID, "already has an update");
    spmd_graph_free(g);
}

/* ---- Allocation failures -------------------------------------------------------------------
 * Allocations fail from the k-th on, for every k until the call succeeds:
 * each failure is SPMD_ERR_NOMEM with a message, never a crash or a leak. */

static void check_allocation_failure(bool groups)
{
    const spmd_optimizer adamw = {.kind = SPMD_OPTIMIZER_ADAMW, .weight_decay = 0.01f,
                                  .clip_norm = 1.0f};
    const spmd_optimizer shared = {.kind = SPMD_OPTIMIZER_ADAM, .clip_norm = 1.0f};
    const spmd_optimizer_group split[2] = {
        {.params = weight_names, .n_params = 1, .weight_decay = 0.01f},
        {.params = all_biases, .n_params = 1, .beta1 = 0.8f, .beta2 = 0.9f}};
    spmd_mlp_config cfg = {.in_dim = 3, .hidden = 4, .layers = 1, .out_dim = 2};
    bool ok = false;
    int failures = 0;
    for (int k = 0; k < 10000 && !ok; k++) {
        test_alloc f;
        spmd_allocator a = test_alloc_init(&f, -1);
        spmd_graph *g = spmd_graph_create(&a);
        assert_non_null(g);
        spmd_mlp_tensors t = mlp_graph(g, &cfg, 2);
        assert_int_equal(spmd_grad(g, t.loss), SPMD_OK);
        spmd_clear_error();
        test_alloc_set_budget(&f, k);
        spmd_optimizer_tensors ot;
        spmd_status st = groups ? spmd_optimizer_apply_groups(g, &shared, split, 2, &ot, NULL)
                                : spmd_optimizer_apply(g, &adamw, &ot);
        test_alloc_set_budget(&f, -1);
        if (st == SPMD_OK) {
            ok = true;
            assert_non_null(ot.grad_norm);
        } else {
            if (st != SPMD_ERR_NOMEM || !strstr(spmd_last_error(), "out of memory"))
                fail_msg("budget %d: %s (%s)", k, spmd_status_name(st), spmd_last_error());
            failures++;
        }
        spmd_graph_free(g);
    }
    assert_true(ok);
    assert_true(failures > 0);
}

static void test_allocation_failure(void **state)
{
    (void)state;
    check_allocation_failure(false);
    check_allocation_failure(true);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_torch),
        cmocka_unit_test(test_groups_against_torch),
        cmocka_unit_test(test_lr_schedule),
        cmocka_unit_test(test_fsdp_adamw),
        cmocka_unit_test(test_fsdp_adamw_unmarked_biases),
        cmocka_unit_test(test_groups_fsdp),
        cmocka_unit_test(test_groups_zero),
        cmocka_unit_test(test_existing_lr_input),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_one_group_same_bits),
        cmocka_unit_test(test_group_lr_inputs),
        cmocka_unit_test(test_group_errors),
        cmocka_unit_test(test_allocation_failure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
