/* gpuguard/arena.h — arenas of device memory: scoped allocation, stream-safe reuse, trim,
 * statistics. */
#ifndef GPUGUARD_ARENA_H
#define GPUGUARD_ARENA_H

#include <stddef.h>
#include <stdint.h>

#include "gpuguard/export.h"

/** @defgroup gg_arena Arenas and scopes
 *  An arena reserves one virtual range of device memory (its capacity) and maps physical memory
 *  into it in chunks as it grows; pointers never move. Allocations carry host-side metadata only.
 *  Scopes nest: gg_scope_end() releases every block allocated inside the scope that is still live.
 *  gg_arena_trim() unmaps wholly free chunks and gives them back to the driver.
 *
 *  Every call is thread-safe. No call is async-signal-safe. An arena created before fork() refuses
 *  every call in the child with GG_ESTATE.
 *
 *  Memory is mapped 8 MiB at a time by default (an allocation larger than that is mapped as 8 MiB
 *  pieces, so trim can return each piece no live block touches): few enough driver calls to grow to
 *  a whole device, and never more than one chunk mapped beyond what the arena needs. Before a
 *  growth that would raise the peak of mapped memory, wholly free chunks are given back first
 *  (waiting for the stream if memory was released in stream order), so peak mapped stays close to
 *  peak in use. Released memory joins a batch; one event per batch, recorded on the arena's stream
 *  when the allocator would otherwise map more (or the batch grows large), tells when the batch may
 *  be handed out again, so a free costs no driver call.
 *
 *  Under a guard: an arena created while a guard (see @ref gg_guard) of the same backend and device
 *  lives attaches itself to the newest such guard. The guard's teardown (explicit, at exit() or on
 *  a signal) gives the arena's device memory back, LIFO with the guard's other cleanups, after
 *  listing its live blocks in the leak report. Before unmapping it waits for the work queued on
 *  every stream of the context (kernels on other streams may use the memory too; gg_arena_destroy()
 *  waits for the arena's stream only), at most 2 s per arena: past that the memory is unmapped
 *  anyway, as at process exit, and stderr says so. The handle stays valid, every call on it but
 *  gg_arena_destroy() then fails with GG_ESTATE, and gg_arena_destroy() frees it. An arena
 *  destroyed first detaches itself.
 *
 *  Use after destroy: a destroyed handle stays readable for the next 64 destroys, so a late call on
 *  it fails with GG_EINVAL ("not a live arena"); after that it is a dangling pointer like any
 *  other.
 *  @{ */

/** An arena (opaque). */
typedef struct gg_arena gg_arena_t;

/** Do not track the arena's stream: released memory is reusable at once. For callers who
 *  synchronise themselves. */
#define GG_ARENA_NO_STREAM 0x1u
/** Trim (keep 0 bytes) whenever the outermost scope ends. */
#define GG_ARENA_TRIM_ON_SCOPE_EXIT 0x2u
/** Record where each block is allocated: a short backtrace (up to 8 return addresses, the caller of
 *  gg_alloc()/gg_alloc_ex() first), kept while the block lives. gg_arena_foreach_block() reports it
 *  (@ref gg_block_info::frames) and a guard's leak report prints the top sites under each tag of
 *  the surviving blocks, with function names where the program exports them (link with `-rdynamic`
 *  for an executable's own functions). Names are looked up only when a report is printed. For
 *  finding leaks: each allocation unwinds the stack (roughly 1 µs per frame with glibc's
 *  backtrace(), see docs/arena.md) and takes the arena's lock. The environment variable
 *  GPUGUARD_BACKTRACE=1 (read when an arena is created) turns it on for every arena; it cannot turn
 *  off the flag given here. */
#define GG_ARENA_BACKTRACE 0x4u
/** The arena serves a caching allocator whose callers come back for the sizes they freed (a
 *  framework's tensors: each training step allocates what the last one did). Growth then never
 *  moves the bump block into a free hole larger than a share of what is mapped: such a hole is kept
 *  for the large block that left it. Scopes still work on such an arena, but their ends are no
 *  longer O(1). */
#define GG_ARENA_KEEP_HOLES 0x8u

