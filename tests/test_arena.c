/* test_arena.c — the arena's rules on the host backend: allocation, alignment, tags, scopes
 * (nesting, order, O(1) ends), trim (middle chunks too), statistics, bad input, capacity, devices
 * without VMM, stream-safe reuse with a held stream, and fork. */
#include <sys/wait.h>
#include <unistd.h>

#include "arena/arena_internal.h"
#include "backend/backend.h"
#include "gg_test.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static int setup(void **state) {
  (void)state;
  gg_test_use_host("64M", "64K");
  return 0;
}

static gg_arena_t *mk(size_t cap, size_t chunk, unsigned flags, void *stream) {
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.capacity = cap, o.chunk_size = chunk, o.flags = flags, o.stream = stream, o.name = "test";
  gg_arena_t *a = NULL;
  gg_assert_ok(gg_arena_create(&a, &o));
  assert_non_null(a);
  return a;
}

static gg_arena_stats_t stats(gg_arena_t *a) {
  gg_arena_stats_t s;
  memset(&s, 0xa5, sizeof s); /* every byte, the reserve included, must be written */
  gg_assert_ok(gg_arena_stats(a, &s));
  gg_assert_ok(gg__arena_check(a));
  for (size_t i = 0; i < sizeof s.reserved_ / sizeof s.reserved_[0]; i++)
    assert_int_equal(s.reserved_[i], 0);
  return s;
}

static gg__arena_probe_t probe(gg_arena_t *a) {
  gg__arena_probe_t p;
  gg_assert_ok(gg__arena_probe(a, &p));
  return p;
}

static size_t host_free(void) {
  gg__dev_t *d = NULL;
  size_t f = 0, t = 0;
  gg_assert_ok(gg__dev_open("host", 0, &d));
  gg_assert_ok(d->ops->mem_info(d, &f, &t));
  gg__dev_close(d);
  return f;
}

static void test_alloc_write_free(void **state) {
  (void)state;
  gg_arena_t *a = mk(16 * MiB, 0, 0, NULL);
  assert_string_equal(gg_arena_name(a), "test");
  assert_string_equal(gg_arena_backend(a), "host");
  gg_arena_stats_t s = stats(a);
  assert_int_equal(s.bytes_mapped, 0); /* nothing mapped before the first allocation */
  assert_int_equal(s.bytes_reserved, 16 * MiB);
  size_t sizes[] = {1, 255, 256, 257, 4096, 100000, 3 * MiB};
  void *p[7];
  size_t want = 0;
  for (int i = 0; i < 7; i++) {
    gg_assert_ok(gg_alloc(a, sizes[i], &p[i]));
    assert_int_equal((uintptr_t)p[i] % 256, 0);
    memset(p[i], i + 1, sizes[i]); /* host backend pointers are real memory */
    want += (sizes[i] + 255) / 256 * 256;
  }
  s = stats(a);
  assert_int_equal(s.bytes_in_use, want);
  assert_int_equal(s.n_live, 7);
  assert_int_equal(s.n_allocs, 7);
  assert_true(s.bytes_mapped >= want && s.bytes_mapped % (64 * KiB) == 0);
  /* Copies through the arena see the same bytes, and a memset lands. */
  unsigned char buf[300];
  gg_assert_ok(gg_arena_copy_from_device(a, buf, p[3], 257));
  for (int i = 0; i < 257; i++) assert_int_equal(buf[i], 4);
  gg_assert_ok(gg_arena_memset(a, p[4], 0x5A, 4096));
  assert_int_equal(((unsigned char *)p[4])[4095], 0x5A);
  memset(buf, 7, sizeof buf);
  gg_assert_ok(gg_arena_copy_to_device(a, p[2], buf, 256));
  assert_int_equal(((unsigned char *)p[2])[255], 7);
  for (int i = 0; i < 7; i++) {
    for (size_t k = 0; k < sizes[i]; k += 97)
      if (i != 2 && i != 4) assert_int_equal(((unsigned char *)p[i])[k], i + 1);
    gg_assert_ok(gg_free(a, p[i]));
  }
  s = stats(a);
  assert_int_equal(s.bytes_in_use, 0);
  assert_int_equal(s.n_live, 0);
  assert_int_equal(s.n_frees, 7);
  assert_int_equal(s.peak_in_use, want);
  gg_assert_ok(gg_arena_destroy(a));
  gg_assert_ok(gg_arena_destroy(NULL));
}

