/* query.c — devices (count, name, UUID, memory) and who holds them (the device family's telemetry,
 * else device descriptors), joined with /proc. Every device question goes to the backend table. */
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "core/internal.h"
#include "proc/procfs_internal.h"
#include "proc/registry_internal.h"
#include "query/classify_internal.h"
#include "query/query_internal.h"

int gg_device_count(int *count) {
  if (!count) return gg__err(GG_EINVAL, "gg_device_count: count is NULL");
  return gg__dev_count(NULL, count);
}

void gg__fill_info(gg_device_info_t *info, int device, const gg__family_t *f,
                   const gg__dev_props_t *p, size_t free_b, size_t total_b) {
  memset(info, 0, sizeof *info);
  info->index = device;
  gg__strlcpy(info->backend, f->name, sizeof info->backend);
  info->simulated = f->simulated;
  gg__strlcpy(info->name, p->name, sizeof info->name);
  gg__strlcpy(info->uuid, p->uuid, sizeof info->uuid);
  info->total_bytes = total_b;
  info->free_bytes = free_b;
  info->used_bytes = total_b - free_b;
  info->cc_major = p->cc_major;
  info->cc_minor = p->cc_minor;
  info->driver_version = p->driver_version;
  info->vmm_supported = p->vmm;
}

int gg_device_info(int device, gg_device_info_t *info) {
  if (!info) return gg__err(GG_EINVAL, "gg_device_info: info is NULL");
  const char *backend;
  int rc = gg__backend_resolve(NULL, device, &backend);
  if (rc < 0) return rc;
  /* With telemetry, the memory is read without a context: a context would take ~500 MiB of what
   * is being measured and cost ~100 ms. Without, the primary context is retained for the
   * reading. */
  const gg__family_t *f = gg__family(backend);
  gg__dev_props_t props;
  if (f->telemetry) rc = f->props(device, &props);
  if (f->telemetry && rc == 0) {
    size_t total_b = 0, free_b = 0;
    gg__err_saved_t saved;
    gg__err_save(&saved);
    if (f->telemetry->memory(props.uuid, device, &total_b, &free_b) == 0 && free_b <= total_b) {
      gg__fill_info(info, device, f, &props, free_b, total_b);
      return 0;
    }
    gg__err_restore(&saved);
  } else if (rc < 0) {
    return rc;
  }
  gg__dev_t *d = NULL;
  rc = gg__dev_open(backend, device, &d);
  if (rc < 0) return rc;
  size_t free_b = 0, total_b = 0;
  rc = d->ops->mem_info(d, &free_b, &total_b);
  if (rc == 0) gg__fill_info(info, device, f, &d->props, free_b, total_b);
  gg__dev_close(d);
  return rc;
}

/* The UUID device `device` of the GPU family has, when its driver is there (NULL otherwise: the
 * telemetry then names it by its own index). */
static const char *gg__gpu_uuid(const gg__family_t *g, int device, gg__dev_props_t *props) {
  gg__err_saved_t saved;
  gg__err_save(&saved);
  bool have = g->props(device, props) == 0;
  gg__err_restore(&saved);
  return have ? props->uuid : NULL;
}

int gg_device_telemetry(int device, gg_device_telemetry_t *t) {
  if (!t) return gg__err(GG_EINVAL, "gg_device_telemetry: t is NULL");
  *t = (gg_device_telemetry_t){device, -1, -1, -1, -1, -1};
  if (device < 0)
    return gg__err(GG_ENODEV, "gg_device_telemetry: device %d does not exist", device);
  const gg__family_t *g = gg__gpu_family();
  if (!g->telemetry)
    return gg__err(GG_ENOTSUP, "gg_device_telemetry: the %s backend has no telemetry", g->name);
  gg__dev_props_t props;
  gg__readings_t n;
  int rc = g->telemetry->readings(gg__gpu_uuid(g, device, &props), device, &n);
  if (rc < 0) return rc;
  gg__telemetry_from(t, device, &n);
  return 0;
}

void gg__telemetry_from(gg_device_telemetry_t *t, int index, const gg__readings_t *r) {
  *t = (gg_device_telemetry_t){index,
                               r->util_gpu,
                               r->util_memory,
                               r->temperature_c,
                               r->power_mw < 0 ? -1 : (double)r->power_mw / 1e3,
                               r->power_limit_mw < 0 ? -1 : (double)r->power_limit_mw / 1e3};
}

