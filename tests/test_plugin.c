/* test_plugin.c — the allocator plugin under the sanitizers: registration, destroy unregistering,
 * allocations racing registration changes and a destroy (no use of a freed arena), and the counters
 * threads keep for themselves. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "arena/arena_internal.h"
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

/* A plugin arena keeps the hole a large block leaves: top (the bump block) stays out of it and best
 * fit serves what comes next, where a plain arena moves top into it. */
static void test_plugin_arena_keeps_large_holes(void **state) {
  (void)state;
  size_t top[2];
  for (int plug = 0; plug < 2; plug++) {
    gg_arena_t *a = make_arena(1u << 30);
    if (plug) gg_assert_ok(gg_plugin_set_arena(4, a));
    void *big = NULL, *small[8], *next = NULL;
    gg_assert_ok(gg_alloc(a, 200u << 20, &big));
    for (int i = 0; i < 8; i++) gg_assert_ok(gg_alloc(a, 1u << 20, &small[i]));
    gg_assert_ok(gg_free(a, big));
    gg_assert_ok(gg_alloc(a, 4u << 20, &next)); /* makes the release reusable, then places */
    gg__arena_probe_t p;
    gg_assert_ok(gg__arena_probe(a, &p));
    top[plug] = p.top_bytes;
    if (plug) assert_true(p.free_blocks >= 1); /* the hole stays listed for best fit */
    gg_assert_ok(gg__arena_check(a));
    gg_assert_ok(gg_arena_destroy(a)); /* also unregisters the plugin arena */
  }
  assert_true(top[0] >= 190u << 20); /* a plain arena bumps on in the hole */
  assert_int_equal(top[1], 0);
}

static gg_arena_t *make_arena_on(size_t capacity, size_t chunk, void *stream) {
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.backend = "host", o.capacity = capacity, o.chunk_size = chunk, o.stream = stream;
  gg_arena_t *a = NULL;
  gg_assert_ok(gg_arena_create(&a, &o));
  return a;
}

/* Frees in stream order are reusable at once also when the block was bump-allocated in the middle
 * of the log and its memory comes back later, at a compaction: the stream may never catch up
 * (held), yet nothing waits and nothing new is mapped. A gg_free of the same kind of block, not in
 * stream order, does wait. */
static void test_ordered_free_in_log_is_reused_at_once(void **state) {
  (void)state;
  void *hs = NULL;
  gg_assert_ok(gg_host_stream_create(&hs));
  gg_arena_t *a = make_arena_on(64u << 20, 4u << 20, hs);
  gg_assert_ok(gg_plugin_set_arena(2, a));
  gg_assert_ok(gg_host_stream_hold(hs)); /* work on the stream never completes by itself */
  void *p[4];
  for (int i = 0; i < 4; i++)
    assert_non_null(p[i] = gg_torch_alloc(1u << 20, 2, hs)); /* fills the chunk */
  gg_torch_free(p[1], 1u << 20, 2, hs);                      /* in the middle of the log */
  void *q = gg_torch_alloc(1u << 20, 2, hs);
  assert_ptr_equal(q, p[1]);
  gg_arena_stats_t s;
  gg_assert_ok(gg_arena_stats(a, &s));
  assert_int_equal(s.bytes_mapped, 4u << 20);
  assert_int_equal(s.bytes_pending, 0);
  /* Not in stream order: the block waits for the held stream, so the next one comes from new
   * memory. */
  gg_assert_ok(gg_free(a, p[2]));
  void *r = gg_torch_alloc(1u << 20, 2, hs);
  assert_non_null(r);
  assert_ptr_not_equal(r, p[2]);
  gg_assert_ok(gg_arena_stats(a, &s));
  assert_int_equal(s.bytes_pending, 1u << 20);
  assert_int_equal(s.bytes_mapped, 8u << 20);
  gg_assert_ok(gg_host_stream_release(hs));
  gg_assert_ok(gg_arena_destroy(a));
  gg_assert_ok(gg_host_stream_destroy(hs));
}

/* An allocation that would raise peak mapped first takes the memory of wholly free chunks, and
 * never waits for the GPU: chunks freed in stream order while work that may use them still runs (a
 * held stream) are mapped where the growth needs them, their old range staying mapped, untouched,
 * while that work runs; once an event says it is done, the next growth unmaps the old ranges, still
 * without a wait. */
