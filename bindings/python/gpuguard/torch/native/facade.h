/* facade.h (gpuguard.torch) — gpuguard as a PyTorch CUDA allocator backend: the
 * c10::cuda::CUDACachingAllocator::CUDAAllocator whose methods are a few lines each over the
 * torch-free adapter (adapter.h). PyTorch-shaped state only lives here: memory history, trackers,
 * out-of-memory observers, the cudaMalloc'd blocks of torch.cuda.caching_allocator_enable(False),
 * and CUDA IPC (ipc.cpp). Snapshots are built in snapshot.cpp, the runtime calls the adapter needs
 * in runtime.cpp, the entry points gpuguard.torch calls through ctypes in entry.cpp. */
#ifndef GG_TORCH_FACADE_H
#define GG_TORCH_FACADE_H

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/util/ApproximateClock.h>

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "adapter.h"
#include "compat.h"
#include "ipc.h"

namespace gg_torch {

inline PoolId pool_id(c10::MempoolId_t id) { return PoolId{id.first, id.second}; }
inline c10::MempoolId_t mempool_id(PoolId id) { return {id.first, id.second}; }

std::string format_size(uint64_t n);
/* The CUDA runtime calls the adapter needs (runtime.cpp). */
Runtime cuda_runtime();

/* Memory history (torch.cuda.memory._record_memory_history), trace trackers and out-of-memory
 * observers: PyTorch's types, kept under their own lock. */
class History {
public:
  bool on() const {
    return on_.load(std::memory_order_relaxed) || trackers_on_.load(std::memory_order_relaxed);
  }
  std::shared_ptr<c10::GatheredContext> gather(cda::RecordContext at_least);
  void record(cda::TraceEntry::Action action, int device, void *addr, size_t size, void *stream,
              PoolId pool, std::shared_ptr<c10::GatheredContext> ctx);
  void record_free(int device, void *addr, size_t size, void *stream, PoolId pool,
                   std::shared_ptr<c10::GatheredContext> ctx);
  void configure(bool enabled, cda::CreateContextFn recorder, size_t max_entries,
                 cda::RecordContext when, bool clear, const std::vector<std::string> &skip);
  void add_observer(cca::OutOfMemoryObserver o);
  void add_tracker(cda::AllocatorTraceTracker t);
  std::vector<cca::OutOfMemoryObserver> observers();
  bool enabled() const { return on_.load(); }
  /* Turns history off and drops every object Python may own (recorded stacks, observers,
   * trackers), while the interpreter still lives (gpuguard.torch's atexit hook). */
  void drop_python_state();
  /* The trace per device, times made wall-clock (snapshot.cpp). */
  std::vector<std::vector<cda::TraceEntry>> traces(int device_count);
  /* torch.cuda.memory._set_memory_metadata and torch.compile's context: on every later entry. */
  void set_metadata(const std::string &m);
  std::string metadata();
  void push_compile_context(const std::string &c);
  void pop_compile_context();

private:
  std::mutex mu_;
  std::atomic<bool> on_{false};
  std::atomic<bool> trackers_on_{false};
  cda::CreateContextFn recorder_ = nullptr;
  cda::RecordContext when_ = cda::RecordContext::NEVER;
  size_t max_entries_ = 1;
  bool skip_[cda::TraceEntry::OOM + 1] = {}; /* skip_actions, by action */
  std::string metadata_;
  std::vector<std::string> compile_; /* a stack */
  std::deque<cda::TraceEntry> trace_;
  std::vector<cca::OutOfMemoryObserver> observers_;
  std::vector<cda::AllocatorTraceTracker> trackers_;
  c10::ApproximateClockToUnixTimeConverter clock_;
};

class Backend final : public cca::CUDAAllocator {
public:
  explicit Backend(const gg_arena_options_t &opts);

  /* c10::Allocator */
  c10::DataPtr allocate(size_t n) override;
  c10::DeleterFnPtr raw_deleter() const override { return &Backend::deleter; }
  void copy_data(void *dest, const void *src, std::size_t count) const override;

