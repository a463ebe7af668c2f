/* test_guard_arena.c — arenas under a guard: they attach to the live guard of their device, are
 * torn down LIFO with the user's cleanups (memory back, handle kept and refusing calls), detach
 * when destroyed first, appear in the leak report by tag; GG_SCOPE and gg_auto end scopes and
 * arenas on every way out of a block; a thread inside arena calls while the guard is torn down
 * neither deadlocks nor crashes. */
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "backend/backend.h"
#include "gg_test.h"
#include "gpuguard/scope.h"
#include "core/internal.h"

#define MiB ((size_t)1 << 20)

static int setup(void **state) {
  (void)state;
  gg_test_use_host("256M", NULL);
  unsetenv("GPUGUARD_LEAK_REPORT");
  return 0;
}

static gg_guard_t *quiet_guard(const char *report) {
  gg_guard_options_t o;
  gg_guard_options_init(&o);
  o.signals = 0, o.run_at_exit = false, o.leak_report = report ? report : "none";
  gg_guard_t *g = NULL;
  gg_assert_ok(gg_guard_create(&g, &o));
  return g;
}

static gg_arena_t *arena(const char *name) {
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.name = name, o.capacity = 64 * MiB, o.chunk_size = 4 * MiB;
  gg_arena_t *a = NULL;
  gg_assert_ok(gg_arena_create(&a, &o));
  return a;
}

/* Free memory of the simulated device, as the driver would report it. */
static size_t device_free(void) {
  gg__dev_t *d = NULL;
  size_t f = 0, t = 0;
  gg_assert_ok(gg__dev_open("host", 0, &d));
  gg_assert_ok(d->ops->mem_info(d, &f, &t));
  gg__dev_close(d);
  return f;
}

static void test_teardown_releases_attached_arena(void **state) {
  (void)state;
  size_t free0 = device_free();
  gg_guard_t *g = quiet_guard(NULL);
  gg_arena_t *a = arena("weights");
  void *p = NULL;
  gg_assert_ok(gg_alloc(a, 10 * MiB, &p));
  assert_true(device_free() <= free0 - 10 * MiB);
  gg_assert_ok(gg_guard_destroy(g));
  assert_int_equal(device_free(), free0); /* the memory is back while the handle lives on */
  gg_assert_fails(gg_alloc(a, 1, &p), GG_ESTATE, "torn down by its guard");
  gg_arena_stats_t st;
  gg_assert_fails(gg_arena_stats(a, &st), GG_ESTATE, "arena 'weights' was torn down");
  gg_assert_fails(gg_free(a, p), GG_ESTATE, "only gg_arena_destroy()");
  assert_string_equal(gg_arena_name(a), "weights");
  gg_assert_ok(gg_arena_destroy(a)); /* frees the handle */
  gg_assert_fails(gg_arena_destroy(a), GG_EINVAL, "not a live arena");
}

/* Teardown waits for every stream of the context, not only the arena's, before unmapping: a kernel
 * on another stream may use the arena's memory, and unmapping under it faults the GPU. A held host
 * stream stands for such a kernel; a thread releases it once the teardown is seen waiting, and
 * checks nothing was unmapped yet. */
typedef struct keeper {
  void *busy;
  unsigned long long u0; /* unmaps before the teardown */
} keeper_t;

static void *stream_keeper(void *arg) {
  void *busy = ((keeper_t *)arg)->busy;
  unsigned long long u0 = ((keeper_t *)arg)->u0;
  /* Until the teardown waits on the context (ctx_sync counted) or has unmapped already; 10 s at
   * most. */
  for (int i = 0; i < 10000 && gg_host_op_count("ctx_sync") == 0 &&
                  gg_host_op_count("unmap") + gg_host_op_count("unmap_range") == u0;
       i++)
    usleep(1000);
  bool early = gg_host_op_count("unmap") + gg_host_op_count("unmap_range") != u0;
  gg_host_stream_release(busy);
  return (void *)(intptr_t)early;
}

