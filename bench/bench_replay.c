/* bench_replay.c — plays a recorded allocation trace (bench/torch_trace.py writes one from a real
 * PyTorch training run) through a gpuguard arena the way gpuguard's PyTorch backend calls it for
 * its default pool (gg_alloc_on / gg_free_on on the arena's stream, GG_ARENA_KEEP_HOLES), once per
 * chunk size, and prints a table: peak mapped / peak in use, what trim leaves mapped, waits, and
 * the time per call.
 *
 *   bench_replay [--catch-up N|step] [--no-steady-waits] [--max-ratio R] [--max-moves N]
 *                TRACE[.gz] [CHUNK ...]
 *                CHUNK: sizes such as 2M 64M (default: 2M 8M 64M)
 *
 * On the host backend set GPUGUARD_HOST_CAPACITY above the trace's peak, GPUGUARD_HOST_POPULATE=0
 * (no resident memory is needed: nothing is written) and GPUGUARD_HOST_BUSY=1 (streams always have
 * work queued, as a training stream does); on a GPU it maps real memory. With GPUGUARD_HOST_BUSY=1
 * alone the simulated GPU never catches up unless the arena waits for it (the worst case for an
 * allocator that never waits); --catch-up makes it finish all work queued so far every N events, or
 * at every
 * `# step` line of the trace (a training loop that reads its loss each step), through a wait on a
 * second arena of the same device, not counted in the replayed arena's waits. --no-steady-waits
 * fails the run (exit 1) when the arena waited for its stream in the second half of the events;
 * --max-ratio fails it when peak mapped / peak in use exceeds R (a memory figure, deterministic for
 * a trace: never a time); --max-moves fails it when more than N chunks moved in the second half
 * (each move is driver calls on the allocating thread). */
#define _POSIX_C_SOURCE 200809L
#include <gpuguard/gpuguard.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_host_ops.h"

typedef struct {
  char op;   /* 'a', 'f', or 's' (a `# step` line) */
  size_t id; /* block number */
  size_t size;
} ev_t;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Address -> block number of the live blocks while loading (open addressing, linear probing). */
typedef struct {
  unsigned long long *key; /* 0: empty */
  size_t *val, cap;
} addrmap_t;

static size_t *am_slot(addrmap_t *m, unsigned long long k, bool *found) {
  size_t i = (size_t)(k * 0x9E3779B97F4A7C15ull) & (m->cap - 1);
  while (m->key[i] && m->key[i] != k) i = (i + 1) & (m->cap - 1);
  *found = m->key[i] == k;
  m->key[i] = k;
  return &m->val[i];
}

static void am_del(addrmap_t *m,
                   unsigned long long k) { /* backward-shift deletion keeps probes valid */
  size_t i = (size_t)(k * 0x9E3779B97F4A7C15ull) & (m->cap - 1);
  while (m->key[i] != k) i = (i + 1) & (m->cap - 1);
  for (size_t j = i;;) {
    j = (j + 1) & (m->cap - 1);
    if (!m->key[j]) break;
    size_t h = (size_t)(m->key[j] * 0x9E3779B97F4A7C15ull) & (m->cap - 1);
    if (((j - h) & (m->cap - 1)) >= ((j - i) & (m->cap - 1))) {
      m->key[i] = m->key[j], m->val[i] = m->val[j];
      i = j;
    }
  }
  m->key[i] = 0;
}

/* Reads the trace (through gzip -dc for a .gz name): lines `a ADDR SIZE [STREAM]` and `f ADDR
 * [STREAM]`, ADDR in any base strtoull reads (0x... from the plugin), and `# step` lines between
 * training steps. Numbers the blocks densely; counts events on a stream other than the default one,
 * and the steps. Returns the events, or NULL. */
