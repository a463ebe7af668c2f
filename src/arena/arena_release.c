/* arena_release.c — released memory that work queued on the arena's stream may still use: batches
 * of releases that share one event, the checks that make them reusable without blocking, and the
 * blocking wait that makes all of them reusable. */
#include <stdlib.h>
#include <string.h>

#include "arena/arena_base_impl.h"
#include "core/internal.h"

#define GG__BATCH_MAX   1024 /* releases per batch before its event is recorded anyway */
#define GG__CLOSE_MIN   2    /* releases a batch needs before a small share of memory closes it */
#define GG__MERGE_AHEAD 8    /* releases a merge looks ahead to start loading their map slots */
#define GG__PAIRS_MAX   16 /* releases a batch of alloc+free pairs holds before it closes anyway */
/* Allocations in a row in that pattern before a batch is kept open for it. */
#define GG__PAIRS_RUN 4

void gg__arena_release(gg_arena_t *a, uintptr_t addr, size_t size, void *seg, gg__block_t *rec,
                       bool ordered) {
  /* The free list tiles memory in quanta: a range off the grid would overlap its neighbour. */
  GG__ASSERT(size && size % GG__QUANTUM == 0 && addr % GG__QUANTUM == 0);
  if (!a->track || ordered) {
    gg__freelist_put(&a->freelist, addr, size, seg, rec);
    return;
  }
  if (!rec) rec = gg__freelist_take_record(&a->freelist);
  GG__ASSERT(rec->state != GG__BLOCK_PENDING && rec->state != GG__BLOCK_FREE); /* released twice */
  memset(rec, 0, sizeof *rec);
  rec->addr = addr;
  rec->size = size;
  rec->seg = seg;
  rec->state = GG__BLOCK_PENDING;
  if (++a->releases_since_alloc > 1) a->open.mixed = true;
  rec->r = a->open.head;
  a->open.head = rec;
  a->open.bytes += size;
  a->open.count++;
  a->pending += size;
}

/* ---- batches --------------------------------------------------------------------------------- */

/* For GG__ASSERT_EXPENSIVE: a batch's list holds `count` PENDING records of `bytes` in all (batches
 * longer than GG__WALK_MAX are taken on trust). */
static bool gg__batch_ok(const gg__batch_t *b) {
  if (b->count > GG__WALK_MAX) return true;
  size_t n = 0, bytes = 0;
  for (const gg__block_t *r = b->head; r; r = r->r, n++) {
    if (r->state != GG__BLOCK_PENDING || n >= b->count) return false;
    bytes += r->size;
  }
  return n == b->count && bytes == b->bytes;
}

/* Records one event for the open batch: the only driver call a batch costs until it is reused. */
static int gg__batch_record(gg_arena_t *a) {
  if (!a->open.count) return 0;
  int rc;
  if (a->closed_end == a->closed_cap && a->closed_head) {
    memmove(a->closed, a->closed + a->closed_head,
            (a->closed_end - a->closed_head) * sizeof *a->closed);
    a->closed_end -= a->closed_head;
    a->closed_head = 0;
  }
  rc = gg__arena_grow_array(&a->closed, &a->closed_cap, a->closed_end + 1, sizeof *a->closed);
  if (rc < 0) return rc;
  void *ev;
  if (a->n_spare_events) {
    ev = a->spare_events[--a->n_spare_events];
  } else {
    rc = gg__arena_grow_array(&a->spare_events, &a->events_cap, a->events_made + 1,
                              sizeof *a->spare_events);
    if (rc < 0) return rc;
    rc = a->ops->event_create(a->dev, &ev);
    if (rc < 0) return rc;
    a->events_made++;
  }
  rc = a->ops->event_record(a->dev, ev, a->stream);
  if (rc < 0) {
    a->spare_events[a->n_spare_events++] = ev;
    return rc;
  }
  a->open.event = ev;
  GG__ASSERT(a->open.head && a->open.bytes <= a->pending);
  GG__ASSERT_EXPENSIVE(gg__batch_ok(&a->open));
  a->closed[a->closed_end++] = a->open;
  memset(&a->open, 0, sizeof a->open);
  a->probe.events_recorded++;
  return 0;
}

