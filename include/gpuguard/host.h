/* gpuguard/host.h — the host backend: a simulated device in host memory, with fault injection. */
#ifndef GPUGUARD_HOST_H
#define GPUGUARD_HOST_H

#include "gpuguard/export.h"

/** @defgroup gg_host Host backend
 *  A simulated device in host memory, selected with GPUGUARD_BACKEND=host (or automatically when no
 *  CUDA device is usable). Device pointers are ordinary host addresses the CPU can read and write.
 *
 *  - A virtual range is reserved with mmap(PROT_NONE); mapping commits and populates pages, so the
 *    process's resident memory really grows, and unmapping gives the pages back to the kernel.
 *  - Capacity (the simulated device's memory size): GPUGUARD_HOST_CAPACITY, bytes with an optional
 *    K/M/G/T suffix; default 1 GiB. Mapping beyond it fails with GG_ENOMEM.
 *  - Granularity: GPUGUARD_HOST_GRANULARITY (a power of two, at least the page size); default 2
 *    MiB, as on NVIDIA datacenter GPUs.
 *  - GPUGUARD_HOST_VMM=0 simulates a device without virtual memory management: every map returns a
 *    separate region, as cuMemAlloc'd chunks would be.
 *  - GPUGUARD_HOST_RANGE_UNMAP=0 simulates a driver that refuses to unmap, in one call, a range
 *    that spans several mappings (the default takes it, refusing only a range that cuts a mapping
 *    or is not wholly mapped): trim then unmaps chunk by chunk.
 *  - Faults: GPUGUARD_HOST_FAULT or gg_host_fault_set() (see there).
 *
 *  These values are read whenever the simulated device goes from no open handle to one.
 *  @{ */

GG_BEGIN_DECLS

/** Arms deterministic fault injection in the host backend, replacing any earlier spec and resetting
 *  every operation counter to zero.
 *
 *  @param spec a comma-separated list of `OP:N` (the N-th call of OP fails, once), `OP:N+` (the
 *  N-th and every later call fails) or `OP:*` (every call fails), each optionally followed by
 *  `=nomem` to fail with GG_ENOMEM instead of GG_EDRIVER. OP is one of: open, mem_info, reserve,
 *  release, map, unmap, unmap_range (one unmap spanning several chunks: trim and destroy), remap
 *  (a free chunk's memory mapped where a growth needs it), copy,
 *  set, event_create, event_record, event_query, event_sync, event_destroy, stream_sync,
 *  stream_query, ctx_reset, stream_capture, graph_retain, ctx_sync (a wait for every stream: the
 *  guard's teardown of an arena). NULL or "" disarms every fault.
 *  @return 0, or GG_EINVAL naming the bad part of the spec (the previous spec then stays armed).
 *  Thread-safe. Example: `gg_host_fault_set("map:3,unmap:1+")`. */
GG_API int gg_host_fault_set(const char *spec);

/** How many times OP has been called since the last gg_host_fault_set() (or process start).
 *  @return the count, or 0 for an unknown OP name. Thread-safe. */
GG_API unsigned long long gg_host_op_count(const char *op);

/** Creates a simulated stream for the host backend. Work on the host device completes at once,
 *  except on a stream that is held: completion recorded on it stays pending until it is released,
 *  which is how tests show that memory is not reused while queued work may still read it.
 *  @param[out] stream receives the handle; pass it wherever a stream is accepted (arena options).
 *  Wherever the host backend takes a stream, it accepts only such a live handle, NULL, and CUDA's
 *  special handles cudaStreamLegacy (0x1) and cudaStreamPerThread (0x2), which name a default
 *  stream as NULL does (work on it is complete at once; the per-thread one can be captured, as in
 *  CUDA). Any other value (a CUstream after a fallback to the host backend, a destroyed handle) is
 *  refused with GG_EINVAL, never dereferenced.
 *  @return 0, GG_EINVAL for a NULL out-pointer, GG_ENOMEM when host memory runs out. */
GG_API int gg_host_stream_create(void **stream);

/** Holds a stream: completion recorded on it from now on stays pending.
 *  @return 0, or GG_EINVAL for NULL, a default stream or a handle that is not a live host
 *  stream. */
GG_API int gg_host_stream_hold(void *stream);

/** Releases a held stream: everything recorded on it so far completes.
 *  @return 0, or GG_EINVAL for NULL, a default stream or a handle that is not a live host
 *  stream. */
GG_API int gg_host_stream_release(void *stream);

/** Destroys a stream made by gg_host_stream_create(). NULL is a no-op.
 *  @return 0, or GG_EINVAL for a handle that is not a live host stream (destroyed already, say).
 *  The handle is refused from then on; events recorded on it still complete. */
GG_API int gg_host_stream_destroy(void *stream);

/** Begins a simulated CUDA graph capture on @p stream, in CUDA's global capture mode. Until
 *  gg_host_stream_capture_end(), an event recorded on the stream, a query or wait on such an event,
 *  a query or wait on the stream itself, or any of these on the legacy (NULL) stream (while any
 *  capture is underway) invalidates the capture, and the operation fails. The library's capture
 *  query reports the capture's id for @p stream (and "some capture is underway" for the NULL
 *  stream). Objects the library ties to the capture's graph are released when the graph is
 *  destroyed.
 *  @param stream a stream made by gg_host_stream_create().
 *  @return 0; GG_EINVAL for NULL or 0x1 (the legacy stream cannot be captured, as in CUDA) and for
 *  a handle that is neither a live host stream nor 0x2; GG_ESTATE when the stream captures already;
 *  GG_ENOMEM. Thread-safe. */
GG_API int gg_host_stream_capture_begin(void *stream);

/** Ends the capture on @p stream. A valid capture becomes a live graph, identified by @p graph_id,
 *  until gg_host_graph_destroy(). An invalidated capture gives no graph: what it retained is
 *  released at once (as cuStreamEndCapture destroys the partial graph).
 *  @param stream the capturing stream.
 *  @param[out] graph_id receives the graph's id (never 0), or 0 on failure; may be NULL.
 *  @return 0; GG_ESTATE when the stream is not capturing, or when the capture was invalidated (the
 *  detail names the first operation that invalidated it). Thread-safe. */
GG_API int gg_host_stream_capture_end(void *stream, unsigned long long *graph_id);

/** Destroys a live graph: runs, on the calling thread, the release callbacks of everything the
 *  library tied to it during its capture (as the CUDA driver does on a thread of its own once a
 *  graph and its executable instances are gone).
 *  @param graph_id the id gg_host_stream_capture_end() gave.
 *  @return 0; GG_EINVAL when no live graph has that id (destroyed already, or never made).
 *  Thread-safe. */
GG_API int gg_host_graph_destroy(unsigned long long graph_id);

GG_END_DECLS

/** @} */
#endif
