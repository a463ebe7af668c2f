/* plugin_graph.c — the allocator plugin under CUDA stream capture (torch.cuda.graph,
 * torch.compile's "reduce-overhead"): per capture a pool that owns the blocks its graph uses until
 * the graph is destroyed, served from a per-device graph arena made with GG_ARENA_NO_STREAM, so
 * that nothing the plugin does during a capture touches a stream.
 *
 * Every plugin call first asks the backend whether its stream captures (one driver query; a second
 * one for the main arena's tracked stream when the call is for another stream). Then, in one of
 * three modes:
 *  - CAPTURE (the call's stream captures, capture id c): allocations come from pool c's free list
 *    (blocks freed earlier in capture c, best fit) or else from the graph arena; frees go to the
 * owning
 *    pool's free list. A main-arena block freed during capture c is kept by pool c: the graph reads
 * it
 *    at every replay.
 *  - QUIET (the main arena may not touch its stream: the legacy stream while some stream captures,
 * its
 *    tracked stream captures, or a capture this plugin saw is still underway): allocations come
 * from the
 *    graph arena as unowned blocks; frees of main-arena blocks wait on a give-back list.
 *  - NORMAL: the main arena serves the call as always; only frees of blocks held here are looked
 * up. The first block of capture c ties a marker to c's graph (the backend's graph_retain). The
 * driver sets its flag, on a thread of its own, once the graph and its executable instances are
 * destroyed; the next plugin call then gives the pool's freed blocks back. Lock order: a plugin
 * call's hold on the table (plugin_threads.c), then a device's graph lock, then an arena's lock. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "arena/arena_internal.h"
#include "backend/backend.h"
#include "gpuguard/plugin.h"
#include "core/internal.h"
#include "plugin/plugin_graph_internal.h"
#include "plugin/plugin_internal.h"

enum { GG__G_NORMAL, GG__G_CAPTURE, GG__G_QUIET };

typedef struct gg__gpool gg__gpool_t;

/* A block held here: owned by a pool, or unowned (served in QUIET mode, or waiting to go back). */
typedef struct gg__gblk {
  uintptr_t ptr;
  size_t size;
  gg__gpool_t *pool; /* owner, or NULL */
  gg_arena_t *from;  /* the main arena it came from; NULL: the graph arena */
  void *stream;      /* the stream it was freed on, when `streamed` */
  bool freed;        /* PyTorch freed it: it is on its pool's free list or the give-back list */
  bool streamed; /* freed outside a capture: work queued on `stream` before the free may use it */
  struct gg__gblk *next;
} gg__gblk_t;

/* The memory of one capture's graph. */
struct gg__gpool {
  atomic_bool
      dead;  /* set by the backend's thread once the graph is gone; the only field it touches */
  bool gone; /* its death has been handled */
  bool capturing;        /* its capture may still be underway */
  unsigned long long id; /* the capture's id */
  void *stream;          /* the capturing stream (asked whether the capture has ended) */
  size_t nblocks;        /* records it owns */
  unsigned holders;      /* live pools whose graphs use blocks of this one */
  gg__gpool_t **deps;    /* pools this one holds that way */
  size_t ndeps, capdeps;
  gg__gblk_t *free; /* its freed blocks */
  gg__gpool_t *next;
};

/* ptr → record, open addressing with linear probing; key 0 is an empty slot (no block is at 0). */
typedef struct gg__gmap {
  uintptr_t *keys;
  gg__gblk_t **vals;
  size_t cap, n;
} gg__gmap_t;

/* One device's state. Fields read without the lock (the fast path) are atomics, or are written only
 * before `main` is published with release order and read after it is loaded with acquire order. */
typedef struct gg__gdev {
  pthread_mutex_t lock;
  unsigned fork_gen;
  _Atomic(gg_arena_t *) main; /* the main arena the next four fields describe */
  gg__dev_t *dev;    /* our own handle, for capture queries; NULL: captures are not handled */
  void *main_stream; /* the main arena's tracked stream */
  bool main_track;   /* the main arena tracks it (not GG_ARENA_NO_STREAM) */
  bool mismatch;     /* the main arena is on another device than what is held here */
  gg_arena_options_t gopts; /* the graph arena's options, from the main arena's */
  gg_arena_t *garena;       /* the graph arena, made at the first need */
  gg__gmap_t map;
  gg__gpool_t *pools;
  gg__gblk_t *giveback;
  atomic_size_t nrec;        /* records in map */
  atomic_uint ncapturing;    /* pools whose capture may be underway */
  atomic_bool work;          /* the give-back list is not empty */
  atomic_ullong seen_deaths; /* gg__deaths when the pools were last scanned */
  unsigned long long n_captures, n_syncs;
} gg__gdev_t;

