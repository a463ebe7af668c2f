/* test_arena_cache_threads.c — the per-thread caches of an arena (src/arena_cache.c) where threads meet:
 * a thread that exits with blocks cached and handed out, an arena destroyed while threads cache from it,
 * scopes that begin and end while threads allocate, and a freed block that must not come back while the
 * arena's stream is busy. Meant to run under ThreadSanitizer too (-DGPUGUARD_SANITIZE=thread). */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "arena_internal.h"
#include "gg_test.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static gg_arena_t *mk(void *stream) {
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.capacity = 64 * MiB, o.chunk_size = 1 * MiB, o.stream = stream, o.name = "cache";
  gg_arena_t *a = NULL;
  gg_assert_ok(gg_arena_create(&a, &o));
  return a;
}

static gg_arena_stats_t stats(gg_arena_t *a) {
  gg_arena_stats_t s;
  gg_assert_ok(gg_arena_stats(a, &s));
  return s;
}

static int count_block(const gg_block_info_t *b, void *user) {
  (void)b;
  ++*(int *)user;
  return 0;
}

/* ---- a thread exits with blocks in its cache ---------------------------------------------------- */

typedef struct leaver {
  gg_arena_t *arena;
  void *kept[10];
  int rc;
} leaver_t;

static void *leave_blocks(void *arg) {
  leaver_t *l = arg;
  for (int i = 0; i < 1000 && l->rc == 0; i++) { /* pairs: the cache fills and serves */
    void *p;
    if ((l->rc = gg_alloc(l->arena, 4 * KiB, &p)) == 0) l->rc = gg_free(l->arena, p);
  }
  for (int i = 0; i < 10 && l->rc == 0; i++) l->rc = gg_alloc(l->arena, 4 * KiB, &l->kept[i]);
  return NULL;
}

static void test_thread_exit_gives_back(void **state) {
  (void)state;
  gg_arena_t *a = mk(NULL);
  leaver_t l = {.arena = a};
  pthread_t t;
  pthread_create(&t, NULL, leave_blocks, &l);
  pthread_join(t, NULL);
  gg_assert_ok(l.rc);
  gg__arena_probe_t pr;
  gg_assert_ok(gg__arena_probe(a, &pr));
  assert_true(pr.cached_allocs > 900); /* the pairs did not take the arena's path */
  gg_arena_stats_t s = stats(a);
  assert_int_equal(s.n_live, 10);
  assert_int_equal(s.bytes_in_use, 10 * 4 * KiB);
  assert_int_equal(s.n_allocs, 1010);
  int n = 0;
  gg_assert_ok(gg_arena_foreach_block(a, count_block, &n));
  assert_int_equal(n, 10);
  gg_assert_ok(gg__arena_check(a));
  for (int i = 0; i < 10; i++) gg_assert_ok(gg_free(a, l.kept[i])); /* its blocks outlive it */
  gg_assert_fails(gg_free(a, l.kept[0]), GG_EINVAL, "double free");
  gg_assert_ok(gg_arena_trim(a, 0));
  s = stats(a);
  assert_int_equal(s.bytes_mapped, 0); /* nothing stayed in the dead thread's cache */
  assert_int_equal(s.n_live, 0);
  gg_assert_ok(gg_arena_destroy(a));
}

/* ---- an arena destroyed while threads cache from it ---------------------------------------------- */

#define PAIRERS 4

static struct {
  _Atomic(gg_arena_t *) arena;
  atomic_bool stop;
  atomic_ullong pairs[PAIRERS];
  char error[PAIRERS][200];
} dz;

static void *pair_until_stopped(void *arg) {
  int id = (int)(intptr_t)arg;
  void *held[8] = {0};
  gg_arena_t *of = NULL; /* the arena `held` came from */
  for (unsigned i = 0; !atomic_load(&dz.stop); i++) {
    gg_arena_t *a = atomic_load(&dz.arena);
    if (a != of) memset(held, 0, sizeof held), of = a; /* the old one was destroyed: they went with it */
    void *p;
    int rc = gg_alloc(a, 256 + (i % 4) * 1024, &p);
    if (rc == 0) { /* (its memory is not touched: the arena may be destroyed right after the call) */
      void *old = held[i % 8];
      held[i % 8] = p;
      rc = old ? gg_free(a, old) : 0;
    }
    if (rc == GG_EINVAL) { /* destroyed under us */
      sched_yield();
    } else if (rc < 0) {
      snprintf(dz.error[id], sizeof dz.error[id], "%s", gg_last_error());
      return NULL;
    } else {
      atomic_fetch_add(&dz.pairs[id], 1);
    }
  }
  for (int k = 0; k < 8; k++)
    if (held[k] && gg_free(of, held[k]) < 0)
      snprintf(dz.error[id], sizeof dz.error[id], "final free: %s", gg_last_error());
  return NULL;
}

