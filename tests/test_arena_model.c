/* test_arena_model.c — randomized model check: thousands of random alloc/free/scope/trim operations on
 * the host backend against a plain reference model. After every operation: no overlap, alignment,
 * statistics equal to the model's, and the arena's own full consistency check; regularly, every byte
 * of every live block still holds what was written. Seed: fixed, or GG_TEST_SEED to reproduce. */
#include <stdbool.h>

#include "arena_internal.h"
#include "gg_test.h"

#define KiB            ((size_t)1 << 10)
#define MiB            ((size_t)1 << 20)
#define MAX_LIVE       600
#define LIVE_BYTES_MAX (6 * MiB)

typedef struct mblock {
  unsigned char *ptr;
  size_t size, align;
  int depth;
  unsigned id;
} mblock_t;

typedef struct model {
  mblock_t b[MAX_LIVE];
  int n;
  gg_scope_t scopes[8];
  int depth;
  size_t in_use, peak;
  unsigned long long allocs, frees;
  unsigned next_id;
} model_t;

static unsigned long long rng_state;
static unsigned rnd(unsigned n) { /* xorshift64*: reproducible from the seed alone */
  rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
  return (unsigned)((rng_state * 2685821657736338717ull) >> 33) % n;
}

static size_t rounded(size_t n) { return (n + 255) / 256 * 256; }
static unsigned char fill_byte(unsigned id) { return (unsigned char)(id * 131u + 17u); }

static void verify_block(const mblock_t *m) {
  unsigned char want = fill_byte(m->id);
  for (size_t i = 0; i < m->size; i++)
    if (m->ptr[i] != want)
      fail_msg("block %u at %p (%zu bytes): byte %zu is %#x, wanted %#x", m->id, (void *)m->ptr, m->size, i,
               m->ptr[i], want);
}

static void check_stats(gg_arena_t *a, const model_t *m, size_t cap) {
  gg_arena_stats_t s;
  gg_assert_ok(gg_arena_stats(a, &s));
  gg_assert_ok(gg__arena_check(a));
  assert_int_equal(s.bytes_in_use, m->in_use);
  assert_int_equal(s.n_live, (unsigned long long)m->n);
  assert_int_equal(s.n_allocs, m->allocs);
  assert_int_equal(s.n_frees, m->frees);
  assert_int_equal(s.scope_depth, m->depth);
  assert_int_equal(s.peak_in_use, m->peak);
  assert_true(s.bytes_mapped <= cap && s.bytes_mapped >= s.bytes_in_use);
  assert_true(s.largest_free_block + s.bytes_pending <= s.bytes_mapped - s.bytes_in_use);
  assert_true(s.fragmentation >= 0.0 && s.fragmentation <= 1.0);
}

static void model_remove(model_t *m, int i, bool verify) {
  if (verify) verify_block(&m->b[i]);
  m->in_use -= rounded(m->b[i].size);
  m->frees++;
  m->b[i] = m->b[--m->n];
}

static void do_alloc(gg_arena_t *a, model_t *m, bool held) {
  static const size_t aligns[] = {0, 0, 0, 0, 512, 4096, 64 * KiB};
  unsigned r = rnd(100);
  size_t size = r < 70 ? 1 + rnd(4096) : r < 95 ? 4096 + rnd(128 * KiB) : 128 * KiB + rnd(1024 * KiB);
  size_t align = aligns[rnd(7)];
  if (m->n == MAX_LIVE || m->in_use + rounded(size) > LIVE_BYTES_MAX) return;
  void *p = NULL;
  char tag[16];
  snprintf(tag, sizeof tag, "t%u", rnd(5));
  int rc = gg_alloc_ex(a, size, align, rnd(2) ? tag : NULL, &p);
  if (rc == GG_ENOMEM && held) return; /* released memory is not reusable while the stream is held */
  if (rc != 0) fail_msg("alloc %zu (align %zu): %s: %s", size, align, gg_err_name(rc), gg_last_error());
  size_t want_align = align < 256 ? 256 : align;
  assert_int_equal((uintptr_t)p % want_align, 0);
  unsigned char *q = p;
  for (int i = 0; i < m->n; i++) { /* no overlap with any live block */
    const mblock_t *o = &m->b[i];
    if (q < o->ptr + rounded(o->size) && o->ptr < q + rounded(size))
      fail_msg("new block %p+%zu overlaps block %u at %p+%zu", p, size, o->id, (void *)o->ptr, o->size);
  }
  mblock_t *b = &m->b[m->n++];
  *b = (mblock_t){q, size, align, m->depth, ++m->next_id};
  if (rnd(4) == 0) { /* through the arena's copy, or directly (host memory is real) */
    unsigned char *buf = malloc(size);
    memset(buf, fill_byte(b->id), size);
    gg_assert_ok(gg_arena_copy_to_device(a, p, buf, size));
    free(buf);
  } else {
    memset(p, fill_byte(b->id), size);
  }
  m->in_use += rounded(size), m->allocs++;
  if (m->in_use > m->peak) m->peak = m->in_use;
}

