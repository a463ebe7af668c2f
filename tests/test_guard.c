/* test_guard.c — the guard's registry in one process: LIFO order, cancel, bad input, re-entrant
 * calls from cleanups, handler install and restore, attached objects, crash hooks, fork, and
 * injected driver faults. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gg_test.h"
#include "guard/guard_internal.h"
#include "guard/signal_internal.h"
#include "core/internal.h"

static int setup(void **state) {
  (void)state;
  gg_test_use_host(NULL, NULL);
  unsetenv("GPUGUARD_LEAK_REPORT");
  return 0;
}

/* Cleanups record their order here. */
static char order[64];
static void rec(void *user) {
  size_t n = strlen(order);
  if (n + 1 < sizeof order) order[n] = *(const char *)user, order[n + 1] = '\0';
}

static gg_guard_t *quiet_guard(void) {
  gg_guard_options_t o;
  gg_guard_options_init(&o);
  o.signals = 0, o.run_at_exit = false;
  gg_guard_t *g = NULL;
  gg_assert_ok(gg_guard_create(&g, &o));
  return g;
}

static void test_options_defaults(void **state) {
  (void)state;
  gg_guard_options_t o;
  memset(&o, 0x5a, sizeof o);
  gg_guard_options_init(&o);
  assert_int_equal(o.device, 0);
  assert_null(o.backend);
  assert_int_equal(o.signals, GG_GUARD_SIGNALS_ALL);
  assert_true(o.run_at_exit);
  assert_false(o.reset_context);
  assert_int_equal(o.teardown_timeout_ms, 10000);
  assert_null(o.leak_report);
  assert_null(o.name);
  gg_guard_options_init(NULL); /* no-op */
}

static void test_lifo_order(void **state) {
  (void)state;
  gg_guard_t *g = NULL;
  gg_assert_ok(gg_guard_create(&g, NULL)); /* defaults: every signal, at exit */
  order[0] = '\0';
  static const char *names = "abcde";
  for (int i = 0; i < 5; i++)
    gg_assert_ok(gg_guard_on_teardown(g, rec, (void *)(names + i), "rec"));
  gg_assert_ok(gg_guard_destroy(g));
  assert_string_equal(order, "edcba");
}

static void test_cancel(void **state) {
  (void)state;
  gg_guard_t *g = quiet_guard();
  order[0] = '\0';
  unsigned long long a, b, c;
  gg_assert_ok(gg_guard_on_teardown_ex(g, rec, "a", "a", &a));
  gg_assert_ok(gg_guard_on_teardown_ex(g, rec, "b", "b", &b));
  gg_assert_ok(gg_guard_on_teardown_ex(g, rec, "c", NULL, &c));
  assert_true(a != 0 && a < b && b < c);
  gg_assert_ok(gg_guard_cancel(g, b));
  gg_assert_fails(gg_guard_cancel(g, b), GG_ENOTFOUND, "cancelled already");
  gg_assert_fails(gg_guard_cancel(g, 0), GG_EINVAL, "id 0");
  gg_assert_fails(gg_guard_cancel(g, c + 1000), GG_ENOTFOUND, "no registration");
  gg_assert_ok(gg_guard_destroy(g));
  assert_string_equal(order, "ca");
}

static void test_bad_input(void **state) {
  (void)state;
  gg_assert_fails(gg_guard_create(NULL, NULL), GG_EINVAL, "guard is NULL");
  gg_assert_ok(gg_guard_destroy(NULL));
  gg_assert_fails(gg_guard_on_teardown(NULL, rec, "x", "x"), GG_EINVAL, "guard is NULL");
  gg_guard_t *g = quiet_guard();
  gg_assert_fails(gg_guard_on_teardown(g, NULL, "x", "x"), GG_EINVAL, "fn is NULL");
  gg_assert_fails(gg_guard_cancel(NULL, 1), GG_EINVAL, "guard is NULL");
  gg_assert_ok(gg_guard_destroy(g));
  /* The handle is checked against the live guards, never dereferenced: destroy twice, use after. */
  gg_assert_fails(gg_guard_destroy(g), GG_EINVAL, "not a live guard");
  gg_assert_fails(gg_guard_on_teardown(g, rec, "x", "x"), GG_EINVAL, "not a live guard");
  gg_assert_fails(gg_guard_cancel(g, 1), GG_EINVAL, "not a live guard");
  int on_stack;
  gg_assert_fails(gg_guard_destroy((gg_guard_t *)&on_stack), GG_EINVAL, "not a live guard");
}