/* ---- who holds the device -------------------------------------------------------------------- */

const char *gg_process_class_name(gg_process_class_t cls) {
  switch (cls) {
  case GG_PROCESS_GUARDED: return "guarded";
  case GG_PROCESS_ORPHAN: return "orphan";
  case GG_PROCESS_FD_HOLDER: return "fd-holder";
  case GG_PROCESS_FOREIGN: return "foreign";
  case GG_PROCESS_STRANDED: return "stranded";
  case GG_PROCESS_DETACHED: return "detached";
  case GG_PROCESS_UNKNOWN: break;
  }
  return "unknown";
}

/* A row whose pid names no process we can tell: only the driver's figures are known. */
static void gg__row_unjoined(gg_process_t *row) {
  row->state = '?';
  snprintf(row->user, sizeof row->user, "?");
}

/* Fills the /proc side of a row and a first classification (the session registry refines it). */
static void gg__join_proc(gg_process_t *row, uid_t me) {
  gg__pinfo_t st;
  uid_t uid = 0;
  if (gg__proc_read_stat(row->pid, &st) == 0 && gg__proc_uid(row->pid, &uid) == 0) {
    row->ppid = st.ppid;
    row->uid = uid;
    row->state = st.state;
    row->start_time = st.start;
    gg__proc_cmdline(row->pid, row->command, sizeof row->command);
    struct passwd pw, *res = NULL;
    char pwbuf[1024];
    if (getpwuid_r(uid, &pw, pwbuf, sizeof pwbuf, &res) == 0 && res)
      gg__strlcpy(row->user, pw.pw_name, sizeof row->user);
    else
      snprintf(row->user, sizeof row->user, "%u", (unsigned)uid);
    if (uid != me) row->cls = GG_PROCESS_FOREIGN;
  } else {
    gg__row_unjoined(row); /* another PID namespace (a container) or already gone */
  }
}

/* The session registry, read once per listing; an unreadable registry just means no sessions. */
typedef struct gg__sessions {
  gg_session_record_t *recs;
  /* per record: written in another pid namespace, its pid means nothing here */
  unsigned char *foreign;
  size_t n;
} gg__sessions_t;

static void gg__sessions_load(gg__sessions_t *s) {
  s->recs = NULL;
  s->foreign = NULL;
  s->n = 0;
  gg__err_saved_t saved;
  gg__err_save(&saved);
  size_t want = 0;
  for (int attempt = 0;
       attempt < 3 && gg__registry_list_ns(s->recs, s->foreign, s->n, &want) == 0 && want > s->n;
       attempt++) {
    gg_session_record_t *grown = realloc(s->recs, (want + 8) * sizeof *grown);
    if (grown) s->recs = grown;
    unsigned char *f = grown ? realloc(s->foreign, want + 8) : NULL;
    if (!f) break;
    s->foreign = f;
    s->n = want + 8;
  }
  if (want < s->n) s->n = want;
  gg__err_restore(&saved);
}

static void gg__sessions_free(gg__sessions_t *s) {
  free(s->recs);
  free(s->foreign);
}

/* The live record of this very process (pid and start time), from our own pid namespace; or
 * NULL. */
static const gg_session_record_t *gg__live_record(const gg__sessions_t *s, pid_t pid,
                                                  unsigned long long start) {
  for (size_t i = 0; i < s->n; i++)
    if (!s->foreign[i] && !s->recs[i].stale && s->recs[i].pid == pid &&
        s->recs[i].start_time == start)
      return &s->recs[i];
  return NULL;
}

/* Whether pid or one of its ancestors is a live gpuguard process of ours (it has a live record): a
 * runner that is alive tears its own job down, whatever session id the job carries (a command can
 * give its children any GPUGUARD_SESSION). Bounded walk. */
static bool gg__under_live_runner(const gg__sessions_t *s, pid_t pid) {
  gg__pinfo_t info;
  for (int depth = 0; depth < 64 && pid > 1 && gg__proc_read_stat(pid, &info) == 0; depth++) {
    if (gg__live_record(s, pid, info.start)) return true;
    pid = info.ppid;
  }
  return false;
}

