/* adapter.cpp (gpuguard.torch) — the core's arenas, block table and statistics: every allocation
 * and free of gpuguard's PyTorch backend passes here once (see adapter.h for the rules). */
#include "adapter.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace gg_torch {

void assert_failed(const char *what, const char *file, int line) {
  fprintf(stderr, "gpuguard-torch: invariant broken at %s:%d: %s\n", file, line, what);
  abort();
}

Block::Extra &Block::more() {
  if (!extra) {
    extra = std::make_unique<Extra>();
  }
  return *extra;
}

namespace {

size_t rounded(size_t n) { return (n + kQuantum - 1) / kQuantum * kQuantum; }

int size_class(size_t size) { return size <= kSmallMax ? kSmall : kLarge; }

} // namespace

Adapter::Adapter(const Runtime &rt, const gg_arena_options_t &defaults)
    : rt_(rt), defaults_(defaults) {
  trace_init();
}

Adapter::~Adapter() {
  for (Recorded &r : recorded_) {
    for (void *e : r.events) {
      rt_.event_destroy(e);
    }
  }
  for (auto &kv : pools_) {
    for (auto &sa : kv.second->arenas) {
      gg_arena_destroy(sa.second);
    }
    for (auto &seg : kv.second->segments) {
      try {
        seg.second.custom->free(reinterpret_cast<void *>(seg.first));
      } catch (...) { /* a destructor goes on: the memory goes with the process */
      }
    }
  }
  for (int d = 0; d < kMaxDevices; d++) {
    if (owned_[d]) {
      gg_arena_destroy(arenas_[d].load());
    }
  }
}

/* ---- arenas ---------------------------------------------------------------------------------- */

gg_arena_t *Adapter::device_arena_if_any(int device) const {
  return device >= 0 && device < kMaxDevices ? arenas_[device].load(std::memory_order_acquire)
                                             : nullptr;
}

int Adapter::device_arena(int device, gg_arena_t **out) {
  *out = nullptr;
  if (bad_device(device)) {
    return GG_EINVAL;
  }
  gg_arena_t *a = arenas_[device].load(std::memory_order_acquire);
  if (a) {
    *out = a;
    return 0;
  }
  std::lock_guard<std::mutex> g(make_mu_);
  a = arenas_[device].load();
  if (!a) {
    gg_arena_options_t o = defaults_;
    o.device = device;
    o.flags |= GG_ARENA_KEEP_HOLES; /* tensors come back in the sizes they left */
    o.name = o.name ? o.name : "torch";
    int rc = gg_arena_create(&a, &o);
    if (rc < 0) {
      return rc;
    }
    owned_[device] = true;
    std::lock_guard<std::mutex> held(mu_); /* the limit leaves room for the custom segments held */
    if (limit_arena_locked(device, a) < 0) {
      fprintf(stderr, "gpuguard: the memory fraction of device %d: %s\n", device, gg_last_error());
    }
    arenas_[device].store(a, std::memory_order_release);
  }
  *out = a;
  return 0;
}

void Adapter::set_first_limit(int device, size_t bytes) {
  if (bad_device(device)) {
    return;
  }
  std::lock_guard<std::mutex> g(mu_);
  limits_[device] = bytes;
}

int Adapter::use_arena(int device, gg_arena_t *arena) {
  if (bad_device(device) || !arena) {
    return GG_EINVAL;
  }
  gg_arena_options_t o;
  int rc = gg_arena_get_options(arena, &o);
  if (rc < 0) {
    return rc;
  }
  if (o.flags & GG_ARENA_NO_STREAM) {
    return GG_EINVAL; /* a freed block would be handed out while PyTorch's kernels may use it */
  }
  std::lock_guard<std::mutex> g(make_mu_);
  gg_arena_t *have = arenas_[device].load();
  if (have && have != arena) {
    return GG_ESTATE;
  }
  arenas_[device].store(arena, std::memory_order_release);
  return 0;
}

std::vector<gg_arena_t *> Adapter::arenas_of(int device) {
  std::vector<gg_arena_t *> out;
  if (gg_arena_t *a = device_arena_if_any(device)) {
    out.push_back(a);
  }
  std::lock_guard<std::mutex> g(mu_);
  for (auto &kv : pools_) {
    const Pool &p = *kv.second;
    if (p.device != device) {
      continue;
    }
    for (auto &sa : p.arenas) {
      out.push_back(sa.second);
    }
    if (p.given && std::find(out.begin(), out.end(), p.given) == out.end()) {
      out.push_back(p.given);
    }
  }
  return out;
}

/* ---- blocks ---------------------------------------------------------------------------------- */

