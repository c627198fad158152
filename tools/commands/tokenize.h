/* `spmd tokenize TEXT... --out DIR [--val-fraction X] [--encoder DIR]`
 * (tokenize.c). */
#ifndef SPMD_TOOLS_TOKENIZE_H
#define SPMD_TOOLS_TOKENIZE_H

/* The words after "spmd tokenize": 0, or the exit status with a message
 * (2: bad flags, no encoder, an unreadable text file, shards already there,
 * too many tokens for a shard; 1: a write that fails). */
int cmd_tokenize(int argc, char **argv);

#endif
