/* cmd_run.c — `gpuguard run`: CMD as a guarded job (subreaper, session record, every signal taken
 * and passed on once, the teardown afterwards) and its JSON receipt. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli_internal.h"

/* Free memory of the device after the job: the driver frees a dead process's memory shortly after
 * it dies (~100 ms on an H200), so wait up to limit_ms for it to come back to `before`. */
static bool free_after(int device, size_t before, double limit_ms, size_t *after,
                       double *waited_ms) {
  double t0 = gg__now_ms();
  gg_device_info_t d;
  for (;;) {
    if (gg_device_info(device, &d) != 0) return false;
    *after = d.free_bytes;
    *waited_ms = gg__now_ms() - t0;
    if (d.free_bytes >= before || *waited_ms >= limit_ms) return true;
    struct timespec ts = {0, 20 * 1000000L};
    nanosleep(&ts, NULL);
  }
}

typedef struct run_opts {
  long grace, device;
  /* GG_SPAWN_PID_NS_*; AUTO asks gg_proc_pid_ns_probe() first and says once if refused */
  int pid_ns;
  bool in_ns; /* the job did get its namespace (for the receipt) */
  const char *receipt_path;
  char **cmd;
} run_opts_t;

typedef struct job_result {
  pid_t pid;
  int status; /* wait status of CMD, valid when reaped */
  bool reaped;
  int runner_sig; /* the signal that ended the runner's wait, 0 if none */
  int exit_code;
  char start_error[512]; /* why CMD could not be started; empty when it was */
} job_result_t;

/* What the runner saw of the device and the session, for the receipt. */
typedef struct run_env {
  char session[40];
  gg_device_info_t dev;
  bool have_dev;
  size_t free_after;
  double waited_ms;
} run_env_t;

/* path's directory and a temporary name beside it: "DIR/.BASE.XXXXXX", for mkostemp. */
static bool temp_beside(const char *path, char *out, size_t cap) {
  const char *slash = strrchr(path, '/');
  int dir = slash ? (int)(slash - path) + 1 : 0;
  int n = snprintf(out, cap, "%.*s.%s.XXXXXX", dir, path, slash ? slash + 1 : path);
  return n > 0 && (size_t)n < cap;
}

/* A new temporary file beside path, its name in tmp: the descriptor, or -1 with errno set. */
static int temp_open(const char *path, char *tmp, size_t cap) {
  if (!temp_beside(path, tmp, cap)) {
    errno = ENAMETOOLONG;
    return -1;
  }
  return mkostemp(tmp, O_CLOEXEC);
}

/* The receipt's path, checked before the job starts, so that a bad one is said at once: it is a
 * regular file or nothing (never followed: a symlink, a FIFO or a device there is refused, as is a
 * directory we cannot create a file in). An old receipt there is removed now: a runner that dies
 * before writing the new one (SIGKILL) leaves no receipt, never the previous run's. The receipt
 * itself is written at the end to a temporary file renamed over the path, so it is never seen
 * half-written. Returns -1 to go on, else the exit status. */
static int open_receipt(run_opts_t *o) {
  if (!o->receipt_path || strcmp(o->receipt_path, "-") == 0) return -1;
  const char *path = o->receipt_path;
  char why[4200], tmp[4200];
  struct stat st;
  bool exists = lstat(path, &st) == 0;
  if (exists && !S_ISREG(st.st_mode)) {
    snprintf(why, sizeof why, "--receipt %s: not a regular file (%s); the job was not started",
             path,
             S_ISLNK(st.st_mode)    ? "a symbolic link"
             : S_ISFIFO(st.st_mode) ? "a FIFO"
             : S_ISDIR(st.st_mode)  ? "a directory"
                                    : "a device or socket");
    return bad_usage("%s", why);
  }
  int fd = temp_open(path, tmp, sizeof tmp);
  if (fd >= 0) {
    close(fd);
    unlink(tmp);
  }
  if (fd < 0 || (exists && unlink(path) != 0 && errno != ENOENT)) {
    snprintf(why, sizeof why, "--receipt %s: cannot be written (%s); the job was not started", path,
             strerror(errno));
    return bad_usage("%s", why);
  }
  return -1;
}