/* The default pool: the device's arena in stream order, and on a failure for want of memory what
 * PyTorch's allocator does too — free the pools nobody uses, retry, then try the pools that serve
 * out-of-memory allocations (MemPool use_on_oom). */
int Adapter::default_alloc(size_t n, int device, Stream stream, void **ptr, Pool **pool,
                           gg_arena_t **used, bool *pinned) {
  gg_arena_t *a = nullptr;
  int rc = device_arena(device, &a);
  *used = a;
  if (rc == 0) {
    rc = gg_alloc_on(a, n, stream, ptr);
  }
  if (rc == GG_ENOMEM && n_recorded_.load() && !capturing_maybe()) {
    drain_recorded(true); /* blocks waiting for the streams they were recorded on */
    rc = gg_alloc_on(a, n, stream, ptr);
  }
  if (rc == GG_ENOMEM && release_freeable(device) > 0) {
    {
      std::lock_guard<std::mutex> g(mu_);
      dev_[device].num_alloc_retries++;
    }
    rc = gg_alloc_on(a, n, stream, ptr);
  }
  if (rc == GG_ENOMEM && relimit(device)) {
    rc = gg_alloc_on(a, n, stream, ptr);
  }
  if (rc != GG_ENOMEM) {
    return rc;
  }
  /* Each such pool is used without the lock: a use held on it keeps another thread's empty_cache
   * or release from freeing it meanwhile. The one that serves keeps its use until alloc() has
   * counted the block in it (*pinned); the others give theirs back here. */
  std::vector<Pool *> spare;
  {
    std::lock_guard<std::mutex> g(mu_);
    for (auto &kv : pools_) {
      if (kv.second->use_on_oom && kv.second->device == device) {
        kv.second->use_count++;
        spare.push_back(kv.second.get());
      }
    }
  }
  *used = nullptr; /* the serving pool's arena; none for a custom allocator's block */
  Pool *served = nullptr;
  for (Pool *p : spare) {
    /* A custom allocator's pool lends a block it has cached, never a new segment (PyTorch's rule:
     * get_free_block only). The arena of a pool tried before and out of room is not this block's.
     */
    gg_arena_t *arena = nullptr;
    int got = p->custom ? custom_alloc(*p, n, stream, ptr, false)
                        : pool_alloc(*p, n, stream, ptr, &arena);
    if (got == 0) {
      served = p;
      *used = arena;
      break;
    }
  }
  std::lock_guard<std::mutex> g(mu_);
  for (Pool *p : spare) {
    if (p != served) {
      GG_TORCH_ASSERT(p->use_count > 0);
      p->use_count--;
    }
  }
  *pool = served;
  *pinned = served != nullptr;
  return served ? 0 : rc;
}

size_t block_bytes(size_t n, size_t divisions) {
  constexpr size_t kMinBlock = 512; /* PyTorch's smallest block: the rule starts above 512 * d */
  if (n < kMinBlock) {
    return kMinBlock; /* tiny tensors take 512 bytes, as in PyTorch's allocator (and figures) */
  }
  if (divisions > 1 && n > kMinBlock * divisions && (n & (n - 1)) != 0) {
    size_t floor = size_t(1) << (63 - __builtin_clzll(n));
    size_t step = floor >> (63 - __builtin_clzll(divisions));
    if (step == 0) {
      return floor << 1;
    }
    size_t down = n & ~(step - 1);
    return rounded(down == n ? n : down + step);
  }
  return rounded(n);
}

int Adapter::alloc(size_t n, int device, Stream stream, std::shared_ptr<void> context, void **ptr,
                   PoolId *pool_id, size_t divisions) {
  *ptr = nullptr;
  if (bad_device(device)) {
    return GG_EINVAL;
  }
  if (n == 0) {
    return 0;
  }
  if (deaths_.load(std::memory_order_relaxed) != seen_deaths_.load(std::memory_order_relaxed) ||
      n_held_.load(std::memory_order_relaxed)) {
    sweep();
  }
  /* Never while a graph may capture: asking a recorded event's state then would end the capture
   * (the events were recorded outside it). The blocks wait for the next call after it. */
  if (n_recorded_.load(std::memory_order_relaxed) && !capturing_maybe()) {
    drain_recorded(false);
  }
  Pool *pool = nullptr;
  gg_arena_t *used = nullptr;
  bool pinned = false; /* a use_on_oom pool served it and holds a use until the block counts */
  size_t bytes = block_bytes(n, divisions);
  int rc = capturing_maybe() ? route(device, stream, &pool) : 0;
  if (rc == 0 && pool) {
    rc = pool_alloc(*pool, bytes, stream, ptr, &used);
  } else if (rc == 0) {
    rc = default_alloc(bytes, device, stream, ptr, &pool, &used, &pinned);
  }
  if (rc < 0) {
    return rc;
  }
  Block b;
  b.requested = n;
  b.size = bytes;
  b.stream = stream;
  b.device = device;
  b.pool = pool;
  b.arena = used; /* nullptr for a custom allocator's block */
  if (context) {
    b.more().context = std::move(context);
  }
  if (!pool || pool->implicit) {
    trace('a', *ptr, n, stream);
  }
  std::lock_guard<std::mutex> g(mu_);
  account_locked(b, true);
  if (pool) {
    pool->live++;
    *pool_id = pool->id;
    if (pinned) {
      GG_TORCH_ASSERT(pool->use_count > 0);
      pool->use_count--; /* the block keeps the pool now */
    }
  } else {
    *pool_id = PoolId{};
  }
  bool fresh = insert_locked(*ptr, std::move(b));
  GG_TORCH_ASSERT(fresh); /* an arena never hands out a live block twice */
  (void)fresh;
  return 0;
}

