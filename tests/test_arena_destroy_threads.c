/* test_arena_destroy_threads.c — gg_arena_destroy() while other threads are calling into the same
 * arena: every call returns, with success or GG_EINVAL (the documented answer after destroy), and
 * no thread is left blocked on the arena's lock. Two destroys at once: one succeeds, the other gets
 * GG_EINVAL. Runs under ThreadSanitizer too (label `threads`). */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

#include "gg_test.h"

#define MiB     ((size_t)1 << 20)
#define THREADS 4
#define ROUNDS  300

typedef struct race {
  gg_arena_t *arena;
  atomic_int ops;        /* calls that succeeded, all threads together */
  atomic_int destroy_ok; /* destroys that returned 0 */
  atomic_int destroy_einval;
  char error[THREADS + 1][256];
} race_t;

typedef struct worker {
  race_t *race;
  int id;
} worker_t;

/* One call that may meet a destroyed arena: false to stop (destroyed, or an unexpected result
 * kept). */
static bool accept_rc(worker_t *w, const char *call, int rc) {
  if (rc == 0) return atomic_fetch_add(&w->race->ops, 1), true;
  if (rc != GG_EINVAL)
    snprintf(w->race->error[w->id], sizeof w->race->error[w->id], "%s: %s (%s)", call,
             gg_err_name(rc), gg_last_error());
  return false;
}

static void *hammer(void *arg) {
  worker_t *w = arg;
  gg_arena_stats_t s;
  for (unsigned i = 0;; i++) {
    void *p = NULL;
    if (!accept_rc(w, "gg_alloc", gg_alloc(w->race->arena, 256 * (1 + i % 16), &p))) break;
    if (i % 8 == 0 && !accept_rc(w, "gg_arena_stats", gg_arena_stats(w->race->arena, &s))) break;
    if (!accept_rc(w, "gg_free", gg_free(w->race->arena, p))) break;
    if (i % 64 == 0 && !accept_rc(w, "gg_arena_trim", gg_arena_trim(w->race->arena, 0))) break;
  }
  return NULL;
}

static void count_destroy(race_t *r, int rc) {
  if (rc == 0)
    atomic_fetch_add(&r->destroy_ok, 1);
  else if (rc == GG_EINVAL)
    atomic_fetch_add(&r->destroy_einval, 1);
}

static void *second_destroyer(void *arg) {
  race_t *r = arg;
  count_destroy(r, gg_arena_destroy(r->arena));
  return NULL;
}

/* Joins t, failing the test when it does not end within 30 s (it would be blocked for good). */
static void join_or_fail(pthread_t t, int round, const char *what) {
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += 30;
  int e = pthread_timedjoin_np(t, NULL, &deadline);
  if (e == ETIMEDOUT)
    fail_msg("round %d: %s is still blocked 30 s after gg_arena_destroy", round, what);
  assert_int_equal(e, 0);
}

static void test_calls_during_destroy_return(void **state) {
  (void)state;
  setenv("GPUGUARD_BACKEND", "host", 1);
  for (int round = 0; round < ROUNDS; round++) {
    race_t r = {0};
    gg_arena_options_t o;
    gg_arena_options_init(&o);
    o.capacity = 64 * MiB, o.chunk_size = MiB, o.name = "destroyed under load";
    gg_assert_ok(gg_arena_create(&r.arena, &o));
    pthread_t t[THREADS], extra;
    worker_t w[THREADS];
    for (int i = 0; i < THREADS; i++) {
      w[i] = (worker_t){&r, i};
      assert_int_equal(pthread_create(&t[i], NULL, hammer, &w[i]), 0);
    }
    while (atomic_load(&r.ops) < THREADS * (1 + round % 32))
      sched_yield(); /* destroy at varied moments */
    bool two = round % 4 == 0;
    if (two) assert_int_equal(pthread_create(&extra, NULL, second_destroyer, &r), 0);
    count_destroy(&r, gg_arena_destroy(r.arena));
    if (two) join_or_fail(extra, round, "a second gg_arena_destroy");
    for (int i = 0; i < THREADS; i++) join_or_fail(t[i], round, "a thread calling into the arena");
    for (int i = 0; i < THREADS; i++)
      if (r.error[i][0]) fail_msg("round %d, thread %d: %s", round, i, r.error[i]);
    assert_int_equal(atomic_load(&r.destroy_ok), 1);
    assert_int_equal(atomic_load(&r.destroy_einval), two ? 1 : 0);
    /* And after it all, the handle still answers GG_EINVAL. */
    void *p;
    gg_assert_fails(gg_alloc(r.arena, 256, &p), GG_EINVAL, "not a live arena");
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_calls_during_destroy_return),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