static void test_alignment(void **state) {
  (void)state;
  gg_arena_t *a = mk(16 * MiB, 0, 0, NULL);
  size_t aligns[] = {0, 1, 16, 256, 512, 4096, 64 * KiB, MiB};
  for (int round = 0; round < 2; round++) /* the second round reuses freed memory (best fit) */
    for (int i = 0; i < 8; i++) {
      void *p, *q;
      gg_assert_ok(gg_alloc_ex(a, 300, aligns[i], NULL, &p));
      gg_assert_ok(gg_alloc_ex(a, 1000, aligns[i], "x", &q));
      size_t want = aligns[i] < 256 ? 256 : aligns[i];
      assert_int_equal((uintptr_t)p % want, 0);
      assert_int_equal((uintptr_t)q % want, 0);
      gg_assert_ok(gg__arena_check(a));
      gg_assert_ok(gg_free(a, p));
      if (round) gg_assert_ok(gg_free(a, q));
    }
  void *p = (void *)1;
  gg_assert_fails(gg_alloc_ex(a, 64, 3, NULL, &p), GG_EINVAL, "not a power of two");
  assert_null(p);
  gg_assert_fails(gg_alloc_ex(a, 64, 768, NULL, &p), GG_EINVAL, "power of two");
  gg_assert_ok(gg__arena_check(a));
  gg_assert_ok(gg_arena_destroy(a));
}

typedef struct seen {
  int n;
  void *ptr[8];
  size_t size[8];
  char tag[8][80];
  int depth[8];
} seen_t;

static int visit(const gg_block_info_t *b, void *user) {
  seen_t *s = user;
  if (s->n < 8) {
    s->ptr[s->n] = b->ptr, s->size[s->n] = b->size, s->depth[s->n] = b->scope_depth;
    snprintf(s->tag[s->n], sizeof s->tag[0], "%s", b->tag);
  }
  s->n++;
  return 0;
}

static int stop_at_two(const gg_block_info_t *b, void *user) {
  (void)b;
  return ++*(int *)user == 2;
}

static void test_tags_and_foreach(void **state) {
  (void)state;
  gg_arena_t *a = mk(16 * MiB, 0, 0, NULL);
  char tag[32] = "weights";
  void *w, *x, *y, *z;
  gg_assert_ok(gg_alloc_ex(a, 1000, 0, tag, &w));
  strcpy(tag, "changed"); /* tags are copied */
  gg_scope_t sc;
  gg_assert_ok(gg_scope_begin(a, &sc));
  gg_assert_ok(gg_alloc_ex(a, 5, 0, NULL, &x));
  char longtag[100];
  memset(longtag, 'L', 99), longtag[99] = '\0';
  gg_assert_ok(gg_alloc_ex(a, 77, 0, longtag, &y));
  gg_assert_ok(gg_alloc_ex(a, 77, 0, "weights", &z));
  seen_t s = {0};
  gg_assert_ok(gg_arena_foreach_block(a, visit, &s));
  assert_int_equal(s.n, 4);
  for (int i = 1; i < 4; i++)
    assert_true((uintptr_t)s.ptr[i - 1] < (uintptr_t)s.ptr[i]); /* address order */
  assert_ptr_equal(s.ptr[0], w);
  assert_string_equal(s.tag[0], "weights");
  assert_int_equal(s.size[0], 1000);
  assert_int_equal(s.depth[0], 0);
  assert_string_equal(s.tag[1], "");
  assert_int_equal(s.depth[1], 1);
  assert_int_equal(strlen(s.tag[2]), 63); /* long tags are cut, not refused */
  assert_string_equal(s.tag[3], "weights");
  int count = 0;
  gg_assert_ok(gg_arena_foreach_block(a, stop_at_two, &count));
  assert_int_equal(count, 2);
  gg_assert_fails(gg_arena_foreach_block(a, NULL, NULL), GG_EINVAL, "visit is NULL");
  gg_assert_ok(gg_scope_end(&sc));
  s.n = 0;
  gg_assert_ok(gg_arena_foreach_block(a, visit, &s));
  assert_int_equal(s.n, 1);
  gg_assert_ok(gg_arena_destroy(a));
}

