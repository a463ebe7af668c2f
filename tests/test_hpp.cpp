// test_hpp.cpp — the C++17 layer (gpuguard.hpp) with g++: gg::Guard owns the teardown (also during
// unwinding), lambdas as cleanups, cancel, moves, and gg::Error carrying the code and the message.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "gpuguard/gpuguard.hpp"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" { /* neither this cmocka nor gg_test.h has C++ linkage markers */
#include <cmocka.h>

#include "gg_test.h"
}

static std::string order;

static gg::Guard::Options quiet() {
  gg::Guard::Options o;
  o.signals = 0;
  o.run_at_exit = false;
  return o;
}

static void test_guard_lambdas_lifo(void **) {
  order.clear();
  {
    gg::Guard g(quiet());
    g.on_teardown([] { order += "a"; }, "a");
    auto id = g.on_teardown([] { order += "x"; });
    g.on_teardown([] { order += "b"; }, "b");
    g.cancel(id);
    g.on_teardown([] { throw std::runtime_error("swallowed"); }, "throws");
  }
  assert_string_equal(order.c_str(), "ba");
}

static void test_unwinding(void **) {
  order.clear();
  try {
    gg::Guard g(quiet());
    g.on_teardown([] { order += "t"; });
    throw std::runtime_error("boom");
  } catch (const std::runtime_error &e) {
    order += "c";
  }
  assert_string_equal(order.c_str(), "tc");
}

static void test_errors(void **) {
  gg::Guard g(quiet());
  try {
    g.cancel(123456789);
    fail_msg("cancel of an unknown id did not throw");
  } catch (const gg::Error &e) {
    assert_int_equal(e.code(), GG_ENOTFOUND);
    assert_string_equal(e.name(), "GG_ENOTFOUND");
    assert_non_null(strstr(e.what(), "no registration 123456789"));
  }
  gg::Guard::Options bad = quiet();
  bad.teardown_timeout_ms = -5;
  try {
    gg::Guard g2(bad);
    fail_msg("bad options did not throw");
  } catch (const std::runtime_error &e) { /* gg::Error is a std::runtime_error */
    assert_non_null(strstr(e.what(), "GG_EINVAL: gg_guard_create: options.teardown_timeout_ms=-5"));
    assert_null(strstr(e.what(), "GG_EINVAL: GG_EINVAL"));
  }
  /* A detail that does not start with the code's name (a stale one, or none) still gets the name.
   * */
  gg_clear_error();
  try {
    gg::check(GG_ESTATE);
    fail_msg("check of a negative status did not throw");
  } catch (const gg::Error &e) {
    assert_string_equal(e.what(), "GG_ESTATE: call not valid in this state");
  }
  assert_int_equal(gg::check(0), 0);
}

static void test_moves(void **) {
  order.clear();
  gg::Guard a(quiet());
  a.on_teardown([] { order += "a"; });
  gg::Guard b(std::move(a));
  assert_null(a.get());
  assert_non_null(b.get());
  gg::Guard c(quiet());
  c.on_teardown([] { order += "c"; });
  c = std::move(b); /* c's own guard is torn down first */
  assert_string_equal(order.c_str(), "c");
  c.destroy();
  assert_string_equal(order.c_str(), "ca");
  assert_null(c.get());
  c.reset(); /* empty: nothing */
}

static gg::Arena::Options small_arena() {
  gg::Arena::Options o;
  o.capacity = 32u << 20;
  o.name = "cxx";
  return o;
}

static unsigned long long live(const gg::Arena &a) { return a.stats().n_live; }

static void test_arena_and_scopes(void **) {
  gg::Arena a(small_arena());
  assert_string_equal(a.name(), "cxx");
  assert_string_equal(a.backend(), "host");
  void *keep = a.alloc(1000, "keep");
  float *f = a.alloc_n<float>(256, "floats");
  assert_true(reinterpret_cast<uintptr_t>(f) % 256 == 0);
  f[0] = 1.5f; /* host backend: ordinary memory */
  a.free(f);
  try {
    gg::Scope outer(a);
    a.alloc(4096, "tmp");
    {
      auto inner = a.scope();
      a.alloc(4096, "tmp");
      assert_int_equal(a.stats().scope_depth, 2);
    }
    assert_int_equal(a.stats().scope_depth, 1);
    throw std::runtime_error("unwind");
  } catch (const std::runtime_error &) {
  }
  assert_int_equal(a.stats().scope_depth, 0);
  assert_int_equal(live(a), 1); /* only keep */
  gg::Scope s(a);
  gg::Scope moved(std::move(s));
  moved.end();
  moved.end(); /* once only */
  try {
    a.alloc(64u << 20);
    fail_msg("an allocation beyond the capacity did not throw");
  } catch (const gg::Error &e) {
    assert_int_equal(e.code(), GG_ENOMEM);
    /* The code's name once, then the call that failed: the library's detail starts with the name.
     * */
    assert_int_equal(strncmp(e.what(), "GG_ENOMEM: gg_alloc", 19), 0);
    assert_null(strstr(e.what() + 1, "GG_ENOMEM"));
  }
  try {
    a.alloc_n<double>(SIZE_MAX / 4);
    fail_msg("overflowing alloc_n did not throw");
  } catch (const gg::Error &e) {
    assert_int_equal(e.code(), GG_EINVAL);
  }
  a.free(keep);
  a.trim();
  gg::Arena b(std::move(a));
  assert_null(a.get());
  gg_arena_t *raw = b.release();
  assert_int_equal(gg_arena_destroy(raw), 0);
}

static void test_arena_under_guard(void **) {
  gg::Arena a(small_arena());
  {
    gg::Guard g(quiet());
    gg::Arena attached(small_arena());
    attached.alloc(1 << 20, "x");
    /* attached is destroyed first (declared later): it detaches, the guard has nothing left of it
     * */
  }
  gg::Arena survivor(small_arena());
  {
    gg::Guard g(quiet());
    gg::Arena attached(small_arena());
    void *p = attached.alloc(1 << 20);
    (void)p;
    g.destroy(); /* tears the arena down: its handle refuses calls, and ~Arena still frees it */
    try {
      attached.alloc(16);
      fail_msg("alloc on a torn-down arena did not throw");
    } catch (const gg::Error &e) {
      assert_int_equal(e.code(), GG_ESTATE);
    }
  }
  survivor.alloc(16); /* created with no guard alive: unaffected */
}

int main() {
  setenv("GPUGUARD_BACKEND", "host", 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_guard_lambdas_lifo),
      cmocka_unit_test(test_unwinding),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_moves),
      cmocka_unit_test(test_arena_and_scopes),
      cmocka_unit_test(test_arena_under_guard),
  };
  return cmocka_run_group_tests_name("hpp", tests, nullptr, nullptr);
}
