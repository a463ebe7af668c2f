/* test_proc_teardown.c — ending a set of children: SIGTERM inside the grace period, SIGKILL after
 * it, stopped and unkillable children in bounded time, no pidfd, process groups and descendants, a
 * subreaper's orphans, and a reused pid never signalled. Split from test_proc.c; every wait polls
 * against a deadline and each test states its bound. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "gg_test.h"
#include "proc/proc_internal.h"
#include "proc/teardown_internal.h"
#include "proc_test_util.h"

/* ---------------------------------------------------------------- teardown */

/* Bound: a plain child ends by SIGTERM well inside the grace period (< 1 s of a 5 s grace). */
static void test_teardown_term(void **state) {
  (void)state;
  const char *sleeper[] = {"sleep", "30", NULL};
  pid_t pid = spawn_ok(NULL, sleeper, NULL);
  gg_proc_receipt_t *r = NULL;
  gg_assert_ok(gg_proc_teardown_ex(NULL, 5000, &r));
  assert_int_equal(r->count, 1);
  const gg_proc_outcome_t *o = outcome(r, pid);
  assert_int_equal(o->sent, GG_PROC_SENT_TERM);
  assert_int_equal(o->end, GG_PROC_SIGNALED);
  assert_int_equal(o->code, SIGTERM);
  assert_string_equal(o->command, "sleep 30");
  assert_string_equal(o->found, "tracked");
  printf("  teardown of a plain child: %.1f ms (grace 5000, bound 1000 ms)\n", r->elapsed_ms);
  assert_true(r->elapsed_ms < 1000);
  gg_proc_receipt_free(r);
  assert_true(gone(pid));
  /* The set is empty now: a second teardown has nothing to do. */
  gg_assert_ok(gg_proc_teardown_ex(NULL, 100, &r));
  assert_int_equal(r->count, 0);
  gg_proc_receipt_free(r);
}

static pid_t spawn_stubborn(gg_guard_t *g) {
  int p[2];
  assert_int_equal(pipe(p), 0);
  gg_spawn_options_t o;
  gg_spawn_options_init(&o);
  o.stdout_fd = p[1];
  const char *argv[] = {"/bin/sh", "-c", "trap '' TERM; echo ready; exec sleep 30", NULL};
  pid_t pid = spawn_ok(g, argv, &o);
  close(p[1]);
  char line[16];
  assert_true(read_line(p[0], line, sizeof line, 10000)); /* the trap is in place */
  assert_string_equal(line, "ready");
  close(p[0]);
  return pid;
}

/* Bound: a child ignoring SIGTERM is SIGKILLed after the grace; teardown returns within grace + 500
 * ms. */
static void test_teardown_kills_after_grace(void **state) {
  (void)state;
  pid_t pid = spawn_stubborn(NULL);
  gg_proc_receipt_t *r = NULL;
  double t0 = now_ms();
  gg_assert_ok(gg_proc_teardown_ex(NULL, 300, &r));
  double took = now_ms() - t0;
  const gg_proc_outcome_t *o = outcome(r, pid);
  assert_int_equal(o->sent, GG_PROC_SENT_TERM | GG_PROC_SENT_KILL);
  assert_int_equal(o->end, GG_PROC_SIGNALED);
  assert_int_equal(o->code, SIGKILL);
  printf("  teardown of a child ignoring SIGTERM: %.1f ms (grace 300, bound 800 ms)\n", took);
  assert_true(took >= 300 && took < 800);
  gg_proc_receipt_free(r);
}

/* Bound: a stopped child is continued and ends by TERM (< 1 s); a stopped one that ignores TERM is
 * killed after the grace (< grace + 500 ms). */
