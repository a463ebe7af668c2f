/* adapter_stats.cpp (gpuguard.torch) — the core's statistics: every figure of PyTorch's
 * memory_stats(), each filled in one place (adapter.h, DeviceStats, says what each one means). */
#include "adapter.h"

#include <algorithm>

namespace gg_torch {

namespace {

/* A figure that is only read, never counted as it changes: moved to `now`, the change counted
 * as allocated or freed. */
void move_to(Stat *s, int64_t now) {
  if (now > s->current) {
    s->add(now - s->current);
  } else if (now < s->current) {
    s->sub(s->current - now);
  }
}

void fill(Stat (&to)[3], const Stat &large) {
  to[kAll] = large;
  to[kLarge] = large;
  to[kSmall] = Stat{};
}

} // namespace

/* Every arena of the device now, plus what the arenas destroyed with their pools had. */
int64_t Adapter::allocated(int device) {
  if (bad_device(device)) {
    return 0;
  }
  std::lock_guard<std::mutex> g(mu_);
  return dev_[device].allocated_bytes[kAll].current;
}

Reserved Adapter::reserved(int device) {
  Reserved r;
  if (bad_device(device)) {
    return r;
  }
  for (gg_arena_t *a : arenas_of(device)) {
    gg_arena_stats_t s{};
    if (gg_arena_stats_quiet(a, &s) != 0) {
      continue;
    }
    r.current += int64_t(s.bytes_mapped);
    r.peak += int64_t(s.peak_mapped);
    r.segments += int64_t(s.n_chunks);
    r.waits += s.n_stream_waits;
    r.maps += int64_t(s.n_maps);
    r.unmaps += int64_t(s.n_unmaps);
    r.freed += int64_t(s.bytes_trimmed);
  }
  std::lock_guard<std::mutex> g(mu_);
  const SegmentTotals &c = custom_[device]; /* the custom allocators' segments held and given */
  r.current += c.bytes;
  r.peak += c.peak;
  r.segments += c.count;
  r.maps += c.maps;
  r.unmaps += c.unmaps;
  r.freed += c.freed;
  const Reserved &gone = gone_[device];
  r.freed += gone.freed;
  r.maps += gone.maps;
  r.unmaps += gone.unmaps;
  r.waits += gone.waits;
  r.peak = std::max(r.peak, r.current);
  return r;
}

/* What an arena had, kept when it is destroyed with its pool: all its memory counts as freed. */
void Adapter::note_gone(int device, gg_arena_t *a) {
  gg_arena_stats_t s{};
  if (gg_arena_stats_quiet(a, &s) != 0) {
    return;
  }
  std::lock_guard<std::mutex> g(mu_);
  Reserved &gone = gone_[device];
  gone.freed += int64_t(s.bytes_trimmed + s.bytes_mapped);
  gone.maps += int64_t(s.n_maps);
  gone.unmaps += int64_t(s.n_unmaps + s.n_chunks);
  gone.waits += s.n_stream_waits;
}

/* The free stretches inside the mapped ranges that hold a live block of the device: what
 * PyTorch calls inactive split blocks (a wholly free range can be given back: not counted). */
void Adapter::free_stretches(int device, int64_t *count, int64_t *bytes) {
  *count = 0;
  *bytes = 0;
  std::vector<Range> rs = ranges(PoolId{});
  std::vector<std::pair<uintptr_t, uintptr_t>> live; /* [start, end) */
  {
    std::lock_guard<std::mutex> g(mu_);
    for (const auto &kv : blocks_) {
      if (kv.second.device == device) { /* an arena's block, or a custom segment's */
        uintptr_t at = reinterpret_cast<uintptr_t>(kv.first);
        live.push_back({at, at + kv.second.size});
      }
    }
  }
  std::sort(live.begin(), live.end());
  for (const Range &r : rs) {
    if (r.device != device) {
      continue;
    }
    uintptr_t end = r.addr + r.size;
    auto it = std::upper_bound(live.begin(), live.end(), std::make_pair(r.addr, r.addr));
    if (it != live.begin() && std::prev(it)->second > r.addr) {
      --it; /* a block that began in an earlier chunk */
    }
    uintptr_t at = r.addr;
    int64_t n = 0;
    int64_t sum = 0;
    bool used = false;
    for (; it != live.end() && it->first < end; ++it) {
      used = true;
      if (it->first > at) {
        n++;
        sum += int64_t(it->first - at);
      }
      at = std::max(at, std::min(it->second, end));
    }
    if (!used) {
      continue;
    }
    if (at < end) {
      n++;
      sum += int64_t(end - at);
    }
    *count += n;
    *bytes += sum;
  }
}

DeviceStats Adapter::stats(int device) {
  DeviceStats out;
  if (bad_device(device)) {
    return out;
  }
  Reserved r = reserved(device);
  int64_t n_free = 0;
  int64_t free_bytes = 0;
  free_stretches(device, &n_free, &free_bytes);
  std::lock_guard<std::mutex> g(mu_);
  out = dev_[device];
  Seen &s = seen_[device];
  s.reserved_peak = std::max(s.reserved_peak, r.peak);
  s.segment_peak = std::max(s.segment_peak, r.segments);
  Stat reserved;
  reserved.current = r.current;
  reserved.peak = s.reserved_peak;
  reserved.freed = r.freed - s.base.freed;
  reserved.allocated = r.current + r.freed - (s.base.current + s.base.freed);
  Stat segment;
  segment.current = r.segments;
  segment.peak = s.segment_peak;
  segment.allocated = r.maps - s.base.maps;
  segment.freed = r.unmaps - s.base.unmaps;
  move_to(&s.inactive, n_free);
  move_to(&s.inactive_bytes, free_bytes);
  fill(out.reserved_bytes, reserved);
  fill(out.segment, segment);
  fill(out.inactive_split, s.inactive);
  fill(out.inactive_split_bytes, s.inactive_bytes);
  out.num_sync_all_streams = int64_t(r.waits - s.base.waits);
  out.num_device_alloc = r.maps - s.base.maps;
  out.num_device_free = r.unmaps - s.base.unmaps;
  return out;
}

void Adapter::reset_peaks(int device) {
  if (bad_device(device)) {
    return;
  }
  for (gg_arena_t *a : arenas_of(device)) {
    gg_arena_reset_peak(a);
  }
  Reserved r = reserved(device);
  std::lock_guard<std::mutex> g(mu_);
  DeviceStats &d = dev_[device];
  for (Stat *st : {d.allocation, d.active, d.allocated_bytes, d.active_bytes, d.requested_bytes}) {
    for (int i = 0; i < 3; i++) {
      st[i].peak = st[i].current;
    }
  }
  custom_[device].peak = custom_[device].bytes;
  Seen &s = seen_[device];
  s.reserved_peak = r.current;
  s.segment_peak = r.segments;
  s.inactive.peak = s.inactive.current;
  s.inactive_bytes.peak = s.inactive_bytes.current;
}

void Adapter::reset_totals(int device) {
  if (bad_device(device)) {
    return;
  }
  Reserved r = reserved(device);
  std::lock_guard<std::mutex> g(mu_);
  DeviceStats &d = dev_[device];
  for (Stat *st : {d.allocation, d.active, d.allocated_bytes, d.active_bytes, d.requested_bytes}) {
    for (int i = 0; i < 3; i++) {
      st[i].allocated = 0;
      st[i].freed = 0;
    }
  }
  d.num_ooms = 0;
  d.num_alloc_retries = 0;
  Seen &s = seen_[device];
  s.base = r;
  for (Stat *st : {&s.inactive, &s.inactive_bytes}) {
    st->allocated = 0;
    st->freed = 0;
  }
}

size_t Adapter::note_oom(int device) {
  std::lock_guard<std::mutex> g(mu_);
  dev_[device].num_ooms++;
  return size_t(dev_[device].allocated_bytes[kAll].current);
}

} // namespace gg_torch
