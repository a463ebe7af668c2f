/* proc_ns.c — a spawned job in its own PID namespace: the probe, and the two small processes that
 * hold the namespace (a keeper in ours, an init in the new one), so that the kernel ends every
 * process of the job when the keeper dies, however it dies. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "proc/proc_internal.h"

/* ---- entering a namespace -------------------------------------------------------------------- */

static int gg__write_file(const char *path, const char *text) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = write(fd, text, strlen(text));
  close(fd);
  return n == (ssize_t)strlen(text) ? 0 : -1;
}

static void gg__fmt_map(char *buf, size_t cap, unsigned id) {
  /* "ID ID 1\n" without snprintf: this runs between fork and exec. */
  char d[16];
  size_t n = 0, at = 0;
  do {
    d[n++] = (char)('0' + id % 10);
    id /= 10;
  } while (id && n < sizeof d);
  for (int rep = 0; rep < 2; rep++) {
    for (size_t i = n; i > 0 && at + 1 < cap; i--) buf[at++] = d[i - 1];
    if (at + 1 < cap) buf[at++] = ' ';
  }
  if (at + 3 < cap) {
    buf[at++] = '1';
    buf[at++] = '\n';
  }
  buf[at] = '\0';
}

/* [AS-safe] Makes this (single-threaded) process's next child the first process of a new PID
 * namespace with its own mount namespace (for its /proc). As root directly; else through a new user
 * namespace that maps our uid and gid onto themselves. 1: root path, 2: user-namespace path, -1
 * with errno (the user namespace's refusal; *direct, when not NULL, gets the direct attempt's). */
static int gg__enter(int *direct) {
  if (unshare(CLONE_NEWPID | CLONE_NEWNS) == 0) return 1;
  if (direct) *direct = errno;
  unsigned uid = (unsigned)geteuid(), gid = (unsigned)getegid();
  if (unshare(CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNS) != 0) return -1;
  char map[48];
  /* absent on old kernels: the gid map then needs none */
  gg__write_file("/proc/self/setgroups", "deny");
  gg__fmt_map(map, sizeof map, uid);
  if (gg__write_file("/proc/self/uid_map", map) != 0) return -1;
  gg__fmt_map(map, sizeof map, gid);
  if (gg__write_file("/proc/self/gid_map", map) != 0) return -1;
  return 2;
}

/* [AS-safe] In the namespace's first process: a /proc of its own, so `ps` and /proc/PID inside name
 * the namespace's pids. Slave propagation, not private: the new /proc stays in the new mount
 * namespace, while mounts the host makes later (an automount, NFS, a scratch volume) still reach
 * the job, as they would without the namespace. Best effort: a job without it still runs, with the
 * parent's /proc. */
static void gg__mount_proc(void) {
  if (mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) != 0) return;
  mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
}

/* Why the system refused an unprivileged user namespace, from unshare's errno (for the probe's
 * message). */
static const char *gg__userns_hint(int e) {
  switch (e) {
  case ENOSPC: return ": user.max_user_namespaces is 0 or used up";
  case EPERM:
    return ": kernel.unprivileged_userns_clone=0, an AppArmor or seccomp policy, or a chroot";
  case EINVAL: return ": a kernel without user namespaces";
  default: return "";
  }
}

int gg_proc_pid_ns_probe(void) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0)
    return gg__err(GG_EIO, "gg_proc_pid_ns_probe: pipe: %s", strerror(errno));
  pid_t kid = fork();
  if (kid < 0) {
    int e = errno;
    close(p[0]);
    close(p[1]);
    return gg__err(GG_EIO, "gg_proc_pid_ns_probe: fork: %s", strerror(e));
  }
  if (kid == 0) {
    close(p[0]);
    int why[2] = {0, 0};
    int how = gg__enter(&why[0]);
    if (how < 0) {
      why[1] = errno;
      ssize_t w = write(p[1], why, sizeof why);
      (void)w;
      _exit(100);
    }
    pid_t init = fork(); /* the namespace exists once its first process does */
    if (init == 0) _exit(getpid() == 1 ? 0 : 1);
    int st = 0;
    if (init < 0 || waitpid(init, &st, 0) != init || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
      _exit(99);
    _exit(how);
  }
  close(p[1]);
  int why[2] = {0, 0}, st = 0;
  ssize_t got;
  do got = read(p[0], why, sizeof why);
  while (got < 0 && errno == EINTR);
  close(p[0]);
  while (waitpid(kid, &st, 0) < 0 && errno == EINTR) {
  }
  int code = WIFEXITED(st) ? WEXITSTATUS(st) : 98;
  if (code == 1 || code == 2) return code;
  if (code == 100 && got == (ssize_t)sizeof why)
    return gg__err(
        GG_ENOTSUP,
        "gg_proc_pid_ns_probe: no PID namespace as uid %u: unshare(CLONE_NEWPID) refused (%s), "
        "and an unprivileged user namespace too (%s%s)",
        (unsigned)geteuid(), strerror(why[0]), strerror(why[1]), gg__userns_hint(why[1]));
  return gg__err(GG_ENOTSUP,
                 "gg_proc_pid_ns_probe: no PID namespace: its first process could not start");
}

