/* backend.cpp (gpuguard.torch) — the facade's methods: each maps one of PyTorch's allocator calls
 * onto the adapter (facade.h says what lives where). */
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cinttypes>
#include <climits>
#include <cstdio>

#include "check.h"
#include "facade.h"

namespace gg_torch {

Backend *g_backend = nullptr;

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

Backend::Backend(const gg_arena_options_t &opts) : core_(cuda_runtime(), opts) {
  std::fill(std::begin(fractions_), std::end(fractions_), -1.0);
}

void Backend::check_device(int device, const char *call) {
  GG_CHECK(device >= 0 && device < kMaxDevices, call, ": invalid device ", device);
}

/* ---- allocation ------------------------------------------------------------------------------ */

c10::DataPtr Backend::allocate(size_t n) {
  c10::DeviceIndex dev = c10::cuda::current_device();
  cudaStream_t s = c10::cuda::getCurrentCUDAStream(dev).stream();
  void *p = n ? alloc_block(n, dev, s) : nullptr;
  return {p, p, &Backend::deleter, c10::Device(c10::DeviceType::CUDA, dev)};
}

void *Backend::raw_alloc(size_t n) {
  c10::DeviceIndex dev = c10::cuda::current_device();
  return n ? alloc_block(n, dev, c10::cuda::getCurrentCUDAStream(dev).stream()) : nullptr;
}

void *Backend::raw_alloc_with_stream(size_t n, cudaStream_t stream) {
  return n ? alloc_block(n, c10::cuda::current_device(), stream) : nullptr;
}

void Backend::raw_delete(void *ptr) {
  GG_CHECK(!ptr || free_block(ptr) || free_uncached(ptr), "invalid device pointer: ", ptr,
           " (not allocated by gpuguard's PyTorch backend, or freed already)");
}

void Backend::deleter(void *ptr) {
  if (ptr && g_backend && !g_backend->free_block(ptr) && !g_backend->free_uncached(ptr)) {
    fprintf(stderr, "gpuguard: PyTorch freed %p, which gpuguard's backend does not know\n", ptr);
  }
}

void *Backend::alloc_block(size_t n, int device, cudaStream_t stream) {
  if (!enabled_.load(std::memory_order_relaxed)) {
    return alloc_uncached(n);
  }
  /* PyTorch's own wording and type for a size no device has (scripts and tests match it). */
  if (n >= size_t(1) << 60) {
    C10_THROW_ERROR(OutOfMemoryError,
                    "CUDA out of memory. Tried to allocate more than 1EB memory.");
  }
  check_device(device, "allocate");
  auto ctx = history_.gather(cda::RecordContext::STATE);
  void *p = nullptr;
  PoolId pool;
  size_t divisions = roundup_divisions(n);
  int rc =
      n > size_t(SSIZE_MAX) ? GG_ENOMEM : core_.alloc(n, device, stream, ctx, &p, &pool, divisions);
  if (rc < 0) {
    fail(rc, n, device, stream);
  }
  if (history_.on()) {
    trace_segments(device, ctx);
    history_.record(cda::TraceEntry::ALLOC, device, p, n, stream, pool, ctx);
  }
  if (c10::memoryProfilingEnabled()) {
    size_t size = n;
    core_.block_size(p, &size);
    profile(p, int64_t(size), device);
  }
  return p;
}

/* torch.profiler(profile_memory=True): each block allocated (+) and freed (-), with the device's
 * allocated and reserved bytes after it, as PyTorch's allocators report them. */
void Backend::profile(void *ptr, int64_t bytes, int device) {
  c10::reportMemoryUsageToProfiler(ptr, bytes, size_t(core_.allocated(device)),
                                   size_t(core_.reserved(device).current),
                                   c10::Device(c10::DeviceType::CUDA, c10::DeviceIndex(device)));
}

bool Backend::free_block(void *ptr) {
  /* Before the adapter's lock: the recorder may take the GIL. */
  std::shared_ptr<c10::GatheredContext> ctx = history_.gather(cda::RecordContext::ALL);
  Freed f;
  if (core_.free(ptr, &f) == GG_ENOTFOUND) {
    return false;
  }
  if (f.ipc_id) {
    exporter_.forget(f.ipc_id);
  }
  if (history_.on()) {
    history_.record_free(f.device, ptr, f.requested, f.stream, f.pool, ctx);
  }
  if (c10::memoryProfilingEnabled()) {
    profile(ptr, -int64_t(f.size), f.device);
  }
  return true;
}

[[noreturn]] void Backend::fail(int rc, size_t n, int device, cudaStream_t stream) {
  std::string detail = gg_last_error();
  if (rc != GG_ENOMEM) {
    C10_THROW_ERROR(Error, "gpuguard could not allocate " + std::to_string(n) +
                               " bytes on CUDA device " + std::to_string(device) + ": " + detail);
  }
  size_t device_free = 0;
  size_t total = 0;
  if (cudaMemGetInfo(&device_free, &total) != cudaSuccess) {
    (void)cudaGetLastError();
  }
  gg_arena_stats_t s{};
  gg_arena_stats_quiet(core_.device_arena_if_any(device), &s);
  size_t allocated = core_.note_oom(device);
  if (history_.on()) {
    history_.record(cda::TraceEntry::OOM, device, reinterpret_cast<void *>(device_free), n, stream,
                    PoolId{}, nullptr);
  }
  for (auto &o : history_.observers()) {
    o(device, allocated, total, device_free);
  }
  size_t reserved = s.bytes_mapped;
  std::string msg =
      "CUDA out of memory. Tried to allocate " + format_size(n) + ". GPU " +
      std::to_string(device) + " has a total capacity of " + format_size(total) + " of which " +
      format_size(device_free) + " is free. Including non-PyTorch memory, this process has " +
      format_size(total - device_free) + " memory in use. Of the allocated memory " +
      format_size(allocated) + " is allocated by PyTorch, and " +
      format_size(reserved > allocated ? reserved - allocated : 0) +
      " is reserved by PyTorch but unallocated. gpuguard: " + detail + " (in use " +
      format_size(s.bytes_in_use) + ", mapped " + format_size(s.bytes_mapped) + ", pending reuse " +
      format_size(s.bytes_pending) + ", capacity " + format_size(s.bytes_reserved) +
      ", largest free block " + format_size(s.largest_free_block) + ", fragmentation " +
      std::to_string(s.fragmentation) + ")";
  C10_THROW_ERROR(OutOfMemoryError, msg);
}

/* torch.cuda.caching_allocator_enable(False): each allocation straight from cudaMalloc, in no
 * figure, given back by cudaFree at its free, as PyTorch's allocator does then. */
void *Backend::alloc_uncached(size_t n) {
  void *p = nullptr;
  cudaError_t e = cudaMalloc(&p, n);
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    C10_THROW_ERROR(OutOfMemoryError,
                    "CUDA out of memory. Tried to allocate " + format_size(n) +
                        " with caching disabled (torch.cuda.caching_allocator_enable)");
  }
  C10_CUDA_CHECK(e);
  std::lock_guard<std::mutex> g(mu_);
  uncached_.insert(p);
  return p;
}

