/* adapter_pools.cpp (gpuguard.torch) — the core's private pools and captures: CUDA graph pools,
 * MemPools, captures nobody announced, and the default-pool blocks a graph keeps (see adapter.h).
 */
#include "adapter.h"

#include <map>
#include <set>

#include <algorithm>
#include <cstdio>

namespace gg_torch {

namespace {

/* The id of the pool of a capture nobody announced: PyTorch's own ids never have all bits set. */
constexpr uint64_t kImplicit = ~uint64_t(0);

/* What graph_retain's callback needs: the pool to mark and the counter that tells the adapter. */
struct Death {
  Pool *pool;
  std::atomic<uint64_t> *deaths;
};

/* Switches the thread to the relaxed capture mode for its lifetime. */
class Relaxed {
public:
  explicit Relaxed(const Runtime &rt) : rt_(rt) { rt_.relax(true, &saved_); }
  ~Relaxed() { rt_.relax(false, &saved_); }
  Relaxed(const Relaxed &) = delete;
  Relaxed &operator=(const Relaxed &) = delete;

private:
  const Runtime &rt_;
  int saved_ = 0;
};

} // namespace

void Adapter::graph_gone(void *user) {
  /* On the runtime's thread: marks only; the next adapter call frees (sweep). */
  auto *d = static_cast<Death *>(user);
  d->pool->dead.store(true, std::memory_order_release);
  d->deaths->fetch_add(1, std::memory_order_release);
  delete d;
}

Pool &Adapter::pool_locked(int device, PoolId id) {
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

/* The one routing rule for captures: the newest announced capture whose filter takes the stream;
 * else the pool of the capture the stream is in (made by implicit_pool_locked). */
Pool *Adapter::route_locked(int device, Stream stream, uint64_t capture) {
  for (auto it = captures_.rbegin(); it != captures_.rend(); ++it) {
    if (it->device == device && it->filter(stream)) {
      return &pool_locked(device, it->id);
    }
  }
  return capture ? implicit_of_locked(capture) : nullptr;
}

/* The live pool of the capture `capture` the backend made for it, if any. */
Pool *Adapter::implicit_of_locked(uint64_t capture) {
  auto it = pools_.find(PoolId{kImplicit, capture});
  return it == pools_.end() || it->second->dead.load() ? nullptr : it->second.get();
}

/* Only while a capture may be under way. The announced pools' filters come first: they ask what
 * they need themselves (use_mem_pool's asks nothing of the driver), so an allocation they take
 * makes no capture query of its own; the driver is asked only for a stream none of them takes,
 * or for every call with captures=any (a capture PyTorch did not announce). */
int Adapter::route(int device, Stream stream, Pool **out) {
  bool any = capture_any_.load(std::memory_order_relaxed);
  if (!any) {
    std::lock_guard<std::mutex> g(mu_);
    *out = route_locked(device, stream, 0);
    if (*out) {
      return 0;
    }
  }
  uint64_t capture = 0;
  if (rt_.capture_id(stream, &capture) < 0) {
    capture = 0;
  }
  if (!capture && !any) {
    return 0; /* the filters said no already */
  }
  std::lock_guard<std::mutex> g(mu_);
  *out = route_locked(device, stream, capture); /* the filters again: one may be newer */
  if (!*out && capture) {
    return implicit_pool_locked(device, stream, capture, out);
  }
  return 0;
}

int Adapter::implicit_pool_locked(int device, Stream stream, uint64_t capture, Pool **out) {
  Pool &p = pool_locked(device, PoolId{kImplicit, capture});
  p.implicit = true;
  auto *d = new Death{&p, &deaths_};
  int rc = rt_.graph_retain(stream, &Adapter::graph_gone, d);
  if (rc < 0) {
    delete d; /* never called after a failure */
    pools_.erase(p.id);
    return rc;
  }
  p.use_count = 1; /* the graph's: released when it is gone */
  *out = &p;
  return 0;
}

int Adapter::pool_arena(Pool &p, Stream stream, gg_arena_t **out) {
  if (p.given) {
    *out = p.given;
    return 0;
  }
  {
    std::lock_guard<std::mutex> g(mu_);
    for (auto &sa : p.arenas) {
      if (sa.first == stream) {
        *out = sa.second;
        return 0;
      }
    }
  }
  gg_arena_options_t o = defaults_;
  o.device = p.device;
  o.flags |= GG_ARENA_NO_STREAM; /* a pool's blocks are reused by the same pool on one stream */
  o.name = "torch-pool";
  gg_arena_t *a = nullptr;
  int rc = 0;
  {
    Relaxed relaxed(rt_); /* reserving and mapping memory while the stream captures */
    rc = gg_arena_create(&a, &o);
  }
  if (rc < 0) {
    return rc;
  }
  std::lock_guard<std::mutex> g(mu_);
  for (auto &sa : p.arenas) {
    if (sa.first == stream) { /* another thread made one meanwhile */
      gg_arena_destroy(a);
      *out = sa.second;
      return 0;
    }
  }
  p.arenas.emplace_back(stream, a);
  *out = a;
  return 0;
}

int Adapter::pool_alloc(Pool &p, size_t n, Stream stream, void **ptr, gg_arena_t **used) {
  *used = nullptr;
  if (p.custom) {
    return custom_alloc(p, n, stream, ptr, true);
  }
  gg_arena_t *a = nullptr;
  int rc = pool_arena(p, stream, &a);
  if (rc < 0) {
    return rc;
  }
  *used = a;
  Relaxed relaxed(rt_);
  return p.given ? gg_alloc_on(a, n, stream, ptr) : gg_alloc_ex(a, n, 0, "torch-pool", ptr);
}

void Adapter::free_pooled(void *ptr, const Block &b) {
  Pool *pool = b.pool;
  if (pool->implicit) {
    trace('f', ptr, 0, b.stream);
  }
  Held h{ptr, b.arena, b.stream, pool, b.size, {}};
  if (b.extra && !b.extra->recorded.empty()) {
    uint64_t capture =
        0; /* asked only here: a free of a block no other stream used needs nothing */
    if (rt_.capture_id(b.stream, &capture) == 0 && capture) {
      /* In the graph, the other streams' work on it is ordered after this free only once they
       * join the capturing stream: reused now, a later node could write it while theirs still
       * read it. So it waits for the capture's end, as in PyTorch's allocator (whose option
       * graph_capture_record_stream_reuse, which reuses it once the graph shows the joins, is not
       * built here). */
      h.recorded = b.extra->recorded; /* eager work queued there may still read it */
      std::lock_guard<std::mutex> g(mu_);
      deferred_.push_back(std::move(h));
      n_held_.store(deferred_.size(), std::memory_order_relaxed);
      return;
    }
    h.recorded = b.extra->recorded;
  }
  release_pooled(h);
}

/* A pool's block back to where it came from: the user's arena in stream order, the pool's own
 * arena, or its custom segment; first the streams it was recorded on finish what they queued. */
void Adapter::release_pooled(const Held &h) {
  for (Stream s : h.recorded) {
    rt_.stream_sync(s); /* a pool block used on another stream */
  }
  Pool *pool = h.pool;
  if (pool->given) {
    gg_free_on(h.arena, h.ptr, h.stream);
  } else if (h.arena) {
    gg_free(h.arena, h.ptr);
  }
  std::lock_guard<std::mutex> g(mu_);
  if (pool->custom) {
    custom_free_locked(*pool, h.ptr, h.size); /* cached in its segment: no allocator call */
  }
  GG_TORCH_ASSERT(pool->live > 0);
  pool->live--;
}

/* A default-pool block freed while its stream captures: the graph reads it at every replay, so the
 * capture's pool keeps it until the graph is gone. Only asked while a capture may be under way. */
bool Adapter::hold_for_graph(void *ptr, const Block &b) {
  if (!capturing_maybe()) {
    return false;
  }
  uint64_t capture = 0;
  if (rt_.capture_id(b.stream, &capture) < 0 || !capture) {
    return false;
  }
  std::lock_guard<std::mutex> g(mu_);
  Pool *p = nullptr;
  auto it = pools_.find(PoolId{kImplicit, capture});
  if (it != pools_.end() && !it->second->dead.load()) {
    p = it->second.get();
  } else if (implicit_pool_locked(b.device, b.stream, capture, &p) < 0) {
    return false; /* no graph to tie it to: freed as always */
  }
  p->held.push_back(Held{ptr, b.arena, b.stream, nullptr, 0, {}});
  return true;
}

/* Pools whose graph is gone lose the graph's use; the blocks they held go back to their arenas in
 * stream order, once their stream no longer captures (a free then would touch a capturing stream).
 */
void Adapter::sweep_locked(std::vector<Held> *out) {
  seen_deaths_.store(deaths_.load(std::memory_order_acquire)); /* first: a later death is seen */
  for (auto &kv : pools_) {
    Pool &p = *kv.second;
    if (!p.implicit || !p.dead.load(std::memory_order_acquire)) {
      continue; /* a live graph keeps what it holds */
    }
    p.use_count = 0; /* the graph's use: its pool is freeable once its blocks are freed */
    out->insert(out->end(), p.held.begin(), p.held.end());
    p.held.clear();
  }
  out->insert(out->end(), deferred_.begin(), deferred_.end());
  deferred_.clear();
  n_held_.store(0, std::memory_order_relaxed);
}

void Adapter::sweep() {
  std::vector<Held> go;
  {
    std::lock_guard<std::mutex> g(mu_);
    sweep_locked(&go);
  }
  std::vector<Held> later;
  for (const Held &h : go) {
    uint64_t capture = 0;
    if (rt_.capture_id(h.stream, &capture) == 0 && capture) {
      later.push_back(h);
    } else if (h.pool && !h.recorded.empty() && capturing_maybe()) {
      later.push_back(h); /* its streams are synchronised first: never while a capture may run */
    } else if (h.pool) {
      release_pooled(h);
    } else {
      gg_free_on(h.arena, h.ptr, h.stream);
    }
  }
  if (later.empty()) {
    return;
  }
  std::lock_guard<std::mutex> g(mu_);
  deferred_.insert(deferred_.end(), later.begin(), later.end());
  n_held_.store(deferred_.size(), std::memory_order_relaxed);
}

/* ---- PyTorch's pool calls -------------------------------------------------------------------- */

void Adapter::begin_capture(int device, PoolId id, std::function<bool(Stream)> filter) {
  std::lock_guard<std::mutex> g(mu_);
  /* Each allocation to a pool holds a use, given back by the release PyTorch pairs with it (a
   * graph's reset, use_mem_pool's end): a pool shared by two graphs lives until both are gone. */
  pool_locked(device, id).use_count++;
  captures_.push_back(Capture{device, id, std::move(filter)});
  n_announced_.fetch_add(1);
}

int Adapter::end_capture(int device, PoolId id) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = std::find_if(captures_.begin(), captures_.end(),
                         [&](const Capture &c) { return c.device == device && c.id == id; });
  if (it == captures_.end()) {
    return GG_ENOTFOUND;
  }
  captures_.erase(it);
  n_announced_.fetch_sub(1);
  GG_TORCH_ASSERT(n_announced_.load() == int(captures_.size()));
  return 0;
}

void Adapter::release_pool(int device, PoolId id) {
  (void)device;
  std::lock_guard<std::mutex> g(mu_);
  auto it = pools_.find(id);
  if (it != pools_.end() && it->second->use_count > 0) {
    it->second->use_count--;
  }
}

int Adapter::pool_use_count(PoolId id) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = pools_.find(id);
  return it == pools_.end() ? 0 : it->second->use_count;
}

