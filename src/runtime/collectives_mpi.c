/*
 * MPI collectives (see collectives.h): devices are threads of P processes,
 * `local` devices in each; world rank r lives in process r / local.  The
 * world handed out is the shared-memory world of this process's devices,
 * extended (collectives_impl.h): a group whose members all live here is a
 * plain shared-memory group; any other group is an MPI group, below.
 *
 * An MPI group runs every collective in three parts.  The members in this
 * process meet in a private shared-memory group (its barrier and slots);
 * the first of them, the leader, exchanges data with the other processes'
 * leaders over the group's communicator, reading and writing its local
 * peers' buffers directly; then the local members share the result in
 * memory.  With one member per process only the exchange is left; with
 * several, it is hierarchical, as NCCL and Horovod do it.
 *
 * Same bits as the shared-memory transport: sums follow the canonical tree
 * (collectives_tree.c).  Where a subtree's members all live in one process,
 * that process adds them locally and sends the subtree's sum; other
 * members' values are sent raw.  These "units" are the maximal subtrees
 * inside one process, in canonical order; one per process when each
 * process holds an aligned power-of-two run of member ranks.  The owner of
 * an element (a chunk of an all-reduce, a member's block of a
 * reduce-scatter) receives every unit's values for it and evaluates the
 * tree over the units.  MPI's own reductions are never used: their order
 * is theirs.
 *
 * Threads: device threads of different groups call collectives at the
 * same time, so MPI must run with MPI_THREAD_MULTIPLE.  Only the leader of
 * a group calls MPI for it, on the group's own communicator, one
 * collective at a time, so messages of a group match in posting order.
 *
 * Abort: every wait for MPI polls (MPI_Testall) and checks the world's
 * failure flag, so a local abort never leaves a thread blocked in MPI.  On
 * an abort, pending receives are cancelled and pending requests freed; the
 * peers' state is then unknown, so every group that crosses processes
 * fails for good (a reset brings back only this process's groups).
 * Telling the other processes is the caller's job (MPI_Abort).
 */
#ifdef SPMD_HAVE_MPI

#include "runtime/collectives.h"

#include "base/arena.h"
#include "base/error.h"
#include "runtime/collectives_impl.h"
#include "runtime/wait.h"

#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum {
    MESSAGE = 256,
    /* MPI counts are ints: longer messages go in pieces of 64 MiB (small
     * enough that the watchdog sees a slow link's progress piece by piece:
     * 64 MiB in 100 s is 0.7 MB/s). */
    PIECE_BYTES = 1 << 26,
    /* Polls between two looks at the clock, once a wait yields. */
    CLOCK_POLLS = 16,
    /* Polls of a wait before each further poll yields the core, as Open
     * MPI's own waits do when oversubscribed: device threads and processes
     * often outnumber cores. */
    POLL_SPINS = 64,
    /* An all-reduce takes one round, every process getting every unit
     * whole and summing all of it, while each process receives at most
     * this many values that way (count times the other processes): there
     * latency rules, and with two processes both ways move the same bytes. */
    SMALL_ALL_REDUCE = 65536,
    /* Chunks start at multiples of 16 elements (64 bytes of f32, where
     * local members write their units' sums). */
    CHUNK_ELEMS = 16,
};

typedef struct mpi_world mpi_world;

/* A maximal subtree of the canonical tree inside one process: members
 * [lo, hi), in the group's process `proc` (an index into procs[]). */
typedef struct unit {
    int lo, hi, proc;
} unit;

/* The leader's requests of one exchange, and what each receive expects. */
typedef struct xfer {
    MPI_Request *req;
    MPI_Status *st;
    int64_t *expect; /* bytes a receive must get; -1 for a send */
    int *peer;       /* the process (index in procs[]) at the other end */
    int *idx;        /* MPI_Testsome's completed indices and statuses */
    MPI_Status *got;
    int n, cap;
    spmd_status err; /* a post that failed (its message recorded); the wait reports it */
} xfer;

typedef struct mpi_group {
    coll_group pub;
    mpi_world *world;
    struct mpi_group *next;
    int n;             /* members */
    int *ranks;        /* [n] world ranks, in member order */
    int q;             /* processes that hold members */
    int *procs;        /* [q] their ranks in the world communicator, ascending */
    int me;            /* this process's index in procs[], its rank in comm */
    int *proc_of;      /* [n] index in procs[] of each member's process */
    int k;             /* members in this process */
    int *local;        /* [k] their member ranks, ascending; local[0] leads */
    int *local_of;     /* [n] a member's index in local[], or -1 */
    int *remote_of;    /* [n] a member's index among the others, or -1 */
    int n_units;
    unit *units;       /* canonical order */
    int *slot;         /* [n_units] index among this process's units, or among the others' */
    int *inner;        /* [n_units] index among this process's units of several members, or -1 */
    int n_local_units, n_inner_units, n_remote_units;
    coll_term *terms;  /* [k][n]: each local member's terms for a sum */
    coll_shm_group *shm; /* the local members' barrier and slots */
    int lead;          /* the leader's rank in this process's shared-memory world */
    coll_op op;        /* the leader's current call, for the watchdog's message */
    coll_dtype type;
    MPI_Comm comm;     /* MPI_COMM_NULL until coll_world_connect */
    /* The leader's: requests, staging memory, and the outcome of its parts,
     * which the local members read after the next barrier.  Two records,
     * so that the leader's record for the next call never overwrites one a
     * member may still be reading. */
    xfer x;
    void *stage;
    size_t stage_bytes;
    spmd_status entry_status, status;
    char entry_message[MESSAGE], message[MESSAGE];
    /* Set by the leader when an exchange failed: the peers' state is
     * unknown, so the group is not used again. */
    bool broken;
    char broken_message[MESSAGE];
} mpi_group;

struct mpi_world {
    coll_world *shm; /* this process's devices; the world handed out */
    coll_world_ext ext;
    MPI_Comm comm;   /* a duplicate of the caller's */
    int procs, rank, local;
    spmd_allocator alloc;
    pthread_mutex_t mu; /* the group list, and connect */
    mpi_group *groups;
    /* Every process's host (MPI_Get_processor_name), for messages. */
    char (*hosts)[MPI_MAX_PROCESSOR_NAME];
    /* An abort: every group that crosses processes fails from then on. */
    _Atomic bool failed;
    pthread_mutex_t fail_mu;
    char failure[MESSAGE];
};

/* ---- Messages -------------------------------------------------------------------- */

static spmd_status mpi_error(int rc, const char *what)
{
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS)
        snprintf(text, sizeof text, "error %d", rc);
    return base_error(SPMD_ERR_BACKEND, "collectives: %s failed: %s", what, text);
}

static bool xfer_room(mpi_group *g, xfer *x)
{
    if (x->n < x->cap) return true;
    int cap = x->cap ? x->cap * 2 : 64;
    const spmd_allocator *a = &g->world->alloc;
    MPI_Request *req = base_alloc(a, sizeof *req * (size_t)cap, "MPI requests");
    MPI_Status *st = base_alloc(a, sizeof *st * (size_t)cap, "MPI requests");
    int64_t *expect = base_alloc(a, sizeof *expect * (size_t)cap, "MPI requests");
    int *peer = base_alloc(a, sizeof *peer * (size_t)cap, "MPI requests");
    int *idx = base_alloc(a, sizeof *idx * (size_t)cap, "MPI requests");
    MPI_Status *got = base_alloc(a, sizeof *got * (size_t)cap, "MPI requests");
    if (!req || !st || !expect || !peer || !idx || !got) {
        base_free(a, req);
        base_free(a, st);
        base_free(a, expect);
        base_free(a, peer);
        base_free(a, idx);
        base_free(a, got);
        return false;
    }
    if (x->n) {
        memcpy(req, x->req, sizeof *req * (size_t)x->n);
        memcpy(expect, x->expect, sizeof *expect * (size_t)x->n);
        memcpy(peer, x->peer, sizeof *peer * (size_t)x->n);
    }
    base_free(a, x->req);
    base_free(a, x->st);
    base_free(a, x->expect);
    base_free(a, x->peer);
    base_free(a, x->idx);
    base_free(a, x->got);
    x->req = req;
    x->st = st;
    x->expect = expect;
    x->peer = peer;
    x->idx = idx;
    x->got = got;
    x->cap = cap;
    return true;
}

