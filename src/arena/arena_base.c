/* arena_base.c — what every arena file stands on: handle checks and the counted lock, quiet steps,
 * growing arrays, the figures of gg_arena_stats(), and the records of live blocks (the USED maps by
 * scope depth, and each scope's list of its blocks). Calls nothing of the arena above it. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "arena/arena_base_impl.h"
#include "core/internal.h"

#if GG_DEBUG >= 2
void (*_Atomic gg__arena_debug_hook)(gg_arena_t *a);
#endif

int gg__arena_grow_array_slow(void *arr, size_t *cap, size_t need, size_t elem) {
  size_t n = *cap ? *cap * 2 : 16;
  if (n < need) n = need;
  void *p = realloc(*(void **)arr, n * elem);
  if (!p) return gg__err(GG_ENOMEM, "arena: out of host memory for metadata (%zu entries)", n);
  *(void **)arr = p;
  *cap = n;
  return 0;
}

int gg__arena_quietly(gg_arena_t *a, int (*step)(gg_arena_t *a, void *ctx), void *ctx) {
  gg__err_quiet_t quiet; /* copies the detail only when the step fails: reclaims run on hot paths */
  gg__err_quiet_begin(&quiet);
  int rc = step(a, ctx);
  gg__err_quiet_end(&quiet);
  return rc;
}

int gg__arena_valid_slow(const gg_arena_t *a, const char *call) {
  if (!a) return gg__err(GG_EINVAL, "%s: arena is NULL", call);
  unsigned magic = atomic_load(&a->magic); /* once: a teardown may turn MAGIC into TORN meanwhile */
  if (magic == GG__TORN)
    return gg__err(GG_ESTATE,
                   "%s: arena '%s' was torn down by its guard (its device memory is gone); only "
                   "gg_arena_destroy() is still valid on it",
                   call, a->name);
  if (magic != GG__MAGIC)
    return gg__err(GG_EINVAL, "%s: %p is not a live arena (destroyed already, or not an arena)",
                   call, (const void *)a);
  return gg__check_fork(a->fork_gen, call);
}

/* A call counts itself before it looks at the handle again and locks it; gg_arena_destroy() marks
 * the handle dead under the lock and then waits until no call is counted, so no call is ever left
 * waiting on a lock that was destroyed. Whichever of the two comes first, the other sees it
 * (sequentially consistent atomics): a call counted too late for destroy's wait finds the handle
 * dead and never touches the lock. */
int gg__arena_lock_counted(gg_arena_t *a, const char *call) {
  atomic_fetch_add(&a->calls,
                   1); /* after gg__arena_valid: a pointer that is not an arena is never written */
  if (GG__LIKELY(atomic_load(&a->magic) == GG__MAGIC)) {
    pthread_mutex_lock(&a->lock);
    if (GG__LIKELY(a->magic == GG__MAGIC)) return 0;
    pthread_mutex_unlock(&a->lock);
  }
  int rc = gg__arena_valid_slow(a, call); /* a guard's teardown or a destroy ran meanwhile */
  atomic_fetch_sub(&a->calls, 1);
  return rc;
}

/* ---- figures, for stats and messages --------------------------------------------------------- */

static size_t gg__largest_free(const gg_arena_t *a) {
  const gg__block_t *b = gg__freelist_largest(&a->freelist);
  size_t l = b ? b->size : 0;
  return a->freelist.top && a->freelist.top->size > l ? a->freelist.top->size : l;
}

void gg__arena_fill_stats(const gg_arena_t *a, gg_arena_stats_t *s) {
  memset(s, 0, sizeof *s);
  s->bytes_in_use = a->in_use;
  s->bytes_mapped = a->mapped;
  s->bytes_reserved = a->capacity;
  s->peak_in_use = a->peak_in_use;
  s->peak_mapped = a->peak_mapped;
  s->largest_free_block = gg__largest_free(a);
  s->n_live = a->n_live;
  s->n_allocs = a->n_allocs;
  s->n_frees = a->n_frees;
  s->n_trims = a->n_trims;
  s->bytes_trimmed = a->bytes_trimmed;
  s->scope_depth = a->n_frames - 1;
  size_t spare = a->mapped - a->in_use;
  s->fragmentation = spare ? 1.0 - (double)s->largest_free_block / (double)spare : 0.0;
  s->bytes_pending = a->pending + gg__bump_dead_bytes(a);
  s->n_chunks = a->n_chunks - a->n_alias;
  s->n_events = a->probe.events_recorded + a->probe.stream_joins;
  s->n_stream_waits = a->probe.stream_waits;
  s->n_maps = a->n_maps;
  s->n_unmaps = a->n_unmaps;
  s->n_moves = a->n_moves;
}

/* ---- records of live blocks ------------------------------------------------------------------ */

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
  GG__ASSERT(b->state == GG__BLOCK_USED && b->depth >= 0 && b->depth < a->n_frames);
  gg__frame_t *f = &a->frames[b->depth];
  if (b->depth) {
    GG__ASSERT(f->n_blocks < f->recs_cap); /* the caller reserved the room (gg__frame_reserve) */
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
  GG__ASSERT(b->depth >= 0 && b->depth < a->n_frames && a->frames[b->depth].n_blocks > 0);
  gg__frame_t *f = &a->frames[b->depth];
  if (b->depth) {
    GG__ASSERT(b->slot < f->n_blocks && f->recs[b->slot] == b); /* its slot names it */
    gg__block_t *last = f->recs[--f->n_blocks];
    f->recs[b->slot] = last;
    last->slot = b->slot;
    return;
  }
  GG__ASSERT(b->l ? b->l->r == b : f->blocks == b); /* linked in frame 0's list */
  if (b->l)
    b->l->r = b->r;
  else
    f->blocks = b->r;
  if (b->r) b->r->l = b->l;
  f->n_blocks--;
}
