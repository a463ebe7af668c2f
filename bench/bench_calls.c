/* bench_calls.c — driver calls and host CPU time per operation of bench_arena's latency cases, on
 * the host backend, where every driver call is counted exactly (gg_host_op_count). On a GPU each
 * call costs a few hundred ns, so calls per op say what a stream-tracked pair can cost there; the
 * host ns say what the arena's own code costs. Same sizes, same order and same arena history as
 * bench_arena: pairs of 256 B, 64 KiB, 2 MiB, 64 MiB and a log-uniform mix 256 B..64 MiB, then 64
 * live blocks with a random one replaced (16 B..4 MiB). Then bench_arena's training-like sequence,
 * stream-tracked, at its host size and at its GPU size (nothing resident), for peak mapped / peak
 * in use and calls per operation.
 *
 *   bench_calls                (sets GPUGUARD_BACKEND=host unless told otherwise)
 *   bench_calls CASE STEPS     only case CASE (0-4 pairs, 5 the 64 live blocks, 6 those in
 *                              stream order, as PyTorch's backend calls the arena), STEPS measured:
 * for a profiler
 */
#define _POSIX_C_SOURCE 200809L
#include <gpuguard/gpuguard.h>
#include <gpuguard/host.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_host_ops.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int cmp_double(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return a < b ? -1 : a > b;
}

