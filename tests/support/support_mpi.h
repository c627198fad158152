/*
 * Starting processes from a test: every test that launches mpirun does it
 * through scripts/mpirun.sh, the one place that knows how Open MPI 4.1
 * and 5.0 differ (root allowed, oversubscribed, which warnings to keep
 * quiet; see the script), with the mpirun CMake found (SPMD_MPIEXEC) and
 * under a timeout.
 */
#ifndef SPMD_TESTS_SUPPORT_MPI_H
#define SPMD_TESTS_SUPPORT_MPI_H

#include <stddef.h>
#include <stdio.h>

#if defined(SPMD_MPIEXEC) && defined(SPMD_SOURCE_DIR)

/* The start of a shell command line that runs mpirun under a timeout of
 * `timeout_s` seconds: sh ".../scripts/mpirun.sh" --mpirun "..." --timeout
 * S, to be followed by mpirun's own arguments (-n P, -x VAR, the program
 * and its arguments).  Double quotes, so that it also fits inside a
 * single-quoted sh -c script.  Written into buf; returns it. */
static inline const char *support_mpirun(char *buf, size_t size, int timeout_s)
{
    snprintf(buf, size, "sh \"%s/scripts/mpirun.sh\" --mpirun \"%s\" --timeout %d", SPMD_SOURCE_DIR,
             SPMD_MPIEXEC, timeout_s);
    return buf;
}

/* Whether a launch's exit status is its timeout's, 124.  (When mpirun
 * outlives the timeout's SIGTERM by 10 s it is killed: 137, which is also
 * how mpirun reports a process of the job killed with SIGKILL.) */
static inline int support_mpi_timed_out(int rc) { return rc == 124; }

#endif
#endif
