/* _native.cpp (gpuguard.torch) — gpuguard as a PyTorch CUDA allocator backend, beside PyTorch's own
 * `native` and `cudaMallocAsync`: an implementation of c10::cuda::CUDACachingAllocator::CUDAAllocator
 * over gpuguard arenas, installed with PyTorch's changeCurrentAllocator before the first CUDA
 * allocation. Every method PyTorch's allocator interface has is implemented, so what PyTorch calls
 * from C++ (cuDNN's cacheInfo, memory statistics, graph pools, snapshots) works as with its own
 * allocators.
 *
 * Layout of the work:
 *   - the default pool goes through the library's plugin (gg_torch_alloc_status / gg_torch_free): one
 *     arena per device, made on first use (gg_plugin_ensure_arena), stream-ordered, side streams
 *     ordered on the device, captures PyTorch does not announce handled by the plugin itself;
 *   - private pools (CUDA graphs, torch.cuda.MemPool) are arenas of their own, one per stream a pool
 *     allocates for, created with GG_ARENA_NO_STREAM: blocks freed in a pool are reused by the same
 *     pool only, on the same stream, as PyTorch's own allocator does; a pool's memory goes back to the
 *     driver once the pool is released and holds no live block;
 *   - statistics, the block table and history are kept here under one lock, so they are exact under
 *     any number of threads (autograd's backward thread frees what the main thread allocated).
 *
 * Built by gpuguard.torch at run time against the installed PyTorch's headers (cached per PyTorch
 * version); it links libgpuguard, libc10, libc10_cuda and libtorch_cuda. */
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/ApproximateClock.h>
#include <c10/util/flat_hash_map.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "gpuguard/arena.h"
#include "gpuguard/error.h"
#include "gpuguard/plugin.h"
#include "_native_ipc.h"

namespace {

namespace cca = c10::cuda::CUDACachingAllocator;
namespace cda = c10::CachingDeviceAllocator;
using c10::CachingAllocator::Stat;
using c10::CachingAllocator::StatArray;
using c10::CachingAllocator::StatType;

constexpr size_t kSmallMax = size_t(1) << 20; /* PyTorch's small pool: blocks of at most 1 MiB */
constexpr size_t kQuantum = 256;              /* the arena rounds every block to this */
constexpr int kMaxDevices = GG_PLUGIN_MAX_DEVICES;
constexpr int kNoMemory = GG_ENOMEM;

size_t rounded(size_t n) { return (n + kQuantum - 1) / kQuantum * kQuantum; }

std::string format_size(uint64_t n) {
  char buf[64];
  if (n < 1024) {
    snprintf(buf, sizeof buf, "%" PRIu64 " bytes", n);
  } else if (n < (uint64_t(1) << 20)) {
    snprintf(buf, sizeof buf, "%.2f KiB", double(n) / 1024.0);
  } else if (n < (uint64_t(1) << 30)) {
    snprintf(buf, sizeof buf, "%.2f MiB", double(n) / 1048576.0);
  } else {
    snprintf(buf, sizeof buf, "%.2f GiB", double(n) / 1073741824.0);
  }
  return buf;
}

struct Pool;

/* What few blocks carry (side streams of a pool block, CUDA IPC, a recorded stack): apart, so a
 * Block stays small and the table that holds every live block stays dense. */
struct BlockExtra {
  std::vector<cudaStream_t> recorded; /* record_stream on a pool block */
  uint64_t ipc_id = 0;                 /* registered for CUDA IPC: forgotten when freed */
  std::shared_ptr<c10::GatheredContext> context;
};

/* A block PyTorch holds. */
struct Block {
  size_t requested = 0;
  size_t size = 0; /* as the arena counts it */
  cudaStream_t stream = nullptr;
  Pool *pool = nullptr;
  int device = 0;
  std::unique_ptr<BlockExtra> extra;

  BlockExtra &more() {
    if (!extra) {
      extra = std::make_unique<BlockExtra>();
    }
    return *extra;
  }
  std::shared_ptr<c10::GatheredContext> context() const { return extra ? extra->context : nullptr; }
};

/* A private pool: CUDA graphs and torch.cuda.MemPool. */
struct Pool {
  c10::MempoolId_t id{0, 0};
  int device = 0;
  int use_count = 0;
  size_t live = 0;
  bool use_on_oom = false;
  std::shared_ptr<cca::CUDAAllocator> custom; /* MemPool(allocator=...): its raw_alloc serves the pool */
  std::vector<std::pair<cudaStream_t, gg_arena_t *>> arenas;
};

struct Capture {
  c10::MempoolId_t id;
  std::function<bool(cudaStream_t)> filter;
};

struct DeviceState {
  StatArray allocation, active, allocated_bytes, active_bytes, requested_bytes;
  int64_t num_ooms = 0;
  int64_t num_alloc_retries = 0;
  double fraction = -1.0; /* set by setMemoryFraction; < 0: none */
  std::vector<Capture> captures;
};

/* The arena is told which device's context to use by its own handle; PyTorch's current device is
 * made current for the runtime calls this file makes. */
struct RelaxedCapture {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&mode); }
  ~RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&mode); }
};

void add(StatArray &s, size_t pool, size_t n) {
  s[size_t(StatType::AGGREGATE)].increase(n);
  s[pool].increase(n);
}

void sub(StatArray &s, size_t pool, size_t n) {
  s[size_t(StatType::AGGREGATE)].decrease(n);
  s[pool].decrease(n);
}

size_t pool_of(size_t size) {
  return size <= kSmallMax ? size_t(StatType::SMALL_POOL) : size_t(StatType::LARGE_POOL);
}

class Backend;
Backend *g_backend = nullptr; /* the one installed: PyTorch keeps it for the process's life */

struct State final : public cca::AllocatorState {
  c10::MempoolId_t id;
  std::vector<void *> live;
};

/* GPUGUARD_TORCH_TRACE=1: every pool call on stderr, for finding who holds a pool. */
bool trace_on() {
  static const bool on = [] {
    const char *v = getenv("GPUGUARD_TORCH_TRACE");
    return v && v[0] == '1';
  }();
  return on;
}

void trace_pool(const char *call, c10::MempoolId_t id, int use_count, size_t live) {
  if (trace_on()) {
    fprintf(stderr, "gpuguard-torch: %s pool (%llu, %llu): use_count %d, live blocks %zu\n", call,
            (unsigned long long)id.first, (unsigned long long)id.second, use_count, live);
  }
}

class Backend final : public cca::CUDAAllocator {
 public:
  explicit Backend(const gg_arena_options_t &opts) : opts_(opts) {}

  /* ---- c10::Allocator ------------------------------------------------------------------------ */

