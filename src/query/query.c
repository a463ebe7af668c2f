/* query.c — devices (count, name, UUID, memory) and who holds them (NVML, else device descriptors),
 * joined with /proc. */
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "core/internal.h"
#include "query/nvml.h"
#include "proc/procfs_internal.h"
#include "proc/registry_internal.h"

int gg_device_count(int *count) {
  if (!count) return gg__err(GG_EINVAL, "gg_device_count: count is NULL");
  return gg__dev_count(NULL, count);
}

static void gg__fill_info(gg_device_info_t *info, int device, const char *backend, const gg__dev_props_t *p,
                          size_t free_b, size_t total_b) {
  memset(info, 0, sizeof *info);
  info->index = device;
  gg__strlcpy(info->backend, backend, sizeof info->backend);
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
  /* On CUDA, NVML reads the memory without a context: a context would take ~500 MiB of what is being
   * measured and cost ~100 ms. Without NVML, the primary context is retained for the reading. */
  gg__dev_props_t props;
  if (backend[0] == 'c' && (rc = gg__cuda_props(device, &props)) == 0) {
    size_t total_b = 0, free_b = 0;
    gg__err_saved_t saved;
    gg__err_save(&saved);
    if (gg__nvml_memory(props.uuid, device, &total_b, &free_b) == 0 && free_b <= total_b) {
      gg__fill_info(info, device, "cuda", &props, free_b, total_b);
      return 0;
    }
    gg__err_restore(&saved);
  } else if (rc < 0) {
    return rc;
  }
  gg__dev_t *d = NULL;
  if ((rc = gg__dev_open(backend, device, &d)) < 0) return rc;
  size_t free_b = 0, total_b = 0;
  rc = d->ops->mem_info(d, &free_b, &total_b);
  if (rc == 0) gg__fill_info(info, device, d->ops->name, &d->props, free_b, total_b);
  gg__dev_close(d);
  return rc;
}

int gg_device_telemetry(int device, gg_device_telemetry_t *t) {
  if (!t) return gg__err(GG_EINVAL, "gg_device_telemetry: t is NULL");
  *t = (gg_device_telemetry_t){device, -1, -1, -1, -1, -1};
  if (device < 0) return gg__err(GG_ENODEV, "gg_device_telemetry: device %d does not exist", device);
  gg__dev_props_t props;
  gg__err_saved_t saved;
  gg__err_save(&saved);
  bool have_uuid = gg__cuda_props(device, &props) == 0;
  gg__err_restore(&saved);
  gg__nvml_telemetry_t n;
  int rc = gg__nvml_telemetry(have_uuid ? props.uuid : NULL, device, &n);
  if (rc < 0) return rc;
  t->utilization_gpu = n.util_gpu, t->utilization_memory = n.util_memory, t->temperature_c = n.temperature_c;
  t->power_watts = n.power_mw < 0 ? -1 : (double)n.power_mw / 1e3;
  t->power_limit_watts = n.power_limit_mw < 0 ? -1 : (double)n.power_limit_mw / 1e3;
  return 0;
}

/* ---- who holds the device ----------------------------------------------------------------------------- */

