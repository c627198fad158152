/* `spmd train` (train.c). */
#ifndef SPMD_TOOLS_TRAIN_H
#define SPMD_TOOLS_TRAIN_H

/* The words after "spmd train"; the exit status (0, or an exit code after a message). */
int cmd_train(int argc, char **argv);

#endif
