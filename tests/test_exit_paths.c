/* test_exit_paths.c — every exit path of a guarded program, judged from outside: each path runs in
 * a child (exit_child) with and without a guard; the guarded run must end with the same status, and
 * its cleanups must have run exactly once, LIFO (fatal paths: crash hooks only). */
#include "exit_harness.h"
#include "gg_test.h"

#define CHILD     GG_TEST_BINARY_DIR "/exit_child"
#define CHILD_CXX GG_TEST_BINARY_DIR "/exit_child_cxx"

/* exit code, or minus the terminating signal */
static int outcome(int st) {
  return WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? -WTERMSIG(st) : 1000;
}

/* Runs a path without gpuguard and returns its outcome: what the guarded run must match. */
static int baseline(const char *prog, const char *mode, const int *sigs, int nsigs,
                    const char *const *env) {
  gg_child_t c;
  gg_child_start(&c, prog, mode, false, env);
  assert_true(gg_child_ready(&c));
  for (int i = 0; i < nsigs; i++) gg_child_kill(&c, sigs[i]);
  assert_true(gg_child_wait(&c, GG_H_DEADLINE_MS));
  gg_child_cleanup(&c);
  return outcome(c.status);
}

static void expect_status(const gg_child_t *c, int want) {
  if (outcome(c->status) != want)
    fail_msg("child ended with %s (wanted outcome %d); its stderr:\n%s", gg_h_status(c->status),
             want, gg_child_stderr(c));
}

/* Cleanups B then A, each exactly once. */
static void expect_lifo_once(const gg_child_t *c) {
  assert_int_equal(gg_child_count(c, "cleanup A"), 1);
  assert_int_equal(gg_child_count(c, "cleanup B"), 1);
  assert_true(gg_child_pos(c, "cleanup B") < gg_child_pos(c, "cleanup A"));
}

static void run_plain(const char *mode, int want) {
  assert_int_equal(baseline(CHILD, mode, NULL, 0, NULL), want);
  gg_child_t c;
  gg_child_start(&c, CHILD, mode, true, NULL);
  assert_true(gg_child_ready(&c));
  assert_true(gg_child_wait(&c, GG_H_DEADLINE_MS));
  expect_status(&c, want);
  expect_lifo_once(&c);
  assert_int_equal(gg_child_count(&c, "crash-hook exit"), 0);
  gg_child_cleanup(&c);
}

static void test_return(void **state) { (void)state, run_plain("return", 0); }
static void test_exit3(void **state) { (void)state, run_plain("exit3", 3); }

static void run_fatal(const char *mode, int sig, const char *needle) {
  assert_int_equal(baseline(CHILD, mode, NULL, 0, NULL), -sig);
  gg_child_t c;
  gg_child_start(&c, CHILD, mode, true, NULL);
  assert_true(gg_child_ready(&c));
  assert_true(gg_child_wait(&c, GG_H_DEADLINE_MS));
  expect_status(&c, -sig);
  /* Only async-signal-safe work: the crash hook ran once; cleanups did not run. */
  char hook[64];
  snprintf(hook, sizeof hook, "crash-hook %s", needle);
  assert_int_equal(gg_child_count(&c, hook), 1);
  assert_int_equal(gg_child_count(&c, "cleanup A"), 0);
  assert_int_equal(gg_child_count(&c, "cleanup B"), 0);
  char report[96];
  snprintf(report, sizeof report, "gpuguard: fatal signal %s", needle);
  if (!strstr(gg_child_stderr(&c), report))
    fail_msg("no '%s' on stderr:\n%s", report, gg_child_stderr(&c));
  printf("  %s: %s; stderr: %s", mode, gg_h_status(c.status), gg_child_stderr(&c));
  gg_child_cleanup(&c);
}

static void test_abort(void **state) { (void)state, run_fatal("abort", SIGABRT, "SIGABRT"); }
static void test_segv(void **state) {
  (void)state;
  run_fatal("segv", SIGSEGV, "SIGSEGV");
}

static void run_signal(const char *mode, int sig) {
  assert_int_equal(baseline(CHILD, mode, &sig, 1, NULL), -sig);
  gg_child_t c;
  gg_child_start(&c, CHILD, mode, true, NULL);
  assert_true(gg_child_ready(&c));
  gg_child_kill(&c, sig);
  assert_true(gg_child_wait(&c, GG_H_DEADLINE_MS));
  expect_status(&c, -sig);
  expect_lifo_once(&c);
  printf("  %s: ended %.1f ms after the signal\n", strsignal(sig), gg_child_elapsed_ms(&c));
  gg_child_cleanup(&c);
}

