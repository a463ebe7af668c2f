/* test_arena_trim.c — trim giving runs of adjacent chunks back in one backend call: statistics and
 * the (simulated) driver's free memory to the byte, partial trims that keep the lowest chunks,
 * trims between allocations, a driver that refuses ranges spanning several mappings (chunk by chunk
 * then), what the simulated driver refuses, and failures of the unmap path leaving the arena
 * consistent. */
#include "arena/arena_internal.h"
#include "backend/backend.h"
#include "gg_test.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static int setup(void **state) {
  (void)state;
  gg_test_use_host("256M", "64K");
  return 0;
}

static gg_arena_t *mk(size_t chunk) {
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.capacity = 128 * MiB, o.chunk_size = chunk, o.name = "trim";
  gg_arena_t *a = NULL;
  gg_assert_ok(gg_arena_create(&a, &o));
  return a;
}

static gg_arena_stats_t stats(gg_arena_t *a) {
  gg_arena_stats_t s;
  gg_assert_ok(gg_arena_stats(a, &s));
  gg_assert_ok(gg__arena_check(a));
  return s;
}

static size_t host_free(void) {
  gg__dev_t *d = NULL;
  size_t f = 0, t = 0;
  gg_assert_ok(gg__dev_open("host", 0, &d));
  gg_assert_ok(d->ops->mem_info(d, &f, &t));
  gg__dev_close(d);
  return f;
}

/* n blocks of `size` bytes, each filled with its index. */
static void alloc_all(gg_arena_t *a, void **p, int n, size_t size) {
  for (int i = 0; i < n; i++) {
    gg_assert_ok(gg_alloc(a, size, &p[i]));
    memset(p[i], i & 0xff, 4096);
  }
}

/* Calls of the two unmap operations since the last call. */
static unsigned long long seen_unmap, seen_range;
static void count_calls(unsigned long long *unmaps, unsigned long long *ranges) {
  unsigned long long u = gg_host_op_count("unmap"), r = gg_host_op_count("unmap_range");
  *unmaps = u - seen_unmap, *ranges = r - seen_range;
  seen_unmap = u, seen_range = r;
}

/* 32 blocks of 1 MiB at 256 KiB chunks: 128 adjacent chunks, one free block once all are freed.
 * Trim gives them back in one range unmap, and the driver's free memory is back to the byte. */
static void test_trim_one_range(void **state) {
  (void)state;
  size_t free0 = host_free();
  gg_arena_t *a = mk(256 * KiB);
  void *p[32];
  alloc_all(a, p, 32, 1 * MiB);
  gg_arena_stats_t s = stats(a);
  assert_int_equal(s.n_chunks, 128);
  assert_int_equal(s.bytes_mapped, 32 * MiB);
  assert_int_equal(free0 - host_free(), 32 * MiB);
  for (int i = 0; i < 32; i++) gg_assert_ok(gg_free(a, p[i]));
  unsigned long long unmaps, ranges;
  count_calls(&unmaps, &ranges);
  gg_assert_ok(gg_arena_trim(a, 0));
  count_calls(&unmaps, &ranges);
  assert_int_equal(ranges, 1); /* one call for 128 chunks */
  assert_int_equal(unmaps, 0);
  s = stats(a);
  assert_int_equal(s.n_chunks, 0);
  assert_int_equal(s.bytes_mapped, 0);
  assert_int_equal(s.n_trims, 1);
  assert_int_equal(s.bytes_trimmed, 32 * MiB);
  assert_int_equal(host_free(), free0);
  /* Mapped again where it was, and given back again. */
  gg_assert_ok(gg_alloc(a, 3 * MiB, &p[0]));
  assert_int_equal(stats(a).n_chunks, 12);
  gg_assert_ok(gg_free(a, p[0]));
  gg_assert_ok(gg_arena_trim(a, 0));
  assert_int_equal(stats(a).bytes_trimmed, 35 * MiB);
  assert_int_equal(host_free(), free0);
  gg_assert_ok(gg_arena_destroy(a));
}

/* keep_bytes: the highest chunks go, in one call, and the lowest stay mapped, no fewer than keep.
 * */
