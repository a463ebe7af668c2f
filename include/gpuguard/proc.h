/* gpuguard/proc.h — child processes that never outlive the job, and the per-user session
 * registry. */
#ifndef GPUGUARD_PROC_H
#define GPUGUARD_PROC_H

#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>

#include "gpuguard/export.h"

/** @defgroup gg_proc Processes
 *  Children started through gpuguard (or adopted by pid) die with the process that owns them,
 *  however it dies, and are torn down on every exit path: SIGTERM, a grace period, SIGKILL, reaped.
 *
 *  - **Sets.** Every child belongs to the set of one guard. Passing `guard == NULL` to any call
 *    here means this process's default set, which no guard tears down: call gg_proc_teardown(NULL,
 *    ...) yourself (its children still die with the process through the death signal).
 *  - **Parent death is process-scoped.** Linux's death signal (PR_SET_PDEATHSIG) fires when the
 *    creating *thread* exits, so children are forked by one long-lived helper thread of the
 *    library: a child spawned from a short-lived thread keeps running until the process dies.
 *    Arming is race-free: the child knows which pid must be its parent, arms, and then checks that
 *    the parent is still that one, killing itself at once otherwise. The death signal survives
 *    exec, but not the exec of a set-uid or set-gid program.
 *  - **Identity.** Each process is held by a pidfd (pidfd_open) where the kernel has them, else by
 *    pid plus start time (field 22 of /proc/PID/stat), so a reused pid is never signalled. Nothing
 *    here ever signals pid 0, 1, -1, this process, or a process whose real uid is not ours.
 *  - **Fork.** After fork(), sets inherited from the parent refuse use in the child (GG_ESTATE:
 *    create a new guard there); the child never signals its parent's children, and the default set
 *    starts empty in the child.
 *  - **Environment.** Each spawned child gets GPUGUARD_SESSION (the session id,
 *    see @ref gg_registry) in an environment array built for it; the process environment is never
 *    written.
 *  @{ */

GG_BEGIN_DECLS

#ifndef GG_GUARD_T_DEFINED
/** Set once gg_guard_t is declared: guard.h and proc.h may each declare it, only the first does. */
#define GG_GUARD_T_DEFINED
/** A guard (see guard.h); here only as the key of a set of children. */
typedef struct gg_guard gg_guard_t;
#endif

/** Options of gg_proc_spawn(). Fill with gg_spawn_options_init(), then change what you need; fields
 *  are only ever added at the end. */
typedef struct gg_spawn_options {
  size_t size;           /**< sizeof(gg_spawn_options_t), set by gg_spawn_options_init() */
  int new_process_group; /**< nonzero: the child leads its own process group, and teardown signals
                              the whole group. Default 0 (the child shares ours, as posix_spawn
                              does) */
  char *const *env;      /**< environment of the child, NULL-terminated "K=V" strings; NULL inherits
                              ours. GPUGUARD_SESSION is added when this process has registered */
  int stdin_fd;          /**< descriptor to become the child's stdin, -1 (default) to inherit
                              ours */
  int stdout_fd;         /**< descriptor to become the child's stdout, -1 (default) to inherit */
  int stderr_fd;         /**< descriptor to become the child's stderr, -1 (default) to inherit */
  const char *cwd;       /**< working directory of the child; NULL (default) keeps ours */
  int death_signal;      /**< nonzero (default): the child gets SIGKILL when this process dies */
  int close_device_fds;  /**< nonzero: the child closes inherited /dev/nvidia* descriptors before
                              exec. Default 0 */
  int pid_ns;            /**< GG_SPAWN_PID_NS_OFF (default), _AUTO or _ON: run the child in its own
                              PID namespace (see gg_spawn_pid_ns_t). Appended in 0.2: callers built
                              before it pass a smaller size and get OFF */
  int pid_ns_grace_ms;   /**< with a PID namespace: when the program ends, how long the rest of the
                              namespace has after SIGTERM before the kernel kills it (0 to
                              GG_PROC_GRACE_MAX_MS; default 1000). Appended in 0.2, after pid_ns */
  int keep_ignored;      /**< nonzero: signals this process ignores (SIG_IGN) when the child starts
                              stay ignored in the child, as exec keeps them (`nohup`), and a PID
                              namespace's keeper and init neither take nor pass them on. SIGCHLD is
                              reset all the same. Default 0: every disposition is reset. Appended in
                              0.3 */
} gg_spawn_options_t;

