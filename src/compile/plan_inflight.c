/*
 * Collectives in flight (plan.h, docs/DESIGN.md, "Schedule and memory
 * plan"): which collectives run on the device's communication thread, and
 * where each is handed over and waited for.
 */
#include "compile/plan_impl.h"
#include "base/error.h"

/* One collective of the schedule, for plan_schedule_async. */
typedef struct coll_item {
    int s;     /* its step */
    int ready; /* the step after its operand's producer (0: a leaf) */
    int read;  /* where its result is first read (n_steps: not on the device) */
    int key;   /* its place in the hand-over order */
    int64_t bytes; /* its operand's and result's, held from hand-over to wait */
    bool fly;
} coll_item;

/* The bytes in flight at step s (no earlier than the last hand-over) of
 * the first k collectives handed over, held[j] each: those waited for
 * after s.  Only the last `depth` can be: the count bound had each
 * earlier one waited for by the hand-over `depth` after it. */
static int64_t flying_at(const plan *p, const int64_t *held, int k, int depth, int s)
{
    int64_t sum = 0;
    for (int j = k > depth ? k - depth : 0; j < k; j++)
        if (p->wait_at[j] > s) sum += held[j];
    return sum;
}

/* Start and wait steps for the collectives in hand-over order `it`
 * (n of them), into held[] their bytes in hand-over order.  False where
 * the order cannot keep `depth` in flight, or `budget` bytes (a
 * collective would have to start where one that must be waited for
 * first starts): the caller then hands them over in schedule order,
 * where each collective's latest start is its own step, after every
 * earlier one's start. */
static bool schedule_in_order(plan *p, const coll_item *it, int n, int depth, int64_t budget,
                              int64_t *held)
{
    int k = 0, not_before = 0, last_start = 0;
    for (int i = 0; i < n; i++) {
        if (!it[i].fly) {
            for (int j = 0; j < k; j++)
                if (p->wait_at[j] > it[i].s) p->wait_at[j] = it[i].s;
            not_before = it[i].s + 1;
            continue;
        }
        /* At its own step at the latest, and no later than any collective
         * handed over after it. */
        int latest = it[i].s;
        for (int j = i + 1; j < n; j++)
            if (it[j].s < latest) latest = it[j].s;
        int start = it[i].ready > last_start ? it[i].ready : last_start;
        if (start < not_before) start = not_before;
        if (k >= depth && start < p->wait_at[k - depth]) start = p->wait_at[k - depth];
        /* The byte budget: later, until enough of what flies is waited for. */
        int64_t room = budget - it[i].bytes;
        while (start < latest && flying_at(p, held, k, depth, start) > room) {
            int next = latest;
            for (int j = k > depth ? k - depth : 0; j < k; j++)
                if (p->wait_at[j] > start && p->wait_at[j] < next) next = p->wait_at[j];
            start = next;
        }
        if (start > latest) start = latest;
        if (k >= depth && p->wait_at[k - depth] > start) {
            if (start <= p->start_at[k - depth]) return false;
            p->wait_at[k - depth] = start;
        }
        /* Still no room at its latest start: the earliest handed over are
         * waited for there (the thread runs them first). */
        for (int j = k > depth ? k - depth : 0; j < k && flying_at(p, held, k, depth, start) > room; j++) {
            if (p->wait_at[j] <= start) continue;
            if (start <= p->start_at[j]) return false;
            p->wait_at[j] = start;
        }
        held[k] = it[i].bytes;
        p->async_step[k] = it[i].s;
        p->start_at[k] = start;
        p->wait_at[k] = it[i].read;
        p->async_of[it[i].s] = k;
        last_start = start;
        k++;
    }
    p->n_async = k;
    return true;
}