/* ---- the keeper and the init ----------------------------------------------------------------- */

/* Every signal whose default action ends a process and that a program may send on purpose: the
 * faults (SIGSEGV, ...) are a process's own bugs; SIGKILL and SIGSTOP cannot be taken. The one
 * list: the CLI's runner takes these (gg_proc_job_signals), the keeper and the init pass them on,
 * so none of them can end the keeper without the job's teardown. */
static const int gg__job_sigs[] = {SIGINT,  SIGTERM, SIGHUP,  SIGQUIT,   SIGUSR1,
                                   SIGUSR2, SIGALRM, SIGPIPE, SIGVTALRM, SIGPROF,
                                   SIGXCPU, SIGXFSZ, SIGIO,   SIGPWR,    SIGSTKFLT};

size_t gg_proc_job_signals(int *sigs, size_t cap) {
  size_t n = 0;
  for (size_t i = 0; i < sizeof gg__job_sigs / sizeof gg__job_sigs[0]; i++, n++)
    if (sigs && n < cap) sigs[n] = gg__job_sigs[i];
  for (int sig = SIGRTMIN; sig <= SIGRTMAX; sig++, n++)
    if (sigs && n < cap) sigs[n] = sig;
  return n;
}

bool gg__sig_ignored(int sig) {
  struct sigaction cur;
  return sigaction(sig, NULL, &cur) == 0 && cur.sa_handler == SIG_IGN;
}

/* [AS-safe] Starts a process the way tini does: SIGCHLD back to the default, whatever the launcher
 * left (ignored, it makes the kernel reap our children itself, and waitpid never sees the job
 * end). */
static void gg__reset_sigchld(void) {
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(SIGCHLD, &dfl, NULL);
}

/* [AS-safe] The keeper's and the init's set: the job signals, SIGCONT and SIGWINCH (harmless, but
 * the job should see them), and SIGCHLD (read with the rest). With keep_ignored, a signal ignored
 * now stays out: ignored, it can end neither, and the job ignores it too. */
static void gg__forwarded(sigset_t *set, int keep_ignored) {
  sigemptyset(set);
  for (size_t i = 0; i < sizeof gg__job_sigs / sizeof gg__job_sigs[0]; i++)
    sigaddset(set, gg__job_sigs[i]);
  for (int sig = SIGRTMIN; sig <= SIGRTMAX; sig++) sigaddset(set, sig);
  sigaddset(set, SIGCONT);
  sigaddset(set, SIGWINCH);
  for (int sig = 1; keep_ignored && sig < NSIG; sig++)
    if (sigismember(set, sig) == 1 && gg__sig_ignored(sig)) sigdelset(set, sig);
  sigaddset(set, SIGCHLD);
}

/* Who passes what on. The keeper, the init and the job share a process group (and a control group),
 * so whatever the terminal sends to its foreground group (Ctrl-C, a hangup, a resize), and whatever
 * is sent to the whole group or control group (a shell's SIGHUP to its jobs, systemd's stop,
 * Slurm), has reached the job already: passed on too, the job would get it two or three times. So
 * the keeper passes on only what its parent (the caller of gg_proc_spawn) sends it, and the init
 * only what the keeper passes on, which it tells by the token the keeper queues with each
 * signal. */
typedef struct gg__relay {
  pid_t from; /* keeper: the parent whose signals count; 0 for the init */
  pid_t to;   /* where they go; 0: nowhere */
  int token;  /* queued with each (keeper) or expected with each (init) */
} gg__relay_t;

static void gg__relay(const gg__relay_t *r, int sig, const siginfo_t *si) {
  if (!r || !r->to || sig == SIGCHLD) return;
  if (r->from) {
    bool sent = si->si_code == SI_USER || si->si_code == SI_QUEUE || si->si_code == SI_TKILL;
    if (!sent || si->si_pid != r->from) return;
    union sigval v;
    v.sival_int = r->token;
    sigqueue(r->to, sig, v);
    return;
  }
  if (si->si_code == SI_QUEUE && si->si_value.sival_int == r->token) kill(r->to, sig);
}

