/* test_error.c — the error model: codes, names, texts, the thread-local detail, the version. */
#include <pthread.h>

#include "gg_test.h"
#include "core/internal.h"

static void test_every_code_has_name_and_text(void **state) {
  (void)state;
  static const int codes[] = {GG_OK,        GG_EINVAL,  GG_ENOMEM, GG_ENODEV,
                              GG_EDRIVER,   GG_ESTATE,  GG_EPERM,  GG_ENOTFOUND,
                              GG_ETIMEDOUT, GG_ENOTSUP, GG_EIO};
  for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
    assert_int_equal(codes[i], -(int)i); /* the contract's values */
    assert_non_null(gg_strerror(codes[i]));
    assert_string_not_equal(gg_strerror(codes[i]), "unknown error");
    assert_true(strncmp(gg_err_name(codes[i]), "GG_", 3) == 0);
    for (size_t j = 0; j < i; j++)
      assert_string_not_equal(gg_err_name(codes[i]), gg_err_name(codes[j]));
  }
  assert_string_equal(gg_err_name(GG_EINVAL), "GG_EINVAL");
  assert_string_equal(gg_err_name(GG_ENOMEM), "GG_ENOMEM");
  assert_string_equal(gg_strerror(GG_EINVAL), "invalid argument");
}

static void test_unknown_codes_never_null(void **state) {
  (void)state;
  int odd[] = {-11, -1000, 1, 42, -2147483647 - 1, 2147483647};
  for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
    assert_string_equal(gg_strerror(odd[i]), "unknown error");
    assert_string_equal(gg_err_name(odd[i]), "GG_UNKNOWN");
  }
}

static void test_detail_message(void **state) {
  (void)state;
  gg_clear_error();
  assert_string_equal(gg_last_error(), "");
  assert_int_equal(gg_last_driver_error(), 0);
  assert_int_equal(gg__err(GG_EINVAL, "call %s: argument %d", "f", 2), GG_EINVAL);
  assert_string_equal(gg_last_error(), "GG_EINVAL: call f: argument 2");
  assert_int_equal(gg__err_driver(GG_EDRIVER, 700, "cuX failed"), GG_EDRIVER);
  assert_int_equal(gg_last_driver_error(), 700);
  /* A successful call leaves the last failure in place (like errno). */
  int n;
  setenv("GPUGUARD_BACKEND", "host", 1);
  assert_int_equal(gg_device_count(&n), 0);
  assert_string_equal(gg_last_error(), "GG_EDRIVER: cuX failed");
  /* Overlong details are cut, never overflow. */
  char big[4096];
  memset(big, 'x', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  gg__err(GG_EIO, "%s", big);
  assert_true(strlen(gg_last_error()) < 1024);
  assert_true(strncmp(gg_last_error(), "GG_EIO: xxx", 11) == 0);
  gg_clear_error();
}

static void *other_thread(void *arg) {
  (void)arg;
  /* Each thread has its own slot: the main thread's message is not visible here. */
  char *seen = strdup(gg_last_error());
  gg__err(GG_ENOTFOUND, "from the other thread");
  return seen;
}

static void test_detail_is_thread_local(void **state) {
  (void)state;
  gg__err(GG_EPERM, "from the main thread");
  pthread_t t;
  void *seen = NULL;
  assert_int_equal(pthread_create(&t, NULL, other_thread, NULL), 0);
  pthread_join(t, &seen);
  assert_string_equal((char *)seen, "");
  free(seen);
  assert_string_equal(gg_last_error(), "GG_EPERM: from the main thread");
}

/* Quiet regions put back the detail (and driver status) their start saw, however deeply they nest
 * and wherever inside them something failed; a region where nothing failed leaves the detail alone.
 * */
static void test_quiet_regions(void **state) {
  (void)state;
  gg__err_driver(GG_EDRIVER, 7, "before");
  gg__err_quiet_t outer, inner;
  gg__err_quiet_begin(&outer);
  gg__err_quiet_begin(&inner);
  gg__err(GG_EINVAL, "inside the inner region");
  gg__err_quiet_end(&inner);
  assert_non_null(strstr(gg_last_error(), "before"));
  gg__err(GG_ENOMEM, "inside the outer region, after the inner one");
  gg__err_quiet_begin(&inner);
  gg__err(GG_EINVAL, "inner again");
  gg__err_quiet_end(&inner);
  assert_non_null(strstr(gg_last_error(), "after the inner one"));
  gg__err_quiet_end(&outer);
  assert_non_null(strstr(gg_last_error(), "before"));
  assert_int_equal(gg_last_driver_error(), 7);
  gg__err_quiet_begin(&outer);
  gg__err_quiet_end(&outer);
  assert_non_null(strstr(gg_last_error(), "before"));
}

static void test_version(void **state) {
  (void)state;
  char want[64];
  snprintf(want, sizeof want, "%d.%d.%d", GG_VERSION_MAJOR, GG_VERSION_MINOR, GG_VERSION_PATCH);
  assert_string_equal(gg_version(), want);
  assert_string_equal(gg_version(), GG_VERSION_STRING);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_code_has_name_and_text),
      cmocka_unit_test(test_unknown_codes_never_null),
      cmocka_unit_test(test_detail_message),
      cmocka_unit_test(test_detail_is_thread_local),
      cmocka_unit_test(test_quiet_regions),
      cmocka_unit_test(test_version),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
