/*
 * A program's life: spmd_compile compiles the graph in the compile layer
 * (compile_graph: the compiled plan, all a plan-only program holds), then
 * sets up this process's devices to run it; spmd_program_free.  The
 * world of collectives comes first: it says which devices run here,
 * among which the compile shares the threads.
 */
#include "runtime/executor_impl.h"
#include "base/error.h"
#include "spmd/mesh.h"

#include <limits.h>

/* The options' numbers, refused in the words of the tool's flags ("NAME
 * wants ... from MIN to MAX, got V"), never wrapped or taken as the
 * default: a negative thread count or a NaN timeout is a mistake. */
static spmd_status check_options(const spmd_compile_options *o)
{
    if (o->threads < 0)
        return base_error(SPMD_ERR_INVALID,
                          "compile: threads wants an integer from 0 (every core) to %d, got %d",
                          INT_MAX, o->threads);
    double t = o->collective_timeout_s;
    if (!(t >= -SPMD_COLLECTIVE_TIMEOUT_MAX_S && t <= SPMD_COLLECTIVE_TIMEOUT_MAX_S))
        return base_error(SPMD_ERR_INVALID,
                          "compile: collective_timeout_s wants a number from %g to %g (included), "
                          "got %g",
                          -SPMD_COLLECTIVE_TIMEOUT_MAX_S, SPMD_COLLECTIVE_TIMEOUT_MAX_S, t);
    return SPMD_OK;
}

spmd_program *spmd_compile(spmd_graph *g, const spmd_compile_options *opts)
{
    if (!g) {
        base_error(SPMD_ERR_INVALID, "compile: graph is NULL");
        return NULL;
    }
    if (opts && check_options(opts) != SPMD_OK) return NULL;
    spmd_program *p = base_calloc(&g->alloc, sizeof *p, "program");
    if (!p) return NULL;
    p->alloc = g->alloc;
    p->seed = opts ? opts->seed : 0;
    bool plan_only = opts && opts->plan_only;
    const void *comm = opts && !plan_only ? opts->mpi_comm : NULL;
    int n_dev = g->mesh ? spmd_mesh_devices(g->mesh) : 1;
    p->n_local = n_dev;
    p->processes = 1;
    p->copies = spmd_mesh_copies(g->mesh);
    /* The world first: it says which devices run here, and the threads
     * are shared among those. */
    if (!plan_only && (g->mesh || comm)) {
        p->world = coll_world_create(n_dev, comm, &p->alloc);
        if (!p->world) goto fail;
        coll_world_set_timeout(p->world, opts ? opts->collective_timeout_s : 0);
        coll_world_local(p->world, &p->first, &p->n_local, NULL);
        p->processes = n_dev / p->n_local;
        p->process = p->first / p->n_local;
    }
    compile_options how = {
        .threads = opts ? opts->threads : 0,
        .devices_here = p->n_local,
        .fuse = !(opts && opts->unfused),
        .overlap = opts && opts->overlap,
        .inflight_bytes = opts ? opts->inflight_bytes : 0,
        .one_f_one_b = opts && opts->schedule == SPMD_SCHEDULE_1F1B,
    };
    if (compile_graph(&p->c, g, &how) != SPMD_OK) goto fail;
    /* A plan-only program (explain) stops here: no devices, no BLAS. */
    if (plan_only) return p;
    if (exec_setup_devices(p, opts) != SPMD_OK) goto fail;
    p->input_set = base_calloc(&p->alloc, (size_t)(g->n_nodes ? g->n_nodes : 1) *
                                              (size_t)p->copies * sizeof *p->input_set,
                               "program inputs");
    if (!p->input_set) goto fail;
    /* Groups that cross processes get their communicators (every process
     * asked for all of its groups above). */
    if (p->world && coll_world_connect(p->world) != SPMD_OK) goto fail;
    if (p->c.plan.n_async) {
        if (exec_inflight_build(p) != SPMD_OK) goto fail;
        for (int d = 0; d < p->n_local; d++)
            if (exec_comm_start(p, &p->dev[d]) != SPMD_OK) goto fail;
    }
    if (p->n_local > 1) {
        p->outer = rt_pool_create(p->n_local, &p->alloc);
        if (!p->outer) goto fail;
    }
    if (exec_init_params(p) != SPMD_OK) goto fail;
    return p;

fail:
    spmd_program_free(p);
    return NULL;
}

void spmd_program_free(spmd_program *p)
{
    if (!p) return;
    if (p->outer) rt_pool_free(p->outer);
    exec_free_devices(p);
    base_free(&p->alloc, p->input_set);
    base_free(&p->alloc, p->init_pending);
    exec_inflight_free(p);
    exec_trace_free(p);
    if (p->world) coll_world_free(p->world);
    compiled_free(&p->c);
    spmd_allocator a = p->alloc;
    base_free(&a, p);
}

spmd_status executor_check_runnable(const spmd_program *p, const char *what)
{
    if (!p) return base_error(SPMD_ERR_INVALID, "%s: program is NULL", what);
    if (!p->dev)
        return base_error(SPMD_ERR_INVALID, "%s: the program was compiled with plan_only", what);
    return SPMD_OK;
}
