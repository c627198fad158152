/*
 * The oneDNN matmul backend (see onednn.h): libdnnl loaded with dlopen,
 * one primitive per product shape in a cache, executed on the calling
 * thread with a per-thread stream and scratchpad.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "runtime/onednn.h"

#include "base/error.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef SPMD_HAVE_ONEDNN

bool onednn_available(void) { return false; }
const char *onednn_why_not(void)
{
    return "libspmd was built without oneDNN (its headers, libdnnl-dev, not found, or "
           "SPMD_ONEDNN=OFF)";
}
const char *onednn_name(void) { return "no oneDNN"; }
bool onednn_bf16_native(void) { return false; }
spmd_status onednn_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                        const void *a, int64_t lda, const void *b, int64_t ldb, float beta,
                        void *c, int64_t ldc, onednn_type in, onednn_type out)
{
    (void)ta, (void)tb, (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)lda, (void)b;
    (void)ldb, (void)beta, (void)c, (void)ldc, (void)in, (void)out;
    return base_error(SPMD_ERR_UNSUPPORTED, "oneDNN: %s", onednn_why_not());
}
const char *onednn_gemm_impl(bool ta, bool tb, int64_t m, int64_t n, int64_t k, onednn_type in,
                             onednn_type out)
{
    (void)ta, (void)tb, (void)m, (void)n, (void)k, (void)in, (void)out;
    return NULL;
}

#else

#include <dlfcn.h>
#include <oneapi/dnnl/dnnl.h>

/* Two C APIs: oneDNN 2.x (Debian 12) and 3.x (Debian 13), chosen when the
 * library is built by the major version its headers declare, so a binary
 * loads the library of the headers it was built against (the SONAME CMake
 * read from them) and checks its major version before using it.  3.0
 * made memory descriptors opaque handles (created and destroyed, not
 * initialised in place), dropped the op descriptors for direct
 * primitive-descriptor creation, and replaced output scales by per-argument
 * scales given at execution.  The helpers below ("md_", "matmul_pd_make",
 * "attr_set_alpha", "post_ops_sum") are the only places that differ. */
#define ONEDNN_V3 (DNNL_VERSION_MAJOR >= 3)

#define ONEDNN_STR2(x) #x
#define ONEDNN_STR(x) ONEDNN_STR2(x)
#ifndef ONEDNN_SONAME
#define ONEDNN_SONAME "libdnnl.so." ONEDNN_STR(DNNL_VERSION_MAJOR)
#endif

/* The oneDNN calls used, looked up by name in the loaded library. */
#define ONEDNN_CALLS_COMMON(X)                                                                 \
    X(dnnl_engine_create)                                                                      \
    X(dnnl_stream_create)                                                                      \
    X(dnnl_stream_destroy)                                                                     \
    X(dnnl_memory_desc_get_size)                                                               \
    X(dnnl_memory_create)                                                                      \
    X(dnnl_memory_destroy)                                                                     \
    X(dnnl_primitive_attr_create)                                                              \
    X(dnnl_primitive_attr_destroy)                                                             \
    X(dnnl_primitive_attr_set_scratchpad_mode)                                                 \
    X(dnnl_primitive_attr_set_post_ops)                                                        \
    X(dnnl_post_ops_create)                                                                    \
    X(dnnl_post_ops_destroy)                                                                   \
    X(dnnl_post_ops_append_sum)                                                                \
    X(dnnl_primitive_desc_destroy)                                                             \
    X(dnnl_primitive_desc_query)                                                               \
    X(dnnl_primitive_desc_query_md)                                                            \
    X(dnnl_primitive_create)                                                                   \
    X(dnnl_primitive_destroy)                                                                  \
    X(dnnl_primitive_execute)                                                                  \
    X(dnnl_get_effective_cpu_isa)                                                              \
    X(dnnl_version)
#if ONEDNN_V3
#define ONEDNN_CALLS(X)                                                                        \
    ONEDNN_CALLS_COMMON(X)                                                                     \
    X(dnnl_memory_desc_create_with_strides)                                                    \
    X(dnnl_memory_desc_destroy)                                                                \
    X(dnnl_matmul_primitive_desc_create)                                                       \
    X(dnnl_primitive_attr_set_scales_mask)
