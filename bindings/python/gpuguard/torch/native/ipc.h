/* ipc.h (gpuguard.torch) — CUDA IPC for gpuguard's PyTorch backend: a CUDA tensor sent through a
 * torch.multiprocessing queue arrives in the other process.
 *
 * Arena memory is made with cuMemCreate, which cudaIpcGetMemHandle cannot share. The library
 * exports its physical allocations as POSIX file descriptors (gg_arena_export, gpuguard/share.h),
 * and descriptors only travel between processes over a Unix socket (SCM_RIGHTS). So the first share
 * starts one thread in the sender that listens on an abstract socket of a random name; the handle
 * PyTorch pickles names that socket, the block and a random capability of that block (128 bits,
 * compared in constant time: a handle opens its own block and no other). The receiver connects,
 * presents the capability, gets one descriptor per piece and maps them (gg_import_open /
 * gg_import_map). Both ends check that the peer is the same user. Descriptors are exported at the
 * receiver's request, 32 at a time, and closed once sent (the receiver closes each once mapped);
 * once exported, a descriptor keeps its memory alive by itself. The transport itself (threads,
 * deadlines, batches, the receiver's cache) is ipc_transport.h, tested without CUDA or PyTorch.
 *
 * Memory the driver made without shareable handles (the cuMemAlloc fallback on devices without
 * virtual memory management) is shared the legacy way, with cudaIpcGetMemHandle, in the handle
 * format PyTorch's own allocator writes; handles of that format from a process on PyTorch's own
 * allocator are opened here too. */
#ifndef GG_TORCH_IPC_H
#define GG_TORCH_IPC_H

#include <cstdint>
#include <memory>
#include <string>

#include "ipc_transport.h"

namespace gg_torch {
namespace ipc {

/* The handle of a block whose memory the driver made without a shareable handle (cuMemAlloc):
 * cudaIpcGetMemHandle of its base, *offset the block's place in it. "" for memory with one (then
 * Exporter::share serves it). */
std::string share_legacy(gg_arena_t *arena, void *ptr, size_t size, int device, ptrdiff_t *offset);

/* The library's share.h calls, on the current device. */
Ops device_ops();

class Exporter {
public:
  Exporter() : server_(device_ops()) {}
  /* The handle for a block (registered under *id, which is kept for the block's next share). */
  std::string share(uint64_t *id, const Shared &s);
  /* The block is freed: a later request for it is refused. */
  void forget(uint64_t id);

private:
  Server server_;
};

/* Opens a handle of either format; the same handle opened twice shares one mapping (the driver
 * refuses a second cudaIpcOpenMemHandle of one allocation in a process). */
class Importer {
public:
  std::shared_ptr<void> open(const std::string &handle);

private:
  Cache cache_;
};

} // namespace ipc
} // namespace gg_torch

#endif
