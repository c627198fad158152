/* `spmd export` (export.c). */
#ifndef SPMD_TOOLS_EXPORT_H
#define SPMD_TOOLS_EXPORT_H

/* The words after "spmd export"; the exit status (0, or an exit code after a message). */
int cmd_export(int argc, char **argv);

#endif
