/* proc.c — the child sets: spawning from a long-lived helper thread with race-free parent-death
 * arming, adopting, arming forked children, the subreaper switch, fork handling, and the fatal-path
 * snapshot. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "proc/proc_internal.h"
#include "proc/registry_internal.h"
#include "core/thread_internal.h"
#include "core/vec_internal.h"

extern char **environ;

/* ---- pidfd ----------------------------------------------------------------------------------- */

static atomic_bool gg__pidfd_off;

void gg__proc_use_pidfd(bool on) { atomic_store(&gg__pidfd_off, !on); }

int gg__pidfd_open(pid_t pid) {
#ifdef SYS_pidfd_open
  if (!atomic_load(&gg__pidfd_off)) return (int)syscall(SYS_pidfd_open, pid, 0);
#endif
  (void)pid;
  errno = ENOSYS;
  return -1;
}

int gg__pidfd_signal(int pidfd, int sig) {
#ifdef SYS_pidfd_send_signal
  return (int)syscall(SYS_pidfd_send_signal, pidfd, sig, NULL, 0);
#else
  (void)pidfd, (void)sig;
  errno = ENOSYS;
  return -1;
#endif
}

/* ---- fatal-path snapshot --------------------------------------------------------------------- */

/* A fixed array the fatal handler reads without locks: a crashed thread may hold any lock, and
 * malloc may be mid-update. Writers (under gg__lock) store pidfd and start before publishing pid;
 * the handler reads pid first. A slot freed while the handler reads it names another of our own
 * children at worst. */
#define GG__SNAP_MAX 512
typedef struct gg__snap {
  atomic_int pid;
  atomic_int pidfd;
  atomic_ullong start;
} gg__snap_t;
static gg__snap_t gg__snap[GG__SNAP_MAX];
/* the pid whose children the slots hold: a forked child skips them */
static atomic_int gg__snap_owner;

static int gg__snap_claim(pid_t pid, int pidfd, unsigned long long start) {
  GG__ASSERT(pid > 1); /* the fatal path SIGKILLs what a slot names; 0 marks a free slot */
  for (int i = 0; i < GG__SNAP_MAX; i++) {
    if (atomic_load(&gg__snap[i].pid) != 0) continue;
    atomic_store(&gg__snap[i].pidfd, pidfd);
    atomic_store(&gg__snap[i].start, start);
    atomic_store(&gg__snap_owner, (int)getpid());
    atomic_store(&gg__snap[i].pid, (int)pid);
    return i;
  }
  return -1; /* full: such children still die by their death signal, not by the fatal path */
}

static void gg__snap_free(int slot) {
  GG__ASSERT(slot < GG__SNAP_MAX);
  if (slot >= 0) atomic_store(&gg__snap[slot].pid, 0);
}

/* SIGKILL to a process whose identity is known; returns 1 when its pid is still held by it (so its
 * group id cannot have been reused either). Async-signal-safe. */
static int gg__kill_known(pid_t pid, int pidfd, unsigned long long start) {
  if (pid <= 1 || pid == getpid()) return 0;
  if (pidfd >= 0) return gg__pidfd_signal(pidfd, SIGKILL) == 0;
  gg__pinfo_t info;
  if (gg__proc_read_stat(pid, &info) != 0 || info.start != start) return 0;
  return kill(pid, SIGKILL) == 0;
}

/* ---- a process group, only as far as it is ours ---------------------------------------------- */

typedef struct gg__group {
  pid_t pgrp, me;
  int sig;
  bool foreign; /* some member runs as another user */
  bool send;    /* second pass: signal our members one by one */
} gg__group_t;

static int gg__group_visit(const gg__pinfo_t *p, void *user) {
  gg__group_t *g = user;
  if (p->pgrp != g->pgrp || p->pid == g->me || p->state == 'Z' || p->state == 'X') return 0;
  uid_t uid;
  bool mine = gg__proc_uid(p->pid, &uid) == 0 && uid == getuid();
  if (!g->send) {
    g->foreign |= !mine;
    return 0;
  }
  if (mine && p->pid > 1) kill(p->pid, g->sig);
  return 0;
}

