/* test_registry.c — the session registry: records appear and disappear, workers inherit the
 * session, stale records are flagged and pruned, unsafe directories are refused, garbage is
 * skipped. Each test uses its own directory through GPUGUARD_REGISTRY_DIR. */
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gg_test.h"
#include "proc/procfs_internal.h"
#include "proc/registry_internal.h"

static char dir[64];

static int setup(void **state) {
  (void)state;
  strcpy(dir, "/tmp/gg_registry_XXXXXX");
  if (!mkdtemp(dir)) return -1;
  setenv("GPUGUARD_REGISTRY_DIR", dir, 1);
  unsetenv("GPUGUARD_SESSION");
  return 0;
}

static int teardown(void **state) {
  (void)state;
  char cmd[200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s.link'", dir, dir);
  gg_registry_unregister();
  unsetenv("GPUGUARD_REGISTRY_DIR");
  unsetenv("GPUGUARD_SESSION");
  return system(cmd) == 0 ? 0 : -1;
}

static void write_file(const char *name, const char *text, mode_t mode) {
  char path[256];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  close(fd);
  chmod(path, mode);
}

static const gg_session_record_t *find(const gg_session_record_t *rows, size_t n, pid_t pid) {
  for (size_t i = 0; i < n; i++)
    if (rows[i].pid == pid) return &rows[i];
  return NULL;
}

static void test_register_list_unregister(void **state) {
  (void)state;
  char got[256];
  gg_assert_ok(gg_registry_dir(got, sizeof got));
  assert_string_equal(got, dir);
  gg_assert_ok(gg_registry_register("0,1"));
  char path[256];
  snprintf(path, sizeof path, "%s/%d.rec", dir, (int)getpid());
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0600);

  gg_session_record_t rows[8];
  size_t n = 0;
  gg_assert_ok(gg_registry_list(rows, 8, &n));
  assert_int_equal(n, 1);
  assert_int_equal(rows[0].pid, getpid());
  assert_int_equal(rows[0].ppid, getppid());
  assert_string_equal(rows[0].role, "leader");
  assert_string_equal(rows[0].devices, "0,1");
  assert_int_equal(strlen(rows[0].session), 32);
  assert_false(rows[0].stale);
  assert_true(rows[0].parent_alive);
  assert_non_null(strstr(rows[0].command, "test_registry"));
  char session[40];
  gg_assert_ok(gg_registry_session(session, sizeof session));
  assert_string_equal(session, rows[0].session);
  assert_null(
      getenv("GPUGUARD_SESSION")); /* never setenv(): spawned children get it in their own envp */

  /* A forked worker inherits the session; after it dies without unregistering, its record is stale.
   * */
  pid_t kid = fork();
  if (kid == 0) _exit(gg_registry_register(NULL) == 0 ? 0 : 1);
  int wst = 0;
  assert_int_equal(waitpid(kid, &wst, 0), kid);
  assert_int_equal(WEXITSTATUS(wst), 0);
  gg_assert_ok(gg_registry_list(rows, 8, &n));
  assert_int_equal(n, 2);
  const gg_session_record_t *w = find(rows, n, kid);
  assert_non_null(w);
  assert_string_equal(w->role, "worker");
  assert_string_equal(w->session, session);
  assert_int_equal(w->ppid, getpid());
  assert_true(w->stale);
  assert_false(find(rows, n, getpid())->stale);

  size_t removed = 0;
  gg_assert_ok(gg_registry_prune(&removed));
  assert_int_equal(removed, 1);
  gg_assert_ok(gg_registry_unregister());
  assert_int_equal(access(path, F_OK), -1);
  gg_assert_ok(gg_registry_list(rows, 8, &n));
  assert_int_equal(n, 0);
  gg_assert_ok(gg_registry_unregister()); /* twice is fine */
}

/* A record of this process's pid with a start time `delta` ticks off its own, in text (for name).
 * */
static int self_record(char *text, size_t cap, char *name, size_t name_cap,
                       unsigned long long delta, const char *session) {
  gg__pinfo_t me;
  assert_int_equal(gg__proc_read_stat(getpid(), &me), 0);
  snprintf(name, name_cap, "%d.rec", (int)getpid());
  return snprintf(
      text, cap,
      "gpuguard-record 1\npid %d\nstart %llu\nppid 1\nsession %s\nrole leader\ndevices \ncmd x\n",
      (int)getpid(), me.start + delta, session);
}

