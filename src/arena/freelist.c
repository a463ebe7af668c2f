/* freelist.c — an arena's free memory: segregated size classes with bitmaps, O(1) coalescing
 * through boundary maps, the bump block, and the pool of block records. Not thread-safe: the
 * arena's lock covers it.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "arena/freelist_internal.h"
#include "core/internal.h"

/* Small helpers every put and carve runs, several times each: inlined, they spare a call and the
 * saving of registers around it (the 64-live case of bench_calls: ~40 instructions a step). */
#define GG__HOT static inline __attribute__((always_inline))

/* Zeroed memory on a cache line's boundary: calloc's 16-byte alignment put every other 32-byte
 * bound slot, and half the 64-byte records, across two lines (a scope end of 65,536 blocks: 5.4
 * lines a block missed beyond the L2, 1.5 of them only for that). n * size is a multiple of the
 * line. */
#define GG__LINE 64
_Static_assert(sizeof(gg__block_t) == GG__LINE && 2 * sizeof(struct gg__bound) == GG__LINE,
               "a record fills a line, two bound slots fill one");
static void *gg__calloc_lines(size_t n, size_t size) {
  void *p = aligned_alloc(GG__LINE, n * size);
  if (p) memset(p, 0, n * size);
  return p;
}

/* Both hash tables (address map, boundary map) keep a block address as each slot's first member (0:
 * empty) and probe linearly from gg__addr_hash: one grow for both, re-placing every key. `lines`:
 * the new slots start on a cache line (the boundary map's two slots a line). */
_Static_assert(offsetof(struct gg__addr_slot, key) == 0 && offsetof(struct gg__bound, key) == 0,
               "a slot's key comes first");
static uintptr_t gg__slot_key(const char *slot) {
  uintptr_t key;
  memcpy(&key, slot, sizeof key);
  return key;
}

static int gg__table_grow(void **slots, size_t *cap, size_t want, size_t elem, bool lines) {
  size_t n = *cap ? *cap : 64;
  while (want > n / 2) {
    n *= 2;
  }
  if (n == *cap) return 0;
  char *s = lines ? gg__calloc_lines(n, elem) : calloc(n, elem);
  if (!s) return gg__err(GG_ENOMEM, "arena: out of host memory for block metadata (%zu slots)", n);
  const char *old = *slots;
  for (size_t i = 0; i < *cap; i++) {
    uintptr_t key = gg__slot_key(old + i * elem);
    if (!key) continue;
    size_t j = gg__addr_hash(key, n);
    while (gg__slot_key(s + j * elem)) {
      j = (j + 1) & (n - 1);
    }
    memcpy(s + j * elem, old + i * elem, elem);
  }
  free(*slots);
  *slots = s;
  *cap = n;
  return 0;
}

/* ---- address maps ---------------------------------------------------------------------------- */

int gg__addr_map_grow(gg__addr_map_t *m, size_t want) {
  return gg__table_grow((void **)&m->slots, &m->cap, want, sizeof *m->slots, false);
}

void gg__addr_map_put(gg__addr_map_t *m, uintptr_t key, gg__block_t *val) {
  GG__ASSERT(key != 0 && m->cap); /* key 0 marks an empty slot; the caller reserved room */
  size_t j = gg__addr_hash(key, m->cap);
  while (m->slots[j].key && m->slots[j].key != key) j = (j + 1) & (m->cap - 1);
  if (!m->slots[j].key) m->n++;
  GG__ASSERT(m->n <= m->cap / 2); /* half empty: probes stay short and always end */
  m->slots[j].key = key;
  m->slots[j].val = val;
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
  /* Backward shift: pull later members of the probe run into the hole so lookups never stop early.
   * */
  for (size_t k = (j + 1) & mask; m->slots[k].key; k = (k + 1) & mask) {
    size_t home = gg__addr_hash(m->slots[k].key, m->cap);
    if (((k - home) & mask) >= ((k - j) & mask)) {
      m->slots[j] = m->slots[k];
      j = k;
    }
  }
  m->slots[j].key = 0;
  m->slots[j].val = NULL;
  m->n--;
  return val;
}

void gg__addr_map_free(gg__addr_map_t *m) {
  free(m->slots);
  memset(m, 0, sizeof *m);
}

/* ---- boundary map ---------------------------------------------------------------------------- */