bool Backend::free_uncached(void *ptr) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (uncached_.erase(ptr) == 0) {
      return false;
    }
  }
  C10_CUDA_CHECK(cudaFree(ptr));
  return true;
}

void Backend::copy_data(void *dest, const void *src, std::size_t count) const {
  C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
}

/* The arena limit of a memory fraction: a share of the device's memory, never 0 (which means no
 * limit to an arena; a fraction of 0 allows nothing, as in PyTorch). */
static size_t fraction_limit(double f, size_t total) {
  size_t limit = size_t(f * double(total));
  return limit == 0 ? 1 : limit;
}

/* PyTorch's per_process_memory_fraction setting bounds each device's arena from its first
 * allocation, as it bounds PyTorch's own allocator; set_per_process_memory_fraction overrides it.
 */
void Backend::init(int device_count) {
  device_count_ = device_count;
  double f = conf_memory_fraction();
  for (int d = 0; f >= 0 && f < 1.0 && d < device_count && d < kMaxDevices; d++) {
    cudaDeviceProp prop;
    C10_CUDA_CHECK(cudaGetDeviceProperties(&prop, d));
    {
      std::lock_guard<std::mutex> g(mu_);
      fractions_[d] = f;
    }
    core_.set_first_limit(d, fraction_limit(f, prop.totalGlobalMem));
    if (core_.device_arena_if_any(d)) {
      apply_fraction(d); /* made already (use_arena): bounded now, as set_per_process... does */
    }
  }
  initialized_.store(true);
}

/* ---- limits and statistics ------------------------------------------------------------------- */

double Backend::getMemoryFraction(c10::DeviceIndex device) {
  check_device(device, "getMemoryFraction");
  std::lock_guard<std::mutex> g(mu_);
  return fractions_[device] < 0 ? 1.0 : fractions_[device];
}

