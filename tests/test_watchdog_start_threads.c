/* test_watchdog_start_threads.c — the first guard of a process starts the watchdog and guard
 * threads; when either cannot start (injected EAGAIN), gg_guard_create fails with GG_ENOMEM naming
 * the thread and leaves no thread and no descriptor behind, and a later create starts them cleanly
 * (a leftover watchdog once sat on a lock the next start initialised again).
 * Own program: the threads start once per process. Labelled `threads` (TSan sees a lock
 * reinitialised under a waiting thread). */
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gg_test.h"
#include "guard/signal_internal.h"

static int count_entries(const char *path) {
  DIR *d = opendir(path);
  assert_non_null(d);
  int n = 0;
  const struct dirent *e;
  while ((e = readdir(d)))
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

static void create_fails_cleanly(int nth, const char *which) {
  int threads = count_entries("/proc/self/task"), fds = count_entries("/proc/self/fd");
  gg_guard_options_t o;
  gg_guard_options_init(&o);
  o.backend = "host";
  gg_guard_t *g = NULL;
  gg__sig_test_fail_start(nth);
  gg_assert_fails(gg_guard_create(&g, &o), GG_ENOMEM, which);
  gg__sig_test_fail_start(0);
  assert_null(g);
  assert_int_equal(count_entries("/proc/self/task"), threads); /* no watchdog left waiting */
  assert_int_equal(count_entries("/proc/self/fd"), fds);       /* the signal pipe closed */
}

static void *nothing(void *arg) { return arg; }

static void test_start_failures_leave_nothing(void **state) {
  (void)state;
  /* ThreadSanitizer starts a thread of its own at the first pthread_create: let it, before
   * counting. */
  pthread_t warm;
  assert_int_equal(pthread_create(&warm, NULL, nothing, NULL), 0);
  pthread_join(warm, NULL);
  create_fails_cleanly(1, "cannot start the watchdog thread");
  create_fails_cleanly(2, "cannot start the guard thread");
  create_fails_cleanly(2,
                       "cannot start the guard thread"); /* again: the retry path itself is clean */

  /* Then a guard starts, and a SIGTERM is torn down and honoured as usual (the threads work). */
  int threads = count_entries("/proc/self/task");
  pid_t kid = fork();
  if (kid == 0) {
    gg_guard_options_t o;
    gg_guard_options_init(&o);
    o.backend = "host";
    gg_guard_t *g = NULL;
    if (gg_guard_create(&g, &o) != 0) _exit(3);
    raise(SIGTERM);
    for (;;) pause();
  }
  int st = 0;
  assert_int_equal(waitpid(kid, &st, 0), kid);
  assert_true(WIFSIGNALED(st));
  assert_int_equal(WTERMSIG(st), SIGTERM);
  gg_guard_options_t o;
  gg_guard_options_init(&o);
  o.backend = "host";
  gg_guard_t *g = NULL;
  gg_assert_ok(gg_guard_create(&g, &o));
  assert_int_equal(count_entries("/proc/self/task"), threads + 2); /* watchdog and guard thread */
  gg_assert_ok(gg_guard_destroy(g));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_start_failures_leave_nothing),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