void Adapter::create_or_incref(int device, PoolId id, std::shared_ptr<Custom> custom) {
  std::lock_guard<std::mutex> g(mu_);
  Pool &p = pool_locked(device, id);
  p.use_count++;
  if (custom && p.segments.empty()) { /* a segment goes back to the allocator that gave it */
    p.custom = std::move(custom);
  }
}

int Adapter::pool_use_arena(int device, PoolId id, gg_arena_t *arena) {
  gg_arena_options_t o;
  int rc = gg_arena_get_options(arena, &o);
  if (rc < 0) {
    return rc;
  }
  std::lock_guard<std::mutex> g(mu_);
  Pool &p = pool_locked(device, id);
  if (p.live || !p.arenas.empty() || p.custom || (p.given && p.given != arena)) {
    return GG_ESTATE; /* the pool holds memory of another source already */
  }
  p.given = arena;
  return 0;
}

void Adapter::set_use_on_oom(int device, PoolId id, bool on) {
  std::lock_guard<std::mutex> g(mu_);
  pool_locked(device, id).use_on_oom = on;
}

void Adapter::touch_pool(int device, PoolId id) {
  std::lock_guard<std::mutex> g(mu_);
  pool_locked(device, id);
}

/* A dead pool's arenas, once the device was synchronised (under the lock: see release_freeable). */
void Adapter::destroy_arenas(int device, const std::vector<gg_arena_t *> &dead) {
  for (gg_arena_t *a : dead) {
    note_gone(device, a);
    gg_arena_destroy(a);
  }
}

