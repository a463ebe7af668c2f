/* arena_grow.c — where the arena's memory comes from and goes back to: mapping chunks as it grows
 * (placing them in the reserved range), moving the bump block to the largest free block, and trim,
 * which unmaps wholly free chunks and gives them back to the driver. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena/arena_base_impl.h"
#include "core/internal.h"

/* ---- top ------------------------------------------------------------------------------------- */

/* Whether top stays out of the free block b, on an arena that keeps its holes: then top is listed
 * too (gg__arena_promote), and best fit serves every request, so a small one takes such a hole only
 * when nothing smaller fits. A training step frees large tensors (logits, their gradients) and asks
 * for them again, of the same size, a step later; with the hole as top the next step's small blocks
 * were carved from it first, and the large request, short of room, grew by moving free chunks
 * there. Replayed traces recorded on the H200, 8 MiB chunks, stream always busy: Hugging Face GPT-2
 * moved 633 chunks in the second half of 30 steps (~42 a step, ~57 us each), with this 0, peak
 * mapped / peak in use 1.0117 -> 1.0091; timm ViT-B/16 93 -> 58 moves, 1.0058 -> 1.0058; a GPT-like
 * cross-entropy model 98 -> 5, 1.0014 -> 1.0022. The share is the middle of a range, 1/90 to
 * 1/128, over which GPT-2 stayed at 0 moves (1/64 and 1/80: 331; 1/16 to 1/48: 6 and 1.0106). */
static bool gg__hole_kept(const gg_arena_t *a, const gg__block_t *b) {
  return a->keep_holes && b->size > a->mapped / GG__HOLE_SHARE;
}

/* Bump allocation (and O(1) scope ends) continue in the largest free block. The log is flushed
 * first when top moves below it. */
void gg__arena_promote(gg_arena_t *a) {
  gg__block_t *b = gg__freelist_largest(&a->freelist), *t = a->freelist.top;
  if (!b || (t && t->size >= b->size)) return;
  if (gg__hole_kept(a, b)) {
    if (t && gg__freelist_reserve(&a->freelist, 1) == 0) gg__freelist_drop_top(&a->freelist);
    return;
  }
  if (a->bump_count && b->addr < gg__bump_entry_end(&a->bump[a->bump_count - 1])) {
    if (gg__bump_flush(a) < 0) return; /* keeps the old top: only speed is lost */
    b = gg__freelist_largest(&a->freelist);
    t = a->freelist.top;
    if (!b || (t && t->size >= b->size)) return;
  }
  if (gg__freelist_reserve(&a->freelist, 1) < 0) return;
  /* Top never moves below the log: entries carved from it must stay in address order. */
  GG__ASSERT(!a->bump_count || b->addr >= gg__bump_entry_end(&a->bump[a->bump_count - 1]));
  gg__freelist_set_top(&a->freelist, b);
  a->bump_new_run = true;
}

/* ---- growth ---------------------------------------------------------------------------------- */

/* For GG__ASSERT_EXPENSIVE: chunk records lie in address order without overlap (the lookups
 * bisect them), and aliases are among them. */
static bool gg__chunks_ordered(const gg_arena_t *a) {
  size_t aliases = 0;
  for (size_t i = 0; i < a->n_chunks && i < GG__WALK_MAX; i++) {
    aliases += a->chunks[i]->alias;
    if (i && a->chunks[i - 1]->ptr + a->chunks[i - 1]->size > a->chunks[i]->ptr) return false;
  }
  return a->n_chunks > GG__WALK_MAX || aliases == a->n_alias;
}

