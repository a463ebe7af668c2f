/* test_plugin_graph.c — the allocator plugin under (simulated) CUDA graph capture on the host
 * backend: nothing it does invalidates a capture, memory a live graph uses is never handed out
 * again, and it all comes back once the graph is destroyed. */
#include <stdlib.h>

#include "gg_test.h"

#define DEV 0
#define MiB ((size_t)1 << 20)

typedef struct {
  void *ptr;
  size_t size;
} range_t;

static gg_arena_t *make_arena(void) {
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.backend = "host", o.capacity = 256 * MiB, o.chunk_size = 2 * MiB;
  gg_arena_t *a = NULL;
  gg_assert_ok(gg_arena_create(&a, &o));
  gg_assert_ok(gg_plugin_set_arena(DEV, a));
  return a;
}

static void *stream_new(void) {
  void *s = NULL;
  gg_assert_ok(gg_host_stream_create(&s));
  return s;
}

static gg_plugin_graph_stats_t gstats(void) {
  gg_plugin_graph_stats_t s;
  gg_assert_ok(gg_plugin_graph_stats(DEV, &s));
  return s;
}

static unsigned long long live_in(gg_arena_t *a) {
  gg_arena_stats_t s;
  gg_assert_ok(gg_arena_stats(a, &s));
  return s.n_live;
}

/* Fails when [p, p+n) overlaps any of the held ranges. */
static void assert_apart(void *p, size_t n, const range_t *held, size_t nheld) {
  uintptr_t lo = (uintptr_t)p, hi = lo + n;
  for (size_t i = 0; i < nheld; i++) {
    uintptr_t hlo = (uintptr_t)held[i].ptr, hhi = hlo + held[i].size;
    if (lo < hhi && hlo < hi)
      fail_msg("block %p (+%zu) overlaps %p (+%zu), held by a live graph", p, n, held[i].ptr,
               held[i].size);
  }
}

/* Everything the plugin held for graphs went back: the test ends with nothing held, and trim(0)
 * destroys the graph arena. */
static void assert_all_back(gg_arena_t *a) {
  gg_plugin_graph_stats_t g = gstats();
  assert_int_equal(g.n_pools, 0);
  assert_int_equal(g.n_blocks_held, 0);
  assert_int_equal(g.n_unowned, 0);
  assert_int_equal(g.n_deferred, 0);
  assert_int_equal(g.bytes_in_use, 0);
  assert_int_equal(live_in(a), 0);
  gg_assert_ok(gg_plugin_trim(DEV, 0, NULL));
  g = gstats();
  assert_int_equal(g.bytes_mapped, 0);
}

/* The capture of a step: allocations, a free and a reuse inside the capture, and the free of a
 * block allocated before it. Before graph pools, the very first gg_torch_alloc on the capturing
 * stream waited for the arena's stream (the legacy one) and invalidated the capture: capture_end
 * failed. */
