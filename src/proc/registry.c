/* registry.c — the per-user session registry: a private directory with one record per guarded
 * process, written atomically, checked before it is trusted, and unlinked on every exit path. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "core/internal.h"
#include "proc/procfs_internal.h"
#include "proc/registry_dir_internal.h"
#include "proc/registry_internal.h"

#define GG__REC_MAX        4096          /* a record larger than this is not one of ours */
#define GG__INIT_PIDNS_INO 0xEFFFFFFCULL /* the initial pid namespace (PROC_PID_INIT_INO) */
#define GG__JOBNS_MAX      8             /* PID namespaces of its jobs a record names */

static pthread_mutex_t gg__reg_lock = PTHREAD_MUTEX_INITIALIZER;
static char gg__session[40];
static char gg__role[16];
/* For the fatal path: the record's full path, written before gg__reg_owner publishes it. A forked
 * child sees an owner that is not itself and leaves its parent's record alone. */
static char gg__reg_path[PATH_MAX];
static atomic_int gg__reg_owner;

/* fork() while another thread holds the lock must not leave it held forever in the child
 * (fork.c). */
static void gg__registry_fork_prepare(void) {
  pthread_mutex_lock(&gg__reg_lock);
  gg__registry_dir_lock(true);
}
static void gg__registry_fork_parent(void) {
  gg__registry_dir_lock(false);
  pthread_mutex_unlock(&gg__reg_lock);
}
static void gg__registry_fork_child(void) {
  gg__registry_dir_lock(false);
  pthread_mutex_unlock(&gg__reg_lock);
}
GG__FORK_REGISTER(GG__FORK_REGISTRY, gg__registry_fork_prepare, gg__registry_fork_parent,
                  gg__registry_fork_child)

void gg__registry_fatal_unlink(void) {
  if (atomic_load(&gg__reg_owner) == (int)getpid()) unlink(gg__reg_path);
}

static bool gg__ends_rec(const char *name) {
  size_t n = strlen(name);
  return n > 4 && strcmp(name + n - 4, ".rec") == 0;
}

static bool gg__session_ok(const char *s) {
  size_t n = 0;
  for (; s[n]; n++)
    if (!((s[n] >= '0' && s[n] <= '9') || (s[n] >= 'a' && s[n] <= 'f'))) return false;
  return n > 0 && n < 40;
}

/* A record as read, with what the reader could tell about its process. */
typedef struct gg__rec {
  gg_session_record_t r;
  unsigned long long pidns; /* the writer's pid namespace (0: not recorded, an older record) */
  pid_t hostpid;            /* its pid in the namespace of the /proc it read (0: not recorded) */
  unsigned long long jobns[GG__JOBNS_MAX]; /* PID namespaces its jobs were started in (0: none) */
  bool foreign;                            /* written in another pid namespace than ours */
} gg__rec_t;

typedef int (*gg__rec_fn)(int dfd, const char *name, const gg__rec_t *r, void *user);
static int gg__reg_scan(int dfd, const char *call, const char *dir, gg__rec_fn fn, void *user);

typedef struct gg__leader_find {
  const char *session;
  bool found;
} gg__leader_find_t;

/* A live leader of the session: its record is not stale (pid alive, start time the recorded one; a
 * record of another pid namespace counts until proven dead) and, where we can see it, it runs as us
 * and is our ancestor. */
static int gg__leader_one(int dfd, const char *name, const gg__rec_t *rec, void *user) {
  (void)dfd;
  (void)name;
  gg__leader_find_t *f = user;
  const gg_session_record_t *r = &rec->r;
  if (r->stale || strcmp(r->role, "leader") != 0 || strcmp(r->session, f->session) != 0) return 0;
  /* beyond our namespace: nothing more to check here */
  if (rec->foreign) {
    f->found = true;
    return 1;
  }
  uid_t uid;
  if (gg__proc_uid(r->pid, &uid) != 0 || (uid != getuid() && uid != geteuid())) return 0;
  /* Ours: the leader started us (an ancestor); a live session of somebody else's job is not
   * joined. */
  gg__pinfo_t info;
  pid_t p = getppid();
  for (int depth = 0; depth < 64 && p > 0 && gg__proc_read_stat(p, &info) == 0;
       depth++, p = info.ppid)
    if (p == r->pid && info.start == r->start_time) {
      f->found = true;
      return 1;
    }
  return 0;
}