static void test_scopes_nest(void **state) {
  (void)state;
  for (int flags = 0; flags < 2; flags++) {
    gg_arena_t *a = mk(16 * MiB, 256 * KiB, flags ? GG_ARENA_NO_STREAM : 0, NULL);
    void *before, *o1, *o2, *i1, *freed, *after;
    gg_assert_ok(gg_alloc(a, 1000, &before));
    gg_scope_t outer, inner;
    gg_assert_ok(gg_scope_begin(a, &outer));
    gg_assert_ok(gg_alloc(a, 2000, &o1));
    gg_assert_ok(gg_scope_begin(a, &inner));
    assert_int_equal(stats(a).scope_depth, 2);
    gg_assert_ok(gg_alloc(a, 3000, &i1));
    gg_assert_ok(gg_alloc(a, 100, &freed));
    gg_assert_ok(gg_free(a, freed)); /* freed early: the scope end must not release it again */
    /* Ending the outer scope first is refused and changes nothing. */
    gg_arena_stats_t s0 = stats(a);
    gg_assert_fails(gg_scope_end(&outer), GG_ESTATE, "is open");
    gg_arena_stats_t s1 = stats(a);
    assert_memory_equal(&s0, &s1, sizeof s0);
    gg_assert_ok(gg_scope_end(&inner));
    gg_assert_fails(gg_scope_end(&inner), GG_ESTATE, "ended already");
    gg_arena_stats_t s = stats(a);
    assert_int_equal(s.n_live, 2);
    assert_int_equal(s.scope_depth, 1);
    gg_assert_ok(gg_alloc(a, 4000, &o2));
    gg_assert_ok(gg_scope_end(&outer));
    s = stats(a);
    assert_int_equal(s.n_live, 1); /* only the block from before the scope */
    assert_int_equal(s.bytes_in_use, 1024);
    assert_int_equal(s.n_frees, 4);
    assert_int_equal(s.scope_depth, 0);
    gg_assert_fails(gg_free(a, o1), GG_EINVAL, "");
    gg_assert_fails(gg_free(a, i1), GG_EINVAL, "");
    gg_assert_ok(gg_free(a, before));
    gg_assert_ok(gg_alloc(a, 10, &after));
    gg_assert_fails(gg_scope_end(NULL), GG_EINVAL, "NULL");
    gg_assert_fails(gg_scope_begin(a, NULL), GG_EINVAL, "NULL");
    gg_assert_fails(gg_scope_begin(NULL, &outer), GG_EINVAL, "NULL");
    (void)o2;
    gg_assert_ok(gg_arena_destroy(a));
  }
}

/* A scope of pure bump allocations ends without touching any block record: the log's tail is cut.
 * */
static void test_scope_end_o1(void **state) {
  (void)state;
  gg_arena_t *a = mk(64 * MiB, 16 * MiB, 0, NULL);
  void *keep;
  gg_assert_ok(gg_alloc(a, 512, &keep));
  gg__arena_probe_t p0 = probe(a);
  gg_scope_t sc;
  for (int step = 0; step < 3; step++) {
    gg_assert_ok(gg_scope_begin(a, &sc));
    for (int i = 0; i < 20000; i++) {
      void *p;
      gg_assert_ok(gg_alloc_ex(a, 256 + (size_t)(i % 7) * 256, 0, "act", &p));
    }
    assert_int_equal(probe(a).bump_entries, p0.bump_entries + 20000);
    gg_assert_ok(gg_scope_end(&sc));
    gg__arena_probe_t p1 = probe(a);
    assert_int_equal(p1.blocks_visited, p0.blocks_visited); /* O(1): no record touched */
    assert_int_equal(p1.bump_entries, p0.bump_entries);
    assert_int_equal(stats(a).n_live, 1);
  }
  /* A scope whose blocks came from the best-fit tree costs one visit per block it releases. */
  void *f[10];
  for (int i = 0; i < 10; i++) gg_assert_ok(gg_alloc(a, 4096, &f[i]));
  for (int i = 0; i < 10; i++) gg_assert_ok(gg_free(a, f[i]));
  gg_assert_ok(
      gg_arena_trim(a, SIZE_MAX)); /* settles the frees: their memory is free, in the tree */
  gg__arena_probe_t p2 = probe(a);
  gg_assert_ok(gg_scope_begin(a, &sc));
  void *q;
  gg_assert_ok(gg_alloc(a, 4096, &q));
  gg_assert_ok(gg_scope_end(&sc));
  assert_true(probe(a).blocks_visited - p2.blocks_visited <= 1);
  gg_assert_ok(gg_free(a, keep));
  gg_assert_ok(gg_arena_destroy(a));
}

