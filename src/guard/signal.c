/* signal.c — the guards' signal plumbing: handlers that only record and wake, the guard thread that
 * tears down and then honours the previous disposition, the watchdog, the fatal-signal path with
 * its async-signal-safe crash hooks, alternate signal stacks, and what a forked child gets. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "core/internal.h"
#include "core/thread_internal.h"
#include "gpuguard/guard.h"
#include "guard/signal_internal.h"

/* Bit i of a GG_GUARD_SIG* mask is gg__sigs[i]; the first four are the terminating signals. */
static const int gg__sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGSEGV,
                               SIGBUS, SIGFPE,  SIGILL, SIGABRT};
static const char *const gg__sig_names[] = {"SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGSEGV",
                                            "SIGBUS", "SIGFPE",  "SIGILL", "SIGABRT"};
#define GG__NSIGS         ((int)(sizeof gg__sigs / sizeof gg__sigs[0]))
#define GG__N_TERMINATING 4

static int gg__sig_index(int sig) {
  for (int i = 0; i < GG__NSIGS; i++)
    if (gg__sigs[i] == sig) return i;
  return -1;
}

unsigned gg__bit_of_sig(int sig) {
  int i = gg__sig_index(sig);
  return i < 0 ? 0 : 1u << i;
}

const char *gg__sig_name(int sig) {
  int i = gg__sig_index(sig);
  return i < 0 ? "signal" : gg__sig_names[i];
}

/* ---- async-signal-safe formatting ------------------------------------------------------------ */

char *gg__fmt_str(char *p, char *end, const char *s) {
  while (s && *s && p < end) *p++ = *s++;
  return p;
}

static char *gg__fmt_base(char *p, char *end, unsigned long long v, unsigned base) {
  char tmp[24];
  int n = 0;
  do {
    tmp[n++] = "0123456789abcdef"[v % base];
    v /= base;
  } while (v && n < (int)sizeof tmp);
  while (n && p < end) *p++ = tmp[--n];
  return p;
}

char *gg__fmt_u(char *p, char *end, unsigned long long v) { return gg__fmt_base(p, end, v, 10); }
char *gg__fmt_hex(char *p, char *end, unsigned long long v) {
  return gg__fmt_base(gg__fmt_str(p, end, "0x"), end, v, 16);
}

static void gg__write_all(int fd, const char *p, size_t n) {
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    p += w;
    n -= (size_t)w;
  }
}

/* ---- state ----------------------------------------------------------------------------------- */

typedef struct gg__slot {
  atomic_int busy; /* the handler filled info and the guard thread has not taken it yet */
  siginfo_t info;
} gg__slot_t;

static struct {
  pthread_mutex_t lock; /* everything but the atomics; lock order: see fork.c */
  int users[GG__NSIGS];
  bool installed[GG__NSIGS];
  struct sigaction old[GG__NSIGS]; /* the action before ours: written before ours is installed */
  gg__slot_t slot[GG__NSIGS];
  atomic_int pipe_w; /* wake-up pipe; -1 until started */
  int pipe_r;
  atomic_int pid;     /* the process whose guard thread reads the pipe */
  atomic_int exiting; /* a teardown on an exit path is running */
  bool started;
  unsigned gen; /* fork generation the threads were started in */
  /* what the guard thread calls: given by the guard layer */
  _Atomic(gg__sig_teardown_fn) on_signal;
} gg__sig = {.lock = PTHREAD_MUTEX_INITIALIZER, .pipe_w = -1, .pipe_r = -1};

void gg__sig_set_exiting(bool on) { atomic_store(&gg__sig.exiting, on ? 1 : 0); }

/* The caller may block sig: it is unblocked here. */
_Noreturn void gg__sig_die_by(int sig) {
  gg__sig_set_default(sig);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, sig);
  pthread_sigmask(SIG_UNBLOCK, &one, NULL);
  raise(sig);
  _exit(128 + sig); /* every signal handled here terminates by default: not reached */
}