/* Frees every pool of the device without use and live block, none while a capture is announced. */
size_t Adapter::release_freeable(int device) {
  sweep();
  std::vector<gg_arena_t *> dead;
  std::vector<Spent> spent;
  size_t n = 0;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!captures_.empty()) {
      return 0;
    }
    for (auto it = pools_.begin(); it != pools_.end();) {
      Pool &p = *it->second;
      if (p.device != device || p.use_count > 0 || p.live > 0 || !p.held.empty()) {
        ++it;
        continue;
      }
      for (auto &sa : p.arenas) {
        dead.push_back(sa.second);
      }
      take_spent_locked(p, &spent);
      it = pools_.erase(it);
      n++;
    }
    if (!dead.empty() || !spent.empty()) {
      /* Under the lock begin_capture takes: no capture can have begun since the check above (a
       * device synchronisation would end it). The memory has no live block: once the device has
       * caught up, nothing queued later can use it, so no second synchronisation is needed. */
      rt_.device_sync(device);
    }
  }
  destroy_arenas(device, dead);
  if (std::exception_ptr e = give_back(spent)) {
    std::rethrow_exception(e); /* the figures are right: only the allocator's error is left */
  }
  return n;
}

int Adapter::empty_cache(PoolId id) {
  bool all = id == PoolId{};
  bool capturing = n_announced_.load() > 0; /* no device synchronisation while a graph captures */
  sweep();
  if (!capturing && n_recorded_.load()) {
    drain_recorded(true, true);
  }
  std::vector<std::pair<int, gg_arena_t *>> dead;
  std::vector<gg_arena_t *> trim;
  std::vector<Spent> spent;
  std::set<int> synced; /* devices synchronised under the lock */
  {
    std::lock_guard<std::mutex> g(mu_);
    capturing = capturing || !captures_.empty(); /* again, under the lock begin_capture takes */
    for (auto it = pools_.begin(); it != pools_.end();) {
      Pool &p = *it->second;
      if (!all && p.id != id) {
        ++it;
        continue;
      }
      if (!capturing && p.use_count <= 0 && p.live == 0 && p.held.empty()) {
        for (auto &sa : p.arenas) {
          dead.push_back({p.device, sa.second});
        }
        take_spent_locked(p, &spent);
        it = pools_.erase(it);
        continue;
      }
      /* A pool still in use may belong to a live graph, whose replays run in memory its capture
       * freed: as in PyTorch's allocator, empty_cache() leaves it whole unless asked by its id. */
      if (!(all && p.use_count > 0)) {
        for (auto &sa : p.arenas) {
          trim.push_back(sa.second);
        }
        if (!capturing) { /* a segment goes back after a device synchronisation */
          take_spent_locked(p, &spent);
        }
      }
      ++it;
    }
    /* One synchronisation per device, whatever number of its pools died, made before the lock
     * goes: a capture begun after it cannot be ended by it (see release_freeable). */
    for (auto &da : dead) {
      synced.insert(da.first);
    }
    for (const Spent &x : spent) {
      synced.insert(x.device);
    }
    for (int d : synced) {
      rt_.device_sync(d);
    }
  }
  std::map<int, std::vector<gg_arena_t *>> by_device;
  for (auto &da : dead) {
    by_device[da.first].push_back(da.second);
  }
  for (auto &kv : by_device) {
    destroy_arenas(kv.first, kv.second);
  }
  std::exception_ptr error = give_back(spent);
  for (gg_arena_t *a : trim) {
    gg_arena_trim(a, 0);
  }
  int rc = 0;
  for (int d = 0; all && d < kMaxDevices; d++) {
    gg_arena_t *a = arenas_[d].load();
    if (a && rc == 0) {
      rc = gg_arena_trim(a, 0);
    }
  }
  if (error) {
    std::rethrow_exception(error); /* a custom allocator's, once the rest is given back */
  }
  return rc;
}

