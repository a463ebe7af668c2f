/* registry_internal.h — registry.c's calls for the rest of the library: the fatal-path unlink and the
 * fork handlers of the session registry's lock. */
#ifndef GG_REGISTRY_INTERNAL_H
#define GG_REGISTRY_INTERNAL_H

/* [AS-safe] Unlinks this process's registry record if it made one (never the parent's, after fork). */
void gg__registry_fatal_unlink(void);

/* fork.c's handler calls these in the lock order (see fork.c): take the lock, then release it. */
void gg__registry_fork_prepare(void);
void gg__registry_fork_parent(void);
void gg__registry_fork_child(void);

#endif
