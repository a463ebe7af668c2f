/* gpuguard/plugin.h — allocator entry points for frameworks that load an allocator from a shared
 * library (PyTorch's CUDAPluggableAllocator), drawing from one registered arena per device. */
#ifndef GPUGUARD_PLUGIN_H
#define GPUGUARD_PLUGIN_H

#include <sys/types.h>

#include "gpuguard/arena.h"
#include "gpuguard/export.h"

/** @defgroup gg_plugin Allocator plugin (PyTorch)
 *  Two functions with the C signatures PyTorch's `torch.cuda.memory.CUDAPluggableAllocator(path,
 *  alloc_name, free_name)` looks up in a shared library, so that PyTorch's device memory comes from
 *  a gpuguard arena: `CUDAPluggableAllocator(path_of_libgpuguard, "gg_torch_alloc",
 *  "gg_torch_free")`. The Python package wraps this as `gpuguard.torch.use_arena()` and
 *  `gpuguard.torch.mem_pool()`.
 *
 *  - **Registration.** gg_plugin_set_arena() names the arena that serves each device. The table is
 *    read without a shared lock (each call announces itself in its own thread's record, and a
 *    change waits for the calls under way): once gg_plugin_set_arena() returns, no allocation or
 *    free is still using the arena it replaced, so that arena may be destroyed. Destroying a
 *    registered arena unregisters it first (the same guarantee). After fork(), the child starts
 *    with an empty table.
 *  - **Streams.** PyTorch passes the stream each block was allocated for (its current stream), and
 *    gives the same stream back at the free. The plugin is stream-ordered, as PyTorch's own
 *    allocator is. The arena tracks one stream (its `stream` option; PyTorch's default stream is
 *    the NULL stream, the arena's default). A block freed on that stream is reusable at once by
 *    later allocations for that stream: the stream runs their work after the work queued before the
 *    free. Other streams are ordered on the device, never by a host-side wait: an allocation for
 *    another stream makes that stream wait for the work queued on the arena's stream so far (a
 *    block released onto it may still be in use there), and a free on another stream makes the
 *    arena's stream wait for that stream's work so far, after which the block is in the arena's
 *    stream order. Each is an event recorded on one stream that the other waits for
 *    (cuEventRecord + cuStreamWaitEvent, under the arena's lock), counted in n_stream_waits.
 *    Training on one stream orders nothing. With GG_ARENA_NO_STREAM the caller synchronises and
 *    nothing is ordered. If ordering fails, the block is not freed (it stays in the arena until its
 *    scope ends or the arena is destroyed), and an allocation fails: memory that work may still
 *    read is never handed out.
 *  - **Failures.** gg_torch_alloc() cannot return an error code: it returns NULL and writes one
 *    line with gg_last_error()'s detail to stderr; gg_torch_free() writes one line. Both are
 *    counted in gg_plugin_stats(). PyTorch's global pluggable allocator (2.x) does not check the
 *    pointer, so a NULL would become a tensor at address 0: `gpuguard.torch` therefore installs
 *    `gg_torch_malloc` of the small C++ library libgpuguard_torch instead, which calls
 *    gg_torch_alloc_status() and throws, so PyTorch raises `torch.OutOfMemoryError` (or a
 *    RuntimeError starting "CUDA out of memory.") carrying the arena's detail. Under
 *    `torch.cuda.MemPool`, a NULL makes PyTorch free its cached blocks, retry and then raise
 *    `torch.OutOfMemoryError`.
 *  - **Size 0.** PyTorch asks for 0 bytes for empty tensors. gg_torch_alloc() returns NULL for them
 *    without any error (PyTorch's own allocator does the same) and gg_torch_free(NULL, ...) is a
 *    no-op.
 *
 *  - **CUDA graphs.** Stream capture (`torch.cuda.graph`, `torch.compile(mode="reduce-overhead")`)
 *    works in both forms. Each call asks the driver whether its stream captures (one
 *    cuStreamGetCaptureInfo; a second one for the arena's stream when the call is for another
 *    stream). During a capture nothing the plugin does touches a stream (no wait, no event, no
 *    query), and mapping memory runs in the relaxed capture mode, so the plugin never invalidates a
 *    capture. The blocks of a capture come from a second arena per device, the *graph arena*
 *    (GG_ARENA_NO_STREAM, same device, backend, capacity and chunk size as the registered arena,
 *    named "torch-graph"), and belong to the capture's *pool*: freed during the capture, a block is
 *    reused by later allocations of the same capture only (best fit); freed after it (the graph's
 *    outputs), it stays with the pool. A block of the registered arena freed during the capture
 *    (allocated before it) is kept by the pool too, not given back: the graph reads it at every
 *    replay. So memory a live graph uses is never handed to anything else. The pool is tied to the
 *    graph (a CUDA user object): once the graph and every executable graph made from it are
 *    destroyed, the next plugin call (or gg_plugin_graph_stats(), gg_plugin_trim()) gives the
 *    pool's freed blocks back (blocks of the registered arena in its stream order), and blocks
 *    still live go back when they are freed. While a capture is underway, calls for streams that do
 *    not capture but whose work the arena may not touch (the legacy default stream while a blocking
 *    stream captures, or any stream while a capture this plugin saw is still underway) get unowned
 *    blocks of the graph arena, given back after a wait for the stream they were freed on, once no
 *    capture forbids it. Limits: tensors a graph reads that were allocated before the capture and
 *    freed after it must stay alive as long as the graph (as with PyTorch's own allocator); pools
 *    are not shared between captures (PyTorch's `pool=` argument shares nothing here: each capture
 *    holds its own memory); gg_plugin_trim() trims the graph arena, the registered arena is trimmed
 *    by its owner; the streams blocks are freed on must outlive the graph (PyTorch's own streams
 *    do); the plugin learns of a capture at its first call, so a call of another thread already
 *    past its query when a capture begins may still use the arena's stream (harmless for PyTorch's
 *    non-blocking capture streams; a program that allocates on the legacy stream from other threads
 *    while it begins captures should capture with `capture_error_mode="thread_local"`). The graph
 *    arena lives until gg_plugin_trim(device, 0) finds it holding nothing; when the registered
 *    arena changes, an empty graph arena only gives its memory back.
 *
 *  All functions are thread-safe; none is async-signal-safe.
 *  @{ */