/** Where a spawned child runs (gg_spawn_options_t::pid_ns).
 *
 *  With a PID namespace, the pid gg_proc_spawn() returns is a small keeper process in ours; its
 *  child is the namespace's init (pid 1 there), which runs the program as pid 2, passes signals on
 *  (those of gg_proc_job_signals(), SIGCONT and SIGWINCH), and reaps the namespace's orphans. The
 *  keeper exits with the program's status (or dies of its signal). The guarantee: when the keeper
 *  dies — this process SIGKILLed and the death signal fired, or a teardown — the init dies, and the
 *  kernel kills every process of the namespace at once, double-forked daemons included. When the
 *  program ends, the rest of the namespace gets SIGTERM and
 *  gg_spawn_options_t::pid_ns_grace_ms (default one second) before the init exits (and the kernel
 *  kills what is left). The namespace has its own /proc (a
 *  private mount namespace), so `ps` inside shows its pids; from outside every process keeps its
 *  ordinary pid (NVML and `gpuguard ps` see those). As root the namespace is made directly;
 *  otherwise through an unprivileged user namespace mapping our uid and gid onto themselves, where
 *  the system allows one. */
typedef enum gg_spawn_pid_ns {
  GG_SPAWN_PID_NS_OFF = 0,  /**< the child runs in our PID namespace (the default) */
  GG_SPAWN_PID_NS_AUTO = 1, /**< a namespace when the system allows one, silently ours otherwise
                                 (ask gg_proc_pid_ns_probe() first to tell the user) */
  GG_SPAWN_PID_NS_ON = 2    /**< a namespace, or the spawn fails with GG_EIO naming the reason */
} gg_spawn_pid_ns_t;

/** Whether a child can be given its own PID namespace here (forks a short-lived probe).
 *  @return 1 (as root: a PID namespace directly), 2 (through an unprivileged user namespace), or
 *  GG_ENOTSUP with the reason in gg_last_error(); GG_EIO when the probe cannot fork.
 *  Thread-safe. */
GG_API int gg_proc_pid_ns_probe(void);

/** The signals a job's runner should take and pass on to the job: every signal whose default action
 *  ends a process and that is sent on purpose (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2,
 *  SIGALRM, SIGPIPE, SIGVTALRM, SIGPROF, SIGXCPU, SIGXFSZ, SIGIO, SIGPWR, SIGSTKFLT and SIGRTMIN to
 *  SIGRTMAX); not SIGKILL and SIGSTOP, which cannot be taken, nor the faults (SIGSEGV, SIGBUS,
 *  SIGFPE, SIGILL, SIGABRT, SIGTRAP, SIGSYS), which are a process's own. A PID namespace's keeper
 *  (see gg_spawn_pid_ns_t) passes every one of them on to the program; any other signal sent to the
 *  keeper stays pending there (it blocks them all) and never reaches the program. `gpuguard run`
 *  takes exactly these.
 *  @param[out] sigs receives up to @p cap signal numbers; may be NULL to count them.
 *  @param cap the room in @p sigs.
 *  @return how many signals the list has (more than @p cap means it was cut). Thread-safe and
 *  async-signal-safe. */
GG_API size_t gg_proc_job_signals(int *sigs, size_t cap);

/** Fills opts with the defaults described at each field.
 *  @param opts the options to fill; NULL is ignored. Thread-safe. */
GG_API void gg_spawn_options_init(gg_spawn_options_t *opts);

