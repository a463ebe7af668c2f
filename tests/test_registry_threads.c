/* test_registry_threads.c — registering and spawning while other threads read the environment
 * (setenv(GPUGUARD_SESSION) once raced with getenv on other threads). The session reaches each
 * spawned child through the environment array built for it; the process environment is never
 * written. Labelled `threads`: also run under ThreadSanitizer. */
#include <pthread.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gg_test.h"

extern char **environ;

static char dir[64];
static atomic_bool stop;
static atomic_ulong reads;

static void *reader(void *arg) {
  (void)arg;
  while (!atomic_load(&stop)) {
    const char *a = getenv("GPUGUARD_SESSION"), *b = getenv("PATH");
    if (a && b) atomic_fetch_add(&reads, 1); /* keeps the reads from being optimised away */
    atomic_fetch_add(&reads, 1);
  }
  return NULL;
}

/* Runs `sh -c 'echo $GPUGUARD_SESSION'` through gg_proc_spawn and returns the line it printed. */
static void child_session(char *line, size_t cap) {
  int p[2];
  assert_int_equal(pipe(p), 0);
  gg_spawn_options_t o;
  gg_spawn_options_init(&o);
  o.stdout_fd = p[1];
  const char *argv[] = {"/bin/sh", "-c", "echo \"s=$GPUGUARD_SESSION\"", NULL};
  pid_t pid = -1;
  gg_assert_ok(gg_proc_spawn(NULL, argv, &o, &pid));
  close(p[1]);
  size_t at = 0;
  char c;
  while (at + 1 < cap && read(p[0], &c, 1) == 1 && c != '\n') line[at++] = c;
  line[at] = '\0';
  close(p[0]);
  gg_assert_ok(gg_proc_teardown(NULL, 2000));
}

static void test_register_and_spawn_beside_getenv(void **state) {
  (void)state;
  strcpy(dir, "/tmp/gg_regthr_XXXXXX");
  assert_non_null(mkdtemp(dir));
  setenv("GPUGUARD_REGISTRY_DIR", dir, 1); /* before the threads start */
  unsetenv("GPUGUARD_SESSION");
  char **env_before = environ;
  pthread_t t[3];
  for (int i = 0; i < 3; i++) assert_int_equal(pthread_create(&t[i], NULL, reader, NULL), 0);

  gg_assert_ok(gg_registry_register("0"));
  char session[40], line[128], want[64];
  gg_assert_ok(gg_registry_session(session, sizeof session));
  assert_int_equal(strlen(session), 32);
  snprintf(want, sizeof want, "s=%s", session);
  for (int i = 0; i < 20; i++) {
    child_session(line, sizeof line);
    assert_string_equal(line, want); /* the child has the session... */
  }
  atomic_store(&stop, true);
  for (int i = 0; i < 3; i++) pthread_join(t[i], NULL);
  /* ...and this process's environment was never written (setenv would have added the variable). */
  assert_null(getenv("GPUGUARD_SESSION"));
  assert_ptr_equal(environ, env_before);
  assert_true(atomic_load(&reads) > 0);

  /* A forked worker finds the session in memory, not in the environment. */
  pid_t kid = fork();
  if (kid == 0) {
    char s[40];
    _exit(gg_registry_register(NULL) == 0 && gg_registry_session(s, sizeof s) == 0 &&
                  strcmp(s, session) == 0
              ? 0
              : 1);
  }
  int st = 0;
  assert_int_equal(waitpid(kid, &st, 0), kid);
  assert_int_equal(WEXITSTATUS(st), 0);
  gg_registry_unregister();
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

/* An inherited GPUGUARD_SESSION this process did not join (its leader is dead) is replaced by ours
 * in the child's environment: the child must not look like the dead session's worker. */
static void test_dead_inherited_session_is_replaced_for_children(void **state) {
  (void)state;
  strcpy(dir, "/tmp/gg_regthr_XXXXXX");
  assert_non_null(mkdtemp(dir));
  setenv("GPUGUARD_REGISTRY_DIR", dir, 1);
  char session[40], line[128], want[64];
  gg_assert_ok(
      gg_registry_session(session, sizeof session)); /* the first test's, in this process */
  assert_int_equal(strlen(session), 32);
  setenv("GPUGUARD_SESSION", "deadbeef", 1);
  child_session(line, sizeof line);
  snprintf(want, sizeof want, "s=%s", session);
  assert_string_equal(line, want);
  unsetenv("GPUGUARD_SESSION");
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_register_and_spawn_beside_getenv),
      cmocka_unit_test(test_dead_inherited_session_is_replaced_for_children),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