static void test_trim_middle_chunk(void **state) {
  (void)state;
  for (int flags = 0; flags < 2; flags++) {
    gg_arena_t *a = mk(4 * MiB, 256 * KiB, flags ? GG_ARENA_NO_STREAM : 0, NULL);
    size_t free0 = host_free();
    void *p[3];
    for (int i = 0; i < 3; i++) {
      gg_assert_ok(gg_alloc(a, 256 * KiB, &p[i])); /* each fills one chunk exactly */
      memset(p[i], 'a' + i, 256 * KiB);
    }
    assert_int_equal(stats(a).bytes_mapped, 768 * KiB);
    assert_int_equal(free0 - host_free(), 768 * KiB);
    gg_assert_ok(gg_free(a, p[1]));
    unsigned long long unmaps = gg_host_op_count("unmap");
    gg_assert_ok(gg_arena_trim(a, 0));
    gg_arena_stats_t s = stats(a);
    assert_int_equal(s.bytes_mapped, 512 * KiB); /* the middle chunk went back */
    assert_int_equal(s.n_chunks, 2);
    assert_int_equal(s.n_trims, 1);
    assert_int_equal(s.bytes_trimmed, 256 * KiB);
    assert_int_equal(gg_host_op_count("unmap") - unmaps, 1);
    assert_int_equal(free0 - host_free(), 512 * KiB); /* the driver has it again */
    assert_int_equal(((char *)p[0])[1000], 'a');
    assert_int_equal(((char *)p[2])[256 * KiB - 1], 'c');
    /* The hole is mapped again when needed. */
    void *again;
    gg_assert_ok(gg_alloc(a, 256 * KiB, &again));
    assert_ptr_equal(again, p[1]);
    assert_int_equal(stats(a).bytes_mapped, 768 * KiB);
    /* keep_bytes: free everything, keep at least 512 KiB mapped. */
    for (int i = 0; i < 3; i++) gg_assert_ok(gg_free(a, i == 1 ? again : p[i]));
    gg_assert_ok(gg_arena_trim(a, 512 * KiB));
    assert_int_equal(stats(a).bytes_mapped, 512 * KiB);
    gg_assert_ok(gg_arena_trim(a, 0));
    s = stats(a);
    assert_int_equal(s.bytes_mapped, 0);
    assert_int_equal(s.bytes_trimmed, 1024 * KiB);
    assert_int_equal(host_free(), free0);
    gg_assert_fails(gg_arena_trim(NULL, 0), GG_EINVAL, "NULL");
    gg_assert_ok(gg_arena_destroy(a));
  }
}

static void test_trim_on_scope_exit(void **state) {
  (void)state;
  gg_arena_t *a = mk(8 * MiB, 256 * KiB, GG_ARENA_TRIM_ON_SCOPE_EXIT, NULL);
  gg_scope_t outer, inner;
  gg_assert_ok(gg_scope_begin(a, &outer));
  gg_assert_ok(gg_scope_begin(a, &inner));
  void *p;
  gg_assert_ok(gg_alloc(a, 3 * MiB, &p));
  gg_assert_ok(gg_scope_end(&inner));
  assert_true(stats(a).bytes_mapped >= 3 * MiB); /* only the outermost scope trims */
  gg_assert_ok(gg_scope_end(&outer));
  gg_arena_stats_t s = stats(a);
  assert_int_equal(s.bytes_mapped, 0);
  assert_int_equal(s.n_trims, 1);
  gg_assert_ok(gg_arena_destroy(a));
}

static void test_stats_exact(void **state) {
  (void)state;
  gg_arena_t *a = mk(8 * MiB, 1 * MiB, GG_ARENA_NO_STREAM, NULL);
  void *p[4];
  size_t sz[4] = {100 * KiB, 200 * KiB, 300 * KiB, 100 * KiB};
  for (int i = 0; i < 4; i++) gg_assert_ok(gg_alloc(a, sz[i], &p[i]));
  gg_arena_stats_t s = stats(a);
  assert_int_equal(s.bytes_mapped, 1 * MiB);
  assert_int_equal(s.bytes_in_use, 700 * KiB);
  assert_int_equal(s.largest_free_block, 324 * KiB);
  assert_true(s.fragmentation == 0.0);
  gg_assert_ok(gg_free(a, p[1])); /* a 200 KiB hole and a 324 KiB tail: fragmented */
  s = stats(a);
  assert_int_equal(s.bytes_in_use, 500 * KiB);
  assert_int_equal(s.largest_free_block, 324 * KiB);
  double want = 1.0 - 324.0 / 524.0;
  assert_true(s.fragmentation > want - 1e-12 && s.fragmentation < want + 1e-12);
  gg_assert_ok(gg_free(a, p[3])); /* the last block rejoins the tail */
  s = stats(a);
  assert_int_equal(s.largest_free_block, 424 * KiB);
  gg_assert_ok(gg_free(a, p[2])); /* now the hole and the tail merge */
  s = stats(a);
  assert_int_equal(s.largest_free_block, 924 * KiB);
  assert_int_equal(s.n_live, 1);
  assert_int_equal(s.n_allocs, 4);
  assert_int_equal(s.n_frees, 3);
  assert_int_equal(s.peak_in_use, 700 * KiB);
  assert_int_equal(s.peak_mapped, 1 * MiB);
  assert_int_equal(s.bytes_pending, 0);
  gg_assert_fails(gg_arena_stats(a, NULL), GG_EINVAL, "NULL");
  gg_assert_fails(gg_arena_stats(NULL, &s), GG_EINVAL, "NULL");
  gg_assert_ok(gg_arena_destroy(a));
}

