/* arena_cache.c — per-thread caches of an arena: each thread keeps, per arena it uses, a few free
 * blocks of the sizes it allocates most, so an alloc+free pair needs no arena lock. Eight threads
 * on one lock cost 13-14 us per pair on an H200 host; a cache's own lock is taken by its thread
 * and, rarely, by an arena-wide operation.
 *
 * A cache holds two kinds of blocks, both records in state GG__BLOCK_CACHED (arena_check.c counts
 * them in the tiling): FREE ones in a ring per size class, each with the stream ticket of its free,
 * and LIVE ones it handed out since it last published (their counters are the cache's deltas).
 * Publishing turns the live ones into ordinary USED records of the outermost scope and moves the
 * deltas into the arena's counters; it happens at every refill, before a locked allocation of the
 * same thread, and whenever the arena looks for a block it does not find (a free on another thread,
 * a copy, foreach).
 *
 * Rules that keep the arena's guarantees:
 *  - scopes: the cache is bypassed while a scope is open (scopes_open, read under the cache's
 * lock), and
 *    gg_scope_begin sets it and then takes every cache's lock: an allocation is linearised before
 * the
 *    scope (an outermost block) or after it (the arena's own path, owned by the scope);
 *  - the stream: a free on a tracking arena takes the arena's cache epoch as its ticket; the block
 * is
 *    handed out again only once the safe epoch passed the ticket: a thread advances the epoch, then
 * finds
 *    the stream idle, or an event it records on it then completes. The epoch and the safe mark are
 * shared
 *    by every cache of the arena (each on its own line, written once per observation, read on the
 *    path): one observation serves all threads, and one thread asks at a time — the driver
 * serialises
 *    stream queries, so a query per thread made eight threads no faster than one;
 *  - lifetime: caches hang in the arena's list (arena lock) and in their thread's list
 * (thread-local);
 *    destroy and teardown detach them under both locks before any device resource goes; a thread
 * that
 *    exits gives its caches back, or leaves them to the arena (orphans) when that cannot be done.
 *
 * Lock order: an arena's lock, then a cache's lock. A thread holding its cache's lock never takes
 * the arena's lock. */
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "arena/arena_cache_impl.h"
#include "arena/arena_base_impl.h"
#include "core/internal.h"

/* This thread's caches, most recently used first. Initial-exec: one pointer of static TLS spares a
 * __tls_get_addr call on every allocation and free. */
static _Thread_local gg__tcache_t *gg__tc_mine __attribute__((tls_model("initial-exec")));
static pthread_key_t gg__tc_key; /* its destructor gives them back when the thread exits */
static pthread_once_t gg__tc_once = PTHREAD_ONCE_INIT;

/* ---- live blocks, by address ----------------------------------------------------------------- */

static void gg__tc_set_nlive(gg__tcache_t *c, size_t n) {
  atomic_store_explicit(&c->n_live, n, memory_order_relaxed);
}

static size_t gg__tc_slot(uintptr_t addr) {
  return (size_t)(((addr >> 8) * 0x9E3779B97F4A7C15ull) >> 57) & (GG__TC_LIVE_SLOTS - 1);
}

/* Writes slot i of the live table and its bit. */
static void gg__tc_live_set(gg__tcache_t *c, size_t i, gg__block_t *b) {
  c->live[i] = b;
  if (b)
    c->live_bits[i / 64] |= 1ull << (i % 64);
  else
    c->live_bits[i / 64] &= ~(1ull << (i % 64));
}

static void gg__tc_live_put(gg__tcache_t *c, gg__block_t *b) {
  /* A full table would make the probe below spin forever: the callers keep it half empty. */
  GG__ASSERT(b->state == GG__BLOCK_CACHED && gg__tc_nlive(c) < GG__TC_LIVE_SLOTS / 2 + 1);
  size_t i = gg__tc_slot(b->addr);
  while (c->live[i]) i = (i + 1) & (GG__TC_LIVE_SLOTS - 1);
  gg__tc_live_set(c, i, b);
  gg__tc_set_nlive(c, gg__tc_nlive(c) + 1);
}

