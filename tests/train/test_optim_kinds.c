/*
 * The optimizer kinds and settings beyond plain SGD, Adam and AdamW
 * (spmd/train.h): RMSprop (alpha, eps, weight decay, momentum, centered),
 * Adagrad (lr decay, weight decay, initial accumulator, eps), SGD with
 * Nesterov momentum and with dampening, Adam and AdamW with amsgrad, and
 * maximize.
 *
 *   Against torch.optim's documented algorithms: a reference written here
 *     in double from each algorithm as PyTorch's documentation states it
 *     (torch's defaults written out again, not read from the library)
 *     trains the same two parameters on the same gradients; after every
 *     step each parameter and each state ("<param>.square_avg", ".sum",
 *     ".max_exp_avg_sq", ...) is within float rounding of it.  The loss
 *     is sum(w * cw) + sum(b * cb), whose gradients are exactly the
 *     inputs cw and cb, drawn afresh each step (large on the first, so
 *     that amsgrad's maximum and Adagrad's sum have something to keep).
 *   Groups: each kind in two groups of different settings and learning
 *     rates, each parameter against its group's reference.
 *   ZeRO on a 4x2 (replica, fsdp) mesh: every kind follows one device,
 *     every state sharded over both axes.
 *   Checkpoints: a run saved after 3 steps and resumed in a new program
 *     ends with the bits of the uninterrupted run, every state included.
 *   Refusals: each kind's settings out of range, another kind's settings,
 *     dampening or Nesterov without momentum, a group setting among the
 *     shared ones; the message names the setting and the graph is left as
 *     it was.
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

#include "spmd/checkpoint.h"
#include "spmd/mesh.h"
#include "spmd/spmd.h"
#include "spmd/train.h"
#include "support_check.h"
#include "support_files.h"
#include "support_rng.h"

#define D(...) ((const int64_t[]){__VA_ARGS__})

enum { W_ROWS = 8, W_COLS = 6, B_LEN = 12, STEPS = 6, MAX_STATES = 3 };
/* float32 against the double reference. */
#define REF_ATOL 1e-6
#define REF_RTOL 1e-5
/* 4x2 against one device: sums in another order. */
#define MESH_ATOL 1e-6
#define MESH_RTOL 1e-5

/* ---- The reference: torch.optim's documented algorithms, in double ----------------------- */

/* torch's defaults for the zeros the library reads as defaults. */
static spmd_optimizer torch_settings(spmd_optimizer o)
{
    bool adam = o.kind == SPMD_OPTIMIZER_ADAM || o.kind == SPMD_OPTIMIZER_ADAMW;
    if (adam && o.beta1 == 0.0f && o.beta2 == 0.0f) o.beta1 = 0.9f, o.beta2 = 0.999f;
    if (o.eps == 0.0f) o.eps = o.kind == SPMD_OPTIMIZER_ADAGRAD ? 1e-10f : 1e-8f;
    if (o.kind == SPMD_OPTIMIZER_RMSPROP && o.alpha == 0.0f) o.alpha = 0.99f;
    return o;
}

/* One parameter's values and state, as the reference keeps them. */
typedef struct ref_param {
    int64_t n;
    double *p, *s[MAX_STATES];
} ref_param;

/* The state names of a kind, in the order ref_step keeps them. */
static int state_names(const spmd_optimizer *o, const char *names[MAX_STATES])
{
    int n = 0;
    switch (o->kind) {
    case SPMD_OPTIMIZER_SGD:
        if (o->momentum != 0.0f) names[n++] = "momentum";
        break;
    case SPMD_OPTIMIZER_ADAM:
    case SPMD_OPTIMIZER_ADAMW:
        names[n++] = "exp_avg";
        names[n++] = "exp_avg_sq";
        if (o->amsgrad) names[n++] = "max_exp_avg_sq";
        break;
    case SPMD_OPTIMIZER_RMSPROP:
        names[n++] = "square_avg";
        if (o->momentum != 0.0f) names[n++] = "momentum";
        if (o->centered) names[n++] = "grad_avg";
        break;
    case SPMD_OPTIMIZER_ADAGRAD: names[n++] = "sum"; break;
    }
    return n;
}