/* Post a send (recv false) or a receive of `bytes` with process `peer`
 * (its index in procs[], which is its rank in the group's communicator),
 * in pieces.  Messages between two processes match in posting order. */
static void post(mpi_group *g, bool recv, const void *buf, int64_t bytes, int peer)
{
    xfer *x = &g->x;
    int64_t at = 0;
    do {
        if (x->err) return;
        if (!xfer_room(g, x)) {
            x->err = SPMD_ERR_NOMEM;
            return;
        }
        int64_t piece = bytes - at < PIECE_BYTES ? bytes - at : PIECE_BYTES;
        int rc = recv ? MPI_Irecv((char *)buf + at, (int)piece, MPI_BYTE, peer, 0, g->comm,
                                  &x->req[x->n])
                      : MPI_Isend((const char *)buf + at, (int)piece, MPI_BYTE, peer, 0, g->comm,
                                  &x->req[x->n]);
        if (rc != MPI_SUCCESS) {
            x->err = mpi_error(rc, recv ? "MPI_Irecv" : "MPI_Isend");
            return;
        }
        x->peer[x->n] = peer;
        x->expect[x->n++] = recv ? piece : -1;
        at += piece;
    } while (at < bytes);
}

static void send_to(mpi_group *g, const void *buf, int64_t bytes, int peer)
{
    post(g, false, buf, bytes, peer);
}