static void test_teardown_waits_for_other_streams(void **state) {
  (void)state;
  gg_host_fault_set(NULL); /* counters from zero */
  gg_guard_t *g = quiet_guard(NULL);
  gg_arena_t *a = arena("shared-by-kernels");
  void *p = NULL, *busy = NULL;
  gg_assert_ok(gg_alloc(a, 2 * MiB, &p));
  gg_assert_ok(gg_host_stream_create(&busy));
  gg_assert_ok(gg_host_stream_hold(busy)); /* a kernel on a second stream, using p */
  keeper_t k = {busy, gg_host_op_count("unmap") + gg_host_op_count("unmap_range")};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, stream_keeper, &k), 0);
  gg_assert_ok(gg_guard_destroy(g));
  void *early = NULL;
  pthread_join(t, &early);
  assert_null(early); /* nothing was unmapped while the other stream still ran */
  assert_true(gg_host_op_count("unmap") + gg_host_op_count("unmap_range") > 0);
  gg_assert_ok(gg_arena_destroy(a));
  gg_assert_ok(gg_host_stream_destroy(busy));
}

/* A kernel that never ends does not hang the teardown: the wait is bounded, and the memory then
 * goes back anyway (as at process exit). */
static void test_teardown_bounded_when_a_stream_never_ends(void **state) {
  (void)state;
  size_t free0 = device_free();
  gg_guard_t *g = quiet_guard(NULL);
  gg_arena_t *a = arena("stuck");
  void *p = NULL, *busy = NULL;
  gg_assert_ok(gg_alloc(a, 2 * MiB, &p));
  gg_assert_ok(gg_host_stream_create(&busy));
  gg_assert_ok(gg_host_stream_hold(busy));
  gg_assert_ok(gg_guard_destroy(g)); /* returns: bounded */
  assert_int_equal(device_free(), free0);
  gg_assert_ok(gg_arena_destroy(a));
  gg_assert_ok(gg_host_stream_destroy(busy));
}

static void test_destroyed_first_detaches(void **state) {
  (void)state;
  gg_guard_t *g = quiet_guard(NULL);
  gg_arena_t *a = arena("short-lived");
  unsigned long long unmaps = gg_host_op_count("unmap");
  void *p;
  gg_assert_ok(gg_alloc(a, MiB, &p));
  gg_assert_ok(gg_arena_destroy(a));
  unsigned long long after = gg_host_op_count("unmap");
  assert_true(after > unmaps);
  gg_assert_ok(gg_guard_destroy(g)); /* nothing left to tear down: no further unmap */
  assert_int_equal(gg_host_op_count("unmap"), after);
}

/* Cleanups and arenas interleave LIFO: b (after the arena) sees it alive, a (before it) sees it
 * torn. */
static gg_arena_t *lifo_arena;
static int seen_by_a = 1, seen_by_b = 1;
static void probe_a(void *u) {
  void *p;
  (void)u, seen_by_a = gg_alloc(lifo_arena, 256, &p);
}
static void probe_b(void *u) {
  void *p;
  (void)u, seen_by_b = gg_alloc(lifo_arena, 256, &p);
}

static void test_lifo_with_cleanups(void **state) {
  (void)state;
  gg_guard_t *g = quiet_guard(NULL);
  gg_assert_ok(gg_guard_on_teardown(g, probe_a, NULL, "a"));
  lifo_arena = arena("lifo");
  gg_assert_ok(gg_guard_on_teardown(g, probe_b, NULL, "b"));
  gg_assert_ok(gg_guard_destroy(g));
  assert_int_equal(seen_by_b, 0);
  assert_int_equal(seen_by_a, GG_ESTATE);
  gg_assert_ok(gg_arena_destroy(lifo_arena));
}

/* The common pattern: a cleanup destroys its own arena. No double teardown. */
static void destroy_arena(void *u) { gg_arena_destroy(u); }

static void test_cleanup_destroys_arena(void **state) {
  (void)state;
  gg_guard_t *g = quiet_guard(NULL);
  gg_arena_t *a = arena("owned");
  void *p;
  gg_assert_ok(gg_alloc(a, MiB, &p));
  gg_assert_ok(gg_guard_on_teardown(g, destroy_arena, a, "destroy arena"));
  unsigned long long before = gg_host_op_count("release");
  gg_assert_ok(gg_guard_destroy(g));
  assert_int_equal(gg_host_op_count("release"), before + 1); /* one range released, once */
}