/* Step t (from 1) of torch.optim's algorithm for kind o->kind, settings
 * `o` (torch's values), on gradient g (clipped already). */
static void ref_step(const spmd_optimizer *o, double lr, int t, const double *g, ref_param *r)
{
    double *m0 = r->s[0], *m1 = r->s[1], *m2 = r->s[2];
    for (int64_t i = 0; i < r->n; i++) {
        double *p = &r->p[i], gi = o->maximize ? -g[i] : g[i];
        switch (o->kind) {
        case SPMD_OPTIMIZER_SGD: {
            gi += o->weight_decay * *p;
            if (o->momentum != 0.0f) {
                m0[i] = t == 1 ? gi : o->momentum * m0[i] + (1.0 - o->dampening) * gi;
                gi = o->nesterov ? gi + o->momentum * m0[i] : m0[i];
            }
            *p -= lr * gi;
            break;
        }
        case SPMD_OPTIMIZER_ADAM:
        case SPMD_OPTIMIZER_ADAMW: {
            if (o->kind == SPMD_OPTIMIZER_ADAMW) *p *= 1.0 - lr * o->weight_decay;
            else gi += o->weight_decay * *p;
            m0[i] = o->beta1 * m0[i] + (1.0 - o->beta1) * gi;
            m1[i] = o->beta2 * m1[i] + (1.0 - o->beta2) * gi * gi;
            double v = m1[i];
            if (o->amsgrad) v = m2[i] = fmax(m2[i], m1[i]);
            double m_hat = m0[i] / (1.0 - pow(o->beta1, t)), v_hat = v / (1.0 - pow(o->beta2, t));
            *p -= lr * m_hat / (sqrt(v_hat) + o->eps);
            break;
        }
        case SPMD_OPTIMIZER_RMSPROP: {
            gi += o->weight_decay * *p;
            m0[i] = o->alpha * m0[i] + (1.0 - o->alpha) * gi * gi;
            double v = m0[i];
            double *buf = o->momentum != 0.0f ? m1 : NULL;
            double *avg = o->centered ? (buf ? m2 : m1) : NULL;
            if (avg) {
                avg[i] = o->alpha * avg[i] + (1.0 - o->alpha) * gi;
                v -= avg[i] * avg[i];
            }
            double u = gi / (sqrt(v) + o->eps);
            if (buf) u = buf[i] = o->momentum * buf[i] + u;
            *p -= lr * u;
            break;
        }
        case SPMD_OPTIMIZER_ADAGRAD: {
            double clr = lr / (1.0 + (t - 1) * o->lr_decay);
            gi += o->weight_decay * *p;
            m0[i] += gi * gi;
            *p -= clr * gi / (sqrt(m0[i]) + o->eps);
            break;
        }
        }
    }
}

/* clip_grad_norm_: the gradients scaled by min(1, clip / (norm + 1e-6)). */
static void ref_clip(double clip, double *g, int64_t n_g, double *h, int64_t n_h)
{
    if (clip <= 0) return;
    double sq = 0;
    for (int64_t i = 0; i < n_g; i++) sq += g[i] * g[i];
    for (int64_t i = 0; i < n_h; i++) sq += h[i] * h[i];
    double scale = fmin(1.0, clip / (sqrt(sq) + 1e-6));
    for (int64_t i = 0; i < n_g; i++) g[i] *= scale;
    for (int64_t i = 0; i < n_h; i++) h[i] *= scale;
}

/* ---- The model: sum(w * cw) + sum(b * cb) ----------------------------------------------------- */

/* How a run is set up: one group of `opt`, or groups of their own. */
typedef struct setup {
    spmd_optimizer opt;      /* the shared settings (all of them without groups) */
    spmd_optimizer group[2]; /* with groups: w's and b's own settings (kind unused) */
    bool groups;
    float lr[2];             /* each group's lr (lr[0] without groups) */
    const char *mesh;        /* "4x2": w marked "fsdp, None" over (replica, fsdp) */
} setup;

