/*
 * The address space this process has mapped: what an address-space limit
 * (RLIMIT_AS, ulimit -v) counts, for the checks that plan against one.
 */
#ifndef SPMD_BASE_ADDRESS_SPACE_H
#define SPMD_BASE_ADDRESS_SPACE_H

#include <stddef.h>

/* Bytes mapped now (/proc/self/statm's total); 0 where /proc is missing. */
size_t base_mapped_bytes(void);

#endif