static void test_sigterm(void **state) { (void)state, run_signal("wait", SIGTERM); }
static void test_sigint(void **state) { (void)state, run_signal("wait", SIGINT); }
static void test_sighup(void **state) { (void)state, run_signal("wait", SIGHUP); }
static void test_sigquit(void **state) { (void)state, run_signal("wait", SIGQUIT); }

/* A second SIGINT while a cleanup is stuck ends the process at once, with SIGINT. */
static void test_sigint_twice(void **state) {
  (void)state;
  int sig = SIGINT;
  assert_int_equal(baseline(CHILD, "sigint2", &sig, 1, NULL), -SIGINT);
  gg_child_t c;
  const char *env[] = {"GG_CHILD_TIMEOUT_MS=60000", NULL};
  gg_child_start(&c, CHILD, "sigint2", true, env);
  assert_true(gg_child_ready(&c));
  gg_child_kill(&c, SIGINT);
  assert_true(gg_child_wait_line(&c, "cleanup B begin"));
  gg_child_kill(&c, SIGINT);
  assert_true(gg_child_wait(&c, 10000)); /* far below the 60 s teardown limit */
  expect_status(&c, -SIGINT);
  printf("  second SIGINT: ended %.1f ms after it\n", gg_child_elapsed_ms(&c));
  assert_int_equal(gg_child_count(&c, "cleanup B begin"), 1);
  assert_int_equal(gg_child_count(&c, "cleanup A"), 0); /* the teardown was cut short, as asked */
  assert_non_null(strstr(gg_child_stderr(&c), "second SIGINT"));
  gg_child_cleanup(&c);
}

/* A cleanup that hangs cannot keep the process alive past the limit. */
static void test_hanging_cleanup_signal(void **state) {
  (void)state;
  const int limit = 500;
  gg_child_t c;
  const char *env[] = {"GG_CHILD_TIMEOUT_MS=500", NULL};
  gg_child_start(&c, CHILD, "hang", true, env);
  assert_true(gg_child_ready(&c));
  gg_child_kill(&c, SIGTERM);
  assert_true(gg_child_wait(&c, GG_H_DEADLINE_MS));
  double ms = gg_child_elapsed_ms(&c);
  printf("  hanging cleanup, SIGTERM, limit %d ms: the process ended after %.1f ms\n", limit, ms);
  expect_status(&c, -SIGTERM);
  assert_true(ms >= limit - 5);
  assert_true(ms < limit + 2500); /* margin for a loaded machine */
  assert_int_equal(gg_child_count(&c, "cleanup B begin"), 1);
  assert_int_equal(gg_child_count(&c, "cleanup hang returned"), 0);
  assert_int_equal(gg_child_count(&c, "crash-hook SIGTERM"),
                   1); /* children would still be signalled */
  assert_non_null(strstr(gg_child_stderr(&c), "took more than 500 ms"));
  gg_child_cleanup(&c);
}

static void test_hanging_cleanup_exit(void **state) {
  (void)state;
  const int limit = 500;
  gg_child_t c;
  const char *env[] = {"GG_CHILD_TIMEOUT_MS=500", NULL};
  /* The child calls exit() right after saying it is ready, so the exit path may be well under way
   * before a loaded machine wakes this process up: the lower bound counts from before the wait for
   * ready (it can only overstate the time), the upper one from ready. */
  double t0 = gg_h_now_ms();
  gg_child_start(&c, CHILD, "hang-exit", true, env);
  assert_true(gg_child_ready(&c));
  assert_true(gg_child_wait(&c, GG_H_DEADLINE_MS));
  double ms = gg_child_elapsed_ms(&c), since_start = gg_h_now_ms() - t0;
  printf("  hanging cleanup, exit(3), limit %d ms: the process ended after %.1f ms\n", limit, ms);
  expect_status(&c, 3); /* the status exit() was given */
  assert_true(since_start >= limit - 5);
  assert_true(ms < limit + 2500);
  assert_int_equal(gg_child_count(&c, "crash-hook exit"), 1);
  gg_child_cleanup(&c);
}

/* A handler installed before the guard still runs, after the teardown, with the sender's siginfo.
 * */
