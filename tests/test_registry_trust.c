/* test_registry_trust.c — what the registry believes, so that reap kills no live job: an inherited
 * session is joined only while its leader lives and is our ancestor; records written in another pid
 * namespace are judged there or counted alive; record names and pids beyond an int are refused; a
 * trailing slash does not get a symlinked directory through; warnings about bad entries are capped.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gg_test.h"
#include "proc/procfs_internal.h"

static char dir[64];

static int setup(void **state) {
  (void)state;
  strcpy(dir, "/tmp/gg_regtrust_XXXXXX");
  if (!mkdtemp(dir)) return -1;
  setenv("GPUGUARD_REGISTRY_DIR", dir, 1);
  unsetenv("GPUGUARD_SESSION");
  return 0;
}

static int teardown(void **state) {
  (void)state;
  char cmd[200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s.link'", dir, dir);
  unsetenv("GPUGUARD_REGISTRY_DIR");
  unsetenv("GPUGUARD_SESSION");
  return system(cmd) == 0 ? 0 : -1;
}

static void write_record(pid_t pid, unsigned long long start, const char *session,
                         const char *extra) {
  char path[160], text[512];
  snprintf(path, sizeof path, "%s/%d.rec", dir, (int)pid);
  snprintf(
      text, sizeof text,
      "gpuguard-record 2\npid %d\nstart %llu\nppid 1\nsession %s\nrole leader\ndevices \ncmd x\n%s",
      (int)pid, start, session, extra ? extra : "");
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  close(fd);
}

static unsigned long long start_of(pid_t pid) {
  gg__pinfo_t info;
  assert_int_equal(gg__proc_read_stat(pid, &info), 0);
  return info.start;
}

/* In a child: registers with GPUGUARD_SESSION=session; exits 0 when the role is `want` (and, as a
 * leader, the session is a new one, the one its spawned children get). */
static int register_as(const char *session, const char *want) {
  pid_t kid = fork();
  assert_true(kid >= 0);
  if (kid == 0) {
    setenv("GPUGUARD_SESSION", session, 1);
    if (gg_registry_register(NULL) != 0) _exit(10);
    gg_session_record_t rows[16];
    size_t n = 0;
    if (gg_registry_list(rows, 16, &n) != 0) _exit(11);
    for (size_t i = 0; i < n && i < 16; i++) {
      if (rows[i].pid != getpid()) continue;
      if (strcmp(rows[i].role, want) != 0) _exit(12);
      bool joined = strcmp(rows[i].session, session) == 0;
      if (joined != (strcmp(want, "worker") == 0)) _exit(13);
      char mine[40];
      if (gg_registry_session(mine, sizeof mine) != 0 || strcmp(mine, rows[i].session) != 0)
        _exit(14);
      gg_registry_unregister();
      _exit(0);
    }
    _exit(15);
  }
  int st = 0;
  assert_int_equal(waitpid(kid, &st, 0), kid);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 100;
}

/* Item 5: GPUGUARD_SESSION naming a dead session (or a live one that is not ours) is not joined:
 * the process would be that session's orphan to `reap`. The leader's own child joins. */
static void test_inherited_session_is_checked(void **state) {
  (void)state;
  write_record(getpid(), start_of(getpid()) + 7, "dead01",
               NULL); /* our pid, another start: stale */
  assert_int_equal(register_as("dead01", "leader"), 0);
  assert_int_equal(register_as("0123456789abcdef", "leader"), 0); /* no record at all */
  pid_t other = fork(); /* alive, ours, but not our ancestor */
  if (other == 0) {
    pause();
    _exit(0);
  }
  write_record(other, start_of(other), "a11fe02", NULL);
  assert_int_equal(register_as("a11fe02", "leader"), 0);
  kill(other, SIGKILL);
  waitpid(other, NULL, 0);
  write_record(getpid(), start_of(getpid()), "bea703", NULL); /* us: the child's parent */
  assert_int_equal(register_as("bea703", "worker"), 0);
}