/** Options for gg_arena_create(). Fill with gg_arena_options_init() first; new fields are only ever
 *  added at the end. */
typedef struct gg_arena_options {
  int device;          /**< device ordinal; default 0 */
  const char *backend; /**< "auto", "cuda", "host" or NULL (then GPUGUARD_BACKEND, else auto) */
  size_t capacity;     /**< bytes of address space to reserve; 0: the device's memory size */
  size_t chunk_size;   /**< bytes mapped at a time as the arena grows, rounded up to the driver's
                            granularity; 0: the library's default */
  void *stream;        /**< the stream whose queued work may still use released memory (a CUstream,
                            or a gg_host_stream on the host backend, where any other handle but
                            0x1/0x2, the default streams, is refused with GG_EINVAL); NULL: the
                            default stream */
  unsigned flags;      /**< GG_ARENA_* flags */
  const char *name;    /**< a name for reports (copied); NULL: "arena" */
} gg_arena_options_t;

/** Statistics of an arena, exact at the moment of the call. The struct's size is fixed: fields
 *  later versions add take the place of `reserved_`, so a program built against this header is
 *  never written past by a newer library. */
typedef struct gg_arena_stats {
  size_t bytes_in_use;         /**< bytes in live blocks (sizes rounded up to a multiple of 256) */
  size_t bytes_mapped;         /**< physical memory mapped now */
  size_t bytes_reserved;       /**< address space reserved (the capacity) */
  size_t peak_in_use;          /**< highest bytes_in_use since creation (threads: docs/arena.md) */
  size_t peak_mapped;          /**< highest bytes_mapped since creation */
  size_t largest_free_block;   /**< largest block of mapped memory that is free */
  unsigned long long n_live;   /**< live blocks */
  unsigned long long n_allocs; /**< successful allocations */
  unsigned long long n_frees;  /**< blocks released (gg_free or scope end) */
  unsigned long long n_trims;  /**< trims that returned memory */
  unsigned long long bytes_trimmed; /**< bytes trims returned, in all */
  int scope_depth;                  /**< scopes open now */
  double fragmentation; /**< 1 - largest_free_block / (bytes_mapped - bytes_in_use); 0 when
                             nothing mapped is free */
  size_t bytes_pending; /**< released bytes not reusable yet: waiting for work queued on the stream
                             before their release, or for the bump log to be compacted */
  unsigned long long n_chunks; /**< chunks mapped now */
  unsigned long long n_events; /**< events recorded to track released memory, on the stream or, for
                                    plugin calls on another stream, on the stream the other waits
                                    for (driver calls that stream tracking cost; 0 with
                                    GG_ARENA_NO_STREAM) */
  /** host-side waits for the stream (or one of its events) the arena made: to trim or grow over
   *  memory released in stream order, and to reuse pending releases when memory ran out */
  unsigned long long n_stream_waits;
  unsigned long long n_maps; /**< chunks mapped since creation (driver allocations: cuMemCreate) */
  unsigned long long n_unmaps; /**< chunks given back since creation, by trims and growth's trims */
  /** free chunks a growth mapped at the addresses it needed instead of new memory (VMM): their
   *  memory moved, no driver allocation was made */
  unsigned long long n_moves;
  unsigned long long reserved_[13]; /**< room for fields later versions add; zero */
} gg_arena_stats_t;

/** A scope of an arena. Plain data the caller owns (on its stack); filled by gg_scope_begin(). */
typedef struct gg_scope {
  gg_arena_t *arena;     /**< the arena the scope belongs to */
  unsigned long long id; /**< identifies the scope within its arena */
} gg_scope_t;

/** One live block, as gg_arena_foreach_block() reports it. */
typedef struct gg_block_info {
  void *ptr;       /**< the block's device address */
  size_t size;     /**< bytes requested */
  const char *tag; /**< the tag given at allocation, or "" */
  int scope_depth; /**< depth of the scope it was allocated in (0: outside any scope) */
  int n_frames;    /**< entries in @p frames: 0 unless the arena has GG_ARENA_BACKTRACE */
  /** where it was allocated: return addresses, the allocating call's first (dladdr() names them);
   *  valid during the visit only; NULL when n_frames is 0 */
  void *const *frames;
} gg_block_info_t;