static bool write_all(int fd, const char *buf, size_t len) {
  for (size_t off = 0; off < len;) {
    ssize_t w = write(fd, buf + off, len - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    off += (size_t)w;
  }
  return true;
}

/* The receipt's text goes to a new file beside the path, then replaces it in one rename. */
static int put_receipt(const char *path, const char *text, size_t len) {
  char tmp[4200];
  int fd = temp_open(path, tmp, sizeof tmp);
  if (fd < 0) return -1;
  mode_t mask = umask(0);
  umask(mask);
  bool ok = fchmod(fd, 0644 & ~mask) == 0 && write_all(fd, text, len) && fsync(fd) == 0;
  int e = errno;
  ok = close(fd) == 0 && ok;
  if (ok && rename(tmp, path) == 0) return 0;
  e = ok ? errno : e;
  unlink(tmp);
  errno = e;
  return -1;
}

/* The receipt's entry for CMD itself: the runner reaped CMD, so the teardown found it gone and knew
 * neither its command, its parent nor its status. What the runner knows is the truth. */
static void fix_job_entry(gg_proc_receipt_t *receipt, const run_opts_t *o, const job_result_t *r) {
  for (size_t i = 0; receipt && i < receipt->count; i++) {
    gg_proc_outcome_t *p = &receipt->procs[i];
    if (p->pid != r->pid) continue;
    if (!p->command[0]) {
      size_t w = 0;
      for (int k = 0; o->cmd[k] && w + 1 < sizeof p->command; k++)
        w += (size_t)snprintf(p->command + w, sizeof p->command - w, "%s%s", k ? " " : "",
                              o->cmd[k]);
    }
    if (!p->ppid) p->ppid = getpid();
    if (r->reaped && p->end != GG_PROC_ALIVE) {
      p->end = WIFEXITED(r->status) ? GG_PROC_EXITED : GG_PROC_SIGNALED;
      p->code = WIFEXITED(r->status) ? WEXITSTATUS(r->status) : WTERMSIG(r->status);
    }
  }
}

/* Returns 0, or -1 having said why on stderr (the exit status stays CMD's: a receipt that could not
 * be written, on a full filesystem say, is no reason to hide how the job ended). */
static int write_receipt(run_opts_t *o, const job_result_t *r, const gg_proc_receipt_t *rc,
                         const run_env_t *env) {
  const char *path = o->receipt_path;
  char **cmd = o->cmd;
  bool to_file = strcmp(path, "-") != 0;
  char *text = NULL;
  size_t len = 0;
  FILE *f = to_file ? open_memstream(&text, &len) : stdout;
  if (!f) {
    fprintf(stderr, "gpuguard run: the receipt %s: out of memory\n", path);
    return -1;
  }
  fputs("{\"command\":[", f);
  for (int i = 0; cmd[i]; i++) {
    fputs(i ? "," : "", f);
    gg_json_write_string(f, cmd[i]);
  }
  if (r->pid > 0)
    fprintf(f, "],\"pid\":%d,\"session\":", (int)r->pid);
  else
    fputs("],\"pid\":null,\"session\":", f);
  gg_json_write_string(f, env->session);
  if (r->reaped && WIFEXITED(r->status))
    fprintf(f, ",\"exit\":{\"status\":%d,\"signal\":null}", WEXITSTATUS(r->status));
  else if (r->reaped)
    fprintf(f, ",\"exit\":{\"status\":null,\"signal\":%d}", WTERMSIG(r->status));
  else
    fputs(",\"exit\":null", f);
  if (r->runner_sig)
    fprintf(f, ",\"runner_signal\":%d", r->runner_sig);
  else
    fputs(",\"runner_signal\":null", f);
  fprintf(f, ",\"exit_code\":%d,\"start_error\":", r->exit_code);
  if (r->start_error[0])
    gg_json_write_string(f, r->start_error);
  else
    fputs("null", f);
  fprintf(f, ",\"pid_ns\":%s,\"device\":", o->in_ns ? "true" : "false");
  if (env->have_dev) {
    fprintf(f, "{\"index\":%d,\"backend\":", env->dev.index);
    gg_json_write_string(f, env->dev.backend);
    fprintf(f, ",\"free_bytes_before\":%zu,\"free_bytes_after\":%zu,\"free_after_wait_ms\":%.0f}",
            env->dev.free_bytes, env->free_after, env->waited_ms);
  } else {
    fputs("null", f);
  }
  fputs(",\"teardown\":", f);
  if (rc)
    gg_proc_receipt_write(rc, f); /* ends with a newline */
  else
    fputs("null\n", f);
  fputs("}\n", f);
  bool ok = false;
  if (!to_file) {
    ok = fflush(f) == 0 && !ferror(f);
  } else {
    ok = fclose(f) == 0; /* the memory stream: its text is complete once closed */
  }
  if (ok && to_file && put_receipt(path, text, len) != 0) ok = false;
  int e = errno;
  free(text);
  if (ok) return 0;
  fprintf(stderr,
          "gpuguard run: the receipt %s could not be written: %s (the exit status is still the "
          "job's)\n",
          to_file ? path : "(stdout)", strerror(e));
  return -1;
}

/* --pid-ns's value, and GPUGUARD_PID_NS's: a GG_SPAWN_PID_NS_* mode, -1 when it is none. */
static int parse_pid_ns(const char *v) {
  static const struct {
    const char *name;
    int mode;
  } names[] = {{"auto", GG_SPAWN_PID_NS_AUTO}, {"on", GG_SPAWN_PID_NS_ON},
               {"off", GG_SPAWN_PID_NS_OFF},   {"1", GG_SPAWN_PID_NS_ON},
               {"yes", GG_SPAWN_PID_NS_ON},    {"0", GG_SPAWN_PID_NS_OFF},
               {"no", GG_SPAWN_PID_NS_OFF}};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (!strcmp(v, names[i].name)) return names[i].mode;
  return -1;
}

/* Phase 1: the options. Returns -1 to go on, else the exit status. */
static int run_parse(int argc, char **argv, run_opts_t *o) {
  static const struct option longs[] = {{"grace", required_argument, 0, 'g'},
                                        {"receipt", required_argument, 0, 'r'},
                                        {"device", required_argument, 0, 'd'},
                                        {"pid-ns", optional_argument, 0, 'p'},
                                        {"torch", no_argument, 0, 't'},
                                        {"help", no_argument, 0, 'h'},
                                        {0, 0, 0, 0}};
  *o = (run_opts_t){.grace = 2000, .pid_ns = GG_SPAWN_PID_NS_AUTO};
  /* auto by default: a SIGKILLed runner then takes its whole job with it (docs/cli.md says what was
   * measured before choosing it). The default comes from GPUGUARD_PID_NS when it is set (empty
   * counts as unset); --pid-ns beats it. A bad value is refused even then: a typo in a site-wide
   * setting should not go unnoticed. */
  const char *env_ns = getenv("GPUGUARD_PID_NS");
  if (env_ns && *env_ns) o->pid_ns = parse_pid_ns(env_ns);
  if (o->pid_ns < 0) {
    char why[160];
    snprintf(why, sizeof why, "GPUGUARD_PID_NS='%.80s': auto, on or off expected", env_ns);
    return bad_usage("%s", why);
  }
  int opt;
  while ((opt = next_opt(argc, argv, longs)) != -1) {
    if (opt == 'h') {
      usage(stdout, current);
      return 0;
    }
    if (opt == 'g') {
      if (!cli_grace(optarg, &o->grace)) return EXIT_USAGE;
    } else if (opt == 'd') {
      char *end;
      errno = 0;
      o->device = strtol(optarg, &end, 10);
      if (errno || end == optarg || *end || o->device < 0 || o->device > 1024)
        return bad_usage("--device '%s': a device ordinal expected", optarg);
    } else if (opt == 'p') {
      o->pid_ns = parse_pid_ns(optarg ? optarg : "auto");
      if (o->pid_ns < 0) return bad_usage("--pid-ns=%s: auto, on or off expected", optarg);
    } else if (opt == 't') {
      /* The job's Python processes make gpuguard PyTorch's allocator (the wheel's startup hook). */
      setenv("GPUGUARD_TORCH", "1", 1);
    } else if (opt == 'r') {
      if (!*optarg) return bad_usage("%s", "--receipt needs a path (or - for stdout)");
      o->receipt_path = optarg;
    } else {
      return cli_opt_error(opt, argv);
    }
  }
  if (optind >= argc)
    return bad_usage("%s", "no command given (gpuguard run [OPTIONS] -- CMD ARGS...)");
  o->cmd = argv + optind;
  int ndev = 0;
  if (gg_device_count(&ndev) == 0 && o->device >= ndev) {
    char why[160];
    snprintf(why, sizeof why, "--device %ld: no such device (this machine has %d, numbered from 0)",
             o->device, ndev);
    return bad_usage("%s", why);
  }
  return open_receipt(o);
}

/* Phase 2: every signal whose default action would end the runner (and leave the job running) is
 * blocked and read with sigwaitinfo, so nothing runs in a signal handler and each such signal ends
 * in the job's teardown. The list is the library's (gg_proc_job_signals), the one a namespace's
 * keeper passes on too; SIGCHLD says CMD is done. As tini does, the runner starts from known
 * dispositions whatever its launcher left: SIGCHLD back to the default (ignored, the kernel reaps
 * CMD itself and the runner never sees it end). A signal ignored at start (nohup) stays ignored, is
 * not taken, and CMD inherits it ignored, as exec would have it. */
static void run_take_signals(sigset_t *set) {
  signal(SIGCHLD, SIG_DFL);
  int sigs[128];
  size_t n = gg_proc_job_signals(sigs, sizeof sigs / sizeof sigs[0]);
  sigemptyset(set);
  for (size_t i = 0; i < n && i < sizeof sigs / sizeof sigs[0]; i++) {
    struct sigaction cur;
    if (sigaction(sigs[i], NULL, &cur) == 0 && cur.sa_handler == SIG_IGN) continue;
    sigaddset(set, sigs[i]);
  }
  sigaddset(set, SIGCHLD);
  sigprocmask(SIG_BLOCK, set, NULL);
}

/* The canary: a child of the runner, in the job's process group and control group, that takes the
 * runner's signals and reports each (signal, code, sender) on a pipe. A signal sent to the whole
 * group (kill -- -PGID, a shell's SIGHUP to its jobs) or to every process of the control group
 * (systemd's stop, Slurm's) reaches it too, and the job with it; one sent to the runner alone does
 * not. That is how the runner tells whether CMD has a signal from its sender already (passed on,
 * CMD would get it twice). It dies with the runner. */
typedef struct canary_note {
  int sig, code, pid;
} canary_note_t;

typedef struct canary {
  pid_t pid; /* -1: none (fork refused): every signal is taken as sent to the runner alone */
  int fd;    /* the notes, read end, non-blocking */
  canary_note_t seen[32];
  double at[32];
  int n;
} canary_t;

static void canary_start(canary_t *c, const sigset_t *set) {
  int p[2];
  c->pid = -1;
  c->fd = -1;
  c->n = 0;
  if (pipe2(p, O_CLOEXEC) != 0) return;
  pid_t parent = getpid();
  pid_t kid = fork();
  if (kid == 0) { /* only async-signal-safe calls: the runner may have threads (a driver's) */
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, NULL); /* what it does not take stays pending, harmless */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(0);
    close(p[0]);
    /* a note the runner has no room for is dropped, never waited on */
    fcntl(p[1], F_SETFL, O_NONBLOCK);
    sigset_t take = *set;
    sigdelset(&take, SIGCHLD);
    for (;;) {
      siginfo_t si;
      int sig = sigwaitinfo(&take, &si);
      if (sig < 0) continue;
      canary_note_t note = {sig, si.si_code, (int)si.si_pid};
      if (write(p[1], &note, sizeof note) < 0 && errno == EPIPE) _exit(0);
    }
  }
  close(p[1]);
  if (kid < 0) {
    close(p[0]);
    return;
  }
  fcntl(p[0], F_SETFL, O_NONBLOCK);
  c->pid = kid;
  c->fd = p[0];
}

