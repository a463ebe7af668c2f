/* test_backend_support.c — what a framework's allocator backend (gpuguard's PyTorch backend) asks
 * of the library, on the host backend: a limit below the capacity (PyTorch's memory fraction); the
 * mapped ranges for snapshots; and statistics read without touching the stream (safe while a stream
 * captures). */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "arena/arena_internal.h"
#include "gg_test.h"

static gg_arena_t *host_arena(size_t capacity, size_t chunk, void *stream) {
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.backend = "host";
  o.capacity = capacity;
  o.chunk_size = chunk;
  o.stream = stream;
  gg_arena_t *a = NULL;
  gg_assert_ok(gg_arena_create(&a, &o));
  return a;
}

/* ---- gg_arena_set_limit -------------------------------------------------------------------------
 */

static void test_limit_below_capacity_fails_growth_past_it(void **state) {
  (void)state;
  gg_arena_t *a = host_arena(64u << 20, 2u << 20, NULL);
  size_t lim = 0;
  gg_assert_ok(gg_arena_get_limit(a, &lim));
  assert_int_equal(lim, 64u << 20);                        /* none set: the capacity */
  gg_assert_ok(gg_arena_set_limit(a, (8u << 20) + 12345)); /* rounded down to the granularity */
  gg_assert_ok(gg_arena_get_limit(a, &lim));
  assert_true(lim <= (8u << 20) + 12345 && lim >= 6u << 20);
  void *p = NULL;
  void *q = NULL;
  gg_assert_ok(gg_alloc(a, 4u << 20, &p));
  gg_assert_fails(gg_alloc(a, 6u << 20, &q), GG_ENOMEM, "limit");
  assert_null(q);
  gg_arena_stats_t s;
  gg_assert_ok(gg_arena_stats(a, &s));
  assert_true(s.bytes_mapped <= lim);
  assert_int_equal(s.n_live, 1); /* the failure lost nothing and leaked nothing */
  /* Removing the limit (0) lets the same request through. */
  gg_assert_ok(gg_arena_set_limit(a, 0));
  gg_assert_ok(gg_arena_get_limit(a, &lim));
  assert_int_equal(lim, 64u << 20);
  gg_assert_ok(gg_alloc(a, 6u << 20, &q));
  /* A limit under what is mapped keeps the mapping; the next growth fails, frees and reuse work. */
  gg_assert_ok(gg_arena_set_limit(a, 2u << 20));
  void *r = NULL;
  gg_assert_fails(gg_alloc(a, 32u << 20, &r), GG_ENOMEM, "limit");
  gg_assert_ok(gg_free(a, q));
  gg_assert_ok(gg_alloc(a, 1u << 20, &r));
  gg_assert_ok(gg_free(a, r));
  gg_assert_ok(gg_free(a, p));
  gg_assert_ok(gg__arena_check(a));
  gg_assert_ok(gg_arena_set_limit(a, SIZE_MAX)); /* at or above the capacity: no limit */
  gg_assert_ok(gg_arena_get_limit(a, &lim));
  assert_int_equal(lim, 64u << 20);
  gg_assert_fails(gg_arena_get_limit(a, NULL), GG_EINVAL, "NULL");
  gg_assert_ok(gg_arena_destroy(a));
  gg_assert_fails(gg_arena_set_limit(a, 1), GG_EINVAL, "");
  gg_assert_fails(gg_arena_set_limit(NULL, 1), GG_EINVAL, "");
  gg_assert_fails(gg_arena_get_limit(NULL, &lim), GG_EINVAL, "");
}

/* ---- gg_arena_foreach_chunk ---------------------------------------------------------------------
 */

typedef struct {
  gg_chunk_info_t seen[64];
  int n;
  int stop_after;
} chunks_t;

static int collect(const gg_chunk_info_t *c, void *user) {
  chunks_t *cs = user;
  if (cs->n < 64) {
    cs->seen[cs->n] = *c;
  }
  cs->n++;
  return cs->stop_after && cs->n >= cs->stop_after;
}

typedef struct {
  const chunks_t *ranges;
  int outside;
  int n;
} inside_t;

static int block_inside(const gg_block_info_t *b, void *user) {
  inside_t *in = user;
  uintptr_t p = (uintptr_t)b->ptr;
  int ok = 0;
  for (int i = 0; i < in->ranges->n; i++) {
    uintptr_t lo = (uintptr_t)in->ranges->seen[i].ptr;
    if (p >= lo && p + b->size <= lo + in->ranges->seen[i].size) {
      ok = 1;
    }
  }
  in->outside += !ok;
  in->n++;
  return 0;
}

