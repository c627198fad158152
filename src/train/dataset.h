/*
 * Inside spmd_dataset: one handle type over several kinds of data.  Each
 * kind (dataset_arith.c, dataset_text.c, dataset_shards.c) fills in the
 * handle's ops, vocabulary and description; dataset.c owns the handle, the
 * argument checks and the batching, so every kind only has to produce one
 * sample of seq+1 tokens from (seed, split, index).  The file-backed kinds
 * share their helpers through dataset_file.h, not through dataset.c.
 */
#ifndef SPMD_TRAIN_DATASET_H
#define SPMD_TRAIN_DATASET_H

#include "spmd/data.h"

typedef struct dataset_ops {
    /* seq+1 tokens of sample `index` of `split`.  `scored` (NULL unless the
     * kind has accuracy) gets 1 where a token is scored when predicted. */
    spmd_status (*sample)(const spmd_dataset *d, spmd_split split, uint64_t index,
                          int32_t *tokens, uint8_t *scored);
    spmd_status (*check_vocab)(const spmd_dataset *d, int vocab);
    void (*destroy)(void *impl);
} dataset_ops;

struct spmd_dataset {
    const dataset_ops *ops;
    void *impl;
    int seq;
    uint64_t seed;
    int vocab;
    bool has_accuracy;
    bool can_sequential; /* the kind has a sequential order */
    spmd_data_order order;
    int64_t heldout_size; /* see spmd_dataset_heldout_size */
    char describe[512];
    /* One sample's seq+1 tokens and flags, reused across calls. */
    int32_t *tokens;
    uint8_t *scored;
};

/* Each fills d->ops, impl, vocab, has_accuracy, heldout_size and describe,
 * or returns an error and leaves d->impl NULL.  d->seq and d->seed are set
 * already. */
spmd_status dataset_arith_open(spmd_dataset *d, const char *spec);
spmd_status dataset_text_open(spmd_dataset *d, const char *path);
spmd_status dataset_shards_open(spmd_dataset *d, const char *pattern);

#endif
