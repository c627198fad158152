/*
 * The default synthetic set: integer addition as fixed-width text,
 * "07+58=065\n".  Fixed width puts every digit at a fixed offset in its
 * problem, and samples start at a problem boundary, so a small GPT finds
 * the operands by position and spends its capacity on the carries: a ~1M
 * parameter model gets the format within a few dozen steps and the sums
 * soon after.  Operand pairs are split once, by a hash of the unordered
 * pair, into training and held-out lists; a sample draws its problems from
 * its split's list only.
 */
#include "train/dataset.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/rng.h"

enum { TOK_PLUS = 10, TOK_EQ = 11, TOK_NL = 12 };

typedef struct arith {
    int digits;   /* operand width; the sum has digits+1 */
    int64_t base; /* 10^digits: operands are 0..base-1 */
    uint32_t *pairs[2]; /* a * base + b, per split */
    int64_t count[2];
    uint64_t stream[2], problem_stream;
} arith;

/* Seed-independent, so every run holds out the same problems and held-out
 * accuracies compare across seeds.  Unordered, so 58+7 is not a hint for
 * a held-out 7+58. */
static bool held_out(int64_t a, int64_t b, int64_t base)
{
    int64_t lo = a < b ? a : b, hi = a < b ? b : a;
    return base_rng_bits(0, base_rng_stream("data.arith.heldout"), (uint64_t)(lo * base + hi)) %
               10 == 0;
}

static void arith_destroy(void *impl)
{
    arith *a = impl;
    free(a->pairs[0]);
    free(a->pairs[1]);
    free(a);
}

/* Writes `value` as `width` digits at tokens[*n..], stopping at `need`. */
static void put_digits(int64_t value, int width, int32_t *tokens, uint8_t *scored, uint8_t flag,
                       int64_t *n, int64_t need)
{
    int64_t scale = 1;
    for (int i = 1; i < width; i++) scale *= 10;
    for (; scale > 0 && *n < need; scale /= 10, (*n)++) {
        tokens[*n] = (int32_t)(value / scale % 10);
        if (scored) scored[*n] = flag;
    }
}

static void put(int32_t tok, int32_t *tokens, uint8_t *scored, int64_t *n, int64_t need)
{
    if (*n >= need) return;
    tokens[*n] = tok;
    if (scored) scored[*n] = 0;
    (*n)++;
}

static spmd_status arith_sample(const spmd_dataset *d, spmd_split split, uint64_t index,
                                int32_t *tokens, uint8_t *scored)
{
    const arith *a = d->impl;
    uint64_t key = base_rng_bits(d->seed, a->stream[split], index);
    int64_t need = (int64_t)d->seq + 1, n = 0;
    for (uint64_t j = 0; n < need; j++) {
        uint64_t pick = base_rng_bits(key, a->problem_stream, j) % (uint64_t)a->count[split];
        int64_t x = a->pairs[split][pick] / a->base, y = a->pairs[split][pick] % a->base;
        put_digits(x, a->digits, tokens, scored, 0, &n, need);
        put(TOK_PLUS, tokens, scored, &n, need);
        put_digits(y, a->digits, tokens, scored, 0, &n, need);
        put(TOK_EQ, tokens, scored, &n, need);
        put_digits(x + y, a->digits + 1, tokens, scored, 1, &n, need);
        put(TOK_NL, tokens, scored, &n, need);
    }
    return SPMD_OK;
}

static spmd_status arith_check_vocab(const spmd_dataset *d, int vocab)
{
    return base_error(SPMD_ERR_INVALID,
                      "%s: token %d ('\\n', and '+' = %d, '=' = %d) is not below the model's "
                      "vocabulary %d: arith needs vocab >= %d",
                      d->describe, TOK_NL, TOK_PLUS, TOK_EQ, vocab, SPMD_ARITH_VOCAB);
}

static const dataset_ops arith_ops = {arith_sample, arith_check_vocab, arith_destroy};

spmd_status dataset_arith_open(spmd_dataset *d, const char *spec)
{
    int digits = 2;
    if (strcmp(spec, "arith") != 0) {
        const char *p = spec + strlen("arith:");
        if (p[0] < '1' || p[0] > '3' || p[1] != '\0')
            return base_error(SPMD_ERR_INVALID,
                              "arith: bad source '%s': use \"arith\" or \"arith:N\" with N = 1..3 "
                              "digits per operand", spec);
        digits = p[0] - '0';
    }
    arith *a = calloc(1, sizeof *a);
    if (!a) return base_error(SPMD_ERR_NOMEM, "arith: out of memory");
    a->digits = digits;
    a->base = 1;
    for (int i = 0; i < digits; i++) a->base *= 10;
    int64_t pairs = a->base * a->base;
    a->pairs[0] = malloc((size_t)pairs * sizeof(uint32_t));
    a->pairs[1] = malloc((size_t)pairs * sizeof(uint32_t));
    if (!a->pairs[0] || !a->pairs[1]) {
        arith_destroy(a);
        return base_error(SPMD_ERR_NOMEM, "arith: out of memory for %lld operand pairs",
                          (long long)pairs);
    }
    for (int64_t x = 0; x < a->base; x++)
        for (int64_t y = 0; y < a->base; y++) {
            int s = held_out(x, y, a->base) ? SPMD_SPLIT_HELDOUT : SPMD_SPLIT_TRAIN;
            a->pairs[s][a->count[s]++] = (uint32_t)(x * a->base + y);
        }
    if (a->count[0] == 0 || a->count[1] == 0) {
        arith_destroy(a);
        return BASE_INTERNAL("arith: a split has no operand pairs");
    }
    a->stream[SPMD_SPLIT_TRAIN] = base_rng_stream("data.arith.train");
    a->stream[SPMD_SPLIT_HELDOUT] = base_rng_stream("data.arith.heldout_samples");
    a->problem_stream = base_rng_stream("data.arith.problem");
    d->impl = a;
    d->ops = &arith_ops;
    d->vocab = SPMD_ARITH_VOCAB;
    d->has_accuracy = true;
    d->heldout_size = a->count[SPMD_SPLIT_HELDOUT];
    static const char *examples[3] = {"7+5=12", "07+58=065", "107+958=1065"};
    snprintf(d->describe, sizeof d->describe,
             "arith: %d-digit addition like \"%s\\n\", vocab %d (0-9 + = \\n), %lld of %lld "
             "operand pairs held out",
             digits, examples[digits - 1], SPMD_ARITH_VOCAB, (long long)a->count[1],
             (long long)pairs);
    return SPMD_OK;
}
