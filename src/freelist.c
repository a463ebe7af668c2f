/* freelist.c — an arena's free memory: best-fit treap, O(1) coalescing through boundary maps, the bump
 * block, and the pool of block records. Not thread-safe: the arena's lock covers it. */
#include <stdlib.h>
#include <string.h>

#include "freelist.h"
#include "internal.h"

/* ---- address maps ------------------------------------------------------------------------------ */

/* Addresses are multiples of 256: drop those bits, then a Fibonacci multiply spreads the rest. */
static size_t gg__ahash(uintptr_t key, size_t cap) {
  return (size_t)(((uint64_t)(key >> 8) * 0x9E3779B97F4A7C15ull) >> 17) & (cap - 1);
}

static int gg__amap_grow(gg__amap_t *m, size_t want) {
  size_t cap = m->cap ? m->cap : 64;
  while (want > cap / 2) cap *= 2;
  if (cap == m->cap) return 0;
  struct gg__aslot *s = calloc(cap, sizeof *s);
  if (!s) return gg__err(GG_ENOMEM, "arena: out of host memory for block metadata (%zu slots)", cap);
  for (size_t i = 0; i < m->cap; i++) {
    if (!m->slots[i].key) continue;
    size_t j = gg__ahash(m->slots[i].key, cap);
    while (s[j].key) j = (j + 1) & (cap - 1);
    s[j] = m->slots[i];
  }
  free(m->slots);
  m->slots = s, m->cap = cap;
  return 0;
}

int gg__amap_reserve(gg__amap_t *m, size_t extra) {
  if (GG__LIKELY(m->n + extra <= m->cap / 2)) return 0;
  return gg__amap_grow(m, m->n + extra);
}

void gg__amap_put(gg__amap_t *m, uintptr_t key, gg__blk_t *val) {
  size_t j = gg__ahash(key, m->cap);
  while (m->slots[j].key && m->slots[j].key != key) j = (j + 1) & (m->cap - 1);
  if (!m->slots[j].key) m->n++;
  m->slots[j].key = key, m->slots[j].val = val;
}

gg__blk_t *gg__amap_get(const gg__amap_t *m, uintptr_t key) {
  if (!m->cap) return NULL;
  for (size_t j = gg__ahash(key, m->cap);; j = (j + 1) & (m->cap - 1)) {
    if (m->slots[j].key == key) return m->slots[j].val;
    if (!m->slots[j].key) return NULL;
  }
}

gg__blk_t *gg__amap_del(gg__amap_t *m, uintptr_t key) {
  if (!m->cap) return NULL;
  size_t mask = m->cap - 1, j = gg__ahash(key, m->cap);
  while (m->slots[j].key != key) {
    if (!m->slots[j].key) return NULL;
    j = (j + 1) & mask;
  }
  gg__blk_t *val = m->slots[j].val;
  /* Backward shift: pull later members of the probe run into the hole so lookups never stop early. */
  for (size_t k = (j + 1) & mask; m->slots[k].key; k = (k + 1) & mask) {
    size_t home = gg__ahash(m->slots[k].key, m->cap);
    if (((k - home) & mask) >= ((k - j) & mask)) m->slots[j] = m->slots[k], j = k;
  }
  m->slots[j].key = 0, m->slots[j].val = NULL;
  m->n--;
  return val;
}

void gg__amap_free(gg__amap_t *m) {
  free(m->slots);
  memset(m, 0, sizeof *m);
}

/* ---- record pool ------------------------------------------------------------------------------- */

#define GG__SLAB 256

int gg__fl_reserve(gg__fl_t *fl, size_t k) {
  int rc;
  if ((rc = gg__amap_reserve(&fl->by_start, k)) < 0 || (rc = gg__amap_reserve(&fl->by_end, k)) < 0) return rc;
  while (fl->nspare < k) {
    void **slabs = realloc(fl->slabs, (fl->nslabs + 1) * sizeof *slabs);
    if (!slabs) return gg__err(GG_ENOMEM, "arena: out of host memory for block records");
    fl->slabs = slabs;
    gg__blk_t *s = calloc(GG__SLAB, sizeof *s);
    if (!s) return gg__err(GG_ENOMEM, "arena: out of host memory for block records");
    fl->slabs[fl->nslabs++] = s;
    for (size_t i = 0; i < GG__SLAB; i++) gg__fl_give_rec(fl, &s[i]);
  }
  return 0;
}

gg__blk_t *gg__fl_take_rec(gg__fl_t *fl) {
  gg__blk_t *b = fl->spare;
  fl->spare = b->r, fl->nspare--;
  memset(b, 0, sizeof *b);
  return b;
}

void gg__fl_give_rec(gg__fl_t *fl, gg__blk_t *b) {
  b->state = GG__BLK_SPARE;
  b->r = fl->spare, fl->spare = b, fl->nspare++;
}