static void test_growth_past_the_peak_never_waits_for_the_gpu(void **state) {
  (void)state;
  const size_t M = 1u << 20;
  void *hs = NULL;
  gg_assert_ok(gg_host_stream_create(&hs));
  gg_assert_ok(gg_host_fault_set(NULL)); /* resets the backend's operation counters */
  gg_arena_t *a = make_arena_on(256 * M, 2 * M, hs);
  gg_assert_ok(gg_plugin_set_arena(4, a));
  void *x = gg_torch_alloc((ssize_t)(16 * M), 4, hs), *y = gg_torch_alloc(256, 4, hs);
  assert_non_null(x), assert_non_null(y);
  gg_assert_ok(gg_host_stream_hold(hs));      /* a kernel still reads x */
  gg_torch_free(x, (ssize_t)(16 * M), 4, hs); /* 16 MiB free below y; 18 MiB mapped */
  gg_arena_stats_t s0, s1, s2;
  gg_assert_ok(gg_arena_stats(a, &s0));
  assert_int_equal(s0.bytes_mapped, 18 * M);
  unsigned long long maps0 = gg_host_op_count("map");
  void *z =
      gg_torch_alloc((ssize_t)(20 * M), 4, hs); /* does not fit the hole: grows past the peak */
  assert_non_null(z);
  gg_assert_ok(gg_arena_stats(a, &s1));
  assert_int_equal(s1.n_stream_waits, s0.n_stream_waits);
  assert_int_equal(gg_host_op_count("stream_sync") + gg_host_op_count("event_sync"), 0);
  assert_int_equal(s1.n_trims, s0.n_trims);
  /* x's 8 chunks moved under z, the rest of it is new: 22 MiB mapped at most, not 38. */
  unsigned long long fresh = gg_host_op_count("map") - maps0;
  assert_int_equal(s1.n_moves - s0.n_moves, 8);
  assert_int_equal(gg_host_op_count("remap"), 8);
  assert_in_range(fresh, 1, 2);
  assert_int_equal(s1.bytes_mapped, 18 * M + fresh * 2 * M);
  assert_int_equal(s1.peak_mapped, s1.bytes_mapped);
  assert_int_equal(s1.n_chunks, 9 + fresh);
  assert_ptr_not_equal(z, x);
  /* x's old range stays mapped while the kernel may read it. */
  assert_int_equal(gg_host_op_count("unmap") + gg_host_op_count("unmap_range"), 0);
  gg_assert_ok(gg__arena_check(a));
  /* The kernel ends; the next growth unmaps the old range without a wait. */
  gg_assert_ok(gg_host_stream_release(hs));
  gg_assert_ok(gg_host_stream_hold(hs)); /* later work runs again, on other memory */
  void *w = gg_torch_alloc((ssize_t)(24 * M), 4, hs);
  assert_non_null(w);
  gg_assert_ok(gg_arena_stats(a, &s2));
  assert_int_equal(s2.n_stream_waits, s0.n_stream_waits);
  assert_int_equal(gg_host_op_count("unmap"), 8);
  gg_assert_ok(gg__arena_check(a));
  assert_int_equal(gg_host_op_count("stream_sync") + gg_host_op_count("event_sync"), 0);
  assert_int_equal(s2.n_trims,
                   s1.n_trims); /* moves, never a trim: no memory went back and came again */
  assert_true(s2.peak_mapped <= 46 * M); /* 62 MiB had the hole stayed mapped */
  gg_assert_ok(gg__arena_check(a));
  gg_assert_ok(gg_host_stream_release(hs));
  /* Below the peak: a growth maps without trimming. */
  gg_torch_free(z, (ssize_t)(20 * M), 4, hs);
  gg_torch_free(w, (ssize_t)(24 * M), 4, hs);
  gg_assert_ok(gg_arena_trim(a, 0));
  gg_assert_ok(gg_arena_stats(a, &s1));
  assert_int_equal(s1.n_stream_waits,
                   s0.n_stream_waits); /* the frees' events said the work was done */
  assert_non_null(z = gg_torch_alloc((ssize_t)(12 * M), 4, hs));
  gg_assert_ok(gg_arena_stats(a, &s2));
  assert_int_equal(s2.n_trims, s1.n_trims);
  assert_true(s2.bytes_mapped > s1.bytes_mapped);
  gg_torch_free(z, (ssize_t)(12 * M), 4, hs);
  gg_torch_free(y, 256, 4, hs);
  gg_assert_ok(gg_arena_destroy(a));
  gg_assert_ok(gg_host_stream_destroy(hs));
}