/* Removes and returns the live block at addr, or NULL (backward-shift deletion: no tombstones). */
static gg__block_t *gg__tc_live_take(gg__tcache_t *c, uintptr_t addr) {
  size_t i = gg__tc_slot(addr);
  for (; c->live[i] && c->live[i]->addr != addr; i = (i + 1) & (GG__TC_LIVE_SLOTS - 1)) continue;
  gg__block_t *b = c->live[i];
  if (!b) return NULL;
  GG__ASSERT(b->state == GG__BLOCK_CACHED && gg__tc_nlive(c) > 0);
  gg__tc_live_set(c, i, NULL);
  gg__tc_set_nlive(c, gg__tc_nlive(c) - 1);
  for (size_t j = (i + 1) & (GG__TC_LIVE_SLOTS - 1); c->live[j];
       j = (j + 1) & (GG__TC_LIVE_SLOTS - 1)) {
    size_t home = gg__tc_slot(c->live[j]->addr);
    if (((j - home) & (GG__TC_LIVE_SLOTS - 1)) >= ((j - i) & (GG__TC_LIVE_SLOTS - 1))) {
      gg__tc_live_set(c, i, c->live[j]);
      gg__tc_live_set(c, j, NULL);
      i = j;
    }
  }
  return b;
}

/* For GG__ASSERT_EXPENSIVE, under the cache's lock: the rings hold free_bytes, and the live table
 * holds n_live blocks (its bits say which slots are taken). */
static bool gg__tc_counts_ok(const gg__tcache_t *c) {
  size_t bytes = 0, live = 0;
  for (int i = 0; i < GG__TC_CLASSES; i++) bytes += c->cls[i].n * c->cls[i].size;
  for (size_t w = 0; w < GG__TC_LIVE_SLOTS / 64; w++)
    live += (size_t)__builtin_popcountll(c->live_bits[w]);
  return bytes == c->free_bytes && live == gg__tc_nlive(c);
}

/* ---- size classes and tickets ---------------------------------------------------------------- */

/* Gives class k the size `size` (0: none), keeping the filter. */
static void gg__tc_class_set_size(gg__tcache_t *c, gg__tc_class_t *k, size_t size) {
  if (k->size) c->size_seen[gg__tc_size_hash(k->size)]--;
  if (size) c->size_seen[gg__tc_size_hash(size)]++;
  k->size = size;
}

static gg__tc_class_t *gg__tc_class(gg__tcache_t *c, size_t size) {
  if (!c->size_seen[gg__tc_size_hash(size)]) return NULL;
  for (int i = 0; i < GG__TC_CLASSES; i++)
    if (c->cls[i].size == size) return &c->cls[i];
  return NULL;
}

/* The class of `size`, or an empty slot made its class; NULL when every slot holds blocks. */
static gg__tc_class_t *gg__tc_class_claim(gg__tcache_t *c, size_t size) {
  gg__tc_class_t *k = gg__tc_class(c, size);
  for (int i = 0; !k && i < GG__TC_CLASSES; i++)
    if (!c->cls[i].n) {
      k = &c->cls[i];
      gg__tc_class_set_size(c, k, size);
      k->head = 0;
      k->batch = 0;
    }
  return k;
}

/* Raises the arena's safe mark to `to` (never lowers it). */
static void gg__tc_raise_safe(gg_arena_t *a, uint64_t to) {
  uint64_t cur = atomic_load(&a->tc_safe);
  while (cur < to && !atomic_compare_exchange_weak(&a->tc_safe, &cur, to)) {
  }
}

/* Whether the work queued before the frees of tickets below the arena's epoch is done: the epoch is
 * advanced first (later frees get a later ticket), then this cache's earlier event is asked, then
 * the stream; while it is busy an event is recorded, so a stream that never runs dry still lets
 * blocks come back. One thread asks at a time (another one asking serves this cache too). Never
 * blocks; failures only delay reuse (this thread's error detail is kept). */
