/*
 * The `spmd` tool over several processes: started by mpirun (or any
 * launcher that sets the PMI/PMIx environment), the tool initialises MPI
 * with MPI_THREAD_MULTIPLE and runs the mesh with devices / P devices in
 * each process.  Process 0 prints and writes files; every process prints
 * its errors.  Started on its own it runs as one process, without MPI.
 */
#ifndef SPMD_TOOLS_PROCESSES_H
#define SPMD_TOOLS_PROCESSES_H

#include <stdbool.h>
#include <stddef.h>

/* Initialise MPI when a launcher started this process; other processes
 * than 0 get their standard output sent to /dev/null.  0, or an exit code
 * with a message. */
int processes_start(int *argc, char ***argv);
/* End the run with exit code rc: over several processes a failure ends
 * every process (MPI_Abort: the others may be waiting in a collective),
 * and success finalises MPI.  Returns rc. */
int processes_end(int rc);
/* How many processes run the tool (1 without a launcher), and this one's rank. */
int processes_count(void);
/* How many of them run on this host (they share its cores). */
int processes_here(void);
int processes_rank(void);
/* The communicator to compile with (spmd_compile_options.mpi_comm):
 * MPI_COMM_WORLD over several processes, NULL otherwise. */
const void *processes_mpi_comm(void);
/* Every process's `mine` at all[rank] on every process (one value each);
 * a copy with one process.  0, or 1 with a message. */
int processes_gather_double(double mine, double *all);
/* Measure the network between process 0 and the last one (ping-pong of
 * small and large messages, in rounds): latency per message and
 * bandwidth.  Every
 * process calls it; 0, or 1 with a message. */
int processes_measure_network(double *latency_s, double *bytes_per_s);
/* The rounds of the last measurement, on process 0 (0 rounds elsewhere):
 * each round's latency and bandwidth; the figures are the least disturbed
 * of them. */
int processes_network_rounds(const double **latency_s, const double **bytes_per_s);
/* Whether every process was started with process 0's settings: `settings`
 * is `len` bytes of NUL-terminated name and value pairs in one order
 * (flags_settings).  Every process calls it; a 64-bit digest of each is
 * compared first, and only on a difference the texts travel.  0 when they
 * agree (or one process), else 2 after every process has printed the
 * first setting that differs with both values; processes_end then ends
 * each process on its own, without MPI_Abort. */
int processes_agree(const char *settings, size_t len);

#endif
