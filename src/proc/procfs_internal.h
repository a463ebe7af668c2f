/* procfs_internal.h — procfs.c's readers of /proc: process status, command lines, descriptors,
 * walks. */
#ifndef GG_PROCFS_INTERNAL_H
#define GG_PROCFS_INTERNAL_H

#include <stddef.h>
#include <sys/types.h>

/* Functions marked [AS-safe] are async-signal-safe. */

typedef struct gg__pinfo {
  pid_t pid, ppid, pgrp, sid;
  char state; /* R, S, D, T, t, Z, X, ... */
  unsigned long long
      start; /* field 22 of /proc/PID/stat: clock ticks after boot; with the pid, an identity */
} gg__pinfo_t;

/* [AS-safe] Reads /proc/PID/stat. 0, or -errno (-ENOENT: no such process). */
int gg__proc_read_stat(pid_t pid, gg__pinfo_t *out);
/* [AS-safe] The same for this process through /proc/self, which is right even where /proc belongs
 * to another pid namespace than ours (unshare --pid without remounting /proc): /proc/PID would be
 * another process there. */
int gg__proc_read_self(gg__pinfo_t *out);
/* Whether pid is this process's parent, or its parent's, and so on up to PID 1. */
bool gg__proc_is_ancestor(pid_t pid);
/* [AS-safe] Real uid of PID from /proc/PID/status. 0 or -errno. */
int gg__proc_uid(pid_t pid, uid_t *uid);
/* The inode of PID's pid namespace (readlink /proc/PID/ns/pid: "pid:[INODE]"; PID 0: this process,
 * through /proc/self). 0 or -errno (EACCES for another user's process). */
int gg__proc_pidns(pid_t pid, unsigned long long *ino);
/* PID's NSpid line (PID 0: this process, through /proc/self): its pid in the namespace of the /proc
 * we read (*outer) and in its own (*inner), and how many levels there are. 0, -ENOTSUP on kernels
 * without the line, or -errno. */
int gg__proc_nspid(pid_t pid, pid_t *outer, pid_t *inner, int *levels);
/* Command line with spaces between arguments, "[comm]" when there is none (zombies); "" if gone. */
void gg__proc_cmdline(pid_t pid, char *buf, size_t cap);
/* The raw command line (NUL-separated arguments, the last one NUL-terminated too); returns its
 * length in bytes (0 for zombies and kernel threads), or -errno. Cut at cap - 1 bytes. */
ssize_t gg__proc_argv(pid_t pid, char *buf, size_t cap);
/* The thread name of PID's main thread (/proc/PID/comm, without the newline). 0 or -errno. */
int gg__proc_comm(pid_t pid, char *buf, size_t cap);
/* The program PID runs (readlink /proc/PID/exe, " (deleted)" kept). 0 or -errno (EACCES: another
 * user's process and we are not root). */
int gg__proc_exe(pid_t pid, char *buf, size_t cap);
/* Signals PID ignores (SigIgn of /proc/PID/status: bit N-1 for signal N). 0 or -errno. */
int gg__proc_sigign(pid_t pid, unsigned long long *mask);
/* PID's kernel flags (field 9 of /proc/PID/stat; PF_KTHREAD 0x00200000 marks a kernel thread). */
int gg__proc_flags(pid_t pid, unsigned long long *flags);
/* The path of PID's cgroup (the unified hierarchy's "0::" line, else the first line's path). 0 or
 * -errno. */
int gg__proc_cgroup(pid_t pid, char *buf, size_t cap);
/* [AS-safe] Calls fn for every process in /proc (skipping those that vanish); stops at fn's first
 * nonzero return and returns it; -errno when /proc cannot be read. */
int gg__proc_walk(int (*fn)(const gg__pinfo_t *info, void *user), void *user);
/* [AS-safe] Closes every descriptor of this process whose target path starts with prefix (readlink
 * of /proc/self/fd/N). Returns how many were closed, or -errno. Tests point it at a temporary
 * file. */
int gg__close_fds_matching(const char *prefix);
/* [AS-safe] gg__close_fds_matching() for each device node prefix of every backend (the table's
 * device files): what a process that must not keep a device closes. Closed count, or -errno. */
int gg__close_device_files(void);
/* Value of environment variable `name` in process pid (readable for our own processes, or as root).
 * 0, -ENOENT when it is not set, or -errno. */
int gg__proc_environ_get(pid_t pid, const char *name, char *buf, size_t cap);
/* Pids under proc_root holding an open descriptor whose link target is exactly `target` (a device
 * node such as /dev/nvidia0). Returns 0 with a malloc'd array in *pids (free it), or an error. */
int gg__scan_fd_holders(const char *proc_root, const char *target, int **pids, size_t *n);

#endif
