/* test_arena_scopes.c — what a scope end releases is exactly what the scope still owns: blocks from
 * the free list and from the bump block, some freed one by one before the end (in any order),
 * nested scopes, an out-of-order end that changes nothing, stream safety of the released memory (a
 * large scope's too), and scopes of 100k blocks. Every step is compared with a model of the live
 * blocks and checked by the invariant checker. */
#include "arena/arena_internal.h"
#include "gg_test.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static int setup(void **state) {
  (void)state;
  gg_test_use_host("128M", "64K");
  return 0;
}

/* The live blocks a test expects: address and scope depth. */
typedef struct live {
  uintptr_t p;
  int depth;
} live_t;
typedef struct model {
  live_t *v;
  size_t n, cap;
} model_t;

static void model_add(model_t *m, void *p, int depth) {
  if (m->n == m->cap) {
    m->cap = m->cap ? 2 * m->cap : 256;
    m->v = realloc(m->v, m->cap * sizeof *m->v);
    assert_non_null(m->v);
  }
  m->v[m->n++] = (live_t){(uintptr_t)p, depth};
}

static void model_del(model_t *m, void *p) {
  for (size_t i = 0; i < m->n; i++)
    if (m->v[i].p == (uintptr_t)p) {
      m->v[i] = m->v[--m->n];
      return;
    }
  fail_msg("%p is not in the model", p);
}

/* Drops every block of depth >= d (a scope end). */
static void model_end(model_t *m, int d) {
  for (size_t i = 0; i < m->n;)
    if (m->v[i].depth >= d)
      m->v[i] = m->v[--m->n];
    else
      i++;
}

static int live_cmp(const void *x, const void *y) {
  uintptr_t a = ((const live_t *)x)->p, b = ((const live_t *)y)->p;
  return a < b ? -1 : a > b;
}

static int collect(const gg_block_info_t *b, void *user) {
  model_add(user, b->ptr, b->scope_depth);
  return 0;
}

/* The arena's live blocks are exactly the model's, at the same depths, and its structures agree. */
static void expect_live(gg_arena_t *a, model_t *m) {
  model_t got = {0};
  gg_assert_ok(gg_arena_foreach_block(a, collect, &got));
  assert_int_equal(got.n, m->n);
  if (m->n) { /* qsort wants a non-NULL array even when empty */
    qsort(m->v, m->n, sizeof *m->v, live_cmp);
    qsort(got.v, got.n, sizeof *got.v, live_cmp);
  }
  for (size_t i = 0; i < m->n; i++) {
    assert_int_equal(got.v[i].p, m->v[i].p);
    assert_int_equal(got.v[i].depth, m->v[i].depth);
  }
  free(got.v);
  gg_arena_stats_t s;
  gg_assert_ok(gg_arena_stats(a, &s));
  assert_int_equal(s.n_live, m->n);
  gg_assert_ok(gg__arena_check(a));
}

static gg_arena_t *mk(unsigned flags, void *stream) {
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.capacity = 96 * MiB, o.chunk_size = 1 * MiB, o.flags = flags, o.stream = stream,
  o.name = "scopes";
  gg_arena_t *a = NULL;
  gg_assert_ok(gg_arena_create(&a, &o));
  return a;
}

/* n blocks of `size` live at depth 0 with a hole of `size` after each: returns the live ones. */
static void **holes(gg_arena_t *a, model_t *m, int n, size_t size) {
  void **p = malloc(2 * (size_t)n * sizeof *p);
  assert_non_null(p);
  for (int i = 0; i < 2 * n; i++) gg_assert_ok(gg_alloc(a, size, &p[i]));
  for (int i = 0; i < 2 * n; i += 2) gg_assert_ok(gg_free(a, p[i]));
  gg_assert_ok(gg_arena_trim(a, SIZE_MAX)); /* the frees settle: holes in the free list */
  for (int i = 0; i < n; i++) p[i] = p[2 * i + 1], model_add(m, p[i], 0);
  return p;
}

