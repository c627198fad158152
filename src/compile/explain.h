/*
 * The text of `spmd explain` for a compiled program (docs/DESIGN.md,
 * "Explain"), made here once for every caller: the spmd tool and the
 * Python package print it; spmd_program_explain returns it.
 */
#ifndef SPMD_COMPILE_EXPLAIN_H
#define SPMD_COMPILE_EXPLAIN_H

#include "compile/compiled.h"
#include "spmd/mesh.h"

/* The report of compiled program c as one malloc'd text in *text (see
 * spmd_program_explain); o may be NULL. */
spmd_status compiled_explain(const compiled *c, const spmd_explain_options *o, char **text);

#endif
