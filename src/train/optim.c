/*
 * Optimizers as graph ops appended after spmd_grad (spmd/train.h): SGD
 * (momentum, dampening, Nesterov), Adam (L2 decay), AdamW (decoupled
 * decay), both with amsgrad, RMSprop (centered, momentum) and Adagrad (lr
 * decay), all with L2 decay where torch adds it and maximize; parameter
 * groups with their own settings and learning rates, and clipping by the
 * global gradient norm, each with PyTorch's semantics (torch.optim's
 * classes, param_groups, torch.nn.utils.clip_grad_norm_), plus the
 * learning rate schedule.  Frozen parameters (spmd_param_freeze) have no
 * gradient, so no update.  The settings are checked in optim_settings.c.
 *
 * Each update is a chain of elementwise ops per parameter (amsgrad's
 * maximum a where), which fusion runs as fused passes over the
 * parameter's shard (docs/DESIGN.md, "Fusion").
 *
 * Being graph ops, the updates are partitioned with the rest of the step.
 * A marked parameter's moments, and the copy of its gradient the update
 * reads, get the parameter's mark: left to propagation, a state tensor
 * only learns its sharding from consumers, which fails through chains of
 * values nobody has placed yet.  With the marks, FSDP reduce-scatters each
 * gradient into the parameter's shard and every device holds and updates
 * only its block of each moment (ZeRO-3).
 *
 * The learning rate is an input ("lr", and "lr.<i>" for group i > 0), so
 * a schedule changes it every step without recompiling; the step count
 * is a state scalar, shared by all groups as torch's per-parameter counts
 * are equal, so Adam's bias corrections are computed in the graph and a
 * checkpoint of the state resumes them exactly.
 */
#include "train/optim.h"
#include "train/optim_impl.h"

#include "base/error.h"
#include "ir/ir.h"
#include "mesh/sharding.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define LR_NAME "lr"
#define LR_NAME_SIZE 32 /* "lr.<group>" */
#define WD_NAME "weight_decay"
#define STEP_NAME "opt.step"
#define NORM_NAME "opt.grad_norm"
#define KEEP_NAME "accumulate.keep"
#define ACC_SUFFIX ".grad_acc"
#define NAME_SIZE 256
#define CLIP_EPS 1e-6f /* clip_grad_norm_'s guard against a zero norm */

/* The state each kind keeps per parameter, "<param><suffix>", named as
 * torch.optim names it. */
#define MOMENTUM_STATE ".momentum"             /* SGD, RMSprop: momentum_buffer */
#define EXP_AVG_STATE ".exp_avg"               /* Adam, AdamW */
#define EXP_AVG_SQ_STATE ".exp_avg_sq"         /* Adam, AdamW */
#define MAX_EXP_AVG_SQ_STATE ".max_exp_avg_sq" /* Adam, AdamW with amsgrad */
#define SQUARE_AVG_STATE ".square_avg"         /* RMSprop */
#define GRAD_AVG_STATE ".grad_avg"             /* RMSprop, centered */
#define SUM_STATE ".sum"                       /* Adagrad */
#define MAX_STATES 3

/* Adam and AdamW: the same moments, decay aside. */
static bool is_adam(spmd_optimizer_kind k)
{
    return k == SPMD_OPTIMIZER_ADAMW || k == SPMD_OPTIMIZER_ADAM;
}

/* The suffixes of the state o keeps per parameter; their count. */
static int state_suffixes(const spmd_optimizer *o, const char *out[MAX_STATES])
{
    int n = 0;
    switch (o->kind) {
    case SPMD_OPTIMIZER_SGD:
        if (o->momentum != 0.0f) out[n++] = MOMENTUM_STATE;
        break;
    case SPMD_OPTIMIZER_ADAMW:
    case SPMD_OPTIMIZER_ADAM:
        out[n++] = EXP_AVG_STATE;
        out[n++] = EXP_AVG_SQ_STATE;
        if (o->amsgrad) out[n++] = MAX_EXP_AVG_SQ_STATE;
        break;
    case SPMD_OPTIMIZER_RMSPROP:
        out[n++] = SQUARE_AVG_STATE;
        if (o->centered) out[n++] = GRAD_AVG_STATE;
        if (o->momentum != 0.0f) out[n++] = MOMENTUM_STATE;
        break;
    case SPMD_OPTIMIZER_ADAGRAD:
        out[n++] = SUM_STATE;
        break;
    }
    return n;
}

/* Whether o's update reads the step count: Adam's bias corrections,
 * Adagrad's lr decay, SGD's first step with dampening. */
static bool reads_step(const spmd_optimizer *o)
{
    return is_adam(o->kind) || (o->kind == SPMD_OPTIMIZER_ADAGRAD && o->lr_decay != 0.0f) ||
           (o->kind == SPMD_OPTIMIZER_SGD && o->dampening != 0.0f);
}

/* A graph op returned NULL: the failure it recorded on g, this call's own
 * in the error scope of train_optimizer_append, raised again so that the
 * message goes with the status.  Everything was checked before the first
 * op, so only allocation may fail there: anything else is a bug. */
static spmd_status builder_failed(const spmd_graph *g, const char *who)
{
    if (ir_graph_status(g) == SPMD_OK)
        return base_error(SPMD_ERR_INTERNAL, "%s: a graph op failed without a message", who);
    return ir_error_raise(g);
}

/* ---- Checks on the graph, before anything is appended ------------------------------------ */

static spmd_status name_free(const spmd_graph *g, const char *name, const char *who)
{
    if (!spmd_graph_find(g, name)) return SPMD_OK;
    return base_error(SPMD_ERR_INVALID,
                      "%s: the graph already has a tensor named '%s' (applied an optimizer "
                      "twice?)", who, name);
}

static spmd_status state_name(const spmd_tensor *p, const char *suffix, char *buf, const char *who)
{
    int n = snprintf(buf, NAME_SIZE, "%s%s", p->name, suffix);
    if (n < 0 || n >= NAME_SIZE)
        return base_error(SPMD_ERR_INVALID, "%s: parameter name '%.64s...' is too long for its "
                          "state names (at most %d characters)", who, p->name,
                          NAME_SIZE - 1 - (int)strlen(suffix));
    return SPMD_OK;
}

