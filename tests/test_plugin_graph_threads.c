/* test_plugin_graph_threads.c — one thread captures graphs through the allocator plugin while
 * another allocates and frees on its own stream, the one the registered arena tracks: no capture is
 * invalidated, no block the other thread gets overlaps memory a live graph holds, and everything
 * comes back. Also run under ThreadSanitizer (label threads).
 *
 * The other thread stays off the legacy stream on purpose: the plugin learns that a capture began
 * only at the capture's first call, so a call of another thread that has already decided to use the
 * legacy stream when the capture begins still does (in global mode that would invalidate a blocking
 * capture stream; PyTorch's capture streams are non-blocking). */
#include <pthread.h>
#include <stdatomic.h>

#include "gg_test.h"

#define DEV      1
#define MiB      ((size_t)1 << 20)
#define ROUNDS   200
#define HELD_MAX 64

static pthread_mutex_t held_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
  uintptr_t lo, hi;
} held[HELD_MAX]; /* memory the capturing thread's live graph holds */
static size_t nheld;
static atomic_bool stop;
static atomic_int failures;
static char failure[256];

static void fail_once(const char *what, unsigned long long detail) {
  if (atomic_fetch_add(&failures, 1) == 0)
    snprintf(failure, sizeof failure, "%s (%llu): %s", what, detail, gg_last_error());
}

/* The streams outlive the threads: blocks freed on them may go back after the threads end. */
static void *streams[2];

static void *capturer(void *arg) {
  (void)arg;
  void *cs = streams[0];
  for (int round = 0; round < ROUNDS; round++) {
    void *p[8];
    size_t n[8];
    if (gg_host_stream_capture_begin(cs) < 0) fail_once("capture_begin", (unsigned long long)round);
    for (int i = 0; i < 8; i++) {
      n[i] = (size_t)(i % 3 + 1) * MiB / 2;
      if (!(p[i] = gg_torch_alloc((ssize_t)n[i], DEV, cs)))
        fail_once("alloc in capture", (unsigned long long)i);
      pthread_mutex_lock(&held_lock);
      held[nheld].lo = (uintptr_t)p[i], held[nheld].hi = (uintptr_t)p[i] + n[i], nheld++;
      pthread_mutex_unlock(&held_lock);
      if (i % 2) gg_torch_free(p[i], (ssize_t)n[i], DEV, cs); /* temporaries: the pool keeps them */
    }
    unsigned long long g = 0;
    if (gg_host_stream_capture_end(cs, &g) < 0)
      fail_once("capture invalidated", (unsigned long long)round);
    for (int i = 0; i < 8; i += 2)
      gg_torch_free(p[i], (ssize_t)n[i], DEV, cs); /* outputs, after the capture */
    pthread_mutex_lock(&held_lock);
    nheld = 0; /* from here on the memory may be handed out again */
    pthread_mutex_unlock(&held_lock);
    if (g) gg_host_graph_destroy(g);
  }
  atomic_store(&stop, true);
  return NULL;
}

static void *allocator(void *arg) {
  (void)arg;
  void *s = streams[1];
  unsigned long long k = 0;
  while (!atomic_load(&stop)) {
    void *stream = s;
    size_t n = (size_t)(k % 4 + 1) * MiB / 4;
    void *p = gg_torch_alloc((ssize_t)n, DEV, stream);
    if (!p) {
      fail_once("alloc beside the capture", k);
      break;
    }
    pthread_mutex_lock(&held_lock);
    for (size_t i = 0; i < nheld; i++)
      if ((uintptr_t)p < held[i].hi && held[i].lo < (uintptr_t)p + n)
        fail_once("overlaps a live graph's memory", k);
    pthread_mutex_unlock(&held_lock);
    gg_torch_free(p, (ssize_t)n, DEV, stream);
    k++;
  }
  return NULL;
}

static void test_capture_beside_allocations(void **state) {
  (void)state;
  for (int i = 0; i < 2; i++) gg_assert_ok(gg_host_stream_create(&streams[i]));
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.backend = "host", o.capacity = 256 * MiB, o.chunk_size = 2 * MiB, o.stream = streams[1];
  gg_arena_t *a = NULL;
  gg_assert_ok(gg_arena_create(&a, &o));
  gg_assert_ok(gg_plugin_set_arena(DEV, a));
  pthread_t t[2];
  assert_int_equal(pthread_create(&t[0], NULL, capturer, NULL), 0);
  assert_int_equal(pthread_create(&t[1], NULL, allocator, NULL), 0);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  if (atomic_load(&failures)) fail_msg("%d failures, first: %s", atomic_load(&failures), failure);
  void *x = gg_torch_alloc(256, DEV, streams[1]); /* the last graph's memory goes back */
  gg_torch_free(x, 256, DEV, streams[1]);
  gg_plugin_graph_stats_t g;
  gg_assert_ok(gg_plugin_graph_stats(DEV, &g));
  assert_int_equal(g.n_captures, ROUNDS);
  assert_int_equal(g.n_pools, 0);
  assert_int_equal(g.n_blocks_held + g.n_unowned + g.n_deferred, 0);
  assert_int_equal(g.bytes_in_use, 0);
  gg_arena_stats_t s;
  gg_assert_ok(gg_arena_stats(a, &s));
  assert_int_equal(s.n_live, 0);
  gg_assert_ok(gg_plugin_trim(DEV, 0, NULL));
  gg_assert_ok(gg_arena_destroy(a));
  for (int i = 0; i < 2; i++) gg_host_stream_destroy(streams[i]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_capture_beside_allocations),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