/* Makes a batch's memory reusable, merging it with its free neighbours. */
static int gg__batch_merge(gg_arena_t *a, gg__batch_t *b) {
  GG__ASSERT_EXPENSIVE(gg__batch_ok(b));
  int rc = gg__freelist_reserve(&a->freelist, b->count);
  if (rc < 0) return rc;
  /* Large batches (a scope's blocks) miss the cache on every map slot: start loading a few ahead.
   * */
  gg__block_t *ahead = b->head;
  for (int i = 0; ahead && i < GG__MERGE_AHEAD; i++) ahead = ahead->r;
  for (gg__block_t *r = b->head, *next; r; r = next) {
    next = r->r;
    if (ahead) {
      gg__freelist_prefetch(&a->freelist, ahead->addr, ahead->size);
      ahead = ahead->r;
    }
    GG__ASSERT(r->state == GG__BLOCK_PENDING); /* a batch holds released records only */
    gg__freelist_put(&a->freelist, r->addr, r->size, r->seg, r);
  }
  GG__ASSERT(a->pending >= b->bytes);
  a->pending -= b->bytes;
  /* Every event made has a slot among the spares: one given back twice would overflow them. */
  GG__ASSERT(!b->event || a->n_spare_events < a->events_made);
  if (b->event) a->spare_events[a->n_spare_events++] = b->event;
  memset(b, 0, sizeof *b);
  a->probe.batches_merged++;
  return 0;
}

/* Merges the recorded batches before index `upto`, oldest first, stopping at a failure. */
static void gg__merge_recorded(gg_arena_t *a, size_t upto) {
  GG__ASSERT(upto <= a->closed_end);
  while (a->closed_head < upto && gg__batch_merge(a, &a->closed[a->closed_head]) == 0)
    a->closed_head++;
  if (a->closed_head == a->closed_end) a->closed_head = a->closed_end = 0;
}

/* Non-blocking: merges every recorded batch whose work is done. Events complete in stream order, so
 * the newest is asked first (one query settles all), then the oldest ones. */
static void gg__merge_completed(gg_arena_t *a) {
  if (a->closed_head == a->closed_end) return;
  a->probe.events_queried++;
  if (a->ops->event_query(a->dev, a->closed[a->closed_end - 1].event) == 1) {
    gg__merge_recorded(a, a->closed_end);
    return;
  }
  while (a->closed_head + 1 < a->closed_end) {
    a->probe.events_queried++;
    if (a->ops->event_query(a->dev, a->closed[a->closed_head].event) != 1) break;
    size_t before = a->closed_head;
    gg__merge_recorded(a, a->closed_head + 1);
    if (a->closed_head == before) break;
  }
}

/* Asks the stream; idle, every release so far is merged (the open batch, then the recorded ones).
 * */
static bool gg__settle_if_idle(gg_arena_t *a) {
  a->probe.stream_queries++;
  a->idle_seen = a->ops->stream_query(a->dev, a->stream) == 1;
  if (a->idle_seen && (!a->open.count || gg__batch_merge(a, &a->open) == 0))
    gg__merge_recorded(a, a->closed_end);
  return a->idle_seen;
}

/* When the stream has nothing queued, every release so far is safe to reuse: one stream query
 * settles the open batch and all recorded ones, with no event. Otherwise the open batch gets its
 * event and finished batches are merged. */
int gg__arena_reclaim_finished_step(gg_arena_t *a, void *unused) {
  (void)unused;
  if ((a->open.count || a->closed_head != a->closed_end) && gg__settle_if_idle(a)) return 0;
  if (gg__batch_record(a) == 0) gg__merge_completed(a);
  return 0;
}

static int gg__settle_step(gg_arena_t *a, void *unused) {
  (void)unused;
  return gg__settle_if_idle(a);
}

