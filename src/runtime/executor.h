/*
 * Internal access to the compiled program behind a runnable one, for tests
 * (the public reports of spmd/mesh.h read the same object).
 */
#ifndef SPMD_RUNTIME_EXECUTOR_H
#define SPMD_RUNTIME_EXECUTOR_H

#include "compile/compiled.h"

const compiled *executor_compiled(const spmd_program *p);
/* The partition behind a multi-device program; NULL on one device. */
const partition *executor_partition(const spmd_program *p);

#endif
