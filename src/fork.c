/* fork.c — the fork generation: objects made before a fork() refuse use in the child. */
#include <pthread.h>
#include <stdatomic.h>

#include "arena_internal.h"
#include "backend/backend.h"
#include "internal.h"

static atomic_uint gg__gen;
static pthread_once_t gg__fork_once = PTHREAD_ONCE_INIT;

static void gg__on_fork_child(void) { atomic_fetch_add_explicit(&gg__gen, 1, memory_order_relaxed); }
static void gg__install(void) {
  pthread_atfork(NULL, NULL, gg__on_fork_child);
  /* arena locks: see gg__arena_fork_* (the arena's locks are taken first, the host device's after:
   * prepare handlers run in the reverse order of registration) */
  pthread_atfork(gg__host_fork_prepare, gg__host_fork_release, gg__host_fork_release);
  pthread_atfork(gg__arena_fork_prepare, gg__arena_fork_parent, gg__arena_fork_child);
}

unsigned gg__fork_generation(void) {
  pthread_once(&gg__fork_once, gg__install);
  return atomic_load_explicit(&gg__gen, memory_order_relaxed);
}

/* One relaxed load on the hot path: cheap enough for every call that touches a device. */
int gg__check_fork(unsigned created_gen, const char *call) {
  if (GG__LIKELY(atomic_load_explicit(&gg__gen, memory_order_relaxed) == created_gen)) return 0;
  return gg__err(GG_ESTATE,
                 "%s: this object was created before fork(); a forked child must not use its parent's "
                 "device state: create a new guard or arena in the child",
                 call);
}
