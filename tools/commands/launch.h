/* `spmd launch [flags] [--] COMMAND...` (launch.c). */
#ifndef SPMD_TOOLS_LAUNCH_H
#define SPMD_TOOLS_LAUNCH_H

/* The words after "spmd launch": the job's exit status (launch_watch.h),
 * 0 after --dry-run on or --help, or 2 after a message. */
int cmd_launch(int argc, char **argv);

#endif
