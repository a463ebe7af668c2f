/* arena_base_impl.h — what the arena's own files (src/arena*.c) share and nobody else sees: the
 * arena structure and the functions one part of the arena calls in another.
 *
 * Memory of an arena is, at any moment, tiled exactly by five kinds of pieces (arena_check.c proves
 * it): free blocks (the size-class lists of freelist.c, plus the bump block "top"), USED block
 * records (allocations served by best fit, or flushed from the bump log), PENDING records
 * (released, waiting for the stream), runs of the bump log (allocations carved from top, live or
 * freed), and CACHED records that threads' caches hold (free there, or handed out and not yet
 * published).
 *
 * The files, each calling only those listed below it:
 *   arena.c          create and destroy, the live list, quarantine, fork, stats, copies
 *   arena_check.c    the invariant checker and the probe, for tests and the debug build
 *   arena_alloc.c    one allocation (the ladder of steps, free list to out of memory) and one free
 *   arena_scope.c    scopes: begin, end (the log's part and the scope's list released)
 *   arena_grow.c     growth (mapping chunks, moving free ones), moving top, trim
 *   arena_sites.c    allocation sites (GG_ARENA_BACKTRACE)
 *   arena_cache_stats.c  the caches' walks for stats and the checker (layout: arena_cache_impl.h)
 *   arena_bump.c     the bump log (its inline paths: arena_bump_internal.h)
 *   arena_cache.c    per-thread caches: alloc+free pairs without the arena's lock
 *   arena_release.c  released memory: batches, events, stream idle checks, waiting for the stream
 *   arena_base.c     handle checks, the counted lock, quiet steps, figures, USED maps, scope lists
 *   freelist.c       size classes and the boundary maps (freelist_internal.h)
 *
 * Every function here runs with the arena's lock held unless it says otherwise. */
#ifndef GG_ARENA_BASE_IMPL_H
#define GG_ARENA_BASE_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "arena/arena_internal.h"
#include "backend/backend.h"
#include "arena/freelist_internal.h"
#include "core/internal.h"

#define GG__MAGIC 0x67676172u /* "ggar" */
#define GG__DEAD  0x64656164u /* "dead" */
/* "torn": its guard gave the device memory back; the handle waits for gg_arena_destroy() */
#define GG__TORN 0x746f726eu

/* Where a block was allocated (GG_ARENA_BACKTRACE): return addresses, the allocating call's first.
 * */
#define GG__SITE_FRAMES 8
typedef struct gg__site {
  uint64_t hash;
  int n;
  void *pc[GG__SITE_FRAMES];
} gg__site_t;
typedef struct gg__sites gg__sites_t;
#define GG__TAG_MAX     63                 /* longer tags are cut */
#define GG__TC_MAX_SIZE ((size_t)64 << 10) /* larger requests always take the arena's lock */
#define GG__ORD_EVENTS  32 /* epochs of stream-ordered releases awaiting their event */

typedef struct gg__tcache gg__tcache_t;

/* One allocation carved from top. The log is sorted by address; consecutive entries of a run tile
 * memory without gaps, so cutting the log's tail releases a whole run as one range. */
typedef struct gg__bump_entry {
  uintptr_t start, ptr; /* start..ptr is alignment padding */
  size_t req;
  const char *tag;
  int depth;
  bool live;
  bool ordered; /* freed in stream order (gg_free_on): its memory is reusable at once */
} gg__bump_entry_t;

/* Entries of the log that tile one piece of memory without gaps. */
typedef struct gg__bump_run {
  size_t first; /* index of its first entry */
  void *seg;
} gg__bump_run_t;

/* A scope (frame 0 stands for "outside any scope" and never ends). */
typedef struct gg__frame {
  unsigned long long id;
  gg__block_t
      *blocks; /* frame 0: its USED block records, a list (threads' caches publish into it) */
  /* A scope: its USED block records, an array its end walks without chasing links (so it can load
   * records and map slots far ahead); kept with its room for the next scope at this depth. */
  gg__block_t **recs;
  size_t n_blocks, recs_cap; /* records it owns (list or array); room in recs */
  /* A scope: the same records by address (frame 0's are the arena's `used`). Its end empties the
   * map whole instead of deleting record by record, and keeps it for the next scope at this depth.
   * */
  gg__addr_map_t used;
  size_t bump_first;            /* its bump entries are [bump_first, next frame's bump_first) */
  unsigned long long bump_live; /* live entries among them, and their bytes */
  size_t bump_bytes;
} gg__frame_t;