/* A learning rate: the caller's tensor, else the graph's input `name`;
 * *lr stays NULL when that is still to be created. */
static spmd_status check_lr(const spmd_graph *g, spmd_tensor **lr, const char *name,
                            const char *who)
{
    const spmd_tensor *t = *lr;
    if (!t) {
        t = *lr = spmd_graph_find(g, name);
        if (!t) return SPMD_OK;
        if (t->op != IR_INPUT)
            return base_error(SPMD_ERR_INVALID,
                              "%s: the graph's tensor '%s' is a %s; the learning rate is "
                              "the f32 scalar input '%s' (rename the other tensor)",
                              who, name, ir_op_name(t->op), name);
    }
    if (t->graph != g)
        return base_error(SPMD_ERR_INVALID, "%s: lr belongs to another graph", who);
    if (t->rank != 0 || t->dtype != SPMD_F32)
        return base_error(SPMD_ERR_SHAPE, "%s: %s must be an f32 scalar, got rank %d %s", who,
                          name, t->rank, spmd_dtype_name(t->dtype));
    return SPMD_OK;
}

/* Group i's learning rate input: "lr", "lr.1", "lr.2", ... */
static void lr_name(int group, char *buf)
{
    if (group == 0)
        snprintf(buf, LR_NAME_SIZE, "%s", LR_NAME);
    else
        snprintf(buf, LR_NAME_SIZE, "%s.%d", LR_NAME, group);
}

/* The update as planned: each group's settings in force (defaults in) and
 * learning rate, each parameter's group.  One allocation (plan_alloc). */
typedef struct shared shared;
typedef struct plan {
    const spmd_graph *g;
    int n_groups, n_params;
    spmd_tensor **params; /* the trained parameters in graph order */
    spmd_tensor **grads;  /* what each update reads */
    spmd_tensor **lr;     /* each group's; NULL until created */
    shared *s;            /* each group's scalars */
    spmd_optimizer *o;    /* each group's settings */
    int *group;           /* each parameter's group */
    bool *grouped;        /* scratch for squares_total */
} plan;

/* '*' stands for any run of characters (dots too), '?' for any one. */
static bool name_matches(const char *pattern, const char *name)
{
    const char *star = NULL, *resume = NULL;
    while (*name) {
        if (*pattern == '*') {
            star = pattern++;
            resume = name;
        } else if (*pattern == '?' || *pattern == *name) {
            pattern++;
            name++;
        } else if (star) {
            pattern = star + 1;
            name = ++resume;
        } else {
            return false;
        }
    }
    while (*pattern == '*') pattern++;
    return *pattern == '\0';
}

/* A group's name or pattern that matches no trained parameter: say so,
 * and whether it names a frozen one. */
static spmd_status matches_none(const spmd_graph *g, int group, const char *pattern,
                                const char *who)
{
    for (int i = 0; i < g->n_nodes; i++) {
        const spmd_tensor *t = g->nodes[i];
        if (t->op == IR_PARAM && t->frozen && name_matches(pattern, t->name))
            return base_error(SPMD_ERR_INVALID,
                              "%s: group %d's '%s' matches only frozen parameters ('%s'): a "
                              "frozen parameter has no update", who, group, pattern, t->name);
    }
    return base_error(SPMD_ERR_INVALID, "%s: group %d's '%s' matches no parameter", who, group,
                      pattern);
}

/* Each parameter's group from the groups' names and patterns: exactly one. */
static spmd_status assign_groups(plan *pl, const spmd_optimizer_group *groups, const char *who)
{
    for (int k = 0; k < pl->n_params; k++) pl->group[k] = groups ? -1 : 0;
    if (!groups) return SPMD_OK;
    for (int i = 0; i < pl->n_groups; i++) {
        const spmd_optimizer_group *gr = &groups[i];
        if (gr->n_params < 0 || (gr->n_params > 0 && !gr->params))
            return base_error(SPMD_ERR_INVALID,
                              "%s: group %d's parameter list is NULL or has %d entries", who, i,
                              gr->n_params);
        for (int e = 0; e < gr->n_params; e++) {
            const char *pattern = gr->params[e];
            if (!pattern)
                return base_error(SPMD_ERR_INVALID, "%s: group %d's parameter %d is NULL", who,
                                  i, e);
            bool matched = false;
            for (int k = 0; k < pl->n_params; k++) {
                if (!name_matches(pattern, pl->params[k]->name)) continue;
                matched = true;
                if (pl->group[k] >= 0 && pl->group[k] != i)
                    return base_error(SPMD_ERR_INVALID,
                                      "%s: parameter '%s' is in group %d and in group %d (as "
                                      "'%s'); a parameter belongs to exactly one group", who,
                                      pl->params[k]->name, pl->group[k], i, pattern);
                pl->group[k] = i;
            }
            if (!matched) return matches_none(pl->g, i, pattern, who);
        }
    }
    for (int k = 0; k < pl->n_params; k++)
        if (pl->group[k] < 0)
            return base_error(SPMD_ERR_INVALID,
                              "%s: parameter '%s' is in no group; every parameter belongs to "
                              "exactly one", who, pl->params[k]->name);
    return SPMD_OK;
}

static spmd_status check_param(const spmd_graph *g, const spmd_tensor *p, const char *who)
{
    if (!p->grad)
        return base_error(SPMD_ERR_INVALID,
                          "%s: parameter '%s' was created after spmd_grad and has no gradient",
                          who, p->name);
    if (p->has_update)
        return base_error(SPMD_ERR_INVALID,
                          "%s: parameter '%s' already has an update (spmd_sgd or an optimizer "
                          "was applied already)", who, p->name);
    /* Every mark of a graph is on its one mesh (marks.c), which the state
     * marks copied from the parameter's rely on. */
    if (p->mark && !g->mesh) return BASE_INTERNAL("a marked parameter in a graph without a mesh");
    return SPMD_OK;
}

static bool accumulates(const spmd_optimizer *o) { return o->accumulate_steps > 1; }

