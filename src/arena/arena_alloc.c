/* arena_alloc.c — one allocation and one free. An allocation climbs a ladder of steps, each tried
 * only when the one before found no room: the free list as it is; what the stream has finished
 * with; trim before growth; growth; waiting for the stream; giving back every free chunk and
 * growing again; and last, out of memory with the arena's figures in the message. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena/arena_bump_internal.h"
#include "arena/arena_base_impl.h"
#include "core/internal.h"

/* ---- tags ------------------------------------------------------------------------------------ */

static uint64_t gg__strhash(const char *s, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
  return h;
}

static int gg__tags_grow(gg_arena_t *a) {
  size_t cap = a->tags_cap ? a->tags_cap * 2 : 32;
  char **t = calloc(cap, sizeof *t);
  if (!t) return gg__err(GG_ENOMEM, "gg_alloc_ex: out of host memory for tags");
  for (size_t i = 0; i < a->tags_cap; i++) {
    if (!a->tags[i]) continue;
    size_t j = gg__strhash(a->tags[i], strlen(a->tags[i])) & (cap - 1);
    while (t[j]) j = (j + 1) & (cap - 1);
    t[j] = a->tags[i];
  }
  free(a->tags);
  a->tags = t;
  a->tags_cap = cap;
  return 0;
}

/* Tags are interned: each distinct text is copied once per arena, and a repeat of the last tag (the
 * common case in a loop) costs one compare. */
static int gg__intern(gg_arena_t *a, const char *tag, const char **out) {
  if (!tag || !*tag) {
    *out = "";
    return 0;
  }
  size_t n = strnlen(tag, GG__TAG_MAX);
  if (tag[n]) n = gg__utf8_whole(tag, n); /* cut: keep whole characters */
  if (a->tag_last && n == a->tag_last_len && memcmp(tag, a->tag_last, n) == 0) {
    *out = a->tag_last;
    return 0;
  }
  if (a->n_tags + 1 > a->tags_cap / 2) {
    int rc = gg__tags_grow(a);
    if (rc < 0) return rc;
  }
  size_t j = gg__strhash(tag, n) & (a->tags_cap - 1);
  for (; a->tags[j]; j = (j + 1) & (a->tags_cap - 1))
    if (strlen(a->tags[j]) == n && memcmp(a->tags[j], tag, n) == 0) break;
  if (!a->tags[j]) {
    char *c = malloc(n + 1);
    if (!c) return gg__err(GG_ENOMEM, "gg_alloc_ex: out of host memory for tags");
    memcpy(c, tag, n);
    c[n] = '\0';
    a->tags[j] = c;
    a->n_tags++;
  }
  a->tag_last = a->tags[j];
  a->tag_last_len = n;
  *out = a->tags[j];
  return 0;
}

void gg__arena_tags_free(gg_arena_t *a) {
  for (size_t i = 0; i < a->tags_cap; i++) free(a->tags[i]);
  free(a->tags);
  a->tags = NULL;
  a->tags_cap = a->n_tags = 0;
}

/* ---- the allocation ladder ------------------------------------------------------------------- */

/* One request on its way down the ladder. */
typedef struct gg__request {
  size_t size;  /* rounded to the quantum */
  size_t align; /* a power of two >= the quantum */
  size_t asked; /* bytes the caller asked for */
  const char *tag;
  uintptr_t ptr; /* the result */
  char why[400]; /* why growing failed, for the out-of-memory message */
} gg__request_t;

/* Record b, just carved from free memory, as a live block of the innermost scope (the frame and map
 * reservations made). */
static void gg__use_block(gg_arena_t *a, gg__block_t *b, size_t asked, const char *tag) {
  GG__ASSERT(b->state != GG__BLOCK_USED);
  b->state = GG__BLOCK_USED;
  b->req = asked;
  b->tag = tag;
  b->depth = a->n_frames - 1;
  gg__frame_link(a, b);
  gg__addr_map_put(gg__used_map(a, b->depth), b->addr, b);
}