static void run_model(const char *label, bool vmm, unsigned flags, unsigned long long seed, int ops) {
  setenv("GPUGUARD_HOST_VMM", vmm ? "1" : "0", 1);
  rng_state = seed ? seed : 1;
  printf("model run '%s': seed %llu, %d operations (reproduce with GG_TEST_SEED=%llu)\n", label, seed, ops,
         seed);
  void *stream = NULL;
  gg_assert_ok(gg_host_stream_create(&stream));
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  size_t cap = 32 * MiB;
  o.capacity = cap, o.chunk_size = 256 * KiB, o.flags = flags, o.stream = stream, o.name = label;
  gg_arena_t *a = NULL;
  gg_assert_ok(gg_arena_create(&a, &o));
  model_t *m = calloc(1, sizeof *m);
  bool held = false;
  unsigned long long n_ops[8] = {0};
  for (int step = 0; step < ops; step++) {
    unsigned op = rnd(100);
    if (op < 45) {
      do_alloc(a, m, held), n_ops[0]++;
    } else if (op < 75) {
      if (m->n) {
        int i = (int)rnd((unsigned)m->n);
        verify_block(&m->b[i]);
        gg_assert_ok(gg_free(a, m->b[i].ptr));
        model_remove(m, i, false);
        n_ops[1]++;
      }
    } else if (op < 83) {
      if (m->depth < 7) {
        gg_assert_ok(gg_scope_begin(a, &m->scopes[m->depth++]));
        n_ops[2]++;
      }
    } else if (op < 91) {
      if (m->depth) {
        if (m->depth > 1 && rnd(4) == 0) { /* out of order: refused, nothing changes */
          gg_assert_fails(gg_scope_end(&m->scopes[rnd((unsigned)m->depth - 1)]), GG_ESTATE, "reverse order");
        }
        for (int i = m->n - 1; i >= 0; i--)
          if (m->b[i].depth == m->depth) model_remove(m, i, rnd(8) == 0);
        gg_assert_ok(gg_scope_end(&m->scopes[--m->depth]));
        gg_assert_fails(gg_scope_end(&m->scopes[m->depth]), GG_ESTATE, "ended already");
        n_ops[3]++;
      }
    } else if (op < 94) {
      size_t keep = rnd(2) ? 0 : (size_t)rnd(16) * MiB;
      int rc = gg_arena_trim(a, keep);
      if (rc != 0 && !(held && rc == GG_ETIMEDOUT)) fail_msg("trim: %s", gg_last_error());
      if (rc == 0 && keep == 0) { /* nothing wholly free stays mapped */
        gg_arena_stats_t s;
        gg_assert_ok(gg_arena_stats(a, &s));
        /* Every chunk left holds part of a live block; a block touches at most size/64K + 2 chunks. */
        unsigned long long touched = 0;
        for (int i = 0; i < m->n; i++) touched += rounded(m->b[i].size) / (64 * KiB) + 2;
        assert_true(s.n_chunks <= touched);
        assert_int_equal(s.bytes_pending, 0);
      }
      n_ops[4]++;
    } else if (op < 97) {
      if (!(flags & GG_ARENA_NO_STREAM)) {
        held = !held;
        gg_assert_ok(held ? gg_host_stream_hold(stream) : gg_host_stream_release(stream));
        n_ops[5]++;
      }
    } else {
      if (m->n) { /* bad input in the middle of it all changes nothing */
        mblock_t *b = &m->b[rnd((unsigned)m->n)];
        if (b->size > 256) gg_assert_fails(gg_free(a, b->ptr + 256), GG_EINVAL, "middle");
        n_ops[6]++;
      }
    }
    check_stats(a, m, cap);
    if (step % 64 == 0)
      for (int i = 0; i < m->n; i++) verify_block(&m->b[i]);
  }
  for (int i = 0; i < m->n; i++) verify_block(&m->b[i]);
  gg_arena_stats_t s;
  gg_assert_ok(gg_arena_stats(a, &s));
  printf("  allocs %llu, frees %llu, scope begins %llu, ends %llu, trims %llu, holds %llu, bad frees %llu; "
         "peak in use %zu, peak mapped %zu, fragmentation now %.3f\n",
         n_ops[0], n_ops[1], n_ops[2], n_ops[3], n_ops[4], n_ops[5], n_ops[6], s.peak_in_use, s.peak_mapped,
         s.fragmentation);
  if (held) gg_assert_ok(gg_host_stream_release(stream));
  while (m->depth) gg_assert_ok(gg_scope_end(&m->scopes[--m->depth]));
  gg_assert_ok(gg_arena_destroy(a));
  gg_host_stream_destroy(stream);
  free(m);
}

static unsigned long long seed_from_env(unsigned long long dflt) {
  const char *v = getenv("GG_TEST_SEED");
  return v && *v ? strtoull(v, NULL, 0) : dflt;
}

static int ops_count(void) {
  const char *v = getenv("GG_TEST_OPS");
  return v && *v ? atoi(v) : 6000;
}

static int setup(void **state) {
  (void)state;
  setenv("GPUGUARD_BACKEND", "host", 1);
  setenv("GPUGUARD_HOST_CAPACITY", "64M", 1);
  setenv("GPUGUARD_HOST_GRANULARITY", "64K", 1);
  unsetenv("GPUGUARD_HOST_FAULT");
  return 0;
}

static void test_vmm_stream(void **state) {
  (void)state;
  run_model("vmm, stream tracked", true, 0, seed_from_env(20240601), ops_count());
}
static void test_vmm_no_stream(void **state) {
  (void)state;
  run_model("vmm, no stream", true, GG_ARENA_NO_STREAM, seed_from_env(7), ops_count());
}
static void test_novmm_stream(void **state) {
  (void)state;
  run_model("no vmm, stream tracked", false, 0, seed_from_env(99), ops_count());
}
static void test_novmm_no_stream(void **state) {
  (void)state;
  run_model("no vmm, no stream", false, GG_ARENA_NO_STREAM, seed_from_env(31337), ops_count());
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_vmm_stream, setup),
      cmocka_unit_test_setup(test_vmm_no_stream, setup),
      cmocka_unit_test_setup(test_novmm_stream, setup),
      cmocka_unit_test_setup(test_novmm_no_stream, setup),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
