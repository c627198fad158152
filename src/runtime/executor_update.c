/*
 * The update phase of a run: new values into parameters and state.
 */
#include "runtime/executor_impl.h"

#include <string.h>

/* Updates: new values into parameters and state.  A second phase, run
 * only once every device finished its schedule, so a failing device
 * leaves every device's parameters as they were.  A value in a buffer of
 * its own trades buffers with its target (thread 0); the others are
 * copied (every thread a part).  Into a shared leaf each device holding
 * the block copies its part: an all-gather that lands in place
 * (plan.lands_in) its member's slice, where the gather would have put
 * it, unless the slice was computed there in the target's next buffer
 * (then each device trades its two pointers, so all do); another value
 * (the same on each) the share_rank-th part. */
static void update_worker(void *ctx, int ith, int nth)
{
    device *d = ctx;
    const spmd_program *p = d->prog;
    const spmd_graph *lg = p->c.local;
    const bool *swapped = p->c.plan.swapped;
    for (int u = 0; u < lg->n_updates; u++) {
        const ir_update *up = &lg->updates[u];
        if (p->micro_run && !up->target->accumulator) continue;
        if (!exec_on_stage(d, up->value)) continue; /* the target's home stage updates it */
        if (p->c.plan.in_place[up->value->id] >= 0) continue; /* written where it goes */
        int64_t b, e;
        if (p->c.plan.lands_in[up->value->id] >= 0) {
            const spmd_tensor *slice = up->value->in[0];
            size_t n = ir_nbytes(slice), at = (size_t)d->member[up->value->attr.coll.spec] * n;
            if (swapped[slice->id]) { /* computed in the next buffer: trade the two */
                if (ith == 0) {
                    char *now = d->leaf_data[up->target->id];
                    d->leaf_data[up->target->id] = (char *)d->leaf_data[slice->id] - at;
                    d->leaf_data[slice->id] = now + at;
                }
                continue;
            }
            kern_split((int64_t)n, ith, nth, 64, &b, &e);
            memcpy((char *)data_of(d, up->target) + at + b, (const char *)data_of(d, slice) + b,
                   (size_t)(e - b));
            continue;
        }
        if (swapped[up->value->id]) {
            if (ith == 0) {
                void *old = d->leaf_data[up->target->id];
                d->leaf_data[up->target->id] = d->leaf_data[up->value->id];
                d->leaf_data[up->value->id] = old;
            }
            continue;
        }
        int64_t lo = 0, hi = (int64_t)ir_nbytes(up->target);
        if (p->share_as && p->share_as[up->target->id] >= 0)
            kern_split(hi, d->share_rank[up->target->id], p->c.sharers[up->target->id], 64, &lo, &hi);
        kern_split(hi - lo, ith, nth, 64, &b, &e);
        memcpy((char *)data_of(d, up->target) + lo + b, (const char *)data_of(d, up->value) + lo + b,
               (size_t)(e - b));
    }
}

/* The update of device k, timed when traced (its pool's threads have all
 * returned when rt_pool_run does). */
static void update_device(spmd_program *p, int k)
{
    device *d = &p->dev[k];
    size_t n = 2 * (size_t)p->c.plan.n_steps + 1; /* after the steps' readings */
    if (d->trace_row) d->trace_row[n] = trace_clock(p);
    rt_pool_run(d->pool, update_worker, d);
    if (d->trace_row) d->trace_row[n + 1] = trace_clock(p);
}

static void device_update(void *ctx, int ith, int nth)
{
    (void)nth;
    update_device(ctx, ith);
}

void exec_update(spmd_program *p)
{
    if (p->n_local > 1) rt_pool_run(p->outer, device_update, p);
    else update_device(p, 0);
}
