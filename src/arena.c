/* arena.c — arenas: one reserved range mapped in chunks, a bump log that makes scope ends O(1), block
 * records for everything else, stream-safe reuse in batches, trim, statistics and input checks.
 *
 * Memory of an arena is, at any moment, tiled exactly by four kinds of pieces (gg__arena_check proves
 * it): free blocks (the best-fit treap of freelist.c, plus the bump block "top"), USED block records
 * (allocations served by best fit, or flushed from the bump log), PENDING records (released, waiting
 * for the stream), and runs of the bump log (allocations carved from top, live or freed). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena_internal.h"
#include "backend/backend.h"
#include "freelist.h"
#include "guard_internal.h"
#include "internal.h"
#include "plugin_internal.h"

#define GG__MAGIC 0x67676172u /* "ggar" */
#define GG__DEAD  0x64656164u /* "dead" */
/* "torn": its guard gave the device memory back; the handle waits for gg_arena_destroy() */
#define GG__TORN 0x746f726eu
/* 8 MiB: each map costs ~30 us whatever its size on an H200, so growing by 8 MiB costs ~4 ms per GiB
 * (2 MiB: 16 ms); and trim returns memory in pieces that small. Replaying a PyTorch training trace, peak
 * mapped / peak in use was 1.004 (2 MiB: 1.001, 64 MiB: 1.012). */
#define GG__DEFAULT_CHUNK ((size_t)8 << 20)
#define GG__BATCH_MAX     1024 /* releases per batch before its event is recorded anyway */
#define GG__CLOSE_MIN     2    /* releases a batch needs before a small share of memory closes it */
#define GG__TAG_MAX       63   /* longer tags are cut */
#define GG__QUARANTINE    64   /* destroyed handles kept readable so late calls fail cleanly */

/* One allocation carved from top. The log is sorted by address; consecutive entries of a run tile
 * memory without gaps, so cutting the log's tail releases a whole run as one range. */
typedef struct gg__bent {
  uintptr_t start, ptr; /* start..ptr is alignment padding */
  size_t req;
  const char *tag;
  int depth;
  bool live;
  bool ordered; /* freed in stream order (the plugin): its memory is reusable at once */
} gg__bent_t;

typedef struct gg__brun {
  size_t first; /* index of its first entry */
  void *seg;
} gg__brun_t;

/* A scope (frame 0 stands for "outside any scope" and never ends). */
typedef struct gg__frame {
  unsigned long long id;
  gg__blk_t *blocks;            /* its USED block records */
  size_t bump_first;            /* its bump entries are [bump_first, next frame's bump_first) */
  unsigned long long bump_live; /* live entries among them, and their bytes */
  size_t bump_bytes;
} gg__frame_t;

/* Releases that wait for one event on the arena's stream. */
typedef struct gg__batch {
  void *ev;
  gg__blk_t *head;
  size_t bytes, count;
} gg__batch_t;

struct gg_arena {
  _Atomic unsigned magic; /* read without the lock: the guard may tear the arena down meanwhile */
  unsigned fork_gen;
  pthread_mutex_t lock;
  gg__dev_t *dev;
  const gg__backend_ops_t *ops;
  uintptr_t base;
  size_t capacity, chunk_size, gran;
  bool contiguous, track;
  void *stream;
  unsigned flags;
  char name[64];

  gg__fl_t fl;
  gg__amap_t used; /* ptr → USED record */

  gg__bent_t *bump;
  size_t nbump, capbump;
  gg__brun_t *runs;
  size_t nruns, capruns;
  bool newrun;            /* top moved: the next entry starts a run even when addresses touch */
  size_t bump_bytes;      /* bytes covered by runs */
  size_t bump_live_bytes; /* of which live */

  gg__frame_t *frames;
  int nframes;
  size_t capframes;
  unsigned long long serial;

  gg__batch_t open;
  gg__batch_t *closed; /* FIFO [chead, cend): recorded, in stream order */
  size_t chead, cend, capclosed;
  void **evs; /* spare events, and room for every event ever made */
  size_t nevs, capevs, nev_made;
  size_t pending; /* bytes in batches */

  gg__chunk_t **chunks; /* by address */
  size_t nchunks, capchunks;

  char **tags; /* interned, an open-addressing set */
  size_t ntags, captags;
  const char *tag_last;
  size_t tag_last_len;

  size_t in_use, mapped, peak_in_use, peak_mapped;
  unsigned long long n_live, n_allocs, n_frees, n_trims, bytes_trimmed;
  gg__arena_probe_t probe;
  unsigned long long guard_token; /* registration with the live guard of its device, 0 if none */
  struct gg_arena *live_prev, *live_next; /* the process's live arenas, for reports */
  bool on_live;
  bool ordered_released; /* stream-ordered releases since the last trim: unmapping must wait for the stream */
};

static size_t gg__rsize(size_t req) { return (req + GG__QUANTUM - 1) & ~(GG__QUANTUM - 1); }
static uintptr_t gg__bend(const gg__bent_t *e) { return e->ptr + gg__rsize(e->req); }

/* Grows a dynamic array so it holds at least `need` elements. */
static int gg__grow(void *arr, size_t *cap, size_t need, size_t elem) {
  if (GG__LIKELY(need <= *cap)) return 0;
  size_t n = *cap ? *cap * 2 : 16;
  if (n < need) n = need;
  void *p = realloc(*(void **)arr, n * elem);
  if (!p) return gg__err(GG_ENOMEM, "arena: out of host memory for metadata (%zu entries)", n);
  *(void **)arr = p, *cap = n;
  return 0;
}

/* ---- handles: validation, locking, quarantine ---------------------------------------------------- */

static pthread_mutex_t gg__q_lock = PTHREAD_MUTEX_INITIALIZER;
static gg_arena_t *gg__q[GG__QUARANTINE];
static size_t gg__q_next;

/* A destroyed handle stays allocated (magic cleared) until GG__QUARANTINE later destroys, so a call on
 * it reads valid memory and fails with GG_EINVAL instead of touching freed memory. Older handles are
 * truly freed: a call on them is undefined behaviour, as with any dangling pointer. */
static void gg__quarantine(gg_arena_t *a) {
  pthread_mutex_lock(&gg__q_lock);
  gg_arena_t *old = gg__q[gg__q_next];
  gg__q[gg__q_next] = a;
  gg__q_next = (gg__q_next + 1) % GG__QUARANTINE;
  pthread_mutex_unlock(&gg__q_lock);
  free(old);
}

static int gg__valid(const gg_arena_t *a, const char *call) {
  if (!a) return gg__err(GG_EINVAL, "%s: arena is NULL", call);
  if (a->magic == GG__TORN)
    return gg__err(GG_ESTATE,
                   "%s: arena '%s' was torn down by its guard (its device memory is gone); only "
                   "gg_arena_destroy() is still valid on it",
                   call, a->name);
  if (a->magic != GG__MAGIC)
    return gg__err(GG_EINVAL, "%s: %p is not a live arena (destroyed already, or not an arena)", call,
                   (const void *)a);
  return gg__check_fork(a->fork_gen, call);
}

/* Locks a valid arena, checking again under the lock: a guard's teardown may have run meanwhile. */
static int gg__lock_live(gg_arena_t *a, const char *call) {
  pthread_mutex_lock(&a->lock);
  if (GG__LIKELY(a->magic == GG__MAGIC)) return 0;
  pthread_mutex_unlock(&a->lock);
  return gg__valid(a, call);
}

static int gg__enter(gg_arena_t *a, const char *call) {
  int rc = gg__valid(a, call);
  if (rc == 0) rc = gg__lock_live(a, call);
  return rc;
}

static void gg__leave(gg_arena_t *a) { pthread_mutex_unlock(&a->lock); }

/* ---- the process's live arenas ------------------------------------------------------------------ */

/* Reports list this process's arenas. Lock order: this list's lock, then an arena's lock. */
static pthread_mutex_t gg__live_lock = PTHREAD_MUTEX_INITIALIZER;
static gg_arena_t *gg__live_head;

static void gg__live_add(gg_arena_t *a) {
  pthread_mutex_lock(&gg__live_lock);
  a->live_prev = NULL, a->live_next = gg__live_head;
  if (gg__live_head) gg__live_head->live_prev = a;
  gg__live_head = a, a->on_live = true;
  pthread_mutex_unlock(&gg__live_lock);
}

static void gg__live_remove(gg_arena_t *a) {
  pthread_mutex_lock(&gg__live_lock);
  if (a->on_live) {
    if (a->live_prev) a->live_prev->live_next = a->live_next;
    else gg__live_head = a->live_next;
    if (a->live_next) a->live_next->live_prev = a->live_prev;
    a->on_live = false;
  }
  pthread_mutex_unlock(&gg__live_lock);
}

int gg__arena_foreach_live(int (*fn)(gg_arena_t *arena, void *user), void *user) {
  int rc = 0;
  pthread_mutex_lock(&gg__live_lock);
  for (gg_arena_t *a = gg__live_head; a && rc == 0; a = a->live_next) rc = fn(a, user);
  pthread_mutex_unlock(&gg__live_lock);
  return rc;
}