static int gg__wait_for(pid_t who, int *status, const sigset_t *set, const gg__relay_t *relay,
                        bool reap_all, int timeout_ms) {
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    int st;
    pid_t p;
    while ((p = waitpid(reap_all ? -1 : who, &st, WNOHANG)) > 0)
      if (p == who) {
        *status = st;
        return 0;
      }
    if (p < 0 && errno == ECHILD) return -1;
    siginfo_t si;
    struct timespec wait = {0, 50 * 1000000L}; /* a missed SIGCHLD costs at most this */
    if (timeout_ms >= 0) {
      struct timespec now;
      clock_gettime(CLOCK_MONOTONIC, &now);
      long spent = (long)(now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000;
      if (spent >= timeout_ms) return -1;
    }
    int sig = sigtimedwait(set, &si, &wait);
    if (sig > 0) gg__relay(relay, sig, &si);
  }
}

/* The init (pid 1 of the namespace): runs the job as pid 2, passes signals on, reaps every orphan
 * of the namespace, and when the job ends gives the rest grace_ms after SIGTERM before it exits
 * itself — at which point the kernel kills whatever is left. The job's wait status goes to the
 * keeper. */
static void gg__init(int alive_fd, int status_fd, int errfd, const sigset_t *set, int grace_ms,
                     int token) {
  /* Dies with the keeper. It may have died before the arming: its end of alive_fd says so. */
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) _exit(127);
  struct pollfd pf = {.fd = alive_fd, .events = POLLIN};
  if (poll(&pf, 1, 0) != 0) _exit(127);
  close(alive_fd);
  gg__mount_proc();
  pid_t job = fork();
  if (job < 0) _exit(127);
  if (job == 0) {
    close(status_fd);
    return; /* the caller goes on to exec the job */
  }
  close(errfd); /* only the job's exec may close the last copy: the spawner waits for that */
  int st = 127 << 8;
  gg__relay_t relay = {.from = 0, .to = job, .token = token};
  gg__wait_for(job, &st, set, &relay, true, -1);
  kill(-1, SIGTERM); /* from a namespace's init: every other process of the namespace */
  int ignored;
  gg__wait_for(0, &ignored, set, NULL, true, grace_ms);
  ssize_t w = write(status_fd, &st, sizeof st);
  (void)w;
  _exit(0);
}

/* [AS-safe] The keeper ends as the job did. A job's core-dumping signal re-raised here would dump
 * the keeper's core over the job's (and a second crash report): not dumpable, no core limit,
 * first. */
static void gg__keeper_exit(int job_st) {
  if (WIFSIGNALED(job_st)) {
    struct rlimit none = {0, 0};
    setrlimit(RLIMIT_CORE, &none);
    prctl(PR_SET_DUMPABLE, 0);
    signal(WTERMSIG(job_st), SIG_DFL);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, WTERMSIG(job_st));
    sigprocmask(SIG_UNBLOCK, &one, NULL);
    raise(WTERMSIG(job_st));
  }
  _exit(WIFEXITED(job_st) ? WEXITSTATUS(job_st) : 127);
}

void gg__pid_ns_child(int mode, int grace_ms, int keep_ignored, int errfd, int fail_step) {
  if (mode == GG_SPAWN_PID_NS_OFF) return;
  pid_t parent = getppid();
  int how = gg__enter(NULL);
  if (how < 0) {
    if (mode == GG_SPAWN_PID_NS_AUTO) return; /* today's design: the caller said so once already */
    int msg[2] = {fail_step, errno};
    ssize_t w = write(errfd, msg, sizeof msg);
    (void)w;
    _exit(127);
  }
  gg__reset_sigchld();
  sigset_t set;
  gg__forwarded(&set, keep_ignored);
  sigprocmask(SIG_BLOCK, &set, NULL);
  int alive[2], status[2];
  if (pipe2(alive, O_CLOEXEC) != 0 || pipe2(status, O_CLOEXEC) != 0) _exit(127);
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  int token = (int)((unsigned)now.tv_nsec ^ ((unsigned)getpid() << 16)) | 1;
  pid_t init = fork();
  if (init < 0) _exit(127);
  if (init == 0) {
    close(alive[1]);
    close(status[0]);
    gg__init(alive[0], status[1], errfd, &set, grace_ms, token);
    sigprocmask(SIG_UNBLOCK, &set, NULL); /* the job: the caller resets every disposition too */
    return;
  }
  /* The keeper, in our namespace: the process the caller tracks. It passes its parent's signals on
   * to the init, exits as the job did, and its death (PR_SET_PDEATHSIG when the caller dies) ends
   * the namespace. */
  close(errfd);
  close(alive[0]);
  close(status[1]);
  int st = 127 << 8, job_st = 127 << 8;
  gg__relay_t relay = {.from = parent, .to = init, .token = token};
  gg__wait_for(init, &st, &set, &relay, false, -1);
  if (read(status[0], &job_st, sizeof job_st) != (ssize_t)sizeof job_st) job_st = st;
  gg__keeper_exit(job_st);
}