static void test_bad_input(void **state) {
  (void)state;
  gg_arena_t *a = mk(8 * MiB, 0, 0, NULL), *b = mk(8 * MiB, 0, 0, NULL);
  void *p = NULL, *q = NULL;
  gg_assert_fails(gg_arena_create(NULL, NULL), GG_EINVAL, "NULL");
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.flags = 0x80;
  gg_arena_t *bad = (gg_arena_t *)1;
  gg_assert_fails(gg_arena_create(&bad, &o), GG_EINVAL, "unknown flags");
  assert_null(bad);
  gg_arena_options_init(&o);
  o.backend = "nonsense";
  gg_assert_fails(gg_arena_create(&bad, &o), GG_EINVAL, "nonsense");
  gg_arena_options_init(&o);
  o.capacity = SIZE_MAX - 10;
  gg_assert_fails(gg_arena_create(&bad, &o), GG_EINVAL, "overflows");
  gg_assert_fails(gg_alloc(NULL, 10, &p), GG_EINVAL, "arena is NULL");
  gg_assert_fails(gg_alloc(a, 10, NULL), GG_EINVAL, "NULL");
  gg_assert_fails(gg_alloc(a, 0, &p), GG_EINVAL, "size is 0");
  gg_assert_fails(gg_alloc(a, SIZE_MAX, &p), GG_EINVAL, "overflows");
  gg_assert_fails(gg_alloc(a, SIZE_MAX - 255, &p), GG_EINVAL, "overflows");
  gg_assert_fails(gg_alloc_ex(a, SIZE_MAX - ((size_t)1 << 62) + 1, (size_t)1 << 62, NULL, &p),
                  GG_EINVAL, "overflows");
  gg_assert_fails(gg_alloc(a, SIZE_MAX - 300, &p), GG_ENOMEM, "capacity");
  gg_assert_ok(gg_alloc(a, 1000, &p));
  gg_assert_ok(gg_alloc(b, 1000, &q));
  gg_assert_fails(gg_free(a, NULL), GG_EINVAL, "NULL");
  gg_assert_fails(gg_free(NULL, p), GG_EINVAL, "NULL");
  gg_assert_fails(gg_free(a, (char *)p + 256), GG_EINVAL, "middle");
  gg_assert_fails(gg_free(a, q), GG_EINVAL, "not allocated by arena");
  gg_assert_fails(gg_free(a, &o), GG_EINVAL, "not allocated by arena");
  gg_assert_ok(gg_free(a, p));
  gg_assert_fails(gg_free(a, p), GG_EINVAL, "double free");
  /* A best-fit (non-bump) block: freed, then freed again. */
  gg_assert_ok(gg_arena_trim(a, 0));
  gg_assert_ok(gg_alloc(a, 4096, &p));
  gg_assert_ok(gg_free(a, p));
  gg_assert_ok(gg_arena_trim(a, SIZE_MAX));
  gg_assert_ok(gg_alloc(a, 512, &p));
  gg_assert_ok(gg_alloc(a, 512, &q));
  gg_assert_ok(gg_free(a, q));
  gg_assert_fails(gg_free(a, q), GG_EINVAL, "double free");
  gg_assert_fails(gg_free(a, (char *)p + 256), GG_EINVAL, "middle");
  /* Copies outside live blocks. */
  char buf[64];
  gg_assert_fails(gg_arena_copy_to_device(a, (char *)p + 500, buf, 64), GG_EINVAL, "live block");
  gg_assert_fails(gg_arena_copy_from_device(a, buf, q, 8), GG_EINVAL, "live block");
  gg_assert_fails(gg_arena_copy_from_device(a, NULL, p, 8), GG_EINVAL, "NULL");
  gg_assert_fails(gg_arena_memset(a, NULL, 0, 8), GG_EINVAL, "NULL");
  gg_assert_fails(gg_arena_memset(NULL, p, 0, 8), GG_EINVAL, "NULL");
  gg_assert_ok(gg_arena_memset(a, p, 0, 0));
  gg_assert_ok(gg__arena_check(a));
  gg_assert_ok(gg__arena_check(b));
  /* Use after destroy: a recently destroyed handle is refused cleanly. */
  gg_assert_ok(gg_arena_destroy(b));
  gg_assert_fails(gg_alloc(b, 10, &q), GG_EINVAL, "not a live arena");
  gg_assert_fails(gg_free(b, q), GG_EINVAL, "not a live arena");
  gg_assert_fails(gg_arena_destroy(b), GG_EINVAL, "not a live arena");
  assert_null(gg_arena_name(b));
  assert_null(gg_arena_backend(NULL));
  gg_scope_t sc;
  gg_assert_ok(gg_scope_begin(a, &sc));
  gg_assert_ok(gg_arena_destroy(a));
  gg_assert_fails(gg_scope_end(&sc), GG_EINVAL, "not a live arena");
}

