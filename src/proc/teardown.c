/* teardown.c — ending a set of processes and their descendants, bounded (TERM, grace, KILL, reap),
 * and the receipt that says what happened to each, as structs and as JSON. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/clock_internal.h"
#include "core/json_internal.h"
#include "proc/proc_internal.h"
#include "proc/teardown_internal.h"
#include "core/vec_internal.h"

#ifndef P_PIDFD
#define P_PIDFD 3
#endif

/* After SIGKILL a process normally dies within milliseconds; one in uninterruptible sleep (D) dies
 * when its I/O completes, which may be never. Trap: an unbounded wait here hangs the supervisor. */
#define GG__KILL_WAIT_MS 250

/* Walks of /proc per discovery: one per level of a tree listed deepest first. The bound only stops
 * a tree that grows faster than it is walked (a fork bomb); phase 3 walks again after SIGTERM. */
#define GG__DISCOVER_ROUNDS 1024

typedef struct gg__target {
  gg__kid_t kid; /* pid, pidfd (owned), start, found; slot when it came from the set */
  pid_t ppid, pgrp;
  char state;   /* at discovery */
  bool exited;  /* pidfd readable, or gone/zombie in /proc */
  bool skipped; /* identity did not match: never signalled */
  bool foreign; /* skipped as another user's process, still running when found */
  gg_proc_outcome_t out;
} gg__target_t;

typedef struct gg__td {
  gg__target_t *t;
  size_t n, cap;
  const pid_t *others; /* tracked by other sets: not ours to end */
  size_t n_others;
  pid_t me;
  bool subreaper;
  int err;
} gg__td_t;

static gg__target_t *gg__find(gg__td_t *td, pid_t pid) {
  for (size_t i = 0; i < td->n; i++)
    if (td->t[i].kid.pid == pid) return &td->t[i];
  return NULL;
}

static gg__target_t *gg__add(gg__td_t *td) {
  gg__target_t *t = gg__vec_reserve(td->t, &td->cap, td->n + 1, sizeof *t);
  if (!t) return NULL;
  td->t = t;
  t = &td->t[td->n++];
  memset(t, 0, sizeof *t);
  t->kid.pidfd = -1;
  t->kid.slot = -1;
  return t;
}

/* Is the target's pid still its own? With a pidfd the kernel answers; without, pid + start time. */
static bool gg__same(const gg__target_t *t) {
  if (t->kid.pidfd >= 0) return true;
  gg__pinfo_t info;
  return gg__proc_read_stat(t->kid.pid, &info) == 0 && info.start == t->kid.start;
}

static bool gg__mine(pid_t pid) {
  uid_t uid;
  return gg__proc_uid(pid, &uid) == 0 && uid == getuid();
}

/* A process the teardown found through the job's own tree (a tracked one, a descendant, one handed
 * to us as subreaper) is the job's whatever its uid: as root, one that dropped privileges (setpriv,
 * gosu, su-exec) is ended with the rest. Another user's member of a group is not: a group can be
 * joined without being the job's, so it only gets our members' signals (gg__signal_group). */
static bool gg__ours_to_end(pid_t pid) { return geteuid() == 0 || gg__mine(pid); }

/* Exited yet? Never blocks. A zombie counts: it holds no memory and SIGKILL cannot do more. */
static bool gg__poll_exited(gg__target_t *t) {
  if (t->exited || t->skipped) return true;
  if (t->kid.pidfd >= 0) {
    struct pollfd p = {.fd = t->kid.pidfd, .events = POLLIN};
    t->exited = poll(&p, 1, 0) > 0;
  } else {
    gg__pinfo_t info;
    t->exited = gg__proc_read_stat(t->kid.pid, &info) != 0 || info.start != t->kid.start ||
                info.state == 'Z' || info.state == 'X';
  }
  return t->exited;
}

/* kill(-pgrp) would reach every member, another user's too (root's teardown, or a setuid program in
 * the job's group). When a member is not ours, the group is not signalled as a whole: each
 * member of ours is, and the receipt says so (GG_PROC_SENT_GROUP_FOREIGN). */
