/* bench_trim_driver.c — what the CUDA driver rewards when memory mapped as many chunks goes back to
 * it: chunk-by-chunk unmap+release (what trim did), unmaps then releases, one cuMemUnmap over the
 * whole range then the releases, handles released at map time so the unmap alone frees, and
 * releases on a second thread. Each way starts from the same mapping (total bytes as chunks of one
 * size, adjacent in one reserved range), is timed to the point where the driver's free memory is
 * back, and is checked to the byte against the free memory before mapping. A first section asks the
 * driver which ranges cuMemUnmap accepts. Driver API only, loaded at run time (no CUDA library is
 * linked).
 *
 *   bench_trim_driver [TOTAL_GiB=16] [CHUNK_MiB=8] [REPEATS=5]
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

/* The driver entry points used, by their exported (versioned) names. */
#define FUNCS(X)                                                                               \
  X(cuInit, "cuInit", (unsigned))                                                              \
  X(cuGetErrorName, "cuGetErrorName", (CUresult, const char **))                               \
  X(cuDeviceGet, "cuDeviceGet", (CUdevice *, int))                                             \
  X(cuDeviceGetName, "cuDeviceGetName", (char *, int, CUdevice))                               \
  X(cuDriverGetVersion, "cuDriverGetVersion", (int *))                                         \
  X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", (CUcontext *, CUdevice))             \
  X(cuCtxSetCurrent, "cuCtxSetCurrent", (CUcontext))                                           \
  X(cuCtxSynchronize, "cuCtxSynchronize", (void))                                              \
  X(cuMemGetInfo, "cuMemGetInfo_v2", (size_t *, size_t *))                                     \
  X(cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity",                            \
    (size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags))                 \
  X(cuMemAddressReserve, "cuMemAddressReserve",                                                \
    (CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long))                          \
  X(cuMemAddressFree, "cuMemAddressFree", (CUdeviceptr, size_t))                               \
  X(cuMemCreate, "cuMemCreate",                                                                \
    (CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long)) \
  X(cuMemRelease, "cuMemRelease", (CUmemGenericAllocationHandle))                              \
  X(cuMemMap, "cuMemMap",                                                                      \
    (CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long))           \
  X(cuMemUnmap, "cuMemUnmap", (CUdeviceptr, size_t))                                           \
  X(cuMemSetAccess, "cuMemSetAccess", (CUdeviceptr, size_t, const CUmemAccessDesc *, size_t))

static struct {
#define MEMBER(name, sym, args) CUresult(CUDAAPI *name) args;
  FUNCS(MEMBER)
#undef MEMBER
} cu;

static const char *errname(CUresult r) {
  const char *s = NULL;
  return cu.cuGetErrorName && cu.cuGetErrorName(r, &s) == CUDA_SUCCESS && s ? s : "?";
}

#define CK(call)                                                                          \
  do {                                                                                    \
    CUresult r_ = (call);                                                                 \
    if (r_ != CUDA_SUCCESS) {                                                             \
      fprintf(stderr, "bench_trim_driver: %s failed: %s (line %d)\n", #call, errname(r_), \
              __LINE__);                                                                  \
      exit(1);                                                                            \
    }                                                                                     \
  } while (0)

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static int load_driver(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    printf("# bench_trim_driver: no CUDA driver here (%s): nothing to measure.\n", dlerror());
    return -1;
  }
#define RESOLVE(name, sym, args)                                                      \
  {                                                                                   \
    void *p = dlsym(lib, sym);                                                        \
    if (!p) {                                                                         \
      printf("# bench_trim_driver: the driver lacks %s: nothing to measure.\n", sym); \
      return -1;                                                                      \
    }                                                                                 \
    memcpy(&cu.name, &p, sizeof p);                                                   \
  }
  FUNCS(RESOLVE)
#undef RESOLVE
  CUresult r = cu.cuInit(0);
  if (r != CUDA_SUCCESS) {
    printf("# bench_trim_driver: cuInit failed (%s): nothing to measure.\n", errname(r));
    return -1;
  }
  return 0;
}

/* ---- one mapping of n chunks ----------------------------------------------------------------- */

static CUmemAllocationProp prop;
static CUmemAccessDesc access_desc;

typedef struct mapping {
  CUdeviceptr base;
  size_t n, chunk, reserved;
  CUmemGenericAllocationHandle *h;
  double map_ms, early_release_ms; /* what mapping took, and releasing at map time added */
} mapping_t;

static size_t driver_free(void) {
  size_t f = 0, t = 0;
  CK(cu.cuMemGetInfo(&f, &t));
  return f;
}

