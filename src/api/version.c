/*
 * The library's version: CMake's project version, given to this file
 * alone as SPMD_VERSION_STRING.
 */
#include "spmd/spmd.h"

#ifndef SPMD_VERSION_STRING
#error "the build must define SPMD_VERSION_STRING (CMakeLists.txt)"
#endif

const char *spmd_version(void) { return SPMD_VERSION_STRING; }