/* SIG_DFL and SIG_IGN are recognised whatever the flags say: a disposition set with SA_SIGINFO and
 * SIG_IGN is still "ignored" (sa_handler and sa_sigaction share storage). */
static bool gg__is_default(const struct sigaction *sa) { return sa->sa_handler == SIG_DFL; }
static bool gg__is_ignore(const struct sigaction *sa) { return sa->sa_handler == SIG_IGN; }

/* Calls a saved handler as the kernel would have. */
static void gg__call_old(const struct sigaction *old, int sig, siginfo_t *info, void *ctx) {
  if (old->sa_flags & SA_SIGINFO)
    old->sa_sigaction(sig, info, ctx);
  else
    old->sa_handler(sig);
}

/* In a process our fork handlers did not see (a raw clone): behave as if we were not installed. */
static void gg__foreign_process(int i, int sig, siginfo_t *info, void *ctx) {
  const struct sigaction *old = &gg__sig.old[i];
  if (gg__is_ignore(old)) return;
  if (gg__is_default(old)) {
    gg__sig_set_default(sig);
    raise(sig); /* blocked while we run: delivered with the default action as we return */
    return;
  }
  gg__call_old(old, sig, info, ctx);
}

/* ---- the terminating-signal handler: record, wake, return ------------------------------------ */

static void gg__on_signal(int sig, siginfo_t *info, void *ctx) {
  int saved_errno = errno;
  int i = gg__sig_index(sig);
  if (i < 0) {
    /* not ours: cannot happen */
  } else if (getpid() != atomic_load(&gg__sig.pid)) {
    gg__foreign_process(i, sig, info, ctx);
  } else if (sig == SIGINT && atomic_load(&gg__sig.exiting)) {
    static const char msg[] = "gpuguard: second SIGINT during teardown: ending the process now\n";
    gg__write_all(2, msg, sizeof msg - 1);
    /* children and the registry record still go, as on the crash path */
    gg__crash_hooks_run(SIGINT);
    gg__sig_set_default(SIGINT);
    /* SIGINT is blocked inside this handler: it ends the process as the handler returns */
    raise(SIGINT);
  } else {
    if (!atomic_exchange(&gg__sig.slot[i].busy, 1)) gg__sig.slot[i].info = *info;
    unsigned char b = (unsigned char)sig;
    /* non-blocking; a full pipe is awake anyway */
    ssize_t w = write(atomic_load(&gg__sig.pipe_w), &b, 1);
    (void)w;
  }
  errno = saved_errno;
}

/* ---- crash hooks ----------------------------------------------------------------------------- */

typedef struct gg__hook {
  _Atomic(gg__crash_hook_fn) fn;
  void *_Atomic user;
  atomic_int pid;
  _Atomic unsigned long long seq;
} gg__hook_t;

static gg__hook_t gg__hooks[GG__CRASH_HOOKS_MAX];
static pthread_mutex_t gg__hooks_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long gg__hooks_seq;

int gg__crash_hook_add(gg__crash_hook_fn fn, void *user, int *slot) {
  if (!fn || !slot) return gg__err(GG_EINVAL, "gg__crash_hook_add: NULL fn or slot");
  pthread_mutex_lock(&gg__hooks_lock);
  for (int i = 0; i < GG__CRASH_HOOKS_MAX; i++) {
    if (atomic_load(&gg__hooks[i].fn)) continue;
    atomic_store(&gg__hooks[i].user, user);
    atomic_store(&gg__hooks[i].pid, (int)getpid());
    atomic_store(&gg__hooks[i].seq, ++gg__hooks_seq);
    atomic_store(&gg__hooks[i].fn, fn); /* last: the handler reads fn first */
    pthread_mutex_unlock(&gg__hooks_lock);
    *slot = i;
    return 0;
  }
  pthread_mutex_unlock(&gg__hooks_lock);
  return gg__err(GG_ENOMEM, "gg__crash_hook_add: all %d crash-hook slots are taken",
                 GG__CRASH_HOOKS_MAX);
}

