/*
 * Running the mpirun line of `spmd launch` (launch_watch.c) and making
 * sure the job ends: mpirun's standard error passes through the launcher,
 * which reads in it Open MPI's notice that a process called MPI_Abort
 * (an error, or the collective watchdog naming a host that stopped
 * answering).  From then on the job is ending, and mpirun gets
 * `abort_wait_s` seconds to end it; past them it is waiting for a daemon
 * it cannot reach, which Open MPI gives up only when TCP gives up the
 * connection (Linux's tcp_retries2 of 15: about 15 minutes), so the
 * launcher ends mpirun itself.  The same holds after a signal
 * (SIGINT, SIGQUIT, SIGTERM, SIGHUP): one a process sent to the launcher
 * is passed on to mpirun, one from a terminal reached mpirun already
 * (they share a process group).  mpirun gets SIGTERM if the launcher
 * dies.
 */
#ifndef SPMD_TOOLS_LAUNCH_WATCH_H
#define SPMD_TOOLS_LAUNCH_WATCH_H

/* Runs argv (argv[0] found on PATH) to its end.  Returns mpirun's exit
 * status (128 + N when killed by signal N), but: the abort's error code
 * (1 if Open MPI did not say) when the launcher ended mpirun, or when
 * mpirun exited 0 although a process had called MPI_Abort or a host's
 * daemon was lost (Open MPI 5.0.7 does); 127 with a message when mpirun
 * cannot be started. */
int launch_watch_run(char *const argv[], double abort_wait_s);

#endif
