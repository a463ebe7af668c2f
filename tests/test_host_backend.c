/* test_host_backend.c — the simulated device: reserve, map, copy, unmap with real resident memory,
 * capacity, a device without VMM, simulated streams, and deterministic fault injection. */
#include <unistd.h>

#include "backend/backend.h"
#include "gg_test.h"
#include "core/internal.h"

#define MiB (1u << 20)

static size_t resident_bytes(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  unsigned long size = 0, res = 0;
  if (f) {
    if (fscanf(f, "%lu %lu", &size, &res) != 2) res = 0;
    fclose(f);
  }
  return (size_t)res * (size_t)sysconf(_SC_PAGESIZE);
}

static int setup(void **state) {
  (void)state;
  gg_test_use_host("64M", NULL);
  return 0;
}

static gg__dev_t *open_host(void) {
  gg__dev_t *d = NULL;
  gg_assert_ok(gg__dev_open("host", 0, &d));
  assert_non_null(d);
  assert_string_equal(d->ops->name, "host");
  return d;
}

static void test_map_write_read_unmap(void **state) {
  (void)state;
  gg__dev_t *d = open_host();
  assert_int_equal(d->granularity, 2 * MiB);
  assert_true(d->contiguous);
  uintptr_t base = 0;
  gg_assert_ok(d->ops->va_reserve(d, 16 * MiB, &base));
  assert_int_equal(base % d->granularity, 0);

  size_t free0, total;
  gg_assert_ok(d->ops->mem_info(d, &free0, &total));
  assert_int_equal(total, 64 * MiB);
  size_t rss0 = resident_bytes();

  gg__chunk_t c;
  gg_assert_ok(d->ops->map(d, base + 2 * MiB, 8 * MiB, &c));
  assert_int_equal(c.ptr, base + 2 * MiB);
  assert_int_equal(c.size, 8 * MiB);
  size_t free1;
  gg_assert_ok(d->ops->mem_info(d, &free1, &total));
  assert_int_equal(free0 - free1, 8 * MiB);
  /* The memory is committed at map time: resident memory grows by (nearly) all of it. */
  assert_true(resident_bytes() >= rss0 + 7 * MiB);

  /* Write a pattern through the device API and read it back both ways. */
  unsigned char *pattern = malloc(8 * MiB), *back = malloc(8 * MiB);
  for (size_t i = 0; i < 8 * MiB; i++) pattern[i] = (unsigned char)(i * 131u + 7u);
  gg_assert_ok(d->ops->copy_to_dev(d, c.ptr, pattern, 8 * MiB));
  gg_assert_ok(d->ops->copy_from_dev(d, back, c.ptr, 8 * MiB));
  assert_memory_equal(pattern, back, 8 * MiB);
  assert_int_equal(((unsigned char *)c.ptr)[12345], pattern[12345]); /* host pointers are real */
  gg_assert_ok(d->ops->set_d8(d, c.ptr + 100, 0xAB, 1000));
  gg_assert_ok(d->ops->copy_from_dev(d, back, c.ptr, 2000));
  assert_int_equal(back[99], pattern[99]);
  assert_int_equal(back[100], 0xAB);
  assert_int_equal(back[1099], 0xAB);
  assert_int_equal(back[1100], pattern[1100]);

  /* Copies that touch unmapped memory are refused, as a device would. */
  gg_assert_fails(d->ops->copy_to_dev(d, base, pattern, 16), GG_EINVAL, "unmapped device memory");
  gg_assert_fails(d->ops->copy_from_dev(d, back, c.ptr + 8 * MiB - 8, 16), GG_EINVAL, "unmapped");
  gg_assert_fails(d->ops->set_d8(d, UINTPTR_MAX - 4, 0, 16), GG_EINVAL, "wraps");

  size_t rss1 = resident_bytes();
  gg_assert_ok(d->ops->unmap(d, &c));
  /* Decommitted: the pages go back to the kernel and the device's free memory is back. */
  assert_true(resident_bytes() + 7 * MiB <= rss1);
  size_t free2;
  gg_assert_ok(d->ops->mem_info(d, &free2, &total));
  assert_int_equal(free2, free0);
  gg_assert_fails(d->ops->copy_from_dev(d, back, c.ptr, 16), GG_EINVAL, "unmapped");
  gg_assert_fails(d->ops->unmap(d, &c), GG_EINVAL, "no such mapping");

  gg_assert_ok(d->ops->va_release(d, base, 16 * MiB));
  free(pattern);
  free(back);
  gg__dev_close(d);
}

