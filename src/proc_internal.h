/* proc_internal.h — what the process part shares inside the library: /proc readers, the child sets,
 * and the entry points the guard wires into its teardown and fatal-signal paths. */
#ifndef GG_PROC_INTERNAL_H
#define GG_PROC_INTERNAL_H

#include <stdbool.h>
#include <sys/types.h>

#include "gpuguard/proc.h"
#include "internal.h"

/* ---- /proc (procfs.c). Functions marked [AS-safe] are async-signal-safe. ---- */

typedef struct gg__pinfo {
  pid_t pid, ppid, pgrp, sid;
  char state; /* R, S, D, T, t, Z, X, ... */
  unsigned long long
      start; /* field 22 of /proc/PID/stat: clock ticks after boot; with the pid, an identity */
} gg__pinfo_t;

/* [AS-safe] Reads /proc/PID/stat. 0, or -errno (-ENOENT: no such process). */
int gg__proc_read_stat(pid_t pid, gg__pinfo_t *out);
/* Real uid of PID from /proc/PID/status. 0 or -errno. */
int gg__proc_uid(pid_t pid, uid_t *uid);
/* Command line with spaces between arguments, "[comm]" when there is none (zombies); "" if gone. */
void gg__proc_cmdline(pid_t pid, char *buf, size_t cap);
/* [AS-safe] Calls fn for every process in /proc (skipping those that vanish); stops at fn's first
 * nonzero return and returns it; -errno when /proc cannot be read. */
int gg__proc_walk(int (*fn)(const gg__pinfo_t *info, void *user), void *user);
/* [AS-safe] Closes every descriptor of this process whose target path starts with prefix (readlink of
 * /proc/self/fd/N). Returns how many were closed, or -errno. Tests point it at a temporary file. */
int gg__close_fds_matching(const char *prefix);
/* Value of environment variable `name` in process pid (readable for our own processes, or as root).
 * 0, -ENOENT when it is not set, or -errno. */
int gg__proc_environ_get(pid_t pid, const char *name, char *buf, size_t cap);
/* Pids under proc_root holding an open descriptor whose link target is exactly `target` (a device node
 * such as /dev/nvidia0). Returns 0 with a malloc'd array in *pids (free it), or an error. */
int gg__scan_fd_holders(const char *proc_root, const char *target, int **pids, size_t *n);

/* ---- pidfd, through syscall() so old C libraries build too. ---- */
int gg__pidfd_open(pid_t pid);            /* -1 with errno when the kernel lacks it or pid is gone */
int gg__pidfd_signal(int pidfd, int sig); /* [AS-safe] 0 or -1 with errno */
/* Tests turn pidfds off to exercise the pid + start time path the older kernels get. */
void gg__proc_use_pidfd(bool on);
/* Tests make teardown send nothing, to stand in for a process SIGKILL cannot end (uninterruptible
 * sleep), which CI cannot make on demand. */
void gg__proc_test_mute(bool on);

/* ---- child sets (proc.c), keyed by guard pointer; NULL is the process's default set. ---- */

/* How a process came into a teardown (the receipt says it). */
enum { GG__FOUND_TRACKED, GG__FOUND_DESCENDANT, GG__FOUND_GROUP, GG__FOUND_ORPHAN };

typedef struct gg__kid {
  pid_t pid;
  int pidfd;                /* -1: identified by pid + start time only */
  unsigned long long start; /* start time when it was recorded */
  int slot;                 /* index in the fatal-path snapshot, -1 if it did not fit */
  int found;                /* GG__FOUND_* */
} gg__kid_t;

/* Records a process in key's set (creating the set). Takes pidfd (may be -1). Used by spawn, adopt,
 * teardown (for processes it could not end) and tests (to fabricate a record). */
int gg__proc_track(const void *key, pid_t pid, int pidfd, unsigned long long start, int found);
/* Takes every record out of key's set (the set stays, empty). GG_ESTATE when the set was inherited
 * through fork(). *others receives the pids tracked by every OTHER set (malloc'd, caller frees). */
int gg__proc_detach(const void *key, gg__kid_t **kids, size_t *n, pid_t **others, size_t *n_others);
/* Lets go of one detached record: frees its snapshot slot and closes its pidfd. */
void gg__proc_release(gg__kid_t *kid);

/* ---- what the guard calls (wired in guard.c at merge) ---- */

/* The guard's teardown: TERM, grace, KILL, reap for every process in the guard's set and their
 * descendants (see gg_proc_teardown). receipt may be NULL. */
int gg__proc_teardown_set(const void *guard_key, int grace_ms, gg_proc_receipt_t **receipt);
/* [AS-safe] For fatal-signal handlers (SIGSEGV, SIGBUS, ...): SIGKILL to every tracked child of this
 * process (and the group each leads), to every child of ours when we are a subreaper, and unlinks this
 * process's registry record. Uses only a fixed-size snapshot kept with atomics: no malloc, no locks.
 * Preserves errno. Does nothing in a forked child for its parent's children. */
void gg__proc_fatal_kill(void);
/* Drops key's set without signalling anything (closes pidfds). For a guard being freed after its
 * teardown, or one inherited through fork() that the child must let go of. */
void gg__proc_forget_set(const void *guard_key);

/* ---- registry (registry.c) ---- */
/* [AS-safe] Unlinks this process's registry record if it made one (never the parent's, after fork). */
void gg__registry_fatal_unlink(void);

#endif