/* A record whose pid now names another process (different start time) is stale too. */
static void test_stale_by_start_time(void **state) {
  (void)state;
  char text[256], name[32];
  self_record(text, sizeof text, name, sizeof name, 5, "ab12");
  write_file(name, text, 0600);
  gg_session_record_t row;
  size_t n = 0;
  gg_assert_ok(gg_registry_list(&row, 1, &n));
  assert_int_equal(n, 1);
  assert_true(row.stale);
  size_t removed = 0;
  gg_assert_ok(gg_registry_prune(&removed));
  assert_int_equal(removed, 1);
}

/* Between prune's judgement and the removal, the process whose pid the stale record names registers
 * (rename over the name, as gg_registry_register does): its live record must stay, or reap would
 * take a live session for an orphan. */
static void replace_with_live(int dfd, const char *name) {
  char text[256], mine[32];
  int len = self_record(text, sizeof text, mine, sizeof mine, 0, "cd34");
  int fd = openat(dfd, ".live.tmp", O_WRONLY | O_CREAT | O_TRUNC, 0600);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, text, (size_t)len), len);
  close(fd);
  assert_int_equal(renameat(dfd, ".live.tmp", dfd, name), 0);
}

static void test_prune_keeps_a_record_replaced_meanwhile(void **state) {
  (void)state;
  char text[256], name[32];
  self_record(text, sizeof text, name, sizeof name, 5, "ab12");
  write_file(name, text, 0600);
  gg__registry_test_prune_hook(replace_with_live);
  size_t removed = 9;
  int rc = gg_registry_prune(&removed);
  gg__registry_test_prune_hook(NULL);
  gg_assert_ok(rc);
  assert_int_equal(removed, 0);
  gg_session_record_t row;
  size_t n = 0;
  gg_assert_ok(gg_registry_list(&row, 1, &n));
  assert_int_equal(n, 1); /* the live record is there, under its own name, nothing else */
  assert_false(row.stale);
  assert_string_equal(row.session, "cd34");
  /* Without the replacement, the stale record still goes. */
  write_file(name, text, 0600);
  gg_assert_ok(gg_registry_prune(&removed));
  assert_int_equal(removed, 1);
  gg_assert_ok(gg_registry_list(&row, 1, &n));
  assert_int_equal(n, 0);
}

/* Garbage, foreign-looking and symlinked records are skipped (with a warning), never listed. */
static void test_garbage_skipped(void **state) {
  (void)state;
  gg_assert_ok(gg_registry_register(NULL));
  write_file("123.rec", "hello\n", 0600);
  write_file("notes.txt", "not a record\n", 0600);
  write_file(
      "124.rec",
      "gpuguard-record 1\npid 999\nstart 1\nppid 1\nsession ab\nrole leader\ndevices \ncmd x\n",
      0600); /* pid does not match the name */
  write_file(
      "125.rec",
      "gpuguard-record 1\npid 125\nstart 1\nppid 1\nsession ab\nrole king\ndevices \ncmd x\n",
      0600);
  write_file(
      "126.rec",
      "gpuguard-record 1\npid 126\nstart 1\nppid 1\nsession ab\nrole leader\ndevices \ncmd x\n",
      0666); /* others could have written it */
  char target[160], link[160];
  snprintf(target, sizeof target, "%s/%d.rec", dir, (int)getpid());
  snprintf(link, sizeof link, "%s/127.rec", dir);
  assert_int_equal(symlink(target, link), 0);
  gg_session_record_t rows[8];
  size_t n = 0;
  gg_assert_ok(gg_registry_list(rows, 8, &n));
  assert_int_equal(n, 1);
  assert_int_equal(rows[0].pid, getpid());
  /* Asking with no room still counts. */
  gg_assert_ok(gg_registry_list(NULL, 0, &n));
  assert_int_equal(n, 1);
  gg_assert_fails(gg_registry_list(NULL, 4, &n), GG_EINVAL, "rows");
  gg_assert_ok(gg_registry_unregister());
}

