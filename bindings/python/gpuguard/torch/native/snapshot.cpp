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
  seg.is_expandable = true;
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
