/* freelist.c — an arena's free memory: best-fit treap, O(1) coalescing through boundary maps, the bump
 * block, and the pool of block records. Not thread-safe: the arena's lock covers it. */
#include <stdlib.h>
#include <string.h>

#include "freelist.h"
#include "internal.h"

/* ---- address maps ------------------------------------------------------------------------------ */

/* Addresses are multiples of 256: drop those bits, then a Fibonacci multiply spreads the rest. */
static size_t gg__addr_hash(uintptr_t key, size_t cap) {
  return (size_t)(((uint64_t)(key >> 8) * 0x9E3779B97F4A7C15ull) >> 17) & (cap - 1);
}

static int gg__addr_map_grow(gg__addr_map_t *m, size_t want) {
  size_t cap = m->cap ? m->cap : 64;
  while (want > cap / 2) cap *= 2;
  if (cap == m->cap) return 0;
  struct gg__addr_slot *s = calloc(cap, sizeof *s);
  if (!s) return gg__err(GG_ENOMEM, "arena: out of host memory for block metadata (%zu slots)", cap);
  for (size_t i = 0; i < m->cap; i++) {
    if (!m->slots[i].key) continue;
    size_t j = gg__addr_hash(m->slots[i].key, cap);
    while (s[j].key) j = (j + 1) & (cap - 1);
    s[j] = m->slots[i];
  }
  free(m->slots);
  m->slots = s, m->cap = cap;
  return 0;
}

int gg__addr_map_reserve(gg__addr_map_t *m, size_t extra) {
  if (GG__LIKELY(m->n + extra <= m->cap / 2)) return 0;
  return gg__addr_map_grow(m, m->n + extra);
}

void gg__addr_map_put(gg__addr_map_t *m, uintptr_t key, gg__block_t *val) {
  size_t j = gg__addr_hash(key, m->cap);
  while (m->slots[j].key && m->slots[j].key != key) j = (j + 1) & (m->cap - 1);
  if (!m->slots[j].key) m->n++;
  m->slots[j].key = key, m->slots[j].val = val;
}

gg__block_t *gg__addr_map_get(const gg__addr_map_t *m, uintptr_t key) {
  if (!m->cap) return NULL;
  for (size_t j = gg__addr_hash(key, m->cap);; j = (j + 1) & (m->cap - 1)) {
    if (m->slots[j].key == key) return m->slots[j].val;
    if (!m->slots[j].key) return NULL;
  }
}

gg__block_t *gg__addr_map_del(gg__addr_map_t *m, uintptr_t key) {
  if (!m->cap) return NULL;
  size_t mask = m->cap - 1, j = gg__addr_hash(key, m->cap);
  while (m->slots[j].key != key) {
    if (!m->slots[j].key) return NULL;
    j = (j + 1) & mask;
  }
  gg__block_t *val = m->slots[j].val;
  /* Backward shift: pull later members of the probe run into the hole so lookups never stop early. */
  for (size_t k = (j + 1) & mask; m->slots[k].key; k = (k + 1) & mask) {
    size_t home = gg__addr_hash(m->slots[k].key, m->cap);
    if (((k - home) & mask) >= ((k - j) & mask)) m->slots[j] = m->slots[k], j = k;
  }
  m->slots[j].key = 0, m->slots[j].val = NULL;
  m->n--;
  return val;
}

void gg__addr_map_free(gg__addr_map_t *m) {
  free(m->slots);
  memset(m, 0, sizeof *m);
}

/* ---- record pool ------------------------------------------------------------------------------- */

#define GG__SLAB_RECORDS 256

int gg__freelist_reserve(gg__freelist_t *fl, size_t k) {
  int rc;
  if ((rc = gg__addr_map_reserve(&fl->by_start, k)) < 0 || (rc = gg__addr_map_reserve(&fl->by_end, k)) < 0)
    return rc;
  while (fl->n_spare < k) {
    void **slabs = realloc(fl->slabs, (fl->n_slabs + 1) * sizeof *slabs);
    if (!slabs) return gg__err(GG_ENOMEM, "arena: out of host memory for block records");
    fl->slabs = slabs;
    gg__block_t *s = calloc(GG__SLAB_RECORDS, sizeof *s);
    if (!s) return gg__err(GG_ENOMEM, "arena: out of host memory for block records");
    fl->slabs[fl->n_slabs++] = s;
    for (size_t i = 0; i < GG__SLAB_RECORDS; i++) gg__freelist_give_record(fl, &s[i]);
  }
  return 0;
}

gg__block_t *gg__freelist_take_record(gg__freelist_t *fl) {
  gg__block_t *b = fl->spare;
  fl->spare = b->r, fl->n_spare--;
  memset(b, 0, sizeof *b);
  return b;
}

void gg__freelist_give_record(gg__freelist_t *fl, gg__block_t *b) {
  b->state = GG__BLOCK_SPARE;
  b->r = fl->spare, fl->spare = b, fl->n_spare++;
}

