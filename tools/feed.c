/*
 * The data into the programs: each step's batch and learning rate, the
 * held-out accuracy at the end and the validation loss along the way.
 * Over several processes each reads only the samples its devices hold.
 */
#include "feed.h"

#include "copies.h"
#include "message.h"
#include "processes.h"
#include "test_hooks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The samples of the batch whose rows this process's devices hold: all of
 * them in one process, a share of them over several.  A GPT's rows are
 * samples; the MLP's are tokens, seq to a sample. */
static int local_samples(const cli_opts *o, const cli_graph *c, const spmd_program *p,
                         int64_t *begin, int64_t *end)
{
    int64_t lo = 0, hi = 0, lo2 = 0, hi2 = 0;
    if (spmd_program_input_rows(p, c->input, &lo, &hi) != SPMD_OK ||
        spmd_program_input_rows(p, c->targets, &lo2, &hi2) != SPMD_OK)
        return cli_fail("cannot place the inputs: %s", spmd_last_error());
    if (hi2 > lo2) { /* both inputs' rows */
        if (hi <= lo) lo = lo2, hi = hi2;
        if (lo2 < lo) lo = lo2;
        if (hi2 > hi) hi = hi2;
    }
    int seq = !strcmp(o->model, "gpt") ? 1 : o->gpt.seq;
    *begin = lo / seq;
    *end = (hi + seq - 1) / seq;
    /* Pipeline stages: rows are micro-batches of dim 1's samples. */
    if (spmd_tensor_rank(c->input) == 3 && !strcmp(o->model, "gpt")) {
        int64_t b = spmd_tensor_dim(c->input, 1);
        *begin *= b;
        *end *= b;
    }
    return 0;
}

/* Inputs of copy `copy`, or with FEED_EVERY_COPY of every copy. */
enum { FEED_EVERY_COPY = -1 };

static spmd_status set_input_of(spmd_program *p, int copy, const spmd_tensor *t,
                                const void *data, size_t bytes)
{
    if (copy == FEED_EVERY_COPY) return spmd_program_set_input(p, t, data, bytes);
    return spmd_program_set_input_copy(p, copy, t, data, bytes);
}

/* Samples [first, first + batch) of a split into a graph's inputs: only
 * those this process's devices hold are read. */
static int feed_split(const cli_opts *o, spmd_dataset *data, const cli_graph *c, spmd_program *p,
                      int copy, spmd_split split, int64_t first, int32_t *tok, int32_t *tgt)
{
    int seq = o->gpt.seq, v = spmd_tensor_dim(c->logits, spmd_tensor_rank(c->logits) - 1);
    /* The graph's samples: --batch, or with --pp its micro-batches'. */
    size_t ntok = !strcmp(o->model, "gpt") ? (size_t)spmd_tensor_numel(c->input)
                                            : (size_t)o->batch * (size_t)seq;
    int64_t s0 = 0, s1 = 0;
    int rc = local_samples(o, c, p, &s0, &s1);
    if (rc) return rc;
    if (s1 > s0 && spmd_dataset_batch(data, split, first + s0, s1 - s0, tok + s0 * seq,
                                      tgt + s0 * seq) != SPMD_OK)
        return cli_fail("data: %s", spmd_last_error());
    spmd_status st;
    if (!strcmp(o->model, "gpt")) {
        st = set_input_of(p, copy, c->input, tok, ntok * sizeof *tok);
    } else {
        float *onehot = calloc(ntok * (size_t)v, sizeof *onehot);
        if (!onehot) return cli_fail("out of memory");
        for (size_t i = (size_t)(s0 * seq); i < (size_t)(s1 * seq); i++)
            onehot[i * (size_t)v + (size_t)tok[i]] = 1.0f;
        st = set_input_of(p, copy, c->input, onehot, ntok * (size_t)v * sizeof *onehot);
        free(onehot);
    }
    if (st == SPMD_OK) st = set_input_of(p, copy, c->targets, tgt, ntok * sizeof *tgt);
    if (st != SPMD_OK) return cli_fail("cannot feed the inputs: %s", spmd_last_error());
    return 0;
}

float feed_lr(const cli_opts *o, int step) { return copies_lr_at(o, 0, step); }

/* The test hook SPMD_TEST_BAD_TOKEN (test_hooks.h, spmd-test only): a GPT
 * token id outside the vocabulary in this process's first row. */