/* Reads the notes that came, forgetting those older than two seconds. */
static void canary_pump(canary_t *c) {
  double now = gg__now_ms();
  int k = 0;
  for (int i = 0; i < c->n; i++)
    if (now - c->at[i] < 2000) {
      c->seen[k] = c->seen[i];
      c->at[k++] = c->at[i];
    }
  c->n = k;
  canary_note_t note;
  while (c->fd >= 0 && read(c->fd, &note, sizeof note) == (ssize_t)sizeof note) {
    if (c->n == (int)(sizeof c->seen / sizeof c->seen[0])) {
      memmove(c->seen, c->seen + 1, sizeof c->seen - sizeof c->seen[0]);
      memmove(c->at, c->at + 1, sizeof c->at - sizeof c->at[0]);
      c->n--;
    }
    c->seen[c->n] = note;
    c->at[c->n++] = now;
  }
}

/* Whether the canary got the same signal from the same sender: then it was sent to the group (or
 * the control group), CMD has it already. A control group's processes are signalled one after
 * another, so the canary's may come a little after ours: up to 50 ms (what passing a signal on may
 * be delayed). */
static bool canary_saw(canary_t *c, const siginfo_t *si) {
  if (c->pid < 0) return false;
  double until = gg__now_ms() + 50;
  for (;;) {
    canary_pump(c);
    for (int i = 0; i < c->n; i++)
      if (c->seen[i].sig == si->si_signo && c->seen[i].code == si->si_code &&
          c->seen[i].pid == (int)si->si_pid) {
        c->seen[i] = c->seen[--c->n];
        c->at[i] = c->at[c->n];
        return true;
      }
    double left = until - gg__now_ms();
    if (left <= 0) return false;
    struct pollfd pf = {.fd = c->fd, .events = POLLIN};
    poll(&pf, 1, (int)left + 1);
  }
}

