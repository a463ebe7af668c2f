/* test_proc.c — children that never outlive the job: death with the parent (SIGKILL, a race at
 * arming, short-lived spawning threads), teardown (grace, stubborn and stopped children, groups,
 * subreaper, bounded time, receipts), pid reuse, adopt, exec failures, fork safety, the fatal path,
 * descriptor closing. Every wait polls against a deadline; each test states its bound. */
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

/* ---------------------------------------------------------------- death with the parent */

/* Bound: every child and grandchild is gone within 1 s of SIGKILL to their parent. */
static void test_parent_sigkill_ends_descendants(void **state) {
  (void)state;
  char file[] = "/tmp/gg_chain_XXXXXX";
  int ffd = mkstemp(file);
  assert_true(ffd >= 0);
  close(ffd);
  int p[2];
  assert_int_equal(pipe(p), 0);
  pid_t mid = fork();
  if (mid == 0) {
    close(p[0]);
    const char *chain[] = {PROC_CHILD, "chain", "2", file, NULL};
    const char *sleeper[] = {"sleep", "30", NULL};
    pid_t a = -1, b = -1;
    if (gg_proc_spawn(NULL, chain, NULL, &a) || gg_proc_spawn(NULL, sleeper, NULL, &b)) _exit(1);
    write_pid(p[1], b);
    for (;;) pause();
  }
  close(p[1]);
  pid_t pids[4];
  pids[0] = read_pid(p[0]);
  close(p[0]);
  /* Wait until the chain of three has written its pids. */
  double t0 = now_ms();
  size_t n = 1;
  while (n < 4 && now_ms() - t0 < 10000) {
    FILE *f = fopen(file, "r");
    n = 1;
    int v;
    while (f && n < 4 && fscanf(f, "%d", &v) == 1) pids[n++] = v;
    if (f) fclose(f);
    if (n < 4) nap_ms(5);
  }
  unlink(file);
  assert_int_equal(n, 4);
  for (size_t i = 0; i < 4; i++) assert_false(gone(pids[i]));
  kill(mid, SIGKILL);
  waitpid(mid, NULL, 0);
  double took = wait_all_gone(pids, 4, 1000);
  printf("  parent SIGKILLed: child, chain of 3 gone after %.1f ms (bound 1000 ms)\n", took);
  assert_true(took >= 0);
  reap_all();
}

/* Bound: a child whose parent died between fork and arming ends within arming delay + 1 s. */
static void test_parent_dies_before_arming(void **state) {
  (void)state;
  int p[2];
  assert_int_equal(pipe(p), 0);
  pid_t mid = fork();
  if (mid == 0) {
    close(p[0]);
    setenv("GPUGUARD_TEST_ARM_DELAY_MS", "300", 1);
    write_pid(p[1], getpid());
    const char *sleeper[] = {"sleep", "30", NULL};
    gg_proc_spawn(NULL, sleeper, NULL, NULL); /* killed inside this call */
    _exit(1);
  }
  close(p[1]);
  (void)read_pid(p[0]);
  close(p[0]);
  /* Find the child of mid: it exists from fork on and waits 300 ms before arming. */
  pid_t child = -1;
  double t0 = now_ms();
  while (child < 0 && now_ms() - t0 < 5000) {
    DIR *d = opendir("/proc");
    struct dirent *e;
    while (d && (e = readdir(d))) {
      gg__pinfo_t info;
      pid_t pid = (pid_t)atoi(e->d_name);
      if (pid > 0 && gg__proc_read_stat(pid, &info) == 0 && info.ppid == mid) child = pid;
    }
    if (d) closedir(d);
    if (child < 0) nap_ms(1);
  }
  assert_true(child > 0);
  kill(mid, SIGKILL);
  waitpid(mid, NULL, 0);
  double took = wait_all_gone(&child, 1, 1300);
  printf(
      "  parent died before arming: child gone after %.1f ms (arming delay 300, bound 1300 ms)\n",
      took);
  assert_true(took >= 0);
  reap_all();
}