/* The stream guarantee while the GPU never catches up (a held stream): growth past the peak over
 * and over, with every free in stream order, never waits and never unmaps memory whose last user
 * may still run; once the work is done, a trim gives everything back without a wait. */
static void test_growth_under_running_work_keeps_recent_frees_mapped(void **state) {
  (void)state;
  const size_t M = 1u << 20;
  void *hs = NULL;
  gg_assert_ok(gg_host_stream_create(&hs));
  gg_arena_t *a = make_arena_on(512 * M, 2 * M, hs);
  gg_assert_ok(gg_plugin_set_arena(4, a));
  gg_assert_ok(gg_host_stream_hold(hs));
  gg_arena_stats_t s0, s;
  gg_assert_ok(gg_arena_stats(a, &s0));
  void *keep = NULL;
  for (int step = 1; step <= 8; step++) { /* each step a larger layout than the one before */
    void *big = gg_torch_alloc((ssize_t)(step * 6 * M), 4, hs),
         *small = gg_torch_alloc(4096, 4, hs);
    assert_non_null(big), assert_non_null(small);
    gg_torch_free(big, (ssize_t)(step * 6 * M), 4, hs);
    if (keep) gg_torch_free(keep, 4096, 4, hs);
    keep = small;
    gg_assert_ok(gg_arena_stats(a, &s));
    assert_int_equal(s.n_stream_waits, s0.n_stream_waits);
    assert_int_equal(s.n_trims, s0.n_trims); /* nothing is known done: nothing is unmapped */
    gg_assert_ok(gg__arena_check(a));
  }
  gg_torch_free(keep, 4096, 4, hs);
  gg_assert_ok(gg_host_stream_release(hs));
  gg_assert_ok(gg_arena_trim(a, 0));
  gg_assert_ok(gg_arena_stats(a, &s));
  assert_int_equal(s.n_stream_waits, s0.n_stream_waits);
  assert_int_equal(s.bytes_mapped, 0);
  gg_assert_ok(gg_arena_destroy(a));
  gg_assert_ok(gg_host_stream_destroy(hs));
}

/* A block released outside stream order (gg_free) waits for its event; a growth past the peak while
 * its work runs neither waits for it nor hands its memory out: the allocations land elsewhere, and
 * the block becomes free once its event completes. */
static void test_growth_past_the_peak_leaves_pending_blocks_alone(void **state) {
  (void)state;
  const size_t M = 1u << 20;
  void *hs = NULL;
  gg_assert_ok(gg_host_stream_create(&hs));
  gg_arena_t *a = make_arena_on(256 * M, 2 * M, hs);
  gg_assert_ok(gg_plugin_set_arena(4, a));
  void *x = NULL;
  gg_assert_ok(gg_alloc(a, 16 * M, &x));
  void *y = gg_torch_alloc(256, 4, hs);
  assert_non_null(y);
  gg_assert_ok(gg_host_stream_hold(hs)); /* a kernel still reads x */
  gg_assert_ok(gg_free(a, x));
  gg_arena_stats_t s0, s1;
  gg_assert_ok(gg_arena_stats(a, &s0));
  assert_int_equal(s0.bytes_pending, 16 * M);
  void *z = gg_torch_alloc((ssize_t)(20 * M), 4, hs), *w = gg_torch_alloc((ssize_t)(8 * M), 4, hs);
  assert_non_null(z), assert_non_null(w);
  uintptr_t xs = (uintptr_t)x, xe = xs + 16 * M;
  assert_true((uintptr_t)z + 20 * M <= xs || (uintptr_t)z >= xe);
  assert_true((uintptr_t)w + 8 * M <= xs || (uintptr_t)w >= xe);
  gg_assert_ok(gg_arena_stats(a, &s1));
  assert_int_equal(s1.n_stream_waits, s0.n_stream_waits);
  assert_int_equal(s1.bytes_pending, 16 * M);
  gg_assert_ok(gg__arena_check(a));
  gg_assert_ok(gg_host_stream_release(hs));
  gg_assert_ok(gg_arena_stats(a, &s1));
  assert_int_equal(s1.bytes_pending, 0);
  gg_torch_free(z, (ssize_t)(20 * M), 4, hs);
  gg_torch_free(w, (ssize_t)(8 * M), 4, hs);
  gg_torch_free(y, 256, 4, hs);
  gg_assert_ok(gg_arena_trim(a, 0));
  gg_assert_ok(gg_arena_stats(a, &s1));
  assert_int_equal(s1.bytes_mapped, 0);
  assert_int_equal(s1.n_stream_waits, s0.n_stream_waits);
  gg_assert_ok(gg_arena_destroy(a));
  gg_assert_ok(gg_host_stream_destroy(hs));
}

