/*
 * Reports on a compiled program (docs/DESIGN.md, "Explain"): the
 * collectives the partitioner inserted, in program order, and the
 * whole-tensor gathers (fallbacks) an op forced, the collectives in
 * flight and an unsettled propagation.  The public spmd_program_*
 * reports and explain.c read these.
 */
#ifndef SPMD_COMPILE_REPORT_H
#define SPMD_COMPILE_REPORT_H

#include "compile/compiled.h"
#include "spmd/mesh.h"

int compiled_collective_count(const compiled *c);
spmd_status compiled_collective(const compiled *c, int i, spmd_collective_info *out);
int compiled_fallback_count(const compiled *c);
/* "h.0.attn.qkv [4, 40, 288] gathered whole for reshape#57 (forward)". */
spmd_status compiled_fallback(const compiled *c, int i, char *buf, size_t size);
/* Collectives in flight per step; *bytes: the most of their operands and
 * results in flight at once per device; *arena_extra: how much larger the
 * arena is for them (spmd_program_overlap).  Either may be NULL. */
int compiled_overlap(const compiled *c, size_t *bytes, size_t *arena_extra);
/* 0, or the rounds propagation ran without settling
 * (spmd_program_propagation_unsettled). */
int compiled_propagation_unsettled(const compiled *c);

#endif