static spmd_status check_state_names(const spmd_graph *g, const spmd_optimizer *o,
                                     const spmd_tensor *p, const char *who)
{
    char name[NAME_SIZE];
    const char *suffixes[MAX_STATES];
    int n = state_suffixes(o, suffixes);
    spmd_status st = SPMD_OK;
    for (int k = 0; k < n && st == SPMD_OK; k++) {
        st = state_name(p, suffixes[k], name, who);
        if (st == SPMD_OK) st = name_free(g, name, who);
    }
    if (st == SPMD_OK && accumulates(o)) {
        st = state_name(p, ACC_SUFFIX, name, who);
        if (st == SPMD_OK) st = name_free(g, name, who);
    }
    return st;
}

static spmd_status check_graph(const spmd_graph *g, plan *pl,
                               const spmd_optimizer_group *groups, bool bookkeeping,
                               const char *who)
{
    if (!g->has_grad)
        return base_error(SPMD_ERR_INVALID,
                          "%s: call spmd_grad first: the update needs every parameter's gradient",
                          who);
    spmd_status st = SPMD_OK;
    for (int k = 0; k < pl->n_params && st == SPMD_OK; k++) st = check_param(g, pl->params[k], who);
    if (st == SPMD_OK) st = assign_groups(pl, groups, who);
    for (int k = 0; k < pl->n_params && st == SPMD_OK; k++)
        st = check_state_names(g, &pl->o[pl->group[k]], pl->params[k], who);
    if (st == SPMD_OK && !bookkeeping && accumulates(&pl->o[0]))
        st = BASE_INTERNAL("accumulation needs the optimizer's bookkeeping");
    if (st != SPMD_OK || !bookkeeping) return st;
    if (pl->n_params == 0)
        return base_error(SPMD_ERR_INVALID,
                          "%s: the graph has no trained parameters (none, or all frozen)", who);
    const spmd_optimizer *o = &pl->o[0];
    st = name_free(g, STEP_NAME, who);
    if (st == SPMD_OK && accumulates(o)) st = name_free(g, KEEP_NAME, who);
    if (st == SPMD_OK && o->weight_decay_input && o->weight_decay != 0.0f) st = name_free(g, WD_NAME, who);
    return st != SPMD_OK ? st : name_free(g, NORM_NAME, who);
}
/* ---- Building blocks --------------------------------------------------------------------- */

static spmd_status copy_mark(spmd_graph *g, spmd_tensor *t, const sharding *mark)
{
    /* A new one: marks are shared, never changed in place (marks.c). */
    sharding *copy = base_arena_alloc(&g->arena, sizeof *copy);
    if (!copy) return ir_error_keep(g); /* its tensor is lost: a builder failure */
    *copy = *mark;
    t->mark = copy;
    return SPMD_OK;
}

/* Where the update of p works: p's own sharding, or with ZeRO (the default)
 * (ZeRO) also split, on p's largest dim, over the mesh axes p is
 * replicated over; false when that is p's unmarked, replicated self. */
static bool state_mark(const spmd_graph *g, const spmd_optimizer *o, const spmd_tensor *p,
                       sharding *out)
{
    *out = p->mark ? *p->mark : sharding_replicated(p->rank);
    bool marked = p->mark != NULL;
    const spmd_mesh *m = g->mesh;
    /* A grouped split (N*axis, runs each split apart) keeps its own mark. */
    if (o->zero == SPMD_ZERO_OFF || !m || p->rank == 0 || sharding_has_groups(out)) return marked;
    uint32_t used = 0;
    for (int i = 0; i < p->rank; i++) used |= mesh_axes_mask(&out->dim[i]);
    int d = 0;
    for (int i = 1; i < p->rank; i++)
        if (p->dims[i] > p->dims[d]) d = i;
    int64_t blocks = mesh_axes_size(m, &out->dim[d]);
    for (int a = 0; a < m->rank && out->dim[d].n < MESH_MAX_AXES; a++) {
        if ((used >> a & 1) || mesh_axis_holds_no_split(m, a) || m->shape[a] == 1) continue;
        /* Every device gets a piece: no split into mostly padding, and no
         * device left with only padding (11 rows over 8: blocks of 2, the
         * last two empty). */
        int64_t nb = blocks * m->shape[a], rows = (p->dims[d] + nb - 1) / nb;
        if (p->dims[d] < nb || (nb - 1) * rows >= p->dims[d]) break;
        /* Inside blocks the mark splits already, only an even split: the
         * padding of uneven blocks would sit between the new pieces, and
         * gathering them back would take the whole dim (a whole
         * vocabulary on every device). */
        if (blocks > 1 && p->dims[d] % nb != 0) break;
        out->dim[d].axis[out->dim[d].n++] = (int8_t)a;
        blocks *= m->shape[a];
        marked = true;
    }
    return marked;
}

/* "<param><suffix>", starting as `init` says, in the update's sharding
 * (state_mark). */
static spmd_tensor *param_state_from(spmd_graph *g, const spmd_optimizer *o, const spmd_tensor *p,
                                     const char *suffix, spmd_init init)
{
    char name[NAME_SIZE];
    snprintf(name, sizeof name, "%s%s", p->name, suffix); /* length checked up front */
    spmd_tensor *s = spmd_state(g, name, p->rank, p->dims, init);
    sharding mark;
    if (s && state_mark(g, o, p, &mark) && copy_mark(g, s, &mark) != SPMD_OK) return NULL;
    return s;
}

/* "<param><suffix>", zeros. */
static spmd_tensor *param_state(spmd_graph *g, const spmd_optimizer *o, const spmd_tensor *p,
                                const char *suffix)
{
    return param_state_from(g, o, p, suffix, (spmd_init){SPMD_INIT_ZEROS, 0.0f});
}

/* p as the update reads it: itself, or with ZeRO a sharding
 * constraint of it to the update's sharding (each device's slice of it:
 * no collective, no copy), so the update runs on shards and only its
 * result is gathered back. */
static spmd_tensor *param_in_update(spmd_graph *g, const spmd_optimizer *o, spmd_tensor *p)
{
    sharding mark;
    if (o->zero == SPMD_ZERO_OFF || !state_mark(g, o, p, &mark) || (p->mark && sharding_equal(&mark, p->mark)))
        return p;
    spmd_tensor *view = ir_sharding_constraint(g, p);
    if (view && copy_mark(g, view, &mark) != SPMD_OK) return NULL;
    return view;
}