static _Atomic(gg__gdev_t *) gg__gdevs[GG_PLUGIN_MAX_DEVICES];
static pthread_mutex_t gg__gdevs_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_ullong
    gg__deaths; /* graphs destroyed, process-wide: a change means "scan the pools" */

/* CU_STREAM_LEGACY (0x1) names the legacy default stream, as NULL does. */
static void *gg__gnorm(void *stream) { return stream == (void *)0x1 ? NULL : stream; }

/* ---- the record map -------------------------------------------------------------------------- */

static size_t gg__gslot(uintptr_t k, size_t cap) {
  uint64_t h = (uint64_t)(k >> 8) * 0x9e3779b97f4a7c15ull; /* blocks are 256-byte aligned */
  return (size_t)(h >> 32) & (cap - 1);
}

static gg__gblk_t *gg__gmap_get(const gg__gmap_t *m, uintptr_t k) {
  if (!m->n) return NULL;
  for (size_t i = gg__gslot(k, m->cap);; i = (i + 1) & (m->cap - 1)) {
    if (m->keys[i] == k) return m->vals[i];
    if (!m->keys[i]) return NULL;
  }
}

static int gg__gmap_put(gg__gmap_t *m, gg__gblk_t *r) {
  if (2 * (m->n + 1) > m->cap) {
    size_t cap = m->cap ? 2 * m->cap : 64;
    uintptr_t *keys = calloc(cap, sizeof *keys);
    gg__gblk_t **vals = calloc(cap, sizeof *vals);
    if (!keys || !vals) {
      free(keys);
      free(vals);
      return gg__err(GG_ENOMEM, "gg_torch_alloc: out of host memory for the graph block map");
    }
    for (size_t i = 0; i < m->cap; i++) {
      if (!m->keys[i]) continue;
      size_t j = gg__gslot(m->keys[i], cap);
      while (keys[j]) j = (j + 1) & (cap - 1);
      keys[j] = m->keys[i];
      vals[j] = m->vals[i];
    }
    free(m->keys);
    free(m->vals);
    m->keys = keys;
    m->vals = vals;
    m->cap = cap;
  }
  size_t i = gg__gslot(r->ptr, m->cap);
  while (m->keys[i]) i = (i + 1) & (m->cap - 1);
  m->keys[i] = r->ptr;
  m->vals[i] = r;
  m->n++;
  return 0;
}

/* Backward-shift deletion: no tombstones, so lookups never slow down. */
static void gg__gmap_del(gg__gmap_t *m, uintptr_t k) {
  size_t mask = m->cap - 1, i = gg__gslot(k, m->cap);
  while (m->keys[i] != k) i = (i + 1) & mask;
  for (size_t j = (i + 1) & mask; m->keys[j]; j = (j + 1) & mask) {
    size_t home = gg__gslot(m->keys[j], m->cap);
    /* j's entry may move into the hole at i when its home is not in (i, j] (cyclically). */
    if ((j > i && (home <= i || home > j)) || (j < i && home <= i && home > j)) {
      m->keys[i] = m->keys[j];
      m->vals[i] = m->vals[j];
      i = j;
    }
  }
  m->keys[i] = 0;
  m->vals[i] = NULL;
  m->n--;
}

/* ---- pools ----------------------------------------------------------------------------------- */

/* The backend calls this on a thread of its own once a pool's graph is gone. It only marks: the
 * pool is freed by a plugin call that has seen the flag, so nothing here may touch the pool after
 * the store. */
static void gg__pool_dead(void *user) {
  atomic_store_explicit(&((gg__gpool_t *)user)->dead, true, memory_order_release);
  atomic_fetch_add_explicit(&gg__deaths, 1, memory_order_release);
}

static bool gg__pool_released(const gg__gpool_t *p) { return p->gone && p->holders == 0; }

