/* internal.h — the helpers every source file uses, owned by error.c (error recording), options.c
 * (environment and option values) and fork.c (fork generation): the one shared internal header. */
#ifndef GG_INTERNAL_H
#define GG_INTERNAL_H

#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpuguard/error.h"
#include "gpuguard/export.h"

#define GG__PRINTF(a, b) __attribute__((format(printf, a, b)))
#define GG__LIKELY(x)    __builtin_expect(!!(x), 1)
#define GG__UNLIKELY(x)  __builtin_expect(!!(x), 0)

/* Records code and a formatted detail in this thread's error slot; returns code so callers can
 * `return gg__err(GG_EINVAL, "...")`. */
int gg__err(int code, const char *fmt, ...) GG__PRINTF(2, 3);
/* The same for a failed driver call: keeps the raw driver status for gg_last_driver_error(). */
int gg__err_driver(int code, int driver_status, const char *fmt, ...) GG__PRINTF(3, 4);

/* Keeps this thread's error detail across a call whose failure is not the caller's error. */
typedef struct gg__err_saved {
  char text[768];
  int driver_status;
} gg__err_saved_t;
void gg__err_save(gg__err_saved_t *s);
void gg__err_restore(const gg__err_saved_t *s);
/* The same for hot paths: the detail is copied only if something is about to overwrite it (a quiet
 * region costs two thread-local stores when nothing fails). Regions nest; end them in reverse
 * order. */
typedef struct gg__err_quiet {
  gg__err_saved_t saved;
  bool copied;
  struct gg__err_quiet *outer;
} gg__err_quiet_t;
void gg__err_quiet_begin(gg__err_quiet_t *q);
void gg__err_quiet_end(gg__err_quiet_t *q);

/* ---- assertions by debug level (cmake -DGPUGUARD_DEBUG=0|1|2 defines GG_DEBUG) ------------- */

/* GG__ASSERT (level 1 and up): a cheap invariant at a mutation point (a block changing state, a
 * free-list insert or removal, a cache handing out or publishing, a scope ending, a guard moving to
 * its next state, a registry record or process set changing). GG__ASSERT_EXPENSIVE (level 2): one
 * that walks a whole structure (the arena after every locked call, a free list, a cache, the guard
 * and registry lists). Below its level an assertion is compiled out: the condition is never
 * evaluated (sizeof keeps its names used), so a release build pays nothing. A failure prints the
 * condition, file, line and function to stderr and aborts: a broken invariant must stop the
 * program where it broke, not leak or corrupt device memory later. */
#ifndef GG_DEBUG
#define GG_DEBUG 0
#endif
#if GG_DEBUG >= 1
_Noreturn void gg__assert_fail(const char *cond, const char *file, int line, const char *func);
#define GG__ASSERT(cond) \
  (GG__LIKELY(cond) ? (void)0 : gg__assert_fail(#cond, __FILE__, __LINE__, __func__))
#else
#define GG__ASSERT(cond) ((void)sizeof(cond))
#endif
#if GG_DEBUG >= 2
#define GG__ASSERT_EXPENSIVE(cond) GG__ASSERT(cond)
#else
#define GG__ASSERT_EXPENSIVE(cond) ((void)sizeof(cond))
#endif
/* Structures walked by GG__ASSERT_EXPENSIVE only up to this many elements: a walk after every
 * change of a list of n makes a test of n changes O(n^2). */
#define GG__WALK_MAX 1024

/* Run a cleanup step whatever happened before, keeping the first error. */
#define GG_KEEP_FIRST(rc, call)               \
  do {                                        \
    int gg__k = (call);                       \
    if ((rc) == 0 && gg__k < 0) (rc) = gg__k; \
  } while (0)

/* Environment and option values. Each returns 0, or GG_EINVAL with a message naming the variable
 * and the bad value. `what` names the source in messages ("GPUGUARD_HOST_CAPACITY",
 * "options.backend"). */
int gg__parse_size(const char *what, const char *text, size_t *out); /* bytes, K/M/G/T suffixes */
int gg__parse_bool(const char *what, const char *text,
                   bool *out); /* 1/0/on/off/yes/no/true/false */
int gg__parse_int(const char *what, const char *text, long lo, long hi, long *out);
/* getenv that treats an empty value as unset. */
const char *gg__env(const char *name);

/* Fork generation: bumped in every forked child (pthread_atfork). Objects remember the generation
 * they were made in and refuse use when it differs: the child must not touch the parent's CUDA
 * state. */
extern atomic_uint
    gg__fork_gen; /* fork.c's count of forks: read it through gg__fork_generation() */
/* Inline: every arena call compares its handle's generation with it. */
static inline unsigned gg__fork_generation(void) {
  return atomic_load_explicit(&gg__fork_gen, memory_order_relaxed);
}
int gg__check_fork(unsigned created_gen, const char *call);

/* The fork handlers: fork.c's one pthread_atfork runs every registered level's prepare in this
 * order (the lock order written in fork.c), then the parent's or the child's release in the reverse
 * order. */
enum gg__fork_level {
  GG__FORK_GUARDS,   /* guard/guard.c: the live-guard list */
  GG__FORK_SIGNAL,   /* guard/signal.c: signal state, then the crash-hook table */
  GG__FORK_PROC,     /* proc/proc.c: process sets, then the spawn queue */
  GG__FORK_REGISTRY, /* proc/registry.c: the session registry */
  GG__FORK_ARENAS,   /* arena/arena.c: the live-arena list, then the quarantine */
  GG__FORK_HOST,     /* backend/host.c: the simulated device, a leaf */
  GG__FORK_LEVELS
};
typedef struct gg__fork_ops {
  void (*prepare)(void); /* takes the level's locks before fork() */
  void (*parent)(void);  /* releases them in the parent */
  void (*child)(void);   /* releases or remakes them in the child, resets what did not come along */
} gg__fork_ops_t;
/* Fills level's slot (one module a level; a later call replaces it). */
void gg__fork_register(enum gg__fork_level level, const gg__fork_ops_t *ops);
/* A module's registration, run at load time, before any fork() can find its locks held. */
#define GG__FORK_REGISTER(level, prepare, parent, child)                         \
  static const gg__fork_ops_t gg__fork_ops_of_module = {prepare, parent, child}; \
  __attribute__((constructor)) static void gg__fork_register_module(void) {      \
    gg__fork_register(level, &gg__fork_ops_of_module);                           \
  }

/* Bounded string copy that always terminates; a cut never splits a UTF-8 character. */
void gg__strlcpy(char *dst, const char *src, size_t cap);
/* The length of s[0..len) without a UTF-8 sequence cut short at its end (a name cut to fit a buffer
 * must stay valid text: Python decodes it). Bytes that are not UTF-8 are left as they are. */
size_t gg__utf8_whole(const char *s, size_t len);

/* A spin lock for state its own thread takes on every call and others rarely (a thread's cache, a
 * thread's plugin record): one exchange when free; a waiter yields instead of burning the holder's
 * core. */
static inline void gg__spin_lock(atomic_int *l) {
  while (atomic_exchange_explicit(l, 1, memory_order_acquire))
    while (atomic_load_explicit(l, memory_order_relaxed)) sched_yield();
}
static inline void gg__spin_unlock(atomic_int *l) {
  atomic_store_explicit(l, 0, memory_order_release);
}

#endif
