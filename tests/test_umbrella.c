/* test_umbrella.c — the umbrella header alone is enough for the C scope macros: GG_SCOPE, gg_auto
 * and GG_TAKE_PTR compile and work with only gpuguard/gpuguard.h included (GCC and Clang). */
#include "gg_test.h" /* includes gpuguard/gpuguard.h and nothing else of gpuguard */

static gg_arena_t *make_arena(void) {
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.backend = "host";
  o.capacity = 16u << 20;
  gg_auto(gg_arena_destroy) gg_arena_t *a = NULL;
  gg_assert_ok(gg_arena_create(&a, &o));
  return GG_TAKE_PTR(a);
}

static void test_scope_from_umbrella(void **state) {
  (void)state;
  gg_auto(gg_arena_destroy) gg_arena_t *a = make_arena();
  gg_arena_stats_t st;
  GG_SCOPE(a) {
    void *p = NULL;
    gg_assert_ok(gg_alloc(a, 4096, &p));
    gg_assert_ok(gg_arena_stats(a, &st));
    assert_int_equal(st.n_live, 1);
    assert_int_equal(st.scope_depth, 1);
  }
  gg_assert_ok(gg_arena_stats(a, &st));
  assert_int_equal(st.n_live, 0); /* the scope released it */
  assert_int_equal(st.scope_depth, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_scope_from_umbrella)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