/* gg_proc_arm_child for a plain fork(), and the same race: the parent gone before the call. */
static void test_arm_child_after_fork(void **state) {
  (void)state;
  int p[2];
  assert_int_equal(pipe(p), 0);
  pid_t mid = fork();
  if (mid == 0) {
    close(p[0]);
    pid_t armed = fork();
    if (armed == 0) {
      gg_proc_arm_child();
      for (;;) pause();
    }
    pid_t late = fork();
    if (late == 0) {
      nap_ms(300); /* the parent is SIGKILLed meanwhile */
      gg_proc_arm_child();
      for (;;) pause(); /* never reached when the arming works */
    }
    write_pid(p[1], armed);
    write_pid(p[1], late);
    for (;;) pause();
  }
  close(p[1]);
  pid_t kids[2] = {read_pid(p[0]), read_pid(p[0])};
  close(p[0]);
  assert_true(wait_state(kids[0], 'S', 5000)); /* armed and waiting */
  kill(mid, SIGKILL);
  waitpid(mid, NULL, 0);
  double took = wait_all_gone(kids, 2, 1300);
  printf("  gg_proc_arm_child: both forked children gone after %.1f ms (bound 1300 ms)\n", took);
  assert_true(took >= 0);
  reap_all();
}

static void *spawn_thread(void *arg) {
  const char *sleeper[] = {"sleep", "30", NULL};
  gg_proc_spawn(NULL, sleeper, NULL, arg);
  return NULL;
}

/* A child spawned from a thread that exits keeps running (checked 300 ms after the thread ended),
 * then ends within 1 s of its parent's SIGKILL. */
static void test_thread_exit_does_not_kill_child(void **state) {
  (void)state;
  int p[2];
  assert_int_equal(pipe(p), 0);
  pid_t mid = fork();
  if (mid == 0) {
    close(p[0]);
    pid_t child = -1;
    pthread_t t;
    pthread_create(&t, NULL, spawn_thread, &child);
    pthread_join(t, NULL);
    write_pid(p[1], child);
    for (;;) pause();
  }
  close(p[1]);
  pid_t child = read_pid(p[0]);
  close(p[0]);
  assert_true(child > 0);
  assert_true(wait_all_gone(&child, 1, 300) < 0); /* still there 300 ms after the thread ended */
  kill(mid, SIGKILL);
  waitpid(mid, NULL, 0);
  double took = wait_all_gone(&child, 1, 1000);
  printf(
      "  thread-spawned child outlived its thread, gone %.1f ms after the parent (bound 1000 ms)\n",
      took);
  assert_true(took >= 0);
  reap_all();
}

/* ---------------------------------------------------------------- adopt, spawn errors */

static void test_adopt(void **state) {
  (void)state;
  gg_assert_fails(gg_proc_adopt(NULL, 0), GG_EINVAL, "pid 0");
  gg_assert_fails(gg_proc_adopt(NULL, -1), GG_EINVAL, "pid -1");
  gg_assert_fails(gg_proc_adopt(NULL, 1), GG_EPERM, "pid 1");
  gg_assert_fails(gg_proc_adopt(NULL, getpid()), GG_EINVAL, "this process");
  /* an ancestor (the shell or launcher that started us): its teardown would end our own parent */
  gg_assert_fails(gg_proc_adopt(NULL, getppid()), GG_EPERM, "ancestor");
  gg_assert_fails(gg_proc_adopt(NULL, unused_pid()), GG_ENOTFOUND, "no process");
  if (geteuid() == 0) { /* a process of another user */
    pid_t foreign = fork();
    if (foreign == 0) {
      if (setgid(65534) != 0 || setuid(65534) != 0) _exit(1);
      for (;;) pause();
    }
    double t0 = now_ms();
    uid_t uid = 0;
    while (now_ms() - t0 < 5000 && !(gg__proc_uid(foreign, &uid) == 0 && uid == 65534)) nap_ms(2);
    gg_assert_fails(gg_proc_adopt(NULL, foreign), GG_EPERM, "uid 65534");
    kill(foreign, SIGKILL);
    waitpid(foreign, NULL, 0);
  }
  /* A child made by plain fork(), as multiprocessing does: adopted, then ended and reaped. */
  pid_t kid = fork();
  if (kid == 0) {
    for (;;) pause();
  }
  gg_assert_ok(gg_proc_adopt(NULL, kid));
  gg_assert_ok(gg_proc_adopt(NULL, kid)); /* again: already ours */
  gg_guard_t *other_guard = quiet_guard();
  gg_assert_fails(gg_proc_adopt(other_guard, kid), GG_EINVAL, "another guard");
  gg_proc_receipt_t *r = NULL;
  gg_assert_ok(gg_proc_teardown_ex(NULL, 2000, &r));
  assert_int_equal(outcome(r, kid)->end, GG_PROC_SIGNALED);
  assert_int_equal(outcome(r, kid)->code, SIGTERM);
  gg_proc_receipt_free(r);
  assert_int_equal(waitpid(kid, NULL, WNOHANG), -1); /* reaped by the teardown */
  gg_assert_ok(gg_guard_destroy(other_guard));
}

