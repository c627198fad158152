/*
 * The text of `spmd explain` (see explain.h): read from the compiled
 * object alone, through the reports of report.c, plus what the caller
 * knows (spmd_explain_options).
 */
#include "compile/explain.h"
#include "base/error.h"
#include "compile/report.h"
#include "ir/ir.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- A growing text ----------------------------------------------------- */

typedef struct {
    char *buf;
    size_t len, cap;
    bool failed; /* an allocation failed: the text is incomplete */
} text;

__attribute__((format(printf, 2, 3))) static void put(text *t, const char *fmt, ...)
{
    if (t->failed) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->buf ? t->buf + t->len : NULL, t->buf ? t->cap - t->len : 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
        t->failed = true;
        return;
    }
    if (t->buf && t->len + (size_t)n < t->cap) {
        t->len += (size_t)n;
        return;
    }
    size_t cap = t->cap ? t->cap : 4096;
    while (cap <= t->len + (size_t)n) cap *= 2;
    char *grown = realloc(t->buf, cap);
    if (!grown) {
        t->failed = true;
        return;
    }
    t->buf = grown;
    t->cap = cap;
    va_start(ap, fmt);
    vsnprintf(t->buf + t->len, t->cap - t->len, fmt, ap);
    va_end(ap);
    t->len += (size_t)n;
}

/* Bytes as "512 B", "1.5 KiB", "3.0 MiB", "2.0 GiB" (the units the spmd
 * tool prints its other figures in). */
static const char *bytes_text(double bytes, char *buf, size_t size)
{
    const char *unit[] = {"B", "KiB", "MiB", "GiB"};
    int u = 0;
    while (bytes >= 1024 && u < 3) bytes /= 1024, u++;
    snprintf(buf, size, u ? "%.1f %s" : "%.0f %s", bytes, unit[u]);
    return buf;
}

/* ---- The parts of the report -------------------------------------------- */

/* "4x2 (replica, fsdp)", or "1 device" without a mesh. */
static void put_mesh(text *t, const spmd_mesh *m)
{
    if (!m) {
        put(t, "1 device");
        return;
    }
    for (int i = 0; i < spmd_mesh_rank(m); i++) put(t, i ? "x%d" : "%d", spmd_mesh_axis_size(m, i));
    put(t, " (");
    for (int i = 0; i < spmd_mesh_rank(m); i++) put(t, i ? ", %s" : "%s", spmd_mesh_axis_name(m, i));
    put(t, ")");
}

/* Which axes cross processes, when planned over several. */
static void put_processes(text *t, const spmd_mesh *m, const char *network_source)
{
    int procs = m ? spmd_mesh_processes(m) : 1;
    if (procs < 2) return;
    char across[256] = "", inside[256] = "";
    for (int a = 0; a < spmd_mesh_rank(m); a++) {
        char *list = spmd_mesh_axis_is_local(m, a) ? inside : across;
        size_t n = strlen(list);
        snprintf(list + n, sizeof across - n, "%s%s", n ? ", " : "", spmd_mesh_axis_name(m, a));
    }
    put(t,
        "processes: %d x %d devices (mesh position r in process r / %d); across processes: %s; "
        "inside a process: %s\n",
        procs, spmd_mesh_devices(m) / procs, spmd_mesh_devices(m) / procs, across[0] ? across : "none",
        inside[0] ? inside : "none");
    double latency, bandwidth;
    spmd_mesh_network(m, &latency, &bandwidth);
    put(t, "network (prices the axes across processes): %.1f us per message, %.2f GB/s (%s)\n",
        latency * 1e6, bandwidth / 1e9, network_source ? network_source : "set_network");
}

