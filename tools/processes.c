/* The tool over several processes (see processes.h). */
#include "processes.h"

#include "message.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A value as a message shows it: whole when short, else its start and
 * its length (a --prompt may be 100 KB). */
static void shown_value(const char *v, char *buf, size_t size)
{
    enum { SHOWN = 60 };
    size_t n = strlen(v);
    if (n <= SHOWN + 20) snprintf(buf, size, "%s", v);
    else snprintf(buf, size, "%.*s... (%zu bytes)", SHOWN, v, n);
}

/* The first setting where `a` (process 0's, on host_a) and `b` (process
 * `r`'s, on host_b) differ, refused: the pairs are name, value, in one
 * order.  A pair named "file FLAG PATH" is the bytes of an input file. */
static int refuse_difference(const char *a, size_t a_len, const char *b, size_t b_len, int r,
                             const char *host_a, const char *host_b)
{
    const char *ea = a + a_len, *eb = b + b_len;
    while (a < ea && b < eb) {
        const char *va = a + strlen(a) + 1, *vb = b + strlen(b) + 1;
        if (va >= ea || vb >= eb) break;
        if (strcmp(a, b) || strcmp(va, vb)) {
            char x[160], y[160];
            shown_value(va, x, sizeof x);
            shown_value(vb, y, sizeof y);
            if (!strncmp(a, "file ", 5) && !strcmp(a, b))
                return cli_fail("process %d on host %s reads %s as %s, process 0 on host %s as %s: "
                                "every process must read the same files (a relative path is read "
                                "in each process's working directory)", r, host_b, b + 5, y, host_a,
                                x);
            if (!strncmp(a, "file ", 5) || !strncmp(b, "file ", 5))
                return cli_fail("process %d on host %s reads %s, process 0 on host %s %s: every "
                                "process must read the same files", r, host_b,
                                strncmp(b, "file ", 5) ? "other files" : b + 5, host_a,
                                strncmp(a, "file ", 5) ? "other files" : a + 5);
            if (strcmp(a, b))
                return cli_fail("process %d runs with %s %s, process 0 with %s %s: every process "
                                "must be started with the same settings", r, b, y, a, x);
            return cli_fail("process %d was started with %s %s, process 0 with %s %s: every "
                            "process must be started with the same settings", r, b, y, a, x);
        }
        a = va + strlen(va) + 1;
        b = vb + strlen(vb) + 1;
    }
    return cli_fail("process %d's settings differ from process 0's (%zu bytes against %zu)", r,
                    b_len, a_len);
}

/* FNV-1a, 64 bits: the settings' digest. */
static uint64_t digest(const char *s, size_t n)
{
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

/* A launcher's environment: Open MPI's mpirun, PMIx and PMI (MPICH's
 * Hydra) each name the job's size. */
static int launcher_size(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        const char *v = getenv(vars[i]);
        if (v && atoi(v) > 0) return atoi(v);
    }
    return getenv("PMIX_RANK") ? 1 : 0;
}

#ifdef SPMD_HAVE_MPI
#include <mpi.h>

static int procs = 1, rank = 0, here = 1;
static bool started;
/* Every process refused the run together (processes_agree): each ends on
 * its own, none needs MPI_Abort to end the others. */
static bool refused_together;
static MPI_Comm world = MPI_COMM_NULL;

int processes_start(int *argc, char ***argv)
{
    if (!launcher_size()) return 0;
    int level = MPI_THREAD_SINGLE;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &level) != MPI_SUCCESS) {
        fprintf(stderr, "spmd: MPI_Init_thread failed\n");
        return 1;
    }
    started = true;
    world = MPI_COMM_WORLD;
    MPI_Comm_size(world, &procs);
    MPI_Comm_rank(world, &rank);
    if (procs > 1) message_set_process(rank);
    MPI_Comm host;
    if (MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &host) == MPI_SUCCESS) {
        MPI_Comm_size(host, &here);
        MPI_Comm_free(&host);
    }
    if (level != MPI_THREAD_MULTIPLE) {
        fprintf(stderr, "spmd: this MPI library does not provide MPI_THREAD_MULTIPLE, which the "
                        "device threads need\n");
        return processes_end(1);
    }
    /* One progress line and one summary: process 0's. */
    if (rank > 0 && !freopen("/dev/null", "w", stdout)) {
        fprintf(stderr, "spmd: process %d: cannot silence its output\n", rank);
        return processes_end(1);
    }
    return 0;
}