static void test_teardown_stopped(void **state) {
  (void)state;
  const char *sleeper[] = {"sleep", "30", NULL};
  pid_t plain = spawn_ok(NULL, sleeper, NULL);
  kill(plain, SIGSTOP);
  assert_true(wait_state(plain, 'T', 5000));
  gg_proc_receipt_t *r = NULL;
  gg_assert_ok(gg_proc_teardown_ex(NULL, 5000, &r));
  const gg_proc_outcome_t *o = outcome(r, plain);
  assert_int_equal(o->sent, GG_PROC_SENT_TERM | GG_PROC_SENT_CONT);
  assert_int_equal(o->end, GG_PROC_SIGNALED);
  assert_int_equal(o->code, SIGTERM);
  printf("  teardown of a stopped child: %.1f ms (bound 1000 ms)\n", r->elapsed_ms);
  assert_true(r->elapsed_ms < 1000);
  gg_proc_receipt_free(r);

  pid_t stubborn = spawn_stubborn(NULL);
  kill(stubborn, SIGSTOP);
  assert_true(wait_state(stubborn, 'T', 5000));
  gg_assert_ok(gg_proc_teardown_ex(NULL, 200, &r));
  o = outcome(r, stubborn);
  assert_int_equal(o->sent, GG_PROC_SENT_TERM | GG_PROC_SENT_CONT | GG_PROC_SENT_KILL);
  assert_int_equal(o->code, SIGKILL);
  printf("  teardown of a stopped child ignoring SIGTERM: %.1f ms (grace 200, bound 700 ms)\n",
         r->elapsed_ms);
  assert_true(r->elapsed_ms < 700);
  gg_proc_receipt_free(r);
}

/* A process that cannot be ended (muted signals stand in for uninterruptible sleep): teardown still
 * returns within grace + 250 ms kill wait + margin (bound grace + 700 ms), says GG_ETIMEDOUT with
 * the state, keeps it in the set, and the next teardown ends it. */
static void test_teardown_bounded_when_unkillable(void **state) {
  (void)state;
  const char *sleeper[] = {"sleep", "30", NULL};
  pid_t pid = spawn_ok(NULL, sleeper, NULL);
  gg__proc_test_mute(true);
  gg_proc_receipt_t *r = NULL;
  double t0 = now_ms();
  gg_assert_fails(gg_proc_teardown_ex(NULL, 200, &r), GG_ETIMEDOUT, "still alive");
  double took = now_ms() - t0;
  gg__proc_test_mute(false);
  assert_non_null(r);
  assert_int_equal(r->n_alive, 1);
  const gg_proc_outcome_t *o = outcome(r, pid);
  assert_int_equal(o->end, GG_PROC_ALIVE);
  assert_true(o->state == 'S' || o->state == 'R');
  char json[1024];
  gg_assert_ok(gg_proc_receipt_json(r, json, sizeof json, NULL));
  assert_non_null(strstr(json, "\"end\":\"alive\""));
  gg_proc_receipt_free(r);
  printf("  teardown with an unkillable child: %.1f ms (grace 200, bound 900 ms)\n", took);
  assert_true(took < 900);
  gg_assert_ok(gg_proc_teardown_ex(NULL, 1000, &r)); /* kept, and ended now */
  assert_int_equal(outcome(r, pid)->code, SIGTERM);
  gg_proc_receipt_free(r);
}

/* Without pidfds (older kernels): pid + start time, same results. */
static void test_teardown_without_pidfd(void **state) {
  (void)state;
  gg__proc_use_pidfd(false);
  const char *sleeper[] = {"sleep", "30", NULL};
  pid_t pid = spawn_ok(NULL, sleeper, NULL);
  pid_t stubborn = spawn_stubborn(NULL);
  gg_proc_receipt_t *r = NULL;
  gg_assert_ok(gg_proc_teardown_ex(NULL, 200, &r));
  gg__proc_use_pidfd(true);
  assert_int_equal(outcome(r, pid)->code, SIGTERM);
  assert_int_equal(outcome(r, pid)->end, GG_PROC_SIGNALED);
  assert_int_equal(outcome(r, stubborn)->code, SIGKILL);
  printf("  teardown by pid + start time: %.1f ms (grace 200, bound 700 ms)\n", r->elapsed_ms);
  assert_true(r->elapsed_ms < 700);
  gg_proc_receipt_free(r);
}

/* A child leading its own group, with two grandchildren: all three end, found as descendants. */
static void test_teardown_group_and_descendants(void **state) {
  (void)state;
  gg_spawn_options_t o;
  gg_spawn_options_init(&o);
  o.new_process_group = 1;
  const char *argv[] = {"/bin/sh", "-c", "sleep 30 & sleep 30 & wait", NULL};
  pid_t sh = spawn_ok(NULL, argv, &o);
  gg__pinfo_t info;
  gg_assert_ok(gg__proc_read_stat(sh, &info) == 0 ? 0 : GG_EIO);
  assert_int_equal(info.pgrp, sh);
  pid_t kids[4];
  double t0 = now_ms();
  while (children_of(sh, kids, 4) < 2 && now_ms() - t0 < 10000) nap_ms(2);
  assert_int_equal(children_of(sh, kids, 4), 2);
  gg_proc_receipt_t *r = NULL;
  gg_assert_ok(gg_proc_teardown_ex(NULL, 2000, &r));
  assert_int_equal(r->count, 3);
  assert_string_equal(outcome(r, kids[0])->found, "descendant");
  assert_string_equal(outcome(r, kids[1])->found, "descendant");
  assert_true(outcome(r, sh)->sent & GG_PROC_SENT_TERM);
  printf("  teardown of a group leader and 2 grandchildren: %.1f ms (bound 2000 ms)\n",
         r->elapsed_ms);
  gg_proc_receipt_free(r);
  assert_true(wait_all_gone(kids, 2, 1000) >= 0);
  reap_all();
}