static void test_over_capacity_message(void **state) {
  (void)state;
  gg_arena_t *a = mk(1 * MiB, 256 * KiB, 0, NULL);
  void *p[4];
  for (int i = 0; i < 4; i++) gg_assert_ok(gg_alloc_ex(a, 200 * KiB, 0, "big", &p[i]));
  void *q = (void *)1;
  gg_assert_fails(gg_alloc(a, 300 * KiB, &q), GG_ENOMEM, "cannot allocate 307200 bytes");
  assert_null(q);
  const char *m = gg_last_error();
  assert_non_null(strstr(m, "in use 819200"));
  assert_non_null(strstr(m, "mapped 1048576"));
  assert_non_null(strstr(m, "capacity 1048576"));
  assert_non_null(strstr(m, "largest free block 229376"));
  assert_non_null(strstr(m, "fragmentation"));
  gg_assert_fails(gg_alloc(a, 2 * MiB, &q), GG_ENOMEM, "exceeds the capacity");
  gg_assert_ok(gg__arena_check(a));
  gg_assert_ok(gg_free(a, p[1]));
  gg_assert_ok(gg_free(a, p[2]));
  gg_assert_ok(gg_alloc(a, 300 * KiB, &q)); /* usable afterwards */
  gg_assert_ok(gg_arena_destroy(a));
  /* The device itself running out (capacity above the simulated device's memory). */
  setenv("GPUGUARD_HOST_CAPACITY", "2M", 1);
  a = mk(8 * MiB, 1 * MiB, 0, NULL);
  gg_assert_ok(gg_alloc(a, 1 * MiB, &p[0]));
  gg_assert_ok(gg_alloc(a, 1 * MiB, &p[1]));
  gg_assert_fails(gg_alloc(a, 1 * MiB, &q), GG_ENOMEM, "out of device memory");
  assert_non_null(strstr(gg_last_error(), "capacity 8388608"));
  gg_assert_ok(gg_arena_destroy(a));
  setenv("GPUGUARD_HOST_CAPACITY", "64M", 1);
}

/* Without VMM each chunk is its own segment: blocks never span two, even when addresses touch. */
static void test_no_vmm(void **state) {
  (void)state;
  setenv("GPUGUARD_HOST_VMM", "0", 1);
  for (int flags = 0; flags < 2; flags++) {
    gg_arena_t *a = mk(8 * MiB, 256 * KiB, flags ? GG_ARENA_NO_STREAM : 0, NULL);
    void *p[12];
    for (int i = 0; i < 12; i++) {
      gg_assert_ok(gg_alloc_ex(a, 100 * KiB + (size_t)i * 1000, i % 3 ? 0 : 64 * KiB, "nv", &p[i]));
      memset(p[i], i, 100 * KiB);
      gg_assert_ok(gg__arena_check(a)); /* checks every region lies inside one chunk */
    }
    for (int i = 0; i < 12; i += 2) gg_assert_ok(gg_free(a, p[i]));
    void *big;
    gg_assert_ok(gg_alloc(a, 600 * KiB, &big)); /* larger than a chunk: a chunk of its own */
    memset(big, 0xEE, 600 * KiB);
    gg_assert_ok(gg__arena_check(a));
    gg_scope_t sc;
    gg_assert_ok(gg_scope_begin(a, &sc));
    for (int i = 0; i < 50; i++) {
      void *t;
      gg_assert_ok(gg_alloc(a, 30 * KiB, &t));
      memset(t, 1, 30 * KiB);
    }
    gg_assert_ok(gg_scope_end(&sc));
    for (int i = 1; i < 12; i += 2) {
      assert_int_equal(((unsigned char *)p[i])[100 * KiB - 1], i);
      gg_assert_ok(gg_free(a, p[i]));
    }
    gg_assert_ok(gg_free(a, big));
    gg_assert_ok(gg_arena_trim(a, 0));
    gg_arena_stats_t s = stats(a);
    assert_int_equal(s.bytes_mapped, 0);
    assert_int_equal(s.n_live, 0);
    gg_assert_ok(gg_arena_destroy(a));
  }
  unsetenv("GPUGUARD_HOST_VMM");
}