/* Leader of a session: 1 alive, 0 dead (its record is stale), -1 unknown (no record). */
static int gg__leader_alive(const gg__sessions_t *s, const char *session) {
  int state = -1;
  for (size_t i = 0; i < s->n; i++)
    if (strcmp(s->recs[i].session, session) == 0 && strcmp(s->recs[i].role, "leader") == 0) {
      if (!s->recs[i].stale) return 1;
      state = 0;
    }
  return state;
}

/* guarded: part of a live session; orphan: its session's leader is dead (or unknown and its parent
 * gone); for a process without a session, stranded, detached or unknown (classify.c). Another
 * user's process is judged only by root (who can read its environment), and only without a session:
 * their sessions are in their own registry. The evidence goes to row->why. */
static void gg__classify(gg_process_t *row, const gg__sessions_t *s, uid_t me) {
  if (row->state == '?') return;
  bool foreign = row->cls == GG_PROCESS_FOREIGN;
  if (foreign && me != 0) return;
  const gg_session_record_t *rec = foreign ? NULL : gg__live_record(s, row->pid, row->start_time);
  if (rec)
    gg__strlcpy(row->session, rec->session, sizeof row->session);
  else if (gg__proc_environ_get(row->pid, "GPUGUARD_SESSION", row->session, sizeof row->session) !=
           0)
    row->session[0] = '\0';
  if (foreign) {
    gg_process_class_t c = row->session[0] ? GG_PROCESS_UNKNOWN : gg__classify_unsessioned(row);
    row->cls = c == GG_PROCESS_STRANDED || c == GG_PROCESS_DETACHED ? c : GG_PROCESS_FOREIGN;
    return;
  }
  if (!row->session[0]) {
    row->cls = gg__classify_unsessioned(row);
    return;
  }
  gg__pinfo_t parent;
  bool parent_gone = row->ppid <= 1 || gg__proc_read_stat(row->ppid, &parent) != 0 ||
                     (rec && rec->ppid != row->ppid);
  int leader = gg__leader_alive(s, row->session);
  if (rec && strcmp(rec->role, "leader") == 0) leader = 1; /* it is the leader, alive */
  if (leader == 1) {
    row->cls = GG_PROCESS_GUARDED;
    snprintf(row->why, sizeof row->why, "session %.8s: its leader is alive", row->session);
  } else if (leader == 0) {
    row->cls = GG_PROCESS_ORPHAN;
    snprintf(row->why, sizeof row->why,
             "session %.8s: its leader died (its registry record is stale)", row->session);
  } else if (parent_gone) {
    row->cls = GG_PROCESS_ORPHAN;
    snprintf(row->why, sizeof row->why,
             "session %.8s, whose leader this registry never saw; its parent is gone",
             row->session);
  } else {
    row->cls = GG_PROCESS_GUARDED;
    snprintf(row->why, sizeof row->why,
             "session %.8s (leader not in this registry); its parent %d is alive", row->session,
             row->ppid);
  }
}

/* The initial pid namespace's inode (PROC_PID_INIT_INO, fixed by the kernel since 3.8). */
#define GG__INIT_PIDNS_INO 0xEFFFFFFCULL

/* Can NVML's pids be taken as pids of our /proc? In the initial pid namespace they are. In any
 * other (a container) the driver gives host pids (older drivers) or pids of the caller's namespace
 * (newer ones), and nothing says which: pid 40 of the host may be pid 40 here too, another process.
 * In test builds only (GG_TESTING, the static library the tests link), GPUGUARD_TEST_PIDNS
 * ("initial" or "child") chooses: the shipped library never lets the environment decide what reap
 * may end. */
static bool gg__nvml_pids_local(void) {
#ifdef GG_TESTING
  const char *t = gg__env("GPUGUARD_TEST_PIDNS");
  if (t) return strcmp(t, "child") != 0;
#endif
  unsigned long long ino = 0;
  return gg__proc_pidns(0, &ino) != 0 || ino == GG__INIT_PIDNS_INO;
}

int gg_process_list(int device, gg_process_t *rows, size_t cap, size_t *count) {
  if (!count) return gg__err(GG_EINVAL, "gg_process_list: count is NULL");
  if (!rows && cap) return gg__err(GG_EINVAL, "gg_process_list: rows is NULL but cap is %zu", cap);
  if (device < 0) return gg__err(GG_ENODEV, "gg_process_list: device %d does not exist", device);
  *count = 0;
  /* Name the device by UUID when its driver is there, so the telemetry's order cannot mislead. */
  gg__dev_props_t props;
  const gg__family_t *g = gg__gpu_family();
  return gg__process_list_at(gg__gpu_uuid(g, device, &props), device, rows, cap, count);
}

