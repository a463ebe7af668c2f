/* arena_bump.c — the bump log: allocations carved from top are logged in address order, so a scope
 * that ends (arena_scope.c) releases its part of the log as a few ranges in O(1 + runs), whatever
 * the number of its allocations; blocks served by best fit hang in their scope's list instead. */
#include <string.h>

#include "arena/arena_bump_internal.h"
#include "arena/arena_base_impl.h"
#include "core/internal.h"

/* ---- the log --------------------------------------------------------------------------------- */

uintptr_t gg__bump_push(gg_arena_t *a, size_t n, size_t align, size_t req, const char *tag) {
  gg__block_t *t = a->freelist.top;
  uintptr_t p = gg__align_up(t->addr, align);
  size_t used = (size_t)(p - t->addr) + n;
  GG__ASSERT(t->state == GG__BLOCK_TOP && used <= t->size); /* the caller checked top holds it */
  GG__ASSERT(a->bump_count < a->bump_cap && a->run_count < a->run_cap); /* gg__bump_reserve */
  /* The log stays sorted by address: gg__bump_search bisects it. */
  GG__ASSERT(!a->bump_count || a->bump[a->bump_count - 1].ptr < p);
  if (!a->bump_count || a->bump_new_run ||
      gg__bump_entry_end(&a->bump[a->bump_count - 1]) != t->addr) {
    a->runs[a->run_count++] = (gg__bump_run_t){.first = a->bump_count, .seg = t->seg};
    a->bump_new_run = false;
  }
  int d = a->n_frames - 1;
  a->bump[a->bump_count++] = (gg__bump_entry_t){
      .start = t->addr, .ptr = p, .req = req, .tag = tag, .depth = d, .live = true};
  t->addr += used;
  t->size -= used;
  a->freelist.bytes -= used;
  a->bump_bytes += used;
  a->bump_live_bytes += n;
  a->frames[d].bump_live++;
  a->frames[d].bump_bytes += n;
  return p;
}

/* Freed entries at the end of the log: those freed in stream order are reusable at once, the others
 * join the open batch (a group at a time, so neither kind is released the other's way). */
void gg__bump_pop_dead(gg_arena_t *a) {
  while (a->bump_count && !a->bump[a->bump_count - 1].live) {
    bool ordered = a->bump[a->bump_count - 1].ordered;
    size_t k = a->bump_count;
    while (k && !a->bump[k - 1].live && a->bump[k - 1].ordered == ordered) k--;
    if (gg__freelist_reserve(&a->freelist, a->run_count + 1) < 0) return;
    gg__bump_cut(a, k, ordered);
  }
}

/* Flushes one run: live entries become USED records of their scopes; padding and freed entries
 * between them are released. A hole is reusable at once unless it holds an entry freed outside
 * stream order: then it waits for the stream. */
static void gg__bump_flush_run(gg_arena_t *a, size_t ri) {
  void *seg = a->runs[ri].seg;
  size_t last = ri + 1 < a->run_count ? a->runs[ri + 1].first : a->bump_count;
  uintptr_t hole = 0;
  size_t hole_len = 0;
  bool tracked = false;
  for (size_t i = a->runs[ri].first; i < last; i++) {
    gg__bump_entry_t *e = &a->bump[i];
    GG__ASSERT(e->start >= hole + hole_len || !hole_len); /* entries of a run do not overlap */
    uintptr_t upto = e->live ? e->ptr : gg__bump_entry_end(e);
    if (upto > e->start) {
      if (!hole_len) hole = e->start;
      hole_len = upto - hole;
    }
    if (!e->live) {
      tracked |= !e->ordered;
      continue;
    }
    if (hole_len) {
      gg__arena_release(a, hole, hole_len, seg, NULL, !tracked);
      hole_len = 0;
      tracked = false;
    }
    gg__block_t *b = gg__freelist_take_record(&a->freelist);
    b->addr = e->ptr;
    b->size = gg__rounded_size(e->req);
    b->seg = seg;
    b->state = GG__BLOCK_USED;
    b->req = e->req;
    b->tag = e->tag;
    b->depth = e->depth;
    gg__frame_link(a, b);
    gg__addr_map_put(gg__used_map(a, b->depth), b->addr, b);
    a->probe.blocks_visited++;
  }
  if (hole_len) gg__arena_release(a, hole, hole_len, seg, NULL, !tracked);
}

/* For GG__ASSERT_EXPENSIVE: the log's entries lie in order, each run starts after the one before,
 * and the live entries and bytes are what the frames and the arena count (logs longer than
 * GG__WALK_MAX are taken on trust). */
static bool gg__bump_log_ok(const gg_arena_t *a) {
  if (a->bump_count > GG__WALK_MAX) return true;
  unsigned long long live = 0, frames_live = 0;
  size_t live_bytes = 0;
  for (size_t i = 0; i < a->bump_count; i++) {
    const gg__bump_entry_t *e = &a->bump[i];
    if (e->ptr < e->start || (i && e->start < gg__bump_entry_end(&a->bump[i - 1]))) return false;
    if (e->depth >= a->n_frames) return false;
    live += e->live;
    live_bytes += e->live ? gg__rounded_size(e->req) : 0;
  }
  for (size_t r = 1; r < a->run_count; r++)
    if (a->runs[r].first <= a->runs[r - 1].first) return false;
  for (int d = 0; d < a->n_frames; d++) frames_live += a->frames[d].bump_live;
  return live == frames_live && live_bytes == a->bump_live_bytes;
}

/* O(entries), and each entry is flushed at most once. */
int gg__bump_flush(gg_arena_t *a) {
  if (!a->bump_count) return 0;
  GG__ASSERT_EXPENSIVE(gg__bump_log_ok(a));
  size_t live = 0;
  int rc = 0;
  for (int d = 0; d < a->n_frames && rc == 0; d++) {
    size_t k = a->frames[d].bump_live;
    live += k;
    rc = gg__frame_reserve(a, d, k);
    if (rc == 0) rc = gg__addr_map_reserve(gg__used_map(a, d), k);
  }
  if (rc == 0) rc = gg__freelist_reserve(&a->freelist, live + a->bump_count + a->run_count + 1);
  if (rc < 0) return rc;
  for (size_t ri = 0; ri < a->run_count; ri++) gg__bump_flush_run(a, ri);
  a->bump_count = a->run_count = a->bump_bytes = a->bump_live_bytes = 0;
  for (int d = 0; d < a->n_frames; d++) {
    a->frames[d].bump_first = 0;
    a->frames[d].bump_live = 0;
    a->frames[d].bump_bytes = 0;
  }
  a->probe.bump_flushes++;
  return 0;
}

long gg__bump_search(const gg_arena_t *a, uintptr_t p) {
  size_t lo = 0, hi = a->bump_count - 1; /* the last entry with start <= p lies in [lo, hi) */
  while (hi - lo > 1) {
    size_t mid = lo + (hi - lo) / 2;
    if (a->bump[mid].start <= p)
      lo = mid;
    else
      hi = mid;
  }
  return p < gg__bump_entry_end(&a->bump[lo]) ? (long)lo : -1;
}