typedef struct run {
    spmd_graph *g;
    spmd_program *p;
    spmd_mesh *m;
    spmd_tensor *w, *b, *cw, *cb, *lr[2];
} run;

static spmd_tensor *find(spmd_graph *g, const char *name)
{
    spmd_tensor *t = spmd_graph_find(g, name);
    if (!t) fail_msg("the graph has no tensor '%s'", name);
    return t;
}

static spmd_optimizer_group as_group(const spmd_optimizer *o, const char *const *names)
{
    return (spmd_optimizer_group){
        .params = names, .n_params = 1, .weight_decay = o->weight_decay, .momentum = o->momentum,
        .beta1 = o->beta1, .beta2 = o->beta2, .eps = o->eps, .dampening = o->dampening,
        .nesterov = o->nesterov, .amsgrad = o->amsgrad, .alpha = o->alpha, .centered = o->centered,
        .lr_decay = o->lr_decay, .initial_accumulator_value = o->initial_accumulator_value,
        .maximize = o->maximize};
}

static const char *const w_name[] = {"w"}, *const b_name[] = {"b"};

static void build(run *r, const setup *how)
{
    memset(r, 0, sizeof *r);
    r->g = spmd_graph_create(NULL);
    assert_non_null(r->g);
    spmd_graph *g = r->g;
    r->w = spmd_param(g, "w", 2, D(W_ROWS, W_COLS), (spmd_init){SPMD_INIT_NORMAL, 0.5f});
    r->b = spmd_param(g, "b", 1, D(B_LEN), (spmd_init){SPMD_INIT_UNIFORM, 1.0f});
    r->cw = spmd_input(g, "cw", SPMD_F32, 2, D(W_ROWS, W_COLS));
    r->cb = spmd_input(g, "cb", SPMD_F32, 1, D(B_LEN));
    spmd_tensor *loss = spmd_add(g, spmd_sum(g, spmd_mul(g, r->w, r->cw), 3u, false),
                                 spmd_sum(g, spmd_mul(g, r->b, r->cb), 1u, false));
    assert_non_null(loss);
    if (how->mesh) {
        r->m = spmd_mesh_parse(how->mesh, "replica,fsdp");
        assert_non_null(r->m);
        assert_int_equal(spmd_mark_sharding(g, r->w, r->m, "fsdp, None"), SPMD_OK);
    }
    assert_int_equal(spmd_grad(g, loss), SPMD_OK);
    spmd_optimizer_tensors ot;
    spmd_status st;
    if (how->groups) {
        spmd_optimizer_group gr[2] = {as_group(&how->group[0], w_name),
                                      as_group(&how->group[1], b_name)};
        st = spmd_optimizer_apply_groups(g, &how->opt, gr, 2, &ot, r->lr);
    } else {
        st = spmd_optimizer_apply(g, &how->opt, &ot);
        r->lr[0] = ot.lr;
    }
    if (st != SPMD_OK) fail_msg("optimizer: %s", spmd_last_error());
    spmd_compile_options opts = {.threads = how->mesh ? 8 : 2, .seed = 3};
    r->p = spmd_compile(g, &opts);
    if (!r->p) fail_msg("compile: %s", spmd_last_error());
}

static void drop(run *r)
{
    spmd_program_free(r->p);
    spmd_graph_free(r->g);
    spmd_mesh_free(r->m);
}

/* Step s's gradients: uniform in [-1, 1), times 3 on the first step. */
static void gradients(int s, float *cw, float *cb)
{
    test_rng rng = test_rng_for((uint64_t)s, "optim kinds");
    float scale = s == 0 ? 3.0f : 1.0f;
    for (int i = 0; i < W_ROWS * W_COLS; i++) cw[i] = scale * test_rng_float(&rng, -1.0f, 1.0f);
    for (int i = 0; i < B_LEN; i++) cb[i] = scale * test_rng_float(&rng, -1.0f, 1.0f);
}

