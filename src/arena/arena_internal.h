/* arena_internal.h — what the rest of the library and the tests may use of the arena (src/arena*.c)
 * beyond the public header: the allocator plugin's stream-aware calls, the destroy hook, the fork
 * handlers of the arena's global locks, the live list for reports, and for tests a full consistency
 * check and counters that show how much work scope ends and reclaims did. */
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

/* gg_free() in stream order for a block used on `stream`. When the arena tracks a stream and
 * `stream` is another one, the arena's stream is first made to wait, on the device, for the work
 * queued on `stream` so far (an event recorded there; no host-side wait), and *joined is set: the
 * block is then reusable in the arena's stream order. A failed join frees nothing. */
int gg__arena_free_on(gg_arena_t *arena, void *ptr, void *stream, int *joined);
/* gg_alloc for work on `stream`: when that is not the arena's stream, `stream` is made to wait, on
 * the device, for the work queued on the arena's stream so far (blocks released onto it in stream
 * order may still be in use there), and *joined is set. */
int gg__arena_alloc_on(gg_arena_t *arena, size_t size, void *stream, void **ptr, int *joined);
/* Makes the arena's stream wait, on the device, for the work queued on `stream` so far, when the
 * arena tracks a stream and `stream` is another one: a block PyTorch recorded on `stream` is then
 * freed in the arena's stream order. 1 when it joined, 0 when nothing was needed, or an error. */
int gg__arena_join_stream(gg_arena_t *arena, void *stream);

/* Marks an arena that serves a framework's caching allocator (the plugin's arenas): the bump block
 * then never moves into a free block larger than 1/GG__HOLE_SHARE of what is mapped, where a large
 * tensor of the last step was and its like will be again (gg__arena_promote). Scopes on such an
 * arena still work; their ends are then no longer O(1). 0, or the error of a handle not live, named
 * after `op` (the public call that asked). */
int gg__arena_keep_holes(gg_arena_t *arena, const char *op);

/* Sets the one function gg_arena_destroy() calls before it tears an arena down, without the arena's
 * lock (so the function may wait for its own users of the arena); NULL for none. The layer above
 * (the allocator plugin) registers itself here, so the arena never calls up into it by name. */
void gg__arena_on_destroy(void (*fn)(const gg_arena_t *arena));
/* The options `arena` applies, as gg_arena_create() settled them: device, backend ("cuda"/"host",
 * static text), capacity and chunk size rounded to the granularity, stream, flags, and name (the
 * arena's own text: valid while it lives). 0, or the error of a call on a handle that is not live.
 * */
int gg__arena_options_of(gg_arena_t *arena, gg_arena_options_t *out);

#endif