/* Subreaper: a setsid, double-forked grandchild reparents to us and teardown ends it (< 1 s). */
static void test_teardown_subreaper_orphan(void **state) {
  (void)state;
  gg_assert_ok(gg_proc_set_subreaper(1));
  int p[2];
  assert_int_equal(pipe(p), 0);
  gg_spawn_options_t o;
  gg_spawn_options_init(&o);
  o.stdout_fd = p[1];
  const char *argv[] = {"/bin/sh", "-c", "setsid sleep 30 </dev/null >/dev/null 2>&1 & echo $!",
                        NULL};
  pid_t sh = spawn_ok(NULL, argv, &o);
  close(p[1]);
  pid_t orphan = read_pid(p[0]);
  close(p[0]);
  /* Wait until its shell has exited and it has been reparented to us. */
  gg__pinfo_t info;
  double t0 = now_ms();
  while (now_ms() - t0 < 10000 &&
         !(gg__proc_read_stat(orphan, &info) == 0 && info.ppid == getpid() && info.sid == orphan))
    nap_ms(2);
  assert_int_equal(info.ppid, getpid());
  assert_int_equal(info.sid, orphan); /* its own session: killpg would not reach it */
  gg_proc_receipt_t *r = NULL;
  gg_assert_ok(gg_proc_teardown_ex(NULL, 1000, &r));
  const gg_proc_outcome_t *o2 = outcome(r, orphan);
  assert_string_equal(o2->found, "reparented");
  assert_int_equal(o2->end, GG_PROC_SIGNALED); /* reaped by us, as its new parent */
  assert_int_equal(outcome(r, sh)->end, GG_PROC_EXITED);
  printf("  teardown as subreaper of a setsid grandchild: %.1f ms (bound 1000 ms)\n",
         r->elapsed_ms);
  assert_true(r->elapsed_ms < 1000);
  gg_proc_receipt_free(r);
  assert_true(gone(orphan));
  gg_assert_ok(gg_proc_set_subreaper(0));
  reap_all();
}

/* Pid reuse: a record whose start time no longer matches is reported and never signalled. */
static void test_pid_reuse_not_signalled(void **state) {
  (void)state;
  pid_t other = fork();
  if (other == 0) {
    execlp("sleep", "sleep", "30", (char *)NULL);
    _exit(127);
  }
  assert_true(wait_state(other, 'S', 5000));
  gg__pinfo_t info;
  assert_int_equal(gg__proc_read_stat(other, &info), 0);
  /* As if we had recorded an earlier process that held this pid. */
  gg_assert_ok(gg__proc_track(NULL, other, -1, info.start + 1, GG__FOUND_TRACKED));
  gg_proc_receipt_t *r = NULL;
  gg_assert_ok(gg_proc_teardown_ex(NULL, 200, &r));
  const gg_proc_outcome_t *o = outcome(r, other);
  assert_int_equal(o->end, GG_PROC_SKIPPED);
  assert_int_equal(o->sent, 0);
  gg_proc_receipt_free(r);
  assert_false(gone(other));
  assert_int_equal(gg__proc_read_stat(other, &info), 0);
  assert_int_equal(info.state, 'S');
  kill(other, SIGKILL);
  waitpid(other, NULL, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_teardown_term),
      cmocka_unit_test(test_teardown_kills_after_grace),
      cmocka_unit_test(test_teardown_stopped),
      cmocka_unit_test(test_teardown_bounded_when_unkillable),
      cmocka_unit_test(test_teardown_without_pidfd),
      cmocka_unit_test(test_teardown_group_and_descendants),
      cmocka_unit_test(test_teardown_subreaper_orphan),
      cmocka_unit_test(test_pid_reuse_not_signalled),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