/* The wait loop reaps every child, the canary too when something killed it: its pid is forgotten
 * then, since it may name another user's process by the time the job ends. Its notes are still
 * read (the pipe stays open until canary_stop). */
static void canary_reaped(canary_t *c, pid_t pid) {
  if (c->pid > 0 && pid == c->pid) c->pid = -1;
}

static void canary_stop(canary_t *c) {
  if (c->pid > 0) {
    kill(c->pid, SIGKILL); /* not reaped yet, so the pid is still the canary's */
    while (waitpid(c->pid, NULL, 0) < 0 && errno == EINTR) {
    }
  }
  if (c->fd >= 0) close(c->fd);
  c->pid = -1;
  c->fd = -1;
}

/* Phase 3: subreaper, session record, device figures, then CMD. Returns -1 on success, else the
 * exit status (127: CMD not found, 126: found but not runnable). */
static int run_start(run_opts_t *o, run_env_t *env, job_result_t *r) {
  if (gg_proc_set_subreaper(1) != 0)
    fprintf(stderr, "gpuguard run: warning: %s (double-forked descendants may escape)\n",
            gg_last_error());
  char devs[16];
  snprintf(devs, sizeof devs, "%ld", o->device);
  if (gg_registry_register(devs) != 0)
    fprintf(stderr, "gpuguard run: warning: no session record: %s\n", gg_last_error());
  gg_registry_session(env->session, sizeof env->session);
  env->have_dev = gg_device_info((int)o->device, &env->dev) == 0;
  gg_spawn_options_t so;
  gg_spawn_options_init(&so);
  so.pid_ns_grace_ms = (int)o->grace; /* the rest of the namespace gets --grace too */
  /* nohup's SIGHUP (and any signal ignored at start) stays so */
  so.keep_ignored = 1;
  o->in_ns = o->pid_ns != GG_SPAWN_PID_NS_OFF;
  /* one line when refused, then the design without */
  bool fallback = o->pid_ns == GG_SPAWN_PID_NS_AUTO;
  char why[512] = "";
  if (fallback && gg_proc_pid_ns_probe() <= 0) {
    o->in_ns = false;
    snprintf(why, sizeof why, "%s", gg_last_error());
  }
  /* After a good probe the spawn asks for ON, not AUTO: a refusal between the two (a sysctl
   * changed) then falls back below, saying so, instead of a job that runs without one while the
   * receipt says it has one. */
  so.pid_ns = o->in_ns ? GG_SPAWN_PID_NS_ON : GG_SPAWN_PID_NS_OFF;
  int rc = gg_proc_spawn(NULL, (const char *const *)o->cmd, &so, &r->pid);
  if (rc != 0 && o->in_ns && fallback && strstr(gg_last_error(), "PID namespace")) {
    o->in_ns = false;
    snprintf(why, sizeof why, "%s", gg_last_error());
  }
  if (fallback && !o->in_ns) {
    fprintf(
        stderr,
        "gpuguard run: the job runs without a PID namespace, so if this runner is SIGKILLed what "
        "is "
        "left of it waits for `gpuguard reap` (--pid-ns=off or GPUGUARD_PID_NS=off: no check, no "
        "line). Why: %s\n",
        why);
    if (rc != 0) {
      so.pid_ns = GG_SPAWN_PID_NS_OFF;
      rc = gg_proc_spawn(NULL, (const char *const *)o->cmd, &so, &r->pid);
    }
  }
  if (rc == 0) return -1;
  snprintf(r->start_error, sizeof r->start_error, "%s", gg_last_error());
  fprintf(stderr, "gpuguard run: %s\n", r->start_error);
  gg_registry_unregister();
  return rc == GG_ENOTFOUND ? 127 : 126;
}