GG_BEGIN_DECLS

/** Devices the plugin table has room for (ordinals 0 .. GG_PLUGIN_MAX_DEVICES-1). */
#define GG_PLUGIN_MAX_DEVICES 64

/** One figure as PyTorch's allocator statistics report it: its value now, its peak since the last
 *  gg_plugin_reset_peak(), and what was added and taken away since the last
 *  gg_plugin_reset_totals(). */
typedef struct gg_plugin_stat {
  unsigned long long current;   /**< now */
  unsigned long long peak;      /**< highest value since the last peak reset (while several threads
                                     allocate at once: the highest one thread could see) */
  unsigned long long allocated; /**< total added since the last totals reset */
  unsigned long long freed;     /**< total taken away since the last totals reset */
} gg_plugin_stat_t;

/** Index of the size classes in gg_plugin_stats_t's arrays, as PyTorch splits its pools: blocks of
 *  at most 1 MiB are "small". */
enum { GG_PLUGIN_ALL = 0, GG_PLUGIN_SMALL = 1, GG_PLUGIN_LARGE = 2 };

/** Counters of one device's plugin traffic since the process started (not reset by
 *  registration). */
typedef struct gg_plugin_stats {
  unsigned long long n_allocs;        /**< successful gg_torch_alloc() calls (size > 0) */
  unsigned long long n_frees;         /**< blocks gg_torch_free() gave back to the arena */
  unsigned long long n_failed_allocs; /**< gg_torch_alloc() calls that returned NULL for size > 0
                                           (out of memory, no arena registered, a torn-down
                                           arena) */
  unsigned long long n_failed_frees;  /**< gg_torch_free() calls that could not free (no arena, a
                                           pointer the arena does not know, a failed stream wait) */
  unsigned long long n_stream_waits;  /**< allocations and frees on a stream other than the arena's
                                           (and frees of blocks recorded on one) that made one
                                           stream wait for the other first: on the device, an event
                                           recorded on one that the other waits for; the host does
                                           not wait (counted in the arena's n_events) */
  const gg_arena_t *arena;            /**< the arena registered now, or NULL */
  gg_plugin_stat_t bytes[3];          /**< bytes of live blocks handed to PyTorch, each rounded up
                                           to the arena's 256-byte quantum; [GG_PLUGIN_ALL],
                                           [..SMALL], [..LARGE] */
  gg_plugin_stat_t requested[3];      /**< the same in the bytes PyTorch asked for */
  gg_plugin_stat_t blocks[3];         /**< live blocks handed to PyTorch */
  unsigned long long reserved_[16];   /**< zero; later fields take these, so the size stays fixed */
} gg_plugin_stats_t;