static void wait_pairs(unsigned long long more) {
  unsigned long long want[PAIRERS];
  for (int t = 0; t < PAIRERS; t++) want[t] = atomic_load(&dz.pairs[t]) + more;
  for (int t = 0; t < PAIRERS; t++)
    while (atomic_load(&dz.pairs[t]) < want[t] && !dz.error[t][0]) sched_yield();
}

static void test_destroy_while_threads_cache(void **state) {
  (void)state;
  memset(&dz, 0, sizeof dz);
  atomic_store(&dz.arena, mk(NULL));
  pthread_t t[PAIRERS];
  for (int i = 0; i < PAIRERS; i++) pthread_create(&t[i], NULL, pair_until_stopped, (void *)(intptr_t)i);
  for (int round = 0; round < 3; round++) {
    wait_pairs(500);
    gg_arena_t *old = atomic_load(&dz.arena);
    gg_assert_ok(gg_arena_destroy(old)); /* threads hold cache entries of it right now */
    atomic_store(&dz.arena, mk(NULL));   /* their next calls fail once, then cache from the new one */
  }
  wait_pairs(500);
  atomic_store(&dz.stop, true);
  for (int i = 0; i < PAIRERS; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < PAIRERS; i++)
    if (dz.error[i][0]) fail_msg("thread %d: %s", i, dz.error[i]);
  gg_arena_t *a = atomic_load(&dz.arena);
  gg_arena_stats_t s = stats(a); /* the threads exited: every cache went back */
  assert_int_equal(s.n_live, 0);
  assert_int_equal(s.bytes_in_use, 0);
  gg_assert_ok(gg__arena_check(a));
  gg_assert_ok(gg_arena_destroy(a));
}

/* ---- scopes begin and end while threads allocate ------------------------------------------------- */

#define SCOPERS 4
#define KEEP    64

/* Phases the main thread moves through; each block records the phase before and after its alloc. */
enum { PH_FREE, PH_BEGINNING, PH_OPEN, PH_ENDING, PH_ENDED, PH_STOP };

typedef struct sblock {
  void *p;
  int before, after;
} sblock_t;

static struct {
  gg_arena_t *arena;
  atomic_int phase;
  atomic_int inside, pairs; /* blocks allocated wholly inside the open scope; pairs outside scopes */
  sblock_t kept[SCOPERS][KEEP];
  int n[SCOPERS];
  char error[SCOPERS][200];
} sc;

/* Blocks that surely live after the scope: allocated before it began, or after it ended. */
static bool surely_alive(const sblock_t *b) { return b->after <= PH_FREE || b->before >= PH_ENDED; }

static void *alloc_across_scopes(void *arg) {
  int id = (int)(intptr_t)arg, n = 0;
  sblock_t *kept = sc.kept[id];
  for (unsigned i = 0;; i++) {
    int ph = atomic_load(&sc.phase);
    if (ph == PH_STOP) break;
    bool settled = ph == PH_FREE || ph >= PH_ENDED;
    if (!settled && n == KEEP) { /* room for no more blocks a scope may own: wait for its end */
      sched_yield();
      continue;
    }
    sblock_t b = {.before = ph};
    if (gg_alloc(sc.arena, 4 * KiB, &b.p) < 0) {
      snprintf(sc.error[id], sizeof sc.error[id], "alloc: %s", gg_last_error());
      break;
    }
    b.after = atomic_load(&sc.phase);
    if (b.before == PH_OPEN && b.after == PH_OPEN) atomic_fetch_add(&sc.inside, 1);
    if (!surely_alive(&b)) { /* a scope may own it: kept (never freed), its fate checked at the end */
      kept[n++] = b;
      struct timespec d = {0, 200 * 1000}; /* so the scope's phases see several of these */
      nanosleep(&d, NULL);
    } else if (n < KEEP / 4 && i % 8 == 0) { /* outside any scope: some stay live across the scope (most
                                                 * slots stay free for blocks a scope may own) */
      kept[n++] = b;
    } else if (gg_free(sc.arena, b.p) < 0) { /* pairs: the cache serves them */
      snprintf(sc.error[id], sizeof sc.error[id], "free: %s", gg_last_error());
      break;
    } else {
      atomic_fetch_add(&sc.pairs, 1);
    }
  }
  sc.n[id] = n;
  return NULL;
}

static bool listed(void *p, const gg_block_info_t *v, int nv) {
  for (int i = 0; i < nv; i++)
    if (v[i].ptr == p) return true;
  return false;
}

