/* plugin_threads_internal.h — each calling thread's own plugin state (plugin_threads.c): the arena
 * its call uses, announced instead of a shared read lock, and its deltas of the device's counters.
 */
#ifndef GG_PLUGIN_THREADS_INTERNAL_H
#define GG_PLUGIN_THREADS_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "gpuguard/arena.h"
#include "gpuguard/plugin.h"

typedef struct gg__pt gg__pt_t;

/* Reads a slot of the plugin table for one call: the arena stays valid until gg__pt_leave (a writer
 * of the slot waits). *me is this thread's record, passed on to gg__pt_leave and gg__pt_count. */
gg_arena_t *gg__pt_enter(_Atomic(gg_arena_t *) *slot, gg__pt_t **me);
void gg__pt_leave(gg__pt_t *me);
/* Stores arena in the slot, then waits until no call uses the arena that was there. */
void gg__pt_publish(_Atomic(gg_arena_t *) *slot, gg_arena_t *arena);
/* Empties the slot if it still holds arena, then waits the same way. */
void gg__pt_retract(_Atomic(gg_arena_t *) *slot, gg_arena_t *arena);
/* Waits until no call that entered before this one is under way (new calls wait meanwhile). */
void gg__pt_quiesce(void);

/* Counts one call on a device (0 <= device < GG_PLUGIN_MAX_DEVICES): a failure (rc < 0), or a block
 * of `size` bytes asked for that came (add) or went (size 0: only the call is counted); `joined`:
 * it ordered two streams on the device (n_stream_waits). */
void gg__pt_count(gg__pt_t *me, int device, int rc, bool add, size_t size, bool joined);
/* The device's figures, every thread's delta folded in first. */
void gg__pt_read(int device, gg_plugin_stats_t *out);
/* Peaks to current values, or allocated and freed totals to 0. */
void gg__pt_reset(int device, bool peaks, bool totals);

/* fork(): the list's lock around it; the child keeps only the forking thread's record. */
void gg__pt_fork_prepare(void);
void gg__pt_fork_parent(void);
void gg__pt_fork_child(void);

#endif
