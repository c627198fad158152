/*
 * The optimizer's settings (spmd/train.h): which kinds take which, their
 * ranges, each kind's defaults for its zeros, and a group's own settings
 * over the shared ones.  One table says which kinds take each setting and
 * where it lives in spmd_optimizer and spmd_optimizer_group, so the
 * checks, the messages and the groups' copies cannot drift apart.
 */
#include "train/optim_impl.h"

#include "base/error.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#define MAX_ACCUMULATE (1 << 20)
#define ADAM_BETA1 0.9f
#define ADAM_BETA2 0.999f
#define ADAM_EPS 1e-8f
#define RMSPROP_ALPHA 0.99f
#define RMSPROP_EPS 1e-8f
#define ADAGRAD_EPS 1e-10f

#define KIND_BIT(k) (1u << (k))
#define KINDS_ADAM (KIND_BIT(SPMD_OPTIMIZER_ADAM) | KIND_BIT(SPMD_OPTIMIZER_ADAMW))
#define KINDS_ALL 0x1fu
#define N_KINDS 5

static const char *const kind_names[N_KINDS] = {"SGD", "AdamW", "Adam", "RMSprop", "Adagrad"};

/* Which kinds take each setting, and where it lives in spmd_optimizer
 * and in spmd_optimizer_group (all of them are a group's own): the one
 * table the checks, the messages and the groups' copies read. */
typedef struct setting {
    const char *name;
    size_t in_opt, in_group;
    bool flag; /* bool, else float */
    unsigned kinds;
} setting;

