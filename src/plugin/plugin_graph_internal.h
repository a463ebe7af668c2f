/* plugin_graph_internal.h — the allocator plugin under CUDA stream capture: what plugin.c asks of
 * plugin_graph.c (graph pools that keep the memory of live graphs, served from a graph arena that
 * never touches a stream). */
#ifndef GG_PLUGIN_GRAPH_INTERNAL_H
#define GG_PLUGIN_GRAPH_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "gpuguard/arena.h"

/* Both are called by gg_torch_alloc / gg_torch_free while their call holds the plugin table (a
 * writer waits for it: plugin_threads.c), with `main` the
 * arena registered for `device` now (NULL when none), before the main arena is touched. With
 * `announced`, the caller vouches that no capture is under way that this plugin has not seen (every
 * capture is announced, and none is now): the driver is not asked whether the stream captures.
 *
 * gg__graph_alloc: 1 when the block was served here (a capture is underway on `stream`, or some
 * capture forbids stream operations) and *ptr is set; 0 when the caller serves it from `main` as
 * always; <0 (with the detail set) when serving it here failed. */
int gg__graph_alloc(int device, gg_arena_t *main, size_t size, void *stream, bool announced,
                    void **ptr);

/* gg__graph_free: 1 when the block was taken here (a block a pool owns, or a block `main` may not
 * take back now because a capture is underway); 0 when the caller gives it to `main` as always; <0
 * on error (a double free of a block held here). */
int gg__graph_free(int device, gg_arena_t *main, void *ptr, size_t size, void *stream,
                   bool announced);

/* Around fork() (called from plugin.c's fork handlers): the device table's lock, then each
 * device's. The child keeps the state; its objects carry the parent's fork generation and refuse
 * use. */
void gg__graph_fork_prepare(void);
void gg__graph_fork_release(void);
/* In the child instead of the release: the locks made anew (see gg__plugin_fork_child). */
void gg__graph_fork_reinit(void);

#endif