/* Copies along independent axes: the plan is one copy's. */
static void put_copies(text *t, const spmd_mesh *m)
{
    int copies = m ? spmd_mesh_copies(m) : 1;
    if (copies < 2) return;
    put(t, "copies: %d along '", copies);
    for (int a = 0, n = 0; a < spmd_mesh_rank(m); a++)
        if (spmd_mesh_axis_is_independent(m, a)) put(t, n++ ? ", %s" : "%s", spmd_mesh_axis_name(m, a));
    put(t, "', independent: each group along it trains a model of its own and no collective crosses "
           "it; the plan below is one copy's, on its group\n");
}

/* The most arena bytes stage s's values hold at once over the schedule,
 * each from the step that writes it to the last that reads it (outputs
 * and update values to the end): what a device of the stage would plan
 * were its arena its own; -1 when out of memory. */
static double stage_activation_peak(const compiled *c, int s)
{
    const plan *pl = &c->plan;
    const spmd_graph *lg = c->local;
    int n = lg->n_nodes, ns = pl->n_steps;
    int *born = malloc((size_t)(n ? n : 1) * sizeof *born), *dies = malloc((size_t)(n ? n : 1) * sizeof *dies);
    double *delta = calloc((size_t)ns + 2, sizeof *delta);
    double peak = -1;
    if (born && dies && delta) {
        for (int i = 0; i < n; i++) born[i] = dies[i] = -1;
        for (int k = 0; k < ns; k++) {
            const spmd_tensor *t = pl->steps[k];
            const fuse_group *grp = fusion_group(&c->fusion, t);
            born[pl->storage[t->id]] = k;
            for (int j = 0; grp && j < grp->n_stored; j++) born[pl->storage[grp->stored[j]->id]] = k;
            int n_in = grp ? grp->n_in : t->n_in;
            for (int j = 0; j < n_in; j++) {
                int st = pl->storage[(grp ? grp->in[j] : t->in[j])->id];
                if (dies[st] < k) dies[st] = k;
            }
            if (t->is_output) dies[pl->storage[t->id]] = ns;
        }
        for (int u = 0; u < lg->n_updates; u++) dies[pl->storage[lg->updates[u].value->id]] = ns;
        for (int i = 0; i < n; i++) {
            const spmd_tensor *t = lg->nodes[i];
            if (born[i] < 0 || pl->offset[i] < 0 || (t->stage != s && t->stage >= 0)) continue;
            delta[born[i]] += (double)ir_nbytes(t);
            delta[(dies[i] > born[i] ? dies[i] : born[i]) + 1] -= (double)ir_nbytes(t);
        }
        double live = 0;
        peak = 0;
        for (int k = 0; k <= ns; k++) {
            live += delta[k];
            if (live > peak) peak = live;
        }
    }
    free(born), free(dies), free(delta);
    return peak;
}

/* The block a parameter's name places it in: its first dotted part that
 * is a number ("h.3.attn.c_attn.weight", the GPT's; "blocks.3.qkv.weight",
 * a PyTorch ModuleList's), -1 for none. */
static int block_of(const char *name)
{
    for (const char *p = name ? strchr(name, '.') : NULL; p; p = strchr(p + 1, '.')) {
        size_t digits = strspn(p + 1, "0123456789");
        if (digits > 0 && digits < 9 && p[1 + digits] == '.') return atoi(p + 1);
    }
    return -1;
}

/* Pipeline stages (docs/DESIGN.md, "Pipeline stages"): per stage its
 * blocks (by block_of), its other
 * parameters, the bytes its devices allocate (the parameters and state
 * it updates, their update values, its arena), and the
 * steps of the schedule it runs. */
