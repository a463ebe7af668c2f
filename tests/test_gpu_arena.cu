/* test_gpu_arena.cu — the arena on a real device: kernels write allocated memory and the test reads
 * it back; trim gives memory back to the driver (cudaMemGetInfo shows it); memory freed while a
 * long kernel runs on the arena's stream is not handed out again until the kernel is done; the
 * cuMemAlloc fallback for devices without VMM. Skips (77) without a CUDA device. */
#include <cuda_runtime.h>
#include <time.h>

/* cmocka.h and gg__cuda_probe have C linkage: declared so here before gg_test.h includes them
 * again. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
extern "C" {
#include <cmocka.h>
int gg__cuda_probe(void);
struct gg_arena;
int gg__arena_check(struct gg_arena *arena);
}
#include "gg_test.h"

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

#define CUDA_OK(call)                                                         \
  do {                                                                        \
    cudaError_t e_ = (call);                                                  \
    if (e_ != cudaSuccess) fail_msg("%s: %s", #call, cudaGetErrorString(e_)); \
  } while (0)

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

__global__ void fill_kernel(unsigned *p, size_t n, unsigned salt) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    p[i] = (unsigned)i * 2654435761u + salt;
}

/* Spins for `cycles` clocks, then writes `value` over the block: the write lands only at the end.
 * */
__global__ void spin_then_write(unsigned *p, size_t n, long long cycles, unsigned value) {
  long long start = clock64();
  while (clock64() - start < cycles) {
  }
  for (size_t i = threadIdx.x; i < n; i += blockDim.x) p[i] = value;
}

static gg_arena_t *make(size_t capacity, size_t chunk, cudaStream_t stream, const char *name) {
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.backend = "cuda", o.capacity = capacity, o.chunk_size = chunk, o.stream = (void *)stream,
  o.name = name;
  gg_arena_t *a = NULL;
  gg_assert_ok(gg_arena_create(&a, &o));
  assert_string_equal(gg_arena_backend(a), "cuda");
  return a;
}

/* A block for work on stream s, in stream order (what the PyTorch backend's default pool calls). */
static void *alloc_on(gg_arena_t *a, size_t n, cudaStream_t s) {
  void *p = NULL;
  gg_assert_ok(gg_alloc_on(a, n, (void *)s, &p));
  return p;
}

static void kernel_roundtrip(const char *vmm) {
  if (vmm) setenv("GPUGUARD_CUDA_VMM", vmm, 1);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));
  gg_arena_t *a = make(0, 0, s, "roundtrip");
  size_t sizes[] = {1000, 256 * 1024, 3 * MiB + 12, 100 * MiB};
  gg_scope_t sc;
  gg_assert_ok(gg_scope_begin(a, &sc));
  for (int k = 0; k < 4; k++) {
    void *p;
    gg_assert_ok(gg_alloc_ex(a, sizes[k], k == 3 ? 2 * MiB : 0, "kernel", &p));
    size_t n = sizes[k] / sizeof(unsigned);
    fill_kernel<<<256, 256, 0, s>>>((unsigned *)p, n, (unsigned)k);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaStreamSynchronize(s));
    unsigned *back = (unsigned *)malloc(n * sizeof(unsigned));
    gg_assert_ok(gg_arena_copy_from_device(a, back, p, n * sizeof(unsigned)));
    for (size_t i = 0; i < n; i += 1 + n / 4096)
      if (back[i] != (unsigned)i * 2654435761u + (unsigned)k)
        fail_msg("block %d word %zu: %#x", k, i, back[i]);
    gg_assert_ok(gg_arena_memset(a, p, 0xAB, 64));
    CUDA_OK(cudaMemcpy(back, p, 64, cudaMemcpyDeviceToHost));
    assert_int_equal(back[0], 0xABABABABu);
    free(back);
  }
  gg_arena_stats_t st;
  gg_assert_ok(gg_arena_stats(a, &st));
  printf(
      "[vmm=%s] 4 blocks written by kernels and read back: in use %zu, mapped %zu in %llu chunks\n",
      vmm ? vmm : "auto", st.bytes_in_use, st.bytes_mapped, st.n_chunks);
  gg_assert_ok(gg_scope_end(&sc));
  gg_assert_ok(gg_arena_destroy(a));
  CUDA_OK(cudaStreamDestroy(s));
  unsetenv("GPUGUARD_CUDA_VMM");
}

static void test_kernel_writes_read_back(void **state) {
  (void)state;
  kernel_roundtrip(NULL);
}

static void test_kernel_writes_read_back_no_vmm(void **state) {
  (void)state;
  kernel_roundtrip("0");
}