typedef struct gg__bound gg__bound_t;

static int gg__bounds_grow(gg__bounds_t *m, size_t want) {
  return gg__table_grow((void **)&m->slots, &m->cap, want, sizeof *m->slots, true);
}

/* The slot holding key, or the empty slot where it would go. */
static size_t gg__bounds_probe(const gg__bounds_t *m, uintptr_t key) {
  size_t j = gg__addr_hash(key, m->cap);
  while (m->slots[j].key && m->slots[j].key != key) j = (j + 1) & (m->cap - 1);
  return j;
}

static const gg__bound_t *gg__bounds_find(const gg__bounds_t *m, uintptr_t key) {
  if (!m->cap) return NULL;
  const gg__bound_t *s = &m->slots[gg__bounds_probe(m, key)];
  return s->key ? s : NULL;
}

/* The slot for key at index j (from gg__bounds_probe), taken if it was empty. Needs room. */
static gg__bound_t *gg__bounds_take(gg__bounds_t *m, size_t j, uintptr_t key) {
  gg__bound_t *s = &m->slots[j];
  if (!s->key) {
    s->key = key;
    s->above = s->below = NULL;
    m->n++;
    GG__ASSERT(key != 0 && m->n <= m->cap / 2); /* gg__freelist_reserve made the room */
  }
  return s;
}

static gg__bound_t *gg__bounds_at(gg__bounds_t *m, uintptr_t key) {
  return gg__bounds_take(m, gg__bounds_probe(m, key), key);
}

/* Empties one side of the slot at index j (which holds a key); the slot goes once both sides are
 * empty. */
GG__HOT void gg__bounds_clear_at(gg__bounds_t *m, size_t j, bool above) {
  size_t mask = m->cap - 1;
  gg__bound_t *s = &m->slots[j];
  GG__ASSERT(s->key != 0); /* only a boundary that is in the map is cleared */
  if (above)
    s->above = NULL;
  else
    s->below = NULL;
  if (s->above || s->below) return;
  /* Backward shift: pull later members of the probe run into the hole so lookups never stop early.
   * */
  for (size_t k = (j + 1) & mask; m->slots[k].key; k = (k + 1) & mask) {
    size_t home = gg__addr_hash(m->slots[k].key, m->cap);
    if (((k - home) & mask) >= ((k - j) & mask)) {
      m->slots[j] = m->slots[k];
      j = k;
    }
  }
  memset(&m->slots[j], 0, sizeof m->slots[j]);
  m->n--;
}

/* Empties one side of key's slot (which must exist). */
static void gg__bounds_clear(gg__bounds_t *m, uintptr_t key, bool above) {
  gg__bounds_clear_at(m, gg__bounds_probe(m, key), above);
}

static gg__block_t *gg__freelist_starting_at(const gg__freelist_t *fl, uintptr_t addr) {
  const gg__bound_t *s = gg__bounds_find(&fl->bounds, addr);
  return s ? s->above : NULL;
}

gg__block_t *gg__freelist_ending_at(const gg__freelist_t *fl, uintptr_t addr) {
  const gg__bound_t *s = gg__bounds_find(&fl->bounds, addr);
  return s ? s->below : NULL;
}

/* ---- record pool ----------------------------------------------------------------------------- */

#define GG__SLAB_RECORDS 256

int gg__freelist_reserve_slow(gg__freelist_t *fl, size_t k) {
  if (fl->bounds.n + 2 * k > fl->bounds.cap / 2) {
    int rc = gg__bounds_grow(&fl->bounds, fl->bounds.n + 2 * k);
    if (rc < 0) return rc;
  }
  while (fl->n_spare < k) {
    void **slabs = realloc(fl->slabs, (fl->n_slabs + 1) * sizeof *slabs);
    if (!slabs) return gg__err(GG_ENOMEM, "arena: out of host memory for block records");
    fl->slabs = slabs;
    gg__block_t *s = gg__calloc_lines(GG__SLAB_RECORDS, sizeof *s);
    if (!s) return gg__err(GG_ENOMEM, "arena: out of host memory for block records");
    fl->slabs[fl->n_slabs++] = s;
    for (size_t i = 0; i < GG__SLAB_RECORDS; i++) gg__freelist_give_record(fl, &s[i]);
  }
  return 0;
}