/* Releases that wait for one event on the arena's stream. */
typedef struct gg__batch {
  void *event;
  gg__block_t *head;
  size_t bytes, count;
  bool mixed; /* open batch: since it opened, an allocation came after two or more releases, or one
               * made meanwhile was still live at the next (not alloc+free pairs) */
  bool deferred; /* open batch: the usual rule would have closed it; kept open as pairs only */
} gg__batch_t;

/* An arena that keeps its holes keeps top out of free blocks larger than this share of what is
 * mapped (1/100: gg__arena_promote). */
#define GG__HOLE_SHARE 100

struct gg_arena {
  _Atomic unsigned magic; /* read without the lock: the guard may tear the arena down meanwhile */
  atomic_uint calls; /* calls between gg__arena_enter and gg__arena_leave: destroy waits for them */
  atomic_bool destroying; /* set by the one gg_arena_destroy() that goes ahead */
  unsigned fork_gen;
  pthread_mutex_t lock;
  gg__dev_t *dev;
  const gg__backend_ops_t *ops;
  uintptr_t base;
  size_t capacity, chunk_size, granularity;
  size_t limit; /* mapped bytes a growth may reach (gg_arena_set_limit); the capacity by default */
  bool contiguous, track;
  bool keep_holes; /* serves a framework's caching allocator: GG_ARENA_KEEP_HOLES */
  void *stream;
  unsigned flags;
  char name[64];

  gg__freelist_t freelist;
  gg__addr_map_t used; /* ptr → USED record */

  gg__bump_entry_t *bump;
  size_t bump_count, bump_cap;
  gg__bump_run_t *runs;
  size_t run_count, run_cap;
  bool bump_new_run;      /* top moved: the next entry starts a run even when addresses touch */
  size_t bump_bytes;      /* bytes covered by runs */
  size_t bump_live_bytes; /* of which live */

  gg__frame_t *frames;
  int n_frames;
  size_t frames_cap;
  unsigned long long serial;

  gg__batch_t open;
  gg__batch_t *closed; /* FIFO [closed_head, closed_end): recorded, in stream order */
  size_t closed_head, closed_end, closed_cap;
  void **spare_events; /* spare events, and room for every event ever made */
  size_t n_spare_events, events_cap, events_made;
  size_t pending;        /* bytes in batches */
  bool idle_seen;        /* the last stream query found the arena's stream idle */
  uintptr_t placed_open; /* the last allocation, when made while the open batch had releases and
                          * not freed since; else 0 */
  size_t releases_since_alloc; /* into the open batch since the last allocation */
  unsigned pair_streak; /* allocations in a row that followed the alloc+free pattern (saturates) */

  gg__chunk_t **chunks; /* by address */
  size_t n_chunks, chunks_cap;

  char **tags; /* interned, an open-addressing set */
  size_t n_tags, tags_cap;
  const char *tag_last;
  size_t tag_last_len;

  size_t in_use, mapped, peak_in_use, peak_mapped;
  unsigned long long n_live, n_allocs, n_frees, n_trims, bytes_trimmed;
  unsigned long long n_maps, n_unmaps; /* chunks mapped and given back, since creation */
  unsigned long long n_moves;          /* free chunks a growth mapped where it needed them */
  size_t n_alias; /* chunks[] records that are aliases: old ranges of moved chunks, still mapped */
  gg__arena_probe_t probe;
  unsigned long long guard_token; /* registration with the live guard of its device, 0 if none */
  struct gg_arena *live_prev, *live_next; /* the process's live arenas, for reports */
  bool on_live;
  bool ordered_released; /* stream-ordered releases no granule records: unmapping must wait for the
                            stream */
  void *join_event;      /* recorded on one stream for another to wait on (gg_alloc_on/gg_free_on on
                          * other streams)
                          */
  gg__sites_t *sites;    /* allocation sites (GG_ARENA_BACKTRACE), or NULL; set at creation only */