/** Called once per live block; return non-zero to stop early. Must not call into the arena. */
typedef int (*gg_block_visitor_t)(const gg_block_info_t *block, void *user);

GG_BEGIN_DECLS

/** Fills @p opts with the defaults (device 0, backend from the environment, capacity 0 = device
 *  memory size, default chunk size, default stream, no flags). NULL is a no-op. */
GG_API void gg_arena_options_init(gg_arena_options_t *opts);

/** Creates an arena: opens the device (retaining its primary context) and reserves the address
 *  range. No physical memory is mapped until the first allocation.
 *  @param[out] arena receives the handle.
 *  @param opts options, or NULL for the defaults.
 *  @return 0; GG_EINVAL for NULL arena or bad options/environment; GG_ENODEV when the device or
 *  driver is missing; GG_ENOMEM when the range cannot be reserved; GG_EDRIVER for other driver
 *  failures. */
GG_API int gg_arena_create(gg_arena_t **arena, const gg_arena_options_t *opts);

/** Destroys an arena: waits for work on its stream, unmaps and releases every chunk and the range,
 *  and frees the handle, whatever blocks were still live (read gg_arena_stats() or
 *  gg_arena_foreach_block() first to report them). NULL is a no-op returning 0. Thread-safe: calls
 *  on the arena from other threads meanwhile either finish first or fail with GG_EINVAL, and
 *  destroy returns only once none of them is still inside the arena; of two destroys at once, one
 *  does the work and the other fails with GG_EINVAL.
 *  @return 0, or the first error met while giving memory back (the handle is freed regardless);
 *  GG_EINVAL for a handle that is not a live arena; GG_ESTATE in a forked child (nothing is
 *  touched: the child must not use its parent's device state). */
GG_API int gg_arena_destroy(gg_arena_t *arena);

/** Allocates @p size bytes aligned to 256 bytes. Same as gg_alloc_ex(arena, size, 0, NULL, ptr). */
GG_API int gg_alloc(gg_arena_t *arena, size_t size, void **ptr);

/** Allocates @p size bytes.
 *  @param arena the arena.
 *  @param size bytes wanted, more than 0 (rounded up to a multiple of 256 for accounting).
 *  @param align a power of two (0: 256); alignments below 256 are raised to 256.
 *  @param tag a short label kept for statistics and leak reports (copied; NULL: none).
 *  @param[out] ptr receives the device address.
 *  @return 0; GG_EINVAL for NULL arena or ptr, size 0, sizes that overflow, or a bad alignment;
 *  GG_ENOMEM when the capacity or the device is exhausted, with a message giving the request, bytes
 *  in use, mapped, the capacity and the largest free block; GG_ESTATE after fork. */
GG_API int gg_alloc_ex(gg_arena_t *arena, size_t size, size_t align, const char *tag, void **ptr);

/** Allocates exactly the range [@p ptr, @p ptr + @p size) of the arena's mapped memory, when all of
 *  it is free: for a caller that restores an earlier state of the arena (the blocks that were live
 *  at a checkpoint, back at their addresses), which gg_alloc() cannot ask for. The block is freed
 *  as any other (gg_free(), gg_free_on(), the end of its scope). Never maps memory and never waits
 *  for a stream; free blocks held by threads' caches count as free. O(free blocks of the arena).
 *  @param arena the arena.
 *  @param ptr the block's address: a multiple of 256 inside memory the arena has mapped.
 *  @param size bytes, more than 0 (rounded up to a multiple of 256, as gg_alloc() does).
 *  @return 0; GG_EINVAL for a NULL arena or ptr, size 0, a ptr that is not a multiple of 256, a
 *  range that overflows, or one not wholly inside mapped memory; GG_ESTATE when part of the range
 * is not free (it overlaps a live block, or memory released in stream order that is not reusable
 *  yet) or after fork; GG_ENOMEM when the host is out of memory. The arena is unchanged on error.
 */
GG_API int gg_alloc_at(gg_arena_t *arena, void *ptr, size_t size);

