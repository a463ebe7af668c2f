/* history.cpp (gpuguard.torch) — memory history, trace trackers and out-of-memory observers for
 * gpuguard's PyTorch backend (torch.cuda.memory._record_memory_history and snapshots). */
#include <algorithm>

#include "facade.h"

namespace gg_torch {

std::shared_ptr<c10::GatheredContext> History::gather(cda::RecordContext at_least) {
  if (!on_.load(std::memory_order_relaxed)) {
    return nullptr;
  }
  cda::CreateContextFn fn = nullptr;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (int(when_) < int(at_least)) {
      return nullptr;
    }
    fn = recorder_;
  }
  return fn ? fn() : nullptr; /* outside the lock: the recorder may take the GIL */
}

void History::record(cda::TraceEntry::Action action, int device, void *addr, size_t size,
                     void *stream, PoolId pool, std::shared_ptr<c10::GatheredContext> ctx) {
  std::lock_guard<std::mutex> g(mu_);
#if GG_TORCH_AT_LEAST(2, 11)
  void *st = stream;
#else
  auto st = static_cast<cudaStream_t>(stream); /* typed before 2.11 */
#endif
  cda::TraceEntry te(action, c10::DeviceIndex(device), reinterpret_cast<size_t>(addr), size, st,
                     mempool_id(pool), c10::getApproximateTime(),
                     when_ >= cda::RecordContext::ALLOC ? std::move(ctx) : nullptr);
  for (auto &t : trackers_) {
    t(te);
  }
  if (!on_.load(std::memory_order_relaxed)) {
    return;
  }
  trace_.push_back(std::move(te));
  if (trace_.size() > max_entries_) {
    trace_.pop_front();
  }
}

/* With context "all" a free keeps its stack. */
void History::record_free(int device, void *addr, size_t size, void *stream, PoolId pool,
                          std::shared_ptr<c10::GatheredContext> ctx) {
  if (!skip_free_requested_) {
    record(cda::TraceEntry::FREE_REQUESTED, device, addr, size, stream, pool, ctx);
  }
  record(cda::TraceEntry::FREE_COMPLETED, device, addr, size, stream, pool, std::move(ctx));
}

void History::configure(bool enabled, cda::CreateContextFn recorder, size_t max_entries,
                        cda::RecordContext when, bool clear,
                        const std::vector<std::string> &skip) {
  std::lock_guard<std::mutex> g(mu_);
  recorder_ = enabled ? recorder : nullptr;
  when_ = enabled ? when : cda::RecordContext::NEVER;
  max_entries_ = std::max<size_t>(max_entries, 1);
  skip_free_requested_ = std::find(skip.begin(), skip.end(), "free_requested") != skip.end();
  on_.store(enabled);
  if (clear || !enabled) {
    trace_.clear();
  }
  while (trace_.size() > max_entries_) {
    trace_.pop_front();
  }
}

void History::add_observer(cca::OutOfMemoryObserver o) {
  std::lock_guard<std::mutex> g(mu_);
  observers_.push_back(std::move(o));
}

void History::add_tracker(cda::AllocatorTraceTracker t) {
  std::lock_guard<std::mutex> g(mu_);
  trackers_.push_back(std::move(t));
  trackers_on_.store(true);
}

std::vector<cca::OutOfMemoryObserver> History::observers() {
  std::lock_guard<std::mutex> g(mu_);
  return observers_;
}

std::vector<std::vector<cda::TraceEntry>> History::traces(int device_count) {
  std::lock_guard<std::mutex> g(mu_);
  int n = device_count;
  for (const auto &te : trace_) {
    n = std::max(n, int(te.device_) + 1);
  }
  std::vector<std::vector<cda::TraceEntry>> out(size_t(std::max(n, 1)));
  auto to_ns = clock_.makeConverter();
  for (const auto &te : trace_) {
    cda::TraceEntry copy = te;
    copy.time_.t_ = to_ns(te.time_.approx_t_) / 1000;
    out[size_t(te.device_)].push_back(std::move(copy));
  }
  return out;
}

} // namespace gg_torch