/* Under gg__reg_lock: the session and role, decided once per process. A forked child (whose memory
 * holds its parent's decision) decides again: it finds the session in its environment and works for
 * it. An inherited session is joined only while its leader lives: a session id copied from a dead
 * job (or made up) would otherwise make this process look like that dead session's orphan to
 * `reap`, which would kill it; such a process leads a session of its own instead. */
static pid_t gg__session_pid;
static void gg__session_init(int dfd, const char *dir) {
  if (gg__session[0] && gg__session_pid == getpid()) return;
  gg__session_pid = getpid();
  /* A forked child holds its parent's session in memory (the environment is never written:
   * below). */
  char forked[sizeof gg__session];
  gg__strlcpy(forked, gg__session, sizeof forked);
  const char *inherited = forked[0] ? forked : gg__env("GPUGUARD_SESSION");
  if (inherited && gg__session_ok(inherited)) {
    gg__leader_find_t f = {inherited, false};
    gg__err_saved_t saved;
    gg__err_save(&saved);
    gg__reg_scan(dfd, "gg_registry_register", dir, gg__leader_one, &f);
    gg__err_restore(&saved);
    if (f.found) {
      gg__strlcpy(gg__session, inherited, sizeof gg__session);
      gg__strlcpy(gg__role, "worker", sizeof gg__role);
      return;
    }
    fprintf(stderr,
            "gpuguard: registry: GPUGUARD_SESSION=%s has no live leader here; starting a session "
            "of our own\n",
            inherited);
  }
  unsigned char raw[16];
  if (getrandom(raw, sizeof raw, GRND_NONBLOCK) != (ssize_t)sizeof raw) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    unsigned long long x =
        (unsigned long long)ts.tv_nsec ^ ((unsigned long long)ts.tv_sec << 20) ^ (unsigned)getpid();
    for (size_t i = 0; i < sizeof raw; i++)
      raw[i] = (unsigned char)(x >> (8 * (i % 8))) ^ (unsigned char)(i * 37);
  }
  for (size_t i = 0; i < sizeof raw; i++) snprintf(gg__session + 2 * i, 3, "%02x", raw[i]);
  gg__strlcpy(gg__role, "leader", sizeof gg__role);
  /* Not setenv(): it races with getenv() on every other thread (the C library's environment has no
   * lock readers take). gg_proc_spawn() gives the id to its children in their own environment
   * array. */
}

/* Keeps a record one line per field: newlines and other control bytes in free text become '?'. */
static void gg__clean(char *dst, const char *src, size_t cap) {
  gg__strlcpy(dst, src ? src : "", cap);
  for (char *p = dst; *p; p++)
    if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '?';
}

/* The PID namespaces this process started jobs in (gg_proc_spawn with pid_ns), written into its
 * record: a namespace made from ours is below ours, so all its processes are in our /proc while it
 * lives; one with none left, whose maker's record names it, has ended with its job (the kernel
 * killed every process of it at once, none could unlink its record). */
static unsigned long long gg__jobns[GG__JOBNS_MAX];
static size_t gg__n_jobns;
static char gg__reg_devices[64];

static void gg__jobns_text(char *buf, size_t cap) {
  size_t at = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < gg__n_jobns && i < GG__JOBNS_MAX; i++) {
    int n = snprintf(buf + at, cap - at, "%s%llu", at ? "," : "", gg__jobns[i]);
    if (n < 0 || (size_t)n >= cap - at) break;
    at += (size_t)n;
  }
}