static void recv_from(mpi_group *g, void *buf, int64_t bytes, int peer)
{
    post(g, true, buf, bytes, peer);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Give up on the pending requests without blocking: cancel the receives
 * (so nothing writes into buffers the caller may reuse), give both kinds a
 * moment to finish, and free what is left. */
static void xfer_drop(mpi_group *g)
{
    xfer *x = &g->x;
    for (int i = 0; i < x->n; i++)
        if (x->req[i] != MPI_REQUEST_NULL && x->expect[i] >= 0) MPI_Cancel(&x->req[i]);
    double until = now_s() + 0.2;
    for (bool left = true; left && now_s() < until;) {
        left = false;
        for (int i = 0; i < x->n; i++) {
            int done = 0;
            if (x->req[i] != MPI_REQUEST_NULL) MPI_Test(&x->req[i], &done, MPI_STATUS_IGNORE);
            if (x->req[i] != MPI_REQUEST_NULL) left = true;
        }
        if (left) sched_yield();
    }
    for (int i = 0; i < x->n; i++)
        if (x->req[i] != MPI_REQUEST_NULL) MPI_Request_free(&x->req[i]);
    x->n = 0;
    x->err = SPMD_OK;
}

static spmd_status failure_error(mpi_world *w)
{
    return base_error(SPMD_ERR_BACKEND, "collective aborted: %s", w->failure);
}

/* The group cannot be used again; `st` (already recorded) is returned. */
static spmd_status break_group(mpi_group *g, spmd_status st)
{
    xfer_drop(g);
    g->broken = true;
    snprintf(g->broken_message, sizeof g->broken_message, "%s", spmd_last_error());
    return st;
}

/* The watchdog fired in the leader's wait: name the process the first
 * pending message is with (a receive first: that peer has not delivered),
 * give up on the group and abort the world, so every local wait ends. */
static spmd_status xfer_expired(mpi_group *g, int64_t waited_ns)
{
    xfer *x = &g->x;
    mpi_world *w = g->world;
    int pending = 0, recv = -1, send = -1;
    for (int i = 0; i < x->n; i++) {
        if (x->req[i] == MPI_REQUEST_NULL) continue;
        pending++;
        if (x->expect[i] >= 0 && recv < 0) recv = i;
        if (x->expect[i] < 0 && send < 0) send = i;
    }
    int at = recv >= 0 ? recv : send;
    int proc = at >= 0 ? g->procs[x->peer[at]] : -1;
    base_error(SPMD_ERR_TIMEOUT,
               "collective timeout: %s: device %d (process %d on %s) waited %.1f s without "
               "progress for process %d on %s, %s (%d of the call's %d messages pending)",
               coll_call_name(g->op, g->type).text, g->ranks[g->local[0]], w->rank,
               w->hosts[w->rank], (double)waited_ns * 1e-9, proc,
               proc >= 0 ? w->hosts[proc] : "?",
               recv >= 0 ? "whose message had not arrived" : "which had not taken its message",
               pending, x->n);
    char msg[MESSAGE];
    snprintf(msg, sizeof msg, "%s", spmd_last_error());
    break_group(g, SPMD_ERR_TIMEOUT);
    coll_world_abort(w->shm, msg);
    return base_error(SPMD_ERR_TIMEOUT, "%s", msg);
}

/* Wait for every posted request, polling, so that an abort of the world
 * ends the wait.  Then check that each receive got the bytes it expected:
 * fewer mean the processes made different calls.
 *
 * The watchdog: once the wait yields, it reads the clock every
 * CLOCK_POLLS polls; a message that completed since the last reading is
 * progress, and the limit without any fires it (xfer_expired).  The
 * leader's device tells the local waits how long it has waited
 * (coll_shm_waiting), so that they leave the blame to this wait. */
static spmd_status xfer_wait(mpi_group *g)
{
    xfer *x = &g->x;
    if (x->err) return break_group(g, x->err);
    coll_world *shm = g->world->shm;
    int64_t limit = coll_world_timeout_ns(shm), since = 0;
    bool moved = false;
    spmd_status st = SPMD_OK;
    for (int spins = 0, left = x->n; left > 0; spins++) {
        int done = 0;
        int rc = MPI_Testsome(x->n, x->req, &done, x->idx, x->got);
        if (rc != MPI_SUCCESS) {
            for (int j = 0; j < done && done != MPI_UNDEFINED; j++)
                if (x->got[j].MPI_ERROR != MPI_SUCCESS && x->got[j].MPI_ERROR != MPI_ERR_PENDING) {
                    rc = x->got[j].MPI_ERROR;
                    break;
                }
            st = break_group(g, mpi_error(rc, "a collective's message (MPI_Testsome)"));
            break;
        }
        if (done == MPI_UNDEFINED) break;
        for (int j = 0; j < done; j++) x->st[x->idx[j]] = x->got[j];
        left -= done;
        moved |= done > 0;
        if (left == 0) break;
        if (atomic_load(&g->world->failed)) {
            st = break_group(g, failure_error(g->world));
            break;
        }
        if (spins < POLL_SPINS) continue;
        sched_yield();
        if (limit <= 0 || spins % CLOCK_POLLS) continue;
        int64_t now = rt_wait_now_ns();
        if (!since || moved) {
            since = now;
            moved = false;
            coll_shm_waiting(shm, g->lead, since, -1);
        } else if (now - since >= limit) {
            st = xfer_expired(g, now - since);
            break;
        }
    }
    if (since) coll_shm_waiting(shm, g->lead, 0, -1);
    if (st) return st;
    for (int i = 0; i < x->n; i++) {
        if (x->expect[i] < 0) continue;
        int got = 0;
        MPI_Get_count(&x->st[i], MPI_BYTE, &got);
        if (got != x->expect[i])
            return break_group(g, base_error(SPMD_ERR_INTERNAL,
                                             "collective mismatch across processes in a group of "
                                             "%d: a message of %d bytes where %lld were expected",
                                             g->n, got, (long long)x->expect[i]));
    }
    x->n = 0;
    return SPMD_OK;
}

/* ---- Calls: entering, the leader's outcome, leaving ------------------------------------ */

static bool stage_reserve(mpi_group *g, size_t bytes)
{
    if (bytes < 64) bytes = 64; /* never NULL, even for empty calls */
    if (bytes <= g->stage_bytes) return true;
    base_free(&g->world->alloc, g->stage);
    g->stage_bytes = 0;
    g->stage = base_alloc(&g->world->alloc, bytes, "collective staging");
    if (!g->stage) return false;
    g->stage_bytes = bytes;
    return true;
}

static void record(spmd_status st, spmd_status *status, char *message)
{
    *status = st;
    if (st) snprintf(message, MESSAGE, "%s", spmd_last_error());
}

static spmd_status replay(spmd_status st, const char *message)
{
    return st ? base_error(st, "%s", message) : SPMD_OK;
}

/* The local index of `member`, or -1 with an error. */
static int local_index(mpi_group *g, int member, coll_op op)
{
    if (member < 0 || member >= g->n) {
        base_error(SPMD_ERR_INVALID, "%s: member %d of a group of %d", coll_op_names[op], member,
                   g->n);
        return -1;
    }
    if (g->local_of[member] < 0) {
        base_error(SPMD_ERR_INVALID, "%s: member %d (device %d) is not in process %d",
                   coll_op_names[op], member, g->ranks[member], g->world->rank);
        return -1;
    }
    return g->local_of[member];
}

/* Whether the group can take a call at all.  Every local member sees the
 * same answer: each cause is permanent once set, and an abort sets the
 * local barrier's abort bit before `failed`. */
static spmd_status usable(mpi_group *g)
{
    if (atomic_load(&g->world->failed)) return failure_error(g->world);
    if (g->broken)
        return base_error(SPMD_ERR_BACKEND, "collective group failed earlier: %s",
                          g->broken_message);
    if (g->comm == MPI_COMM_NULL)
        return base_error(SPMD_ERR_INTERNAL,
                          "collectives: a group across processes used before coll_world_connect");
    return SPMD_OK;
}

/* Meet the local members.  The leader first records `prepared`, the outcome
 * of what it readied for the call (staging), which every member returns
 * if it failed, after a last barrier so that none of them still reads the
 * record when the leader writes the next one. */
static spmd_status enter(mpi_group *g, int l, coll_call call, spmd_status prepared)
{
    if (l == 0) {
        record(prepared, &g->entry_status, g->entry_message);
        g->op = call.op;
        g->type = call.type;
    }
    call.src_n = call.src ? g->n : 0;
    spmd_status st = coll_shm_enter(g->shm, l, &call);
    if (st) return st;
    st = replay(g->entry_status, g->entry_message);
    if (st) coll_shm_sync(g->shm, l);
    return st;
}

/* After the leader's exchange: the leader records its outcome, every
 * member waits for it and takes it. */
static spmd_status exchanged(mpi_group *g, int l, spmd_status st)
{
    if (l == 0) record(st, &g->status, g->message);
    coll_shm_sync(g->shm, l);
    return l == 0 ? st : replay(g->status, g->message);
}

static void copy(void *dst, const void *src, size_t bytes)
{
    if (dst != src && bytes) memcpy(dst, src, bytes);
}

static const void *in_of(const mpi_group *g, int l) { return coll_shm_in(g->shm, l); }
static void *out_of(const mpi_group *g, int l) { return coll_shm_out(g->shm, l); }

/* Elements [lo, hi) of `count` that part i of n holds. */
static void chunk_of(int64_t count, int n, int i, int64_t *lo, int64_t *hi)
{
    int64_t units = (count + CHUNK_ELEMS - 1) / CHUNK_ELEMS;
    int64_t a = (units / n * i + units % n * i / n) * CHUNK_ELEMS;
    int64_t b = (units / n * (i + 1) + units % n * (i + 1) / n) * CHUNK_ELEMS;
    *lo = a < count ? a : count;
    *hi = b < count ? b : count;
}

static bool local_unit(const mpi_group *g, const unit *u) { return u->proc == g->me; }

/* Sums of any element type travel in that type where it keeps the bits
 * and in f32 where it must: a unit of one member sends its values, a unit
 * of several its f32 partial sum (which a narrower type could not carry
 * without changing the result).  The owner of an element evaluates the
 * tree over them and stores the sum in the type, rounded once.  f32 is the
 * sums' own type, so an f32 all-reduce sums a unit in place, into its
 * first member's buffer; other types sum it into staging. */
static bool single(const unit *u) { return u->hi - u->lo == 1; }

/* What unit u sends: its member's values, or its f32 sum. */
static coll_dtype wire_type(const mpi_group *g, int u, coll_dtype type)
{
    return single(&g->units[u]) ? type : COLL_F32;
}

/* Sum this process's units of several members in f32, elements [from, to)
 * of each, from its members' inputs (of `type`, viewed flat) into `sums`
 * (unit u at sums + inner[u] * stride) or, without sums, in place into the
 * unit's first member's buffer (f32). */
static void sum_local_units(mpi_group *g, int l, coll_dtype type, float *sums, int64_t stride,
                            int64_t from, int64_t to)
{
    coll_term *t = g->terms + (size_t)l * (size_t)g->n;
    for (int u = 0; u < g->n_units; u++) {
        const unit *un = &g->units[u];
        if (g->inner[u] < 0) continue;
        for (int m = un->lo; m < un->hi; m++)
            t[m] = (coll_term){in_of(g, g->local_of[m]), type, 0, m + 1};
        float *out = sums ? sums + stride * g->inner[u] : out_of(g, g->local_of[un->lo]);
        coll_tree_sum(t, un->lo, un->hi, 0, from, out + from, COLL_F32, to - from);
    }
}

/* ---- All-reduce ------------------------------------------------------------------- */

static bool one_round(const mpi_group *g, int64_t count)
{
    return count * (g->q - 1) <= SMALL_ALL_REDUCE;
}

/* Staging of an all-reduce: the sums of this process's units of several
 * members (count each; none for f32, summed in place), then room for f32
 * for each remote unit's part of this process's chunk. */
static float *all_reduce_sums(const mpi_group *g, coll_dtype type)
{
    return type == COLL_F32 ? NULL : g->stage;
}

static size_t all_reduce_stage_floats(const mpi_group *g, coll_dtype type, int64_t count,
                                      int64_t chunk)
{
    return (type == COLL_F32 ? 0 : (size_t)count * (size_t)g->n_inner_units) +
           (size_t)chunk * (size_t)g->n_remote_units;
}

/* Local unit u's values from element `at`. */
static coll_term all_reduce_term(const mpi_group *g, int u, coll_dtype type, const float *sums,
                                 int64_t count, int64_t at)
{
    const unit *un = &g->units[u];
    if (single(un) || !sums)
        return (coll_term){coll_elem(in_of(g, g->local_of[un->lo]), type, at), type, 0, un->hi};
    return (coll_term){sums + count * g->inner[u] + at, COLL_F32, 0, un->hi};
}

/* The leader's exchange.  Each process owns a chunk: it receives every
 * other process's units for it, evaluates the tree there, into the
 * leader's buffer, and sends the result to every process.  Small buffers
 * take one round instead: every process gets every unit whole and
 * evaluates all of it. */
static spmd_status all_reduce_exchange(mpi_group *g, coll_dtype type, void *buf, int64_t count)
{
    bool whole = one_round(g, count);
    int64_t lo = 0, hi = count;
    if (!whole) chunk_of(count, g->q, g->me, &lo, &hi);
    int64_t len = hi - lo, es = (int64_t)coll_dtype_size(type);
    float *sums = all_reduce_sums(g, type);
    float *remote = (float *)g->stage + (sums ? count * g->n_inner_units : 0);
    coll_term *t = g->terms; /* the leader's row */
    for (int u = 0; u < g->n_units; u++) {
        const unit *un = &g->units[u];
        if (local_unit(g, un)) {
            t[un->lo] = all_reduce_term(g, u, type, sums, count, lo);
            continue;
        }
        float *at = remote + len * g->slot[u];
        coll_dtype wire = wire_type(g, u, type);
        t[un->lo] = (coll_term){at, wire, 0, un->hi};
        recv_from(g, at, (int64_t)coll_dtype_size(wire) * len, un->proc);
    }
    for (int c = 0; c < g->q; c++) {
        if (c == g->me) continue;
        int64_t clo = 0, chi = count;
        if (!whole) chunk_of(count, g->q, c, &clo, &chi);
        for (int u = 0; u < g->n_units; u++) {
            if (!local_unit(g, &g->units[u])) continue;
            coll_term v = all_reduce_term(g, u, type, sums, count, clo);
            send_to(g, v.base, (int64_t)coll_dtype_size(v.type) * (chi - clo), c);
        }
    }
    spmd_status st = xfer_wait(g);
    if (st) return st;
    coll_tree_sum(t, 0, g->n, 0, 0, coll_elem(buf, type, lo), type, len);
    if (whole) return SPMD_OK;
    for (int c = 0; c < g->q; c++) {
        if (c == g->me) continue;
        int64_t clo, chi;
        chunk_of(count, g->q, c, &clo, &chi);
        recv_from(g, coll_elem(buf, type, clo), es * (chi - clo), c);
        send_to(g, coll_elem(buf, type, lo), es * len, c);
    }
    return xfer_wait(g);
}

static spmd_status mpi_all_reduce(coll_group *pub, int member, void *buf, int64_t count,
                                  coll_dtype type)
{
    mpi_group *g = pub->impl;
    int l = local_index(g, member, COLL_OP_ALL_REDUCE);
    if (l < 0) return base_error_status();
    if (!coll_dtype_valid(type))
        return base_error(SPMD_ERR_INVALID, "all_reduce: element type %d", (int)type);
    if (count < 0 || (count > 0 && !buf))
        return base_error(SPMD_ERR_INVALID, "all_reduce: %lld %s values at %p", (long long)count,
                          coll_dtype_name(type), buf);
    spmd_status st = usable(g);
    if (st) return st;
    spmd_status prepared = SPMD_OK;
    if (l == 0) {
        int64_t lo = 0, hi = count;
        if (!one_round(g, count)) chunk_of(count, g->q, g->me, &lo, &hi);
        if (!stage_reserve(g, sizeof(float) * all_reduce_stage_floats(g, type, count, hi - lo)))
            prepared = base_error_status();
    }
    st = enter(g, l,
               (coll_call){.op = COLL_OP_ALL_REDUCE, .type = type, .in = buf, .out = buf,
                           .a = count},
               prepared);
    if (st) return st;
    if (g->n_inner_units) {
        /* In place for f32: a unit's members are read by that unit's sum
         * only, and they all get the result in the end. */
        int64_t from, to;
        chunk_of(count, g->k, l, &from, &to);
        sum_local_units(g, l, type, all_reduce_sums(g, type), count, from, to);
        coll_shm_sync(g->shm, l);
    }
    st = exchanged(g, l, l == 0 ? all_reduce_exchange(g, type, buf, count) : SPMD_OK);
    if (!st && l != 0) copy(buf, in_of(g, 0), coll_dtype_size(type) * (size_t)count);
    coll_shm_sync(g->shm, l);
    return st;
}

/* ---- Reduce-scatter ------------------------------------------------------------------ */

/* Staging of a reduce-scatter of [outer, n * inner], in floats, so each
 * region has room for f32 values (a unit of one member of a narrower type
 * uses part of its block): this process's unit sums (each [outer, n *
 * inner]), what it receives (for each local member, each remote unit's
 * [outer, inner]), and with outer > 1 what it sends, packed (for each
 * remote member, each local unit's [outer, inner]). */
typedef struct rs_stage {
    float *sums, *recv, *pack;
    int64_t block; /* outer * inner */
} rs_stage;

static rs_stage rs_layout(const mpi_group *g, float *stage, int64_t outer, int64_t inner,
                          size_t *floats)
{
    rs_stage s;
    s.block = outer * inner;
    size_t sums = (size_t)g->n_inner_units * (size_t)(outer * inner * g->n);
    size_t recv = (size_t)g->k * (size_t)g->n_remote_units * (size_t)s.block;
    size_t pack = outer > 1 ? (size_t)(g->n - g->k) * (size_t)g->n_local_units * (size_t)s.block
                            : 0;
    s.sums = stage;
    s.recv = stage ? stage + sums : NULL;
    s.pack = stage ? stage + sums + recv : NULL;
    if (floats) *floats = sums + recv + pack;
    return s;
}

/* Local unit u's [outer, n * inner] values from column `col`: its
 * member's input, or its f32 sum. */
static coll_term rs_term(const mpi_group *g, const rs_stage *s, int u, coll_dtype type,
                         int64_t outer, int64_t inner, int64_t col)
{
    const unit *un = &g->units[u];
    int64_t width = inner * g->n;
    if (g->inner[u] < 0)
        return (coll_term){coll_elem(in_of(g, g->local_of[un->lo]), type, col), type, width,
                           un->hi};
    return (coll_term){s->sums + outer * width * g->inner[u] + col, COLL_F32, width, un->hi};
}

/* Remote unit u's [outer, inner] block for local member jl, as received. */
static float *rs_received(const mpi_group *g, const rs_stage *s, int u, int jl)
{
    return s->recv + s->block * (g->n_remote_units * jl + g->slot[u]);
}

static spmd_status reduce_scatter_exchange(mpi_group *g, coll_dtype type, int64_t outer,
                                           int64_t inner)
{
    rs_stage s = rs_layout(g, g->stage, outer, inner, NULL);
    for (int jl = 0; jl < g->k; jl++)
        for (int u = 0; u < g->n_units; u++)
            if (!local_unit(g, &g->units[u]))
                recv_from(g, rs_received(g, &s, u, jl),
                          (int64_t)coll_dtype_size(wire_type(g, u, type)) * s.block,
                          g->units[u].proc);
    for (int j = 0; j < g->n; j++) {
        if (g->local_of[j] >= 0) continue;
        for (int u = 0; u < g->n_units; u++) {
            if (!local_unit(g, &g->units[u])) continue;
            coll_term v = rs_term(g, &s, u, type, outer, inner, inner * j);
            size_t es = coll_dtype_size(v.type);
            const unsigned char *from = v.base;
            if (outer > 1) {
                unsigned char *pack = (unsigned char *)(s.pack + s.block * (g->n_local_units *
                                                                            g->remote_of[j] +
                                                                        g->slot[u]));
                for (int64_t r = 0; r < outer; r++)
                    memcpy(pack + es * (size_t)(inner * r), from + es * (size_t)(v.stride * r),
                           es * (size_t)inner);
                from = pack;
            }
            send_to(g, from, (int64_t)es * s.block, g->proc_of[j]);
        }
    }
    return xfer_wait(g);
}

static spmd_status mpi_reduce_scatter(coll_group *pub, int member, const void *in, void *out,
                                      int64_t outer, int64_t inner, coll_dtype type)
{
    mpi_group *g = pub->impl;
    int l = local_index(g, member, COLL_OP_REDUCE_SCATTER);
    if (l < 0) return base_error_status();
    if (!coll_dtype_valid(type))
        return base_error(SPMD_ERR_INVALID, "reduce_scatter: element type %d", (int)type);
    if (outer < 0 || inner < 0 || (outer * inner > 0 && (!in || !out)))
        return base_error(SPMD_ERR_INVALID, "reduce_scatter: [%lld, %lld %s values]",
                          (long long)outer, (long long)inner, coll_dtype_name(type));
    spmd_status st = usable(g);
    if (st) return st;
    spmd_status prepared = SPMD_OK;
    if (l == 0) {
        size_t floats;
        rs_layout(g, NULL, outer, inner, &floats);
        if (!stage_reserve(g, sizeof(float) * floats)) prepared = base_error_status();
    }
    st = enter(g, l,
               (coll_call){.op = COLL_OP_REDUCE_SCATTER, .type = type, .in = in, .out = out,
                           .a = outer, .b = inner},
               prepared);
    if (st) return st;
    rs_stage s = rs_layout(g, g->stage, outer, inner, NULL);
    if (g->n_inner_units) {
        int64_t from, to;
        chunk_of(outer * inner * g->n, g->k, l, &from, &to);
        sum_local_units(g, l, type, s.sums, outer * inner * g->n, from, to);
        coll_shm_sync(g->shm, l);
    }
    st = exchanged(g, l, l == 0 ? reduce_scatter_exchange(g, type, outer, inner) : SPMD_OK);
    if (!st) {
        /* Each member sums its own block over the units.  `out` may be that
         * block of `in` (outer == 1): nothing else reads it any more. */
        coll_term *t = g->terms + (size_t)l * (size_t)g->n;
        for (int u = 0; u < g->n_units; u++) {
            const unit *un = &g->units[u];
            if (local_unit(g, un))
                t[un->lo] = rs_term(g, &s, u, type, outer, inner, inner * member);
            else
                t[un->lo] = (coll_term){rs_received(g, &s, u, l), wire_type(g, u, type), inner,
                                        un->hi};
        }
        for (int64_t r = 0; r < outer; r++)
            coll_tree_sum(t, 0, g->n, r, 0, coll_elem(out, type, inner * r), type, inner);
    }
    coll_shm_sync(g->shm, l);
    return st;
}

/* ---- All-gather --------------------------------------------------------------------- */

/* Copy member j's rows ([outer, inner] bytes at `from`) into its column
 * block of `out` ([outer, n * inner]). */
static void place_block(const mpi_group *g, unsigned char *out, const unsigned char *from, int j,
                        int64_t outer, int64_t inner)
{
    size_t row = (size_t)(inner * g->n);
    for (int64_t r = 0; r < outer; r++)
        copy(out + row * (size_t)r + (size_t)(inner * j), from + (size_t)(inner * r),
             (size_t)inner);
}

static spmd_status mpi_all_gather(coll_group *pub, int member, const void *in, void *out,
                                  int64_t outer, int64_t inner_bytes)
{
    mpi_group *g = pub->impl;
    int l = local_index(g, member, COLL_OP_ALL_GATHER);
    if (l < 0) return base_error_status();
    if (outer < 0 || inner_bytes < 0 || (outer * inner_bytes > 0 && (!in || !out)))
        return base_error(SPMD_ERR_INVALID, "all_gather: [%lld, %lld bytes]", (long long)outer,
                          (long long)inner_bytes);
    spmd_status st = usable(g);
    if (st) return st;
    int64_t block = outer * inner_bytes;
    spmd_status prepared = SPMD_OK;
    if (l == 0 && outer > 1 && !stage_reserve(g, (size_t)block * (size_t)(g->n - g->k)))
        prepared = base_error_status();
    st = enter(g, l,
               (coll_call){.op = COLL_OP_ALL_GATHER, .in = in, .out = out, .a = outer,
                           .b = inner_bytes},
               prepared);
    if (st) return st;
    unsigned char *o = out, *stage = g->stage;
    if (l == 0) {
        /* Remote blocks straight into place when they are contiguous. */
        for (int j = 0; j < g->n; j++)
            if (g->local_of[j] < 0)
                recv_from(g, outer == 1 ? o + inner_bytes * j : stage + block * g->remote_of[j],
                          block, g->proc_of[j]);
        for (int i = 0; i < g->k; i++)
            for (int c = 0; c < g->q; c++)
                if (c != g->me) send_to(g, coll_shm_in(g->shm, i), block, c);
    }
    /* Local blocks, while the messages travel.  `in` may be this member's
     * own block of `out` (outer == 1). */
    for (int i = 0; i < g->k; i++)
        place_block(g, o, coll_shm_in(g->shm, i), g->local[i], outer, inner_bytes);
    if (l == 0) {
        st = xfer_wait(g);
        if (!st && outer > 1)
            for (int j = 0; j < g->n; j++)
                if (g->local_of[j] < 0)
                    place_block(g, o, stage + block * g->remote_of[j], j, outer, inner_bytes);
    }
    st = exchanged(g, l, st);
    if (!st && l != 0) {
        const unsigned char *lead = coll_shm_out(g->shm, 0);
        size_t row = (size_t)(inner_bytes * g->n);
        for (int64_t r = 0; r < outer; r++)
            for (int j = 0; j < g->n; j++)
                if (g->local_of[j] < 0)
                    copy(o + row * (size_t)r + (size_t)(inner_bytes * j),
                         lead + row * (size_t)r + (size_t)(inner_bytes * j), (size_t)inner_bytes);
    }
    coll_shm_sync(g->shm, l);
    return st;
}

/* ---- All-to-all, broadcast, permute --------------------------------------------------- */

/* Every message goes straight from a member's buffer to a member's buffer:
 * between two processes they are posted in the order (sending member,
 * receiving member) on both sides, so they match. */
static spmd_status mpi_all_to_all(coll_group *pub, int member, const void *in, void *out,
                                  int64_t bytes)
{
    mpi_group *g = pub->impl;
    int l = local_index(g, member, COLL_OP_ALL_TO_ALL);
    if (l < 0) return base_error_status();
    if (bytes < 0 || (bytes > 0 && (!in || !out)))
        return base_error(SPMD_ERR_INVALID, "all_to_all: blocks of %lld bytes", (long long)bytes);
    if (in == out && bytes > 0)
        return base_error(SPMD_ERR_INVALID, "all_to_all: out must not be in");
    spmd_status st = usable(g);
    if (st) return st;
    st = enter(g, l, (coll_call){.op = COLL_OP_ALL_TO_ALL, .in = in, .out = out, .a = bytes},
               SPMD_OK);
    if (st) return st;
    if (l == 0) {
        for (int i = 0; i < g->n; i++)
            if (g->local_of[i] < 0)
                for (int jl = 0; jl < g->k; jl++)
                    recv_from(g, (unsigned char *)coll_shm_out(g->shm, jl) + bytes * i, bytes,
                              g->proc_of[i]);
        for (int il = 0; il < g->k; il++)
            for (int j = 0; j < g->n; j++)
                if (g->local_of[j] < 0)
                    send_to(g, (const unsigned char *)coll_shm_in(g->shm, il) + bytes * j, bytes,
                            g->proc_of[j]);
    }
    for (int il = 0; il < g->k; il++)
        copy((unsigned char *)out + bytes * g->local[il],
             (const unsigned char *)coll_shm_in(g->shm, il) + bytes * member, (size_t)bytes);
    /* The leader writes into its peers' outputs: they leave after it. */
    return exchanged(g, l, l == 0 ? xfer_wait(g) : SPMD_OK);
}

/* A binomial tree over the group's processes, rooted at the root's
 * process; inside each process the members copy from the root or the
 * leader. */
static spmd_status broadcast_exchange(mpi_group *g, int root, int64_t bytes)
{
    int q = g->q, rp = g->proc_of[root];
    int v = (g->me - rp + q) % q;
    void *source = coll_shm_out(g->shm, rp == g->me ? g->local_of[root] : 0);
    int mask = 1;
    for (; mask < q; mask <<= 1)
        if (v & mask) {
            recv_from(g, source, bytes, (v - mask + rp) % q);
            spmd_status st = xfer_wait(g);
            if (st) return st;
            break;
        }
    for (mask >>= 1; mask > 0; mask >>= 1)
        if (v + mask < q) send_to(g, source, bytes, (v + mask + rp) % q);
    return xfer_wait(g);
}

static spmd_status mpi_broadcast(coll_group *pub, int member, void *buf, int64_t bytes, int root)
{
    mpi_group *g = pub->impl;
    int l = local_index(g, member, COLL_OP_BROADCAST);
    if (l < 0) return base_error_status();
    if (root < 0 || root >= g->n)
        return base_error(SPMD_ERR_INVALID, "broadcast: root %d of a group of %d", root, g->n);
    if (bytes < 0 || (bytes > 0 && !buf))
        return base_error(SPMD_ERR_INVALID, "broadcast: %lld bytes", (long long)bytes);
    spmd_status st = usable(g);
    if (st) return st;
    st = enter(g, l,
               (coll_call){.op = COLL_OP_BROADCAST, .in = buf, .out = buf, .a = bytes,
                           .root = root},
               SPMD_OK);
    if (st) return st;
    st = exchanged(g, l, l == 0 ? broadcast_exchange(g, root, bytes) : SPMD_OK);
    int source = g->proc_of[root] == g->me ? g->local_of[root] : 0;
    if (!st && l != source) copy(buf, coll_shm_out(g->shm, source), (size_t)bytes);
    coll_shm_sync(g->shm, l);
    return st;
}

static spmd_status mpi_permute(coll_group *pub, int member, const void *in, void *out,
                               int64_t bytes, const int *src)
{
    mpi_group *g = pub->impl;
    int l = local_index(g, member, COLL_OP_PERMUTE);
    if (l < 0) return base_error_status();
    if (!src || bytes < 0 || (bytes > 0 && (!in || !out)))
        return base_error(SPMD_ERR_INVALID, "permute: %lld bytes, source table %p",
                          (long long)bytes, (const void *)src);
    for (int i = 0; i < g->n; i++)
        if (src[i] >= g->n)
            return base_error(SPMD_ERR_INVALID, "permute: member %d reads member %d of %d", i,
                              src[i], g->n);
    spmd_status st = usable(g);
    if (st) return st;
    st = enter(g, l,
               (coll_call){.op = COLL_OP_PERMUTE, .in = in, .out = out, .a = bytes, .src = src},
               SPMD_OK);
    if (st) return st;
    if (l == 0) {
        for (int jl = 0; jl < g->k; jl++) {
            int s = src[g->local[jl]];
            if (s >= 0 && g->local_of[s] < 0)
                recv_from(g, coll_shm_out(g->shm, jl), bytes, g->proc_of[s]);
        }
        for (int i = 0; i < g->n; i++)
            if (g->local_of[i] < 0 && src[i] >= 0 && g->local_of[src[i]] >= 0)
                send_to(g, coll_shm_in(g->shm, g->local_of[src[i]]), bytes, g->proc_of[i]);
    }
    if (src[member] >= 0 && g->local_of[src[member]] >= 0)
        copy(out, coll_shm_in(g->shm, g->local_of[src[member]]), (size_t)bytes);
    return exchanged(g, l, l == 0 ? xfer_wait(g) : SPMD_OK);
}

static const coll_ops mpi_ops = {
    .all_reduce = mpi_all_reduce,
    .all_gather = mpi_all_gather,
    .reduce_scatter = mpi_reduce_scatter,
    .all_to_all = mpi_all_to_all,
    .broadcast = mpi_broadcast,
    .permute = mpi_permute,
};

/* ---- Groups ------------------------------------------------------------------------ */

static void group_free(mpi_world *w, mpi_group *g)
{
    const spmd_allocator *a = &w->alloc;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (g->comm != MPI_COMM_NULL && !finalized) MPI_Comm_free(&g->comm);
    base_free(a, g->ranks);
    base_free(a, g->procs);
    base_free(a, g->proc_of);
    base_free(a, g->local);
    base_free(a, g->local_of);
    base_free(a, g->remote_of);
    base_free(a, g->units);
    base_free(a, g->slot);
    base_free(a, g->inner);
    base_free(a, g->terms);
    base_free(a, g->x.req);
    base_free(a, g->x.st);
    base_free(a, g->x.expect);
    base_free(a, g->x.peer);
    base_free(a, g->x.idx);
    base_free(a, g->x.got);
    base_free(a, g->stage);
    base_free(a, g);
}

/* The maximal subtrees of [lo, hi) whose members share a process. */
static void find_units(mpi_group *g, int lo, int hi)
{
    bool one = true;
    for (int m = lo + 1; m < hi && one; m++) one = g->proc_of[m] == g->proc_of[lo];
    if (one) {
        g->units[g->n_units++] = (unit){lo, hi, g->proc_of[lo]};
        return;
    }
    int mid = coll_tree_mid(lo, hi);
    find_units(g, lo, mid);
    find_units(g, mid, hi);
}

static void *array(mpi_world *w, int n, size_t size, bool *ok)
{
    void *p = base_alloc(&w->alloc, size * (size_t)(n > 0 ? n : 1), "collective group");
    if (!p) *ok = false;
    return p;
}

/* Under w->mu. */
static mpi_group *group_create(mpi_world *w, int size, const int *ranks)
{
    mpi_group *g = base_calloc(&w->alloc, sizeof *g, "collective group");
    if (!g) return NULL;
    g->world = w;
    g->n = size;
    g->comm = MPI_COMM_NULL;
    bool ok = true;
    g->ranks = array(w, size, sizeof *g->ranks, &ok);
    g->procs = array(w, size, sizeof *g->procs, &ok);
    g->proc_of = array(w, size, sizeof *g->proc_of, &ok);
    g->local = array(w, size, sizeof *g->local, &ok);
    g->local_of = array(w, size, sizeof *g->local_of, &ok);
    g->remote_of = array(w, size, sizeof *g->remote_of, &ok);
    g->units = array(w, size, sizeof *g->units, &ok);
    g->slot = array(w, size, sizeof *g->slot, &ok);
    g->inner = array(w, size, sizeof *g->inner, &ok);
    if (!ok) {
        group_free(w, g);
        return NULL;
    }
    memcpy(g->ranks, ranks, sizeof *ranks * (size_t)size);
    /* The processes, ascending: a process's index is its rank in comm. */
    for (int m = 0; m < size; m++) {
        int p = ranks[m] / w->local, at = 0;
        while (at < g->q && g->procs[at] < p) at++;
        if (at < g->q && g->procs[at] == p) continue;
        memmove(g->procs + at + 1, g->procs + at, sizeof *g->procs * (size_t)(g->q - at));
        g->procs[at] = p;
        g->q++;
    }
    for (int c = 0; c < g->q; c++)
        if (g->procs[c] == w->rank) g->me = c;
    int remote = 0;
    for (int m = 0; m < size; m++) {
        int p = ranks[m] / w->local;
        for (int c = 0; c < g->q; c++)
            if (g->procs[c] == p) g->proc_of[m] = c;
        g->local_of[m] = g->remote_of[m] = -1;
        if (p == w->rank) {
            g->local_of[m] = g->k;
            g->local[g->k++] = m;
        } else {
            g->remote_of[m] = remote++;
        }
    }
    find_units(g, 0, size);
    for (int u = 0; u < g->n_units; u++) {
        const unit *un = &g->units[u];
        g->inner[u] = -1;
        if (local_unit(g, un)) {
            g->slot[u] = g->n_local_units++;
            if (un->hi - un->lo > 1) g->inner[u] = g->n_inner_units++;
        } else {
            g->slot[u] = g->n_remote_units++;
        }
    }
    g->terms = array(w, g->k * size, sizeof *g->terms, &ok);
    int local_ranks[COLL_MAX_MEMBERS];
    for (int i = 0; i < g->k; i++) local_ranks[i] = ranks[g->local[i]] - w->rank * w->local;
    g->lead = local_ranks[0];
    g->shm = ok ? coll_shm_group_private(w->shm, g->k, local_ranks) : NULL;
    if (!g->shm) {
        group_free(w, g);
        return NULL;
    }
    g->pub = (coll_group){&mpi_ops, size, g};
    return g;
}

static coll_group *mpi_world_group(void *state, int size, const int *ranks)
{
    mpi_world *w = state;
    int n = w->procs * w->local;
    if (size < 1 || size > n || !ranks) {
        base_error(SPMD_ERR_INVALID, "collectives: a group of %d in a world of %d", size, n);
        return NULL;
    }
    int here = 0, first = w->rank * w->local;
    for (int i = 0; i < size; i++) {
        if (ranks[i] < 0 || ranks[i] >= n) {
            base_error(SPMD_ERR_INVALID, "collectives: rank %d in a world of %d", ranks[i], n);
            return NULL;
        }
        for (int j = 0; j < i; j++)
            if (ranks[j] == ranks[i]) {
                base_error(SPMD_ERR_INVALID, "collectives: rank %d twice in a group", ranks[i]);
                return NULL;
            }
        here += ranks[i] >= first && ranks[i] < first + w->local;
    }
    if (here == 0) {
        base_error(SPMD_ERR_INVALID,
                   "collectives: a group of %d with no device in process %d (devices %d to %d)",
                   size, w->rank, first, first + w->local - 1);
        return NULL;
    }
    if (here == size) {
        int local[COLL_MAX_MEMBERS];
        for (int i = 0; i < size; i++) local[i] = ranks[i] - first;
        return coll_shm_world_group(w->shm, size, local);
    }
    pthread_mutex_lock(&w->mu);
    mpi_group *g = w->groups;
    while (g && !(g->n == size && memcmp(g->ranks, ranks, sizeof *ranks * (size_t)size) == 0))
        g = g->next;
    if (!g) {
        g = group_create(w, size, ranks);
        if (g) {
            g->next = w->groups;
            w->groups = g;
        }
    }
    pthread_mutex_unlock(&w->mu);
    return g ? &g->pub : NULL;
}

/* ---- Connecting: one communicator per group ------------------------------------------ */

/* A group as connect lists it: [size, rank 0, rank 1, ...]. */
static int key_cmp(const int *a, const int *b)
{
    if (a[0] != b[0]) return a[0] < b[0] ? -1 : 1;
    for (int i = 1; i <= a[0]; i++)
        if (a[i] != b[i]) return a[i] < b[i] ? -1 : 1;
    return 0;
}

typedef struct listing {
    const int *key;
    int proc; /* the process that asked for the group */
} listing;

static int listing_cmp(const void *x, const void *y)
{
    const listing *a = x, *b = y;
    int c = key_cmp(a->key, b->key);
    return c ? c : (a->proc > b->proc) - (a->proc < b->proc);
}

/* Whether the processes that asked for the group, e[0 .. count), are the
 * processes its devices live in (both ascending). */
static bool listed_by_its_processes(const mpi_world *w, const listing *e, int count)
{
    const int *key = e[0].key;
    int seen = 0;
    for (int want = 0; want < w->procs; want++) {
        bool has = false;
        for (int i = 1; i <= key[0] && !has; i++) has = key[i] / w->local == want;
        if (!has) continue;
        if (seen >= count || e[seen].proc != want) return false;
        seen++;
    }
    return seen == count;
}

static spmd_status make_comm(mpi_world *w, mpi_group *g, int tag)
{
    MPI_Group all, sub;
    int rc = MPI_Comm_group(w->comm, &all);
    if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Comm_group");
    rc = MPI_Group_incl(all, g->q, g->procs, &sub);
    MPI_Group_free(&all);
    if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Group_incl");
    rc = MPI_Comm_create_group(w->comm, sub, tag, &g->comm);
    MPI_Group_free(&sub);
    if (rc != MPI_SUCCESS) {
        g->comm = MPI_COMM_NULL;
        return mpi_error(rc, "MPI_Comm_create_group");
    }
    MPI_Comm_set_errhandler(g->comm, MPI_ERRORS_RETURN);
    int rank = -1;
    MPI_Comm_rank(g->comm, &rank);
    if (rank != g->me)
        return BASE_INTERNAL("a group's communicator ranks its processes differently");
    return SPMD_OK;
}

/* Every process lists the groups it asked for and has not connected;
 * all processes get every list, so all of them see the same union, check
 * it alike, and make the communicators in the same order (sorted by
 * member list), each process only those of its groups.  That order makes
 * MPI_Comm_create_group, which waits for the group's processes, free of
 * deadlock: the first group not yet made has every process at it. */
static spmd_status connect_locked(mpi_world *w)
{
    const spmd_allocator *a = &w->alloc;
    int mine_len = 0;
    for (mpi_group *g = w->groups; g; g = g->next)
        if (g->comm == MPI_COMM_NULL) mine_len += 1 + g->n;
    int *mine = base_alloc(a, sizeof *mine * (size_t)(mine_len + 1), "connect");
    int *lens = base_alloc(a, sizeof *lens * (size_t)w->procs, "connect");
    int *displs = base_alloc(a, sizeof *displs * (size_t)w->procs, "connect");
    int *all = NULL;
    listing *e = NULL;
    spmd_status st = SPMD_OK;
    if (!mine || !lens || !displs) {
        st = SPMD_ERR_NOMEM;
        goto done;
    }
    int at = 0;
    for (mpi_group *g = w->groups; g; g = g->next)
        if (g->comm == MPI_COMM_NULL) {
            mine[at++] = g->n;
            memcpy(mine + at, g->ranks, sizeof *mine * (size_t)g->n);
            at += g->n;
        }
    int rc = MPI_Allgather(&mine_len, 1, MPI_INT, lens, 1, MPI_INT, w->comm);
    if (rc != MPI_SUCCESS) {
        st = mpi_error(rc, "MPI_Allgather");
        goto done;
    }
    int64_t total = 0;
    for (int p = 0; p < w->procs; p++) {
        displs[p] = (int)total;
        total += lens[p];
    }
    if (total > INT_MAX) {
        st = base_error(SPMD_ERR_UNSUPPORTED, "collectives: %lld group entries to connect",
                        (long long)total);
        goto done;
    }
    all = base_alloc(a, sizeof *all * (size_t)(total + 1), "connect");
    if (!all) {
        st = SPMD_ERR_NOMEM;
        goto done;
    }
    rc = MPI_Allgatherv(mine, mine_len, MPI_INT, all, lens, displs, MPI_INT, w->comm);
    if (rc != MPI_SUCCESS) {
        st = mpi_error(rc, "MPI_Allgatherv");
        goto done;
    }
    int entries = 0;
    for (int64_t i = 0; i < total; i += 1 + all[i]) entries++;
    e = base_alloc(a, sizeof *e * (size_t)(entries + 1), "connect");
    if (!e) {
        st = SPMD_ERR_NOMEM;
        goto done;
    }
    entries = 0;
    for (int p = 0; p < w->procs; p++)
        for (int i = displs[p]; i < displs[p] + lens[p]; i += 1 + all[i])
            e[entries++] = (listing){all + i, p};
    qsort(e, (size_t)entries, sizeof *e, listing_cmp);
    for (int i = 0, j; i < entries; i = j) {
        for (j = i + 1; j < entries && key_cmp(e[j].key, e[i].key) == 0;) j++;
        if (!listed_by_its_processes(w, e + i, j - i)) {
            st = base_error(SPMD_ERR_INVALID,
                            "collectives: processes disagree about a group of %d devices (%d, "
                            "...): %d processes asked for it, not every process holding one of "
                            "its devices (each must ask for each group it is in)",
                            e[i].key[0], e[i].key[1], j - i);
            goto done;
        }
    }
    for (int i = 0, j, run = 0; i < entries; i = j, run++) {
        bool here = false;
        for (j = i; j < entries && key_cmp(e[j].key, e[i].key) == 0; j++)
            here |= e[j].proc == w->rank;
        if (!here) continue;
        mpi_group *g = w->groups;
        while (g && !(g->n == e[i].key[0] &&
                      !memcmp(g->ranks, e[i].key + 1, sizeof(int) * (size_t)g->n)))
            g = g->next;
        if (!g) {
            st = BASE_INTERNAL("a connected group is not in the list");
            goto done;
        }
        st = make_comm(w, g, run % 32768);
        if (st) goto done;
    }
done:
    base_free(a, mine);
    base_free(a, lens);
    base_free(a, displs);
    base_free(a, all);
    base_free(a, e);
    return st;
}

static spmd_status mpi_world_connect(void *state)
{
    mpi_world *w = state;
    pthread_mutex_lock(&w->mu);
    spmd_status st = connect_locked(w);
    pthread_mutex_unlock(&w->mu);
    return st;
}

/* ---- Gathers over processes --------------------------------------------------------- */

/* One MPI_Allgatherv of bytes: its counts and displacements are ints, so
 * a gather of 2 GiB or more in all is refused. */
static spmd_status mpi_world_gather(void *state, const void *in, void *out, const int64_t *bytes_of)
{
    mpi_world *w = state;
    int64_t total = 0;
    for (int q = 0; q < w->procs; q++) total += bytes_of[q];
    if (total > INT_MAX)
        return base_error(SPMD_ERR_UNSUPPORTED,
                          "collectives: a gather over processes of %lld bytes (MPI counts stop "
                          "at 2 GiB)", (long long)total);
    int *counts = base_alloc(&w->alloc, 2 * (size_t)w->procs * sizeof *counts, "process gather");
    if (!counts) return SPMD_ERR_NOMEM;
    int *displs = counts + w->procs;
    for (int q = 0, at = 0; q < w->procs; q++) {
        counts[q] = (int)bytes_of[q];
        displs[q] = at;
        at += counts[q];
    }
    /* Polled, as every wait of the world: the watchdog watches it too. */
    MPI_Request req;
    int rc = MPI_Iallgatherv(in, counts[w->rank], MPI_BYTE, out, counts, displs, MPI_BYTE,
                             w->comm, &req);
    if (rc != MPI_SUCCESS) {
        base_free(&w->alloc, counts);
        return mpi_error(rc, "MPI_Iallgatherv");
    }
    int64_t limit = coll_world_timeout_ns(w->shm), since = 0;
    spmd_status st = SPMD_OK;
    for (int spins = 0;; spins++) {
        int done = 0;
        rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
            st = mpi_error(rc, "MPI_Iallgatherv");
            break;
        }
        if (done) break;
        if (spins < POLL_SPINS) continue;
        sched_yield();
        if (limit <= 0 || spins % CLOCK_POLLS) continue;
        int64_t now = rt_wait_now_ns();
        if (!since) since = now;
        if (now - since < limit) continue;
        /* A collective over every process cannot say which is missing. */
        st = base_error(SPMD_ERR_TIMEOUT,
                        "collective timeout: a gather over the %d processes: process %d on %s "
                        "waited %.1f s for the others",
                        w->procs, w->rank, w->hosts[w->rank], (double)(now - since) * 1e-9);
        char msg[MESSAGE];
        snprintf(msg, sizeof msg, "%s", spmd_last_error());
        coll_world_abort(w->shm, msg);
        base_error(SPMD_ERR_TIMEOUT, "%s", msg);
        /* MPI can neither cancel nor free a collective's request: it is
         * left behind, and the caller ends the job (MPI_Abort). */
        break;
    }
    base_free(&w->alloc, counts);
    return st;
}

