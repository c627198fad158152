/* `spmd plot LOG.jsonl --out FILE.svg [--title TEXT]` (plot_cmd.c). */
#ifndef SPMD_TOOLS_PLOT_CMD_H
#define SPMD_TOOLS_PLOT_CMD_H

/* The words after "spmd plot": 0, or the exit status with a message (2:
 * bad flags, an --out no file can be written to, a bad log; 1: a log that
 * cannot be read, a write that fails). */
int cmd_plot(int argc, char **argv);

#endif
