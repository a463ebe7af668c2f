/* test_teardown_users.c — a teardown never signals another user's process (issue 16 item 4): a tracked
 * process leading a group that holds another user's process gets its group signalled member by member,
 * ours only, and the receipt says so. Needs root (to run a process as another uid); skipped otherwise. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gg_test.h"
#include "proc_internal.h"

static void test_foreign_member_of_a_group_is_spared(void **state) {
  (void)state;
  if (geteuid() != 0) skip();
  int sync[2];
  assert_int_equal(pipe(sync), 0);
  pid_t leader = fork();
  if (leader == 0) {
    setpgid(0, 0);
    pause();
    _exit(0);
  }
  setpgid(leader, leader);
  pid_t ours = fork(); /* a member of ours: must get the signal */
  if (ours == 0) {
    setpgid(0, leader);
    pause();
    _exit(0);
  }
  setpgid(ours, leader);
  pid_t foreign = fork(); /* another user's member: must not */
  if (foreign == 0) {
    if (setpgid(0, leader) != 0 || setgid(65534) != 0 || setuid(65534) != 0) _exit(3);
    if (write(sync[1], "k", 1) != 1) _exit(4);
    pause();
    _exit(0);
  }
  char c;
  assert_int_equal(read(sync[0], &c, 1), 1);
  gg_assert_ok(gg_proc_adopt(NULL, leader));
  gg_proc_receipt_t *r = NULL;
  gg_assert_ok(gg_proc_teardown_ex(NULL, 2000, &r));
  int st;
  bool spared = waitpid(foreign, &st, WNOHANG) == 0; /* the other user's member still runs */
  kill(foreign, SIGKILL);
  waitpid(foreign, NULL, 0);
  assert_true(spared);
  const gg_proc_outcome_t *o = NULL, *m = NULL;
  for (size_t i = 0; i < r->count; i++) {
    if (r->procs[i].pid == leader) o = &r->procs[i];
    if (r->procs[i].pid == ours) m = &r->procs[i];
  }
  assert_non_null(o);
  assert_true(o->sent & GG_PROC_SENT_GROUP_FOREIGN);
  assert_non_null(m); /* the member of ours was ended (found in the group, signalled itself) */
  assert_int_equal(m->end, GG_PROC_SIGNALED);
  char json[4096];
  gg_assert_ok(gg_proc_receipt_json(r, json, sizeof json, NULL));
  assert_non_null(strstr(json, "\"group\":\"ours only\""));
  gg_proc_receipt_free(r);
}

/* Without a foreign member the group is signalled as before (a member that is not tracked goes too). */
static void test_group_of_ours_is_signalled(void **state) {
  (void)state;
  pid_t leader = fork();
  if (leader == 0) {
    setpgid(0, 0);
    pause();
    _exit(0);
  }
  setpgid(leader, leader);
  gg_assert_ok(gg_proc_adopt(NULL, leader));
  gg_proc_receipt_t *r = NULL;
  gg_assert_ok(gg_proc_teardown_ex(NULL, 2000, &r));
  assert_int_equal(r->count, 1);
  assert_false(r->procs[0].sent & GG_PROC_SENT_GROUP_FOREIGN);
  assert_true(r->procs[0].sent & GG_PROC_SENT_TERM);
  gg_proc_receipt_free(r);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_foreign_member_of_a_group_is_spared),
      cmocka_unit_test(test_group_of_ours_is_signalled),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