  /* Stream-ordered releases (gg_free_on) make memory reusable at once, in stream order, but it
   * may be unmapped only once the work queued before the release is done. Each granule of the range
   * keeps the epoch of the last such release that touched it; an event recorded on the stream
   * closes an epoch, and every epoch up to ord_safe is known done. Growth then gives back only
   * chunks whose last user is done, and never waits for the stream (arena_release.c). */
  uint64_t
      *ord_tick; /* by granule (contiguous arenas), or NULL: none made yet, or no host memory */
  uint64_t ord_epoch;  /* the epoch releases are marked with now; >= 1 once anything was marked */
  uint64_t ord_marked; /* the latest epoch a release was marked with (0: none) */
  uint64_t ord_safe;   /* every epoch up to it is done */
  size_t ord_bytes;    /* bytes released in stream order in the current epoch */
  size_t ord_frees;    /* releases in stream order in the current epoch */
  struct {
    void *event;
    uint64_t epoch;         /* recorded after every release of this epoch and the ones before */
  } ord_ev[GG__ORD_EVENTS]; /* a FIFO of closed epochs, oldest at ord_head */
  unsigned ord_head, ord_n;

  /* Threads' caches (arena_cache.c). Read by them without the arena's lock, each on its own line.
   */
  unsigned long long
      id;               /* unique in the process: a cache of a dead arena never matches a new one */
  gg__tcache_t *caches; /* under the arena's lock */
  _Alignas(64) atomic_bool scopes_open; /* written only as scopes begin and end */
  _Alignas(64) _Atomic size_t
      in_use_seen; /* in_use, for the caches' peak (written by the locked path) */
  /* Stream tickets of the caches' frees, shared by all of them: a free takes `tc_epoch` as its
   * ticket; a thread about to ask the stream advances it, and when the stream (or an event recorded
   * after the advance) says the work is done, tickets below the advanced value are safe. One
   * observation, by any thread, serves every cache: the driver serialises stream queries, so
   * per-thread ones do not scale. */
  _Alignas(64) _Atomic uint64_t tc_epoch; /* written only by a thread about to ask the stream */
  _Alignas(64) _Atomic uint64_t tc_safe; /* tickets below it are reusable (raised, never lowered) */
  _Alignas(64) atomic_bool tc_asking;    /* a thread is asking the stream: the others do not */
  _Alignas(64) char gg__pad;
};

static inline size_t gg__rounded_size(size_t req) {
  return (req + GG__QUANTUM - 1) & ~(GG__QUANTUM - 1);
}
static inline uintptr_t gg__bump_entry_end(const gg__bump_entry_t *e) {
  return e->ptr + gg__rounded_size(e->req);
}
/* Bytes of the bump log that are freed but not yet given back to the free memory. */
static inline size_t gg__bump_dead_bytes(const gg_arena_t *a) {
  return a->bump_bytes - a->bump_live_bytes;
}

/* Whether the arena records allocation sites. Fixed from creation to destroy, so it may be read
 * without the lock: a fast path that bypasses gg_alloc_ex's locked path (a per-thread cache) must
 * not serve allocations while it is true, since each needs its site recorded. */
static inline bool gg__arena_records_sites(const gg_arena_t *a) { return a->sites != NULL; }

/* ---- arena.c --------------------------------------------------------------------------------- */

/* Checks the handle without locking it: NULL, destroyed, torn down, inherited through fork(). */
int gg__arena_valid_slow(const gg_arena_t *a, const char *call);
/* The same, inline where the handle is live: every allocation and free asks first. */
static inline int gg__arena_valid(const gg_arena_t *a, const char *call) {
  if (GG__LIKELY(a && atomic_load(&a->magic) == GG__MAGIC && a->fork_gen == gg__fork_generation()))
    return 0;
  return gg__arena_valid_slow(a, call);
}
/* For a handle gg__arena_valid() accepted: counts the call among those in flight and takes the
 * lock; 0, or the handle's error when it died meanwhile. */
int gg__arena_lock_counted(gg_arena_t *a, const char *call);
/* Checks the handle, counts the call and takes the lock; 0 or the handle's error. */
static inline int gg__arena_enter(gg_arena_t *a, const char *call) {
  int rc = gg__arena_valid(a, call);
  return rc < 0 ? rc : gg__arena_lock_counted(a, call);
}
/* gg_arena_foreach_mapping's walk, its errors said as `call`'s: a public call built on the walk
 * (gg_arena_export) reports a bad range or a hole under its own name, composed once. */
