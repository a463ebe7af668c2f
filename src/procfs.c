/* procfs.c — reading one process's facts from /proc (the stat line is parsed after the last ')',
 * since a command name may itself contain spaces and parentheses). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "procfs.h"

/* Reads a small /proc file whole; returns bytes read or -1 with errno. */
static ssize_t gg__read_small(const char *path, char *buf, size_t cap) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  size_t n = 0;
  while (n + 1 < cap) {
    ssize_t r = read(fd, buf + n, cap - 1 - n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    n += (size_t)r;
  }
  close(fd);
  buf[n] = '\0';
  return (ssize_t)n;
}

int gg__procfs_stat(const char *root, pid_t pid, gg__procstat_t *out) {
  char path[256], buf[1024];
  snprintf(path, sizeof path, "%s/%d/stat", root, (int)pid);
  if (gg__read_small(path, buf, sizeof buf) < 0)
    return gg__err(GG_ENOTFOUND, "process %d: %s: %s", (int)pid, path, strerror(errno));
  char *open_paren = strchr(buf, '('), *close_paren = strrchr(buf, ')');
  if (!open_paren || !close_paren || close_paren < open_paren)
    return gg__err(GG_EIO, "process %d: %s: unreadable stat line", (int)pid, path);
  memset(out, 0, sizeof *out);
  out->pid = pid;
  size_t clen = (size_t)(close_paren - open_paren - 1);
  if (clen >= sizeof out->comm) clen = sizeof out->comm - 1;
  memcpy(out->comm, open_paren + 1, clen);
  /* After ") ": field 3 state, 4 ppid, 5 pgrp, 6 session, ... 22 starttime. */
  char *p = close_paren + 1, *save = NULL;
  int field = 2;
  for (char *tok = strtok_r(p, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
    field++;
    if (field == 3) out->state = tok[0];
    else if (field == 4) out->ppid = (pid_t)atoi(tok);
    else if (field == 5) out->pgid = (pid_t)atoi(tok);
    else if (field == 6) out->sid = (pid_t)atoi(tok);
    else if (field == 22) {
      out->start_time = strtoull(tok, NULL, 10);
      break;
    }
  }
  if (field != 22) return gg__err(GG_EIO, "process %d: %s: too few fields", (int)pid, path);
  snprintf(path, sizeof path, "%s/%d/status", root, (int)pid);
  if (gg__read_small(path, buf, sizeof buf) < 0)
    return gg__err(GG_ENOTFOUND, "process %d: %s: %s", (int)pid, path, strerror(errno));
  const char *u = strstr(buf, "\nUid:");
  if (!u) return gg__err(GG_EIO, "process %d: %s: no Uid line", (int)pid, path);
  out->uid = (uid_t)strtoul(u + 5, NULL, 10);
  return 0;
}

int gg__procfs_cmdline(const char *root, pid_t pid, char *buf, size_t cap) {
  char path[256];
  if (cap == 0) return gg__err(GG_EINVAL, "gg__procfs_cmdline: no room");
  snprintf(path, sizeof path, "%s/%d/cmdline", root, (int)pid);
  ssize_t n = gg__read_small(path, buf, cap);
  if (n < 0) {
    buf[0] = '\0';
    return gg__err(GG_ENOTFOUND, "process %d: %s: %s", (int)pid, path, strerror(errno));
  }
  while (n > 0 && buf[n - 1] == '\0') n--; /* the trailing NUL of the last argument */
  for (ssize_t i = 0; i < n; i++)
    if (buf[i] == '\0') buf[i] = ' ';
  buf[n] = '\0';
  return 0;
}

bool gg__procfs_same(pid_t pid, unsigned long long start_time) {
  gg__procstat_t st;
  gg__err_saved_t saved;
  gg__err_save(&saved);
  bool same = pid > 0 && gg__procfs_stat("/proc", pid, &st) == 0 && st.start_time == start_time &&
              st.state != 'Z' && st.state != 'X';
  gg__err_restore(&saved);
  return same;
}

/* Only processes this user may inspect are seen (all of them for root). */
int gg__scan_fd_holders(const char *proc_root, const char *target, int **pids, size_t *n) {
  *pids = NULL, *n = 0;
  DIR *d = opendir(proc_root);
  if (!d) return gg__err(GG_EIO, "scanning %s: cannot open it", proc_root);
  size_t cap = 0;
  int rc = 0;
  for (struct dirent *e; rc == 0 && (e = readdir(d));) {
    char *end;
    long pid = strtol(e->d_name, &end, 10);
    if (*end || pid <= 0) continue;
    char fddir[300];
    snprintf(fddir, sizeof fddir, "%s/%ld/fd", proc_root, pid);
    DIR *fds = opendir(fddir);
    if (!fds) continue; /* not ours to read, or gone */
    bool holds = false;
    for (struct dirent *f; !holds && (f = readdir(fds));) {
      if (f->d_name[0] == '.') continue;
      char link[600], dest[512];
      snprintf(link, sizeof link, "%s/%s", fddir, f->d_name);
      ssize_t k = readlink(link, dest, sizeof dest - 1);
      if (k <= 0) continue;
      dest[k] = '\0';
      holds = strcmp(dest, target) == 0;
    }
    closedir(fds);
    if (!holds) continue;
    if (*n == cap) {
      int *grown = realloc(*pids, (cap = cap ? cap * 2 : 16) * sizeof **pids);
      if (!grown) {
        rc = gg__err(GG_ENOMEM, "scanning %s: out of host memory", proc_root);
        break;
      }
      *pids = grown;
    }
    (*pids)[(*n)++] = (int)pid;
  }
  closedir(d);
  if (rc < 0) free(*pids), *pids = NULL, *n = 0;
  return rc;
}