static void test_chunks_are_reported_as_ranges_that_hold_every_block(void **state) {
  (void)state;
  gg_arena_t *a = host_arena(256u << 20, 2u << 20, NULL);
  chunks_t cs = {.n = 0};
  gg_assert_ok(gg_arena_foreach_chunk(a, collect, &cs));
  assert_int_equal(cs.n, 0); /* nothing mapped yet */
  void *p[6];
  size_t sizes[6] = {1000, 3u << 20, 5u << 20, 64, 9u << 20, 300u << 10};
  for (int i = 0; i < 6; i++) {
    gg_assert_ok(gg_alloc(a, sizes[i], &p[i]));
  }
  gg_arena_stats_t s;
  gg_assert_ok(gg_arena_stats(a, &s));
  memset(&cs, 0, sizeof cs);
  gg_assert_ok(gg_arena_foreach_chunk(a, collect, &cs));
  assert_true(cs.n >= 1);
  assert_true((unsigned long long)cs.n <= s.n_chunks);
  size_t total = 0;
  for (int i = 0; i < cs.n; i++) {
    total += cs.seen[i].size;
    if (i > 0) { /* address order, and neighbours were merged: a gap between any two ranges */
      assert_true((uintptr_t)cs.seen[i].ptr > (uintptr_t)cs.seen[i - 1].ptr + cs.seen[i - 1].size);
    }
  }
  assert_int_equal(total, s.bytes_mapped);
  inside_t in = {&cs, 0, 0};
  gg_assert_ok(gg_arena_foreach_block(a, block_inside, &in));
  assert_int_equal(in.n, 6);
  assert_int_equal(in.outside, 0);
  chunks_t one = {.stop_after = 1};
  gg_assert_ok(gg_arena_foreach_chunk(a, collect, &one));
  assert_int_equal(one.n, 1); /* a visitor's non-zero return stops the walk */
  for (int i = 0; i < 6; i++) {
    gg_assert_ok(gg_free(a, p[i]));
  }
  gg_assert_ok(gg_arena_trim(a, 0));
  memset(&cs, 0, sizeof cs);
  gg_assert_ok(gg_arena_foreach_chunk(a, collect, &cs));
  assert_int_equal(cs.n, 0);
  gg_assert_fails(gg_arena_foreach_chunk(a, NULL, NULL), GG_EINVAL, "visit");
  gg_assert_ok(gg_arena_destroy(a));
  gg_assert_fails(gg_arena_foreach_chunk(a, collect, &cs), GG_EINVAL, "");
}

/* ---- gg_arena_foreach_mapping -------------------------------------------------------------------
 */

typedef struct {
  gg_mapping_info_t seen[64];
  int n;
} mappings_t;

static int collect_mapping(const gg_mapping_info_t *m, void *user) {
  mappings_t *ms = user;
  if (ms->n < 64) {
    ms->seen[ms->n] = *m;
  }
  ms->n++;
  return 0;
}

static int stop_at_first(const gg_mapping_info_t *m, void *user) {
  (void)m;
  (*(int *)user)++;
  return 1;
}

