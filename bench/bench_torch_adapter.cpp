/* bench_torch_adapter.cpp — what gpuguard's PyTorch backend costs the host per torch.empty + del
 * below PyTorch (its torch-free adapter over the device's arena, the same calls the backend makes),
 * on the host backend with stub runtime calls: bench_python part b's mix (256 live blocks, a random
 * one replaced by one of a log-uniform size 512 B..32 MiB, the same sizes every run) and single
 * sizes freed and allocated again. Prints ns per pair (best of 5 rounds) and the chunks mapped in
 * the measured rounds (0: nothing grows once warm). For callgrind: `bench_torch_adapter mix 20000`.
 *
 *   bench_torch_adapter [CASE [PAIRS]]   CASE: all (default), mix, or a size in bytes */

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "torch/native/adapter.h"

namespace {

using gg_torch::Adapter;
using gg_torch::Freed;
using gg_torch::PoolId;
using gg_torch::Stream;

/* The runtime calls of a process that never captures and whose streams are always done. */
int no_capture(Stream, uint64_t *id) { return *id = 0, 0; }
int no_graph(Stream, void (*)(void *), void *) { return 0; }
int done_stream(Stream) { return 0; }
int done_device(int) { return 0; }
void no_relax(bool, int *) {}
int no_event(int, Stream, void **ev) { return *ev = nullptr, 0; }
int event_done(void *) { return 1; }
void no_destroy(void *) {}

struct Case {
  const char *name;
  std::vector<size_t> sizes; /* one per pair */
  std::vector<int> slots;    /* which live block each pair replaces */
};

Case mix_case(int pairs) {
  Case c{"mix: 256 live, 512 B..32 MiB", {}, {}};
  std::mt19937_64 rng(0);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int i = 0; i < pairs; i++) {
    c.sizes.push_back(size_t(512.0 * std::pow(2.0, u(rng) * 16.0)));
    c.slots.push_back(int(rng() % 256));
  }
  return c;
}

Case fixed_case(const char *name, size_t size, int pairs) {
  return Case{name, std::vector<size_t>(size_t(pairs), size), std::vector<int>(size_t(pairs), 0)};
}

void die(const char *what) {
  fprintf(stderr, "bench_torch_adapter: %s: %s\n", what, gg_last_error());
  exit(1);
}

/* Best ns per pair over 5 rounds after one warm-up round; *maps: chunks mapped while measured. */
double run(Adapter &ad, const Case &c, long long *maps) {
  std::vector<void *> live(256, nullptr);
  PoolId id;
  for (void *&p : live) {
    if (ad.alloc(512, 0, nullptr, nullptr, &p, &id) < 0) die("alloc");
  }
  double best = 1e30;
  long long before = 0;
  for (int round = 0; round < 6; round++) {
    if (round == 1) before = ad.reserved(0).maps;
    auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < c.sizes.size(); i++) {
      void *&p = live[size_t(c.slots[i])];
      Freed f;
      if (ad.free(p, &f) < 0) die("free");
      if (ad.alloc(c.sizes[i], 0, nullptr, nullptr, &p, &id) < 0) die("alloc");
    }
    auto t1 = std::chrono::steady_clock::now();
    double ns = std::chrono::duration<double, std::nano>(t1 - t0).count() / double(c.sizes.size());
    if (round > 0 && ns < best) best = ns;
  }
  *maps = ad.reserved(0).maps - before;
  for (void *p : live) {
    Freed f;
    if (ad.free(p, &f) < 0) die("free");
  }
  return best;
}

} // namespace

int main(int argc, char **argv) {
  setenv("GPUGUARD_BACKEND", "host", 0);
  setenv("GPUGUARD_HOST_CAPACITY", "16G", 0); /* the mix keeps ~1.2 GiB live */
  setenv("GPUGUARD_HOST_POPULATE", "0", 0);   /* mapping cost is the driver's, not measured here */
  const char *which = argc > 1 ? argv[1] : "all";
  int pairs = argc > 2 ? atoi(argv[2]) : 100000;
  if (pairs <= 0) {
    fprintf(stderr, "bench_torch_adapter: PAIRS must be a positive number\n");
    return 2;
  }
  std::vector<Case> cases;
  if (!strcmp(which, "all") || !strcmp(which, "mix")) cases.push_back(mix_case(pairs));
  if (!strcmp(which, "all")) {
    cases.push_back(fixed_case("256 B", 256, pairs));
    cases.push_back(fixed_case("64 KiB", 64 << 10, pairs));
    cases.push_back(fixed_case("16 MiB", 16 << 20, pairs));
  } else if (strcmp(which, "mix") != 0) {
    char *end = nullptr;
    unsigned long long n = strtoull(which, &end, 10);
    if (!end || *end || n == 0 || n > (1ull << 34)) {
      fprintf(stderr, "bench_torch_adapter: CASE '%s' is not all, mix or a size in bytes\n", which);
      return 2;
    }
    cases.push_back(fixed_case(which, size_t(n), pairs));
  }
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.capacity = size_t(8) << 30;
  gg_torch::Runtime rt{no_capture, no_graph, done_stream, done_device,
                       no_relax,   no_event, event_done,  no_destroy};
  printf(
      "| case (host backend, %d pairs a round) | ns per free + alloc | chunks mapped once warm |\n",
      pairs);
  printf("|---|---|---|\n");
  for (const Case &c : cases) {
    Adapter ad(rt, o);
    long long maps = 0;
    double ns = run(ad, c, &maps);
    printf("| %s | %.0f | %lld |\n", c.name, ns, maps);
  }
  return 0;
}
