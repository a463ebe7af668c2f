/* test_arena_threads.c — several threads on one arena at once (alloc, free, stats, foreach, trim,
 * copies), each also running scopes on an arena of its own; contents and totals checked at the end.
 * Meant to run under ThreadSanitizer too (-DGPUGUARD_SANITIZE=thread). */
#include <pthread.h>

#include "arena/arena_internal.h"
#include "gg_test.h"

#define KiB     ((size_t)1 << 10)
#define MiB     ((size_t)1 << 20)
#define THREADS 4
#define OPS     30000
#define SLOTS   64

static gg_arena_t *shared;

typedef struct worker {
  int id;
  unsigned seed;
  unsigned long long allocs, frees;
  int live;
  char error[256];
} worker_t;

static unsigned rnd(unsigned *s) {
  *s = *s * 1103515245u + 12345u;
  return (*s >> 8) & 0xFFFFFF;
}

static int count_blocks(const gg_block_info_t *b, void *user) {
  (void)b;
  ++*(int *)user;
  return 0;
}

#define WFAIL(w, ...)                                    \
  do {                                                   \
    snprintf((w)->error, sizeof(w)->error, __VA_ARGS__); \
    return NULL;                                         \
  } while (0)

static void *work(void *arg) {
  worker_t *w = arg;
  unsigned char *mine[SLOTS] = {0};
  size_t sizes[SLOTS] = {0};
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.capacity = 16 * MiB, o.chunk_size = 256 * KiB, o.name = "private";
  gg_arena_t *own = NULL;
  if (gg_arena_create(&own, &o) < 0) WFAIL(w, "create: %s", gg_last_error());
  unsigned char tagbyte = (unsigned char)(0x40 + w->id);
  for (int step = 0; step < OPS; step++) {
    unsigned r = rnd(&w->seed) % 100;
    int slot = (int)(rnd(&w->seed) % SLOTS);
    if (r < 50) {
      if (mine[slot]) continue;
      size_t n = 1 + rnd(&w->seed) % (r < 5 ? 200 * KiB : 4 * KiB);
      void *p;
      int rc = gg_alloc_ex(shared, n, rnd(&w->seed) % 4 ? 0 : 4096, w->id % 2 ? "odd" : "even", &p);
      if (rc < 0) WFAIL(w, "alloc %zu: %s", n, gg_last_error());
      memset(p, tagbyte, n);
      mine[slot] = p, sizes[slot] = n, w->allocs++, w->live++;
    } else if (r < 85) {
      if (!mine[slot]) continue;
      for (size_t i = 0; i < sizes[slot]; i += 61)
        if (mine[slot][i] != tagbyte)
          WFAIL(w, "block %p byte %zu overwritten by another thread", (void *)mine[slot], i);
      if (gg_free(shared, mine[slot]) < 0) WFAIL(w, "free: %s", gg_last_error());
      mine[slot] = NULL, w->frees++, w->live--;
    } else if (r < 92) {
      gg_scope_t sc; /* scopes are per arena: each thread nests its own on its own arena */
      if (gg_scope_begin(own, &sc) < 0) WFAIL(w, "scope begin: %s", gg_last_error());
      for (int i = 0; i < 20; i++) {
        void *p;
        if (gg_alloc(own, 1 + rnd(&w->seed) % 10000, &p) < 0)
          WFAIL(w, "own alloc: %s", gg_last_error());
      }
      if (gg_scope_end(&sc) < 0) WFAIL(w, "scope end: %s", gg_last_error());
    } else if (r < 96) {
      gg_arena_stats_t s;
      if (gg_arena_stats(shared, &s) < 0) WFAIL(w, "stats: %s", gg_last_error());
      if (s.bytes_in_use > s.bytes_mapped)
        WFAIL(w, "in use %zu > mapped %zu", s.bytes_in_use, s.bytes_mapped);
    } else if (r < 98) {
      int n = 0;
      if (gg_arena_foreach_block(shared, count_blocks, &n) < 0)
        WFAIL(w, "foreach: %s", gg_last_error());
    } else if (r < 99) {
      if (gg_arena_trim(shared, rnd(&w->seed) % 2 ? 0 : 4 * MiB) < 0)
        WFAIL(w, "trim: %s", gg_last_error());
    } else if (mine[slot]) {
      unsigned char back[64];
      size_t n = sizes[slot] < sizeof back ? sizes[slot] : sizeof back;
      if (gg_arena_copy_from_device(shared, back, mine[slot], n) < 0 || back[0] != tagbyte)
        WFAIL(w, "copy back: %s", gg_last_error());
    }
  }
  for (int i = 0; i < SLOTS; i++)
    if (mine[i] && i % 2) { /* leave half live for the totals check */
      if (gg_free(shared, mine[i]) < 0) WFAIL(w, "final free: %s", gg_last_error());
      w->frees++, w->live--;
    }
  if (gg__arena_check(own) < 0 || gg_arena_destroy(own) < 0)
    WFAIL(w, "own arena: %s", gg_last_error());
  return NULL;
}

static void run(unsigned flags) {
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.capacity = 48 * MiB, o.chunk_size = 1 * MiB, o.flags = flags, o.name = "shared";
  gg_assert_ok(gg_arena_create(&shared, &o));
  pthread_t t[THREADS];
  worker_t w[THREADS];
  for (int i = 0; i < THREADS; i++) {
    w[i] = (worker_t){.id = i, .seed = 1234u + (unsigned)i * 77u};
    assert_int_equal(pthread_create(&t[i], NULL, work, &w[i]), 0);
  }
  unsigned long long allocs = 0, frees = 0;
  int live = 0;
  for (int i = 0; i < THREADS; i++) {
    pthread_join(t[i], NULL);
    if (w[i].error[0]) fail_msg("thread %d: %s", i, w[i].error);
    allocs += w[i].allocs, frees += w[i].frees, live += w[i].live;
  }
  gg_arena_stats_t s;
  gg_assert_ok(gg_arena_stats(shared, &s));
  gg_assert_ok(gg__arena_check(shared));
  printf("%d threads: %llu allocs, %llu frees, %d live; mapped %zu, peak in use %zu\n", THREADS,
         allocs, frees, live, s.bytes_mapped, s.peak_in_use);
  assert_int_equal(s.n_allocs, allocs);
  assert_int_equal(s.n_frees, frees);
  assert_int_equal(s.n_live, (unsigned long long)live);
  int n = 0;
  gg_assert_ok(gg_arena_foreach_block(shared, count_blocks, &n));
  assert_int_equal(n, live);
  gg_assert_ok(gg_arena_destroy(shared));
}

static int setup(void **state) {
  (void)state;
  gg_test_use_host("256M", "64K");
  return 0;
}

static void test_threads_stream(void **state) {
  (void)state;
  run(0);
}

static void test_threads_no_stream(void **state) {
  (void)state;
  run(GG_ARENA_NO_STREAM);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_threads_stream, setup),
      cmocka_unit_test_setup(test_threads_no_stream, setup),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