/* Item 15: a pid beyond an int (in the name or in the record) would wrap onto another process. */
static void test_pids_beyond_int_are_refused(void **state) {
  (void)state;
  char path[160];
  const char *text = "gpuguard-record 1\npid 4294967297\nstart 1\nppid 1\nsession ab\nrole "
                     "leader\ndevices \ncmd x\n";
  snprintf(path, sizeof path, "%s/4294967297.rec", dir);
  int fd = open(path, O_WRONLY | O_CREAT, 0600);
  assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  close(fd);
  snprintf(path, sizeof path, "%s/1.rec", dir);
  fd = open(path, O_WRONLY | O_CREAT, 0600);
  assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  close(fd);
  size_t n = 9;
  gg_session_record_t rows[4];
  gg_assert_ok(gg_registry_list(rows, 4, &n));
  assert_int_equal(n, 0);
}

/* Item 15: "link/" names the symlink's target; the trailing slash must not get it through. */
static void test_trailing_slash_symlink_refused(void **state) {
  (void)state;
  char link[96], env[100], got[256];
  snprintf(link, sizeof link, "%s.link", dir);
  assert_int_equal(symlink(dir, link), 0);
  for (int k = 1; k <= 3; k++) {
    snprintf(env, sizeof env, "%s%.*s", link, k, "///");
    setenv("GPUGUARD_REGISTRY_DIR", env, 1);
    gg_assert_fails(gg_registry_dir(got, sizeof got), GG_EPERM, "symlink");
  }
  snprintf(env, sizeof env, "%s/", dir);
  setenv("GPUGUARD_REGISTRY_DIR", env, 1);
  gg_assert_ok(gg_registry_dir(got, sizeof got));
  assert_string_equal(got, dir);
}

static int count_lines(const char *path, const char *needle) {
  FILE *f = fopen(path, "r");
  char line[512];
  int n = 0;
  while (f && fgets(line, sizeof line, f))
    if (strstr(line, needle)) n++;
  if (f) fclose(f);
  return n;
}

/* Item 15: one warning per bad name, at most 64 names, then one line saying the rest are skipped.
 * */
static void test_warnings_are_capped(void **state) {
  (void)state;
  for (int i = 0; i < 100; i++) {
    char path[160];
    snprintf(path, sizeof path, "%s/junk%03d", dir, i);
    int fd = open(path, O_WRONLY | O_CREAT, 0600);
    close(fd);
  }
  char log[] = "/tmp/gg_regtrust_log_XXXXXX";
  int lfd = mkstemp(log);
  assert_true(lfd >= 0);
  fflush(stderr);
  int saved = dup(2);
  dup2(lfd, 2);
  size_t n = 0;
  for (int round = 0; round < 3; round++) gg_assert_ok(gg_registry_list(NULL, 0, &n));
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  close(lfd);
  int junk =
      count_lines(log, "skipping 'junk"); /* earlier tests of this process used a few names */
  assert_true(junk >= 60 && junk <= 64);
  assert_int_equal(count_lines(log, "more than 64 bad entries"), 1);
  unlink(log);
}

/* Item 3: a record from a pid namespace we know nothing about is alive until proven dead. */
static void test_foreign_namespace_unknown_is_alive(void **state) {
  (void)state;
  write_record(2, 12345, "f0e1", "pidns 1\nhostpid 0\n"); /* inode 1 is no namespace of ours */
  gg_session_record_t rows[4];
  size_t n = 0, removed = 9;
  gg_assert_ok(gg_registry_list(rows, 4, &n));
  assert_int_equal(n, 1);
  assert_false(rows[0].stale);
  gg_assert_ok(gg_registry_prune(&removed));
  assert_int_equal(removed, 0);
  /* The same record from our own namespace is judged by its pid: pid 2 never started at tick 12345.
   * */
  unsigned long long ns = 0;
  assert_int_equal(gg__proc_pidns(0, &ns), 0);
  char extra[64];
  snprintf(extra, sizeof extra, "pidns %llu\nhostpid 0\n", ns);
  write_record(2, 12345, "f0e1", extra);
  gg_assert_ok(gg_registry_list(rows, 4, &n));
  assert_true(rows[0].stale);
}

