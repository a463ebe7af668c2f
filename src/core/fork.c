/* fork.c — the one pthread_atfork place: every global lock of the library is taken before fork() in
 * one written order and released after it, and the fork generation is bumped in the child (objects
 * made before a fork() refuse use there). */
#include <pthread.h>
#include <stdatomic.h>

#include "core/internal.h"

/* ---- lock order
 * ---------------------------------------------------------------------------------------
 *
 * Every thread that holds two of these takes them top to bottom; the fork handler takes them all in
 * the same order, so fork() on one thread never waits for a lock held by a thread that waits for
 * one the handler already took (two handlers that took two of them in opposite orders, proc.c's and
 * signal.c's once, deadlocked a fork() racing a spawn).
 *
 *   1. live-guard list (guard.c)            then a guard's own lock (not held across fork: a child
 * never
 *                                           touches its parent's guards)
 *   2. signal state (signal.c)
 *   3. crash-hook table (signal.c)
 *   4. process sets (proc.c)
 *   5. spawn queue (proc.c)
 *   6. session registry (registry.c)
 *   7. arena globals (arena.c: the live-arena list, then the quarantine); then an arena's own lock
 *   8. the host backend's simulated device (backend/host.c), a leaf: arena create, map and unmap
 * take it
 *
 * Per-thread caches of an arena (arena_cache.c) have a lock each, taken under their arena's lock
 * (never the other way round) and never held across a call that takes one of the above. They are
 * per-object locks: the child never takes one (its thread's caches belong to parent arenas, which
 * refuse use there, and its exit frees them without locking).
 *
 * The watchdog's lock and per-object locks are not taken here: the child starts its own watchdog,
 * and objects of the parent refuse use in the child (fork generation). Nothing is called with one
 * of these held that takes one above it: gg_proc_spawn asks the guard layer about its guard before
 * it takes the process-set lock. */

atomic_uint gg__fork_gen; /* read inline (internal.h): every arena call checks it */

/* The handlers, one slot per level of the order above (enum gg__fork_level). Each module fills its
 * own slot from a constructor (GG__FORK_REGISTER), so this file names no function of a layer above
 * it; a slot stays empty where its module is not linked in (a static link of part of the library),
 * and then no lock of that level exists to take. */
static _Atomic(const gg__fork_ops_t *) gg__fork_table[GG__FORK_LEVELS];

void gg__fork_register(enum gg__fork_level level, const gg__fork_ops_t *ops) {
  if ((unsigned)level < GG__FORK_LEVELS)
    atomic_store_explicit(&gg__fork_table[level], ops, memory_order_release);
}

static const gg__fork_ops_t *gg__fork_at(int level) {
  return atomic_load_explicit(&gg__fork_table[level], memory_order_acquire);
}

/* Top to bottom before fork() ... */
static void gg__fork_prepare(void) {
  for (int i = 0; i < GG__FORK_LEVELS; i++) {
    const gg__fork_ops_t *ops = gg__fork_at(i);
    if (ops && ops->prepare) ops->prepare();
  }
}

/* ... and bottom to top after it, in both processes. */
static void gg__fork_parent(void) {
  for (int i = GG__FORK_LEVELS - 1; i >= 0; i--) {
    const gg__fork_ops_t *ops = gg__fork_at(i);
    if (ops && ops->parent) ops->parent();
  }
}

static void gg__fork_child(void) {
  atomic_fetch_add_explicit(&gg__fork_gen, 1, memory_order_relaxed);
  for (int i = GG__FORK_LEVELS - 1; i >= 0; i--) {
    const gg__fork_ops_t *ops = gg__fork_at(i);
    if (ops && ops->child) ops->child();
  }
}

/* At load time, so the handlers see every fork() the program makes, even one before its first
 * gpuguard call (the child must know who its parent was: gg_proc_arm_child). */
__attribute__((constructor)) static void gg__fork_init(void) {
  pthread_atfork(gg__fork_prepare, gg__fork_parent, gg__fork_child);
}

/* One relaxed load on the hot path: cheap enough for every call that touches a device. */
int gg__check_fork(unsigned created_gen, const char *call) {
  if (GG__LIKELY(atomic_load_explicit(&gg__fork_gen, memory_order_relaxed) == created_gen))
    return 0;
  return gg__err(
      GG_ESTATE,
      "%s: this object was created before fork(); a forked child must not use its parent's "
      "device state: create a new guard or arena in the child",
      call);
}
