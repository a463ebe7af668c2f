/* test_fork_threads.c — fork() on one thread while others spawn, allocate and tear down: no
 * deadlock (once, spawn held the process-set lock and waited for the guard list's, while the fork
 * handlers took them in the other order). Every lock the fork handler takes is used in each child.
 * */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gg_test.h"
#include "guard/signal_internal.h"

#define FORKS 300
/* A deadlock never ends; a healthy run takes seconds (a minute or more under TSan). */
#define LIMIT_MS 200000

static atomic_bool stop;

static void noop(void *user) { (void)user; }
static void unused_hook(int sig, void *user) { (void)sig, (void)user; }

/* In each forked child: every global lock of the library once, then out. A lock left held by the
 * fork would hang here. Threads are not started (TSan does not support that after a multithreaded
 * fork). */
/* A sanitizer's allocator takes locks its runtime does not take around fork(): a child that
 * allocates while another parent thread was inside malloc can hang in the sanitizer itself
 * (test_arena_fork.c). */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define GG_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define GG_SANITIZED 1
#endif
#endif

static void child_uses_every_lock(void) {
  char session[40];
  gg_registry_session(session, sizeof session); /* session registry */
  int slot;
  if (gg__crash_hook_add(unused_hook, NULL, &slot) == 0)
    gg__crash_hook_remove(slot);           /* hook table */
  gg_proc_teardown(NULL, 0);               /* process sets */
  gg_guard_cancel((gg_guard_t *)&slot, 1); /* live-guard list (refused: not a guard) */
#ifndef GG_SANITIZED
  gg_arena_options_t o; /* arena globals (live list, quarantine) and the host device's lock */
  gg_arena_options_init(&o);
  o.backend = "host", o.capacity = 8u << 20;
  gg_arena_t *a = NULL;
  void *p = NULL;
  if (gg_arena_create(&a, &o) != 0 || gg_alloc(a, 4096, &p) != 0 || gg_free(a, p) != 0 ||
      gg_arena_destroy(a) != 0)
    _exit(3);
#endif
  _exit(0);
}

static void *forker(void *arg) {
  int *failures = arg;
  for (int i = 0; i < FORKS; i++) {
    pid_t pid = fork();
    if (pid == 0) child_uses_every_lock();
    if (pid < 0) {
      (*failures)++;
      continue;
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) (*failures)++;
  }
  atomic_store(&stop, true);
  return NULL;
}

static void *spawner(void *arg) {
  gg_guard_t *g = arg;
  const char *const argv[] = {"true", NULL};
  while (!atomic_load(&stop)) {
    pid_t pid;
    if (gg_proc_spawn(g, argv, NULL, &pid) == 0) gg_proc_teardown(g, 0);
  }
  return NULL;
}

static void *allocator(void *arg) {
  (void)arg;
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.backend = "host", o.capacity = 16 << 20;
  while (!atomic_load(&stop)) {
    gg_arena_t *a = NULL;
    if (gg_arena_create(&a, &o) != 0) continue;
    for (int i = 0; i < 64; i++) {
      void *p;
      if (gg_alloc(a, 4096 + (size_t)i * 512, &p) == 0) gg_free(a, p);
    }
    gg_arena_destroy(a);
  }
  return NULL;
}

static void *tearer(void *arg) {
  (void)arg;
  gg_guard_options_t o;
  gg_guard_options_init(&o);
  o.backend = "host", o.signals = 0, o.run_at_exit = false;
  while (!atomic_load(&stop)) {
    gg_guard_t *g = NULL;
    if (gg_guard_create(&g, &o) != 0) continue;
    gg_guard_on_teardown(g, noop, NULL, "noop");
    gg_guard_destroy(g);
  }
  return NULL;
}

/* The whole run, in a child of the test so that a deadlock is seen as a timeout, not a hung suite.
 * */
static int stress(void) {
  gg_guard_options_t o;
  gg_guard_options_init(&o);
  o.backend = "host", o.signals = 0, o.run_at_exit = false;
  gg_guard_t *g = NULL;
  if (gg_guard_create(&g, &o) != 0) return 3;
  int failures = 0;
  pthread_t t[5];
  pthread_create(&t[0], NULL, spawner, g);
  pthread_create(&t[1], NULL, spawner, g);
  pthread_create(&t[2], NULL, allocator, NULL);
  pthread_create(&t[3], NULL, tearer, NULL);
  pthread_create(&t[4], NULL, forker, &failures);
  for (int i = 0; i < 5; i++) pthread_join(t[i], NULL);
  gg_guard_destroy(g);
  return failures ? 4 : 0;
}

static void test_fork_while_spawning_allocating_tearing_down(void **state) {
  (void)state;
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) _exit(stress());
  assert_true(pid > 0);
  int st = 0;
  struct timespec ten_ms = {0, 10 * 1000 * 1000}, t0, now;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  while (waitpid(pid, &st, WNOHANG) == 0) {
    clock_gettime(CLOCK_MONOTONIC, &now);
    if ((now.tv_sec - t0.tv_sec) * 1000 >= LIMIT_MS) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      fail_msg("fork() in a loop beside spawn, alloc and teardown threads did not finish in %d s: "
               "deadlock",
               LIMIT_MS / 1000);
    }
    nanosleep(&ten_ms, NULL);
  }
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0); /* 4: a forked child did not exit cleanly */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fork_while_spawning_allocating_tearing_down),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