static void gg__signal_group(pid_t pgrp, int sig, unsigned *sent) {
  if (gg__proc_signal_group(pgrp, sig) == 1) *sent |= GG_PROC_SENT_GROUP_FOREIGN;
}

static atomic_bool gg__mute;
void gg__proc_test_mute(bool on) { atomic_store(&gg__mute, on); }

static void gg__send(gg__td_t *td, gg__target_t *t, int sig, unsigned flag) {
  if (t->skipped || t->exited || atomic_load(&gg__mute)) return;
  pid_t pid = t->kid.pid;
  /* never pid 0, 1, -1 or ourselves, whatever a record says */
  if (pid <= 1 || pid == td->me) return;
  GG__ASSERT(t >= td->t && t < td->t + td->n); /* only targets of this round are signalled */
  int ok;
  if (t->kid.pidfd >= 0) {
    ok = gg__pidfd_signal(t->kid.pidfd, sig) == 0;
  } else {
    /* Without a pidfd there is a window between this check and kill(); it is as narrow as it can
     * be. */
    if (!gg__same(t)) {
      t->exited = true;
      return;
    }
    ok = kill(pid, sig) == 0;
  }
  if (!ok) return;
  t->out.sent |= flag;
  /* Trap: killpg alone misses setsid'd grandchildren (they are found by the /proc walk instead),
   * and a group id is only safe to signal while its leader's pid is still held, as it was just now,
   * by the process we know (start time: a reused pid leads somebody else's group). */
  gg__pinfo_t info;
  if (gg__proc_read_stat(pid, &info) == 0 && info.pgrp == pid && pid != getpgrp() &&
      (!t->kid.start || info.start == t->kid.start))
    gg__signal_group(pid, sig, &t->out.sent);
}

/* ---- discovery: descendants, group members and (as subreaper) orphans of the targets --------- */

typedef struct gg__walk {
  gg__td_t *td;
  bool added;
} gg__walk_t;

static const char *const gg__found_names[] = {"tracked", "descendant", "group", "reparented"};

static int gg__consider(const gg__pinfo_t *p, void *user) {
  gg__walk_t *w = user;
  gg__td_t *td = w->td;
  if (p->pid <= 1 || p->pid == td->me || gg__find(td, p->pid)) return 0;
  GG__ASSERT(td->n_others == 0 || td->others); /* other guards' children must stay out */
  int found = -1;
  const gg__target_t *parent = gg__find(td, p->ppid);
  if (parent && !parent->skipped)
    found = GG__FOUND_DESCENDANT;
  else if (p->pgrp != p->pid && p->pgrp != getpgrp() && gg__find(td, p->pgrp) &&
           !gg__find(td, p->pgrp)->skipped)
    found = GG__FOUND_GROUP;
  else if (td->subreaper && p->ppid == td->me)
    found = GG__FOUND_ORPHAN;
  if (found < 0) return 0;
  for (size_t i = 0; i < td->n_others; i++)
    if (td->others[i] == p->pid) return 0; /* another guard's child */
  if (p->state == 'Z' || p->state == 'X') return 0;
  /* Another user's descendant we cannot end is listed, skipped, and counted as left. */
  bool foreign = found == GG__FOUND_GROUP ? !gg__mine(p->pid) : !gg__ours_to_end(p->pid);
  if (foreign && found == GG__FOUND_GROUP) return 0;
  /* Open the pidfd first, then confirm the pid still names what we read: then the pidfd is
   * exact. */
  int fd = gg__pidfd_open(p->pid);
  gg__pinfo_t again;
  if (gg__proc_read_stat(p->pid, &again) != 0 || again.start != p->start) {
    if (fd >= 0) close(fd);
    return 0;
  }
  gg__target_t *t = gg__add(td);
  if (!t) {
    if (fd >= 0) close(fd);
    td->err = GG_ENOMEM;
    return 1;
  }
  t->kid.pid = p->pid;
  t->kid.pidfd = fd;
  t->kid.start = p->start;
  t->kid.found = found;
  t->ppid = p->ppid;
  t->pgrp = p->pgrp;
  t->state = p->state;
  t->skipped = foreign;
  t->foreign = foreign;
  w->added = true;
  return 0;
}

