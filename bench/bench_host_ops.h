/* bench_host_ops.h — the host backend's operations that stand for driver calls on CUDA (mapping,
 * events, stream and capture queries), counted by gg_host_op_count(): what the benchmarks report as
 * driver calls per operation, on a machine without a GPU. */
#ifndef GG_BENCH_HOST_OPS_H
#define GG_BENCH_HOST_OPS_H

#include <gpuguard/host.h>

#include <stddef.h>

/* Every host operation that is a driver call on CUDA, counted since the process started. */
static inline unsigned long long bench_driver_calls(void) {
  static const char *const ops[] = {
      "map",           "unmap",        "unmap_range",  "remap",          "reserve",
      "release",       "event_create", "event_record", "event_query",    "event_sync",
      "event_destroy", "stream_sync",  "stream_query", "stream_capture", "ctx_sync"};
  unsigned long long n = 0;
  for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) n += gg_host_op_count(ops[i]);
  return n;
}

#endif