/* The pool of capture `id` (whose stream is `stream`), made at its first block. */
static int gg__pool_get(gg__gdev_t *st, unsigned long long id, void *stream, gg__gpool_t **out) {
  for (gg__gpool_t *p = st->pools; p; p = p->next)
    if (p->id == id && !p->gone) {
      *out = p;
      return 0;
    }
  gg__gpool_t *p = calloc(1, sizeof *p);
  if (!p) return gg__err(GG_ENOMEM, "gg_torch_alloc: out of host memory for a graph pool");
  p->id = id;
  p->stream = stream;
  p->capturing = true;
  int rc = st->dev->ops->graph_retain(st->dev, gg__gnorm(stream), gg__pool_dead, p);
  if (rc < 0) {
    free(p); /* the backend promises destroy is never called after a failure */
    return rc;
  }
  p->next = st->pools;
  st->pools = p;
  st->n_captures++;
  atomic_fetch_add(&st->ncapturing, 1);
  *out = p;
  return 0;
}

static void gg__pool_own(gg__gpool_t *p, gg__gblk_t *r) {
  r->pool = p;
  p->nblocks++;
}

/* Pool p's graph uses a block of pool q (an older graph's): q lives at least as long as p. */
static int gg__pool_hold(gg__gpool_t *p, gg__gpool_t *q) {
  for (size_t i = 0; i < p->ndeps; i++)
    if (p->deps[i] == q) return 0;
  if (p->ndeps == p->capdeps) {
    size_t cap = p->capdeps ? 2 * p->capdeps : 4;
    gg__gpool_t **d = realloc(p->deps, cap * sizeof *d);
    if (!d) return gg__err(GG_ENOMEM, "gg_torch_free: out of host memory for a graph pool");
    p->deps = d;
    p->capdeps = cap;
  }
  p->deps[p->ndeps++] = q;
  q->holders++;
  return 0;
}

/* Drops a pool that owns nothing any more and whose graph is gone. */
static void gg__pool_drop_if_done(gg__gdev_t *st, gg__gpool_t *p) {
  if (!gg__pool_released(p) || p->nblocks || p->free) return;
  gg__gpool_t **pp = &st->pools;
  while (*pp != p) pp = &(*pp)->next;
  *pp = p->next;
  if (p->capturing) atomic_fetch_sub(&st->ncapturing, 1);
  free(p->deps);
  free(p);
}

/* Best fit among the blocks freed during the capture (their only users are the graph's own earlier
 * nodes, which the capture orders before any later use). */
static gg__gblk_t *gg__pool_take(gg__gpool_t *p, size_t size) {
  gg__gblk_t **best = NULL;
  for (gg__gblk_t **pp = &p->free; *pp; pp = &(*pp)->next)
    if (!(*pp)->streamed && (*pp)->size >= size && (!best || (*pp)->size < (*best)->size))
      best = pp;
  if (!best) return NULL;
  gg__gblk_t *r = *best;
  *best = r->next;
  r->freed = false;
  r->next = NULL;
  return r;
}

static void gg__giveback_push(gg__gdev_t *st, gg__gblk_t *r) {
  r->freed = true;
  r->next = st->giveback;
  st->giveback = r;
  atomic_store(&st->work, true);
}

/* ---- giving memory back ---------------------------------------------------------------------- */

/* Pools whose graph is gone let go of the pools they held; the freed blocks of released pools join
 * the give-back list (blocks still live go back when PyTorch frees them). */
static void gg__gscan(gg__gdev_t *st) {
  unsigned long long d = atomic_load_explicit(&gg__deaths, memory_order_acquire);
  if (d == atomic_load(&st->seen_deaths)) return;
  atomic_store(&st->seen_deaths,
               d); /* first: a death marked during the scan is seen by the next one */
  for (gg__gpool_t *p = st->pools; p; p = p->next) {
    if (p->gone || !atomic_load_explicit(&p->dead, memory_order_acquire)) continue;
    p->gone = true;
    if (p->capturing) {
      p->capturing = false;
      atomic_fetch_sub(&st->ncapturing, 1);
    }
    for (size_t i = 0; i < p->ndeps; i++) p->deps[i]->holders--;
    p->ndeps = 0;
  }
  for (gg__gpool_t *p = st->pools, *next; p; p = next) {
    next = p->next;
    if (!gg__pool_released(p)) continue;
    for (gg__gblk_t *r = p->free, *rn; r; r = rn) {
      rn = r->next;
      r->pool = NULL;
      p->nblocks--;
      gg__giveback_push(st, r);
    }
    p->free = NULL;
    gg__pool_drop_if_done(st, p);
  }
}