void Backend::setMemoryFraction(double fraction, c10::DeviceIndex device) {
  check_device(device, "setMemoryFraction");
  GG_CHECK(fraction >= 0 && fraction <= 1, "invalid fraction value: ", fraction,
           ". Usage: fraction in [0, 1]");
  {
    std::lock_guard<std::mutex> g(mu_);
    fractions_[device] = fraction;
  }
  gg_arena_t *a = nullptr;
  GG_CHECK(core_.device_arena(device, &a) == 0, "gpuguard: cannot make the arena for CUDA device ",
           int(device), ": ", gg_last_error());
  apply_fraction(device);
}

/* The device's arena never grows past its share of the device's memory. */
void Backend::apply_fraction(int device) {
  double f = -1.0;
  {
    std::lock_guard<std::mutex> g(mu_);
    f = fractions_[device];
  }
  gg_arena_t *a = core_.device_arena_if_any(device);
  if (f < 0 || !a) {
    return;
  }
  size_t device_free = 0;
  size_t total = 0;
  {
    c10::cuda::CUDAGuard guard(device);
    C10_CUDA_CHECK(cudaMemGetInfo(&device_free, &total));
  }
  /* The adapter lowers the arena's share by what custom allocators' pools hold on the device. */
  GG_CHECK(core_.set_limit(device, fraction_limit(f, total)) == 0,
           "gpuguard: setMemoryFraction: ", gg_last_error());
}

/* What one allocation could get: the largest free block, or a growth into what the device and the
 * arena's limit still allow (PyTorch's own starts from the device's free memory too). */
void Backend::cacheInfo(c10::DeviceIndex device, size_t *largest) {
  check_device(device, "cacheInfo");
  gg_arena_t *a = nullptr;
  GG_CHECK(core_.device_arena(device, &a) == 0, "gpuguard: cannot make the arena for CUDA device ",
           int(device), ": ", gg_last_error());
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
  size_t growth = std::min(limit > s.bytes_mapped ? limit - s.bytes_mapped : 0, device_free);
  *largest = std::max(s.largest_free_block, growth);
}

void *Backend::getBaseAllocation(void *ptr, size_t *size) {
  size_t n = 0;
  GG_CHECK(core_.block_size(ptr, &n), "invalid device pointer: ", ptr);
  if (size) {
    *size = n;
  }
  return ptr;
}

void Backend::recordStream(const c10::DataPtr &dp, c10::cuda::CUDAStream stream) {
  /* Not ours (another allocator's, a from_blob tensor): nothing to track. */
  if (dp.get() && dp.get_deleter() == &Backend::deleter) {
    core_.record_stream(dp.get(), stream.stream());
  }
}

namespace {

void copy_stat(const Stat &from, c10::CachingAllocator::Stat *to) {
  to->current = from.current;
  to->peak = from.peak;
  to->allocated = from.allocated;
  to->freed = from.freed;
}

void copy_stats(const Stat (&from)[3], c10::CachingAllocator::StatArray &to) {
  for (size_t i = 0; i < 3; i++) {
    copy_stat(from[i], &to[i]);
  }
}

} // namespace

/* Field for field: the adapter fills every figure (adapter.h, DeviceStats: what each means). */
cda::DeviceStats Backend::getDeviceStats(c10::DeviceIndex device) {
  check_device(device, "getDeviceStats");
  DeviceStats d = core_.stats(device);
  cda::DeviceStats out;
  copy_stats(d.allocation, out.allocation);
  copy_stats(d.segment, out.segment);
  copy_stats(d.active, out.active);
  copy_stats(d.inactive_split, out.inactive_split);
  copy_stats(d.allocated_bytes, out.allocated_bytes);
  copy_stats(d.reserved_bytes, out.reserved_bytes);
  copy_stats(d.active_bytes, out.active_bytes);
  copy_stats(d.inactive_split_bytes, out.inactive_split_bytes);
  copy_stats(d.requested_bytes, out.requested_bytes);
  out.num_alloc_retries = d.num_alloc_retries;
  out.num_ooms = d.num_ooms;
  copy_stat(d.oversize_allocations, &out.oversize_allocations);
  copy_stat(d.oversize_segments, &out.oversize_segments);
  out.num_sync_all_streams = d.num_sync_all_streams;
  out.num_device_alloc = d.num_device_alloc;
  out.num_device_free = d.num_device_free;
  out.max_split_size = d.max_split_size;
  return out;
}