static void test_bad_sizes_and_alignment(void **state) {
  (void)state;
  gg__dev_t *d = open_host();
  uintptr_t base = 0;
  gg_assert_fails(d->ops->va_reserve(d, 0, &base), GG_EINVAL, "not a multiple");
  gg_assert_fails(d->ops->va_reserve(d, MiB, &base), GG_EINVAL, "not a multiple");
  gg_assert_fails(d->ops->va_reserve(d, SIZE_MAX & ~(size_t)(2 * MiB - 1), &base), GG_ENOMEM, "");
  gg_assert_ok(d->ops->va_reserve(d, 4 * MiB, &base));
  gg__chunk_t c;
  gg_assert_fails(d->ops->map(d, base + 4096, 2 * MiB, &c), GG_EINVAL, "not granule-aligned");
  gg_assert_fails(d->ops->map(d, base, 3 * MiB, &c), GG_EINVAL, "not granule-aligned");
  gg_assert_fails(d->ops->map(d, 0, 2 * MiB, &c), GG_EINVAL, "not granule-aligned");
  gg_assert_ok(d->ops->va_release(d, base, 4 * MiB));
  gg__dev_close(d);
}

static void test_capacity(void **state) {
  (void)state;
  setenv("GPUGUARD_HOST_CAPACITY", "8M", 1);
  gg__dev_t *d = open_host();
  uintptr_t base;
  gg_assert_ok(d->ops->va_reserve(d, 32 * MiB, &base)); /* address space is not capacity */
  gg__chunk_t a, b;
  gg_assert_ok(d->ops->map(d, base, 6 * MiB, &a));
  gg_assert_fails(d->ops->map(d, base + 6 * MiB, 4 * MiB, &b), GG_ENOMEM,
                  "6291456 of 8388608 in use");
  gg_assert_ok(d->ops->map(d, base + 6 * MiB, 2 * MiB, &b)); /* the failure took nothing */
  size_t f, t;
  gg_assert_ok(d->ops->mem_info(d, &f, &t));
  assert_int_equal(f, 0);
  /* Closing with memory still mapped gives it all back, as a context teardown does. */
  gg__dev_close(d);
  d = open_host();
  gg_assert_ok(d->ops->mem_info(d, &f, &t));
  assert_int_equal(f, 8 * MiB);
  gg__dev_close(d);
}

static void test_bad_environment(void **state) {
  (void)state;
  gg__dev_t *d = NULL;
  setenv("GPUGUARD_HOST_CAPACITY", "a lot", 1);
  gg_assert_fails(gg__dev_open("host", 0, &d), GG_EINVAL, "GPUGUARD_HOST_CAPACITY='a lot'");
  setenv("GPUGUARD_HOST_CAPACITY", "0", 1);
  gg_assert_fails(gg__dev_open("host", 0, &d), GG_EINVAL, "more than 0");
  setenv("GPUGUARD_HOST_CAPACITY", "64M", 1);
  setenv("GPUGUARD_HOST_GRANULARITY", "3000", 1);
  gg_assert_fails(gg__dev_open("host", 0, &d), GG_EINVAL, "power of two");
  unsetenv("GPUGUARD_HOST_GRANULARITY");
  setenv("GPUGUARD_HOST_VMM", "perhaps", 1);
  gg_assert_fails(gg__dev_open("host", 0, &d), GG_EINVAL, "GPUGUARD_HOST_VMM='perhaps'");
  unsetenv("GPUGUARD_HOST_VMM");
  setenv("GPUGUARD_HOST_FAULT", "map:x", 1);
  gg_assert_fails(gg__dev_open("host", 0, &d), GG_EINVAL, "GPUGUARD_HOST_FAULT='map:x'");
  unsetenv("GPUGUARD_HOST_FAULT");
  assert_null(d);
  gg_assert_fails(gg__dev_open("host", 1, &d), GG_ENODEV, "device 1 does not exist");
  d = open_host(); /* a failed open left nothing behind */
  gg__dev_close(d);
}