/* Unsafe directories are refused: a symlink, group/world access, a file, another user's (as root).
 * */
static void test_unsafe_dir_refused(void **state) {
  (void)state;
  char got[256], link[96];
  snprintf(link, sizeof link, "%s.link", dir);
  assert_int_equal(symlink(dir, link), 0);
  setenv("GPUGUARD_REGISTRY_DIR", link, 1);
  gg_assert_fails(gg_registry_dir(got, sizeof got), GG_EPERM, "symlink");
  gg_assert_fails(gg_registry_register(NULL), GG_EPERM, "symlink");
  unlink(link);

  setenv("GPUGUARD_REGISTRY_DIR", dir, 1);
  chmod(dir, 0755);
  gg_assert_fails(gg_registry_dir(got, sizeof got), GG_EPERM, "mode 0755");
  chmod(dir, 0700);
  gg_assert_ok(gg_registry_dir(got, sizeof got));

  char file[160];
  snprintf(file, sizeof file, "%s/plain", dir);
  write_file("plain", "x", 0600);
  setenv("GPUGUARD_REGISTRY_DIR", file, 1);
  gg_assert_fails(gg_registry_dir(got, sizeof got), GG_EPERM, "not a directory");

  if (geteuid() == 0) {
    setenv("GPUGUARD_REGISTRY_DIR", dir, 1);
    assert_int_equal(chown(dir, 65534, 65534), 0);
    gg_assert_fails(gg_registry_dir(got, sizeof got), GG_EPERM, "owned by uid 65534");
    assert_int_equal(chown(dir, 0, 0), 0);
  }
  setenv("GPUGUARD_REGISTRY_DIR", dir, 1);
  gg_assert_fails(gg_registry_dir(got, 4), GG_EINVAL, "does not fit");
}

/* Without the override: a private directory named for the user is created, mode 0700. */
static void test_default_location(void **state) {
  (void)state;
  unsetenv("GPUGUARD_REGISTRY_DIR");
  setenv("XDG_RUNTIME_DIR", dir, 1);
  char got[256], want[256];
  gg_assert_ok(gg_registry_dir(got, sizeof got));
  snprintf(want, sizeof want, "%s/gpuguard", dir);
  assert_string_equal(got, want);
  struct stat st;
  assert_int_equal(stat(got, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0700);
  unsetenv("XDG_RUNTIME_DIR");
}

/* A relative GPUGUARD_REGISTRY_DIR names the directory it named at first use: after a chdir the
 * record is still removed from where it was written (a record left there would make reap take the
 * session's live helpers for a dead leader's orphans), and the directory is said as an absolute
 * path. */
static void test_relative_dir_survives_chdir(void **state) {
  (void)state;
  char here[4096], elsewhere[96], sub[160], got[4096], path[4200];
  assert_non_null(getcwd(here, sizeof here));
  snprintf(elsewhere, sizeof elsewhere, "%s/elsewhere", dir);
  assert_int_equal(mkdir(elsewhere, 0700), 0);
  assert_int_equal(chdir(dir), 0);
  setenv("GPUGUARD_REGISTRY_DIR", "reg", 1);
  gg_assert_ok(gg_registry_register("0"));
  snprintf(sub, sizeof sub, "%s/reg", dir);
  snprintf(path, sizeof path, "%s/%d.rec", sub, (int)getpid());
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  assert_int_equal(chdir(elsewhere), 0);
  gg_assert_ok(gg_registry_unregister());
  bool left = stat(path, &st) == 0;
  gg_assert_ok(gg_registry_dir(got, sizeof got));
  assert_int_equal(chdir(here), 0);
  if (left) fail_msg("the record %s was left behind after a chdir", path);
  assert_string_equal(got, sub);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_register_list_unregister, setup, teardown),
      cmocka_unit_test_setup_teardown(test_stale_by_start_time, setup, teardown),
      cmocka_unit_test_setup_teardown(test_prune_keeps_a_record_replaced_meanwhile, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_garbage_skipped, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unsafe_dir_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_default_location, setup, teardown),
      cmocka_unit_test_setup_teardown(test_relative_dir_survives_chdir, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