/* Memory freed while work is queued on the stream is not handed out until that work is done. */
static void test_stream_safe_reuse(void **state) {
  (void)state;
  void *st;
  gg_assert_ok(gg_host_stream_create(&st));
  gg_arena_t *a = mk(512 * KiB, 256 * KiB, 0, st);
  void *A, *B, *C;
  gg_assert_ok(gg_alloc(a, 256 * KiB, &A));
  gg_assert_ok(gg_host_stream_hold(st)); /* "a kernel is running" */
  gg_assert_ok(gg_free(a, A));
  gg_assert_ok(gg_alloc(a, 256 * KiB, &B));
  assert_ptr_not_equal(A, B);
  /* The only memory left is A's: the allocator must refuse rather than hand it out. */
  gg_assert_fails(gg_alloc(a, 256 * KiB, &C), GG_ENOMEM, "pending reuse 262144");
  assert_non_null(strstr(gg_last_error(), "waiting for pending releases failed"));
  gg_arena_stats_t s = stats(a);
  assert_int_equal(s.bytes_pending, 256 * KiB);
  assert_int_equal(s.largest_free_block, 0);
  /* Trim waits for the work; on a held host stream that is an error, and nothing changes. */
  gg_assert_fails(gg_arena_trim(a, 0), GG_ETIMEDOUT, "held");
  assert_int_equal(stats(a).bytes_mapped, 512 * KiB);
  gg_assert_ok(gg_host_stream_release(st)); /* "the kernel finished" */
  gg_assert_ok(gg_alloc(a, 256 * KiB, &C));
  assert_ptr_equal(C, A);
  /* Many small frees are batched: far fewer events than frees. */
  gg_assert_ok(gg_free(a, B));
  gg_assert_ok(gg_free(a, C));
  gg_assert_ok(gg_arena_trim(a, 0));
  gg_host_fault_set(NULL); /* resets the op counters */
  for (int i = 0; i < 5000; i++) {
    void *p;
    gg_assert_ok(gg_alloc(a, 256, &p));
    gg_assert_ok(gg_free(a, p));
  }
  unsigned long long rec = gg_host_op_count("event_record"), q = gg_host_op_count("event_query");
  printf("5000 alloc+free pairs: %llu events recorded, %llu queries\n", rec, q);
  assert_true(rec <= 50 && q <= 100); /* at least ~100 frees per event, even in a 512 KiB arena */
  gg_assert_ok(gg__arena_check(a));
  gg_assert_ok(gg_arena_destroy(a));
  gg_host_stream_destroy(st);
}

/* Alloc+free pairs (each block freed before the next allocation) share one stream query among more
 * pairs while the stream was last seen idle, whatever their sizes; an allocation that stays live
 * while releases wait gets the usual rule back; a freed block still never comes back while the work
 * queued before its free runs. */
