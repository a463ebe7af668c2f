/* train.cu — a tiny training program on a gpuguard arena: logistic regression on synthetic data with
 * hand-written kernels. Data and weights live in the arena for the whole run; each step's temporaries
 * live in a scope that ends with the step, so nothing the step allocated outlives it. Without a CUDA
 * device it runs on the host backend, doing the same math in C on the arena's (host) pointers.
 *
 * usage: train [steps] [print_every]   (defaults 300 and 50) */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpuguard/gpuguard.h"

#define N  8192 /* samples */
#define D  64   /* features */
#define LR 0.5f

static bool gpu;
static cudaStream_t stream;

#define GG(call)                                                  \
  do {                                                            \
    if ((call) < 0) {                                             \
      fprintf(stderr, "train: %s: %s\n", #call, gg_last_error()); \
      exit(1);                                                    \
    }                                                             \
  } while (0)
#define CU(call)                                                         \
  do {                                                                   \
    cudaError_t e_ = (call);                                             \
    if (e_ != cudaSuccess) {                                             \
      fprintf(stderr, "train: %s: %s\n", #call, cudaGetErrorString(e_)); \
      exit(1);                                                           \
    }                                                                    \
  } while (0)

/* ---- the step, on the device ------------------------------------------------------------------- */

/* p = sigmoid(X w + b); err = p - y; loss += cross-entropy. One thread per sample. */
__global__ void forward_kernel(const float *X, const float *y, const float *w, const float *b, float *err,
                               float *loss) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= N) return;
  float z = *b;
  for (int j = 0; j < D; j++) z += X[i * D + j] * w[j];
  float p = 1.0f / (1.0f + expf(-z));
  err[i] = p - y[i];
  float pc = fminf(fmaxf(p, 1e-7f), 1.0f - 1e-7f);
  atomicAdd(loss, -(y[i] * logf(pc) + (1.0f - y[i]) * logf(1.0f - pc)) / N);
}

/* grad[j] = mean(err * X[:, j]) for j < D, grad[D] = mean(err). One block per gradient entry. */
__global__ void grad_kernel(const float *X, const float *err, float *grad) {
  __shared__ float part[256];
  int j = blockIdx.x;
  float s = 0.0f;
  for (int i = threadIdx.x; i < N; i += blockDim.x) s += err[i] * (j < D ? X[i * D + j] : 1.0f);
  part[threadIdx.x] = s;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k /= 2) {
    if ((int)threadIdx.x < k) part[threadIdx.x] += part[threadIdx.x + k];
    __syncthreads();
  }
  if (threadIdx.x == 0) grad[j] = part[0] / N;
}

__global__ void update_kernel(float *w, float *b, const float *grad) {
  int j = threadIdx.x;
  if (j < D) w[j] -= LR * grad[j];
  if (j == D) *b -= LR * grad[D];
}

/* ---- the same step, on the host (host backend pointers are host memory) --------------------------- */

static void host_step(const float *X, const float *y, float *w, float *b, float *err, float *grad,
                      float *loss) {
  *loss = 0.0f;
  for (int i = 0; i < N; i++) {
    float z = *b;
    for (int j = 0; j < D; j++) z += X[i * D + j] * w[j];
    float p = 1.0f / (1.0f + expf(-z)), pc = fminf(fmaxf(p, 1e-7f), 1.0f - 1e-7f);
    err[i] = p - y[i];
    *loss += -(y[i] * logf(pc) + (1.0f - y[i]) * logf(1.0f - pc)) / N;
  }
  for (int j = 0; j <= D; j++) {
    float s = 0.0f;
    for (int i = 0; i < N; i++) s += err[i] * (j < D ? X[i * D + j] : 1.0f);
    grad[j] = s / N;
  }
  for (int j = 0; j < D; j++) w[j] -= LR * grad[j];
  *b -= LR * grad[D];
}

/* ---- helpers ---------------------------------------------------------------------------------- */

static void *arena_alloc(gg_arena_t *a, size_t n, const char *tag) {
  void *p;
  GG(gg_alloc_ex(a, n, 0, tag, &p));
  return p;
}

static void print_stats(gg_arena_t *a, const char *when) {
  gg_arena_stats_t s;
  GG(gg_arena_stats(a, &s));
  printf("  [%s] arena: in use %zu B in %llu blocks, mapped %zu B (%llu chunks), peak in use %zu B, "
         "scope depth %d, %llu allocs / %llu frees, pending %zu B, fragmentation %.3f\n",
         when, s.bytes_in_use, s.n_live, s.bytes_mapped, s.n_chunks, s.peak_in_use, s.scope_depth, s.n_allocs,
         s.n_frees, s.bytes_pending, s.fragmentation);
}