void gg__freelist_free(gg__freelist_t *fl) {
  for (size_t i = 0; i < fl->n_slabs; i++) free(fl->slabs[i]);
  free(fl->slabs);
  gg__addr_map_free(&fl->by_start);
  gg__addr_map_free(&fl->by_end);
  memset(fl, 0, sizeof *fl);
}

/* ---- treap by (size, addr) --------------------------------------------------------------------- */

/* Priorities are a hash of the address: no random state, and reproducible shapes in tests. */
static uint32_t gg__treap_priority(const gg__block_t *b) {
  uint64_t x = (uint64_t)b->addr;
  x ^= x >> 33, x *= 0xff51afd7ed558ccdull, x ^= x >> 33, x *= 0xc4ceb9fe1a85ec53ull, x ^= x >> 33;
  return (uint32_t)x;
}

static bool gg__treap_less(const gg__block_t *a, const gg__block_t *b) {
  return a->size < b->size || (a->size == b->size && a->addr < b->addr);
}

static void gg__treap_split(gg__block_t *t, const gg__block_t *k, gg__block_t **lo, gg__block_t **hi) {
  if (!t) {
    *lo = *hi = NULL;
  } else if (gg__treap_less(t, k)) {
    gg__treap_split(t->r, k, &t->r, hi);
    *lo = t;
  } else {
    gg__treap_split(t->l, k, lo, &t->l);
    *hi = t;
  }
}

static gg__block_t *gg__treap_merge(gg__block_t *a, gg__block_t *b) {
  if (!a) return b;
  if (!b) return a;
  if (gg__treap_priority(a) > gg__treap_priority(b)) {
    a->r = gg__treap_merge(a->r, b);
    return a;
  }
  b->l = gg__treap_merge(a, b->l);
  return b;
}

static gg__block_t *gg__treap_insert(gg__block_t *t, gg__block_t *n) {
  if (!t) return n;
  if (gg__treap_priority(n) > gg__treap_priority(t)) {
    gg__treap_split(t, n, &n->l, &n->r);
    return n;
  }
  if (gg__treap_less(n, t))
    t->l = gg__treap_insert(t->l, n);
  else
    t->r = gg__treap_insert(t->r, n);
  return t;
}

static gg__block_t *gg__treap_delete(gg__block_t *t, gg__block_t *n) {
  if (t == n) return gg__treap_merge(n->l, n->r);
  if (gg__treap_less(n, t))
    t->l = gg__treap_delete(t->l, n);
  else
    t->r = gg__treap_delete(t->r, n);
  return t;
}

/* ---- free memory ------------------------------------------------------------------------------- */

static void gg__freelist_link(gg__freelist_t *fl, gg__block_t *b) {
  b->state = GG__BLOCK_FREE, b->l = b->r = NULL;
  fl->root = gg__treap_insert(fl->root, b);
  gg__addr_map_put(&fl->by_start, b->addr, b);
  gg__addr_map_put(&fl->by_end, b->addr + b->size, b);
  fl->count++;
}

void gg__freelist_remove(gg__freelist_t *fl, gg__block_t *b) {
  fl->root = gg__treap_delete(fl->root, b);
  gg__addr_map_del(&fl->by_start, b->addr);
  gg__addr_map_del(&fl->by_end, b->addr + b->size);
  fl->count--, fl->bytes -= b->size;
  b->l = b->r = NULL;
}

void gg__freelist_put_plain(gg__freelist_t *fl, uintptr_t addr, size_t size, void *seg) {
  gg__block_t *b = gg__freelist_take_record(fl);
  b->addr = addr, b->size = size, b->seg = seg;
  fl->bytes += size;
  gg__freelist_link(fl, b);
}

gg__block_t *gg__freelist_put(gg__freelist_t *fl, uintptr_t addr, size_t size, void *seg, gg__block_t *rec) {
  gg__block_t *t = fl->top, *n;
  fl->bytes += size;
  /* The neighbour below: top, or a treap block ending where this range starts. */
  if (t && t->seg == seg && t->addr + t->size == addr) {
    t->size += size;
    if ((n = gg__addr_map_get(&fl->by_start, addr + size)) && n->seg == seg) {
      gg__freelist_remove(fl, n);
      fl->bytes += n->size, t->size += n->size;
      gg__freelist_give_record(fl, n);
    }
    if (rec) gg__freelist_give_record(fl, rec);
    return t;
  }
  if ((n = gg__addr_map_get(&fl->by_end, addr)) && n->seg == seg) {
    gg__freelist_remove(fl, n);
    fl->bytes += n->size, addr = n->addr, size += n->size;
    gg__freelist_give_record(fl, n);
  }
  /* The neighbour above: top (which then grows down over the range), or a treap block. */
  if (t && t->seg == seg && t->addr == addr + size) {
    t->addr = addr, t->size += size;
    if (rec) gg__freelist_give_record(fl, rec);
    return t;
  }
  if ((n = gg__addr_map_get(&fl->by_start, addr + size)) && n->seg == seg) {
    gg__freelist_remove(fl, n);
    fl->bytes += n->size, size += n->size;
    gg__freelist_give_record(fl, n);
  }
  if (!rec) rec = gg__freelist_take_record(fl);
  memset(rec, 0, sizeof *rec);
  rec->addr = addr, rec->size = size, rec->seg = seg;
  gg__freelist_link(fl, rec);
  return rec;
}