gg__block_t *gg__freelist_take_record(gg__freelist_t *fl) {
  gg__block_t *b = fl->spare;
  /* Taken without a reservation: a spare exists (n_spare counts the list b heads). */
  GG__ASSERT(fl->n_spare > 0);
  GG__ASSERT(b->state == GG__BLOCK_SPARE);
  fl->spare = b->r;
  fl->n_spare--;
  memset(b, 0, sizeof *b);
  return b;
}

void gg__freelist_give_record(gg__freelist_t *fl, gg__block_t *b) {
  GG__ASSERT(b != fl->spare && b != fl->top); /* a record given back twice, or top's */
  b->state = GG__BLOCK_SPARE;
  b->r = fl->spare;
  fl->spare = b;
  fl->n_spare++;
}

void gg__freelist_free(gg__freelist_t *fl) {
  for (size_t i = 0; i < fl->n_slabs; i++) free(fl->slabs[i]);
  free(fl->slabs);
  free(fl->bounds.slots);
  memset(fl, 0, sizeof *fl);
}

/* ---- size classes ---------------------------------------------------------------------------- */

#define GG__EXACT_BITS 7 /* log2(GG__EXACT_CLASSES) */
/* Blocks of one class a fit looks at: bounds the work, not the choice in practice. */
#define GG__FIT_LOOK 16

_Static_assert(GG__EXACT_CLASSES == 1 << GG__EXACT_BITS, "exact classes are a power of two");
_Static_assert(GG__CLASS_WORDS <= 32, "the word summary is 32 bits");

/* Sizes are multiples of the quantum: below GG__EXACT_CLASSES quanta the class is the size itself;
 * above, the power of two and the next GG__SUB_BITS bits. */
GG__HOT unsigned gg__class_of(size_t size) {
  size_t q = size / GG__QUANTUM;
  if (q < GG__EXACT_CLASSES) return (unsigned)q;
  unsigned e = 63u - (unsigned)__builtin_clzll((unsigned long long)q);
  return GG__EXACT_CLASSES + (e - GG__EXACT_BITS) * GG__SUB_CLASSES +
         (unsigned)((q >> (e - GG__SUB_BITS)) & (GG__SUB_CLASSES - 1));
}

/* The smallest size, in quanta, of class c. */
static size_t gg__class_min_quanta(unsigned c) {
  if (c < GG__EXACT_CLASSES) return c;
  unsigned e = GG__EXACT_BITS + (c - GG__EXACT_CLASSES) / GG__SUB_CLASSES;
  return ((size_t)GG__SUB_CLASSES + (c - GG__EXACT_CLASSES) % GG__SUB_CLASSES)
         << (e - GG__SUB_BITS);
}

/* The first non-empty class at or above c, or -1: two bit scans. */
static int gg__class_next(const gg__freelist_t *fl, unsigned c) {
  if (c >= GG__CLASSES) return -1;
  unsigned w = c / 64;
  uint64_t bits = fl->bits[w] & (~0ull << (c % 64));
  if (bits) return (int)(w * 64 + (unsigned)__builtin_ctzll(bits));
  uint32_t words = w + 1 < 32 ? fl->words & (~0u << (w + 1)) : 0;
  if (!words) return -1;
  w = (unsigned)__builtin_ctz(words);
  return (int)(w * 64 + (unsigned)__builtin_ctzll(fl->bits[w]));
}

/* The last non-empty class, or -1. */
static int gg__class_last(const gg__freelist_t *fl) {
  if (!fl->words) return -1;
  unsigned w = 31u - (unsigned)__builtin_clz(fl->words);
  return (int)(w * 64 + 63u - (unsigned)__builtin_clzll(fl->bits[w]));
}

/* Lists b in class c (its size's class). */
static void gg__class_link_in(gg__freelist_t *fl, gg__block_t *b, unsigned c) {
  GG__ASSERT(c < GG__CLASSES && c == gg__class_of(b->size)); /* fit looks for sizes by class */
  b->l = NULL;
  b->r = fl->heads[c];
  if (b->r)
    b->r->l = b;
  else {
    fl->bits[c / 64] |= 1ull << (c % 64);
    fl->words |= 1u << (c / 64);
  }
  fl->heads[c] = b;
}