/* ---- tags ---------------------------------------------------------------------------------------- */

static uint64_t gg__strhash(const char *s, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
  return h;
}

/* Tags are interned: each distinct text is copied once per arena, and a repeat of the last tag (the
 * common case in a loop) costs one compare. */
static int gg__intern(gg_arena_t *a, const char *tag, const char **out) {
  if (!tag || !*tag) return (*out = ""), 0;
  size_t n = strnlen(tag, GG__TAG_MAX);
  if (a->tag_last && n == a->tag_last_len && memcmp(tag, a->tag_last, n) == 0) return (*out = a->tag_last), 0;
  if (a->ntags + 1 > a->captags / 2) {
    size_t cap = a->captags ? a->captags * 2 : 32;
    char **t = calloc(cap, sizeof *t);
    if (!t) return gg__err(GG_ENOMEM, "gg_alloc_ex: out of host memory for tags");
    for (size_t i = 0; i < a->captags; i++) {
      if (!a->tags[i]) continue;
      size_t j = gg__strhash(a->tags[i], strlen(a->tags[i])) & (cap - 1);
      while (t[j]) j = (j + 1) & (cap - 1);
      t[j] = a->tags[i];
    }
    free(a->tags);
    a->tags = t, a->captags = cap;
  }
  size_t j = gg__strhash(tag, n) & (a->captags - 1);
  for (; a->tags[j]; j = (j + 1) & (a->captags - 1))
    if (strlen(a->tags[j]) == n && memcmp(a->tags[j], tag, n) == 0) break;
  if (!a->tags[j]) {
    char *c = malloc(n + 1);
    if (!c) return gg__err(GG_ENOMEM, "gg_alloc_ex: out of host memory for tags");
    memcpy(c, tag, n), c[n] = '\0';
    a->tags[j] = c, a->ntags++;
  }
  a->tag_last = a->tags[j], a->tag_last_len = n;
  return (*out = a->tags[j]), 0;
}

/* ---- accounting ---------------------------------------------------------------------------------- */

static void gg__count_alloc(gg_arena_t *a, size_t n) {
  a->in_use += n, a->n_live++, a->n_allocs++;
  if (a->in_use > a->peak_in_use) a->peak_in_use = a->in_use;
}

static void gg__count_release(gg_arena_t *a, size_t bytes, unsigned long long blocks) {
  a->in_use -= bytes, a->n_live -= blocks, a->n_frees += blocks;
}

static size_t gg__largest_free(const gg_arena_t *a) {
  const gg__blk_t *b = gg__fl_largest(&a->fl);
  size_t l = b ? b->size : 0;
  return a->fl.top && a->fl.top->size > l ? a->fl.top->size : l;
}

static void gg__fill_stats(const gg_arena_t *a, gg_arena_stats_t *s) {
  memset(s, 0, sizeof *s);
  s->bytes_in_use = a->in_use, s->bytes_mapped = a->mapped, s->bytes_reserved = a->capacity;
  s->peak_in_use = a->peak_in_use, s->peak_mapped = a->peak_mapped;
  s->largest_free_block = gg__largest_free(a);
  s->n_live = a->n_live, s->n_allocs = a->n_allocs, s->n_frees = a->n_frees;
  s->n_trims = a->n_trims, s->bytes_trimmed = a->bytes_trimmed;
  s->scope_depth = a->nframes - 1;
  size_t spare = a->mapped - a->in_use;
  s->fragmentation = spare ? 1.0 - (double)s->largest_free_block / (double)spare : 0.0;
  s->bytes_pending = a->pending + (a->bump_bytes - a->bump_live_bytes);
  s->n_chunks = a->nchunks;
  s->n_events = a->probe.events_recorded;
  s->n_stream_waits = a->probe.stream_waits;
}

/* ---- releasing memory and stream batches --------------------------------------------------------- */

/* Released memory: reusable at once without stream tracking or when released in stream order
 * (`ordered`), else once the open batch's event says the work queued before now is done. `rec` is a
 * record to reuse, or NULL (reserved by the caller). */
static void gg__release(gg_arena_t *a, uintptr_t addr, size_t size, void *seg, gg__blk_t *rec, bool ordered) {
  if (!a->track || ordered) {
    gg__fl_put(&a->fl, addr, size, seg, rec);
    return;
  }
  if (!rec) rec = gg__fl_take_rec(&a->fl);
  memset(rec, 0, sizeof *rec);
  rec->addr = addr, rec->size = size, rec->seg = seg, rec->state = GG__BLK_PENDING;
  rec->r = a->open.head, a->open.head = rec;
  a->open.bytes += size, a->open.count++, a->pending += size;
}

/* Records one event for the open batch: the only driver call a batch costs until it is reused. */
static int gg__batch_close(gg_arena_t *a) {
  if (!a->open.count) return 0;
  int rc;
  if (a->cend == a->capclosed && a->chead) {
    memmove(a->closed, a->closed + a->chead, (a->cend - a->chead) * sizeof *a->closed);
    a->cend -= a->chead, a->chead = 0;
  }
  if ((rc = gg__grow(&a->closed, &a->capclosed, a->cend + 1, sizeof *a->closed)) < 0) return rc;
  void *ev;
  if (a->nevs) {
    ev = a->evs[--a->nevs];
  } else {
    if ((rc = gg__grow(&a->evs, &a->capevs, a->nev_made + 1, sizeof *a->evs)) < 0) return rc;
    if ((rc = a->ops->event_create(a->dev, &ev)) < 0) return rc;
    a->nev_made++;
  }
  if ((rc = a->ops->event_record(a->dev, ev, a->stream)) < 0) {
    a->evs[a->nevs++] = ev;
    return rc;
  }
  a->open.ev = ev;
  a->closed[a->cend++] = a->open;
  memset(&a->open, 0, sizeof a->open);
  a->probe.events_recorded++;
  return 0;
}

/* Makes a batch's memory reusable, merging it with its free neighbours. */
static int gg__batch_merge(gg_arena_t *a, gg__batch_t *b) {
  int rc = gg__fl_reserve(&a->fl, b->count);
  if (rc < 0) return rc;
  for (gg__blk_t *r = b->head, *next; r; r = next) {
    next = r->r;
    gg__fl_put(&a->fl, r->addr, r->size, r->seg, r);
  }
  a->pending -= b->bytes;
  if (b->ev) a->evs[a->nevs++] = b->ev;
  memset(b, 0, sizeof *b);
  a->probe.batches_merged++;
  return 0;
}

static void gg__merge_closed(gg_arena_t *a, size_t upto) {
  while (a->chead < upto && gg__batch_merge(a, &a->closed[a->chead]) == 0) a->chead++;
  if (a->chead == a->cend) a->chead = a->cend = 0;
}

/* Non-blocking: merges every closed batch whose work is done. Events complete in stream order, so
 * the newest is asked first (one query settles all), then the oldest ones. */
static void gg__reap(gg_arena_t *a) {
  if (a->chead == a->cend) return;
  gg__err_saved_t saved;
  gg__err_save(&saved);
  a->probe.events_queried++;
  if (a->ops->event_query(a->dev, a->closed[a->cend - 1].ev) == 1) {
    gg__merge_closed(a, a->cend);
  } else {
    while (a->chead + 1 < a->cend) {
      a->probe.events_queried++;
      if (a->ops->event_query(a->dev, a->closed[a->chead].ev) != 1) break;
      size_t before = a->chead;
      gg__merge_closed(a, a->chead + 1);
      if (a->chead == before) break;
    }
  }
  gg__err_restore(&saved);
}

/* When the stream has nothing queued, every release so far is safe to reuse: one stream query settles
 * the open batch and all recorded ones, with no event. Otherwise the open batch gets its event and
 * finished batches are merged. Never blocks; failures only delay reuse. */
static void gg__close_or_settle_idle(gg_arena_t *a) {
  if (a->open.count || a->chead != a->cend) {
    a->probe.stream_queries++;
    if (a->ops->stream_query(a->dev, a->stream) == 1) {
      if (!a->open.count || gg__batch_merge(a, &a->open) == 0) gg__merge_closed(a, a->cend);
      return;
    }
  }
  if (gg__batch_close(a) == 0) gg__reap(a);
}

/* After releases: a batch is closed (its event recorded) once it holds GG__BATCH_MAX releases, or two
 * or more worth max(1/256 of the mapped memory, half a chunk). Large frees thus come back at the
 * addresses they were freed from before later allocations land above them (training-like sequence:
 * peak mapped / peak in use 1.006, against 1.05-1.10 when batches close only as memory runs out),
 * while small and mid-sized frees share an event among 16-1024 of them. Failures only delay reuse. */