int gg_registry_register(const char *devices) {
  pthread_mutex_lock(&gg__reg_lock);
  char dir[PATH_MAX];
  int dfd, rc = gg__reg_open(dir, sizeof dir, &dfd);
  if (rc != 0) {
    pthread_mutex_unlock(&gg__reg_lock);
    return rc;
  }
  gg__session_init(dfd, dir);
  GG__ASSERT(gg__session_ok(gg__session)); /* a record our own reader refuses would be stale */
  GG__ASSERT(!strcmp(gg__role, "leader") || !strcmp(gg__role, "worker"));
  pid_t me = getpid();
  gg__pinfo_t info;
  unsigned long long start = gg__proc_read_self(&info) == 0 ? info.start : 0;
  /* Where this record is read from another pid namespace (a registry shared with containers), the
   * namespace and the pid the outermost visible namespace knows let the reader judge it (a pid read
   * in the wrong namespace names another process, which reap would kill). */
  unsigned long long ns = 0;
  pid_t outer = 0, inner = 0;
  if (gg__proc_pidns(0, &ns) != 0) ns = 0;
  if (gg__proc_nspid(0, &outer, &inner, NULL) != 0) outer = 0;
  char jobns[GG__JOBNS_MAX * 21 + 1];
  gg__jobns_text(jobns, sizeof jobns);
  if (devices != gg__reg_devices)
    gg__strlcpy(gg__reg_devices, devices ? devices : "", sizeof gg__reg_devices);
  char dev[64], cmd[256], text[GG__REC_MAX], name[64], tmp[80];
  gg__clean(dev, devices, sizeof dev);
  gg__proc_cmdline(me, cmd, sizeof cmd);
  gg__clean(cmd, cmd, sizeof cmd);
  int len = snprintf(
      text, sizeof text,
      "gpuguard-record 2\npid %d\nstart %llu\nppid %d\nsession %s\nrole %s\ndevices %s\ncmd %s\n"
      "pidns %llu\nhostpid %d\njobns %s\n",
      (int)me, start, (int)getppid(), gg__session, gg__role, dev, cmd, ns, (int)outer, jobns);
  GG__ASSERT(len > 0 && (size_t)len < sizeof text); /* the write below sends len bytes of text */
  /* Outside the initial pid namespace the record's name carries the namespace: pid 2 of one
   * container and pid 2 of another are two processes, and two records. */
  if (ns && ns != GG__INIT_PIDNS_INO)
    snprintf(name, sizeof name, "%d.%llu.rec", (int)me, ns);
  else
    snprintf(name, sizeof name, "%d.rec", (int)me);
  snprintf(tmp, sizeof tmp, ".%s.tmp", name);
  /* Temporary file then rename: a reader sees the whole old record or the whole new one. */
  unlinkat(dfd, tmp, 0);
  int fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  bool ok = fd >= 0 && write(fd, text, (size_t)len) == len;
  if (fd >= 0) ok = (close(fd) == 0) && ok;
  ok = ok && renameat(dfd, tmp, dfd, name) == 0;
  if (!ok) {
    rc = gg__err(GG_EIO, "gg_registry_register: cannot write '%s/%s': %s", dir, name,
                 strerror(errno));
    unlinkat(dfd, tmp, 0);
  } else {
    atomic_store(&gg__reg_owner, 0);
    size_t dl = strlen(dir), nl = strlen(name);
    if (dl + 1 + nl < sizeof gg__reg_path) { /* the directory opened, so its path fits PATH_MAX */
      memcpy(gg__reg_path, dir, dl);
      gg__reg_path[dl] = '/';
      memcpy(gg__reg_path + dl + 1, name, nl + 1);
      atomic_store(&gg__reg_owner, (int)me);
    }
  }
  close(dfd);
  pthread_mutex_unlock(&gg__reg_lock);
  return rc;
}

static unsigned long long gg__my_pidns(void);