const char *gg_process_class_name(gg_process_class_t cls) {
  switch (cls) {
  case GG_PROCESS_GUARDED: return "guarded";
  case GG_PROCESS_ORPHAN: return "orphan";
  case GG_PROCESS_FD_HOLDER: return "fd-holder";
  case GG_PROCESS_FOREIGN: return "foreign";
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
    row->ppid = st.ppid, row->uid = uid, row->state = st.state, row->start_time = st.start;
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
  unsigned char *foreign; /* per record: written in another pid namespace, its pid means nothing here */
  size_t n;
} gg__sessions_t;

static void gg__sessions_load(gg__sessions_t *s) {
  s->recs = NULL, s->foreign = NULL, s->n = 0;
  gg__err_saved_t saved;
  gg__err_save(&saved);
  size_t want = 0;
  for (int attempt = 0;
       attempt < 3 && gg__registry_list_ns(s->recs, s->foreign, s->n, &want) == 0 && want > s->n; attempt++) {
    gg_session_record_t *grown = realloc(s->recs, (want + 8) * sizeof *grown);
    if (grown) s->recs = grown;
    unsigned char *f = grown ? realloc(s->foreign, want + 8) : NULL;
    if (!f) break;
    s->foreign = f, s->n = want + 8;
  }
  if (want < s->n) s->n = want;
  gg__err_restore(&saved);
}

static void gg__sessions_free(gg__sessions_t *s) {
  free(s->recs);
  free(s->foreign);
}

/* The live record of this very process (pid and start time), from our own pid namespace; or NULL. */
static const gg_session_record_t *gg__live_record(const gg__sessions_t *s, pid_t pid,
                                                  unsigned long long start) {
  for (size_t i = 0; i < s->n; i++)
    if (!s->foreign[i] && !s->recs[i].stale && s->recs[i].pid == pid && s->recs[i].start_time == start)
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

/* Multiprocessing children started by spawn or forkserver say so on their command line. */
static bool gg__looks_like_worker(const char *cmd) {
  return strstr(cmd, "multiprocessing.spawn") || strstr(cmd, "multiprocessing.forkserver") ||
         strstr(cmd, "spawn_main(");
}

/* guarded: part of a live session; orphan: its session's leader is dead, or its parent is gone and it
 * was a worker. Only evidence moves a row out of "unknown". */
static void gg__classify(gg_process_t *row, const gg__sessions_t *s) {
  if (row->cls == GG_PROCESS_FOREIGN || row->state == '?') return;
  const gg_session_record_t *rec = gg__live_record(s, row->pid, row->start_time);
  if (rec)
    gg__strlcpy(row->session, rec->session, sizeof row->session);
  else if (gg__proc_environ_get(row->pid, "GPUGUARD_SESSION", row->session, sizeof row->session) != 0)
    row->session[0] = '\0';
  gg__pinfo_t parent;
  bool parent_gone =
      row->ppid <= 1 || gg__proc_read_stat(row->ppid, &parent) != 0 || (rec && rec->ppid != row->ppid);
  if (row->session[0]) {
    int leader = gg__leader_alive(s, row->session);
    if (rec && strcmp(rec->role, "leader") == 0) leader = 1; /* it is the leader, alive */
    if (leader == 1)
      row->cls = GG_PROCESS_GUARDED;
    else if (leader == 0 || parent_gone)
      row->cls = GG_PROCESS_ORPHAN;
    else
      row->cls = GG_PROCESS_GUARDED;
  } else if (parent_gone && gg__looks_like_worker(row->command)) {
    row->cls = GG_PROCESS_ORPHAN;
  }
}

/* The initial pid namespace's inode (PROC_PID_INIT_INO, fixed by the kernel since 3.8). */
#define GG__INIT_PIDNS_INO 0xEFFFFFFCULL

/* Can NVML's pids be taken as pids of our /proc? In the initial pid namespace they are. In any other (a
 * container) the driver gives host pids (older drivers) or pids of the caller's namespace (newer ones),
 * and nothing says which: pid 40 of the host may be pid 40 here too, another process (issue 16 item 16).
 * GPUGUARD_TEST_PIDNS ("initial" or "child") lets tests choose. */
static bool gg__nvml_pids_local(void) {
  const char *t = gg__env("GPUGUARD_TEST_PIDNS");
  if (t) return strcmp(t, "child") != 0;
  unsigned long long ino = 0;
  return gg__proc_pidns(0, &ino) != 0 || ino == GG__INIT_PIDNS_INO;
}

int gg_process_list(int device, gg_process_t *rows, size_t cap, size_t *count) {
  if (!count) return gg__err(GG_EINVAL, "gg_process_list: count is NULL");
  if (!rows && cap) return gg__err(GG_EINVAL, "gg_process_list: rows is NULL but cap is %zu", cap);
  if (device < 0) return gg__err(GG_ENODEV, "gg_process_list: device %d does not exist", device);
  *count = 0;
  /* Name the device by UUID when the CUDA driver is there, so NVML's order cannot mislead. */
  gg__dev_props_t props;
  gg__err_saved_t saved;
  gg__err_save(&saved);
  bool have_uuid = gg__cuda_props(device, &props) == 0;
  gg__err_restore(&saved);
  return gg__process_list_at(have_uuid ? props.uuid : NULL, device, rows, cap, count);
}

int gg__process_list_at(const char *uuid, int device, gg_process_t *rows, size_t cap, size_t *count) {
  *count = 0;
  gg__err_saved_t saved;
  gg__err_save(&saved);
  bool have_uuid = uuid != NULL;

  gg__gpu_proc_t *gp = NULL;
  size_t ngp = 0, want = 64;
  int minor = -1, rc;
  bool nvml = true;
  for (;;) { /* grow until every process fits */
    gg__gpu_proc_t *grown = realloc(gp, want * sizeof *gp);
    if (!grown) {
      free(gp);
      return gg__err(GG_ENOMEM, "gg_process_list: out of host memory");
    }
    gp = grown;
    rc = gg__nvml_processes(uuid, device, gp, want, &ngp, &minor);
    if (rc < 0 || ngp <= want) break;
    want = ngp + 16;
  }
  if (rc == GG_ENOTSUP && !have_uuid) {
    char why[512]; /* copied: the detail buffer is about to be rewritten */
    gg__strlcpy(why, gg_last_error(), sizeof why);
    free(gp);
    return gg__err(GG_ENODEV,
                   "gg_process_list: no NVIDIA GPU here: neither NVML nor the CUDA driver is usable (%s)",
                   why);
  }
  if (rc == GG_ENOTSUP) { /* a GPU but no NVML: descriptors are all there is to go on */
    nvml = false, ngp = 0, rc = 0;
    gg__err_restore(&saved);
  }
  if (rc < 0) {
    free(gp);
    return rc;
  }
  /* Descriptor holders: processes with the device node open that the driver does not list. */
  char node[64];
  snprintf(node, sizeof node, "/dev/nvidia%d", minor >= 0 ? minor : device);
  int *fdp = NULL;
  size_t nfd = 0;
  if (gg__scan_fd_holders("/proc", node, &fdp, &nfd) < 0) nfd = 0, gg__err_restore(&saved);

  uid_t me = getuid();
  size_t total = 0;
  gg__sessions_t sessions;
  gg__sessions_load(&sessions);
  bool local = gg__nvml_pids_local();
  for (size_t i = 0; i < ngp + nfd; i++) {
    int pid = i < ngp ? (int)gp[i].pid : fdp[i - ngp];
    bool listed = false;
    for (size_t j = 0; i >= ngp && j < ngp && !listed; j++) listed = (int)gp[j].pid == pid;
    if (listed) continue;
    if (total < cap) {
      gg_process_t *row = &rows[total];
      memset(row, 0, sizeof *row);
      row->pid = pid;
      row->device = device;
      row->used_bytes = i < ngp ? gp[i].used : -1;
      row->cls = (i >= ngp && nvml) ? GG_PROCESS_FD_HOLDER : GG_PROCESS_UNKNOWN;
      /* Outside the initial pid namespace a driver's pid is joined with /proc only when that process
       * of ours holds the device open (so it is a GPU process here); the rest are shown unjoined, never
       * as whatever unrelated process has that number here. */
      bool held = local || i >= ngp;
      for (size_t j = 0; !held && j < nfd; j++) held = fdp[j] == pid;
      if (held)
        gg__join_proc(row, me);
      else
        gg__row_unjoined(row);
      if (row->cls != GG_PROCESS_FD_HOLDER) gg__classify(row, &sessions);
    }
    total++;
  }
  free(gp);
  free(fdp);
  gg__sessions_free(&sessions);
  *count = total;
  return 0;
}

/* ---- orphans of dead sessions ------------------------------------------------------------------------- */

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
  gg__classify(&row, w->sessions);
  /* Only proof counts here: the session's leader left a record and it is stale. A session whose
   * leader this registry never saw (another registry directory, another tool) is not ours to judge. */
  if (row.cls == GG_PROCESS_ORPHAN && row.start_time == info->start &&
      gg__leader_alive(w->sessions, row.session) == 0 && !gg__under_live_runner(w->sessions, info->ppid))
    gg__orphan_add(w, &row);
  return 0;
}

int gg_orphan_list(gg_process_t *rows, size_t cap, size_t *count) {
  if (!count) return gg__err(GG_EINVAL, "gg_orphan_list: count is NULL");
  if (!rows && cap) return gg__err(GG_EINVAL, "gg_orphan_list: rows is NULL but cap is %zu", cap);
  gg__sessions_t sessions;
  gg__sessions_load(&sessions);
  gg__orphan_walk_t w = {.sessions = &sessions, .me = getuid(), .self = getpid(), .rows = rows, .cap = cap};
  int rc = gg__proc_walk(gg__orphan_visit, &w);
  gg__sessions_free(&sessions);
  if (rc < 0) return gg__err(GG_EIO, "gg_orphan_list: cannot read /proc: %s", strerror(-rc));
  /* The device memory each holds, where the driver says. */
  gg__err_saved_t saved;
  gg__err_save(&saved);
  int ndev = 0;
  if (w.n && gg__cuda_count(&ndev) != 0) ndev = 0;
  for (int d = 0; d < ndev; d++) {
    gg_process_t got[64];
    size_t n = 0;
    if (gg_process_list(d, got, 64, &n) != 0) continue;
    for (size_t i = 0; i < n && i < 64; i++)
      for (size_t j = 0; j < w.n && j < w.cap; j++)
        if (rows[j].pid == got[i].pid && rows[j].start_time == got[i].start_time)
          rows[j].used_bytes = got[i].used_bytes, rows[j].device = d;
  }
  gg__err_restore(&saved);
  *count = w.n;
  return 0;
}
