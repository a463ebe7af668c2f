/* bench_arena.cu — the arena against cudaMalloc and cudaMallocAsync, side by side in one run:
 * alloc+free pair latency, scope ends, fragmentation on a training-like sequence, and trim. Without
 * a CUDA device it runs the gpuguard rows on the host backend and says the CUDA columns were
 * skipped. */
#include <cuda_runtime.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpuguard/gpuguard.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

static bool gpu;            /* a CUDA device is there: the CUDA columns run */
static cudaStream_t stream; /* the stream every allocator is measured on */
static double timer_ns;     /* cost of one timed interval with nothing in it */

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int cmp_double(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return a < b ? -1 : a > b;
}

static void die(const char *what, const char *why) {
  fprintf(stderr, "bench_arena: %s: %s\n", what, why);
  exit(1);
}
#define GG(call)                                 \
  do {                                           \
    if ((call) < 0) die(#call, gg_last_error()); \
  } while (0)
#define CU(call)                                               \
  do {                                                         \
    cudaError_t e_ = (call);                                   \
    if (e_ != cudaSuccess) die(#call, cudaGetErrorString(e_)); \
  } while (0)

typedef struct result {
  double median, p99;
  bool ran;
} result_t;

static result_t summarize(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  result_t r = {v[n / 2] - timer_ns, v[(int)(n * 0.99)] - timer_ns, true};
  if (r.median < 0) r.median = 0;
  return r;
}

/* ---- allocators under test: one alloc+free pair each ----------------------------------------- */

/* A_ORDERED: what gpuguard's PyTorch backend calls for its default pool (gg_alloc_on / gg_free_on
 * on the arena's stream): stream-ordered, so a block freed on the stream is reusable at once by
 * later work on it, as with cudaMallocAsync. */
typedef enum { A_GG, A_GG_NOSTREAM, A_ORDERED, A_MALLOC, A_ASYNC, A_COUNT } alloc_kind_t;
static gg_arena_t *arena[3];

static void *ordered_alloc(size_t size) {
  void *p = NULL;
  GG(gg_alloc_on(arena[A_ORDERED], size, (void *)stream, &p));
  return p;
}

static void ordered_free(void *p) { GG(gg_free_on(arena[A_ORDERED], p, (void *)stream)); }

static void pair(alloc_kind_t k, size_t size) {
  void *p = NULL;
  switch (k) {
  case A_GG:
  case A_GG_NOSTREAM:
    GG(gg_alloc(arena[k], size, &p));
    GG(gg_free(arena[k], p));
    break;
  case A_ORDERED:
    p = ordered_alloc(size);
    ordered_free(p);
    break;
  case A_MALLOC:
    CU(cudaMalloc(&p, size));
    CU(cudaFree(p));
    break;
  default:
    CU(cudaMallocAsync(&p, size, stream));
    CU(cudaFreeAsync(p, stream));
    break;
  }
}

static double events_per_1000; /* batch events gpuguard recorded per 1000 pairs, last measurement */

static unsigned long long arena_events(gg_arena_t *a) {
  gg_arena_stats_t s;
  GG(gg_arena_stats(a, &s));
  return s.n_events;
}

/* Two measurements of the same sequence: single pairs timed one by one (for p99: a pair's worst
 * case) and batches of pairs timed together (for the median: the clock's own cost and jitter, ~50
 * ns per read on the VM, would otherwise dominate a 100 ns figure). */
static result_t measure_pairs(alloc_kind_t k, const size_t *sizes, int nsizes, int iters) {
  for (int i = 0; i < 2000; i++)
    pair(k, sizes[i % nsizes]); /* warm: pools filled, chunks mapped, caches hot */
  unsigned long long ev0 = k == A_GG ? arena_events(arena[0]) : 0;
  double *v = (double *)malloc((size_t)iters * sizeof *v);
  for (int i = 0; i < iters; i++) {
    double t0 = now_ns();
    pair(k, sizes[i % nsizes]);
    v[i] = now_ns() - t0;
  }
  result_t r = summarize(v, iters);
  if (k == A_GG) events_per_1000 = 1000.0 * (double)(arena_events(arena[0]) - ev0) / iters;
  const int batch = k >= A_MALLOC ? 4 : 64;
  int nb = iters / batch < 16 ? 16 : iters / batch;
  double *b = (double *)malloc((size_t)nb * sizeof *b);
  for (int j = 0, i = 0; j < nb; j++) {
    double t0 = now_ns();
    for (int n = 0; n < batch; n++, i++) pair(k, sizes[i % nsizes]);
    b[j] = (now_ns() - t0 - timer_ns) / batch;
  }
  qsort(b, (size_t)nb, sizeof *b, cmp_double);
  r.median = b[nb / 2] > 0 ? b[nb / 2] : 0;
  free(b);
  free(v);
  return r;
}

static void fmt_result(char *out, size_t cap, result_t r) {
  if (!r.ran)
    snprintf(out, cap, "skipped");
  else
    snprintf(out, cap, "%.0f / %.0f", r.median, r.p99);
}

static void bench_pairs(void) {
  static const size_t fixed[] = {256, 64 * KiB, 2 * MiB, 64 * MiB};
  static const char *const labels[] = {"256 B", "64 KiB", "2 MiB", "64 MiB", "mix 256 B..64 MiB"};
  enum { NMIX = 4096 };
  static size_t mix[NMIX];
  unsigned long long s = 12345;
  for (int i = 0; i < NMIX; i++) { /* log-uniform sizes, the same sequence for every allocator */
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    double u = (double)(s >> 11) / 9007199254740992.0;
    double bytes = 256.0 * pow(2.0, u * 18.0);
    mix[i] = ((size_t)bytes + 255) / 256 * 256;
  }
  printf("\n## alloc+free pair latency, ns (median of batch means / p99 of single pairs), same "
         "sizes and order "
         "for every allocator\n\n");
  printf("| size | gpuguard | gpuguard no-stream | gpuguard stream-ordered (PyTorch's path) | "
         "cudaMalloc | "
         "cudaMallocAsync "
         "| cudaMalloc / gpuguard | async / gpuguard | async / ordered | gpuguard events per 1000 "
         "pairs "
         "|\n|---|---|---|---|---|---|---|---|---|---|\n");
  for (int row = 0; row < 5; row++) {
    const size_t *sz = row < 4 ? &fixed[row] : mix;
    int nsz = row < 4 ? 1 : NMIX;
    result_t r[A_COUNT] = {};
    for (int k = 0; k < A_COUNT; k++) {
      if ((k == A_MALLOC || k == A_ASYNC) && !gpu) continue;
      bool big = row >= 2;
      int iters = k == A_MALLOC ? (big ? 300 : 2000) : k == A_ASYNC ? 10000 : (big ? 10000 : 50000);
      r[k] = measure_pairs((alloc_kind_t)k, sz, nsz, iters);
    }
    char c[A_COUNT][48], x1[32] = "skipped", x2[32] = "skipped", x3[32] = "skipped";
    for (int k = 0; k < A_COUNT; k++) fmt_result(c[k], sizeof c[k], r[k]);
    double g = r[A_GG].median > 1 ? r[A_GG].median : 1,
           gp = r[A_ORDERED].median > 1 ? r[A_ORDERED].median : 1;
    if (r[A_MALLOC].ran) snprintf(x1, sizeof x1, "%.0fx", r[A_MALLOC].median / g);
    if (r[A_ASYNC].ran) snprintf(x2, sizeof x2, "%.1fx", r[A_ASYNC].median / g);
    if (r[A_ASYNC].ran) snprintf(x3, sizeof x3, "%.1fx", r[A_ASYNC].median / gp);
    printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %.1f |\n", labels[row], c[A_GG],
           c[A_GG_NOSTREAM], c[A_ORDERED], c[A_MALLOC], c[A_ASYNC], x1, x2, x3, events_per_1000);
  }
  printf("\ngoals: gpuguard median <= 100 ns per pair, >= 15x faster than cudaMallocAsync, >= 50x "
         "faster than "
         "cudaMalloc.\n'gpuguard' tracks the stream (a freed block waits for the work queued "
         "before its free); "
         "'no-stream' reuses at once (GG_ARENA_NO_STREAM); 'stream-ordered' is "
         "gg_alloc_on/gg_free_on on the "
         "arena's stream, stream-ordered as cudaMallocAsync is (a block freed on the stream is "
         "reused at once "
         "by "
         "later work on it).\n");
}

/* ---- 64 live blocks, one replaced at a time -------------------------------------------------- */

/* A random one of 64 live blocks is freed and a new one allocated in its place, sizes log-uniform
 * in 16 B..4 MiB: the free list, coalescing and (tracked) batch closes at work, not just the bump
 * block. */
typedef struct churn {
  void *live[64];
  unsigned long long s;
} churn_t;

static size_t churn_next(churn_t *c, unsigned *slot) {
  c->s = c->s * 6364136223846793005ull + 1442695040888963407ull;
  *slot = (unsigned)(c->s >> 58);
  double u = (double)((c->s >> 11) & ((1ull << 40) - 1)) / (double)(1ull << 40);
  return (size_t)(16.0 * pow(2.0, u * 18.0)); /* 16 B .. 4 MiB */
}

static void churn_alloc(alloc_kind_t k, void **p, size_t n) {
  if (k <= A_GG_NOSTREAM)
    GG(gg_alloc(arena[k], n, p));
  else if (k == A_ORDERED)
    *p = ordered_alloc(n);
  else if (k == A_MALLOC)
    CU(cudaMalloc(p, n));
  else
    CU(cudaMallocAsync(p, n, stream));
}

static void churn_free(alloc_kind_t k, void *p) {
  if (k <= A_GG_NOSTREAM)
    GG(gg_free(arena[k], p));
  else if (k == A_ORDERED)
    ordered_free(p);
  else if (k == A_MALLOC)
    CU(cudaFree(p));
  else
    CU(cudaFreeAsync(p, stream));
}

/* One step: free a random live block, allocate its replacement. */
static void churn_step(alloc_kind_t k, churn_t *c) {
  unsigned slot;
  size_t n = churn_next(c, &slot);
  churn_free(k, c->live[slot]);
  churn_alloc(k, &c->live[slot], n);
}

static result_t measure_churn(alloc_kind_t k, int iters) {
  churn_t c = {{0}, 4242};
  unsigned slot;
  for (int i = 0; i < 64; i++) churn_alloc(k, &c.live[i], churn_next(&c, &slot));
  for (int i = 0; i < 2000; i++) churn_step(k, &c); /* warm */
  double *v = (double *)malloc((size_t)iters * sizeof *v);
  for (int i = 0; i < iters; i++) {
    double t0 = now_ns();
    churn_step(k, &c);
    v[i] = now_ns() - t0;
  }
  result_t r = summarize(v, iters);
  const int batch = k >= A_MALLOC ? 4 : 64;
  int nb = iters / batch < 16 ? 16 : iters / batch;
  double *b = (double *)malloc((size_t)nb * sizeof *b);
  for (int j = 0; j < nb; j++) {
    double t0 = now_ns();
    for (int n = 0; n < batch; n++) churn_step(k, &c);
    b[j] = (now_ns() - t0 - timer_ns) / batch;
  }
  qsort(b, (size_t)nb, sizeof *b, cmp_double);
  r.median = b[nb / 2] > 0 ? b[nb / 2] : 0;
  for (int i = 0; i < 64; i++) churn_free(k, c.live[i]);
  if (k <= A_ORDERED) GG(gg_arena_trim(arena[k], 0)); /* later sections start from an empty arena */
  free(b);
  free(v);
  return r;
}

static void bench_churn(void) {
  printf("\n## 64 live blocks, free a random one and allocate a new one (16 B..4 MiB, "
         "log-uniform), ns per "
         "free+alloc (median of batch means / p99 of single steps)\n\n");
  printf("| gpuguard | gpuguard no-stream | gpuguard stream-ordered | cudaMalloc | cudaMallocAsync "
         "| async "
         "/ gpuguard | "
         "async / ordered |\n|---|---|---|---|---|---|---|\n");
  result_t r[A_COUNT] = {};
  for (int k = 0; k < A_COUNT; k++) {
    if ((k == A_MALLOC || k == A_ASYNC) && !gpu) continue;
    r[k] = measure_churn((alloc_kind_t)k, k == A_MALLOC ? 300 : k == A_ASYNC ? 10000 : 50000);
  }
  char c[A_COUNT][48], x[32] = "skipped", xp[32] = "skipped";
  for (int k = 0; k < A_COUNT; k++) fmt_result(c[k], sizeof c[k], r[k]);
  if (r[A_ASYNC].ran) {
    snprintf(x, sizeof x, "%.1fx", r[A_ASYNC].median / (r[A_GG].median > 1 ? r[A_GG].median : 1));
    snprintf(xp, sizeof xp, "%.1fx",
             r[A_ASYNC].median / (r[A_ORDERED].median > 1 ? r[A_ORDERED].median : 1));
  }
  printf("| %s | %s | %s | %s | %s | %s | %s |\n\ngoal: gpuguard <= 100 ns.\n", c[A_GG],
         c[A_GG_NOSTREAM], c[A_ORDERED], c[A_MALLOC], c[A_ASYNC], x, xp);
}

/* ---- scope ends ------------------------------------------------------------------------------ */

static void bench_scopes(void) {
  printf("\n## scope end\n\n| blocks released | kind | scope end total ns | ns per block "
         "|\n|---|---|---|---|\n");
  static const int counts[] = {16, 256, 4096, 65536};
  for (int c = 0; c < 4; c++) {
    int n = counts[c];
    double best = 1e300;
    for (int rep = 0; rep < 5; rep++) { /* pure bump: every block sits above the scope's start */
      gg_scope_t sc;
      GG(gg_scope_begin(arena[0], &sc));
      for (int i = 0; i < n; i++) {
        void *p;
        GG(gg_alloc(arena[0], 256 + (size_t)(i % 8) * 256, &p));
      }
      double t0 = now_ns();
      GG(gg_scope_end(&sc));
      double t = now_ns() - t0;
      if (t < best) best = t;
    }
    printf("| %d | pure bump (O(1)) | %.0f | %.2f |\n", n, best, best / n);
  }
  for (int c = 0; c < 4; c++) {
    int n = counts[c];
    /* Holes of the right size, so the scope's blocks come from best fit, not from the bump block.
     * */
    void **keep = (void **)malloc(2 * (size_t)n * sizeof *keep);
    for (int i = 0; i < 2 * n; i++) GG(gg_alloc(arena[1], 4096, &keep[i]));
    for (int i = 0; i < 2 * n; i += 2) GG(gg_free(arena[1], keep[i]));
    GG(gg_arena_trim(arena[1], SIZE_MAX)); /* settles the frees into the free tree */
    gg_scope_t sc;
    GG(gg_scope_begin(arena[1], &sc));
    for (int i = 0; i < n; i++) {
      void *p;
      GG(gg_alloc(arena[1], 4096, &p));
    }
    double t0 = now_ns();
    GG(gg_scope_end(&sc));
    double t = now_ns() - t0;
    for (int i = 1; i < 2 * n; i += 2) GG(gg_free(arena[1], keep[i]));
    GG(gg_arena_trim(arena[1], SIZE_MAX));
    free(keep);
    printf("| %d | from best fit (O(blocks)) | %.0f | %.2f |\n", n, t, t / n);
  }
}

/* ---- threads: several threads allocating on one arena at once -------------------------------- */

typedef enum {
  T_GG,
  T_GG_NOSTREAM,
  T_GG_OWN,
  T_ORDERED,
  T_ASYNC,
  T_ASYNC_OWN,
  T_COUNT
} thread_kind_t;
static const char *const thread_kind_names[T_COUNT] = {
    "gpuguard, one arena",
    "gpuguard no-stream, one arena",
    "gpuguard, per-thread stream (one arena each)",
    "gpuguard stream-ordered (PyTorch's path), one arena",
    "cudaMallocAsync, one stream",
    "cudaMallocAsync, per-thread stream"};

typedef struct thread_run {
  thread_kind_t kind;
  gg_arena_t *arena; /* the shared one, or this thread's own (T_GG_OWN) */
  cudaStream_t stream;
  const size_t *sizes;
  int nsizes;
  unsigned long long pairs;
  pthread_barrier_t *start;
  const volatile int *stop;
} thread_run_t;

static void *thread_pairs(void *arg) {
  thread_run_t *r = (thread_run_t *)arg;
  /* As a thread that does GPU work (a PyTorch thread sets its device first): the device's context
   * is current. A thread with none makes every driver call the library needs push and pop the
   * context, and the driver serialises those (H200: 7 M push+query+pop per second in all, from 2 to
   * 16 threads). */
  if (gpu) CU(cudaSetDevice(0));
  pthread_barrier_wait(r->start);
  unsigned long long n = 0;
  for (int i = 0; !*r->stop; i++) {
    for (int k = 0; k < 64; k++, i++) { /* the stop flag is read once per 64 pairs */
      size_t size = r->sizes[i % r->nsizes];
      void *p = NULL;
      if (r->kind == T_ORDERED) {
        p = ordered_alloc(size);
        ordered_free(p);
      } else if (r->kind < T_ASYNC) {
        GG(gg_alloc(r->arena, size, &p));
        GG(gg_free(r->arena, p));
      } else {
        CU(cudaMallocAsync(&p, size, r->stream));
        CU(cudaFreeAsync(p, r->stream));
      }
    }
    n += 64;
  }
  r->pairs = n;
  return NULL;
}

/* Aggregate pairs per second of `threads` threads doing alloc+free pairs for about 250 ms. */
static double thread_rate(thread_kind_t kind, int threads, const size_t *sizes, int nsizes) {
  enum { MAXT = 16 };
  static volatile int stop;
  pthread_t tid[MAXT];
  thread_run_t run[MAXT];
  cudaStream_t own_stream[MAXT] = {};
  void *host_stream[MAXT] = {};
  gg_arena_t *own[MAXT] = {};
  gg_arena_t *shared = NULL;
  pthread_barrier_t start;
  pthread_barrier_init(&start, NULL, (unsigned)threads + 1);
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.name = "threads";
  if (kind == T_GG || kind == T_GG_NOSTREAM) {
    o.stream = (void *)stream, o.flags = kind == T_GG_NOSTREAM ? GG_ARENA_NO_STREAM : 0;
    GG(gg_arena_create(&shared, &o));
  }
  for (int t = 0; t < threads; t++) {
    if (kind == T_ASYNC_OWN) CU(cudaStreamCreateWithFlags(&own_stream[t], cudaStreamNonBlocking));
    if (kind == T_GG_OWN) {
      if (gpu)
        CU(cudaStreamCreateWithFlags(&own_stream[t], cudaStreamNonBlocking));
      else
        GG(gg_host_stream_create(&host_stream[t]));
      o.stream = gpu ? (void *)own_stream[t] : host_stream[t];
      GG(gg_arena_create(&own[t], &o));
    }
    run[t] = (thread_run_t){kind,
                            kind == T_GG_OWN ? own[t] : shared,
                            kind == T_ASYNC_OWN ? own_stream[t] : stream,
                            sizes,
                            nsizes,
                            0,
                            &start,
                            &stop};
  }
  stop = 0;
  for (int t = 0; t < threads; t++) pthread_create(&tid[t], NULL, thread_pairs, &run[t]);
  pthread_barrier_wait(&start);
  double t0 = now_ns();
  struct timespec d = {0, 250 * 1000 * 1000};
  nanosleep(&d, NULL);
  stop = 1;
  unsigned long long pairs = 0;
  for (int t = 0; t < threads; t++) pthread_join(tid[t], NULL), pairs += run[t].pairs;
  double secs = (now_ns() - t0) / 1e9;
  if (gpu) CU(cudaDeviceSynchronize());
  for (int t = 0; t < threads; t++) {
    if (own[t]) GG(gg_arena_destroy(own[t]));
    if (own_stream[t]) CU(cudaStreamDestroy(own_stream[t]));
    if (host_stream[t]) gg_host_stream_destroy(host_stream[t]);
  }
  if (shared) GG(gg_arena_destroy(shared));
  pthread_barrier_destroy(&start);
  return (double)pairs / secs;
}

static void bench_threads(void) {
  static const size_t four_k[] = {4 * KiB};
  static const size_t mixed[] = {256, 4 * KiB, 1 * KiB, 16 * KiB, 512, 64 * KiB, 2 * KiB, 8 * KiB};
  static const int counts[] = {1, 2, 4, 8, 16};
  printf("\n## threads: alloc+free pairs on one arena from 1..16 threads, aggregate M pairs/s (x "
         "one thread's "
         "rate)\n\n");
  printf("| size | allocator | 1 | 2 | 4 | 8 | 16 |\n|---|---|---|---|---|---|---|\n");
  for (int row = 0; row < 2; row++) {
    for (int k = 0; k < T_COUNT; k++) {
      printf("| %s | %s |", row ? "mix 256 B..64 KiB" : "4 KiB", thread_kind_names[k]);
      if ((k == T_ASYNC || k == T_ASYNC_OWN) && !gpu) {
        printf(" skipped (no CUDA device) | | | | |\n");
        continue;
      }
      double one = 0;
      for (int c = 0; c < 5; c++) {
        double r = thread_rate((thread_kind_t)k, counts[c], row ? mixed : four_k, row ? 8 : 1);
        if (c == 0) one = r;
        printf(" %.2f (%.1fx) |", r / 1e6, one > 0 ? r / one : 0);
      }
      printf("\n");
      fflush(stdout);
    }
  }
  printf("\ngoal: gpuguard, one arena: >= 4x one thread's rate at 8 threads, never below it. "
         "'gpuguard, "
         "per-thread stream' gives each thread an arena of its own tracking that thread's stream "
         "(an arena "
         "tracks one stream; threads on other streams of one arena are the 'one arena' rows).\n");
}

/* ---- fragmentation on a training-like sequence ----------------------------------------------- */

typedef struct seq_alloc {
  void *(*alloc)(void *ctx, size_t n);
  void (*release)(void *ctx, void *p);
  void *ctx;
} seq_alloc_t;

static void *gg_seq_alloc(void *ctx, size_t n) {
  void *p;
  GG(gg_alloc((gg_arena_t *)ctx, n, &p));
  return p;
}
static void gg_seq_free(void *ctx, void *p) { GG(gg_free((gg_arena_t *)ctx, p)); }
static void *async_seq_alloc(void *ctx, size_t n) {
  (void)ctx;
  void *p;
  CU(cudaMallocAsync(&p, n, stream));
  return p;
}
static void async_seq_free(void *ctx, void *p) {
  (void)ctx;
  CU(cudaFreeAsync(p, stream));
}

/* Weights once; per step a sequence length, activations layer by layer, workspaces in between, and
 * the backward pass freeing in reverse with gradients' workspaces. */
static void training_sequence(const seq_alloc_t *a, size_t hidden, size_t batch, int layers,
                              int steps) {
  enum { PER_LAYER = 4 };
  void **weights = (void **)malloc((size_t)layers * 6 * sizeof *weights);
  void **acts = (void **)malloc((size_t)layers * PER_LAYER * sizeof *acts);
  for (int l = 0; l < layers; l++) {
    for (int k = 0; k < 4; k++) weights[l * 6 + k] = a->alloc(a->ctx, hidden * hidden * 2);
    for (int k = 4; k < 6; k++) weights[l * 6 + k] = a->alloc(a->ctx, hidden * hidden * 4 * 2);
  }
  unsigned long long s = 777;
  static const size_t mult[PER_LAYER] = {1, 3, 4,
                                         1}; /* x, qkv, mlp, out: times batch*seq*hidden*2 */
  for (int step = 0; step < steps; step++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    size_t seq = 256 + ((s >> 33) % 29) * 64; /* 256 .. 2048 */
    size_t unit = batch * seq * hidden * 2;
    for (int l = 0; l < layers; l++) {
      for (int k = 0; k < PER_LAYER; k++) {
        acts[l * PER_LAYER + k] = a->alloc(a->ctx, unit * mult[k]);
        if (k == 1) { /* attention workspace, transient */
          void *ws = a->alloc(a->ctx, batch * seq * 64 * 4 + ((s >> 20) % 16) * MiB / 8);
          a->release(a->ctx, ws);
        }
      }
    }
    for (int l = layers - 1; l >= 0; l--) {
      void *grad_ws = a->alloc(a->ctx, unit * 2);
      for (int k = PER_LAYER - 1; k >= 0; k--) a->release(a->ctx, acts[l * PER_LAYER + k]);
      a->release(a->ctx, grad_ws);
    }
  }
  for (int i = 0; i < layers * 6; i++) a->release(a->ctx, weights[i]);
  free(weights), free(acts);
}

static void bench_fragmentation(void) {
  size_t hidden = gpu ? 4096 : 512, batch = gpu ? 8 : 4;
  int layers = 8, steps = 300;
  printf("\n## fragmentation on a training-like sequence (%d layers, hidden %zu, batch %zu, "
         "sequence length "
         "256..2048 varying per step, %d steps%s)\n\n",
         layers, hidden, batch, steps,
         gpu ? "" : "; host run: 16x smaller tensors and a 4 MiB chunk");
  printf("| allocator | peak in use (MiB) | peak mapped / reserved (MiB) | ratio | time (ms) "
         "|\n|---|---|---|---|---|\n");
  for (int mode = 0; mode < 2; mode++) {
    gg_arena_options_t o;
    gg_arena_options_init(&o);
    o.stream = (void *)stream, o.flags = mode ? GG_ARENA_NO_STREAM : 0, o.name = "training";
    o.chunk_size = gpu ? 0 : 4 * MiB; /* the host run is 16x smaller: so is its chunk */
    gg_arena_t *a;
    GG(gg_arena_create(&a, &o));
    seq_alloc_t sa = {gg_seq_alloc, gg_seq_free, a};
    double t0 = now_ns();
    training_sequence(&sa, hidden, batch, layers, steps);
    double t = (now_ns() - t0) / 1e6;
    gg_arena_stats_t st;
    GG(gg_arena_stats(a, &st));
    printf("| gpuguard%s | %.1f | %.1f | %.4f | %.1f |\n", mode ? " no-stream" : "",
           st.peak_in_use / (double)MiB, st.peak_mapped / (double)MiB,
           (double)st.peak_mapped / (double)st.peak_in_use, t);
    GG(gg_arena_destroy(a));
  }
  if (!gpu) {
    printf("| cudaMallocAsync | skipped (no CUDA device) | | | |\n");
    return;
  }
  cudaMemPool_t pool;
  CU(cudaDeviceGetDefaultMemPool(&pool, 0));
  CU(cudaStreamSynchronize(stream));
  CU(cudaMemPoolTrimTo(pool, 0));
  uint64_t zero = 0, reserved = 0, used = 0;
  CU(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &zero));
  CU(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero));
  seq_alloc_t sa = {async_seq_alloc, async_seq_free, NULL};
  double t0 = now_ns();
  training_sequence(&sa, hidden, batch, layers, steps);
  CU(cudaStreamSynchronize(stream));
  double t = (now_ns() - t0) / 1e6;
  CU(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &reserved));
  CU(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &used));
  printf("| cudaMallocAsync | %.1f | %.1f | %.4f | %.1f |\n", used / (double)MiB,
         reserved / (double)MiB, (double)reserved / (double)used, t);
  printf("\ngoal: gpuguard ratio <= 1.01 (peak mapped / peak in use).\n");
}

