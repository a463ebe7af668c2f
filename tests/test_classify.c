/* test_classify.c — how gg_process_list classifies the processes holding a device, from the session
 * registry and /proc: guarded (live session), orphan (dead leader, or a worker whose parent is
 * gone), unknown (no evidence). NVML is a stand-in that lists whichever pids the test names. */
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gg_test.h"
#include "core/internal.h"
#include "proc/procfs_internal.h"

static char regdir[64];

static int setup(void **state) {
  (void)state;
  snprintf(regdir, sizeof regdir, "/tmp/gg_classify_%d", (int)getpid());
  mkdir(regdir, 0700);
  setenv("GPUGUARD_REGISTRY_DIR", regdir, 1);
  setenv("GPUGUARD_NVML_LIBRARY", GG_FAKE_NVML, 1);
  setenv("GPUGUARD_TEST_PIDNS", "initial", 1); /* the stand-in NVML lists pids of our /proc */
  unsetenv("FAKE_NVML_LOG");
  unsetenv("GPUGUARD_SESSION");
  return 0;
}

static int teardown(void **state) {
  (void)state;
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", regdir);
  return system(cmd) == 0 ? 0 : -1;
}

/* Lists the pids given and returns the row of `pid`. */
static gg_process_t row_of(pid_t pid, const pid_t *pids, int n) {
  char spec[256] = "";
  for (int i = 0; i < n; i++)
    snprintf(spec + strlen(spec), sizeof spec - strlen(spec), "%s%d:1048576", i ? "," : "",
             (int)pids[i]);
  setenv("FAKE_NVML_PROCS", spec, 1);
  gg_process_t rows[8];
  size_t count = 0;
  gg_assert_ok(gg_process_list(0, rows, 8, &count));
  for (size_t i = 0; i < count; i++)
    if (rows[i].pid == pid) return rows[i];
  fail_msg("pid %d not listed", (int)pid);
  return rows[0];
}

/* Returns once the child has exec'd: before that its /proc environment is still this process's
 * initial one (a session set with setenv() since is not in it), and classifying it then was a race
 * the guarded-session test lost about once in 17 runs. */
static pid_t start_sleeper(void) {
  pid_t p = fork();
  if (p == 0) {
    execlp("sleep", "sleep", "30", (char *)NULL);
    _exit(127);
  }
  char path[64], comm[32];
  snprintf(path, sizeof path, "/proc/%d/comm", (int)p);
  for (int i = 0; i < 2500; i++) {
    FILE *f = fopen(path, "r");
    bool slept = f && fgets(comm, sizeof comm, f) && strcmp(comm, "sleep\n") == 0;
    if (f) fclose(f);
    if (slept) return p;
    usleep(2000);
  }
  fail_msg("child %d did not exec sleep", (int)p);
  return p;
}

/* A sleeper started by gg_proc_spawn, which gives it this process's session in its own environment
 * (the process environment is never written). No death signal: it must outlive a dying leader. */
static pid_t spawn_sleeper(void) {
  gg_spawn_options_t o;
  gg_spawn_options_init(&o);
  o.death_signal = 0;
  const char *argv[] = {"sleep", "30", NULL};
  pid_t p = -1;
  gg_assert_ok(gg_proc_spawn(NULL, argv, &o, &p)); /* returns once it has exec'd */
  return p;
}

/* Waits until pid's parent is no longer `was` (it was reparented), up to 5 s. */
static void wait_reparented(pid_t pid, pid_t was) {
  gg__pinfo_t info;
  for (int i = 0; i < 2500; i++) {
    if (gg__proc_read_stat(pid, &info) == 0 && info.ppid != was) return;
    usleep(2000);
  }
  fail_msg("process %d was not reparented", (int)pid);
}

static void stop(pid_t pid) {
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
}

static void test_unknown_without_evidence(void **state) {
  (void)state;
  pid_t s = start_sleeper();
  gg_process_t r = row_of(s, &s, 1);
  assert_int_equal(r.cls, GG_PROCESS_UNKNOWN);
  assert_string_equal(r.session, "");
  stop(s);
}

static void test_guarded_session(void **state) {
  (void)state;
  gg_assert_ok(gg_registry_register("0")); /* this process leads a new session... */
  char session[40];
  gg_assert_ok(gg_registry_session(session, sizeof session));
  pid_t s = spawn_sleeper(); /* ...which its spawned child gets in its environment */
  pid_t both[2] = {getpid(), s};
  gg_process_t me = row_of(getpid(), both, 2), child = row_of(s, both, 2);
  assert_int_equal(me.cls, GG_PROCESS_GUARDED);
  assert_string_equal(me.session, session);
  assert_int_equal(child.cls, GG_PROCESS_GUARDED);
  assert_string_equal(child.session, session);
  stop(s);
  gg_assert_ok(gg_registry_unregister());
  unsetenv("GPUGUARD_SESSION");
}

static void test_orphan_of_a_dead_leader(void **state) {
  (void)state;
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  pid_t leader = fork();
  if (leader == 0) {
    /* A leader that starts a worker and dies without unregistering (as after SIGKILL). */
    if (gg_registry_register("0") != 0) _exit(1);
    pid_t w = spawn_sleeper();
    if (write(fds[1], &w, sizeof w) != sizeof w) _exit(1);
    _exit(0);
  }
  pid_t worker = 0;
  assert_int_equal(read(fds[0], &worker, sizeof worker), sizeof worker);
  waitpid(leader, NULL, 0);
  close(fds[0]), close(fds[1]);
  wait_reparented(worker, leader);
  gg_process_t r = row_of(worker, &worker, 1);
  assert_int_equal(r.cls, GG_PROCESS_ORPHAN);
  assert_true(strlen(r.session) == 32);
  kill(worker, SIGKILL);
}

static void test_orphaned_multiprocessing_worker(void **state) {
  (void)state;
  /* A spawn-method worker (its command line says so) whose parent is gone, with no session at all.
   * */
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  pid_t mid = fork();
  if (mid == 0) {
    pid_t w = fork();
    if (w == 0) {
      execlp("bash", "bash", "-c",
             "exec -a 'python3 -c from multiprocessing.spawn import spawn_main; "
             "spawn_main(tracker_fd=5)' sleep 30",
             (char *)NULL);
      _exit(127);
    }
    _exit(write(fds[1], &w, sizeof w) == sizeof w ? 0 : 1);
  }
  pid_t worker = 0;
  assert_int_equal(read(fds[0], &worker, sizeof worker), sizeof worker);
  waitpid(mid, NULL, 0);
  close(fds[0]), close(fds[1]);
  /* Wait until bash has exec'd into the renamed sleep. */
  char cmd[256] = "";
  for (int i = 0; i < 2500 && !strstr(cmd, "spawn_main"); i++) {
    gg__proc_cmdline(worker, cmd, sizeof cmd);
    if (!strstr(cmd, "spawn_main")) usleep(2000);
  }
  wait_reparented(worker, mid);
  gg_process_t r = row_of(worker, &worker, 1);
  assert_int_equal(r.cls, GG_PROCESS_ORPHAN);
  assert_non_null(strstr(r.command, "multiprocessing.spawn"));
  kill(worker, SIGKILL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_unknown_without_evidence, setup, teardown),
      cmocka_unit_test_setup_teardown(test_guarded_session, setup, teardown),
      cmocka_unit_test_setup_teardown(test_orphan_of_a_dead_leader, setup, teardown),
      cmocka_unit_test_setup_teardown(test_orphaned_multiprocessing_worker, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