static int print_block(const gg_block_info_t *b, void *user) {
  (void)user;
  printf("    live block %p: %zu bytes, tag '%s', scope depth %d\n", b->ptr, b->size, b->tag, b->scope_depth);
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* progress shows at once, also through a pipe */
  if (argc > 1 && strcmp(argv[1], "--help") == 0) {
    printf("usage: train [steps] [print_every]   (defaults 300 and 50)\n");
    return 0;
  }
  int steps = argc > 1 ? atoi(argv[1]) : 300;
  int every = argc > 2 ? atoi(argv[2]) : 50;
  if (argc > 3 || steps <= 0 || every <= 0) {
    fprintf(stderr, "usage: train [steps] [print_every]   (positive numbers; defaults 300 and 50)\n");
    return 2;
  }
  int n = 0;
  /* GPUGUARD_BACKEND is the user's: host runs on the host backend even with a GPU; cuda without one,
   * or a bad value, is refused by gpuguard itself (never overwritten here). */
  const char *want = getenv("GPUGUARD_BACKEND");
  bool want_host = want && strcmp(want, "host") == 0;
  gpu = !want_host && cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  if (!gpu && want && *want && !want_host && strcmp(want, "auto") != 0) {
    fprintf(stderr, "train: GPUGUARD_BACKEND=%s, but no CUDA device can be used (host or auto run without one)\n",
            want);
    return 2;
  }
  if (!gpu) {
    setenv("GPUGUARD_BACKEND", "host", 1); /* unset, auto or host: the host backend */
    printf("train: no CUDA device: running on gpuguard's host backend; each step is the same math in C on "
           "the arena's host pointers instead of CUDA kernels\n");
  } else {
    cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    CU(cudaStreamCreate(&stream));
    printf("train: running on %s with gpuguard's CUDA backend\n", prop.name);
  }
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.capacity = 256u << 20, o.chunk_size = 4u << 20, o.stream = (void *)stream, o.name = "train";
  gg_arena_t *a;
  GG(gg_arena_create(&a, &o));

  /* Synthetic, linearly separable-ish data from a fixed generator. */
  float *hX = (float *)malloc(sizeof(float) * N * D), *hy = (float *)malloc(sizeof(float) * N), truth[D];
  unsigned s = 42;
  for (int j = 0; j < D; j++) s = s * 1664525u + 1013904223u, truth[j] = (float)(s >> 8) / 8388608.0f - 1.0f;
  for (int i = 0; i < N; i++) {
    float z = 0.0f;
    for (int j = 0; j < D; j++) {
      s = s * 1664525u + 1013904223u;
      hX[i * D + j] = (float)(s >> 8) / 8388608.0f - 1.0f;
      z += hX[i * D + j] * truth[j];
    }
    s = s * 1664525u + 1013904223u;
    hy[i] = z + 0.3f * ((float)(s >> 8) / 8388608.0f - 1.0f) > 0.0f ? 1.0f : 0.0f;
  }
  float *X = (float *)arena_alloc(a, sizeof(float) * N * D, "data"),
        *y = (float *)arena_alloc(a, sizeof(float) * N, "data");
  float *w = (float *)arena_alloc(a, sizeof(float) * D, "weights"),
        *b = (float *)arena_alloc(a, sizeof(float), "weights");
  GG(gg_arena_copy_to_device(a, X, hX, sizeof(float) * N * D));
  GG(gg_arena_copy_to_device(a, y, hy, sizeof(float) * N));
  GG(gg_arena_memset(a, w, 0, sizeof(float) * D));
  GG(gg_arena_memset(a, b, 0, sizeof(float)));
  print_stats(a, "after loading data and weights");

  float loss = 0.0f;
  for (int step = 1; step <= steps; step++) {
    gg_scope_t scope; /* everything the step allocates ends with it */
    GG(gg_scope_begin(a, &scope));
    float *err = (float *)arena_alloc(a, sizeof(float) * N, "residual");
    float *grad = (float *)arena_alloc(a, sizeof(float) * (D + 1), "grad");
    float *dloss = (float *)arena_alloc(a, sizeof(float), "loss");
    if (gpu) {
      CU(cudaMemsetAsync(dloss, 0, sizeof(float), stream));
      forward_kernel<<<(N + 255) / 256, 256, 0, stream>>>(X, y, w, b, err, dloss);
      grad_kernel<<<D + 1, 256, 0, stream>>>(X, err, grad);
      update_kernel<<<1, D + 1, 0, stream>>>(w, b, grad);
      CU(cudaGetLastError());
      if (step % every == 0 || step == steps) {
        CU(cudaStreamSynchronize(stream));
        GG(gg_arena_copy_from_device(a, &loss, dloss, sizeof loss));
      }
    } else {
      host_step(X, y, w, b, err, grad, dloss);
      loss = *dloss;
    }
    if (step % every == 0 || step == steps) {
      printf("step %4d  loss %.4f\n", step, loss);
      char when[32];
      snprintf(when, sizeof when, "inside step %d", step);
      print_stats(a, when);
    }
    GG(gg_scope_end(&scope));
  }
  if (gpu) CU(cudaStreamSynchronize(stream));

  /* Accuracy on the host with the trained weights. */
  float hw[D], hb;
  GG(gg_arena_copy_from_device(a, hw, w, sizeof hw));
  GG(gg_arena_copy_from_device(a, &hb, b, sizeof hb));
  int correct = 0;
  for (int i = 0; i < N; i++) {
    float z = hb;
    for (int j = 0; j < D; j++) z += hX[i * D + j] * hw[j];
    correct += (z > 0.0f) == (hy[i] > 0.5f);
  }
  printf("done: %d steps, final loss %.4f, training accuracy %.1f%%\n", steps, loss, 100.0 * correct / N);
  print_stats(a, "after the last step");
  printf("  blocks still live (the data and weights, each scope's temporaries are gone):\n");
  GG(gg_arena_foreach_block(a, print_block, NULL));
  GG(gg_arena_trim(a, 0));
  print_stats(a, "after trim");
  GG(gg_arena_destroy(a));
  if (gpu) CU(cudaStreamDestroy(stream));
  free(hX), free(hy);
  return correct > N * 8 / 10 ? 0 : 1;
}
