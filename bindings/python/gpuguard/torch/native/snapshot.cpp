/* snapshot.cpp (gpuguard.torch) — torch.cuda.memory_snapshot() for gpuguard's PyTorch backend: each
 * mapped chunk of the arenas is a segment, the live blocks in it its allocated blocks, the gaps
 * free ones. */
#include "facade.h"

namespace gg_torch {

namespace {

/* One segment: the live blocks inside [r.addr, r.addr + r.size), gaps between them as free blocks.
 * `k` is the index of the first live block not before the range (the blocks are sorted). */
cda::SegmentInfo segment_of(const Range &r, const std::vector<BlockView> &live, size_t *k) {
  cda::SegmentInfo seg;
  seg.device = c10::DeviceIndex(r.device);
  seg.address = r.addr;
  seg.total_size = r.size;
  seg.is_large = true;
  seg.is_expandable = !r.custom; /* a custom allocator's segment is what it gave, whole */
  seg.owner_private_pool_id = mempool_id(r.owner);
  uintptr_t at = r.addr;
  uintptr_t end = r.addr + r.size;
  while (*k < live.size() && live[*k].addr < r.addr) {
    (*k)++;
  }
  for (; *k < live.size() && live[*k].addr < end; (*k)++) {
    const BlockView &b = live[*k];
    if (b.addr > at) {
      cda::BlockInfo gap;
      gap.size = b.addr - at;
      seg.blocks.push_back(gap);
    }
    cda::BlockInfo bi;
    bi.size = std::min<size_t>(b.size, end - b.addr);
    bi.requested_size = b.requested;
    bi.allocated = true;
    bi.active = true;
    bi.context_when_allocated = std::static_pointer_cast<c10::GatheredContext>(b.context);
    seg.blocks.push_back(bi);
    seg.allocated_size += bi.size;
    seg.active_size += bi.size;
    seg.requested_size += b.requested;
    seg.stream = static_cast<cudaStream_t>(b.stream);
    at = b.addr + bi.size;
  }
  if (at < end) {
    cda::BlockInfo gap;
    gap.size = end - at;
    seg.blocks.push_back(gap);
  }
  return seg;
}

} // namespace

/* Chunks are PyTorch's expandable segments: each one mapped is a segment_map entry, each one given
 * back a segment_unmap (with the stack of who gave it back, under context "all"). Compared with
 * what was traced before only when the device's map and unmap counts moved. */
void Backend::trace_segments(int device, std::shared_ptr<c10::GatheredContext> ctx) {
  Reserved r = core_.reserved(device);
  std::vector<std::pair<uintptr_t, size_t>> mapped;
  std::vector<std::pair<uintptr_t, size_t>> unmapped;
  {
    std::lock_guard<std::mutex> g(seg_mu_);
    if (r.maps + r.unmaps == seg_sig_[device]) {
      return;
    }
    seg_sig_[device] = r.maps + r.unmaps;
    std::map<std::pair<int, uintptr_t>, size_t> now;
    for (const Range &x : core_.ranges(PoolId{})) {
      if (x.device == device) {
        now[{device, x.addr}] = x.size;
      }
    }
    for (auto it = segments_.lower_bound({device, 0});
         it != segments_.end() && it->first.first == device;) {
      auto hit = now.find(it->first);
      if (hit == now.end() || hit->second != it->second) {
        unmapped.push_back({it->first.second, it->second});
        it = segments_.erase(it);
      } else {
        ++it;
      }
    }
    for (const auto &kv : now) {
      if (segments_.emplace(kv.first, kv.second).second) {
        mapped.push_back({kv.first.second, kv.second});
      }
    }
  }
  for (const auto &u : unmapped) {
    history_.record(cda::TraceEntry::SEGMENT_UNMAP, device, reinterpret_cast<void *>(u.first),
                    u.second, nullptr, PoolId{}, ctx);
  }
  for (const auto &m : mapped) {
    history_.record(cda::TraceEntry::SEGMENT_MAP, device, reinterpret_cast<void *>(m.first),
                    m.second, nullptr, PoolId{}, ctx);
  }
}

cca::SnapshotInfo Backend::snapshot(c10::MempoolId_t id, bool include_traces) {
  std::vector<Range> ranges = core_.ranges(pool_id(id));
  std::vector<BlockView> live = core_.blocks_sorted();
  cca::SnapshotInfo out;
  size_t k = 0;
  for (const Range &r : ranges) {
    out.segments.push_back(segment_of(r, live, &k));
  }
  if (include_traces) {
    out.device_traces = history_.traces(device_count_);
  }
  out.config_metadata.garbage_collection_threshold = 0.0;
  out.config_metadata.max_split_size = SIZE_MAX;
  out.config_metadata.pinned_num_register_threads = 1;
  out.config_metadata.expandable_segments = true;
  out.config_metadata.release_lock_on_malloc = false;
  out.config_metadata.pinned_use_host_register = false;
#if GG_TORCH_AT_LEAST(2, 9)
  out.config_metadata.graph_capture_record_stream_reuse = false;
#endif
  out.config_metadata.last_allocator_settings = "gpuguard";
  return out;
}

} // namespace gg_torch
