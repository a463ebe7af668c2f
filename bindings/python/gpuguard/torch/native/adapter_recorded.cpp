/* adapter_recorded.cpp (gpuguard.torch) — frees of blocks recorded on other streams
 * (Tensor.record_stream): the block goes back to its arena only once an event recorded on each of
 * those streams (and its own) at the free is done, so no allocation, on any stream, gets it while
 * they may still use it; it counts as active until then. PyTorch's allocator does the same. */
#include "adapter.h"

#include <algorithm>
#include <cstdio>

namespace gg_torch {

/* False when an event cannot be recorded (the caller frees in stream order at once). */
bool Adapter::defer_free(void *ptr, const Block &b) {
  Recorded r{ptr, b.arena, b.stream, b.device, b.size, b.requested, {}, {}};
  std::vector<Stream> users = b.extra->recorded;
  users.push_back(b.stream); /* its own too: once all are done, no work uses it */
  for (Stream s : users) {
    void *ev = nullptr;
    if (rt_.event_record(b.device, s, &ev) < 0) {
      for (void *e : r.events) {
        rt_.event_destroy(e);
      }
      return false;
    }
    r.events.push_back(ev);
    r.on.push_back(s);
  }
  std::lock_guard<std::mutex> g(mu_);
  recorded_.push_back(std::move(r));
  n_recorded_.store(recorded_.size(), std::memory_order_relaxed);
  return true;
}

/* Gives back the recorded blocks whose streams are done; `wait`: every one, after waiting for
 * their devices (empty_cache, an allocation out of memory). */
void Adapter::drain_recorded(bool wait) {
  if (wait) {
    bool devices[kMaxDevices] = {};
    {
      std::lock_guard<std::mutex> g(mu_);
      for (const Recorded &r : recorded_) {
        devices[r.device] = true;
      }
    }
    for (int d = 0; d < kMaxDevices; d++) {
      if (devices[d]) {
        rt_.device_sync(d);
      }
    }
  }
  std::vector<Recorded> go;
  {
    std::lock_guard<std::mutex> g(mu_);
    /* A stream runs its work in order: once one of its events is not done, none recorded on it
     * later is, so each call asks at most one pending event per stream (not one per block). */
    std::vector<Stream> busy;
    for (auto it = recorded_.begin(); it != recorded_.end();) {
      bool done = true;
      for (size_t k = 0; k < it->events.size() && done; k++) {
        Stream s = it->on[k];
        done = std::find(busy.begin(), busy.end(), s) == busy.end() &&
               rt_.event_query(it->events[k]) != 0; /* an error: the memory goes with the context */
        if (!done) {
          busy.push_back(s);
        }
      }
      if (!done) {
        ++it;
        continue;
      }
      Block b;
      b.size = it->size;
      b.requested = it->requested;
      b.device = it->device;
      deactivate_locked(b);
      go.push_back(std::move(*it));
      it = recorded_.erase(it);
    }
    n_recorded_.store(recorded_.size(), std::memory_order_relaxed);
  }
  for (Recorded &r : go) {
    for (void *e : r.events) {
      rt_.event_destroy(e);
    }
    trace('f', r.ptr, 0, r.stream);
    /* Nothing uses it any more: freed on the arena's own stream, it is reusable at once (work on
     * other streams is ordered after that stream by the arena, as for any block). */
    gg_arena_options_t o;
    void *on = gg_arena_get_options(r.arena, &o) == 0 ? o.stream : r.stream;
    if (gg_free_on(r.arena, r.ptr, on) < 0) {
      fprintf(stderr, "gpuguard: freeing %p on device %d failed: %s\n", r.ptr, r.device,
              gg_last_error());
    }
  }
}

} // namespace gg_torch
