/* classify.c — for a process no gpuguard session owns: a stranded worker (started as a worker by a
 * parent that is gone) or a detached program (its parent went away on purpose), with the evidence
 * in words. Only evidence moves a process out of "unknown"; a claim a process can make about itself
 * for free (its command line) counts only when the program is what the claim says (a Python
 * interpreter). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/internal.h"
#include "proc/procfs_internal.h"
#include "query/classify_internal.h"

/* Writes the evidence into a fixed-size field, cut to fit: the cut is intended, so it goes through
 * vsnprintf (an snprintf whose result is unused warns under -Wformat-truncation at -O0). */
static void GG__PRINTF(3, 4) gg__why_set(char *why, size_t cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, cap, fmt, ap);
  va_end(ap);
}

static void GG__PRINTF(3, 4) gg__why_add(char *why, size_t cap, const char *fmt, ...) {
  size_t len = strlen(why);
  if (len + 3 >= cap) return;
  if (len) {
    memcpy(why + len, "; ", 3);
    len += 2;
  }
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why + len, cap - len, fmt, ap);
  va_end(ap);
}

/* Whether PID runs a Python interpreter (python3.12, python, pypy3, ...). */
static bool gg__is_python(pid_t pid) {
  char exe[512];
  if (gg__proc_exe(pid, exe, sizeof exe) != 0) return false;
  const char *base = strrchr(exe, '/');
  base = base ? base + 1 : exe;
  return strncmp(base, "python", 6) == 0 || strncmp(base, "pypy", 4) == 0;
}

/* The arguments of a raw command line: pointers into buf, up to cap of them. */
static int gg__split_argv(char *buf, ssize_t len, const char **args, int cap) {
  int n = 0;
  for (ssize_t at = 0; at < len && n < cap; at += (ssize_t)strlen(buf + at) + 1)
    args[n++] = buf + at;
  return n;
}

static bool gg__ends_with(const char *s, const char *tail) {
  size_t a = strlen(s), b = strlen(tail);
  return a >= b && strcmp(s + a - b, tail) == 0;
}

/* What a Python command line says the process is, from the exact forms the libraries start workers
 * with (not a word anywhere on the line: `grep multiprocessing.spawn` is no worker); NULL for
 * none. */
static const char *gg__worker_argv(const char **args, int n) {
  if (n > 0 && strncmp(args[0], "ray::", 5) == 0) return "a Ray worker (its title ray::...)";
  for (int i = 1; i < n; i++) {
    const char *next = i + 1 < n ? args[i + 1] : "";
    if (strcmp(args[i], "-c") == 0 &&
        strncmp(next, "from multiprocessing.spawn import spawn_main", 44) == 0 &&
        strcmp(args[n - 1], "--multiprocessing-fork") == 0)
      return "a multiprocessing spawn child (spawn_main --multiprocessing-fork)";
    if (strcmp(args[i], "-c") == 0 &&
        strncmp(next, "from multiprocessing.forkserver import main", 43) == 0)
      return "a multiprocessing forkserver, or a worker it forked";
    if (strcmp(args[i], "-m") == 0 && gg__ends_with(next, "loky.backend.popen_loky_posix"))
      return "a joblib/loky worker (-m ...popen_loky_posix)";
    if (gg__ends_with(args[i], "/ray/_private/workers/default_worker.py")) return "a Ray worker";
  }
  return NULL;
}

typedef struct gg__sib {
  pid_t self, ppid, pgrp, sid;
  uid_t uid;
  const char *argv;
  ssize_t len;
  int found;
} gg__sib_t;

/* Another process forked the same way: same user, group, session, new parent and command line. */
static int gg__sib_visit(const gg__pinfo_t *info, void *user) {
  gg__sib_t *s = user;
  if (info->pid == s->self || info->ppid != s->ppid || info->pgrp != s->pgrp ||
      info->sid != s->sid || info->pid == info->pgrp)
    return 0;
  uid_t uid;
  char argv[4096];
  if (gg__proc_uid(info->pid, &uid) != 0 || uid != s->uid) return 0;
  ssize_t len = gg__proc_argv(info->pid, argv, sizeof argv);
  if (len == s->len && memcmp(argv, s->argv, (size_t)len) == 0) s->found++;
  return 0;
}

/* Worker evidence: 0 none, 1 a worker, 2 a worker only a Python launcher starts (torchrun's agent).
 * From the command line of a Python worker, DataLoader's thread name, a launcher's
 * environment, or fork siblings (several Python processes of one group with one command line, all
 * left to the same reaper: a multiprocessing pool forked by a parent that is gone). The last two
 * are *inherited: any program started from a rank's shell has the environment, and two copies of
 * one program started by one script are siblings. */