static void test_previous_handler(void **state) {
  (void)state;
  int sig = SIGTERM;
  assert_int_equal(baseline(CHILD, "handler", &sig, 1, NULL), 5);
  gg_child_t c;
  gg_child_start(&c, CHILD, "handler", true, NULL);
  assert_true(gg_child_ready(&c));
  gg_child_kill(&c, SIGTERM);
  assert_true(gg_child_wait(&c, GG_H_DEADLINE_MS));
  expect_status(&c, 5);
  expect_lifo_once(&c);
  char line[96];
  snprintf(line, sizeof line, "user-handler SIGTERM si_pid=%ld", (long)getpid());
  assert_int_equal(gg_child_count(&c, line), 1);
  assert_true(gg_child_pos(&c, "cleanup A") < gg_child_pos(&c, line)); /* teardown first */
  gg_child_cleanup(&c);
}

/* SIGHUP ignored before the guard stays ignored: the SIGTERM sent after it is what ends the child.
 * */
static void test_sig_ign_respected(void **state) {
  (void)state;
  int sigs[] = {SIGHUP, SIGTERM};
  assert_int_equal(baseline(CHILD, "ignore", sigs, 2, NULL), -SIGTERM);
  gg_child_t c;
  gg_child_start(&c, CHILD, "ignore", true, NULL);
  assert_true(gg_child_ready(&c));
  gg_child_kill(&c, SIGHUP);
  gg_child_kill(&c, SIGTERM);
  assert_true(gg_child_wait(&c, GG_H_DEADLINE_MS));
  expect_status(&c, -SIGTERM);
  expect_lifo_once(&c);
  gg_child_cleanup(&c);
}

/* A signal while other threads are inside guard calls (registry and handler install locks) does not
 * deadlock. */
static void test_signal_during_guard_calls(void **state) {
  (void)state;
  for (int round = 0; round < 5; round++) {
    gg_child_t c;
    gg_child_start(&c, CHILD, "thread", true, NULL);
    assert_true(gg_child_ready(&c));
    gg_child_kill(&c, SIGTERM);
    if (!gg_child_wait(&c, 20000)) fail_msg("round %d: no exit within 20 s: deadlock?", round);
    expect_status(&c, -SIGTERM);
    expect_lifo_once(&c);
    assert_true(gg_child_count(&c, "cleanup W") <= 1);
    gg_child_cleanup(&c);
  }
}

/* A forked child refuses the parent's guard, has the old dispositions, and does not run its
 * cleanups. */
static void test_fork_child(void **state) {
  (void)state;
  gg_child_t c;
  gg_child_start(&c, CHILD, "fork", true, NULL);
  assert_true(gg_child_ready(&c));
  assert_true(gg_child_wait(&c, GG_H_DEADLINE_MS));
  expect_status(&c, 0);
  expect_lifo_once(&c);
  assert_int_equal(gg_child_count(&c, "grandchild refused"), 1);
  assert_int_equal(gg_child_count(&c, "grandchild SIGTERM default"), 1);
  assert_int_equal(gg_child_count(&c, "grandchild exit 0"), 1);
  assert_int_equal(gg_child_count(&c, "grandchild2 SIGTERM"), 1);
  assert_int_equal(gg_child_count(&c, "cleanup FORKED"), 0);
  gg_child_cleanup(&c);
}

/* The leak report: where and how it was asked for. */
static void test_leak_report_json_file(void **state) {
  (void)state;
  gg_child_t c;
  char env_report[192];
  char dir[64] = "/tmp/gg_report_XXXXXX", path[128];
  assert_non_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/report.jsonl", dir);
  snprintf(env_report, sizeof env_report, "GPUGUARD_LEAK_REPORT=json:%s", path);
  const char *env[] = {env_report, NULL};
  gg_child_start(&c, CHILD, "leak", true, env);
  assert_true(gg_child_ready(&c));
  assert_true(gg_child_wait(&c, GG_H_DEADLINE_MS));
  expect_status(&c, 0);
  assert_int_equal(gg_child_count(&c, "cleanup fake-arena"), 1);
  char buf[4096];
  gg_h_slurp(path, buf, sizeof buf);
  printf("  json report: %s", buf);
  assert_non_null(strstr(buf, "\"guard\":\"child\""));
  assert_non_null(strstr(buf, "\"teardown\":\"exit\""));
  assert_non_null(strstr(buf, "\"live_blocks\":3,\"live_bytes\":3584"));
  assert_non_null(strstr(buf, "{\"tag\":\"weights\",\"count\":2,\"bytes\":3072}"));
  assert_non_null(strstr(buf, "{\"tag\":\"\",\"count\":1,\"bytes\":512}"));
  assert_int_equal(strchr(buf, '\n') - buf + 1, (long)strlen(buf)); /* one line */
  unlink(path);
  rmdir(dir);
  gg_child_cleanup(&c);
}

