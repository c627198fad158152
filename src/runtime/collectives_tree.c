/*
 * The canonical summation order of a group (collectives_impl.h): a fixed
 * pairwise tree over member ranks.  Every transport sums this way, so the
 * shared-memory, MPI and hierarchical paths give the same bits.  Unlike a
 * left-to-right sum, the tree can be evaluated from partial sums: a process
 * that holds all members of a subtree sends that subtree's sum alone.
 *
 * Sums run block by block: each node's block is the float sum of its two
 * children's blocks, element by element (vectorised), in buffers small
 * enough for L1.  A known node (a term) is read in place; only inner nodes
 * take a buffer, one per tree level.
 */
#include "runtime/collectives_impl.h"

#include "base/bf16.h"

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

/* The block of node [lo, hi): a term's elements, or the sum of its children
 * computed into `out`.  The left child is computed into `out` too and the
 * right one into buf[level], which the left child's subtree no longer
 * needs by then; deeper nodes use deeper levels. */
static const float *node(const tree_block *b, int lo, int hi, float *out, int level)
{
    const coll_term *t = &b->terms[lo];
    if (t->base && t->end == hi) return t->base + b->row * t->stride + b->col;
    if (t->half && t->end == hi) { /* a bf16 value: widened, exactly */
        bf16_to_f32_n(out, t->half + b->row * t->stride + b->col, (size_t)b->len);
        return out;
    }
    int mid = coll_tree_mid(lo, hi);
    const float *x = node(b, lo, mid, out, level + 1);
    const float *y = node(b, mid, hi, b->buf[level], level + 1);
    if (x == out)
        add_into(out, y, b->len);
    else
        add2(out, x, y, b->len);
    return out;
}

/* The root writes `out` only after both children are complete, so `out`
 * may be a term's elements: it is read in the same pass, element by
 * element (x + y is y + x, bit for bit, so either operand may be it). */
void coll_tree_sum(const coll_term *terms, int lo, int hi, int64_t row, int64_t col, float *out,
                   int64_t len)
{
    float buf[LEVELS][SUM_BLOCK];
    tree_block b = {.terms = terms, .row = row, .buf = buf};
    const coll_term *t = &terms[lo];
    if (t->base && t->end == hi) {
        const float *x = t->base + row * t->stride + col;
        if (x != out) memcpy(out, x, sizeof *out * (size_t)len);
        return;
    }
    int mid = coll_tree_mid(lo, hi);
    for (int64_t c = 0; c < len; c += SUM_BLOCK) {
        b.col = col + c;
        b.len = len - c < SUM_BLOCK ? len - c : SUM_BLOCK;
        const float *x = node(&b, lo, mid, buf[0], 1);
        const float *y = node(&b, mid, hi, buf[1], 2);
        float *o = out + c;
        if (o == x)
            add_into(o, y, b.len);
        else if (o == y)
            add_into(o, x, b.len);
        else
            add2(o, x, y, b.len);
    }
}

/* Block by block as above, each block's f32 sum rounded once.  Every term
 * of a block is read before its rounded sum is written, so `out` may be
 * a term's elements. */
void coll_tree_sum_bf16(const coll_term *terms, int lo, int hi, int64_t row, int64_t col,
                        uint16_t *out, int64_t len)
{
    float buf[LEVELS][SUM_BLOCK], sum[SUM_BLOCK];
    tree_block b = {.terms = terms, .row = row, .buf = buf};
    const coll_term *t = &terms[lo];
    for (int64_t c = 0; c < len; c += SUM_BLOCK) {
        b.col = col + c;
        b.len = len - c < SUM_BLOCK ? len - c : SUM_BLOCK;
        const float *x;
        if ((t->base || t->half) && t->end == hi) {
            x = node(&b, lo, hi, sum, 1); /* one known node: its values */
        } else {
            int mid = coll_tree_mid(lo, hi);
            const float *l = node(&b, lo, mid, buf[0], 1);
            const float *r = node(&b, mid, hi, buf[1], 2);
            add2(sum, l, r, b.len);
            x = sum;
        }
        bf16_from_f32_n(out + c, x, (size_t)b.len);
    }
}