std::vector<void *> Adapter::pool_blocks(int device, PoolId id) {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<void *> out;
  for (const auto &kv : blocks_) {
    if (kv.second.device == device && kv.second.pool && kv.second.pool->id == id) {
      out.push_back(kv.first);
    }
  }
  return out;
}

bool Adapter::pool_blocks_are(int device, PoolId id, const std::unordered_set<void *> &expected) {
  std::vector<void *> have = pool_blocks(device, id);
  if (have.size() != expected.size()) {
    return false;
  }
  for (void *p : have) {
    if (!expected.count(p)) {
      return false;
    }
  }
  return true;
}

/* ---- snapshots ------------------------------------------------------------------------------- */

namespace {

int collect_range(const gg_chunk_info_t *c, void *user) {
  auto *out = static_cast<std::vector<Range> *>(user);
  out->push_back(Range{reinterpret_cast<uintptr_t>(c->ptr), c->size, PoolId{}, 0});
  return 0;
}

void ranges_of(gg_arena_t *a, PoolId owner, int device, std::vector<Range> *out) {
  size_t before = out->size();
  gg_arena_foreach_chunk(a, collect_range, out);
  for (size_t i = before; i < out->size(); i++) {
    (*out)[i].owner = owner;
    (*out)[i].device = device;
  }
}

} // namespace