#else
#define ONEDNN_CALLS(X)                                                                        \
    ONEDNN_CALLS_COMMON(X)                                                                     \
    X(dnnl_memory_desc_init_by_strides)                                                        \
    X(dnnl_matmul_desc_init)                                                                   \
    X(dnnl_primitive_attr_set_output_scales)                                                   \
    X(dnnl_primitive_desc_create)
#endif

#define DECLARE(fn) static __typeof__(fn) *p_##fn;
ONEDNN_CALLS(DECLARE)
#undef DECLARE
/* From the OpenMP runtime oneDNN links. */
static void (*p_omp_set_num_threads)(int n);
static int (*p_omp_get_max_threads)(void);

static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_bool load_done;
static bool loaded;
static char why_not[512];
static char name[96] = "no oneDNN";
static bool native_bf16;
static dnnl_engine_t engine;

static const char *isa_name(dnnl_cpu_isa_t isa)
{
    switch ((int)isa) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
#if ONEDNN_V3
    case dnnl_cpu_isa_avx512_core_fp16: return "avx512_core_fp16";
    case dnnl_cpu_isa_avx512_core_amx_fp16: return "avx512_core_amx_fp16";
#else
    case dnnl_cpu_isa_avx512_mic: return "avx512_mic";
    case dnnl_cpu_isa_avx512_mic_4ops: return "avx512_mic_4ops";
#endif
    default: return NULL;
    }
}