  c10::DataPtr allocate(size_t n) override {
    c10::DeviceIndex dev = c10::cuda::current_device();
    cudaStream_t s = c10::cuda::getCurrentCUDAStream(dev).stream();
    void *p = n ? alloc_block(n, dev, s) : nullptr;
    return {p, p, &Backend::deleter, c10::Device(c10::DeviceType::CUDA, dev)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &Backend::deleter; }

  void copy_data(void *dest, const void *src, std::size_t count) const override {
    C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
  }

  /* ---- DeviceAllocator / CUDAAllocator ---------------------------------------------------------- */

  bool initialized() override { return initialized_.load(); }

  void init(int device_count) override {
    device_count_ = device_count;
    initialized_.store(true);
  }

  void enable(bool value) override { enabled_ = value; }
  bool isEnabled() const override { return enabled_; }

  void *raw_alloc(size_t n) override {
    if (n == 0) {
      return nullptr;
    }
    c10::DeviceIndex dev = c10::cuda::current_device();
    return alloc_block(n, dev, c10::cuda::getCurrentCUDAStream(dev).stream());
  }

  void *raw_alloc_with_stream(size_t n, cudaStream_t stream) override {
    if (n == 0) {
      return nullptr;
    }
    return alloc_block(n, c10::cuda::current_device(), stream);
  }

  void raw_delete(void *ptr) override {
    if (!ptr) {
      return;
    }
    GG_CHECK(free_block(ptr) || free_uncached(ptr), "invalid device pointer: ", ptr,
             " (not allocated by gpuguard's PyTorch backend, or freed already)");
  }

  double getMemoryFraction(c10::DeviceIndex device) override {
    check_device(device, "getMemoryFraction");
    std::lock_guard<std::mutex> g(mu_);
    double f = dev_[device].fraction;
    return f < 0 ? 1.0 : f;
  }

  void setMemoryFraction(double fraction, c10::DeviceIndex device) override {
    check_device(device, "setMemoryFraction");
    GG_CHECK(fraction >= 0 && fraction <= 1, "invalid fraction value: ", fraction,
                ". Usage: fraction in [0, 1]");
    {
      std::lock_guard<std::mutex> g(mu_);
      dev_[device].fraction = fraction;
    }
    gg_arena_t *a = device_arena(device);
    apply_fraction(device, a);
  }

  std::vector<cca::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex) override { return {}; }

  void cacheInfo(c10::DeviceIndex device, size_t *largest) override {
    check_device(device, "cacheInfo");
    gg_arena_t *a = device_arena(device);
    gg_arena_stats_t s{};
    gg_arena_stats_quiet(a, &s);
    size_t limit = 0;
    gg_arena_get_limit(a, &limit);
    size_t device_free = 0;
    size_t total = 0;
    {
      c10::cuda::CUDAGuard guard(device);
      if (cudaMemGetInfo(&device_free, &total) != cudaSuccess) {
        (void)cudaGetLastError();
        device_free = 0;
      }
    }
    /* What one allocation could get: the largest free block, or a growth into what the device and
     * the arena's limit still allow (PyTorch's own starts from the device's free memory too). */
    size_t growth = limit > s.bytes_mapped ? limit - s.bytes_mapped : 0;
    growth = std::min(growth, device_free);
    *largest = std::max(s.largest_free_block, growth);
  }

  void *getBaseAllocation(void *ptr, size_t *size) override {
    std::lock_guard<std::mutex> g(mu_);
    auto it = blocks_.find(ptr);
    GG_CHECK(it != blocks_.end(), "invalid device pointer: ", ptr);
    if (size) {
      *size = it->second.size;
    }
    return ptr;
  }

  void recordStream(const c10::DataPtr &dp, c10::cuda::CUDAStream stream) override {
    void *p = dp.get();
    if (!p || dp.get_deleter() != &Backend::deleter) {
      return; /* not ours (e.g. from another allocator or a from_blob tensor): nothing to track */
    }
    int device = -1;
    bool in_pool = false;
    {
      std::lock_guard<std::mutex> g(mu_);
      auto it = blocks_.find(p);
      if (it == blocks_.end()) {
        return;
      }
      device = it->second.device;
      in_pool = it->second.pool != nullptr;
      if (in_pool && stream.stream() != it->second.stream) {
        it->second.more().recorded.push_back(stream.stream());
      }
    }
    if (!in_pool && gg_plugin_record_stream(device, p, stream.stream()) < 0) {
      /* The record could not be kept: wait now, so the block is never reused under that stream. */
      C10_CUDA_CHECK(cudaStreamSynchronize(stream.stream()));
    }
  }