/* Walks /proc until nothing new turns up: a descendant's descendant may be listed before it (its
 * pid is smaller once the pid counter has wrapped), so a chain of N levels can take N walks (16
 * walks left the deeper levels of such a chain running). */
static int gg__discover(gg__td_t *td) {
  for (int round = 0; round < GG__DISCOVER_ROUNDS; round++) {
    gg__walk_t w = {td, false};
    int rc = gg__proc_walk(gg__consider, &w);
    if (td->err) return td->err;
    if (rc < 0) return rc;
    if (!w.added) break;
  }
  return 0;
}

/* Waits until every target has exited or the deadline passes. Polls the pidfds; targets without one
 * are looked at every 10 ms. */
static void gg__wait(gg__td_t *td, double deadline) {
  for (;;) {
    struct pollfd fds[64];
    nfds_t nf = 0;
    bool pending = false, unpollable = false;
    for (size_t i = 0; i < td->n; i++) {
      gg__target_t *t = &td->t[i];
      if (gg__poll_exited(t)) continue;
      pending = true;
      if (t->kid.pidfd < 0 || nf == 64)
        unpollable = true;
      else
        fds[nf++] = (struct pollfd){.fd = t->kid.pidfd, .events = POLLIN};
    }
    double left = deadline - gg__now_ms();
    if (!pending || left <= 0) return;
    int ms = (int)left + 1;
    if (unpollable && ms > 10) ms = 10;
    poll(fds, nf, ms);
  }
}

static void gg__conclude(gg__td_t *td, gg__target_t *t) {
  gg_proc_outcome_t *o = &t->out;
  o->pid = t->kid.pid;
  o->ppid = t->ppid;
  o->start_time = t->kid.start;
  GG__ASSERT(t->kid.found >= 0 && t->kid.found < 4); /* an index into gg__found_names */
  o->found = gg__found_names[t->kid.found];
  if (t->skipped) {
    o->end = GG_PROC_SKIPPED;
    return;
  }
  gg__poll_exited(t);
  if (!t->exited) {
    gg__pinfo_t info;
    o->end = GG_PROC_ALIVE;
    o->state = gg__proc_read_stat(t->kid.pid, &info) == 0 ? info.state : '?';
    return;
  }
  /* Reap our children. With a pidfd, waitid names exactly this process and says ECHILD when it is
   * not our child; without one only a tracked child of ours is waited for by pid. */
  siginfo_t si;
  memset(&si, 0, sizeof si);
  int r = -1;
  if (t->kid.pidfd >= 0)
    r = waitid((idtype_t)P_PIDFD, (id_t)t->kid.pidfd, &si, WEXITED | WNOHANG);
  else if (t->ppid == td->me)
    r = waitid(P_PID, (id_t)t->kid.pid, &si, WEXITED | WNOHANG);
  if (r == 0 && si.si_pid == t->kid.pid) {
    o->end = si.si_code == CLD_EXITED ? GG_PROC_EXITED : GG_PROC_SIGNALED;
    o->code = si.si_status;
  } else {
    o->end = GG_PROC_ENDED;
  }
}

/* Phase 1: the tracked records become targets, each checked to be still the process recorded. On
 * ENOMEM the records not taken go back into the set. */