static void test_capture_is_not_invalidated_and_graph_memory_is_kept(void **state) {
  (void)state;
  gg_arena_t *a = make_arena();
  void *cs = stream_new();
  void *before = gg_torch_alloc(MiB, DEV, NULL); /* e.g. a static input, made before the capture */
  assert_non_null(before);
  unsigned long long main_live = live_in(a);

  gg_assert_ok(gg_host_stream_capture_begin(cs));
  void *t1 = gg_torch_alloc(MiB, DEV, cs);
  void *out = gg_torch_alloc(MiB / 2, DEV, cs);
  assert_non_null(t1);
  assert_non_null(out);
  gg_torch_free(t1, MiB, DEV, cs);                /* a temporary of the graph */
  void *t2 = gg_torch_alloc(MiB - 4096, DEV, cs); /* reuses it: same capture, best fit */
  assert_ptr_equal(t2, t1);
  gg_torch_free(t2, MiB - 4096, DEV, cs);
  gg_torch_free(before, MiB, DEV,
                cs); /* freed during the capture: the graph reads it at every replay */
  unsigned long long g1 = 0;
  gg_assert_ok(gg_host_stream_capture_end(cs, &g1));
  assert_int_not_equal(g1, 0);
  assert_int_equal(live_in(a), main_live); /* the main arena did not take `before` back */

  gg_plugin_graph_stats_t g = gstats();
  assert_int_equal(g.n_pools, 1);
  assert_int_equal(g.n_blocks_held, 3); /* t1 (= t2), out, before */
  assert_true(g.n_captures >= 1);
  assert_true(g.bytes_in_use >= MiB + MiB / 2);

  /* The user drops the graph's output; later allocations, outside any capture or in another one,
   * never get memory the live graph uses. */
  gg_torch_free(out, MiB / 2, DEV, NULL);
  range_t held[] = {{t1, MiB}, {out, MiB / 2}, {before, MiB}};
  void *later[16];
  for (int i = 0; i < 8; i++) {
    size_t n = i % 2 ? MiB / 2 : MiB;
    assert_non_null(later[i] = gg_torch_alloc(n, DEV, NULL));
    assert_apart(later[i], n, held, 3);
  }
  void *cs2 = stream_new();
  gg_assert_ok(gg_host_stream_capture_begin(cs2));
  for (int i = 8; i < 16; i++) {
    assert_non_null(later[i] = gg_torch_alloc(MiB / 2, DEV, cs2));
    assert_apart(later[i], MiB / 2, held, 3);
  }
  for (int i = 8; i < 16; i++) gg_torch_free(later[i], MiB / 2, DEV, cs2);
  unsigned long long g2 = 0;
  gg_assert_ok(gg_host_stream_capture_end(cs2, &g2));
  assert_int_equal(gstats().n_pools, 2);
  for (int i = 0; i < 8; i++) gg_torch_free(later[i], i % 2 ? MiB / 2 : MiB, DEV, NULL);

  /* The graphs go: their memory comes back at the next plugin call. */
  gg_assert_ok(gg_host_graph_destroy(g1));
  gg_assert_ok(gg_host_graph_destroy(g2));
  gg_assert_fails(gg_host_graph_destroy(g2), GG_EINVAL, "no live graph");
  void *x = gg_torch_alloc(256, DEV, NULL);
  assert_non_null(x);
  gg_torch_free(x, 256, DEV, NULL);
  assert_all_back(a);
  gg_assert_ok(gg_arena_destroy(a));
  gg_host_stream_destroy(cs), gg_host_stream_destroy(cs2);
}

/* A graph's block still live when the graph goes comes back when PyTorch frees it. */
static void test_live_block_of_a_destroyed_graph_comes_back_at_its_free(void **state) {
  (void)state;
  gg_arena_t *a = make_arena();
  void *cs = stream_new();
  gg_assert_ok(gg_host_stream_capture_begin(cs));
  void *out = gg_torch_alloc(3 * MiB, DEV, cs);
  assert_non_null(out);
  unsigned long long g = 0;
  gg_assert_ok(gg_host_stream_capture_end(cs, &g));
  gg_assert_ok(gg_host_graph_destroy(g));
  gg_plugin_graph_stats_t s = gstats();
  assert_int_equal(s.n_pools, 1); /* it still owns `out` */
  assert_int_equal(s.n_blocks_held, 1);
  gg_torch_free(out, 3 * MiB, DEV, NULL);
  assert_all_back(a);
  gg_assert_ok(gg_arena_destroy(a));
  gg_host_stream_destroy(cs);
}

/* Calls for streams that do not capture while a capture is underway: the legacy stream (the arena's
 * own) and a side stream (for which the arena would wait on the legacy stream). Both get
 * graph-arena blocks without a stream operation; the capture stays valid; their frees come back
 * once allowed. */
