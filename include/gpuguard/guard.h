/* gpuguard/guard.h — guards: a device context's lifetime and cleanups that run exactly once on
 * every exit path. */
#ifndef GPUGUARD_GUARD_H
#define GPUGUARD_GUARD_H

#include <stdbool.h>

#include "gpuguard/export.h"

/** @defgroup gg_guard Guards
 *  A guard owns one device's context for as long as it lives (it retains the primary context, which
 *  the CUDA runtime and PyTorch share) and a LIFO registry of cleanups. Every registered cleanup
 *  runs exactly once, whichever way the work ends:
 *
 *  - gg_guard_destroy(), on the calling thread;
 *  - `exit()` or a return from `main()` (unless @ref gg_guard_options::run_at_exit is false);
 *  - SIGINT, SIGTERM, SIGHUP, SIGQUIT: the signal handler only records the signal and wakes the
 *    guard thread, which runs the teardown of every guard that handles the signal (newest guard
 *    first) and then honours the disposition the signal had before: a default disposition is
 *    restored and the signal re-raised, so the process ends with the status it would have had
 *    without gpuguard; a previous handler is put back and the signal queued to the process again
 *    with its original `siginfo_t` (sender pid and uid kept; `si_code` becomes SI_QUEUE), so that
 *    handler runs as a real signal handler on an application thread (Python's SIGINT handling keeps
 *    working; the program may go on, with its guards torn down). The guard's handler is installed
 *    again for that signal by the next gg_guard_create(). A signal that was ignored (SIG_IGN) when
 *    the first guard was created is left alone. A second SIGINT while a teardown is running ends
 *    the process at once. A teardown that takes longer than
 *    @ref gg_guard_options::teardown_timeout_ms ends the process with the signal's default action
 *    (or with the exit() status on the exit path).
 *  - SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT: only async-signal-safe work runs, on an alternate
 *    signal stack: a one-line report to stderr and the library's crash hooks (signalling child
 *    processes); registered cleanups do NOT run (they may take locks the crashed thread holds).
 *    Then a previous handler is called, the default action restored and the signal re-raised.
 *
 *  Other threads keep running while a teardown runs on the guard thread: cleanups must tolerate
 *  that. Cleanups that did not run before a crash are not run. Runtimes that use SIGSEGV for their
 *  own work (JVMs, some garbage collectors) should leave the fatal signals out
 *  of @ref gg_guard_options::signals.
 *
 *  All calls are thread-safe; none is async-signal-safe. A guard created before fork() refuses
 *  every call in the child with GG_ESTATE, and the child's exit() does not run the parent's
 *  cleanups; signal dispositions in the child are what they were before the parent's first guard.
 *  @{ */

/** An exit-path guard (opaque). */
typedef struct gg_guard gg_guard_t;

/** Handle SIGINT. */
#define GG_GUARD_SIGINT 0x001u
/** Handle SIGTERM. */
#define GG_GUARD_SIGTERM 0x002u
/** Handle SIGHUP. */
#define GG_GUARD_SIGHUP 0x004u
/** Handle SIGQUIT. */
#define GG_GUARD_SIGQUIT 0x008u
/** Handle SIGSEGV (fatal: async-signal-safe hooks only). */
#define GG_GUARD_SIGSEGV 0x010u
/** Handle SIGBUS (fatal). */
#define GG_GUARD_SIGBUS 0x020u
/** Handle SIGFPE (fatal). */
#define GG_GUARD_SIGFPE 0x040u
/** Handle SIGILL (fatal). */
#define GG_GUARD_SIGILL 0x080u
/** Handle SIGABRT (fatal). */
#define GG_GUARD_SIGABRT 0x100u
/** The terminating signals, whose teardown runs the cleanups on the guard thread. */
#define GG_GUARD_SIGNALS_TERMINATING \
  (GG_GUARD_SIGINT | GG_GUARD_SIGTERM | GG_GUARD_SIGHUP | GG_GUARD_SIGQUIT)
/** The fatal signals, handled with async-signal-safe work only. */
#define GG_GUARD_SIGNALS_FATAL \
  (GG_GUARD_SIGSEGV | GG_GUARD_SIGBUS | GG_GUARD_SIGFPE | GG_GUARD_SIGILL | GG_GUARD_SIGABRT)
/** Every signal a guard can handle: the default. */
#define GG_GUARD_SIGNALS_ALL (GG_GUARD_SIGNALS_TERMINATING | GG_GUARD_SIGNALS_FATAL)

/** Options for gg_guard_create(). Fill with gg_guard_options_init() first; new fields are only ever
 *  added at the end. */