static spmd_status update(spmd_graph *g, spmd_tensor *target, spmd_tensor *value, const char *who)
{
    if (!target || !value) return builder_failed(g, who);
    return spmd_graph_set_update(g, target, value);
}

static spmd_tensor *sum_of_squares(spmd_graph *g, spmd_tensor *x)
{
    spmd_tensor *sq = spmd_mul(g, x, x);
    if (!sq || x->rank == 0) return sq;
    return spmd_sum(g, sq, (1u << x->rank) - 1u, false);
}

/* min(1, c) for a scalar c.  There is no min op; -max(-c, -1) is exact,
 * where 1 - relu(1 - c) loses the low bits of a small c (hard clipping)
 * and c - relu(c - 1) breaks once c - 1 rounds (a norm near zero). */
static spmd_tensor *min_one(spmd_graph *g, spmd_tensor *c)
{
    const int64_t dims[1] = {1};
    spmd_tensor *pair[2] = {spmd_reshape(g, spmd_neg(g, c), 1, dims), spmd_fill(g, 1, dims, -1.0f)};
    return spmd_neg(g, spmd_max(g, spmd_concat(g, pair, 2, 0), 0, false));
}

/* 1 - b^t for the step count t >= 1 (an f32 scalar): -expm1(t ln b), with
 * expm1(x) = tanh(x / 2) (e^x + 1).  Written as 1 - exp(t ln b) it cancels:
 * at b = 0.999, t = 1 only 3 of the 7 digits survive. */
static spmd_tensor *bias_correction(spmd_graph *g, spmd_tensor *t, spmd_tensor *one, float b)
{
    if (b == 0.0f) return one; /* 0^t = 0 */
    double ln_b = log((double)b);
    spmd_tensor *e = spmd_add(g, spmd_exp(g, spmd_scale(g, t, (float)ln_b)), one);
    spmd_tensor *th = spmd_tanh(g, spmd_scale(g, t, (float)(0.5 * ln_b)));
    return spmd_neg(g, spmd_mul(g, th, e));
}

/* max(a, b) elementwise, as torch.maximum: a where a - b > 0 or is NaN
 * (relu passes NaN), else b.  There is no maximum op; the difference of
 * two distinct floats is never 0, so the pick is exact. */
static spmd_tensor *maximum(spmd_graph *g, spmd_tensor *a, spmd_tensor *b)
{
    return spmd_where(g, spmd_relu(g, spmd_sub(g, a, b)), a, b);
}

/* Scalars every parameter's update in one group shares. */
typedef struct shared {
    spmd_tensor *lr;
    spmd_tensor *wd;         /* the input "weight_decay", or NULL: the constant */
    spmd_tensor *clip_scale; /* NULL: no clipping (the same for every group) */
    spmd_tensor *eps;        /* Adam, AdamW, RMSprop, Adagrad */
    /* Adam, AdamW */
    spmd_tensor *decay;      /* AdamW: 1 - lr wd; NULL without weight decay */
    spmd_tensor *step_size;  /* lr / (1 - b1^t) */
    spmd_tensor *bc2_sqrt;   /* sqrt(1 - b2^t) */
    spmd_tensor *damp;       /* SGD: 1 on the first step, 1 - dampening after; NULL: 1 */
    spmd_tensor *clr;        /* Adagrad: lr / (1 + (t - 1) lr_decay) */
} shared;

/* x + wd p: the L2 decay every kind but AdamW adds to the gradient
 * (torch's grad.add(param, alpha=weight_decay)); x itself without decay. */
static spmd_tensor *add_l2_decay(spmd_graph *g, const spmd_optimizer *o, spmd_tensor *x,
                                 spmd_tensor *p, const shared *s)
{
    if (o->weight_decay == 0.0f) return x;
    return spmd_add(g, x, s->wd ? spmd_mul(g, p, s->wd) : spmd_scale(g, p, o->weight_decay));
}

/* torch.optim.SGD:
 *   d = g + wd p
 *   buf = momentum buf + (1 - dampening) d   (buf = d on the first step)
 *   d = nesterov ? d + momentum buf : buf
 *   p -= lr d  (lr d without momentum).
 * torch starts buf as a copy of the first d; a zero buffer gives exactly
 * that (momentum * 0 + d == d; with dampening the factor is 1 on the
 * first step), and a buffer restored from a checkpoint resumes where it
 * was. */
static spmd_status sgd_param(spmd_graph *g, const spmd_optimizer *o, spmd_tensor *p,
                             spmd_tensor *grad, const shared *s, const char *who)
{
    spmd_tensor *target = p;
    p = param_in_update(g, o, p);
    spmd_tensor *d = add_l2_decay(g, o, grad, p, s);
    if (o->momentum != 0.0f) {
        spmd_tensor *buf = param_state(g, o, target, MOMENTUM_STATE);
        spmd_tensor *added = s->damp ? spmd_mul(g, d, s->damp) : d;
        spmd_tensor *next = spmd_add(g, spmd_scale(g, buf, o->momentum), added);
        spmd_status st = update(g, buf, next, who);
        if (st != SPMD_OK) return st;
        d = o->nesterov ? spmd_add(g, d, spmd_scale(g, next, o->momentum)) : next;
    }
    return update(g, target, spmd_sub(g, p, spmd_mul(g, d, s->lr)), who);
}

/* torch.optim.AdamW and torch.optim.Adam, in their order of operations:
 *   AdamW: p *= 1 - lr wd          Adam: g = g + wd p
 *   m = b1 m + (1 - b1) g;   v = b2 v + (1 - b2) g^2
 *   amsgrad: v_max = max(v_max, v), read below in v's place
 *   p -= (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps) */
