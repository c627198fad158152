/*
 * Reports, read from the compiled program (a plan-only one too).
 */
#include "runtime/executor_impl.h"
#include "compile/explain.h"
#include "compile/report.h"

size_t spmd_program_arena_bytes(const spmd_program *p) { return p ? p->c.plan.arena_bytes : 0; }
size_t spmd_program_held_bytes(const spmd_program *p) { return p ? p->c.plan.held_bytes : 0; }
size_t spmd_program_persistent_bytes(const spmd_program *p) { return p ? compiled_persistent_bytes(&p->c) : 0; }
int spmd_program_devices(const spmd_program *p) { return p ? p->c.n_dev : 0; }
int spmd_program_processes(const spmd_program *p) { return p ? p->processes : 0; }
int spmd_program_copies(const spmd_program *p) { return p ? (p->copies ? p->copies : 1) : 0; }
int spmd_program_process(const spmd_program *p) { return p ? p->process : 0; }
size_t spmd_program_allocated_bytes(const spmd_program *p) { return p ? p->allocated : 0; }

size_t executor_device_allocated(const spmd_program *p, int local)
{
    return p && p->dev && local >= 0 && local < p->n_local ? p->dev[local].allocated : 0;
}

int spmd_program_local_devices(const spmd_program *p, int *first)
{
    if (first) *first = p ? p->first : 0;
    return p ? p->n_local : 0;
}
size_t spmd_program_param_bytes(const spmd_program *p) { return p ? compiled_param_bytes(&p->c) : 0; }
size_t spmd_program_peak_bytes(const spmd_program *p) { return p ? compiled_peak_bytes(&p->c) : 0; }

int spmd_program_collective_count(const spmd_program *p)
{
    return p ? compiled_collective_count(&p->c) : 0;
}

spmd_status spmd_program_collective(const spmd_program *p, int i, spmd_collective_info *out)
{
    return compiled_collective(p ? &p->c : NULL, i, out);
}

int spmd_program_overlap(const spmd_program *p, size_t *bytes, size_t *arena_extra)
{
    return compiled_overlap(p ? &p->c : NULL, bytes, arena_extra);
}

size_t spmd_program_inflight_budget(const spmd_program *p)
{
    return p ? p->c.plan.inflight_budget : 0;
}

int spmd_program_fallback_count(const spmd_program *p)
{
    return p ? compiled_fallback_count(&p->c) : 0;
}

spmd_status spmd_program_fallback(const spmd_program *p, int i, char *buf, size_t size)
{
    return compiled_fallback(p ? &p->c : NULL, i, buf, size);
}

int spmd_program_propagation_unsettled(const spmd_program *p)
{
    return compiled_propagation_unsettled(p ? &p->c : NULL);
}

spmd_status spmd_program_explain(const spmd_program *p, const spmd_explain_options *o, char **text)
{
    return compiled_explain(p ? &p->c : NULL, o, text);
}

const compiled *executor_compiled(const spmd_program *p) { return p ? &p->c : NULL; }

const partition *executor_partition(const spmd_program *p)
{
    return p && p->c.partitioned ? &p->c.part : NULL;
}