/** Sets every peak in gg_plugin_stats_t of @p device to its current value
 *  (`torch.cuda.reset_peak_memory_stats`).
 *  @param device the device ordinal.
 *  @return 0; GG_EINVAL for a device out of range. Thread-safe. */
GG_API int gg_plugin_reset_peak(int device);

/** Sets the `allocated` and `freed` totals in gg_plugin_stats_t of @p device to zero
 *  (`torch.cuda.reset_accumulated_memory_stats`).
 *  @param device the device ordinal.
 *  @return 0; GG_EINVAL for a device out of range. Thread-safe. */
GG_API int gg_plugin_reset_totals(int device);
/** What the plugin holds for CUDA graphs on one device (see the group's description), exact at the
 *  moment of the call. The struct's size is fixed: later fields take the place of `reserved_`. */
typedef struct gg_plugin_graph_stats {
  size_t bytes_in_use;               /**< the graph arena's bytes in live blocks (0 when it does not
                                          exist) */
  size_t bytes_mapped;               /**< the graph arena's mapped memory */
  unsigned long long n_pools;        /**< pools alive: captures whose graph, or whose blocks, still
                                          live */
  unsigned long long n_blocks_held;  /**< blocks owned by pools, live or freed, of either arena */
  size_t bytes_held;                 /**< their bytes, as requested */
  unsigned long long n_captures;     /**< captures seen since the process started */
  unsigned long long n_unowned;      /**< live graph-arena blocks outside any pool (allocated while
                                          a capture forbade the registered arena its stream) */
  unsigned long long n_deferred;     /**< freed blocks waiting to go back until no capture forbids
                                          it */
  unsigned long long n_stream_waits; /**< host-side waits for a stream made to give blocks back */
  unsigned long long reserved_[8];   /**< room for fields later versions add; zero */
} gg_plugin_graph_stats_t;

/** Reads what the plugin holds for CUDA graphs on @p device. Gives back first what may go back
 *  without the registered arena (graph-arena blocks of destroyed graphs).
 *  @param device the device ordinal.
 *  @param[out] out filled on success (all zero when no capture was ever handled).
 *  @return 0; GG_EINVAL for NULL @p out or a device out of range. Thread-safe. */
GG_API int gg_plugin_graph_stats(int device, gg_plugin_graph_stats_t *out);

/** Trims the graph arena of @p device: gives back what may go back, then unmaps its wholly free
 *  chunks beyond @p keep bytes (gg_arena_trim()). With @p keep 0 and no live block, the graph arena
 *  is destroyed, reservation included (the next capture makes a new one). The registered arena is
 *  not touched: its owner trims it.
 *  @param device the device ordinal.
 *  @param keep bytes of mapped memory to keep.
 *  @param[out] released bytes of physical memory given back to the driver; may be NULL.
 *  @return 0 (also when there is no graph arena); GG_EINVAL for a device out of range; a driver
 *  error from the trim. Thread-safe. */
GG_API int gg_plugin_trim(int device, size_t keep, size_t *released);