/** Starts a child running argv and records it in guard's set.
 *
 *  The child is forked by the library's long-lived spawn thread, so its death signal is tied to the
 *  process, not to the calling thread. In the child, signal dispositions are reset to the defaults
 *  (except ignored ones with gg_spawn_options_t::keep_ignored) and the signal mask is emptied
 *  before exec. A program name without '/' is looked up in this process's
 *  PATH (the `env` option does not change where it is found).
 *  @param guard the owning guard, or NULL for the default set.
 *  @param argv program and arguments, NULL-terminated; argv[0] is the program.
 *  @param opts NULL for the defaults.
 *  @param[out] pid receives the child's pid; may be NULL.
 *  @return 0; GG_EINVAL for a NULL or empty argv or bad options; GG_ENOTFOUND when the program does
 *  not exist (not in PATH, or exec said ENOENT); GG_EPERM when it may not be executed (EACCES,
 *  EPERM); GG_EIO when the child failed before exec otherwise (working directory, descriptors), the
 *  message naming the step; GG_ESTATE when guard's set was inherited through fork().
 *  Thread-safe. */
GG_API int gg_proc_spawn(gg_guard_t *guard, const char *const argv[],
                         const gg_spawn_options_t *opts, pid_t *pid);

/** Records a process created elsewhere (Python's multiprocessing, a launcher) in guard's set, so
 *  that teardown ends it. It must exist and belong to our user; it is held by pidfd (or pid + start
 *  time) from now on. Adopted processes get no death signal: arm them with gg_proc_arm_child() in
 *  the child, or make this process a subreaper.
 *  @param guard the owning guard, or NULL for the default set.
 *  @param pid the process.
 *  @return 0 (also when the set already holds it); GG_EINVAL for pid <= 0 or this process;
 *  GG_EPERM for pid 1, an ancestor of this process or a process of another user; GG_ENOTFOUND
 *  when no such process lives;
 *  GG_EINVAL when another set holds it; GG_ESTATE when guard's set was inherited through fork().
 *  Thread-safe. */
GG_API int gg_proc_adopt(gg_guard_t *guard, pid_t pid);

/** gg_proc_adopt(), but only if the process is still the one that started at @p start_time (clock
 *  ticks after boot, as /proc and gg_process_t report it): a pid read earlier may since have been
 *  reused by another process, which must never be adopted (and so never signalled).
 *  @param guard the owning guard, or NULL for the default set.
 *  @param pid the process.
 *  @param start_time the expected start time; 0 accepts any.
 *  @return as gg_proc_adopt(); GG_ENOTFOUND when the start time does not match. */
GG_API int gg_proc_adopt_ex(gg_guard_t *guard, pid_t pid, unsigned long long start_time);

/** Call in a child right after fork(): it gets SIGKILL when the parent that forked it dies.
 *
 *  The expected parent is the pid that called fork(), captured by a pthread_atfork handler before
 *  the fork (so it is known even if the parent is already gone). In a program that was exec'd
 *  rather than forked with gpuguard loaded, it is GPUGUARD_PARENT_PID (a parent sets it in the
 *  environment of the program it execs) when that names our parent: a pid that is our parent now,
 *  or one that is gone while our present parent did not hand the same value down; garbage, a live
 *  process older than us that is not our parent, or a value inherited from further up is ignored.
 *  Else it is getppid() at this call (then not race-free: a parent that died before the call cannot
 *  be told from a reaper). If the parent is already gone (we were reparented), this process kills
 *  itself with SIGKILL at once, as the death signal would have. The death signal is tied to the
 *  parent's forking thread (Linux's rule): fork from a thread that lives as long as the process.
 *  @return 0; GG_EIO when prctl fails. Not async-signal-safe only because of getenv. */
GG_API int gg_proc_arm_child(void);

/** Makes this process a child subreaper (PR_SET_CHILD_SUBREAPER), or stops being one. Orphaned
 *  descendants (double-forked, setsid'd) then become our children instead of init's, and teardown
 *  ends them with the rest: with the subreaper on, a teardown of the default set (guard NULL), or
 *  of a guard's set that tracked at least one process, also ends every child of this process that
 *  no other set tracks (reparented grandchildren cannot be told apart from children forked
 *  directly), and so does the fatal-signal path. A guard that never tracked a process leaves other
 *  children alone.
 *  @param on nonzero to become a subreaper. @return 0 or GG_EIO. Thread-safe. */
GG_API int gg_proc_set_subreaper(int on);