/* Many small blocks freed in stream order (some held by this thread's cache until a large request
 * takes them back): a growth past the peak while their work runs neither waits nor unmaps their
 * memory; it moves the chunks they left wholly free. */
static void test_cached_frees_are_not_unmapped_under_running_work(void **state) {
  (void)state;
  const size_t M = 1u << 20, K = 1u << 10;
  void *hs = NULL;
  gg_assert_ok(gg_host_stream_create(&hs));
  gg_arena_t *a = make_arena_on(256 * M, 2 * M, hs);
  gg_assert_ok(gg_plugin_set_arena(4, a));
  enum { N = 96 };
  void *p[N];
  for (int i = 0; i < N; i++)
    assert_non_null(p[i] = gg_torch_alloc((ssize_t)(64 * K), 4, hs)); /* 6 MiB */
  void *y = gg_torch_alloc(256, 4, hs);
  assert_non_null(y);
  gg_assert_ok(gg_host_stream_hold(hs)); /* kernels still read the small blocks */
  for (int i = 0; i < N; i++) gg_torch_free(p[i], (ssize_t)(64 * K), 4, hs);
  gg_arena_stats_t s0, s1;
  gg_assert_ok(gg_arena_stats(a, &s0));
  unsigned long long u0 = gg_host_op_count("unmap") + gg_host_op_count("unmap_range");
  void *z = gg_torch_alloc((ssize_t)(24 * M), 4,
                           hs); /* the caches give back, then growth past the peak */
  assert_non_null(z);
  gg_assert_ok(gg_arena_stats(a, &s1));
  assert_int_equal(s1.n_trims, s0.n_trims);
  assert_int_equal(s1.n_stream_waits, s0.n_stream_waits);
  assert_int_equal(gg_host_op_count("unmap") + gg_host_op_count("unmap_range"), u0);
  assert_true(s1.n_moves > s0.n_moves);
  assert_true(s1.bytes_mapped < s0.bytes_mapped + 24 * M);
  gg_assert_ok(gg__arena_check(a));
  gg_assert_ok(gg_host_stream_release(hs));
  gg_torch_free(z, (ssize_t)(24 * M), 4, hs);
  gg_torch_free(y, 256, 4, hs);
  gg_assert_ok(gg_arena_trim(a, 0));
  gg_assert_ok(gg_arena_stats(a, &s1));
  assert_int_equal(s1.bytes_mapped, 0);
  gg_assert_ok(gg_arena_destroy(a));
  gg_assert_ok(gg_host_stream_destroy(hs));
}

/* Bytes an arena on `stream` still counts as pending after one 4 KiB alloc+free: 0 once that stream
 * has run everything queued on it, including what it was made to wait for. */
static size_t pending_on(void *stream) {
  gg_arena_t *b = make_arena_on(16u << 20, 2u << 20, stream);
  void *p = NULL;
  gg_assert_ok(gg_alloc(b, 4096, &p));
  gg_assert_ok(gg_free(b, p));
  gg_arena_stats_t s;
  gg_assert_ok(gg_arena_stats(b, &s));
  int rc =
      gg_arena_destroy(b); /* waits for the stream: the host backend says when it never would */
  assert_true(rc == 0 || rc == GG_ETIMEDOUT);
  return s.bytes_pending;
}

/* Tensor.record_stream, and a free on another stream: the arena's stream is made to wait, on the
 * device, for that stream's work so far, and the block is freed in the arena's stream order. The
 * host never waits (no stream_sync), and a side stream still running (held) no longer makes the
 * free fail: its memory is handed out again only in the arena's stream order, and unmapped only
 * after that stream, and so the side stream, is done. */