bool gg__arena_settle_before(gg_arena_t *a, size_t releases) {
  if (!a->track) return true;
  if (a->open.count + releases < GG__BATCH_MAX) return false;
  if (gg__arena_quietly(a, gg__settle_step, NULL) != 1) return false;
  a->releases_since_alloc +=
      releases; /* as if released one by one: the next allocation is no pair */
  return true;
}

void gg__arena_reclaim_finished(gg_arena_t *a) {
  gg__arena_quietly(a, gg__arena_reclaim_finished_step, NULL);
}

/* A batch is closed (its event recorded) once it holds GG__BATCH_MAX releases, or two or more worth
 * max(1/256 of the mapped memory, half a chunk). Large frees thus come back at the addresses they
 * were freed from before later allocations land above them (training-like sequence: peak mapped /
 * peak in use 1.006, against 1.05-1.10 when batches close only as memory runs out), while small and
 * mid-sized frees share an event among 16-1024 of them.
 * Alloc+free pairs (each allocation right after at most one free, and freed before the next one),
 * once GG__PAIRS_RUN allocations in a row followed that pattern, keep the batch open past that
 * rule, up to GG__PAIRS_MAX releases or an allocation that finds no room, while the stream was last
 * seen idle: only blocks that were freed at once land elsewhere meanwhile, and one query settles
 * them all (2 MiB pairs: a query every 3-4 pairs instead of 2; a random mix of sizes: 0.16 per pair
 * instead of 0.25). The allocation after one that broke the pattern closes the batch before it is
 * placed (gg__arena_before_alloc); with the run required first, the training-like sequence and the
 * recorded traces replayed through gg_alloc/gg_free keep their ratios exactly (closing later in
 * general raised the training-like ratio to 1.02-1.05, and without the run one trace moved by
 * +-0.5%). On a busy stream events are recorded as early as before, so they are complete by the
 * time their memory is needed. */
void gg__arena_after_release(gg_arena_t *a) {
  if (!a->track) return;
  size_t c = a->open.count, b = a->open.bytes;
  size_t share = a->mapped / 256 > a->chunk_size / 2 ? a->mapped / 256 : a->chunk_size / 2;
  if (c < GG__BATCH_MAX && (c < GG__CLOSE_MIN || b < share)) return;
  if (!a->open.mixed && a->idle_seen && c < GG__PAIRS_MAX && a->pair_streak >= GG__PAIRS_RUN) {
    a->open.deferred = true;
    return;
  }
  gg__arena_reclaim_finished(a);
}

void gg__arena_before_alloc(gg_arena_t *a) {
  if (a->placed_open || a->releases_since_alloc > 1)
    a->pair_streak = 0;
  else if (a->pair_streak < GG__PAIRS_RUN)
    a->pair_streak++;
  a->releases_since_alloc = 0;
  if (!a->open.count) return;
  if (a->placed_open) a->open.mixed = true; /* made while releases waited, and still live */
  if (a->open.deferred && a->open.mixed) gg__arena_reclaim_finished(a);
}

/* ---- waiting --------------------------------------------------------------------------------- */

/* Waits on the newest batch's event (recording the open batch's first), which covers every batch.
 * */
static int gg__wait_newest_event(gg_arena_t *a, void *unused) {
  (void)unused;
  int rc = gg__batch_record(a);
  if (rc == 0) {
    a->probe.stream_waits++;
    rc = a->ops->event_sync(a->dev, a->closed[a->closed_end - 1].event);
  }
  return rc;
}

int gg__arena_wait_pending(gg_arena_t *a) {
  if (!a->track || (a->closed_head == a->closed_end && !a->open.count)) return 0;
  int rc;
  if (gg__arena_quietly(a, gg__wait_newest_event, NULL) < 0) {
    /* No event to wait on, or waiting on it failed: the whole stream covers every batch, open too.
     * */
    a->probe.stream_waits++;
    rc = a->ops->stream_sync(a->dev, a->stream);
    if (rc < 0) return rc;
    if (a->open.count) rc = gg__batch_merge(a, &a->open);
    if (rc < 0) return rc;
  }
  gg__merge_recorded(a, a->closed_end);
  return a->closed_head == a->closed_end
             ? 0
             : gg__err(GG_ENOMEM, "arena: out of host memory merging released blocks");
}