static void test_pairs_share_a_query(void **state) {
  (void)state;
  void *st;
  gg_assert_ok(gg_host_stream_create(&st));
  gg_arena_t *a = mk(64 * MiB, 8 * MiB, 0, st);
  void *p, *q = NULL;
  for (int i = 0; i < 8; i++) {
    gg_assert_ok(gg_alloc(a, 2 * MiB, &p));
    gg_assert_ok(gg_free(a, p));
  }
  unsigned long long n[3];
  for (int run = 0; run < 3; run++) {
    gg_host_fault_set(NULL); /* resets the op counters */
    for (int i = 0; i < 300; i++) {
      gg_assert_ok(gg_alloc(a, run == 1 && i % 2 ? 3 * MiB : 2 * MiB, &p));
      if (run == 2) { /* the block allocated before this one is freed after it: not pairs */
        if (q) gg_assert_ok(gg_free(a, q));
        q = p;
      } else {
        gg_assert_ok(gg_free(a, p));
      }
    }
    n[run] = gg_host_op_count("stream_query") + gg_host_op_count("event_query");
  }
  gg_assert_ok(gg_free(a, q));
  printf("300 pairs of 2 MiB: %llu queries; of 2 and 3 MiB: %llu; overlapping 2 MiB blocks: %llu\n",
         n[0], n[1], n[2]);
  /* The usual rule closes a batch every second free of 2 MiB (two frees worth half a chunk): 150.
   * */
  assert_true(n[0] <= 110);
  assert_true(n[1] <= 130);
  assert_true(n[2] >= 140);
  assert_int_equal(stats(a).bytes_mapped,
                   8 * MiB); /* pairs used room the chunk had: nothing mapped */
  /* The stream was last seen idle; now a kernel runs. Blocks freed meanwhile wait for it. */
  gg_assert_ok(gg_host_stream_hold(st));
  void *freed[16];
  int k = 0;
  for (int i = 0; i < 16; i++) {
    gg_assert_ok(gg_alloc(a, 2 * MiB, &p));
    for (int j = 0; j < k; j++) assert_ptr_not_equal(p, freed[j]);
    gg_assert_ok(gg_free(a, p));
    freed[k++] = p;
  }
  assert_true(stats(a).bytes_mapped > 8 * MiB); /* none could be reused: more was mapped */
  gg_assert_ok(gg_host_stream_release(st));
  gg_assert_ok(gg_alloc(a, 2 * MiB, &q));
  gg_assert_ok(gg_free(a, q));
  gg_assert_ok(gg__arena_check(a));
  gg_assert_ok(gg_arena_destroy(a));
  gg_host_stream_destroy(st);
}

static void test_no_stream_immediate_reuse(void **state) {
  (void)state;
  gg_arena_t *a = mk(8 * MiB, 0, GG_ARENA_NO_STREAM, NULL);
  void *p, *q;
  gg_assert_ok(gg_alloc(a, 5000, &p));
  gg_assert_ok(gg_free(a, p));
  gg_assert_ok(gg_alloc(a, 5000, &q));
  assert_ptr_equal(p, q);
  assert_int_equal(gg_host_op_count("event_record"), 0);
  gg_assert_ok(gg_arena_destroy(a));
}

static void test_destroy_with_live_blocks(void **state) {
  (void)state;
  size_t free0 = host_free();
  gg_arena_t *a = mk(32 * MiB, 0, 0, NULL);
  void *p;
  for (int i = 0; i < 10; i++) gg_assert_ok(gg_alloc_ex(a, 3 * MiB, 0, "leak", &p));
  assert_int_equal(stats(a).n_live, 10);
  assert_true(host_free() < free0);
  gg_assert_ok(gg_arena_destroy(a));
  assert_int_equal(host_free(), free0); /* every chunk went back */
}

static void test_fork_child_refused(void **state) {
  (void)state;
  gg_arena_t *a = mk(8 * MiB, 0, 0, NULL);
  void *p;
  gg_assert_ok(gg_alloc(a, 100, &p));
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    void *q;
    gg_arena_stats_t s;
    int ok = gg_alloc(a, 100, &q) == GG_ESTATE && strstr(gg_last_error(), "fork") &&
             gg_free(a, p) == GG_ESTATE && gg_arena_stats(a, &s) == GG_ESTATE &&
             gg_arena_trim(a, 0) == GG_ESTATE && gg_arena_destroy(a) == GG_ESTATE;
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  gg_assert_ok(gg_free(a, p)); /* the parent is unaffected */
  gg_assert_ok(gg_arena_destroy(a));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_alloc_write_free, setup),
      cmocka_unit_test_setup(test_alignment, setup),
      cmocka_unit_test_setup(test_tags_and_foreach, setup),
      cmocka_unit_test_setup(test_scopes_nest, setup),
      cmocka_unit_test_setup(test_scope_end_o1, setup),
      cmocka_unit_test_setup(test_trim_middle_chunk, setup),
      cmocka_unit_test_setup(test_trim_on_scope_exit, setup),
      cmocka_unit_test_setup(test_stats_exact, setup),
      cmocka_unit_test_setup(test_bad_input, setup),
      cmocka_unit_test_setup(test_over_capacity_message, setup),
      cmocka_unit_test_setup(test_no_vmm, setup),
      cmocka_unit_test_setup(test_stream_safe_reuse, setup),
      cmocka_unit_test_setup(test_pairs_share_a_query, setup),
      cmocka_unit_test_setup(test_no_stream_immediate_reuse, setup),
      cmocka_unit_test_setup(test_destroy_with_live_blocks, setup),
      cmocka_unit_test_setup(test_fork_child_refused, setup),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
