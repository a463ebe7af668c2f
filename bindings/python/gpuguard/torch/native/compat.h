/* compat.h (gpuguard.torch) — the differences between the PyTorch versions the backend is built for
 * (2.8 to 2.11; scripts/torch_prebuilt.py builds each), so that the rest is written against 2.11's
 * interface once. Types: where they moved. Virtual methods whose signature changed: facade.h
 * declares 2.11's, overriding only from 2.11 (GG_OVERRIDE_2_11), and forwards the older signature
 * to it. */
#ifndef GG_TORCH_COMPAT_H
#define GG_TORCH_COMPAT_H

#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/version.h>

#define GG_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||     \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

#include <c10/cuda/CUDAAllocatorConfig.h>
#if GG_TORCH_AT_LEAST(2, 10)
#include <c10/core/AllocatorConfig.h>
#define GG_OVERRIDE_2_10 override
#else
#define GG_OVERRIDE_2_10
#endif

#if GG_TORCH_AT_LEAST(2, 11)
#define GG_OVERRIDE_2_11 override
#else
#define GG_OVERRIDE_2_11
#endif

#if !GG_TORCH_AT_LEAST(2, 9)
/* 2.8 has the pool id in c10::cuda only; 2.9 added c10's. */
namespace c10 {
using MempoolId_t = c10::cuda::MempoolId_t;
}
#endif

namespace gg_torch {

namespace cca = c10::cuda::CUDACachingAllocator;
/* The trace and history types moved from CUDACachingAllocator to CachingDeviceAllocator in 2.11. */
namespace cda {
using namespace c10::CachingDeviceAllocator;
#if !GG_TORCH_AT_LEAST(2, 11)
using cca::AllocatorTraceTracker;
using cca::BlockInfo;
using cca::CreateContextFn;
using cca::RecordContext;
using cca::SegmentInfo;
using cca::TraceEntry;
#endif
} // namespace cda

/* PyTorch's roundup_power2_divisions for a request of n bytes (PYTORCH_CUDA_ALLOC_CONF), read where
 * each version keeps it: the CUDA allocator's config before 2.10, the accelerator's since (the
 * CUDA one is deprecated there). */
inline size_t roundup_divisions(size_t n) {
#if GG_TORCH_AT_LEAST(2, 10)
  return c10::CachingAllocator::AcceleratorAllocatorConfig::roundup_power2_divisions(n);
#else
  return cca::CUDAAllocatorConfig::roundup_power2_divisions(n);
#endif
}

/* per_process_memory_fraction from PYTORCH_ALLOC_CONF (2.10 on; 1.0 before, where it does not
 * exist). Reading it parses the settings: an invalid value raises PyTorch's own error, as under its
 * allocator. */
inline double conf_memory_fraction() {
#if GG_TORCH_AT_LEAST(2, 10)
  return cca::CUDAAllocatorConfig::per_process_memory_fraction();
#else
  return 1.0;
#endif
}

} // namespace gg_torch

#endif
