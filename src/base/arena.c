/* The allocator hook, the bump arena and interning. */
#include "base/arena.h"
#include "base/error.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* The default allocator asks for large blocks to be backed by huge pages
 * (where the system gives them on request: Linux's transparent huge pages
 * in "madvise" mode).  A deep model's graphs, records and plans take
 * hundreds of MiB, and faulting that in 4 KiB at a time, one trap per
 * page and dear under virtualisation, was most of a plan-only compile.
 * A user's allocator places memory as it likes. */
enum { HUGE_PAGE = 2 << 20, HUGE_FROM = 2 * HUGE_PAGE };

static void *default_alloc(void *ctx, size_t bytes)
{
    (void)ctx;
    void *p = NULL;
    size_t align = bytes >= HUGE_FROM ? HUGE_PAGE : 64;
    if (posix_memalign(&p, align, bytes ? bytes : 1) != 0) return NULL;
#ifdef MADV_HUGEPAGE
    if (bytes >= HUGE_FROM) (void)madvise(p, bytes, MADV_HUGEPAGE); /* a hint: may be refused */
#endif
    return p;
}

static void default_free(void *ctx, void *ptr)
{
    (void)ctx;
    free(ptr);
}

spmd_allocator base_allocator_or_default(const spmd_allocator *alloc)
{
    if (alloc && alloc->alloc && alloc->free) return *alloc;
    return (spmd_allocator){default_alloc, default_free, NULL};
}

void *base_alloc(const spmd_allocator *alloc, size_t bytes, const char *what)
{
    spmd_allocator a = base_allocator_or_default(alloc);
    void *p = a.alloc(a.ctx, bytes);
    if (!p) base_error(SPMD_ERR_NOMEM, "out of memory allocating %zu bytes for %s", bytes, what);
    return p;
}

void *base_calloc(const spmd_allocator *alloc, size_t bytes, const char *what)
{
    void *p = base_alloc(alloc, bytes, what);
    if (p) memset(p, 0, bytes);
    return p;
}

void base_free(const spmd_allocator *alloc, void *ptr)
{
    if (!ptr) return;
    spmd_allocator a = base_allocator_or_default(alloc);
    a.free(a.ctx, ptr);
}

bool base_grow(const spmd_allocator *alloc, void **items, int *cap, int need, size_t item_size,
               int first, const char *what)
{
    if (need <= *cap) return true;
    int cap2 = *cap ? *cap * 2 : first;
    while (cap2 < need) cap2 *= 2;
    void *p = base_alloc(alloc, (size_t)cap2 * item_size, what);
    if (!p) return false;
    if (*items) memcpy(p, *items, (size_t)*cap * item_size);
    base_free(alloc, *items);
    *items = p;
    *cap = cap2;
    return true;
}

struct base_arena_block {
    base_arena_block *next;
    size_t pad; /* keeps the payload 16-byte aligned */
    unsigned char data[];
};

/* Blocks start at 64 KiB and double up to 8 MiB: a small graph stays
 * small, and a deep one lives in few blocks large enough for huge pages. */
enum { ARENA_BLOCK = 64 * 1024, ARENA_BLOCK_MOST = 8 << 20 };

void base_arena_init(base_arena *a, const spmd_allocator *alloc)
{
    a->alloc = base_allocator_or_default(alloc);
    a->head = NULL;
    a->used = a->cap = 0;
}

void *base_arena_alloc(base_arena *a, size_t bytes)
{
    bytes = (bytes + 15) & ~(size_t)15;
    if (!a->head || a->used + bytes > a->cap) {
        size_t cap = a->head ? 2 * a->cap : ARENA_BLOCK;
        if (cap > ARENA_BLOCK_MOST) cap = ARENA_BLOCK_MOST;
        if (cap < bytes) cap = bytes;
        base_arena_block *b = base_alloc(&a->alloc, sizeof *b + cap, "graph arena");
        if (!b) return NULL;
        b->next = a->head;
        a->head = b;
        a->used = 0;
        a->cap = cap;
    }
    void *p = a->head->data + a->used;
    a->used += bytes;
    memset(p, 0, bytes);
    return p;
}

char *base_arena_strdup(base_arena *a, const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = base_arena_alloc(a, n);
    if (p) memcpy(p, s, n);
    return p;
}

void base_arena_free(base_arena *a)
{
    base_arena_block *b = a->head;
    while (b) {
        base_arena_block *next = b->next;
        base_free(&a->alloc, b);
        b = next;
    }
    a->head = NULL;
    a->used = a->cap = 0;
}

/* ---- Interning ------------------------------------------------------------ */

void base_intern_init(base_intern *t, base_arena *arena, size_t size)
{
    *t = (base_intern){arena, size, NULL, 0, 0};
}

/* A hash of n bytes, a word at a time. */
static uint64_t bytes_hash(const void *p, size_t n)
{
    const unsigned char *c = p;
    uint64_t h = 0x9E3779B97F4A7C15u;
    for (; n >= 8; n -= 8, c += 8) {
        uint64_t w;
        memcpy(&w, c, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDu;
        h ^= h >> 32;
    }
    for (; n; n--, c++) h = (h ^ *c) * 0x100000001B3u;
    return h ^ (h >> 29);
}

/* The slot of `rec`, or the empty slot where it belongs. */
static size_t intern_slot(const base_intern *t, const void *rec)
{
    size_t mask = t->cap - 1, i = (size_t)bytes_hash(rec, t->size) & mask;
    while (t->slots[i] && memcmp(t->slots[i], rec, t->size) != 0) i = (i + 1) & mask;
    return i;
}

const void *base_intern_get(base_intern *t, const void *rec)
{
    if (2 * (t->n + 1) > t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 64;
        const void **old = t->slots;
        size_t old_cap = t->cap;
        t->slots = base_calloc(&t->arena->alloc, cap * sizeof *t->slots, "intern index");
        if (!t->slots) {
            t->slots = old;
            return NULL;
        }
        t->cap = cap;
        for (size_t i = 0; i < old_cap; i++)
            if (old[i]) t->slots[intern_slot(t, old[i])] = old[i];
        base_free(&t->arena->alloc, old);
    }
    size_t i = intern_slot(t, rec);
    if (!t->slots[i]) {
        void *copy = base_arena_alloc(t->arena, t->size);
        if (!copy) return NULL;
        memcpy(copy, rec, t->size);
        t->slots[i] = copy;
        t->n++;
    }
    return t->slots[i];
}

void base_intern_free(base_intern *t)
{
    if (t->slots) base_free(&t->arena->alloc, t->slots);
    t->slots = NULL;
    t->n = t->cap = 0;
}