typedef struct listing {
  gg_block_info_t v[SCOPERS * KEEP + 8];
  int n;
} listing_t;

static int list_block(const gg_block_info_t *b, void *user) {
  listing_t *l = user;
  if (l->n < (int)(sizeof l->v / sizeof l->v[0])) l->v[l->n++] = *b;
  return 0;
}

/* Waits a few ms, and then until `counter` reached `least` (a loaded machine may run the threads late). */
static void wait_for(int ms, atomic_int *counter, int least) {
  struct timespec d = {0, ms * 1000000L};
  nanosleep(&d, NULL);
  while (counter && atomic_load(counter) < least) sched_yield();
}

static void test_scope_end_vs_caching_threads(void **state) {
  (void)state;
  memset(&sc, 0, sizeof sc);
  sc.arena = mk(NULL);
  pthread_t t[SCOPERS];
  for (int i = 0; i < SCOPERS; i++) pthread_create(&t[i], NULL, alloc_across_scopes, (void *)(intptr_t)i);
  wait_for(10, &sc.pairs, 2000); /* caches fill and serve */
  gg_scope_t s;
  atomic_store(&sc.phase, PH_BEGINNING);
  gg_assert_ok(gg_scope_begin(sc.arena, &s));
  atomic_store(&sc.phase, PH_OPEN);
  wait_for(10, &sc.inside, 8);
  atomic_store(&sc.phase, PH_ENDING);
  gg_assert_ok(gg_scope_end(&s));
  atomic_store(&sc.phase, PH_ENDED);
  int pairs = atomic_load(&sc.pairs);
  wait_for(10, &sc.pairs, pairs + 2000);
  atomic_store(&sc.phase, PH_STOP);
  for (int i = 0; i < SCOPERS; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < SCOPERS; i++)
    if (sc.error[i][0]) fail_msg("thread %d: %s", i, sc.error[i]);
  static listing_t l;
  l.n = 0;
  gg_assert_ok(gg_arena_foreach_block(sc.arena, list_block, &l));
  int alive = 0, owned = 0;
  for (int i = 0; i < SCOPERS; i++)
    for (int j = 0; j < sc.n[i]; j++) {
      const sblock_t *b = &sc.kept[i][j];
      bool is = listed(b->p, l.v, l.n);
      if (surely_alive(b) && !is)
        fail_msg("a block allocated outside the scope (phases %d..%d) was released", b->before, b->after);
      if (b->before >= PH_OPEN && b->after <= PH_OPEN) { /* wholly inside the scope */
        if (is) fail_msg("a block allocated inside the scope outlived it");
        owned++;
      }
      if (is) {
        alive++;
        gg_assert_ok(gg_free(sc.arena, b->p));
      }
    }
  printf("blocks kept: %d outlived the scope, %d allocated wholly inside it were released\n", alive, owned);
  assert_true(owned > 0);
  gg_arena_stats_t st = stats(sc.arena);
  assert_int_equal(st.n_live, 0);
  gg_assert_ok(gg__arena_check(sc.arena));
  gg_assert_ok(gg_arena_destroy(sc.arena));
}

/* ---- blocks caches hand out inside scopes --------------------------------------------------------- */

typedef struct depths {
  void *ptr[64];
  int depth[64];
  int n;
} depths_t;

static int note_depth(const gg_block_info_t *b, void *user) {
  depths_t *d = user;
  if (d->n < 64) d->ptr[d->n] = b->ptr, d->depth[d->n++] = b->scope_depth;
  return 0;
}

/* The depth foreach lists for p, or -1 when p is not a live block. */
static int depth_of(gg_arena_t *a, void *p) {
  depths_t d = {.n = 0};
  gg_assert_ok(gg_arena_foreach_block(a, note_depth, &d));
  for (int i = 0; i < d.n; i++)
    if (d.ptr[i] == p) return d.depth[i];
  return -1;
}

static unsigned long long cached_allocs(gg_arena_t *a) {
  gg__arena_probe_t pr;
  gg_assert_ok(gg__arena_probe(a, &pr));
  return pr.cached_allocs;
}

static void expect_live(gg_arena_t *a, unsigned long long live, size_t bytes) {
  gg_arena_stats_t s = stats(a);
  assert_int_equal(s.n_live, live);
  assert_int_equal(s.bytes_in_use, bytes);
  gg_assert_ok(gg__arena_check(a));
}

/* One thread: allocations inside scopes come from its cache and belong to the innermost scope, published
 * or not; frees inside a scope of blocks from outside it or from an outer scope keep every frame right. */