/* What a sweep of the give-back list may do: `main` the registered arena, which may touch its
 * stream in this call when `main_ok` (NORMAL mode); `stream` the stream of the call that sweeps;
 * `any_stream` for the explicit calls (stats, trim), which may wait for any stream of a block freed
 * during a capture. */
typedef struct gg__gsweep {
  gg_arena_t *main;
  bool main_ok;
  void *stream;
  bool any_stream;
} gg__gsweep_t;

/* Gives one block back: 1 when done (or when it is no longer ours to give), 0 to try again later.
 * */
static int gg__give(gg__gdev_t *st, gg__gblk_t *r, const gg__gsweep_t *w) {
  gg_arena_t *main = w->main;
  if (r->from && !w->main_ok) return 0;
  if (r->from && r->from != main)
    return 1; /* its arena was unregistered: the block stays that arena's */
  if (r->streamed) {
    /* A block freed during a capture waits for its stream, which its own thread may be about to
     * capture on again: checking then waiting from another thread's call on another stream lost
     * that race (the wait ended the new capture). Only calls on that stream, or the explicit ones,
     * wait for it. */
    if (!w->any_stream && gg__gnorm(r->stream) != gg__gnorm(w->stream)) return 0;
    unsigned long long id = 0;
    if (st->dev->ops->stream_capture(st->dev, gg__gnorm(r->stream), &id) != 0 || id) return 0;
  }
  if (r->from) {
    /* The main arena's own stream-ordered path: it waits for the stream of the free when that is
     * not its own stream; a block freed during a capture is released onto its own stream (the graph
     * is gone, so no replay uses it any more). */
    int synced = 0, rc = gg__arena_free_on(main, (void *)r->ptr,
                                           r->streamed ? r->stream : st->main_stream, &synced);
    st->n_syncs += (unsigned long long)synced;
    return rc == 0 || rc == GG_EINVAL; /* EINVAL: not a live block of that arena, nothing to give */
  }
  if (r->streamed) {
    st->n_syncs++;
    if (st->dev->ops->stream_sync(st->dev, gg__gnorm(r->stream)) < 0) return 0;
  }
  if (st->garena)
    gg_free(st->garena, (void *)r->ptr); /* fails only for an arena its guard tore down */
  return 1;
}

/* Main-arena blocks of an arena that is no longer registered stay that arena's: 1 to forget them.
 * */
static int gg__stale(gg__gdev_t *st, gg__gblk_t *r, const gg__gsweep_t *w) {
  (void)st;
  return r->from && r->from != w->main;
}

/* Forgets every block of the give-back list for which `done` says 1. Lock held. */
static void gg__giveback_sweep(gg__gdev_t *st,
                               int (*done)(gg__gdev_t *, gg__gblk_t *, const gg__gsweep_t *),
                               const gg__gsweep_t *w) {
  for (gg__gblk_t **pp = &st->giveback; *pp;) {
    gg__gblk_t *r = *pp;
    if (!done(st, r, w)) {
      pp = &r->next;
      continue;
    }
    *pp = r->next;
    gg__gmap_del(&st->map, r->ptr);
    atomic_fetch_sub(&st->nrec, 1);
    free(r);
  }
  atomic_store(&st->work, st->giveback != NULL);
}

/* Scans for dead graphs and gives back what can go back now (`w` says what may be waited for). Lock
 * held. */
static void gg__gmaintain_locked(gg__gdev_t *st, const gg__gsweep_t *w) {
  gg__gscan(st);
  if (!st->giveback) return;
  gg__err_saved_t saved;
  gg__err_save(&saved);
  gg__giveback_sweep(st, gg__give, w);
  gg__err_restore(&saved);
}

static bool gg__gpending(gg__gdev_t *st) {
  return atomic_load_explicit(&st->work, memory_order_relaxed) ||
         atomic_load_explicit(&gg__deaths, memory_order_relaxed) !=
             atomic_load_explicit(&st->seen_deaths, memory_order_relaxed);
}

