/*
 * oneDNN's matmul as a GEMM backend, next to the CBLAS libraries of
 * blas.c: f32 x f32 -> f32, and bf16 x bf16 -> f32 or bf16 with f32
 * accumulation.  libdnnl is loaded with dlopen on first use, like the
 * BLAS, so a library built with oneDNN's headers still runs (on its CBLAS
 * backends) where libdnnl is not installed; one built without the headers
 * (libdnnl-dev absent) has no oneDNN backend and says so.  It builds
 * against oneDNN 2.x or 3.x, whichever headers are installed (onednn.c).
 *
 * Threads: Debian's oneDNN runs on OpenMP.  libspmd's device workers split
 * every GEMM themselves (kernels_matmul.c), so each call holds the calling
 * thread's OpenMP thread count at one while oneDNN runs (and puts the
 * caller's back after): a call runs entirely on the calling thread, and
 * the cores are never oversubscribed by OpenMP teams on top of the
 * workers.  A primitive is made once per
 * product shape (and alpha, beta, data types) and kept, since making one
 * costs far more than running it at the executor's tile sizes.
 */
#ifndef SPMD_RUNTIME_ONEDNN_H
#define SPMD_RUNTIME_ONEDNN_H

#include "spmd/spmd.h"

typedef enum onednn_type { ONEDNN_F32 = 0, ONEDNN_BF16 = 1 } onednn_type;

/* Load libdnnl once (thread-safe); false if it cannot be, with the reason
 * in onednn_why_not(). */
bool onednn_available(void);
/* "libspmd was built without oneDNN (...)" or "cannot load libdnnl.so.2, ...:
 * ..."; "" when available. */
const char *onednn_why_not(void);
/* "oneDNN 2.6.3 (avx512_core_bf16)": version and the instruction set its
 * kernels use here. */
const char *onednn_name(void);
/* Whether that instruction set computes bf16 natively (AVX512_BF16 or
 * AMX), as oneDNN reports it; without, oneDNN emulates bf16 slowly. */
bool onednn_bf16_native(void);

/* Row-major C = alpha * op(A) op(B) + beta * C, op = transpose if set.
 * A and B are both f32 or both bf16; C is f32, or bf16 with bf16 inputs.
 * m, n > 0, k > 0.  Runs on the calling thread.  A shape oneDNN has no
 * kernel for returns SPMD_ERR_UNSUPPORTED, with C untouched. */
spmd_status onednn_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                        const void *a, int64_t lda, const void *b, int64_t ldb, float beta,
                        void *c, int64_t ldc, onednn_type in, onednn_type out);

/* The oneDNN implementation that runs that product ("brg:avx512_core"),
 * for benchmarks; NULL if none. */
const char *onednn_gemm_impl(bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                             onednn_type in, onednn_type out);

#endif
