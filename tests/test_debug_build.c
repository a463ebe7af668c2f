/* test_debug_build.c — the debug build stops at a broken invariant: at level 1 a mutation point's
 * assertion aborts on a free-list removal of a block that is not free; at level 2 (GPUGUARD_DEBUG=2
 * or ON) the whole-arena check after a public call also aborts on an arena whose counters lie. Each
 * case runs in a child, judged from outside (it must die by SIGABRT and say why on stderr). Other
 * builds skip, saying so. */
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gg_test.h"
#include "arena/arena_base_impl.h"
#include "core/internal.h"

#if GG_DEBUG >= 1
static int setup(void **state) {
  (void)state;
  gg_test_use_host("64M", NULL);
  unsetenv("GPUGUARD_DEBUG_CHECK_BELOW");
  return 0;
}

static gg_arena_t *mk(void) {
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.capacity = 16 << 20, o.name = "debug";
  gg_arena_t *a = NULL;
  if (gg_arena_create(&a, &o) != 0) {
    fprintf(stderr, "gg_arena_create: %s\n", gg_last_error());
    _exit(3);
  }
  return a;
}

/* Runs fn in a child whose stderr goes to a file; returns how it ended, and its stderr in err. */
static int run_child(void (*fn)(void), char *err, size_t cap) {
  char path[] = "/tmp/gg_debug_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  unlink(path);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    dup2(fd, 2);
    fn();
    _exit(0);
  }
  int st = 0;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  ssize_t n = pread(fd, err, cap - 1, 0);
  err[n > 0 ? n : 0] = '\0';
  close(fd);
  return st;
}

#if GG_DEBUG >= 2
static void lying_counter(void) {
  gg_arena_t *a = mk();
  void *p = NULL;
  if (gg_alloc(a, 4096, &p) != 0) _exit(4);
  a->freelist.bytes += GG__QUANTUM; /* free bytes no block holds */
  gg_arena_stats_t s;
  gg_arena_stats(a, &s); /* the check at its end must stop here */
}
#endif

static void remove_used_block(void) {
  gg_arena_t *a = mk();
  void *p = NULL;
  if (gg_alloc(a, 4096, &p) != 0) _exit(4);
  /* A block as the allocation hands it out: USED, on no free list. */
  gg__block_t b = {.addr = (uintptr_t)p, .size = 4096, .state = GG__BLOCK_USED};
  gg__freelist_remove(&a->freelist, &b);
}

static void healthy(void) {
  gg_arena_t *a = mk();
  void *p[64];
  for (int i = 0; i < 64; i++)
    if (gg_alloc(a, (size_t)(i + 1) * 1000, &p[i]) != 0) _exit(4);
  for (int i = 0; i < 64; i += 2) gg_free(a, p[i]);
  gg_scope_t sc;
  if (gg_scope_begin(a, &sc) != 0) _exit(6);
  for (int i = 0; i < 64; i++) gg_alloc(a, 512, &p[i]);
  if (gg_scope_end(&sc) != 0) _exit(8);
  if (gg_arena_trim(a, 0) != 0 || gg_arena_destroy(a) != 0) _exit(7);
}

#if GG_DEBUG >= 2
static void test_check_after_call_aborts(void **state) {
  (void)state;
  char err[4096];
  int st = run_child(lying_counter, err, sizeof err);
  if (!WIFSIGNALED(st)) fail_msg("child ended with status %#x: %s", st, err);
  assert_int_equal(WTERMSIG(st), SIGABRT);
  if (!strstr(err, "arena 'debug' is inconsistent after a call: free byte count mismatch"))
    fail_msg("stderr: %s", err);
}
#endif

static void test_mutation_point_aborts(void **state) {
  (void)state;
  char err[4096];
  int st = run_child(remove_used_block, err, sizeof err);
  if (!WIFSIGNALED(st)) fail_msg("child ended with status %#x: %s", st, err);
  assert_int_equal(WTERMSIG(st), SIGABRT);
  assert_non_null(strstr(err, "internal assertion failed: b->state == GG__BLOCK_FREE"));
  assert_non_null(strstr(err, "freelist.c"));
}

/* The checks cost time, never results: a mixed sequence of calls passes every one of them. */
static void test_healthy_arena_passes(void **state) {
  (void)state;
  char err[4096];
  int st = run_child(healthy, err, sizeof err);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) fail_msg("child ended with status %#x: %s", st, err);
  assert_string_equal(err, "");
}

#endif

int main(void) {
#if GG_DEBUG < 1
  printf("SKIP: built with GPUGUARD_DEBUG=0: the assertions this tests are compiled out\n");
  return GG_TEST_SKIP;
#else
  const struct CMUnitTest tests[] = {
#if GG_DEBUG >= 2
    cmocka_unit_test_setup(test_check_after_call_aborts, setup),
#endif
    cmocka_unit_test_setup(test_mutation_point_aborts, setup),
    cmocka_unit_test_setup(test_healthy_arena_passes, setup),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
#endif
}
