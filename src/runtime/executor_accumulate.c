/*
 * Gradient accumulation: the micro-batches of a step
 * (spmd_program_accumulate), then its last and the update
 * (spmd_program_run).
 */
#include "runtime/executor_impl.h"
#include "base/error.h"

/* Gradient accumulation's bookkeeping before a run: the micro-batch count
 * checked, and the accumulators' keep factor fed (0 on a step's first
 * micro-batch: the sums start afresh). */
static spmd_status begin_micro_batch(spmd_program *p, bool last, const char *what)
{
    const spmd_graph *g = p->c.g;
    const int steps = g->accumulate_steps;
    if (steps <= 1) {
        if (!last)
            return base_error(SPMD_ERR_INVALID,
                              "accumulate: the program has no gradient accumulation "
                              "(spmd_optimizer.accumulate_steps is %d): spmd_program_run "
                              "runs each step", steps);
        return SPMD_OK;
    }
    if (last && p->micro_done != steps - 1)
        return base_error(SPMD_ERR_INVALID,
                          "%s: %d of the step's %d micro-batches were accumulated; "
                          "spmd_program_accumulate runs %d before spmd_program_run runs the last "
                          "and the update",
                          what, p->micro_done, steps, steps - 1);
    if (!last && p->micro_done == steps - 1)
        return base_error(SPMD_ERR_INVALID,
                          "%s: %d of the step's %d micro-batches were accumulated already; "
                          "spmd_program_run runs the last and the update",
                          what, p->micro_done, steps);
    float keep = p->micro_done == 0 ? 0.0f : 1.0f;
    exec_scatter(p, g->accumulate_keep, &keep, -1);
    exec_note_input_set(p, g->accumulate_keep, -1);
    return SPMD_OK;
}

spmd_status spmd_program_accumulate(spmd_program *p)
{
    spmd_status ok = executor_check_runnable(p, "accumulate");
    if (ok == SPMD_OK) ok = begin_micro_batch(p, false, "accumulate");
    if (ok != SPMD_OK) return ok;
    p->micro_run = true;
    ok = exec_run(p);
    p->micro_run = false;
    /* The sums are written in place: a failed micro-batch may have added
     * to some, so the step starts over. */
    p->micro_done = ok == SPMD_OK ? p->micro_done + 1 : 0;
    return ok;
}

spmd_status spmd_program_run(spmd_program *p)
{
    spmd_status ok = executor_check_runnable(p, "run");
    if (ok == SPMD_OK) ok = begin_micro_batch(p, true, "run");
    if (ok != SPMD_OK) return ok;
    ok = exec_run(p);
    p->micro_done = 0; /* done, or (failed) started over: see above */
    return ok;
}