/** Closes every inherited /dev/nvidia* descriptor of this process. For a forked child that will not
 *  use CUDA: while it holds those descriptors, the parent's device memory is not freed when the
 *  parent dies. Memory mappings of those files are left alone. Async-signal-safe.
 *  @return how many descriptors were closed (>= 0), or GG_EIO when /proc/self/fd cannot be read. */
GG_API int gg_proc_close_device_fds(void);

/** What teardown sent to a process (bit flags in gg_proc_outcome_t::sent). */
enum {
  GG_PROC_SENT_TERM = 1, /**< SIGTERM (to the process, and to its group when it leads one) */
  GG_PROC_SENT_CONT = 2, /**< SIGCONT, because it was stopped */
  GG_PROC_SENT_KILL = 4, /**< SIGKILL */
  /** It leads a process group holding another user's process: the group was not signalled as a
   *  whole (that would reach the other user's process), only its members of ours, one by one; the
   *  receipt's JSON says `"group":"ours only"`. */
  GG_PROC_SENT_GROUP_FOREIGN = 8
};

/** How a process ended in a teardown (gg_proc_outcome_t::end). */
typedef enum gg_proc_end {
  GG_PROC_EXITED = 0,   /**< exited; `code` is its exit status */
  GG_PROC_SIGNALED = 1, /**< killed by a signal; `code` is the signal number */
  GG_PROC_ENDED = 2,    /**< gone, but not our child, so its status is not ours to read */
  GG_PROC_ALIVE = 3,    /**< could not be ended in time; `state` says why (D: uninterruptible
                             sleep) */
  GG_PROC_SKIPPED = 4   /**< not signalled: its pid now names another process (start time differs)
                             or another user's */
} gg_proc_end_t;

/** One process in a teardown receipt. */
typedef struct gg_proc_outcome {
  pid_t pid;                     /**< process id */
  pid_t ppid;                    /**< its parent when teardown began */
  unsigned long long start_time; /**< start time, clock ticks after boot (with pid, its identity) */
  char command[256];             /**< command line, arguments separated by spaces (truncated) */
  const char *found;             /**< how teardown found it (static string): "tracked" (spawned or
                                      adopted), "descendant" (a child of one found), "group" (in the
                                      process group of one found), "reparented" (handed to this
                                      subreaper when its parent died; not what `gpuguard ps` calls
                                      an orphan) */
  unsigned sent;                 /**< GG_PROC_SENT_* flags */
  gg_proc_end_t end;             /**< how it ended */
  int code;                      /**< exit status or signal number, per `end`; 0 otherwise */
  char state;                    /**< /proc state letter when ALIVE, else 0 */
} gg_proc_outcome_t;

/** What a teardown did, process by process. Free with gg_proc_receipt_free(). */
typedef struct gg_proc_receipt {
  size_t count;             /**< entries in procs */
  size_t n_alive;           /**< how many could not be ended: alive after SIGKILL, or another
                                 user's descendant skipped while it runs (not root) */
  int grace_ms;             /**< the grace period asked for */
  double elapsed_ms;        /**< how long the teardown took */
  gg_proc_outcome_t *procs; /**< count entries */
} gg_proc_receipt_t;

/** The longest grace period gg_proc_teardown() and gg_guard_options::child_grace_ms accept, in
 *  milliseconds (ten minutes). The `gpuguard` command line refuses a longer `--grace` with exit
 *  2. */
#define GG_PROC_GRACE_MAX_MS 600000

/** Ends every process in guard's set, and their descendants: SIGTERM to each (and to the group it
 *  leads, if any; SIGCONT to stopped ones), up to grace_ms for them to exit, SIGKILL to those left
 *  (and to processes that appeared meanwhile), then reaps our children. Bounded: it returns within
 *  about grace_ms + 300 ms whatever the processes do; one in uninterruptible sleep is reported,
 *  kept in the set, and tried again by the next teardown.
 *  @param guard the guard, or NULL for the default set.
 *  @param grace_ms 0..@ref GG_PROC_GRACE_MAX_MS; 0 sends SIGKILL at once.
 *  @return 0 when everything ended; GG_ETIMEDOUT when some could not be (the message counts them);
 *  GG_EINVAL for a bad grace_ms; GG_ESTATE when the set was inherited through fork().
 *  Thread-safe. */