/** Releases one block. Its memory is not handed out again until work queued on the arena's stream
 *  before this call has completed (at once with GG_ARENA_NO_STREAM). Makes no driver call, except
 *  one event record for a batch that has grown large.
 *  @return 0; GG_EINVAL for NULL, a pointer this arena did not return, a pointer into the middle of
 *  a block, or a block already freed (double free). */
GG_API int gg_free(gg_arena_t *arena, void *ptr);

/** Allocates @p size bytes for work queued on @p stream, in stream order (as cudaMallocAsync does).
 *  A block freed on the arena's own stream is reusable at once by later work on that stream. When
 *  @p stream is another one, it is first made to wait, on the device, for the work queued on the
 *  arena's stream so far (an event recorded there; the host never waits): blocks released onto the
 *  arena's stream may still be in use there. With GG_ARENA_NO_STREAM nothing is ordered.
 *  @param arena the arena.
 *  @param size bytes wanted, more than 0.
 *  @param stream the stream the block will be used on (a CUstream; NULL or 0x1 is the legacy
 *  default stream).
 *  @param[out] ptr receives the device address, 256-byte aligned.
 *  @return 0; gg_alloc_ex()'s errors; a driver error from the stream wait (then nothing is
 *  allocated). Thread-safe. */
GG_API int gg_alloc_on(gg_arena_t *arena, size_t size, void *stream, void **ptr);

/** Frees a block in stream order (as cudaFreeAsync does): work queued on @p stream before this call
 *  may still use it. On the arena's own stream the block is reusable at once by later work on that
 *  stream. On another stream, the arena's stream first waits, on the device, for the work queued on
 *  @p stream so far; the block is then in the arena's stream order. If that wait cannot be queued,
 *  the block is not freed (it stays until its scope ends or the arena is destroyed): memory that
 *  work may still read is never handed out.
 *  @param arena the arena.
 *  @param ptr the block; NULL is an error, as for gg_free().
 *  @param stream the stream work on the block was last queued on (NULL or 0x1: the legacy default
 *  stream).
 *  @return 0; gg_free()'s errors; a driver error from the stream wait. Thread-safe. */
GG_API int gg_free_on(gg_arena_t *arena, void *ptr, void *stream);

/** Makes the arena's stream wait, on the device, for the work queued on @p stream so far (an event
 *  recorded on @p stream that the arena's stream waits for). For a block used on a second stream
 *  (`Tensor.record_stream`): call it before gg_free_on() so the block is not handed out while that
 *  stream may still use it.
 *  @param arena the arena.
 *  @param stream the other stream (NULL or 0x1: the legacy default stream).
 *  @return 1 when a wait was queued; 0 when none was needed (the arena's own stream, or
 *  GG_ARENA_NO_STREAM); GG_EINVAL for a handle that is not a live arena; a driver error.
 *  Thread-safe. */
GG_API int gg_arena_join_stream(gg_arena_t *arena, void *stream);

/** The options the arena applies, as gg_arena_create() settled them: device, backend ("cuda" or
 *  "host", static text), capacity and chunk size rounded to the driver's granularity, stream, flags
 *  (GPUGUARD_BACKTRACE included) and name (the arena's own copy, valid while it lives). What a
 * layer that makes a second arena like this one needs.
 *  @param arena the arena.
 *  @param[out] out filled on success.
 *  @return 0; GG_EINVAL for a NULL @p out or a handle that is not a live arena; GG_ESTATE after
 *  fork or teardown. Thread-safe. */
GG_API int gg_arena_get_options(gg_arena_t *arena, gg_arena_options_t *out);

/** Opens a scope. Scopes nest and end in LIFO order.
 *  @return 0; GG_EINVAL for NULL arguments. */
GG_API int gg_scope_begin(gg_arena_t *arena, gg_scope_t *scope);

/** Ends a scope: releases every block allocated inside it (and inside scopes nested in it) that is
 *  still live. O(blocks released); O(1) when every block of the scope was carved from the top of
 *  the arena (the common case: a scope per step).
 *  @return 0; GG_ESTATE when a scope opened inside this one is still open, or the scope already
 *  ended (nothing is changed then); GG_EINVAL for NULL or a destroyed arena. With
 *  GG_ARENA_TRIM_ON_SCOPE_EXIT, the error of the trim that follows the outermost scope (the scope
 *  has ended regardless). */