/* ---- binding a device to its main arena ------------------------------------------------------ */

static bool gg__gempty(const gg__gdev_t *st) { return !st->pools && atomic_load(&st->nrec) == 0; }

/* The registered arena changed (or this is the first call): describe it, and keep our own device
 * handle for the same device. What is held for an earlier arena stays held until it can go back.
 * The graph arena is never destroyed here (this runs under the plugin table's lock, which
 * gg_arena_destroy takes): an empty one only gives its memory back; gg_plugin_trim(device, 0)
 * destroys it. Lock held. */
static void gg__grebind_locked(gg__gdev_t *st, gg_arena_t *main) {
  gg__err_saved_t saved;
  gg__err_save(&saved);
  gg_arena_options_t o;
  bool ok = main && gg__arena_options_of(main, &o) == 0;
  bool same =
      ok && st->dev && st->dev->index == o.device && strcmp(st->dev->ops->name, o.backend) == 0;
  st->mismatch = false;
  if (ok && !same) {
    if (st->dev && (!gg__gempty(st) || st->garena)) {
      st->mismatch =
          true; /* graph memory of another device is still held: captures here are refused */
    } else {
      gg__dev_close(st->dev);
      st->dev = NULL;
      if (gg__dev_open(o.backend, o.device, &st->dev) < 0)
        st->dev = NULL; /* captures then fail as before */
    }
  }
  if (ok) {
    st->main_stream = gg__gnorm(o.stream);
    st->main_track = !(o.flags & GG_ARENA_NO_STREAM);
    st->gopts = o;
    st->gopts.flags = GG_ARENA_NO_STREAM;
    st->gopts.stream = NULL;
    st->gopts.name = "torch-graph";
  } else {
    st->main_stream = NULL;
    st->main_track = false;
    if (!main && st->dev && gg__gempty(st) && !st->garena) {
      gg__dev_close(st->dev);
      st->dev = NULL;
    }
  }
  gg__giveback_sweep(st, gg__stale, &(gg__gsweep_t){.main = main});
  if (st->garena) {
    gg_arena_stats_t s;
    if (gg_arena_stats(st->garena, &s) == 0 && s.n_live == 0) gg_arena_trim(st->garena, 0);
  }
  gg__err_restore(&saved);
  atomic_store_explicit(&st->main, main, memory_order_release);
}

/* The device's state, bound to `main`; NULL when there is none to use (no arena was ever registered
 * for the device, or this is a forked child: the parent's state is not ours). */
static gg__gdev_t *gg__gbind(int device, gg_arena_t *main) {
  gg__gdev_t *st = atomic_load_explicit(&gg__gdevs[device], memory_order_acquire);
  if (GG__LIKELY(st && atomic_load_explicit(&st->main, memory_order_acquire) == main))
    return st->fork_gen == gg__fork_generation() ? st : NULL;
  if (!st) {
    if (!main) return NULL;
    pthread_mutex_lock(&gg__gdevs_lock);
    st = atomic_load(&gg__gdevs[device]);
    if (!st) {
      st = calloc(1, sizeof *st);
      if (st) {
        pthread_mutex_init(&st->lock, NULL);
        st->fork_gen = gg__fork_generation();
        atomic_store(&st->seen_deaths, atomic_load(&gg__deaths));
        atomic_store_explicit(&gg__gdevs[device], st, memory_order_release);
      }
    }
    pthread_mutex_unlock(&gg__gdevs_lock);
    if (!st) return NULL; /* out of host memory: the plugin works as without captures */
  }
  if (st->fork_gen != gg__fork_generation()) return NULL;
  pthread_mutex_lock(&st->lock);
  if (atomic_load(&st->main) != main) gg__grebind_locked(st, main);
  pthread_mutex_unlock(&st->lock);
  return st;
}

/* ---- the mode of a call ---------------------------------------------------------------------- */

/* Whether a capture this plugin saw may still be underway (its stream still captures with its id);
 * pools whose capture has ended stop being asked. */