/* The signals that ask the runner itself to end, on which the job gets its grace period and then
 * the teardown. Any other (SIGUSR1, SIGALRM, a real-time signal, ...) is a message for the job:
 * passed on, and if the job lives on, so does the runner. */
static bool asks_to_end(int sig) {
  return sig == SIGTERM || sig == SIGINT || sig == SIGHUP || sig == SIGQUIT;
}

/* Phase 4: wait for CMD. Where a signal came from decides what the runner does with it:
 *  - from the terminal (the kernel sent it to the foreground group: Ctrl-C, Ctrl-\, a hangup) with
 *    CMD in our group: CMD has it already; it is the job's business alone: not passed on, no
 *    deadline (an interactive program that survives Ctrl-C goes on). As session leader a hangup is
 *    ours alone.
 *  - sent to the whole group or control group (the canary got it too): CMD has it already, not
 *    passed on;
 *  - sent to the runner alone: passed on to CMD.
 * Only a signal that asks the runner to end (asks_to_end) starts the grace deadline, after which
 * what is left gets SIGKILL; a second such signal ends the wait at once. Returns the deadline, or
 * -1. */
static double run_wait(const sigset_t *set, long grace, job_result_t *r, canary_t *canary) {
  double deadline = -1;
  while (!r->reaped) {
    siginfo_t si;
    /* At most 100 ms per wait: a thread that had SIGCHLD unblocked before phase 2 (one the CUDA
     * driver started while the device figures were read) takes the signal and drops it, and a CMD
     * whose end went unnoticed left the runner waiting forever (seen on an H200 host). A timed-out
     * wait looks. */
    double left = deadline < 0 ? 100 : deadline - gg__now_ms();
    if (left <= 0) break;
    if (left > 100) left = 100;
    struct timespec ts = {(time_t)(left / 1e3), (long)(fmod(left, 1e3) * 1e6)};
    int sig = sigtimedwait(set, &si, &ts);
    canary_pump(canary);
    if (sig < 0 && errno == EAGAIN) sig = SIGCHLD; /* look anyway */
    if (sig < 0) continue;                         /* EINTR */
    if (sig == SIGCHLD) {
      int st;
      pid_t p;
      /* as subreaper, orphaned descendants come here too */
      while ((p = waitpid(-1, &st, WNOHANG)) > 0) {
        canary_reaped(canary, p);
        if (p == r->pid) {
          r->status = st;
          r->reaped = true;
        }
      }
      continue;
    }
    bool in_group = getpgid(r->pid) == getpgrp();
    bool leader_hup = sig == SIGHUP && getsid(0) == getpid();
    /* the terminal's, CMD has it */
    if (si.si_code == SI_KERNEL && in_group && !leader_hup) continue;
    bool has_it = si.si_code != SI_KERNEL && in_group && canary_saw(canary, &si);
    if (!has_it) kill(r->pid, sig);
    if (!r->runner_sig) r->runner_sig = sig;
    if (!asks_to_end(sig)) continue;
    if (deadline >= 0) { /* a second one: tear down now */
      fprintf(stderr, "gpuguard run: %s again: ending the job now\n", strsignal(sig));
      return deadline;
    }
    r->runner_sig = sig;
    deadline = gg__now_ms() + (double)grace;
    fprintf(stderr, "gpuguard run: got %s%s; the job has %ld ms to end (grace period)\n",
            strsignal(sig), has_it ? " (the job got it too)" : "", grace);
  }
  if (!r->reaped && deadline >= 0)
    fprintf(stderr, "gpuguard run: grace period over; what is left of the job gets SIGKILL\n");
  return deadline;
}