/* Without reclaiming or mapping: best fit first (keeps top for large requests), then top. */
static bool gg__take_free(gg_arena_t *a, gg__request_t *q) {
  gg__block_t *b = gg__freelist_fit(&a->freelist, q->size, q->align);
  if (b) {
    b = gg__freelist_carve(&a->freelist, b, q->size, q->align);
    GG__ASSERT((q->align < 2 || b->addr % q->align == 0) && b->size == q->size);
    gg__use_block(a, b, q->asked, q->tag);
    q->ptr = b->addr;
    return true;
  }
  gg__block_t *t = a->freelist.top;
  if (t) {
    uintptr_t p = gg__align_up(t->addr, q->align);
    if (p - t->addr <= t->size && t->size - (p - t->addr) >= q->size) {
      q->ptr = gg__bump_push(a, q->size, q->align, q->asked, q->tag);
      return true;
    }
  }
  return false;
}

/* Step: the free list as it is. Reserves what taking a block needs first, so the take cannot fail
 * half-way. GG__PLACED, GG__NO_ROOM, or an error. */
static int gg__step_free_list(gg_arena_t *a, gg__request_t *q) {
  int rc = gg__freelist_reserve(&a->freelist, 3);
  if (rc == 0) rc = gg__addr_map_reserve(gg__used_map(a, a->n_frames - 1), 1);
  if (rc == 0) rc = gg__bump_reserve(a);
  if (rc == 0) rc = gg__frame_reserve(a, a->n_frames - 1, 1);
  return rc < 0 ? rc : gg__take_free(a, q);
}

/* Compacts the bump log, records the open batch, merges what is done. Never blocks. */
static int gg__reclaim_step(gg_arena_t *a, void *unused) {
  (void)unused;
  gg__bump_pop_dead(a);
  if (gg__bump_dead_bytes(a)) gg__bump_flush(a);
  if (a->track) gg__arena_reclaim_finished_step(a, NULL); /* both callers run this step quietly */
  return 0;
}

/* Step: memory released earlier may be reusable now. */
static int gg__step_reclaim(gg_arena_t *a, gg__request_t *q) {
  gg__arena_quietly(a, gg__reclaim_step, NULL);
  gg__arena_promote(a);
  return gg__step_free_list(a, q);
}

static int gg__trim_idle(gg_arena_t *a, void *unused) {
  (void)unused;
  return gg__arena_trim_idle_locked(a);
}

/* Step: give wholly free chunks back before a growth would raise peak mapped (a failure only means
 * the growth maps more). Never waits for the GPU: a chunk that queued work may still use stays
 * mapped (the growth maps beside it), where waiting for it drained the GPU's queue once a step on
 * training loops whose steps outgrow each other (a Hugging Face GPT-2: 1.22-1.30x PyTorch's step
 * time). GG__PLACED from what the trim settled, or GG__NO_ROOM. */
static int gg__step_trim_before_growth(gg_arena_t *a, gg__request_t *q) {
  if (!gg__arena_trim_before_growth(a, q->size)) return GG__NO_ROOM;
  gg__arena_quietly(a, gg__trim_idle, NULL);
  return gg__take_free(a, q);
}

/* Step: map more. GG__NO_ROOM once mapped (the free list places the request), GG_ENOMEM (q->why
 * says why), or the backend's error. */
static int gg__step_grow(gg_arena_t *a, gg__request_t *q) {
  return gg__arena_grow(a, q->size, q->align, q->why, sizeof q->why);
}

static int gg__reclaim_and_wait(gg_arena_t *a, void *ctx) {
  gg__request_t *q = ctx;
  gg__reclaim_step(a, NULL);
  int rc = gg__arena_wait_pending(a);
  if (rc < 0) {
    size_t l = strlen(q->why);
    snprintf(q->why + l, sizeof q->why - l, " (and waiting for pending releases failed: %s)",
             gg_last_error());
  }
  return rc;
}

/* Step, after a growth found no memory: wait for the stream so every pending release counts. */
static void gg__step_wait_for_stream(gg_arena_t *a, gg__request_t *q) {
  gg__tcache_give_back_all(a, false); /* what threads' caches hold counts too */
  if (!a->pending && !gg__bump_dead_bytes(a)) return;
  gg__arena_quietly(a, gg__reclaim_and_wait, q);
  gg__arena_promote(a);
}

