/* procfs.c — reading /proc: a process's identity (state, parent, group, start time), its owner and
 * command line, walking the process table, and closing descriptors by target path. Everything here
 * that the fatal path or a just-forked child uses is async-signal-safe:
 * open/read/getdents64/readlink, stack buffers, no malloc, no stdio, no locks. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "backend/backend.h"
#include "core/internal.h"
#include "proc/procfs_internal.h"
#include "core/vec_internal.h"

/* Writes "/proc/<pid>/<leaf>" without snprintf (not async-signal-safe). */
static void gg__proc_path(char *buf, size_t cap, pid_t pid, const char *leaf) {
  char digits[24];
  size_t n = 0, at = 0;
  unsigned long v = (unsigned long)pid;
  do {
    digits[n++] = (char)('0' + v % 10);
    v /= 10;
  } while (v && n < sizeof digits);
  const char *pre = "/proc/";
  for (const char *p = pre; *p && at + 1 < cap; p++) buf[at++] = *p;
  while (n && at + 1 < cap) buf[at++] = digits[--n];
  if (at + 1 < cap) buf[at++] = '/';
  for (const char *p = leaf; *p && at + 1 < cap; p++) buf[at++] = *p;
  buf[at] = '\0';
}

/* Reads a whole small file into buf (NUL-terminated); returns the length or -errno. A process that
 * is reaped between the open and the read makes the read fail with ESRCH: that is -ESRCH (gone),
 * not an empty file. */
static ssize_t gg__read_small(const char *path, char *buf, size_t cap) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  size_t len = 0;
  int err = 0;
  while (len + 1 < cap) {
    ssize_t r = read(fd, buf + len, cap - 1 - len);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) err = errno;
    if (r <= 0) break;
    len += (size_t)r;
  }
  close(fd);
  buf[len] = '\0';
  return err ? -err : (ssize_t)len;
}

/* Parses one signed decimal at *p, moving past it and the following spaces. */
static long long gg__take_num(const char **p) {
  const char *s = *p;
  int neg = 0;
  long long v = 0;
  if (*s == '-') {
    neg = 1;
    s++;
  }
  while (*s >= '0' && *s <= '9') v = v * 10 + (*s++ - '0');
  while (*s && *s != ' ') s++; /* tolerate anything odd in a field we do not need */
  while (*s == ' ') s++;
  *p = s;
  return neg ? -v : v;
}

static int gg__stat_at(const char *path, pid_t pid, gg__pinfo_t *out);

int gg__proc_read_stat(pid_t pid, gg__pinfo_t *out) {
  char path[64];
  gg__proc_path(path, sizeof path, pid, "stat");
  return gg__stat_at(path, pid, out);
}

int gg__proc_read_self(gg__pinfo_t *out) { return gg__stat_at("/proc/self/stat", getpid(), out); }

bool gg__proc_is_ancestor(pid_t pid) {
  gg__pinfo_t info;
  pid_t p = getppid();
  for (int depth = 0; depth < 4096 && p > 0; depth++) {
    if (p == pid) return true;
    if (gg__proc_read_stat(p, &info) != 0) return false;
    p = info.ppid;
  }
  return false;
}

static int gg__stat_at(const char *path, pid_t pid, gg__pinfo_t *out) {
  char buf[1024];
  ssize_t len = gg__read_small(path, buf, sizeof buf);
  if (len < 0) return (int)len;
  /* The command name (field 2) may hold spaces and ')' itself: parse after the LAST ')'. */
  const char *close = NULL;
  for (const char *p = buf; *p; p++)
    if (*p == ')') close = p;
  if (!close || close[1] != ' ' || !close[2]) return -EINVAL;
  const char *p = close + 2;
  out->pid = pid;
  out->state = *p;
  while (*p && *p != ' ') p++;
  while (*p == ' ') p++;
  out->ppid = (pid_t)gg__take_num(&p); /* field 4 */
  out->pgrp = (pid_t)gg__take_num(&p); /* 5 */
  out->sid = (pid_t)gg__take_num(&p);  /* 6 */
  for (int field = 7; field < 22 && *p; field++) (void)gg__take_num(&p);
  if (!*p) return -EINVAL;
  out->start = (unsigned long long)gg__take_num(&p); /* 22: start time, clock ticks after boot */
  return 0;
}

