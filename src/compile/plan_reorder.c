/*
 * The schedule with collectives in flight: a list schedule that moves a
 * collective, and the elementwise steps feeding it, up to the
 * computation it reads.
 */
#include "compile/plan_impl.h"
#include "base/error.h"

#include <string.h>

/* Heap of step indices, smallest key first: urgent steps before the
 * others, each kind in creation order. */
typedef struct heap {
    int *at, n;
    const bool *urgent;
    const int64_t *key; /* per step, smaller first after urgency; NULL: none */
} heap;

static bool heap_less(const heap *h, int a, int b)
{
    if (h->urgent[a] != h->urgent[b]) return h->urgent[a];
    if (h->key && h->key[a] != h->key[b]) return h->key[a] < h->key[b];
    return a < b;
}

static void heap_push(heap *h, int x)
{
    int i = h->n++;
    while (i > 0 && heap_less(h, x, h->at[(i - 1) / 2])) {
        h->at[i] = h->at[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->at[i] = x;
}

static int heap_pop(heap *h)
{
    int top = h->at[0], x = h->at[--h->n], i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && heap_less(h, h->at[c + 1], h->at[c])) c++;
        if (!heap_less(h, h->at[c], x)) break;
        h->at[i] = h->at[c];
        i = c;
    }
    if (h->n) h->at[i] = x;
    return top;
}

/* With collectives in flight the schedule is no longer the creation order
 * alone: a collective whose operand comes out of a computation (a
 * gradient, through the optimizer's elementwise steps on it) is moved up,
 * with those elementwise steps, to just after that computation, so that
 * it runs while the rest of the pass computes (the optimizer's steps that
 * read its result stay where they were).  Every other step keeps its
 * place: a list schedule that takes the urgent steps first and the others
 * in creation order, which with no urgent step is the creation order.
 * Only the order changes, never what a step computes: the same bits. */
spmd_status plan_reorder(plan *p, const spmd_graph *g, const fusion *fu, const int64_t *priority)
{
    int n = g->n_nodes, ns = p->n_steps;
    size_t nn = (size_t)(n ? n : 1), nsz = (size_t)(ns ? ns : 1);
    int *prod = base_alloc(&p->alloc, nn * sizeof *prod, "schedule");
    int *deg = base_calloc(&p->alloc, (nsz + 1) * sizeof *deg, "schedule");
    int *off = base_calloc(&p->alloc, (nsz + 2) * sizeof *off, "schedule");
    bool *urgent = base_calloc(&p->alloc, nsz * sizeof *urgent, "schedule");
    int *stack = base_alloc(&p->alloc, nsz * sizeof *stack, "schedule");
    spmd_tensor **order = base_alloc(&p->alloc, nsz * sizeof *order, "schedule");
    int *succ = NULL, *heap_at = NULL;
    spmd_status st = prod && deg && off && urgent && stack && order ? SPMD_OK : SPMD_ERR_NOMEM;
    if (st == SPMD_OK) plan_step_of_storage(p, g, fu, prod);
    /* Edges producer -> reader, counted, then listed (CSR). */
    for (int s = 0; st == SPMD_OK && s < ns; s++) {
        const spmd_tensor *const *in;
        int n_in = reads(p->steps[s], fu, &in);
        for (int j = 0; j < n_in; j++) {
            int q = prod[p->storage[in[j]->id]];
            if (q >= 0 && q != s) off[q + 1]++, deg[s]++;
        }
    }
    if (st == SPMD_OK) {
        for (int s = 0; s < ns; s++) off[s + 1] += off[s];
        succ = base_alloc(&p->alloc, (size_t)(off[ns] ? off[ns] : 1) * sizeof *succ, "schedule");
        heap_at = base_alloc(&p->alloc, nsz * sizeof *heap_at, "schedule");
        if (!succ || !heap_at) st = SPMD_ERR_NOMEM;
    }
    if (st == SPMD_OK) {
        int *fill = stack; /* borrowed as each list's fill point */
        for (int s = 0; s < ns; s++) fill[s] = off[s];
        for (int s = 0; s < ns; s++) {
            const spmd_tensor *const *in;
            int n_in = reads(p->steps[s], fu, &in);
            for (int j = 0; j < n_in; j++) {
                int q = prod[p->storage[in[j]->id]];
                if (q >= 0 && q != s) succ[fill[q]++] = s;
            }
        }
        /* Urgent: a collective in flight and the elementwise steps
         * between it and a computation (not a leaf: a parameter's
         * gather is prefetched by the plan instead). */
        for (int c = 0; c < ns; c++) {
            const spmd_tensor *t = p->steps[c];
            if (!ir_op_may_fly(t->op)) continue;
            int x = prod[p->storage[t->in[0]->id]];
            if (x < 0 || urgent[x]) {
                urgent[c] = x >= 0;
                continue;
            }
            int top = 0, chain = 0;
            bool computed = false;
            stack[top++] = x;
            while (top > 0 && chain < 64) {
                int y = stack[--top];
                const spmd_tensor *u = p->steps[y];
                if (!elementwise(u, fu) || ir_op_is_collective(u->op)) {
                    computed = true;
                    continue;
                }
                chain++;
                const spmd_tensor *const *in;
                int n_in = reads(u, fu, &in);
                for (int j = 0; j < n_in && top < ns; j++) {
                    int q = prod[p->storage[in[j]->id]];
                    if (q >= 0) stack[top++] = q;
                }
            }
            if (!computed) continue;
            urgent[c] = true;
            /* Mark the chain (walked again, now that it qualifies). */
            top = 0;
            stack[top++] = x;
            while (top > 0) {
                int y = stack[--top];
                const spmd_tensor *u = p->steps[y];
                if (urgent[y] || !elementwise(u, fu) || ir_op_is_collective(u->op)) continue;
                urgent[y] = true;
                const spmd_tensor *const *in;
                int n_in = reads(u, fu, &in);
                for (int j = 0; j < n_in && top < ns; j++) {
                    int q = prod[p->storage[in[j]->id]];
                    if (q >= 0) stack[top++] = q;
                }
            }
        }
        int64_t *key = NULL;
        if (priority && !(key = base_alloc(&p->alloc, nsz * sizeof *key, "schedule"))) st = SPMD_ERR_NOMEM;
        for (int s = 0; key && s < ns; s++) key[s] = priority[p->steps[s]->id];
        heap h = {heap_at, 0, urgent, key};
        for (int s = 0; s < ns; s++)
            if (deg[s] == 0) heap_push(&h, s);
        int done = 0;
        while (h.n > 0) {
            int s = heap_pop(&h);
            order[done++] = p->steps[s];
            for (int e = off[s]; e < off[s + 1]; e++)
                if (--deg[succ[e]] == 0) heap_push(&h, succ[e]);
        }
        if (st == SPMD_OK && done != ns)
            st = base_error(SPMD_ERR_INTERNAL, "plan: %d of %d steps could be ordered", done, ns);
        else if (st == SPMD_OK)
            memcpy(p->steps, order, nsz * sizeof *order);
        base_free(&p->alloc, key);
    }
    base_free(&p->alloc, prod);
    base_free(&p->alloc, deg);
    base_free(&p->alloc, off);
    base_free(&p->alloc, urgent);
    base_free(&p->alloc, stack);
    base_free(&p->alloc, order);
    base_free(&p->alloc, succ);
    base_free(&p->alloc, heap_at);
    return st;
}
