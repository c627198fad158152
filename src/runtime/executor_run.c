/*
 * A run: every device runs its schedule on its threads, then, where no
 * device failed, the update phase (executor_update.c).
 */
#include "runtime/executor_impl.h"
#include "base/error.h"
#include "runtime/blas.h"

/* A step too small to share: the largest of its output and operands at
 * most this many elements, or a scalar output (a reduction to one scalar
 * runs on one thread anyway). */
enum { SOLO_ELEMENTS = 16384 };

/* Whether thread 0 runs step t alone (nth 1: every thread count gives the
 * same bits, "Determinism"), so that a run of such steps needs no barrier
 * between them: on a device of several threads each barrier is a hand-off
 * that costs more than these steps' work (the optimizer's scalars, the
 * norm's sums, small bias updates).  Collectives keep their barrier. */
static bool solo_step(const spmd_tensor *t, const fuse_group *grp)
{
    if (ir_op_is_collective(t->op)) return false;
    int64_t most = ir_numel(t);
    if (most == 1) return true;
    int n = grp ? grp->n_in : t->n_in;
    for (int j = 0; j < n; j++) {
        int64_t k = ir_numel(grp ? grp->in[j] : t->in[j]);
        most = k > most ? k : most;
    }
    return most <= SOLO_ELEMENTS;
}

static void run_worker(void *ctx, int ith, int nth)
{
    device *d = ctx;
    spmd_program *p = d->prog;
    const plan *pl = &p->c.plan;
    kern_args a = {0};
    a.ith = ith;
    a.nth = nth;
    a.message = d->message;
    a.message_size = sizeof d->message;
    a.scratch = d->scratch ? d->scratch + (size_t)ith * p->c.scratch_each : NULL;
    a.dev = p->c.partitioned ? &d->kd : NULL;
    /* Dropout's key: the same on every device of a copy, and a
     * micro-batch's own (spmd_program_run runs a step's last). */
    a.seed = d->seed;
    a.micro = p->micro_done;
    int64_t *tr = ith == 0 ? d->trace_row : NULL; /* NULL: not tracing */
    if (tr) tr[0] = trace_clock(p);
    dev_comm *c = d->comm;
    uint32_t issued = 0; /* hand-overs this run (thread 0) */
    int next_start = 0;  /* the next async collective to hand over */
    int run = 0;         /* shared steps run, for the status word's parity */
    bool comm_ok = true; /* until a collective in flight fails */
    int last = -1;       /* the last step run (traced) */
    /* The last of a run of solo steps (thread 0's alone) since the last
     * barrier, -1 for none: the barrier it owes comes before the next
     * shared step, or at the end.  Solo steps report in status[2], which
     * every thread reads after that barrier: no thread can be writing it
     * for a later run of solo steps before they all passed the next
     * barrier. */
    int owed = -1;
    for (int s = 0; s <= pl->n_steps; s++) {
        const spmd_tensor *t = s < pl->n_steps ? pl->steps[s] : NULL;
        /* The update waits for the last micro-batch; another stage's nodes
         * are its devices'. */
        bool skipped = t && ((p->micro_run && !p->c.micro[t->id]) || !exec_on_stage(d, t));
        bool flying = t && c && pl->async_of[s] >= 0;
        /* A fused group's root reads the group's inputs. */
        const fuse_group *grp = t ? fusion_group(&p->c.fusion, t) : NULL;
        bool solo = nth > 1 && t && !skipped && !flying && solo_step(t, grp);
        if (owed >= 0 && !solo && !skipped && !flying) {
            rt_pool_barrier(d->pool);
            if (tr) tr[2 + 2 * owed] = trace_clock(p);
            owed = -1;
            if (atomic_load(&d->status[2]) != SPMD_OK) {
                if (ith == 0 && p->world) coll_world_abort(p->world, d->message);
                break;
            }
        }
        /* Alternate status words: a fast thread failing the next shared
         * step cannot be seen by a slow thread still checking this one,
         * so every thread of the device stops at the same node. */
        a.status = &d->status[solo ? 2 : run & 1];
        if (c) {
            comm_ok = exec_inflight_wait(d, s, ith, a.status) && comm_ok;
            for (; ith == 0 && next_start < pl->n_async && pl->start_at[next_start] == s; next_start++)
                exec_inflight_issue(d, next_start, &issued);
        }
        if (!t) {
            if (!comm_ok && ith == 0) coll_world_abort(p->world, d->message);
            /* The wait for what is still in flight at the end (results
             * the update or the caller reads) ends the last step, so the
             * steps still cover the schedule. */
            if (tr && last >= 0) tr[2 + 2 * last] = trace_clock(p);
            break;
        }
        if (skipped) {
            /* Another stage's node: no time, where the last step run ended
             * (a reference to its slot, which a solo step's barrier may
             * still write; executor_timeline.c resolves it). */
            if (tr && !exec_on_stage(d, t)) tr[1 + 2 * s] = tr[2 + 2 * s] = -1 - (last >= 0 ? 2 + 2 * last : 0);
            continue;
        }
        if (flying) {
            /* In flight on the communication thread: nothing to run here. */
            if (tr) tr[1 + 2 * s] = tr[2 + 2 * s] = trace_clock(p);
            last = s;
            continue;
        }
        if (solo) {
            owed = s;
            last = s;
            if (ith != 0 || atomic_load(&d->status[2]) != SPMD_OK) continue;
        }
        a.node = t;
        a.fused = grp;
        if (grp) {
            for (int j = 0; j < grp->n_in; j++) a.in[j] = data_of(d, grp->in[j]);
            for (int j = 0; j < grp->n_stored; j++) a.stored[j] = data_of(d, grp->stored[j]);
        } else
            for (int j = 0; j < t->n_in; j++) a.in[j] = data_of(d, t->in[j]);
        a.out = data_of(d, t);
        a.nth = solo ? 1 : nth;
        /* A result that failed to arrive is not computed on. */
        if (comm_ok) {
            if (grp) kern_fused(&a);
            else kern_for(t->op)(&a);
        }
        if (tr) tr[1 + 2 * s] = trace_clock(p);
        if (solo) {
            if (tr) tr[2 + 2 * s] = tr[1 + 2 * s]; /* no barrier: the next step goes on */
            continue;
        }
        rt_pool_barrier(d->pool);
        if (tr) tr[2 + 2 * s] = trace_clock(p);
        last = s;
        run++;
        if (atomic_load(a.status) != SPMD_OK) {
            /* Peers may be waiting for this device in a collective. */
            if (ith == 0 && p->world) coll_world_abort(p->world, d->message);
            break;
        }
    }
    if (c && ith == 0) exec_inflight_drain(d, issued);
}

