/* arena_check.c — for tests and the debug build: the probe (counters of internal work) and the full
 * consistency check, which walks every structure of an arena and proves that its pieces tile the
 * mapped memory exactly and agree with every counter. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "arena/arena_base_impl.h"
#include "core/internal.h"

int gg__arena_probe(gg_arena_t *a, gg__arena_probe_t *out) {
  int rc = gg__arena_enter(a, "gg__arena_probe");
  if (rc < 0) return rc;
  *out = a->probe;
  out->bump_entries = a->bump_count;
  out->free_blocks = a->freelist.count;
  out->chunks = a->n_chunks;
  out->top_bytes = a->freelist.top ? a->freelist.top->size : 0;
  gg__arena_leave(a);
  return 0;
}

/* ---- regions: every piece of mapped memory, whatever structure holds it ---------------------- */

enum { GG__REGION_FREE, GG__REGION_USED, GG__REGION_PENDING, GG__REGION_RUN, GG__REGION_CACHED };

typedef struct gg__region {
  uintptr_t addr;
  size_t size;
  int kind;
  void *seg;
} gg__region_t;

/* What the phases collect; each phase adds its regions and checks its own structure. */
typedef struct gg__census {
  gg__region_t *r;
  size_t n, cap;
  size_t live, live_bytes;           /* USED records */
  size_t bump_live, bump_live_bytes; /* live entries of the bump log */
  bool bad_cached;
} gg__census_t;

static void gg__census_add(gg__census_t *c, uintptr_t addr, size_t size, int kind, void *seg) {
  if (c->n < c->cap) c->r[c->n++] = (gg__region_t){addr, size, kind, seg};
}

static int gg__region_cmp(const void *x, const void *y) {
  uintptr_t a = ((const gg__region_t *)x)->addr, b = ((const gg__region_t *)y)->addr;
  return a < b ? -1 : a > b;
}

/* The free list's own invariants, then its blocks and top as regions. */
static const char *gg__check_free(const gg_arena_t *a, gg__census_t *c) {
  const char *w = gg__freelist_check(&a->freelist);
  if (w) return w;
  gg__block_t **fs = malloc((a->freelist.count + 1) * sizeof *fs);
  if (!fs) return "out of host memory";
  size_t nf = gg__freelist_list(&a->freelist, fs, a->freelist.count);
  for (size_t i = 0; i < nf; i++)
    gg__census_add(c, fs[i]->addr, fs[i]->size, GG__REGION_FREE, fs[i]->seg);
  free(fs);
  const gg__block_t *t = a->freelist.top;
  if (t && t->size) gg__census_add(c, t->addr, t->size, GG__REGION_FREE, t->seg);
  return NULL;
}

/* USED records: each frame's map by address and its list or array hold the same blocks. */
static const char *gg__check_used(const gg_arena_t *a, gg__census_t *c) {
  for (int d = 0; d < a->n_frames; d++) {
    const gg__addr_map_t *m = d ? &a->frames[d].used : &a->used;
    for (size_t i = 0; i < m->cap && c->n < c->cap; i++) {
      const gg__block_t *b = m->slots[i].val;
      if (!b) continue;
      if (b->state != GG__BLOCK_USED || b->addr != m->slots[i].key)
        return "a used record is not USED";
      if (b->depth != d) return "a used record is in another scope's map";
      if (b->size != gg__rounded_size(b->req))
        return "a used record's size does not match its request";
      gg__census_add(c, b->addr, b->size, GG__REGION_USED, b->seg);
      c->live++;
      c->live_bytes += b->size;
    }
  }
  for (int d = a->n_frames; d < (int)a->frames_cap; d++)
    if (a->frames[d].used.n || a->frames[d].n_blocks)
      return "a scope that ended still holds records";
  size_t in_frames = 0, n = 0;
  for (const gg__block_t *b = a->frames[0].blocks; b; b = b->r, n++) {
    if (b->depth != 0 || gg__addr_map_get(&a->used, b->addr) != b)
      return "a scope lists a block it does not own";
    if (b->r && b->r->l != b) return "the outermost frame's list has a broken back link";
  }
  if (n != a->frames[0].n_blocks) return "the outermost frame's count disagrees with its list";
  in_frames += n;
  for (int d = 1; d < a->n_frames; d++) {
    const gg__frame_t *f = &a->frames[d];
    if (f->n_blocks > f->recs_cap) return "a scope holds more records than its array has room for";
    for (size_t i = 0; i < f->n_blocks; i++) {
      const gg__block_t *b = f->recs[i];
      if (b->depth != d || gg__addr_map_get(&f->used, b->addr) != b)
        return "a scope lists a block it does not own";
      if (b->slot != i) return "a scope's record does not know its place in the scope's array";
    }
    in_frames += f->n_blocks;
  }
  return in_frames != gg__used_count(a) ? "scope lists and the used maps disagree" : NULL;
}