static void test_other_streams_during_a_capture(void **state) {
  (void)state;
  gg_arena_t *a = make_arena();
  void *cs = stream_new(), *side = stream_new();
  void *pre = gg_torch_alloc(MiB, DEV, NULL);
  unsigned long long main_live = live_in(a);
  gg_assert_ok(gg_host_stream_capture_begin(cs));
  void *l = gg_torch_alloc(MiB, DEV, NULL);
  void *s = gg_torch_alloc(MiB, DEV, side);
  assert_non_null(l);
  assert_non_null(s);
  assert_int_equal(live_in(a), main_live); /* not from the main arena */
  assert_int_equal(gstats().n_unowned, 2);
  gg_torch_free(l, MiB, DEV, NULL);   /* the legacy stream may not be waited for now: deferred */
  gg_torch_free(pre, MiB, DEV, NULL); /* a main-arena block: the arena may not take it back now */
  gg_torch_free(s, MiB, DEV, side);   /* a side stream that does not capture may be waited for */
  gg_plugin_graph_stats_t st = gstats();
  assert_int_equal(st.n_unowned, 0);
  assert_int_equal(st.n_deferred, 2);
  assert_int_equal(live_in(a), main_live);
  unsigned long long g = 0;
  gg_assert_ok(gg_host_stream_capture_end(cs, &g));
  gg_assert_ok(gg_host_graph_destroy(g));
  void *x = gg_torch_alloc(256, DEV, NULL); /* no capture now: the deferred blocks go back */
  gg_torch_free(x, 256, DEV, NULL);
  assert_true(gstats().n_stream_waits >= 1);
  assert_all_back(a);
  gg_assert_ok(gg_arena_destroy(a));
  gg_host_stream_destroy(cs), gg_host_stream_destroy(side);
}

/* A block of an earlier graph freed during a later capture: the later graph uses it, so it stays
 * held after the earlier graph is gone, until the later one is gone too. */
static void test_block_of_an_older_graph_used_by_a_newer_one(void **state) {
  (void)state;
  gg_arena_t *a = make_arena();
  void *cs = stream_new();
  gg_assert_ok(gg_host_stream_capture_begin(cs));
  void *x = gg_torch_alloc(MiB, DEV, cs);
  unsigned long long g1 = 0, g2 = 0;
  gg_assert_ok(gg_host_stream_capture_end(cs, &g1));
  gg_assert_ok(gg_host_stream_capture_begin(cs));
  gg_torch_free(x, MiB, DEV, cs);
  gg_assert_ok(gg_host_stream_capture_end(cs, &g2));
  gg_assert_ok(gg_host_graph_destroy(g1));
  range_t held[] = {{x, MiB}};
  void *y[6];
  for (int i = 0; i < 6; i++) assert_apart(y[i] = gg_torch_alloc(MiB, DEV, NULL), MiB, held, 1);
  for (int i = 0; i < 6; i++) gg_torch_free(y[i], MiB, DEV, NULL);
  assert_int_equal(gstats().n_pools, 2);
  gg_assert_ok(gg_host_graph_destroy(g2));
  assert_all_back(a);
  gg_assert_ok(gg_arena_destroy(a));
  gg_host_stream_destroy(cs);
}

/* The simulation itself: an operation on the capturing stream invalidates the capture, and
 * capture_end names it; what the plugin tied to that capture is released (no graph comes out). */
static void test_invalidated_capture_releases_its_pool(void **state) {
  (void)state;
  gg_arena_t *a = make_arena();
  void *cs = stream_new();
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.backend = "host", o.capacity = 16 * MiB, o.stream = cs;
  gg_arena_t *on_cs = NULL;
  gg_assert_ok(gg_arena_create(&on_cs, &o));
  void *p = NULL;
  gg_assert_ok(gg_alloc(on_cs, 4096, &p));
  gg_assert_ok(gg_free(on_cs, p)); /* pending on cs */
  gg_assert_ok(gg_host_stream_capture_begin(cs));
  gg_assert_fails(gg_host_stream_capture_begin(cs), GG_ESTATE, "capturing already");
  void *blk = gg_torch_alloc(MiB, DEV, cs);
  assert_non_null(blk);
  assert_int_not_equal(gg_arena_trim(on_cs, 0), 0); /* records an event on cs: not allowed now */
  unsigned long long g = 1;
  gg_assert_fails(gg_host_stream_capture_end(cs, &g), GG_ESTATE,
                  "event_record on the capturing stream");
  assert_int_equal(g, 0);
  gg_torch_free(blk, MiB, DEV, NULL);
  assert_all_back(a);
  gg_assert_ok(gg_arena_destroy(on_cs));
  gg_assert_ok(gg_arena_destroy(a));
  gg_assert_fails(gg_host_stream_capture_begin(NULL), GG_EINVAL, "legacy");
  gg_assert_fails(gg_host_stream_capture_end(cs, NULL), GG_ESTATE, "not capturing");
  gg_host_stream_destroy(cs);
}