static ev_t *load(const char *path, size_t *n_out, size_t *ids_out, size_t *other_stream,
                  size_t *steps) {
  size_t len = strlen(path);
  bool gz = len > 3 && strcmp(path + len - 3, ".gz") == 0;
  FILE *f;
  if (gz) {
    char cmd[4200];
    if (snprintf(cmd, sizeof cmd, "gzip -dc '%s'", path) >= (int)sizeof cmd) return NULL;
    f = popen(cmd, "r");
  } else {
    f = fopen(path, "r");
  }
  if (!f) return NULL;
  size_t n = 0, cap = 1 << 16, ids = 0, live = 0;
  addrmap_t m = {.cap = 1 << 22};
  m.key = calloc(m.cap, sizeof *m.key), m.val = calloc(m.cap, sizeof *m.val);
  ev_t *ev = m.key && m.val ? malloc(cap * sizeof *ev) : NULL;
  char line[256], op = 0, sa[64], sb[64], sc[64];
  *other_stream = 0, *steps = 0;
  while (ev && fgets(line, sizeof line, f)) {
    bool step = strncmp(line, "# step", 6) == 0;
    if (!step && (line[0] == '#' || line[0] == '\n')) continue;
    op = 's';
    int k = step ? 0 : sscanf(line, " %c %63s %63s %63s", &op, sa, sb, sc);
    unsigned long long addr = k >= 2 ? strtoull(sa, NULL, 0) : 0;
    bool found;
    ev_t e = {.op = op};
    const char *stream = NULL;
    if (op == 'a' && ++live > m.cap / 2) {
      fprintf(stderr, "bench_replay: %s: more than %zu blocks live at once\n", path, m.cap / 2);
      free(ev), ev = NULL;
      break;
    }
    if (op == 's') {
      ++*steps;
    } else if (op == 'a' && k >= 3 && addr) {
      e.size = (size_t)strtoull(sb, NULL, 0), e.id = ids++;
      *am_slot(&m, addr, &found) = e.id;
      stream = k == 4 ? sc : NULL;
    } else if (op == 'f' && k >= 2 && addr) {
      size_t *v = am_slot(&m, addr, &found);
      if (!found) { /* a block allocated before the trace began */
        am_del(&m, addr);
        continue;
      }
      e.id = *v;
      am_del(&m, addr);
      live--;
      stream = k == 3 ? sb : NULL;
    } else {
      fprintf(stderr, "bench_replay: %s: bad line: %s", path, line);
      free(ev), ev = NULL;
      break;
    }
    if (stream && strtoull(stream, NULL, 0) != 0) ++*other_stream;
    if (n == cap) {
      ev_t *g = realloc(ev, (cap *= 2) * sizeof *ev);
      if (!g) free(ev);
      if (!(ev = g)) break;
    }
    ev[n++] = e;
  }
  free(m.key), free(m.val);
  if (gz)
    pclose(f);
  else
    fclose(f);
  *n_out = n, *ids_out = ids;
  return ev;
}

static int parse_size(const char *s, size_t *out) {
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  int shift = *end == 'K' ? 10 : *end == 'M' ? 20 : *end == 'G' ? 30 : 0;
  if (end == s || (shift && end[1]) || (!shift && *end) || v == 0) return -1;
  *out = (size_t)v << shift;
  return 0;
}

/* Driver calls so far (bench_host_ops.h), and of them the capture queries in *captures. */
static unsigned long long driver_calls(unsigned long long *captures) {
  *captures = gg_host_op_count("stream_capture");
  return bench_driver_calls();
}

/* Makes the simulated GPU finish everything queued so far: a wait on the clock arena's stream (the
 * host backend's busy streams then complete all work recorded on the device). What it costs in
 * driver calls is added to *calls and *captures, for the replay to leave out (it runs on another
 * arena). */
static int catch_up(gg_arena_t *clock, unsigned long long *calls, unsigned long long *captures) {
  unsigned long long c0, c1, k0, k1;
  c0 = driver_calls(&k0);
  void *p;
  int rc = gg_alloc(clock, 256, &p);
  if (rc == 0) rc = gg_free(clock, p);
  if (rc == 0) rc = gg_arena_trim(clock, 0);
  c1 = driver_calls(&k1);
  *calls += c1 - c0;
  *captures += k1 - k0;
  return rc;
}

