/* test_gpu_backend.c — the cuda backend on a real device: reserve, map, write, read back, unmap,
 * and the driver's free memory moving by the mapped amount and back. Skips without a CUDA device.
 * */
#include <time.h>

#include "backend/backend.h"
#include "gg_test.h"
#include "core/internal.h"

#define MiB ((size_t)1 << 20)

static void test_device_properties(void **state) {
  (void)state;
  gg_device_info_t info;
  setenv("GPUGUARD_BACKEND", "cuda", 1);
  gg_assert_ok(gg_device_info(0, &info));
  printf("device 0: %s, %s, cc %d.%d, driver %d, %zu MiB total, %zu MiB free, vmm %d\n", info.name,
         info.uuid, info.cc_major, info.cc_minor, info.driver_version, info.total_bytes / MiB,
         info.free_bytes / MiB, info.vmm_supported);
  assert_string_equal(info.backend, "cuda");
  assert_true(strncmp(info.uuid, "GPU-", 4) == 0);
  assert_true(info.total_bytes > 0 && info.free_bytes <= info.total_bytes);
  assert_true(info.cc_major >= 3);
  int n = 0;
  gg_assert_ok(gg_device_count(&n));
  gg_assert_fails(gg_device_info(n, &info), GG_ENODEV, "does not exist");
  unsetenv("GPUGUARD_BACKEND");
}

static void map_roundtrip(const char *vmm_env) {
  if (vmm_env) setenv("GPUGUARD_CUDA_VMM", vmm_env, 1);
  gg__dev_t *d = NULL;
  gg_assert_ok(gg__dev_open("cuda", 0, &d));
  printf("%s mode, granularity %zu\n", d->contiguous ? "VMM" : "cuMemAlloc", d->granularity);
  const size_t size = 1024 * MiB;
  uintptr_t base = 0;
  gg_assert_ok(d->ops->va_reserve(d, size, &base));
  size_t free0, free1, free2, total;
  gg_assert_ok(d->ops->mem_info(d, &free0, &total));
  gg__chunk_t c;
  gg_assert_ok(d->ops->map(d, d->contiguous ? base : 0, size, &c));
  gg_assert_ok(d->ops->mem_info(d, &free1, &total));
  printf("free before map %zu MiB, after %zu MiB (moved %zu MiB)\n", free0 / MiB, free1 / MiB,
         (free0 - free1) / MiB);
  /* The driver's free memory drops by the mapped amount (within one granule of bookkeeping). */
  assert_true(free0 - free1 >= size && free0 - free1 <= size + 64 * MiB);

  /* Real memory: fill on the device, write a pattern, read both back. */
  gg_assert_ok(d->ops->set_d8(d, c.ptr, 0x5A, size));
  unsigned char *buf = malloc(4 * MiB);
  gg_assert_ok(d->ops->copy_from_dev(d, buf, c.ptr + size - 4 * MiB, 4 * MiB));
  for (size_t i = 0; i < 4 * MiB; i += 4093) assert_int_equal(buf[i], 0x5A);
  for (size_t i = 0; i < 4 * MiB; i++) buf[i] = (unsigned char)(i * 31u);
  gg_assert_ok(d->ops->copy_to_dev(d, c.ptr + 123 * MiB, buf, 4 * MiB));
  unsigned char *back = calloc(1, 4 * MiB);
  gg_assert_ok(d->ops->copy_from_dev(d, back, c.ptr + 123 * MiB, 4 * MiB));
  assert_memory_equal(buf, back, 4 * MiB);

  /* Completion: an event recorded on the default stream completes. */
  void *ev = NULL;
  gg_assert_ok(d->ops->event_create(d, &ev));
  gg_assert_ok(d->ops->event_record(d, ev, NULL));
  gg_assert_ok(d->ops->event_sync(d, ev));
  assert_int_equal(d->ops->event_query(d, ev), 1);
  gg_assert_ok(d->ops->event_destroy(d, ev));

  gg_assert_ok(d->ops->unmap(d, &c));
  gg_assert_ok(d->ops->mem_info(d, &free2, &total));
  printf("free after unmap %zu MiB\n", free2 / MiB);
  assert_true(free2 + 64 * MiB >= free0); /* back with the driver */
  gg_assert_ok(d->ops->va_release(d, base, size));
  free(buf);
  free(back);
  gg__dev_close(d);
  unsetenv("GPUGUARD_CUDA_VMM");
}

