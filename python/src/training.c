/* The Graph's training layer (core.h): optimizers, FSDP's and the batch's
 * marks, and the ready-made models of spmd/models.h. */
#include "core.h"

#include <stddef.h>
#include <string.h>

PyTypeObject *OptimizerTensorsType;

static PyObject *wrap_or_none(GraphObject *g, spmd_tensor *t)
{
    if (!t) Py_RETURN_NONE;
    return wrap_tensor(g, t);
}

static int optimizer_kind_arg(const char *kind, spmd_optimizer_kind *out)
{
    if (!strcmp(kind, "adamw")) *out = SPMD_OPTIMIZER_ADAMW;
    else if (!strcmp(kind, "adam")) *out = SPMD_OPTIMIZER_ADAM;
    else if (!strcmp(kind, "sgd")) *out = SPMD_OPTIMIZER_SGD;
    else if (!strcmp(kind, "rmsprop")) *out = SPMD_OPTIMIZER_RMSPROP;
    else if (!strcmp(kind, "adagrad")) *out = SPMD_OPTIMIZER_ADAGRAD;
    else {
        PyErr_Format(error_type(SPMD_ERR_INVALID),
                     "optimizer kind '%s': 'adamw', 'adam', 'sgd', 'rmsprop' or 'adagrad'", kind);
        return -1;
    }
    return 0;
}

/* The settings a group has of its own besides betas (a pair): the keys of
 * a group's dict, and where each lives in spmd_optimizer_group. */
typedef struct setting_key {
    const char *key;
    bool flag; /* bool, else float */
    size_t in_group;
} setting_key;

#define SETTING_KEY(field, flag) {#field, flag, offsetof(spmd_optimizer_group, field)}
static const setting_key setting_keys[] = {
    SETTING_KEY(weight_decay, false), SETTING_KEY(momentum, false),  SETTING_KEY(eps, false),
    SETTING_KEY(dampening, false),    SETTING_KEY(nesterov, true),   SETTING_KEY(amsgrad, true),
    SETTING_KEY(alpha, false),        SETTING_KEY(centered, true),   SETTING_KEY(lr_decay, false),
    SETTING_KEY(initial_accumulator_value, false), SETTING_KEY(maximize, true),
};
#undef SETTING_KEY
#define N_SETTING_KEYS ((int)(sizeof setting_keys / sizeof setting_keys[0]))

/* Each setting in a group's dict `d` (absent or None keeps the zero, the
 * C API's "default") into `gr`. */
static int setting_values(PyObject *d, spmd_optimizer_group *gr)
{
    for (int i = 0; i < N_SETTING_KEYS; i++) {
        const setting_key *k = &setting_keys[i];
        PyObject *v = PyDict_GetItemString(d, k->key); /* borrowed */
        if (!v || v == Py_None) continue;
        char *at = (char *)gr + k->in_group;
        if (k->flag) {
            int on = PyObject_IsTrue(v);
            if (on < 0) return -1;
            *(bool *)at = on;
        } else {
            *(float *)at = (float)PyFloat_AsDouble(v);
            if (PyErr_Occurred()) return -1;
        }
    }
    return 0;
}

static bool is_setting_key(const char *k)
{
    for (int i = 0; i < N_SETTING_KEYS; i++)
        if (!strcmp(k, setting_keys[i].key)) return true;
    return false;
}

/* Betas and eps left out (None) are 0, the C API's "default"; given ones
 * go through as they are, so SGD refuses them with its own message.  (A
 * group's eps is read with its other settings: eps_o NULL.) */
static int betas_eps_args(PyObject *betas, PyObject *eps_o, float *beta1, float *beta2, float *eps)
{
    if (betas && betas != Py_None) {
        PyObject *pair = PySequence_Tuple(betas);
        int ok = pair && PyArg_ParseTuple(pair, "ff;betas is a pair of floats", beta1, beta2);
        Py_XDECREF(pair);
        if (!ok) return -1;
    }
    if (eps_o && eps_o != Py_None) {
        *eps = (float)PyFloat_AsDouble(eps_o);
        if (PyErr_Occurred()) return -1;
    }
    return 0;
}