int gg__tc_ask_stream(gg_arena_t *a, gg__tcache_t *c) {
  gg__err_quiet_t quiet; /* the detail is copied only if a driver call fails */
  gg__err_quiet_begin(&quiet);
  if (c->event_epoch && a->ops->event_query(a->dev, c->event) == 1) {
    gg__tc_raise_safe(a, c->event_epoch);
    c->event_epoch = 0;
  }
  if (atomic_exchange_explicit(&a->tc_asking, true, memory_order_acquire)) {
    gg__err_quiet_end(&quiet);
    return -1;
  }
  uint64_t cur = atomic_fetch_add(&a->tc_epoch, 1) + 1; /* frees from now on are not covered */
  int idle = a->ops->stream_query(a->dev, a->stream) == 1;
  if (idle) {
    gg__tc_raise_safe(a, cur);
    c->event_epoch = 0;
  } else if (!c->event_epoch && (c->event || a->ops->event_create(a->dev, &c->event) == 0) &&
             a->ops->event_record(a->dev, c->event, a->stream) == 0) {
    c->event_epoch = cur;
    c->events++;
  }
  atomic_store_explicit(&a->tc_asking, false, memory_order_release);
  gg__err_quiet_end(&quiet);
  return idle;
}

/* Waits until no thread is asking the stream: one query, a few hundred nanoseconds, against
 * microseconds for the arena's locked path the caller would take instead. */
static void gg__tc_await_asker(gg_arena_t *a) {
  for (unsigned spins = 0; atomic_load_explicit(&a->tc_asking, memory_order_acquire); spins++)
    if (spins >= 64) sched_yield(); /* the asker may be descheduled: do not burn its core */
}

/* For the oldest free of a class: asks, or awaits the answer of the thread asking (it covers this
 * ticket when the free came before its question), so threads share queries instead of queueing on
 * the driver's lock. A stream found busy is not asked again for GG__TC_BACKOFF allocations of this
 * cache. */
static bool gg__tc_checkpoint(gg_arena_t *a, gg__tcache_t *c, uint64_t ticket) {
  if (c->backoff) {
    c->backoff--;
    return false;
  }
  for (int tries = 0; tries < GG__TC_TRIES; tries++) {
    int asked = gg__tc_ask_stream(a, c);
    if (gg__tc_safe_for(a, ticket)) return true;
    if (asked == 0) {
      c->backoff = GG__TC_BACKOFF;
      return false;
    }
    if (asked < 0) gg__tc_await_asker(a);
    if (gg__tc_safe_for(a, ticket)) return true;
  }
  return false;
}

/* The most free blocks a class of `size` holds. */
static unsigned gg__tc_cap(size_t size) {
  size_t n = GG__TC_CLASS_BYTES / size;
  return n < 2 ? 2 : n > GG__TC_RING ? GG__TC_RING : (unsigned)n;
}

/* The tag the caller asked for, when it is the cache's: the interned text (the tag cut at
 * GG__TAG_MAX bytes), without the arena's lock. Compared byte by byte: tags are short, and strnlen
 * + strncmp cost more than the loop on every tagged allocation. */
static bool gg__tc_tag(const gg__tcache_t *c, const char *tag, const char **out) {
  if (!tag || !*tag) {
    *out = "";
    return true;
  }
  const char *t = c->tag;
  if (!t) return false;
  for (size_t i = 0; i < GG__TAG_MAX; i++) {
    if (tag[i] != t[i]) return false;
    if (!tag[i]) {
      *out = t;
      return true;
    }
  }
  *out = t;
  return true; /* the first GG__TAG_MAX bytes match, and t holds no more */
}

/* ---- finding this thread's cache ------------------------------------------------------------- */

static void gg__tc_thread_exit(void *head);

static void gg__tc_key_init(void) { pthread_key_create(&gg__tc_key, gg__tc_thread_exit); }

static void gg__tc_set_head(gg__tcache_t *head) {
  gg__tc_mine = head;
  pthread_setspecific(gg__tc_key, head);
}

/* Below the first cache of this thread's list: found there, it moves to the front. */
static gg__tcache_t *gg__tc_find_further(const gg_arena_t *a) {
  gg__tcache_t *c = gg__tc_mine;
  for (gg__tcache_t *prev = c; prev && (c = prev->next); prev = c)
    if (c->arena == a && c->arena_id == a->id) {
      prev->next = c->next;
      c->next = gg__tc_mine; /* to the front */
      gg__tc_set_head(c);
      return c;
    }
  return NULL;
}