void Backend::resetAccumulatedStats(c10::DeviceIndex device) {
  check_device(device, "resetAccumulatedStats");
  core_.reset_totals(device);
}

void Backend::resetPeakStats(c10::DeviceIndex device) {
  check_device(device, "resetPeakStats");
  core_.reset_peaks(device);
}

/* ---- pools ----------------------------------------------------------------------------------- */

void Backend::emptyCache(c10::MempoolId_t id) {
  auto ctx = history_.gather(cda::RecordContext::ALL); /* who gave the segments back */
  int rc = core_.empty_cache(pool_id(id));
  for (int d = 0; history_.on() && d < std::min(device_count_, kMaxDevices); d++) {
    trace_segments(d, ctx);
  }
  GG_CHECK(rc == 0, "gpuguard: empty_cache could not give memory back: ", gg_last_error());
}

void Backend::beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t id,
                                  std::function<bool(cudaStream_t)> filter) {
  check_device(device, "beginAllocateToPool");
  core_.begin_capture(device, pool_id(id),
                      [f = std::move(filter)](Stream s) { return f(cudaStream_t(s)); });
}

void Backend::endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t id) {
  check_device(device, "endAllocateToPool");
  GG_CHECK(core_.end_capture(device, pool_id(id)) == 0,
           "endAllocateToPool: no allocation to pool (", id.first, ", ", id.second,
           ") is under way on device ", int(device));
}

/* A pool without uses and without live blocks is freeable, as in PyTorch's own allocator: its
 * memory goes back at the next empty_cache (or an allocation that would fail otherwise). */
void Backend::releasePool(c10::DeviceIndex device, c10::MempoolId_t id) {
  check_device(device, "releasePool");
  core_.release_pool(device, pool_id(id));
}

int Backend::getPoolUseCount(c10::DeviceIndex device, c10::MempoolId_t id) {
  check_device(device, "getPoolUseCount");
  return core_.pool_use_count(pool_id(id));
}

void Backend::createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t id,
                                 std::shared_ptr<cca::CUDAAllocator> allocator) {
  check_device(device, "createOrIncrefPool");
  std::shared_ptr<Custom> custom;
  if (allocator && allocator.get() != this) {
    cca::CUDAAllocator *a = allocator.get();
    custom = std::make_shared<Custom>(
        Custom{[a](size_t n, Stream s) { return a->raw_alloc_with_stream(n, cudaStream_t(s)); },
               [a](void *p) { a->raw_delete(p); }, std::move(allocator)});
  }
  core_.create_or_incref(device, pool_id(id), std::move(custom));
}

void Backend::setUseOnOOM(c10::DeviceIndex device, c10::MempoolId_t id, bool use_on_oom) {
  check_device(device, "setUseOnOOM");
  core_.set_use_on_oom(device, pool_id(id), use_on_oom);
}

void Backend::setNoSplit(c10::DeviceIndex device, c10::MempoolId_t id) {
  check_device(device, "setNoSplit");
  core_.touch_pool(device, pool_id(id)); /* every arena block is its own: nothing is split */
}

bool Backend::checkPoolLiveAllocations(c10::DeviceIndex device, c10::MempoolId_t id,
                                       const std::unordered_set<void *> &expected) {
  check_device(device, "checkPoolLiveAllocations");
  return core_.pool_blocks_are(device, pool_id(id), expected);
}

namespace {

struct State final : public cca::AllocatorState {
  Checkpoint at;
};

} // namespace

std::shared_ptr<cca::AllocatorState> Backend::getCheckpointState(c10::DeviceIndex device,
                                                                 c10::MempoolId_t id) {
  check_device(device, "getCheckpointState");
  auto st = std::make_shared<State>();
  st->at = core_.checkpoint(device, pool_id(id));
  return st;
}

/* CUDA-graph trees rewinding a pool (a new path recorded, e.g. for new input shapes): the
 * adapter puts the checkpoint's blocks back at their addresses and frees the rest; the delta is
 * PyTorch's own: every block freed, and a DataPtr (with this backend's deleter) for each block
 * made, which PyTorch hands to the live storages or releases. */
