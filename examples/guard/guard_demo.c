/* guard_demo.c — a guard that owns the device context and a cleanup of its own; shows what happens when
 * the program returns, is interrupted (Ctrl-C, kill), crashes, or has a cleanup that hangs.
 *
 *   guard_demo            returns normally: the cleanup runs once, at exit
 *   guard_demo --wait     waits: press Ctrl-C (or `kill -TERM <pid>`); the cleanup runs on the guard
 *                         thread, then the process ends as SIGINT would have ended it (status 130 in a shell)
 *   guard_demo --crash    writes through a NULL pointer: a one-line report on stderr, crash hooks only
 *                         (no cleanups: they are not async-signal-safe), then the usual SIGSEGV death
 *   guard_demo --hang     Ctrl-C with a cleanup that never returns: the guard ends the process after 2 s
 *
 * GPUGUARD_BACKEND=host runs it without a GPU; GPUGUARD_LEAK_REPORT=stderr asks for the leak report. */
#define _POSIX_C_SOURCE 200809L /* sigaction */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpuguard/gpuguard.h"

typedef struct demo_state {
  FILE *log;
  int steps;
} demo_state_t;

/* What a real program would release here: cuBLAS handles, NCCL communicators, streams, files. */
static void close_log(void *user) {
  demo_state_t *s = user;
  fprintf(s->log, "cleanup: closing the log after %d steps (pid %ld)\n", s->steps, (long)getpid());
  fflush(s->log);
}

static void hang(void *user) {
  (void)user;
  fprintf(stdout, "cleanup: stuck (like a driver call that never returns)...\n");
  fflush(stdout);
  for (;;) pause();
}

static const char usage[] =
    "usage: guard_demo [--wait | --crash | --hang | --help]\n"
    "  (none)    returns normally: the cleanup runs once, at exit\n"
    "  --wait    waits for Ctrl-C or SIGTERM: the cleanup runs, then the process ends as the signal would\n"
    "  --crash   writes through a NULL pointer: a one-line report, crash hooks only, then SIGSEGV\n"
    "  --hang    Ctrl-C with a cleanup that never returns: the guard ends the process after 2 s\n";

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "";
  if (strcmp(mode, "--help") == 0 || strcmp(mode, "-h") == 0) {
    fputs(usage, stdout);
    return 0;
  }
  if (argc > 2 || (*mode && strcmp(mode, "--wait") != 0 && strcmp(mode, "--crash") != 0 &&
                    strcmp(mode, "--hang") != 0)) {
    fprintf(stderr, "guard_demo: unknown argument '%s'\n%s", argc > 2 ? argv[2] : mode, usage);
    return 2;
  }
  gg_guard_options_t opts;
  gg_guard_options_init(&opts);
  opts.name = "demo";
  if (strcmp(mode, "--hang") == 0) opts.teardown_timeout_ms = 2000;
  gg_guard_t *guard = NULL;
  int rc = gg_guard_create(&guard, &opts);
  if (rc != 0) {
    fprintf(stderr, "guard_demo: %s: %s\n", gg_err_name(rc), gg_last_error());
    return 1;
  }
  static demo_state_t state;
  state.log = stdout;
  gg_guard_on_teardown(guard, close_log, &state, "close log");
  if (strcmp(mode, "--hang") == 0) gg_guard_on_teardown(guard, hang, NULL, "hang");

  printf("guard_demo: pid %ld, guard installed (%s backend)\n", (long)getpid(),
         getenv("GPUGUARD_BACKEND") ? getenv("GPUGUARD_BACKEND") : "auto");
  if (strcmp(mode, "--crash") == 0) {
    printf("guard_demo: writing through a NULL pointer\n");
    fflush(stdout);
    volatile int *p = NULL;
    *p = 1;
  }
  if (strcmp(mode, "--wait") == 0 || strcmp(mode, "--hang") == 0) {
    struct sigaction cur;
    sigaction(SIGINT, NULL, &cur);
    if (!(cur.sa_flags & SA_SIGINFO) && cur.sa_handler == SIG_IGN)
      printf(
          "guard_demo: SIGINT is ignored here (a background job): the guard leaves it so; use kill -TERM\n");
    printf("guard_demo: press Ctrl-C, or run: kill -TERM %ld\n", (long)getpid());
    fflush(stdout);
    for (;;) {
      state.steps++;
      sleep(1);
    }
  }
  printf("guard_demo: returning from main; the guard runs its teardown at exit\n");
  return 0; /* or gg_guard_destroy(guard) to run it now */
}