static bool gg__fits(const gg__block_t *b, size_t n, size_t a) {
  uintptr_t p = gg__align_up(b->addr, a);
  return p - b->addr <= b->size && b->size - (p - b->addr) >= n;
}

/* The in-order successor of b: the smallest key above it, found from the root (no parent links). */
static gg__block_t *gg__treap_next(const gg__freelist_t *fl, const gg__block_t *b) {
  gg__block_t *best = NULL;
  for (gg__block_t *t = fl->root; t;) {
    if (gg__treap_less(b, t))
      best = t, t = t->l;
    else
      t = t->r;
  }
  return best;
}

static gg__block_t *gg__lower_bound(const gg__freelist_t *fl, size_t n) {
  gg__block_t *best = NULL;
  for (gg__block_t *t = fl->root; t;) {
    if (t->size >= n)
      best = t, t = t->l;
    else
      t = t->r;
  }
  return best;
}

gg__block_t *gg__freelist_fit(const gg__freelist_t *fl, size_t n, size_t a) {
  gg__block_t *b = gg__lower_bound(fl, n);
  if (!b || a <= GG__QUANTUM) return b; /* every block is 256-aligned: the first big enough fits */
  /* Over-aligned: try a few of the next sizes, then a size that fits wherever it starts. */
  for (int i = 0; b && i < 8; i++, b = gg__treap_next(fl, b))
    if (gg__fits(b, n, a)) return b;
  if (n > SIZE_MAX - a) return NULL;
  return gg__lower_bound(fl, n + a - GG__QUANTUM);
}

uintptr_t gg__freelist_carve(gg__freelist_t *fl, gg__block_t *b, size_t n, size_t a) {
  gg__freelist_remove(fl, b);
  uintptr_t p = gg__align_up(b->addr, a), end = b->addr + b->size;
  /* b was maximal, so its pieces have no free neighbours. */
  if (p > b->addr) gg__freelist_put_plain(fl, b->addr, p - b->addr, b->seg);
  if (p + n < end) gg__freelist_put_plain(fl, p + n, end - (p + n), b->seg);
  b->addr = p, b->size = n;
  return p;
}

gg__block_t *gg__freelist_largest(const gg__freelist_t *fl) {
  gg__block_t *t = fl->root;
  while (t && t->r) t = t->r;
  return t;
}

void gg__freelist_drop_top(gg__freelist_t *fl) {
  gg__block_t *t = fl->top;
  if (!t) return;
  fl->top = NULL;
  if (t->size)
    gg__freelist_link(fl, t); /* top never touches a treap block: the two would have merged */
  else
    gg__freelist_give_record(fl, t);
}

void gg__freelist_set_top(gg__freelist_t *fl, gg__block_t *b) {
  gg__freelist_remove(fl, b);
  fl->bytes += b->size; /* still free: it only moves out of the treap */
  gg__freelist_drop_top(fl);
  b->state = GG__BLOCK_TOP;
  fl->top = b;
}

static size_t gg__treap_walk(const gg__block_t *t, gg__block_t **out, size_t cap, size_t i) {
  if (!t) return i;
  i = gg__treap_walk(t->l, out, cap, i);
  if (i < cap) out[i] = (gg__block_t *)t;
  return gg__treap_walk(t->r, out, cap, i + 1);
}

size_t gg__freelist_list(const gg__freelist_t *fl, gg__block_t **out, size_t cap) {
  return gg__treap_walk(fl->root, out, cap, 0);
}

static const char *gg__treap_check(const gg__freelist_t *fl, const gg__block_t *t, size_t *n, size_t *bytes) {
  if (!t) return NULL;
  const char *w;
  if (t->state != GG__BLOCK_FREE) return "a treap block is not FREE";
  if (t->l && (!gg__treap_less(t->l, t) || gg__treap_priority(t->l) > gg__treap_priority(t)))
    return "treap order broken (left)";
  if (t->r && (!gg__treap_less(t, t->r) || gg__treap_priority(t->r) > gg__treap_priority(t)))
    return "treap order broken (right)";
  if (gg__addr_map_get(&fl->by_start, t->addr) != t || gg__addr_map_get(&fl->by_end, t->addr + t->size) != t)
    return "a free block is missing from the boundary maps";
  (*n)++, *bytes += t->size;
  if ((w = gg__treap_check(fl, t->l, n, bytes)) || (w = gg__treap_check(fl, t->r, n, bytes))) return w;
  return NULL;
}

const char *gg__freelist_check(const gg__freelist_t *fl) {
  size_t n = 0, bytes = fl->top ? fl->top->size : 0;
  const char *w = gg__treap_check(fl, fl->root, &n, &bytes);
  if (w) return w;
  if (n != fl->count || fl->by_start.n != n || fl->by_end.n != n) return "free block count mismatch";
  if (bytes != fl->bytes) return "free byte count mismatch";
  if (fl->top && fl->top->state != GG__BLOCK_TOP) return "top is not marked TOP";
  return NULL;
}