/* This thread's cache of a, or NULL. Inline: every allocation and free asks, and a thread using one
 * arena finds its cache first. */
static inline __attribute__((always_inline)) gg__tcache_t *gg__tc_find(const gg_arena_t *a) {
  gg__tcache_t *c = gg__tc_mine;
  return GG__LIKELY(c && c->arena == a && c->arena_id == a->id) ? c : gg__tc_find_further(a);
}

/* Frees this thread's caches whose arena let them go (and, with `only`, that one). */
static void gg__tc_sweep(gg__tcache_t *only) {
  gg__tcache_t **pp = &gg__tc_mine;
  while (*pp) {
    gg__tcache_t *c = *pp;
    bool parent =
        c->fork_gen != gg__fork_generation(); /* its arena refuses use here; its lock may be held */
    if ((only && c != only) || (!parent && atomic_load(&c->attached))) {
      pp = &c->next;
      continue;
    }
    *pp = c->next;
    if (!parent) { /* the detaching thread may still be leaving the lock */
      gg__tc_lock(c);
      gg__tc_unlock(c);
    }
    free(c);
  }
  gg__tc_set_head(gg__tc_mine);
}

/* ---- publishing and giving back -------------------------------------------------------------- */

/* Arena and cache locked. Live blocks become USED records of the outermost scope (the cache is
 * bypassed while a scope is open, so that is where they were allocated); the deltas move into the
 * arena's counters. 0 or GG_ENOMEM (nothing changed). */
static int gg__tc_publish(gg_arena_t *a, gg__tcache_t *c) {
  GG__ASSERT(c->arena == a && c->arena_id == a->id); /* a cache publishes into its own arena */
  /* Nothing since the last publish (most locked allocations of a thread whose cache missed): only
   * what a publish does without deltas. */
  if (!c->d_allocs && !c->d_frees && !c->events && !c->peak && !c->d_bytes && !gg__tc_nlive(c)) {
    if (a->in_use > a->peak_in_use) a->peak_in_use = a->in_use;
    atomic_store_explicit(&a->in_use_seen, a->in_use, memory_order_relaxed);
    return 0;
  }
  size_t n_live = gg__tc_nlive(c);
  if (n_live) {
    int rc = gg__addr_map_reserve(&a->used, n_live);
    if (rc < 0) return rc;
    a->n_live += n_live;
    /* The taken slots by their bits: a scan of the table cost ~130 instructions per publish of one.
     * */
    for (size_t w = 0; w < GG__TC_LIVE_SLOTS / 64; w++)
      for (uint64_t bits = c->live_bits[w]; bits; bits &= bits - 1) {
        size_t i = w * 64 + (size_t)__builtin_ctzll(bits);
        gg__block_t *b = c->live[i];
        c->live[i] = NULL;
        GG__ASSERT(b->state == GG__BLOCK_CACHED); /* handed out by this cache, not yet published */
        b->state = GG__BLOCK_USED;
        b->depth = 0;
        gg__frame_link(a, b);
        gg__addr_map_put(&a->used, b->addr, b);
      }
    memset(c->live_bits, 0, sizeof c->live_bits);
    gg__tc_set_nlive(c, 0);
  }
  a->in_use += c->d_bytes;
  a->n_allocs += c->d_allocs;
  a->n_frees += c->d_frees;
  a->probe.cached_allocs += c->d_allocs;
  a->probe.events_recorded += c->events;
  if (c->peak > a->peak_in_use) a->peak_in_use = c->peak;
  if (a->in_use > a->peak_in_use) a->peak_in_use = a->in_use;
  atomic_store_explicit(&a->in_use_seen, a->in_use, memory_order_relaxed);
  c->d_bytes = c->peak = 0;
  c->d_allocs = c->d_frees = c->events = 0;
  return 0;
}

/* Arena and cache locked. The free blocks of one class go back to the arena: reusable at once when
 * their ticket allows it, else into the open batch like any other release. 0 or GG_ENOMEM (nothing
 * changed). */