size_t gg__chunk_index(const gg_arena_t *a, uintptr_t p) {
  size_t lo = 0, hi = a->n_chunks;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (a->chunks[mid]->ptr < p)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* Where n bytes at alignment al would go in the unmapped gap [gs, ge) (growing the free block that
 * ends at gs, if any); the size to map there, or 0 when they do not fit. */
static size_t gg__gap_fit(const gg_arena_t *a, uintptr_t gs, uintptr_t ge, size_t n, size_t al) {
  if (ge <= gs) return 0;
  const gg__block_t *t = a->freelist.top, *l = (t && t->addr + t->size == gs)
                                                   ? t
                                                   : gg__freelist_ending_at(&a->freelist, gs);
  uintptr_t start = l ? l->addr : gs, p = gg__align_up(start, al);
  if (p < start || p > ge || ge - p < n) return 0;
  size_t m = p + n > gs ? (size_t)gg__align_up(p + n - gs, a->granularity) : a->granularity;
  if (m < a->chunk_size) m = a->chunk_size < ge - gs ? a->chunk_size : (size_t)(ge - gs);
  return m;
}

/* The end of the gap that starts after chunk i - 1 (the next chunk, or the end of the range). */
static uintptr_t gg__gap_end(const gg_arena_t *a, size_t i) {
  return i < a->n_chunks ? a->chunks[i]->ptr : a->base + a->capacity;
}

/* Where and how much to map for n bytes at alignment al: *at and *size, or GG_ENOMEM with `why`. */
static int gg__find_room(gg_arena_t *a, size_t n, size_t al, uintptr_t *at, size_t *size, char *why,
                         size_t whycap) {
  size_t m = 0;
  if (a->contiguous) {
    const gg__block_t *t = a->freelist.top;
    /* Prefer the gap right above top, so the bump block keeps growing in place. */
    if (t) {
      uintptr_t te = t->addr + t->size;
      size_t i = gg__chunk_index(a, te);
      if (i > 0 && a->chunks[i - 1]->ptr + a->chunks[i - 1]->size == te) {
        m = gg__gap_fit(a, te, gg__gap_end(a, i), n, al);
        *at = te;
      }
    }
    for (size_t i = 0; !m && i <= a->n_chunks; i++) {
      *at = i ? a->chunks[i - 1]->ptr + a->chunks[i - 1]->size : a->base;
      m = gg__gap_fit(a, *at, gg__gap_end(a, i), n, al);
    }
    if (!m) {
      snprintf(why, whycap, "the arena's capacity is exhausted");
      return GG_ENOMEM;
    }
  } else {
    size_t slack = al > GG__QUANTUM ? al : 0;
    if (n > a->capacity || slack > a->capacity - n) {
      snprintf(why, whycap, "the request exceeds the capacity");
      return GG_ENOMEM;
    }
    size_t need = (size_t)gg__align_up(n + slack, a->granularity);
    m = need > a->chunk_size ? need : a->chunk_size;
    if (m > a->capacity - a->mapped) m = need;
    if (a->mapped > a->capacity || m > a->capacity - a->mapped) {
      snprintf(why, whycap, "the arena's capacity is exhausted");
      return GG_ENOMEM;
    }
  }
  *size = m;
  return 0;
}

typedef struct gg__pieces {
  gg__chunk_t **made;
  size_t count;
} gg__pieces_t;

static int gg__unmap_pieces(gg_arena_t *a, void *ctx) {
  gg__pieces_t *p = ctx;
  for (size_t k = p->count; k-- > 0;) {
    a->ops->unmap(a->dev, p->made[k]);
    free(p->made[k]);
  }
  return 0;
}

/* Maps `size` bytes at `at` as pieces of `piece` bytes into made[]: all or nothing. */
static int gg__map_pieces(gg_arena_t *a, uintptr_t at, size_t size, size_t piece,
                          gg__chunk_t **made, char *why, size_t whycap) {
  int rc = 0;
  size_t done = 0, k = 0;
  for (; done < size; k++) {
    size_t sz = size - done < piece ? size - done : piece;
    made[k] = malloc(sizeof **made);
    if (!made[k]) {
      rc = gg__err(GG_ENOMEM, "arena: out of host memory for a chunk record");
      break;
    }
    rc = a->ops->map(a->dev, a->contiguous ? at + done : 0, sz, made[k]);
    if (rc < 0) {
      snprintf(why, whycap, "mapping %zu bytes failed: %s", sz, gg_last_error());
      free(made[k]);
      break;
    }
    done += sz;
  }
  if (rc < 0)
    gg__arena_quietly(a, gg__unmap_pieces, &(gg__pieces_t){made, k}); /* the map error stays */
  return rc;
}

/* ---- moving free chunks ---------------------------------------------------------------------- */

/* Unmaps aliases and drops their records: those no queued work may still use, keeping one whose
 * unmap fails for a later try; or, with `all` (destroy), every one, whatever the unmap says. The
 * first error is returned. */
static int gg__drop_aliases_where(gg_arena_t *a, bool all) {
  int rc = 0;
  size_t w = 0;
  for (size_t r = 0; r < a->n_chunks; r++) {
    gg__chunk_t *c = a->chunks[r];
    bool go = c->alias && (all || gg__arena_range_idle(a, c->ptr, c->size));
    int u = go ? a->ops->unmap(a->dev, c) : 0;
    GG_KEEP_FIRST(rc, u);
    if (go && (all || u == 0)) {
      free(c);
      a->n_alias--;
    } else {
      a->chunks[w++] = c;
    }
  }
  a->n_chunks = w;
  GG__ASSERT(a->n_alias <= a->n_chunks);
  return rc;
}

static int gg__drop_idle_aliases(gg_arena_t *a, void *unused) {
  (void)unused;
  return gg__drop_aliases_where(a, false);
}

void gg__arena_drop_aliases(gg_arena_t *a) {
  if (!a->n_alias) {
    return;
  }
  gg__arena_ordered_poll(a);
  gg__arena_quietly(a, gg__drop_idle_aliases, NULL); /* a failed unmap is tried again later */
}

/* Where the moves of one growth go: [at, at + m), filled from the bottom; made[] gets the records.
 */
typedef struct gg__move {
  uintptr_t at;
  size_t m, moved;
  gg__chunk_t **made;
  size_t count;
  bool failed;
} gg__move_t;

typedef struct gg__remap {
  gg__chunk_t *chunk, *alias;
  uintptr_t to;
} gg__remap_t;

static int gg__remap_step(gg_arena_t *a, void *ctx) {
  gg__remap_t *r = ctx;
  return a->ops->remap(a->dev, r->chunk, r->to, r->alias);
}

/* Moves chunk i (wholly free) to mv->at + mv->moved: its record goes to made[], an alias record of
 * its old range takes its place in chunks[]. False when the remap failed (nothing changed). */
static bool gg__move_chunk(gg_arena_t *a, size_t i, gg__move_t *mv) {
  gg__chunk_t *alias = malloc(sizeof *alias);
  if (!alias) {
    return false;
  }
  gg__chunk_t *c = a->chunks[i];
  gg__remap_t r = {.chunk = c, .alias = alias, .to = mv->at + mv->moved};
  if (gg__arena_quietly(a, gg__remap_step, &r) < 0) {
    free(alias);
    return false;
  }
  a->chunks[i] = alias;
  a->n_alias++;
  a->n_moves++;
  mv->made[mv->count++] = c;
  mv->moved += c->size;
  return true;
}

/* Moves the chunks free block fb covers wholly while they fit what is left of the growth; what is
 * left of fb around them stays free. */
static void gg__move_from_block(gg_arena_t *a, gg__block_t *fb, gg__move_t *mv) {
  uintptr_t lo = fb->addr;
  uintptr_t hi = fb->addr + fb->size;
  size_t i0 = gg__chunk_index(a, lo);
  size_t j = i0;
  size_t before = mv->count;
  while (j < a->n_chunks && a->chunks[j]->ptr + a->chunks[j]->size <= hi) {
    j++;
  }
  for (size_t k = i0; k < j && !mv->failed && mv->moved < mv->m; k++) {
    if (a->chunks[k]->size <= mv->m - mv->moved && !gg__move_chunk(a, k, mv)) {
      mv->failed = true;
    }
  }
  if (mv->count == before) {
    return;
  }
  void *seg = fb->seg;
  gg__freelist_remove(&a->freelist, fb);
  uintptr_t cur = lo;
  for (size_t k = i0; k < j; k++) {
    const gg__chunk_t *c = a->chunks[k];
    if (!c->alias) {
      continue;
    }
    if (c->ptr > cur) {
      gg__freelist_put_plain(&a->freelist, cur, c->ptr - cur, seg);
    }
    cur = c->ptr + c->size;
  }
  if (hi > cur) {
    gg__freelist_put_plain(&a->freelist, cur, hi - cur, seg);
  }
  gg__freelist_give_record(&a->freelist, fb);
}

/* A growth that would raise peak mapped takes the memory of wholly free chunks first: each is
 * mapped where the growth needs it (no new memory, no host wait), its old range kept as an alias
 * until the work queued before its release is done (gg__arena_drop_aliases). In stream order the
 * work given the new block runs after that work, exactly as for a block reused in place. Only an
 * arena that tracks its stream moves: a GG_ARENA_NO_STREAM arena cannot know when an old range
 * is no longer used (a CUDA graph's pool: its replays run in the addresses its capture freed).
 * Chunks come from the largest free blocks first, never from the one the growth extends (it ends at
 * `at`). Traces of GPT-2 and ViT-B/16 training recorded on the H200 (batch and sequence length
 * changing every step) replayed with the stream always busy: peak mapped / peak in use 1.19 and
 * 1.10 with giving free chunks back first (which needs the stream idle) against 1.012 and 1.006;
 * smallest blocks first gave 1.016 and 1.006 for twice the moves on GPT-2 (each costs ~57 us on
 * the H200: cuMemMap 2, cuMemSetAccess 34, the alias's cuMemUnmap 21). */
static void gg__move_free_chunks(gg_arena_t *a, gg__move_t *mv) {
  if (!a->contiguous || !a->ops->remap || !a->track || a->freelist.bytes < a->granularity ||
      a->mapped + mv->m <= a->peak_mapped) {
    return;
  }
  size_t nf = a->freelist.count + 1;
  gg__block_t **fs = malloc(nf * sizeof *fs);
  if (!fs || gg__bump_flush(a) < 0 ||
      gg__freelist_reserve(&a->freelist, a->n_chunks + nf + 2) < 0) {
    free(fs);
    return;
  }
  gg__freelist_drop_top(&a->freelist);
  nf = gg__freelist_list(&a->freelist, fs, nf);
  for (size_t k = nf; k-- > 0 && !mv->failed && mv->moved < mv->m;) { /* larger classes first */
    if (fs[k]->addr + fs[k]->size != mv->at) {
      gg__move_from_block(a, fs[k], mv);
    }
  }
  free(fs);
  if (mv->count) {
    gg__arena_ordered_poll(a); /* an event now: the aliases go once the work before it is done */
  }
}

int gg__arena_grow(gg_arena_t *a, size_t n, size_t al, char *why, size_t whycap) {
  gg__arena_drop_aliases(a);
  uintptr_t at = 0;
  size_t m = 0;
  int rc = gg__find_room(a, n, al, &at, &m, why, whycap);
  if (rc < 0) return rc;
  /* With VMM a large request is mapped as chunk-sized pieces at consecutive addresses: one block to
   * the allocator, but trim can later give back each piece that no live block touches, so a big
   * mapping that small blocks reuse does not stay pinned whole (and a growth finds whole pieces to
   * reuse). */
  size_t piece = a->contiguous && m > a->chunk_size ? a->chunk_size : m;
  /* Records: the fresh pieces, and at most one per chunk that may move (each at least a granule).
   */
  size_t movable = a->n_chunks - a->n_alias;
  size_t most = (m + piece - 1) / piece;
  if (a->contiguous) most += m / a->granularity < movable ? m / a->granularity : movable;
  rc = gg__arena_grow_array(&a->chunks, &a->chunks_cap, a->n_chunks + most, sizeof *a->chunks);
  if (rc == 0) rc = gg__freelist_reserve(&a->freelist, 2);
  if (rc < 0) return rc;
  gg__move_t mv = {.at = at, .m = m, .made = malloc(most * sizeof *mv.made)};
  if (!mv.made) return gg__err(GG_ENOMEM, "arena: out of host memory for chunk records");
  gg__move_free_chunks(a, &mv);
  size_t fresh = m - mv.moved;
  if (fresh && a->limit < a->capacity && (a->mapped > a->limit || fresh > a->limit - a->mapped)) {
    snprintf(why, whycap, "the arena's limit of %zu bytes (gg_arena_set_limit) is reached",
             a->limit);
    rc = GG_ENOMEM;
  } else if (fresh) {
    rc = gg__map_pieces(a, at + mv.moved, fresh, piece, mv.made + mv.count, why, whycap);
  }
  size_t added = mv.count + (rc == 0 && fresh ? (fresh + piece - 1) / piece : 0);
  if (added) {
    size_t i = gg__chunk_index(a, mv.made[0]->ptr);
    GG__ASSERT(i == 0 || a->chunks[i - 1]->ptr + a->chunks[i - 1]->size <= mv.made[0]->ptr);
    memmove(a->chunks + i + added, a->chunks + i, (a->n_chunks - i) * sizeof *a->chunks);
    memcpy(a->chunks + i, mv.made, added * sizeof *mv.made);
    a->n_chunks += added;
    a->n_maps += added - mv.count;
    if (rc == 0) a->mapped += fresh;
    GG__ASSERT(a->mapped <= a->capacity); /* growth maps inside the reserved range only */
    GG__ASSERT_EXPENSIVE(gg__chunks_ordered(a));
    if (a->mapped > a->peak_mapped) a->peak_mapped = a->mapped;
    size_t placed = rc == 0 ? m : mv.moved;
    gg__freelist_put(&a->freelist, mv.made[0]->ptr, placed, a->contiguous ? NULL : mv.made[0],
                     NULL);
  }
  free(mv.made);
  gg__arena_promote(a);
  return rc;
}

/* ---- trim ------------------------------------------------------------------------------------ */

/* Only when the growth would raise peak mapped: free memory in the wrong place is then not kept
 * mapped beside the new mapping, which keeps peak mapped close to peak in use when request sizes
 * vary from step to step. Below the peak the arena keeps what it has (no map/unmap churn; trim()
 * gives it back). The trim never waits (gg__arena_trim_idle_locked); it runs only when a free
 * block, or what the bump log frees once compacted, could hold a whole chunk. */
bool gg__arena_trim_before_growth(const gg_arena_t *a, size_t n) {
  /* A backend that remaps moves free chunks to where the growth needs them instead (arenas that
   * track their stream: only they know when an old range is no longer used). */
  if (!a->contiguous || (a->ops->remap && a->track) || a->freelist.bytes < 2 * a->chunk_size)
    return false;
  size_t grow = (size_t)gg__align_up(n, a->granularity);
  if (grow < a->chunk_size) grow = a->chunk_size;
  if (a->mapped + grow <= a->peak_mapped) return false;
  /* Worth a trim only when what would come back is at least 2 chunks and 1/64 of what is mapped
   * (the unmapped memory is mapped again soon after, and each map and unmap is a driver call). With
   * an absolute threshold alone, a decoder's forward pass that outgrew its peak trimmed at almost
   * every growth, for a few chunks of a multi-GiB mapping: 42 trims in 30 steps of its trace, 14
   * with the share; peak mapped / peak in use 1.0030 -> 1.0049. Now that the trim never waits,
   * 1/256 of what is mapped, or the total free instead of the largest block, changed the replayed
   * traces by -0.0006 to +0.0005 (a ViT-like one 1.0174 -> 1.0154) for 1.1-2.9x the trims. */
  size_t worth = a->mapped / 64 > 2 * a->chunk_size ? a->mapped / 64 : 2 * a->chunk_size;
  const gg__block_t *b = gg__freelist_largest(&a->freelist), *t = a->freelist.top;
  size_t largest = b ? b->size : 0;
  if (t && t->size > largest) largest = t->size;
  return largest >= worth ||
         gg__bump_dead_bytes(a) >= worth; /* dead bump bytes: free once compacted */
}

static int gg__addr_desc(const void *x, const void *y) {
  uintptr_t a = (*(gg__block_t *const *)x)->addr, b = (*(gg__block_t *const *)y)->addr;
  return a < b ? 1 : a > b ? -1 : 0;
}

/* Unmaps the chunks that free block fb covers wholly, highest first, while more than keep bytes
 * stay mapped (with `idle_only`, only chunks no queued work may still use: the others stay mapped
 * and free): each run of adjacent chunks that may go in one backend call (one driver call where the
 * driver takes a range). Their records stay in a->chunks, marked in gone[], until the trim ends, so
 * the array is compacted once rather than once per chunk. What is left of fb goes back as free
 * blocks. Adds the bytes unmapped to *returned. */
static int gg__trim_block(gg_arena_t *a, gg__block_t *fb, size_t keep, bool idle_only, bool *gone,
                          size_t *returned) {
  int rc = 0;
  GG__ASSERT(fb->state == GG__BLOCK_FREE); /* only free memory is unmapped */
  uintptr_t lo = fb->addr, hi = fb->addr + fb->size;
  void *seg = fb->seg;
  size_t i0 = gg__chunk_index(a, lo), j = i0;
  while (j < a->n_chunks && a->chunks[j]->ptr + a->chunks[j]->size <= hi) j++;
  bool taken = false;
  while (rc == 0 && j > i0) {
    const gg__chunk_t *c = a->chunks[j - 1];
    if (a->mapped - c->size < keep || (idle_only && !gg__arena_range_idle(a, c->ptr, c->size))) {
      j--; /* stays: keep would not be met, or queued work may still use it */
      continue;
    }
    size_t top = j, m = a->mapped;
    while (j > i0 && m - a->chunks[j - 1]->size >= keep &&
           (!idle_only || gg__arena_range_idle(a, a->chunks[j - 1]->ptr, a->chunks[j - 1]->size)))
      m -= a->chunks[--j]->size;
    if (!taken) {
      gg__freelist_remove(&a->freelist, fb);
      taken = true;
    }
    size_t done = 0;
    rc = a->ops->unmap_run(a->dev, a->chunks + j, top - j, &done);
    if (!done) break;
    const gg__chunk_t *t = a->chunks[top - 1];
    if (t->ptr + t->size < hi)
      gg__freelist_put_plain(&a->freelist, t->ptr + t->size, hi - (t->ptr + t->size), seg);
    hi = a->chunks[top - done]->ptr;
    GG__ASSERT(done <= top - j &&
               a->chunks[top - done]->ptr >= lo); /* unmapped inside the free block */
    for (size_t k = top - done; k < top; k++) {
      GG__ASSERT(!gone[k] && a->mapped >= a->chunks[k]->size); /* each chunk unmapped once */
      gone[k] = true;
      a->mapped -= a->chunks[k]->size;
      *returned += a->chunks[k]->size;
    }
  }
  if (taken) {
    if (hi > lo) gg__freelist_put_plain(&a->freelist, lo, hi - lo, seg);
    gg__freelist_give_record(&a->freelist, fb);
  }
  return rc;
}

/* Unmaps the chunks free blocks cover wholly; a free block that covers chunks is split around them;
 * a failed unmap leaves the rest as it was. */
static int gg__trim_free_chunks(gg_arena_t *a, size_t keep, bool idle_only) {
  int rc = 0;
  if (!a->n_chunks) return 0;
  size_t nf = a->freelist.count + 1;
  gg__block_t **fs = malloc(nf * sizeof *fs);
  bool *gone = calloc(a->n_chunks, sizeof *gone);
  if (fs && gone) rc = gg__freelist_reserve(&a->freelist, a->n_chunks + nf + 2);
  if (!fs || !gone || rc < 0) {
    free(fs);
    free(gone);
    return rc < 0 ? rc : gg__err(GG_ENOMEM, "gg_arena_trim: out of host memory");
  }
  gg__freelist_drop_top(&a->freelist);
  nf = gg__freelist_list(&a->freelist, fs, nf);
  qsort(fs, nf, sizeof *fs, gg__addr_desc);
  size_t returned = 0;
  for (size_t k = 0; k < nf && rc == 0; k++)
    rc = gg__trim_block(a, fs[k], keep, idle_only, gone, &returned);
  size_t w = 0;
  for (size_t r = 0; r < a->n_chunks; r++) {
    if (gone[r])
      free(a->chunks[r]);
    else
      a->chunks[w++] = a->chunks[r];
  }
  a->n_unmaps += a->n_chunks - w;
  a->n_chunks = w;
  GG__ASSERT_EXPENSIVE(gg__chunks_ordered(a));
  free(fs);
  free(gone);
  if (returned) {
    a->n_trims++;
    a->bytes_trimmed += returned;
  }
  gg__arena_promote(a);
  return rc;
}

int gg__arena_trim_locked(gg_arena_t *a, size_t keep) {
  int rc;
  gg__tcache_give_back_all(a, false); /* threads' caches keep no free memory mapped */
  rc = gg__bump_flush(a);
  if (rc == 0) rc = gg__arena_wait_pending(a);
  if (rc < 0) return rc;
  if (!a->n_chunks) return 0;
  /* Releases made in stream order (gg_free_on) are free at once but may still be read by
   * work queued before them: memory is unmapped only once the stream has run all of it (a wait only
   * when some of it is not known done). */
  rc = gg__arena_ordered_wait(a);
  if (rc < 0) return rc;
  gg__arena_drop_aliases(a);
  return gg__trim_free_chunks(a, keep, false);
}

/* Never waits: releases still pending stay so (the ladder merged what is done), threads' caches
 * keep their blocks (their chunks are not wholly free), and a chunk whose last stream-ordered user
 * may still run stays mapped: the growth maps beside it instead, and a later growth gives it back.
 */
int gg__arena_trim_idle_locked(gg_arena_t *a) {
  if (!a->n_chunks || gg__bump_flush(a) < 0) return 0;
  gg__arena_ordered_poll(a);
  gg__arena_drop_aliases(a);
  return gg__trim_free_chunks(a, 0, true);
}

/* Destroy and teardown: every chunk, in runs of adjacent chunks; a run that fails is finished chunk
 * by chunk, so one failure does not keep the rest mapped. The first error is returned. */
int gg__arena_unmap_all(gg_arena_t *a) {
  int rc = a->n_alias ? gg__drop_aliases_where(a, true) : 0; /* first: runs never hold one */
  for (size_t i = 0, j; i < a->n_chunks; i = j) {
    for (j = i + 1; a->contiguous && j < a->n_chunks; j++)
      if (a->chunks[j - 1]->ptr + a->chunks[j - 1]->size != a->chunks[j]->ptr) break;
    size_t done = 0;
    int r = a->ops->unmap_run(a->dev, a->chunks + i, j - i, &done);
    GG_KEEP_FIRST(rc, r);
    for (size_t k = j - done; r < 0 && k-- > i;)
      GG_KEEP_FIRST(rc, a->ops->unmap(a->dev, a->chunks[k]));
  }
  for (size_t i = 0; i < a->n_chunks; i++) free(a->chunks[i]);
  a->n_chunks = 0;
  a->mapped = 0;
  return rc;
}

int gg_arena_trim(gg_arena_t *a, size_t keep_bytes) {
  int rc = gg__arena_enter(a, "gg_arena_trim");
  if (rc < 0) return rc;
  rc = gg__arena_trim_locked(a, keep_bytes);
  gg__arena_leave(a);
  return rc;
}