/* The driver's list of processes with a context on the device, grown until all fit, into *out
 * (freed by the caller). A GPU without NVML gives an empty list (*nvml false): its descriptors are
 * all there is to go on then; neither NVML nor the driver is GG_ENODEV. *minor: the device node's
 * number, -1 when NVML did not say. */
static int gg__driver_processes(const gg__family_t *g, const char *uuid, int device,
                                gg__gpu_proc_t **out, size_t *n, int *minor, bool *nvml) {
  gg__err_saved_t saved;
  gg__err_save(&saved);
  size_t want = 64;
  int rc;
  *out = NULL;
  *n = 0;
  *minor = -1;
  *nvml = true;
  for (;;) { /* grow until every process fits */
    gg__gpu_proc_t *grown = realloc(*out, want * sizeof **out);
    if (!grown) return gg__err(GG_ENOMEM, "gg_process_list: out of host memory");
    *out = grown;
    rc = g->telemetry ? g->telemetry->processes(uuid, device, *out, want, n, minor)
                      : gg__err(GG_ENOTSUP, "the %s backend has no telemetry", g->name);
    if (rc < 0 || *n <= want) break;
    want = *n + 16;
  }
  if (rc == GG_ENOTSUP && !uuid) {
    char why[512]; /* copied: the detail buffer is about to be rewritten */
    gg__strlcpy(why, gg_last_error(), sizeof why);
    return gg__err(
        GG_ENODEV,
        "gg_process_list: no NVIDIA GPU here: neither NVML nor the CUDA driver is usable (%s)",
        why);
  }
  if (rc == GG_ENOTSUP) { /* a GPU but no NVML: descriptors are all there is to go on */
    *nvml = false;
    *n = 0;
    rc = 0;
    gg__err_restore(&saved);
  }
  return rc;
}

/* What every row of one device's listing is joined and classified with. */
typedef struct gg__listing {
  const gg__family_t *family; /* the GPU family: its device files are the descriptors' evidence */
  int device;
  bool nvml;      /* the driver's list came from NVML (else descriptors are all there is) */
  bool local;     /* gg__nvml_pids_local() */
  const int *fdp; /* every holder of the device node */
  size_t nfd;
  gg__sessions_t sessions;
  uid_t me;
} gg__listing_t;

/* Fills row for pid: joined with /proc where that names the same process, then classified. fd_only:
 * a descriptor holder the driver does not list. */
static void gg__fill_row(gg_process_t *row, const gg__listing_t *l, int pid, long long used,
                         bool fd_only) {
  memset(row, 0, sizeof *row);
  row->pid = pid;
  row->device = l->device;
  row->used_bytes = used;
  row->cls = (fd_only && l->nvml) ? GG_PROCESS_FD_HOLDER : GG_PROCESS_UNKNOWN;
  /* Outside the initial pid namespace a driver's pid is joined with /proc only when that process
   * of ours holds the device open (so it is a GPU process here); the rest are shown unjoined, never
   * as whatever unrelated process has that number here. */
  bool held = l->local || fd_only;
  for (size_t j = 0; !held && j < l->nfd; j++) held = l->fdp[j] == pid;
  if (held)
    gg__join_proc(row, l->me);
  else
    gg__row_unjoined(row);
  if (row->cls != GG_PROCESS_FD_HOLDER) {
    gg__classify(row, &l->sessions, l->me);
  } else if (row->state != '?') { /* a worker holding inherited descriptors is still stranded */
    gg__classify(row, &l->sessions, l->me);
    if (row->cls != GG_PROCESS_STRANDED && row->cls != GG_PROCESS_ORPHAN) {
      row->cls = GG_PROCESS_FD_HOLDER;
      snprintf(row->why, sizeof row->why, "holds %s* descriptors but no context the driver lists",
               l->family->device_files[0]);
    }
  }
}

