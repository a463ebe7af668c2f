/* adapter_custom.cpp (gpuguard.torch) — the segments of MemPools with their own allocator
 * (MemPool(allocator=...), e.g. ncclMemAlloc or cudaMallocManaged): taken in PyTorch's segment
 * sizes, blocks cut from them first fit by address, freed blocks cached and coalesced, a segment
 * given back only whole, and every segment counted against the device's limit (see adapter.h). */
#include "adapter.h"

#include <algorithm>
#include <cstdio>
#include <set>

namespace gg_torch {

namespace {

constexpr size_t kMiB = size_t(1) << 20;
constexpr size_t kSmallSegment = 2 * kMiB;  /* PyTorch's kSmallBuffer */
constexpr size_t kLargeSegment = 20 * kMiB; /* kLargeBuffer */
constexpr size_t kMinLargeAlloc = 10 * kMiB;
constexpr size_t kRoundLarge = 2 * kMiB;
constexpr size_t kLimitStep = 512;

uintptr_t addr_of(const void *p) { return reinterpret_cast<uintptr_t>(p); }

} // namespace

size_t segment_bytes(size_t n) {
  if (n <= kSmallMax) {
    return kSmallSegment;
  }
  if (n < kMinLargeAlloc) {
    return kLargeSegment;
  }
  return (n + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

/* ---- the limit ------------------------------------------------------------------------------- */

/* What the device's pools hold beside its arena: custom segments held and asked for, and what the
 * pools' own arenas (CUDA graphs, MemPools) have mapped now. PyTorch's fraction covers all of it,
 * as its memory_reserved() does (a graph an earlier test left alive counts). */
size_t Adapter::held_beside_locked(int device) {
  const SegmentTotals &c = custom_[device];
  size_t held = size_t(c.bytes + c.asking);
  for (auto &kv : pools_) {
    if (kv.second->device != device) {
      continue;
    }
    for (auto &sa : kv.second->arenas) {
      gg_arena_stats_t s{};
      if (gg_arena_stats_quiet(sa.second, &s) == 0) {
        held += s.bytes_mapped;
      }
    }
  }
  return held;
}

/* The device's arena may map what the limit leaves once what is held beside it is counted (as of
 * now: a pool's arena that grows later is counted at the next limit or custom segment). Never 0,
 * which would mean no limit to the arena. */
int Adapter::limit_arena_locked(int device, gg_arena_t *a) {
  size_t limit = limits_[device];
  if (!limit || !a) {
    return 0;
  }
  size_t beside = held_beside_locked(device);
  size_t room = limit > beside ? limit - beside : 1;
  return gg_arena_set_limit(a, room);
}

/* Out of memory under a limit: the arena's share counted again (a pool counted in it may be gone
 * since). True when that left it more room. */
bool Adapter::relimit(int device) {
  std::lock_guard<std::mutex> g(mu_);
  gg_arena_t *a = arenas_[device].load();
  size_t before = 0;
  if (!limits_[device] || !a || gg_arena_get_limit(a, &before) < 0) {
    return false;
  }
  size_t after = 0;
  return limit_arena_locked(device, a) == 0 && gg_arena_get_limit(a, &after) == 0 && after > before;
}

int Adapter::set_limit(int device, size_t bytes) {
  if (bad_device(device)) {
    return GG_EINVAL;
  }
  std::lock_guard<std::mutex> g(mu_);
  limits_[device] = bytes;
  return limit_arena_locked(device, arenas_[device].load());
}

/* Room under the device's limit for a new segment, counted at once (asking) so that two threads
 * cannot both take the last of it. The arena's limit is lowered before its mapped bytes are read:
 * it cannot grow into the room between the two. GG_ENOMEM: no room. */
int Adapter::reserve_locked(int device, int64_t bytes) {
  SegmentTotals &c = custom_[device];
  c.asking += bytes;
  size_t limit = limits_[device];
  if (!limit) {
    return 0;
  }
  gg_arena_t *a = arenas_[device].load();
  limit_arena_locked(device, a);
  gg_arena_stats_t s{};
  if (a && gg_arena_stats_quiet(a, &s) != 0) {
    s.bytes_mapped = 0;
  }
  /* A fraction's limit can fall a byte short of the sum it was made from (PyTorch's own test sets
   * (80 MiB + reserved) / total, one time in 20 a byte less once multiplied back): segments are
   * whole 2 MiB, so the limit counts to the next 512 bytes. */
  size_t room = (limit + kLimitStep - 1) / kLimitStep * kLimitStep;
  if (s.bytes_mapped + held_beside_locked(device) <= room) {
    return 0;
  }
  unreserve_locked(device, bytes);
  return GG_ENOMEM;
}

/* A reserve that brought no segment: its room goes back to the arena. */
void Adapter::unreserve_locked(int device, int64_t bytes) {
  custom_[device].asking -= bytes;
  limit_arena_locked(device, arenas_[device].load());
}

/* ---- blocks ---------------------------------------------------------------------------------- */

/* First fit by address among the pool's segments of the stream and size class: the block is cut
 * from the front of the first free range that holds it. */
bool Adapter::cut_locked(Pool &p, size_t n, Stream stream, void **ptr) {
  bool small = n <= kSmallMax;
  for (auto &kv : p.segments) {
    Segment &s = kv.second;
    if (s.stream != stream || s.small != small) {
      continue;
    }
    auto it =
        std::find_if(s.free.begin(), s.free.end(),
                     [n](const std::pair<const uintptr_t, size_t> &r) { return r.second >= n; });
    if (it == s.free.end()) {
      continue;
    }
    uintptr_t at = it->first;
    size_t rest = it->second - n;
    s.free.erase(it);
    if (rest) {
      s.free.emplace(at + n, rest);
    }
    s.live += n;
    GG_TORCH_ASSERT(at >= kv.first && at + n <= kv.first + s.size);
    GG_TORCH_ASSERT(s.live <= s.size);
    *ptr = reinterpret_cast<void *>(at);
    return true;
  }
  return false;
}

/* `custom`: the allocator that gave it, which may no longer be the pool's (create_or_incref gives
 * a pool with no segment the allocator of its newest MemPool, while this one's call ran). */
void Adapter::add_segment_locked(Pool &p, void *base, size_t bytes, Stream stream, bool small,
                                 std::shared_ptr<Custom> custom) {
  SegmentTotals &c = custom_[p.device];
  c.asking -= int64_t(bytes);
  c.bytes += int64_t(bytes);
  c.count++;
  c.maps++;
  c.peak = std::max(c.peak, c.bytes);
  GG_TORCH_ASSERT(c.asking >= 0);
  Segment s;
  s.size = bytes;
  s.stream = stream;
  s.small = small;
  s.custom = std::move(custom);
  s.free.emplace(addr_of(base), bytes);
  auto ins = p.segments.emplace(addr_of(base), std::move(s));
  GG_TORCH_ASSERT(ins.second); /* an allocator never hands out live memory twice */
  auto next = std::next(ins.first);
  GG_TORCH_ASSERT(next == p.segments.end() || next->first >= addr_of(base) + bytes);
  (void)next;
}

/* A block of the pool's cached segments; else, with `grow`, a new segment of PyTorch's size from
 * the pool's allocator, if the device's limit has room. The allocator is called without the lock
 * (cudaMalloc-like calls are slow and may synchronise). */
int Adapter::custom_alloc(Pool &p, size_t n, Stream stream, void **ptr, bool grow) {
  size_t bytes = segment_bytes(n);
  std::shared_ptr<Custom> custom;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (cut_locked(p, n, stream, ptr)) {
      return 0;
    }
    if (!grow) {
      return GG_ENOMEM;
    }
    int rc = reserve_locked(p.device, int64_t(bytes));
    if (rc < 0) {
      return rc;
    }
    custom = p.custom;
  }
  void *base = nullptr;
  try {
    base = custom->alloc(bytes, stream);
  } catch (...) {
    std::lock_guard<std::mutex> g(mu_);
    unreserve_locked(p.device, int64_t(bytes));
    throw;
  }
  std::lock_guard<std::mutex> g(mu_);
  if (!base) {
    unreserve_locked(p.device, int64_t(bytes));
    return GG_ENOMEM;
  }
  bool small = n <= kSmallMax;
  add_segment_locked(p, base, bytes, stream, small, std::move(custom));
  bool cut = cut_locked(p, n, stream, ptr); /* the new segment holds it, if no other does */
  GG_TORCH_ASSERT(cut);
  return cut ? 0 : GG_ESTATE;
}

/* The block's bytes back to the free ranges of its segment, joined with the ranges it touches. */
void Adapter::custom_free_locked(Pool &p, void *ptr, size_t n) {
  uintptr_t at = addr_of(ptr);
  auto seg = p.segments.upper_bound(at);
  GG_TORCH_ASSERT(seg != p.segments.begin()); /* the block table holds only blocks we cut */
  if (seg == p.segments.begin()) {
    return;
  }
  --seg;
  Segment &s = seg->second;
  GG_TORCH_ASSERT(at + n <= seg->first + s.size && s.live >= n);
  auto next = s.free.lower_bound(at);
  GG_TORCH_ASSERT(next == s.free.end() || next->first >= at + n);
  uintptr_t start = at;
  size_t len = n;
  if (next != s.free.begin()) {
    auto prev = std::prev(next);
    GG_TORCH_ASSERT(prev->first + prev->second <= at);
    if (prev->first + prev->second == at) {
      start = prev->first;
      len += prev->second;
      s.free.erase(prev);
    }
  }
  if (next != s.free.end() && next->first == at + n) {
    len += next->second;
    s.free.erase(next);
  }
  s.free.emplace(start, len);
  s.live -= n;
}

/* ---- giving segments back -------------------------------------------------------------------- */

/* Takes the pool's wholly free segments out of it; they stay counted until give_back. */
void Adapter::take_spent_locked(Pool &p, std::vector<Spent> *out) {
  for (auto it = p.segments.begin(); it != p.segments.end();) {
    const Segment &s = it->second;
    if (s.live) {
      ++it;
      continue;
    }
    GG_TORCH_ASSERT(s.free.size() == 1 && s.free.begin()->first == it->first &&
                    s.free.begin()->second == s.size);
    out->push_back(Spent{it->first, s.size, p.device, s.custom});
    it = p.segments.erase(it);
  }
}

/* To their allocators (the caller synchronised each device under the lock first: what may still use
 * them, a block freed in stream order, a kernel queued before, is done), then out of the figures
 * and the limit. A free that throws (c10::Error out of PyTorch) stops nothing: every segment has
 * left its pool and goes out of the figures; the first error is returned, for the caller to throw
 * once its own work is done. */
std::exception_ptr Adapter::give_back(const std::vector<Spent> &spent) {
  if (spent.empty()) {
    return nullptr;
  }
  std::set<int> devices;
  for (const Spent &x : spent) {
    devices.insert(x.device);
  }
  std::exception_ptr first;
  for (const Spent &x : spent) {
    try {
      x.custom->free(reinterpret_cast<void *>(x.addr));
    } catch (...) {
      if (!first) {
        first = std::current_exception();
      }
    }
  }
  std::lock_guard<std::mutex> g(mu_);
  for (const Spent &x : spent) {
    SegmentTotals &c = custom_[x.device];
    c.bytes -= int64_t(x.size);
    c.count--;
    c.unmaps++;
    c.freed += int64_t(x.size);
    GG_TORCH_ASSERT(c.bytes >= 0 && c.count >= 0);
  }
  for (int d : devices) {
    limit_arena_locked(d, arenas_[d].load()); /* the arena gets the room back */
  }
  return first;
}

/* ---- diagnostics ----------------------------------------------------------------------------- */

/* Every segment against its rules, every custom block inside a segment of its pool and in no free
 * range, and the devices' totals against the segments held. */
int Adapter::check_segments_locked() {
  std::map<uintptr_t, size_t> live; /* segment address -> bytes of the blocks in it */
  /* A block inside a segment of its pool and in no free range. */
  auto in_segment = [&live](const Pool &p, uintptr_t at, size_t size) {
    auto seg = p.segments.upper_bound(at);
    if (seg == p.segments.begin()) {
      return false;
    }
    --seg;
    const Segment &s = seg->second;
    if (at + size > seg->first + s.size) {
      return false;
    }
    auto r = s.free.upper_bound(at);
    if (r != s.free.end() && r->first < at + size) {
      return false;
    }
    if (r != s.free.begin() && std::prev(r)->first + std::prev(r)->second > at) {
      return false;
    }
    live[seg->first] += size;
    return true;
  };
  for (const auto &kv : blocks_) {
    const Block &b = kv.second;
    if (b.pool && b.pool->custom && !in_segment(*b.pool, addr_of(kv.first), b.size)) {
      return GG_ESTATE;
    }
  }
  for (const Held &h : deferred_) { /* freed in a capture, waiting for its end */
    if (h.pool && h.pool->custom && !in_segment(*h.pool, addr_of(h.ptr), h.size)) {
      return GG_ESTATE;
    }
  }
  int64_t bytes[kMaxDevices] = {};
  int64_t count[kMaxDevices] = {};
  for (const auto &kv : pools_) {
    const Pool &p = *kv.second;
    uintptr_t prev_end = 0;
    for (const auto &sk : p.segments) {
      const Segment &s = sk.second;
      uintptr_t end = sk.first + s.size;
      if (!s.custom || sk.first < prev_end || s.live != live[sk.first]) {
        return GG_ESTATE;
      }
      size_t free = 0;
      uintptr_t at = sk.first; /* where the previous free range ends */
      for (const auto &r : s.free) {
        bool touches = free && r.first == at; /* not coalesced */
        if (r.second == 0 || r.first < at || touches || r.first + r.second > end) {
          return GG_ESTATE;
        }
        free += r.second;
        at = r.first + r.second;
      }
      if (free + s.live != s.size) {
        return GG_ESTATE;
      }
      bytes[p.device] += int64_t(s.size);
      count[p.device]++;
      prev_end = end;
    }
  }
  for (int d = 0; d < kMaxDevices; d++) {
    if (custom_[d].bytes != bytes[d] || custom_[d].count != count[d] || custom_[d].asking) {
      return GG_ESTATE;
    }
  }
  return 0;
}

} // namespace gg_torch