static void test_small_granularity_and_no_vmm(void **state) {
  (void)state;
  setenv("GPUGUARD_HOST_GRANULARITY", "64K", 1);
  setenv("GPUGUARD_HOST_VMM", "0", 1);
  gg__dev_t *d = open_host();
  assert_int_equal(d->granularity, 64u << 10);
  assert_false(d->contiguous);
  uintptr_t base = 1;
  gg_assert_ok(d->ops->va_reserve(d, 1 * MiB, &base));
  assert_int_equal(base, 0); /* without VMM there is no range to reserve */
  gg__chunk_t a, b;
  gg_assert_fails(d->ops->map(d, 4 * MiB, 64u << 10, &a), GG_EINVAL, "not granule-aligned");
  gg_assert_ok(d->ops->map(d, 0, 64u << 10, &a));
  gg_assert_ok(d->ops->map(d, 0, 128u << 10, &b));
  assert_true(a.ptr != b.ptr && a.ptr != 0 && b.ptr != 0);
  memset((void *)b.ptr, 1, b.size);
  gg_assert_ok(d->ops->unmap(d, &a));
  gg_assert_ok(d->ops->unmap(d, &b));
  gg_assert_ok(d->ops->va_release(d, 0, 1 * MiB));
  gg__dev_close(d);
}

static void test_fault_specs(void **state) {
  (void)state;
  gg_assert_fails(gg_host_fault_set("bogus:1"), GG_EINVAL, "'bogus:1' does not start with a known");
  gg_assert_fails(gg_host_fault_set("map"), GG_EINVAL, "known operation");
  gg_assert_fails(gg_host_fault_set("map:0"), GG_EINVAL, "call number >= 1");
  gg_assert_fails(gg_host_fault_set("map:1=oops"), GG_EINVAL, "=nomem");
  gg_assert_fails(gg_host_fault_set("map:1,,unmap:1"), GG_EINVAL, "empty");
  gg_assert_ok(gg_host_fault_set("map:2,unmap:1+,reserve:1=nomem"));
  gg_assert_ok(gg_host_fault_set(""));
  assert_int_equal(gg_host_op_count("no-such-op"), 0);
  assert_int_equal(gg_host_op_count(NULL), 0);
}

static void test_faults_are_deterministic(void **state) {
  (void)state;
  gg__dev_t *d = open_host();
  uintptr_t base;
  gg_assert_ok(d->ops->va_reserve(d, 16 * MiB, &base));
  gg_assert_ok(gg_host_fault_set("map:2,unmap:2+,copy:1=nomem"));
  gg__chunk_t c[4];
  size_t f0, f1, t;
  gg_assert_ok(d->ops->mem_info(d, &f0, &t));
  gg_assert_ok(d->ops->map(d, base, 2 * MiB, &c[0]));
  gg_assert_fails(d->ops->map(d, base + 2 * MiB, 2 * MiB, &c[1]), GG_EDRIVER,
                  "injected fault in 'map' (call 2)");
  gg_assert_ok(d->ops->mem_info(d, &f1, &t));
  assert_int_equal(f0 - f1, 2 * MiB);                           /* the failed map took nothing */
  gg_assert_ok(d->ops->map(d, base + 2 * MiB, 2 * MiB, &c[1])); /* once only */
  assert_int_equal(gg_host_op_count("map"), 3);
  char buf[8] = {0};
  gg_assert_fails(d->ops->copy_to_dev(d, c[0].ptr, buf, 8), GG_ENOMEM, "'copy' (call 1)");
  gg_assert_ok(d->ops->copy_to_dev(d, c[0].ptr, buf, 8));
  gg_assert_ok(d->ops->unmap(d, &c[0]));
  gg_assert_fails(d->ops->unmap(d, &c[1]), GG_EDRIVER, "'unmap' (call 2)");
  gg_assert_fails(d->ops->unmap(d, &c[1]), GG_EDRIVER, "'unmap' (call 3)"); /* sticky */
  gg_assert_ok(gg_host_fault_set(NULL));
  assert_int_equal(gg_host_op_count("unmap"), 0); /* counters reset with the spec */
  gg_assert_ok(d->ops->unmap(d, &c[1]));          /* nothing was lost by the failures */
  gg_assert_ok(d->ops->va_release(d, base, 16 * MiB));
  gg__dev_close(d);
}

