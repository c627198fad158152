/*
 * The CBLAS GEMM backend (see blas.h; gemm.c chooses it or oneDNN per
 * product): OpenBLAS, or BLIS as a fallback, loaded with dlopen at run
 * time instead of linked, so that the OpenBLAS core type can be chosen
 * from CPUID before OpenBLAS's constructor runs.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* RTLD_NOLOAD, RTLD_DEFAULT, dladdr */
#endif

#include "runtime/blas.h"

#include "base/address_space.h"
#include "base/error.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

/* The CBLAS constants we use (values fixed by the CBLAS standard); cblas.h
 * is not included so no BLAS headers are needed to build. */
enum { CblasRowMajor = 101, CblasNoTrans = 111, CblasTrans = 112 };

typedef void (*cblas_sgemm_fn)(int order, int transa, int transb, int m, int n, int k,
                               float alpha, const float *a, int lda, const float *b,
                               int ldb, float beta, float *c, int ldc);
typedef void (*openblas_set_num_threads_fn)(int n);
typedef char *(*openblas_str_fn)(void);
typedef long (*bli_thread_set_num_threads_fn)(long n); /* return type unused */
typedef const char *(*bli_str_fn)(void);
typedef int (*bli_arch_query_id_fn)(void);
typedef const char *(*bli_arch_string_fn)(int id);

/* Found through the dynamic loader's search; overridable for tests. */
#ifndef OPENBLAS_SONAME
#define OPENBLAS_SONAME "libopenblas.so.0"
#endif
#ifndef BLIS_SONAME
#define BLIS_SONAME "libblis.so.4"
#endif
#define INSTALL_HINT \
    "install libopenblas0 (apt-get install libopenblas0-pthread) or BLIS (apt-get install libblis4)"

static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_bool init_done;           /* set (release) after the fields below */
static spmd_status init_status;
static char init_message[1024];         /* the failure, repeated to later callers */
static char lib_name[256] = "no BLAS loaded";
static cblas_sgemm_fn sgemm_fn;
/* OpenBLAS's own buffer calls (the gate); NULL for other libraries. */
static void *(*openblas_buffer_alloc)(int procpos);
static void (*openblas_buffer_free)(void *buffer);
/* Address space the library mapped as it loaded (the library, what it
 * needs, and what its start-up maps), measured; 0 for one loaded before. */
static size_t loaded_bytes;
/* An OpenBLAS GEMM buffer: measured when the gate makes its first one
 * (buffer_measured); until then BUFFER_SIZE as OpenBLAS's x86-64 and arm64
 * builds define it, 32 << 22 bytes (Debian's 0.3.21 and 0.3.29 alike).
 * Written under the gate's lock, or before the library loads. */
#define OPENBLAS_BUFFER_DEFAULT ((size_t)128 << 20)
static size_t buffer_bytes = OPENBLAS_BUFFER_DEFAULT;
static bool buffer_measured;

/* ---- Measuring the address space ---------------------------------------- */

/* Growth of the mapped bytes from `before`, 0 if they shrank. */
static size_t mapped_since(size_t before)
{
    size_t now = base_mapped_bytes();
    return now > before ? now - before : 0;
}

/* The address-space limit, ulimit -v, as text ("none", "0.33 GiB"). */
static const char *limit_text(char *buf, size_t size)
{
    struct rlimit as;
    if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY)
        snprintf(buf, size, "%.2f GiB", (double)as.rlim_cur / (1 << 30));
    else
        snprintf(buf, size, "none");
    return buf;
}

/* Whether `bytes` more fit in the address space: mapped for a moment, as
 * OpenBLAS maps its buffers (so overcommit rules count them too). */
static bool room_for(size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return false;
    munmap(p, bytes);
    return true;
}

/* ---- Choosing an OpenBLAS core type ----------------------------------- */

/* The OpenBLAS core name that fits this CPU, or NULL to let OpenBLAS
 * decide.  Only the cores Debian's DYNAMIC_ARCH OpenBLAS gets wrong on
 * AVX-512 machines matter; older CPUs are detected correctly. */
static const char *detect_coretype(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
#if !defined(__clang__) || __clang_major__ >= 16
    if (__builtin_cpu_supports("avx512bf16"))
        return "Cooperlake";
#endif
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return "Haswell";
#endif
    return NULL;
}

