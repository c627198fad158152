/*
 * The model of `spmd train`, `explain` and `sample`: data, mesh, graphs,
 * marks (--shard, --tp, FSDP), gradient and optimizer, compiled with the
 * flags' BLAS and thread choices, and the memory check before a run.
 */
#include "model.h"

#include "copies.h"
#include "message.h"
#include "processes.h"
#include "test_hooks.h"

#include <fnmatch.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* ---- Marks ------------------------------------------------------------------ */

/* Entries of a spec: top-level commas + 1 ("" has none).  A rule applies
 * to the matching tensors of that rank, so '*.weight=fsdp,None' shards the
 * matrices and leaves the LayerNorm vectors alone. */
static int spec_entries(const char *spec)
{
    int depth = 0, n = 0;
    bool any = false;
    for (const char *c = spec; *c && *c != '|'; c++) {
        if (*c == '(') depth++;
        else if (*c == ')') depth--;
        else if (*c == ',' && depth == 0) n++;
        if (*c != ' ') any = true;
    }
    return any ? n + 1 : 0;
}

/* The column of an empty top-level entry of a spec (a comma first, last or
 * after another: "fsdp,None,"), or 0.  Counted as an entry it would make
 * the rule fit no tensor, which would hide the typing error. */
static int spec_empty_entry(const char *spec)
{
    bool seen = false; /* something in the current entry */
    int depth = 0, column = 0;
    const char *c = spec;
    for (; *c && *c != '|'; c++) {
        if (*c == '(') depth++;
        else if (*c == ')') depth--;
        if (*c == ',' && depth == 0) {
            if (!seen) return (int)(c - spec) + 1;
            seen = false;
            column = (int)(c - spec) + 2;
        } else if (*c != ' ') {
            seen = true;
        }
    }
    return column && !seen ? column : 0;
}

static bool rule_fits(const cli_shard *r, const spmd_tensor *t)
{
    const char *name = spmd_tensor_name(t);
    return name && fnmatch(r->pattern, name, 0) == 0 && spec_entries(r->spec) == spmd_tensor_rank(t);
}

static int mark_stage_inputs(spmd_mesh *mesh, cli_graph *c);

