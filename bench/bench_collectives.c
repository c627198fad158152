/*
 * Collectives benchmark: bus bandwidth of the shared-memory transport for
 * each collective with 2, 4 and 8 device threads and sizes 4 KiB .. 64 MiB,
 * next to this machine's single-thread memcpy bandwidth measured in the
 * same run, which is the yardstick: in shared memory a collective is a set
 * of memory copies (and sums), so its bus bandwidth is bounded by what the
 * memory system moves, not by a link.
 *
 * Definitions as in nccl-tests: `size` is the bytes of the whole tensor (the
 * all-reduce buffer, the all-gather output, the reduce-scatter input, each
 * member's all-to-all buffer, the broadcast buffer); algbw = size / time;
 * busbw = algbw * 2(n-1)/n for all-reduce, (n-1)/n for all-gather,
 * reduce-scatter and all-to-all, 1 for broadcast.  Times are medians of
 * several samples, each long enough to time reliably.
 *
 * With --mpi (a build with MPI, run under mpirun) it measures the MPI
 * transport instead: one group of every device of every process, P
 * processes of L device threads each (--devices L; L > 1 is the
 * hierarchical path), for all-reduce, all-gather and reduce-scatter from
 * 1 KiB to 64 MiB, next to Open MPI's own MPI_Allreduce, MPI_Allgather and
 * MPI_Reduce_scatter_block over the P processes.  A sample's time is the
 * slowest process's.
 *
 *   bench_collectives [--quick]
 *   mpirun -n P bench_collectives --mpi [--devices L] [--quick]
 */
#include "runtime/collectives/collectives.h"
#include "runtime/pool.h"

#include "bench_time.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { MAX_WORKERS = 8, SAMPLES = 7, MEMCPY_SAMPLES = 7 };
#define MIB ((size_t)1 << 20)

typedef enum bop { B_ALL_REDUCE, B_ALL_GATHER, B_REDUCE_SCATTER, B_ALL_TO_ALL, B_BROADCAST, B_OPS } bop;

static const char *const bop_names[] = {"all_reduce", "all_gather", "reduce_scatter",
                                        "all_to_all", "broadcast"};

