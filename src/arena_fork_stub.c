/* arena_fork_stub.c — TEMPORARY no-op fork handlers for the arena's global locks, until the arena split
 * provides the real ones (arena.c). Strong definitions on purpose: if the merge forgets to delete this
 * file, the duplicate symbols stop the link instead of silently skipping the arena's locks. */
#include "arena_fork_stub.h"

void gg__arena_fork_prepare(void) {}
void gg__arena_fork_parent(void) {}
void gg__arena_fork_child(void) {}