/* The table's entry for a new block: a node a free left behind when there is one, so a steady
 * allocation and free make no heap call for the table (two before: ~65 instructions a pair). */
bool Adapter::insert_locked(void *ptr, Block &&b) {
  if (spare_.empty()) {
    return blocks_.emplace(ptr, std::move(b)).second;
  }
  auto node = std::move(spare_.back());
  spare_.pop_back();
  node.key() = ptr;
  node.mapped() = std::move(b);
  return blocks_.insert(std::move(node)).inserted;
}

/* Takes the block out of the table, keeping its node for the next allocation (a bounded few). */
Block Adapter::remove_locked(std::unordered_map<void *, Block>::iterator it) {
  auto node = blocks_.extract(it);
  Block b = std::move(node.mapped());
  if (spare_.size() < kSpareNodes) {
    spare_.push_back(std::move(node));
  }
  return b;
}

namespace {

template <bool kIn> void move(Stat &s, int64_t n) {
  if (kIn) {
    s.add(n);
  } else {
    s.sub(n);
  }
}

/* A block's allocation figures (allocation, allocated_bytes), in its size class and in all. */
template <bool kIn> void move_allocated(DeviceStats &d, int k, const Block &b) {
  move<kIn>(d.allocation[kAll], 1);
  move<kIn>(d.allocation[k], 1);
  move<kIn>(d.allocated_bytes[kAll], int64_t(b.size));
  move<kIn>(d.allocated_bytes[k], int64_t(b.size));
}

/* Its active figures (active, active_bytes, requested_bytes). */
template <bool kIn> void move_active(DeviceStats &d, int k, const Block &b) {
  move<kIn>(d.active[kAll], 1);
  move<kIn>(d.active[k], 1);
  move<kIn>(d.active_bytes[kAll], int64_t(b.size));
  move<kIn>(d.active_bytes[k], int64_t(b.size));
  move<kIn>(d.requested_bytes[kAll], int64_t(b.requested));
  move<kIn>(d.requested_bytes[k], int64_t(b.requested));
}

} // namespace

/* `active`: with the allocation figures, the active and requested ones (not for a free that waits
 * for the streams the block was recorded on: it stays active until then, as in PyTorch's). Every
 * allocation and free passes here: straight-line code, no per-figure branch. */
void Adapter::account_locked(const Block &b, bool add, bool active) {
  DeviceStats &d = dev_[b.device];
  int k = size_class(b.size);
  if (add) {
    move_allocated<true>(d, k, b);
    if (active) {
      move_active<true>(d, k, b);
    }
  } else {
    move_allocated<false>(d, k, b);
    if (active) {
      move_active<false>(d, k, b);
    }
  }
}

/* A recorded block the streams are done with: no longer active (its allocation went at its free).
 */
void Adapter::deactivate_locked(const Block &b) {
  move_active<false>(dev_[b.device], size_class(b.size), b);
}

int Adapter::free(void *ptr, Freed *out) {
  Block b;
  bool later = false;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = blocks_.find(ptr);
    if (it == blocks_.end()) {
      return GG_ENOTFOUND;
    }
    b = remove_locked(it);
    /* recorded on other streams, outside any capture: given back once they are done with it */
    later = !b.pool && b.extra && !b.extra->recorded.empty() && !capturing_maybe();
    account_locked(b, false, !later);
  }
  out->device = b.device;
  out->size = b.size;
  out->requested = b.requested;
  out->stream = b.stream;
  out->pool = b.pool ? b.pool->id : PoolId{};
  out->ipc_id = b.extra ? b.extra->ipc_id : 0;
  out->context = b.extra ? b.extra->context : nullptr;
  if (later && defer_free(ptr, b)) {
    return 0;
  }
  if (later) { /* no event could be recorded: the arena's stream joins them instead */
    std::lock_guard<std::mutex> g(mu_);
    deactivate_locked(b);
  }
  if (!b.pool) {
    trace('f', ptr, 0, b.stream);
    free_default(ptr, b);
  } else {
    free_pooled(ptr, b);
  }
  return 0;
}

