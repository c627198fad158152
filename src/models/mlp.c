/*
 * Multilayer perceptron as a graph builder: Linear layers in PyTorch's
 * [out, in] layout with GELU between, plus an MSE or cross-entropy head.
 * The smallest complete model; tests and examples start here.
 */
#include "spmd/models.h"

#include "base/error.h"
#include "ir/ir.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static int64_t layer_in(const spmd_mlp_config *cfg, int i)
{
    return i == 0 ? cfg->in_dim : cfg->hidden;
}

static int64_t layer_out(const spmd_mlp_config *cfg, int i)
{
    return i == cfg->layers ? cfg->out_dim : cfg->hidden;
}

spmd_status spmd_mlp_validate(const spmd_mlp_config *cfg)
{
    if (!cfg)
        return base_error(SPMD_ERR_INVALID, "mlp: config is NULL");
    if (cfg->in_dim <= 0 || cfg->out_dim <= 0)
        return base_error(SPMD_ERR_INVALID, "mlp: in_dim (%d) and out_dim (%d) must be positive",
                          cfg->in_dim, cfg->out_dim);
    if (cfg->layers < 0)
        return base_error(SPMD_ERR_INVALID, "mlp: layers (%d) must not be negative", cfg->layers);
    if (cfg->layers > 0 && cfg->hidden <= 0)
        return base_error(SPMD_ERR_INVALID, "mlp: hidden (%d) must be positive when layers > 0",
                          cfg->hidden);
    return SPMD_OK;
}

int64_t spmd_mlp_param_count(const spmd_mlp_config *cfg)
{
    if (spmd_mlp_validate(cfg) != SPMD_OK)
        return -1;
    int64_t n = 0;
    for (int i = 0; i <= cfg->layers; i++)
        n += layer_out(cfg, i) * layer_in(cfg, i) + layer_out(cfg, i);
    return n;
}

/* A graph op returned NULL: the failure it recorded on g, this build's own
 * in the caller's error scope, raised again so the message goes with it. */
static spmd_status build_failed(const spmd_graph *g)
{
    if (ir_graph_status(g) == SPMD_OK)
        return base_error(SPMD_ERR_INTERNAL, "mlp: a graph op failed without a message");
    return ir_error_raise(g);
}

/* y = x W^T + b, W [out, in] as nn.Linear stores it. */
static spmd_tensor *linear(spmd_graph *g, spmd_tensor *x, int i, int64_t in, int64_t out)
{
    char name[48];
    /* nn.Linear's default weight init is uniform with bound 1/sqrt(fan_in). */
    spmd_init w_init = {SPMD_INIT_UNIFORM, (float)(1.0 / sqrt((double)in))};
    spmd_init b_init = {SPMD_INIT_ZEROS, 0.0f};

    snprintf(name, sizeof name, "fc.%d.weight", i);
    spmd_tensor *w = spmd_param(g, name, 2, (const int64_t[]){out, in}, w_init);
    snprintf(name, sizeof name, "fc.%d.bias", i);
    spmd_tensor *b = spmd_param(g, name, 1, (const int64_t[]){out}, b_init);
    return spmd_add(g, spmd_matmul(g, x, w, false, true), b); // [B, out]
}

spmd_status spmd_mlp_build(spmd_graph *g, const spmd_mlp_config *cfg, spmd_tensor *x, int batch,
                           spmd_mlp_tensors *out)
{
    if (!out)
        return base_error(SPMD_ERR_INVALID, "mlp: output struct is NULL");
    memset(out, 0, sizeof *out);
    if (!g)
        return base_error(SPMD_ERR_INVALID, "mlp: graph is NULL");
    spmd_status st = spmd_mlp_validate(cfg);
    if (st != SPMD_OK)
        return st;

    if (x) {
        if (spmd_tensor_dtype(x) != SPMD_F32 || spmd_tensor_rank(x) != 2 ||
            spmd_tensor_dim(x, 1) != cfg->in_dim)
            return base_error(SPMD_ERR_SHAPE, "mlp: input must be f32 [B, %d]", cfg->in_dim);
    } else if (batch <= 0) {
        return base_error(SPMD_ERR_INVALID, "mlp: batch (%d) must be positive", batch);
    }

    ir_failure outer;
    ir_error_scope_begin(g, &outer);
    if (!x)
        x = spmd_input(g, "input", SPMD_F32, 2, (const int64_t[]){batch, cfg->in_dim});
    spmd_tensor *h = x; // [B, in_dim]
    for (int i = 0; i <= cfg->layers; i++) {
        h = linear(g, h, i, layer_in(cfg, i), layer_out(cfg, i));
        if (i < cfg->layers)
            h = spmd_gelu(g, h);
    }
    st = h ? SPMD_OK : build_failed(g);
    ir_error_scope_end(g, &outer);
    if (st != SPMD_OK)
        return st;
    out->input = x;
    out->output = h; // [B, out_dim]
    return SPMD_OK;
}

spmd_status spmd_mlp_add_loss(spmd_graph *g, spmd_mlp_loss_kind kind, spmd_mlp_tensors *t)
{
    if (!g || !t || !t->output)
        return base_error(SPMD_ERR_INVALID, "mlp loss: graph, tensors or output is NULL");
    if (spmd_tensor_rank(t->output) != 2)
        return base_error(SPMD_ERR_SHAPE, "mlp loss: output must be [B, out_dim]");
    if (kind != SPMD_MLP_MSE && kind != SPMD_MLP_CROSS_ENTROPY)
        return base_error(SPMD_ERR_INVALID, "mlp loss: unknown loss kind %d", (int)kind);
    int64_t batch = spmd_tensor_dim(t->output, 0);
    int64_t classes = spmd_tensor_dim(t->output, 1);

    ir_failure outer;
    ir_error_scope_begin(g, &outer);
    spmd_tensor *targets, *loss;
    if (kind == SPMD_MLP_MSE) {
        targets = spmd_input(g, "targets", SPMD_F32, 2, (const int64_t[]){batch, classes});
        loss = spmd_mse(g, t->output, targets);
    } else {
        targets = spmd_input(g, "targets", SPMD_I32, 1, (const int64_t[]){batch});
        loss = spmd_cross_entropy(g, t->output, targets);
    }
    spmd_status st = loss ? SPMD_OK : build_failed(g);
    ir_error_scope_end(g, &outer);
    if (st != SPMD_OK)
        return st;
    t->targets = targets;
    t->loss = loss;
    return SPMD_OK;
}