/* shard_state=: None (the default, ZeRO on), True or False. */
static int zero_arg(PyObject *o, spmd_zero *zero)
{
    if (o == Py_None) {
        *zero = SPMD_ZERO_DEFAULT;
        return 0;
    }
    int on = PyObject_IsTrue(o);
    if (on < 0) return -1;
    *zero = on ? SPMD_ZERO_ON : SPMD_ZERO_OFF;
    return 0;
}

static PyObject *graph_optimizer_apply(GraphObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"kind",      "momentum",  "weight_decay", "betas",    "eps",
                             "clip_norm", "shard_state", "weight_decay_input", "accumulate_steps",
                             "dampening", "nesterov",  "amsgrad",      "alpha",    "centered",
                             "lr_decay",  "initial_accumulator_value", "maximize", NULL};
    const char *kind = "adamw";
    PyObject *betas = Py_None, *eps_o = Py_None;
    spmd_optimizer opt = {0};
    PyObject *shard = Py_None;
    int wd_input = 0, nesterov = 0, amsgrad = 0, centered = 0, maximize = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|s$ffOOfOpifppfpffp:optimizer_apply", kwlist, &kind,
                                     &opt.momentum, &opt.weight_decay, &betas, &eps_o, &opt.clip_norm,
                                     &shard, &wd_input, &opt.accumulate_steps, &opt.dampening, &nesterov,
                                     &amsgrad, &opt.alpha, &centered, &opt.lr_decay,
                                     &opt.initial_accumulator_value, &maximize) ||
        graph_open(self) < 0 || optimizer_kind_arg(kind, &opt.kind) < 0 ||
        betas_eps_args(betas, eps_o, &opt.beta1, &opt.beta2, &opt.eps) < 0 ||
        zero_arg(shard, &opt.zero) < 0)
        return NULL;
    opt.weight_decay_input = wd_input;
    opt.nesterov = nesterov;
    opt.amsgrad = amsgrad;
    opt.centered = centered;
    opt.maximize = maximize;
    spmd_optimizer_tensors out = {0};
    if (check(spmd_optimizer_apply(self->g, &opt, &out)) < 0) return NULL;
    PyObject *r = PyStructSequence_New(OptimizerTensorsType);
    if (!r) return NULL;
    spmd_tensor *fields[] = {out.lr, out.grad_norm, out.weight_decay};
    for (int i = 0; i < 3; i++) {
        PyObject *t = wrap_or_none(self, fields[i]);
        if (!t) {
            Py_DECREF(r);
            return NULL;
        }
        PyStructSequence_SetItem(r, i, t);
    }
    return r;
}

/* One group's dict ({params: [names], weight_decay, momentum, betas, eps})
 * into `gr`; the names' UTF-8 stays valid while `keep` (a new list of the
 * name strings) lives. */
static int optimizer_group_arg(PyObject *d, int index, spmd_optimizer_group *gr, const char ***names,
                               PyObject **keep)
{
    *names = NULL;
    *keep = NULL;
    if (!PyDict_Check(d)) {
        PyErr_Format(PyExc_TypeError, "groups[%d]: expected a dict, got %s", index, Py_TYPE(d)->tp_name);
        return -1;
    }
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(d, &pos, &key, &value)) {
        const char *k = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
        if (!k || (strcmp(k, "params") && strcmp(k, "betas") && !is_setting_key(k))) {
            if (!PyErr_Occurred())
                PyErr_Format(error_type(SPMD_ERR_INVALID),
                             "groups[%d]: key %R is not one of params, betas, weight_decay, momentum, eps, "
                             "dampening, nesterov, amsgrad, alpha, centered, lr_decay, "
                             "initial_accumulator_value, maximize",
                             index, key);
            return -1;
        }
    }
    PyObject *params = PyDict_GetItemString(d, "params"); /* borrowed */
    if (!params) {
        PyErr_Format(error_type(SPMD_ERR_INVALID),
                     "groups[%d] has no 'params' (a list of parameter names)", index);
        return -1;
    }
    *keep = PySequence_List(params);
    if (!*keep) return -1;
    Py_ssize_t n = PyList_GET_SIZE(*keep);
    if (n > INT_MAX) {
        PyErr_Format(error_type(SPMD_ERR_INVALID), "groups[%d]: too many parameters", index);
        return -1;
    }
    *names = PyMem_Calloc((size_t)(n ? n : 1), sizeof **names);
    if (!*names) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *s = PyList_GET_ITEM(*keep, i);
        (*names)[i] = PyUnicode_Check(s) ? PyUnicode_AsUTF8(s) : NULL;
        if (!(*names)[i]) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_TypeError, "groups[%d]: parameter %zd is a %s, not a name", index, i,
                             Py_TYPE(s)->tp_name);
            return -1;
        }
    }
    *gr = (spmd_optimizer_group){.params = *names, .n_params = (int)n};
    if (setting_values(d, gr) < 0) return -1;
    return betas_eps_args(PyDict_GetItemString(d, "betas"), NULL, &gr->beta1, &gr->beta2, &gr->eps);
}