static void test_cache_in_scopes(void **state) {
  (void)state;
  gg_arena_t *a = mk(NULL);
  void *p;
  for (int i = 0; i < 200; i++) {
    gg_assert_ok(gg_alloc(a, 4 * KiB, &p));
    gg_assert_ok(gg_free(a, p));
  }
  void *out0, *out1; /* depth 0: out1 is published before the scopes, out0 is not */
  gg_assert_ok(gg_alloc(a, 4 * KiB, &out1));
  assert_int_equal(depth_of(a, out1), 0); /* foreach publishes */
  gg_assert_ok(gg_alloc(a, 4 * KiB, &out0));
  unsigned long long c0 = cached_allocs(a);
  gg_scope_t s1, s2;
  gg_assert_ok(gg_scope_begin(a, &s1));
  void *x1[8];
  for (int i = 0; i < 8; i++) gg_assert_ok(gg_alloc(a, 4 * KiB, &x1[i]));
  for (int i = 0; i < 200; i++) {
    gg_assert_ok(gg_alloc(a, 4 * KiB, &p));
    gg_assert_ok(gg_free(a, p));
  }
  expect_live(a, 10, 10 * 4 * KiB);
  /* the cache served them: the probe counts its allocations as it publishes (foreach does) */
  assert_int_equal(depth_of(a, x1[3]), 1);
  assert_true(cached_allocs(a) - c0 >= 200);
  gg_assert_ok(gg_free(a, x1[0])); /* published, in scope 1's array: the last record moves into its slot */
  gg_assert_ok(gg_alloc(a, 4 * KiB, &x1[0])); /* from the cache, unpublished */
  gg_assert_ok(gg_scope_begin(a, &s2));
  void *x2[8];
  for (int i = 0; i < 8; i++) gg_assert_ok(gg_alloc(a, 4 * KiB, &x2[i]));
  gg_assert_ok(gg_free(a, out0));  /* depth 0, never published: back to the cache */
  gg_assert_ok(gg_free(a, out1));  /* depth 0, published: frame 0's list */
  gg_assert_ok(gg_free(a, x1[1])); /* scope 1's, published */
  gg_assert_ok(gg_free(a, x1[0])); /* scope 1's, unpublished */
  gg_assert_ok(gg_free(a, x2[0])); /* its own scope's, unpublished */
  expect_live(a, 6 + 7, 13 * 4 * KiB);
  assert_int_equal(depth_of(a, x2[1]), 2);
  assert_int_equal(depth_of(a, x1[2]), 1);
  gg_assert_ok(gg_free(a, x2[1])); /* published into scope 2's array */
  void *late[4];                   /* unpublished when the scope ends */
  for (int i = 0; i < 4; i++) gg_assert_ok(gg_alloc(a, 4 * KiB, &late[i]));
  expect_live(a, 6 + 6 + 4, 16 * 4 * KiB);
  gg_assert_ok(gg_scope_end(&s2));
  expect_live(a, 6, 6 * 4 * KiB); /* scope 2's blocks went, cached or not */
  for (int i = 0; i < 4; i++) gg_assert_fails(gg_free(a, late[i]), GG_EINVAL, "");
  for (int i = 2; i < 8; i++) gg_assert_fails(gg_free(a, x2[i]), GG_EINVAL, "");
  void *after; /* after the end: the enclosing scope's */
  gg_assert_ok(gg_alloc(a, 4 * KiB, &after));
  assert_int_equal(depth_of(a, after), 1);
  gg_assert_ok(gg_alloc(a, 4 * KiB, &after));
  gg_assert_ok(gg_scope_end(&s1));
  expect_live(a, 0, 0);
  gg_assert_fails(gg_free(a, after), GG_EINVAL, "");
  gg_assert_ok(gg_alloc(a, 4 * KiB, &p)); /* outside again: lives on */
  assert_int_equal(depth_of(a, p), 0);
  gg_assert_ok(gg_free(a, p));
  expect_live(a, 0, 0);
  gg_assert_ok(gg_arena_trim(a, 0));
  assert_int_equal(stats(a).bytes_mapped, 0);
  gg_assert_ok(gg_arena_destroy(a));
}

/* Another thread's cache hands out blocks inside a scope and has not published them when the scope ends:
 * the end releases them all the same, and they are never handed back as live. */
static struct {
  gg_arena_t *arena;
  atomic_int step;
  void *blocks[20];
  int rc, rc_free_after;
  void *after;
} ot;