static void test_bad_options(void **state) {
  (void)state;
  gg_guard_t *g = (gg_guard_t *)0x1;
  gg_guard_options_t o;
  gg_guard_options_init(&o);
  o.signals = 0x10000;
  gg_assert_fails(gg_guard_create(&g, &o), GG_EINVAL, "options.signals=0x10000");
  gg_guard_options_init(&o);
  o.teardown_timeout_ms = -1;
  gg_assert_fails(gg_guard_create(&g, &o), GG_EINVAL, "teardown_timeout_ms=-1");
  gg_guard_options_init(&o);
  o.device = -2;
  gg_assert_fails(gg_guard_create(&g, &o), GG_EINVAL, "options.device=-2");
  gg_guard_options_init(&o);
  o.leak_report = "json:";
  gg_assert_fails(gg_guard_create(&g, &o), GG_EINVAL, "options.leak_report='json:'");
  gg_guard_options_init(&o);
  o.backend = "tpu";
  gg_assert_fails(gg_guard_create(&g, &o), GG_EINVAL, "options.backend='tpu'");
  setenv("GPUGUARD_LEAK_REPORT", "text:", 1);
  gg_assert_fails(gg_guard_create(&g, NULL), GG_EINVAL, "GPUGUARD_LEAK_REPORT='text:'");
  unsetenv("GPUGUARD_LEAK_REPORT");
  assert_ptr_equal(g, (gg_guard_t *)0x1); /* untouched on failure */
}

/* Calls from inside a cleanup, once the teardown has begun. */
static gg_guard_t *inner_guard;
static int inner_rc[3];
static void reentrant(void *user) {
  (void)user;
  inner_rc[0] = gg_guard_on_teardown(inner_guard, rec, "z", "late");
  inner_rc[1] = gg_guard_cancel(inner_guard, 1);
  inner_rc[2] = gg_guard_destroy(inner_guard);
}

static void test_calls_during_teardown(void **state) {
  (void)state;
  inner_guard = quiet_guard();
  order[0] = '\0';
  gg_assert_ok(gg_guard_on_teardown(inner_guard, rec, "a", "a"));
  gg_assert_ok(gg_guard_on_teardown(inner_guard, reentrant, NULL, "reentrant"));
  gg_assert_ok(gg_guard_destroy(inner_guard));
  assert_int_equal(inner_rc[0], GG_ESTATE);
  assert_int_equal(inner_rc[1], GG_ESTATE);
  assert_int_equal(inner_rc[2], GG_ESTATE);
  assert_string_equal(order, "a"); /* the late registration did not run */
}

static void user_term(int sig) { (void)sig; }
static void other_term(int sig) { (void)sig; }

typedef void (*handler_t)(int);
static handler_t current_handler(int sig) {
  struct sigaction cur;
  sigaction(sig, NULL, &cur);
  return (cur.sa_flags & SA_SIGINFO) ? (handler_t)(void (*)(void))cur.sa_sigaction : cur.sa_handler;
}

static void test_handlers_saved_and_restored(void **state) {
  (void)state;
  struct sigaction user, saved_term, saved_hup;
  memset(&user, 0, sizeof user);
  user.sa_handler = user_term;
  sigaction(SIGTERM, &user, &saved_term);
  signal(SIGHUP, SIG_IGN);
  sigaction(SIGHUP, NULL, &saved_hup);

  gg_guard_t *a = NULL, *b = NULL;
  gg_assert_ok(gg_guard_create(&a, NULL));
  assert_true(current_handler(SIGTERM) != user_term);
  assert_true(current_handler(SIGHUP) == SIG_IGN); /* ignored: left alone */
  gg_assert_ok(gg_guard_create(&b, NULL));
  gg_assert_ok(gg_guard_destroy(a));
  assert_true(current_handler(SIGTERM) != user_term); /* b still uses it */
  gg_assert_ok(gg_guard_destroy(b));
  assert_true(current_handler(SIGTERM) == user_term);
  assert_true(current_handler(SIGHUP) == SIG_IGN);

  /* Someone replaces our handler while the guard lives: theirs stays after destroy. */
  gg_assert_ok(gg_guard_create(&a, NULL));
  struct sigaction other;
  memset(&other, 0, sizeof other);
  other.sa_handler = other_term;
  sigaction(SIGTERM, &other, NULL);
  gg_assert_ok(gg_guard_destroy(a));
  assert_true(current_handler(SIGTERM) == other_term);

  /* signals = 0 touches nothing. */
  a = quiet_guard();
  assert_true(current_handler(SIGTERM) == other_term);
  gg_assert_ok(gg_guard_destroy(a));
  sigaction(SIGTERM, &saved_term, NULL);
  signal(SIGHUP, SIG_DFL);
}

