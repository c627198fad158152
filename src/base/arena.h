/*
 * Allocation: the user's allocator hook, a bump arena on top of it for
 * objects that live and die together (graph nodes and names), and interning
 * of records that many objects share.
 */
#ifndef SPMD_BASE_ARENA_H
#define SPMD_BASE_ARENA_H

#include "spmd/spmd.h"

/* `alloc` may be NULL (malloc).  Returns 64-byte aligned memory or NULL
 * with SPMD_ERR_NOMEM recorded (base_error_status) and a message naming
 * `what`. */
void *base_alloc(const spmd_allocator *alloc, size_t bytes, const char *what);
void *base_calloc(const spmd_allocator *alloc, size_t bytes, const char *what);
void base_free(const spmd_allocator *alloc, void *ptr);
/* The allocator to use: `alloc` or the default. */
spmd_allocator base_allocator_or_default(const spmd_allocator *alloc);
/* Make *items, an array of *cap items of item_size bytes from `alloc`, hold
 * at least `need`: the capacity doubles (from `first` when empty), so
 * appending one at a time copies each item a bounded number of times.
 * False when out of memory, with the array as it was. */
bool base_grow(const spmd_allocator *alloc, void **items, int *cap, int need, size_t item_size,
               int first, const char *what);

typedef struct base_arena_block base_arena_block;
typedef struct base_arena {
    spmd_allocator alloc;
    base_arena_block *head;
    size_t used, cap; /* in the head block */
} base_arena;

void base_arena_init(base_arena *a, const spmd_allocator *alloc);
/* Zeroed, 16-byte aligned; NULL with an error on failure. */
void *base_arena_alloc(base_arena *a, size_t bytes);
char *base_arena_strdup(base_arena *a, const char *s);
void base_arena_free(base_arena *a);

/* One stored copy of each distinct record of `size` bytes.  Thousands of
 * nodes share a few hundred signatures or shardings, and a pointer to a
 * shared copy costs 8 bytes where a copy of one's own costs hundreds, all
 * of it memory to fault in.  Records are compared byte for byte, padding
 * and unused entries included: records equal in meaning but not in bytes
 * are only stored apart.  Copies live in `arena` and outlast the index. */
typedef struct base_intern {
    base_arena *arena;
    size_t size;
    const void **slots; /* open addressing by hash, at most half full; NULL: empty */
    size_t n, cap;
} base_intern;

void base_intern_init(base_intern *t, base_arena *arena, size_t size);
/* The stored copy equal to `rec`, added if new; NULL with an error when out
 * of memory. */
const void *base_intern_get(base_intern *t, const void *rec);
/* Free the index; the copies stay in the arena. */
void base_intern_free(base_intern *t);

#endif