int gg__arena_walk_mappings(gg_arena_t *a, const void *ptr, size_t size, const char *call,
                            gg_mapping_visitor_t visit, void *user);
/* Unlocks and uncounts the call (gg__arena_enter's other half). */
static inline void gg__arena_leave_unchecked(gg_arena_t *a) {
  pthread_mutex_unlock(&a->lock);
  atomic_fetch_sub(&a->calls, 1);
}
#if GG_DEBUG >= 2
/* The debug build's expensive check (GG__ASSERT_EXPENSIVE's level): the whole arena, as
 * gg__arena_check() walks it, on arenas below a size (arena_check.c); aborts naming what is wrong.
 * */
void gg__arena_debug_check(gg_arena_t *a);
/* The same check as every arena file's end of call reaches it: through a pointer that
 * gg_arena_create() sets (arena_base.c holds it), so the check, which reads every part of the
 * arena, stays above the files it checks. */
extern void (*_Atomic gg__arena_debug_hook)(gg_arena_t *a);
#endif
/* The end of every locked public call: in the debug build the whole arena is checked first. */
static inline void gg__arena_leave(gg_arena_t *a) {
#if GG_DEBUG >= 2
  void (*check)(gg_arena_t *) = atomic_load_explicit(&gg__arena_debug_hook, memory_order_relaxed);
  if (check) check(a);
#endif
  gg__arena_leave_unchecked(a);
}
int gg__arena_grow_array_slow(void *arr, size_t *cap, size_t need, size_t elem);
/* Grows a dynamic array so it holds at least `need` elements. 0 or GG_ENOMEM. */
static inline int gg__arena_grow_array(void *arr, size_t *cap, size_t need, size_t elem) {
  return GG__LIKELY(need <= *cap) ? 0 : gg__arena_grow_array_slow(arr, cap, need, elem);
}
/* Runs a step whose failure only delays reuse or makes a growth map more: this thread's error
 * detail is kept as it was before the step. Returns the step's status. */
int gg__arena_quietly(gg_arena_t *a, int (*step)(gg_arena_t *a, void *ctx), void *ctx);
static inline void gg__arena_count_alloc(gg_arena_t *a, size_t n) {
  a->in_use += n;
  a->n_live++;
  a->n_allocs++;
  if (a->in_use > a->peak_in_use) a->peak_in_use = a->in_use;
  atomic_store_explicit(&a->in_use_seen, a->in_use, memory_order_relaxed);
}
static inline void gg__arena_count_release(gg_arena_t *a, size_t bytes, unsigned long long blocks) {
  GG__ASSERT(a->in_use >= bytes && a->n_live >= blocks); /* released more than was live */
  a->in_use -= bytes;
  a->n_live -= blocks;
  a->n_frees += blocks;
  atomic_store_explicit(&a->in_use_seen, a->in_use, memory_order_relaxed);
}
void gg__arena_fill_stats(const gg_arena_t *a, gg_arena_stats_t *s);

/* ---- arena_alloc.c --------------------------------------------------------------------------- */

void gg__arena_tags_free(gg_arena_t *a);

/* ---- arena_release.c ------------------------------------------------------------------------- */

/* Released memory: reusable at once without stream tracking or when released in stream order
 * (`ordered`), else once the open batch's event says the work queued before now is done. `rec` is a
 * record to reuse, or NULL (reserved by the caller). */
void gg__arena_release(gg_arena_t *a, uintptr_t addr, size_t size, void *seg, gg__block_t *rec,
                       bool ordered);
/* Before `releases` releases at once (a scope end): true when they may go straight to the free
 * list, as released in stream order. Always without stream tracking; with it, only when they would
 * close the open batch anyway (which asks the stream) and the stream, asked now, is idle: every
 * release before them is then merged too. Never blocks; a failure only means false. */
bool gg__arena_settle_before(gg_arena_t *a, size_t releases);
/* After releases: closes the open batch once it is large enough (never blocks, failures only
 * delay). */
void gg__arena_after_release(gg_arena_t *a);
/* Under the lock, before an allocation of a tracking arena: a batch kept open for alloc+free pairs
 * closes when the allocation pattern is no longer pairs (see gg__arena_after_release). */
void gg__arena_before_alloc(gg_arena_t *a);
/* Never blocks and never fails: makes reusable what the stream has finished with (a failure only
 * delays reuse; this thread's error detail is left as it was). */