static PyObject *graph_optimizer_apply_groups(GraphObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"kind", "groups", "clip_norm", "shard_state", "accumulate_steps", NULL};
    const char *kind = "adamw";
    PyObject *groups_o;
    spmd_optimizer opt = {0};
    PyObject *shard = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sO|$fOi:optimizer_apply_groups", kwlist, &kind, &groups_o,
                                     &opt.clip_norm, &shard, &opt.accumulate_steps) ||
        graph_open(self) < 0 || optimizer_kind_arg(kind, &opt.kind) < 0 || zero_arg(shard, &opt.zero) < 0)
        return NULL;
    PyObject *groups = PySequence_Tuple(groups_o);
    if (!groups) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(groups);
    if (n < 1 || n > INT_MAX) {
        Py_DECREF(groups);
        PyErr_SetString(error_type(SPMD_ERR_INVALID),
                        "optimizer_apply_groups: groups must hold at least one group");
        return NULL;
    }
    spmd_optimizer_group *gr = PyMem_Calloc((size_t)n, sizeof *gr);
    const char ***names = PyMem_Calloc((size_t)n, sizeof *names);
    PyObject **keep = PyMem_Calloc((size_t)n, sizeof *keep);
    spmd_tensor **lrs = PyMem_Calloc((size_t)n, sizeof *lrs);
    PyObject *r = NULL;
    if (!gr || !names || !keep || !lrs) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (optimizer_group_arg(PyTuple_GET_ITEM(groups, i), (int)i, &gr[i], &names[i], &keep[i]) < 0) goto done;
    if (check(spmd_optimizer_apply_groups(self->g, &opt, gr, (int)n, NULL, lrs)) < 0) goto done;
    r = PyList_New(n);
    for (Py_ssize_t i = 0; r && i < n; i++) {
        PyObject *t = wrap_tensor(self, lrs[i]);
        if (!t) Py_CLEAR(r);
        else PyList_SET_ITEM(r, i, t);
    }
done:
    for (Py_ssize_t i = 0; names && keep && i < n; i++) {
        PyMem_Free(names[i]);
        Py_XDECREF(keep[i]);
    }
    PyMem_Free(gr);
    PyMem_Free(names);
    PyMem_Free(keep);
    PyMem_Free(lrs);
    Py_DECREF(groups);
    return r;
}

static PyObject *graph_sgd(GraphObject *self, PyObject *lr_o)
{
    spmd_tensor *lr;
    if (tensor_arg(self, lr_o, &lr, true) < 0) return NULL;
    RETURN_STATUS(spmd_sgd(self->g, lr));
}

typedef spmd_status (*batch_fn)(spmd_graph *, const spmd_mesh *, const char *, spmd_tensor *const *, int,
                                const char *);

static spmd_status shard_batch_as_wrap(spmd_graph *g, const spmd_mesh *m, const char *axis,
                                       spmd_tensor *const *inputs, int n, const char *data_axes)
{
    (void)axis;
    return spmd_shard_batch(g, m, inputs, n, data_axes);
}

/* fsdp_wrap(mesh, axis="fsdp", inputs=(), data_axes=None) and
 * shard_batch(mesh, inputs, data_axes=None). */