int gg__proc_signal_group(pid_t pgrp, int sig) {
  if (pgrp <= 1 || pgrp == getpgrp()) return 0;
  gg__group_t g = {.pgrp = pgrp, .me = getpid(), .sig = sig};
  int rc = gg__proc_walk(gg__group_visit, &g);
  if (rc < 0) return rc; /* cannot see the members: signal none */
  if (!g.foreign) {
    kill(-pgrp, sig);
    return 0;
  }
  g.send = true;
  gg__proc_walk(gg__group_visit, &g);
  return 1;
}

/* The group `pid` leads, when pid is still held by the process recorded with `start` (0: not
 * recorded; pid is then an unreaped child of ours, which cannot be reused). A reused pid has
 * another start time, and only the same process can still lead the group numbered after it. */
static void gg__fatal_group(pid_t pid, unsigned long long start) {
  gg__pinfo_t info;
  if (gg__proc_read_stat(pid, &info) == 0 && info.pgrp == pid && (!start || info.start == start))
    gg__proc_signal_group(pid, SIGKILL);
}

static int gg__fatal_child(const gg__pinfo_t *info, void *user) {
  pid_t me = *(const pid_t *)user;
  /* Our child (alive or zombie): its pid cannot be reused until we reap it, so kill() is exact. One
   * running as another user (a setuid program) is not ours to end, as in the teardown's sweep. */
  uid_t uid;
  if (info->ppid == me && info->pid > 1 && info->pid != me && gg__proc_uid(info->pid, &uid) == 0 &&
      uid == getuid()) {
    kill(info->pid, SIGKILL);
    if (info->pgrp == info->pid) gg__fatal_group(info->pid, info->start);
  }
  return 0;
}

/* Trap: kill(-pgid) from here once reached whatever the group held, another user's process too (a
 * setuid program the job ran, or root's runner), and a group numbered after a leader whose pid was
 * reused. A pidfd names one process, never its group, so it cannot make kill(-pgid) exact by
 * itself: the leader is proven first (pidfd, or pid + start time re-read after the kill), then the
 * group is scanned in /proc (open/read/getdents64 only) and, when a member runs as another user,
 * only our members are signalled, one by one. */
void gg__proc_fatal_kill(int sig, void *user) {
  (void)sig;
  (void)user;
  int saved = errno;
  pid_t me = getpid();
  if (atomic_load(&gg__snap_owner) == (int)me) {
    for (int i = 0; i < GG__SNAP_MAX; i++) {
      pid_t pid = atomic_load(&gg__snap[i].pid);
      if (pid <= 1) continue;
      unsigned long long start = atomic_load(&gg__snap[i].start);
      if (gg__kill_known(pid, atomic_load(&gg__snap[i].pidfd), start)) gg__fatal_group(pid, start);
    }
  }
  int sub = 0;
  if (prctl(PR_GET_CHILD_SUBREAPER, &sub) == 0 && sub) gg__proc_walk(gg__fatal_child, &me);
  gg__registry_fatal_unlink();
  errno = saved;
}

/* ---- sets ------------------------------------------------------------------------------------ */

typedef struct gg__set {
  const void *key;
  unsigned gen; /* fork generation it was made in */
  pid_t owner;  /* the process it belongs to */
  gg__kid_t *kids;
  size_t n, cap;
  struct gg__set *next;
} gg__set_t;

static pthread_mutex_t gg__lock = PTHREAD_MUTEX_INITIALIZER;
static gg__set_t *gg__sets;

static void gg__kid_close(gg__kid_t *k) {
  gg__snap_free(k->slot);
  k->slot = -1;
  if (k->pidfd >= 0) close(k->pidfd);
  k->pidfd = -1;
}

static void gg__set_free(gg__set_t *s) {
  for (size_t i = 0; i < s->n; i++) {
    /* A set inherited through fork: its pidfds were duplicated into us, its snapshot slots were
     * cleared at fork, so only the descriptors are ours to close. */
    if (s->owner != getpid()) s->kids[i].slot = -1;
    gg__kid_close(&s->kids[i]);
  }
  free(s->kids);
  free(s);
}

/* Finds key's set (creating it when create is set). Under gg__lock. The default set (NULL key)
 * inherited from a parent is dropped silently: a forked child starts with an empty one. */