int model_apply_marks(const cli_opts *o, spmd_mesh *mesh, cli_graph *c)
{
    for (int r = 0; r < o->n_shards; r++) {
        int column = spec_empty_entry(o->shards[r].spec);
        if (column)
            return cli_fail("--shard '%s=%s': the spec has an empty entry at column %d (a "
                            "comma too many)", o->shards[r].pattern, o->shards[r].spec, column);
    }
    for (int i = 0; i < spmd_graph_tensor_count(c->g); i++) {
        spmd_tensor *t = spmd_graph_tensor(c->g, i);
        int rule = -1;
        for (int r = 0; r < o->n_shards; r++)
            if (rule_fits(&o->shards[r], t)) rule = r;
        if (rule >= 0 && spmd_mark_sharding(c->g, t, mesh, o->shards[rule].spec) != SPMD_OK)
            return cli_fail("--shard '%s=%s'%s%s: %s", o->shards[rule].pattern, o->shards[rule].spec,
                            o->pp ? " with --pp " : "", o->pp ? o->pp : "", spmd_last_error());
    }
    for (int r = 0; r < o->n_shards; r++) {
        bool any = false;
        for (int i = 0; i < spmd_graph_tensor_count(c->g) && !any; i++)
            any = rule_fits(&o->shards[r], spmd_graph_tensor(c->g, i));
        if (!any)
            return cli_fail("--shard '%s=%s' fits no tensor: no name matches with a rank of %d",
                            o->shards[r].pattern, o->shards[r].spec, spec_entries(o->shards[r].spec));
    }
    const char *fsdp = o->fsdp;
    if (!fsdp) { /* FSDPv2's convention: the axis named fsdp, if any */
        fsdp = "none";
        for (int a = 0; a < spmd_mesh_rank(mesh); a++)
            if (!strcmp(spmd_mesh_axis_name(mesh, a), "fsdp") && a != spmd_mesh_stage_axis(mesh))
                fsdp = "fsdp";
    }
    spmd_tensor *inputs[2] = {c->input, c->targets};
    int n = c->targets ? 2 : 1;
    spmd_status st;
    spmd_gpt_parallel how = {o->tp, strcmp(fsdp, "none") ? fsdp : NULL, NULL, o->sp, o->cp};
    /* Stages: the micro-batches' samples over the other axes (the tensor
     * axis's splits inside each stage, with --tp), then FSDP for the
     * parameters (each stage's over the axis, inside the stage). */
    if (spmd_mesh_stage_axis(mesh) >= 0 && spmd_tensor_rank(c->input) == 3) {
        int rc = 0;
        if (o->tp) {
            if (spmd_gpt_shard_tensor_parallel(c->g, &o->gpt, mesh, &how) != SPMD_OK)
                rc = cli_fail("--tp %s: %s", o->tp, spmd_last_error());
        } else {
            rc = mark_stage_inputs(mesh, c);
        }
        if (!rc && strcmp(fsdp, "none") && spmd_fsdp_wrap(c->g, mesh, fsdp, NULL, 0, NULL) != SPMD_OK)
            rc = cli_fail("sharding with --fsdp %s: %s", fsdp, spmd_last_error());
        return rc;
    }
    /* Expert parallelism marks the experts and the tokens between them,
     * context and tensor parallelism the inputs' sequence and batch (off
     * their axes), and tensor parallelism its weights, first; FSDP then
     * splits the other parameters. */
    if (o->ep) {
        if (strcmp(o->model, "gpt") || o->gpt.experts == 0)
            return cli_fail("--ep %s: expert parallelism is for --model gpt with --experts", o->ep);
        if (spmd_gpt_shard_experts(c->g, &o->gpt, mesh, o->ep, o->tp, NULL) != SPMD_OK)
            return cli_fail("--ep %s: %s", o->ep, spmd_last_error());
    }
    if (o->cp) {
        if (strcmp(o->model, "gpt"))
            return cli_fail("--cp: context parallelism is for --model gpt");
        if (spmd_gpt_shard_context_parallel(c->g, &o->gpt, mesh, &how) != SPMD_OK)
            return cli_fail("--cp %s: %s", o->cp, spmd_last_error());
    }
    if (o->tp) {
        if (strcmp(o->model, "gpt")) return cli_fail("--tp: tensor parallelism is for --model gpt");
        if (spmd_gpt_shard_tensor_parallel(c->g, &o->gpt, mesh, &how) != SPMD_OK)
            return cli_fail("--tp %s: %s", o->tp, spmd_last_error());
    } else if (o->sp) {
        return cli_fail("--sp on: sequence parallelism splits over the tensor axis: give --tp AXIS");
    }
    /* FSDP shards the parameters and the batch; without it, only the batch. */
    if (strcmp(fsdp, "none")) st = spmd_fsdp_wrap(c->g, mesh, fsdp, inputs, n, NULL);
    else st = spmd_shard_batch(c->g, mesh, inputs, n, NULL);
    if (st != SPMD_OK) return cli_fail("sharding with --fsdp %s: %s", fsdp, spmd_last_error());
    /* Copies need the mesh on the graph even where nothing is split (each
     * copy on one device): the input marked whole does it. */
    if (spmd_mesh_copies(mesh) > 1 && !spmd_get_sharding(c->input, (char[256]){0}, 256)[0]) {
        char whole[8 * SPMD_MAX_RANK] = "";
        for (int d = 0; d < spmd_tensor_rank(c->input); d++) strcat(whole, d ? ", None" : "None");
        if (spmd_mark_sharding(c->g, c->input, mesh, whole) != SPMD_OK)
            return cli_fail("--copies: %s", spmd_last_error());
    }
    return 0;
}

/* ---- Pipeline stages ------------------------------------------------------------- */

/* The flag that names the stage axis `pp` for a split (nothing is split
 * over the stage axis), or NULL. */
static const char *split_over_stages(const cli_opts *o)
{
    const char *axis = o->pp;
    return o->fsdp && !strcmp(o->fsdp, axis) ? "--fsdp" : o->tp && !strcmp(o->tp, axis) ? "--tp"
           : o->cp && !strcmp(o->cp, axis) ? "--cp" : o->ep && !strcmp(o->ep, axis) ? "--ep" : NULL;
}

/* --pp AXIS: the mesh's stage axis, the stages and the micro-batches
 * (docs/design/stages.md); a split over the stage axis and what does not
 * compose with stages yet are refused, naming the flags. */