GG__HOT void gg__class_unlink_from(gg__freelist_t *fl, gg__block_t *b, unsigned c) {
  GG__ASSERT(b->l ? b->l->r == b : fl->heads[c] == b); /* it is in class c's list */
  if (b->l)
    b->l->r = b->r;
  else
    fl->heads[c] = b->r;
  if (b->r) b->r->l = b->l;
  if (!fl->heads[c] && !(fl->bits[c / 64] &= ~(1ull << (c % 64)))) fl->words &= ~(1u << (c / 64));
}

static void gg__class_link(gg__freelist_t *fl, gg__block_t *b) {
  gg__class_link_in(fl, b, gg__class_of(b->size));
}

static void gg__class_unlink(gg__freelist_t *fl, gg__block_t *b) {
  gg__class_unlink_from(fl, b, gg__class_of(b->size));
}

/* Sets a listed block's size; it moves to the head of its new class only when the class changes.
 * Each class is computed once (a merge or carve changes a size on every release and most
 * allocations). */
GG__HOT void gg__class_resize(gg__freelist_t *fl, gg__block_t *b, size_t size) {
  unsigned from = gg__class_of(b->size), to = gg__class_of(size);
  b->size = size;
  if (from == to) return;
  gg__class_unlink_from(fl, b, from);
  gg__class_link_in(fl, b, to);
}

/* For GG__ASSERT_EXPENSIVE: b is in its size class's list (lists longer than GG__WALK_MAX are taken
 * on trust). */
static bool gg__class_holds(const gg__freelist_t *fl, const gg__block_t *b) {
  size_t n = 0;
  for (const gg__block_t *x = fl->heads[gg__class_of(b->size)]; x; x = x->r, n++)
    if (x == b || n >= GG__WALK_MAX) return true;
  return false;
}

static bool gg__smaller(const gg__block_t *a, const gg__block_t *b) {
  return a->size < b->size || (a->size == b->size && a->addr < b->addr);
}

/* ---- free memory ----------------------------------------------------------------------------- */

static void gg__freelist_link(gg__freelist_t *fl, gg__block_t *b) {
  GG__ASSERT(b->state != GG__BLOCK_FREE); /* listed twice */
  GG__ASSERT(b->size && b->size % GG__QUANTUM == 0 && b->addr % GG__QUANTUM == 0);
  b->state = GG__BLOCK_FREE;
  gg__class_link(fl, b);
  gg__bounds_at(&fl->bounds, b->addr)->above = b;
  gg__bounds_at(&fl->bounds, b->addr + b->size)->below = b;
  fl->count++;
}

void gg__freelist_remove(gg__freelist_t *fl, gg__block_t *b) {
  GG__ASSERT(b->state == GG__BLOCK_FREE && fl->count > 0 && fl->bytes >= b->size);
  gg__class_unlink(fl, b);
  gg__bounds_clear(&fl->bounds, b->addr, true);
  gg__bounds_clear(&fl->bounds, b->addr + b->size, false);
  fl->count--;
  fl->bytes -= b->size;
  b->l = b->r = NULL;
}

void gg__freelist_put_plain(gg__freelist_t *fl, uintptr_t addr, size_t size, void *seg) {
  gg__block_t *b = gg__freelist_take_record(fl);
  b->addr = addr;
  b->size = size;
  b->seg = seg;
  fl->bytes += size;
  gg__freelist_link(fl, b);
}

/* Moves a listed block's bounds in place: only the boundary map entries and the class that change
 * are touched (cheaper than removing it and listing a new one). Free bytes are the caller's to
 * count. */
static void gg__freelist_reshape(gg__freelist_t *fl, gg__block_t *b, uintptr_t addr, size_t size) {
  GG__ASSERT(b->state == GG__BLOCK_FREE && size && addr % GG__QUANTUM == 0 &&
             size % GG__QUANTUM == 0);
  if (addr != b->addr) {
    gg__bounds_clear(&fl->bounds, b->addr, true);
    gg__bounds_at(&fl->bounds, addr)->above = b;
  }
  if (addr + size != b->addr + b->size) {
    gg__bounds_clear(&fl->bounds, b->addr + b->size, false);
    gg__bounds_at(&fl->bounds, addr + size)->below = b;
  }
  b->addr = addr;
  gg__class_resize(fl, b, size);
}

