/* arena_scope.c — scopes: gg_scope_begin() opens a frame, gg_scope_end() releases what it holds,
 * its part of the bump log as a few ranges in O(1 + runs) and the blocks served by best fit from
 * its list, and trims when the scope asked for it. */
#include <string.h>

#include "arena/arena_bump_internal.h"
#include "arena/arena_base_impl.h"
#include "core/internal.h"

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
    /* A frame kept for the next scope at its depth was emptied whole when its scope ended. */
    GG__ASSERT(f->used.n == 0 && f->n_blocks == 0);
    *f = (gg__frame_t){.id = ++a->serial,
                       .bump_first = a->bump_count,
                       .recs = f->recs,
                       .recs_cap = f->recs_cap,
                       .used = f->used};
    /* Ids rise with depth and log parts nest: gg_scope_end finds a scope by id from the top. */
    GG__ASSERT(f[-1].id < f->id && f[-1].bump_first <= f->bump_first);
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
  GG__ASSERT(f->used.n == n); /* the map and the array hold the same records */
  gg__frame_used_clear(f, n);
  f->n_blocks = 0;
  gg__arena_count_release(a, f->bump_bytes, f->bump_live);
  a->bump_live_bytes -= f->bump_bytes;
  GG__ASSERT(f->bump_live == 0 || f->bump_first < a->bump_count); /* live entries are logged */
  gg__bump_cut(a, f->bump_first, direct && a->track);
  GG__ASSERT(a->bump_count == f->bump_first); /* the scope's part of the log is gone */
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