void gg__registry_note_job_ns(pid_t keeper) {
  char path[64], link[64];
  snprintf(path, sizeof path, "/proc/%d/ns/pid_for_children", (int)keeper);
  ssize_t n = readlink(path, link, sizeof link - 1);
  if (n <= 0) return;
  link[n] = '\0';
  unsigned long long ns = 0;
  /* none was made */
  if (sscanf(link, "pid:[%llu]", &ns) != 1 || ns == 0 || ns == gg__my_pidns()) return;
  pthread_mutex_lock(&gg__reg_lock);
  gg__jobns[gg__n_jobns++ % GG__JOBNS_MAX] = ns;
  bool registered = atomic_load(&gg__reg_owner) == (int)getpid();
  char devices[sizeof gg__reg_devices];
  gg__strlcpy(devices, gg__reg_devices, sizeof devices);
  pthread_mutex_unlock(&gg__reg_lock);
  if (registered) {
    gg__err_saved_t saved;
    gg__err_save(&saved);
    gg_registry_register(devices); /* the same record again, now naming the namespace */
    gg__err_restore(&saved);
  }
}

int gg_registry_unregister(void) {
  pthread_mutex_lock(&gg__reg_lock);
  int rc = 0;
  if (atomic_load(&gg__reg_owner) == (int)getpid()) {
    GG__ASSERT(gg__reg_path[0] != '\0'); /* the owner is published only after the path */
    atomic_store(&gg__reg_owner, 0);
    if (unlink(gg__reg_path) != 0 && errno != ENOENT)
      rc = gg__err(GG_EIO, "gg_registry_unregister: cannot remove '%s': %s", gg__reg_path,
                   strerror(errno));
  }
  pthread_mutex_unlock(&gg__reg_lock);
  return rc;
}

int gg_registry_session(char *buf, size_t cap) {
  if (!buf || cap == 0) return gg__err(GG_EINVAL, "gg_registry_session: NULL or empty buffer");
  pthread_mutex_lock(&gg__reg_lock);
  const char *s = gg__session[0] ? gg__session : gg__env("GPUGUARD_SESSION");
  gg__strlcpy(buf, s && gg__session_ok(s) ? s : "", cap);
  pthread_mutex_unlock(&gg__reg_lock);
  return 0;
}

/* One warning per record name per process: a tool listing every second must not flood stderr. Past
 * 64 names, one line says that the rest are skipped silently. */
#define GG__WARN_MAX 64
static char gg__warned[GG__WARN_MAX][64];
static size_t gg__n_warned;
static bool gg__warn_capped;

static void GG__PRINTF(2, 3) gg__warn(const char *name, const char *fmt, ...) {
  for (size_t i = 0; i < gg__n_warned; i++)
    if (strncmp(gg__warned[i], name, sizeof gg__warned[0] - 1) == 0) return;
  if (gg__n_warned == GG__WARN_MAX) {
    if (!gg__warn_capped)
      fprintf(stderr,
              "gpuguard: registry: more than %d bad entries; skipping the rest without a warning\n",
              GG__WARN_MAX);
    gg__warn_capped = true;
    return;
  }
  gg__strlcpy(gg__warned[gg__n_warned++], name, sizeof gg__warned[0]);
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "gpuguard: registry: skipping '%s': %s\n", name, msg);
}

