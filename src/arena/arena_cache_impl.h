/* arena_cache_impl.h — the layout of a thread's cache of an arena, private to the cache's files:
 * arena_cache.c (the cache itself) and arena_cache_stats.c (the walks over an arena's caches that
 * stats and the checker make). */
#ifndef GG_ARENA_CACHE_IMPL_H
#define GG_ARENA_CACHE_IMPL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "arena/arena_base_impl.h"
#include "core/internal.h"

#define GG__TC_CLASSES     8  /* sizes per cache */
#define GG__TC_RING        64 /* free blocks per size: one stream query serves a ring */
#define GG__TC_CLASS_BYTES ((size_t)1 << 20) /* free bytes per size, a refill's worth */
#define GG__TC_SHARE       8                 /* a refill takes at most 1/8 of the free memory */
#define GG__TC_BYTES       ((size_t)8 << 20) /* free bytes per cache */
#define GG__TC_LIVE_SLOTS  128 /* handed out and not yet published: at most half of this */
#define GG__TC_BACKOFF     16  /* allocations that do not ask a busy stream again */
#define GG__TC_TRIES       8   /* questions a checkpoint waits for before the locked path */
#define GG__TC_SIZE_HASH   64  /* entries of a cache's filter of the sizes its classes hold */

typedef struct gg__tc_entry {
  gg__block_t *rec;
  uint64_t ticket; /* the cache's epoch at the free; 0: reusable at once */
  bool ordered;    /* freed in stream order (gg_free_on) */
} gg__tc_entry_t;

typedef struct gg__tc_class {
  size_t size;      /* rounded size; 0 when the slot is unused */
  unsigned head, n; /* ring, oldest at head */
  unsigned
      batch; /* blocks the next refill carves: doubles per refill, so sizes seen once cost little */
  unsigned long long used; /* last refill, for eviction */
  gg__tc_entry_t ring[GG__TC_RING];
} gg__tc_class_t;

struct gg__tcache {
  atomic_int lock;      /* a spin lock: its thread takes it on every call, others almost never */
  atomic_bool attached; /* false once its arena is destroyed, torn down or let it go */
  bool orphan;          /* its thread exited: the arena owns it (arena lock) */
  /* The key: the arena and its unique id, so an address reused by a later arena never matches. */
  gg_arena_t *arena;
  unsigned long long arena_id;
  unsigned fork_gen;
  gg__tcache_t *next;            /* its thread's caches (that thread only) */
  gg__tcache_t *a_prev, *a_next; /* its arena's caches (arena lock) */
  gg__tc_class_t cls[GG__TC_CLASSES];
  /* Classes per value of a size's low bits (gg__tc_size_hash): most sizes of a random mix match
   * none, and one byte says so before the lock and the walk over the classes. Written and read by
   * its thread only. */
  uint8_t size_seen[GG__TC_SIZE_HASH];
  size_t free_bytes;
  unsigned long long clock;
  gg__block_t *live[GG__TC_LIVE_SLOTS]; /* by address, linear probing */
  uint64_t live_bits[GG__TC_LIVE_SLOTS /
                     64]; /* bit i: live[i] is taken (publishing visits only those) */
  _Atomic size_t
      n_live; /* written under the lock; its thread reads it without, to skip frees not its own */
  const char
      *tag; /* the interned tag of the last refill: allocations with that tag may be served */
  size_t d_bytes, peak; /* since the last publish: live bytes, highest total seen by this thread */
  unsigned long long d_allocs, d_frees;
  unsigned backoff;
  void *event;          /* recorded on the arena's stream when it was busy, covering tickets below
                           event_epoch */
  uint64_t event_epoch; /* 0: no event out */
  unsigned long long events; /* recorded since the last publish, for the arena's probe */
};

static inline void gg__tc_lock(gg__tcache_t *c) { gg__spin_lock(&c->lock); }

static inline void gg__tc_unlock(gg__tcache_t *c) { gg__spin_unlock(&c->lock); }

static inline size_t gg__tc_nlive(const gg__tcache_t *c) {
  return atomic_load_explicit(&c->n_live, memory_order_relaxed);
}

static inline size_t gg__tc_size_hash(size_t size) {
  return (size / GG__QUANTUM) & (GG__TC_SIZE_HASH - 1);
}

static inline bool gg__tc_safe_for(const gg_arena_t *a, uint64_t ticket) {
  return ticket < atomic_load_explicit(&((gg_arena_t *)a)->tc_safe, memory_order_acquire);
}

static inline bool gg__tc_reusable(const gg_arena_t *a, const gg__tc_entry_t *e) {
  return !a->track || e->ordered || gg__tc_safe_for(a, e->ticket);
}

/* Whether the work queued before the frees of this arena's cached tickets is done (arena_cache.c).
 * Never blocks; failures only delay reuse. */
int gg__tc_ask_stream(gg_arena_t *a, gg__tcache_t *c);

#endif
