/* `spmd explain` (explain.c). */
#ifndef SPMD_TOOLS_EXPLAIN_H
#define SPMD_TOOLS_EXPLAIN_H

/* The words after "spmd explain"; the exit status (0, or an exit code after a message). */
int cmd_explain(int argc, char **argv);

#endif