static int gg__worker_evidence(const gg_process_t *row, const gg__pinfo_t *st, bool parent_gone,
                               char *why, size_t cap, bool *inherited) {
  *inherited = true; /* set false below by the evidence a program cannot inherit */
  char argv[4096], comm[64], val[64];
  ssize_t len = gg__proc_argv(row->pid, argv, sizeof argv);
  const char *args[64];
  int n = len > 0 ? gg__split_argv(argv, len, args, 64) : 0;
  bool python = gg__is_python(row->pid);
  const char *kind = gg__worker_argv(args, n);
  if (kind && python) {
    gg__why_add(why, cap, "%s", kind);
    *inherited = false;
    return 1;
  }
  if (gg__proc_comm(row->pid, comm, sizeof comm) == 0 &&
      (strcmp(comm, "pt_data_worker") == 0 || strncmp(comm, "ray::", 5) == 0)) {
    if (python) {
      gg__why_add(why, cap, "%s (thread name %s)",
                  comm[0] == 'p' ? "a PyTorch DataLoader worker" : "a Ray worker", comm);
      *inherited = false;
      return 1;
    }
    gg__why_add(why, cap, "thread name %s, but the program is not Python: not believed", comm);
  }
  if (kind && !python)
    gg__why_add(why, cap, "its command line claims a Python worker, but the program is not Python");
  if (gg__proc_environ_get(row->pid, "TORCHELASTIC_RUN_ID", val, sizeof val) == 0) {
    char rank[16] = "?";
    gg__proc_environ_get(row->pid, "LOCAL_RANK", rank, sizeof rank);
    gg__why_add(why, cap, "a torch.distributed rank (TORCHELASTIC_RUN_ID, LOCAL_RANK=%s)", rank);
    return 2;
  }
  if (gg__proc_environ_get(row->pid, "LOCAL_RANK", val, sizeof val) == 0 &&
      gg__proc_environ_get(row->pid, "WORLD_SIZE", val + 32, 32) == 0) {
    gg__why_add(why, cap, "a distributed rank started by a launcher (LOCAL_RANK, WORLD_SIZE)");
    return 1; /* mpirun's ranks too: their launcher need not be Python */
  }
  if (parent_gone && python && n > 0 && st->pid != st->pgrp && st->pid != st->sid) {
    gg__sib_t s = {row->pid, st->ppid, st->pgrp, st->sid, (uid_t)row->uid, argv, len, 0};
    if (gg__proc_walk(gg__sib_visit, &s) == 0 && s.found > 0) {
      gg__why_add(why, cap,
                  "forked: %d other process%s of its group with its command line, left to the same "
                  "reaper",
                  s.found, s.found == 1 ? "" : "es");
      return 1;
    }
  }
  return 0;
}

/* Reapers a process is handed to when its parent dies, as PID 1: init systems and container
 * inits. */
static bool gg__is_init(const char *comm) {
  static const char *const inits[] = {"systemd",   "init",      "tini",  "dumb-init", "docker-init",
                                      "catatonit", "s6-svscan", "runit", "runsvdir",  "launchd"};
  for (size_t i = 0; i < sizeof inits / sizeof inits[0]; i++)
    if (strcmp(comm, inits[i]) == 0) return true;
  return false;
}

bool gg__parent_gone(const gg_process_t *row, const gg__pinfo_t *st, char *why, size_t cap) {
  gg__pinfo_t parent;
  char comm[64] = "?";
  if (st->ppid <= 0) {
    gg__why_add(why, cap, "no parent in this PID namespace");
    return true;
  }
  if (gg__proc_read_stat(st->ppid, &parent) != 0) {
    gg__why_add(why, cap, "its parent %d is gone", (int)st->ppid);
    return true;
  }
  gg__proc_comm(st->ppid, comm, sizeof comm);
  if (parent.state == 'Z' || parent.state == 'X') {
    gg__why_add(why, cap, "its parent %d has exited", (int)st->ppid);
    return true;
  }
  if (parent.start > row->start_time) {
    gg__why_add(why, cap, "its parent %d started after it (the pid was reused)", (int)st->ppid);
    return true;
  }
  /* PID 1 is a reaper (an init system, a container's init), unless it started this process itself:
   * it runs in PID 1's session, or PID 1 is a Python launcher (torchrun as a container's PID 1) and
   * the process leads its own session as launchers start ranks. */
  if (st->ppid == 1 &&
      (gg__is_init(comm) || (parent.sid != st->sid && (!gg__is_python(1) || st->sid != st->pid)))) {
    gg__why_add(why, cap, "its parent is gone (reparented to PID 1, %s)", comm);
    return true;
  }
  /* A child stays in its parent's session unless it calls setsid(), which makes it the leader: in
   * another session without leading one, it was handed to this parent (a subreaper) by a dead
   * one. */
  if (parent.sid != st->sid && st->sid != st->pid) {
    gg__why_add(why, cap,
                "its parent is gone (reparented to %d, %s, a subreaper in another session)",
                (int)st->ppid, comm);
    return true;
  }
  return false;
}

