/* signal_internal.h — signal.c's plumbing for the guard layer: installing and releasing handlers,
 * the callback that tears down on a terminating signal, the watchdog, the crash-hook table run on
 * fatal paths, and async-signal-safe formatting. signal.c names no file above it: it calls what it
 * is given. */
#ifndef GG_SIGNAL_INTERNAL_H
#define GG_SIGNAL_INTERNAL_H

#include <signal.h>
#include <stdbool.h>
#include <sys/types.h>

/* ---- crash hooks (async-signal-safe) --------------------------------------------------------- */

/* Called from the fatal-signal handler (on an alternate stack, any thread, other threads running),
 * from a second SIGINT during a teardown, and from the watchdog before it ends a hung teardown.
 * Only async-signal-safe calls are allowed inside: kill(), unlink(), write(), close(); no malloc,
 * stdio, locks or CUDA. sig is the signal, or 0 when the watchdog ends a hung teardown on the
 * exit() path. */
typedef void (*gg__crash_hook_fn)(int sig, void *user);

#define GG__CRASH_HOOKS_MAX 32

/* Adds a hook; *slot receives its handle for gg__crash_hook_remove(). Not async-signal-safe.
 * A hook only runs in the process that added it (a forked child skips its parent's hooks).
 * GG_ENOMEM when all GG__CRASH_HOOKS_MAX slots are taken. Hooks run newest first. */
int gg__crash_hook_add(gg__crash_hook_fn fn, void *user, int *slot);
/* Removes a hook; a negative or free slot is ignored. A crash in progress may still call it
 * once. */
void gg__crash_hook_remove(int slot);
/* Runs every hook of this process for sig, newest first; returns how many ran.
 * Async-signal-safe. */
int gg__crash_hooks_run(int sig);

/* ---- handlers and the guard thread ----------------------------------------------------------- */

/* Called on the guard thread for every recorded terminating signal (SIGINT, SIGTERM, SIGHUP,
 * SIGQUIT), before the previous disposition is honoured: the guard layer tears down what handles
 * sig. */
typedef void (*gg__sig_teardown_fn)(int sig);

/* Maps a signal to its GG_GUARD_SIG* bit (0 for a signal the guards do not take). */
unsigned gg__bit_of_sig(int sig);

/* Starts the guard and watchdog threads and the wake-up pipe for this process (once per fork
 * generation), remembers on_signal, and installs the handlers of `mask` (refcounted per signal;
 * previous actions saved). */
int gg__sig_acquire(unsigned mask, gg__sig_teardown_fn on_signal);
/* Test hook: the nth thread the next start creates (1 the watchdog, 2 the guard thread; 0 none)
 * fails with EAGAIN, as pthread_create does when the process is out of threads. */
void gg__sig_test_fail_start(int nth);
/* Drops one use of each signal of mask; restores the saved action of a signal whose last user left
 * (when ours is still installed). */
void gg__sig_release(unsigned mask);

/* Is a teardown running on an exit path now (a second SIGINT then ends the process at once)? */
void gg__sig_set_exiting(bool on);

/* Ends the calling process with sig's default action, from any thread (sets SIG_DFL, unblocks,
 * raises). */
_Noreturn void gg__sig_die_by(int sig);

/* ---- the watchdog ---------------------------------------------------------------------------- */

/* How the watchdog ends a process whose teardown hangs. */
enum gg__wd_end { GG__WD_BY_EXIT, GG__WD_BY_SIGNAL };

/* Ends the process if a teardown on an exit path is not finished by the deadline: GG__WD_BY_SIGNAL
 * with the default action of signal `code`, GG__WD_BY_EXIT with _exit(code). `what` names the guard
 * (copied). Returns a token for gg__watchdog_disarm(), 0 when no slot was free. */
int gg__watchdog_arm(enum gg__wd_end kind, int code, int timeout_ms, const char *what);
void gg__watchdog_disarm(int token);

/* ---- async-signal-safe formatting ------------------------------------------------------------ */

/* Formats into a caller's buffer without stdio or malloc. Return the new end. */
char *gg__fmt_str(char *p, char *end, const char *s);
char *gg__fmt_u(char *p, char *end, unsigned long long v);
char *gg__fmt_hex(char *p, char *end, unsigned long long v);
/* "SIGSEGV", "SIGINT", ... or "signal". Async-signal-safe. */
const char *gg__sig_name(int sig);

/* ---- fork ------------------------------------------------------------------------------------ */

#endif