static void gg__maybe_close(gg_arena_t *a) {
  if (!a->track) return;
  size_t c = a->open.count, b = a->open.bytes;
  size_t share = a->mapped / 256 > a->chunk_size / 2 ? a->mapped / 256 : a->chunk_size / 2;
  if (c < GG__BATCH_MAX && (c < GG__CLOSE_MIN || b < share)) return;
  gg__err_saved_t saved;
  gg__err_save(&saved);
  gg__close_or_settle_idle(a);
  gg__err_restore(&saved);
}

/* Blocking: waits for the work every pending release waits on, then makes all of it reusable. */
static int gg__settle(gg_arena_t *a) {
  if (!a->track || (a->chead == a->cend && !a->open.count)) return 0;
  int rc = gg__batch_close(a);
  if (rc == 0) {
    a->probe.stream_waits++;
    rc = a->ops->event_sync(a->dev, a->closed[a->cend - 1].ev);
  }
  if (rc < 0) {
    /* No event to wait on, or waiting on it failed: the whole stream covers every batch, open too. */
    gg__err_saved_t first;
    gg__err_save(&first);
    a->probe.stream_waits++;
    if ((rc = a->ops->stream_sync(a->dev, a->stream)) < 0) return rc;
    gg__err_restore(&first);
    if (a->open.count && (rc = gg__batch_merge(a, &a->open)) < 0) return rc;
  }
  gg__merge_closed(a, a->cend);
  return a->chead == a->cend ? 0 : gg__err(GG_ENOMEM, "arena: out of host memory merging released blocks");
}

/* ---- the bump log -------------------------------------------------------------------------------- */

static int gg__bump_reserve(gg_arena_t *a) {
  int rc = gg__grow(&a->bump, &a->capbump, a->nbump + 1, sizeof *a->bump);
  if (rc == 0) rc = gg__grow(&a->runs, &a->capruns, a->nruns + 1, sizeof *a->runs);
  return rc;
}

static uintptr_t gg__bump_push(gg_arena_t *a, size_t n, size_t align, size_t req, const char *tag) {
  gg__blk_t *t = a->fl.top;
  uintptr_t p = gg__align_up(t->addr, align);
  size_t used = (size_t)(p - t->addr) + n;
  if (!a->nbump || a->newrun || gg__bend(&a->bump[a->nbump - 1]) != t->addr) {
    a->runs[a->nruns++] = (gg__brun_t){.first = a->nbump, .seg = t->seg};
    a->newrun = false;
  }
  int d = a->nframes - 1;
  a->bump[a->nbump++] =
      (gg__bent_t){.start = t->addr, .ptr = p, .req = req, .tag = tag, .depth = d, .live = true};
  t->addr += used, t->size -= used, a->fl.bytes -= used;
  a->bump_bytes += used, a->bump_live_bytes += n;
  a->frames[d].bump_live++, a->frames[d].bump_bytes += n;
  return p;
}

/* Releases log entries [k, nbump) one run at a time: O(1 + runs cut), whatever the number of entries.
 * Live entries among them must already be counted as released by the caller. Needs nruns records. */
static void gg__bump_cut(gg_arena_t *a, size_t k, bool ordered) {
  while (a->nbump > k) {
    gg__brun_t *r = &a->runs[a->nruns - 1];
    size_t f = r->first > k ? r->first : k;
    uintptr_t s = a->bump[f].start, e = gg__bend(&a->bump[a->nbump - 1]);
    void *seg = r->seg;
    a->bump_bytes -= e - s;
    a->nbump = f;
    if (f == r->first) a->nruns--;
    gg__release(a, s, e - s, seg, NULL, ordered);
  }
  for (int d = a->nframes - 1; d >= 0 && a->frames[d].bump_first > k; d--) a->frames[d].bump_first = k;
}

/* Cuts freed entries off the end of the log: those freed in stream order are reusable at once, the
 * others join the open batch (a group at a time, so neither kind is released the other's way). */
static void gg__bump_pop_dead(gg_arena_t *a) {
  while (a->nbump && !a->bump[a->nbump - 1].live) {
    bool ordered = a->bump[a->nbump - 1].ordered;
    size_t k = a->nbump;
    while (k && !a->bump[k - 1].live && a->bump[k - 1].ordered == ordered) k--;
    if (gg__fl_reserve(&a->fl, a->nruns + 1) < 0) return;
    gg__bump_cut(a, k, ordered);
  }
}

/* Turns the log into block records: live entries become USED records of their scopes, padding and
 * freed entries are released. O(entries), and each entry is flushed at most once. */
static int gg__bump_flush(gg_arena_t *a) {
  if (!a->nbump) return 0;
  size_t live = 0;
  for (int d = 0; d < a->nframes; d++) live += a->frames[d].bump_live;
  int rc = gg__fl_reserve(&a->fl, live + a->nbump + a->nruns + 1);
  if (rc == 0) rc = gg__amap_reserve(&a->used, live);
  if (rc < 0) return rc;
  for (size_t ri = 0; ri < a->nruns; ri++) {
    void *seg = a->runs[ri].seg;
    size_t last = ri + 1 < a->nruns ? a->runs[ri + 1].first : a->nbump;
    uintptr_t hole = 0;
    size_t holen = 0;
    /* A hole (padding, never handed out, and freed entries) is reusable at once unless it holds an
     * entry freed outside stream order: then it waits for the stream. */
    bool tracked = false;
    for (size_t i = a->runs[ri].first; i < last; i++) {
      gg__bent_t *e = &a->bump[i];
      uintptr_t upto = e->live ? e->ptr : gg__bend(e);
      if (upto > e->start) {
        if (!holen) hole = e->start;
        holen = upto - hole;
      }
      if (!e->live) {
        tracked |= !e->ordered;
        continue;
      }
      if (holen) gg__release(a, hole, holen, seg, NULL, !tracked), holen = 0, tracked = false;
      gg__blk_t *b = gg__fl_take_rec(&a->fl);
      b->addr = e->ptr, b->size = gg__rsize(e->req), b->seg = seg, b->state = GG__BLK_USED;
      b->req = e->req, b->tag = e->tag, b->depth = e->depth;
      gg__frame_t *f = &a->frames[e->depth];
      b->r = f->blocks;
      if (f->blocks) f->blocks->l = b;
      f->blocks = b;
      gg__amap_put(&a->used, b->addr, b);
      a->probe.blocks_visited++;
    }
    if (holen) gg__release(a, hole, holen, seg, NULL, !tracked);
  }
  a->nbump = a->nruns = a->bump_bytes = a->bump_live_bytes = 0;
  for (int d = 0; d < a->nframes; d++)
    a->frames[d].bump_first = 0, a->frames[d].bump_live = 0, a->frames[d].bump_bytes = 0;
  a->probe.bump_flushes++;
  return 0;
}

/* The log entry whose memory holds p, or -1. The last entry is checked first: scoped code frees what
 * it allocated last. */
static long gg__bump_find(const gg_arena_t *a, uintptr_t p) {
  if (!a->nbump || p < a->bump[0].start) return -1;
  const gg__bent_t *last = &a->bump[a->nbump - 1];
  if (p >= gg__bend(last)) return -1;
  if (p >= last->start) return (long)a->nbump - 1;
  size_t lo = 0, hi = a->nbump - 1; /* the last entry with start <= p lies in [lo, hi) */
  while (hi - lo > 1) {
    size_t mid = lo + (hi - lo) / 2;
    if (a->bump[mid].start <= p)
      lo = mid;
    else
      hi = mid;
  }
  return p < gg__bend(&a->bump[lo]) ? (long)lo : -1;
}

/* ---- top, growth ---------------------------------------------------------------------------------- */

/* Makes the largest free block the bump block when it is larger than top: bump allocation (and O(1)
 * scope ends) continue there. The log is flushed first when top moves below it. */
static void gg__promote(gg_arena_t *a) {
  gg__blk_t *b = gg__fl_largest(&a->fl), *t = a->fl.top;
  if (!b || (t && t->size >= b->size)) return;
  if (a->nbump && b->addr < gg__bend(&a->bump[a->nbump - 1])) {
    if (gg__bump_flush(a) < 0) return; /* keeps the old top: only speed is lost */
    if (!(b = gg__fl_largest(&a->fl)) || ((t = a->fl.top) && t->size >= b->size)) return;
  }
  if (gg__fl_reserve(&a->fl, 1) < 0) return;
  gg__fl_set_top(&a->fl, b);
  a->newrun = true;
}

