// exit_child_cxx.cpp — the C++ exit paths for test_exit_paths: an exception unwinding through RAII
// owners (the guard's teardown runs once, as the gg::Guard is destroyed), and an uncaught one
// (std::terminate, SIGABRT: crash path only). GG_CHILD_NO_GUARD=1 runs the same without gpuguard.
// Usage: exit_child_cxx MODE.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>

#include "gpuguard/gpuguard.hpp"

static void note(const std::string &line) {
  const char *path = std::getenv("GG_CHILD_COUNTER");
  if (!path) return;
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;
  std::string l = line + "\n";
  ssize_t w = write(fd, l.data(), l.size());
  (void)w;
  close(fd);
}

static void ready() {
  const char *fd = std::getenv("GG_CHILD_READY_FD");
  if (!fd) return;
  char b = 'R';
  ssize_t w = write(std::atoi(fd), &b, 1);
  (void)w;
  close(std::atoi(fd));
}

// Frames with their own RAII state between the guard and the throw: a scope of the guarded arena
// each.
static gg::Arena *arena;

struct Frame {
  int depth;
  std::optional<gg::Scope> scope;
  explicit Frame(int d) : depth(d) {
    if (arena) {
      scope.emplace(*arena);
      arena->alloc(4096, "frame");
    }
  }
  ~Frame() {
    note("frame " + std::to_string(depth) + " unwound");
    if (arena && !scope) note("frame without scope");
  }
};

[[noreturn]] static void nested(int depth) {
  Frame f(depth);
  if (depth == 0) throw std::runtime_error("boom");
  nested(depth - 1);
}

// After the unwinding, every frame's scope has ended: nothing allocated in them is live.
static void check_arena_empty() {
  if (arena)
    note(arena->stats().n_live == 0 && arena->stats().scope_depth == 0 ? "arena empty"
                                                                       : "arena NOT empty");
}

static std::optional<gg::Guard> make_guard() {
  std::optional<gg::Guard> g;
  if (std::getenv("GG_CHILD_NO_GUARD")) return g;
  gg::Guard::Options o;
  o.name = "child";
  g.emplace(o);
  g->on_teardown([] { note("cleanup A"); }, "a");
  g->on_teardown([] { note("cleanup B"); }, "b");
  unsigned long long never = g->on_teardown([] { note("cleanup CANCELLED"); }, "c");
  g->cancel(never);
  return g;
}

int main(int argc, char **argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "throw") {
    try {
      auto g = make_guard();
      std::optional<gg::Arena> a;
      if (g) {
        gg::Arena::Options ao;
        ao.capacity = 64u << 20;
        a.emplace(ao);
        arena = &*a;
      }
      ready();
      try {
        nested(3);
      } catch (...) {
        check_arena_empty();
        arena = nullptr;
        throw;
      }
    } catch (const std::exception &e) {
      note(std::string("caught: ") + e.what());
      return 4;
    }
  }
  if (mode == "uncaught") {
    auto g = make_guard();
    ready();
    nested(3);
  }
  std::fprintf(stderr, "exit_child_cxx: unknown mode '%s'\n", mode.c_str());
  return 2;
}