int main(int argc, char **argv) {
  int argi = 1;
  long every = 0;         /* --catch-up: events between catch-ups; -1: at `# step` lines */
  bool no_steady = false; /* --no-steady-waits: fail when the second half waited for the stream */
  double max_ratio = 0;   /* --max-ratio: fail above this peak mapped / peak in use (0: never) */
  long max_moves = -1;    /* --max-moves: fail above this many moves in the second half */
  double max_calls = -1;  /* --max-driver-calls: fail above this many per call (host backend) */
  for (;;) {
    if (argc > argi + 1 && strcmp(argv[argi], "--catch-up") == 0) {
      char *end = NULL;
      every = strcmp(argv[argi + 1], "step") == 0 ? -1 : strtol(argv[argi + 1], &end, 10);
      if (every == 0 || (every > 0 && *end)) {
        fprintf(stderr, "bench_replay: --catch-up takes a number of events or 'step', not '%s'\n",
                argv[argi + 1]);
        return 2;
      }
      argi += 2;
    } else if (argc > argi + 1 && strcmp(argv[argi], "--max-ratio") == 0) {
      char *end = NULL;
      max_ratio = strtod(argv[argi + 1], &end);
      if (!(max_ratio >= 1.0) || *end) {
        fprintf(stderr, "bench_replay: --max-ratio takes a number >= 1, not '%s'\n",
                argv[argi + 1]);
        return 2;
      }
      argi += 2;
    } else if (argc > argi + 1 && strcmp(argv[argi], "--max-moves") == 0) {
      char *end = NULL;
      max_moves = strtol(argv[argi + 1], &end, 10);
      if (max_moves < 0 || end == argv[argi + 1] || *end) {
        fprintf(stderr, "bench_replay: --max-moves takes a count >= 0, not '%s'\n", argv[argi + 1]);
        return 2;
      }
      argi += 2;
    } else if (argc > argi + 1 && strcmp(argv[argi], "--max-driver-calls") == 0) {
      char *end = NULL;
      max_calls = strtod(argv[argi + 1], &end);
      if (!(max_calls >= 0) || end == argv[argi + 1] || *end) {
        fprintf(stderr, "bench_replay: --max-driver-calls takes a number >= 0, not '%s'\n",
                argv[argi + 1]);
        return 2;
      }
      argi += 2;
    } else if (argc > argi && strcmp(argv[argi], "--no-steady-waits") == 0) {
      no_steady = true;
      argi++;
    } else {
      break;
    }
  }
  if (argc <= argi) {
    fprintf(stderr, "usage: bench_replay [--catch-up N|step] [--no-steady-waits] [--max-ratio R] "
                    "[--max-moves N] [--max-driver-calls R] TRACE[.gz] [CHUNK ...]   (CHUNK like "
                    "2M, 64M)\n");
    return 2;
  }
  const char *path = argv[argi++];
  size_t n, ids, other, steps;
  ev_t *ev = load(path, &n, &ids, &other, &steps);
  if (!ev) {
    fprintf(stderr, "bench_replay: cannot read %s\n", path);
    return 1;
  }
  if (every < 0 && !steps) {
    fprintf(stderr, "bench_replay: --catch-up step: %s has no `# step` lines\n", path);
    return 2;
  }
  void **ptr = calloc(ids ? ids : 1, sizeof *ptr);
  size_t *sz = calloc(ids ? ids : 1, sizeof *sz);
  const char *defaults[] = {"2M", "8M", "64M"};
  int nchunks = argc > argi ? argc - argi : 3;
  int rc = 0;
  printf("# bench_replay: %s, %zu events in %zu steps (%zu on a stream other than the default one, "
         "replayed on "
         "it), GPU catches up %s, gpuguard %s\n",
         path, n, steps, other,
         every < 0   ? "at every step"
         : every > 0 ? "every N events"
                     : "only when waited for",
         GG_VERSION_STRING);
  if (every > 0) printf("# N = %ld\n", every);
  printf(
      "\n| chunk | backend | peak in use MiB | peak mapped MiB | ratio | mapped after trim MiB "
      "(in use) | trims | "
      "GiB trimmed | stream waits | waits in the 2nd half | chunk maps + unmaps in the 2nd half | "
      "chunk moves in the 2nd half | ns per call | driver calls per call (capture queries) |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  gg_arena_t *clock = NULL;
  if (every && (rc = gg_arena_create(&clock, &(gg_arena_options_t){.name = "replay-clock"})) < 0)
    fprintf(stderr, "bench_replay: %s: %s\n", gg_strerror(rc), gg_last_error());
  for (int c = 0; c < nchunks && rc == 0; c++) {
    const char *arg = argc > argi ? argv[argi + c] : defaults[c];
    gg_arena_options_t o;
    gg_arena_options_init(&o);
    if (parse_size(arg, &o.chunk_size) < 0) {
      fprintf(stderr, "bench_replay: bad chunk size '%s' (a size such as 2M)\n", arg);
      rc = 2;
      break;
    }
    o.name = "replay";
    o.flags = GG_ARENA_KEEP_HOLES; /* as PyTorch's backend makes its arenas */
    gg_arena_t *a;
    unsigned long long failed_frees = 0;
    if ((rc = gg_arena_create(&a, &o)) < 0) {
      fprintf(stderr, "bench_replay: %s: %s\n", gg_strerror(rc), gg_last_error());
      break;
    }
    memset(ptr, 0, ids * sizeof *ptr);
    gg_arena_stats_t s, half = {0};
    unsigned long long k0, skip = 0, skip_k = 0, c0 = driver_calls(&k0);
    double t0 = now_s();
    for (size_t i = 0; i < n && rc == 0; i++) {
      if (i == n / 2) gg_arena_stats(a, &half);
      if (clock && ((every > 0 && i % (size_t)every == 0) || (every < 0 && ev[i].op == 's')) &&
          (rc = catch_up(clock, &skip, &skip_k)) < 0)
        fprintf(stderr, "bench_replay: catching up: %s\n", gg_last_error());
      if (ev[i].op == 'a') {
        ptr[ev[i].id] = NULL;
        sz[ev[i].id] = ev[i].size;
        if (gg_alloc_on(a, ev[i].size, NULL, &ptr[ev[i].id]) < 0) {
          fprintf(stderr, "bench_replay: event %zu: allocation of %zu bytes failed\n", i,
                  ev[i].size);
          rc = -1;
        }
      } else if (ev[i].op == 'f' && ptr[ev[i].id]) {
        failed_frees += gg_free_on(a, ptr[ev[i].id], NULL) < 0;
        ptr[ev[i].id] = NULL;
      }
    }
    double dt = now_s() - t0;
    unsigned long long k1, c1 = driver_calls(&k1);
    char calls[64] = "- (not the host backend)";
    bool host = strcmp(gg_arena_backend(a), "host") == 0;
    double per_call = (double)(c1 - c0 - skip) / (double)n;
    if (host)
      snprintf(calls, sizeof calls, "%.3f (%.3f)", per_call,
               (double)(k1 - k0 - skip_k) / (double)n);
    if (max_calls >= 0 && !host) {
      fprintf(stderr,
              "bench_replay: --max-driver-calls counts on the host backend only (this is %s)\n",
              gg_arena_backend(a));
      rc = -1;
    } else if (max_calls >= 0 && per_call > max_calls) {
      fprintf(stderr, "bench_replay: chunk %s: %.3f driver calls per call, above %.3f\n", arg,
              per_call, max_calls);
      rc = -1;
    }
    gg_arena_stats(a, &s);
    unsigned long long steady = s.n_stream_waits - half.n_stream_waits;
    /* Driver calls of the steady state: a growth that gives chunks back and maps new ones each
     * step costs host time even when it never waits. */
    unsigned long long churn = s.n_maps + s.n_unmaps - half.n_maps - half.n_unmaps;
    unsigned long long moves = s.n_moves - half.n_moves;
    if (no_steady && steady) {
      fprintf(stderr,
              "bench_replay: %llu host waits for the stream in the second half of the trace\n",
              steady);
      rc = -1;
    }
    double ratio = (double)s.peak_mapped / (double)s.peak_in_use;
    if (max_ratio > 0 && ratio > max_ratio) {
      fprintf(stderr, "bench_replay: chunk %s: peak mapped / peak in use %.4f is above %.4f\n", arg,
              ratio, max_ratio);
      rc = -1;
    }
    if (max_moves >= 0 && moves > (unsigned long long)max_moves) {
      fprintf(stderr, "bench_replay: chunk %s: %llu chunk moves in the second half, above %ld\n",
              arg, moves, max_moves);
      rc = -1;
    }
    gg_arena_trim(a, 0);
    gg_arena_stats(a, &s);
    printf(
        "| %s | %s | %.0f | %.0f | %.4f | %.1f (%.1f) | %llu | %.1f | %llu | %llu | %llu | %llu | "
        "%.0f | %s |\n",
        arg, gg_arena_backend(a), s.peak_in_use / 1048576.0, s.peak_mapped / 1048576.0,
        (double)s.peak_mapped / (double)s.peak_in_use, s.bytes_mapped / 1048576.0,
        s.bytes_in_use / 1048576.0, s.n_trims, s.bytes_trimmed / 1073741824.0, s.n_stream_waits,
        steady, churn, moves, dt * 1e9 / (double)n, calls);
    for (size_t i = 0; i < ids; i++)
      if (ptr[i]) failed_frees += gg_free_on(a, ptr[i], NULL) < 0;
    gg_arena_stats(a, &s);
    if (s.bytes_in_use || s.n_live || failed_frees) {
      fprintf(stderr,
              "bench_replay: after the replay %zu bytes in %llu blocks are still live; %llu frees "
              "failed\n",
              s.bytes_in_use, s.n_live, failed_frees);
      rc = -1;
    }
    gg_arena_destroy(a);
  }
  gg_arena_destroy(clock);
  printf("\n(ratio: peak mapped / peak in use, the arena's own figures; trims: trims that returned "
         "memory, the "
         "final one included, and the bytes they returned; stream waits: host-side waits the arena "
         "made for its "
         "stream, the final trim's included; waits in the 2nd half: those made in the second half "
         "of the events, "
         "before the final trim: the steady state; driver calls: the host backend's map, unmap, "
         "event, stream and capture queries each allocation or free made, which on a GPU are "
         "driver calls)\n");
  free(ptr), free(sz), free(ev);
  return rc < 0 ? 1 : rc;
}