GG_API int gg_scope_end(gg_scope_t *scope);

/** Unmaps every mapped chunk that is entirely free, beyond @p keep_bytes of mapped memory, once the
 *  work that last used it has completed, and gives it back to the driver. Chunks anywhere in the
 *  range qualify, highest first; a chunk is only unmapped when at least @p keep_bytes stay mapped
 *  after it. May block: it waits for the work queued on the arena's stream before released memory.
 *  @return 0; GG_EINVAL for NULL; a driver error (the arena stays consistent, chunks not yet
 *  unmapped stay mapped). */
GG_API int gg_arena_trim(gg_arena_t *arena, size_t keep_bytes);

/** Sets the arena's peaks (`peak_in_use`, `peak_mapped`) to their current values, so a later
 *  gg_arena_stats() reports the highest values since this call
 *  (`torch.cuda.reset_peak_memory_stats` under `gpuguard.torch.use_arena` calls it).
 *  @param arena the arena.
 *  @return 0; GG_EINVAL for a NULL, destroyed or foreign handle; GG_ESTATE after fork or teardown.
 *  Thread-safe. */
GG_API int gg_arena_reset_peak(gg_arena_t *arena);

/** Reads the arena's statistics. Released memory whose work has completed is counted as free first
 *  (an event record and a query on the stream, never a wait).
 *  @return 0; GG_EINVAL for NULL arguments. */
GG_API int gg_arena_stats(gg_arena_t *arena, gg_arena_stats_t *stats);

/** gg_arena_stats() without asking the stream: no event is recorded and no stream queried, so it
 *  may be called while a stream captures a CUDA graph. Released memory whose work may have
 *  completed meanwhile still counts as pending (bytes_pending) and not in largest_free_block.
 *  @return 0; GG_EINVAL for NULL arguments or a handle that is not live. Thread-safe. */
GG_API int gg_arena_stats_quiet(gg_arena_t *arena, gg_arena_stats_t *stats);

/** Calls @p visit for every live block, in address order, under the arena's lock.
 *  @return 0, or GG_EINVAL for NULL arena or visitor. */
GG_API int gg_arena_foreach_block(gg_arena_t *arena, gg_block_visitor_t visit, void *user);

/** One mapped range of an arena, as gg_arena_foreach_chunk() reports it. */
typedef struct gg_chunk_info {
  void *ptr;   /**< the range's first device address */
  size_t size; /**< its bytes */
} gg_chunk_info_t;

/** Called once per mapped range; return non-zero to stop early. Must not call into the arena. */
typedef int (*gg_chunk_visitor_t)(const gg_chunk_info_t *chunk, void *user);

/** Calls @p visit for every mapped range of the arena, in address order, under the arena's lock.
 *  Chunks mapped at consecutive addresses are reported as one range, so no block spans two ranges
 *  (a memory snapshot's "segments").
 *  @return 0; GG_EINVAL for a NULL, destroyed or foreign arena or a NULL visitor; GG_ESTATE after
 *  fork or teardown. */
GG_API int gg_arena_foreach_chunk(gg_arena_t *arena, gg_chunk_visitor_t visit, void *user);

/** One physical allocation of an arena, as gg_arena_foreach_mapping() reports it: what the backend
 *  created and mapped in one piece. */
typedef struct gg_mapping_info {
  void *ptr;       /**< its first device address */
  size_t size;     /**< its bytes */
  uint64_t handle; /**< the backend's handle of the physical memory: a CUmemGenericAllocationHandle
                        on the cuda backend with virtual memory management (exportable as a POSIX
                        file descriptor with cuMemExportToShareableHandle where the driver allows
                        it), 0 where there is none (cuMemAlloc'd chunks, the host backend) */
} gg_mapping_info_t;

/** Called once per physical allocation; return non-zero to stop early. Must not call into the
 *  arena; calling the driver is allowed (the mapping stays while the walk runs). */
typedef int (*gg_mapping_visitor_t)(const gg_mapping_info_t *mapping, void *user);