static void test_record_stream_orders_the_free_after_that_stream(void **state) {
  (void)state;
  gg_assert_ok(gg_host_fault_set(NULL)); /* resets the backend's operation counters */
  gg_arena_t *a = make_arena_on(64u << 20, 2u << 20, NULL);
  gg_assert_ok(gg_plugin_set_arena(5, a));
  void *side = NULL;
  gg_assert_ok(gg_host_stream_create(&side));
  void *p = gg_torch_alloc(1 << 20, 5, NULL);
  assert_non_null(p);
  gg_plugin_stats_t s0, s1;
  gg_assert_ok(gg_plugin_stats(5, &s0));
  gg_assert_ok(gg_plugin_record_stream(5, p, side));
  gg_assert_ok(gg_plugin_record_stream(5, p, side)); /* twice: one record */
  gg_torch_free(p, 1 << 20, 5, NULL);
  gg_assert_ok(gg_plugin_stats(5, &s1));
  assert_int_equal(s1.n_stream_waits, s0.n_stream_waits + 1);
  assert_int_equal(s1.n_frees, s0.n_frees + 1);
  assert_int_equal(gg_host_op_count("stream_wait"), 1);
  assert_int_equal(gg_host_op_count("stream_sync"), 0);
  /* Recorded on a stream whose work does not end (held): freed at once all the same. */
  void *q = gg_torch_alloc(1 << 20, 5, NULL);
  gg_assert_ok(gg_host_stream_hold(side));
  gg_assert_ok(gg_plugin_record_stream(5, q, side));
  gg_torch_free(q, 1 << 20, 5, NULL);
  gg_plugin_stats_t s2;
  gg_assert_ok(gg_plugin_stats(5, &s2));
  assert_int_equal(s2.n_failed_frees, s1.n_failed_frees);
  assert_int_equal(s2.n_frees, s1.n_frees + 1);
  gg_arena_stats_t as;
  gg_assert_ok(gg_arena_stats(a, &as));
  assert_int_equal(as.bytes_in_use, 0);
  size_t mapped = as.bytes_mapped;
  /* The arena's stream now runs after the side stream: work queued on it stays pending, and a trim,
   * which must wait for it before unmapping memory freed in stream order, cannot (the host backend
   * says so instead of blocking forever) and unmaps nothing. */
  assert_true(pending_on(NULL) > 0);
  gg_assert_fails(gg_arena_trim(a, 0), GG_ETIMEDOUT, "held");
  gg_assert_ok(gg_arena_stats(a, &as));
  assert_int_equal(as.bytes_mapped, mapped);
  assert_int_equal(gg_host_op_count("stream_wait"), 2);
  /* An allocation for a third stream waits, on the device, for the arena's stream, and so for the
   * side stream: work on that third stream stays pending too. */
  void *third = NULL;
  gg_assert_ok(gg_host_stream_create(&third));
  unsigned long long syncs = gg_host_op_count("stream_sync"); /* pending_on's destroys wait */
  void *r = gg_torch_alloc(1 << 20, 5, third);
  assert_non_null(r);
  assert_int_equal(gg_host_op_count("stream_wait"), 3);
  assert_int_equal(gg_host_op_count("stream_sync"), syncs); /* not on the host */
  assert_true(pending_on(third) > 0);
  syncs = gg_host_op_count("stream_sync");
  gg_torch_free(r, 1 << 20, 5, third);
  assert_int_equal(gg_host_op_count("stream_wait"), 4);
  assert_int_equal(gg_host_op_count("stream_sync"), syncs);
  gg_assert_ok(gg_host_stream_release(side));
  assert_int_equal(pending_on(NULL), 0);
  assert_int_equal(pending_on(third), 0);
  gg_assert_ok(gg_arena_trim(a, 0));
  gg_assert_ok(gg_arena_stats(a, &as));
  assert_int_equal(as.bytes_mapped, 0);
  assert_int_equal(gg_plugin_record_stream(5, NULL, side), GG_EINVAL);
  gg_assert_ok(gg_arena_destroy(a));
  gg_assert_ok(gg_host_stream_destroy(side));
  gg_assert_ok(gg_host_stream_destroy(third));
}

typedef struct race {
  atomic_bool stop;
  atomic_ulong done;
} race_t;