/* The names OPENBLAS_CORETYPE takes for OpenBLAS's x86-64 DYNAMIC_ARCH
 * kernels (its driver/others/dynamic.c), matched ignoring case as OpenBLAS
 * does.  OpenBLAS only warns about a name it does not know and goes by
 * CPUID, so a misspelt core would otherwise pass unnoticed.  A release may
 * not force the newest ones (Debian's 0.3.21 detects by itself instead of
 * forcing Cooperlake or SapphireRapids). */
const char *spmd_blas_core_names(void)
{
#if defined(__x86_64__)
    return "Prescott, Core2, Penryn, Dunnington, Nehalem, Atom, Nano, Opteron, Opteron_SSE3, "
           "Barcelona, Bobcat, Sandybridge, Bulldozer, Piledriver, Steamroller, Excavator, "
           "Haswell, Zen, SkylakeX, Cooperlake, SapphireRapids";
#else
    return NULL;
#endif
}

static bool is_core_name(const char *names, const char *core)
{
    size_t len = strlen(core);
    for (const char *p = names; *p; p += strspn(p, ", ")) {
        size_t n = strcspn(p, ",");
        if (n == len && !strncasecmp(p, core, len)) return true;
        p += n;
    }
    return false;
}

/* A saved environment variable, to put back exactly as it was. */
typedef struct saved_env {
    const char *name;
    char *value; /* copy of the old value; NULL if it was unset */
    bool changed;
} saved_env;

static void env_set_temporarily(saved_env *s, const char *name, const char *value)
{
    s->name = name;
    s->value = NULL;
    s->changed = false;
    const char *old = getenv(name);
    if (old) {
        s->value = strdup(old);
        if (!s->value)
            return; /* cannot restore it: leave it alone */
    }
    if (setenv(name, value, 1) == 0)
        s->changed = true;
}

static void env_restore(saved_env *s)
{
    if (s->changed) {
        if (s->value)
            setenv(s->name, s->value, 1);
        else
            unsetenv(s->name);
    }
    free(s->value);
    s->value = NULL;
    s->changed = false;
}

/* ---- Loading ------------------------------------------------------------ */

/* OpenBLAS that something else in the process already loaded (numpy, a
 * host application, the library linked by soname): use that one instead of
 * a second copy with its own thread pool and core choice. */
static void *find_loaded_openblas(void)
{
    void *h = dlopen(OPENBLAS_SONAME, RTLD_NOW | RTLD_NOLOAD);
    if (h)
        return h;
    /* Loaded under another name (e.g. as libblas.so.3): find its file. */
    void *sym = dlsym(RTLD_DEFAULT, "openblas_get_config");
    Dl_info info;
    if (sym && dladdr(sym, &info) && info.dli_fname)
        return dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
    return NULL;
}

/* dlopen `file` with OpenBLAS's start-up settings in the environment.
 *
 * Debian's OpenBLAS is built with DYNAMIC_ARCH and picks its kernels in a
 * constructor that runs inside dlopen, reading OPENBLAS_CORETYPE there and
 * never again.  On AVX-512 CPUs it can end up on an older core (by its own
 * detection, or because an environment inherited from other tools presets
 * OPENBLAS_CORETYPE), and sgemm then runs at half speed or less.
 * libspmd's configuration is explicit: the core is the caller's `coretype`
 * (the CLI's --blas-core), else the one CPUID says fits; an inherited
 * OPENBLAS_CORETYPE is overridden for the duration of dlopen only and then
 * put back as it was, so child processes and other libraries still see it.
 * OPENBLAS_NUM_THREADS=1 likewise keeps OpenBLAS from starting a thread
 * pool we never use (the executor splits GEMMs itself).  Other libraries
 * ignore both.  setenv is not thread-safe against concurrent getenv; this
 * runs once, under init_lock, normally before the executor starts threads. */
static void *open_with_openblas_env(const char *file, const char *coretype, char *why,
                                    size_t why_size)
{
    saved_env core = {0}, threads = {0};
    if (!coretype) coretype = detect_coretype();
    if (coretype)
        env_set_temporarily(&core, "OPENBLAS_CORETYPE", coretype);
    env_set_temporarily(&threads, "OPENBLAS_NUM_THREADS", "1");
    void *h = dlopen(file, RTLD_NOW | RTLD_LOCAL);
    const char *err = h ? NULL : dlerror();
    env_restore(&threads);
    env_restore(&core);
    if (!h)
        snprintf(why, why_size, "cannot load %s: %s", file, err ? err : "unknown error");
    return h;
}

