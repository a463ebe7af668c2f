/* backend.h — the one interface between the library and a device; everything that touches the
 * driver or device memory goes through it. Two implementations: cuda.c (driver loaded at run time)
 * and host.c (a simulated device in host memory with fault injection). */
#ifndef GG_BACKEND_H
#define GG_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct gg__dev gg__dev_t;

/* Physical memory mapped at ptr. With a contiguous backend, ptr is the address the caller chose
 * inside its reservation; otherwise the backend chose it (cuMemAlloc'd chunks on devices without
 * VMM). */
typedef struct gg__chunk {
  uintptr_t ptr;
  size_t size;
  uintptr_t handle; /* the backend's physical handle (a CUmemGenericAllocationHandle), or 0 */
  bool alias;       /* a second mapping of memory another record owns (remap): only unmapped */
} gg__chunk_t;

typedef struct gg__dev_props {
  char name[256];
  char uuid[48]; /* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" as nvidia-smi prints it */
  size_t total_mem;
  int cc_major, cc_minor; /* compute capability; 0.0 on the host backend */
  int driver_version;     /* e.g. 13000; 0 on the host backend */
  bool vmm;               /* virtual memory management: reserve once, map into the range */
} gg__dev_props_t;

/* Every operation returns 0 or a negative GG_E* code with gg_last_error() set. All are thread-safe.
 * None is async-signal-safe. */
typedef struct gg__backend_ops {
  const char *name;
  int (*mem_info)(gg__dev_t *d, size_t *free_b, size_t *total_b);
  /* Reserve / release a virtual range (size a multiple of d->granularity). Without VMM, reserve
   * yields base 0 and only checks the size. */
  int (*va_reserve)(gg__dev_t *d, size_t size, uintptr_t *base);
  int (*va_release)(gg__dev_t *d, uintptr_t base, size_t size);
  /* Create size bytes of physical memory and map them read-write at `at` (granularity-aligned,
   * inside a reservation; pass 0 when !d->contiguous). */
  int (*map)(gg__dev_t *d, uintptr_t at, size_t size, gg__chunk_t *out);
  /* Unmap and give the physical memory back to the driver. 0 means the range is no longer mapped
   * (if only the release of its physical memory failed, that is counted and recorded in the detail,
   * and the memory stays with the driver until the process ends); an error means nothing changed.
   * */
  int (*unmap)(gg__dev_t *d, const gg__chunk_t *chunk);
  /* Maps chunk c's physical memory at `at` as well (contiguous backends: a granularity-aligned,
   * unmapped range of c->size bytes inside the reservation), without a copy: what c held is not
   * kept. On success *c is the new mapping, which owns the memory from then on, and *old the
   * previous one, an alias (old->alias) that stays mapped, since work queued earlier may still use
   * it, until unmap(old) undoes only that mapping. On failure nothing changed. unmap_run() never
   * takes an alias. */
  int (*remap)(gg__dev_t *d, gg__chunk_t *c, uintptr_t at, gg__chunk_t *old);
  /* unmap() for n chunks that tile one range without gaps (chunks[] in address order), with as few
   * driver calls as the driver allows: one range unmap where it accepts a range that spans several
   * mappings, then each chunk's release. *done: how many are unmapped, counted from the highest. 0
   * means all of them (*done == n); an error means chunks[0 .. n - *done) are still mapped and the
   * rest are not. */
  int (*unmap_run)(gg__dev_t *d, gg__chunk_t *const *chunks, size_t n, size_t *done);
  /* Synchronous copies and fill, used by tests and examples to prove the memory is real. */
  int (*copy_to_dev)(gg__dev_t *d, uintptr_t dst, const void *src, size_t n);
  int (*copy_from_dev)(gg__dev_t *d, void *dst, uintptr_t src, size_t n);
  int (*set_d8)(gg__dev_t *d, uintptr_t dst, unsigned char value, size_t n);
  /* Completion of queued work. stream is a CUstream on cuda, a gg_host_stream on host; NULL is the
   * default stream. event_query returns 1 when complete, 0 while pending, <0 on error. */
  int (*event_create)(gg__dev_t *d, void **ev);
  int (*event_record)(gg__dev_t *d, void *ev, void *stream);
  int (*event_query)(gg__dev_t *d, void *ev);
  int (*event_sync)(gg__dev_t *d, void *ev);
  int (*event_destroy)(gg__dev_t *d, void *ev);
  int (*stream_sync)(gg__dev_t *d, void *stream);
  /* Non-blocking: 1 when every piece of work queued on the stream so far is done, 0 while some is
   * pending, <0 on error. One call instead of an event record and a query when the stream is idle.
   * */
  int (*stream_query)(gg__dev_t *d, void *stream);
  /* cuStreamWaitEvent: work queued on `stream` after this call runs only after the work the event
   * covers (the event as last recorded). No host-side wait. */
  int (*stream_wait)(gg__dev_t *d, void *stream, void *ev);
  /* 0 when `stream` is a handle this backend can use, else GG_EINVAL naming `op`. NULL: every
   * handle is taken as given (the driver checks it). Counts as no operation for fault injection. */
  int (*stream_check)(gg__dev_t *d, void *stream, const char *op);
  /* CUDA graph capture. stream_capture: 0 with *capture_id 0 when `stream` is not capturing, 0 with
   * the capture's unique id (never 0) when it is (an invalidated capture still counts: it has not
   * ended), 1 with *capture_id 0 when `stream` is the legacy default stream while another stream
   * captures (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT: some capture is underway, no stream operation may
   * run), <0 on error. Never invalidates a capture. */
  int (*stream_capture)(gg__dev_t *d, void *stream, unsigned long long *capture_id);
  /* Ties `destroy(user)` to the graph being captured on `stream`: the backend calls it once, on a
   * thread of its own, when that graph and every executable graph made from it are destroyed (and
   * their launches done). destroy must not call the driver: it only marks. On failure destroy is
   * never called. */
  int (*graph_retain)(gg__dev_t *d, void *stream, void (*destroy)(void *user), void *user);
  /* Waits until all work queued on the device's context so far, on every stream, is done, at most
   * timeout_ms (< 0: no limit). GG_ETIMEDOUT when the limit passed first (the work may still run;
   * the wait is not cancelled on cuda, where it goes on on a thread of its own). */
  int (*ctx_sync)(gg__dev_t *d, int timeout_ms);
  /* Destroy every resource of the device's primary context (opt-in, for processes owning the
   * device). */
  int (*ctx_reset)(gg__dev_t *d);
  /* Release what open() took (the primary context retain) and free d. */
  void (*close)(gg__dev_t *d);
} gg__backend_ops_t;

