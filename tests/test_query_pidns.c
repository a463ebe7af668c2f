/* test_query_pidns.c — gg_process_list inside a PID namespace (a container): NVML's pids may be the
 * host's, so a pid is joined with /proc only when the process of that number here holds the device
 * open; another process that merely has the same number here is never shown in its place (a wrong
 * row would send `reap` or a person after an innocent process). Runs a real namespace with its own
 * /proc and a stand-in /dev/nvidia7 on a private tmpfs; needs root, skipped otherwise. NVML is the
 * test stand-in. */
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gg_test.h"

static const gg_process_t *row_of(const gg_process_t *rows, size_t n, int pid) {
  for (size_t i = 0; i < n; i++)
    if (rows[i].pid == pid) return &rows[i];
  return NULL;
}

/* pid 1 of the new namespace: makes pid 2 (no device) and pid 3 (holds /dev/nvidia7), lists,
 * judges. Exit codes: 0 right, 1 the unrelated pid 2 was shown as a GPU process, 2 the holder was
 * not joined, 10+ setup failures. */
static int inside(void) {
  if (mount("proc", "/proc", "proc", 0, NULL) != 0) return 10;
  if (mount("tmpfs", "/dev", "tmpfs", 0, "mode=0755") != 0) return 11;
  /* Node 7 (the stand-in NVML's minor): on a GPU machine the CUDA driver, initialised by the query
   * in this process, sets up the nodes of the real devices (nvidia0...) in this /dev itself. */
  int fd = open("/dev/nvidia7", O_CREAT | O_RDWR, 0666);
  if (fd < 0) return 12;
  close(fd);
  int sync[2];
  if (pipe(sync) != 0) return 13;
  pid_t plain = fork(); /* pid 2 here: the number a host pid 2 would be mistaken for */
  if (plain == 0) {
    for (;;) pause();
  }
  pid_t holder = fork(); /* pid 3: a GPU process of this namespace */
  if (holder == 0) {
    int dev = open("/dev/nvidia7", O_RDWR);
    if (dev < 0 || write(sync[1], "k", 1) != 1) _exit(1);
    for (;;) pause();
  }
  char c;
  if (plain != 2 || holder != 3 || read(sync[0], &c, 1) != 1) return 14;
  setenv("FAKE_NVML_PROCS", "2:1048576,3:2097152", 1);
  setenv("FAKE_NVML_MINOR", "7", 1);
  gg_process_t rows[8];
  size_t n = 0;
  if (gg_process_list(0, rows, 8, &n) != 0) return 15;
  const gg_process_t *p2 = row_of(rows, n, 2), *p3 = row_of(rows, n, 3);
  if (!p2 || !p3) return 16;
  if (p2->used_bytes != 1048576 || p3->used_bytes != 2097152) return 17;
  if (p2->state != '?' || p2->command[0] || p2->start_time) return 1;
  if (p3->state == '?' || !strstr(p3->command, "test_query_pidns")) return 2;
  return 0; /* pid 1 of the namespace: its exit ends the others */
}

static void test_driver_pids_in_a_pid_namespace(void **state) {
  (void)state;
  if (geteuid() != 0) skip();
  char dir[] = "/tmp/gg_qpidns_XXXXXX";
  assert_non_null(mkdtemp(dir));
  setenv("GPUGUARD_REGISTRY_DIR", dir, 1);
  setenv("GPUGUARD_NVML_LIBRARY", GG_FAKE_NVML, 1);
  unsetenv("GPUGUARD_TEST_PIDNS");
  pid_t kid = fork();
  if (kid == 0) {
    if (unshare(CLONE_NEWPID | CLONE_NEWNS) != 0)
      _exit(77); /* refused here (a locked-down runner) */
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) _exit(20);
    pid_t init = fork();
    if (init == 0) _exit(inside());
    int st = 0;
    if (waitpid(init, &st, 0) != init || !WIFEXITED(st)) _exit(21);
    _exit(WEXITSTATUS(st));
  }
  int st = 0;
  assert_int_equal(waitpid(kid, &st, 0), kid);
  rmdir(dir);
  assert_true(WIFEXITED(st));
  if (WEXITSTATUS(st) == 77) skip();
  assert_int_equal(WEXITSTATUS(st), 0); /* 1: another process shown under the driver's pid */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_driver_pids_in_a_pid_namespace),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