static void test_vmm_roundtrip(void **state) {
  (void)state;
  map_roundtrip(NULL);
}

static void test_cumemalloc_fallback_roundtrip(void **state) {
  (void)state;
  map_roundtrip("0");
}

static void test_driver_errors_are_named(void **state) {
  (void)state;
  gg__dev_t *d = NULL;
  gg_assert_ok(gg__dev_open("cuda", 0, &d));
  char buf[16];
  /* An address nothing is mapped at: the driver's own error name comes through. */
  int rc = d->ops->copy_from_dev(d, buf, (uintptr_t)0x10, sizeof buf);
  assert_true(rc < 0);
  printf("unmapped copy: %s\n", gg_last_error());
  assert_non_null(strstr(gg_last_error(), "cuMemcpyDtoH failed: CUDA_ERROR_"));
  assert_int_not_equal(gg_last_driver_error(), 0);
  /* Far more than the device has: out of memory, reported as GG_ENOMEM. */
  gg__chunk_t c;
  size_t huge = (size_t)1 << 46;
  rc = d->ops->map(d, 0, huge, &c);
  if (d->contiguous) {
    uintptr_t base = 0;
    if (d->ops->va_reserve(d, huge, &base) == 0) {
      rc = d->ops->map(d, base, huge, &c);
      d->ops->va_release(d, base, huge);
    }
  }
  assert_true(rc < 0);
  printf("huge map: %s\n", gg_last_error());
  gg__dev_close(d);
}

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* unmap_run on a real driver: 64 adjacent chunks of 8 MiB back in one call, the driver's free
 * memory back to the byte; a run that cuts a mapping is refused with nothing unmapped (whether or
 * not this driver takes ranges spanning several mappings: bench_trim_driver says which). */
static void test_unmap_run(void **state) {
  (void)state;
  gg__dev_t *d = NULL;
  gg_assert_ok(gg__dev_open("cuda", 0, &d));
  if (!d->contiguous) {
    gg__dev_close(d);
    skip();
  }
  enum { N = 64 };
  const size_t chunk = 8 * MiB;
  uintptr_t base = 0;
  gg_assert_ok(d->ops->va_reserve(d, N * chunk, &base));
  size_t free0, free1, free2, total;
  gg_assert_ok(d->ops->mem_info(d, &free0, &total));
  gg__chunk_t c[N], *run[N];
  for (int i = 0; i < N; i++) {
    gg_assert_ok(d->ops->map(d, base + (size_t)i * chunk, chunk, &c[i]));
    run[i] = &c[i];
  }
  /* The top chunk cut in half: refused, and every chunk still mapped. */
  gg__chunk_t half = {.ptr = c[N - 1].ptr, .size = chunk / 2, .handle = c[N - 1].handle};
  run[N - 1] = &half;
  size_t done = 99;
  assert_true(d->ops->unmap_run(d, run, N, &done) < 0);
  assert_int_equal(done, 0);
  printf("a run that cuts a mapping: %s\n", gg_last_error());
  run[N - 1] = &c[N - 1];
  gg_assert_ok(d->ops->set_d8(d, base, 1, N * chunk)); /* all still mapped */
  gg_assert_ok(d->ops->mem_info(d, &free1, &total));
  double t0 = now_ms();
  gg_assert_ok(d->ops->unmap_run(d, run, N, &done));
  double t = now_ms() - t0;
  assert_int_equal(done, N);
  gg_assert_ok(d->ops->mem_info(d, &free2, &total));
  printf("%d chunks of 8 MiB: unmap_run %.3f ms (%.3f ms per GiB), driver free %+lld bytes against "
         "before "
         "mapping\n",
         N, t, t / ((double)(N * chunk) / (1024.0 * MiB)), (long long)free2 - (long long)free0);
  assert_true(free0 - free1 >= N * chunk);
  assert_true(free2 + 2 * MiB >= free0); /* the printed difference says whether it is to the byte */
  gg_assert_ok(d->ops->va_release(d, base, N * chunk));
  gg__dev_close(d);
}