static void test_trim_partial_keeps_lowest(void **state) {
  (void)state;
  size_t free0 = host_free();
  gg_arena_t *a = mk(256 * KiB);
  void *p[32];
  alloc_all(a, p, 32, 1 * MiB);
  void *lowest = p[0];
  for (int i = 0; i < 32; i++) gg_assert_ok(gg_free(a, p[i]));
  unsigned long long unmaps, ranges;
  count_calls(&unmaps, &ranges);
  gg_assert_ok(gg_arena_trim(a, 1 * MiB + 1)); /* 5 chunks stay: 4 would be less than keep */
  count_calls(&unmaps, &ranges);
  assert_int_equal(ranges, 1);
  gg_arena_stats_t s = stats(a);
  assert_int_equal(s.bytes_mapped, 5 * 256 * KiB);
  assert_int_equal(s.n_chunks, 5);
  assert_int_equal(s.bytes_trimmed, 32 * MiB - 5 * 256 * KiB);
  assert_int_equal(free0 - host_free(), 5 * 256 * KiB);
  /* What stayed is the bottom of the range: 1 MiB fits there without mapping. */
  void *q;
  gg_assert_ok(gg_alloc(a, 1 * MiB, &q));
  assert_ptr_equal(q, lowest);
  assert_int_equal(stats(a).bytes_mapped, 5 * 256 * KiB);
  /* keep above what is mapped: nothing goes. */
  gg_assert_ok(gg_arena_trim(a, 64 * MiB));
  assert_int_equal(stats(a).bytes_mapped, 5 * 256 * KiB);
  /* The live block pins its 4 chunks; the fifth goes. */
  gg_assert_ok(gg_arena_trim(a, 0));
  s = stats(a);
  assert_int_equal(s.bytes_mapped, 1 * MiB);
  assert_int_equal(s.n_chunks, 4);
  gg_assert_ok(gg_free(a, q));
  gg_assert_ok(gg_arena_trim(a, 0));
  assert_int_equal(stats(a).bytes_mapped, 0);
  assert_int_equal(host_free(), free0);
  gg_assert_ok(gg_arena_destroy(a));
}

/* Free holes between live blocks: one run per hole, the live blocks untouched; new allocations
 * between trims map the holes again. */
static void test_trim_between_allocations(void **state) {
  (void)state;
  size_t free0 = host_free();
  gg_arena_t *a = mk(256 * KiB);
  void *p[64];
  alloc_all(a, p, 64, 512 * KiB); /* 2 chunks each */
  for (int i = 0; i < 64; i += 2) gg_assert_ok(gg_free(a, p[i]));
  unsigned long long unmaps, ranges;
  count_calls(&unmaps, &ranges);
  gg_assert_ok(gg_arena_trim(a, 0));
  count_calls(&unmaps, &ranges);
  assert_int_equal(ranges, 32); /* one per hole of two chunks */
  assert_int_equal(unmaps, 0);
  gg_arena_stats_t s = stats(a);
  assert_int_equal(s.n_chunks, 64);
  assert_int_equal(s.bytes_mapped, 32 * 512 * KiB);
  assert_int_equal(free0 - host_free(), 32 * 512 * KiB);
  for (int round = 0; round < 4; round++) {
    for (int i = 0; i < 64; i += 2) gg_assert_ok(gg_alloc(a, 512 * KiB, &p[i]));
    for (int i = 0; i < 64; i += 2) memset(p[i], i & 0xff, 4096);
    gg_assert_ok(gg__arena_check(a));
    /* Free a quarter of the blocks, in a pattern that changes each round, and trim. */
    for (int i = round; i < 64; i += 4) {
      gg_assert_ok(gg_free(a, p[i]));
      p[i] = NULL;
    }
    gg_assert_ok(gg_arena_trim(a, 0));
    s = stats(a);
    assert_int_equal(s.n_live, 48);
    assert_int_equal(s.bytes_mapped, 48 * 512 * KiB);
    assert_int_equal(free0 - host_free(), 48 * 512 * KiB);
    for (int i = 0; i < 64; i++)
      if (p[i]) assert_int_equal(((unsigned char *)p[i])[4095], i & 0xff); /* live data untouched */
    for (int i = 0; i < 64; i += 2) {
      if (!p[i]) continue;
      gg_assert_ok(gg_free(a, p[i]));
      p[i] = NULL;
    }
    for (int i = 1; i < 64; i += 2) {
      if (p[i]) continue;
      gg_assert_ok(gg_alloc(a, 512 * KiB, &p[i]));
      memset(p[i], i & 0xff, 4096);
    }
  }
  for (int i = 0; i < 64; i++)
    if (p[i]) gg_assert_ok(gg_free(a, p[i]));
  gg_assert_ok(gg_arena_trim(a, 0));
  assert_int_equal(stats(a).bytes_mapped, 0);
  assert_int_equal(host_free(), free0);
  gg_assert_ok(gg_arena_destroy(a));
}

