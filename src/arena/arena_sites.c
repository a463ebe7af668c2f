/* arena_sites.c — where live blocks were allocated (GG_ARENA_BACKTRACE or GPUGUARD_BACKTRACE=1): a
 * short backtrace per allocation, interned (one copy per distinct site), found by the block's
 * address. Return addresses only are kept; they are turned into names only when a report prints
 * them. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__has_include)
#if __has_include(<execinfo.h>)
#include <execinfo.h>
#define GG__HAVE_BACKTRACE 1
#endif
#endif

#include "arena/arena_bump_internal.h"
#include "arena/arena_base_impl.h"
#include "core/internal.h"

/* Frames of the library's own above the caller's return address: the capture looks this far for it.
 * */
#define GG__SITE_OWN_FRAMES 6

/* How many of them there are (the same for every allocating entry point), learnt on the first
 * capture: later ones unwind only that many more than they keep, at about 1 us a frame. -1: not
 * known yet. */
static _Atomic int gg__own_frames = -1;

struct gg__sites {
  gg__site_t **set; /* interned sites, open addressing by hash */
  size_t set_cap, set_n;
  struct gg__site_slot {
    uintptr_t key; /* a block's address; 0: empty */
    const gg__site_t *site;
  } * at; /* block address → site; linear probing, backward-shift deletion */
  size_t at_cap, at_n;
};

/* ---- the two tables -------------------------------------------------------------------------- */

static size_t gg__slot_of(uintptr_t key, size_t cap) {
  return (size_t)(((uint64_t)key >> 8) * 0x9e3779b97f4a7c15ull >> 20) & (cap - 1);
}

/* Sets key's site; true when the key is new. */
static bool gg__at_put(struct gg__site_slot *at, size_t cap, uintptr_t key, const gg__site_t *s) {
  size_t i = gg__slot_of(key, cap);
  while (at[i].key && at[i].key != key) i = (i + 1) & (cap - 1);
  bool added = !at[i].key;
  at[i] = (struct gg__site_slot){key, s};
  return added;
}

static bool gg__block_live_at(const gg_arena_t *a, uintptr_t p) {
  if (gg__used_get(a, p)) return true;
  long i = gg__bump_find(a, p);
  return i >= 0 && a->bump[i].live && a->bump[i].ptr == p;
}

/* Rebuilds the address table with room for `want` entries, dropping entries whose block is gone
 * (freed blocks are not removed one by one: a new block at the same address overwrites, the rest
 * goes here). */
static int gg__at_rebuild(gg_arena_t *a, size_t want) {
  gg__sites_t *t = a->sites;
  size_t cap = 64;
  while (cap / 2 < want) cap *= 2;
  struct gg__site_slot *at = calloc(cap, sizeof *at);
  if (!at) return GG_ENOMEM;
  size_t n = 0;
  for (size_t i = 0; i < t->at_cap; i++)
    if (t->at[i].key && gg__block_live_at(a, t->at[i].key))
      n += gg__at_put(at, cap, t->at[i].key, t->at[i].site);
  free(t->at);
  t->at = at;
  t->at_cap = cap;
  t->at_n = n;
  return 0;
}

static void gg__at_del(gg__sites_t *t, uintptr_t key) {
  if (!t->at_cap) return;
  size_t i = gg__slot_of(key, t->at_cap), m = t->at_cap - 1;
  while (t->at[i].key && t->at[i].key != key) i = (i + 1) & m;
  if (!t->at[i].key) return;
  t->at_n--;
  for (size_t j = (i + 1) & m; t->at[j].key; j = (j + 1) & m) {
    size_t home = gg__slot_of(t->at[j].key, t->at_cap);
    if (((j - home) & m) >= ((j - i) & m)) { /* j may move back to i */
      t->at[i] = t->at[j];
      i = j;
    }
  }
  t->at[i] = (struct gg__site_slot){0, NULL};
}

static uint64_t gg__site_hash(void *const *pc, int n) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < n; i++) h = (h ^ (uint64_t)(uintptr_t)pc[i]) * 1099511628211ull;
  return h;
}

