/*
 * The memory plan's free list: the free blocks of the arena, neighbours
 * always merged.  A deep model leaves thousands of them, so they are not
 * scanned: each block sits in two treaps (search trees kept balanced by a
 * pseudo-random priority per slot), one ordered by offset, to find a
 * released block's neighbours and the block at the end of the arena, and
 * one by (size, offset), to find the best fit: the smallest block that is
 * large enough, the lowest offset among equals.  Placement is the same as
 * a scan of an offset-sorted list would give, in O(log n) per step.
 */
#include "compile/plan_impl.h"

enum { BY_OFFSET, BY_SIZE };

#define LEFT(f, o, i) ((f)->slots[i].child[o][0])
#define RIGHT(f, o, i) ((f)->slots[i].child[o][1])

static _Thread_local uint64_t visits_done;

uint64_t plan_free_block_visits(void) { return visits_done; }

/* A fixed pseudo-random priority per slot: deterministic plans. */
static uint32_t priority(int i)
{
    uint32_t x = (uint32_t)i * 0x9E3779B1u;
    x ^= x >> 15;
    x *= 0x85EBCA77u;
    return x ^ (x >> 13);
}

/* Does slot a come before slot b in order o? */
static bool before(freelist *f, int o, int a, int b)
{
    const free_block *x = &f->slots[a], *y = &f->slots[b];
    f->visits++;
    if (o == BY_SIZE && x->size != y->size) return x->size < y->size;
    return x->offset < y->offset;
}

/* Split tree t into the blocks before slot k (*lo) and the rest (*hi). */
static void split(freelist *f, int o, int t, int k, int *lo, int *hi)
{
    if (t < 0) {
        *lo = *hi = -1;
    } else if (before(f, o, t, k)) {
        split(f, o, RIGHT(f, o, t), k, &RIGHT(f, o, t), hi);
        *lo = t;
    } else {
        split(f, o, LEFT(f, o, t), k, lo, &LEFT(f, o, t));
        *hi = t;
    }
}

/* Join trees a and b, every block of a before every block of b. */
static int join(freelist *f, int o, int a, int b)
{
    if (a < 0) return b;
    if (b < 0) return a;
    f->visits++;
    if (priority(a) > priority(b)) {
        RIGHT(f, o, a) = join(f, o, RIGHT(f, o, a), b);
        return a;
    }
    LEFT(f, o, b) = join(f, o, a, LEFT(f, o, b));
    return b;
}

static int insert(freelist *f, int o, int t, int k)
{
    if (t < 0 || priority(k) > priority(t)) {
        split(f, o, t, k, &LEFT(f, o, k), &RIGHT(f, o, k));
        return k;
    }
    if (before(f, o, k, t)) LEFT(f, o, t) = insert(f, o, LEFT(f, o, t), k);
    else RIGHT(f, o, t) = insert(f, o, RIGHT(f, o, t), k);
    return t;
}

static int erase(freelist *f, int o, int t, int k)
{
    if (t == k) return join(f, o, LEFT(f, o, k), RIGHT(f, o, k));
    if (before(f, o, k, t)) LEFT(f, o, t) = erase(f, o, LEFT(f, o, t), k);
    else RIGHT(f, o, t) = erase(f, o, RIGHT(f, o, t), k);
    return t;
}

static void tree_insert(freelist *f, int o, int k) { f->root[o] = insert(f, o, f->root[o], k); }
static void tree_erase(freelist *f, int o, int k) { f->root[o] = erase(f, o, f->root[o], k); }

/* A new free block, in neither tree yet.  There are never more free
 * blocks than released buffers, so the slots (one per node) suffice. */
static int new_block(freelist *f, int64_t offset, int64_t size)
{
    int k = f->unused;
    if (k >= 0) f->unused = f->slots[k].child[0][0];
    else k = f->fresh++;
    f->slots[k] = (free_block){offset, size, {{-1, -1}, {-1, -1}}};
    return k;
}

static void drop_block(freelist *f, int k)
{
    tree_erase(f, BY_OFFSET, k);
    tree_erase(f, BY_SIZE, k);
    f->slots[k].child[0][0] = f->unused;
    f->unused = k;
}

/* Best fit; else grow the arena, extending a free block that touches the
 * end, so the arena does not grow needlessly. */
int64_t freelist_take(freelist *f, int64_t size)
{
    f->live += size;
    int best = -1;
    for (int t = f->root[BY_SIZE]; t >= 0; f->visits++) {
        if (f->slots[t].size >= size) best = t, t = LEFT(f, BY_SIZE, t);
        else t = RIGHT(f, BY_SIZE, t);
    }
    if (best >= 0) {
        free_block *b = &f->slots[best];
        int64_t off = b->offset;
        if (b->size == size) {
            drop_block(f, best);
        } else {
            /* What is left keeps its place among its neighbours by offset. */
            tree_erase(f, BY_SIZE, best);
            b->offset += size;
            b->size -= size;
            tree_insert(f, BY_SIZE, best);
        }
        return off;
    }
    int last = f->root[BY_OFFSET];
    while (last >= 0 && RIGHT(f, BY_OFFSET, last) >= 0) {
        last = RIGHT(f, BY_OFFSET, last);
        f->visits++;
    }
    if (last >= 0 && f->slots[last].offset + f->slots[last].size == f->end) {
        int64_t off = f->slots[last].offset;
        drop_block(f, last);
        f->end = off + size;
        return off;
    }
    int64_t off = f->end;
    f->end += size;
    return off;
}

void freelist_give(freelist *f, int64_t offset, int64_t size)
{
    f->live -= size;
    int prev = -1, next = -1;
    for (int t = f->root[BY_OFFSET]; t >= 0; f->visits++) {
        if (f->slots[t].offset < offset) prev = t, t = RIGHT(f, BY_OFFSET, t);
        else next = t, t = LEFT(f, BY_OFFSET, t);
    }
    int k;
    if (prev >= 0 && f->slots[prev].offset + f->slots[prev].size == offset) {
        k = prev; /* grows at its end: same offset, new size */
        tree_erase(f, BY_SIZE, k);
        f->slots[k].size += size;
    } else {
        k = new_block(f, offset, size);
        tree_insert(f, BY_OFFSET, k);
    }
    if (next >= 0 && f->slots[k].offset + f->slots[k].size == f->slots[next].offset) {
        f->slots[k].size += f->slots[next].size;
        drop_block(f, next);
    }
    tree_insert(f, BY_SIZE, k);
}

freelist freelist_empty(free_block *slots)
{
    return (freelist){slots, {-1, -1}, 0, -1, 0, 0, 0};
}

void freelist_tally(const freelist *f) { visits_done += f->visits; }