/* A driver that takes one mapping per unmap: the range is refused (nothing changed), and the same
 * chunks go one by one; everything comes back all the same. */
static void test_trim_range_refused(void **state) {
  (void)state;
  setenv("GPUGUARD_HOST_RANGE_UNMAP", "0", 1); /* read when the simulated device opens */
  size_t free0 = host_free();
  gg_arena_t *a = mk(256 * KiB);
  void *p[8];
  alloc_all(a, p, 8, 1 * MiB);
  for (int i = 0; i < 8; i++) gg_assert_ok(gg_free(a, p[i]));
  unsigned long long unmaps, ranges;
  count_calls(&unmaps, &ranges);
  gg_assert_ok(gg_arena_trim(a, 0));
  count_calls(&unmaps, &ranges);
  assert_int_equal(ranges, 1); /* tried, refused */
  assert_int_equal(unmaps, 32);
  gg_arena_stats_t s = stats(a);
  assert_int_equal(s.bytes_mapped, 0);
  assert_int_equal(s.bytes_trimmed, 8 * MiB);
  assert_int_equal(host_free(), free0);
  gg_assert_ok(gg_arena_destroy(a));
  unsetenv("GPUGUARD_HOST_RANGE_UNMAP");
}

/* The simulated driver refuses a range that cuts a mapping or has a hole, as cuMemUnmap does, and
 * changes nothing then; chunk by chunk takes over for a hole, whose chunks are whole. */
static void test_host_unmap_run_refusals(void **state) {
  (void)state;
  size_t free0 = host_free();
  gg__dev_t *d = NULL;
  gg_assert_ok(gg__dev_open("host", 0, &d));
  size_t g = d->granularity;
  uintptr_t base = 0;
  gg_assert_ok(d->ops->va_reserve(d, 8 * g, &base));
  gg__chunk_t c[3];
  for (int i = 0; i < 3; i++) gg_assert_ok(d->ops->map(d, base + (size_t)i * 2 * g, 2 * g, &c[i]));
  /* Half of chunk 0: refused, nothing unmapped (the per-chunk retry finds no such mapping either).
   * */
  gg__chunk_t half = {.ptr = c[0].ptr, .size = g};
  gg__chunk_t *run[2] = {&half, NULL};
  size_t done = 99;
  gg_assert_fails(d->ops->unmap_run(d, run, 1, &done), GG_EINVAL, "no such mapping");
  assert_int_equal(done, 0);
  /* Chunk 0 and half of chunk 1: the range cuts a mapping. */
  gg__chunk_t half1 = {.ptr = c[1].ptr, .size = g};
  run[0] = &c[0], run[1] = &half1;
  unsigned long long unmaps, ranges;
  count_calls(&unmaps, &ranges);
  gg_assert_fails(d->ops->unmap_run(d, run, 2, &done), GG_EINVAL, "no such mapping");
  count_calls(&unmaps, &ranges);
  assert_int_equal(ranges, 1);
  assert_int_equal(done, 0);
  assert_int_equal(free0 - host_free(), 6 * g); /* nothing changed */
  memset((void *)c[0].ptr, 1, 2 * g);           /* still mapped */
  /* Chunks 0 and 2 with 1 unmapped in between: a hole, refused; each chunk then goes alone. */
  gg_assert_ok(d->ops->unmap(d, &c[1]));
  run[0] = &c[0], run[1] = &c[2];
  count_calls(&unmaps, &ranges);
  gg_assert_ok(d->ops->unmap_run(d, run, 2, &done));
  count_calls(&unmaps, &ranges);
  assert_int_equal(done, 2);
  assert_int_equal(ranges, 1);
  assert_int_equal(unmaps, 2);
  assert_int_equal(host_free(), free0);
  gg_assert_ok(d->ops->va_release(d, base, 8 * g));
  gg__dev_close(d);
}