static int gg__set_find(const void *key, bool create, const char *call, gg__set_t **out) {
  gg__set_t **pp = &gg__sets;
  for (; *pp; pp = &(*pp)->next)
    if ((*pp)->key == key) break;
  gg__set_t *s = *pp;
  if (s && s->owner != getpid()) {
    if (key != NULL) {
      int rc = gg__check_fork(s->gen, call);
      if (rc == 0) /* same generation by the counter but another pid: still inherited */
        rc = gg__err(GG_ESTATE,
                     "%s: this guard's process set was inherited through fork(); create a new "
                     "guard in the child",
                     call);
      return rc;
    }
    *pp = s->next;
    gg__set_free(s);
    s = NULL;
  }
  if (!s && create) {
    s = calloc(1, sizeof *s);
    if (!s) return gg__err(GG_ENOMEM, "%s: out of host memory", call);
    s->key = key;
    s->gen = gg__fork_generation();
    s->owner = getpid();
    s->next = gg__sets;
    gg__sets = s;
  }
  *out = s;
  return 0;
}

static bool gg__tracked_anywhere(pid_t pid, const gg__set_t **where) {
  for (const gg__set_t *s = gg__sets; s; s = s->next) {
    if (s->owner != getpid()) continue;
    for (size_t i = 0; i < s->n; i++)
      if (s->kids[i].pid == pid) {
        *where = s;
        return true;
      }
  }
  return false;
}

int gg__proc_track(const void *key, pid_t pid, int pidfd, unsigned long long start, int found) {
  pthread_mutex_lock(&gg__lock);
  gg__set_t *s = NULL;
  int rc = gg__set_find(key, true, "gg_proc_track", &s);
  if (rc == 0) {
    gg__kid_t *k = gg__vec_reserve(s->kids, &s->cap, s->n + 1, sizeof *k);
    if (!k)
      rc = gg__err(GG_ENOMEM, "gg_proc_track: out of host memory");
    else
      s->kids = k;
  }
  if (rc == 0) {
    GG__ASSERT(s->owner == getpid()); /* a set inherited through fork was refused or dropped */
    gg__kid_t *k = &s->kids[s->n++];
    k->pid = pid;
    k->pidfd = pidfd;
    k->start = start;
    k->found = found;
    k->slot = gg__snap_claim(pid, pidfd, start);
  } else if (pidfd >= 0) {
    close(pidfd);
  }
  pthread_mutex_unlock(&gg__lock);
  return rc;
}

int gg__proc_detach(const void *key, gg__kid_t **kids, size_t *n, pid_t **others,
                    size_t *n_others) {
  *kids = NULL;
  *n = 0;
  *others = NULL;
  *n_others = 0;
  pthread_mutex_lock(&gg__lock);
  gg__set_t *s = NULL;
  int rc = gg__set_find(key, false, "gg_proc_teardown", &s);
  size_t total = 0;
  for (const gg__set_t *o = gg__sets; rc == 0 && o; o = o->next)
    if (o != s && o->owner == getpid()) total += o->n;
  if (rc == 0 && total) {
    *others = malloc(total * sizeof **others);
    if (!*others) rc = gg__err(GG_ENOMEM, "gg_proc_teardown: out of host memory");
    for (const gg__set_t *o = gg__sets; rc == 0 && o; o = o->next)
      if (o != s && o->owner == getpid())
        for (size_t i = 0; i < o->n; i++) (*others)[(*n_others)++] = o->kids[i].pid;
  }
  GG__ASSERT(rc != 0 || *n_others == total); /* *others was sized by the first walk */
  if (rc == 0 && s) {
    GG__ASSERT(s->owner == getpid());
    *kids = s->kids;
    *n = s->n;
    s->kids = NULL;
    s->n = s->cap = 0;
  }
  pthread_mutex_unlock(&gg__lock);
  if (rc != 0) {
    free(*others);
    *others = NULL;
    *n_others = 0;
  }
  return rc;
}

void gg__proc_release(gg__kid_t *kid) {
  pthread_mutex_lock(&gg__lock); /* snapshot writers serialise on the lock */
  gg__kid_close(kid);
  pthread_mutex_unlock(&gg__lock);
}