int processes_end(int rc)
{
    if (!started) return rc;
    fflush(stdout);
    fflush(stderr);
    /* Peers may be waiting for this process in a collective: only the
     * launcher can end them.  Open MPI 5's launcher (PRRTE) stops
     * forwarding the job's output as it handles the abort, and may drop
     * what processes wrote just before: the cause, printed above.  So
     * mpirun is given a moment to read it first (measured on Debian 13,
     * two processes refusing --processes 4 and aborting: both messages
     * lost in 2 runs of 48 without the pause, in none of 36 with it). */
    if (rc != 0 && procs > 1 && !refused_together) {
        struct timespec moment = {0, 200 * 1000 * 1000};
        nanosleep(&moment, NULL);
        MPI_Abort(world, rc);
    }
    MPI_Finalize();
    started = false;
    return rc;
}

int processes_count(void) { return procs; }
int processes_here(void) { return here; }
int processes_rank(void) { return rank; }
const void *processes_mpi_comm(void) { return procs > 1 ? (const void *)&world : NULL; }

int processes_gather_double(double mine, double *all)
{
    if (procs == 1) {
        all[0] = mine;
        return 0;
    }
    if (MPI_Allgather(&mine, 1, MPI_DOUBLE, all, 1, MPI_DOUBLE, world) != MPI_SUCCESS) {
        cli_fail("MPI_Allgather of the per-process figures failed");
        return 1;
    }
    return 0;
}

/* Median round-trip seconds of `bytes` between process 0 and `peer`, over
 * `trips` trips after one unmeasured; only those two take part. */
