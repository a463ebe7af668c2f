/* arena_fork_stub.h — TEMPORARY: the arena's fork handlers, declared here until the arena split lands
 * (it declares them in arena_internal.h). The merge deletes this file, arena_fork_stub.c and the
 * include of this header in fork.c. */
#ifndef GG_ARENA_FORK_STUB_H
#define GG_ARENA_FORK_STUB_H

void gg__arena_fork_prepare(void);
void gg__arena_fork_parent(void);
void gg__arena_fork_child(void);

#endif