/* Signs, for a process whose parent still runs, that it is meant to outlive it: nohup, or tmux or
 * screen among its ancestors. */
static bool gg__kept_on_purpose(pid_t pid, pid_t ppid, char *why, size_t cap);

/* tmux or screen among the ancestors: a terminal session kept on purpose. */
static bool gg__under_multiplexer(pid_t pid, char *why, size_t cap) {
  gg__pinfo_t info;
  for (int depth = 0; depth < 64 && pid > 1 && gg__proc_read_stat(pid, &info) == 0; depth++) {
    char comm[64];
    if (gg__proc_comm(pid, comm, sizeof comm) == 0 &&
        (strncmp(comm, "tmux", 4) == 0 || strcmp(comm, "screen") == 0 ||
         strcmp(comm, "SCREEN") == 0)) {
      gg__why_add(why, cap, "in a %s session (%d)", comm[0] == 't' ? "tmux" : "screen", (int)pid);
      return true;
    }
    pid = info.ppid;
  }
  return false;
}

/* Signs that a process was left running on purpose, for one whose parent is gone: a mask of
 * GG__DET_*, 0 for none. */
enum {
  GG__DET_NS_INIT = 1,  /* PID 1 of its own PID namespace */
  GG__DET_NOHUP = 2,    /* ignores SIGHUP */
  GG__DET_SESSION = 4,  /* leads its own session */
  GG__DET_SERVICE = 8,  /* a systemd service's */
  GG__DET_TERMINAL = 16 /* under tmux or screen */
};

static unsigned gg__detached_evidence(const gg_process_t *row, const gg__pinfo_t *st, char *why,
                                      size_t cap) {
  unsigned any = 0;
  pid_t outer, inner;
  int levels = 0;
  if (gg__proc_nspid(row->pid, &outer, &inner, &levels) == 0 && levels > 1 && inner == 1) {
    gg__why_add(why, cap, "PID 1 of its own PID namespace (a container's init)");
    any |= GG__DET_NS_INIT;
  }
  unsigned long long ign = 0;
  if (gg__proc_sigign(row->pid, &ign) == 0 && (ign & 1ULL)) /* bit 0: SIGHUP */
  {
    gg__why_add(why, cap, "ignores SIGHUP (nohup)");
    any |= GG__DET_NOHUP;
  }
  if (st->sid == st->pid) {
    gg__why_add(why, cap, "leads its own session (setsid, a daemon)");
    any |= GG__DET_SESSION;
  }
  char cg[256];
  if (gg__proc_cgroup(row->pid, cg, sizeof cg) == 0) {
    const char *leaf = strrchr(cg, '/');
    leaf = leaf ? leaf + 1 : cg;
    if (gg__ends_with(leaf, ".service") && strncmp(leaf, "user@", 5) != 0) {
      gg__why_add(why, cap, "a systemd service (%s)", leaf);
      any |= GG__DET_SERVICE;
    }
  }
  if (gg__under_multiplexer(st->ppid, why, cap)) any |= GG__DET_TERMINAL;
  return any;
}

static bool gg__kept_on_purpose(pid_t pid, pid_t ppid, char *why, size_t cap) {
  unsigned long long ign = 0;
  bool any = gg__proc_sigign(pid, &ign) == 0 && (ign & 1ULL);
  if (any) gg__why_add(why, cap, "ignores SIGHUP (nohup)");
  return gg__under_multiplexer(ppid, why, cap) || any;
}

/* Whether PID's command line names torch's launcher: torchrun, or python -m torch.distributed.run
 * (or .launch). */
static bool gg__is_torchrun(pid_t pid) {
  char argv[4096];
  ssize_t len = gg__proc_argv(pid, argv, sizeof argv);
  const char *args[16];
  int n = len > 0 ? gg__split_argv(argv, len, args, 16) : 0;
  for (int i = 1; i < n; i++) {
    const char *base = strrchr(args[i], '/');
    base = base ? base + 1 : args[i];
    if (strcmp(base, "torchrun") == 0) return true;
    if (strcmp(args[i - 1], "-m") == 0 && (strcmp(args[i], "torch.distributed.run") == 0 ||
                                           strcmp(args[i], "torch.distributed.launch") == 0))
      return true;
  }
  return false;
}