/* Take cblas_sgemm from an opened library, run it single-threaded, and
 * name it: "OpenBLAS 0.3.21 (SkylakeX)", "BLIS 0.9.0 (zen3)", or
 * "CBLAS (file)" for another library. */
static spmd_status adopt(void *h, const char *file, char *why, size_t why_size)
{
    cblas_sgemm_fn gemm = (cblas_sgemm_fn)dlsym(h, "cblas_sgemm");
    if (!gemm) {
        snprintf(why, why_size, "%s has no cblas_sgemm", file);
        dlclose(h);
        return SPMD_ERR_BACKEND;
    }
    openblas_set_num_threads_fn openblas_threads =
        (openblas_set_num_threads_fn)dlsym(h, "openblas_set_num_threads");
    bli_thread_set_num_threads_fn blis_threads =
        (bli_thread_set_num_threads_fn)dlsym(h, "bli_thread_set_num_threads");
    if (openblas_threads) {
        openblas_threads(1);
        openblas_buffer_alloc = (void *(*)(int))dlsym(h, "blas_memory_alloc");
        openblas_buffer_free = (void (*)(void *))dlsym(h, "blas_memory_free");
        openblas_str_fn corename = (openblas_str_fn)dlsym(h, "openblas_get_corename");
        openblas_str_fn config = (openblas_str_fn)dlsym(h, "openblas_get_config");
        /* openblas_get_config: "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY ..." */
        char version[32] = "";
        const char *cfg = config ? config() : NULL;
        if (cfg && strncmp(cfg, "OpenBLAS ", 9) == 0)
            sscanf(cfg + 9, "%31s", version);
        const char *core = corename ? corename() : NULL;
        snprintf(lib_name, sizeof lib_name, "OpenBLAS%s%s (%s)", version[0] ? " " : "",
                 version, core && core[0] ? core : "unknown core");
    } else if (blis_threads) {
        blis_threads(1);
        bli_str_fn version = (bli_str_fn)dlsym(h, "bli_info_get_version_str");
        bli_arch_query_id_fn arch_id = (bli_arch_query_id_fn)dlsym(h, "bli_arch_query_id");
        bli_arch_string_fn arch_str = (bli_arch_string_fn)dlsym(h, "bli_arch_string");
        const char *v = version ? version() : NULL;
        const char *arch = arch_id && arch_str ? arch_str(arch_id()) : NULL;
        if (arch && arch[0])
            snprintf(lib_name, sizeof lib_name, "BLIS %s (%s)", v ? v : "", arch);
        else
            snprintf(lib_name, sizeof lib_name, "BLIS %s", v ? v : "");
    } else {
        snprintf(lib_name, sizeof lib_name, "CBLAS (%s)", file);
    }
    sgemm_fn = gemm;
    return SPMD_OK; /* the handle stays open for the life of the process */
}

/* How wide an OpenBLAS core's kernels are: 2 AVX-512, 1 AVX2, 0 older. */
static int core_width(const char *core, size_t len)
{
    static const char *const wide[] = {"SkylakeX", "Cooperlake", "SapphireRapids"};
    static const char *const avx2[] = {"Haswell", "Zen"};
    for (size_t i = 0; i < sizeof wide / sizeof *wide; i++)
        if (len == strlen(wide[i]) && !strncasecmp(core, wide[i], len)) return 2;
    for (size_t i = 0; i < sizeof avx2 / sizeof *avx2; i++)
        if (len == strlen(avx2[i]) && !strncasecmp(core, avx2[i], len)) return 1;
    return 0;
}

/* An OpenBLAS loaded before libspmd (by PyTorch or numpy, say) chose its
 * core by its own detection, which on a CPU model its release does not
 * know falls back to old kernels (OpenBLAS 0.3.21 on a Xeon of model 207:
 * Prescott, sgemm several times slower, for the host and libspmd alike).
 * Where its kernels are narrower than the CPU's, its name says which
 * core CPUID fits and how to get it. */
static void note_preloaded_core(void)
{
    const char *fits = detect_coretype(), *open = strrchr(lib_name, '(');
    if (!fits || !open) return;
    size_t len = strlen(open + 1);
    if (len < 2 || open[len] != ')') return;
    if (core_width(open + 1, len - 1) >= core_width(fits, strlen(fits))) return;
    size_t at = strlen(lib_name) - 1; /* the closing parenthesis */
    snprintf(lib_name + at, sizeof lib_name - at,
             ", loaded before libspmd; this CPU fits %s: set OPENBLAS_CORETYPE=%s before the "
             "process starts)",
             fits, fits);
}

