/* freelist_internal.h — the free memory of an arena: segregated size classes with bitmaps (best fit
 * in O(1) for most requests), boundary maps that make coalescing O(1), the bump block ("top"), and
 * the pool of block records every part draws from. */
#ifndef GG_FREELIST_INTERNAL_H
#define GG_FREELIST_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Every address and size the arena hands around is a multiple of this. */
#define GG__QUANTUM ((size_t)256)

/* Size classes: one per size below GG__EXACT_CLASSES quanta (every block of such a class fits a
 * request of its size exactly), then GG__SUB_CLASSES per power of two (sizes within 1/16 of each
 * other). */
#define GG__EXACT_CLASSES 128
#define GG__SUB_BITS      4
#define GG__SUB_CLASSES   (1 << GG__SUB_BITS)
#define GG__CLASSES       (GG__EXACT_CLASSES + 49 * GG__SUB_CLASSES) /* up to 2^56 quanta */
#define GG__CLASS_WORDS   ((GG__CLASSES + 63) / 64)

/* CACHED: held by a thread's cache of the arena (arena_cache.c), free there or handed out from it.
 * */
enum {
  GG__BLOCK_SPARE,
  GG__BLOCK_FREE,
  GG__BLOCK_TOP,
  GG__BLOCK_USED,
  GG__BLOCK_PENDING,
  GG__BLOCK_CACHED
};

/* One contiguous piece of mapped device memory, described on the host (device memory holds no
 * headers). The links mean different things by state: FREE: its size class's list, USED outside any
 * scope: frame 0's list (l = previous, r = next), USED in a scope: `slot` in the scope's array;
 * PENDING and SPARE: r = next in the batch or pool. */
typedef struct gg__block {
  uintptr_t addr;
  size_t size;
  void *seg; /* the chunk, on backends without one contiguous range; blocks never merge across */
  union {
    struct gg__block *l;
    size_t slot; /* USED in a scope (depth > 0): its index in the scope's array of records */
  };
  struct gg__block *r;
  const char *tag; /* USED: interned tag, "" for none */
  size_t req;      /* USED: bytes requested */
  int depth;       /* USED: scope depth at allocation */
  int state;
} gg__block_t;

/* Address → block, open addressing with linear probing and backward-shift deletion (no tombstones).
 * */
typedef struct gg__addr_map {
  struct gg__addr_slot {
    uintptr_t key;
    gg__block_t *val;
  } * slots;
  size_t cap, n; /* cap is 0 or a power of two; n <= cap / 2 */
} gg__addr_map_t;

/* Addresses are multiples of 256: drop those bits, then a Fibonacci multiply spreads the rest and
 * its top bits pick the slot (middle bits clustered the slots of evenly spaced blocks into long
 * probes). */
static inline size_t gg__addr_hash(uintptr_t key, size_t cap) {
  return (size_t)(((uint64_t)(key >> 8) * 0x9E3779B97F4A7C15ull) >> (64 - __builtin_ctzll(cap)));
}
/* Starts loading p's cache line. GCC 12 deleted __builtin_prefetch (and the walk feeding it) from
 * the look-ahead loops below as dead code: on x86 the instruction is written out so it stays. */
static inline void gg__prefetch(const void *p) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  __asm__ volatile("prefetcht0 %0" : : "m"(*(const char *)p));
#else
  __builtin_prefetch(p);
#endif
}
int gg__addr_map_grow(gg__addr_map_t *m, size_t want); /* room for `want` keys; 0 or GG_ENOMEM */
/* 0 or GG_ENOMEM; then `extra` puts cannot fail. Inline: every allocation and free asks. */
static inline int gg__addr_map_reserve(gg__addr_map_t *m, size_t extra) {
  return __builtin_expect(m->n + extra <= m->cap / 2, 1) ? 0 : gg__addr_map_grow(m, m->n + extra);
}
void gg__addr_map_put(gg__addr_map_t *m, uintptr_t key, gg__block_t *val);
gg__block_t *gg__addr_map_get(const gg__addr_map_t *m, uintptr_t key);
gg__block_t *gg__addr_map_del(gg__addr_map_t *m, uintptr_t key);
void gg__addr_map_free(gg__addr_map_t *m);

/* Boundary address → the listed free block that starts there and the one that ends there (two only
 * where chunks of different segments touch). One map for both ends: a released range asks about its
 * two boundaries and, when it has no free neighbour, lists itself in the same two slots (two cache
 * lines, not four). Open addressing, linear probing, backward-shift deletion; a slot goes when both
 * sides are empty. */
typedef struct gg__bounds {
  struct gg__bound {
    uintptr_t key;
    struct gg__block *above, *below; /* starts at key, ends at key */
    uintptr_t pad_;                  /* 32 bytes: two slots per cache line, none across two */
  } * slots;
  size_t cap, n; /* cap is 0 or a power of two; n <= cap / 2 */
} gg__bounds_t;