  cda::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    check_device(device, "getDeviceStats");
    cda::DeviceStats out;
    std::vector<gg_arena_t *> arenas = arenas_of(device);
    {
      std::lock_guard<std::mutex> g(mu_);
      const DeviceState &d = dev_[device];
      out.allocation = d.allocation;
      out.active = d.active;
      out.allocated_bytes = d.allocated_bytes;
      out.active_bytes = d.active_bytes;
      out.requested_bytes = d.requested_bytes;
      out.num_ooms = d.num_ooms;
      out.num_alloc_retries = d.num_alloc_retries;
    }
    fill_reserved(device, arenas, out);
    return out;
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    check_device(device, "resetAccumulatedStats");
    std::lock_guard<std::mutex> g(mu_);
    DeviceState &d = dev_[device];
    for (StatArray *s : {&d.allocation, &d.active, &d.allocated_bytes, &d.active_bytes, &d.requested_bytes}) {
      for (Stat &x : *s) {
        x.reset_accumulated();
      }
    }
    d.num_ooms = 0;
    d.num_alloc_retries = 0;
    reserved_base_[device] = reserved_total(device, nullptr);
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    check_device(device, "resetPeakStats");
    for (gg_arena_t *a : arenas_of(device)) {
      gg_arena_reset_peak(a);
    }
    std::lock_guard<std::mutex> g(mu_);
    DeviceState &d = dev_[device];
    for (StatArray *s : {&d.allocation, &d.active, &d.allocated_bytes, &d.active_bytes, &d.requested_bytes}) {
      for (Stat &x : *s) {
        x.reset_peak();
      }
    }
  }

  cca::SnapshotInfo snapshot(c10::MempoolId_t id, bool include_traces) override;

  void emptyCache(c10::MempoolId_t id) override {
    bool all = id.first == 0 && id.second == 0;
    bool capturing = n_captures_.load() > 0; /* no device synchronisation while a graph captures */
    std::vector<gg_arena_t *> dead;
    std::vector<gg_arena_t *> trim;
    {
      std::lock_guard<std::mutex> g(mu_);
      for (auto it = pools_.begin(); it != pools_.end();) {
        Pool &p = *it->second;
        if (!all && p.id != id) {
          ++it;
          continue;
        }
        if (!capturing && p.use_count <= 0 && p.live == 0) {
          for (auto &sa : p.arenas) {
            dead.push_back(sa.second);
          }
          it = pools_.erase(it);
          continue;
        }
        /* A pool still in use may belong to a live graph, whose replays run in memory its capture
         * freed: as in PyTorch's allocator, empty_cache() leaves it whole unless asked by its id. */
        if (all && p.use_count > 0) {
          ++it;
          continue;
        }
        for (auto &sa : p.arenas) {
          trim.push_back(sa.second);
        }
        ++it;
      }
    }
    destroy_after_sync(dead);
    for (gg_arena_t *a : trim) {
      gg_arena_trim(a, 0);
    }
    if (!all) {
      return;
    }
    for (int d = 0; d < kMaxDevices; d++) {
      gg_arena_t *a = arenas_[d].load();
      if (a) {
        int rc = gg_arena_trim(a, 0);
        GG_CHECK(rc == 0, "gpuguard: empty_cache could not give device ", d, "'s memory back: ",
                    gg_last_error());
        gg_plugin_trim(d, 0, nullptr); /* what captures the plugin handled held */
      }
    }
  }

  void beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t id,
                           std::function<bool(cudaStream_t)> filter) override {
    check_device(device, "beginAllocateToPool");
    std::lock_guard<std::mutex> g(mu_);
    /* Each allocation to a pool holds a use, given back by the releasePool PyTorch pairs with it (a
     * graph's reset, use_mem_pool's end): a pool shared by two graphs lives until both are gone. */
    Pool &p = pool_locked(device, id);
    p.use_count++;
    trace_pool("beginAllocateToPool", id, p.use_count, p.live);
    dev_[device].captures.push_back(Capture{id, std::move(filter)});
    n_captures_.fetch_add(1);
    /* Under mu_ as the capture list is: a call that has not seen it yet ends before this returns,
     * and PyTorch begins the capture only after (plugin calls never take mu_). */
    gg_plugin_announce_capture();
  }

  void endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t id) override {
    check_device(device, "endAllocateToPool");
    std::lock_guard<std::mutex> g(mu_);
    auto &c = dev_[device].captures;
    auto it = std::find_if(c.begin(), c.end(), [&](const Capture &x) { return x.id == id; });
    GG_CHECK(it != c.end(), "endAllocateToPool: no allocation to pool (", id.first, ", ", id.second,
                ") is under way on device ", int(device));
    c.erase(it);
    n_captures_.fetch_sub(1);
    gg_plugin_capture_ended();
    trace_pool("endAllocateToPool", id, -1, 0);
  }

  /* A pool without uses and without live blocks is freeable, as in PyTorch's own allocator: its memory
   * goes back at the next empty_cache (or an allocation that would fail otherwise), after a device
   * synchronisation, never at once. A graph captured later may still reach a block freed into it
   * (PyTorch's test_graph_capture_reset_recapture fills the previous graph's output in a new capture),
   * and work queued before the release may still run. */
  void releasePool(c10::DeviceIndex device, c10::MempoolId_t id) override {
    check_device(device, "releasePool");
    std::lock_guard<std::mutex> g(mu_);
    auto it = pools_.find(id);
    if (it == pools_.end()) {
      return; /* never allocated into: nothing to release */
    }
    Pool &p = *it->second;
    if (p.use_count > 0) {
      p.use_count--;
    }
    trace_pool("releasePool", id, p.use_count, p.live);
  }

  int getPoolUseCount(c10::DeviceIndex device, c10::MempoolId_t id) override {
    check_device(device, "getPoolUseCount");
    std::lock_guard<std::mutex> g(mu_);
    auto it = pools_.find(id);
    return it == pools_.end() ? 0 : it->second->use_count;
  }

  void createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t id,
                          std::shared_ptr<cca::CUDAAllocator> allocator) override {
    check_device(device, "createOrIncrefPool");
    std::lock_guard<std::mutex> g(mu_);
    Pool &p = pool_locked(device, id);
    p.use_count++;
    trace_pool("createOrIncrefPool", id, p.use_count, p.live);
    if (allocator && allocator.get() != this) {
      GG_CHECK(!p.custom || p.custom == allocator, "createOrIncrefPool: pool (", id.first, ", ",
                  id.second, ") already has another allocator");
      p.custom = std::move(allocator);
    }
  }

  void setUseOnOOM(c10::DeviceIndex device, c10::MempoolId_t id, bool use_on_oom) override {
    check_device(device, "setUseOnOOM");
    std::lock_guard<std::mutex> g(mu_);
    pool_locked(device, id).use_on_oom = use_on_oom;
  }

  void setNoSplit(c10::DeviceIndex device, c10::MempoolId_t id) override {
    check_device(device, "setNoSplit");
    std::lock_guard<std::mutex> g(mu_);
    pool_locked(device, id); /* every arena block is its own: nothing is split across tensors */
  }

  bool checkPoolLiveAllocations(c10::DeviceIndex device, c10::MempoolId_t id,
                                const std::unordered_set<void *> &expected) override {
    check_device(device, "checkPoolLiveAllocations");
    std::lock_guard<std::mutex> g(mu_);
    size_t n = 0;
    for (const auto &kv : blocks_) {
      const Block &b = kv.second;
      if (b.device != device || !b.pool || b.pool->id != id) {
        continue;
      }
      if (!expected.count(kv.first)) {
        return false;
      }
      n++;
    }
    return n == expected.size();
  }

  cca::ShareableHandle shareIpcHandle(void *ptr) override {
    gg_ipc::Shared sh{};
    uint64_t id = 0;
    {
      std::lock_guard<std::mutex> g(mu_);
      auto it = blocks_.find(ptr);
      GG_CHECK(it != blocks_.end(), "invalid device pointer: ", ptr,
                  " (not allocated by gpuguard's PyTorch backend, or freed already)");
      const Block &b = it->second;
      GG_CHECK(!b.pool || !b.pool->custom, "gpuguard: a block of a MemPool with its own allocator cannot "
                                             "be shared with another process");
      gg_arena_t *a = b.pool ? pool_arena_locked(b) : arenas_[b.device].load();
      sh = gg_ipc::Shared{ptr, b.size, b.device, a};
      id = b.extra ? b.extra->ipc_id : 0;
    }
    GG_CHECK(sh.arena, "gpuguard: the memory of ", ptr, " cannot be shared: it belongs to no arena");
    std::vector<gg_ipc::Mapping> ms = gg_ipc::mappings_of(sh.arena, ptr, sh.size);
    if (ms[0].handle == 0) { /* cuMemAlloc'd: the legacy way, one allocation holds the block */
      c10::cuda::CUDAGuard guard(sh.device);
      return {static_cast<char *>(ptr) - static_cast<char *>(ms[0].ptr), gg_ipc::share_legacy(ms[0].ptr)};
    }
#if GG_IPC_HAVE_DRIVER
    std::string h = exporter_.share(&id, sh);
    std::lock_guard<std::mutex> g(mu_);
    auto it = blocks_.find(ptr);
    if (it != blocks_.end()) {
      it->second.more().ipc_id = id;
    }
    return {0, h};
#else
    GG_CHECK(false, "gpuguard's PyTorch backend was built without cuda.h (CUDA_HOME unset?), so it cannot "
                       "share CUDA memory with another process: set CUDA_HOME to a CUDA toolkit and rebuild");
#endif
  }

  std::shared_ptr<void> getIpcDevPtr(std::string handle) override { return importer_.open(handle); }

  bool isHistoryEnabled() override { return history_on_.load(); }

  void recordHistory(bool enabled, cda::CreateContextFn recorder, size_t max_entries,
                     cda::RecordContext when, bool clear, const std::vector<std::string> &skip) override {
    std::lock_guard<std::mutex> g(mu_);
    recorder_ = enabled ? recorder : nullptr;
    when_ = enabled ? when : cda::RecordContext::NEVER;
    max_entries_ = std::max<size_t>(max_entries, 1);
    skip_free_requested_ = std::find(skip.begin(), skip.end(), "free_requested") != skip.end();
    history_on_.store(enabled);
    if (clear || !enabled) {
      trace_.clear();
    }
    while (trace_.size() > max_entries_) {
      trace_.pop_front();
    }
  }

  void attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) override {
    std::lock_guard<std::mutex> g(mu_);
    oom_observers_.push_back(std::move(observer));
  }

  void attachAllocatorTraceTracker(cda::AllocatorTraceTracker tracker) override {
    std::lock_guard<std::mutex> g(mu_);
    trackers_.push_back(std::move(tracker));
    have_trackers_.store(true);
  }

  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex to) override {
    c10::cuda::CUDAGuard guard(dev);
    cudaError_t err = cudaDeviceEnablePeerAccess(to, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled) {
      (void)cudaGetLastError();
      return;
    }
    C10_CUDA_CHECK(err);
  }

  cudaError_t memcpyAsync(void *dst, int dst_device, const void *src, int src_device, size_t count,
                          cudaStream_t stream, bool p2p_enabled) override {
    /* Arena memory is mapped for its own device only: across devices without peer access the copy
     * must name both devices. */
    if (p2p_enabled || dst_device == src_device) {
      return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
    }
    return cudaMemcpyPeerAsync(dst, dst_device, src, src_device, count, stream);
  }

  std::shared_ptr<cca::AllocatorState> getCheckpointState(c10::DeviceIndex device,
                                                          c10::MempoolId_t id) override {
    check_device(device, "getCheckpointState");
    auto st = std::make_shared<State>();
    st->id = id;
    std::lock_guard<std::mutex> g(mu_);
    for (const auto &kv : blocks_) {
      if (kv.second.device == device && kv.second.pool && kv.second.pool->id == id) {
        st->live.push_back(kv.first);
      }
    }
    return st;
  }

  cca::CheckpointDelta setCheckpointPoolState(c10::DeviceIndex device,
                                              std::shared_ptr<cca::AllocatorState> pps) override {
    check_device(device, "setCheckpointPoolState");
    auto *st = dynamic_cast<State *>(pps.get());
    GG_CHECK(st, "setCheckpointPoolState: the state was not made by gpuguard's backend");
    std::lock_guard<std::mutex> g(mu_);
    std::unordered_set<void *> want(st->live.begin(), st->live.end());
    bool same = true;
    size_t n = 0;
    for (const auto &kv : blocks_) {
      if (kv.second.device == device && kv.second.pool && kv.second.pool->id == st->id) {
        same = same && want.count(kv.first);
        n++;
      }
    }
    /* Unchanged since the checkpoint: nothing to rewind. Anything else would need blocks placed back
     * at their old addresses, which the arena does not do. */
    GG_CHECK(same && n == want.size(),
                "gpuguard's PyTorch backend cannot rewind a CUDA-graph pool to a checkpoint (torch.compile "
                "mode='reduce-overhead' recording a second path, e.g. for new input shapes): keep shapes "
                "static, mark them dynamic, or run without GPUGUARD_TORCH=1");
    return {};
  }

  std::string name() override { return "gpuguard"; }

  /* ---- used by the extern "C" functions below --------------------------------------------------- */

  struct Counters {
    uint64_t n_pools;
    uint64_t n_pool_blocks;
    uint64_t n_blocks;
    uint64_t n_captures;
  };

  /* "first second use_count live\n" per pool, for diagnostics. */
  std::string pools_text() {
    std::lock_guard<std::mutex> g(mu_);
    std::string out;
    for (const auto &kv : pools_) {
      char line[128];
      snprintf(line, sizeof line, "%llu %llu %d %zu\n", (unsigned long long)kv.first.first,
               (unsigned long long)kv.first.second, kv.second->use_count, kv.second->live);
      out += line;
    }
    return out;
  }

  Counters counters() {
    std::lock_guard<std::mutex> g(mu_);
    Counters c{pools_.size(), 0, blocks_.size(), uint64_t(n_captures_.load())};
    for (const auto &kv : blocks_) {
      if (kv.second.pool) {
        c.n_pool_blocks++;
      }
    }
    return c;
  }

  static void deleter(void *ptr) {
    if (ptr && g_backend && !g_backend->free_block(ptr) && !g_backend->free_uncached(ptr)) {
      fprintf(stderr, "gpuguard: PyTorch freed %p, which gpuguard's backend does not know\n", ptr);
    }
  }

 private:
  /* The default pool's calls keep no statistics in the plugin (they are kept here) and, while no
   * capture is announced and trust_announced_ holds, skip the plugin's per-call capture query:
   * PyTorch announces every capture it makes (beginAllocateToPool), and its own allocator asks
   * the driver only while one is under way. */
  unsigned call_flags() const {
    return GG_TORCH_OWN_STATS | (trust_announced_.load(std::memory_order_relaxed) ? unsigned(GG_TORCH_ANNOUNCED) : 0u);
  }

 public:
  void set_capture_query(bool every_call) { trust_announced_.store(!every_call); }

 private:
  void check_device(int device, const char *call) {
    GG_CHECK(device >= 0 && device < kMaxDevices, call, ": invalid device ", device);
  }

  /* Destroys arenas of freeable pools once the device has finished what may still use them. */
  static void destroy_after_sync(const std::vector<gg_arena_t *> &dead) {
    if (dead.empty()) {
      return;
    }
    if (cudaDeviceSynchronize() != cudaSuccess) {
      (void)cudaGetLastError(); /* a sticky error: the memory goes with the context anyway */
    }
    for (gg_arena_t *a : dead) {
      gg_arena_destroy(a);
    }
  }

  /* Frees every freeable pool of the device (none while a capture is under way); how many. */
  size_t release_freeable(int device) {
    std::vector<gg_arena_t *> dead;
    size_t n = 0;
    {
      std::lock_guard<std::mutex> g(mu_);
      if (!dev_[device].captures.empty()) {
        return 0;
      }
      for (auto it = pools_.begin(); it != pools_.end();) {
        Pool &p = *it->second;
        if (p.device != device || p.use_count > 0 || p.live > 0) {
          ++it;
          continue;
        }
        for (auto &sa : p.arenas) {
          dead.push_back(sa.second);
        }
        it = pools_.erase(it);
        n++;
      }
    }
    destroy_after_sync(dead);
    return n;
  }

  /* The device's arena, made on first use. */
  gg_arena_t *device_arena(int device) {
    check_device(device, "allocate");
    gg_arena_t *a = arenas_[device].load(std::memory_order_acquire);
    if (a) {
      return a;
    }
    int rc = gg_plugin_ensure_arena(device, &opts_, &a);
    GG_CHECK(rc == 0, "gpuguard: cannot make the arena for CUDA device ", device, ": ", gg_last_error());
    arenas_[device].store(a, std::memory_order_release);
    apply_fraction(device, a);
    return a;
  }

  void apply_fraction(int device, gg_arena_t *a) {
    double f = -1.0;
    {
      std::lock_guard<std::mutex> g(mu_);
      f = dev_[device].fraction;
    }
    if (f < 0) {
      return;
    }
    size_t device_free = 0;
    size_t total = 0;
    {
      c10::cuda::CUDAGuard guard(device);
      C10_CUDA_CHECK(cudaMemGetInfo(&device_free, &total));
    }
    size_t limit = size_t(f * double(total));
    int rc = gg_arena_set_limit(a, limit == 0 ? 1 : limit);
    GG_CHECK(rc == 0, "gpuguard: setMemoryFraction: ", gg_last_error());
  }

  Pool &pool_locked(int device, c10::MempoolId_t id) {
    auto it = pools_.find(id);
    if (it != pools_.end()) {
      return *it->second;
    }
    auto p = std::make_unique<Pool>();
    p->id = id;
    p->device = device;
    Pool &ref = *p;
    pools_.emplace(id, std::move(p));
    return ref;
  }

  /* The pool an allocation for `stream` goes to, when a capture or MemPool is active on the device. */
  Pool *active_pool(int device, cudaStream_t stream) {
    if (n_captures_.load(std::memory_order_relaxed) == 0) {
      return nullptr;
    }
    std::vector<Capture> caps;
    {
      std::lock_guard<std::mutex> g(mu_);
      caps = dev_[device].captures;
    }
    for (auto it = caps.rbegin(); it != caps.rend(); ++it) { /* the newest first, as PyTorch */
      if (it->filter(stream)) {
        std::lock_guard<std::mutex> g(mu_);
        auto p = pools_.find(it->id);
        return p == pools_.end() ? nullptr : p->second.get();
      }
    }
    return nullptr;
  }

  /* The arena of a private pool that holds block b (one per stream the pool allocated for), or NULL.
   * Called with mu_ held. */
  static gg_arena_t *pool_arena_locked(const Block &b) {
    for (auto &sa : b.pool->arenas) {
      if (sa.first == b.stream) {
        return sa.second;
      }
    }
    return nullptr;
  }

  gg_arena_t *pool_arena(Pool &p, cudaStream_t stream) {
    {
      std::lock_guard<std::mutex> g(mu_);
      for (auto &sa : p.arenas) {
        if (sa.first == stream) {
          return sa.second;
        }
      }
    }
    gg_arena_options_t o = opts_;
    o.device = p.device;
    o.flags |= GG_ARENA_NO_STREAM;
    o.name = "torch-pool";
    gg_arena_t *a = nullptr;
    int rc = 0;
    {
      RelaxedCapture relaxed; /* reserving and mapping memory while the stream captures */
      rc = gg_arena_create(&a, &o);
    }
    GG_CHECK(rc == 0, "gpuguard: cannot make an arena for a private pool on device ", p.device, ": ",
                gg_last_error());
    std::lock_guard<std::mutex> g(mu_);
    for (auto &sa : p.arenas) {
      if (sa.first == stream) { /* another thread made one meanwhile */
        gg_arena_destroy(a);
        return sa.second;
      }
    }
    p.arenas.emplace_back(stream, a);
    return a;
  }

  int pool_alloc(Pool &p, size_t n, cudaStream_t stream, void **ptr) {
    if (p.custom) {
      *ptr = p.custom->raw_alloc_with_stream(n, stream);
      return *ptr ? 0 : kNoMemory;
    }
    gg_arena_t *a = pool_arena(p, stream);
    RelaxedCapture relaxed;
    return gg_alloc_ex(a, n, 0, "torch-pool", ptr);
  }

  std::shared_ptr<c10::GatheredContext> gather(cda::RecordContext at_least) {
    if (!history_on_.load(std::memory_order_relaxed)) {
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
    return fn ? fn() : nullptr;
  }

  void *alloc_block(size_t n, int device, cudaStream_t stream) {
    if (!enabled_.load(std::memory_order_relaxed)) {
      return alloc_uncached(n);
    }
    /* PyTorch's own wording and type for a size no device has (scripts and tests match it). */
    constexpr size_t kOneExaByte = size_t(1) << 60;
    if (n >= kOneExaByte) {
      C10_THROW_ERROR(OutOfMemoryError, "CUDA out of memory. Tried to allocate more than 1EB memory.");
    }
    gg_arena_t *a = device_arena(device);
    auto context = gather(cda::RecordContext::STATE);
    Pool *pool = active_pool(device, stream);
    void *p = nullptr;
    int rc = 0;
    if (n > size_t(SSIZE_MAX)) {
      rc = kNoMemory;
      gg_clear_error();
    } else if (pool) {
      rc = pool_alloc(*pool, n, stream, &p);
    } else {
      rc = gg_torch_alloc_ex(ssize_t(n), device, stream, call_flags(), &p);
      if (rc == kNoMemory && release_freeable(device) > 0) {
        count_retry(device);
        rc = gg_torch_alloc_ex(ssize_t(n), device, stream, call_flags(), &p);
      }
      if (rc == kNoMemory) {
        rc = alloc_on_oom_pool(n, device, stream, &p, &pool);
      }
    }
    if (rc < 0) {
      fail(rc, n, device, stream, a);
    }
    Block b;
    b.requested = n;
    b.size = rounded(n);
    b.stream = stream;
    b.device = device;
    b.pool = pool;
    if (context) {
      b.more().context = std::move(context);
    }
    size_t sp = pool_of(b.size);
    std::lock_guard<std::mutex> g(mu_);
    DeviceState &d = dev_[device];
    add(d.allocation, sp, 1);
    add(d.active, sp, 1);
    add(d.allocated_bytes, sp, b.size);
    add(d.active_bytes, sp, b.size);
    add(d.requested_bytes, sp, n);
    if (pool) {
      pool->live++;
    }
    if (history_on_.load(std::memory_order_relaxed) || have_trackers_.load(std::memory_order_relaxed)) {
      record_locked(cda::TraceEntry::ALLOC, device, p, b.requested, stream, pool, b.context());
    }
    blocks_.emplace(p, std::move(b));
    return p;
  }

  void count_retry(int device) {
    std::lock_guard<std::mutex> g(mu_);
    dev_[device].num_alloc_retries++;
  }

  int alloc_on_oom_pool(size_t n, int device, cudaStream_t stream, void **ptr, Pool **used) {
    std::vector<Pool *> cands;
    {
      std::lock_guard<std::mutex> g(mu_);
      for (auto &kv : pools_) {
        if (kv.second->use_on_oom && kv.second->device == device) {
          cands.push_back(kv.second.get());
        }
      }
    }
    for (Pool *p : cands) {
      if (pool_alloc(*p, n, stream, ptr) == 0) {
        *used = p;
        return 0;
      }
    }
    return kNoMemory;
  }

  [[noreturn]] void fail(int rc, size_t n, int device, cudaStream_t stream, gg_arena_t *a) {
    std::string detail = gg_last_error();
    if (rc != kNoMemory) {
      C10_THROW_ERROR(Error, "gpuguard could not allocate " + std::to_string(n) + " bytes on CUDA device " +
                                 std::to_string(device) + ": " + detail);
    }
    size_t device_free = 0;
    size_t total = 0;
    if (cudaMemGetInfo(&device_free, &total) != cudaSuccess) {
      (void)cudaGetLastError();
    }
    gg_arena_stats_t s{};
    gg_arena_stats_quiet(a, &s);
    std::vector<cca::OutOfMemoryObserver> observers;
    size_t allocated = 0;
    {
      std::lock_guard<std::mutex> g(mu_);
      DeviceState &d = dev_[device];
      d.num_ooms++;
      allocated = size_t(d.allocated_bytes[size_t(StatType::AGGREGATE)].current);
      observers = oom_observers_;
      if (history_on_.load() || have_trackers_.load()) {
        record_locked(cda::TraceEntry::OOM, device, reinterpret_cast<void *>(device_free), n, stream, nullptr,
                      nullptr);
      }
    }
    for (auto &o : observers) {
      o(device, allocated, total, device_free);
    }
    size_t reserved = s.bytes_mapped;
    std::string msg = "CUDA out of memory. Tried to allocate " + format_size(n) + ". GPU " +
                      std::to_string(device) + " has a total capacity of " + format_size(total) + " of which " +
                      format_size(device_free) + " is free. Including non-PyTorch memory, this process has " +
                      format_size(total - device_free) + " memory in use. Of the allocated memory " +
                      format_size(allocated) + " is allocated by PyTorch, and " +
                      format_size(reserved > allocated ? reserved - allocated : 0) +
                      " is reserved by PyTorch but unallocated. gpuguard: " + detail +
                      " (in use " + format_size(s.bytes_in_use) + ", mapped " + format_size(s.bytes_mapped) +
                      ", pending reuse " + format_size(s.bytes_pending) + ", capacity " +
                      format_size(s.bytes_reserved) + ", largest free block " + format_size(s.largest_free_block) +
                      ", fragmentation " + std::to_string(s.fragmentation) + ")";
    C10_THROW_ERROR(OutOfMemoryError, msg);
  }

  /* torch.cuda.caching_allocator_enable(False): each allocation straight from cudaMalloc, in no figure,
   * given back by cudaFree at its free, as PyTorch's allocator does then. */
  void *alloc_uncached(size_t n) {
    void *p = nullptr;
    cudaError_t e = cudaMalloc(&p, n);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      C10_THROW_ERROR(OutOfMemoryError, "CUDA out of memory. Tried to allocate " + format_size(n) +
                                            " with caching disabled (torch.cuda.caching_allocator_enable)");
    }
    C10_CUDA_CHECK(e);
    std::lock_guard<std::mutex> g(mu_);
    uncached_.insert(p);
    return p;
  }

  bool free_uncached(void *p) {
    {
      std::lock_guard<std::mutex> g(mu_);
      if (uncached_.erase(p) == 0) {
        return false;
      }
    }
    C10_CUDA_CHECK(cudaFree(p));
    return true;
  }

  bool free_block(void *p) {
    /* Before the lock: the recorder may take the GIL. With context "all" a free keeps its stack. */
    std::shared_ptr<c10::GatheredContext> ctx = gather(cda::RecordContext::ALL);
    Block b;
    gg_arena_t *pool_arena_of_block = nullptr;
    {
      std::lock_guard<std::mutex> g(mu_);
      auto it = blocks_.find(p);
      if (it == blocks_.end()) {
        return false;
      }
      b = std::move(it->second);
      blocks_.erase(it);
#if GG_IPC_HAVE_DRIVER
      if (b.extra && b.extra->ipc_id) {
        exporter_.forget(b.extra->ipc_id);
      }
#endif
      DeviceState &d = dev_[b.device];
      size_t sp = pool_of(b.size);
      sub(d.allocation, sp, 1);
      sub(d.active, sp, 1);
      sub(d.allocated_bytes, sp, b.size);
      sub(d.active_bytes, sp, b.size);
      sub(d.requested_bytes, sp, b.requested);
      if (history_on_.load(std::memory_order_relaxed) || have_trackers_.load(std::memory_order_relaxed)) {
        if (!skip_free_requested_) {
          record_locked(cda::TraceEntry::FREE_REQUESTED, b.device, p, b.requested, b.stream, b.pool, ctx);
        }
        record_locked(cda::TraceEntry::FREE_COMPLETED, b.device, p, b.requested, b.stream, b.pool, ctx);
      }
      if (b.pool && !b.pool->custom) {
        pool_arena_of_block = pool_arena_locked(b);
      }
    }
    if (!b.pool) {
      if (gg_torch_free_ex(p, ssize_t(b.size), b.device, b.stream, call_flags()) < 0) {
        /* A deleter cannot throw; the block stays with the arena (never handed out twice). */
        fprintf(stderr, "gpuguard: freeing %p on device %d failed: %s\n", p, b.device, gg_last_error());
      }
      return true;
    }
    if (b.extra && !b.extra->recorded.empty() &&
        c10::cuda::currentStreamCaptureStatusMayInitCtx() == c10::cuda::CaptureStatus::None) {
      for (cudaStream_t s : b.extra->recorded) {
        C10_CUDA_CHECK(cudaStreamSynchronize(s)); /* a pool block used on another stream */
      }
    }
    if (b.pool->custom) {
      b.pool->custom->raw_delete(p);
    } else if (pool_arena_of_block) {
      gg_free(pool_arena_of_block, p);
    }
    {
      std::lock_guard<std::mutex> g(mu_);
      Pool *pool = b.pool;
      pool->live--;
      if (pool->live == 0) {
        trace_pool("last block freed in", pool->id, pool->use_count, 0);
      }
    }
    return true;
  }

  void record_locked(cda::TraceEntry::Action action, int device, void *addr, size_t size, cudaStream_t stream,
                     Pool *pool, std::shared_ptr<c10::GatheredContext> ctx) {
    c10::MempoolId_t id = pool ? pool->id : c10::MempoolId_t{0, 0};
    cda::TraceEntry te(action, c10::DeviceIndex(device), reinterpret_cast<size_t>(addr), size,
                       static_cast<void *>(stream), id, c10::getApproximateTime(),
                       when_ >= cda::RecordContext::ALLOC ? std::move(ctx) : nullptr);
    for (auto &t : trackers_) {
      t(te);
    }
    if (!history_on_.load(std::memory_order_relaxed)) {
      return;
    }
    trace_.push_back(std::move(te));
    if (trace_.size() > max_entries_) {
      trace_.pop_front();
    }
  }

  std::vector<gg_arena_t *> arenas_of(int device) {
    std::vector<gg_arena_t *> out;
    gg_arena_t *a = arenas_[device].load();
    if (a) {
      out.push_back(a);
    }
    std::lock_guard<std::mutex> g(mu_);
    for (auto &kv : pools_) {
      if (kv.second->device == device) {
        for (auto &sa : kv.second->arenas) {
          out.push_back(sa.second);
        }
      }
    }
    return out;
  }

  /* Reserved = every arena's mapped memory on the device (and what the plugin holds for captures it
   * handled itself); segments = their mapped ranges' chunks. */
  int64_t reserved_total(int device, int64_t *peak) {
    int64_t cur = 0;
    int64_t pk = 0;
    gg_arena_t *a = arenas_[device].load();
    if (a) {
      gg_arena_stats_t s{};
      if (gg_arena_stats_quiet(a, &s) == 0) {
        cur += int64_t(s.bytes_mapped);
        pk += int64_t(s.peak_mapped);
      }
    }
    if (peak) {
      *peak = pk;
    }
    return cur;
  }

  void fill_reserved(int device, const std::vector<gg_arena_t *> &arenas, cda::DeviceStats &out) {
    Stat reserved;
    Stat segment;
    int64_t in_use = 0;
    uint64_t waits = 0;
    int64_t maps = 0;
    int64_t unmaps = 0;
    for (gg_arena_t *a : arenas) {
      gg_arena_stats_t s{};
      if (gg_arena_stats_quiet(a, &s) != 0) {
        continue;
      }
      reserved.current += int64_t(s.bytes_mapped);
      reserved.peak += int64_t(s.peak_mapped);
      segment.current += int64_t(s.n_chunks);
      in_use += int64_t(s.bytes_in_use);
      waits += s.n_stream_waits;
      maps += int64_t(s.n_maps);
      unmaps += int64_t(s.n_unmaps);
      reserved.freed += int64_t(s.bytes_trimmed);
    }
    gg_plugin_graph_stats_t gs{};
    if (gg_plugin_graph_stats(device, &gs) == 0) {
      reserved.current += int64_t(gs.bytes_mapped);
      in_use += int64_t(gs.bytes_in_use);
      waits += gs.n_stream_waits;
    }
    reserved.peak = std::max(reserved.peak, reserved.current);
    reserved.allocated = reserved.current + reserved.freed;
    segment.peak = segment.current;
    int64_t base = reserved_base_[device];
    reserved.allocated = std::max<int64_t>(reserved.allocated - base, 0);
    out.reserved_bytes[size_t(StatType::AGGREGATE)] = reserved;
    out.reserved_bytes[size_t(StatType::LARGE_POOL)] = reserved;
    out.segment[size_t(StatType::AGGREGATE)] = segment;
    out.segment[size_t(StatType::LARGE_POOL)] = segment;
    Stat inactive;
    inactive.current = std::max<int64_t>(reserved.current - in_use, 0);
    inactive.peak = inactive.current;
    out.inactive_split_bytes[size_t(StatType::AGGREGATE)] = inactive;
    out.inactive_split_bytes[size_t(StatType::LARGE_POOL)] = inactive;
    out.num_sync_all_streams = int64_t(waits); /* every host wait the arenas made for their streams */
    out.num_device_alloc = maps; /* driver allocations (cuMemCreate), as PyTorch counts its cudaMalloc */
    out.num_device_free = unmaps;
    out.max_split_size = -1;
  }

  friend cca::SnapshotInfo snapshot_of(Backend &b, c10::MempoolId_t id, bool include_traces);

  gg_arena_options_t opts_;
  std::mutex mu_;
  std::atomic<bool> initialized_{false};
  int device_count_ = 0;
  std::atomic<bool> enabled_{true};
  std::unordered_set<void *> uncached_; /* cudaMalloc'd while caching was off (mu_) */
  std::atomic<gg_arena_t *> arenas_[kMaxDevices] = {};
  DeviceState dev_[kMaxDevices];
  int64_t reserved_base_[kMaxDevices] = {};
  /* Open addressing, as PyTorch's own allocator keeps its live blocks: a node allocation and a
   * pointer chase less a call than std::unordered_map. */
  ska::flat_hash_map<void *, Block> blocks_;
  std::map<c10::MempoolId_t, std::unique_ptr<Pool>> pools_;
  std::atomic<int> n_captures_{0};
  std::atomic<bool> history_on_{false};
  /* false: every call asks the driver whether its stream captures (captures PyTorch does not
   * announce: a raw cudaStreamBeginCapture on a PyTorch stream); see set_capture_query. */
  std::atomic<bool> trust_announced_{true};
  std::atomic<bool> have_trackers_{false};
  cda::CreateContextFn recorder_ = nullptr;
  cda::RecordContext when_ = cda::RecordContext::NEVER;
  size_t max_entries_ = 1;
  bool skip_free_requested_ = false;
  std::deque<cda::TraceEntry> trace_;
  std::vector<cca::OutOfMemoryObserver> oom_observers_;
  std::vector<cda::AllocatorTraceTracker> trackers_;
  c10::ApproximateClockToUnixTimeConverter clock_;