void gg__proc_forget_set(const void *guard_key) {
  pthread_mutex_lock(&gg__lock);
  for (gg__set_t **pp = &gg__sets; *pp; pp = &(*pp)->next) {
    if ((*pp)->key != guard_key) continue;
    gg__set_t *s = *pp;
    *pp = s->next;
    gg__set_free(s);
    break;
  }
  pthread_mutex_unlock(&gg__lock);
}

/* ---- fork handling --------------------------------------------------------------------------- */

static pid_t gg__forking_pid;    /* written by the parent just before fork() */
static pid_t gg__parent_at_fork; /* in a forked image: who forked us (0 if this image was exec'd) */

static pthread_mutex_t gg__sp_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gg__sp_wake = PTHREAD_COND_INITIALIZER,
                      gg__sp_done = PTHREAD_COND_INITIALIZER;
static pid_t gg__sp_owner; /* the process whose spawn thread runs; threads do not survive fork() */

static void gg__proc_fork_prepare(void) {
  pthread_mutex_lock(&gg__lock);
  pthread_mutex_lock(&gg__sp_lock);
  gg__forking_pid = getpid();
}
static void gg__proc_fork_parent(void) {
  pthread_mutex_unlock(&gg__sp_lock);
  pthread_mutex_unlock(&gg__lock);
}
static void gg__proc_fork_child(void) {
  gg__parent_at_fork = gg__forking_pid;
  /* The parent's children are not ours: the fatal path must not kill them from here. */
  for (int i = 0; i < GG__SNAP_MAX; i++) atomic_store(&gg__snap[i].pid, 0);
  atomic_store(&gg__snap_owner, 0);
  /* The spawn thread did not come along; its waiters neither. */
  gg__sp_owner = 0;
  pthread_cond_init(&gg__sp_wake, NULL);
  pthread_cond_init(&gg__sp_done, NULL);
  pthread_mutex_unlock(&gg__sp_lock);
  pthread_mutex_unlock(&gg__lock);
}
GG__FORK_REGISTER(GG__FORK_PROC, gg__proc_fork_prepare, gg__proc_fork_parent, gg__proc_fork_child)

/* The guard layer's check of a guard key (see proc_internal.h). */
static _Atomic(gg__proc_key_check_fn) gg__key_check;

void gg__proc_set_key_check(gg__proc_key_check_fn fn) { atomic_store(&gg__key_check, fn); }

/* Asked before any of our locks is taken: the check takes the live-guard list's lock, which comes
 * before the process sets in the lock order (fork.c). */
static int gg__check_key(const void *key, const char *call) {
  gg__proc_key_check_fn fn = atomic_load(&gg__key_check);
  return key && fn ? fn(key, call) : 0;
}

/* ---- the child side -------------------------------------------------------------------------- */

enum {
  GG__STEP_ARM = 1,
  GG__STEP_PGRP,
  GG__STEP_CWD,
  GG__STEP_STDIO,
  GG__STEP_EXEC,
  GG__STEP_PIDNS
};

typedef struct gg__spawn_req {
  /* in */
  const char *path;
  char *const *argv;
  char *const *envp;
  gg_spawn_options_t opts;
  long arm_delay_ms; /* test hook: widens the window between fork and arming */
  /* out */
  int sys_errno, step;
  pid_t pid;
  int pidfd;
  bool done;
  struct gg__spawn_req *next;
} gg__spawn_req_t;

static void gg__child_fail(int fd, int step) {
  int msg[2] = {step, errno};
  ssize_t w = write(fd, msg, sizeof msg);
  (void)w;
  _exit(127);
}

