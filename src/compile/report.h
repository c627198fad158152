/*
 * Reports on a compiled program (docs/DESIGN.md, "Explain"): the
 * collectives the partitioner inserted, in program order, and the
 * whole-tensor gathers (fallbacks) an op forced.  The public
 * spmd_program_collective and spmd_program_fallback read these.
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

#endif
