/* entry.cpp (gpuguard.torch) — the small C API gpuguard.torch calls through ctypes: install the
 * backend, point a device's default pool or a MemPool at an arena, choose which captures are looked
 * for, and read counters for tests and diagnostics. Each returns 0 or a negative GG_E* code. */
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <c10/core/Allocator.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "facade.h"

#define GG_TORCH_API extern "C" __attribute__((visibility("default")))

using gg_torch::g_backend;

namespace {
std::shared_ptr<gg_torch::Backend> *g_owner = nullptr; /* never deleted (install says why) */
} // namespace

/* Makes gpuguard PyTorch's CUDA allocator (once; later calls do nothing). GG_ESTATE with PyTorch's
 * reason in err when it refuses (its allocator is initialised already). */
GG_TORCH_API int gg_torch_native_install(size_t capacity, size_t chunk_size, char *err,
                                         size_t errcap) {
  try {
    if (g_backend) {
      return 0;
    }
    gg_arena_options_t o;
    gg_arena_options_init(&o);
    o.backend = "cuda";
    o.capacity = capacity;
    o.chunk_size = chunk_size;
    o.name = "torch";
    auto b = std::make_shared<gg_torch::Backend>(o);
    torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(b);
    /* PyTorch's shared_ptr is a static of libtorch_python: its destructor would run ours after the
     * interpreter is gone and after libtorch_python's own statics (the list a recorded stack hands
     * its frames to), while tensors freed later still call the deleter. One reference is never
     * dropped, so the backend lives as long as the process, as PyTorch's own allocator does. */
    g_owner = new std::shared_ptr<gg_torch::Backend>(b);
    /* torch.accelerator (memory_stats, empty_cache, ...) asks the allocator registered for the
     * device type, which changeCurrentAllocator leaves at PyTorch's own. */
    c10::SetAllocator(c10::DeviceType::CUDA, b.get(), UINT8_MAX);
    g_backend = b.get();
    return 0;
  } catch (const std::exception &e) {
    snprintf(err, errcap, "%s", e.what());
    return GG_ESTATE;
  }
}

/* At the interpreter's exit (gpuguard.torch's atexit hook, with the GIL held): memory history off,
 * every recorded stack, out-of-memory observer and trace tracker released while Python lives. */
GG_TORCH_API int gg_torch_native_at_exit(void) {
  if (!g_backend) {
    return GG_ESTATE;
  }
  try {
    g_backend->at_exit();
  } catch (const std::exception &e) {
    fprintf(stderr, "gpuguard: releasing PyTorch's objects at exit: %s\n", e.what());
    return GG_ESTATE;
  }
  return 0;
}

/* gpuguard.torch.use_arena: device's default pool draws from `arena` (before its first allocation
 * there). GG_EINVAL for an arena without stream tracking, GG_ESTATE when another serves already. */
GG_TORCH_API int gg_torch_native_use_arena(int device, gg_arena_t *arena) {
  return g_backend ? g_backend->core().use_arena(device, arena) : GG_ESTATE;
}

/* gpuguard.torch.mem_pool: the MemPool (first, second) on `device` draws from `arena`. GG_ESTATE
 * when the pool holds memory of another source already. */
GG_TORCH_API int gg_torch_native_pool_arena(unsigned long long first, unsigned long long second,
                                            int device, gg_arena_t *arena) {
  gg_torch::PoolId id{first, second};
  return g_backend ? g_backend->core().pool_use_arena(device, id, arena) : GG_ESTATE;
}

/* captures=any (1): every call asks the driver whether its stream captures, so a capture PyTorch
 * does not announce is handled too; 0 (captures=announced, the default): only while PyTorch has
 * announced one. */
GG_TORCH_API int gg_torch_native_capture_query(int every_call) {
  if (!g_backend) {
    return GG_ESTATE;
  }
  g_backend->core().set_capture_any(every_call != 0);
  return 0;
}

/* The backend's tables walked against its figures (every block once, counts and bytes per device
 * and pool): 0, or GG_ESTATE with what broke in gg_last_error terms (for tests after bad input). */
GG_TORCH_API int gg_torch_native_check(void) {
  return g_backend ? g_backend->core().check() : GG_ESTATE;
}

/* 1 when this process's PyTorch allocator is gpuguard's backend. */
GG_TORCH_API int gg_torch_native_active(void) { return g_backend != nullptr; }

/* Pools alive, blocks held in pools, blocks held in all, captures announced and under way. */
GG_TORCH_API int gg_torch_native_counters(uint64_t out[4]) {
  if (!g_backend) {
    return GG_ESTATE;
  }
  gg_torch::Adapter::Counters c = g_backend->core().counters();
  out[0] = c.n_pools;
  out[1] = c.n_pool_blocks;
  out[2] = c.n_blocks;
  out[3] = c.n_captures;
  return 0;
}

/* The pools alive, one "first second use_count live" line each, into buf (NUL-terminated, cut to
 * cap). The length it needs. */
GG_TORCH_API long gg_torch_native_pools(char *buf, size_t cap) {
  if (!g_backend) {
    return GG_ESTATE;
  }
  std::string s;
  for (const auto &p : g_backend->core().pool_list()) {
    char line[128];
    snprintf(line, sizeof line, "%llu %llu %d %zu\n", (unsigned long long)p.first.first,
             (unsigned long long)p.first.second, p.second.first, p.second.second);
    s += line;
  }
  if (buf && cap) {
    snprintf(buf, cap, "%s", s.c_str());
  }
  return long(s.size());
}