int gg__proc_uid(pid_t pid, uid_t *uid) {
  char path[64], buf[2048];
  gg__proc_path(path, sizeof path, pid, "status");
  ssize_t len = gg__read_small(path, buf, sizeof buf);
  if (len < 0) return (int)len;
  /* A plain scan rather than strstr(): the fatal path asks this too (async-signal-safe). */
  const char *line = buf;
  while (*line &&
         !(line[0] == '\n' && line[1] == 'U' && line[2] == 'i' && line[3] == 'd' && line[4] == ':'))
    line++;
  if (!*line) return -EINVAL;
  const char *p = line + 5;
  while (*p == '\t' || *p == ' ') p++;
  if (*p < '0' || *p > '9') return -EINVAL;
  *uid = (uid_t)gg__take_num(&p); /* the real uid: who started it */
  return 0;
}

int gg__proc_pidns(pid_t pid, unsigned long long *ino) {
  char path[64], link[64];
  if (pid == 0)
    gg__strlcpy(path, "/proc/self/ns/pid", sizeof path);
  else
    gg__proc_path(path, sizeof path, pid, "ns/pid");
  ssize_t n = readlink(path, link, sizeof link - 1);
  if (n < 0) return -errno;
  link[n] = '\0';
  unsigned long long v = 0;
  const char *p = link;
  if (strncmp(p, "pid:[", 5) != 0) return -EINVAL;
  for (p += 5; *p >= '0' && *p <= '9'; p++) v = v * 10 + (unsigned long long)(*p - '0');
  if (*p != ']' || v == 0) return -EINVAL;
  *ino = v;
  return 0;
}

int gg__proc_nspid(pid_t pid, pid_t *outer, pid_t *inner, int *levels) {
  char path[64], buf[4096];
  if (pid == 0)
    gg__strlcpy(path, "/proc/self/status", sizeof path);
  else
    gg__proc_path(path, sizeof path, pid, "status");
  ssize_t len = gg__read_small(path, buf, sizeof buf);
  if (len < 0) return (int)len;
  const char *line = strstr(buf, "\nNSpid:");
  if (!line) return -ENOTSUP; /* kernels before 4.1 */
  const char *p = line + 7;
  int n = 0;
  for (;;) {
    while (*p == '\t' || *p == ' ') p++;
    if (*p < '0' || *p > '9') break;
    long long v = 0;
    while (*p >= '0' && *p <= '9' && v < 1LL << 32) v = v * 10 + (*p++ - '0');
    if (v <= 0 || v > INT_MAX) return -EINVAL;
    if (n++ == 0) *outer = (pid_t)v;
    *inner = (pid_t)v;
  }
  if (n == 0) return -EINVAL;
  if (levels) *levels = n;
  return 0;
}

void gg__proc_cmdline(pid_t pid, char *buf, size_t cap) {
  char path[64];
  if (cap == 0) return;
  gg__proc_path(path, sizeof path, pid, "cmdline");
  ssize_t len = gg__read_small(path, buf, cap);
  if (len <= 0) { /* a zombie or kernel thread: the short name from stat, in brackets as ps does */
    char stat[1024];
    gg__proc_path(path, sizeof path, pid, "stat");
    buf[0] = '\0';
    if (gg__read_small(path, stat, sizeof stat) > 0) {
      const char *a = strchr(stat, '('), *b = strrchr(stat, ')');
      if (a && b && b > a) snprintf(buf, cap, "[%.*s]", (int)(b - a - 1), a + 1);
    }
    return;
  }
  while (len > 0 && buf[len - 1] == '\0') len--; /* arguments are NUL-separated, last one too */
  for (ssize_t i = 0; i < len; i++)
    if (buf[i] == '\0') buf[i] = ' ';
  if ((size_t)len == cap - 1)
    len = (ssize_t)gg__utf8_whole(buf, (size_t)len); /* maybe cut: whole characters */
  buf[len] = '\0';
}