static PyObject *graph_batch_marks(GraphObject *self, PyObject *mesh_o, const char *axis, PyObject *inputs_o,
                                   PyObject *data_o, batch_fn f)
{
    MeshObject *mesh;
    spmd_tensor **inputs = NULL;
    int n = 0;
    const char *data;
    PyObject *keep;
    if (graph_open(self) < 0 || mesh_arg(mesh_o, &mesh) < 0 || tensor_list(self, inputs_o, &inputs, &n) < 0)
        return NULL;
    if (axes_text(data_o, &data, &keep) < 0) {
        PyMem_Free(inputs);
        return NULL;
    }
    spmd_status st = f(self->g, mesh->m, axis, inputs, n, data);
    PyMem_Free(inputs);
    Py_XDECREF(keep);
    if (check(st) < 0 || graph_keep_mesh(self, mesh) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *graph_fsdp_wrap(GraphObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"mesh", "axis", "inputs", "data_axes", NULL};
    PyObject *mesh, *inputs = NULL, *data = Py_None;
    const char *axis = "fsdp";
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|sOO:fsdp_wrap", kwlist, &mesh, &axis, &inputs, &data))
        return NULL;
    PyObject *none = inputs ? NULL : PyTuple_New(0);
    PyObject *r = graph_batch_marks(self, mesh, axis, inputs ? inputs : none, data, spmd_fsdp_wrap);
    Py_XDECREF(none);
    return r;
}

static PyObject *graph_shard_batch(GraphObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"mesh", "inputs", "data_axes", NULL};
    PyObject *mesh, *inputs, *data = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|O:shard_batch", kwlist, &mesh, &inputs, &data)) return NULL;
    return graph_batch_marks(self, mesh, NULL, inputs, data, shard_batch_as_wrap);
}

/* The ready-made models of spmd/models.h, for comparisons with a model
 * built here: each returns a dict of its tensors. */
static PyObject *graph_mlp(GraphObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"in_dim", "hidden", "layers", "out_dim", "batch", "x", "loss", NULL};
    spmd_mlp_config cfg;
    int batch = 0;
    PyObject *x_o = Py_None;
    const char *loss = NULL;
    spmd_tensor *x;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iiii|i$Oz:mlp", kwlist, &cfg.in_dim, &cfg.hidden, &cfg.layers,
                                     &cfg.out_dim, &batch, &x_o, &loss) ||
        tensor_arg(self, x_o, &x, true) < 0)
        return NULL;
    spmd_mlp_tensors t;
    if (check(spmd_mlp_build(self->g, &cfg, x, batch, &t)) < 0) return NULL;
    if (loss) {
        spmd_mlp_loss_kind k;
        if (!strcmp(loss, "mse")) k = SPMD_MLP_MSE;
        else if (!strcmp(loss, "cross_entropy")) k = SPMD_MLP_CROSS_ENTROPY;
        else {
            PyErr_Format(error_type(SPMD_ERR_INVALID), "mlp loss '%s': 'mse' or 'cross_entropy'", loss);
            return NULL;
        }
        if (check(spmd_mlp_add_loss(self->g, k, &t)) < 0) return NULL;
    }
    PyObject *in = wrap_or_none(self, t.input), *out = wrap_or_none(self, t.output),
             *tg = wrap_or_none(self, t.targets), *ls = wrap_or_none(self, t.loss);
    PyObject *d = in && out && tg && ls
                      ? Py_BuildValue("{sOsOsOsO}", "input", in, "output", out, "targets", tg, "loss", ls)
                      : NULL;
    Py_XDECREF(in);
    Py_XDECREF(out);
    Py_XDECREF(tg);
    Py_XDECREF(ls);
    return d;
}