static int setup_stages(cli_opts *o, cli_model *m)
{
    m->stages = m->micro_batches = 1;
    if (!o->pp) {
        if (o->pp_1f1b) return cli_fail("--pp-schedule 1f1b: a schedule of stages; give --pp AXIS");
        if (o->microbatches) return cli_fail("--microbatches %d: micro-batches are --pp's; give --pp AXIS "
                                             "(gradient accumulation is --accumulate)", o->microbatches);
        return 0;
    }
    const char *split = split_over_stages(o);
    if (split)
        return cli_fail("%s %s%s with --pp %s: axis '%s' is the stage axis, which holds a run of the "
                        "layers on each member and splits nothing; give %s another axis", split,
                        o->pp, o->sp && !strcmp(split, "--tp") ? " (and --sp on)" : "", o->pp, o->pp,
                        split);
    if (o->sp && !o->tp)
        return cli_fail("--sp on: sequence parallelism splits over the tensor axis: give --tp AXIS");
    const char *not_yet = strcmp(o->model, "gpt") ? "--model mlp" : o->copies ? "--copies"
                          : o->cp ? "--cp" : o->ep ? "--ep" : o->gpt.experts > 0 ? "--experts"
                          : o->optimizer.accumulate_steps > 1 ? "--accumulate (micro-batches are --microbatches)"
                          : NULL;
    if (not_yet) return cli_fail("--pp %s with %s is not built yet", o->pp, not_yet);
    int axis = spmd_mesh_axis_index(m->mesh, o->pp);
    if (axis < 0) return cli_fail("--pp %s: %s", o->pp, spmd_last_error());
    if (spmd_mesh_set_stage_axis(m->mesh, axis) != SPMD_OK) return cli_fail("--pp %s: %s", o->pp, spmd_last_error());
    m->stages = spmd_mesh_axis_size(m->mesh, axis);
    m->micro_batches = o->microbatches ? o->microbatches : m->stages;
    if (o->gpt.layers < m->stages)
        return cli_fail("--pp %s: %d stages for --layers %d; each stage holds at least one layer", o->pp,
                        m->stages, o->gpt.layers);
    if (m->micro_batches < m->stages)
        return cli_fail("--microbatches %d for %d stages (--pp %s): the schedule needs at least one micro-batch "
                        "per stage to fill the pipeline", m->micro_batches, m->stages, o->pp);
    return 0;
}

/* The staged GPT's inputs [M, b, T]: the micro-batches' rows over every
 * axis but the stage axis and the independent ones, else whole (the mark
 * gives the graph its mesh). */
static int mark_stage_inputs(spmd_mesh *mesh, cli_graph *c)
{
    char spec[256] = "None, (";
    size_t n = strlen(spec);
    int named = 0;
    for (int a = 0; a < spmd_mesh_rank(mesh); a++) {
        if (a == spmd_mesh_stage_axis(mesh) || spmd_mesh_axis_is_independent(mesh, a)) continue;
        n += (size_t)snprintf(spec + n, sizeof spec - n, "%s%s", named++ ? ", " : "", spmd_mesh_axis_name(mesh, a));
    }
    if (named) snprintf(spec + n, sizeof spec - n, "), None");
    else snprintf(spec, sizeof spec, "None, None, None");
    spmd_tensor *inputs[2] = {c->input, c->targets};
    for (int j = 0; j < 2; j++)
        if (spmd_mark_sharding(c->g, inputs[j], mesh, spec) != SPMD_OK)
            return cli_fail("--pp: the inputs' micro-batches: %s", spmd_last_error());
    return 0;
}

/* ---- Model ---------------------------------------------------------------------- */

/* The experts' flags, each refusal naming the flags and their numbers
 * (the library's own checks say the same without the flags). */
static int check_experts(const cli_opts *o, const spmd_mesh *mesh)
{
    const spmd_gpt_config *g = &o->gpt;
    if (g->experts == 0) {
        if (o->ep) return cli_fail("--ep %s: expert parallelism needs --experts E", o->ep);
        return 0;
    }
    if (strcmp(o->model, "gpt"))
        return cli_fail("--experts %d: experts are for --model gpt", g->experts);
    if (g->layers < 2)
        return cli_fail("--experts %d: experts replace the MLP of every other block (h.1, h.3, "
                        "...): --layers %d has none; give at least 2", g->experts, g->layers);
    if (g->top_k > g->experts)
        return cli_fail("--experts-top-k %d is more than --experts %d: a token cannot go to more "
                        "experts than there are", g->top_k, g->experts);
    double room = (double)g->top_k * g->seq * g->capacity_factor / g->experts;
    if (room + 1e-9 < 1)
        return cli_fail("--capacity-factor %g: more experts than fit the capacity: --experts %d "
                        "take floor(--experts-top-k %d x --seq %d x %g / %d) = 0 tokens each; "
                        "give --capacity-factor %g or more, or fewer experts",
                        (double)g->capacity_factor, g->experts, g->top_k, g->seq,
                        (double)g->capacity_factor, g->experts,
                        ceil((double)g->experts / ((double)g->top_k * g->seq) * 1e6) / 1e6);
    if (o->ep && mesh) {
        int a = spmd_mesh_axis_index(mesh, o->ep);
        if (a < 0) return cli_fail("--ep %s: %s", o->ep, spmd_last_error());
        int n = spmd_mesh_axis_size(mesh, a);
        if (g->experts % n)
            return cli_fail("--ep %s: --experts %d do not split over the axis's %d devices "
                            "(%d %% %d = %d)", o->ep, g->experts, n, g->experts, n,
                            g->experts % n);
    }
    return 0;
}