typedef struct gg__freelist {
  gg__block_t *heads[GG__CLASSES]; /* free blocks except top, one list per size class */
  uint64_t bits[GG__CLASS_WORDS];  /* bit c: class c's list is not empty */
  uint32_t words;                  /* bit w: bits[w] is not zero */
  gg__bounds_t
      bounds; /* the same blocks by both ends: a released range finds its neighbours in O(1) */
  gg__block_t *top;   /* the bump block (free, in no class list; size may be 0) or NULL */
  size_t bytes;       /* free bytes, top included */
  size_t count;       /* blocks in the class lists */
  gg__block_t *spare; /* the record pool */
  size_t n_spare;
  void **slabs;
  size_t n_slabs;
} gg__freelist_t;

void gg__freelist_free(
    gg__freelist_t *fl); /* frees every record and map; the struct can be zeroed and reused */

int gg__freelist_reserve_slow(gg__freelist_t *fl, size_t k);
/* Makes the next `k` record takes and `k` free-block insertions infallible. 0 or GG_ENOMEM. */
static inline int gg__freelist_reserve(gg__freelist_t *fl, size_t k) {
  if (__builtin_expect(fl->n_spare >= k && fl->bounds.n + 2 * k <= fl->bounds.cap / 2, 1)) return 0;
  return gg__freelist_reserve_slow(fl, k);
}
gg__block_t *gg__freelist_take_record(gg__freelist_t *fl); /* needs a reservation */
void gg__freelist_give_record(gg__freelist_t *fl, gg__block_t *b);

/* Adds [addr, addr+size) as free memory, merging with free neighbours of the same segment (top
 * included: a range touching top grows top). `rec` is a record to reuse, or NULL (then one is taken
 * from the reservation). Returns the block the range ended up in. */
gg__block_t *gg__freelist_put(gg__freelist_t *fl, uintptr_t addr, size_t size, void *seg,
                              gg__block_t *rec);
/* Starts loading what gg__freelist_put(addr, size) will look at: the boundary slots of both ends.
 * */
static inline void gg__freelist_prefetch(const gg__freelist_t *fl, uintptr_t addr, size_t size) {
  if (!fl->bounds.cap) return;
  gg__prefetch(&fl->bounds.slots[gg__addr_hash(addr, fl->bounds.cap)]);
  gg__prefetch(&fl->bounds.slots[gg__addr_hash(addr + size, fl->bounds.cap)]);
}
/* The listed free block that ends at addr, or NULL. */
gg__block_t *gg__freelist_ending_at(const gg__freelist_t *fl, uintptr_t addr);
/* Adds a free block that has no free neighbour (callers know it: pieces of a block already
 * maximal). */
void gg__freelist_put_plain(gg__freelist_t *fl, uintptr_t addr, size_t size, void *seg);
/* Removes a listed free block from the free memory; the record stays the caller's. */
void gg__freelist_remove(gg__freelist_t *fl, gg__block_t *b);

/* A free block that can hold n bytes at alignment a, or NULL: the smallest (lowest address among
 * equal sizes) of those its class and the next non-empty class hold, looking at a bounded number of
 * blocks in each (in practice best fit; never a scan of the whole free list). */
gg__block_t *gg__freelist_fit(const gg__freelist_t *fl, size_t n, size_t a);
/* Takes n bytes at alignment a out of listed free block b (which must fit them), leaving what is
 * left of it free. Returns the record of the n bytes (b's own, or one from the reservation while b
 * stays listed as the rest), handed to the caller. Needs a reservation of 2. */
gg__block_t *gg__freelist_carve(gg__freelist_t *fl, gg__block_t *b, size_t n, size_t a);
/* Takes exactly [p, p+n) out of listed free block b (which must hold it), leaving the pieces before
 * and after it free; returns b's record, now describing [p, p+n). Needs a reservation of 2. */
gg__block_t *gg__freelist_carve_at(gg__freelist_t *fl, gg__block_t *b, uintptr_t p, size_t n);
/* The largest listed free block, or NULL. */
gg__block_t *gg__freelist_largest(const gg__freelist_t *fl);
/* Makes listed block b the new top; the old top is listed (or goes back to the pool when empty).
 * Needs a reservation of 1. */
void gg__freelist_set_top(gg__freelist_t *fl, gg__block_t *b);
/* Lists top as a free block (or drops it when empty); top becomes NULL. */
void gg__freelist_drop_top(gg__freelist_t *fl);
/* Writes up to cap listed free blocks, smaller classes first, into out; returns how many there are.
 * */
size_t gg__freelist_list(const gg__freelist_t *fl, gg__block_t **out, size_t cap);
/* Checks the class lists, bitmaps and maps; returns NULL or what is wrong. For tests. */
const char *gg__freelist_check(const gg__freelist_t *fl);

static inline uintptr_t gg__align_up(uintptr_t x, size_t a) {
  return (x + (a - 1)) & ~(uintptr_t)(a - 1);
}

#endif