/* remap on a real driver: a chunk's memory mapped at a second address (the bytes written through
 * the first are read through the second: one physical allocation), the old range usable until it
 * is unmapped alone, the memory back with the driver only once the owner goes; timed per chunk. */
static void test_remap(void **state) {
  (void)state;
  gg__dev_t *d = NULL;
  gg_assert_ok(gg__dev_open("cuda", 0, &d));
  if (!d->contiguous) {
    gg__dev_close(d);
    skip();
  }
  enum { N = 32 };
  const size_t chunk = 8 * MiB;
  uintptr_t base = 0;
  gg_assert_ok(d->ops->va_reserve(d, 2 * N * chunk, &base));
  size_t free0, free1, free2, total;
  gg_assert_ok(d->ops->mem_info(d, &free0, &total));
  gg__chunk_t c[N], old[N];
  for (int i = 0; i < N; i++) gg_assert_ok(d->ops->map(d, base + (size_t)i * chunk, chunk, &c[i]));
  gg_assert_ok(d->ops->set_d8(d, base, 0x5a, N * chunk));
  double t0 = now_ms();
  for (int i = 0; i < N; i++)
    gg_assert_ok(d->ops->remap(d, &c[i], base + (size_t)(N + i) * chunk, &old[i]));
  double t_remap = now_ms() - t0;
  gg_assert_ok(d->ops->mem_info(d, &free1, &total));
  unsigned char b[2] = {0, 0};
  gg_assert_ok(d->ops->copy_from_dev(d, &b[0], base + (size_t)(2 * N - 1) * chunk + 123, 1));
  assert_int_equal(b[0], 0x5a); /* the same memory at the new address */
  gg_assert_ok(d->ops->set_d8(d, base + (size_t)N * chunk, 0x33, 1));
  gg_assert_ok(d->ops->copy_from_dev(d, &b[1], base, 1));
  assert_int_equal(b[1], 0x33); /* and still at the old one */
  assert_true(old[0].alias && !c[0].alias && c[0].ptr == base + (size_t)N * chunk);
  t0 = now_ms();
  for (int i = 0; i < N; i++) gg_assert_ok(d->ops->unmap(d, &old[i]));
  double t_alias = now_ms() - t0;
  gg_assert_ok(d->ops->set_d8(d, base + (size_t)N * chunk, 1, N * chunk)); /* owners still mapped */
  for (int i = 0; i < N; i++) gg_assert_ok(d->ops->unmap(d, &c[i]));
  gg_assert_ok(d->ops->mem_info(d, &free2, &total));
  printf("%d chunks of 8 MiB: remap %.1f us a chunk, alias unmap %.1f us a chunk; driver free "
         "after the remaps %+lld bytes, after the owners went %+lld bytes, against before\n",
         N, t_remap * 1e3 / N, t_alias * 1e3 / N, (long long)free1 - (long long)free0,
         (long long)free2 - (long long)free0);
  assert_true(free0 - free1 >= N * chunk); /* a remap makes no second copy of the memory */
  assert_true(free0 - free1 < 2 * N * chunk);
  assert_true(free2 + 2 * MiB >= free0);
  gg_assert_ok(d->ops->va_release(d, base, 2 * N * chunk));
  gg__dev_close(d);
}

int main(void) {
  gg_test_require_cuda();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_device_properties),
      cmocka_unit_test(test_vmm_roundtrip),
      cmocka_unit_test(test_cumemalloc_fallback_roundtrip),
      cmocka_unit_test(test_driver_errors_are_named),
      cmocka_unit_test(test_unmap_run),
      cmocka_unit_test(test_remap),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