/* In stream order on the block's arena; the streams it was recorded on are joined first. A failure
 * leaves the block with its arena (never handed out while work may use it) and says so once. */
void Adapter::free_default(void *ptr, const Block &b) {
  if (hold_for_graph(ptr, b)) {
    return;
  }
  int rc = 0;
  if (b.extra) {
    for (Stream s : b.extra->recorded) {
      rc = gg_arena_join_stream(b.arena, s);
      if (rc < 0) {
        break;
      }
    }
  }
  if (rc >= 0) {
    rc = gg_free_on(b.arena, ptr, b.stream);
  }
  if (rc < 0) {
    fprintf(stderr, "gpuguard: freeing %p on device %d failed: %s\n", ptr, b.device,
            gg_last_error());
  }
}

int Adapter::record_stream(void *ptr, Stream stream) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = blocks_.find(ptr);
  if (it == blocks_.end()) {
    return GG_ENOTFOUND;
  }
  Block &b = it->second;
  if (stream == b.stream) {
    return 0;
  }
  std::vector<Stream> &r = b.more().recorded;
  if (std::find(r.begin(), r.end(), stream) == r.end()) {
    r.push_back(stream);
  }
  return 0;
}

bool Adapter::block_size(void *ptr, size_t *size) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = blocks_.find(ptr);
  if (it == blocks_.end()) {
    return false;
  }
  *size = it->second.size;
  return true;
}

int Adapter::share_info(void *ptr, gg_arena_t **arena, size_t *size, int *device,
                        uint64_t *ipc_id) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = blocks_.find(ptr);
  if (it == blocks_.end()) {
    return GG_ENOTFOUND;
  }
  Block &b = it->second;
  if (!b.arena) {
    return GG_ENOTSUP; /* a custom allocator's memory */
  }
  *arena = b.arena;
  *size = b.size;
  *device = b.device;
  *ipc_id = b.extra ? b.extra->ipc_id : 0; /* kept for the block's next share (set_ipc_id) */
  return 0;
}

void Adapter::set_ipc_id(void *ptr, uint64_t id) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = blocks_.find(ptr);
  if (it != blocks_.end()) {
    it->second.more().ipc_id = id;
  }
}

/* ---- diagnostics ----------------------------------------------------------------------------- */

Adapter::Counters Adapter::counters() {
  std::lock_guard<std::mutex> g(mu_);
  Counters c{pools_.size(), 0, blocks_.size(), uint64_t(n_announced_.load())};
  for (const auto &kv : blocks_) {
    c.n_pool_blocks += kv.second.pool != nullptr;
  }
  return c;
}

std::vector<std::pair<PoolId, std::pair<int, size_t>>> Adapter::pool_list() {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<std::pair<PoolId, std::pair<int, size_t>>> out;
  for (const auto &kv : pools_) {
    out.push_back({kv.first, {kv.second->use_count, kv.second->live}});
  }
  return out;
}

/* The whole table against the figures kept as it changed: each pool's live count, each device's
 * current blocks and bytes. */
int Adapter::check() {
  std::lock_guard<std::mutex> g(mu_);
  std::map<const Pool *, size_t> live;
  int64_t blocks[kMaxDevices] = {};
  int64_t bytes[kMaxDevices] = {};
  for (const auto &kv : blocks_) {
    const Block &b = kv.second;
    live[b.pool]++;
    blocks[b.device]++;
    bytes[b.device] += int64_t(b.size);
    if (b.size < rounded(b.requested) || b.size % kQuantum ||
        (!b.arena && !(b.pool && b.pool->custom))) {
      return GG_ESTATE;
    }
  }
  for (const Held &h : deferred_) {
    if (h.pool) {
      live[h.pool]++; /* freed in a capture after record_stream: the pool's until it ends */
    }
  }
  for (const auto &kv : pools_) {
    if (kv.second->live != live[kv.second.get()] || kv.first != kv.second->id) {
      return GG_ESTATE;
    }
  }
  if (check_segments_locked() < 0) {
    return GG_ESTATE;
  }
  for (int d = 0; d < kMaxDevices; d++) {
    if (dev_[d].allocation[kAll].current != blocks[d] ||
        dev_[d].allocated_bytes[kAll].current != bytes[d] ||
        dev_[d].allocation[kSmall].current + dev_[d].allocation[kLarge].current != blocks[d]) {
      return GG_ESTATE;
    }
  }
  return 0;
}

} // namespace gg_torch