/* Last step: the arena's figures say why nothing fits. */
static int gg__step_out_of_memory(gg_arena_t *a, const gg__request_t *q, const char *why) {
  gg_arena_stats_t s;
  gg__arena_fill_stats(a, &s);
  return gg__err(
      GG_ENOMEM,
      "gg_alloc: cannot allocate %zu bytes (alignment %zu) in arena '%s': %s; in use %zu, mapped "
      "%zu, pending reuse %zu, capacity %zu, largest free block %zu (fragmentation %.3f)",
      q->asked, q->align, a->name, why, s.bytes_in_use, s.bytes_mapped, s.bytes_pending,
      s.bytes_reserved, s.largest_free_block, s.fragmentation);
}

/* Step: free memory that does not fit. Every wholly free chunk goes back, so that growing again can
 * place the request where free chunks were. False when there is nothing to give back or giving it
 * back failed. */
static bool gg__step_give_back_free_chunks(gg_arena_t *a, gg__request_t *q) {
  if (!a->freelist.bytes || gg__arena_trim_locked(a, 0) < 0) return false;
  q->why[0] = '\0';
  return true;
}

/* Step: free blocks threads' caches hold go back before anything is mapped for a large request. A
 * request a cache could serve maps one chunk at most instead: giving back every thread's cache to
 * find a few KiB sent sixteen threads on an H200 host back to the arena's lock for their refills,
 * over and over (their rate fell below one thread's). Caches still go back before an out-of-memory
 * error (the ladder's wait step), at a scope's start and on a trim. */
static int gg__step_give_back_cached(gg_arena_t *a, gg__request_t *q, bool any_size) {
  if (!any_size && q->size <= GG__TC_MAX_SIZE) return GG__NO_ROOM;
  return gg__tcache_give_back_all(a, false) ? gg__step_free_list(a, q) : 0;
}

/* The ladder, in the order tried. GG__PLACED, or an error (never GG__NO_ROOM). */
static int gg__climb(gg_arena_t *a, gg__request_t *q) {
  int rc;
  rc = gg__step_free_list(a, q);
  if (rc != GG__NO_ROOM) return rc;
  rc = gg__step_reclaim(a, q);
  if (rc != GG__NO_ROOM) return rc;
  rc = gg__step_give_back_cached(a, q, false);
  if (rc != GG__NO_ROOM) return rc;
  rc = gg__step_trim_before_growth(a, q);
  if (rc != GG__NO_ROOM) return rc;
  rc = gg__step_grow(a, q);
  if (rc == GG_ENOMEM) {
    /* No room to grow: what the caches hold is tried before any wait for the stream (a wait on a
     * stream that is being captured would end the capture). */
    rc = gg__step_give_back_cached(a, q, true);
    if (rc != GG__NO_ROOM) return rc;
    gg__step_wait_for_stream(a, q);
  } else if (rc < 0) {
    return rc;
  }
  rc = gg__step_free_list(a, q);
  if (rc != GG__NO_ROOM) return rc;
  if (!gg__step_give_back_free_chunks(a, q)) return gg__step_out_of_memory(a, q, q->why);
  rc = gg__step_grow(a, q);
  if (rc < 0 && rc != GG_ENOMEM) return rc;
  rc = gg__step_free_list(a, q);
  if (rc != GG__NO_ROOM) return rc;
  return gg__step_out_of_memory(a, q, q->why[0] ? q->why : "no block fits");
}

/* ---- public calls ---------------------------------------------------------------------------- */

static int gg__alloc_locked(gg_arena_t *a, size_t rounded, size_t align, size_t size,
                            const char *tag, void **ptr, void *caller);

/* caller: the return address of the public call, where a recorded site starts (GG_ARENA_BACKTRACE).
 * */