static void *other_thread_in_scope(void *arg) {
  (void)arg;
  while (atomic_load(&ot.step) < 1) sched_yield();
  void *p;
  for (int i = 0; i < 300 && ot.rc == 0; i++) /* the cache fills (inside the scope: refills too) */
    if ((ot.rc = gg_alloc(ot.arena, 8 * KiB, &p)) == 0) ot.rc = gg_free(ot.arena, p);
  for (int i = 0; i < 20 && ot.rc == 0; i++) ot.rc = gg_alloc(ot.arena, 8 * KiB, &ot.blocks[i]);
  atomic_store(&ot.step, 2);
  while (atomic_load(&ot.step) < 3) sched_yield(); /* the scope ends meanwhile */
  ot.rc_free_after = gg_free(ot.arena, ot.blocks[19]);
  if (ot.rc == 0) ot.rc = gg_alloc(ot.arena, 8 * KiB, &ot.after);
  atomic_store(&ot.step, 4);
  while (atomic_load(&ot.step) < 5) sched_yield(); /* alive: its cache is not given back by an exit */
  return NULL;
}

static void test_scope_end_takes_other_threads_cached(void **state) {
  (void)state;
  memset(&ot, 0, sizeof ot);
  ot.arena = mk(NULL);
  pthread_t t;
  pthread_create(&t, NULL, other_thread_in_scope, NULL);
  gg_scope_t scope;
  gg_assert_ok(gg_scope_begin(ot.arena, &scope));
  atomic_store(&ot.step, 1);
  while (atomic_load(&ot.step) < 2) sched_yield();
  gg_assert_ok(ot.rc);
  gg_arena_stats_t s = stats(ot.arena); /* counts the caches' unpublished blocks too */
  assert_int_equal(s.n_live, 20);
  unsigned long long before = cached_allocs(ot.arena);
  gg_assert_ok(gg_scope_end(&scope));
  assert_true(cached_allocs(ot.arena) > before); /* some were still unpublished in its cache */
  expect_live(ot.arena, 0, 0);
  atomic_store(&ot.step, 3);
  while (atomic_load(&ot.step) < 4) sched_yield();
  gg_assert_ok(ot.rc);
  assert_int_equal(ot.rc_free_after, GG_EINVAL); /* released by the end: not its cache's any more */
  expect_live(ot.arena, 1, 8 * KiB);
  assert_int_equal(depth_of(ot.arena, ot.after), 0); /* allocated after the end: outside every scope */
  for (int i = 0; i < 19; i++) assert_ptr_not_equal(ot.blocks[i], NULL);
  atomic_store(&ot.step, 5);
  pthread_join(t, NULL);
  gg_assert_ok(gg_free(ot.arena, ot.after));
  expect_live(ot.arena, 0, 0);
  gg_assert_ok(gg_arena_destroy(ot.arena));
}

/* ---- scopes end while eight threads allocate and free inside them ------------------------------------ */

/* A controller begins and ends scopes while RT_THREADS threads allocate and free through their caches.
 * Each allocation notes the scope state before and after it: state s is stable while `epoch` is 2s and in
 * change while 2s+1, so the block belongs to the innermost scope of one of the states it saw. Frees of
 * blocks a scope may own take the read side of `gate` (a scope end its write side) and go ahead only while
 * every scope the block may belong to is open; allocations, pairs outside scopes, frees of blocks outside
 * every scope and scope begins race the ends freely. At the end every block the threads kept is checked
 * against foreach: one outside every scope is live, one of a scope (they all ended) is gone. */
#define RT_THREADS 8
#define RT_SLOTS   24
#define RT_STATES  100000
#define RT_SCOPES  4096

typedef struct rblock {
  void *p;
  size_t size;
  unsigned lo, hi;        /* the states it may have been allocated in */
} rblock_t;

typedef struct rworker {
  int id;
  unsigned long long rng;
  rblock_t held[RT_SLOTS];
  int n;
  rblock_t *kept; /* blocks whose scope may have ended: never freed, checked at the end */
  int n_kept, kept_cap;
  unsigned long long ops[4]; /* allocations, frees, frees inside a scope, checks */
  char error[300];
} rworker_t;

static struct {
  gg_arena_t *arena;
  pthread_rwlock_t gate;
  atomic_uint epoch;
  atomic_int running, failed;
  atomic_ullong outside_frees; /* read by the controller while the threads run */
  int state_scope[RT_STATES]; /* innermost open scope of each state (0: none), written before its epoch */
  atomic_bool ended[RT_SCOPES];
  char error[300];
} rt;

static unsigned rrnd(unsigned long long *r, unsigned n) {
  *r ^= *r >> 12, *r ^= *r << 25, *r ^= *r >> 27;
  return (unsigned)((*r * 2685821657736338717ull) >> 33) % n;
}

/* Whether some state the block may belong to had a scope open, or had none. */
static bool rb_scoped(const rblock_t *b) {
  for (unsigned s = b->lo; s <= b->hi; s++)
    if (rt.state_scope[s]) return true;
  return false;
}
static bool rb_outside(const rblock_t *b) {
  for (unsigned s = b->lo; s <= b->hi; s++)
    if (!rt.state_scope[s]) return true;
  return false;
}
static bool rb_owner_ended(const rblock_t *b) {
  for (unsigned s = b->lo; s <= b->hi; s++)
    if (rt.state_scope[s] && atomic_load(&rt.ended[rt.state_scope[s]])) return true;
  return false;
}