static void test_leak_report_text_and_none(void **state) {
  (void)state;
  gg_child_t c;
  /* Default: text on stderr, because something leaked. */
  gg_child_start(&c, CHILD, "leak", true, NULL);
  assert_true(gg_child_ready(&c));
  assert_true(gg_child_wait(&c, GG_H_DEADLINE_MS));
  const char *err = gg_child_stderr(&c);
  printf("  text report:\n%s", err);
  assert_non_null(strstr(err, "leak report of guard 'child'"));
  assert_non_null(strstr(err, "arena 'fake-arena' (host): 3 live blocks, 3584 bytes"));
  assert_non_null(strstr(err, "tag 'weights': 2 blocks, 3072 bytes"));
  gg_child_cleanup(&c);
  /* none: nothing. */
  const char *none[] = {"GPUGUARD_LEAK_REPORT=none", NULL};
  gg_child_start(&c, CHILD, "leak", true, none);
  assert_true(gg_child_ready(&c));
  assert_true(gg_child_wait(&c, GG_H_DEADLINE_MS));
  assert_null(strstr(gg_child_stderr(&c), "leak report"));
  gg_child_cleanup(&c);
  /* Asked for explicitly, with nothing leaked: an empty report, on the signal path too. */
  const char *asked[] = {"GPUGUARD_LEAK_REPORT=stderr", NULL};
  gg_child_start(&c, CHILD, "wait", true, asked);
  assert_true(gg_child_ready(&c));
  gg_child_kill(&c, SIGTERM);
  assert_true(gg_child_wait(&c, GG_H_DEADLINE_MS));
  assert_non_null(strstr(gg_child_stderr(&c), "(pid"));
  assert_non_null(
      strstr(gg_child_stderr(&c), "teardown by SIGTERM): 0 live blocks, 0 bytes in 0 arenas"));
  gg_child_cleanup(&c);
}

/* C++: an exception through RAII scopes runs the guard's teardown once; an uncaught one aborts. */
static void test_cxx_exception(void **state) {
  (void)state;
  assert_int_equal(baseline(CHILD_CXX, "throw", NULL, 0, NULL), 4);
  gg_child_t c;
  gg_child_start(&c, CHILD_CXX, "throw", true, NULL);
  assert_true(gg_child_ready(&c));
  assert_true(gg_child_wait(&c, GG_H_DEADLINE_MS));
  expect_status(&c, 4);
  expect_lifo_once(&c);
  assert_int_equal(gg_child_count(&c, "caught: boom"), 1);
  assert_int_equal(gg_child_count(&c, "arena empty"), 1); /* every frame's gg::Scope ended */
  assert_int_equal(gg_child_count(&c, "frame 0 unwound"), 1);
  gg_child_cleanup(&c);
}

static void test_cxx_uncaught(void **state) {
  (void)state;
  assert_int_equal(baseline(CHILD_CXX, "uncaught", NULL, 0, NULL), -SIGABRT);
  gg_child_t c;
  gg_child_start(&c, CHILD_CXX, "uncaught", true, NULL);
  assert_true(gg_child_ready(&c));
  assert_true(gg_child_wait(&c, GG_H_DEADLINE_MS));
  expect_status(&c, -SIGABRT);
  assert_int_equal(gg_child_count(&c, "cleanup A"), 0);
  assert_non_null(strstr(gg_child_stderr(&c), "gpuguard: fatal signal SIGABRT"));
  gg_child_cleanup(&c);
}

/* An arena of the guard's device, with live blocks at exit: torn down once, reported by tag. */
static void test_arena_leak_report_at_exit(void **state) {
  (void)state;
  gg_child_t c;
  gg_child_start(&c, CHILD, "arena-leak", true, NULL);
  assert_true(gg_child_ready(&c));
  assert_true(gg_child_wait(&c, GG_H_DEADLINE_MS));
  expect_status(&c, 0);
  expect_lifo_once(&c);
  const char *err = gg_child_stderr(&c);
  printf("%s", err);
  assert_non_null(strstr(err, "teardown by exit): 3 live blocks, 13288 bytes in 1 arena"));
  assert_non_null(strstr(err, "arena 'child-arena' (host): 3 live blocks, 13288 bytes"));
  assert_non_null(strstr(err, "tag 'activations': 2 blocks, 12288 bytes"));
  assert_non_null(strstr(err, "tag 'optimizer': 1 block, 1000 bytes"));
  gg_child_cleanup(&c);
}