/* ---- stream-ordered releases: when their memory may be unmapped --------------------------------
 */

/* An epoch closes (its event is recorded) once its releases reach this share of the mapped memory
 * and number at least GG__ORD_CLOSE_FREES: growth needs whole free chunks known idle, and a step's
 * frees are then covered by events a few dozen times a step, not only by the one made as growth
 * asks. The count keeps alloc+free pairs of large blocks from paying a record each (~2 us on an
 * H200; on the host backend 64 MiB gg_alloc_on/gg_free_on pairs went from ~0.4 to ~2 us without
 * it). A bound in time instead (one close a millisecond) did the same for pairs, but replayed
 * traces, which run faster than a GPU, then closed epochs too seldom (a decoder trace: peak
 * ratio 1.0045 -> 1.039).
 */
#define GG__ORD_CLOSE_FREES 16

static size_t gg__ord_close_bytes(const gg_arena_t *a) {
  return a->mapped / 64 > a->chunk_size ? a->mapped / 64 : a->chunk_size;
}

static int gg__ord_record_step(gg_arena_t *a, void *unused);

void gg__arena_ordered_note(gg_arena_t *a, uintptr_t addr, size_t size) {
  if (!a->track || !size) return;
  if (!a->ord_tick && a->contiguous) {
    a->ord_tick = calloc(a->capacity / a->granularity, sizeof *a->ord_tick);
    if (a->ord_tick && !a->ord_epoch) a->ord_epoch = 1;
  }
  if (!a->ord_tick || addr < a->base || addr - a->base >= a->capacity) {
    a->ordered_released = true; /* not recorded: the next trim waits for the stream */
    return;
  }
  size_t g0 = (addr - a->base) / a->granularity, g1 = (addr - a->base + size - 1) / a->granularity;
  GG__ASSERT(a->ord_epoch >= 1 && g1 < a->capacity / a->granularity); /* marks stay in the array */
  for (size_t g = g0; g <= g1; g++) a->ord_tick[g] = a->ord_epoch;
  a->ord_marked = a->ord_epoch;
  a->ord_bytes += size;
  if (++a->ord_frees >= GG__ORD_CLOSE_FREES && a->ord_bytes >= gg__ord_close_bytes(a))
    gg__arena_quietly(a, gg__ord_record_step, NULL);
}

/* Non-blocking: every closed epoch whose event says its work is done. Events complete in stream
 * order: the newest is asked first (one query settles all), then the oldest ones. */
static void gg__ord_collect(gg_arena_t *a) {
  if (!a->ord_n) return;
  unsigned newest = (a->ord_head + a->ord_n - 1) % GG__ORD_EVENTS;
  a->probe.events_queried++;
  if (a->ops->event_query(a->dev, a->ord_ev[newest].event) == 1) {
    GG__ASSERT(a->ord_ev[newest].epoch >= a->ord_safe); /* safe epochs are raised, never lowered */
    a->ord_safe = a->ord_ev[newest].epoch;
    a->ord_head = 0;
    a->ord_n = 0;
    return;
  }
  while (a->ord_n > 1) {
    a->probe.events_queried++;
    if (a->ops->event_query(a->dev, a->ord_ev[a->ord_head].event) != 1) break;
    GG__ASSERT(a->ord_ev[a->ord_head].epoch >= a->ord_safe);
    a->ord_safe = a->ord_ev[a->ord_head].epoch;
    a->ord_head = (a->ord_head + 1) % GG__ORD_EVENTS;
    a->ord_n--;
  }
}

/* Closes the current epoch with an event recorded now, on the arena's stream. With every slot
 * waiting, the newest event is recorded again instead: it then covers its own epoch and this one
 * (later than needed for its own, never too early). */