static int gg__alloc(gg_arena_t *a, size_t size, size_t align, const char *tag, void **ptr,
                     void *caller) {
  int rc = gg__arena_valid(a, "gg_alloc");
  if (rc < 0) return rc;
  if (!ptr) return gg__err(GG_EINVAL, "gg_alloc: ptr (the out-pointer) is NULL");
  *ptr = NULL;
  if (size == 0) return gg__err(GG_EINVAL, "gg_alloc: size is 0");
  if (align == 0) align = GG__QUANTUM;
  if (align & (align - 1))
    return gg__err(GG_EINVAL, "gg_alloc: alignment %zu is not a power of two", align);
  if (align < GG__QUANTUM) align = GG__QUANTUM;
  if (size > SIZE_MAX - align)
    return gg__err(GG_EINVAL, "gg_alloc: size %zu with alignment %zu overflows when rounded", size,
                   align);
  /* First this thread's cache, without the arena's lock (not when sites are recorded: each needs
   * its own). */
  size_t rounded = gg__rounded_size(size);
  if (align == GG__QUANTUM && rounded <= GG__TC_MAX_SIZE && !gg__arena_records_sites(a) &&
      gg__tcache_alloc(a, rounded, size, tag, ptr))
    return 0;
  return gg__alloc_locked(a, rounded, align, size, tag, ptr, caller);
}

/* The arena's own path for one allocation. */
static int gg__alloc_locked(gg_arena_t *a, size_t rounded, size_t align, size_t size,
                            const char *tag, void **ptr, void *caller) {
  gg__request_t q; /* not zeroed as a whole: `why` alone is 400 bytes, ~40 ns on every call */
  q.size = rounded;
  q.align = align;
  q.asked = size;
  q.tag = NULL;
  q.ptr = 0;
  q.why[0] = '\0';
  bool sites = gg__arena_records_sites(a);
  int rc;
  rc = gg__arena_lock_counted(a, "gg_alloc");
  if (rc < 0) return rc;
  if (a->track) gg__arena_before_alloc(a);
  int step = GG__NO_ROOM;
  if (q.size > a->capacity) {
    step = gg__step_out_of_memory(a, &q, "the request exceeds the capacity");
  } else {
    rc = gg__intern(a, tag, &q.tag);
    if (rc < 0) step = rc;
  }
  /* This thread's cache (not when sites are recorded: each needs a block of its own); PLACED there
   * is counted by the cache itself. */
  if (step == GG__NO_ROOM && !sites)
    step = gg__tcache_alloc_locked(a, q.size, size, align, q.tag, &q.ptr);
  if (step == GG__NO_ROOM) {
    step = gg__climb(a, &q);
    GG__ASSERT(step != GG__NO_ROOM); /* the ladder ends placed or out of memory */
    GG__ASSERT(step != GG__PLACED || (q.ptr && q.ptr % q.align == 0)); /* aligned as asked */
    if (step == GG__PLACED) gg__arena_count_alloc(a, q.size);
    if (step == GG__PLACED && GG__UNLIKELY(sites)) gg__site_note(a, q.ptr, caller);
  }
  rc = step < 0 ? step : 0;
  if (rc == 0) a->placed_open = a->open.count ? q.ptr : 0;
  gg__arena_leave(a);
  if (rc == 0) *ptr = (void *)q.ptr;
  return rc;
}

int gg_alloc(gg_arena_t *arena, size_t size, void **ptr) {
  return gg__alloc(arena, size, 0, NULL, ptr, __builtin_return_address(0));
}

int gg_alloc_ex(gg_arena_t *a, size_t size, size_t align, const char *tag, void **ptr) {
  return gg__alloc(a, size, align, tag, ptr, __builtin_return_address(0));
}

/* ---- a given range -------------------------------------------------------------------------- */

/* Whether [p, end) lies inside mapped chunks (aliases of moved chunks are not the arena's memory).
 */
static bool gg__range_mapped(const gg_arena_t *a, uintptr_t p, uintptr_t end) {
  size_t i = gg__chunk_index(a, p + 1);
  if (i > 0) i--; /* the chunk holding p starts at or below it */
  for (; i < a->n_chunks && p < end; i++) {
    const gg__chunk_t *c = a->chunks[i];
    if (c->alias) continue;
    if (c->ptr > p) return false;
    if (c->ptr + c->size > p) p = c->ptr + c->size;
  }
  return p >= end;
}