static void rw_keep(rworker_t *w, const rblock_t *b) {
  if (w->n_kept == w->kept_cap) {
    w->kept_cap = w->kept_cap ? 2 * w->kept_cap : 256;
    w->kept = realloc(w->kept, (size_t)w->kept_cap * sizeof *w->kept);
  }
  w->kept[w->n_kept++] = *b;
}

/* Frees held block i when that is safe, else keeps it for the final check. */
static int rw_free(rworker_t *w, int i) {
  rblock_t b = w->held[i];
  w->held[i] = w->held[--w->n];
  if (!rb_scoped(&b)) { /* outside every scope: no end can release it */
    w->ops[1]++, atomic_fetch_add(&rt.outside_frees, 1);
    return gg_free(rt.arena, b.p);
  }
  int rc = 0;
  pthread_rwlock_rdlock(&rt.gate);
  if (rb_owner_ended(&b)) {
    rw_keep(w, &b);
  } else {
    rc = gg_free(rt.arena, b.p);
    w->ops[2]++;
  }
  pthread_rwlock_unlock(&rt.gate);
  return rc;
}

static void *rt_worker(void *arg) {
  rworker_t *w = arg;
  static const size_t sizes[] = {256, 1 * KiB, 4 * KiB, 4 * KiB, 16 * KiB, 64 * KiB, 100 * KiB};
  while (atomic_load(&rt.running)) {
    unsigned op = rrnd(&w->rng, 100);
    int rc = 0;
    if (op < 55 && w->n < RT_SLOTS) {
      rblock_t b = {.size = sizes[rrnd(&w->rng, 7)] - rrnd(&w->rng, 200)};
      unsigned e0 = atomic_load(&rt.epoch);
      rc = gg_alloc(rt.arena, b.size, &b.p);
      unsigned e1 = atomic_load(&rt.epoch);
      b.lo = e0 / 2, b.hi = (e1 + 1) / 2;
      if (rc == 0) {
        w->held[w->n++] = b, w->ops[0]++;
        if (op < 25) rc = rw_free(w, w->n - 1); /* a pair */
      }
    } else if (op < 97 && w->n) {
      rc = rw_free(w, (int)rrnd(&w->rng, (unsigned)w->n));
    } else if (op >= 97) { /* the checker among it all */
      rc = gg__arena_check(rt.arena);
      w->ops[3]++;
    }
    if (rc < 0) {
      snprintf(w->error, sizeof w->error, "%s", gg_last_error());
      atomic_store(&rt.failed, 1);
      break;
    }
  }
  return NULL;
}

static pthread_t rt_tid[RT_THREADS];

/* The threads stop before a failure is reported: the test must fail, not hang with them running. */
static void rt_stop(void) {
  if (!atomic_exchange(&rt.running, 0)) return;
  for (int i = 0; i < RT_THREADS; i++) pthread_join(rt_tid[i], NULL);
}

