/*
 * spmd_dataset: picks the kind of data from the source string, checks
 * arguments, and assembles batches one sample at a time, so a batch is just
 * samples first..first+batch-1 and never depends on the batch size.
 */
#include "train/dataset.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/error.h"

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* An existing path is taken literally (a file name may contain '['); only a
 * path that does not exist is read as a glob. */
static bool is_shards(const char *source)
{
    struct stat st;
    if (stat(source, &st) == 0) return ends_with(source, ".bin");
    return ends_with(source, ".bin") || strpbrk(source, "*?[") != NULL;
}

spmd_dataset *spmd_dataset_open(const char *source, int seq, uint64_t seed)
{
    if (seq <= 0) {
        base_error(SPMD_ERR_INVALID, "dataset: seq must be positive (got %d)", seq);
        return NULL;
    }
    if (source && !*source) {
        base_error(SPMD_ERR_INVALID,
                   "dataset: empty source (NULL or \"arith\" for the synthetic set, a .bin "
                   "file or glob for llm.c shards, any other path for a text file)");
        return NULL;
    }
    spmd_dataset *d = calloc(1, sizeof *d);
    if (!d) {
        base_error(SPMD_ERR_NOMEM, "dataset: out of memory");
        return NULL;
    }
    d->seq = seq;
    d->seed = seed;
    d->tokens = malloc(((size_t)seq + 1) * sizeof *d->tokens);
    d->scored = malloc((size_t)seq + 1);
    spmd_status st;
    if (!d->tokens || !d->scored)
        st = base_error(SPMD_ERR_NOMEM, "dataset: out of memory for seq %d", seq);
    else if (!source || !strcmp(source, "arith") || !strncmp(source, "arith:", 6))
        st = dataset_arith_open(d, source ? source : "arith");
    else if (is_shards(source))
        st = dataset_shards_open(d, source);
    else
        st = dataset_text_open(d, source);
    if (st != SPMD_OK) {
        spmd_dataset_free(d);
        return NULL;
    }
    return d;
}

void spmd_dataset_free(spmd_dataset *d)
{
    if (!d) return;
    if (d->ops && d->impl) d->ops->destroy(d->impl);
    free(d->tokens);
    free(d->scored);
    free(d);
}

int spmd_dataset_vocab(const spmd_dataset *d) { return d ? d->vocab : 0; }
int spmd_dataset_seq(const spmd_dataset *d) { return d ? d->seq : 0; }
const char *spmd_dataset_describe(const spmd_dataset *d) { return d ? d->describe : ""; }
bool spmd_dataset_has_accuracy(const spmd_dataset *d) { return d && d->has_accuracy; }
int64_t spmd_dataset_heldout_size(const spmd_dataset *d) { return d ? d->heldout_size : 0; }

spmd_status spmd_dataset_set_order(spmd_dataset *d, spmd_data_order order)
{
    if (!d) return base_error(SPMD_ERR_INVALID, "spmd_dataset_set_order: NULL dataset");
    if (order != SPMD_DATA_SHUFFLED && order != SPMD_DATA_SEQUENTIAL)
        return base_error(SPMD_ERR_INVALID, "spmd_dataset_set_order: unknown order %d", (int)order);
    if (order == SPMD_DATA_SEQUENTIAL && !d->can_sequential)
        return base_error(SPMD_ERR_UNSUPPORTED,
                          "a sequential order is for llm.c token shards; %s is sampled", d->describe);
    d->order = order;
    return SPMD_OK;
}

static spmd_status check_range(const spmd_dataset *d, const char *fn, spmd_split split,
                               int64_t first, int batch, const void *a, const void *b)
{
    if (!d) return base_error(SPMD_ERR_INVALID, "%s: dataset is NULL", fn);
    if (split != SPMD_SPLIT_TRAIN && split != SPMD_SPLIT_HELDOUT)
        return base_error(SPMD_ERR_INVALID, "%s: unknown split %d", fn, (int)split);
    if (batch <= 0 || first < 0 || first > INT64_MAX - batch)
        return base_error(SPMD_ERR_INVALID,
                          "%s: need batch > 0 and 0 <= first (got batch %d, first %lld)", fn,
                          batch, (long long)first);
    if (!a || !b) return base_error(SPMD_ERR_INVALID, "%s: output buffer is NULL", fn);
    return SPMD_OK;
}

spmd_status spmd_dataset_batch(spmd_dataset *d, spmd_split split, int64_t first, int batch,
                               int32_t *input, int32_t *targets)
{
    spmd_status st = check_range(d, "dataset_batch", split, first, batch, input, targets);
    if (st != SPMD_OK) return st;
    size_t seq = (size_t)d->seq;
    for (int b = 0; b < batch; b++) {
        st = d->ops->sample(d, split, (uint64_t)(first + b), d->tokens, NULL);
        if (st != SPMD_OK) return st;
        memcpy(input + (size_t)b * seq, d->tokens, seq * sizeof *input);
        memcpy(targets + (size_t)b * seq, d->tokens + 1, seq * sizeof *targets);
    }
    return SPMD_OK;
}

spmd_status spmd_dataset_score_mask(spmd_dataset *d, spmd_split split, int64_t first, int batch,
                                    uint8_t *mask)
{
    spmd_status st = check_range(d, "dataset_score_mask", split, first, batch, mask, mask);
    if (st != SPMD_OK) return st;
    if (!d->has_accuracy)
        return base_error(SPMD_ERR_UNSUPPORTED,
                          "dataset_score_mask: %s has no accuracy (only arith data marks "
                          "answers)", d->describe);
    size_t seq = (size_t)d->seq;
    for (int b = 0; b < batch; b++) {
        st = d->ops->sample(d, split, (uint64_t)(first + b), d->tokens, d->scored);
        if (st != SPMD_OK) return st;
        /* mask[t] scores targets[t], which is token t+1 of the sample. */
        memcpy(mask + (size_t)b * seq, d->scored + 1, seq);
    }
    return SPMD_OK;
}

spmd_status spmd_dataset_check_vocab(const spmd_dataset *d, int vocab)
{
    if (!d) return base_error(SPMD_ERR_INVALID, "dataset_check_vocab: dataset is NULL");
    if (vocab <= 0)
        return base_error(SPMD_ERR_INVALID, "dataset_check_vocab: vocab must be positive (got %d)",
                          vocab);
    if (d->vocab <= vocab) return SPMD_OK;
    return d->ops->check_vocab(d, vocab);
}