cca::CheckpointDelta Backend::setCheckpointPoolState(c10::DeviceIndex device,
                                                     std::shared_ptr<cca::AllocatorState> pps) {
  check_device(device, "setCheckpointPoolState");
  auto *st = dynamic_cast<State *>(pps.get());
  GG_CHECK(st, "setCheckpointPoolState: the state was not made by gpuguard's backend");
  GG_CHECK(st->at.device == device, "setCheckpointPoolState: the checkpoint is of CUDA device ",
           st->at.device, ", not ", int(device));
  std::vector<void *> freed;
  std::vector<void *> made;
  int rc = core_.restore(st->at, &freed, &made);
  GG_CHECK(rc != GG_ENOTFOUND, "setCheckpointPoolState: could not find pool (", st->at.id.first,
           ", ", st->at.id.second, ") on CUDA device ", int(device));
  GG_CHECK(rc != GG_ENOTSUP, "setCheckpointPoolState: pool (", st->at.id.first, ", ",
           st->at.id.second, ") has its own allocator: its blocks cannot be put back");
  GG_CHECK(rc == 0, "setCheckpointPoolState: pool (", st->at.id.first, ", ", st->at.id.second,
           ") cannot be put back to the checkpoint (its memory was given back or is used "
           "elsewhere): ",
           gg_last_error());
  cca::CheckpointDelta delta;
  delta.ptrs_freed = std::move(freed);
  for (void *p : made) {
    delta.dataptrs_allocd.emplace_back(p, p, &Backend::deleter,
                                       c10::Device(c10::DeviceType::CUDA, device));
  }
  return delta;
}

/* ---- the rest of PyTorch's interface --------------------------------------------------------- */

void Backend::recordHistory(bool enabled, cda::CreateContextFn recorder, size_t max_entries,
                            cda::RecordContext when, bool clear,
                            const std::vector<std::string> &skip) {
  history_.configure(enabled, recorder, max_entries, when, clear, skip);
  /* What is mapped now was mapped before the history: the baseline, traced as nothing. */
  std::lock_guard<std::mutex> g(seg_mu_);
  segments_.clear();
  for (const Range &x : core_.ranges(PoolId{})) {
    segments_[{x.device, x.addr}] = x.size;
  }
  for (int d = 0; d < kMaxDevices; d++) {
    Reserved r = core_.reserved(d);
    seg_sig_[d] = r.maps + r.unmaps;
  }
}

void Backend::attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) {
  history_.add_observer(std::move(observer));
}

void Backend::attachAllocatorTraceTracker(cda::AllocatorTraceTracker tracker) {
  history_.add_tracker(std::move(tracker));
}

/* Stacks hold Python code objects, observers and trackers Python callables: all go while the
 * interpreter lives. The backend itself is never destroyed (entry.cpp), as PyTorch's own allocator
 * never is, so nothing Python owns reaches a static destructor. */
void Backend::at_exit() {
  history_.drop_python_state();
  core_.drop_contexts();
}

void Backend::enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex to) {
  c10::cuda::CUDAGuard guard(dev);
  cudaError_t err = cudaDeviceEnablePeerAccess(to, 0);
  if (err == cudaErrorPeerAccessAlreadyEnabled) {
    (void)cudaGetLastError();
    return;
  }
  C10_CUDA_CHECK(err);
}

/* Arena memory is mapped for its own device only: across devices without peer access the copy
 * must name both devices. */
cudaError_t Backend::memcpyAsync(void *dst, int dst_device, const void *src, int src_device,
                                 size_t count, cudaStream_t stream, bool p2p_enabled) {
  if (p2p_enabled || dst_device == src_device) {
    return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
  }
  return cudaMemcpyPeerAsync(dst, dst_device, src, src_device, count, stream);
}

cca::ShareableHandle Backend::shareIpcHandle(void *ptr) {
  gg_arena_t *arena = nullptr;
  size_t size = 0;
  int device = 0;
  uint64_t id = 0;
  int rc = core_.share_info(ptr, &arena, &size, &device, &id);
  GG_CHECK(rc != GG_ENOTSUP, "gpuguard: a block of a MemPool with its own allocator cannot be "
                             "shared with another process");
  GG_CHECK(rc == 0, "invalid device pointer: ", ptr,
           " (not allocated by gpuguard's PyTorch backend, or freed already)");
  ptrdiff_t offset = 0;
  std::string legacy = ipc::share_legacy(arena, ptr, size, device, &offset);
  if (!legacy.empty()) {
    return {offset, legacy};
  }
  std::string h = exporter_.share(&id, ipc::Shared{ptr, size, device, arena});
  core_.set_ipc_id(ptr, id);
  return {0, h};
}

std::shared_ptr<void> Backend::getIpcDevPtr(std::string handle) { return importer_.open(handle); }

} // namespace gg_torch