  /* CUDAAllocator */
  bool initialized() override { return initialized_.load(); }
  void init(int device_count) override;
  void enable(bool value) override { enabled_ = value; }
  bool isEnabled() const override { return enabled_; }
  void *raw_alloc(size_t n) override;
  void *raw_alloc_with_stream(size_t n, cudaStream_t stream) override;
  void raw_delete(void *ptr) override;
  double getMemoryFraction(c10::DeviceIndex device) override;
  void setMemoryFraction(double fraction, c10::DeviceIndex device) override;
#if GG_TORCH_AT_LEAST(2, 10)
  std::vector<cca::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex) override {
    return {};
  }
#endif
  void cacheInfo(c10::DeviceIndex device, size_t *largest) override;
  void *getBaseAllocation(void *ptr, size_t *size) override;
  void recordStream(const c10::DataPtr &dp, c10::cuda::CUDAStream stream) override;
  cda::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;
  cca::SnapshotInfo snapshot(c10::MempoolId_t id, bool include_traces) GG_OVERRIDE_2_11;
  void emptyCache(c10::MempoolId_t id) override;
  void beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t id,
                           std::function<bool(cudaStream_t)> filter) override;
  void endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t id) override;
  void releasePool(c10::DeviceIndex device, c10::MempoolId_t id) override;
  int getPoolUseCount(c10::DeviceIndex device, c10::MempoolId_t id) override;
  void createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t id,
                          std::shared_ptr<cca::CUDAAllocator> allocator) GG_OVERRIDE_2_11;
  void setUseOnOOM(c10::DeviceIndex device, c10::MempoolId_t id, bool use_on_oom) GG_OVERRIDE_2_11;
  void setNoSplit(c10::DeviceIndex device, c10::MempoolId_t id) GG_OVERRIDE_2_11;
  bool checkPoolLiveAllocations(c10::DeviceIndex device, c10::MempoolId_t id,
                                const std::unordered_set<void *> &expected) override;
  cca::ShareableHandle shareIpcHandle(void *ptr) override;
  std::shared_ptr<void> getIpcDevPtr(std::string handle) override;
  bool isHistoryEnabled() override { return history_.enabled(); }
  void recordHistory(bool enabled, cda::CreateContextFn recorder, size_t max_entries,
                     cda::RecordContext when, bool clear,
                     const std::vector<std::string> &skip) GG_OVERRIDE_2_11;
  void attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) override;
  void attachAllocatorTraceTracker(cda::AllocatorTraceTracker tracker) override;
  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex to) override;
  cudaError_t memcpyAsync(void *dst, int dst_device, const void *src, int src_device, size_t count,
                          cudaStream_t stream, bool p2p_enabled) override;
  std::shared_ptr<cca::AllocatorState> getCheckpointState(c10::DeviceIndex device,
                                                          c10::MempoolId_t id) override;
  cca::CheckpointDelta setCheckpointPoolState(c10::DeviceIndex device,
                                              std::shared_ptr<cca::AllocatorState> pps) override;
  void setUserMetadata(const std::string &metadata) GG_OVERRIDE_2_10 {
    history_.set_metadata(metadata);
  }
  std::string getUserMetadata() GG_OVERRIDE_2_10 { return history_.metadata(); }
  void pushCompileContext(std::string &md) override { history_.push_compile_context(md); }
  void popCompileContext() override { history_.pop_compile_context(); }
  std::string name() override { return "gpuguard"; }
#if !GG_TORCH_AT_LEAST(2, 11)
  /* PyTorch 2.8 to 2.10's signatures, forwarded to 2.11's above. */
  cca::SnapshotInfo snapshot(c10::MempoolId_t id) override { return snapshot(id, true); }
  void setUseOnOOM(c10::DeviceIndex device, c10::MempoolId_t id) override {
    setUseOnOOM(device, id, true);
  }
  void recordHistory(bool enabled, cda::CreateContextFn recorder, size_t max_entries,
                     cda::RecordContext when, bool clear) override {
    recordHistory(enabled, recorder, max_entries, when, clear, {});
  }
  /* The pool's MemPool owns its allocator there: a shared_ptr that owns nothing. */
  void createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t id,
                          cca::CUDAAllocator *allocator) override {
    createOrIncrefPool(device, id,
                       std::shared_ptr<cca::CUDAAllocator>(std::shared_ptr<void>(), allocator));
  }
#endif

  /* For entry.cpp. */
  Adapter &core() { return core_; }
  /* At the interpreter's exit: nothing Python owns is left to a later destructor. */
  void at_exit();
  static void deleter(void *ptr);

private:
  void check_device(int device, const char *call);
  void *alloc_block(size_t n, int device, cudaStream_t stream);
  bool free_block(void *ptr);
  void *alloc_uncached(size_t n);
  bool free_uncached(void *ptr);
  void apply_fraction(int device);
  void profile(void *ptr, int64_t bytes, int device);
  [[noreturn]] void fail(int rc, size_t n, int device, cudaStream_t stream);
  /* With history on: segment_map / segment_unmap entries for the chunks mapped or given back since
   * the last look (snapshot.cpp). */
  void trace_segments(int device, std::shared_ptr<c10::GatheredContext> ctx);

  Adapter core_;
  History history_;
  std::mutex mu_; /* fractions_, uncached_ */
  std::atomic<bool> initialized_{false};
  int device_count_ = 0;
  std::atomic<bool> enabled_{true};
  double fractions_[kMaxDevices];
  std::unordered_set<void *> uncached_;                  /* cudaMalloc'd while caching was off */
  std::mutex seg_mu_;                                    /* segments_, seg_sig_ */
  std::map<std::pair<int, uintptr_t>, size_t> segments_; /* (device, address) -> size, as traced */
  int64_t seg_sig_[kMaxDevices] = {};                    /* maps + unmaps when last traced */
  ipc::Exporter exporter_;
  ipc::Importer importer_;
};

extern Backend *g_backend; /* the one installed: PyTorch keeps it for the process's life */

} // namespace gg_torch

#endif