#define GG(call)                                                        \
  do {                                                                  \
    if ((call) < 0) {                                                   \
      fprintf(stderr, "bench_calls: %s: %s\n", #call, gg_last_error()); \
      exit(1);                                                          \
    }                                                                   \
  } while (0)

static unsigned long long op(const char *name) { return gg_host_op_count(name); }

typedef struct figures {
  double calls, queries, records, median_ns, mean_ns;
} figures_t;

static void print_row(const char *label, figures_t f) {
  printf("| %s | %.4f | %.4f | %.4f | %.0f | %.0f |\n", label, f.calls, f.queries, f.records,
         f.median_ns, f.mean_ns);
}

/* Runs `step` iters times in batches of 64, after `warm` untimed steps: calls per step and ns per
 * step (median of batch means, and the overall mean). */
static figures_t measure(void (*step)(void *), void *ctx, int warm, int iters) {
  for (int i = 0; i < warm; i++) step(ctx);
  enum { BATCH = 64 };
  int nb = iters / BATCH;
  double *b = malloc((size_t)nb * sizeof *b);
  unsigned long long c0 = bench_driver_calls(), q0 = op("stream_query") + op("event_query"),
                     r0 = op("event_record");
  double t0 = now_ns();
  for (int j = 0; j < nb; j++) {
    double t = now_ns();
    for (int n = 0; n < BATCH; n++) step(ctx);
    b[j] = (now_ns() - t) / BATCH;
  }
  double total = now_ns() - t0;
  figures_t f;
  double ops = (double)nb * BATCH;
  f.calls = (double)(bench_driver_calls() - c0) / ops;
  f.queries = (double)(op("stream_query") + op("event_query") - q0) / ops;
  f.records = (double)(op("event_record") - r0) / ops;
  qsort(b, (size_t)nb, sizeof *b, cmp_double);
  f.median_ns = b[nb / 2], f.mean_ns = total / ops;
  free(b);
  return f;
}

/* ---- pairs ----------------------------------------------------------------------------------- */

typedef struct pairs {
  gg_arena_t *a;
  const size_t *sizes;
  int n, i;
} pairs_t;

static void pair_step(void *ctx) {
  pairs_t *p = ctx;
  void *q;
  GG(gg_alloc(p->a, p->sizes[p->i++ % p->n], &q));
  GG(gg_free(p->a, q));
}

/* ---- 64 live blocks, one replaced at a time (bench_arena's sequence) ------------------------- */

typedef struct churn {
  gg_arena_t *a;
  void *live[64];
  unsigned long long s;
} churn_t;

static size_t churn_next(churn_t *c, unsigned *slot) {
  c->s = c->s * 6364136223846793005ull + 1442695040888963407ull;
  *slot = (unsigned)(c->s >> 58);
  double u = (double)((c->s >> 11) & ((1ull << 40) - 1)) / (double)(1ull << 40);
  return (size_t)(16.0 * pow(2.0, u * 18.0)); /* 16 B .. 4 MiB */
}

static void churn_step(void *ctx) {
  churn_t *c = ctx;
  unsigned slot;
  size_t n = churn_next(c, &slot);
  GG(gg_free(c->a, c->live[slot]));
  GG(gg_alloc(c->a, n, &c->live[slot]));
}

/* The same in stream order (gg_free_on + gg_alloc_on on the arena's stream): the library's part of
 * what gpuguard's PyTorch backend does for its default pool. The backend's own work (its block
 * table and PyTorch's statistics) lives outside the library and is not measured here. */
static void ordered_churn_step(void *ctx) {
  churn_t *c = ctx;
  unsigned slot;
  size_t n = churn_next(c, &slot);
  GG(gg_free_on(c->a, c->live[slot], NULL));
  GG(gg_alloc_on(c->a, n, NULL, &c->live[slot]));
}

/* ---- training-like sequence (bench_arena's) -------------------------------------------------- */

static void *t_alloc(gg_arena_t *a, size_t n) {
  void *p;
  GG(gg_alloc(a, n, &p));
  return p;
}

static void training_sequence(gg_arena_t *a, size_t hidden, size_t batch, int layers, int steps,
                              size_t *ops) {
  enum { PER_LAYER = 4 };
  void **weights = malloc((size_t)layers * 6 * sizeof *weights);
  void **acts = malloc((size_t)layers * PER_LAYER * sizeof *acts);
  for (int l = 0; l < layers; l++) {
    for (int k = 0; k < 4; k++) weights[l * 6 + k] = t_alloc(a, hidden * hidden * 2);
    for (int k = 4; k < 6; k++) weights[l * 6 + k] = t_alloc(a, hidden * hidden * 4 * 2);
  }
  *ops = (size_t)layers * 6 * 2;
  unsigned long long s = 777;
  static const size_t mult[PER_LAYER] = {1, 3, 4, 1};
  for (int step = 0; step < steps; step++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    size_t seq = 256 + ((s >> 33) % 29) * 64;
    size_t unit = batch * seq * hidden * 2;
    for (int l = 0; l < layers; l++) {
      for (int k = 0; k < PER_LAYER; k++) {
        acts[l * PER_LAYER + k] = t_alloc(a, unit * mult[k]);
        if (k == 1) {
          void *ws = t_alloc(a, batch * seq * 64 * 4 + ((s >> 20) % 16) * MiB / 8);
          GG(gg_free(a, ws));
          *ops += 2;
        }
        *ops += 1;
      }
    }
    for (int l = layers - 1; l >= 0; l--) {
      void *grad_ws = t_alloc(a, unit * 2);
      for (int k = PER_LAYER - 1; k >= 0; k--) GG(gg_free(a, acts[l * PER_LAYER + k]));
      GG(gg_free(a, grad_ws));
      *ops += 2 + PER_LAYER;
    }
  }
  for (int i = 0; i < layers * 6; i++) GG(gg_free(a, weights[i]));
  free(weights), free(acts);
}

static void bench_training(const char *label, size_t hidden, size_t batch, size_t chunk) {
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.name = "training", o.chunk_size = chunk;
  gg_arena_t *a;
  GG(gg_arena_create(&a, &o));
  unsigned long long c0 = bench_driver_calls();
  size_t ops = 0;
  double t0 = now_ns();
  training_sequence(a, hidden, batch, 8, 300, &ops);
  double t = now_ns() - t0;
  gg_arena_stats_t st;
  GG(gg_arena_stats(a, &st));
  printf("| %s | %.1f | %.1f | %.4f | %.4f | %.0f |\n", label, st.peak_in_use / (double)MiB,
         st.peak_mapped / (double)MiB, (double)st.peak_mapped / (double)st.peak_in_use,
         (double)(bench_driver_calls() - c0) / (double)ops, t / (double)ops);
  GG(gg_arena_destroy(a));
}

/* ---- a recorded trace, stream-tracked -------------------------------------------------------- */

typedef struct slot {
  unsigned long long key; /* the address in the trace; 0: empty */
  void *p;
} slot_t;

static slot_t *find(slot_t *t, size_t cap, unsigned long long k) {
  size_t i = (size_t)(k * 0x9E3779B97F4A7C15ull) & (cap - 1);
  while (t[i].key && t[i].key != k) i = (i + 1) & (cap - 1);
  return &t[i];
}

/* One chunk size: peak mapped / peak in use and driver calls per operation. Traces recorded by the
 * plugin may reuse an address only after its free, so a table keyed by address is enough (a freed
 * slot keeps its key with a NULL pointer). */
static int replay(const char *path, size_t chunk) {
  char cmd[4200];
  if (snprintf(cmd, sizeof cmd, "gzip -dcf '%s'", path) >= (int)sizeof cmd) return -1;
  FILE *f = popen(cmd, "r");
  if (!f) return -1;
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.name = "trace", o.chunk_size = chunk;
  gg_arena_t *a;
  GG(gg_arena_create(&a, &o));
  size_t cap = (size_t)1 << 22, ops = 0;
  slot_t *t = calloc(cap, sizeof *t);
  unsigned long long c0 = bench_driver_calls();
  char line[256];
  while (t && fgets(line, sizeof line, f)) {
    char op;
    unsigned long long addr, size = 0;
    if (line[0] == '#' || sscanf(line, " %c %llx %llu", &op, &addr, &size) < 2 || !addr) continue;
    slot_t *s = find(t, cap, addr);
    if (op == 'a' && size) {
      s->key = addr;
      GG(gg_alloc(a, (size_t)size, &s->p));
      ops++;
    } else if (op == 'f' && s->key && s->p) {
      GG(gg_free(a, s->p));
      s->p = NULL, ops++;
    }
  }
  pclose(f);
  gg_arena_stats_t st;
  GG(gg_arena_stats(a, &st));
  printf("| %s | %zu MiB | %.0f | %.0f | %.4f | %.4f |\n", path, chunk >> 20,
         st.peak_in_use / (double)MiB, st.peak_mapped / (double)MiB,
         (double)st.peak_mapped / (double)st.peak_in_use,
         (double)(bench_driver_calls() - c0) / (double)(ops ? ops : 1));
  free(t);
  GG(gg_arena_destroy(a));
  return 0;
}

int main(int argc, char **argv) {
  if (argc > 2 && strcmp(argv[1], "--trace") == 0) {
    setenv("GPUGUARD_BACKEND", "host", 0);
    setenv("GPUGUARD_HOST_CAPACITY", "48G", 0);
    setenv("GPUGUARD_HOST_POPULATE", "0", 0);
    printf("| trace (gg_alloc/gg_free, stream-tracked, idle stream) | chunk | peak in use MiB | "
           "peak mapped "
           "MiB | "
           "ratio | driver calls per op |\n|---|---|---|---|---|---|\n");
    for (int i = 3; i < argc; i++)
      if (replay(argv[2], (size_t)atoi(argv[i]) << 20) < 0) return 1;
    return 0;
  }
  int only = argc > 2 ? atoi(argv[1]) : -1, steps = argc > 2 ? atoi(argv[2]) : 0;
  setenv("GPUGUARD_BACKEND", "host", 0);
  setenv("GPUGUARD_HOST_CAPACITY", "24G", 0);
  setenv("GPUGUARD_HOST_POPULATE", "0", 0); /* nothing is written: no resident memory needed */
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.name = "bench";
  gg_arena_t *a;
  GG(gg_arena_create(&a, &o));
  printf("# bench_calls: gpuguard %s, backend %s, stream-tracked arena (stream NULL: idle, as "
         "bench_arena's "
         "stream on a GPU with nothing queued)\n\n",
         gg_version(), gg_arena_backend(a));
  printf("| case | driver calls per op | queries per op | events recorded per op | host ns per op "
         "(median of "
         "64-op means) | host ns per op (mean) |\n|---|---|---|---|---|---|\n");
  static const size_t fixed[] = {256, 64 * KiB, 2 * MiB, 64 * MiB};
  static const char *const labels[] = {"pair 256 B", "pair 64 KiB", "pair 2 MiB", "pair 64 MiB",
                                       "pair mix 256 B..64 MiB"};
  enum { NMIX = 4096 };
  static size_t mix[NMIX];
  unsigned long long s = 12345;
  for (int i = 0; i < NMIX; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    double u = (double)(s >> 11) / 9007199254740992.0;
    double bytes = 256.0 * pow(2.0, u * 18.0);
    mix[i] = ((size_t)bytes + 255) / 256 * 256;
  }
  for (int row = 0; row < 5; row++) {
    if (only >= 0 && only != row) continue;
    pairs_t p = {a, row < 4 ? &fixed[row] : mix, row < 4 ? 1 : NMIX, 0};
    bool big = row >= 2;
    /* bench_arena: 2000 warm pairs, single pairs timed (iters), then batches (iters again) */
    int iters = steps ? steps : big ? 10000 : 50000;
    print_row(labels[row], measure(pair_step, &p, 2000 + iters, iters));
  }
  if (only >= 0 && only != 5 && only != 6) return 0;
  unsigned slot;
  if (only < 0 || only == 5) {
    churn_t c = {a, {0}, 4242};
    for (int i = 0; i < 64; i++) GG(gg_alloc(a, churn_next(&c, &slot), &c.live[i]));
    print_row("64 live, random replace (free+alloc)",
              measure(churn_step, &c, 2000 + 50000, steps ? steps : 50000));
    for (int i = 0; i < 64; i++) GG(gg_free(a, c.live[i]));
  }
  if (only < 0 || only == 6) {
    churn_t c = {a, {0}, 4242};
    for (int i = 0; i < 64; i++) GG(gg_alloc_on(a, churn_next(&c, &slot), NULL, &c.live[i]));
    print_row("the same in stream order (gg_free_on + gg_alloc_on)",
              measure(ordered_churn_step, &c, 2000 + 50000, steps ? steps : 50000));
    for (int i = 0; i < 64; i++) GG(gg_free_on(a, c.live[i], NULL));
  }
  gg_arena_stats_t st;
  GG(gg_arena_stats(a, &st));
  printf("\nbench arena after: peak mapped %.1f MiB, peak in use %.1f MiB\n",
         st.peak_mapped / (double)MiB, st.peak_in_use / (double)MiB);
  GG(gg_arena_destroy(a));
  if (only >= 0) return 0;
  printf("\n## training-like sequence, stream-tracked (bench_arena's)\n\n| run | peak in use MiB | "
         "peak "
         "mapped MiB | "
         "ratio | driver calls per op | host ns per op |\n|---|---|---|---|---|---|\n");
  bench_training("host size (hidden 512, batch 4, 4 MiB chunk)", 512, 4, 4 * MiB);
  bench_training("GPU size (hidden 4096, batch 8, default chunk)", 4096, 8, 0);
  return 0;
}
