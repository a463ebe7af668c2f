/* test_torch_shim.cpp — libgpuguard_torch's gg_torch_malloc, the entry point PyTorch's global
 * allocator calls under gpuguard.torch.use_arena: a request the arena cannot hold throws (PyTorch
 * turns that into a Python exception) with the arena's full detail, instead of returning NULL (a
 * tensor at address 0). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include <cmocka.h>
}

#include <stdexcept>
#include <string>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored \
    "-Wshadow" /* C functions named like their struct tags (gg_arena_stats) */
#include "gpuguard/arena.h"
#include "gpuguard/plugin.h"
#pragma GCC diagnostic pop

extern "C" void *gg_torch_malloc(ssize_t size, int device, void *stream);
extern "C" void gg_torch_mfree(void *ptr, ssize_t size, int device, void *stream);
extern "C" int gg_torch_shim_kind(void);

static gg_arena_t *make_registered(size_t capacity) {
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.backend = "host", o.capacity = capacity, o.chunk_size = 2 << 20;
  gg_arena_t *a = nullptr;
  assert_int_equal(gg_arena_create(&a, &o), 0);
  assert_int_equal(gg_plugin_set_arena(0, a), 0);
  return a;
}

static void test_out_of_memory_throws_with_the_arena_detail(void **) {
  gg_arena_t *a = make_registered(8 << 20);
  gg_plugin_stats_t before, after;
  assert_int_equal(gg_plugin_stats(0, &before), 0);
  std::string what;
  try {
    void *p = gg_torch_malloc(ssize_t(1) << 30, 0, nullptr);
    fail_msg("gg_torch_malloc returned %p for 1 GiB from an 8 MiB arena", p);
  } catch (const std::runtime_error &e) {
    what = e.what();
  }
  assert_int_equal(what.rfind("CUDA out of memory.", 0), 0); /* PyTorch's own wording first */
  assert_true(what.find("1073741824 bytes on device 0") != std::string::npos);
  assert_true(what.find("capacity") != std::string::npos); /* the arena's detail */
  assert_int_equal(gg_plugin_stats(0, &after), 0);
  assert_int_equal(after.n_failed_allocs, before.n_failed_allocs + 1);
  /* The arena is unharmed: the next request that fits is served, and freed through the same
   * library. */
  void *p = gg_torch_malloc(1 << 20, 0, nullptr);
  assert_non_null(p);
  gg_arena_stats_t s;
  assert_int_equal(gg_arena_stats(a, &s), 0);
  assert_int_equal(s.bytes_in_use, 1 << 20);
  gg_torch_mfree(p, 1 << 20, 0, nullptr);
  assert_int_equal(gg_arena_stats(a, &s), 0);
  assert_int_equal(s.bytes_in_use, 0);
  assert_int_equal(gg_torch_shim_kind(), 0); /* the generic build: std::runtime_error */
  assert_int_equal(gg_arena_destroy(a), 0);
}

static void test_no_arena_throws_too(void **) {
  assert_int_equal(gg_plugin_set_arena(0, nullptr), 0);
  std::string what;
  try {
    gg_torch_malloc(4096, 0, nullptr);
  } catch (const std::runtime_error &e) {
    what = e.what();
  }
  assert_int_equal(what.rfind("CUDA allocation failed.", 0), 0);
  assert_true(what.find("no arena is registered") != std::string::npos);
  assert_null(gg_torch_malloc(0, 0, nullptr)); /* empty tensors: no memory, no error */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_out_of_memory_throws_with_the_arena_detail),
      cmocka_unit_test(test_no_arena_throws_too),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