/* OpenBLAS maps GEMM buffers as it loads (0.3.29 makes one for its own
 * thread in its constructor, inside dlopen: loading maps 170 MiB where
 * 0.3.21 maps 39), and retries a mapping that fails forever: under a
 * ulimit -v that holds the library but not the buffer, dlopen never
 * returns.  So a library that may be OpenBLAS is loaded only where twice
 * a buffer fits, as the gate makes each (the library itself inside that:
 * its first product needs as much free after it loaded). */
static spmd_status room_to_load(const char *file, char *why, size_t why_size)
{
    size_t need = 2 * buffer_bytes;
    if (room_for(need)) return SPMD_OK;
    int err = errno;
    char limit[64];
    snprintf(why, why_size,
             "no address space to load %s: OpenBLAS maps %zu MiB GEMM buffers, as it loads and for "
             "its first product, and waits forever for one that does not fit; %zu MiB do not fit "
             "(%s; address-space limit, ulimit -v: %s)",
             file, buffer_bytes >> 20, need >> 20, strerror(err), limit_text(limit, sizeof limit));
    return SPMD_ERR_NOMEM;
}

/* dlopen (through `open`) and adopt, measuring what loading mapped. */
static spmd_status load_measured(void *(*open)(const char *, const char *, char *, size_t),
                                 const char *file, const char *coretype, char *why,
                                 size_t why_size)
{
    size_t before = base_mapped_bytes();
    void *h = open(file, coretype, why, why_size);
    spmd_status st = h ? adopt(h, file, why, why_size) : SPMD_ERR_BACKEND;
    if (st == SPMD_OK) loaded_bytes = mapped_since(before);
    return st;
}

static void *open_plain(const char *file, const char *coretype, char *why, size_t why_size)
{
    (void)coretype;
    void *h = dlopen(file, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *err = dlerror();
        snprintf(why, why_size, "cannot load %s: %s", file, err ? err : "unknown error");
    }
    return h;
}

static spmd_status load_openblas(const char *coretype, char *why, size_t why_size)
{
    void *h = find_loaded_openblas();
    if (h) { /* mapped already: nothing of it to count here */
        spmd_status st = adopt(h, OPENBLAS_SONAME, why, why_size);
        if (st == SPMD_OK) note_preloaded_core();
        return st;
    }
    spmd_status st = room_to_load(OPENBLAS_SONAME, why, why_size);
    if (st != SPMD_OK) return st;
    return load_measured(open_with_openblas_env, OPENBLAS_SONAME, coretype, why, why_size);
}

static spmd_status load_blis(char *why, size_t why_size)
{
    return load_measured(open_plain, BLIS_SONAME, NULL, why, why_size);
}

/* A CBLAS library named by its file (spmd_blas_select with a path): it
 * may be OpenBLAS under another name. */
static spmd_status load_file(const char *file, const char *coretype, char *why, size_t why_size)
{
    spmd_status st = room_to_load(file, why, why_size);
    if (st != SPMD_OK) return st;
    return load_measured(open_with_openblas_env, file, coretype, why, why_size);
}

static char chosen_file[PATH_MAX]; /* BLAS_FILE: the library to load */
static const char *loaded_key = "auto"; /* what loaded: openblas, blis or chosen_file */

