/* fork.c — the one pthread_atfork place: every global lock of the library is taken before fork() in
 * one written order and released after it, and the fork generation is bumped in the child (objects
 * made before a fork() refuse use there). */
#include <pthread.h>
#include <stdatomic.h>

#include "arena/arena_internal.h"
#include "backend/backend.h"
#include "guard/guard_internal.h"
#include "core/internal.h"
#include "plugin/plugin_internal.h"
#include "proc/proc_internal.h"
#include "proc/registry_internal.h"
#include "guard/signal_internal.h"

/* ---- lock order ---------------------------------------------------------------------------------------
 *
 * Every thread that holds two of these takes them top to bottom; the fork handler takes them all in
 * the same order, so fork() on one thread never waits for a lock held by a thread that waits for one
 * the handler already took (issue 16 item 1 was proc.c's and signal.c's handlers taking two of them in
 * opposite orders).
 *
 *   0. plugin (plugin_threads.c: the list of calling threads, which writers of the table hold; then
 *      plugin.c's trace and recorded streams; then plugin_graph.c's device table and each device's
 *      lock): outermost, since a plugin call holds its graph lock while it calls into the arena
 *   1. live-guard list (guard.c)            then a guard's own lock (not held across fork: a child never
 *                                           touches its parent's guards)
 *   2. signal state (signal.c)
 *   3. crash-hook table (signal.c)
 *   4. process sets (proc.c)
 *   5. spawn queue (proc.c)
 *   6. session registry (registry.c)
 *   7. arena globals (arena.c: the live-arena list, then the quarantine); then an arena's own lock
 *   8. the host backend's simulated device (backend/host.c), a leaf: arena create, map and unmap take it
 *
 * Per-thread caches of an arena (arena_cache.c) have a lock each, taken under their arena's lock (never
 * the other way round) and never held across a call that takes one of the above. They are per-object
 * locks: the child never takes one (its thread's caches belong to parent arenas, which refuse use there,
 * and its exit frees them without locking).
 *
 * The watchdog's lock and per-object locks are not taken here: the child starts its own watchdog, and
 * objects of the parent refuse use in the child (fork generation). Nothing is called with one of
 * these held that takes one above it: gg_proc_spawn asks the guard layer about its guard before it
 * takes the process-set lock. */

atomic_uint gg__fork_gen; /* read inline (internal.h): every arena call checks it */

static void gg__fork_prepare(void) {
  gg__plugin_fork_prepare();
  gg__guard_fork_prepare();
  gg__sig_fork_prepare();
  gg__proc_fork_prepare();
  gg__registry_fork_prepare();
  gg__arena_fork_prepare();
  gg__host_fork_prepare();
}

static void gg__fork_parent(void) {
  gg__host_fork_release();
  gg__arena_fork_parent();
  gg__registry_fork_parent();
  gg__proc_fork_parent();
  gg__sig_fork_parent();
  gg__guard_fork_parent();
  gg__plugin_fork_parent();
}

static void gg__fork_child(void) {
  atomic_fetch_add_explicit(&gg__fork_gen, 1, memory_order_relaxed);
  gg__host_fork_release();
  gg__arena_fork_child();
  gg__registry_fork_child();
  gg__proc_fork_child();
  gg__sig_fork_child();
  gg__guard_fork_child();
  gg__plugin_fork_child();
}

/* At load time, so the handlers see every fork() the program makes, even one before its first gpuguard
 * call (the child must know who its parent was: gg_proc_arm_child). */
__attribute__((constructor)) static void gg__fork_init(void) {
  pthread_atfork(gg__fork_prepare, gg__fork_parent, gg__fork_child);
}

/* One relaxed load on the hot path: cheap enough for every call that touches a device. */
int gg__check_fork(unsigned created_gen, const char *call) {
  if (GG__LIKELY(atomic_load_explicit(&gg__fork_gen, memory_order_relaxed) == created_gen)) return 0;
  return gg__err(GG_ESTATE,
                 "%s: this object was created before fork(); a forked child must not use its parent's "
                 "device state: create a new guard or arena in the child",
                 call);
}