static void put_stages(text *t, const compiled *c)
{
    const spmd_mesh *m = c->mesh;
    int axis = m ? spmd_mesh_stage_axis(m) : -1;
    if (axis < 0 || !c->partitioned) return;
    int stages = spmd_mesh_axis_size(m, axis);
    const spmd_graph *lg = c->local;
    put(t, "\nstages: %d along '%s'; each device runs its stage's steps, the values between "
           "stages sent point to point\n", stages, spmd_mesh_axis_name(m, axis));
    for (int s = 0; s < stages; s++) {
        int first = -1, last = -1, steps = 0, others = 0;
        size_t bytes = 0, held = 0;
        char names[160] = "";
        for (int i = 0; i < lg->n_nodes; i++) {
            const spmd_tensor *x = lg->nodes[i];
            if (x->stage != s) continue;
            if (c->plan.swapped[i]) held += ir_nbytes(x);
            if (!ir_is_persistent(x)) continue;
            bytes += ir_nbytes(x);
            held += ir_nbytes(x);
            int layer;
            if (x->op != IR_PARAM) continue;
            if ((layer = block_of(x->name)) >= 0) {
                if (first < 0 || layer < first) first = layer;
                if (layer > last) last = layer;
            } else if (x->name && strlen(names) + strlen(x->name) + 8 < sizeof names) {
                size_t n = strlen(names);
                snprintf(names + n, sizeof names - n, "%s%s", n ? ", " : "", x->name);
            } else {
                others++;
            }
        }
        for (int k = 0; k < c->plan.n_steps; k++) {
            const spmd_tensor *x = c->plan.steps[k];
            steps += x->op == IR_STAGE_TRANSFER ? x->attr.stage.from == s || x->attr.stage.to == s
                                                : x->stage == s;
        }
        char b[32], h[32], ar[32], act[32], layers[32] = "no blocks";
        double peak = stage_activation_peak(c, s);
        if (peak < 0) snprintf(act, sizeof act, "?");
        else bytes_text(peak, act, sizeof act);
        if (first >= 0 && first == last) snprintf(layers, sizeof layers, "block %d", first);
        else if (first >= 0) snprintf(layers, sizeof layers, "blocks %d-%d", first, last);
        put(t, "  stage %d: %s%s%s%s, %s of parameters and state (%s with their update values), "
               "%s of arena (%s of activations at most), %d steps\n",
            s, layers, names[0] ? " + " : "", names, others ? " + more" : "",
            bytes_text((double)bytes, b, sizeof b), bytes_text((double)held, h, sizeof h),
            bytes_text((double)compiled_stage_arena_bytes(c, s), ar, sizeof ar), act, steps);
    }
    put(t, "  (what each device of a stage allocates: its stage's parameters, state and update "
           "values, and its arena: the values of no stage and its stage's own, planned along its "
           "steps; activations at most: what its values hold at once over the schedule)\n");
}

/* What stage transfer x moves, as a code: a parameter (the GPT's tied
 * head weight) 2 id, its gradient 2 id + 1; else the activations, their
 * gradients, the optimizer's scalars (each stage's sum of gradient
 * squares to the last stage, the clipping scale back) or another of its
 * values.  grad_of[i]: the parameter whose gradient node i is or feeds,
 * -1 for none. */
enum { MOVES_ACTIVATIONS = -1, MOVES_ACTIVATION_GRADS = -2, MOVES_SQUARES = -3, MOVES_CLIP = -4,
       MOVES_OPTIMIZER = -5 };

static int transfer_moves(const spmd_graph *g, const spmd_tensor *x, int last, const int *grad_of)
{
    part_phase phase = partition_phase(g, x->id);
    if (x->in[0]->op == IR_PARAM) return 2 * x->in[0]->id;
    if (grad_of[x->id] >= 0) return 2 * grad_of[x->id] + 1;
    if (phase == PART_FORWARD) return MOVES_ACTIVATIONS;
    if (phase == PART_BACKWARD) return MOVES_ACTIVATION_GRADS;
    if (x->attr.stage.to == last) return MOVES_SQUARES;
    return x->attr.stage.from == last ? MOVES_CLIP : MOVES_OPTIMIZER;
}

static void moves_text(const spmd_graph *g, int code, char *buf, size_t size)
{
    static const char *const kinds[] = {"activations", "activations' gradients",
                                        "sum of gradient squares", "clipping scale",
                                        "optimizer value"};
    if (code < 0) {
        snprintf(buf, size, "%s", kinds[-code - 1]);
        return;
    }
    const char *name = g->nodes[code / 2]->name ? g->nodes[code / 2]->name : "a parameter";
    snprintf(buf, size, code % 2 ? "%s's gradient" : "%s", name);
}

