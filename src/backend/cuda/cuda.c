/* cuda.c — the CUDA backend: the device's primary context, virtual memory management with a
 * cuMemAlloc fallback, events, streams and graphs (the driver itself is loaded by cuda_driver.c).
 */
#include <cuda.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_driver_internal.h"
#include "core/internal.h"
#include "core/thread_internal.h"

/* ---- an open device -------------------------------------------------------------------------- */

typedef struct gg__cudev {
  unsigned long long leaked_handles; /* physical handles whose release failed after their unmap */
  bool range_refused; /* the driver unmaps one mapping per cuMemUnmap: runs go chunk by chunk */
  /* cuMemCreate refused exportable memory once: later chunks are made without the handle type. */
  _Atomic bool export_refused;
  CUdevice dev;
  CUcontext ctx; /* the primary context, retained while open */
  CUmemAllocationProp prop;
} gg__cudev_t;

/* Makes the primary context current for one operation, only when it is not already: the calling
 * thread's own context choice is restored afterwards. */
typedef struct {
  bool pushed;
} gg__ctx_scope_t;

static int gg__ctx_enter(gg__dev_t *d, gg__ctx_scope_t *s) {
  gg__cudev_t *c = d->impl;
  CUcontext cur = NULL;
  s->pushed = false;
  int rc = gg__check_fork(d->fork_gen, "cuda backend");
  if (rc < 0) return rc;
  GG__CU(gg__cu.fn_cuCtxGetCurrent(&cur), "cuCtxGetCurrent");
  if (cur != c->ctx) {
    GG__CU(gg__cu.fn_cuCtxPushCurrent(c->ctx), "cuCtxPushCurrent");
    s->pushed = true;
  }
  return 0;
}

static void gg__ctx_leave(gg__ctx_scope_t *s) {
  CUcontext dummy;
  if (s->pushed) gg__cu.fn_cuCtxPopCurrent(&dummy);
}

/* Leaves the context scope and turns the driver status into 0 or a recorded failure. */
static int gg__ctx_done(gg__ctx_scope_t *s, CUresult r, const char *what) {
  gg__ctx_leave(s);
  return r == CUDA_SUCCESS ? 0 : gg__cu_fail(r, what);
}

/* Returns from the enclosing function with the outcome of one driver call made in the context. */
#define GG__CU_IN_CTX(d, call, what)             \
  do {                                           \
    gg__ctx_scope_t gg__s;                       \
    int gg__rc = gg__ctx_enter((d), &gg__s);     \
    if (gg__rc < 0) return gg__rc;               \
    return gg__ctx_done(&gg__s, (call), (what)); \
  } while (0)

static int gg__c_mem_info(gg__dev_t *d, size_t *free_b, size_t *total_b) {
  GG__CU_IN_CTX(d, gg__cu.fn_cuMemGetInfo(free_b, total_b), "cuMemGetInfo");
}

/* cuMemCreate, cuMemMap and the rest are "potentially unsafe" calls: made while any thread captures
 * a CUDA graph in global mode (PyTorch's default), they invalidate that capture. Memory management
 * never touches a stream, so each runs with this thread's capture mode exchanged to relaxed, then
 * restored. */
static CUstreamCaptureMode gg__relaxed_enter(void) {
  CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
  if (gg__cu.fn_cuThreadExchangeStreamCaptureMode(&m) != CUDA_SUCCESS)
    m = CU_STREAM_CAPTURE_MODE_RELAXED;
  return m;
}

static void gg__relaxed_leave(CUstreamCaptureMode m) {
  if (m != CU_STREAM_CAPTURE_MODE_RELAXED) gg__cu.fn_cuThreadExchangeStreamCaptureMode(&m);
}

static int gg__c_va_reserve_any(gg__dev_t *d, size_t size, uintptr_t *base) {
  if (size == 0 || size % d->granularity)
    return gg__err(GG_EINVAL, "cuda backend: reserve of %zu bytes is not a multiple of %zu", size,
                   d->granularity);
  if (!d->contiguous) {
    *base = 0;
    return 0;
  }
  CUdeviceptr p = 0;
  gg__ctx_scope_t s;
  int rc = gg__ctx_enter(d, &s);
  if (rc < 0) return rc;
  rc = gg__ctx_done(&s, gg__cu.fn_cuMemAddressReserve(&p, size, d->granularity, 0, 0),
                    "cuMemAddressReserve");
  if (rc == 0) *base = (uintptr_t)p;
  return rc;
}