static void test_spawn_errors(void **state) {
  (void)state;
  gg_assert_fails(gg_proc_spawn(NULL, NULL, NULL, NULL), GG_EINVAL, "argv");
  const char *empty[] = {NULL};
  gg_assert_fails(gg_proc_spawn(NULL, empty, NULL, NULL), GG_EINVAL, "argv");
  const char *missing[] = {"/nonexistent/gg-prog", NULL};
  gg_assert_fails(gg_proc_spawn(NULL, missing, NULL, NULL), GG_ENOTFOUND,
                  "cannot execute '/nonexistent/gg-prog'");
  const char *unpathed[] = {"gg-no-such-program", NULL};
  gg_assert_fails(gg_proc_spawn(NULL, unpathed, NULL, NULL), GG_ENOTFOUND,
                  "'gg-no-such-program' not found in PATH");
  char file[] = "/tmp/gg_noexec_XXXXXX";
  int fd = mkstemp(file);
  assert_true(fd >= 0);
  close(fd);
  const char *noexec[] = {file, NULL};
  gg_assert_fails(gg_proc_spawn(NULL, noexec, NULL, NULL), GG_EPERM, "Permission denied");
  unlink(file);
  gg_spawn_options_t o;
  gg_spawn_options_init(&o);
  o.cwd = "/nonexistent-dir";
  const char *sleeper[] = {"sleep", "30", NULL};
  gg_assert_fails(gg_proc_spawn(NULL, sleeper, &o, NULL), GG_EIO,
                  "change directory to /nonexistent-dir");
  gg_spawn_options_init(&o);
  o.stdout_fd = 999;
  gg_assert_fails(gg_proc_spawn(NULL, sleeper, &o, NULL), GG_EINVAL, "stdout descriptor 999");
  o.size = 3;
  gg_assert_fails(gg_proc_spawn(NULL, sleeper, &o, NULL), GG_EINVAL, "gg_spawn_options_init");
  gg_assert_fails(gg_proc_teardown(NULL, -1), GG_EINVAL, "grace_ms");
  gg_assert_ok(gg_proc_teardown(NULL, 0)); /* nothing was left behind by the failures */
}

/* Environment, working directory and standard streams reach the child; the session id is added. */
static void test_spawn_options(void **state) {
  (void)state;
  setenv("GPUGUARD_SESSION", "abc123", 1);
  int p[2];
  assert_int_equal(pipe(p), 0);
  gg_spawn_options_t o;
  gg_spawn_options_init(&o);
  char *env[] = {"FOO=bar", NULL};
  o.env = env;
  o.cwd = "/tmp";
  o.stdout_fd = p[1];
  const char *argv[] = {"/bin/sh", "-c", "echo \"$FOO $(pwd) $GPUGUARD_SESSION\"", NULL};
  pid_t pid = spawn_ok(NULL, argv, &o);
  close(p[1]);
  char line[256];
  assert_true(read_line(p[0], line, sizeof line, 10000));
  assert_string_equal(line, "bar /tmp abc123");
  close(p[0]);
  assert_true(wait_all_gone(&pid, 1, 10000) >=
              0); /* exited by itself (a zombie until teardown reaps it) */
  gg_proc_receipt_t *r = NULL;
  gg_assert_ok(gg_proc_teardown_ex(NULL, 2000, &r));
  assert_int_equal(outcome(r, pid)->end, GG_PROC_EXITED);
  assert_int_equal(outcome(r, pid)->code, 0);
  gg_proc_receipt_free(r);
  unsetenv("GPUGUARD_SESSION");
}