/* For a torchrun rank whose parent lives: whether its elastic agent does. The agent is Python, and
 * either named torchrun on its command line or not itself a process of the rank's run (a rank's own
 * subprocess carries the run's TORCHELASTIC_RUN_ID). Between rank and agent there may be wrappers
 * (a bash script, `torchrun --no-python`, the rank that started a subprocess), all of one session:
 * the agent starts each rank in a new session, so the first session boundary up the ancestry must
 * be the agent. A boundary crossed onto anything else, a parent that started after its child (a
 * reused pid), or PID 1 passed: the agent is gone, and the wrapper was handed to a subreaper. */
static bool gg__agent_alive(pid_t pid, const gg__pinfo_t *st, char *why, size_t cap) {
  char run[128] = "";
  gg__proc_environ_get(pid, "TORCHELASTIC_RUN_ID", run, sizeof run);
  gg__pinfo_t child = *st;
  for (int depth = 0; depth < 32 && child.ppid > 0; depth++) {
    pid_t p = child.ppid;
    gg__pinfo_t info;
    if (gg__proc_read_stat(p, &info) != 0 || info.state == 'Z' || info.start > child.start) break;
    char theirs[128] = "";
    bool same_run = gg__proc_environ_get(p, "TORCHELASTIC_RUN_ID", theirs, sizeof theirs) == 0 &&
                    strcmp(theirs, run) == 0;
    if (gg__is_python(p) && (gg__is_torchrun(p) || !same_run)) return true;
    char comm[64] = "?";
    gg__proc_comm(p, comm, sizeof comm);
    if (info.sid != child.sid || p == 1) {
      gg__why_set(why, cap,
                  "its launcher is gone (its ancestry reaches %d, %s, not a torchrun agent)",
                  (int)p, comm);
      return false;
    }
    child = info;
  }
  gg__why_set(why, cap, "its launcher is gone (no torchrun agent among its ancestors)");
  return false;
}

/* Explicit signs of being left running on purpose outweigh inherited signs of a worker (a rank's
 * environment, siblings): an `nohup` server started from a rank's shell, two copies of one program
 * started by one script, are detached, never reaped unless named. A session of its own is no such
 * sign for a torchrun rank (the agent starts every rank so). Signs a program cannot inherit (a
 * spawn child's command line) still make a worker stranded, under nohup too: a pool's children
 * inherit their trainer's ignored SIGHUP. */
static bool gg__detach_wins(int is_worker, bool inherited, unsigned det) {
  if (!inherited) return false;
  if (is_worker == 2) det &= ~(unsigned)GG__DET_SESSION;
  return det != 0;
}

gg_process_class_t gg__classify_unsessioned(gg_process_t *row) {
  gg__pinfo_t st;
  if (gg__proc_read_stat(row->pid, &st) != 0) return GG_PROCESS_UNKNOWN;
  if (st.state == 'Z' || st.state == 'X') {
    gg__strlcpy(row->why, "it has exited: a zombie its parent has not collected yet",
                sizeof row->why);
    return GG_PROCESS_UNKNOWN;
  }
  char parent[96] = "", worker[192] = "", detached[160] = "";
  bool gone = gg__parent_gone(row, &st, parent, sizeof parent);
  bool inherited = true;
  int is_worker = gg__worker_evidence(row, &st, gone, worker, sizeof worker, &inherited);
  /* torchrun's agent is Python: a rank whose parent lives is stranded only when no agent lives
   * above it (a wrapper between them, or the rank's own subprocess, is no launcher). */
  if (!gone && is_worker == 2 && !gg__agent_alive(row->pid, &st, parent, sizeof parent))
    gone = true;
  row->why[0] = '\0';
  unsigned det = gone ? gg__detached_evidence(row, &st, detached, sizeof detached)
                      : gg__kept_on_purpose(row->pid, st.ppid, detached, sizeof detached);
  if (gone && is_worker && !gg__detach_wins(is_worker, inherited, det)) {
    gg__why_set(row->why, sizeof row->why, "%s; %s", worker, parent);
    return GG_PROCESS_STRANDED;
  }
  /* With its parent alive nothing is stranded; a terminal multiplexer still says it was kept on
   * purpose. */
  if (det || gone) {
    gg__why_set(row->why, sizeof row->why, "%s%s%s%s%s%s", worker, worker[0] ? "; " : "", detached,
                det && gone ? "; " : "", parent,
                det ? "" : ", and no sign of a worker: left running on purpose");
    return GG_PROCESS_DETACHED;
  }
  gg__why_set(row->why, sizeof row->why, "its parent %d is alive%s%s", (int)st.ppid,
              worker[0] ? "; " : "", worker);
  return GG_PROCESS_UNKNOWN;
}