/* Runs in the forked child: only async-signal-safe calls from here to exec. */
static void gg__child(const gg__spawn_req_t *r, pid_t parent, int errfd) {
  if (r->opts.death_signal) {
    if (r->arm_delay_ms > 0) {
      struct timespec ts = {r->arm_delay_ms / 1000, (r->arm_delay_ms % 1000) * 1000000L};
      while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
      }
    }
    /* Trap: the parent may die between fork() and prctl(). The expected parent was fixed before the
     * fork; if getppid() differs after arming, the death signal was missed: deliver it
     * ourselves. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) gg__child_fail(errfd, GG__STEP_ARM);
    if (getppid() != parent) kill(getpid(), SIGKILL);
  }
  if (r->opts.new_process_group && setpgid(0, 0) != 0) gg__child_fail(errfd, GG__STEP_PGRP);
  if (r->opts.cwd && chdir(r->opts.cwd) != 0) gg__child_fail(errfd, GG__STEP_CWD);
  /* Move sources above 2 first, so swapped or overlapping descriptors all land right. */
  int src[3] = {r->opts.stdin_fd, r->opts.stdout_fd, r->opts.stderr_fd};
  for (int i = 0; i < 3; i++) {
    if (src[i] < 0) continue;
    src[i] = fcntl(src[i], F_DUPFD_CLOEXEC, 3);
    if (src[i] < 0) gg__child_fail(errfd, GG__STEP_STDIO);
  }
  for (int i = 0; i < 3; i++)
    if (src[i] >= 0 && dup2(src[i], i) < 0) gg__child_fail(errfd, GG__STEP_STDIO);
  if (r->opts.close_device_fds) gg__close_device_files();
  /* Callers built before pid_ns passed a smaller size: they get the defaults (OFF). */
  gg__pid_ns_child(r->opts.pid_ns, r->opts.pid_ns_grace_ms, r->opts.keep_ignored, errfd,
                   GG__STEP_PIDNS);
  /* The spawn thread blocks every signal and the program may have handlers or ignored signals: the
   * child starts from the defaults and an empty mask (ignored ones kept when asked, as exec
   * would). */
  for (int sig = 1; sig < NSIG; sig++)
    if (sig != SIGKILL && sig != SIGSTOP &&
        !(r->opts.keep_ignored && sig != SIGCHLD && gg__sig_ignored(sig)))
      gg__sig_set_default(sig);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  execve(r->path, r->argv, r->envp);
  gg__child_fail(errfd, GG__STEP_EXEC);
}

/* Runs on the spawn thread. Errors are returned as errno + step: the caller formats the message in
 * its own thread-local detail. */
static void gg__do_spawn(gg__spawn_req_t *r) {
  int p[2];
  r->pid = -1;
  r->pidfd = -1;
  r->step = 0;
  r->sys_errno = 0;
  if (pipe2(p, O_CLOEXEC) != 0) {
    r->sys_errno = errno;
    return;
  }
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) gg__child(r, parent, p[1]);
  close(p[1]);
  if (pid < 0) {
    r->sys_errno = errno;
    close(p[0]);
    return;
  }
  /* Both sides set the group, so it exists before we return whichever runs first. */
  if (r->opts.new_process_group) setpgid(pid, pid);
  r->pidfd = gg__pidfd_open(pid);
  int msg[2];
  ssize_t got;
  do got = read(p[0], msg, sizeof msg);
  while (got < 0 && errno == EINTR);
  close(p[0]);
  if (got == (ssize_t)sizeof msg) { /* exec failed: the child wrote why and exits */
    r->step = msg[0];
    r->sys_errno = msg[1];
    waitpid(pid, NULL, 0);
    if (r->pidfd >= 0) close(r->pidfd);
    r->pidfd = -1;
    return;
  }
  r->pid = pid;
}

static gg__spawn_req_t *gg__sp_queue;

static void *gg__spawn_thread(void *arg) {
  (void)arg;
  pthread_mutex_lock(&gg__sp_lock);
  for (;;) {
    while (!gg__sp_queue) pthread_cond_wait(&gg__sp_wake, &gg__sp_lock);
    gg__spawn_req_t *r = gg__sp_queue;
    gg__sp_queue = r->next;
    pthread_mutex_unlock(&gg__sp_lock); /* never fork holding it: the atfork handler takes it */
    gg__do_spawn(r);
    pthread_mutex_lock(&gg__sp_lock);
    r->done = true;
    pthread_cond_broadcast(&gg__sp_done);
  }
  return NULL;
}

/* Under gg__sp_lock. The thread lives as long as the process: PR_SET_PDEATHSIG fires when the
 * thread that forked the child exits, so it must never be a caller's short-lived thread. */
static int gg__spawn_thread_ensure(void) {
  if (gg__sp_owner == getpid()) return 0;
  int e = gg__thread_start(NULL, gg__spawn_thread, NULL, true);
  if (e != 0)
    return gg__err(GG_EIO, "gg_proc_spawn: cannot start the spawn thread: %s", strerror(e));
  gg__sp_owner = getpid();
  return 0;
}

