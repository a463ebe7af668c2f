// test_hpp.cpp — the C++17 layer (gpuguard.hpp) with g++: gg::Guard owns the teardown (also during
// unwinding), lambdas as cleanups, cancel, moves, and gg::Error carrying the code and the message.
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

int main() {
  setenv("GPUGUARD_BACKEND", "host", 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_guard_lambdas_lifo),
      cmocka_unit_test(test_unwinding),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_moves),
  };
  return cmocka_run_group_tests_name("hpp", tests, nullptr, nullptr);
}