/* ---- The world --------------------------------------------------------------------- */

static void mpi_world_abort(void *state, const char *message)
{
    mpi_world *w = state;
    pthread_mutex_lock(&w->fail_mu);
    if (!atomic_load(&w->failed)) {
        snprintf(w->failure, sizeof w->failure, "%s", message);
        atomic_store(&w->failed, true);
    }
    pthread_mutex_unlock(&w->fail_mu);
}

static void mpi_world_free(void *state)
{
    mpi_world *w = state;
    for (mpi_group *g = w->groups, *next; g; g = next) {
        next = g->next;
        group_free(w, g);
    }
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (w->comm != MPI_COMM_NULL && !finalized) MPI_Comm_free(&w->comm);
    pthread_mutex_destroy(&w->mu);
    pthread_mutex_destroy(&w->fail_mu);
    spmd_allocator a = w->alloc;
    base_free(&a, w->hosts);
    base_free(&a, w);
}

static const char *thread_level(int level)
{
    switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    default: return "MPI_THREAD_MULTIPLE";
    }
}

coll_world *coll_mpi_world_create(MPI_Comm comm, int local_devices, const spmd_allocator *alloc)
{
    int initialized = 0, finalized = 0, level = MPI_THREAD_SINGLE;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized || finalized) {
        base_error(SPMD_ERR_INVALID, "collectives: MPI is %s (MPI_Init_thread with "
                                     "MPI_THREAD_MULTIPLE comes first)",
                   finalized ? "finalized" : "not initialised");
        return NULL;
    }
    MPI_Query_thread(&level);
    if (level != MPI_THREAD_MULTIPLE) {
        base_error(SPMD_ERR_UNSUPPORTED,
                   "collectives: MPI runs with %s, but device threads call MPI at the same time: "
                   "initialise it with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) on an MPI "
                   "library that provides it",
                   thread_level(level));
        return NULL;
    }
    if (comm == MPI_COMM_NULL) {
        base_error(SPMD_ERR_INVALID, "collectives: MPI_COMM_NULL");
        return NULL;
    }
    int procs = 0, rank = 0;
    MPI_Comm_size(comm, &procs);
    MPI_Comm_rank(comm, &rank);
    if (local_devices < 1 || (int64_t)procs * local_devices > COLL_MAX_MEMBERS) {
        base_error(SPMD_ERR_INVALID,
                   "collectives: %d processes of %d devices (1 to %d devices in all)", procs,
                   local_devices, COLL_MAX_MEMBERS);
        return NULL;
    }
    /* Processes on one host share its cores: their waits must not spin
     * as if each had them all. */
    MPI_Comm host;
    if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &host) == MPI_SUCCESS) {
        int here = 1;
        MPI_Comm_size(host, &here);
        MPI_Comm_free(&host);
        rt_wait_share_cpus(here);
    }
    spmd_allocator a = base_allocator_or_default(alloc);
    mpi_world *w = base_calloc(&a, sizeof *w, "collectives world");
    if (!w) return NULL;
    w->shm = coll_shm_world_create(local_devices, &a);
    if (!w->shm) {
        base_free(&a, w);
        return NULL;
    }
    int rc = MPI_Comm_dup(comm, &w->comm);
    if (rc != MPI_SUCCESS) {
        mpi_error(rc, "MPI_Comm_dup");
        coll_world_free(w->shm);
        base_free(&a, w);
        return NULL;
    }
    MPI_Comm_set_errhandler(w->comm, MPI_ERRORS_RETURN);
    /* Every process's host, once, so that the watchdog can name the host
     * of the process a collective waited for. */
    w->hosts = base_calloc(&a, sizeof *w->hosts * (size_t)procs, "collectives world");
    char name[MPI_MAX_PROCESSOR_NAME] = {0};
    int name_len = 0;
    if (MPI_Get_processor_name(name, &name_len) != MPI_SUCCESS || name_len <= 0)
        snprintf(name, sizeof name, "(unknown host)");
    int hosts_ok = w->hosts != NULL, all_ok = 0;
    rc = MPI_Allreduce(&hosts_ok, &all_ok, 1, MPI_INT, MPI_MIN, w->comm);
    if (rc == MPI_SUCCESS && all_ok)
        rc = MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, w->hosts,
                           MPI_MAX_PROCESSOR_NAME, MPI_CHAR, w->comm);
    if (rc != MPI_SUCCESS || !all_ok) {
        if (rc != MPI_SUCCESS) mpi_error(rc, "MPI_Allgather of the hosts");
        else base_error(SPMD_ERR_NOMEM, "collectives: out of memory for the processes' hosts");
        base_free(&a, w->hosts);
        MPI_Comm_free(&w->comm);
        coll_world_free(w->shm);
        base_free(&a, w);
        return NULL;
    }
    for (int q = 0; q < procs; q++) w->hosts[q][MPI_MAX_PROCESSOR_NAME - 1] = '\0';
    w->procs = procs;
    w->rank = rank;
    w->local = local_devices;
    w->alloc = a;
    pthread_mutex_init(&w->mu, NULL);
    pthread_mutex_init(&w->fail_mu, NULL);
    atomic_init(&w->failed, false);
    w->ext = (coll_world_ext){
        .group = mpi_world_group,
        .connect = mpi_world_connect,
        .gather = mpi_world_gather,
        .abort = mpi_world_abort,
        .free = mpi_world_free,
        .first = rank * local_devices,
        .count = local_devices,
        .size = procs * local_devices,
    };
    coll_shm_world_extend(w->shm, &w->ext, w);
    return w->shm;
}

