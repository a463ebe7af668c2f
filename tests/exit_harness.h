/* exit_harness.h — runs exit_child (or another helper) as a child process and judges it from
 * outside: readiness through a pipe, signals, the exit status, the time it took, and the lines its
 * cleanups wrote. Every wait polls against a deadline; nothing sleeps for a fixed time. */
#ifndef GG_EXIT_HARNESS_H
#define GG_EXIT_HARNESS_H

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define GG_H_DEADLINE_MS 30000 /* generous: a loaded 2-core CI machine, sanitizers */

extern char **environ;

typedef struct gg_child {
  pid_t pid;
  int ready_fd;
  char dir[64];
  char counter[128], err[128];
  double t_signal; /* monotonic ms when the last signal was sent (or the child became ready) */
  int status;
  bool exited;
} gg_child_t;

static double gg_h_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void gg_h_sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Starts `prog mode` with extra "NAME=value" environment entries (NULL-terminated list, may be
 * NULL). guarded=false sets GG_CHILD_NO_GUARD=1. The child's stderr goes to c->err. */
static void gg_child_start(gg_child_t *c, const char *prog, const char *mode, bool guarded,
                           const char *const *env) {
  memset(c, 0, sizeof *c);
  snprintf(c->dir, sizeof c->dir, "/tmp/gg_exit_XXXXXX");
  if (!mkdtemp(c->dir)) {
    perror("mkdtemp");
    abort();
  }
  snprintf(c->counter, sizeof c->counter, "%s/counter", c->dir);
  snprintf(c->err, sizeof c->err, "%s/stderr", c->dir);
  int p[2];
  if (pipe(p) != 0) abort();
  fflush(NULL);
  c->pid = fork();
  if (c->pid == 0) {
    close(p[0]);
    struct rlimit no_core = {0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    int fd = open(c->err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) dup2(fd, 2), close(fd);
    char ready[32];
    snprintf(ready, sizeof ready, "%d", p[1]);
    setenv("GG_CHILD_READY_FD", ready, 1);
    setenv("GG_CHILD_COUNTER", c->counter, 1);
    if (!guarded) setenv("GG_CHILD_NO_GUARD", "1", 1);
    if (!getenv("GPUGUARD_BACKEND")) setenv("GPUGUARD_BACKEND", "host", 1);
    /* ASan would take the fatal signals itself: leave them to the program, as without a sanitizer.
     * */
    setenv("ASAN_OPTIONS",
           "handle_segv=0:handle_abort=0:handle_sigbus=0:handle_sigfpe=0:handle_sigill=0:detect_"
           "leaks=0",
           1);
    setenv("TSAN_OPTIONS",
           "handle_segv=0:handle_abort=0:handle_sigbus=0:handle_sigfpe=0:handle_sigill=0", 1);
    for (size_t i = 0; env && env[i]; i++) putenv((char *)env[i]);
    execl(prog, prog, mode, (char *)NULL);
    _exit(127);
  }
  close(p[1]);
  c->ready_fd = p[0];
}

/* Waits until the child says it is ready (or dies first: false). */
static bool gg_child_ready(gg_child_t *c) {
  struct pollfd pfd = {c->ready_fd, POLLIN, 0};
  int r;
  do r = poll(&pfd, 1, GG_H_DEADLINE_MS);
  while (r < 0 && errno == EINTR);
  char b = 0;
  bool ok = r == 1 && read(c->ready_fd, &b, 1) == 1 && b == 'R';
  close(c->ready_fd);
  c->t_signal = gg_h_now_ms();
  return ok;
}

static void gg_child_kill(gg_child_t *c, int sig) {
  c->t_signal = gg_h_now_ms();
  kill(c->pid, sig);
}

/* Waits for the child to end; false (and the child killed) past the deadline. */
static bool gg_child_wait(gg_child_t *c, int deadline_ms) {
  double end = gg_h_now_ms() + deadline_ms;
  for (;;) {
    pid_t r = waitpid(c->pid, &c->status, WNOHANG);
    if (r == c->pid) return (c->exited = true);
    if (gg_h_now_ms() > end) {
      kill(c->pid, SIGKILL);
      waitpid(c->pid, &c->status, 0);
      return false;
    }
    gg_h_sleep_ms(2);
  }
}

static double gg_child_elapsed_ms(const gg_child_t *c) { return gg_h_now_ms() - c->t_signal; }

/* The whole of a file, NUL-terminated, in a static buffer ("" if missing). */
static const char *gg_h_slurp(const char *path, char *buf, size_t cap) {
  buf[0] = '\0';
  FILE *f = fopen(path, "r");
  if (!f) return buf;
  size_t n = fread(buf, 1, cap - 1, f);
  buf[n] = '\0';
  fclose(f);
  return buf;
}

/* How many lines of the counter file equal `line`. */
static int gg_child_count(const gg_child_t *c, const char *line) {
  char buf[16384];
  gg_h_slurp(c->counter, buf, sizeof buf);
  int n = 0;
  size_t len = strlen(line);
  for (char *p = buf; *p;) {
    char *nl = strchr(p, '\n');
    size_t l = nl ? (size_t)(nl - p) : strlen(p);
    if (l == len && strncmp(p, line, len) == 0) n++;
    if (!nl) break;
    p = nl + 1;
  }
  return n;
}

/* Waits until the counter file holds `line` (a cleanup has reached a point). */
static bool gg_child_wait_line(const gg_child_t *c, const char *line) {
  double end = gg_h_now_ms() + GG_H_DEADLINE_MS;
  while (gg_h_now_ms() < end) {
    if (gg_child_count(c, line) > 0) return true;
    gg_h_sleep_ms(2);
  }
  return false;
}

/* Position of `line`'s first occurrence in the counter file (for order checks), -1 if absent. */
static long gg_child_pos(const gg_child_t *c, const char *line) {
  char buf[16384];
  gg_h_slurp(c->counter, buf, sizeof buf);
  const char *p = strstr(buf, line);
  return p ? (long)(p - buf) : -1;
}

static const char *gg_child_stderr(const gg_child_t *c) {
  static char buf[16384];
  return gg_h_slurp(c->err, buf, sizeof buf);
}

/* "exit 3", "signal SIGTERM": a status in words for messages. */
static const char *gg_h_status(int st) {
  static char buf[64];
  if (WIFEXITED(st))
    snprintf(buf, sizeof buf, "exit %d", WEXITSTATUS(st));
  else if (WIFSIGNALED(st))
    snprintf(buf, sizeof buf, "signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
  else
    snprintf(buf, sizeof buf, "status 0x%x", st);
  return buf;
}

static void gg_child_cleanup(gg_child_t *c) {
  char path[160];
  snprintf(path, sizeof path, "%s/report", c->dir);
  unlink(path);
  unlink(c->counter);
  unlink(c->err);
  rmdir(c->dir);
}

#endif