/* Two nested scopes over free-list and bump blocks, some freed early in scattered order. */
static void nested_scenario(unsigned flags, void *stream) {
  gg_arena_t *a = mk(flags, stream);
  model_t m = {0};
  enum { N = 300 };
  void **keep = holes(a, &m, N, 1 * KiB);
  gg_scope_t outer, inner;
  gg_assert_ok(gg_scope_begin(a, &outer));
  void *o[N / 2 + 50];
  for (int i = 0; i < N / 2 + 50;
       i++) { /* half the holes, then 3 KiB blocks that only the bump block holds */
    gg_assert_ok(gg_alloc(a, i < N / 2 ? 1 * KiB : 3 * KiB, &o[i]));
    model_add(&m, o[i], 1);
  }
  gg__arena_probe_t pr;
  gg_assert_ok(gg__arena_probe(a, &pr));
  assert_true(pr.bump_entries >= 50); /* the mix: some from the bump block */
  for (int i = 0; i < N / 2 + 50; i += 3) {
    gg_assert_ok(gg_free(a, o[i]));
    model_del(&m, o[i]);
  } /* first too */
  {
    gg_assert_ok(gg_free(a, o[N / 2 + 49]));
    model_del(&m, o[N / 2 + 49]);
  }
  expect_live(a, &m);

  gg_assert_ok(gg_scope_begin(a, &inner));
  void *in[N];
  for (int i = 0; i < N;
       i++) { /* the other holes, the outer scope's freed ones, halves of holes, bump */
    gg_assert_ok(gg_alloc(a, i % 5 == 4 ? 512 : 1 * KiB, &in[i]));
    model_add(&m, in[i], 2);
  }
  bool early[N] = {false}; /* freed before the end: may be reused at once */
  for (int i = N - 1; i >= 0; i -= 4) {
    gg_assert_ok(gg_free(a, in[i]));
    model_del(&m, in[i]);
    early[i] = true;
  }
  for (int i = 0; i < N; i += 7)
    if (!early[i]) {
      gg_assert_ok(gg_free(a, in[i]));
      model_del(&m, in[i]);
      early[i] = true;
    }
  expect_live(a, &m);

  /* Ending the outer scope first is refused and changes nothing. */
  gg_assert_fails(gg_scope_end(&outer), GG_ESTATE, "is open");
  expect_live(a, &m);

  if (stream)
    gg_assert_ok(gg_host_stream_hold(stream)); /* "a kernel may still use the inner blocks" */
  gg_assert_ok(gg_scope_end(&inner));
  model_end(&m, 2);
  expect_live(a, &m);
  for (int i = 0; i < N; i++) /* every inner block is gone, freed early or by the end */
    gg_assert_fails(gg_free(a, in[i]), GG_EINVAL, "");
  if (stream) {
    gg_arena_stats_t s;
    gg_assert_ok(gg_arena_stats(a, &s));
    assert_true(s.bytes_pending > 0);
    /* While the stream runs, no released inner block is handed out again. */
    void *again[N];
    for (int i = 0; i < N; i++) {
      gg_assert_ok(gg_alloc(a, 1 * KiB, &again[i]));
      for (int j = 0; j < N; j++)
        if (!early[j]) assert_ptr_not_equal(again[i], in[j]);
      model_add(&m, again[i], 1);
    }
    gg_assert_ok(gg_host_stream_release(stream));
    expect_live(a, &m);
  }
  gg_assert_ok(gg_scope_end(&outer));
  model_end(&m, 1);
  expect_live(a, &m);
  for (int i = 0; i < N / 2 + 50; i++) gg_assert_fails(gg_free(a, o[i]), GG_EINVAL, "");
  for (int i = 0; i < N; i++) {
    gg_assert_ok(gg_free(a, keep[i]));
    model_del(&m, keep[i]);
  }
  expect_live(a, &m);
  gg_arena_stats_t s;
  gg_assert_ok(gg_arena_stats(a, &s));
  assert_int_equal(s.bytes_in_use, 0);
  free(keep), free(m.v);
  gg_assert_ok(gg_arena_destroy(a));
}

static void test_nested_release_set(void **state) {
  (void)state;
  void *st = NULL;
  gg_assert_ok(gg_host_stream_create(&st));
  nested_scenario(GG_ARENA_NO_STREAM, NULL);
  nested_scenario(0, NULL);
  nested_scenario(0, st);
  gg_assert_ok(gg_host_stream_destroy(st));
}

/* Scopes of 100k blocks from the free list, some freed early, one after another at the same depth
 * (the record array of the first is reused), then one nested in another. */
static void test_scope_100k(void **state) {
  (void)state;
  enum { N = 100000 };
  for (int k = 0; k < 2; k++) {
    gg_arena_t *a = mk(k ? 0 : GG_ARENA_NO_STREAM, NULL);
    model_t base = {0}, m = {0};
    void **keep = holes(a, &base, N, 256);
    void **p = malloc(N * sizeof *p);
    int *depth = malloc(N * sizeof *depth); /* 0: freed early */
    assert_true(p && depth);
    for (int round = 0; round < 3; round++) {
      gg_scope_t sc, sc2;
      gg_assert_ok(gg_scope_begin(a, &sc));
      int half = round == 2 ? N / 2 : N;
      for (int i = 0; i < N; i++) {
        if (i == half) gg_assert_ok(gg_scope_begin(a, &sc2)); /* the rest in a nested scope */
        gg_assert_ok(gg_alloc(a, 256, &p[i]));
        depth[i] = i < half ? 1 : 2;
      }
      for (int i = round; i < N; i += 7) {
        gg_assert_ok(gg_free(a, p[i]));
        depth[i] = 0;
      }
      for (int d = 2; d >= 0; d--) { /* before the ends, after the inner one, after the outer one */
        m.n = 0;
        for (size_t i = 0; i < base.n; i++) model_add(&m, (void *)base.v[i].p, 0);
        for (int i = 0; i < N; i++)
          if (depth[i] && depth[i] <= d) model_add(&m, p[i], depth[i]);
        expect_live(a, &m);
        if (d == 2 && round == 2) gg_assert_ok(gg_scope_end(&sc2));
        if (d == 1) gg_assert_ok(gg_scope_end(&sc));
      }
      assert_int_equal(gg_free(a, p[N - 1]), GG_EINVAL);
    }
    for (int i = 0; i < N; i++) gg_assert_ok(gg_free(a, keep[i]));
    gg_arena_stats_t s;
    gg_assert_ok(gg_arena_stats(a, &s));
    assert_int_equal(s.n_live, 0);
    assert_int_equal(s.bytes_in_use, 0);
    gg_assert_ok(gg__arena_check(a));
    free(p), free(depth), free(keep), free(base.v), free(m.v);
    gg_assert_ok(gg_arena_destroy(a));
  }
}

