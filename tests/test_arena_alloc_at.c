/* test_arena_alloc_at.c — gg_alloc_at: a block at a given address of the arena's mapped memory (a
 * checkpoint restored: the blocks live then, back where they were), on the host backend; and every
 * bad input refused with the arena unchanged and its check passing. */
#include <string.h>

#include "arena/arena_internal.h"
#include "gg_test.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static gg_arena_t *mk(unsigned flags) {
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.backend = "host";
  o.capacity = 16 * MiB;
  o.chunk_size = 2 * MiB;
  o.flags = flags;
  o.name = "placed";
  gg_arena_t *a = NULL;
  gg_assert_ok(gg_arena_create(&a, &o));
  return a;
}

static size_t live_of(gg_arena_t *a) {
  gg_arena_stats_t s;
  gg_assert_ok(gg_arena_stats(a, &s));
  return (size_t)s.n_live;
}

/* Three blocks, a checkpoint, the state changed, then restored: the checkpoint's blocks come back
 * at their addresses, inside free memory split around them, and are freed as any other. */
static void test_blocks_come_back_at_their_addresses(unsigned flags) {
  gg_arena_t *a = mk(flags);
  void *p[3] = {NULL, NULL, NULL};
  for (int i = 0; i < 3; i++) gg_assert_ok(gg_alloc(a, 100 * KiB, &p[i]));
  for (int i = 0; i < 3; i++) gg_assert_ok(gg_free(a, p[i]));
  void *other = NULL;
  gg_assert_ok(gg_alloc(a, 700 * KiB, &other)); /* the state moves on */
  gg_assert_ok(gg_free(a, other));
  gg_assert_ok(gg_alloc_at(a, p[1], 100 * KiB)); /* the middle one first: the free block splits */
  gg_assert_ok(gg_alloc_at(a, p[0], 100 * KiB));
  gg_assert_ok(gg_alloc_at(a, p[2], 100 * KiB - 100)); /* rounded up as gg_alloc rounds */
  assert_int_equal(live_of(a), 3);
  gg_assert_ok(gg__arena_check(a));
  gg_assert_fails(gg_alloc_at(a, p[1], 256), GG_ESTATE, "not free"); /* live already */
  void *q = NULL;
  gg_assert_ok(gg_alloc(a, 100 * KiB, &q)); /* elsewhere */
  assert_true((char *)q >= (char *)p[2] + 100 * KiB || (char *)q + 100 * KiB <= (char *)p[0]);
  for (int i = 0; i < 3; i++) gg_assert_ok(gg_free(a, p[i]));
  gg_assert_ok(gg_free(a, q));
  assert_int_equal(live_of(a), 0);
  gg_assert_ok(gg__arena_check(a));
  gg_assert_ok(gg_arena_destroy(a));
}

static void test_restore_no_stream(void **state) {
  (void)state;
  test_blocks_come_back_at_their_addresses(GG_ARENA_NO_STREAM);
}

static void test_restore_stream_ordered_keeping_holes(void **state) {
  (void)state;
  test_blocks_come_back_at_their_addresses(GG_ARENA_KEEP_HOLES);
}

/* A range in the bump block (top) and one across two former blocks that merged when freed. */
static void test_top_and_merged_ranges(void **state) {
  (void)state;
  gg_arena_t *a = mk(GG_ARENA_NO_STREAM);
  void *x = NULL;
  void *y = NULL;
  gg_assert_ok(gg_alloc(a, 64 * KiB, &x));
  gg_assert_ok(gg_alloc(a, 64 * KiB, &y));
  gg_assert_ok(gg_free(a, x));
  gg_assert_ok(gg_free(a, y));
  gg_assert_ok(gg_alloc_at(a, x, 128 * KiB)); /* both, as one block */
  gg_assert_ok(gg__arena_check(a));
  gg_assert_ok(gg_alloc_at(a, (char *)x + 512 * KiB, 4 * KiB)); /* free memory past them */
  gg_assert_ok(gg__arena_check(a));
  gg_assert_ok(gg_free(a, x));
  gg_assert_ok(gg_free(a, (char *)x + 512 * KiB));
  assert_int_equal(live_of(a), 0);
  gg_assert_ok(gg__arena_check(a));
  gg_assert_ok(gg_arena_destroy(a));
}

/* Bad input: each refused with its reason, nothing changed, the check passing. */
static void test_bad_input_is_refused(void **state) {
  (void)state;
  gg_arena_t *a = mk(GG_ARENA_NO_STREAM);
  void *pad = NULL;
  void *p = NULL;
  gg_assert_ok(gg_alloc(a, 64 * KiB, &pad)); /* at the arena's base */
  gg_assert_ok(gg_alloc(a, 64 * KiB, &p));
  gg_assert_ok(gg_free(a, pad));
  gg_arena_stats_t before;
  gg_assert_ok(gg_arena_stats(a, &before));
  gg_assert_fails(gg_alloc_at(NULL, p, 256), GG_EINVAL, "");
  gg_assert_fails(gg_alloc_at(a, NULL, 256), GG_EINVAL, "NULL");
  gg_assert_fails(gg_alloc_at(a, (char *)p + 64 * KiB, 0), GG_EINVAL, "size is 0");
  gg_assert_fails(gg_alloc_at(a, (char *)p + 64 * KiB + 8, 256), GG_EINVAL, "multiple of 256");
  gg_assert_fails(gg_alloc_at(a, (void *)(UINTPTR_MAX - 255), 512), GG_EINVAL, "overflow");
  gg_assert_fails(gg_alloc_at(a, p, 256), GG_ESTATE, "not free");                   /* live */
  gg_assert_fails(gg_alloc_at(a, (char *)p + 4 * KiB, 256), GG_ESTATE, "not free"); /* inside */
  gg_assert_fails(gg_alloc_at(a, (char *)p - 256, 512), GG_ESTATE, "not free"); /* overlapping */
  gg_arena_stats_t s;
  gg_assert_ok(gg_arena_stats(a, &s));
  uintptr_t end = (uintptr_t)pad + s.bytes_mapped; /* the host arena maps from its base upward */
  gg_assert_fails(gg_alloc_at(a, (void *)(end + 4 * MiB), 256), GG_EINVAL, "not inside");
  gg_assert_fails(gg_alloc_at(a, (void *)(end - 256), 4 * MiB), GG_EINVAL, "not inside");
  gg_assert_fails(gg_alloc_at(a, (char *)pad - 4 * KiB, 256), GG_EINVAL, "not inside");
  gg_assert_ok(gg__arena_check(a));
  gg_arena_stats_t after;
  gg_assert_ok(gg_arena_stats(a, &after));
  assert_int_equal(after.n_live, before.n_live);
  assert_int_equal(after.bytes_in_use, before.bytes_in_use);
  assert_int_equal(after.n_allocs, before.n_allocs);
  gg_assert_ok(gg_free(a, p));
  gg_assert_ok(gg_arena_destroy(a));
}

int main(void) {
  setenv("GPUGUARD_HOST_POPULATE", "0", 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_restore_no_stream),
      cmocka_unit_test(test_restore_stream_ordered_keeping_holes),
      cmocka_unit_test(test_top_and_merged_ranges),
      cmocka_unit_test(test_bad_input_is_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