static spmd_status adam_param(spmd_graph *g, const spmd_optimizer *o, spmd_tensor *p,
                              spmd_tensor *grad, const shared *s, const char *who)
{
    spmd_tensor *m = param_state(g, o, p, EXP_AVG_STATE);
    spmd_tensor *v = param_state(g, o, p, EXP_AVG_SQ_STATE);
    spmd_tensor *at = NULL;
    if (o->kind == SPMD_OPTIMIZER_ADAM && o->weight_decay != 0.0f) {
        at = param_in_update(g, o, p);
        grad = add_l2_decay(g, o, grad, at, s);
    }
    /* (1 - b) rounded from double, as torch passes it to the kernels. */
    float c1 = (float)(1.0 - (double)o->beta1), c2 = (float)(1.0 - (double)o->beta2);
    spmd_tensor *m_next = spmd_add(g, spmd_scale(g, m, o->beta1), spmd_scale(g, grad, c1));
    spmd_tensor *v_next =
        spmd_add(g, spmd_scale(g, v, o->beta2), spmd_scale(g, spmd_mul(g, grad, grad), c2));
    spmd_status st = update(g, m, m_next, who);
    if (st == SPMD_OK) st = update(g, v, v_next, who);
    if (st != SPMD_OK) return st;
    if (o->amsgrad) {
        spmd_tensor *v_max = param_state(g, o, p, MAX_EXP_AVG_SQ_STATE);
        spmd_tensor *v_max_next = maximum(g, v_next, v_max);
        if ((st = update(g, v_max, v_max_next, who)) != SPMD_OK) return st;
        v_next = v_max_next;
    }
    spmd_tensor *denom = spmd_add(g, spmd_div(g, spmd_sqrt(g, v_next), s->bc2_sqrt), s->eps);
    spmd_tensor *delta = spmd_div(g, spmd_mul(g, m_next, s->step_size), denom);
    if (!at) at = param_in_update(g, o, p);
    spmd_tensor *base = s->decay ? spmd_mul(g, at, s->decay) : at;
    return update(g, p, spmd_sub(g, base, delta), who);
}

/* torch.optim.RMSprop:
 *   g = g + wd p;   v = alpha v + (1 - alpha) g^2
 *   centered: a = alpha a + (1 - alpha) g, and v - a^2 below in v's place
 *   u = g / (sqrt(v) + eps)
 *   momentum: buf = momentum buf + u, and buf in u's place
 *   p -= lr u
 * Every state starts at zero, as torch's. */
static spmd_status rmsprop_param(spmd_graph *g, const spmd_optimizer *o, spmd_tensor *p,
                                 spmd_tensor *grad, const shared *s, const char *who)
{
    spmd_tensor *v = param_state(g, o, p, SQUARE_AVG_STATE);
    spmd_tensor *a = o->centered ? param_state(g, o, p, GRAD_AVG_STATE) : NULL;
    spmd_tensor *buf = o->momentum != 0.0f ? param_state(g, o, p, MOMENTUM_STATE) : NULL;
    spmd_tensor *at = param_in_update(g, o, p);
    grad = add_l2_decay(g, o, grad, at, s);
    float c = (float)(1.0 - (double)o->alpha); /* rounded from double, as torch passes it */
    spmd_tensor *v_next =
        spmd_add(g, spmd_scale(g, v, o->alpha), spmd_scale(g, spmd_mul(g, grad, grad), c));
    spmd_status st = update(g, v, v_next, who);
    if (st != SPMD_OK) return st;
    spmd_tensor *var = v_next;
    if (a) {
        spmd_tensor *a_next = spmd_add(g, spmd_scale(g, a, o->alpha), spmd_scale(g, grad, c));
        if ((st = update(g, a, a_next, who)) != SPMD_OK) return st;
        var = spmd_sub(g, v_next, spmd_mul(g, a_next, a_next));
    }
    spmd_tensor *u = spmd_div(g, grad, spmd_add(g, spmd_sqrt(g, var), s->eps));
    if (buf) {
        spmd_tensor *buf_next = spmd_add(g, spmd_scale(g, buf, o->momentum), u);
        if ((st = update(g, buf, buf_next, who)) != SPMD_OK) return st;
        u = buf_next;
    }
    return update(g, p, spmd_sub(g, at, spmd_mul(g, u, s->lr)), who);
}

/* torch.optim.Adagrad:
 *   g = g + wd p;   sum = sum + g^2
 *   p -= (lr / (1 + (t - 1) lr_decay)) g / (sqrt(sum) + eps)
 * The sum starts at initial_accumulator_value, as torch's. */
static spmd_status adagrad_param(spmd_graph *g, const spmd_optimizer *o, spmd_tensor *p,
                                 spmd_tensor *grad, const shared *s, const char *who)
{
    spmd_tensor *sum = param_state_from(
        g, o, p, SUM_STATE, (spmd_init){SPMD_INIT_CONSTANT, o->initial_accumulator_value});
    spmd_tensor *at = param_in_update(g, o, p);
    grad = add_l2_decay(g, o, grad, at, s);
    spmd_tensor *sum_next = spmd_add(g, sum, spmd_mul(g, grad, grad));
    spmd_status st = update(g, sum, sum_next, who);
    if (st != SPMD_OK) return st;
    spmd_tensor *u = spmd_div(g, grad, spmd_add(g, spmd_sqrt(g, sum_next), s->eps));
    return update(g, p, spmd_sub(g, at, spmd_mul(g, u, s->clr)), who);
}

/* One parameter's update by its group's kind; `grad` clipped already. */
static spmd_status param_update(spmd_graph *g, const spmd_optimizer *o, spmd_tensor *p,
                                spmd_tensor *grad, const shared *s, const char *who)
{
    /* maximize: every kind negates the gradient first, as torch does. */
    if (o->maximize && !(grad = spmd_neg(g, grad))) return builder_failed(g, who);
    switch (o->kind) {
    case SPMD_OPTIMIZER_SGD: return sgd_param(g, o, p, grad, s, who);
    case SPMD_OPTIMIZER_ADAMW:
    case SPMD_OPTIMIZER_ADAM: return adam_param(g, o, p, grad, s, who);
    case SPMD_OPTIMIZER_RMSPROP: return rmsprop_param(g, o, p, grad, s, who);
    case SPMD_OPTIMIZER_ADAGRAD: return adagrad_param(g, o, p, grad, s, who);
    }
    return BASE_INTERNAL("an optimizer kind without its update");
}

/* Group o's scalars but eps (s->lr, wd and clip_scale set): t is this
 * step's count from 1 (NULL without bookkeeping), `one` the scalar 1. */