void gg__crash_hook_remove(int slot) {
  if (slot < 0 || slot >= GG__CRASH_HOOKS_MAX) return;
  pthread_mutex_lock(&gg__hooks_lock);
  atomic_store(&gg__hooks[slot].fn, NULL);
  pthread_mutex_unlock(&gg__hooks_lock);
}

int gg__crash_hooks_run(int sig) {
  int me = (int)getpid(), ran = 0;
  unsigned long long below = ~0ull;
  /* Newest first without allocating: pick the highest sequence number below the last one run. */
  for (;;) {
    int best = -1;
    unsigned long long best_seq = 0;
    for (int i = 0; i < GG__CRASH_HOOKS_MAX; i++) {
      unsigned long long s = atomic_load(&gg__hooks[i].seq);
      if (atomic_load(&gg__hooks[i].fn) && s < below && s >= best_seq) {
        best = i;
        best_seq = s;
      }
    }
    if (best < 0) return ran;
    below = best_seq;
    gg__crash_hook_fn fn = atomic_load(&gg__hooks[best].fn);
    void *user = atomic_load(&gg__hooks[best].user);
    if (fn && atomic_load(&gg__hooks[best].pid) == me) {
      fn(sig, user);
      ran++;
    }
  }
}

/* ---- the fatal-signal handler ---------------------------------------------------------------- */

static atomic_int gg__fatal_entered, gg__fatal_done;

static void gg__on_fatal(int sig, siginfo_t *info, void *ctx) {
  int saved_errno = errno;
  int i = gg__sig_index(sig);
  if (atomic_exchange(&gg__fatal_entered, 1) == 0) {
    char buf[256], *p = buf, *end = buf + sizeof buf;
    p = gg__fmt_str(p, end, "gpuguard: fatal signal ");
    p = gg__fmt_str(p, end, gg__sig_name(sig));
    if (info && info->si_code > 0 && sig != SIGABRT) {
      p = gg__fmt_str(p, end, " (address ");
      p = gg__fmt_hex(p, end, (unsigned long long)(uintptr_t)info->si_addr);
      p = gg__fmt_str(p, end, ")");
    }
    p = gg__fmt_str(p, end, " in process ");
    p = gg__fmt_u(p, end, (unsigned long long)getpid());
    p = gg__fmt_str(p, end, ": running crash hooks; registered cleanups do not run on this path\n");
    gg__write_all(2, buf, (size_t)(p - buf));
    gg__crash_hooks_run(sig);
    atomic_store(&gg__fatal_done, 1);
  } else {
    /* Another thread is already crashing: let it finish its hooks (bounded), then die the same
     * way. */
    struct timespec ten_ms = {0, 10 * 1000 * 1000};
    for (int t = 0; t < 300 && !atomic_load(&gg__fatal_done); t++) nanosleep(&ten_ms, NULL);
  }
  if (i >= 0 && !gg__is_default(&gg__sig.old[i]) && !gg__is_ignore(&gg__sig.old[i])) {
    /* The application had its own handler: it takes the signal from now on (a handler that repairs
     * faults keeps working for later ones), and gets this one with errno as it was. */
    sigaction(sig, &gg__sig.old[i], NULL);
    errno = saved_errno;
    gg__call_old(&gg__sig.old[i], sig, info, ctx);
    errno = saved_errno;
    return;
  }
  gg__sig_set_default(sig);
  /* A sent signal is raised again; a real fault recurs when the instruction is re-executed. Either
   * way the default action ends the process with the status it would have had. */
  if (!info || info->si_code <= 0 || sig == SIGABRT) raise(sig);
  errno = saved_errno;
}

/* ---- alternate signal stacks ----------------------------------------------------------------- */

typedef struct gg__altstack {
  void *base;
  size_t size;
} gg__altstack_t;

static pthread_key_t gg__altstack_key;
static pthread_once_t gg__altstack_once = PTHREAD_ONCE_INIT;