#define RT_OK(call, locked)                                                  \
  do {                                                                       \
    if ((call) < 0) {                                                        \
      snprintf(rt.error, sizeof rt.error, "%s: %s", #call, gg_last_error()); \
      if (locked) pthread_rwlock_unlock(&rt.gate);                           \
      rt_stop();                                                             \
      fail_msg("%s", rt.error);                                              \
    }                                                                        \
  } while (0)

typedef struct rlisted {
  void **v;
  size_t n, cap;
} rlisted_t;

static int rt_list(const gg_block_info_t *b, void *user) {
  rlisted_t *l = user;
  if (l->n < l->cap) l->v[l->n++] = b->ptr;
  return 0;
}

static int rb_cmp(const void *x, const void *y) { /* by address */
  uintptr_t a = (uintptr_t)((const rblock_t *)x)->p, b = (uintptr_t)((const rblock_t *)y)->p;
  return a < b ? -1 : a > b;
}

static void test_scope_ends_race_caching_threads(void **state) {
  (void)state;
  memset(&rt, 0, sizeof rt);
  rt.arena = mk(NULL);
  pthread_rwlockattr_t ra;
  pthread_rwlockattr_init(&ra);
  pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP); /* ends get their turn */
  pthread_rwlock_init(&rt.gate, &ra);
  pthread_rwlockattr_destroy(&ra);
  atomic_store(&rt.running, 1);
  static rworker_t w[RT_THREADS];
  memset(w, 0, sizeof w);
  for (int i = 0; i < RT_THREADS; i++) {
    w[i].id = i, w[i].rng = 0x9E3779B97F4A7C15ull * (unsigned long long)(i + 1);
    pthread_create(&rt_tid[i], NULL, rt_worker, &w[i]);
  }
  gg_scope_t scopes[5];
  int serial[5] = {0}, depth = 0, next = 1, begins = 0, ends = 0;
  unsigned long long rng = 42;
  unsigned s = 0; /* the current state */
  for (int round = 0; round < 400 && s + 2 < RT_STATES && next < RT_SCOPES; round++) {
    struct timespec d = {0, (long)(50 + rrnd(&rng, 200)) * 1000};
    nanosleep(&d, NULL);
    bool begin = depth == 0 || (depth < 5 && rrnd(&rng, 2));
    if (!begin) pthread_rwlock_wrlock(&rt.gate);
    rt.state_scope[s + 1] = begin ? next : depth > 1 ? serial[depth - 2] : 0;
    atomic_store(&rt.epoch, 2 * s + 1);
    if (begin) {
      RT_OK(gg_scope_begin(rt.arena, &scopes[depth]), false);
      serial[depth++] = next++, begins++;
    } else {
      RT_OK(gg_scope_end(&scopes[--depth]), true);
      atomic_store(&rt.ended[serial[depth]], true), ends++;
    }
    atomic_store(&rt.epoch, 2 * ++s);
    if (!begin) pthread_rwlock_unlock(&rt.gate);
    if (!begin) RT_OK(gg__arena_check(rt.arena), false); /* while the threads run on */
  }
  while (depth) { /* every scope ends: what the threads still hold of them goes */
    pthread_rwlock_wrlock(&rt.gate);
    rt.state_scope[s + 1] = depth > 1 ? serial[depth - 2] : 0;
    atomic_store(&rt.epoch, 2 * s + 1);
    RT_OK(gg_scope_end(&scopes[--depth]), true);
    atomic_store(&rt.ended[serial[depth]], true), ends++;
    atomic_store(&rt.epoch, 2 * ++s);
    pthread_rwlock_unlock(&rt.gate);
  }
  unsigned long long frees_before = atomic_load(&rt.outside_frees); /* a little more outside scopes */
  while (!atomic_load(&rt.failed) && atomic_load(&rt.outside_frees) < frees_before + 1000) sched_yield();
  rt_stop();
  for (int i = 0; i < RT_THREADS; i++)
    if (w[i].error[0]) fail_msg("thread %d: %s", i, w[i].error);
  gg_assert_ok(gg__arena_check(rt.arena));

  /* Every block the threads kept, by address, against the live blocks. */
  size_t n = 0;
  for (int i = 0; i < RT_THREADS; i++) n += (size_t)(w[i].n + w[i].n_kept);
  rblock_t *all = malloc((n + 1) * sizeof *all);
  n = 0;
  for (int i = 0; i < RT_THREADS; i++) {
    memcpy(all + n, w[i].held, (size_t)w[i].n * sizeof *all), n += (size_t)w[i].n;
    memcpy(all + n, w[i].kept, (size_t)w[i].n_kept * sizeof *all), n += (size_t)w[i].n_kept;
  }
  qsort(all, n, sizeof *all, rb_cmp);
  rlisted_t l = {.v = malloc((n + 1) * sizeof(void *)), .cap = n + 1};
  gg_assert_ok(gg_arena_foreach_block(rt.arena, rt_list, &l));
  /* Blocks at one address: an earlier one was released (by a free or a scope end) before the next came. */
  size_t outside = 0, scoped = 0, either = 0, live = 0;
  for (size_t i = 0, k; i < n; i = k) {
    bool must = false, may = false; /* one of them lives surely / possibly */
    for (k = i; k < n && all[k].p == all[i].p; k++) {
      bool in = rb_scoped(&all[k]), out = rb_outside(&all[k]);
      must |= !in, may |= out;
      if (in && out)
        either++;
      else if (in)
        scoped++;
      else
        outside++;
    }
    bool is = false;
    for (size_t j = 0; j < l.n && !is; j++) is = l.v[j] == all[i].p;
    if (must && !is)
      fail_msg("a block allocated outside every scope was released (states %u..%u)", all[i].lo, all[i].hi);
    if (!may && is)
      fail_msg("a block of a scope that ended is still live (states %u..%u)", all[i].lo, all[i].hi);
    if (is) {
      gg_assert_ok(gg_free(rt.arena, all[i].p));
      live++;
    }
  }
  if (live != l.n) fail_msg("%zu live blocks, of which %zu are the threads'", l.n, live);
  unsigned long long sum[4] = {0};
  for (int i = 0; i < RT_THREADS; i++)
    for (int k = 0; k < 4; k++) sum[k] += w[i].ops[k];
  printf("%d threads: %d scope begins, %d ends; %llu allocations, %llu frees outside scopes, %llu inside, "
         "%llu checks; kept blocks: %zu outside scopes, %zu of scopes, %zu either\n",
         RT_THREADS, begins, ends, sum[0], sum[1], sum[2], sum[3], outside, scoped, either);
  assert_true(scoped > 0 && sum[2] > 0 && ends > 10);
  expect_live(rt.arena, 0, 0);
  gg_assert_ok(gg_arena_trim(rt.arena, 0));
  assert_int_equal(stats(rt.arena).bytes_mapped, 0);
  for (int i = 0; i < RT_THREADS; i++) free(w[i].kept);
  free(all), free(l.v);
  pthread_rwlock_destroy(&rt.gate);
  gg_assert_ok(gg_arena_destroy(rt.arena));
}