coll_world *coll_world_create(int devices, const void *mpi_comm, const spmd_allocator *alloc)
{
    if (!mpi_comm) return coll_shm_world_create(devices, alloc);
    MPI_Comm comm = *(const MPI_Comm *)mpi_comm;
    int initialized = 0, procs = 0;
    MPI_Initialized(&initialized);
    if (initialized && comm != MPI_COMM_NULL) MPI_Comm_size(comm, &procs);
    if (procs > 0 && devices % procs != 0) {
        base_error(SPMD_ERR_INVALID,
                   "compile: the mesh's %d devices do not divide over the %d processes of the "
                   "communicator (each process runs devices / processes of them)",
                   devices, procs);
        return NULL;
    }
    /* Anything else wrong (MPI not initialised, a null communicator) is
     * named by the world itself. */
    return coll_mpi_world_create(comm, procs > 0 ? devices / procs : devices, alloc);
}

#else
#include "runtime/collectives.h"

#include "base/error.h"

coll_world *coll_world_create(int devices, const void *mpi_comm, const spmd_allocator *alloc)
{
    if (!mpi_comm) return coll_shm_world_create(devices, alloc);
    base_error(SPMD_ERR_UNSUPPORTED,
               "compile: a run over MPI processes needs a libspmd built with MPI (this one was "
               "built without it: install libopenmpi-dev and configure with -DSPMD_MPI=ON)");
    return NULL;
}
#endif