static void *xalloc(size_t bytes)
{
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) {
        fprintf(stderr, "bench_collectives: out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

/* ---- The yardstick: one thread copying a large buffer ------------------------- */

static double memcpy_gbps(size_t bytes)
{
    unsigned char *src = xalloc(bytes), *dst = xalloc(bytes);
    memset(src, 1, bytes);
    memset(dst, 2, bytes);
    memcpy(dst, src, bytes); /* warm-up */
    double rate[MEMCPY_SAMPLES];
    for (int i = 0; i < MEMCPY_SAMPLES; i++) {
        double t0 = now_s();
        memcpy(dst, src, bytes);
        rate[i] = (double)bytes / (now_s() - t0) * 1e-9;
        src[i] = dst[bytes - 1 - (size_t)i]; /* keep the copies observable */
    }
    free(src);
    free(dst);
    return median(rate, MEMCPY_SAMPLES);
}

/* ---- Device threads ---------------------------------------------------------------- */

typedef struct bench {
    int n;       /* device threads here */
    int members; /* devices in the group */
    int first;   /* the group member that thread 0 is */
    rt_pool *pool;
    coll_world *world;
    coll_group *group;
    unsigned char *a[MAX_WORKERS], *b[MAX_WORKERS];
    size_t cap;
    /* The current job. */
    bop op;
    size_t bytes;
    int iters;
    double seconds;
    atomic_bool failed;
} bench;

static spmd_status run_op(bench *B, int m)
{
    coll_group *g = B->group;
    size_t s = B->bytes, n = (size_t)B->members;
    m += B->first;
    unsigned char *a = B->a[m - B->first], *b = B->b[m - B->first];
    switch (B->op) {
    case B_ALL_REDUCE:
        return g->ops->all_reduce(g, m, a, (int64_t)(s / sizeof(float)), COLL_F32);
    case B_ALL_GATHER:
        return g->ops->all_gather(g, m, a, b, 1, (int64_t)(s / n));
    case B_REDUCE_SCATTER:
        return g->ops->reduce_scatter(g, m, a, b, 1, (int64_t)(s / sizeof(float) / n),
                                      COLL_F32);
    case B_ALL_TO_ALL:
        return g->ops->all_to_all(g, m, a, b, (int64_t)(s / n));
    case B_BROADCAST:
        return g->ops->broadcast(g, m, a, (int64_t)s, 0);
    case B_OPS: break;
    }
    return SPMD_ERR_INTERNAL;
}

/* Each device thread touches its own buffers first, as a device owns its
 * memory, and so that page faults stay out of the timings. */
static void touch_fn(void *ctx, int ith, int nth)
{
    (void)nth;
    bench *B = ctx;
    memset(B->a[ith], 0, B->cap);
    memset(B->b[ith], 0, B->cap);
}

static void sample_fn(void *ctx, int ith, int nth)
{
    (void)nth;
    bench *B = ctx;
    rt_pool_barrier(B->pool);
    double t0 = now_s();
    for (int i = 0; i < B->iters; i++)
        if (run_op(B, ith) != SPMD_OK) {
            fprintf(stderr, "bench_collectives: %s failed: %s\n", bop_names[B->op],
                    spmd_last_error());
            atomic_store(&B->failed, true);
            coll_world_abort(B->world, "benchmark failure"); /* free the others */
            break;
        }
    rt_pool_barrier(B->pool);
    if (ith == 0) B->seconds = now_s() - t0;
}

static double timed(bench *B, bop op, size_t bytes, int iters)
{
    B->op = op;
    B->bytes = bytes;
    B->iters = iters;
    rt_pool_run(B->pool, sample_fn, B);
    if (atomic_load(&B->failed)) exit(1);
    return B->seconds;
}

/* Median seconds per call; each sample runs enough calls to last min_s. */
static double measure(bench *B, bop op, size_t bytes, double min_s)
{
    timed(B, op, bytes, 1); /* warm-up */
    double t = timed(B, op, bytes, 2) / 2;
    int iters = t < min_s ? (int)(min_s / (t > 1e-7 ? t : 1e-7)) + 1 : 1;
    double per_call[SAMPLES];
    for (int i = 0; i < SAMPLES; i++) per_call[i] = timed(B, op, bytes, iters) / iters;
    return median(per_call, SAMPLES);
}

static double bus_factor(bop op, int n)
{
    switch (op) {
    case B_ALL_REDUCE: return 2.0 * (n - 1) / n;
    case B_BROADCAST: return 1.0;
    default: return (double)(n - 1) / n;
    }
}

static void bench_open(bench *B, int n, size_t cap)
{
    memset(B, 0, sizeof *B);
    B->n = n;
    B->members = n;
    B->cap = cap;
    B->pool = rt_pool_create(n, NULL);
    B->world = coll_shm_world_create(n, NULL);
    int ranks[MAX_WORKERS];
    for (int i = 0; i < n; i++) ranks[i] = i;
    B->group = B->world ? coll_world_group(B->world, n, ranks) : NULL;
    if (!B->pool || !B->group) {
        fprintf(stderr, "bench_collectives: %s\n", spmd_last_error());
        exit(1);
    }
    for (int i = 0; i < n; i++) {
        B->a[i] = xalloc(cap);
        B->b[i] = xalloc(cap);
    }
    atomic_init(&B->failed, false);
    rt_pool_run(B->pool, touch_fn, B);
}

static void bench_close(bench *B)
{
    for (int i = 0; i < B->n; i++) {
        free(B->a[i]);
        free(B->b[i]);
    }
    coll_world_free(B->world);
    rt_pool_free(B->pool);
}

static void print_size(size_t bytes)
{
    if (bytes >= MIB)
        printf("%6zu MiB", bytes / MIB);
    else
        printf("%6zu KiB", bytes >> 10);
}

/* ---- The MPI transport, under mpirun ---------------------------------------------------- */

#ifdef SPMD_HAVE_MPI
#include <mpi.h>

/* A time beside a bandwidth (only the MPI table prints them). */
static void print_time(double t)
{
    if (t >= 1e-3)
        printf("(%7.2f ms)", t * 1e3);
    else
        printf("(%7.1f us)", t * 1e6);
}

/* Seconds for `iters` calls on this process, started together. */
typedef double (*timer_fn)(bench *B, bop op, size_t bytes, int iters);

static double slowest(double t)
{
    double max = t;
    MPI_Allreduce(&t, &max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return max;
}

static double time_transport(bench *B, bop op, size_t bytes, int iters)
{
    MPI_Barrier(MPI_COMM_WORLD);
    return timed(B, op, bytes, iters);
}

/* Open MPI's own collective over the processes, on device 0's buffers. */
static double time_native(bench *B, bop op, size_t bytes, int iters)
{
    int procs = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &procs);
    int count = (int)(bytes / sizeof(float)), part = count / procs;
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now_s();
    for (int i = 0; i < iters; i++) {
        int rc = MPI_ERR_OTHER;
        switch (op) {
        case B_ALL_REDUCE:
            rc = MPI_Allreduce(MPI_IN_PLACE, B->a[0], count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            break;
        case B_ALL_GATHER:
            rc = MPI_Allgather(B->a[0], (int)(bytes / (size_t)procs), MPI_BYTE, B->b[0],
                               (int)(bytes / (size_t)procs), MPI_BYTE, MPI_COMM_WORLD);
            break;
        case B_REDUCE_SCATTER:
            rc = MPI_Reduce_scatter_block(B->a[0], B->b[0], part, MPI_FLOAT, MPI_SUM,
                                          MPI_COMM_WORLD);
            break;
        default: break;
        }
        if (rc != MPI_SUCCESS) {
            fprintf(stderr, "bench_collectives: MPI's %s failed\n", bop_names[op]);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    return now_s() - t0;
}

/* Median seconds per call over the slowest process of each sample; every
 * process runs the same number of calls. */
static double mpi_measure(timer_fn f, bench *B, bop op, size_t bytes, double min_s)
{
    f(B, op, bytes, 1); /* warm-up */
    double t = slowest(f(B, op, bytes, 2)) / 2;
    int iters = t < min_s ? (int)(min_s / (t > 1e-7 ? t : 1e-7)) + 1 : 1;
    double per_call[SAMPLES];
    for (int i = 0; i < SAMPLES; i++) per_call[i] = slowest(f(B, op, bytes, iters)) / iters;
    return median(per_call, SAMPLES);
}

static int mpi_main(int argc, char **argv, int devices, bool quick)
{
    int provided = 0, procs = 1, rank = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_size(MPI_COMM_WORLD, &procs);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int n = procs * devices;
    size_t max_bytes = quick ? MIB : 64 * MIB;
    double min_s = quick ? 0.005 : 0.02;
    bench B;
    memset(&B, 0, sizeof B);
    B.n = devices;
    B.members = n;
    B.first = rank * devices;
    B.cap = max_bytes;
    B.pool = rt_pool_create(devices, NULL);
    B.world = coll_mpi_world_create(MPI_COMM_WORLD, devices, NULL);
    int ranks[4096];
    for (int i = 0; i < n && i < 4096; i++) ranks[i] = i;
    B.group = B.world && n <= 4096 ? coll_world_group(B.world, n, ranks) : NULL;
    if (!B.pool || !B.group || coll_world_connect(B.world) != SPMD_OK || devices > MAX_WORKERS) {
        fprintf(stderr, "bench_collectives: process %d: %s\n", rank,
                devices > MAX_WORKERS ? "too many devices" : spmd_last_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (int i = 0; i < devices; i++) {
        B.a[i] = xalloc(max_bytes);
        B.b[i] = xalloc(max_bytes);
    }
    atomic_init(&B.failed, false);
    rt_pool_run(B.pool, touch_fn, &B);

    double t_start = now_s();
    if (rank == 0) {
        printf("bench_collectives --mpi: %d processes x %d devices = %d devices%s, %ld CPUs, "
               "%d samples per point (median of the slowest process)\n",
               procs, devices, n, devices > 1 ? " (hierarchical)" : "",
               sysconf(_SC_NPROCESSORS_ONLN), SAMPLES);
        printf("busbw as in nccl-tests (GB = 1e9 bytes), n = %d devices for the transport, %d "
               "processes for MPI's own; ratio = transport time / MPI time\n",
               n, procs);
    }
    static const char *const native[] = {"MPI_Allreduce", "MPI_Allgather",
                                         "MPI_Reduce_scatter_block"};
    for (int op = 0; op <= B_REDUCE_SCATTER; op++) {
        if (rank == 0)
            printf("\n%s: transport | %s\n      size | %-27s | %-27s | ratio\n",
                   bop_names[op], native[op], "busbw (time)", "busbw (time)");
        for (size_t s = 1024; s <= max_bytes; s *= 4) {
            double t = mpi_measure(time_transport, &B, (bop)op, s, min_s);
            double tn = mpi_measure(time_native, &B, (bop)op, s, min_s);
            if (rank != 0) continue;
            print_size(s);
            printf(" | %8.3f GB/s ", (double)s / t * 1e-9 * bus_factor((bop)op, n));
            print_time(t);
            printf(" | %8.3f GB/s ", (double)s / tn * 1e-9 * bus_factor((bop)op, procs));
            print_time(tn);
            printf(" | %5.2f\n", t / tn);
            fflush(stdout);
        }
    }
    if (rank == 0) printf("\ntotal %.1f s\n", now_s() - t_start);
    for (int i = 0; i < devices; i++) {
        free(B.a[i]);
        free(B.b[i]);
    }
    coll_world_free(B.world);
    rt_pool_free(B.pool);
    MPI_Finalize();
    return 0;
}
#endif

static void usage(FILE *f)
{
    fprintf(f, "usage: bench_collectives [--quick]\n"
               "       mpirun -n P bench_collectives --mpi [--devices L] [--quick]\n"
               "  --quick    sizes up to 1 MiB and shorter samples\n"
               "  --mpi      the MPI transport, P processes of L device threads (default 1),\n"
               "             next to Open MPI's own collectives (a build with MPI only)\n");
}

int main(int argc, char **argv)
{
    bool quick = false, mpi = false;
    int devices = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) {
            quick = true;
        } else if (!strcmp(argv[i], "--mpi")) {
            mpi = true;
        } else if (!strcmp(argv[i], "--devices") && i + 1 < argc && atoi(argv[i + 1]) > 0) {
            devices = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (mpi) {
#ifdef SPMD_HAVE_MPI
        return mpi_main(argc, argv, devices, quick);
#else
        fprintf(stderr, "bench_collectives: built without MPI (CMake did not find it)\n");
        return 2;
#endif
    }
    (void)devices;
    static const int workers[] = {2, 4, 8};
    enum { NW = sizeof workers / sizeof *workers };
    size_t max_bytes = quick ? MIB : 64 * MIB;
    double min_s = quick ? 0.005 : 0.02;
    int nsizes = 0;
    size_t sizes[16];
    for (size_t s = 4096; s <= max_bytes; s *= 4) sizes[nsizes++] = s;

    double t_start = now_s();
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    printf("bench_collectives: shared-memory transport, %ld CPUs, %d samples per point "
           "(median)\n",
           cpus, SAMPLES);
    double copy = memcpy_gbps(64 * MIB);
    printf("memcpy, 1 thread, 64 MiB: %.2f GB/s (bytes copied per second; GB = 1e9 bytes)\n",
           copy);
    printf("busbw as in nccl-tests; each cell: busbw GB/s (time per call)\n");

    /* [op][workers][size] */
    static double busbw[B_OPS][NW][16], secs[B_OPS][NW][16];
    for (int w = 0; w < NW; w++) {
        bench B;
        bench_open(&B, workers[w], max_bytes);
        for (int op = 0; op < B_OPS; op++)
            for (int s = 0; s < nsizes; s++) {
                double t = measure(&B, (bop)op, sizes[s], min_s);
                busbw[op][w][s] = (double)sizes[s] / t * 1e-9 * bus_factor((bop)op, workers[w]);
                secs[op][w][s] = t;
            }
        bench_close(&B);
    }

    for (int op = 0; op < B_OPS; op++) {
        printf("\n%s\n      size", bop_names[op]);
        for (int w = 0; w < NW; w++) printf(" | %d workers: %-15s", workers[w], "busbw (time)");
        printf("\n");
        for (int s = 0; s < nsizes; s++) {
            print_size(sizes[s]);
            for (int w = 0; w < NW; w++) {
                double t = secs[op][w][s];
                if (t >= 1e-3)
                    printf(" | %8.2f GB/s (%7.2f ms)", busbw[op][w][s], t * 1e3);
                else
                    printf(" | %8.2f GB/s (%7.1f us)", busbw[op][w][s], t * 1e6);
            }
            printf("\n");
        }
    }
    printf("\nat %zu MiB: memcpy %.2f GB/s; all_reduce busbw", max_bytes / MIB, copy);
    for (int w = 0; w < NW; w++)
        printf(" %.2f (%d)%s", busbw[B_ALL_REDUCE][w][nsizes - 1], workers[w],
               w + 1 < NW ? "," : "");
    printf(" GB/s (workers)\ntotal %.1f s\n", now_s() - t_start);
    return 0;
}