static size_t gg__chunk_index(const gg_arena_t *a, uintptr_t p) { /* first chunk at or above p */
  size_t lo = 0, hi = a->nchunks;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (a->chunks[mid]->ptr < p)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* Where n bytes at alignment al would go in the unmapped gap [gs, ge) (growing the free block that
 * ends at gs, if any); the size to map there, or 0 when they do not fit. */
static size_t gg__gap_fit(const gg_arena_t *a, uintptr_t gs, uintptr_t ge, size_t n, size_t al) {
  if (ge <= gs) return 0;
  const gg__blk_t *t = a->fl.top, *l = (t && t->addr + t->size == gs) ? t : gg__amap_get(&a->fl.by_end, gs);
  uintptr_t start = l ? l->addr : gs, p = gg__align_up(start, al);
  if (p < start || p > ge || ge - p < n) return 0;
  size_t m = p + n > gs ? (size_t)gg__align_up(p + n - gs, a->gran) : a->gran;
  if (m < a->chunk_size) m = a->chunk_size < ge - gs ? a->chunk_size : (size_t)(ge - gs);
  return m;
}

/* Maps a chunk that makes room for n bytes at alignment al. 0; GG_ENOMEM with `why` saying whether
 * the capacity or the device ran out; or the backend's error. */
static int gg__grow_map(gg_arena_t *a, size_t n, size_t al, char *why, size_t whycap) {
  size_t m = 0;
  uintptr_t at = 0;
  if (a->contiguous) {
    const gg__blk_t *t = a->fl.top;
    /* Prefer the gap right above top, so the bump block keeps growing in place. */
    if (t) {
      uintptr_t te = t->addr + t->size;
      size_t i = gg__chunk_index(a, te);
      if (i > 0 && a->chunks[i - 1]->ptr + a->chunks[i - 1]->size == te)
        m = gg__gap_fit(a, te, i < a->nchunks ? a->chunks[i]->ptr : a->base + a->capacity, n, al), at = te;
    }
    for (size_t i = 0; !m && i <= a->nchunks; i++) {
      at = i ? a->chunks[i - 1]->ptr + a->chunks[i - 1]->size : a->base;
      m = gg__gap_fit(a, at, i < a->nchunks ? a->chunks[i]->ptr : a->base + a->capacity, n, al);
    }
    if (!m) return snprintf(why, whycap, "the arena's capacity is exhausted"), GG_ENOMEM;
  } else {
    size_t slack = al > GG__QUANTUM ? al : 0;
    if (n > a->capacity || slack > a->capacity - n)
      return snprintf(why, whycap, "the request exceeds the capacity"), GG_ENOMEM;
    size_t need = (size_t)gg__align_up(n + slack, a->gran);
    m = need > a->chunk_size ? need : a->chunk_size;
    if (m > a->capacity - a->mapped) m = need;
    if (a->mapped > a->capacity || m > a->capacity - a->mapped)
      return snprintf(why, whycap, "the arena's capacity is exhausted"), GG_ENOMEM;
  }
  /* With VMM a large request is mapped as chunk-sized pieces at consecutive addresses: one block to the
   * allocator, but trim can later give back each piece that no live block touches, so a big mapping
   * that small blocks reuse does not stay pinned whole (and a growth finds whole pieces to reuse). */
  size_t piece = a->contiguous && m > a->chunk_size ? a->chunk_size : m;
  size_t pieces = (m + piece - 1) / piece;
  int rc = gg__grow(&a->chunks, &a->capchunks, a->nchunks + pieces, sizeof *a->chunks);
  if (rc == 0) rc = gg__fl_reserve(&a->fl, 2);
  if (rc < 0) return rc;
  gg__chunk_t **made = malloc(pieces * sizeof *made);
  if (!made) return gg__err(GG_ENOMEM, "arena: out of host memory for chunk records");
  size_t done = 0, k = 0;
  for (; k < pieces; k++) {
    size_t sz = m - done < piece ? m - done : piece;
    made[k] = malloc(sizeof **made);
    if (!made[k]) {
      rc = gg__err(GG_ENOMEM, "arena: out of host memory for a chunk record");
      break;
    }
    if ((rc = a->ops->map(a->dev, a->contiguous ? at + done : 0, sz, made[k])) < 0) {
      snprintf(why, whycap, "mapping %zu bytes failed: %s", sz, gg_last_error());
      free(made[k]);
      break;
    }
    done += sz;
  }
  if (rc < 0) { /* undo the pieces already mapped: all or nothing */
    gg__err_saved_t saved;
    gg__err_save(&saved);
    while (k-- > 0) {
      a->ops->unmap(a->dev, made[k]);
      free(made[k]);
    }
    gg__err_restore(&saved);
    free(made);
    return rc;
  }
  size_t i = gg__chunk_index(a, made[0]->ptr);
  memmove(a->chunks + i + pieces, a->chunks + i, (a->nchunks - i) * sizeof *a->chunks);
  for (k = 0; k < pieces; k++) a->chunks[i + k] = made[k];
  a->nchunks += pieces;
  a->mapped += m;
  if (a->mapped > a->peak_mapped) a->peak_mapped = a->mapped;
  gg__fl_put(&a->fl, made[0]->ptr, m, a->contiguous ? NULL : made[0], NULL);
  free(made);
  gg__promote(a);
  return 0;
}

/* ---- allocation ----------------------------------------------------------------------------------- */

static void gg__frame_link(gg_arena_t *a, gg__blk_t *b) {
  gg__frame_t *f = &a->frames[b->depth];
  b->l = NULL, b->r = f->blocks;
  if (f->blocks) f->blocks->l = b;
  f->blocks = b;
}

static void gg__frame_unlink(gg_arena_t *a, gg__blk_t *b) {
  if (b->l)
    b->l->r = b->r;
  else
    a->frames[b->depth].blocks = b->r;
  if (b->r) b->r->l = b->l;
}

/* One attempt without reclaiming or mapping: best fit first (keeps top for large requests), then top. */
static bool gg__try_alloc(gg_arena_t *a, size_t n, size_t al, size_t req, const char *tag, uintptr_t *out) {
  gg__blk_t *b = gg__fl_fit(&a->fl, n, al);
  if (b) {
    uintptr_t p = gg__fl_carve(&a->fl, b, n, al);
    b->state = GG__BLK_USED, b->req = req, b->tag = tag, b->depth = a->nframes - 1;
    gg__frame_link(a, b);
    gg__amap_put(&a->used, p, b);
    *out = p;
    return true;
  }
  gg__blk_t *t = a->fl.top;
  if (t) {
    uintptr_t p = gg__align_up(t->addr, al);
    if (p - t->addr <= t->size && t->size - (p - t->addr) >= n) {
      *out = gg__bump_push(a, n, al, req, tag);
      return true;
    }
  }
  return false;
}

static int gg__prepare(gg_arena_t *a) {
  int rc = gg__fl_reserve(&a->fl, 3);
  if (rc == 0) rc = gg__amap_reserve(&a->used, 1);
  if (rc == 0) rc = gg__bump_reserve(a);
  return rc;
}

/* Non-blocking reclaim before mapping: compacts the bump log, records the open batch, merges what is
 * done. */
static void gg__reclaim(gg_arena_t *a) {
  gg__err_saved_t saved;
  gg__err_save(&saved);
  gg__bump_pop_dead(a);
  if (a->bump_bytes > a->bump_live_bytes) gg__bump_flush(a);
  if (a->track) gg__close_or_settle_idle(a);
  gg__err_restore(&saved);
}

static int gg__trim_locked(gg_arena_t *a, size_t keep);

/* Whether to give wholly free chunks back before mapping n more bytes. Only when the growth would
 * raise peak mapped: free memory in the wrong place is then not kept mapped beside the new mapping,
 * which keeps peak mapped close to peak in use when request sizes vary from step to step. Below the
 * peak the arena keeps what it has (no map/unmap churn; trim() gives it back). The trim may wait for
 * the stream, so it runs only when a free block, or what waits to become free, could hold a whole chunk. */
static bool gg__trim_before_growth(const gg_arena_t *a, size_t n) {
  if (!a->contiguous || a->fl.bytes < 2 * a->chunk_size) return false;
  size_t grow = (size_t)gg__align_up(n, a->gran);
  if (grow < a->chunk_size) grow = a->chunk_size;
  if (a->mapped + grow <= a->peak_mapped) return false;
  const gg__blk_t *b = gg__fl_largest(&a->fl), *t = a->fl.top;
  size_t largest = b ? b->size : 0;
  if (t && t->size > largest) largest = t->size;
  size_t waiting = a->pending + (a->bump_bytes - a->bump_live_bytes); /* free once settled or compacted */
  return largest >= 2 * a->chunk_size || waiting >= 2 * a->chunk_size;
}

static int gg__oom(gg_arena_t *a, size_t req, size_t al, const char *why) {
  gg_arena_stats_t s;
  gg__fill_stats(a, &s);
  return gg__err(GG_ENOMEM,
                 "gg_alloc: cannot allocate %zu bytes (alignment %zu) in arena '%s': %s; in use %zu, mapped "
                 "%zu, pending reuse %zu, capacity %zu, largest free block %zu (fragmentation %.3f)",
                 req, al, a->name, why, s.bytes_in_use, s.bytes_mapped, s.bytes_pending, s.bytes_reserved,
                 s.largest_free_block, s.fragmentation);
}

static int gg__alloc_locked(gg_arena_t *a, size_t n, size_t al, size_t req, const char *tag, uintptr_t *out) {
  char why[400] = "";
  int rc;
  for (int round = 0;; round++) {
    if ((rc = gg__prepare(a)) < 0) return rc;
    if (gg__try_alloc(a, n, al, req, tag, out)) break;
    if (round == 0) { /* memory released earlier may be reusable now */
      gg__reclaim(a);
      gg__promote(a);
      continue;
    }
    if (round == 3) return gg__oom(a, req, al, why[0] ? why : "no block fits");
    if (round == 2) {
      /* Free memory that does not fit: give wholly free chunks back so the request can be mapped. */
      if (!a->fl.bytes || gg__trim_locked(a, 0) < 0) return gg__oom(a, req, al, why);
      why[0] = '\0';
    }
    if (round == 1 && gg__trim_before_growth(a, n)) {
      gg__err_saved_t saved;
      gg__err_save(&saved);
      gg__trim_locked(a, 0); /* a failure only means the growth below maps more */
      gg__err_restore(&saved);
      if (gg__try_alloc(a, n, al, req, tag, out)) break;
    }
    if ((rc = gg__grow_map(a, n, al, why, sizeof why)) == 0) continue;
    if (rc != GG_ENOMEM) return rc;
    /* Out of memory: wait for the stream so every pending release counts, then try again. */
    if (round == 1 && (a->pending || a->bump_bytes > a->bump_live_bytes)) {
      gg__err_saved_t saved;
      gg__err_save(&saved);
      gg__reclaim(a);
      if (gg__settle(a) < 0) {
        size_t l = strlen(why);
        snprintf(why + l, sizeof why - l, " (and waiting for pending releases failed: %s)", gg_last_error());
      }
      gg__err_restore(&saved);
      gg__promote(a);
    }
  }
  gg__count_alloc(a, n);
  return 0;
}

/* ---- public calls --------------------------------------------------------------------------------- */

void gg_arena_options_init(gg_arena_options_t *opts) {
  if (opts) memset(opts, 0, sizeof *opts);
}

static const gg__attach_ops_t gg__arena_attach_ops; /* how a guard tears an attached arena down */

int gg_arena_create(gg_arena_t **arena, const gg_arena_options_t *opts) {
  if (!arena) return gg__err(GG_EINVAL, "gg_arena_create: arena (the out-pointer) is NULL");
  *arena = NULL;
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  if (opts) o = *opts;
  if (o.flags & ~(GG_ARENA_NO_STREAM | GG_ARENA_TRIM_ON_SCOPE_EXIT))
    return gg__err(GG_EINVAL, "gg_arena_create: unknown flags %#x", o.flags);
  if (o.device < 0) return gg__err(GG_EINVAL, "gg_arena_create: device %d is negative", o.device);
  gg_arena_t *a = calloc(1, sizeof *a);
  if (a) a->frames = calloc(16, sizeof *a->frames);
  if (!a || !a->frames) {
    free(a);
    return gg__err(GG_ENOMEM, "gg_arena_create: out of host memory");
  }
  a->capframes = 16, a->nframes = 1;
  int rc = gg__dev_open(o.backend, o.device, &a->dev);
  if (rc < 0) goto fail;
  a->ops = a->dev->ops, a->gran = a->dev->granularity, a->contiguous = a->dev->contiguous;
  size_t g = a->gran, cap = o.capacity ? o.capacity : a->dev->props.total_mem;
  size_t chunk = o.chunk_size ? o.chunk_size : GG__DEFAULT_CHUNK;
  if (cap > SIZE_MAX - g || chunk > SIZE_MAX - g) {
    rc = gg__err(GG_EINVAL, "gg_arena_create: capacity %zu or chunk size %zu overflows when rounded to %zu",
                 cap, chunk, g);
    goto fail;
  }
  a->capacity = (size_t)gg__align_up(cap, g), a->chunk_size = (size_t)gg__align_up(chunk, g);
  if ((rc = a->ops->va_reserve(a->dev, a->capacity, &a->base)) < 0) goto fail;
  a->stream = o.stream, a->flags = o.flags, a->track = !(o.flags & GG_ARENA_NO_STREAM);
  gg__strlcpy(a->name, o.name ? o.name : "arena", sizeof a->name);
  pthread_mutex_init(&a->lock, NULL);
  a->fork_gen = a->dev->fork_gen, a->magic = GG__MAGIC;
  /* A live guard of this device tears the arena down with its other cleanups, LIFO. */
  if ((rc = gg__guard_attach(a->ops->name, o.device, &gg__arena_attach_ops, a, &a->guard_token)) < 0) {
    gg_arena_destroy(a);
    return rc;
  }
  gg__live_add(a);
  *arena = a;
  return 0;
fail:
  gg__dev_close(a->dev);
  free(a->frames), free(a);
  return rc;
}

/* Gives every device resource back: events, chunks, the range, the device. Lock held. */
static int gg__release_device(gg_arena_t *a) {
  int rc = 0;
  /* Live blocks may still be in use by queued work: wait for the stream before unmapping. */
  if (a->track && a->mapped) GG_KEEP_FIRST(rc, a->ops->stream_sync(a->dev, a->stream));
  for (size_t i = a->chead; i < a->cend; i++) a->evs[a->nevs++] = a->closed[i].ev;
  a->chead = a->cend = 0;
  for (size_t i = 0; i < a->nevs; i++) GG_KEEP_FIRST(rc, a->ops->event_destroy(a->dev, a->evs[i]));
  a->nevs = 0;
  for (size_t i = 0; i < a->nchunks; i++) {
    GG_KEEP_FIRST(rc, a->ops->unmap(a->dev, a->chunks[i]));
    free(a->chunks[i]);
  }
  a->nchunks = 0, a->mapped = 0;
  GG_KEEP_FIRST(rc, a->ops->va_release(a->dev, a->base, a->capacity));
  /* A chunk whose unmap failed stays mapped until the process ends (the driver frees everything then;
   * cuMemCreate memory does not go with the context). The error is returned to the caller. */
  gg__dev_close(a->dev);
  a->dev = NULL;
  return rc;
}

/* The guard's teardown step for an attached arena: device memory back now, the handle kept (calls on it
 * fail with GG_ESTATE) until its owner calls gg_arena_destroy(). */
static void gg__arena_guard_teardown(void *obj) {
  gg_arena_t *a = obj;
  pthread_mutex_lock(&a->lock);
  if (a->magic == GG__MAGIC) {
    gg__err_saved_t saved;
    gg__err_save(&saved);
    a->magic = GG__TORN;
    if (gg__release_device(a) < 0)
      fprintf(stderr, "gpuguard: arena '%s': giving its memory back at the guard's teardown: %s\n", a->name,
              gg_last_error());
    gg__err_restore(&saved);
  }
  pthread_mutex_unlock(&a->lock);
}

static const char *gg__arena_attached_name(void *obj) { return ((gg_arena_t *)obj)->name; }
static const char *gg__arena_attached_backend(void *obj) { return ((gg_arena_t *)obj)->ops->name; }
static int gg__arena_attached_foreach(void *obj, gg_block_visitor_t visit, void *user) {
  return gg_arena_foreach_block(obj, visit, user);
}

static const gg__attach_ops_t gg__arena_attach_ops = {"arena", gg__arena_guard_teardown,
                                                      gg__arena_attached_name, gg__arena_attached_backend,
                                                      gg__arena_attached_foreach};

int gg_arena_destroy(gg_arena_t *a) {
  if (!a) return 0;
  int rc = gg__valid(a, "gg_arena_destroy");
  if (rc == GG_ESTATE && a->magic == GG__TORN) rc = 0; /* torn down by its guard: free the handle */
  if (rc < 0) return rc;
  gg__live_remove(a);
  /* Before our lock: PyTorch's plugin calls that are using the arena finish, and no new one starts. */
  gg__plugin_forget(a);
  /* Before our lock: if the guard is tearing this arena down right now, this waits for that step. */
  gg__guard_detach(a->guard_token);
  pthread_mutex_lock(&a->lock);
  if (a->magic == GG__DEAD) { /* a concurrent destroy won */
    pthread_mutex_unlock(&a->lock);
    return gg__err(GG_EINVAL, "gg_arena_destroy: %p is not a live arena (destroyed already)", (void *)a);
  }
  bool torn = a->magic == GG__TORN;
  a->magic = GG__DEAD;
  if (!torn) rc = gg__release_device(a);
  for (size_t i = 0; i < a->captags; i++) free(a->tags[i]);
  free(a->tags), free(a->chunks), free(a->evs), free(a->closed), free(a->bump), free(a->runs),
      free(a->frames);
  gg__fl_free(&a->fl);
  gg__amap_free(&a->used);
  pthread_mutex_unlock(&a->lock);
  pthread_mutex_destroy(&a->lock);
  gg__quarantine(a);
  return rc;
}

int gg_alloc(gg_arena_t *arena, size_t size, void **ptr) { return gg_alloc_ex(arena, size, 0, NULL, ptr); }

int gg_alloc_ex(gg_arena_t *a, size_t size, size_t align, const char *tag, void **ptr) {
  int rc = gg__valid(a, "gg_alloc");
  if (rc < 0) return rc;
  if (!ptr) return gg__err(GG_EINVAL, "gg_alloc: ptr (the out-pointer) is NULL");
  *ptr = NULL;
  if (size == 0) return gg__err(GG_EINVAL, "gg_alloc: size is 0");
  if (align == 0) align = GG__QUANTUM;
  if (align & (align - 1)) return gg__err(GG_EINVAL, "gg_alloc: alignment %zu is not a power of two", align);
  if (align < GG__QUANTUM) align = GG__QUANTUM;
  if (size > SIZE_MAX - align)
    return gg__err(GG_EINVAL, "gg_alloc: size %zu with alignment %zu overflows when rounded", size, align);
  size_t n = gg__rsize(size);
  if ((rc = gg__lock_live(a, "gg_alloc")) < 0) return rc;
  const char *itag = "";
  uintptr_t p = 0;
  if (n > a->capacity)
    rc = gg__oom(a, size, align, "the request exceeds the capacity");
  else if ((rc = gg__intern(a, tag, &itag)) == 0)
    rc = gg__alloc_locked(a, n, align, size, itag, &p);
  gg__leave(a);
  if (rc == 0) *ptr = (void *)p;
  return rc;
}

/* Says why p is not a live block: the message is the whole value of the error path. */
static int gg__bad_free(gg_arena_t *a, uintptr_t p) {
  for (size_t i = 0; i < a->used.cap; i++) {
    const gg__blk_t *b = a->used.slots[i].val;
    if (b && p > b->addr && p < b->addr + b->size)
      return gg__err(GG_EINVAL, "gg_free: %#jx points into the middle of the block at %#jx (%zu bytes)",
                     (uintmax_t)p, (uintmax_t)b->addr, b->req);
  }
  size_t i = gg__chunk_index(a, p + 1);
  if (i > 0 && p < a->chunks[i - 1]->ptr + a->chunks[i - 1]->size)
    return gg__err(GG_EINVAL, "gg_free: %#jx is not a live block of arena '%s' (double free?)", (uintmax_t)p,
                   a->name);
  return gg__err(GG_EINVAL, "gg_free: %#jx was not allocated by arena '%s'", (uintmax_t)p, a->name);
}

/* Frees ptr; `ordered`: released in stream order (the plugin), reusable at once. */
static int gg__free_locked(gg_arena_t *a, void *ptr, bool ordered) {
  int rc = 0;
  uintptr_t p = (uintptr_t)ptr;
  long i = ptr ? gg__bump_find(a, p) : -1;
  if (!ptr) {
    rc = gg__err(GG_EINVAL, "gg_free: ptr is NULL");
  } else if (i >= 0) {
    gg__bent_t *e = &a->bump[i];
    if (p != e->ptr) {
      rc = gg__err(GG_EINVAL, "gg_free: %#jx points into the middle of the block at %#jx (%zu bytes)",
                   (uintmax_t)p, (uintmax_t)e->ptr, e->req);
    } else if (!e->live) {
      rc = gg__err(GG_EINVAL, "gg_free: %#jx was freed already (double free)", (uintmax_t)p);
    } else {
      /* The entry stays in the log as freed; its memory returns when the log is cut or compacted. */
      size_t n = gg__rsize(e->req);
      e->live = false, e->ordered = ordered;
      gg__count_release(a, n, 1);
      a->bump_live_bytes -= n, a->frames[e->depth].bump_live--, a->frames[e->depth].bump_bytes -= n;
      /* LIFO frees leave the log at once: without stream tracking top moves back over them; with it
       * they join the open batch and, once it completes, merge into top the same way. */
      if ((size_t)i == a->nbump - 1) {
        gg__bump_pop_dead(a);
        gg__maybe_close(a);
      }
    }
  } else {
    gg__blk_t *b = gg__amap_del(&a->used, p);
    if (!b) {
      rc = gg__bad_free(a, p);
    } else {
      gg__frame_unlink(a, b);
      gg__count_release(a, b->size, 1);
      rc = gg__fl_reserve(&a->fl, 1); /* merging may need a map slot; the record is b's own */
      if (rc < 0) {                   /* keep the block live: nothing changed */
        gg__frame_link(a, b), gg__amap_put(&a->used, p, b);
        a->in_use += b->size, a->n_live++, a->n_frees--;
      } else {
        gg__release(a, b->addr, b->size, b->seg, b, ordered);
        gg__maybe_close(a);
      }
    }
  }
  return rc;
}

int gg_free(gg_arena_t *a, void *ptr) {
  int rc = gg__enter(a, "gg_free");
  if (rc < 0) return rc;
  rc = gg__free_locked(a, ptr, false);
  gg__leave(a);
  return rc;
}

/* CU_STREAM_LEGACY (0x1) names the same stream as NULL, the legacy default stream. */
static void *gg__norm_stream(void *stream) { return stream == (void *)0x1 ? NULL : stream; }

int gg__arena_free_on(gg_arena_t *a, void *ptr, void *stream, int *synced) {
  *synced = 0;
  int rc = gg__enter(a, "gg_torch_free");
  if (rc < 0) return rc;
  stream = gg__norm_stream(stream);
  /* Stream-ordered, as PyTorch's own allocator: a block freed on the arena's stream is reusable at once
   * by later work on that stream, which the stream runs after the work before the free; an allocation
   * for another stream waits for the arena's stream first (gg__arena_alloc_on). A block freed on
   * another stream waits for that stream here, under the lock (a guard's teardown cannot close the
   * device meanwhile). */
  if (a->track && stream != a->stream) {
    rc = a->ops->stream_sync(a->dev, stream);
    *synced = 1, a->probe.stream_waits++;
  }
  if (rc == 0) {
    a->ordered_released = true;
    rc = gg__free_locked(a, ptr, true);
  }
  gg__leave(a);
  return rc;
}

int gg__arena_alloc_on(gg_arena_t *a, size_t size, void *stream, void **ptr, int *synced) {
  *synced = 0;
  int rc = gg_alloc_ex(a, size, 0, "torch", ptr);
  if (rc < 0 || !a->track || gg__norm_stream(stream) == a->stream) return rc;
  /* For another stream: what the arena's stream still runs may touch a block released onto it. */
  if ((rc = gg__enter(a, "gg_torch_alloc")) == 0) {
    rc = a->ops->stream_sync(a->dev, a->stream);
    a->probe.stream_waits++;
    gg__leave(a);
    *synced = 1;
  }
  if (rc < 0) gg_free(a, *ptr), *ptr = NULL;
  return rc;
}

int gg_scope_begin(gg_arena_t *a, gg_scope_t *scope) {
  if (!scope) return gg__err(GG_EINVAL, "gg_scope_begin: scope is NULL");
  int rc = gg__enter(a, "gg_scope_begin");
  if (rc < 0) return rc;
  if ((rc = gg__grow(&a->frames, &a->capframes, (size_t)a->nframes + 1, sizeof *a->frames)) == 0) {
    a->frames[a->nframes++] = (gg__frame_t){.id = ++a->serial, .bump_first = a->nbump};
    scope->arena = a, scope->id = a->serial;
  }
  gg__leave(a);
  return rc;
}

/* Map slots a scope end may need (merging releases can add one free block each). */
static size_t gg__frame_count(const gg__frame_t *f) {
  size_t n = 0;
  for (const gg__blk_t *b = f->blocks; b; b = b->r) n++;
  return n;
}

int gg_scope_end(gg_scope_t *scope) {
  if (!scope) return gg__err(GG_EINVAL, "gg_scope_end: scope is NULL");
  gg_arena_t *a = scope->arena;
  int rc = gg__enter(a, "gg_scope_end");
  if (rc < 0) return rc;
  int d = a->nframes - 1;
  while (d > 0 && a->frames[d].id != scope->id) d--;
  if (d == 0) {
    rc = gg__err(GG_ESTATE, "gg_scope_end: scope %llu of arena '%s' has ended already", scope->id, a->name);
  } else if (d != a->nframes - 1) {
    rc = gg__err(
        GG_ESTATE,
        "gg_scope_end: scope %llu (depth %d) of arena '%s' cannot end while the scope opened inside it "
        "(depth %d) is open; end scopes in reverse order",
        scope->id, d, a->name, a->nframes - 1);
  } else if ((rc = gg__fl_reserve(&a->fl, a->nruns + 1 + gg__frame_count(&a->frames[d]))) == 0) {
    gg__frame_t *f = &a->frames[d];
    /* Records first (O(blocks)); then the log's tail, whatever its length, in O(runs cut). */
    for (gg__blk_t *b = f->blocks, *next; b; b = next) {
      next = b->r;
      gg__amap_del(&a->used, b->addr);
      gg__count_release(a, b->size, 1);
      gg__release(a, b->addr, b->size, b->seg, b, false);
      a->probe.blocks_visited++;
    }
    gg__count_release(a, f->bump_bytes, f->bump_live);
    a->bump_live_bytes -= f->bump_bytes;
    gg__bump_cut(a, f->bump_first, false);
    a->nframes--;
    gg__maybe_close(a);
    if (a->nframes == 1 && (a->flags & GG_ARENA_TRIM_ON_SCOPE_EXIT)) rc = gg__trim_locked(a, 0);
  }
  gg__leave(a);
  return rc;
}

static int gg__addr_desc(const void *x, const void *y) {
  uintptr_t a = (*(gg__blk_t *const *)x)->addr, b = (*(gg__blk_t *const *)y)->addr;
  return a < b ? 1 : a > b ? -1 : 0;
}

/* Unmaps wholly free chunks, highest first, while more than keep bytes stay mapped. A free block that
 * covers chunks is split around them; a failed unmap leaves the rest as it was. */
static int gg__trim_locked(gg_arena_t *a, size_t keep) {
  int rc;
  if ((rc = gg__bump_flush(a)) < 0 || (rc = gg__settle(a)) < 0) return rc;
  if (!a->nchunks) return 0;
  /* Releases made in stream order (the framework plugin) are free at once but may still be read by
   * work queued before them: memory is unmapped only once the stream has run all of it. */
  if (a->track && a->ordered_released) {
    a->probe.stream_waits++;
    if ((rc = a->ops->stream_sync(a->dev, a->stream)) < 0) return rc;
  }
  a->ordered_released = false;
  size_t nf = a->fl.count + 1;
  gg__blk_t **fs = malloc(nf * sizeof *fs);
  if (!fs || (rc = gg__fl_reserve(&a->fl, a->nchunks + nf + 2)) < 0) {
    free(fs);
    return rc < 0 ? rc : gg__err(GG_ENOMEM, "gg_arena_trim: out of host memory");
  }
  gg__fl_untop(&a->fl);
  nf = gg__fl_list(&a->fl, fs, nf);
  qsort(fs, nf, sizeof *fs, gg__addr_desc);
  size_t returned = 0;
  for (size_t k = 0; k < nf && rc == 0; k++) {
    gg__blk_t *F = fs[k];
    uintptr_t lo = F->addr, hi = F->addr + F->size;
    void *seg = F->seg;
    size_t i0 = gg__chunk_index(a, lo), i1 = i0;
    while (i1 < a->nchunks && a->chunks[i1]->ptr + a->chunks[i1]->size <= hi) i1++;
    bool taken = false;
    for (size_t j = i1; j-- > i0;) {
      gg__chunk_t *c = a->chunks[j];
      if (a->mapped - c->size < keep) continue;
      if (!taken) gg__fl_remove(&a->fl, F), taken = true;
      if ((rc = a->ops->unmap(a->dev, c)) < 0) break;
      if (c->ptr + c->size < hi) gg__fl_put_plain(&a->fl, c->ptr + c->size, hi - (c->ptr + c->size), seg);
      hi = c->ptr;
      memmove(a->chunks + j, a->chunks + j + 1, (a->nchunks - j - 1) * sizeof *a->chunks);
      a->nchunks--, a->mapped -= c->size, returned += c->size;
      free(c);
    }
    if (taken) {
      if (hi > lo) gg__fl_put_plain(&a->fl, lo, hi - lo, seg);
      gg__fl_give_rec(&a->fl, F);
    }
  }
  free(fs);
  if (returned) a->n_trims++, a->bytes_trimmed += returned;
  gg__promote(a);
  return rc;
}

int gg_arena_trim(gg_arena_t *a, size_t keep_bytes) {
  int rc = gg__enter(a, "gg_arena_trim");
  if (rc < 0) return rc;
  rc = gg__trim_locked(a, keep_bytes);
  gg__leave(a);
  return rc;
}

int gg_arena_stats(gg_arena_t *a, gg_arena_stats_t *stats) {
  int rc = gg__enter(a, "gg_arena_stats");
  if (rc < 0) return rc;
  if (!stats) {
    rc = gg__err(GG_EINVAL, "gg_arena_stats: stats is NULL");
  } else {
    /* Memory whose work is done counts as free: one event record and a query, never a wait. */
    gg__err_saved_t saved;
    gg__err_save(&saved);
    if (a->track) gg__close_or_settle_idle(a);
    gg__err_restore(&saved);
    gg__fill_stats(a, stats);
  }
  gg__leave(a);
  return rc;
}

static int gg__info_cmp(const void *x, const void *y) {
  uintptr_t a = (uintptr_t)((const gg_block_info_t *)x)->ptr,
            b = (uintptr_t)((const gg_block_info_t *)y)->ptr;
  return a < b ? -1 : a > b;
}

int gg_arena_foreach_block(gg_arena_t *a, gg_block_visitor_t visit, void *user) {
  int rc = gg__enter(a, "gg_arena_foreach_block");
  if (rc < 0) return rc;
  if (!visit) {
    gg__leave(a);
    return gg__err(GG_EINVAL, "gg_arena_foreach_block: visit is NULL");
  }
  gg_block_info_t *v = malloc((a->n_live ? a->n_live : 1) * sizeof *v);
  size_t n = 0;
  if (!v) {
    rc = gg__err(GG_ENOMEM, "gg_arena_foreach_block: out of host memory for %llu blocks", a->n_live);
  } else {
    for (size_t i = 0; i < a->used.cap; i++) {
      const gg__blk_t *b = a->used.slots[i].val;
      if (b) v[n++] = (gg_block_info_t){(void *)b->addr, b->req, b->tag, b->depth};
    }
    for (size_t i = 0; i < a->nbump; i++) {
      const gg__bent_t *e = &a->bump[i];
      if (e->live) v[n++] = (gg_block_info_t){(void *)e->ptr, e->req, e->tag, e->depth};
    }
    qsort(v, n, sizeof *v, gg__info_cmp);
    for (size_t i = 0; i < n && !visit(&v[i], user); i++) continue;
  }
  free(v);
  gg__leave(a);
  return rc;
}

const char *gg_arena_name(const gg_arena_t *a) {
  return a && (a->magic == GG__MAGIC || a->magic == GG__TORN) ? a->name : NULL;
}

const char *gg_arena_backend(const gg_arena_t *a) {
  return a && (a->magic == GG__MAGIC || a->magic == GG__TORN) ? a->ops->name : NULL;
}

/* ---- copies that prove memory is real ------------------------------------------------------------- */

/* 0 when [p, p+n) lies inside one live block of the arena. */
static int gg__check_range(gg_arena_t *a, const char *call, uintptr_t p, size_t n) {
  if (!p) return gg__err(GG_EINVAL, "%s: device pointer is NULL", call);
  if (p > UINTPTR_MAX - n) return gg__err(GG_EINVAL, "%s: range wraps around", call);
  long i = gg__bump_find(a, p);
  if (i >= 0) {
    const gg__bent_t *e = &a->bump[i];
    if (e->live && p >= e->ptr && p + n <= e->ptr + e->req) return 0;
  } else {
    const gg__blk_t *b = gg__amap_get(&a->used, p);
    for (size_t k = 0; !b && k < a->used.cap; k++) {
      const gg__blk_t *c = a->used.slots[k].val;
      if (c && p >= c->addr && p < c->addr + c->size) b = c;
    }
    if (b && p + n <= b->addr + b->req) return 0;
  }
  return gg__err(GG_EINVAL, "%s: %zu bytes at %#jx do not lie inside one live block of arena '%s'", call, n,
                 (uintmax_t)p, a->name);
}

int gg_arena_copy_to_device(gg_arena_t *a, void *dst, const void *src, size_t n) {
  int rc = gg__enter(a, "gg_arena_copy_to_device");
  if (rc < 0) return rc;
  if (!src && n)
    rc = gg__err(GG_EINVAL, "gg_arena_copy_to_device: src is NULL");
  else
    rc = gg__check_range(a, "gg_arena_copy_to_device", (uintptr_t)dst, n);
  /* The copy runs under the lock: a guard's teardown must not unmap the block while it runs. */
  if (rc == 0 && n) rc = a->ops->copy_to_dev(a->dev, (uintptr_t)dst, src, n);
  gg__leave(a);
  return rc;
}

int gg_arena_copy_from_device(gg_arena_t *a, void *dst, const void *src, size_t n) {
  int rc = gg__enter(a, "gg_arena_copy_from_device");
  if (rc < 0) return rc;
  if (!dst && n)
    rc = gg__err(GG_EINVAL, "gg_arena_copy_from_device: dst is NULL");
  else
    rc = gg__check_range(a, "gg_arena_copy_from_device", (uintptr_t)src, n);
  if (rc == 0 && n) rc = a->ops->copy_from_dev(a->dev, dst, (uintptr_t)src, n);
  gg__leave(a);
  return rc;
}

int gg_arena_memset(gg_arena_t *a, void *dst, int value, size_t n) {
  int rc = gg__enter(a, "gg_arena_memset");
  if (rc < 0) return rc;
  rc = gg__check_range(a, "gg_arena_memset", (uintptr_t)dst, n);
  if (rc == 0 && n) rc = a->ops->set_d8(a->dev, (uintptr_t)dst, (unsigned char)value, n);
  gg__leave(a);
  return rc;
}

/* ---- for tests ------------------------------------------------------------------------------------ */

int gg__arena_probe(gg_arena_t *a, gg__arena_probe_t *out) {
  int rc = gg__enter(a, "gg__arena_probe");
  if (rc < 0) return rc;
  *out = a->probe;
  out->bump_entries = a->nbump, out->free_blocks = a->fl.count, out->chunks = a->nchunks;
  out->top_bytes = a->fl.top ? a->fl.top->size : 0;
  gg__leave(a);
  return 0;
}

enum { GG__R_FREE, GG__R_USED, GG__R_PENDING, GG__R_RUN };
typedef struct gg__reg {
  uintptr_t addr;
  size_t size;
  int kind;
  void *seg;
} gg__reg_t;

static int gg__reg_cmp(const void *x, const void *y) {
  uintptr_t a = ((const gg__reg_t *)x)->addr, b = ((const gg__reg_t *)y)->addr;
  return a < b ? -1 : a > b;
}

static const char *gg__check_locked(gg_arena_t *a, gg__reg_t *r, size_t cap) {
  size_t n = 0, sums[4] = {0}, live = 0, live_bytes = 0;
  const char *w = gg__fl_check(&a->fl);
  if (w) return w;
  gg__blk_t **fs = malloc((a->fl.count + 1) * sizeof *fs);
  if (!fs) return "out of host memory";
  size_t nf = gg__fl_list(&a->fl, fs, a->fl.count);
  for (size_t i = 0; i < nf && n < cap; i++)
    r[n++] = (gg__reg_t){fs[i]->addr, fs[i]->size, GG__R_FREE, fs[i]->seg};
  free(fs);
  if (a->fl.top && a->fl.top->size && n < cap)
    r[n++] = (gg__reg_t){a->fl.top->addr, a->fl.top->size, GG__R_FREE, a->fl.top->seg};
  for (size_t i = 0; i < a->used.cap && n < cap; i++) {
    const gg__blk_t *b = a->used.slots[i].val;
    if (!b) continue;
    if (b->state != GG__BLK_USED || b->addr != a->used.slots[i].key) return "a used record is not USED";
    if (b->size != gg__rsize(b->req)) return "a used record's size does not match its request";
    r[n++] = (gg__reg_t){b->addr, b->size, GG__R_USED, b->seg};
    live++, live_bytes += b->size;
  }
  size_t in_frames = 0;
  for (int d = 0; d < a->nframes; d++)
    for (const gg__blk_t *b = a->frames[d].blocks; b; b = b->r) {
      if (b->depth != d || gg__amap_get(&a->used, b->addr) != b)
        return "a scope lists a block it does not own";
      in_frames++;
    }
  if (in_frames != a->used.n) return "scope lists and the used map disagree";
  size_t pend = 0;
  for (size_t k = a->chead; k <= a->cend; k++) {
    const gg__batch_t *bt = k < a->cend ? &a->closed[k] : &a->open;
    size_t bytes = 0, count = 0;
    for (const gg__blk_t *b = bt->head; b && n < cap; b = b->r, count++) {
      if (b->state != GG__BLK_PENDING) return "a batch holds a record that is not PENDING";
      r[n++] = (gg__reg_t){b->addr, b->size, GG__R_PENDING, b->seg}, bytes += b->size;
    }
    if (bytes != bt->bytes || count != bt->count) return "a batch's totals are wrong";
    pend += bytes;
  }
  if (pend != a->pending) return "pending bytes are wrong";
  size_t run_bytes = 0, bump_live = 0, bump_live_bytes = 0;
  for (size_t ri = 0; ri < a->nruns; ri++) {
    size_t first = a->runs[ri].first, last = ri + 1 < a->nruns ? a->runs[ri + 1].first : a->nbump;
    if (first >= last) return "an empty run in the bump log";
    if (ri && a->bump[first].start < gg__bend(&a->bump[first - 1])) return "the bump log is not sorted";
    for (size_t i = first; i < last; i++) {
      const gg__bent_t *e = &a->bump[i];
      if (i > first && e->start != gg__bend(&a->bump[i - 1])) return "a run of the bump log has a hole";
      if (e->ptr < e->start || e->ptr % GG__QUANTUM) return "a bump entry is misaligned";
      if (e->depth >= a->nframes) return "a bump entry belongs to a scope that ended";
      if (e->live) bump_live++, bump_live_bytes += gg__rsize(e->req);
    }
    uintptr_t s = a->bump[first].start, e = gg__bend(&a->bump[last - 1]);
    if (n < cap) r[n++] = (gg__reg_t){s, e - s, GG__R_RUN, a->runs[ri].seg};
    run_bytes += e - s;
  }
  if (a->nbump && !a->nruns) return "bump entries without runs";
  if (run_bytes != a->bump_bytes || bump_live_bytes != a->bump_live_bytes)
    return "bump byte counts are wrong";
  unsigned long long fl = 0;
  size_t fb = 0;
  for (int d = 0; d < a->nframes; d++) {
    fl += a->frames[d].bump_live, fb += a->frames[d].bump_bytes;
    if (d && a->frames[d].bump_first < a->frames[d - 1].bump_first) return "scope log marks out of order";
    size_t end = d + 1 < a->nframes ? a->frames[d + 1].bump_first : a->nbump;
    for (size_t i = a->frames[d].bump_first; i < end; i++)
      if (a->bump[i].depth != d) return "a bump entry lies in another scope's part of the log";
  }
  if (fl != bump_live || fb != bump_live_bytes) return "scope log counters are wrong";
  if (live + bump_live != a->n_live || live_bytes + bump_live_bytes != a->in_use)
    return "in-use counters are wrong";
  if (n >= cap) return "too many regions";
  qsort(r, n, sizeof *r, gg__reg_cmp);
  size_t total = 0;
  for (size_t i = 0; i < n; i++) {
    total += r[i].size, sums[r[i].kind] += r[i].size;
    if (!r[i].size || r[i].addr % GG__QUANTUM || r[i].size % GG__QUANTUM)
      return "a region is empty or misaligned";
    if (i + 1 < n && r[i].addr + r[i].size > r[i + 1].addr) return "two regions overlap";
    if (i + 1 < n && r[i].kind == GG__R_FREE && r[i + 1].kind == GG__R_FREE && r[i].seg == r[i + 1].seg &&
        r[i].addr + r[i].size == r[i + 1].addr)
      return "two free neighbours were not merged";
    /* Inside mapped memory: one chunk, or (contiguous) a series of adjacent chunks. */
    size_t c = gg__chunk_index(a, r[i].addr + 1);
    if (c == 0) return "a region starts below every chunk";
    const gg__chunk_t *ch = a->chunks[c - 1];
    uintptr_t end = ch->ptr + ch->size;
    if (!a->contiguous && r[i].seg != ch) return "a region's segment is not its chunk";
    while (a->contiguous && end < r[i].addr + r[i].size && c < a->nchunks && a->chunks[c]->ptr == end)
      end += a->chunks[c++]->size;
    if (r[i].addr < ch->ptr || r[i].addr + r[i].size > end) return "a region is not inside mapped memory";
  }
  size_t mapped = 0;
  for (size_t i = 0; i < a->nchunks; i++) {
    mapped += a->chunks[i]->size;
    if (i && a->chunks[i - 1]->ptr + a->chunks[i - 1]->size > a->chunks[i]->ptr) return "chunks overlap";
    if (a->contiguous &&
        (a->chunks[i]->ptr < a->base || a->chunks[i]->ptr + a->chunks[i]->size > a->base + a->capacity))
      return "a chunk lies outside the reservation";
  }
  if (mapped != a->mapped || total != a->mapped) return "regions do not tile mapped memory exactly";
  if (sums[GG__R_FREE] != a->fl.bytes) return "free bytes are wrong";
  if (a->mapped > a->capacity || a->peak_mapped < a->mapped || a->peak_in_use < a->in_use)
    return "peaks are wrong";
  return NULL;
}

int gg__arena_check(gg_arena_t *a) {
  int rc = gg__enter(a, "gg__arena_check");
  if (rc < 0) return rc;
  size_t cap = a->fl.count + 2 + a->used.n + a->nruns + a->open.count + 1;
  for (size_t k = a->chead; k < a->cend; k++) cap += a->closed[k].count;
  gg__reg_t *r = malloc(cap * sizeof *r);
  const char *w = r ? gg__check_locked(a, r, cap) : "out of host memory";
  free(r);
  if (w) rc = gg__err(GG_ESTATE, "arena '%s' is inconsistent: %s", a->name, w);
  gg__leave(a);
  return rc;
}

/* ---- for the allocator plugin's graph arena ------------------------------------------------------- */

int gg__arena_options_of(gg_arena_t *a, gg_arena_options_t *out) {
  int rc = gg__enter(a, "gg__arena_options_of");
  if (rc < 0) return rc;
  gg_arena_options_init(out);
  out->device = a->dev->index, out->backend = a->ops->name, out->capacity = a->capacity;
  out->chunk_size = a->chunk_size, out->stream = a->stream, out->flags = a->flags, out->name = a->name;
  gg__leave(a);
  return 0;
}