static void test_fault_from_environment(void **state) {
  (void)state;
  setenv("GPUGUARD_HOST_FAULT", "reserve:1", 1);
  gg__dev_t *d = open_host();
  uintptr_t base;
  gg_assert_fails(d->ops->va_reserve(d, 2 * MiB, &base), GG_EDRIVER, "'reserve' (call 1)");
  gg_assert_ok(d->ops->va_reserve(d, 2 * MiB, &base));
  gg_assert_ok(d->ops->va_release(d, base, 2 * MiB));
  gg__dev_close(d);
  unsetenv("GPUGUARD_HOST_FAULT");
  gg_assert_ok(gg_host_fault_set("open:1"));
  gg_assert_fails(gg__dev_open("host", 0, &d), GG_EDRIVER, "'open' (call 1)");
  d = open_host();
  gg__dev_close(d);
}

static void test_streams_and_events(void **state) {
  (void)state;
  gg__dev_t *d = open_host();
  void *s = NULL, *ev = NULL, *ev2 = NULL;
  gg_assert_ok(gg_host_stream_create(&s));
  gg_assert_ok(d->ops->event_create(d, &ev));
  gg_assert_ok(d->ops->event_create(d, &ev2));
  /* Nothing held: work completes at once. */
  gg_assert_ok(d->ops->event_record(d, ev, s));
  assert_int_equal(d->ops->event_query(d, ev), 1);
  gg_assert_ok(d->ops->event_record(d, ev, NULL));
  assert_int_equal(d->ops->event_query(d, ev), 1);
  /* Held: completion stays pending until the stream is released. */
  gg_assert_ok(gg_host_stream_hold(s));
  gg_assert_ok(d->ops->event_record(d, ev, s));
  assert_int_equal(d->ops->event_query(d, ev), 0);
  gg_assert_fails(d->ops->event_sync(d, ev), GG_ETIMEDOUT, "release the stream first");
  gg_assert_fails(d->ops->stream_sync(d, s), GG_ETIMEDOUT, "held");
  gg_assert_ok(d->ops->stream_sync(d, NULL));
  gg_assert_ok(gg_host_stream_release(s));
  assert_int_equal(d->ops->event_query(d, ev), 1);
  gg_assert_ok(d->ops->event_sync(d, ev));
  gg_assert_ok(d->ops->stream_sync(d, s));
  /* An event outlives its stream safely. */
  gg_assert_ok(gg_host_stream_hold(s));
  gg_assert_ok(d->ops->event_record(d, ev2, s));
  gg_assert_ok(gg_host_stream_destroy(s));
  assert_int_equal(d->ops->event_query(d, ev2), 0);
  gg_assert_ok(d->ops->event_destroy(d, ev));
  gg_assert_ok(d->ops->event_destroy(d, ev2));
  gg_assert_fails(gg_host_stream_create(NULL), GG_EINVAL, "NULL");
  gg_assert_fails(gg_host_stream_hold(NULL), GG_EINVAL, "NULL");
  gg_assert_fails(gg_host_stream_release(NULL), GG_EINVAL, "NULL");
  gg_assert_ok(gg_host_stream_destroy(NULL));
  gg__dev_close(d);
}

/* A malformed fault spec or granularity says what was wrong, with the value given: a typo in an
 * environment variable must not silently test something else. */
static void test_bad_specs_named(void **state) {
  (void)state;
  gg_assert_fails(gg_host_fault_set("map:1,"), GG_EINVAL, "trailing ','");
  gg_assert_fails(gg_host_fault_set("map: 3"), GG_EINVAL, "needs a call number");
  gg_assert_fails(gg_host_fault_set("map:+3"), GG_EINVAL, "needs a call number");
  gg_assert_ok(gg_host_fault_set("map:3,unmap:2+"));
  gg_assert_ok(gg_host_fault_set(NULL));
  gg__dev_t *d = NULL;
  setenv("GPUGUARD_HOST_GRANULARITY", "3", 1);
  setenv("GPUGUARD_HOST_FAULT", "map:1", 1); /* another variable's value must not show up instead */
  gg_assert_fails(gg__dev_open("host", 0, &d), GG_EINVAL,
                  "GPUGUARD_HOST_GRANULARITY='3': must be a power");
  unsetenv("GPUGUARD_HOST_FAULT");
  setenv("GPUGUARD_HOST_GRANULARITY", "12288", 1);
  gg_assert_fails(gg__dev_open("host", 0, &d), GG_EINVAL, "'12288'");
  unsetenv("GPUGUARD_HOST_GRANULARITY");
}

