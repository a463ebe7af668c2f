/* test_options.c — parsing of sizes, booleans and integers from the environment and options. */
#include "gg_test.h"
#include "core/internal.h"

static void test_sizes(void **state) {
  (void)state;
  size_t v = 0;
  gg_assert_ok(gg__parse_size("X", "0", &v));
  assert_int_equal(v, 0);
  gg_assert_ok(gg__parse_size("X", "4096", &v));
  assert_int_equal(v, 4096);
  gg_assert_ok(gg__parse_size("X", "64K", &v));
  assert_int_equal(v, 64u << 10);
  gg_assert_ok(gg__parse_size("X", "3m", &v));
  assert_int_equal(v, 3u << 20);
  gg_assert_ok(gg__parse_size("X", "2GiB", &v));
  assert_int_equal(v, 2ull << 30);
  gg_assert_ok(gg__parse_size("X", "1T", &v));
  assert_int_equal(v, 1ull << 40);
  gg_assert_ok(gg__parse_size("X", " 8MB ", &v));
  assert_int_equal(v, 8u << 20);
}

static void test_bad_sizes(void **state) {
  (void)state;
  size_t v = 12345;
  gg_assert_fails(gg__parse_size("GPUGUARD_HOST_CAPACITY", "lots", &v), GG_EINVAL,
                  "GPUGUARD_HOST_CAPACITY='lots'");
  gg_assert_fails(gg__parse_size("X", "-1", &v), GG_EINVAL, "not a size");
  gg_assert_fails(gg__parse_size("X", "12Q", &v), GG_EINVAL, "trailing");
  gg_assert_fails(gg__parse_size("X", "99999999999999999999999", &v), GG_EINVAL, "too large");
  gg_assert_fails(gg__parse_size("X", "17179869184G", &v), GG_EINVAL, "too large");
  gg_assert_fails(gg__parse_size("X", "", &v), GG_EINVAL, "not a size");
  gg_assert_fails(gg__parse_size("X", NULL, &v), GG_EINVAL, "no value");
  assert_int_equal(v, 12345); /* untouched on failure */
}

static void test_bools(void **state) {
  (void)state;
  const char *yes[] = {"1", "on", "YES", "true"}, *no[] = {"0", "Off", "no", "FALSE"};
  for (int i = 0; i < 4; i++) {
    bool b = false;
    gg_assert_ok(gg__parse_bool("X", yes[i], &b));
    assert_true(b);
    gg_assert_ok(gg__parse_bool("X", no[i], &b));
    assert_false(b);
  }
  bool b = true;
  gg_assert_fails(gg__parse_bool("GPUGUARD_HOST_VMM", "maybe", &b), GG_EINVAL,
                  "GPUGUARD_HOST_VMM='maybe'");
  gg_assert_fails(gg__parse_bool("X", NULL, &b), GG_EINVAL, "(null)");
  assert_true(b);
}

static void test_ints(void **state) {
  (void)state;
  long v = 0;
  gg_assert_ok(gg__parse_int("X", "-5", -10, 10, &v));
  assert_int_equal(v, -5);
  gg_assert_fails(gg__parse_int("X", "11", -10, 10, &v), GG_EINVAL, "must be in -10..10");
  gg_assert_fails(gg__parse_int("X", "3x", 0, 10, &v), GG_EINVAL, "not an integer");
  gg_assert_fails(gg__parse_int("X", "", 0, 10, &v), GG_EINVAL, "no value");
  gg_assert_fails(gg__parse_int("X", "99999999999999999999", 0, 10, &v), GG_EINVAL,
                  "not an integer");
}

static void test_env_empty_is_unset(void **state) {
  (void)state;
  setenv("GG_TEST_VAR", "", 1);
  assert_null(gg__env("GG_TEST_VAR"));
  setenv("GG_TEST_VAR", "v", 1);
  assert_string_equal(gg__env("GG_TEST_VAR"), "v");
  unsetenv("GG_TEST_VAR");
  assert_null(gg__env("GG_TEST_VAR"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sizes),
      cmocka_unit_test(test_bad_sizes),
      cmocka_unit_test(test_bools),
      cmocka_unit_test(test_ints),
      cmocka_unit_test(test_env_empty_is_unset),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
