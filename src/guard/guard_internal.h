/* guard_internal.h — guard.c's calls for the rest of the library: attaching objects such as arenas
 * to the newest live guard, and the fork handlers of the live-guard list's lock. */
#ifndef GG_GUARD_INTERNAL_H
#define GG_GUARD_INTERNAL_H

#include <stddef.h>

#include "gpuguard/guard.h"

/* ---- attaching objects to the live guard (arenas) -------------------------------------------- */

/* One live block of an attached object, as the leak report counts it. The guard's own type, not
 * arena.h's gg_block_info_t: the arena is a layer above and translates (arena.c). */
typedef struct gg__held_block {
  size_t size;         /* bytes requested */
  const char *tag;     /* "" or NULL for none */
  int n_frames;        /* entries in frames; 0 without allocation sites */
  void *const *frames; /* where it was allocated, valid during the visit only */
} gg__held_block_t;
typedef int (*gg__held_visit_fn)(const gg__held_block_t *b, void *user);

/* How a guard tears down and reports an object attached to it. */
typedef struct gg__attach_ops {
  const char *kind; /* "arena": for messages */
  /* Releases the object's device resources at teardown, on the tearing-down thread, no guard lock
   * held. The object must stay a valid handle afterwards (its own destroy frees it and calls
   * detach). */
  void (*teardown)(void *obj);
  /* For the leak report; any may be NULL. foreach_block calls visit once per live block. */
  const char *(*name)(void *obj);
  const char *(*backend)(void *obj);
  int (*foreach_block)(void *obj, gg__held_visit_fn visit, void *user);
} gg__attach_ops_t;

/* Attaches obj to the newest live guard of this process for (backend, device); backend is the
 * resolved name ("cuda" or "host"). *token becomes 0 when there is no such guard (nothing to do
 * then, returns 0). GG_ENOMEM without host memory. */
int gg__guard_attach(const char *backend, int device, const gg__attach_ops_t *ops, void *obj,
                     unsigned long long *token);
/* Detaches: returns 1 when the registration was removed (the teardown has not touched obj), 0 when
 * there was none (token 0, or the teardown already ran or is running obj's teardown: then this call
 * waits until that teardown step has finished, so obj may be freed afterwards). */
int gg__guard_detach(unsigned long long token);

#endif
