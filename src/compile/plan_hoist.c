/*
 * Gradient accumulation's schedule: each accumulator's sum moved up to
 * the gradient it reads, so that the gradient dies there.
 */
#include "compile/plan_impl.h"

#include <stdlib.h>
#include <string.h>

/* A step's place after plan_hoist_sums: after step `major`, sums (by their
 * own step, `minor`) after the step itself (-1), members in step order. */
typedef struct hoisted {
    int major, minor, s;
} hoisted;

static int hoisted_cmp(const void *x, const void *y)
{
    const hoisted *a = x, *b = y;
    if (a->major != b->major) return a->major < b->major ? -1 : 1;
    if (a->minor != b->minor) return a->minor < b->minor ? -1 : 1;
    return (a->s > b->s) - (a->s < b->s);
}

/* Whether step t is an accumulator's sum (an update value computed in
 * place may be another's). */
static bool accumulator_sum(const plan *p, const spmd_graph *g, const spmd_tensor *t)
{
    return p->in_place[t->id] >= 0 && g->nodes[p->in_place[t->id]]->accumulator;
}

/* Gradient accumulation: each accumulator's sum (plan.in_place) runs
 * right after the last step it reads, its gradient's, so that the
 * gradient dies there instead of at the end of the backward pass, where
 * the optimizer's creation order puts every sum (and where a step without
 * accumulation holds all its gradients for the update).  A sum moves up
 * with its members, the elementwise steps that only it reads (unfused:
 * acc * keep and grad / K), in their order; one that reads only leaves,
 * or another sum, stays.  Only the order changes, never a step's
 * arithmetic.  *moved: whether any sum moved. */
spmd_status plan_hoist_sums(plan *p, const spmd_graph *g, const fusion *fu, bool *moved)
{
    int n = g->n_nodes, ns = p->n_steps;
    *moved = false;
    bool any = false;
    for (int s = 0; s < ns && !any; s++) any = accumulator_sum(p, g, p->steps[s]);
    if (!any) return SPMD_OK;
    size_t nn = (size_t)(n ? n : 1), nsz = (size_t)(ns ? ns : 1);
    int *prod = base_alloc(&p->alloc, nn * sizeof *prod, "schedule");
    int *readers = base_calloc(&p->alloc, nn * sizeof *readers, "schedule");
    int *seen = base_alloc(&p->alloc, nn * sizeof *seen, "schedule");
    int *sum_of = base_alloc(&p->alloc, nsz * sizeof *sum_of, "schedule"); /* -1: no sum's member */
    int *after = base_alloc(&p->alloc, nsz * sizeof *after, "schedule");  /* a sum's place */
    int *stack = base_alloc(&p->alloc, nsz * sizeof *stack, "schedule");
    hoisted *order = base_alloc(&p->alloc, nsz * sizeof *order, "schedule");
    spmd_tensor **steps = base_alloc(&p->alloc, nsz * sizeof *steps, "schedule");
    spmd_status st = prod && readers && seen && sum_of && after && stack && order && steps
                         ? SPMD_OK
                         : SPMD_ERR_NOMEM;
    if (st == SPMD_OK) {
        plan_step_of_storage(p, g, fu, prod);
        for (int i = 0; i < n; i++) seen[i] = -1;
        for (int s = 0; s < ns; s++) sum_of[s] = after[s] = -1;
        /* The steps reading each storage (each step once); outputs and
         * update values are read after the run as well. */
        for (int s = 0; s < ns; s++) {
            const spmd_tensor *const *in;
            int n_in = reads(p->steps[s], fu, &in);
            for (int j = 0; j < n_in; j++) {
                int src = p->storage[in[j]->id];
                if (seen[src] != s) seen[src] = s, readers[src]++;
            }
        }
        for (int i = 0; i < n; i++)
            if (p->needed[i] && g->nodes[i]->is_output) readers[p->storage[i]] = n;
        for (int i = 0; i < g->n_updates; i++) readers[p->storage[g->updates[i].value->id]] = n;
        /* Each sum's members, back from it; the latest other step they
         * read is the sum's place. */
        for (int r = 0; r < ns; r++) {
            if (!accumulator_sum(p, g, p->steps[r])) continue;
            int top = 0;
            sum_of[r] = r;
            stack[top++] = r;
            while (top > 0) {
                const spmd_tensor *const *in;
                int n_in = reads(p->steps[stack[--top]], fu, &in);
                for (int j = 0; j < n_in; j++) {
                    int src = p->storage[in[j]->id], q = prod[src];
                    if (q < 0 || sum_of[q] == r) continue;
                    const spmd_tensor *u = p->steps[q];
                    const fuse_group *grp = fusion_group(fu, u);
                    if (sum_of[q] < 0 && elementwise(u, fu) && !ir_op_is_collective(u->op) && src == u->id &&
                        readers[src] == 1 && !(grp && (grp->sum || grp->n_stored))) {
                        sum_of[q] = r;
                        stack[top++] = q;
                    } else if (q > after[r]) {
                        after[r] = q;
                    }
                }
            }
        }
        for (int r = 0; r < ns; r++)
            if (sum_of[r] == r && after[r] >= 0 && sum_of[after[r]] >= 0) after[r] = -1;
        for (int s = 0; s < ns; s++) {
            int r = sum_of[s] >= 0 && after[sum_of[s]] >= 0 ? sum_of[s] : -1;
            order[s] = r < 0 ? (hoisted){s, -1, s} : (hoisted){after[r], r, s};
            *moved |= r == s;
        }
        qsort(order, (size_t)ns, sizeof *order, hoisted_cmp);
        for (int s = 0; s < ns; s++) steps[s] = p->steps[order[s].s];
        memcpy(p->steps, steps, nsz * sizeof *steps);
    }
    base_free(&p->alloc, prod);
    base_free(&p->alloc, readers);
    base_free(&p->alloc, seen);
    base_free(&p->alloc, sum_of);
    base_free(&p->alloc, after);
    base_free(&p->alloc, stack);
    base_free(&p->alloc, order);
    base_free(&p->alloc, steps);
    return st;
}