std::vector<Range> Adapter::ranges(PoolId id) {
  bool all = id == PoolId{};
  std::vector<Range> out;
  for (int d = 0; all && d < kMaxDevices; d++) {
    if (gg_arena_t *a = arenas_[d].load()) {
      ranges_of(a, PoolId{}, d, &out);
    }
  }
  std::vector<std::pair<PoolId, std::pair<int, gg_arena_t *>>> pa;
  {
    std::lock_guard<std::mutex> g(mu_);
    for (auto &kv : pools_) {
      if (!all && kv.first != id) {
        continue;
      }
      for (auto &sa : kv.second->arenas) {
        pa.push_back({kv.first, {kv.second->device, sa.second}});
      }
      for (auto &seg : kv.second->segments) {
        out.push_back(Range{seg.first, seg.second.size, kv.first, kv.second->device, true});
      }
    }
  }
  for (auto &x : pa) {
    ranges_of(x.second.second, x.first, x.second.first, &out);
  }
  std::sort(out.begin(), out.end(), [](const Range &a, const Range &b) { return a.addr < b.addr; });
  return out;
}

std::vector<BlockView> Adapter::blocks_sorted() {
  std::vector<BlockView> out;
  std::lock_guard<std::mutex> g(mu_);
  out.reserve(blocks_.size());
  for (const auto &kv : blocks_) {
    const Block &b = kv.second;
    out.push_back(BlockView{reinterpret_cast<uintptr_t>(kv.first), b.size, b.requested, b.stream,
                            b.extra ? b.extra->context : nullptr});
  }
  std::sort(out.begin(), out.end(),
            [](const BlockView &a, const BlockView &b) { return a.addr < b.addr; });
  return out;
}

void Adapter::drop_contexts() {
  std::vector<std::shared_ptr<void>> gone;
  {
    std::lock_guard<std::mutex> g(mu_);
    for (auto &kv : blocks_) {
      if (kv.second.extra && kv.second.extra->context) {
        gone.push_back(std::move(kv.second.extra->context));
      }
    }
  }
  /* released here, outside the lock */
}

} // namespace gg_torch