static void device_run(void *ctx, int ith, int nth)
{
    (void)nth;
    spmd_program *p = ctx;
    rt_pool_run(p->dev[ith].pool, run_worker, &p->dev[ith]);
}

static int device_status(const device *d)
{
    int st = atomic_load(&d->status[0]);
    if (!st) st = atomic_load(&d->status[1]);
    return st ? st : atomic_load(&d->status[2]);
}

/* Every input the program reads was set for each copy run here: an input
 * never set would run as zeros, and a loss on all-zero targets looks like
 * a real one (ln V).  An input no output or update depends on is not
 * read, and need not be set. */
static spmd_status check_inputs_set(spmd_program *p)
{
    if (p->inputs_checked) return SPMD_OK;
    const spmd_graph *g = p->c.g;
    for (int i = 0; i < g->n_nodes; i++) {
        const spmd_tensor *t = g->nodes[i];
        if (t->op != IR_INPUT) continue;
        const spmd_tensor *lt = compiled_local(&p->c, t);
        /* A micro-batch reads only its own part's inputs (not "lr"). */
        const bool *reads = p->micro_run ? p->c.micro : p->c.plan.needed;
        if (!lt || !reads[lt->id]) continue;
        for (int d = 0; d < p->n_local; d++) {
            int copy = p->dev[d].copy;
            if (p->input_set[(size_t)i * (size_t)p->copies + (size_t)copy]) continue;
            const char *name = t->name ? t->name : "(unnamed)";
            if (p->copies > 1)
                return base_error(SPMD_ERR_INVALID,
                                  "run: input '%s' of copy %d was never set: "
                                  "spmd_program_set_input_copy (or spmd_program_set_input, "
                                  "for every copy) must fill it before the first run",
                                  name, copy);
            return base_error(SPMD_ERR_INVALID,
                              "run: input '%s' was never set: spmd_program_set_input must fill "
                              "it before the first run",
                              name);
        }
    }
    p->inputs_checked = !p->micro_run;
    return SPMD_OK;
}

spmd_status exec_run(spmd_program *p)
{
    spmd_status ok;
    /* GEMM is loaded here, not at compile: plans need no BLAS. */
    if (!p->blas_loaded) {
        if ((ok = blas_init(BLAS_AUTO, NULL)) != SPMD_OK) return ok;
        p->blas_loaded = true;
    }
    if ((ok = check_inputs_set(p)) != SPMD_OK) return ok;
    exec_init_pending(p);
    trace *tr = &p->trace;
    bool traced = tr->on && tr->runs < tr->room;
    if (traced) tr->run_begin[tr->runs] = trace_clock(p);
    for (int d = 0; d < p->n_local; d++) {
        atomic_store(&p->dev[d].status[0], SPMD_OK);
        atomic_store(&p->dev[d].status[1], SPMD_OK);
        atomic_store(&p->dev[d].status[2], SPMD_OK);
        p->dev[d].message[0] = '\0';
        if (p->dev[d].comm) {
            dev_comm *c = p->dev[d].comm;
            c->base = atomic_load(&c->done.value);
            atomic_store(&c->failed, false);
            c->message[0] = '\0';
        }
        p->dev[d].trace_row = traced ? tr->times + ((size_t)tr->runs * (size_t)p->n_local +
                                                    (size_t)d) * trace_stride(p)
                                     : NULL;
    }
    if (p->n_local > 1) rt_pool_run(p->outer, device_run, p);
    else rt_pool_run(p->dev[0].pool, run_worker, &p->dev[0]);
    /* Report the device that failed first-hand, not one that only saw
     * the abort of a collective. */
    int failed = -1;
    for (int d = 0; d < p->n_local; d++) {
        int st = device_status(&p->dev[d]);
        if (!st) continue;
        if (st != SPMD_ERR_BACKEND) {
            failed = d;
            break;
        }
        if (failed < 0) failed = d;
    }
    if (p->world) coll_world_reset(p->world);
    if (failed < 0) {
        exec_update(p);
        if (traced) {
            tr->run_end[tr->runs] = trace_clock(p);
            tr->micro[tr->runs++] = p->micro_run;
        }
        return SPMD_OK;
    }
    const device *dv = &p->dev[failed];
    int st = device_status(dv);
    if (p->c.n_dev > 1) return base_error((spmd_status)st, "device %d: %s", dv->id, dv->message);
    return base_error((spmd_status)st, "%s", dv->message);
}