/* Maps n chunks adjacently at the start of one reservation. early: each handle is released once it
 * is mapped, so the mapping alone holds the memory and its unmap frees it. */
static void map_chunks(mapping_t *m, size_t n, size_t chunk, bool early) {
  m->n = n, m->chunk = chunk, m->reserved = n * chunk;
  m->h = calloc(n, sizeof *m->h);
  CK(cu.cuMemAddressReserve(&m->base, m->reserved, 0, 0, 0));
  double t0 = now_ms();
  for (size_t i = 0; i < n; i++) {
    CK(cu.cuMemCreate(&m->h[i], chunk, &prop, 0));
    CK(cu.cuMemMap(m->base + i * chunk, chunk, 0, m->h[i], 0));
    CK(cu.cuMemSetAccess(m->base + i * chunk, chunk, &access_desc, 1));
  }
  m->map_ms = now_ms() - t0;
  m->early_release_ms = 0;
  if (early) {
    t0 = now_ms();
    for (size_t i = 0; i < n; i++) {
      CK(cu.cuMemRelease(m->h[i]));
      m->h[i] = 0;
    }
    m->early_release_ms = now_ms() - t0;
  }
  CK(cu.cuCtxSynchronize());
}

static void unreserve(mapping_t *m) {
  CK(cu.cuMemAddressFree(m->base, m->reserved));
  free(m->h);
}

/* ---- releases on a second thread ------------------------------------------------------------- */

typedef struct releaser {
  pthread_t thread;
  CUcontext ctx;
  CUmemGenericAllocationHandle *h;
  size_t n;
  atomic_size_t ready; /* handles the main thread has unmapped and handed over */
} releaser_t;

static void *release_loop(void *arg) {
  releaser_t *r = arg;
  CK(cu.cuCtxSetCurrent(r->ctx));
  for (size_t done = 0; done < r->n;) {
    size_t ready = atomic_load_explicit(&r->ready, memory_order_acquire);
    if (ready == done) {
      sched_yield();
      continue;
    }
    while (done < ready) CK(cu.cuMemRelease(r->h[done++]));
  }
  return NULL;
}

/* ---- the ways to give a mapping back --------------------------------------------------------- */

typedef enum {
  W_PER_CHUNK,       /* for each chunk, highest first: unmap, release (trim before this change) */
  W_UNMAPS_RELEASES, /* every unmap, then every release */
  W_RANGE,           /* one cuMemUnmap over the whole range, then every release (trim now) */
  W_EARLY_RANGE,     /* handles released at map time; one cuMemUnmap frees everything */
  W_EARLY_CHUNKS,    /* handles released at map time; an unmap per chunk */
  W_RANGE_BG,        /* one cuMemUnmap, releases on a second thread, waited for */
  W_PIPELINE_BG,     /* an unmap per chunk, each handle released on a second thread meanwhile */
  W_RANGE_MT,        /* one cuMemUnmap, releases split over RELEASERS threads, waited for */
  W_COUNT
} way_t;

static const char *const way_name[W_COUNT] = {"per chunk: unmap + release",
                                              "all unmaps, then all releases",
                                              "one range unmap + releases",
                                              "release at map; one range unmap",
                                              "release at map; unmap per chunk",
                                              "range unmap; releases on a thread",
                                              "unmap per chunk; releases on a thread (pipelined)",
                                              "range unmap; releases on 8 threads"};
#define RELEASERS 8

typedef struct sample {
  double ms;        /* until the driver has the memory back (what trim must wait for) */
  double return_ms; /* background ways: until the unmaps returned */
  double map_ms, early_ms;
  long long free_delta; /* driver free after - before mapping, bytes: 0 is back to the byte */
} sample_t;