ssize_t gg__proc_argv(pid_t pid, char *buf, size_t cap) {
  char path[64];
  if (cap < 2) return -EINVAL;
  gg__proc_path(path, sizeof path, pid, "cmdline");
  return gg__read_small(path, buf, cap); /* NUL-terminated at len even when cut */
}

int gg__proc_comm(pid_t pid, char *buf, size_t cap) {
  char path[64];
  gg__proc_path(path, sizeof path, pid, "comm");
  ssize_t len = gg__read_small(path, buf, cap);
  if (len < 0) return (int)len;
  while (len > 0 && buf[len - 1] == '\n') buf[--len] = '\0';
  return 0;
}

int gg__proc_exe(pid_t pid, char *buf, size_t cap) {
  char path[64];
  if (cap < 2) return -EINVAL;
  gg__proc_path(path, sizeof path, pid, "exe");
  ssize_t n = readlink(path, buf, cap - 1);
  if (n < 0) return -errno;
  buf[n] = '\0';
  return 0;
}

int gg__proc_sigign(pid_t pid, unsigned long long *mask) {
  char path[64], buf[4096];
  gg__proc_path(path, sizeof path, pid, "status");
  ssize_t len = gg__read_small(path, buf, sizeof buf);
  if (len < 0) return (int)len;
  const char *line = strstr(buf, "\nSigIgn:");
  if (!line) return -EINVAL;
  char *end = NULL;
  *mask = strtoull(line + 8, &end, 16);
  return end == line + 8 ? -EINVAL : 0;
}

int gg__proc_flags(pid_t pid, unsigned long long *flags) {
  char path[64], buf[1024];
  gg__proc_path(path, sizeof path, pid, "stat");
  if (gg__read_small(path, buf, sizeof buf) < 0) return -ENOENT;
  const char *p = strrchr(buf, ')');
  if (!p || p[1] != ' ') return -EINVAL;
  p += 2;
  for (int field = 3; field < 9 && *p; field++) (void)gg__take_num(&p); /* state is field 3 */
  if (*p < '0' || *p > '9') return -EINVAL;
  *flags = (unsigned long long)gg__take_num(&p);
  return 0;
}

int gg__proc_cgroup(pid_t pid, char *buf, size_t cap) {
  char path[64], text[4096];
  gg__proc_path(path, sizeof path, pid, "cgroup");
  ssize_t len = gg__read_small(path, text, sizeof text);
  if (len < 0) return (int)len;
  const char *line = strstr(text, "0::");
  line = line && (line == text || line[-1] == '\n') ? line : text;
  const char *colon = strchr(line, ':');
  colon = colon ? strchr(colon + 1, ':') : NULL;
  if (!colon) return -EINVAL;
  size_t n = strcspn(colon + 1, "\n");
  snprintf(buf, cap, "%.*s", (int)n, colon + 1);
  return 0;
}

/* getdents64 rather than readdir: readdir allocates, and this also runs in signal handlers. */
struct gg__dirent64 {
  unsigned long long d_ino;
  long long d_off;
  unsigned short d_reclen;
  unsigned char d_type;
  char d_name[];
};

static int gg__parse_pid(const char *s, pid_t *out) {
  long v = 0;
  if (!*s) return -1;
  for (; *s; s++) {
    if (*s < '0' || *s > '9' || v > 1000000000L) return -1;
    v = v * 10 + (*s - '0');
  }
  *out = (pid_t)v;
  return 0;
}