static int gg__take_tracked(gg__td_t *td, const void *key, gg__kid_t *kids, size_t nkids) {
  for (size_t i = 0; i < nkids; i++) {
    gg__target_t *t = gg__add(td);
    if (!t) {
      for (size_t j = i; j < nkids; j++)
        gg__proc_track(key, kids[j].pid, kids[j].pidfd, kids[j].start, kids[j].found);
      return gg__err(GG_ENOMEM, "gg_proc_teardown: out of host memory");
    }
    t->kid = kids[i];
    GG__ASSERT(t->kid.pid > 1); /* a record never names init, a group (0) or every process (-1) */
    gg__pinfo_t info;
    if (gg__proc_read_stat(t->kid.pid, &info) == 0) {
      t->ppid = info.ppid;
      t->pgrp = info.pgrp;
      t->state = info.state;
    }
    /* Trap: persisted pids get reused. A record whose pid now names another process (other start
     * time) or another user's is reported and never signalled. */
    if (t->kid.pidfd < 0) {
      if (gg__proc_read_stat(t->kid.pid, &info) != 0)
        t->exited = true; /* gone: nothing to signal */
      else if (info.start != t->kid.start)
        t->skipped = true;
      else if (!gg__ours_to_end(t->kid.pid))
        t->skipped = t->foreign = true;
    }
  }
  return 0;
}

/* Phase 2: SIGTERM (and SIGCONT to stopped ones) to every target, then the grace period. */
static void gg__term_and_wait(gg__td_t *td, int grace_ms, double t0) {
  for (size_t i = 0; i < td->n; i++) {
    gg__target_t *t = &td->t[i];
    gg__proc_cmdline(t->kid.pid, t->out.command, sizeof t->out.command);
    if (grace_ms == 0) continue;
    gg__send(td, t, SIGTERM, GG_PROC_SENT_TERM);
    /* A stopped process cannot act on SIGTERM until continued. */
    if (t->state == 'T' || t->state == 't') gg__send(td, t, SIGCONT, GG_PROC_SENT_CONT);
  }
  if (grace_ms > 0) gg__wait(td, t0 + grace_ms);
}

/* Phase 3: what was forked during the grace period, or orphaned by a parent that just exited, too;
 * then SIGKILL to everything left, and a bounded wait. */
static void gg__kill_rest(gg__td_t *td) {
  size_t before = td->n;
  if (gg__discover(td) != 0) td->err = 0;
  for (size_t i = before; i < td->n; i++)
    gg__proc_cmdline(td->t[i].kid.pid, td->t[i].out.command, sizeof td->t[i].out.command);
  for (size_t i = 0; i < td->n; i++)
    if (!gg__poll_exited(&td->t[i])) gg__send(td, &td->t[i], SIGKILL, GG_PROC_SENT_KILL);
  gg__wait(td, gg__now_ms() + GG__KILL_WAIT_MS);
}

/* Phase 4: reap and conclude each target; those still alive are kept in the set for the next
 * teardown and the fatal path, not forgotten. Returns how many are alive. */
static size_t gg__conclude_all(gg__td_t *td, const void *key) {
  size_t alive = 0;
  for (size_t i = 0; i < td->n; i++) {
    gg__target_t *t = &td->t[i];
    gg__conclude(td, t);
    if (t->out.end == GG_PROC_ALIVE) {
      /* A skipped target (its pid names another process now) is never kept to be killed later. */
      GG__ASSERT(!t->skipped);
      alive++;
      gg__proc_release(&(gg__kid_t){.pid = t->kid.pid, .pidfd = -1, .slot = t->kid.slot});
      gg__proc_track(key, t->kid.pid, t->kid.pidfd, t->kid.start, t->kid.found);
    } else {
      gg__proc_release(&t->kid);
    }
  }
  return alive;
}

/* Phase 5: the receipt, a copy of every target's outcome. */
static int gg__make_receipt(const gg__td_t *td, size_t alive, int grace_ms, double t0,
                            gg_proc_receipt_t **out) {
  gg_proc_receipt_t *r = calloc(1, sizeof *r);
  if (r && td->n) r->procs = calloc(td->n, sizeof *r->procs);
  if (!r || (td->n && !r->procs)) {
    free(r);
    return gg__err(GG_ENOMEM, "gg_proc_teardown: out of host memory for the receipt");
  }
  r->count = td->n;
  for (size_t i = 0; i < td->n; i++) r->procs[i] = td->t[i].out;
  /* Another user's process skipped and still running is left too: never "0 left" while it runs. */
  for (size_t i = 0; i < td->n; i++) {
    const gg__target_t *t = &td->t[i];
    gg__pinfo_t info;
    if (t->foreign && gg__proc_read_stat(t->kid.pid, &info) == 0 && info.start == t->kid.start &&
        info.state != 'Z' && info.state != 'X')
      alive++;
  }
  r->n_alive = alive;
  r->grace_ms = grace_ms;
  r->elapsed_ms = gg__now_ms() - t0;
  *out = r;
  return 0;
}

