/* test_teardown_deep.c — a teardown finds every descendant however deep the tree, and whatever the
 * order /proc lists it in: a chain whose pids descend (after the pid counter wrapped, each child
 * has a smaller pid than its parent) is found one level per walk of /proc, and a bounded number of
 * walks left its deepest levels running. Needs root (ns_last_pid picks the pids); skipped
 * otherwise. */
#include <errno.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gg_test.h"
#include "proc/procfs_internal.h"

#define DEPTH 24

static bool set_last_pid(pid_t pid) {
  FILE *f = fopen("/proc/sys/kernel/ns_last_pid", "w");
  if (!f) return false;
  bool ok = fprintf(f, "%d", (int)pid) > 0;
  return fclose(f) == 0 && ok;
}

/* Level `level` of the chain: reports its pid, starts the next level two pids below its own, and
 * waits to be ended. */
static _Noreturn void chain(int level, pid_t base, int out) {
  for (;;) {
    pid_t me = getpid();
    if (write(out, &me, sizeof me) != sizeof me) _exit(1);
    if (level + 1 == DEPTH) break;
    set_last_pid(base - 2 * (level + 1) - 1);
    pid_t kid = fork();
    if (kid != 0) break;
    level++; /* the child goes on as the next level */
  }
  for (;;) pause();
}

static bool running(pid_t pid) {
  gg__pinfo_t info;
  return gg__proc_read_stat(pid, &info) == 0 && info.state != 'Z' && info.state != 'X';
}

/* The top of a window of free pids for the chain: above every pid in use when the counter has room
 * there; else (the counter is near pid_max and would wrap, which a busy CI machine reaches) the
 * highest window whose every pid is free. -1 when there is none. */
static pid_t pick_base(pid_t last) {
  int max = 32768;
  FILE *f = fopen("/proc/sys/kernel/pid_max", "r");
  if (f) {
    if (fscanf(f, "%d", &max) != 1) max = 32768;
    fclose(f);
  }
  if ((long)last + 2000 < (long)max - 1) return last + 2000;
  const pid_t span = 2 * DEPTH + 4;
  for (pid_t top = (pid_t)max - 2; top > span + 300; top--) {
    pid_t p = top;
    while (p > top - span && kill(p, 0) != 0 && errno == ESRCH) p--;
    if (p == top - span) return top;
    top = p; /* p is taken: the next window starts below it */
  }
  return -1;
}

static void test_deep_chain_with_descending_pids(void **state) {
  (void)state;
  if (geteuid() != 0 || access("/proc/sys/kernel/ns_last_pid", W_OK) != 0) skip();
  FILE *f = fopen("/proc/sys/kernel/ns_last_pid", "r");
  int last = 0;
  assert_non_null(f);
  assert_int_equal(fscanf(f, "%d", &last), 1);
  fclose(f);
  pid_t base = pick_base((pid_t)last);
  if (base < 0) skip(); /* no window of free pids (a machine with almost every pid in use) */
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  assert_true(set_last_pid(base - 1));
  pid_t top = fork();
  if (top == 0) chain(0, base, fds[1]);
  pid_t pids[DEPTH];
  for (int i = 0; i < DEPTH; i++)
    assert_int_equal(read(fds[0], &pids[i], sizeof pids[i]), sizeof pids[i]);
  close(fds[0]);
  close(fds[1]);
  bool descending = true;
  for (int i = 1; i < DEPTH; i++) descending = descending && pids[i] < pids[i - 1];
  if (!descending) { /* another process took a pid meanwhile: the order is not the one to test */
    for (int i = 0; i < DEPTH; i++) kill(pids[i], SIGKILL);
    waitpid(top, NULL, 0);
    skip();
  }
  gg_assert_ok(gg_proc_adopt(NULL, top));
  gg_proc_receipt_t *r = NULL;
  gg_proc_teardown_ex(NULL, 200, &r);
  int left = 0;
  for (int i = 0; i < DEPTH; i++) {
    for (int wait = 0; wait < 100 && running(pids[i]); wait++) usleep(5000);
    left += running(pids[i]);
  }
  size_t found = r ? r->count : 0;
  gg_proc_receipt_free(r);
  for (int i = 0; i < DEPTH; i++) kill(pids[i], SIGKILL);
  waitpid(top, NULL, 0);
  if (left)
    fail_msg("%d of a chain of %d left running (the teardown found %zu)", left, DEPTH, found);
  assert_int_equal(found, DEPTH);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_deep_chain_with_descending_pids),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