static void gg__altstack_free(void *p) {
  gg__altstack_t *a = p;
  stack_t off;
  memset(&off, 0, sizeof off);
  off.ss_flags = SS_DISABLE;
  sigaltstack(&off, NULL);
  munmap(a->base, a->size);
  free(a);
}

static void gg__altstack_init(void) { pthread_key_create(&gg__altstack_key, gg__altstack_free); }

int gg_guard_prepare_thread(void) {
  pthread_once(&gg__altstack_once, gg__altstack_init);
  stack_t cur;
  if (sigaltstack(NULL, &cur) == 0 && !(cur.ss_flags & SS_DISABLE)) return 0; /* has one already */
  long page = sysconf(_SC_PAGESIZE);
  size_t size = 64u << 10;
  if ((size_t)SIGSTKSZ > size) size = (size_t)SIGSTKSZ;
  size = (size + (size_t)page - 1) & ~((size_t)page - 1);
  gg__altstack_t *a = malloc(sizeof *a);
  void *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (!a || base == MAP_FAILED) {
    free(a);
    if (base != MAP_FAILED) munmap(base, size);
    return gg__err(GG_ENOMEM, "gg_guard_prepare_thread: no memory for a %zu-byte signal stack",
                   size);
  }
  stack_t st;
  memset(&st, 0, sizeof st);
  st.ss_sp = base;
  st.ss_size = size;
  if (sigaltstack(&st, NULL) != 0) {
    int e = errno;
    munmap(base, size);
    free(a);
    return gg__err(GG_EIO, "gg_guard_prepare_thread: sigaltstack: %s", strerror(e));
  }
  a->base = base;
  a->size = size;
  pthread_setspecific(gg__altstack_key, a);
  return 0;
}

/* ---- the watchdog ---------------------------------------------------------------------------- */

/* One slot per teardown in progress: teardowns of different guards may overlap (exit() on one
 * thread, a signal on the guard thread), and each keeps its own limit. The thread sleeps until the
 * earliest. */
#define GG__WD_SLOTS 16

typedef struct gg__wd_slot {
  bool armed;
  struct timespec deadline;
  enum gg__wd_end kind;
  int code;
  char msg[256];
  size_t msg_len;
} gg__wd_slot_t;

static struct {
  pthread_mutex_t lock;
  pthread_cond_t cond;    /* CLOCK_MONOTONIC */
  unsigned long long seq; /* bumped at every arm and disarm: the thread then looks again */
  bool quit;              /* the guard thread could not start: the watchdog ends too (gg__start) */
  gg__wd_slot_t slot[GG__WD_SLOTS];
} gg__wd;

int gg__watchdog_arm(enum gg__wd_end kind, int code, int timeout_ms, const char *what) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  long long ns = (long long)now.tv_nsec + (long long)(timeout_ms % 1000) * 1000000LL;
  pthread_mutex_lock(&gg__wd.lock);
  int i = 0;
  while (i < GG__WD_SLOTS && gg__wd.slot[i].armed) i++;
  if (i == GG__WD_SLOTS) { /* more overlapping teardowns than slots: the oldest limits still hold */
    pthread_mutex_unlock(&gg__wd.lock);
    return 0;
  }
  gg__wd_slot_t *w = &gg__wd.slot[i];
  char *p = w->msg, *end = w->msg + sizeof w->msg;
  w->deadline.tv_sec = now.tv_sec + timeout_ms / 1000 + (time_t)(ns / 1000000000LL);
  w->deadline.tv_nsec = (long)(ns % 1000000000LL);
  w->kind = kind;
  w->code = code;
  w->armed = true;
  gg__wd.seq++;
  p = gg__fmt_str(p, end, "gpuguard: the teardown of guard '");
  p = gg__fmt_str(p, end, what);
  p = gg__fmt_str(p, end, "' took more than ");
  p = gg__fmt_u(p, end, (unsigned long long)timeout_ms);
  p = gg__fmt_str(p, end, " ms; ending the process ");
  if (kind == GG__WD_BY_SIGNAL) {
    p = gg__fmt_str(p, end, "with the default action of ");
    p = gg__fmt_str(p, end, gg__sig_name(code));
  } else {
    p = gg__fmt_str(p, end, "with exit status ");
    p = gg__fmt_u(p, end, (unsigned long long)(unsigned)code);
  }
  p = gg__fmt_str(p, end, "\n");
  w->msg_len = (size_t)(p - w->msg);
  pthread_cond_broadcast(&gg__wd.cond);
  pthread_mutex_unlock(&gg__wd.lock);
  return i + 1;
}