/* The range [addr, addr+size) joins its listed free neighbour lo (ending at addr) and/or n
 * (starting at addr+size); j_lo and j_hi are the boundary slots already probed for addr and
 * addr+size. The slots and classes are changed in place, each probed once (removing n and reshaping
 * lo probed four). Nothing free starts at addr or ends at addr+size (the range was not free), so a
 * side cleared there may empty its slot. Writing a slot at an index found before a deletion must
 * come first: a deletion shifts. */
static gg__block_t *gg__freelist_grow_into(gg__freelist_t *fl, gg__block_t *lo, gg__block_t *n,
                                           uintptr_t addr, size_t size, size_t j_lo, size_t j_hi) {
  gg__bounds_t *m = &fl->bounds;
  /* Coalescing: each neighbour touches the range exactly, and only free blocks merge. */
  GG__ASSERT(lo || n);
  GG__ASSERT(!lo || (lo->state == GG__BLOCK_FREE && lo->addr + lo->size == addr));
  GG__ASSERT(!n || (n->state == GG__BLOCK_FREE && n->addr == addr + size));
  if (lo && n) { /* lo grows over the range and n: n's end now names lo, the two inner slots go */
    gg__class_unlink(fl, n);
    gg__bounds_at(m, n->addr + n->size)->below = lo;
    gg__class_resize(fl, lo, lo->size + size + n->size);
    gg__bounds_clear_at(m, j_lo, false);
    gg__bounds_clear(m, addr + size, true);
    fl->count--;
    n->l = n->r = NULL;
    gg__freelist_give_record(fl, n);
    return lo;
  }
  gg__block_t *b = lo ? lo : n;
  gg__class_resize(fl, b, b->size + size);
  if (lo) { /* the end moves up from addr to addr+size */
    gg__bounds_take(m, j_hi, addr + size)->below = lo;
    gg__bounds_clear_at(m, j_lo, false);
  } else { /* the start moves down from addr+size to addr */
    gg__bounds_take(m, j_lo, addr)->above = n;
    gg__bounds_clear_at(m, j_hi, true);
    n->addr = addr;
  }
  return b;
}

gg__block_t *gg__freelist_put(gg__freelist_t *fl, uintptr_t addr, size_t size, void *seg,
                              gg__block_t *rec) {
  gg__block_t *t = fl->top, *n, *lo;
  GG__ASSERT(size && size % GG__QUANTUM == 0 && addr % GG__QUANTUM == 0);
  /* The range was not free: its record is a live, pending or cached one, never a listed block. */
  GG__ASSERT(!rec || (rec->state != GG__BLOCK_FREE && rec != t));
  fl->bytes += size;
  /* The neighbour below: top, or a listed block ending where this range starts. */
  if (t && t->seg == seg && t->addr + t->size == addr) {
    t->size += size;
    n = gg__freelist_starting_at(fl, addr + size);
    if (n && n->seg == seg) {
      gg__freelist_remove(fl, n);
      fl->bytes += n->size;
      t->size += n->size;
      gg__freelist_give_record(fl, n);
    }
    if (rec) gg__freelist_give_record(fl, rec);
    return t;
  }
  /* The slots of both boundaries: a range with no free neighbour lists itself in them as they are.
   * */
  size_t j_lo = fl->bounds.cap ? gg__bounds_probe(&fl->bounds, addr) : 0;
  lo = fl->bounds.cap && fl->bounds.slots[j_lo].key ? fl->bounds.slots[j_lo].below : NULL;
  if (lo && lo->seg != seg) lo = NULL;
  /* The neighbour above: top (which then grows down over the range and lo), or a listed block. */
  if (t && t->seg == seg && t->addr == addr + size) {
    if (lo) {
      gg__freelist_remove(fl, lo);
      fl->bytes += lo->size;
      addr = lo->addr;
      size += lo->size;
      gg__freelist_give_record(fl, lo);
    }
    t->addr = addr;
    t->size += size;
    if (rec) gg__freelist_give_record(fl, rec);
    return t;
  }
  size_t j_hi = fl->bounds.cap ? gg__bounds_probe(&fl->bounds, addr + size) : 0;
  n = fl->bounds.cap && fl->bounds.slots[j_hi].key ? fl->bounds.slots[j_hi].above : NULL;
  if (n && n->seg != seg) n = NULL;
  if (lo || n) { /* grow a neighbour in place; the range's own record is not needed */
    if (rec) gg__freelist_give_record(fl, rec);
    return gg__freelist_grow_into(fl, lo, n, addr, size, j_lo, j_hi);
  }
  if (!rec) rec = gg__freelist_take_record(fl);
  memset(rec, 0, sizeof *rec);
  rec->addr = addr;
  rec->size = size;
  rec->seg = seg;
  rec->state = GG__BLOCK_FREE;
  gg__class_link(fl, rec);
  gg__bounds_take(&fl->bounds, j_lo, addr)->above = rec;
  /* Taking the low slot moves nothing, unless it was the very slot the high boundary would take. */
  if (j_hi == j_lo && fl->bounds.slots[j_hi].key != addr + size)
    j_hi = gg__bounds_probe(&fl->bounds, addr + size);
  gg__bounds_take(&fl->bounds, j_hi, addr + size)->below = rec;
  fl->count++;
  GG__ASSERT_EXPENSIVE(gg__class_holds(fl, rec));
  return rec;
}