int gg__process_list_at(const char *uuid, int device, gg_process_t *rows, size_t cap,
                        size_t *count) {
  *count = 0;
  gg__err_saved_t saved;
  gg__err_save(&saved);
  gg__gpu_proc_t *gp = NULL;
  size_t ngp = 0;
  int minor = -1;
  bool nvml = true;
  const gg__family_t *g = gg__gpu_family();
  int rc = gg__driver_processes(g, uuid, device, &gp, &ngp, &minor, &nvml);
  if (rc < 0) {
    free(gp);
    return rc;
  }
  /* Descriptor holders: processes with the device node open that the driver does not list. */
  char node[64];
  g->device_node(minor, device, node, sizeof node);
  int *fdp = NULL;
  size_t nfd = 0;
  if (gg__scan_fd_holders("/proc", node, &fdp, &nfd) < 0) {
    nfd = 0;
    gg__err_restore(&saved);
  }

  gg__listing_t l = {
      .family = g, .device = device, .nvml = nvml, .fdp = fdp, .nfd = nfd, .me = getuid()};
  size_t total = 0;
  gg__sessions_load(&l.sessions);
  l.local = gg__nvml_pids_local();
  for (size_t i = 0; i < ngp + nfd; i++) {
    int pid = i < ngp ? (int)gp[i].pid : fdp[i - ngp];
    bool listed = false;
    for (size_t j = 0; i >= ngp && j < ngp && !listed; j++) listed = (int)gp[j].pid == pid;
    if (listed) continue;
    if (total < cap) gg__fill_row(&rows[total], &l, pid, i < ngp ? gp[i].used : -1, i >= ngp);
    total++;
  }
  free(gp);
  free(fdp);
  gg__sessions_free(&l.sessions);
  *count = total;
  return 0;
}

/* ---- orphans of dead sessions ---------------------------------------------------------------- */

typedef struct gg__orphan_walk {
  const gg__sessions_t *sessions;
  uid_t me;
  pid_t self;
  gg_process_t *rows;
  size_t cap, n;
} gg__orphan_walk_t;

static void gg__orphan_add(gg__orphan_walk_t *w, const gg_process_t *row) {
  for (size_t i = 0; i < w->n && i < w->cap; i++)
    if (w->rows[i].pid == row->pid) return; /* already listed (from another device) */
  if (w->n < w->cap) w->rows[w->n] = *row;
  w->n++;
}

/* Every process of ours that carries a session id is judged as a GPU process would be. */
static int gg__orphan_visit(const gg__pinfo_t *info, void *user) {
  gg__orphan_walk_t *w = user;
  uid_t uid;
  char session[40];
  if (info->pid == w->self || gg__proc_uid(info->pid, &uid) != 0 || uid != w->me) return 0;
  if (gg__proc_environ_get(info->pid, "GPUGUARD_SESSION", session, sizeof session) != 0) return 0;
  gg_process_t row;
  memset(&row, 0, sizeof row);
  row.pid = info->pid;
  row.device = -1;
  row.used_bytes = -1;
  gg__join_proc(&row, w->me);
  gg__classify(&row, w->sessions, w->me);
  /* Only proof counts here: the session's leader left a record and it is stale. A session whose
   * leader this registry never saw (another registry directory, another tool) is not ours to
   * judge. */
  if (row.cls == GG_PROCESS_ORPHAN && row.start_time == info->start &&
      gg__leader_alive(w->sessions, row.session) == 0 &&
      !gg__under_live_runner(w->sessions, info->ppid))
    gg__orphan_add(w, &row);
  return 0;
}

int gg_orphan_list(gg_process_t *rows, size_t cap, size_t *count) {
  if (!count) return gg__err(GG_EINVAL, "gg_orphan_list: count is NULL");
  if (!rows && cap) return gg__err(GG_EINVAL, "gg_orphan_list: rows is NULL but cap is %zu", cap);
  gg__sessions_t sessions;
  gg__sessions_load(&sessions);
  gg__orphan_walk_t w = {
      .sessions = &sessions, .me = getuid(), .self = getpid(), .rows = rows, .cap = cap};
  int rc = gg__proc_walk(gg__orphan_visit, &w);
  gg__sessions_free(&sessions);
  if (rc < 0) return gg__err(GG_EIO, "gg_orphan_list: cannot read /proc: %s", strerror(-rc));
  /* The device memory each holds, where the driver says. */
  gg__err_saved_t saved;
  gg__err_save(&saved);
  gg__gpus_t gpus = {0}; /* counted once for every GPU's question */
  int ndev = 0;
  if (w.n && gg__gpus_load(&gpus, "gg_gpu_count", GG__GPUS_COUNT) == 0) ndev = gpus.n;
  for (int d = 0; d < ndev; d++) {
    gg_process_t got[64];
    size_t n = 0;
    if (gg__gpus_processes(&gpus, d, got, 64, &n) != 0) continue;
    for (size_t i = 0; i < n && i < 64; i++)
      for (size_t j = 0; j < w.n && j < w.cap; j++)
        if (rows[j].pid == got[i].pid && rows[j].start_time == got[i].start_time) {
          rows[j].used_bytes = got[i].used_bytes;
          rows[j].device = d;
        }
  }
  gg__gpus_free(&gpus);
  gg__err_restore(&saved);
  *count = w.n;
  return 0;
}