static bool gg__gcapture_underway(gg__gdev_t *st) {
  bool underway = false;
  pthread_mutex_lock(&st->lock);
  for (gg__gpool_t *p = st->pools; p && !underway; p = p->next) {
    if (!p->capturing) continue;
    unsigned long long id = 0;
    int q = st->dev->ops->stream_capture(st->dev, gg__gnorm(p->stream), &id);
    if (q == 0 && id == p->id)
      underway = true;
    else {
      p->capturing = false;
      atomic_fetch_sub(&st->ncapturing, 1);
    }
  }
  pthread_mutex_unlock(&st->lock);
  return underway;
}

/* CAPTURE (with *id), QUIET or NORMAL; see the file's head. A failed query counts as "not
 * capturing": the call then runs as it did before captures were handled. An announced call
 * (GG_TORCH_ANNOUNCED, no announcement open) is NORMAL unless a capture this plugin saw may still
 * be under way. */
static int gg__gmode(gg__gdev_t *st, void *stream, bool announced, unsigned long long *id) {
  *id = 0;
  if (announced && !atomic_load_explicit(&st->ncapturing, memory_order_relaxed))
    return GG__G_NORMAL;
  stream = gg__gnorm(stream);
  int q = st->dev->ops->stream_capture(st->dev, stream, id);
  if (q == 0 && *id) return GG__G_CAPTURE;
  if (!st->main_track) return GG__G_NORMAL; /* nothing the main arena does then touches a stream */
  if (q == 1) return GG__G_QUIET;
  if (q == 0 && stream != st->main_stream) {
    unsigned long long id2 = 0;
    int q2 = st->dev->ops->stream_capture(st->dev, st->main_stream, &id2);
    if (q2 == 1 || (q2 == 0 && id2)) return GG__G_QUIET;
  }
  if (atomic_load_explicit(&st->ncapturing, memory_order_relaxed) && gg__gcapture_underway(st))
    return GG__G_QUIET;
  return GG__G_NORMAL;
}

/* ---- the two entry points -------------------------------------------------------------------- */

static int gg__galloc(gg__gdev_t *st, size_t size, gg__gpool_t *p, gg__gblk_t **out) {
  int rc = 0;
  if (!st->garena) rc = gg_arena_create(&st->garena, &st->gopts);
  if (rc < 0) return rc;
  gg__gblk_t *r = calloc(1, sizeof *r);
  if (!r) return gg__err(GG_ENOMEM, "gg_torch_alloc: out of host memory for a graph block record");
  void *ptr = NULL;
  rc = gg_alloc_ex(st->garena, size, 0, "torch-graph", &ptr);
  if (rc == 0) {
    r->ptr = (uintptr_t)ptr;
    r->size = size;
    rc = gg__gmap_put(&st->map, r);
    if (rc < 0) gg_free(st->garena, ptr);
  }
  if (rc < 0) {
    free(r);
    return rc;
  }
  atomic_fetch_add(&st->nrec, 1);
  if (p) gg__pool_own(p, r);
  *out = r;
  return 0;
}

int gg__graph_alloc(int device, gg_arena_t *main, size_t size, void *stream, bool announced,
                    void **ptr) {
  gg__gdev_t *st = gg__gbind(device, main);
  if (!st || !main || !st->dev) return 0;
  unsigned long long id;
  int mode = gg__gmode(st, stream, announced, &id);
  if (GG__LIKELY(mode == GG__G_NORMAL)) {
    if (GG__UNLIKELY(gg__gpending(st))) {
      pthread_mutex_lock(&st->lock);
      gg__gmaintain_locked(st, &(gg__gsweep_t){.main = main, .main_ok = true, .stream = stream});
      pthread_mutex_unlock(&st->lock);
    }
    return 0;
  }
  pthread_mutex_lock(&st->lock);
  gg__gmaintain_locked(st, &(gg__gsweep_t){.main = main, .stream = stream});
  gg__gpool_t *p = NULL;
  gg__gblk_t *r = NULL;
  int rc = 0;
  if (st->mismatch)
    rc = gg__err(GG_ESTATE,
                 "gg_torch_alloc: device %d: graph memory of the arena registered before is "
                 "still held on another device; captures are refused until it is given back",
                 device);
  if (rc == 0 && mode == GG__G_CAPTURE) {
    rc = gg__pool_get(st, id, stream, &p);
    if (rc == 0) r = gg__pool_take(p, size);
  }
  if (rc == 0 && !r) rc = gg__galloc(st, size, p, &r);
  if (rc == 0) *ptr = (void *)r->ptr;
  pthread_mutex_unlock(&st->lock);
  return rc < 0 ? rc : 1;
}

