/* test_arena_cache_threads.c — the per-thread caches of an arena (src/arena_cache.c) where threads
 * meet: a thread that exits with blocks cached and handed out, an arena destroyed while threads
 * cache from it, scopes that begin and end while threads allocate, a freed block that must not come
 * back while the arena's stream is busy; and, on one thread, the cache's filter of sizes and its
 * publish. Meant to run under ThreadSanitizer too (-DGPUGUARD_SANITIZE=thread). */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>

#include "arena/arena_internal.h"
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

/* ---- a thread exits with blocks in its cache ------------------------------------------------- */

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

/* ---- an arena destroyed while threads cache from it ------------------------------------------ */

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
    if (a != of)
      memset(held, 0, sizeof held), of = a; /* the old one was destroyed: they went with it */
    void *p;
    int rc = gg_alloc(a, 256 + (i % 4) * 1024, &p);
    if (rc ==
        0) { /* (its memory is not touched: the arena may be destroyed right after the call) */
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

/* gg_arena_foreach_block publishes the blocks this thread's cache handed out before it lists them;
 * it returned how many it had published (a positive status) instead of 0. */
static void test_foreach_lists_unpublished_blocks(void **state) {
  (void)state;
  gg_arena_t *a = mk(NULL);
  void *p;
  for (int i = 0; i < 100; i++) {
    gg_assert_ok(gg_alloc(a, 4 * KiB, &p));
    gg_assert_ok(gg_free(a, p));
  }
  gg_assert_ok(gg_alloc(a, 4 * KiB, &p)); /* from the cache, not yet published */
  int n = 0;
  gg_assert_ok(gg_arena_foreach_block(a, count_block, &n));
  assert_int_equal(n, 1);
  gg__arena_probe_t pr; /* the caches' counts reach the probe when they publish */
  gg_assert_ok(gg__arena_probe(a, &pr));
  assert_true(pr.cached_allocs > 50);
  gg_assert_ok(gg_free(a, p));
  gg_assert_ok(gg_arena_destroy(a));
}

/* A cache serves an allocation only when its tag is the cache's own (compared byte by byte): a
 * prefix or an extension of it is another tag, and a tag longer than the limit matches its cut
 * form. */
static int tag_of(const gg_block_info_t *b, void *user) {
  const char **out = user;
  *out = b->tag;
  return 1;
}

static const char *alloc_tag(gg_arena_t *a, const char *tag, void **p) {
  gg_assert_ok(gg_alloc_ex(a, 4 * KiB, 0, tag, p));
  const char *got = NULL;
  gg_assert_ok(gg_arena_foreach_block(a, tag_of, &got)); /* the only live block */
  return got;
}

static void test_cache_tags(void **state) {
  (void)state;
  char longtag[100], other[100];
  memset(longtag, 'L', 99), longtag[99] = '\0';
  memcpy(other, longtag, sizeof other), other[80] = 'x'; /* the same first 63 bytes */
  const char *tags[] = {"alpha", "alphabet", "alph", "alpha", longtag, other}; /* in this order */
  const char *want[] = {"alpha", "alphabet", "alph", "alpha", NULL, NULL};
  gg_arena_t *a = mk(NULL);
  void *p;
  for (size_t t = 0; t < sizeof tags / sizeof *tags; t++) {
    for (int i = 0; i < 50; i++) { /* the cache takes this tag */
      gg_assert_ok(gg_alloc_ex(a, 4 * KiB, 0, tags[t], &p));
      gg_assert_ok(gg_free(a, p));
    }
    const char *got = alloc_tag(a, tags[t], &p);
    if (want[t])
      assert_string_equal(got, want[t]);
    else {
      assert_int_equal(strlen(got), 63);
      assert_memory_equal(got, longtag, 63);
    }
    gg_assert_ok(gg_free(a, p));
  }
  /* Whichever tag the cache holds now, another one is never reported as it. */
  for (int i = 0; i < 50; i++) {
    gg_assert_ok(gg_alloc_ex(a, 4 * KiB, 0, "alpha", &p));
    gg_assert_ok(gg_free(a, p));
  }
  assert_string_equal(alloc_tag(a, "alphabet", &p), "alphabet");
  gg_assert_ok(gg_free(a, p));
  assert_string_equal(alloc_tag(a, "alph", &p), "alph");
  gg_assert_ok(gg_free(a, p));
  assert_string_equal(alloc_tag(a, "", &p), "");
  gg_assert_ok(gg_free(a, p));
  gg__arena_probe_t pr;
  gg_assert_ok(gg__arena_probe(a, &pr));
  assert_true(pr.cached_allocs > 200); /* the pairs took the caches */
  gg_assert_ok(gg__arena_check(a));
  gg_assert_ok(gg_arena_destroy(a));
}

static void test_destroy_while_threads_cache(void **state) {
  (void)state;
  memset(&dz, 0, sizeof dz);
  atomic_store(&dz.arena, mk(NULL));
  pthread_t t[PAIRERS];
  for (int i = 0; i < PAIRERS; i++)
    pthread_create(&t[i], NULL, pair_until_stopped, (void *)(intptr_t)i);
  for (int round = 0; round < 3; round++) {
    wait_pairs(500);
    gg_arena_t *old = atomic_load(&dz.arena);
    gg_assert_ok(gg_arena_destroy(old)); /* threads hold cache entries of it right now */
    atomic_store(&dz.arena, mk(NULL)); /* their next calls fail once, then cache from the new one */
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

/* ---- scopes begin and end while threads allocate --------------------------------------------- */

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
  atomic_int inside,
      pairs; /* blocks allocated wholly inside the open scope; pairs outside scopes */
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
    if (!surely_alive(
            &b)) { /* a scope may own it: kept (never freed), its fate checked at the end */
      kept[n++] = b;
      struct timespec d = {0, 200 * 1000}; /* so the scope's phases see several of these */
      nanosleep(&d, NULL);
    } else if (n < KEEP / 4 && i % 8 == 0) { /* outside any scope: some stay live across the scope
                                              * (most slots stay free for blocks a scope may own) */
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

/* Waits a few ms, and then until `counter` reached `least` (a loaded machine may run the threads
 * late). */
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
  for (int i = 0; i < SCOPERS; i++)
    pthread_create(&t[i], NULL, alloc_across_scopes, (void *)(intptr_t)i);
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
        fail_msg("a block allocated outside the scope (phases %d..%d) was released", b->before,
                 b->after);
      if (b->before >= PH_OPEN && b->after <= PH_OPEN) { /* wholly inside the scope */
        if (is) fail_msg("a block allocated inside the scope outlived it");
        owned++;
      }
      if (is) {
        alive++;
        gg_assert_ok(gg_free(sc.arena, b->p));
      }
    }
  printf("blocks kept: %d outlived the scope, %d allocated wholly inside it were released\n", alive,
         owned);
  assert_true(owned > 0);
  gg_arena_stats_t st = stats(sc.arena);
  assert_int_equal(st.n_live, 0);
  gg_assert_ok(gg__arena_check(sc.arena));
  gg_assert_ok(gg_arena_destroy(sc.arena));
}

/* ---- a block freed while the stream is busy stays out of use --------------------------------- */

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
    if (q == p)
      fail_msg("a block freed while the stream was busy came back after %d allocations", i);
    gg_assert_ok(gg_free(a, q));
  }
  pthread_join(other, NULL);
  if (b.error[0]) fail_msg("other thread: %s", b.error);
  assert_int_equal(b.hits, 0);
  gg_assert_ok(gg__arena_check(a));
  gg_assert_ok(gg_host_stream_release(stream));
  assert_int_equal(stats(a).bytes_pending,
                   0); /* idle: everything is reusable, the watched block too */
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

/* ---- one thread: the cache's size filter and its publish by bits ----------------------------- */

static unsigned long long cached_allocs(gg_arena_t *a) {
  gg__arena_probe_t pr;
  gg_assert_ok(gg__arena_probe(a, &pr));
  return pr.cached_allocs;
}

/* `pairs` alloc+free pairs of `size`; how many of them the cache served (what it published to the
 * probe). */
static unsigned long long pairs_cached(gg_arena_t *a, size_t size, int pairs) {
  unsigned long long before = cached_allocs(a);
  void *p;
  for (int i = 0; i < pairs; i++) {
    gg_assert_ok(gg_alloc(a, size, &p));
    gg_assert_ok(gg_free(a, p));
  }
  int n = 0;
  gg_assert_ok(
      gg_arena_foreach_block(a, count_block, &n)); /* the caches publish their counts first */
  return cached_allocs(a) - before;
}

/* Sizes whose quanta agree in their low six bits share one entry of a cache's filter of the sizes
 * its classes hold (4, 20, 36 and 52 KiB here): each is still served once it has a class, a size
 * that only shares the entry is not mistaken for one, and after sizes seen once took and gave up
 * slots the filter still agrees with the classes (gg__arena_check compares them). */
static void test_cache_sizes_sharing_a_filter_entry(void **state) {
  (void)state;
  gg_arena_t *a = mk(NULL);
  assert_true(pairs_cached(a, 4 * KiB, 100) >= 90);
  assert_true(pairs_cached(a, 20 * KiB, 100) >= 90); /* its entry was set by 4 KiB already */
  assert_true(pairs_cached(a, 4 * KiB, 100) >= 90);
  gg_assert_ok(gg__arena_check(a));
  void *p;
  gg_assert_ok(gg_alloc(a, 36 * KiB, &p)); /* shares the entry, has no class: the arena's path */
  gg_arena_stats_t s = stats(a);
  assert_int_equal(s.n_live, 1);
  assert_int_equal(s.bytes_in_use, 36 * KiB);
  gg_assert_ok(gg__arena_check(a));
  gg_assert_ok(gg_free(a, p));
  for (size_t k = 1; k <= 40; k++) { /* sizes seen once: each takes a slot, the least used one */
    gg_assert_ok(gg_alloc(a, k * 256 + 52 * KiB * (k % 2), &p));
    gg_assert_ok(gg_free(a, p));
  }
  gg_assert_ok(gg__arena_check(a));
  assert_true(pairs_cached(a, 20 * KiB, 100) >= 90);
  assert_true(pairs_cached(a, 4 * KiB, 100) >= 90);
  gg_assert_ok(gg__arena_check(a));
  assert_int_equal(stats(a).n_live, 0);
  gg_assert_ok(gg_arena_destroy(a));
}

/* Blocks a cache handed out, some of them freed back into it (its table of live blocks closes the
 * gaps by moving entries), are published all at once by the next allocation on the arena's path:
 * every one becomes the arena's, exactly once, with the counts exact. */
static void test_cache_publishes_every_live_block(void **state) {
  (void)state;
  gg_arena_t *a = mk(NULL);
  enum { N = 60 };
  void *p[N], *big;
  assert_true(pairs_cached(a, 4 * KiB, 100) >= 90);
  for (int round = 0; round < 3; round++) {
    for (int i = 0; i < N; i++) gg_assert_ok(gg_alloc(a, 4 * KiB, &p[i]));
    int live = N;
    for (int i = N - 1; i >= 0; i -= 3) {
      gg_assert_ok(gg_free(a, p[i]));
      p[i] = NULL, live--;
    }
    gg_assert_ok(gg_alloc(a, 1 * MiB, &big)); /* publishes what the cache still holds as live */
    int n = 0;
    gg_assert_ok(gg_arena_foreach_block(a, count_block, &n));
    assert_int_equal(n, live + 1);
    gg_arena_stats_t s = stats(a);
    assert_int_equal(s.n_live, live + 1);
    assert_int_equal(s.bytes_in_use, (size_t)live * 4 * KiB + 1 * MiB);
    gg_assert_ok(gg__arena_check(a));
    for (int i = 0; i < N; i++)
      if (p[i]) gg_assert_ok(gg_free(a, p[i]));
    gg_assert_ok(gg_free(a, big));
    s = stats(a);
    assert_int_equal(s.n_live, 0);
    assert_int_equal(s.bytes_in_use, 0);
    assert_int_equal(s.n_allocs, s.n_frees);
    gg_assert_ok(gg__arena_check(a));
  }
  gg_assert_ok(gg_arena_destroy(a));
}

static int setup(void **state) {
  (void)state;
  gg_test_use_host("256M", NULL);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_thread_exit_gives_back, setup),
      cmocka_unit_test_setup(test_foreach_lists_unpublished_blocks, setup),
      cmocka_unit_test_setup(test_cache_tags, setup),
      cmocka_unit_test_setup(test_destroy_while_threads_cache, setup),
      cmocka_unit_test_setup(test_scope_end_vs_caching_threads, setup),
      cmocka_unit_test_setup(test_stream_ticket_busy, setup),
      cmocka_unit_test_setup(test_cache_sizes_sharing_a_filter_entry, setup),
      cmocka_unit_test_setup(test_cache_publishes_every_live_block, setup),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
