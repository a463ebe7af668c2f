/* arena_internal.h — what the rest of the library and the tests may use of the arena (src/arena*.c)
 * beyond the public header: the live list for reports, and for tests a full consistency check and
 * counters that show how much work scope ends and reclaims did. */
#ifndef GG_ARENA_INTERNAL_H
#define GG_ARENA_INTERNAL_H

#include <stddef.h>

#include "gpuguard/arena.h"

/* Counters of internal work, for tests that prove complexity without timing. */
typedef struct gg__arena_probe {
  unsigned long long
      blocks_visited;              /* block records touched by scope ends (O(1) ends touch none) */
  unsigned long long bump_flushes; /* times the bump log was converted to block records */
  unsigned long long events_recorded; /* batch events recorded */
  unsigned long long stream_waits;    /* host-side waits for the stream or an event on it */
  unsigned long long stream_joins;    /* device-side waits between the arena's stream and another */
  unsigned long long events_queried;  /* non-blocking completion checks */
  unsigned long long stream_queries;  /* stream idle checks (settle everything without an event) */
  unsigned long long batches_merged;  /* batches whose memory became reusable */
  unsigned long long
      cached_allocs;   /* allocations threads' caches served (counted as they publish) */
  size_t bump_entries; /* entries in the bump log now */
  size_t free_blocks;  /* blocks in the free lists now (top excluded) */
  size_t top_bytes;    /* bytes left in the bump block now */
  size_t chunks;       /* mapped chunks now */
} gg__arena_probe_t;

int gg__arena_probe(gg_arena_t *arena, gg__arena_probe_t *out);

/* Calls fn for every live arena of this process (for reports), under the list's lock: fn may call
 * the public arena functions on it but must not create or destroy arenas. Stops at fn's first
 * nonzero return and returns it. */
int gg__arena_foreach_live(int (*fn)(gg_arena_t *arena, void *user), void *user);

/* Walks every structure of the arena and checks it against the counters: blocks tile the mapped
 * chunks exactly, nothing overlaps, free neighbours are merged, statistics match. 0 when
 * consistent; else GG_ESTATE with what is wrong in gg_last_error(). */
int gg__arena_check(gg_arena_t *arena);

#endif