/* The listed free block holding [p, end), or NULL. Top is listed first, the bump log flushed, so
 * every free byte is in the lists. O(free blocks). */
static int gg__free_block_holding(gg_arena_t *a, uintptr_t p, uintptr_t end, gg__block_t **out) {
  *out = NULL;
  int rc = gg__bump_flush(a);
  if (rc == 0) rc = gg__freelist_reserve(&a->freelist, 3);
  if (rc < 0) return rc;
  if (a->freelist.top) {
    gg__freelist_drop_top(&a->freelist);
    a->bump_new_run = true;
  }
  size_t n = a->freelist.count;
  gg__block_t **all = malloc((n ? n : 1) * sizeof *all);
  if (!all) return gg__err(GG_ENOMEM, "gg_alloc_at: out of host memory");
  n = gg__freelist_list(&a->freelist, all, n);
  for (size_t i = 0; i < n && !*out; i++)
    if (all[i]->addr <= p && all[i]->addr + all[i]->size >= end) *out = all[i];
  free(all);
  return 0;
}

static int gg__alloc_at_locked(gg_arena_t *a, uintptr_t p, size_t n, size_t asked) {
  gg__tcache_give_back_all(a, true); /* what threads' caches hold free is the arena's again */
  gg__arena_quietly(a, gg__reclaim_step, NULL);
  gg__block_t *b = NULL;
  int rc = gg__free_block_holding(a, p, p + n, &b);
  if (rc == 0) rc = gg__addr_map_reserve(gg__used_map(a, a->n_frames - 1), 1);
  if (rc == 0) rc = gg__frame_reserve(a, a->n_frames - 1, 1);
  if (rc < 0) return rc;
  if (!b && !gg__range_mapped(a, p, p + n))
    return gg__err(GG_EINVAL, "gg_alloc_at: [%p, %p) is not inside memory arena '%s' has mapped",
                   (void *)p, (void *)(p + n), a->name);
  if (!b)
    return gg__err(GG_ESTATE,
                   "gg_alloc_at: [%p, %p) is not free in arena '%s': it overlaps a live block, or "
                   "memory released in stream order that its stream may still use",
                   (void *)p, (void *)(p + n), a->name);
  b = gg__freelist_carve_at(&a->freelist, b, p, n);
  gg__use_block(a, b, asked, "");
  gg__arena_count_alloc(a, n);
  a->placed_open = a->open.count ? p : 0;
  return 0;
}

int gg_alloc_at(gg_arena_t *a, void *ptr, size_t size) {
  int rc = gg__arena_valid(a, "gg_alloc_at");
  if (rc < 0) return rc;
  uintptr_t p = (uintptr_t)ptr;
  if (!ptr) return gg__err(GG_EINVAL, "gg_alloc_at: ptr is NULL");
  if (size == 0) return gg__err(GG_EINVAL, "gg_alloc_at: size is 0");
  if (p % GG__QUANTUM)
    return gg__err(GG_EINVAL, "gg_alloc_at: %p is not a multiple of %zu bytes", ptr, GG__QUANTUM);
  if (size > SIZE_MAX - GG__QUANTUM || p + gg__rounded_size(size) < p)
    return gg__err(GG_EINVAL, "gg_alloc_at: %zu bytes at %p overflow the address space", size, ptr);
  size_t n = gg__rounded_size(size);
  rc = gg__arena_lock_counted(a, "gg_alloc_at");
  if (rc < 0) return rc;
  if (a->track) gg__arena_before_alloc(a);
  rc = gg__alloc_at_locked(a, p, n, size);
  if (rc == 0 && GG__UNLIKELY(gg__arena_records_sites(a)))
    gg__site_note(a, p, __builtin_return_address(0));
  gg__arena_leave(a);
  return rc;
}

/* ---- free ------------------------------------------------------------------------------------ */

