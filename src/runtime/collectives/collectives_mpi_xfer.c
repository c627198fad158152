/*
 * The leader's messages (collectives_mpi_impl.h): posting sends and
 * receives in pieces, the wait that polls so an abort ends it, its
 * watchdog, and giving up on what is pending when a group breaks.
 */
#ifdef SPMD_HAVE_MPI

#include "runtime/collectives/collectives_mpi_impl.h"

#include "base/arena.h"
#include "base/error.h"
#include "runtime/wait.h"

#include <sched.h>
#include <stdio.h>
#include <time.h>

/* MPI counts are ints: longer messages go in pieces of 64 MiB (small
 * enough that the watchdog sees a slow link's progress piece by piece:
 * 64 MiB in 100 s is 0.7 MB/s). */
enum { PIECE_BYTES = 1 << 26 };

spmd_status coll_mpi_error(int rc, const char *what)
{
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS)
        snprintf(text, sizeof text, "error %d", rc);
    return base_error(SPMD_ERR_BACKEND, "collectives: %s failed: %s", what, text);
}

static bool xfer_room(mpi_group *g, mpi_xfer *x)
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

/* coll_mpi_send (recv false) or coll_mpi_recv. */
static void post(mpi_group *g, bool recv, const void *buf, int64_t bytes, int peer)
{
    mpi_xfer *x = &g->x;
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
            x->err = coll_mpi_error(rc, recv ? "MPI_Irecv" : "MPI_Isend");
            return;
        }
        x->peer[x->n] = peer;
        x->expect[x->n++] = recv ? piece : -1;
        at += piece;
    } while (at < bytes);
}

void coll_mpi_send(mpi_group *g, const void *buf, int64_t bytes, int peer)
{
    post(g, false, buf, bytes, peer);
}

void coll_mpi_recv(mpi_group *g, void *buf, int64_t bytes, int peer)
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
    mpi_xfer *x = &g->x;
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

spmd_status coll_mpi_failure(mpi_world *w)
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
    mpi_xfer *x = &g->x;
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
spmd_status coll_mpi_wait(mpi_group *g)
{
    mpi_xfer *x = &g->x;
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
            st = break_group(g, coll_mpi_error(rc, "a collective's message (MPI_Testsome)"));
            break;
        }
        if (done == MPI_UNDEFINED) break;
        for (int j = 0; j < done; j++) x->st[x->idx[j]] = x->got[j];
        left -= done;
        moved |= done > 0;
        if (left == 0) break;
        if (atomic_load(&g->world->failed)) {
            st = break_group(g, coll_mpi_failure(g->world));
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

#endif