/** Registers @p arena as the one that serves allocations for @p device, replacing any earlier one.
 *  Blocks an earlier arena handed out stay its own: PyTorch's later frees of them go to the arena
 *  registered at that time (and fail, counted, if it is another one); the earlier arena still gives
 *  them back when its scope ends or it is destroyed.
 *  @param device the device ordinal as PyTorch numbers it (0 .. GG_PLUGIN_MAX_DEVICES-1).
 *  @param arena the arena, or NULL to unregister.
 *  @return 0; GG_EINVAL for a device out of range or an arena that is not live. Thread-safe:
 *  returns only once no call of this table is using the arena it replaced. */
GG_API int gg_plugin_set_arena(int device, gg_arena_t *arena);

/** The arena registered for @p device, made and registered first when there is none: what a backend
 *  that creates its arenas on first use per device calls (two threads at once make one arena).
 *  @param device the device ordinal (0 .. GG_PLUGIN_MAX_DEVICES-1).
 *  @param opts options for a new arena (NULL: defaults; `device` is replaced by @p device, a NULL
 *  `name` becomes "torch"); ignored when an arena is registered already.
 *  @param[out] arena receives the registered arena, or NULL on failure.
 *  @return 0; GG_EINVAL for a NULL @p arena, a device out of range or GG_ARENA_NO_STREAM
 *  in @p opts; gg_arena_create()'s errors (GG_ENODEV without a device). Thread-safe. */
GG_API int gg_plugin_ensure_arena(int device, const gg_arena_options_t *opts, gg_arena_t **arena);

/** The arena registered for @p device.
 *  @param device the device ordinal.
 *  @param[out] arena receives the arena, or NULL when none is registered.
 *  @return 0; GG_EINVAL for a NULL @p arena or a device out of range. Thread-safe. */
GG_API int gg_plugin_get_arena(int device, gg_arena_t **arena);

/** Reads the plugin counters of @p device. Each calling thread keeps its own deltas; they are
 *  folded in first, so the counts and current figures are exact.
 *  @param device the device ordinal.
 *  @param[out] stats filled on success.
 *  @return 0; GG_EINVAL for NULL @p stats or a device out of range. Thread-safe. */
GG_API int gg_plugin_stats(int device, gg_plugin_stats_t *stats);

/** PyTorch's allocation entry point: @p size bytes from the arena registered for @p device, tagged
 *  "torch", 256-byte aligned.
 *  @param size bytes wanted; 0 gives NULL (no memory, no error); negative is an error.
 *  @param device the device ordinal PyTorch allocates on.
 *  @param stream the stream the block will be used on (a `cudaStream_t`, i.e. a CUstream; NULL for
 *  the default stream). For a stream other than the arena's, that stream is made to wait for the
 *  arena's on the device (see the group's description), so the block is safe for it.
 *  @return the device address, or NULL on failure (one line on stderr, counted in n_failed_allocs).
 *  Thread-safe. */
GG_API void *gg_torch_alloc(ssize_t size, int device, void *stream);

/** Records that the block at @p ptr is used on @p stream too (`Tensor.record_stream`): when PyTorch
 *  frees the block, gg_torch_free() first makes the arena's stream wait for @p stream's work so far
 *  (on the device, counted in n_stream_waits), so work queued there before the free never sees the
 *  block handed out again.
 *  @param device the device ordinal the block was allocated on.
 *  @param ptr the block, as gg_torch_alloc() returned it.
 *  @param stream the other stream (a CUstream; NULL is the default stream).
 *  @return 0; GG_EINVAL for a device out of range or a NULL @p ptr; GG_ENOMEM when the record
 *  cannot be kept (then the caller must synchronise @p stream itself). Thread-safe. */
GG_API int gg_plugin_record_stream(int device, void *ptr, void *stream);

/** gg_torch_alloc() with a status: what a caller that reports failures itself uses (the C++ entry
 *  point that raises a Python exception through PyTorch does). Writes nothing to stderr.
 *  @param size bytes wanted; 0 gives *ptr = NULL and 0.
 *  @param device the device ordinal PyTorch allocates on.
 *  @param stream the stream the block will be used on (see gg_torch_alloc()).
 *  @param[out] ptr the device address, or NULL on failure.
 *  @return 0; GG_ENOMEM when the arena cannot hold it (gg_last_error() has the arena's full detail:
 *  request, in use, mapped, capacity, largest free block); GG_ESTATE when no arena is registered
 *  for
 *  @p device or it was torn down; GG_EINVAL for a negative size, a device out of range or a NULL
 *  @p ptr. Counted like gg_torch_alloc(). Thread-safe. */
