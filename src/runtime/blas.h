/*
 * The CBLAS GEMM backend (gemm.h chooses between it and oneDNN):
 * OpenBLAS (or BLIS, or any CBLAS library file) loaded at run time, so
 * the library can pick a kernel that fits the CPU before the BLAS library
 * initialises (Debian's OpenBLAS otherwise detects some AVX-512 CPUs as
 * older cores and runs several times slower).  Loaded when
 * a program first runs (or the user chooses one), never to compile, so
 * plans and reports work on a machine without BLAS.
 */
#ifndef SPMD_RUNTIME_BLAS_H
#define SPMD_RUNTIME_BLAS_H

#include "spmd/spmd.h"

typedef enum blas_library {
    BLAS_AUTO = 0,  /* OpenBLAS with a fitting core type, else BLIS */
    BLAS_OPENBLAS,
    BLAS_BLIS,
    BLAS_FILE       /* the CBLAS library file spmd_blas_select named */
} blas_library;

/* Load the library once (thread-safe); later calls return the first
 * result.  `coretype` is an OpenBLAS core name ("SkylakeX") or NULL for
 * detection.  BLAS threading is set to 1: the executor splits GEMMs. */
spmd_status blas_init(blas_library lib, const char *coretype);

/* Row-major C = alpha * op(A) op(B) + beta * C, op = transpose if set;
 * loads the BLAS first if need be.  A product it refuses (a size past the
 * 32-bit CBLAS interface, no BLAS to load) returns that error, with its
 * message, before touching any matrix: C is left as it was. */
spmd_status blas_sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                       const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                       float *c, int64_t ldc);

/* spmd_blas_prepare: loads the library if need be and, with OpenBLAS,
 * makes the GEMM buffer its first product would map (room checked as
 * the gate checks it); *mapped the bytes the library mapped, measured,
 * *more what did not fit on failure (either may be NULL). */
spmd_status blas_prepare(size_t *mapped, size_t *more);

/* "OpenBLAS 0.3.21 (SkylakeX)" or "BLIS 0.9.0". */
const char *blas_name(void);
/* The library loaded as spmd_blas_select names it: "openblas", "blis" or
 * the file's path ("auto" before any loaded). */
const char *blas_library_key(void);

/* Choose and load the CBLAS library by name ("auto", "openblas", "blis",
 * or a path holding a '/'); refused once one is loaded.  gemm_select
 * parses the rest of spmd_blas_select's choice. */
spmd_status blas_select(const char *library, const char *coretype);

#endif
