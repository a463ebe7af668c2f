/* workers.c — starts workers the way a trainer does (fork and exec, and fork without exec), then waits
 * to be killed: after `kill -9`, none of them is left. Prints one line with its own pid and the workers'.
 * Try: ./workers & sleep 1; kill -9 %1; ps -o pid,ppid,stat,cmd -p "<the pids it printed>" */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "gpuguard/gpuguard.h"

static int check(int rc, const char *what) {
  if (rc < 0) fprintf(stderr, "workers: %s: %s\n", what, gg_last_error());
  return rc < 0;
}

int main(int argc, char **argv) {
  if (argc > 1) { /* no options: --help says so, anything else is refused */
    int help = strcmp(argv[1], "--help") == 0;
    fprintf(help ? stdout : stderr, "%susage: workers   (no arguments; kill -9 it and its workers are gone too)\n",
            help ? "" : "workers: unknown argument\n");
    return help ? 0 : 2;
  }
  /* Visible to `gpuguard ps` and to the registry: this process leads a session, workers join it. */
  if (check(gg_registry_register(NULL), "registry")) return 1;

  /* Fork and exec, as a launcher or DataLoader with the spawn start method does. The death signal is
   * armed by the library's spawn thread, so it holds whichever thread of ours asked. */
  const char *sleeper[] = {"sleep", "600", NULL};
  pid_t exec_workers[2];
  for (int i = 0; i < 2; i++)
    if (check(gg_proc_spawn(NULL, sleeper, NULL, &exec_workers[i]), "spawn")) return 1;

  /* Fork without exec, as multiprocessing's fork start method does: the child arms itself, and drops
   * inherited GPU descriptors since it will not use CUDA (the parent's memory is freed when it dies). */
  fflush(stdout);
  pid_t forked = fork();
  if (forked == 0) {
    gg_proc_arm_child();
    gg_proc_close_device_fds();
    for (;;) pause();
  }
  if (forked < 0 || check(gg_proc_adopt(NULL, forked), "adopt")) return 1;

  printf("trainer %d workers %d %d %d\n", (int)getpid(), (int)exec_workers[0], (int)exec_workers[1],
         (int)forked);
  fflush(stdout);
  for (;;) pause(); /* killed from outside; a normal end would call gg_proc_teardown(NULL, grace) */
}
