/* backend.h — the one interface between the library and a device; everything that touches the
 * driver, its management library or a device node goes through it. Each backend is a folder
 * (cuda/: the driver loaded at run time, with NVML as its telemetry; host/: a simulated device in
 * host memory with fault injection) and one row of the table in backend.c. */
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
  /* Exports the physical memory of chunk c as a file descriptor another process can map (*fd, the
   * caller's to close). GG_ENOTSUP when the chunk's memory was made without a shareable handle or
   * the backend has none; GG_EIO naming EMFILE when the process has no descriptor left. NULL: the
   * backend cannot export. */
  int (*export_fd)(gg__dev_t *d, const gg__chunk_t *c, int *fd);
  /* Imports descriptor fd (size bytes, exported by export_fd in another process) and maps it at
   * `at` (granularity-aligned, unmapped, inside a reservation), without access yet. The mapping
   * alone keeps the memory: fd stays the caller's. */
  int (*import_fd)(gg__dev_t *d, int fd, uintptr_t at, size_t size);
  /* Grants read-write access to [at, at + size), every byte of it mapped by import_fd. */
  int (*import_access)(gg__dev_t *d, uintptr_t at, size_t size);
  /* Unmaps what import_fd mapped in [at, at + size). */
  int (*import_unmap)(gg__dev_t *d, uintptr_t at, size_t size);
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

/* ---- telemetry: a device family's management library (NVML for cuda) ------------------------ */

/* A process holding a device, as the management library lists it. */
typedef struct gg__gpu_proc {
  unsigned pid;
  long long used; /* bytes; -1 when the driver does not say */
} gg__gpu_proc_t;

/* Utilisation, temperature and power; each field -1 when the device does not say. */
typedef struct gg__readings {
  int util_gpu, util_memory, temperature_c; /* percent, percent, degrees Celsius */
  long long power_mw, power_limit_mw;       /* milliwatts */
} gg__readings_t;

/* One device as the management library numbers it (what nvidia-smi and DCGM call `gpu`, whatever
 * CUDA_VISIBLE_DEVICES says). rc < 0 (with error) when it could not be opened. */
typedef struct gg__mon_dev {
  int index, rc, minor; /* minor: the device node's number, -1 unknown */
  char name[96], uuid[96], pci_bus_id[32];
  bool have_memory;
  size_t total, free_b;
  gg__readings_t tel;
  char error[256];
} gg__mon_dev_t;

/* Every call loads the library for the call and shuts it down after. A device is named by its UUID
 * (as the family's driver names it) or, with uuid NULL, by the library's own index. GG_ENOTSUP when
 * the library cannot be loaded, GG_ENODEV for an unknown device, GG_EDRIVER otherwise. */
typedef struct gg__telemetry {
  const char *name; /* "nvml": a JSON report's backend, a Prometheus report's source */
  /* The compute and graphics processes on the device (*n may exceed cap: only cap written);
   * *minor: its device node's number, -1 unknown. */
  int (*processes)(const char *uuid, int index, gg__gpu_proc_t *out, size_t cap, size_t *n,
                   int *minor);
  /* The device's memory, read without a context (which would take some of it). */
  int (*memory)(const char *uuid, int index, size_t *total, size_t *free_b);
  int (*readings)(const char *uuid, int index, gg__readings_t *t);
  /* Every device, in the library's order; *out malloc'ed (free it). */
  int (*devices)(gg__mon_dev_t **out, int *count);
  /* The device count, and device `index` alone into *out when 0 <= index < *count (else *out is
   * untouched): what one GPU's question needs, without reading every device. */
  int (*device)(int index, gg__mon_dev_t *out, int *count);
} gg__telemetry_t;

/* ---- the table of backends ------------------------------------------------------------------- */

/* One row per backend (backend.c's table, in the order `auto` prefers them). */
typedef struct gg__family {
  const char *name; /* what options.backend and GPUGUARD_BACKEND name */
  bool simulated;   /* no GPU of this machine: never listed as one, never `auto`'s first choice */
  /* 0 when the driver loads and has at least one device; else the reason. */
  int (*probe)(void);
  int (*open)(int index, gg__dev_t **dev);
  int (*count)(int *count);
  /* The device's properties without opening it (no context). */
  int (*props)(int index, gg__dev_props_t *props);
  const gg__telemetry_t *telemetry; /* NULL: none */
  /* Path prefixes of the family's device nodes (NULL-terminated; NULL: none): what a child that
   * must not keep the device closes, and `fd-holder`'s evidence. */
  const char *const *device_files;
  /* The device node of a device (minor from telemetry, -1 unknown: by index). */
  void (*device_node)(int minor, int index, char *buf, size_t n);
} gg__family_t;

/* The rows, in order, ending with NULL. */
const gg__family_t *const *gg__families(void);
/* The row named `name` exactly; NULL when none. */
const gg__family_t *gg__family(const char *name);
/* The family whose devices are this machine's GPUs: the first real family whose driver answers;
 * else the first whose telemetry loads (a pod with NVML but no CUDA); else the first real one
 * (whose calls then say why). Never NULL. */
const gg__family_t *gg__gpu_family(void);

/* Resolves the backend to use: `requested` (an option; NULL or "" means none) wins over the
 * GPUGUARD_BACKEND environment variable; "auto" picks the first real family with this device, else
 * the simulated one. *chosen becomes a row's name. Garbage → GG_EINVAL naming the value and where
 * it came from. */
int gg__backend_resolve(const char *requested, int device, const char **chosen);

/* Opens device `index` on backend `name` (a row's name, "auto", or NULL for the environment). */
int gg__dev_open(const char *name, int index, gg__dev_t **dev);
/* NULL-tolerant. */
void gg__dev_close(gg__dev_t *dev);
int gg__dev_count(const char *name, int *count);

/* 0 when the CUDA driver loads and has a device (the GPU tests' skip test). */
int gg__cuda_probe(void);

#endif