static void test_fault_on_open(void **state) {
  (void)state;
  handler_t before = current_handler(SIGINT);
  gg_assert_ok(gg_host_fault_set("open:1"));
  gg_guard_t *g = NULL;
  gg_assert_fails(gg_guard_create(&g, NULL), GG_EDRIVER, "injected fault in 'open'");
  assert_null(g);
  assert_true(current_handler(SIGINT) == before); /* nothing installed */
  gg_assert_ok(gg_guard_create(&g, NULL));        /* the fault was one-shot */
  gg_assert_ok(gg_guard_destroy(g));
  gg_host_fault_set(NULL);
}

static void test_context_reset(void **state) {
  (void)state;
  gg_guard_options_t o;
  gg_guard_options_init(&o);
  o.signals = 0, o.reset_context = true;
  gg_guard_t *g = NULL;
  gg_assert_ok(gg_host_fault_set(NULL));
  gg_assert_ok(gg_guard_create(&g, &o));
  gg_assert_ok(gg_guard_destroy(g));
  assert_int_equal(gg_host_op_count("ctx_reset"), 1);
  /* A failing reset is reported, but the cleanups ran and the handle is gone. */
  gg_assert_ok(gg_host_fault_set("ctx_reset:1"));
  gg_assert_ok(gg_guard_create(&g, &o));
  order[0] = '\0';
  gg_assert_ok(gg_guard_on_teardown(g, rec, "a", "a"));
  gg_assert_fails(gg_guard_destroy(g), GG_EDRIVER, "ctx_reset");
  assert_string_equal(order, "a");
  gg_assert_fails(gg_guard_destroy(g), GG_EINVAL, "not a live guard");
  /* Without the option, no reset. */
  gg_assert_ok(gg_host_fault_set(NULL));
  g = quiet_guard();
  gg_assert_ok(gg_guard_destroy(g));
  assert_int_equal(gg_host_op_count("ctx_reset"), 0);
}

/* Attached objects (what arenas do): torn down with the cleanups, LIFO; detach removes them. */
static int fake_teardowns;
static void fake_teardown(void *obj) {
  fake_teardowns++;
  rec(obj);
}
static const gg__attach_ops_t fake_ops = {"arena", fake_teardown, NULL, NULL, NULL};

static void test_attach_detach(void **state) {
  (void)state;
  unsigned long long t0, t1, t2;
  gg_assert_ok(gg__guard_attach("host", 0, &fake_ops, "x", &t0));
  assert_int_equal(t0, 0); /* no guard: nothing to attach to */
  gg_guard_t *g = quiet_guard();
  order[0] = '\0', fake_teardowns = 0;
  gg_assert_ok(gg_guard_on_teardown(g, rec, "a", "a"));
  gg_assert_ok(gg__guard_attach("host", 0, &fake_ops, "m", &t1));
  gg_assert_ok(gg__guard_attach("host", 0, &fake_ops, "n", &t2));
  assert_true(t1 != 0 && t2 != 0);
  gg_assert_ok(gg__guard_attach("host", 1, &fake_ops, "x", &t0));
  assert_int_equal(t0, 0); /* another device */
  gg_assert_ok(gg__guard_attach("cuda", 0, &fake_ops, "x", &t0));
  assert_int_equal(t0, 0); /* another backend */
  assert_int_equal(gg__guard_detach(t2), 1);
  assert_int_equal(gg__guard_detach(t2), 0);
  gg_assert_ok(gg_guard_destroy(g));
  assert_string_equal(order, "ma");
  assert_int_equal(fake_teardowns, 1);
  assert_int_equal(gg__guard_detach(t1), 0); /* torn down already: nothing to remove */
  assert_int_equal(gg__guard_detach(0), 0);
}

static char hook_order[16];
static void hook(int sig, void *user) {
  size_t n = strlen(hook_order);
  hook_order[n] = *(const char *)user, hook_order[n + 1] = '\0';
  assert_int_equal(sig, SIGTERM);
}

