/* test_gpu_proc.c — on a real GPU: a parent whose four spawned children each hold 2 GiB is
 * SIGKILLed: how long until no child is in NVML's process list, and until the driver's free memory
 * is back. Then a parent holding 2 GiB with a forked child that does not use CUDA and lives on:
 * with its inherited /dev/nvidia* descriptors kept, and closed. This process never creates a CUDA
 * context (it reads the device through NVML), so its own memory does not blur the figures. Skips
 * without a CUDA device. */
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gg_test.h"

#define HOLDER GG_TEST_BINARY_DIR "/gpu_hold"
#define MiB    ((size_t)1 << 20)

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static size_t free_mib(void) {
  gg_device_info_t d;
  gg_assert_ok(gg_device_info(0, &d));
  return d.free_bytes / MiB;
}

static bool listed(pid_t pid) {
  gg_process_t rows[128];
  size_t n = 0;
  gg_assert_ok(gg_process_list(0, rows, 128, &n));
  for (size_t i = 0; i < n && i < 128; i++)
    if (rows[i].pid == pid && rows[i].used_bytes > 0) return true;
  return false;
}

/* Starts HOLDER with args; returns its pid and the line it printed once ready. */
static pid_t start(char *const args[], char *line, size_t cap) {
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  pid_t p = fork();
  if (p == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    execv(HOLDER, args);
    _exit(127);
  }
  close(fds[1]);
  FILE *f = fdopen(fds[0], "r");
  assert_non_null(fgets(line, (int)cap, f));
  fclose(f);
  assert_true(strncmp(line, "ready", 5) == 0);
  return p;
}

static void test_sigkilled_parent_four_children(void **state) {
  (void)state;
  size_t base = free_mib();
  char line[256];
  char *args[] = {HOLDER, "spawn4", "2048",
                  NULL}; /* argv[0] is what the children are spawned from */
  pid_t parent = start(args, line, sizeof line);
  int kids[4];
  assert_int_equal(sscanf(line, "ready %d %d %d %d", &kids[0], &kids[1], &kids[2], &kids[3]), 4);
  size_t held = free_mib();
  for (int i = 0; i < 4; i++) assert_true(listed(kids[i]));
  double t0 = now_ms();
  kill(parent, SIGKILL);
  waitpid(parent, NULL, 0);
  double t_list = -1, t_free = -1;
  while (now_ms() - t0 < 10000 && (t_list < 0 || t_free < 0)) {
    bool any = false;
    for (int i = 0; i < 4 && !any; i++) any = listed(kids[i]);
    if (!any && t_list < 0) t_list = now_ms() - t0;
    if (free_mib() + 64 >= base && t_free < 0) t_free = now_ms() - t0;
    if (t_list < 0 || t_free < 0) usleep(2000);
  }
  printf("4 children x 2 GiB: free %zu MiB before, %zu MiB holding (-%zu); parent SIGKILLed: no "
         "child in "
         "NVML's list after %.0f ms, driver's free memory back after %.0f ms (%zu MiB)\n",
         base, held, base - held, t_list, t_free, free_mib());
  assert_true(base - held >= 4 * 2048);
  assert_true(t_list >= 0 && t_list < 3000);
  assert_true(t_free >= 0 && t_free < 5000);
}

static void forked_child_case(const char *mode) {
  size_t base = free_mib();
  char line[256];
  char *args[] = {HOLDER, "fork", "2048", (char *)mode, NULL};
  pid_t parent = start(args, line, sizeof line);
  int child = 0;
  assert_int_equal(sscanf(line, "ready %d", &child), 1);
  size_t held = free_mib();
  double t0 = now_ms();
  kill(parent, SIGKILL);
  waitpid(parent, NULL, 0);
  double t_free = -1;
  while (now_ms() - t0 < 3000 && t_free < 0) {
    if (free_mib() + 64 >= base)
      t_free = now_ms() - t0;
    else
      usleep(5000);
  }
  size_t after = free_mib();
  printf("parent with 2 GiB and a forked non-CUDA child that %s its /dev/nvidia* descriptors: free "
         "%zu MiB "
         "before, %zu holding, parent SIGKILLed: %s (%zu MiB free 3 s later, child alive: %s)\n",
         mode, base, held, t_free >= 0 ? "memory back" : "memory NOT back", after,
         kill(child, 0) == 0 ? "yes" : "no");
  if (t_free >= 0) printf("  back after %.0f ms\n", t_free);
  assert_int_equal(kill(child, 0), 0); /* the child really lived on through the measurement */
  if (!strcmp(mode, "close")) assert_true(t_free >= 0);
  kill(child, SIGKILL);
  double t1 = now_ms();
  while (now_ms() - t1 < 5000 && free_mib() + 64 < base) usleep(5000);
  printf("  after the child is killed too: %zu MiB free\n", free_mib());
  assert_true(free_mib() + 64 >= base);
}

static void test_forked_child_keeps_descriptors(void **state) {
  (void)state;
  forked_child_case("keep");
}

static void test_forked_child_closes_descriptors(void **state) {
  (void)state;
  forked_child_case("close");
}

int main(void) {
  gg_test_require_cuda();
  setenv("GPUGUARD_BACKEND", "cuda", 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sigkilled_parent_four_children),
      cmocka_unit_test(test_forked_child_keeps_descriptors),
      cmocka_unit_test(test_forked_child_closes_descriptors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