/* The model for `batch` rows of the data: a GPT over sequences, or an MLP
 * reading a one-hot token and predicting the next (a bigram model). */
static int build_graph(const cli_opts *o, const cli_model *m, cli_graph *c)
{
    c->g = spmd_graph_create(NULL);
    if (!c->g) return cli_fail("%s", spmd_last_error());
    spmd_status st = o->bf16 ? spmd_graph_set_matmul_precision(c->g, SPMD_BF16) : SPMD_OK;
    if (st == SPMD_OK && o->bf16_reduce) st = spmd_graph_set_reduce_precision(c->g, SPMD_BF16);
    if (st != SPMD_OK) return cli_fail("%s", spmd_last_error());
    if (!strcmp(o->model, "gpt")) {
        spmd_gpt_tensors t;
        /* The training step on stages; evaluation, forward only, reads
         * the trained parameters into the GPT without them. */
        if (o->pp && c == &m->train)
            st = spmd_gpt_build_stages(c->g, &o->gpt, o->batch, m->stages, m->micro_batches, &t);
        else
            st = spmd_gpt_build(c->g, &o->gpt, o->batch, &t);
        c->input = t.input, c->targets = t.targets, c->loss = t.loss, c->logits = t.logits;
        c->dropped = t.dropped;
    } else {
        spmd_mlp_config cfg = o->mlp;
        cfg.in_dim = cfg.out_dim = o->gpt.vocab;
        spmd_mlp_tensors t;
        st = spmd_mlp_build(c->g, &cfg, NULL, o->batch * o->gpt.seq, &t);
        if (st == SPMD_OK) st = spmd_mlp_add_loss(c->g, SPMD_MLP_CROSS_ENTROPY, &t);
        c->input = t.input, c->targets = t.targets, c->loss = t.loss, c->logits = t.output;
    }
    if (st != SPMD_OK) return cli_fail("cannot build the model: %s", spmd_last_error());
    if (m->mesh) {
        int rc = model_apply_marks(o, m->mesh, c);
        if (rc) return rc;
    }
    if (spmd_graph_mark_output(c->g, c->loss) != SPMD_OK) return cli_fail("%s", spmd_last_error());
    return 0;
}

/* Backward (checkpointing each GPT block if asked) and the optimizer. */
static int add_training(const cli_opts *o, cli_model *m)
{
    cli_graph *c = &m->train;
    spmd_status st;
    if (o->checkpoint && !strcmp(o->model, "gpt")) {
        /* Each block's output, of every micro-batch on stages ("mb{k}."
         * before all but the first's). */
        size_t most = (size_t)o->gpt.layers * (size_t)m->micro_batches;
        spmd_tensor **cuts = malloc((most ? most : 1) * sizeof *cuts);
        if (!cuts) return cli_fail("out of memory for %zu checkpoints", most);
        int n = 0;
        for (int k = 0; k < m->micro_batches; k++)
            for (int i = 0; i < o->gpt.layers; i++) {
                char name[48];
                if (k) snprintf(name, sizeof name, "mb%d.h.%d.out", k, i);
                else snprintf(name, sizeof name, "h.%d.out", i);
                if ((cuts[n] = spmd_graph_find(c->g, name))) n++;
            }
        st = spmd_grad_checkpointed(c->g, c->loss, cuts, n);
        free(cuts);
    } else {
        st = spmd_grad(c->g, c->loss);
    }
    if (st == SPMD_OK) st = spmd_optimizer_apply(c->g, &o->optimizer, &m->opt);
    if (st != SPMD_OK) return cli_fail("cannot build the training step: %s", spmd_last_error());
    return 0;
}

/* The network's figures, which price the axes that cross processes: the
 * flags', else measured when mpirun started several processes, else the
 * mesh's default. */