static void *allocator_thread(void *arg) {
  race_t *r = arg;
  while (!atomic_load(&r->stop)) {
    void *p = gg_torch_alloc(4096, 5, NULL);
    if (p)
      gg_torch_free(p, 4096, 5, NULL); /* may land in another arena: refused, counted, no harm */
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
  for (int i = 0; i < 3; i++)
    assert_int_equal(pthread_create(&t[i], NULL, allocator_thread, &r), 0);
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

/* Counters kept per thread and folded (plugin_threads.c): after threads that allocated and freed
 * through the plugin, some of them still alive and some gone, the figures are exact (every call
 * counted once); the peak lies between one thread's and all threads' live bytes. One thread alone
 * gets its peak exact, also across more than a fold's worth of calls, and the reset peak starts
 * from the live bytes. */
typedef struct counted {
  int pairs;
  pthread_barrier_t *done, *hold; /* NULL: exit at once */
} counted_t;

static void *counting_thread(void *arg) {
  counted_t *c = arg;
  void *p[4];
  for (int i = 0; i < c->pairs; i++) {
    for (int k = 0; k < 4; k++) assert_non_null(p[k] = gg_torch_alloc(1000, 7, NULL));
    for (int k = 0; k < 4; k++) gg_torch_free(p[k], 1000, 7, NULL);
  }
  if (c->hold) /* alive, its delta not folded by an exit, while the statistics are read */
    pthread_barrier_wait(c->done), pthread_barrier_wait(c->hold);
  return NULL;
}

static void test_counters_of_many_threads_are_exact(void **state) {
  (void)state;
  gg_arena_t *a = make_arena(64u << 20);
  gg_assert_ok(gg_plugin_set_arena(7, a));
  gg_plugin_stats_t s0, s1;
  gg_assert_ok(gg_plugin_stats(7, &s0));
  gg_assert_ok(gg_plugin_reset_peak(7));
  enum { T = 6, PAIRS = 101 };
  pthread_barrier_t done, hold;
  pthread_barrier_init(&done, NULL, T / 2 + 1);
  pthread_barrier_init(&hold, NULL, T / 2 + 1);
  counted_t c[T];
  pthread_t t[T];
  for (int i = 0; i < T; i++) {
    c[i] = (counted_t){PAIRS, i % 2 ? &done : NULL, i % 2 ? &hold : NULL};
    assert_int_equal(pthread_create(&t[i], NULL, counting_thread, &c[i]), 0);
  }
  for (int i = 0; i < T; i += 2) pthread_join(t[i], NULL); /* the exited half */
  pthread_barrier_wait(&done);
  void *mine = gg_torch_alloc(3000, 7, NULL); /* live while the statistics are read */
  assert_non_null(mine);
  gg_assert_ok(gg_plugin_stats(7, &s1)); /* the other half still alive, mid-delta */
  pthread_barrier_wait(&hold);
  for (int i = 1; i < T; i += 2) pthread_join(t[i], NULL);
  unsigned long long calls = (unsigned long long)T * PAIRS * 4;
  assert_int_equal(s1.n_allocs - s0.n_allocs, calls + 1);
  assert_int_equal(s1.n_frees - s0.n_frees, calls);
  assert_int_equal(s1.blocks[GG_PLUGIN_ALL].current, 1);
  assert_int_equal(s1.bytes[GG_PLUGIN_ALL].current, 3072); /* rounded to the 256-byte quantum */
  assert_int_equal(s1.requested[GG_PLUGIN_SMALL].current, 3000);
  assert_int_equal(s1.bytes[GG_PLUGIN_ALL].allocated - s0.bytes[GG_PLUGIN_ALL].allocated,
                   calls * 1024 + 3072);
  assert_int_equal(s1.bytes[GG_PLUGIN_ALL].freed - s0.bytes[GG_PLUGIN_ALL].freed, calls * 1024);
  assert_int_equal(s1.bytes[GG_PLUGIN_LARGE].allocated, s0.bytes[GG_PLUGIN_LARGE].allocated);
  assert_true(s1.bytes[GG_PLUGIN_ALL].peak >= 4 * 1024);
  assert_true(s1.bytes[GG_PLUGIN_ALL].peak <= (unsigned long long)T * 4 * 1024 + 3072);
  gg_torch_free(mine, 3000, 7, NULL);

  /* One thread: exact peak across several folds, and after a reset. */
  gg_assert_ok(gg_plugin_reset_peak(7));
  void *q[100];
  for (int i = 0; i < 100; i++) assert_non_null(q[i] = gg_torch_alloc(256, 7, NULL));
  for (int i = 0; i < 100; i++) gg_torch_free(q[i], 256, 7, NULL);
  for (int i = 0; i < 10; i++) assert_non_null(q[i] = gg_torch_alloc(512, 7, NULL));
  gg_assert_ok(gg_plugin_stats(7, &s1));
  assert_int_equal(s1.bytes[GG_PLUGIN_ALL].peak, 100 * 256);
  assert_int_equal(s1.bytes[GG_PLUGIN_ALL].current, 10 * 512);
  assert_int_equal(s1.blocks[GG_PLUGIN_SMALL].peak, 100);
  gg_assert_ok(gg_plugin_reset_peak(7));
  gg_assert_ok(gg_plugin_stats(7, &s1));
  assert_int_equal(s1.bytes[GG_PLUGIN_ALL].peak, 10 * 512);
  for (int i = 0; i < 10; i++) gg_torch_free(q[i], 512, 7, NULL);
  gg_assert_ok(gg_plugin_reset_totals(7));
  gg_assert_ok(gg_plugin_stats(7, &s1));
  assert_int_equal(s1.bytes[GG_PLUGIN_ALL].allocated, 0);
  assert_int_equal(s1.bytes[GG_PLUGIN_ALL].current, 0);
  assert_int_equal(s1.bytes[GG_PLUGIN_ALL].peak, 10 * 512);
  pthread_barrier_destroy(&done), pthread_barrier_destroy(&hold);
  gg_assert_ok(gg_arena_destroy(a));
}

/* Code written for CUDA keeps its stream handles after a fallback: cudaStreamPerThread (0x2) after
 * a fallback to the host backend names the default stream; a handle the host backend never made is
 * refused at create and at free, never read. */
static void test_cuda_special_and_foreign_streams(void **state) {
  (void)state;
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.backend = "host", o.capacity = 16u << 20, o.chunk_size = 2u << 20, o.stream = (void *)0x2;
  gg_arena_t *a = NULL;
  gg_assert_ok(gg_arena_create(&a, &o));
  gg_arena_stats_t s;
  gg_assert_ok(gg_arena_stats(a, &s));
  void *p = NULL;
  gg_assert_ok(gg_alloc(a, 1000, &p));
  gg_assert_ok(gg_free(a, p));
  gg_assert_ok(gg_arena_stats(a, &s));
  gg_assert_ok(gg_plugin_set_arena(6, a));
  assert_non_null(p = gg_torch_alloc(100, 6, (void *)0x2));
  gg_torch_free(p, 100, 6, (void *)0x2);
  gg_assert_ok(gg_arena_stats(a, &s));
  assert_int_equal(s.n_live, 0);
  /* A foreign handle: the free fails (counted, the block stays with the arena), nothing crashes. */
  gg_plugin_stats_t before, after;
  gg_assert_ok(gg_plugin_stats(6, &before));
  assert_non_null(p = gg_torch_alloc(100, 6, NULL));
  gg_torch_free(p, 100, 6, (void *)0xdead0);
  gg_assert_ok(gg_plugin_stats(6, &after));
  assert_int_equal(after.n_failed_frees, before.n_failed_frees + 1);
  gg_torch_free(p, 100, 6, NULL);
  gg_assert_ok(gg_arena_stats(a, &s));
  assert_int_equal(s.n_live, 0);
  gg_assert_ok(gg_plugin_set_arena(6, NULL));
  gg_assert_ok(gg_arena_destroy(a));
  o.stream = (void *)0xdead0;
  gg_assert_fails(gg_arena_create(&a, &o), GG_EINVAL, "gg_arena_create: stream");
  assert_null(a);
}

int main(void) {
  setenv("GPUGUARD_HOST_CAPACITY", "1G", 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_register_alloc_free_destroy),
      cmocka_unit_test(test_ordered_free_in_log_is_reused_at_once),
      cmocka_unit_test(test_record_stream_orders_the_free_after_that_stream),
      cmocka_unit_test(test_growth_past_the_peak_never_waits_for_the_gpu),
      cmocka_unit_test(test_growth_under_running_work_keeps_recent_frees_mapped),
      cmocka_unit_test(test_growth_past_the_peak_leaves_pending_blocks_alone),
      cmocka_unit_test(test_cached_frees_are_not_unmapped_under_running_work),
      cmocka_unit_test(test_allocations_race_registration_and_destroy),
      cmocka_unit_test(test_cuda_special_and_foreign_streams),
      cmocka_unit_test(test_counters_of_many_threads_are_exact),
      cmocka_unit_test(test_plugin_arena_keeps_large_holes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
