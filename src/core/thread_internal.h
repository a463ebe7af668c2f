/* thread_internal.h — thread.c's calls: starting the library's own threads with every signal
 * blocked, and putting a signal back to its default action. */
#ifndef GG_THREAD_INTERNAL_H
#define GG_THREAD_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>

/* Starts fn(arg) on a new thread that blocks every signal (the mask is inherited: the program's
 * signals go to the program's threads, never to one of the library's), detached or joinable. *t
 * gets the thread (may be NULL when detached). The calling thread's mask is as it was afterwards.
 * Returns 0 or pthread_create()'s error number. */
int gg__thread_start(pthread_t *t, void *(*fn)(void *), void *arg, bool detached);

/* sigaction(sig, SIG_DFL) with an empty mask: 0, or -1 with errno. Async-signal-safe. */
int gg__sig_set_default(int sig);

#endif