static int set_network(const cli_opts *o, cli_model *m)
{
    double latency = 0, bandwidth = 0;
    spmd_mesh_network(m->mesh, &latency, &bandwidth);
    m->network_source = "assumed";
    if (processes_count() > 1) {
        if (processes_measure_network(&latency, &bandwidth)) return 1;
        m->network_source = "measured";
        const double *round_latency, *round_bandwidth;
        int rounds = processes_network_rounds(&round_latency, &round_bandwidth);
        for (int r = 0; r < rounds; r++)
            test_hooks_network_round(r, round_latency[r], round_bandwidth[r]);
    }
    if (o->net_latency_us || o->net_gbps) m->network_source = "given";
    if (o->net_latency_us) latency = o->net_latency_us * 1e-6;
    if (o->net_gbps) bandwidth = o->net_gbps * 1e9;
    if (bandwidth <= 0) { /* a measurement too quick to tell: keep the default */
        m->network_source = "assumed";
        return 0;
    }
    if (spmd_mesh_set_network(m->mesh, latency, bandwidth) != SPMD_OK)
        return cli_fail("the network's figures: %s", spmd_last_error());
    return 0;
}

static double proc_bytes(const char *file, const char *key);
static const char *mem_text(double bytes, char *buf, size_t size);

/* Graph bytes each GPT block or MLP layer takes at least while the step
 * is built and planned (measured: about 100 KiB a block at --dim 8, its
 * nodes, gradient and plan on one device). */
#define GRAPH_BYTES_PER_LAYER (64.0 * 1024)

/* The tensors the optimizer keeps per parameter (torch.optim's state). */
static int optimizer_states(const spmd_optimizer *opt)
{
    switch (opt->kind) {
    case SPMD_OPTIMIZER_SGD: return opt->momentum != 0.0f;
    case SPMD_OPTIMIZER_ADAMW:
    case SPMD_OPTIMIZER_ADAM: return 2 + opt->amsgrad;
    case SPMD_OPTIMIZER_RMSPROP: return 1 + opt->centered + (opt->momentum != 0.0f);
    case SPMD_OPTIMIZER_ADAGRAD: return 1;
    }
    return 2;
}

/* The model's size against the memory, before its graph is built (which
 * grows with --layers for as long as the memory lasts): the graph's
 * nodes and, for a run, the parameters with their gradients and the
 * optimizer's moments, which fill at least this many bytes over this
 * process's devices however they are sharded.  0, or 2 naming the flags. */
static int check_model_size(const cli_opts *o, int copies)
{
    double avail = proc_bytes("/proc/meminfo", "MemAvailable");
    bool gpt = !strcmp(o->model, "gpt");
    /* A shape the model refuses is named by the build. */
    if (!o->memory_check || avail < 0 || (gpt && spmd_gpt_validate(&o->gpt) != SPMD_OK)) return 0;
    double params = 0;
    if (o->command == CMD_TRAIN) {
        params = gpt ? (double)spmd_gpt_param_count(&o->gpt)
                     : (double)o->mlp.layers * o->mlp.hidden * o->mlp.hidden;
        params *= copies / (o->processes > 1 ? (double)o->processes : 1.0);
    }
    double per_param = 4.0 * (2 + optimizer_states(&o->optimizer)); /* value, gradient, state */
    double need = (double)o->gpt.layers * GRAPH_BYTES_PER_LAYER + params * per_param;
    if (need <= avail) return 0;
    char a[32], b[32], shape[96];
    if (gpt)
        snprintf(shape, sizeof shape, "--layers %d --dim %d --vocab %d", o->gpt.layers, o->gpt.dim,
                 o->gpt.vocab);
    else
        snprintf(shape, sizeof shape, "--layers %d --hidden %d", o->gpt.layers, o->mlp.hidden);
    return cli_fail("not enough memory: %s needs at least %s (%s) and this machine has %s "
                    "available; a smaller model (--memory-check off builds it anyway)", shape,
                    mem_text(need, a, sizeof a),
                    params ? "its parameters, gradients and optimizer state, and its graph"
                           : "its graph",
                    mem_text(avail, b, sizeof b));
}