static int gg__tc_give_back_class(gg_arena_t *a, gg__tcache_t *c, gg__tc_class_t *k) {
  if (!k->n) return 0;
  int rc = gg__freelist_reserve(&a->freelist, k->n);
  if (rc < 0) return rc;
  for (; k->n; k->n--, k->head = (k->head + 1) % GG__TC_RING) {
    gg__tc_entry_t *e = &k->ring[k->head];
    gg__block_t *b = e->rec;
    GG__ASSERT(b->state == GG__BLOCK_CACHED && b->size == k->size && c->free_bytes >= b->size);
    c->free_bytes -= b->size;
    if (e->ordered)
      gg__arena_ordered_note(a, b->addr, b->size); /* unmapped once its work is done */
    gg__arena_release(a, b->addr, b->size, b->seg, b, gg__tc_reusable(a, e));
  }
  k->head = 0;
  return 0;
}

static int gg__tc_give_back_all(gg_arena_t *a, gg__tcache_t *c) {
  int rc = 0;
  for (int i = 0; i < GG__TC_CLASSES; i++)
    GG_KEEP_FIRST(rc, gg__tc_give_back_class(a, c, &c->cls[i]));
  return rc;
}

/* Arena and cache locked, the device still open: the cache's event goes (what it covered goes back
 * to the arena as pending, or was given back already). */
static void gg__tc_drop_event(gg_arena_t *a, gg__tcache_t *c) {
  if (!c->event) return;
  gg__err_quiet_t quiet; /* the detail is copied only if a driver call fails */
  gg__err_quiet_begin(&quiet);
  a->ops->event_destroy(a->dev, c->event);
  gg__err_quiet_end(&quiet);
  c->event = NULL;
  c->event_epoch = 0;
}

static void gg__tc_unlink(gg_arena_t *a, gg__tcache_t *c) {
  if (c->a_prev)
    c->a_prev->a_next = c->a_next;
  else
    a->caches = c->a_next;
  if (c->a_next) c->a_next->a_prev = c->a_prev;
  c->a_prev = c->a_next = NULL;
}

/* Arena locked, cache not. An orphan that publishing and giving back emptied is freed. */
static void gg__tc_drop_if_empty_orphan(gg_arena_t *a, gg__tcache_t *c) {
  if (!c->orphan || gg__tc_nlive(c) || c->free_bytes) return;
  gg__tc_drop_event(a, c);
  gg__tc_unlink(a, c);
  free(c);
}

/* The thread's destructor: each cache goes back to its arena, or to nobody when the arena let it
 * go. */
static void gg__tc_thread_exit(void *head) {
  for (gg__tcache_t *c = head, *next; c; c = next) {
    next = c->next;
    if (c->fork_gen !=
        gg__fork_generation()) { /* its arena belongs to the parent: only the memory goes */
      free(c);
      continue;
    }
    gg__tc_lock(c);
    gg_arena_t *a = atomic_load(&c->attached) ? c->arena : NULL;
    if (a) atomic_fetch_add(&a->calls, 1); /* destroy waits for it before the lock goes */
    gg__tc_unlock(c);
    if (!a) {
      free(c);
      continue;
    }
    pthread_mutex_lock(&a->lock);
    gg__tc_lock(c);
    bool keep = false;
    if (atomic_load(&c->attached)) {
      if (gg__tc_publish(a, c) == 0 && gg__tc_give_back_all(a, c) == 0) {
        gg__tc_drop_event(a, c);
        atomic_store(&c->attached, false);
        gg__tc_unlink(a, c);
      } else {
        c->orphan = keep = true; /* out of host memory: the arena keeps what is left */
      }
      gg__arena_after_release(a);
    }
    gg__tc_unlock(c);
    pthread_mutex_unlock(&a->lock);
    atomic_fetch_sub(&a->calls, 1);
    if (!keep) free(c);
  }
}

/* ---- the calls without the arena's lock ------------------------------------------------------ */