static sample_t run_way(way_t w, size_t n, size_t chunk, CUcontext ctx) {
  bool early = w == W_EARLY_RANGE || w == W_EARLY_CHUNKS;
  size_t f0 = driver_free();
  mapping_t m;
  map_chunks(&m, n, chunk, early);
  sample_t s = {.map_ms = m.map_ms, .early_ms = m.early_release_ms};
  releaser_t rel = {.ctx = ctx, .h = m.h, .n = n}, mt[RELEASERS];
  atomic_init(&rel.ready, 0);
  if (w == W_RANGE_BG || w == W_PIPELINE_BG) pthread_create(&rel.thread, NULL, release_loop, &rel);
  if (w == W_RANGE_MT)
    for (size_t k = 0; k < RELEASERS; k++) {
      size_t lo = n * k / RELEASERS, hi = n * (k + 1) / RELEASERS;
      mt[k] = (releaser_t){.ctx = ctx, .h = m.h + lo, .n = hi - lo};
      atomic_init(&mt[k].ready, 0);
      pthread_create(&mt[k].thread, NULL, release_loop, &mt[k]);
    }
  double t0 = now_ms();
  switch (w) {
  case W_PER_CHUNK:
    for (size_t i = n; i-- > 0;) {
      CK(cu.cuMemUnmap(m.base + i * chunk, chunk));
      CK(cu.cuMemRelease(m.h[i]));
    }
    break;
  case W_UNMAPS_RELEASES:
    for (size_t i = n; i-- > 0;) CK(cu.cuMemUnmap(m.base + i * chunk, chunk));
    for (size_t i = n; i-- > 0;) CK(cu.cuMemRelease(m.h[i]));
    break;
  case W_RANGE:
    CK(cu.cuMemUnmap(m.base, n * chunk));
    for (size_t i = 0; i < n; i++) CK(cu.cuMemRelease(m.h[i]));
    break;
  case W_EARLY_RANGE: CK(cu.cuMemUnmap(m.base, n * chunk)); break;
  case W_EARLY_CHUNKS:
    for (size_t i = n; i-- > 0;) CK(cu.cuMemUnmap(m.base + i * chunk, chunk));
    break;
  case W_RANGE_BG:
    CK(cu.cuMemUnmap(m.base, n * chunk));
    atomic_store_explicit(&rel.ready, n, memory_order_release);
    break;
  case W_PIPELINE_BG:
    for (size_t i = 0; i < n; i++) {
      CK(cu.cuMemUnmap(m.base + i * chunk, chunk));
      atomic_store_explicit(&rel.ready, i + 1, memory_order_release);
    }
    break;
  case W_RANGE_MT:
    CK(cu.cuMemUnmap(m.base, n * chunk));
    for (size_t k = 0; k < RELEASERS; k++)
      atomic_store_explicit(&mt[k].ready, mt[k].n, memory_order_release);
    break;
  default: break;
  }
  s.return_ms = now_ms() - t0;
  if (w == W_RANGE_BG || w == W_PIPELINE_BG) pthread_join(rel.thread, NULL);
  if (w == W_RANGE_MT)
    for (size_t k = 0; k < RELEASERS; k++) pthread_join(mt[k].thread, NULL);
  s.ms = now_ms() - t0;
  s.free_delta = (long long)driver_free() - (long long)f0;
  unreserve(&m);
  return s;
}

static int cmp_double(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return a < b ? -1 : a > b;
}

/* ---- what cuMemUnmap accepts ----------------------------------------------------------------- */

static bool range_ok; /* the driver unmaps several whole mappings in one call */

static void say(const char *what, CUresult r) {
  printf("| %s | %s |\n", what, r == CUDA_SUCCESS ? "accepted" : errname(r));
}

static void probe_ranges(size_t chunk) {
  printf("\n## what cuMemUnmap accepts (chunks of %zu MiB, adjacent)\n\n| range | driver's answer "
         "|\n|---|---|\n",
         chunk / MiB);
  size_t f0 = driver_free();
  mapping_t m;
  map_chunks(&m, 4, chunk, false);
  CUresult r01 = cu.cuMemUnmap(m.base, 2 * chunk);
  say("2 whole adjacent mappings (chunks 0-1) in one call", r01);
  range_ok = r01 == CUDA_SUCCESS;
  if (r01 != CUDA_SUCCESS) { /* this driver takes one mapping per call: unmap them one by one */
    CK(cu.cuMemUnmap(m.base, chunk));
    CK(cu.cuMemUnmap(m.base + chunk, chunk));
  }
  say("half of one mapping (chunk 2, first half)", cu.cuMemUnmap(m.base + 2 * chunk, chunk / 2));
  say("one mapping and a half (chunk 2 + half of 3)",
      cu.cuMemUnmap(m.base + 2 * chunk, chunk + chunk / 2));
  say("a range with an unmapped hole (chunks 0-3, 0-1 unmapped already)",
      cu.cuMemUnmap(m.base, 4 * chunk));
  /* After the refusals chunks 2 and 3 should still be mapped: each unmaps on its own. */
  CUresult r2 = cu.cuMemUnmap(m.base + 2 * chunk, chunk),
           r3 = cu.cuMemUnmap(m.base + 3 * chunk, chunk);
  say("chunk 2 alone, afterwards (accepted: it was still mapped)", r2);
  say("chunk 3 alone, afterwards (accepted: it was still mapped)", r3);
  for (size_t i = 0; i < 4; i++) CK(cu.cuMemRelease(m.h[i]));
  unreserve(&m);
  printf("\ndriver free memory after releasing them: %+lld bytes against before mapping\n",
         (long long)driver_free() - (long long)f0);
}