static void test_trim_returns_memory_to_driver(void **state) {
  (void)state;
  CUDA_OK(cudaFree(0)); /* the context exists before the first measurement */
  size_t free0, free1, free2, total;
  CUDA_OK(cudaMemGetInfo(&free0, &total));
  gg_arena_t *a = make(0, 0, 0, "trim");
  const size_t n = 4 * GiB / (64 * MiB);
  void *p[64];
  for (size_t i = 0; i < n; i++) gg_assert_ok(gg_alloc(a, 64 * MiB, &p[i]));
  CUDA_OK(cudaMemGetInfo(&free1, &total));
  for (size_t i = 0; i < n; i++) gg_assert_ok(gg_free(a, p[i]));
  double t0 = now_ms();
  gg_assert_ok(gg_arena_trim(a, 0));
  double t1 = now_ms();
  CUDA_OK(cudaMemGetInfo(&free2, &total));
  gg_arena_stats_t st;
  gg_assert_ok(gg_arena_stats(a, &st));
  printf("driver free memory: before %zu MiB, with 4 GiB allocated %zu MiB, after trim %zu MiB "
         "(trim took %.2f ms, %llu bytes trimmed)\n",
         free0 / MiB, free1 / MiB, free2 / MiB, t1 - t0, st.bytes_trimmed);
  assert_true(free0 - free1 >= 4 * GiB);
  assert_true(free2 + 64 * MiB >= free0); /* everything came back, up to driver bookkeeping */
  assert_int_equal(st.bytes_mapped, 0);
  gg_assert_ok(gg_arena_destroy(a));
}

/* A block freed while a 200 ms kernel (that writes it at the end) runs on the arena's stream is not
 * handed out by the next allocation; when nothing else is left, the allocator waits for the kernel.
 * */
static void test_stream_safe_reuse_long_kernel(void **state) {
  (void)state;
  int khz = 0;
  CUDA_OK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));
  gg_arena_t *a = make(64 * MiB, 64 * MiB, s, "stream-safe");
  void *A, *C, *D;
  gg_assert_ok(gg_alloc(a, 32 * MiB, &A));
  double t0 = now_ms();
  spin_then_write<<<1, 256, 0, s>>>((unsigned *)A, 32 * MiB / sizeof(unsigned), 200LL * khz,
                                    0xC0FFEEu);
  CUDA_OK(cudaGetLastError());
  gg_assert_ok(gg_free(a, A));
  gg_assert_ok(gg_alloc(a, 32 * MiB, &C));
  double t1 = now_ms();
  assert_ptr_not_equal(C, A);
  assert_int_equal(cudaStreamQuery(s), cudaErrorNotReady); /* the kernel is still running */
  gg_assert_ok(gg_alloc(a, 32 * MiB, &D)); /* only A's memory is left: this waits for the kernel */
  double t2 = now_ms();
  assert_ptr_equal(D, A);
  assert_int_equal(cudaStreamQuery(s), cudaSuccess);
  unsigned word = 0;
  CUDA_OK(cudaMemcpy(&word, (char *)D + 32 * MiB - 4, 4, cudaMemcpyDeviceToHost));
  printf(
      "free while the kernel runs; next alloc %.3f ms later got a different block; the one after "
      "waited %.1f ms for the kernel (clock %d kHz) and got the freed block, last word %#x\n",
      t1 - t0, t2 - t1, khz, word);
  assert_int_equal(word, 0xC0FFEEu); /* the kernel's late write landed before reuse */
  assert_true(t2 - t1 > 50.0);
  gg_assert_ok(gg_arena_destroy(a));
  CUDA_OK(cudaStreamDestroy(s));
}

/* Growth past the peak under a running kernel, through the stream-ordered calls PyTorch makes: the
 * chunks of a block freed while the kernel still writes it are mapped under the new, larger block
 * at once (no wait: the allocation returns while the kernel runs), the kernel's late write through
 * the old range lands without a fault, and the work queued after it on the same stream then
 * writes the new block; the old range is unmapped by a later growth once the kernel is done, and
 * trim gives every byte back to the driver. */