#if GG_IPC_HAVE_DRIVER
  gg_ipc::Exporter exporter_;
#endif
  gg_ipc::Importer importer_;
};

/* ---- snapshot ------------------------------------------------------------------------------------ */

struct Range {
  uintptr_t addr;
  size_t size;
  c10::MempoolId_t owner;
  int device;
};

int collect_range(const gg_chunk_info_t *c, void *user) {
  auto *out = static_cast<std::vector<Range> *>(user);
  out->push_back(Range{reinterpret_cast<uintptr_t>(c->ptr), c->size, {0, 0}, 0});
  return 0;
}

cca::SnapshotInfo snapshot_of(Backend &b, c10::MempoolId_t id, bool include_traces) {
  bool all = id.first == 0 && id.second == 0;
  std::vector<Range> ranges;
  for (int d = 0; d < kMaxDevices; d++) {
    gg_arena_t *a = b.arenas_[d].load();
    if (!a || !all) {
      continue;
    }
    size_t before = ranges.size();
    gg_arena_foreach_chunk(a, collect_range, &ranges);
    for (size_t i = before; i < ranges.size(); i++) {
      ranges[i].device = d;
    }
  }
  std::vector<std::pair<c10::MempoolId_t, std::pair<int, gg_arena_t *>>> pool_arenas;
  {
    std::lock_guard<std::mutex> g(b.mu_);
    for (auto &kv : b.pools_) {
      if (!all && kv.first != id) {
        continue;
      }
      for (auto &sa : kv.second->arenas) {
        pool_arenas.push_back({kv.first, {kv.second->device, sa.second}});
      }
    }
  }
  for (auto &pa : pool_arenas) {
    size_t before = ranges.size();
    gg_arena_foreach_chunk(pa.second.second, collect_range, &ranges);
    for (size_t i = before; i < ranges.size(); i++) {
      ranges[i].owner = pa.first;
      ranges[i].device = pa.second.first;
    }
  }
  std::sort(ranges.begin(), ranges.end(), [](const Range &x, const Range &y) { return x.addr < y.addr; });

  cca::SnapshotInfo out;
  std::lock_guard<std::mutex> g(b.mu_);
  std::vector<std::pair<uintptr_t, const Block *>> live;
  live.reserve(b.blocks_.size());
  for (const auto &kv : b.blocks_) {
    live.emplace_back(reinterpret_cast<uintptr_t>(kv.first), &kv.second);
  }
  std::sort(live.begin(), live.end(), [](const auto &x, const auto &y) { return x.first < y.first; });
  size_t k = 0;
  for (const Range &r : ranges) {
    cda::SegmentInfo seg;
    seg.device = c10::DeviceIndex(r.device);
    seg.address = r.addr;
    seg.total_size = r.size;
    seg.is_large = true;
    seg.is_expandable = true;
    seg.owner_private_pool_id = r.owner;
    uintptr_t at = r.addr;
    uintptr_t end = r.addr + r.size;
    while (k < live.size() && live[k].first < r.addr) {
      k++;
    }
    for (; k < live.size() && live[k].first < end; k++) {
      const Block &bl = *live[k].second;
      uintptr_t p = live[k].first;
      if (p > at) {
        cda::BlockInfo gap;
        gap.size = p - at;
        seg.blocks.push_back(gap);
      }
      cda::BlockInfo bi;
      bi.size = std::min<size_t>(bl.size, end - p);
      bi.requested_size = bl.requested;
      bi.allocated = true;
      bi.active = true;
      bi.context_when_allocated = bl.context();
      seg.blocks.push_back(bi);
      seg.allocated_size += bi.size;
      seg.active_size += bi.size;
      seg.requested_size += bl.requested;
      seg.stream = bl.stream;
      at = p + bi.size;
    }
    if (at < end) {
      cda::BlockInfo gap;
      gap.size = end - at;
      seg.blocks.push_back(gap);
    }
    out.segments.push_back(std::move(seg));
  }
  if (include_traces) {
    int max_dev = 0;
    for (const auto &te : b.trace_) {
      max_dev = std::max(max_dev, int(te.device_) + 1);
    }
    max_dev = std::max(max_dev, b.device_count_);
    out.device_traces.resize(size_t(std::max(max_dev, 1)));
    auto to_ns = b.clock_.makeConverter();
    for (const auto &te : b.trace_) {
      cda::TraceEntry copy = te;
      copy.time_.t_ = to_ns(te.time_.approx_t_) / 1000;
      out.device_traces[size_t(te.device_)].push_back(std::move(copy));
    }
  }
  out.config_metadata.garbage_collection_threshold = 0.0;
  out.config_metadata.max_split_size = SIZE_MAX;
  out.config_metadata.pinned_num_register_threads = 1;
  out.config_metadata.expandable_segments = true;
  out.config_metadata.release_lock_on_malloc = false;
  out.config_metadata.pinned_use_host_register = false;
  out.config_metadata.graph_capture_record_stream_reuse = false;
  out.config_metadata.last_allocator_settings = "gpuguard";
  return out;
}