int gg__proc_walk(int (*fn)(const gg__pinfo_t *info, void *user), void *user) {
  int dfd = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return -errno;
  _Alignas(8) char buf[4096];
  int rc = 0;
  for (;;) {
    long n = syscall(SYS_getdents64, dfd, buf, sizeof buf);
    if (n <= 0) {
      if (n < 0) rc = -errno;
      break;
    }
    for (long off = 0; off < n;) {
      const struct gg__dirent64 *d = (const struct gg__dirent64 *)(void *)(buf + off);
      off += d->d_reclen;
      pid_t pid;
      gg__pinfo_t info;
      if (gg__parse_pid(d->d_name, &pid) != 0) continue;
      if (gg__proc_read_stat(pid, &info) != 0) continue; /* gone meanwhile */
      rc = fn(&info, user);
      if (rc != 0) goto out;
    }
  }
out:
  close(dfd);
  return rc;
}

int gg__close_fds_matching(const char *prefix) {
  int dfd = open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return -errno;
  size_t plen = strlen(prefix);
  _Alignas(8) char buf[2048];
  int closed = 0;
  for (;;) {
    long n = syscall(SYS_getdents64, dfd, buf, sizeof buf);
    if (n <= 0) break;
    for (long off = 0; off < n;) {
      const struct gg__dirent64 *d = (const struct gg__dirent64 *)(void *)(buf + off);
      off += d->d_reclen;
      pid_t fd;
      char target[256];
      if (gg__parse_pid(d->d_name, &fd) != 0 || fd == dfd) continue;
      ssize_t len = readlinkat(dfd, d->d_name, target, sizeof target - 1);
      if (len < 0 || (size_t)len < plen) continue;
      target[len] = '\0';
      if (memcmp(target, prefix, plen) == 0 && close(fd) == 0) closed++;
    }
  }
  close(dfd);
  return closed;
}

int gg__close_device_files(void) {
  int closed = 0;
  for (const gg__family_t *const *f = gg__families(); *f; f++)
    for (const char *const *p = (*f)->device_files; p && *p; p++) {
      int n = gg__close_fds_matching(*p);
      if (n < 0) return n;
      closed += n;
    }
  return closed;
}

/* Pids holding an open descriptor whose link target is exactly `target` (not async-signal-safe: it
 * allocates). Only processes this user may inspect are seen (all of them for root). */
int gg__scan_fd_holders(const char *proc_root, const char *target, int **pids, size_t *n) {
  *pids = NULL;
  *n = 0;
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
    int *grown = gg__vec_reserve(*pids, &cap, *n + 1, sizeof **pids);
    if (!grown) {
      rc = gg__err(GG_ENOMEM, "scanning %s: out of host memory", proc_root);
      break;
    }
    *pids = grown;
    (*pids)[(*n)++] = (int)pid;
  }
  closedir(d);
  if (rc < 0) {
    free(*pids);
    *pids = NULL;
    *n = 0;
  }
  return rc;
}

int gg__proc_environ_get(pid_t pid, const char *name, char *buf, size_t cap) {
  char path[64];
  gg__proc_path(path, sizeof path, pid, "environ");
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  /* The environment is NUL-separated "K=V" strings; read it in pieces and match whole entries. */
  size_t nlen = strlen(name), have = 0;
  char chunk[8192];
  int rc = -ENOENT;
  for (;;) {
    ssize_t r = read(fd, chunk + have, sizeof chunk - have);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    have += (size_t)r;
    size_t start = 0;
    for (size_t i = 0; i < have; i++) {
      if (chunk[i] != '\0') continue;
      const char *e = chunk + start;
      if (i - start > nlen && strncmp(e, name, nlen) == 0 && e[nlen] == '=') {
        gg__strlcpy(buf, e + nlen + 1, cap);
        rc = 0;
        break;
      }
      start = i + 1;
    }
    if (rc == 0) break;
    memmove(chunk, chunk + start, have - start); /* keep the unfinished entry */
    have -= start;
    /* an entry longer than the buffer: not one we want; skip to its end */
    if (have == sizeof chunk) {
      have = 0;
      for (char c = 1; c != '\0';) {
        ssize_t k = read(fd, &c, 1);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
      }
    }
  }
  close(fd);
  return rc;
}