static bool gg__fits(const gg__block_t *b, size_t n, size_t a) {
  uintptr_t p = gg__align_up(b->addr, a);
  return p - b->addr <= b->size && b->size - (p - b->addr) >= n;
}

/* The smallest block that fits among the first GG__FIT_LOOK of a class list. */
static gg__block_t *gg__class_best(gg__block_t *b, size_t n, size_t a) {
  gg__block_t *best = NULL;
  for (int i = 0; b && i < GG__FIT_LOOK; i++, b = b->r)
    if (gg__fits(b, n, a) && (!best || gg__smaller(b, best))) best = b;
  return best;
}

gg__block_t *gg__freelist_fit(const gg__freelist_t *fl, size_t n, size_t a) {
  if (!fl->words) return NULL; /* nothing listed: allocations from top (bump pairs) ask first */
  unsigned c = gg__class_of(n);
  int d;
  if (a <= GG__QUANTUM) { /* every block is 256-aligned: a block fits when it is large enough */
    if (c < GG__EXACT_CLASSES && fl->heads[c]) return fl->heads[c]; /* exactly n bytes */
    gg__block_t *b = c >= GG__EXACT_CLASSES ? gg__class_best(fl->heads[c], n, a) : NULL;
    if (b) return b;
    return (d = gg__class_next(fl, c + 1)) < 0 ? NULL : gg__class_best(fl->heads[d], n, a);
  }
  /* Over-aligned: a few classes from n up, then a class whose every block fits wherever it starts.
   * */
  d = gg__class_next(fl, c);
  for (int i = 0; d >= 0 && i < 4; i++, d = gg__class_next(fl, (unsigned)d + 1)) {
    gg__block_t *b = gg__class_best(fl->heads[d], n, a);
    if (b) return b;
  }
  if (n > SIZE_MAX - a) return NULL;
  size_t need = n + a - GG__QUANTUM;
  c = gg__class_of(need);
  if (gg__class_min_quanta(c) < need / GG__QUANTUM) c++;
  return (d = gg__class_next(fl, c)) < 0 ? NULL : fl->heads[d];
}

gg__block_t *gg__freelist_carve(gg__freelist_t *fl, gg__block_t *b, size_t n, size_t a) {
  uintptr_t p = gg__align_up(b->addr, a), end = b->addr + b->size;
  GG__ASSERT(b->state == GG__BLOCK_FREE && n % GG__QUANTUM == 0 && p + n <= end);
  if (p == b->addr &&
      p + n < end) { /* the front: b stays listed as the rest, a new record is handed out */
    gg__block_t *u = gg__freelist_take_record(fl);
    u->addr = p;
    u->size = n;
    u->seg = b->seg;
    gg__freelist_reshape(fl, b, p + n, end - (p + n));
    fl->bytes -= n;
    return u;
  }
  return gg__freelist_carve_at(fl, b, p, n);
}

gg__block_t *gg__freelist_carve_at(gg__freelist_t *fl, gg__block_t *b, uintptr_t p, size_t n) {
  uintptr_t end = b->addr + b->size;
  GG__ASSERT(b->state == GG__BLOCK_FREE && n % GG__QUANTUM == 0 && p % GG__QUANTUM == 0 &&
             p >= b->addr && p + n <= end);
  gg__freelist_remove(fl, b);
  /* b was maximal, so its pieces have no free neighbours. */
  if (p > b->addr) gg__freelist_put_plain(fl, b->addr, p - b->addr, b->seg);
  if (p + n < end) gg__freelist_put_plain(fl, p + n, end - (p + n), b->seg);
  b->addr = p;
  b->size = n;
  return b;
}