static void run_step(run *r, const setup *how, int s)
{
    float cw[W_ROWS * W_COLS], cb[B_LEN];
    gradients(s, cw, cb);
    assert_int_equal(spmd_program_set_input(r->p, r->cw, cw, sizeof cw), SPMD_OK);
    assert_int_equal(spmd_program_set_input(r->p, r->cb, cb, sizeof cb), SPMD_OK);
    for (int i = 0; i < (how->groups ? 2 : 1); i++)
        assert_int_equal(spmd_program_set_input(r->p, r->lr[i], &how->lr[i], sizeof(float)), SPMD_OK);
    if (spmd_program_run(r->p) != SPMD_OK) fail_msg("run: %s", spmd_last_error());
}

static void read_named(const run *r, const char *name, float *v, int64_t n)
{
    if (spmd_program_read(r->p, find(r->g, name), v, (size_t)n * sizeof *v) != SPMD_OK)
        fail_msg("read '%s': %s", name, spmd_last_error());
}

/* ---- Against the reference -------------------------------------------------------------------- */

/* `got` against the reference's values, by name. */
static bool close_to_ref(const char *what, const float *got, const double *want, int64_t n)
{
    float w[W_ROWS * W_COLS];
    for (int64_t i = 0; i < n; i++) w[i] = (float)want[i];
    return test_close_enough(what, got, w, n, REF_ATOL, REF_RTOL);
}

/* Parameter `name`'s value and state against its reference. */
static bool param_matches(const run *r, const spmd_optimizer *o, const char *name,
                          const ref_param *ref, int step)
{
    float v[W_ROWS * W_COLS];
    char what[96], state[64];
    read_named(r, name, v, ref->n);
    snprintf(what, sizeof what, "step %d: %s", step, name);
    bool ok = close_to_ref(what, v, ref->p, ref->n);
    const char *names[MAX_STATES];
    for (int k = 0, n = state_names(o, names); k < n; k++) {
        snprintf(state, sizeof state, "%s.%s", name, names[k]);
        read_named(r, state, v, ref->n);
        snprintf(what, sizeof what, "step %d: %s", step, state);
        ok = close_to_ref(what, v, ref->s[k], ref->n) && ok;
    }
    return ok;
}

static ref_param ref_start(const run *r, const char *name, int64_t n, const spmd_optimizer *o)
{
    ref_param p = {.n = n, .p = calloc((size_t)n, sizeof(double))};
    float v[W_ROWS * W_COLS];
    read_named(r, name, v, n);
    for (int64_t i = 0; i < n; i++) p.p[i] = v[i];
    for (int k = 0; k < MAX_STATES; k++) {
        p.s[k] = calloc((size_t)n, sizeof(double));
        for (int64_t i = 0; o->kind == SPMD_OPTIMIZER_ADAGRAD && i < n; i++)
            p.s[k][i] = o->initial_accumulator_value;
    }
    return p;
}

static void ref_free(ref_param *p)
{
    free(p->p);
    for (int k = 0; k < MAX_STATES; k++) free(p->s[k]);
}

/* STEPS steps of `how` against the reference, every value after every
 * step; each group's settings are its own (opt's without groups). */
static void check_against_reference(const char *name, const setup *how)
{
    run r;
    build(&r, how);
    spmd_optimizer ow = how->groups ? how->group[0] : how->opt;
    spmd_optimizer ob = how->groups ? how->group[1] : how->opt;
    ow.kind = ob.kind = how->opt.kind;
    ow = torch_settings(ow);
    ob = torch_settings(ob);
    ref_param w = ref_start(&r, "w", W_ROWS * W_COLS, &ow), b = ref_start(&r, "b", B_LEN, &ob);
    bool ok = true;
    for (int s = 0; s < STEPS && ok; s++) {
        run_step(&r, how, s);
        float cw[W_ROWS * W_COLS], cb[B_LEN];
        double gw[W_ROWS * W_COLS], gb[B_LEN];
        gradients(s, cw, cb);
        for (int i = 0; i < W_ROWS * W_COLS; i++) gw[i] = cw[i];
        for (int i = 0; i < B_LEN; i++) gb[i] = cb[i];
        ref_clip(how->opt.clip_norm, gw, W_ROWS * W_COLS, gb, B_LEN);
        ref_step(&ow, how->lr[0], s + 1, gw, &w);
        ref_step(&ob, how->lr[how->groups ? 1 : 0], s + 1, gb, &b);
        ok = param_matches(&r, &ow, "w", &w, s) && param_matches(&r, &ob, "b", &b, s);
        float step = NAN;
        read_named(&r, "opt.step", &step, 1);
        ok = ok && step == (float)(s + 1);
    }
    if (!ok) fail_msg("%s does not follow torch.optim's algorithm", name);
    print_message("%s: %d steps follow the reference\n", name, STEPS);
    ref_free(&w);
    ref_free(&b);
    drop(&r);
}