static void test_crash_hooks(void **state) {
  (void)state;
  int s1, s2, s3, slots[GG__CRASH_HOOKS_MAX];
  /* Hooks already there: the process part's fatal kill, added by the first guard of this process.
   * */
  int builtin = gg__crash_hooks_run(SIGTERM);
  gg_assert_ok(gg__crash_hook_add(hook, "1", &s1));
  gg_assert_ok(gg__crash_hook_add(hook, "2", &s2));
  gg_assert_ok(gg__crash_hook_add(hook, "3", &s3));
  gg__crash_hook_remove(s2);
  hook_order[0] = '\0';
  assert_int_equal(gg__crash_hooks_run(SIGTERM), builtin + 2);
  assert_string_equal(hook_order, "31"); /* newest first */
  int n = 0;
  while (n < GG__CRASH_HOOKS_MAX && gg__crash_hook_add(hook, "x", &slots[n]) == 0) n++;
  assert_int_equal(n, GG__CRASH_HOOKS_MAX - 2 - builtin);
  gg_assert_fails(gg__crash_hook_add(hook, "x", &s2), GG_ENOMEM, "slots are taken");
  for (int i = 0; i < n; i++) gg__crash_hook_remove(slots[i]);
  gg__crash_hook_remove(s1), gg__crash_hook_remove(s3);
  gg__crash_hook_remove(-1), gg__crash_hook_remove(GG__CRASH_HOOKS_MAX);
  assert_int_equal(gg__crash_hooks_run(SIGTERM), builtin);
}

static void test_fork_refuses(void **state) {
  (void)state;
  gg_guard_t *g = NULL;
  gg_assert_ok(gg_guard_create(&g, NULL));
  order[0] = '\0';
  gg_assert_ok(gg_guard_on_teardown(g, rec, "p", "parent"));
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    int bad = 0;
    bad |= gg_guard_on_teardown(g, rec, "c", "child") != GG_ESTATE;
    bad |= (gg_guard_cancel(g, 1) != GG_ESTATE) << 1;
    bad |= (gg_guard_destroy(g) != GG_ESTATE) << 2;
    bad |= (strstr(gg_last_error(), "before fork()") == NULL) << 3;
    bad |= (order[0] != '\0') << 4;
    /* A guard of its own works in the child (TSan cannot start threads after a multi-threaded
     * fork). */
#ifndef __SANITIZE_THREAD__
    gg_guard_t *mine = NULL;
    bad |= (gg_guard_create(&mine, NULL) != 0) << 5;
    bad |= (gg_guard_on_teardown(mine, rec, "k", "kid") != 0) << 6;
    bad |= (gg_guard_destroy(mine) != 0) << 7;
    bad |= (strcmp(order, "k") != 0) << 8;
#endif
    _exit(bad ? 100 + (bad & 0x1f) : 0);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
  gg_assert_ok(gg_guard_destroy(g));
  assert_string_equal(order, "p");
}

/* Threads registering and cancelling while another destroys: each cleanup runs at most once, and
 * late calls fail cleanly. */
static gg_guard_t *race_guard;
static atomic_int race_runs;
static void race_cleanup(void *user) {
  (void)user;
  atomic_fetch_add(&race_runs, 1);
}
static void *race_worker(void *arg) {
  long *registered = arg;
  for (int i = 0; i < 2000; i++) {
    unsigned long long id;
    int rc = gg_guard_on_teardown_ex(race_guard, race_cleanup, NULL, "race", &id);
    if (rc != 0) {
      if (rc != GG_ESTATE && rc != GG_EINVAL) fail_msg("on_teardown: %s", gg_err_name(rc));
      break;
    }
    (*registered)++;
    if (i % 2 == 0 && gg_guard_cancel(race_guard, id) == 0) (*registered)--;
  }
  return NULL;
}

static void test_threads_register_while_destroying(void **state) {
  (void)state;
  for (int round = 0; round < 20; round++) {
    race_guard = quiet_guard();
    atomic_store(&race_runs, 0);
    pthread_t t[3];
    long registered[3] = {0, 0, 0};
    for (int i = 0; i < 3; i++) pthread_create(&t[i], NULL, race_worker, &registered[i]);
    gg_guard_t *victim = race_guard;
    gg_assert_ok(gg_guard_destroy(victim));
    for (int i = 0; i < 3; i++) pthread_join(t[i], NULL);
    /* Everything registered and not cancelled ran, exactly once. */
    assert_int_equal(atomic_load(&race_runs), registered[0] + registered[1] + registered[2]);
  }
}

static void *prepare_in_thread(void *arg) {
  (void)arg;
  int bad = gg_guard_prepare_thread() != 0 || gg_guard_prepare_thread() != 0;
  stack_t st;
  sigaltstack(NULL, &st);
  bad |= (st.ss_flags & SS_DISABLE) != 0;
  return (void *)(intptr_t)bad;
}