/* Says why p is not a live block: the message is the whole value of the error path. */
static int gg__bad_free(gg_arena_t *a, uintptr_t p) {
  const gg__block_t *b = gg__used_holding(a, p);
  if (b && p > b->addr)
    return gg__err(GG_EINVAL,
                   "gg_free: %#jx points into the middle of the block at %#jx (%zu bytes)",
                   (uintmax_t)p, (uintmax_t)b->addr, b->req);
  size_t i = gg__chunk_index(a, p + 1);
  if (i > 0 && p < a->chunks[i - 1]->ptr + a->chunks[i - 1]->size)
    return gg__err(GG_EINVAL, "gg_free: %#jx is not a live block of arena '%s' (double free?)",
                   (uintmax_t)p, a->name);
  return gg__err(GG_EINVAL, "gg_free: %#jx was not allocated by arena '%s'", (uintmax_t)p, a->name);
}

/* Frees bump log entry i, whose memory holds p. The entry stays in the log as freed; its memory
 * returns when the log is cut or compacted. */
static int gg__free_bump_entry(gg_arena_t *a, size_t i, uintptr_t p, bool ordered) {
  gg__bump_entry_t *e = &a->bump[i];
  if (p != e->ptr)
    return gg__err(GG_EINVAL,
                   "gg_free: %#jx points into the middle of the block at %#jx (%zu bytes)",
                   (uintmax_t)p, (uintmax_t)e->ptr, e->req);
  if (!e->live)
    return gg__err(GG_EINVAL, "gg_free: %#jx was freed already (double free)", (uintmax_t)p);
  size_t n = gg__rounded_size(e->req);
  /* An entry of a scope that ended was cut with it; its frame still counts it as live. */
  GG__ASSERT(e->depth < a->n_frames && a->frames[e->depth].bump_live > 0 &&
             a->frames[e->depth].bump_bytes >= n && a->bump_live_bytes >= n);
  e->live = false;
  e->ordered = ordered;
  if (ordered) gg__arena_ordered_note(a, e->ptr, n);
  gg__arena_count_release(a, n, 1);
  a->bump_live_bytes -= n;
  a->frames[e->depth].bump_live--;
  a->frames[e->depth].bump_bytes -= n;
  /* LIFO frees leave the log at once: without stream tracking top moves back over them; with it
   * they join the open batch and, once it completes, merge into top the same way. */
  if (i == a->bump_count - 1) {
    gg__bump_pop_dead(a);
    gg__arena_after_release(a);
  }
  return 0;
}

/* Frees the block record that starts at p. */
static int gg__free_block(gg_arena_t *a, uintptr_t p, bool ordered) {
  gg__block_t *b = gg__used_take(a, p);
  /* Not the arena's: a thread's cache may have handed it out (a free on another thread). */
  if (!b && gg__tcache_publish_all(a) > 0) b = gg__used_take(a, p);
  if (!b) return gg__bad_free(a, p);
  GG__ASSERT(b->state == GG__BLOCK_USED && b->addr == p); /* the USED map names live blocks only */
  gg__frame_unlink(a, b);
  gg__arena_count_release(a, b->size, 1);
  int rc = gg__freelist_reserve(&a->freelist,
                                1); /* merging may need a map slot; the record is b's own */
  if (rc < 0) {                     /* keep the block live: nothing changed */
    gg__frame_link(a, b);
    gg__addr_map_put(gg__used_map(a, b->depth), p, b);
    a->in_use += b->size;
    a->n_live++;
    a->n_frees--;
    return rc;
  }
  if (ordered) gg__arena_ordered_note(a, b->addr, b->size);
  gg__arena_release(a, b->addr, b->size, b->seg, b, ordered);
  gg__arena_after_release(a);
  return 0;
}

/* Frees ptr; `ordered`: released in stream order (gg_free_on), reusable at once. Inline into its
 * two callers: a call less on every free that takes the lock. */
static inline __attribute__((always_inline)) int gg__free_locked(gg_arena_t *a, void *ptr,
                                                                 bool ordered) {
  if (!ptr) return gg__err(GG_EINVAL, "gg_free: ptr is NULL");
  uintptr_t p = (uintptr_t)ptr;
  if (p == a->placed_open) a->placed_open = 0; /* freed before the next allocation: a pair */
  long i = gg__bump_find(a, p);
  return i >= 0 ? gg__free_bump_entry(a, (size_t)i, p, ordered) : gg__free_block(a, p, ordered);
}