/* ---- trim ------------------------------------------------------------------------------------ */

static size_t driver_free(void) {
  if (gpu) {
    size_t f, t;
    CU(cudaMemGetInfo(&f, &t));
    return f;
  }
  gg_device_info_t info;
  GG(gg_device_info(0, &info));
  return info.free_bytes;
}

/* Trim at the default chunk size (8 MiB): blocks of 64 MiB (each mapped as 8 pieces) and of 2 MiB
 * (4 to a chunk), all freed, then one trim to 0; and with chunks the size of the request: 1 GiB
 * blocks (128 MiB on the host backend) in an arena whose chunk_size is that, each block one chunk.
 * Time per GiB, and the driver's free memory before the allocations against after the trim, to the
 * byte (0 means everything came back). */
static void bench_trim(void) {
  size_t total = gpu ? 16 * GiB : 512 * MiB;
  printf("\n## trim: giving %zu MiB back to the driver\n\n", total / MiB);
  printf("| block size | chunk size | chunks | driver free before alloc (bytes) | after alloc | "
         "after trim | "
         "after trim - before (bytes) | trim (ms) | ms per GiB |\n"
         "|---|---|---|---|---|---|---|---|---|\n");
  const size_t big = gpu ? GiB : 128 * MiB;
  const size_t blocks[] = {64 * MiB, 2 * MiB, big},
               chunks[] = {0, 0, big}; /* 0: the default, 8 MiB */
  for (int b = 0; b < 3; b++) {
    gg_arena_options_t o;
    gg_arena_options_init(&o);
    o.stream = (void *)stream, o.name = "trim", o.chunk_size = chunks[b];
    gg_arena_t *a;
    GG(gg_arena_create(&a, &o));
    size_t n = total / blocks[b];
    void **p = (void **)malloc(n * sizeof *p);
    size_t f0 = driver_free();
    for (size_t i = 0; i < n; i++) GG(gg_alloc(a, blocks[b], &p[i]));
    size_t f1 = driver_free();
    for (size_t i = 0; i < n; i++) GG(gg_free(a, p[i]));
    gg_arena_stats_t s;
    GG(gg_arena_stats(a, &s));
    double t0 = now_ns();
    GG(gg_arena_trim(a, 0));
    double t = (now_ns() - t0) / 1e6;
    size_t f2 = driver_free();
    char chunk[64];
    if (chunks[b]) {
      snprintf(chunk, sizeof chunk, "%zu MiB (chunk_size = the block's size)", chunks[b] / MiB);
    } else {
      snprintf(chunk, sizeof chunk, "8 MiB (default)");
    }
    printf("| %zu MiB | %s | %llu | %zu | %zu | %zu | %lld | %.2f | %.3f |\n", blocks[b] / MiB,
           chunk, s.n_chunks, f0, f1, f2, (long long)f2 - (long long)f0, t,
           t / ((double)s.bytes_mapped / GiB));
    free(p);
    GG(gg_arena_destroy(a));
  }
  printf("\ngoal: <= 1 ms per GiB, after trim - before = 0. bench_trim_driver shows the driver's "
         "own share.\n");
}