static int gg__ord_record_step(gg_arena_t *a, void *unused) {
  (void)unused;
  if (a->ord_marked != a->ord_epoch) return 0; /* nothing released since the last close */
  if (a->ord_n == GG__ORD_EVENTS) gg__ord_collect(a);
  unsigned slot = a->ord_n == GG__ORD_EVENTS ? (a->ord_head + a->ord_n - 1) % GG__ORD_EVENTS
                                             : (a->ord_head + a->ord_n) % GG__ORD_EVENTS;
  int rc;
  if (!a->ord_ev[slot].event) {
    rc = a->ops->event_create(a->dev, &a->ord_ev[slot].event);
    if (rc < 0) {
      a->ord_ev[slot].event = NULL;
      return rc;
    }
  }
  rc = a->ops->event_record(a->dev, a->ord_ev[slot].event, a->stream);
  if (rc < 0) return rc;
  a->probe.events_recorded++;
  if (a->ord_n < GG__ORD_EVENTS) a->ord_n++;
  /* The epoch being closed is not known done yet: a safe one closed again would go backwards. */
  GG__ASSERT(a->ord_epoch > a->ord_safe);
  a->ord_ev[slot].epoch = a->ord_epoch++;
  a->ord_bytes = 0;
  a->ord_frees = 0;
  return 0;
}

static int gg__ord_poll_step(gg_arena_t *a, void *unused) {
  gg__ord_record_step(a, unused);
  gg__ord_collect(a);
  return 0;
}

void gg__arena_ordered_poll(gg_arena_t *a) {
  if (a->track && a->ord_marked > a->ord_safe) gg__arena_quietly(a, gg__ord_poll_step, NULL);
}

bool gg__arena_range_idle(const gg_arena_t *a, uintptr_t addr, size_t size) {
  if (!a->track) return true;
  if (a->ordered_released) return false;
  if (!a->ord_tick || a->ord_marked <= a->ord_safe) return true;
  GG__ASSERT(addr >= a->base && addr - a->base + size <= a->capacity);
  size_t g0 = (addr - a->base) / a->granularity, g1 = (addr - a->base + size - 1) / a->granularity;
  for (size_t g = g0; g <= g1; g++)
    if (a->ord_tick[g] > a->ord_safe) return false;
  return true;
}

int gg__arena_ordered_wait(gg_arena_t *a) {
  if (!a->track) return 0;
  gg__arena_ordered_poll(a);
  if (!a->ordered_released && a->ord_marked <= a->ord_safe) return 0;
  a->probe.stream_waits++;
  int rc = a->ops->stream_sync(a->dev, a->stream);
  if (rc < 0) return rc;
  /* Everything released so far is done: later releases get a later epoch. */
  a->ordered_released = false;
  a->ord_safe = a->ord_epoch;
  a->ord_marked = a->ord_safe;
  a->ord_epoch++;
  a->ord_bytes = 0;
  a->ord_frees = 0;
  a->ord_head = 0;
  a->ord_n = 0;
  return 0;
}

int gg__arena_events_destroy(gg_arena_t *a) {
  int rc = 0;
  for (unsigned i = 0; i < GG__ORD_EVENTS; i++)
    if (a->ord_ev[i].event) GG_KEEP_FIRST(rc, a->ops->event_destroy(a->dev, a->ord_ev[i].event));
  memset(a->ord_ev, 0, sizeof a->ord_ev);
  a->ord_head = 0;
  a->ord_n = 0;
  GG__ASSERT(a->n_spare_events + (a->closed_end - a->closed_head) <= a->events_made);
  for (size_t i = a->closed_head; i < a->closed_end; i++)
    a->spare_events[a->n_spare_events++] = a->closed[i].event;
  a->closed_head = a->closed_end = 0;
  for (size_t i = 0; i < a->n_spare_events; i++)
    GG_KEEP_FIRST(rc, a->ops->event_destroy(a->dev, a->spare_events[i]));
  a->n_spare_events = 0;
  if (a->join_event) GG_KEEP_FIRST(rc, a->ops->event_destroy(a->dev, a->join_event));
  a->join_event = NULL;
  return rc;
}