static void do_load(void)
{
    void *h = dlopen(ONEDNN_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *err = dlerror();
        snprintf(why_not, sizeof why_not,
                 "cannot load %s, the oneDNN %d.x that libspmd was built for: %s "
                 "(apt-get install libdnnl-dev brings it)",
                 ONEDNN_SONAME, DNNL_VERSION_MAJOR, err ? err : "unknown error");
        return;
    }
#define LOOKUP(fn)                                                                             \
    if (!(p_##fn = (__typeof__(fn) *)dlsym(h, #fn))) {                                         \
        snprintf(why_not, sizeof why_not, "%s has no %s", ONEDNN_SONAME, #fn);                 \
        dlclose(h);                                                                            \
        return;                                                                                \
    }
    ONEDNN_CALLS(LOOKUP)
#undef LOOKUP
    /* Found through libdnnl's own dependencies (libgomp for Debian's
     * build); a build on another threading runtime has none, and then
     * nothing needs setting. */
    p_omp_set_num_threads = (void (*)(int))dlsym(h, "omp_set_num_threads");
    p_omp_get_max_threads = (int (*)(void))dlsym(h, "omp_get_max_threads");
    if (!p_omp_get_max_threads) p_omp_set_num_threads = NULL;
    /* Another major version under this name has another ABI: refuse it
     * before calling anything else. */
    const dnnl_version_t *v = p_dnnl_version();
    if (v->major != DNNL_VERSION_MAJOR) {
        snprintf(why_not, sizeof why_not, "%s is oneDNN %d.%d.%d, but libspmd was built for %d.x",
                 ONEDNN_SONAME, v->major, v->minor, v->patch, DNNL_VERSION_MAJOR);
        dlclose(h);
        return;
    }
    if (p_dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success) {
        snprintf(why_not, sizeof why_not, "%s: no CPU engine", ONEDNN_SONAME);
        dlclose(h);
        return;
    }
    dnnl_cpu_isa_t isa = p_dnnl_get_effective_cpu_isa();
    /* The ISA values are bit sets: every level includes the ones below. */
    native_bf16 = ((unsigned)isa & (unsigned)dnnl_cpu_isa_avx512_core_bf16) ==
                  (unsigned)dnnl_cpu_isa_avx512_core_bf16;
    const char *isa_str = isa_name(isa);
    if (isa_str)
        snprintf(name, sizeof name, "oneDNN %d.%d.%d (%s)", v->major, v->minor, v->patch, isa_str);
    else
        snprintf(name, sizeof name, "oneDNN %d.%d.%d (isa 0x%x)", v->major, v->minor, v->patch,
                 (unsigned)isa);
    loaded = true; /* the handle stays open for the life of the process */
}

bool onednn_available(void)
{
    if (!atomic_load_explicit(&load_done, memory_order_acquire)) {
        pthread_mutex_lock(&load_lock);
        if (!atomic_load_explicit(&load_done, memory_order_relaxed)) {
            do_load();
            atomic_store_explicit(&load_done, true, memory_order_release);
        }
        pthread_mutex_unlock(&load_lock);
    }
    return loaded;
}

const char *onednn_why_not(void) { return onednn_available() ? "" : why_not; }
const char *onednn_name(void) { return onednn_available() ? name : "no oneDNN"; }
bool onednn_bf16_native(void) { return onednn_available() && native_bf16; }

/* ---- Per-thread state --------------------------------------------------- */

typedef struct thread_state {
    dnnl_stream_t stream;
    void *scratch;
    size_t scratch_size;
} thread_state;

static pthread_key_t state_key;
static pthread_once_t state_once = PTHREAD_ONCE_INIT;

static void state_free(void *p)
{
    thread_state *s = p;
    if (s->stream) p_dnnl_stream_destroy(s->stream);
    free(s->scratch);
    free(s);
}

static void state_key_make(void) { pthread_key_create(&state_key, state_free); }

/* The calling thread's OpenMP team size held at one while oneDNN runs
 * (see onednn.h), and then put back, so that a caller's own OpenMP work
 * on the same thread (a host application, PyTorch) keeps its setting.
 * Returns the size to put back, or 0 for nothing to do. */
static int omp_hold_one(void)
{
    if (!p_omp_set_num_threads) return 0;
    int before = p_omp_get_max_threads();
    if (before == 1) return 0;
    p_omp_set_num_threads(1);
    return before;
}

static void omp_release(int before)
{
    if (before) p_omp_set_num_threads(before);
}

/* This thread's stream, made on its first call. */
static thread_state *thread_get(void)
{
    pthread_once(&state_once, state_key_make);
    thread_state *s = pthread_getspecific(state_key);
    if (s) return s;
    if (!(s = calloc(1, sizeof *s))) return NULL;
    if (p_dnnl_stream_create(&s->stream, engine, dnnl_stream_default_flags) != dnnl_success ||
        pthread_setspecific(state_key, s) != 0) {
        state_free(s);
        return NULL;
    }
    return s;
}

static void *thread_scratch(thread_state *s, size_t size)
{
    if (size <= s->scratch_size) return s->scratch;
    void *p = aligned_alloc(64, (size + 63) / 64 * 64);
    if (!p) return NULL;
    free(s->scratch);
    s->scratch = p;
    s->scratch_size = size;
    return p;
}

/* ---- Where the two APIs differ ------------------------------------------ */

#if ONEDNN_V3
typedef dnnl_memory_desc_t md_t; /* a handle */
#define MD(x) (x)
#else
typedef dnnl_memory_desc_t md_t; /* a struct, initialised in place */
#define MD(x) (&(x))
#endif

static bool md_make(md_t *md, int ndims, const dnnl_dims_t dims, dnnl_data_type_t dt,
                    const dnnl_dims_t strides)
{
#if ONEDNN_V3
    *md = NULL;
    return p_dnnl_memory_desc_create_with_strides(md, ndims, dims, dt, strides) == dnnl_success;
#else
    return p_dnnl_memory_desc_init_by_strides(md, ndims, dims, dt, strides) == dnnl_success;
#endif
}

static void md_free(md_t md)
{
#if ONEDNN_V3
    if (md) p_dnnl_memory_desc_destroy(md);
#else
    (void)md;
#endif
}

static bool matmul_pd_make(dnnl_primitive_desc_t *pd, const md_t *a, const md_t *b,
                           const md_t *c, dnnl_primitive_attr_t attr)
{
#if ONEDNN_V3
    return p_dnnl_matmul_primitive_desc_create(pd, engine, *a, *b, NULL, *c, attr) ==
           dnnl_success;
#else
    dnnl_matmul_desc_t desc;
    return p_dnnl_matmul_desc_init(&desc, a, b, NULL, c) == dnnl_success &&
           p_dnnl_primitive_desc_create(pd, &desc, attr, engine, NULL) == dnnl_success;
#endif
}

/* alpha scales the product before the sum post-op: 2.x's output scale
 * fixed in the primitive, 3.x's scale of the source argument given at
 * execution (exec_alpha_arg). */
static bool attr_set_alpha(dnnl_primitive_attr_t attr, float alpha)
{
#if ONEDNN_V3
    (void)alpha;
    return p_dnnl_primitive_attr_set_scales_mask(attr, DNNL_ARG_SRC, 0) == dnnl_success;
#else
    return p_dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha) == dnnl_success;
#endif
}

static bool post_ops_sum(dnnl_post_ops_t ops, float beta)
{
#if ONEDNN_V3
    return p_dnnl_post_ops_append_sum(ops, beta, 0, dnnl_data_type_undef) == dnnl_success;
#else
    return p_dnnl_post_ops_append_sum(ops, beta) == dnnl_success;
#endif
}

/* ---- Primitives, one per product -------------------------------------- */

typedef struct prim_key {
    int64_t m, n, k, lda, ldb, ldc;
    uint32_t alpha, beta; /* bit patterns */
    uint8_t ta, tb, in, out;
} prim_key;

typedef struct prim_entry {
    prim_key key;
    dnnl_primitive_t prim;
    md_t a_md, b_md, c_md;
    md_t scratch_md, alpha_md; /* when scratch_size > 0; with 3.x's alpha != 1 */
    float alpha;
    size_t scratch_size;
    char impl[48];
} prim_entry;

static void prim_free(prim_entry *e)
{
    if (!e) return;
    if (e->prim) p_dnnl_primitive_destroy(e->prim);
    md_free(e->a_md);
    md_free(e->b_md);
    md_free(e->c_md);
    md_free(e->scratch_md);
    md_free(e->alpha_md);
    free(e);
}

/* Enough for every tile and attention shape of a model; past it a
 * primitive is made, run and dropped (the same kernel, just slower). */
enum { CACHE_SLOTS = 4096 };
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static prim_entry *cache[CACHE_SLOTS];
static int cache_used;

static uint64_t key_hash(const prim_key *k)
{
    const unsigned char *p = (const unsigned char *)k;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof *k; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static dnnl_data_type_t dt_of(onednn_type t) { return t == ONEDNN_BF16 ? dnnl_bf16 : dnnl_f32; }

/* Make the primitive for `key` into `e` (zeroed); false if oneDNN has
 * none. */
static bool prim_make(const prim_key *key, prim_entry *e)
{
    e->key = *key;
    const dnnl_dims_t a_dims = {key->m, key->k}, b_dims = {key->k, key->n},
                      c_dims = {key->m, key->n};
    /* op(A)[i, l] = A[i*lda + l], or transposed A[l*lda + i]. */
    const dnnl_dims_t a_str = {key->ta ? 1 : key->lda, key->ta ? key->lda : 1};
    const dnnl_dims_t b_str = {key->tb ? 1 : key->ldb, key->tb ? key->ldb : 1};
    const dnnl_dims_t c_str = {key->ldc, 1};
    dnnl_data_type_t in = dt_of((onednn_type)key->in), out = dt_of((onednn_type)key->out);
    if (!md_make(&e->a_md, 2, a_dims, in, a_str) || !md_make(&e->b_md, 2, b_dims, in, b_str) ||
        !md_make(&e->c_md, 2, c_dims, out, c_str))
        return false;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t ops = NULL;
    dnnl_primitive_desc_t pd = NULL;
    bool ok = p_dnnl_primitive_attr_create(&attr) == dnnl_success &&
              p_dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) ==
                  dnnl_success;
    float beta;
    memcpy(&e->alpha, &key->alpha, sizeof e->alpha);
    memcpy(&beta, &key->beta, sizeof beta);
    if (ok && e->alpha != 1.0f) {
        ok = attr_set_alpha(attr, e->alpha);
#if ONEDNN_V3
        const dnnl_dims_t one = {1}, unit = {1};
        ok = ok && md_make(&e->alpha_md, 1, one, dnnl_f32, unit);
#endif
    }
    if (ok && beta != 0.0f)
        ok = p_dnnl_post_ops_create(&ops) == dnnl_success && post_ops_sum(ops, beta) &&
             p_dnnl_primitive_attr_set_post_ops(attr, ops) == dnnl_success;
    ok = ok && matmul_pd_make(&pd, &e->a_md, &e->b_md, &e->c_md, attr);
    if (ok) {
        __typeof__(p_dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0)) sp =
            p_dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
        e->scratch_size = sp ? p_dnnl_memory_desc_get_size(sp) : 0;
        if (e->scratch_size) {
            const dnnl_dims_t sp_dims = {(dnnl_dim_t)e->scratch_size}, sp_str = {1};
            ok = md_make(&e->scratch_md, 1, sp_dims, dnnl_u8, sp_str);
        }
        const char *impl = NULL;
        p_dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
        snprintf(e->impl, sizeof e->impl, "%s", impl ? impl : "?");
        ok = ok && p_dnnl_primitive_create(&e->prim, pd) == dnnl_success;
    }
    if (pd) p_dnnl_primitive_desc_destroy(pd);
    if (ops) p_dnnl_post_ops_destroy(ops);
    if (attr) p_dnnl_primitive_attr_destroy(attr);
    return ok;
}