typedef struct kind_case {
    const char *name;
    spmd_optimizer opt;
    float lr;
} kind_case;

static const kind_case cases[] = {
    {"sgd_nesterov", {.kind = SPMD_OPTIMIZER_SGD, .momentum = 0.9f, .nesterov = true,
                      .weight_decay = 0.01f}, 0.05f},
    {"sgd_dampening", {.kind = SPMD_OPTIMIZER_SGD, .momentum = 0.8f, .dampening = 0.3f}, 0.05f},
    {"sgd_maximize", {.kind = SPMD_OPTIMIZER_SGD, .momentum = 0.9f, .maximize = true}, 0.05f},
    {"rmsprop", {.kind = SPMD_OPTIMIZER_RMSPROP}, 0.01f},
    {"rmsprop_centered", {.kind = SPMD_OPTIMIZER_RMSPROP, .alpha = 0.9f, .eps = 1e-6f,
                          .weight_decay = 0.1f, .momentum = 0.5f, .centered = true}, 0.01f},
    {"rmsprop_momentum", {.kind = SPMD_OPTIMIZER_RMSPROP, .momentum = 0.9f, .maximize = true},
     0.01f},
    {"rmsprop_centered_plain", {.kind = SPMD_OPTIMIZER_RMSPROP, .centered = true}, 0.01f},
    {"adagrad", {.kind = SPMD_OPTIMIZER_ADAGRAD}, 0.1f},
    {"adagrad_decay", {.kind = SPMD_OPTIMIZER_ADAGRAD, .lr_decay = 0.1f, .weight_decay = 0.01f,
                       .initial_accumulator_value = 0.5f, .eps = 1e-6f}, 0.1f},
    {"adam_amsgrad", {.kind = SPMD_OPTIMIZER_ADAM, .amsgrad = true, .weight_decay = 0.01f,
                      .beta1 = 0.9f, .beta2 = 0.6f}, 0.02f},
    {"adamw_amsgrad", {.kind = SPMD_OPTIMIZER_ADAMW, .amsgrad = true, .weight_decay = 0.1f,
                       .beta1 = 0.8f, .beta2 = 0.95f, .clip_norm = 2.0f}, 0.02f},
    {"adamw_maximize", {.kind = SPMD_OPTIMIZER_ADAMW, .maximize = true, .weight_decay = 0.1f},
     0.02f},
    {"adagrad_clipped", {.kind = SPMD_OPTIMIZER_ADAGRAD, .clip_norm = 1.5f, .maximize = true},
     0.1f},
};
#define N_CASES ((int)(sizeof cases / sizeof cases[0]))

static void test_against_reference(void **state)
{
    (void)state;
    for (int c = 0; c < N_CASES; c++)
        check_against_reference(cases[c].name, &(setup){.opt = cases[c].opt, .lr = {cases[c].lr}});
}

/* amsgrad keeps a maximum that differs from the second moment (the
 * large first step's, with a short memory for squares: beta2 0.6, as
 * the adam_amsgrad case has), so the reference's agreement means
 * something. */
