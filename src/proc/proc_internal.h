/* proc_internal.h — proc.c's child sets for the rest of the library: pidfds, recording and
 * detaching processes, the fatal-path kill, the hook through which a guard vouches for itself, fork
 * handlers. */
#ifndef GG_PROC_INTERNAL_H
#define GG_PROC_INTERNAL_H

#include <stdbool.h>
#include <sys/types.h>

#include "gpuguard/proc.h"
#include "core/internal.h"
#include "proc/procfs_internal.h"

/* ---- pidfd, through syscall() so old C libraries build too ----------------------------------- */
/* -1 with errno when the kernel lacks it or pid is gone */
int gg__pidfd_open(pid_t pid);
int gg__pidfd_signal(int pidfd, int sig); /* [AS-safe] 0 or -1 with errno */
/* Tests turn pidfds off to exercise the pid + start time path the older kernels get. */
void gg__proc_use_pidfd(bool on);

/* ---- child sets, keyed by guard pointer; NULL is the process's default set ------------------- */

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
/* Drops key's set without signalling anything (closes pidfds). For a guard being freed after its
 * teardown, or one inherited through fork() that the child must let go of. */
void gg__proc_forget_set(const void *guard_key);

/* [AS-safe] For fatal-signal paths: SIGKILL to every tracked child of this process (and the group
 * each leads), to every child of ours when we are a subreaper, and unlinks this process's registry
 * record. Uses only a fixed-size snapshot kept with atomics: no malloc, no locks. Preserves errno.
 * Does nothing in a forked child for its parent's children. Shaped as a crash hook (sig and user
 * are unused): the guard layer adds it to signal.c's crash-hook table. */
void gg__proc_fatal_kill(int sig, void *user);

/* [AS-safe] Sends sig to process group pgrp only as far as it is ours: as a whole (kill(-pgrp))
 * when every member runs as our real uid, else to each member of ours one by one. Never our own
 * group or pgrp <= 1. Returns 0 (whole group), 1 (another user's member was there: ours only), or
 * -errno when /proc cannot be read (then nothing is signalled). The caller proves the group is the
 * one it means. */
int gg__proc_signal_group(pid_t pgrp, int sig);
/* In a forked image, the pid of the process that forked it (0 in an image that was exec'd):
 * proc_self.c's gg_proc_arm_child() arms against it. */
pid_t gg__proc_parent_at_fork(void);

/* The guard layer vouches for a guard key before a child is recorded for it: fn returns 0 when key
 * is a live guard that is not being torn down, else GG_EINVAL / GG_ESTATE with a message naming
 * call. Set once by guard.c before its first guard exists; without it every non-NULL key is
 * accepted. */
typedef int (*gg__proc_key_check_fn)(const void *key, const char *call);
void gg__proc_set_key_check(gg__proc_key_check_fn fn);

/* [AS-safe] In a spawned child between fork and exec (proc_ns.c): with mode ON or AUTO, moves the
 * job into a new PID namespace. Returns in the process that is to exec the job (pid 2 of the new
 * namespace, or the child itself when mode is OFF, or AUTO and namespaces are refused); the keeper
 * and the init never return. keep_ignored: gg_spawn_options_t::keep_ignored. With ON and namespaces
 * refused, writes {fail_step, errno} to errfd and exits 127, as the caller's other steps do. */
void gg__pid_ns_child(int mode, int grace_ms, int keep_ignored, int errfd, int fail_step);

/* [AS-safe] Whether sig's disposition in this process is SIG_IGN. */
bool gg__sig_ignored(int sig);

#endif
