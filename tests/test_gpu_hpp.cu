// test_gpu_hpp.cu — gpuguard.hpp compiled by nvcc and used from CUDA code: a gg::Guard on the cuda
// backend whose teardown (a lambda) frees runtime-allocated device memory, checked with
// cudaMemGetInfo. Skips without a CUDA device.
#include <cuda_runtime.h>

#include <cstdio>

#include "gpuguard/gpuguard.hpp"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" { /* neither this cmocka nor gg_test.h has C++ linkage markers */
#include <cmocka.h>

#include "gg_test.h"
}

__global__ void fill(int *p, int n, int v) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = v;
}

static void test_guard_frees_runtime_memory(void **) {
  const int n = 64 << 20; /* 256 MiB of ints */
  size_t free0 = 0, free1 = 0, free2 = 0, total = 0;
  assert_int_equal(cudaFree(nullptr), cudaSuccess); /* the runtime shares the primary context */
  assert_int_equal(cudaMemGetInfo(&free0, &total), cudaSuccess);
  {
    gg::Guard::Options o;
    o.backend = "cuda";
    o.signals = 0;
    o.run_at_exit = false;
    gg::Guard g(o);
    int *d = nullptr;
    assert_int_equal(cudaMalloc(&d, sizeof(int) * (size_t)n), cudaSuccess);
    g.on_teardown([d] { cudaFree(d); }, "cudaFree");
    fill<<<(n + 255) / 256, 256>>>(d, n, 7);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    int host = 0;
    assert_int_equal(cudaMemcpy(&host, d + n - 1, sizeof host, cudaMemcpyDeviceToHost),
                     cudaSuccess);
    assert_int_equal(host, 7);
    assert_int_equal(cudaMemGetInfo(&free1, &total), cudaSuccess);
  }
  assert_int_equal(cudaMemGetInfo(&free2, &total), cudaSuccess);
  std::printf(
      "device free: %zu MiB before, %zu MiB with the buffer, %zu MiB after the guard's teardown\n",
      free0 >> 20, free1 >> 20, free2 >> 20);
  assert_true(free0 - free1 >= sizeof(int) * (size_t)n);
  assert_true(free2 + (32u << 20) >= free0); /* back, give or take the driver's own bookkeeping */
}

int main() {
  gg_test_require_cuda();
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_guard_frees_runtime_memory)};
  return cmocka_run_group_tests_name("gpu_hpp", tests, nullptr, nullptr);
}
