/*
 * Collectives in flight (docs/DESIGN.md, "Runtime"): each device's
 * communication thread runs the collectives the plan puts in flight
 * (plan.n_async), and the device's threads hand them over and wait for
 * their results.
 */
#include "runtime/executor_impl.h"
#include "base/error.h"

#include <stdio.h>
#include <string.h>

/* The communication thread mostly sleeps: it spins briefly for the next
 * hand-over.  A compute thread waiting for a result spins as the pool's
 * threads do, since the result is often a moment away. */
static const rt_wait_spin COMM_IDLE_SPIN = {.pauses = 256, .yields = 0};
static const rt_wait_spin COMM_IDLE_SPIN_CROWDED = {.pauses = 16, .yields = 0};
static const rt_wait_spin COMM_BUSY_SPIN = {.pauses = 2048, .yields = 0};
static const rt_wait_spin COMM_BUSY_SPIN_CROWDED = {.pauses = 16, .yields = 2};

/* Run the collective of number `seq` on the communication thread: the
 * same kernel thread 0 runs for a step of its own. */
static void comm_run(dev_comm *c, uint32_t seq)
{
    device *d = c->d;
    spmd_program *p = d->prog;
    const plan *pl = &p->c.plan;
    int k = c->queue[seq % (uint32_t)pl->n_async];
    const spmd_tensor *t = pl->steps[pl->async_step[k]];
    char message[sizeof c->message];
    message[0] = '\0';
    _Atomic int st = SPMD_OK;
    kern_args a = {0};
    a.node = t;
    a.in[0] = data_of(d, t->in[0]);
    a.out = data_of(d, t);
    a.nth = 1;
    a.status = &st;
    a.message = message;
    a.message_size = sizeof message;
    a.dev = &d->kd;
    int64_t *tr = d->trace_row;
    if (tr) tr[inflight_slot(p, k)] = trace_clock(p);
    kern_for(t->op)(&a);
    if (tr) tr[inflight_slot(p, k) + 1] = trace_clock(p);
    int outcome = atomic_load(&st);
    if (outcome != SPMD_OK) {
        bool first = false;
        if (atomic_compare_exchange_strong(&c->failed, &first, true)) {
            snprintf(c->message, sizeof c->message, "%s", message);
            /* Peers may wait in later collectives for this device. */
            coll_world_abort(p->world, message);
        }
    }
    atomic_store(&c->status[k], outcome);
}

static void *comm_main(void *arg)
{
    dev_comm *c = arg;
    uint32_t next = atomic_load(&c->done.value);
    for (;;) {
        uint32_t issued = atomic_load(&c->issued.value);
        if (issued == next) issued = rt_wait_while(&c->idle, &c->issued, next);
        if (atomic_load(&c->quit)) break;
        for (; next != issued; next++) {
            comm_run(c, next);
            atomic_store(&c->done.value, next + 1);
            rt_wait_notify(&c->busy, &c->done);
        }
    }
    return NULL;
}

spmd_status exec_comm_start(spmd_program *p, device *d)
{
    int n = p->c.plan.n_async;
    dev_comm *c = base_calloc(&p->alloc, sizeof *c, "communication thread");
    if (!c) return SPMD_ERR_NOMEM;
    d->comm = c;
    c->d = d;
    c->queue = base_calloc(&p->alloc, (size_t)n * sizeof *c->queue, "communication thread");
    c->status = base_calloc(&p->alloc, (size_t)n * sizeof *c->status, "communication thread");
    if (!c->queue || !c->status) return SPMD_ERR_NOMEM;
    rt_wait_word_init(&c->issued, 0);
    rt_wait_word_init(&c->done, 0);
    atomic_init(&c->quit, false);
    atomic_init(&c->failed, false);
    /* Every thread of the process that takes part: compute and communication. */
    int threads = p->n_local * (p->c.nth + 1);
    rt_wait_init(&c->idle, threads, COMM_IDLE_SPIN, COMM_IDLE_SPIN_CROWDED);
    rt_wait_init(&c->busy, threads, COMM_BUSY_SPIN, COMM_BUSY_SPIN_CROWDED);
    if (pthread_create(&c->thread, NULL, comm_main, c) != 0) {
        rt_wait_destroy(&c->idle);
        rt_wait_destroy(&c->busy);
        return base_error(SPMD_ERR_NOMEM, "compile: cannot start device %d's communication thread",
                          d->id);
    }
    c->started = true;
    return SPMD_OK;
}

