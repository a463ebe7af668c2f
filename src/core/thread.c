/* thread.c — how the library starts its own threads (the guard thread and watchdog, the spawn
 * thread, the CUDA backend's context-sync thread): with every signal blocked, so handlers run on
 * the program's threads; and a signal's default action put back (the fatal and child paths). */
#include <signal.h>
#include <string.h>

#include "core/thread_internal.h"

int gg__thread_start(pthread_t *t, void *(*fn)(void *), void *arg, bool detached) {
  sigset_t all;
  sigset_t prev;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &prev);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  if (detached) {
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  }
  pthread_t own;
  int e = pthread_create(t ? t : &own, &attr, fn, arg);
  pthread_attr_destroy(&attr);
  pthread_sigmask(SIG_SETMASK, &prev, NULL);
  return e;
}

int gg__sig_set_default(int sig) {
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  return sigaction(sig, &dfl, NULL);
}