static void test_amsgrad_keeps_the_maximum(void **state)
{
    (void)state;
    run r;
    setup how = {.opt = cases[9].opt, .lr = {0.02f}};
    assert_true(cases[9].opt.amsgrad && cases[9].opt.beta2 == 0.6f);
    build(&r, &how);
    for (int s = 0; s < STEPS; s++) run_step(&r, &how, s);
    float v[B_LEN], vmax[B_LEN];
    read_named(&r, "b.exp_avg_sq", v, B_LEN);
    read_named(&r, "b.max_exp_avg_sq", vmax, B_LEN);
    int above = 0;
    for (int i = 0; i < B_LEN; i++) {
        assert_true(vmax[i] >= v[i]);
        above += vmax[i] > v[i];
    }
    assert_true(above > B_LEN / 2);
    drop(&r);
}

/* Each kind in two groups: w and b with settings and lrs of their own. */
static void test_groups_against_reference(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        spmd_optimizer_kind kind;
        spmd_optimizer w, b;
    } group_cases[] = {
        {"sgd_groups", SPMD_OPTIMIZER_SGD, {.momentum = 0.9f, .nesterov = true, .weight_decay = 0.01f},
         {.momentum = 0.5f, .dampening = 0.5f, .maximize = true}},
        {"rmsprop_groups", SPMD_OPTIMIZER_RMSPROP,
         {.momentum = 0.5f, .centered = true, .weight_decay = 0.1f},
         {.alpha = 0.9f, .eps = 1e-6f}},
        {"adagrad_groups", SPMD_OPTIMIZER_ADAGRAD, {.lr_decay = 0.2f},
         {.initial_accumulator_value = 0.25f, .weight_decay = 0.1f}},
        {"adam_groups", SPMD_OPTIMIZER_ADAM, {.amsgrad = true, .weight_decay = 0.01f},
         {.beta1 = 0.8f, .beta2 = 0.95f}},
        {"adamw_groups", SPMD_OPTIMIZER_ADAMW, {.weight_decay = 0.1f},
         {.amsgrad = true, .beta1 = 0.85f, .beta2 = 0.99f, .eps = 1e-7f}},
    };
    for (size_t c = 0; c < sizeof group_cases / sizeof group_cases[0]; c++) {
        setup how = {.opt = {.kind = group_cases[c].kind, .clip_norm = 3.0f},
                     .group = {group_cases[c].w, group_cases[c].b}, .groups = true,
                     .lr = {0.02f, 0.05f}};
        check_against_reference(group_cases[c].name, &how);
    }
}

/* ---- ZeRO on a mesh ----------------------------------------------------------------------------- */

/* Every kind on 4x2 (replica, fsdp) with ZeRO follows one device, every
 * state split over both axes. */
static void test_zero_follows_one_device(void **state)
{
    (void)state;
    for (int c = 0; c < N_CASES; c++) {
        setup one = {.opt = cases[c].opt, .lr = {cases[c].lr}}, mesh = one;
        mesh.mesh = "4x2";
        run a, b;
        build(&a, &one);
        build(&b, &mesh);
        for (int s = 0; s < STEPS; s++) run_step(&a, &one, s), run_step(&b, &mesh, s);
        const char *names[MAX_STATES + 1] = {""};
        int n = 1 + state_names(&cases[c].opt, names + 1);
        bool ok = true;
        for (int k = 0; k < n; k++) {
            for (int which = 0; which < 2; which++) {
                char name[64], what[96];
                const char *param = which ? "b" : "w";
                snprintf(name, sizeof name, "%s%s%s", param, k ? "." : "", names[k]);
                int64_t len = which ? B_LEN : W_ROWS * W_COLS;
                float va[W_ROWS * W_COLS], vb[W_ROWS * W_COLS];
                read_named(&a, name, va, len);
                read_named(&b, name, vb, len);
                snprintf(what, sizeof what, "%s: %s", cases[c].name, name);
                ok = test_close_enough(what, vb, va, len, MESH_ATOL, MESH_RTOL) && ok;
                if (k > 0 && which == 0) { /* w's state: ZeRO splits it over both axes */
                    char spec[64];
                    spmd_get_sharding(find(b.g, name), spec, sizeof spec);
                    if (!strstr(spec, "fsdp") || !strstr(spec, "replica"))
                        fail_msg("%s: %s is held as '%s', not over both axes", cases[c].name, name,
                                 spec);
                }
            }
        }
        if (!ok) fail_msg("%s on 4x2 does not follow one device", cases[c].name);
        drop(&a);
        drop(&b);
    }
}