int model_build(const cli_opts *o_in, cli_model *m)
{
    memset(m, 0, sizeof *m);
    cli_opts o = *o_in;
    if ((int64_t)o.batch * o.gpt.seq > INT_MAX / 64)
        return cli_fail("--batch %d x --seq %d is too many tokens per step (at most %d)", o.batch,
                        o.gpt.seq, INT_MAX / 64);
    m->data = spmd_dataset_open(o.data, o.gpt.seq, o.seed);
    if (!m->data) return cli_fail("--data %s: %s", o.data ? o.data : "arith", spmd_last_error());
    if (o.data_sequential && spmd_dataset_set_order(m->data, SPMD_DATA_SEQUENTIAL) != SPMD_OK)
        return cli_fail("--data-order sequential: %s", spmd_last_error());
    if (!o.gpt.vocab) o.gpt.vocab = spmd_dataset_vocab(m->data);
    if (spmd_dataset_check_vocab(m->data, o.gpt.vocab) != SPMD_OK) {
        if (o.init)
            return cli_fail("--init %s: its vocabulary of %d: %s", o.init, o.gpt.vocab, spmd_last_error());
        return cli_fail("--vocab %d: %s", o.gpt.vocab, spmd_last_error());
    }
    m->mesh = spmd_mesh_parse(o.mesh, o.axes);
    if (!m->mesh) return cli_fail("--mesh %s --axes %s: %s", o.mesh, o.axes, spmd_last_error());
    if (o.devices && o.devices != spmd_mesh_devices(m->mesh))
        return cli_fail("--devices %d but the mesh %s has %d devices", o.devices, o.mesh,
                        spmd_mesh_devices(m->mesh));
    int rc = copies_setup(&o, m->mesh, &m->copies, m->copy_data);
    if (!rc) rc = setup_stages(&o, m);
    if (!rc) rc = check_model_size(&o, m->copies);
    if (rc) return rc;
    if (o.processes > 1 && spmd_mesh_place_processes(m->mesh, o.processes) != SPMD_OK)
        return cli_fail("%s %d: %s", processes_count() > 1 ? "mpirun -n" : "--processes",
                        o.processes, spmd_last_error());
    rc = set_network(&o, m);
    if (rc) return rc;
    if (spmd_mesh_devices(m->mesh) == 1 && o.n_shards == 0 && !o.copies) {
        spmd_mesh_free(m->mesh); /* one device, nothing to partition */
        m->mesh = NULL;
    }
    rc = check_experts(&o, m->mesh);
    if (rc) return rc;
    m->gpt = o.gpt;
    rc = build_graph(&o, m, &m->train);
    if (rc) return rc;
    bool gpt = !strcmp(o.model, "gpt");
    m->params = gpt ? spmd_gpt_param_count(&o.gpt) : spmd_graph_param_count(m->train.g);
    m->tokens_per_step = (int64_t)o.batch * o.gpt.seq * m->micro_batches *
                         (o.optimizer.accumulate_steps > 1 ? o.optimizer.accumulate_steps : 1);
    /* Forward + backward: 6 flops per parameter per token for the weights
     * that multiply (not the position table, which is only added), plus
     * attention's 12 * layers * dim * seq per token (as nanoGPT counts). */
    double mults = (double)m->params, attn = 0;
    if (gpt) {
        mults -= (double)(o.gpt.context ? o.gpt.context : o.gpt.seq) * o.gpt.dim;
        /* A token runs K of the E experts of an MoE block. */
        double c = o.gpt.dim;
        if (o.gpt.experts)
            mults -= (double)(o.gpt.layers / 2) * (o.gpt.experts - o.gpt.top_k) * (8 * c * c + 5 * c);
        attn = 12.0 * o.gpt.layers * o.gpt.dim * o.gpt.seq;
    }
    m->flops_per_step = (6.0 * mults + attn) * (double)m->tokens_per_step;
    /* Copies each run a batch of their own: the step does their work. */
    m->tokens_per_step *= m->copies;
    m->flops_per_step *= m->copies;
    rc = add_training(&o, m);
    if (rc) return rc;
    if (o.val_data) {
        m->val_data = spmd_dataset_open(o.val_data, o.gpt.seq, o.seed);
        if (!m->val_data) return cli_fail("--val-data %s: %s", o.val_data, spmd_last_error());
        if (spmd_dataset_check_vocab(m->val_data, o.gpt.vocab) != SPMD_OK)
            return cli_fail("--val-data %s: %s", o.val_data, spmd_last_error());
    }
    /* One forward-only program serves the accuracy and the validation
     * loss: logits for the one, the loss for the other. */
    m->accuracy = spmd_dataset_has_accuracy(m->data) && o.eval_samples > 0;
    if (m->accuracy || model_validates(&o)) {
        rc = build_graph(&o, m, &m->eval);
        if (!rc && m->accuracy && spmd_graph_mark_output(m->eval.g, m->eval.logits) != SPMD_OK)
            rc = cli_fail("%s", spmd_last_error());
        if (!rc && spmd_graph_mark_output(m->eval.g, m->eval.loss) != SPMD_OK)
            rc = cli_fail("%s", spmd_last_error());
    }
    return rc;
}

bool model_validates(const cli_opts *o) { return o->val_batches > 0; }

spmd_dataset *model_copy_data(const cli_model *m, int c)
{
    return m->copy_data[c] ? m->copy_data[c] : m->data;
}

void model_free(cli_model *m)
{
    spmd_graph_free(m->train.g);
    spmd_graph_free(m->eval.g);
    spmd_mesh_free(m->mesh);
    spmd_dataset_free(m->data);
    spmd_dataset_free(m->val_data);
    copies_free(m->copy_data);
    memset(m, 0, sizeof *m);
}