/* When each collective is handed over and waited for (plan.h).  Every
 * device hands them over in one order, the plan's, and its communication
 * thread runs them in it.  That order is the schedule order, except that
 * an all-gather (a parameter's) is handed over as soon as the all-gather
 * `depth` - 1 places before it in the schedule is first read, or a
 * nearer one where those between would exceed the byte budget: a
 * prefetch, ahead of the gradients' reductions of the layers between (in
 * schedule order, the backward pass's next gather would queue behind this
 * layer's reduce-scatter and be waited for at once), but never past a
 * collective that stays a step.  A collective may start once its operand
 * is written (the step after its producer), no earlier than the one
 * before it, only when the one `depth` places before it has been waited
 * for, and only when its operand and result fit the budget beside those
 * in flight; it starts at its own step at the latest (and no later than
 * any handed over after it), and the ones in its way are then waited for
 * there.  It is waited for where its result is first read.  A collective
 * that cannot gain (its operand written just before it, its result read
 * just after), or whose operand and result alone exceed the budget, stays
 * a step of its own; every collective before it is waited for by then,
 * and none after it starts before it. */
spmd_status plan_schedule_async(plan *p, const spmd_graph *g, const fusion *fu, int depth,
                                size_t budget_bytes, const bool *written_in_place)
{
    int n = g->n_nodes, ns = p->n_steps;
    size_t nn = (size_t)(n ? n : 1), nsz = (size_t)(ns ? ns : 1);
    int *prod = base_alloc(&p->alloc, nn * sizeof *prod, "memory plan");
    int *first_read = base_alloc(&p->alloc, nn * sizeof *first_read, "memory plan");
    coll_item *it = base_alloc(&p->alloc, nsz * sizeof *it, "memory plan");
    /* held: each one's bytes in hand-over order; first, each all-gather's. */
    int64_t *held = base_alloc(&p->alloc, nsz * sizeof *held, "memory plan");
    p->async_of = base_alloc(&p->alloc, nsz * sizeof *p->async_of, "memory plan");
    p->async_step = base_alloc(&p->alloc, nsz * sizeof *p->async_step, "memory plan");
    p->start_at = base_alloc(&p->alloc, nsz * sizeof *p->start_at, "memory plan");
    p->wait_at = base_alloc(&p->alloc, nsz * sizeof *p->wait_at, "memory plan");
    if (!prod || !first_read || !it || !held || !p->async_of || !p->async_step || !p->start_at ||
        !p->wait_at) {
        base_free(&p->alloc, prod);
        base_free(&p->alloc, first_read);
        base_free(&p->alloc, it);
        base_free(&p->alloc, held);
        return SPMD_ERR_NOMEM;
    }
    int64_t budget = budget_bytes > (size_t)INT64_MAX ? INT64_MAX : (int64_t)budget_bytes;
    plan_step_of_storage(p, g, fu, prod);
    for (int i = 0; i < n; i++) first_read[i] = -1;
    for (int s = 0; s < ns; s++) p->async_of[s] = -1;
    /* The first step that reads each storage on the device's threads.  A
     * collective that may fly reads on the communication thread, after
     * every collective before it: a reduce-scatter read only by the
     * all-reduce after it (a 2D mesh's gradient) need not be waited for
     * by the device (if that reader stays a step of its own, it is
     * waited for there, as every collective before one is). */
    for (int s = 0; s < ns; s++) {
        if (ir_op_may_fly(p->steps[s]->op)) continue;
        const spmd_tensor *const *in;
        int n_in = reads(p->steps[s], fu, &in);
        for (int j = 0; j < n_in; j++) {
            int src = p->storage[in[j]->id];
            if (first_read[src] < 0) first_read[src] = s;
        }
    }
    int m = 0, not_before = 0, leaves = 0; /* leaves: the all-gathers so far */
    int *leaf_read = first_read; /* reused: where the all-gathers so far are first read */
    int64_t *leaf_bytes = held;  /* and their bytes */
    for (int s = 0; s < ns; s++) {
        const spmd_tensor *t = p->steps[s];
        if (!ir_op_is_collective(t->op)) continue;
        const spmd_tensor *x = t->in[0];
        coll_item c;
        c.s = s;
        c.ready = prod[p->storage[x->id]] + 1; /* 0 for a leaf */
        c.read = first_read[t->id] < 0 ? ns : first_read[t->id];
        c.bytes = (int64_t)(ir_nbytes(t) + ir_nbytes(x));
        c.fly = ir_op_may_fly(t->op) && !written_in_place[x->id] && (c.ready < s || c.read > s + 1) &&
                c.bytes <= budget;
        c.key = s;
        it[m++] = c;
    }
    /* The hand-over keys of the all-gathers (a parameter's: prefetches). */
    for (int i = 0; i < m; i++) {
        coll_item *c = &it[i];
        if (!c->fly) {
            not_before = c->s + 1;
            continue;
        }
        if (p->steps[c->s]->op != IR_ALL_GATHER) continue;
        /* Handed over where the w-th gather before it is first read: w
         * gathers, itself among them, then fly at once, at most depth - 1
         * (a place left for a reduction) and the budget's bytes. */
        int w = 1;
        int64_t sum = c->bytes;
        while (w < depth - 1 && w <= leaves && leaf_bytes[leaves - w] <= budget - sum)
            sum += leaf_bytes[leaves - w++];
        int key = leaves >= w ? leaf_read[leaves - w] : 0;
        if (key < not_before) key = not_before;
        if (key < c->ready) key = c->ready;
        if (key < c->key) c->key = key;
        leaf_bytes[leaves] = c->bytes;
        leaf_read[leaves++] = c->read;
    }
    /* Stable insertion sort by key (the schedule order among equals;
     * a step of its own keeps its place: no key crosses it). */
    for (int i = 1; i < m; i++) {
        coll_item c = it[i];
        int j = i;
        for (; j > 0 && it[j - 1].key > c.key; j--) it[j] = it[j - 1];
        it[j] = c;
    }
    if (!schedule_in_order(p, it, m, depth, budget, held)) {
        for (int s = 0; s < ns; s++) p->async_of[s] = -1;
        for (int i = 1; i < m; i++) {
            coll_item c = it[i];
            int j = i;
            for (; j > 0 && it[j - 1].s > c.s; j--) it[j] = it[j - 1];
            it[j] = c;
        }
        for (int i = 0; i < m; i++) it[i].key = it[i].s;
        if (!schedule_in_order(p, it, m, depth, budget, held)) {
            base_free(&p->alloc, prod);
            base_free(&p->alloc, first_read);
            base_free(&p->alloc, it);
            base_free(&p->alloc, held);
            return base_error(SPMD_ERR_INTERNAL, "plan: no order of the collectives in flight");
        }
    }
    base_free(&p->alloc, it);
    base_free(&p->alloc, held);
    int k = p->n_async;
    p->overlap_depth = depth;
    p->inflight_budget = budget_bytes;
    /* A collective whose result another one in flight reads is done by
     * the time that one is (the thread runs them in order): waited for no
     * later, so that its operand is not kept longer. */
    for (int j = k - 1; j >= 0; j--) {
        const spmd_tensor *t = p->steps[p->async_step[j]];
        int q = prod[p->storage[t->in[0]->id]];
        int c = q >= 0 ? p->async_of[q] : -1;
        if (c >= 0 && p->wait_at[c] > p->wait_at[j]) p->wait_at[c] = p->wait_at[j];
    }
    base_free(&p->alloc, prod);
    base_free(&p->alloc, first_read);
    /* The most operand and result bytes in flight at once. */
    int64_t *delta = base_calloc(&p->alloc, (nsz + 1) * sizeof *delta, "memory plan");
    if (!delta) return SPMD_ERR_NOMEM;
    for (int j = 0; j < k; j++) {
        const spmd_tensor *t = p->steps[p->async_step[j]];
        if (p->start_at[j] >= p->wait_at[j])
            return base_error(SPMD_ERR_INTERNAL, "plan: collective %s#%d waited for at step %d, "
                              "before it starts at %d", ir_op_name(t->op), t->id, p->wait_at[j],
                              p->start_at[j]);
        int64_t bytes = (int64_t)(ir_nbytes(t) + ir_nbytes(t->in[0]));
        delta[p->start_at[j]] += bytes;
        delta[p->wait_at[j]] -= bytes;
    }
    int64_t now = 0;
    for (int s = 0; s <= ns; s++) {
        now += delta[s];
        if ((size_t)now > p->inflight_bytes) p->inflight_bytes = (size_t)now;
    }
    base_free(&p->alloc, delta);
    if (p->inflight_bytes > budget_bytes)
        return base_error(SPMD_ERR_INTERNAL, "plan: %zu bytes in flight at once, over the budget of %zu",
                          p->inflight_bytes, budget_bytes);
    return SPMD_OK;
}
