/* bench_sites.c — what recording allocation sites (GG_ARENA_BACKTRACE) costs an allocation:
 * alloc+free pairs with the flag off and on, called from a shallow and a deep stack (the backtrace
 * stops after a few frames, so depth should not matter), and the cost of a leak report's naming
 * (dladdr) per frame. Any backend (the host backend without a GPU); the figures are for reading,
 * nothing is asserted. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpuguard/gpuguard.h"

#define PAIRS 20000
#define RUNS  9

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
    fprintf(stderr, "bench_sites: %s: %s\n", what, gg_last_error());
    exit(1);
  }
}

/* Median ns per alloc+free pair of `size` bytes over RUNS runs of PAIRS pairs. */
static double pairs(gg_arena_t *a, size_t size) {
  double v[RUNS];
  for (int r = 0; r < RUNS; r++) {
    double t0 = now_ns();
    for (int i = 0; i < PAIRS; i++) {
      void *p;
      check(gg_alloc(a, size, &p), "gg_alloc");
      check(gg_free(a, p), "gg_free");
    }
    v[r] = (now_ns() - t0) / PAIRS;
  }
  qsort(v, RUNS, sizeof *v, cmp_double);
  return v[RUNS / 2];
}

/* The same from `depth` frames further down the stack. */
static double __attribute__((noinline)) deep(gg_arena_t *a, size_t size, int depth) {
  if (depth > 0) {
    double r = deep(a, size, depth - 1);
    __asm__ volatile("" ::: "memory"); /* keeps the recursion a real call chain */
    return r;
  }
  return pairs(a, size);
}

typedef struct name_count {
  int blocks, frames;
} name_count_t;

static int name_frames(const gg_block_info_t *b, void *user) {
  name_count_t *nc = user;
  for (int k = 0; k < b->n_frames; k++) {
    Dl_info info;
    if (dladdr((const char *)b->frames[k] - 1, &info)) nc->frames++;
  }
  nc->blocks++;
  return 0;
}

static gg_arena_t *make(unsigned flags) {
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.capacity = 256u << 20, o.flags = flags, o.name = "sites";
  gg_arena_t *a;
  check(gg_arena_create(&a, &o), "gg_arena_create");
  return a;
}

int main(void) {
  if (!getenv("GPUGUARD_BACKEND")) setenv("GPUGUARD_BACKEND", "auto", 1);
  gg_arena_t *a[2] = {make(GG_ARENA_NO_STREAM), make(GG_ARENA_NO_STREAM | GG_ARENA_BACKTRACE)};
  printf("# bench_sites: backend %s, gpuguard %s; median of %d runs of %d alloc+free pairs\n\n",
         gg_arena_backend(a[0]), gg_version(), RUNS, PAIRS);
  printf("| size | stack depth | off (ns/pair) | GG_ARENA_BACKTRACE (ns/pair) | added (ns) "
         "|\n|---|---|---|---|---|\n");
  static const size_t sizes[] = {256, 1u << 20};
  static const int depths[] = {0, 40};
  for (size_t s = 0; s < 2; s++) {
    for (size_t d = 0; d < 2; d++) {
      double off = deep(a[0], sizes[s], depths[d]), on = deep(a[1], sizes[s], depths[d]);
      printf("| %zu | +%d | %.0f | %.0f | %.0f |\n", sizes[s], depths[d], off, on, on - off);
    }
  }
  /* What printing costs: naming every frame of 1000 live blocks' sites with dladdr, as the leak
   * report does (it names each site once; this names every block's). */
  void *live[1000];
  for (int i = 0; i < 1000; i++) check(gg_alloc(a[1], 4096, &live[i]), "gg_alloc");
  name_count_t nc = {0, 0};
  double t0 = now_ns();
  check(gg_arena_foreach_block(a[1], name_frames, &nc), "gg_arena_foreach_block");
  double t = now_ns() - t0;
  printf("\nnaming sites for a report: %d frames of %d blocks in %.2f ms, %.0f ns per frame "
         "(dladdr)\n",
         nc.frames, nc.blocks, t / 1e6, nc.frames ? t / nc.frames : 0);
  for (int i = 0; i < 1000; i++) check(gg_free(a[1], live[i]), "gg_free");
  for (int k = 0; k < 2; k++) check(gg_arena_destroy(a[k]), "gg_arena_destroy");
  return 0;
}