/* ---- Checkpoints ------------------------------------------------------------------------------- */

/* Saved after 3 of STEPS steps and resumed in a new program (on the
 * mesh), the run ends with the uninterrupted run's bits: parameters and
 * every state. */
static void test_checkpoint_resumes_every_state(void **state)
{
    (void)state;
    static const int picks[] = {1, 4, 8, 9, 10};
    for (size_t c = 0; c < sizeof picks / sizeof picks[0]; c++) {
        const kind_case *kc = &cases[picks[c]];
        setup how = {.opt = kc->opt, .lr = {kc->lr}, .mesh = "4x2"};
        char *dir = support_temp_dir("spmd-optim-kinds");
        run whole, first, resumed;
        build(&whole, &how);
        build(&first, &how);
        build(&resumed, &how);
        for (int s = 0; s < STEPS; s++) run_step(&whole, &how, s);
        for (int s = 0; s < 3; s++) run_step(&first, &how, s);
        assert_int_equal(spmd_checkpoint_save(first.p, dir, 3, NULL, 0), SPMD_OK);
        int64_t step = 0;
        if (spmd_checkpoint_load(resumed.p, dir, &step, NULL) != SPMD_OK)
            fail_msg("load: %s", spmd_last_error());
        assert_int_equal(step, 3);
        for (int s = 3; s < STEPS; s++) run_step(&resumed, &how, s);
        const char *names[MAX_STATES + 1] = {""};
        int n = 1 + state_names(&kc->opt, names + 1);
        for (int k = 0; k < n; k++) {
            char name[64];
            snprintf(name, sizeof name, "w%s%s", k ? "." : "", names[k]);
            float va[W_ROWS * W_COLS], vb[W_ROWS * W_COLS];
            read_named(&whole, name, va, W_ROWS * W_COLS);
            read_named(&resumed, name, vb, W_ROWS * W_COLS);
            if (memcmp(va, vb, sizeof va))
                fail_msg("%s: resumed %s differs from the uninterrupted run's", kc->name, name);
        }
        drop(&whole);
        drop(&first);
        drop(&resumed);
        support_drop_dir(dir);
    }
}

/* ---- Refusals ----------------------------------------------------------------------------------- */

static spmd_graph *small_graph(void)
{
    spmd_graph *g = spmd_graph_create(NULL);
    spmd_tensor *w = spmd_param(g, "w", 1, D(4), (spmd_init){SPMD_INIT_ONES, 0});
    spmd_tensor *x = spmd_input(g, "x", SPMD_F32, 1, D(4));
    assert_int_equal(spmd_grad(g, spmd_sum(g, spmd_mul(g, w, x), 1u, false)), SPMD_OK);
    return g;
}

static void expect_refused(const spmd_optimizer *opt, const spmd_optimizer_group *groups,
                           const char *needle)
{
    spmd_graph *g = small_graph();
    int before = spmd_graph_tensor_count(g);
    spmd_optimizer_tensors ot;
    spmd_status st = groups ? spmd_optimizer_apply_groups(g, opt, groups, 1, &ot, NULL)
                            : spmd_optimizer_apply(g, opt, &ot);
    if (st != SPMD_ERR_INVALID)
        fail_msg("want SPMD_ERR_INVALID for '%s', got %s (%s)", needle, spmd_status_name(st),
                 spmd_last_error());
    if (!strstr(spmd_last_error(), needle))
        fail_msg("message \"%s\" does not mention \"%s\"", spmd_last_error(), needle);
    assert_int_equal(spmd_graph_tensor_count(g), before);
    spmd_graph_free(g);
}

