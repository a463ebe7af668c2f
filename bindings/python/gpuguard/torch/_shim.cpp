/* _shim.cpp (gpuguard.torch) — PyTorch's allocation entry point over gpuguard that raises instead of returning NULL.
 *
 * PyTorch's global CUDAPluggableAllocator does not check the pointer its alloc function returns: a NULL
 * becomes a tensor at address 0, and the first kernel on it kills the CUDA context. A C++ exception
 * thrown from the alloc function, though, travels through PyTorch to Python. Built two ways:
 *   - by CMake, as libgpuguard_torch.so beside libgpuguard: throws std::runtime_error, which PyTorch
 *     raises as a RuntimeError whose message starts "CUDA out of memory." as its own does;
 *   - by gpuguard.torch at run time against the installed PyTorch's headers (-DGG_WITH_C10), when a C++
 *     compiler is there: throws c10::OutOfMemoryError, which PyTorch raises as torch.OutOfMemoryError.
 * Self-contained on purpose (no gpuguard header): the run-time build needs only PyTorch's. */
#include <sys/types.h>

#include <stdexcept>
#include <string>

#ifdef GG_WITH_C10
#include <c10/util/Exception.h>
#endif

extern "C" {
int gg_torch_alloc_status(ssize_t size, int device, void *stream, void **ptr);
void gg_torch_free(void *ptr, ssize_t size, int device, void *stream);
const char *gg_last_error(void);
}

namespace {

constexpr int kNoMemory = -2; /* GG_ENOMEM in gpuguard/error.h */

[[noreturn]] void raise_failure(int rc, ssize_t size, int device) {
  std::string msg = rc == kNoMemory ? "CUDA out of memory. " : "CUDA allocation failed. ";
  msg += "gpuguard could not allocate " + std::to_string(size) + " bytes on device " + std::to_string(device) +
         ": " + gg_last_error();
#ifdef GG_WITH_C10
  c10::SourceLocation where{__func__, __FILE__, static_cast<uint32_t>(__LINE__)};
  if (rc == kNoMemory) throw c10::OutOfMemoryError(where, msg);
  throw c10::Error(where, msg);
#else
  throw std::runtime_error(msg);
#endif
}

} // namespace

/* The alloc function PyTorch calls: a block, or an exception with the arena's detail. */
extern "C" __attribute__((visibility("default"))) void *gg_torch_malloc(ssize_t size, int device, void *stream) {
  void *p = nullptr;
  int rc = gg_torch_alloc_status(size, device, stream, &p);
  if (rc < 0) raise_failure(rc, size, device);
  return p;
}

/* The matching free function, in this library too, so one path serves CUDAPluggableAllocator. */
extern "C" __attribute__((visibility("default"))) void gg_torch_mfree(void *ptr, ssize_t size, int device,
                                                                      void *stream) {
  gg_torch_free(ptr, size, device, stream);
}

/* Which build this is: 1 when it throws c10::OutOfMemoryError. */
extern "C" __attribute__((visibility("default"))) int gg_torch_shim_kind(void) {
#ifdef GG_WITH_C10
  return 1;
#else
  return 0;
#endif
}