static int gg__c_va_release_any(gg__dev_t *d, uintptr_t base, size_t size) {
  if (!d->contiguous || !base) return 0;
  GG__CU_IN_CTX(d, gg__cu.fn_cuMemAddressFree((CUdeviceptr)base, size), "cuMemAddressFree");
}

/* Physical memory, exportable as a file descriptor where the device allows it, so a block can be
 * shared with another process (PyTorch's CUDA IPC). A driver that refuses the handle type (some
 * virtualised setups) gets plain memory from then on: sharing is lost, nothing else. */
static CUresult gg__c_create(gg__cudev_t *c, size_t size, CUmemGenericAllocationHandle *h) {
  CUmemAllocationProp prop = c->prop;
  if (atomic_load_explicit(&c->export_refused, memory_order_relaxed)) {
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  }
  CUresult r = gg__cu.fn_cuMemCreate(h, size, &prop, 0);
  if (r == CUDA_SUCCESS || prop.requestedHandleTypes == CU_MEM_HANDLE_TYPE_NONE ||
      r == CUDA_ERROR_OUT_OF_MEMORY) {
    return r;
  }
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  r = gg__cu.fn_cuMemCreate(h, size, &prop, 0);
  if (r == CUDA_SUCCESS) {
    atomic_store_explicit(&c->export_refused, true, memory_order_relaxed);
  }
  return r;
}