/* PENDING records: the recorded batches and the open one, against their totals. */
static const char *gg__check_batches(const gg_arena_t *a, gg__census_t *c) {
  size_t pending = 0;
  for (size_t k = a->closed_head; k <= a->closed_end; k++) {
    const gg__batch_t *bt = k < a->closed_end ? &a->closed[k] : &a->open;
    size_t bytes = 0, count = 0;
    for (const gg__block_t *b = bt->head; b && c->n < c->cap; b = b->r, count++) {
      if (b->state != GG__BLOCK_PENDING) return "a batch holds a record that is not PENDING";
      gg__census_add(c, b->addr, b->size, GG__REGION_PENDING, b->seg);
      bytes += b->size;
    }
    if (bytes != bt->bytes || count != bt->count) return "a batch's totals are wrong";
    pending += bytes;
  }
  return pending != a->pending ? "pending bytes are wrong" : NULL;
}

/* The bump log: sorted, each run without holes, entries aligned and in open scopes; a run is a
 * region. */
static const char *gg__check_bump_runs(const gg_arena_t *a, gg__census_t *c) {
  size_t run_bytes = 0;
  for (size_t ri = 0; ri < a->run_count; ri++) {
    size_t first = a->runs[ri].first,
           last = ri + 1 < a->run_count ? a->runs[ri + 1].first : a->bump_count;
    if (first >= last) return "an empty run in the bump log";
    if (ri && a->bump[first].start < gg__bump_entry_end(&a->bump[first - 1]))
      return "the bump log is not sorted";
    for (size_t i = first; i < last; i++) {
      const gg__bump_entry_t *e = &a->bump[i];
      if (i > first && e->start != gg__bump_entry_end(&a->bump[i - 1]))
        return "a run of the bump log has a hole";
      if (e->ptr < e->start || e->ptr % GG__QUANTUM) return "a bump entry is misaligned";
      if (e->depth >= a->n_frames) return "a bump entry belongs to a scope that ended";
      if (e->live) {
        c->bump_live++;
        c->bump_live_bytes += gg__rounded_size(e->req);
      }
    }
    uintptr_t s = a->bump[first].start, e = gg__bump_entry_end(&a->bump[last - 1]);
    gg__census_add(c, s, e - s, GG__REGION_RUN, a->runs[ri].seg);
    run_bytes += e - s;
  }
  if (a->bump_count && !a->run_count) return "bump entries without runs";
  if (run_bytes != a->bump_bytes || c->bump_live_bytes != a->bump_live_bytes)
    return "bump byte counts are wrong";
  return NULL;
}

/* Records threads' caches hold: CACHED, and each cache's own bookkeeping right. */
static void gg__census_add_cached(void *ctx, const gg__block_t *b, bool live) {
  gg__census_t *c = ctx;
  (void)live;
  if (b->state != GG__BLOCK_CACHED) c->bad_cached = true;
  gg__census_add(c, b->addr, b->size, GG__REGION_CACHED, b->seg);
}

static const char *gg__check_caches(gg_arena_t *a, gg__census_t *c) {
  const char *w = gg__tcache_census(a, gg__census_add_cached, c);
  return w ? w : c->bad_cached ? "a cached record is not CACHED" : NULL;
}

