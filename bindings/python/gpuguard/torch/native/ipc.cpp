/* ipc.cpp (gpuguard.torch) — the transport of ipc.h: an abstract Unix socket per sending process,
 * descriptors in SCM_RIGHTS batches, mapped on the other side with gpuguard/share.h. */
#include "ipc.h"

#include <c10/cuda/CUDAException.h>
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstring>

#include "check.h"

namespace gg_torch {
namespace ipc {

namespace {

constexpr char kVersion = 2;    /* the framing byte PyTorch's handles start with */
constexpr char kLegacy = 'c';   /* PyTorch's: a cudaIpcMemHandle_t follows */
constexpr char kGpuguard = 'g'; /* ours: a Wire follows */
constexpr size_t kLegacySize = 2 + sizeof(cudaIpcMemHandle_t);
constexpr int kTimeoutMs = 20000; /* per message from the sender */
/* The device's side of the transport: the library's share.h calls. */
int export_pieces(const Shared &s, size_t first, gg_share_piece_t *pieces, size_t cap,
                  size_t *total, size_t *offset) {
  return gg_arena_export(s.arena, s.ptr, s.size, first, pieces, cap, total, offset);
}

/* The pieces gg_arena_export would give: gg_arena_foreach_mapping walks the same allocations. */
struct Count {
  size_t total = 0;
  size_t span = 0;
  const char *first = nullptr;
};

int count_mapping(const gg_mapping_info_t *m, void *user) {
  Count *c = static_cast<Count *>(user);
  c->first = c->first ? c->first : static_cast<const char *>(m->ptr);
  c->total++;
  c->span += m->size;
  return 0;
}

int measure(const Shared &s, size_t *total, size_t *span, size_t *offset) {
  Count c;
  int rc = gg_arena_foreach_mapping(s.arena, s.ptr, s.size, count_mapping, &c);
  *total = c.total;
  *span = c.span;
  *offset = c.first ? size_t(static_cast<const char *>(s.ptr) - c.first) : 0;
  return rc;
}

/* What a received block holds: the range the pieces are mapped into, and its device. */
struct Imported {
  gg_import_t *imp = nullptr;
  int device = 0;
};

int import_open(void **out, size_t size) {
  auto *imp = new Imported;
  *out = imp;
  if (cudaGetDevice(&imp->device) != cudaSuccess) {
    (void)cudaGetLastError();
    return GG_EDRIVER;
  }
  /* Always CUDA, as the backend's own arenas (entry.cpp): GPUGUARD_BACKEND may name another
   * backend for the rest of the process (tests run the library on the host backend). */
  return gg_import_open(&imp->imp, "cuda", imp->device, size);
}

int import_map(void *imp, const gg_share_piece_t *piece) {
  return gg_import_map(static_cast<Imported *>(imp)->imp, piece);
}

void *import_ptr(void *imp) { return gg_import_ptr(static_cast<Imported *>(imp)->imp); }

/* On the range's device, whichever device is current where the last tensor drops. */
void import_close(void *p) {
  auto *imp = static_cast<Imported *>(p);
  if (!imp) {
    return;
  }
  int cur = -1;
  (void)cudaGetDevice(&cur);
  (void)cudaSetDevice(imp->device);
  gg_import_close(imp->imp);
  (void)cudaGetLastError();
  if (cur >= 0) {
    (void)cudaSetDevice(cur);
  }
  delete imp;
}

const char *last_error() { return gg_last_error(); }

constexpr Ops kOps = {measure,    export_pieces, import_open, import_map,
                      import_ptr, import_close,  last_error};

std::shared_ptr<void> open_gpuguard(const std::string &handle) {
  void *imp = nullptr;
  void *p = nullptr;
  std::string why;
  int rc = fetch(kOps, handle.substr(2), kTimeoutMs, &imp, &p, &why);
  GG_CHECK(rc == 0, "gpuguard: ", why);
  return std::shared_ptr<void>(p, [imp](void *) { import_close(imp); });
}

std::shared_ptr<void> open_legacy(const std::string &handle) {
  cudaIpcMemHandle_t h;
  memcpy(&h, handle.data() + 2, sizeof h);
  void *p = nullptr;
  C10_CUDA_CHECK(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
  int dev = 0;
  C10_CUDA_CHECK(cudaGetDevice(&dev));
  return std::shared_ptr<void>(p, [dev](void *q) {
    int cur = -1;
    (void)cudaGetDevice(&cur);
    (void)cudaSetDevice(dev);
    (void)cudaIpcCloseMemHandle(q);
    (void)cudaGetLastError();
    if (cur >= 0) {
      (void)cudaSetDevice(cur);
    }
  });
}

int first_mapping(const gg_mapping_info_t *m, void *user) {
  *static_cast<gg_mapping_info_t *>(user) = *m;
  return 1; /* the first is enough */
}

} // namespace

std::string share_legacy(gg_arena_t *arena, void *ptr, size_t size, int device, ptrdiff_t *offset) {
  gg_mapping_info_t m{};
  gg_arena_foreach_mapping(arena, ptr, size, first_mapping, &m);
  GG_CHECK(m.ptr, "gpuguard: the memory of ", ptr, " cannot be shared: ", gg_last_error());
  if (m.handle != 0) {
    return ""; /* made with a shareable handle: exported as descriptors */
  }
  void *base = m.ptr;
  int cur = -1;
  C10_CUDA_CHECK(cudaGetDevice(&cur));
  C10_CUDA_CHECK(cudaSetDevice(device));
  cudaIpcMemHandle_t h;
  cudaError_t e = cudaIpcGetMemHandle(&h, base);
  (void)cudaSetDevice(cur);
  C10_CUDA_CHECK(e);
  std::string s(2, '\0');
  s[0] = kVersion;
  s[1] = kLegacy;
  s.append(reinterpret_cast<const char *>(&h), sizeof h);
  *offset = static_cast<char *>(ptr) - static_cast<char *>(base);
  return s;
}

Ops device_ops() { return kOps; }

std::string Exporter::share(uint64_t *id, const Shared &s) {
  std::string wire;
  std::string why;
  int rc = server_.share(id, s, &wire, &why);
  GG_CHECK(rc == 0, "gpuguard: cannot share CUDA memory with other processes: ", why);
  std::string h(2, '\0');
  h[0] = kVersion;
  h[1] = kGpuguard;
  return h + wire;
}

void Exporter::forget(uint64_t id) { server_.forget(id); }

std::shared_ptr<void> Importer::open(const std::string &handle) {
  GG_CHECK(handle.size() >= 2 && (handle[0] == 2 || handle[0] == 3),
           "gpuguard: not a CUDA IPC handle this PyTorch backend knows (", handle.size(),
           " bytes)");
  if (handle[1] == kLegacy && handle.size() == kLegacySize) {
    return cache_.open(handle, [&handle] { return open_legacy(handle); });
  }
  GG_CHECK(handle[1] != 'e',
           "gpuguard: this CUDA tensor comes from a process on PyTorch's allocator with "
           "expandable segments, whose handles gpuguard's backend cannot open: run the sender "
           "with GPUGUARD_TORCH=1 too, or without expandable_segments");
  GG_CHECK(handle[1] == kGpuguard, "gpuguard: a CUDA IPC handle of an unknown kind ('", handle[1],
           "', ", handle.size(), " bytes)");
  return cache_.open(handle, [&handle] { return open_gpuguard(handle); });
}

} // namespace ipc
} // namespace gg_torch