void gg__watchdog_disarm(int token) {
  if (token <= 0 || token > GG__WD_SLOTS) return;
  pthread_mutex_lock(&gg__wd.lock);
  gg__wd.slot[token - 1].armed = false;
  gg__wd.seq++;
  pthread_cond_broadcast(&gg__wd.cond);
  pthread_mutex_unlock(&gg__wd.lock);
}

static bool gg__ts_before(const struct timespec *a, const struct timespec *b) {
  return a->tv_sec < b->tv_sec || (a->tv_sec == b->tv_sec && a->tv_nsec < b->tv_nsec);
}

static void *gg__watchdog_main(void *arg) {
  (void)arg;
  pthread_mutex_lock(&gg__wd.lock);
  gg__wd_slot_t *due = NULL;
  while (!due) {
    if (gg__wd.quit) {
      pthread_mutex_unlock(&gg__wd.lock);
      return NULL;
    }
    gg__wd_slot_t *first = NULL;
    for (int i = 0; i < GG__WD_SLOTS; i++)
      if (gg__wd.slot[i].armed &&
          (!first || gg__ts_before(&gg__wd.slot[i].deadline, &first->deadline)))
        first = &gg__wd.slot[i];
    if (!first) {
      pthread_cond_wait(&gg__wd.cond, &gg__wd.lock);
      continue;
    }
    unsigned long long seq = gg__wd.seq;
    int r = 0;
    while (gg__wd.seq == seq && r != ETIMEDOUT)
      r = pthread_cond_timedwait(&gg__wd.cond, &gg__wd.lock, &first->deadline);
    if (r == ETIMEDOUT && gg__wd.seq == seq && first->armed) due = first;
  }
  enum gg__wd_end kind = due->kind;
  int code = due->code;
  gg__write_all(2, due->msg, due->msg_len);
  pthread_mutex_unlock(&gg__wd.lock);
  /* The teardown is stuck: do what the crash path does (children), then end as the exit path
   * would. */
  gg__crash_hooks_run(kind == GG__WD_BY_SIGNAL ? code : 0);
  if (kind == GG__WD_BY_SIGNAL) gg__sig_die_by(code);
  _exit(code);
}

/* ---- the guard thread ------------------------------------------------------------------------ */

static bool gg__is_ours(const struct sigaction *sa);

/* Honours the disposition sig had before ours, after the teardown. A previous handler must run as a
 * real signal handler (it may set a volatile sig_atomic_t flag, or expect the interrupted thread's
 * context): its action is restored and the original siginfo queued to the process again, so the
 * kernel delivers it to an application thread, with the original sender. Our handler stays off that
 * signal until a guard is created again. */
static void gg__honour(int i, siginfo_t *info) {
  int sig = gg__sigs[i];
  pthread_mutex_lock(&gg__sig.lock);
  struct sigaction old = gg__sig.old[i];
  if (!gg__is_default(&old) && !gg__is_ignore(&old)) {
    struct sigaction cur;
    sigaction(sig, NULL, &cur);
    if (gg__is_ours(&cur)) sigaction(sig, &old, NULL);
    gg__sig.installed[i] = false;
  }
  pthread_mutex_unlock(&gg__sig.lock);
  if (gg__is_ignore(&old)) return;
  if (gg__is_default(&old)) gg__sig_die_by(sig);
  /* Linux lets a thread other than the main one queue only negative codes: SI_QUEUE keeps the
   * sender's pid and uid, which is what handlers look at. */
  info->si_signo = sig;
  if (info->si_code >= 0 || info->si_code == SI_TKILL) info->si_code = SI_QUEUE;
  if (syscall(SYS_rt_sigqueueinfo, getpid(), sig, info) != 0) kill(getpid(), sig);
}

