/* procfs.h — reading one process's facts from /proc: state, parent, start time, owner, command line. */
#ifndef GG_PROCFS_H
#define GG_PROCFS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

typedef struct gg__procstat {
  pid_t pid, ppid, pgid, sid;
  char state;                     /* R, S, D, Z, T, ... */
  unsigned long long start_time;  /* clock ticks after boot (field 22): with the pid, names a process */
  uid_t uid;                      /* real uid, from /proc/PID/status */
  char comm[64];
} gg__procstat_t;

/* Reads /proc/<pid>/stat and status under `root` (normally "/proc"; tests pass a fake tree).
 * Returns 0, GG_ENOTFOUND when the process is gone, GG_EIO for content it cannot parse. */
int gg__procfs_stat(const char *root, pid_t pid, gg__procstat_t *out);
/* The command line with NULs turned into spaces, cut to cap; "" for kernel threads. */
int gg__procfs_cmdline(const char *root, pid_t pid, char *buf, size_t cap);
/* True when pid is alive (not a zombie) and still the process that started at start_time (not a reused
 * pid). Keeps the caller's error detail. */
bool gg__procfs_same(pid_t pid, unsigned long long start_time);
/* Pids under proc_root holding an open descriptor whose link target is exactly `target` (a device node
 * such as /dev/nvidia0). Returns 0 with a malloc'd array in *pids (free it), or an error. */
int gg__scan_fd_holders(const char *proc_root, const char *target, int **pids, size_t *n);

#endif
