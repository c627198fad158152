/*
 * Internal access to a compiled program, for reports (explain) and tests:
 * the partition behind a multi-device program.
 */
#ifndef SPMD_RUNTIME_EXECUTOR_H
#define SPMD_RUNTIME_EXECUTOR_H

#include "shard/partition.h"

/* NULL for a one-device program. */
const partition *executor_partition(const spmd_program *p);

#endif
