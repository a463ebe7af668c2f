/* sigchld_thief.c — preloaded into `gpuguard run` by cli_run.sh: starts, before main(), a thread
 * with every signal unblocked that sleeps forever, as the CUDA driver's own threads are when the
 * runner reads the device figures. A SIGCHLD that arrives while the runner's main thread has it
 * blocked is delivered to this thread and dropped (its action is the default, ignore): the runner
 * must still notice CMD's end. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

static void *thief(void *arg) {
  (void)arg;
  sigset_t none;
  sigemptyset(&none);
  pthread_sigmask(SIG_SETMASK, &none, NULL);
  for (;;) pause();
  return NULL;
}

__attribute__((constructor)) static void start_thief(void) {
  pthread_t t;
  if (pthread_create(&t, NULL, thief, NULL) == 0) pthread_detach(t);
}
