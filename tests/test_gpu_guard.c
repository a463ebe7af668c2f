/* test_gpu_guard.c — guards on a real CUDA device: the key exit paths of the harness on the cuda
 * backend, and the device's free memory (cuMemGetInfo, seen from this parent process) before,
 * during and after a child's guarded teardown, with and without the context reset. Skips without a
 * CUDA device. */
#include "backend/backend.h"
#include "exit_harness.h"
#include "gg_test.h"
#include "core/internal.h"

#define CHILD GG_TEST_BINARY_DIR "/exit_child"
#define MiB   ((size_t)1 << 20)

static int outcome(int st) {
  return WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? -WTERMSIG(st) : 1000;
}

static int setup(void **state) {
  (void)state;
  setenv("GPUGUARD_BACKEND", "cuda", 1);
  return 0;
}

/* One path with a guard on the cuda backend: status as wanted, cleanups B then A once (or crash
 * hook). */
static void cuda_path(const char *mode, int sig, int want, bool fatal) {
  gg_child_t c;
  const char *env[] = {"GG_CHILD_TIMEOUT_MS=5000", NULL};
  gg_child_start(&c, CHILD, mode, true, env);
  assert_true(gg_child_ready(&c));
  if (sig) gg_child_kill(&c, sig);
  assert_true(gg_child_wait(&c, GG_H_DEADLINE_MS));
  printf("  cuda %-7s %-8s -> %s after %.1f ms\n", mode, sig ? strsignal(sig) : "",
         gg_h_status(c.status), gg_child_elapsed_ms(&c));
  if (outcome(c.status) != want)
    fail_msg("%s: %s; stderr:\n%s", mode, gg_h_status(c.status), gg_child_stderr(&c));
  if (fatal) {
    assert_int_equal(gg_child_count(&c, "cleanup A"), 0);
    assert_non_null(strstr(gg_child_stderr(&c), "gpuguard: fatal signal"));
  } else {
    assert_int_equal(gg_child_count(&c, "cleanup A"), 1);
    assert_int_equal(gg_child_count(&c, "cleanup B"), 1);
    assert_true(gg_child_pos(&c, "cleanup B") < gg_child_pos(&c, "cleanup A"));
  }
  gg_child_cleanup(&c);
}

static void test_cuda_exit_paths(void **state) {
  (void)state;
  cuda_path("return", 0, 0, false);
  cuda_path("exit3", 0, 3, false);
  cuda_path("wait", SIGTERM, -SIGTERM, false);
  cuda_path("wait", SIGINT, -SIGINT, false);
  cuda_path("segv", 0, -SIGSEGV, true);
  cuda_path("abort", 0, -SIGABRT, true);
  cuda_path("thread-arena", SIGTERM, -SIGTERM, false); /* threads inside cuda arena calls */
  cuda_path("arena-leak", 0, 0, false);
  cuda_path("children", SIGTERM, -SIGTERM, false);
}

static void test_cuda_hanging_cleanup(void **state) {
  (void)state;
  gg_child_t c;
  const char *env[] = {"GG_CHILD_TIMEOUT_MS=1000", NULL};
  gg_child_start(&c, CHILD, "hang", true, env);
  assert_true(gg_child_ready(&c));
  gg_child_kill(&c, SIGTERM);
  assert_true(gg_child_wait(&c, GG_H_DEADLINE_MS));
  double ms = gg_child_elapsed_ms(&c);
  printf("  cuda hanging cleanup, limit 1000 ms: ended after %.1f ms with %s\n", ms,
         gg_h_status(c.status));
  assert_int_equal(outcome(c.status), -SIGTERM);
  assert_true(ms >= 995 && ms < 1000 + 3000);
  gg_child_cleanup(&c);
}

static size_t free_now(gg__dev_t *d) {
  size_t f = 0, t = 0;
  gg_assert_ok(d->ops->mem_info(d, &f, &t));
  return f;
}

/* Waits (bounded) until the device's free memory is back near `target`: the driver frees a dead
 * process's memory asynchronously (about 100 ms on an H200). */
static size_t free_after_exit(gg__dev_t *d, size_t target) {
  double end = gg_h_now_ms() + 10000;
  size_t f = free_now(d);
  while (f + 64 * MiB < target && gg_h_now_ms() < end) {
    gg_h_sleep_ms(20);
    f = free_now(d);
  }
  return f;
}

/* A child maps 1 GiB in a context it retains twice (the second retain stands in for the CUDA
 * runtime or PyTorch), then tears its guard down and lives on; this parent measures. */
/* What a teardown gives back: everything, nothing (a retain survives), or the context's own memory
 * only — measured on the H200 (driver 580): cuDevicePrimaryCtxReset, or releasing the last retain,
 * frees the context (~523 MiB) and cuMemAlloc'd memory, but not physical memory made by
 * cuMemCreate: VMM handles outlive the context until cuMemRelease or process exit. Arenas therefore
 * unmap and release their chunks themselves at teardown. */
typedef enum { BACK_ALL, BACK_NONE, BACK_CONTEXT_ONLY } back_t;