int main(void) {
  int n = 0;
  gpu = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  if (!gpu) {
    setenv("GPUGUARD_BACKEND", "host", 1);
    if (!getenv("GPUGUARD_HOST_CAPACITY")) setenv("GPUGUARD_HOST_CAPACITY", "4G", 1);
    printf("# bench_arena: no CUDA device — gpuguard rows run on the host backend (simulated "
           "device in host "
           "memory); the cudaMalloc and cudaMallocAsync columns are skipped.\n");
  } else {
    cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    CU(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaMemPool_t pool;
    CU(cudaDeviceGetDefaultMemPool(&pool, 0));
    uint64_t max = UINT64_MAX; /* warm pool: never give memory back between pairs */
    CU(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &max));
    printf("# bench_arena on %s (%zu MiB), gpuguard %s\n", prop.name, prop.totalGlobalMem / MiB,
           gg_version());
  }
  double v[20001];
  for (int i = 0; i < 20001; i++) {
    double t0 = now_ns();
    v[i] = now_ns() - t0;
  }
  qsort(v, 20001, sizeof *v, cmp_double);
  timer_ns = v[10000];
  printf("timer overhead %.0f ns, subtracted from every figure\n", timer_ns);
  for (int k = 0; k < 3; k++) {
    gg_arena_options_t o;
    gg_arena_options_init(&o);
    o.stream = (void *)stream, o.flags = k == 1   ? GG_ARENA_NO_STREAM
                                         : k == 2 ? GG_ARENA_KEEP_HOLES
                                                  : 0;
    o.name = k == 0 ? "bench" : k == 1 ? "bench-nostream" : "bench-ordered";
    GG(gg_arena_create(&arena[k], &o));
  }
  printf("gpuguard backend: %s\n", gg_arena_backend(arena[0]));
  double t0 = now_ns();
  bench_pairs();
  bench_churn();
  bench_scopes();
  bench_threads();
  for (int k = 0; k < 3; k++) GG(gg_arena_destroy(arena[k]));
  bench_fragmentation();
  bench_trim();
  printf("\ntotal bench time %.1f s\n", (now_ns() - t0) / 1e9);
  if (gpu) CU(cudaStreamDestroy(stream));
  return 0;
}