/* Parses a record; false when anything is off. */
static bool gg__parse_record(char *text, pid_t file_pid, gg__rec_t *rec) {
  memset(rec, 0, sizeof *rec);
  gg_session_record_t *r = &rec->r;
  char *save = NULL, *line = strtok_r(text, "\n", &save);
  if (!line || (strcmp(line, "gpuguard-record 1") != 0 && strcmp(line, "gpuguard-record 2") != 0))
    return false;
  unsigned seen = 0;
  long v_pid = 0, v_ppid = 0, v_host = 0;
  while ((line = strtok_r(NULL, "\n", &save))) {
    char *sp = strchr(line, ' ');
    const char *v = sp ? sp + 1 : "";
    if (sp) *sp = '\0';
    char *end = NULL;
    errno = 0;
    if (!strcmp(line, "pid")) {
      v_pid = strtol(v, &end, 10);
      seen |= 1;
    } else if (!strcmp(line, "start")) {
      r->start_time = strtoull(v, &end, 10);
      seen |= 2;
    } else if (!strcmp(line, "ppid")) {
      v_ppid = strtol(v, &end, 10);
      seen |= 4;
    } else if (!strcmp(line, "pidns"))
      rec->pidns = strtoull(v, &end, 10);
    else if (!strcmp(line, "hostpid"))
      v_host = strtol(v, &end, 10);
    else if (!strcmp(line, "jobns")) {
      const char *p = v;
      for (int k = 0; *p && k < GG__JOBNS_MAX; k++) {
        rec->jobns[k] = strtoull(p, &end, 10);
        if (end == p || (*end && *end != ',')) return false;
        p = *end ? end + 1 : end;
      }
      end = NULL;
    } else if (!strcmp(line, "session") && gg__session_ok(v)) {
      gg__strlcpy(r->session, v, sizeof r->session);
      seen |= 8;
    } else if (!strcmp(line, "role") && (!strcmp(v, "leader") || !strcmp(v, "worker"))) {
      gg__strlcpy(r->role, v, sizeof r->role);
      seen |= 16;
    } else if (!strcmp(line, "devices"))
      gg__strlcpy(r->devices, v, sizeof r->devices);
    else if (!strcmp(line, "cmd"))
      gg__strlcpy(r->command, v, sizeof r->command);
    else
      return false;
    if (end && (*end || errno || end == v)) return false;
  }
  /* Pids are ints: a value beyond one must not wrap onto another process (4294967297 is not pid
   * 1). */
  if (v_pid <= 0 || v_pid > INT_MAX || v_ppid < 0 || v_ppid > INT_MAX || v_host < 0 ||
      v_host > INT_MAX)
    return false;
  r->pid = (pid_t)v_pid;
  r->ppid = (pid_t)v_ppid;
  rec->hostpid = (pid_t)v_host;
  return seen == 31 && r->pid == file_pid;
}

/* ---- judging a record from another pid namespace --------------------------------------------- */

typedef struct gg__ns_look {
  const gg__rec_t *rec;
  bool seen_ns; /* some process of the record's namespace is visible to us */
  bool alive;   /* the recorded process itself, same start time */
} gg__ns_look_t;

/* Is `pid` (a pid of our /proc) the recorded process? 1 yes, 0 it is in the namespace but another
 * process, -1 not in the namespace or not readable. */
static int gg__ns_match(pid_t pid, const gg__rec_t *rec, unsigned long long start) {
  unsigned long long ns;
  pid_t outer, inner;
  if (gg__proc_pidns(pid, &ns) != 0 || ns != rec->pidns) return -1;
  if (gg__proc_nspid(pid, &outer, &inner, NULL) != 0) return -1;
  return inner == rec->r.pid && start == rec->r.start_time;
}

static int gg__ns_visit(const gg__pinfo_t *info, void *user) {
  gg__ns_look_t *l = user;
  int m = gg__ns_match(info->pid, l->rec, info->start);
  if (m >= 0) l->seen_ns = true;
  if (m == 1) l->alive = true;
  return l->alive;
}

/* A record written in another pid namespace names a pid of that namespace, which means nothing here
 * (a job in a container records pid 2; reading pid 2 here says "stale" and reap would kill the live
 * job). It is alive unless proven dead: found through the pid the writer saw in the
 * outermost namespace it could see, or proven dead when some process of its namespace is visible
 * here but none is the recorded one. A namespace none of whose processes we can see (a sibling
 * container, or one that is gone entirely) proves nothing: the record counts as alive and stays
 * until it is judged from its own namespace (or removed by hand). */
/* Namespaces that records of our own namespace say their writers made (gg__reg_scan's first
 * pass). */
