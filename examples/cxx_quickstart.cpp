// cxx_quickstart.cpp — gpuguard from C++17 (gpuguard.hpp): a guard with a lambda cleanup, an arena whose
// scopes release each step's temporaries, and gg::Error for failures. Host code only: it builds without
// nvcc and runs on a GPU (CUDA backend) or without one (GPUGUARD_BACKEND=host, or auto with no device).
//
// usage: cxx_quickstart [steps]   (default 5)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "gpuguard/gpuguard.hpp"

// One "layer": its workspace lives in a scope, so it is released on every way out of the function —
// the return below, or an exception thrown by any call in it.
static float layer(gg::Arena &arena, const std::vector<float> &input) {
  gg::Scope scope(arena);
  const std::size_t n = input.size();
  float *dev = arena.alloc_n<float>(n, "activations");
  gg::check(gg_arena_copy_to_device(arena.get(), dev, input.data(), n * sizeof(float)));
  std::vector<float> back(n);
  gg::check(gg_arena_copy_from_device(arena.get(), back.data(), dev, n * sizeof(float)));
  float sum = 0.0f;
  for (float v : back) sum += v;
  return sum;
}

int main(int argc, char **argv) {
  int steps = 5;
  if (argc == 2 && std::strcmp(argv[1], "--help") == 0) {
    std::printf("usage: cxx_quickstart [steps]   (steps > 0, default 5)\n");
    return 0;
  }
  if (argc > 2 || (argc == 2 && (steps = std::atoi(argv[1])) <= 0)) {
    std::fprintf(stderr, "usage: cxx_quickstart [steps]   (steps > 0, default 5)\n");
    return 2;
  }
  try {
    gg::Guard guard;  // cleanups run exactly once: here at the end, at exit(), or on SIGTERM/SIGINT
    guard.on_teardown([] { std::printf("cleanup: the guard ran its teardown\n"); }, "say-bye");

    gg::Arena::Options opts;
    opts.capacity = 64u << 20;
    opts.name = "quickstart";
    gg::Arena arena(opts);
    std::printf("arena '%s' on the %s backend\n", arena.name(), arena.backend());

    float *weights = arena.alloc_n<float>(1024, "weights");  // lives as long as the arena
    gg::check(gg_arena_memset(arena.get(), weights, 0, 1024 * sizeof(float)));

    std::vector<float> input(1 << 16, 0.5f);
    for (int step = 1; step <= steps; step++) {
      float s = layer(arena, input);
      gg_arena_stats_t st = arena.stats();
      std::printf("step %d: sum %.0f, live blocks %llu (the weights), in use %zu bytes\n", step, s, st.n_live,
                  st.bytes_in_use);
    }

    try {
      arena.alloc(std::size_t(1) << 40, "too-big");  // 1 TiB: more than the arena holds
    } catch (const gg::Error &e) {
      std::printf("caught gg::Error, code %d: %s\n", e.code(), e.what());
    }
    arena.free(weights);
    arena.trim();
    std::printf("after trim: %zu bytes mapped\n", arena.stats().bytes_mapped);
  } catch (const gg::Error &e) {  // e.g. GG_ENODEV with GPUGUARD_BACKEND=cuda and no driver
    std::fprintf(stderr, "cxx_quickstart: %s\n", e.what());
    return 1;
  }
  return 0;
}