/* The cached primitive for `key`, made if new.  *own is set when the
 * cache is full and the caller must free the entry after use. */
static prim_entry *prim_get(const prim_key *key, bool *own)
{
    *own = false;
    uint64_t h = key_hash(key);
    pthread_mutex_lock(&cache_lock);
    size_t slot = h % CACHE_SLOTS;
    for (int probe = 0; probe < CACHE_SLOTS; probe++, slot = (slot + 1) % CACHE_SLOTS) {
        prim_entry *e = cache[slot];
        if (!e) break;
        if (!memcmp(&e->key, key, sizeof *key)) {
            pthread_mutex_unlock(&cache_lock);
            return e;
        }
    }
    /* Made under the lock: a shape is made once, by its first caller. */
    prim_entry *e = calloc(1, sizeof *e);
    if (e && !prim_make(key, e)) {
        prim_free(e);
        e = NULL;
    }
    if (e && cache_used < CACHE_SLOTS * 3 / 4 && !cache[slot]) {
        cache[slot] = e;
        cache_used++;
    } else if (e) {
        *own = true;
    }
    pthread_mutex_unlock(&cache_lock);
    return e;
}

static void prim_key_fill(prim_key *key, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                          float alpha, int64_t lda, int64_t ldb, float beta, int64_t ldc,
                          onednn_type in, onednn_type out)
{
    memset(key, 0, sizeof *key); /* padding too: keys are compared bytewise */
    *key = (prim_key){.m = m, .n = n, .k = k, .lda = lda, .ldb = ldb, .ldc = ldc,
                      .ta = ta, .tb = tb, .in = (uint8_t)in, .out = (uint8_t)out};
    memcpy(&key->alpha, &alpha, sizeof alpha);
    memcpy(&key->beta, &beta, sizeof beta);
}