int gg_process_describe(int pid, gg_process_t *row) {
  if (!row) return gg__err(GG_EINVAL, "gg_process_describe: row is NULL");
  if (pid <= 0) return gg__err(GG_EINVAL, "gg_process_describe: pid %d is not a process", pid);
  memset(row, 0, sizeof *row);
  row->pid = pid;
  row->device = -1;
  row->used_bytes = -1;
  gg__join_proc(row, getuid());
  if (row->state == '?') return gg__err(GG_ENOTFOUND, "gg_process_describe: no process %d", pid);
  gg__sessions_t sessions;
  gg__sessions_load(&sessions);
  gg__classify(row, &sessions, getuid());
  gg__sessions_free(&sessions);
  return 0;
}

/* Adds row unless its pid is listed already (among the n written); false when it was. */
static bool gg__reap_add(gg_process_t *rows, size_t cap, size_t *n, const gg_process_t *row) {
  for (size_t i = 0; i < *n; i++)
    if (rows[i].pid == row->pid) return false;
  if (*n < cap) rows[(*n)++] = *row;
  return true;
}

int gg_reap_list(unsigned flags, gg_process_t *rows, size_t cap, size_t *count) {
  if (!count) return gg__err(GG_EINVAL, "gg_reap_list: count is NULL");
  if (!rows && cap) return gg__err(GG_EINVAL, "gg_reap_list: rows is NULL but cap is %zu", cap);
  if (flags & ~(unsigned)GG_REAP_ALL_USERS)
    return gg__err(GG_EINVAL, "gg_reap_list: unknown flags 0x%x", flags);
  bool all = flags & GG_REAP_ALL_USERS;
  if (all && geteuid() != 0)
    return gg__err(GG_EPERM, "gg_reap_list: other users' processes only as root (euid %u)",
                   (unsigned)geteuid());
  *count = 0;
  size_t n = 0;
  int rc = gg_orphan_list(rows, cap, &n);
  if (rc < 0) return rc;
  size_t total = n; /* those beyond cap are counted; only those written are compared below */
  if (n > cap) n = cap;
  gg__err_saved_t saved;
  gg__err_save(&saved);
  gg__gpus_t gpus; /* every GPU NVML reports, whether CUDA here sees it or not; counted once */
  int ndev = 0;
  if (gg__gpus_load(&gpus, "gg_gpu_count", GG__GPUS_COUNT) == 0) ndev = gpus.n;
  uid_t me = getuid();
  pid_t self = getpid();
  size_t want = 32;
  gg_process_t *got = NULL;
  for (int d = 0; d < ndev; d++) {
    size_t k = 0;
    for (int attempt = 0; attempt < 4; attempt++) {
      gg_process_t *grown = realloc(got, want * sizeof *grown);
      if (!grown) {
        free(got);
        gg__gpus_free(&gpus);
        return gg__err(GG_ENOMEM, "gg_reap_list: out of host memory");
      }
      got = grown;
      if (gg__gpus_processes(&gpus, d, got, want, &k) != 0) k = 0;
      if (k <= want) break;
      want = k + 16;
    }
    for (size_t i = 0; i < k && i < want; i++) {
      const gg_process_t *p = &got[i];
      if (p->pid == self || (p->cls != GG_PROCESS_STRANDED && p->cls != GG_PROCESS_ORPHAN))
        continue;
      if (p->uid != me && !all) continue;
      if (gg__reap_add(rows, cap, &n, p)) total++;
    }
  }
  free(got);
  gg__gpus_free(&gpus);
  gg__err_restore(&saved);
  *count = total;
  return 0;
}