/* The receipt's JSON: escaping, and a buffer too small says how much is needed. */
static void test_receipt_json(void **state) {
  (void)state;
  gg_proc_outcome_t o = {.pid = 42,
                         .ppid = 1,
                         .start_time = 7,
                         .found = "tracked",
                         .sent = GG_PROC_SENT_TERM | GG_PROC_SENT_KILL,
                         .end = GG_PROC_ALIVE,
                         .state = 'D'};
  strcpy(o.command, "x \"q\" \\ \n");
  gg_proc_receipt_t r = {
      .count = 1, .n_alive = 1, .grace_ms = 100, .elapsed_ms = 350.25, .procs = &o};
  char buf[512];
  size_t len = 0;
  gg_assert_ok(gg_proc_receipt_json(&r, buf, sizeof buf, &len));
  assert_int_equal(len, strlen(buf));
  assert_string_equal(
      buf,
      "{\"grace_ms\":100,\"elapsed_ms\":350.2,\"alive\":1,\"processes\":[{\"pid\":42,\"ppid\":1,"
      "\"start_time\":7,\"command\":\"x \\\"q\\\" \\\\ \\n\",\"found\":\"tracked\","
      "\"sent\":[\"TERM\",\"KILL\"],\"end\":\"alive\",\"code\":0,\"state\":\"D\"}]}");
  char small[16];
  size_t need = 0;
  gg_assert_fails(gg_proc_receipt_json(&r, small, sizeof small, &need), GG_ENOMEM, "needs");
  assert_int_equal(need, len);
  assert_int_equal(strlen(small), sizeof small - 1);
  gg_assert_fails(gg_proc_receipt_json(NULL, buf, sizeof buf, NULL), GG_EINVAL, "NULL");
}

/* ---------------------------------------------------------------- fork safety, fatal path */

/* A forked child refuses its parent's guard set (GG_ESTATE), starts an empty default set, and
 * neither teardown nor the fatal path touches the parent's children. */
static void test_fork_inherited_set(void **state) {
  (void)state;
  gg_guard_t *g = quiet_guard();
  const char *sleeper[] = {"sleep", "30", NULL};
  pid_t a = spawn_ok(g, sleeper, NULL), b = spawn_ok(NULL, sleeper, NULL);
  pid_t kid = fork();
  if (kid == 0) {
    int bad = 0;
    if (gg_proc_teardown(g, 0) != GG_ESTATE || !strstr(gg_last_error(), "fork()")) bad |= 1;
    if (gg_proc_spawn(g, sleeper, NULL, NULL) != GG_ESTATE) bad |= 2; /* the guard refuses too */
    gg_proc_receipt_t *r = NULL;
    if (gg_proc_teardown_ex(NULL, 0, &r) != 0 || r->count != 0) bad |= 4;
    gg_proc_receipt_free(r);
    gg__proc_fatal_kill(0, NULL);
    /* The child can still have children of its own. */
    const char *t[] = {"true", NULL};
    if (gg_proc_spawn(NULL, t, NULL, NULL) != 0 || gg_proc_teardown(NULL, 1000) != 0) bad |= 8;
    _exit(bad);
  }
  int st = 0;
  assert_int_equal(waitpid(kid, &st, 0), kid);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
  assert_false(gone(a));
  assert_false(gone(b));
  gg_assert_ok(gg_proc_teardown(g, 1000));
  gg_assert_ok(gg_proc_teardown(NULL, 1000));
  gg_assert_ok(gg_guard_destroy(g));
}

/* A guard torn down refuses new children: none could outlive it unnoticed. */
static void test_spawn_on_torn_down_guard(void **state) {
  (void)state;
  gg_guard_t *g = quiet_guard();
  const char *sleeper[] = {"sleep", "30", NULL};
  pid_t a = spawn_ok(g, sleeper, NULL);
  gg_assert_ok(gg_guard_destroy(g)); /* ends a */
  reap_all();
  assert_true(gone(a));
  pid_t pid = -1;
  gg_assert_fails(gg_proc_spawn(g, sleeper, NULL, &pid), GG_EINVAL, "not a live guard");
  assert_int_equal(pid, -1);
}