int gg_free(gg_arena_t *a, void *ptr) {
  int rc = gg__arena_valid(a, "gg_free");
  if (rc < 0) return rc;
  if (ptr && gg__tcache_free(a, ptr, false)) return 0; /* a block this thread's cache handed out */
  rc = gg__arena_lock_counted(a, "gg_free");
  if (rc < 0) return rc;
  rc = gg__free_locked(a, ptr, false);
  gg__arena_leave(a);
  return rc;
}

/* ---- stream-ordered calls (gg_alloc_on / gg_free_on) ----------------------------------------- */

/* CU_STREAM_LEGACY (0x1) names the same stream as NULL, the legacy default stream. */
static void *gg__norm_stream(void *stream) { return stream == (void *)0x1 ? NULL : stream; }

/* Orders `to` after the work queued on `from` so far, on the device: an event recorded on `from`
 * that `to` waits for. The host never waits. One event per arena, recorded again each time (a wait
 * takes the event as it is when the wait is queued). Lock held. */
static int gg__join_locked(gg_arena_t *a, void *from, void *to) {
  int rc;
  if (!a->join_event) {
    rc = a->ops->event_create(a->dev, &a->join_event);
    if (rc < 0) {
      a->join_event = NULL;
      return rc;
    }
  }
  rc = a->ops->event_record(a->dev, a->join_event, from);
  if (rc == 0) rc = a->ops->stream_wait(a->dev, to, a->join_event);
  if (rc < 0) return rc;
  a->probe.stream_joins++;
  return 1;
}

/* The arena's stream after the work queued on `stream`, when that is another stream and the arena
 * tracks one. 1 when joined, 0 when not needed. Lock held. */
static int gg__join_other_locked(gg_arena_t *a, void *stream) {
  stream = gg__norm_stream(stream);
  return !a->track || stream == a->stream ? 0 : gg__join_locked(a, stream, a->stream);
}

int gg_free_on(gg_arena_t *a, void *ptr, void *stream) {
  int rc = gg__arena_valid(a, "gg_free_on");
  if (rc < 0) return rc;
  /* On the arena's own stream (or none tracked) no wait is needed: the cache may take it back. */
  if (ptr && (!a->track || gg__norm_stream(stream) == a->stream) && gg__tcache_free(a, ptr, true))
    return 0;
  rc = gg__arena_lock_counted(a, "gg_free_on");
  if (rc < 0) return rc;
  /* A block freed on the arena's stream is reusable at once by later work on that stream, which
   * the stream runs after the work before the free; an allocation for another stream makes that
   * stream wait for the arena's first (gg_alloc_on). For a block freed on another stream, the
   * arena's stream first waits for that stream's work so far, on the device: the block is then in
   * the arena's stream order too. Under the lock (a guard's teardown cannot close the device
   * meanwhile). */
  rc = gg__join_other_locked(a, stream);
  if (rc >= 0) rc = gg__free_locked(a, ptr, true);
  gg__arena_leave(a);
  return rc < 0 ? rc : 0;
}

int gg_arena_join_stream(gg_arena_t *a, void *stream) {
  int rc = gg__arena_enter(a, "gg_arena_join_stream");
  if (rc < 0) return rc;
  rc = gg__join_other_locked(a, stream);
  gg__arena_leave(a);
  return rc;
}

int gg_alloc_on(gg_arena_t *a, size_t size, void *stream, void **ptr) {
  int rc = gg__alloc(a, size, 0, NULL, ptr, __builtin_return_address(0));
  if (rc < 0 || !a->track || gg__norm_stream(stream) == a->stream) return rc;
  /* For another stream: what the arena's stream still runs may touch a block released onto it, so
   * that stream waits for it, on the device. */
  rc = gg__arena_enter(a, "gg_alloc_on");
  if (rc == 0) {
    rc = gg__join_locked(a, a->stream, gg__norm_stream(stream));
    gg__arena_leave(a);
  }
  if (rc < 0) {
    gg_free(a, *ptr);
    *ptr = NULL;
    return rc;
  }
  return 0;
}
