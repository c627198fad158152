/*
 * The canonical summation order of a group (collectives_impl.h): a fixed
 * pairwise tree over member ranks.  Every transport sums this way, so the
 * shared-memory, MPI and hierarchical paths give the same bits.  Unlike a
 * left-to-right sum, the tree can be evaluated from partial sums: a process
 * that holds all members of a subtree sends that subtree's sum alone.
 *
 * Sums run block by block: each node's block is the float sum of its two
 * children's blocks, element by element (vectorised), in buffers small
 * enough for L1.  A known node (a term) of f32 is read in place, one of
 * another type widened into the buffer its parent would use; only inner
 * nodes take a buffer, one per tree level.  The element type is looked at
 * once per block, never in the loops that add.
 */
#include "runtime/collectives/collectives_impl.h"

#include "base/bf16.h"

#include <stdbool.h>
#include <string.h>

/* Floats per block: the buffers of one call (one per tree level, at most
 * 13 for 4096 members) stay in L1 and on the thread's stack. */
enum { SUM_BLOCK = 1024, LEVELS = 14 };

typedef struct tree_block {
    const coll_term *terms;
    int64_t row, col; /* the block's first element */
    int64_t len;
    float (*buf)[SUM_BLOCK];
} tree_block;

static void add2(float *restrict out, const float *restrict x, const float *restrict y, int64_t n)
{
    for (int64_t i = 0; i < n; i++) out[i] = x[i] + y[i];
}

static void add_into(float *restrict out, const float *restrict y, int64_t n)
{
    for (int64_t i = 0; i < n; i++) out[i] += y[i];
}

/* Widen a known node's `n` elements from element `at` of `base` into
 * `out`; exact for every type. */
static void widen(float *out, const void *base, coll_dtype type, int64_t at, int64_t n)
{
    switch (type) {
    case COLL_F32: memcpy(out, (const float *)base + at, sizeof *out * (size_t)n); return;
    case COLL_BF16: bf16_to_f32_n(out, (const uint16_t *)base + at, (size_t)n); return;
    }
}

/* Store `n` f32 sums as `type`, rounded to nearest even. */
static void narrow(void *out, coll_dtype type, const float *sum, int64_t n)
{
    switch (type) {
    case COLL_F32: memcpy(out, sum, sizeof *sum * (size_t)n); return;
    case COLL_BF16: bf16_from_f32_n(out, sum, (size_t)n); return;
    }
}

/* A known node's block: f32 in place, any other type widened into `out`. */
static const float *known(const tree_block *b, const coll_term *t, float *out)
{
    int64_t at = b->row * t->stride + b->col;
    if (t->type == COLL_F32) return (const float *)t->base + at;
    widen(out, t->base, t->type, at, b->len);
    return out;
}

/* The block of node [lo, hi): a term's elements, or the sum of its children
 * computed into `out`.  The left child is computed into `out` too and the
 * right one into buf[level], which the left child's subtree no longer
 * needs by then; deeper nodes use deeper levels. */
static const float *node(const tree_block *b, int lo, int hi, float *out, int level)
{
    const coll_term *t = &b->terms[lo];
    if (t->base && t->end == hi) return known(b, t, out);
    int mid = coll_tree_mid(lo, hi);
    const float *x = node(b, lo, mid, out, level + 1);
    const float *y = node(b, mid, hi, b->buf[level], level + 1);
    if (x == out)
        add_into(out, y, b->len);
    else
        add2(out, x, y, b->len);
    return out;
}

/* An f32 sum goes straight into `out`, any other type's into `sum` and is
 * then narrowed.  The root writes a block only after both children's
 * blocks are complete, so `out` may be a term's elements: it is read in
 * the same pass, element by element (x + y is y + x, bit for bit, so
 * either operand may be it), or, narrowed, after the whole block was
 * read. */
void coll_tree_sum(const coll_term *terms, int lo, int hi, int64_t row, int64_t col, void *out,
                   coll_dtype type, int64_t len)
{
    const coll_term *t = &terms[lo];
    bool one = t->base && t->end == hi; /* one known node: its values */
    if (one && t->type == COLL_F32 && type == COLL_F32) {
        const float *x = (const float *)t->base + row * t->stride + col;
        if (x != out) memcpy(out, x, sizeof *x * (size_t)len);
        return;
    }
    float buf[LEVELS][SUM_BLOCK], sum[SUM_BLOCK];
    tree_block b = {.terms = terms, .row = row, .buf = buf};
    int mid = one ? hi : coll_tree_mid(lo, hi);
    for (int64_t c = 0; c < len; c += SUM_BLOCK) {
        b.col = col + c;
        b.len = len - c < SUM_BLOCK ? len - c : SUM_BLOCK;
        float *o = type == COLL_F32 ? (float *)out + c : sum;
        const float *x;
        if (one) {
            x = known(&b, t, o);
        } else {
            const float *l = node(&b, lo, mid, buf[0], 1);
            const float *r = node(&b, mid, hi, buf[1], 2);
            if (o == l)
                add_into(o, r, b.len);
            else if (o == r)
                add_into(o, l, b.len);
            else
                add2(o, l, r, b.len);
            x = o;
        }
        if (type != COLL_F32)
            narrow(coll_elem(out, type, c), type, x, b.len);
        else if (x != o)
            memcpy(o, x, sizeof *o * (size_t)b.len);
    }
}