void gg__arena_reclaim_finished(gg_arena_t *a);
/* Its step, for a caller already inside gg__arena_quietly (a region costs two thread-local writes).
 * */
int gg__arena_reclaim_finished_step(gg_arena_t *a, void *unused);
/* Blocking: waits for the work every pending release waits on, then makes all of it reusable. */
int gg__arena_wait_pending(gg_arena_t *a);
/* Destroys every event (device teardown); the first failure is returned, the rest are still done.
 * */
int gg__arena_events_destroy(gg_arena_t *a);
/* A release in stream order of [addr, addr + size): reusable at once, but unmapped only once the
 * work queued before now is done (the granules it touches are marked with the current epoch). Never
 * fails: without room for the marks, the next trim waits for the stream. */
void gg__arena_ordered_note(gg_arena_t *a, uintptr_t addr, size_t size);
/* Never blocks and never fails: closes the current epoch with an event and learns which epochs are
 * done (a failure only means fewer chunks are known idle). */
void gg__arena_ordered_poll(gg_arena_t *a);
/* Whether no work queued before a stream-ordered release may still use [addr, addr + size). */
bool gg__arena_range_idle(const gg_arena_t *a, uintptr_t addr, size_t size);
/* Blocking (one counted host wait), only when some stream-ordered release is not known done:
 * afterwards all of them are. */
int gg__arena_ordered_wait(gg_arena_t *a);

/* ---- arena_bump.c ---------------------------------------------------------------------------- */

/* Room for one more log entry and run. 0 or GG_ENOMEM. */
static inline int gg__bump_reserve(gg_arena_t *a) {
  int rc = gg__arena_grow_array(&a->bump, &a->bump_cap, a->bump_count + 1, sizeof *a->bump);
  if (rc == 0) rc = gg__arena_grow_array(&a->runs, &a->run_cap, a->run_count + 1, sizeof *a->runs);
  return rc;
}
/* Carves n bytes at alignment `align` from top (which must hold them) as a new log entry. */
uintptr_t gg__bump_push(gg_arena_t *a, size_t n, size_t align, size_t req, const char *tag);
/* Cuts freed entries off the end of the log. */
void gg__bump_pop_dead(gg_arena_t *a);
/* Turns the log into block records. 0 or GG_ENOMEM (nothing changed). */
int gg__bump_flush(gg_arena_t *a);
/* Below the last entry: the log entry whose memory holds p (which lies within the log), or -1. */
long gg__bump_search(const gg_arena_t *a, uintptr_t p);
/* Room for k more records in scope d's array (frame 0 needs none). 0 or GG_ENOMEM. */
static inline int gg__frame_reserve(gg_arena_t *a, int d, size_t k) {
  gg__frame_t *f = &a->frames[d];
  return d == 0 ? 0
                : gg__arena_grow_array(&f->recs, &f->recs_cap, f->n_blocks + k, sizeof *f->recs);
}
/* The map of depth d's USED records: frame 0's is the arena's own (threads' caches publish into
 * it). */
static inline gg__addr_map_t *gg__used_map(gg_arena_t *a, int d) {
  return d ? &a->frames[d].used : &a->used;
}
/* The USED record at p (innermost scope first), or NULL; take also removes it from its map. */
gg__block_t *gg__used_get(const gg_arena_t *a, uintptr_t p);
gg__block_t *gg__used_take(gg_arena_t *a, uintptr_t p);
/* The USED record whose memory holds p, or NULL: a scan of every map, for error messages and
 * checks. */
const gg__block_t *gg__used_holding(const gg_arena_t *a, uintptr_t p);
/* USED records in all maps. */
size_t gg__used_count(const gg_arena_t *a);
/* Links a USED record into (or out of) its scope's blocks; linking into a scope needs a
 * reservation. */
void gg__frame_link(gg_arena_t *a, gg__block_t *b);
void gg__frame_unlink(gg_arena_t *a, gg__block_t *b);

/* ---- arena_sites.c --------------------------------------------------------------------------- */

/* Makes the arena record sites (creation, outside the lock). 0 or GG_ENOMEM. */
int gg__sites_create(gg_arena_t *a);
void gg__sites_free(gg_arena_t *a);
/* Records where the block at p was allocated: a backtrace from `caller` (the return address of the
 * public call that allocated it). Never fails: without host memory the block has no site. */