void gg__fl_free(gg__fl_t *fl) {
  for (size_t i = 0; i < fl->nslabs; i++) free(fl->slabs[i]);
  free(fl->slabs);
  gg__amap_free(&fl->by_start);
  gg__amap_free(&fl->by_end);
  memset(fl, 0, sizeof *fl);
}

/* ---- treap by (size, addr) --------------------------------------------------------------------- */

/* Priorities are a hash of the address: no random state, and reproducible shapes in tests. */
static uint32_t gg__prio(const gg__blk_t *b) {
  uint64_t x = (uint64_t)b->addr;
  x ^= x >> 33, x *= 0xff51afd7ed558ccdull, x ^= x >> 33, x *= 0xc4ceb9fe1a85ec53ull, x ^= x >> 33;
  return (uint32_t)x;
}

static bool gg__less(const gg__blk_t *a, const gg__blk_t *b) {
  return a->size < b->size || (a->size == b->size && a->addr < b->addr);
}

static void gg__split(gg__blk_t *t, const gg__blk_t *k, gg__blk_t **lo, gg__blk_t **hi) {
  if (!t) {
    *lo = *hi = NULL;
  } else if (gg__less(t, k)) {
    gg__split(t->r, k, &t->r, hi);
    *lo = t;
  } else {
    gg__split(t->l, k, lo, &t->l);
    *hi = t;
  }
}

static gg__blk_t *gg__merge(gg__blk_t *a, gg__blk_t *b) {
  if (!a) return b;
  if (!b) return a;
  if (gg__prio(a) > gg__prio(b)) {
    a->r = gg__merge(a->r, b);
    return a;
  }
  b->l = gg__merge(a, b->l);
  return b;
}

static gg__blk_t *gg__tins(gg__blk_t *t, gg__blk_t *n) {
  if (!t) return n;
  if (gg__prio(n) > gg__prio(t)) {
    gg__split(t, n, &n->l, &n->r);
    return n;
  }
  if (gg__less(n, t))
    t->l = gg__tins(t->l, n);
  else
    t->r = gg__tins(t->r, n);
  return t;
}

static gg__blk_t *gg__tdel(gg__blk_t *t, gg__blk_t *n) {
  if (t == n) return gg__merge(n->l, n->r);
  if (gg__less(n, t))
    t->l = gg__tdel(t->l, n);
  else
    t->r = gg__tdel(t->r, n);
  return t;
}

/* ---- free memory ------------------------------------------------------------------------------- */

static void gg__fl_link(gg__fl_t *fl, gg__blk_t *b) {
  b->state = GG__BLK_FREE, b->l = b->r = NULL;
  fl->root = gg__tins(fl->root, b);
  gg__amap_put(&fl->by_start, b->addr, b);
  gg__amap_put(&fl->by_end, b->addr + b->size, b);
  fl->count++;
}

void gg__fl_remove(gg__fl_t *fl, gg__blk_t *b) {
  fl->root = gg__tdel(fl->root, b);
  gg__amap_del(&fl->by_start, b->addr);
  gg__amap_del(&fl->by_end, b->addr + b->size);
  fl->count--, fl->bytes -= b->size;
  b->l = b->r = NULL;
}

void gg__fl_put_plain(gg__fl_t *fl, uintptr_t addr, size_t size, void *seg) {
  gg__blk_t *b = gg__fl_take_rec(fl);
  b->addr = addr, b->size = size, b->seg = seg;
  fl->bytes += size;
  gg__fl_link(fl, b);
}

gg__blk_t *gg__fl_put(gg__fl_t *fl, uintptr_t addr, size_t size, void *seg, gg__blk_t *rec) {
  gg__blk_t *t = fl->top, *n;
  fl->bytes += size;
  /* The neighbour below: top, or a treap block ending where this range starts. */
  if (t && t->seg == seg && t->addr + t->size == addr) {
    t->size += size;
    if ((n = gg__amap_get(&fl->by_start, addr + size)) && n->seg == seg) {
      gg__fl_remove(fl, n);
      fl->bytes += n->size, t->size += n->size;
      gg__fl_give_rec(fl, n);
    }
    if (rec) gg__fl_give_rec(fl, rec);
    return t;
  }
  if ((n = gg__amap_get(&fl->by_end, addr)) && n->seg == seg) {
    gg__fl_remove(fl, n);
    fl->bytes += n->size, addr = n->addr, size += n->size;
    gg__fl_give_rec(fl, n);
  }
  /* The neighbour above: top (which then grows down over the range), or a treap block. */
  if (t && t->seg == seg && t->addr == addr + size) {
    t->addr = addr, t->size += size;
    if (rec) gg__fl_give_rec(fl, rec);
    return t;
  }
  if ((n = gg__amap_get(&fl->by_start, addr + size)) && n->seg == seg) {
    gg__fl_remove(fl, n);
    fl->bytes += n->size, size += n->size;
    gg__fl_give_rec(fl, n);
  }
  if (!rec) rec = gg__fl_take_rec(fl);
  memset(rec, 0, sizeof *rec);
  rec->addr = addr, rec->size = size, rec->seg = seg;
  gg__fl_link(fl, rec);
  return rec;
}

