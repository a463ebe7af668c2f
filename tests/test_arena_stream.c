/* test_arena_stream.c — the stream-ordered arena calls a C/CUDA program uses as it would
 * cudaMallocAsync / cudaFreeAsync (gg_alloc_on, gg_free_on, gg_arena_join_stream), the options
 * getter and GG_ARENA_KEEP_HOLES, on the host backend, where every driver call is counted. */
#include <string.h>

#include "arena/arena_internal.h"
#include "gg_test.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static gg_arena_t *mk(void *stream, unsigned flags) {
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.backend = "host";
  o.capacity = 16 * MiB;
  o.chunk_size = 2 * MiB;
  o.stream = stream;
  o.flags = flags;
  o.name = "ordered";
  gg_arena_t *a = NULL;
  gg_assert_ok(gg_arena_create(&a, &o));
  return a;
}

static unsigned long long joins(gg_arena_t *a) {
  gg__arena_probe_t p;
  gg_assert_ok(gg__arena_probe(a, &p));
  return p.stream_joins;
}

/* A block freed on the arena's stream is reusable at once by later work on that stream, even while
 * the stream still runs work queued before the free: the stream orders them, the host never waits.
 */
static void test_free_on_own_stream_is_reusable_at_once(void **state) {
  (void)state;
  void *st;
  gg_assert_ok(gg_host_stream_create(&st));
  gg_arena_t *a = mk(st, 0);
  void *p = NULL;
  void *q = NULL;
  gg_assert_ok(gg_alloc_on(a, 256 * KiB, st, &p));
  gg_assert_ok(gg_host_stream_hold(st)); /* a kernel that uses p still runs */
  gg_assert_ok(gg_free_on(a, p, st));
  gg_assert_ok(gg_alloc_on(a, 256 * KiB, st, &q));
  assert_ptr_equal(q, p);
  assert_int_equal(joins(a), 0);
  gg_arena_stats_t s;
  gg_assert_ok(gg_arena_stats(a, &s));
  assert_int_equal(s.n_stream_waits, 0);
  gg_assert_ok(gg_free_on(a, q, st));
  gg_assert_ok(gg_host_stream_release(st));
  gg_assert_ok(gg__arena_check(a));
  gg_assert_ok(gg_arena_destroy(a));
  gg_host_stream_destroy(st);
}

/* Another stream is ordered on the device: an allocation for it waits for the arena's stream, a
 * free on it makes the arena's stream wait for it. Each is one event record and one stream wait. */
static void test_other_streams_are_joined_on_the_device(void **state) {
  (void)state;
  void *own;
  void *side;
  gg_assert_ok(gg_host_stream_create(&own));
  gg_assert_ok(gg_host_stream_create(&side));
  gg_arena_t *a = mk(own, 0);
  gg_host_fault_set(NULL); /* resets the op counters */
  void *p = NULL;
  gg_assert_ok(gg_alloc_on(a, 4096, side, &p));
  assert_int_equal(joins(a), 1);
  assert_int_equal(gg_host_op_count("stream_wait"), 1);
  gg_assert_ok(gg_free_on(a, p, side));
  assert_int_equal(joins(a), 2);
  assert_int_equal(gg_host_op_count("event_record"), 2);
  assert_int_equal(gg_host_op_count("stream_wait"), 2);
  /* gg_arena_join_stream: 1 for another stream, 0 for the arena's own (NULL and 0x1 name the legacy
   * stream, which is not this arena's). */
  assert_int_equal(gg_arena_join_stream(a, own), 0);
  assert_int_equal(gg_arena_join_stream(a, side), 1);
  assert_int_equal(gg_arena_join_stream(a, (void *)0x1), 1);
  gg_assert_ok(gg__arena_check(a));
  gg_assert_ok(gg_arena_destroy(a));
  gg_host_stream_destroy(side);
  gg_host_stream_destroy(own);
}

/* Without stream tracking nothing is ordered; a failed wait frees nothing. */
static void test_no_stream_orders_nothing_and_a_failed_join_frees_nothing(void **state) {
  (void)state;
  void *side;
  gg_assert_ok(gg_host_stream_create(&side));
  gg_arena_t *a = mk(NULL, GG_ARENA_NO_STREAM);
  void *p = NULL;
  gg_assert_ok(gg_alloc_on(a, 4096, side, &p));
  assert_int_equal(gg_arena_join_stream(a, side), 0);
  gg_assert_ok(gg_free_on(a, p, side));
  assert_int_equal(joins(a), 0);
  gg_assert_ok(gg_arena_destroy(a));

  a = mk(NULL, 0);
  gg_assert_ok(gg_alloc_on(a, 4096, NULL, &p));
  gg_assert_ok(gg_host_fault_set("stream_wait:1"));
  assert_true(gg_free_on(a, p, side) < 0);
  gg_host_fault_set(NULL);
  gg_arena_stats_t s;
  gg_assert_ok(gg_arena_stats(a, &s));
  assert_int_equal(s.n_live, 1); /* still the caller's: work on `side` may read it */
  gg_assert_ok(gg_free_on(a, p, NULL));
  gg_assert_fails(gg_free_on(a, p, NULL), GG_EINVAL, "");
  gg_assert_ok(gg__arena_check(a));
  gg_assert_ok(gg_arena_destroy(a));
  gg_host_stream_destroy(side);
}

/* The options as gg_arena_create() settled them; GG_ARENA_KEEP_HOLES is kept there. */
static void test_options_are_read_back(void **state) {
  (void)state;
  gg_arena_t *a = mk(NULL, GG_ARENA_KEEP_HOLES);
  gg_arena_options_t o;
  gg_assert_ok(gg_arena_get_options(a, &o));
  assert_string_equal(o.backend, "host");
  assert_string_equal(o.name, "ordered");
  assert_int_equal(o.capacity, 16 * MiB);
  assert_int_equal(o.chunk_size, 2 * MiB);
  assert_int_equal(o.device, 0);
  assert_null(o.stream);
  assert_true(o.flags & GG_ARENA_KEEP_HOLES);
  gg_assert_fails(gg_arena_get_options(a, NULL), GG_EINVAL, "NULL");
  gg_assert_ok(gg_arena_destroy(a));
  gg_assert_fails(gg_arena_get_options(NULL, &o), GG_EINVAL, "");
  gg_arena_options_init(&o);
  o.backend = "host";
  o.flags = 0x100;
  gg_arena_t *b = NULL;
  gg_assert_fails(gg_arena_create(&b, &o), GG_EINVAL, "unknown flags");
}

int main(void) {
  setenv("GPUGUARD_HOST_POPULATE", "0", 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_free_on_own_stream_is_reusable_at_once),
      cmocka_unit_test(test_other_streams_are_joined_on_the_device),
      cmocka_unit_test(test_no_stream_orders_nothing_and_a_failed_join_frees_nothing),
      cmocka_unit_test(test_options_are_read_back),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
