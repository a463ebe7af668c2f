/* test_proc_ns.c — gg_proc_spawn() with a PID namespace: the job is pid 2 of its own namespace, its
 * status comes back through the keeper, a teardown ends it, every signal of gg_proc_job_signals()
 * sent to the keeper reaches the job (none ends the keeper first), and when the spawning process is
 * SIGKILLed the kernel ends every process of the job, a setsid'd daemon included. A job that
 * crashes ends its keeper by the same signal, without a second core dump (the keeper's over the
 * job's). Skipped (77) where the system refuses namespaces; bad values refused. */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gg_test.h"
#include "proc/procfs_internal.h"

static int setup(void **state) {
  (void)state;
  if (gg_proc_pid_ns_probe() < 0) {
    printf("SKIP: %s\n", gg_last_error());
    exit(77);
  }
  return 0;
}

static bool read_line(int fd, char *buf, size_t cap) {
  size_t n = 0;
  while (n + 1 < cap) {
    ssize_t r = read(fd, buf + n, 1);
    if (r <= 0 || buf[n] == '\n') break;
    n++;
  }
  buf[n] = '\0';
  return n > 0;
}

static void test_job_is_pid_2_and_status_passes(void **state) {
  (void)state;
  int p[2];
  assert_int_equal(pipe(p), 0);
  gg_spawn_options_t o;
  gg_spawn_options_init(&o);
  o.pid_ns = GG_SPAWN_PID_NS_ON, o.stdout_fd = p[1];
  const char *argv[] = {"/bin/sh", "-c", "echo $$; exit 5", NULL};
  pid_t keeper;
  gg_assert_ok(gg_proc_spawn(NULL, argv, &o, &keeper));
  close(p[1]);
  char line[64];
  assert_true(read_line(p[0], line, sizeof line));
  assert_string_equal(line, "2");
  close(p[0]);
  gg_proc_receipt_t *r = NULL;
  for (int i = 0; i < 500; i++) { /* let it exit by itself */
    gg__pinfo_t info;
    if (gg__proc_read_stat(keeper, &info) != 0 || info.state == 'Z') break;
    usleep(10000);
  }
  gg_assert_ok(gg_proc_teardown_ex(NULL, 2000, &r));
  assert_int_equal(r->procs[0].pid, keeper);
  assert_int_equal(r->procs[0].end, GG_PROC_EXITED);
  assert_int_equal(r->procs[0].code, 5);
  gg_proc_receipt_free(r);
  o.pid_ns = 3;
  gg_assert_fails(gg_proc_spawn(NULL, argv, &o, NULL), GG_EINVAL, "pid_ns 3");
}

/* The one list: what a runner takes and the keeper passes on. Catchable, ending, no faults. */
static void test_job_signals_list(void **state) {
  (void)state;
  int sigs[128];
  size_t n = gg_proc_job_signals(sigs, sizeof sigs / sizeof sigs[0]);
  assert_int_equal(gg_proc_job_signals(NULL, 0), n);
  assert_int_equal(n, 15 + (size_t)(SIGRTMAX - SIGRTMIN + 1));
  int cut[3];
  assert_int_equal(gg_proc_job_signals(cut, 3), n);
  assert_memory_equal(cut, sigs, sizeof cut);
  static const int must[] = {SIGINT,  SIGTERM, SIGHUP,    SIGUSR1, SIGALRM,
                             SIGPIPE, SIGXCPU, SIGVTALRM, SIGXFSZ};
  static const int never[] = {SIGKILL, SIGSTOP, SIGSEGV, SIGBUS, SIGABRT, SIGCHLD, SIGCONT};
  for (size_t i = 0; i < sizeof must / sizeof must[0]; i++) {
    bool in = false;
    for (size_t k = 0; k < n; k++) in |= sigs[k] == must[i];
    assert_true(in);
  }
  for (size_t k = 0; k < n; k++)
    for (size_t i = 0; i < sizeof never / sizeof never[0]; i++)
      assert_int_not_equal(sigs[k], never[i]);
}

/* Each job signal sent to the keeper reaches the job, which traps it and exits 7: the keeper must
 * neither die of it (which ends the namespace without the job's say) nor drop it. */