/* The range unmap fails: trim reports it, nothing changed, and the next trim gives everything back.
 * */
static void test_trim_range_fault(void **state) {
  (void)state;
  size_t free0 = host_free();
  gg_arena_t *a = mk(256 * KiB);
  void *p[16];
  alloc_all(a, p, 16, 1 * MiB);
  for (int i = 0; i < 16; i++) gg_assert_ok(gg_free(a, p[i]));
  gg_arena_stats_t before = stats(a);
  gg_assert_ok(gg_host_fault_set("unmap_range:1"));
  gg_assert_fails(gg_arena_trim(a, 0), GG_EDRIVER, "unmap_range");
  gg_arena_stats_t s = stats(a);
  assert_int_equal(s.bytes_mapped, before.bytes_mapped);
  assert_int_equal(s.n_chunks, before.n_chunks);
  assert_int_equal(s.n_trims, 0);
  assert_int_equal(free0 - host_free(), 16 * MiB);
  gg_assert_ok(gg_alloc(a, 16 * MiB, &p[0])); /* the memory is whole and usable */
  memset(p[0], 7, 16 * MiB);
  gg_assert_ok(gg_free(a, p[0]));
  gg_assert_ok(gg_arena_trim(a, 0));
  assert_int_equal(stats(a).bytes_mapped, 0);
  assert_int_equal(host_free(), free0);
  gg_host_fault_set(NULL);
  gg_assert_ok(gg_arena_destroy(a));
}

/* Chunk by chunk (a driver without range unmaps), the third unmap fails: the two highest chunks are
 * gone and counted, the rest stays mapped and free, and the arena is consistent. */
static void test_trim_partial_failure(void **state) {
  (void)state;
  setenv("GPUGUARD_HOST_RANGE_UNMAP", "0", 1);
  size_t free0 = host_free();
  gg_arena_t *a = mk(256 * KiB);
  void *p[4];
  alloc_all(a, p, 4, 1 * MiB);
  for (int i = 0; i < 4; i++) gg_assert_ok(gg_free(a, p[i]));
  gg_assert_ok(gg_host_fault_set("unmap:3"));
  gg_assert_fails(gg_arena_trim(a, 0), GG_EDRIVER, "unmap");
  gg_arena_stats_t s = stats(a);
  assert_int_equal(s.bytes_mapped, 4 * MiB - 2 * 256 * KiB);
  assert_int_equal(s.n_chunks, 14);
  assert_int_equal(s.n_trims, 1);
  assert_int_equal(s.bytes_trimmed, 2 * 256 * KiB);
  assert_int_equal(free0 - host_free(), s.bytes_mapped);
  assert_int_equal(s.largest_free_block, s.bytes_mapped); /* the rest is one free block */
  gg_assert_ok(gg_arena_trim(a, 0));
  assert_int_equal(stats(a).bytes_mapped, 0);
  assert_int_equal(host_free(), free0);
  gg_host_fault_set(NULL);
  gg_assert_ok(gg_arena_destroy(a));
  unsetenv("GPUGUARD_HOST_RANGE_UNMAP");
}

/* Destroy gives back adjacent chunks in runs too; a failed run is finished chunk by chunk, so the
 * memory comes back even though destroy reports the failure. */
static void test_destroy_runs(void **state) {
  (void)state;
  size_t free0 = host_free();
  gg_arena_t *a = mk(256 * KiB);
  void *p[8];
  alloc_all(a, p, 8, 1 * MiB);
  unsigned long long unmaps, ranges;
  count_calls(&unmaps, &ranges);
  gg_assert_ok(gg_arena_destroy(a));
  count_calls(&unmaps, &ranges);
  assert_int_equal(ranges, 1);
  assert_int_equal(unmaps, 0);
  assert_int_equal(host_free(), free0);
  a = mk(256 * KiB);
  alloc_all(a, p, 8, 1 * MiB);
  gg_assert_ok(gg_host_fault_set("unmap_range:1"));
  gg_assert_fails(gg_arena_destroy(a), GG_EDRIVER, "unmap_range");
  assert_int_equal(host_free(), free0);
  gg_host_fault_set(NULL);
}