static void *gg__guard_main(void *arg) {
  int fd = (int)(intptr_t)arg;
  gg_guard_prepare_thread();
  for (;;) {
    unsigned char b;
    ssize_t n = read(fd, &b, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return NULL;
    int i = gg__sig_index(b);
    if (i < 0 || i >= GG__N_TERMINATING) continue;
    siginfo_t info;
    memset(&info, 0, sizeof info);
    if (atomic_load(&gg__sig.slot[i].busy))
      info = gg__sig.slot[i].info;
    else
      info.si_signo = b;
    atomic_store(&gg__sig.slot[i].busy, 0);
    gg__sig_teardown_fn on_signal = atomic_load(&gg__sig.on_signal);
    gg__sig_set_exiting(true);
    if (on_signal) on_signal(b);
    gg__sig_set_exiting(false);
    gg__honour(i, &info);
  }
}

/* Test hook: the Nth thread gg__start() creates fails as pthread_create does without resources. */
static atomic_int gg__fail_thread;
void gg__sig_test_fail_start(int nth) { atomic_store(&gg__fail_thread, nth); }

/* Creates a joinable thread with every signal blocked, so handlers run on the application's
 * threads. */
static int gg__spawn(pthread_t *t, void *(*fn)(void *), void *arg, int nth) {
  if (atomic_load(&gg__fail_thread) == nth) return EAGAIN;
  return gg__thread_start(t, fn, arg, false);
}

static int gg__start(void) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0)
    return gg__err(GG_EIO, "gg_guard_create: cannot create the signal pipe: %s", strerror(errno));
  /* Out of the way of code that closes or reuses low descriptors (daemonising, closerange(3,
   * ...)). */
  for (int k = 0; k < 2; k++) {
    int high = fcntl(fds[k], F_DUPFD_CLOEXEC, 512);
    if (high >= 0) {
      close(fds[k]);
      fds[k] = high;
    }
  }
  fcntl(fds[1], F_SETFL, fcntl(fds[1], F_GETFL) | O_NONBLOCK);
  /* Fresh in every fork generation: the parent's threads do not exist here. */
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_mutex_init(&gg__wd.lock, NULL);
  pthread_cond_init(&gg__wd.cond, &ca);
  pthread_condattr_destroy(&ca);
  for (int i = 0; i < GG__WD_SLOTS; i++) gg__wd.slot[i].armed = false;
  gg__wd.quit = false;
  pthread_t wd, guard;
  int e = gg__spawn(&wd, gg__watchdog_main, NULL, 1);
  const char *which = "watchdog";
  bool have_wd = e == 0;
  if (have_wd) e = gg__spawn(&guard, gg__guard_main, (void *)(intptr_t)fds[0], 2);
  if (have_wd && e != 0) {
    /* Trap: a watchdog left waiting here would sit on the lock and condition variable that the next
     * gg__start() initialises again. It is told to end and joined: nothing is left behind. */
    which = "guard";
    pthread_mutex_lock(&gg__wd.lock);
    gg__wd.quit = true;
    pthread_cond_broadcast(&gg__wd.cond);
    pthread_mutex_unlock(&gg__wd.lock);
    pthread_join(wd, NULL);
  }
  if (e != 0) {
    close(fds[0]);
    close(fds[1]);
    return gg__err(GG_ENOMEM, "gg_guard_create: cannot start the %s thread: %s", which,
                   strerror(e));
  }
  pthread_detach(wd);
  pthread_detach(guard);
  gg__sig.pipe_r = fds[0];
  atomic_store(&gg__sig.pipe_w, fds[1]);
  atomic_store(&gg__sig.pid, (int)getpid());
  gg__sig.started = true;
  gg__sig.gen = gg__fork_generation();
  return 0;
}

/* ---- install and restore --------------------------------------------------------------------- */