/* Each scope's part of the log, and the counters every scope and the arena keep of live memory. */
static const char *gg__check_scope_marks(const gg_arena_t *a, const gg__census_t *c) {
  unsigned long long live = 0;
  size_t bytes = 0;
  for (int d = 0; d < a->n_frames; d++) {
    live += a->frames[d].bump_live;
    bytes += a->frames[d].bump_bytes;
    if (d && a->frames[d].bump_first < a->frames[d - 1].bump_first)
      return "scope log marks out of order";
    size_t end = d + 1 < a->n_frames ? a->frames[d + 1].bump_first : a->bump_count;
    for (size_t i = a->frames[d].bump_first; i < end; i++)
      if (a->bump[i].depth != d) return "a bump entry lies in another scope's part of the log";
  }
  if (live != c->bump_live || bytes != c->bump_live_bytes) return "scope log counters are wrong";
  if (c->live + c->bump_live != a->n_live || c->live_bytes + c->bump_live_bytes != a->in_use)
    return "in-use counters are wrong";
  return NULL;
}

/* Inside mapped memory: one chunk, or (contiguous) a series of adjacent chunks. */
static const char *gg__check_inside_chunks(const gg_arena_t *a, const gg__region_t *r) {
  size_t c = gg__chunk_index(a, r->addr + 1);
  if (c == 0) return "a region starts below every chunk";
  const gg__chunk_t *ch = a->chunks[c - 1];
  uintptr_t end = ch->ptr + ch->size;
  if (ch->alias) return "a region lies in the old range of a moved chunk";
  if (!a->contiguous && r->seg != ch) return "a region's segment is not its chunk";
  while (a->contiguous && end < r->addr + r->size && c < a->n_chunks && !a->chunks[c]->alias &&
         a->chunks[c]->ptr == end)
    end += a->chunks[c++]->size;
  if (r->addr < ch->ptr || r->addr + r->size > end) return "a region is not inside mapped memory";
  return NULL;
}

/* The regions in address order: aligned, not overlapping, free neighbours merged, inside chunks. */
static const char *gg__check_tiling(const gg_arena_t *a, gg__census_t *c, size_t *total,
                                    size_t *free_bytes) {
  if (c->n >= c->cap) return "too many regions";
  qsort(c->r, c->n, sizeof *c->r, gg__region_cmp);
  const char *w;
  for (size_t i = 0; i < c->n; i++) {
    const gg__region_t *r = &c->r[i], *next = i + 1 < c->n ? &c->r[i + 1] : NULL;
    *total += r->size;
    if (r->kind == GG__REGION_FREE) *free_bytes += r->size;
    if (!r->size || r->addr % GG__QUANTUM || r->size % GG__QUANTUM)
      return "a region is empty or misaligned";
    if (next && r->addr + r->size > next->addr) return "two regions overlap";
    if (next && r->kind == GG__REGION_FREE && next->kind == GG__REGION_FREE &&
        r->seg == next->seg && r->addr + r->size == next->addr)
      return "two free neighbours were not merged";
    w = gg__check_inside_chunks(a, r);
    if (w) return w;
  }
  return NULL;
}

/* The chunks: sorted, apart, inside the reservation; their sum, the regions' and the counters
 * agree. */
static const char *gg__check_chunks(const gg_arena_t *a, size_t total, size_t free_bytes) {
  size_t mapped = 0;
  size_t aliases = 0;
  for (size_t i = 0; i < a->n_chunks; i++) {
    const gg__chunk_t *ch = a->chunks[i];
    if (ch->alias) {
      aliases++;
    } else {
      mapped += ch->size;
    }
    if (i && a->chunks[i - 1]->ptr + a->chunks[i - 1]->size > ch->ptr) return "chunks overlap";
    if (a->contiguous && (ch->ptr < a->base || ch->ptr + ch->size > a->base + a->capacity))
      return "a chunk lies outside the reservation";
  }
  if (aliases != a->n_alias) return "the alias count is wrong";
  if (mapped != a->mapped || total != a->mapped) return "regions do not tile mapped memory exactly";
  if (free_bytes != a->freelist.bytes) return "free bytes are wrong";
  if (a->mapped > a->capacity || a->peak_mapped < a->mapped || a->peak_in_use < a->in_use)
    return "peaks are wrong";
  return NULL;
}

