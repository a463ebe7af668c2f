/* adapter_trace.cpp (gpuguard.torch) — GPUGUARD_PLUGIN_TRACE=PATH: every default-pool allocation
 * and free, one line each (`a PTR SIZE STREAM`, `f PTR STREAM`), the format bench/bench_replay and
 * gpuguard.diagnostics.snapshot read. Each process writes PATH.PID, so workers never share a file.
 */
#include "adapter.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace gg_torch {

namespace {

std::mutex trace_mu;
FILE *trace_file = nullptr;
std::once_flag trace_once;

/* Opened at the first call. No link is followed and nothing but a regular file is written (a FIFO
 * would block, a device would take whatever comes); a name that cannot be used is reported once
 * and tracing stays off. */
void trace_open() {
  const char *path = getenv("GPUGUARD_PLUGIN_TRACE");
  if (!path || !*path) {
    return;
  }
  std::string name = std::string(path) + "." + std::to_string(long(getpid()));
  int fd =
      open(name.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
  struct stat st {};
  if (fd >= 0 && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))) {
    close(fd);
    fprintf(stderr, "gpuguard: GPUGUARD_PLUGIN_TRACE: %s is not a regular file; not tracing\n",
            name.c_str());
    return;
  }
  trace_file = fd >= 0 ? fdopen(fd, "w") : nullptr;
  if (!trace_file) {
    if (fd >= 0) {
      close(fd);
    }
    fprintf(stderr, "gpuguard: GPUGUARD_PLUGIN_TRACE: %s cannot be opened; not tracing\n",
            name.c_str());
    return;
  }
  fprintf(trace_file, "# gpuguard plugin trace, pid %ld\n", long(getpid()));
}

} // namespace

void Adapter::trace_init() { std::call_once(trace_once, trace_open); }

/* On every default-pool call: a pointer test while tracing is off (trace_init ran in the
 * constructor, before any call could reach here). */
void Adapter::trace(char op, const void *ptr, size_t size, Stream stream) {
  if (!trace_file) {
    return;
  }
  std::lock_guard<std::mutex> g(trace_mu);
  if (op == 'a') {
    fprintf(trace_file, "a %p %zd %p\n", ptr, ssize_t(size), stream);
  } else {
    fprintf(trace_file, "f %p %p\n", ptr, stream);
  }
  fflush(trace_file); /* the process may end without exit handlers (PyTorch's global allocator) */
}

} // namespace gg_torch