/** Calls @p visit for every physical allocation that overlaps [@p ptr, @p ptr + @p size), in
 *  address order, under the arena's lock: what a process must export to share a block with another
 *  one (CUDA IPC through shareable handles). A mapping may start before @p ptr and end after its
 *  range. Mappings that hold a live block of the arena stay mapped at least as long as that block.
 *  @param arena the arena.
 *  @param ptr the range's first address.
 *  @param size its bytes (at least 1).
 *  @param visit the visitor.
 *  @param user passed to @p visit.
 *  @return 0 when the whole range is mapped; GG_ENOTFOUND when some byte of it is not (the visitor
 *  has seen the mappings before the hole); GG_EINVAL for a NULL, destroyed or foreign arena, a NULL
 *  visitor, a size of 0 or a range that wraps; GG_ESTATE after fork or teardown. Thread-safe. */
GG_API int gg_arena_foreach_mapping(gg_arena_t *arena, const void *ptr, size_t size,
                                    gg_mapping_visitor_t visit, void *user);

/** Limits the memory the arena maps to @p limit bytes (rounded down to the driver's granularity),
 *  below its capacity: a growth past the limit fails with GG_ENOMEM as if the capacity were
 *  reached. What is mapped already stays mapped (a trim gives it back). PyTorch's per-process
 *  memory fraction.
 *  @param arena the arena.
 *  @param limit bytes; 0 or anything at or above the capacity removes the limit.
 *  @return 0; GG_EINVAL for a NULL, destroyed or foreign arena; GG_ESTATE after fork or teardown.
 *  Thread-safe. */
GG_API int gg_arena_set_limit(gg_arena_t *arena, size_t limit);

/** The limit gg_arena_set_limit() set, or the capacity when none is set.
 *  @param arena the arena.
 *  @param[out] limit receives the bytes.
 *  @return 0; GG_EINVAL for NULL arguments or a handle that is not live. Thread-safe. */
GG_API int gg_arena_get_limit(gg_arena_t *arena, size_t *limit);

/** The arena's name (as given in its options, or "arena"); never NULL for a valid arena. */
GG_API const char *gg_arena_name(const gg_arena_t *arena);

/** The backend the arena runs on: "cuda" or "host"; NULL for a NULL arena. */
GG_API const char *gg_arena_backend(const gg_arena_t *arena);

/** Copies @p n bytes from host memory to device memory of the arena, synchronously. Meant for
 *  tests, examples and bindings that must show memory is real without calling the CUDA runtime. The
 *  arena's lock is held for the copy (and so are the other two copy helpers'), so that a guard's
 *  teardown cannot unmap the block under it; other calls on the arena wait meanwhile.
 *  @param arena the arena the block belongs to.
 *  @param dst a device address: [dst, dst+n) must lie inside one live block of @p arena.
 *  @param src host memory.
 *  @param n bytes to copy.
 *  @return 0 (also for n == 0); GG_EINVAL for NULL arguments or a range outside the arena's live
 *  blocks; a driver error. Thread-safe. */
GG_API int gg_arena_copy_to_device(gg_arena_t *arena, void *dst, const void *src, size_t n);

/** Copies @p n bytes from device memory of the arena to host memory, synchronously.
 *  @param arena the arena the block belongs to.
 *  @param dst host memory.
 *  @param src a device address: [src, src+n) must lie inside one live block of @p arena.
 *  @param n bytes to copy.
 *  @return 0 (also for n == 0); GG_EINVAL for NULL arguments or a range outside the arena's live
 *  blocks; a driver error. Thread-safe. */
GG_API int gg_arena_copy_from_device(gg_arena_t *arena, void *dst, const void *src, size_t n);

/** Sets @p n bytes of device memory of the arena to @p value (its low 8 bits), synchronously.
 *  @param arena the arena the block belongs to.
 *  @param dst a device address: [dst, dst+n) must lie inside one live block of @p arena.
 *  @param value the byte to write (its low 8 bits).
 *  @param n bytes to set.
 *  @return 0 (also for n == 0); GG_EINVAL for a NULL or out-of-block range; a driver error.
 *  Thread-safe. */
GG_API int gg_arena_memset(gg_arena_t *arena, void *dst, int value, size_t n);

GG_END_DECLS

/** @} */
#endif