/* A free that is ours: lock held. */
static int gg__gfree_locked(gg__gdev_t *st, gg_arena_t *main, int mode, unsigned long long id,
                            void *ptr, size_t size, void *stream) {
  gg__gblk_t *r = gg__gmap_get(&st->map, (uintptr_t)ptr);
  gg__gpool_t *p = NULL;
  int rc = 0;
  if (r && r->freed)
    return gg__err(GG_EINVAL, "gg_torch_free: %p was freed already (double free of a graph block)",
                   ptr);
  if (!r && (mode == GG__G_NORMAL || !main)) return 0;
  if (mode == GG__G_CAPTURE) rc = gg__pool_get(st, id, stream, &p);
  if (rc < 0) return rc;
  if (!r) {
    /* A main-arena block: during a capture the graph uses it, and while a capture forbids stream
     * operations the main arena cannot take it back yet. */
    r = calloc(1, sizeof *r);
    if (!r) return gg__err(GG_ENOMEM, "gg_torch_free: out of host memory");
    r->ptr = (uintptr_t)ptr;
    r->size = size;
    r->from = main;
    rc = gg__gmap_put(&st->map, r);
    if (rc < 0) {
      free(r);
      return rc;
    }
    atomic_fetch_add(&st->nrec, 1);
  }
  if (mode == GG__G_CAPTURE) {
    r->streamed = false;
    if (!r->pool || gg__pool_released(r->pool)) {
      gg__gpool_t *old = r->pool;
      if (old) old->nblocks--;
      gg__pool_own(p, r);
      if (old) gg__pool_drop_if_done(st, old);
    } else if (r->pool != p) {
      rc = gg__pool_hold(p, r->pool);
      if (rc < 0) return rc; /* the block stays live: its pool keeps it */
    }
    r->freed = true;
    r->next = r->pool->free;
    r->pool->free = r;
    return 1;
  }
  r->streamed = true;
  r->stream = stream;
  if (mode == GG__G_QUIET && r->from && gg__gnorm(stream)) {
    /* A main-arena block that must wait for the capture to end, freed on a stream that does not
     * capture: that stream is waited for now (as the main arena would have), so the block needs no
     * stream later, when that stream may be gone. */
    st->n_syncs++;
    if (st->dev->ops->stream_sync(st->dev, gg__gnorm(stream)) == 0) r->streamed = false;
  }
  if (r->pool && !gg__pool_released(r->pool)) {
    r->freed = true;
    r->next = r->pool->free;
    r->pool->free = r; /* its graph still replays into it */
    return 1;
  }
  gg__gpool_t *old = r->pool;
  if (old) {
    old->nblocks--;
    r->pool = NULL;
  }
  gg__giveback_push(st, r);
  if (old) gg__pool_drop_if_done(st, old);
  return 1;
}

int gg__graph_free(int device, gg_arena_t *main, void *ptr, size_t size, void *stream,
                   bool announced) {
  gg__gdev_t *st = gg__gbind(device, main);
  if (!st || !st->dev) return 0;
  unsigned long long id;
  int mode = gg__gmode(st, stream, announced, &id);
  if (GG__LIKELY(mode == GG__G_NORMAL &&
                 atomic_load_explicit(&st->nrec, memory_order_relaxed) == 0)) {
    if (GG__UNLIKELY(gg__gpending(st))) {
      pthread_mutex_lock(&st->lock);
      gg__gmaintain_locked(
          st, &(gg__gsweep_t){.main = main, .main_ok = main != NULL, .stream = stream});
      pthread_mutex_unlock(&st->lock);
    }
    return 0;
  }
  pthread_mutex_lock(&st->lock);
  int rc = gg__gfree_locked(st, main, mode, id, ptr, size, stream);
  gg__gmaintain_locked(
      st, &(gg__gsweep_t){.main = main, .main_ok = mode == GG__G_NORMAL && main, .stream = stream});
  pthread_mutex_unlock(&st->lock);
  return rc;
}

/* ---- public calls ---------------------------------------------------------------------------- */

