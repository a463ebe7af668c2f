/* arena_bump_internal.h — the bump log's inline paths, for the files above it that free into the
 * log or cut it (arena_alloc.c, arena_scope.c, arena_sites.c, arena.c). */
#ifndef GG_ARENA_BUMP_INTERNAL_H
#define GG_ARENA_BUMP_INTERNAL_H

#include "arena/arena_base_impl.h"

/* The log entry whose memory holds p, or -1. Inline, the last entry first: every free asks, and
 * scoped code and alloc+free pairs free what they allocated last. */
static inline long gg__bump_find(const gg_arena_t *a, uintptr_t p) {
  if (!a->bump_count || p < a->bump[0].start) return -1;
  const gg__bump_entry_t *last = &a->bump[a->bump_count - 1];
  if (p >= gg__bump_entry_end(last)) return -1;
  return p >= last->start ? (long)a->bump_count - 1 : gg__bump_search(a, p);
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

#endif