/* ---- public ---------------------------------------------------------------------------------- */

void gg_spawn_options_init(gg_spawn_options_t *opts) {
  if (!opts) return;
  memset(opts, 0, sizeof *opts);
  opts->size = sizeof *opts;
  opts->stdin_fd = opts->stdout_fd = opts->stderr_fd = -1;
  opts->death_signal = 1;
  opts->pid_ns_grace_ms = 1000;
}

/* A name without '/' is found in our PATH here, in the parent: execvp in the child may allocate. */
static int gg__resolve(const char *name, char *out, size_t cap) {
  if (strchr(name, '/')) {
    gg__strlcpy(out, name, cap);
    return 0;
  }
  const char *path = gg__env("PATH");
  if (!path) path = "/usr/local/bin:/usr/bin:/bin";
  bool denied = false;
  for (const char *p = path;;) {
    const char *end = strchr(p, ':');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    if (len + strlen(name) + 2 <= cap) {
      memcpy(out, len ? p : ".", len ? len : 1);
      size_t at = len ? len : 1;
      out[at] = '/';
      strcpy(out + at + 1, name);
      struct stat st;
      if (stat(out, &st) == 0 && S_ISREG(st.st_mode)) {
        if (access(out, X_OK) == 0) return 0;
        denied = true;
      }
    }
    if (!end) break;
    p = end + 1;
  }
  if (denied) return gg__err(GG_EPERM, "gg_proc_spawn: '%s' is in PATH but not executable", name);
  return gg__err(GG_ENOTFOUND, "gg_proc_spawn: '%s' not found in PATH", name);
}

/* The child's environment, built here and given to execve(): the process environment is never
 * written (setenv() with threads running races with their getenv()). An environment the caller
 * passed keeps its own GPUGUARD_SESSION and gets ours only when it has none; an inherited one
 * (environ) has ours in place of any it carries (which may name a dead session this process did not
 * join). */
static int gg__child_env(char *const *env, bool explicit_env, char ***out, char **owned) {
  *out = NULL;
  *owned = NULL;
  char session[40];
  gg_registry_session(session, sizeof session);
  if (!env || !session[0]) return 0;
  size_t n = 0, kept = 0;
  for (; env[n]; n++)
    if (strncmp(env[n], "GPUGUARD_SESSION=", 17) == 0) {
      if (explicit_env || strcmp(env[n] + 17, session) == 0) return 0;
    }
  char **e = malloc((n + 2) * sizeof *e);
  size_t len = strlen(session) + 18;
  char *kv = malloc(len);
  if (!e || !kv) {
    free(e);
    free(kv);
    return gg__err(GG_ENOMEM, "gg_proc_spawn: out of host memory");
  }
  snprintf(kv, len, "GPUGUARD_SESSION=%s", session);
  for (size_t i = 0; i < n; i++)
    if (strncmp(env[i], "GPUGUARD_SESSION=", 17) != 0) e[kept++] = env[i];
  e[kept] = kv;
  e[kept + 1] = NULL;
  *out = e;
  *owned = kv;
  return 0;
}

/* The caller's options over the defaults, checked: a size from gg_spawn_options_init(), a pid_ns
 * mode, a grace in range, descriptors that are open. */
static int gg__spawn_options(const gg_spawn_options_t *opts, gg_spawn_options_t *out) {
  gg_spawn_options_init(out);
  if (opts) {
    if (opts->size < offsetof(gg_spawn_options_t, stdin_fd) || opts->size > sizeof *opts)
      return gg__err(GG_EINVAL,
                     "gg_spawn_options_t.size is %zu: fill options with gg_spawn_options_init()",
                     opts->size);
    memcpy(out, opts, opts->size);
  }
  if (out->pid_ns < GG_SPAWN_PID_NS_OFF || out->pid_ns > GG_SPAWN_PID_NS_ON)
    return gg__err(GG_EINVAL, "gg_proc_spawn: pid_ns %d is not a gg_spawn_pid_ns_t", out->pid_ns);
  if (out->pid_ns_grace_ms < 0 || out->pid_ns_grace_ms > GG_PROC_GRACE_MAX_MS)
    return gg__err(GG_EINVAL, "gg_proc_spawn: pid_ns_grace_ms %d is outside 0..%d",
                   out->pid_ns_grace_ms, GG_PROC_GRACE_MAX_MS);
  const int fds[3] = {out->stdin_fd, out->stdout_fd, out->stderr_fd};
  for (int i = 0; i < 3; i++)
    if (fds[i] < -1 || (fds[i] >= 0 && fcntl(fds[i], F_GETFD) < 0))
      return gg__err(GG_EINVAL, "gg_proc_spawn: %s descriptor %d is not open",
                     i == 0   ? "stdin"
                     : i == 1 ? "stdout"
                              : "stderr",
                     fds[i]);
  return 0;
}