static gg__gdev_t *gg__gstate(int device, const char *call, int *rc) {
  if (device < 0 || device >= GG_PLUGIN_MAX_DEVICES) {
    *rc = gg__err(GG_EINVAL, "%s: device %d is out of range (0..%d)", call, device,
                  GG_PLUGIN_MAX_DEVICES - 1);
    return NULL;
  }
  *rc = 0;
  gg__gdev_t *st = atomic_load_explicit(&gg__gdevs[device], memory_order_acquire);
  return st && st->fork_gen == gg__fork_generation() ? st : NULL;
}

int gg_plugin_graph_stats(int device, gg_plugin_graph_stats_t *out) {
  if (!out) return gg__err(GG_EINVAL, "gg_plugin_graph_stats: out is NULL");
  int rc;
  gg__gdev_t *st = gg__gstate(device, "gg_plugin_graph_stats", &rc);
  if (rc < 0) return rc;
  memset(out, 0, sizeof *out);
  if (!st) return 0;
  pthread_mutex_lock(&st->lock);
  if (st->dev)
    gg__gmaintain_locked(st, &(gg__gsweep_t){.any_stream = true}); /* graph-arena blocks only */
  for (const gg__gpool_t *p = st->pools; p; p = p->next) out->n_pools++;
  for (size_t i = 0; i < st->map.cap; i++) {
    const gg__gblk_t *r = st->map.vals[i];
    if (!r) continue;
    if (r->pool) {
      out->n_blocks_held++;
      out->bytes_held += r->size;
    } else if (!r->freed)
      out->n_unowned++;
    else
      out->n_deferred++;
  }
  out->n_captures = st->n_captures;
  out->n_stream_waits = st->n_syncs;
  gg_arena_stats_t s;
  if (st->garena && gg_arena_stats(st->garena, &s) == 0) {
    out->bytes_in_use = s.bytes_in_use;
    out->bytes_mapped = s.bytes_mapped;
  }
  pthread_mutex_unlock(&st->lock);
  return 0;
}

int gg_plugin_trim(int device, size_t keep, size_t *released) {
  int rc;
  gg__gdev_t *st = gg__gstate(device, "gg_plugin_trim", &rc);
  if (released) *released = 0;
  if (rc < 0 || !st) return rc;
  gg_arena_t *drop = NULL;
  size_t freed = 0;
  pthread_mutex_lock(&st->lock);
  if (st->dev) gg__gmaintain_locked(st, &(gg__gsweep_t){.any_stream = true});
  if (st->garena) {
    gg_arena_stats_t before, after;
    rc = gg_arena_stats(st->garena, &before);
    if (rc == 0) rc = gg_arena_trim(st->garena, keep);
    if (rc == 0) rc = gg_arena_stats(st->garena, &after);
    if (rc == 0) {
      freed = before.bytes_mapped - after.bytes_mapped;
      /* Nothing held: the reservation goes too (the next capture makes a new graph arena). */
      if (keep == 0 && after.n_live == 0) {
        drop = st->garena;
        st->garena = NULL;
        freed += after.bytes_mapped;
      }
    }
  }
  pthread_mutex_unlock(&st->lock);
  /* Outside our lock: a plugin call holding the table's lock may be waiting for ours, and destroy
   * takes the table's lock. */
  if (drop) GG_KEEP_FIRST(rc, gg_arena_destroy(drop));
  if (released) *released = freed;
  return rc;
}

void gg__graph_fork_prepare(void) {
  pthread_mutex_lock(&gg__gdevs_lock);
  for (int i = 0; i < GG_PLUGIN_MAX_DEVICES; i++) {
    gg__gdev_t *d = atomic_load(&gg__gdevs[i]);
    if (d) pthread_mutex_lock(&d->lock);
  }
}

void gg__graph_fork_release(void) {
  for (int i = GG_PLUGIN_MAX_DEVICES; i-- > 0;) {
    gg__gdev_t *d = atomic_load(&gg__gdevs[i]);
    if (d) pthread_mutex_unlock(&d->lock);
  }
  pthread_mutex_unlock(&gg__gdevs_lock);
}

void gg__graph_fork_reinit(void) {
  for (int i = 0; i < GG_PLUGIN_MAX_DEVICES; i++) {
    gg__gdev_t *d = atomic_load(&gg__gdevs[i]);
    if (d) pthread_mutex_init(&d->lock, NULL);
  }
  pthread_mutex_init(&gg__gdevs_lock, NULL);
}