bool gg__tcache_alloc(gg_arena_t *a, size_t size, size_t asked, const char *tag, void **ptr) {
  gg__tcache_t *c = gg__tc_find(a);
  if (!c) return false;
  /* No class of this size: the filter is this thread's own (a detached cache goes on, to be swept).
   * */
  if (!c->size_seen[gg__tc_size_hash(size)] &&
      atomic_load_explicit(&c->attached, memory_order_relaxed))
    return false;
  gg__tc_lock(c);
  bool attached = atomic_load_explicit(&c->attached, memory_order_relaxed), got = false;
  const char *t;
  gg__tc_class_t *k = NULL;
  if (attached && !atomic_load_explicit(&a->scopes_open, memory_order_relaxed) &&
      gg__tc_tag(c, tag, &t))
    k = gg__tc_class(c, size);
  if (k && k->n && gg__tc_nlive(c) < GG__TC_LIVE_SLOTS / 2) {
    gg__tc_entry_t *e = &k->ring[k->head];
    /* The oldest free still waits: while the class is still growing, the arena's path adds blocks
     * (one stream query per ring then covers more pairs); once full, the stream is asked. */
    if (gg__tc_reusable(a, e) ||
        (k->batch >= gg__tc_cap(size) && gg__tc_checkpoint(a, c, e->ticket))) {
      gg__block_t *b = e->rec;
      /* Only this thread's cache of this arena hands the block out, and only a free one. */
      GG__ASSERT(c->arena == a && c->arena_id == a->id && c->fork_gen == a->fork_gen);
      GG__ASSERT(b->state == GG__BLOCK_CACHED && b->size == size && c->free_bytes >= size);
      k->head = (k->head + 1) % GG__TC_RING;
      k->n--;
      c->free_bytes -= size;
      b->req = asked;
      b->tag = t;
      b->depth = 0;
      gg__tc_live_put(c, b);
      c->d_bytes += size;
      c->d_allocs++;
      size_t total = atomic_load_explicit(&a->in_use_seen, memory_order_relaxed) + c->d_bytes;
      if (total > c->peak) c->peak = total;
      *ptr = (void *)b->addr;
      got = true;
      GG__ASSERT_EXPENSIVE(gg__tc_counts_ok(c));
    }
  }
  gg__tc_unlock(c);
  if (!attached) gg__tc_sweep(c);
  return got;
}

bool gg__tcache_free(gg_arena_t *a, void *ptr, bool ordered) {
  gg__tcache_t *c = gg__tc_find(a);
  if (!c || !gg__tc_nlive(c))
    return false; /* handed nothing out: not ours (publishers only lower it) */
  gg__tc_lock(c);
  bool attached = atomic_load_explicit(&c->attached, memory_order_relaxed), done = false;
  gg__block_t *b = NULL;
  if (attached && !atomic_load_explicit(&a->scopes_open, memory_order_relaxed))
    b = gg__tc_live_take(c, (uintptr_t)ptr);
  if (b) {
    gg__tc_class_t *k = gg__tc_class_claim(c, b->size);
    if (k && k->n < GG__TC_RING && c->free_bytes + b->size <= GG__TC_BYTES) {
      uint64_t ticket =
          a->track && !ordered ? atomic_load(&a->tc_epoch) : 0; /* see gg__tc_ask_stream */
      /* Handed out since the last publish (publishing empties the live table). */
      GG__ASSERT(c->d_bytes >= b->size);
      k->ring[(k->head + k->n++) % GG__TC_RING] = (gg__tc_entry_t){b, ticket, ordered};
      c->free_bytes += b->size;
      c->d_bytes -= b->size;
      c->d_frees++;
      done = true;
      GG__ASSERT_EXPENSIVE(gg__tc_counts_ok(c));
    } else {
      gg__tc_live_put(c, b); /* no room: the arena's path publishes it and frees it */
    }
  }
  gg__tc_unlock(c);
  if (!attached) gg__tc_sweep(c);
  return done;
}

/* ---- under the arena's lock: refills
 * --------------------------------------------------------------------
 */