static spmd_status kind_scalars(spmd_graph *g, const spmd_optimizer *o, shared *s, spmd_tensor *t,
                                spmd_tensor *one, const char *who)
{
    switch (o->kind) {
    case SPMD_OPTIMIZER_SGD:
        /* where(t - 1, 1 - dampening, 1): the first step's buffer is the
         * whole gradient; (1 - dampening) rounded from double, as torch's. */
        if (o->dampening != 0.0f &&
            !(s->damp = spmd_where(g, spmd_sub(g, t, one),
                                   spmd_fill(g, 0, NULL, (float)(1.0 - (double)o->dampening)),
                                   one)))
            return builder_failed(g, who); /* NULL would mean "no dampening" */
        return SPMD_OK;
    case SPMD_OPTIMIZER_ADAMW:
    case SPMD_OPTIMIZER_ADAM:
        if (o->kind == SPMD_OPTIMIZER_ADAMW && o->weight_decay != 0.0f &&
            !(s->decay = spmd_sub(g, one, s->wd ? spmd_mul(g, s->lr, s->wd)
                                                : spmd_scale(g, s->lr, o->weight_decay))))
            return builder_failed(g, who); /* NULL would mean "no decay" */
        s->step_size = spmd_div(g, s->lr, bias_correction(g, t, one, o->beta1));
        s->bc2_sqrt = spmd_sqrt(g, bias_correction(g, t, one, o->beta2));
        return SPMD_OK;
    case SPMD_OPTIMIZER_RMSPROP: return SPMD_OK;
    case SPMD_OPTIMIZER_ADAGRAD:
        s->clr = s->lr;
        if (o->lr_decay != 0.0f)
            s->clr = spmd_div(g, s->lr, spmd_add(g, one, spmd_scale(g, spmd_sub(g, t, one), o->lr_decay)));
        return SPMD_OK;
    }
    return BASE_INTERNAL("an optimizer kind without its scalars");
}

/* Group o's scalars, eps the last (where Adam's always was). */
static spmd_status group_scalars(spmd_graph *g, const spmd_optimizer *o, shared *s, spmd_tensor *t,
                                 spmd_tensor *one, const char *who)
{
    spmd_status st = kind_scalars(g, o, s, t, one, who);
    if (st == SPMD_OK && o->kind != SPMD_OPTIMIZER_SGD && !(s->eps = spmd_fill(g, 0, NULL, o->eps)))
        return builder_failed(g, who);
    return st;
}
/* ---- The whole update -------------------------------------------------------------------- */

/* The gradient the update reads, on a mesh: held in the parameter's
 * sharding (replicated for an unmarked parameter) by a sharding
 * constraint.  Marking the gradient's producer instead (a matmul summing
 * over the batch) makes propagation place that op by the mark first and
 * gather its batch-split operands whole; a constraint of its own leaves
 * the producer its pending sum and resolves it once, into the shard (one
 * reduce-scatter, and an all-reduce over the replica axes).  Unheld,
 * every consumer (the norm, each moment) would resolve the pending sum
 * again. */
static spmd_tensor *held_grad(spmd_graph *g, const spmd_optimizer *o, const spmd_tensor *p,
                              spmd_tensor *grad)
{
    if (!grad || !g->mesh) return grad;
    spmd_tensor *held = ir_sharding_constraint(g, grad);
    sharding mark;
    state_mark(g, o, p, &mark);
    if (held && copy_mark(g, held, &mark) != SPMD_OK) return NULL;
    return held;
}

static bool same_mark(const spmd_tensor *a, const spmd_tensor *b)
{
    if (!a->mark || !b->mark) return !a->mark && !b->mark;
    return sharding_equal(a->mark, b->mark);
}

/* Sum of every gradient's squares, those of equally marked parameters
 * first: their partial sums are pending over the same axes and add up
 * before one all-reduce, where a sum in parameter order would resolve at
 * every change of mark.  `grouped` is scratch, n_params long. */
/* The last pipeline stage a gradient is placed on; -1 without stages. */
static int last_stage(spmd_tensor *const *grads, int n_params)
{
    int last = -1;
    for (int k = 0; k < n_params; k++)
        if (grads[k]->stage > last) last = grads[k]->stage;
    return last;
}

/* The clipping scale on `stage`, computed on the last (squares_total):
 * sent to each other stage once, the copies kept in on[stage]. */
static spmd_tensor *scale_on(spmd_graph *g, spmd_tensor *scale, int last, int stage, spmd_tensor **on)
{
    if (!scale || stage < 0 || stage == last) return scale;
    if (!on[stage]) on[stage] = spmd_stage_transfer(g, scale, last, stage);
    return on[stage];
}

static spmd_tensor *squares_total(spmd_graph *g, spmd_tensor **params, spmd_tensor **grads,
                                  int n_params, bool *grouped)
{
    spmd_tensor *total = NULL;
    memset(grouped, 0, (size_t)n_params * sizeof *grouped);
    /* With pipeline stages each stage sums its own gradients and sends
     * the sum to the last stage, which adds them (docs/DESIGN.md,
     * "Pipeline stages"); without, every stage is -1 and nothing moves. */
    int last = last_stage(grads, n_params);
    for (int k = 0; k < n_params; k++) {
        if (grouped[k]) continue;
        spmd_tensor *alike = NULL;
        for (int j = k; j < n_params; j++) {
            if (grouped[j] || !same_mark(params[j], params[k]) || grads[j]->stage != grads[k]->stage)
                continue;
            grouped[j] = true;
            spmd_tensor *sq = sum_of_squares(g, grads[j]);
            alike = alike ? spmd_add(g, alike, sq) : sq;
        }
        if (alike && grads[k]->stage >= 0 && grads[k]->stage != last)
            alike = spmd_stage_transfer(g, alike, grads[k]->stage, last);
        total = total ? spmd_add(g, total, alike) : alike;
    }
    return total;
}

/* Gradient accumulation: each parameter's gradient is added into its
 * accumulator "<param>.grad_acc", a state in the gradient's own sharding
 * (pending sums included: propagation gives it the gradient's, and it is
 * never resolved), as acc * keep + grad / K, keep being 0 on a step's
 * first micro-batch so the sum starts afresh without a pass to zero it,
 * one fused pass per micro-batch.  Dividing each addend rather than the
 * sum lets the update read the accumulator's new value itself, with no
 * scaled copy beside it.  The sums end the backward pass (what
 * micro-batches run); the update reads them, grads[k].  Only allocation
 * can fail. */
