/* arena_bump.c — the bump log and scopes: allocations carved from top are logged in address order,
 * so a scope that ends releases its part of the log as a few ranges in O(1 + runs), whatever the
 * number of its allocations; blocks served by best fit hang in their scope's list instead. */
#include <string.h>

#include "arena/arena_impl.h"
#include "core/internal.h"

/* ---- the log --------------------------------------------------------------------------------- */

uintptr_t gg__bump_push(gg_arena_t *a, size_t n, size_t align, size_t req, const char *tag) {
  gg__block_t *t = a->freelist.top;
  uintptr_t p = gg__align_up(t->addr, align);
  size_t used = (size_t)(p - t->addr) + n;
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

/* Releases log entries [k, bump_count) one run at a time: O(1 + runs cut), whatever the number of
 * entries. Live entries among them must already be counted as released by the caller. Needs
 * run_count records. Inline: every LIFO free on the pair path cuts its one entry through here. */
static inline __attribute__((always_inline)) void gg__bump_cut(gg_arena_t *a, size_t k,
                                                               bool ordered) {
  while (a->bump_count > k) {
    gg__bump_run_t *r = &a->runs[a->run_count - 1];
    size_t f = r->first > k ? r->first : k;
    uintptr_t s = a->bump[f].start, e = gg__bump_entry_end(&a->bump[a->bump_count - 1]);
    void *seg = r->seg;
    a->bump_bytes -= e - s;
    a->bump_count = f;
    if (f == r->first) a->run_count--;
    gg__arena_release(a, s, e - s, seg, NULL, ordered);
  }
  for (int d = a->n_frames - 1; d >= 0 && a->frames[d].bump_first > k; d--)
    a->frames[d].bump_first = k;
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

/* O(entries), and each entry is flushed at most once. */
int gg__bump_flush(gg_arena_t *a) {
  if (!a->bump_count) return 0;
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

/* ---- scopes ---------------------------------------------------------------------------------- */

gg__block_t *gg__used_get(const gg_arena_t *a, uintptr_t p) {
  for (int d = a->n_frames - 1; d > 0; d--) {
    gg__block_t *b = gg__addr_map_get(&a->frames[d].used, p);
    if (b) return b;
  }
  return gg__addr_map_get(&a->used, p);
}

gg__block_t *gg__used_take(gg_arena_t *a, uintptr_t p) {
  for (int d = a->n_frames - 1; d > 0; d--) {
    gg__block_t *b = gg__addr_map_del(&a->frames[d].used, p);
    if (b) return b;
  }
  return gg__addr_map_del(&a->used, p);
}

const gg__block_t *gg__used_holding(const gg_arena_t *a, uintptr_t p) {
  for (int d = 0; d < a->n_frames; d++) {
    const gg__addr_map_t *m = d ? &a->frames[d].used : &a->used;
    for (size_t i = 0; i < m->cap; i++) {
      const gg__block_t *b = m->slots[i].val;
      if (b && p >= b->addr && p < b->addr + b->size) return b;
    }
  }
  return NULL;
}

size_t gg__used_count(const gg_arena_t *a) {
  size_t n = a->used.n;
  for (int d = 1; d < a->n_frames; d++) n += a->frames[d].used.n;
  return n;
}

void gg__frame_link(gg_arena_t *a, gg__block_t *b) {
  gg__frame_t *f = &a->frames[b->depth];
  if (b->depth) {
    f->recs[f->n_blocks] = b;
    b->slot = f->n_blocks++;
    return;
  }
  b->l = NULL;
  b->r = f->blocks;
  if (f->blocks) f->blocks->l = b;
  f->blocks = b;
  f->n_blocks++;
}

/* In a scope the last record moves into the hole: O(1), and a block freed right after it was
 * allocated (the usual order) is the last one already. */
void gg__frame_unlink(gg_arena_t *a, gg__block_t *b) {
  gg__frame_t *f = &a->frames[b->depth];
  if (b->depth) {
    gg__block_t *last = f->recs[--f->n_blocks];
    f->recs[b->slot] = last;
    last->slot = b->slot;
    return;
  }
  if (b->l)
    b->l->r = b->r;
  else
    f->blocks = b->r;
  if (b->r) b->r->l = b->l;
  f->n_blocks--;
}

int gg_scope_begin(gg_arena_t *a, gg_scope_t *scope) {
  if (!scope) return gg__err(GG_EINVAL, "gg_scope_begin: scope is NULL");
  int rc = gg__arena_enter(a, "gg_scope_begin");
  if (rc < 0) return rc;
  size_t cap = a->frames_cap;
  rc = gg__arena_grow_array(&a->frames, &a->frames_cap, (size_t)a->n_frames + 1, sizeof *a->frames);
  if (rc == 0) {
    /* New frames start with no array; a frame's array outlives its scope, for the next one at its
     * depth. */
    memset(a->frames + cap, 0, (a->frames_cap - cap) * sizeof *a->frames);
    gg__frame_t *f = &a->frames[a->n_frames++];
    *f = (gg__frame_t){.id = ++a->serial,
                       .bump_first = a->bump_count,
                       .recs = f->recs,
                       .recs_cap = f->recs_cap,
                       .used = f->used};
    scope->arena = a;
    scope->id = a->serial;
    /* Threads' caches are bypassed from here on; giving their free blocks back takes each cache's
     * lock, so an allocation a cache was serving meanwhile is over before the scope begins. */
    atomic_store(&a->scopes_open, true);
    gg__tcache_give_back_all(a, false);
  }
  gg__arena_leave(a);
  return rc;
}

/* A scope end starts loading free-list slots this many records ahead, and records twice as far. */
#define GG__SCOPE_AHEAD 16

/* Empties a scope's map of records whole: cleared for the next scope at its depth when it is dense
 * enough that clearing costs a few bytes a block, else given back (the next scope grows its own).
 * */
static void gg__frame_used_clear(gg__frame_t *f, size_t blocks) {
  gg__addr_map_t *m = &f->used;
  if (m->cap > 8 * blocks + 64)
    gg__addr_map_free(m);
  else if (m->n) {
    memset(m->slots, 0, m->cap * sizeof *m->slots);
    m->n = 0;
  }
}

/* One gathered range of a scope end (in its own record): to the free list when reusable at once,
 * else into the open batch. */
static inline void gg__scope_give(gg_arena_t *a, gg__block_t *run, bool direct) {
  if (direct)
    gg__freelist_put(&a->freelist, run->addr, run->size, run->seg, run);
  else
    gg__arena_release(a, run->addr, run->size, run->seg, run, false);
}

/* Ends the innermost scope: records first, in O(blocks) with no search (a run of blocks that touch
 * in allocation order, as blocks carved one after another from the front of a free block do, is
 * released as one range); then the log's tail, whatever its length, in O(runs cut). The records are
 * an array, so loads start far ahead: the record 2 x GG__SCOPE_AHEAD on, the free-list slots of the
 * one GG__SCOPE_AHEAD on. On a tracked arena a scope large enough to close the open batch asks the
 * stream first, as closing it would: idle, the blocks go straight to the free list instead of into
 * the batch and out again. The scope's own map of records is emptied at once, not record by record.
 * */
static int gg__scope_release(gg_arena_t *a) {
  GG__ASSERT(a->n_frames > 1); /* frame 0 is the arena's own, never a scope */
  gg__frame_t *f = &a->frames[a->n_frames - 1];
  int rc = gg__freelist_reserve(&a->freelist, a->run_count + 1 + f->n_blocks);
  if (rc < 0) return rc;
  gg__block_t *run = NULL; /* the range being gathered, in a record of its own */
  gg__block_t **recs = f->recs;
  size_t n = f->n_blocks, bytes = 0;
  bool direct =
      !a->track || (n && gg__arena_settle_before(a, n)); /* released memory reusable at once */
  for (size_t i = 0; i < n && i < 2 * GG__SCOPE_AHEAD; i++) gg__prefetch(recs[i]);
  for (size_t i = 0; i < n; i++) {
    if (i + 2 * GG__SCOPE_AHEAD < n) gg__prefetch(recs[i + 2 * GG__SCOPE_AHEAD]);
    if (direct && i + GG__SCOPE_AHEAD < n) {
      const gg__block_t *ahead = recs[i + GG__SCOPE_AHEAD];
      gg__freelist_prefetch(&a->freelist, ahead->addr, ahead->size);
    }
    gg__block_t *b = recs[i];
    GG__ASSERT(b->state == GG__BLOCK_USED &&
               b->depth == a->n_frames - 1); /* this scope's own blocks */
    bytes += b->size;
    if (run && b->seg == run->seg && b->addr + b->size == run->addr) { /* just below the run */
      run->addr = b->addr;
      run->size += b->size;
      gg__freelist_give_record(&a->freelist, b);
      continue;
    }
    if (run && b->seg == run->seg && b->addr == run->addr + run->size) { /* just above */
      run->size += b->size;
      gg__freelist_give_record(&a->freelist, b);
      continue;
    }
    if (run) gg__scope_give(a, run, direct);
    run = b;
  }
  if (run) gg__scope_give(a, run, direct);
  GG__ASSERT(a->n_live >= n && a->in_use >= bytes);
  gg__arena_count_release(a, bytes, n);
  a->probe.blocks_visited += n;
  gg__frame_used_clear(f, n);
  f->n_blocks = 0;
  gg__arena_count_release(a, f->bump_bytes, f->bump_live);
  a->bump_live_bytes -= f->bump_bytes;
  gg__bump_cut(a, f->bump_first, direct && a->track);
  a->n_frames--;
  atomic_store(&a->scopes_open, a->n_frames > 1);
  gg__arena_after_release(a);
  if (a->n_frames == 1 && (a->flags & GG_ARENA_TRIM_ON_SCOPE_EXIT))
    rc = gg__arena_trim_locked(a, 0);
  return rc;
}

int gg_scope_end(gg_scope_t *scope) {
  if (!scope) return gg__err(GG_EINVAL, "gg_scope_end: scope is NULL");
  gg_arena_t *a = scope->arena;
  int rc = gg__arena_enter(a, "gg_scope_end");
  if (rc < 0) return rc;
  int d = a->n_frames - 1;
  while (d > 0 && a->frames[d].id != scope->id) d--;
  if (d == 0)
    rc = gg__err(GG_ESTATE, "gg_scope_end: scope %llu of arena '%s' has ended already", scope->id,
                 a->name);
  else if (d != a->n_frames - 1)
    rc = gg__err(GG_ESTATE,
                 "gg_scope_end: scope %llu (depth %d) of arena '%s' cannot end while the scope "
                 "opened inside "
                 "it (depth %d) is open; end scopes in reverse order",
                 scope->id, d, a->name, a->n_frames - 1);
  else
    rc = gg__scope_release(a);
  gg__arena_leave(a);
  return rc;
}
