/* test_teardown_users.c — a teardown never signals another user's process (root's teardown must not
 * hit what it does not own): a tracked process leading a group that holds another user's process
 * gets its group signalled member by member, ours only, and the receipt says so; the fatal path
 * (crash hooks) keeps the same rule. Needs root (to run a process as another uid); skipped
 * otherwise. */
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gg_test.h"
#include "proc/proc_internal.h"

/* A process group led by a sleeping child, with a member of ours and one of uid 65534 (returned
 * once it runs as that user); -1 in *leader when something failed. */
typedef struct group3 {
  pid_t leader, ours, foreign;
} group3_t;

static group3_t make_group(void) {
  group3_t g = {-1, -1, -1};
  int sync[2];
  if (pipe(sync) != 0) return g;
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
  bool ran = read(sync[0], &c, 1) == 1;
  close(sync[0]), close(sync[1]);
  if (ran) g = (group3_t){leader, ours, foreign};
  return g;
}

static void test_foreign_member_of_a_group_is_spared(void **state) {
  (void)state;
  if (geteuid() != 0) skip();
  group3_t g = make_group();
  assert_true(g.leader > 0);
  pid_t leader = g.leader, ours = g.ours, foreign = g.foreign;
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

/* Without a foreign member the group is signalled as before (a member that is not tracked goes
 * too). */
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

/* In a child of the test: a group led by `leader` with a member of ours and one of uid 65534; the
 * fatal path runs (tracked: through the snapshot; subreaper: through the walk of our children).
 * Exits 0 when our member died and the other user's member still runs, 1 when the other user's
 * member was killed. */
static int fatal_path_case(bool tracked) {
  if (!tracked && prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) return 11;
  group3_t g = make_group();
  if (g.leader <= 0) return 12;
  pid_t leader = g.leader, ours = g.ours, foreign = g.foreign;
  if (tracked && gg_proc_adopt(NULL, leader) != 0) return 13;
  gg__proc_fatal_kill(SIGSEGV, NULL);
  int st;
  if (waitpid(ours, &st, 0) != ours || !WIFSIGNALED(st)) return 14; /* ours went */
  waitpid(leader, NULL, 0);
  bool spared = waitpid(foreign, &st, WNOHANG) == 0;
  kill(foreign, SIGKILL);
  waitpid(foreign, NULL, 0);
  return spared ? 0 : 1;
}

static void run_fatal_case(bool tracked) {
  if (geteuid() != 0) skip();
  pid_t kid = fork();
  if (kid == 0) _exit(fatal_path_case(tracked));
  int st = 0;
  assert_int_equal(waitpid(kid, &st, 0), kid);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0); /* 1: another user's process got SIGKILL from our crash */
}

/* The crash path (async-signal-safe) spares another user's member of a tracked child's group. */
static void test_fatal_path_spares_foreign_member_tracked(void **state) {
  (void)state;
  run_fatal_case(true);
}

/* The same through the subreaper's sweep of its children. */
static void test_fatal_path_spares_foreign_member_subreaper(void **state) {
  (void)state;
  run_fatal_case(false);
}

/* Not root: a descendant of the job that runs as another user cannot be ended; it is listed as
 * skipped and counted as left (n_alive), never reported as "0 left" while it runs. In a child that
 * drops to uid 65534 after its tracked child's own child became uid 65533. Exits 0 when the receipt
 * says so, else a code naming the step. */
static int unprivileged_case(int sync_fd[2]) {
  pid_t kid = fork();
  if (kid == 0) {
    pid_t grandkid = fork();
    if (grandkid == 0) {
      if (setgid(65533) != 0 || setuid(65533) != 0) _exit(3);
      pause();
      _exit(0);
    }
    pid_t twice[2] = {grandkid, grandkid}; /* one for the case, one for the test's cleanup */
    if (write(sync_fd[1], twice, sizeof twice) != sizeof twice) _exit(4);
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(5);
    pause();
    _exit(0);
  }
  pid_t grandkid = 0;
  if (read(sync_fd[0], &grandkid, sizeof grandkid) != sizeof grandkid) return 20;
  usleep(100000); /* both have changed uid */
  if (setgid(65534) != 0 || setuid(65534) != 0) return 21;
  if (gg_proc_adopt(NULL, kid) != 0) return 22;
  gg_proc_receipt_t *r = NULL;
  gg_proc_teardown_ex(NULL, 500, &r);
  if (!r) return 23;
  int rc = 0;
  const gg_proc_outcome_t *g = NULL;
  for (size_t i = 0; i < r->count; i++)
    if (r->procs[i].pid == grandkid) g = &r->procs[i];
  if (!g)
    rc = 24; /* not listed */
  else if (g->end != GG_PROC_SKIPPED || g->sent != 0)
    rc = 25;
  else if (r->n_alive != 1)
    rc = 26; /* "0 left" while it runs */
  gg_proc_receipt_free(r);
  return rc;
}

static void test_unprivileged_skips_and_counts_foreign_descendant(void **state) {
  (void)state;
  if (geteuid() != 0) skip();
  int sync_fd[2];
  assert_int_equal(pipe(sync_fd), 0);
  pid_t c = fork();
  if (c == 0) _exit(unprivileged_case(sync_fd));
  int st = 0;
  assert_int_equal(waitpid(c, &st, 0), c);
  pid_t grandkid = 0;
  if (read(sync_fd[0], &grandkid, sizeof grandkid) == sizeof grandkid && grandkid > 1)
    kill(grandkid, SIGKILL);
  close(sync_fd[0]);
  close(sync_fd[1]);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_foreign_member_of_a_group_is_spared),
      cmocka_unit_test(test_unprivileged_skips_and_counts_foreign_descendant),
      cmocka_unit_test(test_group_of_ours_is_signalled),
      cmocka_unit_test(test_fatal_path_spares_foreign_member_tracked),
      cmocka_unit_test(test_fatal_path_spares_foreign_member_subreaper),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