static spmd_status do_init(blas_library lib, const char *coretype)
{
    char why_openblas[384] = "", why_blis[256] = ""; /* messages cut long paths */
    spmd_status st;
    switch (lib) {
    case BLAS_OPENBLAS:
        if ((st = load_openblas(coretype, why_openblas, sizeof why_openblas)) == SPMD_OK)
            return loaded_key = "openblas", SPMD_OK;
        if (st == SPMD_ERR_NOMEM) break; /* installed, but no room: no hint */
        snprintf(init_message, sizeof init_message, "BLAS: %s; %s", why_openblas,
                 INSTALL_HINT);
        return SPMD_ERR_BACKEND;
    case BLAS_BLIS:
        if (load_blis(why_blis, sizeof why_blis) == SPMD_OK)
            return loaded_key = "blis", SPMD_OK;
        snprintf(init_message, sizeof init_message, "BLAS: %s; %s", why_blis, INSTALL_HINT);
        return SPMD_ERR_BACKEND;
    case BLAS_FILE:
        if ((st = load_file(chosen_file, coretype, why_openblas, sizeof why_openblas)) == SPMD_OK)
            return loaded_key = chosen_file, SPMD_OK;
        snprintf(init_message, sizeof init_message, "BLAS: %s", why_openblas);
        return st == SPMD_ERR_NOMEM ? st : SPMD_ERR_BACKEND;
    case BLAS_AUTO:
        if ((st = load_openblas(coretype, why_openblas, sizeof why_openblas)) == SPMD_OK)
            return loaded_key = "openblas", SPMD_OK;
        /* OpenBLAS that has no room is not swapped for BLIS unasked. */
        if (st == SPMD_ERR_NOMEM) break;
        if (load_blis(why_blis, sizeof why_blis) == SPMD_OK)
            return loaded_key = "blis", SPMD_OK;
        snprintf(init_message, sizeof init_message, "BLAS: %s; %s; %s", why_openblas,
                 why_blis, INSTALL_HINT);
        return SPMD_ERR_BACKEND;
    default:
        snprintf(init_message, sizeof init_message, "BLAS: unknown library choice %d", (int)lib);
        return SPMD_ERR_INVALID;
    }
    snprintf(init_message, sizeof init_message, "BLAS: %s", why_openblas);
    return SPMD_ERR_NOMEM;
}

spmd_status blas_init(blas_library lib, const char *coretype)
{
    if (!atomic_load_explicit(&init_done, memory_order_acquire)) {
        pthread_mutex_lock(&init_lock);
        if (!atomic_load_explicit(&init_done, memory_order_relaxed)) {
            init_status = do_init(lib, coretype);
            atomic_store_explicit(&init_done, true, memory_order_release);
        }
        pthread_mutex_unlock(&init_lock);
    }
    if (init_status != SPMD_OK)
        return base_error(init_status, "%s", init_message);
    return SPMD_OK;
}

/* ---- The gate: how many threads are inside BLAS at once ----------------- */

/* Every device worker thread calls BLAS, and a mesh may have thousands of
 * devices.  OpenBLAS lends each caller inside it a buffer from a table
 * sized for 128 callers (Debian's build); past that it prints "too many
 * memory regions" and a racing caller crashes on a NULL buffer.  A buffer
 * is 128 MiB of address space (buffer_bytes, measured), mapped when all
 * are in use and then kept;
 * if that mmap fails (ulimit -v), OpenBLAS retries forever.  So callers
 * pass a gate: at most GATE_PER_CPU per CPU (a few, so that one
 * descheduled inside BLAS seldom holds up the rest) and GATE_MOST in all.
 * With OpenBLAS, the gate also lets in no more callers than OpenBLAS has
 * buffers: to let in more, it waits until no caller is inside, checks that
 * the address space holds more buffers, and has OpenBLAS make them (with
 * its own blas_memory_alloc), so OpenBLAS never maps one during a call.
 * Each product is still one call with the same arguments, so no result
 * changes. */
enum { GATE_PER_CPU = 4, GATE_MOST = 64 };

static struct {
    /* The places: callers inside in the low half, callers let in (0 while
     * the gate grows) in the high half, so that taking a place and closing
     * the gate are one atomic operation each. */
    _Atomic uint64_t places;
    _Atomic int waiting;   /* callers on the slow path */
    /* Under the lock. */
    pthread_mutex_t lock;
    pthread_cond_t left;   /* a caller left, or the gate grew */
    pthread_cond_t empty;  /* the last caller left while the gate grows */
    int most;              /* callers let in at most; 0 until the first call */
    int buffers;           /* OpenBLAS buffers known to exist, all free when none is inside */
    bool growing;
} gate = {.lock = PTHREAD_MUTEX_INITIALIZER,
          .left = PTHREAD_COND_INITIALIZER,
          .empty = PTHREAD_COND_INITIALIZER};

static uint32_t places_inside(uint64_t w) { return (uint32_t)w; }
static uint32_t places_open(uint64_t w) { return (uint32_t)(w >> 32); }

static bool gate_take_place(void)
{
    uint64_t w = atomic_load(&gate.places);
    while (places_inside(w) < places_open(w))
        if (atomic_compare_exchange_weak(&gate.places, &w, w + 1)) return true;
    return false;
}