/* The interned copy of a site; NULL when out of host memory. */
static const gg__site_t *gg__site_intern(gg__sites_t *t, void *const *pc, int n) {
  uint64_t h = gg__site_hash(pc, n);
  if (t->set_n + 1 > t->set_cap / 2) {
    size_t cap = t->set_cap ? 2 * t->set_cap : 64;
    gg__site_t **set = calloc(cap, sizeof *set);
    if (!set) return NULL;
    for (size_t i = 0; i < t->set_cap; i++) {
      if (!t->set[i]) continue;
      size_t j = (size_t)t->set[i]->hash & (cap - 1);
      while (set[j]) j = (j + 1) & (cap - 1);
      set[j] = t->set[i];
    }
    free(t->set);
    t->set = set;
    t->set_cap = cap;
  }
  size_t j = (size_t)h & (t->set_cap - 1);
  for (; t->set[j]; j = (j + 1) & (t->set_cap - 1)) {
    const gg__site_t *s = t->set[j];
    if (s->hash == h && s->n == n && memcmp(s->pc, pc, (size_t)n * sizeof *pc) == 0) return s;
  }
  gg__site_t *s = malloc(sizeof *s);
  if (!s) return NULL;
  s->hash = h;
  s->n = n;
  memcpy(s->pc, pc, (size_t)n * sizeof *pc);
  t->set[j] = s;
  t->set_n++;
  return s;
}

/* ---- for the arena --------------------------------------------------------------------------- */

int gg__sites_create(gg_arena_t *a) {
  a->sites = calloc(1, sizeof *a->sites);
  if (!a->sites)
    return gg__err(GG_ENOMEM, "gg_arena_create: out of host memory for allocation sites");
#ifdef GG__HAVE_BACKTRACE
  /* The first backtrace() loads the unwinder (dlopen): done here, outside the arena's lock. */
  void *pc[2];
  backtrace(pc, 2);
#endif
  return 0;
}

void gg__sites_free(gg_arena_t *a) {
  gg__sites_t *t = a->sites;
  if (!t) return;
  for (size_t i = 0; i < t->set_cap; i++) free(t->set[i]);
  free(t->set);
  free(t->at);
  free(t);
  a->sites = NULL;
}

void gg__site_note(gg_arena_t *a, uintptr_t p, void *caller) {
  gg__sites_t *t = a->sites;
  void *pc[GG__SITE_FRAMES + GG__SITE_OWN_FRAMES];
  int n = 0, from = -1;
#ifdef GG__HAVE_BACKTRACE
  int own = atomic_load_explicit(&gg__own_frames, memory_order_relaxed);
  n = backtrace(pc, own < 0 ? (int)(sizeof pc / sizeof pc[0]) : own + GG__SITE_FRAMES);
  for (int i = 0; i < n && i <= GG__SITE_OWN_FRAMES && from < 0; i++)
    if (pc[i] == caller) from = i;
  if (own < 0 && from >= 0) atomic_store_explicit(&gg__own_frames, from, memory_order_relaxed);
#endif
  if (from < 0) { /* no unwinder, or the caller was not found: one frame */
    pc[0] = caller;
    n = 1;
    from = 0;
  }
  n -= from;
  if (n > GG__SITE_FRAMES) n = GG__SITE_FRAMES;
  const gg__site_t *s = gg__site_intern(t, pc + from, n);
  /* Entries of freed blocks are dropped when the table would grow; a live one per block stays. */
  if (s && t->at_n + 1 > t->at_cap / 2 && gg__at_rebuild(a, 2 * (size_t)a->n_live + 64) < 0)
    s = NULL;
  if (s)
    t->at_n += gg__at_put(t->at, t->at_cap, p, s);
  else
    gg__at_del(t, p); /* no site rather than an older block's */
}

const gg__site_t *gg__site_of(const gg_arena_t *a, uintptr_t p) {
  const gg__sites_t *t = a->sites;
  if (!t || !t->at_cap) return NULL;
  size_t i = gg__slot_of(p, t->at_cap);
  while (t->at[i].key && t->at[i].key != p) i = (i + 1) & (t->at_cap - 1);
  return t->at[i].key ? t->at[i].site : NULL;
}
