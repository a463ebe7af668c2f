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

/* Frees already waiting go back first: while every call may ask the driver about captures, the
 * allocations no longer give them back (a capture PyTorch did not announce may be under way). */
void Adapter::set_capture_any(bool on) {
  if (on && !capture_any_.load()) {
    drain_recorded(false);
  }
  capture_any_.store(on);
}

/* Whether no capture may be under way. Under mu_, which begin_capture takes too: an allocation
 * that read the flags unlocked may find a capture begun since, whose global mode an event query
 * or a device synchronisation would end (PyTorch checks under its allocator's lock as well). */
bool Adapter::quiet_locked(bool asked) const {
  return captures_.empty() && (asked || !capture_any_.load());
}

/* Gives back the recorded blocks whose streams are done; `wait`: every one, after waiting for
 * their devices (empty_cache, an allocation out of memory), holding the lock so that no capture
 * begins meanwhile. Nothing while a capture may be under way: they wait for a later call.
 * `asked`: empty_cache, which synchronises anyway, also with captures=any (none announced). */
void Adapter::drain_recorded(bool wait, bool asked) {
  std::vector<Recorded> go;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!quiet_locked(asked)) {
      return;
    }
    if (wait) {
      bool devices[kMaxDevices] = {};
      for (const Recorded &r : recorded_) {
        devices[r.device] = true;
      }
      for (int d = 0; d < kMaxDevices; d++) {
        if (devices[d]) {
          rt_.device_sync(d);
        }
      }
    }
    /* A stream runs its work in order: once one of its events is not done, none recorded on it
     * later is. So a block waiting on a stream already seen busy is skipped unasked, and each call
     * asks at most one pending event per stream, plus the done ones of the blocks it frees. */
    std::vector<Stream> busy;
    auto is_busy = [&busy](Stream s) {
      return std::find(busy.begin(), busy.end(), s) != busy.end();
    };
    for (auto it = recorded_.begin(); it != recorded_.end();) {
      bool done = std::none_of(it->on.begin(), it->on.end(), is_busy);
      for (size_t k = 0; k < it->events.size() && done; k++) {
        /* an error: the memory goes with the context */
        done = rt_.event_query(it->events[k]) != 0;
        if (!done) {
          busy.push_back(it->on[k]);
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