/* ---- a block freed while the stream is busy stays out of use ------------------------------------- */

typedef struct busy {
  gg_arena_t *arena;
  void *watched; /* must not come back while the stream is held */
  atomic_int step;
  int hits;
  char error[200];
} busy_t;

static void *pairs_avoiding(void *arg) {
  busy_t *b = arg;
  while (atomic_load(&b->step) < 1) sched_yield();
  for (int i = 0; i < 300; i++) {
    void *p;
    if (gg_alloc(b->arena, 4 * KiB, &p) < 0 || gg_free(b->arena, p) < 0) {
      snprintf(b->error, sizeof b->error, "%s", gg_last_error());
      break;
    }
    if (p == b->watched) b->hits++;
  }
  return NULL;
}

static void test_stream_ticket_busy(void **state) {
  (void)state;
  void *stream = NULL;
  gg_assert_ok(gg_host_stream_create(&stream));
  gg_arena_t *a = mk(stream);
  void *p = NULL;
  for (int i = 0; i < 200; i++) { /* the cache fills and serves while the stream is idle */
    gg_assert_ok(gg_alloc(a, 4 * KiB, &p));
    gg_assert_ok(gg_free(a, p));
  }
  gg_assert_ok(gg_alloc(a, 4 * KiB, &p));
  gg_assert_ok(gg_host_stream_hold(stream)); /* a kernel still runs: it may use p after the free */
  gg_assert_ok(gg_free(a, p));
  assert_true(stats(a).bytes_pending >= 4 * KiB);
  busy_t b = {.arena = a, .watched = p};
  pthread_t other;
  pthread_create(&other, NULL, pairs_avoiding, &b);
  atomic_store(&b.step, 1);
  for (int i = 0; i < 300; i++) { /* this thread's own cache holds p: it must pass it by */
    void *q;
    gg_assert_ok(gg_alloc(a, 4 * KiB, &q));
    if (q == p) fail_msg("a block freed while the stream was busy came back after %d allocations", i);
    gg_assert_ok(gg_free(a, q));
  }
  pthread_join(other, NULL);
  if (b.error[0]) fail_msg("other thread: %s", b.error);
  assert_int_equal(b.hits, 0);
  gg_assert_ok(gg__arena_check(a));
  gg_assert_ok(gg_host_stream_release(stream));
  assert_int_equal(stats(a).bytes_pending, 0); /* idle: everything is reusable, the watched block too */
  static void *all[4096];
  int back = -1, n = 0;
  while (n < 4096 && back < 0) {
    gg_assert_ok(gg_alloc(a, 4 * KiB, &all[n]));
    if (all[n++] == p) back = n;
  }
  printf("the watched block came back after the stream went idle, at allocation %d\n", back);
  assert_true(back > 0);
  for (int i = 0; i < n; i++) gg_assert_ok(gg_free(a, all[i]));
  gg_assert_ok(gg_arena_destroy(a));
  gg_host_stream_destroy(stream);
}

static int setup(void **state) {
  (void)state;
  setenv("GPUGUARD_BACKEND", "host", 1);
  setenv("GPUGUARD_HOST_CAPACITY", "256M", 1);
  unsetenv("GPUGUARD_HOST_FAULT");
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_thread_exit_gives_back, setup),
      cmocka_unit_test_setup(test_destroy_while_threads_cache, setup),
      cmocka_unit_test_setup(test_scope_end_vs_caching_threads, setup),
      cmocka_unit_test_setup(test_stream_ticket_busy, setup),
      cmocka_unit_test_setup(test_cache_in_scopes, setup),
      cmocka_unit_test_setup(test_scope_end_takes_other_threads_cached, setup),
      cmocka_unit_test_setup(test_scope_ends_race_caching_threads, setup),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