static bool gg__fits(const gg__blk_t *b, size_t n, size_t a) {
  uintptr_t p = gg__align_up(b->addr, a);
  return p - b->addr <= b->size && b->size - (p - b->addr) >= n;
}

/* The in-order successor of b: the smallest key above it, found from the root (no parent links). */
static gg__blk_t *gg__succ(const gg__fl_t *fl, const gg__blk_t *b) {
  gg__blk_t *best = NULL;
  for (gg__blk_t *t = fl->root; t;) {
    if (gg__less(b, t))
      best = t, t = t->l;
    else
      t = t->r;
  }
  return best;
}

static gg__blk_t *gg__lower_bound(const gg__fl_t *fl, size_t n) {
  gg__blk_t *best = NULL;
  for (gg__blk_t *t = fl->root; t;) {
    if (t->size >= n)
      best = t, t = t->l;
    else
      t = t->r;
  }
  return best;
}

gg__blk_t *gg__fl_fit(const gg__fl_t *fl, size_t n, size_t a) {
  gg__blk_t *b = gg__lower_bound(fl, n);
  if (!b || a <= GG__QUANTUM) return b; /* every block is 256-aligned: the first big enough fits */
  /* Over-aligned: try a few of the next sizes, then a size that fits wherever it starts. */
  for (int i = 0; b && i < 8; i++, b = gg__succ(fl, b))
    if (gg__fits(b, n, a)) return b;
  if (n > SIZE_MAX - a) return NULL;
  return gg__lower_bound(fl, n + a - GG__QUANTUM);
}

uintptr_t gg__fl_carve(gg__fl_t *fl, gg__blk_t *b, size_t n, size_t a) {
  gg__fl_remove(fl, b);
  uintptr_t p = gg__align_up(b->addr, a), end = b->addr + b->size;
  /* b was maximal, so its pieces have no free neighbours. */
  if (p > b->addr) gg__fl_put_plain(fl, b->addr, p - b->addr, b->seg);
  if (p + n < end) gg__fl_put_plain(fl, p + n, end - (p + n), b->seg);
  b->addr = p, b->size = n;
  return p;
}

gg__blk_t *gg__fl_largest(const gg__fl_t *fl) {
  gg__blk_t *t = fl->root;
  while (t && t->r) t = t->r;
  return t;
}

void gg__fl_untop(gg__fl_t *fl) {
  gg__blk_t *t = fl->top;
  if (!t) return;
  fl->top = NULL;
  if (t->size)
    gg__fl_link(fl, t); /* top never touches a treap block: the two would have merged */
  else
    gg__fl_give_rec(fl, t);
}

void gg__fl_set_top(gg__fl_t *fl, gg__blk_t *b) {
  gg__fl_remove(fl, b);
  fl->bytes += b->size; /* still free: it only moves out of the treap */
  gg__fl_untop(fl);
  b->state = GG__BLK_TOP;
  fl->top = b;
}

static size_t gg__walk(const gg__blk_t *t, gg__blk_t **out, size_t cap, size_t i) {
  if (!t) return i;
  i = gg__walk(t->l, out, cap, i);
  if (i < cap) out[i] = (gg__blk_t *)t;
  return gg__walk(t->r, out, cap, i + 1);
}

size_t gg__fl_list(const gg__fl_t *fl, gg__blk_t **out, size_t cap) {
  return gg__walk(fl->root, out, cap, 0);
}

static const char *gg__tcheck(const gg__fl_t *fl, const gg__blk_t *t, size_t *n, size_t *bytes) {
  if (!t) return NULL;
  const char *w;
  if (t->state != GG__BLK_FREE) return "a treap block is not FREE";
  if (t->l && (!gg__less(t->l, t) || gg__prio(t->l) > gg__prio(t))) return "treap order broken (left)";
  if (t->r && (!gg__less(t, t->r) || gg__prio(t->r) > gg__prio(t))) return "treap order broken (right)";
  if (gg__amap_get(&fl->by_start, t->addr) != t || gg__amap_get(&fl->by_end, t->addr + t->size) != t)
    return "a free block is missing from the boundary maps";
  (*n)++, *bytes += t->size;
  if ((w = gg__tcheck(fl, t->l, n, bytes)) || (w = gg__tcheck(fl, t->r, n, bytes))) return w;
  return NULL;
}

const char *gg__fl_check(const gg__fl_t *fl) {
  size_t n = 0, bytes = fl->top ? fl->top->size : 0;
  const char *w = gg__tcheck(fl, fl->root, &n, &bytes);
  if (w) return w;
  if (n != fl->count || fl->by_start.n != n || fl->by_end.n != n) return "free block count mismatch";
  if (bytes != fl->bytes) return "free byte count mismatch";
  if (fl->top && fl->top->state != GG__BLK_TOP) return "top is not marked TOP";
  return NULL;
}
