/* test_arena_faults.c — fault injection on every backend operation an arena makes: each call of
 * each operation fails once in turn (and whole operations fail for good), and every time the arena
 * stays consistent, the failing call says why, the arena is usable afterwards, and no device memory
 * leaks. */
#include <stdbool.h>

#include "arena/arena_internal.h"
#include "backend/backend.h"
#include "gg_test.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static const char *const ops[] = {"reserve",     "release",    "map",           "unmap",
                                  "unmap_range", "remap",      "event_create",  "event_record",
                                  "event_query", "event_sync", "event_destroy", "stream_sync",
                                  "copy",        "set"};
#define NOPS (sizeof ops / sizeof ops[0])

static int failures_seen;

static size_t host_free(void) {
  gg__dev_t *d = NULL;
  size_t f = 0, t = 0;
  gg_assert_ok(gg__dev_open("host", 0, &d));
  gg_assert_ok(d->ops->mem_info(d, &f, &t));
  gg__dev_close(d);
  return f;
}

/* A failed call must say why and leave the arena consistent; once the fault is past, the same call
 * works (faults here fail one call only). */
#define TRY(a, call)                                                              \
  do {                                                                            \
    int try_rc = (call);                                                          \
    if (try_rc < 0) {                                                             \
      failures_seen++;                                                            \
      if (!gg_last_error()[0])                                                    \
        fail_msg("%s failed with %s and no message", #call, gg_err_name(try_rc)); \
      if ((a)) gg_assert_ok(gg__arena_check((a)));                                \
      if (!sticky) gg_assert_ok(call);                                            \
    }                                                                             \
    if ((a)) gg_assert_ok(gg__arena_check((a)));                                  \
  } while (0)

/* A workload touching every path: growth, bump and best fit, scopes, batches, trim, copies,
 * destroy. */
static void scenario(bool sticky) {
  void *st = NULL;
  gg_assert_ok(gg_host_stream_create(&st));
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.capacity = 4 * MiB, o.chunk_size = 256 * KiB, o.stream = st, o.name = "faults";
  gg_arena_t *a = NULL;
  int rc = gg_arena_create(&a, &o);
  if (rc < 0) {
    failures_seen++;
    assert_null(a);
    assert_true(gg_last_error()[0] != '\0');
    if (sticky) goto out;
    gg_assert_ok(gg_arena_create(&a, &o));
  }
  void *keep = NULL, *left = NULL, *p[24] = {0};
  TRY(a, gg_alloc_ex(a, 100 * KiB, 0, "keep", &keep));
  TRY(a, gg_alloc_ex(a, 1000, 0, "left live at destroy", &left));
  void *mx = NULL, *my = NULL, *mz = NULL;
  TRY(a, gg_alloc(a, 512 * KiB, &mx)); /* freed, then a larger request moves its free chunks */
  TRY(a, gg_alloc(a, 1000, &my));
  if (mx) TRY(a, gg_free(a, mx));
  TRY(a, gg_alloc(a, 768 * KiB, &mz));
  if (mz) TRY(a, gg_free(a, mz));
  if (my) TRY(a, gg_free(a, my));
  gg_scope_t sc;
  gg_assert_ok(gg_scope_begin(a, &sc));
  for (int i = 0; i < 24; i++) {
    TRY(a, gg_alloc_ex(a, (size_t)(i % 5 + 1) * 40 * KiB, i % 4 ? 0 : 4096, "loop", &p[i]));
    if (p[i]) TRY(a, gg_arena_memset(a, p[i], i, 1000));
  }
  for (int i = 0; i < 24; i += 2)
    if (p[i]) TRY(a, gg_free(a, p[i]));
  TRY(a, gg_scope_end(&sc));
  TRY(a, gg_arena_trim(a, 0));
  void *big = NULL;
  TRY(a, gg_alloc(a, 1 * MiB, &big)); /* reuses settled memory or maps again */
  char buf[512] = "payload";
  if (big) {
    TRY(a, gg_arena_copy_to_device(a, big, buf, sizeof buf));
    char back[512] = "";
    TRY(a, gg_arena_copy_from_device(a, back, big, sizeof back));
    if (!sticky) assert_string_equal(back, "payload");
    TRY(a, gg_free(a, big));
  }
  if (keep) TRY(a, gg_free(a, keep));
  TRY(a, gg_arena_trim(a, 0));
  gg_arena_stats_t s;
  gg_assert_ok(gg_arena_stats(a, &s));
  if (!sticky) {
    assert_int_equal(s.n_live, 1);
    assert_int_equal(s.bytes_mapped, 256 * KiB);
  }
  rc = gg_arena_destroy(a); /* may report a failed step; the handle and the memory go regardless */
  if (rc < 0) failures_seen++, assert_true(gg_last_error()[0] != '\0');
out:
  gg_host_stream_destroy(st);
}

static int setup(void **state) {
  (void)state;
  gg_test_use_host("64M", "64K");
  return 0;
}

static void each_call_fails_once(bool vmm) {
  setenv("GPUGUARD_HOST_VMM", vmm ? "1" : "0", 1);
  size_t free0 = host_free();
  gg_host_fault_set(NULL);
  scenario(false);
  unsigned long long calls[NOPS];
  for (size_t k = 0; k < NOPS; k++) calls[k] = gg_host_op_count(ops[k]);
  for (size_t k = 0; k < NOPS; k++) {
    int before = failures_seen;
    for (unsigned long long n = 1; n <= calls[k]; n++) {
      char spec[64];
      snprintf(spec, sizeof spec, "%s:%llu%s", ops[k], n, n % 2 ? "" : "=nomem");
      gg_assert_ok(gg_host_fault_set(spec));
      scenario(false);
      assert_int_equal(host_free(), free0); /* nothing leaked on the device */
    }
    printf("%-13s %3llu calls in the workload, each failed once: %d failures surfaced, all "
           "recovered\n",
           ops[k], calls[k], failures_seen - before);
  }
  gg_host_fault_set(NULL);
}

static void test_each_call_fails_once(void **state) {
  (void)state;
  each_call_fails_once(true);
}

static void test_each_call_fails_once_no_vmm(void **state) {
  (void)state;
  each_call_fails_once(false);
}

/* An operation that always fails: the arena refuses what needs it, keeps working for the rest, and
 * is whole again when the fault goes. */
static void test_operation_always_fails(void **state) {
  (void)state;
  size_t free0 = host_free();
  for (size_t k = 0; k < NOPS; k++) {
    char spec[64];
    snprintf(spec, sizeof spec, "%s:*", ops[k]);
    gg_assert_ok(gg_host_fault_set(spec));
    scenario(true);
    gg_host_fault_set(NULL);
    assert_int_equal(host_free(), free0);
  }
  /* Without events at all, released memory still comes back (through a stream synchronisation). */
  gg_assert_ok(gg_host_fault_set("event_create:*"));
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.capacity = 1 * MiB, o.chunk_size = 256 * KiB;
  gg_arena_t *a;
  gg_assert_ok(gg_arena_create(&a, &o));
  for (int i = 0; i < 100; i++) {
    void *p;
    gg_assert_ok(gg_alloc(a, 512 * KiB, &p));
    gg_assert_ok(gg_free(a, p));
  }
  gg_assert_ok(gg__arena_check(a));
  gg_assert_ok(gg_arena_destroy(a));
  /* Mapping impossible: a clear error, then recovery. */
  gg_assert_ok(gg_host_fault_set("map:*"));
  gg_assert_ok(gg_arena_create(&a, &o));
  void *p;
  gg_assert_fails(gg_alloc(a, 1000, &p), GG_EDRIVER, "injected fault in 'map'");
  gg_host_fault_set(NULL);
  gg_assert_ok(gg_alloc(a, 1000, &p));
  gg_assert_ok(gg_arena_destroy(a));
  assert_int_equal(host_free(), free0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_each_call_fails_once, setup),
      cmocka_unit_test_setup(test_each_call_fails_once_no_vmm, setup),
      cmocka_unit_test_setup(test_operation_always_fails, setup),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