static void test_other_device_or_backend_not_attached(void **state) {
  (void)state;
  gg_guard_t *g = quiet_guard(NULL);
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.device = 1, o.capacity = 16 * MiB;
  gg_arena_t *other = NULL;
  int rc = gg_arena_create(&other, &o);
  gg_assert_ok(gg_guard_destroy(g));
  if (rc ==
      0) { /* the host backend has one device; should it grow more, device 1 stays untouched */
    void *p;
    gg_assert_ok(gg_alloc(other, 256, &p));
    gg_assert_ok(gg_arena_destroy(other));
  }
  /* No guard at all: arenas live as before. */
  gg_arena_t *a = arena("unguarded");
  void *p;
  gg_assert_ok(gg_alloc(a, 256, &p));
  gg_assert_ok(gg_arena_destroy(a));
}

static void test_leak_report_real_arena(void **state) {
  (void)state;
  char dir[] = "/tmp/gg_leak_XXXXXX", path[64], spec[80], buf[4096];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/r.jsonl", dir);
  snprintf(spec, sizeof spec, "json:%s", path);
  gg_guard_t *g = quiet_guard(spec);
  gg_arena_t *a = arena("model");
  void *p;
  gg_assert_ok(gg_alloc_ex(a, 1000, 0, "weights", &p));
  gg_assert_ok(gg_alloc_ex(a, 3000, 0, "weights", &p));
  gg_assert_ok(gg_alloc_ex(a, 500, 0, "grads", &p));
  void *freed;
  gg_assert_ok(gg_alloc_ex(a, 777, 0, "freed", &freed));
  gg_assert_ok(gg_free(a, freed));
  gg_assert_ok(gg_guard_destroy(g));
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = '\0';
  fclose(f);
  printf("  %s", buf);
  assert_non_null(
      strstr(buf, "\"name\":\"model\",\"backend\":\"host\",\"live_blocks\":3,\"live_bytes\":4500"));
  assert_non_null(strstr(buf, "{\"tag\":\"weights\",\"count\":2,\"bytes\":4000}"));
  assert_non_null(strstr(buf, "{\"tag\":\"grads\",\"count\":1,\"bytes\":500}"));
  assert_null(strstr(buf, "freed"));
  gg_assert_ok(gg_arena_destroy(a));
  unlink(path);
  rmdir(dir);
}

/* A thread keeps allocating and freeing while the guard is torn down: it gets GG_ESTATE and stops.
 * */
static atomic_long worker_ops;
static char worker_msg[2][512]; /* each worker's last error, for the failure message */

typedef struct worker_arg {
  gg_arena_t *arena;
  int index;
} worker_arg_t;

static void *alloc_loop(void *arg) {
  const worker_arg_t *w = arg;
  for (;;) {
    void *p;
    int rc = gg_alloc_ex(w->arena, 4096, 0, "loop", &p);
    if (rc == 0) rc = gg_free(w->arena, p);
    if (rc != 0) {
      snprintf(worker_msg[w->index], sizeof worker_msg[w->index], "%s", gg_last_error());
      return (void *)(intptr_t)rc;
    }
    atomic_fetch_add(&worker_ops, 1);
  }
}

static void test_teardown_while_thread_in_arena(void **state) {
  (void)state;
  for (int round = 0; round < 10; round++) {
    gg_guard_t *g = quiet_guard(NULL);
    gg_arena_t *a = arena("busy");
    atomic_store(&worker_ops, 0);
    pthread_t t[2];
    worker_arg_t args[2] = {{a, 0}, {a, 1}};
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, alloc_loop, &args[i]);
    while (atomic_load(&worker_ops) < 1000) usleep(100);
    gg_assert_ok(gg_guard_destroy(g));
    for (int i = 0; i < 2; i++) {
      void *rc = NULL;
      pthread_join(t[i], &rc);
      if ((int)(intptr_t)rc != GG_ESTATE)
        fail_msg("round %d, worker %d ended with %s: %s", round, i, gg_err_name((int)(intptr_t)rc),
                 worker_msg[i]);
    }
    gg_assert_ok(gg_arena_destroy(a));
  }
}

/* ---- GG_SCOPE and gg_auto ---- */

static int depth_of(gg_arena_t *a) {
  gg_arena_stats_t s;
  gg_assert_ok(gg_arena_stats(a, &s));
  return s.scope_depth;
}

static unsigned long long live_of(gg_arena_t *a) {
  gg_arena_stats_t s;
  gg_assert_ok(gg_arena_stats(a, &s));
  return s.n_live;
}