static void test_prepare_thread(void **state) {
  (void)state;
  pthread_t t;
  void *bad = (void *)1;
  pthread_create(&t, NULL, prepare_in_thread, NULL);
  pthread_join(t, &bad);
  assert_null(bad);
}

/* ---- a cleanup that calls exit(): the later cleanups must still run ---- */

static int exit_pipe = -1;
static void note_and_go_on(void *user) {
  ssize_t w = write(exit_pipe, user, 1);
  (void)w;
}
static void note_and_exit(void *user) {
  note_and_go_on(user);
  exit(7);
}

/* The child, a fresh exec of this program (a fork of the threaded suite may not start threads under
 * TSan): cleanups A, B (calls exit(7)), C registered in that order; the guard is ended by destroy
 * or by exit(0). Each cleanup writes its letter to fd. */
static int exit_cleanup_child(const char *how, int fd) {
  exit_pipe = fd;
  gg_guard_options_t o;
  gg_guard_options_init(&o);
  o.run_at_exit = strcmp(how, "destroy-no-exit-path") != 0, o.signals = 0;
  gg_guard_t *g = NULL;
  if (gg_guard_create(&g, &o) != 0) return 70;
  gg_guard_on_teardown(g, note_and_go_on, "A", "a");
  gg_guard_on_teardown(g, note_and_exit, "B", "b");
  gg_guard_on_teardown(g, note_and_go_on, "C", "c");
  if (strncmp(how, "destroy", 7) == 0) gg_guard_destroy(g);
  exit(0);
}

/* Runs the child for `how`; returns what ran, in order, and its exit status. */
static void run_exit_cleanup(const char *how, char *ran, size_t cap, int *status) {
  int p[2];
  assert_int_equal(pipe(p), 0);
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    close(p[0]);
    char fd[16];
    snprintf(fd, sizeof fd, "%d", p[1]);
    execl("/proc/self/exe", "test_guard", "--exit-cleanup-child", how, fd, (char *)NULL);
    _exit(71);
  }
  close(p[1]);
  size_t n = 0;
  ssize_t r;
  while (n + 1 < cap && (r = read(p[0], ran + n, cap - 1 - n)) > 0) n += (size_t)r;
  ran[n] = '\0';
  close(p[0]);
  assert_int_equal(waitpid(pid, status, 0), pid);
}

static void test_cleanup_calling_exit(void **state) {
  (void)state;
  char ran[16];
  int st;
  /* The destroy path: B's exit() finishes the teardown, so A still runs, once. */
  run_exit_cleanup("destroy", ran, sizeof ran, &st);
  assert_string_equal(ran, "CBA");
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 7);
  run_exit_cleanup("destroy-no-exit-path", ran, sizeof ran,
                   &st); /* a guard that skips the exit path */
  assert_string_equal(ran, "CBA");
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 7);
  /* The exit path: exit(0) runs C, B calls exit(7) from inside it, A still runs. */
  run_exit_cleanup("exit", ran, sizeof ran, &st);
  assert_string_equal(ran, "CBA");
  assert_true(WIFEXITED(st));
}

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "--exit-cleanup-child") == 0) {
    setenv("GPUGUARD_BACKEND", "host", 1);
    return exit_cleanup_child(argv[2], atoi(argv[3]));
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_options_defaults, setup),
      cmocka_unit_test_setup(test_lifo_order, setup),
      cmocka_unit_test_setup(test_cancel, setup),
      cmocka_unit_test_setup(test_bad_input, setup),
      cmocka_unit_test_setup(test_bad_options, setup),
      cmocka_unit_test_setup(test_calls_during_teardown, setup),
      cmocka_unit_test_setup(test_handlers_saved_and_restored, setup),
      cmocka_unit_test_setup(test_fault_on_open, setup),
      cmocka_unit_test_setup(test_context_reset, setup),
      cmocka_unit_test_setup(test_attach_detach, setup),
      cmocka_unit_test_setup(test_crash_hooks, setup),
      cmocka_unit_test_setup(test_fork_refuses, setup),
      cmocka_unit_test_setup(test_threads_register_while_destroying, setup),
      cmocka_unit_test_setup(test_prepare_thread, setup),
      cmocka_unit_test_setup(test_cleanup_calling_exit, setup),
  };
  return cmocka_run_group_tests_name("guard", tests, NULL, NULL);
}