typedef struct gg__made {
  unsigned long long ns[64];
  size_t n;
} gg__made_t;

static bool gg__foreign_stale(const gg__rec_t *rec, unsigned long long my_ns,
                              const gg__made_t *made, bool *parent_alive) {
  *parent_alive = true; /* unknowable from here */
  gg__pinfo_t info;
  if (rec->hostpid > 0 && gg__proc_read_stat(rec->hostpid, &info) == 0 && info.state != 'Z' &&
      gg__ns_match(rec->hostpid, rec, info.start) == 1)
    return false;
  gg__ns_look_t l = {rec, false, false};
  if (gg__proc_walk(gg__ns_visit, &l) < 0) return false;
  if (l.seen_ns) return !l.alive;
  /* Every process of a namespace made from ours is in our /proc (when that /proc is our
   * namespace's: our own pid there is getpid()). One with no process left has ended, its job with
   * it. */
  pid_t outer = 0, inner = 0;
  if (!my_ns || !made || gg__proc_nspid(0, &outer, &inner, NULL) != 0 || outer != getpid())
    return false;
  for (size_t k = 0; k < made->n; k++)
    if (made->ns[k] == rec->pidns) return true;
  return false;
}

static unsigned long long gg__my_pidns(void) {
  unsigned long long ns = 0;
  return gg__proc_pidns(0, &ns) == 0 ? ns : 0;
}

/* Reads and judges record `name` of dfd (written by pid `pid`): 0 when it is a valid record of
 * ours, -1 when it was skipped (with a warning naming `shown`, unless it vanished). */
static int gg__reg_read(int dfd, const char *name, const char *shown, pid_t pid,
                        unsigned long long my_ns, const gg__made_t *made, gg__rec_t *rec) {
  int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno != ENOENT)
      gg__warn(shown, "cannot open it (%s)", errno == ELOOP ? "a symlink" : strerror(errno));
    return -1;
  }
  struct stat st;
  char text[GG__REC_MAX + 1];
  ssize_t len = -1;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    gg__warn(shown, "not a regular file");
  else if (st.st_uid != geteuid())
    gg__warn(shown, "owned by uid %u, not by us", (unsigned)st.st_uid);
  else if (st.st_mode & 022)
    gg__warn(shown, "writable by group or others");
  else if (st.st_size > GG__REC_MAX)
    gg__warn(shown, "larger than a record can be");
  else
    len = read(fd, text, GG__REC_MAX);
  close(fd);
  if (len < 0) return -1;
  text[len] = '\0';
  if (memchr(text, '\0', (size_t)len) || !gg__parse_record(text, pid, rec)) {
    gg__warn(shown, "corrupt record");
    return -1;
  }
  gg_session_record_t *r = &rec->r;
  rec->foreign = rec->pidns && my_ns && rec->pidns != my_ns;
  if (rec->foreign) {
    bool parent_alive;
    r->stale = gg__foreign_stale(rec, my_ns, made, &parent_alive);
    r->parent_alive = parent_alive;
  } else {
    gg__pinfo_t info;
    r->stale =
        gg__proc_read_stat(r->pid, &info) != 0 || info.start != r->start_time || info.state == 'Z';
    r->parent_alive = r->ppid > 0 && gg__proc_read_stat(r->ppid, &info) == 0 && info.state != 'Z';
  }
  return 0;
}

/* The jobns lines of the records written in our namespace (a light read: it only ever proves a
 * namespace of our making dead, and the directory is ours alone). */