/* A handle the host backend did not make is refused, never read (reading 0x2 crashed the process).
 * CUDA's special handles name a default stream, as NULL does. */
static void test_foreign_stream_handles(void **state) {
  (void)state;
  gg__dev_t *d = open_host();
  void *ev = NULL, *s = NULL;
  gg_assert_ok(d->ops->event_create(d, &ev));
  void *defaults[] = {NULL, (void *)0x1, (void *)0x2};
  for (int i = 0; i < 3; i++) {
    gg_assert_ok(d->ops->event_record(d, ev, defaults[i]));
    assert_int_equal(d->ops->event_query(d, ev), 1);
    gg_assert_ok(d->ops->stream_sync(d, defaults[i]));
    assert_int_equal(d->ops->stream_query(d, defaults[i]), 1);
    gg_assert_ok(d->ops->stream_check(d, defaults[i], "test"));
  }
  int on_stack;
  void *foreign[] = {(void *)0x3, (void *)0xdead0, &on_stack};
  for (int i = 0; i < 3; i++) {
    gg_assert_fails(d->ops->event_record(d, ev, foreign[i]), GG_EINVAL,
                    "not a stream of the host backend");
    gg_assert_fails(d->ops->stream_sync(d, foreign[i]), GG_EINVAL,
                    "not a stream of the host backend");
    gg_assert_fails(d->ops->stream_query(d, foreign[i]), GG_EINVAL, "cudaStreamPerThread");
    gg_assert_fails(d->ops->stream_check(d, foreign[i], "test"), GG_EINVAL, "test: stream");
    gg_assert_fails(gg_host_stream_hold(foreign[i]), GG_EINVAL, "gg_host_stream_hold");
    gg_assert_fails(gg_host_stream_release(foreign[i]), GG_EINVAL, "gg_host_stream_release");
    gg_assert_fails(gg_host_stream_destroy(foreign[i]), GG_EINVAL, "not a live stream");
    gg_assert_fails(gg_host_stream_capture_begin(foreign[i]), GG_EINVAL, "not a stream");
  }
  gg_assert_fails(gg_host_stream_hold((void *)0x2), GG_EINVAL, "default stream");
  gg_assert_fails(gg_host_stream_capture_begin((void *)0x1), GG_EINVAL, "legacy");
  /* A destroyed handle is stale: refused, and a second destroy is not a double free. */
  gg_assert_ok(gg_host_stream_create(&s));
  gg_assert_ok(d->ops->stream_sync(d, s));
  gg_assert_ok(gg_host_stream_destroy(s));
  gg_assert_fails(d->ops->stream_query(d, s), GG_EINVAL, "not a stream of the host backend");
  gg_assert_fails(gg_host_stream_destroy(s), GG_EINVAL, "not a live stream");
  /* Many live streams: each is found (the set has buckets), each destroyed once. */
  void *many[200];
  for (int i = 0; i < 200; i++) gg_assert_ok(gg_host_stream_create(&many[i]));
  for (int i = 0; i < 200; i++) assert_int_equal(d->ops->stream_query(d, many[i]), 1);
  for (int i = 0; i < 200; i++) gg_assert_ok(gg_host_stream_destroy(many[i]));
  gg_assert_ok(d->ops->event_destroy(d, ev));
  gg__dev_close(d);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_map_write_read_unmap, setup),
      cmocka_unit_test_setup(test_bad_sizes_and_alignment, setup),
      cmocka_unit_test_setup(test_capacity, setup),
      cmocka_unit_test_setup(test_bad_environment, setup),
      cmocka_unit_test_setup(test_small_granularity_and_no_vmm, setup),
      cmocka_unit_test_setup(test_fault_specs, setup),
      cmocka_unit_test_setup(test_faults_are_deterministic, setup),
      cmocka_unit_test_setup(test_fault_from_environment, setup),
      cmocka_unit_test_setup(test_streams_and_events, setup),
      cmocka_unit_test_setup(test_foreign_stream_handles, setup),
      cmocka_unit_test_setup(test_bad_specs_named, setup),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
