/* proc_self.c — what a process asks of the kernel about itself: to die with its parent (armed
 * race-free, the parent named by fork or by GPUGUARD_PARENT_PID), to be a child subreaper, to close
 * the device files it inherited. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "core/internal.h"
#include "gpuguard/proc.h"
#include "proc/proc_internal.h"
#include "proc/procfs_internal.h"

/* GPUGUARD_PARENT_PID names the parent of a program it exec'd, for a parent that may die before the
 * program arms. It is used only when it can name our real parent: a valid pid that is our parent
 * now, or one that is gone (or reused by a process younger than us) while our parent now did not
 * hand the variable down (its own environment lacks the same value: one generation). Anything else
 * (garbage, a live process older than us that is not our parent, a value inherited from further up)
 * is ignored, and the parent is getppid(). */
static pid_t gg__named_parent(void) {
  pid_t now = getppid();
  const char *env = gg__env("GPUGUARD_PARENT_PID");
  if (!env) return now;
  char *end = NULL;
  errno = 0;
  long named = strtol(env, &end, 10);
  if (errno != 0 || end == env || *end != '\0' || named <= 1 || named > INT_MAX) return now;
  if ((pid_t)named == now) return now;
  gg__pinfo_t them, me;
  if (gg__proc_read_stat((pid_t)named, &them) == 0 && gg__proc_read_stat(getpid(), &me) == 0 &&
      them.start <= me.start)
    return now; /* alive and older than us, and not our parent: another generation's */
  char handed[32];
  if (gg__proc_environ_get(now, "GPUGUARD_PARENT_PID", handed, sizeof handed) == 0 &&
      strcmp(handed, env) == 0)
    return now; /* our parent has the same value: it was handed down, not meant for us */
  return (pid_t)named;
}

int gg_proc_arm_child(void) {
  pid_t parent = gg__proc_parent_at_fork();
  if (parent <= 0) parent = gg__named_parent();
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0)
    return gg__err(GG_EIO, "gg_proc_arm_child: prctl(PR_SET_PDEATHSIG): %s", strerror(errno));
  /* Armed first, checked second: a parent dying in between is seen here, one dying later by the
   * kernel. */
  if (getppid() != parent) kill(getpid(), SIGKILL);
  return 0;
}

int gg_proc_set_subreaper(int on) {
  if (prctl(PR_SET_CHILD_SUBREAPER, on ? 1 : 0) != 0)
    return gg__err(GG_EIO, "gg_proc_set_subreaper: prctl(PR_SET_CHILD_SUBREAPER): %s",
                   strerror(errno));
  return 0;
}

int gg_proc_close_device_fds(void) {
  int n = gg__close_device_files();
  if (n < 0)
    return gg__err(GG_EIO, "gg_proc_close_device_fds: cannot read /proc/self/fd: %s", strerror(-n));
  return n;
}