/* Phase 5: end what is left of the job. After a signal the job has had its grace period already:
 * when CMD ended in it, the rest get what is left of it; when the grace ran out (or a second signal
 * came), SIGKILL at once, as stderr said: a second SIGTERM would run CMD's handler again (twice,
 * three times through the keeper and the init of a PID namespace). A descendant forked by a dying
 * process after the teardown's last look is reparented to us (the subreaper): look again until
 * nothing is left, a few times at most. */
static int run_teardown(long grace, double deadline, bool cmd_ended, gg_proc_receipt_t **receipt) {
  long left = grace;
  if (deadline >= 0) {
    left = (long)(deadline - gg__now_ms());
    left = left < 100 ? 100 : left > grace ? grace : left;
  }
  if (deadline >= 0 && !cmd_ended) left = 0;
  int trc = gg_proc_teardown_ex(NULL, (int)left, receipt);
  size_t termed = 0, killed = 0;
  for (size_t i = 0; *receipt && i < (*receipt)->count; i++) {
    termed += ((*receipt)->procs[i].sent & GG_PROC_SENT_TERM) != 0;
    killed += ((*receipt)->procs[i].sent & GG_PROC_SENT_KILL) != 0;
  }
  if (termed && deadline < 0) /* after a signal, the grace period was announced already */
    fprintf(stderr,
            "gpuguard run: %zu process%s of the job left running got SIGTERM and a grace period of "
            "%ld ms\n",
            termed, termed == 1 ? "" : "es", left);
  if (killed)
    fprintf(stderr,
            "gpuguard run: SIGKILL sent to %zu process%s still running after the grace period\n",
            killed, killed == 1 ? "" : "es");
  for (size_t i = 0; *receipt && i < (*receipt)->count; i++)
    if ((*receipt)->procs[i].end == GG_PROC_SKIPPED && (*receipt)->procs[i].sent == 0)
      fprintf(stderr,
              "gpuguard run: skipped %d (%s): not signalled, another user's or not the job's\n",
              (int)(*receipt)->procs[i].pid, (*receipt)->procs[i].command);
  for (int round = 0; round < 3; round++) {
    gg_proc_receipt_t *more = NULL;
    gg_proc_teardown_ex(NULL, 0, &more);
    size_t found = more ? more->count : 0;
    if (found)
      fprintf(stderr, "gpuguard run: %zu late descendant%s ended\n", found, found == 1 ? "" : "s");
    gg_proc_receipt_free(more);
    if (!found) break;
  }
  return trc;
}

