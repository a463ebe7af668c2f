/* labels.c — what a GPU process belongs to (a Slurm job, a Kubernetes pod), so that the exporter's
 * series join with DCGM's hpc_job and pod labels. Everything here is read from files the process
 * controls, so every value is checked against the narrow syntax it must have before it is used. */
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/internal.h"
#include "proc/procfs_internal.h"
#include "query/labels_internal.h"

/* A Kubernetes pod UID: 36 characters, hex digits and dashes at 8-4-4-4-12 (systemd's slice names
 * write the dashes as underscores). */
static bool gg__is_uid(const char *s) {
  for (int i = 0; i < 36; i++) {
    bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    char c = s[i];
    if (dash ? (c != '-' && c != '_') : !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
      return false;
  }
  return true;
}

bool gg__pod_uid_in(const char *path, char *out, size_t cap) {
  for (const char *p = strstr(path, "pod"); p && cap > 36; p = strstr(p + 3, "pod")) {
    const char *u = p + 3;
    if (strnlen(u, 36) < 36 || !gg__is_uid(u)) continue;
    char end = u[36];
    /* "/podUID/..." (cgroupfs) or "-podUID.slice" (systemd): whole names, not a prefix */
    if (end != '\0' && end != '/' && end != '.' && end != '\n') continue;
    for (int i = 0; i < 36; i++) out[i] = u[i] == '_' ? '-' : u[i];
    out[36] = '\0';
    return true;
  }
  return false;
}

/* A DNS name as Kubernetes names pods (RFC 1123 subdomain: lower-case letters, digits, '-' and '.',
 * at most max characters); dots not allowed in a namespace (label). */
static bool gg__is_dns(const char *s, size_t max, bool dots) {
  size_t n = strlen(s);
  if (n == 0 || n > max) return false;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || (dots && c == '.');
    if (!ok) return false;
  }
  return true;
}

/* The first line of a small regular file inside pid's own root: resolved as that root sees it
 * (RESOLVE_IN_ROOT: a symlink a container plants cannot lead to the host's files), never a FIFO or
 * device (O_NONBLOCK, a regular-file check). 0, or -1. */
static int gg__read_in_root(pid_t pid, const char *rel, char *buf, size_t cap) {
  char root[64];
  snprintf(root, sizeof root, "/proc/%d/root", (int)pid);
  int dfd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return -1;
  struct open_how how = {.flags = O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY,
                         .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS};
  int fd = (int)syscall(SYS_openat2, dfd, rel, &how, sizeof how);
  close(dfd);
  if (fd < 0) return -1;
  struct stat st;
  ssize_t r = -1;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) r = read(fd, buf, cap - 1);
  close(fd);
  if (r < 0) return -1;
  buf[r] = '\0';
  buf[strcspn(buf, "\r\n")] = '\0';
  return 0;
}

/* Every line of /proc/PID/cgroup (v1 hierarchies and the unified one alike) is looked at: on a
 * hybrid host the pod shows in the v1 lines only. */
static void gg__pod_of(pid_t pid, char *uid, size_t cap) {
  char path[64], text[4096];
  snprintf(path, sizeof path, "/proc/%d/cgroup", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ssize_t r = read(fd, text, sizeof text - 1);
  close(fd);
  if (r <= 0) return;
  text[r] = '\0';
  if (!gg__pod_uid_in(text, uid, cap)) uid[0] = '\0';
}

void gg__workload_of(pid_t pid, gg__workload_t *out) {
  memset(out, 0, sizeof *out);
  char v[256];
  if (gg__proc_environ_get(pid, "SLURM_JOB_ID", v, sizeof v) == 0 && v[0] &&
      strlen(v) < sizeof out->job && strspn(v, "0123456789") == strlen(v))
    gg__strlcpy(out->job, v, sizeof out->job);
  gg__pod_of(pid, out->pod_uid, sizeof out->pod_uid);
  if (!out->pod_uid[0]) return;
  /* The kubelet writes the pod's name as its hostname, and mounts the service account's namespace
   * (unless automounting is off): both inside the container, read through its root. */
  if (gg__read_in_root(pid, "/etc/hostname", v, sizeof v) == 0 && gg__is_dns(v, 253, true))
    gg__strlcpy(out->pod, v, sizeof out->pod);
  if (gg__read_in_root(pid, "/var/run/secrets/kubernetes.io/serviceaccount/namespace", v,
                       sizeof v) == 0 &&
      gg__is_dns(v, 63, false))
    gg__strlcpy(out->namespace, v, sizeof out->namespace);
}