/* Failures of the two new backend operations: a failed graph_retain fails the allocation (NULL, no
 * memory kept), a failed capture query makes the call run as it did before captures were handled.
 * */
static void test_backend_failures(void **state) {
  (void)state;
  gg_arena_t *a = make_arena();
  void *cs = stream_new();
  gg_assert_ok(gg_host_stream_capture_begin(cs));
  gg_assert_ok(gg_host_fault_set("graph_retain:1"));
  FILE *saved = stderr; /* the failure prints one line */
  stderr = fopen("/dev/null", "w");
  assert_null(gg_torch_alloc(MiB, DEV, cs));
  fclose(stderr);
  stderr = saved;
  void *ok = gg_torch_alloc(MiB, DEV, cs); /* the next one ties its pool to the graph */
  assert_non_null(ok);
  gg_torch_free(ok, MiB, DEV, cs);
  unsigned long long g = 0;
  gg_assert_ok(gg_host_stream_capture_end(cs, &g));
  gg_assert_ok(gg_host_graph_destroy(g));
  gg_assert_ok(gg_host_fault_set("stream_capture:*"));
  void *p = gg_torch_alloc(MiB, DEV, NULL);
  assert_non_null(p);
  assert_int_equal(live_in(a), 1); /* the main arena served it */
  gg_torch_free(p, MiB, DEV, NULL);
  gg_assert_ok(gg_host_fault_set(NULL));
  void *x = gg_torch_alloc(256, DEV, NULL);
  gg_torch_free(x, 256, DEV, NULL);
  assert_all_back(a);
  gg_assert_ok(gg_arena_destroy(a));
  gg_host_stream_destroy(cs);
}

/* With nothing captured, a call costs one capture query (the legacy stream) or two (a side stream,
 * whose caller the arena would make wait on the legacy one), and no lock of the graph side. */
static void test_fast_path_queries(void **state) {
  (void)state;
  gg_arena_t *a = make_arena();
  void *side = stream_new();
  gg_assert_ok(gg_host_fault_set(NULL)); /* resets the counters */
  void *p = gg_torch_alloc(MiB, DEV, NULL);
  gg_torch_free(p, MiB, DEV, NULL);
  assert_int_equal(gg_host_op_count("stream_capture"), 2);
  p = gg_torch_alloc(MiB, DEV, side);
  gg_torch_free(p, MiB, DEV, side);
  assert_int_equal(gg_host_op_count("stream_capture"), 6);
  gg_assert_fails(gg_plugin_graph_stats(DEV, NULL), GG_EINVAL, "NULL");
  gg_assert_fails(gg_plugin_graph_stats(-1, &(gg_plugin_graph_stats_t){0}), GG_EINVAL,
                  "out of range");
  gg_assert_fails(gg_plugin_trim(GG_PLUGIN_MAX_DEVICES, 0, NULL), GG_EINVAL, "out of range");
  size_t released = 1;
  gg_assert_ok(gg_plugin_trim(7, 0, &released)); /* a device never used: nothing to do */
  assert_int_equal(released, 0);
  gg_assert_ok(gg_arena_destroy(a));
  gg_host_stream_destroy(side);
}

/* GG_TORCH_ANNOUNCED: no capture query while no capture is announced; once one is, the same calls
 * ask and serve the capture from its pool, as unflagged calls do. GG_TORCH_OWN_STATS leaves the
 * plugin's statistics alone. Bad flags and an unmatched end are refused. */