static int scoped_return(gg_arena_t *a, int early) {
  GG_SCOPE(a) {
    void *p;
    gg_assert_ok(gg_alloc(a, 1024, &p));
    if (early) return depth_of(a); /* the scope ends after this value is computed */
  }
  return -1;
}

static void test_gg_scope_every_exit(void **state) {
  (void)state;
  gg_auto(gg_arena_destroy) gg_arena_t *a = arena("scoped");
  void *keep;
  gg_assert_ok(gg_alloc(a, 512, &keep)); /* outside any scope: survives */
  GG_SCOPE(a) {                          /* fall-through */
    void *p;
    gg_assert_ok(gg_alloc(a, 1024, &p));
    assert_int_equal(depth_of(a), 1);
    GG_SCOPE(a) { /* nested */
      gg_assert_ok(gg_alloc(a, 1024, &p));
      assert_int_equal(depth_of(a), 2);
    }
    assert_int_equal(depth_of(a), 1);
    assert_int_equal(live_of(a), 2);
  }
  assert_int_equal(depth_of(a), 0);
  assert_int_equal(live_of(a), 1);
  GG_SCOPE(a) { /* break */
    void *p;
    gg_assert_ok(gg_alloc(a, 1024, &p));
    break;
  }
  assert_int_equal(live_of(a), 1);
  for (int i = 0; i < 3; i++) {
    GG_SCOPE(a) { /* continue leaves the scope block, not the for loop */
      void *p;
      gg_assert_ok(gg_alloc(a, 1024, &p));
      continue;
    }
  }
  assert_int_equal(live_of(a), 1);
  assert_int_equal(scoped_return(a, 1), 1); /* return */
  assert_int_equal(scoped_return(a, 0), -1);
  assert_int_equal(depth_of(a), 0);
  assert_int_equal(live_of(a), 1);
  GG_SCOPE(a) { /* goto */
    void *p;
    gg_assert_ok(gg_alloc(a, 1024, &p));
    goto out;
  }
out:
  assert_int_equal(depth_of(a), 0);
  assert_int_equal(live_of(a), 1);
  /* A scope that cannot begin skips its block. */
  int ran = 0, rc = 0;
  GG_SCOPE(NULL) { ran = 1; }
  assert_int_equal(ran, 0);
  GG_SCOPE_RC(NULL, rc) { ran = 1; }
  assert_int_equal(ran, 0);
  assert_int_equal(rc, GG_EINVAL);
  GG_SCOPE_RC(a, rc) { ran = 1; }
  assert_int_equal(ran, 1);
  assert_int_equal(rc, 0);
}

static gg_arena_t *make_owned(int fail) {
  gg_auto(gg_arena_destroy) gg_arena_t *a = arena("made");
  void *p;
  if (gg_alloc(a, 1024, &p) != 0 || fail) return NULL; /* destroyed on the way out */
  return GG_TAKE_PTR(a);                               /* handed out: not destroyed */
}

static void test_gg_auto_arena(void **state) {
  (void)state;
  unsigned long long releases = gg_host_op_count("release");
  assert_null(make_owned(1));
  assert_int_equal(gg_host_op_count("release"), releases + 1);
  gg_arena_t *a = make_owned(0);
  assert_non_null(a);
  assert_int_equal(live_of(a), 1);
  assert_int_equal(gg_host_op_count("release"), releases + 1);
  gg_arena_destroyp(&a);
  assert_null(a);
  assert_int_equal(gg_host_op_count("release"), releases + 2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_teardown_releases_attached_arena, setup),
      cmocka_unit_test_setup(test_teardown_waits_for_other_streams, setup),
      cmocka_unit_test_setup(test_teardown_bounded_when_a_stream_never_ends, setup),
      cmocka_unit_test_setup(test_destroyed_first_detaches, setup),
      cmocka_unit_test_setup(test_lifo_with_cleanups, setup),
      cmocka_unit_test_setup(test_cleanup_destroys_arena, setup),
      cmocka_unit_test_setup(test_other_device_or_backend_not_attached, setup),
      cmocka_unit_test_setup(test_leak_report_real_arena, setup),
      cmocka_unit_test_setup(test_teardown_while_thread_in_arena, setup),
      cmocka_unit_test_setup(test_gg_scope_every_exit, setup),
      cmocka_unit_test_setup(test_gg_auto_arena, setup),
  };
  return cmocka_run_group_tests_name("guard_arena", tests, NULL, NULL);
}
