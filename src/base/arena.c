/* The allocator hook and the bump arena. */
#include "base/arena.h"
#include "base/error.h"

#include <stdlib.h>
#include <string.h>

static void *default_alloc(void *ctx, size_t bytes)
{
    (void)ctx;
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 1) != 0) return NULL;
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

enum { ARENA_BLOCK = 64 * 1024 };

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
        size_t cap = bytes > ARENA_BLOCK ? bytes : ARENA_BLOCK;
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
