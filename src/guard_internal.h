/* guard_internal.h — what guard.c, signal.c and the other parts share: signal plumbing, the watchdog,
 * the crash-hook table (for the process part), and attaching objects such as arenas to the live guard. */
#ifndef GG_GUARD_INTERNAL_H
#define GG_GUARD_INTERNAL_H

#include <signal.h>
#include <stdbool.h>
#include <sys/types.h>

#include "gpuguard/arena.h"
#include "gpuguard/guard.h"

/* ---- crash hooks (async-signal-safe; the process part signals children and unlinks entries) ----- */

/* Called from the fatal-signal handler (on an alternate stack, any thread, other threads running) and
 * from the watchdog before it ends a hung teardown. Only async-signal-safe calls are allowed inside:
 * kill(), unlink(), write(), close(); no malloc, stdio, locks or CUDA. sig is the signal, or 0 when the
 * watchdog ends a hung teardown on the exit() path. */
typedef void (*gg__crash_hook_fn)(int sig, void *user);

#define GG__CRASH_HOOKS_MAX 32

/* Adds a hook; *slot receives its handle for gg__crash_hook_remove(). Not async-signal-safe.
 * A hook only runs in the process that added it (a forked child skips its parent's hooks).
 * GG_ENOMEM when all GG__CRASH_HOOKS_MAX slots are taken. Hooks run newest first. */
int gg__crash_hook_add(gg__crash_hook_fn fn, void *user, int *slot);
/* Removes a hook; a negative or free slot is ignored. A crash in progress may still call it once. */
void gg__crash_hook_remove(int slot);
/* Kills the tracked child processes and unlinks this process's registry record (the process part's
 * gg__proc_fatal_kill), then runs every hook of this process for sig, newest first; returns how many
 * hooks ran. Async-signal-safe. */
int gg__crash_hooks_run(int sig);

/* ---- attaching objects to the live guard (arenas) ------------------------------------------------ */

/* How a guard tears down and reports an object attached to it. */
typedef struct gg__attach_ops {
  const char *kind; /* "arena": for messages */
  /* Releases the object's device resources at teardown, on the tearing-down thread, no guard lock held.
   * The object must stay a valid handle afterwards (its own destroy frees it and calls detach). */
  void (*teardown)(void *obj);
  /* For the leak report; any may be NULL. foreach_block has gg_arena_foreach_block()'s contract. */
  const char *(*name)(void *obj);
  const char *(*backend)(void *obj);
  int (*foreach_block)(void *obj, gg_block_visitor_t visit, void *user);
} gg__attach_ops_t;

/* Attaches obj to the newest live guard of this process for (backend, device); backend is the resolved
 * name ("cuda" or "host"). *token becomes 0 when there is no such guard (nothing to do then, returns 0).
 * GG_ENOMEM without host memory. */
int gg__guard_attach(const char *backend, int device, const gg__attach_ops_t *ops, void *obj,
                     unsigned long long *token);
/* Detaches: returns 1 when the registration was removed (the teardown has not touched obj), 0 when
 * there was none (token 0, or the teardown already ran or is running obj's teardown: then this call
 * waits until that teardown step has finished, so obj may be freed afterwards). */
int gg__guard_detach(unsigned long long token);

/* 0 when g is a live guard that is not being torn down: the processes part checks it before it records
 * a child for g (a child recorded later still ends when the guard is freed). GG_EINVAL / GG_ESTATE. */
int gg__guard_check_live(gg_guard_t *g, const char *call);

/* ---- between guard.c and signal.c ---------------------------------------------------------------- */

/* Why a teardown runs. */
enum gg__reason { GG__BY_DESTROY, GG__BY_EXIT, GG__BY_SIGNAL };

/* Maps GG_GUARD_SIG* bits to signal numbers and back. */
int gg__sig_of_bit(unsigned bit);
unsigned gg__bit_of_sig(int sig);

/* Starts the guard and watchdog threads and the wake-up pipe for this process (once per fork
 * generation), and installs the handlers of `mask` (refcounted per signal; previous actions saved).
 * Call with the guard registry lock held. */
int gg__sig_acquire(unsigned mask);
/* Drops one use of each signal of mask; restores the saved action of a signal whose last user left
 * (when ours is still installed). Call with the guard registry lock held. */
void gg__sig_release(unsigned mask);

/* The guard thread calls this (guard.c) for every recorded terminating signal: tear down every live
 * guard of this process that handles sig, newest first. */
void gg__teardown_for_signal(int sig);

/* Is a teardown running on an exit path now (a second SIGINT then ends the process at once)? */
void gg__sig_set_exiting(bool on);

/* The watchdog: ends the process if a teardown on an exit path is not finished by the deadline.
 * kind GG__BY_SIGNAL: with the default action of signal `code`; GG__BY_EXIT: _exit(code). `what` names
 * the guard (copied). Arming again replaces the deadline. */
int gg__watchdog_arm(enum gg__reason kind, int code, int timeout_ms, const char *what); /* token, 0: none */
void gg__watchdog_disarm(int token);

/* The pid the library's signal machinery runs in (the handlers compare it to getpid()). */
pid_t gg__sig_pid(void);

/* Formats into a caller's buffer without stdio or malloc: async-signal-safe. Return the new end. */
char *gg__fmt_str(char *p, char *end, const char *s);
char *gg__fmt_u(char *p, char *end, unsigned long long v);
char *gg__fmt_hex(char *p, char *end, unsigned long long v);
/* "SIGSEGV", "SIGINT", ... or "signal". Async-signal-safe. */
const char *gg__sig_name(int sig);

#endif