static void gg__made_scan(DIR *d, int dfd, unsigned long long my_ns, gg__made_t *made) {
  made->n = 0;
  const struct dirent *e;
  while ((e = readdir(d)) && made->n < sizeof made->ns / sizeof made->ns[0]) {
    if (e->d_name[0] == '.' || !gg__ends_rec(e->d_name)) continue;
    int fd = openat(dfd, e->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st;
    char text[GG__REC_MAX + 1];
    ssize_t len = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid()
                      ? read(fd, text, GG__REC_MAX)
                      : -1;
    close(fd);
    if (len <= 0) continue;
    text[len] = '\0';
    const char *ns = strstr(text, "\npidns "), *jobs = strstr(text, "\njobns ");
    if (!jobs || (ns && strtoull(ns + 7, NULL, 10) != my_ns)) continue;
    for (const char *p = jobs + 7;
         *p >= '0' && *p <= '9' && made->n < sizeof made->ns / sizeof made->ns[0];) {
      char *end;
      made->ns[made->n++] = strtoull(p, &end, 10);
      p = *end == ',' ? end + 1 : end;
    }
  }
}

/* The scan in progress's namespaces (under gg__reg_lock), for a callback that reads a record
 * again. */
static const gg__made_t *gg__scan_made;

/* Under gg__reg_lock: reads every valid record in dfd; the rest is warned about and skipped. */
static int gg__reg_scan(int dfd, const char *call, const char *dir, gg__rec_fn fn, void *user) {
  int dfd2 = dup(dfd);
  DIR *d = dfd2 >= 0 ? fdopendir(dfd2) : NULL;
  if (!d) {
    if (dfd2 >= 0) close(dfd2);
    return gg__err(GG_EIO, "%s: cannot list '%s': %s", call, dir, strerror(errno));
  }
  GG__ASSERT(gg__scan_made == NULL); /* scans never nest: the inner one would drop the outer's */
  unsigned long long my_ns = gg__my_pidns();
  gg__made_t made;
  gg__made_scan(d, dfd, my_ns, &made);
  rewinddir(d);
  gg__scan_made = &made;
  int rc = 0;
  const struct dirent *e;
  while ((e = readdir(d))) {
    const char *name = e->d_name;
    if (name[0] == '.') continue; /* ".", "..", and records being written or pruned */
    char *end = NULL;
    errno = 0;
    long pid = strtol(name, &end, 10);
    unsigned long long ns = 0;
    if (end != name && *end == '.' && end[1] >= '0' && end[1] <= '9') { /* PID.NS.rec */
      char *end2 = NULL;
      ns = strtoull(end + 1, &end2, 10);
      end = end2;
    }
    if (pid <= 0 || pid > INT_MAX || errno || end == name || strcmp(end, ".rec") != 0) {
      gg__warn(name, "not a record name (PID.rec or PID.NAMESPACE.rec)");
      continue;
    }
    gg__rec_t rec;
    if (gg__reg_read(dfd, name, name, (pid_t)pid, my_ns, &made, &rec) != 0) continue;
    if (ns && rec.pidns != ns) {
      gg__warn(name, "its name says pid namespace %llu, its record %llu", ns, rec.pidns);
      continue;
    }
    GG__ASSERT(rec.r.pid == (pid_t)pid); /* reap and prune act on the pid the name gives */
    rc = fn(dfd, name, &rec, user);
    if (rc != 0) break;
  }
  gg__scan_made = NULL;
  closedir(d);
  return rc < 0 ? rc : 0;
}

static int gg__reg_each(const char *call, gg__rec_fn fn, void *user) {
  char dir[PATH_MAX];
  int dfd, rc = gg__reg_open(dir, sizeof dir, &dfd);
  if (rc != 0) return rc;
  pthread_mutex_lock(&gg__reg_lock);
  rc = gg__reg_scan(dfd, call, dir, fn, user);
  pthread_mutex_unlock(&gg__reg_lock);
  close(dfd);
  return rc;
}

typedef struct gg__list {
  gg_session_record_t *rows;
  unsigned char *foreign;
  size_t cap, n;
} gg__list_t;

static int gg__list_one(int dfd, const char *name, const gg__rec_t *r, void *user) {
  (void)dfd;
  (void)name;
  gg__list_t *l = user;
  if (l->n < l->cap) {
    l->rows[l->n] = r->r;
    if (l->foreign) l->foreign[l->n] = r->foreign;
  }
  l->n++;
  return 0;
}

int gg__registry_list_ns(gg_session_record_t *rows, unsigned char *foreign, size_t cap,
                         size_t *count) {
  if (!count || (cap && !rows))
    return gg__err(GG_EINVAL, "gg_registry_list: NULL %s", count ? "rows" : "count");
  gg__list_t l = {rows, foreign, cap, 0};
  *count = 0;
  int rc = gg__reg_each("gg_registry_list", gg__list_one, &l);
  if (rc == 0) *count = l.n;
  return rc;
}

int gg_registry_list(gg_session_record_t *rows, size_t cap, size_t *count) {
  return gg__registry_list_ns(rows, NULL, cap, count);
}

static void (*_Atomic gg__prune_hook)(int dfd, const char *name);
void gg__registry_test_prune_hook(void (*fn)(int dfd, const char *name)) {
  atomic_store(&gg__prune_hook, fn);
}

/* rename() that fails with EEXIST instead of replacing a file at `to`. */
static int gg__rename_noreplace(int dfd, const char *from, const char *to) {
#ifdef SYS_renameat2
  return (int)syscall(SYS_renameat2, dfd, from, dfd, to, 1 /* RENAME_NOREPLACE */);
#else
  if (linkat(dfd, from, dfd, to, 0) != 0) return -1;
  return unlinkat(dfd, from, 0);
#endif
}

/* Trap: the record judged stale may be replaced before it is removed (its pid reused by a process
 * that registered since, renaming its fresh record over the name): unlinking by name would remove a
 * live record. So the file is first renamed to a name of our own, which atomically makes whatever
 * is there ours alone, and judged again there: still stale, it goes; live, it is put back under its
 * name unless a newer record took the name meanwhile (then that newer one is the process's
 * record). */
typedef struct gg__members {
  const char *session;
  bool found;
} gg__members_t;

static int gg__member_visit(const gg__pinfo_t *info, void *user) {
  gg__members_t *m = user;
  uid_t uid;
  char session[40];
  if (info->state == 'Z' || gg__proc_uid(info->pid, &uid) != 0 || uid != getuid()) return 0;
  if (gg__proc_environ_get(info->pid, "GPUGUARD_SESSION", session, sizeof session) != 0) return 0;
  m->found = strcmp(session, m->session) == 0;
  return m->found;
}

/* Whether a live process of ours still carries the session: then its dead leader's record is the
 * proof that it is an orphan (what `reap` goes by), and stays until the orphan is gone. */
static bool gg__session_has_members(const char *session) {
  gg__members_t m = {session, false};
  gg__proc_walk(gg__member_visit, &m);
  return m.found;
}

static int gg__prune_one(int dfd, const char *name, const gg__rec_t *r, void *user) {
  if (!r->r.stale) return 0;
  if (!r->foreign && strcmp(r->r.role, "leader") == 0 && gg__session_has_members(r->r.session))
    return 0;
  void (*hook)(int, const char *) = atomic_load(&gg__prune_hook);
  if (hook) hook(dfd, name);
  char mine[96];
  snprintf(mine, sizeof mine, ".prune.%d.%s", (int)getpid(), name);
  if (renameat(dfd, name, dfd, mine) != 0) return 0; /* gone already */
  gg__rec_t again;
  if (gg__reg_read(dfd, mine, name, r->r.pid, gg__my_pidns(), gg__scan_made, &again) == 0 &&
      again.r.stale) {
    GG__ASSERT(again.r.pid == r->r.pid); /* what goes is the record that was judged */
    if (unlinkat(dfd, mine, 0) == 0) ++*(size_t *)user;
  } else if (gg__rename_noreplace(dfd, mine, name) != 0) {
    unlinkat(dfd, mine, 0);
  }
  return 0;
}

int gg_registry_prune(size_t *removed) {
  size_t n = 0;
  int rc = gg__reg_each("gg_registry_prune", gg__prune_one, &n);
  if (removed) *removed = n;
  return rc;
}
