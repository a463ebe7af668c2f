/* plugin_internal.h — what the arena and the allocator plugin need of each other. */
#ifndef GG_PLUGIN_INTERNAL_H
#define GG_PLUGIN_INTERNAL_H

#include "gpuguard/arena.h"

/* Called by gg_arena_destroy() before it frees anything: drops the arena from the plugin table, waiting
 * for plugin calls that are using it. */
void gg__plugin_forget(const gg_arena_t *arena);

/* gg_free() for a block used on `stream`: when the arena tracks a stream and `stream` is another one,
 * waits for `stream` first (under the arena's lock) and sets *synced. A failed wait frees nothing. */
int gg__arena_free_on(gg_arena_t *arena, void *ptr, void *stream, int *synced);
/* gg_alloc for work on `stream`: when that is not the arena's stream, waits for the arena's stream
 * (blocks released onto it in stream order may still be in use there). *synced says whether it waited. */
int gg__arena_alloc_on(gg_arena_t *arena, size_t size, void *stream, void **ptr, int *synced);

/* Waits for `stream` when the arena tracks a stream and it is another one (under the arena's lock, so a
 * teardown cannot close the device meanwhile): a block PyTorch recorded on `stream` is freed after. */
int gg__arena_wait_stream(gg_arena_t *arena, void *stream);

#endif