/* The message for processes SIGKILL could not end: each as pid:state. */
static int gg__alive_error(const gg__td_t *td, size_t alive) {
  char states[64] = "";
  size_t at = 0;
  for (size_t i = 0; i < td->n && at + 12 < sizeof states; i++)
    if (td->t[i].out.end == GG_PROC_ALIVE)
      at += (size_t)snprintf(states + at, sizeof states - at, "%s%d:%c", at ? " " : "",
                             (int)td->t[i].kid.pid, td->t[i].out.state);
  return gg__err(
      GG_ETIMEDOUT,
      "gg_proc_teardown: %zu process(es) still alive %.0f ms after SIGKILL (pid:state %s); "
      "kept for the next teardown",
      alive, (double)GG__KILL_WAIT_MS, states);
}

int gg__proc_teardown_set(const void *guard_key, int grace_ms, gg_proc_receipt_t **receipt) {
  if (receipt) *receipt = NULL;
  if (grace_ms < 0 || grace_ms > GG__GRACE_MAX_MS)
    return gg__err(GG_EINVAL, "gg_proc_teardown: grace_ms %d is outside 0..%d", grace_ms,
                   GG__GRACE_MAX_MS);
  double t0 = gg__now_ms();
  gg__kid_t *kids;
  size_t nkids;
  pid_t *others;
  gg__td_t td = {.me = getpid()};
  int rc = gg__proc_detach(guard_key, &kids, &nkids, &others, &td.n_others);
  if (rc != 0) return rc;
  td.others = others;
  int sub = 0;
  /* The orphan sweep belongs to the process's own set, or to a set that had children of its own: a
   * guard that never spawned anything must not end the application's other children. */
  td.subreaper =
      prctl(PR_GET_CHILD_SUBREAPER, &sub) == 0 && sub && (nkids > 0 || guard_key == NULL);
  rc = gg__take_tracked(&td, guard_key, kids, nkids);
  free(kids);
  if (rc == 0) rc = gg__discover(&td);
  /* /proc unreadable: the tracked set still gets its signals */
  if (rc != 0 && rc != GG_ENOMEM) rc = 0;
  td.err = 0;
  GG__ASSERT(td.n >= nkids || rc != 0); /* every tracked record became a target */
  gg__term_and_wait(&td, grace_ms, t0);
  gg__kill_rest(&td);
  size_t alive = gg__conclude_all(&td, guard_key);
  free(others);
  if (receipt) {
    int r = gg__make_receipt(&td, alive, grace_ms, t0, receipt);
    if (rc == 0) rc = r;
  }
  if (rc == 0 && alive) rc = gg__alive_error(&td, alive);
  free(td.t);
  return rc;
}

int gg_proc_teardown(gg_guard_t *guard, int grace_ms) {
  return gg__proc_teardown_set(guard, grace_ms, NULL);
}

int gg_proc_teardown_ex(gg_guard_t *guard, int grace_ms, gg_proc_receipt_t **receipt) {
  if (!receipt) return gg__err(GG_EINVAL, "gg_proc_teardown_ex: receipt is NULL");
  return gg__proc_teardown_set(guard, grace_ms, receipt);
}

void gg_proc_receipt_free(gg_proc_receipt_t *receipt) {
  if (!receipt) return;
  free(receipt->procs);
  free(receipt);
}

/* ---- JSON ------------------------------------------------------------------------------------ */

typedef struct gg__out {
  char *buf;
  size_t cap, len;
} gg__out_t;

static void gg__put(gg__out_t *o, const char *s, size_t n) {
  if (o->len < o->cap) {
    size_t room = o->cap - o->len - 1;
    memcpy(o->buf + o->len, s, n < room ? n : room);
  }
  o->len += n;
}

