/* `spmd visualize` (visualize.c). */
#ifndef SPMD_TOOLS_VISUALIZE_H
#define SPMD_TOOLS_VISUALIZE_H

/* The words after "spmd visualize"; the exit status (0, or an exit code after a message). */
int cmd_visualize(int argc, char **argv);

#endif