GG_API int gg_torch_alloc_status(ssize_t size, int device, void *stream, void **ptr);

/** PyTorch's free entry point: gives @p ptr back to the arena registered for @p device, after
 *  waiting for @p stream when it is not the arena's stream (see the group's description).
 *  @param ptr the block; NULL is a no-op.
 *  @param size the size given at allocation (not needed: the arena knows it).
 *  @param device the device ordinal given at allocation.
 *  @param stream the stream given at allocation.
 *  Failures write one line to stderr and are counted in n_failed_frees. Thread-safe. */
GG_API void gg_torch_free(void *ptr, ssize_t size, int device, void *stream);

/** Flags of gg_torch_alloc_ex() and gg_torch_free_ex(). */
typedef enum gg_torch_flags {
  /** The caller announces every stream capture of the process that it allocates under, with
   *  gg_plugin_announce_capture() before the capture begins and gg_plugin_capture_ended() after it
   *  ends, and serves a capture's allocations itself (as PyTorch's allocator interface does: every
   *  `torch.cuda.graph` calls beginAllocateToPool first). While no capture is announced, the call
   *  skips the driver's capture query (one cuStreamGetCaptureInfo a call, ~0.2 µs on an H200);
   *  while one is, it asks as a call without the flag does. A capture begun without an
   *  announcement (a raw cudaStreamBeginCapture on the caller's stream) is then not seen: its
   *  blocks are not kept for its graph. */
  GG_TORCH_ANNOUNCED = 1 << 0,
  /** The caller keeps PyTorch-style statistics itself: the call is left out of gg_plugin_stats()
   *  (blocks, bytes, failures, n_allocs and n_frees). */
  GG_TORCH_OWN_STATS = 1 << 1,
} gg_torch_flags_t;

/** gg_torch_alloc_status() with flags: the entry point of a caller that announces its captures
 *  and keeps its own statistics (gpuguard's native PyTorch backend).
 *  @param size bytes wanted; 0 gives *ptr = NULL and 0.
 *  @param device the device ordinal PyTorch allocates on.
 *  @param stream the stream the block will be used on (see gg_torch_alloc()).
 *  @param flags GG_TORCH_ANNOUNCED, GG_TORCH_OWN_STATS, or'ed; 0 is gg_torch_alloc_status().
 *  @param[out] ptr the device address, or NULL on failure.
 *  @return as gg_torch_alloc_status(); GG_EINVAL for an unknown flag. Writes nothing to stderr.
 *  Thread-safe. */
GG_API int gg_torch_alloc_ex(ssize_t size, int device, void *stream, unsigned flags, void **ptr);

/** gg_torch_free() with flags and a status, writing nothing to stderr.
 *  @param ptr the block; NULL is a no-op (0).
 *  @param size the size given at allocation (feeds the statistics only).
 *  @param device the device ordinal given at allocation.
 *  @param stream the stream given at allocation.
 *  @param flags as for gg_torch_alloc_ex().
 *  @return 0; GG_EINVAL for a device out of range, an unknown flag or a pointer the arena did not
 *  hand out (the arena's detail in gg_last_error()); GG_ESTATE when no arena is registered for @p
 *  device any more. Thread-safe. */
GG_API int gg_torch_free_ex(void *ptr, ssize_t size, int device, void *stream, unsigned flags);

/** Announces a stream capture about to begin, for calls made with GG_TORCH_ANNOUNCED: returns once
 *  every such call that did not see the announcement has ended, so none of them touches a stream
 *  during the capture. Announcements nest (one per capture under way, any device).
 *  @return 0. Thread-safe. */
GG_API int gg_plugin_announce_capture(void);

/** Ends one announcement of gg_plugin_announce_capture(), after its capture ended.
 *  @return 0; GG_ESTATE when no announcement is open. Thread-safe. */
GG_API int gg_plugin_capture_ended(void);

GG_END_DECLS

/** @} */
#endif
