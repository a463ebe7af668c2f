/* proc_child.c — a helper program for the process tests: a chain of gpuguard-spawned descendants,
 * and a teardown that prints its receipt as JSON. Usage:
 *   proc_child chain N FILE   append our pid to FILE, spawn `proc_child chain N-1 FILE` (N > 0),
 * wait
 *   proc_child wait ARGS...   wait for a signal
 *   proc_child receipt        spawn three children (one ignores SIGTERM), tear down, print the
 * receipt */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpuguard/gpuguard.h"

static int chain(int n, const char *file, const char *self) {
  int fd = open(file, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return 1;
  char line[32];
  int len = snprintf(line, sizeof line, "%d\n", (int)getpid());
  if (write(fd, line, (size_t)len) != len) return 1;
  close(fd);
  if (n > 0) {
    char next[16];
    snprintf(next, sizeof next, "%d", n - 1);
    const char *argv[] = {self, "chain", next, file, NULL};
    if (gg_proc_spawn(NULL, argv, NULL, NULL) != 0) {
      fprintf(stderr, "proc_child: %s\n", gg_last_error());
      return 1;
    }
  }
  for (;;) pause();
}

static int receipt(const char *self) {
  int p[2];
  if (pipe(p) != 0) return 1;
  gg_spawn_options_t o;
  gg_spawn_options_init(&o);
  o.stdout_fd = p[1];
  const char *stubborn[] = {"/bin/sh", "-c", "trap '' TERM; echo ready; exec sleep 30", NULL};
  const char *plain[] = {"sleep", "30", NULL};
  const char *quoted[] = {self, "wait", "a\"b\\c\n", NULL}; /* a command line JSON must escape */
  if (gg_proc_spawn(NULL, stubborn, &o, NULL) || gg_proc_spawn(NULL, plain, NULL, NULL) ||
      gg_proc_spawn(NULL, quoted, NULL, NULL))
    return fprintf(stderr, "proc_child: %s\n", gg_last_error()), 1;
  close(p[1]);
  char buf[64];
  size_t got = 0;
  while (got < 6) { /* "ready\n": the trap is in place */
    ssize_t r = read(p[0], buf, sizeof buf);
    if (r <= 0) break;
    got += (size_t)r;
  }
  gg_proc_receipt_t *r = NULL;
  int rc = gg_proc_teardown_ex(NULL, 200, &r);
  if (rc != 0 || !r) return fprintf(stderr, "proc_child: %s\n", gg_last_error()), 1;
  gg_proc_receipt_write(r, stdout);
  gg_proc_receipt_free(r);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "chain") == 0) return chain(atoi(argv[2]), argv[3], argv[0]);
  if (argc == 2 && strcmp(argv[1], "receipt") == 0) return receipt(argv[0]);
  if (argc >= 2 && strcmp(argv[1], "wait") == 0)
    for (;;) pause();
  fprintf(stderr, "usage: proc_child chain N FILE | proc_child receipt\n");
  return 2;
}