/* With stages: every value that crosses from one stage to another, per
 * step, as what each device sends its partner on the other stage (one
 * row per direction, phase, shape and kind of value), and whether any
 * collective's group spans the stage axis (none does: the rows are all
 * that crosses). */
static void put_stage_transfers(text *t, const compiled *c)
{
    const spmd_mesh *m = c->mesh;
    int axis = m ? spmd_mesh_stage_axis(m) : -1;
    if (axis < 0 || !c->partitioned) return;
    const partition *p = &c->part;
    const spmd_graph *g = p->g, *lg = c->local;
    int stages = spmd_mesh_axis_size(m, axis), spanning = 0, n = p->n_transfers;
    for (int i = 0; i < p->n_colls; i++)
        for (int a = 0; a < p->colls[i].axes.n; a++) spanning += p->colls[i].axes.axis[a] == axis;
    put(t, "\nstage transfers per step (what each device sends its partner on the other stage; "
           "%s):\n  %-4s %-4s %-9s %5s %12s %12s  %s\n",
        spanning ? "collectives span the stage axis too" : "nothing else crosses: no collective spans it",
        "from", "to", "phase", "count", "bytes each", "bytes", "moves");
    size_t nn = (size_t)(g->n_nodes ? g->n_nodes : 1), nx = (size_t)(n ? n : 1);
    int *grad_of = malloc(nn * sizeof *grad_of), *code = malloc(nx * sizeof *code);
    bool *shown = calloc(nx, sizeof *shown);
    double *sent = calloc((size_t)stages * (size_t)stages, sizeof *sent);
    if (!grad_of || !code || !shown || !sent) {
        t->failed = true;
        free(grad_of), free(code), free(shown), free(sent);
        return;
    }
    for (int i = 0; i < g->n_nodes; i++) grad_of[i] = -1;
    for (int i = 0; i < g->n_nodes; i++) {
        const spmd_tensor *q = g->nodes[i];
        if (q->op != IR_PARAM || !q->grad) continue;
        grad_of[q->grad->id] = i;
        for (int j = 0; j < q->grad->n_in; j++) grad_of[q->grad->in[j]->id] = i;
    }
    for (int k = 0; k < n; k++)
        code[k] = transfer_moves(g, g->nodes[p->transfers[k].tensor], stages - 1, grad_of);
    for (int k = 0; k < n; k++) {
        if (shown[k]) continue;
        const spmd_tensor *x = g->nodes[p->transfers[k].tensor], *lx = lg->nodes[p->transfers[k].node];
        part_phase phase = partition_phase(g, x->id);
        int count = 0;
        for (int j = k; j < n; j++) {
            const spmd_tensor *y = g->nodes[p->transfers[j].tensor], *ly = lg->nodes[p->transfers[j].node];
            if (shown[j] || code[j] != code[k] || y->attr.stage.from != x->attr.stage.from ||
                y->attr.stage.to != x->attr.stage.to || partition_phase(g, y->id) != phase ||
                ly->dtype != lx->dtype || ly->rank != lx->rank ||
                memcmp(ly->dims, lx->dims, (size_t)lx->rank * sizeof *lx->dims))
                continue;
            shown[j] = true;
            count++;
        }
        char what[160], dims[96];
        moves_text(g, code[k], what, sizeof what);
        size_t len = (size_t)snprintf(dims, sizeof dims, "[");
        for (int d = 0; d < lx->rank && len < sizeof dims; d++)
            len += (size_t)snprintf(dims + len, sizeof dims - len, d ? ", %lld" : "%lld",
                                    (long long)lx->dims[d]);
        if (len < sizeof dims) snprintf(dims + len, sizeof dims - len, "]");
        size_t each = ir_nbytes(lx);
        sent[x->attr.stage.from * stages + x->attr.stage.to] += (double)each * count;
        put(t, "  %-4d %-4d %-9s %5d %12zu %12.0f  %s %s %s\n", x->attr.stage.from, x->attr.stage.to,
            partition_phase_name(phase), count, each, (double)each * count, what, dims,
            spmd_dtype_name(lx->dtype));
    }
    for (int s = 0; s < stages; s++)
        for (int r = 0; r < stages; r++)
            if (sent[s * stages + r] > 0)
                put(t, "  stage %d to stage %d: %.0f bytes a step from each device\n", s, r,
                    sent[s * stages + r]);
    free(grad_of), free(code), free(shown), free(sent);
}