/* Load the GEMM library --blas names, once; its status (a failure with
 * spmd_last_error()). */
static spmd_status choose_blas(const cli_opts *o)
{
    static bool chosen;
    if (chosen) return SPMD_OK;
    spmd_status st = spmd_blas_select(o->blas, o->blas_core);
    chosen = st == SPMD_OK;
    return st;
}

/* The message of a BLAS that did not load; the exit code. */
static int blas_failed(const cli_opts *o, spmd_status st)
{
    /* A --blas that names no library, or a file that is none, is a usage
     * error; a library missing from this host is not. */
    cli_fail("%s", spmd_last_error());
    return st == SPMD_ERR_INVALID || (o->blas && strchr(o->blas, '/')) ? 2 : 1;
}

int model_select_blas(const cli_opts *o)
{
    spmd_status st = choose_blas(o);
    return st == SPMD_OK ? 0 : blas_failed(o, st);
}

spmd_program *model_compile(const cli_opts *o, spmd_graph *g, bool plan_only)
{
    /* A plan (explain) needs no GEMM library: load it only to run. */
    if (!plan_only && model_select_blas(o)) return NULL;
    /* Processes on one host share its cores: each takes its share. */
    int threads = o->threads;
    if (!threads && processes_here() > 1) {
        threads = (int)sysconf(_SC_NPROCESSORS_ONLN) / processes_here();
        if (threads < 1) threads = 1;
    }
    spmd_compile_options copt = {.threads = threads, .seed = o->seed, .plan_only = plan_only,
                                 .mpi_comm = plan_only ? NULL : processes_mpi_comm(),
                                 .copy_seeds = copies_seeds(o),
                                 .collective_timeout_s = o->collective_timeout_s, .overlap = o->overlap,
                                 .schedule = o->pp_1f1b ? SPMD_SCHEDULE_1F1B : SPMD_SCHEDULE_GPIPE,
                                 .inflight_bytes = (size_t)((double)o->inflight_mib * 1048576.0)};
    spmd_program *p = spmd_compile(g, &copt);
    if (!p) cli_fail("cannot compile: %s", spmd_last_error());
    return p;
}

/* A "Key:  123 kB" line of a /proc file, in bytes; -1 when absent. */
static double proc_bytes(const char *file, const char *key)
{
    FILE *f = fopen(file, "r");
    if (!f) return -1;
    char line[256];
    size_t n = strlen(key);
    double v = -1;
    while (v < 0 && fgets(line, sizeof line, f))
        if (!strncmp(line, key, n) && line[n] == ':') v = strtod(line + n + 1, NULL) * 1024;
    fclose(f);
    return v;
}

static const char *mem_text(double bytes, char *buf, size_t size)
{
    if (bytes >= 1024.0 * 1024 * 1024) snprintf(buf, size, "%.1f GiB", bytes / (1024.0 * 1024 * 1024));
    else snprintf(buf, size, "%.0f MiB", bytes / (1024.0 * 1024));
    return buf;
}

/* Address space a run maps beyond its plan: a stack per compute thread,
 * and the BLAS library and OpenBLAS's GEMM buffers.  Little of it is
 * touched, but RLIMIT_AS counts it all.  The BLAS's share is measured,
 * not assumed (it differs between releases: Debian's OpenBLAS 0.3.21 maps
 * 39 MiB as it loads, 0.3.29 170 MiB, a GEMM buffer for its own thread
 * among them; each maps a 128 MiB buffer for the first product, made only
 * where twice that fits): under a limit the check loads the library and
 * has it make that buffer (spmd_blas_prepare), then measures the room
 * left. */
#define THREAD_STACK_BYTES (8.0 * 1024 * 1024)