/* Hands the request to the spawn thread (started on first use) and waits until it is done. */
static int gg__spawn_submit(gg__spawn_req_t *r) {
  pthread_mutex_lock(&gg__sp_lock);
  int rc = gg__spawn_thread_ensure();
  if (rc == 0) {
    r->next = NULL;
    gg__spawn_req_t **tail = &gg__sp_queue;
    while (*tail) tail = &(*tail)->next;
    *tail = r;
    pthread_cond_signal(&gg__sp_wake);
    while (!r->done) pthread_cond_wait(&gg__sp_done, &gg__sp_lock);
  }
  pthread_mutex_unlock(&gg__sp_lock);
  return rc;
}

/* The error for a child that could not start: the step it failed at and the system's reason. */
static int gg__spawn_failed(const gg__spawn_req_t *r, const char *name, const char *path) {
  int e = r->sys_errno;
  if (r->step == GG__STEP_EXEC)
    return gg__err(e == ENOENT || e == ENOTDIR ? GG_ENOTFOUND
                   : e == EACCES || e == EPERM ? GG_EPERM
                                               : GG_EIO,
                   "gg_proc_spawn: cannot execute '%s': %s", path, strerror(e));
  static const char *const steps[] = {
      "fork",
      "arm the death signal",
      "make a process group",
      "change directory",
      "set up stdin/stdout/stderr",
      "exec",
      "enter a new PID namespace (gg_proc_pid_ns_probe() says why)"};
  const char *what = r->step >= 0 && r->step < 7 ? steps[r->step] : "start";
  return gg__err(GG_EIO, "gg_proc_spawn: '%s': child could not %s%s%s: %s", name, what,
                 r->step == GG__STEP_CWD ? " to " : "", r->step == GG__STEP_CWD ? r->opts.cwd : "",
                 strerror(e));
}

int gg_proc_spawn(gg_guard_t *guard, const char *const argv[], const gg_spawn_options_t *opts,
                  pid_t *pid) {
  if (pid) *pid = -1;
  if (!argv || !argv[0] || !argv[0][0])
    return gg__err(GG_EINVAL, "gg_proc_spawn: argv is NULL or empty");
  gg__spawn_req_t r;
  memset(&r, 0, sizeof r);
  int rc = gg__spawn_options(opts, &r.opts);
  if (rc != 0) return rc;
  /* Refuse a dead guard or an inherited set before starting anything. */
  rc = gg__check_key(guard, "gg_proc_spawn");
  if (rc != 0) return rc;
  gg__set_t *s = NULL;
  pthread_mutex_lock(&gg__lock);
  rc = gg__set_find(guard, true, "gg_proc_spawn", &s);
  pthread_mutex_unlock(&gg__lock);
  if (rc != 0) return rc;

  char path[4096];
  rc = gg__resolve(argv[0], path, sizeof path);
  if (rc != 0) return rc;
  char **env = NULL, *kv = NULL;
  rc = gg__child_env(r.opts.env ? r.opts.env : environ, r.opts.env != NULL, &env, &kv);
  if (rc != 0) return rc;
  r.path = path;
  r.argv = (char *const *)argv; /* execve's prototype predates const; it does not write */
  r.envp = env ? env : r.opts.env ? r.opts.env : environ;
#ifdef GG_TESTING /* test builds only: widens the window between fork and the death signal */
  const char *delay = gg__env("GPUGUARD_TEST_ARM_DELAY_MS");
  r.arm_delay_ms = delay ? atol(delay) : 0;
#else
  r.arm_delay_ms = 0;
#endif

  rc = gg__spawn_submit(&r);
  free(env);
  free(kv);
  if (rc != 0) return rc;
  if (r.pid < 0) return gg__spawn_failed(&r, argv[0], path);
  gg__pinfo_t info;
  unsigned long long start = gg__proc_read_stat(r.pid, &info) == 0 ? info.start : 0;
  rc = gg__proc_track(guard, r.pid, r.pidfd, start, GG__FOUND_TRACKED);
  if (rc != 0) {
    /* Not tracked means not guarded: do not leave it running. */
    kill(r.pid, SIGKILL);
    waitpid(r.pid, NULL, 0);
    return rc;
  }
  if (r.opts.pid_ns != GG_SPAWN_PID_NS_OFF) gg__registry_note_job_ns(r.pid);
  if (pid) *pid = r.pid;
  return 0;
}