static spmd_status accumulate(spmd_graph *g, plan *pl, const char *who)
{
    const int steps = pl->o[0].accumulate_steps;
    spmd_tensor *keep = spmd_input(g, KEEP_NAME, SPMD_F32, 0, NULL);
    if (!keep) return builder_failed(g, who);
    for (int k = 0; k < pl->n_params; k++) {
        spmd_tensor *p = pl->params[k];
        char name[NAME_SIZE];
        snprintf(name, sizeof name, "%s%s", p->name, ACC_SUFFIX); /* length checked up front */
        spmd_tensor *acc = spmd_state(g, name, p->rank, p->dims, (spmd_init){SPMD_INIT_ZEROS, 0.0f});
        if (!acc) return builder_failed(g, who);
        acc->accumulator = true;
        acc->grad = p->grad;
        int outer = g->stage;
        g->stage = p->grad->stage; /* the sum where the gradient is ("Pipeline stages") */
        spmd_tensor *mean = spmd_add(g, spmd_mul(g, acc, keep), spmd_scale(g, p->grad, 1.0f / (float)steps));
        g->stage = outer;
        spmd_status st = update(g, acc, mean, who);
        if (st != SPMD_OK) return st;
        pl->grads[k] = mean;
    }
    g->backward_end = g->n_nodes;
    g->accumulate_steps = steps;
    g->accumulate_keep = keep;
    return SPMD_OK;
}

/* Append the updates once everything is checked: only allocation can fail. */
static spmd_status append(spmd_graph *g, plan *pl, bool bookkeeping, const char *who,
                          spmd_optimizer_tensors *out, spmd_tensor **lrs)
{
    spmd_status st;
    for (int k = 0; k < pl->n_params; k++) pl->grads[k] = pl->params[k]->grad;
    if (accumulates(&pl->o[0]) && (st = accumulate(g, pl, who)) != SPMD_OK) return st;
    const int outer = g->stage;
    for (int k = 0; k < pl->n_params && bookkeeping; k++) {
        /* Held where the gradient is: squares_total groups by stage. */
        g->stage = pl->grads[k] ? pl->grads[k]->stage : -1;
        pl->grads[k] = held_grad(g, &pl->o[pl->group[k]], pl->params[k], pl->grads[k]);
        g->stage = outer;
        if (!pl->grads[k]) return builder_failed(g, who);
    }

    const spmd_optimizer *o0 = &pl->o[0]; /* the settings every group shares are here too */
    spmd_tensor *one = spmd_fill(g, 0, NULL, 1.0f), *t = NULL, *norm = NULL;
    if (bookkeeping) {
        spmd_tensor *step = spmd_state(g, STEP_NAME, 0, NULL, (spmd_init){SPMD_INIT_ZEROS, 0.0f});
        t = spmd_add(g, step, one); /* this step's count, from 1 */
        if ((st = update(g, step, t, who)) != SPMD_OK) return st;
    }
    if (bookkeeping || o0->clip_norm > 0.0f) {
        /* sqrt of the sum over every parameter (of every group) of
         * sum(g^2): on a mesh each device sums its blocks and the
         * partitioner adds the partials. */
        spmd_tensor *total = squares_total(g, pl->params, pl->grads, pl->n_params, pl->grouped);
        norm = total ? spmd_sqrt(g, total) : spmd_fill(g, 0, NULL, 0.0f);
        if (!norm) return builder_failed(g, who);
        if (bookkeeping && ((st = spmd_tensor_set_name(norm, NORM_NAME)) != SPMD_OK ||
                            (st = spmd_graph_mark_output(g, norm)) != SPMD_OK))
            return st;
    }
    /* A decay fed each step (one group only) multiplies as the constant
     * scales: x * wd. */
    spmd_tensor *wd = NULL, *clip_scale = NULL;
    if (o0->weight_decay_input && o0->weight_decay != 0.0f &&
        !(wd = spmd_input(g, WD_NAME, SPMD_F32, 0, NULL)))
        return builder_failed(g, who);
    if (o0->clip_norm > 0.0f) {
        /* clip_grad_norm_: scale = min(1, clip / (norm + 1e-6)), applied
         * whether or not it is below 1, as torch does. */
        spmd_tensor *guarded = spmd_add(g, norm, spmd_fill(g, 0, NULL, CLIP_EPS));
        clip_scale = min_one(g, spmd_div(g, spmd_fill(g, 0, NULL, o0->clip_norm), guarded));
        if (!clip_scale) return builder_failed(g, who); /* NULL would mean "no clipping" */
    }
    for (int i = 0; i < pl->n_groups; i++) {
        pl->s[i] = (shared){.lr = pl->lr[i], .wd = wd, .clip_scale = clip_scale};
        if ((st = group_scalars(g, &pl->o[i], &pl->s[i], t, one, who)) != SPMD_OK) return st;
    }

    int stages = last_stage(pl->grads, pl->n_params) + 1;
    spmd_tensor **scales = NULL;
    if (clip_scale && stages > 0 &&
        !(scales = base_calloc(&g->alloc, (size_t)stages * sizeof *scales, "clipping per stage")))
        return SPMD_ERR_NOMEM;
    for (int k = 0; k < pl->n_params && st == SPMD_OK; k++) {
        const spmd_optimizer *o = &pl->o[pl->group[k]];
        const shared *s = &pl->s[pl->group[k]];
        spmd_tensor *scale = scales ? scale_on(g, clip_scale, stages - 1, pl->grads[k]->stage, scales) : clip_scale;
        spmd_tensor *grad = scale ? spmd_mul(g, pl->grads[k], scale) : pl->grads[k];
        st = param_update(g, o, pl->params[k], grad, s, who);
    }
    base_free(&g->alloc, scales);
    if (st != SPMD_OK) return st;
    if (out) {
        out->lr = pl->lr[0];
        out->grad_norm = bookkeeping ? norm : NULL;
        out->weight_decay = wd;
    }
    if (lrs)
        for (int i = 0; i < pl->n_groups; i++) lrs[i] = pl->lr[i];
    return SPMD_OK;
}

/* ---- Entry points ------------------------------------------------------------------------ */

/* The plan's arrays for n_params parameters (graph order) and n_groups
 * groups, in one block; NULL with the allocator's message. */
