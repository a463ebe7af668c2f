/* reap.c — ending processes named by pid and start time (what `gpuguard reap` lists): each checked
 * and held by pidfd right before the first signal, so that a pid reused since it was listed is
 * never signalled; TERM, a grace period, KILL. Only what is named: no descendants, no groups. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/internal.h"
#include "gpuguard/proc.h"
#include "proc/proc_internal.h"
#include "proc/procfs_internal.h"

#define GG__PF_KTHREAD 0x00200000ULL

static double gg__now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Whether pid is this process or one of its ancestors (ending one would end the caller's own
 * shell). */
static bool gg__is_ancestor(pid_t pid) {
  gg__pinfo_t info;
  pid_t p = getpid();
  for (int depth = 0; depth < 128 && p > 0; depth++) {
    if (p == pid) return true;
    if (gg__proc_read_stat(p, &info) != 0) break;
    p = info.ppid;
  }
  return false;
}

/* A process of the batch, held from its check on. */
typedef struct gg__victim {
  pid_t pid;
  /* -1 without pidfd (old kernels): the pid and start time are checked before each signal */
  int pidfd;
  unsigned long long start;
  bool held, done;
} gg__victim_t;

/* Gone, or only a zombie (its parent, init, reaps it): ended either way. */
static bool gg__gone(const gg__victim_t *v) {
  if (v->pidfd >= 0 && poll(&(struct pollfd){.fd = v->pidfd, .events = POLLIN}, 1, 0) > 0)
    return true;
  gg__pinfo_t info;
  return gg__proc_read_stat(v->pid, &info) != 0 || info.start != v->start || info.state == 'Z' ||
         info.state == 'X';
}

static int gg__send(const gg__victim_t *v, int sig) {
  if (v->pidfd >= 0) return gg__pidfd_signal(v->pidfd, sig);
  gg__pinfo_t info;
  if (gg__proc_read_stat(v->pid, &info) != 0 || info.start != v->start) return -1;
  return kill(v->pid, sig);
}

/* Checks one named process and takes hold of it; false (with out->found saying why) to skip it. */
static bool gg__take(pid_t pid, unsigned long long start, unsigned flags, gg__victim_t *v,
                     gg_proc_outcome_t *out) {
  out->end = GG_PROC_SKIPPED;
  gg__pinfo_t info;
  uid_t uid;
  unsigned long long kflags = 0;
  if (pid <= 1) {
    out->found = pid == 1 ? "pid 1 (init) is never ended" : "not a process id";
    return false;
  }
  if (gg__is_ancestor(pid)) {
    out->found = "this process or one of its ancestors";
    return false;
  }
  if (gg__proc_read_stat(pid, &info) != 0 || gg__proc_uid(pid, &uid) != 0) {
    out->end = GG_PROC_ENDED;
    out->found = "gone before it was signalled";
    return false;
  }
  out->ppid = info.ppid;
  out->start_time = info.start;
  gg__proc_cmdline(pid, out->command, sizeof out->command);
  if (start == 0 || info.start != start) {
    out->found = "its pid now names another process";
    return false;
  }
  if (gg__proc_flags(pid, &kflags) == 0 && (kflags & GG__PF_KTHREAD)) {
    out->found = "a kernel thread";
    return false;
  }
  if (uid != getuid() && !((flags & GG_REAP_ALL_USERS) && geteuid() == 0)) {
    out->found = "another user's process";
    return false;
  }
  if (info.state == 'Z' || info.state == 'X') {
    out->end = GG_PROC_ENDED;
    out->found = "already exited (a zombie)";
    return false;
  }
  int pidfd = gg__pidfd_open(pid);
  gg__pinfo_t again;
  /* The pidfd names whatever held the pid when it was opened: confirm that is the process
   * checked. */
  if (gg__proc_read_stat(pid, &again) != 0 || again.start != start) {
    if (pidfd >= 0) close(pidfd);
    out->found = "its pid now names another process";
    return false;
  }
  *v = (gg__victim_t){pid, pidfd, start, true, false};
  out->found = "named";
  out->end = GG_PROC_ALIVE;
  return true;
}

int gg_reap(const int *pids, const unsigned long long *starts, size_t n, int grace_ms,
            unsigned flags, gg_proc_outcome_t *out) {
  if (n && (!pids || !starts || !out))
    return gg__err(GG_EINVAL, "gg_reap: NULL arrays for %zu processes", n);
  if (grace_ms < 0 || grace_ms > GG_PROC_GRACE_MAX_MS)
    return gg__err(GG_EINVAL, "gg_reap: grace_ms %d is not within 0..%d", grace_ms,
                   GG_PROC_GRACE_MAX_MS);
  if (flags & ~(unsigned)GG_REAP_ALL_USERS)
    return gg__err(GG_EINVAL, "gg_reap: unknown flags 0x%x", flags);
  gg__victim_t *v = calloc(n ? n : 1, sizeof *v);
  if (!v) return gg__err(GG_ENOMEM, "gg_reap: out of host memory");
  for (size_t i = 0; i < n; i++) {
    memset(&out[i], 0, sizeof out[i]);
    out[i].pid = pids[i];
    v[i].pidfd = -1;
    if (gg__take(pids[i], starts[i], flags, &v[i], &out[i]) && grace_ms > 0) {
      gg__pinfo_t info;
      if (gg__send(&v[i], SIGTERM) == 0) out[i].sent |= GG_PROC_SENT_TERM;
      if (gg__proc_read_stat(pids[i], &info) == 0 && (info.state == 'T' || info.state == 't') &&
          gg__send(&v[i], SIGCONT) == 0)
        out[i].sent |= GG_PROC_SENT_CONT;
    }
  }
  /* Grace: wait for all at once (the longest wait is one grace period, however many there are). */
  for (int phase = 0; phase < 2; phase++) {
    double deadline = gg__now_ms() + (phase == 0 ? grace_ms : 1000);
    for (;;) {
      size_t left = 0;
      for (size_t i = 0; i < n; i++) {
        if (!v[i].held || v[i].done) continue;
        if (gg__gone(&v[i])) {
          v[i].done = true;
          out[i].end = GG_PROC_ENDED;
        } else
          left++;
      }
      if (!left || gg__now_ms() >= deadline) break;
      struct timespec ts = {0, 10 * 1000000L};
      nanosleep(&ts, NULL);
    }
    if (phase == 1) break;
    for (size_t i = 0; i < n; i++)
      if (v[i].held && !v[i].done && gg__send(&v[i], SIGKILL) == 0)
        out[i].sent |= GG_PROC_SENT_KILL;
  }
  size_t alive = 0;
  for (size_t i = 0; i < n; i++) {
    if (v[i].held && !v[i].done) {
      gg__pinfo_t info;
      alive++;
      out[i].state = gg__proc_read_stat(v[i].pid, &info) == 0 ? info.state : '?';
    }
    if (v[i].pidfd >= 0) close(v[i].pidfd);
  }
  free(v);
  if (alive)
    return gg__err(GG_ETIMEDOUT, "gg_reap: %zu process%s still alive after SIGKILL", alive,
                   alive == 1 ? "" : "es");
  return 0;
}
