/* bench_scope.c — what a scope end costs per block it releases, the blocks taken from the free list
 * (the case bench_arena's scope-end table measures: holes of the right size left by freeing every
 * other block, so the scope's blocks come from best fit, not from the bump block), and alloc+free
 * pairs beside it so a change to the scope's bookkeeping shows what it costs the pair paths. Any
 * backend: the host backend without a GPU (GPUGUARD_BACKEND=host), CUDA when there is one. The
 * figures are for reading, nothing is asserted. Usage: bench_scope [max blocks (default 65536)] */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, setenv */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpuguard/gpuguard.h"

#define RUNS  7     /* scope ends timed per count (a fresh layout each) */
#define PAIRS 20000 /* pairs per timed run */

static double timer_ns; /* cost of one timed interval with nothing in it */

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int cmp_double(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return a < b ? -1 : a > b;
}

static void check(int rc, const char *what) {
  if (rc < 0) {
    fprintf(stderr, "bench_scope: %s: %s\n", what, gg_last_error());
    exit(1);
  }
}

/* One scope end over n blocks of 4096 bytes taken from holes: ns for the gg_scope_end call. */
static double scope_from_free_list(gg_arena_t *a, int n) {
  void **keep = malloc(2 * (size_t)n * sizeof *keep);
  if (!keep) exit(1);
  for (int i = 0; i < 2 * n; i++) check(gg_alloc(a, 4096, &keep[i]), "gg_alloc");
  for (int i = 0; i < 2 * n; i += 2) check(gg_free(a, keep[i]), "gg_free");
  check(gg_arena_trim(a, SIZE_MAX), "gg_arena_trim"); /* settles the frees into the free list */
  gg_scope_t sc;
  check(gg_scope_begin(a, &sc), "gg_scope_begin");
  for (int i = 0; i < n; i++) {
    void *p;
    check(gg_alloc(a, 4096, &p), "gg_alloc");
  }
  double t0 = now_ns();
  check(gg_scope_end(&sc), "gg_scope_end");
  double t = now_ns() - t0 - timer_ns;
  for (int i = 1; i < 2 * n; i += 2) check(gg_free(a, keep[i]), "gg_free");
  check(gg_arena_trim(a, 0), "gg_arena_trim"); /* the next run starts from an empty arena */
  free(keep);
  return t;
}

/* Median ns per alloc+free pair of `size` bytes; inside a scope the threads' caches are bypassed,
 * so every pair takes the arena's own path and its scope bookkeeping. */
static double pairs(gg_arena_t *a, size_t size, bool scoped) {
  double v[RUNS];
  gg_scope_t sc;
  if (scoped) check(gg_scope_begin(a, &sc), "gg_scope_begin");
  for (int r = 0; r < RUNS; r++) {
    double t0 = now_ns();
    for (int i = 0; i < PAIRS; i++) {
      void *p;
      check(gg_alloc(a, size, &p), "gg_alloc");
      check(gg_free(a, p), "gg_free");
    }
    v[r] = (now_ns() - t0 - timer_ns) / PAIRS;
  }
  if (scoped) check(gg_scope_end(&sc), "gg_scope_end");
  qsort(v, RUNS, sizeof *v, cmp_double);
  return v[RUNS / 2];
}

static gg_arena_t *make(unsigned flags, const char *name) {
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.flags = flags, o.name = name;
  gg_arena_t *a;
  check(gg_arena_create(&a, &o), "gg_arena_create");
  return a;
}

int main(int argc, char **argv) {
  if (!getenv("GPUGUARD_BACKEND")) setenv("GPUGUARD_BACKEND", "auto", 1);
  int max = argc > 1 ? atoi(argv[1]) : 65536;
  double v[20001];
  for (int i = 0; i < 20001; i++) {
    double t0 = now_ns();
    v[i] = now_ns() - t0;
  }
  qsort(v, 20001, sizeof *v, cmp_double);
  timer_ns = v[10000];
  static const char *const kinds[2] = {"no-stream", "stream-tracked"};
  gg_arena_t *a[2] = {make(GG_ARENA_NO_STREAM, "scope-nostream"), make(0, "scope-tracked")};
  printf("# bench_scope: backend %s, gpuguard %s; timer overhead %.0f ns, subtracted\n\n",
         gg_arena_backend(a[0]), gg_version(), timer_ns);

  printf("## scope end, blocks from the free list (4096 B each; median and best of %d)\n\n", RUNS);
  printf("| blocks | kind | median ns per block | best ns per block | median total us "
         "|\n|---|---|---|---|---|\n");
  static const int counts[] = {16, 256, 4096, 65536};
  for (int k = 0; k < 2; k++) {
    for (int c = 0; c < 4 && counts[c] <= max; c++) {
      double t[RUNS];
      for (int r = 0; r < RUNS; r++) t[r] = scope_from_free_list(a[k], counts[c]);
      qsort(t, RUNS, sizeof *t, cmp_double);
      printf("| %d | %s | %.2f | %.2f | %.1f |\n", counts[c], kinds[k], t[RUNS / 2] / counts[c],
             t[0] / counts[c], t[RUNS / 2] / 1e3);
    }
  }

  printf("\n## alloc+free pairs (median of %d runs of %d)\n\n", RUNS, PAIRS);
  printf("| size | kind | outside scopes ns | inside a scope ns |\n|---|---|---|---|\n");
  static const size_t sizes[] = {256, 64u << 10, 2u << 20};
  for (int k = 0; k < 2; k++)
    for (int s = 0; s < 3; s++)
      printf("| %zu | %s | %.1f | %.1f |\n", sizes[s], kinds[k], pairs(a[k], sizes[s], false),
             pairs(a[k], sizes[s], true));
  for (int k = 0; k < 2; k++) check(gg_arena_destroy(a[k]), "gg_arena_destroy");
  return 0;
}