int main(int argc, char **argv) {
  double total_gib = argc > 1 ? atof(argv[1]) : 16;
  size_t chunk = (size_t)(argc > 2 ? atof(argv[2]) : 8) * MiB;
  int reps = argc > 3 ? atoi(argv[3]) : 5;
  if (total_gib <= 0 || chunk == 0 || reps < 1) {
    fprintf(stderr, "usage: bench_trim_driver [TOTAL_GiB=16] [CHUNK_MiB=8] [REPEATS=5]\n");
    return 2;
  }
  if (load_driver() < 0) return 0;
  CUdevice dev;
  CUcontext ctx;
  char name[256] = "";
  int version = 0;
  CK(cu.cuDeviceGet(&dev, 0));
  CK(cu.cuDeviceGetName(name, sizeof name, dev));
  CK(cu.cuDriverGetVersion(&version));
  CK(cu.cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cu.cuCtxSetCurrent(ctx));
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  access_desc.location = prop.location, access_desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  size_t gran = 0;
  CK(cu.cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  chunk = (chunk + gran - 1) / gran * gran;
  size_t total = (size_t)(total_gib * (double)GiB);
  size_t n = (total + chunk - 1) / chunk;
  total = n * chunk;
  printf("# bench_trim_driver on %s (driver %d), granularity %zu KiB: %.2f GiB as %zu chunks of "
         "%zu MiB, "
         "%d repeats (median, min)\n",
         name, version, gran >> 10, (double)total / GiB, n, chunk / MiB, reps);
  probe_ranges(chunk);
  printf("\n## giving %.2f GiB back: %zu chunks of %zu MiB\n\n"
         "| way | ms (median) | ms (min) | ms per GiB | returned after (ms) | map (ms) | release "
         "at map (ms) | "
         "driver free vs before (bytes) |\n|---|---|---|---|---|---|---|---|\n",
         (double)total / GiB, n, chunk / MiB);
  double *v = calloc((size_t)reps, sizeof *v);
  for (int w = 0; w < W_COUNT; w++) {
    if (!range_ok && (w == W_RANGE || w == W_EARLY_RANGE || w == W_RANGE_BG || w == W_RANGE_MT)) {
      printf("| %s | refused by this driver | | | | | | |\n", way_name[w]);
      continue;
    }
    sample_t last = {0}, s;
    double ret = 0;
    long long worst = 0;
    for (int k = 0; k < reps; k++) {
      s = run_way((way_t)w, n, chunk, ctx);
      v[k] = s.ms, ret += s.return_ms / reps, last = s;
      if (s.free_delta != 0 && (worst == 0 || llabs(s.free_delta) > llabs(worst)))
        worst = s.free_delta;
    }
    qsort(v, (size_t)reps, sizeof *v, cmp_double);
    printf("| %s | %.2f | %.2f | %.3f | %.2f | %.1f | %.2f | %lld |\n", way_name[w], v[reps / 2],
           v[0], v[reps / 2] / ((double)total / GiB), ret, last.map_ms, last.early_ms, worst);
  }
  /* The reference the issue quotes: one chunk of 1 GiB, and the whole total as 1 GiB chunks. */
  printf("\n## reference: larger chunks, per chunk unmap + release\n\n| chunks | ms (median) | ms "
         "per GiB |\n"
         "|---|---|---|\n");
  size_t big[] = {GiB, 256 * MiB, 64 * MiB};
  for (size_t b = 0; b < sizeof big / sizeof big[0]; b++) {
    size_t c = (big[b] + gran - 1) / gran * gran, nb = total / c ? total / c : 1;
    for (int k = 0; k < reps; k++) v[k] = run_way(W_PER_CHUNK, nb, c, ctx).ms;
    qsort(v, (size_t)reps, sizeof *v, cmp_double);
    printf("| %zu x %zu MiB | %.2f | %.3f |\n", nb, c / MiB, v[reps / 2],
           v[reps / 2] / ((double)(nb * c) / GiB));
  }
  {
    for (int k = 0; k < reps; k++) v[k] = run_way(W_PER_CHUNK, 1, GiB, ctx).ms;
    qsort(v, (size_t)reps, sizeof *v, cmp_double);
    printf("| 1 x 1024 MiB | %.2f | %.3f |\n", v[reps / 2], v[reps / 2]);
  }
  free(v);
  printf("\ngoal: <= 1 ms per GiB at 8 MiB chunks, driver free memory back to the byte.\n");
  return 0;
}