static void test_every_job_signal_reaches_the_job(void **state) {
  (void)state;
  int sigs[128];
  size_t n = gg_proc_job_signals(sigs, sizeof sigs / sizeof sigs[0]);
  for (size_t i = 0; i < n; i++) {
    int p[2];
    assert_int_equal(pipe(p), 0);
    gg_spawn_options_t o;
    gg_spawn_options_init(&o);
    o.pid_ns = GG_SPAWN_PID_NS_ON, o.stdout_fd = p[1];
    char script[128];
    snprintf(script, sizeof script, "trap 'exit 7' %d; echo ready; while :; do sleep 0.02; done",
             sigs[i]);
    const char *argv[] = {"/bin/sh", "-c", script, NULL};
    pid_t keeper;
    gg_assert_ok(gg_proc_spawn(NULL, argv, &o, &keeper));
    close(p[1]);
    char line[16];
    assert_true(read_line(p[0], line, sizeof line));
    close(p[0]);
    assert_int_equal(kill(keeper, sigs[i]), 0);
    for (int k = 0; k < 500; k++) {
      gg__pinfo_t info;
      if (gg__proc_read_stat(keeper, &info) != 0 || info.state == 'Z') break;
      usleep(10000);
    }
    gg_proc_receipt_t *r = NULL;
    gg_assert_ok(gg_proc_teardown_ex(NULL, 500, &r));
    if (r->procs[0].end != GG_PROC_EXITED || r->procs[0].code != 7)
      fail_msg("signal %d (%s): the keeper ended %s %d, not by the job's exit 7", sigs[i],
               strsignal(sigs[i]), r->procs[0].end == GG_PROC_SIGNALED ? "by signal" : "with",
               r->procs[0].code);
    gg_proc_receipt_free(r);
  }
}

static pid_t find_by_cmdline(const char *want) {
  char cmd[256];
  for (pid_t pid = 2; pid < 4194304; pid++) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d", (int)pid);
    if (access(path, F_OK) != 0) continue;
    gg__proc_cmdline(pid, cmd, sizeof cmd);
    if (strcmp(cmd, want) == 0) return pid;
    if (pid > 100000) break; /* enough for a test machine's pids */
  }
  return 0;
}

static void test_sigkilled_spawner_takes_the_whole_job(void **state) {
  (void)state;
  char daemon[64];
  snprintf(daemon, sizeof daemon, "sleep 301.%d", (int)getpid());
  int ready[2];
  assert_int_equal(pipe(ready), 0);
  pid_t spawner = fork();
  if (spawner == 0) {
    gg_spawn_options_t o;
    gg_spawn_options_init(&o);
    o.pid_ns = GG_SPAWN_PID_NS_ON;
    char script[160];
    snprintf(script, sizeof script, "setsid %s & sleep 302 & wait", daemon);
    const char *argv[] = {"/bin/sh", "-c", script, NULL};
    if (gg_proc_spawn(NULL, argv, &o, NULL) != 0) _exit(1);
    if (write(ready[1], "r", 1) != 1) _exit(1);
    pause();
    _exit(0);
  }
  close(ready[1]);
  char c;
  assert_int_equal(read(ready[0], &c, 1), 1);
  pid_t d = 0;
  for (int i = 0; i < 300 && !d; i++, usleep(10000)) d = find_by_cmdline(daemon);
  assert_true(d > 0);
  kill(spawner, SIGKILL);
  waitpid(spawner, NULL, 0);
  bool gone = false;
  for (int i = 0; i < 500 && !gone; i++, usleep(10000)) {
    gg__pinfo_t info;
    gone = gg__proc_read_stat(d, &info) != 0 || info.state == 'Z';
  }
  if (!gone) kill(d, SIGKILL);
  assert_true(gone);
}

/* The job dies of SIGSEGV with core dumps allowed: the keeper dies of SIGSEGV too, but dumps no
 * core of its own (it would overwrite the job's core file, and make a second crash report). */
static void test_crash_gives_no_keeper_core(void **state) {
  (void)state;
  struct rlimit old, lim;
  assert_int_equal(getrlimit(RLIMIT_CORE, &old), 0);
  lim = old;
  lim.rlim_cur = lim.rlim_max; /* as high as this process may: the keeper inherits it */
  assert_int_equal(setrlimit(RLIMIT_CORE, &lim), 0);
  char dir[] = "/tmp/gg_core_XXXXXX";
  assert_non_null(mkdtemp(dir));
  gg_spawn_options_t o;
  gg_spawn_options_init(&o);
  o.pid_ns = GG_SPAWN_PID_NS_ON, o.cwd = dir;
  const char *argv[] = {"/bin/sh", "-c", "kill -SEGV $$", NULL};
  pid_t keeper;
  gg_assert_ok(gg_proc_spawn(NULL, argv, &o, &keeper));
  int st = 0;
  assert_int_equal(waitpid(keeper, &st, 0), keeper);
  setrlimit(RLIMIT_CORE, &old);
  assert_true(WIFSIGNALED(st));
  assert_int_equal(WTERMSIG(st), SIGSEGV);
  assert_false(WCOREDUMP(st)); /* the job's core (if the system writes one) is the only one */
  gg_proc_teardown_ex(NULL, 100, NULL);
  DIR *d = opendir(dir);
  struct dirent *e;
  char path[600];
  while (d && (e = readdir(d)))
    if (e->d_name[0] != '.') snprintf(path, sizeof path, "%s/%s", dir, e->d_name), unlink(path);
  if (d) closedir(d);
  rmdir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_job_is_pid_2_and_status_passes),
      cmocka_unit_test(test_job_signals_list),
      cmocka_unit_test(test_every_job_signal_reaches_the_job),
      cmocka_unit_test(test_sigkilled_spawner_takes_the_whole_job),
      cmocka_unit_test(test_crash_gives_no_keeper_core),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