static void test_announced_calls(void **state) {
  (void)state;
  const unsigned fl = GG_TORCH_ANNOUNCED | GG_TORCH_OWN_STATS;
  gg_arena_t *a = make_arena();
  void *cs = stream_new();
  gg_plugin_stats_t s0;
  gg_assert_ok(gg_plugin_stats(DEV, &s0));
  gg_assert_ok(gg_host_fault_set(NULL)); /* resets the counters */
  void *p = NULL;
  gg_assert_ok(gg_torch_alloc_ex(MiB, DEV, cs, fl, &p));
  assert_non_null(p);
  gg_assert_ok(gg_torch_free_ex(p, MiB, DEV, cs, fl));
  assert_int_equal(gg_host_op_count("stream_capture"), 0);
  gg_plugin_stats_t s1;
  gg_assert_ok(gg_plugin_stats(DEV, &s1));
  assert_int_equal(s1.n_allocs, s0.n_allocs);
  assert_int_equal(s1.n_frees, s0.n_frees);
  gg_assert_ok(gg_torch_alloc_ex(MiB, DEV, NULL, GG_TORCH_ANNOUNCED, &p)); /* counted */
  gg_assert_ok(gg_torch_free_ex(p, MiB, DEV, NULL, GG_TORCH_ANNOUNCED));
  gg_assert_ok(gg_plugin_stats(DEV, &s1));
  assert_int_equal(s1.n_allocs, s0.n_allocs + 1);
  assert_int_equal(s1.n_frees, s0.n_frees + 1);

  /* Announced: the capture's blocks go to its pool and stay held by the live graph. */
  gg_assert_ok(gg_plugin_announce_capture());
  gg_assert_ok(gg_host_stream_capture_begin(cs));
  void *t = NULL;
  gg_assert_ok(gg_torch_alloc_ex(MiB, DEV, cs, fl, &t));
  assert_true(gg_host_op_count("stream_capture") > 0);
  assert_int_equal(live_in(a), 0); /* served by the graph arena */
  gg_assert_ok(gg_torch_free_ex(t, MiB, DEV, cs, fl));
  unsigned long long g = 0;
  gg_assert_ok(gg_host_stream_capture_end(cs, &g));
  gg_assert_ok(gg_plugin_capture_ended());
  assert_int_equal(gstats().n_blocks_held, 1);
  void *after = NULL;
  gg_assert_ok(gg_torch_alloc_ex(MiB, DEV, NULL, fl, &after));
  range_t held[] = {{t, MiB}};
  assert_apart(after, MiB, held, 1);
  gg_assert_ok(gg_torch_free_ex(after, MiB, DEV, NULL, fl));
  gg_assert_ok(gg_host_graph_destroy(g));

  gg_assert_fails(gg_plugin_capture_ended(), GG_ESTATE, "no capture announcement");
  gg_assert_fails(gg_torch_alloc_ex(MiB, DEV, NULL, 1u << 7, &p), GG_EINVAL, "unknown flags");
  assert_null(p);
  gg_assert_fails(gg_torch_free_ex(t, MiB, DEV, NULL, 1u << 7), GG_EINVAL, "unknown flags");
  gg_assert_fails(gg_torch_alloc_ex(MiB, DEV, NULL, fl, NULL), GG_EINVAL, "NULL");
  gg_assert_fails(gg_torch_free_ex(&p, MiB, GG_PLUGIN_MAX_DEVICES, NULL, fl), GG_EINVAL, "range");
  gg_assert_ok(gg_torch_free_ex(NULL, 0, DEV, NULL, fl));
  void *x = gg_torch_alloc(256, DEV, NULL); /* a plain call gives back what the graph held */
  gg_torch_free(x, 256, DEV, NULL);
  assert_all_back(a);
  gg_assert_ok(gg_arena_destroy(a));
  gg_host_stream_destroy(cs);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_capture_is_not_invalidated_and_graph_memory_is_kept),
      cmocka_unit_test(test_live_block_of_a_destroyed_graph_comes_back_at_its_free),
      cmocka_unit_test(test_other_streams_during_a_capture),
      cmocka_unit_test(test_block_of_an_older_graph_used_by_a_newer_one),
      cmocka_unit_test(test_invalidated_capture_releases_its_pool),
      cmocka_unit_test(test_backend_failures),
      cmocka_unit_test(test_fast_path_queries),
      cmocka_unit_test(test_announced_calls),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