/* Phase 6: CMD's own status whenever it is known, even after a forwarded signal (a job that catches
 * SIGTERM and exits 0 exits 0); else how the teardown ended it, as the receipt says. */
static void run_conclude(job_result_t *r, const gg_proc_receipt_t *receipt) {
  if (!r->reaped && waitpid(r->pid, &r->status, WNOHANG) == r->pid) r->reaped = true;
  const gg_proc_outcome_t *mine = NULL;
  for (size_t i = 0; receipt && !r->reaped && i < receipt->count; i++)
    if (receipt->procs[i].pid == r->pid) mine = &receipt->procs[i];
  if (r->reaped)
    r->exit_code = WIFEXITED(r->status) ? WEXITSTATUS(r->status) : 128 + WTERMSIG(r->status);
  else if (mine && mine->end == GG_PROC_EXITED) {
    r->exit_code = mine->code;
    r->status = mine->code << 8;
    r->reaped = true;
  } else if (mine && mine->end == GG_PROC_SIGNALED) {
    r->exit_code = 128 + mine->code;
    r->status = mine->code;
    r->reaped = true;
  } else
    r->exit_code = 128 + (r->runner_sig ? r->runner_sig : SIGKILL);
}

/* Phase 7: one summary line on stderr. */
static void run_summary(const run_opts_t *o, const job_result_t *r,
                        const gg_proc_receipt_t *receipt, const run_env_t *env) {
  char a[32], b[32];
  size_t ended = receipt ? receipt->count - receipt->n_alive : 0;
  fprintf(stderr, "gpuguard run: %s %s %d%s; teardown: %zu process%s ended, %zu left", o->cmd[0],
          WIFEXITED(r->status) ? "exited" : "ended by signal",
          WIFEXITED(r->status) ? WEXITSTATUS(r->status) : WTERMSIG(r->status),
          r->runner_sig ? " (after the runner got a signal)" : "", ended, ended == 1 ? "" : "es",
          receipt ? receipt->n_alive : 0);
  if (env->have_dev)
    fprintf(stderr, "; device %ld free %s -> %s", o->device,
            human((double)env->dev.free_bytes, a, sizeof a),
            human((double)env->free_after, b, sizeof b));
  fputc('\n', stderr);
}

