// cuda_extension.cu — gpuguard.hpp in the shape of a CUDA extension op (a PyTorch or CuPy custom kernel):
// the op takes an arena and a stream, draws its scratch memory from a gg::Scope that ends when the op
// returns or throws, and reports failures as gg::Error. The arena is told the stream, so a scratch block
// released at the scope's end is not handed out again before the kernels queued on it are done. Without a
// CUDA device it runs on the host backend with the same math in C++.
//
// usage: cuda_extension [n]   (elements, default 1000000)
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpuguard/gpuguard.hpp"

static void cuda_check(cudaError_t e, const char *what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

__global__ void square_kernel(const float *x, float *tmp, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) tmp[i] = x[i] * x[i];
}

__global__ void axpy_kernel(float a, const float *tmp, float *y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += a * tmp[i];
}

// The op: y += a * x^2, with x^2 in scratch memory that lives only as long as the call.
static void square_axpy(gg::Arena &arena, cudaStream_t stream, bool gpu, float a, const float *x, float *y, int n) {
  gg::Scope scratch(arena);
  float *tmp = arena.alloc_n<float>(static_cast<std::size_t>(n), "square_axpy.tmp");
  if (gpu) {
    square_kernel<<<(n + 255) / 256, 256, 0, stream>>>(x, tmp, n);
    axpy_kernel<<<(n + 255) / 256, 256, 0, stream>>>(a, tmp, y, n);
    cuda_check(cudaGetLastError(), "kernel launch");
  } else {  // host backend: the arena's pointers are host memory
    for (int i = 0; i < n; i++) tmp[i] = x[i] * x[i];
    for (int i = 0; i < n; i++) y[i] += a * tmp[i];
  }
}  // the scope ends here: tmp is released (reused only after the stream's work is done)

int main(int argc, char **argv) {
  int n = 1000000;
  if (argc == 2 && std::strcmp(argv[1], "--help") == 0) {
    std::printf("usage: cuda_extension [n]   (elements > 0, default 1000000)\n");
    return 0;
  }
  if (argc > 2 || (argc == 2 && (n = std::atoi(argv[1])) <= 0)) {
    std::fprintf(stderr, "usage: cuda_extension [n]   (elements > 0, default 1000000)\n");
    return 2;
  }
  int count = 0;
  /* GPUGUARD_BACKEND is the user's (host: the host backend even with a GPU); only unset or auto is
   * turned into host without a GPU, so a bad value reaches gpuguard and is refused there. */
  const char *want = std::getenv("GPUGUARD_BACKEND");
  const bool want_host = want && std::strcmp(want, "host") == 0;
  const bool gpu = !want_host && cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  if (!gpu && (!want || !*want || std::strcmp(want, "auto") == 0)) setenv("GPUGUARD_BACKEND", "host", 1);
  try {
    cudaStream_t stream = nullptr;
    if (gpu) cuda_check(cudaStreamCreate(&stream), "cudaStreamCreate");
    gg::Arena::Options opts;
    opts.name = "extension";
    opts.stream = stream;
    gg::Arena arena(opts);
    std::printf("cuda_extension: %d elements on the %s backend\n", n, arena.backend());

    const std::size_t bytes = static_cast<std::size_t>(n) * sizeof(float);
    std::vector<float> hx(static_cast<std::size_t>(n), 2.0f), hy(static_cast<std::size_t>(n), 1.0f);
    float *x = arena.alloc_n<float>(static_cast<std::size_t>(n), "x");
    float *y = arena.alloc_n<float>(static_cast<std::size_t>(n), "y");
    gg::check(gg_arena_copy_to_device(arena.get(), x, hx.data(), bytes));
    gg::check(gg_arena_copy_to_device(arena.get(), y, hy.data(), bytes));
    for (int call = 0; call < 3; call++) square_axpy(arena, stream, gpu, 0.5f, x, y, n);
    if (gpu) cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    gg::check(gg_arena_copy_from_device(arena.get(), hy.data(), y, bytes));
    gg_arena_stats_t st = arena.stats();
    std::printf("y[0] = %.1f (expected 7.0); live blocks after 3 calls: %llu (x and y; no scratch left)\n",
                hy[0], st.n_live);
    arena.reset();  // destroy before the stream it was told about
    if (gpu) cudaStreamDestroy(stream);
    return hy[0] == 7.0f && st.n_live == 2 ? 0 : 1;
  } catch (const std::exception &e) {  // gg::Error is a std::runtime_error
    std::fprintf(stderr, "cuda_extension: %s\n", e.what());
    return 1;
  }
}