/* Item 3 with a real namespace (root only): a leader registered as pid 1 of its own namespace is
 * alive from here; another pid of that namespace, which we can see, is proven dead. */
static void test_real_namespace(void **state) {
  (void)state;
  int go[2], ready[2];
  assert_int_equal(pipe(go), 0);
  assert_int_equal(pipe(ready), 0);
  pid_t outer = fork();
  if (outer == 0) {
    if (unshare(CLONE_NEWPID) != 0) _exit(77);
    pid_t init = fork();
    if (init == 0) {
      char c = gg_registry_register(NULL) == 0 ? (getpid() == 1 ? 'y' : 'p') : 'n';
      if (write(ready[1], &c, 1) != 1) _exit(1);
      if (read(go[0], &c, 1) < 0) _exit(1);
      _exit(0);
    }
    waitpid(init, NULL, 0);
    _exit(0);
  }
  char c = 0;
  close(ready[1]);
  if (read(ready[0], &c, 1) != 1) { /* unshare refused: not root, or namespaces are off */
    waitpid(outer, NULL, 0);
    skip();
  }
  assert_int_equal(c, 'y');
  gg_session_record_t rows[4];
  size_t n = 0;
  gg_assert_ok(gg_registry_list(rows, 4, &n));
  assert_int_equal(n, 1);
  assert_int_equal(rows[0].pid, 1);
  assert_false(
      rows[0].stale); /* pid 1 here is init, long started: judged by pid, it looked stale */
  /* A second record of the same namespace naming a pid nobody has there: visible namespace, dead.
   */
  /* Records outside the initial namespace are named PID.NAMESPACE.rec. */
  char path[160], text[1024], ns[32] = "";
  DIR *d = opendir(dir);
  for (struct dirent *e; d && (e = readdir(d));)
    if (strncmp(e->d_name, "1.", 2) == 0) sscanf(e->d_name, "1.%31[0-9].rec", ns);
  if (d) closedir(d);
  assert_true(ns[0] != '\0');
  snprintf(path, sizeof path, "%s/1.%s.rec", dir, ns);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  size_t len = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[len] = '\0';
  char *p = strstr(text, "pid 1\n"), *h = strstr(text, "hostpid ");
  assert_non_null(p);
  assert_non_null(h);
  p[4] = '7';
  strcpy(h, "hostpid 0\n");
  snprintf(path, sizeof path, "%s/7.%s.rec", dir, ns);
  int fd = open(path, O_WRONLY | O_CREAT, 0600);
  assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  close(fd);
  gg_assert_ok(gg_registry_list(rows, 4, &n));
  assert_int_equal(n, 2);
  for (size_t i = 0; i < n; i++) assert_int_equal(rows[i].stale, rows[i].pid == 7);
  /* Once the namespace is gone nothing here can prove anything: both count as alive (documented).
   * */
  assert_int_equal(write(go[1], "x", 1), 1);
  waitpid(outer, NULL, 0);
  gg_assert_ok(gg_registry_list(rows, 4, &n));
  for (size_t i = 0; i < n; i++) assert_false(rows[i].stale);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_inherited_session_is_checked, setup, teardown),
      cmocka_unit_test_setup_teardown(test_pids_beyond_int_are_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_trailing_slash_symlink_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_warnings_are_capped, setup, teardown),
      cmocka_unit_test_setup_teardown(test_foreign_namespace_unknown_is_alive, setup, teardown),
      cmocka_unit_test_setup_teardown(test_real_namespace, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