/* Many chunks, trimmed in several partial steps: every step consistent, one call per step. */
static void test_trim_many_chunks(void **state) {
  (void)state;
  size_t free0 = host_free();
  gg_arena_t *a = mk(64 * KiB);
  void *p[64];
  alloc_all(a, p, 64, 1 * MiB); /* 1024 chunks */
  assert_int_equal(stats(a).n_chunks, 1024);
  for (int i = 0; i < 64; i++) gg_assert_ok(gg_free(a, p[i]));
  size_t keep = 48 * MiB;
  for (int step = 0; step < 4; step++, keep -= 16 * MiB) {
    unsigned long long unmaps, ranges;
    count_calls(&unmaps, &ranges);
    gg_assert_ok(gg_arena_trim(a, keep));
    count_calls(&unmaps, &ranges);
    assert_int_equal(ranges, 1);
    gg_arena_stats_t s = stats(a);
    assert_int_equal(s.bytes_mapped, keep);
    assert_int_equal(s.n_chunks, keep / (64 * KiB));
    assert_int_equal(free0 - host_free(), keep);
  }
  gg_assert_ok(gg_arena_destroy(a));
  assert_int_equal(host_free(), free0);
}

/* Growth past the peak moves wholly free chunks in an arena that tracks its stream; one made with
 * GG_ARENA_NO_STREAM (a CUDA graph's pool: its replays use the addresses its capture freed) never
 * moves. x's hole (1.75 MiB, one whole 1 MiB chunk) is too small for the give-back-first step, so
 * only a move could reuse its chunk. */
static void test_moves_only_where_the_stream_is_tracked(void **state) {
  (void)state;
  for (int no_stream = 0; no_stream < 2; no_stream++) {
    gg_arena_options_t o;
    gg_arena_options_init(&o);
    o.capacity = 128 * MiB;
    o.chunk_size = 1 * MiB;
    o.flags = no_stream ? GG_ARENA_NO_STREAM : 0;
    o.name = no_stream ? "moves-no-stream" : "moves";
    gg_arena_t *a = NULL;
    gg_assert_ok(gg_arena_create(&a, &o));
    void *x = NULL;
    void *y = NULL;
    void *z = NULL;
    gg_assert_ok(gg_alloc(a, 1792 * 1024, &x));
    gg_assert_ok(gg_alloc(a, 4096, &y));
    gg_assert_ok(gg_free(a, x));
    gg_arena_stats_t s0 = stats(a);
    gg_assert_ok(gg_alloc(a, 3 * MiB, &z)); /* does not fit x's hole: past the peak */
    gg_arena_stats_t s1 = stats(a);
    assert_int_equal(s1.n_unmaps, s0.n_unmaps);
    if (no_stream) {
      assert_int_equal(s1.n_moves, 0); /* z's memory is new */
      assert_true(s1.n_maps > s0.n_maps);
    } else {
      assert_true(s1.n_moves >= 1); /* the chunks x's hole covers went under z */
      assert_true(s1.bytes_mapped < s0.bytes_mapped + 3 * MiB);
    }
    gg_assert_ok(gg_free(a, z));
    gg_assert_ok(gg_free(a, y));
    gg_assert_ok(gg_arena_trim(a, 0));
    assert_int_equal(stats(a).bytes_mapped, 0);
    gg_assert_ok(gg_arena_destroy(a));
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_trim_one_range, setup),
      cmocka_unit_test_setup(test_trim_partial_keeps_lowest, setup),
      cmocka_unit_test_setup(test_trim_between_allocations, setup),
      cmocka_unit_test_setup(test_trim_range_refused, setup),
      cmocka_unit_test_setup(test_host_unmap_run_refusals, setup),
      cmocka_unit_test_setup(test_trim_range_fault, setup),
      cmocka_unit_test_setup(test_trim_partial_failure, setup),
      cmocka_unit_test_setup(test_destroy_runs, setup),
      cmocka_unit_test_setup(test_trim_many_chunks, setup),
      cmocka_unit_test_setup(test_moves_only_where_the_stream_is_tracked, setup),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