static int feed_bad_token(const cli_opts *o, const cli_model *m, spmd_program *p, int step)
{
    if (!test_hooks_bad_token(step) || strcmp(o->model, "gpt")) return 0;
    int64_t s0 = 0, s1 = 0;
    int rc = local_samples(o, &m->train, p, &s0, &s1);
    size_t ntok = (size_t)o->batch * (size_t)o->gpt.seq;
    int32_t *tok = rc ? NULL : calloc(ntok, sizeof *tok);
    if (!tok) return rc ? rc : cli_fail("out of memory");
    tok[s0 * o->gpt.seq] = m->gpt.vocab + 7;
    if (spmd_program_set_input(p, m->train.input, tok, ntok * sizeof *tok) != SPMD_OK)
        rc = cli_fail("cannot feed the inputs: %s", spmd_last_error());
    free(tok);
    return rc;
}

int feed_step(const cli_opts *o, const cli_model *m, spmd_program *p, int step, int64_t first)
{
    size_t ntok = (size_t)o->batch * (size_t)o->gpt.seq * (size_t)m->micro_batches;
    int32_t *tok = malloc(ntok * sizeof *tok), *tgt = malloc(ntok * sizeof *tgt);
    int rc = tok && tgt ? 0 : cli_fail("out of memory");
    /* Each copy its own batch and learning rate. */
    for (int c = 0; !rc && c < m->copies; c++) {
        rc = feed_split(o, model_copy_data(m, c), &m->train, p, c, SPMD_SPLIT_TRAIN, first, tok, tgt);
        float lr = copies_lr_at(o, c, step), wd = copies_weight_decay(o, c);
        if (!rc && spmd_program_set_input_copy(p, c, m->opt.lr, &lr, sizeof lr) != SPMD_OK)
            rc = cli_fail("cannot feed the learning rate: %s", spmd_last_error());
        if (!rc && m->opt.weight_decay &&
            spmd_program_set_input_copy(p, c, m->opt.weight_decay, &wd, sizeof wd) != SPMD_OK)
            rc = cli_fail("cannot feed the weight decay: %s", spmd_last_error());
    }
    free(tok), free(tgt);
    if (!rc) rc = feed_bad_token(o, m, p, step);
    return rc;
}

/* Copy every parameter of copy `copy` of the training program into the
 * evaluation one. */
static int copy_params(const cli_model *m, const spmd_program *train, spmd_program *eval, int copy)
{
    for (int i = 0; i < spmd_graph_tensor_count(m->eval.g); i++) {
        spmd_tensor *t = spmd_graph_tensor(m->eval.g, i);
        if (!spmd_tensor_is_param(t)) continue;
        spmd_tensor *src = spmd_graph_find(m->train.g, spmd_tensor_name(t));
        size_t bytes = (size_t)spmd_tensor_numel(t) * sizeof(float);
        float *buf = malloc(bytes);
        spmd_status st = buf ? spmd_program_read_copy(train, copy, src, buf, bytes) : SPMD_ERR_NOMEM;
        if (st == SPMD_OK) st = spmd_program_write_copy(eval, copy, t, buf, bytes);
        free(buf);
        if (st != SPMD_OK) return cli_fail("evaluation: %s", spmd_last_error());
    }
    return 0;
}

void feed_cap_eval(cli_opts *o, const cli_model *m)
{
    int64_t size = spmd_dataset_heldout_size(m->data);
    if (m->accuracy && o->eval_samples > size) {
        printf("--eval %d: the held-out set has %lld samples; scoring all of them\n",
               o->eval_samples, (long long)size);
        o->eval_samples = (int)size;
    }
    /* Validation reads the held-out split's first batches: past its end,
     * the same samples again. */
    int64_t held = spmd_dataset_heldout_size(m->val_data ? m->val_data : m->data);
    int64_t batches = held > o->batch ? (held + o->batch - 1) / o->batch : 1;
    if (model_validates(o) && o->val_batches > batches) {
        printf("--val-batches %d: the held-out split has %lld samples, %lld batches of %d; "
               "validating on those\n", o->val_batches, (long long)held, (long long)batches,
               o->batch);
        o->val_batches = (int)batches;
    }
}

