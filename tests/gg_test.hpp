/* gg_test.hpp — gg_test.h for the C++ suites: cmocka and gg_test.h have no C++ linkage markers,
 * and gpuguard/arena.h makes g++'s -Wshadow speak (gg_arena_stats is a function and a struct tag:
 * fine in C, "hides the constructor" to g++). */
#ifndef GG_TEST_HPP
#define GG_TEST_HPP

#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wshadow"
#endif
extern "C" {
#include "gg_test.h"
}
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

/* The options of an arena on the host backend: `capacity` bytes mapped in chunks of `chunk`. */
static inline gg_arena_options_t gg_test_host_options(size_t capacity, size_t chunk) {
  gg_arena_options_t o;
  gg_arena_options_init(&o);
  o.backend = "host";
  o.capacity = capacity;
  o.chunk_size = chunk;
  return o;
}

#endif