static void put_tensors(text *t, const spmd_graph *g)
{
    put(t, "\ntensors (named):\n  %-34s %-18s %s\n", "name", "shape", "sharding");
    for (int i = 0; i < spmd_graph_tensor_count(g); i++) {
        const spmd_tensor *x = spmd_graph_tensor(g, i);
        if (!spmd_tensor_name(x)) continue;
        char shape[96], spec[256];
        size_t n = (size_t)snprintf(shape, sizeof shape, "[");
        for (int d = 0; d < spmd_tensor_rank(x); d++)
            n += (size_t)snprintf(shape + n, sizeof shape - n, d ? ", %lld" : "%lld",
                                  (long long)spmd_tensor_dim(x, d));
        snprintf(shape + n, sizeof shape - n, "]");
        spmd_get_sharding(x, spec, sizeof spec);
        if (!spec[0]) snprintf(spec, sizeof spec, "replicated");
        put(t, "  %-34s %-18s %s\n", spmd_tensor_name(x), shape, spec);
    }
}

/* With accumulation the forward and backward collectives run once per
 * micro-batch (column "x": `micro` a step), the update's once a step.
 * With measures, each one's measured median next to its estimate. */
static void put_collectives(text *t, const compiled *c, int micro, const spmd_explain_options *o)
{
    const double *meas = o ? o->measured_us : NULL;
    int n = compiled_collective_count(c);
    double total = 0, per_micro = 0;
    put(t, "\ncollectives per step (%d):\n", n);
    if (micro > 1 && n)
        put(t, "  a step is %d micro-batches: the forward and backward ones run in each (x %d), "
               "the update's (the gradients' reductions) once\n", micro, micro);
    double est = 0, measured = 0;
    size_t fly_bytes, fly_extra;
    int flying = compiled_overlap(c, &fly_bytes, &fly_extra);
    if (n && meas)
        put(t, "  measured: the median of each collective's boxes in the trace (steps %d to %d, "
               "every device; a wait for a peer counts)\n", o->first_step, o->last_step);
    if (n)
        put(t, "  %-9s %-15s %-16s %12s %9s%s  %s%s%s\n", "phase", "kind", "axes", "bytes/device",
            "est. us", meas ? " meas. us" : "", micro > 1 ? "x   " : "", flying ? "in flight  " : "",
            "moves");
    for (int i = 0; i < n; i++) {
        spmd_collective_info ci;
        char b[32], times[16] = "";
        compiled_collective(c, i, &ci);
        total += (double)ci.bytes * ci.count;
        if (ci.count > 1) per_micro += (double)ci.bytes;
        est += ci.seconds * ci.count;
        if (micro > 1) snprintf(times, sizeof times, "%-3d ", ci.count);
        char took[16] = "";
        if (meas && isnan(meas[i])) snprintf(took, sizeof took, " %9s", "-");
        else if (meas) snprintf(took, sizeof took, " %9.1f", meas[i]);
        if (meas && !isnan(meas[i])) measured += meas[i] * 1e-6 * ci.count;
        /* In flight: over how many of the device's steps. */
        char fly[24] = "";
        if (flying && ci.in_flight_steps) snprintf(fly, sizeof fly, "%-5d      ", ci.in_flight_steps);
        else if (flying) snprintf(fly, sizeof fly, "%-11s", "-");
        put(t, "  %-9s %-15s %-16s %12s %9.1f%s  %s%s%s%s\n", ci.phase, ci.kind, ci.axes,
            bytes_text((double)ci.bytes, b, sizeof b), ci.seconds * 1e6, took, times, fly, ci.tensor,
            ci.written ? ", written in place" : ci.in_place ? ", read in place" : "");
    }
    char b[32], m[32], u[32], l[32];
    if (n && micro > 1)
        put(t, "  in all: %s per device per step (%s in each micro-batch, %s in the update), about "
               "%.2f ms by the alpha-beta model\n",
            bytes_text(total, b, sizeof b), bytes_text(per_micro, m, sizeof m),
            bytes_text(total - per_micro * micro, u, sizeof u), est * 1e3);
    else if (n)
        put(t, "  in all: %s per device per step, about %.2f ms by the alpha-beta model\n",
            bytes_text(total, b, sizeof b), est * 1e3);
    size_t budget = c->plan.inflight_budget;
    if (flying || budget)
        put(t, "  in flight: %d of %d on each device's communication thread while it computes "
               "%s, %s of operands and results at most at once of a budget of %s, the arena %s "
               "larger\n",
            flying, n, flying ? "(column: the steps they span; -: a blocking step)"
                              : "(each over the budget, or unable to gain)",
            bytes_text((double)fly_bytes, b, sizeof b), bytes_text((double)budget, l, sizeof l),
            bytes_text((double)fly_extra, m, sizeof m));
    if (n && meas)
        put(t, "  measured: %.2f ms a step (the medians summed), %.2fx the estimate\n", measured * 1e3,
            est > 0 ? measured / est : 0.0);
}