static void GG__PRINTF(2, 3) gg__putf(gg__out_t *o, const char *fmt, ...) {
  char tmp[128];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n > 0) gg__put(o, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

static void gg__out_sink(void *ctx, const char *p, size_t n) { gg__put(ctx, p, n); }
static void gg__put_str(gg__out_t *o, const char *s) { gg__json_string(s, gg__out_sink, o); }

int gg_proc_receipt_json(const gg_proc_receipt_t *receipt, char *buf, size_t cap, size_t *len) {
  if (!receipt) return gg__err(GG_EINVAL, "gg_proc_receipt_json: receipt is NULL");
  if (!buf) cap = 0;
  gg__out_t o = {buf, cap, 0};
  static const char *const ends[] = {"exited", "signaled", "ended", "alive", "skipped"};
  gg__putf(&o, "{\"grace_ms\":%d,\"elapsed_ms\":%.1f,\"alive\":%zu,\"processes\":[",
           receipt->grace_ms, receipt->elapsed_ms, receipt->n_alive);
  for (size_t i = 0; i < receipt->count; i++) {
    const gg_proc_outcome_t *p = &receipt->procs[i];
    gg__putf(&o, "%s{\"pid\":%d,\"ppid\":%d,\"start_time\":%llu,\"command\":", i ? "," : "",
             (int)p->pid, (int)p->ppid, p->start_time);
    gg__put_str(&o, p->command);
    gg__put(&o, ",\"found\":", 9);
    gg__put_str(&o, p->found ? p->found : "tracked");
    gg__putf(&o, ",\"sent\":[%s%s%s%s%s]", p->sent & GG_PROC_SENT_TERM ? "\"TERM\"" : "",
             (p->sent & GG_PROC_SENT_TERM) && (p->sent & (GG_PROC_SENT_CONT | GG_PROC_SENT_KILL))
                 ? ","
                 : "",
             p->sent & GG_PROC_SENT_CONT ? "\"CONT\"" : "",
             (p->sent & GG_PROC_SENT_CONT) && (p->sent & GG_PROC_SENT_KILL) ? "," : "",
             p->sent & GG_PROC_SENT_KILL ? "\"KILL\"" : "");
    if (p->sent & GG_PROC_SENT_GROUP_FOREIGN) gg__putf(&o, "%s", ",\"group\":\"ours only\"");
    unsigned e = (unsigned)p->end < 5 ? (unsigned)p->end : 2;
    gg__putf(&o, ",\"end\":\"%s\",\"code\":%d", ends[e], p->code);
    if (p->end == GG_PROC_ALIVE) {
      char st[2] = {p->state ? p->state : '?', 0};
      gg__put(&o, ",\"state\":", 9);
      gg__put_str(&o, st);
    }
    gg__put(&o, "}", 1);
  }
  gg__put(&o, "]}", 2);
  if (cap) buf[o.len < cap ? o.len : cap - 1] = '\0';
  if (len) *len = o.len;
  if (o.len >= cap)
    return gg__err(GG_ENOMEM, "gg_proc_receipt_json: needs %zu bytes and a NUL, buffer has %zu",
                   o.len, cap);
  return 0;
}

int gg_proc_receipt_write(const gg_proc_receipt_t *receipt, FILE *f) {
  if (!receipt || !f)
    return gg__err(GG_EINVAL, "gg_proc_receipt_write: NULL %s", receipt ? "stream" : "receipt");
  size_t len = 0;
  gg_proc_receipt_json(receipt, NULL, 0, &len);
  char *buf = malloc(len + 1);
  if (!buf) return gg__err(GG_ENOMEM, "gg_proc_receipt_write: out of host memory");
  int rc = gg_proc_receipt_json(receipt, buf, len + 1, NULL);
  if (rc == 0 && (fwrite(buf, 1, len, f) != len || fputc('\n', f) == EOF || fflush(f) != 0))
    rc = gg__err(GG_EIO, "gg_proc_receipt_write: write failed: %s", strerror(errno));
  free(buf);
  return rc;
}