cca::SnapshotInfo Backend::snapshot(c10::MempoolId_t id, bool include_traces) {
  return snapshot_of(*this, id, include_traces);
}

} // namespace

/* ---- the entry points gpuguard.torch calls through ctypes ------------------------------------------ */

extern "C" __attribute__((visibility("default"))) int gg_torch_native_install(size_t capacity, size_t chunk_size,
                                                                             char *err, size_t errcap) {
  try {
    if (g_backend) {
      return 0;
    }
    gg_arena_options_t o;
    gg_arena_options_init(&o);
    o.backend = "cuda";
    o.capacity = capacity;
    o.chunk_size = chunk_size;
    o.name = "torch";
    auto b = std::make_shared<Backend>(o);
    torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(b);
    g_backend = b.get(); /* PyTorch holds the shared_ptr for the process's life */
    return 0;
  } catch (const std::exception &e) {
    snprintf(err, errcap, "%s", e.what());
    return GG_ESTATE;
  }
}

/* captures=any (1): every default-pool call asks the driver whether its stream captures, so a capture
 * PyTorch does not announce is handled too; 0 (captures=announced, the default): only while PyTorch
 * has announced one. 0, or GG_ESTATE when the backend is not installed. */
extern "C" __attribute__((visibility("default"))) int gg_torch_native_capture_query(int every_call) {
  if (!g_backend) {
    return GG_ESTATE;
  }
  g_backend->set_capture_query(every_call != 0);
  return 0;
}

/* 1 when this process's PyTorch allocator is gpuguard's backend. */
extern "C" __attribute__((visibility("default"))) int gg_torch_native_active(void) { return g_backend != nullptr; }

/* Counters for tests and diagnostics: pools alive, blocks held in pools, blocks held in all, captures
 * under way. 0, or GG_ESTATE when the backend is not installed. */
extern "C" __attribute__((visibility("default"))) int gg_torch_native_counters(uint64_t out[4]) {
  if (!g_backend) {
    return GG_ESTATE;
  }
  auto c = g_backend->counters();
  out[0] = c.n_pools;
  out[1] = c.n_pool_blocks;
  out[2] = c.n_blocks;
  out[3] = c.n_captures;
  return 0;
}

/* The pools alive, one "first second use_count live" line each, into buf (NUL-terminated, cut to cap).
 * The length it needs, or GG_ESTATE when the backend is not installed. */
extern "C" __attribute__((visibility("default"))) long gg_torch_native_pools(char *buf, size_t cap) {
  if (!g_backend) {
    return GG_ESTATE;
  }
  std::string s = g_backend->pools_text();
  if (buf && cap) {
    snprintf(buf, cap, "%s", s.c_str());
  }
  return long(s.size());
}