/* The whole last class is looked at: the largest block decides where top goes. */
gg__block_t *gg__freelist_largest(const gg__freelist_t *fl) {
  int c = gg__class_last(fl);
  if (c < 0) return NULL;
  gg__block_t *best = fl->heads[c];
  for (gg__block_t *b = best->r; b; b = b->r)
    if (gg__smaller(best, b)) best = b;
  return best;
}

void gg__freelist_drop_top(gg__freelist_t *fl) {
  gg__block_t *t = fl->top;
  if (!t) return;
  GG__ASSERT(t->state == GG__BLOCK_TOP);
  fl->top = NULL;
  if (t->size)
    gg__freelist_link(fl, t); /* top never touches a listed block: the two would have merged */
  else
    gg__freelist_give_record(fl, t);
}

void gg__freelist_set_top(gg__freelist_t *fl, gg__block_t *b) {
  GG__ASSERT(b != fl->top);
  gg__freelist_remove(fl, b);
  fl->bytes += b->size; /* still free: it only moves out of the lists */
  gg__freelist_drop_top(fl);
  b->state = GG__BLOCK_TOP;
  fl->top = b;
  /* Top moves seldom (a promotion): the whole free list is checked then, when it is small. */
  GG__ASSERT_EXPENSIVE(fl->count > GG__WALK_MAX || gg__freelist_check(fl) == NULL);
}

size_t gg__freelist_list(const gg__freelist_t *fl, gg__block_t **out, size_t cap) {
  size_t i = 0;
  for (int c = gg__class_next(fl, 0); c >= 0; c = gg__class_next(fl, (unsigned)c + 1))
    for (gg__block_t *b = fl->heads[c]; b; b = b->r, i++)
      if (i < cap) out[i] = b;
  return i;
}

static const char *gg__class_check(const gg__freelist_t *fl, unsigned c, size_t *n, size_t *bytes) {
  bool bit = fl->bits[c / 64] >> (c % 64) & 1;
  if (bit != (fl->heads[c] != NULL)) return "a class bit disagrees with its list";
  for (const gg__block_t *b = fl->heads[c], *prev = NULL; b; prev = b, b = b->r) {
    if (b->state != GG__BLOCK_FREE) return "a listed block is not FREE";
    if (b->l != prev) return "a class list's back link is broken";
    if (gg__class_of(b->size) != c) return "a free block is in the wrong size class";
    if (gg__freelist_starting_at(fl, b->addr) != b ||
        gg__freelist_ending_at(fl, b->addr + b->size) != b)
      return "a free block is missing from the boundary map";
    (*n)++;
    *bytes += b->size;
  }
  return NULL;
}

const char *gg__freelist_check(const gg__freelist_t *fl) {
  size_t n = 0, bytes = fl->top ? fl->top->size : 0;
  const char *w;
  for (unsigned c = 0; c < GG__CLASSES; c++) {
    w = gg__class_check(fl, c, &n, &bytes);
    if (w) return w;
  }
  for (unsigned i = 0; i < GG__CLASS_WORDS; i++)
    if (((fl->words >> i) & 1) != (fl->bits[i] != 0))
      return "the class word summary disagrees with the bits";
  if (n != fl->count) return "free block count mismatch";
  /* Every slot names listed blocks only (each found above, so n of each side means no stale one).
   * */
  size_t keys = 0, above = 0, below = 0;
  for (size_t i = 0; i < fl->bounds.cap; i++) {
    const gg__bound_t *s = &fl->bounds.slots[i];
    if (!s->key) continue;
    if (!s->above && !s->below) return "an empty boundary slot was left in the map";
    if ((s->above && s->above->addr != s->key) ||
        (s->below && s->below->addr + s->below->size != s->key))
      return "a boundary slot names a block that does not start or end there";
    keys++;
    above += s->above != NULL;
    below += s->below != NULL;
  }
  if (keys != fl->bounds.n || above != n || below != n)
    return "the boundary map's counts disagree with the lists";
  if (bytes != fl->bytes) return "free byte count mismatch";
  if (fl->top && fl->top->state != GG__BLOCK_TOP) return "top is not marked TOP";
  return NULL;
}