static void *plan_alloc(spmd_graph *g, plan *pl, int n_groups)
{
    memset(pl, 0, sizeof *pl);
    pl->g = g;
    for (int i = 0; i < g->n_nodes; i++) pl->n_params += ir_is_trained(g->nodes[i]);
    pl->n_groups = n_groups;
    size_t np = (size_t)(pl->n_params ? pl->n_params : 1), ng = (size_t)n_groups;
    /* Pointers first, then 4-byte fields, then bytes: each aligned. */
    size_t bytes = np * 2 * sizeof(spmd_tensor *) + ng * sizeof(spmd_tensor *) +
                   ng * sizeof(shared) + ng * sizeof(spmd_optimizer) + np * sizeof(int) +
                   np * sizeof(bool);
    char *block = base_alloc(&g->alloc, bytes, "optimizer parameter list");
    if (!block) return NULL;
    memset(block, 0, bytes);
    pl->params = (spmd_tensor **)block;
    pl->grads = pl->params + np;
    pl->lr = pl->grads + np;
    pl->s = (shared *)(pl->lr + ng);
    pl->o = (spmd_optimizer *)(pl->s + ng);
    pl->group = (int *)(pl->o + ng);
    pl->grouped = (bool *)(pl->group + np);
    for (int i = 0, k = 0; i < g->n_nodes; i++)
        if (ir_is_trained(g->nodes[i])) pl->params[k++] = g->nodes[i];
    return block;
}

/* Each group's settings in force: opt itself without groups, else opt's
 * shared settings with the group's own, each checked under its index. */
static spmd_status resolve_groups(plan *pl, const spmd_optimizer *opt,
                                  const spmd_optimizer_group *groups, const char *who)
{
    if (!groups) return optim_resolve(opt, who, &pl->o[0]);
    spmd_status st = optim_check_shared(opt, who);
    for (int i = 0; i < pl->n_groups && st == SPMD_OK; i++)
        st = optim_resolve_group(opt, &groups[i], i, who, &pl->o[i]);
    return st;
}

/* The update of every parameter: in one group of opt's settings (groups
 * NULL, n_groups 1, lr the caller's or NULL for "lr"), or in `groups`. */
static spmd_status build(spmd_graph *g, const spmd_optimizer *opt,
                         const spmd_optimizer_group *groups, int n_groups, spmd_tensor *lr,
                         bool bookkeeping, const char *who, spmd_optimizer_tensors *out,
                         spmd_tensor **lrs)
{
    if (out) memset(out, 0, sizeof *out);
    if (lrs && n_groups > 0) memset(lrs, 0, (size_t)n_groups * sizeof *lrs);
    if (!g || !opt) return base_error(SPMD_ERR_INVALID, "%s: graph or settings is NULL", who);
    if (!groups && n_groups != 1) return BASE_INTERNAL("no groups means one");
    if (n_groups < 1)
        return base_error(SPMD_ERR_INVALID, "%s: %d parameter groups; at least one is needed",
                          who, n_groups);
    plan pl;
    void *block = plan_alloc(g, &pl, n_groups);
    if (!block) return SPMD_ERR_NOMEM;
    pl.lr[0] = lr;
    char name[LR_NAME_SIZE];
    spmd_status st = resolve_groups(&pl, opt, groups, who);
    for (int i = 0; i < n_groups && st == SPMD_OK && !bookkeeping; i++)
        if (reads_step(&pl.o[i])) st = BASE_INTERNAL("an update that reads the step count without it");
    for (int i = 0; i < n_groups && st == SPMD_OK; i++) {
        lr_name(i, name);
        st = check_lr(g, &pl.lr[i], name, who);
    }
    if (st == SPMD_OK) st = check_graph(g, &pl, groups, bookkeeping, who);
    if (st != SPMD_OK) {
        base_free(&g->alloc, block);
        return st;
    }

    ir_failure outer;
    ir_error_scope_begin(g, &outer);
    for (int i = 0; i < n_groups && st == SPMD_OK; i++) {
        lr_name(i, name);
        if (!pl.lr[i] && !(pl.lr[i] = spmd_input(g, name, SPMD_F32, 0, NULL)))
            st = builder_failed(g, who);
    }
    if (st == SPMD_OK) st = append(g, &pl, bookkeeping, who, out, lrs);
    base_free(&g->alloc, block);
    ir_error_scope_end(g, &outer);
    return st;
}

spmd_status train_optimizer_append(spmd_graph *g, const spmd_optimizer *opt, spmd_tensor *lr,
                                   bool bookkeeping, const char *who,
                                   spmd_optimizer_tensors *out)
{
    return build(g, opt, NULL, 1, lr, bookkeeping, who, out, NULL);
}

spmd_status spmd_optimizer_apply(spmd_graph *g, const spmd_optimizer *opt,
                                 spmd_optimizer_tensors *out)
{
    return train_optimizer_append(g, opt, NULL, true, "optimizer", out);
}

spmd_status spmd_optimizer_apply_groups(spmd_graph *g, const spmd_optimizer *opt,
                                        const spmd_optimizer_group *groups, int n_groups,
                                        spmd_optimizer_tensors *out, spmd_tensor **lrs)
{
    if (!groups) {
        if (out) memset(out, 0, sizeof *out);
        if (lrs && n_groups > 0) memset(lrs, 0, (size_t)n_groups * sizeof *lrs);
        return base_error(SPMD_ERR_INVALID, "optimizer: groups is NULL");
    }
    return build(g, opt, groups, n_groups, NULL, true, "optimizer", out, lrs);
}
/* The Hugging Face / PyTorch warmup-cosine rule (LambdaLR with
 * get_cosine_schedule_with_warmup's factor), decaying to `floor` instead
 * of 0: peak * step / warmup while warming up, so the first step (step 0)
 * is at 0 and step `warmup` at the peak. */
float spmd_lr_schedule(int step, int warmup, int total, float peak, float floor)
{
    if (step < 0) step = 0;
    if (warmup < 0) warmup = 0;
    if (step < warmup) return (float)((double)peak * step / warmup);
    if (step >= total) return floor;
    double progress = (double)(step - warmup) / (double)(total - warmup);
    double cosine = 0.5 * (1.0 + cos(M_PI * progress));
    return (float)((double)floor + ((double)peak - (double)floor) * cosine);
}
