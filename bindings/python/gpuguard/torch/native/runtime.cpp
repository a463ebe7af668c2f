/* runtime.cpp (gpuguard.torch) — the CUDA runtime calls the adapter asks for (adapter.h, Runtime),
 * through PyTorch's own cudart: is a stream capturing, tie a callback to a graph's life, wait. */
#include <cuda_runtime_api.h>

#include "facade.h"

namespace gg_torch {

namespace {

int capture_id(Stream stream, uint64_t *id) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long cid = 0;
  *id = 0;
  if (cudaStreamGetCaptureInfo(static_cast<cudaStream_t>(stream), &status, &cid) != cudaSuccess) {
    (void)cudaGetLastError();
    return GG_EDRIVER;
  }
  /* An invalidated capture still holds its id: its graph may not be made, nothing is kept for it.
   */
  *id = status == cudaStreamCaptureStatusActive ? uint64_t(cid) : 0;
  return 0;
}

/* A user object owned by the graph: CUDA calls `done` once the graph and every executable graph
 * made from it are destroyed (on a thread of its own, without waiting: nothing it calls may use
 * CUDA, and the adapter's callback only marks). */
int graph_retain(Stream stream, void (*done)(void *), void *user) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long cid = 0;
  cudaGraph_t graph = nullptr;
  cudaError_t e =
      cudaStreamGetCaptureInfo(static_cast<cudaStream_t>(stream), &status, &cid, &graph);
  if (e == cudaSuccess && (status != cudaStreamCaptureStatusActive || !graph)) {
    return GG_ESTATE;
  }
  cudaUserObject_t obj = nullptr;
  if (e == cudaSuccess) {
    e = cudaUserObjectCreate(&obj, user, done, 1, cudaUserObjectNoDestructorSync);
  }
  if (e == cudaSuccess) {
    e = cudaGraphRetainUserObject(graph, obj, 1, cudaGraphUserObjectMove);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      cudaUserObjectRelease(obj, 1); /* runs `done`: the caller must not see it as a failure */
      return 0;
    }
  }
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return GG_EDRIVER;
  }
  return 0;
}

int stream_sync(Stream stream) {
  if (cudaStreamSynchronize(static_cast<cudaStream_t>(stream)) != cudaSuccess) {
    (void)cudaGetLastError();
    return GG_EDRIVER;
  }
  return 0;
}

int device_sync(int device) {
  int cur = -1;
  (void)cudaGetDevice(&cur);
  (void)cudaSetDevice(device);
  cudaError_t e = cudaDeviceSynchronize();
  if (cur >= 0) {
    (void)cudaSetDevice(cur);
  }
  if (e != cudaSuccess) {
    (void)cudaGetLastError(); /* a sticky error: the memory goes with the context anyway */
    return GG_EDRIVER;
  }
  return 0;
}

void relax(bool begin, int *saved) {
  cudaStreamCaptureMode mode =
      begin ? cudaStreamCaptureModeRelaxed : static_cast<cudaStreamCaptureMode>(*saved);
  cudaThreadExchangeStreamCaptureMode(&mode);
  if (begin) {
    *saved = int(mode);
  }
}

int event_record(int device, Stream stream, void **event) {
  int cur = -1;
  (void)cudaGetDevice(&cur);
  (void)cudaSetDevice(device);
  cudaEvent_t ev = nullptr;
  cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (e == cudaSuccess) {
    e = cudaEventRecord(ev, static_cast<cudaStream_t>(stream));
    if (e != cudaSuccess) {
      cudaEventDestroy(ev);
    }
  }
  if (cur >= 0) {
    (void)cudaSetDevice(cur);
  }
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return GG_EDRIVER;
  }
  *event = ev;
  return 0;
}

int event_query(void *event) {
  cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (e == cudaSuccess) {
    return 1;
  }
  (void)cudaGetLastError();
  return e == cudaErrorNotReady ? 0 : GG_EDRIVER;
}

void event_destroy(void *event) {
  if (cudaEventDestroy(static_cast<cudaEvent_t>(event)) != cudaSuccess) {
    (void)cudaGetLastError();
  }
}

} // namespace

Runtime cuda_runtime() {
  return Runtime{capture_id, graph_retain, stream_sync, device_sync,
                 relax,      event_record, event_query, event_destroy};
}

} // namespace gg_torch