static void put_memory(text *t, const compiled *c)
{
    char a[32], b[32];
    /* Gradients are resolved onto their parameter's sharding: one more
     * copy of the parameter bytes beside parameters and optimizer state. */
    size_t params = compiled_persistent_bytes(c) + compiled_param_bytes(c);
    put(t, "\nmemory per device: %s parameters + gradients + optimizer state, %s peak\n",
        bytes_text((double)params, a, sizeof a), bytes_text((double)compiled_peak_bytes(c), b, sizeof b));
    int nf = compiled_fallback_count(c);
    put(t, "fallbacks (whole-tensor gathers an op forced): %d\n", nf);
    for (int i = 0; i < nf; i++) {
        char line[256];
        compiled_fallback(c, i, line, sizeof line);
        put(t, "  %s\n", line);
    }
    int unsettled = compiled_propagation_unsettled(c);
    if (unsettled)
        put(t, "propagation: not settled after %d rounds (a long chain of unmarked tensors): "
               "some may stay replicated where more rounds would split them; mark them\n",
            unsettled);
}

spmd_status compiled_explain(const compiled *c, const spmd_explain_options *o, char **out)
{
    if (!out) return base_error(SPMD_ERR_INVALID, "explain: text is NULL");
    *out = NULL;
    if (!c) return base_error(SPMD_ERR_INVALID, "explain: the program is NULL");
    const spmd_graph *g = c->g;
    int64_t params = spmd_graph_param_count(g);
    text t = {0};
    put(&t, "spmd explain: %s, %.2fM parameters, mesh ", o && o->model ? o->model : "graph",
        (double)params / 1e6);
    put_mesh(&t, c->mesh);
    if (o && o->batch) put(&t, ", %s", o->batch);
    put(&t, "\n");
    put_processes(&t, c->mesh, o ? o->network_source : NULL);
    put_copies(&t, c->mesh);
    put_stages(&t, c);
    put_stage_transfers(&t, c);
    put_tensors(&t, g);
    put_collectives(&t, c, g->accumulate_steps, o);
    put_memory(&t, c);
    if (t.failed) {
        free(t.buf);
        return base_error(SPMD_ERR_NOMEM, "explain: out of memory for the report's text");
    }
    *out = t.buf;
    return SPMD_OK;
}