static void test_mappings_cover_a_block_exactly_in_order(void **state) {
  (void)state;
  gg_arena_t *a = host_arena(256u << 20, 2u << 20, NULL);
  void *small = NULL;
  void *big = NULL;
  gg_assert_ok(gg_alloc(a, 1000, &small));
  gg_assert_ok(gg_alloc(a, 9u << 20, &big)); /* spans several 2 MiB chunks */
  mappings_t ms = {.n = 0};
  gg_assert_ok(gg_arena_foreach_mapping(a, big, 9u << 20, collect_mapping, &ms));
  assert_true(ms.n >= 2);
  uintptr_t lo = (uintptr_t)big;
  uintptr_t hi = lo + (9u << 20);
  assert_true((uintptr_t)ms.seen[0].ptr <= lo);
  for (int i = 1; i < ms.n; i++) { /* consecutive, no gap, no overlap */
    assert_int_equal((uintptr_t)ms.seen[i].ptr,
                     (uintptr_t)ms.seen[i - 1].ptr + ms.seen[i - 1].size);
  }
  gg_mapping_info_t last = ms.seen[ms.n - 1];
  assert_true((uintptr_t)last.ptr < hi && (uintptr_t)last.ptr + last.size >= hi);
  assert_int_equal(last.handle, 0); /* the host backend has no physical handles */
  memset(&ms, 0, sizeof ms);
  gg_assert_ok(gg_arena_foreach_mapping(a, small, 1000, collect_mapping, &ms));
  assert_int_equal(ms.n, 1);
  int calls = 0;
  gg_assert_ok(gg_arena_foreach_mapping(a, big, 9u << 20, stop_at_first, &calls));
  assert_int_equal(calls, 1); /* a visitor's non-zero return stops the walk, and is no error */
  gg_arena_stats_t s;
  gg_assert_ok(gg_arena_stats(a, &s));
  memset(&ms, 0, sizeof ms);
  int rc = gg_arena_foreach_mapping(a, big, s.bytes_reserved, collect_mapping, &ms);
  assert_int_equal(rc, GG_ENOTFOUND); /* past what is mapped */
  assert_true(ms.n >= 2);
  gg_assert_fails(gg_arena_foreach_mapping(a, big, 0, collect_mapping, &ms), GG_EINVAL, "range");
  gg_assert_fails(gg_arena_foreach_mapping(a, (void *)UINTPTR_MAX, 2, collect_mapping, &ms),
                  GG_EINVAL, "range");
  gg_assert_fails(gg_arena_foreach_mapping(a, big, 1, NULL, NULL), GG_EINVAL, "visit");
  rc = gg_arena_foreach_mapping(a, (void *)(uintptr_t)4096, 16, collect_mapping, &ms);
  assert_int_equal(rc, GG_ENOTFOUND); /* a foreign address */
  assert_true(s.n_maps >= 2);         /* chunks mapped since creation, none given back yet */
  assert_int_equal(s.n_maps, s.n_chunks);
  assert_int_equal(s.n_unmaps, 0);
  gg_assert_ok(gg_free(a, small));
  gg_assert_ok(gg_free(a, big));
  gg_assert_ok(gg_arena_trim(a, 0));
  gg_assert_ok(gg_arena_stats(a, &s));
  assert_int_equal(s.n_chunks, 0);
  assert_int_equal(s.n_unmaps, s.n_maps); /* every chunk mapped went back */
  gg_assert_ok(gg_arena_destroy(a));
  gg_assert_fails(gg_arena_foreach_mapping(a, big, 1, collect_mapping, &ms), GG_EINVAL, "");
}

/* ---- gg_arena_stats_quiet
 * ------------------------------------------------------------------------ */

static void test_quiet_stats_touch_no_stream(void **state) {
  (void)state;
  void *stream = NULL;
  gg_assert_ok(gg_host_stream_create(&stream));
  gg_arena_t *a = host_arena(64u << 20, 2u << 20, stream);
  void *p = NULL;
  gg_assert_ok(gg_alloc(a, 1u << 20, &p));
  gg_assert_ok(gg_host_stream_hold(stream));
  gg_assert_ok(gg_free(a, p)); /* released in stream order: pending while the stream is held */
  gg_assert_ok(gg_host_fault_set("")); /* zeroes the operation counters */
  gg_arena_stats_t q;
  gg_assert_ok(gg_arena_stats_quiet(a, &q));
  assert_int_equal(gg_host_op_count("event_record"), 0);
  assert_int_equal(gg_host_op_count("event_query"), 0);
  assert_int_equal(gg_host_op_count("stream_query"), 0);
  assert_int_equal(q.n_live, 0);
  assert_int_equal(q.bytes_in_use, 0);
  assert_true(q.bytes_mapped >= 1u << 20);
  assert_true(q.bytes_pending >= 1u << 20); /* not reclaimed: nobody asked the stream */
  gg_arena_stats_t s;
  gg_assert_ok(gg_arena_stats(a, &s)); /* the ordinary read does ask the stream */
  assert_true(gg_host_op_count("event_record") + gg_host_op_count("event_query") +
                  gg_host_op_count("stream_query") >
              0);
  assert_int_equal(s.bytes_mapped, q.bytes_mapped);
  gg_assert_ok(gg_host_stream_release(stream));
  gg_assert_fails(gg_arena_stats_quiet(a, NULL), GG_EINVAL, "NULL");
  gg_assert_ok(gg_arena_destroy(a));
  gg_assert_fails(gg_arena_stats_quiet(a, &q), GG_EINVAL, "");
  gg_assert_ok(gg_host_stream_destroy(stream));
}

int main(void) {
  setenv("GPUGUARD_HOST_CAPACITY", "1G", 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_limit_below_capacity_fails_growth_past_it),
      cmocka_unit_test(test_chunks_are_reported_as_ranges_that_hold_every_block),
      cmocka_unit_test(test_mappings_cover_a_block_exactly_in_order),
      cmocka_unit_test(test_quiet_stats_touch_no_stream),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
