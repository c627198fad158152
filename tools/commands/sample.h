/* `spmd sample` (sample.c). */
#ifndef SPMD_TOOLS_SAMPLE_H
#define SPMD_TOOLS_SAMPLE_H

/* The words after "spmd sample"; the exit status (0, or an exit code after a message). */
int cmd_sample(int argc, char **argv);

#endif
