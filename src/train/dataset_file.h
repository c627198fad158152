/*
 * What the file-backed kinds of data (dataset_text.c, dataset_shards.c)
 * share: opening a data file, and the length of a stream's held-out tail.
 * A module of its own below the kinds, so the dispatcher (dataset.c) calls
 * the kinds and the kinds call these, with no circle between them.
 */
#ifndef SPMD_TRAIN_DATASET_FILE_H
#define SPMD_TRAIN_DATASET_FILE_H

#include <stdint.h>

#include "spmd/spmd.h"

/* Length of the held-out tail of one stream of n tokens: 10%, but at least
 * one window of seq+1.  0 when n cannot hold a training and a held-out
 * window. */
int64_t dataset_tail_len(int64_t n, int seq);

/* Open `path` read-only and check that it is a regular file: its
 * descriptor (the caller closes it) and size, or an error "<who>: cannot
 * open|stat PATH: why" or "<who>: PATH is not a regular file", with
 * nothing left open.  An empty file is the caller's to refuse, since each
 * kind says what such a file lacks. */
spmd_status dataset_open_file(const char *who, const char *path, int *fd, int64_t *size);

#endif