static const char *gg__check_locked(gg_arena_t *a, gg__census_t *c) {
  const char *w;
  size_t total = 0, free_bytes = 0;
  w = gg__check_free(a, c);
  if (!w) w = gg__check_used(a, c);
  if (!w) w = gg__check_batches(a, c);
  if (!w) w = gg__check_bump_runs(a, c);
  if (!w) w = gg__check_scope_marks(a, c);
  if (!w) w = gg__check_caches(a, c);
  if (!w) w = gg__check_tiling(a, c, &total, &free_bytes);
  if (!w) w = gg__check_chunks(a, total, free_bytes);
  return w;
}

/* Arena locked: what is wrong, NULL when nothing is, GG__CHECK_NO_MEMORY when the census has no
 * room. */
static const char GG__CHECK_NO_MEMORY[] = "out of host memory";
static const char *gg__check_all(gg_arena_t *a) {
  gg__census_t c = {.cap = a->freelist.count + 2 + gg__used_count(a) + a->run_count +
                           a->open.count + 1 + gg__tcache_records(a)};
  for (size_t k = a->closed_head; k < a->closed_end; k++) c.cap += a->closed[k].count;
  c.r = malloc(c.cap * sizeof *c.r);
  const char *w = c.r ? gg__check_locked(a, &c) : GG__CHECK_NO_MEMORY;
  free(c.r);
  return w;
}

int gg__arena_check(gg_arena_t *a) {
  int rc = gg__arena_enter(a, "gg__arena_check");
  if (rc < 0) return rc;
  const char *w = gg__check_all(a);
  if (w) rc = gg__err(GG_ESTATE, "arena '%s' is inconsistent: %s", a->name, w);
  gg__arena_leave_unchecked(a);
  return rc;
}

#if GG_DEBUG >= 2
/* Arenas mapping more than this, or holding more blocks, skip the check at every call (it walks
 * every block: O(blocks) a call, so a test of 100,000 blocks would take O(blocks^2)).
 * GPUGUARD_DEBUG_CHECK_BELOW changes the size (0 turns the check off). */
#define GG__DEBUG_CHECK_BELOW  ((size_t)64 << 20)
#define GG__DEBUG_CHECK_BLOCKS 1024

static size_t gg__debug_check_below(void) {
  static _Atomic size_t limit = SIZE_MAX; /* SIZE_MAX: not read yet */
  size_t v = atomic_load_explicit(&limit, memory_order_relaxed);
  if (v != SIZE_MAX) return v;
  v = GG__DEBUG_CHECK_BELOW;
  const char *text = gg__env("GPUGUARD_DEBUG_CHECK_BELOW");
  gg__err_saved_t saved;
  gg__err_save(&saved);
  if (text && gg__parse_size("GPUGUARD_DEBUG_CHECK_BELOW", text, &v) < 0) v = GG__DEBUG_CHECK_BELOW;
  gg__err_restore(&saved);
  if (v == SIZE_MAX) v--;
  atomic_store_explicit(&limit, v, memory_order_relaxed);
  return v;
}

void gg__arena_debug_check(gg_arena_t *a) {
  if (a->mapped > gg__debug_check_below()) return;
  if (gg__used_count(a) + a->freelist.count + a->open.count > GG__DEBUG_CHECK_BLOCKS) return;
  const char *w = gg__check_all(a);
  if (w == GG__CHECK_NO_MEMORY)
    return; /* a host-memory fault test: nothing to say about the arena */
  if (w) {
    fprintf(stderr, "gpuguard: arena '%s' is inconsistent after a call: %s\n", a->name, w);
    gg__assert_fail("gg__arena_check(arena) == 0", __FILE__, __LINE__, __func__);
  }
}
#endif
