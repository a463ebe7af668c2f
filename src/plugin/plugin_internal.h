/* plugin_internal.h — what plugin.c offers the rest of the library. */
#ifndef GG_PLUGIN_INTERNAL_H
#define GG_PLUGIN_INTERNAL_H

#include "gpuguard/arena.h"

/* Drops the arena from the plugin table, waiting for plugin calls that are using it. Registered as
 * the arena's destroy hook (gg__arena_on_destroy) when the table is first written. */
void gg__plugin_forget(const gg_arena_t *arena);

#endif