static void gate_set_open(uint32_t open)
{
    uint64_t w = atomic_load(&gate.places);
    while (!atomic_compare_exchange_weak(&gate.places, &w, (uint64_t)open << 32 | places_inside(w)))
        ;
}

/* Whether one more OpenBLAS buffer fits: OpenBLAS maps twice a buffer
 * for a moment to make one (its alloc_mmap), and as much again stays to
 * spare for the rest of the process. */
static bool room_for_a_buffer(void) { return room_for(2 * buffer_bytes); }

static spmd_status no_room_error(int err)
{
    char limit[64];
    return base_error(SPMD_ERR_NOMEM,
                      "BLAS: no address space for OpenBLAS's %zu MiB GEMM buffer (%s; "
                      "address-space limit, ulimit -v: %s)",
                      buffer_bytes >> 20, strerror(err), limit_text(limit, sizeof limit));
}

/* Under the lock, by a caller that found no place: let in twice as many
 * (or GATE_MOST, or what the address space holds).  Closes the gate,
 * waits until no caller is inside, then holds `target` of OpenBLAS's
 * buffers at once, so that it has made that many, each new one checked
 * to fit first. */
static spmd_status gate_grow(void)
{
    int target = gate.buffers ? 2 * gate.buffers : 1;
    if (target > gate.most) target = gate.most;
    gate.growing = true;
    gate_set_open(0);
    while (places_inside(atomic_load(&gate.places)) > 0) pthread_cond_wait(&gate.empty, &gate.lock);
    void *held[GATE_MOST];
    int n = 0, err = 0;
    for (; n < target; n++) {
        bool made = n >= gate.buffers; /* a buffer OpenBLAS maps now */
        if (made && !room_for_a_buffer()) {
            err = errno;
            break;
        }
        size_t before = base_mapped_bytes();
        if (!(held[n] = openblas_buffer_alloc(0))) break;
        /* The first buffer made is measured (0: OpenBLAS had a free one). */
        size_t grew = made && !buffer_measured ? mapped_since(before) : 0;
        if (grew) {
            buffer_bytes = grew;
            buffer_measured = true;
        }
    }
    for (int i = 0; i < n; i++) openblas_buffer_free(held[i]);
    if (n > gate.buffers) gate.buffers = n;
    /* As many as the address space holds; with none, each caller tries
     * again and fails with the reason. */
    if (n < target && gate.buffers > 0) gate.most = gate.buffers;
    gate.growing = false;
    gate_set_open((uint32_t)gate.buffers);
    pthread_cond_broadcast(&gate.left);
    return gate.buffers ? SPMD_OK : no_room_error(err ? err : ENOMEM);
}

/* Under the lock: the gate's size, set on first use. */
static void gate_setup(void)
{
    if (gate.most) return;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    long most = GATE_PER_CPU * (cpus < 1 ? 1 : cpus);
    gate.most = most > GATE_MOST ? GATE_MOST : (int)most;
    /* Without OpenBLAS's buffer calls, nothing to make first. */
    if (!openblas_buffer_alloc || !openblas_buffer_free) gate_set_open((uint32_t)gate.most);
}

/* Wait for a place inside BLAS. */
static spmd_status gate_enter(void)
{
    if (gate_take_place()) return SPMD_OK;
    spmd_status st = SPMD_OK;
    pthread_mutex_lock(&gate.lock);
    gate_setup();
    /* Counted before the last try, so that a caller leaving after it sees
     * someone to wake. */
    atomic_fetch_add(&gate.waiting, 1);
    while (st == SPMD_OK && !gate_take_place()) {
        uint64_t w = atomic_load(&gate.places);
        if (!gate.growing && places_open(w) < (uint32_t)gate.most &&
            places_inside(w) >= places_open(w))
            st = gate_grow();
        else
            pthread_cond_wait(&gate.left, &gate.lock);
    }
    atomic_fetch_sub(&gate.waiting, 1);
    pthread_mutex_unlock(&gate.lock);
    return st;
}

static void gate_leave(void)
{
    uint64_t w = atomic_fetch_sub(&gate.places, 1) - 1;
    if (atomic_load(&gate.waiting) == 0) return;
    pthread_mutex_lock(&gate.lock);
    if (!gate.growing) pthread_cond_signal(&gate.left);
    else if (places_inside(w) == 0) pthread_cond_signal(&gate.empty);
    pthread_mutex_unlock(&gate.lock);
}