static bool types_ok(onednn_type in, onednn_type out)
{
    return in == ONEDNN_BF16 || out == ONEDNN_F32;
}

static spmd_status gemm_held(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                             const void *a, int64_t lda, const void *b, int64_t ldb, float beta,
                             void *c, int64_t ldc, onednn_type in, onednn_type out)
{
    if (!onednn_available())
        return base_error(SPMD_ERR_UNSUPPORTED, "oneDNN: %s", why_not);
    if (!types_ok(in, out) || m <= 0 || n <= 0 || k <= 0)
        return base_error(SPMD_ERR_INVALID, "oneDNN gemm %lldx%lldx%lld: bad arguments",
                          (long long)m, (long long)n, (long long)k);
    thread_state *s = thread_get();
    if (!s) return base_error(SPMD_ERR_NOMEM, "oneDNN: no stream for this thread");
    prim_key key;
    prim_key_fill(&key, ta, tb, m, n, k, alpha, lda, ldb, beta, ldc, in, out);
    bool own;
    prim_entry *e = prim_get(&key, &own);
    if (!e)
        return base_error(SPMD_ERR_UNSUPPORTED,
                          "oneDNN has no %s matmul for %lldx%lldx%lld%s%s on this CPU (%s)",
                          in == ONEDNN_BF16 ? "bf16" : "f32", (long long)m, (long long)n,
                          (long long)k, ta ? " (A transposed)" : "", tb ? " (B transposed)" : "",
                          name);
    spmd_status st = SPMD_OK;
    void *scratch = e->scratch_size ? thread_scratch(s, e->scratch_size) : NULL;
    dnnl_memory_t ma = NULL, mb = NULL, mc = NULL, ms = NULL, mal = NULL;
    dnnl_exec_arg_t args[5];
    int nargs = 0;
    if (e->scratch_size && !scratch) {
        st = base_error(SPMD_ERR_NOMEM, "oneDNN: no %zu-byte scratchpad", e->scratch_size);
    } else if (p_dnnl_memory_create(&ma, MD(e->a_md), engine, (void *)a) != dnnl_success ||
               p_dnnl_memory_create(&mb, MD(e->b_md), engine, (void *)b) != dnnl_success ||
               p_dnnl_memory_create(&mc, MD(e->c_md), engine, c) != dnnl_success ||
               (e->scratch_size &&
                p_dnnl_memory_create(&ms, MD(e->scratch_md), engine, scratch) != dnnl_success)) {
        st = base_error(SPMD_ERR_NOMEM, "oneDNN: cannot wrap the matrices");
    } else {
        args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_SRC, ma};
        args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_WEIGHTS, mb};
        args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_DST, mc};
        if (ms) args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, ms};