static void test_refusals(void **state)
{
    (void)state;
    const struct {
        spmd_optimizer opt;
        const char *needle;
    } bad[] = {
        {{.kind = SPMD_OPTIMIZER_SGD, .dampening = 0.5f}, "dampening 0.5 without momentum"},
        {{.kind = SPMD_OPTIMIZER_SGD, .momentum = 0.9f, .dampening = -0.5f}, "dampening -0.5"},
        {{.kind = SPMD_OPTIMIZER_SGD, .nesterov = true}, "Nesterov momentum needs a momentum"},
        {{.kind = SPMD_OPTIMIZER_SGD, .momentum = 0.9f, .dampening = 0.1f, .nesterov = true},
         "zero dampening"},
        {{.kind = SPMD_OPTIMIZER_SGD, .amsgrad = true}, "amsgrad is a setting of AdamW and Adam"},
        {{.kind = SPMD_OPTIMIZER_ADAM, .centered = true}, "centered is a setting of RMSprop"},
        {{.kind = SPMD_OPTIMIZER_ADAMW, .nesterov = true}, "nesterov is a setting of SGD"},
        {{.kind = SPMD_OPTIMIZER_RMSPROP, .alpha = 1.5f}, "RMSprop alpha 1.5 is outside [0, 1]"},
        {{.kind = SPMD_OPTIMIZER_RMSPROP, .alpha = NAN}, "RMSprop alpha"},
        {{.kind = SPMD_OPTIMIZER_RMSPROP, .momentum = -1.0f}, "RMSprop momentum -1"},
        {{.kind = SPMD_OPTIMIZER_RMSPROP, .eps = -1.0f}, "RMSprop eps -1"},
        {{.kind = SPMD_OPTIMIZER_RMSPROP, .beta1 = 0.9f},
         "beta1 is a setting of AdamW and Adam; RMSprop takes weight_decay, momentum, eps, alpha, "
         "centered and maximize"},
        {{.kind = SPMD_OPTIMIZER_RMSPROP, .lr_decay = 0.1f}, "lr_decay is a setting of Adagrad"},
        {{.kind = SPMD_OPTIMIZER_ADAGRAD, .lr_decay = -0.1f}, "Adagrad lr_decay -0.1"},
        {{.kind = SPMD_OPTIMIZER_ADAGRAD, .initial_accumulator_value = INFINITY},
         "initial_accumulator_value inf"},
        {{.kind = SPMD_OPTIMIZER_ADAGRAD, .momentum = 0.9f},
         "momentum is a setting of SGD and RMSprop; Adagrad takes"},
        {{.kind = SPMD_OPTIMIZER_ADAGRAD, .alpha = 0.9f}, "alpha is a setting of RMSprop"},
        {{.kind = (spmd_optimizer_kind)5}, "unknown optimizer kind 5"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) expect_refused(&bad[i].opt, NULL, bad[i].needle);

    /* With groups: the groups' own settings are refused among the shared
     * ones, and a group's checked under its index. */
    const char *const all[] = {"*"};
    spmd_optimizer_group one = {.params = all, .n_params = 1};
    expect_refused(&(spmd_optimizer){.kind = SPMD_OPTIMIZER_ADAM, .amsgrad = true}, &one,
                   "with groups, amsgrad is each group's own");
    expect_refused(&(spmd_optimizer){.kind = SPMD_OPTIMIZER_SGD, .maximize = true}, &one,
                   "with groups, maximize is each group's own");
    one.centered = true;
    expect_refused(&(spmd_optimizer){.kind = SPMD_OPTIMIZER_ADAGRAD}, &one,
                   "group 0: centered is a setting of RMSprop; Adagrad takes");
    one.centered = false, one.alpha = 2.0f;
    expect_refused(&(spmd_optimizer){.kind = SPMD_OPTIMIZER_RMSPROP}, &one,
                   "group 0: RMSprop alpha 2 is outside");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_reference),
        cmocka_unit_test(test_amsgrad_keeps_the_maximum),
        cmocka_unit_test(test_groups_against_reference),
        cmocka_unit_test(test_zero_follows_one_device),
        cmocka_unit_test(test_checkpoint_resumes_every_state),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