#define SETTING(field, flag, kinds)                                                                 \
    {#field, offsetof(spmd_optimizer, field), offsetof(spmd_optimizer_group, field), flag, kinds}
static const setting settings[] = {
    SETTING(weight_decay, false, KINDS_ALL),
    SETTING(momentum, false, KIND_BIT(SPMD_OPTIMIZER_SGD) | KIND_BIT(SPMD_OPTIMIZER_RMSPROP)),
    SETTING(dampening, false, KIND_BIT(SPMD_OPTIMIZER_SGD)),
    SETTING(nesterov, true, KIND_BIT(SPMD_OPTIMIZER_SGD)),
    SETTING(beta1, false, KINDS_ADAM),
    SETTING(beta2, false, KINDS_ADAM),
    SETTING(amsgrad, true, KINDS_ADAM),
    SETTING(eps, false, KINDS_ALL & ~KIND_BIT(SPMD_OPTIMIZER_SGD)),
    SETTING(alpha, false, KIND_BIT(SPMD_OPTIMIZER_RMSPROP)),
    SETTING(centered, true, KIND_BIT(SPMD_OPTIMIZER_RMSPROP)),
    SETTING(lr_decay, false, KIND_BIT(SPMD_OPTIMIZER_ADAGRAD)),
    SETTING(initial_accumulator_value, false, KIND_BIT(SPMD_OPTIMIZER_ADAGRAD)),
    SETTING(maximize, true, KINDS_ALL),
};
#undef SETTING
#define N_SETTINGS ((int)(sizeof settings / sizeof settings[0]))

/* Setting i, at `offset` in its struct (an spmd_optimizer or a group), is
 * not 0 (false). */
static bool is_set(const void *at, size_t offset, int i)
{
    const char *p = (const char *)at + offset;
    return settings[i].flag ? *(const bool *)p : *(const float *)p != 0.0f;
}

/* "A, B and C" for the names of `bits` (kinds, or settings when
 * `of_settings`). */
static const char *name_list(unsigned bits, bool of_settings, char *buf, size_t size)
{
    int n = 0, total = 0, count = of_settings ? N_SETTINGS : N_KINDS;
    for (int i = 0; i < count; i++) total += bits >> i & 1u;
    buf[0] = '\0';
    for (int i = 0; i < count; i++) {
        if (!(bits >> i & 1u)) continue;
        size_t used = strlen(buf);
        snprintf(buf + used, size - used, "%s%s", n == 0 ? "" : n + 1 == total ? " and " : ", ",
                 of_settings ? settings[i].name : kind_names[i]);
        n++;
    }
    return buf;
}

/* A setting the kind does not take: refused, as most likely a mistaken
 * kind (a setting silently ignored would train something else). */
static spmd_status check_kind_settings(const spmd_optimizer *opt, const char *who)
{
    for (int i = 0; i < N_SETTINGS; i++) {
        if (!is_set(opt, settings[i].in_opt, i) || (settings[i].kinds & KIND_BIT(opt->kind))) continue;
        unsigned takes = 0;
        for (int j = 0; j < N_SETTINGS; j++)
            if (settings[j].kinds & KIND_BIT(opt->kind)) takes |= 1u << j;
        char kinds[96], names[256];
        return base_error(SPMD_ERR_INVALID, "%s: %s is a setting of %s; %s takes %s", who,
                          settings[i].name, name_list(settings[i].kinds, false, kinds, sizeof kinds),
                          kind_names[opt->kind], name_list(takes, true, names, sizeof names));
    }
    return SPMD_OK;
}

static bool nonneg(float x) { return x >= 0.0f && isfinite(x); }

static spmd_status check_nonneg(float x, const char *name, const char *who)
{
    if (nonneg(x)) return SPMD_OK;
    return base_error(SPMD_ERR_INVALID, "%s: %s %g must be finite and >= 0", who, name, (double)x);
}

/* eps in force: the kind's default for 0. */
static spmd_status resolve_eps(const spmd_optimizer *opt, float default_eps, spmd_optimizer *r,
                               const char *who)
{
    r->eps = opt->eps == 0.0f ? default_eps : opt->eps;
    if (r->eps > 0.0f && isfinite(r->eps)) return SPMD_OK;
    return base_error(SPMD_ERR_INVALID, "%s: %s eps %g must be finite and > 0 (0 means %g)", who,
                      kind_names[opt->kind], (double)opt->eps, (double)default_eps);
}

static spmd_status resolve_sgd(const spmd_optimizer *opt, const char *who)
{
    spmd_status st = check_nonneg(opt->momentum, "SGD momentum", who);
    if (st == SPMD_OK) st = check_nonneg(opt->dampening, "SGD dampening", who);
    if (st != SPMD_OK) return st;
    if (opt->dampening != 0.0f && opt->momentum == 0.0f)
        return base_error(SPMD_ERR_INVALID,
                          "%s: SGD dampening %g without momentum: dampening scales what "
                          "momentum's buffer adds (torch ignores it without momentum)", who,
                          (double)opt->dampening);
    if (opt->nesterov && (opt->momentum == 0.0f || opt->dampening != 0.0f))
        return base_error(SPMD_ERR_INVALID,
                          "%s: SGD's Nesterov momentum needs a momentum and zero dampening "
                          "(momentum %g, dampening %g), as torch.optim.SGD requires", who,
                          (double)opt->momentum, (double)opt->dampening);
    return SPMD_OK;
}

static spmd_status resolve_adam(const spmd_optimizer *opt, spmd_optimizer *r, const char *who)
{
    const char *kind = kind_names[opt->kind];
    if (opt->beta1 == 0.0f && opt->beta2 == 0.0f) {
        r->beta1 = ADAM_BETA1;
        r->beta2 = ADAM_BETA2;
    }
    if (!(r->beta1 >= 0.0f && r->beta1 < 1.0f))
        return base_error(SPMD_ERR_INVALID, "%s: %s beta1 %g is outside [0, 1)", who, kind,
                          (double)r->beta1);
    if (!(r->beta2 >= 0.0f && r->beta2 < 1.0f))
        return base_error(SPMD_ERR_INVALID, "%s: %s beta2 %g is outside [0, 1)", who, kind,
                          (double)r->beta2);
    return resolve_eps(opt, ADAM_EPS, r, who);
}

static spmd_status resolve_rmsprop(const spmd_optimizer *opt, spmd_optimizer *r, const char *who)
{
    spmd_status st = check_nonneg(opt->momentum, "RMSprop momentum", who);
    if (st != SPMD_OK) return st;
    r->alpha = opt->alpha == 0.0f ? RMSPROP_ALPHA : opt->alpha;
    if (!(r->alpha >= 0.0f && r->alpha <= 1.0f))
        return base_error(SPMD_ERR_INVALID, "%s: RMSprop alpha %g is outside [0, 1] (0 means %g)",
                          who, (double)opt->alpha, (double)RMSPROP_ALPHA);
    return resolve_eps(opt, RMSPROP_EPS, r, who);
}

static spmd_status resolve_adagrad(const spmd_optimizer *opt, spmd_optimizer *r, const char *who)
{
    spmd_status st = check_nonneg(opt->lr_decay, "Adagrad lr_decay", who);
    if (st == SPMD_OK)
        st = check_nonneg(opt->initial_accumulator_value, "Adagrad initial_accumulator_value", who);
    return st != SPMD_OK ? st : resolve_eps(opt, ADAGRAD_EPS, r, who);
}

/* Check `opt` and fill `r` with the settings in force (defaults in). */
spmd_status optim_resolve(const spmd_optimizer *opt, const char *who, spmd_optimizer *r)
{
    *r = *opt;
    if ((unsigned)opt->kind >= N_KINDS)
        return base_error(SPMD_ERR_INVALID, "%s: unknown optimizer kind %d", who, (int)opt->kind);
    spmd_status st = check_nonneg(opt->weight_decay, "weight_decay", who);
    if (st != SPMD_OK) return st;
    if (opt->accumulate_steps < 0 || opt->accumulate_steps > MAX_ACCUMULATE)
        return base_error(SPMD_ERR_INVALID,
                          "%s: accumulate_steps %d is outside 0 .. %d (0 or 1: no accumulation)",
                          who, opt->accumulate_steps, MAX_ACCUMULATE);
    if ((unsigned)opt->zero > SPMD_ZERO_OFF)
        return base_error(SPMD_ERR_INVALID,
                          "%s: zero %d is not SPMD_ZERO_DEFAULT, SPMD_ZERO_ON or SPMD_ZERO_OFF", who,
                          (int)opt->zero);
    if (!nonneg(opt->clip_norm))
        return base_error(SPMD_ERR_INVALID,
                          "%s: clip_norm %g must be finite and >= 0 (0 turns clipping off)", who,
                          (double)opt->clip_norm);
    if ((st = check_kind_settings(opt, who)) != SPMD_OK) return st;
    switch (opt->kind) {
    case SPMD_OPTIMIZER_SGD: return resolve_sgd(opt, who);
    case SPMD_OPTIMIZER_ADAMW:
    case SPMD_OPTIMIZER_ADAM: return resolve_adam(opt, r, who);
    case SPMD_OPTIMIZER_RMSPROP: return resolve_rmsprop(opt, r, who);
    case SPMD_OPTIMIZER_ADAGRAD: return resolve_adagrad(opt, r, who);
    }
    return BASE_INTERNAL("an optimizer kind without its checks");
}

spmd_status optim_check_shared(const spmd_optimizer *opt, const char *who)
{
    for (int k = 0; k < N_SETTINGS; k++)
        if (is_set(opt, settings[k].in_opt, k))
            return base_error(SPMD_ERR_INVALID,
                              "%s: with groups, %s is each group's own: set it in "
                              "spmd_optimizer_group, not in the shared settings", who,
                              settings[k].name);
    if (opt->weight_decay_input)
        return base_error(SPMD_ERR_INVALID,
                          "%s: weight_decay_input is for spmd_optimizer_apply's single group",
                          who);
    return SPMD_OK;
}

spmd_status optim_resolve_group(const spmd_optimizer *opt, const spmd_optimizer_group *group,
                                int index, const char *who, spmd_optimizer *r)
{
    spmd_optimizer own = *opt;
    for (int k = 0; k < N_SETTINGS; k++)
        memcpy((char *)&own + settings[k].in_opt, (const char *)group + settings[k].in_group,
               settings[k].flag ? sizeof(bool) : sizeof(float));
    char gwho[64];
    snprintf(gwho, sizeof gwho, "%s: group %d", who, index);
    return optim_resolve(&own, gwho, r);
}