typedef struct gg_guard_options {
  int device;              /**< device ordinal whose context the guard holds; default 0 */
  const char *backend;     /**< "auto", "cuda", "host" or NULL (then GPUGUARD_BACKEND, else auto) */
  unsigned signals;        /**< GG_GUARD_SIG* bits to handle; default GG_GUARD_SIGNALS_ALL; 0:
                                none */
  bool run_at_exit;        /**< run the teardown at exit() if the guard is still alive; default
                                true */
  bool reset_context;      /**< reset the device's primary context at teardown (destroys every
                                allocation of the process on it: only for processes that own the
                                device alone); default false */
  int teardown_timeout_ms; /**< longest a teardown on a signal or exit() path may take before the
                                process is ended anyway; default 10000; 0: no limit. Does not apply
                                to gg_guard_destroy(). */
  const char *leak_report; /**< where the leak report goes (copied): "stderr", "stdout", "none", a
                                file path (appended), each optionally prefixed "json:" (one JSON
                                object per line) or "text:". NULL: the GPUGUARD_LEAK_REPORT
                                environment variable, else text on stderr written only when
                                something leaked; an explicit destination gets a report at every
                                teardown, empty or not. */
  const char *name;        /**< a name for reports (copied); NULL: "guard" */
  int child_grace_ms;      /**< at teardown, the processes in the guard's set (gg_proc_spawn(),
                                gg_proc_adopt()) get SIGTERM, this long to exit, then SIGKILL;
                                0..600000 (GG_PROC_GRACE_MAX_MS), default 2000; 0: SIGKILL at
                                once */
} gg_guard_options_t;

/** A cleanup: called once with the pointer given at registration. It must not throw (C++) or
 *  longjmp. */
typedef void (*gg_cleanup_fn)(void *user);

GG_BEGIN_DECLS

/** Fills @p opts with the defaults (device 0, backend from the environment, every signal, teardown
 *  at exit(), no context reset, 10 s teardown limit, leak report from the environment, 2 s grace
 *  for child processes). NULL is a no-op. */
GG_API void gg_guard_options_init(gg_guard_options_t *opts);

/** Creates a guard: opens the device (retaining its primary context), installs the signal handlers
 *  the options ask for (saving every previous `struct sigaction`), and starts the guard thread on
 *  first use. Several guards may live at once; handlers are restored when the last guard using them
 *  is destroyed.
 *  @param[out] guard receives the handle (left untouched on failure).
 *  @param opts options, or NULL for the defaults.
 *  @return 0; GG_EINVAL for a NULL @p guard or bad options or environment (names the field);
 *  GG_ENODEV when the device or driver is missing; GG_EDRIVER for other driver failures; GG_ENOMEM
 *  or GG_EIO when host memory, a thread or a pipe cannot be had. Nothing is left installed on
 *  failure. */
GG_API int gg_guard_create(gg_guard_t **guard, const gg_guard_options_t *opts);

/** The teardown: runs the registered cleanups LIFO (each exactly once, on the calling thread, with
 *  no library lock held; arenas attached to the guard are among them: see below), ends the guard's
 *  child processes (gg_proc_teardown() with @ref gg_guard_options::child_grace_ms), writes the leak
 *  report, resets the context when asked, releases the device, and frees the handle.
 *
 *  Arenas created while a guard of the same backend and device lives attach themselves to the
 *  newest such guard. The teardown gives their device memory back (after listing their live blocks
 *  in the leak report) but keeps the handles valid: later calls on them fail with GG_ESTATE, and
 *  gg_arena_destroy() still frees them. An arena destroyed first detaches itself. If a signal or
 *  exit() teardown of this guard already ran, only frees the handle; if one is running on another
 *  thread, waits for it first. NULL is a no-op returning 0.
 *  @return 0; GG_EINVAL for a handle that is not a live guard (destroyed already); GG_ESTATE when
 *  called from one of the guard's own cleanups, or in a forked child (nothing is done then);
 *  GG_ETIMEDOUT when a child process could not be ended; the first driver error of the context
 *  reset (the handle is freed regardless). */
GG_API int gg_guard_destroy(gg_guard_t *guard);

/** Registers a cleanup, run LIFO at teardown. Same as gg_guard_on_teardown_ex() without the id.
 *  @return 0; GG_EINVAL for NULL @p guard or @p fn or a destroyed guard; GG_ESTATE once the
 *  teardown has begun or in a forked child; GG_ENOMEM without host memory. */
GG_API int gg_guard_on_teardown(gg_guard_t *guard, gg_cleanup_fn fn, void *user, const char *name);

/** Registers a cleanup and returns its registration id.
 *  @param guard the guard.
 *  @param fn called once at teardown with @p user.
 *  @param user passed to @p fn; may be NULL.
 *  @param name a short label for diagnostics (copied, truncated to 63 bytes); NULL: "cleanup".
 *  @param[out] id receives an id for gg_guard_cancel() (never 0); may be NULL.
 *  @return as gg_guard_on_teardown(). */
GG_API int gg_guard_on_teardown_ex(gg_guard_t *guard, gg_cleanup_fn fn, void *user,
                                   const char *name, unsigned long long *id);

/** Cancels a registration: its cleanup will not run.
 *  @return 0; GG_EINVAL for a NULL or destroyed guard or id 0; GG_ENOTFOUND for an id this guard
 *  does not hold (cancelled already); GG_ESTATE once the teardown has begun or in a forked
 *  child. */
GG_API int gg_guard_cancel(gg_guard_t *guard, unsigned long long id);

/** Installs an alternate signal stack on the calling thread (if it has none), so that the
 *  fatal-signal report and hooks also run after a stack overflow on this thread. gg_guard_create()
 *  does this for the thread that calls it and for the guard thread; other threads only need it for
 *  stack overflows. The stack is freed when the thread exits.
 *  @return 0, or GG_ENOMEM / GG_EIO when the stack cannot be had. */
GG_API int gg_guard_prepare_thread(void);

GG_END_DECLS

/** @} */
#endif