#if ONEDNN_V3
        if (e->alpha_md) {
            if (p_dnnl_memory_create(&mal, e->alpha_md, engine, &e->alpha) != dnnl_success)
                st = base_error(SPMD_ERR_NOMEM, "oneDNN: cannot wrap the scale");
            args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_ATTR_SCALES | DNNL_ARG_SRC, mal};
        }
#endif
        /* An in-order CPU stream executes synchronously on this thread. */
        if (st == SPMD_OK && p_dnnl_primitive_execute(e->prim, s->stream, nargs, args) != dnnl_success)
            st = base_error(SPMD_ERR_BACKEND, "oneDNN: matmul %lldx%lldx%lld failed",
                            (long long)m, (long long)n, (long long)k);
    }
    if (mal) p_dnnl_memory_destroy(mal);
    if (ms) p_dnnl_memory_destroy(ms);
    if (mc) p_dnnl_memory_destroy(mc);
    if (mb) p_dnnl_memory_destroy(mb);
    if (ma) p_dnnl_memory_destroy(ma);
    if (own) prim_free(e);
    return st;
}

spmd_status onednn_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                        const void *a, int64_t lda, const void *b, int64_t ldb, float beta,
                        void *c, int64_t ldc, onednn_type in, onednn_type out)
{
    if (!onednn_available())
        return base_error(SPMD_ERR_UNSUPPORTED, "oneDNN: %s", why_not);
    /* Primitives are made under the same setting, so they plan for one
     * thread. */
    int before = omp_hold_one();
    spmd_status st = gemm_held(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, in, out);
    omp_release(before);
    return st;
}

const char *onednn_gemm_impl(bool ta, bool tb, int64_t m, int64_t n, int64_t k, onednn_type in,
                             onednn_type out)
{
    if (!onednn_available() || !types_ok(in, out) || !thread_get()) return NULL;
    int before = omp_hold_one();
    prim_key key;
    prim_key_fill(&key, ta, tb, m, n, k, 1.0f, ta ? m : k, tb ? k : n, 0.0f, n, in, out);
    bool own;
    prim_entry *e = prim_get(&key, &own);
    if (!e) {
        omp_release(before);
        return NULL;
    }
    static _Thread_local char impl[48];
    snprintf(impl, sizeof impl, "%s", e->impl);
    if (own) prim_free(e);
    omp_release(before);
    return impl;
}

#endif