void exec_comm_stop(spmd_program *p, device *d)
{
    dev_comm *c = d->comm;
    if (!c) return;
    if (c->started) {
        atomic_store(&c->quit, true);
        atomic_fetch_add(&c->issued.value, 1);
        rt_wait_wake(&c->idle, &c->issued);
        pthread_join(c->thread, NULL);
        rt_wait_destroy(&c->idle);
        rt_wait_destroy(&c->busy);
    }
    base_free(&p->alloc, c->queue);
    base_free(&p->alloc, (void *)c->status);
    base_free(&p->alloc, c);
    d->comm = NULL;
}

spmd_status exec_inflight_build(spmd_program *p)
{
    const plan *pl = &p->c.plan;
    inflight *f = &p->fly;
    int n = pl->n_async, ns = pl->n_steps;
    f->wait_off = base_calloc(&p->alloc, (size_t)(ns + 2) * sizeof *f->wait_off, "schedule");
    f->wait_list = base_alloc(&p->alloc, (size_t)n * sizeof *f->wait_list, "schedule");
    f->micro_rank = base_alloc(&p->alloc, (size_t)n * sizeof *f->micro_rank, "schedule");
    int *at = base_alloc(&p->alloc, (size_t)(ns + 1) * sizeof *at, "schedule");
    if (!f->wait_off || !f->wait_list || !f->micro_rank || !at) {
        base_free(&p->alloc, at);
        return SPMD_ERR_NOMEM;
    }
    for (int k = 0; k < n; k++) f->wait_off[pl->wait_at[k] + 1]++;
    for (int s = 0; s <= ns; s++) f->wait_off[s + 1] += f->wait_off[s];
    memcpy(at, f->wait_off, (size_t)(ns + 1) * sizeof *at);
    for (int k = 0; k < n; k++) f->wait_list[at[pl->wait_at[k]]++] = k;
    base_free(&p->alloc, at);
    for (int k = 0; k < n; k++) {
        const spmd_tensor *t = pl->steps[pl->async_step[k]];
        f->micro_rank[k] = !p->c.micro || p->c.micro[t->id] ? f->n_micro++ : -1;
    }
    return SPMD_OK;
}

void exec_inflight_free(spmd_program *p)
{
    base_free(&p->alloc, p->fly.wait_off);
    base_free(&p->alloc, p->fly.wait_list);
    base_free(&p->alloc, p->fly.micro_rank);
}

bool exec_inflight_wait(device *d, int s, int ith, _Atomic int *status)
{
    spmd_program *p = d->prog;
    dev_comm *c = d->comm;
    bool ok = true;
    for (int i = p->fly.wait_off[s]; i < p->fly.wait_off[s + 1]; i++) {
        int k = p->fly.wait_list[i], rank = inflight_rank(p, k);
        if (rank < 0) continue;
        int64_t *tr = ith == 0 ? d->trace_row : NULL;
        if (tr) tr[inflight_slot(p, k) + 2] = trace_clock(p);
        uint32_t want = c->base + (uint32_t)rank + 1, v = atomic_load(&c->done.value);
        while ((int32_t)(v - want) < 0) v = rt_wait_while(&c->busy, &c->done, v);
        if (tr) tr[inflight_slot(p, k) + 3] = trace_clock(p);
        if (atomic_load(&c->status[k]) == SPMD_OK) continue;
        ok = false;
        int expected = SPMD_OK;
        if (ith == 0 && atomic_compare_exchange_strong(status, &expected, atomic_load(&c->status[k])))
            snprintf(d->message, sizeof d->message, "%s", c->message);
    }
    return ok;
}

void exec_inflight_issue(device *d, int k, uint32_t *issued)
{
    spmd_program *p = d->prog;
    dev_comm *c = d->comm;
    int rank = inflight_rank(p, k);
    if (rank < 0) return;
    uint32_t seq = c->base + (uint32_t)rank;
    c->queue[seq % (uint32_t)p->c.plan.n_async] = k;
    atomic_store(&c->issued.value, seq + 1);
    rt_wait_notify(&c->idle, &c->issued);
    (*issued)++;
}

void exec_inflight_drain(device *d, uint32_t issued)
{
    dev_comm *c = d->comm;
    uint32_t want = c->base + issued, v = atomic_load(&c->done.value);
    while ((int32_t)(v - want) < 0) v = rt_wait_while(&c->busy, &c->done, v);
}