int model_check_programs(const cli_opts *o, spmd_graph *first, spmd_graph *second,
                         double tool_bytes, const char *advice)
{
    /* Plan-only programs allocate nothing: the figure comes before the
     * memory, not after the kernel has killed the run. */
    spmd_program *a = model_compile(o, first, true);
    spmd_program *b = a && second ? model_compile(o, second, true) : NULL;
    if (!a || (second && !b)) {
        spmd_program_free(a);
        return 1;
    }
    /* This process runs its share of the devices. */
    int devices = spmd_program_devices(a) / (o->processes > 1 ? o->processes : 1);
    double per_device = (double)spmd_program_peak_bytes(a) + (b ? (double)spmd_program_peak_bytes(b) : 0);
    spmd_program_free(a);
    spmd_program_free(b);
    double need = per_device * devices + tool_bytes;
    char x[32], y[32], z[32];

    double avail = proc_bytes("/proc/meminfo", "MemAvailable");
    if (avail >= 0 && need > avail)
        return cli_fail("not enough memory: this run needs about %s (%s per device x %d devices, plus "
                        "input buffers) and this machine has %s available; %s",
                        mem_text(need, x, sizeof x), mem_text(per_device, y, sizeof y), devices,
                        mem_text(avail, z, sizeof z), advice);

    struct rlimit limit;
    if (getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return 0;
    /* The BLAS loaded, with the buffer of its first product, measured (a
     * failure for lack of room says how much did not fit). */
    size_t blas_mapped = 0, blas_more = 0;
    spmd_status st = choose_blas(o);
    if (st == SPMD_OK || st == SPMD_ERR_NOMEM) st = spmd_blas_prepare(&blas_mapped, &blas_more);
    if (st != SPMD_OK && st != SPMD_ERR_NOMEM) return blas_failed(o, st);
    /* Each device gets its share of the compute threads, at least one (as
     * the compiler splits them). */
    long threads = o->threads ? o->threads : sysconf(_SC_NPROCESSORS_ONLN);
    long per = threads / devices < 1 ? 1 : threads / devices > 256 ? 256 : threads / devices;
    double workers = (double)per * devices;
    double mapped = need + workers * THREAD_STACK_BYTES;
    /* What is mapped already counts against the limit too. */
    double now = fmax(0, proc_bytes("/proc/self/status", "VmSize"));
    double room = (double)limit.rlim_cur - now;
    if (st == SPMD_OK && mapped <= room) return 0;
    /* The figures from before the BLAS loaded: the run's, with the BLAS's. */
    double blas = (double)blas_mapped + (double)blas_more;
    double left = fmax(0, room + (double)blas_mapped);
    char w[32], u[32], how[64] = "measured";
    if (blas_more)
        snprintf(how, sizeof how, "%s of it would not map", mem_text((double)blas_more, u, sizeof u));
    return cli_fail("not enough address space: this run maps about %s (%s per device x %d devices, "
                    "plus input buffers, %.0f thread stacks, and %s for the BLAS library and its "
                    "GEMM buffer, %s) and the address-space limit (ulimit -v) leaves %s; raise the "
                    "limit, or %s",
                    mem_text(mapped + blas, x, sizeof x), mem_text(per_device, y, sizeof y), devices,
                    workers, mem_text(blas, w, sizeof w), how, mem_text(left, z, sizeof z), advice);
}

int model_check_memory(const cli_opts *o, const cli_model *m)
{
    /* The tool's own buffers: token ids, targets and score mask, and the
     * one-hot inputs and held-out logits of batch x seq x vocab floats. */
    double tokens = (double)o->batch * o->gpt.seq;
    double vocab = (double)spmd_tensor_dim(m->train.logits, spmd_tensor_rank(m->train.logits) - 1);
    return model_check_programs(o, m->train.g, m->eval.g, tokens * (9.0 + 8.0 * vocab),
                                "try sharding more of the model over the mesh (--fsdp, --shard, "
                                "--zero on), --checkpoint on, or a smaller --batch or --seq "
                                "(--memory-check off runs it anyway)");
}

size_t model_param_bytes(const spmd_program *p)
{
    /* Gradients are resolved onto their parameter's sharding: one more
     * copy of the parameter bytes. */
    return spmd_program_persistent_bytes(p) + spmd_program_param_bytes(p);
}


void model_mesh_text(const cli_model *m, char *buf, size_t size)
{
    if (!m->mesh) {
        snprintf(buf, size, "1 device");
        return;
    }
    size_t n = 0;
    for (int i = 0; i < spmd_mesh_rank(m->mesh); i++)
        n += (size_t)snprintf(buf + n, size - n, i ? "x%d" : "%d", spmd_mesh_axis_size(m->mesh, i));
    n += (size_t)snprintf(buf + n, size - n, " (");
    for (int i = 0; i < spmd_mesh_rank(m->mesh); i++)
        n += (size_t)snprintf(buf + n, size - n, i ? ", %s" : "%s", spmd_mesh_axis_name(m->mesh, i));
    snprintf(buf + n, size - n, ")");
}

void model_batch_text(const cli_opts *o, const cli_model *m, char *buf, size_t size)
{
    int k = o->optimizer.accumulate_steps;
    if (o->pp)
        snprintf(buf, size, "batch %d x %d micro-batches over %d stages", o->batch, m->micro_batches,
                 m->stages);
    else if (k > 1) snprintf(buf, size, "batch %d x %d micro-batches", o->batch, k);
    else snprintf(buf, size, "batch %d", o->batch);
}