static PyObject *graph_gpt(GraphObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"vocab", "seq", "layers", "heads", "dim", "batch", "context",
                             "experts", "top_k", "capacity_factor", NULL};
    spmd_gpt_config cfg = {.top_k = 2, .capacity_factor = 1.25f};
    int batch;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iiiiii|iiif:gpt", kwlist, &cfg.vocab, &cfg.seq, &cfg.layers,
                                     &cfg.heads, &cfg.dim, &batch, &cfg.context, &cfg.experts, &cfg.top_k,
                                     &cfg.capacity_factor) ||
        graph_open(self) < 0)
        return NULL;
    spmd_gpt_tensors t;
    if (check(spmd_gpt_build(self->g, &cfg, batch, &t)) < 0) return NULL;
    PyObject *o[4] = {wrap_tensor(self, t.input), wrap_tensor(self, t.targets), wrap_tensor(self, t.logits),
                      wrap_tensor(self, t.loss)};
    PyObject *d = o[0] && o[1] && o[2] && o[3] ? Py_BuildValue("{sOsOsOsO}", "input", o[0], "targets", o[1],
                                                               "logits", o[2], "loss", o[3])
                                               : NULL;
    for (int i = 0; i < 4; i++) Py_XDECREF(o[i]);
    /* With experts: the load-balancing loss and the dropped count too. */
    const char *names[2] = {"aux_loss", "dropped"};
    spmd_tensor *moe[2] = {t.aux_loss, t.dropped};
    for (int i = 0; i < 2 && d && moe[i]; i++) {
        PyObject *v = wrap_tensor(self, moe[i]);
        if (!v || PyDict_SetItemString(d, names[i], v) < 0) Py_CLEAR(d);
        Py_XDECREF(v);
    }
    return d;
}

PyMethodDef graph_training_methods[] = {
    {"optimizer_apply", KW(graph_optimizer_apply),
     "optimizer_apply(kind='adamw' (or 'adam', 'sgd', 'rmsprop', 'adagrad'), *, weight_decay=0,\n"
     "momentum=0, betas=None, eps=None, dampening=0, nesterov=False, amsgrad=False, alpha=0,\n"
     "centered=False, lr_decay=0, initial_accumulator_value=0, maximize=False, clip_norm=0,\n"
     "shard_state=None, weight_decay_input=False, accumulate_steps=0)\n"
     "-> (lr, grad_norm, weight_decay); each setting as spmd_optimizer's (0 or None: the kind's\n"
     "default); shard_state None or True: ZeRO (the default), False: off"},
    {"optimizer_apply_groups", KW(graph_optimizer_apply_groups),
     "optimizer_apply_groups(kind, groups, *, clip_norm=0, shard_state=None, accumulate_steps=0)\n"
     "-> each group's lr input:\n"
     "groups a list of dicts {params: [names], and any of optimizer_apply's settings: weight_decay,\n"
     "momentum, betas, eps, dampening, nesterov, amsgrad, alpha, centered, lr_decay,\n"
     "initial_accumulator_value, maximize}; group i's lr is the input 'lr' (i = 0) or 'lr.<i>';\n"
     "shard_state None or True: ZeRO (the default), False: off"},
    {"sgd", FN(graph_sgd), METH_O, "sgd(lr): plain SGD with lr an f32 scalar input"},
    {"fsdp_wrap", KW(graph_fsdp_wrap),
     "fsdp_wrap(mesh, axis='fsdp', inputs=(), data_axes=None): FSDPv2's marks"},
    {"shard_batch", KW(graph_shard_batch), "shard_batch(mesh, inputs, data_axes=None): split the batch dim"},
    {"mlp", KW(graph_mlp),
     "mlp(in_dim, hidden, layers, out_dim, batch=0, *, x=None, loss=None) -> dict of tensors\n"
     "(spmd_mlp_build; loss 'mse' or 'cross_entropy' adds the targets and the loss)"},
    {"gpt", KW(graph_gpt),
     "gpt(vocab, seq, layers, heads, dim, batch, context=0, experts=0, top_k=2,\n"
     "capacity_factor=1.25) -> dict of tensors (with experts: aux_loss and dropped too)"},
    {NULL}};

static PyStructSequence_Field optimizer_fields[] = {
    {"lr", "the f32 scalar input 'lr', fed each step"},
    {"grad_norm", "the global gradient norm before clipping, an output"},
    {"weight_decay", "the input 'weight_decay' (weight_decay_input), else None"},
    {NULL, NULL}};

static PyStructSequence_Desc optimizer_desc = {"libspmd._core.OptimizerTensors",
                                               "The tensors optimizer_apply adds.", optimizer_fields, 3};

int training_register(PyObject *mod)
{
    OptimizerTensorsType = PyStructSequence_NewType(&optimizer_desc);
    if (!OptimizerTensorsType) return -1;
    return PyModule_AddObjectRef(mod, "OptimizerTensors", (PyObject *)OptimizerTensorsType);
}