/* A signal while threads are inside arena calls: the teardown takes the arena from under them
 * without deadlock; they see GG_ESTATE. */
static void test_signal_during_arena_calls(void **state) {
  (void)state;
  for (int round = 0; round < 5; round++) {
    gg_child_t c;
    gg_child_start(&c, CHILD, "thread-arena", true, NULL);
    assert_true(gg_child_ready(&c));
    gg_child_kill(&c, SIGTERM);
    if (!gg_child_wait(&c, 20000)) fail_msg("round %d: no exit within 20 s: deadlock?", round);
    expect_status(&c, -SIGTERM);
    expect_lifo_once(&c);
    gg_child_cleanup(&c);
  }
}

/* The pid of the sleeper the child spawned through gg_proc_spawn(), from its counter file. */
static pid_t sleeper_pid(const gg_child_t *c) {
  char buf[4096];
  gg_h_slurp(c->counter, buf, sizeof buf);
  const char *p = strstr(buf, "sleeper ");
  return p ? (pid_t)atol(p + 8) : 0;
}

/* Gone, or a zombie waiting for init: either way no longer running. Polls against a deadline. */
static bool gone(pid_t pid) {
  double end = gg_h_now_ms() + 10000;
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  while (gg_h_now_ms() < end) {
    gg_h_slurp(path, buf, sizeof buf);
    const char *paren = strrchr(buf, ')');
    if (!buf[0] || (paren && (paren[2] == 'Z' || paren[2] == 'X'))) return true;
    gg_h_sleep_ms(5);
  }
  return false;
}

static void test_children_end_with_the_guard(void **state) {
  (void)state;
  gg_child_t c;
  gg_child_start(&c, CHILD, "children", true, NULL);
  assert_true(gg_child_ready(&c));
  pid_t kid = sleeper_pid(&c);
  assert_true(kid > 0);
  gg_child_kill(&c, SIGTERM);
  assert_true(gg_child_wait(&c, GG_H_DEADLINE_MS));
  expect_status(&c, -SIGTERM);
  expect_lifo_once(&c);
  assert_true(gone(kid));
  printf("  SIGTERM: the guarded process and its child %d ended %.1f ms after the signal\n",
         (int)kid, gg_child_elapsed_ms(&c));
  gg_child_cleanup(&c);
}

static void test_children_killed_on_crash(void **state) {
  (void)state;
  gg_child_t c;
  gg_child_start(&c, CHILD, "children-segv", true, NULL);
  assert_true(gg_child_ready(&c));
  assert_true(gg_child_wait(&c, GG_H_DEADLINE_MS));
  expect_status(&c, -SIGSEGV);
  pid_t kid = sleeper_pid(&c);
  assert_true(kid > 0);
  assert_true(gone(kid)); /* SIGKILLed from the fatal-signal handler */
  gg_child_cleanup(&c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_return),
      cmocka_unit_test(test_exit3),
      cmocka_unit_test(test_abort),
      cmocka_unit_test(test_segv),
      cmocka_unit_test(test_sigterm),
      cmocka_unit_test(test_sigint),
      cmocka_unit_test(test_sighup),
      cmocka_unit_test(test_sigquit),
      cmocka_unit_test(test_sigint_twice),
      cmocka_unit_test(test_hanging_cleanup_signal),
      cmocka_unit_test(test_hanging_cleanup_exit),
      cmocka_unit_test(test_previous_handler),
      cmocka_unit_test(test_sig_ign_respected),
      cmocka_unit_test(test_signal_during_guard_calls),
      cmocka_unit_test(test_fork_child),
      cmocka_unit_test(test_leak_report_json_file),
      cmocka_unit_test(test_leak_report_text_and_none),
      cmocka_unit_test(test_cxx_exception),
      cmocka_unit_test(test_cxx_uncaught),
      cmocka_unit_test(test_arena_leak_report_at_exit),
      cmocka_unit_test(test_signal_during_arena_calls),
      cmocka_unit_test(test_children_end_with_the_guard),
      cmocka_unit_test(test_children_killed_on_crash),
  };
  return cmocka_run_group_tests_name("exit_paths", tests, NULL, NULL);
}
