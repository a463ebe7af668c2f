/* freelist.h — the free memory of an arena: a best-fit treap by (size, address), boundary maps that
 * make coalescing O(1), the bump block ("top"), and the pool of block records every part draws from. */
#ifndef GG_FREELIST_H
#define GG_FREELIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Every address and size the arena hands around is a multiple of this. */
#define GG__QUANTUM ((size_t)256)

/* CACHED: held by a thread's cache of the arena (arena_cache.c), free there or handed out from it. */
enum { GG__BLOCK_SPARE, GG__BLOCK_FREE, GG__BLOCK_TOP, GG__BLOCK_USED, GG__BLOCK_PENDING, GG__BLOCK_CACHED };

/* One contiguous piece of mapped device memory, described on the host (device memory holds no
 * headers). The links mean different things by state: FREE: treap children; USED: the scope's list
 * (l = previous, r = next); PENDING and SPARE: r = next in the batch or pool. */
typedef struct gg__block {
  uintptr_t addr;
  size_t size;
  void *seg; /* the chunk, on backends without one contiguous range; blocks never merge across */
  struct gg__block *l, *r;
  const char *tag; /* USED: interned tag, "" for none */
  size_t req;      /* USED: bytes requested */
  int depth;       /* USED: scope depth at allocation */
  int state;
} gg__block_t;

/* Address → block, open addressing with linear probing and backward-shift deletion (no tombstones). */
typedef struct gg__addr_map {
  struct gg__addr_slot {
    uintptr_t key;
    gg__block_t *val;
  } * slots;
  size_t cap, n; /* cap is 0 or a power of two; n <= cap / 2 */
} gg__addr_map_t;

int gg__addr_map_reserve(gg__addr_map_t *m, size_t extra); /* 0 or GG_ENOMEM; then `extra` puts cannot fail */
void gg__addr_map_put(gg__addr_map_t *m, uintptr_t key, gg__block_t *val);
gg__block_t *gg__addr_map_get(const gg__addr_map_t *m, uintptr_t key);
gg__block_t *gg__addr_map_del(gg__addr_map_t *m, uintptr_t key);
void gg__addr_map_free(gg__addr_map_t *m);

typedef struct gg__freelist {
  gg__block_t *root;       /* free blocks except top, a treap keyed by (size, addr) */
  gg__addr_map_t by_start; /* the same blocks by first address */
  gg__addr_map_t by_end;   /* and by end address, so a released range finds both neighbours in O(1) */
  gg__block_t *top;        /* the bump block (free, not in the treap; size may be 0) or NULL */
  size_t bytes;            /* free bytes, top included */
  size_t count;            /* blocks in the treap */
  gg__block_t *spare;      /* the record pool */
  size_t n_spare;
  void **slabs;
  size_t n_slabs;
} gg__freelist_t;

void gg__freelist_free(
    gg__freelist_t *fl); /* frees every record and map; the struct can be zeroed and reused */

/* Makes the next `k` record takes and `k` free-block insertions infallible. 0 or GG_ENOMEM. */
int gg__freelist_reserve(gg__freelist_t *fl, size_t k);
gg__block_t *gg__freelist_take_record(gg__freelist_t *fl); /* needs a reservation */
void gg__freelist_give_record(gg__freelist_t *fl, gg__block_t *b);

/* Adds [addr, addr+size) as free memory, merging with free neighbours of the same segment (top
 * included: a range touching top grows top). `rec` is a record to reuse, or NULL (then one is taken
 * from the reservation). Returns the block the range ended up in. */
gg__block_t *gg__freelist_put(gg__freelist_t *fl, uintptr_t addr, size_t size, void *seg, gg__block_t *rec);
/* Adds a free block that has no free neighbour (callers know it: pieces of a block already maximal). */
void gg__freelist_put_plain(gg__freelist_t *fl, uintptr_t addr, size_t size, void *seg);
/* Removes a treap block from the free memory; the record stays the caller's. */
void gg__freelist_remove(gg__freelist_t *fl, gg__block_t *b);

/* The smallest treap block that can hold n bytes at alignment a, or NULL. */
gg__block_t *gg__freelist_fit(const gg__freelist_t *fl, size_t n, size_t a);
/* Takes n bytes at alignment a out of treap block b (which must fit them), leaving what is left of it
 * free. Returns the address; b's record is handed to the caller. Needs a reservation of 2. */
uintptr_t gg__freelist_carve(gg__freelist_t *fl, gg__block_t *b, size_t n, size_t a);
/* The largest treap block, or NULL. */
gg__block_t *gg__freelist_largest(const gg__freelist_t *fl);
/* Makes treap block b the new top; the old top goes into the treap (or back to the pool when empty).
 * Needs a reservation of 1. */
void gg__freelist_set_top(gg__freelist_t *fl, gg__block_t *b);
/* Moves top into the treap (or drops it when empty); top becomes NULL. */
void gg__freelist_drop_top(gg__freelist_t *fl);
/* Writes up to cap treap blocks in (size, addr) order into out; returns how many there are. */
size_t gg__freelist_list(const gg__freelist_t *fl, gg__block_t **out, size_t cap);
/* Checks the treap and map invariants; returns NULL or what is wrong. For tests. */
const char *gg__freelist_check(const gg__freelist_t *fl);

static inline uintptr_t gg__align_up(uintptr_t x, size_t a) { return (x + (a - 1)) & ~(uintptr_t)(a - 1); }

#endif