GG_API int gg_proc_teardown(gg_guard_t *guard, int grace_ms);

/** gg_proc_teardown() that also hands back a receipt.
 *  @param guard the guard, or NULL for the default set.
 *  @param grace_ms as for gg_proc_teardown().
 *  @param[out] receipt receives the receipt (also when the result is GG_ETIMEDOUT), or NULL when
 *  the call failed before doing anything; the caller frees it with gg_proc_receipt_free().
 *  @return as gg_proc_teardown(), or GG_ENOMEM. Thread-safe. */
GG_API int gg_proc_teardown_ex(gg_guard_t *guard, int grace_ms, gg_proc_receipt_t **receipt);

/** Flags of gg_reap() and gg_reap_list() (query.h). */
enum {
  /** Other users' processes too (only as root: GG_EPERM otherwise). */
  GG_REAP_ALL_USERS = 1
};

/** Ends the processes named by pid and start time, as `gpuguard reap` does: each is checked right
 *  before it is signalled (still the process that started at that time, not a kernel thread, not
 *  pid 1 or this process or an ancestor of it, ours unless @p flags has GG_REAP_ALL_USERS and we
 *  are root) and held by pidfd from that check on, so a pid reused meanwhile is never signalled;
 *  then SIGTERM (SIGCONT to stopped ones), up to grace_ms for them to exit, SIGKILL to those left,
 *  and up to a second more. Unlike a teardown it does not go after descendants: only what is named.
 *  @param pids the processes. @param starts their start times (clock ticks after boot; 0 refuses).
 *  @param n how many. @param grace_ms 0..@ref GG_PROC_GRACE_MAX_MS.
 *  @param flags 0 or GG_REAP_ALL_USERS.
 *  @param[out] out n outcomes, in order: `end` GG_PROC_SKIPPED (never signalled; `found` says why),
 *  GG_PROC_ENDED, or GG_PROC_ALIVE; `found` is a static string.
 *  @return 0 when every process named ended or was skipped; GG_ETIMEDOUT when some are alive;
 *  GG_EINVAL for NULL arrays with n > 0 or a bad grace_ms. Thread-safe. */
GG_API int gg_reap(const int *pids, const unsigned long long *starts, size_t n, int grace_ms,
                   unsigned flags, gg_proc_outcome_t *out);

/** Frees a receipt. NULL is a no-op. @param receipt the receipt. */
GG_API void gg_proc_receipt_free(gg_proc_receipt_t *receipt);

/** Renders a receipt as one JSON object into buf:
 *  `{"grace_ms":N,"elapsed_ms":X,"alive":N,"processes":[{"pid":..,"ppid":..,"start_time":..,
 *  "command":"..","found":"..","sent":["TERM","KILL"],"end":"exited|signaled|ended|alive|skipped",
 *  "code":N,"state":"D"}]}`.
 *  @param receipt the receipt.
 *  @param buf where to write; may be NULL when cap is 0.
 *  @param cap its size.
 *  @param[out] len receives the length the whole text needs (without the NUL); may be NULL.
 *  @return 0; GG_EINVAL for a NULL receipt; GG_ENOMEM when buf is too small (it then holds a
 *  truncated, NUL-terminated prefix and *len says how much to allocate). */
GG_API int gg_proc_receipt_json(const gg_proc_receipt_t *receipt, char *buf, size_t cap,
                                size_t *len);

/** Writes the JSON of gg_proc_receipt_json() and a newline to f.
 *  @param receipt the receipt. @param f the stream.
 *  @return 0, GG_EINVAL for NULL arguments, GG_EIO when writing fails. */
GG_API int gg_proc_receipt_write(const gg_proc_receipt_t *receipt, FILE *f);

/** @} */

