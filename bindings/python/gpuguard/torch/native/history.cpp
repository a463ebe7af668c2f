/* history.cpp (gpuguard.torch) — memory history, trace trackers and out-of-memory observers for
 * gpuguard's PyTorch backend (torch.cuda.memory._record_memory_history and snapshots). */
#include <algorithm>

#include "check.h"
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

/* What a trace entry made outside torch.compile's regions says (PyTorch's word; tools skip it). */
static const char kNoCompileContext[] = "N/A";

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
                     when_ >= cda::RecordContext::ALLOC ? std::move(ctx) : nullptr,
                     compile_.empty() ? std::string(kNoCompileContext) : compile_.back()
#if GG_TORCH_AT_LEAST(2, 10)
                         ,
                     metadata_ /* user metadata on every entry since 2.10 */
#endif
  );
  for (auto &t : trackers_) {
    t(te);
  }
  if (!on_.load(std::memory_order_relaxed) || skip_[te.action_]) {
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
  record(cda::TraceEntry::FREE_REQUESTED, device, addr, size, stream, pool, ctx);
  record(cda::TraceEntry::FREE_COMPLETED, device, addr, size, stream, pool, std::move(ctx));
}

void History::set_metadata(const std::string &m) {
  std::lock_guard<std::mutex> g(mu_);
  metadata_ = m;
}

std::string History::metadata() {
  std::lock_guard<std::mutex> g(mu_);
  return metadata_;
}

void History::push_compile_context(const std::string &c) {
  std::lock_guard<std::mutex> g(mu_);
  compile_.push_back(c);
}

void History::pop_compile_context() {
  std::lock_guard<std::mutex> g(mu_);
  if (!compile_.empty()) {
    compile_.pop_back();
  }
}

void History::configure(bool enabled, cda::CreateContextFn recorder, size_t max_entries,
                        cda::RecordContext when, bool clear, const std::vector<std::string> &skip) {
  /* PyTorch's names (TraceEntry's actions); an unknown one is refused as PyTorch refuses it. */
  static const char *const names[] = {"alloc",         "free_requested", "free_completed",
                                      "segment_alloc", "segment_free",   "segment_map",
                                      "segment_unmap", "snapshot",       "oom"};
  bool skip_now[cda::TraceEntry::OOM + 1] = {};
  for (const std::string &name : skip) {
    auto hit = std::find(std::begin(names), std::end(names), name);
    GG_CHECK(hit != std::end(names), "Unknown TraceEntry action: ", name);
    skip_now[hit - std::begin(names)] = true;
  }
  std::lock_guard<std::mutex> g(mu_);
  recorder_ = enabled ? recorder : nullptr;
  when_ = enabled ? when : cda::RecordContext::NEVER;
  max_entries_ = std::max<size_t>(max_entries, 1);
  std::copy(std::begin(skip_now), std::end(skip_now), std::begin(skip_));
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

void History::drop_python_state() {
  std::deque<cda::TraceEntry> trace;
  std::vector<cca::OutOfMemoryObserver> observers;
  std::vector<cda::AllocatorTraceTracker> trackers;
  {
    std::lock_guard<std::mutex> g(mu_);
    on_.store(false);
    trackers_on_.store(false);
    recorder_ = nullptr;
    when_ = cda::RecordContext::NEVER;
    trace.swap(trace_);
    observers.swap(observers_);
    trackers.swap(trackers_);
  }
  /* Destroyed here, outside the lock: a stack's destructor may call back into Python's side. */
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
