/* test_backend_select.c — choosing a backend from options and GPUGUARD_BACKEND; the cuda backend
 * without a driver; the fork generation that keeps a child off its parent's device state. */
#include <sys/wait.h>
#include <unistd.h>

#include "backend/backend.h"
#include "gg_test.h"
#include "core/internal.h"

static int reset_env(void **state) {
  (void)state;
  unsetenv("GPUGUARD_BACKEND");
  return 0;
}

static void test_explicit_option_wins(void **state) {
  (void)state;
  const char *b = NULL;
  setenv("GPUGUARD_BACKEND", "cuda", 1);
  gg_assert_ok(gg__backend_resolve("host", 0, &b));
  assert_string_equal(b, "host");
  setenv("GPUGUARD_BACKEND", "host", 1);
  gg_assert_ok(gg__backend_resolve(NULL, 0, &b));
  assert_string_equal(b, "host");
  gg_assert_ok(gg__backend_resolve("", 0, &b)); /* empty option: the environment decides */
  assert_string_equal(b, "host");
}

static void test_auto_follows_the_driver(void **state) {
  (void)state;
  const char *b = NULL;
  gg_clear_error();
  gg_assert_ok(gg__backend_resolve("auto", 0, &b));
  assert_string_equal(b, gg__cuda_probe() == 0 ? "cuda" : "host");
  /* auto's probe of the driver is not the caller's failure: the detail stays as it was. */
  gg__err(GG_EPERM, "earlier");
  gg_assert_ok(gg__backend_resolve("auto", 0, &b));
  assert_string_equal(gg_last_error(), "GG_EPERM: earlier");
  /* A device the driver does not have falls back to host under auto. */
  gg_assert_ok(gg__backend_resolve("auto", 4096, &b));
  assert_string_equal(b, "host");
}

static void test_garbage_is_einval(void **state) {
  (void)state;
  const char *b = "unchanged";
  setenv("GPUGUARD_BACKEND", "rocm", 1);
  gg_assert_fails(gg__backend_resolve(NULL, 0, &b), GG_EINVAL, "GPUGUARD_BACKEND='rocm'");
  gg_assert_fails(gg__backend_resolve("CUDA ", 0, &b), GG_EINVAL, "options.backend='CUDA '");
  assert_string_equal(b, "unchanged");
  int n;
  gg_assert_fails(gg_device_count(&n), GG_EINVAL, "expected auto, cuda or host");
  gg_device_info_t info;
  gg_assert_fails(gg_device_info(0, &info), GG_EINVAL, "GPUGUARD_BACKEND='rocm'");
}

static void test_forced_cuda_without_device(void **state) {
  (void)state;
  if (gg__cuda_probe() == 0) {
    printf("note: a CUDA device is present; the no-device branch is exercised on machines without "
           "one\n");
    skip();
  }
  setenv("GPUGUARD_BACKEND", "cuda", 1);
  int n = 7;
  gg_assert_fails(gg_device_count(&n), GG_ENODEV, "cuda backend: ");
  /* The message says which: no driver library, or a driver without devices. */
  assert_true(strstr(gg_last_error(), "libcuda.so.1") || strstr(gg_last_error(), "no CUDA device"));
  gg__dev_t *d = NULL;
  gg_assert_fails(gg__dev_open(NULL, 0, &d), GG_ENODEV, "cuda backend");
  assert_null(d);
  gg_device_info_t info;
  gg_assert_fails(gg_device_info(0, &info), GG_ENODEV, "cuda backend");
}

static void test_host_device_info(void **state) {
  (void)state;
  setenv("GPUGUARD_BACKEND", "host", 1);
  setenv("GPUGUARD_HOST_CAPACITY", "256M", 1);
  int n = 0;
  gg_assert_ok(gg_device_count(&n));
  assert_int_equal(n, 1);
  gg_device_info_t info;
  gg_assert_ok(gg_device_info(0, &info));
  assert_string_equal(info.backend, "host");
  assert_int_equal(info.total_bytes, 256u << 20);
  assert_int_equal(info.free_bytes, 256u << 20);
  assert_int_equal(info.used_bytes, 0);
  assert_int_equal(info.vmm_supported, 1);
  gg_assert_fails(gg_device_info(1, &info), GG_ENODEV, "device 1 does not exist");
  gg_assert_fails(gg_device_info(0, NULL), GG_EINVAL, "info is NULL");
  gg_assert_fails(gg_device_count(NULL), GG_EINVAL, "count is NULL");
  unsetenv("GPUGUARD_HOST_CAPACITY");
}

static void test_fork_generation(void **state) {
  (void)state;
  unsigned gen = gg__fork_generation();
  gg_assert_ok(gg__check_fork(gen, "parent"));
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    /* In the child, an object made by the parent is refused with a message saying what to do. */
    int rc = gg__check_fork(gen, "gg_alloc");
    bool ok = rc == GG_ESTATE &&
              strstr(gg_last_error(), "create a new guard or arena in the child") &&
              gg__check_fork(gg__fork_generation(), "new") == 0;
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  gg_assert_ok(gg__check_fork(gen, "parent after fork"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_explicit_option_wins, reset_env, reset_env),
      cmocka_unit_test_setup_teardown(test_auto_follows_the_driver, reset_env, reset_env),
      cmocka_unit_test_setup_teardown(test_garbage_is_einval, reset_env, reset_env),
      cmocka_unit_test_setup_teardown(test_forced_cuda_without_device, reset_env, reset_env),
      cmocka_unit_test_setup_teardown(test_host_device_info, reset_env, reset_env),
      cmocka_unit_test(test_fork_generation),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