static void test_growth_moves_free_chunks_under_a_running_kernel(void **state) {
  (void)state;
  int khz = 0;
  CUDA_OK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreate(&s));
  size_t free0 = 0, total = 0;
  CUDA_OK(cudaMemGetInfo(&free0, &total));
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.backend = "cuda", o.capacity = 1 * GiB, o.chunk_size = 8 * MiB, o.stream = (void *)s;
  o.name = "moves", o.flags = GG_ARENA_KEEP_HOLES; /* as the PyTorch backend makes its arenas */
  gg_arena_t *a = NULL;
  gg_assert_ok(gg_arena_create(&a, &o));
  void *A = alloc_on(a, 32 * MiB, s);
  void *y = alloc_on(a, 4096, s);
  assert_non_null(A);
  assert_non_null(y);
  spin_then_write<<<1, 256, 0, s>>>((unsigned *)A, 32 * MiB / sizeof(unsigned), 200LL * khz,
                                    0xC0FFEEu);
  CUDA_OK(cudaGetLastError());
  gg_assert_ok(gg_free_on(a, A, s));
  gg_arena_stats_t s0, s1, s2;
  gg_assert_ok(gg_arena_stats(a, &s0));
  double t0 = now_ms();
  unsigned *B = (unsigned *)alloc_on(a, 48 * MiB, s); /* past the peak */
  double t1 = now_ms();
  assert_non_null(B);
  assert_int_equal(cudaStreamQuery(s), cudaErrorNotReady); /* the kernel is still running */
  gg_assert_ok(gg_arena_stats(a, &s1));
  size_t n = 48 * MiB / sizeof(unsigned);
  fill_kernel<<<256, 256, 0, s>>>(B, n, 7u);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaStreamSynchronize(s));
  unsigned *h = (unsigned *)malloc(48 * MiB);
  assert_non_null(h);
  CUDA_OK(cudaMemcpy(h, B, 48 * MiB, cudaMemcpyDeviceToHost));
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) bad += h[i] != (unsigned)i * 2654435761u + 7u;
  free(h);
  void *C = alloc_on(a, 64 * MiB, s); /* the next growth: the old range goes */
  assert_non_null(C);
  gg_assert_ok(gg_arena_stats(a, &s2));
  printf("48 MiB past the peak while a kernel wrote the 32 MiB freed: %.3f ms, %llu chunks moved, "
         "%zu MiB mapped (%zu without the moves), %llu host waits; %zu wrong words after the "
         "kernels\n",
         t1 - t0, s1.n_moves - s0.n_moves, s1.bytes_mapped / MiB, s0.bytes_mapped / MiB + 48,
         s1.n_stream_waits - s0.n_stream_waits, bad);
  assert_int_equal(bad, 0);
  assert_int_equal(s1.n_stream_waits, s0.n_stream_waits);
  assert_true(t1 - t0 < 50.0);
  assert_int_equal(s1.n_moves - s0.n_moves, 4); /* A's 32 MiB: four 8 MiB chunks */
  assert_true(s1.bytes_mapped < s0.bytes_mapped + 48 * MiB);
  assert_int_equal(s2.n_stream_waits, s0.n_stream_waits);
  gg_assert_ok(gg__arena_check(a));
  gg_assert_ok(gg_free_on(a, B, s));
  gg_assert_ok(gg_free_on(a, C, s));
  gg_assert_ok(gg_free_on(a, y, s));
  gg_assert_ok(gg_arena_trim(a, 0));
  gg_assert_ok(gg_arena_stats(a, &s2));
  assert_int_equal(s2.bytes_mapped, 0);
  gg_assert_ok(gg_arena_destroy(a));
  size_t free1 = 0;
  CUDA_OK(cudaMemGetInfo(&free1, &total));
  assert_true(free1 + 2 * MiB >= free0);
  CUDA_OK(cudaStreamDestroy(s));
}

/* A guard's teardown waits for work on every stream of the context before it unmaps: a kernel on a
 * stream the arena does not track, still writing into arena memory, finishes first (before the wait
 * for the whole context, its late write hit unmapped memory: an illegal address that kills the
 * context). */
static void test_teardown_waits_for_other_streams(void **state) {
  (void)state;
  int khz = 0;
  CUDA_OK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
  gg_guard_options_t go;
  gg_guard_options_init(&go);
  go.signals = 0, go.run_at_exit = false, go.leak_report = "none", go.name = "gpu-teardown-streams";
  gg_guard_t *g = NULL;
  gg_assert_ok(gg_guard_create(&g, &go));
  cudaStream_t tracked, other;
  CUDA_OK(cudaStreamCreate(&tracked));
  CUDA_OK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  gg_arena_t *a = make(64 * MiB, 64 * MiB, tracked, "teardown-streams");
  void *p = NULL;
  gg_assert_ok(gg_alloc(a, 32 * MiB, &p));
  double t0 = now_ms();
  spin_then_write<<<1, 256, 0, other>>>((unsigned *)p, 32 * MiB / sizeof(unsigned), 300LL * khz,
                                        0xBEEFu);
  CUDA_OK(cudaGetLastError());
  assert_int_equal(cudaStreamQuery(other), cudaErrorNotReady);
  gg_assert_ok(gg_guard_destroy(g)); /* tears the arena down: its memory goes back to the driver */
  double t1 = now_ms();
  cudaError_t q = cudaStreamQuery(other), sync = cudaDeviceSynchronize();
  printf("teardown with a 300 ms kernel on an untracked stream writing arena memory: returned "
         "after %.1f ms; "
         "the kernel was %s then; device sync after: %s\n",
         t1 - t0, q == cudaSuccess ? "done" : "still running", cudaGetErrorString(sync));
  assert_int_equal(q, cudaSuccess); /* it was waited for before the unmap */
  assert_int_equal(sync, cudaSuccess);
  gg_assert_fails(gg_alloc(a, 256, &p), GG_ESTATE, "torn down by its guard");
  gg_assert_ok(gg_arena_destroy(a));
  CUDA_OK(cudaStreamDestroy(tracked));
  CUDA_OK(cudaStreamDestroy(other));
}

int main(void) {
  gg_test_require_cuda();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_kernel_writes_read_back),
      cmocka_unit_test(test_kernel_writes_read_back_no_vmm),
      cmocka_unit_test(test_trim_returns_memory_to_driver),
      cmocka_unit_test(test_stream_safe_reuse_long_kernel),
      cmocka_unit_test(test_growth_moves_free_chunks_under_a_running_kernel),
      cmocka_unit_test(
          test_teardown_waits_for_other_streams), /* last: without the wait it kills the context */
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