int gg_proc_adopt(gg_guard_t *guard, pid_t pid) { return gg_proc_adopt_ex(guard, pid, 0); }

int gg_proc_adopt_ex(gg_guard_t *guard, pid_t pid, unsigned long long start_time) {
  if (pid <= 0)
    return gg__err(GG_EINVAL, "gg_proc_adopt: pid %d is not a process (0 and -1 name groups)",
                   (int)pid);
  if (pid == 1) return gg__err(GG_EPERM, "gg_proc_adopt: pid 1 (init) is never adopted");
  if (pid == getpid()) return gg__err(GG_EINVAL, "gg_proc_adopt: pid %d is this process", (int)pid);
  if (gg__proc_is_ancestor(pid)) /* its teardown would end what started us, our shell say */
    return gg__err(GG_EPERM, "gg_proc_adopt: pid %d is an ancestor of this process", (int)pid);
  int live = gg__check_key(guard, "gg_proc_adopt");
  if (live < 0) return live;
  uid_t uid;
  gg__pinfo_t info;
  if (gg__proc_read_stat(pid, &info) != 0)
    return gg__err(GG_ENOTFOUND, "gg_proc_adopt: no process %d", (int)pid);
  if (gg__proc_uid(pid, &uid) != 0)
    return gg__err(GG_ENOTFOUND, "gg_proc_adopt: no process %d", (int)pid);
  if (uid != getuid())
    return gg__err(GG_EPERM, "gg_proc_adopt: process %d belongs to uid %u, not to us (%u)",
                   (int)pid, (unsigned)uid, (unsigned)getuid());
  if (info.state == 'Z' || info.state == 'X')
    return gg__err(GG_ENOTFOUND, "gg_proc_adopt: process %d has already exited", (int)pid);
  if (start_time && info.start != start_time)
    return gg__err(
        GG_ENOTFOUND,
        "gg_proc_adopt: pid %d now names another process (start time %llu, expected %llu)",
        (int)pid, info.start, start_time);
  int pidfd = gg__pidfd_open(pid);
  if (pidfd < 0 && errno == ESRCH)
    return gg__err(GG_ENOTFOUND, "gg_proc_adopt: no process %d", (int)pid);
  /* The pidfd names whatever held the pid when it was opened: confirm that is the process we
   * read. */
  gg__pinfo_t again;
  if (gg__proc_read_stat(pid, &again) != 0 || again.start != info.start ||
      (pidfd >= 0 && poll(&(struct pollfd){.fd = pidfd, .events = POLLIN}, 1, 0) > 0)) {
    if (pidfd >= 0) close(pidfd);
    return gg__err(GG_ENOTFOUND, "gg_proc_adopt: process %d exited while being adopted", (int)pid);
  }
  pthread_mutex_lock(&gg__lock);
  const gg__set_t *where = NULL;
  gg__set_t *mine = NULL;
  int rc = gg__set_find(guard, true, "gg_proc_adopt", &mine);
  bool dup = rc == 0 && gg__tracked_anywhere(pid, &where);
  pthread_mutex_unlock(&gg__lock);
  if (rc != 0 || dup) {
    if (pidfd >= 0) close(pidfd);
    if (rc != 0) return rc;
    if (where == mine) return 0;
    return gg__err(GG_EINVAL, "gg_proc_adopt: process %d is already tracked by another guard",
                   (int)pid);
  }
  return gg__proc_track(guard, pid, pidfd, info.start, GG__FOUND_TRACKED);
}

pid_t gg__proc_parent_at_fork(void) { return gg__parent_at_fork; }
