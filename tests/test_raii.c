/* test_raii.c — the C cleanup macros of gpuguard/scope.h with guards: gg_auto runs the teardown on
 * every way out of a block (fall-through, return, goto, break) and GG_TAKE_PTR hands ownership out.
 * */
#include "gg_test.h"
#include "gpuguard/scope.h"

static int runs;
static void count(void *user) { (void)user, runs++; }

static gg_guard_t *make(void) {
  gg_guard_options_t o;
  gg_guard_options_init(&o);
  o.signals = 0, o.run_at_exit = false;
  gg_guard_t *g = NULL;
  gg_assert_ok(gg_guard_create(&g, &o));
  gg_assert_ok(gg_guard_on_teardown(g, count, NULL, "count"));
  return g;
}

static int early_return(int fail) {
  gg_auto(gg_guard_destroy) gg_guard_t *g = make();
  if (fail) return -1; /* destroyed here */
  return 0;            /* and here */
}

static gg_guard_t *handed_out(void) {
  gg_auto(gg_guard_destroy) gg_guard_t *g = make();
  return GG_TAKE_PTR(g); /* not destroyed: the caller owns it */
}

static void test_auto_guard(void **state) {
  (void)state;
  setenv("GPUGUARD_BACKEND", "host", 1);
  runs = 0;
  {
    gg_auto(gg_guard_destroy) gg_guard_t *g = make();
    assert_non_null(g);
  }
  assert_int_equal(runs, 1);
  assert_int_equal(early_return(1), -1);
  assert_int_equal(early_return(0), 0);
  assert_int_equal(runs, 3);
  for (int i = 0; i < 3; i++) {
    gg_auto(gg_guard_destroy) gg_guard_t *g = make();
    (void)g;
    if (i == 1) break;
  }
  assert_int_equal(runs, 5);
  {
    gg_auto(gg_guard_destroy) gg_guard_t *g = make();
    (void)g;
    goto out;
  }
out:
  assert_int_equal(runs, 6);
  gg_guard_t *mine = handed_out();
  assert_int_equal(runs, 6);
  gg_assert_ok(gg_guard_destroy(mine));
  assert_int_equal(runs, 7);
  {
    gg_auto(gg_guard_destroy) gg_guard_t *none = NULL; /* NULL: nothing to do */
    (void)none;
  }
  assert_int_equal(runs, 7);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_auto_guard)};
  return cmocka_run_group_tests_name("raii", tests, NULL, NULL);
}