int cmd_run(int argc, char **argv) {
  run_opts_t o;
  int rc = run_parse(argc, argv, &o);
  if (rc >= 0) return rc;
  sigset_t set;
  run_take_signals(&set);
  canary_t canary;
  canary_start(&canary, &set);
  run_env_t env = {0};
  job_result_t r = {0};
  rc = run_start(&o, &env, &r);
  if (rc >= 0) {
    canary_stop(&canary);
    /* The old receipt went when the options were checked: one that says why is put in its place. */
    r.exit_code = rc;
    o.in_ns = false;
    env.have_dev = false; /* no job, no figures after it */
    if (o.receipt_path) write_receipt(&o, &r, NULL, &env);
    return rc;
  }
  double deadline = run_wait(&set, o.grace, &r, &canary);
  canary_stop(&canary); /* before the teardown, which would count it as the job's */
  gg_proc_receipt_t *receipt = NULL;
  int trc = run_teardown(o.grace, deadline, r.reaped, &receipt);
  run_conclude(&r, receipt);
  fix_job_entry(receipt, &o, &r);
  if (env.have_dev &&
      !free_after((int)o.device, env.dev.free_bytes, 3000, &env.free_after, &env.waited_ms))
    env.have_dev = false;
  /* Before our own record goes: it names the job's PID namespace, which proves that namespace's
   * records stale now that the job is over (and those of runners SIGKILLed go too). */
  gg_registry_prune(NULL);
  gg_registry_unregister();
  run_summary(&o, &r, receipt, &env);
  if (trc != 0) fprintf(stderr, "gpuguard run: teardown: %s\n", gg_last_error());
  if (o.receipt_path) write_receipt(&o, &r, receipt, &env);
  gg_proc_receipt_free(receipt);
  return r.exit_code;
}
