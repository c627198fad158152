/*
 * Where `spmd launch` puts its processes (launch_hosts.c): the hosts of
 * --hosts (an Open MPI hostfile, or a list HOST:SLOTS,...), or Slurm's
 * allocation when the launch runs inside one and --hosts is not given
 * (SLURM_JOB_NODELIST's compressed names, SLURM_TASKS_PER_NODE's counts,
 * SLURM_NTASKS), or this host alone.
 */
#ifndef SPMD_TOOLS_LAUNCH_HOSTS_H
#define SPMD_TOOLS_LAUNCH_HOSTS_H

/* Hosts a list may name at most (a Slurm allocation's nodes included). */
#define LAUNCH_MAX_HOSTS 65536

typedef struct launch_host {
    char *name;
    int slots; /* processes it takes */
} launch_host;

typedef struct launch_hosts {
    const char *file;   /* --hosts FILE: a hostfile, read by mpirun; NULL otherwise */
    launch_host *host;  /* a list: --hosts LIST or Slurm's allocation */
    int n;              /* hosts in the list; 0 with a file or alone */
    int tasks;          /* Slurm's SLURM_NTASKS; 0 outside Slurm */
    char source[128];   /* what named them, for messages: "--hosts a:4,b:4", "Slurm's allocation" */
} launch_hosts;

/* The hosts for --hosts `flag` (NULL: not given), reading Slurm's
 * variables when it is not given.  0, or 2 with a message naming the
 * value refused. */
int launch_hosts_read(const char *flag, launch_hosts *h);
void launch_hosts_free(launch_hosts *h);

/* The slots of every host of the list, summed. */
long launch_hosts_slots(const launch_hosts *h);

#endif