/* A tracked scope large enough to close the open batch asks the stream before releasing: busy, its
 * blocks wait in a batch and none is handed out until the stream is done; idle, they go straight to
 * the free list (no batch merged) with nothing pending. */
static void test_large_scope_on_stream(void **state) {
  (void)state;
  enum { N = 2048 }; /* over the releases a batch holds before it closes */
  void *st = NULL;
  gg_assert_ok(gg_host_stream_create(&st));
  gg_arena_t *a = mk(0, st);
  model_t m = {0};
  void **keep = holes(a, &m, N, 1 * KiB);
  void **p = malloc(2 * N * sizeof *p);
  assert_non_null(p);
  for (int busy = 1; busy >= 0; busy--) {
    gg_scope_t sc;
    gg_assert_ok(gg_scope_begin(a, &sc));
    for (int i = 0; i < N; i++) gg_assert_ok(gg_alloc(a, 1 * KiB, &p[i]));
    gg__arena_probe_t before, after;
    gg_assert_ok(gg__arena_probe(a, &before));
    if (busy) gg_assert_ok(gg_host_stream_hold(st));
    gg_assert_ok(gg_scope_end(&sc));
    gg_assert_ok(gg__arena_probe(a, &after));
    expect_live(a, &m);
    gg_arena_stats_t s;
    gg_assert_ok(gg_arena_stats(a, &s));
    assert_int_equal(s.bytes_pending, busy ? N * KiB : 0);
    assert_int_equal(after.batches_merged, before.batches_merged); /* idle: no batch either */
    if (!busy) continue;
    for (int i = 0; i < N; i++) { /* while the stream runs, none of the scope's blocks comes back */
      gg_assert_ok(gg_alloc(a, 1 * KiB, &p[N + i]));
      for (int j = 0; j < N; j++) assert_ptr_not_equal(p[N + i], p[j]);
    }
    gg_assert_ok(gg_host_stream_release(st));
    for (int i = 0; i < N; i++) gg_assert_ok(gg_free(a, p[N + i]));
    gg_assert_ok(gg_arena_trim(a, SIZE_MAX)); /* settles them: the scope's holes are free again */
    expect_live(a, &m);
  }
  for (int i = 0; i < N; i++) gg_assert_ok(gg_free(a, keep[i]));
  gg_assert_ok(gg__arena_check(a));
  free(p), free(keep), free(m.v);
  gg_assert_ok(gg_arena_destroy(a));
  gg_assert_ok(gg_host_stream_destroy(st));
}

/* An arena destroyed with scopes open (and arrays of ended ones kept for reuse) frees them: the
 * sanitizers' leak check proves it. */
static void test_destroy_with_open_scopes(void **state) {
  (void)state;
  gg_arena_t *a = mk(GG_ARENA_NO_STREAM, NULL);
  model_t m = {0};
  void **keep = holes(a, &m, 64, 4 * KiB);
  gg_scope_t sc[20];
  void *p;
  for (int d = 0; d < 20; d++) { /* past the frames' first room of 16 */
    gg_assert_ok(gg_scope_begin(a, &sc[d]));
    for (int i = 0; i < 3; i++) gg_assert_ok(gg_alloc(a, 4 * KiB, &p));
  }
  for (int d = 19; d >= 10; d--) gg_assert_ok(gg_scope_end(&sc[d]));
  gg_assert_ok(gg__arena_check(a));
  free(keep), free(m.v);
  gg_assert_ok(gg_arena_destroy(a));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_nested_release_set, setup),
      cmocka_unit_test_setup(test_scope_100k, setup),
      cmocka_unit_test_setup(test_large_scope_on_stream, setup),
      cmocka_unit_test_setup(test_destroy_with_open_scopes, setup),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