/* An opened device: the primary context is retained for as long as it is open. */
struct gg__dev {
  const gg__backend_ops_t *ops;
  int index;
  size_t granularity; /* map sizes and addresses are multiples of this (a power of two) */
  bool contiguous;    /* map() places memory where the caller asks, inside one reservation */
  unsigned fork_gen;  /* fork generation at open: a forked child must not use it */
  gg__dev_props_t props;
  void *impl;
};

/* Resolves the backend to use: `requested` (an option; NULL or "" means none) wins over the
 * GPUGUARD_BACKEND environment variable; "auto" picks cuda when a usable device exists, else host.
 * *chosen becomes "cuda" or "host". Garbage → GG_EINVAL naming the value and where it came from. */
int gg__backend_resolve(const char *requested, int device, const char **chosen);

/* Opens device `index` on backend `name` ("cuda", "host", "auto", or NULL for the environment). */
int gg__dev_open(const char *name, int index, gg__dev_t **dev);
/* NULL-tolerant. */
void gg__dev_close(gg__dev_t *dev);
int gg__dev_count(const char *name, int *count);

/* Per-backend entry points used by backend.c. */
int gg__cuda_open(int index, gg__dev_t **dev);
int gg__cuda_count(int *count);
int gg__cuda_props(int index, gg__dev_props_t *props);
/* 0 when the driver loads and has at least one device; else the reason (GG_ENODEV and a message).
 * */
int gg__cuda_probe(void);
int gg__host_open(int index, gg__dev_t **dev);
int gg__host_props(int index, gg__dev_props_t *props);

#endif