static double round_trip(char *buf, int bytes, int peer, int trips)
{
    enum { MOST = 64 };
    double t[MOST];
    if (trips > MOST) trips = MOST;
    for (int i = -1; i < trips; i++) {
        double t0 = MPI_Wtime();
        if (rank == 0) {
            MPI_Send(buf, bytes, MPI_BYTE, peer, 0, world);
            MPI_Recv(buf, bytes, MPI_BYTE, peer, 0, world, MPI_STATUS_IGNORE);
        } else if (rank == peer) {
            MPI_Recv(buf, bytes, MPI_BYTE, 0, 0, world, MPI_STATUS_IGNORE);
            MPI_Send(buf, bytes, MPI_BYTE, 0, 0, world);
        }
        if (i >= 0) t[i] = MPI_Wtime() - t0;
    }
    /* Insertion sort: a few dozen values. */
    for (int i = 1; i < trips; i++)
        for (int j = i; j > 0 && t[j - 1] > t[j]; j--) {
            double x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
    return t[trips / 2];
}

/* Until `req` completes, without spinning: the processes that wait for
 * the two that measure would otherwise take their cores on a shared host
 * (MPI's own waits busy-poll) and slow the very trips being timed. */
static int wait_quietly(MPI_Request *req)
{
    for (;;) {
        int done = 0;
        if (MPI_Test(req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return 1;
        if (done) return 0;
        struct timespec nap = {0, 200 * 1000};
        nanosleep(&nap, NULL);
    }
}

enum { NET_ROUNDS = 5 };
static double round_latency[NET_ROUNDS], round_bandwidth[NET_ROUNDS];
static int rounds_done;

int processes_network_rounds(const double **latency_s, const double **bytes_per_s)
{
    *latency_s = round_latency;
    *bytes_per_s = round_bandwidth;
    return rounds_done;
}

int processes_measure_network(double *latency_s, double *bytes_per_s)
{
    enum { SMALL = 8, LARGE = 4 << 20, ROUNDS = NET_ROUNDS };
    double fig[2] = {0, 0};
    *latency_s = *bytes_per_s = 0;
    if (!started) return 0;
    if (procs > 1) {
        char *buf = calloc(LARGE, 1);
        int ok = buf != NULL, all_ok = 0;
        MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, world);
        if (!all_ok) {
            free(buf);
            cli_fail("out of memory for the network measurement");
            return 1;
        }
        /* Several rounds, each the median of its trips, and the least
         * disturbed round's figures: noise (a process descheduled on a
         * shared host) only ever adds time, so the lowest latency and the
         * highest bandwidth are the nearest to the link's. */
        int peer = procs - 1;
        for (int r = 0; r < ROUNDS && (rank == 0 || rank == peer); r++) {
            double small = round_trip(buf, SMALL, peer, 20);
            double large = round_trip(buf, LARGE, peer, 4);
            double latency = small / 2;
            /* Noise can make the small trip look as long as the large one:
             * then the large one's time is taken whole. */
            double one_way = large / 2 - latency;
            if (one_way <= 0) one_way = large / 2;
            double bandwidth = one_way > 0 ? LARGE / one_way : 0;
            if (rank == 0) {
                round_latency[r] = latency;
                round_bandwidth[r] = bandwidth;
                rounds_done = r + 1;
            }
            if (r == 0 || latency < fig[0]) fig[0] = latency;
            if (bandwidth > fig[1]) fig[1] = bandwidth;
        }
        free(buf);
    }
    /* Process 0 measured; everyone prices with its figures. */
    MPI_Request req;
    if (MPI_Ibcast(fig, 2, MPI_DOUBLE, 0, world, &req) != MPI_SUCCESS || wait_quietly(&req)) {
        cli_fail("MPI_Ibcast of the network's figures failed");
        return 1;
    }
    *latency_s = fig[0];
    *bytes_per_s = fig[1];
    return 0;
}

/* Process `root`'s text on every process (allocated; NULL when out of
 * memory, then the caller fails and MPI_Abort ends the others). */
static char *broadcast_text(const char *mine, size_t mine_len, int root, size_t *len)
{
    unsigned long long n = mine_len;
    MPI_Bcast(&n, 1, MPI_UNSIGNED_LONG_LONG, root, world);
    char *buf = n < INT32_MAX ? malloc(n + 1) : NULL;
    if (!buf) return NULL;
    if (rank == root) memcpy(buf, mine, n);
    MPI_Bcast(buf, (int)n, MPI_CHAR, root, world);
    buf[n] = '\0';
    *len = n;
    return buf;
}

int processes_agree(const char *settings, size_t len)
{
    if (procs == 1) return 0;
    uint64_t mine = digest(settings, len);
    uint64_t *all = malloc((size_t)procs * sizeof *all);
    if (!all) return cli_fail("out of memory comparing the processes' settings"), 1;
    if (MPI_Allgather(&mine, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, world) != MPI_SUCCESS) {
        free(all);
        return cli_fail("MPI_Allgather of the processes' settings failed"), 1;
    }
    int other = 0;
    for (int r = 1; r < procs && !other; r++)
        if (all[r] != all[0]) other = r;
    free(all);
    if (!other) return 0;
    /* Every process names the first process that differs from process 0. */
    size_t a_len = 0, b_len = 0;
    char *a = broadcast_text(settings, len, 0, &a_len);
    char *b = a ? broadcast_text(settings, len, other, &b_len) : NULL;
    if (!a || !b) {
        free(a);
        return cli_fail("out of memory comparing the processes' settings"), 1;
    }
    /* And the hosts of both, for the message. */
    char host[MPI_MAX_PROCESSOR_NAME + 1] = "";
    int host_len = 0;
    if (MPI_Get_processor_name(host, &host_len) != MPI_SUCCESS) snprintf(host, sizeof host, "?");
    size_t ha_len = 0, hb_len = 0;
    char *host_a = broadcast_text(host, strlen(host), 0, &ha_len);
    char *host_b = host_a ? broadcast_text(host, strlen(host), other, &hb_len) : NULL;
    int rc = host_b ? refuse_difference(a, a_len, b, b_len, other, host_a, host_b)
                    : (cli_fail("out of memory comparing the processes' settings"), 1);
    free(a), free(b), free(host_a), free(host_b);
    fflush(stderr);
    MPI_Barrier(world);
    refused_together = true;
    return rc;
}

#else

int processes_start(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    int n = launcher_size();
    if (n > 1) {
        fprintf(stderr, "spmd: started as one of %d processes, but this spmd was built without "
                        "MPI (install libopenmpi-dev and rebuild with -DSPMD_MPI=ON)\n", n);
        return 1;
    }
    return 0;
}

int processes_end(int rc) { return rc; }
int processes_count(void) { return 1; }
int processes_here(void) { return 1; }
int processes_rank(void) { return 0; }
const void *processes_mpi_comm(void) { return NULL; }

int processes_gather_double(double mine, double *all)
{
    all[0] = mine;
    return 0;
}

int processes_measure_network(double *latency_s, double *bytes_per_s)
{
    *latency_s = 0;
    *bytes_per_s = 0;
    return 0;
}

int processes_network_rounds(const double **latency_s, const double **bytes_per_s)
{
    *latency_s = *bytes_per_s = NULL;
    return 0;
}

int processes_agree(const char *settings, size_t len)
{
    (void)settings, (void)len, (void)refuse_difference, (void)digest;
    return 0;
}

#endif