void gg__site_note(gg_arena_t *a, uintptr_t p, void *caller);
/* The site of the live block at p, or NULL. */
const gg__site_t *gg__site_of(const gg_arena_t *a, uintptr_t p);

/* ---- arena_grow.c ---------------------------------------------------------------------------- */

/* Makes the largest free block the bump block when it is larger than top. Failures only lose speed.
 * */
void gg__arena_promote(gg_arena_t *a);
/* Index of the first chunk at or above p. */
size_t gg__chunk_index(const gg_arena_t *a, uintptr_t p);
/* Maps a chunk that makes room for n bytes at alignment al. 0; GG_ENOMEM with `why` saying whether
 * the capacity or the device ran out; or the backend's error. */
int gg__arena_grow(gg_arena_t *a, size_t n, size_t al, char *why, size_t whycap);
/* Whether to give wholly free chunks back before mapping n more bytes. */
bool gg__arena_trim_before_growth(const gg_arena_t *a, size_t n);
/* Unmaps wholly free chunks, highest first, while more than keep bytes stay mapped. May wait for
 * the stream (counted), so that every free chunk can go. */
int gg__arena_trim_locked(gg_arena_t *a, size_t keep);
/* Before a growth: unmaps the wholly free chunks no queued work may still use. Never waits; a
 * failure only means the growth maps more. */
int gg__arena_trim_idle_locked(gg_arena_t *a);
/* Unmaps every chunk (destroy, teardown) and frees the records; the first error (every chunk is
 * tried). */
int gg__arena_unmap_all(gg_arena_t *a);
/* Unmaps the old ranges of moved chunks that no queued work may still use (every one after a wait
 * for the stream), so that growth may map there again. A failure keeps the alias for later. */
void gg__arena_drop_aliases(gg_arena_t *a);

/* ---- arena_cache.c --------------------------------------------------------------------------- */

/* Without the arena's lock, on a handle gg__arena_valid() accepted. Serve an allocation of `size`
 * (rounded; the default alignment) from this thread's cache, or take back a block the cache handed
 * out; false: the arena's own path must do it. */
bool gg__tcache_alloc(gg_arena_t *a, size_t size, size_t asked, const char *tag, void **ptr);
bool gg__tcache_free(gg_arena_t *a, void *ptr, bool ordered);
/* What each step of the allocation ladder returns (arena_alloc.c, and the cache's refill step):
 * GG__PLACED when the request is served, GG__NO_ROOM when the next step is to be tried, or a
 * negative GG_E* code, with which the allocation fails. A step that only maps memory (growth)
 * places nothing: it returns GG__NO_ROOM, and the free list is tried again. */
enum { GG__NO_ROOM = 0, GG__PLACED = 1 };
/* Refills this thread's cache with blocks of `size` carved from free memory as it is and hands one
 * out (GG__PLACED); GG__NO_ROOM when the request is not for the cache or nothing fits (the ladder
 * takes over).
 * Publishes the cache first either way, so the arena's counters are this thread's too. */
int gg__tcache_alloc_locked(gg_arena_t *a, size_t size, size_t asked, size_t align, const char *tag,
                            uintptr_t *ptr);
/* Publishes every cache's live blocks as USED records; how many, or GG_ENOMEM. */
int gg__tcache_publish_all(gg_arena_t *a);
/* Every cache's free blocks back to the arena (publishing too, with `publish`); errors keep them.
 * Whether any came back. */
bool gg__tcache_give_back_all(gg_arena_t *a, bool publish);
/* Destroy and teardown: every cache lets go of the arena (its blocks go with the arena's memory).
 * */
void gg__tcache_detach_all(gg_arena_t *a);
/* Adds the caches' deltas (and cached frees still waiting for the stream, as pending) to stats. */
void gg__tcache_add_stats(gg_arena_t *a, gg_arena_stats_t *s);
void gg__tcache_reset_peak(gg_arena_t *a);
/* For the checker: every cached record, and what is wrong with a cache's own bookkeeping, or NULL.
 * */
const char *gg__tcache_census(gg_arena_t *a,
                              void (*visit)(void *ctx, const gg__block_t *b, bool live), void *ctx);
size_t gg__tcache_records(gg_arena_t *a);
#endif
