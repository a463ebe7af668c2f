/* gg_test.h — what every CMocka suite of gpuguard shares: includes, checks on status codes and
 * messages, and the skip rule for tests that need a CUDA device. */
#ifndef GG_TEST_H
#define GG_TEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
/* cmocka.h needs the four above first. */
#include <cmocka.h>

#include "gpuguard/gpuguard.h"

/* Asserts a call returned `code` and that this thread's detail message contains `needle`. */
#define gg_assert_fails(call, code, needle)                                         \
  do {                                                                              \
    int gg_t_rc = (call);                                                           \
    if (gg_t_rc != (code) || !strstr(gg_last_error(), (needle)))                    \
      fail_msg("%s: got %s, wanted %s; message '%s' should contain '%s'", #call,    \
               gg_err_name(gg_t_rc), gg_err_name(code), gg_last_error(), (needle)); \
  } while (0)

/* Asserts a call succeeded, printing the library's detail message when it did not. */
#define gg_assert_ok(call)                                                                   \
  do {                                                                                       \
    int gg_t_rc = (call);                                                                    \
    if (gg_t_rc != 0) fail_msg("%s: %s (%s)", #call, gg_err_name(gg_t_rc), gg_last_error()); \
  } while (0)

/* The shared fixture of the suites that run on the host backend: a simulated device of `capacity`
 * (GPUGUARD_HOST_CAPACITY; NULL: the backend's default), allocation granularity `granularity`
 * (NULL: the backend's default), and nothing left of an earlier test's settings: no VMM or
 * range-unmap switch, no injected fault. */
static inline void gg_test_use_host(const char *capacity, const char *granularity) {
  setenv("GPUGUARD_BACKEND", "host", 1);
  if (capacity) {
    setenv("GPUGUARD_HOST_CAPACITY", capacity, 1);
  } else {
    unsetenv("GPUGUARD_HOST_CAPACITY");
  }
  if (granularity) {
    setenv("GPUGUARD_HOST_GRANULARITY", granularity, 1);
  } else {
    unsetenv("GPUGUARD_HOST_GRANULARITY");
  }
  unsetenv("GPUGUARD_HOST_VMM");
  unsetenv("GPUGUARD_HOST_FAULT");
  unsetenv("GPUGUARD_HOST_RANGE_UNMAP");
  gg_host_fault_set(NULL);
}

/* Exit code CTest reads as "skipped" (SKIP_RETURN_CODE). */
#define GG_TEST_SKIP 77

/* For test_gpu_* programs: ends the program as skipped, saying why, when there is no CUDA device.
 * */
int gg__cuda_probe(void);
static inline void gg_test_require_cuda(void) {
  if (gg__cuda_probe() != 0) {
    printf("SKIP: this test needs a CUDA device and found none: %s\n", gg_last_error());
    exit(GG_TEST_SKIP);
  }
}

#endif
