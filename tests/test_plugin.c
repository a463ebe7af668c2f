/* test_plugin.c — the allocator plugin under the sanitizers: registration, destroy unregistering, and
 * allocations racing registration changes and a destroy (no use of a freed arena). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "gg_test.h"

static gg_arena_t *make_arena(size_t capacity) {
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.backend = "host";
  o.capacity = capacity;
  o.chunk_size = 2u << 20;
  gg_arena_t *a = NULL;
  gg_assert_ok(gg_arena_create(&a, &o));
  return a;
}

static void test_register_alloc_free_destroy(void **state) {
  (void)state;
  gg_arena_t *a = make_arena(64u << 20);
  gg_assert_ok(gg_plugin_set_arena(3, a));
  gg_arena_t *got = NULL;
  gg_assert_ok(gg_plugin_get_arena(3, &got));
  assert_ptr_equal(got, a);
  gg_plugin_stats_t before, after;
  gg_assert_ok(gg_plugin_stats(3, &before));
  void *p = gg_torch_alloc(1000, 3, NULL);
  assert_non_null(p);
  assert_null(gg_torch_alloc(0, 3, NULL));
  gg_arena_stats_t s;
  gg_assert_ok(gg_arena_stats(a, &s));
  assert_int_equal(s.n_live, 1);
  gg_torch_free(p, 1000, 3, NULL);
  gg_torch_free(NULL, 0, 3, NULL);
  gg_assert_ok(gg_arena_stats(a, &s));
  assert_int_equal(s.n_live, 0);
  gg_assert_ok(gg_plugin_stats(3, &after));
  assert_int_equal(after.n_allocs, before.n_allocs + 1);
  assert_int_equal(after.n_frees, before.n_frees + 1);
  assert_int_equal(after.n_failed_allocs, before.n_failed_allocs);
  gg_assert_ok(gg_arena_destroy(a));
  gg_assert_ok(gg_plugin_get_arena(3, &got));
  assert_null(got); /* destroy unregistered it */
  assert_null(gg_torch_alloc(256, 3, NULL));
  gg_assert_fails(gg_plugin_set_arena(-1, NULL), GG_EINVAL, "out of range");
  gg_assert_fails(gg_plugin_set_arena(GG_PLUGIN_MAX_DEVICES, NULL), GG_EINVAL, "out of range");
  gg_assert_fails(gg_plugin_get_arena(0, NULL), GG_EINVAL, "NULL");
  gg_assert_fails(gg_plugin_stats(0, NULL), GG_EINVAL, "NULL");
}

typedef struct race {
  atomic_bool stop;
  atomic_ulong done;
} race_t;

static void *allocator_thread(void *arg) {
  race_t *r = arg;
  while (!atomic_load(&r->stop)) {
    void *p = gg_torch_alloc(4096, 5, NULL);
    if (p) gg_torch_free(p, 4096, 5, NULL); /* may land in another arena: refused, counted, no harm */
    atomic_fetch_add(&r->done, 1);
  }
  return NULL;
}

static void test_allocations_race_registration_and_destroy(void **state) {
  (void)state;
  FILE *saved = stderr; /* failures print one line each: keep the log readable */
  stderr = fopen("/dev/null", "w");
  race_t r = {false, 0};
  pthread_t t[3];
  for (int i = 0; i < 3; i++) assert_int_equal(pthread_create(&t[i], NULL, allocator_thread, &r), 0);
  for (int round = 0; round < 200; round++) {
    gg_arena_t *a = make_arena(16u << 20);
    gg_assert_ok(gg_plugin_set_arena(5, a));
    unsigned long seen = atomic_load(&r.done);
    while (atomic_load(&r.done) < seen + 20) sched_yield();
    if (round % 2) gg_assert_ok(gg_plugin_set_arena(5, NULL));
    gg_assert_ok(gg_arena_destroy(a)); /* waits for calls using it; none starts after */
  }
  atomic_store(&r.stop, true);
  for (int i = 0; i < 3; i++) pthread_join(t[i], NULL);
  fclose(stderr);
  stderr = saved;
  gg_arena_t *got = (gg_arena_t *)1;
  gg_assert_ok(gg_plugin_get_arena(5, &got));
  assert_null(got);
}

int main(void) {
  setenv("GPUGUARD_HOST_CAPACITY", "1G", 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_register_alloc_free_destroy),
      cmocka_unit_test(test_allocations_race_registration_and_destroy),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