spmd_status blas_sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                       const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                       float *c, int64_t ldc)
{
    if (!atomic_load_explicit(&init_done, memory_order_acquire) || !sgemm_fn) {
        spmd_status st = blas_init(BLAS_AUTO, NULL);
        if (st != SPMD_OK)
            return st; /* with blas_init's message; C is left as it was */
    }
    if (m <= 0 || n <= 0)
        return SPMD_OK;
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX || lda > INT_MAX || ldb > INT_MAX ||
        ldc > INT_MAX || k < 0)
        return base_error(SPMD_ERR_UNSUPPORTED,
                          "sgemm %lldx%lldx%lld: dimensions past the 32-bit BLAS interface",
                          (long long)m, (long long)n, (long long)k);
    if (k == 0) { /* C = beta C; BLAS would reject lda < 1 here */
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++)
                c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
        return SPMD_OK;
    }
    spmd_status st = gate_enter();
    if (st != SPMD_OK)
        return st; /* C is left as it was */
    sgemm_fn(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
             (int)m, (int)n, (int)k, alpha, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
    gate_leave();
    return SPMD_OK;
}

spmd_status blas_prepare(size_t *mapped, size_t *more)
{
    size_t ignored;
    if (!mapped) mapped = &ignored;
    if (!more) more = &ignored;
    *mapped = *more = 0;
    spmd_status st = blas_init(BLAS_AUTO, NULL);
    if (st != SPMD_OK) {
        /* Loading OpenBLAS found no room for what it maps (room_to_load). */
        if (st == SPMD_ERR_NOMEM) *more = 2 * buffer_bytes;
        return st; /* with blas_init's message */
    }
    pthread_mutex_lock(&gate.lock);
    gate_setup();
    while (gate.growing) pthread_cond_wait(&gate.left, &gate.lock);
    /* The buffer the first product maps, made now as the gate makes it. */
    if (openblas_buffer_alloc && openblas_buffer_free && gate.buffers == 0) st = gate_grow();
    *mapped = loaded_bytes + (size_t)gate.buffers * buffer_bytes;
    if (st != SPMD_OK) *more = 2 * buffer_bytes;
    pthread_mutex_unlock(&gate.lock);
    return st;
}

const char *blas_name(void)
{
    if (!atomic_load_explicit(&init_done, memory_order_acquire) || init_status != SPMD_OK)
        return "no BLAS loaded";
    return lib_name;
}

const char *blas_library_key(void)
{
    if (!atomic_load_explicit(&init_done, memory_order_acquire) || init_status != SPMD_OK)
        return "auto";
    return loaded_key;
}

spmd_status blas_select(const char *library, const char *coretype)
{
    blas_library lib;
    if (!library || !strcmp(library, "auto")) lib = BLAS_AUTO;
    else if (!strcmp(library, "openblas")) lib = BLAS_OPENBLAS;
    else if (!strcmp(library, "blis")) lib = BLAS_BLIS;
    else if (strchr(library, '/')) lib = BLAS_FILE;
    else
        return base_error(SPMD_ERR_INVALID,
                          "BLAS: unknown library '%s' (auto, openblas, blis, onednn, measure, "
                          "or a file path such as ./libcblas.so)",
                          library);
    if (coretype && !*coretype) coretype = NULL;
    const char *cores = spmd_blas_core_names();
    if (coretype && cores && !is_core_name(cores, coretype))
        return base_error(SPMD_ERR_INVALID, "BLAS: unknown OpenBLAS core type '%s' (known: %s)",
                          coretype, cores);
    if (lib == BLAS_FILE && strlen(library) >= sizeof chosen_file)
        return base_error(SPMD_ERR_INVALID, "BLAS: library path longer than %zu bytes",
                          sizeof chosen_file - 1);
    pthread_mutex_lock(&init_lock);
    bool loaded = atomic_load_explicit(&init_done, memory_order_relaxed);
    if (!loaded && lib == BLAS_FILE) snprintf(chosen_file, sizeof chosen_file, "%s", library);
    pthread_mutex_unlock(&init_lock);
    if (loaded)
        return base_error(SPMD_ERR_INVALID,
                          "BLAS: %s is already loaded; choose the library before the first "
                          "run",
                          blas_name());
    return blas_init(lib, coretype);
}