static void gg__install(int i) {
  int sig = gg__sigs[i];
  struct sigaction cur, ours;
  sigaction(sig, NULL, &cur);
  if (gg__is_ignore(&cur)) return; /* ignored (nohup, a shell's background job): left alone */
  if (gg__is_ours(&cur)) {
    gg__sig.installed[i] = true; /* never save our own handler as the previous one */
    return;
  }
  memset(&ours, 0, sizeof ours);
  ours.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
  sigemptyset(&ours.sa_mask);
  if (i < GG__N_TERMINATING) {
    ours.sa_sigaction = gg__on_signal;
  } else {
    ours.sa_sigaction = gg__on_fatal;
    for (int k = 0; k < GG__NSIGS; k++) sigaddset(&ours.sa_mask, gg__sigs[k]);
  }
  gg__sig.old[i] = cur;
  if (sigaction(sig, &ours, NULL) == 0) gg__sig.installed[i] = true;
}

static bool gg__is_ours(const struct sigaction *sa) {
  return (sa->sa_flags & SA_SIGINFO) &&
         (sa->sa_sigaction == gg__on_signal || sa->sa_sigaction == gg__on_fatal);
}

static void gg__restore(int i) {
  struct sigaction cur;
  sigaction(gg__sigs[i], NULL, &cur);
  /* else someone replaced ours */
  if (gg__is_ours(&cur)) sigaction(gg__sigs[i], &gg__sig.old[i], NULL);
  gg__sig.installed[i] = false;
}

/* ---- fork (called by fork.c in the lock order) ----------------------------------------------- */

static void gg__sig_fork_prepare(void) {
  pthread_mutex_lock(&gg__sig.lock);
  pthread_mutex_lock(&gg__hooks_lock);
}

static void gg__sig_fork_parent(void) {
  pthread_mutex_unlock(&gg__hooks_lock);
  pthread_mutex_unlock(&gg__sig.lock);
}

/* The child gets the dispositions it had before gpuguard; the guard threads did not come along. */
static void gg__sig_fork_child(void) {
  pthread_mutex_unlock(&gg__hooks_lock);
  for (int i = 0; i < GG__NSIGS; i++) {
    if (gg__sig.installed[i]) gg__restore(i);
    gg__sig.users[i] = 0;
    atomic_store(&gg__sig.slot[i].busy, 0);
  }
  if (gg__sig.started) {
    close(gg__sig.pipe_r);
    close(atomic_load(&gg__sig.pipe_w));
  }
  gg__sig.pipe_r = -1;
  atomic_store(&gg__sig.pipe_w, -1);
  gg__sig.started = false;
  atomic_store(&gg__sig.exiting, 0);
  pthread_mutex_unlock(&gg__sig.lock);
}
GG__FORK_REGISTER(GG__FORK_SIGNAL, gg__sig_fork_prepare, gg__sig_fork_parent, gg__sig_fork_child)

int gg__sig_acquire(unsigned mask, gg__sig_teardown_fn on_signal) {
  int rc = 0;
  pthread_mutex_lock(&gg__sig.lock);
  atomic_store(&gg__sig.on_signal, on_signal);
  if (!gg__sig.started || gg__sig.gen != gg__fork_generation()) rc = gg__start();
  if (rc == 0) {
    /* best effort: without it a stack overflow dies without the report */
    gg_guard_prepare_thread();
    for (int i = 0; i < GG__NSIGS; i++)
      if ((mask & (1u << i)) && (gg__sig.users[i]++ == 0 || !gg__sig.installed[i])) gg__install(i);
  }
  pthread_mutex_unlock(&gg__sig.lock);
  return rc;
}

void gg__sig_release(unsigned mask) {
  pthread_mutex_lock(&gg__sig.lock);
  for (int i = 0; i < GG__NSIGS; i++)
    if ((mask & (1u << i)) && gg__sig.users[i] > 0 && --gg__sig.users[i] == 0 &&
        gg__sig.installed[i])
      gg__restore(i);
  pthread_mutex_unlock(&gg__sig.lock);
}