static gg__tcache_t *gg__tc_create(gg_arena_t *a) {
  pthread_once(&gg__tc_once, gg__tc_key_init);
  gg__tc_sweep(NULL);
  gg__tcache_t *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->arena = a;
  c->arena_id = a->id;
  c->fork_gen = a->fork_gen;
  atomic_init(&c->lock, 0);
  atomic_init(&c->attached, true);
  c->a_next = a->caches;
  if (a->caches) a->caches->a_prev = c;
  a->caches = c;
  c->next = gg__tc_mine;
  gg__tc_set_head(c);
  return c;
}

/* Makes room for `want` blocks of `size` within the cache's bounds: the least recently refilled
 * other classes go back. Returns how many fit. */
static size_t gg__tc_room(gg_arena_t *a, gg__tcache_t *c, gg__tc_class_t *k, size_t size,
                          size_t want) {
  while (c->free_bytes + want * size > GG__TC_BYTES) {
    gg__tc_class_t *old = NULL;
    for (int i = 0; i < GG__TC_CLASSES; i++)
      if (&c->cls[i] != k && c->cls[i].n && (!old || c->cls[i].used < old->used)) old = &c->cls[i];
    if (!old || gg__tc_give_back_class(a, c, old) < 0) break;
  }
  size_t fit = c->free_bytes >= GG__TC_BYTES ? 0 : (GG__TC_BYTES - c->free_bytes) / size;
  return want < fit ? want : fit;
}

/* Carves up to `want` blocks of `size` from free memory as it is, in one piece (best fit, else the
 * bump block), halving the count until one fits. Fills recs; returns how many. */
static size_t gg__tc_carve(gg_arena_t *a, size_t size, size_t want, gg__block_t **recs) {
  GG__ASSERT(size % GG__QUANTUM == 0 && want <= GG__TC_RING); /* recs holds a ring's worth */
  gg__freelist_t *fl = &a->freelist;
  if (gg__freelist_reserve(fl, want + 2) < 0) return 0;
  for (; want; want /= 2) {
    size_t n = want * size;
    uintptr_t p;
    void *seg;
    gg__block_t *b = gg__freelist_fit(fl, n, GG__QUANTUM), *t = fl->top;
    if (b) {
      gg__block_t *piece =
          gg__freelist_carve(fl, b, n, GG__QUANTUM); /* the record of the n bytes */
      seg = piece->seg;
      p = piece->addr;
      gg__freelist_give_record(fl, piece);
    } else if (t && t->size >= n) {
      seg = t->seg;
      p = t->addr;
      t->addr += n;
      t->size -= n;
      fl->bytes -= n;
    } else {
      continue;
    }
    for (size_t i = 0; i < want; i++) {
      gg__block_t *r = gg__freelist_take_record(fl);
      memset(r, 0, sizeof *r);
      r->addr = p + i * size;
      r->size = size;
      r->seg = seg;
      r->state = GG__BLOCK_CACHED;
      recs[i] = r;
    }
    return want;
  }
  return 0;
}