double feed_accuracy(const cli_opts *o, const cli_model *m, const spmd_program *train,
                     spmd_program *eval, int copy, feed_progress progress, void *ctx)
{
    if (!m->accuracy || !eval || copy_params(m, train, eval, copy)) return -1;
    spmd_dataset *data = model_copy_data(m, copy);
    int v = (int)spmd_tensor_dim(m->eval.logits, spmd_tensor_rank(m->eval.logits) - 1);
    size_t ntok = (size_t)o->batch * (size_t)o->gpt.seq;
    int32_t *tok = malloc(ntok * sizeof *tok), *tgt = malloc(ntok * sizeof *tgt);
    uint8_t *mask = malloc(ntok);
    float *logits = malloc(ntok * (size_t)v * sizeof *logits);
    int64_t right = 0, scored = 0;
    bool ok = tok && tgt && mask && logits;
    for (int64_t first = 0; ok && first < o->eval_samples; first += o->batch) {
        /* Every copy's inputs: the program runs every copy, and one whose
         * inputs were never set refuses to run; only `copy`'s is read. */
        ok = !feed_split(o, data, &m->eval, eval, FEED_EVERY_COPY, SPMD_SPLIT_HELDOUT, first, tok,
                         tgt) &&
             /* Every process scores the whole batch: it needs every target. */
             (processes_count() == 1 ||
              spmd_dataset_batch(data, SPMD_SPLIT_HELDOUT, first, o->batch, tok, tgt) == SPMD_OK) &&
             spmd_dataset_score_mask(data, SPMD_SPLIT_HELDOUT, first, o->batch, mask) == SPMD_OK &&
             spmd_program_run(eval) == SPMD_OK &&
             spmd_program_read_copy(eval, copy, m->eval.logits, logits,
                                    ntok * (size_t)v * sizeof *logits) == SPMD_OK;
        for (size_t i = 0; ok && i < ntok; i++) {
            /* Score exactly eval_samples samples, even mid-batch. */
            if (!mask[i] || first + (int64_t)(i / (size_t)o->gpt.seq) >= o->eval_samples) continue;
            const float *row = logits + i * (size_t)v;
            int best = 0;
            for (int k = 1; k < v; k++)
                if (row[k] > row[best]) best = k;
            right += best == tgt[i];
            scored++;
        }
        if (ok && progress) progress(ctx, first + o->batch < o->eval_samples ? first + o->batch : o->eval_samples);
    }
    if (!ok) cli_fail("evaluation: %s", spmd_last_error());
    free(tok), free(tgt), free(mask), free(logits);
    return ok && scored ? (double)right / (double)scored : -1;
}

/* ---- Validation ----------------------------------------------------------------------- */

bool feed_validates_at(const cli_opts *o, int done, int steps)
{
    return model_validates(o) && (done == steps || (o->val_every && done % o->val_every == 0));
}

int feed_val_loss(const cli_opts *o, const cli_model *m, const spmd_program *train,
                 spmd_program *eval, int copy, double *loss)
{
    if (!model_validates(o) || !eval) return cli_fail("validation: no forward program");
    if (copy_params(m, train, eval, copy)) return 1;
    spmd_dataset *data = m->val_data ? m->val_data : model_copy_data(m, copy);
    size_t ntok = (size_t)o->batch * (size_t)o->gpt.seq;
    int32_t *tok = malloc(ntok * sizeof *tok), *tgt = malloc(ntok * sizeof *tgt);
    double sum = 0;
    int rc = tok && tgt ? 0 : cli_fail("out of memory");
    /* The same batches every time: the held-out split's first ones. */
    for (int k = 0; !rc && k < o->val_batches; k++) {
        float batch_loss = 0;
        /* Every copy's inputs, as for the accuracy. */
        rc = feed_split(o, data, &m->eval, eval, FEED_EVERY_COPY, SPMD_SPLIT_HELDOUT, (int64_t)k * o->batch, tok,
                        tgt);
        if (!rc && (spmd_program_run(eval) != SPMD_OK ||
                    spmd_program_read_copy(eval, copy, m->eval.loss, &batch_loss,
                                           sizeof batch_loss) != SPMD_OK))
            rc = cli_fail("validation: %s", spmd_last_error());
        sum += batch_loss;
    }
    free(tok), free(tgt);
    *loss = sum / o->val_batches;
    return rc;
}

