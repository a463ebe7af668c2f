/* test_arena_fork.c — fork() while other threads create, use and destroy arenas: the child, whose
 * only thread is the one that forked, must be able to create an arena, allocate, free, destroy and
 * exit. Without fork handlers for the arena's global locks (the live list, the quarantine), a fork
 * taken while another thread held one of them leaves it locked for good in the child, which then
 * hangs. A reporter thread walks the live list the way reports do, slowly, so most forks land while
 * its lock is held. Each child is judged from outside, with a deadline. */
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "arena/arena_internal.h"
#include "gg_test.h"

#define MiB        ((size_t)1 << 20)
#define CHURNERS   3
#define FORKS      100
#define DEADLINE_S 20

static atomic_bool stop;
static atomic_int loops;
static gg_arena_t *shared;

static gg_arena_options_t small_arena(const char *name) {
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.capacity = 16 * MiB, o.chunk_size = MiB, o.name = name;
  return o;
}

/* Creates and destroys arenas as fast as it can, using each a little (scope, blocks, trim). */
static void *churn(void *arg) {
  (void)arg;
  gg_arena_options_t o = small_arena("churn");
  while (!atomic_load(&stop)) {
    gg_arena_t *a = NULL;
    if (gg_arena_create(&a, &o) < 0) continue;
    gg_scope_t sc;
    void *p;
    if (gg_scope_begin(a, &sc) == 0) {
      for (int i = 0; i < 4; i++) gg_alloc(a, 4096 * (size_t)(i + 1), &p);
      gg_scope_end(&sc);
    }
    if (gg_alloc(a, 300000, &p) == 0) gg_free(a, p);
    gg_arena_trim(a, 0);
    gg_arena_destroy(a);
    atomic_fetch_add(&loops, 1);
  }
  return NULL;
}

/* Allocates and frees on one long-lived arena. */
static void *use_shared(void *arg) {
  (void)arg;
  gg_arena_stats_t s;
  for (unsigned i = 0; !atomic_load(&stop); i++) {
    void *p;
    if (gg_alloc(shared, 256 * (1 + i % 64), &p) == 0) gg_free(shared, p);
    if (i % 16 == 0) gg_arena_stats(shared, &s);
  }
  return NULL;
}

/* Reads every live arena's figures the way reports do, lingering a little on each. */
static int report_one(gg_arena_t *a, void *user) {
  (void)user;
  gg_arena_stats_t s;
  gg_arena_stats(a, &s);
  struct timespec nap = {0, 200000};
  nanosleep(&nap, NULL);
  return 0;
}

/* Between walks it pauses outside the lock: a mutex is not fair, and on a machine with many cores a
 * reporter that takes the lock again at once starves the churners (seen on a 16-core host: no arena
 * created for 40 s, so the test waited for churn that never came). */
static void *reporter(void *arg) {
  (void)arg;
  struct timespec pause = {0, 300000};
  while (!atomic_load(&stop)) {
    gg__arena_foreach_live(report_one, NULL);
    nanosleep(&pause, NULL);
  }
  return NULL;
}

/* The child's whole life: it must not hang on a lock another parent thread held at fork(). */
static int child_main(void) {
  gg_arena_options_t o = small_arena("child");
  gg_arena_t *a = NULL;
  void *p = NULL;
  int rc = gg_arena_create(&a, &o);
  if (rc == 0) rc = gg_alloc(a, 1000, &p);
  if (rc == 0) rc = gg_free(a, p);
  if (rc == 0) rc = gg_arena_destroy(a);
  if (rc != 0) {
    const char *m = gg_last_error();
    ssize_t ignored = write(2, m, strlen(m));
    (void)ignored;
  }
  return rc == 0 ? 0 : 1;
}

/* Waits for the child until the deadline; a child still running then is killed and reported. */
static void judge_child(pid_t pid, int n) {
  struct timespec nap = {0, 1000000};
  int status = 0;
  for (long waited_ms = 0;; waited_ms++) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    assert_int_equal(r, 0);
    if (waited_ms > DEADLINE_S * 1000L) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      atomic_store(&stop, true);
      fail_msg("fork %d: the child hung (a lock held at fork() was never released in it)", n);
    }
    nanosleep(&nap, NULL);
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    fail_msg("fork %d: the child failed (status %#x)", n, status);
}

static void test_fork_while_threads_allocate(void **state) {
  (void)state;
  setenv("GPUGUARD_BACKEND", "host", 1);
  gg_arena_options_t o = small_arena("shared");
  gg_assert_ok(gg_arena_create(&shared, &o));
  pthread_t t[CHURNERS + 2];
  for (int i = 0; i < CHURNERS; i++) assert_int_equal(pthread_create(&t[i], NULL, churn, NULL), 0);
  assert_int_equal(pthread_create(&t[CHURNERS], NULL, use_shared, NULL), 0);
  assert_int_equal(pthread_create(&t[CHURNERS + 1], NULL, reporter, NULL), 0);
  for (int n = 0; n < FORKS; n++) {
    int before = atomic_load(&loops);
    while (atomic_load(&loops) == before) sched_yield(); /* fork in the middle of the churn */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) _exit(child_main());
    judge_child(pid, n);
  }
  atomic_store(&stop, true);
  for (int i = 0; i < CHURNERS + 2; i++) assert_int_equal(pthread_join(t[i], NULL), 0);
  gg_assert_ok(gg_arena_destroy(shared));
}

/* The sanitizers' own allocators take locks that this compiler's runtimes do not take around
 * fork(): a child forked while another thread is in malloc can hang inside the sanitizer (seen with
 * ASan: the child waits in its size-class allocator's lock), whatever the library does. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define GG_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define GG_SANITIZED 1
#endif
#endif

int main(void) {
#ifdef GG_SANITIZED
  printf("SKIP: a sanitizer's allocator is not fork-safe while other threads allocate\n");
  return GG_TEST_SKIP;
#endif
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fork_while_threads_allocate),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