int gg__tcache_alloc_locked(gg_arena_t *a, size_t size, size_t asked, size_t align, const char *tag,
                            uintptr_t *ptr) {
  gg__tcache_t *c = gg__tc_find(a);
  bool cacheable = size <= GG__TC_MAX_SIZE && align == GG__QUANTUM && a->n_frames == 1;
  if (!cacheable && (!c || !gg__tc_nlive(c))) return 0; /* nothing of this thread's to publish */
  if (!c) c = gg__tc_create(a);
  if (!c) return 0;
  gg__tc_lock(c);
  int got = 0;
  /* Published first: a locked allocation raises the peak from the arena's own counters. */
  if (gg__tc_publish(a, c) == 0 && cacheable) {
    gg__tc_class_t *k = gg__tc_class(c, size);
    if (!k) { /* a size seen the first time only takes a slot (the least recently used): sizes that
               * do not come back (a random mix) cost no refill, only the arena's path as before */
      for (int i = 0; i < GG__TC_CLASSES; i++)
        if (!k || c->cls[i].n < k->n || (c->cls[i].n == k->n && c->cls[i].used < k->used))
          k = &c->cls[i];
      if (!k->n || gg__tc_give_back_class(a, c, k) == 0) {
        gg__tc_class_set_size(c, k, size);
        k->head = 0;
        k->batch = 0;
        k->used = ++c->clock;
      }
      k = NULL;
    }
    /* A refill never maps: it takes a share of the free memory as it is, so it cannot raise peak
     * mapped by itself (the ladder gives caches back before it grows). */
    size_t share = a->freelist.bytes / GG__TC_SHARE,
           want = (share < GG__TC_CLASS_BYTES ? share : GG__TC_CLASS_BYTES) / size;
    if (k && want > (k->batch ? k->batch : 2)) want = k->batch ? k->batch : 2;
    want = want < 1 ? 1 : want > gg__tc_cap(size) ? gg__tc_cap(size) : want;
    gg__block_t *recs[GG__TC_RING];
    size_t n = 0;
    if (k) {
      size_t ring_room = GG__TC_RING - k->n + 1;
      want = gg__tc_room(a, c, k, size, want < ring_room ? want : ring_room);
      if (want) n = gg__tc_carve(a, size, want, recs);
    }
    if (!n && k)
      k->batch = gg__tc_cap(size); /* no room to grow: the ring asks the stream as it is */
    if (n) {
      GG__ASSERT(k->n + n - 1 <= GG__TC_RING); /* want was bounded by the ring's room */
      k->used = ++c->clock;
      k->batch = (k->batch ? k->batch : 2) * 2;
      if (k->batch > gg__tc_cap(size)) k->batch = gg__tc_cap(size);
      for (size_t i = 1; i < n; i++)
        k->ring[(k->head + k->n++) % GG__TC_RING] = (gg__tc_entry_t){recs[i], 0, false};
      c->free_bytes += (n - 1) * size;
      c->tag = tag;
      recs[0]->req = asked;
      recs[0]->tag = tag;
      gg__tc_live_put(c, recs[0]);
      c->d_bytes += size;
      c->d_allocs++;
      if (a->in_use + c->d_bytes > c->peak) c->peak = a->in_use + c->d_bytes;
      *ptr = recs[0]->addr;
      got = 1;
    }
    GG__ASSERT_EXPENSIVE(gg__tc_counts_ok(c));
  }
  gg__tc_unlock(c);
  return got;
}

/* ---- under the arena's lock: arena-wide operations ------------------------------------------- */

int gg__tcache_publish_all(gg_arena_t *a) {
  int n = 0;
  for (gg__tcache_t *c = a->caches, *next; c; c = next) {
    next = c->a_next;
    gg__tc_lock(c);
    size_t live = gg__tc_nlive(c);
    int rc = gg__tc_publish(a, c);
    gg__tc_unlock(c);
    if (rc < 0) return rc;
    n += (int)live;
    gg__tc_drop_if_empty_orphan(a, c);
  }
  return n;
}

bool gg__tcache_give_back_all(gg_arena_t *a, bool publish) {
  bool any = false;
  for (gg__tcache_t *c = a->caches, *next; c; c = next) {
    next = c->a_next;
    gg__tc_lock(c);
    any |= c->free_bytes != 0;
    /* Asked first: blocks whose work is done go back as free memory, not as pending releases (a
     * large allocation that needs them then fits without a wait, a trim or a growth). */
    if (c->free_bytes && a->track) gg__tc_ask_stream(a, c);
    if (publish || c->orphan) gg__tc_publish(a, c);
    gg__tc_give_back_all(a, c);
    gg__tc_unlock(c);
    gg__tc_drop_if_empty_orphan(a, c);
  }
  if (any) gg__arena_after_release(a);
  return any;
}

void gg__tcache_detach_all(gg_arena_t *a) {
  while (a->caches) {
    gg__tcache_t *c = a->caches;
    gg__tc_lock(c);
    gg__tc_drop_event(a, c);
    gg__tc_unlink(a, c);
    atomic_store(&c->attached, false);
    bool orphan = c->orphan;
    gg__tc_unlock(c);
    if (orphan) free(c); /* its thread is gone; any other is freed by its thread */
  }
}

void gg__tcache_reset_peak(gg_arena_t *a) {
  for (gg__tcache_t *c = a->caches; c; c = c->a_next) {
    gg__tc_lock(c);
    c->peak = a->in_use + c->d_bytes;
    gg__tc_unlock(c);
  }
}