static void memory_case(gg__dev_t *d, const char *label, const char *const *env, back_t expect) {
  size_t f0 = free_now(d);
  gg_child_t c;
  gg_child_start(&c, CHILD, "gpu-hold", true, env);
  assert_true(gg_child_ready(&c));
  size_t f1 = free_now(d);
  gg_child_kill(&c, SIGUSR1);
  assert_true(gg_child_wait_line(&c, "gpu torn down"));
  size_t f2 = free_now(d);
  gg_child_kill(&c, SIGKILL);
  assert_true(gg_child_wait(&c, GG_H_DEADLINE_MS));
  size_t f3 = free_after_exit(d, f0);
  printf("  %-44s free MiB: before %zu, holding %zu (-%zu), after teardown %zu (+%zu), after exit "
         "%zu\n",
         label, f0 / MiB, f1 / MiB, (f0 - f1) / MiB, f2 / MiB, (f2 > f1 ? f2 - f1 : 0) / MiB,
         f3 / MiB);
  assert_true(f0 - f1 >= 1024 * MiB); /* the child really held its 1 GiB (plus its context) */
  if (expect == BACK_ALL)
    assert_true(f2 >= f1 + 1024 * MiB - 64 * MiB);
  else if (expect == BACK_NONE)
    assert_true(f2 < f1 + 256 * MiB); /* still held by the surviving retain */
  else
    assert_true(f2 > f1 + 256 * MiB && f2 < f1 + 1024 * MiB - 64 * MiB);
  assert_true(f3 + 64 * MiB >= f0); /* and the driver has it all back once the process is gone */
  gg_child_cleanup(&c);
}

static void test_cuda_memory_with_and_without_reset(void **state) {
  (void)state;
  gg__dev_t *d = NULL;
  gg_assert_ok(gg__dev_open("cuda", 0, &d));
  const char *freed[] = {"GG_CHILD_EXTRA_RETAIN=1", NULL};
  memory_case(d, "cleanup unmaps, no reset, runtime retain:", freed, BACK_ALL);
  const char *leak[] = {"GG_CHILD_EXTRA_RETAIN=1", "GG_CHILD_GPU_LEAK=1", NULL};
  memory_case(d, "leaked, no reset, runtime retain:", leak, BACK_NONE);
  const char *reset[] = {"GG_CHILD_EXTRA_RETAIN=1", "GG_CHILD_GPU_LEAK=1", "GG_CHILD_RESET=1",
                         NULL};
  memory_case(d, "leaked (VMM), context reset, runtime retain:", reset, BACK_CONTEXT_ONLY);
  const char *reset_alloc[] = {"GG_CHILD_EXTRA_RETAIN=1", "GG_CHILD_GPU_LEAK=1", "GG_CHILD_RESET=1",
                               "GPUGUARD_CUDA_VMM=0", NULL};
  memory_case(d, "leaked (cuMemAlloc), context reset, retain:", reset_alloc, BACK_ALL);
  const char *alone[] = {"GG_CHILD_GPU_LEAK=1", NULL};
  memory_case(d, "leaked (VMM), no reset, last retain released:", alone, BACK_CONTEXT_ONLY);
  gg__dev_close(d);
}

/* In one process: an arena of the guard's device gives its memory back to the driver at the guard's
 * teardown, while the process lives on. */
static void test_cuda_arena_released_by_teardown(void **state) {
  (void)state;
  gg__dev_t *d = NULL;
  gg_assert_ok(gg__dev_open("cuda", 0, &d));
  size_t f0 = free_now(d);
  gg_guard_options_t go;
  gg_guard_options_init(&go);
  go.signals = 0, go.run_at_exit = false, go.leak_report = "stderr", go.name = "gpu-test";
  gg_guard_t *g = NULL;
  gg_assert_ok(gg_guard_create(&g, &go));
  gg_arena_t *a = NULL;
  gg_assert_ok(gg_arena_create(&a, NULL));
  void *p = NULL;
  gg_assert_ok(gg_alloc_ex(a, 2048 * MiB, 0, "big", &p));
  gg_assert_ok(gg_alloc_ex(a, 64 * MiB, 0, "small", &p));
  size_t f1 = free_now(d);
  gg_assert_ok(gg_guard_destroy(g));
  size_t f2 = free_now(d);
  printf("  arena under a guard: free MiB %zu before, %zu with 2112 MiB allocated, %zu after the "
         "teardown\n",
         f0 / MiB, f1 / MiB, f2 / MiB);
  assert_true(f0 - f1 >= 2112 * MiB);
  assert_true(f2 + 64 * MiB >= f0);
  gg_assert_fails(gg_alloc(a, 256, &p), GG_ESTATE, "torn down by its guard");
  gg_assert_ok(gg_arena_destroy(a));
  gg__dev_close(d);
}

int main(void) {
  gg_test_require_cuda();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_cuda_exit_paths, setup),
      cmocka_unit_test_setup(test_cuda_hanging_cleanup, setup),
      cmocka_unit_test_setup(test_cuda_memory_with_and_without_reset, setup),
      cmocka_unit_test_setup(test_cuda_arena_released_by_teardown, setup),
  };
  return cmocka_run_group_tests_name("gpu_guard", tests, NULL, NULL);
}