/** @defgroup gg_registry Session registry
 *  One small record per guarded process in a private per-user directory, so tools can tell a live
 *  worker from an orphan: `$XDG_RUNTIME_DIR/gpuguard`, else `/dev/shm/gpuguard-UID`, else
 *  `/tmp/gpuguard-UID`; GPUGUARD_REGISTRY_DIR overrides it. The directory is created with mode 0700
 *  and refused (GG_EPERM) if it is a symlink, not a directory, owned by another user, or accessible
 *  to group or others. Records (`PID.rec`; `PID.NAMESPACE.rec` outside the initial PID namespace,
 *  so that jobs in different namespaces never share a name; mode 0600) are written atomically
 *  (temporary file and rename) and removed at teardown; the fatal-signal path unlinks them too. A
 *  record whose pid is gone or names another process (start time differs) is stale. A record
 *  written in another PID namespace (it records the namespace and the pid the outermost visible
 *  /proc gave it) is judged there: alive unless this reader can see that namespace and the recorded
 * process is not in it. Records that are corrupt, not ours, or not regular files are skipped with
 * one warning each on stderr (64 names at most, then one line), never trusted.
 *  @{ */

/** One record of the registry. */
typedef struct gg_session_record {
  pid_t pid;                     /**< the guarded process */
  pid_t ppid;                    /**< its parent when it registered */
  unsigned long long start_time; /**< its start time (clock ticks after boot) */
  char session[40];              /**< session id: a leader's random id, inherited by its workers */
  char role[16];                 /**< "leader" or "worker" */
  char devices[64];              /**< devices it uses, as given at registration ("0,1"; "" if
                                      none) */
  char command[256];             /**< its command line (truncated) */
  int stale;                     /**< nonzero: the process is gone (or its pid was reused) */
  int parent_alive;              /**< nonzero: the recorded parent still runs */
} gg_session_record_t;

/** Writes the registry directory's path into buf, creating and checking the directory.
 *  @param buf where to write. @param cap its size.
 *  @return 0; GG_EINVAL for NULL or a buffer too small; GG_EPERM when the directory is unsafe (the
 *  message says why); GG_EIO when it cannot be created. Thread-safe. */
GG_API int gg_registry_dir(char *buf, size_t cap);

/** Records this process in the registry (again: replaces its record). The role is "worker" with the
 *  inherited session when GPUGUARD_SESSION is set and that session's leader is alive, runs as us
 *  and is our ancestor (a leader recorded in another PID namespace counts, unproven); else "leader"
 *  (with a line on stderr when an inherited id was not joined) with a new random session id. The
 *  process environment is never written (setenv races with getenv on other threads):
 *  gg_proc_spawn() puts GPUGUARD_SESSION into each child's own environment, and forked children
 *  keep the id in memory; a program that starts children by other means passes
 *  gg_registry_session() to them itself.
 *  @param devices the devices used, free text such as "0,1"; NULL for none.
 *  @return 0, or the errors of gg_registry_dir(), GG_EIO when the record cannot be written.
 *  Thread-safe with respect to other registry calls. */
GG_API int gg_registry_register(const char *devices);

/** Removes this process's record. No record (never registered, or a forked child of a registered
 *  process) is not an error. @return 0, or GG_EIO. */
GG_API int gg_registry_unregister(void);

/** This process's session id ("" before registering or inheriting one).
 *  @param buf where to write. @param cap its size (40 is enough). @return 0 or GG_EINVAL. */
GG_API int gg_registry_session(char *buf, size_t cap);

/** Lists the registry's records, stale ones flagged.
 *  @param rows where to write up to cap records; may be NULL when cap is 0.
 *  @param cap capacity of rows.
 *  @param[out] count receives the number of valid records (may exceed cap: call again with more
 *  room).
 *  @return 0, or the errors of gg_registry_dir(). Thread-safe. */
GG_API int gg_registry_list(gg_session_record_t *rows, size_t cap, size_t *count);

/** Removes stale records (their process is gone or their pid reused; a record of a PID namespace
 *  below ours that has no process left). A dead leader's record stays while a live process of ours
 *  still carries its session (it is what proves that process an orphan); `gpuguard reap` and
 *  `gpuguard run` call this after they end processes.
 *  @param[out] removed receives how many were removed; may be NULL.
 *  @return 0, or the errors of gg_registry_dir(). */
GG_API int gg_registry_prune(size_t *removed);

/** @} */

GG_END_DECLS

#endif
