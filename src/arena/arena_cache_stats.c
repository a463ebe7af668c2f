/* arena_cache_stats.c — the walks over an arena's thread caches that its stats and the invariant
 * checker make, each cache under its own lock (the arena's lock held). */
#include <string.h>

#include "arena/arena_cache_impl.h"
#include "arena/arena_base_impl.h"

void gg__tcache_add_stats(gg_arena_t *a, gg_arena_stats_t *s) {
  size_t unsafe = 0;
  for (gg__tcache_t *c = a->caches; c; c = c->a_next) {
    bool asked = false;
    gg__tc_lock(c);
    s->n_events += c->events;
    s->bytes_in_use += c->d_bytes;
    s->n_live += gg__tc_nlive(c);
    s->n_allocs += c->d_allocs;
    s->n_frees += c->d_frees;
    if (c->peak > s->peak_in_use) s->peak_in_use = c->peak;
    for (int i = 0; i < GG__TC_CLASSES && a->track; i++) {
      gg__tc_class_t *k = &c->cls[i];
      for (unsigned j = 0; j < k->n; j++) {
        const gg__tc_entry_t *e = &k->ring[(k->head + j) % GG__TC_RING];
        if (gg__tc_reusable(a, e)) continue;
        /* Cached frees still waiting count as pending: one question may settle all of them. */
        if (!asked) {
          asked = true;
          gg__tc_ask_stream(a, c);
        }
        if (gg__tc_reusable(a, e)) continue;
        unsafe += k->size;
      }
    }
    gg__tc_unlock(c);
  }
  if (s->bytes_in_use > s->peak_in_use) s->peak_in_use = s->bytes_in_use;
  s->bytes_pending += unsafe;
  size_t spare = s->bytes_mapped - s->bytes_in_use;
  s->fragmentation = spare ? 1.0 - (double)s->largest_free_block / (double)spare : 0.0;
}

const char *gg__tcache_census(gg_arena_t *a,
                              void (*visit)(void *ctx, const gg__block_t *b, bool live),
                              void *ctx) {
  const char *w = NULL;
  for (gg__tcache_t *c = a->caches; c && !w; c = c->a_next) {
    gg__tc_lock(c);
    size_t live = 0, live_bytes = 0, free_bytes = 0;
    for (size_t i = 0; i < GG__TC_LIVE_SLOTS; i++) {
      if (c->live[i]) {
        live++;
        live_bytes += c->live[i]->size;
        visit(ctx, c->live[i], true);
      }
      if (!c->live[i] != !(c->live_bits[i / 64] >> (i % 64) & 1))
        w = "a cache's live bits disagree with its slots";
    }
    for (int i = 0; i < GG__TC_CLASSES; i++)
      for (unsigned j = 0; j < c->cls[i].n; j++) {
        const gg__block_t *b = c->cls[i].ring[(c->cls[i].head + j) % GG__TC_RING].rec;
        if (b->size != c->cls[i].size) w = "a cached block is in another size's ring";
        free_bytes += b->size;
        visit(ctx, b, false);
      }
    if (live != gg__tc_nlive(c) || live_bytes != c->d_bytes)
      w = "a cache's live blocks and its counters disagree";
    if (free_bytes != c->free_bytes) w = "a cache's free bytes are wrong";
    uint8_t seen[GG__TC_SIZE_HASH] = {0};
    for (int i = 0; i < GG__TC_CLASSES; i++)
      if (c->cls[i].size) seen[gg__tc_size_hash(c->cls[i].size)]++;
    if (memcmp(seen, c->size_seen, sizeof seen))
      w = "a cache's filter of sizes disagrees with its classes";
    if (c->d_allocs - c->d_frees != live) w = "a cache's allocation counts are wrong";
    gg__tc_unlock(c);
  }
  return w;
}

size_t gg__tcache_records(gg_arena_t *a) {
  size_t n = 0;
  for (gg__tcache_t *c = a->caches; c; c = c->a_next) {
    gg__tc_lock(c);
    n += gg__tc_nlive(c);
    for (int i = 0; i < GG__TC_CLASSES; i++) n += c->cls[i].n;
    gg__tc_unlock(c);
  }
  return n;
}