static int gg__c_map_any(gg__dev_t *d, uintptr_t at, size_t size, gg__chunk_t *out) {
  gg__cudev_t *c = d->impl;
  gg__ctx_scope_t s;
  int rc = gg__ctx_enter(d, &s);
  if (rc < 0) return rc;
  CUresult r;
  if (!d->contiguous) {
    CUdeviceptr p = 0;
    r = gg__cu.fn_cuMemAlloc(&p, size);
    if (r != CUDA_SUCCESS)
      rc = gg__cu_fail(r, "cuMemAlloc");
    else
      *out = (gg__chunk_t){.ptr = (uintptr_t)p, .size = size, .handle = 0};
    gg__ctx_leave(&s);
    return rc;
  }
  /* Create, map, grant access; each step undone if a later one fails. */
  CUmemGenericAllocationHandle h = 0;
  CUmemAccessDesc acc = {.location = c->prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  r = gg__c_create(c, size, &h);
  if (r != CUDA_SUCCESS) {
    rc = gg__cu_fail(r, "cuMemCreate");
    gg__ctx_leave(&s);
    return rc;
  }
  r = gg__cu.fn_cuMemMap((CUdeviceptr)at, size, 0, h, 0);
  if (r != CUDA_SUCCESS) {
    rc = gg__cu_fail(r, "cuMemMap");
    gg__cu.fn_cuMemRelease(h);
    gg__ctx_leave(&s);
    return rc;
  }
  r = gg__cu.fn_cuMemSetAccess((CUdeviceptr)at, size, &acc, 1);
  if (r != CUDA_SUCCESS) {
    rc = gg__cu_fail(r, "cuMemSetAccess");
    gg__cu.fn_cuMemUnmap((CUdeviceptr)at, size);
    gg__cu.fn_cuMemRelease(h);
  } else {
    *out = (gg__chunk_t){.ptr = at, .size = size, .handle = (uintptr_t)h};
  }
  gg__ctx_leave(&s);
  return rc;
}

/* Gives back the physical memory of a chunk whose range is unmapped already. A failure is counted
 * and recorded in the detail, not returned: to the caller the chunk is gone (it must not be handed
 * out again); only its memory stays with the driver until the process ends. */
static void gg__c_release_unmapped(gg__cudev_t *c, const gg__chunk_t *ch) {
  CUresult r = gg__cu.fn_cuMemRelease((CUmemGenericAllocationHandle)ch->handle);
  if (r != CUDA_SUCCESS) {
    c->leaked_handles++;
    gg__cu_fail(
        r, "cuMemRelease (after a successful cuMemUnmap: the chunk's memory is held until exit)");
  }
}

/* One chunk, in the context: unmap and release, or cuMemFree. */
static int gg__c_unmap_one(gg__dev_t *d, const gg__chunk_t *ch) {
  CUresult r;
  if (!d->contiguous) {
    r = gg__cu.fn_cuMemFree((CUdeviceptr)ch->ptr);
    return r == CUDA_SUCCESS ? 0 : gg__cu_fail(r, "cuMemFree");
  }
  r = gg__cu.fn_cuMemUnmap((CUdeviceptr)ch->ptr, ch->size);
  if (r != CUDA_SUCCESS) return gg__cu_fail(r, "cuMemUnmap");
  if (!ch->alias) {
    gg__c_release_unmapped(d->impl, ch);
  }
  return 0;
}

/* The chunk's handle mapped at a second address; the first mapping stays until it is unmapped,
 * and the memory lives until its last mapping goes (the handle is released with the owner). */
static int gg__c_remap_any(gg__dev_t *d, gg__chunk_t *ch, uintptr_t at, gg__chunk_t *old) {
  gg__cudev_t *c = d->impl;
  gg__ctx_scope_t s;
  int rc = gg__ctx_enter(d, &s);
  if (rc < 0) {
    return rc;
  }
  CUmemAccessDesc acc = {.location = c->prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  CUmemGenericAllocationHandle h = (CUmemGenericAllocationHandle)ch->handle;
  CUresult r = gg__cu.fn_cuMemMap((CUdeviceptr)at, ch->size, 0, h, 0);
  if (r == CUDA_SUCCESS) {
    r = gg__cu.fn_cuMemSetAccess((CUdeviceptr)at, ch->size, &acc, 1);
    if (r != CUDA_SUCCESS) {
      rc = gg__cu_fail(r, "cuMemSetAccess (a free chunk's memory at a second address)");
      gg__cu.fn_cuMemUnmap((CUdeviceptr)at, ch->size);
    }
  } else {
    rc = gg__cu_fail(r, "cuMemMap (a free chunk's memory at a second address)");
  }
  if (r == CUDA_SUCCESS) {
    *old = *ch;
    old->alias = true;
    ch->ptr = at;
  }
  gg__ctx_leave(&s);
  return rc;
}

static int gg__c_unmap_any(gg__dev_t *d, const gg__chunk_t *ch) {
  gg__ctx_scope_t s;
  int rc = gg__ctx_enter(d, &s);
  if (rc < 0) return rc;
  rc = gg__c_unmap_one(d, ch);
  gg__ctx_leave(&s);
  return rc;
}

/* Adjacent chunks: one cuMemUnmap over their whole range, then each release. cuMemUnmap's contract
 * is that the range must not cut a mapping; one that spans several whole mappings is what this
 * tries first. A driver that refuses it (CUDA_ERROR_INVALID_VALUE, nothing unmapped) is remembered
 * once the same chunks then unmap one by one, and later runs go chunk by chunk from the start. */
static int gg__c_unmap_run_any(gg__dev_t *d, gg__chunk_t *const *chunks, size_t n, size_t *done) {
  gg__cudev_t *c = d->impl;
  gg__ctx_scope_t s;
  *done = 0;
  int rc = gg__ctx_enter(d, &s);
  if (rc < 0) return rc;
  bool tried = false;
  if (n > 1 && d->contiguous && !c->range_refused) {
    uintptr_t lo = chunks[0]->ptr;
    CUresult r =
        gg__cu.fn_cuMemUnmap((CUdeviceptr)lo, chunks[n - 1]->ptr + chunks[n - 1]->size - lo);
    if (r == CUDA_SUCCESS) {
      for (size_t k = 0; k < n; k++) {
        if (!chunks[k]->alias) {
          gg__c_release_unmapped(c, chunks[k]);
        }
      }
      *done = n;
      gg__ctx_leave(&s);
      return 0;
    }
    if (r != CUDA_ERROR_INVALID_VALUE) {
      rc = gg__cu_fail(r, "cuMemUnmap (a range of adjacent chunks)");
      gg__ctx_leave(&s);
      return rc;
    }
    tried = true;
  }
  for (size_t k = n; k-- > 0 && rc == 0;) {
    rc = gg__c_unmap_one(d, chunks[k]);
    if (rc == 0) ++*done;
  }
  if (tried && rc == 0) c->range_refused = true;
  gg__ctx_leave(&s);
  return rc;
}

/* The memory-management operations, in relaxed capture mode. */
static int gg__c_va_reserve(gg__dev_t *d, size_t size, uintptr_t *base) {
  CUstreamCaptureMode m = gg__relaxed_enter();
  int rc = gg__c_va_reserve_any(d, size, base);
  gg__relaxed_leave(m);
  return rc;
}

static int gg__c_va_release(gg__dev_t *d, uintptr_t base, size_t size) {
  CUstreamCaptureMode m = gg__relaxed_enter();
  int rc = gg__c_va_release_any(d, base, size);
  gg__relaxed_leave(m);
  return rc;
}

static int gg__c_map(gg__dev_t *d, uintptr_t at, size_t size, gg__chunk_t *out) {
  CUstreamCaptureMode m = gg__relaxed_enter();
  int rc = gg__c_map_any(d, at, size, out);
  gg__relaxed_leave(m);
  return rc;
}

static int gg__c_remap(gg__dev_t *d, gg__chunk_t *c, uintptr_t at, gg__chunk_t *old) {
  if (!d->contiguous || !c->handle) {
    return gg__err(GG_EINVAL, "cuda backend: remap needs a chunk of a VMM reservation");
  }
  CUstreamCaptureMode m = gg__relaxed_enter();
  int rc = gg__c_remap_any(d, c, at, old);
  gg__relaxed_leave(m);
  return rc;
}

static int gg__c_unmap(gg__dev_t *d, const gg__chunk_t *ch) {
  CUstreamCaptureMode m = gg__relaxed_enter();
  int rc = gg__c_unmap_any(d, ch);
  gg__relaxed_leave(m);
  return rc;
}

static int gg__c_unmap_run(gg__dev_t *d, gg__chunk_t *const *chunks, size_t n, size_t *done) {
  CUstreamCaptureMode m = gg__relaxed_enter();
  int rc = gg__c_unmap_run_any(d, chunks, n, done);
  gg__relaxed_leave(m);
  return rc;
}

static int gg__c_copy_to_dev(gg__dev_t *d, uintptr_t dst, const void *src, size_t n) {
  GG__CU_IN_CTX(d, gg__cu.fn_cuMemcpyHtoD((CUdeviceptr)dst, src, n), "cuMemcpyHtoD");
}

static int gg__c_copy_from_dev(gg__dev_t *d, void *dst, uintptr_t src, size_t n) {
  GG__CU_IN_CTX(d, gg__cu.fn_cuMemcpyDtoH(dst, (CUdeviceptr)src, n), "cuMemcpyDtoH");
}

static int gg__c_set_d8(gg__dev_t *d, uintptr_t dst, unsigned char v, size_t n) {
  gg__ctx_scope_t s;
  int rc = gg__ctx_enter(d, &s);
  if (rc < 0) return rc;
  CUresult r = gg__cu.fn_cuMemsetD8((CUdeviceptr)dst, v, n);
  /* cuMemsetD8 may return before the fill is done; callers expect it finished. */
  if (r == CUDA_SUCCESS) return gg__ctx_done(&s, gg__cu.fn_cuCtxSynchronize(), "cuCtxSynchronize");
  return gg__ctx_done(&s, r, "cuMemsetD8");
}

static int gg__c_event_create(gg__dev_t *d, void **ev) {
  CUevent e = NULL;
  gg__ctx_scope_t s;
  int rc = gg__ctx_enter(d, &s);
  if (rc < 0) return rc;
  rc = gg__ctx_done(&s, gg__cu.fn_cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
  if (rc == 0) *ev = e;
  return rc;
}

static int gg__c_event_record(gg__dev_t *d, void *ev, void *stream) {
  GG__CU_IN_CTX(d, gg__cu.fn_cuEventRecord((CUevent)ev, (CUstream)stream), "cuEventRecord");
}

static int gg__c_event_query(gg__dev_t *d, void *ev) {
  gg__ctx_scope_t s;
  int rc = gg__ctx_enter(d, &s);
  if (rc < 0) return rc;
  CUresult r = gg__cu.fn_cuEventQuery((CUevent)ev);
  if (r == CUDA_ERROR_NOT_READY) {
    gg__ctx_done(&s, CUDA_SUCCESS, "cuEventQuery");
    return 0;
  }
  rc = gg__ctx_done(&s, r, "cuEventQuery");
  return rc < 0 ? rc : 1;
}

static int gg__c_stream_wait(gg__dev_t *d, void *stream, void *ev) {
  GG__CU_IN_CTX(d, gg__cu.fn_cuStreamWaitEvent((CUstream)stream, (CUevent)ev, 0),
                "cuStreamWaitEvent");
}

static int gg__c_event_sync(gg__dev_t *d, void *ev) {
  GG__CU_IN_CTX(d, gg__cu.fn_cuEventSynchronize((CUevent)ev), "cuEventSynchronize");
}

static int gg__c_event_destroy(gg__dev_t *d, void *ev) {
  GG__CU_IN_CTX(d, gg__cu.fn_cuEventDestroy((CUevent)ev), "cuEventDestroy");
}

static int gg__c_stream_sync(gg__dev_t *d, void *stream) {
  GG__CU_IN_CTX(d, gg__cu.fn_cuStreamSynchronize((CUstream)stream), "cuStreamSynchronize");
}

static int gg__c_stream_query(gg__dev_t *d, void *stream) {
  gg__ctx_scope_t s;
  int rc = gg__ctx_enter(d, &s);
  if (rc < 0) return rc;
  CUresult r = gg__cu.fn_cuStreamQuery((CUstream)stream);
  if (r == CUDA_ERROR_NOT_READY) {
    gg__ctx_done(&s, CUDA_SUCCESS, "cuStreamQuery");
    return 0;
  }
  rc = gg__ctx_done(&s, r, "cuStreamQuery");
  return rc < 0 ? rc : 1;
}

static int gg__c_stream_capture(gg__dev_t *d, void *stream, unsigned long long *capture_id) {
  *capture_id = 0;
  gg__ctx_scope_t s;
  int rc = gg__ctx_enter(d, &s);
  if (rc < 0) return rc;
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t id = 0;
  CUresult r = gg__cu.fn_cuStreamGetCaptureInfo((CUstream)stream, &st, &id, NULL, NULL, NULL);
  /* The legacy stream asked while a blocking stream captures: the query itself is harmless, but any
   * operation on the legacy stream would invalidate that capture. */
  if (r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) {
    gg__ctx_leave(&s);
    return 1;
  }
  rc = gg__ctx_done(&s, r, "cuStreamGetCaptureInfo");
  if (rc < 0) return rc;
  /* ACTIVE or INVALIDATED: either way the capture has not ended and the stream must not be touched.
   * */
  if (st != CU_STREAM_CAPTURE_STATUS_NONE) *capture_id = id ? (unsigned long long)id : ~0ull;
  return 0;
}

static int gg__c_graph_retain(gg__dev_t *d, void *stream, void (*destroy)(void *user), void *user) {
  gg__ctx_scope_t s;
  int rc = gg__ctx_enter(d, &s);
  if (rc < 0) return rc;
  CUstreamCaptureMode m = gg__relaxed_enter();
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  CUgraph g = NULL;
  CUuserObject obj = NULL;
  CUresult r = gg__cu.fn_cuStreamGetCaptureInfo((CUstream)stream, &st, NULL, &g, NULL, NULL);
  const char *what = "cuStreamGetCaptureInfo";
  if (r == CUDA_SUCCESS && (st != CU_STREAM_CAPTURE_STATUS_ACTIVE || !g)) {
    gg__relaxed_leave(m);
    gg__ctx_leave(&s);
    return gg__err(GG_ESTATE, "cuda backend: graph_retain: the stream is not capturing (status %d)",
                   (int)st);
  }
  if (r == CUDA_SUCCESS)
    r = gg__cu.fn_cuUserObjectCreate(&obj, user, destroy, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC),
    what = "cuUserObjectCreate";
  /* MOVE hands our one reference to the graph. If that fails the object is left unreleased (a few
   * bytes of the driver's until exit): releasing it would run destroy, which the caller was told
   * never happens on failure. */
  if (r == CUDA_SUCCESS)
    r = gg__cu.fn_cuGraphRetainUserObject(g, obj, 1, CU_GRAPH_USER_OBJECT_MOVE),
    what = "cuGraphRetainUserObject";
  gg__relaxed_leave(m);
  return gg__ctx_done(&s, r, what);
}

/* A bounded cuCtxSynchronize: the driver has no timed form, so the wait runs on a thread of its own
 * that holds its own retain of the primary context (the caller may close the device meanwhile), and
 * the caller waits for it at most timeout_ms. On timeout the thread is left to finish by itself. */
typedef struct gg__csync {
  pthread_mutex_t lock;
  pthread_cond_t cond; /* CLOCK_MONOTONIC */
  int refs;            /* the caller and the thread: the last one frees */
  bool done;
  CUresult r;
  CUdevice dev;
  CUcontext ctx;
} gg__csync_t;

static void gg__csync_put(gg__csync_t *s) {
  pthread_mutex_lock(&s->lock);
  bool last = --s->refs == 0;
  pthread_mutex_unlock(&s->lock);
  if (!last) return;
  pthread_cond_destroy(&s->cond);
  pthread_mutex_destroy(&s->lock);
  free(s);
}

static void *gg__csync_main(void *arg) {
  gg__csync_t *s = arg;
  CUcontext dummy;
  CUresult r = gg__cu.fn_cuCtxPushCurrent(s->ctx);
  if (r == CUDA_SUCCESS) {
    r = gg__cu.fn_cuCtxSynchronize();
    gg__cu.fn_cuCtxPopCurrent(&dummy);
  }
  gg__cu.fn_cuDevicePrimaryCtxRelease(s->dev);
  pthread_mutex_lock(&s->lock);
  s->r = r;
  s->done = true;
  pthread_cond_signal(&s->cond);
  pthread_mutex_unlock(&s->lock);
  gg__csync_put(s);
  return NULL;
}

static int gg__c_ctx_sync(gg__dev_t *d, int timeout_ms) {
  if (timeout_ms < 0) GG__CU_IN_CTX(d, gg__cu.fn_cuCtxSynchronize(), "cuCtxSynchronize");
  gg__cudev_t *c = d->impl;
  int rc = gg__check_fork(d->fork_gen, "cuda backend");
  if (rc < 0) return rc;
  gg__csync_t *s = calloc(1, sizeof *s);
  if (!s) return gg__err(GG_ENOMEM, "cuda backend: ctx_sync: out of host memory");
  CUresult r = gg__cu.fn_cuDevicePrimaryCtxRetain(&s->ctx, c->dev);
  if (r != CUDA_SUCCESS) {
    free(s);
    return gg__cu_fail(r, "cuDevicePrimaryCtxRetain");
  }
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_mutex_init(&s->lock, NULL);
  pthread_cond_init(&s->cond, &ca);
  pthread_condattr_destroy(&ca);
  s->refs = 2;
  s->dev = c->dev;
  int e = gg__thread_start(NULL, gg__csync_main, s, true);
  if (e != 0) {
    gg__cu.fn_cuDevicePrimaryCtxRelease(c->dev);
    s->refs = 1;
    gg__csync_put(s);
    return gg__err(GG_EIO, "cuda backend: ctx_sync: cannot start its thread: %s", strerror(e));
  }
  struct timespec until;
  clock_gettime(CLOCK_MONOTONIC, &until);
  long long ns = until.tv_nsec + (long long)(timeout_ms % 1000) * 1000000LL;
  until.tv_sec += timeout_ms / 1000 + (time_t)(ns / 1000000000LL);
  until.tv_nsec = (long)(ns % 1000000000LL);
  pthread_mutex_lock(&s->lock);
  int w = 0;
  while (!s->done && w != ETIMEDOUT) w = pthread_cond_timedwait(&s->cond, &s->lock, &until);
  bool done = s->done;
  r = s->r;
  pthread_mutex_unlock(&s->lock);
  gg__csync_put(s);
  if (!done)
    return gg__err(GG_ETIMEDOUT,
                   "cuda backend: cuCtxSynchronize did not return within %d ms: a kernel on some "
                   "stream still runs",
                   timeout_ms);
  return r == CUDA_SUCCESS ? 0 : gg__cu_fail(r, "cuCtxSynchronize");
}

static int gg__c_ctx_reset(gg__dev_t *d) {
  gg__cudev_t *c = d->impl;
  int rc = gg__check_fork(d->fork_gen, "cuda backend");
  if (rc < 0) return rc;
  GG__CU(gg__cu.fn_cuDevicePrimaryCtxReset(c->dev), "cuDevicePrimaryCtxReset");
  return 0;
}

static void gg__c_close(gg__dev_t *d) {
  if (!d) return;
  gg__cudev_t *c = d->impl;
  /* In a forked child the driver state is the parent's: touching it is undefined, so only free. */
  if (gg__fork_generation() == d->fork_gen) gg__cu.fn_cuDevicePrimaryCtxRelease(c->dev);
  free(c);
  free(d);
}

/* ---- sharing memory with another process ----------------------------------------------------- */

/* Whether a failed call ran out of descriptors: the driver's own code does not say, so one is
 * asked for here. */
static bool gg__c_out_of_fds(void) {
  int probe = open("/dev/null", O_RDONLY | O_CLOEXEC);
  int e = errno;
  if (probe >= 0) {
    close(probe);
    return false;
  }
  return e == EMFILE || e == ENFILE;
}

static int gg__c_export_fd(gg__dev_t *d, const gg__chunk_t *ch, int *fd) {
  gg__cudev_t *c = d->impl;
  if (!d->contiguous || !ch->handle ||
      c->prop.requestedHandleTypes != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
    return gg__err(GG_ENOTSUP,
                   "cuda backend: export: the memory at %#jx was made without a shareable handle "
                   "(%s)",
                   (uintmax_t)ch->ptr,
                   d->contiguous ? "the device cannot export POSIX file descriptors"
                                 : "cuMemAlloc memory: virtual memory management is off");
  gg__ctx_scope_t s;
  int rc = gg__ctx_enter(d, &s);
  if (rc < 0) return rc;
  int got = -1;
  CUresult r = gg__cu.fn_cuMemExportToShareableHandle(
      &got, (CUmemGenericAllocationHandle)ch->handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  gg__ctx_leave(&s);
  if (r == CUDA_SUCCESS) {
    *fd = got;
    return 0;
  }
  if (gg__c_out_of_fds())
    return gg__err(GG_EIO,
                   "cuda backend: export: the process has no file descriptor left (EMFILE)");
  rc = gg__cu_fail(r, "cuMemExportToShareableHandle");
  /* Memory made after the driver refused exportable memory has no handle to export. */
  return rc == GG_EINVAL ? gg__err(GG_ENOTSUP, "%s: not exportable", gg_last_error()) : rc;
}

static int gg__c_import_fd(gg__dev_t *d, int fd, uintptr_t at, size_t size) {
  if (!d->contiguous)
    return gg__err(GG_ENOTSUP, "cuda backend: import: needs virtual memory management");
  gg__ctx_scope_t s;
  int rc = gg__ctx_enter(d, &s);
  if (rc < 0) return rc;
  CUmemGenericAllocationHandle h = 0;
  CUresult r = gg__cu.fn_cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd,
                                                        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  if (r != CUDA_SUCCESS) {
    rc = gg__c_out_of_fds()
             ? gg__err(GG_EIO, "cuda backend: import: no file descriptor left (EMFILE)")
             : gg__cu_fail(r, "cuMemImportFromShareableHandle");
    gg__ctx_leave(&s);
    return rc;
  }
  r = gg__cu.fn_cuMemMap((CUdeviceptr)at, size, 0, h, 0);
  if (r != CUDA_SUCCESS) rc = gg__cu_fail(r, "cuMemMap");
  /* The mapping keeps the memory from here: the handle itself is not needed again. */
  gg__cu.fn_cuMemRelease(h);
  gg__ctx_leave(&s);
  return rc;
}

static int gg__c_import_access(gg__dev_t *d, uintptr_t at, size_t size) {
  gg__cudev_t *c = d->impl;
  CUmemAccessDesc acc = {.location = c->prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  GG__CU_IN_CTX(d, gg__cu.fn_cuMemSetAccess((CUdeviceptr)at, size, &acc, 1), "cuMemSetAccess");
}

static int gg__c_import_unmap(gg__dev_t *d, uintptr_t at, size_t size) {
  GG__CU_IN_CTX(d, gg__cu.fn_cuMemUnmap((CUdeviceptr)at, size), "cuMemUnmap");
}

static const gg__backend_ops_t gg__cuda_ops = {
    .name = "cuda",
    .mem_info = gg__c_mem_info,
    .va_reserve = gg__c_va_reserve,
    .va_release = gg__c_va_release,
    .map = gg__c_map,
    .unmap = gg__c_unmap,
    .unmap_run = gg__c_unmap_run,
    .remap = gg__c_remap,
    .copy_to_dev = gg__c_copy_to_dev,
    .copy_from_dev = gg__c_copy_from_dev,
    .set_d8 = gg__c_set_d8,
    .event_create = gg__c_event_create,
    .event_record = gg__c_event_record,
    .event_query = gg__c_event_query,
    .event_sync = gg__c_event_sync,
    .event_destroy = gg__c_event_destroy,
    .stream_sync = gg__c_stream_sync,
    .stream_query = gg__c_stream_query,
    .stream_wait = gg__c_stream_wait,
    .stream_capture = gg__c_stream_capture,
    .graph_retain = gg__c_graph_retain,
    .ctx_sync = gg__c_ctx_sync,
    .ctx_reset = gg__c_ctx_reset,
    .export_fd = gg__c_export_fd,
    .import_fd = gg__c_import_fd,
    .import_access = gg__c_import_access,
    .import_unmap = gg__c_import_unmap,
    .close = gg__c_close,
};

int gg__cuda_open(int index, gg__dev_t **out) {
  gg__dev_props_t props;
  int rc = gg__cuda_props(index, &props);
  if (rc < 0) return rc;
  bool vmm = props.vmm;
  const char *v = gg__env("GPUGUARD_CUDA_VMM"); /* 0 forces the cuMemAlloc fallback */
  if (v) {
    bool want;
    rc = gg__parse_bool("GPUGUARD_CUDA_VMM", v, &want);
    if (rc < 0) return rc;
    vmm = vmm && want;
  }
  gg__dev_t *d = calloc(1, sizeof *d);
  gg__cudev_t *c = calloc(1, sizeof *c);
  if (!d || !c) {
    free(d);
    free(c);
    return gg__err(GG_ENOMEM, "cuda backend: open: out of host memory");
  }
  d->ops = &gg__cuda_ops;
  d->index = index;
  d->impl = c;
  d->props = props;
  d->contiguous = vmm;
  d->fork_gen = gg__fork_generation();
  CUresult r = gg__cu.fn_cuDeviceGet(&c->dev, index);
  const char *what = "cuDeviceGet";
  if (r == CUDA_SUCCESS) {
    r = gg__cu.fn_cuDevicePrimaryCtxRetain(&c->ctx, c->dev);
    what = "cuDevicePrimaryCtxRetain";
  }
  if (r != CUDA_SUCCESS) {
    free(c);
    free(d);
    return gg__cu_fail(r, what);
  }
  c->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  c->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  c->prop.location.id = c->dev;
  int fd_ok = 0;
  r = gg__cu.fn_cuDeviceGetAttribute(
      &fd_ok, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, c->dev);
  if (r == CUDA_SUCCESS && fd_ok) {
    c->prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  }
  d->granularity = 2u << 20;
  if (vmm) {
    size_t g = 0;
    r = gg__cu.fn_cuMemGetAllocationGranularity(&g, &c->prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (r != CUDA_SUCCESS || g == 0 || (g & (g - 1))) {
      gg__cu.fn_cuDevicePrimaryCtxRelease(c->dev);
      free(c);
      free(d);
      return r != CUDA_SUCCESS
                 ? gg__cu_fail(r, "cuMemGetAllocationGranularity")
                 : gg__err(GG_EDRIVER, "cuda backend: odd allocation granularity %zu", g);
    }
    d->granularity = g;
  }
  *out = d;
  return 0;
}