static void on_segv(int sig) {
  gg__proc_fatal_kill(0, NULL);
  signal(sig, SIG_DFL);
  raise(sig);
}

/* The fatal path: a crashing process's adopted child (which has no death signal) is SIGKILLed by
 * the handler within 1 s, and its registry record is unlinked. */
static void test_fatal_path(void **state) {
  (void)state;
  char dir[] = "/tmp/gg_reg_XXXXXX";
  assert_non_null(mkdtemp(dir));
  setenv("GPUGUARD_REGISTRY_DIR", dir, 1);
  int p[2];
  assert_int_equal(pipe(p), 0);
  pid_t mid = fork();
  if (mid == 0) {
    close(p[0]);
    pid_t plain = fork();
    if (plain == 0) {
      for (;;) pause();
    }
    if (gg_proc_adopt(NULL, plain) != 0 || gg_registry_register("0") != 0) _exit(1);
    gg_spawn_options_t o;
    gg_spawn_options_init(&o);
    o.new_process_group = 1;
    o.death_signal = 0; /* only the fatal path can end it */
    const char *argv[] = {"/bin/sh", "-c", "sleep 30 & wait", NULL};
    pid_t grouped = -1;
    if (gg_proc_spawn(NULL, argv, &o, &grouped) != 0) _exit(1);
    write_pid(p[1], plain);
    write_pid(p[1], grouped);
    pid_t member[1] = {-1};
    double t0 = now_ms();
    while (children_of(grouped, member, 1) < 1 && now_ms() - t0 < 10000) nap_ms(2);
    write_pid(p[1], member[0]);
    signal(SIGSEGV, on_segv);
    raise(SIGSEGV);
    _exit(1);
  }
  close(p[1]);
  pid_t kids[3] = {read_pid(p[0]), read_pid(p[0]), read_pid(p[0])};
  close(p[0]);
  int st = 0;
  assert_int_equal(waitpid(mid, &st, 0), mid);
  assert_true(WIFSIGNALED(st));
  assert_int_equal(WTERMSIG(st), SIGSEGV);
  double took = wait_all_gone(kids, 3, 1000);
  printf("  fatal path: adopted child, group leader and member gone %.1f ms after the crash (bound "
         "1000 ms)\n",
         took);
  assert_true(took >= 0);
  char rec[512];
  snprintf(rec, sizeof rec, "%s/%d.rec", dir, (int)mid);
  assert_int_equal(access(rec, F_OK), -1);
  rmdir(dir);
  unsetenv("GPUGUARD_REGISTRY_DIR");
  unsetenv("GPUGUARD_SESSION");
  reap_all();
}

/* /dev/nvidia* closing, pointed at a temporary file instead. */
static void test_close_fds_matching(void **state) {
  (void)state;
  char file[] = "/tmp/gg_fakedev_XXXXXX";
  int keep = mkstemp(file);
  assert_true(keep >= 0);
  int a = open(file, O_RDONLY), b = open(file, O_RDONLY);
  int other = open("/dev/null", O_RDONLY);
  assert_int_equal(gg__close_fds_matching(file), 3);
  assert_int_equal(fcntl(a, F_GETFD), -1);
  assert_int_equal(fcntl(b, F_GETFD), -1);
  assert_int_equal(fcntl(keep, F_GETFD), -1);
  assert_true(fcntl(other, F_GETFD) >= 0);
  close(other);
  unlink(file);
  assert_true(gg_proc_close_device_fds() >= 0); /* no GPU here: nothing to close, no error */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parent_sigkill_ends_descendants),
      cmocka_unit_test(test_parent_dies_before_arming),
      cmocka_unit_test(test_arm_child_after_fork),
      cmocka_unit_test(test_thread_exit_does_not_kill_child),
      cmocka_unit_test(test_adopt),
      cmocka_unit_test(test_spawn_errors),
      cmocka_unit_test(test_spawn_options),
      cmocka_unit_test(test_receipt_json),
      cmocka_unit_test(test_fork_inherited_set),
      cmocka_unit_test(test_spawn_on_torn_down_guard),
      cmocka_unit_test(test_fatal_path),
      cmocka_unit_test(test_close_fds_matching),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
